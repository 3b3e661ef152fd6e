#!/usr/bin/env python3
"""Many GPUs on one host (issue 11), every number from one run on N = torch.cuda.device_count()
GPUs (or --ranks N CPU ranks with --smoke / without CUDA), every result verified.

    PYTHONPATH=python python3 bench/bench_multigpu.py --gib 4 --dir /path/on/real/disk --json mg.json
    PYTHONPATH=python python3 bench/bench_multigpu.py --smoke          # tiny, CPU ranks, gloo
    ... --skip datasets,checkpoint --json io.json; ... --skip limits,aggregate,decode \
        --aggregate-from io.json --json ranks.json     # the same in two commands of < 10 min

1. The host's limits: parallel pread of a warm file from 16 / 32 / 64 threads (random 8 MiB
   preads for 3 s, bench/pread_limit.c compiled with cc; Python os.preadv too); pinned
   host->device copies per device alone, then on every device at once (a thread per device).
2. ferry file -> GPU, warm and cold (posix_fadvise DONTNEED, and /proc/sys/vm/drop_caches
   where writable): one GPU alone (the one-GPU rate), (a) one process whose one plan's
   extents fill the N devices, (b) N processes, one per device, each its own ferry context.
   Aggregate rate = all bytes / (last end - first start); ratio to
   min(N x the one-GPU rate, the parallel-pread limit), the issue's bar being 0.8 (warm).
3. torchrun-style ranks (torch.multiprocessing spawn, NCCL where there is a GPU per rank,
   gloo otherwise): ArrayDataset rows, per-sample files (samples="files"), TokenDataset and
   XarrayDataset on 1 rank (--epochs epochs) and on N ranks (N times as many epochs: the same
   bytes per rank): per-rank GB/s and samples/s, the N-rank / 1-rank ratio (bar 0.8), and
   every sample exactly once per epoch over the ranks.
4. Checkpoints on N ranks at once: the disk's raw parallel write (O_DIRECT + fsync, one
   file per rank, the same bytes), dcp.save through ferry.checkpoint.FerryWriter of a
   Shard(0) DTensor state dict, dcp.load through FerryReader resharded to Shard(1) (warm),
   every element checked; ferry.checkpoint.save(max_shard_size=...) by every rank at once.
   Bars: save >= 0.9 x raw parallel write; load warm >= 0.8 x the aggregate rate of 2(b).
5. GPU decode per rank (run after 2): zlib (HDF5-deflate-like) 1 MiB chunks, each rank decoding its own
   chunks into its GPU, FERRY_DECODE auto / gpu (nvCOMP; "not run" with the reason where it
   is not loaded) / cpu, on 1 rank and on N ranks at once; every chunk checked.
GB/s are 10^9 bytes per second. A short table goes to stdout, everything to --json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import mmap
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

import ferry  # noqa: E402

GB = 1e9
CHUNK = 8 << 20


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- files
def write_pattern(path, nbytes):
    """nbytes of a position-dependent pattern (uint64 words = their index): any misplaced
    or missing byte range shows in a check."""
    with open(path, "wb") as f:
        words = CHUNK // 8
        for at in range(0, nbytes, CHUNK):
            n = min(CHUNK, nbytes - at)
            w = np.arange(at // 8, at // 8 + words, dtype=np.uint64)
            f.write(w.tobytes()[:n])


def pattern_ok(buf, offset):
    """buf (a 1-D uint8 tensor, any device) holds the pattern from file offset `offset`."""
    n = buf.numel() // 8 * 8
    w = buf[:n].view(torch.int64)
    ref = torch.arange(offset // 8, offset // 8 + n // 8, dtype=torch.int64, device=buf.device)
    return bool(torch.equal(w, ref))


def warm(path):
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def evict(path, offset=0, length=0, drop_all=True):
    """Drop [offset, offset+length) (0: to the end) of the file from the page cache (no root
    needed); also drop_caches where allowed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if drop_all:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
        except OSError:
            pass


def cached_fraction(path):
    try:
        with ferry.File(None, path) as f:
            return f.cached() / max(1, f.size)
    except Exception:  # noqa: BLE001
        return None


