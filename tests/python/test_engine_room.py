"""XarrayDataset's engine-sized groups: the planner thread submits a group only once fewer than
the budget's jobs (ferry_plan_budget: two, or one) of the runtime's group jobs are in the engine
(_engine_room), so a third group in flight waits for the oldest instead of sharing the engine's workers with it. The rule itself,
with jobs that say when they are done; the groups on a GPU are tests/gpu's."""
import threading

import pytest

pytest.importorskip("torch")
from ferry.torch import xarray_reads as xd  # noqa: E402


class _Job:
    """A job the test finishes: done() says so, wait() blocks until then (and raises its error)."""

    def __init__(self, error=None):
        self.finished = threading.Event()
        self.error = error
        self.waits = 0

    def done(self):
        return self.finished.is_set()

    def wait(self):
        self.waits += 1
        self.finished.wait(10)
        if self.error is not None:
            raise self.error
        return 1


class _Rt:
    pass


def test_room_at_once_while_fewer_are_in_the_engine():
    rt = _Rt()
    a = _Job()
    xd._in_engine(rt).append(a)
    xd._engine_room(rt, 2)                       # one in the engine: room for a second
    assert a.waits == 0 and list(xd._in_engine(rt)) == [a]


def test_finished_jobs_leave_without_a_wait():
    rt = _Rt()
    a, b = _Job(), _Job()
    a.finished.set()
    xd._in_engine(rt).extend([a, b])
    xd._engine_room(rt, 2)
    assert a.waits == b.waits == 0 and list(xd._in_engine(rt)) == [b]


def test_a_third_waits_for_the_oldest_only():
    rt = _Rt()
    a, b = _Job(), _Job()
    xd._in_engine(rt).extend([a, b])
    got = []
    t = threading.Thread(target=lambda: got.append(xd._engine_room(rt, 2)))
    t.start()
    t.join(0.2)
    assert t.is_alive(), "the third group was let in with two jobs in the engine"
    b.finished.set()                              # the newer one ending does not make room...
    t.join(0.2)
    assert t.is_alive()
    a.finished.set()                              # ...the oldest one does
    t.join(5)
    assert not t.is_alive() and got == [None]
    assert b.waits == 0 and list(xd._in_engine(rt)) == [b]


def test_a_failed_job_is_not_raised_by_the_planner():
    """The oldest job fails while the planner waits for it: the planner goes on (the consumer's
    wait for that group raises the error, in turn)."""
    rt = _Rt()
    a = _Job(OSError("a group's read failed"))
    xd._in_engine(rt).append(a)
    threading.Timer(0.05, a.finished.set).start()
    xd._engine_room(rt, 1)
    assert a.waits == 1 and not xd._in_engine(rt)


def test_no_limit_on_the_host(tmp_path):
    """On the CPU (no engine-sized groups) a dataset's groups are not held back."""
    import numpy as np
    import pandas as pd
    xr = pytest.importorskip("xarray")
    import torch
    from ferry.torch import XarrayDataset
    from ferry.xarray import FerryBackendEntrypoint
    p = str(tmp_path / "a.nc")
    xr.Dataset({"t2m": (("time", "lat", "lon"), np.zeros((6, 4, 5), np.float32))},
               coords={"time": pd.date_range("2001-01-01", periods=6, freq="h")}).to_netcdf(p, engine="scipy")
    x = XarrayDataset(xr.open_dataset(p, engine=FerryBackendEntrypoint, device="cpu"), ["t2m"],
                      batch_size=2, device="cpu")
    rt = x._runtime(torch.device("cpu"), False, 1)
    assert x._engine_jobs(rt) is None
    assert x._read_depth(rt, 5) == 5
    assert sum(1 for _ in x) == 3
