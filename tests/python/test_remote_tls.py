"""https:// objects: the server's certificate is verified, always.

The test makes its own certificate authority and a server certificate it
signs (Python's `cryptography`), and serves objects over TLS from the loopback
range server (rangeserver.py). Unknown to the system's CAs, the server is
refused at the handshake with an error naming the URL and how to trust it;
FERRY_REMOTE_CA_BUNDLE (or CURL_CA_BUNDLE, SSL_CERT_FILE) naming the test's CA
makes the same reads pass, byte for byte: from the range server, Debian's nginx, and moto's
S3 server behind a TLS-terminating proxy (reads and multipart saves)."""
import datetime
import io
import ipaddress
import os
import ssl
import time

import numpy as np
import pytest

ferry = pytest.importorskip("ferry")
from ferry import FerryError  # noqa: E402
from rangeserver import RangeServer, ferry_reads_urls  # noqa: E402
from tcpproxy import TCPProxy  # noqa: E402
from remote_servers import moto_s3, start_nginx  # noqa: E402,F401  (a fixture)

pytestmark = pytest.mark.skipif(not ferry_reads_urls(), reason="ferry was built without libcurl (no remote objects)")

# every variable that may name a CA bundle: each test sets the one it means
BUNDLE_VARS = ("FERRY_REMOTE_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE")


def _make_ca(d, name):
    """A certificate authority: (its PEM path, key, subject)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    path = d / f"{name.replace(' ', '_')}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, key, subject, cert


def _make_server_cert(d, ca, names, stem):
    """A server certificate for names (IPs or DNS names) signed by ca:
    (chain PEM path, key PEM path)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    _, ca_key, ca_subject, ca_cert = ca
    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n) for n in names]
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    chain, keyfile = d / f"{stem}.pem", d / f"{stem}.key"
    chain.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + ca_cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return str(chain), str(keyfile)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = _make_ca(d, "ferry test CA")
    other = _make_ca(d, "another CA")

    class P:
        pass
    p = P()
    p.ca, p.other_ca = str(ca[0]), str(other[0])
    p.server = _make_server_cert(d, ca, ["127.0.0.1"], "server")
    p.localhost_only = _make_server_cert(d, ca, ["localhost"], "localhost")
    return p


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_RETRY_SECONDS", "20")
    monkeypatch.setenv("FERRY_REMOTE_STALL_SECONDS", "2")
    for v in BUNDLE_VARS:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


@pytest.fixture
def tls_server(pki, clean_env):
    s = RangeServer(tls=pki.server).start()
    yield s
    s.stop()


def npy_bytes(a):
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def test_untrusted_server_is_refused_naming_url_and_the_cure(tls_server):
    a = np.arange(100_000, dtype=np.int32)
    url = tls_server.put("a.npy", npy_bytes(a))
    assert url.startswith("https://")
    t0 = time.monotonic()
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu")
    msg = str(ei.value)
    assert url in msg and "certificate was not trusted" in msg and "FERRY_REMOTE_CA_BUNDLE" in msg, msg
    assert "self-signed certificate" in msg, msg   # libcurl's own words, kept
    # a verdict, not a fault to retry: refused at once, and no request reached the server
    assert time.monotonic() - t0 < 5
    assert tls_server.gets() == []


def test_ca_bundle_makes_it_pass(tls_server, pki, clean_env):
    clean_env.setenv("FERRY_REMOTE_CA_BUNDLE", pki.ca)
    clean_env.setenv("FERRY_REMOTE_REQUEST_SIZE", "64K")
    clean_env.setenv("FERRY_REMOTE_CONNECTIONS", "4")
    a = np.random.default_rng(0).standard_normal((400, 300))
    url = tls_server.put("b.npy", npy_bytes(a))
    for _ in range(2):
        np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)
    with ferry.open(url) as f:
        np.testing.assert_array_equal(f.read(None, (slice(100, 140), slice(7, 90))), a[100:140, 7:90])
    reads = [g for g in tls_server.gets() if g[1] != "bytes=0-65535"]
    assert len(reads) >= 2 * (len(npy_bytes(a)) - 65536) // 65536   # many ranges, each over TLS
    assert all(im is not None for _, _, im in reads)                 # each pinned to the version
    assert len(tls_server.peers) <= 10   # TLS connections kept and reused, not one handshake per range


