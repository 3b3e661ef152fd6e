"""Image shards over URLs: WebDataset tar shards (webdataset.TarWriter), Mosaic MDS
directories (streaming's MDSWriter, raw and zstd-compressed), ImageFolder trees and
lists of image files, uploaded to moto's S3 server (boto3) or served by nginx, read by
ferry.torch.ImageDataset and ferry.images: batches equal those of the same dataset over
the local copies (order, pixels, labels, keys), every sample once an epoch, an object
replaced after indexing an error naming it, a damaged remote tar an error naming the
URL, the member and the byte."""
import os
import tarfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ferry = pytest.importorskip("ferry")
pytest.importorskip("PIL")
from ferry import FerryError, images  # noqa: E402
from ferry._remote import remote_context  # noqa: E402
from ferry.torch import ImageDataset  # noqa: E402
from imageshards import distinct_images, write_folder, write_mds, write_wds  # noqa: E402
from rangeserver import ferry_reads_urls  # noqa: E402
from remote_servers import nginx, s3  # noqa: E402,F401  (fixtures)

pytestmark = pytest.mark.skipif(not ferry_reads_urls(), reason="ferry was built without libcurl (no remote objects)")

KW = dict(batch_size=7, size=32, crop="random_resized", flip=0.5, shuffle=True, seed=3, device="cpu")


@pytest.fixture(scope="module")
def imgs():
    return distinct_images(40, seed=5)


def batches(ds):
    out = []
    for b in ds:
        out.append({k: (v.clone() if isinstance(v, torch.Tensor) else list(v) if isinstance(v, list) else v)
                    for k, v in b.items()})
    return out


def assert_same(got, want, key_of=lambda k: k):
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        assert [key_of(k) for k in g["key"]] == [key_of(k) for k in w["key"]]
        for k in w:
            if isinstance(w[k], torch.Tensor):
                assert torch.equal(g[k], w[k]), k
            elif k != "key":
                assert g[k] == w[k], k


def epoch_keys(ds):
    return sorted(k for b in ds for k in b["key"])


def test_tar_shards_over_an_s3_glob_and_braces_equal_local(s3, imgs, tmp_path):
    paths = write_wds(str(tmp_path / "wds"), imgs, shards=4)
    s3.upload(tmp_path / "wds", "wds")
    s3.put("wds/README.txt", b"not a shard")
    s3.lock()
    ctx = remote_context(s3.options)
    local = batches(ImageDataset(str(tmp_path / "wds" / "train-*.tar"), members=("txt",), **KW))
    for source in ("s3://data/wds/train-*.tar", "s3://data/wds/train-{0000..0003}.tar",
                   [f"s3://data/wds/{os.path.basename(p)}" for p in paths]):
        ds = ImageDataset(source, members=("txt",), ctx=ctx, **KW)
        assert ds.format == "tar" and ds.num_samples == len(imgs)
        assert_same(batches(ds), local)
        keys = epoch_keys(ds)                       # a second epoch: every sample once
        assert keys == sorted(f"s{i:05d}" for i in range(len(imgs)))


def test_the_c_library_expands_url_globs_and_reads_members(s3, imgs, tmp_path):
    write_wds(str(tmp_path / "wds"), imgs, shards=3)
    s3.upload(tmp_path / "wds", "w")
    s3.lock()
    ctx = remote_context(s3.options)
    remote = images.open_shards("s3://data/w/*.tar", ctx=ctx)
    local = images.open_shards(sorted(str(p) for p in (tmp_path / "wds").glob("*.tar")))
    assert remote.format == "tar" and len(remote) == len(local) == len(imgs)
    for i in range(0, len(imgs), 3):
        r, w = remote.sample(i), local.sample(i)
        assert r["key"] == w["key"]
        for m in w["members"]:
            assert remote.read(i, m["name"]) == local.read(i, m["name"]), (i, m["name"])
    with pytest.raises(FerryError, match="no object matches"):
        images.open_shards("s3://data/w/none-*.tar", ctx=ctx)


