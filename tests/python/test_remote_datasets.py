"""ArrayDataset, TokenDataset and XarrayDataset over s3:// globs: the bucket is
listed by the C library (ferry_url_glob, ListObjectsV2 page by page) and the
objects read through ferry's remote source; batches equal those of the same
files read locally. moto's S3 server on 127.0.0.1 (tests/python/
remote_servers.py's fixture); the endpoint and credentials come from the
environment, as a training job's would."""
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ferry = pytest.importorskip("ferry")
from rangeserver import ferry_reads_urls  # noqa: E402
from remote_servers import s3  # noqa: E402,F401  (the fixture)

pytestmark = pytest.mark.skipif(not ferry_reads_urls(), reason="ferry was built without libcurl (no remote objects)")


@pytest.fixture
def bucket(s3, monkeypatch):  # noqa: F811
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.options["secret"])
    return s3


def put(s3, key, data):
    s3.client.put_object(Bucket="data", Key=key, Body=data)


def npy(a):
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def clone(b):
    if isinstance(b, torch.Tensor):
        return b.clone()
    if isinstance(b, dict):
        return {k: clone(v) for k, v in b.items()}
    return type(b)(clone(v) for v in b)


def batches(ds):
    return [clone(b) for b in ds]


def assert_same(g, w):
    if isinstance(w, torch.Tensor):
        torch.testing.assert_close(g, w)
    elif isinstance(w, dict):
        assert g.keys() == w.keys()
        for k in w:
            assert_same(g[k], w[k])
    else:
        assert len(g) == len(w)
        for a, b in zip(g, w):
            assert_same(a, b)


def test_array_dataset_over_an_s3_glob(bucket, tmp_path):
    from ferry.torch import ArrayDataset
    for i in range(12):   # natural order: shard2 before shard10, as local globs
        a = np.arange(i * 30, i * 30 + 30, dtype=np.float32).reshape(10, 3)
        put(bucket, f"train/shard{i}.npy", npy(a))
        np.save(tmp_path / f"shard{i}.npy", a)
    put(bucket, "train/README.md", b"not a shard")
    bucket.lock()
    remote = ArrayDataset("s3://data/train/shard*.npy", batch_size=7, device="cpu")
    local = ArrayDataset(str(tmp_path / "shard*.npy"), batch_size=7, device="cpu")
    got, want = batches(remote), batches(local)
    assert len(got) == len(want) == 18
    for g, w in zip(got, want):
        assert_same(g, w)
    with pytest.raises(FileNotFoundError, match="no objects match"):
        ArrayDataset("s3://data/train/none*.npy", batch_size=7, device="cpu")


def test_token_dataset_over_an_s3_glob(bucket, tmp_path):
    from ferry.torch import TokenDataset
    rng = np.random.default_rng(0)
    for i in range(3):
        t = rng.integers(0, 50_000, size=4097 + i, dtype=np.uint16)
        put(bucket, f"tok/part{i}.bin", t.tobytes())
        t.tofile(tmp_path / f"part{i}.bin")
    bucket.lock()
    kw = dict(seq_len=64, batch_size=8, shuffle=False, device="cpu")
    remote = TokenDataset("s3://data/tok/part*.bin", **kw)
    local = TokenDataset(str(tmp_path / "part*.bin"), **kw)
    got, want = batches(remote), batches(local)
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert_same(g, w)


def test_xarray_dataset_over_an_s3_glob(bucket, tmp_path):
    xr = pytest.importorskip("xarray")
    pytest.importorskip("scipy")
    from ferry.torch import XarrayDataset
    for i in range(3):
        ds = xr.Dataset({"z": (("time", "lat", "lon"), np.arange(4 * 6 * 8, dtype="f4").reshape(4, 6, 8) + 1000 * i)},
                        coords={"time": np.arange(4 * i, 4 * i + 4)})
        ds.to_netcdf(tmp_path / f"era{i}.nc", engine="scipy")
        put(bucket, f"era/era{i}.nc", (tmp_path / f"era{i}.nc").read_bytes())
    bucket.lock()
    kw = dict(variables=["z"], sample_dim="time", batch_size=5, device="cpu")
    got = batches(XarrayDataset("s3://data/era/era*.nc", **kw))
    want = batches(XarrayDataset(str(tmp_path / "era*.nc"), **kw))
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert_same(g, w)


def test_datasets_with_a_context_holding_the_options(s3, tmp_path):  # noqa: F811
    # no endpoint or keys in the environment: the Context's remote options list
    # the bucket and read the objects
    from ferry._remote import remote_context
    from ferry.torch import ArrayDataset, TokenDataset
    for i in range(3):
        put(s3, f"ctx/s{i}.npy", npy(np.full((4, 2), i, dtype=np.int16)))
        put(s3, f"ctx/t{i}.npy", npy(np.arange(300 * i, 300 * i + 300, dtype=np.uint16)))
    s3.lock()
    ctx = remote_context(s3.options)
    got = batches(ArrayDataset("s3://data/ctx/s*.npy", batch_size=4, device="cpu", ctx=ctx))
    assert [int(b[0, 0]) for b in got] == [0, 1, 2]
    toks = batches(TokenDataset("s3://data/ctx/t*.npy", seq_len=50, batch_size=2, shuffle=False, device="cpu", ctx=ctx))
    assert len(toks) > 0