@pytest.mark.parametrize("var", ["CURL_CA_BUNDLE", "SSL_CERT_FILE"])
def test_standard_variables_are_honoured(tls_server, pki, clean_env, var):
    clean_env.setenv(var, pki.ca)
    a = np.arange(5000, dtype=np.uint16)
    url = tls_server.put("c.npy", npy_bytes(a))
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)


def test_ferry_variable_comes_first(tls_server, pki, clean_env):
    url = tls_server.put("d.npy", npy_bytes(np.arange(10)))
    clean_env.setenv("CURL_CA_BUNDLE", pki.ca)            # would trust it ...
    clean_env.setenv("FERRY_REMOTE_CA_BUNDLE", pki.other_ca)  # ... but ours names another CA
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu")
    msg = str(ei.value)
    assert url in msg and "not trusted by the CA bundle " + pki.other_ca in msg and "(FERRY_REMOTE_CA_BUNDLE)" in msg, msg
    assert "add the certificate of the CA that signed it" in msg, msg
    clean_env.setenv("FERRY_REMOTE_CA_BUNDLE", pki.ca)
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), np.arange(10))


def test_ca_bundle_option_comes_before_the_variables(tls_server, pki, clean_env):
    """storage_options={"ca_bundle": ...} (a context's remote option) wins over
    FERRY_REMOTE_CA_BUNDLE, and a refusal names the option."""
    a = np.arange(100, dtype=np.int64)
    url = tls_server.put("o.npy", npy_bytes(a))
    clean_env.setenv("FERRY_REMOTE_CA_BUNDLE", pki.other_ca)
    np.testing.assert_array_equal(ferry.read(url, device="cpu", storage_options={"ca_bundle": pki.ca}), a)
    clean_env.setenv("FERRY_REMOTE_CA_BUNDLE", pki.ca)
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu", storage_options={"ca_bundle": pki.other_ca})
    msg = str(ei.value)
    assert url in msg and "not trusted by the CA bundle " + pki.other_ca + " (the ca_bundle option)" in msg, msg


def test_certificate_for_another_name_is_refused(pki, clean_env):
    clean_env.setenv("FERRY_REMOTE_CA_BUNDLE", pki.ca)
    s = RangeServer(tls=pki.localhost_only).start()
    try:
        url = s.put("e.npy", npy_bytes(np.arange(10)))   # https://127.0.0.1:...; the certificate says localhost
        with pytest.raises(FerryError) as ei:
            ferry.read(url, device="cpu")
        msg = str(ei.value)
        assert url in msg and "does not name this host" in msg and "127.0.0.1" in msg, msg
        assert s.gets() == []
    finally:
        s.stop()


def test_bad_bundle_paths_are_named(tls_server, pki, clean_env, tmp_path):
    url = tls_server.put("f.npy", npy_bytes(np.arange(10)))
    for bad, words in [(tmp_path / "missing.pem", "No such file"), (tmp_path, "not a file")]:
        clean_env.setenv("FERRY_REMOTE_CA_BUNDLE", str(bad))
        with pytest.raises(FerryError) as ei:
            ferry.read(url, device="cpu")
        assert f'FERRY_REMOTE_CA_BUNDLE="{bad}"' in str(ei.value) and words in str(ei.value), str(ei.value)
    # the environment's names are not ferry's to refuse up front: the request that fails on one names it
    clean_env.delenv("FERRY_REMOTE_CA_BUNDLE")
    clean_env.setenv("CURL_CA_BUNDLE", str(tmp_path / "missing.pem"))
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu")
    msg = str(ei.value)
    assert url in msg and "could not be read" in msg and "CURL_CA_BUNDLE" in msg, msg
    # not a PEM file at all: trusted by nothing
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    clean_env.delenv("CURL_CA_BUNDLE")
    clean_env.setenv("FERRY_REMOTE_CA_BUNDLE", str(junk))
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu")
    assert url in str(ei.value) and str(junk) in str(ei.value), str(ei.value)


@pytest.fixture
def nginx_tls(pki, clean_env, tmp_path):
    """Debian's nginx serving tmp_path/www over HTTPS with the test's certificate."""
    with start_nginx(tmp_path, tls=pki.server, access_log=True) as served:
        yield served


