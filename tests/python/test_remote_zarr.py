"""Zarr stores, netCDF-3 files and globs over URLs: moto's S3 server and the
loopback range server (tests/python/rangeserver.py), both on 127.0.0.1, started
and stopped here. The stores are written by zarr-python (v3 zstd, v2 blosc) into
a local directory and uploaded object by object (boto3), so each value read
remotely is compared with what zarr-python reads locally."""
import io
import json
import os
import pathlib

import numpy as np
import pytest

ferry = pytest.importorskip("ferry")
zarr = pytest.importorskip("zarr")
from ferry import FerryError  # noqa: E402
from ferry._remote import remote_context  # noqa: E402
from rangeserver import RangeServer, ferry_reads_urls  # noqa: E402
from remote_servers import s3  # noqa: E402,F401  (the fixture)

pytestmark = pytest.mark.skipif(not ferry_reads_urls(), reason="ferry was built without libcurl (no remote objects)")


@pytest.fixture
def web(monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_RETRY_SECONDS", "10")
    monkeypatch.setenv("FERRY_REMOTE_STALL_SECONDS", "2")
    s = RangeServer().start()

    def upload(local, prefix):
        for p in sorted(pathlib.Path(local).rglob("*")):
            if p.is_file():
                s.put(f"{prefix}/{p.relative_to(local).as_posix()}", p.read_bytes())
        return f"http://127.0.0.1:{s.port}/{prefix}"
    s.upload = upload
    yield s
    s.stop()


def write_store(path, fmt, consolidated=False):
    """Two arrays with dimension names, partly written (missing chunks read as the
    fill value), v3 zstd with "/" chunk keys or v2 blosc-lz4 with "." keys."""
    import numcodecs
    g = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    comp = dict(compressors=[zarr.codecs.ZstdCodec(level=3)]) if fmt == 3 else \
        dict(compressors=numcodecs.Blosc(cname="lz4", shuffle=1))
    dims = dict(dimension_names=["t", "x"]) if fmt == 3 else {}
    t = g.create_array("temp", shape=(50, 40), chunks=(16, 16), dtype="f4", fill_value=np.nan, **comp, **dims)
    t[:40] = np.arange(40 * 40, dtype="f4").reshape(40, 40)
    c = g.create_array("count", shape=(50,), chunks=(8,), dtype="<i8", compressors=None, fill_value=-7,
                       **({"dimension_names": ["t"]} if fmt == 3 else {}))
    c[:20] = np.arange(20)
    if fmt == 2:
        t.attrs["_ARRAY_DIMENSIONS"] = ["t", "x"]
        c.attrs["_ARRAY_DIMENSIONS"] = ["t"]
    if consolidated:
        zarr.consolidate_metadata(str(path))
    return zarr.open_group(str(path), mode="r")


@pytest.mark.parametrize("fmt", [3, 2])
def test_s3_store_without_consolidated_metadata(s3, tmp_path, fmt):
    ref = write_store(tmp_path / "s", fmt)
    s3.upload(tmp_path / "s", "stores/s.zarr")
    s3.lock()   # from here on every request must be signed with the reader's key
    ctx = remote_context(s3.options)
    ds = ferry.Dataset(ctx, "s3://data/stores/s.zarr")
    assert ds.format == "zarr" and not ds.store_info["consolidated"]
    assert sorted(v["name"] for v in ds.variables()) == ["count", "temp"]
    for name in ("temp", "count"):
        with ferry.open("s3://data/stores/s.zarr", ctx=ctx) as f:
            np.testing.assert_array_equal(f.read(name), ref[name][...])
            np.testing.assert_array_equal(f.read(name, (slice(3, 45, 2),) + (() if name == "count" else (slice(5, 30),))),
                                          ref[name][3:45:2] if name == "count" else ref[name][3:45:2, 5:30])
    # ferry.read and ferry.open take the same storage_options
    np.testing.assert_array_equal(ferry.read("s3://data/stores/s.zarr", "temp", storage_options=s3.options),
                                  ref["temp"][...])
    with ferry.open("s3://data/stores/s.zarr", storage_options=s3.options) as f:
        np.testing.assert_array_equal(f.read("count"), ref["count"][...])
    with pytest.raises(ValueError, match="not both"):
        ferry.read("s3://data/stores/s.zarr", "temp", ctx=ctx, storage_options=s3.options)
    # a wrong secret: moto refuses the signature, and the error says so
    with pytest.raises(FerryError) as ei:
        ferry.Dataset(remote_context(dict(s3.options, secret="wrong")), "s3://data/stores/s.zarr/")
    assert "s3://data/stores/s.zarr" in str(ei.value) and "403" in str(ei.value)


@pytest.mark.parametrize("fmt", [3, 2])
def test_xarray_s3_equals_local(s3, tmp_path, fmt):
    xr = pytest.importorskip("xarray")
    write_store(tmp_path / "s", fmt)
    s3.upload(tmp_path / "s", "x.zarr")
    s3.lock()
    local = xr.open_dataset(tmp_path / "s", engine="zarr")
    remote = xr.open_dataset("s3://data/x.zarr", engine="ferry", storage_options=s3.options)
    xr.testing.assert_identical(remote.load(), local.load())
    # a pickled store carries its storage_options: reopened afresh (a new process's view)
    import pickle
    from ferry.xarray import store as st
    st._STORES.clear()
    st._RECENT.clear()
    lazy = xr.open_dataset("s3://data/x.zarr", engine="ferry", storage_options=s3.options)
    blob = pickle.dumps(lazy)
    st._STORES.clear()
    st._RECENT.clear()
    again = pickle.loads(blob)
    xr.testing.assert_identical(again.load(), local.load())
    # fsspec / s3fs spellings of the same options
    so = {"key": s3.options["key"], "secret": s3.options["secret"],
          "client_kwargs": {"endpoint_url": s3.endpoint, "region_name": "us-east-1"},
          "config_kwargs": {"s3": {"addressing_style": "path"}}}
    remote = xr.open_dataset("s3://data/x.zarr", engine="ferry", storage_options=so)
    np.testing.assert_array_equal(remote["temp"].values, local["temp"].values)


def test_storage_options_are_checked_by_c(s3):
    with pytest.raises(FerryError, match="unknown remote option \"endpont_url\""):
        remote_context({"endpont_url": s3.endpoint})
    with pytest.raises(FerryError, match="addressing"):
        remote_context({"endpoint_url": s3.endpoint, "addressing_style": "sideways"})
    with pytest.raises(FerryError, match="ca_bundle"):
        remote_context({"client_kwargs": {"verify": "/no/such/bundle.pem"}})


@pytest.mark.parametrize("fmt", [3, 2])
def test_http_consolidated_store_and_xarray(web, tmp_path, fmt):
    xr = pytest.importorskip("xarray")
    write_store(tmp_path / "s", fmt, consolidated=True)
    url = web.upload(tmp_path / "s", f"c{fmt}.zarr")
    local = xr.open_dataset(tmp_path / "s", engine="zarr")
    remote = xr.open_dataset(url, engine="ferry", consolidated=True)
    xr.testing.assert_identical(remote.load(), local.load())


def test_http_store_without_consolidated_metadata_says_so(web, tmp_path):
    write_store(tmp_path / "s", 3)
    url = web.upload(tmp_path / "s", "plain.zarr")
    with pytest.raises(FerryError) as ei:
        ferry.Dataset(ferry.default_context(), url)
    assert url in str(ei.value) and "consolidated" in str(ei.value)


def test_http_chunk_errors_name_url_and_status(web, tmp_path, monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_RETRIES", "2")
    write_store(tmp_path / "s", 3, consolidated=True)
    url = web.upload(tmp_path / "s", "e.zarr")
    with ferry.open(url) as f:   # the metadata is read; then every chunk object's open fails
        web.open_faults[:] = [500] * 50
        with pytest.raises(FerryError) as ei:
            f.read("temp")
    msg = str(ei.value)
    assert f"{url}/temp/c/" in msg and "500" in msg, msg


def test_http_chunk_replaced_mid_read(web, tmp_path, monkeypatch):
    # one uncompressed chunk of 800 KB read in 64 KiB ranges: replaced between
    # two ranges, it is an error naming its URL, never a mix of two versions
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "64K")
    g = zarr.open_group(str(tmp_path / "s"), mode="w", zarr_format=3)
    a = g.create_array("big", shape=(100_000,), chunks=(100_000,), dtype="<f8", compressors=None)
    a[:] = np.arange(100_000, dtype="<f8")
    zarr.consolidate_metadata(str(tmp_path / "s"))
    url = web.upload(tmp_path / "s", "r.zarr")
    web.faults[:] = [None, None, "replace"]
    with pytest.raises(FerryError) as ei:
        ferry.read(url, "big", device="cpu")
    assert f"{url}/big/c/0" in str(ei.value) and "changed" in str(ei.value)


def test_http_netcdf3_xarray(web, tmp_path):
    xr = pytest.importorskip("xarray")
    pytest.importorskip("scipy")
    ds = xr.Dataset({"v": (("t", "x"), np.arange(60, dtype="f8").reshape(6, 10))}, coords={"t": np.arange(6)})
    ds.to_netcdf(tmp_path / "a.nc", engine="scipy")
    url = web.put("a.nc", (tmp_path / "a.nc").read_bytes())
    xr.testing.assert_identical(xr.open_dataset(url, engine="ferry").load(), ds)


def test_listing_pages_and_globs(s3, tmp_path):
    # 1,200 chunk objects in one "directory": ListObjectsV2 pages of 1,000
    import numcodecs
    g = zarr.open_group(str(tmp_path / "s"), mode="w", zarr_format=2)
    a = g.create_array("many", shape=(3000,), chunks=(1000,), dtype="<i4", compressors=None, fill_value=0)
    a[:] = np.arange(3000, dtype="<i4")
    b = g.create_array("zipped", shape=(2600,), chunks=(2,), dtype="<i4", compressors=numcodecs.Zlib(1), fill_value=0)
    b[:2400] = np.arange(2400, dtype="<i4")
    s3.upload(tmp_path / "s", "p.zarr")
    s3.lock()
    ctx = remote_context(s3.options)
    with ferry.open("s3://data/p.zarr", ctx=ctx) as f:
        np.testing.assert_array_equal(f.read("many"), np.arange(3000))
        np.testing.assert_array_equal(f.read("zipped"), np.r_[np.arange(2400), np.zeros(200)].astype("<i4"))
    urls = ctx.url_glob("s3://data/p.zarr/zipped/1*")
    want = sorted(f"s3://data/p.zarr/zipped/{i}" for i in range(1200) if str(i).startswith("1"))
    assert urls == want
    assert len(ctx.url_glob("s3://data/p.zarr/**/.zarray")) == 2
    assert ctx.url_glob("s3://data/p.zarr/none*") == []


def test_ferry_info_urls(web, s3, tmp_path, monkeypatch):
    """`ferry info URL`: a Zarr store (a prefix of objects) and a single object, at a web
    server and in a bucket (the environment's endpoint and keys)."""
    import subprocess
    cli = pathlib.Path(os.environ.get("FERRY_BIN", pathlib.Path(__file__).resolve().parents[2] / "build" / "ferry"))
    if not cli.exists():
        pytest.skip("the ferry command is not built (make cli)")
    write_store(tmp_path / "s", 3, consolidated=True)
    url = web.upload(tmp_path / "s", "i.zarr")
    np.save(tmp_path / "a.npy", np.arange(10.0))
    one = web.put("a.npy", (tmp_path / "a.npy").read_bytes())
    s3.upload(tmp_path / "s", "i.zarr")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.options["secret"])
    s3.lock()

    def info(arg):
        return subprocess.run([str(cli), "info", arg], capture_output=True, text=True, timeout=120)
    for store in (url, url + "/", "s3://data/i.zarr"):
        r = info(store)
        assert r.returncode == 0, r.stderr
        assert "zarr, 2 variables" in r.stdout and "temp" in r.stdout and "zstd" in r.stdout, r.stdout
    r = info(one)
    assert r.returncode == 0 and "npy, 1 variable" in r.stdout, r.stdout + r.stderr
    r = info(url.replace("i.zarr", "none.zarr"))
    assert r.returncode != 0 and "none.zarr" in r.stderr and "404" in r.stderr, r.stderr


