#!/usr/bin/env python3
"""Compressed chunks → GPU: nvCOMP's own batched rate (the limit), ferry's CPU
decode, ferry's GPU decode (nvCOMP behind the engine) and AUTO, on the same
chunks in one run (issue 12).

Datasets (float32, ERA5-like: a smooth field plus noise in the low mantissa
bits), about --mib MiB decoded each, page cache warm:
  * Zarr v3 zstd, levels 0 and 3, 1 MiB and 4 MiB chunks
  * Zarr v2 blosc-lz4 + shuffle, 1 MiB chunks (needs numcodecs)
  * netCDF-4 zlib + shuffle (HDF5 chunks of one time step, written with
    netCDF4/h5netcdf through xarray, or h5py), read through
    xr.open_dataset(engine="ferry", device=0, decode=...).load()

Peers in the same run (each where importable, to the GPU through cupy):
zarr-python on the CPU + cupy.asarray, zarr.config.enable_gpu(), and with
kvikio's GDSStore; h5py and xarray engine="netcdf4" + cupy.asarray for the
netCDF-4 file; --steps random time steps through xr.open_dataset(engine=
"ferry", device=...) (cpu and auto), the peers on a tenth of them.

Zarr stores are written by zarr-python when it is importable, else by this
script (zarr.json + zstd frames from numcodecs or libzstd through ctypes), so
the rows run on a machine without zarr. The limit row calls libnvcomp's
nvcompBatched*DecompressAsync through ctypes on every chunk at once, the
compressed bytes already in device memory (only the decode is timed).
Every ferry result is compared with the source array. GB/s of decoded bytes
(10^9/s), best of --reps.

    python3 bench/bench_decode.py                 # about 1 GiB per dataset, device 0
    python3 bench/bench_decode.py --smoke         # tiny, one rep (also on the stand-in driver)
    python3 bench/bench_decode.py --trace         # zstd 1 MiB and netCDF-4 rows once, FERRY_DECODE_TRACE=1
    python3 bench/bench_decode.py --only zstd --mib 1024,4096   # the zstd rows for 1 GiB and 4 GiB jobs

--mib takes a comma list: the Zarr zstd rows (and --trace's) run once per job
size, each with nvCOMP's limit for that size (every chunk in one call); the
blosc and netCDF-4 rows use the first size (--nc-mib sets netCDF-4's). A
1 GiB job of 1 MiB zstd chunks decodes in ~20 ms at nvCOMP's rate, so its
fill (the first reads and copy up) and drain (the last chunk's ~11 ms) weigh;
a whole-variable load is GBs. (The per-feeder batches the cooperative calls
of 256 chunks replaced, FERRY_GPU_COOP=off, are gone; BENCHMARKS.md has their rows.)

--trace runs only the Zarr v3 zstd-0 1 MiB row per --mib size (ferry gpu and auto, then
ferry auto without its CPU tail (FERRY_GPU_TAIL=off), ferry gpu with 4 calls in flight
(FERRY_GPU_SLOTS=4, 8 by default): what the batching does) and the
netCDF-4 rows, two reps each (the second warm), with FERRY_DECODE_TRACE=1: every job that ran
GPU batches writes one "ferry decode trace:" line to stderr (per-stage
seconds summed over workers, batch shapes, batches in flight), each after a
"trace:" line naming the row.

--only first: the first GPU job of a fresh process (a subprocess per row: one
xr.open_dataset(..., device=0).load() in a script pays the context's buffers),
Zarr v3 zstd-0 1 MiB per --mib size, decode=gpu, with the calls' inputs in plain
memory through each feeder's pinned ring (FERRY_GPU_STAGE=ring),
pinned whole (FERRY_GPU_STAGE=calls, the default) and auto (the ring for a
context's first job, calls after): rows "ferry gpu, first job
of a process (ring)" / "(calls)" (open + plan + job) and "ferry gpu, warm
(ring)" / "(calls)", the same process's later jobs (best of --reps); "(ring
16M)": FERRY_GPU_RING=16M (two 16 MiB buffers per feeder). With
FERRY_DECODE_TRACE=1 each job's trace (its allocations and their seconds) is
logged after a line naming the row.
"""
import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import best, env_settings, have, log, warm  # noqa: E402

from ferry import _ferry as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------------
# data and writers
# ---------------------------------------------------------------------------
def field(rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    y = np.linspace(-1, 1, rows, dtype=np.float32)[:, None]
    x = np.linspace(0, 6.28, cols, dtype=np.float32)[None, :]
    a = (250 + 20 * y * y + 5 * np.sin(x + 3 * y)).astype(np.float32)
    a += rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.05)   # float32 draws: 4 GiB in seconds
    return a.astype("<f4", copy=False)


def zstd_compress(level):
    if have("numcodecs"):
        import numcodecs
        c = numcodecs.Zstd(level=level)
        return lambda b: bytes(c.encode(b))
    lib = ctypes.CDLL("libzstd.so.1")
    lib.ZSTD_compressBound.restype = ctypes.c_size_t
    lib.ZSTD_compress.restype = ctypes.c_size_t
    lib.ZSTD_compress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def enc(b):
        b = bytes(b)
        out = ctypes.create_string_buffer(lib.ZSTD_compressBound(len(b)))
        n = lib.ZSTD_compress(out, len(out), b, len(b), level)
        return out.raw[:n]
    return enc


