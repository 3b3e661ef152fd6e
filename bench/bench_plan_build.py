#!/usr/bin/env python3
"""CPU time to build one batch's plan in ferry.torch (no data is moved).

At 1,600 batches/s of 256 token windows the loader's one thread has ~600 µs per batch for
everything; this times the part that turns a batch's sample ids into a ferry plan (the
field's read: destination tensor + extents), per batch, on the host:

  * TokenDataset, 256 random windows of seq_len 4096 uint16 (8 KiB each), over 4 files;
  * ArrayDataset rows, 256 shuffled rows of 150 KB (uint8 3x224x224) over 4 .npy shards.

The files are sparse (nothing is read), so this runs the same on any machine:

    python3 bench/bench_plan_build.py            # one line per case, µs CPU per batch
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch  # noqa: E402

import ferry.torch as ft  # noqa: E402
from ferry import _ferry as _ferry_ext  # noqa: E402
import ferry.torch.groups as ft_groups  # noqa: E402


def per_batch_us(ds, ids_of, reps):
    rt = ds._runtime(torch.device("cpu"), False, 0)
    field = ds._fields[0]
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        for r in range(reps):
            g = ft_groups._Group()
            g.handles = []
            plan = _ferry_ext.Plan()
            field.read(ds, rt, plan, ids_of(r), g)
            for e in g.handles:
                e[1] -= 1
        best = min(best, (time.process_time() - t0) / reps * 1e6)
    return best, len(plan)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        seq, tok_per_file = 4096, 1 << 28                      # 4 files of 512 MiB (sparse)
        paths = []
        for i in range(4):
            p = os.path.join(d, f"tok{i}.bin")
            with open(p, "wb") as fh:
                fh.truncate(tok_per_file * 2)
            paths.append(p)
        ds = ft.TokenDataset(paths, seq_len=seq, batch_size=args.batch, dtype="uint16", device="cpu")
        n = ds._fields[0].rows
        idss = [rng.integers(0, n, args.batch).astype(np.int64) for _ in range(64)]
        us, ext = per_batch_us(ds, lambda r: idss[r % 64], args.reps)
        print(f"plan-build tokens: {args.batch} windows of {seq + 1} x uint16, 4 files: "
              f"{us:.1f} us CPU per batch ({ext} extents)")

        rows = 1000
        shards = []
        for i in range(4):
            p = os.path.join(d, f"img{i}.npy")
            np.lib.format.open_memmap(p, mode="w+", dtype=np.uint8, shape=(rows, 3, 224, 224)).flush()
            shards.append(p)
        ds = ft.ArrayDataset(os.path.join(d, "img*.npy"), batch_size=args.batch, shuffle=True,
                             device="cpu")
        n = ds._fields[0].rows
        idss = [rng.permutation(n)[:args.batch] for _ in range(64)]
        us, ext = per_batch_us(ds, lambda r: idss[r % 64], args.reps)
        print(f"plan-build rows: {args.batch} shuffled rows of 150528 B, 4 shards: "
              f"{us:.1f} us CPU per batch ({ext} extents)")


if __name__ == "__main__":
    main()
