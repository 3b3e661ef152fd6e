"""FerryWriter directories are usable by torch's own DCP tools (issue 15 item 16), and
FerryReader(safe=True) refuses .metadata pickles that build anything but DCP's metadata
types (issue 16 item 2)."""
import io
import os
import pickle

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
format_utils = pytest.importorskip("torch.distributed.checkpoint.format_utils")

from ferry import checkpoint as ck  # noqa: E402
from ferry.checkpoint import FerryError  # noqa: E402


def _state():
    g = torch.Generator().manual_seed(1)
    return {"model": {"w": torch.randn(33, 70, generator=g),
                      "h": torch.randn(5, 3, generator=g).to(torch.bfloat16),
                      "e": torch.zeros(0, 4), "s": torch.tensor(2.5)},
            "step": 7, "name": "run", "blob": b"xyz"}


def _why(e):
    """The message of an error, or of the errors DCP's CheckpointException wraps."""
    return str(e) + " ".join(str(getattr(w, "exc", w))
                             for w in getattr(e, "failures", {}).values())


def _eq(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return set(a) == set(b) and all(_eq(a[k], b[k]) for k in a)
    return a == b


def test_dcp_to_torch_save_on_a_ferry_directory(tmp_path):
    sd = _state()
    d = tmp_path / "ck"
    dcp.save(sd, storage_writer=ck.FerryWriter(d), no_dist=True)
    out = tmp_path / "full.pt"
    format_utils.dcp_to_torch_save(d, out)           # torch's FileSystemReader reads it
    assert _eq(torch.load(out, weights_only=False), sd)
    back = {"model": {"w": torch.zeros(33, 70), "h": torch.zeros(5, 3, dtype=torch.bfloat16),
                      "e": torch.ones(0, 4), "s": torch.tensor(0.0)},
            "step": 0, "name": "", "blob": b""}
    dcp.load(back, storage_reader=dcp.FileSystemReader(d), no_dist=True)
    assert _eq(back, sd)
    back2 = {"model": {k: torch.zeros_like(v) for k, v in sd["model"].items()}}
    dcp.load(back2, storage_reader=ck.FerryReader(d), no_dist=True)   # and ferry's reader
    assert _eq(back2["model"], sd["model"])
    # ferry's raw bytes stay 4 KiB-aligned inside torch's framing
    md = ck.FerryReader(d, safe=True).read_metadata()
    assert all(at % 4096 == 0 for at, _, _ in md.ferry_layout.values())


def _torch_sd():
    g = torch.Generator().manual_seed(2)
    return {"w": torch.randn(33, 70, generator=g),
            "h": torch.randn(5, 3, generator=g).to(torch.bfloat16),
            "t": torch.randn(4, 6, generator=g).t(),          # stored with its strides
            "i": torch.arange(-5, 5, dtype=torch.int64), "e": torch.zeros(0, 4),
            "s": torch.tensor(2.5), "f8": torch.ones(5).to(torch.float8_e4m3fn),
            "u": torch.arange(7, dtype=torch.uint8), "step": 7, "name": "run"}


def _torch_zeros():
    return {k: torch.zeros_like(v).contiguous() if isinstance(v, torch.Tensor) else
            type(v)() for k, v in _torch_sd().items()}


def test_torch_filesystem_writer_directory_read_by_ferry(tmp_path):
    """issue 38 item 1: torch's FileSystemWriter stores each tensor as a torch.save
    archive; FerryReader finds its bytes through the zip directory and data.pkl (read by a
    loader that builds nothing) and reads them through the engine, safely."""
    d = tmp_path / "fsw"
    sd = _torch_sd()
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(d), no_dist=True)
    back = _torch_zeros()
    dcp.load(back, storage_reader=ck.FerryReader(d), no_dist=True)
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            assert back[k].dtype == v.dtype and torch.equal(back[k].float(), v.float()), k
        else:
            assert back[k] == v, k
    # a box of a stored tensor: only its rows are read
    part = {"w": torch.zeros(33, 70)}
    dcp.load(part, storage_reader=ck.FerryReader(d), no_dist=True)
    assert torch.equal(part["w"], sd["w"])


