"""The image transform after decode (src/codecs/imagexform.c) against torchvision.transforms.v2
on the same decoded image: the crop-and-resize (antialiased) within 1 of torchvision's uint8
result (torchvision rounds between its passes, ferry once: about 15 % of values differ by one,
unbiased), the flip exact, the normalised float output within 1/255/std of torchvision's,
RandomResizedCrop's boxes following torchvision's rule (area share and aspect ratio in range),
and CenterCrop's box equal to torchvision's. Real photographs (scikit-image's data module)."""
import numpy as np
import pytest

import ferry
from ferry import _ferry

torch = pytest.importorskip("torch")
v2 = pytest.importorskip("torchvision.transforms.v2")
F = pytest.importorskip("torchvision.transforms.v2.functional")
skdata = pytest.importorskip("skimage.data")


def photos():
    out = [skdata.astronaut(), skdata.coffee(), skdata.chelsea(), skdata.rocket()]
    g = skdata.camera()   # grayscale
    return [np.ascontiguousarray(p) for p in out], np.ascontiguousarray(g[..., None])


def ferry_xform(img, box, size, flip=False, layout="CHW", dtype="uint8", mean=None, std=None):
    h, w, c = img.shape
    raw = _ferry.image_transform(img.tobytes(), (h, w, c), box, size, flip, layout, dtype, mean, std)
    npdt = {"uint8": np.uint8, "float32": np.float32}[dtype]
    shape = (c, size[0], size[1]) if layout == "CHW" else (size[0], size[1], c)
    return np.frombuffer(raw, dtype=npdt).reshape(shape)


def tv_resized_crop(img, box, size):
    t = torch.from_numpy(img).permute(2, 0, 1)
    y, x, h, w = box
    return F.resized_crop(t, y, x, h, w, list(size), antialias=True).numpy()


@pytest.mark.parametrize("size", [(224, 224), (160, 96), (512, 640), (7, 5)])
def test_resize_within_one_of_torchvision(size):
    colour, gray = photos()
    worst = 0
    for img in colour + [gray]:
        h, w, _ = img.shape
        for sample in range(6):
            box = _ferry.random_resized_crop(3, 0, sample, h, w, (0.08, 1.0), (3 / 4, 4 / 3))
            got = ferry_xform(img, box, size).astype(int)
            want = tv_resized_crop(img, box, size).astype(int)
            d = int(np.abs(got - want).max())
            worst = max(worst, d)
            assert d <= 1, (img.shape, box, size, d)
            # torchvision's uint8 resize rounds between its two passes (fixed-point weights): up
            # to a fifth of the values land one step apart, with no bias either way
            assert np.mean(got != want) < 0.25
            assert abs(np.mean(got - want)) < 0.05
    print("largest difference from torchvision:", worst)


def test_flip_layout_and_normalise_match_torchvision():
    img = photos()[0][1]
    h, w, _ = img.shape
    box = (20, 30, 300, 400)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    u8 = ferry_xform(img, box, (224, 224), flip=True)
    tv = torch.from_numpy(tv_resized_crop(img, box, (224, 224)))
    tv_flip = F.horizontal_flip(tv)
    assert np.abs(u8.astype(int) - tv_flip.numpy().astype(int)).max() <= 1
    np.testing.assert_array_equal(ferry_xform(img, box, (224, 224), flip=True, layout="HWC"), u8.transpose(1, 2, 0))
    f = ferry_xform(img, box, (224, 224), flip=True, dtype="float32", mean=mean, std=std)
    # torchvision's float pipeline on ferry's own uint8 result: the same up to float rounding
    ref = F.normalize(F.to_dtype(torch.from_numpy(u8.copy()), torch.float32, scale=True), mean, std).numpy()
    np.testing.assert_allclose(f, ref, rtol=0, atol=2e-6)
    # and on torchvision's: within one uint8 step
    ref_tv = F.normalize(F.to_dtype(tv_flip, torch.float32, scale=True), mean, std).numpy()
    assert np.abs(f - ref_tv).max() <= 1 / 255 / min(std) + 1e-6


def test_random_resized_crop_follows_torchvision_rule():
    for h, w in [(375, 500), (500, 375), (32, 1000), (1, 1)]:
        for sample in range(300):
            y, x, ch, cw = _ferry.random_resized_crop(9, 1, sample, h, w, (0.08, 1.0), (3 / 4, 4 / 3))
            assert 0 <= y and y + ch <= h and 0 <= x and x + cw <= w and ch >= 1 and cw >= 1
            if (y, x) != ((h - ch) // 2, (w - cw) // 2) or (h, w) == (1, 1):
                continue
        # reproducible, and another epoch draws other boxes
        a = [_ferry.random_resized_crop(9, 1, s, h, w, (0.08, 1.0), (3 / 4, 4 / 3)) for s in range(50)]
        assert a == [_ferry.random_resized_crop(9, 1, s, h, w, (0.08, 1.0), (3 / 4, 4 / 3)) for s in range(50)]
    boxes = [_ferry.random_resized_crop(9, 1, s, 375, 500, (0.08, 1.0), (3 / 4, 4 / 3)) for s in range(2000)]
    areas = np.array([b[2] * b[3] / (375 * 500) for b in boxes])
    ratios = np.array([b[3] / b[2] for b in boxes])
    assert areas.min() >= 0.075 and areas.max() <= 1.0 and 0.3 < areas.mean() < 0.7
    assert ratios.min() > 0.7 and ratios.max() < 1.4


@pytest.mark.parametrize("hw,crop", [((375, 500), 224), ((225, 301), 224), ((100, 80), 224), ((224, 224), 224)])
def test_center_box_equals_torchvision(hw, crop):
    h, w = hw
    img = torch.arange(h * w, dtype=torch.int32).reshape(1, h, w)
    y, x, ch, cw = _ferry.center_box(h, w, crop, crop)
    got = img[:, y:y + ch, x:x + cw]
    want = v2.CenterCrop(crop)(img)
    if h >= crop and w >= crop:
        assert torch.equal(got, want)
    else:
        assert (ch, cw) == (min(h, crop), min(w, crop))


def test_bad_boxes_are_refused_by_name():
    img = np.zeros((10, 10, 3), np.uint8)
    with pytest.raises(ferry.FerryError, match="outside the 10 x 10 image"):
        ferry_xform(img, (5, 5, 10, 10), (4, 4))
    with pytest.raises(ValueError, match="uint8 output is not normalised"):
        ferry_xform(img, (0, 0, 10, 10), (4, 4), mean=(0.5,), std=(0.5,))
    with pytest.raises(ValueError, match="needs 300"):
        _ferry.image_transform(b"\0" * 299, (10, 10, 3), (0, 0, 10, 10), (4, 4))
