"""netCDF-4 / HDF5 read by the C parser (src/formats/hdf5/), checked against
the reference readers: files are written here by h5py (default and
libver="latest" layouts), netCDF4-python and h5netcdf (and hdf5plugin's
filters when installed), opened through ferry's C Dataset (ferry._ferry.Dataset,
ferry.open, ferry.read), and every value, dimension and attribute compared with
what h5py / netCDF4 read. Damaged copies (every truncation, bit flips) must
give a FerryError, never a crash or a silent wrong value."""
import json
import os
import subprocess

import numpy as np
import pytest

import ferry
from ferry import _ferry

h5py = pytest.importorskip("h5py")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FERRY = os.environ.get("FERRY_BIN", os.path.join(ROOT, "build", "ferry"))


def c_open(path, group=None):
    return _ferry.Dataset(ferry.default_context(), str(path), None, group)


def c_vars(path, group=None):
    d = c_open(path, group)
    try:
        return {v["name"]: v for v in d.variables()}, json.loads(d.dims), json.loads(d.attrs), json.loads(d.groups)
    finally:
        d.close()


def read(path, name, group=None, selection=None):
    with ferry.open(path, group=group) as f:
        assert type(f).__name__ == "Opened"          # the C dataset, not the h5py fallback
        v = f[name]
        return v.read(selection) if selection is not None else v.read()


def same_attr(got, want):
    if isinstance(want, bytes):
        want = want.decode()
    if isinstance(want, np.ndarray) and want.dtype.kind in "SOU":
        want = [w.decode() if isinstance(w, bytes) else w for w in want.tolist()]
        assert list(got) == want if isinstance(got, list) else [got] == want
        return
    if isinstance(want, str):
        assert got == want
        return
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert np.asarray(got).dtype == np.asarray(want).dtype.newbyteorder("=")


# the netCDF-4 / dimension-scale bookkeeping ferry leaves out of attributes (CLASS, NAME and
# REFERENCE_LIST only on dimension scales)
HIDDEN = {"DIMENSION_LIST", "_Netcdf4Dimid", "_Netcdf4Coordinates", "_NCProperties", "_nc3_strict"}
SCALE_HIDDEN = HIDDEN | {"CLASS", "NAME", "REFERENCE_LIST"}


def compare_h5py(path, group="/"):
    """Every dataset and attribute of the group, as h5py reads them."""
    with h5py.File(path, "r") as h:
        g = h[group]
        with ferry.open(path, group=None if group == "/" else group) as f:
            assert set(f.attrs) == set(g.attrs) - HIDDEN
            for k, want in g.attrs.items():
                if k not in HIDDEN:
                    same_attr(f.attrs[k], want)
            for name, obj in g.items():
                if not isinstance(obj, h5py.Dataset):
                    continue
                if str(obj.attrs.get("NAME", b"")).find("not a netCDF variable") >= 0:
                    assert name not in f       # a dimension without a variable
                    continue
                v = f[name]
                assert v.shape == obj.shape
                if v.error:
                    continue
                assert v.dtype == obj.dtype.newbyteorder("="), name
                np.testing.assert_array_equal(v.read(), obj[()], err_msg=name)
                hidden = SCALE_HIDDEN if obj.attrs.get("CLASS") == b"DIMENSION_SCALE" else HIDDEN
                assert set(v.attrs) == set(obj.attrs) - hidden
                for k, want in obj.attrs.items():
                    if k not in hidden:
                        same_attr(v.attrs[k], want)


