"""torch.save framing around raw tensor bytes, for FerryWriter's data files.

torch's own DCP reader (FileSystemReader, used by dcp_to_torch_save and friends) reads a
tensor item by torch.load()ing the bytes [offset, offset + length) of a data file. So each
tensor chunk is stored as a complete torch.save archive -- but its storage record holds
the tensor's raw C-order bytes, which is all ferry's reader reads. The archive around them
comes from torch.save itself, run under torch.serialization.skip_data() on an untouched
torch.empty of the same dtype and shape into a recorder that keeps only the bytes written
(the storage record is seeked over, never filled): no tensor byte is copied. torch.load
does not check the storage record's CRC32 (written as 0 under skip_data), which is why
the engine may fill it afterwards."""
from __future__ import annotations

import collections
import io
import pickle
import warnings

import torch


class _Recorder(io.RawIOBase):
    """A seekable sink that keeps what is written and where (a sparse file)."""

    def __init__(self):
        super().__init__()
        self.chunks, self.pos, self.end = [], 0, 0

    def writable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, off, whence=0):
        self.pos = off if whence == 0 else self.pos + off if whence == 1 else self.end + off
        self.end = max(self.end, self.pos)
        return self.pos

    def write(self, b):
        b = bytes(b)
        self.chunks.append((self.pos, b))
        self.pos += len(b)
        self.end = max(self.end, self.pos)
        return len(b)


_cache = {}


def framing(dtype, shape):
    """(prefix, suffix) of the torch.save archive of a contiguous CPU tensor of dtype and
    shape: prefix + the tensor's raw bytes + suffix is what torch.save writes, and
    torch.load reads it back. len(prefix) is where the raw bytes start."""
    key = (dtype, tuple(shape))
    hit = _cache.get(key)
    if hit is not None:
        return hit
    t = torch.empty(shape, dtype=dtype)          # never touched: no memory is faulted in
    nbytes = t.numel() * t.element_size()
    rec = _Recorder()
    with torch.serialization.skip_data():
        torch.save(t, rec)
    # the storage record is the one stretch of exactly nbytes that nothing was written to
    spans = sorted((p, p + len(b)) for p, b in rec.chunks if b)
    gaps, pos = [], 0
    for lo, hi in spans:
        if lo > pos:
            gaps.append((pos, lo))
        pos = max(pos, hi)
    if pos < rec.end:
        gaps.append((pos, rec.end))
    if nbytes == 0 and not gaps:
        gaps = [(rec.end, rec.end)]              # an empty record: the archive is all frame
    if len(gaps) != 1 or gaps[0][1] - gaps[0][0] != nbytes:
        raise RuntimeError("ferry: torch.save under skip_data left gaps %s, want one of %d "
                           "bytes (an unsupported torch version?)" % (gaps[:4], nbytes))
    data_at = gaps[0][0]
    buf = bytearray(rec.end)
    for p, b in rec.chunks:                      # in the order written: later wins
        buf[p:p + len(b)] = b
    out = (bytes(buf[:data_at]), bytes(buf[data_at + nbytes:]))
    if len(_cache) < 4096:
        _cache[key] = out
    return out


# ------------------------------------------------------------------ reading the framing
_EOCD, _EOCD64, _LOC64 = b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07"
_CEN, _LOC = b"PK\x01\x02", b"PK\x03\x04"
_FOLLOW = (b"PK\x07\x08", _LOC, _CEN, _EOCD64, _EOCD)
_WINDOW = 1 << 16            # the archive's end read at once: its central directory
_MAX_ENTRIES = 64            # a one-tensor archive has about seven records


def _u(fmt, b, at, what):
    import struct
    try:
        return struct.unpack_from(fmt, b, at)
    except struct.error:
        raise ValueError("%s ends inside its zip structure" % what)


