"""ferry.torch.XarrayDataset and ferry.dali: samples equal what xarray's own engines read, every
sample exactly once per epoch over ranks and workers, resume on another world size, windows at
the ends of the sample dim, selections, normalisation, DALI CPU pipelines."""
import os
import pickle

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

import ferry
from ferry.torch import XarrayDataset

T, L, H, W = 24, 3, 12, 16


def _era(rng, t0=0, n=T):
    times = pd.date_range("2020-01-01", periods=T, freq="6h")[t0:t0 + n]
    t2m = rng.normal(280, 10, (n, H, W)).astype(np.float32)
    z = rng.normal(5000, 100, (n, L, H, W)).astype(np.float32)
    t2m[min(3, n - 1), 2, 5] = np.nan            # a missing value (fill on disk)
    return xr.Dataset({"t2m": (("time", "lat", "lon"), t2m), "z": (("time", "level", "lat", "lon"), z)},
                      coords={"time": times, "level": [500, 700, 850], "lat": np.linspace(-80, 80, H),
                              "lon": np.arange(W) * 22.5})


@pytest.fixture(scope="module")
def nc4_files(tmp_path_factory):
    """Three netCDF-4 files along time: t2m packed as int16 with scale/offset and a fill value,
    z float32; zlib + shuffle, one chunk per time step (written by netCDF4)."""
    pytest.importorskip("netCDF4")
    d = tmp_path_factory.mktemp("era")
    full = _era(np.random.default_rng(0))
    enc = {"t2m": {"zlib": True, "shuffle": True, "chunksizes": (1, H, W), "dtype": "int16",
                   "scale_factor": 0.01, "add_offset": 280.0, "_FillValue": -32767},
           "z": {"zlib": True, "shuffle": True, "chunksizes": (1, L, H, W)}}
    paths = []
    for i in range(3):
        p = str(d / f"era_{i}.nc")
        full.isel(time=slice(8 * i, 8 * i + 8)).to_netcdf(p, engine="netcdf4", encoding=enc)
        paths.append(p)
    ref = xr.open_mfdataset(paths, engine="netcdf4", combine="by_coords").load()
    return paths, ref


def _sample(ref, i, names, steps):
    """Reference channels of `names` at time steps i+s (s in steps), as the dataset orders them."""
    out = []
    for s in steps:
        for n in names:
            v = ref[n].values[i + s]
            out.append(v[None] if v.ndim == 2 else v.reshape((-1,) + v.shape[-2:]))
    return np.concatenate(out, 0)


def _index_of(ref, t):
    return int(np.searchsorted(ref.time.values, np.int64(t).astype("datetime64[ns]")))


def _check_batches(ds, ref, names, in_steps, tg_steps=(), tnames=None):
    seen = []
    for b in ds:
        for k, t in enumerate(b["time"].numpy()):
            i = _index_of(ref, t)
            seen.append(i)
            np.testing.assert_allclose(b["x"][k].numpy(), _sample(ref, i, names, in_steps), rtol=1e-6,
                                       equal_nan=True)
            if tg_steps:
                np.testing.assert_allclose(b["y"][k].numpy(), _sample(ref, i, tnames or names, tg_steps),
                                           rtol=1e-6, equal_nan=True)
    return seen


def test_netcdf4_mfdataset_windows_equal_netcdf4_engine(nc4_files):
    paths, ref = nc4_files
    mf = xr.open_mfdataset(paths, engine="ferry", device="cpu")
    ds = XarrayDataset(mf, ["t2m", "z"], batch_size=4, input_steps=2, target_steps=2, lead=3,
                       shuffle=True, seed=5, device="cpu", return_time=True)
    # windows never leave the time axis: starts 0 .. T - span
    span = 2 + 3 + 2 - 1
    assert ds.num_samples == T - span + 1
    seen = _check_batches(ds, ref, ["t2m", "z"], [0, 1], [1 + 3, 1 + 3 + 1])
    assert sorted(seen) == list(range(T - span + 1))
    assert np.isnan(ref.t2m.values[3, 2, 5])        # the missing value really is in the data


def test_paths_and_order_of_channels(nc4_files):
    paths, ref = nc4_files
    ds = XarrayDataset(paths[::-1] and os.path.join(os.path.dirname(paths[0]), "era_*.nc"), ["z", "t2m"],
                       batch_size=5, device="cpu", return_time=True)
    assert ds.channel_names()[:4] == ["z[0]@0", "z[1]@0", "z[2]@0", "t2m@0"]
    seen = _check_batches(ds, ref, ["z", "t2m"], [0])
    assert seen == list(range(T))           # shuffle=False: in order


