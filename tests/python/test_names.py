"""Names once (issue 10 item 3): dtype, codec and size names come from the C
library's one table (ferry_dtype_name / ferry_codec_name / ferry_size_parse),
checked against what safetensors, numpy and torch call the same things."""
import json
import struct

import numpy as np
import pytest

import ferry
from ferry import _ferry


def test_safetensors_names_match_the_files_safetensors_writes(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    arrays = {n: np.zeros(3, dt) for n, dt in
              [("b", np.bool_), ("u1", np.uint8), ("i2", np.int16), ("f2", np.float16), ("i4", np.int32),
               ("f4", np.float32), ("f8", np.float64), ("i8", np.int64), ("u8", np.uint64), ("c8", np.complex64)]}
    p = tmp_path / "m.safetensors"
    st.save_file(arrays, str(p))
    raw = p.read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    with ferry.open(p) as f:
        for name in arrays:
            short = f[name].info["dtype"]
            assert _ferry.dtype_name(short, "safetensors") == header[name]["dtype"]
            assert _ferry.dtype_name(header[name]["dtype"]) == short
            assert np.dtype(_ferry.dtype_name(short, "long")) == arrays[name].dtype
            assert _ferry.dtype_itemsize(short) == arrays[name].dtype.itemsize


def test_long_names_are_torch_dtypes():
    torch = pytest.importorskip("torch")
    for short in ("b1", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "bf16", "f4", "f8", "c8", "c16",
                  "f8e4m3", "f8e5m2"):
        t = getattr(torch, _ferry.dtype_name(short, "long"))
        assert t.itemsize == _ferry.dtype_itemsize(short)
    with pytest.raises(ValueError):
        _ferry.dtype_name("float33")


def test_codec_names():
    assert _ferry.codec_name(_ferry.CODEC_BLOSC) == "blosc" and _ferry.codec_name("deflate") == "zlib"
    with pytest.raises(ValueError):
        _ferry.codec_name("lzma")


@pytest.mark.parametrize("s,n", [("5GB", 5 * 10**9), ("5GiB", 5 << 30), ("5G", 5 << 30), ("8M", 8 << 20),
                                 ("500MB", 500 * 10**6), ("1.5K", 1536), (4096, 4096), ("4096", 4096)])
def test_sizes(s, n):
    assert ferry.parse_size(s) == n


@pytest.mark.parametrize("s", ["", "5X", "-1", "1.0001K", "GB", -5])
def test_bad_sizes(s):
    with pytest.raises(ValueError):
        ferry.parse_size(s)


def test_stats_name_the_kernel_source():
    assert ferry.stats()["kernels"] in ("embedded fatbin", "none")


def test_c_names_every_dtype_safetensors_torch_knows():
    # the FNUZ float8 variants and E8M0 once lived only in a Python table (_ckpt_st.ST_DTYPES)
    st_torch = pytest.importorskip("safetensors.torch")
    torch = pytest.importorskip("torch")
    rows = {r[2]: r for r in _ferry.DTYPES if r[2]}
    types = dict(st_torch._TYPES)
    if hasattr(torch, "float8_e8m0fnu"):
        types.setdefault("F8_E8M0", torch.float8_e8m0fnu)
    for st, tdt in types.items():
        assert st in rows, st
        short, long_name, _, typestr, bits = rows[st]
        assert getattr(torch, long_name) is tdt and bits == 8 * tdt.itemsize
        assert _ferry.dtype_name(typestr, "safetensors") == st   # the parser's typestr maps back


def test_table_rows_agree_with_numpy():
    for short, long_name, st, typestr, bits in _ferry.DTYPES:
        assert _ferry.dtype_name(long_name, "short") == short
        assert _ferry.dtype_name(short, "typestr") == typestr
        if typestr and typestr != long_name and short not in ("M8", "m8"):   # numpy has the type
            assert np.dtype(typestr) == np.dtype(long_name if short != "S1" else "S1")
            assert np.dtype(typestr).itemsize * 8 == bits


def test_fnuz_tensors_load_and_stream_as_their_torch_dtype(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    if not hasattr(torch, "float8_e4m3fnuz"):
        pytest.skip("torch lacks float8_e4m3fnuz")
    import ferry.checkpoint as ckpt
    from ferry.torch import ArrayDataset
    x = torch.rand(8, 3).to(torch.float8_e4m3fnuz)
    p = tmp_path / "q.safetensors"
    st_torch.save_file({"x": x}, str(p))
    with ferry.open(p) as f:
        assert f["x"].info["dtype"] == "f8e4m3fnuz"   # "other" while C lacked the name
    a = ferry.read(p, "x")                            # "unknown typestr" before
    assert a.typestr == "float8_e4m3fnuz" and a.nbytes == 24
    raw = ferry.read(p, "x", out=np.empty(24, np.uint8), out_bytes=True)
    assert raw.tobytes() == x.view(torch.uint8).numpy().tobytes()
    got = ckpt.load(str(p))["x"]
    assert got.dtype == torch.float8_e4m3fnuz and torch.equal(got.view(torch.uint8), x.view(torch.uint8))
    batch = next(iter(ArrayDataset((str(p), "x"), batch_size=8)))
    assert batch.dtype == torch.float8_e4m3fnuz and tuple(batch.shape) == (8, 3)   # was uint8 (8, 3, 1)
    assert torch.equal(batch.view(torch.uint8), x.view(torch.uint8))


def test_sub_byte_tensors_stay_bytes_for_torch(tmp_path):
    # F4 now has a row in C's table; it must still not pass for torch.float4_e2m1fn_x2 of
    # the logical shape (the bytes hold two elements each)
    from ferry.checkpoint import st as _ckpt_st
    assert _ckpt_st.torch_dtype("F4") is None and _ckpt_st.st_of_typestr("float4_e2m1fn_x2") is None
    torch = pytest.importorskip("torch")
    if hasattr(torch, "float4_e2m1fn_x2"):
        with pytest.raises(TypeError):
            _ckpt_st.st_dtype(torch.float4_e2m1fn_x2)
