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

import json
import math
import os

import numpy as np
import torch

from . import _ferry
from ._torch_order import _mix64
from .torch import _BatchStream, _Group, _expand

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


def _decode(raw, cf, dtype):
    """raw stored values (torch, native order) -> floats in `dtype`, fills as NaN."""
    x = raw
    if cf["unsigned"] and raw.dtype in _UNSIGNED:
        x = raw.view(_UNSIGNED[raw.dtype])
    mask = None
    for fv in cf["fills"]:
        if isinstance(fv, float) and math.isnan(fv):
            m = torch.isnan(x) if x.is_floating_point() else None
        else:
            if cf["unsigned"] and not x.is_floating_point() and fv < 0:
                fv = fv + (1 << (8 * raw.element_size()))    # fill given in the signed type
            m = x == fv
        if m is not None:
            mask = m if mask is None else (mask | m)
    out = x.to(dtype)
    if cf["scale"] is not None:
        out = out.mul_(cf["scale"])
    if cf["offset"] is not None:
        out = out.add_(cf["offset"])
    if mask is not None:
        out = out.masked_fill_(mask, float("nan"))
    return out


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
    __slots__ = ("meta", "stores")


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
                  dtype=torch.float32, group=None, transform=None, threads=0)

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

    Batches are dicts: "x" (B, C*input_steps, H, W) and "y" (B, C_y*target_steps, H, W) when
    target_steps > 0, in `dtype`.
    """

    def __init__(self, data, variables=None, *, sample_dim="time", batch_size=16, input_steps=1,
                 target_steps=0, lead=1, target_variables=None, patch=None, patch_mode="random",
                 shuffle=False, seed=0, drop_last=False, device=None, rank=None, world_size=None,
                 prefetch=4, normalize=None, stats_file=None, stats_steps=64, nan_to=None,
                 return_mask=False, return_time=False, dtype=torch.float32, group=None,
                 transform=None, threads=0, block_size=None):
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
        bufs, job, handles = self._plan_steps(rt, steps, names, None)
        try:
            if job is not None:
                job.wait()
            _check_stores(handles)
        finally:
            self._release(rt, _wrap_handles(handles))
        out = {}
        for n in names:
            x = self._decoded(bufs[n], self._vars[n], 1, steps).to(torch.float64)
            c = self._vars[n].channels
            x = x.reshape(len(steps), c, -1).transpose(0, 1).reshape(c, -1)
            mean = torch.nanmean(x, dim=1)
            std = torch.sqrt(torch.nanmean((x - mean[:, None]) ** 2, dim=1))
            out[n] = (mean.cpu().numpy(), std.cpu().numpy())
        return out

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
            e = rt.handle(key, opener)
            seen[key] = e
            e[1] += 1
            handles.append(e)
        return e[0]

    def _runs(self, steps):
        """Sorted global steps -> [(segment, first step, count, position in `steps`)]."""
        steps = np.asarray(steps, dtype=np.int64)
        k = np.searchsorted(self._seg_g0, steps, side="right") - 1
        brk = np.flatnonzero((np.diff(steps) != 1) | (np.diff(k) != 0)) + 1
        out = []
        for lo, hi in zip(np.concatenate(([0], brk)), np.concatenate((brk, [len(steps)]))):
            seg = self._segs[int(k[lo])]
            out.append((seg, int(steps[lo]) - seg.g0 + seg.lo, int(hi - lo), int(lo)))
        return out

    def _plan_steps(self, rt, steps, names, box):
        """Raw buffers {var: (len(steps), *stored sel)} for sorted unique global `steps`, and the job.
        box: None (whole selected fields) or (y0, x0) of a patch."""
        plan = _ferry.Plan()
        handles, seen = [], {}
        bufs = {}
        runs = self._runs(steps)
        for n in names:
            v = self._vars[n]
            sel = list(v.sel)
            if box is not None:
                sel = sel[:-2] + [_sub(sel[-2], box[0], self.patch[0]), _sub(sel[-1], box[1], self.patch[1])]
            counts = [len(range(*s.indices(10 ** 18))) for s in sel]
            tdt = _torch_dtype(v.dtype)
            buf = self._alloc(rt, (len(steps),) + tuple(counts), tdt)
            bufs[n] = buf
            row = int(np.prod(counts, dtype=np.int64)) * v.dtype.itemsize
            if row == 0:
                continue
            dev = buf.device.index if buf.is_cuda else -1
            for seg, first, cnt, pos in runs:
                st = self._store(rt, seg, handles, seen)
                spec = st.specs[n]
                key = (slice(first, first + cnt, 1),) + tuple(sel)
                st._plan_into(plan, spec, key, (buf.data_ptr() + pos * row, cnt * row, dev))
        _check_stores(handles)
        job = rt.ctx.submit(plan) if len(plan) else None
        return bufs, job, handles

    def _decoded(self, raw, v, lead=1, steps=None):
        """Decoded floats of a raw buffer whose first `lead` axes are steps/samples (`steps`: the
        global step of each, shape raw.shape[:lead]; each step decodes with its file's CF)."""
        fdt = self.out_dtype if self.out_dtype.is_floating_point else torch.float32
        cfs = self._cfs.get(v.name, [v.cf])
        if len(cfs) == 1:
            x = _decode(raw, cfs[0], fdt)
        else:
            st = np.asarray(steps, dtype=np.int64).reshape(-1)
            which = self._seg_cf[v.name][np.searchsorted(self._seg_g0, st, side="right") - 1]
            flat = raw.reshape((-1,) + tuple(raw.shape[lead:]))
            x = torch.empty(flat.shape, dtype=fdt, device=raw.device)
            for k in np.unique(which):
                rows = torch.as_tensor(np.flatnonzero(which == k), device=raw.device)
                x[rows] = _decode(flat.index_select(0, rows), cfs[int(k)], fdt)
            x = x.reshape(raw.shape)
        for ax, p in enumerate(v.post):
            if p is not None:
                x = x.index_select(lead + ax, torch.as_tensor(p, device=x.device))
        return x

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
        (lo, hi), = [lay.unit(s) for s in units]
        ids = np.asarray(order[lo:hi] if ids is None else ids, dtype=np.int64)
        g = _XGroup()
        g.units, g.sizes, g.handles, g.job, g.path = units, [hi - lo], [], None, None
        t0, boxes = self._sample_boxes(ids, self._epoch_of_order(order))
        I, K, L = self.input_steps, self.target_steps, self.lead
        offs = list(range(I)) + [I - 1 + L + k for k in range(K)]
        need = t0[:, None] + np.asarray(offs, dtype=np.int64)[None, :]        # (B, I+K) global steps
        names = list(dict.fromkeys(self.variables + self.target_variables))
        if boxes is None:
            steps, inv = np.unique(need.ravel(), return_inverse=True)
            bufs, job, handles = self._plan_steps(rt, steps, names, None)
            g.meta = ("shared", bufs, inv.reshape(need.shape), t0, steps)
            g.stores = [e[0] for e in handles]
            g.job = job
            g.handles = handles
            g.bufs = list(bufs.values())
        else:
            # one plan per batch still: every sample's window, read into its own slot
            plan = _ferry.Plan()
            handles, seen = [], {}
            per = list(zip(need, boxes))
            bufs = {}
            for n in names:
                v = self._vars[n]
                counts = [len(range(*s.indices(10 ** 18))) for s in v.sel[:-2]] + list(self.patch)
                bufs[n] = self._alloc(rt, (len(ids), I + K) + tuple(counts), _torch_dtype(v.dtype))
            for b, (steps_b, box) in enumerate(per):
                uniq = np.asarray(steps_b)          # ascending by construction, no duplicates (lead >= 1)
                runs = self._runs(uniq)
                for n in names:
                    v = self._vars[n]
                    sel = list(v.sel[:-2]) + [_sub(v.sel[-2], int(box[0]), self.patch[0]),
                                              _sub(v.sel[-1], int(box[1]), self.patch[1])]
                    buf = bufs[n]
                    counts = buf.shape[2:]
                    row = int(np.prod(counts, dtype=np.int64)) * v.dtype.itemsize
                    if row == 0:
                        continue
                    dev = buf.device.index if buf.is_cuda else -1
                    base = buf.data_ptr() + b * (I + K) * row
                    # consecutive steps of one file are one read; a gap (lead > 1) splits runs
                    for seg, first, cnt, pos in runs:
                        st = self._store(rt, seg, handles, seen)
                        key = (slice(first, first + cnt, 1),) + tuple(sel)
                        st._plan_into(plan, st.specs[n], key, (base + pos * row, cnt * row, dev))
            _check_stores(handles)
            g.job = rt.ctx.submit(plan) if len(plan) else None
            g.handles = handles
            g.meta = ("own", bufs, None, t0, need)
            g.stores = [e[0] for e in handles]
            g.bufs = list(bufs.values())
        return g

    def _epoch_of_order(self, order):
        """The epoch whose order this is (patch positions are drawn per epoch)."""
        c = self._order_cache
        return c[0][2] if c is not None and c[1] is order else self._epoch

    def _finish(self, g):
        kind, bufs, inv, t0, steps = g.meta
        _check_stores([(st,) for st in g.stores])
        I, K = self.input_steps, self.target_steps
        B = len(t0)
        lead = 1 if kind == "shared" else 2          # (U, ...) or (B, I+K, ...)
        chans = {}
        for n, raw in bufs.items():
            v = self._vars[n]
            x = self._decoded(raw, v, lead, steps)
            x = x.reshape(x.shape[:lead] + (v.channels,) + x.shape[-2:])
            if self._norm is not None and n in self._norm:
                m, s = self._norm[n]
                shape = [1] * lead + [v.channels, 1, 1]
                x = x.sub_(torch.as_tensor(m, dtype=x.dtype, device=x.device).reshape(shape)) \
                     .mul_(torch.as_tensor(1.0 / s, dtype=x.dtype, device=x.device).reshape(shape))
            chans[n] = x

        def stack(names, cols):
            parts = []
            for n in names:
                x = chans[n]
                if kind == "shared":
                    idx = torch.as_tensor(inv[:, cols].reshape(-1), device=x.device)
                    parts.append(x.index_select(0, idx).reshape((B, len(cols)) + x.shape[1:]))
                else:
                    parts.append(x[:, cols[0]:cols[-1] + 1])
            y = torch.cat(parts, dim=2)              # (B, steps, channels of every variable, H, W)
            return y.reshape((B, len(cols) * y.shape[2]) + y.shape[-2:])

        out = {}
        x = stack(self.variables, list(range(I)))
        if self.return_mask:
            out["mask"] = ~torch.isnan(x)
        if self.nan_to is not None:
            x = torch.nan_to_num_(x, nan=float(self.nan_to))
        out["x"] = x
        if K:
            y = stack(self.target_variables, list(range(I, I + K)))
            if self.nan_to is not None:
                y = torch.nan_to_num_(y, nan=float(self.nan_to))
            out["y"] = y
        if self.return_time:
            out["time"] = torch.as_tensor(self._times[t0], device=x.device)
        if self.transform is not None:
            out = self.transform(out)
        return [out]

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


def _sub(s, start, n):
    """Entries start..start+n of what slice s selects, as a slice of the file's axis."""
    st = s.step or 1
    return slice(s.start + start * st, s.start + (start + n) * st, st)


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
