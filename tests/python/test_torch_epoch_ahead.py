"""A pass reads the next pass's first groups while its last batches are consumed
(_BatchStream._read_ahead): the next epoch's batches are exactly those of FERRY_EPOCH_AHEAD=off,
whatever happens between the passes (set_epoch, load_state_dict, a pass broken off, uneven
tails over ranks, a file replaced); the groups are used only when they are what the pass would
read, are read before its iter(), never in DataLoader workers, and are waited for whenever they
are dropped. CPU device: the same loop as on CUDA."""
import gc
import itertools
import os
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ferry  # noqa: E402
import ferry.torch as ft  # noqa: E402
from ferry import _ferry as _ferry_ext  # noqa: E402
import ferry.torch.groups as ft_groups  # noqa: E402
import ferry.torch.stream as ft_stream  # noqa: E402
from ferry.torch import ArrayDataset, TokenDataset, epoch_order  # noqa: E402
from test_torch_dataset import N, npy  # noqa: E402,F401 — the module's fixture
from test_torch_tokens import L, _ids_of, _windows, bins  # noqa: E402,F401

xr = pytest.importorskip("xarray")
from ferry.torch import XarrayDataset  # noqa: E402
from test_xarray_dataset import _index_of, nc4_files  # noqa: E402,F401

EPOCHS = 3


def _host(b):
    """A batch (tensor, (x, y) or dict) as numpy copies, comparable across datasets."""
    if isinstance(b, dict):
        return {k: v.numpy().copy() for k, v in b.items()}
    if isinstance(b, (tuple, list)):
        return tuple(v.numpy().copy() for v in b)
    return b.numpy().copy()


def _same(a, b):
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    elif isinstance(a, tuple):
        for u, v in zip(a, b, strict=True):
            np.testing.assert_array_equal(u, v)
    else:
        np.testing.assert_array_equal(a, b)


