"""Zarr v2 and v3 stores written here by zarr-python 3, read by ferry (C parser,
engine, codecs) into host memory, and compared bit for bit with zarr's own
read: whole arrays and seeded-random selections (with steps)."""
import json
import os
import sys
import warnings

import numpy as np
import pytest

from selections import nonempty_selections

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")
from zarr.codecs import (BloscCodec, BytesCodec, Crc32cCodec, GzipCodec,  # noqa: E402
                         ShardingCodec, TransposeCodec, ZstdCodec)

from ferry import _ferry as F  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)
warnings.filterwarnings("ignore", category=FutureWarning)
try:  # zarr warns about numcodecs codecs in v3 and consolidated metadata
    warnings.filterwarnings("ignore", category=zarr.errors.ZarrUserWarning)
except AttributeError:
    pass


def data(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    if dt.kind == "b":
        a = rng.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        a = rng.integers(max(info.min, -1000), min(info.max, 1000), n, endpoint=True).astype(dt)
    elif dt.kind == "f":
        a = (rng.standard_normal(n) * 100).round(1).astype(dt)
    elif dt.kind == "c":
        a = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    else:
        raise ValueError(dtype)
    return a.reshape(shape)


def ferry_read(ctx, path, name=None, selection=None, group=None, native=True):
    ds = F.Dataset(ctx, path, group=group)
    try:
        vars_ = ds.variables()
        idx = 0 if name is None else ds.find(name)
        v = vars_[idx]
        shape = v["shape"]
        if selection is not None:
            shape = tuple(len(range(a, b, c)) for a, b, c in selection)
        ts = v["typestr"]
        if native and ts[0] == ">":
            ts = "<" + ts[1:]
        out = np.full(shape, 0x5A, dtype=np.dtype(ts)) if np.dtype(ts).kind != "b" else np.zeros(shape, bool)
        if out.nbytes:
            plan = F.Plan()
            plan.read(ds, idx, out, selection=selection, native=native)
            ctx.run(plan)
        return out, v
    finally:
        ds.close()


def same(a, b, native=True):
    """Bit-for-bit equality; with native, both are first put in host order."""
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    if native:
        a = a.astype(a.dtype.newbyteorder("="), copy=False)
        b = b.astype(b.dtype.newbyteorder("="), copy=False)
    return a.shape == b.shape and a.dtype.itemsize == b.dtype.itemsize and a.tobytes() == b.tobytes()


def check_codecs(ctx, path, z, name=None, group=None):
    """The codec encoding engine="ferry" gives (ferry/xarray/zarr_codecs.py) is zarr-python's
    own: the objects engine="zarr" hands xarray, so to_zarr writes them back (issue 38 item 2)."""
    from ferry.xarray.zarr_codecs import ZarrCodecs
    ds = F.Dataset(ctx, path, group=group)
    try:
        v = ds.variables()[0 if name is None else ds.find(name)]
        enc = ZarrCodecs(path, group, ds.store_info).encoding(v["name"], [f"d{i}" for i in range(len(v["shape"]))])
        zf = ds.store_info["zarr_format"]
    finally:
        ds.close()
    want = {"compressors": z.compressors, "filters": z.filters, "shards": z.shards, "chunks": tuple(z.chunks)}
    if zf == 3:
        want["serializer"] = z.serializer
    for k, w in want.items():
        assert enc[k] == w, (path, k, enc[k], w)


def check_store(ctx, path, z, name=None, group=None, nsel=6, seed=1):
    want = z[...]
    got, v = ferry_read(ctx, path, name, group=group)
    assert same(got, want), (path, v)
    check_codecs(ctx, path, z, name, group)
    for sel in nonempty_selections(z.shape, nsel, seed):
        w = z[tuple(slice(a, b, c) for a, b, c in sel)]
        g, _ = ferry_read(ctx, path, name, selection=sel, group=group)
        assert same(g, w), (path, sel)
    return v


V2_COMPRESSORS = {
    "none": None,
    "zlib": numcodecs.Zlib(level=1),
    "gzip": numcodecs.GZip(level=1),
    "zstd": numcodecs.Zstd(level=1),
    "lz4": numcodecs.LZ4(),
    "blosc_lz4_shuffle": numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE),
    "blosc_zstd_bitshuffle": numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE),
    "blosc_lz4hc_noshuffle": numcodecs.Blosc(cname="lz4hc", clevel=5, shuffle=numcodecs.Blosc.NOSHUFFLE),
    "blosc_zlib_shuffle_blocks": numcodecs.Blosc(cname="zlib", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE, blocksize=256),
}


@pytest.mark.parametrize("comp", sorted(V2_COMPRESSORS))
@pytest.mark.parametrize("dtype", ["<f4", "<i2", "<f8", "|u1"])
def test_v2_compressors(ctx, tmp_path, comp, dtype):
    a = data((53, 41), dtype)
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=a.shape, chunks=(16, 11), dtype=a.dtype, zarr_format=2,
                          compressors=V2_COMPRESSORS[comp])
    z[...] = a
    v = check_store(ctx, p, z)
    assert v["shape"] == (53, 41) and v["chunks"] == (16, 11)


