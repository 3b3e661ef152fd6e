"""engine="ferry" where users scale out: every object the backend returns
pickles and reads the same values in another process (which opens the file by
path with its own context), forked children read, dask's process schedulers
and a real dask.distributed LocalCluster compute over open_mfdataset of
netCDF-3, netCDF-4 and Zarr. Values are checked against xarray's own engines
(scipy, netcdf4, h5netcdf, zarr) on files they write here."""
import os
import pickle

import numpy as np
import pandas as pd
import pytest
from optional import has

xr = pytest.importorskip("xarray")
import ferry  # noqa: E402
from ferry import xarray as fx  # noqa: E402
import ferry.xarray.array as fx_array  # noqa: E402
import ferry.xarray.store as fx_store  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::RuntimeWarning")


def make_ds(seed=0, t0=0, nt=6):
    rng = np.random.default_rng(seed)
    t = (rng.standard_normal((nt, 5, 4)) * 10 + 280).astype(np.float32)
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), t, {"units": "K"}),
         "count": (("time", "lat"), rng.integers(-100, 100, (nt, 5)).astype(np.int16))},
        coords={"time": pd.date_range("2001-01-01", periods=nt, freq="6h") + pd.Timedelta(hours=6 * t0),
                "lat": np.linspace(-60, 60, 5), "lon": np.linspace(0, 300, 4)},
        attrs={"title": "pickle"})
    ds["packed"] = (("time", "lat", "lon"), t - 273.15)
    ds["packed"].encoding.update({"dtype": "int16", "scale_factor": 0.01, "_FillValue": np.int16(-32767)})
    return ds


# kind -> (writer, reference engine, extra to_* keywords); one file of each kind
KINDS = {
    "nc3": ("scipy", "scipy"),
    "nc4": ("netcdf4", "netcdf4"),
    "h5nc": ("h5netcdf", "h5netcdf"),
    "zarr2": ("zarr2", "zarr"),
    "zarr3": ("zarr3", "zarr"),
}
NEEDS = {"nc3": "scipy", "nc4": "netCDF4", "h5nc": "h5netcdf", "zarr2": "zarr", "zarr3": "zarr"}


def write(ds, path, kind):
    w = KINDS[kind][0]
    if w.startswith("zarr"):
        enc = {v: {"chunks": (3, 5, 4)[:ds[v].ndim]} for v in ds.data_vars}
        ds.to_zarr(path, mode="w", zarr_format=int(w[-1]), consolidated=False, encoding=enc)
    elif w == "scipy":
        ds.to_netcdf(path, engine="scipy")
    else:
        enc = {v: {"chunksizes": (1, 5, 4)[:ds[v].ndim], "zlib": True} for v in ds.data_vars}
        ds.to_netcdf(path, engine=w, encoding=enc)
    return path


def files(tmp_path, kind, n=2):
    if not has(NEEDS[kind]):
        pytest.skip(f"{NEEDS[kind]} not installed")
    ext = ".zarr" if kind.startswith("zarr") else ".nc"
    return [write(make_ds(i, t0=6 * i), str(tmp_path / f"{kind}_{i}{ext}"), kind) for i in range(n)]


def reference(paths, kind):
    return xr.open_mfdataset(paths, engine=KINDS[kind][1], combine="by_coords").compute()


def roundtrip(obj):
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_object_pickles(tmp_path, kind):
    p = files(tmp_path, kind, 1)[0]
    ref = xr.open_dataset(p, engine=KINDS[kind][1]).load()
    ds = xr.open_dataset(p, engine="ferry", device="cpu")
    ds["t2m"][0].load()                       # the context has been used before pickling
    v = ds.variables["t2m"]
    lazy = v._data
    arr = fx_array._find_backend(lazy)[0]
    objs = {"dataset": ds, "dataarray": ds["t2m"], "variable": v, "lazy": lazy, "backend_array": arr,
            "store": arr.store, "isel": ds.isel(time=[1, 4], lat=slice(1, 4)),
            "entrypoint": fx.FerryBackendEntrypoint()}
    got = {k: roundtrip(o) for k, o in objs.items()}
    xr.testing.assert_identical(got["dataset"].load(), ref)
    xr.testing.assert_identical(got["isel"].load(), ref.isel(time=[1, 4], lat=slice(1, 4)))
    xr.testing.assert_identical(got["dataarray"].load(), ref["t2m"])
    np.testing.assert_array_equal(np.asarray(got["variable"].values), ref["t2m"].values)
    np.testing.assert_array_equal(np.asarray(got["lazy"]), ref["t2m"].values)
    np.testing.assert_array_equal(got["backend_array"].get_duck_array(), ref["t2m"].values)
    assert set(got["store"].get_variables()) == set(arr.store.get_variables())
    assert got["entrypoint"].open_dataset(p, device="cpu")["t2m"].shape == ref["t2m"].shape
    ds.close()


