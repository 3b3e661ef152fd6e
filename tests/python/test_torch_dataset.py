"""ferry.torch.ArrayDataset on the host path: order, sharding, resume, contents, loaders.

Golden files are written by numpy (np.save), safetensors.numpy and zarr; contents are checked
against numpy's own reading of the same files. Every sample carries its global id (field "id"),
so coverage and order are checked on what the engine actually read."""
import contextlib
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import ferry.torch as ft  # noqa: E402
import ferry.torch.groups as ft_groups  # noqa: E402
import ferry.torch.order as ft_order  # noqa: E402
import ferry.torch.state as ft_state  # noqa: E402
import ferry.torch.stream as ft_stream  # noqa: E402
from ferry.torch import ArrayDataset, epoch_order, global_state  # noqa: E402

N = 103                     # samples; shards of uneven sizes
SHARDS = [17, 40, 1, 45]


def _write_npy(root, n=N, sizes=SHARDS, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 255, size=(n, 3, 4, 5), dtype=np.uint8)
    f = rng.standard_normal((n, 6)).astype(np.float32)
    ids = np.arange(n, dtype=np.int64)
    lo = 0
    for i, s in enumerate(sizes):
        np.save(root / f"x_{i}.npy", x[lo:lo + s])
        np.save(root / f"f_{i}.npy", f[lo:lo + s])
        np.save(root / f"id_{i}.npy", ids[lo:lo + s])
        lo += s
    assert lo == n
    return {"x": x, "f": f, "id": ids}


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    root = tmp_path_factory.mktemp("npy")
    ref = _write_npy(root)
    fields = {"x": str(root / "x_*.npy"), "f": str(root / "f_*.npy"), "id": str(root / "id_*.npy")}
    # numpy's own reading of the files, concatenated
    got = {k: np.concatenate([np.load(p) for p in sorted(root.glob(f"{k}_*.npy"),
                                                         key=lambda p: int(p.stem.split("_")[1]))])
           for k in fields}
    for k in fields:
        np.testing.assert_array_equal(got[k], ref[k])
    return types.SimpleNamespace(root=root, fields=fields, ref=got)


def _ids(batch):
    return batch["id"].reshape(-1).tolist()


def _check_contents(batch, ref):
    ids = batch["id"].numpy().reshape(-1)
    for k, v in batch.items():
        np.testing.assert_array_equal(v.numpy().reshape((len(ids),) + ref[k].shape[1:]), ref[k][ids])


@contextlib.contextmanager
def _as_worker(wid, nw):
    """Run as if inside DataLoader worker `wid` of `nw` (no process)."""
    mods = [m for m in (ft_stream, ft_state, ft_groups) if hasattr(m, "get_worker_info")]
    saved = [m.get_worker_info for m in mods]
    for m in mods:
        m.get_worker_info = lambda: types.SimpleNamespace(id=wid, num_workers=nw)
    try:
        yield
    finally:
        for m, f in zip(mods, saved):
            m.get_worker_info = f


def _rank_stream(fields, rank, world, workers, **kw):
    """Batches of one rank in the order a DataLoader with `workers` workers delivers them."""
    if workers == 0:
        return list(ArrayDataset(fields=fields, rank=rank, world_size=world, device="cpu", **kw))
    per = []
    for w in range(workers):
        ds = ArrayDataset(fields=fields, rank=rank, world_size=world, device="cpu", **kw)
        with _as_worker(w, workers):
            per.append(list(ds))
    out = []
    for i in range(max(len(p) for p in per)):     # the DataLoader's round-robin
        out.extend(p[i] for p in per if i < len(p))
    return out