V3_COMPRESSORS = {
    "none": [],
    "gzip": [GzipCodec(level=1)],
    "zstd": [ZstdCodec(level=1)],
    "zstd_checksum": [ZstdCodec(level=1, checksum=True)],
    "blosc_lz4_shuffle": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
    "blosc_zstd_bitshuffle": [BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")],
    "blosc_lz4_noshuffle": [BloscCodec(cname="lz4", clevel=5, shuffle="noshuffle")],
    "crc32c": [Crc32cCodec()],
    "zstd_crc32c": [ZstdCodec(level=1), Crc32cCodec()],
    "crc32c_gzip": [Crc32cCodec(), GzipCodec(level=1)],
}


@pytest.mark.parametrize("comp", sorted(V3_COMPRESSORS))
@pytest.mark.parametrize("dtype", ["<f4", "<i8", "|i1"])
def test_v3_compressors(ctx, tmp_path, comp, dtype):
    a = data((37, 29, 5), dtype)
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=a.shape, chunks=(10, 8, 3), dtype=a.dtype, zarr_format=3,
                          compressors=V3_COMPRESSORS[comp])
    z[...] = a
    check_store(ctx, p, z)


@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                   "uint64", "float16", "float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("fmt", [2, 3])
def test_dtypes(ctx, tmp_path, dtype, fmt):
    a = data((23, 9), dtype)
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=a.shape, chunks=(7, 4), dtype=a.dtype, zarr_format=fmt)
    z[...] = a
    z2 = zarr.open_array(p)
    v = check_store(ctx, p, z2, nsel=3)
    assert np.dtype(v["typestr"]) == np.dtype(dtype).newbyteorder("<") or v["itemsize"] == 1


def test_v2_shuffle_filter(ctx, tmp_path):
    a = data((64, 30), "<f8")
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=a.shape, chunks=(20, 7), dtype=a.dtype, zarr_format=2,
                          filters=[numcodecs.Shuffle(elementsize=8)], compressors=numcodecs.Zlib(level=1))
    z[...] = a
    v = check_store(ctx, p, z)
    assert "shuffle" in v["codecs"] and "zlib" in v["codecs"]


def test_v2_fortran_order(ctx, tmp_path):
    a = data((31, 17, 6), "<i4")
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=a.shape, chunks=(8, 5, 4), dtype=a.dtype, zarr_format=2, order="F",
                          compressors=numcodecs.Zstd(level=1))
    z[...] = a
    v = check_store(ctx, p, z)
    assert v["fortran_order"]
    meta = json.load(open(os.path.join(p, ".zarray")))
    assert meta["order"] == "F"


def test_v2_fortran_uncompressed_stored_order(ctx, tmp_path):
    a = data((13, 9), "<f8")
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=a.shape, chunks=(5, 4), dtype=a.dtype, zarr_format=2, order="F", compressors=None)
    z[...] = a
    check_store(ctx, p, z)
    ds = F.Dataset(ctx, p)
    out = np.zeros(a.size, dtype=a.dtype)
    plan = F.Plan()
    plan.read(ds, 0, out, stored_order=True)
    ctx.run(plan)
    ds.close()
    assert same(out.reshape(a.shape, order="F"), a)


@pytest.mark.parametrize("order", [(1, 0, 2), (2, 0, 1), (2, 1, 0)])
def test_v3_transpose(ctx, tmp_path, order):
    a = data((19, 14, 6), "<f4")
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=a.shape, chunks=(7, 5, 4), dtype=a.dtype, zarr_format=3,
                          filters=[TransposeCodec(order=order)], compressors=[ZstdCodec(level=1)])
    z[...] = a
    check_store(ctx, p, z)


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("fill", [42.5, float("nan"), float("-inf"), None])
@pytest.mark.parametrize("compressed", [True, False])   # uncompressed: absent files found at run time
def test_missing_chunks_fill(ctx, tmp_path, fmt, fill, compressed):
    p = str(tmp_path / "a.zarr")
    kw = {} if fill is None else {"fill_value": fill}
    if not compressed:
        kw["compressors"] = None
    z = zarr.create_array(p, shape=(40, 33), chunks=(9, 10), dtype="<f4", zarr_format=fmt, **kw)
    z[3:12, 4:9] = 1.25
    z[30:40, 30:33] = data((10, 3), "<f4")
    got, v = ferry_read(ctx, p)
    assert same(got, z[...])
    for sel in nonempty_selections(z.shape, 8, 3):
        w = z[tuple(slice(a, b, c) for a, b, c in sel)]
        g, _ = ferry_read(ctx, p, selection=sel)
        assert same(g, w), sel
    if fill is not None and np.isnan(fill):
        assert json.loads(v["fill"]) == "NaN"


