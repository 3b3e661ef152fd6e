"""netCDF-4/HDF5 files (xarray's default format) through ferry.open,
ferry.read, `ferry info` and the C API: the C library recognises the HDF5
signature (also after a user block) and parses the file (src/formats/hdf5/;
tests/python/test_hdf5_c.py checks it in depth); ferry.open(format="hdf5")
still reads through the xarray backend's h5py path. Files are written by
netCDF4 / xarray / h5py in the tests; values are checked against them."""
import os
import subprocess

import numpy as np
import pytest

import ferry
from ferry import _ferry

h5py = pytest.importorskip("h5py")
pytest.importorskip("xarray")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FERRY = os.environ.get("FERRY_BIN", os.path.join(ROOT, "build", "ferry"))


@pytest.fixture
def nc4(tmp_path):
    import xarray as xr
    t = np.random.default_rng(0).standard_normal((4, 5, 6)).astype(np.float32)
    ds = xr.Dataset({"t": (("time", "y", "x"), t, {"units": "K"})},
                    coords={"time": np.arange(4), "x": np.linspace(0, 1, 6)})
    p = tmp_path / "era.nc"
    ds.to_netcdf(p, engine="h5netcdf" if _has("h5netcdf") else None,
                 encoding={"t": {"zlib": True, "chunksizes": (1, 5, 6)}} if _has("h5netcdf") or _has("netCDF4") else None)
    return p, t


def _has(mod):
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


def test_c_api_opens_it(nc4):
    p, t = nc4
    assert _ferry.hdf5_signature(str(p)) == 0
    with _ferry.Dataset(ferry.default_context(), str(p)) as d:
        assert d.format == "hdf5"
        v = d.variable("t")
        assert v["shape"] == (4, 5, 6) and v["typestr"] == "<f4" and v["dims"] == '["time","y","x"]'
        assert v["chunks"] == (1, 5, 6) and "zlib" in v["codecs"]


def test_ferry_open_and_read_netcdf4(nc4):
    p, t = nc4
    with ferry.open(p) as f:
        assert f.format == "hdf5" and "t" in f
        v = f["t"]
        assert v.shape == (4, 5, 6) and v.dtype == np.float32 and v.dims == ("time", "y", "x")
        assert v.attrs["units"] == "K"
        np.testing.assert_array_equal(v[1:3, :, 2], t[1:3, :, 2])
        np.testing.assert_array_equal(np.asarray(v), t)
        out = np.zeros((5, 6), np.float32)
        assert v.read(2, out=out) is out
        np.testing.assert_array_equal(out, t[2])
        with pytest.raises(ferry.FerryError):
            v.read(2, out=np.zeros((5, 6), np.float64))
    np.testing.assert_array_equal(ferry.read(p, "t"), t)
    with ferry.open(p, format="hdf5") as f:
        np.testing.assert_array_equal(f["t"][3], t[3])
    np.testing.assert_array_equal(ferry.read(p, "t", selection=(0, slice(1, 4))), t[0, 1:4])


def test_user_block_file(tmp_path):
    p = tmp_path / "ub.h5"
    x = np.arange(30, dtype=">i4").reshape(5, 6)
    with h5py.File(p, "w", userblock_size=1024) as f:
        f.create_dataset("x", data=x, chunks=(2, 6), compression="gzip", shuffle=True)
    assert _ferry.hdf5_signature(str(p)) == 1024
    np.testing.assert_array_equal(ferry.read(p, "x"), x)
    with ferry.open(p) as f:
        assert f["x"].dtype == np.dtype("=i4")


def test_cli_info_describes_it(nc4):
    p, _ = nc4
    if not os.path.exists(FERRY):
        pytest.skip(f"{FERRY} not built (make cli)")
    r = subprocess.run([FERRY, "info", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "hdf5" in r.stdout and "(4, 5, 6)" in r.stdout and "chunks (1, 5, 6)" in r.stdout


def test_xarray_sees_the_format_the_c_sniffer_sees(tmp_path):
    # the backend once sniffed formats in Python: HDF5 user blocks only up to 4096 bytes
    # (an 8192-byte one was "not a netCDF, HDF5 or Zarr file"), and a damaged x.nc got that
    # shrug instead of the netCDF-3 parser's message naming the byte
    import xarray as xr
    p = tmp_path / "ub.h5"
    t = np.arange(12, dtype=np.float32).reshape(3, 4)
    with h5py.File(p, "w", userblock_size=8192) as f:
        f["t"] = t
    assert _ferry.format_detect(p) == "hdf5" and _ferry.hdf5_signature(str(p)) == 8192
    with xr.open_dataset(p, engine="ferry") as ds:
        np.testing.assert_array_equal(ds["t"].values, t)
    bad = tmp_path / "bad.nc"
    bad.write_bytes(b"CDF\x09" + b"\0" * 60)
    with pytest.raises(ferry.FerryError, match="bad.nc"):
        xr.open_dataset(bad, engine="ferry")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\1" * 64)
    with pytest.raises(ValueError, match="not a netCDF, HDF5, Zarr or kerchunk reference file"):
        xr.open_dataset(junk, engine="ferry")
    npy = tmp_path / "a.npy"
    np.save(npy, t)
    with pytest.raises(ValueError, match="a npy file"):
        xr.open_dataset(npy, engine="ferry")