def test_selection_by_coordinates(nc4_files):
    paths, ref = nc4_files
    mf = xr.open_mfdataset(paths, engine="ferry", device="cpu")
    sub = mf.sel(level=[850, 500]).isel(time=slice(2, 20))
    rsub = ref.sel(level=[850, 500]).isel(time=slice(2, 20))
    ds = XarrayDataset(sub, ["z"], batch_size=4, device="cpu", return_time=True, target_steps=1)
    assert ds.num_samples == 18 - 1
    seen = _check_batches(ds, rsub, ["z"], [0], [1])
    assert sorted(seen) == list(range(17))


def test_tiles_cover_every_patch_once(nc4_files):
    paths, ref = nc4_files
    ds = XarrayDataset(xr.open_mfdataset(paths, engine="ferry", device="cpu"), ["z"], batch_size=7,
                       patch=(6, 8), patch_mode="tile", shuffle=True, device="cpu", return_time=True)
    assert ds.tiles == (2, 2) and ds.num_samples == T * 4
    got = set()
    for b in ds:
        for k, t in enumerate(b["time"].numpy()):
            i = _index_of(ref, t)
            full = ref.z.values[i]
            hits = [(ty, tx) for ty in range(2) for tx in range(2)
                    if np.allclose(full[:, ty * 6:ty * 6 + 6, tx * 8:tx * 8 + 8], b["x"][k].numpy())]
            assert len(hits) == 1
            got.add((i,) + hits[0])
    assert len(got) == T * 4


def test_random_patches_are_windows_of_the_field(nc4_files):
    paths, ref = nc4_files
    ds = XarrayDataset(paths, ["t2m"], batch_size=6, patch=(5, 7), shuffle=True, seed=2, device="cpu",
                       return_time=True)
    corners = set()
    for b in ds:
        for k, t in enumerate(b["time"].numpy()):
            full = ref.t2m.values[_index_of(ref, t)]
            x = b["x"][k, 0].numpy()
            hits = [(y, x0) for y in range(H - 5 + 1) for x0 in range(W - 7 + 1)
                    if np.allclose(full[y:y + 5, x0:x0 + 7], x, equal_nan=True)]
            assert hits
            corners.add(hits[0])
    assert len(corners) > 3          # positions differ between samples


def test_zarr_v3_zstd_and_netcdf3(tmp_path):
    zarr = pytest.importorskip("zarr")
    full = _era(np.random.default_rng(1))
    zp = str(tmp_path / "era.zarr")
    full.to_zarr(zp, zarr_format=3, consolidated=False,
                 encoding={"z": {"chunks": (1, L, H, W), "compressors": [zarr.codecs.ZstdCodec(level=3)]},
                           "t2m": {"chunks": (1, H, W)}})
    ref = xr.open_zarr(zp, consolidated=False).load()
    ds = XarrayDataset(xr.open_dataset(zp, engine="ferry", device="cpu"), ["t2m", "z"], batch_size=5,
                       shuffle=True, device="cpu", return_time=True, target_steps=1)
    assert sorted(_check_batches(ds, ref, ["t2m", "z"], [0], [1])) == list(range(T - 1))

    np3 = str(tmp_path / "era3.nc")
    full.to_netcdf(np3, engine="scipy", format="NETCDF3_64BIT")
    ref3 = xr.open_dataset(np3, engine="scipy").load()
    ds3 = XarrayDataset(np3, ["z", "t2m"], batch_size=3, input_steps=3, device="cpu", return_time=True)
    assert sorted(_check_batches(ds3, ref3, ["z", "t2m"], [0, 1, 2])) == list(range(T - 2))


def test_every_sample_once_per_epoch_over_8_ranks_and_2_workers(nc4_files):
    paths, ref = nc4_files
    mf = xr.open_mfdataset(paths, engine="ferry", device="cpu")
    for epoch in (0, 1):
        seen = []
        for rank in range(8):
            ds = XarrayDataset(mf, ["t2m"], batch_size=2, input_steps=2, shuffle=True, seed=9, device="cpu",
                               rank=rank, world_size=8, return_time=True, drop_last=False)
            ds.set_epoch(epoch)
            loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
            for b in loader:
                seen.extend(_index_of(ref, t) for t in b["time"].numpy())
        assert sorted(seen) == list(range(T - 1)), epoch