def test_missing_chunks_int_fill(ctx, tmp_path):
    for fmt in (2, 3):
        p = str(tmp_path / f"i{fmt}.zarr")
        z = zarr.create_array(p, shape=(50,), chunks=(7,), dtype="<i2", zarr_format=fmt, fill_value=-7,
                              compressors=None)
        z[10:20] = np.arange(10, dtype="<i2")
        check_store(ctx, p, z)


@pytest.mark.parametrize("fmt", [2, 3])
def test_truncated_uncompressed_chunk_names_the_file(ctx, tmp_path, fmt):
    p = str(tmp_path / "t.zarr")
    z = zarr.create_array(p, shape=(20, 8), chunks=(10, 8), dtype="<i4", zarr_format=fmt, compressors=None)
    z[:] = np.arange(160, dtype="<i4").reshape(20, 8)
    chunk = os.path.join(p, "1.0" if fmt == 2 else os.path.join("c", "1", "0"))
    with open(chunk, "r+b") as f:
        f.truncate(100)   # 320 bytes expected
    with pytest.raises(F.FerryError) as ei:
        ferry_read(ctx, p)
    assert chunk in str(ei.value)
    g, _ = ferry_read(ctx, p, selection=[(0, 10, 1), (0, 8, 1)])   # the intact chunk still reads
    assert same(g, z[:10])


def test_all_chunks_missing(ctx, tmp_path):
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=(12, 12), chunks=(5, 5), dtype="<f8", zarr_format=3, fill_value=3.5)
    check_store(ctx, p, z)


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("compressed", [True, False])
def test_big_endian(ctx, tmp_path, fmt, compressed):
    a = data((25, 12), ">f8" if fmt == 2 else "<f8")
    p = str(tmp_path / "a.zarr")
    if fmt == 2:
        z = zarr.create_array(p, shape=a.shape, chunks=(10, 5), dtype=">f8", zarr_format=2, fill_value=2.5,
                              compressors=numcodecs.Zlib(level=1) if compressed else None)
    else:
        z = zarr.create_array(p, shape=a.shape, chunks=(10, 5), dtype="<f8", zarr_format=3, fill_value=2.5,
                              serializer=BytesCodec(endian="big"),
                              compressors=[ZstdCodec(level=1)] if compressed else None)
    z[:20] = a[:20]   # rows 20.. of chunk row 2 are written; rows 20..24 partly: leave one chunk row missing
    z[20:, :5] = a[20:, :5]
    v = check_store(ctx, p, z)
    assert v["typestr"] == ">f8"
    want = z[...].astype(">f8")
    got, _ = ferry_read(ctx, p, native=False)
    assert got.dtype == np.dtype(">f8") and same(got, want, native=False)
    sel = [(3, 24, 4), (1, 12, 3)]
    g, _ = ferry_read(ctx, p, selection=sel, native=False)
    assert same(g, want[3:24:4, 1:12:3], native=False)


@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("inner", ["none", "zstd", "gzip_crc32c", "blosc"])
def test_sharded(ctx, tmp_path, location, inner):
    codecs = {"none": [BytesCodec()], "zstd": [BytesCodec(), ZstdCodec(level=1)],
              "gzip_crc32c": [BytesCodec(), GzipCodec(level=1), Crc32cCodec()],
              "blosc": [BytesCodec(), BloscCodec(cname="lz4", shuffle="bitshuffle")]}[inner]
    shape = (45, 38)
    a = data(shape, "<f4")
    p = str(tmp_path / "a.zarr")
    sharding = ShardingCodec(chunk_shape=(5, 6), codecs=codecs, index_location=location)
    z = zarr.create_array(p, shape=shape, chunks=(15, 18), dtype="<f4", zarr_format=3, serializer=sharding,
                          compressors=None, fill_value=-1.5)
    # leave holes: whole missing shards and empty inner chunks inside written shards
    z[0:15, 0:18] = a[0:15, 0:18]
    z[20:24, 20:30] = a[20:24, 20:30]
    z[40:45, 36:38] = a[40:45, 36:38]
    meta = json.load(open(os.path.join(p, "zarr.json")))
    assert meta["codecs"][0]["name"] == "sharding_indexed"
    assert meta["codecs"][0]["configuration"]["index_location"] == location
    check_store(ctx, p, z, nsel=10)


def test_sharded_via_shards_argument(ctx, tmp_path):
    a = data((64, 64), "<i4")
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=a.shape, chunks=(8, 8), shards=(32, 32), dtype=a.dtype, zarr_format=3)
    z[...] = a
    z[0:8, 0:8] = 0          # an all-fill inner chunk is left empty
    check_store(ctx, p, z, nsel=8)


def test_sharded_index_corruption_is_detected(ctx, tmp_path):
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=(16,), chunks=(4,), shards=(16,), dtype="<f4", zarr_format=3)
    z[...] = np.arange(16, dtype="<f4")
    shard = os.path.join(p, "c", "0")
    b = bytearray(open(shard, "rb").read())
    b[-8] ^= 0xFF   # inside the index, before its crc32c
    open(shard, "wb").write(bytes(b))
    with pytest.raises(F.FerryError) as ei:
        ferry_read(ctx, p)
    assert "crc32c" in str(ei.value)


