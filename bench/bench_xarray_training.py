#!/usr/bin/env python3
"""Training batches from xarray data (issue 14): ferry.torch.XarrayDataset against what weather
models train with today, on the same ERA5-like files in one run.

Data: --nvars float32 variables (time x lat x lon, 0.5 deg grid by default), about --gib GiB, one
chunk per time step, as netCDF-4 zlib+shuffle (nc4z), Zarr v3 zstd (zarrz), Zarr v3 uncompressed
(zarr) and netCDF-3 (nc3). The files are written once per shape into --dir (threads: 16 GB per
format in seconds) and reused by later runs; page cache warm. Rows per format (GB/s of batch data
delivered on the GPU, shuffled time steps, batch --batch):

  raw       ferry's engine reading every byte of the file(s) into one GPU buffer (uncompressed
            formats: the issue's "raw file->GPU" limit)
  limit     ferry's own `open_dataset(engine="ferry", device=0).load()` of the same data
  ferry     XarrayDataset(... device="cuda") iterated for one epoch
  dali      the same through ferry.dali's pipeline (DALI source cost), when DALI imports
  idle      GPU idle fraction behind a step sized to consume --step-gbps GB/s: the loop queues
            the step and asks for the next batch; "host waits" also waits for the step each
            time (a loop calling loss.item()), so the dataset's own host time per batch shows
  isel      map-style Dataset doing ds.isel(time=i) with xarray's own engine in DataLoader
            workers (--workers, pin_memory) then .cuda()
  xbatcher  xbatcher's BatchGenerator + MapDataset in the same DataLoader
  physicsnemo  a DALI pipeline whose parallel external_source reads h5py per sample on the CPU
            (NVIDIA PhysicsNeMo's ERA5 datapipe pattern), nc4z only, when DALI imports
The baselines run --peer-seconds after their first batch (their rate is steady by then).
--batches-per-read sets XarrayDataset's batches per plan (default 1), --group-sweep 6
adds a throughput row per value; the host-wait idle row is followed by the host time of each
next() (the epoch's first, which waits for the first read, then median, p90, max; mean in the
value column). Each format's rows are also logged as soon as they are measured.

    python3 bench/bench_xarray_training.py --gib 16 --peer-seconds 3 --group-sweep 6
    python3 bench/bench_xarray_training.py --smoke --device cpu
"""
import argparse
import contextlib
import os
import shutil
import struct
import sys
import threading
import time

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
sys.path.insert(0, here)
from harness import env_settings, have, log, warm  # noqa: E402
from bench_xarray import coords  # noqa: E402


# ---------------------------------------------------------------------------
# data: written once per shape into --dir and reused (a "<name>.done" marker says complete);
# every step of every variable is made and encoded by a thread pool (numpy, zlib and zstd
# release the GIL), so 16 GB per format take seconds, not the minutes xarray's writers take
# ---------------------------------------------------------------------------
def step_field(i, t, ny, nx):
    """bench_xarray.var_data(i, ...)[t] for one step, made on its own."""
    y = np.linspace(-1, 1, ny, dtype=np.float32)[:, None]
    x = np.linspace(0, 6.28, nx, dtype=np.float32)[None, :]
    a = (250 + 10 * i + 20 * y * y + 5 * np.sin(x + np.float32(0.1 * t))).astype(np.float32)
    idx = np.arange(t * ny * nx, (t + 1) * ny * nx, dtype=np.uint64).reshape(ny, nx)
    a += (idx % 97).astype(np.float32) * np.float32(1e-3)
    return a


def _pool_steps(nt, fn, threads=None):
    """fn(t) for every step on a thread pool; returns when all are done (errors re-raised)."""
    import concurrent.futures as cf
    with cf.ThreadPoolExecutor(threads or min(32, os.cpu_count() or 4)) as ex:
        for f in [ex.submit(fn, t) for t in range(nt)]:
            f.result()


def _nc_name(s):
    b = s.encode()
    return struct.pack(">i", len(b)) + b + b"\0" * (-len(b) % 4)


def _nc_attrs(attrs):
    if not attrs:
        return struct.pack(">ii", 0, 0)
    out = struct.pack(">ii", 0x0C, len(attrs))
    for k, v in attrs.items():
        if isinstance(v, str):
            b = v.encode()
            out += _nc_name(k) + struct.pack(">ii", 2, len(b)) + b + b"\0" * (-len(b) % 4)
        else:                                    # one float32
            out += _nc_name(k) + struct.pack(">iif", 5, 1, v)
    return out


def write_nc3_fast(path, names, nt, ny, nx):
    """netCDF-3 64-bit offset (CDF-2), what xarray's scipy writer makes of the same dataset:
    non-record variables, C order, big-endian, data variables with _FillValue NaN."""
    t, la, lo = coords(nt, ny, nx)
    dims = [("time", nt), ("lat", ny), ("lon", nx)]
    coordv = [("time", (0,), 6, {"units": "hours since 2000-01-01"}, t), ("lat", (1,), 6, {}, la),
              ("lon", (2,), 6, {}, lo)]
    datav = [(n, (0, 1, 2), 5, {"units": "K", "_FillValue": float("nan")}, None) for n in names]
    allv = coordv + datav

    def header(begins):
        h = b"CDF\x02" + struct.pack(">i", 0)
        h += struct.pack(">ii", 0x0A, len(dims)) + b"".join(_nc_name(d) + struct.pack(">i", n) for d, n in dims)
        h += struct.pack(">ii", 0, 0)
        h += struct.pack(">ii", 0x0B, len(allv))
        for (name, dd, typ, attrs, _), b in zip(allv, begins):
            size = int(np.prod([dims[k][1] for k in dd])) * (8 if typ == 6 else 4)
            h += _nc_name(name) + struct.pack(">i", len(dd)) + b"".join(struct.pack(">i", k) for k in dd)
            h += _nc_attrs(attrs) + struct.pack(">ii", typ, min(size + (-size % 4), 2 ** 32 - 4))
            h += struct.pack(">q", b)
        return h
    sizes = [int(np.prod([dims[k][1] for k in dd])) * (8 if typ == 6 else 4) for _, dd, typ, _, _ in allv]
    hlen = len(header([0] * len(allv)))
    begins, off = [], hlen
    for s in sizes:
        begins.append(off)
        off += s + (-s % 4)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, off)
        os.pwrite(fd, header(begins), 0)
        for (_, _, _, _, data), b in zip(coordv, begins):
            os.pwrite(fd, np.asarray(data, ">f8").tobytes(), b)
        step = ny * nx * 4

        def one(ti):
            for i, b in enumerate(begins[len(coordv):]):
                os.pwrite(fd, step_field(i, ti, ny, nx).astype(">f4").tobytes(), b + ti * step)
        _pool_steps(nt, one)
    finally:
        os.close(fd)
    return "scipy"


