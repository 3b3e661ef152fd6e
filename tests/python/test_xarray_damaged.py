"""Damaged netCDF-4 through engine="ferry", judged by the reference readers.

A seeded sweep of bit-flipped and truncated copies of netCDF-4 files that
netCDF4 and h5netcdf write here (chunked deflate+shuffle, fletcher32,
contiguous; groups): where both reference engines refuse a file, ferry
refuses it with a FerryError naming the file; wherever ferry reads a file, its
values equal a reference engine's. h5py's own exceptions never reach the user.
libhdf5 can loop forever on some damaged files (netCDF4 and h5netcdf hang on
them too), so the files are read in a spawned worker process with a timeout."""
import multiprocessing as mp
import os
import random
import warnings

import numpy as np
import pytest
from optional import has

xr = pytest.importorskip("xarray")
pytest.importorskip("h5py")
import ferry  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::RuntimeWarning")


HAS_BOTH = has("netCDF4") and has("h5netcdf")
ENGINES = ("netcdf4", "h5netcdf", "ferry")


def base_ds():
    rng = np.random.default_rng(0)
    return xr.Dataset(
        {"a": (("t", "y", "x"), rng.standard_normal((6, 8, 5)).astype("f4"), {"units": "K"}),
         "b": (("t", "y"), rng.integers(0, 100, (6, 8)).astype("i2")),
         "c": (("x",), np.arange(5.0)),
         "d": (("t",), rng.random(6).astype(">f8"))},
        coords={"t": np.arange(6), "y": np.arange(8.0)}, attrs={"title": "damage"})


def write_bases(d):
    ds = base_ds()
    enc = {"a": {"zlib": True, "shuffle": True, "chunksizes": (2, 4, 5)},
           "b": {"fletcher32": True, "chunksizes": (3, 8)},
           "d": {"zlib": True, "chunksizes": (3,)}}
    p4 = os.path.join(d, "base_netcdf4.nc")
    ds.to_netcdf(p4, engine="netcdf4", encoding={**enc, "c": {"contiguous": True}})
    ph = os.path.join(d, "base_h5netcdf.nc")
    ds.to_netcdf(ph, engine="h5netcdf", encoding=enc)
    ds.isel(t=slice(0, 3)).to_netcdf(ph, engine="h5netcdf", mode="a", group="g",
                                     encoding={"a": {"zlib": True, "chunksizes": (1, 8, 5)}})
    return [p4, ph]


def damaged_copies(bases, d, n_per_base, seed):
    """(path, what) of bit-flipped (3 in 4) and truncated (1 in 4) copies."""
    rnd = random.Random(seed)
    out = []
    for bi, base in enumerate(bases):
        raw = open(base, "rb").read()
        for i in range(n_per_base):
            b = bytearray(raw)
            if i % 4 == 3:
                b = b[:rnd.randrange(len(b))]
                what = f"{os.path.basename(base)} truncated to {len(b)} bytes"
            else:
                pos, bit = rnd.randrange(len(b)), rnd.randrange(8)
                b[pos] ^= 1 << bit
                what = f"{os.path.basename(base)} bit {bit} of byte {pos} flipped"
            p = os.path.join(d, f"x{bi}_{i}.nc")
            with open(p, "wb") as f:
                f.write(b)
            out.append((p, what))
    return out


def _read(path, engine, group):
    """{name: values} or ("refused", exception type, message)."""
    kw = {"device": "cpu"} if engine == "ferry" else {}
    try:
        with xr.open_dataset(path, engine=engine, group=group, **kw) as g:
            g.load()
            return {k: np.asarray(v.values) for k, v in g.variables.items()}
    except Exception as e:  # noqa: BLE001
        return ("refused", f"{type(e).__module__}.{type(e).__name__}", str(e))


def _equal(x, y):
    return (isinstance(x, dict) and isinstance(y, dict) and x.keys() == y.keys()
            and all(x[k].dtype == y[k].dtype and x[k].shape == y[k].shape
                    and np.array_equal(x[k], y[k], equal_nan=x[k].dtype.kind in "fc") for k in x))


