"""ferry.torch.TokenDataset: windows of seq_len+1 tokens from flat token files (nanoGPT's raw
uint16 train.bin, uint32, 1-D .npy) -> (x, y) shifted by one; exactly once per epoch over ranks
and workers, exact and elastic resume, and an O(1)-memory epoch order. Files are written by
numpy (tofile / np.save) and windows are compared with numpy slices of the same tokens."""
import time
import tracemalloc

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import ferry  # noqa: E402
from ferry.torch.order import FeistelOrder  # noqa: E402
from ferry.torch import TokenDataset  # noqa: E402

L = 16


@pytest.fixture(scope="module")
def bins(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    rng = np.random.default_rng(0)
    toks = [rng.integers(0, 50257, n, dtype=np.uint16) for n in (1000, 161, 17, 500)]
    for i, t in enumerate(toks):
        t.tofile(root / f"train_{i}.bin")                 # nanoGPT's prepare.py writes this
    return root, toks


def _windows(toks, L):
    """Every window (file, start) in dataset id order, by numpy."""
    out = []
    for t in toks:
        for i in range((len(t) - 1) // L):
            out.append(t[i * L:i * L + L + 1].astype(np.int64))
    return np.stack(out)


def _ids_of(x, ref):
    """Window ids of a batch by matching its rows against the reference windows."""
    keys = {r.tobytes(): i for i, r in enumerate(ref[:, :-1])}
    return [keys[row.tobytes()] for row in x.numpy().astype(np.int64)]


def test_windows_equal_numpy_and_shift(bins):
    root, toks = bins
    ref = _windows(toks, L)
    ds = TokenDataset(str(root / "train_*.bin"), seq_len=L, batch_size=5, shuffle=False, device="cpu",
                      drop_last=False)
    assert ds.num_samples == len(ref) == 62 + 10 + 1 + 31 and ds.num_tokens == 1678
    xs, ys = zip(*ds)
    x, y = torch.cat(xs), torch.cat(ys)
    assert x.dtype == torch.int64 and x.shape == (len(ref), L) and x.is_contiguous() and y.is_contiguous()
    np.testing.assert_array_equal(x.numpy(), ref[:, :-1])    # strided, in file order (evaluation)
    np.testing.assert_array_equal(y.numpy(), ref[:, 1:])


def test_shuffled_epoch_is_a_permutation_of_windows(bins):
    root, toks = bins
    ref = _windows(toks, L)
    ds = TokenDataset(str(root / "train_*.bin"), L, 8, seed=3, device="cpu", drop_last=False)
    e0 = [i for x, y in ds for i in _ids_of(x, ref)]
    e1 = [i for x, y in ds for i in _ids_of(x, ref)]
    assert sorted(e0) == sorted(e1) == list(range(len(ref))) and e0 != e1
    assert e0 == FeistelOrder(len(ref), 3, 0)[:].tolist()
    for x, y in TokenDataset(str(root / "train_*.bin"), L, 8, seed=3, device="cpu"):
        np.testing.assert_array_equal(x[:, 1:].numpy(), y[:, :-1].numpy())


def test_uint32_bin_and_npy_and_errors(tmp_path):
    t = np.arange(3 * L + 1, dtype=np.uint32) + 70000
    t.tofile(tmp_path / "a.bin")
    np.save(tmp_path / "b.npy", t)
    for p in ("a.bin", "b.npy"):
        ds = TokenDataset(str(tmp_path / p), L, 3, dtype="uint32", shuffle=False, device="cpu")
        x, y = next(iter(ds))
        np.testing.assert_array_equal(x.numpy().reshape(-1), t[:-1])
        np.testing.assert_array_equal(y.numpy().reshape(-1), t[1:])
    with pytest.raises(ferry.FerryError, match="b.npy.*u4"):
        TokenDataset(str(tmp_path / "b.npy"), L, 3, dtype="uint16")
    (tmp_path / "odd.bin").write_bytes(b"\0" * 7)
    with pytest.raises(ferry.FerryError, match="odd.bin"):
        TokenDataset(str(tmp_path / "odd.bin"), L, 3)
    np.save(tmp_path / "m.npy", np.zeros((4, 4), np.uint16))
    with pytest.raises(ferry.FerryError, match="1-D"):
        TokenDataset(str(tmp_path / "m.npy"), 2, 1)


@pytest.mark.parametrize("world,workers", [(2, 1), (3, 2)])
def test_exactly_once_over_ranks_and_workers_and_elastic_resume(bins, world, workers):
    from test_torch_dataset import _as_worker
    root, toks = bins
    ref = _windows(toks, L)
    kw = dict(files=str(root / "train_*.bin"), seq_len=L, batch_size=4, seed=5, device="cpu",
              drop_last=False)
    seen = []
    for r in range(world):
        for w in range(workers):
            ds = TokenDataset(rank=r, world_size=world, **kw)
            with _as_worker(w, workers):
                seen += [i for x, _ in ds for i in _ids_of(x, ref)]
    assert sorted(seen) == list(range(len(ref)))
    # resume: 3 steps on `world` ranks, then the rest on world+1 ranks
    ds = TokenDataset(rank=0, world_size=world, **kw)
    it = iter(ds)
    for _ in range(3):
        next(it)
    st = ds.state_dict()
    assert st["samples_consumed"] == 3 * 4 * world and st["_tag"] == "ferry.torch.TokenDataset"
    order = FeistelOrder(len(ref), 5, 0)[:].tolist()
    rest = []
    for r in range(world + 1):
        d = TokenDataset(rank=r, world_size=world + 1, **kw)
        d.load_state_dict(st)
        rest += [i for x, _ in d for i in _ids_of(x, ref)]
    assert sorted(rest) == sorted(order[3 * 4 * world:])


def test_dataloader_workers(bins):
    root, toks = bins
    ref = _windows(toks, L)
    ds = TokenDataset(str(root / "train_*.bin"), L, 4, seed=1, device="cpu")
    dl = DataLoader(ds, batch_size=None, num_workers=2)
    e = [[i for x, _ in dl for i in _ids_of(x, ref)] for _ in range(2)]
    assert e[0] == FeistelOrder(len(ref), 1, 0)[:len(e[0])].tolist()
    assert e[1] == FeistelOrder(len(ref), 1, 1)[:len(e[1])].tolist()


def test_feistel_order_is_a_bijection_in_constant_memory():
    for n in (1, 2, 3, 5, 17, 1000, 4097):
        p = FeistelOrder(n, seed=7, epoch=2)[:]
        assert sorted(p.tolist()) == list(range(n))
    p = FeistelOrder(1000, 7, 2)
    assert p[10:20].tolist() == p[:][10:20].tolist() and p[:].tolist() != FeistelOrder(1000, 7, 3)[:].tolist()
    assert FeistelOrder(10, 0, 0, shuffle=False)[:].tolist() == list(range(10))
    # 5e7 windows: building the order costs nothing; a batch of 256 ids is microseconds
    tracemalloc.start()
    t = time.perf_counter()
    big = FeistelOrder(50_000_000, seed=1, epoch=0)
    ids = big[12_345_000:12_345_256]
    dt = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(set(ids.tolist())) == 256 and ids.min() >= 0 and ids.max() < 50_000_000
    assert peak < 1 << 20 and dt < 0.5


def test_a_glob_matching_a_non_token_file_is_refused(tmp_path):
    """Raw tokens are *.bin files (nanoGPT's layout): a README a glob also matches is an
    error naming it, never tokens."""
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "train_0.bin")
    (tmp_path / "train_notes.txt").write_bytes(b"hello tokens" * 10)   # an even byte count
    with pytest.raises(ferry.FerryError, match="train_notes.txt"):
        TokenDataset(str(tmp_path / "train_*"), 8, 2, device="cpu")


def test_c_order_equals_the_numpy_network():
    """FeistelOrder.take runs in C (ferry_perm_take); take_numpy is the reference network.
    Sizes around powers of 4 (the longest and the absent cycle walks), odd seeds and epochs."""
    from ferry import _ferry
    assert hasattr(_ferry, "order_take")
    rng = np.random.default_rng(1)
    for n in (2, 3, 4, 5, 17, 1000, 4095, 4096, 4097, 65537, 10**6, 2**40 + 3):
        for seed, epoch in ((0, 0), (1, 3), (-5, 1), (2**62, 7)):
            o = FeistelOrder(n, seed, epoch)
            p = rng.integers(0, n, 3000)
            np.testing.assert_array_equal(o.take(p), o.take_numpy(p))
    with pytest.raises(IndexError):
        FeistelOrder(10, 1, 0).take([10])


@pytest.mark.parametrize("drop_last", [True, False])
def test_batches_per_read_changes_nothing_but_speed(bins, drop_last):
    """Batches read K at a time are the same batches, in the same order, with the same states
    after every batch, whatever K is (a group never spans a state boundary)."""
    root, toks = bins
    kw = dict(files=str(root / "train_*.bin"), seq_len=L, batch_size=5, seed=2, device="cpu",
              drop_last=drop_last)
    runs = {}
    for k in (1, 3, 16):
        ds = TokenDataset(batches_per_read=k, **kw)
        assert ds.batch_group == k
        got = []
        for x, y in ds:
            assert x.is_contiguous() and y.is_contiguous() and x.dtype == torch.int64
            got.append((x.numpy().copy(), y.numpy().copy(), ds.state_dict()["samples_consumed"]))
        runs[k] = got
    for k in (3, 16):
        assert len(runs[k]) == len(runs[1])
        for (x1, y1, s1), (xk, yk, sk) in zip(runs[1], runs[k]):
            np.testing.assert_array_equal(x1, xk)
            np.testing.assert_array_equal(y1, yk)
            assert s1 == sk
    # a resume from inside a read group of 4 continues with the next batch
    ds = TokenDataset(batches_per_read=4, **kw)
    it = iter(ds)
    for _ in range(6):
        next(it)
    st = ds.state_dict()
    d2 = TokenDataset(batches_per_read=4, **kw)
    d2.load_state_dict(st)
    rest = [x.numpy() for x, _ in d2]
    assert len(rest) == len(runs[1]) - 6
    for a, (b, _, _) in zip(rest, runs[1][6:]):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="batches_per_read"):
        TokenDataset(batches_per_read=0, **kw)


