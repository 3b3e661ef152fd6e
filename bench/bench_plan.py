#!/usr/bin/env python3
"""Plan time: how long turning a selection into a plan takes (issue 10).

No data is moved: only the plan is built (and its extents counted), so this
runs the same on any machine. Best of --reps, milliseconds:

  * a Zarr v2 store of 10,000 zlib chunks (a stat per chunk) and one of
    10,000 uncompressed chunks (no stat), whole array and a strided box;
  * an HDF5 file of 5,000 shuffle+deflate chunks through the xarray
    backend's read planning (the first plan includes fetching h5py's chunk
    table with chunk_iter; later plans reuse it);
  * a safetensors file of 1,000 tensors: ferry.checkpoint.safe_open (header
    parsed in C) and the plan of reading every tensor (Plan.read per tensor);
  * a Zarr v3 zstd array of 4,096 steps, a chunk (and a directory) per step: open and plan
    the whole array (each chunk's size and directory are lstat'ed at plan time);
  * a training batch as XarrayDataset plans it: one plan of 160 reads (8 random
    time steps of 20 variables of a Zarr v3 zstd store, a chunk per step), one
    Plan.read per variable and step (each array directory is resolved once per
    plan, not once per read: zarr.c's plan memo).

    python3 bench/bench_plan.py            # prints one line per case
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from harness import best, have, log  # noqa: E402


def zarr_case(d, name, compressor):
    import zarr
    p = os.path.join(d, name)
    a = zarr.create_array(store=p, shape=(1000, 1000), chunks=(10, 10), dtype="f4", zarr_format=2,
                          compressors=compressor, fill_value=0)
    a[:] = np.arange(1e6, dtype="f4").reshape(1000, 1000)
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    import ferry
    from ferry import xarray as fx
    d = tempfile.mkdtemp(prefix="ferry-bench-plan-")
    try:
        stores = {}
        if have("zarr") and have("numcodecs"):
            import numcodecs
            stores = {"zarr 10,000 zlib chunks": zarr_case(d, "z.zarr", numcodecs.Zlib(level=1)),
                      "zarr 10,000 raw chunks": zarr_case(d, "r.zarr", None)}
        else:
            log("bench_plan: zarr or numcodecs missing: no Zarr cases")
        out = np.empty((1000, 1000), "f4")
        for label, p in stores.items():
            ds = ferry.Dataset(ferry.default_context(), p)
            name = ds.names()[0]
            for what, sel in (("whole", None), ("[::3, 5:995]", [(0, 1000, 3), (5, 995, 1)])):
                def plan():
                    pl = ferry.Plan()
                    pl.read(ds, name, out, sel)
                    return len(pl)
                t, n = best(plan, args.reps)
                print(f"{label:28s} {what:14s} {t * 1e3:8.2f} ms  ({n} extents)")
            ds.close()
        import h5py
        h = os.path.join(d, "c.h5")
        with h5py.File(h, "w") as f:
            f.create_dataset("x", data=np.arange(500000, dtype="f4").reshape(5000, 100), chunks=(1, 100),
                             compression="gzip", shuffle=True)
        for what, key in (("whole", (slice(None), slice(None))), ("[::3, 10:90]", (slice(0, 5000, 3), slice(10, 90)))):
            store = fx.FerryStore(h)
            s = store.specs["x"]
            t0 = time.perf_counter()
            pl = ferry.Plan()
            store._add(pl, s, key)
            first = time.perf_counter() - t0

            def plan():
                pl = ferry.Plan()
                store._add(pl, s, key)
                return len(pl)
            t, n = best(plan, args.reps)
            print(f"{'hdf5 5,000 chunks':28s} {what:14s} {t * 1e3:8.2f} ms  ({n} extents; first plan "
                  f"with the chunk table {first * 1e3:.2f} ms)")
            store.close()
        safetensors_case(d, args.reps)
        if have("zarr"):
            steps_case(d, args.reps)
            batch_case(d, args.reps)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    log("bench_plan: done")


def safetensors_case(d, reps):
    import ferry
    from ferry import checkpoint as ck
    if not have("safetensors"):
        log("bench_plan: safetensors missing: no safetensors case")
        return
    from safetensors.numpy import save_file
    p = os.path.join(d, "m.safetensors")
    save_file({f"layer.{i}.weight": np.full((16, 16), i, "f4") for i in range(1000)}, p)

    def open_close():
        with ck.safe_open(p, "pt") as f:
            return len(list(f.keys()))
    t, n = best(open_close, reps)
    print(f"{'safetensors 1,000 tensors':28s} {'safe_open':14s} {t * 1e3:8.2f} ms  ({n} tensors)")
    ds = ferry.Dataset(ferry.default_context(), p)
    out = np.empty((1000, 16, 16), "f4")
    names = ds.names()

    def plan():
        pl = ferry.Plan()
        for i, name in enumerate(names):
            pl.read(ds, name, out[i])
        return len(pl)
    t, n = best(plan, reps)
    print(f"{'safetensors 1,000 tensors':28s} {'plan all':14s} {t * 1e3:8.2f} ms  ({n} extents)")
    ds.close()


def steps_case(d, reps):
    """A Zarr v3 zstd array of 4,096 steps, one chunk per step (c/<t>/0: every step its own
    directory), read whole: each chunk's size and directory are looked up at plan time (two
    lstats a chunk, taken on the engine's threads at once: src/formats/statmany.c)."""
    import zarr
    import ferry
    p = os.path.join(d, "steps.zarr")
    a = zarr.create_array(store=p, shape=(4096, 64), chunks=(1, 64), dtype="f4", zarr_format=3,
                          compressors=zarr.codecs.ZstdCodec(level=0), fill_value=0)
    a[:] = np.random.default_rng(0).random((4096, 64), dtype="f4")
    out = np.empty((4096, 64), "f4")

    def open_plan():
        ds = ferry.Dataset(ferry.default_context(), p)
        pl = ferry.Plan()
        pl.read(ds, ds.names()[0], out)
        ds.close()
        return len(pl)
    t, n = best(open_plan, reps)
    print(f"{'zarr v3 4,096 zstd steps':28s} {'open + whole':14s} {t * 1e3:8.2f} ms  ({n} extents)")


def batch_case(d, reps):
    import zarr
    import ferry
    p = os.path.join(d, "batch.zarr")
    g = zarr.open_group(p, mode="w", zarr_format=3)
    nt, names = 64, [f"v{i:02d}" for i in range(20)]
    for n in names:
        a = g.create_array(n, shape=(nt, 45, 90), chunks=(1, 45, 90), dtype="f4",
                           compressors=zarr.codecs.ZstdCodec(level=1), fill_value=0)
        a[:] = np.random.default_rng(0).random((nt, 45, 90), dtype="f4")
    ds = ferry.Dataset(ferry.default_context(), p)
    out = np.empty((8, 20, 45, 90), "f4")
    rng = np.random.default_rng(1)

    def plan():
        pl = ferry.Plan()
        for r, t in enumerate(rng.integers(0, nt, 8)):
            for k, n in enumerate(names):
                pl.read(ds, n, out[r, k], [(int(t), int(t) + 1, 1), (0, 45, 1), (0, 90, 1)])
        return len(pl)
    t, n = best(plan, reps)
    print(f"{'zarr batch 20 vars x 8 steps':28s} {'160 reads':14s} {t * 1e3:8.2f} ms  ({n} extents)")
    ds.close()


if __name__ == "__main__":
    main()
