#!/usr/bin/env python3
"""xarray → GPU: engine="ferry" against the paths users have today (issue 4).

Writes N float32 variables (time × lat × lon, about --gib GiB in all) as
netCDF-3 (CDF-2), netCDF-4 (HDF5, contiguous), netCDF-4 compressed (zlib +
shuffle, one chunk per time step) and Zarr v2 uncompressed and zstd (when zarr is importable), then,
page cache warm (each file read once before timing), measures

  * whole dataset → GPU: ferry `open_dataset(engine="ferry", device=0).load()`
    vs `open_dataset(engine=E)` + `cupy.asarray(ds[v].values)` per variable for
    every importable engine E (scipy, netcdf4, h5netcdf, zarr) and plain h5py;
  * training-style access: --steps random time steps, all variables, one step
    at a time (`ds.isel(time=i).load()` vs per-variable cupy.asarray),
  * the same under dask on the compressed netCDF-4 file: `chunks={}` (the HDF5
    chunks), --dask-steps steps of `isel(time=i).compute()`,

verifies ferry's data against the reference read, and prints a table with
GB/s and ferry's ratio to each baseline. Best of --reps.

    python3 bench/bench_xarray.py --gib 4           # the issue's 4 GiB, 20 variables
    python3 bench/bench_xarray.py --smoke           # tiny, for CI-like checks
    python3 bench/bench_xarray.py --device cpu      # host memory (numpy) instead of a GPU
"""
import argparse
import gc
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from harness import Dev, best, have, log, warm  # noqa: E402


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------
def var_data(i, nt, ny, nx):
    """Deterministic, cheap, mildly compressible float32 field for variable i."""
    t = np.arange(nt, dtype=np.float32)[:, None, None]
    y = np.linspace(-1, 1, ny, dtype=np.float32)[None, :, None]
    x = np.linspace(0, 6.28, nx, dtype=np.float32)[None, None, :]
    a = (250 + 10 * i + 20 * y * y + 5 * np.sin(x + 0.1 * t)).astype(np.float32)
    a += (np.arange(a.size, dtype=np.uint32).reshape(a.shape) % 97).astype(np.float32) * 1e-3
    return a


def coords(nt, ny, nx):
    return (np.arange(nt, dtype=np.float64), np.linspace(-90, 90, ny), np.linspace(0, 360, nx, endpoint=False))


def write_nc3(path, names, nt, ny, nx):
    import xarray as xr
    t, la, lo = coords(nt, ny, nx)
    ds = xr.Dataset({n: (("time", "lat", "lon"), var_data(i, nt, ny, nx), {"units": "K"})
                     for i, n in enumerate(names)},
                    coords={"time": ("time", t, {"units": "hours since 2000-01-01"}), "lat": la, "lon": lo})
    ds.to_netcdf(path, engine="scipy", format="NETCDF3_64BIT")


def write_h5(path, names, nt, ny, nx, compress):
    """netCDF-4 file: with netCDF4 or h5netcdf through xarray when importable,
    else with h5py directly (dimension scales, as netCDF-4 lays them out)."""
    import xarray as xr
    t, la, lo = coords(nt, ny, nx)
    enc = {}
    for n in names:
        enc[n] = ({"zlib": True, "complevel": 1, "shuffle": True, "chunksizes": (1, ny, nx)} if compress
                  else {"contiguous": True})
    eng = "netcdf4" if have("netCDF4") else ("h5netcdf" if have("h5netcdf") else None)
    if eng:
        ds = xr.Dataset({n: (("time", "lat", "lon"), var_data(i, nt, ny, nx), {"units": "K"})
                         for i, n in enumerate(names)},
                        coords={"time": ("time", t, {"units": "hours since 2000-01-01"}), "lat": la, "lon": lo})
        if eng == "h5netcdf":
            for n in names:
                e = enc[n]
                enc[n] = ({"compression": "gzip", "compression_opts": 1, "shuffle": True,
                           "chunksizes": e["chunksizes"]} if compress else {})
        ds.to_netcdf(path, engine=eng, format="NETCDF4", encoding=enc)
        return eng
    import h5py
    with h5py.File(path, "w") as f:
        for name, v in (("time", t), ("lat", la), ("lon", lo)):
            d = f.create_dataset(name, data=v)
            d.make_scale(name)
        f["time"].attrs["units"] = "hours since 2000-01-01"
        for i, n in enumerate(names):
            kw = dict(chunks=(1, ny, nx), compression="gzip", compression_opts=1, shuffle=True) if compress else {}
            d = f.create_dataset(n, data=var_data(i, nt, ny, nx), **kw)
            d.attrs["units"] = "K"
            for k, dim in enumerate(("time", "lat", "lon")):
                d.dims[k].attach_scale(f[dim])
    return "h5py"