def test_dask_chunked_and_datatree_pickle(tmp_path):
    pytest.importorskip("dask")
    p = files(tmp_path, "nc4", 1)[0]
    ref = xr.open_dataset(p, engine="netcdf4").load()
    chunked = xr.open_dataset(p, engine="ferry", chunks={"time": 2})
    xr.testing.assert_identical(roundtrip(chunked).compute(), ref)
    tree = xr.open_datatree(p, engine="ferry")
    xr.testing.assert_identical(roundtrip(tree).to_dataset().load(), ref)


def test_reading_after_close_reopens(tmp_path):
    p = files(tmp_path, "nc4", 1)[0]
    ref = xr.open_dataset(p, engine="h5netcdf" if has("h5netcdf") else "netcdf4").load()
    ds = xr.open_dataset(p, engine="ferry")
    ds.close()
    xr.testing.assert_identical(ds.load(), ref)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
@pytest.mark.parametrize("kind", ["nc3", "nc4", "zarr3"])
def test_forked_child_reads(tmp_path, kind):
    p = files(tmp_path, kind, 1)[0]
    ref = xr.open_dataset(p, engine=KINDS[kind][1]).load()
    ds = xr.open_dataset(p, engine="ferry")
    ds["t2m"][0].load()                       # parent's context and handles in use
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                              # the child: report, never return into pytest
        try:
            os.close(r)
            got = ds.load()
            msg = b"ok" if got.identical(ref) else b"values differ"
        except BaseException as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {e}".encode()
        os.write(w, msg or b"empty message")
        os._exit(0)
    os.close(w)
    out = os.read(r, 4096)
    os.close(r)
    os.waitpid(pid, 0)
    assert out == b"ok", out.decode()
    xr.testing.assert_identical(ds.load(), ref)      # the parent still reads


def test_unpickling_a_replaced_file_refuses(tmp_path):
    p = files(tmp_path, "nc4", 1)[0]
    ds = xr.open_dataset(p, engine="ferry")
    blob = pickle.dumps(ds)
    other = make_ds(7, nt=9)                  # same variables, another shape
    write(other, str(tmp_path / "new.nc"), "nc4")
    os.replace(tmp_path / "new.nc", p)
    fx_store._STORES.clear()
    with pytest.raises(ferry.FerryError, match="changed since it was opened"):
        pickle.loads(blob).load()


def test_dask_process_scheduler(tmp_path):
    pytest.importorskip("dask")
    paths = files(tmp_path, "nc4", 2)
    ref = reference(paths, "nc4")
    got = xr.open_mfdataset(paths, engine="ferry", device="cpu", combine="by_coords")
    xr.testing.assert_identical(got.compute(scheduler="processes", num_workers=2), ref)


def test_distributed_local_cluster(tmp_path):
    """A real dask.distributed cluster of 2 spawned worker processes over
    open_mfdataset(engine="ferry") of netCDF-3, netCDF-4 and Zarr files."""
    distributed = pytest.importorskip("distributed")
    kinds = [k for k in ("nc3", "nc4", "zarr3") if has(NEEDS[k])]
    sets = {k: files(tmp_path, k, 2) for k in kinds}
    refs = {k: reference(ps, k) for k, ps in sets.items()}
    with distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        for k, ps in sets.items():
            got = xr.open_mfdataset(ps, engine="ferry", device="cpu", combine="by_coords", parallel=True,
                                    chunks={"time": 3})
            xr.testing.assert_identical(got.compute(), refs[k])
            mean = got["t2m"].mean("time").compute()
            np.testing.assert_allclose(mean.values, refs[k]["t2m"].mean("time").values, rtol=1e-6)
        # the work really ran in the workers: each process read with its own context
        pids = set(client.run(os.getpid).values())
        assert len(pids) == 2 and os.getpid() not in pids


@pytest.mark.parametrize("kind", ["nc3", "nc4"])
def test_read_after_replace_refuses(tmp_path, kind):
    """A file replaced (atomic rename, as writers do) after open: the open dataset
    never pairs the old metadata with the new bytes."""
    p = files(tmp_path, kind, 1)[0]
    ds = xr.open_dataset(p, engine="ferry")
    write(make_ds(99), str(tmp_path / "new.nc"), kind)      # same shapes, other values
    os.replace(tmp_path / "new.nc", p)
    with pytest.raises(ferry.FerryError, match="changed since it was opened"):
        ds["t2m"].load()
    fresh = xr.open_dataset(p, engine="ferry").load()
    xr.testing.assert_identical(fresh, xr.open_dataset(p, engine=KINDS[kind][1]).load())
