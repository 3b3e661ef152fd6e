"""What the scans, the store and the backend of ferry.xarray share: a file's format, variable
specifications (_VarSpec) and the index keys xarray hands a backend."""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import warnings

import numpy as np

import ferry
from ferry import _ferry


log = logging.getLogger("ferry.xarray")


# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------
@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic collector off for the block, back on after (only when it
    was on: a caller's gc.disable() stays). An open builds tens of thousands of
    small containers (attributes, encodings, xarray's Variables), which set off
    collections that walk every object of the process; none of them is a cycle
    to collect. With xarray imported that was a fifth of a 2,000-variable open."""
    was = gc.isenabled()
    if was:
        gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _format_of(path: str, ctx=None) -> str:
    """netcdf3, hdf5, zarr or refs (a kerchunk reference set), as the C library's one sniffer
    (ferry_format_detect) sees it (with ctx's remote options for a URL)."""
    try:
        fmt = ctx.format_detect(path) if ctx is not None else _ferry.format_detect(path)
    except ferry.FerryError as e:
        if e.code != _ferry.ENOFORMAT or os.path.isdir(path):
            raise
        fmt = None
    if fmt not in ("netcdf3", "hdf5", "zarr", "refs"):
        raise ValueError(f"{path}: not a netCDF, HDF5, Zarr or kerchunk reference file that ferry can open"
                         + (f" (a {fmt} file: read it with ferry.open)" if fmt else ""))
    return fmt


def _native(dt: np.dtype) -> np.dtype:
    if dt.kind in "SUVOb" or dt.itemsize == 1:
        return dt if dt.kind != "U" else dt.newbyteorder("=")
    return dt.newbyteorder("=")


def _key_triples(key: tuple, shape: tuple):
    """An OUTER backend key -> (triples, post) where post re-indexes what the
    triples read: integer axes are dropped and arrays that are not regular
    progressions are taken from their bounding range. Arrays become slices
    here (xarray's convention); the slices and ints are normalised in C."""
    items, post = [], []
    need_post = False
    for k, n in zip(key, shape):
        if isinstance(k, slice) and (k.step or 1) < 0:   # decompose_indexer gives positive steps; be safe
            k = np.arange(*k.indices(int(n)))
        if isinstance(k, (slice, int, np.integer)):
            items.append(k)
            post.append(slice(None) if isinstance(k, slice) else 0)
            need_post = need_post or not isinstance(k, slice)
            continue
        k = np.asarray(k, dtype=np.int64).ravel()
        k = np.where(k < 0, k + int(n), k)
        d = np.diff(k)
        if k.size == 0:
            items.append(slice(0, 0))
        elif k.size == 1 or ((d > 0).all() and (d == d[0]).all()):
            items.append(slice(int(k[0]), int(k[-1]) + 1, int(d[0]) if k.size > 1 else 1))
        else:
            lo = int(k.min())
            items.append(slice(lo, int(k.max()) + 1))
            post.append(k - lo)
            need_post = True
            continue
        post.append(slice(None))
    triples, _, _ = _ferry.normalize_selection(shape, tuple(items))
    return triples, (post if need_post else None)


def _apply_post(arr, post):
    if post is None:
        return arr
    # one axis at a time: outer (orthogonal) semantics
    out = arr
    ax = 0
    for p in post:
        if isinstance(p, slice):
            ax += 1
        elif isinstance(p, int):
            out = out[(slice(None),) * ax + (p,)]
        else:
            out = out.take(_as_index(p, out), axis=ax)
            ax += 1
    return out


def _as_index(p, like):
    if type(like).__module__.startswith("cupy"):
        import cupy
        return cupy.asarray(p)
    return p


def _norm_key(key: tuple) -> tuple:
    out = []
    for k in key:
        if isinstance(k, slice):
            out.append(("s", k.start, k.stop, k.step))
        elif isinstance(k, (int, np.integer)):
            out.append(("i", int(k)))
        else:
            a = np.asarray(k)
            out.append(("a", a.shape, a.tobytes()))
    return tuple(out)


def _is_time_like(units) -> bool:
    if not isinstance(units, str):
        return False
    u = units.lower()
    return " since " in u or u.strip() in ("days", "hours", "minutes", "seconds", "milliseconds",
                                            "microseconds", "nanoseconds")


# ---------------------------------------------------------------------------
# Variable descriptions
# ---------------------------------------------------------------------------
class _VarSpec:
    """What the store knows about one variable."""

    def __init__(self, name, dims, shape, dtype, attrs, encoding, kind, source):
        self.name = name
        self.dims = tuple(dims)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)          # what a raw read returns (native order)
        self.attrs = attrs
        self.encoding = encoding
        self.kind = kind                      # "ferry" | "strings" | "h5py" | "zarrpy" | "unsupported"
        self.source = source                  # format-specific handle / info
        self.error = None                     # "unsupported": why (the C parser's message)
        self.index = None                     # "ferry": the C dataset's variable index (names may not be UTF-8)
        self.device = -1                      # -1: CPU
        self.gpu_decode = None                # list of transforms applied on the device
        self.out_dtype = self.dtype           # dtype after gpu_decode


# ---------------------------------------------------------------------------
# file identity, reopening (pickle, fork, close)
# ---------------------------------------------------------------------------
def _file_identity(path) -> tuple:
    """What says "the same file, unchanged": device, inode, size, mtime (ns)."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _describe_ident(ident) -> str:
    if ident is None:
        return "a store"
    return f"inode {ident[1]}, {ident[2]} bytes, mtime {ident[3] / 1e9:.6f}"


def _route(path_policy, path, where):
    """The I/O route keyword (auto, cufile, staged, host): path_policy=, as ferry.read and
    read_many name it (there path is the file). path=, its old name in this backend, is taken
    for one more release with a DeprecationWarning."""
    if path is None:
        return path_policy
    if path_policy is not None:
        raise TypeError(f"{where}: path= is the old name of path_policy=; give path_policy= only")
    # attributed to the user's call, past xarray's and ferry's frames: Python shows a
    # DeprecationWarning by default only where __main__ made the call
    level, f = 2, sys._getframe(1)
    while f.f_back is not None and f.f_globals.get("__name__", "").partition(".")[0] in ("ferry", "xarray"):
        level, f = level + 1, f.f_back
    warnings.warn(f"{where}: path= is deprecated, use path_policy= (as ferry.read); path= goes away "
                  "in the next release", DeprecationWarning, stacklevel=level)
    return path