@pytest.mark.parametrize("libver", [None, "latest"])
def test_h5py_layouts_types_and_attributes(tmp_path, libver):
    p = tmp_path / "a.h5"
    rng = np.random.default_rng(1)
    with h5py.File(p, "w", libver=libver) as f:
        for dt in ["<f8", ">f4", ">i4", "<i8", ">u2", "|i1", "|u1", "<f2", ">f8"]:
            f[f"c_{dt[1:]}_{'be' if dt[0] == '>' else 'le'}"] = (rng.standard_normal((5, 7)) * 100).astype(dt)
        f.create_dataset("z", data=rng.standard_normal((9, 10, 11)).astype("f4"), chunks=(4, 3, 5),
                         compression="gzip", compression_opts=6, shuffle=True, fletcher32=True)
        f.create_dataset("zbe", data=np.arange(100, dtype=">i8").reshape(10, 10), chunks=(3, 7), compression="gzip")
        f.create_dataset("sparse", shape=(10, 10), dtype="<i4", chunks=(4, 4), fillvalue=-5)
        f["sparse"][0:4, 4:8] = 1                               # one chunk written, the rest fill
        f.create_dataset("never", shape=(3, 2), dtype="<f4", fillvalue=2.5)   # contiguous, never written
        f.create_dataset("grow2", data=np.arange(30, dtype="<f4").reshape(5, 6), chunks=(2, 4),
                         maxshape=(None, None))
        f["text"] = np.array([b"alpha", b"be", b"gamma"], "S5")
        f.create_dataset("scalar", data=np.float64(3.5))
        f["bool"] = np.array([True, False, True])                  # an enum FALSE/TRUE: numpy's bool
        f["cplx"] = np.arange(4) * (1 + 2j)                          # a compound of two floats: complex
        f.create_dataset("cplx_be", data=(np.arange(30) * (1 - 2j)).astype(">c8"), chunks=(7,),
                         compression="gzip", fillvalue=3 + 4j)
        f.create_dataset("enum", data=np.array([0, 1, 1], "i1"), dtype=h5py.enum_dtype({"RED": 0, "GREEN": 1}, "i1"))
        f.attrs["flag"] = np.bool_(True)
        f["text"].attrs["NAME"] = "not a scale: kept"        # bookkeeping names only hidden on scales
        f["text"].attrs["CLASS"] = "kept too"
        f.attrs["s"] = "hello"
        f.attrs["b"] = np.bytes_(b"fixed")
        f.attrs["i"] = np.int64(-3)
        f.attrs["u8"] = np.uint8(200)
        f.attrs["fbe"] = np.array([1.5, -2.25], ">f4")
        f.attrs.create("vs", ["x", "yy"], dtype=h5py.string_dtype())
        for i in range(12):                                     # dense attributes on a dataset
            f["z"].attrs[f"a{i:02d}"] = i * 1.5
    compare_h5py(p)
    cv, dims, attrs, groups = c_vars(p)
    assert cv["z"]["codecs"] == "fletcher32 zlib(level=6) shuffle"
    assert cv["z"]["chunks"] == (4, 3, 5)
    assert attrs["s"] == "hello" and attrs["vs"] == ["x", "yy"]
    assert attrs["fbe"] == {"type": ">f4", "value": [1.5, -2.25]}
    with h5py.File(p, "r") as h:
        np.testing.assert_array_equal(read(p, "z", selection=(slice(1, 8, 3), 2, slice(None, None, 4))),
                                      h["z"][1:8:3, 2, ::4])
        np.testing.assert_array_equal(read(p, "sparse"), h["sparse"][()])
    assert (read(p, "never") == 2.5).all()


@pytest.mark.parametrize("libver", [None, "latest"])
def test_h5py_many_chunks_every_index(tmp_path, libver):
    # libver "latest": extensible arrays (one unlimited dimension; data blocks, secondary blocks and
    # paged blocks past 1024 elements), fixed arrays (paged past 1024 chunks), v2 B-trees; else v1 B-trees
    p = tmp_path / "m.h5"
    with h5py.File(p, "w", libver=libver) as f:
        f.create_dataset("ea", data=np.arange(200000, dtype="<u1"), chunks=(1,), maxshape=(None,))
        f.create_dataset("ea_gz", data=np.arange(30000, dtype="<f8"), chunks=(3,), maxshape=(None,), compression="gzip")
        f.create_dataset("ea_axis1", data=np.arange(2800, dtype="<i2").reshape(4, 700), chunks=(2, 3),
                         maxshape=(4, None))
        d = f.create_dataset("ea_sparse", shape=(0, 5), dtype="<f4", chunks=(2, 5), maxshape=(None, 5), fillvalue=-1)
        d.resize((9, 5))
        d[7:9] = 1
        d[0] = 2
        f.create_dataset("fa", data=np.arange(3000, dtype="<i4"), chunks=(1,))
        s = f.create_dataset("fa_sparse", shape=(5000,), dtype="<i2", chunks=(1,), fillvalue=9)
        s[4000:4100] = 1
        f.create_dataset("bt2", data=np.arange(3000, dtype=">i4").reshape(100, 30), chunks=(1, 1),
                         maxshape=(None, None))
    with h5py.File(p, "r") as h:
        for name in h:
            np.testing.assert_array_equal(read(p, name), h[name][()], err_msg=name)
        np.testing.assert_array_equal(read(p, "ea", selection=(slice(149000, 151000, 7),)), h["ea"][149000:151000:7])


