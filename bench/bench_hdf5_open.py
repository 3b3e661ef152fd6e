"""Opening netCDF-4 files: engine="ferry" (the C parser) against "netcdf4" and "h5netcdf",
and reading a 10,000-chunk index against h5py. CPU only.

    python bench/bench_hdf5_open.py [--dir DIR] [--repeat 5]

Files (written here by netCDF4-python and h5py, kept in --dir for reruns):
  era5_40.nc     ERA5-like: time 24 x latitude 181 x longitude 360, 40 packed int16
                 variables (scale_factor, add_offset, _FillValue, units, long_name),
                 zlib level 1 + shuffle, one chunk per time step; coordinates time,
                 latitude, longitude
  many_2000.nc   2,000 small float32 variables (time 8 x x 16), 4 attributes each
  chunks_10k.h5  one int32 dataset of 10,000 chunks (100 x 100 of 4 x 4), v1 B-tree index
Open = xr.open_dataset(...) and the coordinate reads xarray makes there, then close; best of
--repeat, each in a fresh open (the page cache is warm for every engine alike). The chunk
index: ferry opens the file and reads one element of the dataset (which reads the whole
index: the chunk table is built on the first read) against h5py's open plus a
get_chunk_info loop over every chunk (and chunk_iter where h5py has it). Values are checked
equal before anything is timed."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))


def write_era5(p):
    import netCDF4
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("time", None)
        nc.createDimension("latitude", 181)
        nc.createDimension("longitude", 360)
        t = nc.createVariable("time", "i4", ("time",))
        t.units = "hours since 1900-01-01 00:00:00.0"
        t.calendar = "gregorian"
        t[:] = 1_000_000 + np.arange(24)
        la = nc.createVariable("latitude", "f4", ("latitude",))
        la.units = "degrees_north"
        la[:] = np.linspace(90, -90, 181)
        lo = nc.createVariable("longitude", "f4", ("longitude",))
        lo.units = "degrees_east"
        lo[:] = np.arange(360, dtype="f4")
        yy, xx = np.meshgrid(np.arange(181), np.arange(360), indexing="ij")
        base = (np.sin(yy / 20.0) * 1000 + np.cos(xx / 30.0) * 1000).astype("i2")
        for i in range(40):
            v = nc.createVariable(f"var{i:02d}", "i2", ("time", "latitude", "longitude"), zlib=True, complevel=1,
                                  shuffle=True, chunksizes=(1, 181, 360), fill_value=np.int16(-32767))
            v.scale_factor = 0.01 * (i + 1)
            v.add_offset = 273.0
            v.units = "K"
            v.long_name = f"variable number {i}"
            v.missing_value = np.int16(-32767)
            for k in range(24):
                v[k] = base + k
        nc.Conventions = "CF-1.6"
        nc.history = "written by bench_hdf5_open.py"


def write_many(p):
    import netCDF4
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("time", 8)
        nc.createDimension("x", 16)
        nc.createVariable("time", "f8", ("time",))[:] = np.arange(8.0)
        nc.createVariable("x", "f8", ("x",))[:] = np.arange(16.0)
        data = np.arange(128, dtype="f4").reshape(8, 16)
        for i in range(2000):
            v = nc.createVariable(f"v{i:04d}", "f4", ("time", "x"))
            v.units = "m"
            v.long_name = f"variable {i}"
            v.valid_min = np.float32(0)
            v.valid_max = np.float32(1000)
            v[:] = data + i


def write_chunks(p):
    import h5py
    with h5py.File(p, "w") as f:
        f.create_dataset("x", data=np.arange(400 * 400, dtype="<i4").reshape(400, 400), chunks=(4, 4))


def best(fn, repeat):
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def open_once(path, engine):
    import xarray as xr
    ds = xr.open_dataset(path, engine=engine)
    for c in ds.indexes:   # the coordinate reads: pandas indexes built at open
        ds.indexes[c]
    ds.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="where the files are written (default: a temporary folder)")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    import xarray as xr
    import ferry  # noqa: F401
    import ferry.xarray  # noqa: F401
    d = a.dir or tempfile.mkdtemp(prefix="bench_hdf5_open_")
    os.makedirs(d, exist_ok=True)
    files = {"era5_40.nc": write_era5, "many_2000.nc": write_many, "chunks_10k.h5": write_chunks}
    for name, w in files.items():
        p = os.path.join(d, name)
        if not os.path.exists(p):
            w(p)
    engines = ["ferry", "netcdf4", "h5netcdf"]
    print(f"# files in {d}; best of {a.repeat}; xarray {xr.__version__}")
    print(f"{'file':<14} " + " ".join(f"{e:>11}" for e in engines) + "   netcdf4/ferry  h5netcdf/ferry")
    for name in ("era5_40.nc", "many_2000.nc"):
        p = os.path.join(d, name)
        ref = xr.open_dataset(p, engine="netcdf4")
        got = xr.open_dataset(p, engine="ferry")
        xr.testing.assert_identical(got.isel(time=slice(0, 2)).load(), ref.isel(time=slice(0, 2)).load())
        ref.close()
        got.close()
        t = {e: best(lambda e=e: open_once(p, e), a.repeat) for e in engines}
        print(f"{name:<14} " + " ".join(f"{t[e] * 1e3:9.1f}ms" for e in engines)
              + f"   {t['netcdf4'] / t['ferry']:12.1f}x  {t['h5netcdf'] / t['ferry']:13.1f}x")

    import h5py
    p = os.path.join(d, "chunks_10k.h5")

    def ferry_index():
        with ferry.open(p) as f:
            f["x"].read((0, 0))

    def h5py_info():
        with h5py.File(p, "r") as f:
            ds = f["x"].id
            for i in range(ds.get_num_chunks()):
                ds.get_chunk_info(i)

    def h5py_iter():
        with h5py.File(p, "r") as f:
            f["x"].id.chunk_iter(lambda info: None)

    with ferry.open(p) as f, h5py.File(p, "r") as h:
        assert h["x"].id.get_num_chunks() == 10000
        np.testing.assert_array_equal(f["x"].read(), h["x"][()])
    tf, ti = best(ferry_index, a.repeat), best(h5py_info, a.repeat)
    print(f"\n10,000-chunk v1 B-tree: ferry open + index {tf * 1e3:.1f} ms; h5py open + get_chunk_info loop "
          f"{ti * 1e3:.1f} ms ({ti / tf:.1f}x)", end="")
    if hasattr(h5py.h5d.DatasetID, "chunk_iter"):
        tc = best(h5py_iter, a.repeat)
        print(f"; h5py chunk_iter {tc * 1e3:.1f} ms ({tc / tf:.1f}x)")
    else:
        print()


if __name__ == "__main__":
    main()
