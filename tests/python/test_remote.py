"""Remote objects (http://, https://, s3://, gs://) read like files.

Every server here listens on 127.0.0.1 and is started and stopped by the test's
own fixture: a range server written below (Range, ETag, If-Match -> 412) with
a fault mode (dropped connections, 5xx bursts, SlowDown, short bodies, an
object replaced between two ranges, a stalled server), and moto's S3 server
(SigV4 checked by moto). Each fault ends in a correct read or a clear error
within its time bound, never in wrong bytes."""
import io
import json
import os
import socket
import time

import numpy as np
import pytest

ferry = pytest.importorskip("ferry")
from ferry import FerryError  # noqa: E402
from rangeserver import RangeServer, ferry_reads_urls  # noqa: E402
from remote_servers import moto_s3, nginx  # noqa: E402,F401  (fixtures)


pytestmark = pytest.mark.skipif(not ferry_reads_urls(), reason="ferry was built without libcurl (no remote objects)")


@pytest.fixture
def server(monkeypatch):
    # short bounds: every fault is decided in seconds
    monkeypatch.setenv("FERRY_REMOTE_RETRY_SECONDS", "20")
    monkeypatch.setenv("FERRY_REMOTE_STALL_SECONDS", "2")
    s = RangeServer().start()
    yield s
    s.stop()


def npy_bytes(a):
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


# ---------------------------------------------------------------------------
# Reads
# ---------------------------------------------------------------------------
def test_http_npy_equals_local(server, monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "64K")
    a = np.arange(300_000, dtype=np.float32).reshape(600, 500)
    url = server.put("a.npy", npy_bytes(a))
    got = ferry.read(url, device="cpu")
    np.testing.assert_array_equal(got, a)
    gets = server.gets()
    # each open asks for the first 64 KiB; the rest came as 64 KiB ranges,
    # each pinned to the ETag seen at open
    opens = [g for g in gets if g[1] == "bytes=0-65535"]
    reads = [g for g in gets if g[1] != "bytes=0-65535"]
    assert opens and all(im is None for _, _, im in opens)
    assert len(reads) == -(-(len(npy_bytes(a)) - 65536) // 65536)
    assert all(im == '"v1"' for _, _, im in reads)


def test_connections_are_reused(server, monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "16K")
    monkeypatch.setenv("FERRY_REMOTE_CONNECTIONS", "4")   # at most 4 requests in flight: 4 connections suffice
    a = np.arange(400_000, dtype=np.uint8)
    url = server.put("reuse.npy", npy_bytes(a))
    for _ in range(3):
        np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)
    # 3 x (2 opens + 21 ranges) requests over a handful of kept-alive connections
    assert len(server.gets()) >= 60
    assert len(server.peers) <= 8, len(server.peers)


def test_http_open_selection(server):
    a = np.arange(50_000, dtype=np.int64).reshape(250, 200)
    url = server.put("b.npy", npy_bytes(a))
    with ferry.open(url) as f:
        np.testing.assert_array_equal(f.read(None, (slice(10, 20), slice(5, 50))), a[10:20, 5:50])


def test_http_safetensors_equals_local(server):
    st = pytest.importorskip("safetensors.numpy")
    tensors = {"w": np.random.default_rng(0).standard_normal((300, 400)).astype(np.float32),
               "b": np.arange(17, dtype=np.int16)}
    url = server.put("m.safetensors", st.save(tensors))
    for name, t in tensors.items():
        np.testing.assert_array_equal(ferry.read(url, name, device="cpu"), t)


def test_http_netcdf3_equals_local(server, tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    p = tmp_path / "c.nc"
    with scipy_io.netcdf_file(str(p), "w") as nc:
        nc.createDimension("x", 40)
        nc.createDimension("y", 30)
        v = nc.createVariable("t", "f8", ("x", "y"))
        v[:] = np.arange(1200, dtype=np.float64).reshape(40, 30)
    url = server.put("c.nc", p.read_bytes())
    np.testing.assert_array_equal(ferry.read(url, "t", device="cpu"), ferry.read(str(p), "t", device="cpu"))


def test_http_raw_bytes_and_empty_object(server):
    raw = bytes(range(256)) * 1000
    url = server.put("raw.bin", raw)
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), np.frombuffer(raw, np.uint8))
    empty = server.put("empty.bin", b"")   # no range of it exists (416): its size comes from a HEAD
    assert ferry.read(empty, device="cpu").size == 0
    assert any(m == "HEAD" for m, _, _ in server.log)


