"""ferry.torch datasets under Lightning's Trainer.fit and plain DataLoaders (issue 15 items 1-2,
issue 16 item 12): epochs advance without set_epoch, every sample once per epoch, a DataLoader
that would batch ferry's batches again is refused, and state_dict() in the main process of a
worker DataLoader says it cannot be exact. Files are written by numpy."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")
from torch.utils.data import DataLoader  # noqa: E402

import ferry.torch as ft  # noqa: E402
from ferry.torch import ArrayDataset, epoch_order  # noqa: E402

N, B = 40, 8


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("lit")
    rng = np.random.default_rng(0)
    np.save(root / "x.npy", rng.standard_normal((N, 4)).astype(np.float32))
    np.save(root / "id.npy", np.arange(N, dtype=np.int64))
    return {"x": str(root / "x.npy"), "id": str(root / "id.npy")}


class _Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.seen = {}

    def training_step(self, batch, i):
        self.seen.setdefault(self.current_epoch, []).extend(batch["id"].reshape(-1).tolist())
        return self.lin(batch["x"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(loader, epochs=3):
    model = _Tiny()
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # Lightning's advice on workers and lengths
        trainer.fit(model, train_dataloaders=loader)
    return model.seen


@pytest.mark.parametrize("workers", [0, 2])
def test_lightning_fit_every_sample_once_per_epoch_new_order(files, workers):
    ds = ArrayDataset(fields=files, batch_size=B, shuffle=True, seed=4, device="cpu")
    seen = _fit(DataLoader(ds, batch_size=None, num_workers=workers))
    assert sorted(seen) == [0, 1, 2]
    for e in range(3):
        assert sorted(seen[e]) == list(range(N)), (e, seen[e])   # every sample exactly once
        assert seen[e] == epoch_order(N, 4, e).tolist()          # the epoch's own order
    assert seen[0] != seen[1] != seen[2]


def test_lightning_persistent_workers(files):
    ds = ArrayDataset(fields=files, batch_size=B, shuffle=True, seed=5, device="cpu")
    seen = _fit(DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True))
    for e in range(3):
        assert seen[e] == epoch_order(N, 5, e).tolist()


def test_len_batches_end_the_epoch_without_stopiteration(files):
    ds = ArrayDataset(fields=files, batch_size=B, shuffle=True, seed=1, device="cpu")
    for e in range(3):                          # what Lightning does: take len() batches, stop
        it = iter(ds)
        got = [i for _ in range(len(ds)) for i in next(it)["id"].tolist()]
        assert got == epoch_order(N, 1, e).tolist()
        assert ds.epoch == e + 1 and ds.state_dict()["samples_consumed"] == 0


def test_set_epoch_still_selects_the_epoch_with_workers(files):
    ds = ArrayDataset(fields=files, batch_size=B, shuffle=True, seed=2, device="cpu")
    dl = DataLoader(ds, batch_size=None, num_workers=2)
    for e in (0, 1, 1, 5):                      # DistributedSampler's convention keeps working
        ds.set_epoch(e)
        got = [i for b in dl for i in b["id"].tolist()]
        assert got == epoch_order(N, 2, e).tolist()        # set_epoch(1) twice: epoch 1 twice
    # without set_epoch the workers count on: 5 was the last pass
    assert [i for b in dl for i in b["id"].tolist()] == epoch_order(N, 2, 6).tolist()
    assert ds.epoch == 6


def test_dataloader_default_batch_size_is_refused(files):
    ds = ArrayDataset(fields=files, batch_size=B, device="cpu")
    for workers, bs in ((0, 1), (0, 4), (2, 1)):    # DataLoader's default batch_size is 1
        dl = DataLoader(ds, batch_size=bs, num_workers=workers)
        with pytest.raises(Exception, match="batch_size=None"):
            it = iter(dl)               # num_workers=0: here; with workers: at the first batch
            next(it)
        it = None
    b = next(iter(DataLoader(ds, batch_size=None)))
    assert b["x"].shape == (B, 4)
    # per-sample mode is meant for the DataLoader's batching
    one = ArrayDataset(fields=files, batch_size=None, device="cpu")
    b = next(iter(DataLoader(one, batch_size=5)))
    assert b["x"].shape == (5, 4) and b["id"].tolist() == [0, 1, 2, 3, 4]
    # a custom collate_fn is the user's choice: warned, not refused
    with pytest.warns(UserWarning, match="again"):
        b = next(iter(DataLoader(ds, batch_size=2, collate_fn=lambda xs: xs)))
    assert len(b) == 2


def test_main_process_state_with_workers_warns(files):
    ds = ArrayDataset(fields=files, batch_size=B, shuffle=True, seed=3, device="cpu")
    it = iter(DataLoader(ds, batch_size=None, num_workers=2))
    first = next(it)["id"].tolist()
    assert first == epoch_order(N, 3, 0)[:B].tolist()
    with pytest.warns(ft.InaccurateStateWarning, match="StatefulDataLoader"):
        st = ds.state_dict()
    # never ahead of what was delivered: the start of the workers' pass
    assert (st["epoch"], st["samples_consumed"]) == (0, 0)
    rest = [i for b in it for i in b["id"].tolist()]
    assert sorted(first + rest) == list(range(N))
    with pytest.warns(ft.InaccurateStateWarning):
        st = ds.state_dict()
    assert (st["epoch"], st["samples_consumed"]) == (0, 0)
    assert ds.epoch == 0
    # num_workers=0: exact, no warning
    ds2 = ArrayDataset(fields=files, batch_size=B, device="cpu")
    it = iter(DataLoader(ds2, batch_size=None))
    next(it), next(it)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ds2.state_dict()["samples_consumed"] == 2 * B


def test_spawned_workers_share_the_epoch_board(files):
    """Spawned workers get the dataset through multiprocessing's ForkingPickler, where torch
    passes shared-memory tensors by handle: the copy's board is the main process's board (a real
    spawn per epoch takes ~9 s to import torch on a small CI machine; this is the same pickling)."""
    import pickle
    from multiprocessing.reduction import ForkingPickler
    ds = ArrayDataset(fields=files, batch_size=B, shuffle=True, seed=7, device="cpu")
    copy = pickle.loads(ForkingPickler.dumps(ds))
    copy._board.join(0, 1, tag=12345)                 # a worker of a pass starts epoch 0
    assert ds._board.latest() == (0, 0, False)
    copy._board.ended(0)
    assert ds._board.latest() == (0, 0, True) and ds.epoch == 0
    # plain pickle (torch.save, copy.deepcopy) gives a private board
    other = pickle.loads(pickle.dumps(ds))
    other._board.publish(9, 0)
    assert ds._board.latest() == (0, 0, True) and int(ds._board.a[0]) == 0