def test_resume_mid_epoch_on_another_world_size(nc4_files):
    paths, ref = nc4_files
    mf = xr.open_mfdataset(paths, engine="ferry", device="cpu")
    kw = dict(batch_size=2, shuffle=True, seed=4, device="cpu", return_time=True)
    before = []
    states = []
    for rank in range(4):
        ds = XarrayDataset(mf, ["t2m"], rank=rank, world_size=4, **kw)
        it = iter(ds)
        for _ in range(2):
            before.extend(_index_of(ref, t) for t in next(it)["time"].numpy())
        states.append(ds.state_dict())
        it.close()
    assert all(s == states[0] for s in states)          # one global position
    after = []
    for rank in range(3):
        ds = XarrayDataset(mf, ["t2m"], rank=rank, world_size=3, **kw)
        ds.load_state_dict(pickle.loads(pickle.dumps(states[0])))
        for b in ds:
            after.extend(_index_of(ref, t) for t in b["time"].numpy())
    assert sorted(before + after) == list(range(T))


def test_normalize_given_and_computed(nc4_files, tmp_path):
    paths, ref = nc4_files
    mf = xr.open_mfdataset(paths, engine="ferry", device="cpu")
    m, s = [5000.0, 5010.0, 4990.0], [100.0, 90.0, 110.0]
    ds = XarrayDataset(mf, ["z"], batch_size=4, device="cpu", return_time=True, normalize={"z": (m, s)})
    for b in ds:
        i = _index_of(ref, b["time"][0])
        exp = (ref.z.values[i] - np.array(m)[:, None, None]) / np.array(s)[:, None, None]
        np.testing.assert_allclose(b["x"][0].numpy(), exp, rtol=1e-5, atol=1e-5)
    sf = str(tmp_path / "stats.json")
    ds = XarrayDataset(mf, ["t2m", "z"], batch_size=24, device="cpu", normalize="compute", stats_steps=T,
                       stats_file=sf, nan_to=0.0, return_mask=True)
    assert os.path.exists(sf)
    b = next(iter(ds))
    x = b["x"].numpy()
    assert not np.isnan(x).any() and (~b["mask"].numpy()).sum() == 1     # the one missing value
    np.testing.assert_allclose(x.mean(axis=(0, 2, 3)), 0, atol=1e-3)
    np.testing.assert_allclose(x[:, 1:].std(axis=(0, 2, 3)), 1, rtol=1e-3)
    ds2 = XarrayDataset(mf, ["t2m", "z"], batch_size=24, device="cpu", normalize="compute", stats_steps=T,
                        stats_file=sf)
    for n in ("t2m", "z"):
        np.testing.assert_array_equal(ds._norm[n][0], ds2._norm[n][0])


def test_errors_name_what_is_wrong(nc4_files):
    paths, ref = nc4_files
    with pytest.raises(ValueError, match="not read by ferry"):
        XarrayDataset(xr.open_dataset(paths[0], engine="netcdf4"), ["t2m"], device="cpu")
    with pytest.raises(KeyError, match="nope"):
        XarrayDataset(paths[0], ["nope"], device="cpu")
    with pytest.raises(ValueError, match="fewer than one sample"):
        XarrayDataset(paths[0], ["t2m"], input_steps=8, target_steps=1, device="cpu")
    with pytest.raises(ValueError, match="does not fit"):
        XarrayDataset(paths[0], ["t2m"], patch=(H + 1, 2), device="cpu")
    with pytest.raises(ValueError, match="dims"):
        XarrayDataset(xr.open_dataset(paths[0], engine="ferry")[["t2m"]].transpose("lat", "time", "lon"), ["t2m"],
                      device="cpu")


def test_pickles_and_runs_in_a_new_process(nc4_files):
    paths, ref = nc4_files
    ds = XarrayDataset(paths, ["t2m"], batch_size=4, device="cpu", return_time=True)
    ds2 = pickle.loads(pickle.dumps(ds))
    a = [b["x"] for b in ds]
    b = [b["x"] for b in ds2]
    assert len(a) == len(b) == 6
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, equal_nan=True, rtol=0, atol=0)


