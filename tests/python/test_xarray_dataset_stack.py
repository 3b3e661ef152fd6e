"""XarrayDataset's batch stack: variables read by one plan straight into their channels of one
buffer, CF decoding in place where the stored type is the batch's, variables of other stored types
(float64, int16 packing) and re-indexed selections in slabs of their own, targets of other
variables in another order — all equal to what netCDF4 reads through xarray."""
import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from ferry.torch import XarrayDataset

T, L, H, W = 14, 3, 6, 10


def _write(tmp_path, mixed):
    pytest.importorskip("netCDF4")
    rng = np.random.default_rng(3)
    a = rng.normal(10, 3, (T, H, W)).astype(np.float32)
    b = rng.normal(-5, 1, (T, L, H, W)).astype(np.float32)
    c = rng.normal(0, 1, (T, H, W)).astype(np.float64 if mixed else np.float32)
    a[1, 2, 3] = np.nan
    b[4, 1, 0, 0] = np.nan
    ds = xr.Dataset({"a": (("time", "lat", "lon"), a), "b": (("time", "level", "lat", "lon"), b),
                     "c": (("time", "lat", "lon"), c)},
                    coords={"time": pd.date_range("2000-01-01", periods=T, freq="D"), "level": [1, 2, 3],
                            "lat": np.arange(H, dtype=np.float64), "lon": np.arange(W, dtype=np.float64)})
    # a: float32 packed as float32 with a fill that is a number (-9999) and scale/offset;
    # b: xarray's default NaN fill; c: float64 (mixed) or float32 with no fill
    enc = {"a": {"dtype": "float32", "scale_factor": 2.0, "add_offset": 1.0, "_FillValue": -9999.0,
                 "chunksizes": (1, H, W), "zlib": True},
           "b": {"chunksizes": (1, L, H, W)}, "c": {"_FillValue": None}}
    p = str(tmp_path / "stack.nc")
    ds.to_netcdf(p, engine="netcdf4", encoding=enc)
    return p, xr.open_dataset(p, engine="netcdf4").load()


def _want(ref, i, names, steps):
    out = []
    for s in steps:
        for n in names:
            v = ref[n].values[i + s].astype(np.float32)
            out.append(v[None] if v.ndim == 2 else v)
    return np.concatenate(out, 0)


@pytest.mark.parametrize("mixed", [False, True])
def test_stack_equals_netcdf4_with_targets_of_other_variables(tmp_path, mixed):
    p, ref = _write(tmp_path, mixed)
    assert np.isnan(ref.a.values[1, 2, 3]) and np.isnan(ref.b.values[4, 1, 0, 0])
    ds = XarrayDataset(p, ["a", "b", "c"], batch_size=4, input_steps=2, target_steps=2, lead=2,
                       target_variables=["c", "a"], shuffle=True, seed=3, device="cpu", return_time=True,
                       return_mask=True, nan_to=-1.0)
    assert ds._in_place is (not mixed)
    seen = []
    for bt in ds:
        for k, t in enumerate(bt["time"].numpy()):
            i = int(np.searchsorted(ref.time.values, np.int64(t).astype("datetime64[ns]")))
            seen.append(i)
            wx = _want(ref, i, ["a", "b", "c"], [0, 1])
            np.testing.assert_array_equal(bt["mask"][k].numpy(), ~np.isnan(wx))
            np.testing.assert_allclose(bt["x"][k].numpy(), np.nan_to_num(wx, nan=-1.0), rtol=1e-6)
            wy = _want(ref, i, ["c", "a"], [3, 4])
            np.testing.assert_allclose(bt["y"][k].numpy(), np.nan_to_num(wy, nan=-1.0), rtol=1e-6)
    assert sorted(seen) == list(range(T - 5 + 1))