def write_zarr_v3_zstd(path, a, chunks, level):
    if have("zarr"):
        import zarr
        from zarr.codecs import ZstdCodec
        z = zarr.create_array(path, shape=a.shape, chunks=chunks, dtype="<f4", zarr_format=3,
                              compressors=[ZstdCodec(level=level)])
        z[...] = a
        return "zarr-python"
    enc = zstd_compress(level)
    os.makedirs(path, exist_ok=True)
    meta = {"zarr_format": 3, "node_type": "array", "shape": list(a.shape), "data_type": "float32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0.0, "attributes": {},
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                       {"name": "zstd", "configuration": {"level": level, "checksum": False}}]}
    with open(os.path.join(path, "zarr.json"), "w") as f:
        json.dump(meta, f)
    for i in range(0, a.shape[0], chunks[0]):
        for j in range(0, a.shape[1], chunks[1]):
            blk = np.zeros(chunks, "<f4")
            part = a[i:i + chunks[0], j:j + chunks[1]]
            blk[:part.shape[0], :part.shape[1]] = part
            d = os.path.join(path, "c", str(i // chunks[0]))
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, str(j // chunks[1])), "wb") as f:
                f.write(enc(blk.tobytes()))
    return "this script (zarr.json + zstd frames)"


def write_zarr_v2_blosc(path, a, chunks):
    import numcodecs
    comp = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    if have("zarr"):
        import zarr
        z = zarr.create_array(path, shape=a.shape, chunks=chunks, dtype="<f4", zarr_format=2, compressors=comp)
        z[...] = a
        return "zarr-python"
    os.makedirs(path, exist_ok=True)
    meta = {"zarr_format": 2, "shape": list(a.shape), "chunks": list(chunks), "dtype": "<f4",
            "compressor": comp.get_config(), "fill_value": 0.0, "order": "C", "filters": None}
    with open(os.path.join(path, ".zarray"), "w") as f:
        json.dump(meta, f)
    for i in range(0, a.shape[0], chunks[0]):
        for j in range(0, a.shape[1], chunks[1]):
            blk = np.zeros(chunks, "<f4")
            part = a[i:i + chunks[0], j:j + chunks[1]]
            blk[:part.shape[0], :part.shape[1]] = part
            with open(os.path.join(path, f"{i // chunks[0]}.{j // chunks[1]}"), "wb") as f:
                f.write(bytes(comp.encode(blk.tobytes())))
    return "this script (numcodecs)"


# ---------------------------------------------------------------------------
# ferry
# ---------------------------------------------------------------------------
LOGGED = set()
PLAN_MS = {}   # path -> the fastest open + plan.read seen (ms): included in the rows, logged once


def ferry_read(ctx, path, dst, decode):
    t0 = time.perf_counter()
    ds = F.Dataset(ctx, path)
    plan = F.Plan()
    plan.read(ds, 0, dst, native=True)
    ms = (time.perf_counter() - t0) * 1e3
    PLAN_MS[path] = min(ms, PLAN_MS.get(path, ms))
    ctx.run(plan, decode=decode)
    ds.close()


def ferry_row(ctx, path, a, dev, decode, reps, warmup=0):
    """warmup: untimed jobs first (the cooperative calls' buffers belong to the
    context and the row's first job pays them)."""
    dst = F.empty(a.shape, "<f4", device=dev, ctx=ctx)
    for _ in range(warmup):
        ferry_read(ctx, path, dst, decode)
    ctx.reset_stats()
    t, _ = best(lambda: ferry_read(ctx, path, dst, decode), reps)
    if decode == "cpu" or path not in LOGGED:
        LOGGED.add(path)
        log(f"{os.path.basename(path)}: open + plan.read {PLAN_MS[path]:.1f} ms of the ferry rows' time "
            f"(the job runs after it)")
    st = ctx.stats()
    h = np.empty(a.shape, "<f4")
    ctx.memcpy(h, dst)
    ok = h.tobytes() == a.tobytes()
    gpu_share = st["gpu_decoded_bytes"] / max(1, st["decoded_bytes"])
    return a.nbytes / t / 1e9, ok, gpu_share, st["gpu_cpu_fallbacks"]


# ---------------------------------------------------------------------------
# the limit: libnvcomp's batched decoder on every chunk at once
# ---------------------------------------------------------------------------
class Opts(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("reserved", ctypes.c_char * 60)]


class Cuda:
    def __init__(self, dev):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.cu.cuInit(0)
        d = ctypes.c_int()
        self.cu.cuDeviceGet(ctypes.byref(d), dev)
        self.ctx = ctypes.c_void_p()
        self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), d)
        self.cu.cuCtxSetCurrent(self.ctx)
        self.cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.cu.cuMemcpyDtoHAsync_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        self.cu.cuStreamSynchronize.argtypes = [ctypes.c_void_p]

    def alloc(self, n):
        p = ctypes.c_uint64()
        if self.cu.cuMemAlloc_v2(ctypes.byref(p), max(1, n)):
            raise MemoryError(f"cuMemAlloc({n})")
        return p.value

    def h2d(self, d, b):
        self.cu.cuMemcpyHtoDAsync_v2(d, b, len(b), None)
        self.sync()

    def d2h(self, n, d):
        buf = ctypes.create_string_buffer(n)
        self.cu.cuMemcpyDtoHAsync_v2(buf, d, n, None)
        self.sync()
        return buf.raw

    def sync(self):
        self.cu.cuStreamSynchronize(None)



# the ferry rows of a dataset: the decode policies, and the tuning variables set for one row
STANDARD_ROWS = (("cpu", {}), ("gpu", {}), ("auto", {}))


def ferry_rows(ctx, path, a, args, name, rows, runs=STANDARD_ROWS, trace=False):
    """One row per (decode, env) of runs, each with env set for that row only."""
    for decode, env in runs:
        label = ", ".join(f"{k}={v}" for k, v in env.items())
        if trace:
            log(f"trace: {name}, decode={decode}" + (f", {label}" if label else ""))
        os.environ.update(env)
        try:
            gbs, ok, share, fb = ferry_row(ctx, path, a, args.device, decode, args.reps)
        finally:
            for k in env:
                os.environ.pop(k, None)
        what = f"ferry {decode}" + ((f" {label}" if trace else f", {label}") if label else "")
        rows.append((name, what + (f" ({fb} CPU fallbacks)" if fb else ""), gbs, ok, share))

def payloads(path, alg):
    """Every chunk file's nvCOMP input (zstd: the frame; deflate: the zlib
    stream without its 2-byte header and Adler-32) and decoded size."""
    out = []
    for root, _, fs in os.walk(path):
        for fn in fs:
            if fn.startswith(".") or fn.endswith(".json"):
                continue
            b = open(os.path.join(root, fn), "rb").read()
            out.append(b[2:-4] if alg == "Deflate" else b)
    return out


def nvcomp_limit(lib_path, cuda, chunks, chunk_bytes, alg, reps):
    lib = ctypes.CDLL(lib_path)
    n = len(chunks)
    align = 256
    offs, pos = [], 0
    for c in chunks:
        offs.append(pos)
        pos += (len(c) + align - 1) // align * align
    blob = bytearray(pos)
    for o, c in zip(offs, chunks):
        blob[o:o + len(c)] = c
    din, dout = cuda.alloc(pos), cuda.alloc(n * chunk_bytes)
    arrays = np.zeros((4, n), np.uint64)
    arrays[0] = [din + o for o in offs]
    arrays[1] = [len(c) for c in chunks]
    arrays[2] = [dout + i * chunk_bytes for i in range(n)]
    arrays[3] = chunk_bytes
    darr, dres = cuda.alloc(arrays.nbytes), cuda.alloc(n * 12)
    cuda.h2d(din, bytes(blob))
    cuda.h2d(darr, arrays.tobytes())
    temp = ctypes.c_size_t()
    # nvCOMP 6 renamed the query and gave it a stream (src/cuda/nvcomp.h)
    args = [ctypes.c_size_t, ctypes.c_size_t, Opts, ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t]
    try:
        f_temp = getattr(lib, f"nvcompBatched{alg}DecompressGetTempSize")
        f_temp.argtypes = args + [ctypes.c_void_p]
        rc = f_temp(n, chunk_bytes, Opts(), ctypes.byref(temp), n * chunk_bytes, None)
    except AttributeError:
        f_temp = getattr(lib, f"nvcompBatched{alg}DecompressGetTempSizeAsync")
        f_temp.argtypes = args
        rc = f_temp(n, chunk_bytes, Opts(), ctypes.byref(temp), n * chunk_bytes)
    if rc:
        raise RuntimeError(f"nvcompBatched{alg}DecompressGetTempSize: status {rc}")
    dtemp = cuda.alloc(temp.value) if temp.value else 0
    f = getattr(lib, f"nvcompBatched{alg}DecompressAsync")
    f.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t,
                  ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint64, Opts, ctypes.c_uint64, ctypes.c_void_p]
    stride = n * 8

    def run():
        rc = f(darr, darr + stride, darr + 3 * stride, dres + n * 4, n, dtemp, temp.value, darr + 2 * stride,
               Opts(), dres, None)
        cuda.sync()
        if rc:
            raise RuntimeError(f"nvcompBatched{alg}DecompressAsync: status {rc}")
    t, _ = best(run, reps)
    st = np.frombuffer(cuda.d2h(n * 4, dres), np.int32)
    bad = int((st != 0).sum())
    for p in (din, dout, darr, dres) + ((dtemp,) if dtemp else ()):
        cuda.cu.cuMemFree_v2(p)
    return n * chunk_bytes / t / 1e9, bad


