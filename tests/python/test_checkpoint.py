"""ferry.checkpoint: safetensors save/load through the engine, atomicity, corruption,
interop with safetensors.torch, sharding, async_save and the DCP plugin (gloo, 2 processes)."""
import collections
import json
import math
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import ferry  # noqa: E402
from ferry import checkpoint as ck  # noqa: E402
from ferry.checkpoint import FerryError  # noqa: E402

PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(ferry.__file__)))


def rand_tensor(shape, dtype, seed=0):
    """Random bytes of any dtype (every bit pattern, NaNs included for floats)."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def same_bytes(a, b):
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    if a.numel() == 0:
        return True
    a = a.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    b = b.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return torch.equal(a, b)


DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]
for _n in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2",
           "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
    if hasattr(torch, _n):
        DTYPES.append(getattr(torch, _n))
# dtypes safetensors.torch itself can read back
ST_READS = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
            torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
            getattr(torch, "uint16", None), getattr(torch, "uint32", None),
            getattr(torch, "uint64", None), getattr(torch, "float8_e4m3fn", None),
            getattr(torch, "float8_e5m2", None)}


def data_start(path):
    with open(path, "rb") as f:
        n, = struct.unpack("<Q", f.read(8))
    return 8 + n


# ----------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_roundtrip_every_dtype(tmp_path, dtype):
    sd = {"x": rand_tensor((37, 5), dtype, 1), "y": rand_tensor((4096,), dtype, 2),
          "zero_d": rand_tensor((), dtype, 3), "empty": rand_tensor((0, 7), dtype, 4)}
    p = tmp_path / "m.safetensors"
    ck.save(sd, p)
    assert data_start(p) % 4096 == 0
    got = ck.load(p)
    assert list(got) == list(sd)
    for k in sd:
        assert same_bytes(got[k], sd[k]), k
    if dtype in ST_READS:
        ref = safetensors_torch.load_file(str(p))
        assert set(ref) == set(sd)
        for k in sd:
            assert same_bytes(ref[k], sd[k]), k


def test_safetensors_written_files_load(tmp_path):
    sd = {"w": torch.randn(33, 17), "b": torch.arange(5, dtype=torch.int32),
          "h": torch.randn(8, 8).to(torch.bfloat16), "s": torch.tensor(1.5),
          "e": torch.empty(0)}
    p = tmp_path / "ref.safetensors"
    safetensors_torch.save_file(sd, str(p), metadata={"who": "safetensors"})
    got = ck.load(p)
    assert set(got) == set(sd)
    for k in sd:
        assert same_bytes(got[k], sd[k])
    with ck.safe_open(p) as f:
        assert f.metadata() == {"who": "safetensors"}
        assert sorted(f.keys()) == sorted(sd)


def test_alignment_and_layout(tmp_path):
    sd = {
        "small_a": torch.randn(3),                 # 12 bytes
        "big_aligned": torch.randn(1024, 4),      # 16 KiB
        "big_odd": torch.randn(50257, 3),         # not a multiple of 4 KiB
        "bias": torch.randn(768),                 # 3072 bytes
        "other": torch.randn(10000, 7).half(),
        "norm": torch.randn(256),                 # 1024 bytes
    }
    p = tmp_path / "a.safetensors"
    ck.save(sd, p, metadata={"note": "layout"})
    ds = data_start(p)
    assert ds % 4096 == 0
    with open(p, "rb") as f:
        f.seek(8)
        hdr = json.loads(f.read(ds - 8))
    offs = {k: v["data_offsets"] for k, v in hdr.items() if k != "__metadata__"}
    assert offs["big_aligned"][0] % 4096 == 0
    assert offs["big_odd"][0] % 4096 == 0
    # contiguous, no holes (safetensors requires it)
    spans = sorted(offs.values())
    assert spans[0][0] == 0
    for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
        assert a1 == b0
    assert os.path.getsize(p) == ds + spans[-1][1]
    ref = safetensors_torch.load_file(str(p))
    for k in sd:
        assert torch.equal(ref[k], sd[k])
    assert hdr["__metadata__"]["note"] == "layout"


def test_layout_greedy_fill():
    from ferry import _ckpt_st as st
    ents = [("a", 4096 * 3), ("odd1", 70000), ("odd2", 90000), ("s1", 2048), ("s2", 1024),
            ("s3", 496), ("s4", 12), ("s5", 100), ("z", 0)]
    lay = st.layout(ents)
    pos = {n: (b, e) for n, b, e in lay}
    assert pos["a"][0] == 0
    # odd2 goes first (aligned, ends 112 bytes short of a 4 KiB boundary); s5 + s4 fill
    # exactly that gap so odd1 starts aligned too
    assert pos["odd2"][0] % 4096 == 0 and pos["odd1"][0] % 4096 == 0
    # every tensor exactly once, contiguous
    spans = sorted((b, e) for _, b, e in lay)
    assert spans[0][0] == 0 and all(x[1] == y[0] for x, y in zip(spans, spans[1:]))
    assert sorted(n for n, _, _ in lay) == sorted(n for n, _ in ents)


def test_non_contiguous_and_views(tmp_path):
    base = torch.randn(64, 32)
    sd = {"t": base.t(), "s": base[::2, 3:9], "full": base}
    p = tmp_path / "v.safetensors"
    ck.save(sd, p)
    got = ck.load(p)
    for k in sd:
        assert torch.equal(got[k], sd[k])
        assert got[k].is_contiguous()


def test_nested_and_plain_values(tmp_path):
    sd = {
        "model": collections.OrderedDict(w=torch.randn(3, 3)),
        "list": [torch.ones(2), 3, "x", None],
        "tuple": (1, 2.5, (True, False)),
        "int_keys": {0: torch.zeros(1), 1: {"a": 1}, -5: "neg"},
        "floats": [float("nan"), float("inf"), -float("inf"), 0.1, -0.0, 1e300],
        "bytes": b"\x00\xffabc",
        "dtype": torch.bfloat16,
        "device": torch.device("cpu"),
        "size": torch.Size([2, 3]),
        "big_int": 2 ** 70,
        "empty": {}, "empty_list": [], "empty_tuple": (),
        "tuple_key": {(1, "a"): 5},
        "dotted.key": torch.arange(3),
        "dotted": {"key": torch.arange(4)},      # same dotted name: must not collide
    }
    p = tmp_path / "n.safetensors"
    ck.save(sd, p)
    got = ck.load(p)
    assert type(got["model"]) is collections.OrderedDict
    assert torch.equal(got["model"]["w"], sd["model"]["w"])
    assert torch.equal(got["list"][0], sd["list"][0]) and got["list"][1:] == [3, "x", None]
    assert got["tuple"] == (1, 2.5, (True, False)) and type(got["tuple"][2]) is tuple
    assert set(got["int_keys"]) == {0, 1, -5} and got["int_keys"][1] == {"a": 1}
    fl = got["floats"]
    assert math.isnan(fl[0]) and fl[1] == math.inf and fl[2] == -math.inf and fl[3] == 0.1
    assert math.copysign(1, fl[4]) == -1 and fl[5] == 1e300
    assert got["bytes"] == b"\x00\xffabc"
    assert got["dtype"] is torch.bfloat16 and got["device"] == torch.device("cpu")
    assert type(got["size"]) is torch.Size and got["size"] == (2, 3)
    assert got["big_int"] == 2 ** 70
    assert got["empty"] == {} and got["empty_list"] == [] and got["empty_tuple"] == ()
    assert got["tuple_key"] == {(1, "a"): 5}
    assert torch.equal(got["dotted.key"], torch.arange(3))
    assert torch.equal(got["dotted"]["key"], torch.arange(4))
    # still a valid safetensors file
    ref = safetensors_torch.load_file(str(p))
    assert len(ref) == 5          # model.w, list.0, int_keys.0, dotted.key, dotted.key#1


def test_top_level_not_a_dict(tmp_path):
    obj = [torch.ones(3), {"k": (torch.zeros(2), 7)}]
    p = tmp_path / "l.safetensors"
    ck.save(obj, p)
    got = ck.load(p)
    assert isinstance(got, list) and torch.equal(got[0], obj[0])
    assert got[1]["k"][1] == 7 and torch.equal(got[1]["k"][0], obj[1]["k"][0])


def test_unsupported_values_raise(tmp_path):
    with pytest.raises(TypeError):
        ck.save({"x": object()}, tmp_path / "u.safetensors")
    with pytest.raises(TypeError):
        ck.save({"x": torch.zeros(2, dtype=torch.complex128)}, tmp_path / "u.safetensors")
    with pytest.raises(TypeError):
        ck.save({"x": torch.zeros(2)}, tmp_path / "u.safetensors", metadata={"a": 1})
    assert not os.path.exists(tmp_path / "u.safetensors")
    assert os.listdir(tmp_path) == []


def _adam_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.8, 0.95))
    for _ in range(2):
        model(torch.randn(4, 8)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_optimizer_state_dict_roundtrip(tmp_path):
    model, opt = _adam_state()
    osd = opt.state_dict()
    p = tmp_path / "opt.safetensors"
    ck.save({"model": model.state_dict(), "optim": osd, "epoch": 3}, p, crc32c=True)
    got = ck.load(p)
    g = got["optim"]
    assert repr(g["param_groups"]) == repr(osd["param_groups"])
    assert type(g["param_groups"][0]["betas"]) is tuple
    assert set(g["state"]) == set(osd["state"]) and all(isinstance(k, int) for k in g["state"])
    for k, st in osd["state"].items():
        for name, v in st.items():
            assert same_bytes(g["state"][k][name], v)
    model2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model2.load_state_dict(got["model"])
    opt2 = torch.optim.Adam(model2.parameters())
    opt2.load_state_dict(g)
    assert repr(opt2.state_dict()["param_groups"]) == repr(osd["param_groups"])
    assert got["epoch"] == 3


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.head = torch.nn.Linear(8, 50, bias=False)
        self.head.weight = self.emb.weight


def test_tied_weights_saved_once(tmp_path):
    m = Tied()
    sd = m.state_dict()
    p = tmp_path / "tied.safetensors"
    ck.save(sd, p)
    ref = safetensors_torch.load_file(str(p))
    assert list(ref) == ["emb.weight"]           # stored once
    got = ck.load(p)
    assert set(got) == {"emb.weight", "head.weight"}
    assert got["head.weight"] is got["emb.weight"]
    m2 = Tied()
    m2.load_state_dict(got)
    assert torch.equal(m2.head.weight, m.emb.weight)
    # in place, into a module whose weights are tied
    m3 = Tied()
    ck.load_into(m3, p)
    assert torch.equal(m3.emb.weight, m.emb.weight) and m3.head.weight is m3.emb.weight
    # nested trees keep ties too
    ck.save({"m": sd, "again": sd["emb.weight"]}, p)
    got = ck.load(p)
    assert got["again"] is got["m"]["emb.weight"] is got["m"]["head.weight"]


def test_overlapping_views_are_copies(tmp_path):
    base = torch.randn(10, 4)
    sd = {"base": base, "row": base[2]}
    p = tmp_path / "ov.safetensors"
    ck.save(sd, p)
    got = ck.load(p)
    assert torch.equal(got["row"], base[2]) and torch.equal(got["base"], base)


# --------------------------------------------------------------------- load_into / safe_open
def test_load_into_in_place(tmp_path):
    model, opt = _adam_state()
    p = tmp_path / "m.safetensors"
    ck.save(model.state_dict(), p)
    m2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ptrs = [t.data_ptr() for t in m2.state_dict().values()]
    res = ck.load_into(m2, p)
    assert res.missing_keys == [] and res.unexpected_keys == []
    assert [t.data_ptr() for t in m2.state_dict().values()] == ptrs
    for a, b in zip(m2.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)


def test_load_into_nested_cast_noncontiguous(tmp_path):
    src = {"a": {"w": torch.randn(6, 4)}, "b": [torch.arange(10, dtype=torch.int32)]}
    p = tmp_path / "n.safetensors"
    ck.save(src, p)
    big = torch.zeros(4, 6)
    dst = {"a": {"w": big.t()}, "b": [torch.zeros(10, dtype=torch.int64)]}  # view + cast
    ck.load_into(dst, p)
    assert torch.equal(big.t(), src["a"]["w"])
    assert torch.equal(dst["b"][0], src["b"][0].long())


def test_load_into_mismatch(tmp_path):
    p = tmp_path / "m.safetensors"
    ck.save({"a": torch.zeros(3), "b": torch.zeros(2)}, p)
    with pytest.raises(FerryError, match="shape"):
        ck.load_into({"a": torch.zeros(4), "b": torch.zeros(2)}, p)
    with pytest.raises(FerryError, match="missing|unexpected"):
        ck.load_into({"a": torch.zeros(3)}, p)
    t = torch.ones(3)
    res = ck.load_into({"a": t, "c": torch.zeros(1)}, p, strict=False)
    assert res.missing_keys == ["c"] and res.unexpected_keys == ["b"]
    assert torch.equal(t, torch.zeros(3))


def test_safe_open_and_slices(tmp_path):
    w = torch.randn(40, 30, 6)
    v = torch.arange(1000, dtype=torch.int16)
    p = tmp_path / "s.safetensors"
    ck.save({"w": w, "v": v, "s": torch.tensor(2.0)}, p, metadata={"k": "v"})
    with ck.safe_open(p, framework="pt", device="cpu") as f:
        assert set(f.keys()) == {"w", "v", "s"}
        assert f.metadata()["k"] == "v"
        assert torch.equal(f.get_tensor("w"), w)
        sl = f.get_slice("w")
        assert sl.get_shape() == [40, 30, 6] and sl.get_dtype() == "F32"
        for key in [(slice(3, 9),), (slice(None), slice(2, 5)), (5,), (5, 7), (5, 7, 2),
                    (slice(1, 30, 4), slice(None, None, 3)), (Ellipsis, 1),
                    (slice(-5, None), Ellipsis, slice(0, 6, 5)), (slice(10, 10),),
                    (-1, slice(None), slice(4, 6)),
                    (None, 3), (slice(2, 4), None, Ellipsis, None, 1), (1, None, 2, 3, None), ()]:
            assert torch.equal(sl[key], w[key]), key
        assert torch.equal(f.get_slice("v")[100:900:7], v[100:900:7])
        assert torch.equal(f.get_slice("s")[...], torch.tensor(2.0))
        with pytest.raises(FerryError):
            f.get_tensor("nope")
        with pytest.raises(IndexError):
            sl[50]


def test_slices_read_only_needed_bytes(tmp_path):
    w = torch.randn(512, 1024)            # 2 MiB
    p = tmp_path / "big.safetensors"
    ck.save({"w": w}, p)
    ctx = ck._io.context()
    with ck.safe_open(p) as f:
        ctx.reset_stats()
        part = f.get_slice("w")[100:110]
        st = ctx.stats()
    moved = sum(st[k]["bytes"] for k in ("host", "staged", "cufile"))
    assert torch.equal(part, w[100:110])
    assert moved <= 10 * 1024 * 4 + 8192, moved


# ------------------------------------------------------------------------------- sharding
def test_sharded_save_load(tmp_path):
    sd = {"layer%d.w" % i: torch.randn(64, 64) for i in range(6)}
    sd["emb"] = torch.randn(100, 64)
    sd["tied"] = sd["emb"]
    d = tmp_path / "ck"
    ck.save(sd, d / "model.safetensors", max_shard_size="40KB", crc32c=True)
    names = sorted(os.listdir(d))
    assert "model.safetensors.index.json" in names
    shards = [n for n in names if n.startswith("model-")]
    assert len(shards) > 1
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    assert set(idx["weight_map"]) == set(sd) - {"tied"}
    assert idx["metadata"]["total_size"] == sum(t.nbytes for k, t in sd.items() if k != "tied")
    for s in shards:                                   # each shard is plain safetensors
        ref = safetensors_torch.load_file(str(d / s))
        for k, t in ref.items():
            assert torch.equal(t, sd[k])
    for where in (d, d / "model.safetensors", d / "model.safetensors.index.json"):
        got = ck.load(where)
        assert set(got) == set(sd)
        assert got["tied"] is got["emb"]
        for k in sd:
            assert torch.equal(got[k], sd[k])
    # re-save unsharded at the same path: the index and shards go away
    ck.save(sd, d / "model.safetensors")
    assert sorted(os.listdir(d)) == ["model.safetensors"]


def test_hf_style_sharded_checkpoint_loads(tmp_path):
    sd = {"a.weight": torch.randn(10, 10), "b.weight": torch.randn(20),
          "c.bias": torch.randn(3).to(torch.bfloat16)}
    d = tmp_path / "hf"
    d.mkdir()
    safetensors_torch.save_file({"a.weight": sd["a.weight"]}, str(d / "model-00001-of-00002.safetensors"),
                                metadata={"format": "pt"})
    safetensors_torch.save_file({"b.weight": sd["b.weight"], "c.bias": sd["c.bias"]},
                                str(d / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    (d / "model.safetensors.index.json").write_text(json.dumps({
        "metadata": {"total_size": 466},
        "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                       "b.weight": "model-00002-of-00002.safetensors",
                       "c.bias": "model-00002-of-00002.safetensors"}}))
    got = ck.load(d)
    assert set(got) == set(sd)
    for k in sd:
        assert torch.equal(got[k], sd[k])
    with ck.safe_open(d) as f:
        assert torch.equal(f.get_slice("a.weight")[2:4, 1:3], sd["a.weight"][2:4, 1:3])
    # a shard missing a tensor the index names, and an index escaping the directory
    (d / "model.safetensors.index.json").write_text(json.dumps({
        "weight_map": {"zzz": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(FerryError, match='"zzz" is not in model-00001-of-00002'):
        ck.load(d)                       # the C parser's message, unchanged
    (d / "model.safetensors.index.json").write_text(json.dumps({
        "weight_map": {"a.weight": "../evil.safetensors"}}))
    with pytest.raises(FerryError, match="not a plain relative file name"):
        ck.load(d)


# ------------------------------------------------------------------------- corruption
def _good_file(tmp_path, crc=True):
    sd = {"a": torch.randn(300, 40), "b": torch.arange(4096, dtype=torch.int64),
          "c": torch.randn(5)}
    p = tmp_path / "good.safetensors"
    ck.save(sd, p, crc32c=crc)
    return sd, p


def test_truncated_files(tmp_path):
    sd, p = _good_file(tmp_path)
    data = p.read_bytes()
    ds = data_start(p)
    for cut in [0, 3, 8, 100, ds - 1, ds, ds + 1, ds + 4096, len(data) - 1]:
        q = tmp_path / ("t%d.safetensors" % cut)
        q.write_bytes(data[:cut])
        with pytest.raises(FerryError) as ei:
            ck.load(q)
        msg = str(ei.value)
        assert str(q) in msg and ("trunc" in msg or "not a safetensors" in msg
                                  or "corrupt" in msg), msg


def test_bitflip_detected_by_crc(tmp_path):
    sd, p = _good_file(tmp_path, crc=True)
    data = bytearray(p.read_bytes())
    ds = data_start(p)
    rng = random.Random(5)
    for trial in range(6):
        q = tmp_path / ("f%d.safetensors" % trial)
        bad = bytearray(data)
        pos = rng.randrange(ds, len(bad))
        bad[pos] ^= 1 << rng.randrange(8)
        q.write_bytes(bad)
        with pytest.raises(FerryError, match="CRC32C mismatch"):
            ck.load(q)
        with pytest.raises(FerryError, match="CRC32C"):
            ck.load_into({k: torch.empty_like(v) for k, v in sd.items()}, q)
        # verify=False: loads (the caller opted out)
        ck.load(q, verify=False)


def test_header_corruption(tmp_path):
    sd, p = _good_file(tmp_path)
    data = p.read_bytes()
    ds = data_start(p)
    hdr = json.loads(data[8:ds])

    count = [0]

    def write(h, n=None, tail=None):
        js = json.dumps(h).encode()
        js += b" " * (ds - 8 - len(js))
        count[0] += 1
        q = tmp_path / ("h%d.safetensors" % count[0])
        q.write_bytes(struct.pack("<Q", len(js) if n is None else n) + js + data[ds:]
                      if tail is None else tail)
        return q

    cases = []
    h = json.loads(json.dumps(hdr)); h["a"]["dtype"] = "F99"; cases.append((write(h), "dtype"))
    h = json.loads(json.dumps(hdr)); h["a"]["shape"] = [300, 41]; cases.append((write(h), "shape"))
    h = json.loads(json.dumps(hdr)); h["a"]["shape"] = [-1, 40]; cases.append((write(h), "shape"))
    h = json.loads(json.dumps(hdr)); h["b"]["data_offsets"] = [10 ** 12, 10 ** 12 + 32768]
    cases.append((write(h), "past the data"))
    h = json.loads(json.dumps(hdr)); h["a"]["data_offsets"] = [5, 2]; cases.append((write(h), "data_offsets"))
    h = json.loads(json.dumps(hdr)); h["__metadata__"] = {"x": 1}; cases.append((write(h), "__metadata__"))
    h = json.loads(json.dumps(hdr)); h["__metadata__"]["ferry.crc32c"] = "{nope"
    cases.append((write(h), "(?i)crc32c"))
    cases.append((write(hdr, n=2 ** 62), "header length"))
    cases.append((write(hdr, tail=data[:8] + b"{\"a\": [" + data[15:]), "byte 15: JSON"))
    cases.append((write(hdr, tail=data[:8] + b"\xff\xfe" + data[10:]), "byte 8"))
    q = tmp_path / "dup.safetensors"
    js = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},' \
         b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    q.write_bytes(struct.pack("<Q", len(js)) + js + b"\x00")
    cases.append((q, "duplicate"))
    for q, word in cases:
        with pytest.raises(FerryError, match=word):
            ck.load(q)


def test_random_header_damage_never_crashes(tmp_path):
    sd, p = _good_file(tmp_path, crc=False)
    data = p.read_bytes()
    ds = data_start(p)
    rng = random.Random(11)
    for trial in range(60):
        bad = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(0, min(ds, 400))
            bad[pos] = rng.randrange(256)
        q = tmp_path / "r.safetensors"
        q.write_bytes(bad)
        try:
            got = ck.load(q)
        except FerryError:
            continue
        assert isinstance(got, dict)


def test_missing_file(tmp_path):
    with pytest.raises(FerryError, match="(?i)no such file"):
        ck.load(tmp_path / "nope.safetensors")


# ------------------------------------------------------------------ atomicity, SIGKILL
KILL_SCRIPT = r"""
import os, sys, torch
sys.path.insert(0, {pydir!r})
from ferry import checkpoint as ck
path = sys.argv[1]
sds = [{{"w%d" % i: torch.full((1 << 18,), float(v * 100 + i)) for i in range(24)}} for v in (1, 2)]
print("ready", flush=True)
i = 0
while True:
    ck.save(sds[i % 2], path)
    i += 1
