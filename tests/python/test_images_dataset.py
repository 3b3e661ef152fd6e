"""ferry.torch.ImageDataset on shards written by the real writers (webdataset.TarWriter,
mosaicml-streaming's MDSWriter, PIL-saved ImageFolder trees), images cut from scikit-image's
photographs plus synthetic ones: batches equal to load_batch's for the epoch's ids, labels and
members as the writers wrote them, every sample exactly once per epoch over ranks x DataLoader
workers, a resume at mid-epoch on another world size equal to the uninterrupted order (the same
crops), damaged members raised by name or skipped, and Lightning's Trainer.fit."""
import logging
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("skimage")
from torch.utils.data import DataLoader  # noqa: E402

import ferry  # noqa: E402
from ferry import images  # noqa: E402
from ferry.torch import ImageDataset, epoch_order, global_state  # noqa: E402
from imageshards import distinct_images, jpeg, write_folder, write_mds, write_wds  # noqa: E402

N = 60


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgsets")
    imgs = distinct_images(N, seed=11)
    out = {"tar": (str(root / "wds" / "train-*.tar"), imgs)}
    write_wds(str(root / "wds"), imgs, shards=4)
    write_folder(str(root / "folder"), imgs, classes=4)
    out["folder"] = (str(root / "folder"), imgs)
    try:
        write_mds(str(root / "mds"), imgs, size_limit=1 << 15)
        out["mds"] = (str(root / "mds"), imgs)
    except pytest.skip.Exception:
        pass
    return out


def keys_of(batches):
    return [k for b in batches for k in b["key"]]


@pytest.mark.parametrize("fmt", ["tar", "folder", "mds"])
def test_an_epoch_equals_load_batch_of_its_ids(sets, fmt):
    if fmt not in sets:
        pytest.skip("mosaicml-streaming not installed")
    src, _ = sets[fmt]
    ds = ImageDataset(src, batch_size=16, size=32, flip=0.5, shuffle=True, seed=3, device="cpu")
    assert len(ds) == 4 and ds.num_samples == N and ds.format == fmt
    s = images.open_shards(src)
    for epoch in range(2):
        batches = list(ds)
        order = epoch_order(N, 3, epoch)
        assert [b["image"].shape[0] for b in batches] == [16, 16, 16, 12]
        assert keys_of(batches) == [s.sample(int(i))["key"] for i in order]
        got = torch.cat([b["image"] for b in batches])
        want = torch.empty(N, 3, 32, 32, dtype=torch.uint8)
        images.load_batch(s, order, want, flip=0.5, seed=3, epoch=epoch)
        assert torch.equal(got, want)
        labels = torch.cat([b["label"] for b in batches]).tolist()
        if fmt == "folder":
            assert ds.classes == ["c0", "c1", "c2", "c3"]
            assert labels == [s.sample(int(i))["label"] for i in order]
            assert labels == [int(k.split("/")[0][1:]) for k in keys_of(batches)]    # c{label}/...
        else:
            assert labels == [int(i) % 10 for i in order]    # .cls / the MDS int column
    im = ds.stats()["images"]
    assert {k: im[k] for k in ("cpu", "gpu", "gpu_hardware", "skipped")} == {"cpu": 2 * N, "gpu": 0,
                                                                               "gpu_hardware": 0, "skipped": 0}
    sec = im["seconds"]     # where the epochs' batch calls spent their time
    assert set(sec) == {"call", "prepare", "cpu_decode", "gpu", "wait"}
    assert sec["call"] > 0 and 0 < sec["prepare"] <= sec["call"] and sec["cpu_decode"] > 0 and sec["gpu"] == 0


