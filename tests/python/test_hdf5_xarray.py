"""engine="ferry" on netCDF-4 / HDF5 through the C parser: encodings key by key as the netcdf4
engine gives them, links (soft followed, dangling and external refused by name), the h5py
fallback only for what the parser refuses, and ferry.open without h5py or xarray."""
import os
import subprocess
import sys

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
netCDF4 = pytest.importorskip("netCDF4")
h5py = pytest.importorskip("h5py")
import ferry  # noqa: E402
from ferry import xarray as fx  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_variety(p):
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("t", None)
        nc.createDimension("x", 6)
        nc.createVariable("x", "f8", ("x",))[:] = np.arange(6.0)
        nc.createVariable("big", ">i4", ("t", "x"), endian="big", zlib=True, complevel=9)[:] = \
            np.arange(12).reshape(2, 6)
        nc.createVariable("cont", "f4", ("x",), contiguous=True)[:] = np.ones(6)
        nc.createVariable("never", "f4", ("x",), contiguous=True)
        v = nc.createVariable("sh", "f4", ("t", "x"), zlib=True, shuffle=True, fletcher32=True,
                              chunksizes=(1, 3), fill_value=np.float32(-1))
        v[:] = np.ones((2, 6))
        nc.createVariable("zs", "f4", ("t", "x"), compression="zstd", complevel=5)[:] = np.ones((2, 6))
        nc.createVariable("sc", "f8", ())[...] = 3.0
        nc.createVariable("lsd", "f4", ("x",), zlib=True, least_significant_digit=2)[:] = np.ones(6)
        c = nc.createVariable("chars", "S1", ("x",), fill_value=b"z")
        c[:3] = np.array([b"a", b"b", b"c"])
        g = nc.createGroup("grp")
        g.createVariable("y", "u1", ("x",), fletcher32=True)[:] = np.arange(6)


@pytest.mark.parametrize("group", [None, "grp"])
def test_encodings_equal_netcdf4s_key_by_key(tmp_path, group):
    p = tmp_path / "e.nc"
    write_variety(p)
    ref = xr.open_dataset(p, engine="netcdf4", group=group)
    got = xr.open_dataset(p, engine="ferry", group=group)
    xr.testing.assert_identical(got.load(), ref.load())
    assert got.encoding == ref.encoding
    for k in ref.variables:
        assert got[k].encoding == ref[k].encoding, k
        assert not [e for e in got[k].encoding if e.startswith("ferry")], k
    for k in ref.variables:   # no fallback reader in play: every variable is the engine's
        store = fx.FerryStore(str(p), group=group)
        assert store.specs[k].kind == "ferry", k
        store.close()


def test_soft_links_followed_dangling_and_external_refused(tmp_path):
    base = xr.Dataset({"a": ("x", np.arange(3.0))})
    p = tmp_path / "soft.nc"
    base.to_netcdf(p, engine="netcdf4")
    with h5py.File(p, "a") as f:
        f["alias"] = h5py.SoftLink("/a")
        f.create_group("sub")["rel"] = h5py.SoftLink("../a")   # relative paths: HDF5 has no "..": dangling
    # the valid link reads as netCDF4 reads it; the relative one names nothing (netCDF4 refuses)
    with pytest.raises(ferry.FerryError, match='soft link "rel" to "../a": no such object') as ei:
        xr.open_dataset(p, engine="ferry")
    assert str(p) in str(ei.value)
    with h5py.File(p, "a") as f:
        del f["sub"]
    xr.testing.assert_identical(xr.open_dataset(p, engine="ferry").load(), xr.open_dataset(p, engine="netcdf4").load())

    # a soft link up the tree names a group listed where it lives: no cycle to walk
    with h5py.File(p, "a") as f:
        f.create_group("g")["x"] = np.arange(2.0)
        f["g"]["root"] = h5py.SoftLink("/")
    groups = xr.open_groups(p, engine="ferry")
    assert set(groups) == {"/", "/g"}
    np.testing.assert_array_equal(groups["/g"]["x"].values, np.arange(2.0))

    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["v"] = np.arange(5.0)
    q = tmp_path / "ext.nc"
    base.to_netcdf(q, engine="netcdf4")
    with h5py.File(q, "a") as f:
        f["ext"] = h5py.ExternalLink("other.h5", "/v")
    for call in (lambda: xr.open_dataset(q, engine="ferry"), lambda: ferry.open(q)):
        with pytest.raises(ferry.FerryError, match='"ext" is an external link to "/v" in the file "other.h5"') as ei:
            call()
        assert str(q) in str(ei.value)
    # an external link in another group: the group opened reads; the linking group is refused
    r = tmp_path / "ext_in_group.nc"
    base.to_netcdf(r, engine="netcdf4")
    with h5py.File(r, "a") as f:
        f.create_group("sub")["ext"] = h5py.ExternalLink("other.h5", "/v")
    xr.testing.assert_identical(xr.open_dataset(r, engine="ferry").load(), base)
    with pytest.raises(ferry.FerryError, match='"ext" is an external link to "/v" in the file "other.h5"'):
        xr.open_dataset(r, engine="ferry", group="sub")