def test_groups_nested(tmp_path):
    p = tmp_path / "g.h5"
    with h5py.File(p, "w") as f:
        f.create_group("a/b/c")["x"] = np.arange(4.0)
        f["a"].attrs["level"] = 1
        f["a/b"]["y"] = np.ones((2, 2), "i4")
    _, _, attrs, groups = c_vars(p)
    assert groups == ["a"]
    _, _, attrs, groups = c_vars(p, "a")
    assert groups == ["b"] and attrs == {"level": {"type": "<i8", "value": [1]}}
    np.testing.assert_array_equal(read(p, "x", group="a/b/c"), np.arange(4.0))
    compare_h5py(p, "a/b")
    with pytest.raises(ferry.FerryError, match='no group "q"'):
        c_open(p, "a/q")


def test_netcdf4_python_file(tmp_path):
    netCDF4 = pytest.importorskip("netCDF4")
    p = tmp_path / "n.nc"
    rng = np.random.default_rng(2)
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("time", None)
        nc.createDimension("lev", None)
        nc.createDimension("lat", 4)
        nc.createDimension("lon", 5)
        nc.createDimension("nchar", 6)
        for i in range(10):                                      # > 8 attributes: dense
            setattr(nc, f"g{i}", f"value {i}")
        nc.history = "made by the test"
        t = nc.createVariable("time", "f8", ("time",))
        t.units = "days since 2000-01-01"
        t[:] = np.arange(3)
        lat = nc.createVariable("lat", "f4", ("lat",))
        lat[:] = np.linspace(-45, 45, 4)
        v = nc.createVariable("temp", "f4", ("time", "lat", "lon"), zlib=True, complevel=4, shuffle=True,
                              fill_value=np.float32(-999), chunksizes=(1, 2, 5))
        v.units = "K"
        v.valid_range = np.array([0, 400], "f4")
        v[:] = rng.standard_normal((3, 4, 5)).astype("f4")
        w = nc.createVariable("w", "i4", ("time", "lev"))        # two unlimited dimensions
        w[0:2, 0:3] = np.arange(6).reshape(2, 3)
        c = nc.createVariable("code", "S1", ("lat", "nchar"))
        c[:] = netCDF4.stringtochar(np.array(["abc", "de", "f", "ghijkl"], "S6"))
        e = nc.createVariable("big", ">i8", ("lat",), endian="big")
        e[:] = [1, -2, 3, 1 << 40]
        for i in range(10):                                      # > 8 variables: dense links
            nc.createVariable(f"v{i}", "u2", ("lon",))[:] = np.full(5, i)
        g = nc.createGroup("forecast")
        g.createDimension("step", 2)
        h = g.createVariable("h", "f8", ("step", "lat"))
        h[:] = np.arange(8.0).reshape(2, 4)
        g.createGroup("inner").createVariable("k", "i2", ("lon",))[:] = np.arange(5)

    cv, dims, attrs, groups = c_vars(p)
    with netCDF4.Dataset(p) as nc:
        assert list(cv) == [n for n in nc.variables]             # creation order
        assert dims == {n: {"size": len(d), "unlimited": d.isunlimited()} for n, d in nc.dimensions.items()}
        assert list(attrs) == nc.ncattrs()
        assert groups == ["forecast"]
        nc.set_auto_mask(False)
        with ferry.open(p) as f:
            for name, var in nc.variables.items():
                v = f[name]
                assert v.dims == var.dimensions, name
                if name == "w":   # written 2 x 3, padded to the unlimited dimensions' 3 x 3 with the fill value
                    got = v.read()
                    assert got.shape == var.shape == (3, 3)
                    np.testing.assert_array_equal(got[:2], var[:2, :])
                    assert (got[2] == netCDF4.default_fillvals["i4"]).all()
                    continue
                np.testing.assert_array_equal(v.read(), var[...], err_msg=name)
                for k in var.ncattrs():
                    same_attr(v.attrs[k], var.getncattr(k))
            for k in nc.ncattrs():
                same_attr(f.attrs[k], nc.getncattr(k))
        assert json.loads(cv["temp"]["fill"]) == -999
        assert cv["temp"]["codecs"] == "zlib(level=4) shuffle"
        g = nc["forecast"]
        gv, gdims, _, ggroups = c_vars(p, "forecast")
        assert ggroups == ["inner"] and gdims["step"] == {"size": 2, "unlimited": False}
        assert json.loads(gv["h"]["dims"]) == ["step", "lat"]           # lat from the parent group
        np.testing.assert_array_equal(read(p, "h", group="forecast"), g["h"][...])
        np.testing.assert_array_equal(read(p, "k", group="forecast/inner"), g["inner"]["k"][...])


