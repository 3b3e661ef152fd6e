"""ferry.torch.XarrayDataset — shuffled training batches of xarray data, read by ferry's engine.

A sample is a position along one dimension of a set of gridded variables (``time``), with
optional history (``input_steps``), forecast targets (``target_steps`` at ``lead``) and spatial
patches. A batch is ONE ferry plan over every variable and file it touches; time steps shared by
several samples of a batch are read (and decoded) once. CF decoding (fill values → NaN,
scale/offset, ``_Unsigned``) and normalisation run on the batch's device.

Channel order (documented, fixed): for each step (inputs first, oldest first), for each variable
in the order given, the variable's non-spatial, non-sample dims flattened in C order (levels)::

    x[:, s*C + c]      s = input step 0..input_steps-1, c over (var0 levels..., var1 levels..., ...)

Order, sharding, epochs, resume and prefetch are ArrayDataset's (ferry.torch): the same
permutation of sample ids from (seed, epoch), the same rank/worker split, the same state_dict.

What is read: the files behind the dataset, reopened by path in each process (with a fresh
engine context there), so the dataset pickles and works in DataLoader workers. The xarray
Dataset given is used for discovery only: which files, which time steps of each file, and which
index ranges of the other dimensions (``ds.sel(level=[500, 850])`` reads only those levels).
"""
from __future__ import annotations

import collections
import concurrent.futures
import json
import math
import os
import threading

import numpy as np
import torch

from . import _ferry
from ._torch_order import _mix64
from .torch import _BatchStream, _Group, _expand, _wait_quietly

__all__ = ["XarrayDataset"]

_M64 = (1 << 64) - 1


class _FileSeg:
    """Steps [lo, hi) of one file are global steps [g0, g0 + hi - lo) of the sample dim."""
    __slots__ = ("path", "group", "lo", "hi", "g0")

    def __init__(self, path, group, lo, hi, g0):
        self.path, self.group, self.lo, self.hi, self.g0 = path, group, lo, hi, g0

    def __repr__(self):
        return f"{os.path.basename(self.path)}[{self.lo}:{self.hi}]@{self.g0}"


class _VarInfo:
    """One variable as the dataset reads it."""
    __slots__ = ("name", "dims", "sel", "post", "levels", "spatial", "dtype", "cf")

    def __init__(self, name, dims, sel, post, levels, spatial, dtype, cf):
        self.name = name
        self.dims = dims            # stored dims, sample dim first
        self.sel = sel              # per non-sample dim: slice read from the file
        self.post = post            # per non-sample dim: None or index array applied after the read
        self.levels = levels        # shape of the channel dims (after selection)
        self.spatial = spatial      # (H, W) after selection
        self.dtype = dtype          # stored dtype (native byte order)
        self.cf = cf                # CF decoding parameters (see _cf_params)

    @property
    def channels(self):
        return int(np.prod(self.levels, dtype=np.int64)) if self.levels else 1


_MAX_AUTO_GROUP = 64     # batches a read that _read_group picks at most


def _unwrap_backend(data):
    """The FerryBackendArray under xarray's lazy wrappers, and whether the wrappers keep every
    element (an identity lazy key, elementwise CF decoders); else (None, why)."""
    from xarray.core import indexing
    from .xarray import FerryBackendArray
    for _ in range(32):
        if isinstance(data, FerryBackendArray):
            return data, None
        if isinstance(data, indexing.LazilyIndexedArray):
            key = data.key.tuple
            for k, n in zip(key, data.array.shape):
                if not (isinstance(k, slice) and k.indices(int(n)) == (0, int(n), 1)):
                    return None, "it was indexed after opening (isel/sel give lazy keys ferry re-derives " \
                                 "from coordinates only for datasets it can match)"
        nxt = getattr(data, "array", None)
        if nxt is None or nxt is data:
            return None, f"its data is a {type(data).__name__}, not a lazy array of engine='ferry'"
        data = nxt
    return None, "too many wrappers"


# dask layers that xarray's open_dataset(chunks=...)/open_mfdataset and isel/sel make: they keep the
# stored values (any other layer is a computation the dataset would drop by reading the files)
_STORED_LAYERS = ("concatenate", "getitem", "rechunk-merge", "rechunk-split")


def _check_stored_graph(data, name):
    for layer in data.__dask_graph__().layers:
        base = str(layer).rsplit("-", 1)[0]              # "<name>-<token>"
        if base.startswith(("original-open_dataset-", "open_dataset-")):     # + "<variable>"
            continue
        if base not in _STORED_LAYERS:
            raise ValueError(
                f"XarrayDataset: variable {name!r} is computed (its dask graph has a {base!r} layer): "
                "XarrayDataset reads variables as stored in the files; apply computations in transform=")


def _backend_arrays(var, name="?"):
    """Every FerryBackendArray behind one xarray Variable (one per file for open_mfdataset)."""
    from .xarray import FerryBackendArray
    data = var._data
    found = []
    try:
        import dask.array as da
    except ImportError:  # pragma: no cover
        da = None
    # var._data, never var.data: .data of a lazy variable reads it
    if da is not None and isinstance(data, da.Array):
        _check_stored_graph(data, name)
        for val in dict(data.__dask_graph__()).values():
            val = getattr(val, "value", val)
            cur = val
            for _ in range(32):
                if isinstance(cur, FerryBackendArray):
                    found.append(cur)
                    break
                nxt = getattr(cur, "array", None)
                if nxt is None or nxt is cur:
                    break
                cur = nxt
        return found
    arr, _ = _unwrap_backend(data)
    if arr is None:
        cur = data
        for _ in range(32):
            if isinstance(cur, FerryBackendArray):
                return [cur]
            nxt = getattr(cur, "array", None)
            if nxt is None or nxt is cur:
                break
            cur = nxt
        return []
    return [arr]


def _open_meta(path, group):
    import xarray as xr
    from .xarray import FerryBackendEntrypoint
    return xr.open_dataset(path, engine=FerryBackendEntrypoint, group=group, device="cpu")


def _positions(want, have, what):
    """Indices of the values `want` inside `have` (exact matches), or raise."""
    have = np.asarray(have)
    want = np.asarray(want)
    if have.ndim != 1 or want.ndim != 1:
        raise ValueError(f"XarrayDataset: {what}: coordinates must be 1-D")
    order = np.argsort(have, kind="stable")
    pos = np.searchsorted(have[order], want)
    pos = np.clip(pos, 0, len(have) - 1)
    idx = order[pos]
    ok = len(have) > 0 and bool(np.all(have[idx] == want))
    if not ok:
        raise ValueError(f"XarrayDataset: {what}: the dataset's coordinate values are not all in the file")
    return idx.astype(np.int64)


def _as_slice(idx, n):
    """An index array as a slice where it is a progression (else None)."""
    if len(idx) == 0:
        return slice(0, 0, 1)
    if len(idx) == 1:
        return slice(int(idx[0]), int(idx[0]) + 1, 1)
    d = np.diff(idx)
    if (d > 0).all() and (d == d[0]).all():
        return slice(int(idx[0]), int(idx[-1]) + 1, int(d[0]))
    return None


def _cf_params(attrs, dtype):
    """The CF decoding xarray's coders apply with mask_and_scale=True, as numbers."""
    def nums(v):
        if v is None:
            return []
        a = np.atleast_1d(np.asarray(v))
        return [x for x in a.tolist()]
    unsigned = str(attrs.get("_Unsigned", "")).lower() == "true" and np.dtype(dtype).kind == "i"
    fills = nums(attrs.get("_FillValue")) + nums(attrs.get("missing_value"))
    scale = attrs.get("scale_factor")
    offset = attrs.get("add_offset")
    return {"unsigned": unsigned, "fills": fills,
            "scale": None if scale is None else float(np.asarray(scale).ravel()[0]),
            "offset": None if offset is None else float(np.asarray(offset).ravel()[0])}


_UNSIGNED = {torch.int8: torch.uint8, torch.int16: torch.uint16, torch.int32: torch.uint32,
             torch.int64: torch.uint64}


