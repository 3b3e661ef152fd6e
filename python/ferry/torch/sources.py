"""Sources of ferry.torch's datasets: paths, globs and lists of files, and fields whose samples
are the rows of arrays (.npy, safetensors, Zarr, netCDF), planned as runs of rows."""
from __future__ import annotations

import glob as _glob
import os
import re
import sys

import numpy as np
import torch

from .. import _ferry


def _torch_dtype(name, itemsize):
    """The torch dtype of a ferry dtype or typestr (any name the C library's table knows:
    "f4", "<f4", "bf16"), or None (bytes, strings, types torch lacks). Datetimes travel as
    their int64 counts."""
    try:
        long_name = _ferry.dtype_name(name.lstrip("<>=|"), "long")
    except ValueError:
        return None
    tdt = getattr(torch, "int64" if long_name in ("datetime64", "timedelta64") else long_name, None)
    return tdt if isinstance(tdt, torch.dtype) and tdt.itemsize == itemsize else None


_LITTLE = sys.byteorder == "little"


# --------------------------------------------------------------------------------------------
# Sources and fields
# --------------------------------------------------------------------------------------------
def _natural_key(s):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _expand(spec, ctx=None):
    """A glob (natural order), a path, or a list of them -> a list of paths (str).
    s3:// and gs:// globs are listed with ctx's remote options (None: the default context's)."""
    if isinstance(spec, (str, bytes, os.PathLike)):
        s = os.fsdecode(spec)
        if any(c in s for c in "*?["):
            scheme = s.split("://", 1)[0].lower() if "://" in s else ""
            if scheme in ("s3", "gs"):
                # the bucket listed by the C library (ferry_url_glob), with the context's
                # remote options, else the environment's endpoint and credentials
                from .. import default_context
                paths = sorted((ctx if ctx is not None else default_context()).url_glob(s), key=_natural_key)
                if not paths:
                    raise FileNotFoundError(f"ferry.torch: no objects match {s!r}")
                return paths
            if scheme and scheme != "file":
                # a web server has no listing
                raise ValueError(f"ferry.torch: {s!r}: globs over {scheme}:// URLs cannot be expanded (a web server "
                                 f"has no listing; s3:// and gs:// globs are listed); name the objects")
            if scheme == "file":
                s = s[len("file://"):]
            paths = sorted(_glob.glob(s), key=_natural_key)
            if not paths:
                raise FileNotFoundError(f"ferry.torch: no files match {s!r}")
            return paths
        return [s]
    if isinstance(spec, (list, np.ndarray)) or hasattr(spec, "__iter__"):
        paths = []
        for p in spec:
            paths.extend(_expand(p, ctx))
        if not paths:
            raise ValueError("ferry.torch: an empty list of files")
        return paths
    raise TypeError(f"ferry.torch: a source is a path, a glob, a list of paths or (paths, name); got {spec!r}")


def _parse_source(spec, ctx=None):
    """-> (paths, array name or None). A tuple is (paths-or-glob, name); a list is paths."""
    if isinstance(spec, tuple):
        if len(spec) != 2 or not isinstance(spec[1], str):
            raise TypeError("ferry.torch: a tuple source is (paths_or_glob, array_name); "
                            "give several paths as a list")
        return _expand(spec[0], ctx), spec[1]
    return _expand(spec, ctx), None


class _Shard:
    __slots__ = ("path", "name", "group", "index", "rows", "offset", "contiguous")


class _Field:
    """One named field: rows concatenated over shards."""

    def __init__(self, name, shards, row_shape, typestr, ferry_dtype, itemsize):
        self.name = name
        self.shards = shards
        rows = np.array([s.rows for s in shards], dtype=np.int64)
        self.starts = np.concatenate(([0], np.cumsum(rows)[:-1])).astype(np.int64)
        self.shard_offsets = np.array([s.offset for s in shards], dtype=np.int64)
        self.rows = int(rows.sum())
        self.typestr = typestr
        tdt = _torch_dtype(ferry_dtype, itemsize)
        if tdt is not None:
            self.dtype, self.shape = tdt, tuple(row_shape)
        else:  # bytes, strings, records, dtypes torch lacks: raw bytes, one more axis
            self.dtype, self.shape = torch.uint8, tuple(row_shape) + (itemsize,)
        self.row_bytes = int(np.prod(row_shape, dtype=np.int64)) * itemsize
        self.stored_shape = tuple(row_shape)

    def __repr__(self):
        return f"<field {self.name!r} rows={self.rows} sample={self.shape} {self.dtype}>"


