"""engine="ferry" with device=0: data variables as cupy arrays on the GPU,
coordinates on the CPU, values identical to xarray's own engines (after
.as_numpy()). Also the extension's device side: ferry.Array on a GPU through
__cuda_array_interface__ and DLPack (cupy, torch), ferry.read(device=0).
Skips with a reason where there is no GPU or no cupy."""
import numpy as np
import pytest

xr = pytest.importorskip("xarray", reason="xarray is not installed")
cupy = pytest.importorskip("cupy", reason="cupy is not installed")
try:
    _NGPU = cupy.cuda.runtime.getDeviceCount()
except Exception:  # noqa: BLE001
    _NGPU = 0
if _NGPU == 0:
    pytest.skip("no CUDA device", allow_module_level=True)

import ferry  # noqa: E402
from ferry import xarray as fx  # noqa: E402, F401

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
# engine="ferry" once the package is installed (entry point); the class works either way
ENGINE = "ferry" if "ferry" in xr.backends.list_engines() else fx.FerryBackendEntrypoint


def make_ds(seed=0, nt=16, ny=20, nx=24):
    import pandas as pd
    rng = np.random.default_rng(seed)
    t = (rng.standard_normal((nt, ny, nx)) * 10 + 280).astype(np.float32)
    t[0, 0, :3] = np.nan
    ds = xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), t, {"units": "K"}),
            "precip": (("time", "lat", "lon"), rng.random((nt, ny, nx))),
            "count": (("time", "lat"), rng.integers(-100, 100, (nt, ny)).astype(np.int16)),
        },
        coords={"time": pd.date_range("2000-01-01", periods=nt, freq="D"),
                "lat": np.linspace(-80, 80, ny), "lon": np.linspace(0, 359, nx)},
        attrs={"title": "gpu"},
    )
    ds["packed"] = (("time", "lat", "lon"), (t - 273.15))
    ds["packed"].encoding.update({"dtype": "int16", "scale_factor": 0.01, "add_offset": 5.0,
                                  "_FillValue": np.int16(-32767)})
    ds["t2m"].encoding["_FillValue"] = np.float32(-999.0)
    return ds


@pytest.fixture(scope="module")
def nc3(tmp_path_factory):
    p = tmp_path_factory.mktemp("x") / "a.nc"
    make_ds().to_netcdf(p, engine="scipy")
    return p


def test_netcdf3_on_gpu_identical(nc3):
    ref = xr.open_dataset(nc3, engine="scipy").load()
    got = xr.open_dataset(nc3, engine=ENGINE, device=0)
    got.load()
    for v in ("t2m", "precip", "count", "packed"):
        assert isinstance(got[v].data, cupy.ndarray), v
    for c in ("time", "lat", "lon"):
        assert isinstance(got[c].data, np.ndarray), c
    xr.testing.assert_identical(got.as_numpy(), ref)
    # CF decoding happened on the GPU with xarray's dtypes
    assert got["packed"].dtype == ref["packed"].dtype
    assert "scale_factor" in got["packed"].encoding


def test_netcdf3_gpu_isel(nc3):
    ref = xr.open_dataset(nc3, engine="scipy")
    got = xr.open_dataset(nc3, engine=ENGINE, device="cuda:0")
    rng = np.random.default_rng(1)
    for _ in range(10):
        sel = {"time": int(rng.integers(0, 16)), "lat": slice(int(rng.integers(0, 10)), 20, 2),
               "lon": np.sort(rng.choice(24, 5, replace=False))}
        xr.testing.assert_identical(got.isel(sel).load().as_numpy(), ref.isel(sel).load())
    # the .sel path works: coordinates stay on the CPU
    xr.testing.assert_identical(got.sel(time="2000-01-03").load().as_numpy(),
                                ref.sel(time="2000-01-03").load())


def test_load_one_plan_staged_path(nc3):
    ctx = ferry.default_context()
    got = xr.open_dataset(nc3, engine=ENGINE, device=0)
    before = ctx.stats()
    got.load()
    after = ctx.stats()
    assert after["jobs"] - before["jobs"] == 1
    dev_bytes = sum(after[p]["bytes"] - before[p]["bytes"] for p in ("staged", "cufile"))
    assert dev_bytes > 0


def _write_h5(path, ds):
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w") as f:
        for name in ("lat", "lon"):
            d = f.create_dataset(name, data=ds[name].values)
            d.make_scale(name)
        tm = f.create_dataset("time", data=np.arange(ds.sizes["time"], dtype=np.int64), maxshape=(None,),
                              chunks=(8,))
        tm.attrs["units"] = "days since 2000-01-01"
        tm.make_scale("time")
        specs = {
            "t_contig": dict(),
            "t_chunked": dict(chunks=(4, 10, 12)),
            "t_gzip": dict(chunks=(4, 10, 12), compression="gzip", shuffle=True),
            "t_fletcher": dict(chunks=(3, 7, 24), compression="gzip", fletcher32=True),
        }
        t = ds["t2m"].values
        for n, kw in specs.items():
            d = f.create_dataset(n, data=t, **kw)
            for i, dim in enumerate(("time", "lat", "lon")):
                d.dims[i].attach_scale(f[dim])
        d = f.create_dataset("t_big", data=t.astype(">f4"), chunks=(4, 10, 12), compression="gzip")
        for i, dim in enumerate(("time", "lat", "lon")):
            d.dims[i].attach_scale(f[dim])
        d = f.create_dataset("sparse", shape=t.shape, dtype="f4", chunks=(4, 10, 12), fillvalue=-1.0)
        d[0:4, 0:10, 0:12] = t[0:4, 0:10, 0:12]
        for i, dim in enumerate(("time", "lat", "lon")):
            d.dims[i].attach_scale(f[dim])


