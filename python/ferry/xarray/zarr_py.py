"""The zarr-python fallback: Zarr arrays ferry's parser cannot read (types, codecs, chunk grids
it lacks) read by zarr-python, or, without zarr installed, refused with the parser's message."""
from __future__ import annotations

import base64
import struct

import numpy as np

from .common import _VarSpec, log


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


def _zarr_py_spec(path: str, group: str | None, name: str, store: dict, shape: tuple, why: str | None = None,
                  arr=None):
    """A variable ferry's parser does not read (variable-length strings, Zarr v3
    string/bytes types, codecs, filters or chunk grids ferry lacks; `why` is the
    parser's message): metadata and data through zarr-python, as xarray's zarr
    backend has them. None (and a log line) when zarr is not importable or cannot
    open the array either; the caller then keeps ferry's description. store: the
    C parser's Dataset.store_info (Zarr format, and whether the node is an array).
    arr: the zarr array when the caller opened it (refs_py.py), else it is opened by path."""
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
        if arr is None:
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
    # the zarr engine's keys (zarr_codecs.py builds the same for the arrays ferry reads)
    encoding = {"chunks": tuple(arr.chunks), "preferred_chunks": dict(zip(d, arr.chunks)),
                "compressors": arr.compressors, "filters": arr.filters, "shards": arr.shards}
    if zv == 3:
        encoding["serializer"] = arr.serializer
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
