"""xarray ``encoding`` as the reference engines give it (issue 38 items 2, 6 and 15): Zarr v2/v3
stores written by zarr-python through xarray compared key by key with engine="zarr", netCDF
classic files written by netCDF4 compared with engine="netcdf4" (char variables with fills
masked alike), ``to_zarr``/``to_netcdf`` after engine="ferry" keeping codecs, and XarrayDataset's
float32 decode of packed variables equal to xarray's decode cast to float32."""
import warnings

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
ferry = pytest.importorskip("ferry")


def _same(x, y):
    """Equal values of equal types (NaN equal to NaN; arrays elementwise)."""
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and np.array_equal(x, y, equal_nan=True)
    try:
        if x != x and y != y:
            return type(x) is type(y)
    except (TypeError, ValueError):
        pass
    try:
        return bool(x == y) and type(x) is type(y)
    except (TypeError, ValueError):
        return False


def _encodings_equal(ref, got, where):
    for v in ref.variables:
        a, b = ref[v].encoding, got[v].encoding
        assert set(a) == set(b), (where, v, a, b)
        for k in a:
            assert _same(a[k], b[k]), (where, v, k, a[k], b[k])
        assert set(ref[v].attrs) == set(got[v].attrs), (where, v)
        for k in ref[v].attrs:
            assert _same(ref[v].attrs[k], got[v].attrs[k]), (where, v, k, ref[v].attrs[k], got[v].attrs[k])
    assert ref.encoding.keys() == got.encoding.keys(), where


# ---------------------------------------------------------------------------
# Zarr
# ---------------------------------------------------------------------------
def _zarr_cases():
    zarr = pytest.importorskip("zarr")
    numcodecs = pytest.importorskip("numcodecs")
    from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ZstdCodec
    del zarr
    return {
        "v2_zstd3": dict(zarr_format=2, encoding={"t": {"compressors": [numcodecs.Zstd(level=3)], "chunks": (2, 5)}}),
        "v2_shuffle_zlib": dict(zarr_format=2, encoding={"t": {"compressors": [numcodecs.Zlib(level=1)],
                                                               "filters": [numcodecs.Shuffle(elementsize=4)]}}),
        "v2_blosc_bitshuffle": dict(zarr_format=2, encoding={"t": {"compressors": [
            numcodecs.Blosc(cname="zstd", clevel=2, shuffle=2)]}}),
        "v2_consolidated": dict(zarr_format=2, consolidated=True),
        "v3_zstd3": dict(zarr_format=3, encoding={"t": {"compressors": [ZstdCodec(level=3)], "chunks": (2, 5)}}),
        "v3_gzip_crc_big": dict(zarr_format=3, encoding={"t": {"compressors": [GzipCodec(level=2), Crc32cCodec()],
                                                               "serializer": BytesCodec(endian="big")}}),
        "v3_sharded_blosc": dict(zarr_format=3, encoding={"t": {"compressors": [BloscCodec(cname="lz4")],
                                                                "chunks": (1, 5), "shards": (2, 5)}}),
        "v3_consolidated": dict(zarr_format=3, consolidated=True),
    }


def _zarr_source():
    return xr.Dataset({"t": (("y", "x"), np.arange(20.0).reshape(4, 5).astype("f4"), {"units": "K"}),
                       "i": (("y",), np.arange(4, dtype=">i2"))}, coords={"y": np.arange(4.0)})


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("case", ["v2_zstd3", "v2_shuffle_zlib", "v2_blosc_bitshuffle", "v2_consolidated",
                                  "v3_zstd3", "v3_gzip_crc_big", "v3_sharded_blosc", "v3_consolidated"])