def test_tar_index_reads_headers_in_few_large_ranges(imgs, tmp_path, monkeypatch):
    from rangeserver import RangeServer
    paths = write_wds(str(tmp_path / "wds"), imgs * 4, shards=1)    # 160 samples of 5 members
    data = open(paths[0], "rb").read()
    srv = RangeServer().start()
    try:
        url = srv.put("one.tar", data)
        s = images.open_shards(url)
        assert len(s) == 160
        gets = srv.gets()
        assert len(gets) <= 1 + -(-len(data) // (8 << 20)) * 8, gets   # the open, then 8 MiB windows
        assert s.read(5, "txt") == b"caption 5"
    finally:
        srv.stop()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_mds_directory_url_equals_local(s3, imgs, tmp_path, compression):
    d = write_mds(str(tmp_path / "mds"), imgs, compression=compression, size_limit=1 << 15)
    s3.upload(d, "mds")
    s3.lock()
    ctx = remote_context(s3.options)
    kw = dict(KW, members=("caption", "vec"))
    want = batches(ImageDataset(d, **kw))
    for url in ("s3://data/mds", "s3://data/mds/"):
        ds = ImageDataset(url, ctx=ctx, **kw)
        assert ds.format == "mds" and ds.num_samples == len(imgs)
        got = batches(ds)
        assert_same(got, want)
        assert "label" in got[0]
    # shards are indexed side by side: the first missing one in index.json's order is named
    names = sorted(n for n in os.listdir(d) if n.startswith("shard."))
    assert len(names) >= 3
    w = s3.user_client()
    for n in (names[1], names[2]):
        w.delete_object(Bucket="data", Key=f"mds/{n}")
    with pytest.raises(FerryError) as ei:
        images.open_shards("s3://data/mds", ctx=ctx)
    assert f"s3://data/mds/{names[1]}" in str(ei.value) and "shards[1] of s3://data/mds/index.json" in str(ei.value)


def test_image_folder_at_an_s3_prefix_equals_local(s3, imgs, tmp_path):
    write_folder(str(tmp_path / "folder"), imgs, classes=3)
    os.makedirs(tmp_path / "folder" / "c1" / "deeper")
    os.makedirs(tmp_path / "folder" / "c1" / "deeper-x")     # "deeper" < "deeper-x" < "deeper/..." locally
    os.makedirs(tmp_path / "folder" / "c1" / "deeper" / "sub")
    for sub in ("deeper-x/a.png", "deeper/sub/b.jpg"):
        (tmp_path / "folder" / "c1" / sub).write_bytes((tmp_path / "folder" / "c0" / "img00000.jpg").read_bytes())
    np.save(tmp_path / "folder" / "c1" / "not-an-image.npy", np.zeros(2))
    (tmp_path / "folder" / "c1" / "deeper" / "zz.jpg").write_bytes(
        (tmp_path / "folder" / "c0" / "img00000.jpg").read_bytes())   # os.walk order: after c1's own files
    s3.upload(tmp_path / "folder", "train")
    s3.lock()
    ctx = remote_context(s3.options)
    want_ds = ImageDataset(str(tmp_path / "folder"), **KW)
    ds = ImageDataset("s3://data/train/", ctx=ctx, **KW)
    assert ds.format == "folder" and ds.classes == want_ds.classes == ["c0", "c1", "c2"]
    assert ds.num_samples == want_ds.num_samples == len(imgs) + 3
    assert_same(batches(ds), batches(want_ds))
    s = images.open_shards("s3://data/train", ctx=ctx)
    loc = images.open_shards(str(tmp_path / "folder"))
    assert [s.sample(i)["key"] for i in range(len(s))] == [loc.sample(i)["key"] for i in range(len(loc))]


def test_files_over_https_equal_local(nginx, imgs, tmp_path):
    www, base = nginx
    made = write_folder(str(www / "imgs"), imgs[:12], classes=1)
    names = sorted(os.path.relpath(p, www) for p in made)
    urls = [f"{base}/{n}" for n in names]
    kw = dict(KW, shuffle=False)
    got = batches(ImageDataset(urls, format="files", **kw))
    want = batches(ImageDataset([str(www / n) for n in names], format="files", **kw))
    assert_same(got, want, key_of=lambda k: k.rsplit("/", 1)[1])
    # a tar shard at a web server's URL, format detected from its name
    paths = write_wds(str(www / "wds"), imgs[:10], shards=1)
    got = batches(ImageDataset(f"{base}/wds/{os.path.basename(paths[0])}", **kw))
    assert_same(got, batches(ImageDataset(paths[0], **kw)))
    # a presigned-style URL: the query is not part of the name the format is told by
    got = batches(ImageDataset(f"{base}/wds/{os.path.basename(paths[0])}?X-Signature=abc", **kw))
    assert_same(got, batches(ImageDataset(paths[0], **kw)))


def test_tar_replaced_after_indexing_is_an_error_naming_it(s3, imgs, tmp_path):
    paths = write_wds(str(tmp_path / "wds"), imgs, shards=2)
    s3.upload(tmp_path / "wds", "r")
    s3.lock()
    ctx = remote_context(s3.options)
    ds = ImageDataset("s3://data/r/*.tar", ctx=ctx, **dict(KW, shuffle=False))
    first = batches(ds)
    assert len(first) > 0
    # the second shard rewritten (other images, other offsets) between epochs
    write_wds(str(tmp_path / "new"), distinct_images(40, seed=9), shards=2)
    url = "s3://data/r/" + os.path.basename(paths[1])
    writer = s3.user_client()
    writer.upload_file(str(tmp_path / "new" / os.path.basename(paths[1])), "data", "r/" + os.path.basename(paths[1]))
    with pytest.raises(FerryError) as ei:
        batches(ds)
    msg = str(ei.value)
    assert url in msg and "changed since it was opened" in msg, msg
    # the C set: the same, member by member
    s = images.open_shards("s3://data/r/*.tar", ctx=ctx)
    s.read(0, "jpg")
    writer.upload_file(str(tmp_path / "new" / os.path.basename(paths[0])), "data", "r/" + os.path.basename(paths[0]))
    last = max(i for i in range(len(s)) if s.sample(i)["members"][0]["path"].endswith(paths[0][-14:]))
    m = next(m for m in s.sample(last)["members"] if m["name"] in ("jpg", "png"))
    assert m["offset"] > 65536      # past the first bytes the open fetched (those are of the version indexed)
    with pytest.raises(FerryError) as ei:
        s.read(last, m["name"])
    assert "s3://data/r/" + os.path.basename(paths[0]) in str(ei.value) and "changed" in str(ei.value)


def test_image_file_replaced_by_another_size_is_an_error(nginx, imgs, tmp_path):
    www, base = nginx
    made = write_folder(str(www / "imgs"), imgs[:4], classes=1)
    p = sorted(made)[2]
    url = f"{base}/{os.path.relpath(p, www)}"
    s = images.open_shards([f"{base}/{os.path.relpath(q, www)}" for q in sorted(made)], format="files")
    with open(p, "ab") as f:
        f.write(b"\0" * 100)
    with pytest.raises(FerryError) as ei:
        s.read(2, s.sample(2)["members"][0]["name"])
    assert url in str(ei.value) and "when the set was opened" in str(ei.value), str(ei.value)


def test_damaged_remote_tar_names_url_member_and_byte(s3, imgs, tmp_path):
    paths = write_wds(str(tmp_path / "wds"), imgs[:10], shards=1)
    data = bytearray(open(paths[0], "rb").read())
    with tarfile.open(paths[0]) as t:
        members = t.getmembers()
    victim = members[7]
    at = victim.offset_data - 512          # its own header (after any pax header of its own)
    data[at + 148:at + 156] = b"0000000\0"     # the checksum
    s3.put("bad/one.tar", bytes(data))
    s3.lock()
    ctx = remote_context(s3.options)
    with pytest.raises(FerryError) as ei:
        ImageDataset("s3://data/bad/one.tar", ctx=ctx, **KW)
    msg = str(ei.value)
    assert "s3://data/bad/one.tar" in msg and f"byte {at}:" in msg and victim.name in msg, msg
    # a damaged image inside an intact archive: named by URL, key and member when decoded
    jpg = next(m for m in members if m.name.endswith(".jpg"))
    data = bytearray(open(paths[0], "rb").read())
    data[jpg.offset_data + 200:jpg.offset_data + jpg.size] = b"\0" * (jpg.size - 200)
    s3.user_client().put_object(Bucket="data", Key="bad/two.tar", Body=bytes(data))
    with pytest.raises(FerryError) as ei:
        batches(ImageDataset("s3://data/bad/two.tar", ctx=ctx, **dict(KW, shuffle=False)))
    msg = str(ei.value)
    assert "s3://data/bad/two.tar" in msg and jpg.name.split(".")[0] in msg, msg


def test_missing_and_unlistable_urls_are_named(s3, nginx, tmp_path):
    www, base = nginx
    ctx = remote_context(s3.options)
    with pytest.raises((FerryError, FileNotFoundError)) as ei:
        ImageDataset("s3://data/none/x.tar", ctx=ctx, **KW)
    assert "s3://data/none/x.tar" in str(ei.value)
    (www / "dir").mkdir()
    with pytest.raises(FerryError) as ei:
        images.open_shards(f"{base}/dir/", format="folder")
    assert f"{base}/dir/" in str(ei.value) and "listed" in str(ei.value)
    with pytest.raises(FerryError) as ei:      # told from the URL: a directory, no index.json
        images.open_shards(f"{base}/dir/")
    assert f"{base}/dir/" in str(ei.value) and "index.json" in str(ei.value)


def test_load_batch_over_urls_equals_local(s3, imgs, tmp_path):
    write_wds(str(tmp_path / "wds"), imgs[:14], shards=2)
    s3.upload(tmp_path / "wds", "lb")
    s3.lock()
    ctx = remote_context(s3.options)
    r = images.open_shards("s3://data/lb/*.tar", ctx=ctx)
    w = images.open_shards(sorted(str(p) for p in (tmp_path / "wds").glob("*.tar")))
    ids = np.array([13, 0, 7, 3], dtype=np.int64)
    a = torch.empty((4, 3, 24, 24), dtype=torch.uint8)
    b = torch.empty_like(a)
    images.load_batch(r, ids, a, size=24, crop="center")
    images.load_batch(w, ids, b, size=24, crop="center")
    assert torch.equal(a, b) and int(a.float().std()) > 0


def test_brace_ranges_are_bounded():
    """webdataset's {a..b} shard ranges expand as written; one naming millions of shards (a
    typo) is refused before a list is built."""
    from ferry.torch.images import _braces
    assert _braces("s-{08..10}.tar") == ["s-08.tar", "s-09.tar", "s-10.tar"]
    assert _braces("{a,b}/x-{1..2}") == ["a/x-1", "a/x-2", "b/x-1", "b/x-2"]
    with pytest.raises(ValueError, match="give a glob or a list"):
        _braces("s-{000000..999999999}.tar")
