"""Faults of remote reads beyond test_remote.py's: each a retry that ends in
the right bytes, or a clear error within its time bound, never wrong bytes.

The loopback range server (rangeserver.py) injects them per request: TCP
resets, a body that stops mid-way, 429, a server that ignores Range or answers
another range than asked, an object replaced (and the condition ignored),
bursts of faults across many requests in flight, and failures that outlast the
retry budget in count or in time."""
import io
import re
import time

import numpy as np
import pytest

ferry = pytest.importorskip("ferry")
from ferry import FerryError  # noqa: E402
from rangeserver import RangeServer, ferry_reads_urls  # noqa: E402

pytestmark = pytest.mark.skipif(not ferry_reads_urls(), reason="ferry was built without libcurl (no remote objects)")


@pytest.fixture
def env(monkeypatch):
    # short bounds: every fault is decided in seconds
    monkeypatch.setenv("FERRY_REMOTE_RETRY_SECONDS", "20")
    monkeypatch.setenv("FERRY_REMOTE_STALL_SECONDS", "2")
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "64K")
    return monkeypatch


@pytest.fixture
def server(env):
    s = RangeServer().start()
    yield s
    s.stop()


def npy_bytes(a):
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def big(server, name="big.npy", n=200_000):
    a = np.arange(n, dtype=np.int32)
    return a, server.put(name, npy_bytes(a))


def data_gets(server):
    """The GETs after the opens: (range start, range end)."""
    out = []
    for _, rng, _ in server.gets():
        if rng and not rng.startswith("bytes=0-"):
            lo, hi = rng.split("=")[1].split("-")
            out.append((int(lo), int(hi)))
    return out


@pytest.mark.parametrize("fault", ["reset", "stall_body", "drop"])
def test_broken_body_is_resumed_from_the_byte_it_stopped_at(server, env, fault):
    """A body cut off mid-way (a reset, a stall, a close) is asked again for
    the rest only: the retry's range starts where the bytes stopped, and what
    came before is kept, so the read is whole and right."""
    env.setenv("FERRY_REMOTE_CONNECTIONS", "1")   # the first data request meets the fault
    a, url = big(server)
    server.faults = [fault]
    t0 = time.monotonic()
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)
    assert time.monotonic() - t0 < 15
    assert not server.faults
    gets = data_gets(server)
    assert gets[0] == (65536, 131071), gets
    # its first half came: the retry (after a backoff, other ranges meanwhile)
    # asks for the rest only; a reset may lose some of the half in the socket
    retry = [g for g in gets[1:] if g[1] == 131071]
    assert len(retry) == 1, gets
    assert retry[0][0] == 65536 + 32768 or fault == "reset" and 65536 <= retry[0][0] <= 65536 + 32768, gets


def test_429_burst_then_success(server):
    a, url = big(server)
    server.faults = [429, 429, 429, 503, 429]
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)
    assert not server.faults


def test_many_faults_across_requests_in_flight(server, env):
    """A burst of every retryable fault while 8 requests are in flight: each
    request retries on its own; the result is the object, byte for byte."""
    env.setenv("FERRY_REMOTE_CONNECTIONS", "8")
    a, url = big(server, n=1_000_000)   # 4 MB: 61 ranges of 64K
    kinds = [503, "drop", "reset", "short", "slowdown", 429, 500, "stall_body"]
    server.faults = [kinds[i % len(kinds)] if i % 3 == 0 else None for i in range(60)]
    t0 = time.monotonic()
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)
    assert time.monotonic() - t0 < 20
    assert not any(server.faults), server.faults


def test_server_ignoring_range_still_gives_the_right_bytes(server):
    """200 and the whole object to a ranged GET: only the asked bytes are
    taken (and the transfer is cut short), with and without ETags."""
    a, url = big(server)
    server.faults = ["norange"] * 3
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)
    s = RangeServer(etags=False).start()
    try:
        a2, url2 = big(s)
        s.faults = ["norange"] * 3
        np.testing.assert_array_equal(ferry.read(url2, device="cpu"), a2)
    finally:
        s.stop()