def test_crc32c_corruption_is_detected(ctx, tmp_path):
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=(100,), chunks=(50,), dtype="<f8", zarr_format=3, compressors=[Crc32cCodec()])
    z[...] = np.arange(100.0)
    chunk = os.path.join(p, "c", "1")
    b = bytearray(open(chunk, "rb").read())
    b[3] ^= 1
    open(chunk, "wb").write(bytes(b))
    with pytest.raises(F.FerryError) as ei:
        ferry_read(ctx, p)
    assert "crc32c" in str(ei.value)
    g, _ = ferry_read(ctx, p, selection=[(0, 50, 1)])   # the intact chunk still reads
    assert same(g, np.arange(50.0))


def test_corrupt_compressed_chunk_is_an_error(ctx, tmp_path):
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=(1000,), chunks=(1000,), dtype="<f8", zarr_format=2,
                          compressors=numcodecs.Zstd(level=1))
    z[...] = np.arange(1000.0)
    chunk = os.path.join(p, "0")
    b = open(chunk, "rb").read()
    open(chunk, "wb").write(b[: len(b) // 2])
    with pytest.raises(F.FerryError):
        ferry_read(ctx, p)


@pytest.mark.parametrize("fmt", [2, 3])
def test_chunk_key_encodings(ctx, tmp_path, fmt):
    a = data((11, 13, 3), "<u2")
    encs = ([{"name": "v2", "separator": "."}, {"name": "v2", "separator": "/"}] if fmt == 2 else
            [{"name": "default", "separator": "/"}, {"name": "default", "separator": "."},
             {"name": "v2", "separator": "."}, {"name": "v2", "separator": "/"}])
    for i, enc in enumerate(encs):
        p = str(tmp_path / f"a{i}.zarr")
        z = zarr.create_array(p, shape=a.shape, chunks=(4, 5, 2), dtype=a.dtype, zarr_format=fmt,
                              chunk_key_encoding=enc)
        z[...] = a
        check_store(ctx, p, z, nsel=3)


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("consolidated", [False, True])
def test_groups_attrs_dims(ctx, tmp_path, fmt, consolidated):
    p = str(tmp_path / "g.zarr")
    root = zarr.open_group(p, mode="w", zarr_format=fmt)
    root.attrs["title"] = "test"
    root.attrs["nested"] = {"a": [1, 2.5, None]}
    t = data((20, 6), "<f4", 1)
    x = data((6,), "<i8", 2)
    kw = {"dimension_names": ["time", "x"]} if fmt == 3 else {}
    at = root.create_array("temp", shape=t.shape, chunks=(7, 6), dtype=t.dtype, **kw)
    at[...] = t
    if fmt == 2:
        at.attrs["_ARRAY_DIMENSIONS"] = ["time", "x"]
    at.attrs["units"] = "K"
    ax = root.create_array("x", shape=x.shape, chunks=(4,), dtype=x.dtype,
                           **({"dimension_names": ["x"]} if fmt == 3 else {}))
    ax[...] = x
    if fmt == 2:
        ax.attrs["_ARRAY_DIMENSIONS"] = ["x"]
    sub = root.create_group("sub")
    sub.attrs["level"] = 1
    s = data((5, 5), "<f8", 3)
    asub = sub.create_array("inner", shape=s.shape, chunks=(2, 2), dtype=s.dtype)
    asub[...] = s
    root.create_group("empty")
    if consolidated:
        zarr.consolidate_metadata(p)
    ds = F.Dataset(ctx, p)
    names = [v["name"] for v in ds.variables()]
    assert names == ["temp", "x"]
    attrs = json.loads(ds.attrs)
    assert attrs["title"] == "test" and attrs["nested"] == {"a": [1, 2.5, None]}
    assert json.loads(ds.groups) == ["empty", "sub"]
    dims = json.loads(ds.dims)
    assert dims["time"]["size"] == 20 and dims["x"]["size"] == 6
    v = ds.variables()[0]
    assert json.loads(v["dims"]) == ["time", "x"]
    assert json.loads(v["attrs"])["units"] == "K"
    ds.close()
    got, _ = ferry_read(ctx, p, "temp")
    assert same(got, t)
    got, _ = ferry_read(ctx, p, "x")
    assert same(got, x)
    got, _ = ferry_read(ctx, p, "inner", group="sub")
    assert same(got, s)
    ds = F.Dataset(ctx, p, group="sub")
    assert json.loads(ds.attrs) == {"level": 1}
    ds.close()
    # opening a path that is itself an array gives one variable
    got, v = ferry_read(ctx, os.path.join(p, "sub", "inner"))
    assert same(got, s) and v["name"] == "inner"
    got, v = ferry_read(ctx, p, group="temp")
    assert same(got, t)


def test_scalar_array(ctx, tmp_path):
    for fmt in (2, 3):
        p = str(tmp_path / f"s{fmt}.zarr")
        z = zarr.create_array(p, shape=(), dtype="<f8", zarr_format=fmt, fill_value=1.5)
        z[...] = 7.25
        got, v = ferry_read(ctx, p)
        assert v["shape"] == () and got.shape == () and got[()] == 7.25
        p2 = str(tmp_path / f"e{fmt}.zarr")
        zarr.create_array(p2, shape=(), dtype="<f8", zarr_format=fmt, fill_value=1.5)
        got, _ = ferry_read(ctx, p2)
        assert got[()] == 1.5


def test_unsupported_filter_is_refused_by_name(ctx, tmp_path):
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=(30,), chunks=(10,), dtype="<i4", zarr_format=2,
                          filters=[numcodecs.Delta(dtype="<i4")], compressors=numcodecs.Zlib())
    z[...] = np.arange(30, dtype="<i4")
    # it opens, described; reading it fails by name
    ds = F.Dataset(ctx, p)
    v = ds.variables()[0]
    ds.close()
    assert v["typestr"] == "<i4" and v["shape"] == (30,) and "delta" in v["error"]
    with pytest.raises(F.FerryError) as ei:
        ferry_read(ctx, p)
    assert "delta" in str(ei.value)
    # in a group, the other arrays stay readable and reading this one fails by name
    g = str(tmp_path / "g.zarr")
    root = zarr.open_group(g, mode="w", zarr_format=2)
    bad = root.create_array("bad", shape=(30,), chunks=(10,), dtype="<i4",
                            filters=[numcodecs.Delta(dtype="<i4")], compressors=None)
    bad[...] = np.arange(30, dtype="<i4")
    good = root.create_array("good", shape=(5,), chunks=(5,), dtype="<i4")
    good[...] = np.arange(5, dtype="<i4")
    got, _ = ferry_read(ctx, g, "good")
    assert same(got, np.arange(5, dtype="<i4"))
    with pytest.raises(F.FerryError) as ei:
        ferry_read(ctx, g, "bad")
    assert "delta" in str(ei.value)


BLOSC_DTYPES = ["|u1", "<i2", "<f4", "<f8", "<c16", "|S3"]   # typesizes 1, 2, 4, 8, 16 and an odd 3


def _blosc_data(dtype, n, seed):
    """Half smooth (compresses), half noise (stored raw inside blosc), as bytes of dtype."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    smooth = (np.arange(n * dt.itemsize // 2) // 7 % 251).astype("u1")
    noise = rng.integers(0, 256, n * dt.itemsize - smooth.size, dtype="u1")
    return np.concatenate([smooth, noise]).view(dt)


@pytest.mark.parametrize("cname", ["blosclz", "lz4", "lz4hc", "zlib", "zstd"])
def test_blosc_every_inner_codec_numcodecs_writes(ctx, tmp_path, cname):
    """Issue 15.18: every cname numcodecs' Blosc offers, with each shuffle, several
    typesizes, block sizes that split and leave a short last block, clevel 0
    (memcpyed frames) and incompressible chunks, against zarr-python's read."""
    assert cname in numcodecs.blosc.list_compressors()
    k = 0
    for dtype in BLOSC_DTYPES:
        for shuffle in (numcodecs.Blosc.NOSHUFFLE, numcodecs.Blosc.SHUFFLE, numcodecs.Blosc.BITSHUFFLE):
            for clevel, blocksize in ((5, 0), (9, 256), (1, 1000), (0, 0)):
                k += 1
                p = str(tmp_path / f"{k}.zarr")
                comp = numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=shuffle, blocksize=blocksize)
                a = _blosc_data(dtype, 3000, k)
                z = zarr.create_array(p, shape=a.shape, chunks=(1100,), dtype=a.dtype, zarr_format=2,
                                      compressors=comp, fill_value=None)
                z[...] = a
                got, _ = ferry_read(ctx, p)
                assert same(got, z[...]), (cname, dtype, shuffle, clevel, blocksize)
                assert same(got, a)