@pytest.mark.parametrize("out_dtype", [torch.int64, torch.int32, None])
def test_batches_kept_across_epochs_stay_intact(bins, out_dtype):
    """On the host a read group's buffer is used again by a later group once its batches are
    cast: batches a loop keeps (no copy) over three epochs still hold their own windows."""
    root, toks = bins
    ref = _windows(toks, L)
    ds = TokenDataset(str(root / "train_*.bin"), seq_len=L, batch_size=5, seed=4, device="cpu",
                      batches_per_read=2, prefetch=1, out_dtype=out_dtype)
    kept = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        kept += [(x, y) for x, y in ds]
    assert len(kept) == 3 * (len(ref) // 5)
    for x, y in kept:
        ids = _ids_of(x, ref)
        np.testing.assert_array_equal(x.numpy().astype(np.int64), ref[ids, :-1])
        np.testing.assert_array_equal(y.numpy().astype(np.int64), ref[ids, 1:])


def test_default_read_group_holds_about_32_mib(tmp_path):
    np.zeros(4096 * 40 + 1, np.uint16).tofile(tmp_path / "t.bin")
    assert TokenDataset(str(tmp_path / "t.bin"), 4095, 256, device="cpu").batch_group == 16
    assert TokenDataset(str(tmp_path / "t.bin"), 64, 2, device="cpu").batch_group == 64


def test_a_read_group_is_one_plan_windows_call(bins, monkeypatch):
    """Each group of batches is planned by one _ferry.plan_windows call (no ids computed in
    Python first); its batches are the epoch order's windows, as the numpy network gives them."""
    import ferry.torch as ft
    from ferry import _ferry as _ferry_ext  # noqa: E402
    import ferry.torch.ahead as ft_ahead  # noqa: E402
    root, toks = bins
    ref = _windows(toks, L)
    calls = []
    real = _ferry_ext.plan_windows

    def counting(*a):
        calls.append(len(a[10]) // 2)                    # the call's batches: (lo, hi) pairs
        return real(*a)
    monkeypatch.setattr(_ferry_ext, "plan_windows", counting)
    monkeypatch.setattr(ft_ahead._IdsAhead, "__call__", lambda *a: pytest.fail("ids computed in Python"))
    monkeypatch.setenv("FERRY_EPOCH_AHEAD", "off")       # one epoch's calls, not the next one's first
    ds = TokenDataset(str(root / "train_*.bin"), L, 5, seed=4, device="cpu", batches_per_read=4)
    got = [i for x, y in ds for i in _ids_of(x, ref)]
    n = len(ref)
    assert calls == [4, 4, 4, 4, 4] and len(got) == n // 5 * 5        # 20 batches of 5, drop_last
    assert got == FeistelOrder(n, 4, 0).take_numpy(np.arange(len(got))).tolist()


def test_a_seed_beyond_int64_reads_through_the_numpy_order(bins):
    """plan_windows takes int64 seeds; a larger seed takes the ids path with the same order."""
    root, toks = bins
    ref = _windows(toks, L)
    seed = 2**64 + 5
    ds = TokenDataset(str(root / "train_*.bin"), L, 8, seed=seed, device="cpu", drop_last=False)
    got = [i for x, y in ds for i in _ids_of(x, ref)]
    assert got == FeistelOrder(len(ref), seed, 0).take_numpy(np.arange(len(ref))).tolist()


@pytest.mark.parametrize("out_dtype", [None, torch.int32, torch.int64])
def test_x_and_y_are_halves_of_one_cast(bins, out_dtype):
    """x and y come from one pass over the read (a (2, rows, L) view cast into one buffer):
    contiguous, shifted by one, in out_dtype (None: the file's uint16)."""
    root, toks = bins
    ref = _windows(toks, L)
    ds = TokenDataset(str(root / "train_*.bin"), L, 5, shuffle=False, device="cpu", out_dtype=out_dtype,
                      drop_last=False)
    xs, ys = zip(*ds)
    want = torch.uint16 if out_dtype is None else out_dtype
    assert all(x.dtype == want and y.dtype == want and x.is_contiguous() and y.is_contiguous()
               for x, y in zip(xs, ys))
    np.testing.assert_array_equal(torch.cat(xs).numpy().astype(np.int64), ref[:, :-1])
    np.testing.assert_array_equal(torch.cat(ys).numpy().astype(np.int64), ref[:, 1:])


def test_a_file_truncated_after_construction_is_an_error_naming_it(tmp_path):
    """Groups are planned on the loader's planner thread; a file that shrank since the dataset
    counted its windows fails the group that reads it, at that group's turn, naming the file
    (never a short or stale window). The batches of earlier groups arrive first."""
    rng = np.random.default_rng(3)
    a = rng.integers(0, 50257, 40 * L + 1, dtype=np.uint16)
    b = rng.integers(0, 50257, 40 * L + 1, dtype=np.uint16)
    a.tofile(tmp_path / "a.bin")
    b.tofile(tmp_path / "b.bin")
    ds = TokenDataset([str(tmp_path / "a.bin"), str(tmp_path / "b.bin")], L, 4, shuffle=False, device="cpu",
                      batches_per_read=2, prefetch=0)
    b[:5].tofile(tmp_path / "b.bin")                 # b.bin's 40 windows are gone
    got = []
    with pytest.raises(ferry.FerryError, match="b.bin"):
        for x, y in ds:
            got.append(x)
    assert len(got) == 10 and torch.equal(torch.cat(got), torch.from_numpy(
        np.stack([a[i * L:i * L + L] for i in range(40)]).astype(np.int64)))


def test_a_dataset_dropped_mid_epoch_goes_quietly(bins, monkeypatch):
    """Dropped with groups still being planned: the reads in flight end, the planner thread is
    shut down, nothing is raised from a __del__ (a dataset whose last reference went on the
    planner thread would have joined that thread from itself)."""
    import gc
    import sys
    import threading
    root, toks = bins
    raised = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: raised.append(u.exc_value))
    for _ in range(3):
        ds = TokenDataset(str(root / "train_*.bin"), L, 2, seed=1, device="cpu", batches_per_read=2, prefetch=8)
        it = iter(ds)
        next(it)
        del it, ds
        gc.collect()
    deadline = time.time() + 5
    while any(t.name.startswith("ferry-plan") for t in threading.enumerate()) and time.time() < deadline:
        time.sleep(0.01)
    assert raised == [] and not any(t.name.startswith("ferry-plan") for t in threading.enumerate())
