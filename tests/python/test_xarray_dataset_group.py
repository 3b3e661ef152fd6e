"""XarrayDataset reads several batches per plan (batches_per_read): every batch equals what
xarray's own engine reads, across the boundaries of groups and files, at the end of epochs
(short last groups and batches), after a resume in the middle of a group (with another group
size and world size), and no batch of a group shares memory with another."""
import time

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from ferry.torch import XarrayDataset
from test_xarray_dataset import _sample as _want   # reference channels, in the dataset's order

T, L, H, W = 29, 2, 6, 8


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Three netCDF-3 files along time (scipy's writer): t2m packed int16 with scale/offset and a
    fill value (decoded by the dataset), z float32 with levels (read in place)."""
    d = tmp_path_factory.mktemp("grp")
    rng = np.random.default_rng(3)
    t2m = rng.normal(280, 10, (T, H, W)).astype(np.float32)
    t2m[5, 1, 2] = np.nan
    z = rng.normal(5000, 100, (T, L, H, W)).astype(np.float32)
    full = xr.Dataset({"t2m": (("time", "lat", "lon"), t2m), "z": (("time", "level", "lat", "lon"), z)},
                      coords={"time": pd.date_range("2021-01-01", periods=T, freq="h"), "level": [500, 850],
                              "lat": np.linspace(-60, 60, H), "lon": np.arange(W) * 45.0})
    paths = []
    for i, (lo, hi) in enumerate(((0, 10), (10, 17), (17, T))):
        p = str(d / f"g{i}.nc")
        full.isel(time=slice(lo, hi)).to_netcdf(p, engine="scipy", encoding={
            "t2m": {"dtype": "int16", "scale_factor": 0.01, "add_offset": 280.0, "_FillValue": -32767}})
        paths.append(p)
    ref = xr.concat([xr.open_dataset(p, engine="scipy").load() for p in paths], dim="time")
    return paths, ref




def _check(batches, ref, in_steps, tg_steps, sizes=None):
    """Every batch's samples equal the reference; returns the sample start indices in order."""
    seen = []
    for b in batches:
        if sizes is not None:
            sizes.append(len(b["x"]))
        for k, t in enumerate(b["time"].numpy()):
            i = int(np.searchsorted(ref.time.values, np.int64(t).astype("datetime64[ns]")))
            seen.append(i)
            np.testing.assert_allclose(b["x"][k].numpy(), _want(ref, i, ["t2m", "z"], in_steps),
                                       rtol=1e-6, equal_nan=True)
            if tg_steps:
                np.testing.assert_allclose(b["y"][k].numpy(), _want(ref, i, ["z"], tg_steps),
                                           rtol=1e-6, equal_nan=True)
    return seen


def _ds(paths, **kw):
    mf = xr.open_mfdataset(paths, engine="ferry", device="cpu")
    args = dict(batch_size=3, input_steps=2, target_steps=1, lead=2, target_variables=["z"], shuffle=True,
                seed=7, device="cpu", return_time=True)
    args.update(kw)
    return XarrayDataset(mf, ["t2m", "z"], **args)


@pytest.mark.parametrize("group", [1, 2, 3, 4])
def test_groups_equal_xarray_over_group_file_and_epoch_ends(files, group):
    paths, ref = files
    ds = _ds(paths, batches_per_read=group)
    assert ds.batch_group == group
    n = ds.num_samples                                   # 29 - 2 + 1 - 2 = 26 windows: 9 batches
    assert n == 26 and len(ds) == 9
    for epoch in range(2):                               # 9 batches: the last group is short
        ds.set_epoch(epoch)
        sizes = []
        seen = _check(ds, ref, (0, 1), (3,), sizes)
        assert sorted(seen) == list(range(n)), (group, epoch)
        assert sizes == [3] * 8 + [2]                    # the short last batch, in the last group
        if epoch == 0:
            first = seen
    assert seen != first                                 # a new order in the next epoch


def test_groups_give_the_same_batches_as_single_batch_plans(files):
    paths, ref = files
    outs = {}
    for group in (1, 4):
        ds = _ds(paths, batches_per_read=group, drop_last=True, return_mask=True, nan_to=0.0)
        outs[group] = [{k: v.clone() for k, v in b.items()} for b in ds]
    assert len(outs[1]) == len(outs[4]) == 8
    for a, b in zip(outs[1], outs[4]):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k


def test_resume_in_the_middle_of_a_group_on_another_group_size_and_world(files):
    paths, ref = files
    ds = _ds(paths, batches_per_read=4)
    it = iter(ds)
    got = _check([next(it) for _ in range(5)], ref, (0, 1), (3,))      # into the second group
    state = ds.state_dict()
    del it
    assert state["samples_consumed"] == 15
    rest = []
    for rank in range(2):                                # resumed on 2 ranks, 3 batches a plan
        r = _ds(paths, batches_per_read=3, rank=rank, world_size=2)
        r.load_state_dict(state)
        rest += _check(r, ref, (0, 1), (3,))
    assert sorted(got + rest) == list(range(ds.num_samples))


def test_every_sample_once_over_ranks_and_workers_with_groups(files):
    paths, ref = files
    seen = []
    for rank in range(3):
        ds = _ds(paths, batches_per_read=2, rank=rank, world_size=3, input_steps=1, target_steps=0)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        seen += _check(dl, ref, (0,), ())
    assert sorted(seen) == list(range(T))


def test_batches_of_a_group_do_not_share_memory(files):
    """A step that x and y, or two batches of a group, both need is held once per output:
    modifying x in place (a loop adding noise) leaves y and the other batches as read."""
    paths, ref = files
    ds = _ds(paths, batches_per_read=4, shuffle=False, input_steps=1, target_steps=1, lead=1)
    batches = []
    for b in ds:                            # y of sample t is x of sample t + 1
        batches.append(b)
        b["x"].add_(1000.0)
    seen = []
    for b in batches:
        for k, t in enumerate(b["time"].numpy()):
            i = int(np.searchsorted(ref.time.values, np.int64(t).astype("datetime64[ns]")))
            seen.append(i)
            np.testing.assert_allclose(b["x"][k].numpy(), _want(ref, i, ["t2m", "z"], (0,)) + 1000.0,
                                       rtol=1e-6, equal_nan=True)
            np.testing.assert_allclose(b["y"][k].numpy(), _want(ref, i, ["z"], (1,)), rtol=1e-6)
    assert seen == list(range(T - 1))


def test_patches_in_groups_equal_windows_of_the_field(files):
    paths, ref = files
    ds = _ds(paths, batches_per_read=3, patch=(3, 4), input_steps=1, target_steps=0)
    seen = 0
    for b in ds:
        for k, t in enumerate(b["time"].numpy()):
            i = int(np.searchsorted(ref.time.values, np.int64(t).astype("datetime64[ns]")))
            field = _want(ref, i, ["t2m", "z"], (0,))
            x = b["x"][k].numpy()
            hits = [(oy, ox) for oy in range(H - 2) for ox in range(W - 3)
                    if np.allclose(field[:, oy:oy + 3, ox:ox + 4], x, rtol=1e-6, equal_nan=True)]
            assert hits, i
            seen += 1
    assert seen == T


def test_group_size_default_and_checks(files):
    paths, _ = files
    assert _ds(paths).batch_group == 1 and _ds(paths, device="cuda").batch_group == 1
    assert _ds(paths, batches_per_read=5).batch_group == 5
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="batches_per_read"):
            _ds(paths, batches_per_read=bad)


