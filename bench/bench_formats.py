#!/usr/bin/env python3
"""Formats → GPU: what each format reader adds on top of the engine (issue 3).

Page cache warm (every file read once before timing), best of --reps:

  * uncompressed npy, safetensors (many tensors), netCDF classic (CDF-2,
    big-endian: byteswapped by a GPU kernel) and Zarr v3 (many chunk files)
    read whole through ferry into GPU memory, beside the engine's raw
    file → GPU rate for a plain file of the same size (target ≥ 0.9×);
  * Zarr with zstd (v3), lz4 (v2, numcodecs) and blosc-lz4 + shuffle (v3),
    chunks of --chunk-mib MiB: ferry (decompressed by the engine's workers,
    placed on the GPU) vs zarr-python's own read into numpy, then
    cupy.asarray (target ≥ 3×), in decompressed bytes per second;
  * metadata-only open of a 1,000-tensor safetensors file and a 100-variable
    netCDF classic file (target < 5 ms), beside safetensors.safe_open and
    scipy / netCDF4 opening the same files.

Every ferry result is compared with the writer's own reading.

    python3 bench/bench_formats.py                 # 2 GiB per format on GPU 0
    python3 bench/bench_formats.py --device cpu    # host memory (numpy)
    python3 bench/bench_formats.py --smoke         # tiny, quick
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from harness import Dev, best, files_of, have, log, warm  # noqa: E402


def field(n, seed):
    """n float32 values: a smooth field with small noise, kept to 1/1024 K (as
    packed or quantised model output is) — compresses about as well as real
    gridded data (zstd ~2-3x), so decompression is real work."""
    i = np.arange(n, dtype=np.float32)
    a = 250 + 20 * np.sin(i * (1e-4 + 1e-6 * seed)) + (np.arange(n, dtype=np.uint32) % 97).astype(np.float32) * 1e-3
    return (np.round(a * 1024) / 1024).astype(np.float32)


def du(path):
    return sum(os.path.getsize(p) for p in files_of(path))


def same(dev, got, ref):
    g = dev.host(got)
    return g.dtype == ref.dtype and g.shape == ref.shape and np.array_equal(g, ref, equal_nan=True)


# ---------------------------------------------------------------------------
# writers (the real libraries)
# ---------------------------------------------------------------------------
def write_raw(path, nbytes):
    np.arange(nbytes // 8, dtype=np.uint64).__imul__(np.uint64(0x9E3779B97F4A7C15)).tofile(path)


def write_npy(path, n):
    a = field(n, 1)
    np.save(path, a)
    return {None: a}


def write_safetensors(path, n, ntensors):
    from safetensors.numpy import save_file
    per = n // ntensors
    d = {f"layer.{i:04d}.weight": field(per, i) for i in range(ntensors)}
    save_file(d, path)
    return d


def write_nc3(path, n, nvars):
    from scipy.io import netcdf_file
    per = n // nvars
    d = {}
    with netcdf_file(path, "w", version=2) as f:
        f.createDimension("x", per)
        for i in range(nvars):
            v = f.createVariable(f"v{i:03d}", "f4", ("x",))
            d[f"v{i:03d}"] = field(per, i)
            v[:] = d[f"v{i:03d}"]
    return d


def zarr_write(path, n, chunk_elems, fmt, compressors, filters=None):
    import zarr
    kw = dict(compressors=compressors)
    if filters is not None:
        kw["filters"] = filters
    g = zarr.open_group(path, mode="w", zarr_format=fmt)
    a = g.create_array("x", shape=(n,), chunks=(chunk_elems,), dtype="f4", **kw)
    data = field(n, 7)
    a[...] = data
    return {"x": data}


# ---------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=2.0, help="data per format (GiB)")
    ap.add_argument("--chunk-mib", type=float, default=4.0, help="Zarr chunk size (MiB, uncompressed)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="0", help="GPU ordinal, or 'cpu'")
    ap.add_argument("--dir", default=None, help="where to write the files (default: a temp dir)")
    ap.add_argument("--only", default="raw,npy,safetensors,nc3,zarr,zstd,lz4,blosc,open")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one rep")
    a = ap.parse_args()
    if a.smoke:
        a.gib, a.chunk_mib, a.reps = 0.03, 1.0, 1
    import ferry
    dev = Dev(a.device)
    if not dev.cpu:
        try:
            if dev.cp.cuda.runtime.getDeviceCount() == 0:
                raise RuntimeError("no GPU")
        except Exception as e:  # noqa: BLE001
            print(f"skip: no cupy/GPU ({e}); use --device cpu")
            return 0
    only = set(s.strip() for s in a.only.split(","))
    n = int(a.gib * (1 << 30)) // 4 // 1024 * 1024          # float32 elements
    nbytes = n * 4
    chunk = int(a.chunk_mib * (1 << 20)) // 4
    root = a.dir or tempfile.mkdtemp(prefix="ferry-bench-fmt-")
    os.makedirs(root, exist_ok=True)
    rows, bad = [], []
    print(f"# ferry formats benchmark: {nbytes / 1e9:.2f} GB per format, device {a.device}, "
          f"best of {a.reps}, warm page cache, Zarr chunks {a.chunk_mib:g} MiB")

    def ferry_all(path, names):
        items = [(path, nm) for nm in names]
        out = ferry.read_many(items, device=dev.device)
        dev.sync()
        return out

    def check(label, outs, ref):
        ok = all(same(dev, o, r) for o, r in zip(outs, ref.values()))
        if not ok:
            bad.append(label)
        return ok

    try:
        raw_rate = None
        if "raw" in only or only & {"npy", "safetensors", "nc3", "zarr"}:
            p = os.path.join(root, "raw.bin")
            write_raw(p, nbytes)
            warm(p)
            t, _ = best(lambda: (ferry.read(p, device=dev.device), dev.sync())[0], a.reps)
            raw_rate = nbytes / t / 1e9
            rows.append(("raw file", "ferry.read (engine, bytes)", raw_rate, None, None, None))
            os.unlink(p)

        def uncompressed(label, path, ref, desc):
            warm(path)
            names = list(ref)
            t, out = best(lambda: ferry_all(path, names), a.reps)
            ok = check(label, out, ref)
            del out
            r = nbytes / t / 1e9
            rows.append((label, desc, r, r / raw_rate if raw_rate else None, "of raw", ok))

        if "npy" in only:
            p = os.path.join(root, "a.npy")
            ref = write_npy(p, n)
            uncompressed("npy", p, ref, "ferry.read")
            os.unlink(p)
        if "safetensors" in only and have("safetensors"):
            p = os.path.join(root, "a.safetensors")
            ref = write_safetensors(p, n, 256)
            uncompressed("safetensors", p, ref, "read_many, 256 tensors")
            os.unlink(p)
        if "nc3" in only and have("scipy"):
            p = os.path.join(root, "a.nc")
            ref = write_nc3(p, n, 16)
            uncompressed("netCDF-3", p, ref, "read_many, 16 vars, big-endian")
            os.unlink(p)
        if "zarr" in only and have("zarr"):
            p = os.path.join(root, "u.zarr")
            ref = zarr_write(p, n, chunk, 3, None)
            uncompressed("Zarr v3", p, ref, f"ferry.read, {n // chunk} chunk files")
            shutil.rmtree(p)

        # compressed Zarr: ferry vs zarr-python
        comp = []
        if have("zarr"):
            import zarr
            if "zstd" in only:
                comp.append(("Zarr v3 zstd", 3, lambda: [zarr.codecs.ZstdCodec(level=3)], None))
            if "lz4" in only and have("numcodecs"):
                import numcodecs
                comp.append(("Zarr v2 lz4", 2, lambda: [numcodecs.LZ4()], None))
            if "blosc" in only:
                comp.append(("Zarr v3 blosc lz4+shuffle", 3,
                             lambda: [zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")], None))
        for label, fmt, codecs, filters in comp:
            p = os.path.join(root, "c.zarr")
            t0 = time.perf_counter()
            ref = zarr_write(p, n, chunk, fmt, codecs(), filters)
            ratio = nbytes / du(p)
            log(f"{label}: wrote {du(p) / 1e9:.2f} GB (ratio {ratio:.2f}) in {time.perf_counter() - t0:.1f}s")
            warm(p)
            t_f, out = best(lambda: ferry_all(p, ["x"]), a.reps)
            ok = check(label, out, ref)
            del out

            def zp():
                arr = zarr.open_array(p, path="x", mode="r")
                h = arr[...]
                g = dev.to(h)
                dev.sync()
                return g
            t_z, out = best(zp, max(1, min(a.reps, 2)))
            okz = same(dev, out, ref["x"])
            del out
            rows.append((label, f"ferry.read (ratio {ratio:.1f})", nbytes / t_f / 1e9, None, None, ok))
            rows.append((label, "zarr-python [...] + asarray", nbytes / t_z / 1e9, t_z / t_f, "ferry ×", okz))
            shutil.rmtree(p)

        if "open" in only:
            def median_ms(fn, k=25):
                ts = []
                for _ in range(k):
                    t0 = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t0)
                return statistics.median(ts) * 1e3

            def ferry_open(path):
                with ferry.open(path) as f:
                    return len(f.keys())

            if have("safetensors"):
                from safetensors.numpy import save_file
                p = os.path.join(root, "many.safetensors")
                save_file({f"model.layers.{i // 10}.w{i % 10}": np.zeros((16, 16), np.float32) for i in range(1000)}, p)
                warm(p)
                assert ferry_open(p) == 1000
                rows.append(("open 1,000-tensor safetensors", "ferry.open (metadata)", median_ms(lambda: ferry_open(p)),
                             None, "ms", None))
                from safetensors import safe_open
                def st_open():
                    with safe_open(p, "np") as f:
                        return len(list(f.keys()))
                rows.append(("open 1,000-tensor safetensors", "safetensors.safe_open", median_ms(st_open), None, "ms",
                             None))
            if have("scipy"):
                from scipy.io import netcdf_file
                p = os.path.join(root, "many.nc")
                with netcdf_file(p, "w", version=2) as f:
                    f.createDimension("time", None)
                    f.createDimension("x", 64)
                    for i in range(100):
                        v = f.createVariable(f"var{i:03d}", "f4", ("time", "x"))
                        v.units = "K"
                        v.long_name = f"variable number {i}"
                        v[0:2] = np.zeros((2, 64), np.float32)
                warm(p)
                assert ferry_open(p) >= 100
                rows.append(("open 100-variable netCDF-3", "ferry.open (metadata)", median_ms(lambda: ferry_open(p)),
                             None, "ms", None))
                def sc_open():
                    with netcdf_file(p, "r", mmap=False) as f:
                        return len(f.variables)
                rows.append(("open 100-variable netCDF-3", "scipy netcdf_file", median_ms(sc_open), None, "ms", None))
                if have("netCDF4"):
                    import netCDF4
                    def nc_open():
                        with netCDF4.Dataset(p) as f:
                            return len(f.variables)
                    rows.append(("open 100-variable netCDF-3", "netCDF4.Dataset", median_ms(nc_open), None, "ms",
                                 None))
    finally:
        if not a.dir:
            shutil.rmtree(root, ignore_errors=True)

    print()
    print(f"| {'data':30} | {'method':34} | {'GB/s or ms':>10} | {'ratio':>14} | data |")
    print(f"|{'-' * 32}|{'-' * 36}|{'-' * 12}|{'-' * 16}|------|")
    for label, meth, val, ratio, what, ok in rows:
        if what == "ms":
            v, r = f"{val:7.2f} ms", ""
        else:
            v = f"{val:10.2f}"
            r = f"{ratio:5.2f} {what}" if ratio is not None else ""
        okc = "" if ok is None else ("ok" if ok else "DIFF")
        print(f"| {label:30} | {meth:34} | {v:>10} | {r:>14} | {okc:4} |")
    s = ferry.stats()
    print("\nferry paths: " + ", ".join(f"{p} {s[p]['bytes'] / 1e9:.2f} GB" for p in ("cufile", "staged", "host")
                                       if s[p]["bytes"]))
    if bad:
        print("VERIFY FAILED: " + ", ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