@pytest.mark.parametrize("cname", ["blosclz", "lz4", "zstd"])
def test_blosc_v3_codec(ctx, tmp_path, cname):
    for i, (dtype, shuffle) in enumerate([("<f8", "shuffle"), ("<i4", "bitshuffle"), ("|u1", "noshuffle")]):
        p = str(tmp_path / f"{i}.zarr")
        a = _blosc_data(dtype, 5000, i)
        z = zarr.create_array(p, shape=a.shape, chunks=(2048,), dtype=a.dtype, zarr_format=3,
                              compressors=BloscCodec(cname=cname, clevel=5, shuffle=shuffle))
        z[...] = a
        got, _ = ferry_read(ctx, p)
        assert same(got, a), (cname, dtype, shuffle)


def test_blosc_corrupt_blosclz_chunk_is_an_error(ctx, tmp_path):
    p = str(tmp_path / "a.zarr")
    a = np.arange(3000, dtype="<i4") // 3
    z = zarr.create_array(p, shape=a.shape, chunks=(1000,), dtype=a.dtype, zarr_format=2,
                          compressors=numcodecs.Blosc(cname="blosclz", shuffle=numcodecs.Blosc.NOSHUFFLE))
    z[...] = a
    chunk = os.path.join(p, "1")
    raw = bytearray(open(chunk, "rb").read())
    raw[len(raw) // 2] ^= 0xff
    raw[-1] ^= 0x55
    open(chunk, "wb").write(raw)
    try:
        ref = z[...]
    except Exception:
        ref = None
    try:
        got, _ = ferry_read(ctx, p)
    except F.FerryError as e:
        assert "blosc" in str(e)
    else:   # a damaged BloscLZ stream may still be well-formed: then it must match c-blosc exactly
        assert ref is not None and same(got, ref)


def test_missing_store_and_bad_metadata(ctx, tmp_path):
    with pytest.raises(F.FerryError):
        F.Dataset(ctx, str(tmp_path / "nope.zarr"))
    p = tmp_path / "bad.zarr"
    p.mkdir()
    (p / ".zarray").write_text('{"zarr_format": 2, "shape": [10], "chunks": [0], "dtype": "<f4", '
                               '"compressor": null, "fill_value": 0, "order": "C", "filters": null}')
    with pytest.raises(F.FerryError):
        F.Dataset(ctx, str(p), format="zarr")
    (p / ".zarray").write_text('{"zarr_format": 2, "shape": [10, "x"]}')
    with pytest.raises(F.FerryError) as ei:
        F.Dataset(ctx, str(p), format="zarr")
    assert ".zarray" in str(ei.value)


def test_v2_numcodecs_lz4_and_edge_chunks_large(ctx, tmp_path):
    # chunks large enough that the engine's workers decode in parallel
    a = data((300, 257), "<f8", 5)
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=a.shape, chunks=(64, 64), dtype=a.dtype, zarr_format=2,
                          compressors=numcodecs.LZ4())
    z[...] = a
    check_store(ctx, p, z, nsel=10, seed=9)


