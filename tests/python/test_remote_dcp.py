"""torch.distributed.checkpoint directories read by ferry.checkpoint.FerryReader from
s3:// (moto's server, tests/python/remote_servers.py) and http:// (nginx): a checkpoint
written locally by torch's own dcp.save (FileSystemWriter's .distcp archives) and one by
FerryWriter, uploaded with boto3, load equal to the local load; missing metadata, a
damaged one and a file name leading elsewhere are errors naming the URL."""
import os
import pickle

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
from ferry import checkpoint as ck  # noqa: E402
from ferry import FerryError  # noqa: E402
from rangeserver import ferry_reads_urls  # noqa: E402
from remote_servers import nginx, s3  # noqa: E402,F401  (fixtures)

pytestmark = pytest.mark.skipif(not ferry_reads_urls(), reason="ferry was built without libcurl (no remote objects)")


def _state():
    g = torch.Generator().manual_seed(4)
    return {"model": {"w": torch.randn(300, 70, generator=g), "h": torch.randn(5, 3, generator=g).to(torch.bfloat16),
                      "t": torch.randn(64, 33, generator=g).t(),      # not C order in torch's archive
                      "e": torch.zeros(0, 4), "s": torch.tensor(2.5)},
            "step": 7, "name": "run"}


def _blank():
    return {"model": {"w": torch.zeros(300, 70), "h": torch.zeros(5, 3, dtype=torch.bfloat16),
                      "t": torch.zeros(33, 64), "e": torch.ones(0, 4), "s": torch.tensor(0.0)},
            "step": 0, "name": ""}


def _eq(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return set(a) == set(b) and all(_eq(a[k], b[k]) for k in a)
    return a == b


def _load(reader):
    out = _blank()
    try:
        dcp.load(out, storage_reader=reader, no_dist=True)
    except BaseException as e:  # noqa: BLE001 — DCP wraps the reader's error
        raise reader.error or e
    return out


@pytest.mark.parametrize("writer", ["torch", "ferry"])
def test_s3_directory_loads_as_the_local_one(s3, tmp_path, writer):
    d = tmp_path / "ck"
    w = dcp.FileSystemWriter(str(d)) if writer == "torch" else ck.FerryWriter(str(d))
    dcp.save(_state(), storage_writer=w, no_dist=True)
    s3.upload(d, "dcp/step1")
    s3.lock()
    local = _load(ck.FerryReader(str(d)))
    assert _eq(local, _state())
    for url in ("s3://data/dcp/step1", "s3://data/dcp/step1/"):
        got = _load(ck.FerryReader(url, storage_options=s3.options))
        assert _eq(got, local)
    # DCP's checkpoint_id routes to the reader the same way
    out = _blank()
    dcp.load(out, checkpoint_id="s3://data/dcp/step1", storage_reader=ck.FerryReader(storage_options=s3.options),
             no_dist=True)
    assert _eq(out, local)


def test_http_directory_and_errors_naming_the_url(nginx, tmp_path):
    www, base = nginx
    d = www / "ck"
    dcp.save(_state(), storage_writer=dcp.FileSystemWriter(str(d)), no_dist=True)
    assert _eq(_load(ck.FerryReader(f"{base}/ck")), _load(ck.FerryReader(str(d))))
    r = ck.FerryReader(f"{base}/none")
    with pytest.raises(FerryError) as ei:
        r.read_metadata()
    assert f"{base}/none/.metadata" in str(ei.value) and "no DCP metadata" in str(ei.value)
    # a damaged .metadata: named
    (www / "bad").mkdir()
    (www / "bad" / ".metadata").write_bytes((d / ".metadata").read_bytes()[:100])
    with pytest.raises(FerryError) as ei:
        ck.FerryReader(f"{base}/bad").read_metadata()
    assert f"{base}/bad/.metadata" in str(ei.value) and "corrupted DCP metadata" in str(ei.value)
    # a data file named with a path in the metadata: refused, never read from elsewhere
    md = ck.FerryReader(str(d), safe=False).read_metadata()
    for info in md.storage_data.values():
        info.relative_path = ".."
    (www / "evil").mkdir()
    with open(www / "evil" / ".metadata", "wb") as f:
        pickle.dump(md, f)
    for n in os.listdir(d):
        if n != ".metadata":
            (www / "evil" / n).write_bytes((d / n).read_bytes())
    with pytest.raises(FerryError) as ei:
        _load(ck.FerryReader(f"{base}/evil"))
    assert f"{base}/evil/.metadata" in str(ei.value) and "not a file of the directory" in str(ei.value), str(ei.value)


def test_writer_still_refuses_urls():
    with pytest.raises(FerryError) as ei:
        ck.FerryWriter("s3://data/dcp")
    assert "s3://data/dcp" in str(ei.value) and "s3:// checkpoint ids" in str(ei.value)
    with pytest.raises(FerryError):
        ck.FerryReader("memory://x/dcp")          # fsspec URLs: not read by the C library
    assert ck.FerryReader.validate_checkpoint_id("s3://b/ck") and not ck.FerryWriter.validate_checkpoint_id("s3://b/ck")


def test_remote_dcp_file_names_are_plain():
    """The metadata names the data files; at a URL only plain names are read (a server decodes
    %2f, '?' starts a query): anything else is corrupted metadata, named."""
    import ferry
    from ferry.checkpoint.dcp import _object_name
    assert _object_name("https://h/ck", "__0_0.distcp") == "https://h/ck/__0_0.distcp"
    for bad in ("..%2f..%2fother.bin", "a?x=1", "a#b", "../x", "a/b", "", ".."):
        with pytest.raises(ferry.FerryError, match="corrupted DCP metadata"):
            _object_name("https://h/ck", bad)
