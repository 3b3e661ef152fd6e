"""Engine glue for ferry.checkpoint: the shared context, tensor buffers, errors,
atomic file replacement, CRC32C."""
from __future__ import annotations

import os
import socket
import struct
import threading

from . import _ferry

FerryError = _ferry.FerryError
EFORMAT = -10005
ECHECKSUM = -10012
ENOTFOUND = -10013
EINVAL = -10001
EUNSUPPORTED = -10006

_lock = threading.Lock()
_ctx = None


def context():
    """The context ferry.checkpoint runs its plans on (one per process, made lazily)."""
    global _ctx
    with _lock:
        if _ctx is None:
            dc = getattr(_ferry, "default_context", None)
            _ctx = dc() if dc is not None else _ferry.Context()
        return _ctx


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


def sync_devices(devices):
    """Wait for the work torch queued on these CUDA devices (the engine reads or writes
    device memory on its own streams)."""
    import torch
    for d in sorted(devices):
        torch.cuda.synchronize(d)


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
def _crc_impl():
    f = getattr(_ferry, "crc32c", None)
    if f is not None:
        return lambda b: f(b)
    try:
        import crc32c as _c
        return lambda b: _c.crc32c(b)
    except ImportError:
        pass
    try:
        import google_crc32c as _g
        return lambda b: _g.value(bytes(b))
    except ImportError:
        pass
    return None


_crc = None


def crc32c_of(t):
    """CRC32C of a tensor's bytes (host copy made for device tensors)."""
    global _crc
    if _crc is None:
        _crc = _crc_impl()
        if _crc is None:
            raise error("ferry.checkpoint: CRC32C needs ferry._ferry.crc32c or the crc32c "
                        "package", EUNSUPPORTED)
    if t.numel() == 0:
        return _crc(b"")
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1).view(__import__("torch").uint8)
    return _crc(memoryview(t.numpy()))


def u32hex(v):
    return "%08x" % (v & 0xffffffff)


def read_head(path, want=1 << 16):
    """First bytes of a file and its size (plain Python I/O: a header, not data)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise error("%s: no such file" % path, -2)
    except OSError as e:
        raise error("%s: %s" % (path, e.strerror), -(e.errno or 5))
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, min(want, size), 0)
        if len(head) >= 8:
            n, = struct.unpack("<Q", head[:8])
            if len(head) < 8 + n <= size and n <= 100 * 1000 * 1000:
                head += os.pread(fd, 8 + n - len(head), len(head))
        return head, size
    finally:
        os.close(fd)


# ------------------------------------------------------------------ partial reads
def box_runs(shape, itemsize, starts, lengths, max_runs=1 << 16):
    """Byte runs of the C-order box [starts, starts+lengths) of a contiguous array of
    `shape`: [(src_offset, nbytes, dst_offset)], the box itself laid out in C order at the
    destination. None when that takes more than max_runs runs."""
    nd = len(shape)
    if nd == 0:
        return [(0, itemsize, 0)]
    if any(n == 0 for n in lengths):
        return []
    strides = [1] * nd
    for d in range(nd - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    k = nd - 1
    while k > 0 and starts[k] == 0 and lengths[k] == shape[k]:
        k -= 1
    run = lengths[k] * strides[k]
    count = 1
    for d in range(k):
        count *= lengths[d]
    if count > max_runs:
        return None
    runs = []
    base = starts[k] * strides[k]
    idx = [0] * k
    for r in range(count):
        src = base
        for d in range(k):
            src += (starts[d] + idx[d]) * strides[d]
        runs.append((src * itemsize, run * itemsize, r * run * itemsize))
        for d in range(k - 1, -1, -1):
            idx[d] += 1
            if idx[d] < lengths[d]:
                break
            idx[d] = 0
    return runs


def plan_box(plan, f, base, shape, dtype, itemsize, sel, dst):
    """Add to `plan` the reads of selection sel = [(start, stop, step)] of the C-order
    array of `shape`/`dtype` stored at byte `base` of file f, into the contiguous tensor
    dst (shape of the selection). Only the needed bytes are read when steps are 1 and the
    box has at most 65536 runs; otherwise the covering byte range is read into a
    temporary. Returns None, or a function to call after the plan ran (the strided copy)."""
    import torch
    counts = [len(range(*s)) for s in sel]
    if any(c == 0 for c in counts):
        return None
    if all(s[2] == 1 for s in sel):
        runs = box_runs(shape, itemsize, [s[0] for s in sel], counts)
        if runs is not None:
            b = buf(dst)
            for src, nb, doff in runs:
                plan.read_file(f, base + src, nb, b, doff)
            return None
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    first = sum(s[0] * st for s, st in zip(sel, strides))
    last = sum((s[0] + (c - 1) * s[2]) * st for s, c, st in zip(sel, counts, strides))
    nel = last - first + 1
    tmp = torch.empty(nel, dtype=dtype, device=dst.device)
    plan.read_file(f, base + first * itemsize, nel * itemsize, buf(tmp))

    def fix():
        dst.copy_(tmp.as_strided(tuple(counts), [s[2] * st for s, st in zip(sel, strides)], 0))
    return fix