def test_v3_numcodecs_codecs(ctx, tmp_path):
    try:   # zarr >= 3.1.3 carries the numcodecs v3 wrappers itself
        import zarr.codecs.numcodecs as nz3
    except ImportError:
        nz3 = pytest.importorskip("numcodecs.zarr3")
    a = data((40, 30), "<i4", 11)
    cases = {
        "zlib": dict(compressors=[nz3.Zlib(level=1)]),
        "lz4": dict(compressors=[nz3.LZ4()]),
        "shuffle_zstd": dict(filters=None, compressors=[nz3.Shuffle(elementsize=4), nz3.Zstd(level=1)]),
    }
    for name, kw in cases.items():
        p = str(tmp_path / f"{name}.zarr")
        z = zarr.create_array(p, shape=a.shape, chunks=(16, 16), dtype=a.dtype, zarr_format=3, **kw)
        z[...] = a
        check_store(ctx, p, z, nsel=3)


def test_v2_fixed_bytes_dtype(ctx, tmp_path):
    p = str(tmp_path / "s.zarr")
    a = np.array([b"ab", b"cde", b"", b"xyzw", b"q"] * 5, dtype="|S4")
    z = zarr.create_array(p, shape=a.shape, chunks=(4,), dtype=a.dtype, zarr_format=2,
                          compressors=numcodecs.Zlib(level=1), fill_value=b"zz")
    z[:12] = a[:12]
    got, v = ferry_read(ctx, p)
    assert v["typestr"] == "|S4"
    assert same(got, z[...])


def test_unsupported_v3_dtype_in_group(ctx, tmp_path):
    g = str(tmp_path / "g.zarr")
    root = zarr.open_group(g, mode="w", zarr_format=3)
    try:
        s = root.create_array("s", shape=(3,), dtype=str)
        s[...] = np.array(["a", "bb", "ccc"])
    except Exception as e:   # pragma: no cover - depends on zarr's string support
        pytest.skip(f"zarr cannot write strings here: {e}")
    n = root.create_array("n", shape=(3,), dtype="<f8")
    n[...] = [1.0, 2.0, 3.0]
    got, _ = ferry_read(ctx, g, "n")
    assert same(got, np.array([1.0, 2.0, 3.0]))
    ds = F.Dataset(ctx, g)
    v = ds.variables()[ds.find("s")]
    ds.close()
    assert v["typestr"] == "string" and v["shape"] == (3,)   # the type as written in zarr.json
    with pytest.raises(F.FerryError) as ei:
        ferry_read_raw(ctx, g, "s")
    assert "not supported" in str(ei.value) and "string" in str(ei.value)


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("dtype", ["M8[ns]", "M8[s]", "m8[ms]"])
def test_datetime_dtypes(ctx, tmp_path, fmt, dtype):
    p = str(tmp_path / "t.zarr")
    vals = (np.arange(20) * 86400 + 1_600_000_000).astype("i8").view(dtype)
    z = zarr.create_array(p, shape=(20,), chunks=(6,), dtype=dtype, zarr_format=fmt)
    z[:13] = vals[:13]              # the last chunk stays missing: NaT fill
    got, v = ferry_read(ctx, p)
    assert np.dtype(v["typestr"]) == np.dtype(dtype)
    assert same(got.view("i8"), z[...].view("i8"))