def test_server_answering_another_range_is_an_error(server):
    a, url = big(server)
    server.faults = ["badrange"]
    t0 = time.monotonic()
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu")
    msg = str(ei.value)
    m = re.search(r"bytes (\d+)-\d+: HTTP 206: the response starts at byte (\d+), not at (\d+) as asked", msg)
    assert url in msg and m and int(m[2]) == int(m[1]) + 4096 and m[3] == m[1], msg
    assert time.monotonic() - t0 < 5   # a verdict, not retried


@pytest.mark.parametrize("etags", [True, False])
def test_replaced_object_with_condition_ignored_is_an_error(env, etags):
    """A server (or a cache before it) that ignores If-Match / If-Unmodified-Since
    and sends the new version (same size): told apart by its ETag, or where
    there is none by its Last-Modified date, never mixed into the read."""
    env.setenv("FERRY_REMOTE_CONNECTIONS", "1")
    s = RangeServer(etags=etags).start()
    try:
        a, url = big(s)   # 800,128 bytes: after the open's 64K, 12 ranges, one at a time
        s.faults = [None] * 11 + ["replace_ignore"]   # the last: no later request would see a 412
        with pytest.raises(FerryError) as ei:
            ferry.read(url, device="cpu")
        msg = str(ei.value)
        assert url in msg and "changed since it was opened" in msg and "another version" in msg, msg
        assert ("ETag" if etags else "Last-Modified") in msg, msg
    finally:
        s.stop()


def test_replaced_while_many_requests_are_in_flight(server, env):
    env.setenv("FERRY_REMOTE_CONNECTIONS", "8")
    a, url = big(server, n=1_000_000)
    server.faults = [None] * 20 + ["replace"]
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu")
    assert url in str(ei.value) and "changed since it was opened" in str(ei.value)


def test_retry_time_bound_ends_a_long_burst(server, env):
    """Retries stop at FERRY_REMOTE_RETRY_SECONDS even when the count allows more."""
    env.setenv("FERRY_REMOTE_RETRIES", "100")
    env.setenv("FERRY_REMOTE_RETRY_SECONDS", "2")
    a, url = big(server)
    server.faults = ["slowdown"] * 1000
    t0 = time.monotonic()
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu")
    dt = time.monotonic() - t0
    msg = str(ei.value)
    assert dt < 2 + 4, dt   # the bound, and at most one backoff past it
    assert url in msg and "HTTP 503" in msg and "Please reduce your request rate" in msg, msg
    assert "FERRY_REMOTE_RETRY_SECONDS" in msg, msg


def test_stall_at_open_then_success(server):
    a, url = big(server)
    server.open_faults = ["stall"]
    t0 = time.monotonic()
    np.testing.assert_array_equal(ferry.read(url, device="cpu"), a)
    assert time.monotonic() - t0 < 15
    assert not server.open_faults


def test_body_that_stops_is_ended_at_the_stall_bound(server, env):
    """A body that stops after a burst is ended FERRY_REMOTE_STALL_SECONDS
    after its last byte, not once an average rate over the last seconds
    sinks (libcurl's low-speed check alone took ~5 s more)."""
    env.setenv("FERRY_REMOTE_RETRIES", "0")
    env.setenv("FERRY_REMOTE_CONNECTIONS", "1")
    a, url = big(server)
    server.faults = ["stall_body"]
    t0 = time.monotonic()
    with pytest.raises(FerryError) as ei:
        ferry.read(url, device="cpu")
    dt = time.monotonic() - t0
    msg = str(ei.value)
    assert url in msg and "no byte came for 2 s (FERRY_REMOTE_STALL_SECONDS) after 32768 of 65536 bytes" in msg, msg
    assert 2 <= dt < 4.5, dt
