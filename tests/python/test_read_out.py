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


def test_another_itemsize_is_a_dtype_mismatch_not_a_byte_count(npy):
    """float64 out= for float32 data is reported as the dtype it is (issue 38 item 9), not as
    "out holds 96 bytes, the selection needs 48"."""
    p, x = npy
    with pytest.raises(ferry.FerryError, match="dtype mismatch") as ei:
        ferry.read(p, out=np.zeros((3, 4), np.float64))
    msg = str(ei.value)
    assert str(p) in msg and "out=" in msg and "<f8" in msg and "<f4" in msg and "bytes" not in msg.split("(")[0]


def test_non_contiguous_and_read_only_out_name_file_variable_and_out(tmp_path):
    """A strided view or a read-only array is a FerryError naming the file, the variable and
    out= (it was a bare "ValueError: ndarray is not C-contiguous"), before anything is read."""
    p = str(tmp_path / "m.safetensors")
    st = pytest.importorskip("safetensors.numpy")
    st.save_file({"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, p)
    strided = np.zeros((3, 8), np.float32)[:, ::2]
    ro = np.zeros((3, 4), np.float32)
    ro.flags.writeable = False
    for out, what in ((strided, "not C-contiguous"), (ro, "read-only")):
        for read in (lambda o: ferry.read(p, "w", out=o), lambda o: ferry.open(p)["w"].read(out=o)):
            with pytest.raises(ferry.FerryError, match=what) as ei:
                read(out)
            msg = str(ei.value)
            assert p in msg and ": w:" in msg and "out=" in msg, msg
    assert not strided.any()


def test_torch_cpu_out_strided_is_refused_and_plain_is_filled_in_place(tmp_path):
    torch = pytest.importorskip("torch")
    p = str(tmp_path / "m.npy")
    np.save(p, np.arange(12, dtype=np.float32).reshape(3, 4))
    t = torch.zeros(4, 3).t()                  # a transposed CPU tensor
    with pytest.raises(ferry.FerryError, match="not C-contiguous"):
        ferry.read(p, out=t)
    t = torch.zeros(3, 4)                      # a CPU tensor is filled in place (DLPack), as it is
    assert ferry.read(p, out=t) is t and t.flatten().tolist() == list(range(12))


def test_out_of_an_npz_member_and_a_structured_npy_is_checked_the_same_way(tmp_path):
    p = str(tmp_path / "a.npz")
    np.savez(p, a=np.arange(6.0))
    with pytest.raises(ferry.FerryError, match="not C-contiguous") as ei:
        ferry.read(p, "a", out=np.zeros(12)[::2])
    assert p in str(ei.value) and "out=" in str(ei.value)
    out = np.zeros(6)
    assert ferry.read(p, "a", out=out) is out and out.tolist() == list(range(6))


def test_buffer_layout_is_what_the_engine_is_handed():
    """One extension call describes any memory argument (issue 37): typestr, shape, strides,
    contiguity, read-only, device, stream; Python checks out= with it instead of re-deriving."""
    from ferry import _ferry
    lay = _ferry.buffer_layout(np.zeros((3, 4), np.float32))
    assert (lay["typestr"], lay["shape"], lay["contiguous"], lay["readonly"], lay["device"], lay["nbytes"]) == \
        ("<f4", (3, 4), True, False, -1, 48)
    lay = _ferry.buffer_layout(np.zeros((4, 6), np.int16)[:, 1:5])
    assert lay["strides"] == (12, 2) and not lay["contiguous"]
    assert _ferry.buffer_layout(b"abc")["readonly"] is True
    a = ferry.empty((2, 5), "<i4")
    assert _ferry.buffer_layout(a)["shape"] == (2, 5) and _ferry.buffer_layout(a)["source"] == "array"
    assert _ferry.buffer_layout((4096, 10, -1))["nbytes"] == 10
    with pytest.raises(TypeError, match="expected memory"):
        _ferry.buffer_layout(12345)


def test_buffer_layout_of_torch_cpu_tensors_through_dlpack():
    from ferry import _ferry
    torch = pytest.importorskip("torch")
    lay = _ferry.buffer_layout(torch.zeros(2, 3, dtype=torch.bfloat16))
    assert (lay["typestr"], lay["shape"], lay["source"], lay["device"]) == ("bfloat16", (2, 3), "dlpack", -1)
    assert not _ferry.buffer_layout(torch.zeros(3, 4)[:, :2])["contiguous"]


def test_one_current_device_resolver():
    """"The current CUDA device" is answered in one place (ferry._current_cuda_device), and no
    function guesses device 0 when a pointer's device cannot be told (the old _device_of)."""
    import pathlib
    root = pathlib.Path(ferry.__file__).parent
    calls = [str(f.relative_to(root)) for f in root.rglob("*.py") if "cuda.current_device()" in f.read_text()]
    assert calls == ["__init__.py"], calls
    assert not hasattr(ferry, "_device_of")


def test_image_decode_out_is_checked_by_the_same_checker():
    """ferry.images.decode(out=) answers a strided, mistyped or misshapen out= as ferry.read does."""
    pytest.importorskip("PIL")
    import io

    from PIL import Image

    from ferry import images
    b = io.BytesIO()
    Image.fromarray(np.full((4, 6, 3), 7, np.uint8)).save(b, format="PNG")
    try:
        ref = images.decode(b.getvalue())
    except ferry.FerryError as e:
        pytest.skip(f"no PNG decoder in this build: {e}")
    for out, what in ((np.zeros((4, 12, 3), np.uint8)[:, ::2], "not C-contiguous"),
                      (np.zeros((4, 6, 3), np.float32), "dtype mismatch"), (np.zeros((6, 4, 3), np.uint8), "shape")):
        with pytest.raises(ferry.FerryError, match=what) as ei:
            images.decode(b.getvalue(), out=out)
        assert "ferry.images.decode: out=" in str(ei.value) and "out_bytes" not in str(ei.value)
    out = np.zeros((4, 6, 3), np.uint8)
    assert images.decode(b.getvalue(), out=out) is out and (out == ref).all()
