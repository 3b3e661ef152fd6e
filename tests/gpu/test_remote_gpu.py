"""Remote objects read into device memory: the staged path (no GDS for a
remote object), with a fault on the way, equal to numpy. Runs on a real GPU
and on the simulated driver (tests/cudasim); the server is the loopback range
server of tests/python/rangeserver.py."""
import io
import os
import sys

import numpy as np
import pytest

import ferry
import ferry_arrays
from ferry import _ferry as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from rangeserver import RangeServer, ferry_reads_urls  # noqa: E402

pytestmark = pytest.mark.skipif(not ferry_reads_urls(), reason="ferry was built without libcurl (no remote objects)")


def host(ctx, a):
    if isinstance(a, F.Array):
        assert a.device >= 0, "expected device memory"
        return ferry_arrays.to_numpy(ctx, a, np.dtype(a.typestr))
    import cupy
    return cupy.asnumpy(a)


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_RETRY_SECONDS", "20")
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "256K")
    s = RangeServer().start()
    yield s
    s.stop()


def npy(a):
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def test_remote_npy_to_device(ctx, server):
    a = np.random.default_rng(3).standard_normal((700, 900)).astype(np.float32)   # 2.5 MB: several staging buffers
    b = np.arange(40_000, dtype=">i8").reshape(200, 200)                            # big-endian: swapped on the way
    ua, ub = server.put("a.npy", npy(a)), server.put("b.npy", npy(b))
    server.faults = [503, "drop"]
    c = F.Context(threads=4)
    try:
        x = ferry.read(ua, device=0, ctx=c)
        np.testing.assert_array_equal(host(ctx, x), a)
        y = ferry.read(ub, device=0, ctx=c, selection=(slice(10, 150, 3), slice(None, None, 7)))
        np.testing.assert_array_equal(host(ctx, y), b.astype("<i8")[10:150:3, ::7])
        st = ferry.stats(c)
        assert not server.faults
    finally:
        c.close()
    # no GDS for a remote object: the staged path, with no fallback counted
    assert st["staged"]["bytes"] >= a.nbytes and st["cufile"]["bytes"] == 0 and st["fallbacks"] == 0


def test_remote_tasks_reuse_one_workers_buffer(ctx, server, monkeypatch):
    # one worker, 1 MiB tasks: its pinned input buffer is refilled while the
    # previous task's copy may still be queued (the simulated driver delays
    # copies at random: a missing wait shows as wrong bytes)
    monkeypatch.setenv("FERRY_TASK_SIZE", "1M")
    a = np.random.default_rng(5).integers(0, 2**31, 2_500_000, dtype=np.int32)   # 10 MB: 10 tasks
    url = server.put("c.npy", npy(a))
    c = F.Context(threads=1)
    try:
        for _ in range(2):
            np.testing.assert_array_equal(host(ctx, ferry.read(url, device=0, ctx=c)), a)
    finally:
        c.close()
