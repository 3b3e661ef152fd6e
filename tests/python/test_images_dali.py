"""ferry.dali over ferry.torch.ImageDataset in a CPU pipeline: DALI's batches are the dataset's
(images in its layout, labels), DALI operators run after them, epochs follow DALI's epoch index,
keys travel as UTF-8 bytes, and a batch from which on_error="skip" left an image out is smaller.
GPU pipelines: tests/gpu/test_images_gpu.py."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("skimage")
try:
    import nvidia.dali  # noqa: F401
except Exception as e:  # noqa: BLE001
    pytest.skip(f"DALI does not import here: {e}", allow_module_level=True)
import nvidia.dali.fn as fn  # noqa: E402

import ferry.dali  # noqa: E402
from ferry.torch import ImageDataset  # noqa: E402
from imageshards import distinct_images, write_wds  # noqa: E402


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("dali"))
    write_wds(d, distinct_images(20, seed=8), shards=2)
    return d + "/train-*.tar"


def make(src, **kw):
    return ImageDataset(src, batch_size=6, size=24, flip=0.5, shuffle=True, seed=2, device="cpu", **kw)


def run_epoch(pipe):
    out = []
    try:
        while True:
            out.append([[np.array(t) for t in o] for o in pipe.run()])
    except StopIteration:
        return out


def test_image_batches_through_a_dali_pipeline(shards):
    want = [(b["image"].numpy().copy(), b["label"].numpy().copy()) for b in make(shards)]
    pipe = ferry.dali.pipeline(make(shards), then=lambda img, label: (fn.flip(img, horizontal=1), label))
    pipe.build()
    got = run_epoch(pipe)
    assert len(got) == len(want) == 4
    for (imgs, labels), (wi, wl) in zip(got, want):
        assert np.array_equal(np.stack(imgs), wi[..., ::-1])      # layout CHW: W is the last axis
        assert np.array_equal(np.stack(labels).reshape(-1), wl)
    pipe.reset()
    e1 = make(shards)
    e1.set_epoch(1)
    got1 = run_epoch(pipe)
    assert [np.stack(b[1]).reshape(-1).tolist() for b in got1] == [b["label"].tolist() for b in e1]


def test_keys_as_bytes_and_skipped_images_give_smaller_batches(shards, tmp_path):
    pipe = ferry.dali.pipeline(make(shards), outputs=("image", "key"))
    pipe.build()
    keys = [bytes(k).decode() for b in run_epoch(pipe) for k in b[1]]
    assert keys == [k for b in make(shards) for k in b["key"]]
    assert sorted(keys) == [f"s{i:05d}" for i in range(20)]
    wds = pytest.importorskip("webdataset")
    from imageshards import jpeg
    p = str(tmp_path / "cut.tar")
    with wds.TarWriter(p) as w:
        for i, a in enumerate(distinct_images(12, seed=9)):
            data = jpeg(a)
            w.write({"__key__": f"k{i:02d}", "jpg": data[: len(data) // 2] if i == 2 else data, "cls": b"0"})
    pipe = ferry.dali.pipeline(ImageDataset(p, batch_size=6, size=16, on_error="skip", device="cpu"))
    pipe.build()
    sizes = [len(b[0]) for b in run_epoch(pipe)]
    assert sizes == [5, 6]