def write_strings(p):
    """netCDF4-python's string variables: contiguous, chunked with zlib, a fill value over
    unwritten elements, an unlimited one with chunks never written, a scalar, and one of
    100,000 elements (hundreds of heap collections)."""
    netCDF4 = pytest.importorskip("netCDF4")
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("x", 5)
        nc.createDimension("y", 3)
        nc.createDimension("t", None)
        nc.createDimension("n", 100_000)
        nc.createVariable("s", str, ("x",), contiguous=True)[:] = np.array(
            ["a", "", "h\u00e9llo \u2713 \U0001f600", "zz", " pad "], object)
        nc.createVariable("z", str, ("x", "y"), zlib=True, complevel=6, chunksizes=(2, 2))[:] = np.array(
            [[f"r{i}c{j}" * (i + j) for j in range(3)] for i in range(5)], object)
        m = nc.createVariable("m", str, ("x",), fill_value="N/A")
        m[0] = "first"
        m[3] = "fourth"
        t = nc.createVariable("t", str, ("t",), chunksizes=(2,))
        t[0] = "t0"
        t[7] = "t7"
        nc.createVariable("sc", str, ())[0] = "scalar"
        nc.createVariable("num", "i4", ("y",))[:] = [1, 2, 3]
        nc.createVariable("many", str, ("n",), zlib=True, chunksizes=(8192,))[:] = np.array(
            [f"v{i}" * (i % 7) for i in range(100_000)], object)


def test_netcdf4_strings_read_in_c(tmp_path):
    """Variable-length strings read by the C library (references by a plan, then the
    global heap), equal to netCDF4's values, for every layout and selection."""
    netCDF4 = pytest.importorskip("netCDF4")
    p = tmp_path / "s.nc"
    write_strings(p)
    cv, *_ = c_vars(p)
    with netCDF4.Dataset(p) as nc:
        for name in ("s", "z", "m", "t", "sc", "many"):
            v = cv[name]
            assert v["error"] is None and v["dtype"] == "str" and v["typestr"] == "|O", name
            want = np.asarray(nc[name][...] if name != "sc" else nc[name].getValue(), dtype=object)
            got = read(p, name)
            assert got.dtype == object and got.shape == want.shape, name
            assert got.tolist() == want.tolist(), name
        assert json.loads(cv["m"]["fill"]) == "N/A"
        z = np.asarray(nc["z"][...], dtype=object)
        assert read(p, "z", selection=(slice(1, 5, 3), slice(0, 3, 2))).tolist() == z[1:5:3, 0:3:2].tolist()
        assert read(p, "z", selection=(2, 1)).shape == () and read(p, "z", selection=(2, 1))[()] == z[2, 1]
        assert read(p, "many", selection=(slice(99_990, None),)).tolist() == \
            np.asarray(nc["many"][99_990:], object).tolist()
        assert read(p, "z", selection=(slice(2, 2), slice(None))).shape == (0, 3)
    d = c_open(p)
    try:
        assert d.read_strings("s", [(1, 4, 2)]) == ["", "zz"]
        assert d.read_strings("sc") == ["scalar"]
        with pytest.raises(ferry.FerryError, match="ferry_dataset_read_strings"):
            ferry.Plan().read(d, "s", np.empty(80, np.uint8))
        with pytest.raises(ferry.FerryError, match="not variable-length strings"):
            d.read_strings("num")
    finally:
        d.close()
    with pytest.raises(ferry.FerryError, match="numpy array of str on the CPU"):
        with ferry.open(p) as f:
            f["s"].read(out=np.empty(5, object))