def write_nc4z_fast(path, names, nt, ny, nx):
    """netCDF-4 (HDF5 with dimension scales, as write_h5 makes it), zlib level 1 + shuffle, one
    chunk per step: chunks compressed on a thread pool, written with write_direct_chunk."""
    import threading
    import zlib
    import h5py
    t, la, lo = coords(nt, ny, nx)
    lock = threading.Lock()
    with h5py.File(path, "w", libver="earliest") as f:
        for name, v in (("time", t), ("lat", la), ("lon", lo)):
            d = f.create_dataset(name, data=v)
            d.make_scale(name)
        f["time"].attrs["units"] = "hours since 2000-01-01"
        ds = []
        for i, n in enumerate(names):
            d = f.create_dataset(n, shape=(nt, ny, nx), dtype="<f4", chunks=(1, ny, nx), compression="gzip",
                                 compression_opts=1, shuffle=True, fillvalue=np.float32("nan"))
            d.attrs["units"] = "K"
            d.attrs["_FillValue"] = np.float32("nan")
            for k, dim in enumerate(("time", "lat", "lon")):
                d.dims[k].attach_scale(f[dim])
            ds.append(d)

        def one(ti):
            for i, d in enumerate(ds):
                a = step_field(i, ti, ny, nx)
                shuffled = a.view(np.uint8).reshape(-1, 4).T.tobytes()    # HDF5's shuffle filter
                z = zlib.compress(shuffled, 1)
                with lock:
                    d.id.write_direct_chunk((ti, 0, 0), z, 0)
        _pool_steps(nt, one)
    return "netcdf4" if have("netCDF4") else ("h5netcdf" if have("h5netcdf") else "h5py")


def write_zarr3_fast(path, names, nt, ny, nx, compress):
    """Zarr v3 as xarray writes it (dimension_names, one chunk per step), zstd level 1 or no
    compressor: metadata by zarr, chunk files written on a thread pool."""
    import zarr
    import numcodecs
    t, la, lo = coords(nt, ny, nx)
    g = zarr.open_group(path, mode="w", zarr_format=3)
    for name, v, attrs in (("time", t, {"units": "hours since 2000-01-01"}), ("lat", la, {}), ("lon", lo, {})):
        a = g.create_array(name, shape=v.shape, dtype=v.dtype, dimension_names=[name], attributes=attrs,
                           compressors=None)
        a[:] = v
    comp = [zarr.codecs.ZstdCodec(level=1)] if compress else None
    for n in names:
        g.create_array(n, shape=(nt, ny, nx), chunks=(1, ny, nx), dtype="float32", fill_value=np.nan,
                       compressors=comp, dimension_names=["time", "lat", "lon"], attributes={"units": "K"})
    z = numcodecs.Zstd(level=1) if compress else None

    def one(ti):
        for i, n in enumerate(names):
            b = step_field(i, ti, ny, nx).tobytes()
            d = os.path.join(path, n, "c", str(ti), "0")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "0"), "wb") as fh:
                fh.write(z.encode(b) if z is not None else b)
    _pool_steps(nt, one)
    return "zarr"


def sync(device):
    if device != "cpu":
        import torch
        torch.cuda.synchronize()


def rate(nbytes, secs):
    return nbytes / secs / 1e9


def _open_kw(engine):
    return {"consolidated": False} if engine == "zarr" else {}


