"""safetensors layout for ferry.checkpoint: dtypes, 4 KiB-aligned layout, header build/parse.

File layout written by ferry (a valid safetensors file):

    u64 LE N | N bytes of JSON header, padded with spaces so 8 + N is a multiple of 4096 |
    tensor data, contiguous, no holes (safetensors readers refuse holes and trailing bytes)

Tensor order inside the data section is chosen for alignment, since gaps are not allowed:
  1. tensors whose byte size is a multiple of 4096 (each starts 4 KiB-aligned);
  2. the other large tensors, each starting 4 KiB-aligned when small tensors can fill the
     gap before it exactly (greedy, largest first);
  3. the remaining small tensors, packed; zero-byte tensors last.
So in model-like state dicts nearly every byte of tensor data is 4 KiB-aligned in the file,
and safetensors.torch.load_file reads the file unchanged (no padding tensors, no extra keys).
"""
from __future__ import annotations

import json
import struct

ALIGN = 4096
MAX_HEADER = 100 * 1000 * 1000   # safetensors' own bound on N
BIG = 64 * 1024                  # "large" tensor for the layout

# safetensors dtype string -> (torch dtype attribute name, itemsize)
ST_DTYPES = {
    "BOOL": ("bool", 1), "U8": ("uint8", 1), "I8": ("int8", 1),
    "F8_E5M2": ("float8_e5m2", 1), "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 1), "F8_E5M2FNUZ": ("float8_e5m2fnuz", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
    "I16": ("int16", 2), "U16": ("uint16", 2), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I32": ("int32", 4), "U32": ("uint32", 4), "F32": ("float32", 4),
    "I64": ("int64", 8), "U64": ("uint64", 8), "F64": ("float64", 8),
    "C64": ("complex64", 8),
}


def torch_dtype(st):
    import torch
    ent = ST_DTYPES.get(st)
    if ent is None:
        return None
    return getattr(torch, ent[0], None)


def st_dtype(dtype):
    """safetensors name of a torch dtype, or raise TypeError."""
    name = str(dtype).replace("torch.", "")
    for st, (tname, _) in ST_DTYPES.items():
        if tname == name:
            return st
    raise TypeError("ferry.checkpoint: dtype %s has no safetensors name (supported: %s)"
                    % (dtype, ", ".join(sorted(t for t, _ in ST_DTYPES.values()))))


def layout(entries):
    """entries: list of (name, nbytes) in the caller's order. Returns the list of
    (name, begin, end) in file order, offsets relative to the data section."""
    aligned = [(n, b) for n, b in entries if b > 0 and b % ALIGN == 0]
    big = [(n, b) for n, b in entries if b >= BIG and b % ALIGN != 0]
    small = [(n, b) for n, b in entries if 0 < b < BIG and b % ALIGN != 0]
    empty = [(n, b) for n, b in entries if b == 0]
    small.sort(key=lambda e: -e[1])
    out = []
    off = 0

    def put(n, b):
        nonlocal off
        out.append((n, off, off + b))
        off += b

    for n, b in aligned:
        put(n, b)
    big.sort(key=lambda e: -e[1])
    for n, b in big:
        gap = (-off) % ALIGN
        if gap and small:
            pick, rest, need = [], [], gap
            for sn, sb in small:          # greedy exact fill, largest first
                if sb <= need:
                    pick.append((sn, sb))
                    need -= sb
                else:
                    rest.append((sn, sb))
            if need == 0:
                for sn, sb in pick:
                    put(sn, sb)
                small = rest
        put(n, b)
    for n, b in small:
        put(n, b)
    for n, b in empty:
        put(n, b)
    return out


