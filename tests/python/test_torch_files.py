"""ArrayDataset(samples="files"): one .npy file per sample (DALI's and MONAI's layout), several
fields from parallel file lists, scalar label files, ragged shapes. Files are written by numpy
and every batch is compared with np.load of the same files."""
import os
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ferry  # noqa: E402
import ferry.torch as ft  # noqa: E402
from ferry.torch import ArrayDataset, epoch_order, pad_collate  # noqa: E402

N = 37


@pytest.fixture(scope="module")
def per_sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("per_sample")
    rng = np.random.default_rng(1)
    for d in ("img", "label", "id"):
        (root / d).mkdir()
    for i in range(N):
        np.save(root / "img" / f"s{i}.npy", rng.integers(0, 255, (3, 4, 5), dtype=np.uint8))
        np.save(root / "label" / f"s{i}.npy", np.int64(rng.integers(0, 10)))      # a scalar
        np.save(root / "id" / f"s{i}.npy", np.int64(i))
    fields = {"img": str(root / "img" / "s*.npy"), "label": str(root / "label"),
              "id": [str(root / "id" / f"s{i}.npy") for i in range(N)]}
    ref = {k: np.stack([np.load(root / k / f"s{i}.npy") for i in range(N)]) for k in fields}
    return types.SimpleNamespace(root=root, fields=fields, ref=ref)


def _check(b, ref):
    ids = b["id"].numpy()
    for k, v in b.items():
        np.testing.assert_array_equal(v.numpy(), ref[k][ids])


def test_each_file_is_a_sample_contents_equal_numpy(per_sample):
    ds = ArrayDataset(fields=per_sample.fields, samples="files", batch_size=8, shuffle=True,
                      seed=2, device="cpu")
    assert ds.num_samples == N and len(ds) == 5
    assert ds.fields == {"img": ((3, 4, 5), torch.uint8), "label": ((), torch.int64),
                         "id": ((), torch.int64)}
    seen = []
    for b in ds:
        assert b["img"].shape[1:] == (3, 4, 5) and b["label"].dim() == 1
        _check(b, per_sample.ref)
        seen += b["id"].tolist()
    assert seen == epoch_order(N, 2, 0).tolist()
    # .npy fields go through the engine's batch reader (one engine job per field and batch);
    # the scalar label files too
    if hasattr(ferry._ferry, "npy_read_many"):
        assert all(f.npy_batch for f in ds._fields) and ds.last_path == "npy_batch"
    # the default stays rows: a list of per-sample files concatenates their first axes
    rows = ArrayDataset(per_sample.fields["img"], batch_size=4, device="cpu")
    assert rows.num_samples == 3 * N


def test_per_sample_mode_and_single_source(per_sample):
    ds = ArrayDataset(str(per_sample.root / "img"), samples="files", batch_size=None, device="cpu")
    got = list(ds)
    assert len(got) == N and got[5].shape == (3, 4, 5)
    # directory order is natural: s2 before s10
    np.testing.assert_array_equal(got[10].numpy(), per_sample.ref["img"][10])


@pytest.mark.parametrize("world,workers", [(1, 2), (3, 1), (2, 3)])
def test_exactly_once_over_ranks_and_workers(per_sample, world, workers):
    from test_torch_dataset import _as_worker
    seen = []
    for r in range(world):
        for w in range(workers):
            ds = ArrayDataset(fields=per_sample.fields, samples="files", batch_size=4,
                              shuffle=True, seed=9, device="cpu", rank=r, world_size=world)
            with _as_worker(w, workers):
                for b in ds:
                    _check(b, per_sample.ref)
                    seen += b["id"].tolist()
    assert sorted(seen) == list(range(N))


def test_resume_on_another_world_size(per_sample):
    kw = dict(fields=per_sample.fields, samples="files", batch_size=3, shuffle=True, seed=4,
              device="cpu")
    ds = ArrayDataset(**kw, rank=0, world_size=2)
    it = iter(ds)
    first = [next(it)["id"].tolist() for _ in range(2)]          # 2 global steps of 2x3
    st = ds.state_dict()
    assert st["samples_consumed"] == 12
    order = epoch_order(N, 4, 0).tolist()
    rest = []
    for r in range(3):
        d = ArrayDataset(**kw, rank=r, world_size=3)
        d.load_state_dict(st)
        rest += [i for b in d for i in b["id"].tolist()]
    assert sorted(rest) == sorted(order[12:])


def test_ragged_shapes_are_an_error_naming_the_file(tmp_path):
    for i, n in enumerate([4, 4, 6, 4]):
        np.save(tmp_path / f"t{i}.npy", np.arange(n, dtype=np.float32) + i)
    ds = ArrayDataset(str(tmp_path / "t*.npy"), samples="files", batch_size=4, device="cpu")
    with pytest.raises(ferry.FerryError, match=r"t2\.npy.*\(6,\).*collate="):
        list(ds)
    # a dtype that differs is an error too
    np.save(tmp_path / "t3.npy", np.arange(4, dtype=np.float64))
    ds = ArrayDataset([str(tmp_path / "t0.npy"), str(tmp_path / "t3.npy")], samples="files",
                      batch_size=2, device="cpu")
    with pytest.raises(ferry.FerryError, match=r"t3\.npy.*f8"):
        list(ds)


def test_ragged_shapes_with_collate(tmp_path):
    lens = [4, 1, 6, 3, 5]
    for i, n in enumerate(lens):
        np.save(tmp_path / f"t{i}.npy", np.arange(n, dtype=np.int32) + 10 * i)
    src = str(tmp_path / "t*.npy")
    b = next(iter(ArrayDataset(src, samples="files", batch_size=5, collate=list, device="cpu")))
    assert [t.tolist() for t in b] == [list(range(10 * i, 10 * i + n)) for i, n in enumerate(lens)]
    b = next(iter(ArrayDataset(src, samples="files", batch_size=5, collate=pad_collate(-1),
                               device="cpu")))
    assert b.shape == (5, 6) and b[1].tolist() == [10, -1, -1, -1, -1, -1]
    with pytest.raises(ValueError, match="samples='files'"):
        ArrayDataset(src, batch_size=5, collate=list)


def test_file_replaced_between_batches_never_mixes(tmp_path):
    for i in range(4):
        np.save(tmp_path / f"t{i}.npy", np.full(8, i, dtype=np.int16))
    ds = ArrayDataset(str(tmp_path / "t*.npy"), samples="files", batch_size=2, device="cpu")
    assert [b.tolist() for b in ds] == [[[0] * 8, [1] * 8], [[2] * 8, [3] * 8]]
    np.save(tmp_path / "t1.npy", np.full(9, 7, dtype=np.int16))
    with pytest.raises(ferry.FerryError, match="t1.npy"):
        list(ds)


def test_dataloader_workers_two_epochs(per_sample):
    from torch.utils.data import DataLoader
    ds = ArrayDataset(fields=per_sample.fields, samples="files", batch_size=8, shuffle=True,
                      seed=6, device="cpu")
    dl = DataLoader(ds, batch_size=None, num_workers=2)
    for e in range(2):
        seen = []
        for b in dl:
            _check(b, per_sample.ref)
            seen += b["id"].tolist()
        assert seen == epoch_order(N, 6, e).tolist()
