"""Plans wait for the caller's torch stream in the engine (ferry_plan_wait_stream),
not by a host-side synchronize in Python: a read into a tensor the current stream
still reads, and a checkpoint of a tensor the current stream is still writing.
The stream first spins ~100 ms (torch.cuda._sleep), so an engine that did not wait
would overwrite / save the bytes from before. Skips without torch and a GPU."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

import ferry  # noqa: E402
from ferry import checkpoint as ck  # noqa: E402

DEV = torch.device("cuda", 0)
N = 8 << 20          # float32 elements: 32 MiB
SPIN = 200_000_000   # GPU cycles, ~100 ms


def test_read_into_tensor_waits_for_its_readers(tmp_path):
    ref = np.arange(N, dtype="<f4")
    np.save(tmp_path / "a.npy", ref)
    t = torch.full((N,), 7.0, device=DEV)
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN)
    seen = t.clone()                  # queued behind the spin: must see the 7s
    ferry.read(tmp_path / "a.npy", out=t)
    torch.cuda.synchronize()
    assert bool((seen == 7.0).all())
    assert torch.equal(t.cpu(), torch.from_numpy(ref))


def test_checkpoint_waits_for_its_producer(tmp_path):
    x = torch.zeros(N, device=DEV)
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN)
    x.fill_(3.0)                      # queued behind the spin
    ck.save({"x": x}, tmp_path / "x.safetensors")
    got = ck.load(tmp_path / "x.safetensors", device="cpu")["x"]
    assert bool((got == 3.0).all())


def test_side_stream_is_the_one_waited_for(tmp_path):
    """A tensor produced on a side stream that is current when ferry is called."""
    s = torch.cuda.Stream(DEV)
    x = torch.zeros(N, device=DEV)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(SPIN)
        x.fill_(5.0)
        ck.save({"x": x}, tmp_path / "s.safetensors")
    got = ck.load(tmp_path / "s.safetensors", device="cpu")["x"]
    assert bool((got == 5.0).all())