def test_dali_source_over_groups_and_a_checkpoint_in_the_middle_of_one(files):
    try:
        import nvidia.dali  # noqa: F401
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"DALI does not import: {e}")
    import ferry.dali
    paths, _ = files
    want = [b["x"].numpy().copy() for b in _ds(paths, batches_per_read=1)]

    def run(p, n=None):
        out = []
        try:
            while n is None or len(out) < n:
                out.append(np.stack([np.array(t) for t in p.run()[0]]))
        except StopIteration:
            pass
        return out
    pipe = ferry.dali.pipeline(_ds(paths, batches_per_read=4), outputs=("x",))
    pipe.build()
    got = run(pipe)
    assert len(got) == len(want) == 9
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    p1 = ferry.dali.pipeline(_ds(paths, batches_per_read=4), outputs=("x",))
    p1.build()
    run(p1, 5)                                  # into the second group
    ck = p1.checkpoint()
    p2 = ferry.dali.pipeline(_ds(paths, batches_per_read=3), outputs=("x",), checkpoint=ck)
    p2.build()
    rest = run(p2)
    assert len(rest) == 4
    for a, b in zip(rest, want[5:]):
        np.testing.assert_array_equal(a, b)


class _SlowJob:
    """A job that says it is not done until waited for (the consumer would wait for it)."""

    def __init__(self, job):
        self.job, self.waited = job, False

    def done(self):
        return self.waited and self.job.done()

    def wait(self, *a):
        self.waited = True
        return self.job.wait(*a)

    def __getattr__(self, name):
        return getattr(self.job, name)


