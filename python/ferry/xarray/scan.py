"""The scan of files ferry's C parsers read (netCDF classic, Zarr): variables, attributes,
dimensions and fill values as xarray's own backends give them."""
from __future__ import annotations

import itertools
import json
import os

import numpy as np

import ferry
from ferry import _ferry
from .common import _VarSpec, _native, log
from .._parquet_refs import refs_json
from .refs_py import RefsFallback
from .zarr_codecs import ZarrCodecs
from .zarr_py import _zarr3_attr_fill, _zarr_py_spec


# ---------------------------------------------------------------------------
# netCDF classic and Zarr through ferry's C parsers
# ---------------------------------------------------------------------------
def _fill_value(raw: bytes | None, stored: np.dtype | None):
    """The C parser's fill element (Dataset.fill: little-endian bytes, decoded
    from Zarr's fill_value once, in zarr.c) as a numpy scalar of the stored type."""
    if raw is None or stored is None:
        return None
    return np.frombuffer(raw, dtype=stored.newbyteorder("<")).astype(stored)[0]


def _text_bytes(s: str) -> bytes:
    """netCDF text from the C parser's JSON (valid UTF-8 kept, other bytes as U+0000..U+00FF)
    back to its bytes."""
    try:
        return s.encode("latin-1")
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogateescape")


def _engine_readable(typestr: str) -> bool:
    """Fixed-size numpy types the engine can move as bytes even when ferry names them "other"."""
    try:
        return np.dtype(typestr).kind == "U"
    except TypeError:
        return False


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


def _c_scan(path: str, fmt: str, group: str | None, ctx, cpath: str | None = None, allow_outside: bool = False):
    """cpath: what the C parser opens when `path` itself cannot be handed to it
    (a /proc/self/fd alias of a path that is not UTF-8). A kerchunk reference set
    ("refs") describes a Zarr v2 store and is described as one; allow_outside lets
    its references name files outside its directory."""
    # every format gets the group: one without groups answers "no group" for any but the root;
    # a Parquet reference set is handed to the C parser as the JSON one it reads
    text = refs_json(path) if fmt == "refs" and os.path.isdir(path) else None
    ds = ferry.Dataset(ctx, cpath or path, None, group, allow_outside=allow_outside, refs_json=text)
    refs = ds.format == "refs"
    actual = "zarr" if refs else ds.format
    gattrs = ferry.decode_attrs(ds.attrs, actual)
    dims_j = json.loads(ds.dims)
    dims = {k: int(v.get("size", 0)) if isinstance(v, dict) else int(v) for k, v in dims_j.items()}
    unlimited = {k for k, v in dims_j.items() if isinstance(v, dict) and v.get("unlimited")}
    store = ds.store_info
    zv = store["zarr_format"]
    fallback = RefsFallback(path, group, store, text) if refs else None
    codecs = ZarrCodecs(path, group, store, fallback.zarray if refs else None) if actual == "zarr" else None
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
            if refs:   # zarr-python over the chunks the reference set holds inline, if that is all of them
                sp = fallback.spec(name, tuple(v["shape"]), err)
            else:
                sp = _zarr_py_spec(path, group, name, store, tuple(v["shape"]), err)
            if sp is not None:
                for dn, n in zip(sp.dims, sp.shape):
                    dims.setdefault(dn, int(n))
                specs.append(sp)
                continue
            if not err and not refs:
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
        # the keys the reference engine gives: netcdf4's for netCDF classic (source, original_shape,
        # dtype in native order, as netcdf4 and scipy give it), zarr's for Zarr (chunks, codecs,
        # the stored dtype); nothing of ferry's own (the reader is logged)
        # (zarr-python, too, hands big-endian arrays over in native order)
        encoding = {} if actual == "zarr" else {"source": os.path.abspath(path), "original_shape": shape}
        if stored is not None:
            encoding["dtype"] = _native(stored)
        if actual != "zarr" and stored is not None and stored.kind == "S" and isinstance(attrs.get("_FillValue"), str):
            # a char variable's fill is bytes, as netcdf4 (np.bytes_) and scipy give it:
            # xarray then masks fill characters and compares them with the data's bytes
            attrs["_FillValue"] = np.bytes_(_text_bytes(attrs["_FillValue"]))
        if actual == "zarr":
            encoding["chunks"] = tuple(v["chunks"])
            encoding["preferred_chunks"] = dict(zip(d, v["chunks"]))
            if codecs is not None:
                encoding.update(codecs.encoding(name, d))
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
            kind = "zarrpy" if actual == "zarr" and not refs and not err else "unsupported"
            if kind == "zarrpy":
                log.info("%s: variable %s (%s) is read by zarr-python on the CPU", path, name, typestr)
            else:
                log.info("%s: variable %s cannot be read (%s): loading it raises FerryError", path, name,
                         err or typestr)
            if dtype is None:   # a type numpy has no name for: an opaque placeholder keeps the open lazy
                dtype = np.dtype(object) if kind == "zarrpy" else np.dtype("V1")
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
