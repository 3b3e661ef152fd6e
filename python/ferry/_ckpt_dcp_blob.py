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

import io

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
_WINDOW = 1 << 16            # the archive's end read at once: its central directory
_MAX_ENTRIES = 64            # a one-tensor archive has about seven records


def _u(fmt, b, at, what):
    import struct
    try:
        return struct.unpack_from(fmt, b, at)
    except struct.error:
        raise ValueError("%s ends inside its zip structure" % what)


def locate(pread, length, what):
    """Where the one storage record of a torch.save archive of a single tensor lies.

    pread(n, at) gives n bytes at byte `at` of the archive (0 = its start); length is
    the archive's length. Reads the end-of-central-directory record (zip64 too), the
    central directory and the record's local header -- the zip structure torch.save
    writes, whatever its version -- and returns (data start, data length) inside the
    archive. Anything else (no or several storage records, a compressed one, a local
    header that disagrees with the directory) raises ValueError naming `what`."""
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
        parts = name.split(b"/")
        if len(parts) >= 3 and parts[-2] == b"data" and parts[-1].isdigit():
            found.append((name, method, csize, usize, lo))
        pos += 46 + nlen + elen + clen
    if len(found) != 1:
        raise ValueError("%s: %d tensor storage records in the archive, want 1" % (what, len(found)))
    name, method, csize, usize, lo = found[0]
    if method != 0 or csize != usize:
        raise ValueError("%s: the storage record is compressed" % what)
    if lo + 30 + len(name) > cd_off:
        raise ValueError("%s: the storage record's local header at byte %d lies past the "
                         "directory" % (what, lo))
    head = bytes(pread(30 + len(name), lo))
    if head[:4] != _LOC or head[30:] != name:
        raise ValueError("%s: no local header for %s at byte %d" % (what, name.decode(
            "utf-8", "replace"), lo))
    lnl, lel = _u("<HH", head, 26, what)
    start = lo + 30 + lnl + lel
    if start + csize > cd_off:
        raise ValueError("%s: the storage record (%d bytes at %d) overlaps the directory"
                         % (what, csize, start))
    return start, csize