@pytest.mark.parametrize("ready", [True, False])
def test_when_a_groups_planning_starts(files, monkeypatch, ready):
    """Never at submit: the planner thread runs Python, and started at submit it ran beside the
    consumer's hand-off of the group before (one GIL). When the group handed out is ready (a loop
    waiting on its step), the groups behind it are planned once it is handed out; when the consumer
    is about to wait for it, during that wait (else, with two groups in flight, the engine idles
    while the next one is planned)."""
    import ferry.torch.xarray_reads as X
    paths, ref = files
    events = []
    sub, fin, start, rows = XarrayDataset._submit, XarrayDataset._finish, X._Planned._start, XarrayDataset._read_rows
    hand = XarrayDataset._handoff

    def submit(self, rt, order, lay, units, ids=None):
        g = sub(self, rt, order, lay, units, ids)
        events.append(("submit", units[0]))
        return g

    def handoff(self, rt, g, retiring):
        events.append(("hand-off", g.units[0]))
        return hand(self, rt, g, retiring)

    def finish(self, g):
        events.append(("handing out", g.units[0]))
        return fin(self, g)

    def started(self):
        if self.fut is None:
            events.append(("start", self.g.units[0]))
        start(self)

    def read_rows(self, rt, row_steps, boxes, *engine_jobs):
        bufs, job, handles = rows(self, rt, row_steps, boxes, *engine_jobs)
        if ready:
            job.wait()                          # read before the consumer asks for it
            return bufs, job, handles
        return bufs, _SlowJob(job), handles
    for name, fn in (("_submit", submit), ("_handoff", handoff), ("_finish", finish), ("_read_rows", read_rows)):
        monkeypatch.setattr(XarrayDataset, name, fn)
    monkeypatch.setattr(X._Planned, "_start", started)
    # one epoch's groups; the next epoch's, read ahead, are planned at the pass's end
    # (test_torch_epoch_ahead.py)
    monkeypatch.setenv("FERRY_EPOCH_AHEAD", "off")
    ds = _ds(paths, batches_per_read=2, prefetch=2)       # two groups in flight

    def batches():                              # ready: a step long enough for every read
        for b in ds:
            yield b
            if ready:
                time.sleep(0.05)
    assert sorted(_check(batches(), ref, (0, 1), (3,))) == list(range(ds.num_samples))
    first = events.index(("hand-off", 0))
    late = [u for kind, u in events[first:] if kind == "submit"]
    assert late                                  # groups submitted while others were consumed
    for u in late:
        i, j = events.index(("submit", u)), events.index(("start", u))
        kinds = [kind for kind, _ in events[i + 1:j]]
        assert "hand-off" in kinds, (u, repr(events))        # never at submit
        # ready: after the hand-off's output is made; else before it, while the consumer waits
        assert kinds[-1] == ("handing out" if ready else "hand-off"), (u, repr(events))
