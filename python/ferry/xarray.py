"""xarray backend: ``xr.open_dataset(path, engine="ferry", device=0)``.

Metadata and coordinates on the CPU, data variables read by ferry's engine
straight into GPU memory (cupy arrays) or, with ``device="cpu"``, into numpy.

Formats
  netCDF classic (CDF-1/2/5)   ferry's C parser (ferry._ferry.Dataset)
  Zarr v2 / v3                 ferry's C parser
  netCDF-4 / HDF5              h5py for metadata and chunk tables (contiguous
                               and chunked layouts; shuffle, deflate, zstd,
                               fletcher32; fill values; big-endian), the data
                               through the engine as explicit extents
                               (Plan.extent). Variables the engine cannot read
                               (compact layout, variable-length strings,
                               unsupported filters) are read by h5py on the CPU
                               and then copied; this is logged on the
                               "ferry.xarray" logger and recorded in the
                               variable's ``encoding["ferry_reader"]``.
                               Zarr arrays ferry cannot read (types, codecs,
                               chunk grids it lacks) go the same way through
                               zarr-python; without zarr installed they keep
                               ferry's description (dims, attributes) and
                               loading them raises ferry.FerryError with the
                               parser's message (ferry_reader "none").

Laziness: every variable is a BackendArray with OUTER indexing; a read becomes
one plan that touches only the chunks / records the selection needs.
``Dataset.load()`` (and ``.compute()``) of a dataset opened here reads all of
its lazy variables with ONE plan (one engine run, many reads in flight).

CF decoding (mask/scale/times/strings) is xarray's own: the backend hands
xarray the attributes the netCDF4/h5netcdf/zarr backends hand it. For data
variables on a GPU, masking and scaling are applied to the cupy array with the
exact parameters xarray's coders choose (same dtypes, same operations).

Device: ``"cpu"`` by default, for open_dataset and open_mfdataset alike (numpy,
as every xarray engine); ``device=0`` / ``"cuda:N"`` puts data variables on
that GPU, and under dask their chunks are cupy with cupy meta
(_install_dask_hook). netCDF-4 encodings carry preferred_chunks from the HDF5
chunks, so ``chunks={}`` follows them as with h5netcdf.

Processes: a FerryStore pickles as its open arguments plus what it parsed and
reopens by path (with the new process's context) in another process, in a
forked child and after close(); the file must still be the one parsed (inode,
size, mtime), else FerryError. Every engine run is bracketed by that check.

Input: local paths only (str, bytes, os.PathLike, file://, fsspec mappers and
zarr stores of local directories); remote URLs are FerryError. Damaged
netCDF-4: any object, attribute or chunk index h5py cannot read is FerryError
naming the file and the object (never a dropped variable, never h5py's own
exception).
"""
from __future__ import annotations

import base64
import collections
import contextlib
import itertools
import json
import logging
import os
import pickle
import struct
import sys
import threading
import weakref
from typing import Any, Iterable

import numpy as np
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.backends.common import AbstractDataStore
from xarray.backends.store import StoreBackendEntrypoint
from xarray.core import indexing
from xarray.core.variable import Variable

import ferry
from ferry import _ferry

log = logging.getLogger("ferry.xarray")

__all__ = ["FerryBackendEntrypoint", "FerryStore", "FerryBackendArray", "cupy_meta", "open_mfdataset"]

_H5_HIDDEN = {"CLASS", "DIMENSION_LIST", "NAME", "REFERENCE_LIST", "_Netcdf4Dimid", "_Netcdf4Coordinates",
              "_nc3_strict", "_NCProperties", "_SuperblockVersion", "_IsNetcdf4"}
_NC_DIM_ONLY = b"This is a netCDF dimension but not a netCDF variable"
_NON_COORD = "_nc4_non_coord_"


# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------
def _format_of(path: str) -> str:
    """netcdf3, hdf5 or zarr, as the C library's one sniffer (ferry_format_detect) sees it."""
    try:
        fmt = _ferry.format_detect(path)
    except ferry.FerryError as e:
        if e.code != _ferry.ENOFORMAT or os.path.isdir(path):
            raise
        fmt = None
    if fmt not in ("netcdf3", "hdf5", "zarr"):
        raise ValueError(f"{path}: not a netCDF, HDF5 or Zarr file that ferry can open"
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
        self.kind = kind                      # "ferry" | "h5" | "h5py" | "zarrpy" | "unsupported"
        self.source = source                  # format-specific handle / info
        self.error = None                     # "unsupported": why (the C parser's message)
        self.index = None                     # "ferry": the C dataset's variable index (names may not be UTF-8)
        self.device = -1                      # -1: CPU
        self.gpu_decode = None                # list of transforms applied on the device
        self.out_dtype = self.dtype           # dtype after gpu_decode


# ---------------------------------------------------------------------------
# HDF5 / netCDF-4 through h5py
# ---------------------------------------------------------------------------
def _h5_attr_value(v):
    import h5py
    if isinstance(v, h5py.Empty):
        return "" if v.dtype.kind == "S" else None
    if isinstance(v, (bytes, np.bytes_)):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(v)
    if isinstance(v, np.ndarray):
        if v.dtype.kind == "S":
            vals = [bytes(x).decode("utf-8", "replace") for x in v.ravel()]
            return vals[0] if len(vals) == 1 else vals
        if v.dtype.kind == "O":
            vals = [x.decode("utf-8") if isinstance(x, bytes) else x for x in v.ravel()]
            return vals[0] if len(vals) == 1 else vals
        if v.ndim == 1 and v.shape[0] == 1:
            return v[0]
        if v.ndim == 0:
            return v[()]
    return v


def _h5_attrs(obj) -> dict:
    out = {}
    for k in obj.attrs.keys():
        if k in _H5_HIDDEN:
            continue
        try:
            v = obj.attrs[k]
        except Exception as e:  # noqa: BLE001 — netCDF4 and h5netcdf refuse it too
            raise _h5_error(obj.file.filename, f"{obj.name}: attribute {k!r}", e) from None
        v = _h5_attr_value(v)
        if v is None:
            continue
        out[k] = v
    return out


class _H5Source:
    """Layout of one HDF5 dataset as ferry needs it."""

    def __init__(self, path, dset, dtype: np.dtype):
        import h5py
        self.path = path
        self.dset = dset
        self.stored = dset.dtype
        self.itemsize = dtype.itemsize
        self.swap = self.stored.byteorder == ">" and self.stored.itemsize > 1
        self.swap_size = self.stored.itemsize // 2 if self.stored.kind == "c" else self.stored.itemsize
        self.shape = tuple(dset.shape)
        dcpl = dset.id.get_create_plist()
        self.layout = dcpl.get_layout()
        self.filters = []
        self.supported = True
        self.why = ""
        for i in range(dcpl.get_nfilters()):
            code, flags, vals, name = dcpl.get_filter(i)
            codec = _ferry.hdf5_filter_codec(code, vals, self.stored.itemsize)   # C's table of HDF5 filters
            if codec is not None:
                self.filters.append(codec)
            else:
                self.supported = False
                self.why = f"HDF5 filter {code} ({name.decode(errors='replace') if isinstance(name, bytes) else name})"
        try:
            if dcpl.get_external_count() > 0:
                self.supported = False
                self.why = "external storage"
        except AttributeError:
            pass
        if self.layout == h5py.h5d.COMPACT:
            self.supported, self.why = False, "compact layout"
        elif self.layout not in (h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED):
            self.supported, self.why = False, "virtual/unknown layout"
        if self.stored.kind not in "biufcS" or self.stored.hasobject:
            self.supported, self.why = False, f"dtype {self.stored}"
        if self.supported and len(self.filters) + (1 if self.swap else 0) > _ferry.MAX_CODECS:
            self.supported, self.why = False, "too many filters"
        self.fill = None
        if self.supported:
            fv = dset.fillvalue
            fb = np.array(fv, dtype=self.stored).astype(_native(self.stored)).tobytes()
            self.fill = fb
            if len(fb) > 16:
                self.supported, self.why = False, "fill value wider than 16 bytes"
        self.chunks = tuple(dset.chunks) if dset.chunks else None
        self.file_size = os.path.getsize(path)
        self._table = None
        self._lock = threading.Lock()
        self.offset = self.nbytes = None
        if self.layout == h5py.h5d.CONTIGUOUS and self.supported:
            self.offset = dset.id.get_offset()
            self.nbytes = dset.id.get_storage_size()

    def table(self):
        """The chunk table (ferry_plan_layout's), built once from h5py's chunk_iter."""
        with self._lock:
            if self._table is None:
                nd = len(self.shape)
                if self.chunks is None:     # contiguous: one chunk, the whole array (absent if never written)
                    rows = [] if self.offset is None or 0 in self.shape else [((0,) * nd, self.offset, self.nbytes, 0)]
                else:
                    rows = []
                    dsid = self.dset.id
                    if hasattr(dsid, "chunk_iter"):
                        dsid.chunk_iter(lambda i: rows.append((i.chunk_offset, i.byte_offset, i.size, i.filter_mask)))
                    else:
                        for i in range(dsid.get_num_chunks()):
                            i = dsid.get_chunk_info(i)
                            rows.append((i.chunk_offset, i.byte_offset, i.size, i.filter_mask))
                n = len(rows)
                origins = np.array([r[0] for r in rows], dtype=np.uint64).reshape(n, nd)
                mask = np.array([r[3] for r in rows], dtype=np.uint32)
                # HDF5 numbers filters in the order they encode; the layout's
                # codecs are in decoding order
                nf = len(self.filters)
                skips = np.zeros(n, dtype=np.uint32)
                for i in range(nf):
                    skips |= ((mask >> i) & 1) << (nf - 1 - i)
                self._table = _ferry.chunk_table(self.shape, self.chunks or self.shape, origins,
                                                 np.array([r[1] for r in rows], dtype=np.uint64),
                                                 np.array([r[2] for r in rows], dtype=np.uint64), skips)
            return self._table

    def _layout(self, label: str):
        """The arguments of this variable's layout (Plan.layout, _ferry.layout) but the selection."""
        return ((self.shape, self.chunks or self.shape, self.itemsize),
                dict(table=self.table(), path=self.path, codecs=self.filters[::-1],
                     swap=self.swap_size if self.swap else 0, fill=self.fill, label=label, file_size=self.file_size))

    def add_to_plan(self, plan: ferry.Plan, triples, dst, label: str):
        """Plan the selection `triples` into dst (C order): ferry_plan_layout."""
        args, kw = self._layout(label)
        plan.layout(dst, *args, selection=triples if self.shape else None, **kw)

    def row_layout(self, label: str):
        """The layout add_to_plan plans, described once (_ferry.layout), for Plan.read_rows."""
        with self._lock:
            lay = getattr(self, "_row_layout", None)
        if lay is None:
            args, kw = self._layout(label)
            lay = _ferry.layout(*args, **kw)
            with self._lock:
                self._row_layout = lay
        return lay


def _h5_dims(dset, dimid_names: dict) -> tuple | None:
    if dset.ndim == 0:
        return ()
    if "DIMENSION_LIST" in dset.attrs:
        names = []
        try:
            dl = dset.attrs["DIMENSION_LIST"]
            for refs in dl:
                ref = refs[0] if len(refs) else None
                if ref is None:
                    return None
                names.append(dset.file[ref].name.rsplit("/", 1)[-1])
            return tuple(n[len(_NON_COORD):] if n.startswith(_NON_COORD) else n for n in names)
        except Exception:  # noqa: BLE001 — malformed references: use phony dims
            return None
    if "_Netcdf4Coordinates" in dset.attrs:
        ids = [int(i) for i in np.atleast_1d(dset.attrs["_Netcdf4Coordinates"])]
        if all(i in dimid_names for i in ids):
            return tuple(dimid_names[i] for i in ids)
    cls = dset.attrs.get("CLASS", b"")
    if cls == b"DIMENSION_SCALE" and dset.ndim == 1:
        n = dset.name.rsplit("/", 1)[-1]
        return (n[len(_NON_COORD):] if n.startswith(_NON_COORD) else n,)
    return None


def _h5_error(path: str, what: str, e: BaseException) -> ferry.FerryError:
    """h5py's exception (damaged or truncated file) as FerryError naming the file and the object."""
    msg = str(e) or type(e).__name__
    return ferry.FerryError(_ferry.EFORMAT, f"{path}: {what}: {msg}")


def _h5_member(grp, k: str, path: str):
    """grp[k], or FerryError naming the object: h5py's Group.items() yields None
    for a member it cannot open, which would drop the variable without a word."""
    try:
        obj = grp[k]
    except Exception as e:  # noqa: BLE001
        raise _h5_error(path, f"cannot open object {grp.name.rstrip('/')}/{k}", e) from None
    if obj is None:
        raise ferry.FerryError(_ferry.EFORMAT, f"{path}: cannot open object {grp.name.rstrip('/')}/{k}")
    return obj


def _h5_open(path: str):
    import h5py
    try:
        return h5py.File(path, "r")
    except Exception as e:  # noqa: BLE001 — truncated, damaged, not HDF5 after all
        raise _h5_error(path, "cannot open as HDF5/netCDF-4", e) from None


def _h5_scan(path: str, group: str | None):
    """(specs, attrs, dims, unlimited, h5file) of an HDF5 / netCDF-4 group. Any
    object or attribute h5py cannot read is a FerryError naming it (netCDF4 and
    h5netcdf refuse such files too): a variable is never silently dropped."""
    f = _h5_open(path)
    try:
        return _h5_scan_open(f, path, group)
    except ferry.FerryError:
        f.close()
        raise
    except Exception as e:  # noqa: BLE001
        f.close()
        raise _h5_error(path, "damaged HDF5 metadata", e) from None


def _h5_scan_open(f, path: str, group: str | None):
    import h5py
    # Every object header of the file, as netCDF4 reads them all at open: a damaged
    # group elsewhere in the file makes netCDF4 refuse the file, so ferry does too.
    try:
        f.visit(lambda name: None)
    except Exception as e:  # noqa: BLE001
        raise _h5_error(path, "damaged HDF5 metadata", e) from None
    g = f
    if group not in (None, "", "/"):
        node = f
        for part in group.strip("/").split("/"):
            if part not in node:
                raise ferry.FerryError(_ferry.ENOTFOUND, f"{path}: no group {group!r} "
                                       f"({node.name!r} has {sorted(node.keys())!r})")
            node = _h5_member(node, part, path)
            if not isinstance(node, h5py.Group):
                raise ferry.FerryError(_ferry.ENOTFOUND, f"{path}: {group!r} is not a group")
        g = node
    # dimension ids of every dimension scale visible from this group
    dimid_names = {}
    dims, unlimited = {}, set()
    node = g
    chain = []
    while True:
        chain.append(node)
        if node.name == "/":
            break
        node = node.parent
    members = {}
    for grp in reversed(chain):
        for k in grp.keys():
            obj = _h5_member(grp, k, path)
            if grp is g:
                members[k] = obj
            if isinstance(obj, h5py.Dataset) and obj.attrs.get("CLASS", b"") == b"DIMENSION_SCALE":
                name = k[len(_NON_COORD):] if k.startswith(_NON_COORD) else k
                if "_Netcdf4Dimid" in obj.attrs:
                    dimid_names[int(np.asarray(obj.attrs["_Netcdf4Dimid"]).ravel()[0])] = name
                if grp is g and obj.ndim >= 1:
                    dims[name] = int(obj.shape[0])
                    if obj.maxshape and obj.maxshape[0] is None:
                        unlimited.add(name)
    specs = []
    phony = 0
    for k, obj in members.items():
        if not isinstance(obj, h5py.Dataset):
            continue
        try:
            nm = obj.attrs.get("NAME", b"")
            if isinstance(nm, bytes) and nm.startswith(_NC_DIM_ONLY):
                continue
            name = k[len(_NON_COORD):] if k.startswith(_NON_COORD) else k
            vd = _h5_dims(obj, dimid_names)
            if vd is None:
                vd = tuple(f"phony_dim_{phony + i}" for i in range(obj.ndim))
                phony += obj.ndim
            for d, n in zip(vd, obj.shape):
                dims.setdefault(d, int(n))
            attrs = _h5_attrs(obj)
            stored = obj.dtype
            encoding = {"source": path, "original_shape": tuple(obj.shape)}
            vlen = h5py.check_dtype(vlen=stored)
            if vlen is str or vlen is bytes or stored.kind == "O":
                dtype = np.dtype(object)
                src, kind, why = obj, "h5py", "variable-length strings"
                encoding["dtype"] = str if vlen is str else stored
            else:
                dtype = _native(stored)
                encoding["dtype"] = stored
                s = _H5Source(path, obj, dtype)
                if s.supported:
                    src, kind, why = s, "h5", ""
                else:
                    src, kind, why = obj, "h5py", s.why
            if obj.chunks:
                encoding["chunksizes"] = tuple(obj.chunks)
                encoding["preferred_chunks"] = dict(zip(vd, obj.chunks))   # as h5netcdf: chunks={} follows them
                encoding["contiguous"] = False
                if obj.compression == "gzip":
                    encoding["zlib"] = True
                    encoding["complevel"] = obj.compression_opts
                encoding["shuffle"] = bool(obj.shuffle)
                encoding["fletcher32"] = bool(obj.fletcher32)
            else:
                encoding["contiguous"] = True
                encoding["chunksizes"] = None
            encoding["ferry_reader"] = "engine" if kind == "h5" else "h5py"
            if kind == "h5py":
                log.info("%s: variable %s is read by h5py on the CPU (%s)", path, name, why)
            specs.append(_VarSpec(name, vd, obj.shape, dtype, attrs, encoding, kind, src))
        except ferry.FerryError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _h5_error(path, f"variable {obj.name}", e) from None
    gattrs = _h5_attrs(g)
    return specs, gattrs, dims, unlimited, f


def _h5_groups(path: str) -> list:
    import h5py
    out = []
    with _h5_open(path) as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Group):
                out.append("/" + name)
        try:
            f.visititems(visit)
        except Exception as e:  # noqa: BLE001
            raise _h5_error(path, "damaged HDF5 metadata", e) from None
    return ["/"] + out