# ---------------------------------------------------------------------------
# Arrays ferry cannot read (a codec, filter or dtype it lacks): described all
# the same — shape, chunks, dimension names, attributes, fill value, dtype as
# written — and every read of them fails with the parser's message.
# ---------------------------------------------------------------------------
def unreadable_store(p, fmt, consolidated=False):
    """A group holding `delta` (a Delta filter), `s` (v3: a fixed-length string
    type; v2: a FixedScaleOffset filter) and a readable `good`; zarr's arrays."""
    root = zarr.open_group(p, mode="w", zarr_format=fmt)
    a = np.arange(120, dtype="<i4").reshape(30, 4)
    if fmt == 3:
        nz3 = pytest.importorskip("numcodecs.zarr3")
        delta = root.create_array("delta", shape=a.shape, chunks=(10, 4), dtype=a.dtype, fill_value=-1,
                                  filters=[nz3.Delta(dtype="<i4")], dimension_names=["x", "y"],
                                  attributes={"units": "m"})
        s = root.create_array("s", shape=(6,), chunks=(3,), dtype="<U4", dimension_names=["z"],
                              attributes={"long_name": "labels"})
        s[...] = np.array(["a", "bb", "ccc", "dddd", "e", "f"])
        good = root.create_array("good", shape=(4,), chunks=(2,), dtype="<f4", dimension_names=["y"])
    else:
        delta = root.create_array("delta", shape=a.shape, chunks=(10, 4), dtype=a.dtype, fill_value=7,
                                  filters=[numcodecs.Delta(dtype="<i4")], compressors=numcodecs.Zlib(level=1),
                                  attributes={"_ARRAY_DIMENSIONS": ["x", "y"], "units": "m"})
        s = root.create_array("s", shape=(6,), chunks=(3,), dtype="<f8", fill_value=-9.0,
                              filters=[numcodecs.FixedScaleOffset(offset=0, scale=10, dtype="<f8", astype="<i4")],
                              attributes={"_ARRAY_DIMENSIONS": ["z"], "long_name": "labels"})
        s[...] = np.array([0.5, 1.5, 2.5, 3.5, 4.5, 5.5])
        good = root.create_array("good", shape=(4,), chunks=(2,), dtype="<f4",
                                 attributes={"_ARRAY_DIMENSIONS": ["y"]})
    delta[:20] = a[:20]             # the last chunk stays missing
    good[...] = np.array([1, 2, 3, 4], dtype="<f4")
    if consolidated:
        zarr.consolidate_metadata(p)
    return delta, s, good


def ferry_read_raw(ctx, path, name, selection=None):
    """A read into a byte buffer (for types numpy has no name for here)."""
    ds = F.Dataset(ctx, path)
    try:
        idx = ds.find(name)
        plan = F.Plan()
        plan.read(ds, idx, np.zeros(1 << 12, np.uint8), selection=selection, native=True)
        ctx.run(plan)
    finally:
        ds.close()


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("consolidated", [False, True])
def test_unreadable_arrays_are_described(ctx, tmp_path, fmt, consolidated):
    p = str(tmp_path / "u.zarr")
    unreadable_store(p, fmt, consolidated)
    ds = F.Dataset(ctx, p)
    vs = {v["name"]: v for v in ds.variables()}
    dims = json.loads(ds.dims)
    ds.close()
    assert sorted(vs) == ["delta", "good", "s"]
    d = vs["delta"]
    assert d["typestr"] == "<i4" and d["dtype"] == "i4" and d["itemsize"] == 4
    assert d["shape"] == (30, 4) and d["chunks"] == (10, 4)
    assert json.loads(d["dims"]) == ["x", "y"]
    assert json.loads(d["attrs"])["units"] == "m"
    assert json.loads(d["fill"]) == (-1 if fmt == 3 else 7)
    assert "delta" in d["codecs"]
    # the message names the metadata file, the byte position and the filter
    meta = "zarr.json" if fmt == 3 else (".zmetadata" if consolidated else ".zarray")
    assert p in d["error"] and meta in d["error"] and ": byte " in d["error"]
    assert "delta" in d["error"] and "not supported" in d["error"]
    s = vs["s"]
    assert s["shape"] == (6,) and s["chunks"] == (3,) and json.loads(s["dims"]) == ["z"]
    assert json.loads(s["attrs"])["long_name"] == "labels"
    if fmt == 3:   # the type as written in zarr.json
        assert json.loads(s["typestr"])["name"] == "fixed_length_utf32" and s["dtype"] == "other"
        assert "fixed_length_utf32" in s["error"] and json.loads(s["fill"]) == ""
    else:
        assert s["typestr"] == "<f8" and "fixedscaleoffset" in s["error"] and json.loads(s["fill"]) == -9.0
    assert vs["good"]["error"] is None
    assert dims["x"]["size"] == 30 and dims["y"]["size"] == 4 and dims["z"]["size"] == 6
    # reading fails with that message, never with bytes of the wrong meaning
    for name in ("delta", "s"):
        with pytest.raises(F.FerryError) as ei:
            ferry_read_raw(ctx, p, name)
        assert vs[name]["error"] in str(ei.value)
        with pytest.raises(F.FerryError) as ei:
            ferry_read_raw(ctx, p, name, selection=[(0, 0, 1)] * len(vs[name]["shape"]))   # even nothing
        assert vs[name]["error"] in str(ei.value)
    got, _ = ferry_read(ctx, p, "good")
    assert same(got, np.array([1, 2, 3, 4], dtype="<f4"))


