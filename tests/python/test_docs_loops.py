"""The complete training loops of docs/torch.md, docs/xarray-training.md and docs/images.md run as written.

Each loop is taken from its document (the first ```python block under its heading), not copied
here, so a loop that no longer runs against the API fails this test. What a machine without a
GPU and without torchrun cannot run is translated, and only that: the device ("cuda" -> "cpu",
`.cuda()` dropped), the process group ("nccl" -> "gloo", world of one), the epoch count and the
checkpoint interval (so the loop saves, then resumes from what it saved: the second run takes
the `resume_from` branch). The model classes the docs leave to the user are small modules
defined here. The files are written by numpy and xarray's netCDF4 engine into a temporary
directory laid out as the docs name it."""
import os
import re
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from optional import has

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _block(doc, heading):
    """The first ```python block after the line starting with `heading` in docs/`doc`."""
    text = (DOCS / doc).read_text()
    at = text.index("\n" + heading)
    m = re.search(r"```python\n(.*?)```", text[at:], re.S)
    assert m, f"{doc}: no python block under {heading!r}"
    return m.group(1)


def _translate(code, subs):
    """Apply (old, new) replacements, each of which must match: a doc that changed its loop so
    that a translation no longer applies fails here, loudly, instead of running untranslated."""
    for old, new in subs:
        assert old in code, f"the loop no longer contains {old!r}: update the translation"
        code = code.replace(old, new)
    return code


DEVICE = [('device="cuda"', 'device="cpu"'), (".cuda()", "")]
CPU = [("torch.cuda.set_device(rank % torch.cuda.device_count())", "pass"),
       ('dist.init_process_group("nccl")', 'dist.init_process_group("gloo")')] + DEVICE