# ---------------------------------------------------------------------------
# peers on the same Zarr stores: zarr-python on the CPU (then cupy.asarray),
# zarr.config.enable_gpu() (cupy buffers), and with kvikio's GDSStore
# ---------------------------------------------------------------------------
def pread_bound(path, decoded, reps, workdir, threads=16):
    """GB/s of decoded data at which `threads` threads pread every chunk file of
    the store at `path` whole into one buffer (bench/pread_align.c, compiled
    once into `workdir` with cc), page cache warm: the rate no reader of these
    files through host memory passes, whatever decodes them. None without a
    compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    exe = os.path.join(workdir, "pread_align")
    if not os.path.exists(exe):
        subprocess.run([cc, "-O2", "-pthread", os.path.join(HERE, "pread_align.c"), "-o", exe], check=True)
    tmp = tempfile.mkdtemp(prefix="ferry_pread_")
    try:
        lst = os.path.join(tmp, "files")
        files = [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs if os.sep + "c" + os.sep in os.path.join(r, f)]
        with open(lst, "w") as fh:
            fh.write("\n".join(files) + "\n")
        out = subprocess.run([exe, "-l", lst, str(threads), str(max(reps, 3)), "0"], check=True,
                             capture_output=True, text=True).stdout
        gbs = float(re.search(r"([0-9.]+) GB/s", out).group(1))
        comp = sum(os.path.getsize(f) for f in files)
        return gbs * decoded / comp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def zarr_peer_rows(path, a, dev, reps, name, rows):
    if not have("zarr"):
        log("zarr-python peers: zarr not importable: skipped")
        return
    if not have("cupy"):
        log("zarr-python peers: cupy not installed (the rows are to the GPU): skipped")
        return
    import cupy
    import zarr

    def cpu():
        return cupy.asarray(zarr.open_array(path, mode="r")[...])

    def gpu(store=None):
        with zarr.config.enable_gpu():
            z = zarr.open_array(store if store is not None else path, mode="r")
            return cupy.asarray(z[...])

    peers = [("zarr-python (CPU) + cupy.asarray", cpu), ("zarr-python enable_gpu()", gpu)]
    try:
        from kvikio.zarr import GDSStore
        peers.append(("zarr-python enable_gpu() + kvikio GDSStore", lambda: gpu(GDSStore(path))))
    except Exception as e:  # noqa: BLE001 - optional: kvikio is carried only sometimes
        log(f"kvikio GDSStore row: skipped ({type(e).__name__}: {e})")
    for label, fn in peers:
        try:
            def run():
                out = fn()
                cupy.cuda.Device(dev).synchronize()
                return out
            t, out = best(run, reps)
            ok = bool(np.array_equal(cupy.asnumpy(out).reshape(a.shape), a))
            del out
            rows.append((name, label, a.nbytes / t / 1e9, ok, 0.0))
        except Exception as e:  # noqa: BLE001 - a peer that cannot read the store is reported, not fatal
            log(f"{label}: failed: {type(e).__name__}: {e}")


# ---------------------------------------------------------------------------
# netCDF-4 through xarray (one process per decode policy: a clean context)
# ---------------------------------------------------------------------------
XR_CHILD = r"""
import sys, time, json
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import numpy as np, xarray as xr
from ferry.xarray import FerryBackendEntrypoint
import ferry
path, names, dev, decode, reps = sys.argv[3], sys.argv[4].split(","), int(sys.argv[5]), sys.argv[6], int(sys.argv[7])
best = 1e9
for _ in range(reps):
    t0 = time.perf_counter()
    ds = xr.open_dataset(path, engine=FerryBackendEntrypoint, device=dev, decode=None if decode == "auto" else decode)
    ds.load()
    vals = [ds[n].data for n in names]
    try:
        import cupy; cupy.cuda.Device(dev).synchronize()
    except Exception:
        pass
    best = min(best, time.perf_counter() - t0)
