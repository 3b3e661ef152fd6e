"""Fuzzing the checkpoint tree decoder (issue 16, Tests: "a fuzz target ... for the checkpoint
tree decoder"). The skeleton stored under "ferry.tree" is parsed and decoded from whatever a
damaged or hostile file holds: any text must give an object or a FerryError naming the file —
never another exception, a hang or a crash. Two generators: mutations of the trees ferry.save
really writes (byte flips, cuts, splices of its own pieces), and arbitrary JSON values built by
hypothesis. Both run through the same parse + decode calls ck.load makes, and a sample of them
through ck.load of a real file."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ferry.checkpoint import tree  # noqa: E402
from ferry import checkpoint as ck  # noqa: E402
from ferry.checkpoint import FerryError  # noqa: E402


def _state():
    """A training state of the kinds users save: nested dicts and lists, tensors, numpy arrays
    and RNG states, numbers of every kind, strings, None, tuples."""
    rng = np.random.default_rng(0)
    return {
        "model": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.zeros(3, dtype=torch.bfloat16)},
        "opt": {"state": {0: {"step": torch.tensor(5), "exp_avg": torch.ones(2, 3)}},
                "param_groups": [{"lr": 0.5, "betas": (0.9, 0.999), "eps": 1e-8, "params": [0, 1]}]},
        "np": np.arange(4, dtype=">i2"), "rng": rng.bit_generator.state, "epoch": 3,
        "best": float("inf"), "name": "run-7", "flags": [True, None, 2 ** 70, -0.0],
    }


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The tree text ferry.save writes for _state(), and the tensors it goes with."""
    p = tmp_path_factory.mktemp("tree") / "s.safetensors"
    ck.save(_state(), p)
    import safetensors
    with safetensors.safe_open(str(p), "pt") as f:
        text = f.metadata()[tree.TREE_KEY]
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return p, text, tensors


def _decode_or_ferry_error(text, tensors):
    """What ck.load does with the skeleton; returns "ok" or "refused"."""
    try:
        obj = tree.parse(text, "x.safetensors")
        tree.decode(obj, tensors, "x.safetensors")
        return "ok"
    except FerryError as e:
        assert "x.safetensors" in str(e)
        return "refused"


def test_the_written_tree_decodes(written):
    _, text, tensors = written
    assert _decode_or_ferry_error(text, tensors) == "ok"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_trees_decode_or_raise_ferry_error(written, data):
    _, text, tensors = written
    b = bytearray(text.encode())
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "splice", "dup"]))
        i = data.draw(st.integers(0, max(0, len(b) - 1)))
        if op == "flip" and b:
            b[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "cut":
            del b[i:i + data.draw(st.integers(1, 40))]
        elif op == "splice":
            j = data.draw(st.integers(0, max(0, len(b) - 1)))
            b[i:i] = b[j:j + data.draw(st.integers(1, 60))]
        elif op == "dup":
            b[i:i] = data.draw(st.sampled_from([b'{"l":[', b'{"d":[["k",', b"]]}", b'{"f":"nan"}', b"1e999",
                                                b'{"np":["<f8",2]}', b'{"T":0}', b'"\\ud800"', b"null"]))
    _decode_or_ferry_error(b.decode("utf-8", "replace"), tensors)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["d", "l", "t", "T", "f", "b", "np", "nd", "dt", "S", "dev", "k", "x"]), inner, max_size=3),
    max_leaves=25)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values)
def test_arbitrary_json_trees_decode_or_raise_ferry_error(written, value):
    _, _, tensors = written
    _decode_or_ferry_error(json.dumps(value), tensors)


def test_a_sample_through_ck_load(written, tmp_path):
    """The same contract end to end, through a real file, for a few damaged trees."""
    import safetensors.torch as st_torch
    _, text, tensors = written
    rng = np.random.default_rng(1)
    outcomes = set()
    for k in range(40):
        b = bytearray(text.encode())
        i = int(rng.integers(0, len(b)))
        b[i] ^= 1 << int(rng.integers(0, 8))
        p = tmp_path / f"m{k}.safetensors"
        st_torch.save_file(tensors, str(p), metadata={tree.TREE_KEY: b.decode("utf-8", "replace")})
        try:
            ck.load(p)
            outcomes.add("ok")
        except FerryError as e:
            assert p.name in str(e)
            outcomes.add("refused")
    assert "refused" in outcomes
