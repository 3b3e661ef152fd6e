"""A training state that torch.save stores round-trips through ferry.checkpoint: numpy
arrays, numpy and Python RNG state (issue 15 item 15); what is refused is refused before
anything is written."""
import random

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from ferry import checkpoint as ck  # noqa: E402


def _same(a, b):
    """Deep equality with types: tuples stay tuples, arrays keep dtype and shape."""
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and
                np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_rng_states_roundtrip(tmp_path):
    np.random.seed(5)
    np.random.standard_normal()                  # a cached gaussian in the legacy state
    rng = np.random.default_rng(7)
    rng.random(3)
    random.seed(9)
    torch.manual_seed(3)
    state = {"np_legacy": np.random.get_state(), "py": random.getstate(),
             "pcg": rng.bit_generator.state, "torch": torch.get_rng_state(),
             "model": {"w": torch.randn(3, 3)}, "step": 10}
    p = tmp_path / "train.safetensors"
    ck.save(state, p, crc32c=True)
    got = ck.load(p)
    assert _same(state, got)
    # the restored states continue the same random streams
    want = (np.random.random(4), random.random(), rng.random(2))
    np.random.set_state(got["np_legacy"])
    random.setstate(got["py"])
    rng2 = np.random.default_rng()
    rng2.bit_generator.state = got["pcg"]
    assert np.array_equal(np.random.random(4), want[0])
    assert random.random() == want[1]
    assert np.array_equal(rng2.random(2), want[2])
    # torch.save stores the same state: both give equal trees
    torch.save(state, tmp_path / "train.pt")
    ref = torch.load(tmp_path / "train.pt", weights_only=False)
    assert _same(ref, got)


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int16", "uint16", "int32",
                                   "uint32", "int64", "uint64", "float16", "float32",
                                   "float64", "complex64", ">f4", ">i8", "<u2"])
def test_numpy_arrays_roundtrip(tmp_path, dtype):
    a = (np.arange(24).reshape(2, 3, 4) % 7).astype(dtype)
    sd = {"a": a, "t": a[:, 1, ::2], "scalar": np.array(3, dtype=dtype),
          "empty": np.zeros((0, 5), dtype=dtype), "ro": np.frombuffer(a.tobytes(), dtype=dtype)}
    p = tmp_path / "np.safetensors"
    ck.save(sd, p)
    got = ck.load(p)
    for k in sd:
        assert _same(np.ascontiguousarray(sd[k]), got[k]), k
    a[0, 0, 0] = 5                              # the file keeps the values at save time
    assert got["a"][0, 0, 0] == 0
    # load_into ignores them as targets (they are values), strict or not
    sd2 = {"a": torch.zeros(1)}
    r = ck.load_into(sd2, p, strict=False)
    assert "a" in r.missing_keys and r.unexpected_keys == []


def test_numpy_refused_kinds(tmp_path):
    p = tmp_path / "x.safetensors"
    for bad in [np.array(["a", "b"]), np.array([1, None], dtype=object),
                np.array(["2020-01-01"], dtype="datetime64[D]"),
                np.zeros(3, dtype=[("x", "<i4")]), np.zeros(2, dtype=np.complex128),
                np.ma.masked_array([1, 2])]:
        with pytest.raises(TypeError, match="numpy"):
            ck.save({"t": torch.ones(1), "v": bad}, p)
        assert not p.exists()


def test_async_save_with_numpy_state(tmp_path):
    state = {"np": np.random.get_state(), "w": torch.ones(4)}
    p = tmp_path / "a.safetensors"
    ck.async_save(state, p).result(timeout=60)
    assert _same(state, ck.load(p))