# ------------------------------------------------------------------------------------------
def test_contents_equal_numpy(npy):
    ds = ArrayDataset(fields=npy.fields, batch_size=8, shuffle=True, seed=3, device="cpu")
    assert ds.num_samples == N and len(ds) == -(-N // 8)
    assert ds.fields["x"] == ((3, 4, 5), torch.uint8)
    seen = []
    for b in ds:
        assert b["x"].dtype == torch.uint8 and b["f"].dtype == torch.float32
        assert b["id"].dtype == torch.int64 and b["x"].device.type == "cpu"
        _check_contents(b, npy.ref)
        seen += _ids(b)
    assert sorted(seen) == list(range(N))
    assert seen == epoch_order(N, 3, 0).tolist()
    assert ds.last_path == "host"


def test_single_source_yields_tensors_and_per_sample_mode(npy):
    ds = ArrayDataset(npy.fields["f"], batch_size=10, device="cpu", prefetch=0)
    bs = list(ds)
    assert all(isinstance(b, torch.Tensor) for b in bs)
    np.testing.assert_array_equal(torch.cat(bs).numpy(), npy.ref["f"])
    ds = ArrayDataset(fields=npy.fields, batch_size=None, shuffle=True, seed=1, device="cpu",
                      sample_group=7)
    samples = list(ds)
    assert len(samples) == N and samples[0]["x"].shape == (3, 4, 5) and samples[0]["id"].shape == ()
    ids = [int(s["id"]) for s in samples]
    assert ids == epoch_order(N, 1, 0).tolist()
    for s in samples[:20]:
        np.testing.assert_array_equal(s["x"].numpy(), npy.ref["x"][int(s["id"])])


def test_epoch_order_is_a_stable_function_of_seed_and_epoch():
    a = epoch_order(1000, seed=5, epoch=2)
    assert sorted(a.tolist()) == list(range(1000))
    assert np.array_equal(a, epoch_order(1000, seed=5, epoch=2))
    assert not np.array_equal(a, epoch_order(1000, seed=5, epoch=3))
    assert not np.array_equal(a, epoch_order(1000, seed=6, epoch=2))
    # golden values: the order must not change between numpy versions or machines
    assert epoch_order(10, seed=0, epoch=0).tolist() == GOLDEN_10
    assert epoch_order(5, shuffle=False).tolist() == [0, 1, 2, 3, 4]
    b = epoch_order(100, seed=1, epoch=0, block_size=8)
    assert sorted(b.tolist()) == list(range(100))
    runs = np.split(b, np.flatnonzero(np.diff(b) != 1) + 1)
    assert all(r[0] % 8 == 0 and len(r) in (8, 4) for r in runs) and len(runs) == 13


GOLDEN_10 = [8, 5, 9, 2, 3, 7, 0, 6, 1, 4]


def test_determinism_across_runs(npy):
    def run():
        return [_ids(b) for b in ArrayDataset(fields=npy.fields, batch_size=16, shuffle=True,
                                              seed=11, device="cpu")]
    assert run() == run()
    ds = ArrayDataset(fields=npy.fields, batch_size=16, shuffle=True, seed=11, device="cpu")
    e0 = [_ids(b) for b in ds]
    e1 = [_ids(b) for b in ds]        # the finished epoch rolled over to epoch 1
    assert ds.epoch == 2 and e0 != e1 and sorted(sum(e1, [])) == list(range(N))
    ds.set_epoch(1)
    assert [_ids(b) for b in ds] == e1


@pytest.mark.parametrize("batch,drop_last", [(4, False), (4, True), (5, False), (None, False),
                                             (None, True)])
def test_exactly_once_for_ranks_and_workers(npy, batch, drop_last):
    b = batch or 1
    order = epoch_order(N, 7, 0).tolist()
    for world in range(1, 9):
        full = N // (world * b)
        per_rank = []
        for rank in range(world):
            workers_seen = []
            for workers in range(0, 5):
                out = _rank_stream(npy.fields, rank, world, workers, batch_size=batch,
                                   drop_last=drop_last, shuffle=True, seed=7, prefetch=2)
                workers_seen.append([_ids(x) for x in out])
            # the number of workers changes nothing in what a rank receives, nor its order
            assert all(w == workers_seen[0] for w in workers_seen), (world, rank)
            per_rank.append(workers_seen[0])
        # global step s consumes positions [s*W*B, (s+1)*W*B) of the epoch order
        for s in range(full):
            step = sum((per_rank[r][s] for r in range(world)), [])
            assert step == order[s * world * b:(s + 1) * world * b], (world, s)
        got = sorted(i for r in per_rank for x in r for i in x)
        if drop_last:
            assert got == sorted(order[:full * world * b])
            assert all(len(r) == full for r in per_rank)
        else:
            assert got == list(range(N)), world       # each sample exactly once
            assert all(len(x) <= b for r in per_rank for x in r)


def test_resume_mid_epoch_exact(npy):
    kw = dict(fields=npy.fields, batch_size=6, shuffle=True, seed=2, device="cpu")
    ds = ArrayDataset(**kw)
    it = iter(ds)
    first = [_ids(next(it)) for _ in range(5)]
    state = ds.state_dict()
    assert state["epoch"] == 0 and state["samples_consumed"] == 30 and state["seed"] == 2
    del it
    ds2 = ArrayDataset(fields=npy.fields, batch_size=6, shuffle=True, seed=999, device="cpu")
    ds2.load_state_dict(state)
    ds2.set_epoch(0)                  # same epoch: keeps the position
    rest = [_ids(b) for b in ds2]
    assert sum(first + rest, []) == epoch_order(N, 2, 0).tolist()
    assert ds2.state_dict()["epoch"] == 1 and ds2.state_dict()["samples_consumed"] == 0
    # a state saved after the last batch of an epoch resumes with nothing left of it
    ds3 = ArrayDataset(**kw)
    ds3.load_state_dict(dict(state, samples_consumed=N))
    assert list(ds3) == [] and ds3.epoch == 1


@pytest.mark.parametrize("w_from,w_to", [(2, 3), (4, 1), (1, 8), (3, 2)])
def test_resume_with_another_world_size(npy, w_from, w_to):
    kw = dict(fields=npy.fields, batch_size=4, shuffle=True, seed=5, device="cpu")
    sets = [ArrayDataset(rank=r, world_size=w_from, **kw) for r in range(w_from)]
    its = [iter(d) for d in sets]
    consumed = []
    for _ in range(3):                # three global steps, all ranks in lock step
        for it in its:
            consumed += _ids(next(it))
    states = [d.state_dict() for d in sets]
    assert all(s == states[0] for s in states)          # the state is global
    assert states[0]["samples_consumed"] == 3 * w_from * 4
    new = [ArrayDataset(rank=r, world_size=w_to, **kw) for r in range(w_to)]
    rest = []
    for d in new:
        d.load_state_dict(states[0])
        rest += [i for b in d for i in _ids(b)]
    assert sorted(consumed + rest) == list(range(N))   # neither repeats nor skips
    assert consumed == epoch_order(N, 5, 0)[:len(consumed)].tolist()


@pytest.mark.parametrize("batch", [4, None])
def test_state_stays_global_on_a_rank_whose_tail_share_is_empty(npy, batch):
    """103 samples, 8 ranks, batches of 4, drop_last=False: 3 full steps (96 samples), then a tail
    of 7 for ranks 0..6 — rank 7 has one batch fewer. After 3 steps rank 7 has delivered all it
    has, but the epoch is not over: its state must be the global one (epoch 0, 96), or a resume
    from it on another world size skips the 7 samples left. A new iter() on rank 7 (Lightning's
    next epoch) still starts epoch 1, and once the tail step is taken every rank says (1, 0)."""
    B = batch or 1
    full = N // (8 * B)                          # 3 steps of 4, or 12 single samples
    kw = dict(fields=npy.fields, batch_size=batch, shuffle=True, seed=5, device="cpu")
    sets = [ArrayDataset(rank=r, world_size=8, **kw) for r in range(8)]
    assert [len(d) for d in sets] == [full + 1] * 7 + [full]
    its = [iter(d) for d in sets]
    consumed = [i for _ in range(full) for it in its for i in _ids(next(it))]
    states = [d.state_dict() for d in sets]
    assert [(s["epoch"], s["samples_consumed"]) for s in states] == [(0, full * 8 * B)] * 8
    assert all(s == states[0] for s in states)          # identical on every rank
    # resumed from rank 7's state on 3 ranks: the rest of the epoch, nothing skipped
    rest = []
    for r in range(3):
        d = ArrayDataset(rank=r, world_size=3, **kw)
        d.load_state_dict(states[7])
        rest += [i for b in d for i in _ids(b)]
    assert sorted(consumed + rest) == list(range(N))
    # the tail step: ranks 0..6 take their last batch, rank 7's loop asks for the StopIteration
    tail = [i for it in its[:7] for i in _ids(next(it))]
    with pytest.raises(StopIteration):
        next(its[7])
    assert sorted(consumed + tail) == list(range(N))
    assert [(d.state_dict()["epoch"], d.state_dict()["samples_consumed"]) for d in sets] == [(1, 0)] * 8
    # Lightning takes len() batches and never asks for the StopIteration: the pass still ends
    d = ArrayDataset(rank=7, world_size=8, **kw)
    it = iter(d)
    mine = [i for _ in range(len(d)) for i in _ids(next(it))]
    assert (d.state_dict()["epoch"], d.state_dict()["samples_consumed"]) == (0, full * 8 * B)
    ref = ArrayDataset(rank=7, world_size=8, **kw)
    ref.set_epoch(1)
    epoch1 = [i for b in ref for i in _ids(b)]
    assert [i for b in d for i in _ids(b)] == epoch1 != mine        # the next iter(): epoch 1
    # set_epoch after such a pass selects that epoch from its beginning, as on the other ranks
    it = iter(d)
    epoch2 = [i for _ in range(len(d)) for i in _ids(next(it))]
    assert (d.state_dict()["epoch"], d.state_dict()["samples_consumed"]) == (2, full * 8 * B)
    d.set_epoch(2)                  # the other ranks are in epoch 3: epoch 2 from its beginning
    assert [i for b in d for i in _ids(b)] == epoch2


def test_lock_step_states_identical_on_every_rank_at_every_step(tmp_path):
    """A seeded sweep (40 layouts: n, world, batch or per-sample, drop_last): ranks iterate in lock
    step as `for` loops do (a rank with nothing left gets its StopIteration in that step); after
    every step every rank's state is the same, and resuming from it on another world size gives
    the rest of the epoch exactly once."""
    import random
    rnd = random.Random(1)
    for _ in range(40):
        n, world, batch = rnd.randint(1, 60), rnd.randint(1, 6), rnd.choice([1, 2, 3, 5, None])
        drop_last, world2 = rnd.random() < 0.3, rnd.randint(1, 6)
        path = tmp_path / f"id{n}.npy"
        np.save(path, np.arange(n))
        kw = dict(fields={"id": str(path)}, batch_size=batch, shuffle=True, seed=3, device="cpu",
                  drop_last=drop_last)
        what = (n, world, batch, drop_last)
        sets = [ArrayDataset(rank=r, world_size=world, **kw) for r in range(world)]
        its, seen = [iter(d) for d in sets], []
        for _step in range(max(len(d) for d in sets)):
            for it in its:
                b = next(it, None)
                seen += [] if b is None else _ids(b)
            states = [d.state_dict() for d in sets]
            assert all(s == states[0] for s in states), (what, [(s["epoch"], s["samples_consumed"]) for s in states])
            if states[0]["epoch"] == 1:
                continue
            rest = []
            for r in range(world2):
                d = ArrayDataset(**dict(kw, rank=r, world_size=world2))
                d.load_state_dict(states[0])
                rest += [i for b in d for i in _ids(b)]
            both = seen + rest
            assert len(both) == len(set(both)), (what, world2)
            assert drop_last or sorted(both) == list(range(n)), (what, world2)
        assert sorted(seen) == list(range(n)) or drop_last, what


def test_global_state_of_workers_whose_rank_tail_share_is_empty(npy):
    """The same rank 7 of 8 in 2 DataLoader workers (StatefulDataLoader states): once both
    workers have delivered all of its 3 batches, global_state() is still (epoch 0, 96)."""
    kw = dict(fields=npy.fields, batch_size=4, shuffle=True, seed=5, device="cpu", rank=7, world_size=8)
    states, got = [], []
    for w in range(2):
        ds = ArrayDataset(**kw)
        with _as_worker(w, 2):
            got += [i for b in ds for i in _ids(b)]
            states.append(ds.state_dict())
    assert all(s["worker"]["ended"] for s in states) and len(got) == 12
    g = global_state({"workers": states})
    assert (g["epoch"], g["samples_consumed"]) == (0, 96)
    rest = []
    for r in range(3):               # resumed on 3 ranks: the 7 samples left of epoch 0
        d = ArrayDataset(**dict(kw, rank=r, world_size=3))
        d.load_state_dict(g)
        rest += [i for b in d for i in _ids(b)]
    assert sorted(rest) == sorted(epoch_order(N, 5, 0)[96:].tolist())
    # with drop_last=True the same rank's last batch completes the epoch (the tail is dropped)
    states = []
    for w in range(2):
        ds = ArrayDataset(**dict(kw, drop_last=True))
        with _as_worker(w, 2):
            list(ds)
            states.append(ds.state_dict())
    g = global_state({"workers": states})
    assert (g["epoch"], g["samples_consumed"]) == (1, 0)


def test_set_epoch_and_len(npy):
    ds = ArrayDataset(fields=npy.fields, batch_size=10, shuffle=True, seed=0, device="cpu",
                      rank=1, world_size=3, drop_last=True)
    assert len(ds) == N // 30
    ds.set_epoch(4)
    a = [_ids(b) for b in ds]
    assert len(a) == len(ds) and ds.epoch == 5
    ds.set_epoch(4)
    assert [_ids(b) for b in ds] == a


def test_safetensors_shards(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(1)
    parts = []
    lo = 0
    for i, s in enumerate([9, 14, 10]):
        d = {"img": rng.integers(0, 255, (s, 2, 3), dtype=np.uint8),
             "emb": rng.standard_normal((s, 5)).astype(np.float16),
             "id": np.arange(lo, lo + s, dtype=np.int64),
             "other": np.zeros(3, dtype=np.float32)}
        st.save_file(d, str(tmp_path / f"shard-{i:02d}.safetensors"))
        parts.append(d)
        lo += s
    ref = {k: np.concatenate([p[k] for p in parts]) for k in ("img", "emb", "id")}
    glob = str(tmp_path / "shard-*.safetensors")
    ds = ArrayDataset(fields={k: (glob, k) for k in ("img", "emb", "id")}, batch_size=5,
                      shuffle=True, seed=4, device="cpu")
    assert ds.num_samples == 33
    seen = []
    for b in ds:
        assert b["emb"].dtype == torch.float16
        _check_contents(b, ref)
        seen += _ids(b)
    assert sorted(seen) == list(range(33))
    with pytest.raises(ValueError, match="name one"):
        ArrayDataset(glob, device="cpu")


def test_zarr_arrays(tmp_path):
    zarr = pytest.importorskip("zarr")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((50, 4, 3)).astype(np.float32)
    ids = np.arange(50, dtype=np.int64)
    g = zarr.open_group(str(tmp_path / "train.zarr"), mode="w", zarr_format=2)
    g.create_array("x", data=x, chunks=(8, 4, 3), compressors=None)
    g.create_array("id", data=ids, chunks=(16,))
    ref = {"x": x, "id": ids}
    path = str(tmp_path / "train.zarr")
    ds = ArrayDataset(fields={"x": (path, "x"), "id": (path, "id")}, batch_size=7, shuffle=True,
                      seed=9, device="cpu")
    seen = []
    for b in ds:
        _check_contents(b, ref)
        seen += _ids(b)
    assert sorted(seen) == list(range(50))


def test_big_endian_and_fortran_npy(tmp_path):
    a = np.arange(60, dtype=">i4").reshape(20, 3)
    f = np.asfortranarray(np.arange(80, dtype=np.float64).reshape(20, 4))
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "f.npy", f)
    ds = ArrayDataset(fields={"a": str(tmp_path / "a.npy"), "f": str(tmp_path / "f.npy")},
                      batch_size=6, shuffle=True, seed=1, device="cpu")
    order = epoch_order(20, 1, 0)
    got = list(ds)
    np.testing.assert_array_equal(torch.cat([b["a"] for b in got]).numpy(), a[order].astype("<i4"))
    np.testing.assert_array_equal(torch.cat([b["f"] for b in got]).numpy(), f[order])


def test_cast_normalize_transform_on_host(npy):
    mean, std = (10.0, 20.0, 30.0), (2.0, 4.0, 8.0)
    ds = ArrayDataset(fields=npy.fields, batch_size=8, device="cpu",
                      dtype={"x": torch.float16}, normalize={"x": (mean, std)},
                      transform=lambda b: dict(b, y=b["id"] * 2))
    b = next(iter(ds))
    assert b["x"].dtype == torch.float16
    ref = (npy.ref["x"][:8].astype(np.float32) - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
    np.testing.assert_allclose(b["x"].float().numpy(), ref, rtol=2e-3, atol=2e-3)
    assert b["y"].tolist() == [2 * i for i in range(8)]
    with pytest.raises(ValueError, match="channels"):
        ArrayDataset(fields=npy.fields, normalize={"x": ((1, 2), (1, 2))}, device="cpu")


def test_errors_are_clear(npy, tmp_path):
    with pytest.raises(FileNotFoundError, match="no files match"):
        ArrayDataset(str(tmp_path / "nothing_*.npy"))
    np.save(tmp_path / "short.npy", np.zeros((5, 2)))
    with pytest.raises(ValueError, match="different numbers of rows"):
        ArrayDataset(fields={"a": npy.fields["x"], "b": str(tmp_path / "short.npy")})
    with pytest.raises(TypeError):
        ArrayDataset()
    ds = ArrayDataset(fields=npy.fields)
    with pytest.raises(ValueError, match="for 103 samples|this dataset has"):
        ArrayDataset(str(tmp_path / "short.npy")).load_state_dict(ds.state_dict())


# ------------------------------------------------------------------------------------------
# DataLoader, StatefulDataLoader
# ------------------------------------------------------------------------------------------
def test_plain_dataloader_workers_exactly_once(npy):
    ds = ArrayDataset(fields=npy.fields, batch_size=8, shuffle=True, seed=3, device="cpu")
    for nw in (0, 2):
        dl = DataLoader(ds, batch_size=None, num_workers=nw)
        seen = []
        for b in dl:
            _check_contents(b, npy.ref)
            seen += _ids(b)
        assert seen == epoch_order(N, 3, 0).tolist()
        ds.set_epoch(0)


def test_cuda_device_in_worker_is_a_clear_error(npy):
    ds = ArrayDataset(fields=npy.fields, batch_size=8, device="cuda")
    with _as_worker(0, 2):
        with pytest.raises(RuntimeError, match="forked"):
            next(iter(ds))
    ds = ArrayDataset(fields=npy.fields, batch_size=8, device="cuda")
    with pytest.raises(RuntimeError, match="forked"):
        next(iter(DataLoader(ds, batch_size=None, num_workers=1)))


def _sdl():
    return pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader


def test_stateful_dataloader_single_process(npy):
    SDL = _sdl()
    kw = dict(fields=npy.fields, batch_size=6, shuffle=True, seed=8, device="cpu")
    dl = SDL(ArrayDataset(**kw), batch_size=None, num_workers=0)
    it = iter(dl)
    first = [_ids(next(it)) for _ in range(7)]
    state = dl.state_dict()
    dl2 = SDL(ArrayDataset(**kw), batch_size=None, num_workers=0)
    dl2.load_state_dict(state)
    rest = [_ids(b) for b in dl2]
    assert sum(first + rest, []) == epoch_order(N, 8, 0).tolist()


def test_stateful_dataloader_workers_exact_and_elastic(npy):
    SDL = _sdl()
    kw = dict(fields=npy.fields, batch_size=5, shuffle=True, seed=6, device="cpu")
    order = epoch_order(N, 6, 0).tolist()
    dl = SDL(ArrayDataset(**kw), batch_size=None, num_workers=2)
    it = iter(dl)
    first = [_ids(next(it)) for _ in range(7)]
    state = dl.state_dict()
    del it
    # same layout: each worker resumes exactly
    dl2 = SDL(ArrayDataset(**kw), batch_size=None, num_workers=2)
    dl2.load_state_dict(state)
    rest = [_ids(b) for b in dl2]
    assert sum(first + rest, []) == order
    # another layout: through the global state (here: 3 ranks, no workers)
    g = global_state(state)
    assert g["samples_consumed"] == 35 and "worker" not in g
    rest = []
    for r in range(3):
        d = ArrayDataset(rank=r, world_size=3, **kw)
        d.load_state_dict(g)
        rest += [i for b in d for i in _ids(b)]
    assert sorted(sum(first, []) + rest) == list(range(N))
    # loading a worker state into another layout says what to do
    d = ArrayDataset(**kw)
    ws = []
    ft_state._find_states(state, ws)
    d.load_state_dict([s for s in ws if s.get("worker")][0])
    with pytest.raises(ValueError, match="global_state"):
        next(iter(d))


# ------------------------------------------------------------------------------------------
# Two processes, gloo backend on the CPU
# ------------------------------------------------------------------------------------------
_DIST_SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
sys.path.insert(0, {python!r})
from ferry.torch import ArrayDataset
dist.init_process_group("gloo")
r, w = dist.get_rank(), dist.get_world_size()
ds = ArrayDataset(fields={fields!r}, batch_size=4, shuffle=True, seed=12, drop_last=True,
                  device="cpu")
seen, steps = [], 0
for b in ds:
    seen += b["id"].tolist()
    steps += 1
    t = torch.tensor([steps]); dist.all_reduce(t)       # lock step, as DDP would
    if steps == 5:
        state = ds.state_dict()
got = [None] * w
dist.all_gather_object(got, (seen, state))
if r == 0:
    with open({out!r}, "w") as f:
        json.dump(got, f)
dist.destroy_process_group()
"""


def test_two_process_gloo(npy, tmp_path):
    out = tmp_path / "out.json"
    script = tmp_path / "dist_worker.py"
    here = os.path.dirname(os.path.abspath(ft.__file__))
    script.write_text(_DIST_SCRIPT.format(python=os.path.dirname(here), fields=npy.fields, out=str(out)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    import json
    got = json.loads(out.read_text())
    (s0, st0), (s1, st1) = got
    assert st0 == st1 and st0["samples_consumed"] == 5 * 2 * 4
    assert not set(s0) & set(s1)
    full = N // 8 * 8
    assert sorted(s0 + s1) == sorted(epoch_order(N, 12, 0)[:full].tolist())


def test_global_state_after_a_whole_epoch_in_workers(npy):
    SDL = _sdl()
    kw = dict(fields=npy.fields, batch_size=10, shuffle=True, seed=1, device="cpu")
    dl = SDL(ArrayDataset(**kw), batch_size=None, num_workers=2)
    seen = [i for b in dl for i in _ids(b)]
    assert seen == epoch_order(N, 1, 0).tolist()
    g = global_state(dl.state_dict())
    assert (g["epoch"], g["samples_consumed"]) == (1, 0)


def test_drop_last_state_after_the_last_batch(npy):
    ds = ArrayDataset(fields=npy.fields, batch_size=10, shuffle=True, seed=1, device="cpu",
                      drop_last=True, rank=0, world_size=2)
    it = iter(ds)
    for _ in range(len(ds)):
        next(it)
    # the last batch ends the epoch (the dropped tail belongs to it), without waiting for the
    # StopIteration: a resume (any world size) starts the next epoch at its beginning
    st = ds.state_dict()
    assert (st["epoch"], st["samples_consumed"]) == (1, 0)
    d = ArrayDataset(fields=npy.fields, batch_size=4, device="cpu")
    d.load_state_dict(st)
    assert [i for b in d for i in _ids(b)] == epoch_order(N, 1, 1).tolist() and d.epoch == 2


def test_pickles_without_its_engine(npy):
    import pickle
    ds = ArrayDataset(fields=npy.fields, batch_size=9, shuffle=True, seed=2, device="cpu")
    it = iter(ds)
    next(it)                                   # engine and files now open in this process
    ds2 = pickle.loads(pickle.dumps(ds))       # what a spawn-started DataLoader worker gets
    assert ds2._rt is None and ds2.state_dict() == ds.state_dict()
    rest = [i for b in ds2 for i in _ids(b)]
    assert rest == epoch_order(N, 2, 0)[9:].tolist()


hyp = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 300), world=st.integers(1, 9), batch=st.integers(1, 40),
       workers=st.integers(1, 5), drop_last=st.booleans(), frac=st.floats(0, 1),
       world2=st.integers(1, 9), batch2=st.integers(1, 40))
def test_layout_arithmetic_exactly_once_and_elastic(n, world, batch, workers, drop_last, frac,
                                                    world2, batch2):
    """Positions handed out by the (rank, worker) layouts of one pass, then of a resumed pass
    with another world size and batch size: a prefix of the order once, the rest once."""
    def pass_positions(start, W, B, stop_after_steps=None):
        taken, consumed = [], start
        for r in range(W):
            lay = ft_order.Layout(n, start, W, r, B, drop_last)
            units = [s for w in range(workers) for s in range(w, lay.count, workers)]
            for s in sorted(units):
                if stop_after_steps is not None and s >= stop_after_steps:
                    break
                lo, hi = lay.unit(s)
                taken += range(lo, hi)
                consumed = max(consumed, n if (drop_last and s == lay.count - 1) else lay.consumed_after(s))
        return taken, consumed
    full = ft_order.Layout(n, 0, world, 0, batch, drop_last).full
    k = int(frac * full)
    first, consumed = pass_positions(0, world, batch, stop_after_steps=k)
    assert sorted(first) == list(range(min(n, k * world * batch)))
    assert consumed == (n if drop_last and 0 < k == full else min(n, k * world * batch))
    rest, _ = pass_positions(consumed, world2, batch2)
    got = sorted(first + rest)
    assert len(got) == len(set(got))                      # nothing twice
    if not drop_last:
        assert got == list(range(n))                      # nothing skipped
    else:                                                 # only a final tail (< W'*B') is dropped
        assert got == list(range(len(got))) and n - len(got) < max(world * batch, world2 * batch2) + 1


def test_cold_epoch_of_large_rows_stays_cached(tmp_path):
    """Rows of 1 MiB, the size from which the engine reads cold ranges with O_DIRECT (which
    leaves the page cache empty, so every epoch read the disk again): the dataset's batches
    are FERRY_REREAD jobs, so a cold epoch leaves the shard in the page cache for the next one.
    The rows read are the file's, in the epoch's order."""
    from ferry import _ferry
    from pagecache import drop_from_page_cache
    rows = np.random.default_rng(5).standard_normal((24, 1 << 18)).astype(np.float32)   # 1 MiB each
    p = tmp_path / "rows.npy"
    np.save(p, rows)
    probe = None
    try:
        probe = os.open(p, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        pytest.skip("the file system refuses O_DIRECT: nothing is read past the page cache")
    finally:
        if probe is not None:
            os.close(probe)
    ctx = _ferry.Context()
    f = _ferry.File(ctx, str(p))
    drop_from_page_cache(p)
    if f.cached() > 64 << 10:
        pytest.skip("the file system keeps dropped files cached")
    ds = ArrayDataset(str(p), batch_size=4, shuffle=True, seed=3, device="cpu")
    got = torch.cat(list(ds)).numpy()
    np.testing.assert_array_equal(got, rows[epoch_order(24, 3, 0)])
    assert f.cached() >= rows.nbytes            # all of it: the next epoch reads memory
    f.close()
    ctx.close()
