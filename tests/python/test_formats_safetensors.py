"""safetensors files written by safetensors itself (numpy and torch flavours,
and a sharded checkpoint with its index), read by ferry into host memory and
compared bit for bit with what safetensors' own loader returns — whole
tensors and seeded-random slices along every dimension."""
import json
import random

import numpy as np
import pytest

from selections import random_selection

F = pytest.importorskip("ferry._ferry")
st_numpy = pytest.importorskip("safetensors.numpy")


# typestrs numpy lacks: read them as same-size unsigned integers
RAW = {"bfloat16": "<u2", "float8_e4m3fn": "|u1", "float8_e5m2": "|u1", "float8_e8m0fnu": "|u1",
       "float8_e4m3fnuz": "|u1", "float8_e5m2fnuz": "|u1", "float4_e2m1fn_x2": "|u1"}


def read(ctx, ds, name, sel=None):
    info = ds.variables()[ds.find(name)]
    dt = np.dtype(RAW.get(info["typestr"], info["typestr"]))
    shape = info["shape"] if sel is None else tuple(len(range(*s)) for s in sel)
    out = np.empty(shape, dtype=dt)
    plan = F.Plan()
    assert plan.read(ds, name, out, selection=sel) == out.nbytes
    if out.nbytes:
        ctx.run(plan)
    return out


def same_bits(a, b):
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    assert a.shape == b.shape
    assert a.tobytes() == b.tobytes()


NUMPY_DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "float16", "int32", "uint32", "float32",
                "float64", "int64", "uint64", "complex64"]


def test_numpy_flavour_every_dtype(tmp_path, ctx):
    rng = np.random.default_rng(0)
    tensors = {}
    for i, dt in enumerate(NUMPY_DTYPES):
        shape = (3 + i % 3, 4, 2 + i % 2)
        raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dt).itemsize, dtype=np.uint8)
        if dt == "bool":
            raw %= 2
        tensors[f"t_{dt}"] = raw.view(dt).reshape(shape)
    tensors["scalar"] = np.array(3.5, dtype="float32")
    tensors["empty"] = np.zeros((0, 4), dtype="float32")
    p = tmp_path / "m.safetensors"
    try:
        st_numpy.save_file(tensors, str(p), metadata={"format": "np", "owner": "caf\u00e9"})
    except Exception:  # older safetensors: no complex64
        del tensors["t_complex64"]
        st_numpy.save_file(tensors, str(p), metadata={"format": "np", "owner": "caf\u00e9"})
    ref = st_numpy.load_file(str(p))
    ds = F.Dataset(ctx, str(p))
    assert ds.format == "safetensors"
    assert json.loads(ds.attrs) == {"format": "np", "owner": "caf\u00e9"}
    assert sorted(v["name"] for v in ds.variables()) == sorted(tensors)
    r = random.Random(1)
    for name, want in ref.items():
        info = ds.variables()[ds.find(name)]
        assert info["shape"] == want.shape
        assert np.dtype(info["typestr"]) == want.dtype
        same_bits(read(ctx, ds, name), want)
        for _ in range(6):
            sel = random_selection(r, want.shape)
            same_bits(read(ctx, ds, name, sel), want[tuple(slice(*s) for s in sel)])
    # byte ranges are exactly where the file holds the tensors
    data = p.read_bytes()
    for info in ds.variables():
        chunk = data[info["data_offset"]:info["data_offset"] + info["data_bytes"]]
        assert chunk == np.ascontiguousarray(ref[info["name"]]).tobytes()


