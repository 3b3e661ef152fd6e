"""ferry.images.load_batch (read, decode, transform a batch into a caller's array) against
torchvision.transforms.v2 on the same decoded images, within the bounds test_imagexform.py
states: uint8 crop-and-resize within 1 (torchvision rounds between its two passes), flips
exact, normalised floats within 1/255/std. Shards written by webdataset.TarWriter and PIL."""
import io
import tarfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = pytest.importorskip("torchvision.transforms.v2.functional")
from PIL import Image  # noqa: E402

import ferry  # noqa: E402
from ferry import _ferry, images  # noqa: E402
from imageshards import distinct_images, jpeg, write_wds  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def wds(tmp_path_factory):
    imgs = distinct_images(40, seed=3)
    paths = write_wds(str(tmp_path_factory.mktemp("wds")), imgs, shards=2)
    return images.open_shards(paths), imgs


def pil_chw(shards, i):
    info = shards.sample(i)
    m = [x["name"] for x in info["members"] if x["name"] in ("jpg", "png")][0]
    a = np.asarray(Image.open(io.BytesIO(shards.read(i, m))).convert("RGB"))
    return torch.from_numpy(a.copy()).permute(2, 0, 1)


def tv_sample(shards, i, size, seed, epoch, flip, crop="random_resized"):
    t = pil_chw(shards, i)
    h, w = t.shape[1:]
    if crop == "random_resized":
        y, x, ch, cw = _ferry.random_resized_crop(seed, epoch, i, h, w, (0.08, 1.0), (3 / 4, 4 / 3))
        t = F.resized_crop(t, y, x, ch, cw, list(size), antialias=True)
    elif crop == "resize":
        t = F.resize(t, list(size), antialias=True)
    if flip and _ferry.flip_draw(seed, epoch, i, flip):
        t = F.horizontal_flip(t)
    return t


def test_random_resized_crop_and_flip_within_one_of_torchvision(wds):
    s, _ = wds
    ids = [5, 0, 17, 33, 6, 13, 39, 2]        # 6 and 13 are PNGs
    out = torch.empty(len(ids), 3, 96, 80, dtype=torch.uint8)
    r = images.load_batch(s, ids, out, flip=0.5, seed=7, epoch=2)
    assert {k: r[k] for k in ("written", "skipped", "gpu", "cpu")} == \
        {"written": len(ids), "skipped": [], "gpu": 0, "cpu": len(ids)}
    assert not any(r["fallbacks"].values())
    diffs = []
    for k, i in enumerate(ids):
        want = tv_sample(s, i, (96, 80), 7, 2, 0.5).int()
        d = (out[k].int() - want).abs()
        assert int(d.max()) <= 1, i
        diffs.append(float((d > 0).float().mean()))
    assert np.mean(diffs) < 0.25
    # reproducible from (seed, epoch, sample): the same ids in another order give the same rows
    again = torch.empty_like(out)
    images.load_batch(s, ids[::-1], again, flip=0.5, seed=7, epoch=2)
    assert torch.equal(again.flip(0), out)
    other = torch.empty_like(out)
    images.load_batch(s, ids, other, flip=0.5, seed=7, epoch=3)
    assert not torch.equal(other, out)


def test_float_outputs_normalised_like_torchvision(wds):
    s, _ = wds
    ids = list(range(8))
    u8 = torch.empty(8, 3, 64, 64, dtype=torch.uint8)
    images.load_batch(s, ids, u8, crop="resize", seed=1)
    f32 = torch.empty(8, 3, 64, 64, dtype=torch.float32)
    images.load_batch(s, ids, f32, crop="resize", mean=MEAN, std=STD, seed=1)
    ref = F.normalize(u8.float() / 255, MEAN, STD)
    torch.testing.assert_close(f32, ref, rtol=0, atol=2e-6)
    for k, i in enumerate(ids):
        tv = F.normalize(F.to_dtype(tv_sample(s, i, (64, 64), 1, 0, 0, "resize"), torch.float32, scale=True),
                         MEAN, STD)
        assert float((f32[k] - tv).abs().max()) <= 1 / 255 / min(STD) + 1e-6
    plain = torch.empty_like(f32)
    images.load_batch(s, ids, plain, crop="resize", seed=1)      # floats without mean/std: v / 255
    torch.testing.assert_close(plain, u8.float() / 255, rtol=0, atol=1e-7)
    for dt in (torch.float16, torch.bfloat16):
        t = torch.empty(8, 3, 64, 64, dtype=dt)
        images.load_batch(s, ids, t, crop="resize", mean=MEAN, std=STD, seed=1)
        torch.testing.assert_close(t.float(), f32, rtol=1e-2, atol=1e-2)
    hwc = torch.empty(8, 64, 64, 3, dtype=torch.float32)
    images.load_batch(s, ids, hwc, crop="resize", mean=MEAN, std=STD, seed=1, layout="HWC")
    assert torch.equal(hwc, f32.permute(0, 2, 3, 1))
    arr = np.empty((8, 3, 64, 64), np.float32)                       # numpy out
    images.load_batch(s, ids, arr, crop="resize", mean=MEAN, std=STD, seed=1)
    assert np.array_equal(arr, f32.numpy())


