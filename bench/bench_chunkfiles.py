#!/usr/bin/env python3
"""One file per chunk: what reading a Zarr store's chunk files costs against
the same bytes as one file (issues 12 and 14).

Writes N float32 variables (time x lat x lon, one chunk file per time step,
361x720 = ~1 MiB each by default) as a Zarr v3 store — by zarr-python when it
is importable (--codec none or zstd), else by hand (uncompressed v3: the
zarr.json files and c/<t>/0/0 chunk files, which is all v3 needs) — and the
same chunk bytes concatenated into one big file, then, page cache warm, times

  pread-one / pread-files   (host only) os.preadv by Python threads: the big
             file's extents / every chunk file — the page cache's own rate,
             into one small buffer per thread that stays in the CPU's cache
             (compare the two with each other, not with ferry's rows, which
             write a destination of the whole size)
  one-file   ferry Plan.read_file: the big file's equal extents, one per chunk
  paths      ferry Plan.extent(path=...): every chunk file whole, by path
  read       ferry.read(store, var) for every variable, ONE plan (the Zarr parser)
  load       xr.open_dataset(store, engine="ferry", device=D).load()
  read_many  ferry.read_many([(chunk file,), ...]): whole raw files

into host memory (--device cpu) or a GPU (--device 0), best of --reps, and
prints GB/s (of the files' bytes for the raw rows, of the decoded arrays for
read and load), each row's ratio to one-file and the engine's task counts per
path (packs: far fewer than chunks). Every row is checked: raw rows against
numpy's read of the chunk files, read and load against the written arrays.

    python3 bench/bench_chunkfiles.py --device 0                    # ~8 GiB, issue 14's shape
    python3 bench/bench_chunkfiles.py --device cpu --vars 5 --steps 400 --threads 2   # no GPU
    python3 bench/bench_chunkfiles.py --smoke
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from harness import Dev, best, have, log, warm  # noqa: E402


def var_data(i, nt, ny, nx):
    a = np.empty((nt, ny, nx), np.float32)
    base = np.linspace(0, 1, ny * nx, dtype=np.float32).reshape(ny, nx)
    for t in range(nt):
        a[t] = base * (t + 1) + 10 * i
    return a


def write_store(path, names, nt, ny, nx, codec):
    if have("zarr"):
        import zarr
        g = zarr.open_group(path, mode="w", zarr_format=3)
        comp = None
        if codec == "zstd":
            from zarr.codecs import ZstdCodec
            comp = [ZstdCodec(level=0)]
        for i, n in enumerate(names):
            a = g.create_array(n, shape=(nt, ny, nx), chunks=(1, ny, nx), dtype="float32",
                               compressors=comp, dimension_names=("time", "lat", "lon"), fill_value=0.0)
            a[...] = var_data(i, nt, ny, nx)
        return "zarr-python " + zarr.__version__
    if codec != "none":
        sys.exit("--codec zstd needs zarr-python")
    os.makedirs(path)
    with open(os.path.join(path, "zarr.json"), "w") as f:
        json.dump({"zarr_format": 3, "node_type": "group", "attributes": {}}, f)
    for i, n in enumerate(names):
        d = os.path.join(path, n)
        os.makedirs(d)
        meta = {"zarr_format": 3, "node_type": "array", "shape": [nt, ny, nx], "data_type": "float32",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, ny, nx]}},
                "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                "fill_value": 0.0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                "dimension_names": ["time", "lat", "lon"], "attributes": {}}
        with open(os.path.join(d, "zarr.json"), "w") as f:
            json.dump(meta, f)
        a = var_data(i, nt, ny, nx)
        for t in range(nt):
            os.makedirs(os.path.join(d, "c", str(t), "0"), exist_ok=True)
            a[t].astype("<f4").tofile(os.path.join(d, "c", str(t), "0", "0"))
    return "by hand"


def chunk_paths(store, names, nt):
    return [os.path.join(store, n, "c", str(t), "0", "0") for n in names for t in range(nt)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="0")
    ap.add_argument("--vars", type=int, default=20)
    ap.add_argument("--steps", type=int, default=413)
    ap.add_argument("--ny", type=int, default=361)
    ap.add_argument("--nx", type=int, default=720)
    ap.add_argument("--codec", choices=("none", "zstd"), default="none")
    ap.add_argument("--threads", type=int, default=0, help="engine threads (0: the context's)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    ap.add_argument("--rows", default="pread-one,pread-files,one-file,paths,read,load,read_many")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.vars, a.steps, a.ny, a.nx, a.reps = 2, 20, 36, 72, 1
    import ferry
    from ferry import _ferry
    dev = Dev(a.device)
    names = [f"v{i:02d}" for i in range(a.vars)]
    tmp = tempfile.mkdtemp(prefix="ferry-chunkfiles-", dir=a.dir)
    rows = a.rows.split(",")
    try:
        store = os.path.join(tmp, "store.zarr")
        how = write_store(store, names, a.steps, a.ny, a.nx, a.codec)
        paths = chunk_paths(store, names, a.steps)
        sizes = [os.path.getsize(p) for p in paths]
        big = os.path.join(tmp, "all.bin")
        with open(big, "wb") as out:
            for p in paths:
                with open(p, "rb") as f:
                    shutil.copyfileobj(f, out)
        warm(store)
        warm(big)
        nbytes = a.vars * a.steps * a.ny * a.nx * 4
        file_bytes = sum(sizes)
        log(f"{len(paths)} chunk files of {file_bytes / len(paths) / 1e6:.3f} MB ({a.codec}, {how}), "
            f"{file_bytes / 1e9:.2f} GB; decoded {nbytes / 1e9:.2f} GB; device {a.device}")
        ref = np.concatenate([np.fromfile(p, np.uint8) for p in paths])   # the files as stored
        want = {n: var_data(i, a.steps, a.ny, a.nx) for i, n in enumerate(names)}
        ctx = ferry.Context(threads=a.threads) if a.threads else ferry.default_context()
        offs = np.cumsum([0] + sizes[:-1]).tolist()
        devn = -1 if dev.cpu else dev.device
        results = []

        # one destination for the raw rows, allocated (and, on the host, faulted in) once:
        # what is timed is the reading, not first-touch page faults of a new buffer
        raw = _ferry.empty(file_bytes, "|u1", devn, ctx)
        if dev.cpu:
            np.asarray(raw)[:] = 0

        def raw_dst():
            return raw

        def one_file():
            dst = raw_dst()
            f = ferry.File(ctx, big)
            plan = ferry.Plan()
            for o, s in zip(offs, sizes):
                plan.read_file(f, o, s, dst, o)
            ctx.run(plan)
            f.close()
            return dst

        def by_paths():
            dst = raw_dst()
            plan = ferry.Plan()
            for p, o, s in zip(paths, offs, sizes):
                plan.extent(path=p, offset=0, length=s, dst=dst, dst_offset=o)
            ctx.run(plan)
            return dst

        def read_vars():
            return ferry.read_many([(store, n) for n in names], device=dev.device, ctx=ctx)

        def xr_load():
            import xarray as xr
            from ferry.xarray import FerryBackendEntrypoint   # the GPU machine runs from the checkout:
            # no installed entry point names engine="ferry" there
            ds = xr.open_dataset(store, engine=FerryBackendEntrypoint, device=dev.device, threads=a.threads)
            ds.load()
            return [ds[n].data for n in names]

        # the kernel's side alone: os.preadv of every chunk file (or of the big
        # file's equal extents) into one reused host buffer per thread, as many
        # threads as the engine (preadv releases the GIL). What the page cache
        # gives these files in their present state: a 1 MB chunk file
        # once read 96-111 us right after it was written and 100-215 us
        # after an eviction and re-read (the kernel's per-page work).
        nthreads = a.threads or ctx.config()["threads"]

        def preads(fds_offs):
            from concurrent.futures import ThreadPoolExecutor
            bufs = [bytearray(max(sizes)) for _ in range(nthreads)]
            parts = [fds_offs[i::nthreads] for i in range(nthreads)]

            def run(i):
                mv = memoryview(bufs[i])
                for fd, off, n in parts[i]:
                    os.preadv(fd, [mv[:n]], off)
            with ThreadPoolExecutor(nthreads) as ex:
                list(ex.map(run, range(nthreads)))
            return None

        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        chunk_fds, big_fd = [], -1
        if any(r.startswith("pread") for r in rows) and dev.cpu:
            if len(paths) + 64 > soft:
                log(f"pread rows skipped: {len(paths)} files to hold open, RLIMIT_NOFILE {soft}")
                rows = [r for r in rows if not r.startswith("pread")]
            else:
                chunk_fds = [os.open(p, os.O_RDONLY) for p in paths]
                big_fd = os.open(big, os.O_RDONLY)

        def rd_many():
            return ferry.read_many([(p,) for p in paths], device=dev.device, ctx=ctx)

        def check_raw(out):
            return ref is None or np.array_equal(dev.host(out), ref)

        def check_vars(out):
            return all(np.array_equal(dev.host(x), want[n]) for x, n in zip(out, names))

        def check_many(out):
            return ref is None or np.array_equal(np.concatenate([dev.host(x) for x in out]), ref)

        table = [("pread-one", lambda: preads([(big_fd, o, n) for o, n in zip(offs, sizes)]), lambda o: True,
                  file_bytes),
                 ("pread-files", lambda: preads([(fd, 0, n) for fd, n in zip(chunk_fds, sizes)]), lambda o: True,
                  file_bytes),
                 ("one-file", one_file, check_raw, file_bytes), ("paths", by_paths, check_raw, file_bytes),
                 ("read", read_vars, check_vars, nbytes), ("load", xr_load, check_vars, nbytes),
                 ("read_many", rd_many, check_many, file_bytes)]
        for name, fn, check, nb in table:
            if name not in rows or (name == "load" and not have("xarray")) or (name.startswith("pread") and not dev.cpu):
                continue
            ferry.reset_stats(ctx)
            secs, out = best(lambda: (fn(), dev.sync())[0], a.reps)
            ok = check(out)
            del out
            st = ferry.stats(ctx)
            ops = {k: st[k]["ops"] for k in ("host", "staged", "cufile") if st[k]["ops"]}
            results.append((name, nb / secs / 1e9, secs, ok, ops))
            log(f"{name:11s} {nb / secs / 1e9:7.2f} GB/s  {secs * 1e3:8.1f} ms  verified {ok}  engine ops {ops}")
        for fd in chunk_fds + ([big_fd] if big_fd >= 0 else []):
            os.close(fd)
        base = next((r[1] for r in results if r[0] == "one-file"), None)
        print(f"# bench_chunkfiles: {len(paths)} chunk files of {file_bytes / len(paths) / 1e6:.3f} MB, {a.codec} "
              f"({how}), device {a.device}, threads {nthreads}, RLIMIT_NOFILE {soft}/{hard}")
        for name, gbs, secs, ok, ops in results:
            rel = f"{gbs / base:.2f}x one-file" if base else ""
            print(f"row: {name:11s} | {gbs:7.2f} GB/s | {secs * 1e3:8.1f} ms | "
                  f"{secs / len(paths) * 1e6:7.1f} us/chunk | verified {'yes' if ok else 'NO'} | {rel} | "
                  f"engine ops (all reps) {ops}")
        if not all(r[3] for r in results):
            sys.exit("bench_chunkfiles: a row read wrong bytes")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
