"""Image shards and decoders against the real writers and the reference decoder.

Shards are written by webdataset.TarWriter, mosaicml-streaming's MDSWriter and
PIL into folders; images are scikit-image's photographs and synthetic ones
(baseline and progressive JPEG, 4:4:4 / 4:2:2 / 4:2:0, gray, CMYK, PNG with
alpha, palettes, 16 bits, 1x1), saved by PIL. Decoded pixels are compared with
PIL's decode of the same bytes (PIL decodes JPEG with libjpeg-turbo too):
the largest difference found is 0, and the tests assert exactly that.
"""
import io
import os
import tarfile

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

ferry = pytest.importorskip("ferry")
from ferry import images  # noqa: E402

skdata = pytest.importorskip("skimage.data")
from imageshards import mds_writer  # noqa: E402
FerryError = ferry.FerryError
MAX_ABS_DIFF = 0   # ferry's pixels against PIL's, every image here


def jpeg_bytes(a, **kw):
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", **kw)
    return b.getvalue()


def png_bytes(img):
    b = io.BytesIO()
    img.save(b, "PNG")
    return b.getvalue()


def pil_rgb(data, keep_gray=False):
    im = Image.open(io.BytesIO(data))
    if keep_gray and im.mode == "L":
        return np.asarray(im)[:, :, None]
    return np.asarray(im.convert("RGB"))


def photos():
    return {"astronaut": skdata.astronaut(), "coffee": skdata.coffee(), "chelsea": skdata.chelsea()}


def image_cases():
    """(name, encoded bytes) of every kind of image the decoders must take."""
    rng = np.random.default_rng(0)
    cases = []
    for name, a in photos().items():
        a = a[:200, :300]
        for sub, tag in [(0, "444"), (1, "422"), (2, "420")]:
            cases.append((f"{name}-{tag}", jpeg_bytes(a, quality=90, subsampling=sub)))
        cases.append((f"{name}-progressive", jpeg_bytes(a, quality=85, progressive=True)))
        cases.append((f"{name}-png", png_bytes(Image.fromarray(a))))
    cam = skdata.camera()[:120, :160]
    cases.append(("camera-gray", jpeg_bytes(cam, quality=90)))
    cases.append(("camera-gray-png", png_bytes(Image.fromarray(cam))))
    noise = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)   # odd sizes: partial MCUs
    cases.append(("noise-420", jpeg_bytes(noise, quality=75)))
    cases.append(("noise-progressive-444", jpeg_bytes(noise, quality=95, subsampling=0, progressive=True)))
    cases.append(("one-pixel-jpeg", jpeg_bytes(np.array([[[200, 10, 30]]], np.uint8))))
    cases.append(("one-pixel-png", png_bytes(Image.fromarray(np.array([[[1, 2, 3]]], np.uint8)))))
    cmyk = Image.fromarray(skdata.coffee()[:64, :96]).convert("CMYK")
    b = io.BytesIO()
    cmyk.save(b, "JPEG", quality=90)
    cases.append(("coffee-cmyk", b.getvalue()))
    rgba = np.dstack([noise, rng.integers(0, 256, noise.shape[:2], dtype=np.uint8)])
    cases.append(("rgba-png", png_bytes(Image.fromarray(rgba, "RGBA"))))
    cases.append(("la-png", png_bytes(Image.fromarray(cam).convert("LA"))))
    cases.append(("palette-png", png_bytes(Image.fromarray(skdata.chelsea()[:50, :70]).convert("P"))))
    return cases


CASES = image_cases()
try:
    images.probe(CASES[0][1])
    images.probe(dict(CASES)["rgba-png"])
except FerryError as e:   # a build without libturbojpeg or libspng: they refuse, by design
    pytest.skip(f"image decoders not built in: {e}", allow_module_level=True)


# ---- decoders ------------------------------------------------------------------
@pytest.mark.parametrize("name,data", CASES, ids=[c[0] for c in CASES])
def test_decode_equals_pil(name, data):
    got = images.decode(data)
    want = pil_rgb(data)
    assert got.shape == want.shape
    assert int(np.abs(got.astype(int) - want).max()) <= MAX_ABS_DIFF