def _dali_or_skip():
    try:
        import nvidia.dali  # noqa: F401
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"DALI does not import here: {e}")


def test_dali_cpu_pipeline_epochs_operators_and_checkpoint(nc4_files):
    _dali_or_skip()
    import nvidia.dali.fn as fn
    import ferry.dali
    paths, ref = nc4_files
    mf = xr.open_mfdataset(paths, engine="ferry", device="cpu")

    def make():
        return XarrayDataset(mf, ["t2m", "z"], batch_size=4, target_steps=1, shuffle=True, seed=3, device="cpu")
    want = [(b["x"].numpy().copy(), b["y"].numpy().copy()) for b in make()]
    pipe = ferry.dali.pipeline(make(), outputs=("x", "y"), layout="CHW",
                               then=lambda x, y: (fn.flip(x, horizontal=1), y))
    pipe.build()

    def epoch(p):
        out = []
        try:
            while True:
                x, y = p.run()
                out.append((np.stack([np.array(t) for t in x]), np.stack([np.array(t) for t in y])))
        except StopIteration:
            return out
    got = epoch(pipe)
    assert len(got) == len(want) == 6
    for (x, y), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(x, wx[..., ::-1])
        np.testing.assert_array_equal(y, wy)
    pipe.reset()
    e1 = make()
    e1.set_epoch(1)
    want1 = [b["y"].numpy() for b in e1]
    got1 = epoch(pipe)
    assert len(got1) == 6 and any(not np.array_equal(a[1], b[1]) for a, b in zip(got1, got))
    for (_, y), wy in zip(got1, want1):
        np.testing.assert_array_equal(y, wy)

    # resume through DALI's own checkpoint: the next batch is the one the saved run gives next
    p1 = ferry.dali.pipeline(make(), outputs=("x", "y"))
    p1.build()
    for _ in range(2):
        p1.run()
    ck = p1.checkpoint()
    nxt = np.stack([np.array(t) for t in p1.run()[0]])
    p2 = ferry.dali.pipeline(make(), outputs=("x", "y"), checkpoint=ck)
    p2.build()
    np.testing.assert_array_equal(np.stack([np.array(t) for t in p2.run()[0]]), nxt)
    np.testing.assert_array_equal(nxt, want[2][0])


def test_dali_epochs_start_with_the_groups_read_ahead(nc4_files):
    """Each epoch after the first begins with the read groups the epoch before submitted for it
    (FERRY_EPOCH_AHEAD), through DALI as without it: the source's seek at DALI's epoch boundary
    (load_state_dict + iter) must take them, not drop them and read the epoch's start again."""
    _dali_or_skip()
    import ferry.dali
    paths, _ = nc4_files
    mf = xr.open_mfdataset(paths, engine="ferry", device="cpu")
    for via_dali in (False, True):
        ds = XarrayDataset(mf, ["t2m", "z"], batch_size=2, shuffle=True, seed=5, device="cpu",
                           batches_per_read=2, prefetch=2)
        taken, take = [], ds._take_ahead

        def counting(key, order, mine, group_units, take=take, taken=taken):
            got = take(key, order, mine, group_units)
            taken.append(len(got))
            return got
        ds._take_ahead = counting
        if via_dali:
            pipe = ferry.dali.pipeline(ds, outputs=("x",))
            pipe.build()
            for e in range(4):
                n = 0
                try:
                    while True:
                        pipe.run()
                        n += 1
                except StopIteration:
                    pass
                assert n == 12
                pipe.reset()
        else:
            for e in range(4):
                assert sum(1 for _ in ds) == 12
        assert len(taken) == 4 and taken[0] == 0 and all(t > 0 for t in taken[1:]), (via_dali, taken)


def test_dali_source_checks_its_outputs(nc4_files):
    _dali_or_skip()
    import ferry.dali
    paths, _ = nc4_files
    ds = XarrayDataset(paths, ["t2m"], batch_size=4, device="cpu")
    with pytest.raises(TypeError, match="outputs"):
        ferry.dali.DALISource(ds)()
    with pytest.raises(KeyError, match="nope"):
        ferry.dali.DALISource(ds, outputs=("x", "nope"))()


