"""ferry.checkpoint after fork() (issue 16 item 8): every checkpoint call works in a
forked child, and async_save(...).result() in the child returns even while the parent's
async_save is writing."""
import os
import signal
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from ferry import checkpoint as ck  # noqa: E402


def _child_calls(d):
    """Every checkpoint call once; raises on any difference."""
    sd = {"model": {"w": torch.arange(20.0).reshape(4, 5)}, "step": 3}
    p = os.path.join(d, "child.safetensors")
    ck.save(sd, p, crc32c=True)
    got = ck.load(p)
    assert torch.equal(got["model"]["w"], sd["model"]["w"]) and got["step"] == 3
    tgt = {"model": {"w": torch.zeros(4, 5)}}
    ck.load_into(tgt, p, strict=False)
    assert torch.equal(tgt["model"]["w"], sd["model"]["w"])
    with ck.safe_open(p) as f:
        assert torch.equal(f.get_tensor("model.w"), sd["model"]["w"])
        assert torch.equal(f.get_slice("model.w")[1:3, ::2], sd["model"]["w"][1:3, ::2])
    ck.save(sd, os.path.join(d, "child_sh.safetensors"), max_shard_size=40)
    assert ck.load(os.path.join(d, "child_sh.safetensors"))["step"] == 3
    fut = ck.async_save(sd, os.path.join(d, "child_async.safetensors"))
    assert fut.result(timeout=30) == os.path.join(d, "child_async.safetensors")
    assert ck.load_bytes(ck.save_bytes(sd))["step"] == 3
    ck.reserve_pinned(sd)
    ck.async_save(sd, os.path.join(d, "child_async.safetensors")).result(timeout=30)
    ck.release_pinned()
    import torch.distributed.checkpoint as dcp
    dcp.save({"w": sd["model"]["w"]}, storage_writer=ck.FerryWriter(os.path.join(d, "dcp")),
             no_dist=True)
    back = {"w": torch.zeros(4, 5)}
    dcp.load(back, storage_reader=ck.FerryReader(os.path.join(d, "dcp")), no_dist=True)
    assert torch.equal(back["w"], sd["model"]["w"])


def _fork_and_run(fn, *args, timeout=60):
    pid = os.fork()
    if pid == 0:                                   # child: never returns into pytest
        code = 1
        try:
            signal.alarm(timeout)
            fn(*args)
            code = 0
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + timeout + 5
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")   # fork() with threads running
def test_every_call_after_fork(tmp_path):
    # the parent has used everything first: the context, the async writer, pinned arenas
    p = tmp_path / "parent.safetensors"
    ck.save({"x": torch.ones(3)}, p)
    ck.load(p)
    ck.async_save({"x": torch.ones(3)}, tmp_path / "pa.safetensors").result(timeout=30)
    # and an async_save of the parent is in flight while it forks
    big = {"t%d" % i: torch.randn(1 << 18) for i in range(16)}
    inflight = ck.async_save(big, tmp_path / "inflight.safetensors")
    rc = _fork_and_run(_child_calls, str(tmp_path))
    inflight.result(timeout=60)
    assert rc == 0, "child failed or hung: %r" % (rc,)
    assert set(ck.load(tmp_path / "inflight.safetensors")) == set(big)
