"""Opening netCDF-4 files: engine="ferry" (the C parser) against "netcdf4" and "h5netcdf",
with the floor every engine shares (xarray's own work), and reading a 10,000-chunk index
against h5py. CPU only.

    python bench/bench_hdf5_open.py [--dir DIR] [--repeat 7] [--slow-repeat 3]

Files (written here by netCDF4-python and h5py, kept in --dir for reruns):
  era5_40.nc     ERA5-like: time 24 x latitude 181 x longitude 360, 40 variables (three in
                 four int16 packed with scale_factor / add_offset / _FillValue /
                 missing_value, one in four float32 with a NaN _FillValue), 21 attributes
                 each (units, long_name, standard_name, GRIB_* keys), zlib level 1 +
                 shuffle, one chunk per time step; coordinates time (hours since 1900,
                 gregorian; a fixed dimension), latitude, longitude
  era5_2000.nc   the same kind of file with 2,000 variables on a 4 x 11 x 20 grid
  chunks_10k.h5  one int32 dataset of 10,000 chunks (100 x 100 of 4 x 4), v1 B-tree index
Open = xr.open_dataset(...) and the coordinate reads xarray makes there (the time
coordinate decoded, the pandas indexes built), then close. Each rep opens each engine once,
in an order rotated per rep; the figures are the median and the range (min-max) over
--repeat reps (--slow-repeat for h5netcdf on the 2,000-variable file, seconds an open).
ferry keeps no parsed metadata between opens (each open parses the file again; the page
cache is warm for every engine alike).

The floor: the same open split into ferry's part (parse, variable descriptions, lazy
arrays, close) and xarray's (decode_cf_variables, the Dataset constructor, then what
open_dataset does after the backend returns: copy-on-write wrappers, default indexes with
the coordinate reads). xarray's part is what any engine pays for these variables; netcdf4's
open divided by it is the most any backend could reach. Values are checked equal (to
netcdf4, with encoding) before anything is timed.

Why time is not unlimited here: netCDF-C finds an unlimited dimension's length by looking
at every variable along it, and xarray's netcdf4 engine asks for each variable's shape, so
its open grows with the square of the variable count (seconds at 2,000 variables); ferry
and h5netcdf do not. The fixed dimension compares the engines' per-variable work."""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))


def _era5_attrs(i: int, packed: bool) -> dict:
    """ERA5 as the CDS converts it from GRIB: CF keys and a long tail of GRIB_* ones."""
    a = {"units": "K" if i % 2 else "m s**-1", "long_name": f"ERA5 parameter number {i}",
         "standard_name": "air_temperature" if i % 2 else "eastward_wind",
         "GRIB_paramId": np.int32(130 + i), "GRIB_dataType": "an", "GRIB_numberOfPoints": np.int32(65160),
         "GRIB_typeOfLevel": "surface", "GRIB_stepUnits": np.int32(1), "GRIB_stepType": "instant",
         "GRIB_gridType": "regular_ll", "GRIB_NV": np.int32(0), "GRIB_Nx": np.int32(360), "GRIB_Ny": np.int32(181),
         "GRIB_cfName": "unknown", "GRIB_cfVarName": f"p{i}", "GRIB_gridDefinitionDescription":
         "Latitude/Longitude Grid", "GRIB_iDirectionIncrementInDegrees": np.float64(1.0),
         "GRIB_iScansNegatively": np.int32(0), "GRIB_jDirectionIncrementInDegrees": np.float64(1.0),
         "GRIB_jPointsAreConsecutive": np.int32(0), "GRIB_jScansPositively": np.int32(0)}
    if packed:
        a["scale_factor"] = 0.01 * (i + 1)
        a["add_offset"] = 273.0 + i
        a["missing_value"] = np.int16(-32767)
    return a


def write_era5(p, nvars=40, nt=24, ny=181, nx=360):
    import netCDF4
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("time", nt)   # fixed, as the CDS writes it (an unlimited one: see below)
        nc.createDimension("latitude", ny)
        nc.createDimension("longitude", nx)
        t = nc.createVariable("time", "i4", ("time",))
        t.units = "hours since 1900-01-01 00:00:00.0"
        t.long_name = "time"
        t.calendar = "gregorian"
        t[:] = 1_000_000 + np.arange(nt)
        la = nc.createVariable("latitude", "f4", ("latitude",))
        la.units = "degrees_north"
        la.long_name = "latitude"
        la[:] = np.linspace(90, -90, ny)
        lo = nc.createVariable("longitude", "f4", ("longitude",))
        lo.units = "degrees_east"
        lo.long_name = "longitude"
        lo[:] = np.linspace(0, 359, nx, dtype="f4")
        yy, xx = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
        base = (np.sin(yy / 20.0) * 1000 + np.cos(xx / 30.0) * 1000).astype("i2")
        for i in range(nvars):
            packed = i % 4 != 3
            typ, fill = ("i2", np.int16(-32767)) if packed else ("f4", np.float32(np.nan))
            v = nc.createVariable(f"var{i:04d}", typ, ("time", "latitude", "longitude"), zlib=True, complevel=1,
                                  shuffle=True, chunksizes=(1, ny, nx), fill_value=fill)
            v.setncatts(_era5_attrs(i, packed))
            for k in range(nt):
                v[k] = base + k if packed else (base + k).astype("f4") / 10
        nc.Conventions = "CF-1.6"
        nc.history = "written by bench_hdf5_open.py"