def raw_rate(path, device):
    """ferry's raw file->GPU rate: every byte of the file(s) read by the engine into one buffer on
    the device (the limit for uncompressed data; what `ferry bench` measures, on these files).
    A Zarr store's chunk files are opened as many at a time as the open-file limit allows
    (main() raises it to the hard limit); only the engine's runs are timed."""
    import resource
    # half of what is left beside the engine's own open-file cache (a quarter of the limit) and
    # the open datasets: at a soft limit of 1024 a 16 GiB Zarr store (16,520 chunk files)
    # hit "Too many open files" with limit - 256 handles at once
    group = max(64, (resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 256) // 2)
    import torch
    from ferry import _ferry
    from harness import files_of
    ctx = _ferry.default_context() if hasattr(_ferry, "default_context") else _ferry.Context()
    files = [(p, os.path.getsize(p)) for p in sorted(files_of(path))]
    total = sum(n for _, n in files)
    dev = "cpu" if device == "cpu" else "cuda"
    buf = torch.empty(total, dtype=torch.uint8, device=dev)
    dst = (buf.data_ptr(), total, -1 if dev == "cpu" else buf.device.index)
    best = None
    for _ in range(2):
        secs, off = 0.0, 0
        for k in range(0, len(files), group):
            part = files[k:k + group]
            handles = [_ferry.File(ctx, p) for p, _ in part]
            plan = _ferry.Plan()
            for h, (_, n) in zip(handles, part):
                if n:
                    plan.read_file(h, 0, n, dst, off)
                off += n
            t0 = time.perf_counter()
            ctx.run(plan)
            sync(device)
            secs += time.perf_counter() - t0
            for h in handles:
                h.close()
        best = secs if best is None else min(best, secs)
    return rate(total, best)


def free_device_caches(device):
    """Give the memory torch's and cupy's caches hold back to the device before a row: each row's
    dataset allocates on streams of its own, whose cached blocks no later row reuses, and the
    engine sizes its decode calls to the device memory the driver reports free (without this,
    after a few rows in one process, netCDF-4 calls of 17 chunks instead of 340, 2.4 GB/s instead
    of 14)."""
    if device == "cpu":
        return
    import gc
    gc.collect()
    try:
        import torch
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception:
        pass
    try:
        import cupy
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
    except Exception:
        pass


def ferry_load_rate(path, names, device):
    import xarray as xr
    from ferry.xarray import FerryBackendEntrypoint
    dev = "cpu" if device == "cpu" else 0
    best = None
    free_device_caches(device)
    for _ in range(2):
        t0 = time.perf_counter()
        ds = xr.open_dataset(path, engine=FerryBackendEntrypoint, device=dev)
        ds.load()
        sync(device)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
        nb = sum(ds[n].nbytes for n in names)
        ds.close()
        del ds
    return rate(nb, best)


_CYCLES = []


def gpu_sleep(secs):
    """Keep the GPU busy for `secs` on the current stream (torch.cuda._sleep, calibrated once)."""
    import torch
    if not _CYCLES:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        s.record()
        torch.cuda._sleep(200_000_000)
        e.record()
        e.synchronize()
        _CYCLES.append(200_000_000 / (s.elapsed_time(e) / 1e3))
    torch.cuda._sleep(max(1, int(secs * _CYCLES[0])))


def memlog(tag):
    """Host memory after a row (--meminfo): what the pinned pools and the page cache hold."""
    try:
        with open("/proc/meminfo") as f:
            m = {k: int(v.split()[0]) >> 20 for k, v in (line.split(":", 1) for line in f)}
        log(f"{tag}: host GiB available {m.get('MemAvailable', -1)}, cached {m.get('Cached', -1)}, "
            f"free {m.get('MemFree', -1)}")
    except OSError:
        pass


def sweep_items(spec):
    """--sweep's items: (batches_per_read, prefetch, {name: value})."""
    out = []
    for item in [x for x in spec.split(";") if x.strip()]:
        parts = item.strip().split(":", 2)
        if len(parts) < 2:
            raise SystemExit(f"--sweep item {item!r}: use BPR:PREFETCH[:NAME=VALUE,...]")
        env = env_settings(parts[2], f"--sweep item {item!r}") if len(parts) == 3 else {}
        # "auto": batches_per_read=None, the engine-sized groups
        out.append((None if parts[0] == "auto" else int(parts[0]), int(parts[1]), env))
    return out


def env_items(spec):
    """--idle-env's items: {name: value} per ';'-separated NAME=VALUE[,NAME=VALUE] item."""
    return [env_settings(item, f"--idle-env item {item!r}") for item in spec.split(";") if item.strip()]


@contextlib.contextmanager
def environ(env):
    """The environment `env` set for the block (the engine reads these at each job's plan)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ferry_dataset(path, names, device, batch, prefetch, group=None):
    import xarray as xr
    from ferry.torch import XarrayDataset
    from ferry.xarray import FerryBackendEntrypoint
    ds = xr.open_dataset(path, engine=FerryBackendEntrypoint, device="cpu")
    xd = XarrayDataset(ds, names, batch_size=batch, shuffle=True, seed=1, device=device, prefetch=prefetch,
                       batches_per_read=group)
    if os.environ.get("BXT_DEPTH"):
        # an experiment (a row's NAME=VALUE): read groups in flight, the one handed out included,
        # in place of the dataset's own rule (two of the engine-sized groups)
        depth = int(os.environ["BXT_DEPTH"])
        xd._read_depth = lambda rt, d: depth
    return xd


def _alloc_retries(device):
    """torch's caching-allocator retries so far (cudaMalloc failed, cache freed, tried again)."""
    if device == "cpu":
        return 0
    import torch
    return int(torch.cuda.memory_stats().get("num_alloc_retries", 0))


_GC_SLOW = 0.01


def _trace_gc():
    """Log Python's collections that took over 10 ms (a pause of the consumer's thread at a point
    fixed by the allocations before it: the same epoch of every run)."""
    import gc
    if getattr(_trace_gc, "on", False):
        return
    _trace_gc.on, began = True, [0.0]

    def cb(phase, info):
        if phase == "start":
            began[0] = time.perf_counter()
        elif time.perf_counter() - began[0] > _GC_SLOW:
            log(f"  gc: generation {info.get('generation')} took {1e3 * (time.perf_counter() - began[0]):.1f} ms "
                f"({info.get('collected')} collected)")
    gc.callbacks.append(cb)


def trace_ahead(xd, who):
    """BXT_TRACE_AHEAD=1: log, at each pass's start, the groups read ahead for it (taken, planned,
    read) and the time since the pass before ended (its generator's finally: _start_planning);
    and Python's slow collections (_trace_gc)."""
    _trace_gc()
    if getattr(xd, "_traced", False):
        return
    xd._traced = True
    take, plan, t_end = xd._take_ahead, xd._start_planning, [None]

    def start_planning(rt):
        t_end[0] = time.perf_counter()
        return plan(rt)

    def take_ahead(key, order, mine, group_units):
        a = xd._ahead
        st = None if a is None else [(getattr(g.job, "fut", None) is not None,
                                      bool(getattr(g.job, "fut", None) and g.job.fut.done()),
                                      bool(getattr(g.job, "fut", None) and g.job.fut.done() and g.job.done()))
                                     for g in a.groups]
        got = take(key, order, mine, group_units)
        since = "" if t_end[0] is None else f", {1e3 * (time.perf_counter() - t_end[0]):.1f} ms after the last pass ended"
        log(f"  {who} pass of epoch {key[2] if key else None}: took {len(got)} groups read ahead; kept "
            f"{'none' if st is None else len(st)} (planning started, planned, read: {st}){since}")
        return got
    xd._take_ahead, xd._start_planning = take_ahead, start_planning
    _trace_timeline(xd, who, t_end)


def _trace_timeline(xd, who, t_end):
    """BXT_TRACE_AHEAD: at each pass's start, the last pass's tail as a timeline (ms before its
    end): the consumer's hand-offs (and their waits), the planner thread's plans (epoch, samples)
    and the next pass's read-ahead submits; which of them ran late is what the epoch's first
    batch waits for."""
    events = []                             # (start, end, what)
    xd._trace_events = events               # the DALI rows add their long pipe.run() calls
    plan_group, handoff, read_ahead, take = xd._plan_group, xd._handoff, xd._read_ahead, xd._take_ahead

    def timed(fn, what):
        def run(*a):
            t0 = time.perf_counter()
            try:
                return fn(*a)
            finally:
                events.append((t0, time.perf_counter(), what(*a)))
        return run
    planned = timed(plan_group, lambda rt, ids, epoch, sizes: f"plan epoch {epoch}, {len(ids)} samples from {ids[0]}")

    def plan_and_watch(rt, ids, epoch, sizes):
        # and when the engine finished the group's reads (polled: a diagnostic beside the run,
        # whose pairs of groups done together, or an engine idle between groups, show here)
        out = planned(rt, ids, epoch, sizes)
        job = out[1]
        if job is not None:
            def watch():
                while not job.done():
                    time.sleep(0.0005)
                t = time.perf_counter()
                events.append((t, t, f"reads done, epoch {epoch}, {len(ids)} samples from {ids[0]}"))
            threading.Thread(target=watch, daemon=True).start()
        return out
    xd._plan_group = plan_and_watch
    # the planning's parts (wall and the planner thread's CPU ms): the plan's reads built in
    # Python, and the whole of _read_rows (its buffers, that and ctx.submit)
    plan_rows, read_rows = xd._plan_rows, xd._read_rows

    def cpu_timed(fn, what):
        def run(*a):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*a)
            finally:
                t1 = time.perf_counter()
                events.append((t0, t1, f"{what}: {1e3 * (time.thread_time() - c0):.1f} ms CPU"))
        return run
    xd._plan_rows = cpu_timed(plan_rows, "  plan_rows (Python)")
    xd._read_rows = cpu_timed(read_rows, "  read_rows (buffers, plan_rows, submit)")
    xd._handoff = timed(handoff, lambda rt, g, retiring: f"hand-off of {len(g.units)} batches")
    xd._read_ahead = timed(read_ahead, lambda rt, epoch, rank, world, units, room:
                           f"read-ahead submit for epoch {epoch}, room {room}")

    began = [None]                          # the last pass's start (its take)

    def take_ahead(*a):
        end, start = t_end[0], began[0]
        if end is not None:
            # the last pass, whole (an epoch's groups are a few dozen events)
            for t0, t1, what in sorted(events):
                if start is None or t1 >= start:
                    log(f"    {who} pass: {1e3 * (t0 - end):+8.1f} .. {1e3 * (t1 - end):+8.1f} ms "
                        f"from its end  {what}")
        events.clear()
        began[0] = time.perf_counter()
        return take(*a)
    xd._take_ahead = take_ahead


