"""FerryReader is safe by default (issue 36 item 1): no byte of a DCP directory is
unpickled or torch.load'ed by anything that can run code. A crafted .metadata may declare
any key as bytes (BytesStorageMetadata), which torch's DefaultLoadPlanner would
torch.load(weights_only=False); and pickle's BUILD may set attributes on the classes the
restricted unpickler allows."""
import io
import os
import pickle

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.filesystem import _StorageInfo  # noqa: E402
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata,  # noqa: E402
                                                   MetadataIndex)

from ferry import checkpoint as ck  # noqa: E402
from ferry.checkpoint import FerryError  # noqa: E402


def _why(e):
    """The message of an error, or of the errors DCP's CheckpointException wraps."""
    return str(e) + " ".join(str(getattr(w, "exc", w))
                             for w in getattr(e, "failures", {}).values())


class _Evil:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, ("echo pwned > %s" % self.target,))


def _data_file(d):
    names = [n for n in os.listdir(d) if n.endswith(".ferry")]
    assert len(names) == 1
    return names[0]


def _declare_bytes(d, key, payload):
    """Rewrite d/.metadata so that `key` is a BYTE_IO item whose bytes are `payload`,
    appended to the data file (what an attacker who controls the directory can do)."""
    md = ck.FerryReader(d, safe=False).read_metadata()
    name = _data_file(d)
    p = os.path.join(d, name)
    at = os.path.getsize(p)
    with open(p, "ab") as f:
        f.write(payload)
    for idx in [i for i in md.storage_data if i.fqn == key]:
        del md.storage_data[idx]
        md.ferry_layout.pop(idx, None)
    md.state_dict_metadata[key] = BytesStorageMetadata()
    md.storage_data[MetadataIndex(key)] = _StorageInfo(name, at, len(payload))
    with open(os.path.join(d, ".metadata"), "wb") as f:
        pickle.dump(md, f)
    return name


def _evil_blob(tmp_path):
    b = io.BytesIO()
    torch.save(_Evil(str(tmp_path / "pwned")), b)
    return b.getvalue()


def test_safe_is_the_default():
    assert ck.FerryReader("x").safe is True
    assert ck.FerryReader("x", safe=False).safe is False


def test_bytes_declared_for_a_tensor_key_refused(tmp_path):
    d = tmp_path / "ck"
    dcp.save({"w": torch.ones(16)}, storage_writer=ck.FerryWriter(d), no_dist=True)
    name = _declare_bytes(str(d), "w", _evil_blob(tmp_path))
    for reader in (ck.FerryReader(d), ck.FerryReader(d, safe=True)):
        with pytest.raises(BaseException) as ei:
            dcp.load({"w": torch.zeros(16)}, storage_reader=reader, no_dist=True)
        why = _why(ei.value)
        assert "'w'" in why and name in why and "tensor" in why, why
        assert not (tmp_path / "pwned").exists()


def test_bytes_with_code_refused_where_the_caller_holds_a_value(tmp_path):
    d = tmp_path / "ck"
    dcp.save({"w": torch.ones(16), "step": 3}, storage_writer=ck.FerryWriter(d), no_dist=True)
    name = _declare_bytes(str(d), "step", _evil_blob(tmp_path))
    with pytest.raises(BaseException) as ei:
        dcp.load({"w": torch.zeros(16), "step": 0}, storage_reader=ck.FerryReader(d),
                 no_dist=True)
    why = _why(ei.value)
    assert "'step'" in why and name in why and "weights_only" in why, why
    assert not (tmp_path / "pwned").exists()
    # safe=False is the explicit opt-in that runs the directory's pickles
    try:
        dcp.load({"w": torch.zeros(16), "step": 0}, storage_reader=ck.FerryReader(d, safe=False),
                 no_dist=True)
    except Exception:
        pass
    assert (tmp_path / "pwned").exists()


def test_plain_values_load_in_safe_mode(tmp_path):
    sd = {"w": torch.arange(6.0), "step": 7, "name": "run", "blob": b"xyz",
          "opt": {"lr": 0.5, "betas": (0.9, 0.99), "t": torch.tensor([1, 2])}}
    d = tmp_path / "ck"
    dcp.save(sd, storage_writer=ck.FerryWriter(d), no_dist=True)
    back = {"w": torch.zeros(6), "step": 0, "name": "", "blob": b"",
            "opt": {"lr": 0.0, "betas": (0.0, 0.0), "t": torch.zeros(2, dtype=torch.int64)}}
    dcp.load(back, storage_reader=ck.FerryReader(d), no_dist=True)
    assert torch.equal(back["w"], sd["w"]) and back["step"] == 7 and back["name"] == "run"
    assert back["blob"] == b"xyz" and back["opt"]["betas"] == (0.9, 0.99)
    assert torch.equal(back["opt"]["t"], sd["opt"]["t"]) and back["opt"]["lr"] == 0.5


def _build_prefix(module, name, attr, value_global):
    """Protocol-2 opcodes: GLOBAL module.name, state (None, {attr: GLOBAL value}), BUILD,
    POP -- set an attribute on the object found by name, then drop it."""
    mod, nm = value_global
    return (b"c%s\n%s\n" % (module.encode(), name.encode()) + b"N}" +
            b"X" + len(attr).to_bytes(4, "little") + attr.encode() +
            b"c%s\n%s\n" % (mod.encode(), nm.encode()) + b"s\x86b0")


def _with_prefix(d, prefix):
    md = ck.FerryReader(d, safe=False).read_metadata()
    body = pickle.dumps(md, protocol=2)
    assert body[:2] == b"\x80\x02"
    (d / ".metadata").write_bytes(b"\x80\x02" + prefix + body[2:])


def test_build_on_an_allowed_class_refused(tmp_path):
    d = tmp_path / "ck"
    dcp.save({"w": torch.ones(4)}, storage_writer=ck.FerryWriter(d), no_dist=True)
    _with_prefix(d, _build_prefix("torch.distributed.checkpoint.metadata", "MetadataIndex",
                                  "__repr__", ("builtins", "set")))
    had = MetadataIndex.__dict__.get("__repr__")
    try:
        with pytest.raises(FerryError, match=r"\.metadata: DCP metadata sets attributes on "
                                             r"the class MetadataIndex"):
            ck.FerryReader(d).read_metadata()
        assert MetadataIndex.__dict__.get("__repr__") is had
    finally:
        if MetadataIndex.__dict__.get("__repr__") is not had:
            type.__setattr__(MetadataIndex, "__repr__", had)


def test_build_on_an_allowed_function_refused(tmp_path):
    d = tmp_path / "ck"
    dcp.save({"w": torch.ones(4)}, storage_writer=ck.FerryWriter(d), no_dist=True)
    _with_prefix(d, _build_prefix("torch.serialization", "_get_layout", "cache",
                                  ("builtins", "set")))
    had = torch.serialization._get_layout.cache
    try:
        with pytest.raises(FerryError, match=r"\.metadata: DCP metadata sets attributes on "
                                             r"function"):
            ck.FerryReader(d).read_metadata()
        assert torch.serialization._get_layout.cache is had
    finally:
        torch.serialization._get_layout.cache = had
