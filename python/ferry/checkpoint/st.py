"""safetensors layout for ferry.checkpoint: dtypes, 4 KiB-aligned layout, header build,
and the canonical description of a header that crc32c=True checksums.

Headers are parsed by the C library only (ferry._ferry.Dataset); this module writes them.

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

import functools
import json
import struct

from .. import _ferry

ALIGN = 4096
MAX_HEADER = 100 * 1000 * 1000   # safetensors' own bound on N
BIG = 64 * 1024                  # "large" tensor for the layout

# The names are the C library's one table (_ferry.DTYPES, src/base/names.c): rows
# (short, long = torch attribute name, safetensors, typestr, bits). Python only translates.
_WHOLE = {r[2]: r for r in _ferry.DTYPES if r[2] and r[4] % 8 == 0}   # sub-byte types: bytes


@functools.lru_cache(maxsize=None)   # per tensor of a 100,000-tensor open: ask C once per type
def st_of_typestr(typestr):
    """safetensors dtype name of a tensor the C parser describes by `typestr`, or None
    (sub-byte dtypes, which the C parser exposes as bytes)."""
    try:
        st = _ferry.dtype_name(typestr, "safetensors")
    except ValueError:
        return None
    return st if st in _WHOLE else None


@functools.lru_cache(maxsize=None)
def torch_dtype(st):
    """The torch dtype of a safetensors dtype name, or None (unknown here or to torch)."""
    import torch
    row = _WHOLE.get(st)
    dt = getattr(torch, row[1], None) if row else None
    return dt if isinstance(dt, torch.dtype) and dt.itemsize * 8 == row[4] else None


def st_dtype(dtype):
    """safetensors name of a torch dtype, or raise TypeError."""
    name = str(dtype).replace("torch.", "")
    for st, row in _WHOLE.items():
        if row[1] == name and torch_dtype(st) == dtype:
            return st
    raise TypeError("ferry.checkpoint: dtype %s has no safetensors name (supported: %s)"
                    % (dtype, ", ".join(sorted(r[1] for r in _WHOLE.values()))))


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


HEADER_CRC_KEY = "ferry.crc32c.header"   # __metadata__ (or index metadata): 8 hex digits


def header_digest(metadata, tensors):
    """CRC32C of the canonical description of a header: its metadata (all keys but
    HEADER_CRC_KEY) and every tensor as (name, safetensors dtype, shape, absolute byte
    offset, byte length, shard file name or ""). Computed by save from what it writes and
    by load from what the C parser read, so a flipped bit anywhere in the structure (a
    tensor name, a shape, ferry.tree's values) fails the check."""
    md = sorted((str(k), v) for k, v in (metadata or {}).items() if k != HEADER_CRC_KEY)
    ts = sorted([str(n), str(dt), [int(x) for x in shape], int(off), int(nb), str(shard)]
                for n, dt, shape, off, nb, shard in tensors)
    text = json.dumps([md, ts], separators=(",", ":"), sort_keys=True, ensure_ascii=True)
    return _ferry.crc32c(text.encode("ascii"))