st = ferry.stats()
sums = []
for v in vals:
    h = v.get() if hasattr(v, "get") else np.asarray(v)
    sums.append(float(np.asarray(h, dtype=np.float64).sum()))
print(json.dumps({"t": best, "sums": sums, "gpu": st["gpu_decoded_bytes"], "dec": st["decoded_bytes"]}))
"""


XR_STEPS_CHILD = r"""
import sys, time, json
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import numpy as np
from harness import Dev
from bench_xarray import ferry_steps
path, names, dev, decode, steps = sys.argv[3], sys.argv[4].split(","), int(sys.argv[5]), sys.argv[6], json.loads(sys.argv[7])
d = Dev(dev)
ferry_steps(path, names, d, steps[:10], decode=None if decode == "auto" else decode)   # warm: workers, buffers
t0 = time.perf_counter()
last = ferry_steps(path, names, d, steps, decode=None if decode == "auto" else decode)
t = time.perf_counter() - t0
sums = [float(d.cp.asnumpy(last[n].data).astype(np.float64).sum()) for n in names]
print(json.dumps({"t": t, "sums": sums}))
"""


def netcdf_peer_rows(path, names, nt, ny, nx, dev, reps, name, want, rows_out, steps):
    """h5py / netCDF4 (xarray engine="netcdf4") + cupy.asarray on the same
    file: the whole load, and random time steps (fewer: they are slow)."""
    import cupy
    from bench_xarray import engine_load, engine_steps, h5py_load, h5py_steps, var_data
    from harness import Dev
    d = Dev(dev)
    total = len(names) * nt * ny * nx * 4

    def check(out):
        return all(abs(float(cupy.asnumpy(out[n]).astype(np.float64).sum()) - w) <= 1e-6 * abs(w)
                   for n, w in zip(names, want))
    loads = []
    if have("h5py"):
        loads.append(("h5py + cupy.asarray", lambda: h5py_load(path, names, d),
                      lambda st: h5py_steps(path, names, d, st)))
    if have("netCDF4"):
        loads.append(("xarray engine=netcdf4 + cupy.asarray", lambda: engine_load(path, names, d, "netcdf4"),
                      lambda st: engine_steps(path, names, d, st, "netcdf4")))
    few = steps[:max(1, len(steps) // 10)]
    step_bytes = len(names) * ny * nx * 4
    step_rows = []
    for label, load, stepper in loads:
        t, out = best(load, 1)   # ~0.1 GB/s (issue 12): one rep, or they take most of the run
        rows_out.append((name, label, total / t / 1e9, check(out), 0.0))
        del out
        t0 = time.perf_counter()
        last = stepper(few)
        t = time.perf_counter() - t0
        i = int(few[-1])
        ok = all(bool(cupy.asnumpy(last[n]).tobytes() == var_data(k, nt, ny, nx)[i].tobytes()) for k, n in enumerate(names))
        step_rows.append((name.split(", xarray")[0] + f", {len(few)} random time steps", label,
                          len(few) * step_bytes / t / 1e9, ok, 0.0))
    rows_out.extend(step_rows)


def h5_deflate_payloads(path, names):
    """Every HDF5 chunk of the variables as nvCOMP Deflate's input: the zlib
    stream without its 2-byte header and Adler-32 (the shuffle is not part
    of the limit: nvCOMP does not do it)."""
    import h5py
    out = []
    with h5py.File(path, "r") as f, open(path, "rb") as raw:
        for n in names:
            d = f[n]
            for i in range(d.id.get_num_chunks()):
                info = d.id.get_chunk_info(i)
                raw.seek(info.byte_offset)
                out.append(raw.read(info.size)[2:-4])
    return out


def parse_variants(spec):
    """--variants "DECODE[:NAME=VALUE[,NAME=VALUE]];..." -> [(decode, {NAME: VALUE})]"""
    out = []
    for part in (p.strip() for p in spec.split(";")):
        if not part:
            continue
        decode, _, env = part.partition(":")
        if decode not in ("cpu", "gpu", "auto"):
            raise SystemExit(f"--variants: {part!r}: the decoder is cpu, gpu or auto")
        out.append((decode, env_settings(env, f"--variants {part!r}")))
    return out


def netcdf_rows(tmp, mib, dev, reps, rows_out, trace=False, lib_path=None, cuda=None, nsteps=1000, peers=True,
                variants=None):
    if not have("xarray") or not (have("h5py") or have("netCDF4")):
        log("netCDF-4: needs xarray and h5py or netCDF4: skipped")
        return
    from bench_xarray import var_data, write_h5
    nt, ny, nx = max(2, int(mib * 2**20 / (4 * 721 * 1440) / 2)), 721, 1440
    names = ["t2m", "u10"]
    path = os.path.join(tmp, "era5_like.nc")
    how = write_h5(path, names, nt, ny, nx, True)
    warm(path)
    total = len(names) * nt * ny * nx * 4
    want = [float(var_data(i, nt, ny, nx).astype(np.float64).sum()) for i in range(len(names))]
    name = f"netCDF-4 zlib+shuffle ({how}), xarray .load()"
    if lib_path and have("h5py"):   # the limit: nvCOMP Deflate on every chunk at once (and fewer per call)
        chunks = h5_deflate_payloads(path, names)
        for k in ((8, 32, len(chunks)) if trace else (len(chunks),)):
            if k > len(chunks):
                continue
            gbs, bad = nvcomp_limit(lib_path, cuda, chunks[:k], ny * nx * 4, "Deflate", reps)
            rows_out.append((name, "nvCOMP Deflate (limit)" + ("" if k == len(chunks) else f", {k} per call"),
                             gbs, bad == 0, 1.0))
    if not have("cupy"):
        log("netCDF-4 through xarray: device reads return cupy arrays; cupy is not installed: skipped")
        return
    here = os.path.dirname(os.path.abspath(__file__))
    # the last row: AUTO with the CPU's tail of one GPU chunk latency (FERRY_GPU_TAIL=on, the
    # default before balance became deflate's: gpudecode.c's tail_mode), beside the default's
    if variants is None:
        variants = [("gpu", {}), ("auto", {})] if trace else \
            [("cpu", {}), ("gpu", {}), ("auto", {}), ("auto", {"FERRY_GPU_TAIL": "on"})]
    for decode, extra in variants:
        if trace:
            log(f"trace: netCDF-4 zlib+shuffle through xarray, decode={decode}")
        r = subprocess.run([sys.executable, "-c", XR_CHILD, os.path.join(here, "..", "python"), here, path,
                            ",".join(names), str(dev), decode, str(reps)], capture_output=True, text=True,
                           env={**os.environ, **extra})
        if (trace or "FERRY_DECODE_TRACE" in extra) and r.stderr.strip():
            log(r.stderr.rstrip())
        if r.returncode:
            log(f"netCDF-4 decode={decode}: failed: {r.stderr.strip().splitlines()[-1:]}")
            continue
        o = json.loads(r.stdout.strip().splitlines()[-1])
        ok = all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(o["sums"], want))
        label = f"ferry {decode}" + "".join(f", {k}={v}" for k, v in extra.items())
        rows_out.append((name, label, total / o["t"] / 1e9, ok, o["gpu"] / max(1, o["dec"])))
    if trace or nsteps <= 0:   # --steps 0: the .load() rows only
        return
    # random time steps through xarray (training-style access); the peers
    steps = [int(x) for x in np.random.default_rng(0).integers(0, nt, nsteps)]
    peer_rows = []
    if peers:
        netcdf_peer_rows(path, names, nt, ny, nx, dev, reps, name, want, peer_rows, steps)
    rows_out.extend(r for r in peer_rows if r[0] == name)
    step_bytes = len(names) * ny * nx * 4
    sname = name.split(", xarray")[0] + f", {len(steps)} random time steps, xarray"
    last_i = steps[-1]
    want_last = [float(var_data(k, nt, ny, nx)[last_i].astype(np.float64).sum()) for k in range(len(names))]
    for decode in ("cpu", "auto"):
        r = subprocess.run([sys.executable, "-c", XR_STEPS_CHILD, os.path.join(here, "..", "python"), here, path,
                            ",".join(names), str(dev), decode, json.dumps(steps)], capture_output=True, text=True)
        if r.returncode:
            log(f"netCDF-4 steps decode={decode}: failed: {r.stderr.strip().splitlines()[-1:]}")
            continue
        o = json.loads(r.stdout.strip().splitlines()[-1])
        ok = all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(o["sums"], want_last))
        rows_out.append((sname, f"ferry {decode}", len(steps) * step_bytes / o["t"] / 1e9, ok, 0.0))
    rows_out.extend(r for r in peer_rows if r[0] != name)


FIRST_CHILD = r"""
import sys, time, json
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import numpy as np
from bench_decode import F, field, ferry_read
path, dev, nrow, cols, reps = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
a = field(nrow, cols, seed=1)
ctx = F.Context()
dst = F.empty(a.shape, "<f4", device=dev, ctx=ctx)   # CUDA is up before the first job
t0 = time.perf_counter()
ferry_read(ctx, path, dst, "gpu")
first = time.perf_counter() - t0
h = np.empty(a.shape, "<f4")
ctx.memcpy(h, dst)
ok = bool(np.array_equal(h.view("<u4"), a.view("<u4")))   # bit for bit, without two 4 GiB copies
warm = 1e9
ctx.reset_stats()
for _ in range(reps):
    t0 = time.perf_counter()
    ferry_read(ctx, path, dst, "gpu")
    warm = min(warm, time.perf_counter() - t0)