def test_file_url(tmp_path):
    a = np.arange(12, dtype=np.uint8)
    p = tmp_path / "f.npy"
    np.save(p, a)
    np.testing.assert_array_equal(ferry.read("file://" + str(p), device="cpu"), a)


# ---------------------------------------------------------------------------
# Faults: a correct read after retries, or a clear error in bounded time
# ---------------------------------------------------------------------------
def big(server, name="big.npy"):
    a = np.arange(200_000, dtype=np.int32)
    return a, server.put(name, npy_bytes(a))


@pytest.mark.parametrize("faults", [["drop"], [503, 503, 503], ["slowdown", "slowdown"], ["short"], [500, "drop", "short"]])
def test_fault_then_success(server, faults):
    a, url = big(server)
    server.faults = list(faults)
    t0 = time.monotonic()
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)
    assert time.monotonic() - t0 < 20
    assert not server.faults   # every fault was met (and survived)


def test_faults_at_open_then_success(server):
    a, url = big(server)
    server.open_faults = ["drop", 503, "slowdown", "short"]
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)
    assert not server.open_faults


def test_stall_then_success(server):
    a, url = big(server)
    server.faults = ["stall"]
    t0 = time.monotonic()
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)
    assert time.monotonic() - t0 < 15


def test_replaced_between_ranges_is_an_error(server, monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "64K")
    monkeypatch.setenv("FERRY_REMOTE_CONNECTIONS", "1")
    a, url = big(server)
    server.faults = [None, "replace"]
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu")
    msg = str(ei.value)
    assert url in msg and "changed since it was opened" in msg and "412" in msg


def test_no_etag_pins_last_modified(monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "64K")
    monkeypatch.setenv("FERRY_REMOTE_CONNECTIONS", "1")
    s = RangeServer(etags=False).start()
    try:
        a, url = big(s)
        np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)
        assert all(im is None for _, _, im in s.log)
        s.faults = [None, "replace"]
        with pytest.raises(FerryError) as ei:
            ferry.read(url, device="cpu")
        assert url in str(ei.value) and "Last-Modified" in str(ei.value) and "412" in str(ei.value)
    finally:
        s.stop()