# ---------------------------------------------------------------------------
# netCDF classic and Zarr through ferry's C parsers
# ---------------------------------------------------------------------------
def _fill_value(raw: bytes | None, stored: np.dtype | None):
    """The C parser's fill element (Dataset.fill: little-endian bytes, decoded
    from Zarr's fill_value once, in zarr.c) as a numpy scalar of the stored type."""
    if raw is None or stored is None:
        return None
    return np.frombuffer(raw, dtype=stored.newbyteorder("<")).astype(stored)[0]


def _zarr3_attr_fill(value, dt: np.dtype):
    """xarray's zarr v3 `_FillValue` attribute encoding, decoded (FillValueCoder)."""
    if dt.kind == "f" and isinstance(value, (str, bytes)):
        return struct.unpack("<d", base64.standard_b64decode(value))[0]
    if dt.kind == "c" and isinstance(value, (list, tuple)) and len(value) == 2:
        re_ = struct.unpack("<d", base64.standard_b64decode(value[0]))[0]
        im_ = struct.unpack("<d", base64.standard_b64decode(value[1]))[0]
        return complex(re_, im_)
    if dt.kind == "b":
        return bool(value)
    if dt.kind in "iu" and isinstance(value, (int, float)):
        return int(value)
    if dt.kind == "S" and isinstance(value, str):
        return base64.standard_b64decode(value)
    return value


def _engine_readable(typestr: str) -> bool:
    """Fixed-size numpy types the engine can move as bytes even when ferry names them "other"."""
    try:
        return np.dtype(typestr).kind == "U"
    except TypeError:
        return False


def _zarr_py_spec(path: str, group: str | None, name: str, store: dict, shape: tuple, why: str | None = None):
    """A variable ferry's parser does not read (variable-length strings, Zarr v3
    string/bytes types, codecs, filters or chunk grids ferry lacks; `why` is the
    parser's message): metadata and data through zarr-python, as xarray's zarr
    backend has them. None (and a log line) when zarr is not importable or cannot
    open the array either; the caller then keeps ferry's description. store: the
    C parser's Dataset.store_info (Zarr format, and whether the node is an array)."""
    try:
        import zarr
    except ImportError:
        log.warning("%s: variable %s cannot be read by ferry (%s) and zarr is not installed: "
                    "loading it raises FerryError", path, name, why or "its type")
        return None
    from xarray import coding
    g = (group or "").strip("/")
    apath = f"{g}/{name}" if g else name
    if store["is_array"]:   # a store of one array: it is the node itself
        apath = g
    try:
        arr = zarr.open_array(store=path, path=apath, mode="r")
    except Exception as e:  # noqa: BLE001 — zarr lacks it too: ferry's description, reads raise
        log.warning("%s: variable %s cannot be read by ferry (%s) nor opened by zarr (%s): "
                    "loading it raises FerryError", path, name, why or "its type", e)
        return None
    attrs = dict(arr.attrs)
    zv = store["zarr_format"]
    if zv == 3:
        d = tuple(arr.metadata.dimension_names or ())
    else:
        d = tuple(attrs.get("_ARRAY_DIMENSIONS", ()))
    attrs.pop("_ARRAY_DIMENSIONS", None)
    if len(d) != len(arr.shape):
        raise KeyError(f"{path}: Zarr array {name} has no dimension names")
    dtype = arr.dtype
    try:
        ser = arr.serializer
        if dtype.kind != "T" and ser is not None and ser.to_dict()["name"] == "vlen-utf8":
            dtype = coding.strings.create_vlen_dtype(str)
    except Exception:  # noqa: BLE001 — v2 arrays have no serializer
        if dtype.kind == "O":
            dtype = coding.strings.create_vlen_dtype(str)
    encoding = {"source": path, "original_shape": tuple(arr.shape), "chunks": tuple(arr.chunks),
                "preferred_chunks": dict(zip(d, arr.chunks)), "ferry_reader": "zarr-python"}
    if dtype.kind == "T":
        encoding["dtype"] = dtype
    if zv == 2:
        if arr.fill_value is not None:
            attrs["_FillValue"] = arr.fill_value
    else:
        encoding["fill_value"] = arr.fill_value
        if "_FillValue" in attrs:
            attrs["_FillValue"] = _zarr3_attr_fill(attrs["_FillValue"], np.dtype(dtype))
    log.info("%s: variable %s (%s) is read by zarr-python on the CPU%s", path, name, dtype,
             f" ({why})" if why else "")
    return _VarSpec(name, d, arr.shape, dtype, attrs, encoding, "zarrpy", arr)


def _c_variables(ds) -> list:
    """[(index, info dict | None, raw name | None)]: ds.variables(), or one by one
    when the C parser hands over bytes that are not UTF-8 (a Zarr member named by
    a non-UTF-8 directory): that variable comes back as (i, None, its raw name)
    instead of one UnicodeDecodeError making the whole store unreadable."""
    try:
        return [(i, v, None) for i, v in enumerate(ds.variables())]
    except UnicodeDecodeError:
        pass
    out = []
    for i in itertools.count():
        try:
            out.append((i, ds.variable(i), None))
        except IndexError:
            return out
        except UnicodeDecodeError as e:
            out.append((i, None, bytes(e.object)))
    return out


