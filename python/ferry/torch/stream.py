"""ferry.torch — PyTorch streaming datasets fed by ferry's engine.

``ArrayDataset`` is a ``torch.utils.data.IterableDataset`` whose samples are the rows (the first
axis) of one or more arrays stored in ``.npy`` files, safetensors shards or Zarr arrays, or
(``samples="files"``) whole files, one per sample. ``TokenDataset`` yields (x, y) windows of
flat token files. Both share one contract (_BatchStream: order, sharding, epochs, resume,
prefetch, CUDA hand-off), which a dataset over other samples reuses by describing its fields. A batch
of sample ids becomes one ferry plan (one extent per run of consecutive rows) that the engine's
native threads read straight into tensors allocated by torch on ``device``; no worker processes,
no pickling, no pageable copies. See docs/torch.md for the full guide.

Order and sharding (W ranks, batch B, N samples)
    The epoch order is a permutation of range(N) computed from (seed, epoch) alone, identical on
    every rank and process. Global step s consumes positions [s*W*B, (s+1)*W*B) of that order;
    rank r takes [s*W*B + r*B, s*W*B + (r+1)*B). After k steps exactly the first k*W*B positions
    are consumed whatever W is, so a state saved with W ranks resumes with W' ranks.
    Tail (fewer than W*B positions left): drop_last=True drops it; drop_last=False splits it as
    evenly as possible (contiguous slices, rank order) — every sample exactly once, but ranks
    whose slice is empty yield one batch fewer (use drop_last=True with DDP).
    Inside a DataLoader with num_workers=n, worker w of a rank takes that rank's batches
    w, w+n, w+2n, ...: the DataLoader's round-robin hands them to the training loop in order.

Epochs
    Handing over a pass's last batch ends the pass (Lightning never asks for StopIteration): the
    next iter() is the next epoch. The state stays global: a rank whose share of an uneven tail
    is empty reports the position after its last step (where every rank is at that step) until
    its StopIteration, the step in which the other ranks finish the epoch.
    Worker copies learn their epoch from a shared-memory board (loader.EpochBoard): each
    new DataLoader pass is the next epoch unless set_epoch/load_state_dict in the main process
    chose one. In the main process the next epoch's first reads run while a pass's last batches
    are consumed (_BatchStream, "Epoch boundaries"; FERRY_EPOCH_AHEAD=off turns it off).
"""
from __future__ import annotations

import collections
import glob as _glob
import itertools
import math
import os
import re
import sys
import threading

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .. import _ferry, _torch_device
from .loader import EpochBoard, auto_collation, pass_tag
from .order import FeistelOrder, Layout as _Layout, epoch_order

_plan_windows = getattr(_ferry, "plan_windows", None)   # TokenDataset's group plans (ext/perm.c)
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1

__all__ = ["ArrayDataset", "TokenDataset", "XarrayDataset", "epoch_order", "global_state", "pad_collate"]

_STATE_TAG = "ferry.torch.ArrayDataset"
_STATE_VERSION = 1

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


def _expand(spec):
    """A glob (natural order), a path, or a list of them -> a list of paths (str)."""
    if isinstance(spec, (str, bytes, os.PathLike)):
        s = os.fsdecode(spec)
        if any(c in s for c in "*?["):
            paths = sorted(_glob.glob(s), key=_natural_key)
            if not paths:
                raise FileNotFoundError(f"ferry.torch: no files match {s!r}")
            return paths
        return [s]
    if isinstance(spec, (list, np.ndarray)) or hasattr(spec, "__iter__"):
        paths = []
        for p in spec:
            paths.extend(_expand(p))
        if not paths:
            raise ValueError("ferry.torch: an empty list of files")
        return paths
    raise TypeError(f"ferry.torch: a source is a path, a glob, a list of paths or (paths, name); got {spec!r}")


def _parse_source(spec):
    """-> (paths, array name or None). A tuple is (paths-or-glob, name); a list is paths."""
    if isinstance(spec, tuple):
        if len(spec) != 2 or not isinstance(spec[1], str):
            raise TypeError("ferry.torch: a tuple source is (paths_or_glob, array_name); "
                            "give several paths as a list")
        return _expand(spec[0]), spec[1]
    return _expand(spec), None


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
    paths, name = _parse_source(spec)
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
    if len(f.shards) == 1:
        shard_idx = np.zeros(len(ids), dtype=np.int64)
        local = ids
    else:
        shard_idx = np.searchsorted(f.starts, ids, side="right") - 1
        local = ids - f.starts[shard_idx]
    if len(ids) > 1:
        brk = np.flatnonzero((np.diff(local) != 1) | (np.diff(shard_idx) != 0)) + 1
        run_lo = np.concatenate(([0], brk))
        run_hi = np.concatenate((brk, [len(ids)]))
    else:
        run_lo, run_hi = np.array([0]), np.array([len(ids)])
    rb = f.row_bytes
    dst = (ptr, nbytes, dev)
    seen = {}
    run_k = shard_idx[run_lo]
    run_row = local[run_lo].astype(np.int64, copy=False)
    run_lo = np.asarray(run_lo, dtype=np.int64)
    run_len = np.asarray(run_hi, dtype=np.int64) - run_lo
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


# --------------------------------------------------------------------------------------------
# samples="files": one file is one sample
# --------------------------------------------------------------------------------------------
_SAMPLE_EXTS = (".npy", ".safetensors")


def _is_zarr_store(d):
    """Whether directory d is a Zarr store (one array source), as the C library's one
    sniffer (ferry_format_detect) says, not a directory of per-sample files."""
    try:
        return _ferry.format_detect(d) == "zarr"
    except _ferry.FerryError:
        return False


def _expand_files(spec):
    """A field of per-sample files: a glob, a directory (its .npy and .safetensors files in
    natural order; other files there are not samples), a list."""
    if isinstance(spec, (str, os.PathLike)) and os.path.isdir(os.fspath(spec)) and \
            not _is_zarr_store(os.fspath(spec)):
        d = os.fspath(spec)
        names = sorted((e.name for e in os.scandir(d) if not e.name.startswith(".")
                        and e.name.endswith(_SAMPLE_EXTS) and e.is_file()), key=_natural_key)
        if not names:
            raise FileNotFoundError(f"ferry.torch: no {' or '.join(_SAMPLE_EXTS)} files in "
                                    f"directory {d!r} (give a glob for other names)")
        return [os.path.join(d, x) for x in names]
    if isinstance(spec, (list, tuple)) and not (isinstance(spec, tuple) and len(spec) == 2
                                               and isinstance(spec[1], str)):
        out = []
        for p in spec:
            out.extend(_expand_files(p))
        return out
    return _expand(spec)


class _FileField:
    """A field whose samples are whole files (each holding one array)."""

    def __init__(self, name, paths, array, shape, typestr, itemsize, collate):
        self.name, self.paths, self.array, self.collate = name, paths, array, collate
        self.rows = len(paths)
        self.typestr = typestr
        self.itemsize = itemsize
        tdt = _torch_dtype(typestr, itemsize)
        if tdt is None:
            raise ValueError(f"ferry.torch: field {name!r}: {paths[0]} holds {typestr}, a type "
                             f"torch has no dtype for")
        self.dtype, self.shape = tdt, tuple(shape)
        self.row_bytes = int(np.prod(shape, dtype=np.int64)) * itemsize

    def __repr__(self):
        return f"<field {self.name!r} files={self.rows} sample={self.shape} {self.dtype}>"

    def read(self, ds, rt, plan, ids, g):
        paths = [self.paths[i] for i in ids.tolist()]
        if self.collate is None:
            buf = ds._alloc(rt, (len(paths),) + self.shape, self.dtype)
            if self.npy_batch:
                g.extra.append(_NpyBatchJob(rt, self, paths, buf))
            else:
                _plan_sample_files(rt, plan, self, paths, buf, g.handles)
            return buf
        return _plan_sample_files(rt, plan, self, paths, None, g.handles,
                                  alloc=lambda shape: ds._alloc(rt, shape, self.dtype))


def _var_info(v):
    return tuple(int(d) for d in v["shape"]), v["typestr"], int(v["itemsize"])


def _same_type(a, b):
    return a.lstrip("<>=|") == b.lstrip("<>=|") and _native_order(a) == _native_order(b)


class _NpyBatchJob:
    """One batch of a per-sample .npy field through the engine's batch reader
    (_ferry.npy_read_many: every header and file read in one engine job, through the
    context's open-file cache). The call is synchronous and releases the GIL, so it runs on
    the runtime's reader threads; the object answers as a Job does. Device memory is complete
    when the call returns, so stream_wait() waits on the host."""
    path = "npy_batch"

    def __init__(self, rt, f, paths, buf):
        self.f, self.paths = f, paths
        dev = buf.device.index if buf.is_cuda else -1
        dst = (buf.data_ptr(), len(paths) * f.row_bytes, dev)
        # reread: a dataset's files come round again next epoch (FERRY_REREAD keeps them cached)
        self.future = rt.reader().submit(_ferry.npy_read_many, rt.ctx, paths, dst, f.row_bytes, reread=True)

    def done(self):
        return self.future.done()

    def wait(self, timeout=None):
        f = self.f
        try:
            info = self.future.result(timeout)
        except _ferry.FerryError as e:
            raise _ferry.FerryError(e.code, f"ferry.torch: field {f.name!r}: {e}; its samples are "
                                    f"{f.shape} {f.typestr} (from {f.paths[0]}); files of other "
                                    f"shapes need collate= (e.g. ferry.torch.pad_collate())") from None
        shape = tuple(int(d) for d in info["shape"])
        if shape != f.shape or not _same_type(info["typestr"], f.typestr):
            # the batch's first file sets the batch reader's shape: it must be the field's
            raise _ferry.FerryError(
                _ferry.EINVAL,
                f"ferry.torch: field {f.name!r}: {self.paths[0]} holds {shape} {info['typestr']}, "
                f"but the field's samples are {f.shape} {f.typestr} (from {f.paths[0]}); files "
                f"of other shapes need collate= (e.g. ferry.torch.pad_collate())")
        return len(self.paths) * f.row_bytes

    def stream_wait(self, stream):
        self.wait()

    def cancel(self):
        self.future.cancel()


class _Jobs:
    """Several jobs of one batch, answering as one Job."""

    def __init__(self, jobs):
        self.jobs = jobs

    @property
    def path(self):
        return self.jobs[0].path

    def done(self):
        return all(j.done() for j in self.jobs)

    def wait(self, timeout=None):
        err, n = None, 0
        for j in self.jobs:
            try:
                n += j.wait() or 0
            except Exception as e:           # every job is waited for before the error goes up
                err = err or e
        if err is not None:
            raise err
        return n

    def stream_wait(self, stream):
        for j in self.jobs:
            j.stream_wait(stream)