def write_zarr(path, names, nt, ny, nx, compress):
    """Zarr v2 written by xarray, one chunk per time step (as nc4z): uncompressed,
    or zstd (level 1) when compress."""
    import numcodecs
    import xarray as xr
    t, la, lo = coords(nt, ny, nx)
    ds = xr.Dataset({n: (("time", "lat", "lon"), var_data(i, nt, ny, nx)) for i, n in enumerate(names)},
                    coords={"time": t, "lat": la, "lon": lo})
    comp = numcodecs.Zstd(level=1) if compress else None
    ds.to_zarr(path, zarr_format=2, consolidated=True,
               encoding={n: {"chunks": (1, ny, nx), "compressors": comp} for n in names})


# ---------------------------------------------------------------------------
# the readers compared
# ---------------------------------------------------------------------------
def engine_ferry():
    """engine="ferry" when the package is installed (entry point), else the class itself."""
    import xarray as xr
    from ferry.xarray import FerryBackendEntrypoint
    return "ferry" if "ferry" in xr.backends.list_engines() else FerryBackendEntrypoint


def ferry_load(path, names, dev, **kw):
    import xarray as xr
    dv = dev.device
    ds = xr.open_dataset(path, engine=engine_ferry(), device=dv, **kw)
    ds.load()
    dev.sync()
    return {n: ds[n].data for n in names}


def engine_load(path, names, dev, engine, **kw):
    import xarray as xr
    ds = xr.open_dataset(path, engine=engine, **kw)
    out = {n: dev.to(ds[n].values) for n in names}
    dev.sync()
    ds.close()
    return out


def h5py_load(path, names, dev):
    import h5py
    with h5py.File(path, "r") as f:
        out = {n: dev.to(f[n][...]) for n in names}
    dev.sync()
    return out


def ferry_steps(path, names, dev, steps, **kw):
    import xarray as xr
    dv = dev.device
    ds = xr.open_dataset(path, engine=engine_ferry(), device=dv, **kw)
    last = None
    for i in steps:
        last = ds.isel(time=int(i)).load()
    dev.sync()
    return last


def engine_steps(path, names, dev, steps, engine, **kw):
    import xarray as xr
    ds = xr.open_dataset(path, engine=engine, **kw)
    last = None
    for i in steps:
        sub = ds.isel(time=int(i))
        last = {n: dev.to(sub[n].values) for n in names}
    dev.sync()
    ds.close()
    return last


def ferry_dask_steps(path, names, dev, steps):
    """chunks={} (dask, one chunk per HDF5 chunk), then one time step at a time:
    a training loop over a dask-backed dataset. GPU chunks are cupy with no
    preprocess (issue 15 item 7)."""
    import xarray as xr
    ds = xr.open_dataset(path, engine=engine_ferry(), device=dev.device, chunks={})
    last = None
    for i in steps:
        last = ds.isel(time=int(i)).compute(scheduler="threads")
    dev.sync()
    return last


def engine_dask_steps(path, names, dev, steps, engine):
    import xarray as xr
    ds = xr.open_dataset(path, engine=engine, chunks={})
    last = None
    for i in steps:
        sub = ds.isel(time=int(i)).compute(scheduler="threads")
        last = {n: dev.to(sub[n].values) for n in names}
    dev.sync()
    ds.close()
    return last


def h5py_steps(path, names, dev, steps):
    import h5py
    with h5py.File(path, "r") as f:
        ds = {n: f[n] for n in names}
        last = None
        for i in steps:
            last = {n: dev.to(ds[n][int(i)]) for n in names}
    dev.sync()
    return last


