"""Test datasets written as users' tools write them, one chunk per step of the first dimension
(time): netCDF-4 zlib + shuffle through netCDF4, or Zarr v3 zstd (level 1) through zarr-python.
Skips the calling test when the writer is not installed."""
import pytest


def write_step_chunked(ds, path, fmt):
    """Write xarray Dataset `ds` to `path`: fmt "nc4" (netCDF-4, zlib + shuffle) or "zarr" (Zarr v3,
    zstd), every data variable chunked (1, rest of its shape)."""
    chunks = {n: (1,) + ds[n].shape[1:] for n in ds.data_vars}
    if fmt == "nc4":
        pytest.importorskip("netCDF4")
        ds.to_netcdf(path, engine="netcdf4", encoding={n: {"zlib": True, "shuffle": True, "chunksizes": c}
                                                       for n, c in chunks.items()})
    elif fmt == "zarr":
        zarr = pytest.importorskip("zarr")
        ds.to_zarr(path, zarr_format=3, consolidated=False, encoding={
            n: {"chunks": c, "compressors": [zarr.codecs.ZstdCodec(level=1)]} for n, c in chunks.items()})
    else:
        raise ValueError(f"write_step_chunked: fmt {fmt!r} (nc4 or zarr)")
    return path
