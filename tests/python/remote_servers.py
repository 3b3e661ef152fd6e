"""The servers the remote tests read from, started once here and imported by every
test_remote*.py (and the image-shard tests over URLs) as pytest fixtures:

  moto_s3   moto's S3 server on 127.0.0.1, bucket "data"; the environment holds its
            endpoint (AWS_ENDPOINT_URL) and moto's default keys, as a training job's would.
            .s3 / .client (boto3), .endpoint, .key (an IAM user's keys), .options
            (storage_options with that user's keys), .reset_auth(n), .lock(), .upload().
  s3        the same server with nothing in the environment: storage_options (.options)
            must carry the endpoint and keys; .lock() makes moto check every signature.
  nginx     Debian's nginx serving tmp_path/www over HTTP: (www, base URL).

start_nginx() also serves HTTPS (test_remote_tls.py's fixture passes its certificate)."""
import json
import os
import pathlib
import shutil
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager

import pytest


def _moto_post(endpoint, path, body):
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/{path}", data=body.encode(), method="POST",
                                                  headers={"Content-Type": "text/plain"}), timeout=60).read()


class _Moto:
    """What a test needs of a running moto server."""

    def __init__(self, endpoint, client, key):
        self.endpoint, self.client, self.key = endpoint, client, key
        self.s3 = client                  # the name test_remote.py's tests use
        self.options = {"endpoint_url": endpoint, "key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}

    def user_client(self):
        """A boto3 client signing with the IAM user's keys (moto refuses its default ones once
        lock() has it checking signatures)."""
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.key["AccessKeyId"], aws_secret_access_key=self.key["SecretAccessKey"])

    def reset_auth(self, n):
        """moto checks signatures after n more requests ("0": from now on; "inf": never)."""
        _moto_post(self.endpoint, "reset-auth", n)

    def lock(self):
        self.reset_auth("0")

    def put(self, key, data, bucket="data"):
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def upload(self, local, prefix, bucket="data"):
        """Every file under local to s3://bucket/prefix/ (its relative path the rest of the key)."""
        for p in sorted(pathlib.Path(local).rglob("*")):
            if p.is_file():
                self.client.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(local).as_posix()}")


@contextmanager
def start_moto(monkeypatch, tmp_path, env_credentials):
    """moto's S3 server with bucket "data" and an IAM user allowed s3:* (its keys sign once
    reset_auth starts checking). env_credentials: AWS_ENDPOINT_URL, AWS_REGION and moto's
    default keys in the environment; else none there (storage_options carry them)."""
    pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    drop = ["AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"]
    if not env_credentials:
        drop += ["AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    for k in drop:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    if env_credentials:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    else:
        monkeypatch.setenv("FERRY_REMOTE_RETRY_SECONDS", "10")
    try:
        kw = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                  aws_secret_access_key="testing")
        _moto_post(endpoint, "reset", "")   # moto's state is the process's: start from none
        iam = boto3.client("iam", **kw)
        iam.create_user(UserName="reader")
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        iam.put_user_policy(UserName="reader", PolicyName="s3read", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        client = boto3.client("s3", **kw)
        client.create_bucket(Bucket="data")
        m = _Moto(endpoint, client, key)
        yield m
    finally:
        _moto_post(endpoint, "reset-auth", "inf")
        srv.stop()


@pytest.fixture
def moto_s3(monkeypatch, tmp_path):
    with start_moto(monkeypatch, tmp_path, env_credentials=True) as m:
        yield m


@pytest.fixture
def s3(monkeypatch, tmp_path):
    with start_moto(monkeypatch, tmp_path, env_credentials=False) as m:
        yield m


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@contextmanager
def start_nginx(tmp_path, tls=None, access_log=False):
    """nginx serving tmp_path/www (ETag, Range, If-Match as a real web server answers them);
    tls: (certificate chain, key) for HTTPS. Yields (www, base URL); skips without nginx."""
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if not exe:
        pytest.skip("nginx is not installed (tools/setup.sh installs nginx-light)")
    www = tmp_path / "www"
    www.mkdir()
    port = _free_port()
    user = "user root;\n" if os.geteuid() == 0 else ""   # workers must read tmp_path
    listen = f"listen 127.0.0.1:{port}" + (" ssl;" if tls else ";")
    if tls:
        listen += f"\n        ssl_certificate {tls[0]};\n        ssl_certificate_key {tls[1]};"
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"""{user}worker_processes 1;
error_log {tmp_path}/error.log;
pid {tmp_path}/nginx.pid;
events {{ worker_connections 64; }}
http {{
    access_log {f"{tmp_path}/access.log" if access_log else "off"};
    client_body_temp_path {tmp_path}/body;
    proxy_temp_path {tmp_path}/proxy;
    fastcgi_temp_path {tmp_path}/fastcgi;
    uwsgi_temp_path {tmp_path}/uwsgi;
    scgi_temp_path {tmp_path}/scgi;
    server {{
        {listen}
        root {www};
    }}
}}
""")
    p = subprocess.Popen([exe, "-c", str(conf), "-p", str(tmp_path), "-g", "daemon off;"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                pytest.skip("nginx did not start: " + p.stderr.read().decode(errors="replace")[-300:])
            time.sleep(0.05)
    try:
        yield www, f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def nginx(tmp_path):
    with start_nginx(tmp_path) as served:
        yield served