"""


def test_sigkill_during_save_keeps_previous(tmp_path):
    pydir = PYDIR
    script = tmp_path / "saver.py"
    script.write_text(KILL_SCRIPT.format(pydir=pydir))
    sds = [{"w%d" % i: torch.full((1 << 18,), float(v * 100 + i)) for i in range(24)}
           for v in (1, 2)]
    refs = []
    for i, sd in enumerate(sds):
        r = tmp_path / ("ref%d.safetensors" % i)
        ck.save(sd, r)
        refs.append(r.read_bytes())
    d = tmp_path / "run"
    d.mkdir()
    path = d / "ckpt.safetensors"
    ck.save(sds[0], path)
    rng = random.Random(7)
    env = dict(os.environ, PYTHONPATH=pydir + os.pathsep + os.environ.get("PYTHONPATH", ""))
    killed_mid_save = 0
    # at least 4 kills, and more (up to 12) until one has landed inside a save: a random
    # moment of a loop of saves sometimes falls between them (a clean clone on the 2-core
    # machine, 2026-12-04: none of 4)
    for trial in range(12):
        if trial >= 4 and killed_mid_save:
            break
        proc = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE,
                                env=env)
        try:
            line = proc.stdout.readline()
            assert line.strip() == b"ready"
            time.sleep(rng.uniform(0.0, 0.6))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            proc.stdout.close()
        killed_mid_save += any(".ferry-tmp." in n for n in os.listdir(d))
        content = path.read_bytes()
        assert content in refs, "checkpoint damaged after SIGKILL (trial %d)" % trial
        got = ck.load(path)
        which = refs.index(content)
        for k in sds[which]:
            assert torch.equal(got[k], sds[which][k])
    assert killed_mid_save >= 1          # the kills did land inside saves
    # a later save is not tripped by leftovers, and reclaims them
    ck.save(sds[1], path)
    assert path.read_bytes() == refs[1]
    assert sorted(os.listdir(d)) == ["ckpt.safetensors"]


def test_failed_save_cleans_temp(tmp_path, monkeypatch):
    path = tmp_path / "c.safetensors"
    ck.save({"a": torch.ones(3)}, path)
    before = path.read_bytes()

    class Boom(Exception):
        pass

    from ferry import _ckpt_run
    real = _ckpt_run._ferry

    class BoomPlan:
        def __init__(self):
            self.n = 0

        def write_file(self, *a, **k):
            raise Boom()

    class FakeFerry:
        Plan = BoomPlan

        def __getattr__(self, n):
            return getattr(real, n)

    monkeypatch.setattr(_ckpt_run, "_ferry", FakeFerry())
    with pytest.raises(Boom):
        ck.save({"a": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["c.safetensors"]


# ---------------------------------------------------------------------------- async_save
def test_async_save(tmp_path):
    model, opt = _adam_state()
    sd = {"model": model.state_dict(), "optim": opt.state_dict()}
    snap = {k: v.clone() for k, v in model.state_dict().items()}
    p = tmp_path / "async.safetensors"
    fut = ck.async_save(sd, p, crc32c=True)
    assert fut.blocked_s >= 0
    with torch.no_grad():                      # training continues: must not leak into the file
        for t in model.parameters():
            t.add_(1.0)
    assert fut.result(timeout=60) == str(p)
    got = ck.load(p)
    for k, v in snap.items():
        assert torch.equal(got["model"][k], v)
    assert repr(got["optim"]["param_groups"]) == repr(sd["optim"]["param_groups"])
    # back-to-back saves are ordered; errors surface through the future
    f1 = ck.async_save({"x": torch.ones(4)}, tmp_path / "one.safetensors")
    f2 = ck.async_save({"x": torch.zeros(4)}, tmp_path / "one.safetensors")
    f2.result(timeout=60)
    assert f1.done()
    assert torch.equal(ck.load(tmp_path / "one.safetensors")["x"], torch.zeros(4))
    ck.reserve_pinned(sd)                      # the next async_save reuses this buffer
    arena = ck._async._free_arenas[-1]
    f3 = ck.async_save(sd, tmp_path / "three.safetensors")
    f3.result(timeout=60)
    assert any(a is arena for a in ck._async._free_arenas)
    ck.release_pinned()
    assert ck._async._free_arenas == []
    with pytest.raises(FerryError, match="NUL"):   # refused before the snapshot
        ck.async_save({"x": torch.ones(2)}, tmp_path / "no" / "such" / "\0dir" / "f")
    # errors while writing surface through result(): the write waits until the target
    # has become a directory (a fixed order, not a race with the writing thread)
    import threading
    go, real_write = threading.Event(), ck._save.write

    def held_write(*args, **kwargs):
        go.wait(60)
        return real_write(*args, **kwargs)
    ck._save.write = held_write
    try:
        f4 = ck.async_save({"x": torch.ones(2)}, tmp_path / "one.safetensors",
                           metadata={"a": "b"})
        os.replace(tmp_path / "one.safetensors", tmp_path / "moved.safetensors")
        (tmp_path / "one.safetensors").mkdir()
        go.set()
        with pytest.raises(Exception):
            f4.result(timeout=60)
    finally:
        go.set()
        ck._save.write = real_write


# ------------------------------------------------------------------------------------ DCP
dcp = pytest.importorskip("torch.distributed.checkpoint")


def test_dcp_single_process(tmp_path):
    model, opt = _adam_state()
    sd = {"model": model.state_dict(), "optim": opt.state_dict(),
          "extra": {"step": 5, "blob": b"xyz", "name": "run1"}}
    d = tmp_path / "dcp"
    dcp.save(sd, storage_writer=ck.FerryWriter(d))
    names = sorted(os.listdir(d))
    assert ".metadata" in names and any(n.endswith(".ferry") for n in names)
    model2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    sd2 = {"model": model2.state_dict(), "extra": {"step": 0, "blob": b"", "name": ""}}
    dcp.load(sd2, storage_reader=ck.FerryReader(d))
    for a, b in zip(model2.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    assert sd2["extra"] == {"step": 5, "blob": b"xyz", "name": "run1"}
    # raw, aligned tensor bytes in the data file
    md = ck.FerryReader(d).read_metadata()
    assert md.ferry_layout
    for idx, (at, dtype, shape) in md.ferry_layout.items():
        assert at % 4096 == 0
    # overwrite: old data files are replaced, the checkpoint id form works, async_save
    dcp.save(sd, checkpoint_id=str(d), storage_writer=ck.FerryWriter())
    fut = dcp.async_save(sd, storage_writer=ck.FerryWriter(d))
    fut.result(timeout=60)
    assert sum(n.endswith(".ferry") for n in os.listdir(d)) == 1
    sd3 = {"model": model2.state_dict()}
    for t in sd3["model"].values():
        t.zero_()
    dcp.load(sd3, checkpoint_id=str(d), storage_reader=ck.FerryReader())
    for a, b in zip(model2.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    assert ck.FerryWriter.validate_checkpoint_id(str(d))
    assert not ck.FerryWriter.validate_checkpoint_id("s3://bucket/x")
    w = ck.FerryWriter(d)
    w.reset()
    assert w.storage_meta().checkpoint_id == str(d)


def test_dcp_truncated_data_file(tmp_path):
    d = tmp_path / "dcp"
    dcp.save({"w": torch.randn(1000, 10)}, storage_writer=ck.FerryWriter(d))
    data = [n for n in os.listdir(d) if n.endswith(".ferry")][0]
    with open(d / data, "r+b") as f:
        f.truncate(1000)
    from torch.distributed.checkpoint.api import CheckpointException
    with pytest.raises((FerryError, CheckpointException)) as ei:
        dcp.load({"w": torch.empty(1000, 10)}, storage_reader=ck.FerryReader(d))
    assert "trunc" in str(ei.value)
    os.unlink(d / ".metadata")
    with pytest.raises((FerryError, CheckpointException), match="metadata"):
        dcp.load({"w": torch.empty(1000, 10)}, storage_reader=ck.FerryReader(d))


DCP_WORKER = r"""
import os, sys, datetime
sys.path.insert(0, {pydir!r})
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard, Replicate
from ferry import checkpoint as ck