def _directory(pread, length, what):
    """The central directory of the zip archive torch.save writes: ([(name, method,
    compressed size, size, local header offset)], directory offset). pread(n, at) gives
    n bytes at byte `at` of the archive (0 = its start); length is the archive's length.
    Reads the end-of-central-directory record (zip64 too) and the directory only."""
    # the end record (22 bytes, 20 + 56 more with zip64) is all that is read at first;
    # torch writes no archive comment, so a longer search is only a fallback
    for k in (min(length, 98), min(length, _WINDOW + 98)):
        base = length - k
        tail = bytes(pread(k, base))
        e = tail.rfind(_EOCD, 0, max(k - 18, 0))
        if e >= 0 or k == length:
            break
    if e < 0:
        raise ValueError("%s: no zip end-of-central-directory record" % what)
    _, _, _, total, cd_size, cd_off, clen = _u("<HHHHIIH", tail, e + 4, what)
    if e + 22 + clen != k:
        raise ValueError("%s: the zip end record is not at the archive's end" % what)
    if 0xFFFF in (total,) or 0xFFFFFFFF in (cd_size, cd_off):
        loc = e - 20
        if loc < 0 or tail[loc:loc + 4] != _LOC64:
            raise ValueError("%s: zip64 fields without a zip64 locator" % what)
        at64, = _u("<Q", tail, loc + 8, what)
        r = at64 - base
        if r < 0 or tail[r:r + 4] != _EOCD64:
            raise ValueError("%s: no zip64 end record at byte %d" % (what, at64))
        total, cd_size, cd_off = _u("<QQQ", tail, r + 32, what)
    if total > _MAX_ENTRIES or cd_size > _WINDOW or cd_off + cd_size > base + e:
        raise ValueError("%s: zip central directory (%d entries, %d bytes at %d) is not "
                         "where a one-tensor archive keeps it" % (what, total, cd_size, cd_off))
    tail, base = bytes(pread(cd_size, cd_off)), cd_off
    pos, found = cd_off - base, []
    for _ in range(total):
        if tail[pos:pos + 4] != _CEN:
            raise ValueError("%s: damaged zip central directory at byte %d" % (what, base + pos))
        method, = _u("<H", tail, pos + 10, what)
        csize, usize, nlen, elen, clen = _u("<IIHHH", tail, pos + 20, what)
        lo, = _u("<I", tail, pos + 42, what)
        name = tail[pos + 46:pos + 46 + nlen]
        extra = tail[pos + 46 + nlen:pos + 46 + nlen + elen]
        x = 0
        while x + 4 <= len(extra):                 # zip64 extra: the fields that overflowed
            tag, size = _u("<HH", extra, x, what)
            if tag == 1:
                vals, v = list(_u("<%dQ" % (size // 8), extra, x + 4, what)), 0
                if usize == 0xFFFFFFFF and v < len(vals):
                    usize, v = vals[v], v + 1
                if csize == 0xFFFFFFFF and v < len(vals):
                    csize, v = vals[v], v + 1
                if lo == 0xFFFFFFFF and v < len(vals):
                    lo = vals[v]
            x += 4 + size
        found.append((name, method, csize, usize, lo))
        pos += 46 + nlen + elen + clen
    return found, cd_off


def _is_storage(name):
    parts = name.split(b"/")
    return len(parts) >= 3 and parts[-2] == b"data" and parts[-1].isdigit()


def _place(pread, entry, cd_off, what):
    """(data start, length) of one stored (uncompressed) record, from its local header."""
    name, method, csize, usize, lo = entry
    label = name.decode("utf-8", "replace")
    if method != 0 or csize != usize:
        raise ValueError("%s: record %s is compressed" % (what, label))
    if lo + 30 + len(name) > cd_off:
        raise ValueError("%s: the local header of %s at byte %d lies past the directory"
                         % (what, label, lo))
    head = bytes(pread(30 + len(name), lo))
    if head[:4] != _LOC or head[30:] != name:
        raise ValueError("%s: no local header for %s at byte %d" % (what, label, lo))
    lnl, lel = _u("<HH", head, 26, what)
    start = lo + 30 + lnl + lel
    if lnl != len(name) or start + csize > cd_off:
        raise ValueError("%s: the local header of %s at byte %d disagrees with the directory"
                         % (what, label, lo))
    # a record is followed by its data descriptor, the next local header or the
    # directory: a damaged extra-field length (which moves the data) lands elsewhere
    if bytes(pread(4, start + csize)) not in _FOLLOW:
        raise ValueError("%s: record %s (%d bytes at %d) is not followed by a zip structure"
                         % (what, label, csize, start))
    return start, csize


def locate(pread, length, what):
    """Where the one storage record of a torch.save archive of a single tensor lies:
    (data start, data length) inside the archive, found through the zip structure
    torch.save writes, whatever its version (end record, directory, the record's local
    header). Anything else (no or several storage records, a compressed one, a local
    header that disagrees with the directory) raises ValueError naming `what`."""
    entries, cd_off = _directory(pread, length, what)
    found = [e for e in entries if _is_storage(e[0])]
    if len(found) != 1:
        raise ValueError("%s: %d tensor storage records in the archive, want 1" % (what, len(found)))
    return _place(pread, found[0], cd_off, what)


# ------------------------------------------- torch.save archives of other writers
_MAX_PKL = 1 << 20           # a one-tensor data.pkl is a few hundred bytes


class _Storage:
    __slots__ = ("dtype", "key", "numel")

    def __init__(self, dtype, key, numel):
        self.dtype, self.key, self.numel = dtype, key, numel


class _Tensor:
    __slots__ = ("storage", "offset", "size", "stride", "dtype")


def _rebuild(storage, offset, size, stride, *rest):
    t = _Tensor()
    t.storage, t.offset, t.size, t.stride = storage, offset, size, stride
    t.dtype = rest[2] if len(rest) >= 3 else None       # _rebuild_tensor_v3 names it
    return t


class _UNTYPED:
    """Marker: torch.storage.UntypedStorage (its numel counts bytes)."""


class _TensorPickle(pickle._Unpickler):
    """Reads a one-tensor data.pkl without building anything: the tensor's rebuild call
    becomes a record of (storage, offset, size, stride, dtype), its storage a record of
    (dtype, key, numel). Any other global, and BUILD, is refused."""
    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, f, what):
        super().__init__(f)
        self.what = what

    def find_class(self, module, name):
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor_v3"):
            return _rebuild
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch.storage" and name == "UntypedStorage":
            return _UNTYPED
        if module == "torch":
            obj = getattr(torch, name, None)
            if isinstance(obj, torch.dtype):
                return obj
            if name.endswith("Storage") and isinstance(obj, type):
                with warnings.catch_warnings():      # the legacy typed storages warn
                    warnings.simplefilter("ignore")
                    dt = getattr(obj, "dtype", None)
                if isinstance(dt, torch.dtype):
                    return dt
        raise ValueError("%s: data.pkl names %s.%s (not a plain tensor)" % (self.what, module, name))

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ValueError("%s: data.pkl has persistent id %r" % (self.what, pid))
        _, stype, key, _, numel = pid
        if not (stype is _UNTYPED or isinstance(stype, torch.dtype)) or \
                not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise ValueError("%s: data.pkl has persistent id %r" % (self.what, pid))
        return _Storage(None if stype is _UNTYPED else stype, key, numel)

    def _no_build(self):
        raise ValueError("%s: data.pkl sets attributes (BUILD)" % self.what)

    dispatch[pickle.BUILD[0]] = _no_build


def describe(pread, length, what):
    """The one tensor of a torch.save archive (as torch's DCP FileSystemWriter writes each
    tensor item), read without unpickling anything that can run code: (dtype, size,
    stride, element offset, storage start in the archive, storage length in bytes).
    ValueError naming `what` for anything else."""
    import sys
    entries, cd_off = _directory(pread, length, what)
    by = {}
    for e in entries:
        parts = e[0].split(b"/")
        by[b"/".join(parts[-2:]) if len(parts) >= 3 and parts[-2] == b"data" else parts[-1]] = e
    if b"data.pkl" not in by:
        raise ValueError("%s: no data.pkl in the archive" % what)
    at, n = _place(pread, by[b"data.pkl"], cd_off, what)
    if n > _MAX_PKL:
        raise ValueError("%s: data.pkl of %d bytes" % (what, n))
    try:
        t = _TensorPickle(io.BytesIO(bytes(pread(n, at))), what).load()
    except (pickle.UnpicklingError, EOFError, TypeError, IndexError, KeyError, AttributeError,
            RecursionError, UnicodeDecodeError) as e:
        raise ValueError("%s: damaged data.pkl: %s: %s" % (what, type(e).__name__, e))
    if not isinstance(t, _Tensor) or not isinstance(t.storage, _Storage):
        raise ValueError("%s: data.pkl holds a %s, not a tensor" % (what, type(t).__name__))
    dtype = t.storage.dtype if t.storage.dtype is not None else t.dtype
    if not isinstance(dtype, torch.dtype):
        raise ValueError("%s: data.pkl gives no dtype" % what)
    ok = all(isinstance(v, (tuple, list)) and all(isinstance(x, int) and x >= 0 for x in v)
             for v in (t.size, t.stride)) and len(t.size) == len(t.stride) and \
        isinstance(t.offset, int) and t.offset >= 0
    if not ok:
        raise ValueError("%s: data.pkl gives size %r, stride %r, offset %r"
                         % (what, t.size, t.stride, t.offset))
    order = by.get(b"byteorder")
    if order is not None:
        bat, bn = _place(pread, order, cd_off, what)
        got = bytes(pread(min(bn, 16), bat))
        if got != sys.byteorder.encode():
            raise ValueError("%s: stored %s-endian on a %s-endian machine (unsupported)"
                             % (what, got.decode("ascii", "replace"), sys.byteorder))
    rec = by.get(("data/" + t.storage.key).encode())
    if rec is None:
        raise ValueError("%s: no record data/%s for the tensor's storage" % (what, t.storage.key))
    start, nbytes = _place(pread, rec, cd_off, what)
    itemsize = torch.empty((), dtype=dtype).element_size()
    stored = t.storage.numel * (1 if t.storage.dtype is None else itemsize)
    if nbytes != stored or nbytes % itemsize:
        raise ValueError("%s: storage record of %d bytes, data.pkl says %d"
                         % (what, nbytes, stored))
    return dtype, tuple(t.size), tuple(t.stride), t.offset, start, nbytes
