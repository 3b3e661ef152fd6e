"""Every key and path a Zarr store names resolves inside the store (issue 16.1).

A secret file lies beside the store, where a ".." key (v3 consolidated
metadata, v2 .zmetadata), a bad group= or a symlink leading out would make
ferry read it. Each case goes through ferry.open, ferry.read and the `ferry
info` command: each must refuse with an error naming the store and the key,
and the secret's bytes must never come back. zarr-python refuses the same
keys ("The path '..' is invalid"). Symlinks that stay inside the store work."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ferry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.path.join(ROOT, "build", "ferry")
SECRET = b"SECRETSECRETSECR"   # 16 bytes, the array below is 16 uint8

V2_ARR = {"zarr_format": 2, "shape": [16], "chunks": [16], "dtype": "|u1", "fill_value": 0,
          "order": "C", "filters": None, "compressor": None}
V3_ARR = {"zarr_format": 3, "node_type": "array", "shape": [16], "data_type": "uint8",
          "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [16]}},
          "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
          "fill_value": 0, "codecs": [{"name": "bytes"}]}


def put(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w" if isinstance(obj, (dict, str)) else "wb") as f:
        f.write(json.dumps(obj) if isinstance(obj, dict) else obj)


def secrets_beside(tmp_path):
    """The bytes a traversal would read: the parent as a v2 and as a v3 array."""
    put(str(tmp_path / "0"), SECRET)
    put(str(tmp_path / "c" / "0"), SECRET)
    put(str(tmp_path / ".zarray"), V2_ARR)


def v3_consolidated(tmp_path, key):
    store = tmp_path / "s.zarr"
    put(str(store / "zarr.json"), {"zarr_format": 3, "node_type": "group", "consolidated_metadata": {
        "kind": "inline", "must_understand": False, "metadata": {key: V3_ARR}}})
    return str(store)


def v2_consolidated(tmp_path, key):
    store = tmp_path / "s.zarr"
    put(str(store / ".zgroup"), {"zarr_format": 2})
    put(str(store / ".zmetadata"), {"zarr_consolidated_format": 1, "metadata": {
        ".zgroup": {"zarr_format": 2}, key: V2_ARR}})
    return str(store)


def refused_everywhere(store, needle, name=None, group=None):
    """ferry.open (+ read of every variable), ferry.read and `ferry info` all fail naming needle."""
    try:
        f = ferry.open(store, group=group)
    except ferry.FerryError as e:
        assert needle in str(e) and store in str(e), str(e)
    else:
        for n in list(f):
            with pytest.raises(ferry.FerryError, match=needle):
                got = f[n].read()
                assert SECRET not in np.asarray(got).tobytes()
    with pytest.raises((ferry.FerryError, ValueError)) as ei:
        got = ferry.read(store, name)
        assert SECRET not in np.asarray(got).tobytes()
    if isinstance(ei.value, ferry.FerryError):
        assert needle in str(ei.value)
    if os.path.exists(CLI):
        args = [CLI, "info", store] + (["--group", group] if group else [])
        r = subprocess.run(args, capture_output=True)
        assert SECRET not in r.stdout
        if group is None:
            assert r.returncode != 0, r.stdout
            assert needle.encode() in r.stderr + r.stdout


@pytest.mark.parametrize("key", ["..", "/abs", ".", "a/../..", "a//b", "a/", "../x"])
def test_v3_consolidated_keys(tmp_path, key):
    secrets_beside(tmp_path)
    refused_everywhere(v3_consolidated(tmp_path, key), "is not a relative path inside the store")


@pytest.mark.parametrize("key", ["../.zarray", "/tmp/.zarray", "./.zarray", "a//.zarray", "a/../../.zarray"])
def test_v2_consolidated_keys(tmp_path, key):
    secrets_beside(tmp_path)
    refused_everywhere(v2_consolidated(tmp_path, key), "is not a relative path inside the store")


def test_zarr_python_refuses_dotdot_too(tmp_path):
    zarr = pytest.importorskip("zarr")
    secrets_beside(tmp_path)
    store = v3_consolidated(tmp_path, "..")
    with pytest.raises(Exception):
        g = zarr.open_consolidated(store)
        g[".."][:]


@pytest.mark.parametrize("group", ["..", "../s.zarr", "./a", "a/./b", "a/../.."])
def test_group_option(tmp_path, group):
    secrets_beside(tmp_path)
    store = v2_consolidated(tmp_path, "a/.zarray")
    with pytest.raises(ferry.FerryError, match="not a path inside the store"):
        ferry.open(store, group=group)


def test_member_directory_symlink_leading_out(tmp_path):
    out = tmp_path / "outside"
    put(str(out / ".zarray"), V2_ARR)
    put(str(out / "0"), SECRET)
    store = tmp_path / "s.zarr"
    put(str(store / ".zgroup"), {"zarr_format": 2})
    os.symlink(out, store / "a")
    refused_everywhere(str(store), "outside the store", name="a")


def test_metadata_file_symlink_leading_out(tmp_path):
    put(str(tmp_path / "elsewhere.json"), dict(V3_ARR, attributes={"secret": "S3CR"}))
    store = tmp_path / "s.zarr"
    put(str(store / "zarr.json"), {"zarr_format": 3, "node_type": "group"})
    os.makedirs(store / "a")
    os.symlink(tmp_path / "elsewhere.json", store / "a" / "zarr.json")
    refused_everywhere(str(store), "outside the store", name="a")


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("what", ["chunk", "chunk-dir"])
def test_chunk_symlink_leading_out(tmp_path, version, what):
    put(str(tmp_path / "secret"), SECRET)
    os.makedirs(tmp_path / "secretdir")
    put(str(tmp_path / "secretdir" / "0"), SECRET)
    store = tmp_path / "s.zarr"
    if version == 2:
        if what == "chunk-dir":
            put(str(store / ".zarray"), dict(V2_ARR, shape=[2, 16], chunks=[1, 16], dimension_separator="/"))
            os.symlink(tmp_path / "secretdir", store / "0")
        else:
            put(str(store / ".zarray"), V2_ARR)
            os.symlink(tmp_path / "secret", store / "0")
    else:
        put(str(store / "zarr.json"), V3_ARR)
        if what == "chunk-dir":
            os.symlink(tmp_path / "secretdir", store / "c")
        else:
            os.makedirs(store / "c")
            os.symlink(tmp_path / "secret", store / "c" / "0")
    f = ferry.open(str(store))   # the metadata is inside: the open is fine ...
    with pytest.raises(ferry.FerryError, match="outside the store"):   # ... the chunk is not
        f.read()
    with pytest.raises(ferry.FerryError, match="outside the store"):
        ferry.read(str(store))


def test_compressed_chunk_and_shard_symlinks_leading_out(tmp_path):
    zarr = pytest.importorskip("zarr")
    from zarr.codecs import ShardingCodec, ZstdCodec, BytesCodec
    a = np.arange(64, dtype="u1")
    for name, kw in [("z", dict(compressors=ZstdCodec())),
                     ("sh", dict(shards=(32,), compressors=None))]:
        store = str(tmp_path / f"{name}.zarr")
        arr = zarr.create_array(store, shape=(64,), chunks=(16,), dtype="u1", zarr_format=3, **kw)
        arr[:] = a
        ev = str(tmp_path / f"{name}-evil.zarr")
        arr2 = zarr.create_array(ev, shape=(64,), chunks=(16,), dtype="u1", zarr_format=3, **kw)
        arr2[:] = a[::-1]
        chunk = os.path.join(store, "c", "0")
        os.replace(chunk, chunk + ".orig")
        os.symlink(os.path.join(ev, "c", "0"), chunk)
        with pytest.raises(ferry.FerryError, match="outside the store"):
            ferry.read(store)


@pytest.mark.parametrize("compressed", [False, True])
def test_chunk_swapped_for_an_outward_link_after_planning(tmp_path, compressed):
    """Uncompressed chunks are planned without a stat; the engine opens every
    chunk file with O_NOFOLLOW and follows a link only when it resolves inside
    the store (FERRY_EXTENT_NOFOLLOW). A chunk replaced by a link leading out
    between plan and run fails at read time, naming the file; so does a read
    planned after the swap."""
    zarr = pytest.importorskip("zarr")
    from zarr.codecs import ZstdCodec
    kw = dict(compressors=ZstdCodec()) if compressed else dict(compressors=None)
    a = np.arange(64, dtype="u1")
    store = str(tmp_path / "s.zarr")
    zarr.create_array(store, shape=(64,), chunks=(16,), dtype="u1", zarr_format=3, **kw)[:] = a
    evil = str(tmp_path / "evil.zarr")
    zarr.create_array(evil, shape=(64,), chunks=(16,), dtype="u1", zarr_format=3, **kw)[:] = a[::-1]
    ctx = ferry.default_context()
    ds = ferry.Dataset(ctx, store)
    out = np.zeros(64, "u1")
    pl = ferry.Plan()
    pl.read(ds, ds.names()[0], out, None)
    chunk = os.path.join(store, "c", "0")
    os.replace(chunk, chunk + ".orig")
    os.symlink(os.path.join(evil, "c", "0"), chunk)
    with pytest.raises(ferry.FerryError, match="outside the store") as ei:
        ctx.run(pl)
    assert chunk in str(ei.value)
    assert not np.array_equal(out[:16], a[::-1][:16])
    with pytest.raises(ferry.FerryError, match="outside the store") as ei:
        ferry.read(store)
    assert chunk in str(ei.value)


def test_symlinks_inside_the_store_are_followed(tmp_path):
    store = tmp_path / "s.zarr"
    put(str(store / "zarr.json"), {"zarr_format": 3, "node_type": "group"})
    put(str(store / "real" / "zarr.json"), V3_ARR)
    put(str(store / "real" / "c" / "0"), bytes(range(16)))
    os.symlink("real", store / "alias")                 # a member directory
    put(str(store / "b" / "zarr.json"), V3_ARR)
    os.makedirs(store / "b" / "c")
    os.symlink("../../real/c/0", store / "b" / "c" / "0")   # a chunk
    f = ferry.open(str(store))
    for n in ("alias", "b", "real"):
        np.testing.assert_array_equal(f[n].read(), np.arange(16, dtype="u1"))


def test_non_utf8_member_name(tmp_path):
    store = tmp_path / "s.zarr"
    put(str(store / ".zgroup"), {"zarr_format": 2})
    put(str(store / "ok" / ".zarray"), V2_ARR)
    bad = os.path.join(os.fsencode(str(store)), b"caf\xe9")
    os.makedirs(bad)
    with open(os.path.join(bad, b".zarray"), "w") as fh:
        fh.write(json.dumps(V2_ARR))
    with pytest.raises(ferry.FerryError) as ei:
        ferry.open(str(store))
    msg = str(ei.value)
    assert str(store) in msg and "caf\\xe9" in msg and "not valid UTF-8" in msg


# Many chunks in one read: their lstats are taken at once, on several threads, before the
# chunks are planned (zarr.c prestat_fill, PRESTAT_MIN = 256); the checks on them are the
# ones a chunk at a time gets, so every case above holds for a store of 300 time steps too.
STEPS = 300


def _steps_store(tmp_path, name, compressed):
    zarr = pytest.importorskip("zarr")
    from zarr.codecs import ZstdCodec
    kw = dict(compressors=ZstdCodec()) if compressed else dict(compressors=None)
    a = np.arange(STEPS * 16, dtype="u1").reshape(STEPS, 16)
    store = str(tmp_path / f"{name}.zarr")          # c/<t>/0: every step its own directory
    zarr.create_array(store, shape=a.shape, chunks=(1, 16), dtype="u1", zarr_format=3, fill_value=7,
                      **kw)[:] = a
    return store, a


@pytest.mark.parametrize("compressed", [False, True])
def test_many_chunks_read_as_one_at_a_time(tmp_path, compressed):
    store, a = _steps_store(tmp_path, "s", compressed)
    np.testing.assert_array_equal(ferry.read(store), a)
    for t in (0, 150, STEPS - 1):                    # absent chunks: the fill value
        os.remove(os.path.join(store, "c", str(t), "0"))
    a[[0, 150, STEPS - 1]] = 7
    np.testing.assert_array_equal(ferry.read(store), a)
    shutil = pytest.importorskip("shutil")
    shutil.rmtree(os.path.join(store, "c", "200"))  # an absent directory: its chunk is a fill
    a[200] = 7
    np.testing.assert_array_equal(ferry.read(store), a)


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("what", ["chunk-dir", "chunk"])
def test_many_chunks_with_a_link_leading_out(tmp_path, compressed, what):
    store, a = _steps_store(tmp_path, "s", compressed)
    evil, _ = _steps_store(tmp_path, "evil", compressed)
    k = 177
    if what == "chunk-dir":
        d = os.path.join(store, "c", str(k))
        os.rename(d, d + ".orig")
        os.symlink(os.path.join(evil, "c", str(k)), d)
    else:
        if not compressed:
            pytest.skip("an uncompressed chunk's file is checked when it is opened (test above)")
        f = os.path.join(store, "c", str(k), "0")
        os.replace(f, f + ".orig")
        os.symlink(os.path.join(evil, "c", str(k), "0"), f)
    with pytest.raises(ferry.FerryError, match="outside the store") as ei:
        ferry.read(store)
    assert os.path.join("c", str(k)) in str(ei.value)


def test_many_chunks_with_links_inside_are_followed(tmp_path):
    store, a = _steps_store(tmp_path, "s", True)
    d = os.path.join(store, "c", "123")
    os.rename(d, os.path.join(store, "moved"))
    os.symlink("../moved", d)                       # a directory link that stays inside
    f = os.path.join(store, "c", "124", "0")
    os.replace(f, os.path.join(store, "c", "124", "real"))
    os.symlink("real", f)                           # a chunk link that stays inside
    np.testing.assert_array_equal(ferry.read(store), a)
