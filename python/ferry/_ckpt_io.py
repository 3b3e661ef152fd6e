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
    return crc32c_numpy          # slow (~100 MB/s) but everywhere numpy is


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


# -------------------------------------------------- CRC32C fallback in numpy (no C, no pip)
# Used only when neither ferry._ferry.crc32c nor the crc32c / google_crc32c packages exist.
# The CRC without pre/post inversion ("raw") is linear over GF(2), so the data is cut into
# L = 2^m lanes of B bytes, every lane is run at once (one table lookup per byte row), and the
# lane CRCs are folded pairwise: raw(a || b) = shift(raw(a), len(b)) ^ raw(b), where shift by
# k zero bytes is a 32x32 bit matrix applied through four 256-entry tables.
_POLY = 0x82F63B78
_np_tables = {}


def _np_table():
    import numpy as np
    t = _np_tables.get("T")
    if t is None:
        t = []
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ (_POLY if c & 1 else 0)
            t.append(c)
        t = _np_tables["T"] = np.array(t, dtype=np.uint32)
    return t


def _shift_tables(k):
    """Four 256-entry tables applying 'process k zero bytes' to a raw CRC state."""
    import numpy as np
    key = ("S", k)
    if key in _np_tables:
        return _np_tables[key]
    T = _np_table()

    def apply(cols, v):
        r = 0
        i = 0
        while v:
            if v & 1:
                r ^= cols[i]
            v >>= 1
            i += 1
        return r

    one = [int(T[(1 << i) & 0xff]) ^ ((1 << i) >> 8) for i in range(32)]   # one zero byte
    result = [1 << i for i in range(32)]                                   # identity
    base = one
    e = k
    while e:
        if e & 1:
            result = [apply(base, c) for c in result]
        e >>= 1
        if e:
            base = [apply(base, c) for c in base]
    cols = np.array(result, dtype=np.uint64)
    tabs = []
    v = np.arange(256, dtype=np.uint64)
    for byte in range(4):
        acc = np.zeros(256, dtype=np.uint64)
        for bit in range(8):
            acc ^= np.where((v >> np.uint64(bit)) & np.uint64(1), cols[8 * byte + bit], 0).astype(np.uint64)
        tabs.append(acc.astype(np.uint32))
    _np_tables[key] = tabs
    return tabs


def _np_shift(c, k):
    if k == 0:
        return c
    t0, t1, t2, t3 = _shift_tables(k)
    return t0[c & 0xff] ^ t1[(c >> 8) & 0xff] ^ t2[(c >> 16) & 0xff] ^ t3[c >> 24]


def _lanes_crc(a, lanes, B):
    """Raw CRC of a (lanes*B bytes) as lanes of B bytes run together (4 bytes a step,
    slicing-by-4 tables), folded to one value."""
    import numpy as np
    T4 = _np_tables.get("T4")
    if T4 is None:
        T = _np_table()
        T4 = [T]
        for _ in range(3):
            T4.append((T4[-1] >> np.uint32(8)) ^ T[T4[-1] & 0xff])
        T4 = _np_tables["T4"] = T4
    w = np.ascontiguousarray(a).view("<u4").reshape(lanes, B // 4).T.copy()
    c = np.zeros(lanes, dtype=np.uint32)
    v = c.view(np.uint8).reshape(lanes, 4)
    t0, t1, t2, t3 = T4
    for j in range(B // 4):
        c ^= w[j]
        c[:] = t3[v[:, 0]] ^ t2[v[:, 1]] ^ t1[v[:, 2]] ^ t0[v[:, 3]]
    blk = B
    while c.size > 1:
        c = _np_shift(c[0::2], blk) ^ c[1::2]
        blk *= 2
    return int(c[0])


def _raw_crc_np(a, raw=0):
    """Raw CRC32C (no inversion) of uint8 array a, continuing from state raw."""
    import numpy as np
    B = 256
    n = a.size
    pos = 0
    while n - pos >= 4 * B:
        lanes = min(1 << (((n - pos) // B).bit_length() - 1), 1 << 14)
        m = lanes * B
        raw = int(_np_shift(np.array([raw], dtype=np.uint32), m)[0]) ^ \
            _lanes_crc(a[pos:pos + m], lanes, B)
        pos += m
    T = _np_table()
    for b in a[pos:].tobytes():
        raw = int(T[(raw ^ b) & 0xff]) ^ (raw >> 8)
    return raw


def crc32c_numpy(data):
    """CRC32C (Castagnoli, as the crc32c package computes it) of a bytes-like object."""
    import numpy as np
    a = np.frombuffer(data, dtype=np.uint8)
    return _raw_crc_np(a, 0xFFFFFFFF) ^ 0xFFFFFFFF
