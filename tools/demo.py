"""make demo: ferry's main jobs on data generated here, on the GPU when there is one.

1. the engine: a raw file read into memory, with the path that ran;
2. xarray: a netCDF file opened with engine="ferry" (data on the GPU, coordinates on the CPU);
3. PyTorch: an epoch of ArrayDataset batches from .npy shards;
4. checkpoints: a state dict saved and loaded back, bit-exact.
Each step checks its result against the reference library and prints GB/s.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np


def gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:6.2f} GB/s"


def main() -> None:
    import torch
    import xarray as xr

    import ferry
    import ferry.checkpoint as ckpt
    from ferry.torch import ArrayDataset

    gpu = torch.cuda.is_available()
    dev = "cuda:0" if gpu else "cpu"
    ctx = ferry.default_context()
    print(f"ferry {ferry.__version__}: running on {'GPU ' + torch.cuda.get_device_name(0) if gpu else 'the host (no GPU)'}")
    print(f"  CUDA: {ctx.cuda_status or 'available'}")
    print(f"  cuFile: {ctx.cufile_status or 'GDS available'}")
    work = tempfile.mkdtemp(prefix="ferry-demo-", dir=os.environ.get("FERRY_DEMO_DIR", "."))
    try:
        rng = np.random.default_rng(0)

        # 1. the engine
        raw = os.path.join(work, "raw.bin")
        data = rng.integers(0, 255, size=256 << 20, dtype=np.uint8)
        data.tofile(raw)
        out = torch.empty(data.size, dtype=torch.uint8, device=dev)
        f = ferry.File(ctx, raw)
        dst = out if gpu else out.numpy()      # CPU tensors go in as their numpy view
        f.pread(dst)                           # first touch of the memory; then timed
        ferry.reset_stats()
        t = time.perf_counter()
        f.pread(dst)
        if gpu:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        assert torch.equal(out.cpu(), torch.from_numpy(data)), "engine read differs"
        st = ferry.stats()
        ran = [p for p in ("cufile", "staged", "host") if st[p]["bytes"]]
        print(f"1. engine: 256 MiB file -> {dev}: {gbps(data.size, dt)} (path: {', '.join(ran)}; "
              f"O_DIRECT {st['direct_bytes'] / 1e6:.0f} MB, page cache {st['buffered_bytes'] / 1e6:.0f} MB)")
        f.close()
        del out

        # 2. xarray
        nc = os.path.join(work, "weather.nc")
        time_ax = np.arange("2026-01-01T00", "2026-01-03T00", dtype="datetime64[h]").astype("datetime64[ns]")
        ds = xr.Dataset(
            {name: (("time", "lat", "lon"), rng.standard_normal((48, 180, 360), dtype=np.float32))
             for name in ("t2m", "u10", "v10", "msl")},
            coords={"time": time_ax, "lat": np.linspace(-89.5, 89.5, 180), "lon": np.linspace(0, 359, 360)},
            attrs={"title": "ferry demo"},
        )
        ds.to_netcdf(nc, engine="scipy")          # netCDF-3, parsed by ferry's C reader
        t = time.perf_counter()
        fx = xr.open_dataset(nc, engine="ferry", device=0 if gpu else "cpu").load()
        dt = time.perf_counter() - t
        ref = xr.open_dataset(nc, engine="scipy").load()
        kind = type(fx["t2m"].data).__module__.split(".")[0]
        host = fx.as_numpy() if gpu else fx
        xr.testing.assert_identical(host, ref)
        print(f"2. xarray: open_dataset(engine='ferry').load() of {ds.nbytes / 1e6:.0f} MB: {gbps(ds.nbytes, dt)}; "
              f"data vars are {kind} arrays, coords numpy; identical to engine='scipy'")

        # 3. PyTorch
        shards = []
        for i in range(4):
            p = os.path.join(work, f"images_{i}.npy")
            np.save(p, rng.integers(0, 255, size=(512, 3, 64, 64), dtype=np.uint8))
            shards.append(p)
        dset = ArrayDataset(os.path.join(work, "images_*.npy"), batch_size=128, shuffle=True, seed=0, device=dev)
        t = time.perf_counter()
        n = nb = 0
        for batch in dset:
            n += batch.shape[0]
            nb += batch.numel()
        if gpu:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        assert n == 4 * 512, n
        print(f"3. torch: ArrayDataset epoch of {n} samples in batches of 128 on {dev}: {gbps(nb, dt)}, "
              f"{n / 128 / dt:.0f} batches/s")

        # 4. checkpoints
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
        sd = model.state_dict()
        path = os.path.join(work, "model.safetensors")
        nbytes = sum(v.numel() * v.element_size() for v in sd.values())
        t = time.perf_counter()
        ckpt.save(sd, path)
        dt_save = time.perf_counter() - t
        t = time.perf_counter()
        back = ckpt.load(path, device=dev)
        dt_load = time.perf_counter() - t
        assert all(torch.equal(back[k], v) for k, v in sd.items())
        from safetensors.torch import load_file
        assert all(torch.equal(load_file(path)[k], v.cpu()) for k, v in sd.items())
        print(f"4. checkpoint: save {nbytes / 1e6:.0f} MB (atomic, fsync) {gbps(nbytes, dt_save)}, "
              f"load {gbps(nbytes, dt_load)}; safetensors reads it unchanged")
        print("demo: all results verified")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
