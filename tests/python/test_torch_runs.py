"""ferry.torch builds a batch's plan with Plan.read_file_runs (one call per contiguous shard
or token file): batches that mix contiguous shards with shards read through their format
(Fortran order), runs of consecutive rows, and a file listed twice still equal numpy."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ferry.torch import ArrayDataset, TokenDataset, epoch_order  # noqa: E402


@pytest.fixture
def shards(tmp_path):
    rng = np.random.default_rng(3)
    parts = [rng.standard_normal((n, 3, 5)).astype(np.float32) for n in (37, 20, 1, 50)]
    paths = []
    for i, a in enumerate(parts):
        p = tmp_path / f"x_{i}.npy"
        np.save(p, np.asfortranarray(a) if i == 1 else a)     # shard 1: read through the format
        paths.append(str(p))
    return paths, np.concatenate(parts)


@pytest.mark.parametrize("shuffle,batch", [(True, 16), (True, 108), (False, 25)])
def test_mixed_shards_equal_numpy(shards, shuffle, batch):
    paths, ref = shards
    ds = ArrayDataset(paths, batch_size=batch, shuffle=shuffle, seed=5, device="cpu")
    got = torch.cat(list(ds)).numpy()
    order = epoch_order(len(ref), 5, 0) if shuffle else np.arange(len(ref))
    np.testing.assert_array_equal(got, ref[order])


def test_a_file_listed_twice(shards):
    paths, ref = shards
    ds = ArrayDataset([paths[0], paths[0], paths[2]], batch_size=30, shuffle=True, seed=2, device="cpu")
    both = np.concatenate([ref[:37], ref[:37], ref[57:58]])
    np.testing.assert_array_equal(torch.cat(list(ds)).numpy(), both[epoch_order(len(both), 2, 0)])


def test_token_windows_over_files_equal_numpy(tmp_path):
    rng = np.random.default_rng(4)
    L = 8
    toks = [rng.integers(0, 60000, n, dtype=np.uint16) for n in (90, 9, 41)]
    for i, t in enumerate(toks):
        t.tofile(tmp_path / f"t_{i}.bin")
    ref = np.stack([t[i * L:i * L + L + 1].astype(np.int64)
                    for t in toks for i in range((len(t) - 1) // L)])
    ds = TokenDataset(str(tmp_path / "t_*.bin"), seq_len=L, batch_size=len(ref), shuffle=True,
                      device="cpu", drop_last=False)
    x, y = next(iter(ds))
    keys = {r.tobytes(): i for i, r in enumerate(ref)}
    win = np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1)
    seen = sorted(keys[r.tobytes()] for r in win)
    assert seen == list(range(len(ref)))                    # every window once, each exact


# ---- Plan.read_files_runs: the runs of several files in the order given ----------------------
def _two_files(tmp_path):
    from ferry import _ferry as F
    rng = np.random.default_rng(9)
    raws = [rng.integers(0, 256, n, dtype=np.uint8) for n in (4099, 777)]
    for i, r in enumerate(raws):
        r.tofile(tmp_path / f"r{i}.bin")
    ctx = F.Context(threads=3)
    files = [F.File(ctx, str(tmp_path / f"r{i}.bin")) for i in range(2)]
    return F, ctx, files, raws


def test_read_files_runs_interleaves_files_in_the_given_order(tmp_path):
    F, ctx, files, raws = _two_files(tmp_path)
    which = np.array([1, 0, 0, 1, 0, 1], dtype=np.int64)
    offs = np.array([5, 4000, 0, 700, 17, 5], dtype=np.int64)        # run 5 repeats run 0
    lens = np.array([13, 99, 1, 77, 300, 13], dtype=np.int64)
    dsts = np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.int64)
    out = np.full(int(lens.sum()), 0xEE, dtype=np.uint8)
    plan = F.Plan()
    assert plan.read_files_runs(files, which, offs, lens, out, dsts) == 6
    assert len(plan) == 6
    ctx.run(plan)
    want = np.concatenate([raws[k][o:o + n] for k, o, n in zip(which, offs, lens)])
    np.testing.assert_array_equal(out, want)
    ctx.close()


def test_read_files_runs_checks_every_run_first(tmp_path):
    F, ctx, files, raws = _two_files(tmp_path)
    out = np.zeros(64, dtype=np.uint8)
    one = np.zeros(1, dtype=np.int64)
    plan = F.Plan()
    with pytest.raises(IndexError, match="file_index 2 outside the 2 files"):
        plan.read_files_runs(files, np.array([0, 2]), np.array([0, 0]), 8, out, np.array([0, 8]))
    with pytest.raises(IndexError, match="file_index -1"):
        plan.read_files_runs(files, one - 1, one, 8, out, one)
    with pytest.raises(F.FerryError, match="r1.bin: run 1: 8 bytes at dst offset 60"):
        plan.read_files_runs(files, np.array([0, 1]), np.array([0, 0]), 8, out, np.array([0, 60]))
    with pytest.raises(ValueError, match="1 file_index, 2 offsets"):
        plan.read_files_runs(files, one, np.array([0, 0]), 8, out, np.array([0, 8]))
    with pytest.raises(TypeError, match=r"files\[1\] is str, not a File"):
        plan.read_files_runs([files[0], "r1.bin"], one, one, 8, out, one)
    assert len(plan) == 0                       # a refused call adds nothing
    ctx.close()


def test_read_files_runs_keeps_its_files(tmp_path):
    """The plan holds the File objects, not the caller's list (which may change)."""
    F, ctx, files, raws = _two_files(tmp_path)
    out = np.zeros(10, dtype=np.uint8)
    plan = F.Plan()
    lst = list(files)
    plan.read_files_runs(lst, np.array([1]), np.array([3]), 10, out, np.array([0]))
    lst.clear()
    del files
    ctx.run(plan)
    np.testing.assert_array_equal(out, raws[1][3:13])
    ctx.close()
