"""Where ferry.checkpoint writes: URLs never become local paths (issue 15 item 3), the bytes
API (item 17), sizes as Hugging Face reads them, and save's edge cases, decided and checked
before anything is written (issue 16 item 11)."""
import os

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from ferry import checkpoint as ck  # noqa: E402
from ferry.checkpoint import FerryError  # noqa: E402

SD = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(5, dtype=torch.int32)}


def _eq(a, b):
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_s3_url_never_becomes_a_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import sys
    monkeypatch.setitem(sys.modules, "fsspec", None)        # as if fsspec were missing
    # s3:// and gs:// are the C library's (no fsspec): here to a port nothing listens on
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    monkeypatch.setenv("FERRY_REMOTE_RETRIES", "0")
    with pytest.raises(FerryError, match="s3://bucket/x.safetensors"):
        ck.save(SD, "s3://bucket/x.safetensors")
    with pytest.raises(FerryError, match="s3://bucket/x.safetensors"):
        ck.load("s3://bucket/x.safetensors")
    with pytest.raises(FerryError, match="gs://b/x.safetensors"):
        ck.async_save(SD, "gs://b/x.safetensors").result(timeout=60)
    # other schemes go through fsspec, and say so when it is missing
    with pytest.raises(FerryError, match="memory://b/x.safetensors: a URL.*fsspec"):
        ck.save(SD, "memory://b/x.safetensors")
    with pytest.raises(FerryError, match="fsspec"):
        ck.load("memory://b/x.safetensors")
    with pytest.raises(FerryError, match="fsspec"):
        ck.async_save(SD, "memory://b/x.safetensors")
    assert os.listdir(tmp_path) == []


def test_unknown_protocol_refused(tmp_path, monkeypatch):
    pytest.importorskip("fsspec")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FerryError, match="nosuchproto://"):
        ck.save(SD, "nosuchproto://x/y.safetensors")
    assert os.listdir(tmp_path) == []


def test_fsspec_memory_filesystem(tmp_path, monkeypatch):
    fsspec = pytest.importorskip("fsspec")
    monkeypatch.chdir(tmp_path)
    url = "memory://ckpts/step1.safetensors"
    sd = {"model": SD, "step": 1}
    ck.save(sd, url, crc32c=True)
    assert os.listdir(tmp_path) == []                       # nothing local
    raw = fsspec.open(url, "rb").open().read()
    assert _eq(safetensors_torch.load(raw), {"model.w": SD["w"], "model.b": SD["b"]})
    got = ck.load(url)
    assert got["step"] == 1 and _eq(got["model"], SD)
    with ck.safe_open(url) as f:
        assert torch.equal(f.get_slice("model.w")[1:, 2], SD["w"][1:, 2])
    ck.async_save({"x": torch.zeros(3)}, "memory://ckpts/a.safetensors").result(timeout=60)
    assert torch.equal(ck.load("memory://ckpts/a.safetensors")["x"], torch.zeros(3))
    with pytest.raises(FerryError, match="no such file"):
        ck.load("memory://ckpts/missing.safetensors")
    with pytest.raises(FerryError, match="local paths"):
        ck.save(SD, "memory://ckpts/s.safetensors", max_shard_size=10)


def test_file_url(tmp_path):
    p = tmp_path / "f.safetensors"
    ck.save(SD, "file://" + str(p))
    assert _eq(ck.load(p), SD)
    assert _eq(ck.load("file://" + str(p)), SD)
    with pytest.raises(FerryError, match="host"):
        ck.save(SD, "file://otherhost/x.safetensors")


def test_bytes_api_matches_safetensors(tmp_path):
    data = ck.save_bytes(SD, metadata={"k": "v"})
    assert isinstance(data, bytes)
    assert _eq(safetensors_torch.load(data), SD)             # safetensors reads ferry's bytes
    assert _eq(ck.load_bytes(data), SD)
    theirs = safetensors_torch.save(SD)                       # ferry reads safetensors' bytes
    assert _eq(ck.load_bytes(theirs), SD)
    nested = {"a": SD, "lr": 0.5, "t": (1, 2)}
    got = ck.load_bytes(ck.save_bytes(nested, crc32c=True))
    assert got["lr"] == 0.5 and got["t"] == (1, 2) and _eq(got["a"], SD)
    p = tmp_path / "same.safetensors"
    ck.save(SD, p, metadata={"k": "v"})
    assert p.read_bytes() == data                             # the very bytes save writes
    with pytest.raises(FerryError):
        ck.load_bytes(data[:-3])


