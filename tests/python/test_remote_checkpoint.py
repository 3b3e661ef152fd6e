"""Checkpoints in object storage: ferry.checkpoint.save / load / safe_open / async_save of
s3:// objects (moto's S3 server, SigV4 checked), Hugging Face index directories over s3://
and http:// (the loopback range server), and `ferry info` on them.

Saves go through the C library's S3 upload (ferry_object_write): one PUT below the part
size, a multipart upload above it, aborted on any failure. A loopback proxy in front of
moto injects the failures: a part refused mid-upload leaves no object (or the previous one)
and no pending upload; a 503 on a part is retried and the save completes."""
import http.client
import json
import os
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
from ferry import checkpoint as ck  # noqa: E402
from ferry import FerryError  # noqa: E402
from ferry import _ferry as ferry_ext  # noqa: E402
from rangeserver import ferry_reads_urls  # noqa: E402
from remote_servers import moto_s3  # noqa: E402,F401  (a fixture)
from test_remote import server  # noqa: E402,F401  (a fixture)

pytestmark = pytest.mark.skipif(not ferry_reads_urls(), reason="ferry was built without libcurl (no remote objects)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sd(seed=0, big=300_000):
    g = torch.Generator().manual_seed(seed)
    return {"emb.weight": torch.randn(big, generator=g).reshape(-1, 100),
            "lm_head.weight": torch.randn(1000, 128, generator=g).to(torch.bfloat16),
            "step": torch.tensor(7), "mask": torch.arange(33, dtype=torch.int16)}


def _eq(a, b):
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def _keys(moto, prefix=""):
    return sorted(o["Key"] for o in moto.s3.list_objects_v2(Bucket="data", Prefix=prefix).get("Contents", []))


def _pending(moto):
    return moto.s3.list_multipart_uploads(Bucket="data").get("Uploads", [])


@pytest.fixture
def signed(moto_s3, monkeypatch):
    """moto checks every request's SigV4 signature from here on."""
    moto_s3.reset_auth("0")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_s3.key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_s3.key["SecretAccessKey"])
    monkeypatch.setenv("FERRY_REMOTE_PART_SIZE", "5M")   # S3's smallest: multipart from 5 MiB on
    import boto3
    moto_s3.s3 = boto3.client("s3", endpoint_url=moto_s3.endpoint, region_name="us-east-1",
                              aws_access_key_id=moto_s3.key["AccessKeyId"],
                              aws_secret_access_key=moto_s3.key["SecretAccessKey"])
    return moto_s3


# ---------------------------------------------------------------------------
# Saves and loads through moto
# ---------------------------------------------------------------------------
def test_save_load_single_file_equals_local(signed, tmp_path):
    sd = _sd()
    for key, big in (("small.safetensors", 1000), ("big.safetensors", 2_000_000)):   # one PUT; 2 parts
        sd = _sd(big=big)
        ck.save(sd, f"s3://data/{key}", crc32c=True)
        local = tmp_path / key
        ck.save(sd, str(local), crc32c=True)
        body = signed.s3.get_object(Bucket="data", Key=key)["Body"].read()
        assert body == local.read_bytes()          # the very bytes of a local save
        etag = signed.s3.head_object(Bucket="data", Key=key)["ETag"]
        assert etag.endswith('-2"') == (big > 1000), etag   # a multipart upload's ETag: "<md5>-<parts>"
        assert _eq(ck.load(f"s3://data/{key}"), sd)
        assert _eq(st_torch.load(body), sd)        # what safetensors reads
    assert _pending(signed) == []
    with ck.safe_open("s3://data/big.safetensors") as f:
        assert set(f.keys()) == set(sd)
        assert torch.equal(f.get_slice("emb.weight")[100:200, 5:9], sd["emb.weight"][100:200, 5:9])
        assert torch.equal(f.get_tensor("lm_head.weight"), sd["lm_head.weight"])
    into = {k: torch.zeros_like(v) for k, v in sd.items()}
    ck.load_into(into, "s3://data/big.safetensors")
    assert _eq(into, sd)


def test_nested_state_and_async_save(signed):
    sd = {"model": _sd(1, big=100), "optim": {"lr": 0.1, "step": 3}, "name": "run"}
    fut = ck.async_save(sd, "s3://data/a/step3.safetensors")
    assert fut.result(timeout=60) == "s3://data/a/step3.safetensors"
    got = ck.load("s3://data/a/step3.safetensors")
    assert got["optim"] == {"lr": 0.1, "step": 3} and got["name"] == "run" and _eq(got["model"], sd["model"])