def test_damage_in_another_group_refuses_the_file(tmp_path):
    """netCDF4 reads every group's metadata at open and refuses a file damaged in any
    of them; so does ferry, whichever group is opened."""
    p = tmp_path / "g.nc"
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("x", 3)
        nc.createVariable("a", "f4", ("x",))[:] = [1, 2, 3]
        g = nc.createGroup("other")
        v = g.createVariable("secret_name_b", "i2", ("x",))
        v.setncattr("marker_attribute", "m" * 40)
    raw = bytearray(p.read_bytes())
    at = raw.index(b"marker_attribute")
    raw[at - 40:at] = b"\xff" * 40          # the attribute message's header before its name
    p.write_bytes(bytes(raw))
    with pytest.raises(Exception):
        netCDF4.Dataset(p).close()
    with pytest.raises(ferry.FerryError) as ei:
        xr.open_dataset(p, engine="ferry")
    assert str(p) in str(ei.value)


def test_variable_named_like_a_dimension_it_does_not_use(tmp_path):
    """netCDF-C stores "lat"(x, lat) as "_nc4_non_coord_lat": read under its netCDF name."""
    p = tmp_path / "nc.nc"
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("lat", 3)
        nc.createDimension("x", 4)
        nc.createVariable("lat", "f4", ("x", "lat"))[:] = np.arange(12).reshape(4, 3)
        nc.createVariable("other", "i2", ("lat",))[:] = [1, 2, 3]
    ref = xr.open_dataset(p, engine="netcdf4")
    got = xr.open_dataset(p, engine="ferry")
    xr.testing.assert_identical(got.load(), ref.load())
    with ferry.open(p) as f:
        np.testing.assert_array_equal(f["lat"].read(), np.arange(12).reshape(4, 3))


def test_empty_dataset_left_out_empty_attributes_kept(tmp_path, caplog):
    """h5py.Empty: netCDF4 refuses the whole file for an empty dataset; ferry reads the
    rest, leaves the dataset out (logged once) and gives empty attributes as netCDF4 does."""
    import logging
    p = tmp_path / "empty.h5"
    with h5py.File(p, "w") as f:
        f["x"] = np.arange(3.0)
        f.create_dataset("e", data=h5py.Empty("f4"))
        f.attrs["ea"] = h5py.Empty("f8")
        f.attrs["es"] = h5py.Empty("S5")
    with caplog.at_level(logging.INFO, logger="ferry"):
        got = xr.open_dataset(p, engine="ferry").load()
    assert "variable e is left out" in caplog.text and "null dataspace" in caplog.text
    assert list(got.variables) == ["x"] and got.attrs["es"] == "" and got.attrs["ea"].size == 0
    np.testing.assert_array_equal(got["x"].values, np.arange(3.0))