def test_torch_filesystem_writer_damage_refused(tmp_path):
    d = tmp_path / "fsw"
    dcp.save({"w": torch.arange(64.0)}, storage_writer=dcp.FileSystemWriter(d), no_dist=True)
    data = [n for n in os.listdir(d) if n.endswith(".distcp")][0]
    blob = (d / data).read_bytes()
    flips = 0
    for at in range(0, len(blob)):
        bad = bytearray(blob)
        bad[at] ^= 1 << (at % 8)
        (d / data).write_bytes(bad)
        back = {"w": torch.zeros(64)}
        try:
            dcp.load(back, storage_reader=ck.FerryReader(d), no_dist=True)
        except BaseException as e:  # noqa: BLE001 — DCP's CheckpointException
            inner = [w[0] if isinstance(w, tuple) else w
                     for w in getattr(e, "failures", {0: e}).values()]
            assert all(isinstance(x, FerryError) for x in inner), (at, inner)
            flips += 1
            continue
        # a flip in the tensor's bytes changes a value (no checksum); anywhere else: equal
        diff = (back["w"] != torch.arange(64.0)).nonzero()
        assert diff.numel() <= 1, (at, diff)
    assert flips > len(blob) // 10
    (d / data).write_bytes(blob[:len(blob) // 2])
    with pytest.raises(BaseException) as ei:
        dcp.load({"w": torch.zeros(64)}, storage_reader=ck.FerryReader(d), no_dist=True)
    assert "truncated" in _why(ei.value)


def test_older_raw_layout_still_loads(tmp_path):
    """Directories written before the torch.save framing: FerryStorageInfo per item,
    raw bytes at its offset."""
    from ferry.checkpoint import dcp as _ckpt_dcp
    sd = {"w": torch.randn(8, 9), "step": 3}
    d = tmp_path / "old"
    dcp.save(sd, storage_writer=ck.FerryWriter(d), no_dist=True)
    md = ck.FerryReader(d).read_metadata()
    old = {}
    for idx, info in md.storage_data.items():
        if idx in md.ferry_layout:
            at, dt, shape = md.ferry_layout[idx]
            n = 1
            for s in shape:
                n *= s
            old[idx] = _ckpt_dcp.FerryStorageInfo(info.relative_path, at, n * 4, dt, shape)
        else:
            old[idx] = _ckpt_dcp.FerryStorageInfo(info.relative_path, info.offset, info.length)
    md.storage_data = old
    del md.ferry_layout
    raw = pickle.dumps(md)
    assert b"ferry._ckpt_dcp" in raw          # the class's name in those directories
    (d / ".metadata").write_bytes(raw)
    back = {"w": torch.zeros(8, 9), "step": 0}
    dcp.load(back, storage_reader=ck.FerryReader(d, safe=True), no_dist=True)
    assert _eq(back, sd)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > %s" % self.target,))


def test_safe_mode_refuses_code_in_metadata(tmp_path):
    d = tmp_path / "evil"
    dcp.save({"w": torch.ones(2)}, storage_writer=ck.FerryWriter(d), no_dist=True)
    md = ck.FerryReader(d, safe=False).read_metadata()
    evil = _Evil()
    evil.target = str(tmp_path / "pwned")
    md.storage_meta.modules = [evil]                  # anything pickled inside .metadata
    (d / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(FerryError, match=r"\.metadata: DCP metadata names (posix|os)\.system"):
        ck.FerryReader(d, safe=True).read_metadata()
    with pytest.raises(BaseException) as ei:
        dcp.load({"w": torch.zeros(2)}, storage_reader=ck.FerryReader(d, safe=True),
                 no_dist=True)
    assert "system, which FerryReader(safe=True) does not build" in _why(ei.value)
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(FerryError, match="does not build"):
        ck.FerryReader(d).read_metadata()              # safe is the default
    assert not (tmp_path / "pwned").exists()
    # safe=False follows torch's FileSystemReader: it unpickles (documented)
    try:
        ck.FerryReader(d, safe=False).read_metadata()
    except Exception:
        pass
    assert (tmp_path / "pwned").exists()


@pytest.mark.parametrize("url", ["s3://bucket/ck", "gs://b/ck", "memory://ck"])
def test_ferry_writer_and_reader_refuse_urls_before_creating_anything(tmp_path, monkeypatch, url):
    """An object-store id must never become a local directory (./s3:/bucket/ck): refused when
    the writer (or, for URLs the C library does not read, the reader) is made or reset, before
    anything is written. FerryReader keeps an s3:// or gs:// id as the URL it reads
    (test_remote_dcp.py)."""
    from ferry.checkpoint import FerryReader, FerryWriter
    monkeypatch.chdir(tmp_path)
    for cls in (FerryWriter, FerryReader):
        if cls is FerryReader and not url.startswith("memory:"):
            assert cls(url).path == url and cls.validate_checkpoint_id(url)
            r = cls(str(tmp_path / "ok"))
            r.reset(url)
            assert r.path == url
            continue
        with pytest.raises(FerryError, match="local directories only"):
            cls(url)
        w = cls(str(tmp_path / "ok"))
        with pytest.raises(FerryError, match="local directories only"):
            w.reset(url)
        assert not cls.validate_checkpoint_id(url)
    assert list(tmp_path.iterdir()) == []
    # file:// URLs name local directories and are accepted
    w = FerryWriter("file://" + str(tmp_path / "d"))
    assert w.path == str(tmp_path / "d")
