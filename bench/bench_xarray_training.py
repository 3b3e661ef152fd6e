#!/usr/bin/env python3
"""Training batches from xarray data (issue 14): ferry.torch.XarrayDataset against what weather
models train with today, on the same ERA5-like files in one run.

Data: --nvars float32 variables (time × lat × lon, 0.5° grid by default), about --gib GiB, one
chunk per time step, written as netCDF-4 zlib+shuffle (nc4z), Zarr v3 zstd (zarrz, when zarr
imports) and netCDF-3 uncompressed (nc3). Page cache warm. Rows per format (GB/s of batch
data delivered on the GPU, shuffled time steps, batch --batch):

  limit     ferry's own `open_dataset(engine="ferry", device=0).load()` of the same data
  ferry     XarrayDataset(... device="cuda") iterated for one epoch
  dali      the same through ferry.dali's pipeline (DALI source cost), when DALI imports
  loader    map-style Dataset doing ds.isel(time=i) with xarray's own engine in DataLoader
            workers (8 and 16, pin_memory) then .cuda() — what xbatcher's torch loader does
  physicsnemo  a DALI pipeline whose parallel external_source reads h5py per sample on the CPU
            (NVIDIA PhysicsNeMo's ERA5 datapipe pattern), nc4z only, when DALI imports
  idle      GPU idle fraction behind a step sized to consume --step-gbps GB/s

    python3 bench/bench_xarray_training.py --gib 4
    python3 bench/bench_xarray_training.py --smoke --device cpu
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
sys.path.insert(0, here)
from harness import have, log, warm  # noqa: E402
from bench_xarray import coords, var_data, write_h5, write_nc3  # noqa: E402


def write_zarr3(path, names, nt, ny, nx):
    import xarray as xr
    import zarr
    t, la, lo = coords(nt, ny, nx)
    ds = xr.Dataset({n: (("time", "lat", "lon"), var_data(i, nt, ny, nx)) for i, n in enumerate(names)},
                    coords={"time": ("time", t, {"units": "hours since 2000-01-01"}), "lat": la, "lon": lo})
    ds.to_zarr(path, zarr_format=3, consolidated=False,
               encoding={n: {"chunks": (1, ny, nx), "compressors": [zarr.codecs.ZstdCodec(level=1)]}
                         for n in names})


def sync(device):
    if device != "cpu":
        import torch
        torch.cuda.synchronize()


def rate(nbytes, secs):
    return nbytes / secs / 1e9


def ferry_load_rate(path, names, device):
    import xarray as xr
    from ferry.xarray import FerryBackendEntrypoint
    dev = "cpu" if device == "cpu" else 0
    best = None
    for _ in range(2):
        t0 = time.perf_counter()
        ds = xr.open_dataset(path, engine=FerryBackendEntrypoint, device=dev)
        ds.load()
        sync(device)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
        nb = sum(ds[n].nbytes for n in names)
        ds.close()
    return rate(nb, best)


def ferry_epoch(path, names, device, batch, dali=False, step_gbps=None):
    import torch
    import xarray as xr
    from ferry.torch import XarrayDataset
    from ferry.xarray import FerryBackendEntrypoint
    ds = xr.open_dataset(path, engine=FerryBackendEntrypoint, device="cpu")
    xd = XarrayDataset(ds, names, batch_size=batch, shuffle=True, seed=1, device=device, prefetch=4)
    it = None
    if dali:
        import ferry.dali
        pipe = ferry.dali.pipeline(xd, outputs=("x",), prefetch_queue_depth=2)
        pipe.build()

        def batches():
            try:
                while True:
                    yield pipe.run()[0]
            except StopIteration:
                return
        it = batches
    else:
        it = lambda: iter(xd)  # noqa: E731
    per = batch * len(names) * int(np.prod(xd.spatial)) * 4
    # warm-up pass (opens files, fills the allocator), then the timed epoch
    for k, b in enumerate(it()):
        if k >= 3:
            break
    if dali:
        pipe.reset()
    n, busy = 0, 0.0
    t0 = time.perf_counter()
    for b in it():
        n += 1
        if step_gbps and device != "cpu":
            d = per / (step_gbps * 1e9)
            torch.cuda._sleep(int(d * 1.98e9))     # ~SM clock cycles at 1.98 GHz: a busy GPU for d s
            busy += d
    sync(device)
    dt = time.perf_counter() - t0
    return rate(n * per, dt), (1 - busy / dt) if (step_gbps and device != "cpu") else None


class _IselDataset:
    """What xbatcher + DataLoader do: one sample = ds.isel(time=i) read by xarray's own engine."""

    def __init__(self, path, engine, names):
        self.path, self.engine, self.names = path, engine, names
        self.ds = None
        import xarray as xr
        with xr.open_dataset(path, engine=engine) as d:
            self.n = d.sizes["time"]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        import xarray as xr
        if self.ds is None:
            self.ds = xr.open_dataset(self.path, engine=self.engine)
        s = self.ds.isel(time=int(i))
        return torch.from_numpy(np.stack([s[n].values for n in self.names]))


def loader_epoch(path, engine, names, device, batch, workers):
    import torch
    dset = _IselDataset(path, engine, names)
    dl = torch.utils.data.DataLoader(dset, batch_size=batch, shuffle=True, num_workers=workers,
                                     pin_memory=device != "cpu", persistent_workers=False)
    nb = 0
    t0 = time.perf_counter()
    for x in dl:
        if device != "cpu":
            x = x.cuda(non_blocking=True)
        nb += x.numel() * x.element_size()
    sync(device)
    return rate(nb, time.perf_counter() - t0)