def full():
    g = torch.Generator().manual_seed(3)
    return {{"w": torch.randn(64, 480, generator=g), "b": torch.randn(50, generator=g),
             "h": torch.randn(30, 16, generator=g).to(torch.bfloat16)}}

def main(rank, world, d, port, mode):
    import faulthandler
    faulthandler.enable(all_threads=True)   # a crash shows every thread's Python stack
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (world,))
    f = full()
    if mode.startswith("save"):
        sd = {{"w": distribute_tensor(f["w"], mesh, [Shard(0)]),
               "b": distribute_tensor(f["b"], mesh, [Shard(0)]),
               "h": distribute_tensor(f["h"], mesh, [Shard(1)]),
               "step": 12, "r": f["b"] * 2}}
        dcp.save(sd, storage_writer=ck.FerryWriter(d) if mode == "save" else
                 dcp.FileSystemWriter(d))          # save_torch: torch's own .distcp files
    else:  # load resharded: Shard(1) where Shard(0) was saved and vice versa
        sd = {{"w": distribute_tensor(torch.zeros(64, 480), mesh, [Shard(1)]),
               "b": distribute_tensor(torch.zeros(50), mesh, [Replicate()]),
               "h": distribute_tensor(torch.zeros(30, 16, dtype=torch.bfloat16), mesh, [Shard(0)]),
               "step": 0, "r": torch.zeros(50)}}
        ctx = ck._io.context()
        ctx.reset_stats()
        dcp.load(sd, storage_reader=ck.FerryReader(d))
        st = ctx.stats()
        moved = sum(st[k]["bytes"] for k in ("host", "staged", "cufile"))
        # this rank needs half the columns of w (64 x 240 x 4 bytes), b, half of h, r and
        # the pickled step: far less than w's 122880 stored bytes; and per item read, the
        # zip directory of its archive (~0.6 KiB) that says where its bytes start
        need = 64 * 240 * 4 + 50 * 4 + 15 * 16 * 2 + 50 * 4 + 4096 + 6 * 640
        if mode == "load_torch":             # torch's archives: data.pkl read too (~1 KiB)
            need += 8 * 1024
        assert 64 * 240 * 4 <= moved <= need, (moved, need)
        for k in ("w", "b", "h"):
            assert torch.equal(sd[k].full_tensor(), f[k]), k
        assert sd["step"] == 12 and torch.equal(sd["r"], f["b"] * 2)
    dist.barrier()
    dist.destroy_process_group()
    # Everything this test checks is checked above. Leave without the interpreter's
    # teardown: rank 0 aborted there once in CI ("terminate called without an active
    # exception", a C++ thread killed while it took the GIL of a finalising interpreter;
    # ferry's own code is C and its threads never take the GIL here). The likely thread:
    # gloo's, dropping the last works of DTensor.full_tensor()'s collectives, as in
    # pytorch/pytorch PR 179291. Not reproduced in 60 further runs.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