def test_h5py_string_dtype_read_in_c(tmp_path):
    p = tmp_path / "h.h5"
    u = np.array(["\u03b1", "", "\u03b2 \u03b3", "plain"], object)
    a = np.array([["x", "yy"], ["", "zzz"]], object)
    with h5py.File(p, "w") as f:
        f.create_dataset("u", data=u, dtype=h5py.string_dtype())
        f.create_dataset("a", data=a, dtype=h5py.string_dtype("ascii"), chunks=(1, 2), compression="gzip",
                         shuffle=True)
        f.create_dataset("late", data=u, dtype=h5py.string_dtype(), chunks=(2,), maxshape=(None,))
        f.create_dataset("sc", data="one", dtype=h5py.string_dtype())
    with h5py.File(p, "r") as f:
        for name in ("u", "a", "late", "sc"):
            want = f[name].asstr()[()]
            got = read(p, name)
            assert np.asarray(got, object).tolist() == np.asarray(want, object).tolist(), name


def test_string_reads_are_bounded(tmp_path):
    """A selection of more strings than one read takes is refused saying so (read in parts),
    before anything is allocated for it; a part of it reads (unwritten: the fill, "")."""
    p = tmp_path / "big.h5"
    with h5py.File(p, "w") as f:
        f.create_dataset("s", shape=(1 << 27,), dtype=h5py.string_dtype(), chunks=(1 << 20,))
    d = c_open(p)
    try:
        with pytest.raises(ferry.FerryError, match="read it in parts"):
            d.read_strings("s")
        assert d.read_strings("s", [(5, 8, 1)]) == ["", "", ""]
    finally:
        d.close()


def test_variable_length_sequences_still_refused(tmp_path):
    netCDF4 = pytest.importorskip("netCDF4")
    p = tmp_path / "vl.nc"
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("n", 2)
        vt = nc.createVLType(np.int32, "ragged")
        v = nc.createVariable("r", vt, ("n",))
        v[0] = np.array([1, 2], np.int32)
        v[1] = np.array([3], np.int32)
        nc.createVariable("ok", "i4", ("n",))[:] = [1, 2]
    cv, *_ = c_vars(p)
    assert "variable-length sequences" in cv["r"]["error"] and "vl.nc: byte " in cv["r"]["error"]
    with pytest.raises(ferry.FerryError, match="variable-length sequences"):
        read(p, "r")
    np.testing.assert_array_equal(read(p, "ok"), [1, 2])


def _patch(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new):]


def test_damaged_global_heap_refused_by_name(tmp_path):
    """A heap that lies (no collection there, an object missing, a collection longer than
    the file, a string longer than its object) is an error naming the file, the byte and the
    variable, never text made up."""
    netCDF4 = pytest.importorskip("netCDF4")
    p = tmp_path / "g.nc"
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("x", 3)
        nc.createVariable("s", str, ("x",), contiguous=True)[:] = np.array(["alpha", "beta", "gamma"], object)
    data = p.read_bytes()
    # the references: contiguous data, 16 bytes an element (length, collection, index)
    off = c_vars(p)[0]["s"]["data_offset"]
    length, coll, ix = np.frombuffer(data[off:off + 16], "<u4")[0], int.from_bytes(data[off + 4:off + 12], "little"), \
        int.from_bytes(data[off + 12:off + 16], "little")
    assert length == 5 and ix >= 1 and data[coll:coll + 4] == b"GCOL"
    cases = {
        "no global heap collection": _patch(data, coll, b"XCOL"),
        "global heap object 77 not found": _patch(data, off + 12, (77).to_bytes(4, "little")),
        "global heap collection of": _patch(data, coll + 8, (len(data) * 4).to_bytes(8, "little")),
        "a string of 200 bytes in a": _patch(data, off, (200).to_bytes(4, "little")),
        "outside the file": _patch(data, off + 4, (len(data) + 8).to_bytes(8, "little")),
    }
    for want, bad in cases.items():
        q = tmp_path / "bad.nc"
        q.write_bytes(bad)
        with pytest.raises(ferry.FerryError, match=want) as ei:
            read(q, "s")
        assert "bad.nc: byte " in str(ei.value) and "/s" in str(ei.value), str(ei.value)


