"""ferry.read gives what numpy's own reader gives (issue 38.7): big-endian
unicode .npy in its stored byte order, .npz members by name (stored and
deflated), structured .npy as numpy's record array on the host."""
import numpy as np
import pytest

import ferry


@pytest.mark.parametrize("dt", [">U3", "<U3", ">U1", "<U5"])
def test_unicode_npy_as_numpy(tmp_path, dt):
    p = str(tmp_path / "u.npy")
    a = np.array(["abc", "de", "", "\u00e9\u4e2d\U0001f600"[: int(dt[2:])]], dtype=dt)
    np.save(p, a)
    ref = np.load(p)
    got = ferry.read(p)
    assert got.dtype == ref.dtype and got.tolist() == ref.tolist()
    part = ferry.read(p, selection=(slice(1, 4, 2),))
    assert part.dtype == ref.dtype and part.tolist() == ref[1:4:2].tolist()


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_members_by_name(tmp_path, save):
    p = str(tmp_path / "z.npz")
    a, b = np.arange(12, dtype="<i4").reshape(3, 4), np.linspace(0, 1, 5)
    save(p, a=a, b=b)
    ref = np.load(p)
    for name in ("a", "b", "a.npy"):
        got = ferry.read(p, name)
        want = ref[name[:-4] if name.endswith(".npy") else name]
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.array_equal(ferry.read(p, "a", selection=(slice(1, 3), 2)), a[1:3, 2])
    out = np.empty(5)
    assert ferry.read(p, "b", out=out) is out and np.array_equal(out, b)
    with pytest.raises(ferry.FerryError, match="name one of") as ei:
        ferry.read(p)
    assert p in str(ei.value)
    with pytest.raises(ferry.FerryError, match="no array 'c'"):
        ferry.read(p, "c")


def test_single_member_npz_needs_no_name(tmp_path):
    p = str(tmp_path / "one.npz")
    np.savez(p, only=np.arange(3))
    assert np.array_equal(ferry.read(p), np.arange(3))


def test_structured_npy_on_the_host(tmp_path):
    p = str(tmp_path / "s.npy")
    a = np.array([(1, 2.5, b"ab"), (3, -1.0, b"c")], dtype=[("x", "<i4"), ("y", ">f8"), ("z", "S2")])
    np.save(p, a)
    got = ferry.read(p)
    assert got.dtype == np.load(p).dtype and got.tolist() == a.tolist()
    assert ferry.read(p, selection=(slice(1, 2),)).tolist() == a[1:2].tolist()
    with pytest.raises(ferry.FerryError, match="structured dtype .* no GPU array") as ei:
        ferry.read(p, device=0)
    assert p in str(ei.value)


def test_bfloat16_to_numpy_names_the_way_out(tmp_path):
    """numpy has no bfloat16: np.asarray on such a result says to use DLPack
    (torch.from_dlpack) rather than numpy's "data type 'bfloat16' not understood"."""
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    p = str(tmp_path / "bf.safetensors")
    w = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    st.save_file({"w": w}, p)
    got = ferry.read(p, "w")
    with pytest.raises(TypeError, match=r"bfloat16 array has no numpy dtype.*torch\.from_dlpack"):
        np.asarray(got)
    assert torch.equal(torch.from_dlpack(got), w)