def _native_order(typestr):
    c = typestr[:1]
    if c in "|=":
        return True
    if c == "<":
        return _LITTLE
    if c == ">":
        return not _LITTLE
    return _LITTLE  # "bfloat16", "float8_*": safetensors, little-endian


def _open_var(ctx, path, name):
    """-> (ferry Dataset, variable index, variable dict, group)."""
    ds = _ferry.Dataset(ctx, path)
    group = None
    vs = ds.variables()
    if name is None:
        if len(vs) != 1:
            names = [v["name"] for v in vs]
            ds.close()
            raise ValueError(f"ferry.torch: {path} holds {len(vs)} arrays {names}; name one, "
                             f"e.g. fields={{'x': ({path!r}, {names[0] if names else 'name'!r})}}")
        return ds, 0, vs[0], None
    try:
        idx = ds.find(name)
    except KeyError:
        if "/" not in name.strip("/"):
            ds.close()
            raise KeyError(f"ferry.torch: {path} has no array {name!r} "
                           f"(it has {[v['name'] for v in vs]})") from None
        ds.close()
        group, base = name.strip("/").rsplit("/", 1)
        ds = _ferry.Dataset(ctx, path, group=group)
        try:
            idx = ds.find(base)
        except KeyError:
            ds.close()
            raise KeyError(f"ferry.torch: {path} has no array {name!r}") from None
        vs = ds.variables()
    return ds, idx, vs[idx], group


def _load_field(ctx, fname, spec):
    paths, name = _parse_source(spec, ctx)
    shards = []
    row_shape = typestr = fdt = itemsize = None
    for p in paths:
        ds, idx, v, group = _open_var(ctx, p, name)
        ds.close()
        shape = tuple(int(d) for d in v["shape"])
        if len(shape) == 0:
            raise ValueError(f"ferry.torch: field {fname!r}: {p} holds a scalar; samples are rows "
                             f"along the first axis")
        if row_shape is None:
            row_shape, typestr, fdt, itemsize = shape[1:], v["typestr"], v.get("dtype"), int(v["itemsize"])
        elif shape[1:] != row_shape or v["typestr"].lstrip("<>=|") != typestr.lstrip("<>=|"):
            raise ValueError(f"ferry.torch: field {fname!r}: {p} has rows {shape[1:]} {v['typestr']}, "
                             f"but {paths[0]} has {row_shape} {typestr}")
        sh = _Shard()
        sh.path, sh.name, sh.group, sh.index, sh.rows = p, v["name"], group, idx, shape[0]
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        sh.offset = int(v.get("data_offset") or 0)
        sh.contiguous = (
            (int(v.get("data_bytes") or 0) == nbytes and nbytes > 0)
            and not (v.get("fortran_order") and sum(d > 1 for d in shape) > 1)
            and not v.get("codecs")
            and _native_order(v["typestr"])
        )
        shards.append(sh)
    return _Field(fname, shards, row_shape, typestr, fdt or typestr, itemsize)