def test_ferry_open_needs_neither_h5py_nor_xarray(tmp_path):
    p = tmp_path / "n.nc"
    write_variety(p)
    code = ("import sys; sys.modules['h5py'] = None; sys.modules['xarray'] = None\n"
            "import ferry, numpy as np\n"
            f"f = ferry.open({str(p)!r})\n"
            "assert type(f).__name__ == 'Opened'\n"
            "np.testing.assert_array_equal(f['big'].read(), np.arange(12).reshape(2, 6))\n"
            "assert 'h5py' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
            "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_refused_variable_without_h5py_says_what_to_install(tmp_path):
    p = tmp_path / "s.h5"
    with h5py.File(p, "w") as f:   # variable-length sequences: still h5py's
        r = f.create_dataset("r", shape=(2,), dtype=h5py.vlen_dtype(np.int32))
        r[0], r[1] = np.array([1, 2], np.int32), np.array([3], np.int32)
        f["v"] = np.array([1, 2], "i4")
        f["s"] = np.array(["a", "bb"], object)
    code = ("import sys; sys.modules['h5py'] = None\n"
            "import xarray as xr, ferry\n"
            f"ds = xr.open_dataset({str(p)!r}, engine='ferry')\n"
            "assert ds['v'].values.tolist() == [1, 2] and ds['s'].values.tolist() == ['a', 'bb']\n"
            "try:\n"
            "    ds['r'].values\n"
            "except ferry.FerryError as e:\n"
            "    assert 'variable-length sequences' in str(e) and 'install h5py' in str(e), e\n"
            f"    assert {str(p)!r} in str(e)\n"
            "    print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


# ---------------------------------------------------------------------------
# variable-length strings: read by the C library
# ---------------------------------------------------------------------------
def write_strings(p):
    """netCDF4-python's string variables: 1-D and 2-D, chunked with zlib and contiguous,
    "" and non-ASCII text, missing values (a _FillValue over unwritten elements, an
    unlimited dimension with chunks never written), a string coordinate and a scalar."""
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("x", 5)
        nc.createDimension("y", 3)
        nc.createDimension("t", None)
        nc.createVariable("x", str, ("x",))[:] = np.array(list("abcde"), object)
        s = nc.createVariable("s", str, ("x",), contiguous=True)
        s[:] = np.array(["a", "", "h\u00e9llo \u2713 \U0001f600", "zz", " pad "], object)
        s.long_name = "text"
        z = nc.createVariable("z", str, ("x", "y"), zlib=True, complevel=6, shuffle=True, chunksizes=(2, 2))
        z[:] = np.array([[f"r{i}c{j}\u00df" * (i + j) for j in range(3)] for i in range(5)], object)
        m = nc.createVariable("m", str, ("x",), fill_value="N/A")
        m[0] = "first"
        m[3] = "fourth"
        t = nc.createVariable("t", str, ("t",), chunksizes=(2,))
        t[0] = "t0"
        t[6] = "t6"
        nc.createVariable("sc", str, ())[0] = "scalar"
        nc.createVariable("f", "f4", ("x",))[:] = np.arange(5.0)


def assert_same(p, ref_engine, ref_kw=None, **kw):
    ref = xr.open_dataset(p, engine=ref_engine, **kw, **(ref_kw or {}))
    got = xr.open_dataset(p, engine="ferry", **kw)
    for k in ref.variables:
        assert got[k].dtype == ref[k].dtype, k
        assert got[k].attrs == ref[k].attrs, k
    xr.testing.assert_identical(got.load(), ref.load())
    return got, ref


@pytest.mark.parametrize("decode_cf", [True, False])
def test_strings_identical_to_netcdf4_and_h5netcdf(tmp_path, decode_cf):
    p = tmp_path / "s.nc"
    write_strings(p)
    got, ref = assert_same(p, "netcdf4", decode_cf=decode_cf)
    for k in ref.variables:
        assert got[k].encoding == ref[k].encoding, k
    assert got.encoding == ref.encoding
    if decode_cf:   # the fill value masks as netCDF4's does
        assert got["m"].values[1] is np.nan or got["m"].values[1] != got["m"].values[1]
        assert got["m"].encoding["_FillValue"] == "N/A"
    else:
        assert got["m"].attrs["_FillValue"] == "N/A" and got["m"].values.tolist()[1] == "N/A"
    # h5py cannot read a string dataset's unwritten chunks from a read-only file ("no write
    # intent on file"): t is netCDF4's alone
    assert_same(p, "h5netcdf", decode_cf=decode_cf, drop_variables=["t"])
    store = fx.FerryStore(str(p))
    try:   # the C library's, not h5py's
        assert {k for k, s in store.specs.items() if s.kind == "strings"} == {"x", "s", "z", "m", "t", "sc"}
        assert store._h5 is None
    finally:
        store.close()
    # lazily indexed, and through dask
    lazy = xr.open_dataset(p, engine="ferry", decode_cf=decode_cf)
    np.testing.assert_array_equal(lazy["z"][1:5:2, ::2].values, ref["z"][1:5:2, ::2].values)
    np.testing.assert_array_equal(lazy["z"].isel(x=[4, 0, 2]).values, ref["z"].isel(x=[4, 0, 2]).values)
    pytest.importorskip("dask")
    xr.testing.assert_identical(xr.open_dataset(p, engine="ferry", chunks={}, decode_cf=decode_cf).load(),
                                xr.open_dataset(p, engine="netcdf4", chunks={}, decode_cf=decode_cf).load())


def test_h5py_string_dtype_identical(tmp_path):
    p = tmp_path / "h.h5"
    with h5py.File(p, "w") as f:
        f.create_dataset("u", data=np.array(["\u03b1", "", "\u03b2 \u03b3", "plain"], object),
                         dtype=h5py.string_dtype())
        f.create_dataset("c", data=np.array([[f"{i}{j}" * i for j in range(4)] for i in range(6)], object),
                         dtype=h5py.string_dtype(), chunks=(4, 2), compression="gzip", shuffle=True,
                         maxshape=(None, 4))
        f.create_dataset("sc", data="one", dtype=h5py.string_dtype())
    got, ref = assert_same(p, "netcdf4")
    for k in ref.variables:
        assert got[k].encoding == ref[k].encoding, k
    assert_same(p, "h5netcdf", ref_kw={"phony_dims": "sort"})


def test_many_strings_read_at_once(tmp_path):
    """100,000 strings over hundreds of heap collections: each collection read once."""
    p = tmp_path / "many.nc"
    want = np.array([f"value {i} " * (i % 5) for i in range(100_000)], object)
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("n", want.size)
        nc.createVariable("v", str, ("n",), zlib=True, chunksizes=(10_000,))[:] = want
    got = xr.open_dataset(p, engine="ferry")["v"].values
    assert got.tolist() == want.tolist()


def test_phony_dimensions_numbered_as_netcdf_c(tmp_path):
    """Datasets h5py added to a netCDF-4 file (no dimension scales) get phony dimensions named by
    the dimension id netCDF-C gives them, after the real ones: in the root of a file without
    subgroups, and in a subgroup (its own and its ancestors' real dimensions first)."""
    netCDF4 = pytest.importorskip("netCDF4")
    for with_group in (False, True):
        p = str(tmp_path / f"phony{int(with_group)}.nc")
        d = netCDF4.Dataset(p, "w")
        d.createDimension("x", 3)
        d.createDimension("y", 4)
        d.createVariable("v", "f4", ("x", "y"))[:] = 1
        if with_group:
            g = d.createGroup("g")
            g.createDimension("z", 5)
            g.createVariable("w", "f4", ("z",))[:] = 2
        d.close()
        with h5py.File(p, "a") as f:
            (f["g"] if with_group else f)["b"] = np.arange(18, dtype="f4").reshape(2, 9)
            (f["g"] if with_group else f)["c"] = np.zeros((9, 9), "f4")
        kw = {"group": "g"} if with_group else {}
        got, ref = assert_same(p, "netcdf4", **kw)
        assert got["b"].dims == ref["b"].dims and got["c"].dims == ref["c"].dims
        assert ref["b"].dims[0] != "phony_dim_0"