def _write_era_files(d, scales=(0.01, 0.01, 0.01), full=None):
    pytest.importorskip("netCDF4")
    full = _era(np.random.default_rng(0)) if full is None else full
    paths = []
    for i, sc in enumerate(scales):
        enc = {"t2m": {"dtype": "int16", "scale_factor": sc, "add_offset": 280.0, "_FillValue": -32767},
               "z": {}}
        p = str(d / f"era_{i}.nc")
        full.isel(time=slice(8 * i, 8 * i + 8)).to_netcdf(p, engine="netcdf4", encoding=enc)
        paths.append(p)
    return paths


def test_files_with_their_own_cf_parameters_decode_each_with_its_own(tmp_path):
    paths = _write_era_files(tmp_path, scales=(0.01, 0.02, 0.005))
    ref = xr.open_mfdataset(paths, engine="netcdf4", combine="by_coords").load()
    assert not np.allclose(ref.t2m.values[8:16], xr.open_dataset(paths[1], engine="netcdf4",
                                                                 mask_and_scale=False).t2m.values[:] * 0.01 + 280)
    for data in (paths, xr.open_mfdataset(paths, engine="ferry", device="cpu")):
        ds = XarrayDataset(data, ["t2m", "z"], batch_size=5, input_steps=2, target_steps=1, shuffle=True,
                           device="cpu", return_time=True)
        assert sorted(_check_batches(ds, ref, ["t2m", "z"], [0, 1], [2])) == list(range(T - 2))
    # patches (one slot per sample) and computed stats decode per file too
    ds = XarrayDataset(paths, ["t2m"], batch_size=6, patch=(H, W), device="cpu", return_time=True,
                       normalize="compute", stats_steps=T)
    np.testing.assert_allclose(ds._norm["t2m"][0], [np.nanmean(ref.t2m.values.astype(np.float64))], rtol=1e-6)
    ds = XarrayDataset(paths, ["t2m"], batch_size=6, patch=(H, W), device="cpu", return_time=True)
    _check_batches(ds, ref, ["t2m"], [0])


def test_files_that_store_a_variable_differently_are_refused(tmp_path):
    paths = _write_era_files(tmp_path)
    other = _era(np.random.default_rng(0)).isel(time=slice(8, 16))
    other.assign(z=other.z.astype("float64")).to_netcdf(paths[1], engine="netcdf4")
    with pytest.raises(ValueError, match=r"'z'.*era_0\.nc.*era_1\.nc.*dtype"):
        XarrayDataset(paths, ["z"], device="cpu")
    other.assign_coords(level=[1, 2, 3]).to_netcdf(paths[1], engine="netcdf4")
    with pytest.raises(ValueError, match=r"era_1\.nc.*'level' coordinate"):
        XarrayDataset(paths, ["z"], device="cpu")


def test_computed_dask_variables_are_refused(nc4_files):
    paths, ref = nc4_files
    mf = xr.open_mfdataset(paths, engine="ferry", device="cpu")
    one = xr.open_dataset(paths[0], engine="ferry", device="cpu", chunks={})
    for bad in (mf.assign(z=mf.z - 100), mf.assign(z=mf.z.where(mf.z > 0)), mf.assign(z=mf.z.astype("float64")),
                one.assign(z=one.z * 2)):
        with pytest.raises(ValueError, match="as stored.*transform="):
            XarrayDataset(bad, ["z"], device="cpu")
    # what open_dataset / open_mfdataset / isel / sel make is read
    XarrayDataset(one.isel(time=slice(1, 5)), ["z"], device="cpu")
    ds = XarrayDataset(mf.sel(level=[850, 500]).isel(time=slice(2, 20)), ["z"], device="cpu", return_time=True,
                       batch_size=4)
    _check_batches(ds, ref.sel(level=[850, 500]).isel(time=slice(2, 20)), ["z"], [0])


def test_a_file_replaced_between_epochs_raises(tmp_path):
    paths = _write_era_files(tmp_path)
    ds = XarrayDataset(paths, ["t2m", "z"], batch_size=4, device="cpu")
    assert len(list(ds)) == 6
    # another layout in its place (z float64, t2m unpacked), swapped in atomically
    other = _era(np.random.default_rng(7)).isel(time=slice(8, 16))
    tmp = str(tmp_path / "new.nc")
    other.assign(z=other.z.astype("float64")).to_netcdf(tmp, engine="netcdf4")
    os.replace(tmp, paths[1])
    ds.set_epoch(1)
    with pytest.raises(ferry.FerryError, match=r"era_1\.nc"):
        list(ds)
    # a fresh process (a copy of the dataset) opens the new file: refused too
    with pytest.raises(ferry.FerryError, match=r"era_1\.nc"):
        list(pickle.loads(pickle.dumps(ds)))


