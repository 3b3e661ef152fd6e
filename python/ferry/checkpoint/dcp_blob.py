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
