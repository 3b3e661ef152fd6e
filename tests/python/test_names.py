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
