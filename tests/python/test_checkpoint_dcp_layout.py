"""FerryReader checks ferry's layout (data offset, dtype, shape) against the tensor's own DCP
metadata and against the item's torch.save archive before reading (issue 36 item 2): a
damaged .metadata gives equal values or a FerryError naming the file, never wrong values,
another exception type, or code run."""
import os
import pickle

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
CheckpointException = pytest.importorskip(
    "torch.distributed.checkpoint.api").CheckpointException

from ferry import checkpoint as ck  # noqa: E402
from ferry.checkpoint import FerryError  # noqa: E402


def _inner(e):
    """The exceptions DCP's CheckpointException wraps (or e itself)."""
    if isinstance(e, CheckpointException):
        return [w[0] if isinstance(w, tuple) else w for w in e.failures.values()]
    return [e]


def _save(d, sd):
    dcp.save(sd, storage_writer=ck.FerryWriter(d), no_dist=True)
    return ck.FerryReader(d, safe=False).read_metadata()


def _rewrite(d, md):
    (d / ".metadata").write_bytes(pickle.dumps(md))


def _load_errors(d, back):
    """What a load of d into back raises: .metadata read first as DCP reads it (torch
    rewraps an error there in an AssertionError of its own), then the whole load."""
    try:
        ck.FerryReader(d).read_metadata()
    except Exception as e:  # noqa: BLE001
        return [e]
    try:
        dcp.load(back, storage_reader=ck.FerryReader(d), no_dist=True)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 — DCP's is a BaseException
        return _inner(e)
    return []


def _sd():
    return {"a": torch.arange(1024, dtype=torch.float32),       # 4 KiB: b starts at 8192
            "w": torch.arange(16, dtype=torch.float32) + 100}


def _zeros():
    return {"a": torch.zeros(1024), "w": torch.zeros(16)}


@pytest.mark.parametrize("change", ["offset_bit12", "offset_bit13", "offset_bit2",
                                    "dtype_float64", "shape_4", "shape_neg", "shape_2d"])
def test_layout_disagreeing_with_the_metadata_refused(tmp_path, change):
    d = tmp_path / "ck"
    md = _save(d, _sd())
    idx = next(i for i in md.ferry_layout if i.fqn == "w")
    at, dt, shape = md.ferry_layout[idx]
    assert at % 4096 == 0 and at >= 8192
    new = {"offset_bit12": (at ^ 4096, dt, shape), "offset_bit13": (at ^ 8192, dt, shape),
           "offset_bit2": (at ^ 4, dt, shape), "dtype_float64": (at, "float64", shape),
           "shape_4": (at, dt, (4,)), "shape_neg": (at, dt, (-16,)),
           "shape_2d": (at, dt, (4, 4))}[change]
    md.ferry_layout[idx] = new
    _rewrite(d, md)
    errs = _load_errors(d, _zeros())
    assert errs and all(isinstance(e, FerryError) for e in errs), errs
    assert any(".metadata" in str(e) or ".ferry" in str(e) for e in errs), errs
    assert any("'w'" in str(e) for e in errs), errs


def test_metadata_missing_fields_refused_by_name(tmp_path):
    d = tmp_path / "ck"
    md = _save(d, _sd())
    del md.storage_data
    _rewrite(d, md)
    with pytest.raises(FerryError, match=r"\.metadata: corrupted DCP metadata: storage_data "
                                         r"is None, not a dict"):
        ck.FerryReader(d).read_metadata()
    md = _save(tmp_path / "ck2", _sd())
    for m in md.state_dict_metadata.values():
        del m.chunks
    _rewrite(tmp_path / "ck2", md)
    with pytest.raises(FerryError, match=r"\.metadata: corrupted DCP metadata: .*'chunks'"):
        ck.FerryReader(tmp_path / "ck2").read_metadata()


def _ok_error(e):
    """A damaged directory may fail in ferry (FerryError) or, where a flipped key name
    stays consistent through the pickle's memo, in torch's planner, which then names the
    key the state dict has and the checkpoint lacks."""
    return isinstance(e, FerryError) or (isinstance(e, RuntimeError) and
                                         "Missing key in checkpoint state_dict" in str(e))


def test_bit_flip_and_truncation_sweep(tmp_path):
    d = tmp_path / "ck"
    sd = {"w": torch.arange(16, dtype=torch.float32) - 3, "step": 5}
    _save(d, sd)
    meta = (d / ".metadata").read_bytes()
    pwned = tmp_path / "pwned"
    outcomes = {"equal": 0, "error": 0}
    for i in range(len(meta)):
        bad = bytearray(meta)
        bad[i] ^= 1 << (i % 8)
        (d / ".metadata").write_bytes(bad)
        back = {"w": torch.zeros(16), "step": 0}
        errs = _load_errors(d, back)
        if errs:
            assert all(_ok_error(e) for e in errs), (i, errs)
            outcomes["error"] += 1
        else:
            assert torch.equal(back["w"], sd["w"]) and back["step"] == 5, (i, back)
            outcomes["equal"] += 1
        assert not pwned.exists()
    assert outcomes["error"] > len(meta) // 4, outcomes
    (d / ".metadata").write_bytes(meta)
    data = [n for n in os.listdir(d) if n.endswith(".ferry")][0]
    blob = (d / data).read_bytes()
    for cut in sorted(set(list(range(0, len(blob), 97)) + [len(blob) - 1, len(blob) - 22])):
        (d / data).write_bytes(blob[:cut])
        back = {"w": torch.zeros(16), "step": 0}
        errs = _load_errors(d, back)
        assert errs and all(isinstance(e, FerryError) for e in errs), (cut, errs)
        assert all(data in str(e) for e in errs), (cut, errs)


def test_reader_and_writer_keep_the_ferry_error_dcp_wraps(tmp_path):
    """issue 38 item 14: DCP wraps a storage layer's errors in its CheckpointException (and
    a .metadata error in an AssertionError's text); the reader and writer keep the
    FerryError, so `raise reader.error or e` gives the caller the error with its path."""
    d = tmp_path / "ck"
    _save(d, _sd())
    data = [n for n in os.listdir(d) if n.endswith(".ferry")][0]
    with open(d / data, "r+b") as f:
        f.truncate(100)
    reader = ck.FerryReader(d)
    with pytest.raises(CheckpointException):
        dcp.load(_zeros(), storage_reader=reader, no_dist=True)
    assert isinstance(reader.error, FerryError) and data in str(reader.error), reader.error
    assert "truncated" in str(reader.error)
    (d / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(CheckpointException):
        dcp.load(_zeros(), storage_reader=reader, no_dist=True)
    assert isinstance(reader.error, FerryError) and str(reader.error).startswith(
        str(d / ".metadata")), reader.error              # the first error, not the rank-local one
    reader.reset()
    assert reader.error is None
