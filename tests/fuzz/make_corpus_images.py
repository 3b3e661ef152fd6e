"""Write the seed corpus of the image-shard fuzz targets (tests/fuzz/corpus/
tar, mds, image) with the reference writers: webdataset.TarWriter and
tarfile (pax, GNU), mosaicml-streaming's MDSWriter (raw and zstd), PIL.
Run once with the project's .venv; the files are committed. Keep them small.
(make_corpus.py writes the other targets' seeds.)"""
import io
import os
import sys
import tarfile
import tempfile
import types
import importlib.util

import numpy as np
from PIL import Image

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def out(target, name):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name)


rng = np.random.default_rng(0)


def jpeg(a, **kw):
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", **kw)
    return b.getvalue()


def png(img):
    b = io.BytesIO()
    img.save(b, "PNG")
    return b.getvalue()


rgb = rng.integers(0, 256, (9, 13, 3), dtype=np.uint8)
gray = rng.integers(0, 256, (8, 8), dtype=np.uint8)

# image: the kinds the decoders take
seeds = {
    "seed-420.jpg": jpeg(rgb, quality=80),
    "seed-444.jpg": jpeg(rgb, quality=80, subsampling=0),
    "seed-422.jpg": jpeg(rgb, quality=80, subsampling=1),
    "seed-progressive.jpg": jpeg(rgb, quality=80, progressive=True),
    "seed-gray.jpg": jpeg(gray),
    "seed-rgb.png": png(Image.fromarray(rgb)),
    "seed-rgba.png": png(Image.fromarray(np.dstack([rgb, rgb[:, :, 0]]), "RGBA")),
    "seed-palette.png": png(Image.fromarray(rgb).convert("P")),
    "seed-gray16.png": png(Image.fromarray(gray.astype(np.uint16) * 257)),
}
b = io.BytesIO()
Image.fromarray(rgb).convert("CMYK").save(b, "JPEG")
seeds["seed-cmyk.jpg"] = b.getvalue()
for name, data in seeds.items():
    with open(out("image", name), "wb") as f:
        f.write(data)

# tar: webdataset's writer, then pax and GNU long names from tarfile
import webdataset as wds
with wds.TarWriter(out("tar", "seed-wds.tar")) as w:
    for i in range(3):
        w.write({"__key__": f"d/s{i}", "jpg": seeds["seed-420.jpg"][:200], "cls": str(i).encode()})
for fmt, tag in ((tarfile.PAX_FORMAT, "pax"), (tarfile.GNU_FORMAT, "gnu")):
    with tarfile.open(out("tar", f"seed-{tag}.tar"), "w", format=fmt) as t:
        for name, data in ((("x" * 110) + "/k.txt", b"hello"), ("a.b.PNG", b"\x89PNG"), ("dir", None)):
            ti = tarfile.TarInfo(name)
            if data is None:
                ti.type = tarfile.DIRTYPE
                t.addfile(ti)
            else:
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))

# mds: index.json, the separator, the shard (fuzz_mds.c splits them)
spec = importlib.util.find_spec("streaming")
sroot = os.path.dirname(spec.origin)
for name, sub in (("streaming", ""), ("streaming.base", "base")):   # the writer without streaming's loader
    m = types.ModuleType(name)
    m.__path__ = [os.path.join(sroot, sub)]
    sys.modules[name] = m
from streaming.base.format.mds.writer import MDSWriter  # noqa: E402
for comp in (None, "zstd"):
    with tempfile.TemporaryDirectory() as d:
        ds = os.path.join(d, "ds")
        with MDSWriter(out=ds, columns={"img": "jpeg", "label": "int", "name": "str", "v": "ndarray:uint8:3"},
                       compression=comp) as w:
            for i in range(3):
                w.write({"img": Image.fromarray(rgb), "label": i, "name": f"n{i}", "v": np.arange(3, dtype=np.uint8)})
        files = sorted(os.listdir(ds))
        shard = [f for f in files if f.startswith("shard.")][0]
        with open(os.path.join(ds, "index.json"), "rb") as f:
            index = f.read()
        with open(os.path.join(ds, shard), "rb") as f:
            data = f.read()
        with open(out("mds", f"seed-{comp or 'raw'}"), "wb") as f:
            f.write(index + b"\n--shard--\n" + data)

total = sum(os.path.getsize(os.path.join(root, t, f)) for t in ("image", "tar", "mds")
            for f in os.listdir(os.path.join(root, t)))
print(f"image-shard corpus: {total} bytes")

# imagebatch: WebDataset tars of the image seeds (one truncated, one bit-flipped)
with wds.TarWriter(out("imagebatch", "seed-mixed.tar")) as w:
    for i, name in enumerate(["seed-420.jpg", "seed-rgba.png", "seed-gray.jpg", "seed-progressive.jpg",
                              "seed-cmyk.jpg", "seed-palette.png"]):
        w.write({"__key__": f"s{i}", name.rsplit(".", 1)[1]: seeds[name]})
    cut = seeds["seed-444.jpg"]
    w.write({"__key__": "cut", "jpg": cut[: len(cut) * 2 // 3]})
    flipped = bytearray(seeds["seed-422.jpg"])
    for k in range(len(flipped) // 2, len(flipped) // 2 + 8):
        flipped[k] ^= 0x5A
    w.write({"__key__": "flipped", "jpg": bytes(flipped)})