def test_members_beside_the_image(sets):
    src, _ = sets["tar"]
    ds = ImageDataset(src, batch_size=8, size=24, crop="resize", members=("txt", "json", "npy"),
                      normalize=((0.5,), (0.25,)), dtype=torch.bfloat16, device="cpu")
    b = next(iter(ds))
    assert b["image"].dtype == torch.bfloat16 and b["image"].shape == (8, 3, 24, 24)
    assert b["key"] == [f"s{i:05d}" for i in range(8)]
    assert b["label"].dtype == torch.int64 and b["label"].tolist() == list(range(8))
    assert b["txt"] == [f"caption {i}" for i in range(8)]
    assert b["json"] == [{"i": i, "tags": ["a", str(i)]} for i in range(8)]
    assert torch.equal(b["npy"], torch.arange(3, dtype=torch.float32) + torch.arange(8.0)[:, None])
    ref = torch.empty(8, 3, 24, 24, dtype=torch.bfloat16)
    images.load_batch(images.open_shards(src), range(8), ref, crop="resize", mean=(0.5,), std=(0.25,))
    assert torch.equal(b["image"], ref)
    if "mds" in sets:
        m = ImageDataset(sets["mds"][0], batch_size=5, size=16, members=("caption", "vec"), device="cpu")
        b = next(iter(m))
        assert b["caption"] == [f"caption {i}" for i in range(5)]
        assert torch.equal(b["vec"], torch.arange(3, dtype=torch.float32) + torch.arange(5.0)[:, None])
        assert b["label"].tolist() == list(range(5))
    one = ImageDataset(src, batch_size=None, size=16, device="cpu")     # per-sample, the loader batches
    b = next(iter(DataLoader(one, batch_size=4)))
    assert b["image"].shape == (4, 3, 16, 16) and list(b["key"]) == [f"s{i:05d}" for i in range(4)]


def test_ragged_batch_without_resize_is_an_error_that_says_so(sets):
    src, imgs = sets["tar"]
    with pytest.raises(ValueError, match="needs size="):
        ImageDataset(src, batch_size=4, device="cpu")
    ds = ImageDataset(src, batch_size=4, crop=None, device="cpu")
    with pytest.raises(ferry.FerryError, match="without a crop or resize every image must be the output's "
                       "size \\(pass a crop or resize\\)"):
        next(iter(ds))
    h, w = imgs[0].shape[:2]
    one = ImageDataset(src, batch_size=1, crop=None, device="cpu")     # equal sizes need none
    assert next(iter(one))["image"].shape == (1, 3, h, w)


def _rank_keys(src, world, workers, epochs, **kw):
    """{epoch: keys} of every rank, each through a DataLoader of `workers` workers."""
    seen = {e: [] for e in range(epochs)}
    for r in range(world):
        ds = ImageDataset(src, batch_size=5, size=16, shuffle=True, seed=9, rank=r, world_size=world,
                          device="cpu", **kw)
        loader = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)
        for e in range(epochs):
            seen[e].extend(keys_of(loader))
    return seen


@pytest.mark.parametrize("world,workers", [(1, 0), (2, 2), (3, 1)])
def test_every_sample_once_per_epoch_over_ranks_and_workers(sets, world, workers):
    src, _ = sets["tar"]
    seen = _rank_keys(src, world, workers, epochs=2)
    for e in range(2):
        assert sorted(seen[e]) == [f"s{i:05d}" for i in range(N)], (e, world, workers)
    assert seen[0] != seen[1]


def test_workers_draw_the_crops_of_their_epoch(sets):
    """DataLoader workers learn the epoch from the board: their batches of epochs 0 and 1 are
    the in-process dataset's, pixel for pixel."""
    src, _ = sets["tar"]
    kw = dict(batch_size=7, size=20, flip=0.5, shuffle=True, seed=6, device="cpu")
    ds = ImageDataset(src, **kw)
    want = [list(ds) for _ in range(2)]
    loader = DataLoader(ImageDataset(src, **kw), batch_size=None, num_workers=2)
    for e in range(2):
        got = list(loader)
        assert keys_of(got) == keys_of(want[e])
        assert torch.equal(torch.cat([b["image"] for b in got]), torch.cat([b["image"] for b in want[e]]))