def test_s3_sharded_store(s3, tmp_path):
    # sharding_indexed: each shard object's index read by a range request, its
    # size from the listing; an absent shard is the fill value
    g = zarr.open_group(str(tmp_path / "s"), mode="w", zarr_format=3)
    a = g.create_array("sh", shape=(64, 64), chunks=(8, 8), shards=(32, 32), dtype="<u2", fill_value=9,
                       compressors=[zarr.codecs.ZstdCodec(level=1)])
    a[:40] = np.arange(40 * 64, dtype="<u2").reshape(40, 64)
    s3.upload(tmp_path / "s", "sh.zarr")
    s3.lock()
    ctx = remote_context(s3.options)
    ref = zarr.open_group(str(tmp_path / "s"), mode="r")["sh"][...]
    with ferry.open("s3://data/sh.zarr", ctx=ctx) as f:
        np.testing.assert_array_equal(f.read("sh"), ref)
        np.testing.assert_array_equal(f.read("sh", (slice(30, 50), slice(3, 61, 4))), ref[30:50, 3:61:4])


class _GCS:
    """GCS's public endpoint as anonymous clients see it: objects at /BUCKET/KEY
    (Range, ETag) and the JSON list at /storage/v1/b/BUCKET/o (prefix, delimiter,
    pageToken; pages of at most 2 names, so that every listing has several)."""

    def __init__(self, objects):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import parse_qs, unquote, urlsplit
        self.objects, self.lists = objects, []
        gcs = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def send(self, status, body, headers=()):
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                u = urlsplit(self.path)
                if self.headers.get("Authorization"):
                    return self.send(400, b"anonymous only here")
                if u.path.startswith("/storage/v1/b/data/o"):
                    q = {k: v[0] for k, v in parse_qs(u.query).items()}
                    gcs.lists.append(q)
                    pre, delim, start = q.get("prefix", ""), q.get("delimiter"), int(q.get("pageToken", "0"))
                    names = sorted(k for k in gcs.objects if k.startswith(pre))
                    items, prefixes = [], set()
                    for k in names:
                        rest = k[len(pre):]
                        if delim and delim in rest:
                            prefixes.add(pre + rest.split(delim)[0] + delim)
                        else:
                            items.append(k)
                    entries = [("p", p) for p in sorted(prefixes)] + [("i", k) for k in items]
                    page = entries[start:start + 2]
                    body = {"kind": "storage#objects",
                            "items": [{"name": k, "size": str(len(gcs.objects[k]))} for t, k in page if t == "i"],
                            "prefixes": [k for t, k in page if t == "p"]}
                    if start + 2 < len(entries):
                        body["nextPageToken"] = str(start + 2)
                    return self.send(200, json.dumps(body).encode(), [("Content-Type", "application/json")])
                key = unquote(u.path[len("/data/"):]) if u.path.startswith("/data/") else None
                data = gcs.objects.get(key)
                if data is None:
                    return self.send(404, b"<Error><Code>NoSuchKey</Code></Error>")
                lo, hi = 0, len(data) - 1
                rng = self.headers.get("Range")
                if rng:
                    a, b = rng.split("=")[1].split("-")
                    lo, hi = int(a), min(int(b), len(data) - 1)
                    if lo >= len(data):
                        return self.send(416, b"", [("Content-Range", f"bytes */{len(data)}")])
                hdr = [("ETag", '"e1"')] + ([("Content-Range", f"bytes {lo}-{hi}/{len(data)}")] if rng else [])
                self.send(206 if rng else 200, data[lo:hi + 1], hdr)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_gs_anonymous_store_and_glob(tmp_path, monkeypatch):
    for k in ("GS_ACCESS_KEY_ID", "GS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k, raising=False)
    ref = write_store(tmp_path / "s", 2)
    objects = {f"g.zarr/{p.relative_to(tmp_path / 's').as_posix()}": p.read_bytes()
               for p in sorted((tmp_path / "s").rglob("*")) if p.is_file()}
    for i in range(5):
        buf = io.BytesIO()
        np.save(buf, np.full(3, i))
        objects[f"shards/part{i}.npy"] = buf.getvalue()
    gcs = _GCS(objects)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
        ctx = ferry.default_context()
        with ferry.open("gs://data/g.zarr") as f:   # no consolidated metadata: listed through the JSON API
            for name in ("temp", "count"):
                np.testing.assert_array_equal(f.read(name), ref[name][...])
        assert any(q.get("delimiter") == "/" and q.get("pageToken") for q in gcs.lists)   # several pages
        assert ctx.url_glob("gs://data/shards/part*.npy") == [f"gs://data/shards/part{i}.npy" for i in range(5)]
    finally:
        gcs.stop()


def test_s3_chunks_in_many_directories(s3, tmp_path):
    # v3 keys c/<t>/0: one directory per time step. A few steps: each directory
    # listed; many steps, a small part of the array: the chunk objects opened at
    # once; most of the array: one listing of its keys. The same values each way.
    g = zarr.open_group(str(tmp_path / "s"), mode="w", zarr_format=3)
    a = g.create_array("t", shape=(40, 6), chunks=(1, 6), dtype="<f8", fill_value=-1.0,
                       compressors=[zarr.codecs.ZstdCodec(level=1)])
    a[:36] = np.arange(36 * 6, dtype="<f8").reshape(36, 6)
    s3.upload(tmp_path / "s", "d.zarr")
    s3.lock()
    ref = zarr.open_group(str(tmp_path / "s"), mode="r")["t"][...]
    with ferry.open("s3://data/d.zarr", storage_options=s3.options) as f:
        for sel in ((slice(3, 5),), (slice(30, 39),), (slice(None),), (slice(0, 40, 3),)):
            np.testing.assert_array_equal(f.read("t", sel), ref[sel])


def test_https_store_with_a_ca_bundle(tmp_path, monkeypatch):
    """TLS with a self-signed certificate: refused by default (verification is always
    on), read with storage_options={"ca_bundle": ...} (or fsspec's client_kwargs verify)."""
    import shutil
    import ssl
    import subprocess
    xr = pytest.importorskip("xarray")
    if not shutil.which("openssl"):
        pytest.skip("no openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       capture_output=True, timeout=60)
    if r.returncode:
        pytest.skip("openssl could not make a certificate: " + r.stderr.decode(errors="replace")[-200:])
    monkeypatch.setenv("FERRY_REMOTE_RETRY_SECONDS", "5")
    s = RangeServer()
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    s.httpd.socket = tls.wrap_socket(s.httpd.socket, server_side=True)
    s.start()
    try:
        write_store(tmp_path / "s", 3, consolidated=True)
        for p in sorted((tmp_path / "s").rglob("*")):
            if p.is_file():
                s.put(f"t.zarr/{p.relative_to(tmp_path / 's').as_posix()}", p.read_bytes())
        url = f"https://127.0.0.1:{s.port}/t.zarr"
        local = xr.open_dataset(tmp_path / "s", engine="zarr").load()
        with pytest.raises(FerryError) as ei:
            xr.open_dataset(url, engine="ferry")
        assert "127.0.0.1" in str(ei.value) and "certificate" in str(ei.value).lower(), str(ei.value)
        for so in ({"ca_bundle": str(cert)}, {"client_kwargs": {"verify": str(cert)}}):
            xr.testing.assert_identical(xr.open_dataset(url, engine="ferry", storage_options=so).load(), local)
    finally:
        s.stop()


def test_gs_hmac_keys_list_through_the_s3_api(s3, tmp_path, monkeypatch):
    # gs:// with HMAC keys: GCS's S3-compatible API, ListObjectsV2 signed (moto checks)
    ref = write_store(tmp_path / "s", 3)
    s3.upload(tmp_path / "s", "h.zarr")
    s3.lock()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", s3.endpoint)
    monkeypatch.setenv("GS_ACCESS_KEY_ID", s3.options["key"])
    monkeypatch.setenv("GS_SECRET_ACCESS_KEY", s3.options["secret"])
    with ferry.open("gs://data/h.zarr") as f:
        np.testing.assert_array_equal(f.read("temp"), ref["temp"][...])
    assert ferry.default_context().url_glob("gs://data/h.zarr/*/zarr.json") == [
        "gs://data/h.zarr/count/zarr.json", "gs://data/h.zarr/temp/zarr.json"]


def test_http_netcdf4_reads_as_the_local_file(web, tmp_path):
    """netCDF-4 at a URL: the C parser reads its metadata and chunks by range requests, equal to
    netcdf4 on the local file, variable-length strings too (their global heap by range
    requests); a variable only h5py reads (a variable-length sequence) is an error naming it
    when read, not a silent gap, the rest of the file read."""
    xr = pytest.importorskip("xarray")
    h5py = pytest.importorskip("h5py")
    pytest.importorskip("netCDF4")
    rng = np.random.default_rng(4)
    local = xr.Dataset({"t": (("time", "y", "x"), rng.random((6, 20, 30)).astype("f4")),
                        "n": ("time", np.arange(6, dtype="i8"))}, coords={"time": np.arange(6)},
                       attrs={"title": "remote"})
    p = tmp_path / "b.nc"
    local.to_netcdf(p, engine="netcdf4", encoding={"t": {"zlib": True, "shuffle": True, "chunksizes": (1, 20, 30)}})
    url = web.put("b.nc", p.read_bytes())
    with xr.open_dataset(p, engine="netcdf4") as d:
        want = d.load()
    got = xr.open_dataset(url, engine="ferry").load()
    xr.testing.assert_identical(got, want)
    import netCDF4
    p = tmp_path / "s.nc"
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("n", 3000)
        nc.createVariable("t", "f4", ("n",))[:] = np.arange(3000.0)
        nc.createVariable("names", str, ("n",), zlib=True, chunksizes=(1000,))[:] = \
            np.array([f"name {i} \u00e9" * (i % 4) for i in range(3000)], object)
        nc.createVariable("label", str, ())[0] = "remote text"
    with h5py.File(p, "a") as f:
        r = f.create_dataset("ragged", shape=(2,), dtype=h5py.vlen_dtype(np.int32))
        r[0] = np.array([1, 2], np.int32)
    url = web.put("s.nc", p.read_bytes())
    ds = xr.open_dataset(url, engine="ferry")
    with xr.open_dataset(p, engine="netcdf4", drop_variables=["ragged"]) as d:
        want = d.load()
    xr.testing.assert_identical(ds.drop_vars("ragged").load(), want)
    assert ds["names"].values.tolist() == want["names"].values.tolist()
    with pytest.raises(FerryError, match="ragged.*opens local files only"):
        ds["ragged"].values