def test_nginx_over_tls(nginx_tls, pki, clean_env):
    """A real web server over HTTPS: refused untrusted, read whole once its CA
    is named, each range pinned to the version (nginx's ETag) opened."""
    www, base = nginx_tls
    a = np.random.default_rng(2).standard_normal((1000, 300))
    np.save(www / "a.npy", a)
    url = base + "/a.npy"
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu")
    assert url in str(ei.value) and "certificate was not trusted" in str(ei.value)
    clean_env.setenv("FERRY_REMOTE_CA_BUNDLE", pki.ca)
    clean_env.setenv("FERRY_REMOTE_REQUEST_SIZE", "128K")
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)
    with ferry.open(url) as f:
        np.save(www / "a.npy", a * 2)   # rewritten in place, same size, another mtime: another ETag
        os.utime(www / "a.npy", (time.time() + 5, time.time() + 5))
        with pytest.raises(FerryError) as ei:
            f.read(None, slice(500, 600))
        assert url in str(ei.value) and "changed since it was opened" in str(ei.value)
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), a * 2)


def test_nginx_netcdf4_strings_over_tls(nginx_tls, pki, clean_env):
    """netCDF-4 string variables at an https URL: references and global heap read by range
    requests, equal to netcdf4 on the local file (h5py, which opens local files only, is not
    needed)."""
    xr = pytest.importorskip("xarray")
    netCDF4 = pytest.importorskip("netCDF4")
    www, base = nginx_tls
    clean_env.setenv("FERRY_REMOTE_CA_BUNDLE", pki.ca)
    p = www / "s.nc"
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("n", 5000)
        nc.createVariable("names", str, ("n",), zlib=True, chunksizes=(1000,))[:] = \
            np.array([f"station {i} \u00e9" * (i % 3) for i in range(5000)], object)
        nc.createVariable("v", "f4", ("n",))[:] = np.arange(5000.0)
    got = xr.open_dataset(base + "/s.nc", engine="ferry").load()
    with xr.open_dataset(p, engine="netcdf4") as want:
        xr.testing.assert_identical(got, want.load())


@pytest.fixture
def s3_over_tls(moto_s3, pki, clean_env):
    """moto's S3 server behind a TLS-terminating proxy: AWS_ENDPOINT_URL is https://."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*pki.server)
    p = TCPProxy(int(moto_s3.endpoint.rsplit(":", 1)[1]), tls=ctx)
    clean_env.setenv("AWS_ENDPOINT_URL", f"https://127.0.0.1:{p.port}")
    yield moto_s3
    p.stop()


def test_s3_reads_and_torch_saves_over_tls(s3_over_tls, pki, clean_env):
    """s3:// through an https:// endpoint: reads and multipart uploads (the
    checkpoint saves) verify the endpoint's certificate against the same bundle."""
    torch = pytest.importorskip("torch")
    from ferry import checkpoint as ck
    a = np.arange(50_000, dtype=np.float32)
    s3_over_tls.s3.put_object(Bucket="data", Key="t/a.npy", Body=npy_bytes(a))   # boto3: moto's plain port
    sd = {"w": torch.arange(3_000_000, dtype=torch.float32).reshape(-1, 1000), "b": torch.ones(7)}
    with pytest.raises(FerryError) as ei:
        ferry.read("s3://data/t/a.npy", device="cpu")
    assert "s3://data/t/a.npy" in str(ei.value) and "certificate was not trusted" in str(ei.value), str(ei.value)
    with pytest.raises(FerryError) as ei:
        ck.save(sd, "s3://data/t/m.safetensors")
    assert "s3://data/t/m.safetensors" in str(ei.value) and "FERRY_REMOTE_CA_BUNDLE" in str(ei.value), str(ei.value)
    with pytest.raises(FerryError) as ei:   # a listing (globs) is refused the same way
        ferry.default_context().url_glob("s3://data/t/*.npy")
    assert "certificate" in str(ei.value), str(ei.value)
    clean_env.setenv("FERRY_REMOTE_CA_BUNDLE", pki.ca)
    np.testing.assert_array_equal(ferry.read("s3://data/t/a.npy", device="cpu"), a)
    assert ferry.default_context().url_glob("s3://data/t/*.npy") == ["s3://data/t/a.npy"]
    clean_env.setenv("FERRY_REMOTE_PART_SIZE", "5M")
    ck.save(sd, "s3://data/t/m.safetensors")   # 12 MB: a multipart upload of 3 parts
    etag = s3_over_tls.s3.head_object(Bucket="data", Key="t/m.safetensors")["ETag"]
    assert etag.endswith('-3"'), etag          # each part over TLS
    back = ck.load("s3://data/t/m.safetensors")
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)