# ---------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=4.0, help="total size of the data variables (GiB)")
    ap.add_argument("--zgib", type=float, default=None, help="size for the compressed file (default: --gib)")
    ap.add_argument("--nvars", type=int, default=20)
    ap.add_argument("--ny", type=int, default=360)
    ap.add_argument("--nx", type=int, default=720)
    ap.add_argument("--steps", type=int, default=1000, help="random time steps for the access-pattern test")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dask-steps", type=int, default=200,
                    help="time steps of the chunks={} (dask) loop over the compressed netCDF-4 file")
    ap.add_argument("--device", default="0", help="GPU ordinal, or 'cpu'")
    ap.add_argument("--dir", default=None, help="where to write the files (default: a temp dir)")
    ap.add_argument("--formats", default="nc3,nc4,nc4z,zarr,zarrz",
                    help="nc3, nc4, nc4z (zlib), zarr (v2 uncompressed), zarrz (v2 zstd)")
    ap.add_argument("--keep", action="store_true", help="keep the files")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one rep")
    a = ap.parse_args()
    if a.smoke:
        a.gib, a.ny, a.nx, a.steps, a.reps, a.nvars = 0.02, 90, 180, 30, 1, 4
    import ferry  # noqa: F401
    import ferry.xarray  # noqa: F401
    dev = Dev("cpu" if a.device == "cpu" else a.device)
    if not dev.cpu:
        try:
            import cupy
            if cupy.cuda.runtime.getDeviceCount() == 0:
                raise RuntimeError("no GPU")
        except Exception as e:  # noqa: BLE001
            print(f"skip: no cupy/GPU ({e}); use --device cpu")
            return 0
    names = [f"v{i:02d}" for i in range(a.nvars)]
    step_bytes = a.ny * a.nx * 4
    nt = max(2, int(round(a.gib * (1 << 30) / (a.nvars * step_bytes))))
    ntz = max(2, int(round((a.zgib or a.gib) * (1 << 30) / (a.nvars * step_bytes))))
    root = a.dir or tempfile.mkdtemp(prefix="ferry-bench-xr-")
    os.makedirs(root, exist_ok=True)
    fmts = [f.strip() for f in a.formats.split(",") if f.strip()]
    rows = []
    rng = np.random.default_rng(0)
    print(f"# ferry xarray benchmark: {a.nvars} float32 variables, time x lat x lon = {nt} x {a.ny} x {a.nx}, "
          f"{nt * step_bytes * a.nvars / 1e9:.2f} GB, device {a.device}, best of {a.reps}, warm page cache")
    try:
        for fmt in fmts:
            if fmt in ("zarr", "zarrz") and not have("zarr"):
                print("# zarr: skipped (zarr not importable)")
                continue
            n_t = ntz if fmt in ("nc4z", "zarrz") else nt
            total = n_t * step_bytes * a.nvars
            path = os.path.join(root, {"nc3": "a.nc", "nc4": "b.nc", "nc4z": "c.nc", "zarr": "d.zarr", "zarrz": "e.zarr"}[fmt])
            t0 = time.perf_counter()
            if not os.path.exists(path):
                if fmt == "nc3":
                    write_nc3(path, names, n_t, a.ny, a.nx)
                    writer = "scipy"
                elif fmt in ("nc4", "nc4z"):
                    writer = write_h5(path, names, n_t, a.ny, a.nx, compress=(fmt == "nc4z"))
                else:
                    write_zarr(path, names, n_t, a.ny, a.nx, compress=(fmt == "zarrz"))
                    writer = "zarr"
            else:
                writer = "existing"
            log(f"{fmt}: wrote {path} ({writer}) in {time.perf_counter() - t0:.1f}s")
            warm(path)
            engines = {"nc3": ["scipy", "netcdf4"], "nc4": ["netcdf4", "h5netcdf"], "nc4z": ["netcdf4", "h5netcdf"],
                       "zarr": ["zarr"], "zarrz": ["zarr"]}[fmt]
            engines = [e for e in engines if have({"scipy": "scipy", "netcdf4": "netCDF4", "h5netcdf": "h5netcdf",
                                                   "zarr": "zarr"}[e])]
            kw_for = {"zarr": {"consolidated": True}}  # engine="zarr" for both Zarr stores
            # whole dataset
            t_f, got = best(lambda: ferry_load(path, names, dev), a.reps)
            base = []
            for e in engines:
                t_e, ref = best(lambda: engine_load(path, names, dev, e, **kw_for.get(e, {})), a.reps)
                ok = all(dev.equal(got[n], ref[n]) for n in names)
                base.append((f"engine={e} + asarray", t_e, ok))
                del ref
            if fmt in ("nc4", "nc4z") and have("h5py"):
                t_h, ref = best(lambda: h5py_load(path, names, dev), a.reps)
                ok = all(dev.equal(got[n], ref[n]) for n in names)
                base.append(("h5py + asarray", t_h, ok))
                del ref
            del got
            gc.collect()
            rows.append((fmt, "load all", "ferry .load()", total / t_f / 1e9, None, None))
            for label, t_e, ok in base:
                rows.append((fmt, "load all", label, total / t_e / 1e9, t_e / t_f, ok))
            # random time steps
            steps = rng.integers(0, n_t, a.steps)
            sb = step_bytes * a.nvars * len(steps)
            t_fs, last_f = best(lambda: ferry_steps(path, names, dev, steps), 1)
            rows.append((fmt, f"{len(steps)} steps", "ferry isel().load()", sb / t_fs / 1e9, None, None))
            for e in engines[:1]:
                t_es, last_e = best(lambda: engine_steps(path, names, dev, steps, e, **kw_for.get(e, {})), 1)
                ok = all(dev.equal(last_f[n].data, last_e[n]) for n in names)
                rows.append((fmt, f"{len(steps)} steps", f"engine={e} + asarray", sb / t_es / 1e9, t_es / t_fs, ok))
            if fmt in ("nc4", "nc4z") and have("h5py"):
                t_hs, last_h = best(lambda: h5py_steps(path, names, dev, steps), 1)
                ok = all(dev.equal(last_f[n].data, last_h[n]) for n in names)
                rows.append((fmt, f"{len(steps)} steps", "h5py + asarray", sb / t_hs / 1e9, t_hs / t_fs, ok))
            rows.append((fmt, f"{len(steps)} steps", "ferry steps/s", len(steps) / t_fs, None, None))
            if fmt == "nc4z" and have("dask") and engines:
                ds_steps = steps[:max(1, min(len(steps), a.dask_steps))]
                sbd = step_bytes * a.nvars * len(ds_steps)
                t_fd, last_fd = best(lambda: ferry_dask_steps(path, names, dev, ds_steps), 1)
                acc = f"{len(ds_steps)} dask st"
                rows.append((fmt, acc, "ferry chunks={} isel", sbd / t_fd / 1e9, None, None))
                t_ed, last_ed = best(lambda: engine_dask_steps(path, names, dev, ds_steps, engines[0]), 1)
                ok = all(dev.equal(last_fd[n].data, last_ed[n]) for n in names)
                rows.append((fmt, acc, f"engine={engines[0]} chunks={{}}", sbd / t_ed / 1e9, t_ed / t_fd, ok))
            if not a.keep and not a.dir:
                shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)
    finally:
        if not a.keep and not a.dir:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"| {'format':6} | {'access':11} | {'method':26} | {'GB/s':>8} | {'ferry ×':>8} | data |")
    print(f"|{'-' * 8}|{'-' * 13}|{'-' * 28}|{'-' * 10}|{'-' * 10}|------|")
    for fmt, acc, meth, gbs, ratio, ok in rows:
        unit = f"{gbs:8.2f}" if "steps/s" not in meth else f"{gbs:7.1f}/s"
        r = f"{ratio:8.1f}" if ratio is not None else f"{'':8}"
        okc = "" if ok is None else ("ok" if ok else "DIFF")
        print(f"| {fmt:6} | {acc:11} | {meth:26} | {unit:>8} | {r} | {okc:4} |")
    import ferry as fr
    s = fr.stats()
    print(f"\nferry paths: " + ", ".join(f"{p} {s[p]['bytes'] / 1e9:.2f} GB" for p in ("cufile", "staged", "host")
                                        if s[p]["bytes"]))
    bad = [r for r in rows if r[5] is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