def test_resume_mid_epoch_on_another_world_size(sets):
    """Two ranks take 3 steps and save; three ranks resume: the positions after the first
    3 x 2 x 5 are the rest of the uninterrupted order, with the same crops and flips."""
    src, _ = sets["folder"]
    kw = dict(batch_size=5, size=20, flip=0.5, shuffle=True, seed=2, device="cpu")
    whole = list(ImageDataset(src, **kw))
    keys = keys_of(whole)
    pix = {k: im for b in whole for k, im in zip(b["key"], b["image"])}
    first = []
    states = []
    for r in range(2):
        ds = ImageDataset(src, rank=r, world_size=2, **kw)
        it = iter(ds)
        first.append([next(it) for _ in range(3)])
        states.append(ds.state_dict())
    assert states[0] == states[1] and states[0]["samples_consumed"] == 30
    got = [k for step in range(3) for r in range(2) for k in first[r][step]["key"]]
    rest = []
    for r in range(3):
        ds = ImageDataset(src, rank=r, world_size=3, **kw)
        ds.load_state_dict(states[0])
        rest.append(list(ds))
    for step in range(max(len(x) for x in rest)):
        for r in range(3):
            if step < len(rest[r]):
                got.extend(rest[r][step]["key"])
                for k, im in zip(rest[r][step]["key"], rest[r][step]["image"]):
                    assert torch.equal(im, pix[k]), k
    assert got == keys


def test_resume_from_a_stateful_dataloader_with_workers(sets):
    sdl = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader
    src, _ = sets["tar"]
    kw = dict(batch_size=4, size=16, shuffle=True, seed=5, device="cpu")
    keys = keys_of(ImageDataset(src, **kw))
    loader = sdl(ImageDataset(src, **kw), batch_size=None, num_workers=2)
    it = iter(loader)
    got = keys_of([next(it) for _ in range(5)])
    st = global_state(loader.state_dict())
    del it, loader
    ds = ImageDataset(src, **kw)
    ds.load_state_dict(st)
    got += keys_of(DataLoader(ds, batch_size=None, num_workers=2))
    assert got == keys


def test_damaged_members_raise_by_name_or_are_skipped(tmp_path, caplog):
    wds = pytest.importorskip("webdataset")
    imgs = distinct_images(12, seed=4)
    p = str(tmp_path / "damaged.tar")
    with wds.TarWriter(p) as w:
        for i, a in enumerate(imgs):
            data = jpeg(a)
            if i == 3:
                data = data[: len(data) // 2]                       # truncated
            if i == 8:
                b = bytearray(data)
                b[len(b) // 2:len(b) // 2 + 64] = b"\xff" * 64      # flipped bits in the scan
                data = bytes(b)
            w.write({"__key__": f"k{i:02d}", "jpg": data, "cls": b"1"})
    ds = ImageDataset(p, batch_size=4, size=16, device="cpu")
    with pytest.raises(ferry.FerryError) as e:
        list(ds)
    assert "damaged.tar" in str(e.value) and '"k03"' in str(e.value) and "jpg" in str(e.value)
    ds = ImageDataset(p, batch_size=4, size=16, device="cpu", on_error="skip", shuffle=True, seed=1)
    with caplog.at_level(logging.WARNING, logger="ferry.torch"):
        for _ in range(2):
            got = keys_of(ds)
            assert sorted(got) == [f"k{i:02d}" for i in range(12) if i not in (3, 8)]
    assert ds.stats()["images"]["skipped"] == 4
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 1      # logged once


def test_lightning_fit_every_sample_once_per_epoch(sets):
    L = pytest.importorskip("lightning")

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3 * 16 * 16, 4)
            self.seen = {}

        def training_step(self, batch, i):
            self.seen.setdefault(self.current_epoch, []).extend(batch["key"])
            logits = self.lin(batch["image"].flatten(1))
            return torch.nn.functional.cross_entropy(logits, batch["label"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    src, _ = sets["folder"]
    for workers in (0, 2):
        ds = ImageDataset(src, batch_size=8, size=16, flip=0.5, shuffle=True, seed=4, device="cpu",
                          normalize=((0.5,), (0.5,)))
        model = Tiny()
        trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, train_dataloaders=DataLoader(ds, batch_size=None, num_workers=workers))
        s = images.open_shards(src)
        for e in range(3):
            assert model.seen[e] == [s.sample(int(i))["key"] for i in epoch_order(N, 4, e)], (workers, e)