def test_sharded_save_hf_names_index_last_and_loads(signed):
    sd = _sd(2, big=1_500_000)                      # 6 MB of float32 + the rest
    ck.save(sd, "s3://data/ckpt/model.safetensors", max_shard_size="4MB")
    keys = _keys(signed, "ckpt/")
    n = len(keys) - 1
    assert n >= 2 and keys == sorted([f"ckpt/model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)] +
                                     ["ckpt/model.safetensors.index.json"])
    index = json.loads(signed.s3.get_object(Bucket="data", Key="ckpt/model.safetensors.index.json")["Body"].read())
    assert set(index["weight_map"]) == set(sd)
    # one URL rule (C): the directory URL, the index, the name of the single file a sharded save replaced
    for url in ("s3://data/ckpt/", "s3://data/ckpt", "s3://data/ckpt/model.safetensors.index.json",
                "s3://data/ckpt/model.safetensors"):
        assert _eq(ck.load(url), sd), url
    # the index is written after the shards: the last PUT of the save
    # a smaller save over it: one shard fewer, the extra one deleted; a single file: the set deleted
    small = {k: v for k, v in sd.items() if k != "emb.weight"}
    ck.save(small, "s3://data/ckpt/model.safetensors", max_shard_size="100KB")
    keys2 = _keys(signed, "ckpt/")
    n2 = len(keys2) - 1
    assert keys2 == sorted([f"ckpt/model-{i:05d}-of-{n2:05d}.safetensors" for i in range(1, n2 + 1)] +
                           ["ckpt/model.safetensors.index.json"])
    assert _eq(ck.load("s3://data/ckpt/"), small)
    ck.save(small, "s3://data/ckpt/model.safetensors")
    assert _keys(signed, "ckpt/") == ["ckpt/model.safetensors"]
    assert _eq(ck.load("s3://data/ckpt/"), small)
    assert _pending(signed) == []


def test_sharded_save_with_crcs_and_structure(signed):
    sd = {"model": _sd(15, big=1_500_000), "optim": {"step": 9, "lr": [0.1, 0.01]}}
    ck.save(sd, "s3://data/c/model.safetensors", max_shard_size="4MB", crc32c=True)
    got = ck.load("s3://data/c/")
    assert got["optim"] == sd["optim"] and _eq(got["model"], sd["model"])
    # a flipped byte in a shard's tensor data is caught by its CRC, naming the shard
    key = "c/model-00001-of-00002.safetensors"
    body = bytearray(signed.s3.get_object(Bucket="data", Key=key)["Body"].read())
    body[-5] ^= 0xFF
    signed.s3.put_object(Bucket="data", Key=key, Body=bytes(body))
    with pytest.raises(FerryError) as ei:
        ck.load("s3://data/c/")
    assert "s3://data/" + key in str(ei.value) and "CRC32C mismatch" in str(ei.value)


def test_two_saves_are_never_mixed(signed):
    a, b = _sd(3, big=1_500_000), _sd(4, big=1_500_000)
    ck.save(a, "s3://data/m/model.safetensors", max_shard_size="4MB")
    ck.save(b, "s3://data/other/model.safetensors", max_shard_size="4MB")
    # a save of b over a, caught after its first shard: the index still names save a
    shard = _keys(signed, "other/")[0].split("/")[1]
    signed.s3.copy_object(Bucket="data", Key="m/" + shard, CopySource={"Bucket": "data", "Key": "other/" + shard})
    with pytest.raises(FerryError) as ei:
        ck.load("s3://data/m/")
    msg = str(ei.value)
    assert "s3://data/m/" + shard in msg and "belongs to save" in msg and "replaced while it was opened" in msg


def test_missing_checkpoint_names_what_was_tried(signed):
    with pytest.raises(FerryError) as ei:
        ck.load("s3://data/nothing/")
    assert "s3://data/nothing/" in str(ei.value) and "model.safetensors.index.json" in str(ei.value)
    with pytest.raises(FerryError) as ei:
        ck.load("s3://data/absent.safetensors")
    assert "s3://data/absent.safetensors" in str(ei.value) and "404" in str(ei.value)


def test_https_and_http_destinations_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for url in ("https://example.com/m.safetensors", "http://127.0.0.1:9/m.safetensors"):
        with pytest.raises(FerryError) as ei:
            ck.save({"x": torch.zeros(2)}, url)
        assert url in str(ei.value) and "does not write" in str(ei.value) and "s3://" in str(ei.value)
        with pytest.raises(FerryError, match="does not write"):
            ck.async_save({"x": torch.zeros(2)}, url)
    assert os.listdir(tmp_path) == []


def test_folder_destination_is_refused(signed):
    with pytest.raises(FerryError) as ei:
        ck.save({"x": torch.zeros(2)}, "s3://data/dir/")
    assert "names a folder" in str(ei.value) and "s3://data/dir/model.safetensors" in str(ei.value)
    assert _keys(signed) == []


def test_gs_hmac_keys_write_through_the_s3_api(moto_s3, monkeypatch):
    """gs:// saves go to GCS's S3-compatible XML API with HMAC keys (moto stands in for it,
    STORAGE_EMULATOR_HOST, signature checked), multipart included."""
    moto_s3.reset_auth("0")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", moto_s3.endpoint)
    monkeypatch.setenv("GS_ACCESS_KEY_ID", moto_s3.key["AccessKeyId"])
    monkeypatch.setenv("GS_SECRET_ACCESS_KEY", moto_s3.key["SecretAccessKey"])
    monkeypatch.setenv("FERRY_REMOTE_PART_SIZE", "5M")
    sd = _sd(14, big=2_000_000)
    ck.save(sd, "gs://data/g/model.safetensors", max_shard_size="6MB")
    assert _eq(ck.load("gs://data/g/"), sd)
    monkeypatch.setenv("GS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(FerryError) as ei:
        ck.save(sd, "gs://data/g2.safetensors")
    assert "gs://data/g2.safetensors" in str(ei.value) and "403" in str(ei.value)


def test_part_size_is_checked_with_the_other_knobs(monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_PART_SIZE", "1M")   # under S3's 5 MiB
    with pytest.raises(FerryError, match="FERRY_REMOTE_PART_SIZE=\"1M\": a size from 5M to 5G"):
        ferry_ext.Context()


def test_dcp_writer_refuses_object_urls_saying_what_to_do():
    # (FerryReader reads them: test_remote_dcp.py)
    from ferry.checkpoint import FerryWriter
    with pytest.raises(FerryError) as ei:
        FerryWriter("s3://data/dcp")
    msg = str(ei.value)
    assert "s3://data/dcp" in msg and "s3:// checkpoint ids" in msg and "ferry.checkpoint.save" in msg


# ---------------------------------------------------------------------------
# Faults: a proxy before moto
# ---------------------------------------------------------------------------
class FaultProxy:
    """Forwards every request to moto; `fail(pred, status)` answers the requests pred
    matches (method, path with query) with `status` instead, `times` times (None: always);
    status "lose": the request reaches moto, its answer is lost (the connection closes)."""

    def __init__(self, target):
        self.host, self.port_t = target.split("//")[1].split(":")
        self.rules, self.log, self.lock = [], [], threading.Lock()
        proxy = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def handle_one(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with proxy.lock:
                    proxy.log.append((self.command, self.path))
                    hit = None
                    for r in proxy.rules:
                        if r[2] != 0 and r[0](self.command, self.path):
                            hit = r
                            if r[2] is not None:
                                r[2] -= 1
                            break
                if hit and hit[1] == "lose":
                    proxy.forward(self, body)
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if hit:
                    msg = (b"<?xml version='1.0'?><Error><Code>%s</Code><Message>injected</Message></Error>"
                           % hit[3].encode())
                    self.send_response(hit[1])
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                r, data = proxy.forward(self, body)
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", r.getheader("Content-Length", "0") if self.command == "HEAD"
                                 else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def forward(self, h, body):
        c = http.client.HTTPConnection(self.host, int(self.port_t), timeout=30)
        hdrs = {k: v for k, v in h.headers.items() if k.lower() not in ("content-length",)}
        c.request(h.command, h.path, body=body, headers=hdrs)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r, data

    def fail(self, pred, status, times=None, code="AccessDenied"):
        self.rules.append([pred, status, times, code])

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def proxy(moto_s3, monkeypatch):
    p = FaultProxy(moto_s3.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", p.url)
    monkeypatch.setenv("FERRY_REMOTE_PART_SIZE", "5M")
    monkeypatch.setenv("FERRY_REMOTE_RETRY_SECONDS", "20")
    yield p
    p.stop()


def test_part_refused_mid_upload_leaves_the_previous_object_and_no_upload(moto_s3, proxy):
    old = _sd(5, big=100)
    ck.save(old, "s3://data/f.safetensors")
    before = moto_s3.s3.get_object(Bucket="data", Key="f.safetensors")["Body"].read()
    proxy.fail(lambda m, p: m == "PUT" and "partNumber=2&" in p, 403)
    with pytest.raises(FerryError) as ei:
        ck.save(_sd(6, big=3_000_000), "s3://data/f.safetensors")   # 12 MB: 3 parts
    msg = str(ei.value)
    assert "s3://data/f.safetensors" in msg and "part 2 (bytes 5242880-10485759)" in msg and "403" in msg
    assert "the upload was aborted: the object is as it was" in msg
    assert any(m == "DELETE" and "uploadId=" in p for m, p in proxy.log)   # AbortMultipartUpload
    assert _pending(moto_s3) == []
    assert moto_s3.s3.get_object(Bucket="data", Key="f.safetensors")["Body"].read() == before
    # a new object refused mid-upload does not appear at all
    with pytest.raises(FerryError):
        ck.save(_sd(6, big=3_000_000), "s3://data/new.safetensors")
    assert "new.safetensors" not in _keys(moto_s3) and _pending(moto_s3) == []


def test_refused_completion_aborts(moto_s3, proxy):
    proxy.fail(lambda m, p: m == "POST" and "uploadId=" in p, 400)
    with pytest.raises(FerryError) as ei:
        ck.save(_sd(7, big=2_000_000), "s3://data/c.safetensors")
    assert "CompleteMultipartUpload" in str(ei.value) and "aborted" in str(ei.value)
    assert "c.safetensors" not in _keys(moto_s3) and _pending(moto_s3) == []


def test_sharded_save_failing_on_a_shard_keeps_the_previous_set(moto_s3, proxy):
    old = _sd(8, big=1_500_000)
    ck.save(old, "s3://data/s/model.safetensors", max_shard_size="4MB")
    proxy.fail(lambda m, p: m == "PUT" and "model-00002-of" in p, 403)
    with pytest.raises(FerryError):
        ck.save(_sd(9, big=1_500_000), "s3://data/s/model.safetensors", max_shard_size="4MB")
    # shard 1 of the new save is in place, the index is the old one: refused, never mixed
    with pytest.raises(FerryError, match="belongs to save"):
        ck.load("s3://data/s/")
    proxy.rules.clear()
    new = _sd(9, big=1_500_000)
    ck.save(new, "s3://data/s/model.safetensors", max_shard_size="4MB")
    assert _eq(ck.load("s3://data/s/"), new)


def test_sharded_save_holds_a_window_of_shards_and_writes_the_index_last(moto_s3, proxy, monkeypatch):
    from ferry.checkpoint import remote, url as ckurl
    live, most = [0], [0]

    class Counted(ckurl.MemFile):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            live[0] += 1
            most[0] = max(most[0], live[0])

        def close(self):
            if self.fd >= 0:
                live[0] -= 1
            super().close()

    monkeypatch.setattr(ckurl, "MemFile", Counted)
    monkeypatch.setattr(remote, "SHARDS_AT_ONCE", 2)
    g = torch.Generator().manual_seed(16)
    sd = {f"layer{i}.weight": torch.randn(300, 1000, generator=g) for i in range(7)}   # 1.2 MB each
    ck.save(sd, "s3://data/w/model.safetensors", max_shard_size="1MB")
    assert most[0] == 2 and live[0] == 0
    puts = [p for m, p in proxy.log if m in ("PUT", "POST") and "/data/w/" in p]
    assert puts[-1].endswith("/data/w/model.safetensors.index.json") and len(puts) == 8
    assert _eq(ck.load("s3://data/w/"), sd)


def test_transient_errors_are_retried(moto_s3, proxy):
    proxy.fail(lambda m, p: m == "PUT" and "partNumber=1&" in p, 503, times=2)
    proxy.fail(lambda m, p: m == "POST" and p.endswith("?uploads"), 500, times=1)
    sd = _sd(10, big=2_000_000)
    ck.save(sd, "s3://data/r.safetensors")
    assert _eq(ck.load("s3://data/r.safetensors"), sd)
    assert sum(1 for m, p in proxy.log if m == "PUT" and "partNumber=1&" in p) == 3


def test_completion_whose_answer_is_lost(moto_s3, proxy):
    """CompleteMultipartUpload reaches S3 but its answer is lost: the retry finds the upload
    gone (NoSuchUpload), and the object, of this upload's size and part count, is taken as
    written -- not reported as an aborted save."""
    complete = lambda m, p: m == "POST" and "uploadId=" in p   # noqa: E731
    proxy.fail(complete, "lose", times=1)
    proxy.fail(complete, 404, times=1, code="NoSuchUpload")   # as S3 answers once the upload is complete
    sd = _sd(12, big=2_000_000)
    ck.save(sd, "s3://data/lost.safetensors")
    assert sum(1 for m, p in proxy.log if complete(m, p)) == 2
    assert any(m == "HEAD" for m, p in proxy.log)
    assert _eq(ck.load("s3://data/lost.safetensors"), sd) and _pending(moto_s3) == []
    # the completion never reached S3, and a retry finds the upload gone: the object is
    # the previous one (another size), so the save is an error, not a success
    proxy.rules.clear()
    proxy.fail(complete, 500, times=1)
    proxy.fail(complete, 404, times=1, code="NoSuchUpload")
    with pytest.raises(FerryError) as ei:
        ck.save(_sd(13, big=2_500_000), "s3://data/lost.safetensors")
    assert "the object is not this upload's" in str(ei.value)
    assert _eq(ck.load("s3://data/lost.safetensors"), sd)


# ---------------------------------------------------------------------------
# HTTP: a Hugging Face directory written by safetensors, read by URL
# ---------------------------------------------------------------------------
def _hf_dir(server, prefix, big=5000):
    sd = _sd(11, big=big)
    shards = {"model-00001-of-00002.safetensors": ["emb.weight", "step"],
              "model-00002-of-00002.safetensors": ["lm_head.weight", "mask"]}
    wm = {}
    for name, keys in shards.items():
        server.put(f"{prefix}/{name}", st_torch.save({k: sd[k] for k in keys}))
        wm.update({k: name for k in keys})
    server.put(f"{prefix}/model.safetensors.index.json",
               json.dumps({"metadata": {"total_size": 1}, "weight_map": wm}).encode())
    return sd, f"http://127.0.0.1:{server.port}/{prefix}"


def test_http_hf_index_directory(server):
    sd, base = _hf_dir(server, "hf")
    for url in (base + "/", base, base + "/model.safetensors.index.json"):
        assert _eq(ck.load(url), sd), url
    with ck.safe_open(base + "/") as f:
        assert torch.equal(f.get_slice("emb.weight")[3:5], sd["emb.weight"][3:5])
    # every range is conditional on the ETag its object had when opened
    reads = [g for g in server.gets() if g[1] and not g[1].startswith("bytes=0-")]
    assert all(im is not None and im.startswith('"v') for _, _, im in reads)


def test_http_shard_replaced_during_load_is_an_error(server, monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "4K")
    sd, base = _hf_dir(server, "hf2", big=100_000)   # past the 64 KiB an open fetches
    with ck.safe_open(base + "/") as f:
        name = "model-00001-of-00002.safetensors"
        server.put(f"hf2/{name}", st_torch.save({"emb.weight": sd["emb.weight"] * 2, "step": sd["step"]}))
        with pytest.raises(FerryError) as ei:
            f.get_tensor("emb.weight")
        assert f"{base}/{name}" in str(ei.value) and "changed since it was opened" in str(ei.value)


# ---------------------------------------------------------------------------
# ferry info
# ---------------------------------------------------------------------------
def _ferry_cli():
    exe = os.path.join(ROOT, "build", "ferry")
    if not os.path.exists(exe):
        pytest.skip("build/ferry is not built (make cli)")
    return exe


def test_ferry_info_on_remote_checkpoints(server, signed):
    exe = _ferry_cli()
    sd, base = _hf_dir(server, "info")
    out = subprocess.run([exe, "info", base + "/"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "safetensors, 4 variables" in out.stdout and "4 tensors" in out.stdout and "in 2 files" in out.stdout
    assert base + "/model-00002-of-00002.safetensors" in out.stdout
    out = subprocess.run([exe, "info", "--json", base + "/model.safetensors.index.json"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    js = json.loads(out.stdout)
    assert {v["name"] for v in js["variables"]} == set(sd)
    ck.save(sd, "s3://data/i/model.safetensors")
    out = subprocess.run([exe, "info", "s3://data/i/"], capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert "4 tensors" in out.stdout and "emb.weight" in out.stdout