ctx.memcpy(h, dst)
ok = ok and bool(np.array_equal(h.view("<u4"), a.view("<u4")))
st = ctx.stats()
print(json.dumps({"first": first, "warm": warm, "ok": ok, "bytes": a.nbytes,
                  "share": st["gpu_decoded_bytes"] / max(1, st["decoded_bytes"])}))
"""


def first_job_rows(tmp, args, rows):
    """--only first: per --mib size and FERRY_GPU_STAGE, one fresh process's
    first job and its warm jobs (FIRST_CHILD)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for mib in args.mibs:
        path, a, name = zstd_1m_store(tmp, "z3_zstd0_1m_first.zarr", mib)
        nrow, cols = a.shape
        del a
        # the ring's default (2 x 8 MiB per feeder), a larger one, and the calls pinned whole
        for stage, more in (("auto", {}), ("ring", {}), ("calls", {}), ("ring 16M", {"FERRY_GPU_RING": "16M"})):
            env = dict(os.environ, FERRY_GPU_STAGE=stage.split()[0], **more)
            r = subprocess.run([sys.executable, "-c", FIRST_CHILD, os.path.join(here, "..", "python"), here, path,
                                str(args.device), str(nrow), str(cols), str(args.reps)],
                               capture_output=True, text=True, env=env)
            log(f"first job of a process: {name}, FERRY_GPU_STAGE={stage}")
            if r.stderr.strip():
                log(r.stderr.rstrip())
            if r.returncode:
                log(f"first job FERRY_GPU_STAGE={stage}: failed: {r.stderr.strip().splitlines()[-1:]}")
                continue
            o = json.loads(r.stdout.strip().splitlines()[-1])
            rows.append((name, f"ferry gpu, first job of a process ({stage})",   # FERRY_GPU_STAGE
                         o["bytes"] / o["first"] / 1e9, o["ok"], o["share"]))
            rows.append((name, f"ferry gpu, warm ({stage})", o["bytes"] / o["warm"] / 1e9, o["ok"], o["share"]))
        shutil.rmtree(path)


