"""engine="ferry" against xarray's own engines, on files xarray writes in the
test: netCDF classic (scipy, netcdf4 NETCDF3_*), netCDF-4 (netcdf4, h5netcdf;
contiguous, chunked, compressed, big-endian, fill values), Zarr v2 and v3.
Everything on the CPU here (device="cpu"); tests/gpu has the cupy side."""
import logging
import sys

import numpy as np
import pandas as pd
import pytest
from optional import has

xr = pytest.importorskip("xarray")
import ferry  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
from ferry import xarray as fx  # noqa: E402
import ferry.xarray.dask_hook as fx_dask  # noqa: E402


HAS_NC4 = has("netCDF4")
HAS_H5NC = has("h5netcdf")
HAS_ZARR = has("zarr")
HAS_SCIPY = has("scipy")


def make_ds(seed=0, nt=12, ny=9, nx=7, *, strings=True, packed=True):
    rng = np.random.default_rng(seed)
    time = pd.date_range("2001-01-01", periods=nt, freq="6h")
    lat = np.linspace(-60, 60, ny)
    lon = np.linspace(0, 350, nx)
    t = rng.standard_normal((nt, ny, nx)).astype(np.float32) * 10 + 280
    t[0, 0, 0] = np.nan
    ds = xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), t, {"units": "K", "long_name": "temperature"}),
            "precip": (("time", "lat", "lon"), rng.random((nt, ny, nx)), {"units": "mm"}),
            "count": (("time", "lat"), rng.integers(-100, 100, (nt, ny)).astype(np.int16)),
            "mask": (("lat", "lon"), rng.integers(0, 2, (ny, nx)).astype(np.int8)),
            "scalar": ((), np.float64(3.25), {"note": "a scalar"}),
        },
        coords={"time": time, "lat": ("lat", lat, {"units": "degrees_north"}),
                "lon": ("lon", lon, {"units": "degrees_east"})},
        attrs={"title": "ferry test", "version": np.int32(3), "scale": np.float64(0.5)},
    )
    if packed:
        ds["packed"] = (("time", "lat", "lon"), (t - 273.15).astype(np.float32))
        ds["packed"].encoding.update({"dtype": "int16", "scale_factor": 0.01, "add_offset": 10.0,
                                      "_FillValue": np.int16(-32767)})
    ds["t2m"].encoding["_FillValue"] = np.float32(-999.0)
    if strings:
        ds["station"] = (("lat",), np.array([f"st{i}" for i in range(ny)], dtype="S4"))
    return ds


def compare(path, ref_engine, **kw):
    ref = xr.open_dataset(path, engine=ref_engine, **kw)
    got = xr.open_dataset(path, engine="ferry", device="cpu", **kw)
    try:
        xr.testing.assert_identical(got.load(), ref.load())
    finally:
        ref.close()
        got.close()


# ---------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------
def test_entrypoint_registered_and_opt_in(tmp_path):
    eps = xr.backends.list_engines()
    assert "ferry" in eps
    ep = eps["ferry"]
    assert ep.guess_can_open(str(tmp_path / "x.nc")) is False
    assert ep.description
    assert ep.url == ""   # no public home yet: none rather than a made-up address (issue 15 item 13)
    assert {"device", "threads", "path", "group", "mask_and_scale"} <= set(ep.open_dataset_parameters)


# ---------------------------------------------------------------------------
# netCDF classic
# ---------------------------------------------------------------------------
@pytest.mark.skipif(not HAS_SCIPY, reason="scipy not installed")
@pytest.mark.parametrize("fmt", ["NETCDF3_CLASSIC", "NETCDF3_64BIT"])
def test_netcdf3_scipy(tmp_path, fmt):
    p = tmp_path / "a.nc"
    make_ds().to_netcdf(p, engine="scipy", format=fmt)
    compare(p, "scipy")
    if HAS_NC4:
        compare(p, "netcdf4")


@pytest.mark.skipif(not HAS_NC4, reason="netCDF4 not installed")
@pytest.mark.parametrize("fmt", ["NETCDF3_CLASSIC", "NETCDF3_64BIT", "NETCDF3_64BIT_DATA"])
def test_netcdf3_netcdf4_writer(tmp_path, fmt):
    p = tmp_path / "a.nc"
    make_ds(1).to_netcdf(p, engine="netcdf4", format=fmt, unlimited_dims=["time"])
    compare(p, "netcdf4")
    for kw in ({"mask_and_scale": False}, {"decode_times": False}, {"decode_cf": False} if False else {}):
        compare(p, "netcdf4", **kw)