class _H5Source:
    """PhysicsNeMo's ERA5 source pattern: one sample per call, read with h5py in a DALI worker."""

    def __init__(self, path, names, batch):
        self.path, self.names, self.batch = path, names, batch
        import h5py
        with h5py.File(path, "r") as f:
            self.n = f[names[0]].shape[0]
        self.f = None
        self.order = np.random.default_rng(0).permutation(self.n)

    def __getstate__(self):
        st = self.__dict__.copy()
        st["f"] = None
        return st

    def __call__(self, info):
        if info.iteration >= self.n // self.batch:
            raise StopIteration
        import h5py
        if self.f is None:
            self.f = h5py.File(self.path, "r")
        i = int(self.order[info.idx_in_epoch])
        return np.stack([self.f[n][i] for n in self.names])


def physicsnemo_epoch(path, names, device, batch, workers):
    """A PhysicsNeMo-style pipeline: parallel per-sample external_source reading h5py on the CPU."""
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def

    src = _H5Source(path, names, batch)

    @pipeline_def(batch_size=batch, num_threads=4, device_id=0 if device != "cpu" else None,
                  py_num_workers=workers, py_start_method="spawn")
    def pipe():
        x = fn.external_source(source=src, parallel=True, batch=False)
        return x.gpu() if device != "cpu" else x
    p = pipe()
    p.build()
    n = 0
    t0 = time.perf_counter()
    try:
        while True:
            (x,) = p.run()
            n += 1
    except StopIteration:
        pass
    sync(device)
    dt = time.perf_counter() - t0
    import h5py
    with h5py.File(path, "r") as f:
        per = batch * sum(int(np.prod(f[k].shape[1:])) * 4 for k in names)
    return rate(n * per, dt)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--nvars", type=int, default=20)
    ap.add_argument("--ny", type=int, default=361)
    ap.add_argument("--nx", type=int, default=720)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--formats", default="nc4z,zarrz,nc3")
    ap.add_argument("--workers", default="8,16")
    ap.add_argument("--step-gbps", type=float, default=10.0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.gib, a.nvars, a.ny, a.nx, a.batch, a.workers = 0.01, 3, 45, 90, 4, "2"
    names = [f"v{i:02d}" for i in range(a.nvars)]
    nt = max(a.batch * 4, int(a.gib * 2 ** 30 / (a.nvars * a.ny * a.nx * 4)))
    d = a.dir or tempfile.mkdtemp(prefix="ferry-xtrain-")
    rows = []
    have_dali = have("nvidia.dali")
    try:
        for fmt in a.formats.split(","):
            path = os.path.join(d, {"nc4z": "e.nc", "zarrz": "e.zarr", "nc3": "e3.nc"}[fmt])
            t0 = time.perf_counter()
            if fmt == "nc4z":
                eng = write_h5(path, names, nt, a.ny, a.nx, True)
                peer = "netcdf4" if have("netCDF4") else ("h5netcdf" if have("h5netcdf") else None)
            elif fmt == "zarrz":
                if not have("zarr"):
                    log("zarrz: zarr is not installed, skipped")
                    continue
                write_zarr3(path, names, nt, a.ny, a.nx)
                peer = "zarr"
            else:
                write_nc3(path, names, nt, a.ny, a.nx)
                peer = "scipy"
            log(f"{fmt}: wrote {nt} steps x {a.nvars} vars in {time.perf_counter() - t0:.1f} s")
            warm(path)
            lim = ferry_load_rate(path, names, a.device)
            fr, _ = ferry_epoch(path, names, a.device, a.batch)
            rows.append((fmt, "ferry .load() (limit)", lim, None))
            rows.append((fmt, "XarrayDataset", fr, fr / lim))
            if have_dali:
                dr, _ = ferry_epoch(path, names, a.device, a.batch, dali=True)
                rows.append((fmt, "XarrayDataset via ferry.dali", dr, dr / fr))
            _, idle = ferry_epoch(path, names, a.device, a.batch, step_gbps=a.step_gbps)
            if idle is not None:
                rows.append((fmt, f"GPU idle behind a {a.step_gbps:g} GB/s step", idle, None))
            if peer:
                for w in [int(x) for x in a.workers.split(",")]:
                    lr = loader_epoch(path, peer, names, a.device, a.batch, w)
                    rows.append((fmt, f"isel+{peer} DataLoader({w} workers)", lr, fr / lr))
            if fmt == "nc4z" and have_dali and eng in ("netcdf4", "h5netcdf", "h5py"):
                w = max(int(x) for x in a.workers.split(","))
                pr = physicsnemo_epoch(path, names, a.device, a.batch, w)
                rows.append((fmt, f"PhysicsNeMo-style DALI (h5py, {w} workers)", pr, fr / pr))
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
    finally:
        if not a.dir:
            shutil.rmtree(d, ignore_errors=True)
    print(f"\n{a.nvars} vars x {nt} steps of {a.ny}x{a.nx} float32 ({a.gib:g} GiB), batch {a.batch}, "
          f"device {a.device}")
    print(f"{'format':7} {'reader':46} {'GB/s':>8} {'ratio':>7}")
    for fmt, what, v, r in rows:
        val = f"{v * 100:7.1f}%" if "idle" in what else f"{v:8.2f}"
        print(f"{fmt:7} {what:46} {val} {'' if r is None else f'{r:7.2f}'}")


if __name__ == "__main__":
    main()