def test_torch_flavour_bf16_fp8(tmp_path, ctx):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(0)
    tensors = {
        "bf16": torch.randn(5, 7, generator=g).to(torch.bfloat16),
        "f16": torch.randn(3, 3, generator=g).to(torch.float16),
        "f32": torch.randn(2, 3, 4, generator=g),
        "i64": torch.arange(10),
        "b": torch.tensor([True, False, True]),
    }
    fp8 = {"f8_e4m3": "float8_e4m3fn", "f8_e5m2": "float8_e5m2", "f8_e8m0": "float8_e8m0fnu",
           "f8_e4m3fnuz": "float8_e4m3fnuz", "f8_e5m2fnuz": "float8_e5m2fnuz"}
    for name, attr in fp8.items():
        if hasattr(torch, attr):
            tensors[name] = torch.rand(4, 6, generator=g).to(getattr(torch, attr))
    p = tmp_path / "t.safetensors"
    try:
        st_torch.save_file(tensors, str(p), metadata={"format": "pt"})
    except Exception:
        for name in ["f8_e8m0", "f8_e4m3fnuz", "f8_e5m2fnuz"]:
            tensors.pop(name, None)
        st_torch.save_file(tensors, str(p), metadata={"format": "pt"})
    ref = st_torch.load_file(str(p))
    ds = F.Dataset(ctx, str(p))
    info = {v["name"]: v for v in ds.variables()}
    assert info["bf16"]["typestr"] == "bfloat16" and info["bf16"]["dtype"] == "bf16"
    if "f8_e4m3" in tensors:
        assert info["f8_e4m3"]["typestr"] == "float8_e4m3fn" and info["f8_e4m3"]["dtype"] == "f8e4m3"
        assert info["f8_e5m2"]["typestr"] == "float8_e5m2" and info["f8_e5m2"]["dtype"] == "f8e5m2"
    r = random.Random(2)
    for name, t in ref.items():
        want = t.contiguous().view(torch.uint8).numpy().view(np.dtype(f"<u{t.element_size()}")) \
            if t.dtype not in (torch.bool,) else t.numpy()
        want = want.reshape(tuple(t.shape))
        got = read(ctx, ds, name)
        assert got.tobytes() == want.tobytes(), name
        for _ in range(5):
            sel = random_selection(r, tuple(t.shape))
            got = read(ctx, ds, name, sel)
            assert got.tobytes() == np.ascontiguousarray(want[tuple(slice(*s) for s in sel)]).tobytes(), (name, sel)


def test_sharded_checkpoint_with_index(tmp_path, ctx):
    rng = np.random.default_rng(3)
    shards = {
        "model-00001-of-00002.safetensors": {"embed": rng.standard_normal((6, 4)).astype("f4"),
                                             "layer.0.w": rng.standard_normal((4, 4)).astype("f2")},
        "model-00002-of-00002.safetensors": {"layer.1.w": rng.standard_normal((4, 4)).astype("f4"),
                                             "head": np.arange(12, dtype="i8").reshape(3, 4)},
    }
    weight_map = {}
    total = 0
    for fname, ts in shards.items():
        st_numpy.save_file(ts, str(tmp_path / fname), metadata={"format": "np"})
        for k, v in ts.items():
            weight_map[k] = fname
            total += v.nbytes
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    ds = F.Dataset(ctx, str(idx))
    assert ds.format == "safetensors"
    assert json.loads(ds.attrs) == {"total_size": total}
    assert sorted(v["name"] for v in ds.variables()) == sorted(weight_map)
    for v in ds.variables():
        assert v["path"].endswith(weight_map[v["name"]])
    for fname, ts in shards.items():
        for name, want in ts.items():
            same_bits(read(ctx, ds, name), want)
            same_bits(read(ctx, ds, name, [(1, want.shape[0], 2), (0, want.shape[1], 3)]), want[1::2, ::3])


def test_large_tensor_slices_along_each_dim(tmp_path, ctx):
    a = np.random.default_rng(4).standard_normal((64, 300, 50)).astype("f4")
    p = tmp_path / "big.safetensors"
    st_numpy.save_file({"a": a}, str(p))
    ds = F.Dataset(ctx, str(p))
    for sel in [[(5, 6, 1), (0, 300, 1), (0, 50, 1)], [(0, 64, 1), (7, 8, 1), (0, 50, 1)],
                [(0, 64, 1), (0, 300, 1), (49, 50, 1)], [(0, 64, 9), (3, 300, 31), (1, 50, 7)]]:
        same_bits(read(ctx, ds, "a", sel), a[tuple(slice(*s) for s in sel)])


def test_malformed_files_raise_with_path(tmp_path, ctx):
    p = tmp_path / "ok.safetensors"
    st_numpy.save_file({"a": np.arange(8, dtype="f4"), "b": np.arange(3, dtype="i2")}, str(p))
    data = p.read_bytes()
    for cut in [4, 8, 20, len(data) - 2]:
        q = tmp_path / f"cut{cut}.safetensors"
        q.write_bytes(data[:cut])
        with pytest.raises(F.FerryError) as e:
            F.Dataset(ctx, str(q), format="safetensors")
        assert str(q) in str(e.value)
    # a lying offset: make tensor b overlap a
    n = int.from_bytes(data[:8], "little")
    hdr = json.loads(data[8:8 + n])
    hdr["b"]["data_offsets"] = [hdr["a"]["data_offsets"][0], hdr["a"]["data_offsets"][0] + 6]
    text = json.dumps(hdr).encode()
    text += b" " * (n - len(text)) if len(text) <= n else b""
    q = tmp_path / "lie.safetensors"
    q.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n:])
    with pytest.raises(F.FerryError) as e:
        F.Dataset(ctx, str(q))
    assert e.value.code == F.EFORMAT and "byte" in str(e.value) and str(q) in str(e.value)