# ---------------------------------------------------------------------------
# netCDF-4 / HDF5
# ---------------------------------------------------------------------------
def nc4_encodings(ds, *, chunked, compress, shuffle=True, fletcher=False, endian=None):
    enc = {}
    for v in ds.data_vars:
        if ds[v].ndim == 0 or ds[v].dtype.kind == "S":
            continue
        e = {}
        if chunked:
            e["chunksizes"] = tuple(max(1, (n + 1) // 2) for n in ds[v].shape)
        else:
            e["contiguous"] = True
        if compress:
            e.update({"zlib": True, "complevel": 4, "shuffle": shuffle})
        if fletcher:
            e["fletcher32"] = True
        if endian:
            e["endian"] = endian
        enc[v] = e
    return enc


@pytest.mark.skipif(not HAS_NC4, reason="netCDF4 not installed")
@pytest.mark.parametrize("layout", ["contiguous", "chunked", "zlib", "zlib-noshuffle", "fletcher"])
def test_netcdf4(tmp_path, layout):
    ds = make_ds(2)
    kw = {"contiguous": dict(chunked=False, compress=False),
          "chunked": dict(chunked=True, compress=False),
          "zlib": dict(chunked=True, compress=True),
          "zlib-noshuffle": dict(chunked=True, compress=True, shuffle=False),
          "fletcher": dict(chunked=True, compress=True, fletcher=True),
          "big": dict(chunked=True, compress=True, endian="big")}[layout]
    p = tmp_path / "a.nc"
    ds.to_netcdf(p, engine="netcdf4", format="NETCDF4", encoding=nc4_encodings(ds, **kw),
                 unlimited_dims=["time"] if kw["chunked"] else None)
    compare(p, "netcdf4")
    if HAS_H5NC:
        compare(p, "h5netcdf")
    got = xr.open_dataset(p, engine="ferry")
    assert not [k for v in got.variables.values() for k in v.encoding if k.startswith("ferry")]
    got.close()
    assert engine_reads(p, "t2m")


@pytest.mark.skipif(not HAS_NC4, reason="netCDF4 not installed")
def test_netcdf4_strings_and_missing_chunks(tmp_path):
    import netCDF4
    p = tmp_path / "s.nc"
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("x", 10)
        nc.createDimension("y", 8)
        nc.createDimension("n", 3)
        v = nc.createVariable("sparse", "f4", ("x", "y"), chunksizes=(3, 3), zlib=True, fill_value=-1.5)
        v[0:3, 0:3] = np.arange(9, dtype=np.float32).reshape(3, 3)   # other chunks never written
        w = nc.createVariable("nofill", "i4", ("x",))
        w[:5] = np.arange(5)
        s = nc.createVariable("names", str, ("n",))
        s[:] = np.array(["alpha", "beta", "gamma"], dtype=object)
        c = nc.createVariable("chars", "S1", ("n", "x"))
        c[:] = netCDF4.stringtochar(np.array(["abc", "de", "f"], dtype="S10"))
        b = nc.createVariable("big", ">f8", ("x", "y"), endian="big", zlib=True, chunksizes=(4, 8))
        b[:] = np.arange(80.0).reshape(10, 8)
        bc = nc.createVariable("bigc", ">i2", ("x",), endian="big", contiguous=True)
        bc[:] = np.arange(10, dtype=np.int16) - 5
        bc.setncattr("scale_factor", np.float32(0.5))
        nc.setncattr("history", "made by a test")
        nc.setncattr("numbers", np.array([1.5, 2.5], dtype=np.float32))
    compare(p, "netcdf4")
    store = fx.FerryStore(str(p))
    assert store.specs["sparse"].kind == "ferry"
    assert store.specs["big"].kind == "ferry" and store.specs["bigc"].kind == "ferry"
    store.close()


@pytest.mark.skipif(not HAS_H5NC, reason="h5netcdf not installed")
def test_h5netcdf_writer_and_groups(tmp_path):
    p = tmp_path / "h.nc"
    ds = make_ds(3, strings=False)
    ds.to_netcdf(p, engine="h5netcdf", encoding=nc4_encodings(ds, chunked=True, compress=True))
    make_ds(4, strings=False).to_netcdf(p, engine="h5netcdf", group="sub", mode="a")
    compare(p, "h5netcdf")
    compare(p, "h5netcdf", group="sub")
    if hasattr(xr, "open_groups"):
        got = xr.open_groups(p, engine="ferry")
        ref = xr.open_groups(p, engine="h5netcdf")
        assert set(got) == set(ref)
        for k in ref:
            xr.testing.assert_identical(got[k].load(), ref[k].load())
    if hasattr(xr, "open_datatree"):
        tree = xr.open_datatree(p, engine="ferry")
        xr.testing.assert_identical(tree["sub"].to_dataset().load(),
                                    xr.open_dataset(p, engine="h5netcdf", group="sub").load())


def test_h5py_fallback_is_logged(tmp_path, caplog):
    """A dataset the C parser refuses as unsupported (h5py's own LZF filter) is read by
    h5py, logged once with the parser's reason; the rest (compact layout included) by ferry."""
    h5py = pytest.importorskip("h5py")
    p = tmp_path / "lzf.h5"
    with h5py.File(p, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        sp = h5py.h5s.create_simple((4,))
        dsid = h5py.h5d.create(f.id, b"small", h5py.h5t.NATIVE_INT32, sp, dcpl=dcpl)
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.arange(4, dtype=np.int32))
        f.create_dataset("big", data=np.arange(100.0))
        f.create_dataset("lzf", data=np.arange(50, dtype="i2"), chunks=(10,), compression="lzf")
    with caplog.at_level(logging.INFO, logger="ferry"):
        got = xr.open_dataset(p, engine="ferry").load()
        xr.open_dataset(p, engine="ferry").close()
    assert caplog.text.count("HDF5 filter 32000") == 1 and "lzf" in caplog.text
    assert engine_reads(p, "small") and engine_reads(p, "big") and not engine_reads(p, "lzf")
    np.testing.assert_array_equal(got["small"].values, np.arange(4))
    np.testing.assert_array_equal(got["big"].values, np.arange(100.0))
    np.testing.assert_array_equal(got["lzf"].values, np.arange(50))


def engine_reads(p, name, group=None):
    """Whether ferry's engine (not a fallback reader) reads the variable."""
    store = fx.FerryStore(str(p), group=group)
    try:
        return store.specs[name].kind == "ferry"
    finally:
        store.close()


# ---------------------------------------------------------------------------
# Zarr
# ---------------------------------------------------------------------------
@pytest.mark.skipif(not HAS_ZARR, reason="zarr not installed")
@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("compressed", [False, True])
def test_zarr(tmp_path, zarr_format, compressed):
    ds = make_ds(5, strings=False)
    enc = {}
    for v in ds.data_vars:
        if ds[v].ndim:
            enc[v] = {"chunks": tuple(max(1, n // 2) for n in ds[v].shape)}
            if not compressed:
                enc[v]["compressors"] = None
    p = tmp_path / "a.zarr"
    ds.to_zarr(p, zarr_format=zarr_format, encoding=enc, consolidated=False)
    ref = xr.open_dataset(p, engine="zarr", consolidated=False)
    got = xr.open_dataset(p, engine="ferry")
    xr.testing.assert_identical(got.load(), ref.load())


@pytest.mark.skipif(not HAS_ZARR, reason="zarr not installed")
def test_zarr_sharded_and_group(tmp_path):
    ds = make_ds(6, strings=False, packed=False)
    p = tmp_path / "s.zarr"
    enc = {"t2m": {"chunks": (3, 3, 7), "shards": (6, 9, 7)}}
    ds.to_zarr(p, zarr_format=3, encoding=enc, group="g1", consolidated=True)
    ref = xr.open_dataset(p, engine="zarr", group="g1")
    got = xr.open_dataset(p, engine="ferry", group="g1")
    xr.testing.assert_identical(got.load(), ref.load())


# ---------------------------------------------------------------------------
# laziness, selections, batching, dask
# ---------------------------------------------------------------------------
def writers():
    out = []
    if HAS_SCIPY:
        out.append(("scipy", "scipy", {}))
    if HAS_NC4:
        out.append(("netcdf4", "netcdf4", {"chunked": True}))
        out.append(("netcdf4", "netcdf4", {"chunked": False}))
    if HAS_ZARR:
        out.append(("zarr", "zarr", {}))
    return out


def write(ds, tmp_path, writer, opts):
    if writer == "zarr":
        p = tmp_path / "r.zarr"
        enc = {v: {"chunks": tuple(max(1, n // 3) for n in ds[v].shape)} for v in ds.data_vars if ds[v].ndim}
        ds.to_zarr(p, zarr_format=2, encoding=enc, consolidated=False)
        return p, "zarr", {"consolidated": False}
    p = tmp_path / "r.nc"
    if writer == "scipy":
        ds.to_netcdf(p, engine="scipy")
        return p, "scipy", {}
    enc = nc4_encodings(ds, chunked=opts.get("chunked"), compress=opts.get("chunked"))
    ds.to_netcdf(p, engine="netcdf4", encoding=enc)
    return p, "netcdf4", {}


@pytest.mark.parametrize("writer,engine,opts", writers())
def test_random_isel(tmp_path, writer, engine, opts):
    ds = make_ds(7, nt=20, ny=13, nx=11, strings=False)
    p, eng, okw = write(ds, tmp_path, writer, opts)
    ref = xr.open_dataset(p, engine=eng, **okw)
    got = xr.open_dataset(p, engine="ferry")
    rng = np.random.default_rng(0)
    for _ in range(25):
        sel = {}
        for d, n in ref.sizes.items():
            r = rng.integers(0, 5)
            if r == 0:
                sel[d] = int(rng.integers(-n, n))
            elif r == 1:
                a, b = sorted(rng.integers(0, n + 1, 2).tolist())
                sel[d] = slice(a, b, int(rng.integers(1, 4)))
            elif r == 2:
                sel[d] = np.sort(rng.choice(n, size=min(n, int(rng.integers(1, 5))), replace=False))
            elif r == 3:
                sel[d] = slice(None, None, -1)
        xr.testing.assert_identical(got.isel(sel).load(), ref.isel(sel).load())
        # OUTER indexing of a single variable, through the lazy array
        v = "t2m"
        xr.testing.assert_identical(got[v].isel(sel), ref[v].isel(sel))
    ref.close()
    got.close()


@pytest.mark.skipif(not HAS_NC4, reason="netCDF4 not installed")
def test_load_is_one_plan(tmp_path):
    ds = make_ds(8, strings=False)
    p = tmp_path / "one.nc"
    ds.to_netcdf(p, engine="netcdf4", encoding=nc4_encodings(ds, chunked=True, compress=True))
    got = xr.open_dataset(p, engine="ferry")
    # netCDF-4: each variable's chunk index is read (its own small reads) on its first
    # read; one element of each first, so that only the load's reads are counted
    for v in got.data_vars:
        got[v].isel({d: 0 for d in got[v].dims}).values
    ctx = ferry.default_context()
    before = ctx.stats()["jobs"]
    got.load()
    assert ctx.stats()["jobs"] - before == 1
    ref = xr.open_dataset(p, engine="netcdf4").load()
    xr.testing.assert_identical(got, ref)


@pytest.mark.skipif(not HAS_NC4, reason="netCDF4 not installed")
def test_selected_chunks_only(tmp_path):
    ds = xr.Dataset({"v": (("t", "x"), np.arange(100 * 50, dtype=np.float64).reshape(100, 50))})
    p = tmp_path / "c.nc"
    ds.to_netcdf(p, engine="netcdf4", encoding={"v": {"chunksizes": (10, 50), "zlib": True}})
    got = xr.open_dataset(p, engine="ferry")
    ctx = ferry.default_context()
    ctx.reset_stats()
    x = got["v"].isel(t=slice(20, 25)).values
    np.testing.assert_array_equal(x, ds["v"].values[20:25])
    s = ctx.stats()
    size = xr.open_dataset(p, engine="netcdf4")["v"].encoding  # noqa: F841
    total = s["host"]["bytes"]
    assert 0 < total < 40000 / 5, total     # one compressed chunk of ten


@pytest.mark.parametrize("writer,engine,opts", writers())
def test_open_mfdataset(tmp_path, writer, engine, opts):
    pytest.importorskip("dask")
    full = make_ds(9, nt=24, strings=False)
    paths = []
    for i in range(3):
        part = full.isel(time=slice(8 * i, 8 * i + 8))
        sub = tmp_path / f"p{i}"
        sub.mkdir()
        p, eng, okw = write(part, sub, writer, opts)
        paths.append(p)
    ref = xr.open_mfdataset(paths, engine=eng, combine="by_coords", **okw)
    got = xr.open_mfdataset(paths, engine="ferry", combine="by_coords", parallel=True)
    assert got["t2m"].chunks is not None
    xr.testing.assert_identical(got.compute(), ref.compute())


@pytest.mark.skipif(not HAS_NC4, reason="netCDF4 not installed")
def test_drop_variables_and_keywords(tmp_path):
    p = tmp_path / "k.nc"
    make_ds(10).to_netcdf(p, engine="netcdf4")
    for kw in ({"drop_variables": ["precip"]}, {"mask_and_scale": False}, {"decode_times": False},
               {"concat_characters": False}, {"decode_coords": False}):
        compare(p, "netcdf4", **kw)
    got = xr.open_dataset(p, engine="ferry", threads=2, path="host")
    assert "t2m" in got
    with pytest.raises(ValueError):
        xr.open_dataset(p, engine="ferry", device="tpu")


@pytest.mark.skipif(not HAS_H5NC, reason="h5netcdf not installed")
def test_plain_hdf5_written_by_h5py(tmp_path):
    """HDF5 written by h5py (dimension scales, no netCDF-4 bookkeeping): big-endian,
    fletcher32, never-written chunks (fill value), contiguous and chunked."""
    import h5py
    rng = np.random.default_rng(11)
    t = rng.standard_normal((10, 12, 14)).astype(np.float32)
    p = tmp_path / "plain.h5"
    with h5py.File(p, "w") as f:
        for name, n in (("time", 10), ("y", 12), ("x", 14)):
            f.create_dataset(name, data=np.arange(n, dtype=np.float64)).make_scale(name)
        specs = {"contig": dict(data=t), "chunked": dict(data=t, chunks=(3, 5, 14)),
                 "gzip": dict(data=t, chunks=(4, 4, 4), compression="gzip", shuffle=True),
                 "fletch": dict(data=t, chunks=(5, 12, 7), compression="gzip", fletcher32=True),
                 "big": dict(data=t.astype(">f8"), chunks=(2, 12, 14), compression="gzip"),
                 "bigint": dict(data=(t * 100).astype(">i4")),
                 "sparse": dict(shape=t.shape, dtype="i2", chunks=(5, 6, 7), fillvalue=-7)}
        for n, kw in specs.items():
            d = f.create_dataset(n, **kw)
            for i, dim in enumerate(("time", "y", "x")):
                d.dims[i].attach_scale(f[dim])
        f["sparse"][0:5, 0:6, 0:7] = np.ones((5, 6, 7), np.int16)
        f["gzip"].attrs["units"] = "K"
        f["gzip"].attrs["valid"] = np.array([1.0, 2.0])
        f.attrs["title"] = "plain"
    ref = xr.open_dataset(p, engine="h5netcdf")
    got = xr.open_dataset(p, engine="ferry")
    xr.testing.assert_identical(got.load(), ref.load())
    for v in specs:
        assert engine_reads(p, v), v
    rng = np.random.default_rng(0)
    g2 = xr.open_dataset(p, engine="ferry")
    for _ in range(15):
        sel = {"time": slice(int(rng.integers(0, 5)), int(rng.integers(5, 11)), int(rng.integers(1, 3))),
               "y": np.sort(rng.choice(12, 4, replace=False)), "x": int(rng.integers(0, 14))}
        xr.testing.assert_identical(g2.isel(sel).load(), ref.isel(sel).load())


@pytest.mark.skipif(not HAS_ZARR, reason="zarr not installed")
@pytest.mark.skipif(not hasattr(xr, "open_groups"), reason="xarray has no open_groups")
def test_zarr_groups_and_datatree(tmp_path):
    p = tmp_path / "g.zarr"
    xr.Dataset({"a": (("x",), np.arange(5.0))}).to_zarr(p, mode="w", zarr_format=3, consolidated=False)
    xr.Dataset({"b": (("y",), np.arange(3))}).to_zarr(p, group="g1", mode="a", zarr_format=3, consolidated=False)
    xr.Dataset({"c": (("z",), np.arange(2.0))}).to_zarr(p, group="g1/g2", mode="a", zarr_format=3,
                                                         consolidated=False)
    got = xr.open_groups(p, engine="ferry")
    ref = xr.open_groups(p, engine="zarr", consolidated=False)
    assert sorted(got) == sorted(ref) == ["/", "/g1", "/g1/g2"]
    for k in ref:
        xr.testing.assert_identical(got[k].load(), ref[k].load())
    tree = xr.open_datatree(p, engine="ferry")
    np.testing.assert_array_equal(tree["g1/g2"]["c"].values, np.arange(2.0))


def test_device_without_cupy_is_a_clear_error(tmp_path):
    if has("cupy"):
        pytest.skip("cupy is installed")
    p = tmp_path / "q.nc"
    xr.Dataset({"a": (("x",), np.arange(3.0))}).to_netcdf(p, engine="scipy" if HAS_SCIPY else None)
    with pytest.raises(ImportError, match="cupy"):
        xr.open_dataset(p, engine="ferry", device=0)


def test_rechunk_on_device_helper_keeps_values(tmp_path):
    """The graph surgery behind ferry.xarray.cupy_meta, with a numpy meta on the CPU."""
    pytest.importorskip("dask")
    ds = xr.Dataset({"a": (("t", "x"), np.arange(40.0).reshape(8, 5))})
    p = tmp_path / "dk.nc"
    ds.to_netcdf(p, engine="scipy" if HAS_SCIPY else None)
    g = xr.open_dataset(p, engine="ferry", chunks={"t": 3})
    new = fx_dask._rechunk_on_device(g["a"].data, np.empty((0, 0)))
    assert new is not None and new.chunks == ((3, 3, 2), (5,))
    assert isinstance(new.blocks[1].compute(), np.ndarray)
    np.testing.assert_array_equal(new.compute(), ds["a"].values)


@pytest.fixture
def fake_cupy(monkeypatch):
    """A stand-in 'cupy' whose arrays are numpy arrays: runs the backend's device
    code paths (placement, CF decoding with xarray's transforms, cupy_meta) on the
    CPU. The real thing is in tests/gpu/test_xarray_gpu.py."""
    import contextlib
    import types
    if has("cupy"):
        pytest.skip("real cupy installed: tests/gpu covers this")
    m = types.ModuleType("cupy")
    m.ndarray = np.ndarray
    m.empty = np.empty
    m.asarray = np.asarray
    m.asnumpy = np.asarray
    m.cuda = types.SimpleNamespace(Device=lambda d: contextlib.nullcontext())
    monkeypatch.setitem(sys.modules, "cupy", m)
    return m


@pytest.mark.skipif(not HAS_SCIPY, reason="scipy not installed")
def test_device_code_path_with_fake_cupy(tmp_path, fake_cupy):
    p = tmp_path / "d.nc"
    make_ds(12, strings=False).to_netcdf(p, engine="scipy")
    ref = xr.open_dataset(p, engine="scipy").load()
    got = xr.open_dataset(p, engine="ferry", device=0)
    assert got["packed"].encoding.get("ferry_decoded_on_device") is True
    assert got["t2m"].encoding.get("ferry_device") == 0 and "ferry_device" not in got["lat"].encoding
    xr.testing.assert_identical(got.load(), ref)
    g2 = xr.open_dataset(p, engine="ferry", device=0)
    sel = {"time": [1, 4, 5], "lat": slice(1, 8, 3), "lon": 2}
    xr.testing.assert_identical(g2.isel(sel).load(), ref.isel(sel))
    g3 = xr.open_dataset(p, engine="ferry", device=0, mask_and_scale=False)
    xr.testing.assert_identical(g3.load(), xr.open_dataset(p, engine="scipy", mask_and_scale=False).load())


@pytest.mark.skipif(not HAS_SCIPY, reason="scipy not installed")
def test_cupy_meta_with_fake_cupy(tmp_path, fake_cupy):
    pytest.importorskip("dask")
    full = make_ds(13, nt=16, strings=False)
    paths = []
    for i in range(2):
        q = tmp_path / f"m{i}.nc"
        full.isel(time=slice(8 * i, 8 * i + 8)).to_netcdf(q, engine="scipy")
        paths.append(q)
    ref = xr.open_mfdataset(paths, engine="scipy", combine="by_coords").compute()
    got = xr.open_mfdataset(paths, engine="ferry", device=0, combine="by_coords", parallel=True,
                            preprocess=fx.cupy_meta)
    assert got["t2m"].data.name.endswith("-ferry") or "ferry" in str(got["t2m"].data.dask)
    xr.testing.assert_identical(got.compute(), ref)
    got2 = fx.open_mfdataset(paths, device=0, combine="by_coords", parallel=True)
    xr.testing.assert_identical(got2.compute(), ref)


@pytest.mark.skipif(not HAS_ZARR, reason="zarr not installed")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr_strings_bool_timedelta(tmp_path, zarr_format):
    ds = xr.Dataset({"u": (("x",), np.array(["ab", "cde", "f"])), "s": (("x",), np.array([b"ab", b"c", b"d"])),
                     "o": (("x",), np.array(["x", "yy", "zzz"], dtype=object)),
                     "b": (("x",), np.array([True, False, True])),
                     "t": (("x",), np.array([1, 2, 3], dtype="timedelta64[s]"))})
    p = tmp_path / "s.zarr"
    ds.to_zarr(p, zarr_format=zarr_format, consolidated=False)
    ref = xr.open_dataset(p, engine="zarr", consolidated=False).load()
    got = xr.open_dataset(p, engine="ferry").load()
    xr.testing.assert_identical(got, ref)
    # which reader took each variable is the store's (encoding holds the zarr engine's keys only)
    from ferry.xarray import FerryStore
    st = FerryStore(str(p))
    assert st.specs["o"].kind == "zarrpy" and st.specs["b"].kind == "ferry"
    assert not any(k.startswith("ferry") for v in got.variables.values() for k in v.encoding)
    st.close()


def rich_ds():
    """CF features beyond the basics: cftime calendar, bounds, 2-d coordinates,
    _Unsigned, flag attributes, list attributes, timedeltas, int64."""
    rng = np.random.default_rng(0)
    times = xr.date_range("2000-01-01", periods=6, freq="MS", calendar="noleap", use_cftime=True)
    ds = xr.Dataset(
        {"tas": (("time", "y", "x"), rng.standard_normal((6, 4, 5)).astype("f4"),
                 {"cell_methods": "time: mean", "coordinates": "lat2d lon2d"}),
         "flag": (("y", "x"), rng.integers(0, 255, (4, 5)).astype("u1"),
                  {"flag_values": np.array([0, 1, 2], dtype="u1"), "flag_meanings": "a b c"}),
         "big": (("time",), np.arange(6, dtype="i8") * 10**12),
         "time_bnds": (("time", "nv"), np.zeros((6, 2))),
         "dur": (("time",), pd.to_timedelta(np.arange(6), unit="h").values),
         "u": (("x",), np.array([250, 251, 252, 253, 254], dtype="u1"))},
        coords={"time": times, "lat2d": (("y", "x"), rng.random((4, 5))), "lon2d": (("y", "x"), rng.random((4, 5)))},
        attrs={"Conventions": "CF-1.8", "list_attr": np.array([1, 2, 3], dtype="i2")},
    )
    ds["time"].attrs["bounds"] = "time_bnds"
    ds["u"].encoding.update({"dtype": "i1", "_Unsigned": "true", "_FillValue": np.int8(-1)})
    return ds


@pytest.mark.skipif(not HAS_NC4, reason="netCDF4 not installed")
@pytest.mark.skipif(not has("cftime"), reason="cftime not installed")
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF4_CLASSIC", "NETCDF3_64BIT"])
def test_rich_cf_features(tmp_path, fmt):
    ds = rich_ds()
    if fmt != "NETCDF4":
        ds = ds.drop_vars(["flag", "big", "dur"])
    p = tmp_path / "rich.nc"
    ds.to_netcdf(p, engine="netcdf4", format=fmt)
    for kw in ({}, {"use_cftime": True}, {"decode_times": False}, {"mask_and_scale": False},
               {"decode_coords": "all"}):
        compare(p, "netcdf4", **kw)