def test_center_crop_equals_torchvision(wds):
    s, imgs = wds
    ids = [i for i, a in enumerate(imgs) if min(a.shape[:2]) >= 48][:6]
    out = torch.empty(len(ids), 3, 48, 48, dtype=torch.uint8)
    images.load_batch(s, ids, out, crop="center")
    for k, i in enumerate(ids):     # the largest centred square, resized: CenterCrop(short side) + Resize
        img = pil_chw(s, i)
        m = min(img.shape[1:])
        ref = F.resize(F.center_crop(img, [m, m]), [48, 48], antialias=True)
        assert (out[k].int() - ref.int()).abs().max() <= 1


def test_ragged_without_crop_is_an_error_that_says_so(wds):
    s, imgs = wds
    out = torch.empty(2, 3, 64, 64, dtype=torch.uint8)
    with pytest.raises(ferry.FerryError, match="without a crop or resize every image must be the output's size"):
        images.load_batch(s, [0, 1], out, crop=None)
    h, w = imgs[0].shape[:2]
    same = torch.empty(1, 3, h, w, dtype=torch.uint8)
    images.load_batch(s, [0], same, crop=None)
    assert torch.equal(same[0], pil_chw(s, 0))


def test_arguments_refused_by_name(wds):
    s, _ = wds
    out = torch.empty(2, 3, 32, 32, dtype=torch.uint8)
    with pytest.raises(ValueError, match="out has 2 rows for 3 samples"):
        images.load_batch(s, [0, 1, 2], out)
    with pytest.raises(ValueError, match="size"):
        images.load_batch(s, [0, 1], out, size=224)
    with pytest.raises(ValueError, match="uint8"):
        images.load_batch(s, [0, 1], out, mean=MEAN, std=STD)
    with pytest.raises(TypeError, match="int32"):
        images.load_batch(s, [0, 1], torch.empty(2, 3, 32, 32, dtype=torch.int32))
    with pytest.raises(ValueError, match="4 channels in layout CHW; images are written as 3"):
        images.load_batch(s, [0, 1], torch.empty(2, 4, 32, 32, dtype=torch.uint8))
    with pytest.raises(ferry.FerryError, match="decode=gpu needs a device destination"):
        images.load_batch(s, [0, 1], out, decode="gpu")
    with pytest.raises(ferry.FerryError, match='no member "webp"'):
        images.load_batch(s, [0, 1], out, member="webp")


def test_damaged_images_raise_by_name_or_are_skipped(tmp_path):
    imgs = distinct_images(6, seed=5)
    good = [jpeg(a) for a in imgs]
    cut = good[2][: len(good[2]) // 2]                 # truncated
    flipped = bytearray(good[4])
    flipped[len(flipped) // 3:len(flipped) // 3 + 40] = b"\xff" * 40   # a run of markers in the scan
    datas = good[:2] + [cut, good[3], bytes(flipped), good[5]]
    with tarfile.open(tmp_path / "d.tar", "w") as t:
        for i, d in enumerate(datas):
            ti = tarfile.TarInfo(f"k{i}.jpg")
            ti.size = len(d)
            t.addfile(ti, io.BytesIO(d))
    s = images.open_shards(str(tmp_path / "d.tar"))
    out = torch.zeros(6, 3, 32, 32, dtype=torch.uint8)
    with pytest.raises(ferry.FerryError) as e:
        images.load_batch(s, range(6), out, crop="resize")
    assert "d.tar" in str(e.value) and '"k2"' in str(e.value) and "jpg" in str(e.value)
    r = images.load_batch(s, range(6), out, crop="resize", on_error="skip")
    assert r["skipped"] == [2, 4] and r["written"] == 4
    ref = torch.empty(4, 3, 32, 32, dtype=torch.uint8)
    images.load_batch(s, [0, 1, 3, 5], ref, crop="resize")
    assert torch.equal(out[:4], ref)


def test_an_empty_batch_writes_nothing(wds):
    """No samples: nothing to read, whatever out is (an empty tensor's data pointer is 0)."""
    s, _ = wds
    r = images.load_batch(s, [], torch.empty(0, 3, 16, 16, dtype=torch.uint8), crop="resize")
    assert r["written"] == 0 and r["skipped"] == []