def _utf8_path(path: str) -> bool:
    try:
        os.fsencode(path).decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _c_scan(path: str, fmt: str, group: str | None, ctx, cpath: str | None = None):
    """cpath: what the C parser opens when `path` itself cannot be handed to it
    (a /proc/self/fd alias of a path that is not UTF-8)."""
    ds = ferry.Dataset(ctx, cpath or path, None, group if fmt == "zarr" else None)
    actual = ds.format
    gattrs = ferry.decode_attrs(ds.attrs, actual)
    dims_j = json.loads(ds.dims)
    dims = {k: int(v.get("size", 0)) if isinstance(v, dict) else int(v) for k, v in dims_j.items()}
    unlimited = {k for k, v in dims_j.items() if isinstance(v, dict) and v.get("unlimited")}
    store = ds.store_info
    zv = store["zarr_format"]
    specs = []
    for index, v, raw in _c_variables(ds):
        if v is None:
            name = raw.decode("utf-8", "surrogateescape")
            base = os.fsencode(os.path.join(path, group.strip("/")) if group else path)
            sp = None
            if actual == "zarr" and os.path.isdir(os.path.join(base, raw)):
                sp = _zarr_py_spec(path, group, name, store, (), "its name is not UTF-8")
            if sp is None:
                raise ferry.FerryError(_ferry.EFORMAT, f"{path}: variable {name!r} (#{index}): its metadata is "
                                       "not UTF-8" + (" and zarr-python cannot read it" if actual == "zarr" else ""))
            for dn, n in zip(sp.dims, sp.shape):
                dims.setdefault(dn, int(n))
            specs.append(sp)
            continue
        name = v["name"]
        err = v.get("error")    # the C parser describes it but cannot read it
        if actual == "zarr" and (err or (v["dtype"] == "other" and not _engine_readable(v["typestr"]))):
            sp = _zarr_py_spec(path, group, name, store, tuple(v["shape"]), err)
            if sp is not None:
                for dn, n in zip(sp.dims, sp.shape):
                    dims.setdefault(dn, int(n))
                specs.append(sp)
                continue
            if not err:
                continue
        attrs = ferry.decode_attrs(v["attrs"], actual)
        d = json.loads(v["dims"] or "null")
        if actual == "zarr":
            if d is None:
                d = attrs.get("_ARRAY_DIMENSIONS")
            attrs.pop("_ARRAY_DIMENSIONS", None)
        if d is None and not v["shape"]:
            d = []
        if d is None:
            d = [f"dim_{i}" for i in range(len(v["shape"]))] if actual != "zarr" else None
        if d is None:
            raise KeyError(f"{path}: Zarr array {name} has no dimension names (_ARRAY_DIMENSIONS)")
        shape = tuple(v["shape"])
        typestr = v["typestr"]
        try:
            if err and typestr[:1] not in "<>|=":   # written in the metadata's own terms, not numpy's
                raise TypeError(typestr)
            stored = np.dtype(typestr)
            dtype = _native(stored)
            ok = not err and (v["dtype"] != "other" or _engine_readable(typestr)) and stored.kind in "biufcSUmM"
        except (TypeError, ValueError, SyntaxError):
            stored = dtype = None
            ok = False
        encoding = {"source": path, "original_shape": shape, "ferry_reader": "engine"}
        if stored is not None:
            encoding["dtype"] = stored
        if actual == "zarr":
            encoding["chunks"] = tuple(v["chunks"])
            encoding["preferred_chunks"] = dict(zip(d, v["chunks"]))
            fv = _fill_value(ds.fill(index), stored)
            if zv == 2:
                if fv is not None:
                    attrs["_FillValue"] = fv
            else:
                if stored is not None:
                    encoding["fill_value"] = fv
                if "_FillValue" in attrs and stored is not None:
                    attrs["_FillValue"] = _zarr3_attr_fill(attrs["_FillValue"], stored)
        if not ok:
            kind = "zarrpy" if actual == "zarr" and not err else "unsupported"
            encoding["ferry_reader"] = "zarr-python" if kind == "zarrpy" else "none"
            if kind == "zarrpy":
                log.info("%s: variable %s (%s) is read by zarr-python on the CPU", path, name, typestr)
            if dtype is None:   # a type numpy has no name for: an opaque placeholder keeps the open lazy
                dtype = np.dtype(object) if kind == "zarrpy" else np.dtype("V1")
            if err:
                encoding["ferry_error"] = err
        else:
            kind = "ferry"
        for dn, n in zip(d, shape):
            dims.setdefault(dn, int(n))
        spec = _VarSpec(name, d, shape, dtype, attrs, encoding, kind, ds)
        spec.error = err
        spec.index = index
        specs.append(spec)
    if actual == "zarr":
        gattrs = {k: v for k, v in gattrs.items() if not k.lower().startswith("_nc")}
    return specs, gattrs, dims, unlimited, ds