def test_sizes_as_hugging_face_reads_them():
    assert ck.parse_size("5GB") == 5 * 10 ** 9
    assert ck.parse_size("5GiB") == 5 * 2 ** 30
    assert ck.parse_size("500MB") == 500 * 10 ** 6
    assert ck.parse_size("500MiB") == 500 * 2 ** 20
    assert ck.parse_size("1.5KB") == 1500
    assert ck.parse_size("100") == 100 and ck.parse_size(100) == 100
    assert ck.parse_size("100B") == 100
    for bad in ["5 XB", "GB", "-1GB", "5GBB"]:
        with pytest.raises(ValueError):
            ck.parse_size(bad)


# ----------------------------------------------------------------------- save edge cases
def test_empty_path_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path.parent))
    with pytest.raises(FerryError, match="empty path"):
        ck.save(SD, "")
    with pytest.raises(FerryError, match="empty path"):
        ck.load("")
    assert sorted(os.listdir(tmp_path.parent)) == before and os.listdir(tmp_path) == []


def test_target_is_a_directory_refused_before_writing(tmp_path):
    d = tmp_path / "model.safetensors"
    d.mkdir()
    with pytest.raises(FerryError, match="is a directory"):
        ck.save(SD, d)
    assert os.listdir(tmp_path) == ["model.safetensors"] and os.listdir(d) == []


def test_parent_is_a_file_refused(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(FerryError, match="not a directory"):
        ck.save(SD, f / "sub" / "c.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_missing_parents_created(tmp_path, caplog):
    p = tmp_path / "a" / "b" / "c.safetensors"
    with caplog.at_level("INFO", logger="ferry.checkpoint"):
        ck.save(SD, p)
    assert _eq(ck.load(p), SD)
    assert any("created directory" in r.getMessage() for r in caplog.records)


def test_symlink_target_followed(tmp_path):
    real = tmp_path / "step1.safetensors"
    ck.save({"x": torch.ones(2)}, real)
    link = tmp_path / "latest.safetensors"
    link.symlink_to(real.name)
    ck.save(SD, link)
    assert link.is_symlink() and os.readlink(link) == real.name   # the link stays
    assert _eq(ck.load(real), SD)                                  # its target was replaced
    dangling = tmp_path / "dangling.safetensors"
    dangling.symlink_to("new.safetensors")
    ck.save(SD, dangling)
    assert dangling.is_symlink() and _eq(ck.load(tmp_path / "new.safetensors"), SD)


# ------------------------------------------- never leave the directory (issue 36 item 3)
def test_sharded_index_shard_symlinked_outside_refused(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    ck.save(SD, d / "model.safetensors", max_shard_size=40)
    idx = d / "model.safetensors.index.json"
    shard = sorted(p for p in d.iterdir() if p.name != idx.name)[0]
    outside = tmp_path / "secret.safetensors"
    os.replace(shard, outside)
    os.symlink(os.path.relpath(outside, d), shard)
    with pytest.raises(FerryError, match=r"%s: resolves to .*secret\.safetensors, outside the "
                                         r"directory .*\(a symlink leading out is refused\)"
                       % shard.name):
        ck.load(idx)
    # a symlink that stays inside the directory keeps working
    shard.unlink()
    (d / "real").mkdir()
    os.replace(outside, d / "real" / shard.name)
    os.symlink(os.path.join("real", shard.name), shard)
    assert _eq(ck.load(idx), SD)


def test_dcp_data_file_symlinked_outside_refused(tmp_path):
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    d = tmp_path / "ck"
    dcp.save({"w": torch.arange(6.0)}, storage_writer=ck.FerryWriter(d), no_dist=True)
    data = [n for n in os.listdir(d) if n.endswith(".ferry")][0]
    outside = tmp_path / "elsewhere.ferry"
    os.replace(d / data, outside)
    os.symlink(os.path.relpath(outside, d), d / data)
    with pytest.raises(BaseException) as ei:
        dcp.load({"w": torch.zeros(6)}, storage_reader=ck.FerryReader(d), no_dist=True)
    why = str(ei.value)
    assert "%s: resolves to" % data in why and "outside the directory" in why, why
    (d / data).unlink()
    (d / "sub").mkdir()
    os.replace(outside, d / "sub" / data)
    os.symlink(os.path.join("sub", data), d / data)
    back = {"w": torch.zeros(6)}
    dcp.load(back, storage_reader=ck.FerryReader(d), no_dist=True)
    assert torch.equal(back["w"], torch.arange(6.0))