def test_hdf5_on_gpu(tmp_path):
    h5py = pytest.importorskip("h5py")
    ds = make_ds(2)
    p = tmp_path / "h.h5"
    _write_h5(p, ds)
    cpu = xr.open_dataset(p, engine=ENGINE, device="cpu").load()
    gpu = xr.open_dataset(p, engine=ENGINE, device=0).load()
    for v in ("t_contig", "t_chunked", "t_gzip", "t_fletcher", "t_big", "sparse"):
        assert isinstance(gpu[v].data, cupy.ndarray), v
        assert fx.FerryStore(str(p)).specs[v].kind == "ferry", v
    xr.testing.assert_identical(gpu.as_numpy(), cpu)
    with h5py.File(p, "r") as f:
        for v in ("t_contig", "t_gzip", "t_big", "sparse"):
            np.testing.assert_array_equal(cupy.asnumpy(gpu[v].data), f[v][...])
    g = xr.open_dataset(p, engine=ENGINE, device=0)
    sub = g["t_gzip"].isel(time=slice(3, 9), lon=[1, 5, 7]).load()
    np.testing.assert_array_equal(cupy.asnumpy(sub.data), ds["t2m"].values[3:9][:, :, [1, 5, 7]])


def test_open_mfdataset_gpu_dask(tmp_path):
    pytest.importorskip("dask", reason="dask is not installed")
    full = make_ds(3)
    paths = []
    for i in range(2):
        p = tmp_path / f"p{i}.nc"
        full.isel(time=slice(8 * i, 8 * i + 8)).to_netcdf(p, engine="scipy")
        paths.append(p)
    ref = xr.open_mfdataset(paths, engine="scipy", combine="by_coords").compute()
    got = xr.open_mfdataset(paths, engine=ENGINE, device=0, combine="by_coords", parallel=True,
                            preprocess=fx.cupy_meta)
    assert isinstance(got["t2m"].data._meta, cupy.ndarray)
    out = got.compute()
    assert isinstance(out["t2m"].data, cupy.ndarray)
    xr.testing.assert_identical(out.as_numpy(), ref)


def test_open_mfdataset_cupy_chunks_by_default(tmp_path):
    """No preprocess: GPU variables are dask arrays of cupy chunks with cupy meta;
    coordinates stay numpy. netCDF-4 (written by h5py here) chunks follow the HDF5
    chunks under chunks={}."""
    pytest.importorskip("dask", reason="dask is not installed")
    pytest.importorskip("h5py")
    full = make_ds(4)
    paths = []
    for i in range(2):
        p = tmp_path / f"q{i}.nc"
        full.isel(time=slice(8 * i, 8 * i + 8)).to_netcdf(p, engine="scipy")
        paths.append(p)
    ref = xr.open_mfdataset(paths, engine="scipy", combine="by_coords").compute()
    got = xr.open_mfdataset(paths, engine=ENGINE, device=0, combine="by_coords", parallel=True)
    for v in ("t2m", "precip", "count", "packed"):
        assert isinstance(got[v].data._meta, cupy.ndarray), v
    out = got.compute()
    assert isinstance(out["t2m"].data, cupy.ndarray) and isinstance(out["time"].values, np.ndarray)
    xr.testing.assert_identical(out.as_numpy(), ref)
    h = tmp_path / "h.h5"
    _write_h5(h, make_ds(5))
    one = xr.open_dataset(h, engine=ENGINE, device=0, chunks={})
    assert isinstance(one["t_chunked"].data._meta, cupy.ndarray)
    import h5py
    with h5py.File(h, "r") as f:
        assert one["t_chunked"].data.chunksize == f["t_chunked"].chunks
        np.testing.assert_array_equal(cupy.asnumpy(one["t_chunked"].data.compute()), f["t_chunked"][...])


def test_device_array_interfaces():
    a = ferry.empty((4, 8), np.float32, device=0)
    assert a.device == 0 and a.__dlpack_device__() == (2, 0)
    cai = a.__cuda_array_interface__
    assert cai["version"] == 3 and cai["stream"] is None and cai["data"][0] == a.ptr
    c = cupy.asarray(a)
    assert c.data.ptr == a.ptr
    c[...] = cupy.arange(32, dtype=cupy.float32).reshape(4, 8)
    d = cupy.from_dlpack(a)
    assert float(d[3, 7]) == 31.0
    with pytest.raises(AttributeError):
        a.__array_interface__
    torch = pytest.importorskip("torch")
    t = torch.from_dlpack(a)
    assert t.device.type == "cuda" and t.data_ptr() == a.ptr
    assert float(t[2, 3]) == 19.0


def test_ferry_read_to_gpu_and_out(tmp_path):
    x = np.random.default_rng(4).standard_normal((64, 33)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = ferry.read(tmp_path / "x.npy", device=0)
    assert isinstance(r, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(r), x)
    out = cupy.zeros((64, 33), cupy.float32)
    assert ferry.read(tmp_path / "x.npy", out=out) is out
    np.testing.assert_array_equal(cupy.asnumpy(out), x)
    torch = pytest.importorskip("torch")
    t = torch.zeros((64, 33), device="cuda:0")
    ferry.read(tmp_path / "x.npy", out=t)
    np.testing.assert_array_equal(t.cpu().numpy(), x)
    many = ferry.read_many([(tmp_path / "x.npy", None, (slice(0, 10),)), (tmp_path / "x.npy", None, None)],
                           device=0)
    np.testing.assert_array_equal(cupy.asnumpy(many[0]), x[:10])