def ferry_epoch(path, names, device, batch, prefetch, dali=False, step_gbps=None, step_sync=False,
                group=None, xd=None, warmup=True, reps=1, host_sync=False, stats=None, copy=None):
    """GB/s of one shuffled epoch of XarrayDataset batches (x on `device`); with step_gbps, the
    fraction of the time the GPU idled behind a step that keeps it busy per/step_gbps seconds a
    batch (step_sync: the host also waits for each step, as a loop calling loss.item() does),
    and the host seconds of each next() (what the loop spends in the dataset between steps).
    xd: a dataset already made (and warmed up: warmup=False) by an earlier row. reps: the best
    of that many timed epochs. host_sync: the host waits for each batch to land (the current
    stream synchronized after each next(), as DALI's pipe.run() waits for its copy of it).
    stats: a dict to receive "mean", the rate over all `reps` epochs back to back (their bytes
    over the time from the first one's start to the last one's end), and "epochs", each one's.
    copy: with host_sync, each batch is first copied into a buffer of the consumer's, as DALI's
    external_source does: "memcpy" (cudaMemcpyAsync, a copy engine: DALI's default) or "kernel"
    (an elementwise kernel, DALI's use_copy_kernel=True) — whether such a copy waits behind the
    engine's host-to-device copies, without DALI."""
    import torch
    if xd is None:
        free_device_caches(device)
    xd = xd if xd is not None else ferry_dataset(path, names, device, batch, prefetch, group)
    if os.environ.get("BXT_TRACE_AHEAD"):
        trace_ahead(xd, "dali" if dali else "dataset")
    if dali:
        import ferry.dali
        # dali may name pipeline() options: "nockpt" (enable_checkpointing=False), "depthN"
        # (prefetch_queue_depth=N), "kernel"/"memcpy" (use_copy_kernel=True/False)
        opts = {}
        for o in (dali.split("-")[1:] if isinstance(dali, str) else ()):
            if o == "nockpt":
                opts["enable_checkpointing"] = False
            elif o.startswith("depth"):
                opts["prefetch_queue_depth"] = int(o[5:])
            elif o in ("kernel", "memcpy"):
                opts["use_copy_kernel"] = o == "kernel"
            else:
                raise SystemExit(f"unknown ferry.dali option {o!r} (nockpt, depthN, kernel, memcpy)")
        pipe = ferry.dali.pipeline(xd, outputs=("x",), **{"prefetch_queue_depth": 2, **opts})
        pipe.build()
        # the host seconds of each of the dataset's next() inside the source (DALI calls it from
        # pipe.run()): what pipe.run() costs beyond it is DALI's own
        src, inner = pipe.ferry_source, []
        seek = src._seek

        def timed_seek(epoch_idx, iteration):
            if os.environ.get("BXT_TRACE_AHEAD"):
                # which thread DALI calls the source on, and torch's current stream there (a
                # thread of DALI's own would queue the dataset's work on its default stream)
                import threading
                cur = torch.cuda.current_stream() if device != "cpu" else None
                log(f"  source seeks ({epoch_idx}, {iteration}) on the "
                    f"{'main' if threading.current_thread() is threading.main_thread() else threading.current_thread().name}"
                    f" thread, torch's current stream {getattr(cur, 'cuda_stream', None)}")
            seek(epoch_idx, iteration)
            batches = src._it

            def timed():
                while True:
                    t = time.perf_counter()
                    try:
                        b = next(batches)
                    except StopIteration:
                        return
                    finally:
                        inner.append(time.perf_counter() - t)
                    yield b
            src._it = timed()
        src._seek = timed_seek

        events = getattr(xd, "_trace_events", None)

        def it():
            try:
                while True:
                    t = time.perf_counter()
                    out = pipe.run()[0]
                    if events is not None and time.perf_counter() - t > 1e-3:
                        # BXT_TRACE_AHEAD: DALI's runs over a millisecond, on the pass's timeline
                        # beside the engine's reads (where a DALI epoch's time goes)
                        events.append((t, time.perf_counter(), f"pipe.run() of {1e3 * (time.perf_counter() - t):.1f} ms"))
                    yield out
            except StopIteration:
                return
    else:
        it = lambda: iter(xd)  # noqa: E731
    per = batch * len(names) * int(np.prod(xd.spatial)) * 4
    # a whole warm-up epoch (opens files, fills the allocator, starts DALI's queue), then the
    # timed one; DALI's reset() is inside the timed part (it starts prefetching the next epoch)
    if warmup:
        for b in it():
            pass
        if dali:
            inner.clear()       # the timed epochs' calls only: the first is the epoch's first batch
    step = per / (step_gbps * 1e9) if (step_gbps and device != "cpu") else None
    if step:
        gpu_sleep(step)
    sync(device)

    n_bytes = [0]
    copy_dst = [None]

    def one_epoch():
        # torch's allocator retries a failed cudaMalloc after freeing its cache (cudaFree, which
        # waits for the whole device: every step queued): counted per epoch, to tell such waits
        # from the engine's
        retries0 = _alloc_retries(device)
        n, busy, waits, marks = 0, 0.0, [], []
        t0 = time.perf_counter()
        if dali:
            pipe.reset()
        src = it()
        while True:
            t1 = time.perf_counter()
            b = next(src, None)
            if b is None:
                break
            if copy is not None:
                x = b["x"]
                if copy_dst[0] is None or copy_dst[0].shape != x.shape:
                    copy_dst[0] = torch.empty_like(x)
                if copy == "kernel":
                    torch.mul(x, 1, out=copy_dst[0])
                else:
                    copy_dst[0].copy_(x)
            if host_sync:
                torch.cuda.current_stream().synchronize()
            waits.append(time.perf_counter() - t1)
            n += 1
            if step:
                # the step's own time on the GPU, timed by events around it: _sleep counts SM clock
                # cycles calibrated once on an idle GPU, and the clock under the engine's load may
                # differ, so the planned length is not the time the GPU spent busy
                m = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                m[0].record()
                gpu_sleep(step)
                m[1].record()
                marks.append(m)
                if step_sync:
                    torch.cuda.current_stream().synchronize()
        sync(device)
        dt = time.perf_counter() - t0
        retries = _alloc_retries(device) - retries0
        if marks:
            busy = sum(a.elapsed_time(b) for a, b in marks) / 1e3
            log(f"  steps ran {busy:.3f} s on the GPU, planned {step * len(marks):.3f} s "
                f"({busy / (step * len(marks)):.3f} x), epoch {dt:.3f} s, torch allocator retries {retries}")
            # where the GPU idled: the gaps between one step's end and the next one's start, the
            # largest five with the batch they waited for (a gap every read group's first batch
            # is a read that came late; one at the start is the first read)
            try:
                gaps = [(marks[k - 1][1].elapsed_time(marks[k][0]), k) for k in range(1, len(marks))]
                top = sorted(gaps, reverse=True)[:5]
                log(f"  idle between steps {sum(g for g, _ in gaps):.1f} ms over {len(gaps)} gaps; largest: " +
                    ", ".join(f"{g:.1f} ms before batch {k}" for g, k in top) +
                    f" (read groups of {getattr(xd, 'batch_group', 1)})")
            except Exception as e:      # a diagnostic: never the row's failure
                log(f"  idle between steps: not measured ({e})")
        # idle over the epoch, and over the time after its first batch came (the first waits for
        # the whole first read: with large groups most of an epoch's idle is there)
        rest = dt - (waits[0] if waits else 0.0)
        idle = (max(0.0, 1 - busy / dt), max(0.0, 1 - busy / rest) if rest > 0 else None) if step else None
        if dali and len(waits) > 1:
            w, q = np.asarray(waits) * 1e3, np.asarray(inner or [0.0]) * 1e3
            log(f"  ferry.dali: epoch {dt * 1e3:.1f} ms, {n} batches; pipe.run() first "
                f"{w[0]:.2f} ms, then median {np.median(w[1:]):.3f} p90 {np.percentile(w[1:], 90):.3f}; "
                f"the source's next() first {q[0]:.2f} ms, median {np.median(q):.3f} ms over {len(q)} calls; "
                f"torch allocator retries {retries}; the epoch after its first batch "
                f"{rate((n - 1) * per, dt - w[0] / 1e3):.2f} GB/s")
            inner.clear()
        elif len(waits) > 1 and (reps > 1 or host_sync):
            w = np.asarray(waits) * 1e3
            log(f"  dataset: epoch {dt * 1e3:.1f} ms, {n} batches; next() first {w[0]:.2f} ms, then median "
                f"{np.median(w[1:]):.3f} p90 {np.percentile(w[1:], 90):.3f}; the epoch after its first batch "
                f"{rate((n - 1) * per, dt - w[0] / 1e3):.2f} GB/s")
        n_bytes[0] = n * per
        return rate(n * per, dt), idle, np.asarray(waits)

    # reps > 1: the best of that many timed epochs (one dataset, one pipeline): a single epoch
    # of the DALI row moved 0.82-0.96 x the dataset's between four runs of one command.
    # The best alone flatters a pipeline whose epochs alternate (with an odd number of read
    # groups an epoch, the next epoch's first read began late in every other one): the mean
    # over the epochs run back to back is what a training run gets
    t_all = time.perf_counter()
    runs = [one_epoch() for _ in range(reps)]
    t_all = time.perf_counter() - t_all
    if stats is not None:
        stats["epochs"] = [r[0] for r in runs]
        stats["mean"] = rate(reps * n_bytes[0], t_all)
    return max(runs, key=lambda r: r[0])


