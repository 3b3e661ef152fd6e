"""File -> GPU memory through ferry's engine vs what users do today, on one file.

    python3 bench/bench_engine.py [--gib 4] [--file PATH] [--reps 3]

Warm page cache. Compares, in the same run:
  * np.fromfile(path) + torch.from_numpy(x).cuda()     (today's user path)
  * one thread: pread into a pinned buffer, then copy  (torch pinned tensor + copy_)
  * ferry (AUTO path, and each path the machine has), into a torch CUDA tensor
Every result is compared with the file's bytes. Prints GB/s (10^9 B/s) and ratios.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--file", default="ferry-bench-engine.bin")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="small and quick (CI-sized)")
    a = ap.parse_args()
    if a.smoke:
        a.gib, a.reps = 0.25, 2
    import torch
    import ferry
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0
    n = int(a.gib * (1 << 30)) // 8 * 8
    if not os.path.exists(a.file) or os.path.getsize(a.file) != n:
        words = np.arange(n // 8, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        words.tofile(a.file)
        del words
    with open(a.file, "rb") as fh:            # warm the page cache
        while fh.read(1 << 26):
            pass
    ref = torch.from_numpy(np.fromfile(a.file, dtype=np.uint8)).cuda()
    torch.cuda.synchronize()

    def best(fn) -> float:
        t = []
        for _ in range(a.reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn()
            torch.cuda.synchronize()
            t.append(time.perf_counter() - t0)
            if not torch.equal(out, ref):
                raise SystemExit("VERIFY FAILED")
            del out
        return n / min(t) / 1e9

    rows = []
    rows.append(("np.fromfile + torch .cuda()", best(lambda: torch.from_numpy(np.fromfile(a.file, dtype=np.uint8)).cuda())))

    pin = torch.empty(4 << 20, dtype=torch.uint8).pin_memory()
    pin_np = pin.numpy()

    def one_thread():
        out = torch.empty(n, dtype=torch.uint8, device="cuda")
        fd = os.open(a.file, os.O_RDONLY)
        off = 0
        while off < n:
            k = os.preadv(fd, [memoryview(pin_np)[: min(4 << 20, n - off)]], off)
            out[off:off + k].copy_(pin[:k], non_blocking=True)
            torch.cuda.current_stream().synchronize()
            off += k
        os.close(fd)
        return out
    rows.append(("1 thread: pread -> pinned, copy", best(one_thread)))

    ctx = ferry.default_context()
    f = ferry.File(ctx, a.file)
    for path in ["auto", "staged", "cufile"]:
        def rd(path=path):
            out = torch.empty(n, dtype=torch.uint8, device="cuda")
            plan = ferry.Plan()
            plan.read_file(f, 0, n, out)
            ctx.run(plan, path=path)
            return out
        ctx.reset_stats()
        try:
            r = best(rd)
        except ferry.FerryError as e:
            print(f"  ferry ({path}): not available here: {e}")
            continue
        st = ctx.stats()
        used = [p for p in ("cufile", "staged", "host") if st[p]["bytes"]]
        rows.append((f"ferry path={path} (ran: {', '.join(used)})", r))
    base = rows[0][1]
    one = rows[1][1]
    print(f"file -> GPU memory, {n / 1e9:.2f} GB, page cache warm, best of {a.reps}")
    for name, r in rows:
        print(f"  {name:44s} {r:7.2f} GB/s  {r / base:6.1f}x np.fromfile+cuda  {r / one:5.1f}x 1-thread pread+copy")
    if not a.smoke and "--keep" not in sys.argv:
        os.unlink(a.file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