def _wait_quietly(job):
    try:
        job.wait()
    except Exception:
        pass


def _plan_sample_files(rt, plan, f, paths, dst, handles, alloc=None):
    """THE per-sample read of one batch: file j of `paths` -> sample j, all into one plan.

    dst: the batch tensor (every file must have f's shape and type; sample j at j*row_bytes),
    or None with alloc(shape) -> tensor for each file (ragged fields; returns the list).
    Today this opens and parses each file here, in Python (the context's handle cache keeps
    recent ones); the engine's call that plans N per-sample .npy files at once replaces the
    loop below, with the same contract: one plan, the same destinations, and an error naming
    the file whose shape or type differs."""
    dev = dst.device.index if dst is not None and dst.is_cuda else -1
    out = []
    seen = set()
    for j, p in enumerate(paths):
        key = ("ds", p, None)
        # a file replaced since it was cached (another inode, size or mtime) is opened again:
        # its new header decides, never the old one. Only cached handles are checked (a fresh
        # open is of the current file); the signature is taken before the open, so a replace
        # racing it is caught at the file's next batch.
        cached = key in rt.handles
        sig = _file_sig(p)
        e = rt.handle(key, lambda p=p: _ferry.Dataset(rt.ctx, p))
        if not cached or len(e) < 3:
            e[2:] = [sig]
        elif e[2] != sig:
            rt.handles.pop(key, None)
            e = rt.handle(key, lambda p=p: _ferry.Dataset(rt.ctx, p))
            e[2:] = [sig]
        if key not in seen:
            seen.add(key)
            e[1] += 1
            handles.append(e)
        h = e[0]
        v = h.variable(f.array) if f.array is not None else _only_var(h, p, f.name)
        shape, typestr, itemsize = _var_info(v)
        if not _same_type(typestr, f.typestr) or itemsize != f.itemsize or \
                (dst is not None and shape != f.shape):
            raise _ferry.FerryError(
                _ferry.EINVAL,
                f"ferry.torch: field {f.name!r}: {p} holds {shape} {typestr}, but the field's "
                f"samples are {f.shape} {f.typestr} (from {f.paths[0]}); files of other shapes "
                f"need collate= (e.g. ferry.torch.pad_collate()) ")
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        if dst is None:
            t = alloc(shape)
            out.append(t)
            if nbytes:
                plan.read(h, v["name"], (t.data_ptr(), nbytes, t.device.index if t.is_cuda else -1),
                          native=True)
        elif nbytes:
            plan.read(h, v["name"], (dst.data_ptr() + j * nbytes, nbytes, dev), native=True)
    return out if dst is None else None


def _file_sig(path):
    """What tells a file replaced or rewritten from the one read before: inode, device, size,
    mtime (OSError when it is gone)."""
    st = os.stat(path)
    return st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns


def _only_var(h, path, field):
    vs = h.variables()
    if len(vs) != 1:
        raise ValueError(f"ferry.torch: field {field!r}: {path} holds {len(vs)} arrays "
                         f"{[v['name'] for v in vs]}; name one: ({path!r}, name)")
    return vs[0]


def _load_file_field(ctx, fname, spec, collate):
    array = None
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], str):
        spec, array = spec
    paths = _expand_files(spec)
    if not paths:
        raise ValueError(f"ferry.torch: field {fname!r} has no files")
    ds, idx, v, _ = _open_var(ctx, paths[0], array)
    ds.close()
    shape, typestr, itemsize = _var_info(v)
    if v.get("error"):
        raise _ferry.FerryError(_ferry.EUNSUPPORTED, f"ferry.torch: {paths[0]}: {v['error']}")
    f = _FileField(fname, paths, array, shape, typestr, itemsize, collate)
    # the engine's batch reader takes plain one-array .npy files (C or big-endian order)
    f.npy_batch = hasattr(_ferry, "npy_read_many") and array is None and \
        not v.get("fortran_order") and all(p.endswith(".npy") for p in paths)
    return f


# --------------------------------------------------------------------------------------------
# TokenDataset's one field: windows of seq_len + 1 tokens
# --------------------------------------------------------------------------------------------
_TOKEN_DTYPES = {"uint16": ("<u2", torch.uint16), "uint32": ("<u4", torch.uint32),
                 "int32": ("<i4", torch.int32), "int64": ("<i8", torch.int64)}