def _plan_rows(rt, plan, f, ids, ptr, nbytes, dev, handles):
    """Rows `ids` of field f into one destination: one extent per run of consecutive rows."""
    # the runs (shard, row in it, length, first batch position) in C: ferry_row_runs
    runs = np.empty((4, len(ids)), dtype=np.int64)
    nruns = _ferry.row_runs(f.starts, f.rows, np.ascontiguousarray(ids, dtype=np.int64), runs)
    run_k, run_row, run_len, run_lo = runs[:, :nruns]
    run_hi = run_lo + run_len
    rb = f.row_bytes
    dst = (ptr, nbytes, dev)
    seen = {}
    # contiguous shards: all runs of a shard in one read_file_runs call (a Python call per run
    # was the loader's cost at 1,600 batches/s); the other shards one plan.read per run
    in_batch = np.flatnonzero(np.bincount(run_k)).tolist() if len(f.shards) > 1 else [0]
    plain = [k for k in in_batch if f.shards[k].contiguous]
    if len(in_batch) > 1 and len(plain) == len(in_batch):
        # every shard plain: one call, the runs in batch order. The engine packs consecutive
        # runs into one staging buffer, so rows adjacent in the batch make one copy per buffer;
        # grouped by shard they landed rows apart and every buffer took the scatter kernel
        # (stand-in driver, 256 shuffled 150 KB rows of 4 shards: 32 launches a batch -> 0)
        files = []
        at = np.empty(len(f.shards), dtype=np.int64)      # shard -> its index in files
        for i, k in enumerate(plain):
            sh = f.shards[k]
            key = ("file", sh.path)
            e = rt.handle(key, lambda p=sh.path: _ferry.File(rt.ctx, p))
            files.append(e[0])
            at[k] = i
            e[1] += 1
            handles.append(e)
        plan.read_files_runs(files, at[run_k], f.shard_offsets[run_k] + run_row * rb, run_len * rb, dst,
                             run_lo * rb)
        return
    if len(in_batch) > 1 and plain:
        # runs grouped by shard once (a stable sort), each shard's runs then a slice: a
        # boolean mask and three gathers per shard were ~8 numpy calls a shard a batch
        by_shard = np.argsort(run_k, kind="stable")
        offs = (f.shard_offsets[run_k] + run_row * rb)[by_shard]
        lens = (run_len * rb)[by_shard]
        dsts = (run_lo * rb)[by_shard]
        sorted_k = run_k[by_shard]
        firsts = np.searchsorted(sorted_k, plain, side="left").tolist()
        ends = np.searchsorted(sorted_k, plain, side="right").tolist()
    for i, k in enumerate(plain):
        sh = f.shards[k]
        key = ("file", sh.path)
        e = seen.get(key) or rt.handle(key, lambda p=sh.path: _ferry.File(rt.ctx, p))
        if len(in_batch) > 1:
            a, z = firsts[i], ends[i]
            plan.read_file_runs(e[0], offs[a:z], lens[a:z], dst, dsts[a:z])
        else:
            plan.read_file_runs(e[0], sh.offset + run_row * rb, run_len * rb, dst, run_lo * rb)
        if key not in seen:
            seen[key] = e
            e[1] += 1
            handles.append(e)
    if len(plain) == len(in_batch):
        return
    for j0, j1, k, row in zip(run_lo.tolist(), run_hi.tolist(), run_k.tolist(), run_row.tolist()):
        sh = f.shards[k]
        cnt = j1 - j0
        if sh.contiguous:
            continue
        key = ("ds", sh.path, sh.group)
        e = seen.get(key) or rt.handle(key, lambda s=sh: _open_ds(rt.ctx, s.path, s.group))
        sel = [(row, row + cnt, 1)] + [(0, d, 1) for d in f.stored_shape]
        plan.read(e[0], sh.name, (ptr + j0 * rb, cnt * rb, dev), selection=sel, native=True)
        if key not in seen:
            seen[key] = e
            e[1] += 1
            handles.append(e)


def _open_ds(ctx, path, group):
    return _ferry.Dataset(ctx, path) if group is None else _ferry.Dataset(ctx, path, group=group)


def _read_rows(self, ds, rt, plan, ids, g):
    total = len(ids)
    buf = ds._alloc(rt, (total,) + self.shape, self.dtype)
    if self.row_bytes and total:
        dev = buf.device.index if buf.is_cuda else -1
        _plan_rows(rt, plan, self, ids, buf.data_ptr(), total * self.row_bytes, dev, g.handles)
    return buf


_Field.read = _read_rows
