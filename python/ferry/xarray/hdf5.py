"""netCDF-4 / HDF5 for ferry.xarray: the C parser's description of a group (src/formats/hdf5/,
through ferry.Dataset) as variables, attributes, dimensions and encodings the way xarray's
netcdf4 engine gives them. The engine reads the data; the C library reads variable-length
strings too (Dataset.read_strings: ferry_dataset_read_strings). h5py reads only the variables
the parser refuses as unsupported (a type or filter ferry lacks), never one it finds damaged;
each such variable is logged once, with the parser's reason."""
from __future__ import annotations

import json
import logging
import os
import threading

import numpy as np

import ferry
from ferry import _ferry
from .._remote import is_url
from .common import _VarSpec, _file_identity, _native


log = logging.getLogger("ferry")

# how the C parser ends a variable's error when the dataset is valid but uses what
# ferry lacks (hdf5.c, H5_REFUSED); any other error is damage
_REFUSED = " (unsupported)"

# the parser's words for a dataset of no values (h5py.Empty; hdf5.c build_var)
_NULL_SPACE = "null dataspace (no values)"

_logged: set = set()
_logged_lock = threading.Lock()


def _log_once(path: str, name: str, what: str, why: str):
    """One line per file, variable and reason in a process: "<file>: variable <name> <what>: <why>"."""
    key = (path, name, what, why)
    with _logged_lock:
        if key in _logged:
            return
        _logged.add(key)
    log.info("%s: variable %s %s: %s", path, name, what, why)


def _h5_error(path: str, what: str, e: BaseException) -> ferry.FerryError:
    """h5py's exception (damaged or truncated file) as FerryError naming the file and the object."""
    msg = str(e) or type(e).__name__
    return ferry.FerryError(_ferry.EFORMAT, f"{path}: {what}: {msg}")


# ---------------------------------------------------------------------------
# encodings as the netcdf4 engine gives them
# ---------------------------------------------------------------------------
_BLOSC = {"blosclz": "blosc_lz", "lz4": "blosc_lz4", "lz4hc": "blosc_lz4hc", "snappy": "blosc_snappy",
          "zlib": "blosc_zlib", "zstd": "blosc_zstd"}


def _filters(desc: str) -> dict:
    """netCDF4.Variable.filters() from the parser's description of the pipeline
    ("fletcher32 zlib(level=4) shuffle", decoding order; hdf5.c describe_filter)."""
    out = {"zlib": False, "szip": False, "zstd": False, "bzip2": False, "blosc": False, "shuffle": False,
           "complevel": 0, "fletcher32": False}
    for tok in desc.split():
        name, _, args = tok.partition("(")
        kw = dict(a.split("=", 1) if "=" in a else (a, "") for a in args.rstrip(")").split(",") if a)
        level = int(kw["level"]) if kw.get("level", "").lstrip("-").isdigit() else None
        if name in ("zlib", "zstd", "bzip2"):
            out[name] = True
            if level is not None:
                out["complevel"] = level
        elif name == "shuffle":
            out["shuffle"] = True
        elif name == "fletcher32":
            out["fletcher32"] = True
        elif name == "blosc":
            inner = next((k for k in kw if k in _BLOSC), None)
            out["blosc"] = {"compressor": _BLOSC.get(inner, inner), "shuffle": int(kw.get("shuffle", 0) or 0)}
            if level is not None:
                out["complevel"] = level
        elif name == "szip":
            out["szip"] = True
    return out


def _encoding(v: dict, dims: tuple, source: str, stored, unlimited=(), filters_of: dict | None = None) -> dict:
    """encoding of one variable: dtype, the filters, contiguous / chunksizes /
    preferred_chunks, source, original_shape (xarray adds _FillValue and the
    other CF keys when it decodes). filters_of: _filters() by description, shared
    by the variables of one open (copied: each encoding is its own)."""
    shape, chunks = tuple(v["shape"]), tuple(v["chunks"])
    enc = {"dtype": stored} if stored is not None else {}
    desc = v["codecs"]
    if filters_of is None:
        f = _filters(desc)
    else:
        f = filters_of.get(desc)
        if f is None:
            f = filters_of[desc] = _filters(desc)
    enc.update(f)
    if isinstance(f["blosc"], dict):
        enc["blosc"] = dict(f["blosc"])
    # Contiguous data has a byte range (data_bytes). Without one, the dataset is
    # chunked when its chunks differ from its shape, it is filtered or it runs
    # along an unlimited dimension (HDF5 chunks those); left over is a dataset of
    # one unfiltered chunk of its fixed shape, or a contiguous one never
    # written: both read alike, and the parser does not say which (contiguous).
    contiguous = bool(v["data_bytes"]) or (chunks == shape and not v["codecs"]
                                           and not any(d in unlimited for d in dims))
    if contiguous or not shape:
        enc["contiguous"] = True
        enc["chunksizes"] = None
    else:
        enc["contiguous"] = False
        enc["chunksizes"] = chunks
        enc["preferred_chunks"] = dict(zip(dims, chunks))
    enc["source"] = source
    enc["original_shape"] = shape
    return enc