@pytest.fixture
def one_rank(monkeypatch, tmp_path):
    """A gloo group of one process (what torchrun would set up), torn down afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


def _run_twice(code, names):
    """Run the loop, then run it again resuming from the checkpoint it saved."""
    import torch.distributed as dist
    first = dict(names, resume_from=None)
    exec(compile(code, "<doc loop>", "exec"), first)
    assert os.path.exists("ckpt.pt"), "the loop never saved its checkpoint"
    saved = torch.load("ckpt.pt", weights_only=False)
    if dist.is_initialized():
        dist.destroy_process_group()
    second = dict(names, resume_from="ckpt.pt")
    exec(compile(code, "<doc loop>", "exec"), second)
    return first, second, saved


class _Classifier(torch.nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.fc = torch.nn.Linear(3, classes)

    def forward(self, x):                      # (B, 3, H, W) in any float dtype
        return self.fc(x.float().mean(dim=(2, 3)))


def test_torch_md_array_dataset_loop(one_rank):
    rng = np.random.default_rng(0)
    os.makedirs("train")
    for s in range(2):                         # two shards of 40 samples, 3x8x8 uint8 images
        np.save(f"train/images_{s}.npy", rng.integers(0, 255, (40, 3, 8, 8), dtype=np.uint8))
        np.save(f"train/labels_{s}.npy", rng.integers(0, 10, 40).astype(np.int64))
    code = _translate(_block("torch.md", "## A complete training loop"),
                      CPU + [("batch_size=256", "batch_size=16"), ("range(start_epoch, 90)", "range(start_epoch, 2)"),
                             ("step % 1000 == 0", "step % 3 == 0")])
    first, second, saved = _run_twice(code, {"MyModel": _Classifier})
    assert first["step"] == 2 * (80 // 16)     # drop_last: 5 batches an epoch, 2 epochs
    assert saved["step"] == 9 and saved["epoch"] == 1
    # resumed at step 9 inside epoch 1: the one batch left of that epoch, then the loop ends
    assert second["step"] == 10


def test_torch_md_per_sample_loop(one_rank):
    rng = np.random.default_rng(2)
    os.makedirs("train/images")
    os.makedirs("train/labels")
    for i in range(40):                        # one file per sample: a 3x8x8 image, a scalar label
        np.save(f"train/images/img_{i}.npy", rng.integers(0, 255, (3, 8, 8), dtype=np.uint8))
        np.save(f"train/labels/lbl_{i}.npy", np.int64(rng.integers(0, 10)))
    code = _translate(_block("torch.md", "## One file per sample"),
                      DEVICE + [("batch_size=256", "batch_size=8"), ("range(start_epoch, 30)", "range(start_epoch, 2)"),
                                ("step % 500 == 0", "step % 3 == 0")])
    first, second, saved = _run_twice(code, {"MyModel": _Classifier})
    assert first["step"] == 2 * (40 // 8)      # drop_last: 5 batches an epoch, 2 epochs
    assert saved["step"] == 9
    assert second["step"] == 10                # resumed at step 9: the epoch's last batch


class _GPT(torch.nn.Module):
    def __init__(self, vocab=512, dim=16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.out = torch.nn.Linear(dim, vocab)

    def forward(self, x):                      # (B, T) int64 -> (B, T, vocab)
        return self.out(self.emb(x))


def test_torch_md_token_dataset_loop(one_rank):
    rng = np.random.default_rng(1)
    os.makedirs("data")
    rng.integers(0, 512, 40_000, dtype=np.uint16).tofile("data/train.bin")
    rng.integers(0, 512, 5_000, dtype=np.uint16).tofile("data/val.bin")
    code = _translate(_block("torch.md", "## Token windows"),
                      DEVICE + [("seq_len=1024", "seq_len=64")])
    names = {"GPT": lambda cfg: _GPT(), "config": None, "max_steps": 12, "eval_interval": 5}
    first, second, saved = _run_twice(code, names)
    assert first["step"] == 12 and saved["step"] == 10
    assert np.isfinite(first["val_loss"]) and first["val_loss"] > 0
    assert second["step"] == 12                # resumed at 10, two more steps


class _Forecaster(torch.nn.Module):
    def __init__(self, in_ch, out_ch):
        super().__init__()
        self.conv = torch.nn.Conv2d(in_ch, out_ch, 1)

    def forward(self, x):
        return self.conv(x)


def _era5_files(rng, n_files=2, steps=12, h=6, w=8):
    """ERA5-like netCDF-4 files along time (zlib + shuffle, one chunk a step), as
    docs/xarray-training.md names them: surface t2m/u10/v10, z and t on three levels."""
    import pandas as pd
    import xarray as xr
    os.makedirs("era5")
    times = pd.date_range("2020-01-01", periods=n_files * steps, freq="h")
    for f in range(n_files):
        tt = times[f * steps:(f + 1) * steps]
        data = {v: (("time", "lat", "lon"), rng.normal(0, 1, (steps, h, w)).astype(np.float32))
                for v in ("t2m", "u10", "v10")}
        data.update({v: (("time", "level", "lat", "lon"), rng.normal(0, 1, (steps, 3, h, w)).astype(np.float32))
                     for v in ("z", "t")})
        ds = xr.Dataset(data, coords={"time": tt, "level": [500, 700, 850], "lat": np.arange(h),
                                      "lon": np.arange(w)})
        enc = {v: {"zlib": True, "shuffle": True, "chunksizes": (1,) + ds[v].shape[1:]} for v in data}
        ds.to_netcdf(f"era5/{f:02d}.nc", engine="netcdf4", encoding=enc)


@pytest.mark.skipif(not has("netCDF4"), reason="writing the netCDF-4 files needs netCDF4")
def test_xarray_training_md_ddp_loop(one_rank):
    _era5_files(np.random.default_rng(2))
    code = _translate(_block("xarray-training.md", "## A complete ERA5-style training loop"),
                      CPU + [("range(start_epoch, 50)", "range(start_epoch, 2)"),
                             ("step % 500 == 0", "step % 2 == 0")])
    first, second, saved = _run_twice(code, {"MyForecaster": _Forecaster})
    ds = first["ds"]
    # 24 steps, input 2, target 1 at lead 6: 24 - 2 + 1 - 6 = 17 samples, 2 full batches of 8
    assert len(ds.channel_names()) == (3 + 2 * 2) * 2 and first["step"] == 4   # levels 500, 850; 2 input steps
    assert os.path.exists("era5-stats.json")
    # the save came with the epoch's last batch: its state is the start of the next epoch, and the
    # resumed loop (which takes its epoch from the dataset, not from ck["epoch"]) runs nothing
    # again (a loop taking ck["epoch"] would replay epoch 1: every sample twice)
    assert saved["step"] == 4 and saved["data"]["epoch"] == 2 and second["step"] == 4


@pytest.mark.skipif(not (has("netCDF4") and has("nvidia.dali")), reason="needs netCDF4 and DALI")
def test_xarray_training_md_dali_loop(one_rank):
    import xarray as xr
    from ferry.torch import XarrayDataset
    _era5_files(np.random.default_rng(3))
    code = _translate(_block("xarray-training.md", "## DALI pipelines fed from xarray data"),
                      [('device="cuda"', 'device="cpu"'), ("range(10)", "range(2)")])
    code = code.replace("        ...\n", "        seen.append((x.shape, y.shape, x.device.type))\n")
    names = {"XarrayDataset": XarrayDataset, "seen": [],
             "era": xr.open_mfdataset("era5/*.nc", engine="ferry")}
    exec(compile(code, "<doc loop>", "exec"), names)
    # 24 steps, target 1 at lead 1: 23 samples, batch 16 -> 2 batches an epoch (the last of 7)
    assert len(names["seen"]) == 4
    # channels: t2m, then z's three levels; the tail batch of 7 samples each epoch
    assert [tuple(x) for x, _, _ in names["seen"]] == [(16, 4, 6, 8), (7, 4, 6, 8)] * 2
    assert [tuple(y) for _, y, _ in names["seen"]] == [(16, 4, 6, 8), (7, 4, 6, 8)] * 2
    assert all(d == "cpu" for _, _, d in names["seen"])


@pytest.mark.skipif(not (has("skimage") and has("PIL")), reason="the images are cut from scikit-image's photographs")
def test_images_md_imagefolder_loop(one_rank):
    from imageshards import distinct_images, write_folder
    write_folder("imagenet/train", distinct_images(40, seed=1), classes=4)
    code = _translate(_block("images.md", "## An ImageNet training loop"),
                      CPU + [("batch_size=256", "batch_size=8"), ("size=224", "size=32"),
                             ("range(start_epoch, 90)", "range(start_epoch, 2)"),
                             ("step % 1000 == 0", "step % 3 == 0")])
    first, second, saved = _run_twice(code, {"MyModel": _Classifier})
    assert first["step"] == 2 * (40 // 8)      # drop_last: 5 batches an epoch, 2 epochs
    assert first["batch"]["image"].dtype == torch.bfloat16 and first["batch"]["image"].shape == (8, 3, 32, 32)
    assert saved["step"] == 9
    assert second["step"] == 10                # resumed at step 9: the epoch's last batch


class _ImageText(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, images, tokens):
        return (self.fc(images.float().mean(dim=(2, 3))).squeeze(1) - tokens.float()).pow(2).mean()


@pytest.mark.skipif(not (has("skimage") and has("PIL") and has("webdataset")),
                    reason="needs scikit-image's photographs and webdataset's TarWriter")
def test_images_md_webdataset_loop(tmp_path, monkeypatch, capsys):
    from imageshards import distinct_images, write_wds
    monkeypatch.chdir(tmp_path)
    write_wds("shards", distinct_images(30, seed=2), shards=3)
    code = _translate(_block("images.md", "## A WebDataset loop"),
                      [('device="cuda"', 'device="cpu"'), ("batch_size=128", "batch_size=8"),
                       ("size=(256, 256)", "size=(32, 32)")])
    model = _ImageText()
    names = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01),
             "tokenizer": lambda caps: torch.tensor([len(c) for c in caps])}
    exec(compile(code, "<doc loop>", "exec"), names)
    assert names["images"].dtype == torch.float16 and names["images"].shape == (6, 3, 32, 32)   # the tail of 30
    assert names["captions"][0].startswith("caption ")
    assert "'cpu': 60" in capsys.readouterr().out                  # two epochs of 30, decoded on the CPU