def _timed(batches, seconds, device):
    """GB/s over the batches of an iterator after its first one (workers started, files open),
    for at most `seconds` (the peers' rate is steady after that; a full epoch of 16 GB at 1 GB/s
    would cost the GPU machine minutes)."""
    it = iter(batches)
    first = next(it)
    if device != "cpu":
        first = first.cuda(non_blocking=True)
    sync(device)
    nb, t0 = 0, time.perf_counter()
    for x in it:
        if device != "cpu":
            x = x.cuda(non_blocking=True)
        nb += x.numel() * x.element_size()
        if time.perf_counter() - t0 > seconds:
            break
    sync(device)
    dt = time.perf_counter() - t0
    del it
    return rate(nb, dt)


class _IselDataset:
    """A map-style dataset: one sample = ds.isel(time=i) read by xarray's own engine."""

    def __init__(self, path, engine, names):
        self.path, self.engine, self.names = path, engine, names
        self.ds = None
        import xarray as xr
        with xr.open_dataset(path, engine=engine, **_open_kw(engine)) as d:
            self.n = d.sizes["time"]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        import xarray as xr
        if self.ds is None:
            self.ds = xr.open_dataset(self.path, engine=self.engine, **_open_kw(self.engine))
        s = self.ds.isel(time=int(i))
        return torch.from_numpy(np.stack([s[n].values for n in self.names]))


