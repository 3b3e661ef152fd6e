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