def write_era5_2000(p):
    write_era5(p, nvars=2000, nt=4, ny=11, nx=20)


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


def split_once(path) -> tuple:
    """(ferry's part, xarray's decode + Dataset, xarray after the backend) of one
    engine="ferry" open, in seconds: the steps xarray's StoreBackendEntrypoint and
    open_dataset take, timed apart (the first two with the collector paused, as the
    backend's open_dataset runs them)."""
    import xarray as xr
    from xarray import conventions
    from xarray.backends.api import _dataset_from_backend_dataset
    from xarray.core.coordinates import Coordinates
    from ferry.xarray import FerryStore
    from ferry.xarray import backend
    with getattr(backend, "_gc_paused", contextlib.nullcontext)():
        t0 = time.perf_counter()
        st = FerryStore(path)
        variables, attrs = st.load()
        enc = st.get_encoding()
        t1 = time.perf_counter()
        variables, attrs, coord_names = conventions.decode_cf_variables(variables, attrs)
        data, coords = {}, {}
        for n, v in variables.items():
            (coords if n in coord_names or v.dims == (n,) else data)[n] = v
        ds = xr.Dataset(data, coords=Coordinates(coords, indexes={}), attrs=attrs)
        ds.set_close(st.close)
        ds.encoding = enc
        t2 = time.perf_counter()
    ds = _dataset_from_backend_dataset(ds, path, "ferry", None, None, None, False, None, None, True)
    for c in ds.indexes:
        ds.indexes[c]
    t3 = time.perf_counter()
    ds.close()
    t4 = time.perf_counter()
    return (t1 - t0) + (t4 - t3), t2 - t1, t3 - t2


def med(ts):
    return statistics.median(ts)


def fmt(ts):
    return f"{med(ts) * 1e3:8.1f} ({min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="where the files are written (default: a temporary folder)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--slow-repeat", type=int, default=3, help="reps of h5netcdf on the 2,000-variable file")
    ap.add_argument("--engines", default="ferry,netcdf4,h5netcdf", help="comma-separated; ferry and netcdf4 always")
    ap.add_argument("--gc-on", action="store_true",
                    help="leave Python's cyclic collector on during ferry's open (what it costs)")
    a = ap.parse_args()
    if a.gc_on:
        from ferry.xarray import backend
        backend._gc_paused = contextlib.nullcontext
    import xarray as xr
    import ferry  # noqa: F401
    import ferry.xarray  # noqa: F401
    d = a.dir or tempfile.mkdtemp(prefix="bench_hdf5_open_")
    os.makedirs(d, exist_ok=True)
    files = {"era5_40.nc": write_era5, "era5_2000.nc": write_era5_2000, "chunks_10k.h5": write_chunks}
    for name, w in files.items():
        p = os.path.join(d, name)
        if not os.path.exists(p):
            w(p)
    engines = ["ferry", "netcdf4"] + [e for e in a.engines.split(",") if e not in ("ferry", "netcdf4", "")]
    print(f"# files in {d}; median (min-max) ms of {a.repeat} reps; xarray {xr.__version__}")
    for name in ("era5_40.nc", "era5_2000.nc"):
        p = os.path.join(d, name)
        ref = xr.open_dataset(p, engine="netcdf4")
        got = xr.open_dataset(p, engine="ferry")
        xr.testing.assert_identical(got.isel(time=slice(0, 2)).load(), ref.isel(time=slice(0, 2)).load())
        for v in ref.variables:
            e1, e2 = dict(got[v].encoding), dict(ref[v].encoding)
            # repr: a NaN _FillValue equals itself there
            assert repr(sorted((k, e1[k]) for k in e1 if k != "source")) == \
                repr(sorted((k, e2[k]) for k in e2 if k != "source")), v
        ref.close()
        got.close()
        t = {e: [] for e in engines}
        for rep in range(a.repeat):
            for e in engines[rep % len(engines):] + engines[:rep % len(engines)]:
                if e == "h5netcdf" and name == "era5_2000.nc" and rep >= a.slow_repeat:
                    continue
                t0 = time.perf_counter()
                open_once(p, e)
                t[e].append(time.perf_counter() - t0)
        parts = [split_once(p) for _ in range(a.repeat)]
        own, dec, post = [x[0] for x in parts], [x[1] for x in parts], [x[2] for x in parts]
        xa = [x[1] + x[2] for x in parts]
        print(f"\n{name}")
        for e in engines:
            print(f"  {e:<9} {fmt(t[e])}" + ("" if e == "ferry" else f"   {e}/ferry {med(t[e]) / med(t['ferry']):5.1f}x"
                                             f" (range {min(t[e]) / max(t['ferry']):.1f}-"
                                             f"{max(t[e]) / min(t['ferry']):.1f})"))
        print(f"  ferry split: ferry's own {fmt(own)}; xarray's own {fmt(xa)} = CF decode + Dataset {fmt(dec)} "
              f"+ after the backend {fmt(post)}")
        print(f"  netcdf4 / xarray's own = {med(t['netcdf4']) / med(xa):.1f}x: the most any engine could reach on "
              "xarray's path")


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