def test_committed_types(tmp_path):
    # netCDF-4 user-defined types are committed datatypes: variables and attributes point at them
    netCDF4 = pytest.importorskip("netCDF4")
    p = tmp_path / "e.nc"
    with netCDF4.Dataset(p, "w") as nc:
        et = nc.createEnumType(np.uint8, "cloud", {"clear": 0, "cumulus": 1, "stratus": 2})
        nc.createDimension("t", 4)
        v = nc.createVariable("c", et, ("t",), fill_value=255)
        v[:] = np.array([0, 1, 2, 1], "u1")
    with h5py.File(p, "a") as f:
        f.attrs.create("kind", np.array([2], "u1"), dtype=f["cloud"])
        f.attrs["deep"] = np.zeros((1,) * 20)                  # more dimensions than ferry has: null
    cv, _, attrs, _ = c_vars(p)
    assert attrs["deep"] is None
    assert cv["c"]["typestr"] == "|u1" and json.loads(cv["c"]["fill"]) == 255
    assert attrs["kind"] == {"type": "|u1", "value": [2]}
    np.testing.assert_array_equal(read(p, "c"), [0, 1, 2, 1])


def test_unreadable_dataset_leaves_the_rest(tmp_path):
    p = tmp_path / "deep.h5"
    with h5py.File(p, "w") as f:
        f["deep"] = np.zeros((1,) * 20)                 # more dimensions than ferry has
        f["x"] = np.arange(3)
    cv, *_ = c_vars(p)
    assert "deep.h5: byte " in cv["deep"]["error"] and "/deep: 20 dimensions (at most 16)" in cv["deep"]["error"]
    with pytest.raises(ferry.FerryError, match="20 dimensions"):
        read(p, "deep")
    np.testing.assert_array_equal(read(p, "x"), np.arange(3))


def test_h5netcdf_files(tmp_path):
    h5netcdf = pytest.importorskip("h5netcdf")
    p = tmp_path / "h.nc"
    with h5netcdf.File(p, "w") as f:
        f.dimensions = {"t": None, "x": 3}
        v = f.create_variable("v", ("t", "x"), "f8", chunks=(2, 3), compression="gzip", shuffle=True)
        v.resize_dimension("t", 4) if hasattr(v, "resize_dimension") else f.resize_dimension("t", 4)
        v[:] = np.arange(12.0).reshape(4, 3)
        v.attrs["units"] = "m/s"
        f.create_variable("x", ("x",), "i4", data=np.array([10, 20, 30]))
    cv, dims, *_ = c_vars(p)
    assert dims == {"t": {"size": 4, "unlimited": True}, "x": {"size": 3, "unlimited": False}}
    assert json.loads(cv["v"]["dims"]) == ["t", "x"]
    np.testing.assert_array_equal(read(p, "v"), np.arange(12.0).reshape(4, 3))
    compare_h5py(p)


def test_xarray_written_file_reads_in_c(tmp_path):
    xr = pytest.importorskip("xarray")
    pytest.importorskip("netCDF4")
    t = np.random.default_rng(0).standard_normal((4, 5, 6)).astype(np.float32)
    ds = xr.Dataset({"t": (("time", "y", "x"), t, {"units": "K"})},
                    coords={"time": np.arange(4), "x": np.linspace(0, 1, 6)})
    p = tmp_path / "era.nc"
    ds.to_netcdf(p, encoding={"t": {"zlib": True, "chunksizes": (1, 5, 6)}})
    with ferry.open(p) as f:
        assert type(f).__name__ == "Opened" and f.format == "hdf5"
        assert f["t"].dims == ("time", "y", "x") and f["t"].attrs["units"] == "K"
        np.testing.assert_array_equal(f["t"][1:3, :, 2], t[1:3, :, 2])