def judge(path, fe, n4, h5):
    """One verdict for a file from ferry's, netCDF4's and h5netcdf's results."""
    if isinstance(fe, dict):
        if not isinstance(n4, dict) and not isinstance(h5, dict):
            return f"WRONG: netCDF4 and h5netcdf refuse ({str(n4[2])[:80]}), ferry reads"
        if _equal(fe, n4) or _equal(fe, h5):
            return "ok read"
        return "WRONG: ferry's values differ from every reference engine that reads"
    _, kind, msg = fe
    if kind in ("hang", "crash"):
        return f"WRONG: ferry's read {kind}s" if isinstance(n4, dict) or isinstance(h5, dict) else "ok " + kind
    if kind != "ferry.FerryError":
        return f"WRONG: {kind} reaches the user: {msg[:120]}"
    if path not in msg:
        return f"WRONG: FerryError without the file name: {msg[:120]}"
    return "ok refused" if not (isinstance(n4, dict) and isinstance(h5, dict)) else "ok refused (strict)"


def _worker(conn, tasks):
    warnings.simplefilter("ignore")
    for path, group, engine in tasks:
        conn.send(_read(path, engine, group))
    conn.close()


def read_all(jobs, timeout=3.0):
    """{(job index, engine): result} for every (path, group) of jobs and every
    engine, ferry first (one process holds one libhdf5: a reference reader's
    failed open must not be what ferry sees). Read in a spawned worker; a read
    that hangs or crashes libhdf5 is recorded as such and the worker restarted
    past it."""
    tasks = [(i, p, g, e) for i, (p, g) in enumerate(jobs) for e in ("ferry", "h5netcdf", "netcdf4")]
    ctx = mp.get_context("spawn")
    results = {}
    done = 0
    retried = -1
    while done < len(tasks):
        rest = tasks[done:]
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker, args=(child, [t[1:] for t in rest]), daemon=True)
        proc.start()
        child.close()
        failure = None
        try:
            for k, (i, _, _, e) in enumerate(rest):
                if not parent.poll(timeout if k else 60.0):     # the first read waits for the imports
                    failure = "hang"
                    break
                results[(i, e)] = parent.recv()
                done += 1
        except EOFError:                       # the worker died: a crash in a C library
            failure = "crash"
        finally:
            if failure is not None:
                # once more in a fresh worker, first: libhdf5 may have been left
                # broken by an earlier damaged file of the same process
                if retried == done:
                    i, _, _, e = tasks[done]
                    results[(i, e)] = ("refused", failure, "")
                    done += 1
                else:
                    retried = done
            proc.kill()
            proc.join()
            parent.close()
    return results


def judge_all(jobs):
    r = read_all(jobs)
    return [judge(p, r[(i, "ferry")], r[(i, "netcdf4")], r[(i, "h5netcdf")]) for i, (p, _) in enumerate(jobs)]


@pytest.mark.skipif(not HAS_BOTH, reason="netCDF4 and h5netcdf are the references")
def test_undamaged_bases_read_identically(tmp_path):
    for p in write_bases(str(tmp_path)):
        for group in (None, "g") if "h5netcdf" in p else (None,):
            ref = xr.open_dataset(p, engine="netcdf4", group=group).load()
            got = xr.open_dataset(p, engine="ferry", group=group).load()
            xr.testing.assert_identical(got, ref)
            xr.testing.assert_identical(got, xr.open_dataset(p, engine="h5netcdf", group=group).load())


@pytest.mark.skipif(not HAS_BOTH, reason="netCDF4 and h5netcdf are the references")
def test_damaged_netcdf4_sweep(tmp_path):
    bases = write_bases(str(tmp_path))
    files = damaged_copies(bases, str(tmp_path), 90, seed=20261201)
    jobs = [(p, None) for p, _ in files] + [(p, "g") for p, w in files[90::5]]
    verdicts = judge_all(jobs)
    whats = [w for _, w in files] + [w + " (group g)" for _, w in files[90::5]]
    wrong = [f"{w}: {v}" for w, v in zip(whats, verdicts) if v.startswith("WRONG") or v == "crash"]
    assert not wrong, f"{len(wrong)} of {len(jobs)} damaged files:\n" + "\n".join(wrong[:30])
    counts = {v: verdicts.count(v) for v in set(verdicts)}
    assert counts.get("ok read", 0) > 20 and counts.get("ok refused", 0) > 20, counts
    assert counts.get("ok hang", 0) + counts.get("ok crash", 0) <= len(jobs) // 20, counts