def build_header(tensors, metadata):
    """tensors: list of (name, st_dtype, shape, begin, end) in file order;
    metadata: {str: str} or None. Returns the header bytes (u64 + JSON + spaces),
    a multiple of ALIGN long."""
    h = {}
    if metadata:
        h["__metadata__"] = metadata
    for name, dt, shape, b, e in tensors:
        h[name] = {"dtype": dt, "shape": [int(s) for s in shape], "data_offsets": [b, e]}
    js = json.dumps(h, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    total = 8 + len(js)
    padded = -(-total // ALIGN) * ALIGN
    n = padded - 8
    if n > MAX_HEADER:
        raise ValueError("ferry.checkpoint: header of %d bytes exceeds safetensors' limit of %d "
                         "(too many non-tensor values in the state dict?)" % (n, MAX_HEADER))
    return struct.pack("<Q", n) + js + b" " * (n - len(js))


class Entry:
    __slots__ = ("name", "dtype", "st", "shape", "begin", "end", "itemsize", "file", "path",
                 "data_start")

    def __init__(self, name, st, dtype, shape, begin, end, itemsize):
        self.name, self.st, self.dtype, self.shape = name, st, dtype, shape
        self.begin, self.end, self.itemsize = begin, end, itemsize
        self.file = self.path = None
        self.data_start = 0

    @property
    def nbytes(self):
        return self.end - self.begin

    @property
    def offset(self):
        """Absolute byte offset in the file."""
        return self.data_start + self.begin


class Header:
    def __init__(self, path, data_start, entries, metadata, file_size):
        self.path, self.data_start, self.file_size = path, data_start, file_size
        self.entries = entries            # name -> Entry, in header order
        self.metadata = metadata          # {str: str} or None


def _no_dups(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError("duplicate key %r" % (k,))
        d[k] = v
    return d


def parse_header(path, head, file_size, fail):
    """Parse and check a safetensors header. `head` holds at least the first 8 bytes
    (and ideally the whole header); `fail(msg)` raises. Returns Header, or the number
    of bytes needed if `head` is too short."""
    if file_size < 8 or len(head) < 8:
        fail("%s: not a safetensors file: %d bytes, the 8-byte header length is missing"
             % (path, file_size))
    n, = struct.unpack("<Q", head[:8])
    if n > MAX_HEADER:
        fail("%s: not a safetensors file or corrupted: header length %d exceeds %d"
             % (path, n, MAX_HEADER))
    if 8 + n > file_size:
        fail("%s: truncated or corrupted: header of %d bytes but the file has %d bytes"
             % (path, n, file_size))
    if len(head) < 8 + n:
        return 8 + n
    raw = bytes(head[8:8 + n])
    try:
        text = raw.decode("utf-8")
        h = json.loads(text, object_pairs_hook=_no_dups)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        fail("%s: corrupted safetensors header (bytes 8..%d): %s" % (path, 8 + n, e))
    if not isinstance(h, dict):
        fail("%s: corrupted safetensors header: JSON is not an object" % path)
    data_start = 8 + n
    data_len = file_size - data_start
    meta = h.pop("__metadata__", None)
    if meta is not None:
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            fail("%s: corrupted safetensors header: __metadata__ must map strings to strings"
                 % path)
    entries = {}
    for name, info in h.items():
        where = "%s: tensor %r" % (path, name)
        if not isinstance(info, dict):
            fail("%s: corrupted header entry (not an object)" % where)
        st = info.get("dtype")
        shape = info.get("shape")
        offs = info.get("data_offsets")
        if not isinstance(st, str) or st not in ST_DTYPES:
            fail("%s: unsupported or corrupted dtype %r" % (where, st))
        dtype = torch_dtype(st)
        if dtype is None:
            fail("%s: dtype %s is not available in this torch" % (where, st))
        if (not isinstance(shape, list) or len(shape) > 64 or
                not all(type(s) is int and s >= 0 for s in shape)):
            fail("%s: corrupted shape %r" % (where, shape))
        if (not isinstance(offs, list) or len(offs) != 2 or
                not all(type(o) is int for o in offs) or not 0 <= offs[0] <= offs[1]):
            fail("%s: corrupted data_offsets %r" % (where, offs))
        itemsize = ST_DTYPES[st][1]
        count = 1
        for s in shape:
            count *= s
        if count * itemsize != offs[1] - offs[0]:
            fail("%s: corrupted header: shape %s of %s needs %d bytes but data_offsets %s "
                 "span %d" % (where, shape, st, count * itemsize, offs, offs[1] - offs[0]))
        if offs[1] > data_len:
            fail("%s: truncated: the tensor needs bytes [%d, %d) of the file but the file has "
                 "%d bytes" % (where, data_start + offs[0], data_start + offs[1], file_size))
        e = Entry(name, st, dtype, tuple(shape), offs[0], offs[1], itemsize)
        e.path = path
        e.data_start = data_start
        entries[name] = e
    return Header(path, data_start, entries, meta, file_size)
