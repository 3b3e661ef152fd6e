"""Opening netCDF-4 files of many variables: Dataset.meta() (every variable's
description in one call) against variables(), attributes decoded in bulk
against one by one, and files whose metadata spans many read-ahead windows
(src/formats/hdf5/super.c) and dense attributes (each variable's fractal heap
block read whole, heap.c) equal to the netcdf4 engine's open, encoding included. Files are written by netCDF4-python here."""
import json

import numpy as np
import pytest

import ferry
from ferry import _ferry

netCDF4 = pytest.importorskip("netCDF4")
xr = pytest.importorskip("xarray")
import ferry.xarray  # noqa: E402,F401


def _many(path, n, long_attr=0):
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("time", None)
        nc.createDimension("x", 16)
        t = nc.createVariable("time", "i4", ("time",))
        t.units = "hours since 1900-01-01 00:00:00.0"
        t[:] = np.arange(3)
        nc.createVariable("x", "f8", ("x",))[:] = np.linspace(0, 1, 16)
        types = ["i2", "f4", "u1", "i8", "f8", "u4"]
        for i in range(n):
            typ = types[i % len(types)]
            kw = {"zlib": True, "shuffle": True, "chunksizes": (1, 16)} if i % 3 == 0 else {}
            v = nc.createVariable(f"v{i:04d}", typ, ("time", "x"), fill_value=np.array(7, typ), **kw)
            v.units = "K"
            v.long_name = f"variable {i}" + "." * long_attr
            if typ == "i2":
                v.scale_factor = np.float32(0.01 * (i + 1))
                v.add_offset = 273.0
            v.valid_range = np.array([0, 100], typ)
            for k in range(10):   # over 8 attributes: HDF5's dense storage (a fractal heap and B-tree each)
                v.setncattr(f"GRIB_key{k}", np.int32(k) if k % 2 else f"value {k} of {i}")
            v[:] = (np.arange(48).reshape(3, 16) % 50).astype(typ)
        nc.title = "many"


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    p = tmp_path_factory.mktemp("many") / "many.nc"
    _many(p, 300, long_attr=400)   # ~300 headers of ~0.6 KB: metadata over several 64 KiB windows
    return str(p)


def test_meta_rows_equal_variables(many):
    with ferry.Dataset(ferry.default_context(), many) as ds:
        rows, dicts = ds.meta(), ds.variables()
    assert len(rows) == len(dicts) == 302
    for r, d in zip(rows, dicts):
        name, typestr, shape, chunks, dims, attrs, codecs, data_bytes, error = r
        assert (name, typestr, shape, chunks, dims, attrs, codecs, data_bytes, error) == (
            d["name"], d["typestr"], d["shape"], d["chunks"], d["dims"], d["attrs"], d["codecs"],
            d["data_bytes"], d["error"])
        assert isinstance(shape, tuple) and isinstance(chunks, tuple)


def test_bulk_attrs_equal_one_by_one(many):
    with ferry.Dataset(ferry.default_context(), many) as ds:
        jsons = [r[5] for r in ds.meta()]
    bulk = ferry._decode_attrs_many(jsons, "hdf5")
    for j, b in zip(jsons, bulk):
        one = ferry.decode_attrs(j, "hdf5")
        assert list(one) == list(b)
        for k in one:
            assert type(one[k]) is type(b[k]), k
            np.testing.assert_array_equal(one[k], b[k])


@pytest.mark.parametrize("typ,vals", [
    ("<i1", [-128]), ("<u1", [255]), ("<i2", [-32767]), ("<u2", [65535]), ("<i4", [-2**31]),
    ("<u4", [2**32 - 1]), ("<i8", [-2**63]), ("<u8", [2**64 - 1]), ("<f4", [0.1]), ("<f4", [3.4028235e38]),
    ("<f8", [1e-310]), ("<f4", ["NaN"]), ("<f8", ["-Infinity"]), ("<f2", [0.1]), ("<f4", [1, 2.5]),
    ("|b1", [True])])
def test_numeric_attribute_types(typ, vals):
    """A one-value attribute is the numpy scalar np.array(values, dtype)[0] is,
    whichever way it is built: same type, same bits."""
    got = ferry.decode_attrs(json.dumps({"a": {"type": typ, "value": vals}}), "hdf5")["a"]
    conv = [{"NaN": np.nan, "-Infinity": -np.inf}.get(v, v) if isinstance(v, str) else v for v in vals]
    want = np.array(conv, dtype=np.dtype(typ).newbyteorder("="))
    want = want[0] if want.size == 1 else want
    assert type(got) is type(want)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


def test_open_equals_netcdf4_with_encoding(many):
    got = xr.open_dataset(many, engine="ferry")
    ref = xr.open_dataset(many, engine="netcdf4")
    try:
        xr.testing.assert_identical(got.load(), ref.load())
        for name in ref.variables:
            e1, e2 = dict(got[name].encoding), dict(ref[name].encoding)
            for e in (e1, e2):
                e.pop("source", None)
            assert e1 == e2, name
    finally:
        got.close()
        ref.close()


def test_truncated_metadata_names_the_file(tmp_path, many):
    """A file cut inside its headers: the read-ahead window is short, the
    error is the parser's (file and position), never garbage."""
    data = open(many, "rb").read()
    p = tmp_path / "cut.nc"
    p.write_bytes(data[: len(data) // 3])
    with pytest.raises(ferry.FerryError) as ei:
        ferry.Dataset(ferry.default_context(), str(p)).close()
    assert str(p) in str(ei.value)
    assert ei.value.code in (_ferry.EFORMAT, _ferry.EIO)


def test_open_leaves_the_collector_as_it_was(many, tmp_path):
    """The backend pauses Python's cyclic collector during an open and turns it
    back on after, also when the open fails; a collector the caller turned off
    stays off."""
    import gc
    assert gc.isenabled()
    xr.open_dataset(many, engine="ferry").close()
    assert gc.isenabled()
    bad = tmp_path / "bad.nc"
    bad.write_bytes(open(many, "rb").read()[:4096])
    with pytest.raises(ferry.FerryError):
        xr.open_dataset(bad, engine="ferry")
    assert gc.isenabled()
    gc.disable()
    try:
        xr.open_dataset(many, engine="ferry").close()
        assert not gc.isenabled()
    finally:
        gc.enable()
