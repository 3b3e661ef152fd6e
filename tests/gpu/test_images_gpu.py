"""ferry.torch.ImageDataset and ferry.images.load_batch on CUDA: batches in GPU memory equal
to the host path's bit for bit (uint8 and bfloat16), behind a consumer stream that lags a
training step, and a DALI GPU pipeline fed by the dataset. Shards by webdataset.TarWriter.

Skips (with the reason) where torch or ferry cannot use a GPU."""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)
pytest.importorskip("skimage")

from ferry import _ferry, images  # noqa: E402
from ferry.torch import ImageDataset  # noqa: E402

_ctx = _ferry.Context()
if _ctx.cuda_device_count() == 0:
    pytest.skip(f"ferry cannot use CUDA: {_ctx.cuda_status}", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from imageshards import distinct_images, write_wds  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("imggpu"))
    write_wds(d, distinct_images(90, seed=6), shards=3)
    return d + "/train-*.tar"


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16])
def test_cuda_batches_equal_the_host_path(shards, dtype):
    kw = dict(batch_size=16, size=48, flip=0.5, shuffle=True, seed=1,
              normalize=None if dtype == torch.uint8 else (MEAN, STD), dtype=dtype)
    host_ds = ImageDataset(shards, device="cpu", **kw)
    # decoded on the CPU, transformed by the GPU kernel (bit for bit the CPU transform): equal to
    # the host path; nvJPEG's pixels differ from libjpeg-turbo's within the bounds
    # test_image_batch_gpu.py checks
    ds = ImageDataset(shards, device="cuda", decode="cpu", **kw)
    for epoch in range(2):
        host = list(host_ds)
        got = []
        for b in ds:
            torch.cuda._sleep(2_000_000)          # the consumer's stream lags behind a step
            assert b["image"].is_cuda and b["label"].is_cuda
            got.append((b["image"].cpu(), b["label"].cpu(), b["key"]))
        assert len(got) == len(host) == 6
        for (img, lab, keys), h in zip(got, host):
            assert torch.equal(img, h["image"]) and torch.equal(lab, h["label"]) and keys == h["key"]
    assert ds.stats()["images"]["cpu"] == 180


def test_load_batch_into_cuda_memory_on_a_stream(shards):
    s = images.open_shards(shards)
    ids = list(range(0, 90, 7))
    host = torch.empty(len(ids), 3, 40, 40, dtype=torch.float32)
    images.load_batch(s, ids, host, mean=MEAN, std=STD, seed=4)
    dev = torch.empty_like(host, device="cuda")
    st = torch.cuda.Stream()
    images.load_batch(s, ids, dev, mean=MEAN, std=STD, seed=4, stream=st, decode="cpu")
    torch.cuda.current_stream().wait_stream(st)
    assert torch.equal(dev.cpu(), host)


def test_dali_gpu_pipeline_fed_by_the_dataset(shards):
    try:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        import ferry.dali
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"DALI does not import here: {e}")
    kw = dict(batch_size=16, size=32, shuffle=True, seed=3)
    want = [(b["image"].numpy(), b["label"].numpy()) for b in ImageDataset(shards, device="cpu", **kw)]
    pipe = ferry.dali.pipeline(
        ImageDataset(shards, device="cuda", **kw),
        then=lambda img, label: (fn.crop_mirror_normalize(img, mirror=1, output_layout="CHW", dtype=types.UINT8),
                                 label))
    pipe.build()
    got = []
    try:
        while True:
            imgs, labels = pipe.run()
            got.append((np.stack([np.array(t) for t in imgs.as_cpu()]),
                        np.stack([np.array(t) for t in labels.as_cpu()]).reshape(-1)))
    except StopIteration:
        pass
    assert len(got) == len(want)
    for (img, lab), (wi, wl) in zip(got, want):
        assert np.array_equal(img, wi[..., ::-1]) and np.array_equal(lab, wl)