def test_probe_reports_header():
    a = skdata.astronaut()[:64, :80]
    for sub, want in [(0, 444), (1, 422), (2, 420)]:
        h = images.probe(jpeg_bytes(a, subsampling=sub))
        assert (h["format"], h["width"], h["height"], h["channels"], h["subsampling"]) == ("jpeg", 80, 64, 3, want)
        assert not h["progressive"]
    assert images.probe(jpeg_bytes(a, progressive=True))["progressive"]
    g = images.probe(jpeg_bytes(skdata.camera()[:8, :8]))
    assert (g["channels"], g["subsampling"], g["out_channels"]) == (1, 400, 3)
    assert images.probe(jpeg_bytes(skdata.camera()[:8, :8]), keep_gray=True)["out_channels"] == 1
    p = images.probe(dict(CASES)["rgba-png"])
    assert (p["format"], p["channels"], p["bit_depth"], p["width"], p["height"]) == ("png", 4, 8, 53, 37)
    assert images.probe(dict(CASES)["coffee-cmyk"])["cmyk"]


def test_keep_gray_and_16_bit_png():
    cam = skdata.camera()[:40, :50]
    for data in (jpeg_bytes(cam, quality=92), png_bytes(Image.fromarray(cam))):
        got = images.decode(data, keep_gray=True)
        assert got.shape == (40, 50, 1)
        assert np.array_equal(got, pil_rgb(data, keep_gray=True))
    wide = (cam.astype(np.uint16) * 257 + np.arange(50, dtype=np.uint16)).astype(np.uint16)
    b = png_bytes(Image.fromarray(wide))
    assert Image.open(io.BytesIO(b)).mode.startswith("I;16")
    got = images.decode(b, keep_gray=True)
    assert np.array_equal(got[:, :, 0], (wide >> 8).astype(np.uint8))   # the high byte of each sample


def test_batch_on_threads_equals_one_by_one():
    datas = [d for _, d in CASES]
    outs = images.decode_batch(datas, threads=4)
    for d, o in zip(datas, outs):
        assert np.array_equal(o, pil_rgb(d))


