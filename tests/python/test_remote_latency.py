"""Remote reads keep their rate when every round trip is long.

A delaying TCP proxy on loopback (tcpproxy.py; no root, no tc netem) stands between
ferry and the range server (rangeserver.py): every chunk of data, each way, is
passed on a fixed delay after it arrived, so each request waits at least one
added round trip for its first byte while the bytes themselves still stream.
A read of N ranges made one after another cannot take less than N round
trips; ferry keeps FERRY_REMOTE_CONNECTIONS of them in flight, so the same read
must take a fraction of that. The bounds are loose on purpose (a loaded
machine may be slow; it can never be faster than physics): the sequential
read is checked against its lower bound, the concurrent one against half of it.
"""
import io
import threading
import time

import numpy as np
import pytest

ferry = pytest.importorskip("ferry")
from rangeserver import RangeServer, ferry_reads_urls  # noqa: E402
from tcpproxy import TCPProxy  # noqa: E402

pytestmark = pytest.mark.skipif(not ferry_reads_urls(), reason="ferry was built without libcurl (no remote objects)")

DELAY = 0.020   # seconds added to each direction: a 40 ms round trip


@pytest.fixture
def slow_link(monkeypatch):
    """(range server, proxy in front of it, URL maker through the proxy)."""
    monkeypatch.setenv("FERRY_REMOTE_RETRY_SECONDS", "30")
    s = RangeServer().start()
    p = TCPProxy(s.port, DELAY)

    def put(name, data):
        s.put(name, data)
        return f"http://127.0.0.1:{p.port}/{name}"
    yield s, p, put
    p.stop()
    s.stop()


def timed_read(url):
    t0 = time.monotonic()
    got = ferry.read(url, device="cpu")
    return time.monotonic() - t0, got


def test_proxy_adds_the_round_trip(slow_link):
    """The proxy works as claimed: one small object costs an added round trip
    per request, at least (the fixture can fail, so the next tests mean something)."""
    s, p, put = slow_link
    url = put("small.bin", bytes(range(256)) * 16)
    dt, got = timed_read(url)
    assert got.tobytes() == bytes(range(256)) * 16
    assert dt >= 2 * DELAY * 0.95, dt   # the open's one GET: there and back


def big_object(put):
    """(url, array): a 4 MiB .npy object."""
    a = np.random.default_rng(3).standard_normal(1 << 19)
    b = io.BytesIO()
    np.save(b, a)
    return put("big.npy", b.getvalue()), a


def floor_of(server, since):
    """The least time the GETs logged since `since` take one after another:
    a round trip each."""
    return (len(server.gets()) - since) * 2 * DELAY


def test_each_request_costs_one_round_trip(slow_link, monkeypatch):
    """One request at a time: never under the floor of a round trip each (the
    proxy really delays), and not far above it: the next request starts as
    the last one ends, not after some timeout of the scheduler's."""
    s, p, put = slow_link
    url, a = big_object(put)
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "64K")
    monkeypatch.setenv("FERRY_REMOTE_CONNECTIONS", "1")
    dt, got = timed_read(url)
    np.testing.assert_array_equal(got, a)
    floor = floor_of(s, 0)
    assert len(s.gets()) >= (4 << 20) // (64 << 10) and p.connections == 1
    assert floor * 0.95 <= dt < 2 * floor, (dt, floor)


def test_concurrency_hides_the_round_trip(slow_link, monkeypatch):
    """16 requests in flight: about ranges/16 round trips plus the transfer,
    far under the sequential floor; best of three tries, so that one slow
    moment on a shared machine does not decide it."""
    s, p, put = slow_link
    url, a = big_object(put)
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "64K")
    monkeypatch.setenv("FERRY_REMOTE_CONNECTIONS", "16")
    best = floor = None
    for _ in range(3):
        since = len(s.gets())
        dt, got = timed_read(url)
        np.testing.assert_array_equal(got, a)
        floor = floor_of(s, since)
        best = dt if best is None else min(best, dt)
        if best < floor / 2:
            break
    assert floor >= (4 << 20) // (64 << 10) * 2 * DELAY
    assert best < floor / 2, (best, floor)
    assert 1 < p.connections <= 16 * 3, p.connections   # side by side, over kept connections


def test_readers_on_threads_share_the_link(slow_link, monkeypatch):
    """Objects read at once from several threads (the GIL released) overlap
    their round trips too, under the process-wide cap."""
    s, p, put = slow_link
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "64K")
    monkeypatch.setenv("FERRY_REMOTE_CONNECTIONS", "32")
    rng = np.random.default_rng(4)
    objs = {}
    for i in range(4):
        a = rng.standard_normal(1 << 17)   # 1 MiB each
        b = io.BytesIO()
        np.save(b, a)
        objs[put(f"t{i}.npy", b.getvalue())] = a
    results = {}

    def read(url):
        results[url] = ferry.read(url, device="cpu")
    threads = [threading.Thread(target=read, args=(u,)) for u in objs]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    dt = time.monotonic() - t0
    for u, a in objs.items():
        np.testing.assert_array_equal(results[u], a)
    floor = floor_of(s, 0)
    assert dt < floor / 2, (dt, floor)