def test_zarr_encoding_equals_the_zarr_engine(tmp_path, case):
    kw = _zarr_cases()[case]
    p = str(tmp_path / f"{case}.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _zarr_source().to_zarr(p, mode="w", **kw)
    ref = xr.open_dataset(p, engine="zarr")
    got = xr.open_dataset(p, engine="ferry")
    _encodings_equal(ref, got, case)
    # to_zarr after engine="ferry" keeps what the source had (zstd level 3 stays 3, shards stay)
    out = str(tmp_path / f"{case}.copy.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got.to_zarr(out, mode="w", zarr_format=kw["zarr_format"])
    again = xr.open_dataset(out, engine="zarr")
    for v in ref.data_vars:
        for k in ("compressors", "filters", "serializer", "shards", "chunks"):
            if k in ref[v].encoding:
                assert _same(again[v].encoding[k], ref[v].encoding[k]), (case, v, k)
    xr.testing.assert_identical(again.load(), ref.load())


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr_strings_bools_times_encoding(tmp_path, zarr_format):
    """Variables ferry's engine reads (bools, times) and those zarr-python reads for it (strings)
    alike: the zarr engine's keys."""
    pytest.importorskip("zarr")
    ds = xr.Dataset({"u": (("x",), np.array(["ab", "cde", "f"])), "s": (("x",), np.array([b"ab", b"c", b"d"])),
                     "o": (("x",), np.array(["x", "yy", "zzz"], dtype=object)),
                     "b": (("x",), np.array([True, False, True])),
                     "t": (("x",), np.array([1, 2, 3], dtype="timedelta64[s]")),
                     "tm": (("x",), np.array(["2001-01-01", "2001-01-02", "NaT"], dtype="datetime64[ns]"))})
    p = str(tmp_path / "s.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(p, zarr_format=zarr_format, mode="w", consolidated=False)
    ref = xr.open_dataset(p, engine="zarr", consolidated=False)
    got = xr.open_dataset(p, engine="ferry")
    xr.testing.assert_identical(got.load(), ref.load())
    _encodings_equal(ref, got, zarr_format)


# ---------------------------------------------------------------------------
# netCDF classic
# ---------------------------------------------------------------------------
@pytest.fixture
def classic(tmp_path):
    netCDF4 = pytest.importorskip("netCDF4")
    p = str(tmp_path / "c.nc")
    with netCDF4.Dataset(p, "w", format="NETCDF3_64BIT_OFFSET") as f:
        f.createDimension("t", None)
        f.createDimension("x", 3)
        f.createDimension("n", 4)
        v = f.createVariable("v", "f4", ("t", "x"), fill_value=-1.0)
        v[:] = np.arange(6.0).reshape(2, 3)
        v.units = "K"
        c = f.createVariable("c", "S1", ("x", "n"), fill_value=b"*")
        c.set_auto_chartostring(False)
        c[:] = np.array([[b"a", b"b", b"*", b"*"], [b"*"] * 4, [b"x", b"y", b"z", b"*"]], dtype="S1")
        d = f.createVariable("d", "S1", ("n",), fill_value=b"\x00")
        d.set_auto_chartostring(False)
        d[:] = np.array([b"h", b"\x00", b"i", b"\x00"], dtype="S1")
        pk = f.createVariable("p", "i2", ("x",))
        pk.scale_factor = 0.1
        pk.add_offset = 5.0
        pk[:] = np.array([1, 2, 3])
        w = f.createVariable("w", "i4", ("x",), fill_value=-7)
        w[:] = [1, -7, 3]
    return p


@pytest.mark.parametrize("kw", [{}, {"concat_characters": False}, {"mask_and_scale": False}])
def test_netcdf3_encoding_equals_the_netcdf4_engine(classic, kw):
    ref = xr.open_dataset(classic, engine="netcdf4", **kw)
    got = xr.open_dataset(classic, engine="ferry", **kw)
    xr.testing.assert_identical(got.load(), ref.load())
    _encodings_equal(ref, got, kw)
    assert got["v"].encoding["dtype"] == np.dtype("float32") and got["v"].encoding["dtype"].byteorder == "="


def test_char_fill_is_masked_as_scipy_and_netcdf4_mask_it(classic):
    got = xr.open_dataset(classic, engine="ferry", concat_characters=False)
    assert isinstance(got["c"].encoding["_FillValue"], bytes)
    assert got["c"].values.tolist()[1] == [np.nan] * 4 or all(x != x for x in got["c"].values[1])
    for eng in ("scipy", "netcdf4"):
        pytest.importorskip(eng if eng != "netcdf4" else "netCDF4")
        ref = xr.open_dataset(classic, engine=eng, concat_characters=False)
        xr.testing.assert_identical(got.load(), ref.load())
        assert got["c"].encoding["_FillValue"] == ref["c"].encoding["_FillValue"]


def test_to_netcdf_after_ferry_writes_what_netcdf4_writes(classic, tmp_path):
    """open -> to_netcdf through engine="ferry" writes the file the same round trip through
    engine="netcdf4" writes: types, fills, packing, char variables."""
    outs = {}
    for eng in ("ferry", "netcdf4"):
        outs[eng] = str(tmp_path / f"copy_{eng}.nc")
        xr.open_dataset(classic, engine=eng).to_netcdf(outs[eng], format="NETCDF3_64BIT")
    a = xr.open_dataset(outs["ferry"], engine="netcdf4", mask_and_scale=False, concat_characters=False)
    b = xr.open_dataset(outs["netcdf4"], engine="netcdf4", mask_and_scale=False, concat_characters=False)
    xr.testing.assert_identical(a.load(), b.load())
    for v in b.variables:
        assert a[v].dtype == b[v].dtype, v
        assert all(_same(a[v].attrs[k], b[v].attrs[k]) for k in b[v].attrs), v


# ---------------------------------------------------------------------------
# XarrayDataset's float32 decode of packed variables (item 15)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("attr_type", ["float64", "float32"])
def test_xarray_dataset_packed_float32_equals_xarray_cast(tmp_path, attr_type):
    torch = pytest.importorskip("torch")
    pytest.importorskip("scipy")
    from ferry.torch import XarrayDataset
    rng = np.random.default_rng(3)
    t2m = rng.normal(280, 10, (8, 6, 7))
    t2m[2, 1, 1] = np.nan
    ds = xr.Dataset({"t2m": (("time", "lat", "lon"), t2m)},
                    coords={"time": np.arange(8), "lat": np.arange(6.0), "lon": np.arange(7.0)})
    p = str(tmp_path / "packed.nc")
    sc, off = np.dtype(attr_type).type(0.013), np.dtype(attr_type).type(279.37)
    ds.to_netcdf(p, engine="scipy", encoding={"t2m": {"dtype": "int16", "scale_factor": sc, "add_offset": off,
                                                      "_FillValue": -32767}})
    ref = xr.open_dataset(p, engine="scipy")
    want = ref["t2m"].values.astype(np.float32)
    opened = xr.open_dataset(p, engine="ferry")
    got = XarrayDataset(opened, ["t2m"], batch_size=8, shuffle=False, device="cpu", dtype=torch.float32,
                        return_time=True)
    seen = 0
    for b in got:
        for k, t in enumerate(b["time"].numpy()):
            np.testing.assert_array_equal(b["x"][k, 0].numpy(), want[int(t)])   # bit for bit, NaN where masked
            seen += 1
    assert seen == 8