def loader_rate(path, engine, names, device, batch, workers, seconds):
    import torch
    dl = torch.utils.data.DataLoader(_IselDataset(path, engine, names), batch_size=batch, shuffle=True,
                                     num_workers=workers, pin_memory=device != "cpu")
    return _timed(dl, seconds, device)


class _XbatcherDataset:
    """xbatcher's own torch loader: a BatchGenerator of one-step windows over the variables and
    its MapDataset, made in each DataLoader worker (the file is opened there, lazily)."""

    def __init__(self, path, engine, names):
        self.path, self.engine, self.names = path, engine, names
        self.mds = None
        import xarray as xr
        with xr.open_dataset(path, engine=engine, **_open_kw(engine)) as d:
            self.n, self.ny, self.nx = d.sizes["time"], d.sizes["lat"], d.sizes["lon"]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.mds is None:
            import xarray as xr
            import xbatcher
            from xbatcher.loaders.torch import MapDataset
            ds = xr.open_dataset(self.path, engine=self.engine, **_open_kw(self.engine))[self.names]
            gen = xbatcher.BatchGenerator(ds, input_dims={"time": 1, "lat": self.ny, "lon": self.nx},
                                          preload_batch=False)
            self.mds = MapDataset(gen, transform=_vars_tensor)
        return self.mds[int(i)]


def _vars_tensor(batch):
    # xbatcher's default transform squeezes the variable dim, which only works for one variable
    import torch
    return torch.from_numpy(batch.to_dataarray("var").values)


def xbatcher_rate(path, engine, names, device, batch, workers, seconds):
    import torch
    dl = torch.utils.data.DataLoader(_XbatcherDataset(path, engine, names), batch_size=batch, shuffle=True,
                                     num_workers=workers, pin_memory=device != "cpu")
    return _timed(dl, seconds, device)


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


def physicsnemo_rate(path, names, device, batch, workers, seconds):
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
    import h5py
    with h5py.File(path, "r") as f:
        per = batch * sum(int(np.prod(f[k].shape[1:])) * 4 for k in names)
    p.run()                       # workers started
    n, t0 = 0, time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            p.run()
            n += 1
    except StopIteration:
        pass
    sync(device)
    dt = time.perf_counter() - t0
    del p
    return rate(n * per, dt)


FORMATS = {   # name: (file name, writer, xarray's own engine for the peers, uncompressed)
    "nc4z": ("e.nc", write_nc4z_fast, None, False),
    "zarrz": ("ez.zarr", lambda p, *a: write_zarr3_fast(p, *a, compress=True), "zarr", False),
    "zarr": ("e.zarr", lambda p, *a: write_zarr3_fast(p, *a, compress=False), "zarr", True),
    "nc3": ("e3.nc", write_nc3_fast, "scipy", True),
}


def dataset_file(d, fmt, names, nt, ny, nx, fresh):
    """The format's file for this shape in d, written unless a complete one is there."""
    fname, writer, _, _ = FORMATS[fmt]
    path = os.path.join(d, f"{len(names)}x{nt}x{ny}x{nx}-{fname}")      # main() checks the same name
    done = path + ".done"
    if os.path.exists(done) and not fresh:
        log(f"{fmt}: reusing {path}")
        with open(done) as fh:
            return path, fh.read().strip()
    for p in (done, path):
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)
    t0 = time.perf_counter()
    eng = writer(path, names, nt, ny, nx)
    with open(done, "w") as fh:
        fh.write(eng)
    log(f"{fmt}: wrote {nt} steps x {len(names)} vars in {time.perf_counter() - t0:.1f} s")
    return path, eng


