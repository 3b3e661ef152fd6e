"""Image sets for the image tests, written by the real writers: webdataset.TarWriter,
mosaicml-streaming's MDSWriter and PIL-saved ImageFolder trees. Images are windows cut from
scikit-image's photographs and rescaled (every one distinct), plus synthetic ones."""
import functools
import importlib.util
import io
import json
import os
import sys
import types

import numpy as np
import pytest

from PIL import Image


def photos():
    skdata = pytest.importorskip("skimage.data")
    return [skdata.astronaut(), skdata.coffee(), skdata.chelsea(), skdata.rocket(),
            np.stack([skdata.camera()] * 3, axis=-1)]


def distinct_images(n, seed=0, lo=40, hi=120):
    """n different RGB uint8 images of ragged sizes (lo..hi pixels a side): windows of the
    photographs rescaled, every fifth one synthetic (gradients with noise)."""
    rng = np.random.default_rng(seed)
    pics = photos()
    out = []
    for i in range(n):
        h, w = int(rng.integers(lo, hi)), int(rng.integers(lo, hi))
        if i % 5 == 4:
            y, x = np.mgrid[0:h, 0:w]
            a = np.stack([(x * 255 // max(1, w - 1)), (y * 255 // max(1, h - 1)), (x + y + i) % 256], -1)
            a = (a + rng.integers(0, 20, a.shape)).clip(0, 255).astype(np.uint8)
        else:
            p = pics[i % len(pics)]
            ch, cw = int(rng.integers(h, p.shape[0])), int(rng.integers(w, p.shape[1]))
            y0, x0 = int(rng.integers(0, p.shape[0] - ch + 1)), int(rng.integers(0, p.shape[1] - cw + 1))
            a = np.asarray(Image.fromarray(p[y0:y0 + ch, x0:x0 + cw]).resize((w, h), Image.BILINEAR))
        out.append(np.ascontiguousarray(a))
    return out


def jpeg(a, quality=90, **kw):
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", quality=quality, **kw)
    return b.getvalue()


def png(a):
    b = io.BytesIO()
    Image.fromarray(a).save(b, "PNG")
    return b.getvalue()


def write_wds(d, imgs, shards=3, classes=10, extras=True):
    """WebDataset tar shards (webdataset.TarWriter): sample i is key f"s{i:05d}" with .jpg (every
    seventh a .png), .cls (i % classes), and with extras .txt, .json and .npy. Samples are dealt
    to the shards in runs, so shard k holds a contiguous range of keys. Returns the paths."""
    wds = pytest.importorskip("webdataset")
    os.makedirs(d, exist_ok=True)
    paths = []
    per = -(-len(imgs) // shards)
    for k in range(shards):
        p = os.path.join(d, f"train-{k:04d}.tar")
        with wds.TarWriter(p) as w:
            for i in range(k * per, min(len(imgs), (k + 1) * per)):
                s = {"__key__": f"s{i:05d}", "cls": str(i % classes).encode()}
                if i % 7 == 6:
                    s["png"] = png(imgs[i])
                else:
                    s["jpg"] = jpeg(imgs[i])
                if extras:
                    s["txt"] = f"caption {i}".encode()
                    s["json"] = json.dumps({"i": i, "tags": ["a", str(i)]}).encode()
                    b = io.BytesIO()
                    np.save(b, np.arange(3, dtype=np.float32) + i)
                    s["npy"] = b.getvalue()
                w.write(s)
        paths.append(p)
    return paths


def write_folder(root, imgs, classes=4):
    """A torchvision ImageFolder tree saved by PIL: class c{j} holds images i with i % classes
    == j (JPEG q90, every seventh PNG). Returns {path: (image index, label)}."""
    made = {}
    for i, a in enumerate(imgs):
        c = i % classes
        d = os.path.join(root, f"c{c}")
        os.makedirs(d, exist_ok=True)
        ext = ".png" if i % 7 == 6 else ".jpg"
        p = os.path.join(d, f"img{i:05d}{ext}")
        Image.fromarray(a).save(p, "PNG" if ext == ".png" else "JPEG", quality=90)
        made[p] = (i, c)
    return made


@functools.lru_cache(maxsize=None)
def mds_writer():
    """streaming's MDSWriter. streaming/__init__ imports its data loader, which
    needs transformers (not installed: only the writer is used), so when that
    import fails the writer's own modules are loaded under bare packages."""
    try:
        from streaming import MDSWriter
        return MDSWriter
    except ImportError:
        pass
    spec = importlib.util.find_spec("streaming")
    if spec is None:
        pytest.skip("mosaicml-streaming not installed")
    root = os.path.dirname(spec.origin)
    for name, sub in (("streaming", ""), ("streaming.base", "base")):
        if name not in sys.modules or not hasattr(sys.modules[name], "__path__"):
            m = types.ModuleType(name)
            m.__path__ = [os.path.join(root, sub)]
            sys.modules[name] = m
    from streaming.base.format.mds.writer import MDSWriter
    return MDSWriter


def write_mds(d, imgs, compression=None, size_limit=1 << 16):
    """A Mosaic MDS directory (MDSWriter): columns image (jpeg), label (int: i % 10), caption
    (str), vec (ndarray float32 of 3)."""
    W = mds_writer()
    cols = {"image": "jpeg", "label": "int", "caption": "str", "vec": "ndarray:float32:3"}
    with W(out=d, columns=cols, compression=compression, size_limit=size_limit) as w:
        for i, a in enumerate(imgs):
            w.write({"image": Image.fromarray(a), "label": i % 10, "caption": f"caption {i}",
                     "vec": np.arange(3, dtype=np.float32) + i})
    return d
