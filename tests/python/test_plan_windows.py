"""_ferry.plan_windows: a group of token windows planned in one C call (TokenDataset's reads):
the epoch order, the file and offset of every window and its place in the destination computed
in C. Checked against numpy slices of the files numpy wrote and against FeistelOrder's numpy
network, with empty files among the others, several batches per call, files opened only as
their windows come up, and clear errors for files shorter than their windows, positions
outside the epoch and destinations too small."""
import numpy as np
import pytest

from ferry import _ferry
from ferry.torch.order import FeistelOrder

L = 16          # tokens per step; a window is L + 1 uint16 tokens


@pytest.fixture()
def corpus(tmp_path):
    rng = np.random.default_rng(7)
    sizes = (1000, 0, 161, 17, 16, 500, 0)     # empty files (no window) between and at the end
    toks, paths = [], []
    for i, n in enumerate(sizes):
        t = rng.integers(0, 50257, n, dtype=np.uint16)
        p = tmp_path / f"train_{i}.bin"
        t.tofile(p)
        toks.append(t)
        paths.append(str(p))
    wins = np.array([max(0, (len(t) - 1) // L) for t in toks], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(wins)[:-1])).astype(np.int64)
    ref = np.stack([t[i * L:i * L + L + 1] for t in toks for i in range(max(0, (len(t) - 1) // L))])
    return paths, toks, starts, int(wins.sum()), ref


def _plan(ctx, paths, starts, n, seed, epoch, shuffle, ranges, out, files=None, offsets=None):
    plan = _ferry.Plan()
    files = files if files is not None else [_ferry.File(ctx, p) for p in paths]
    offsets = offsets if offsets is not None else np.zeros(len(paths), dtype=np.int64)
    got = _ferry.plan_windows(plan, files, starts, offsets, L * 2, (L + 1) * 2, n, seed, epoch, shuffle,
                              np.asarray(ranges, dtype=np.int64).reshape(-1), out)
    return plan, got


@pytest.mark.parametrize("shuffle,seed,epoch", [(True, 3, 0), (True, -9, 5), (False, 0, 0)])
def test_windows_equal_numpy_in_epoch_order(corpus, shuffle, seed, epoch):
    paths, toks, starts, n, ref = corpus
    assert n == 62 + 0 + 10 + 1 + 0 + 31 + 0   # 16 tokens: (16 - 1) // 16 = 0 windows
    ctx = _ferry.Context(threads=2)
    ranges = [(0, 7), (7, 7), (20, 50), (90, n)]       # batches of a group, one of them empty
    total = sum(hi - lo for lo, hi in ranges)
    out = np.zeros((total + 3, L + 1), dtype=np.uint16)  # room to spare: the tail stays untouched
    plan, got = _plan(ctx, paths, starts, n, seed, epoch, shuffle, ranges, out)
    assert got == total == len(plan)
    ctx.run(plan)
    pos = np.concatenate([np.arange(lo, hi) for lo, hi in ranges])
    ids = FeistelOrder(n, seed, epoch, shuffle).take_numpy(pos)
    np.testing.assert_array_equal(out[:total], ref[ids])
    assert not out[total:].any()
    ctx.close()


def test_files_open_as_their_windows_come_up(corpus):
    """A callable opens file k the first time a window of it is planned, once per call; files
    no window of the call lies in are never opened."""
    paths, toks, starts, n, ref = corpus
    ctx = _ferry.Context(threads=2)
    opened = []

    def opener(k):
        opened.append(k)
        return _ferry.File(ctx, paths[k])
    out = np.zeros((n, L + 1), dtype=np.uint16)
    plan, got = _plan(ctx, paths, starts, n, 1, 0, False, [(0, 62)], out, files=opener)   # file 0 only
    assert got == 62 and opened == [0]
    plan, got = _plan(ctx, paths, starts, n, 1, 0, True, [(0, n)], out, files=opener)
    assert sorted(opened[1:]) == [0, 2, 3, 5]          # each file with windows, once; no empty file
    ctx.run(plan)
    np.testing.assert_array_equal(out, ref[FeistelOrder(n, 1, 0).take_numpy(np.arange(n))])
    ctx.close()


def test_offsets_shift_windows_inside_their_file(tmp_path):
    """offsets[k]: byte of token 0 in file k (a .npy header before the tokens)."""
    t = np.arange(3 * L + 1, dtype=np.uint16)
    p = tmp_path / "tokens.npy"
    np.save(p, t)
    off = len(p.read_bytes()) - t.nbytes
    ctx = _ferry.Context(threads=1)
    out = np.zeros((3, L + 1), dtype=np.uint16)
    plan, got = _plan(ctx, [str(p)], np.array([0], dtype=np.int64), 3, 0, 0, False, [(0, 3)], out,
                      offsets=np.array([off], dtype=np.int64))
    ctx.run(plan)
    np.testing.assert_array_equal(out, np.stack([t[i * L:i * L + L + 1] for i in range(3)]))
    ctx.close()


def test_errors_name_the_file_and_the_position(corpus, tmp_path):
    paths, toks, starts, n, ref = corpus
    ctx = _ferry.Context(threads=1)
    out = np.zeros((n, L + 1), dtype=np.uint16)
    with pytest.raises(IndexError, match=r"range 1 is \[5, %d\)" % (n + 1)):
        _plan(ctx, paths, starts, n, 1, 0, True, [(0, 5), (5, n + 1)], out)
    with pytest.raises(ValueError, match="do not fit the destination"):
        _plan(ctx, paths, starts, n, 1, 0, True, [(0, 5)], np.zeros((4, L + 1), dtype=np.uint16))
    with pytest.raises(ValueError, match="starts ascending"):
        _plan(ctx, paths, starts[::-1].copy(), n, 1, 0, True, [(0, 5)], out)
    # a file shorter than the windows the dataset counted for it: an error naming it, at plan time
    short = tmp_path / "short.bin"
    toks[0][:500].tofile(short)
    bad = [str(short)] + paths[1:]
    with pytest.raises(_ferry.FerryError, match="short.bin: 62 windows"):
        _plan(ctx, bad, starts, n, 1, 0, False, [(0, 10)], out)
    with pytest.raises(TypeError, match="file 0 is str, not a File"):
        _plan(ctx, paths, starts, n, 1, 0, False, [(0, 10)], out, files=lambda k: paths[k])
    with pytest.raises(TypeError, match="int64"):
        _plan(ctx, paths, starts.astype(np.int32), n, 1, 0, False, [(0, 10)], out)
    ctx.close()


def test_a_failed_call_adds_nothing(corpus, tmp_path):
    """Every window's file is opened and checked before any read is added: a call that fails on
    its third file leaves the plan as it was (no extent naming a File the plan does not keep)."""
    paths, toks, starts, n, ref = corpus
    ctx = _ferry.Context(threads=1)
    short = tmp_path / "short3.bin"
    toks[3][:5].tofile(short)                       # file 3's one window no longer fits
    bad = paths[:3] + [str(short)] + paths[4:]
    out = np.zeros((n, L + 1), dtype=np.uint16)
    plan = _ferry.Plan()
    files = [_ferry.File(ctx, p) for p in bad]
    args = (starts, np.zeros(len(paths), dtype=np.int64), L * 2, (L + 1) * 2, n, 1, 0, False)
    assert _ferry.plan_windows(plan, files, *args, np.array([0, 62], dtype=np.int64), out) == 62
    with pytest.raises(_ferry.FerryError, match="short3.bin"):
        _ferry.plan_windows(plan, files, *args, np.array([62, n], dtype=np.int64), out)
    assert len(plan) == 62
    ctx.run(plan)
    np.testing.assert_array_equal(out[:62], ref[:62])
    ctx.close()