def _decode_into(raw, cf, dst):
    """Stored values (torch, native order) -> floats in dst (same shape; it may be raw itself when
    the stored type is dst's), fills as NaN. A NaN fill of float data is already NaN and stays
    NaN through scale/offset: no mask, no kernel (xarray writes _FillValue=NaN on every float
    variable)."""
    x = raw
    if cf["unsigned"] and raw.dtype in _UNSIGNED:
        x = raw.view(_UNSIGNED[raw.dtype])
    mask = None
    for fv in cf["fills"]:
        if isinstance(fv, float) and math.isnan(fv):
            continue                # NaN in float data is NaN decoded; integers are never NaN
        if cf["unsigned"] and not x.is_floating_point() and fv < 0:
            fv = fv + (1 << (8 * raw.element_size()))    # fill given in the signed type
        m = x == fv
        mask = m if mask is None else (mask | m)
    if not (dst.dtype == x.dtype and dst.data_ptr() == x.data_ptr() and dst.stride() == x.stride()):
        dst.copy_(x)
    if cf["scale"] is not None:
        dst.mul_(cf["scale"])
    if cf["offset"] is not None:
        dst.add_(cf["offset"])
    if mask is not None:
        dst.masked_fill_(mask, float("nan"))
    return dst


def _stored_attrs(fv):
    attrs = dict(fv.encoding)
    attrs.update({k: fv.attrs[k] for k in ("_FillValue", "missing_value", "scale_factor", "add_offset",
                                          "_Unsigned") if k in fv.attrs})
    return attrs


def _file_sig(fm, name, path):
    """What discovery takes from one file for one variable (compared across files)."""
    if name not in fm.variables:
        raise ValueError(f"XarrayDataset: {path}: no variable {name!r}")
    fv = fm.variables[name]
    dt = np.dtype(fv.encoding.get("dtype", fv.dtype))
    return {"dims": tuple(fv.dims), "dtype": str(dt.newbyteorder("=")),
            "cf": _cf_params(_stored_attrs(fv), dt), "shape": tuple(int(x) for x in fv.shape[1:]),
            "coords": {d: np.asarray(fm[d].values) for d in fv.dims[1:] if d in fm.coords and fm[d].ndim == 1}}


class _XGroup(_Group):
    """A batch's group; its buffers and open stores are what the planner thread made, so reading
    them (in whatever order the batch stream does) first waits for the planning."""
    __slots__ = ("meta", "stores")

    def _planned(self):
        j = _Group.job.__get__(self)
        if isinstance(j, _Planned):
            j._resolve(raise_errors=False)

    @property
    def bufs(self):
        self._planned()
        return _Group.bufs.__get__(self)

    @bufs.setter
    def bufs(self, v):
        _Group.bufs.__set__(self, v)

    @property
    def handles(self):
        self._planned()
        return _Group.handles.__get__(self)

    @handles.setter
    def handles(self, v):
        _Group.handles.__set__(self, v)


def _check_stores(handles):
    """Every file a batch reads is still the one discovery (and its store) parsed: a file replaced
    since would be read with the old metadata. Raises the store's FerryError."""
    for e in handles:
        e[0]._check_unchanged()


