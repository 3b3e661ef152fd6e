"""Dask chunks of engine="ferry" datasets: netCDF-4 opens carry the HDF5 chunks
as preferred_chunks/chunksizes (chunks={} gives what netcdf4/h5netcdf give), and
GPU variables become dask arrays of cupy chunks with cupy meta by default (a
stand-in cupy whose arrays are a numpy subclass runs that path on the CPU;
tests/gpu has the real one)."""
import contextlib
import sys
import types

import numpy as np
import pandas as pd
import pytest
from optional import has

xr = pytest.importorskip("xarray")
pytest.importorskip("dask")
from ferry import xarray as fx  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::RuntimeWarning")


def make_ds(seed=0, t0=0, nt=8):
    rng = np.random.default_rng(seed)
    t = (rng.standard_normal((nt, 9, 12)) * 10 + 280).astype(np.float32)
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), t, {"units": "K"}),
         "count": (("time", "lat"), rng.integers(-100, 100, (nt, 9)).astype(np.int16))},
        coords={"time": pd.date_range("2001-01-01", periods=nt, freq="6h") + pd.Timedelta(hours=6 * t0),
                "lat": np.linspace(-60, 60, 9), "lon": np.linspace(0, 330, 12)})
    ds["packed"] = (("time", "lat", "lon"), t - 273.15)
    ds["packed"].encoding.update({"dtype": "int16", "scale_factor": 0.01, "_FillValue": np.int16(-32767)})
    return ds


ENC = {"t2m": {"chunksizes": (1, 9, 12), "zlib": True}, "count": {"chunksizes": (4, 9)},
       "packed": {"chunksizes": (2, 3, 12)}}


@pytest.mark.parametrize("writer", [w for w in ("netcdf4", "h5netcdf") if has({"netcdf4": "netCDF4"}.get(w, w))])
def test_netcdf4_preferred_chunks_follow_hdf5_chunks(tmp_path, writer):
    p = tmp_path / "c.nc"
    make_ds().to_netcdf(p, engine=writer, encoding=ENC)
    got = xr.open_dataset(p, engine="ferry", chunks={})
    assert got["t2m"].chunks == ((1,) * 8, (9,), (12,))
    for ref_engine in [e for e in ("netcdf4", "h5netcdf") if has({"netcdf4": "netCDF4"}.get(e, e))]:
        ref = xr.open_dataset(p, engine=ref_engine, chunks={})
        for v in ENC:
            assert got[v].chunks == ref[v].chunks, (v, ref_engine)
            assert got[v].encoding["chunksizes"] == tuple(ref[v].encoding["chunksizes"])
        xr.testing.assert_identical(got.compute(), ref.compute())
    h5 = xr.open_dataset(p, engine="h5netcdf") if has("h5netcdf") else None
    if h5 is not None:
        for v in ENC:
            assert got[v].encoding["preferred_chunks"] == h5[v].encoding["preferred_chunks"]


class FakeCupyArray(np.ndarray):
    """The stand-in cupy's array type: a numpy subclass, so the tests can tell it apart."""


@pytest.fixture
def fake_cupy(monkeypatch):
    if has("cupy"):
        pytest.skip("real cupy installed: tests/gpu covers this")
    m = types.ModuleType("cupy")
    m.ndarray = FakeCupyArray
    m.empty = lambda shape, dtype=float: np.empty(shape, dtype=dtype).view(FakeCupyArray)
    m.asarray = lambda a, dtype=None: np.asarray(a, dtype=dtype).view(FakeCupyArray)
    m.asnumpy = lambda a: np.asarray(a).view(np.ndarray)
    m.cuda = types.SimpleNamespace(Device=lambda d: contextlib.nullcontext())
    monkeypatch.setitem(sys.modules, "cupy", m)
    return m


def mf_files(tmp_path):
    paths = []
    for i in range(2):
        q = tmp_path / f"m{i}.nc"
        make_ds(i, t0=8 * i).to_netcdf(q, engine="h5netcdf" if has("h5netcdf") else None, encoding=ENC)
        paths.append(q)
    return paths


def as_host(ds):
    return ds.copy(data=None).map(lambda v: v.copy(data=np.asarray(v.values).view(np.ndarray)), keep_attrs=True)


def test_gpu_variables_have_cupy_chunks_by_default(tmp_path, fake_cupy):
    paths = mf_files(tmp_path)
    ref = xr.open_mfdataset(paths, engine="h5netcdf" if has("h5netcdf") else None, combine="by_coords").compute()
    metas = []

    def record(ds):             # each file's dataset, before xarray concatenates them
        metas.extend(type(ds[v].data._meta) for v in ("t2m", "count", "packed"))
        return ds
    for got in (xr.open_mfdataset(paths, engine="ferry", device=0, combine="by_coords", preprocess=record),
                xr.open_mfdataset(paths, engine="ferry", device=0, combine="by_coords", preprocess=fx.cupy_meta),
                fx.open_mfdataset(paths, device=0, combine="by_coords")):
        for v in ("t2m", "count", "packed"):
            d = got[v].data
            assert type(d.blocks[(0,) * d.ndim].compute()) is FakeCupyArray, v
            c = ENC[v]["chunksizes"][0]
            assert d.chunks[0] == (c,) * (16 // c), (v, d.chunks)
        assert type(got["time"].values) is np.ndarray and type(got["lat"].values) is np.ndarray
        xr.testing.assert_identical(as_host(got.compute()), ref)
    assert metas == [FakeCupyArray] * 6
    one = xr.open_dataset(paths[0], engine="ferry", device=0, chunks={})
    assert type(one["t2m"].data._meta) is FakeCupyArray and one["t2m"].chunks[0] == (1,) * 8
    cpu = xr.open_dataset(paths[0], engine="ferry", device="cpu", chunks={})
    assert type(cpu["t2m"].data._meta) is np.ndarray


def test_importing_the_backend_leaves_xarray_unpatched():
    """xarray imports every installed backend while guessing an engine: that alone must not
    change xarray (the dask hook is installed by the first store with GPU variables)."""
    import subprocess
    import sys
    code = ("import xarray as xr, ferry.xarray\n"
            "from xarray.namedarray.daskmanager import DaskManager\n"
            "print(getattr(DaskManager.from_array, '_ferry_wrapped', False))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
