"""The hand-off of an engine-staged group (device buffers): a job that has finished is not
waited on by the consumer's stream (its copies have passed; Job.stream_wait would record
events behind later batches' copies queued on the engine's streams since, and the training
step would wait for those); an unfinished job is, once, and stays referenced until done.
Checked with a stand-in job and device buffer: the decision is Python's, the GPU is not
needed to see it."""
import collections

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ferry import torch as ft  # noqa: E402
import ferry.torch.groups as ft_groups  # noqa: E402


class FakeJob:
    def __init__(self, done):
        self._done, self.calls = done, []

    def done(self):
        return self._done

    def wait(self, timeout=None):
        self.calls.append("wait")

    def stream_wait(self, stream):
        self.calls.append(("stream_wait", stream))


class FakeDeviceBuffer:
    is_cuda = True


class FakeStream:
    cuda_stream = 1234


def _group(job, handle):
    g = ft_groups._Group()
    g.units, g.sizes, g.bufs, g.job, g.handles, g.path, g.extra, g.staged = \
        [0], [4], [FakeDeviceBuffer()], job, [handle], None, [], None
    return g


@pytest.fixture
def ds(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((8, 3), np.float32))
    return ft.ArrayDataset(str(tmp_path / "a.npy"), batch_size=4, device="cpu")


def test_a_finished_job_is_not_waited_on_by_the_stream(ds):
    job, handle, retiring = FakeJob(done=True), [None, 1], collections.deque()
    g = _group(job, handle)
    outs = ds._issue(None, g, retiring, FakeStream(), side=False)
    assert job.calls == ["wait"]                  # errors surface; no stream wait
    assert handle[1] == 0 and not retiring        # released at once
    assert outs[0] is g.bufs[0]


def test_an_unfinished_job_is_waited_on_by_the_stream_once(ds):
    job, handle, retiring = FakeJob(done=False), [None, 1], collections.deque()
    g = _group(job, handle)
    ds._issue(None, g, retiring, FakeStream(), side=False)
    assert job.calls == [("stream_wait", 1234)]
    assert handle[1] == 1 and list(retiring) == [g]   # referenced until the job is done


# ---- one path: staging='pinned' is refused, 'auto' and 'engine' are the engine's path ---------
def test_staging_pinned_is_refused_with_the_reason(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((8, 3), np.float32))
    p = str(tmp_path / "a.npy")
    with pytest.raises(ValueError, match="staging='pinned' was removed.*engine's own pinned staging"):
        ft.ArrayDataset(p, batch_size=4, device="cpu", staging="pinned")
    with pytest.raises(ValueError, match="staging='pinned' was removed"):
        ft.ArrayDataset(fields={"a": p}, batch_size=4, device="cpu", staging={"a": "pinned"})
    np.arange(20, dtype=np.uint16).tofile(tmp_path / "t.bin")
    with pytest.raises(ValueError, match="staging='pinned' was removed"):
        ft.TokenDataset(str(tmp_path / "t.bin"), 4, 2, device="cpu", staging="pinned")
    with pytest.raises(ValueError, match="'auto' or 'engine', not 'fast'"):
        ft.ArrayDataset(p, batch_size=4, device="cpu", staging="fast")
    for ok in ("auto", "engine", {"a": "engine"}):
        ds = ft.ArrayDataset(fields={"a": p}, batch_size=4, device="cpu", staging=ok)
        assert len(list(ds)) == 2