def _netcdf4_attrs(attrs: dict, typestr: str):
    """Attributes as the netcdf4 engine hands them over: a character variable's
    _FillValue as an array of its own type (bytes, not str)."""
    if typestr[1:2] == "S" and "_FillValue" in attrs:
        fv = attrs["_FillValue"]
        attrs["_FillValue"] = np.array(fv.encode("utf-8", "surrogateescape") if isinstance(fv, str) else fv,
                                       dtype=typestr)


def _vlen_str() -> np.dtype:
    """Object dtype marked as holding str, as the netcdf4 engine types a string variable."""
    from xarray.coding.strings import create_vlen_dtype
    return create_vlen_dtype(str)


def _lsd(spec: _VarSpec):
    """least_significant_digit goes from the attributes to the encoding, as netcdf4 moves it."""
    if "least_significant_digit" in spec.attrs:
        spec.encoding["least_significant_digit"] = spec.attrs.pop("least_significant_digit")


# ---------------------------------------------------------------------------
# h5py, for what the parser refuses
# ---------------------------------------------------------------------------
def _h5py_open(path: str, ident):
    """The h5py file of the variables the C parser refuses, checked to be the file
    the parser read (same inode, size and mtime), or None without h5py."""
    try:
        import h5py
    except ImportError:
        return None
    try:
        f = h5py.File(path, "r")
    except Exception as e:  # noqa: BLE001 — truncated, damaged, not HDF5 after all
        raise _h5_error(path, "cannot open as HDF5/netCDF-4", e) from None
    try:
        st = os.fstat(int(f.id.get_vfd_handle()))
        held = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except Exception:  # noqa: BLE001 — a driver without a descriptor: the path's stat
        held = _file_identity(path)
    if ident is not None and held != ident:
        f.close()
        raise ferry.FerryError(_ferry.EIO, f"{path}: the file was replaced while it was being opened")
    return f


def _h5py_spec(h5, path: str, group: str | None, name: str, dims, attrs, v: dict, source: str, why: str,
               unlimited=()):
    """A refused variable read through h5py: its dtype as netCDF4 gives it
    (object for variable-length types), the parser's dims and attributes."""
    import h5py
    where = "/" + "/".join(x for x in ((group or "").strip("/"), name) if x)
    try:
        if where not in h5:   # netCDF-C's name for a variable named like a dimension it does not use
            where = where.rsplit("/", 1)[0] + "/_nc4_non_coord_" + name
        obj = h5[where]
        stored = obj.dtype
        vlen = h5py.check_dtype(vlen=stored)
    except Exception as e:  # noqa: BLE001
        raise _h5_error(path, f"variable {where}", e) from None
    enc = _encoding(v, dims, source, None, unlimited)
    if vlen is str or vlen is bytes or stored.kind == "O":
        dtype = np.dtype(object)
        enc["dtype"] = str if vlen is str else stored
    else:
        dtype = _native(stored)
        enc["dtype"] = stored
    enc = {"dtype": enc.pop("dtype"), **enc}
    _log_once(path, where, "is read by h5py on the CPU", why)
    spec = _VarSpec(name, dims, tuple(v["shape"]), dtype, attrs, enc, "h5py", obj)
    _lsd(spec)
    return spec