def test_stats_cache_is_keyed_by_files_and_selection(tmp_path, nc4_files):
    paths, _ = nc4_files
    sf = str(tmp_path / "stats.json")
    mf = xr.open_mfdataset(paths, engine="ferry", device="cpu")
    a = XarrayDataset(mf.isel(level=[0]), ["z"], device="cpu", normalize="compute", stats_file=sf)
    # the same shape, another level: its own stats
    b = XarrayDataset(mf.isel(level=[2]), ["z"], device="cpu", normalize="compute", stats_file=sf)
    zb = mf.z.isel(level=2).values
    np.testing.assert_allclose(b._norm["z"][0], [np.nanmean(zb)], rtol=1e-6)
    assert not np.allclose(a._norm["z"][0], b._norm["z"][0])
    # other files of the same shape: their own stats
    other = _era(np.random.default_rng(11))
    other = other.assign(z=other.z + 1000)
    ops = _write_era_files(tmp_path, full=other)
    c = XarrayDataset(xr.open_mfdataset(ops, engine="ferry", device="cpu").isel(level=[2]), ["z"], device="cpu",
                      normalize="compute", stats_file=sf)
    assert c._norm["z"][0][0] > b._norm["z"][0][0] + 500


def test_windows_need_an_evenly_spaced_sample_dim(nc4_files):
    paths, _ = nc4_files
    mf = xr.open_mfdataset(paths, engine="ferry", device="cpu")
    gappy = mf.isel(time=list(range(0, 8)) + list(range(16, 24)))
    with pytest.raises(ValueError, match="evenly spaced.*2020-01-05T00.*follows 2020-01-02T18"):
        XarrayDataset(gappy, ["z"], target_steps=1, device="cpu")
    with pytest.raises(ValueError, match="evenly spaced"):
        XarrayDataset([paths[0], paths[2]], ["z"], input_steps=2, device="cpu")
    XarrayDataset(gappy, ["z"], device="cpu")                 # one step per sample: no pairing
    XarrayDataset(mf.isel(time=slice(0, None, 2)), ["z"], input_steps=2, device="cpu")   # even stride


def test_patches_of_a_reordered_spatial_dim_are_refused(nc4_files):
    paths, ref = nc4_files
    flipped = xr.open_mfdataset(paths, engine="ferry", device="cpu").isel(lat=slice(None, None, -1))
    with pytest.raises(ValueError, match="patch=.*'lat'"):
        XarrayDataset(flipped, ["z"], patch=(4, 4), device="cpu")
    # without patches the reordered field is read as selected
    ds = XarrayDataset(flipped, ["z"], batch_size=4, device="cpu", return_time=True)
    _check_batches(ds, ref.isel(lat=slice(None, None, -1)), ["z"], [0])


def test_renamed_variables_are_refused(nc4_files):
    paths, _ = nc4_files
    for mf in (xr.open_mfdataset(paths, engine="ferry", device="cpu"), xr.open_dataset(paths[0], engine="ferry")):
        with pytest.raises(ValueError, match="'geopot'.*'z'.*renamed"):
            XarrayDataset(mf.rename({"z": "geopot"}), ["geopot"], device="cpu")
        with pytest.raises(ValueError, match="renamed"):
            XarrayDataset(mf.rename({"z": "t2m", "t2m": "z"}), ["z"], device="cpu")


def test_dali_source_continues_a_state_loaded_before_it_was_made(nc4_files):
    _dali_or_skip()
    import ferry.dali
    paths, _ = nc4_files

    def make():
        return XarrayDataset(paths, ["t2m"], batch_size=4, shuffle=True, seed=3, device="cpu")
    want = [b["x"].numpy().copy() for b in make()]
    ds = make()
    it = iter(ds)
    for _ in range(2):
        next(it)
    st = ds.state_dict()
    it.close()
    ds2 = make()
    ds2.load_state_dict(st)
    src = ferry.dali.DALISource(ds2, outputs=("x",))
    got = []
    try:
        while True:
            got.append(np.asarray(src()[0]).copy())
    except StopIteration:
        pass
    assert len(got) == len(want) - 2
    for g, w in zip(got, want[2:]):
        np.testing.assert_array_equal(g, w)