class _TokenField:
    name = "tokens"

    def __init__(self, paths, offsets, tokens, seq_len, typestr, dtype):
        self.paths = paths
        self.offsets = np.asarray(offsets, dtype=np.int64)     # byte offset of token 0 per file
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.seq_len = seq_len
        self.itemsize = int(typestr[2:])
        self.windows = np.maximum(0, (self.tokens - 1) // seq_len)
        self.starts = np.concatenate(([0], np.cumsum(self.windows)[:-1])).astype(np.int64)
        self.rows = int(self.windows.sum())
        self.dtype, self.shape = dtype, (seq_len + 1,)
        self.row_bytes = (seq_len + 1) * self.itemsize

    def __repr__(self):
        return f"<tokens files={len(self.paths)} windows={self.rows} of {self.seq_len + 1} {self.dtype}>"

    def read_group(self, ds, rt, plan, order, ranges, g, buf=None):
        """The windows at the epoch positions of `ranges` ((lo, hi) per batch), in batch order,
        into one (total, seq_len + 1) buffer (`buf`, or a new one): one plan_windows call
        (order, file and offset of every window computed in C; files opened as their windows
        come up)."""
        total = sum(hi - lo for lo, hi in ranges)
        if buf is None:
            buf = ds._alloc(rt, (total,) + self.shape, self.dtype)
        if total:
            dev = buf.device.index if buf.is_cuda else -1

            def opener(k):
                p = self.paths[k]
                e = rt.handle(("file", p), lambda p=p: _ferry.File(rt.ctx, p))
                e[1] += 1                   # in use until the group is released
                g.handles.append(e)
                return e[0]
            _ferry.plan_windows(plan, opener, self.starts, self.offsets, self.seq_len * self.itemsize,
                                self.row_bytes, order.n, order.seed, order.epoch, order.shuffle,
                                np.asarray(ranges, dtype=np.int64).reshape(-1),
                                (buf.data_ptr(), total * self.row_bytes, dev))
        return buf

    def read(self, ds, rt, plan, ids, g):
        handles = g.handles
        total = len(ids)
        buf = ds._alloc(rt, (total,) + self.shape, self.dtype)
        if total:
            dev = buf.device.index if buf.is_cuda else -1
            k = np.searchsorted(self.starts, ids, side="right") - 1 if len(self.paths) > 1 \
                else np.zeros(len(ids), dtype=np.int64)
            off = self.offsets[k] + (ids - self.starts[k]) * (self.seq_len * self.itemsize)
            dst = (buf.data_ptr(), total * self.row_bytes, dev)
            rb = self.row_bytes
            doff = np.arange(total, dtype=np.int64) * rb
            # one call for the whole read (a Python call per window was the loader's cost),
            # the windows in batch order over all files: packed staging buffers then hold
            # windows adjacent in the batch, one copy each (see _plan_rows)
            used = np.flatnonzero(np.bincount(k)).tolist() if len(self.paths) > 1 else [0]
            files = []
            for kk in used:
                p = self.paths[kk]
                e = rt.handle(("file", p), lambda p=p: _ferry.File(rt.ctx, p))
                e[1] += 1
                handles.append(e)
                files.append(e[0])
            if len(used) > 1:
                at = np.empty(len(self.paths), dtype=np.int64)
                at[used] = np.arange(len(used), dtype=np.int64)
                plan.read_files_runs(files, at[k], off, rb, dst, doff)
            else:
                plan.read_file_runs(files[0], off, rb, dst, doff)
        return buf


def _load_token_field(ctx, files, seq_len, dtype):
    if dtype not in _TOKEN_DTYPES:
        raise ValueError(f"TokenDataset: dtype must be one of {sorted(_TOKEN_DTYPES)}, not {dtype!r}")
    want, tdt = _TOKEN_DTYPES[dtype]
    paths = _expand(files)
    offsets, tokens = [], []
    isz = int(want[2:])
    for p in paths:
        try:
            h = _ferry.Dataset(ctx, p)
        except _ferry.FerryError as e:
            if e.code != _ferry.ENOFORMAT:
                raise
            h = None
        if h is None:                                    # raw tokens (nanoGPT's .bin)
            if not p.endswith(".bin"):
                # a glob also matching a README or a .json must not train on its bytes
                raise _ferry.FerryError(_ferry.ENOFORMAT, f"TokenDataset: {p} is neither a 1-D .npy nor a "
                                        "raw token file named *.bin (nanoGPT's layout)")
            size = os.path.getsize(p)
            if size % isz:
                raise _ferry.FerryError(_ferry.EINVAL, f"TokenDataset: {p} has {size} bytes, not a "
                                        f"whole number of {dtype} tokens")
            offsets.append(0)
            tokens.append(size // isz)
            continue
        try:
            vs = h.variables()
        finally:
            h.close()
        if len(vs) != 1 or len(vs[0]["shape"]) != 1:
            raise _ferry.FerryError(_ferry.EINVAL, f"TokenDataset: {p} is not one 1-D array "
                                    f"(it holds {[(v['name'], tuple(v['shape'])) for v in vs]})")
        v = vs[0]
        ts = v["typestr"]
        if ts.lstrip("<>=|") != want[1:] or (ts[0] == ">" and isz > 1) or v.get("codecs"):
            raise _ferry.FerryError(_ferry.EINVAL, f"TokenDataset: {p} holds {ts} tokens, "
                                    f"dtype={dtype!r} expects {want}")
        n = int(v["shape"][0])
        if int(v.get("data_bytes") or 0) != n * isz:
            raise _ferry.FerryError(_ferry.EUNSUPPORTED, f"TokenDataset: {p}: tokens are not "
                                    f"stored contiguously")
        offsets.append(int(v.get("data_offset") or 0))
        tokens.append(n)
    if not _LITTLE:
        raise _ferry.FerryError(_ferry.EUNSUPPORTED, "TokenDataset: little-endian hosts only")
    return _TokenField(paths, offsets, tokens, seq_len, want, tdt)


# --------------------------------------------------------------------------------------------
# Per-process runtime: engine context, open files, CUDA streams. Never pickled, rebuilt after
# fork (engine threads do not survive fork).
# --------------------------------------------------------------------------------------------
class _Runtime:
    def __init__(self, ctx, device):
        self.pid = os.getpid()
        self.ctx = ctx
        self.device = device
        self.handles = collections.OrderedDict()   # key -> [handle, jobs in flight using it]
        try:
            import resource
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except Exception:  # pragma: no cover
            soft = 1024
        self.max_handles = max(16, min(512, soft // 8 if soft > 0 else 128))
        self.alloc_stream = self.work_stream = None
        self._reader = None
        self._planner = None
        self.staging_bytes = 0    # all of the engine's staging buffers (CUDA: _groups_in_flight)
        if device.type == "cuda":
            c = ctx.config()
            self.staging_bytes = c["threads"] * c["staging_size"] * c["staging_count"]
            # Destination buffers are allocated on a stream that runs no work, and every stream
            # that uses a buffer is recorded on it (record_stream): the caching allocator then
            # hands a block out again only after all that work has finished, which is what the
            # engine (whose copies are not ordered on any torch stream) needs.
            self.alloc_stream = torch.cuda.Stream(device)
            self.work_stream = torch.cuda.Stream(device)   # cast / transform run here

    def reader(self):
        """Threads that run the engine's synchronous batch calls (they release the GIL)."""
        if self._reader is None:
            import concurrent.futures
            self._reader = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="ferry-npy")
        return self._reader

    def planner(self):
        """One thread that plans and submits read groups (TokenDataset) while the consumer's
        thread hands batches out: one, so that groups reach the engine in order and the handle
        cache is used by one thread at a time."""
        if self._planner is None:
            import concurrent.futures
            self._planner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ferry-plan")
        return self._planner

    def handle(self, key, opener):
        e = self.handles.get(key)
        if e is None:
            if len(self.handles) >= self.max_handles:
                # the oldest idle handles go, a batch's worth at a time (per-sample files open
                # hundreds per batch: one scan per eviction would be quadratic)
                want = len(self.handles) - self.max_handles + max(1, self.max_handles // 8)
                idle = []
                for k, v in self.handles.items():
                    if v[1] == 0:
                        idle.append(k)
                        if len(idle) >= want:
                            break
                for k in idle:
                    h = self.handles.pop(k)[0]
                    try:
                        h.close()
                    except Exception:
                        pass
            e = self.handles[key] = [opener(), 0]
        else:
            self.handles.move_to_end(key)
        return e

    def close(self):
        if self._planner is not None:
            # on the planner thread itself (a last reference dropped there), it cannot be joined
            on_it = threading.current_thread().name.startswith("ferry-plan")
            self._planner.shutdown(wait=not on_it)
            self._planner = None
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None
        for e in self.handles.values():
            h = e[0]
            try:
                h.close()
            except Exception:
                pass
        self.handles.clear()


_IMPORT_PID = os.getpid()   # a forked child must not use the parent's default context
_FORKED = []   # runtimes inherited from a parent process: kept, never closed


def _collect_before_fork():
    # A forked child (a DataLoader worker of another dataset, say) inherits the parent's
    # uncollected garbage; when the child's cyclic GC frees a CUDA tensor that ferry recorded
    # on its streams, torch's allocator calls CUDA there and aborts the child ("CUDA error:
    # initialization error" in insert_events). Collecting in the parent first, once ferry has
    # made CUDA batches, leaves the child nothing of ours to free (H200, bench_xarray_training:
    # the isel DataLoader peer after XarrayDataset rows).
    import gc
    gc.collect()


_AT_FORK = []   # registered once, by the first runtime on a CUDA device


_FILL_STAGINGS = 2          # on CUDA, batches in flight hold at least twice the engine's staging
_MAX_GROUPS = 64            # ... but never more groups than this (tiny batches)


def _even_group(count, read_units):
    """Units per read for a pass of `count` units when a read may take `read_units`: as many
    reads as read_units gives, of one size, so the pass's last read is not a sliver. With two
    groups in flight (the one handed out and the one being read) a last read of two batches
    left the engine idle while the group before it was consumed, and the next epoch's first
    read (_read_ahead) started two batches before it was needed (H200, netCDF-4, 104 batches
    in reads of 17: 6 x 17 + 2; its first next() waited 70-77 ms). Evened: 7 x 15 (the last
    14), and the first next() took 0.9-1.2 ms (BENCHMARKS.md, eighth session)."""
    if count <= 0 or read_units <= 1:
        return max(1, read_units)
    reads = -(-count // read_units)
    return -(-count // reads)


def _groups_in_flight(prefetch, group_units, group_bytes, staging_bytes):
    """Groups read ahead of the consumer, the one being handed out included: prefetch + 1
    units, counted in groups when batches are grouped. On CUDA (staging_bytes: all of the
    engine's staging buffers) also enough groups to fill twice that: the engine keeps its 16
    workers busy only with bytes queued, not batches (H200, ferry bench --records, 150 KB
    rows: 35.5 GB/s with 2 batches of 38.5 MB in flight, 47.4 with 5; a batch of 256 8 KiB
    windows is 2 MiB, one staging buffer). prefetch=0 means no read-ahead and keeps it."""
    depth = prefetch + 1 if group_units == 1 else 1 + -(-prefetch // group_units)
    if prefetch > 0 and group_bytes > 0 and staging_bytes > 0:
        depth = max(depth, min(_MAX_GROUPS, -(-_FILL_STAGINGS * staging_bytes // group_bytes)))
    return depth


class _Group:
    """A set of units read by one plan/job."""
    __slots__ = ("units", "sizes", "bufs", "job", "handles", "path", "extra", "staged")


class _PlannedJob:
    """The job of a group planned and submitted on the runtime's planner thread: the calls
    _BatchStream makes on a job, each first waiting for the planning (whose error, a file
    shorter than its windows say, is raised here: at the group's turn, after the groups
    before it)."""
    __slots__ = ("_future", "_job")

    def __init__(self, future):
        self._future, self._job = future, None

    def _get(self):
        if self._future is not None:
            f, self._future = self._future, None
            self._job = f.result()
        return self._job

    def done(self):
        if self._future is not None and not self._future.done():
            return False
        j = self._get()
        return j is None or j.done()

    def wait(self):
        j = self._get()
        return None if j is None else j.wait()

    def stream_wait(self, stream):
        j = self._get()
        if j is not None:
            j.stream_wait(stream)

    @property
    def path(self):
        j = self._get()
        return None if j is None else j.path


def _env_on(name, default):
    """An on/off setting from the environment: `default` when unset; any other value is
    refused (ferry never ignores a bad setting)."""
    v = os.environ.get(name)
    if v is None:
        return default
    if v in ("on", "off"):
        return v == "on"
    raise ValueError(f'{name}="{v}": use on or off')


def _epoch_ahead():
    """FERRY_EPOCH_AHEAD: whether a pass reads the next pass's first groups (on, the default) or
    not (off)."""
    return _env_on("FERRY_EPOCH_AHEAD", True)


class _Ahead:
    """The next pass's first read groups, submitted while a pass hands out its last batches
    (_BatchStream._read_ahead). They live on the dataset, not in the pass's generator, whose
    `finally` would wait for them and drop them; `key` is everything that decides their
    contents, and the next pass takes them only if it would have submitted the same groups."""
    __slots__ = ("pid", "rt", "key", "epoch", "lay", "units", "ids_for", "groups", "stamps")


# --------------------------------------------------------------------------------------------
# The dataset contract (order, sharding, epochs, resume, prefetch, hand-off), shared by
# ArrayDataset and TokenDataset (and meant for XarrayDataset): a subclass describes its samples
# with `_fields` (objects with name, shape, dtype, row_bytes and read()) and `num_samples`.
# --------------------------------------------------------------------------------------------
class _BatchStream(IterableDataset):
    """The contract ArrayDataset, TokenDataset and XarrayDataset share (the module's docstring
    says what it promises); _iterate runs one pass, keeping up to `depth` read groups in flight
    (_groups_in_flight), the one being handed out included.

    Epoch boundaries
        Once a pass (in the main process) has submitted its last group, it submits the first
        groups of the next pass — the one the next iter() runs if nothing changes in between:
        epoch + 1 from its start — while its last batches are consumed, as many as keep `depth`
        groups in flight (GPU memory holds no more groups than within an epoch). Without them
        an epoch's first next() waited for a whole read group (H200, XarrayDataset, netCDF-4, 17
        batches a read: 216 ms); DALI's readers also read across the boundary. The groups are
        kept on the dataset, and the next pass starts with them only if everything that decides
        their contents is what it would plan: the runtime (device), epoch, start 0 and no
        resumed worker position, rank, world size, batch size, drop_last, the number of
        samples, seed, shuffle, block_size, the group size and the units themselves, and for
        samples="files" every file unchanged (_ahead_stamp). Otherwise (set_epoch to another
        epoch, load_state_dict of another position, a pass broken off mid-epoch, another device)
        they are waited for and dropped, and the pass plans as without them. A read error in a
        kept group is raised at that group's turn in the next pass, as without it; a group
        dropped raises nothing. After the last epoch the kept groups hold their memory until the
        next iter() or the dataset's end. Passes in DataLoader workers, and prefetch=0, read
        nothing ahead. FERRY_EPOCH_AHEAD=off (read at each iter(); "on" or unset: the default)
        turns it off: a pass then neither uses nor submits the next pass's groups.
    """
    _STATE_TAG = _STATE_TAG
    # issue the next group's casts and transform while this one is handed out
    # (_stage_ahead); a subclass whose _finish may raise about its files opts in once its
    # errors may surface a group early
    _STAGE_AHEAD = False
    # a subclass whose _submit maps its units' positions through the order itself (in C:
    # TokenDataset's plan_windows) is handed no precomputed ids
    _ORDER_IN_PLAN = False

    def _init_stream(self, *, batch_size, shuffle, seed, drop_last, device, rank, world_size,
                     prefetch, transform, pin_memory, threads, ctx, sample_group):
        name = type(self).__name__
        if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                       or batch_size < 1):
            raise ValueError(f"{name}: batch_size must be a positive int or None, not {batch_size!r}")
        if prefetch < 0:
            raise ValueError(f"{name}: prefetch must be >= 0")
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.device = None if device is None else _torch_device(device)   # ferry's one device parser (__init__.py)
        self.rank, self.world_size = rank, world_size
        self.prefetch = int(prefetch)
        self.transform = transform
        self.pin_memory = bool(pin_memory)
        self.threads = int(threads)
        self.sample_group = max(1, int(sample_group))
        # batches read by one plan (and handed to the device by one copy): a subclass whose
        # batches are small sets it (TokenDataset), so per-batch Python work falls on many
        # batches; each batch handed out is then a slice of its group's tensors
        self.batch_group = 1
        self._ctx_arg, self._ctx_pid = ctx, os.getpid()
        self._rt = None
        self._rt_lock = threading.Lock()
        self.block_size = getattr(self, "block_size", None)
        self._convert = {}
        # progress (global; see state_dict)
        self._epoch = 0
        self._consumed = 0
        self._resume = None        # per-worker state to restore exactly (StatefulDataLoader)
        self._worker_progress = None
        self._generation = 0
        self._pass_over = False    # this rank's share is used up, the epoch not: see end_of_pass
        self._passes = 0           # passes started by this copy (a worker's tag; see loader.py)
        self._order_cache = None
        self._ahead = None         # the next pass's first groups (_Ahead), read by this pass's end
        self._board = EpochBoard()  # epochs counted across DataLoader worker passes
        self.last_path = None      # engine path that served the latest batch

    # ---------------------------------------------------------------- configuration helpers
    @property
    def fields(self):
        """{name: (sample shape, torch dtype)} of what a batch holds (before casting)."""
        return {f.name: (f.shape, f.dtype) for f in self._fields}

    def _conversions(self, dtype, normalize):
        names = [f.name for f in self._fields]
        cls = type(self).__name__
        def per_field(v, what):
            if v is None:
                return {}
            if isinstance(v, dict):
                bad = set(v) - set(names)
                if bad:
                    raise KeyError(f"{cls}: {what} names unknown fields {sorted(bad)}")
                return dict(v)
            if not self._single and len(names) > 1:
                raise ValueError(f"{cls}: with several fields, give {what} as a dict")
            return {names[0]: v}
        dts, norms = per_field(dtype, "dtype"), per_field(normalize, "normalize")
        conv = {}
        for f in self._fields:
            dt, nm = dts.get(f.name), norms.get(f.name)
            if dt is None and nm is None:
                continue
            if nm is not None:
                mean, std = nm
                mean = np.asarray(mean, dtype=np.float64).reshape(-1)
                std = np.asarray(std, dtype=np.float64).reshape(-1)
                if np.any(std == 0):
                    raise ValueError(f"{cls}: normalize std has a zero")
                c = max(mean.size, std.size)
                if c > 1 and (not f.shape or f.shape[0] != c):
                    raise ValueError(f"{cls}: normalize for {f.name!r} has {c} channels, "
                                     f"samples are {f.shape}")
                if dt is None:
                    dt = f.dtype if f.dtype.is_floating_point else torch.float32
                nm = (mean, 1.0 / std)
            conv[f.name] = (dt, nm)
        return conv

    def _staging_per_field(self, staging):
        """Check `staging` (one value or {field: value}); every field takes the engine's path."""
        names = [f.name for f in self._fields]
        cls = type(self).__name__
        spec = staging if isinstance(staging, dict) else {k: staging for k in names}
        bad = set(spec) - set(names)
        if bad:
            raise KeyError(f"{cls}: staging names unknown fields {sorted(bad)}")
        for f in self._fields:
            v = spec.get(f.name, "auto")
            if v == "pinned":
                # refused, not taken as a synonym: it chose another mechanism (host-path reads
                # into torch's pinned tensors, one torch copy per field), which no longer exists
                raise ValueError(
                    f"{cls}: staging='pinned' was removed: every field reaches the GPU through "
                    f"the engine's own pinned staging (staging='engine', also what 'auto' means); "
                    f"see docs/torch.md")
            if v not in ("auto", "engine"):
                raise ValueError(f"{cls}: staging must be 'auto' or 'engine', not {v!r}")

    def _dist(self):
        rank, world = self.rank, self.world_size
        if rank is None or world is None:
            d = torch.distributed
            if d.is_available() and d.is_initialized():
                rank = d.get_rank() if rank is None else rank
                world = d.get_world_size() if world is None else world
            else:
                rank = 0 if rank is None else rank
                world = 1 if world is None else world
        if not 0 <= rank < world:
            raise ValueError(f"{type(self).__name__}: rank {rank} outside world_size {world}")
        return int(rank), int(world)

    def _resolve_device(self, in_worker):
        dev = self.device
        if dev is None:
            dev = torch.device("cuda") if (not in_worker and torch.cuda.is_available()) else torch.device("cpu")
        if dev.type == "cuda":
            if in_worker:
                raise RuntimeError(
                    "ferry.torch.%s: device=%r inside a DataLoader worker process. CUDA "
                    "cannot be used in forked workers ('Cannot re-initialize CUDA in forked "
                    "subprocess'), and ferry already reads in native threads: use "
                    "DataLoader(ds, batch_size=None, num_workers=0), or device='cpu' to read on the "
                    "host path in workers." % (type(self).__name__, str(dev)))
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.type != "cpu":
            raise ValueError(f"{type(self).__name__}: device must be CUDA or CPU, not {dev}")
        return dev

    def _runtime(self, device, in_worker, num_workers):
        pid = os.getpid()
        with self._rt_lock:
            rt = self._rt
            if rt is not None and rt.pid == pid and rt.device == device:
                return rt
            if rt is not None and rt.pid == pid:
                self._drop_ahead()      # their jobs use rt's open files and its device
                rt.close()
            elif rt is not None:
                # inherited through fork: its engine threads do not exist here, so it must never
                # be destroyed in this process (that would wait for them)
                _FORKED.append(rt)
            if self._ctx_arg is not None and self._ctx_pid != pid:
                _FORKED.append(self._ctx_arg)
                self._ctx_arg = None
            if self._ctx_arg is not None:
                ctx = self._ctx_arg
            elif self.threads == 0 and not in_worker and pid == _IMPORT_PID and \
                    hasattr(_ferry, "default_context"):
                ctx = _ferry.default_context()      # one engine per process
            else:
                threads = self.threads
                if threads == 0 and in_worker:
                    threads = max(2, (os.cpu_count() or 4) // max(1, num_workers))
                ctx = _ferry.Context(threads=threads)
            if device.type == "cuda" and ctx.cuda_device_count() == 0:
                raise RuntimeError(f"ferry.torch: torch sees {device} but ferry cannot use CUDA: "
                                   f"{ctx.cuda_status or 'no CUDA device'}")
            self._rt = _Runtime(ctx, device)
            if device.type == "cuda" and not _AT_FORK and hasattr(os, "register_at_fork"):
                os.register_at_fork(before=_collect_before_fork)
                _AT_FORK.append(True)
            return self._rt

    def __getstate__(self):
        st = self.__dict__.copy()
        st["_rt"] = None
        st["_rt_lock"] = None
        st["_order_cache"] = None
        st["_ahead"] = None     # jobs of this process's engine, and the buffers they fill
        st["_ctx_arg"] = None   # contexts do not travel between processes
        # the epoch board travels as shared memory to spawned workers (torch's ForkingPickler
        # reduction) and as a private copy through plain pickle
        return st

    def __setstate__(self, st):
        self.__dict__.update(st)
        self._rt_lock = threading.Lock()

    def __del__(self):
        self._drop_ahead()          # no job may outlive its buffers
        rt = getattr(self, "_rt", None)
        if rt is not None and rt.pid == os.getpid():
            rt.close()

    # ---------------------------------------------------------------- order and length
    def _order(self, epoch):
        key = (self.num_samples, self.seed, epoch, self.shuffle, self.block_size)
        c = self._order_cache
        if c is None or c[0] != key:
            c = self._order_cache = (key, self._make_order(epoch))
        return c[1]

    def _make_order(self, epoch):
        return epoch_order(self.num_samples, self.seed, epoch, self.shuffle, self.block_size)

    def __len__(self):
        """Batches (samples when batch_size is None) this rank yields in a whole epoch."""
        rank, world = self._dist()
        return _Layout(self.num_samples, 0, world, rank, self.batch_size or 1, self.drop_last).count

    def set_epoch(self, epoch):
        """Select the epoch (its order). A different epoch starts at its beginning; the current
        epoch keeps its position (so set_epoch after load_state_dict resumes mid-epoch)."""
        epoch = int(epoch)
        self._sync_from_workers()
        if epoch != self._epoch or self._pass_over:   # a finished pass has no position left
            self._epoch, self._consumed, self._resume = epoch, 0, None
            self._pass_over = False
            if get_worker_info() is None:      # the board is the main process's to publish
                self._board.publish(self._epoch, self._consumed)

    @property
    def epoch(self):
        """The epoch of the latest pass (counting passes run by DataLoader workers)."""
        if get_worker_info() is None:
            lt = self._board.latest()
            if lt is not None:
                return lt[0]
        return self._epoch

    def _sync_from_workers(self):
        """In the main process, after DataLoader worker passes: adopt the epoch they reached
        (the next pass is the next epoch)."""
        if get_worker_info() is not None:
            return
        lt = self._board.latest()
        if lt is not None:
            self._epoch, self._consumed, self._resume = lt[0] + 1, 0, None
            self._pass_over = False
            self._board.publish(self._epoch, 0)

    # ---------------------------------------------------------------- state (torchdata Stateful)
    def state_dict(self):
        """The global position: {"epoch", "samples_consumed", "seed", ...} — identical on every
        rank, valid for any world size. Inside DataLoader workers (StatefulDataLoader) each
        worker's state also carries "worker", for an exact resume with the same layout;
        global_state() turns a StatefulDataLoader state into a global one.

        In the main process of a plain DataLoader with workers the dataset cannot see which
        batches the loader delivered: state_dict() then warns and reports the start of the
        workers' latest pass — never ahead of what was delivered (a worker that has produced
        its last batch may still have batches waiting in the loader's queues)."""
        epoch, consumed = self._epoch, int(self._consumed)
        if get_worker_info() is None and self._worker_progress is None:
            lt = self._board.latest()
            if lt is not None:
                epoch, consumed, _ = lt
                import warnings
                warnings.warn(
                    f"ferry.torch.{type(self).__name__}.state_dict(): this dataset is iterated by "
                    f"DataLoader worker processes, and the main process cannot see which batches "
                    f"the loader delivered; the state is the start of the workers' latest pass "
                    f"(epoch {epoch}, sample {consumed}), so a resume from it repeats what that "
                    f"pass delivered. "
                    f"For an exact resume use torchdata's StatefulDataLoader and "
                    f"ferry.torch.global_state(loader.state_dict()), or num_workers=0.",
                    InaccurateStateWarning, stacklevel=2)
        st = {
            "_tag": self._STATE_TAG, "version": _STATE_VERSION,
            "epoch": epoch, "samples_consumed": consumed,
            "seed": self.seed, "shuffle": self.shuffle, "block_size": self.block_size,
            "num_samples": self.num_samples, "batch_size": self.batch_size,
            "drop_last": self.drop_last,
        }
        if self._worker_progress is not None:
            st["worker"] = dict(self._worker_progress)
        return st

    def load_state_dict(self, state):
        cls = type(self).__name__
        if not isinstance(state, dict) or state.get("_tag") != self._STATE_TAG:
            raise ValueError(f"{cls}.load_state_dict: not a state saved by {cls}.state_dict()")
        if int(state["num_samples"]) != self.num_samples:
            raise ValueError(f"{cls}.load_state_dict: the state is for {state['num_samples']} "
                             f"samples, this dataset has {self.num_samples}")
        self.seed = int(state["seed"])
        self.shuffle = bool(state["shuffle"])
        self.block_size = state["block_size"]
        self._epoch = int(state["epoch"])
        self._consumed = int(state["samples_consumed"])
        self._resume = dict(state["worker"]) if state.get("worker") else None
        self._pass_over = False
        self._worker_progress = None
        self._order_cache = None
        if get_worker_info() is None:
            self._board.publish(self._epoch, self._consumed)

    # ---------------------------------------------------------------- iteration
    def __iter__(self):
        self._check_loader(auto_collation())
        return self._iterate()

    def _check_loader(self, found):
        """A DataLoader that batches our batches again (DataLoader(ds) has batch_size=1) would
        silently give (1, B, ...): refuse it. Per-sample mode (batch_size=None) is meant for it."""
        if found is None or not found[0] or self.batch_size is None:
            return
        from torch.utils.data._utils.collate import default_collate
        collate = found[1]
        if collate is None or collate is default_collate:
            raise TypeError(
                f"ferry.torch.{type(self).__name__} already yields batches of {self.batch_size}; "
                f"a DataLoader with automatic batching (DataLoader's default batch_size=1) would "
                f"stack them again into (1, {self.batch_size}, ...). Use "
                f"DataLoader(ds, batch_size=None), or batch_size=None on the dataset to let the "
                f"DataLoader batch single samples.")
        import warnings
        warnings.warn(f"ferry.torch.{type(self).__name__}: the DataLoader batches this dataset's "
                      f"batches (of {self.batch_size}) again with its collate_fn; pass "
                      f"batch_size=None to the DataLoader unless that is meant", stacklevel=3)

    def _start(self, in_worker, wid, nw, world, rank, batch):
        """-> (epoch, start position, units already taken by this worker or None when done)."""
        res, self._resume = self._resume, None
        tag = pass_tag(get_worker_info(), self._passes) if in_worker else 0
        self._passes += 1
        if res is not None:
            want = {"id": wid, "num_workers": nw, "world_size": world, "rank": rank, "batch": batch}
            got = {k: res.get(k) for k in want}
            if got != want:
                raise ValueError(
                    "%s: this state was saved by DataLoader worker %r and resumes exactly "
                    "only with the same layout %r (here %r). To resume with other ranks or workers, "
                    "load ferry.torch.global_state(loader.state_dict()) into the dataset with "
                    "ds.load_state_dict() before building the DataLoader."
                    % (type(self).__name__, res.get("id"), got, want))
            epoch = int(res["epoch"])
            self._epoch = epoch
            if in_worker:
                self._board.resumed(wid, nw, tag, epoch)
            return epoch, int(res["start"]), (None if res.get("ended") else int(res["taken"]))
        if in_worker:
            # the worker copy cannot see the main process: the board says which epoch this pass is
            epoch, start = self._board.join(wid, nw, tag)
            self._epoch = epoch
            return epoch, start, 0
        self._sync_from_workers()
        if self._pass_over:             # this rank's last pass delivered all it had: next epoch
            self._epoch, self._consumed, self._pass_over = self._epoch + 1, 0, False
        start = min(self._consumed, self.num_samples)   # a state saved after the last batch: n
        return self._epoch, start, 0

    def _iterate(self):
        ahead_on = _epoch_ahead()       # checked in workers too, where nothing is read ahead
        winfo = get_worker_info()
        in_worker = winfo is not None
        wid, nw = (winfo.id, winfo.num_workers) if in_worker else (0, 1)
        rank, world = self._dist()
        device = self._resolve_device(in_worker)
        rt = self._runtime(device, in_worker, nw)
        batch = self.batch_size or 1
        n = self.num_samples

        self._generation += 1
        gen = self._generation
        epoch, start, skip = self._start(in_worker, wid, nw, world, rank, batch)
        lay = _Layout(n, start, world, rank, batch, self.drop_last)
        mine = range(0) if skip is None else range(wid + skip * nw, lay.count, nw)
        last = mine[-1] if len(mine) else None
        taken = 0 if skip is None else skip
        if in_worker:
            self._worker_progress = {"id": wid, "num_workers": nw, "world_size": world, "rank": rank,
                                     "batch": batch, "start": start, "taken": taken, "epoch": epoch,
                                     "count": lay.count, "ended": False}
        order = self._order(epoch)
        per_sample = self.batch_size is None
        read_units = self.sample_group if per_sample else self._read_group(rt)
        group_units = _even_group(len(mine), read_units)
        group_bytes = group_units * batch * sum(int(getattr(f, "row_bytes", 0) or 0) for f in self._fields)
        depth = self._read_depth(rt, _groups_in_flight(self.prefetch, 1 if per_sample else group_units,
                                                       group_bytes, rt.staging_bytes))
        ids_for = self._ids_source(order, lay, mine, group_units)
        ahead_on = ahead_on and not in_worker
        # the groups the pass before submitted for this one, if it would submit the same
        pending = collections.deque(self._take_ahead(
            self._ahead_key(rt, epoch, start, skip, rank, world, group_units) if ahead_on else None,
            order, mine, group_units))
        unit_iter = iter(mine[sum(len(g.units) for g in pending):])
        read_ahead = ahead_on and self.prefetch > 0      # prefetch=0: nothing read ahead
        retiring = collections.deque()

        def submit_next():
            units = []
            for s in unit_iter:
                units.append(s)
                if len(units) == group_units:
                    break
            if not units:
                return False
            pending.append(self._submit(rt, order, lay, units,
                                        None if ids_for is None else ids_for(units)))
            return True

        def end_of_pass(position):
            # every unit of this rank's pass has been handed over: the pass is over now, whether
            # or not the consumer ever asks for the StopIteration (Lightning stops after len()
            # batches), and the next iter() is the next epoch. The state stays the global
            # position: when this rank's share of an uneven tail is empty (drop_last=False) the
            # other ranks still have one step of the epoch, so the epoch is complete only at the
            # position n (or, drop_last=True, after the last full step); until then the state is
            # `position`, where the epoch is once every rank has taken as many steps as this one.
            if in_worker:
                self._worker_progress["ended"] = True
                self._board.ended(wid)
            elif position >= n:
                self._epoch, self._consumed, self._pass_over = epoch + 1, 0, False
                self._board.publish(self._epoch, 0)
            else:
                self._epoch, self._consumed, self._pass_over = epoch, position, True
                self._board.publish(epoch + 1, 0)   # a worker pass after this one: next epoch

        def other_ranks_step():
            # the consumer asked past this rank's last unit: in lock step that is the step in
            # which the other ranks take the rest of the tail, which completes the epoch
            if not in_worker and self._pass_over and gen == self._generation:
                self._epoch, self._consumed, self._pass_over = epoch + 1, 0, False

        exhausted = False
        try:
            if last is None and gen == self._generation:
                end_of_pass(n if self.drop_last else start)
            while True:
                while not exhausted and len(pending) < depth:
                    exhausted = not submit_next()
                if exhausted and read_ahead and gen == self._generation:
                    self._read_ahead(rt, epoch + 1, rank, world, read_units, depth - len(pending))
                if not pending:
                    break
                g = pending.popleft()
                outs = self._handoff(rt, g, retiring)
                if pending and self._STAGE_AHEAD and rt.device.type == "cuda":
                    self._stage_ahead(rt, pending[0], retiring)
                self._retire(retiring, block=False)
                for s, out in zip(g.units, outs):
                    if gen == self._generation:
                        taken += 1
                        # the last batch of a drop_last epoch completes it (the tail is dropped)
                        self._consumed = n if (self.drop_last and s == lay.count - 1) \
                            else lay.consumed_after(s)
                        if in_worker:
                            self._worker_progress["taken"] = taken
                        else:
                            self._board.set_position(self._consumed)
                        if s == last:
                            end_of_pass(self._consumed)
                    yield out
            other_ranks_step()
        finally:
            self._abandon(rt, pending)
            pending.clear()
            self._retire(retiring, block=True, raise_errors=False)
            if read_ahead:
                self._start_planning(rt)    # the next pass's groups, while nothing is handed out

    def _abandon(self, rt, groups):
        """Wait for the groups' jobs and give back what they hold: buffers must outlive the
        engine's use of them. Their errors are nobody's: no batch of them is handed out."""
        for g in groups:
            try:
                if g.job is not None:
                    g.job.wait()
            except Exception:
                pass
            self._release(rt, g)

    def _ids_source(self, order, lay, mine, group_units):
        """The sample ids of a pass's units, computed ahead in chunks from an order evaluated on
        the fly (None: _submit slices the order, or maps positions itself)."""
        if hasattr(order, "take") and not self._ORDER_IN_PLAN:
            return _IdsAhead(order, lay, mine, max(_IdsAhead.CHUNK, group_units))
        return None

    # ---------------------------------------------------------------- the next pass's first reads
    def _ahead_key(self, rt, epoch, start, skip, rank, world, group_units):
        """Everything that decides the groups a pass submits first (the order is (num_samples,
        seed, epoch, shuffle, block_size); the layout (num_samples, start, world, rank, batch,
        drop_last)). rt compares by identity: another device or a new engine is another key."""
        return (rt, rt.device, epoch, start, skip, rank, world, self.batch_size, self.drop_last,
                self.num_samples, self.seed, self.shuffle, self.block_size, group_units)

    def _read_ahead(self, rt, epoch, rank, world, read_units, room):
        """Submit the first groups of the pass after this one (epoch `epoch` from its start, in
        the main process) until `room` of them are kept. A submit that raises ends it: those
        units are the next pass's to submit, and their error is raised there, as without it.
        read_units: the units a read may take; that pass evens them out over its own units."""
        lay = _Layout(self.num_samples, 0, world, rank, self.batch_size or 1, self.drop_last)
        group_units = _even_group(lay.count, read_units)
        key = self._ahead_key(rt, epoch, 0, 0, rank, world, group_units)
        a = self._ahead
        if a is None or a.key != key:
            self._drop_ahead()
            a = _Ahead()
            a.pid, a.rt, a.key, a.epoch, a.groups, a.stamps = os.getpid(), rt, key, epoch, [], []
            a.lay = lay
            units = range(a.lay.count)
            a.units = iter(units)
            a.ids_for = self._ids_source(self._order(epoch), a.lay, units, group_units)
            self._ahead = a
        # the order from the cache, and into it: XarrayDataset reads the epoch of its random
        # patches off the cached order (_epoch_of_order)
        order = self._order(epoch)
        while len(a.groups) < room:
            units = list(itertools.islice(a.units, group_units))
            if not units:
                return
            try:
                stamp = self._ahead_stamp(order, a.lay, units)      # before the files are read
                g = self._submit(rt, order, a.lay, units, None if a.ids_for is None else a.ids_for(units))
            except Exception:
                a.units = iter(())
                return
            a.groups.append(g)
            a.stamps.append(stamp)

    def _ahead_stamp(self, order, lay, units):
        """What must not change between the submit of a group read ahead and the pass that takes
        it, for the group to hold what that pass would read (None: nothing; rows and token
        windows are read through files opened once per process, which a replaced file does not
        change, and XarrayDataset's hand-off checks its files itself)."""
        return None

    def _take_ahead(self, key, order, mine, group_units):
        """The kept groups (_Ahead) as this pass's first pending groups when they are what it
        would submit first (key None: use none); else they are waited for and dropped."""
        a = self._ahead
        if a is not None and key is not None and self._ahead_fits(a, key, order, mine, group_units):
            self._ahead = None
            return a.groups
        self._drop_ahead()
        return []

    def _ahead_fits(self, a, key, order, mine, group_units):
        """Whether the kept groups `a` are the first groups this pass (key, mine) would submit:
        made in this process for the same key, the same units, their files unchanged."""
        if a.pid != os.getpid() or a.key != key:
            return False
        if any(g.units != list(mine[k * group_units:(k + 1) * group_units]) for k, g in enumerate(a.groups)):
            return False
        try:
            return all(st is None or self._ahead_stamp(order, a.lay, g.units) == st
                       for g, st in zip(a.groups, a.stamps))
        except OSError:         # a file gone: the pass submits that group itself (and says so)
            return False

    def _drop_ahead(self):
        """Wait for the kept groups and drop them (a mismatch, another runtime, the dataset's end)."""
        a, self._ahead = getattr(self, "_ahead", None), None
        if a is None:
            return
        if a.pid != os.getpid():
            # inherited through fork: jobs of the parent's engine, whose threads do not exist
            # here; never waited for or freed in this process (as _FORKED runtimes)
            _FORKED.append(a)
            return
        self._abandon(a.rt, a.groups)

    def _start_planning(self, rt):
        """Start planning the groups submitted whose planning waits for a hand-off (XarrayDataset
        plans on a thread, at the consumer's next wait). Here _submit plans every group itself."""

    # ---------------------------------------------------------------- reading
    def _read_group(self, rt):
        """Batches one plan reads on rt (XarrayDataset picks it from the data when not given)."""
        return self.batch_group

    def _read_depth(self, rt, depth):
        """Groups in flight on rt, the one handed out included (XarrayDataset sets its engine-sized
        groups)."""
        return depth

    def _alloc(self, rt, shape, dtype):
        if rt.device.type == "cuda":
            with torch.cuda.stream(rt.alloc_stream):
                return torch.empty(shape, dtype=dtype, device=rt.device)
        if get_worker_info() is not None:
            return torch.empty(shape, dtype=dtype).share_memory_()   # no copy when sent to the loader
        if self.pin_memory and torch.cuda.is_available():
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        return torch.empty(shape, dtype=dtype)

    def _submit(self, rt, order, lay, units, ids=None):
        ranges = [lay.unit(s) for s in units]
        if ids is None:
            ids = order[ranges[0][0]:ranges[0][1]] if len(ranges) == 1 else \
                np.concatenate([order[lo:hi] for lo, hi in ranges])
        g = _Group()
        g.units, g.sizes, g.handles, g.job, g.path = units, [hi - lo for lo, hi in ranges], [], None, None
        g.extra = []                  # jobs besides the plan's (per-sample .npy batches)
        plan = _ferry.Plan()
        try:
            g.bufs = [f.read(self, rt, plan, ids, g) for f in self._fields]
        except BaseException:
            for j in g.extra:
                _wait_quietly(j)
            raise
        jobs = ([rt.ctx.submit(plan, reread=True)] if len(plan) else []) + g.extra   # epochs: FERRY_REREAD
        g.job = None if not jobs else jobs[0] if len(jobs) == 1 else _Jobs(jobs)
        return g

    def _release(self, rt, g):
        for e in g.handles:
            e[1] -= 1
        g.handles = []

    def _retire(self, retiring, block, raise_errors=True):
        """Wait for and release handed-out groups, oldest first: all of them (block), else until
        at most prefetch + 2 remain and the oldest's job is still running (a consumer that queues
        its steps without waiting for them runs that far ahead of the engine; waiting sooner
        made the GPU idle more, H200 2026-12-02, BENCHMARKS.md)."""
        rt = self._rt
        limit = self.prefetch + 2
        while retiring:
            g = retiring[0]
            if not block and len(retiring) <= limit and not g.job.done():
                break
            retiring.popleft()
            try:
                g.job.wait()
            except Exception:
                if raise_errors:
                    if rt is not None:
                        self._release(rt, g)
                    raise
            if rt is not None:
                self._release(rt, g)

    def _handoff(self, rt, g, retiring):
        """Make group g's data usable by the consumer; returns one output per unit."""
        staged = getattr(g, "staged", None)
        if staged is not None:                  # its copies and casts were issued ahead
            g.staged = None
            ready, outs = staged
            consumer = torch.cuda.current_stream(rt.device)
            consumer.wait_event(ready)
            self.last_path = g.path
            self._record_outputs(outs, consumer)
            return outs
        job = g.job
        if job is not None:
            g.path = job.path
            self.last_path = g.path
        if rt.device.type != "cuda":
            if job is not None:
                job.wait()
            self._release(rt, g)
            return self._finish(g)
        consumer = torch.cuda.current_stream(rt.device)
        side = self._needs_side_stream(g)
        stream = rt.work_stream if side else consumer
        outs = self._issue(rt, g, retiring, stream, side)
        if side:
            consumer.wait_stream(stream)
        self._record_outputs(outs, consumer)
        return outs

    def _record_outputs(self, outs, stream):
        """Tell the caching allocator that `stream` (the consumer's) uses the outputs."""
        for o in outs:
            _record(o, stream)

    def _needs_side_stream(self, g):
        return bool(self._convert) or self.transform is not None

    def _stage_ahead(self, rt, g, retiring):
        """Issue the next group's casts and transform now, on ferry's stream, when its job is
        already done (no host wait): the consumer then finds them done when it gets there,
        instead of waiting for work issued just before its step. Groups that need none of
        that are left to _handoff."""
        if getattr(g, "staged", None) is not None or not self._needs_side_stream(g):
            return
        job = g.job
        if job is not None:
            if not job.done():
                return
            try:
                job.wait()          # done: at once. A failed read is raised by _handoff, after
            except Exception:       # the batches before it have been handed out
                return
            g.path = job.path
        stream = rt.work_stream
        outs = self._issue(rt, g, retiring, stream, True)
        ready = torch.cuda.Event()
        ready.record(stream)
        g.staged = (ready, outs)

    def _issue(self, rt, g, retiring, stream, side):
        """Queue g's device work on `stream` (the consumer's, or ferry's work stream): wait for
        the engine's copies, cast, split, transform."""
        job = g.job
        if job is not None:
            # A finished job's copies have passed on the device (the engine completes device
            # tasks by their events): nothing to wait for. Only an unfinished one is waited on
            # by the stream, and that wait is wider than the job: stream_wait records an event
            # on every worker's stream now, behind copies of later batches queued there since —
            # with the engine ahead, the step waited for most of the newest batch's copy.
            done = job.done()
            if not done:
                job.stream_wait(stream.cuda_stream)   # the engine's device copies, no host wait
            if done:
                job.wait()                    # surfaces a read error now rather than later
                self._release(rt, g)
            else:
                retiring.append(g)            # buffers stay referenced until the job is done
        else:
            self._release(rt, g)
        if not side:
            # a collate (samples="files", ragged) reads the per-file buffers on the consumer's
            # stream: recorded there, or a later group's read may be handed their blocks while
            # a consumer lagging behind a training step has not stacked them yet (the outputs,
            # recorded by _handoff, are new tensors, not views of them)
            for b in g.bufs:
                if isinstance(b, list):
                    _record(b, stream)
            return self._finish(g)
        with torch.cuda.stream(stream):
            for b in g.bufs:
                _record(b, stream)
            return list(self._finish(g))

    def _finish(self, g):
        """Cast/normalise the group's buffers, split into units, apply the transform."""
        values = []
        for f, b in zip(self._fields, g.bufs):
            c = self._convert.get(f.name)
            if c is not None:
                b = [_apply_convert(t, c, f) for t in b] if isinstance(b, list) else _apply_convert(b, c, f)
            values.append(b)
        outs = []
        per_sample = self.batch_size is None
        lo = 0
        for i, size in enumerate(g.sizes):
            parts = {}
            for f, v in zip(self._fields, values):
                if per_sample:
                    parts[f.name] = v[i]
                elif len(g.sizes) > 1:            # a group of batches: batch i is a slice
                    parts[f.name] = f.collate(v[lo:lo + size]) if isinstance(v, list) else v[lo:lo + size]
                elif isinstance(v, list):
                    parts[f.name] = f.collate(v)
                else:
                    parts[f.name] = v
            lo += size
            o = self._output(parts)
            if self.transform is not None:
                o = self.transform(o)
            outs.append(o)
        return outs

    def _output(self, parts):
        """One batch (or sample) from {field: value}: a tensor for a single source, else a dict."""
        return next(iter(parts.values())) if self._single else parts

    # ---------------------------------------------------------------- introspection
    def stats(self):
        """The engine's statistics for this process (ferry.Context.stats()), or {}."""
        rt = self._rt
        return rt.ctx.stats() if rt is not None and rt.pid == os.getpid() else {}

    def __repr__(self):
        return (f"{type(self).__name__}({self.num_samples} samples, fields={self._fields}, "
                f"batch_size={self.batch_size}, shuffle={self.shuffle}, epoch={self._epoch}, "
                f"consumed={self._consumed})")


class _IdsAhead:
    """Sample ids of the coming units, computed CHUNK units at a time from an order evaluated
    on the fly (FeistelOrder): numpy's per-call cost then falls on 16 batches, not one
    (dev box: 256 ids 220 us in one call, 4096 ids 610 us)."""
    CHUNK = 16

    def __init__(self, order, lay, mine, chunk=CHUNK):
        self.order, self.lay, self.mine, self.cache = order, lay, mine, {}
        self.chunk = chunk

    def __call__(self, units):
        parts = []
        for s in units:
            if s not in self.cache:
                self._fill(s)
            parts.append(self.cache.pop(s))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _fill(self, s):
        k = self.mine.index(s)
        nxt = self.mine[k:k + self.chunk]
        ranges = [self.lay.unit(u) for u in nxt]
        ids = self.order.take(np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in ranges]))
        sizes = np.cumsum([hi - lo for lo, hi in ranges])[:-1]
        self.cache.clear()
        self.cache.update(zip(nxt, np.split(ids, sizes)))


class InaccurateStateWarning(UserWarning):
    """state_dict() was asked where the dataset cannot know the exact position."""


class ArrayDataset(_BatchStream):
    """Batches of samples of arrays in files, read by ferry's engine into torch tensors on `device`.

    ArrayDataset(source=None, *, fields=None, samples="rows", batch_size=256, shuffle=False,
                 seed=0, drop_last=False, device=None, rank=None, world_size=None, prefetch=4,
                 block_size=None, dtype=None, normalize=None, transform=None, collate=None,
                 pin_memory=False, threads=0, ctx=None, sample_group=64, staging="auto")

    source / fields
        `source`: one field, batches are tensors. `fields={"x": ..., "y": ...}`: batches are dicts.
        Each field is a glob ("train/x_*.npy", sorted in natural order: x_2 before x_10), a path,
        a list of paths, or a tuple (paths_or_glob, name) naming the array inside each file (the
        tensor of a safetensors shard, the array of a Zarr group; "grp/arr" for nested Zarr).
        A file holding one array needs no name. All fields must have the same number of samples.
    samples
        "rows" (default): the samples are the rows (first axis) of the arrays, concatenated over
        a field's files. "files": every file is one sample (one .npy per image, DALI's and
        MONAI's layout); a field may also be a directory (its files, natural order). Fields are
        parallel lists: sample i is file i of every field. Scalar files give (B,) batches.
    collate
        samples="files" only: None (default) — every file of a field must have the shape and
        dtype of its first file (else an error naming the file); a callable, or {field:
        callable}, takes the batch's list of sample tensors (of any shapes) and returns the
        field's value: `list` keeps the list, ferry.torch.pad_collate() pads to the largest.
    batch_size
        Samples per batch (per rank), or None to yield single samples (then wrap it in a
        DataLoader with a batch_size to let torch batch them).
    shuffle, seed, block_size
        The epoch order: see epoch_order(). set_epoch(n) selects the epoch.
    device
        "cuda", "cuda:1", torch.device, or "cpu"; None: CUDA when available (host otherwise).
        Inside DataLoader worker processes only "cpu" works (CUDA cannot run in forked workers).
    rank, world_size
        Default: torch.distributed's when it is initialised, else 0 and 1.
    prefetch
        Batches in flight ahead of the one being consumed.
    dtype, normalize
        Casting on the device: dtype=torch.float16 (or {"x": torch.float16}); normalize=(mean,
        std) or {"x": (mean, std)}, scalars or per-channel sequences applied along the first axis
        of a sample (C of CHW): out = (x - mean) / std, in `dtype` (float32 if not given).
    transform
        A callable batch -> batch run after casting; on CUDA it runs on ferry's stream and the
        consumer's current stream waits for it.
    pin_memory
        Host batches in page-locked memory (only when CUDA is available).
    threads, ctx
        Engine threads for a context ferry.torch creates (0: engine default), or a
        ferry._ferry.Context to use in the main process.
    sample_group
        Per-sample mode: samples read per plan.
    staging
        CUDA only; one value or {field: value}: "auto" (default) or "engine", the same: the
        engine moves every field to the GPU itself (cuFile, or its pinned staging buffers,
        records packed back to back, one host-to-device copy per buffer of adjacent rows).
        "pinned" (host-path batches copied by torch) was removed: a ValueError says so.
    """

    _STAGE_AHEAD = True

    def __init__(self, source=None, *, fields=None, samples="rows", batch_size=256, shuffle=False,
                 seed=0, drop_last=False, device=None, rank=None, world_size=None, prefetch=4,
                 block_size=None, dtype=None, normalize=None, transform=None, collate=None,
                 pin_memory=False, threads=0, ctx=None, sample_group=64, staging="auto"):
        super().__init__()
        if (source is None) == (fields is None):
            raise TypeError("ArrayDataset: give exactly one of `source` or `fields`")
        if samples not in ("rows", "files"):
            raise ValueError(f"ArrayDataset: samples must be 'rows' or 'files', not {samples!r}")
        if collate is not None and samples != "files":
            raise ValueError("ArrayDataset: collate= applies to samples='files' (rows of one "
                             "array all have the same shape)")
        self.block_size = None if block_size is None else int(block_size)
        self._init_stream(batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                          device=device, rank=rank, world_size=world_size, prefetch=prefetch,
                          transform=transform, pin_memory=pin_memory, threads=threads, ctx=ctx,
                          sample_group=sample_group)
        self._single = fields is None
        specs = {"data": source} if self._single else dict(fields)
        if not specs:
            raise ValueError("ArrayDataset: fields is empty")
        self.samples = samples
        self.staging = staging
        collates = _per_field_option(collate, list(specs), self._single, "collate")

        meta_ctx = ctx if ctx is not None else _ferry.Context(threads=1)
        try:
            if samples == "rows":
                self._fields = [_load_field(meta_ctx, k, v) for k, v in specs.items()]
            else:
                self._fields = [_load_file_field(meta_ctx, k, v, collates.get(k))
                                for k, v in specs.items()]
        finally:
            if ctx is None:
                meta_ctx.close()
        n = {f.name: f.rows for f in self._fields}
        if len(set(n.values())) != 1:
            what = "files" if samples == "files" else "rows"
            raise ValueError(f"ArrayDataset: fields have different numbers of {what}: {n}")
        self.num_samples = self._fields[0].rows
        self._convert = self._conversions(dtype, normalize)
        self._staging_per_field(staging)   # "auto" or "engine": one path either way

    def _ahead_stamp(self, order, lay, units):
        """samples="files": every file of the group's samples. Their headers are read when the
        group is submitted (and replaced files opened anew: _plan_sample_files); a file replaced
        between a group read ahead and the next pass would have been read anew by that pass."""
        if self.samples != "files":
            return None
        ids = np.concatenate([np.asarray(order[lo:hi]) for lo, hi in (lay.unit(s) for s in units)])
        return tuple(_file_sig(f.paths[i]) for f in self._fields for i in ids.tolist())


def _per_field_option(v, names, single, what):
    if v is None:
        return {}
    if isinstance(v, dict):
        bad = set(v) - set(names)
        if bad:
            raise KeyError(f"ArrayDataset: {what} names unknown fields {sorted(bad)}")
        return dict(v)
    return {k: v for k in names}


def pad_collate(value=0):
    """A collate= for ragged per-sample files: pads every sample at the end of each axis to the
    largest shape in the batch (with `value`) and stacks them into one tensor."""
    def collate(samples):
        if not samples:
            raise ValueError("pad_collate: an empty batch")
        nd = {t.dim() for t in samples}
        if len(nd) != 1:
            raise ValueError(f"pad_collate: samples have different numbers of axes {sorted(nd)}")
        shape = [max(t.shape[i] for t in samples) for i in range(samples[0].dim())]
        out = samples[0].new_full([len(samples)] + shape, value)
        for i, t in enumerate(samples):
            out[(i,) + tuple(slice(0, d) for d in t.shape)] = t
        return out
    return collate


# --------------------------------------------------------------------------------------------
# Token windows of flat token files
# --------------------------------------------------------------------------------------------
class TokenDataset(_BatchStream):
    """(x, y) batches of token windows from flat token files, for language-model training.

    TokenDataset(files, seq_len, batch_size, dtype="uint16", shuffle=True, seed=0,
                 drop_last=True, device=None, rank=None, world_size=None, prefetch=4,
                 out_dtype=torch.int64, threads=0, ctx=None, staging="auto",
                 batches_per_read=None)

    files
        One or many token files: raw little-endian tokens (nanoGPT's train.bin: `dtype` says
        uint16 or uint32) or 1-D .npy arrays (their own dtype, which must match `dtype`). A
        glob, a path or a list.
    Samples
        Window i of a file is tokens [i*seq_len, i*seq_len + seq_len + 1) — seq_len + 1 tokens,
        consecutive windows sharing one token, never crossing a file boundary; a file of T
        tokens has (T - 1) // seq_len windows. A batch is x = window[:, :-1], y = window[:, 1:]
        (both (batch_size, seq_len), contiguous, `out_dtype` — int64 for nn.Embedding and
        cross_entropy — on `device`). shuffle=True visits the windows of an epoch in a random
        order (every window once per epoch); shuffle=False in file order: strided,
        non-overlapping windows for evaluation.
    Order, sharding, epochs and resume are those of ArrayDataset (docs/torch.md), except that the
    epoch order is computed on the fly (a Feistel permutation, O(1) memory per rank and worker),
    and drop_last defaults to True (equal batches on every rank).
    batches_per_read
        Batches read by one engine plan (planned in one C call), moved to the device by one
        copy and cast by one kernel for x and y together (None: as many as hold about 32 MiB
        of tokens, at most 64; a pass evens its reads out to one size, at most this). Each
        batch is then a slice of its read's tensors (on CUDA):
        holding one batch keeps its read's memory.
        Resume stays exact per batch; `prefetch` counts batches, rounded up to whole reads.
    """
    _STATE_TAG = "ferry.torch.TokenDataset"
    _STAGE_AHEAD = True

    def __init__(self, files, seq_len, batch_size, dtype="uint16", *, shuffle=True, seed=0,
                 drop_last=True, device=None, rank=None, world_size=None, prefetch=4,
                 out_dtype=torch.int64, threads=0, ctx=None, staging="auto",
                 batches_per_read=None):
        super().__init__()
        if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
            raise ValueError(f"TokenDataset: seq_len must be a positive int, not {seq_len!r}")
        if batch_size is None:
            raise ValueError("TokenDataset: batch_size is required")
        self._init_stream(batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                          device=device, rank=rank, world_size=world_size, prefetch=prefetch,
                          transform=None, pin_memory=False, threads=threads, ctx=ctx,
                          sample_group=1)
        self._single = True
        self.seq_len = int(seq_len)
        self.out_dtype = out_dtype
        meta_ctx = ctx if ctx is not None else _ferry.Context(threads=1)
        try:
            self._fields = [_load_token_field(meta_ctx, files, self.seq_len, dtype)]
        finally:
            if ctx is None:
                meta_ctx.close()
        self.num_samples = self._fields[0].rows
        if self.num_samples == 0:
            raise ValueError(f"TokenDataset: no window of {self.seq_len + 1} tokens in {files!r}")
        self.staging = staging
        self._staging_per_field(staging)   # "auto" or "engine": one path either way
        if batches_per_read is None:
            # the loader's per-read work (ids, plan, submit, hand-off) was 364 us on the H200 at
            # one read per 2 MiB batch; 16 such batches per read make it ~25 us per batch
            per_batch = self.batch_size * self._fields[0].row_bytes
            batches_per_read = max(1, min(64, (32 << 20) // max(1, per_batch)))
        elif not isinstance(batches_per_read, int) or isinstance(batches_per_read, bool) or \
                batches_per_read < 1:
            raise ValueError(f"TokenDataset: batches_per_read must be a positive int or None, "
                             f"not {batches_per_read!r}")
        self.batch_group = int(batches_per_read)

    def _make_order(self, epoch):
        return FeistelOrder(self.num_samples, self.seed, epoch, self.shuffle)

    _ORDER_IN_PLAN = _plan_windows is not None

    def _submit(self, rt, order, lay, units, ids=None):
        """A group's plan in one C call (plan_windows: no id, offset or destination array per
        window in Python); the ids path (_BatchStream._submit) for seeds beyond int64."""
        if ids is not None or not self._ORDER_IN_PLAN or not (_I64_MIN <= order.seed <= _I64_MAX and
                                                             _I64_MIN <= order.epoch <= _I64_MAX):
            if ids is None:
                ranges = [lay.unit(s) for s in units]
                ids = np.concatenate([order[lo:hi] for lo, hi in ranges])
            return super()._submit(rt, order, lay, units, ids)
        ranges = [lay.unit(s) for s in units]
        g = _Group()
        g.units, g.sizes, g.handles, g.job, g.path = units, [hi - lo for lo, hi in ranges], [], None, None
        g.extra = []
        f = self._fields[0]
        buf = self._alloc(rt, (sum(g.sizes),) + f.shape, f.dtype)    # on this thread: torch's streams
        g.bufs = [buf]

        def plan_and_submit():
            # plan_windows and submit release the GIL for their C work (H200, 2026-12-01: the
            # loader thread was busy 90 us of every 91 us per batch, planning and submitting
            # 4,096 windows per group among it). No reference to the dataset here: its last
            # reference must not be dropped on this thread (its __del__ shuts this thread down)
            plan = _ferry.Plan()
            f.read_group(None, rt, plan, order, ranges, g, buf)
            return rt.ctx.submit(plan, reread=True) if len(plan) else None   # epochs: FERRY_REREAD
        g.job = _PlannedJob(rt.planner().submit(plan_and_submit))
        return g

    def _record_outputs(self, outs, stream):
        # every batch of a group is a view of the group's x and y (_finish): recording one view
        # of each records their blocks (the allocator tracks storage, not views), not 2 calls
        # a batch
        for t in outs[0] if outs else ():
            if t.is_cuda:
                t.record_stream(stream)

    @property
    def num_tokens(self):
        return int(self._fields[0].tokens.sum())

    def _finish(self, g):
        """(x, y) per batch of the read group g. On CUDA x and y of the whole group are cast
        at once (one kernel per read, x and y together: _shift) and batch i is rows [lo, lo + B) of
        them: contiguous views. On the host each batch is cast on its own (the cast is
        memory-bound either way, and a group's int64 copy would be 8x its tokens at once): a
        generator, which _iterate consumes batch by batch."""
        w = g.bufs[0]
        outs, lo = [], 0
        if w.is_cuda:
            # the casts read w on this stream (the consumer's, or ferry's work stream) after
            # the group is dropped: recorded, its block is not handed to the next group's read
            # (the engine's writes are ordered after no torch stream) until they have run.
            # Unrecorded, a consumer queued behind a training step cast the group read after it
            w.record_stream(torch.cuda.current_stream(w.device))
            x, y = self._shift(w)
            for size in g.sizes:
                outs.append((x[lo:lo + size], y[lo:lo + size]))
                lo += size
            return outs
        return self._host_batches(w, g.sizes, self._rt)

    def _host_batches(self, w, sizes, rt):
        # lazily, one batch as it is asked for: casting a whole read at once held 16 int64
        # batches (268 MB) and page-faulted them all afresh (dev box: 4.3 ms a batch, not 1.6)
        lo = 0
        for k, size in enumerate(sizes):
            out = self._shift(w[lo:lo + size])
            lo += size
            if k == len(sizes) - 1:   # every batch of it is cast (the consumer asks for no more)
                free = _host_reads(rt)
                if len(free) < self._HOST_READS_KEPT:
                    free.append(w)
                w = None
            yield out

    _HOST_READS_KEPT = 4

    def _alloc(self, rt, shape, dtype):
        """A read group's buffer. On the host only the casts read it (every batch handed out is
        a copy: _shift), so it is neither shared (in a DataLoader worker) nor pinned, and it is
        used again once its batches are cast: a fresh 32 MiB buffer per group page-faulted
        all of it under the engine's preads (dev box, 16 batches of 256 x 8 KiB a read, uint16
        out: 913 -> 2,265 batches/s, process CPU 1,814 -> 667 us a batch; BENCHMARKS.md)."""
        if rt.device.type == "cuda":
            return super()._alloc(rt, shape, dtype)
        free = _host_reads(rt)
        for i, t in enumerate(free):
            if t.shape == shape and t.dtype == dtype:
                return free.pop(i)
        return torch.empty(shape, dtype=dtype)

    def _shift(self, w):
        """(x, y) of windows w (rows of seq_len + 1 tokens), cast to out_dtype in ONE pass: a
        (2, rows, seq_len) view of w whose [0] is w[:, :-1] and [1] is w[:, 1:] (the same
        memory, y one token on), copied into one contiguous buffer, so x and y are its two
        contiguous halves. One kernel per read group on CUDA, not one per output."""
        dt = self.out_dtype or w.dtype
        rows, width = w.shape
        if not w.is_cuda and dt in _NUMPY_CASTS:
            # torch's CPU casts and copies of uint16/uint32 are slow (dev box, 256 x 4096
            # tokens: 61 ms to int64, 5 ms a uint16 copy; numpy's astype 7 ms / 0.6 ms)
            n = w.numpy()
            pair = np.lib.stride_tricks.as_strided(n, (2, rows, width - 1),
                                                   (n.strides[1], n.strides[0], n.strides[1]), writeable=False)
            out = torch.from_numpy(pair.astype(_NUMPY_CASTS[dt], order="C"))
        else:
            out = torch.empty((2, rows, width - 1), dtype=dt, device=w.device)
            out.copy_(w.as_strided((2, rows, width - 1), (w.stride(1), w.stride(0), w.stride(1))))
        return out[0], out[1]


def _host_reads(rt):
    """rt's read-group buffers free for TokenDataset's next reads on the host (consumer's thread)."""
    free = rt.__dict__.get("_token_reads")
    return free if free is not None else rt.__dict__.setdefault("_token_reads", [])


_NUMPY_CASTS = {getattr(torch, k): np.dtype(k) for k in
                ("int64", "int32", "int16", "uint16", "uint32", "uint64", "float32", "float64")
                if hasattr(torch, k)}


_norm_cache = {}


def _apply_convert(t, conv, f):
    dt, nm = conv
    if nm is None:
        return t if t.dtype == dt else t.to(dt)
    mean, inv_std = nm
    # per stream: the vectors are allocated on the stream that reads them, so dropping them
    # (the clear below) cannot hand their blocks to another stream while a lagging kernel of
    # this one still reads them (one cache is shared by every dataset's work stream)
    stream = torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None
    key = (mean.tobytes(), inv_std.tobytes(), dt, t.device, t.dim(), stream)
    c = _norm_cache.get(key)
    if c is None:
        shape = [1] * t.dim()
        if max(mean.size, inv_std.size) > 1:
            shape[1] = -1
        m = torch.tensor(mean, dtype=torch.float32).reshape(shape).to(device=t.device, dtype=dt)
        s = torch.tensor(inv_std, dtype=torch.float32).reshape(shape).to(device=t.device, dtype=dt)
        if len(_norm_cache) > 64:
            _norm_cache.clear()
        c = _norm_cache[key] = (m, s)
    return t.to(dt).sub_(c[0]).mul_(c[1])   # in place when t is already dt: t is ferry's own buffer


def _record(o, stream):
    if isinstance(o, torch.Tensor):
        if o.is_cuda:
            o.record_stream(stream)
    elif isinstance(o, dict):
        for v in o.values():
            _record(v, stream)
    elif isinstance(o, (list, tuple)):
        for v in o:
            _record(v, stream)


# --------------------------------------------------------------------------------------------
# StatefulDataLoader states -> one global state
# --------------------------------------------------------------------------------------------
def _find_states(obj, out):
    if isinstance(obj, dict):
        if str(obj.get("_tag", "")).startswith("ferry.torch."):
            out.append(obj)
            return
        for v in obj.values():
            _find_states(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _find_states(v, out)


def global_state(loader_state):
    """A global ArrayDataset state from a StatefulDataLoader.state_dict() (any number of
    workers): load it with ArrayDataset.load_state_dict() to resume with any number of ranks or
    workers. With several ranks, any one rank's loader state will do."""
    states = []
    _find_states(loader_state, states)
    if not states:
        raise ValueError("global_state: no ArrayDataset state in this state dict")
    workers = [s for s in states if s.get("worker")]
    if not workers:
        return max(states, key=lambda s: (s["epoch"], s["samples_consumed"]))
    # the DataLoader hands batches over in order, so the furthest worker marks the global position
    epoch = max(s["worker"]["epoch"] for s in workers)
    cur = [s for s in workers if s["worker"]["epoch"] == epoch]
    base = dict(cur[0])
    base.pop("worker", None)
    n = int(base["num_samples"])
    w = cur[0]["worker"]
    count = w.get("count", n)           # this rank's units in the pass
    if len(cur) == w["num_workers"] and all(s["worker"]["ended"] for s in cur):
        steps = count                   # every unit of this rank's pass was delivered
    else:
        steps = 0
        for s in cur:
            ws = s["worker"]
            if ws["taken"] > 0:
                steps = max(steps, ws["id"] + (ws["taken"] - 1) * ws["num_workers"] + 1)
    consumed = min(n, w["start"] + steps * w["world_size"] * w["batch"])
    # the epoch is complete at n, or after the last full step when the tail is dropped; a rank
    # whose share of an uneven tail is empty has delivered all it has one step earlier, while
    # the other ranks still take the tail: its position is where every rank has taken `steps`
    if consumed >= n or (base.get("drop_last") and steps >= count):
        base.update(epoch=epoch + 1, samples_consumed=0)
    else:
        base.update(epoch=epoch, samples_consumed=consumed)
    return base

