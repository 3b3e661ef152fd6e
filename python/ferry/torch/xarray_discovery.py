"""XarrayDataset's discovery: the variables of an xarray Dataset, the files and stores behind them
(ferry's backend arrays, dask graphs of stored chunks) and the sample dimension."""
from __future__ import annotations

import os

import numpy as np

from .sources import _expand



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
    from ..xarray.array import FerryBackendArray
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
    from ..xarray.array import FerryBackendArray
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
    from ..xarray.backend import FerryBackendEntrypoint
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
            "offset": None if offset is None else float(np.asarray(offset).ravel()[0]),
            "compute": _compute_dtype(attrs, dtype, unsigned)}


def _compute_dtype(attrs, dtype, unsigned):
    """The float type xarray's mask and scale/offset coders compute in (their
    _choose_float_dtype: float64 for float64 scale/offset or an int32, float32 for float32 ones),
    as a name; the decode computes in it and only then casts to the batch's dtype, so a float32
    batch equals xarray's decode cast to float32. None: nothing to scale."""
    if attrs.get("scale_factor") is None and attrs.get("add_offset") is None:
        return None
    dt = np.dtype(dtype)
    if unsigned:
        dt = np.dtype(f"u{dt.itemsize}")
    m = {k: (np.asarray(attrs[k]).ravel()[0] if np.ndim(attrs[k]) else attrs[k])
         for k in ("scale_factor", "add_offset") if attrs.get(k) is not None}
    try:
        from xarray.coding.variables import _choose_float_dtype
        return np.dtype(_choose_float_dtype(dt, m)).name
    except Exception:  # noqa: BLE001 — an xarray without it: float64, what it picks for CF packing
        return "float64"


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


def _check_stores(handles):
    """Every file a batch reads is still the one discovery (and its store) parsed: a file replaced
    since would be read with the old metadata. Raises the store's FerryError."""
    for e in handles:
        e[0]._check_unchanged()


class _wrap_handles:
    def __init__(self, handles):
        self.handles = handles


class _XarrayDiscovery:
    """XarrayDataset's discovery: the variables, their files and chunks, the sample
    dimension's spacing."""

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
        from ..xarray.common import _file_identity
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