def test_reindexed_levels_normalised_next_to_shared_variables(tmp_path):
    p, ref = _write(tmp_path, True)
    mf = xr.open_dataset(p, engine="ferry", device="cpu").sel(level=[3, 1])
    r = ref.sel(level=[3, 1])
    norm = {"a": (1.0, 2.0), "b": ([0.5, -0.5], [4.0, 8.0])}
    ds = XarrayDataset(mf, ["a", "b", "c"], batch_size=5, device="cpu", return_time=True, normalize=norm)
    assert [s.plain for s in ds._slabs] == [True, False, True]      # a | b re-indexed | c float64
    for bt in ds:
        for k, t in enumerate(bt["time"].numpy()):
            i = int(np.searchsorted(r.time.values, np.int64(t).astype("datetime64[ns]")))
            w = _want(r, i, ["a", "b", "c"], [0])
            w[0] = (w[0] - 1.0) / 2.0
            w[1] = (w[1] - 0.5) / 4.0
            w[2] = (w[2] + 0.5) / 8.0
            np.testing.assert_allclose(bt["x"][k].numpy(), w, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_float32_batches_are_the_buffer_the_engine_read_into(tmp_path, monkeypatch):
    """Batches of float32 variables stored as float32 (one sample step each) are read straight
    into their place: no decode pass, no gather, no concatenation per batch (a copy per variable
    cost XarrayDataset 40% of .load()'s rate on netCDF-3)."""
    p, ref = _write(tmp_path, False)
    bufs = []
    orig = XarrayDataset._alloc

    def alloc(self, rt, shape, dtype, pinned=False):
        t = orig(self, rt, shape, dtype, pinned)
        bufs.append(t.data_ptr())
        return t
    monkeypatch.setattr(XarrayDataset, "_alloc", alloc)
    ds = XarrayDataset(p, ["b", "c"], batch_size=4, shuffle=True, device="cpu", prefetch=0)
    n = 0
    for bt in ds:
        # a block of its group's buffer (batches_per_read batches a plan), at the batch's rows
        assert bt["x"].untyped_storage().data_ptr() == bufs[-1]
        assert bt["x"].data_ptr() == bufs[-1] + (n % ds.batch_group) * 4 * bt["x"][0].nbytes
        n += 1
    assert n == 4 and len(bufs) == -(-4 // ds.batch_group)   # one buffer per group, for every variable


def test_batches_are_planned_off_the_consumers_thread(tmp_path, monkeypatch):
    """Plans are built and submitted on the planner thread (the consumer's thread waiting for its
    training step would otherwise idle the GPU for the planning), in order, and every open store
    is given back once its batches are done."""
    import threading
    p, ref = _write(tmp_path, True)
    where = []
    orig = XarrayDataset._read_rows

    def read_rows(self, rt, rows, boxes, *engine_jobs):
        where.append((threading.get_ident(), tuple(np.asarray(rows).tolist())))
        return orig(self, rt, rows, boxes, *engine_jobs)
    monkeypatch.setattr(XarrayDataset, "_read_rows", read_rows)
    monkeypatch.setenv("FERRY_EPOCH_AHEAD", "off")       # one epoch's plans (and no stores kept for the next)
    ds = XarrayDataset(p, ["a", "b", "c"], batch_size=3, shuffle=True, seed=4, device="cpu", prefetch=3,
                       return_time=True)
    got = []
    for bt in ds:
        got.extend(int(np.searchsorted(ref.time.values, np.int64(t).astype("datetime64[ns]")))
                   for t in bt["time"].numpy())
        np.testing.assert_allclose(bt["x"][:, 0].numpy(), ref.a.values[got[-len(bt["x"]):]], rtol=1e-6)
    me = threading.get_ident()
    assert where and all(t != me for t, _ in where)
    assert [i for _, r in where for i in r] == got                  # submitted in batch order
    assert all(e[1] == 0 for e in ds._rt.handles.values())          # every store given back


def test_a_group_read_before_its_job_waits_for_the_planning(tmp_path, monkeypatch):
    """The batch stream may look at a group's buffers and stores before its job: they are what the
    planning made, whatever the order. A planning error is raised by the job, never by cleanup."""
    import threading
    p, ref = _write(tmp_path, True)
    ds = XarrayDataset(p, ["a", "b"], batch_size=2, device="cpu")
    gate = threading.Event()
    orig = XarrayDataset._read_rows

    def slow(self, rt, rows, boxes, *engine_jobs):
        gate.wait(5)
        return orig(self, rt, rows, boxes, *engine_jobs)
    monkeypatch.setattr(XarrayDataset, "_read_rows", slow)
    rt = ds._runtime(ds._resolve_device(False), False, 1)
    order = ds._order(0)
    from ferry.torch.stream import _Layout
    lay = _Layout(ds.num_samples, 0, 1, 0, 2, False)
    g = ds._submit(rt, order, lay, [0])
    threading.Timer(0.2, gate.set).start()
    assert len(g.bufs) == 1 and len(g.handles) == 1              # waited for the planner (a, b: one slab)
    g.job.wait()
    np.testing.assert_allclose(ds._finish(g)[0]["x"][:, 0].numpy(), ref.a.values[:2], rtol=1e-6)
    ds._release(rt, g)

    def broken(self, rt, rows, boxes, *engine_jobs):
        raise RuntimeError("planning failed")
    monkeypatch.setattr(XarrayDataset, "_read_rows", broken)
    g = ds._submit(rt, order, lay, [1])
    assert g.bufs == [] and g.handles == []
    with pytest.raises(RuntimeError, match="planning failed"):
        g.job.wait()
    ds._release(rt, g)
    with pytest.raises(RuntimeError, match="planning failed"):
        next(iter(ds))


def test_a_plan_that_fails_gives_its_stores_back(tmp_path, monkeypatch):
    p, ref = _write(tmp_path, False)
    ds = XarrayDataset(p, ["a"], batch_size=2, device="cpu")
    assert next(iter(ds))["x"].shape == (2, 1, H, W)

    def refuse(self, st, seen):
        raise RuntimeError("not by ferry's engine")
    monkeypatch.setattr(XarrayDataset, "_specs", refuse)
    with pytest.raises(RuntimeError, match="engine"):
        next(iter(ds))
    assert ds._rt.handles and all(e[1] == 0 for e in ds._rt.handles.values())