# ---------------------------------------------------------------------------
# file identity, reopening (pickle, fork, close)
# ---------------------------------------------------------------------------
def _file_identity(path) -> tuple:
    """What says "the same file, unchanged": device, inode, size, mtime (ns)."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _h5_identity(h5file, path) -> tuple:
    """Identity of the file h5py holds open, checked against what `path` names now:
    the engine reads chunk bytes by path, so both must be one file."""
    try:
        st = os.fstat(int(h5file.id.get_vfd_handle()))
        held = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except Exception:  # noqa: BLE001 — a driver without a descriptor: the path's stat
        held = _file_identity(path)
    if _file_identity(path) != held:
        h5file.close()
        raise ferry.FerryError(_ferry.EIO, f"{path}: the file was replaced while it was being opened")
    return held


def _describe_ident(ident) -> str:
    if ident is None:
        return "a store"
    return f"inode {ident[1]}, {ident[2]} bytes, mtime {ident[3] / 1e9:.6f}"


_reopen_mutex = threading.Lock()


def _reopen_lock():
    return _reopen_mutex


def _new_reopen_lock_in_child():
    # a lock held by another thread at fork() would stay held forever in the child
    global _reopen_mutex
    _reopen_mutex = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_reopen_lock_in_child)

# Stores reopened from pickles, per process: a dask worker unpickles the same
# store for many tasks, and should parse the file once (CachingFileManager's
# cache does the same for xarray's engines). Weak, plus a few strong references
# so that a store survives between two tasks.
_STORES: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
_RECENT: collections.deque = collections.deque(maxlen=32)


def _store_key(args, expect):
    try:
        return pickle.dumps((args, expect), protocol=4)
    except Exception:  # noqa: BLE001 — unpicklable decoder objects: no sharing
        return None


def _remember_store(args, expect, store):
    key = _store_key(args, expect)
    if key is not None:
        with _reopen_lock():
            _STORES.setdefault(key, store)


def _reopen_store(args, expect):
    """Unpickling a FerryStore: the store of this process for these arguments, or a
    new one opened by path and checked against what the pickling process saw."""
    key = _store_key(args, expect)
    with _reopen_lock():
        s = _STORES.get(key) if key is not None else None
    if s is not None:
        return s
    filename, group, device, threads, path = args[:5]
    mask_and_scale, decode_times, decode_timedelta, decode = args[5:9]
    s = FerryStore(filename, group=group, device=device, threads=threads, path=path, decode=decode,
                   mask_and_scale=mask_and_scale, decode_times=decode_times, decode_timedelta=decode_timedelta,
                   _expect=expect)
    with _reopen_lock():
        if key is not None:
            s = _STORES.setdefault(key, s)
        _RECENT.append(s)
    return s


# ---------------------------------------------------------------------------
# the store
# ---------------------------------------------------------------------------
class FerryStore(AbstractDataStore):
    """A file or store opened for xarray; reads go through one ferry Context.

    Like xarray's CachingFileManager, a store is a recipe as much as a handle:
    it pickles as its open arguments plus what it found (the file's identity
    and every variable's shape and dtype), reopens by path in a new process
    (or after ``close()``, or in a forked child, whose inherited context and
    HDF5 handles belong to the parent) with that process's default context,
    and refuses with FerryError when the file it finds is not the one it
    parsed (replaced, or changed in place)."""

    def __init__(self, filename: str, *, group: str | None = None, device: Any = "cpu", threads: int = 0,
                 path: str | None = None, decode: str | None = None, mask_and_scale: bool = True,
                 decode_times: Any = True, decode_timedelta: Any = None, ctx=None, lock=None, _expect=None):
        self.filename = os.fspath(filename)
        # lock= as xarray's engines take it: held around every read when given (a
        # lock is not pickled: another process has its own)
        self._user_lock = lock if hasattr(lock, "acquire") and hasattr(lock, "release") else None
        self.group = group
        self.device = ferry.parse_device(device)
        self.threads = int(threads or 0)
        self.path_policy = path
        self.decode = decode   # where compressed chunks decode: None/"auto", "gpu" (nvCOMP), "cpu"
        self._ctx = ctx          # None: the default context of whichever process reads
        self._decoding = (mask_and_scale, decode_times, decode_timedelta)
        if self.device >= 0:
            # only a store with GPU variables needs cupy-typed dask chunks: importing
            # ferry.xarray (xarray's engine guessing does) changes nothing in xarray
            _install_dask_hook()
        if self.device >= 0 and ferry._cupy() is None:
            raise ImportError(f"engine='ferry' with device={device!r} returns cupy arrays: install cupy "
                              "(or use device='cpu')")
        self._closed = False
        self._h5 = None
        self._cds = None
        self._alias = self._alias_fd = None
        self._open(_expect)

    @property
    def ctx(self):
        return self._ctx if self._ctx is not None else ferry.default_context()

    def _open(self, expect=None):
        """Parse the file (again): specs, attributes, dimensions and its identity."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._cache: dict = {}
        self.format = _format_of(self.filename)
        if self.format == "hdf5":
            specs, gattrs, dims, unlimited, self._h5 = _h5_scan(self.filename, self.group)
            self._ident = _h5_identity(self._h5, self.filename)
        else:
            before = _file_identity(self.filename) if self.format != "zarr" else None
            cpath = None
            if not _utf8_path(self.filename) and os.path.isdir("/proc/self/fd"):
                # the extension hands C strings back as UTF-8: give the parser an
                # ASCII name of the same file (the descriptor lives as long as the store)
                self._alias_fd = os.open(self.filename, os.O_RDONLY | os.O_CLOEXEC)
                cpath = f"/proc/self/fd/{self._alias_fd}"
            self._alias = cpath
            specs, gattrs, dims, unlimited, self._cds = _c_scan(self.filename, self.format, self.group, self.ctx,
                                                                cpath)
            self.format = self._cds.format
            self._ident = before
            if before is not None and _file_identity(self.filename) != before:
                raise ferry.FerryError(_ferry.EIO, f"{self.filename}: the file changed while it was being opened")
        self.specs = {s.name: s for s in specs}
        self.attrs = gattrs
        self.dims = dims
        self.unlimited = unlimited
        self._assign_devices(*self._decoding)
        if expect is not None:
            ident, summary = expect
            if ident != self._ident or summary != self._summary():
                self.close()
                raise ferry.FerryError(_ferry.EIO, f"{self.filename}: the file changed since it was opened "
                                       f"(found {_describe_ident(self._ident)}, expected {_describe_ident(ident)}"
                                       f"{'' if summary == self._summary() else ', other variables'}): "
                                       "open it again")

    def _summary(self) -> tuple:
        return tuple(sorted((s.name, s.shape, s.dtype.str, s.out_dtype.str, s.device) for s in self.specs.values()))

    def _live(self):
        """Make this store usable in the calling process: reopen after fork(),
        unpickling elsewhere or close()."""
        if self._pid == os.getpid() and not self._closed:
            return
        with _reopen_lock():
            if self._pid == os.getpid() and not self._closed:
                return
            expect = (self._ident, self._summary())
            if self._pid != os.getpid():
                # the parent's handles: leave them to the parent (closing an inherited
                # HDF5 file or C dataset here would act on the parent's state)
                self._h5 = None
                self._cds = None
                self._alias_fd = None
            else:
                self.close()
            self._closed = False
            self._open(expect)

    def spec(self, name) -> _VarSpec:
        self._live()
        return self.specs[name]

    def _check_unchanged(self):
        """The file at our path is still the one whose metadata we parsed."""
        if self._ident is None:
            return
        try:
            now = _file_identity(self.filename)
        except OSError as e:
            raise ferry.FerryError(_ferry.EIO, f"{self.filename}: the file is gone since it was opened ({e})") \
                from None
        if now != self._ident:
            raise ferry.FerryError(_ferry.EIO, f"{self.filename}: the file changed since it was opened "
                                   f"(found {_describe_ident(now)}, expected {_describe_ident(self._ident)}): "
                                   "open it again")

    def __reduce__(self):
        args = (self.filename, self.group, self.device, self.threads, self.path_policy) + tuple(self._decoding) \
            + (self.decode,)
        expect = (self._ident, self._summary())
        _remember_store(args, expect, self)
        return (_reopen_store, (args, expect))

    # -- which variables go to the GPU ---------------------------------------
    def _assign_devices(self, mask_and_scale, decode_times, decode_timedelta):
        if self.device < 0:
            return
        coords = set(self.dims)
        for s in self.specs.values():
            for key in ("coordinates", "bounds", "grid_mapping", "ancillary_variables"):
                v = s.attrs.get(key)
                if isinstance(v, str):
                    coords.update(x.split(":")[-1].strip() for x in v.split())
        gc = self.attrs.get("coordinates")
        if isinstance(gc, str):
            coords.update(gc.split())
        for s in self.specs.values():
            if s.name in coords or not s.shape or s.kind not in ("ferry", "h5", "h5py"):
                continue
            if s.dtype.kind not in "iuf":
                continue
            if _is_time_like(s.attrs.get("units")) or "dtype" in s.attrs or "calendar" in s.attrs:
                continue
            s.device = self.device
            s.encoding["ferry_device"] = self.device
            if mask_and_scale:
                self._plan_gpu_decode(s, decode_times, decode_timedelta)

    def _plan_gpu_decode(self, s: _VarSpec, decode_times, decode_timedelta):
        """Let xarray's CF mask/scale coders decode a zero-size stand-in; keep the
        transforms they chose, to apply them to the cupy data after each read."""
        from xarray.coding import variables as cv
        from xarray.coding.common import _ElementwiseFunctionArray
        keys = ("_FillValue", "missing_value", "scale_factor", "add_offset", "_Unsigned")
        if not any(k in s.attrs for k in keys):
            return
        dummy = Variable(s.dims, np.zeros((0,) * len(s.shape), dtype=s.dtype), dict(s.attrs), dict(s.encoding))
        v = dummy
        for coder in (cv.CFMaskCoder(decode_times=False, decode_timedelta=False),
                      cv.CFScaleOffsetCoder(decode_times=False, decode_timedelta=False)):
            v = coder.decode(v, name=s.name)
        funcs = []
        d = v._data
        while isinstance(d, _ElementwiseFunctionArray):
            funcs.append(d.func)
            d = d.array
        funcs.reverse()
        s.gpu_decode = funcs
        s.out_dtype = v.dtype
        s.attrs = dict(v.attrs)
        s.encoding = dict(v.encoding)
        s.encoding["ferry_decoded_on_device"] = True

    # -- AbstractDataStore ---------------------------------------------------
    def get_variables(self):
        self._live()
        out = {}
        for name, s in self.specs.items():
            arr = FerryBackendArray(self, s)
            data = indexing.LazilyIndexedArray(arr)
            out[name] = Variable(s.dims, data, dict(s.attrs), dict(s.encoding))
        return out

    def get_attrs(self):
        return dict(self.attrs)

    def get_dimensions(self):
        return dict(self.dims)

    def get_encoding(self):
        return {"unlimited_dims": set(self.unlimited)} if self.unlimited else {}

    def close(self):
        """Close the file; a later read reopens it (as xarray's own engines do)."""
        self._closed = True
        if self._pid != os.getpid():     # a forked child: the handles are the parent's
            self._h5 = self._cds = None
            return
        if self._h5 is not None:
            try:
                self._h5.close()
            except Exception:  # noqa: BLE001
                pass
            self._h5 = None
        if self._cds is not None:
            self._cds.close()
            self._cds = None
        if self._alias_fd is not None:
            os.close(self._alias_fd)
            self._alias_fd = None

    # -- reading -------------------------------------------------------------
    def _alloc(self, shape, dtype: np.dtype, device: int):
        if device < 0:
            if dtype.kind == "O":
                return np.empty(shape, dtype=dtype)
            a = ferry.empty(shape, dtype, "cpu", ctx=self.ctx)
            return np.asarray(a).view(dtype)
        import cupy
        with cupy.cuda.Device(device):
            return cupy.empty(shape, dtype=dtype)

    def _add(self, plan, s: _VarSpec, key: tuple):
        """Add the read of `key` (OUTER backend key) of s to plan; return a
        finisher giving the array once the plan ran."""
        triples, post = _key_triples(key, s.shape)
        counts = tuple(max(0, (b - a + st - 1) // st) for a, b, st in triples)
        if s.kind in ("h5py", "zarrpy", "unsupported"):
            with self._user_lock if self._user_lock is not None else contextlib.nullcontext():
                return self._direct(s, triples, counts, post)
        out = self._alloc(counts, s.dtype, s.device)
        if out.size:
            self._plan_triples(plan, s, triples, out)

        def finish():
            r = _apply_post(out, post)
            return self._decode(s, r)
        return finish

    @contextlib.contextmanager
    def _chunk_index_errors(self, s: _VarSpec):
        """h5py's errors reading a damaged chunk index, raised as ferry's naming the file and variable."""
        try:
            yield
        except ferry.FerryError as e:   # a chunk table that lies, refused by C, which knows no file name
            if self.filename in str(e):
                raise
            raise ferry.FerryError(e.code, f"{self.filename}: variable {s.name}: chunk index: {e}") from e
        except MemoryError:
            raise
        except Exception as e:  # noqa: BLE001 — h5py reading a damaged chunk index
            raise _h5_error(self.filename, f"variable {s.name}: chunk index", e) from None

    def _plan_triples(self, plan, s: _VarSpec, triples, dst):
        if s.kind == "ferry":
            plan.read(s.source, s.index if s.index is not None else s.name, dst,
                      triples if s.shape else None, True)
        else:
            with self._chunk_index_errors(s):
                s.source.add_to_plan(plan, triples, dst, s.name)

    def _row_source(self, s: _VarSpec):
        """s as a source of Plan.read_rows (the reads _plan_triples makes, row by row in one call)."""
        if s.kind == "ferry":
            return (s.source, s.index if s.index is not None else s.name)
        with self._chunk_index_errors(s):
            return s.source.row_layout(s.name)

    def _plan_into(self, plan, s: _VarSpec, key: tuple, dst):
        """Plan the raw read (stored values, native byte order, C order, no CF decoding) of
        `key` — slices only — of s into dst: an array or a (ptr, nbytes, device) tuple of
        exactly the selection's bytes. For ferry.torch.XarrayDataset, which decodes on its own
        device."""
        if s.kind not in ("ferry", "h5"):
            raise ferry.FerryError(_ferry.EUNSUPPORTED, s.error or f"{self.filename}: variable {s.name}: "
                                   f"read by {s.kind}, not by ferry's engine")
        triples, post = _key_triples(key, s.shape)
        if post is not None:
            raise ValueError("_plan_into takes slices only")
        self._plan_triples(plan, s, triples, dst)

    def _direct(self, s: _VarSpec, triples, counts, post):
        sl = tuple(slice(a, b, st) for a, b, st in triples)
        if s.kind == "h5py":
            import h5py
            try:
                if h5py.check_dtype(vlen=s.source.dtype) is str:
                    data = s.source.asstr()[sl] if s.shape else s.source.asstr()[()]
                    data = np.asarray(data, dtype=object)
                else:
                    data = s.source[sl] if s.shape else s.source[()]
                    data = np.asarray(data)
                    if data.dtype != s.dtype:
                        data = data.astype(s.dtype)
            except MemoryError:
                raise
            except Exception as e:  # noqa: BLE001 — h5py's errors on damaged data
                raise _h5_error(self.filename, f"variable {s.name}", e) from None
        elif s.kind == "zarrpy":
            arr = s.source if not isinstance(s.source, ferry.Dataset) else None
            if arr is None:
                import zarr
                g = (self.group or "").strip("/")
                arr = zarr.open_array(store=self.filename, path=f"{g}/{s.name}" if g else s.name, mode="r")
            data = np.asarray(arr[sl] if s.shape else arr[()])
            if s.dtype.kind == "O" and data.dtype != s.dtype:
                data = data.astype(s.dtype)
        else:
            raise ferry.FerryError(_ferry.EUNSUPPORTED,
                                   s.error or f"{self.filename}: variable {s.name}: unsupported type")

        def finish():
            r = _apply_post(data, post)
            if s.device >= 0:
                import cupy
                with cupy.cuda.Device(s.device):
                    r = cupy.asarray(r)
            return self._decode(s, r)
        return finish

    def _decode(self, s: _VarSpec, arr):
        if not s.gpu_decode:
            return arr
        from xarray.coding import variables as cv
        for f in s.gpu_decode:
            fn = getattr(f, "func", None)
            kw = getattr(f, "keywords", {}) or {}
            if fn is cv._apply_mask:
                arr = _device_apply_mask(arr, **kw)
            elif fn is np.asarray:
                arr = arr.view(np.dtype(kw["dtype"])) if arr.dtype.itemsize == np.dtype(kw["dtype"]).itemsize \
                    else arr.astype(kw["dtype"])
            else:
                arr = f(arr)
        return arr

    def run(self, plan):
        if len(plan):
            # before and after: a replace or an in-place write of the file in between
            # would pair this metadata with other bytes; the reader sees an error instead
            with self._user_lock if self._user_lock is not None else contextlib.nullcontext():
                self._check_unchanged()
                try:
                    self.ctx.run(plan, path=self.path_policy, threads=self.threads, decode=self.decode)
                except ferry.FerryError as e:
                    if not self._alias:
                        raise
                    raise ferry.FerryError(e.code, str(e).replace(self._alias, self.filename)) from None
                self._check_unchanged()

    def read(self, name, key: tuple):
        s = self.spec(name)
        ck = (s.name, _norm_key(key))
        with self._lock:
            hit = self._cache.pop(ck, None)
        if hit is not None:
            return hit
        self._maybe_batch(s, key)
        with self._lock:
            hit = self._cache.pop(ck, None)
        if hit is not None:
            return hit
        plan = ferry.Plan()
        fin = self._add(plan, s, key)
        self.run(plan)
        return fin()

    def read_many(self, requests: list) -> list:
        """[(variable name, key)] -> arrays, with ONE plan."""
        self._live()
        plan = ferry.Plan()
        fins = [self._add(plan, self.specs[n], k) for n, k in requests]
        self.run(plan)
        return [f() for f in fins]

    # -- batching Dataset.load() ---------------------------------------------
    def _maybe_batch(self, s: _VarSpec, key: tuple):
        ds = _loading_dataset()
        if ds is None:
            return
        reqs = []
        seen = set()
        for v in ds.variables.values():
            found = _find_backend(v._data)
            if found is None:
                continue
            arr, lkey = found
            if arr.store is not self:
                continue
            try:
                bk, _ = indexing.decompose_indexer(lkey, arr.shape, indexing.IndexingSupport.OUTER)
            except Exception:  # noqa: BLE001 — anything unusual: read it on its own later
                continue
            ck = (arr.name, _norm_key(bk.tuple))
            if ck in seen:
                continue
            seen.add(ck)
            reqs.append((arr.name, bk.tuple, ck))
        if len(reqs) < 2:
            return
        results = self.read_many([(sp, k) for sp, k, _ in reqs])
        with self._lock:
            for (_, _, ck), r in zip(reqs, results):
                self._cache[ck] = r


def _device_apply_mask(data, encoded_fill_values, decoded_fill_value, dtype):
    """xarray.coding.variables._apply_mask for device (cupy) arrays."""
    data = data.astype(dtype, copy=True)
    if encoded_fill_values:
        cond = None
        for fv in encoded_fill_values:
            c = data == fv
            cond = c if cond is None else (cond | c)
        data[cond] = decoded_fill_value
    return data


_LOAD_CODE = None


def _loading_dataset():
    """The Dataset whose .load() is on the call stack, if any."""
    global _LOAD_CODE
    if _LOAD_CODE is None:
        import xarray as xr
        _LOAD_CODE = xr.Dataset.load.__code__
    f = sys._getframe(2)
    for _ in range(40):
        if f is None:
            return None
        if f.f_code is _LOAD_CODE:
            return f.f_locals.get("self")
        f = f.f_back
    return None


def _find_backend(data):
    for _ in range(16):
        if isinstance(data, indexing.LazilyIndexedArray):
            if isinstance(data.array, FerryBackendArray):
                return data.array, data.key
        nxt = getattr(data, "array", None)
        if nxt is None or nxt is data:
            return None
        data = nxt
    return None


class FerryBackendArray(BackendArray):
    """One variable; reads become ferry plans touching only the selected chunks."""

    def __init__(self, store: FerryStore, spec: _VarSpec):
        self.store = store
        self.name = spec.name     # not the spec: the store may reopen (fork, pickle) and parse anew
        self.shape = spec.shape
        self.dtype = spec.out_dtype

    @property
    def spec(self) -> _VarSpec:
        return self.store.spec(self.name)

    def __getitem__(self, key: indexing.ExplicitIndexer):
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.OUTER, self._raw)

    def _raw(self, key: tuple):
        return self.store.read(self.name, key)

    async def async_getitem(self, key: indexing.ExplicitIndexer):
        """For ``Dataset.load_async()``: the read runs in a worker thread (the engine
        releases the GIL), so the event loop goes on meanwhile."""
        import asyncio
        return await asyncio.to_thread(self.__getitem__, key)

    def get_duck_array(self):
        return self[indexing.BasicIndexer((slice(None),) * len(self.shape))]


# ---------------------------------------------------------------------------
# what a user may pass as the file
# ---------------------------------------------------------------------------
def _remote_error(what, proto: str) -> ferry.FerryError:
    return ferry.FerryError(_ferry.EUNSUPPORTED,
                            f"{what}: ferry reads local files only, not {proto}:// (copy the data to a local "
                            "disk, or open it with another engine, e.g. engine='h5netcdf' or 'zarr' with fsspec)")


def _local_path(obj, storage_options=None) -> str:
    """The local path named by what xarray's engines accept as a file: str,
    bytes (os.fsencode'd names that are not UTF-8 too), os.PathLike, file://
    URLs, fsspec mappers of a local file system, zarr's LocalStore (and v2's
    DirectoryStore). A remote URL or store is a FerryError: it must never become
    a local path (``s3://b/x`` is not ``./s3:/b/x``)."""
    if isinstance(obj, FerryStore):
        return obj.filename
    if isinstance(obj, (str, bytes, os.PathLike)):
        p = os.fspath(obj)
        path = os.fsdecode(p) if isinstance(p, bytes) else p
    else:
        fs, root = getattr(obj, "fs", None), getattr(obj, "root", None)
        if fs is not None and root is None:
            root = getattr(obj, "path", None)                 # zarr's FsspecStore
        if fs is not None and root is not None:            # fsspec FSMap, zarr FsspecStore
            protos = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
            if not {"file", "local"} & set(protos):
                raise _remote_error(f"{type(obj).__name__}({root!r})", protos[0])
            path = os.fspath(root)
        elif type(obj).__name__ in ("LocalStore", "DirectoryStore", "NestedDirectoryStore"):
            path = os.fspath(root if root is not None else obj.path)
        else:
            raise TypeError(f"engine='ferry' opens local files and stores: a path (str, bytes, os.PathLike), "
                            f"a file:// URL, or an fsspec mapper / zarr LocalStore of a local directory; "
                            f"not {type(obj).__name__}")
        path = os.fsdecode(path) if isinstance(path, bytes) else path
    if "://" in path:
        proto = path.split("://", 1)[0]
        if proto.lower() != "file":
            raise _remote_error(path, proto)
        from urllib.parse import unquote, urlsplit
        u = urlsplit(path)
        if u.netloc not in ("", "localhost"):
            raise _remote_error(path, f"file://{u.netloc}")
        path = unquote(u.path, errors="surrogateescape")
    return path


def _check_consolidated(store: "FerryStore", consolidated):
    """consolidated= as the zarr engine reads it: True requires consolidated
    metadata; False asks to ignore it, which ferry's parser cannot do, so it is
    refused when the parser read the node's members from consolidated metadata
    (and is what ferry does when it did not). The C parser says which it did."""
    if consolidated is None:
        return
    path = store.filename
    has = store._cds.store_info["consolidated"]
    if consolidated and not has:
        raise ferry.FerryError(_ferry.ENOTFOUND, f"{path}: consolidated=True but the store has no consolidated "
                               "metadata (.zmetadata or zarr.json consolidated_metadata)")
    if not consolidated and has:
        raise ferry.FerryError(_ferry.EUNSUPPORTED, f"{path}: consolidated=False: ferry reads the consolidated "
                               "metadata the store has and cannot ignore it; omit consolidated= (or use "
                               "consolidated=True)")


# ---------------------------------------------------------------------------
# the entry point
# ---------------------------------------------------------------------------
class FerryBackendEntrypoint(BackendEntrypoint):
    """ferry: netCDF classic, netCDF-4/HDF5 and Zarr read by ferry's engine, into
    host memory (``device="cpu"``, the default: numpy, as every xarray engine) or
    GPU memory (``device=0`` / ``"cuda:N"``: cupy arrays)."""

    description = "Read netCDF (classic and netCDF-4/HDF5) and Zarr with ferry, straight into GPU memory"
    url = ""   # no public home yet: xarray shows none rather than a made-up address
    open_dataset_parameters = ("filename_or_obj", "mask_and_scale", "decode_times", "concat_characters",
                               "decode_coords", "drop_variables", "use_cftime", "decode_timedelta", "group",
                               "device", "threads", "path", "decode", "lock", "storage_options", "consolidated")

    def guess_can_open(self, filename_or_obj) -> bool:
        return False   # opt-in only: never take files from xarray's own engines

    def open_dataset(self, filename_or_obj, *, mask_and_scale=True, decode_times=True, concat_characters=True,
                     decode_coords=True, drop_variables: str | Iterable[str] | None = None, use_cftime=None,
                     decode_timedelta=None, group: str | None = None, device: Any = "cpu", threads: int = 0,
                     path: str | None = None, decode: str | None = None, lock=None,
                     storage_options: dict | None = None, consolidated: bool | None = None):
        if isinstance(filename_or_obj, FerryStore):
            store = filename_or_obj
        else:
            p = _local_path(filename_or_obj, storage_options)
            if consolidated is not None and _format_of(p) != "zarr":
                raise ValueError(f"{p}: consolidated= applies to Zarr stores only")
            store = FerryStore(p, group=group, device=device, threads=threads, path=path, decode=decode,
                               mask_and_scale=mask_and_scale, decode_times=decode_times,
                               decode_timedelta=decode_timedelta, lock=lock)
            try:
                _check_consolidated(store, consolidated)
            except BaseException:
                store.close()
                raise
        ds = StoreBackendEntrypoint().open_dataset(
            store, mask_and_scale=mask_and_scale, decode_times=decode_times, concat_characters=concat_characters,
            decode_coords=decode_coords, drop_variables=drop_variables, use_cftime=use_cftime,
            decode_timedelta=decode_timedelta)
        ds.set_close(store.close)
        return ds

    def open_groups_as_dict(self, filename_or_obj, *, mask_and_scale=True, decode_times=True,
                            concat_characters=True, decode_coords=True, drop_variables=None, use_cftime=None,
                            decode_timedelta=None, group: str | None = None, device: Any = "cpu",
                            threads: int = 0, path: str | None = None, lock=None,
                            storage_options: dict | None = None, consolidated: bool | None = None) -> dict:
        p = _local_path(filename_or_obj, storage_options)
        fmt = _format_of(p)
        root = (group or "/").rstrip("/") or "/"
        if fmt == "hdf5":
            groups = [g for g in _h5_groups(p) if g == root or g.startswith(root.rstrip("/") + "/") or root == "/"]
        elif fmt == "zarr":
            groups = _zarr_groups(p, root)
        else:
            groups = ["/"]
        out = {}
        for g in groups:
            ds = self.open_dataset(p, mask_and_scale=mask_and_scale, decode_times=decode_times,
                                   concat_characters=concat_characters, decode_coords=decode_coords,
                                   drop_variables=drop_variables, use_cftime=use_cftime,
                                   decode_timedelta=decode_timedelta, group=None if g == "/" else g,
                                   device=device, threads=threads, path=path, lock=lock,
                                   consolidated=consolidated)
            rel = "/" + g[len(root):].lstrip("/") if root != "/" else g
            out[rel] = ds
        return out

    def open_datatree(self, filename_or_obj, *, mask_and_scale=True, decode_times=True, concat_characters=True,
                      decode_coords=True, drop_variables=None, use_cftime=None, decode_timedelta=None,
                      group: str | None = None, device: Any = "cpu", threads: int = 0, path: str | None = None,
                      lock=None, storage_options: dict | None = None, consolidated: bool | None = None):
        from xarray import DataTree
        d = self.open_groups_as_dict(filename_or_obj, mask_and_scale=mask_and_scale, decode_times=decode_times,
                                     concat_characters=concat_characters, decode_coords=decode_coords,
                                     drop_variables=drop_variables, use_cftime=use_cftime,
                                     decode_timedelta=decode_timedelta, group=group, device=device,
                                     threads=threads, path=path, lock=lock, storage_options=storage_options,
                                     consolidated=consolidated)
        return DataTree.from_dict(d)


def _zarr_groups(store: str, root: str) -> list:
    out = []

    def walk(g):
        out.append(g)
        ds = ferry.Dataset(ferry.default_context(), store, None, None if g == "/" else g.strip("/"))
        try:
            children = json.loads(ds.groups)
        finally:
            ds.close()
        for c in children:
            walk((g.rstrip("/") + "/" + c) if g != "/" else "/" + c)
    walk(root)
    return out


# ---------------------------------------------------------------------------
# dask chunks of device variables: cupy, with cupy meta
# ---------------------------------------------------------------------------
_DEVICE_CHUNK_PREFIX = "ferry-device-"


def _device_meta(data):
    """A zero-size cupy array typed like `data` (what xarray hands
    dask.array.from_array) when it is a ferry variable read into GPU memory; else None."""
    if not isinstance(data, indexing.ImplicitToExplicitIndexingAdapter):
        return None
    inner = data.array
    for _ in range(8):   # only xarray's pass-through wrappers: a decoding step in between may be numpy-only
        if isinstance(inner, (indexing.CopyOnWriteArray, indexing.MemoryCachedArray)):
            inner = inner.array
        else:
            break
    if not isinstance(inner, indexing.LazilyIndexedArray) or not isinstance(inner.array, FerryBackendArray):
        return None
    arr = inner.array
    if arr.store.device < 0 or arr.spec.device < 0:
        return None
    cupy = ferry._cupy()
    if cupy is None:
        return None
    with cupy.cuda.Device(arr.spec.device):
        return cupy.empty((0,) * len(data.shape), dtype=data.dtype)


def _install_dask_hook():
    """xarray's DaskManager.from_array gives every lazy backend array ``meta=np.ndarray``
    and dask then calls ``np.asarray`` on each chunk: for a GPU variable a copy to the
    host, or an error. For ferry's GPU variables (only those) build the dask array
    with cupy meta and the chunks as the backend returns them; every other array goes
    to xarray's method unchanged. xarray has no backend hook for this (it chunks after
    the backend returns), hence the wrapper."""
    try:
        from xarray.namedarray.daskmanager import DaskManager
    except ImportError:
        return
    orig = DaskManager.from_array
    if getattr(orig, "_ferry_wrapped", False):
        return

    def from_array(self, data, chunks, **kwargs):
        meta = _device_meta(data)
        if meta is None:
            return orig(self, data, chunks, **kwargs)
        import dask.array as da
        kw = dict(kwargs)
        name = kw.pop("name", None)
        kw.update(meta=meta, asarray=False)
        lazy = da.from_array(data, chunks, name=name if name else True, **kw)
        return lazy.map_blocks(_duck_chunk, dtype=data.dtype, meta=meta, name=_DEVICE_CHUNK_PREFIX + lazy.name)

    from_array._ferry_wrapped = True
    from_array.__wrapped__ = orig
    from_array.__doc__ = orig.__doc__
    DaskManager.from_array = from_array


def cupy_meta(ds):
    """Kept for code written before GPU variables had cupy dask chunks by default:
    make the dask arrays of ``ds`` that ferry reads into GPU memory cupy-backed dask
    arrays (chunks and ``meta`` cupy). Arrays that already are (what
    ``open_dataset(..., engine="ferry", device=0, chunks=...)`` and ``open_mfdataset``
    give now) are left as they are."""
    import cupy
    out = ds.copy()
    for name, v in out.variables.items():
        if v.encoding.get("ferry_device", -1) < 0:
            continue
        if str(getattr(v.data, "name", "")).startswith(_DEVICE_CHUNK_PREFIX):
            continue
        new = _rechunk_on_device(v.data, cupy.empty((0,) * v.ndim, dtype=v.dtype))
        if new is not None:
            v.data = new
    return out


def _rechunk_on_device(data, meta):
    """A dask array over the same lazy source as `data`, whose chunks are read
    as the backend returns them (no np.asarray) and typed like `meta`."""
    try:
        import dask.array as da
    except ImportError:
        return None
    if not isinstance(data, da.Array):
        return None
    src = None
    for val in dict(data.__dask_graph__()).values():
        val = getattr(val, "value", val)            # dask task-spec DataNode
        if isinstance(val, indexing.ImplicitToExplicitIndexingAdapter) and tuple(val.shape) == data.shape:
            src = val
            break
    if src is None:
        return None
    arr = da.from_array(src, chunks=data.chunks, asarray=False, meta=meta, name=data.name + "-ferry")
    return arr.map_blocks(_duck_chunk, dtype=data.dtype, meta=meta)

def _duck_chunk(x):
    get = getattr(x, "get_duck_array", None)
    return get() if get is not None else x


def open_mfdataset(paths, *, device: Any = "cpu", preprocess=None, **kwargs):
    """``xr.open_mfdataset(paths, engine="ferry", device=device, ...)``.

    ``device`` defaults to ``"cpu"`` here as in ``open_dataset``: engine="ferry"
    returns numpy as every xarray engine does unless a GPU is asked for
    (``device=0``, ``"cuda:1"``); GPU variables are then dask arrays of cupy chunks."""
    import xarray as xr
    dev = ferry.parse_device(device)

    def pre(ds):
        if preprocess is not None:
            ds = preprocess(ds)
        return cupy_meta(ds) if dev >= 0 else ds
    return xr.open_mfdataset(paths, engine=FerryBackendEntrypoint, device=device, preprocess=pre, **kwargs)