class XarrayDataset(_BatchStream):
    """Batches of samples along one dimension of gridded xarray variables, on `device`.

    XarrayDataset(data, variables=None, *, sample_dim="time", batch_size=16, input_steps=1,
                  target_steps=0, lead=1, target_variables=None, patch=None,
                  patch_mode="random", shuffle=False, seed=0, drop_last=False, device=None,
                  rank=None, world_size=None, prefetch=4, normalize=None, stats_file=None,
                  stats_steps=64, nan_to=None, return_mask=False, return_time=False,
                  dtype=torch.float32, group=None, transform=None, threads=0,
                  batches_per_read=None)

    data
        An xarray Dataset opened with ``engine="ferry"`` (one file, ``open_mfdataset``, Zarr, a
        DataTree node's ``.to_dataset()``), possibly selected along any dimension with
        ``sel``/``isel`` (the selection is matched by coordinate values), or paths: a glob, a
        path, or a list (concatenated along ``sample_dim`` in natural order).
    variables
        Names of the data variables stacked into ``x`` (default: every data variable that has
        ``sample_dim`` as its first dimension). Each must have ``sample_dim`` first and the same
        two trailing (spatial) dims; dims in between (levels) become channels.
    input_steps, target_steps, lead
        Sample i starting at step t gives x from steps t .. t+input_steps-1 and, when
        target_steps > 0, y from steps t+input_steps-1+lead .. (+target_steps-1) of
        ``target_variables`` (default: `variables`). Windows never leave the sample dim. Windows
        pair positions along the dim, so when a window spans more than one step and the dim has a
        numeric or datetime coordinate, its spacing must be constant (a gap raises ValueError).
    patch, patch_mode
        patch=(h, w): spatial windows. "random": one window per sample at a position drawn from
        (seed, epoch, sample); "tile": every sample is (step, tile) over a grid of
        non-overlapping h×w tiles (a remainder smaller than a tile is not used).
    normalize, stats_file, stats_steps
        None, {var: (mean, std)} (scalars or one value per channel), or "compute": per-channel
        mean/std over `stats_steps` evenly spaced steps (NaN ignored), computed once here and
        cached in `stats_file` (JSON) when given. out = (x - mean) / std.
    nan_to, return_mask
        Missing values are NaN after decoding; nan_to=v replaces them (after normalising);
        return_mask=True adds batch["mask"] (True where x is valid).
    return_time
        batch["time"]: the sample dim's coordinate at each sample's first input step (int64:
        datetime64 in ns since 1970, else the raw numbers as float64).
    Others as ArrayDataset: shuffle, seed, drop_last, device, rank, world_size, prefetch,
    transform (batch -> batch), threads.
    batches_per_read
        Batches read by one plan (one engine job). Each batch handed out is its own block of its
        group's stack (no batch shares memory with another); the group's memory is freed when all
        of its batches are. None (the default): 1, except on a GPU where the engine asks for
        larger jobs (ferry_plan_budget): deflate-compressed (netCDF-4) and zstd-compressed
        (Zarr) data, whose GPU decoders need thousands of chunks at once — there as many batches
        as make 2.5 GiB, fewer where the groups and their decode buffers would not fit beside
        what the GPU has free (a quarter of it, 64 MiB at least, stays free for the model), three
        such groups in flight whatever `prefetch` asks (the one handed out and two in the engine,
        or one where two do not fit; prefetch=0: one); a FerryError where one batch does not:
        on the H200, 20 variables of 361 x 720 float32, batch 8, 17 batches a read ran at
        21.9-23.3 GB/s (netCDF-4) against 8.1-8.6 with one, and 16 at 44.4
        (Zarr zstd) against 23.5-26.4 (BENCHMARKS.md). Uncompressed and blosc data keep 1. The
        value in use is ``batch_group`` once iteration has begun. A pass reads at most that many
        a plan, evened out over its batches (104 in reads of 17: 7 reads of 15, the last 14).

    Batches are dicts: "x" (B, C*input_steps, H, W) and "y" (B, C_y*target_steps, H, W) when
    target_steps > 0, in `dtype`.
    """

    def __init__(self, data, variables=None, *, sample_dim="time", batch_size=16, input_steps=1,
                 target_steps=0, lead=1, target_variables=None, patch=None, patch_mode="random",
                 shuffle=False, seed=0, drop_last=False, device=None, rank=None, world_size=None,
                 prefetch=4, normalize=None, stats_file=None, stats_steps=64, nan_to=None,
                 return_mask=False, return_time=False, dtype=torch.float32, group=None,
                 transform=None, threads=0, block_size=None, batches_per_read=None):
        torch.utils.data.IterableDataset.__init__(self)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"XarrayDataset: batch_size must be a positive int, not {batch_size!r}")
        for nm, v, least in (("input_steps", input_steps, 1), ("target_steps", target_steps, 0),
                             ("lead", lead, 1), ("prefetch", prefetch, 0)):
            if not isinstance(v, int) or v < least:
                raise ValueError(f"XarrayDataset: {nm} must be an int >= {least}, not {v!r}")
        if patch_mode not in ("random", "tile"):
            raise ValueError(f"XarrayDataset: patch_mode must be 'random' or 'tile', not {patch_mode!r}")
        self.sample_dim = sample_dim
        self.input_steps, self.target_steps, self.lead = input_steps, target_steps, lead
        self.out_dtype = dtype
        self.nan_to = nan_to
        self.return_mask = bool(return_mask)
        self.return_time = bool(return_time)
        self.patch_mode = patch_mode

        segs, ds_meta, var_names = self._discover(data, variables, sample_dim, group)
        self._segs = segs
        self._seg_g0 = np.array([s.g0 for s in segs], dtype=np.int64)
        self.steps = int(sum(s.hi - s.lo for s in segs))
        tvars = list(var_names) if target_variables is None else list(target_variables)
        all_names = list(dict.fromkeys(list(var_names) + (tvars if target_steps else [])))
        self._vars = {n: self._var_info(ds_meta, n, sample_dim) for n in all_names}
        self._check_files(all_names)
        self.variables, self.target_variables = list(var_names), tvars if target_steps else []
        sp = {v.spatial for v in self._vars.values()}
        if len(sp) != 1:
            raise ValueError(f"XarrayDataset: variables have different spatial shapes "
                             f"{ {n: v.spatial for n, v in self._vars.items()} }")
        self.spatial = sp.pop()
        self._times = self._time_numbers(ds_meta, sample_dim) if return_time else None

        self.span = input_steps + ((lead + target_steps - 1) if target_steps else 0)
        self.n_starts = self.steps - self.span + 1
        if self.n_starts < 1:
            raise ValueError(f"XarrayDataset: {self.steps} steps along {sample_dim!r} are fewer than one "
                             f"sample needs ({self.span})")
        if self.span > 1:
            self._check_spacing(ds_meta, sample_dim)
        self.patch = None if patch is None else tuple(int(p) for p in patch)
        self.tiles = (1, 1)
        if self.patch is not None:
            if len(self.patch) != 2 or min(self.patch) < 1 or self.patch[0] > self.spatial[0] \
                    or self.patch[1] > self.spatial[1]:
                raise ValueError(f"XarrayDataset: patch {patch!r} does not fit the grid {self.spatial}")
            for n, v in self._vars.items():
                for d, p in zip(v.dims[-2:], v.post[-2:]):
                    if p is not None:
                        raise ValueError(f"XarrayDataset: patch= needs the spatial dims in file order, but "
                                         f"{n!r} selects {d!r} in another order (reversed or out of order): "
                                         "select it in increasing order and flip in transform=")
            if patch_mode == "tile":
                self.tiles = (self.spatial[0] // self.patch[0], self.spatial[1] // self.patch[1])
        ntiles = self.tiles[0] * self.tiles[1]

        # the batch stream shared with ArrayDataset (order, layout, epochs, state, runtime)
        self.block_size = None if block_size is None else int(block_size)
        self._init_stream(batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                          device=device, rank=rank, world_size=world_size, prefetch=prefetch,
                          transform=transform, pin_memory=False, threads=threads, ctx=None, sample_group=1)
        self.staging = "engine"
        self._single = False
        self._fields = []
        self.num_samples = self.n_starts * ntiles

        self._init_slabs()
        self.batch_group = self._group_size(batches_per_read)     # _BatchStream's batches per plan
        self._group_auto, self._auto_groups = batches_per_read is None, {}   # _read_group
        self._norm = None
        self._norm = self._normalisation(normalize, stats_file, int(stats_steps))

    # ---------------------------------------------------------------- discovery
    def _discover(self, data, variables, sample_dim, group):
        import xarray as xr
        if isinstance(data, xr.DataTree):
            data = data.to_dataset()
        if isinstance(data, xr.Dataset):
            return self._discover_dataset(data, variables, sample_dim)
        paths = _expand(data)
        segs, g0, first = [], 0, None
        for p in paths:
            m = _open_meta(p, group)
            if sample_dim not in m.sizes:
                raise ValueError(f"XarrayDataset: {p}: no dimension {sample_dim!r} (dims {dict(m.sizes)})")
            n = int(m.sizes[sample_dim])
            segs.append(_FileSeg(p, group, 0, n, g0))
            g0 += n
            if first is None:
                first = m
            else:
                m.close()
        names = self._default_vars(first, variables, sample_dim, paths[0])
        meta = first if len(paths) == 1 else xr.concat(
            [first] + [_open_meta(p, group) for p in paths[1:]], dim=sample_dim, data_vars="minimal",
            coords="minimal", compat="override", join="override")
        self._meta_files = {p: None for p in paths}
        return segs, meta, names

    def _default_vars(self, ds, variables, sample_dim, where):
        if variables is None:
            names = [n for n, v in ds.data_vars.items() if v.dims and v.dims[0] == sample_dim and v.ndim >= 3]
            if not names:
                raise ValueError(f"XarrayDataset: {where}: no data variable has {sample_dim!r} first and "
                                 "two spatial dims")
            return names
        names = [variables] if isinstance(variables, str) else list(variables)
        missing = [n for n in names if n not in ds.variables]
        if missing:
            raise KeyError(f"XarrayDataset: {where}: no variables {missing} (has {sorted(ds.data_vars)})")
        return names

    def _discover_dataset(self, ds, variables, sample_dim):
        if sample_dim not in ds.sizes:
            raise ValueError(f"XarrayDataset: the dataset has no dimension {sample_dim!r} (dims {dict(ds.sizes)})")
        names = self._default_vars(ds, variables, sample_dim, "dataset")
        files = {}
        for n in names:
            arrs = _backend_arrays(ds.variables[n], n)
            if not arrs:
                raise ValueError(
                    f"XarrayDataset: variable {n!r} is not read by ferry (open the data with "
                    f"engine='ferry'; {_unwrap_backend(ds.variables[n]._data)[1]})")
            for a in arrs:
                if a.name != n:
                    raise ValueError(f"XarrayDataset: variable {n!r} of the dataset is {a.name!r} in "
                                     f"{a.store.filename}: renamed variables are not supported (the files are "
                                     f"read by name; use {a.name!r}, or rename in transform=)")
                files.setdefault((a.store.filename, a.store.group), None)
        if sample_dim not in ds.coords:
            if len(files) != 1:
                raise ValueError(f"XarrayDataset: several files and no {sample_dim!r} coordinate to order them by")
            (path, grp), = files
            n = int(ds.sizes[sample_dim])
            m = _open_meta(path, grp)
            if int(m.sizes[sample_dim]) != n:
                raise ValueError(f"XarrayDataset: {path}: {sample_dim!r} was subset and has no coordinate to "
                                 "match; pass the files instead")
            return [_FileSeg(path, grp, 0, n, 0)], ds, names
        want = ds[sample_dim].values
        glob_pos = {}
        segs = []
        for path, grp in files:
            m = _open_meta(path, grp)
            have = m[sample_dim].values
            m.close()
            # which of this file's steps the dataset kept, and where they are in the dataset
            common, ia, ib = np.intersect1d(have, want, assume_unique=False, return_indices=True)
            if len(common) == 0:
                continue
            order = np.argsort(ia)
            ia, ib = ia[order], ib[order]
            # runs of consecutive file steps that are consecutive dataset steps
            brk = np.flatnonzero((np.diff(ia) != 1) | (np.diff(ib) != 1)) + 1
            for lo, hi in zip(np.concatenate(([0], brk)), np.concatenate((brk, [len(ia)]))):
                segs.append(_FileSeg(path, grp, int(ia[lo]), int(ia[hi - 1]) + 1, int(ib[lo])))
                for g in range(int(ib[lo]), int(ib[hi - 1]) + 1):
                    if g in glob_pos:
                        raise ValueError(f"XarrayDataset: step {g} of {sample_dim!r} is in two files")
                    glob_pos[g] = path
        segs.sort(key=lambda s: s.g0)
        if len(glob_pos) != len(want):
            raise ValueError(f"XarrayDataset: {len(want) - len(glob_pos)} steps of {sample_dim!r} were found in "
                             "no file ferry read")
        return segs, ds, names

    def _var_info(self, ds, name, sample_dim):
        if name not in ds.variables:
            raise KeyError(f"XarrayDataset: no variable {name!r}")
        v = ds.variables[name]
        if not v.dims or v.dims[0] != sample_dim or v.ndim < 3:
            raise ValueError(f"XarrayDataset: variable {name!r} has dims {v.dims}: it needs {sample_dim!r} first "
                             "and two spatial dims last")
        seg = self._segs[0]
        fm = _open_meta(seg.path, seg.group)
        try:
            fv = fm.variables[name]
            if fv.dims != v.dims:
                raise ValueError(f"XarrayDataset: {seg.path}: variable {name!r} has dims {fv.dims}, "
                                 f"the dataset {v.dims}")
            sel, post = [], []
            for d, n in zip(v.dims[1:], v.shape[1:]):
                nfile = int(fm.sizes[d])
                if d in ds.coords and d in fm.coords and ds[d].ndim == 1:
                    idx = _positions(ds[d].values, fm[d].values, f"{name}: dim {d!r}")
                elif int(n) == nfile:
                    idx = np.arange(nfile, dtype=np.int64)
                else:
                    raise ValueError(f"XarrayDataset: {name}: dim {d!r} has {n} entries here and {nfile} in "
                                     f"{seg.path}, and no coordinate to match them by")
                s = _as_slice(idx, nfile)
                if s is not None:
                    sel.append(s)
                    post.append(None)
                else:       # read the bounding range, select after the read
                    lo, hi = int(idx.min()), int(idx.max()) + 1
                    sel.append(slice(lo, hi, 1))
                    post.append(idx - lo)
            enc_dtype = np.dtype(fv.encoding.get("dtype", fv.dtype))
            attrs = _stored_attrs(fv)
        finally:
            fm.close()
        counts = [len(range(*s.indices(10 ** 18))) if p is None else len(p) for s, p in zip(sel, post)]
        levels = tuple(counts[:-2])
        spatial = tuple(counts[-2:])
        return _VarInfo(name, v.dims, sel, post, levels, spatial, enc_dtype.newbyteorder("="),
                        _cf_params(attrs, enc_dtype))

    def _check_files(self, names):
        """Every file must store each variable as the first file does: the dims, stored dtype,
        non-sample shape and coordinates read from the first file are used for all of them. CF
        parameters (scale_factor, add_offset, fills, _Unsigned) may differ: each file's are kept and
        its steps decoded with them (CDS ERA5 files each carry their own packing)."""
        from .xarray import _file_identity
        files = list(dict.fromkeys((s.path, s.group) for s in self._segs))
        ref = None
        sigs = {}
        self._idents = {}
        for path, grp in files:
            self._idents[(path, grp)] = _file_identity(path) if os.path.isfile(path) else None
            fm = _open_meta(path, grp)
            try:
                sig = {n: _file_sig(fm, n, path) for n in names}
            finally:
                fm.close()
            sigs[(path, grp)] = sig
            if ref is None:
                ref = (path, sig)
                continue
            for n in names:
                a, b = ref[1][n], sig[n]
                diff = [f"{k} {a[k]!r} vs {b[k]!r}" for k in ("dims", "dtype", "shape") if repr(a[k]) != repr(b[k])]
                diff += [f"the {d!r} coordinate" for d in a["coords"]
                         if d in b["coords"] and not np.array_equal(a["coords"][d], b["coords"][d])]
                if diff:
                    raise ValueError(f"XarrayDataset: variable {n!r} is stored differently in {ref[0]} and "
                                     f"{path}: " + "; ".join(diff) + " (every file must match the first)")
        # per variable: the distinct CF parameters, and which of them each segment's file has
        self._cfs, self._seg_cf = {}, {}
        for n in names:
            cfs, index, per = [], {}, []
            for sg in self._segs:
                cf = sigs[(sg.path, sg.group)][n]["cf"]
                k = index.setdefault(repr(cf), len(cfs))      # repr: NaN fills compare equal
                if k == len(cfs):
                    cfs.append(cf)
                per.append(k)
            self._cfs[n], self._seg_cf[n] = cfs, np.asarray(per, dtype=np.int64)

    def _check_spacing(self, ds, sample_dim):
        """Windows pair dataset positions: the sample coordinate must be evenly spaced."""
        if sample_dim not in ds.coords or ds[sample_dim].ndim != 1:
            return
        t = ds[sample_dim].values
        if not (np.issubdtype(t.dtype, np.datetime64) or np.issubdtype(t.dtype, np.timedelta64)
                or np.issubdtype(t.dtype, np.number)) or len(t) < 3:
            return
        d = np.diff(t)
        if np.issubdtype(d.dtype, np.floating):
            bad = np.flatnonzero(~np.isclose(d, d[0], rtol=1e-9, atol=0))
        else:
            bad = np.flatnonzero(d != d[0])
        if len(bad):
            i = int(bad[0])
            raise ValueError(f"XarrayDataset: windows of {self.span} steps need an evenly spaced {sample_dim!r}, "
                             f"but step {i + 1} ({t[i + 1]}) follows {t[i]} by {d[i]}, not {d[0]} (a missing "
                             f"file or a selection with gaps)")

    def _time_numbers(self, ds, sample_dim):
        if sample_dim not in ds.coords:
            return np.arange(self.steps, dtype=np.int64)
        t = ds[sample_dim].values
        if np.issubdtype(t.dtype, np.datetime64):
            return t.astype("datetime64[ns]").astype(np.int64)
        return np.asarray(t, dtype=np.float64)

    # ---------------------------------------------------------------- normalisation
    def _normalisation(self, normalize, stats_file, stats_steps):
        if normalize is None:
            return None
        names = list(dict.fromkeys(self.variables + self.target_variables))
        if isinstance(normalize, str):
            if normalize != "compute":
                raise ValueError(f"XarrayDataset: normalize must be None, a dict or 'compute', not {normalize!r}")
            stats = None
            key = json.loads(json.dumps(self._stats_key(names, stats_steps)))     # as the file holds it
            if stats_file and os.path.exists(stats_file):
                with open(stats_file) as fh:
                    saved = json.load(fh)
                if saved.get("key") == key:
                    stats = {k: (np.asarray(m), np.asarray(s)) for k, (m, s) in saved["stats"].items()}
            if stats is None:
                stats = self._compute_stats(names, stats_steps)
                if stats_file:
                    tmp = stats_file + ".tmp"
                    with open(tmp, "w") as fh:
                        json.dump({"key": key, "stats": {k: (m.tolist(), s.tolist()) for k, (m, s) in stats.items()}}, fh)
                    os.replace(tmp, stats_file)
        elif isinstance(normalize, dict):
            bad = set(normalize) - set(names)
            if bad:
                raise KeyError(f"XarrayDataset: normalize names unknown variables {sorted(bad)}")
            stats = {}
            for n, (m, s) in normalize.items():
                c = self._vars[n].channels
                m = np.broadcast_to(np.asarray(m, dtype=np.float64).reshape(-1), (c,)).copy() \
                    if np.size(m) in (1, c) else None
                s = np.broadcast_to(np.asarray(s, dtype=np.float64).reshape(-1), (c,)).copy() \
                    if np.size(s) in (1, c) else None
                if m is None or s is None:
                    raise ValueError(f"XarrayDataset: normalize[{n!r}] needs 1 or {c} values")
                stats[n] = (m, s)
        else:
            raise TypeError("XarrayDataset: normalize must be None, a dict or 'compute'")
        for n, (m, s) in stats.items():
            if np.any(s == 0) or not np.all(np.isfinite(s)):
                raise ValueError(f"XarrayDataset: normalize std of {n!r} has zeros or non-finite values")
        return stats

    def _stats_key(self, names, stats_steps):
        """What the computed stats depend on: the files (path, size, mtime), the steps of each read,
        and each variable's selection."""
        def file_id(path):
            try:
                st = os.stat(path)
                return [os.path.abspath(path), st.st_size, st.st_mtime_ns]
            except OSError:
                return [os.path.abspath(path), None, None]

        def sl(x):
            return [x.start, x.stop, x.step]
        sel = {n: {"dims": list(self._vars[n].dims), "sel": [sl(x) for x in self._vars[n].sel],
                   "post": [None if p is None else np.asarray(p).tolist() for p in self._vars[n].post]}
               for n in names}
        files = [file_id(p) + [g] for p, g in dict.fromkeys((sg.path, sg.group) for sg in self._segs)]
        segs = [[os.path.abspath(sg.path), sg.lo, sg.hi, sg.g0] for sg in self._segs]
        return {"variables": names, "steps": self.steps, "stats_steps": stats_steps, "files": files,
                "segments": segs, "selection": sel}

    def _compute_stats(self, names, stats_steps):
        """Per-channel mean/std over evenly spaced steps, NaN ignored, in float64."""
        steps = np.unique(np.linspace(0, self.steps - 1, min(self.steps, max(1, stats_steps))).astype(np.int64))
        device = self._resolve_device(False)
        rt = self._runtime(device, False, 1)
        bufs, job, handles = self._read_rows(rt, steps, None)
        try:
            if job is not None:
                job.wait()
            _check_stores(handles)
        finally:
            self._release(rt, _wrap_handles(handles))
        dec = self._stack(rt, bufs, steps, normalise=False)
        out = {}
        for n in names:
            c0, c = self._coff[n], self._vars[n].channels
            x = dec[:, c0:c0 + c].to(torch.float64)
            x = x.transpose(0, 1).reshape(c, -1)
            mean = torch.nanmean(x, dim=1)
            std = torch.sqrt(torch.nanmean((x - mean[:, None]) ** 2, dim=1))
            out[n] = (mean.cpu().numpy(), std.cpu().numpy())
        return out

    # ---------------------------------------------------------------- the batch's layout
    def _init_slabs(self):
        """Where each variable's channels go. The stack (rows, C, H, W) holds every variable read
        (x's, then y's others), channels in the documented order. Variables of one stored dtype read
        without re-indexing share one slab (a destination buffer of the same layout): the engine
        writes each variable's channels of a row straight into its place in the stack, so for
        float32 data stored as float32 the slab IS the batch (no copy, no kernel; H200 netCDF-3:
        XarrayDataset 26 GB/s = 0.60x of .load() while it decoded, gathered and concatenated per
        variable). A variable read as a bounding range (post-selection) has a slab of its own."""
        names = list(dict.fromkeys(self.variables + self.target_variables))
        self._coff, c = {}, 0
        for n in names:
            self._coff[n] = c
            c += self._vars[n].channels
        self._C = c
        self._fdt = self.out_dtype if self.out_dtype.is_floating_point else torch.float32
        slabs, shared = [], {}
        for n in names:
            v = self._vars[n]
            reads = [len(range(*s.indices(10 ** 18))) for s in v.sel]
            plain = all(p is None for p in v.post)
            s = shared.get(v.dtype) if plain else None
            if s is None:
                s = _Slab(v.dtype, plain, tuple(reads[-2:]))
                slabs.append(s)
                if plain:
                    shared[v.dtype] = s
            s.add(n, int(np.prod(reads[:-2], dtype=np.int64)), tuple(reads[:-2]))
        self._slabs = slabs
        # variables whose stored values are their decoded values in every file (float data with no
        # scale/offset and no fill but NaN): nothing to do for them in place (slicing 20 of them
        # was 1.4 ms a batch on the dev box)
        self._as_stored = {n for n in names if np.dtype(self._vars[n].dtype).kind == "f" and all(
            not cf["unsigned"] and cf["scale"] is None and cf["offset"] is None and
            all(isinstance(f, float) and math.isnan(f) for f in cf["fills"])
            for cf in self._cfs.get(n, [self._vars[n].cf]))}
        one = slabs[0]
        self._in_place = len(slabs) == 1 and one.plain and _torch_dtype(one.dtype) == self._fdt
        self._xch = _channel_pick([(self._coff[n], self._vars[n].channels) for n in self.variables], c)
        self._ych = _channel_pick([(self._coff[n], self._vars[n].channels) for n in self.target_variables], c)

    @staticmethod
    def _group_size(batches_per_read):
        if batches_per_read is None:
            return 1
        if not isinstance(batches_per_read, int) or isinstance(batches_per_read, bool) or batches_per_read < 1:
            raise ValueError(f"XarrayDataset: batches_per_read must be a positive int or None, "
                             f"not {batches_per_read!r}")
        return batches_per_read

    def _dev(self, rt, key, make):
        """A small tensor on rt's device made once per process (index lists, normalisation)."""
        cache = getattr(rt, "_xcache", None)
        if cache is None:
            cache = rt._xcache = {}
        t = cache.get(key)
        if t is None:
            t = cache[key] = _to_dev(make(), rt.device)
        return t

    # ---------------------------------------------------------------- reading
    def _store(self, rt, seg, handles, seen):
        key = ("xstore", seg.path, seg.group)
        e = seen.get(key)
        if e is None:
            from .xarray import FerryStore
            def opener():
                from .xarray import _describe_ident
                st = FerryStore(seg.path, group=seg.group, device="cpu", ctx=rt.ctx, mask_and_scale=False,
                                decode_times=False)
                want = self._idents.get((seg.path, seg.group))
                if want is not None and st._ident is not None and st._ident != want:
                    st.close()
                    raise _ferry.FerryError(_ferry.EIO, f"{seg.path}: the file changed since the XarrayDataset "
                                            f"was made (found {_describe_ident(st._ident)}, expected "
                                            f"{_describe_ident(want)}): make the dataset again")
                return st
            with _lock_of(rt):
                e = rt.handle(key, opener)
                e[1] += 1
            seen[key] = e
            handles.append(e)
        return e[0]

    def _specs(self, st, seen):
        """The store's specs of every variable read, checked once per store: read by ferry's engine."""
        key = ("specs", id(st))
        sp = seen.get(key)
        if sp is None:
            sp = {}
            for slab in self._slabs:
                for n, _, _, _ in slab.items:
                    s = st.specs[n]
                    if s.kind not in ("ferry", "h5"):
                        raise _ferry.FerryError(_ferry.EUNSUPPORTED, s.error or f"{st.filename}: variable {n}: "
                                                f"read by {s.kind}, not by ferry's engine")
                    sp[n] = s
            seen[key] = sp
        return sp

    def _plan_whole_rows(self, rt, plan, row_steps, seg_of, places, dev, handles, seen):
        """_plan_rows without patches: ONE Plan.read_rows a run of rows in one file, in C. Each
        row's variables go to their channels of the row, and the extents enter the plan as the
        row-by-row loop adds them. That loop made a Python call a row and variable, 2,400 for a
        group of 120 samples of 20 variables: a median of 13 ms of the planner's CPU a group for
        netCDF-4, 27 ms for Zarr zstd, on the H200, the engine idle meanwhile whenever both groups
        in flight were read before the consumer asked for the next (2026-12-04 01:51,
        bench/results/2026-12-04). Dev box, 36x72 grids: netCDF-4 7.0-7.4 -> 0.7-1.7 ms a group;
        Zarr zstd 20.2-23.8 -> 16.7-17.9 (its chunk files' lstats, in C, remain)."""
        R = len(row_steps)
        _, bases, row_bytes, names, offs, _, tails = zip(*places)
        dsts = [(base, R * row, dev) for base, row in zip(bases, row_bytes)]
        sels = [[(0, 1, 1)] + tail for tail in tails]
        # offset of row r's variable k in its slab: r * (the slab's row bytes) + k's place in the row
        at = np.arange(R, dtype=np.int64)[:, None] * np.array(row_bytes, np.int64) + np.array(offs, np.int64)
        cuts = (np.flatnonzero(np.diff(seg_of)) + 1).tolist()      # where the rows' file changes
        for r, e in zip([0] + cuts, cuts + [R]):
            seg = self._segs[int(seg_of[r])]
            st = self._store(rt, seg, handles, seen)
            specs = self._specs(st, seen)
            steps = np.ascontiguousarray(row_steps[r:e] - seg.g0 + seg.lo, dtype=np.int64)
            plan.read_rows([st._row_source(specs[n]) for n in names], sels, steps, dsts, at[r:e].reshape(-1))

    def _read_rows(self, rt, row_steps, boxes, engine_jobs=None):
        """ONE plan reading rows (a global step each, and a patch corner each when `boxes`) of every
        variable into the slabs: [(R, channels of the slab, h, w)], the job, the handles.
        engine_jobs: submitted once fewer than that many of rt's jobs made so are in the engine
        (_engine_room; on the planner thread)."""
        row_steps = np.asarray(row_steps, dtype=np.int64)
        R = len(row_steps)
        bufs = []
        for slab in self._slabs:
            hw = self.patch if boxes is not None else slab.spatial
            bufs.append(self._alloc(rt, (R, slab.C) + tuple(hw), _torch_dtype(slab.dtype)))
        plan, handles = _ferry.Plan(), []
        self._plan_rows(rt, plan, row_steps, boxes, [b.data_ptr() for b in bufs], handles)
        try:
            if engine_jobs and len(plan):
                _engine_room(rt, engine_jobs)
            job = rt.ctx.submit(plan, reread=True) if len(plan) else None   # epochs: FERRY_REREAD
        except BaseException:
            self._release(rt, _wrap_handles(handles))       # the stores taken so far
            raise
        if engine_jobs and job is not None:
            _in_engine(rt).append(job)
        return bufs, job, handles

    def _plan_rows(self, rt, plan, row_steps, boxes, bases, handles):
        """Add to `plan` the reads of rows (as _read_rows) into slabs at the addresses `bases`; the
        stores it opens are appended to `handles` (released here on an error)."""
        R = len(row_steps)
        seen = {}
        seg_of = np.searchsorted(self._seg_g0, row_steps, side="right") - 1
        dev = -1 if rt.device.type != "cuda" else rt.device.index
        places = []
        for slab, base in zip(self._slabs, bases):
            hw = self.patch if boxes is not None else slab.spatial
            plane = int(np.prod(hw, dtype=np.int64)) * slab.dtype.itemsize
            # per variable: (slab, its address, bytes of a row, name, offset in a row, bytes,
            # the selection of the dims after the sample dim as triples)
            for n, off, rc, _ in slab.items:
                if rc * plane:
                    sel = self._vars[n].sel
                    places.append((slab, base, slab.C * plane, n, off * plane, rc * plane,
                                   [(s.start, s.stop, s.step) for s in sel]))
        try:
            if boxes is None and places:
                self._plan_whole_rows(rt, plan, row_steps, seg_of, places, dev, handles, seen)
                _check_stores(handles)
                return
            # one row (a step of one file) at a time: each variable's channels of a row are one
            # contiguous block of the slab, whatever else shares it
            for r in (range(R) if places else ()):
                seg = self._segs[int(seg_of[r])]
                t = int(row_steps[r]) - seg.g0 + seg.lo
                st = self._store(rt, seg, handles, seen)
                specs = self._specs(st, seen)
                head = (t, t + 1, 1)
                if boxes is not None:
                    y0, x0 = int(boxes[r][0]), int(boxes[r][1])
                for slab, ptr, row, n, off, nb, tri in places:
                    if boxes is not None:
                        (ys, _, yst), (xs, _, xst) = tri[-2], tri[-1]
                        tri = tri[:-2] + [(ys + y0 * yst, ys + (y0 + self.patch[0]) * yst, yst),
                                          (xs + x0 * xst, xs + (x0 + self.patch[1]) * xst, xst)]
                    st._plan_triples(plan, specs[n], [head] + tri, (ptr + r * row + off, nb, dev))
            _check_stores(handles)
        except BaseException:
            self._release(rt, _wrap_handles(handles))       # the stores taken so far
            raise

    def _read_group(self, rt):
        """Batches read by one plan. batches_per_read=None on a GPU: as many as make a job of the
        decoded bytes the engine's budget gives (_engine_budget, from a plan of one row that is
        never run): 1 for uncompressed and blosc data; netCDF-4 deflate and Zarr zstd, 2.5 GiB
        (H200, 20 variables of 361 x 720 float32, batch 8: 17 batches a read; deflate 23.3 GB/s
        against 8.1-8.6 with one, zstd 44.4 with 16 against 23.5-26.4; BENCHMARKS.md)."""
        if not self._group_auto or rt.device.type != "cuda" or not self._slabs:
            return self.batch_group
        key = str(rt.device)
        if key not in self._auto_groups:
            plan, handles = _ferry.Plan(), []
            fake = 1 << 44     # addresses only: the plan is inspected, never submitted
            bases = [fake + (k << 36) for k in range(len(self._slabs))]
            self._plan_rows(rt, plan, np.zeros(1, dtype=np.int64), None, bases, handles)
            self._release(rt, _wrap_handles(handles))
            rows = self.batch_size * (self.input_steps + self.target_steps)
            per_batch = rows * sum(s.C * int(np.prod(s.spatial, dtype=np.int64)) * s.dtype.itemsize
                                   for s in self._slabs)
            self._auto_groups[key] = _engine_budget(rt.ctx, plan, per_batch)
        got = self._auto_groups[key]
        self.batch_group = got[0] if got else 1
        return self.batch_group

    def _read_depth(self, rt, depth):
        """Engine-sized groups (_read_group: the engine asked for a job size, whatever number of
        batches that made): three in flight, the one handed out and two in the engine. Each is
        planned at once but submitted only when fewer than two of them are in the engine
        (_engine_room): ferry_plan_budget sizes a job for two in the engine, or one where two do
        not fit beside what the GPU has free (then two in flight).
        - A third job in the engine made them slower (H200, netCDF-4, 16 batches a read, same
          run: two groups 18.9 GB/s, three 14.0: cooperative jobs at once share the engine's
          workers; Zarr zstd, 8 and 16 a read: 41.3-43.6 and 44.4 with two, 40.2-41.4 and 42.8
          with three; 2026-12-04 01:46, three: netCDF-4 0.75 x over four epochs).
        - Two in flight (the one handed out and one read) left the engine one job whenever the
          consumer took its time over a group: a deflate job alone took ~150 ms where two at once
          gave one every ~88 (its GPU latency), and at a pass's end the next epoch's first group
          was submitted only when the last one was handed out. DALI's pipeline began every other
          netCDF-4 epoch ~200 ms late, and so did a loop that copies and waits for each batch,
          without DALI (H200, 2026-12-04 03:13: 0.86-0.90 x the dataset alone over four epochs;
          three in flight, 03:27 and 03:35: 0.95-1.00 x; BENCHMARKS.md, sixteenth session)."""
        got = self._auto_groups.get(str(rt.device)) if self._group_auto else None
        if got:
            return 1 if depth <= 1 else got[1] + 1
        return depth

    def _engine_jobs(self, rt):
        """How many of this runtime's group jobs may be in the engine at once (None: any)."""
        got = self._auto_groups.get(str(rt.device)) if self._group_auto else None
        return got[1] if got else None

    def _stack(self, rt, bufs, row_steps, patched=False, normalise=True):
        """The slabs' raw values -> the stack (R, C, H, W) of decoded, normalised floats, on the
        current stream, without a host sync (index and parameter tensors are made once)."""
        if rt.device.type == "cuda":
            cur = torch.cuda.current_stream(rt.device)
            # a consumer lagging behind a training step runs all of this late: the slabs are
            # recorded here, the stack and temporaries are allocated here (tests/gpu lagging test)
            for b in bufs:                  # allocated on the engine's stream, used on this one
                b.record_stream(cur)
        R = len(row_steps)
        if self._in_place:
            dec = bufs[0]
            slab = self._slabs[0]
            for n, off, rc, _ in slab.items:
                if n not in self._as_stored:
                    self._decode_var(rt, dec[:, off:off + rc], n, dec[:, off:off + rc], row_steps)
        else:
            hw = tuple(self.patch) if patched else tuple(self.spatial)
            dec = torch.empty((R, self._C) + hw, dtype=self._fdt, device=rt.device)
            for slab, buf in zip(self._slabs, bufs):
                for n, off, rc, levels in slab.items:
                    v, c0 = self._vars[n], self._coff[n]
                    dst = dec[:, c0:c0 + v.channels]
                    src = buf[:, off:off + rc]
                    if slab.plain:
                        self._decode_var(rt, src, n, dst, row_steps)
                        continue
                    tmp = torch.empty(src.shape, dtype=self._fdt, device=rt.device)
                    self._decode_var(rt, src, n, tmp, row_steps)
                    tmp = tmp.reshape((R,) + levels + tuple(src.shape[2:]))
                    for ax, p in enumerate(v.post):
                        if p is not None:
                            tmp = tmp.index_select(1 + ax, self._dev(rt, ("post", n, ax), lambda p=p: p))
                    dst.copy_(tmp.reshape(dst.shape))
        if normalise and self._norm is not None:
            m = self._dev(rt, ("mean", self._fdt), lambda: self._norm_vec(0))
            s = self._dev(rt, ("istd", self._fdt), lambda: self._norm_vec(1))
            dec.sub_(m.view(1, -1, 1, 1)).mul_(s.view(1, -1, 1, 1))
        return dec

    def _norm_vec(self, which):
        """Per-channel mean (0) or 1/std (1) over the stack (0 and 1 where not normalised)."""
        out = np.full(self._C, 0.0 if which == 0 else 1.0)
        for n, (m, s) in self._norm.items():
            c0, c = self._coff[n], self._vars[n].channels
            out[c0:c0 + c] = m if which == 0 else 1.0 / s
        return torch.from_numpy(out).to(self._fdt)

    def _decode_var(self, rt, src, n, dst, row_steps):
        """CF-decode one variable's rows (each with its file's parameters) from src into dst."""
        cfs = self._cfs.get(n, [self._vars[n].cf])
        if len(cfs) == 1:
            _decode_into(src, cfs[0], dst)
            return
        st = np.asarray(row_steps, dtype=np.int64)
        which = self._seg_cf[n][np.searchsorted(self._seg_g0, st, side="right") - 1]
        for k in np.unique(which):
            rows = np.flatnonzero(which == k)
            if rows[-1] - rows[0] + 1 == len(rows):            # a range of rows: views, in place
                sl = slice(int(rows[0]), int(rows[-1]) + 1)
                _decode_into(src[sl], cfs[int(k)], dst[sl])
            else:
                idx = _to_dev(torch.from_numpy(rows), dst.device)
                part = torch.empty((len(rows),) + tuple(dst.shape[1:]), dtype=dst.dtype, device=dst.device)
                _decode_into(src.index_select(0, idx), cfs[int(k)], part)
                dst.index_copy_(0, idx, part)

    def _sample_boxes(self, ids, epoch):
        """Sample ids -> (start steps, patch corners or None)."""
        ntiles = self.tiles[0] * self.tiles[1]
        t = ids // ntiles
        if self.patch is None:
            return t, None
        H, W = self.spatial
        ph, pw = self.patch
        if self.patch_mode == "tile":
            tile = ids % ntiles
            return t, np.stack([(tile // self.tiles[1]) * ph, (tile % self.tiles[1]) * pw], axis=1)
        with np.errstate(over="ignore"):
            key = np.uint64((self.seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03 + 0x5851F42D4C957F2D) & _M64)
            h = _mix64(ids.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9) + key)
        oy = (h % np.uint64(H - ph + 1)).astype(np.int64)
        ox = ((h >> np.uint64(32)) % np.uint64(W - pw + 1)).astype(np.int64)
        return t, np.stack([oy, ox], axis=1)

    def _submit(self, rt, order, lay, units, ids=None):
        """One plan for the batches `units` (batches_per_read of them): their rows side by side
        in one stack, batch after batch, so each batch is a block of it. The rows and the plan
        are made on the planner thread (_group_rows, _read_rows): this thread, the consumer's,
        only takes the sample ids."""
        ranges = [lay.unit(s) for s in units]
        if ids is None:
            ids = np.concatenate([order[lo:hi] for lo, hi in ranges]) if len(ranges) > 1 else \
                order[ranges[0][0]:ranges[0][1]]
        g = _XGroup()
        g.units, g.sizes, g.handles, g.job, g.path = units, [hi - lo for lo, hi in ranges], [], None, None
        g.meta = None
        g.stores, g.bufs = [], []
        g.job = _Planned(self, rt, g, np.asarray(ids, dtype=np.int64), self._epoch_of_order(order))
        return g

    def _group_rows(self, ids, epoch, sizes):
        """Sample ids of a group's batches (of `sizes`) -> (start steps, the global step of each
        row of the stack, each sample's rows (samples, I+K), patch corners of the rows or None)."""
        t0, boxes = self._sample_boxes(ids, epoch)
        I, K, L = self.input_steps, self.target_steps, self.lead
        offs = np.asarray(list(range(I)) + [I - 1 + L + k for k in range(K)], dtype=np.int64)
        need = t0[:, None] + offs[None, :]        # (samples, I+K) global steps
        if boxes is not None:
            # every sample's window in its own rows (windows of one step rarely coincide)
            rows, inv = need.ravel(), np.arange(need.size, dtype=np.int64).reshape(need.shape)
            return t0, rows, inv, np.repeat(boxes, I + K, axis=0)
        # a step several samples of a batch need is read once; rows in order of first use, so a
        # batch of distinct single steps is its own block of the stack in batch order. Steps are
        # not shared between the batches of a group: each batch is its own block, and no batch
        # handed out aliases another's memory (a loop may modify a batch in place)
        rows, inv, lo, nrows = [], [], 0, 0
        for size in sizes:
            part = need[lo:lo + size]
            u, first, pinv = np.unique(part.ravel(), return_index=True, return_inverse=True)
            by_use = np.argsort(first, kind="stable")
            rank = np.empty_like(by_use)
            rank[by_use] = np.arange(len(by_use))
            inv.append(rank[pinv.ravel()].reshape(part.shape) + nrows)    # rows of this batch's block
            rows.append(u[by_use])
            lo, nrows = lo + size, nrows + len(u)
        return t0, np.concatenate(rows), np.concatenate(inv), None

    def _plan_group(self, rt, ids, epoch, sizes):
        """The planner thread's work for a group: its rows, then ONE plan reading them."""
        t0, rows, inv, row_boxes = self._group_rows(ids, epoch, sizes)
        bufs, job, handles = self._read_rows(rt, rows, row_boxes, self._engine_jobs(rt))
        return bufs, job, handles, (bufs, inv, t0, rows, row_boxes is not None)

    def _start_planning(self, rt):
        # at a pass's end: the next pass's groups (_BatchStream._read_ahead) are planned now, not
        # at that pass's first wait; and none is left unplanned on the dataset, where its _Planned
        # (holding the dataset) would make a cycle that the cyclic GC may end on the planner
        # thread, whose __del__ would then wait for planning queued behind itself
        _kick(rt)

    def _release(self, rt, g):
        with _lock_of(rt):          # the planner thread takes handles while this one gives them back
            _BatchStream._release(self, rt, g)

    def _epoch_of_order(self, order):
        """The epoch whose order this is (patch positions are drawn per epoch)."""
        c = self._order_cache
        return c[0][2] if c is not None and c[1] is order else self._epoch

    def _finish(self, g):
        bufs, inv, t0, rows, patched = g.meta
        _check_stores([(st,) for st in g.stores])
        rt = self._rt
        I, K = self.input_steps, self.target_steps
        dec = self._stack(rt, bufs, rows, patched)

        views = []      # row ranges of the stack handed out as views (every output owns its memory)

        def take(binv, cols, pick, which):
            want = binv[:, cols].reshape(-1)
            a, b = (int(want[0]), int(want[0]) + len(want)) if len(want) else (0, 0)
            if b > a and np.array_equal(want, np.arange(a, b)) and all(b <= lo or a >= hi for lo, hi in views):
                t = dec[a:b]                                     # a block of the stack: a view
                views.append((a, b))
            else:       # rows another output also holds (y of t = x of t + 1): a copy of them
                t = dec.index_select(0, _to_dev(torch.from_numpy(np.ascontiguousarray(want)), dec.device))
            if isinstance(pick, slice):
                t = t[:, pick]
            elif pick is not None:
                t = t.index_select(1, self._dev(rt, ("chan", which), lambda: torch.from_numpy(pick)))
            return t.reshape((len(binv), -1) + tuple(t.shape[-2:]))

        outs, lo = [], 0
        for size in g.sizes:
            binv, bt0 = inv[lo:lo + size], t0[lo:lo + size]
            lo += size
            out = {}
            x = take(binv, slice(0, I), self._xch, "x")
            if self.return_mask:
                out["mask"] = ~torch.isnan(x)
            if self.nan_to is not None:
                x = torch.nan_to_num_(x, nan=float(self.nan_to))
            out["x"] = x
            if K:
                y = take(binv, slice(I, I + K), self._ych, "y")
                if self.nan_to is not None:
                    y = torch.nan_to_num_(y, nan=float(self.nan_to))
                out["y"] = y
            if self.return_time:
                out["time"] = _to_dev(torch.from_numpy(np.ascontiguousarray(self._times[bt0])), x.device)
            if self.transform is not None:
                out = self.transform(out)
            outs.append(out)
        _kick(rt)           # the groups submitted behind this one: planned while it is consumed
        return outs

    def _alloc(self, rt, shape, dtype, pinned=False):
        if rt.device.type == "cuda":
            with torch.cuda.stream(rt.alloc_stream):
                return torch.empty(shape, dtype=dtype, device=rt.device)
        from torch.utils.data import get_worker_info
        if get_worker_info() is not None:
            return torch.empty(shape, dtype=dtype).share_memory_()
        return torch.empty(shape, dtype=dtype)

    # ---------------------------------------------------------------- introspection
    @property
    def fields(self):
        c = sum(self._vars[n].channels for n in self.variables)
        out = {"x": ((c * self.input_steps,) + (self.patch or self.spatial), self.out_dtype)}
        if self.target_steps:
            cy = sum(self._vars[n].channels for n in self.target_variables)
            out["y"] = ((cy * self.target_steps,) + (self.patch or self.spatial), self.out_dtype)
        return out

    def channel_names(self, which="x"):
        """Names of the channels of x (or y), in order: "var[level index...]@step"."""
        names = self.variables if which == "x" else self.target_variables
        steps = range(self.input_steps) if which == "x" else range(self.target_steps)
        out = []
        for s in steps:
            for n in names:
                lv = self._vars[n].levels
                if lv:
                    out.extend(f"{n}{list(ix)}@{s}" for ix in np.ndindex(*lv))
                else:
                    out.append(f"{n}@{s}")
        return out

    def __repr__(self):
        return (f"XarrayDataset({self.num_samples} samples over {self.steps} steps of {self.sample_dim!r}, "
                f"x={self.variables}, y={self.target_variables}, batch_size={self.batch_size}, "
                f"epoch={self._epoch}, consumed={self._consumed})")


_NP_TORCH = {np.dtype(k): getattr(torch, v) for k, v in (
    ("bool", "bool"), ("int8", "int8"), ("uint8", "uint8"), ("int16", "int16"), ("uint16", "uint16"),
    ("int32", "int32"), ("uint32", "uint32"), ("int64", "int64"), ("uint64", "uint64"),
    ("float16", "float16"), ("float32", "float32"), ("float64", "float64"))}


def _torch_dtype(dt):
    t = _NP_TORCH.get(np.dtype(dt).newbyteorder("="))
    if t is None:
        raise TypeError(f"XarrayDataset: variables of dtype {dt} cannot be batched")
    return t


class _wrap_handles:
    def __init__(self, handles):
        self.handles = handles


class _Slab:
    """One destination buffer of a batch's plan: (rows, C, h, w) of one stored dtype, holding
    variables' channels side by side: items (name, channel offset, channels read, levels read)."""
    __slots__ = ("dtype", "plain", "spatial", "items", "C")

    def __init__(self, dtype, plain, spatial):
        self.dtype, self.plain, self.spatial, self.items, self.C = np.dtype(dtype), plain, spatial, [], 0

    def add(self, name, channels, levels):
        self.items.append((name, self.C, channels, levels))
        self.C += channels


def _channel_pick(ranges, total):
    """Channels (offset, count) of the stack, in order -> None (all of them), a slice, or indices."""
    idx = np.concatenate([np.arange(o, o + c, dtype=np.int64) for o, c in ranges]) if ranges else \
        np.zeros(0, dtype=np.int64)
    if len(idx) == total and np.array_equal(idx, np.arange(total)):
        return None
    if len(idx) and np.array_equal(idx, np.arange(idx[0], idx[0] + len(idx))):
        return slice(int(idx[0]), int(idx[0]) + len(idx))
    return idx


def _to_dev(t, device):
    """A small host tensor on `device` without a host sync: through pinned memory, copied on the
    current stream (a pageable copy to the GPU waits for the stream, i.e. for the consumer's
    training step: the idle the dataset caused behind a step)."""
    t = torch.as_tensor(t)
    if torch.device(device).type != "cuda":
        return t
    # lagging streams are safe: torch's pinned block is kept until this copy has run (the host
    # allocator records it on the stream), and the cached device copies are never written again
    return t.pin_memory().to(device, non_blocking=True)


def _lock_of(rt):
    """The lock of rt's open-store table (the planner thread and the consumer both use it)."""
    lk = rt.__dict__.get("_xlock")
    return lk if lk is not None else rt.__dict__.setdefault("_xlock", threading.Lock())


def _planner(rt):
    """rt's planner: ONE thread (batches are submitted to the engine in order), per process."""
    with _lock_of(rt):
        ex = rt.__dict__.get("_xplanner")
        if ex is None:
            ex = rt._xplanner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ferry-xplan")
        return ex


def _unplanned(rt):
    """rt's groups submitted whose planning has not started (oldest first; the consumer's thread)."""
    q = rt.__dict__.get("_xunplanned")
    return q if q is not None else rt.__dict__.setdefault("_xunplanned", collections.deque())


def _engine_budget(ctx, plan, unit_bytes):
    """(batches a read, group jobs in the engine at once) for a stream of plans like `plan` (one
    batch of `unit_bytes` bytes, only inspected), or None where any size runs at the decoders' rate
    (nothing decoded on the GPU): ferry_plan_budget, which counts every device byte the stream
    holds — the groups in the engine, the one handed out and the next one planned, the decode's
    call slots — against the GPU's free memory less what it keeps free for the caller (a quarter,
    64 MiB at least), two jobs in the engine where they fit, else one; a FerryError saying what
    one batch a read needs and how to lower it where even that does not fit."""
    b = ctx.plan_budget(plan, int(unit_bytes))
    if not b["jobs"]:
        return None
    return max(1, min(_MAX_AUTO_GROUP, b["units"])), b["jobs"]


def _in_engine(rt):
    """rt's group jobs submitted with an engine_jobs limit, oldest first (the planner thread's)."""
    q = rt.__dict__.get("_xin_engine")
    return q if q is not None else rt.__dict__.setdefault("_xin_engine", collections.deque())


def _engine_room(rt, limit):
    """Wait (on the planner thread) until fewer than `limit` of rt's jobs are in the engine. A
    job's error is not raised here: the consumer's wait for its group raises it, in turn."""
    q = _in_engine(rt)
    while q and q[0].done():
        q.popleft()
    while len(q) >= limit:
        _wait_quietly(q.popleft())


def _kick(rt):
    """Start the planning of every group submitted so far, in order."""
    q = _unplanned(rt)
    while q:
        q.popleft()._start()


class _Planned:
    """The job of a group of batches whose rows and plan are made and submitted to the engine on
    the planner thread. Building a batch's plan (a read per variable and step) and ctx.submit take
    milliseconds of CPU a batch; on the consumer's thread that time is GPU idle whenever the
    consumer waits for its training step (loss.item()). Dev box, 20 variables x 4 steps of
    361x720, consumer-thread CPU per batch: 5.9 ms planning there, 0.8 ms with the planner
    thread. The planning starts when the consumer is about to wait for a group (its planning or
    its reads: _resolve), else once it has handed out the group before it (_kick at the end of
    _finish), never at submit: a planner started at submit ran
    Python beside the hand-off of the group before (the GIL is one), and each C call there that
    released the GIL (job.path, job.done) gave it to the planner. Dev box (2 shared cores), 20
    variables of 45x90, a 6 ms step between batches: _submit of a group of 6 took 1.5 ms of wall
    time, 0.05 ms now; next() per batch, one batch a plan: mean 1.12 -> 0.57 ms, p90 1.45 ->
    0.40 ms. The first use of the job (its path, done, wait, stream_wait) fills the group with what the
    planning made (buffers, open stores, rows) and raises its errors."""

    def __init__(self, ds, rt, g, ids, epoch):
        self.g = g
        self.job = None
        self._ready = False
        self._error = None
        self.fut = None
        self._rtx = rt
        self._args = (ds._plan_group, rt, ids, epoch, list(g.sizes))
        _unplanned(rt).append(self)

    def _start(self):
        if self.fut is None:
            fn, rt = self._args[0], self._args[1]
            self.fut = _planner(rt).submit(fn, *self._args[1:])
            self._args = None

    def _resolve(self, raise_errors=True):
        if not self._ready:
            # The consumer is about to wait (for this group's planning or its reads): every group
            # submitted so far, this one and those behind it, is planned now, during that wait.
            # Left to the end of the hand-off, the group behind was planned only once this one's
            # reads were issued, and with two groups in flight (6 batches a plan, prefetch 4) the
            # engine idled meanwhile (the H200's mid-session build, likely with that rule:
            # uncompressed Zarr 23.0 GB/s with 6 batches a plan against 28.0 with one).
            if self.fut is None or not self.fut.done():
                _kick(self._rtx)
            try:
                bufs, job, handles, meta = self.fut.result()
            except BaseException as e:   # noqa: BLE001 — raised by the job's calls, not by cleanup
                self._error, bufs, job, handles, meta = e, [], None, [], None
            if job is not None and not job.done():
                _kick(self._rtx)
            g = self.g
            g.bufs, g.handles, g.stores = bufs, handles, [e[0] for e in handles]
            g.meta = meta
            self.job, self._ready = job, True
        if raise_errors and self._error is not None:
            raise self._error
        return self.job

    @property
    def path(self):
        j = self._resolve()
        return None if j is None else j.path

    def done(self):
        if self.fut is None or not self.fut.done():
            return False
        j = self._resolve()
        return j is None or j.done()

    def wait(self, timeout=None):
        j = self._resolve()
        return None if j is None else j.wait() if timeout is None else j.wait(timeout)

    def stream_wait(self, stream):
        j = self._resolve()
        if j is not None:
            j.stream_wait(stream)

    def cancel(self):
        if self.fut is None:
            _kick(self._rtx)
        if self.fut.cancel():
            self._ready, self.g.bufs, self.g.handles = True, [], []
            return
        j = self._resolve()
        if j is not None:
            j.cancel()