def test_corrupt_images_raise_naming_the_image():
    good = jpeg_bytes(skdata.astronaut()[:64, :64], quality=90)
    for cut in (len(good) // 2, len(good) - 2, 300):
        with pytest.raises(FerryError) as e:
            images.decode(good[:cut])
        assert e.value.args[0] in (ferry._ferry.ECODEC,)
    png = png_bytes(Image.fromarray(skdata.astronaut()[:64, :64]))
    with pytest.raises(FerryError):
        images.decode(png[: len(png) // 2])
    bad = bytearray(png)
    bad[len(png) // 2] ^= 0x10   # inside IDAT: the CRC says so
    with pytest.raises(FerryError):
        images.decode(bytes(bad))
    with pytest.raises(FerryError) as e:
        images.decode_batch([good, good[:500]], labels=["s0/jpg", "s1/jpg"], threads=2)
    assert "s1/jpg" in str(e.value)
    with pytest.raises(FerryError) as e:
        images.decode(b"GIF89a....")
    assert e.value.args[0] == ferry._ferry.EUNSUPPORTED


def test_bit_flips_never_give_other_pixels_than_pil():
    """A flipped bit: ferry refuses, or its pixels are PIL's (JPEG has no
    checksum: a flip in entropy-coded data can decode cleanly in both)."""
    rng = np.random.default_rng(1)
    refused = same = 0
    for base in (jpeg_bytes(skdata.chelsea()[:48, :64], quality=90),
                 jpeg_bytes(skdata.chelsea()[:48, :64], quality=90, progressive=True),
                 png_bytes(Image.fromarray(skdata.chelsea()[:48, :64]))):
        for _ in range(60):
            b = bytearray(base)
            i = int(rng.integers(0, len(b)))
            b[i] ^= 1 << int(rng.integers(0, 8))
            try:
                got = images.decode(bytes(b))
            except FerryError:
                refused += 1
                continue
            try:
                want = pil_rgb(bytes(b))
            except Exception:
                continue   # ferry read what PIL's header checks refuse: nothing to compare
            assert np.array_equal(got, want), f"flip at byte {i}"
            same += 1
    assert refused > 0 and same > 0


# ---- WebDataset tar ---------------------------------------------------------------
@pytest.fixture(scope="module")
def wds_tar(tmp_path_factory):
    wds = pytest.importorskip("webdataset")
    d = tmp_path_factory.mktemp("wds")
    samples = []
    for i, (name, data) in enumerate(CASES):
        ext = "png" if data[:4] == b"\x89PNG" else "jpg"
        samples.append({"__key__": f"part/s{i:04d}", ext: data, "cls": str(i % 7).encode(), "txt": name.encode()})
    paths = []
    for k in range(2):
        p = str(d / f"shard-{k:02d}.tar")
        with wds.TarWriter(p) as w:
            for s in samples[k::2]:
                w.write(s)
        paths.append(p)
    return paths, samples


def test_tar_index_matches_webdataset(wds_tar):
    wds = pytest.importorskip("webdataset")
    paths, _ = wds_tar
    s = images.open_shards(paths)
    assert s.format == "tar" and s.nfiles == 2
    ref = []
    for p in paths:
        for x in wds.WebDataset(p, shardshuffle=False):
            ref.append(x)
    assert len(s) == len(ref)
    for i, r in enumerate(ref):
        info = s.sample(i)
        assert info["key"] == r["__key__"]
        names = {m["name"] for m in info["members"]}
        assert names == {k for k in r if not k.startswith("__")}
        for n in names:
            assert s.read(i, n) == r[n]


def test_tar_members_decode_equal_pil(wds_tar):
    paths, _ = wds_tar
    s = images.open_shards(paths[0])
    datas, labels = [], []
    for i in range(len(s)):
        info = s.sample(i)
        m = [x["name"] for x in info["members"] if x["name"] in ("jpg", "png")][0]
        datas.append(s.read(i, m))
        labels.append(f"{info['key']}.{m}")
    for d, o in zip(datas, images.decode_batch(datas, labels=labels, threads=3)):
        assert np.array_equal(o, pil_rgb(d))


def test_tar_damage_names_shard_member_and_byte(wds_tar, tmp_path):
    paths, _ = wds_tar
    raw = bytearray(open(paths[0], "rb").read())
    s = images.open_shards(paths[0])
    second = s.sample(1)
    off = second["members"][0]["offset"] - 512   # that member's header
    bad = bytearray(raw)
    bad[off + 10] ^= 0x04
    p = tmp_path / "bad.tar"
    p.write_bytes(bytes(bad))
    with pytest.raises(FerryError) as e:
        images.open_shards(str(p))
    msg = str(e.value)
    assert "bad.tar" in msg and f"byte {off}" in msg and "checksum" in msg
    p.write_bytes(bytes(raw[: off + 700]))
    with pytest.raises(FerryError) as e:
        images.open_shards(str(p))
    assert "truncated" in str(e.value) and "bad.tar" in str(e.value)
    # a truncated image inside an intact archive: the decoder names the sample
    with tarfile.open(tmp_path / "cut.tar", "w") as t:
        jpg = dict(CASES)["chelsea-420"]
        for key, data in (("a", jpg), ("b", jpg[: len(jpg) // 3])):
            ti = tarfile.TarInfo(f"{key}.jpg")
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    c = images.open_shards(str(tmp_path / "cut.tar"))
    datas = [c.read(i, "jpg") for i in range(2)]
    with pytest.raises(FerryError) as e:
        images.decode_batch(datas, labels=[f"{c.sample(i)['key']}.jpg" for i in range(2)])
    assert "b.jpg" in str(e.value)


def test_tar_pax_and_gnu_long_names(tmp_path):
    long = "d" * 120 + "/" + "k" * 100
    for fmt, tag in ((tarfile.PAX_FORMAT, "pax"), (tarfile.GNU_FORMAT, "gnu")):
        p = tmp_path / f"{tag}.tar"
        with tarfile.open(p, "w", format=fmt) as t:
            for ext, data in (("jpg", b"J" * 1000), ("Json", b"{}")):
                ti = tarfile.TarInfo(f"{long}.{ext}")
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
        s = images.open_shards(str(p))
        assert len(s) == 1
        info = s.sample(0)
        assert info["key"] == long
        assert [m["name"] for m in info["members"]] == ["jpg", "json"]
        assert s.read(0, "jpg") == b"J" * 1000


# ---- Mosaic MDS ---------------------------------------------------------------------
@pytest.fixture(scope="module", params=[None, "zstd"])
def mds_dir(request, tmp_path_factory):
    W = mds_writer()
    d = str(tmp_path_factory.mktemp("mds") / "ds")
    cols = {"img": "jpeg", "mask": "png", "label": "int", "name": "str", "raw": "bytes", "vec": "ndarray:uint8:4"}
    rows = []
    pics = photos()
    with W(out=d, columns=cols, compression=request.param, size_limit=8000) as w:
        for i in range(12):
            a = list(pics.values())[i % 3][i * 7:i * 7 + 48, :40]
            row = {"img": Image.fromarray(a), "mask": Image.fromarray(a[:, :, 0]), "label": i * 11,
                   "name": f"sample-{i}", "raw": bytes(range(i)), "vec": np.arange(4, dtype=np.uint8) + i}
            w.write(row)
            rows.append(row)
    return d, rows, request.param


def test_mds_index_and_columns(mds_dir):
    d, rows, comp = mds_dir
    s = images.open_shards(d)
    assert s.format == "mds"
    assert s.nfiles > 1   # several shards (size_limit)
    assert len(s) == len(rows)
    for i, row in enumerate(rows):
        info = s.sample(i)
        enc = {m["name"]: m["encoding"] for m in info["members"]}
        assert enc == {"img": "jpeg", "label": "int", "mask": "png", "name": "str", "raw": "bytes",
                       "vec": "ndarray:uint8:4"}
        assert all(m["compressed"] == (comp is not None) for m in info["members"])
        assert np.frombuffer(s.read(i, "label"), "<i8")[0] == row["label"]
        assert s.read(i, "name").decode() == row["name"]
        assert s.read(i, "raw") == row["raw"]
        assert np.array_equal(np.frombuffer(s.read(i, "vec"), np.uint8), row["vec"])
        jpg = s.read(i, "img")
        assert np.array_equal(images.decode(jpg), pil_rgb(jpg))
        png = s.read(i, "mask")
        assert np.array_equal(images.decode(png, keep_gray=True)[:, :, 0], np.asarray(row["mask"]))


def test_mds_load_batch(mds_dir):
    """images.load_batch over an MDS set (zstd-compressed shards too, read on 4 threads): the first
    image column by its encoding (jpeg), or a named one (png); rows equal to the CPU transform of
    PIL's decode of the same member."""
    from ferry import _ferry
    d, rows, comp = mds_dir
    s = images.open_shards(d)
    n = len(rows)
    for member in (None, "mask"):
        out = np.zeros((n, 3, 16, 16), np.uint8)
        r = images.load_batch(s, list(range(n)), out, member=member, seed=7, flip=0.5, threads=4, decode="cpu")
        assert r["written"] == n and r["skipped"] == []
        for i in range(n):
            data = s.read(i, member or "img")
            px = np.ascontiguousarray(pil_rgb(data))
            h, w = px.shape[:2]
            box = _ferry.random_resized_crop(7, 0, i, h, w, (0.08, 1.0), (3 / 4, 4 / 3))
            fl = _ferry.flip_draw(7, 0, i, 0.5)
            want = np.frombuffer(_ferry.image_transform(px.tobytes(), (h, w, 3), box, (16, 16), fl), np.uint8)
            assert np.array_equal(out[i].reshape(-1), want), (member, i)


def test_mds_damage(mds_dir, tmp_path):
    import json
    import shutil
    d, rows, comp = mds_dir
    dst = tmp_path / "copy"
    shutil.copytree(d, dst)
    index = json.loads((dst / "index.json").read_text())
    info = index["shards"][0]
    name = (info["zip_data"] or info["raw_data"])["basename"]
    data = (dst / name).read_bytes()
    (dst / name).write_bytes(data[:-5])
    with pytest.raises(FerryError) as e:
        images.open_shards(str(dst))
    assert name in str(e.value) and "index.json says" in str(e.value)
    if comp is None:
        bad = bytearray(data)
        bad[0] ^= 1   # the sample count
        (dst / name).write_bytes(bytes(bad))
        with pytest.raises(FerryError) as e:
            images.open_shards(str(dst))
        assert f"{name}: byte 0" in str(e.value)
        bad = bytearray(data)
        off = int(np.frombuffer(data[4:8], "<u4")[0])   # sample 0's size table: its first variable column
        bad[off] ^= 0x40
        (dst / name).write_bytes(bytes(bad))
        with pytest.raises(FerryError) as e:
            images.open_shards(str(dst))
        assert f"byte {off}" in str(e.value) and "sample 0" in str(e.value)
    else:
        info["compression"] = "br"
        (dst / name).write_bytes(data)
        (dst / "index.json").write_text(json.dumps(index))
        with pytest.raises(FerryError) as e:
            images.open_shards(str(dst))
        assert e.value.args[0] == ferry._ferry.EUNSUPPORTED and "br" in str(e.value)


# ---- folders --------------------------------------------------------------------------
def test_image_folder_like_torchvision(tmp_path):
    root = tmp_path / "train"
    pics = photos()
    made = {}
    for cls, sub in (("dog", ""), ("cat", ""), ("cat", "inner"), ("bird", "")):
        p = root / cls / sub
        p.mkdir(parents=True, exist_ok=True)
        for j in range(3):
            a = list(pics.values())[j][:20 + j, :30]
            ext = [".jpg", ".PNG", ".jpeg"][j]
            f = p / f"img{j}{ext}"
            Image.fromarray(a).save(f, "PNG" if ext == ".PNG" else "JPEG")
            made[str(f)] = a
        (p / "notes.txt").write_text("not an image")
    s = images.open_shards(str(root))
    assert s.format == "folder"
    assert s.classes == ["bird", "cat", "dog"]
    # torchvision's order: classes sorted, then sorted(os.walk(class_dir)), files sorted
    want = []
    for label, cls in enumerate(sorted(os.listdir(root))):
        for r, _, files in sorted(os.walk(root / cls, followlinks=True)):
            for f in sorted(files):
                if f.lower().endswith((".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")):
                    want.append((os.path.relpath(os.path.join(r, f), root), label))
    got = [(s.sample(i)["key"], s.sample(i)["label"]) for i in range(len(s))]
    assert got == want
    for i in range(len(s)):
        m = s.sample(i)["members"][0]
        data = s.read(i, 0)
        assert np.array_equal(images.decode(data), pil_rgb(data))
        assert m["name"] in ("jpg", "png", "jpeg")
    (root / "empty").mkdir()
    with pytest.raises(FerryError) as e:
        images.open_shards(str(root))
    assert "empty" in str(e.value)


def test_flat_files(tmp_path):
    paths = []
    for j, (name, data) in enumerate(CASES[:4]):
        p = tmp_path / f"f{j}.Jpg"
        p.write_bytes(data)
        paths.append(str(p))
    s = images.open_shards(str(tmp_path / "f*.Jpg"), format="files")
    assert len(s) == 4
    assert s.sample(2)["key"] == str(tmp_path / "f2")
    assert s.sample(2)["members"][0]["name"] == "jpg"
    assert s.read(3, "jpg") == CASES[3][1]
