"""One file per chunk (issue 14): a Zarr store's uncompressed chunk files are
read like plain extents — packed several to a task, straight into the
destination — while absent chunks (never written: MISSING_FILLS) still get
the fill value, replaced chunk files are read afresh and a chunk file cut
short is an error naming it. Stores by zarr-python, compared with zarr's read."""
import os

import numpy as np
import pytest

zarr = pytest.importorskip("zarr", reason="zarr-python is not installed")

import ferry  # noqa: E402
from ferry import _ferry as F  # noqa: E402


def make_store(tmp_path, nt=48, ny=12, nx=20, fill=-7.25, drop=(3, 17, 18, 40), seed=0):
    """float32 (nt, ny, nx), one chunk file per time step; the steps in drop
    are never written (zarr leaves their files absent: write_empty_chunks off)."""
    p = str(tmp_path / "s.zarr")
    g = zarr.open_group(p, mode="w", zarr_format=3)
    a = g.create_array("v", shape=(nt, ny, nx), chunks=(1, ny, nx), dtype="float32", compressors=None,
                       fill_value=fill)
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((nt, ny, nx)).astype(np.float32)
    for t in range(nt):
        if t not in drop:
            a[t] = data[t]
    return p, np.asarray(zarr.open_array(p + "/v", mode="r")[...])


def read_host(ctx, path, name="v"):
    ds = F.Dataset(ctx, path)
    v = ds.variable(name)
    dst = np.full(v["shape"], 1234.5, dtype=np.float32)
    plan = F.Plan()
    plan.read(ds, name, dst, None, True)
    ctx.run(plan)
    ds.close()
    return dst


def test_absent_chunks_fill_and_chunks_pack(tmp_path):
    p, want = make_store(tmp_path)
    assert not os.path.exists(p + "/v/c/3/0/0")   # the fill case is real
    assert (want[3] == np.float32(-7.25)).all()
    ctx = F.Context(threads=2)
    ctx.reset_stats()
    got = read_host(ctx, p)
    assert got.tobytes() == want.tobytes()
    # 48 chunk files of 960 bytes: a few packs, not a task (and a bounce
    # buffer, and a memcpy) per chunk file as before the fix (48 ops)
    ops = ctx.stats()["host"]["ops"]
    assert 1 <= ops <= 8, ops
    ctx.close()


def test_many_stores_variables_one_plan(tmp_path):
    """Several variables, with absent chunks at pack boundaries, in one plan."""
    g = zarr.open_group(str(tmp_path / "m.zarr"), mode="w", zarr_format=3)
    rng = np.random.default_rng(1)
    want = {}
    for i, fill in enumerate((0.0, -1.5, 3.0e38)):
        a = g.create_array(f"x{i}", shape=(70, 5, 7), chunks=(1, 5, 7), dtype="float32", compressors=None,
                           fill_value=fill)
        d = rng.standard_normal((70, 5, 7)).astype(np.float32)
        for t in range(70):
            if (t * (i + 3)) % 11:
                a[t] = d[t]
        want[f"x{i}"] = np.asarray(a[...])
    ctx = F.Context(threads=2)
    ds = F.Dataset(ctx, str(tmp_path / "m.zarr"))
    plan = F.Plan()
    out = {}
    for n in want:
        out[n] = np.full((70, 5, 7), 99.0, dtype=np.float32)
        plan.read(ds, n, out[n], None, True)
    ctx.run(plan)
    for n in want:
        assert out[n].tobytes() == want[n].tobytes(), n
    ds.close()
    ctx.close()


def test_selection_of_chunks_still_placed(tmp_path):
    """A box that is not a whole chunk keeps its placement (not flat)."""
    p, want = make_store(tmp_path)
    got = ferry.read(p, "v", selection=(slice(2, 30), slice(1, 9), slice(3, 17)))
    assert got.tobytes() == want[2:30, 1:9, 3:17].tobytes()


