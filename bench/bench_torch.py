#!/usr/bin/env python3
"""Issue 5's benchmark: ferry.torch.ArrayDataset vs DataLoader(np.load-mmap Dataset) + .cuda().

Two sample kinds, both in .npy shards:
  image  3x224x224 uint8 (150528 B/sample), batch 256
  row    1 MiB float32 rows (262144 floats),  batch 32
For each, warm and cold page cache (cold: posix_fadvise(DONTNEED) on every shard, or
/proc/sys/vm/drop_caches as root): batches/s and GB/s of
  - ferry       ArrayDataset(..., shuffle=True, device="cuda") (no worker processes), through
                the engine's own staging (its one path since staging="pinned" was removed), and
                with block_size=16 (warm only)
  - ferry-raw   the engine alone: the same batches as plans (one extent per row, engine
                staging) into a few reused GPU buffers
  - dataloader  DataLoader(map-style np.load(mmap_mode="r") Dataset, shuffle=True,
                num_workers=8 / 16, pin_memory=True), then .cuda(non_blocking=True)
then the GPU-idle fraction of a small training step fed by each loader (ferry's engine path also
with fewer engine threads, --train-threads), ferry's host RSS and the CPU per batch of the loop's
thread and of the process.
Every batch's sample ids are checked (each sample carries its id in its first 8 bytes).

    python bench/bench_torch.py                 # default size (--gib 20: larger than 16 GiB)
    python bench/bench_torch.py --kinds image   # one kind per run keeps a run under 10 minutes
    python bench/bench_torch.py --gib 1 --seconds 3 --workers 8 --cache warm --no-train  # smoke
    python bench/bench_torch.py --profile image # cProfile of ferry's loader
    python bench/bench_torch.py --profile tokens --token-gib 4  # cProfile of TokenDataset's loop
The current figures, with the machine and the command of each run, are in BENCHMARKS.md
(tables T1-T7).
Files are written once under --dir (default $FERRY_BENCH_DIR or /tmp/ferry-bench-torch) and
reused while their sizes match.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

KINDS = {
    "image": dict(shape=(3, 224, 224), dtype=np.uint8, batch=256),
    "row": dict(shape=(262144,), dtype=np.float32, batch=32),
}
SHARD_BYTES = 1 << 30


# ----------------------------------------------------------------------------------- data
def make_data(root, kind, gib):
    k = KINDS[kind]
    d = os.path.join(root, kind)
    os.makedirs(d, exist_ok=True)
    sample = int(np.prod(k["shape"])) * np.dtype(k["dtype"]).itemsize
    total = max(k["batch"] * 4, int(gib * (1 << 30)) // sample)
    per = max(1, SHARD_BYTES // sample)
    meta_path = os.path.join(d, "meta.json")
    want = {"kind": kind, "samples": total, "per_shard": per}
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            if json.load(f) == want:
                return sorted_shards(d), total, sample
    for p in os.listdir(d):
        os.remove(os.path.join(d, p))
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 255, size=8 << 20, dtype=np.uint8)
    t0 = time.time()
    lo, i = 0, 0
    while lo < total:
        n = min(per, total - lo)
        path = os.path.join(d, f"shard_{i:05d}.npy")
        mm = np.lib.format.open_memmap(path, mode="w+", dtype=k["dtype"], shape=(n,) + k["shape"])
        raw = mm.reshape(n, -1).view(np.uint8)
        flat = raw.reshape(-1)
        for off in range(0, flat.size, noise.size):       # bulk: tiled random bytes
            m = min(noise.size, flat.size - off)
            flat[off:off + m] = noise[:m]
        raw[:, :8] = np.arange(lo, lo + n, dtype=np.int64).view(np.uint8).reshape(n, 8)   # the id
        mm.flush()
        del mm, raw, flat
        lo += n
        i += 1
    os.sync()   # no writeback under the measurements
    with open(meta_path, "w") as f:
        json.dump(want, f)
    print(f"# wrote {total} {kind} samples ({total * sample / 1e9:.1f} GB) in {time.time() - t0:.0f} s",
          flush=True)
    return sorted_shards(d), total, sample


def sorted_shards(d):
    return sorted(os.path.join(d, p) for p in os.listdir(d) if p.endswith(".npy"))


def drop_cache(paths):
    try:
        if os.geteuid() == 0:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
    except OSError:
        pass
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_fraction(paths):
    try:
        from ferry import _ferry
        ctx = _ferry.Context(threads=1)
        tot = hit = 0
        for p in paths:
            f = _ferry.File(ctx, p)
            tot += f.size
            hit += f.cached()
            f.close()
        ctx.close()
        return hit / max(1, tot)
    except Exception:
        return float("nan")


# ----------------------------------------------------------------------------------- loaders
class MmapDataset(Dataset):
    """What users write today: np.load(mmap_mode="r") per shard, one sample per __getitem__."""

    def __init__(self, paths):
        self.paths = paths
        self.counts = [np.load(p, mmap_mode="r").shape[0] for p in paths]
        self.starts = np.concatenate(([0], np.cumsum(self.counts)[:-1]))
        self.n = int(sum(self.counts))
        self.mm = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.mm is None:
            self.mm = [np.load(p, mmap_mode="r") for p in self.paths]
        k = int(np.searchsorted(self.starts, i, side="right") - 1)
        return torch.from_numpy(np.array(self.mm[k][i - self.starts[k]]))


def ids_of(batch):
    """The sample ids stamped in each sample's first 8 bytes (on the batch's device)."""
    flat = batch.reshape(batch.shape[0], -1)
    head = flat.view(torch.uint8)[:, :8] if flat.dtype != torch.uint8 else flat[:, :8]
    return head.contiguous().view(torch.int64).reshape(-1)


def small_model(kind, device):
    torch.manual_seed(0)
    if kind == "image":
        m = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 7, stride=4), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, stride=2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))
    else:
        m = torch.nn.Sequential(torch.nn.Linear(262144, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    m = m.to(device)
    return m, torch.optim.SGD(m.parameters(), lr=1e-3)


def train_step(model, opt, x, kind):
    x = x.float() if kind == "row" else x.float().div_(255)
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


class RssSampler:
    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def rss():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.05)

    def __enter__(self):
        self.base = self.rss()
        self._t.start()
        return self

    def __exit__(self, *a):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.rss())


def run_loader(it, n_batches, seconds, sample_bytes, expect=None, step=None, warmup=5):
    """Iterate up to n_batches / seconds after `warmup` untimed batches (engine start, worker
    start, allocator growth); returns (batches, bytes, wall, busy_gpu_seconds, bad). The CPU
    per batch of this thread (the loader's and the training loop's Python) and of the process
    (with the engine's threads) goes to LAST_CPU."""
    stream = torch.cuda.current_stream()
    events = []
    bad = torch.zeros((), dtype=torch.int64, device="cuda")
    want_all = torch.as_tensor(expect).cuda() if expect is not None else None
    got = nbytes = 0
    pos = 0
    seen = 0
    t0 = time.perf_counter()
    for b in it:
        x = b.cuda(non_blocking=True) if not b.is_cuda else b
        if want_all is not None:
            ids = ids_of(x)
            want = want_all[pos:pos + len(ids)]
            bad += (ids != want).sum() if len(want) == len(ids) else len(ids)
            pos += len(ids)
        seen += 1
        if seen <= warmup:
            if seen == warmup:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                c0, p0 = time.thread_time(), time.process_time()
            continue
        if step is not None:
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record(stream)
            step(x)
            e1.record(stream)
            events.append((e0, e1))
        got += 1
        nbytes += x.shape[0] * sample_bytes
        if got >= n_batches or time.perf_counter() - t0 > seconds:
            break
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    if got:
        LAST_CPU[:] = [(time.thread_time() - c0) / got, (time.process_time() - p0) / got]
    busy = sum(a.elapsed_time(b) for a, b in events) / 1e3
    return got, nbytes, wall, busy, int(bad)


LAST_CPU = [float("nan"), float("nan")]   # CPU seconds per batch of run_loader's latest run


def cpu_note():
    return f"CPU/batch {LAST_CPU[0] * 1e6:.0f} us loop thread, {LAST_CPU[1] * 1e6:.0f} us process"


def bench_ferry(paths, kind, n, sample, args, cold, step=None, block_size=None, device="cuda",
                staging="auto", threads=None):
    # staging defaults to the dataset's own default, so that the "ferry" row measures what a
    # user gets and the "staging='engine'" row differs from it only where the default does
    from ferry.torch import ArrayDataset, epoch_order
    B = KINDS[kind]["batch"]
    ds = ArrayDataset(paths, batch_size=B, shuffle=True, seed=1, device=device,
                      prefetch=args.prefetch, threads=args.threads if threads is None else threads,
                      drop_last=True,
                      block_size=block_size, pin_memory=device == "cpu", staging=staging)
    order = epoch_order(n, 1, 0, block_size=block_size)
    if cold:
        drop_cache(paths)
    with RssSampler() as rss:
        r = run_loader(iter(ds), args.batches, args.seconds, sample, expect=order, step=step)
    return r, rss, ds.last_path


def bench_raw(paths, kind, n, sample, args, cold):
    """The engine alone: the same batches' rows as plans (one extent per row, batch order) into
    a few reused GPU buffers, as many batches in flight as the dataset keeps."""
    from ferry import _ferry
    from ferry.torch.groups import _groups_in_flight
    from ferry.torch import epoch_order
    B = KINDS[kind]["batch"]
    ctx = _ferry.default_context() if args.threads == 0 else _ferry.Context(threads=args.threads)
    files, offs, counts = [], [], []
    for p in paths:
        d = _ferry.Dataset(ctx, p)
        v = d.variables()[0]
        d.close()
        files.append(_ferry.File(ctx, p))
        offs.append(v["data_offset"])
        counts.append(v["shape"][0])
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    order = epoch_order(n, 1, 0)
    c = ctx.config()
    inflight = _groups_in_flight(args.prefetch, 1, B * sample,
                                 c["threads"] * c["staging_size"] * c["staging_count"])
    bufs = [torch.empty(B * sample, dtype=torch.uint8, device="cuda") for _ in range(inflight)]
    if cold:
        drop_cache(paths)
    jobs = []
    t0 = time.perf_counter()
    done = 0
    warmup = 5
    for k in range(min(args.batches + warmup, n // B)):
        if k == warmup:
            for j in jobs:
                j.wait()
            jobs = []
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            done = 0
        ids = order[k * B:(k + 1) * B]
        buf = bufs[k % len(bufs)]
        if len(jobs) >= inflight:        # buffer k % inflight was job k - inflight's
            jobs.pop(0).wait()
        plan = _ferry.Plan()
        shard = np.searchsorted(starts, ids, side="right") - 1
        for j, (s, i) in enumerate(zip(shard.tolist(), (ids - starts[shard]).tolist())):
            plan.read_file(files[s], offs[s] + i * sample, sample, (buf.data_ptr(), buf.numel(), 0), j * sample)
        jobs.append(ctx.submit(plan, reread=True))   # as the dataset submits its batches
        done += 1
        if time.perf_counter() - t0 > args.seconds:
            break
    for j in jobs:
        j.wait()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return done, done * B * sample, wall, inflight


def bench_dataloader(paths, kind, n, sample, args, workers, cold, step=None):
    B = KINDS[kind]["batch"]
    ds = MmapDataset(paths)
    g = torch.Generator()
    g.manual_seed(1)
    dl = DataLoader(ds, batch_size=B, shuffle=True, generator=g, num_workers=workers,
                    pin_memory=True, drop_last=True, prefetch_factor=2 if workers else None,
                    persistent_workers=False)
    if cold:
        drop_cache(paths)
    it = iter(dl)
    r = run_loader(it, args.batches, args.seconds, sample, expect=None, step=step)
    del it
    return r


# ------------------------------------------------- issue 13: per-sample files and token windows
# (a) one .npy per sample (DALI's numpy-reader layout): ArrayDataset(samples="files") vs DALI's
#     fn.readers.numpy (GPU reader, and CPU reader + .gpu(); only when nvidia.dali imports) vs
#     ferry.read_many of the batch's files vs a DataLoader of np.load per file.
# (b) random 8 KiB token windows: TokenDataset vs the machine's random 8 KiB pread limit
#     (bench/pread_limit.c, 16 threads, the same file, the same run).
def _dev():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make_sample_files(root, n, shape):
    d = os.path.join(root, f"files_{n}_{'x'.join(map(str, shape))}")
    meta = os.path.join(d, "done.json")
    if os.path.exists(meta):
        return d
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 255, size=int(np.prod(shape)) + 4096, dtype=np.uint8)
    for i in range(n):
        a = np.empty(shape, dtype=np.uint8)
        flat = a.reshape(-1)
        k = i % 4096
        flat[:] = noise[k:k + flat.size]
        flat[:8] = np.frombuffer(np.int64(i).tobytes(), dtype=np.uint8)    # the sample's id
        np.save(os.path.join(d, f"s_{i:06d}.npy"), a)
    with open(meta, "w") as f:
        json.dump({"n": n, "shape": shape}, f)
    return d


def _timed(it, seconds, nbytes_of, check=None, warmup=3):
    """(batches, bytes, wall) of `it` after `warmup` batches, up to `seconds`."""
    got = nb = 0
    t0 = None
    for k, b in enumerate(it):
        if check is not None:
            check(k, b)
        if k + 1 == warmup:
            _sync()
            t0 = time.perf_counter()
            c0, p0 = time.thread_time(), time.process_time()
            continue
        if t0 is None:
            continue
        got += 1
        nb += nbytes_of(b)
        if time.perf_counter() - t0 > seconds:
            break
    _sync()
    if t0 and got:
        # the loader's own thread is the steady figure on a noisy machine (wall rates are not)
        print(f"#   CPU per batch: {(time.thread_time() - c0) / got * 1e6:.0f} us this thread, "
              f"{(time.process_time() - p0) / got * 1e6:.0f} us the process ({got} batches)", flush=True)
    return got, nb, (time.perf_counter() - t0) if t0 else float("nan")


class FileDataset(Dataset):
    """What users write for per-sample files: np.load(path) in __getitem__."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return torch.from_numpy(np.load(self.paths[i]))


def bench_files(args, rows):
    n = 600 if args.smoke else args.files
    B = 32 if args.smoke else 256
    shape = (3, 224, 224)
    d = make_sample_files(args.dir, n, shape)
    paths = sorted(os.path.join(d, p) for p in os.listdir(d) if p.endswith(".npy"))
    sample = int(np.prod(shape))
    dev = _dev()
    print(f"# files: {n} .npy files of {shape} uint8 ({n * sample / 1e9:.2f} GB) in {d}, batch {B}, "
          f"device {dev}", flush=True)
    from ferry.torch import ArrayDataset, epoch_order
    secs = args.seconds
    nbytes = lambda b: b.shape[0] * sample  # noqa: E731
    caches = [c for c in args.cache.split(",") if c in ("warm", "cold")]
    order = torch.as_tensor(epoch_order(n, 1, 0))

    def ferry_files(cache):
        ds = ArrayDataset(d, samples="files", batch_size=B, shuffle=True, seed=1, device=dev,
                          drop_last=True, prefetch=args.prefetch, threads=args.threads)
        bad = [0]

        def check(k, b, bad=bad):
            want = order[k * B:(k + 1) * B].to(b.device)
            bad[0] += int((ids_of(b) != want).sum())
        if cache == "cold":
            drop_cache(paths)
        r = _timed(ds, secs, nbytes, check)
        rows.append(("files", cache, "ArrayDataset(samples='files')",
                     r[0] / r[2], r[1] / r[2] / 1e9, f"!! {bad[0]} wrong ids" if bad[0] else ""))
        return r[1] / r[2]

    def dataloader_files(cache, w):
        dl = DataLoader(FileDataset(paths), batch_size=B, shuffle=True, num_workers=w,
                        pin_memory=dev == "cuda", drop_last=True)
        if cache == "cold":
            drop_cache(paths)       # before the workers start: they read every file cold
        it = (b.to(dev, non_blocking=True) for b in dl)
        r = _timed(it, secs, nbytes)
        rows.append(("files", cache, f"DataLoader w={w} np.load" + (" pin .cuda()" if dev == "cuda" else ""),
                     r[0] / r[2], r[1] / r[2] / 1e9, ""))
        return r[1] / r[2]
    workers = [2] if args.smoke else [int(x) for x in args.workers.split(",") if x]
    # cold first (the files were just written or are left from another run), each loader
    # with the page cache dropped just before it: issue 13's "cold per-sample files >= 1.0 x
    # the best DataLoader", ferry and its peers in the same run
    if "cold" in caches:
        f_rate = ferry_files("cold")
        best = max(dataloader_files("cold", w) for w in workers)
        print(f"files cold  ferry {f_rate / 1e9:6.2f} GB/s = {f_rate / best:5.2f}x best DataLoader "
              f"({best / 1e9:.2f} GB/s)", flush=True)
    if "warm" not in caches:
        return
    # warm the page cache once (rows below are warm)
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass
    ferry_files("warm")
    # ferry.read_many of each batch's files (the 3.30 GB/s baseline)
    import ferry
    perm = np.random.default_rng(1).permutation(n)

    def read_many_batches():
        for k in range(n // B):
            arrs = ferry.read_many([(paths[i], None, None) for i in perm[k * B:(k + 1) * B]],
                                   device=0 if dev == "cuda" else "cpu")
            yield arrs
    r = _timed(read_many_batches(), secs, lambda a: len(a) * sample)
    rows.append(("files", "warm", "ferry.read_many per batch", r[0] / r[2], r[1] / r[2] / 1e9, ""))
    # DALI
    try:
        from nvidia.dali import fn, pipeline_def
        have_dali = True
    except Exception as e:          # noqa: BLE001
        have_dali = False
        rows.append(("files", "warm", "DALI fn.readers.numpy", float("nan"), float("nan"),
                     f"skipped: nvidia.dali does not import ({type(e).__name__})"))
    if have_dali:
        for reader_dev in (("gpu", "cpu") if dev == "cuda" else ("cpu",)):
            try:
                @pipeline_def(batch_size=B, num_threads=16, device_id=0 if dev == "cuda" else None,
                              prefetch_queue_depth=2)
                def pipe():
                    x = fn.readers.numpy(device=reader_dev, file_root=d, file_filter="*.npy",
                                         random_shuffle=True, seed=1, name="r")
                    return x.gpu() if (reader_dev == "cpu" and dev == "cuda") else x
                p = pipe()
                p.build()

                def dali_batches(p=p):
                    while True:
                        (out,) = p.run()
                        yield out
                name = ("DALI readers.numpy(device='gpu')" if reader_dev == "gpu" else
                        "DALI readers.numpy CPU" + (" + .gpu()" if dev == "cuda" else ""))
                r = _timed(dali_batches(), secs, lambda o: len(o) * sample)
                rows.append(("files", "warm", name, r[0] / r[2], r[1] / r[2] / 1e9, ""))
                del p
            except Exception as e:  # noqa: BLE001
                rows.append(("files", "warm", f"DALI readers.numpy({reader_dev})", float("nan"),
                             float("nan"), f"failed: {str(e).splitlines()[0][:120]}"))
    # DataLoader, np.load per file
    for w in workers:
        dataloader_files("warm", w)


def pread_limit(path, length, stride, threads, seconds):
    """GB/s of bench/pread_limit.c (compiled here with cc), or None when there is no compiler."""
    import shutil
    import subprocess
    exe = os.path.join(os.path.dirname(path), "pread_limit")
    src = os.path.join(HERE, "pread_limit.c")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        if cc is None:
            return None
        subprocess.run([cc, "-O2", "-pthread", src, "-o", exe], check=True)
    out = subprocess.run([exe, path, str(length), str(stride), str(threads), str(seconds)],
                         check=True, capture_output=True, text=True).stdout
    return float(out.strip())


def make_tokens(args):
    """The token file of this run (written once, then reused while its size matches), warm."""
    gib = 0.05 if args.smoke else args.token_gib
    path = os.path.join(args.dir, f"tokens_{gib:g}g.bin")
    ntok = int(gib * (1 << 30)) // 2
    if not os.path.exists(path) or os.path.getsize(path) != ntok * 2:
        rng = np.random.default_rng(0)
        with open(path, "wb") as f:
            left = ntok
            while left:
                k = min(left, 1 << 26)
                rng.integers(0, 50257, k, dtype=np.uint16).tofile(f)
                left -= k
    with open(path, "rb") as f:                       # warm
        while f.read(1 << 26):
            pass
    return path, ntok


class _TokenCheck:
    """Spot checks of TokenDataset batches against numpy's view of the file, without a sync in
    the timed loop: every 50th batch's first window pair is copied to pinned host memory on
    the consumer's stream and compared once the run is over (a .cpu() per check drained the
    engine's pipeline every 50 batches). The pinned rows come from one block allocated before
    the timed loop: a pinned allocation per check (cudaHostAlloc, ~230 a second at 24 GB/s)
    is work no training loop does."""

    CAP = 2048          # checks kept (every 50th batch: 100k batches, ~9 s at 24 GB/s)

    def __init__(self, mm, seq_len):
        self.mm, self.seq_len, self.held, self.pinned = mm, seq_len, [], None

    def __call__(self, k, b):
        if k % 50 or len(self.held) >= self.CAP:
            return
        x, y = b
        if x.is_cuda:
            if self.pinned is None or self.pinned.dtype != x.dtype:
                self.pinned = torch.empty((self.CAP, 2, x.shape[1]), dtype=x.dtype, pin_memory=True)
            hx, hy = self.pinned[len(self.held)]
            hx.copy_(x[0], non_blocking=True)
            hy.copy_(y[0], non_blocking=True)
        else:
            hx, hy = x[0].clone(), y[0].clone()
        self.held.append((hx, hy))

    def wrong(self):
        _sync()
        mm, L, bad = self.mm, self.seq_len, 0
        for hx, hy in self.held:
            first, second = hx.numpy(), hy.numpy()
            starts = np.flatnonzero(mm[:len(mm) - L][::L] == first[0]) * L
            ok = any(np.array_equal(mm[s:s + L], first) and np.array_equal(mm[s + 1:s + L + 1], second)
                     for s in starts)
            bad += 0 if ok else 1
        self.held = []
        return bad


def _epochs(ds):
    """Batches of ds, epoch after epoch (each iter() is the next epoch)."""
    while True:
        yield from ds


def bench_tokens_engine(path, seq_len, B, group, args, inflight=None):
    """The engine alone on TokenDataset's plans: groups of `group` batches of random windows,
    one plan each (windows in destination order, one read_file_runs call), as many groups in
    flight as the dataset keeps, into reused device buffers; no cast, no Python per batch."""
    from ferry import _ferry
    from ferry.torch.groups import _groups_in_flight
    from ferry.torch.order import FeistelOrder
    ctx = _ferry.default_context() if args.threads == 0 else _ferry.Context(threads=args.threads)
    rec = (seq_len + 1) * 2
    nwin = (os.path.getsize(path) // 2 - 1) // seq_len
    order = FeistelOrder(nwin, 1, 0, True)
    c = ctx.config()
    if inflight is None:                         # the dataset's own depth
        inflight = _groups_in_flight(args.prefetch, group, group * B * rec,
                                     c["threads"] * c["staging_size"] * c["staging_count"])
    dev = _dev()
    bufs = [torch.empty(group * B * rec, dtype=torch.uint8, device=dev) for _ in range(inflight)]
    f = _ferry.File(ctx, path)
    doff = np.arange(group * B, dtype=np.int64) * rec
    starts, offsets = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    jobs, done, warmup = [], 0, 3 + inflight     # the images and buffers of every plan in flight made
    t0 = c0 = None
    k = 0
    while True:            # positions wrap around the epoch (a small file re-reads its windows)
        if k == warmup:
            for j in jobs:
                j.wait()
            jobs = []
            _sync()
            t0, c0, done = time.perf_counter(), time.thread_time(), 0
        buf = bufs[k % len(bufs)]
        if len(jobs) >= inflight:
            jobs.pop(0).wait()
        plan = _ferry.Plan()
        dv = buf.device.index if buf.is_cuda else -1
        if hasattr(_ferry, "plan_windows"):       # TokenDataset's own call: order, offsets, rows in C
            lo = (k * group * B) % (nwin - group * B + 1)
            _ferry.plan_windows(plan, [f], starts, offsets, seq_len * 2, rec, nwin, 1, 0, True,
                                np.array([lo, lo + group * B], dtype=np.int64), (buf.data_ptr(), buf.numel(), dv))
        else:
            ids = order.take(np.arange(k * group * B, (k + 1) * group * B, dtype=np.int64) % nwin)
            plan.read_file_runs(f, ids * (seq_len * 2), rec, (buf.data_ptr(), buf.numel(), dv), doff)
        jobs.append(ctx.submit(plan))
        done += group
        k += 1
        if t0 is not None and time.perf_counter() - t0 > args.seconds:
            break
    for j in jobs:
        j.wait()
    _sync()
    wall = time.perf_counter() - t0
    print(f"#   engine alone: CPU per batch {(time.thread_time() - c0) / done * 1e6:.0f} us this thread "
          f"({done} batches, {inflight} groups of {group} in flight)", flush=True)
    f.close()
    return done / wall, done * B * rec / wall / 1e9, inflight


def bench_tokens(args, rows):
    seq_len = 4095                       # windows of 4096 uint16 tokens: 8 KiB records
    B = 256
    path, ntok = make_tokens(args)
    dev = _dev()
    print(f"# tokens: {path} ({ntok * 2 / 1e9:.2f} GB), windows of {seq_len + 1} tokens "
          f"({(seq_len + 1) * 2} B), batch {B}, device {dev}", flush=True)
    from ferry.torch import TokenDataset
    secs = args.seconds
    rec = (seq_len + 1) * 2
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    # the limit first, then the loaders, then the limit again: the row is the better of the two
    lim0 = pread_limit(path, rec, seq_len * 2, 16, max(1.0, secs / 2))
    # batches_per_read=1: one plan, copy and cast per batch (beside the read groups of the default)
    runs = [("auto", None), ("auto", 4), ("auto", 1)]
    group = None
    for staging, per_read in runs:
        ds = TokenDataset(path, seq_len, B, shuffle=True, seed=1, device=dev, prefetch=args.prefetch,
                          threads=args.threads, staging=staging, batches_per_read=per_read)
        if per_read is None:
            group = ds.batch_group
        check = _TokenCheck(mm, seq_len)
        # epoch after epoch for `secs`, timed after 3 read groups: one epoch of a 4 GiB file is
        # 2,047 batches, 0.4 s at 10 GB/s, and its first groups pay for pinned images and the
        # caching allocator's first blocks (a row timed from the fourth batch measured those)
        batches = _epochs(ds)
        r = _timed(batches, secs, lambda b: b[0].shape[0] * rec, check, warmup=3 * ds.batch_group)
        batches.close()                 # the dataset's reads in flight end here, not under the next row
        bad = check.wrong()
        rows.append(("tokens", "warm", f"TokenDataset 8 KiB windows ({ds.batch_group} batches a read)",
                     r[0] / r[2], r[1] / r[2] / 1e9,
                     f"{r[1] / r[2] / rec * seq_len / 1e6:.0f} M tokens/s"
                     + (f" !! {bad} wrong windows" if bad else "")))
    eb, eg, inflight = bench_tokens_engine(path, seq_len, B, group, args)
    rows.append(("tokens", "warm", f"engine alone, TokenDataset's plans ({group} batches a plan)", eb, eg,
                 f"{inflight} plans in flight, no cast"))
    # fewer bytes in flight: does a smaller working set of pinned images read faster?
    eb3, eg3, _ = bench_tokens_engine(path, seq_len, B, group, args, inflight=3)
    rows.append(("tokens", "warm", f"engine alone, {group} batches a plan, 3 in flight", eb3, eg3, "no cast"))
    lim1 = pread_limit(path, rec, seq_len * 2, 16, max(1.0, secs / 2))
    lims = [x for x in (lim0, lim1) if x]
    lim = max(lims) if lims else None
    rows.append(("tokens", "warm", "random 8 KiB pread limit, 16 threads", float("nan"),
                 float("nan") if lim is None else lim,
                 (f"bench/pread_limit.c, before/after {lim0:.2f}/{lim1:.2f}; "
                  f"{lim * 1e9 / rec * seq_len / 1e6:.0f} M tokens/s") if lim else "no C compiler"))
    if lim:
        best = max(r[4] for r in rows if r[0] == "tokens" and r[2].startswith("TokenDataset"))
        print(f"tokens: TokenDataset {best:.2f} GB/s = {best / lim:.2f}x the random 8 KiB pread "
              f"limit ({lim:.2f} GB/s); engine alone {eg:.2f} = {eg / lim:.2f}x", flush=True)


def _profiled(it, args, sync):
    """Batches of `it` under cProfile for at most --batches / --seconds, after the warm-up the
    caller did: (profile, batches, seconds, loader-thread CPU seconds)."""
    import cProfile
    sync()
    pr = cProfile.Profile()
    t0, c0 = time.perf_counter(), time.thread_time()
    pr.enable()
    k = 0
    for _ in it:
        k += 1
        if k >= args.batches or time.perf_counter() - t0 > args.seconds:
            break
    sync()
    pr.disable()
    return pr, k, time.perf_counter() - t0, time.thread_time() - c0


def profile_tokens(args):
    """cProfile of TokenDataset's loop (the loader thread) and its CPU per batch."""
    import pstats
    from ferry.torch import TokenDataset
    path, _ = make_tokens(args)
    seq_len, B = 4095, 256
    ds = TokenDataset(path, seq_len, B, shuffle=True, seed=1, device=_dev(), prefetch=args.prefetch,
                      threads=args.threads)
    it = _epochs(ds)
    for _ in range(3 * ds.batch_group):
        next(it)
    pr, k, dt, cpu = _profiled(it, args, _sync)
    print(f"# profile tokens: {k / dt:.1f} batches/s, {k * B * (seq_len + 1) * 2 / dt / 1e9:.2f} GB/s, "
          f"loader thread {cpu / k * 1e6:.0f} us CPU per batch (under cProfile)")
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


def rss_probe(args):
    """In a fresh process: ferry's loader alone; prints its peak RSS (bytes) as JSON."""
    kind = args.rss_probe
    paths, n, sample = make_data(args.dir, kind, args.gib)
    base = RssSampler.rss()
    import torch.cuda  # noqa: F401
    torch.zeros(1, device="cuda")
    with RssSampler() as rss:
        r = bench_ferry(paths, kind, n, sample, args, cold=False)
    print(json.dumps({"base": base, "cuda": rss.base, "peak": rss.peak, "batches": r[0][0]}))


def profile(args):
    import pstats
    kind = args.profile
    paths, n, sample = make_data(args.dir, kind, args.gib)
    from ferry.torch import ArrayDataset
    ds = ArrayDataset(paths, batch_size=KINDS[kind]["batch"], shuffle=True, seed=1, device="cuda",
                      prefetch=args.prefetch, threads=args.threads)
    it = iter(ds)
    for _ in range(10):
        next(it)
    pr, k, dt, _ = _profiled(it, args, torch.cuda.synchronize)
    print(f"# profile {kind}: {k / dt:.1f} batches/s, {k * KINDS[kind]['batch'] * sample / dt / 1e9:.2f} GB/s")
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=os.environ.get("FERRY_BENCH_DIR", "/tmp/ferry-bench-torch"))
    ap.add_argument("--gib", type=float, default=20.0, help="GiB of data per sample kind (default 20)")
    ap.add_argument("--kinds", default="image,row")
    ap.add_argument("--workers", default="8,16", help="DataLoader worker counts")
    ap.add_argument("--seconds", type=float, default=10.0, help="time limit per measurement")
    ap.add_argument("--batches", type=int, default=10**9, help="batch limit per measurement")
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="ferry engine threads (0: default)")
    ap.add_argument("--train-threads", default="0,12,8",
                    help="engine threads of the train-step rows fed by the engine's path (0: --threads)")
    ap.add_argument("--cache", default=None,
                    help="warm,cold (default; --smoke: warm): cold drops the page cache before each "
                         "loader (as root /proc/sys/vm/drop_caches too, else posix_fadvise)")
    ap.add_argument("--no-train", action="store_true", help="skip the GPU-idle measurement")
    ap.add_argument("--again", action="store_true",
                    help="cold: each loader runs once more right after its cold run, the page cache not "
                         "dropped (the same batches: what the next epoch of a data set that fits in "
                         "memory reads at)")
    ap.add_argument("--profile", metavar="KIND", help="profile ferry's loader on KIND and exit")
    ap.add_argument("--rss-probe", metavar="KIND", help=argparse.SUPPRESS)
    ap.add_argument("--files", type=int, default=24000, help="per-sample .npy files (kind 'files')")
    ap.add_argument("--token-gib", type=float, default=8.0, help="GiB of tokens (kind 'tokens')")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny 'files' and 'tokens' rows, 1 s each; runs without a GPU")
    args = ap.parse_args()
    if args.cache is None:
        args.cache = "warm" if args.smoke else "warm,cold"
    if args.profile == "tokens":
        return profile_tokens(args)
    if args.smoke:
        args.seconds = min(args.seconds, 1.0)
        if args.kinds == "image,row":
            args.kinds = "files,tokens"
    new_kinds = {"files": bench_files, "tokens": bench_tokens}
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in new_kinds and k not in KINDS]
    if bad:
        sys.exit(f"bench_torch: unknown kinds {bad} (known: {sorted(KINDS) + sorted(new_kinds)})")
    if any(k in new_kinds for k in kinds):     # files/tokens first, then the image/row kinds
        os.makedirs(args.dir, exist_ok=True)
        rows = []
        print(f"# {torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'} "
              f"torch {torch.__version__} cpus {os.cpu_count()} {time.strftime('%Y-%m-%d %H:%M')}",
              flush=True)
        for kind in kinds:
            if kind in new_kinds:
                new_kinds[kind](args, rows)
        _print_rows(rows)
        args.kinds = ",".join(k for k in kinds if k in KINDS)
        if not args.kinds:
            return
    if not torch.cuda.is_available():
        sys.exit("bench_torch: needs a CUDA GPU")
    if args.rss_probe:
        return rss_probe(args)
    if args.profile:
        return profile(args)
    torch.cuda.init()
    workers = [int(w) for w in args.workers.split(",") if w]
    caches = [c for c in args.cache.split(",") if c]
    rows = []
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} cpus {os.cpu_count()} "
          f"{time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    for kind in args.kinds.split(","):
        paths, n, sample = make_data(args.dir, kind, args.gib)
        B = KINDS[kind]["batch"]
        gb = n * sample / 1e9
        print(f"# {kind}: {n} samples of {sample} B in {len(paths)} shards ({gb:.1f} GB), batch {B}",
              flush=True)
        import subprocess
        probe_cmd = [sys.executable, os.path.abspath(__file__), "--rss-probe", kind, "--dir", args.dir,
                     "--gib", str(args.gib), "--seconds", str(args.seconds), "--prefetch", str(args.prefetch),
                     "--threads", str(args.threads)]
        probe = subprocess.run(probe_cmd, capture_output=True, text=True) if "warm" in caches else None
        try:
            if probe is None:         # a cold-only run: the probe is a warm pass (and warms the files)
                raise LookupError
            pr = json.loads(probe.stdout.strip().splitlines()[-1])
            rows.append((kind, "warm", "ferry alone in a fresh process", float("nan"), float("nan"),
                         f"host RSS peak {pr['peak'] / 2**30:.2f} GiB (torch+CUDA before: "
                         f"{pr['cuda'] / 2**30:.2f} GiB)"))
        except LookupError:
            pass
        except Exception:
            print("# RSS probe failed:", probe.stderr[-2000:], flush=True)
        # one warm-up pass over the files when warm numbers are wanted
        for cache in caches:
            cold = cache == "cold"
            if not cold and cached_fraction(paths) < 0.99:
                from ferry import _ferry
                ctx = _ferry.Context()
                for p in paths:
                    f = _ferry.File(ctx, p)
                    buf = np.empty(min(f.size, 64 << 20), dtype=np.uint8)
                    for off in range(0, f.size, buf.nbytes):
                        f.pread(buf, off, min(buf.nbytes, f.size - off))
                    f.close()
                ctx.close()
            res = {}
            (nb, nby, wall, _, bad), rss, path = bench_ferry(paths, kind, n, sample, args, cold)
            res["ferry"] = (nb, nby, wall)
            if bad:
                print(f"!! ferry: {bad} wrong sample ids", flush=True)
            rows.append((kind, cache, "ferry (%s)" % path, nb / wall, nby / wall / 1e9,
                         f"RSS {rss.peak / 2**30:.2f} GiB (+{(rss.peak - rss.base) / 2**30:.2f}); "
                         + cpu_note()))
            again = cold and args.again
            if again:
                (nb, nby, wall, _, bad), _, _ = bench_ferry(paths, kind, n, sample, args, False)
                res["ferry again"] = (nb, nby, wall)
                rows.append((kind, cache, "ferry again, not dropped", nb / wall, nby / wall / 1e9,
                             f"!! {bad} wrong ids" if bad else ""))
            if not cold:
                (nb, nby, wall, _, bad), _, path = bench_ferry(paths, kind, n, sample, args, cold,
                                                                block_size=16)
                rows.append((kind, cache, "ferry block_size=16 (%s)" % path, nb / wall, nby / wall / 1e9,
                             "blocks of 16 rows shuffled" + (f" !! {bad} wrong ids" if bad else "")))
            nb, nby, wall, inflight = bench_raw(paths, kind, n, sample, args, cold)
            res["raw"] = (nb, nby, wall)
            rows.append((kind, cache, "ferry engine alone", nb / wall, nby / wall / 1e9,
                         f"{inflight} batches in flight"))
            for w in workers:
                nb, nby, wall, _, _ = bench_dataloader(paths, kind, n, sample, args, w, cold)
                res[f"dl{w}"] = (nb, nby, wall)
                rows.append((kind, cache, f"DataLoader w={w} pin .cuda()", nb / wall, nby / wall / 1e9, ""))
                if again:
                    nb, nby, wall, _, _ = bench_dataloader(paths, kind, n, sample, args, w, False)
                    res[f"again dl{w}"] = (nb, nby, wall)
                    rows.append((kind, cache, f"DataLoader w={w} again, not dropped", nb / wall,
                                 nby / wall / 1e9, ""))
            if again:
                fa = res["ferry again"][1] / res["ferry again"][2]
                best_a = max((v[1] / v[2] for k, v in res.items() if k.startswith("again dl")),
                             default=float("nan"))
                print(f"{kind:5s} again ferry {fa / 1e9:6.2f} GB/s = {fa / best_a:5.1f}x best DataLoader "
                      f"again ({best_a / 1e9:.2f} GB/s), the cold run before it not dropped", flush=True)
            best = max((v[1] / v[2] for k, v in res.items() if k.startswith("dl")), default=float("nan"))
            f_rate = res["ferry"][1] / res["ferry"][2]
            raw = res["raw"][1] / res["raw"][2]
            print(f"{kind:5s} {cache:4s}  ferry {f_rate / 1e9:6.2f} GB/s = {f_rate / best:5.2f}x best "
                  f"DataLoader ({best / 1e9:.2f} GB/s), {f_rate / raw:4.2f}x engine alone "
                  f"({raw / 1e9:.2f} GB/s)", flush=True)
        if not args.no_train:
            model, opt = small_model(kind, "cuda")
            x = torch.empty((B,) + KINDS[kind]["shape"], dtype=torch.uint8 if kind == "image" else torch.float32,
                            device="cuda")
            for _ in range(3):
                train_step(model, opt, x, kind)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                train_step(model, opt, x, kind)
            torch.cuda.synchronize()
            step_s = (time.perf_counter() - t0) / 20
            step = lambda b: train_step(model, opt, b, kind)  # noqa: E731
            # also with fewer engine threads: the training thread launches its kernels on a core
            # the engine's workers (which spin in cuEventSynchronize by default) leave free
            for t in [int(x) for x in args.train_threads.split(",") if x]:
                (nb, nby, wall, busy, _), _, _ = bench_ferry(paths, kind, n, sample, args, False, step=step,
                                                              threads=t or None)
                rows.append((kind, "warm", "train step fed by ferry" + (f" threads={t}" if t else ""),
                             nb / wall, nby / wall / 1e9,
                             f"GPU idle {100 * (1 - busy / wall):.1f}% (step {step_s * 1e3:.1f} ms); "
                             + cpu_note()))
            for w in workers:
                nb, nby, wall, busy, _ = bench_dataloader(paths, kind, n, sample, args, w, False, step=step)
                rows.append((kind, "warm", f"train step fed by DataLoader w={w}", nb / wall, nby / wall / 1e9,
                             f"GPU idle {100 * (1 - busy / wall):.0f}%"))
    _print_rows(rows)


def _print_rows(rows):
    print()
    print(f"| {'kind':5s} | {'cache':5s} | {'loader':36s} | {'batches/s':>9s} | {'GB/s':>6s} | notes |")
    print(f"|{'-' * 7}|{'-' * 7}|{'-' * 38}|{'-' * 11}|{'-' * 8}|-------|")
    for kind, cache, name, bps, gbs, note in rows:
        print(f"| {kind:5s} | {cache:5s} | {name:36s} | {bps:9.1f} | {gbs:6.2f} | {note} |")


if __name__ == "__main__":
    main()