def test_missing_group_is_a_ferry_error(tmp_path):
    p = tmp_path / "g.nc"
    base_ds().to_netcdf(p, engine="h5netcdf" if has("h5netcdf") else None)
    with pytest.raises(ferry.FerryError, match="""no group ["']nope["']""") as ei:
        xr.open_dataset(p, engine="ferry", group="nope")
    assert str(p) in str(ei.value)


def test_unopenable_object_is_an_error_not_dropped(tmp_path):
    """A member h5py cannot open (here: a soft link to nowhere, which h5py's
    Group.items() yields as None) is an error naming file and object."""
    h5py = pytest.importorskip("h5py")
    p = str(tmp_path / "dangling.nc")
    base_ds().to_netcdf(p, engine="h5netcdf" if has("h5netcdf") else None)
    with h5py.File(p, "a") as f:
        f["lost"] = h5py.SoftLink("/does/not/exist")
    with pytest.raises(ferry.FerryError, match="lost") as ei:
        xr.open_dataset(p, engine="ferry").load()
    assert p in str(ei.value)


def test_fletcher32_mismatch_refused(tmp_path):
    """A flipped byte inside a fletcher32-checked chunk: h5py refuses, so does ferry
    (the engine verifies the checksum the chunk carries)."""
    h5py = pytest.importorskip("h5py")
    p = str(tmp_path / "f32.nc")
    ds = xr.Dataset({"b": (("t", "y"), np.arange(48, dtype="i4").reshape(6, 8))})
    ds.to_netcdf(p, engine="h5netcdf" if has("h5netcdf") else None,
                 encoding={"b": {"fletcher32": True, "chunksizes": (3, 8)}})
    with h5py.File(p, "r") as f:
        info = f["b"].id.get_chunk_info(0)
    raw = bytearray(open(p, "rb").read())
    raw[info.byte_offset + 5] ^= 0x10
    open(p, "wb").write(bytes(raw))
    with h5py.File(p, "r") as f, pytest.raises(OSError):
        f["b"][...]
    with pytest.raises(ferry.FerryError, match="fletcher32|checksum") as ei:
        xr.open_dataset(p, engine="ferry")["b"].load()
    assert p in str(ei.value) or "b" in str(ei.value)


def test_chunk_index_refused_by_c_names_the_file(tmp_path):
    """A chunk B-tree key whose origin is off the grid: h5py lists it, ferry's C
    table check refuses it (it knows no file name); every Python path raises a
    FerryError naming the file and the variable (issue 36.3)."""
    import struct

    import h5py
    p = str(tmp_path / "bt.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("v", data=np.arange(64, dtype="<i4").reshape(8, 8), chunks=(4, 8))
    b = bytearray(open(p, "rb").read())
    i = b.find(b"TREE")
    while b[i + 4] != 1:        # the first chunk B-tree (node type 1), past the group's (type 0)
        i = b.find(b"TREE", i + 4)
    key0 = i + 4 + 1 + 1 + 2 + 8 + 8     # signature, type, level, entries, two siblings
    # a v1 chunk key: size u32, filter mask u32, then ndim + 1 u64 origins
    assert struct.unpack_from("<QQ", b, key0 + 8) == (0, 0)
    struct.pack_into("<Q", b, key0 + 16, 2 ** 31)
    with open(p, "wb") as f:
        f.write(b)
    reads = {"ferry.open": lambda: ferry.open(p)["v"].read(),
             "ferry.read": lambda: ferry.read(p, "v"),
             "xarray": lambda: xr.open_dataset(p, engine="ferry", device="cpu").load()}
    for what, read in reads.items():
        with pytest.raises(ferry.FerryError, match="not on the grid") as ei:
            read()
        # the C HDF5 parser (ferry.open, ferry.read) names the variable by its path, "/v"
        assert p in str(ei.value) and ("variable v" in str(ei.value) or ": /v:" in str(ei.value)), \
            (what, str(ei.value))