# ----------------------------------------------------------------------------- 1. host limits
def pread_parallel(path, threads):
    """GB/s of `threads` threads pread()ing the whole (warm) file in 8 MiB pieces."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    nxt = [0]
    lock = threading.Lock()
    got = [0] * threads

    def work(i):
        buf = bytearray(CHUNK)
        mv = memoryview(buf)
        while True:
            with lock:
                at = nxt[0]
                nxt[0] += CHUNK
            if at >= size:
                return
            got[i] += os.preadv(fd, [mv[:min(CHUNK, size - at)]], at)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    os.close(fd)
    assert sum(got) == size
    return size / dt / GB


def pread_c(path, threads, seconds, workdir):
    """GB/s of bench/pread_limit.c (random 8 MiB preads of the warm file from `threads`
    threads for `seconds`: no Python between the reads), or None without a C compiler."""
    exe = os.path.join(workdir, "pread_limit")
    if not os.path.exists(exe):
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            return None
        subprocess.run([cc, "-O2", "-pthread", os.path.join(HERE, "pread_limit.c"), "-o", exe], check=True)
    out = subprocess.run([exe, path, str(CHUNK), str(CHUNK), str(threads), str(seconds)],
                         check=True, capture_output=True, text=True).stdout
    return float(out.strip())


def h2d_rates(ndev, nbytes, reps):
    """Pinned host->device GB/s per device alone, and all devices at once (aggregate)."""
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dsts = [torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{d}") for d in range(ndev)]
    alone = []
    for d in range(ndev):
        s = torch.cuda.Stream(device=d)
        best = 1e9
        for _ in range(reps):
            torch.cuda.synchronize(d)
            t0 = time.perf_counter()
            with torch.cuda.stream(s):
                dsts[d].copy_(src, non_blocking=True)
            s.synchronize()
            best = min(best, time.perf_counter() - t0)
        alone.append(nbytes / best / GB)
    best_all = 1e9
    for _ in range(reps):
        bar = threading.Barrier(ndev)
        spans = [None] * ndev

        def one(d):
            s = torch.cuda.Stream(device=d)
            torch.cuda.synchronize(d)
            bar.wait()
            t0 = time.monotonic()
            with torch.cuda.stream(s):
                dsts[d].copy_(src, non_blocking=True)
            s.synchronize()
            spans[d] = (t0, time.monotonic())

        ts = [threading.Thread(target=one, args=(d,)) for d in range(ndev)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best_all = min(best_all, max(e for _, e in spans) - min(s for s, _ in spans))
    return alone, ndev * nbytes / best_all / GB


# ----------------------------------------------------------------------------- 2. ferry file -> GPU
def _dest(dev, n):
    return torch.empty(n, dtype=torch.uint8, device="cpu" if dev < 0 else f"cuda:{dev}")


def _mem(t):
    """What ferry takes: a CUDA tensor as is (__cuda_array_interface__), a CPU one as numpy."""
    return t if t.is_cuda else t.numpy()


def _sync(dev):
    if dev >= 0:
        torch.cuda.synchronize(dev)


def ferry_fill(path, parts, devs, ctx, prep):
    """One plan: part k ((offset, length)) of the file into a buffer on devs[k]; one untimed
    run first (workers started, staging pinned: a context's first plan pays for both), then
    prep() (warm or evict), then the timed run. Returns (seconds, buffers)."""
    bufs = [_dest(d, n) for d, (_, n) in zip(devs, parts)]
    with ferry.File(ctx, path) as f:
        plan = ferry.Plan()
        for b, (off, n) in zip(bufs, parts):
            plan.read_file(f, off, n, _mem(b))
        ctx.run(plan)
        prep()
        for d in set(devs):
            _sync(d)
        t0 = time.perf_counter()
        got = ctx.run(plan)
        dt = time.perf_counter() - t0
    assert got == sum(n for _, n in parts), got
    return dt, bufs


def _proc_reader(rank, path, part, dev, cold, threads, barrier, q):
    """(b): one process per device, its own ferry context; an untimed run first (as in
    ferry_fill), its part evicted again when cold; start together, report the span."""
    try:
        if dev >= 0:
            torch.cuda.set_device(dev)
        ctx = ferry.Context(threads=threads)
        buf = _dest(dev, part[1])
        with ferry.File(ctx, path) as f:
            plan = ferry.Plan()
            plan.read_file(f, part[0], part[1], _mem(buf))
            ctx.run(plan)
            if cold:
                evict(path, part[0], part[1], drop_all=False)
            _sync(dev)
            barrier.wait()
            t0 = time.monotonic()
            got = ctx.run(plan)
            t1 = time.monotonic()
        ok = got == part[1] and pattern_ok(buf, part[0])
        q.put((rank, t0, t1, ok, ctx.stats()))
    except Exception as e:  # noqa: BLE001
        q.put((rank, 0.0, 0.0, False, repr(e)))


def ferry_processes(path, parts, devs, cold, threads):
    mpc = mp.get_context("spawn")
    barrier, q = mpc.Barrier(len(parts)), mpc.Queue()
    ps = [mpc.Process(target=_proc_reader, args=(r, path, parts[r], devs[r], cold, threads, barrier, q))
          for r in range(len(parts))]
    for p in ps:
        p.start()
    res = [q.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    bad = [r for r in res if not r[3]]
    assert not bad, bad
    span = max(r[2] for r in res) - min(r[1] for r in res)
    return span


def aggregate(args, path, out, N, devs, limits):
    per = args.per_dev
    total = per * N
    parts = [(k * per, per) for k in range(N)]
    res = {}
    for mode in ("warm", "cold"):
        r = {}
        # warm: read once here; every untimed run before a timed one reads the bytes again
        if mode == "warm":
            warm(path)
        prep = (lambda: None) if mode == "warm" else (lambda: evict(path))
        best1, bestA, bestB = 1e9, 1e9, 1e9
        ctx = ferry.Context()
        for _ in range(args.reps if mode == "warm" else 1):   # cold runs are the disk's: once
            dt, bufs = ferry_fill(path, parts[:1], devs[:1], ctx, prep)
            assert pattern_ok(bufs[0], 0)
            best1 = min(best1, dt)
            del bufs
            dt, bufs = ferry_fill(path, parts, devs, ctx, prep)
            assert all(pattern_ok(b, o) for b, (o, _) in zip(bufs, parts)), "one-process fill wrong"
            bestA = min(bestA, dt)
            del bufs
            prep()
            r["cached_before_processes"] = cached_fraction(path)
            bestB = min(bestB, ferry_processes(path, parts, devs, mode == "cold", args.proc_threads))
        r["stats"] = ctx.stats()
        ctx.close()
        r["one_gpu"] = per / best1 / GB
        r["one_process"] = total / bestA / GB
        r["n_processes"] = total / bestB / GB
        # warm: the bar; cold: every process reads the same disk, so the bar is
        # the one-GPU cold rate (the disk's), not N times it
        bar = min(N * r["one_gpu"], limits.get("pread_best") or 1e30) if mode == "warm" else r["one_gpu"]
        r["bar_min"] = bar
        r["ratio_one_process"] = r["one_process"] / bar
        r["ratio_n_processes"] = r["n_processes"] / bar
        res[mode] = r
        log(f"  {mode}: one GPU {r['one_gpu']:.2f}, one process x{N} {r['one_process']:.2f}, "
            f"{N} processes {r['n_processes']:.2f} GB/s (ratios {r['ratio_one_process']:.2f} / "
            f"{r['ratio_n_processes']:.2f} of {bar:.2f})")
    out["aggregate"] = res


# ----------------------------------------------------------------------------- 3 + 4. ranks
def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def write_netcdf3(path, data):
    """A CDF-2 (64-bit offset) file of one float32 variable v(time, y, x): the classic
    header by hand (the GPU machine has neither scipy's writer nor netCDF4)."""
    T, H, W = data.shape

    def name(s):
        b = s.encode()
        return i32(len(b)) + b + b"\0" * (-len(b) % 4)

    def i32(v):
        return np.array([v], dtype=">i4").tobytes()

    dims = [("time", T), ("y", H), ("x", W)]
    head = b"CDF\x02" + i32(0)
    head += i32(0x0A) + i32(len(dims)) + b"".join(name(n) + i32(v) for n, v in dims)
    head += i32(0) + i32(0)                                  # no global attributes
    vsize = T * H * W * 4
    var_wo_begin = (name("v") + i32(3) + i32(0) + i32(1) + i32(2) + i32(0) + i32(0)
                    + i32(5) + i32(min(vsize, 2**31 - 1)))
    vars_len = len(i32(0x0B) + i32(1) + var_wo_begin) + 8
    begin = len(head) + vars_len
    head += i32(0x0B) + i32(1) + var_wo_begin + np.array([begin], dtype=">i8").tobytes()
    with open(path, "wb") as f:
        f.write(head)
        f.write(data.astype(">f4").tobytes())


def make_datasets(work, smoke):
    """The four datasets' files; each sample carries its own id."""
    d = {}
    rows, shape = (96, (3, 16, 16)) if smoke else (48000, (3, 224, 224))
    root = os.path.join(work, "rows")
    os.makedirs(root)
    per_shard = rows // 4
    for i in range(4):
        ids = np.arange(i * per_shard, (i + 1) * per_shard, dtype=np.int64)
        x = (ids[:, None] % 251).astype(np.uint8) * np.ones((1, int(np.prod(shape))), np.uint8)
        np.save(os.path.join(root, f"x_{i}.npy"), x.reshape((per_shard,) + shape))
        np.save(os.path.join(root, f"id_{i}.npy"), ids)
    d["rows"] = dict(fields={"x": os.path.join(root, "x_*.npy"), "id": os.path.join(root, "id_*.npy")},
                     n=rows)
    files = 64 if smoke else 12000
    root = os.path.join(work, "files")
    for k in ("x", "id"):
        os.makedirs(os.path.join(root, k))
    for i in range(files):
        np.save(os.path.join(root, "x", f"s{i}.npy"), np.full(shape, i % 251, np.uint8))
        np.save(os.path.join(root, "id", f"s{i}.npy"), np.int64(i))
    d["files"] = dict(fields={"x": os.path.join(root, "x", "s*.npy"), "id": os.path.join(root, "id", "s*.npy")},
                      n=files)
    ntok = 4096 if smoke else 1 << 30
    root = os.path.join(work, "tokens")
    os.makedirs(root)
    per = ntok // 4
    for i in range(4):
        np.arange(i * per, (i + 1) * per, dtype=np.uint32).tofile(os.path.join(root, f"train_{i}.bin"))
    L = 64 if smoke else 1024
    starts = [i * per + j * L for i in range(4) for j in range((per - 1) // L)]
    d["tokens"] = dict(files=os.path.join(root, "train_*.bin"), seq_len=L, n=len(starts), starts=starts)
    T, H, W = (40, 16, 16) if smoke else (4000, 256, 512)
    v = np.empty((T, H, W), np.float32)
    v[:] = np.arange(T, dtype=np.float32)[:, None, None]
    path = os.path.join(work, "grid.nc")
    write_netcdf3(path, v)
    d["xarray"] = dict(path=path, n=T)
    return d


def _sample_ids(kind, b):
    """(the batch's sample ids as a tensor on its device: no sync per batch, bytes)."""
    if kind in ("rows", "files"):
        return b["id"], sum(t.numel() * t.element_size() for t in b.values())
    if kind == "tokens":
        x, y = b
        return x[:, 0], x.numel() * x.element_size() + y.numel() * y.element_size()
    return b["x"][:, 0, 0, 0].long(), b["x"].numel() * b["x"].element_size()


def make_dataset(kind, spec, device, batch):
    from ferry.torch import ArrayDataset, TokenDataset, XarrayDataset
    if kind == "rows":
        return ArrayDataset(fields=spec["fields"], batch_size=batch, shuffle=True, seed=3, device=device)
    if kind == "files":
        return ArrayDataset(fields=spec["fields"], samples="files", batch_size=batch, shuffle=True,
                            seed=3, device=device)
    if kind == "tokens":
        return TokenDataset(spec["files"], spec["seq_len"], batch, dtype="uint32", seed=3, device=device,
                            drop_last=False)
    return XarrayDataset(spec["path"], ["v"], batch_size=batch, shuffle=True, seed=3, device=device)


def _rank_main(rank, world, port, job, resdir):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    gpu = torch.cuda.is_available() and torch.cuda.device_count() >= world and not job["cpu"]
    if gpu:
        torch.cuda.set_device(rank)
    backend = "nccl" if gpu else "gloo"
    dev = torch.device(f"cuda:{rank}" if gpu else "cpu")
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600),
                            **({"device_id": dev} if gpu else {}))
    res = {"rank": rank, "backend": backend}
    try:
        if job["what"] == "dataset":
            res.update(_rank_dataset(job, dev, dist))
        elif job["what"] == "decode":
            res.update(_rank_decode(job, dev, dist, rank, world))
        else:
            res.update(_rank_checkpoint(job, dev, dist, rank, world))
    except Exception as e:  # noqa: BLE001
        import traceback
        res["error"] = traceback.format_exc()[-3000:]
        log(f"rank {rank}: {e!r}")
    with open(os.path.join(resdir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)   # no interpreter teardown racing gloo's threads (tests/python/test_checkpoint.py)


def _rank_dataset(job, dev, dist):
    """`epochs` epochs on this rank (a rank of N reads N times as many epochs as the rank
    alone, so both runs move about the same bytes per rank); ids per epoch."""
    ds = make_dataset(job["kind"], job["spec"], str(dev), job["batch"])
    per_epoch, nbytes = [], 0
    dist.barrier()
    t0 = time.monotonic()
    for e in range(job["epochs"]):
        ds.set_epoch(e)
        ids = []
        for b in ds:
            i, n = _sample_ids(job["kind"], b)
            ids.append(i.to(torch.int64, copy=True))
            nbytes += n
        per_epoch.append(ids)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t1 = time.monotonic()
    dist.barrier()
    ids = [torch.cat(x).cpu().tolist() if x else [] for x in per_epoch]
    return {"ids": ids, "bytes": nbytes, "t0": t0, "t1": t1}


DCH = 1 << 20        # decoded bytes per compressed chunk
DISTINCT = 16        # distinct chunk contents (compressing is the slow part of the setup)


def _distinct_chunks():
    """DISTINCT 1 MiB float32 random walks (compressible, like smooth fields)."""
    rng = np.random.default_rng(5)
    return [np.cumsum(rng.normal(size=DCH // 4)).astype(np.float32).round(2) for _ in range(DISTINCT)]


def make_decode_file(path, nchunks):
    """nchunks zlib (HDF5-deflate-like) chunks, chunk i holding distinct chunk i % DISTINCT."""
    import zlib
    comp = [zlib.compress(c.tobytes(), 1) for c in _distinct_chunks()]
    offs = []
    with open(path, "wb") as f:
        at = 0
        for i in range(nchunks):
            c = comp[i % DISTINCT]
            f.write(c)
            offs.append((at, len(c)))
            at += len(c)
    return offs


def _rank_decode(job, dev, dist, rank, world):
    """This rank decodes its own chunks (rank, rank + world, ...) into one buffer, per decode
    policy: an untimed run, then the timed one (ranks together), every chunk checked."""
    ref = [torch.from_numpy(c.view(np.uint8)).to(dev) for c in _distinct_chunks()]
    mine = list(range(rank, len(job["offs"]), world))
    buf = torch.empty(len(mine) * DCH, dtype=torch.uint8, device=dev)
    out = {"chunks": len(mine), "decoded_bytes": len(mine) * DCH}
    ctx = ferry.Context()
    with ferry.File(ctx, job["path"]) as f:
        plan = ferry.Plan()
        for k, i in enumerate(mine):
            off, n = job["offs"][i]
            plan.extent(file=f, offset=off, length=n, codecs=["zlib"], decoded_size=DCH, dst=_mem(buf),
                        dst_offset=k * DCH)
        for pol in job["policies"]:
            try:
                ctx.run(plan, decode=pol)
                err = None
            except ferry.FerryError as e:   # gpu without nvCOMP: FERRY_EPATH, say so
                err = str(e)
            dist.barrier()
            if err:                      # the two barriers _timed makes on the other ranks
                dist.barrier()
                dist.barrier()
                out[pol] = {"error": err}
                continue
            ctx.reset_stats()
            buf.zero_()
            t0, t1, _ = _timed(dist, dev, lambda: ctx.run(plan, decode=pol))
            ok = all(torch.equal(buf[k * DCH:(k + 1) * DCH], ref[i % DISTINCT]) for k, i in enumerate(mine))
            st = ctx.stats()
            out[pol] = {"t0": t0, "t1": t1, "ok": ok, "gpu_decoded_bytes": st.get("gpu_decoded_bytes"),
                        "gpu_cpu_fallbacks": st.get("gpu_cpu_fallbacks")}
    ctx.close()
    return out


def decode(args, work, out, N, cpu):
    path = os.path.join(work, "chunks.zlib")
    nchunks = max(N, int(args.decode_gib * (1 << 30)) // DCH)
    offs = make_decode_file(path, nchunks)
    warm(path)
    policies = args.decode_policies.split(",") if args.decode_policies else (["auto"] if cpu else ["auto", "gpu", "cpu"])
    res = {"chunks": nchunks, "compressed_bytes": os.path.getsize(path)}
    for world in sorted({1, N}):
        ranks = run_ranks(world, {"what": "decode", "path": path, "offs": offs, "policies": policies}, cpu)
        r = {}
        for pol in policies:
            if "error" in ranks[0][pol]:
                r[pol] = {"error": ranks[0][pol]["error"]}
                continue
            assert all(o[pol]["ok"] for o in ranks), f"decode {pol} on {world} ranks: wrong bytes"
            span = max(o[pol]["t1"] for o in ranks) - min(o[pol]["t0"] for o in ranks)
            r[pol] = {"aggregate_gbs": nchunks * DCH / span / GB,
                      "per_rank_gbs": [o["decoded_bytes"] / (o[pol]["t1"] - o[pol]["t0"]) / GB for o in ranks],
                      "gpu_decoded_bytes": sum(o[pol]["gpu_decoded_bytes"] or 0 for o in ranks),
                      "gpu_cpu_fallbacks": sum(o[pol]["gpu_cpu_fallbacks"] or 0 for o in ranks)}
        res[world] = r
    for pol in policies:
        one, many = res[1].get(pol, {}), res[N].get(pol, {})
        if "aggregate_gbs" in one and "aggregate_gbs" in many:
            res[f"ratio_{pol}_per_rank_to_one"] = min(many["per_rank_gbs"]) / one["per_rank_gbs"][0]
            log(f"  zlib decode {pol}: 1 rank {one['aggregate_gbs']:.2f}, {N} ranks {many['aggregate_gbs']:.2f} GB/s "
                f"decoded (per rank min {min(many['per_rank_gbs']):.2f})")
        else:
            log(f"  zlib decode {pol}: {one.get('error') or many.get('error')}")
    out["decode"] = res
    os.unlink(path)


def _grid(rows, cols, r0, r1, c0, c1, dev):
    """G[i, j] = (7 i + 13 j) mod 65536, exact in float32, computed for a block."""
    i = torch.arange(r0, r1, device=dev, dtype=torch.int64)[:, None]
    j = torch.arange(c0, c1, device=dev, dtype=torch.int64)[None, :]
    return ((7 * i + 13 * j) % 65536).to(torch.float32)


def _raw_write(path, nbytes):
    """The disk's durable rate: nbytes from an aligned buffer, O_DIRECT where the file
    system takes it, then fsync."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        fd = os.open(path, flags | os.O_DIRECT)
    except OSError:
        fd = os.open(path, flags)
    buf = mmap.mmap(-1, CHUNK)
    buf.write(b"\x5a" * CHUNK)
    mv = memoryview(buf)
    at = 0
    try:
        while at < nbytes:
            n = min(CHUNK, nbytes - at)
            if n % 4096:
                os.close(fd)
                fd = os.open(path, os.O_WRONLY)
            at += os.pwritev(fd, [mv[:n]], at)
        os.fsync(fd)
    finally:
        os.close(fd)
        mv.release()
        buf.close()


def _timed(dist, dev, fn):
    dist.barrier()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.monotonic()
    out = fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t1 = time.monotonic()
    dist.barrier()
    return t0, t1, out


def _rank_checkpoint(job, dev, dist, rank, world):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from ferry import checkpoint as ck
    d, per = job["dir"], job["per_rank"]
    cols = 3360                                   # divisible by 1..8: even Shard(1) on any N
    rows_local = max(1, per // (cols * 4))
    rows = rows_local * world
    mesh = init_device_mesh(dev.type, (world,))
    res = {}
    # the disk's raw parallel write, the same bytes per rank, every rank at once
    raw = os.path.join(d, f"raw{rank}.bin")
    t0, t1, _ = _timed(dist, dev, lambda: _raw_write(raw, rows_local * cols * 4))
    os.unlink(raw)
    res["raw_write"] = (t0, t1)
    local = _grid(rows, cols, rank * rows_local, (rank + 1) * rows_local, 0, cols, dev)
    sd = {"w": DTensor.from_local(local, mesh, [Shard(0)], run_check=False)}
    cdir = os.path.join(d, "dcp")
    t0, t1, _ = _timed(dist, dev, lambda: dcp.save(sd, storage_writer=ck.FerryWriter(cdir)))
    res["dcp_save"] = (t0, t1)
    del sd, local
    if rank == 0:                                 # load warm: the files in the page cache
        for n in os.listdir(cdir):
            warm(os.path.join(cdir, n))
    c0, c1 = rank * cols // world, (rank + 1) * cols // world
    tgt = {"w": DTensor.from_local(torch.zeros(rows, c1 - c0, device=dev), mesh, [Shard(1)], run_check=False)}
    t0, t1, _ = _timed(dist, dev, lambda: dcp.load(tgt, storage_reader=ck.FerryReader(cdir)))
    res["dcp_load"] = (t0, t1)
    res["dcp_ok"] = bool(torch.equal(tgt["w"].to_local(), _grid(rows, cols, 0, rows, c0, c1, dev)))
    del tgt
    # ferry.checkpoint sharded saves, every rank its own set at once
    n_t = 8
    tens = {f"layer{i}.w": _grid(rows_local, cols, rank * rows_local, (rank + 1) * rows_local, 0, cols, dev)[
        :, i * cols // n_t:(i + 1) * cols // n_t].contiguous() for i in range(n_t)}
    nbytes = sum(t.numel() * 4 for t in tens.values())
    p = os.path.join(d, f"rank{rank}", "model.safetensors")
    t0, t1, _ = _timed(dist, dev, lambda: ck.save(tens, p, max_shard_size=max(1, nbytes // 4)))
    res["ck_save"] = (t0, t1)
    back = ck.load(p + ".index.json" if os.path.exists(p + ".index.json") else p, device=dev)
    res["ck_ok"] = set(back) == set(tens) and all(torch.equal(back[k], tens[k]) for k in tens)
    res["ck_files"] = len(os.listdir(os.path.dirname(p)))
    res["bytes_local"] = rows_local * cols * 4
    res["ck_bytes"] = nbytes
    return res


def run_ranks(world, job, cpu):
    resdir = tempfile.mkdtemp(prefix="ferry-mg-res-")
    job = dict(job, cpu=cpu)
    mp.start_processes(_rank_main, args=(world, _free_port(), job, resdir), nprocs=world, join=True,
                       start_method="spawn")
    out = []
    for r in range(world):
        with open(os.path.join(resdir, f"rank{r}.json")) as f:
            out.append(json.load(f))
    shutil.rmtree(resdir)
    errs = [o["error"] for o in out if "error" in o]
    if errs:
        raise RuntimeError(errs[0])
    return out


def datasets(args, work, out, N, cpu):
    specs = make_datasets(work, args.smoke)
    res = {}
    for kind in args.kinds.split(","):
        spec = specs[kind]
        batch = 8 if args.smoke else {"rows": 256, "files": 256, "tokens": 16, "xarray": 8}[kind]
        r = {}
        want = sorted(spec["starts"]) if kind == "tokens" else list(range(spec["n"]))
        for world in sorted({1, N}):
            epochs = args.epochs * world
            ranks = run_ranks(world, {"what": "dataset", "kind": kind, "spec": spec, "batch": batch,
                                      "epochs": epochs}, cpu)
            once = True
            for e in range(epochs):
                got = sorted(i for o in ranks for i in o["ids"][e])
                once = once and got == want
                assert got == want, f"{kind} on {world} ranks, epoch {e}: {len(got)} samples, {len(want)} wanted, or repeats"
            rates = [o["bytes"] / (o["t1"] - o["t0"]) / GB for o in ranks]
            sps = [sum(map(len, o["ids"])) / (o["t1"] - o["t0"]) for o in ranks]
            r[world] = {"per_rank_gbs": rates, "per_rank_samples_s": sps, "exactly_once": once,
                        "epochs": epochs, "backend": ranks[0]["backend"], "seconds": max(o["t1"] - o["t0"] for o in ranks)}
        r["ratio_min_rank_to_one"] = min(r[N]["per_rank_gbs"]) / r[1]["per_rank_gbs"][0]
        res[kind] = r
        log(f"  {kind}: 1 rank {r[1]['per_rank_gbs'][0]:.2f} GB/s; {N} ranks min "
            f"{min(r[N]['per_rank_gbs']):.2f} GB/s per rank (ratio {r['ratio_min_rank_to_one']:.2f}), "
            f"exactly once: {r[N]['exactly_once']}")
    out["datasets"] = res


def checkpoints(args, work, out, N, cpu):
    d = os.path.join(args.dir or work, "ferry-mg-ckpt")
    os.makedirs(d, exist_ok=True)
    try:
        ranks = run_ranks(N, {"what": "checkpoint", "dir": d, "per_rank": args.ckpt_per_rank}, cpu)
    finally:
        shutil.rmtree(d, ignore_errors=True)

    def agg(key, nkey="bytes_local"):
        span = max(o[key][1] for o in ranks) - min(o[key][0] for o in ranks)
        return sum(o[nkey] for o in ranks) / span / GB

    r = {"raw_parallel_write": agg("raw_write"), "dcp_save": agg("dcp_save"), "dcp_load_warm": agg("dcp_load"),
         "ck_sharded_save": agg("ck_save", "ck_bytes"), "dcp_resharded_ok": all(o["dcp_ok"] for o in ranks),
         "ck_sharded_ok": all(o["ck_ok"] for o in ranks), "ck_files_per_rank": ranks[0]["ck_files"],
         "backend": ranks[0]["backend"], "bytes_total": sum(o["bytes_local"] for o in ranks)}
    r["ratio_dcp_save_to_raw"] = r["dcp_save"] / r["raw_parallel_write"]
    r["ratio_ck_save_to_raw"] = r["ck_sharded_save"] / r["raw_parallel_write"]
    aggw = out.get("aggregate", {}).get("warm", {}).get("n_processes")
    r["ratio_dcp_load_to_aggregate"] = r["dcp_load_warm"] / aggw if aggw else None
    assert r["dcp_resharded_ok"] and r["ck_sharded_ok"], r
    out["checkpoint"] = r
    log(f"  raw parallel write {r['raw_parallel_write']:.2f}, dcp save {r['dcp_save']:.2f}, "
        f"dcp load warm (resharded) {r['dcp_load_warm']:.2f}, sharded ck.save {r['ck_sharded_save']:.2f} GB/s")


# ----------------------------------------------------------------------------- main
def machine():
    m = {"hostname": socket.gethostname(), "cpus": os.cpu_count(), "torch": torch.__version__}
    exe = os.path.join(ROOT, "build", "ferry")
    if os.path.exists(exe):
        r = subprocess.run([exe, "info", "--json"], capture_output=True, text=True)
        try:
            m["ferry_info"] = json.loads(r.stdout)
        except ValueError:
            m["ferry_info"] = r.stdout + r.stderr
    for cmd in (["nvidia-smi", "-L"], ["nvidia-smi", "topo", "-m"], ["numactl", "--hardware"]):
        try:
            m[" ".join(cmd)] = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            pass
    return m


def table(out, N):
    lines = [f"bench_multigpu: N = {N} ({out['kind']})", "what | GB/s | ratio (bar)"]
    lim = out.get("limits", {})
    for t in (16, 32, 64):
        if f"pread_{t}" in lim:
            lines.append(f"parallel pread, {t} threads (warm) | {lim[f'pread_{t}']:.2f} |")
    if lim.get("h2d_alone"):
        lines.append(f"pinned H2D per device alone (min..max) | {min(lim['h2d_alone']):.2f}..{max(lim['h2d_alone']):.2f} |")
        lines.append(f"pinned H2D all {N} at once (aggregate) | {lim['h2d_all']:.2f} |")
    for mode, r in out.get("aggregate", {}).items():
        lines.append(f"ferry file->GPU {mode}, one GPU | {r['one_gpu']:.2f} |")
        bar = " (0.8)" if mode == "warm" else " (of one GPU cold)"
        lines.append(f"ferry {mode}, one process, {N} devices | {r['one_process']:.2f} | {r['ratio_one_process']:.2f}{bar}")
        lines.append(f"ferry {mode}, {N} processes | {r['n_processes']:.2f} | {r['ratio_n_processes']:.2f}{bar}")
    for kind, r in out.get("datasets", {}).items():
        lines.append(f"{kind}: one rank alone | {r[1]['per_rank_gbs'][0]:.2f} |")
        lines.append(f"{kind}: per rank on {N} ranks (min), exactly once {r[N]['exactly_once']} | "
                     f"{min(r[N]['per_rank_gbs']):.2f} | {r['ratio_min_rank_to_one']:.2f} (0.8)")
    dec = out.get("decode")
    for pol in ("auto", "gpu", "cpu"):
        if dec and "aggregate_gbs" in dec.get(N, {}).get(pol, {}):
            lines.append(f"zlib chunks decoded ({pol}), 1 rank | {dec[1][pol]['aggregate_gbs']:.2f} |")
            lines.append(f"zlib chunks decoded ({pol}), {N} ranks own chunks, aggregate | "
                         f"{dec[N][pol]['aggregate_gbs']:.2f} | {dec[f'ratio_{pol}_per_rank_to_one']:.2f} per rank")
        elif dec and pol in dec.get(N, {}):
            lines.append(f"zlib chunks decoded ({pol}) | not run: {dec[N][pol]['error'][:60]} |")
    c = out.get("checkpoint")
    if c:
        lines.append(f"raw parallel write, {N} files + fsync | {c['raw_parallel_write']:.2f} |")
        lines.append(f"dcp.save FerryWriter, {N} ranks | {c['dcp_save']:.2f} | {c['ratio_dcp_save_to_raw']:.2f} (0.9)")
        rl = c["ratio_dcp_load_to_aggregate"]
        lines.append(f"dcp.load FerryReader resharded, warm | {c['dcp_load_warm']:.2f} | "
                     f"{'-' if rl is None else f'{rl:.2f}'} (0.8)")
        lines.append(f"ferry.checkpoint.save max_shard_size, {N} ranks | {c['ck_sharded_save']:.2f} | "
                     f"{c['ratio_ck_save_to_raw']:.2f}")
    return "\n".join(lines)


def save(args, out):
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(out, f, indent=1, default=str)
        os.replace(args.json + ".tmp", args.json)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=4, help="GiB per device for the aggregate runs")
    ap.add_argument("--ckpt-gib", type=float, default=2, help="GiB per rank for the checkpoint runs")
    ap.add_argument("--dir", default=None, help="a directory on the disk to measure (default: a temp dir)")
    ap.add_argument("--json", default=None, help="written after every section (a run cut short keeps what it has)")
    ap.add_argument("--aggregate-from", default=None,
                    help="a JSON of an earlier run on the same machine whose aggregate rates the checkpoint "
                         "load is compared with (when this run skips aggregate)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=0, help="N (default: the CUDA device count; CPU ranks without CUDA)")
    ap.add_argument("--cpu", action="store_true", help="CPU ranks and host destinations even with GPUs")
    ap.add_argument("--kinds", default="rows,files,tokens,xarray")
    ap.add_argument("--decode-gib", type=float, default=4, help="GiB decoded in all by the decode runs")
    ap.add_argument("--decode-policies", default=None, help="default: auto,gpu,cpu on GPUs, auto on CPU ranks")
    ap.add_argument("--epochs", type=int, default=2,
                    help="epochs of the one-rank dataset runs (N ranks run N times as many: the same bytes per rank)")
    ap.add_argument("--proc-threads", type=int, default=0,
                    help="ferry threads per process in the N-process runs (0: ferry's default)")
    ap.add_argument("--skip", default="", help="comma list of: limits,aggregate,datasets,decode,checkpoint")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, CPU ranks (gloo): a quick check of the code")
    args = ap.parse_args()
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cpu = args.cpu or args.smoke or ngpu == 0
    N = args.ranks or (2 if cpu else ngpu)
    if not cpu and N > ngpu:
        ap.error(f"--ranks {N}: only {ngpu} GPUs")
    if args.smoke:
        args.gib, args.ckpt_gib, args.reps, args.decode_gib = 16 / 1024, 4 / 1024, 1, 24 / 1024
    args.per_dev = int(args.gib * (1 << 30)) // 4096 * 4096
    args.ckpt_per_rank = int(args.ckpt_gib * (1 << 30))
    skip = set(filter(None, args.skip.split(",")))
    devs = [-1] * N if cpu else list(range(N))
    out = {"kind": f"{N} x {torch.cuda.get_device_name(0) if not cpu else 'CPU'}",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": machine(), "args": vars(args)}
    work = tempfile.mkdtemp(prefix="ferry-mg-", dir=args.dir)
    try:
        limits = {}
        path = os.path.join(work, "agg.bin")   # N x --gib: the limits' and the aggregate runs' file
        if not {"limits", "aggregate"} <= skip:
            write_pattern(path, args.per_dev * N)
        if "limits" not in skip:
            log("1. host limits")
            warm(path)
            for t in (16, 32, 64):
                # the C reader where there is a compiler (the limit), Python's os.preadv too
                limits[f"pread_py_{t}"] = max(pread_parallel(path, t) for _ in range(args.reps))
                c = pread_c(path, t, 0.5 if args.smoke else 3, work)
                limits[f"pread_{t}"] = c if c is not None else limits[f"pread_py_{t}"]
            limits["pread_best"] = max(limits[f"pread_{t}"] for t in (16, 32, 64))
            if not cpu:
                limits["h2d_alone"], limits["h2d_all"] = h2d_rates(N, min(args.per_dev, 1 << 30), args.reps + 1)
            log("  " + ", ".join(f"{k} {v if isinstance(v, list) else round(v, 2)}" for k, v in limits.items()))
        out["limits"] = limits
        save(args, out)
        if "aggregate" not in skip:
            log("2. ferry file -> GPU")
            aggregate(args, path, out, N, devs, limits)
            save(args, out)
        elif args.aggregate_from:
            with open(args.aggregate_from) as f:
                out["aggregate"] = json.load(f).get("aggregate", {})
            out["aggregate_from"] = args.aggregate_from
        if os.path.exists(path):
            os.unlink(path)
        if "decode" not in skip:
            log("3. compressed chunks decoded per rank")
            decode(args, work, out, N, cpu)
            save(args, out)
        if "datasets" not in skip:
            log("4. datasets on ranks")
            datasets(args, work, out, N, cpu)
            save(args, out)
        if "checkpoint" not in skip:
            log("5. checkpoints on ranks")
            checkpoints(args, work, out, N, cpu)
            save(args, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(out, N))


if __name__ == "__main__":
    main()