def test_replaced_and_truncated_chunk_files(tmp_path):
    p, want = make_store(tmp_path)
    ctx = F.Context(threads=2)
    assert read_host(ctx, p).tobytes() == want.tobytes()   # every chunk file now in the open-file cache
    # replace one chunk by rename (new inode) and rewrite another in place
    a = zarr.open_array(p + "/v", mode="r+")
    new = np.full((12, 20), 5.5, np.float32)
    a[5] = new
    with open(p + "/v/c/6/0/0", "r+b") as f:
        f.write(np.full(12 * 20, 6.5, np.float32).tobytes())
    os.utime(p + "/v/c/6/0/0", ns=(1, 1))   # the check must not depend on the clock's resolution
    got = read_host(ctx, p)
    assert (got[5] == 5.5).all() and (got[6] == 6.5).all()
    # a chunk file cut short: an error naming it, never stale or partial bytes
    with open(p + "/v/c/7/0/0", "r+b") as f:
        f.truncate(100)
    with pytest.raises(ferry.FerryError, match=r"c/7/0/0"):
        read_host(ctx, p)
    # a chunk file deleted after it was cached: now absent, so filled
    os.remove(p + "/v/c/7/0/0")
    got = read_host(ctx, p)
    assert (got[7] == np.float32(-7.25)).all()
    ctx.close()


def _v3_meta(store, nt, n=16):
    import json
    os.makedirs(store, exist_ok=True)
    with open(os.path.join(store, "zarr.json"), "w") as f:
        json.dump({"zarr_format": 3, "node_type": "array", "shape": [nt, n], "data_type": "uint8",
                   "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, n]}},
                   "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                   "fill_value": 0, "codecs": [{"name": "bytes"}]}, f)


def _put(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def test_chunk_directories_learnt_link_free_still_refuse_links_out(tmp_path):
    """Plans learn chunk directories with an lstat per new component below the
    last link-free one (zarr.c dir_linkfree); a directory that is a symlink
    among real ones is still resolved, and refused when it leads out."""
    secret = b"S" * 16
    _put(str(tmp_path / "out" / "0"), secret)
    store = str(tmp_path / "s.zarr")
    _v3_meta(store, 4)
    for t in (0, 1, 3):
        _put(os.path.join(store, "c", str(t), "0"), bytes([t + 1]) * 16)
    os.symlink(tmp_path / "out", os.path.join(store, "c", "2"))   # after two link-free ones
    with pytest.raises(ferry.FerryError, match="outside the store"):
        ferry.read(store)
    # a link that stays inside is followed, between link-free directories
    os.remove(os.path.join(store, "c", "2"))
    _put(os.path.join(store, "real2", "0"), bytes([3]) * 16)
    os.symlink(os.path.join(store, "real2"), os.path.join(store, "c", "2"))
    got = np.asarray(ferry.read(store))
    assert got.tobytes() == b"".join(bytes([t + 1]) * 16 for t in range(4))


def test_middle_link_out_and_back_in_is_refused(tmp_path):
    """c is a link out of the store to a directory whose 0 links back in and
    whose 1 is outside: chunk 0 is inside, chunk 1 must still be refused (a
    directory found inside through links teaches nothing about its siblings)."""
    secret = b"S" * 16
    store = str(tmp_path / "s.zarr")
    _v3_meta(store, 2)
    _put(os.path.join(store, "real0", "0"), b"\1" * 16)
    hop = tmp_path / "hop"
    os.makedirs(hop)
    os.symlink(os.path.join(store, "real0"), hop / "0")
    _put(str(hop / "1" / "0"), secret)
    os.symlink(hop, os.path.join(store, "c"))
    with pytest.raises(ferry.FerryError, match="outside the store"):
        got = ferry.read(store)
        assert secret not in np.asarray(got).tobytes()
    got = np.asarray(ferry.read(store, selection=(slice(0, 1), slice(None))))
    assert got.tobytes() == b"\1" * 16


def test_relative_and_symlinked_store_paths(tmp_path, monkeypatch):
    """The known-inside chain starts at the array's directory as the path
    spells it (relative, or through a link to the store): same answers."""
    secret = b"S" * 16
    _put(str(tmp_path / "out" / "0"), secret)
    store = str(tmp_path / "s.zarr")
    _v3_meta(store, 3)
    for t in range(3):
        _put(os.path.join(store, "c", str(t), "0"), bytes([t + 1]) * 16)
    os.symlink(store, str(tmp_path / "alias.zarr"))
    monkeypatch.chdir(tmp_path)
    want = b"".join(bytes([t + 1]) * 16 for t in range(3))
    for path in ("s.zarr", "alias.zarr", str(tmp_path / "alias.zarr")):
        assert np.asarray(ferry.read(path)).tobytes() == want, path
    os.rename(os.path.join(store, "c", "1"), str(tmp_path / "moved"))
    os.symlink(tmp_path / "out", os.path.join(store, "c", "1"))
    for path in ("s.zarr", "alias.zarr"):
        with pytest.raises(ferry.FerryError, match="outside the store"):
            ferry.read(path)
