#!/usr/bin/env python3
"""Experiment (not committed): where TokenDataset's 23 GB/s loses against the engine alone's 29."""
import argparse, os, sys, time
import numpy as np
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "..", "python"))
import bench_torch as bt  # noqa
import torch  # noqa
import ferry.torch as ft  # noqa
from ferry import _ferry  # noqa

ap = argparse.ArgumentParser()
ap.add_argument("--token-gib", type=float, default=4)
ap.add_argument("--seconds", type=float, default=4)
ap.add_argument("--dir", default=os.environ.get("FERRY_BENCH_DIR", "/tmp/ferry-bench-torch"))
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--prefetch", type=int, default=4)
ap.add_argument("--smoke", action="store_true")
ap.add_argument("--only", default="")
args = ap.parse_args()
os.makedirs(args.dir, exist_ok=True)
path, ntok = bt.make_tokens(args)
L, B, rec = 4095, 256, 8192
dev = bt._dev()


def run_ds(label, prefetch=None, **kw):
    ds = ft.TokenDataset(path, L, B, shuffle=True, seed=1, device=dev,
                         prefetch=args.prefetch if prefetch is None else prefetch, threads=args.threads, **kw)
    batches = bt._epochs(ds)
    r = bt._timed(batches, args.seconds, lambda b: b[0].shape[0] * rec, None, warmup=3 * ds.batch_group)
    batches.close()
    print(f"ROW {label}: {r[1] / r[2] / 1e9:.2f} GB/s", flush=True)


orig_issue = ft._BatchStream._issue
orig_retire = ft._BatchStream._retire


def host_wait_issue(self, rt, g, retiring, stream, side):
    if g.job is not None and not g.job.done():
        g.job.wait()
    return orig_issue(self, rt, g, retiring, stream, side)


def tight_retire(self, retiring, block, raise_errors=True):
    return orig_retire(self, retiring, True, raise_errors)


def engine_fresh(group, inflight, fresh):
    ctx = _ferry.default_context()
    nwin = (os.path.getsize(path) // 2 - 1) // L
    f = _ferry.File(ctx, path)
    starts, offsets = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    ring = [torch.empty(group * B * rec, dtype=torch.uint8, device=dev) for _ in range(inflight)]
    jobs, k, t0, done = [], 0, None, 0
    while True:
        if k == 3 + inflight:
            for j, _ in jobs:
                j.wait()
            jobs = []
            bt._sync()
            t0, done = time.perf_counter(), 0
        buf = torch.empty(group * B * rec, dtype=torch.uint8, device=dev) if fresh else ring[k % inflight]
        if len(jobs) >= inflight:
            jobs.pop(0)[0].wait()
        plan = _ferry.Plan()
        lo = (k * group * B) % (nwin - group * B + 1)
        _ferry.plan_windows(plan, [f], starts, offsets, L * 2, rec, nwin, 1, 0, True,
                            np.array([lo, lo + group * B], dtype=np.int64), (buf.data_ptr(), buf.numel(), buf.device.index if buf.is_cuda else -1))
        jobs.append((ctx.submit(plan), buf))
        done += group
        k += 1
        if t0 is not None and time.perf_counter() - t0 > args.seconds:
            break
    for j, _ in jobs:
        j.wait()
    bt._sync()
    wall = time.perf_counter() - t0
    f.close()
    return done * B * rec / wall / 1e9


rows = args.only.split(",") if args.only else ["base", "hostwait", "tight", "both", "pf16", "pf0", "eng6", "eng6fresh", "eng12", "base2"]
for r in rows:
    if r in ("base", "base2"):
        run_ds(r)
    elif r == "hostwait":
        ft._BatchStream._issue = host_wait_issue
        run_ds(r)
        ft._BatchStream._issue = orig_issue
    elif r == "tight":
        ft._BatchStream._retire = tight_retire
        run_ds(r)
        ft._BatchStream._retire = orig_retire
    elif r == "both":
        ft._BatchStream._issue = host_wait_issue
        ft._BatchStream._retire = tight_retire
        run_ds(r)
        ft._BatchStream._issue = orig_issue
        ft._BatchStream._retire = orig_retire
    elif r == "pf16":
        run_ds(r, prefetch=16)
    elif r == "pf0":
        run_ds(r, prefetch=0)
    elif r == "pf64":
        run_ds(r, prefetch=64)
    elif r.startswith("eng"):
        n = int(r[3:].replace("fresh", ""))
        print(f"ROW {r}: {engine_fresh(16, n, 'fresh' in r):.2f} GB/s", flush=True)
