"""FerryBackendEntrypoint: xarray's engine="ferry" (open_dataset, open_datatree, open_groups,
guess_can_open) over local paths and stores."""
from __future__ import annotations

import json
import os
from typing import Any, Iterable

from xarray.backends import BackendEntrypoint
from xarray.backends.store import StoreBackendEntrypoint

import ferry
from ferry import _ferry
from .common import _format_of, _gc_paused, _route
from .dask_hook import cupy_meta
from .hdf5 import _h5_groups
from .store import FerryStore
from .._parquet_refs import is_parquet_refs, refs_json
from .._remote import remote_context


# ---------------------------------------------------------------------------
# what a user may pass as the file
# ---------------------------------------------------------------------------
def _remote_error(what, proto: str) -> ferry.FerryError:
    return ferry.FerryError(_ferry.EUNSUPPORTED,
                            f"{what}: ferry reads local files and s3://, gs://, http:// and https:// URLs, not {proto}:// "
                            "(copy the data to a local disk, or open it with another engine, e.g. engine='h5netcdf' "
                            "or 'zarr' with fsspec)")


_URL_PROTOS = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "http": "http", "https": "https"}


def _local_path(obj, storage_options=None) -> str:
    """The path or URL named by what xarray's engines accept as a file: str,
    bytes (os.fsencode'd names that are not UTF-8 too), os.PathLike, file://
    URLs (as local paths), s3://, gs://, http(s):// URLs (as they are: the C
    library reads them), fsspec mappers of a local file system or of S3/GCS,
    zarr's LocalStore (and v2's DirectoryStore). Another scheme is a FerryError:
    it must never become a local path (``ftp://b/x`` is not ``./ftp:/b/x``)."""
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
                if protos[0] in ("s3", "s3a", "gs", "gcs"):
                    return f"{_URL_PROTOS[protos[0]]}://{str(root).split('://', 1)[-1].lstrip('/')}"
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
        if proto.lower() in _URL_PROTOS.values():
            return path
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
                               "device", "threads", "path_policy", "path", "decode", "lock", "storage_options", "consolidated",
                               "allow_outside", "progress")

    def guess_can_open(self, filename_or_obj) -> bool:
        return False   # opt-in only: never take files from xarray's own engines

    def open_dataset(self, filename_or_obj, *, mask_and_scale=True, decode_times=True, concat_characters=True,
                     decode_coords=True, drop_variables: str | Iterable[str] | None = None, use_cftime=None,
                     decode_timedelta=None, group: str | None = None, device: Any = "cpu", threads: int = 0,
                     path_policy: str | None = None, decode: str | None = None, lock=None,
                     storage_options: dict | None = None, consolidated: bool | None = None,
                     path: str | None = None, allow_outside: bool = False, progress: Any = None):
        """allow_outside: a kerchunk reference set (JSON, or a Parquet directory: read with
        pyarrow) may name files outside its own directory (refused otherwise, as a Zarr store's
        links leading out are)."""
        path_policy = _route(path_policy, path, "engine='ferry'")
        with _gc_paused():
            return self._open_dataset(filename_or_obj, mask_and_scale, decode_times, concat_characters, decode_coords,
                                      drop_variables, use_cftime, decode_timedelta, group, device, threads,
                                      path_policy, decode, lock, storage_options, consolidated, allow_outside,
                                      progress)

    def _open_dataset(self, filename_or_obj, mask_and_scale, decode_times, concat_characters, decode_coords,
                      drop_variables, use_cftime, decode_timedelta, group, device, threads, path_policy, decode,
                      lock, storage_options, consolidated, allow_outside, progress):
        if isinstance(filename_or_obj, FerryStore):
            store = filename_or_obj
        else:
            p = _local_path(filename_or_obj, storage_options)
            so = _storage_options(filename_or_obj, storage_options)
            if consolidated is not None and _format_of(p, remote_context(so)) != "zarr":
                raise ValueError(f"{p}: consolidated= applies to Zarr stores only")
            store = FerryStore(p, group=group, device=device, threads=threads, path_policy=path_policy, decode=decode,
                               mask_and_scale=mask_and_scale, decode_times=decode_times,
                               decode_timedelta=decode_timedelta, lock=lock, allow_outside=allow_outside,
                               progress=progress, storage_options=so)
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
                            threads: int = 0, path_policy: str | None = None, lock=None,
                            storage_options: dict | None = None, consolidated: bool | None = None,
                            path: str | None = None) -> dict:
        path_policy = _route(path_policy, path, "engine='ferry'")
        p = _local_path(filename_or_obj, storage_options)
        so = _storage_options(filename_or_obj, storage_options)
        fmt = _format_of(p, remote_context(so))
        root = (group or "/").rstrip("/") or "/"
        if fmt == "hdf5":
            groups = [g for g in _h5_groups(p) if g == root or g.startswith(root.rstrip("/") + "/") or root == "/"]
        elif fmt in ("zarr", "refs"):
            groups = _zarr_groups(p, root, remote_context(so))
        else:
            groups = ["/"]
        out = {}
        for g in groups:
            ds = self.open_dataset(p, mask_and_scale=mask_and_scale, decode_times=decode_times,
                                   concat_characters=concat_characters, decode_coords=decode_coords,
                                   drop_variables=drop_variables, use_cftime=use_cftime,
                                   decode_timedelta=decode_timedelta, group=None if g == "/" else g,
                                   device=device, threads=threads, path_policy=path_policy, lock=lock,
                                   consolidated=consolidated, storage_options=so)
            rel = "/" + g[len(root):].lstrip("/") if root != "/" else g
            out[rel] = ds
        return out

    def open_datatree(self, filename_or_obj, *, mask_and_scale=True, decode_times=True, concat_characters=True,
                      decode_coords=True, drop_variables=None, use_cftime=None, decode_timedelta=None,
                      group: str | None = None, device: Any = "cpu", threads: int = 0,
                      path_policy: str | None = None, lock=None, storage_options: dict | None = None,
                      consolidated: bool | None = None, path: str | None = None):
        path_policy = _route(path_policy, path, "engine='ferry'")
        from xarray import DataTree
        d = self.open_groups_as_dict(filename_or_obj, mask_and_scale=mask_and_scale, decode_times=decode_times,
                                     concat_characters=concat_characters, decode_coords=decode_coords,
                                     drop_variables=drop_variables, use_cftime=use_cftime,
                                     decode_timedelta=decode_timedelta, group=group, device=device,
                                     threads=threads, path_policy=path_policy, lock=lock,
                                     storage_options=storage_options,
                                     consolidated=consolidated)
        return DataTree.from_dict(d)


def _storage_options(obj, storage_options):
    """storage_options as given, else those of an fsspec mapper of S3/GCS."""
    if storage_options:
        return storage_options
    fs = getattr(obj, "fs", None)
    return dict(getattr(fs, "storage_options", None) or {}) if fs is not None else None


def _zarr_groups(store: str, root: str, ctx=None) -> list:
    out = []
    text = refs_json(store) if is_parquet_refs(store) else None   # a Parquet reference set: read once

    def walk(g):
        out.append(g)
        ds = ferry.Dataset(ctx or ferry.default_context(), store, None, None if g == "/" else g.strip("/"),
                           refs_json=text)
        try:
            children = json.loads(ds.groups)
        finally:
            ds.close()
        for c in children:
            walk((g.rstrip("/") + "/" + c) if g != "/" else "/" + c)
    walk(root)
    return out


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
