"""Engine glue for ferry.checkpoint: the context, tensor buffers, errors, atomic file
replacement, CRC32C (the C library's)."""
from __future__ import annotations

import os
import socket
import time

from .. import _ferry

FerryError = _ferry.FerryError
# the library's status codes, as the extension exports them (not copies)
EFORMAT = _ferry.EFORMAT
ECHECKSUM = _ferry.ECHECKSUM
ENOTFOUND = _ferry.ENOTFOUND
EINVAL = _ferry.EINVAL
EUNSUPPORTED = _ferry.EUNSUPPORTED


def context():
    """The context ferry.checkpoint runs its plans on: the process-wide default context,
    asked for on every call (never cached here), so a forked child gets its own."""
    return _ferry.default_context()


def error(msg, code=EFORMAT):
    """A ferry.FerryError carrying `msg` (as the C layer's errors do)."""
    try:
        e = FerryError(code, msg)
    except TypeError:
        e = FerryError(msg)
    try:
        if getattr(e, "message", None) != msg:
            e.message = msg
        if getattr(e, "code", None) != code:
            e.code = code
    except Exception:  # read-only attributes: the C type already set them
        pass
    if str(e) != msg and not str(e).endswith(msg):
        try:
            e.args = (msg,)
        except Exception:
            pass
    return e


def fail(msg, code=EFORMAT):
    raise error(msg, code)


def buf(t):
    """The engine's raw memory descriptor of a contiguous tensor: (ptr, nbytes, device)."""
    dev = t.device
    if dev.type == "cuda":
        d = dev.index if dev.index is not None else 0
    elif dev.type == "cpu":
        d = -1
    else:
        raise TypeError("ferry.checkpoint: tensors on %s are not supported (cpu or cuda)" % dev)
    return (t.data_ptr(), t.numel() * t.element_size(), d)


def wait_devices(plan, devices):
    """Make plan's jobs wait, in the engine, for the work torch queued on the current
    stream of each of these CUDA devices (the engine reads or writes device memory
    on its own streams); more devices than a plan takes streams: wait here."""
    import torch
    if len(devices) > _ferry.MAX_WAIT_STREAMS:
        for d in sorted(devices):
            torch.cuda.synchronize(d)
        return
    for d in sorted(devices):
        plan.wait_stream(torch.cuda.current_stream(d).cuda_stream, d)


def cuda_index(device):
    return device.index if device.index is not None else 0


# ---------------------------------------------------------------- atomic replacement
_HOST = socket.gethostname().replace(".", "_")[:32] or "host"
TMP_TAG = ".ferry-tmp."


def temp_name(final):
    """A unique temporary name beside `final`: .<base>.ferry-tmp.<host>.<pid>.<random>."""
    d, base = os.path.split(os.path.abspath(final))
    return os.path.join(d, ".%s%s%s.%d.%s" % (base, TMP_TAG, _HOST, os.getpid(),
                                              os.urandom(6).hex()))


STALE_AGE_S = 3600      # a temporary of another host untouched this long is a dead writer's


def dead_writer(d, n, tag):
    """Whether entry n of directory d, named .<name><tag><host>.<pid>.<random>, belongs to
    a writer that is gone: on this host, a process that no longer exists; on another host
    (a shared file system, where the pid says nothing), untouched for STALE_AGE_S (a live
    writer keeps its temporary's mtime fresh). Other names: False."""
    if not n.startswith(".") or tag not in n:
        return False
    rest = n.rsplit(tag, 1)[1].split(".")
    if len(rest) != 3:
        return False
    host, pid = rest[0], rest[1]
    try:
        pid = int(pid)
    except ValueError:
        return False
    if host == _HOST:
        if pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)
            return False              # still running: another save in progress
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    try:
        return time.time() - os.lstat(os.path.join(d, n)).st_mtime >= STALE_AGE_S
    except OSError:
        return False


def remove_stale_temps(final):
    """Remove the temporaries (.<name>.ferry-tmp.<host>.<pid>.<random>) that dead writers
    (dead_writer) left in the directory of `final` -- of any file there, not only
    `final`'s: a killed sharded save leaves temporaries of shard names no later save may
    write again. Temporaries have unique names, so leftovers never collide with a new
    save; this reclaims their space."""
    d = os.path.dirname(os.path.abspath(final))
    try:
        names = os.listdir(d)
    except OSError:
        return
    for n in names:
        if dead_writer(d, n, TMP_TAG):
            try:
                os.unlink(os.path.join(d, n))
            except OSError:
                pass


def fsync_dir(path):
    fd = os.open(path or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_small_file_atomic(final, data: bytes):
    """Write a small file (an index, DCP's .metadata) durably and atomically."""
    tmp = temp_name(final)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(os.path.abspath(final)))


# ------------------------------------------------------------------------- CRC32C
def crc32c_of(t):
    """CRC32C of a tensor's bytes, by the C library (host copy made for device tensors)."""
    if t.numel() == 0:
        return _ferry.crc32c(b"")
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1).view(__import__("torch").uint8)
    return _ferry.crc32c(memoryview(t.numpy()))


def u32hex(v):
    return "%08x" % (v & 0xffffffff)


def torch():
    import torch as _t
    return _t
