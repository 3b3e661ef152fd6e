"""Small random records and fresh host memory: ferry beside the machine's limits, one run.

    python3 bench/bench_records.py [--gib 8] [--count 200000] [--reps 3] [--dir .]

1. Random records of 150,528 bytes (a 3x224x224 uint8 row), 8 KiB and 4 KiB (token
   windows) from a page-cached file of --gib GiB, through `build/ferry bench --records`
   (C, so that the limit is not Python's): the 16-thread pread limit of the same run,
   ferry into host batches, ferry into GPU batches with the rows in order and
   scattered (gathered into a pinned image of the batch: one copy per batch; with
   FERRY_GATHER=off packed staging: one copy per staging buffer, or one copy plus one
   scatter kernel), and the pinned host-to-device copy limit. Every batch
   ferry fills is verified there. Runs: 2 batches in flight and 5 (the datasets'
   prefetch=4) and 1, each with FERRY_GATHER=off beside it (--pack-experiments adds
   FERRY_PACK_MIN=256K and FERRY_SPIN_US=50), and --cold-count records
   read cold (dropped from the page cache) with FERRY_READAHEAD=auto and off.
   --event-sync both adds each run with FERRY_EVENT_SYNC=blocking.
2. ferry.read(path, device="cpu") of a --gib GiB .npy into memory ferry allocates
   (transparent huge pages, first touched by the workers) vs 16 threads of os.preadv
   into a fresh np.empty (numpy's own huge pages): pairs run back to back, best of
   --reps, results compared with each other.
Needs numpy and a `make`-built tree (build/ferry); torch/cupy are not needed. Prints a
table; GB/s are 10^9 bytes/s.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def records(a) -> int:
    exe = os.path.join(ROOT, "build", "ferry")
    if not os.path.exists(exe):
        print(f"skipped records: {exe} missing (run make)")
        return 0
    base = [exe, "bench", "--records", a.records, "--file", os.path.join(a.dir, "ferry-records.bin"),
            "--size", f"{int(a.gib * (1 << 30))}", "--count", str(a.count), "--reps", str(a.reps)]
    # (environment, extra arguments): the default at 2 batches in flight (the rows of
    # BENCHMARKS.md so far), at the datasets' depth (prefetch=4: 5 batches), larger pack
    # tasks for the small records (fewer, larger host-to-device copies), idle workers
    # spinning 50 us before they sleep (no vCPU wake-up between batches), and the same
    # records cold with ferry's readahead hints and without
    # Device batches are gathered (src/engine/gather.c: records read into a pinned
    # image of the batch, one copy per contiguous run); FERRY_GATHER=off is the
    # packed staging of before (one copy per pack task), measured beside it in the
    # same run, at 2 and 5 batches in flight and at 1 (where gathering cannot
    # overlap a batch's copy with its reads: its worst case)
    off = {"FERRY_GATHER": "off"}
    runs = [({}, ["--depth", "2"]), ({}, ["--depth", "5"])]
    if not a.smoke:
        d1 = ["--depth", "1", "--records", ",".join(a.records.split(",")[:2])]
        runs += [(off, ["--depth", "2"]), (off, ["--depth", "5"]), ({}, d1), (off, d1)]
    else:
        runs.append((off, ["--depth", "2"]))
    if a.pack_experiments:
        small = ",".join(r for r in a.records.split(",") if int(r) <= 65536) or a.records
        runs.append((dict(off, FERRY_PACK_MIN="256K"), ["--depth", "2", "--records", small]))
        runs.append(({"FERRY_SPIN_US": "50"}, ["--depth", "2"]))
    if not a.smoke:
        cold = ["--cold", "--count", str(a.cold_count), "--records", a.cold_records]
        runs += [({"FERRY_READAHEAD": "auto"}, cold), ({"FERRY_READAHEAD": "off"}, cold)]
    rc = 0
    for sync in (["spin", "blocking"] if a.event_sync == "both" else [a.event_sync]):
        for env_add, extra in runs:
            # FERRY_EVENT_SYNC=blocking: pool workers sleep on their staging events
            # instead of spinning (src/engine/worker.c)
            env = dict(os.environ, FERRY_EVENT_SYNC=sync, **env_add)
            cmd = base + extra
            shown = " ".join(f"{k}={v}" for k, v in [("FERRY_EVENT_SYNC", sync)] + list(env_add.items()))
            print(f"$ {shown} " + " ".join(cmd), flush=True)
            rc |= subprocess.call(cmd, env=env)
    return rc


def preadv_into(path: str, out: np.ndarray, offset: int, threads: int) -> None:
    """threads x os.preadv of 8 MiB pieces into out (the peer: what a user writes)."""
    mv = memoryview(out.reshape(-1).view(np.uint8))
    n = mv.nbytes
    piece = 8 << 20
    fd = os.open(path, os.O_RDONLY)
    nxt = [0]
    lock = threading.Lock()

    def work():
        while True:
            with lock:
                lo = nxt[0]
                nxt[0] += piece
            if lo >= n:
                return
            hi = min(n, lo + piece)
            while lo < hi:
                lo += os.preadv(fd, [mv[lo:hi]], offset + lo)

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    os.close(fd)


def host_read(a) -> None:
    import ferry
    n = int(a.gib * (1 << 30)) // 8 * 8
    path = os.path.join(a.dir, "ferry-hostread.npy")
    if not os.path.exists(path) or os.path.getsize(path) < n:
        np.save(path, np.arange(n // 8, dtype=np.uint64))
    with open(path, "rb") as fh:       # warm
        while fh.read(1 << 26):
            pass
    arr = np.load(path, mmap_mode="r")
    offset = arr.offset
    shape, dtype = arr.shape, arr.dtype
    del arr
    best_f = best_p = float("inf")
    ratios = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        x = ferry.read(path, device="cpu")
        tf = time.perf_counter() - t0
        t0 = time.perf_counter()
        y = np.empty(shape, dtype)
        preadv_into(path, y, offset, a.threads)
        tp = time.perf_counter() - t0
        if not np.array_equal(x, y):
            raise SystemExit("VERIFY FAILED: ferry.read and preadv differ")
        del x, y
        best_f, best_p = min(best_f, tf), min(best_p, tp)
        ratios.append(tp / tf)
    gb = n / 1e9
    print(f"fresh host memory, {gb:.2f} GB .npy, page cache warm, best of {a.reps}:")
    print(f"  {a.threads}-thread os.preadv into np.empty      {gb / best_p:8.2f} GB/s")
    print(f"  ferry.read(device='cpu')                 {gb / best_f:8.2f} GB/s   "
          f"{best_p / best_f:.2f}x preadv (pairs: {', '.join(f'{r:.2f}' for r in ratios)})")
    if not a.keep:
        os.unlink(path)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--count", type=int, default=200000)
    ap.add_argument("--records", default="150528,8192,4096")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--dir", default=".")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--event-sync", default="spin", choices=["both", "spin", "blocking"],
                    help="blocking was measured not better (BENCHMARKS.md); both runs each way")
    ap.add_argument("--cold-count", type=int, default=8192, help="records per size read cold")
    ap.add_argument("--cold-records", default="150528,8192")
    ap.add_argument("--smoke", action="store_true", help="small and quick (CI-sized)")
    ap.add_argument("--pack-experiments", action="store_true",
                    help="also FERRY_PACK_MIN=256K (packs) and FERRY_SPIN_US=50, the previous round's knobs")
    a = ap.parse_args()
    if a.smoke:
        a.gib, a.count, a.reps, a.event_sync = 0.25, 2048, 1, "spin"
    rc = records(a)
    host_read(a)
    if not a.keep:
        try:
            os.unlink(os.path.join(a.dir, "ferry-records.bin"))
        except FileNotFoundError:
            pass
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