# ---------------------------------------------------------------------------
# the scan
# ---------------------------------------------------------------------------
def _h5_scan(path: str, group: str | None, ctx, cpath: str | None = None, ident=None):
    """(specs, attrs, dims, unlimited, C dataset, h5py file or None) of a netCDF-4 /
    HDF5 group. cpath: what the C parser opens when `path` cannot be handed to it
    (a /proc/self/fd alias); ident: the file's identity, which h5py's file must share."""
    ds = ferry.Dataset(ctx, cpath or path, None, group)
    h5 = None
    try:
        gattrs = ferry.decode_attrs(ds.attrs, "hdf5")
        dims_j = json.loads(ds.dims)
        dims = {k: int(d["size"]) for k, d in dims_j.items()}
        unlimited = {k for k, d in dims_j.items() if d.get("unlimited")}
        source = os.path.abspath(path)
        # every variable's description in one call, its dims and attributes parsed
        # in one json.loads each: per-variable work is what an open of thousands costs
        rows = ds.meta()
        all_attrs = ferry._decode_attrs_many([r[5] for r in rows], "hdf5")
        all_dims = json.loads("[" + ",".join(r[4] for r in rows) + "]")
        stored_of: dict = {}    # typestr -> (stored dtype or None, native dtype or None)
        filters_of: dict = {}   # codecs description -> _filters()
        specs = []
        for index, (name, typestr, shape, chunks, _dj, _aj, codecs, data_bytes, err) in enumerate(rows):
            attrs = all_attrs[index]
            vd = tuple(all_dims[index] or ())
            v = {"shape": shape, "chunks": chunks, "codecs": codecs, "data_bytes": data_bytes}
            for dn, n in zip(vd, shape):
                dims.setdefault(dn, int(n))
            _netcdf4_attrs(attrs, typestr)
            if err and _NULL_SPACE in err:
                # h5py.Empty: no values, no shape; netCDF has no such variable (netCDF4
                # refuses the whole file): left out, said once, the rest of the file read
                _log_once(path, name, "is left out", err[:-len(_REFUSED)] if err.endswith(_REFUSED) else err)
                continue
            if err and err.endswith(_REFUSED):
                why = err[:-len(_REFUSED)]
                remote = is_url(path)
                if h5 is None and not remote:
                    h5 = _h5py_open(path, ident)
                if h5 is not None:
                    specs.append(_h5py_spec(h5, path, group, name, vd, attrs, v, source, why, unlimited))
                    continue
                err = why + (" (h5py, which reads such variables, opens local files only: copy the file to "
                             "read this one)" if remote else " (install h5py to read it through h5py)")
            if not err and typestr == "|O":
                # variable-length strings (netCDF-4 "string"): object arrays of str read by the
                # C library, typed and encoded as the netcdf4 engine types them (dtype=str)
                enc = {"dtype": str, **_encoding(v, vd, source, None, unlimited, filters_of)}
                spec = _VarSpec(name, vd, shape, _vlen_str(), attrs, enc, "strings", ds)
                spec.index = index
                _lsd(spec)
                specs.append(spec)
                continue
            st = stored_of.get(typestr)
            if st is None:
                try:
                    stored = np.dtype(typestr)
                except TypeError:
                    stored = None
                st = stored_of[typestr] = (stored, _native(stored) if stored is not None else None)
            stored, native = st
            if err or stored is None or stored.kind not in "biufcS":
                # a placeholder where numpy has no type (an object one would make xarray
                # read a value at open to infer its type, and fail there)
                dtype = native if stored is not None and stored.kind in "biufcS" else np.dtype("V1")
                enc = _encoding(v, vd, source, stored, unlimited, filters_of)
                spec = _VarSpec(name, vd, shape, dtype, attrs, enc, "unsupported", ds)
                spec.error = err or f"{path}: variable {name}: type {typestr} is not read by ferry"
            else:
                spec = _VarSpec(name, vd, shape, native, attrs,
                                _encoding(v, vd, source, stored, unlimited, filters_of), "ferry", ds)
            spec.index = index
            _lsd(spec)
            specs.append(spec)
        return specs, gattrs, dims, unlimited, ds, h5
    except BaseException:
        if h5 is not None:
            h5.close()
        ds.close()
        raise


def _h5_groups(path: str, ctx=None) -> list:
    """Every group of the file ("/", "/a", "/a/b", ...), as the C parser lists them."""
    ctx = ctx if ctx is not None else ferry.default_context()
    out = []

    def walk(g: str, depth: int):
        if depth > 32:   # the parser's nesting bound (H5_MAX_DEPTH)
            raise ferry.FerryError(_ferry.EFORMAT, f"{path}: groups nest deeper than 32 ({g})")
        out.append(g)
        ds = ferry.Dataset(ctx, path, None, None if g == "/" else g.strip("/"))
        try:
            children = json.loads(ds.groups)
        finally:
            ds.close()
        for c in children:
            walk(g.rstrip("/") + "/" + c, depth + 1)
    walk("/", 0)
    return out