def _same_batches(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        _same(a, b)


def _setting(monkeypatch, value):
    monkeypatch.setenv("FERRY_EPOCH_AHEAD", value)


class _Submits:
    """Counts a dataset class's _submit calls (groups submitted)."""

    def __init__(self, monkeypatch, cls):
        self.calls = []
        real = cls._submit

        def counting(ds, rt, order, lay, units, ids=None):
            self.calls.append(list(units))
            return real(ds, rt, order, lay, units, ids)
        monkeypatch.setattr(cls, "_submit", counting)


# ---------------------------------------------------------------- the three datasets
def _array(npy):
    return ArrayDataset(fields=npy.fields, batch_size=8, shuffle=True, seed=3, device="cpu", prefetch=3)


def _tokens(bins):
    root, _ = bins
    return TokenDataset(str(root / "train_*.bin"), L, 5, seed=4, device="cpu", batches_per_read=2)


def _xarray(nc4_files):
    paths, _ = nc4_files
    # random patches: drawn from (seed, epoch, sample), which a group read ahead must honour
    return XarrayDataset(paths, ["t2m", "z"], batch_size=3, input_steps=2, target_steps=1, shuffle=True,
                         seed=5, device="cpu", return_time=True, patch=(4, 6), prefetch=3)


# per kind: its fixture, and (fixture value) -> (a maker of the dataset, sample ids of a host batch)
def _array_kind(npy):
    return (lambda: _array(npy)), (lambda b: b["id"].tolist())


def _tokens_kind(bins):
    ref = _windows(bins[1], L)
    return (lambda: _tokens(bins)), (lambda b: _ids_of(torch.from_numpy(b[0]), ref))


def _xarray_kind(nc4_files):
    ref = nc4_files[1]
    return (lambda: _xarray(nc4_files)), (lambda b: [_index_of(ref, t) for t in b["time"]])


KINDS = {"array": ("npy", _array_kind), "tokens": ("bins", _tokens_kind), "xarray": ("nc4_files", _xarray_kind)}


def _make(kind, request):
    fixture, kind_of = KINDS[kind]
    return kind_of(request.getfixturevalue(fixture))


def _run_epochs(ds, epochs=EPOCHS):
    out = []
    for e in range(epochs):
        ds.set_epoch(e)
        out.append([_host(b) for b in ds])
    return out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_epochs_equal_the_off_case_and_no_group_is_read_twice(kind, request, monkeypatch):
    make, ids_of = _make(kind, request)
    cls = type(make())
    subs = _Submits(monkeypatch, cls)
    _setting(monkeypatch, "off")
    want = _run_epochs(make())
    off = subs.calls[:]
    del subs.calls[:]
    _setting(monkeypatch, "on")
    ds = make()
    got = _run_epochs(ds)
    for g, w in zip(got, want):
        _same_batches(g, w)
    # every sample once per epoch (TokenDataset drops its tail: each once), a new order each epoch
    for e in got:
        seen = [i for b in e for i in ids_of(b)]
        if ds.drop_last:
            assert len(seen) == len(set(seen)) == len(ds) * ds.batch_size
        else:
            assert sorted(seen) == list(range(ds.num_samples))
    assert len({tuple(ids_of(e[0])) for e in got}) == EPOCHS
    # the groups read ahead for epochs 1 and 2 were used, not read again: the only extra groups
    # are those kept for the epoch after the last
    kept = ds._ahead.groups
    assert kept and len(subs.calls) == len(off) + len(kept)
    assert [g.units for g in kept] == subs.calls[len(subs.calls) - len(kept):]


def test_every_sample_once_per_epoch_with_the_groups_read_ahead(npy, monkeypatch):
    _setting(monkeypatch, "on")
    ds = _array(npy)
    for e in range(EPOCHS):
        seen = [i for b in ds for i in b["id"].tolist()]
        assert seen == epoch_order(N, 3, e).tolist()
        assert ds._ahead is not None and ds._ahead.epoch == e + 1


# ---------------------------------------------------------------- read before the next iter()
def test_the_next_epochs_first_groups_are_submitted_before_its_iter(npy, monkeypatch):
    """Lightning takes len(ds) batches and never asks for the StopIteration: by the epoch's last
    batch the next epoch's first groups are in flight, up to the depth kept within an epoch (the
    group being handed out counts); its first next() submits only what tops them up."""
    _setting(monkeypatch, "on")
    subs = _Submits(monkeypatch, ArrayDataset)
    ds = _array(npy)                                    # host: prefetch 3, 4 groups in flight
    depth = 4
    it = iter(ds)
    first = list(itertools.islice(it, len(ds)))
    assert len(subs.calls) == len(ds) + depth - 1
    a = ds._ahead
    assert a.epoch == 1 and [g.units for g in a.groups] == [[0], [1], [2]]
    del it
    n = len(subs.calls)
    it = iter(ds)
    b = next(it)
    assert len(subs.calls) == n + 1                     # 3 kept + 1 = the depth
    assert b["id"].tolist() == epoch_order(N, 3, 1)[:8].tolist()
    assert first[0]["id"].tolist() == epoch_order(N, 3, 0)[:8].tolist()


def test_a_pass_evens_its_reads_and_the_next_epoch_takes_them(bins, monkeypatch):
    """13 batches in reads of at most 6 are 5 + 5 + 3, not 6 + 6 + 1: with two groups in flight a
    last read of one batch left the engine idle while the one before it was consumed, and the next
    epoch's first read started one batch before it was needed. The next epoch's reads (submitted
    ahead, evened over its own batches) are the ones it uses, and its batches equal the off case."""
    root, toks = bins
    ref = _windows(toks, L)

    def make():
        return TokenDataset(str(root / "train_*.bin"), L, 8, seed=4, device="cpu", batches_per_read=6,
                            prefetch=6)
    assert ft_groups._even_group(13, 6) == 5 and ft_groups._even_group(104, 17) == 15 and ft_groups._even_group(3, 6) == 3
    assert ft_groups._even_group(0, 6) == 6 and ft_groups._even_group(12, 6) == 6 and ft_groups._even_group(13, 1) == 1
    _setting(monkeypatch, "off")
    want = _run_epochs(make(), 2)
    _setting(monkeypatch, "on")
    subs = _Submits(monkeypatch, TokenDataset)
    ds = make()
    assert len(ds) == 13
    got = _run_epochs(ds, 2)
    _same_batches(got[0], want[0])
    _same_batches(got[1], want[1])
    sizes = [len(u) for u in subs.calls]
    # epochs 0 and 1, then epoch 2's read ahead: prefetch 6 on the host keeps 1 + 2 reads in flight
    assert sizes == [5, 5, 3] * 3, sizes
    assert sorted(i for b in got[1] for i in _ids_of(torch.from_numpy(b[0]), ref)) == \
        sorted(epoch_order(len(ref), 4, 1)[:13 * 8].tolist())


def test_xarray_plans_the_groups_read_ahead_by_the_passs_end(nc4_files, monkeypatch):
    """XarrayDataset plans a group on its planner thread at the consumer's next wait; those
    kept for the next pass are planned when the pass ends (nothing of them waits for it)."""
    _setting(monkeypatch, "on")
    ds = _xarray(nc4_files)
    list(ds)
    kept = ds._ahead.groups
    assert kept and all(g.job.fut is not None for g in kept)


def test_prefetch_0_reads_nothing_ahead(npy, monkeypatch):
    _setting(monkeypatch, "on")
    ds = ArrayDataset(fields=npy.fields, batch_size=8, shuffle=True, seed=3, device="cpu", prefetch=0)
    list(ds)
    assert ds._ahead is None


# ---------------------------------------------------------------- the setting
def test_off_reads_nothing_ahead_and_drops_what_was(npy, monkeypatch):
    _setting(monkeypatch, "on")
    subs = _Submits(monkeypatch, ArrayDataset)
    ds = _array(npy)
    list(ds)
    kept = ds._ahead.groups
    _setting(monkeypatch, "off")
    n = len(subs.calls)
    got = [b["id"].tolist() for b in ds]
    assert ds._ahead is None and len(subs.calls) == n + len(ds)      # every group read again
    assert [i for b in got for i in b] == epoch_order(N, 3, 1).tolist()
    assert all(g.handles == [] for g in kept)                         # waited for, given back


@pytest.mark.parametrize("value", ["", "1", "yes", "OFF"])
def test_a_bad_setting_is_refused_naming_it(npy, monkeypatch, value):
    _setting(monkeypatch, value)
    with pytest.raises(ValueError, match=f'FERRY_EPOCH_AHEAD="{value}"'):
        list(_array(npy))


# ---------------------------------------------------------------- whatever happens in between
def _between(npy, monkeypatch, value, between):
    """Epoch 0 whole, then `between(ds)`, then the batches of the next pass, and (groups kept for
    that pass, groups of them it used)."""
    _setting(monkeypatch, value)
    took = []
    real = ft_stream._BatchStream._take_ahead

    def take(ds, key, order, mine, group_units):
        kept = len(ds._ahead.groups) if ds._ahead is not None else 0
        used = real(ds, key, order, mine, group_units)
        took.append((kept, len(used)))
        return used
    monkeypatch.setattr(ft_stream._BatchStream, "_take_ahead", take)
    ds = _array(npy)
    list(ds)
    between(ds)
    out = [_host(b) for b in ds]
    monkeypatch.setattr(ft_stream._BatchStream, "_take_ahead", real)
    return out, took[-1]


def _mid_epoch_state(npy):
    ds = _array(npy)
    ds.set_epoch(1)
    it = iter(ds)
    for _ in range(5):
        next(it)
    return ds.state_dict()


def _break_mid_epoch(ds):
    it = iter(ds)                   # epoch 1, from the groups kept for it
    for _ in range(len(ds) - 2):    # far enough for every group of it to be submitted (and
        next(it)                    # epoch 2's first read ahead)
    del it


def _resume_same(ds):
    ds.load_state_dict(ds.state_dict())       # epoch 1 at its start: what the groups were read for


def _resume_other_seed(ds):
    st = ds.state_dict()
    ds.load_state_dict(dict(st, seed=11))


BETWEEN = {"set_epoch(4)": lambda ds: ds.set_epoch(4),
           "set_epoch(1)": lambda ds: ds.set_epoch(1),
           "load_state_dict(mid-epoch)": None,
           "load_state_dict(epoch 1 start)": _resume_same,
           "load_state_dict(another seed)": _resume_other_seed,
           "break mid-epoch": _break_mid_epoch}
USED = {"set_epoch(1)", "load_state_dict(epoch 1 start)"}


@pytest.mark.parametrize("case", sorted(BETWEEN))
def test_the_pass_after_equals_the_off_case(npy, monkeypatch, case):
    between = BETWEEN[case]
    if between is None:
        state = _mid_epoch_state(npy)

        def between(ds):
            ds.load_state_dict(state)
    want, _ = _between(npy, monkeypatch, "off", between)
    got, (kept, used) = _between(npy, monkeypatch, "on", between)
    _same_batches(got, want)
    # groups were kept for the pass; it used them only where it is what they were read for
    assert kept and used == (kept if case in USED else 0)


def _write_rows(root, n):
    np.save(root / "id.npy", np.arange(n, dtype=np.int64))
    return str(root / "id.npy")


@pytest.mark.parametrize("n", [97, 103])
@pytest.mark.parametrize("lightning", [False, True])
def test_uneven_tails_over_two_ranks_equal_the_off_case(tmp_path, monkeypatch, n, lightning):
    """drop_last=False, world_size 2: 97 samples leave rank 1 no share of the tail (its pass ends
    one step early), 103 an uneven one. Lightning never asks for the StopIteration."""
    path = _write_rows(tmp_path, n)
    took = []
    real = ft_stream._BatchStream._take_ahead

    def take(ds, key, order, mine, group_units):
        used = real(ds, key, order, mine, group_units)
        took.append(len(used))
        return used
    monkeypatch.setattr(ft_stream._BatchStream, "_take_ahead", take)

    def epochs(value):
        _setting(monkeypatch, value)
        del took[:]
        out = []
        for rank in (0, 1):
            ds = ArrayDataset(path, batch_size=8, shuffle=True, seed=2, rank=rank, world_size=2, drop_last=False,
                              device="cpu", prefetch=2)
            per = []
            for _ in range(EPOCHS):
                if lightning:
                    per.append([b.tolist() for b in itertools.islice(iter(ds), len(ds))])
                else:
                    per.append([b.tolist() for b in ds])
            out.append(per)
        return out
    want, got = epochs("off"), epochs("on")
    assert got == want
    # every pass after a rank's first began with the groups its pass before read for it: 3 (the
    # depth: prefetch 2 + 1) where the StopIteration was asked for, 2 by the last batch
    k = 2 if lightning else 3
    assert took == [0] + [k] * (EPOCHS - 1) + [0] + [k] * (EPOCHS - 1)
    for e in range(EPOCHS):
        ids = [i for rank in (0, 1) for b in got[rank][e] for i in b]
        assert sorted(ids) == list(range(n))


# ---------------------------------------------------------------- files and errors
def test_a_file_replaced_between_epochs_is_read_anew(tmp_path, monkeypatch):
    """samples="files": a group read ahead of a file replaced since (same shape) is not used;
    the next epoch reads the new file, as it would have without reading ahead."""
    for i in range(6):
        np.save(tmp_path / f"s{i}.npy", np.full(4, i, dtype=np.int32))
    _setting(monkeypatch, "on")
    ds = ArrayDataset(str(tmp_path / "s*.npy"), samples="files", batch_size=2, device="cpu")
    assert [b.tolist() for b in ds] == [[[0] * 4, [1] * 4], [[2] * 4, [3] * 4], [[4] * 4, [5] * 4]]
    assert ds._ahead is not None
    tmp = tmp_path / "new.npy"
    np.save(tmp, np.full(4, 9, dtype=np.int32))
    os.replace(tmp, tmp_path / "s1.npy")
    assert [b.tolist() for b in ds][0] == [[0] * 4, [9] * 4]


class _FailingJob:
    """A group's job whose read failed (as the engine's FerryError says)."""

    def __init__(self, job):
        self.job = job

    def wait(self, *a):
        if self.job is not None:
            self.job.wait()
        raise _ferry_ext.FerryError(_ferry_ext.EIO, "x.npy: injected read error")

    def done(self):
        return True

    path = "host"


def _fail_epoch_1_group_1(monkeypatch):
    real = ArrayDataset._submit
    e1 = epoch_order(N, 3, 1)

    def submit(ds, rt, order, lay, units, ids=None):
        g = real(ds, rt, order, lay, units, ids)
        if units == [1] and np.array_equal(np.asarray(order), e1):
            g.job = _FailingJob(g.job)
        return g
    monkeypatch.setattr(ArrayDataset, "_submit", submit)


@pytest.mark.parametrize("value", ["off", "on"])
def test_a_read_error_of_a_group_read_ahead_is_raised_at_its_turn(npy, monkeypatch, value):
    _fail_epoch_1_group_1(monkeypatch)
    _setting(monkeypatch, value)
    ds = _array(npy)
    list(ds)
    if value == "on":                                     # read with epoch 0's end
        assert [1] in [g.units for g in ds._ahead.groups]
    got = []
    with pytest.raises(ferry.FerryError, match="injected"):
        for b in ds:
            got.append(b["id"].tolist())
    assert got == [epoch_order(N, 3, 1)[:8].tolist()]     # the batch before it, then the error


def test_a_failed_group_read_ahead_and_dropped_raises_nothing(npy, monkeypatch):
    _fail_epoch_1_group_1(monkeypatch)
    _setting(monkeypatch, "on")
    ds = _array(npy)
    list(ds)
    assert [g.units for g in ds._ahead.groups][:2] == [[0], [1]]
    ds.set_epoch(2)
    assert [i for b in ds for i in b["id"].tolist()] == epoch_order(N, 3, 2).tolist()


# ---------------------------------------------------------------- DataLoader workers
def _worker_runs(npy, monkeypatch, value, log, warm_main):
    from torch.utils.data import DataLoader
    _setting(monkeypatch, value)
    real = ArrayDataset._submit

    def submit(ds, rt, order, lay, units, ids=None):
        with open(log, "a") as fh:                      # forked workers append their groups
            fh.write(f"{os.getpid()} {ds._epoch} {units[0]}\n")
        return real(ds, rt, order, lay, units, ids)
    ds = ArrayDataset(fields=npy.fields, batch_size=8, shuffle=True, seed=3, device="cpu", prefetch=3)
    main = []
    if warm_main:                                       # the main process has groups kept
        main = [b["id"].tolist() for b in ds]
    monkeypatch.setattr(ArrayDataset, "_submit", submit)
    dl = DataLoader(ds, batch_size=None, num_workers=2)
    out = [[b["id"].tolist() for b in dl] for _ in range(2)]
    monkeypatch.setattr(ArrayDataset, "_submit", real)
    after = [b["id"].tolist() for b in ds]              # main again, after the workers' passes
    with open(log) as fh:
        lines = [ln.split() for ln in fh]
    return main, out, after, lines


@pytest.mark.parametrize("warm_main", [False, True])
def test_dataloader_workers_read_nothing_ahead(npy, monkeypatch, tmp_path, warm_main):
    want = _worker_runs(npy, monkeypatch, "off", tmp_path / "off.log", warm_main)
    got = _worker_runs(npy, monkeypatch, "on", tmp_path / "on.log", warm_main)
    assert got[:3] == want[:3]
    first = 1 if warm_main else 0
    for k, e in enumerate(range(first, first + 2)):
        assert [i for b in got[1][k] for i in b] == epoch_order(N, 3, e).tolist()
    assert [i for b in got[2] for i in b] == epoch_order(N, 3, first + 2).tolist()
    # each worker submitted its own batches of the epoch, each once: none of a next epoch
    lines = got[3]
    assert all(int(pid) != os.getpid() for pid, _, _ in lines)
    per_epoch = -(-N // 8)
    for e in range(first, first + 2):
        assert sorted(int(u) for _, ep, u in lines if int(ep) == e) == list(range(per_epoch))
    assert len(lines) == 2 * per_epoch


# ---------------------------------------------------------------- the dataset's end
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_deleting_a_dataset_with_groups_kept_waits_for_them(kind, request, monkeypatch):
    """Dropped after an epoch (the next one's groups in flight): every kept group is waited for
    before its buffers go, its files are given back, nothing is raised from __del__."""
    make, _ = _make(kind, request)
    _setting(monkeypatch, "on")
    raised, abandoned = [], []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: raised.append(u.exc_value))
    real = ft_stream._BatchStream._abandon

    def abandon(ds, rt, groups):
        groups = list(groups)
        real(ds, rt, groups)
        abandoned.extend((id(ds), g.job is None or g.job.done(), g.handles) for g in groups)
    monkeypatch.setattr(ft_stream._BatchStream, "_abandon", abandon)
    gc.collect()                                        # other tests' datasets go first
    for _ in range(2):
        ds = make()
        list(ds)
        n, me = len(ds._ahead.groups), id(ds)
        assert n
        del ds
        gc.collect()
        deadline = time.time() + 5
        while len([a for a in abandoned if a[0] == me]) < n and time.time() < deadline:
            time.sleep(0.05)                            # XarrayDataset's may go on its planner thread
        mine = [a[1:] for a in abandoned if a[0] == me]
        assert len(mine) == n and all(done and handles == [] for done, handles in mine)
        abandoned.clear()
    assert raised == []


def test_a_new_runtime_drops_the_groups_kept_first(npy, monkeypatch):
    """Another device (here a runtime for another torch device) closes the old runtime: the
    groups kept on it are waited for and given back first (their jobs use its open files)."""
    _setting(monkeypatch, "on")
    ds = _array(npy)
    list(ds)
    kept, old = ds._ahead.groups, ds._rt
    assert kept and any(e[1] for e in old.handles.values())
    ds._runtime(torch.device("meta"), False, 1)
    assert ds._ahead is None and all(g.handles == [] for g in kept) and not old.handles


def test_a_pickled_copy_carries_no_groups(npy, monkeypatch):
    import pickle
    _setting(monkeypatch, "on")
    ds = _array(npy)
    list(ds)
    assert ds._ahead is not None
    cp = pickle.loads(pickle.dumps(ds))
    assert cp._ahead is None
    assert [i for b in cp for i in b["id"].tolist()] == epoch_order(N, 3, 1).tolist()