def test_persistent_5xx_names_url_range_status_message(server, monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_RETRIES", "2")
    a, url = big(server)
    server.faults = [500] * 10
    t0 = time.monotonic()
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu")
    assert time.monotonic() - t0 < 10
    msg = str(ei.value)
    assert url in msg and "bytes 65536-" in msg and "HTTP 500" in msg and "busy, try again" in msg
    assert "3 attempts" in msg


def test_stalled_server_gives_up_in_time(server, monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_RETRIES", "1")
    a, url = big(server)
    server.faults = ["stall"] * 5
    t0 = time.monotonic()
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu")
    assert time.monotonic() - t0 < 12
    assert url in str(ei.value) and "2 attempts" in str(ei.value)


def test_missing_object(server):
    url = f"http://127.0.0.1:{server.port}/nope.npy"
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu")
    assert url in str(ei.value) and "404" in str(ei.value)


def test_unknown_scheme_and_bad_urls():
    for url, words in [("ftp://host/x.npy", "ftp://"), ("s3://bucket", "no bucket"),
                       ("s3://bucket/", "names a bucket"), ("http://", "no host")]:
        with pytest.raises(FerryError) as ei:
            ferry.read(url, device="cpu")
        assert words in str(ei.value), str(ei.value)


def test_refused_connection_is_bounded(monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_RETRIES", "2")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()   # nothing listens there now
    t0 = time.monotonic()
    with pytest.raises(FerryError) as ei:
        ferry.read(f"http://127.0.0.1:{port}/x.npy", device="cpu")
    assert time.monotonic() - t0 < 10
    assert f"127.0.0.1:{port}" in str(ei.value)


# ---------------------------------------------------------------------------
# S3: moto's server, SigV4 checked
# ---------------------------------------------------------------------------
def test_s3_reads_equal_local_signed(moto_s3, monkeypatch):
    st = pytest.importorskip("safetensors.numpy")
    a = np.arange(100_000, dtype=np.float64).reshape(200, 500)
    tensors = {"x": np.ones((64, 64), np.float16), "y": np.arange(1000, dtype=np.int32)}
    moto_s3.s3.put_object(Bucket="data", Key="dir/a b+c.npy", Body=npy_bytes(a))
    moto_s3.s3.put_object(Bucket="data", Key="m.safetensors", Body=st.save(tensors))
    # from here on moto checks every request's SigV4 signature and the key's policy
    moto_s3.reset_auth("0")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_s3.key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_s3.key["SecretAccessKey"])
    np.testing.assert_array_equal(ferry.read("s3://data/dir/a b+c.npy", device="cpu"), a)
    for name, t in tensors.items():
        np.testing.assert_array_equal(ferry.read("s3://data/m.safetensors", name, device="cpu"), t)
    # a wrong secret is refused by moto's signature check, and said so
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(FerryError) as ei:
        ferry.read("s3://data/m.safetensors", "x", device="cpu")
    assert "s3://data/m.safetensors" in str(ei.value) and "403" in str(ei.value)
    assert "Signature" in str(ei.value)


def test_s3_profile_file(moto_s3, monkeypatch, tmp_path):
    moto_s3.s3.put_object(Bucket="data", Key="p.npy", Body=npy_bytes(np.arange(5)))
    moto_s3.reset_auth("0")
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = nope\naws_secret_access_key = nope\n\n"
                     f"[reader]\naws_access_key_id = {moto_s3.key['AccessKeyId']}\n"
                     f"aws_secret_access_key = {moto_s3.key['SecretAccessKey']}\n")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_PROFILE", "reader")
    np.testing.assert_array_equal(ferry.read("s3://data/p.npy", device="cpu"), np.arange(5))


def test_s3_missing_key_and_replaced_object(moto_s3):
    with pytest.raises(FerryError) as ei:
        ferry.read("s3://data/absent.npy", device="cpu")
    assert "s3://data/absent.npy" in str(ei.value) and "404" in str(ei.value)


def test_gs_public_endpoint_is_path_style(monkeypatch, server):
    # gs:// goes to STORAGE_EMULATOR_HOST when set (else storage.googleapis.com), path style, unsigned
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.port}")
    monkeypatch.delenv("GS_ACCESS_KEY_ID", raising=False)
    a = np.arange(10, dtype=np.int16)
    server.put("bucket/k/a.npy", npy_bytes(a))
    np.testing.assert_array_equal(ferry.read("gs://bucket/k/a.npy", device="cpu"), a)


def test_s3_session_token(moto_s3, monkeypatch):
    boto3 = pytest.importorskip("boto3")
    moto_s3.s3.put_object(Bucket="data", Key="t.npy", Body=npy_bytes(np.arange(7, dtype=np.int8)))
    sts = boto3.client("sts", endpoint_url=moto_s3.endpoint, region_name="us-east-1",
                       aws_access_key_id=moto_s3.key["AccessKeyId"],
                       aws_secret_access_key=moto_s3.key["SecretAccessKey"])
    iam = boto3.client("iam", endpoint_url=moto_s3.endpoint, region_name="us-east-1")
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                     "Principal": {"AWS": "*"}}]}
    role = iam.create_role(RoleName="loader", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    iam.put_role_policy(RoleName="loader", PolicyName="s3read", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]}))
    tmp = sts.assume_role(RoleArn=role["Arn"], RoleSessionName="ferry")["Credentials"]
    moto_s3.reset_auth("0")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", tmp["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", tmp["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", tmp["SessionToken"])
    np.testing.assert_array_equal(ferry.read("s3://data/t.npy", device="cpu"), np.arange(7, dtype=np.int8))
    monkeypatch.setenv("AWS_SESSION_TOKEN", tmp["SessionToken"][:-4] + "AAAA")   # a token moto does not know
    with pytest.raises(FerryError) as ei:
        ferry.read("s3://data/t.npy", device="cpu")
    assert "InvalidToken" in str(ei.value)


def test_s3_object_replaced_while_open(moto_s3, monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "64K")
    a = np.arange(100_000, dtype=np.int32)
    moto_s3.s3.put_object(Bucket="data", Key="r.npy", Body=npy_bytes(a))
    with ferry.open("s3://data/r.npy") as f:
        np.testing.assert_array_equal(f.read(None, slice(0, 10)), a[:10])   # from the bytes fetched at open
        moto_s3.s3.put_object(Bucket="data", Key="r.npy", Body=npy_bytes(a[::-1].copy()))
        with pytest.raises(FerryError) as ei:
            f.read(None, slice(50_000, 60_000))
        assert "s3://data/r.npy" in str(ei.value) and "changed since it was opened" in str(ei.value)
    # opened again: the new version
    np.testing.assert_array_equal(ferry.read("s3://data/r.npy", device="cpu"), a[::-1])