def cuda_sched(how):
    """BXT_SCHED=spin|yield|blocking: set the primary context's scheduling (how a host thread waits
    for the GPU: cudaStreamSynchronize, cuEventSynchronize on events without their own flag) for
    the whole process — ferry's engine, torch and DALI alike. An experiment: whether threads
    spinning in such waits take the cores a CPU-bound engine reads with (the default, AUTO, spins
    when the process has fewer contexts than cores). Returns the flags now set."""
    import ctypes
    flags = {"auto": 0, "spin": 1, "yield": 2, "blocking": 4}[how]
    cu = ctypes.CDLL("libcuda.so.1")
    dev, got, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    for rc in (cu.cuInit(0), cu.cuDeviceGet(ctypes.byref(dev), 0),
               cu.cuDevicePrimaryCtxSetFlags_v2(dev, flags),
               cu.cuDevicePrimaryCtxGetState(dev, ctypes.byref(got), ctypes.byref(active))):
        if rc != 0:
            raise SystemExit(f"BXT_SCHED={how}: CUDA driver call failed ({rc})")
    return got.value, active.value


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--nvars", type=int, default=20)
    ap.add_argument("--ny", type=int, default=361)
    ap.add_argument("--nx", type=int, default=720)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--formats", default="nc4z,zarrz,zarr,nc3")
    ap.add_argument("--peers", default="isel,xbatcher,physicsnemo",
                    help="the baselines to run (comma list; '' for none)")
    ap.add_argument("--workers", default="8,16")
    ap.add_argument("--peer-seconds", type=float, default=6.0, help="timed seconds per baseline run")
    ap.add_argument("--step-gbps", type=float, default=10.0)
    ap.add_argument("--batches-per-read", type=int, default=None,
                    help="XarrayDataset's batches_per_read (default 1)")
    ap.add_argument("--group-sweep", default="",
                    help="also time one epoch with these batches_per_read values (comma list, e.g. 6)")
    ap.add_argument("--idle-env", default="",
                    help="more idle rows (queued and host-wait) under each ';'-separated NAME=VALUE[,...] "
                         "setting, e.g. FERRY_GPU_CHECK=one")
    ap.add_argument("--sweep", default="",
                    help="compressed formats: one epoch per item 'BPR:PREFETCH[:NAME=VALUE,...]' (';' between "
                         "items; BPR 'auto': the engine-sized groups), the environment set for that epoch only, "
                         "e.g. '16:32:FERRY_GPU_POOL=32G' or 'auto:4:FERRY_GPU_CHECK=one'")
    ap.add_argument("--meminfo", action="store_true", help="log host memory (available, page cache) after rows")
    ap.add_argument("--dir", default="/tmp/ferry-xtrain", help="where the files are kept and reused")
    ap.add_argument("--fresh", action="store_true", help="write the files again")
    ap.add_argument("--drop", action="store_true", help="delete each format's files after its rows")
    ap.add_argument("--epochs", type=int, default=2,
                    help="timed epochs of the dataset's first row and of the ferry.dali row (the best)")
    ap.add_argument("--sync-sweep", default="",
                    help="more epochs whose consumer waits for each batch, each 'PREFETCH:BPR[:dali[-OPT...]][:NAME=VALUE,...]' "
                         "(';' between; BPR auto: engine-sized groups; dali: through ferry.dali, with -nockpt "
                         "enable_checkpointing=False, -depthN prefetch_queue_depth=N, -kernel/-memcpy "
                         "use_copy_kernel=True/False; copy/kcopy: the host copies each batch (cudaMemcpyAsync / "
                         "a kernel) before it waits; else the host "
                         "synchronizes after each next(); NAME=VALUE: the environment for that row only), "
                         "e.g. '4:auto;4:auto:dali;4:auto:dali-nockpt;4:auto:dali:FERRY_GPU_SHARE=running'")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    started = time.perf_counter()
    if os.environ.get("BXT_SCHED"):
        log(f"BXT_SCHED={os.environ['BXT_SCHED']}: primary context flags, active: "
            f"{cuda_sched(os.environ['BXT_SCHED'])}")
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:          # the raw row opens every chunk file
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 20), hard))
    if a.smoke:
        a.gib, a.nvars, a.ny, a.nx, a.batch, a.workers, a.peer_seconds = 0.01, 3, 45, 90, 4, "2", 1.0
    names = [f"v{i:02d}" for i in range(a.nvars)]
    nt = max(a.batch * 4, int(a.gib * 2 ** 30 / (a.nvars * a.ny * a.nx * 4)))
    os.makedirs(a.dir, exist_ok=True)
    missing = [f for f in a.formats.split(",") if f in FORMATS and (a.fresh or not os.path.exists(
        os.path.join(a.dir, f"{a.nvars}x{nt}x{a.ny}x{a.nx}-{FORMATS[f][0]}.done")))]
    need = nt * a.nvars * a.ny * a.nx * 4 * len(missing)       # at most: uncompressed
    if shutil.disk_usage(a.dir).free < need + (4 << 30) and not a.drop:
        log(f"{a.dir}: {shutil.disk_usage(a.dir).free / 1e9:.0f} GB free, the formats may need "
            f"{need / 1e9:.0f} GB: each format's files are deleted after its rows (--drop)")
        a.drop = True
    peers = [p for p in a.peers.split(",") if p]
    workers = [int(x) for x in a.workers.split(",")]
    rows = []
    have_dali = have("nvidia.dali")
    cuda = a.device != "cpu"
    for fmt in a.formats.split(","):
        if fmt not in FORMATS:
            raise SystemExit(f"unknown format {fmt!r} (have {sorted(FORMATS)})")
        if fmt.startswith("zarr") and not have("zarr"):
            log(f"{fmt}: zarr is not installed, skipped")
            continue
        path, eng = dataset_file(a.dir, fmt, names, nt, a.ny, a.nx, a.fresh)
        peer = FORMATS[fmt][2] or ("netcdf4" if eng == "netcdf4" else "h5netcdf" if eng == "h5netcdf" else None)
        t0 = time.perf_counter()
        warm(path)
        log(f"{fmt}: page cache warmed in {time.perf_counter() - t0:.1f} s")
        lim = ferry_load_rate(path, names, a.device)
        xd = ferry_dataset(path, names, a.device, a.batch, a.prefetch, a.batches_per_read)
        if a.meminfo:
            memlog(f"{fmt} after .load()")
        alone = {}
        fr, _, _ = ferry_epoch(path, names, a.device, a.batch, a.prefetch, xd=xd, reps=a.epochs, stats=alone)
        if a.meminfo:
            memlog(f"{fmt} after XarrayDataset ({xd.batch_group} a read)")
        if FORMATS[fmt][3]:
            raw = raw_rate(path, a.device)
            rows.append((fmt, "ferry raw file->GPU (all bytes)", raw, None))
        rows.append((fmt, "ferry .load() (limit)", lim, None))
        rows.append((fmt, f"XarrayDataset, {xd.batch_group} batches a read (vs .load())", fr, fr / lim))
        if a.epochs > 1:
            rows.append((fmt, f"  the same, {a.epochs} epochs back to back (vs .load())", alone["mean"],
                         alone["mean"] / lim))
        for gr in [int(x) for x in a.group_sweep.split(",") if x]:
            gr_rate, _, _ = ferry_epoch(path, names, a.device, a.batch, a.prefetch, group=gr)
            rows.append((fmt, f"XarrayDataset, {gr} batches a read (vs .load())", gr_rate, gr_rate / lim))
        for gr, pf, env in sweep_items(a.sweep) if not FORMATS[fmt][3] else ():
            sw = {}
            with environ(env):
                sw_rate, _, _ = ferry_epoch(path, names, a.device, a.batch, pf, group=gr, reps=a.epochs, stats=sw)
            label = f"XarrayDataset, {gr or 'auto'} a read, prefetch {pf}" + "".join(f", {k}={v}" for k, v in env.items())
            if a.meminfo:
                memlog(f"{fmt} after {label}")
            rows.append((fmt, label + " (vs .load())", sw_rate, sw_rate / lim))
            if a.epochs > 1:
                rows.append((fmt, f"  the same, {a.epochs} epochs back to back (vs alone's)", sw["mean"],
                             sw["mean"] / alone["mean"]))
        if FORMATS[fmt][3]:
            rows.append((fmt, "XarrayDataset vs raw file->GPU", fr, fr / raw))
        if cuda:
            # the throughput row's dataset, warm: no warm-up epoch. Each epoch begins with the
            # groups the epoch before read ahead for it; the last row turns that off (its epoch's
            # first batch waits for its first read, as before FERRY_EPOCH_AHEAD)
            # FERRY_EPOCH_AHEAD=off last: the row after it would begin with no groups read ahead
            # (an --idle-env row that followed it waited 162 ms for its first batch)
            extra = [(ss, env) for env in env_items(a.idle_env) for ss in (False, True)]
            for ss, env in [(False, {}), (True, {})] + extra + [(False, {"FERRY_EPOCH_AHEAD": "off"})]:
                with environ(env):
                    _, idle, waits = ferry_epoch(path, names, a.device, a.batch, a.prefetch, step_gbps=a.step_gbps,
                                                 step_sync=ss, xd=xd, warmup=False)
                label = f"GPU idle behind a {a.step_gbps:g} GB/s step" + (", host waits" if ss else "") + \
                    "".join(f", {k}={v}" for k, v in env.items())
                rows.append((fmt, label, idle[0] if idle else None, None))
                if idle and idle[1] is not None:
                    rows.append((fmt, label + ", after the first batch", idle[1], None))
                if (ss or env) and len(waits) > 1:
                    # the epoch's first batch waits for its whole first read; the rest is the stream
                    ms, rest = waits[0] * 1e3, waits[1:] * 1e3
                    how = ", ".join(["host waits"] * ss + [f"{k}={v}" for k, v in env.items()])
                    rows.append((fmt, f"  next() host ms, {how}: first {ms:.2f}, then median "
                                      f"{np.median(rest):.3f} p90 {np.percentile(rest, 90):.3f} max {rest.max():.2f}",
                                 float(rest.mean()), None))
        if have_dali:
            # after the idle rows, which measure the dataset alone: a DALI pipeline and the
            # dataset it holds may outlive their row (DALI's threads and prefetch queue, the
            # groups read ahead for the next epoch with their device memory): an idle row that
            # followed it once idled 16.6 %, against 5.7-6.9 % without DALI before it
            ds_ = {}
            dr, _, _ = ferry_epoch(path, names, a.device, a.batch, a.prefetch, dali=True,
                                   group=a.batches_per_read, reps=a.epochs, stats=ds_)
            rows.append((fmt, "XarrayDataset via ferry.dali (ratio: vs alone)", dr, dr / fr))
            if a.epochs > 1:
                rows.append((fmt, f"  the same, {a.epochs} epochs back to back (vs alone's)", ds_["mean"],
                             ds_["mean"] / alone["mean"]))
        for item in [x for x in a.sync_sweep.split(";") if x] if cuda else ():
            # a consumer that waits for each batch (DALI's run(), a loop calling loss.item()),
            # under other read groupings and depths: prefetch:batches_per_read[:dali]
            pf, gr, *how = item.split(":")
            gr = None if gr in ("", "auto") else int(gr)
            via = how[0] if how and how[0].startswith("dali") else False
            copy = {"copy": "memcpy", "kcopy": "kernel"}.get(how[0]) if how else None
            env = env_settings(how[-1], f"--sync-sweep item {item!r}") if how and "=" in how[-1] else {}
            if via and not have_dali:
                log(f"{fmt}: --sync-sweep {item}: DALI does not import, skipped")
                continue
            st = {}
            with environ(env):
                sr, _, _ = ferry_epoch(path, names, a.device, a.batch, int(pf), dali=via, group=gr, reps=a.epochs,
                                       host_sync=not via, stats=st, copy=copy)
            waits = {None: "", "memcpy": " (copied by cudaMemcpyAsync)", "kernel": " (copied by a kernel)"}[copy]
            label = (f"{via.replace('dali', 'ferry.dali', 1) if via else 'XarrayDataset, host waits each batch' + waits}, "
                     f"prefetch {pf}, {gr or 'auto'} a read" + "".join(f", {k}={v}" for k, v in env.items()))
            rows.append((fmt, label + " (ratio: vs alone)", sr, sr / fr))
            if a.epochs > 1:
                rows.append((fmt, f"  the same, {a.epochs} epochs back to back (vs alone's)", st["mean"],
                             st["mean"] / alone["mean"]))
        del xd
        log(f"{fmt}: ferry rows done")
        if peer:
            for w in workers:
                if "isel" in peers:
                    lr = loader_rate(path, peer, names, a.device, a.batch, w, a.peer_seconds)
                    rows.append((fmt, f"isel+{peer} DataLoader({w} workers)", lr, fr / lr))
                if "xbatcher" in peers and have("xbatcher"):
                    xr_ = xbatcher_rate(path, peer, names, a.device, a.batch, w, a.peer_seconds)
                    rows.append((fmt, f"xbatcher+{peer} DataLoader({w} workers)", xr_, fr / xr_))
                log(f"{fmt}: peers with {w} workers done")
        if fmt == "nc4z" and "physicsnemo" in peers and have_dali:
            w = max(workers)
            pr = physicsnemo_rate(path, names, a.device, a.batch, w, a.peer_seconds)
            rows.append((fmt, f"PhysicsNeMo-style DALI (h5py, {w} workers)", pr, fr / pr))
        # this format's rows now too (a run cut short by a time limit keeps what it measured)
        for _, what, v, r in [x for x in rows if x[0] == fmt]:
            log(f"{fmt}: {what}: {v * 100:.1f}%" if "idle" in what else
                f"{fmt}: {what}: {v:.2f}" + ("" if r is None else f" ({r:.2f})"))
        log(f"{fmt}: done at {time.perf_counter() - started:.0f} s")
        if a.drop:
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
            os.remove(path + ".done")
    print(f"\n{a.nvars} vars x {nt} steps of {a.ny}x{a.nx} float32 ({a.gib:g} GiB), batch {a.batch}, "
          f"prefetch {a.prefetch}, device {a.device}; peers timed {a.peer_seconds:g} s after their first batch")
    print(f"{'format':7} {'reader':50} {'GB/s':>8} {'ratio':>7}")
    for fmt, what, v, r in rows:
        val = f"{v * 100:7.1f}%" if "idle" in what else f"{v:8.2f}"
        print(f"{fmt:7} {what:50} {val} {'' if r is None else f'{r:7.2f}'}")
    print(f"(whole run {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
