"""ferry.read(..., out=) checks the destination as numpy's and torch's out= do:
the dtype and the shape must be the selection's, or the caller asks for a byte
view explicitly (out_bytes=True). Golden data come from numpy."""
import numpy as np
import pytest

import ferry


@pytest.fixture
def npy(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    p = tmp_path / "x.npy"
    np.save(p, x)
    return p, x


def test_wrong_dtype_is_refused_naming_file_and_variable(npy):
    p, x = npy
    out = np.zeros(6, np.float64)          # same 48 bytes, another type
    with pytest.raises(ferry.FerryError) as ei:
        ferry.read(p, out=out)
    msg = str(ei.value)
    assert str(p) in msg and "<f8" in msg and "<f4" in msg
    assert "out_bytes" in msg
    assert not out.any()                    # nothing was written


def test_wrong_shape_is_refused(npy):
    p, x = npy
    with pytest.raises(ferry.FerryError, match="shape"):
        ferry.read(p, out=np.zeros((4, 3), np.float32))
    with pytest.raises(ferry.FerryError, match="bytes"):
        ferry.read(p, out=np.zeros(5, np.float32))


def test_variable_named_in_the_error(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    st.save_file({"w": np.ones((2, 2), np.float16)}, str(tmp_path / "m.safetensors"))
    with pytest.raises(ferry.FerryError) as ei:
        ferry.read(tmp_path / "m.safetensors", "w", out=np.zeros(2, np.float32))
    assert "m.safetensors" in str(ei.value) and "w" in str(ei.value)
    with pytest.raises(ferry.FerryError):
        ferry.open(tmp_path / "m.safetensors")["w"].read(out=np.zeros(2, np.float32))


def test_matching_out_and_explicit_byte_view(npy):
    p, x = npy
    out = np.zeros((3, 4), np.float32)
    assert ferry.read(p, out=out) is out
    np.testing.assert_array_equal(out, x)
    raw = np.zeros(48, np.uint8)
    assert ferry.read(p, out=raw, out_bytes=True) is raw
    assert raw.tobytes() == x.tobytes()
    sel = np.zeros(4, np.float32)
    ferry.read(p, selection=(1,), out=sel)
    np.testing.assert_array_equal(sel, x[1])


def test_torch_out_dtype_checked():
    torch = pytest.importorskip("torch")
    import tempfile, os
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.npy")
        x = np.arange(6, dtype=np.int64)
        np.save(p, x)
        with pytest.raises(ferry.FerryError):
            ferry.read(p, out=torch.zeros(6, dtype=torch.float64))
        t = torch.zeros(6, dtype=torch.int64)
        ferry.read(p, out=t)
        assert t.tolist() == list(range(6))
        b = torch.zeros(24, dtype=torch.bfloat16)   # a byte view into a type numpy lacks
        ferry.read(p, out=b, out_bytes=True)
        assert b.view(torch.int64).tolist() == list(range(6))
