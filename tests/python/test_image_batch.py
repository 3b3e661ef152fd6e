"""ferry.images.load_batch (ferry_image_batch) into host arrays: a WebDataset
tar written by webdataset.TarWriter with JPEGs and PNGs saved by PIL; every row
equals the image decoded by PIL (libjpeg-turbo, as ferry's decoder: 0
difference) and transformed by the CPU transform over the box and flip drawn
from (seed, epoch, sample). numpy uint8 CHW and torch bfloat16 HWC
normalised outputs; a corrupt member raises naming the shard, the key and the
member, or is skipped with the rows closed up; ferry.stats() counts images."""
import io

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

ferry = pytest.importorskip("ferry")
from ferry import _ferry, images  # noqa: E402

wds = pytest.importorskip("webdataset")
FerryError = ferry.FerryError


def _pixels(h, w, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([x * 180 // max(w, 1) + y * 60 // max(h, 1) + 25 * c for c in range(3)], -1)
    return (a + rng.integers(0, 8, a.shape)).clip(0, 255).astype(np.uint8)


def _encode(kind, h, w, seed):
    b = io.BytesIO()
    a = _pixels(h, w, seed)
    if kind == "png":
        Image.fromarray(a).save(b, "PNG")
    elif kind == "gray":
        Image.fromarray(a[:, :, 0]).save(b, "JPEG", quality=90)
    elif kind == "progressive":
        Image.fromarray(a).save(b, "JPEG", quality=90, progressive=True)
    else:
        Image.fromarray(a).save(b, "JPEG", quality=90, subsampling=0 if kind == "444" else 2)
    return b.getvalue()


SPEC = [("420", 45, 67), ("444", 64, 40), ("gray", 31, 33), ("progressive", 60, 80), ("png", 37, 50),
        ("420", 1, 1), ("420", 200, 300)]


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    d = tmp_path_factory.mktemp("imgbatch")
    path = str(d / "train-0000.tar")
    datas = []
    with wds.TarWriter(path) as tw:
        for i, (kind, h, w) in enumerate(SPEC):
            data = _encode(kind, h, w, i)
            datas.append(data)
            tw.write({"__key__": f"s{i:03d}", "png" if kind == "png" else "jpg": data, "cls": str(i).encode()})
    return path, datas


def _expected(data, sample, size, seed, epoch, flip, layout="CHW", dtype="uint8", mean=None, std=None,
              scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    px = np.ascontiguousarray(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    h, w = px.shape[:2]
    box = _ferry.random_resized_crop(seed, epoch, sample, h, w, scale, ratio)
    fl = flip > 0 and _ferry.flip_draw(seed, epoch, sample, flip)
    return _ferry.image_transform(px.tobytes(), (h, w, 3), box, size, fl, layout, dtype, mean, std)


def test_rows_equal_pil_decode_and_cpu_transform(shard):
    path, datas = shard
    s = images.open_shards(path)
    samples = [0, 1, 2, 3, 4, 5, 6, 3]
    out = np.zeros((len(samples), 3, 24, 32), np.uint8)
    before = ferry.stats()
    r = images.load_batch(s, samples, out, flip=0.5, seed=5, epoch=2, decode="cpu", threads=3)
    assert r["written"] == len(samples) and r["skipped"] == [] and r["cpu"] == len(samples) and r["gpu"] == 0
    assert set(r["fallbacks"]) >= {"png", "cmyk", "gpu_error"}
    for i, k in enumerate(samples):
        want = np.frombuffer(_expected(datas[k], k, (24, 32), 5, 2, 0.5), np.uint8).reshape(3, 24, 32)
        assert np.array_equal(out[i], want), f"row {i} (sample {k})"
    after = ferry.stats()
    assert after["image_cpu"] - before["image_cpu"] == len(samples)


def test_torch_bfloat16_hwc_normalised(shard):
    torch = pytest.importorskip("torch")
    path, datas = shard
    s = images.open_shards(path)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    out = torch.empty((3, 16, 16, 3), dtype=torch.bfloat16)
    r = images.load_batch(s, [6, 0, 4], out, size=(16, 16), layout="HWC", mean=mean, std=std, seed=1, epoch=0)
    assert r["written"] == 3
    for i, k in enumerate([6, 0, 4]):
        want = np.frombuffer(_expected(datas[k], k, (16, 16), 1, 0, 0.0, "HWC", "bfloat16", mean, std), np.uint16)
        got = out[i].contiguous().view(torch.int16).numpy().view(np.uint16).reshape(-1)
        assert np.array_equal(got, want), f"row {i}"


def test_same_draws_on_resume_other_epoch_differs(shard):
    path, _ = shard
    s = images.open_shards(path)
    a, b, c = (np.zeros((4, 3, 20, 20), np.float32) for _ in range(3))
    images.load_batch(s, [6, 0, 1, 3], a, flip=0.5, seed=9, epoch=3)
    images.load_batch(s, [6, 0, 1, 3], b, flip=0.5, seed=9, epoch=3, threads=1)
    images.load_batch(s, [6, 0, 1, 3], c, flip=0.5, seed=9, epoch=4)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert 0.0 <= a.min() and a.max() <= 1.0   # no mean/std: v / 255


def test_resize_center_and_none(shard):
    path, datas = shard
    s = images.open_shards(path)
    out = np.zeros((2, 45, 67, 3), np.uint8)
    images.load_batch(s, [0, 0], out, crop=None, layout="HWC")
    px = np.asarray(Image.open(io.BytesIO(datas[0])).convert("RGB"))
    assert np.array_equal(out[0], px) and np.array_equal(out[1], px)   # no resize: the pixels
    for on_error in ("raise", "skip"):   # wrong arguments, not a bad image: raised either way
        with pytest.raises(FerryError, match="pass a crop or resize"):
            images.load_batch(s, [0, 1], out, crop=None, layout="HWC", on_error=on_error)
    out2 = np.zeros((2, 3, 8, 8), np.uint8)
    for crop in ("center", "resize"):
        r = images.load_batch(s, [1, 6], out2, crop=crop)
        assert r["written"] == 2


def test_corrupt_member_raise_and_skip(tmp_path, shard):
    _, datas = shard
    path = str(tmp_path / "bad.tar")
    with wds.TarWriter(path) as tw:
        tw.write({"__key__": "good0", "jpg": datas[0]})
        tw.write({"__key__": "broken", "jpg": datas[6][: len(datas[6]) * 2 // 3]})
        tw.write({"__key__": "good1", "jpg": datas[1]})
    s = images.open_shards(path)
    out = np.zeros((3, 3, 16, 16), np.uint8)
    with pytest.raises(FerryError) as e:
        images.load_batch(s, [0, 1, 2], out)
    msg = str(e.value)
    assert "bad.tar" in msg and '"broken"' in msg and '"jpg"' in msg
    before = ferry.stats()
    r = images.load_batch(s, [0, 1, 2], out, on_error="skip", seed=2)
    assert r["written"] == 2 and r["skipped"] == [1]
    assert ferry.stats()["image_skipped"] - before["image_skipped"] == 1
    full = np.zeros((3, 3, 16, 16), np.uint8)
    images.load_batch(s, [0, 2, 0], full, seed=2)
    assert np.array_equal(out[:2], full[:2])


def test_argument_errors(shard):
    path, _ = shard
    s = images.open_shards(path)
    with pytest.raises(ValueError, match="rows"):
        images.load_batch(s, [0, 1], np.zeros((3, 3, 8, 8), np.uint8))
    with pytest.raises(ValueError, match="channels"):
        images.load_batch(s, [0], np.zeros((1, 1, 8, 8), np.uint8))
    with pytest.raises(ValueError, match="size"):
        images.load_batch(s, [0], np.zeros((1, 3, 8, 8), np.uint8), size=(8, 9))
    with pytest.raises(ValueError, match="dtype"):
        images.load_batch(s, [0], np.zeros((1, 3, 8, 8), np.int32))
    with pytest.raises(ValueError, match="normalised"):
        images.load_batch(s, [0], np.zeros((1, 3, 8, 8), np.uint8), mean=(0.5,), std=(0.5,))
    with pytest.raises(FerryError, match="device destination"):
        images.load_batch(s, [0], np.zeros((1, 3, 8, 8), np.uint8), decode="gpu")
    with pytest.raises(FerryError):
        images.load_batch(s, [0], np.zeros((1, 3, 8, 8), np.uint8), member="png")   # sample 0 has none


def test_center_is_torchvision_center_crop_then_resize(shard):
    """crop="center" of a square output: torchvision.transforms.v2's CenterCrop to the image's
    shorter side, then Resize(antialias=True), on the same decoded image: within 1 (torchvision
    rounds between its two passes, ferry once; docs/images.md)."""
    torch = pytest.importorskip("torch")
    F = pytest.importorskip("torchvision.transforms.v2.functional")
    path, datas = shard
    s = images.open_shards(path)
    samples = [0, 1, 3, 6]          # 45x67, 64x40, 60x80 (odd and even margins), 200x300
    out = np.zeros((len(samples), 3, 24, 24), np.uint8)
    images.load_batch(s, samples, out, crop="center")
    for i, k in enumerate(samples):
        px = torch.from_numpy(np.asarray(Image.open(io.BytesIO(datas[k])).convert("RGB")).copy()).permute(2, 0, 1)
        m = min(px.shape[1:])
        want = F.resize(F.center_crop(px, [m, m]), [24, 24], antialias=True).numpy()
        d = np.abs(out[i].astype(int) - want.astype(int))
        assert d.max() <= 1, f"row {i}: max {d.max()}"


def test_rows_of_crops_decoded_in_part_equal_pil_whole_decode(tmp_path):
    """The CPU threads decode a JPEG only in the part its crop box needs (jpegregion.c): over many
    drawn boxes of ~300x200 images PIL wrote in every chroma sampling, progressive, with restart
    markers and gray, each row equals PIL's whole decode + the CPU transform (0 difference), for
    uint8 and float32 outputs."""
    rng = np.random.default_rng(4)
    kinds = [dict(subsampling=0), dict(subsampling=1), dict(subsampling=2), dict(subsampling=2, progressive=True),
             dict(subsampling=1, progressive=True), dict(subsampling=2, restart_marker_rows=1), dict(gray=True)]
    datas = []
    path = str(tmp_path / "big.tar")
    with wds.TarWriter(path) as tw:
        for i, kw in enumerate(kinds):
            h, w = int(rng.integers(150, 260)), int(rng.integers(200, 340))
            a = _pixels(h, w, i).astype(np.int16) + rng.integers(-40, 41, (h, w, 3))   # chroma that changes
            a = a.clip(0, 255).astype(np.uint8)
            gray = kw.pop("gray", False)
            b = io.BytesIO()
            Image.fromarray(a[:, :, 0] if gray else a).save(b, "JPEG", quality=90, **kw)
            datas.append(b.getvalue())
            tw.write({"__key__": f"b{i:03d}", "jpg": datas[-1]})
    s = images.open_shards(path)
    samples = list(range(len(kinds))) * 6
    for dtype, mean, std in (("uint8", None, None), ("float32", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))):
        for epoch in range(4):
            out = np.zeros((len(samples), 3, 40, 48), dtype)
            r = images.load_batch(s, samples, out, flip=0.5, seed=11, epoch=epoch, decode="cpu", threads=2,
                                  mean=mean, std=std)
            assert r["written"] == len(samples)
            for i, k in enumerate(samples):
                want = np.frombuffer(_expected(datas[k], k, (40, 48), 11, epoch, 0.5, "CHW", dtype, mean, std),
                                     dtype).reshape(3, 40, 48)
                assert np.array_equal(out[i], want), f"{dtype} epoch {epoch} row {i} (image {k}: {kinds[k]})"