@pytest.mark.parametrize("fmt", [2, 3])
def test_unreadable_arrays_through_ferry_open(tmp_path, fmt):
    import ferry
    p = str(tmp_path / "u.zarr")
    unreadable_store(p, fmt)
    o = ferry.open(p)
    d = o.variables["delta"]
    assert d.dims == ("x", "y") and d.shape == (30, 4) and d.chunks == (10, 4)
    assert d.attrs["units"] == "m" and d.dtype == np.dtype("<i4")
    assert "delta" in d.error
    for name in ("delta", "s"):
        v = o.variables[name]
        with pytest.raises(ferry.FerryError) as ei:
            v.read()
        assert v.error in str(ei.value)
        with pytest.raises(ferry.FerryError):
            v[0:0]                  # even an empty selection
        with pytest.raises(ferry.FerryError):
            ferry.read(p, name)
    if fmt == 3:
        assert o.variables["s"].dtype == o.variables["s"].typestr   # numpy has no name for it here
    assert o.variables["good"].error is None
    assert list(o.variables["good"].read()) == [1, 2, 3, 4]
    # a store that is one such array opens too (it used to fail at open)
    lone = os.path.join(p, "delta")
    v = ferry.open(lone).variables["delta"]
    assert v.dims == ("x", "y") and "delta" in v.error
    with pytest.raises(ferry.FerryError):
        ferry.read(lone)


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("consolidated", [False, True])
def test_xarray_reads_unreadable_arrays_through_zarr_python(tmp_path, fmt, consolidated):
    """Like netCDF-4 datasets the engine cannot read (h5py on the CPU): zarr-python
    reads them, the rest goes through the engine."""
    xr = pytest.importorskip("xarray")
    p = str(tmp_path / "u.zarr")
    unreadable_store(p, fmt, consolidated)
    ref = xr.open_dataset(p, engine="zarr", consolidated=consolidated).load()
    got = xr.open_dataset(p, engine="ferry")
    from ferry.xarray import FerryStore
    st = FerryStore(p)   # which reader took each variable (encoding holds the zarr engine's keys only)
    assert [st.specs[n].kind for n in ("delta", "s", "good")] == ["zarrpy", "zarrpy", "ferry"]
    st.close()
    xr.testing.assert_identical(got.load(), ref)


@pytest.mark.parametrize("fmt", [2, 3])
def test_xarray_unreadable_arrays_without_zarr(tmp_path, fmt, monkeypatch):
    """Without zarr-python the store still opens with every variable, its dims and
    attributes from ferry's parser; loading one ferry cannot read raises FerryError
    with the parser's message."""
    xr = pytest.importorskip("xarray")
    import ferry
    p = str(tmp_path / "u.zarr")
    _, _, good = unreadable_store(p, fmt)
    ref = xr.open_dataset(p, engine="zarr", consolidated=False)
    monkeypatch.setitem(sys.modules, "zarr", None)   # `import zarr` now fails
    got = xr.open_dataset(p, engine="ferry")
    assert set(got.variables) == {"delta", "s", "good"}
    from ferry.xarray import FerryStore
    st = FerryStore(p)
    for name in ("delta", "s"):
        assert got[name].dims == ref[name].dims
        assert got[name].attrs == ref[name].attrs
        assert st.specs[name].kind == "unsupported"
        assert "not supported" in st.specs[name].error
        assert not any(k.startswith("ferry") for k in got[name].encoding)
    st.close()
    assert got["delta"].dtype == ref["delta"].dtype and got.sizes == ref.sizes
    np.testing.assert_array_equal(got["good"].values, [1, 2, 3, 4])
    with pytest.raises(ferry.FerryError) as ei:
        got["delta"].load()
    assert "delta" in str(ei.value) and ": byte " in str(ei.value)
    with pytest.raises(ferry.FerryError):
        got.load()