if __name__ == "__main__":
    import torch.multiprocessing as mp
    d, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    mp.spawn(main, args=(2, d, port, mode), nprocs=2, join=True)
    print("OK", mode)
"""


def _free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _run_dcp_worker(tmp_path, d, mode):
    script = tmp_path / "dcp_worker.py"
    script.write_text(DCP_WORKER.format(pydir=PYDIR))
    env = dict(os.environ, PYTHONPATH=PYDIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(script), str(d), str(_free_port()), mode],
                       capture_output=True, env=env, timeout=120)
    assert r.returncode == 0 and b"OK" in r.stdout, r.stderr.decode()[-3000:]


def test_dcp_two_process_gloo_and_resharding(tmp_path):
    d = tmp_path / "dist"
    _run_dcp_worker(tmp_path, d, "save")
    files = sorted(n for n in os.listdir(d) if n.endswith(".ferry"))
    assert len(files) == 2 and files[0].startswith("__0_") and files[1].startswith("__1_")
    # world size 1: plain tensors assembled from both ranks' chunks
    g = torch.Generator().manual_seed(3)
    ref = {"w": torch.randn(64, 480, generator=g), "b": torch.randn(50, generator=g),
           "h": torch.randn(30, 16, generator=g).to(torch.bfloat16)}
    sd = {"w": torch.zeros(64, 480), "b": torch.zeros(50),
          "h": torch.zeros(30, 16, dtype=torch.bfloat16), "step": 0}
    dcp.load(sd, storage_reader=ck.FerryReader(d))
    for k in ref:
        assert torch.equal(sd[k], ref[k]), k
    assert sd["step"] == 12
    # world size 2 with a different sharding
    _run_dcp_worker(tmp_path, d, "load")


def test_dcp_two_process_torch_writer_read_by_ferry_resharded(tmp_path):
    """issue 38 item 1: FerryReader reads directories torch's own FileSystemWriter wrote
    (its .distcp torch.save archives), saved by 2 ranks and loaded resharded by 1 and 2."""
    d = tmp_path / "torchdist"
    _run_dcp_worker(tmp_path, d, "save_torch")
    assert any(n.endswith(".distcp") for n in os.listdir(d))
    g = torch.Generator().manual_seed(3)
    ref = {"w": torch.randn(64, 480, generator=g), "b": torch.randn(50, generator=g),
           "h": torch.randn(30, 16, generator=g).to(torch.bfloat16)}
    sd = {"w": torch.zeros(64, 480), "b": torch.zeros(50),
          "h": torch.zeros(30, 16, dtype=torch.bfloat16), "step": 0}
    dcp.load(sd, storage_reader=ck.FerryReader(d))
    for k in ref:
        assert torch.equal(sd[k], ref[k]), k
    assert sd["step"] == 12
    _run_dcp_worker(tmp_path, d, "load_torch")
