"""kerchunk Parquet reference sets (kerchunk.df.refs_to_dataframe, fsspec's LazyReferenceMapper):
a directory holding .zmetadata ({"metadata": {Zarr v2 metadata by key}, "record_size": N}) and,
per array, <array>/refs.<k>.parq with columns path, offset, size, raw, one row per chunk in C
order of the chunk grid, N rows a file. pyarrow reads the tables; the rows become the JSON
reference set (version 1) that ferry's C parser reads (ferry_open_opts.refs_json), which checks
them as it checks any reference set. Rows follow fsspec's reading: raw bytes inline; else path
with offset and size ([path] when both are 0); neither: no chunk (the fill value); a record
file that is not there: none of its chunks."""
from __future__ import annotations

import base64
import json
import math
import os

from . import _ferry
from ._ferry import FerryError

# the C parser's bound on a reference set's references (refs.c)
_MAX_REFS = 1 << 26
_MAX_META = 1 << 28     # bytes of .zmetadata read (the JSON form the C parser takes is capped too)


def is_parquet_refs(path) -> bool:
    """A local directory the C library detects as a Parquet reference set."""
    try:
        return os.path.isdir(path) and _ferry.format_detect(os.fspath(path)) == "refs"
    except (FerryError, OSError, TypeError, ValueError):
        return False


def _fail(path: str, msg: str) -> FerryError:
    return FerryError(_ferry.EFORMAT, f"{path}: {msg}")


def refs_json(path: str) -> str:
    """The Parquet reference set at directory `path` as a JSON reference set (version 1)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise FerryError(_ferry.EUNSUPPORTED, f"{path}: kerchunk Parquet references are read with pyarrow: "
                         "pip install pyarrow (or write the references as JSON)") from None
    import numpy as np
    zm = os.path.join(path, ".zmetadata")
    try:
        with open(zm, "rb") as f:
            text = f.read(_MAX_META + 1)
        if len(text) > _MAX_META:
            raise ValueError(f"more than {_MAX_META} bytes")
        met = json.loads(text)
        meta, record_size = met["metadata"], int(met["record_size"])
    except (OSError, ValueError, KeyError, TypeError, OverflowError) as e:
        raise _fail(zm, f"not a Parquet reference set's metadata ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict) or record_size < 1:
        raise _fail(zm, f"metadata must be an object and record_size >= 1 (found {record_size})")
    refs: dict = {}
    for key, value in meta.items():
        if key == ".zmetadata":
            continue
        refs[key] = value if isinstance(value, str) else json.dumps(value)
    total = 0
    for key in meta:
        if not key.endswith("/.zarray"):
            continue
        field = key[:-len("/.zarray")]
        parts = field.split("/")
        if not field or field.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise _fail(zm, f"{key}: the array's name must be a path inside the set (no '..', not absolute)")
        try:
            za = meta[key] if isinstance(meta[key], dict) else json.loads(meta[key])
            # integer ceilings: a float division misnumbers grids past 2**53 and overflows on huge shapes
            grid = [-(-int(s) // int(c)) for s, c in zip(za["shape"], za["chunks"])] or [1]
            sep = za.get("dimension_separator") or "."
            if sep not in (".", "/"):
                raise ValueError(f"dimension_separator {sep!r}")
        except (ValueError, KeyError, TypeError, ZeroDivisionError, AttributeError) as e:
            raise _fail(zm, f"{key}: no shape and chunks to number its chunks by ({type(e).__name__}: {e})") from None
        n = math.prod(grid)
        total += n
        if total > _MAX_REFS:
            raise _fail(path, f"more than {_MAX_REFS} chunk references (ferry reads at most that many)")
        for rec in range(math.ceil(n / record_size)):
            fn = os.path.join(path, field, f"refs.{rec}.parq")
            if not os.path.exists(fn):
                continue            # fsspec: a record never written holds no chunks
            try:
                pf = pq.ParquetFile(fn)
                if pf.metadata.num_rows > record_size:     # before the table is read
                    raise _fail(fn, f"{pf.metadata.num_rows} rows: more than record_size {record_size}")
                t = pf.read()
            except FerryError:
                raise
            except Exception as e:  # noqa: BLE001 — pyarrow's errors on a damaged file
                raise _fail(fn, f"not a readable Parquet file ({type(e).__name__}: {e})") from None
            cols = {c: t.column(c).to_pylist() for c in ("path", "offset", "size", "raw") if c in t.column_names}
            rows = t.num_rows
            if rows > record_size or ("path" not in cols and "raw" not in cols):
                raise _fail(fn, f"{rows} rows (record_size {record_size}), columns {t.column_names}: not a "
                            "reference table (path, offset, size, raw)")
            first = rec * record_size
            rows = min(rows, n - first)
            idx = np.unravel_index(np.arange(first, first + rows), grid)
            none = [None] * rows
            paths, raws = cols.get("path", none), cols.get("raw", none)
            offs, sizes = cols.get("offset", [0] * rows), cols.get("size", [0] * rows)
            for i in range(rows):
                raw, p = raws[i], paths[i]
                if raw is None and p is None:
                    continue
                k = field + "/" + sep.join(str(int(a[i])) for a in idx)
                if raw is not None:
                    refs[k] = "base64:" + base64.b64encode(raw if isinstance(raw, bytes) else
                                                           str(raw).encode()).decode()
                elif not offs[i] and not sizes[i]:
                    refs[k] = [p]
                else:
                    refs[k] = [p, offs[i], sizes[i]]
    return json.dumps({"version": 1, "refs": refs})


def dataset(ctx, path, format=None, group=None, allow_outside=False):
    """ferry.Dataset(ctx, path, format, group, allow_outside), a Parquet reference set's read
    through its JSON (refs_json)."""
    path = os.fspath(path)
    if format in (None, "refs") and is_parquet_refs(path):
        return _ferry.Dataset(ctx, path, "refs", group, allow_outside, refs_json(path))
    return _ferry.Dataset(ctx, path, format, group, allow_outside)