@pytest.mark.parametrize("kind", ["zstd", "blosc", "lz4", "bitshuffle"])
def test_plugin_filters(tmp_path, kind):
    hdf5plugin = pytest.importorskip("hdf5plugin")
    p = tmp_path / f"{kind}.h5"
    x = np.arange(2000, dtype="<f4").reshape(40, 50)
    opts = {"zstd": hdf5plugin.Zstd(), "blosc": hdf5plugin.Blosc(cname="lz4", shuffle=hdf5plugin.Blosc.SHUFFLE),
            "lz4": hdf5plugin.LZ4(), "bitshuffle": hdf5plugin.Bitshuffle()}[kind]
    try:
        with h5py.File(p, "w") as f:
            f.create_dataset("x", data=x, chunks=(10, 25), **opts)
    except ValueError as e:   # a plugin built for another HDF5 than h5py's
        pytest.skip(f"hdf5plugin cannot write {kind} with this h5py: {e}")
    np.testing.assert_array_equal(read(p, "x"), x)
    np.testing.assert_array_equal(read(p, "x", selection=(slice(5, 35), 7)), x[5:35, 7])


def test_bitshuffle_and_lz4_framings(tmp_path):
    """hdf5plugin's bitshuffle (plain, lz4, zstd; default and small blocks; element
    counts that leave a partial block and fewer than 8 trailing elements) and lz4
    (several blocks), every element type size; truncated and flipped chunks refused."""
    hdf5plugin = pytest.importorskip("hdf5plugin")
    p = tmp_path / "bs.h5"
    rng = np.random.default_rng(5)
    x = (np.arange(40 * 150, dtype="<f4").reshape(40, 150) * 1.37) % 97
    kinds = {"bs_lz4": hdf5plugin.Bitshuffle(), "bs_none": hdf5plugin.Bitshuffle(cname="none"),
             "bs_zstd": hdf5plugin.Bitshuffle(cname="zstd"), "bs_small": hdf5plugin.Bitshuffle(nelems=256),
             "lz4": hdf5plugin.LZ4(), "lz4_blocks": hdf5plugin.LZ4(nbytes=1024)}
    try:
        with h5py.File(p, "w") as f:
            for k, o in kinds.items():
                f.create_dataset(k, data=x, chunks=(13, 77), **o)
            for dt in ("u1", "<i2", ">i4", "<f8", "<c16"):
                f.create_dataset(f"t{dt[-2:]}", data=(rng.standard_normal(1001) * 50).astype(dt), chunks=(333,),
                                 **hdf5plugin.Bitshuffle())
    except ValueError as e:
        pytest.skip(f"hdf5plugin cannot write with this h5py: {e}")
    cv, *_ = c_vars(p)
    with h5py.File(p, "r") as h:
        for name in h:
            assert cv[name]["error"] is None, name
            np.testing.assert_array_equal(read(p, name), h[name][()], err_msg=name)
    assert cv["bs_zstd"]["codecs"] == "bitshuffle(hdf5_filter=32008,zstd)" and cv["lz4"]["codecs"] == "lz4(hdf5_filter=32004)"
    assert cv["bs_none"]["codecs"] == "bitshuffle(hdf5_filter=32008,none)"
    # a chunk cut short or flipped: a FerryError, never other values
    data = p.read_bytes()
    with h5py.File(p, "r") as h:
        off = h["bs_lz4"].id.get_chunk_info(0).byte_offset
    for at in (off + 3, off + 9, off + 14, off + 40):
        b = bytearray(data)
        b[at] ^= 0x5A
        q = tmp_path / "flip.h5"
        q.write_bytes(bytes(b))
        try:
            got = read(q, "bs_lz4")
        except ferry.FerryError as e:
            assert "flip.h5" in str(e)
            continue
        with h5py.File(q, "r") as h:   # read: only where the flip left the chunk decodable to the same values
            np.testing.assert_array_equal(got, h["bs_lz4"][()])


def test_unknown_filter_refused_by_name_and_id(tmp_path):
    p = tmp_path / "lzf.h5"
    with h5py.File(p, "w") as f:
        f.create_dataset("x", data=np.arange(100), chunks=(10,), compression="lzf")
    cv, *_ = c_vars(p)
    assert 'HDF5 filter 32000 ("lzf") has no ferry codec' in cv["x"]["error"]
    assert cv["x"]["error"].endswith("(unsupported)") and cv["x"]["codecs"] == "lzf(hdf5_filter=32000)"
    with pytest.raises(ferry.FerryError, match='filter 32000 \\("lzf"\\)'):
        read(p, "x")


