"""A file replaced by atomic rename while ferry reads it (issue 15.0).

A writer process keeps replacing `p` (write a temporary, os.replace) with one
of two files of the same layout and different contents; the reader opens `p`
with ferry.open and reads every variable, in a loop for a few seconds. Every
read must be exactly the old file or the new one (or a clear FerryError):
the data must come from the very file whose header was parsed, never a mix
of one file's header and the other's bytes."""
import multiprocessing as mp
import os
import time

import numpy as np
import pytest

import ferry
from pagecache import drop_from_page_cache

SECONDS = 2.5


def _contents(fmt, k):
    """Two files of one layout: every element of version k is k+1 (k in 0, 1)."""
    a = np.full((256, 1024), k + 1, dtype="<f4")   # 1 MiB: several engine tasks, O_DIRECT-sized
    b = np.full((4096,), 10 * (k + 1), dtype="<i8")
    return {"a": a, "b": b}


def _write(fmt, path, k):
    tmp = f"{path}.tmp{os.getpid()}"
    arrs = _contents(fmt, k)
    if fmt == "npy":
        with open(tmp, "wb") as fh:
            np.save(fh, arrs["a"])
    elif fmt == "safetensors":
        from safetensors.numpy import save_file
        save_file(arrs, tmp)
    else:
        from scipy.io import netcdf_file
        with netcdf_file(tmp, "w", version=2) as f:
            f.createDimension("y", 256)
            f.createDimension("x", 1024)
            f.createDimension("n", 4096)
            v = f.createVariable("a", "f4", ("y", "x"))
            v[:] = arrs["a"]
            w = f.createVariable("b", "i4", ("n",))
            w[:] = arrs["b"].astype("i4")
    # out of the page cache, as after a save with O_DIRECT or on a busy
    # machine: ferry then reads the large variable with O_DIRECT
    drop_from_page_cache(tmp)
    os.replace(tmp, path)


def _writer(fmt, path, stop):
    k = 0
    while not stop.is_set():
        k ^= 1
        _write(fmt, path, k)


def _expected(fmt):
    out = []
    for k in (0, 1):
        c = _contents(fmt, k)
        if fmt == "npy":
            out.append({"x": c["a"]})
        elif fmt == "netcdf":
            out.append({"a": c["a"], "b": c["b"].astype("i4")})
        else:
            out.append(c)
    return out


@pytest.mark.parametrize("fmt", ["npy", "safetensors", "netcdf"])
def test_reads_are_the_old_or_the_new_file(tmp_path, fmt):
    if fmt == "safetensors":
        pytest.importorskip("safetensors")
    if fmt == "netcdf":
        pytest.importorskip("scipy")
    path = str(tmp_path / {"npy": "x.npy", "safetensors": "m.safetensors", "netcdf": "d.nc"}[fmt])
    _write(fmt, path, 0)
    want = _expected(fmt)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    w = ctx.Process(target=_writer, args=(fmt, path, stop))
    w.start()
    reads = mixed = errors = 0
    seen = set()
    try:
        t_end = time.monotonic() + SECONDS
        while time.monotonic() < t_end:
            try:
                f = ferry.open(path)
                got = {n: np.asarray(f[n].read()) for n in f}
                f.close()
            except ferry.FerryError:
                errors += 1
                continue
            reads += 1
            match = [k for k in (0, 1) if set(got) == set(want[k])
                     and all(np.array_equal(got[n], want[k][n]) for n in got)]
            if match:
                seen.add(match[0])
            else:
                mixed += 1
    finally:
        stop.set()
        w.join(10)
    assert reads > 20, (reads, errors)
    assert mixed == 0, f"{mixed} of {reads} reads mixed two files"
    assert seen == {0, 1}, f"the writer never replaced the file under the reader ({seen})"
