"""Engine glue for ferry.checkpoint: the context, tensor buffers, errors, atomic file
replacement, CRC32C (the C library's)."""
from __future__ import annotations

import os
import socket

from .. import _ferry

FerryError = _ferry.FerryError
EFORMAT = -10005
ECHECKSUM = -10012
ENOTFOUND = -10013
EINVAL = -10001
EUNSUPPORTED = -10006



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


def remove_stale_temps(final):
    """Remove temporaries of saves of `final` killed earlier on this host (their
    process is gone). Temporaries have unique names, so leftovers never collide with
    a new save; this only reclaims their space."""
    d, base = os.path.split(os.path.abspath(final))
    prefix = ".%s%s%s." % (base, TMP_TAG, _HOST)
    try:
        names = os.listdir(d)
    except OSError:
        return
    for n in names:
        if not n.startswith(prefix):
            continue
        rest = n[len(prefix):].split(".")
        try:
            pid = int(rest[0])
        except (ValueError, IndexError):
            continue
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue              # still running: another save in progress
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
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