def test_empty_datasets_and_attributes(tmp_path):
    """h5py.Empty (a null dataspace): a dataset of no values is described with an
    error, an attribute is empty; the rest of the file reads (netCDF4 refuses the file)."""
    p = tmp_path / "empty.h5"
    with h5py.File(p, "w") as f:
        f["x"] = np.arange(3.0)
        f.create_dataset("e", data=h5py.Empty("f4"))
        f.attrs["ea"] = h5py.Empty("f8")
        f.attrs["es"] = h5py.Empty("S5")
    cv, _, attrs, _ = c_vars(p)
    assert "null dataspace" in cv["e"]["error"]
    assert attrs == {"ea": {"type": "<f8", "value": []}, "es": ""}
    np.testing.assert_array_equal(read(p, "x"), np.arange(3.0))
    with pytest.raises(ferry.FerryError, match="null dataspace"):
        read(p, "e")


def test_cli_info_describes_netcdf4(tmp_path):
    netCDF4 = pytest.importorskip("netCDF4")
    if not os.path.exists(FERRY):
        pytest.skip(f"{FERRY} not built (make cli)")
    p = tmp_path / "i.nc"
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("time", None)
        v = nc.createVariable("v", "f4", ("time",), zlib=True)
        v[:] = np.arange(3)
    r = subprocess.run([FERRY, "info", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "hdf5" in r.stdout and "codecs zlib" in r.stdout and '"time":{"size":3,"unlimited":true}' in r.stdout
    q = tmp_path / "s.nc"
    write_strings(q)
    r = subprocess.run([FERRY, "info", str(q)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.split()[:1] == ["z"])
    assert line.split()[1] == "string" and "chunks (2, 2) codecs zlib(level=6)" in line, r.stdout
    assert "references [" in next(x for x in r.stdout.splitlines() if x.split()[:1] == ["s"])
    assert "unreadable" not in r.stdout
    r = subprocess.run([FERRY, "info", "--json", str(q)], capture_output=True, text=True)
    v = {x["name"]: x for x in json.loads(r.stdout)["variables"]}
    assert v["m"]["dtype"] == "str" and v["m"]["typestr"] == "|O" and v["m"]["fill"] == "N/A"


def _damaged(tmp_path, data, name):
    q = tmp_path / name
    q.write_bytes(data)
    try:
        d = c_open(q)
    except ferry.FerryError as e:
        assert name in str(e)
        return
    try:
        for v in d.variables():
            try:
                ferry.read(q, v["name"])
            except ferry.FerryError:
                pass
    finally:
        d.close()


def test_truncations_and_bit_flips_fail_cleanly(tmp_path):
    netCDF4 = pytest.importorskip("netCDF4")
    p = tmp_path / "f.nc"
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("t", None)
        nc.createDimension("x", 4)
        v = nc.createVariable("v", "f4", ("t", "x"), zlib=True, fletcher32=True)
        v[:] = np.arange(8.0).reshape(2, 4)
        v.note = "n"
        nc.createVariable("c", "i2", ("x",))[:] = [1, 2, 3, 4]
    data = p.read_bytes()
    for cut in range(0, len(data), max(1, len(data) // 150)):
        _damaged(tmp_path, data[:cut], "cut.nc")
    rng = np.random.default_rng(3)
    for at in rng.integers(0, len(data), 300):
        b = bytearray(data)
        b[at] ^= 1 << int(rng.integers(0, 8))
        _damaged(tmp_path, bytes(b), "flip.nc")


def test_soft_links_that_multiply_the_work_are_refused(tmp_path):
    """Links whose paths pass through other links several times: each level triples the walks
    (3^20 here); the parser stops at its budget with a FerryError instead of running for ever."""
    p = str(tmp_path / "fan.h5")
    with h5py.File(p, "w") as f:
        f["x"] = np.arange(4)
        for i in range(20):
            f[f"L{i}"] = h5py.SoftLink(f"/L{i + 1}/L{i + 1}/L{i + 1}")
        f["L20"] = h5py.SoftLink("/")
    with pytest.raises(ferry.FerryError, match="soft links ask for more than 65536 resolutions"):
        ferry.open(p)