# ---------------------------------------------------------------------------
# A real web server: nginx serving files from tmp (ETag, Range, If-Match)
# ---------------------------------------------------------------------------
def test_nginx_reads_and_pins_the_version(nginx, monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "128K")
    www, base = nginx
    a = np.random.default_rng(1).standard_normal((500, 400))
    np.save(www / "a.npy", a)
    np.testing.assert_array_equal(ferry.read(base + "/a.npy", device="cpu"), a)
    with ferry.open(base + "/a.npy") as f:
        # rewritten in place, same size, another mtime: nginx's ETag changes
        np.save(www / "a.npy", a * 2)
        os.utime(www / "a.npy", (time.time() + 5, time.time() + 5))
        with pytest.raises(FerryError) as ei:
            f.read(None, slice(300, 400))
        assert base + "/a.npy" in str(ei.value) and "changed since it was opened" in str(ei.value)
    np.testing.assert_array_equal(ferry.read(base + "/a.npy", device="cpu"), a * 2)


def test_forked_child_reads_with_its_own_connections(server):
    a = np.arange(50_000, dtype=np.int64)
    url = server.put("fork.npy", npy_bytes(a))
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)   # the parent's connections stay open
    pid = os.fork()
    if pid == 0:   # the child: a new context, new connections, the same bytes
        code = 1
        try:
            c = ferry._ferry.Context(threads=2)
            code = 0 if np.array_equal(ferry.read(url, device="cpu", ctx=c), a) else 2
            c.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)


def test_gs_hmac_keys_sign_for_the_s3_compatible_api(moto_s3, monkeypatch):
    # GCS's S3-compatible API takes SigV4 with HMAC keys, region "auto": moto
    # stands in for it (STORAGE_EMULATOR_HOST) and checks the signature
    a = np.arange(33, dtype=np.float32)
    moto_s3.s3.put_object(Bucket="data", Key="g/a.npy", Body=npy_bytes(a))
    moto_s3.reset_auth("0")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", moto_s3.endpoint)
    monkeypatch.setenv("GS_ACCESS_KEY_ID", moto_s3.key["AccessKeyId"])
    monkeypatch.setenv("GS_SECRET_ACCESS_KEY", moto_s3.key["SecretAccessKey"])
    np.testing.assert_array_equal(ferry.read("gs://data/g/a.npy", device="cpu"), a)
    monkeypatch.setenv("GS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(FerryError) as ei:
        ferry.read("gs://data/g/a.npy", device="cpu")
    assert "gs://data/g/a.npy" in str(ei.value) and "403" in str(ei.value)


def test_http_sharded_safetensors_index(server):
    st = pytest.importorskip("safetensors.numpy")
    shards = {"model-00001-of-00002.safetensors": {"a": np.arange(10, dtype=np.float32)},
              "model-00002-of-00002.safetensors": {"b": np.ones((3, 4), np.int64)}}
    weight_map = {}
    for name, tensors in shards.items():
        server.put("ckpt/" + name, st.save(tensors))
        weight_map.update({t: name for t in tensors})
    url = server.put("ckpt/model.safetensors.index.json", json.dumps({"metadata": {}, "weight_map": weight_map}).encode())
    for tensors in shards.values():
        for t, v in tensors.items():   # each tensor from its shard, by a URL made from the index's
            np.testing.assert_array_equal(ferry.read(url, t, device="cpu"), v)


def test_dataset_glob_over_web_urls_says_to_name_them():
    """A glob over http(s):// URLs needs a listing a web server does not have: a ValueError
    naming the scheme and what works instead, not "no files match" (s3:// and gs:// globs are
    listed: test_remote_zarr.py); file:// globs expand locally."""
    pytest.importorskip("torch")
    from ferry.torch import ArrayDataset
    with pytest.raises(ValueError, match=r"globs over https:// URLs cannot be expanded"):
        ArrayDataset("https://example.invalid/train/*.npy", batch_size=2, device="cpu")
    from ferry.torch.sources import _expand
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for i in range(2):
            np.save(os.path.join(d, f"a{i}.npy"), np.zeros(3))
        assert _expand(f"file://{d}/a*.npy") == [os.path.join(d, "a0.npy"), os.path.join(d, "a1.npy")]