def job_label(mib):
    return f"{mib / 1024:g} GiB job" if mib >= 1024 else f"{mib:g} MiB job"


def zstd_1m_store(tmp, fname, mib):
    """A Zarr v3 zstd-0 array of about `mib` decoded MiB in 1 MiB chunks (2,048 float32 columns),
    written into tmp/fname and read once (page cache warm): its path, the array, the row name."""
    cols = 2048
    crow = 2**20 // (4 * cols)
    nrow = max(crow, int(mib * 2**20 / (4 * cols)) // crow * crow)
    a = field(nrow, cols, seed=1)
    path = os.path.join(tmp, fname)
    how = write_zarr_v3_zstd(path, a, (crow, cols), 0)
    warm(path)
    return path, a, f"Zarr v3 zstd-0, 1 MiB chunks, {job_label(mib)} ({how})"


def trace_rows(tmp, args, lib_path, cuda, ctx, rows):
    """--trace: the Zarr v3 zstd-0 1 MiB row once per setting and job size,
    each job's trace line on stderr after a line naming the setting."""
    for mib in args.mibs:
        path, a, name = zstd_1m_store(tmp, "z3_zstd0_1m.zarr", mib)
        cols = a.shape[1]
        crow = 2**20 // (4 * cols)
        if lib_path:   # the limit, and what fewer chunks per call give (what ferry's calls are)
            chunks = payloads(path, "Zstd")
            for k in (32, 128, 256, 512, len(chunks)):
                if k > len(chunks):
                    continue
                gbs, bad = nvcomp_limit(lib_path, cuda, chunks[:k], crow * cols * 4, "Zstd", args.reps)
                rows.append((name, "nvCOMP batched (limit)" + ("" if k == len(chunks) else f", {k} per call"),
                             gbs, bad == 0, 1.0))
        ferry_rows(ctx, path, a, args, name, rows, trace=True,
                   runs=(("gpu", {}), ("auto", {}), ("auto", {"FERRY_GPU_TAIL": "off"}),
                         ("gpu", {"FERRY_GPU_SLOTS": "4"})))
        shutil.rmtree(path)


# ---------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", default="1024",
                    help="decoded MiB per dataset (default 1024); a comma list runs the zstd rows once per size")
    ap.add_argument("--nc-mib", type=float, default=None, help="decoded MiB of the netCDF-4 file (default: the first --mib)")
    ap.add_argument("--levels", default="0,3", help="zstd levels of the Zarr v3 rows (default 0,3)")
    ap.add_argument("--chunk-mib", default="1,4", help="chunk sizes of the Zarr v3 zstd rows in MiB (default 1,4)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--dir", default=None, help="where to write the data (default: a temporary directory)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one rep")
    ap.add_argument("--no-peers", action="store_true", help="only nvCOMP's limit and ferry's rows")
    ap.add_argument("--only", default="zstd,blosc,netcdf",
                    help="rows to run: zstd, blosc, netcdf, first (comma list; first: only when named)")
    ap.add_argument("--steps", type=int, default=1000,
                    help="random time steps through xr.open_dataset(engine='ferry', device=...) (peers: a tenth; 0: none)")
    ap.add_argument("--variants", default=None,
                    help="ferry's rows of each dataset (the Zarr jobs, the netCDF-4 .load()) instead of the default ones: "
                         "'DECODE[:NAME=VALUE[,NAME=VALUE]];...' (DECODE cpu, gpu or auto; the settings are "
                         "environment variables of that row's process)")
    ap.add_argument("--trace", action="store_true",
                    help="zstd 1 MiB and netCDF-4 rows once each with FERRY_DECODE_TRACE=1 (stage times on stderr)")
    args = ap.parse_args()
    args.mibs = [float(x) for x in str(args.mib).split(",") if x.strip()]
    if args.smoke:
        args.mibs, args.reps, args.steps = [16], 1, 20
    args.mib = args.mibs[0]
    nc_mib = args.nc_mib or args.mib
    nc_variants = parse_variants(args.variants) if args.variants else None
    zarr_runs = tuple(nc_variants) if nc_variants else STANDARD_ROWS
    if args.trace:
        args.reps = 2   # two jobs per setting: the first pays the workers' buffer allocations, the second is warm
        os.environ["FERRY_DECODE_TRACE"] = "1"   # read by the library at each job (and by the netCDF children)
    ctx = F.Context()
    if ctx.cuda_device_count() <= args.device:
        log("no CUDA device: " + (ctx.cuda_status or "?"))
        return 0
    log("nvCOMP: " + ctx.nvcomp_status)
    m = re.match(r"loaded nvCOMP (\S+) from (.*)$", ctx.nvcomp_status)
    lib_path = m.group(2) if m else None
    cuda = Cuda(args.device) if lib_path else None
    tmp = tempfile.mkdtemp(prefix="ferry_bench_decode_", dir=args.dir)
    class Rows(list):   # each row logged as it is measured: a run cut short by a timeout keeps what it measured
        def append(self, r):
            log(f"row: {r[0]} | {r[1]} | {r[2]:.2f} GB/s | GPU share {r[4]:.0%} | verified {'yes' if r[3] else 'NO'}")
            super().append(r)

        def extend(self, rs):
            for r in rs:
                self.append(r)
    rows = Rows()   # (dataset, reader, GB/s, verified, GPU share of decoded bytes)
    try:
        cols = 2048
        if "first" in args.only.split(","):
            first_job_rows(tmp, args, rows)
        if args.trace and "zstd" in args.only.split(","):
            trace_rows(tmp, args, lib_path, cuda, ctx, rows)
        only = set(args.only.split(","))
        if args.trace and "netcdf" in only:
            netcdf_rows(tmp, nc_mib, args.device, args.reps, rows, trace=True, lib_path=lib_path, cuda=cuda,
                        variants=nc_variants)
        levels = [int(x) for x in args.levels.split(",")]
        zstd_sizes = [(mib, int(c)) for mib in args.mibs for c in args.chunk_mib.split(",")]
        for mib, chunk_mib in () if args.trace or "zstd" not in only else zstd_sizes:
            crow = chunk_mib * 2**20 // (4 * cols)
            nrow = max(crow, int(mib * 2**20 / (4 * cols)) // crow * crow)
            a = field(nrow, cols, seed=chunk_mib)
            for level in levels:
                path = os.path.join(tmp, f"z3_zstd{level}_{chunk_mib}m.zarr")
                how = write_zarr_v3_zstd(path, a, (crow, cols), level)
                warm(path)
                comp = sum(os.path.getsize(p) for p in (os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs))
                name = (f"Zarr v3 zstd-{level}, {chunk_mib} MiB chunks, {job_label(a.nbytes / 2**20)} "
                        f"(ratio {a.nbytes / comp:.2f}, {how})")
                if lib_path:
                    gbs, bad = nvcomp_limit(lib_path, cuda, payloads(path, "Zstd"), crow * cols * 4, "Zstd", args.reps)
                    rows.append((name, "nvCOMP batched (limit)", gbs, bad == 0, 1.0))
                ferry_rows(ctx, path, a, args, name, rows, runs=zarr_runs)
                bound = pread_bound(path, a.nbytes, args.reps, tmp)
                if bound:
                    rows.append((name, "pread of its chunk files, 16 threads (read bound)", bound, True, 0.0))
                if not args.no_peers:
                    zarr_peer_rows(path, a, args.device, args.reps, name, rows)
                shutil.rmtree(path)
            del a
        if args.trace or "blosc" not in only:
            pass
        elif have("numcodecs"):
            crow = 2**20 // (4 * cols)
            nrow = max(crow, int(args.mib * 2**20 / (4 * cols)) // crow * crow)
            a = field(nrow, cols, seed=5)
            path = os.path.join(tmp, "z2_blosc_lz4.zarr")
            how = write_zarr_v2_blosc(path, a, (crow, cols))
            warm(path)
            name = f"Zarr v2 blosc-lz4+shuffle, 1 MiB chunks, {job_label(a.nbytes / 2**20)} ({how})"
            ferry_rows(ctx, path, a, args, name, rows, runs=zarr_runs)
            if not args.no_peers:
                zarr_peer_rows(path, a, args.device, args.reps, name, rows)
            shutil.rmtree(path)
        else:
            log("Zarr v2 blosc-lz4: needs numcodecs to write the store: skipped")
        if not args.trace and "netcdf" in only:
            netcdf_rows(tmp, nc_mib, args.device, args.reps, rows, lib_path=lib_path, cuda=cuda,
                        nsteps=args.steps, peers=not args.no_peers, variants=nc_variants)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{'dataset':<84} {'reader':<44} {'GB/s':>7} {'GPU share':>9}  verified")
    last, base, lim = None, None, None
    for ds, reader, gbs, ok, share in rows:
        if ds != last:
            print()
            last, base, lim = ds, None, None
        if reader.startswith("ferry cpu"):
            base = gbs
        if reader in ("nvCOMP batched (limit)", "nvCOMP Deflate (limit)"):
            lim = gbs
        ratio = f"  {gbs / base:5.2f}x cpu" if base and not reader.startswith("ferry cpu") else ""
        if lim and reader.startswith("ferry"):
            ratio += f"  {gbs / lim:4.2f}x limit"
        print(f"{ds:<84} {reader:<44} {gbs:7.2f} {share:9.0%}  {'yes' if ok else 'NO'}{ratio}")
    # the zstd rows' ceiling through host memory: the chunk files' pread bound and one
    # chunk's decode latency after the last read (~11 ms for 1 MiB zstd, FIELD_NOTES.md)
    for ds in dict.fromkeys(r[0] for r in rows if r[0].startswith("Zarr v3 zstd")):
        rs = {r[1]: r[2] for r in rows if r[0] == ds}
        b, lim = rs.get("pread of its chunk files, 16 threads (read bound)"), rs.get("nvCOMP batched (limit)")
        if b and lim:
            print(f"\n{ds}: 0.8 x limit = {0.8 * lim:.2f} GB/s; the chunk files' pread bound {b:.2f} GB/s of decoded data")
    # issue 12's netCDF-4 target: 0.8 x (the CPU's rate + nvCOMP Deflate's limit), both from this run
    nc = [r for r in rows if r[0].startswith("netCDF-4") and r[0].endswith(".load()")]
    cpu = next((r[2] for r in nc if r[1] == "ferry cpu"), None)
    lim = next((r[2] for r in nc if r[1] == "nvCOMP Deflate (limit)"), None)
    auto = next((r[2] for r in nc if r[1] == "ferry auto"), None)
    if cpu and lim and auto:
        print(f"\nnetCDF-4 target 0.8 x (ferry cpu {cpu:.2f} + nvCOMP Deflate {lim:.2f}) = {0.8 * (cpu + lim):.2f} GB/s; "
              f"ferry auto {auto:.2f} ({auto / (0.8 * (cpu + lim)):.2f} of it)")
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
