"""ferry._ferry.npy_read_many: one-sample .npy files (written by numpy here) planned
as one batch, checked against np.load; headers that differ in dtype, shape or order
fail naming the file; the same array stored with another header is still read."""
import os

import numpy as np
import pytest

import ferry
from ferry import _ferry


@pytest.fixture()
def ctx():
    return _ferry.default_context()


def write(tmp_path, arrays, name="s{:04d}.npy"):
    paths = []
    for i, a in enumerate(arrays):
        p = os.path.join(tmp_path, name.format(i))
        np.save(p, a)
        paths.append(p)
    return paths


def test_many_files_match_numpy(tmp_path, ctx):
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 255, (3, 17, 19), dtype=np.uint8) for _ in range(300)]
    paths = write(tmp_path, arrays)
    out = np.empty((300, 3, 17, 19), np.uint8)
    info = _ferry.npy_read_many(ctx, paths, out)
    assert info == {"typestr": "|u1", "shape": (3, 17, 19), "fortran_order": False, "nbytes": 3 * 17 * 19}
    np.testing.assert_array_equal(out, np.stack([np.load(p) for p in paths]))


def test_big_endian_native_and_stride(tmp_path, ctx):
    arrays = [np.arange(i, i + 10, dtype=">f8") for i in range(7)]
    paths = write(tmp_path, arrays)
    # rows of 96 bytes for arrays of 80: gaps stay untouched
    raw = np.full(7 * 96, 0xAB, np.uint8)
    _ferry.npy_read_many(ctx, paths, raw, stride=96)
    rows = raw.reshape(7, 96)
    for i in range(7):
        np.testing.assert_array_equal(rows[i, :80].view("<f8"), np.load(paths[i]).astype("<f8"))
        assert (rows[i, 80:] == 0xAB).all()
    stored = np.empty(70, ">f8")
    _ferry.npy_read_many(ctx, paths, stored, native=False)
    np.testing.assert_array_equal(stored.reshape(7, 10), np.stack([np.load(p) for p in paths]))


def test_scalar_label_files(tmp_path, ctx):
    paths = write(tmp_path, [np.array(i, dtype=np.int64) for i in range(50)], "label{:03d}.npy")
    out = np.empty(50, np.int64)
    info = _ferry.npy_read_many(ctx, paths, out)
    assert info["shape"] == () and info["nbytes"] == 8
    np.testing.assert_array_equal(out, np.arange(50))


@pytest.mark.parametrize("bad", [np.zeros((3, 4), np.float32), np.zeros((4, 3), np.uint8),
                                 np.zeros((3, 5), np.uint8), np.zeros((12,), np.uint8)])
def test_other_dtype_or_shape_names_file(tmp_path, ctx, bad):
    paths = write(tmp_path, [np.zeros((3, 4), np.uint8)] * 5)
    odd = os.path.join(tmp_path, "odd.npy")
    np.save(odd, bad)
    paths.insert(3, odd)
    out = np.empty(6 * 64, np.uint8)
    with pytest.raises(ferry.FerryError) as e:
        _ferry.npy_read_many(ctx, paths, out)
    assert "odd.npy" in str(e.value) and "differs" in str(e.value)
    assert paths[0] in str(e.value)


def test_same_array_other_header_version(tmp_path, ctx):
    arrays = [np.full((2, 3), i, np.int16) for i in range(6)]
    paths = write(tmp_path, arrays)
    # numpy's version 2.0 header: another data offset for the same array
    with open(paths[4], "wb") as f:
        np.lib.format.write_array(f, arrays[4], version=(2, 0))
    out = np.empty((6, 2, 3), np.int16)
    _ferry.npy_read_many(ctx, paths, out)
    np.testing.assert_array_equal(out, np.stack(arrays))


def test_fortran_order(tmp_path, ctx):
    arrays = [np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4) + i) for i in range(3)]
    paths = write(tmp_path, arrays)
    out = np.empty((3, 12), np.int32)
    with pytest.raises(ferry.FerryError, match="Fortran"):
        _ferry.npy_read_many(ctx, paths, out)
    info = _ferry.npy_read_many(ctx, paths, out, stored_order=True)
    assert info["fortran_order"]
    for i in range(3):
        np.testing.assert_array_equal(out[i].reshape(4, 3).T, arrays[i])


def test_errors_name_the_file(tmp_path, ctx):
    paths = write(tmp_path, [np.zeros(100, np.uint8)] * 4)
    out = np.empty(400, np.uint8)
    with pytest.raises(ferry.FerryError, match="missing.npy"):
        _ferry.npy_read_many(ctx, paths[:2] + [os.path.join(tmp_path, "missing.npy")], out)
    with open(paths[2], "r+b") as f:
        f.truncate(os.path.getsize(paths[2]) - 10)
    with pytest.raises(ferry.FerryError, match=os.path.basename(paths[2])):
        _ferry.npy_read_many(ctx, paths, out)
    with pytest.raises(ferry.FerryError, match="do not fit"):
        _ferry.npy_read_many(ctx, paths, np.empty(399, np.uint8))
    with pytest.raises(ferry.FerryError):
        _ferry.npy_read_many(ctx, [], out)


def test_replaced_between_batches(tmp_path, ctx):
    paths = write(tmp_path, [np.full(1000, i, np.uint8) for i in range(8)])
    out = np.empty((8, 1000), np.uint8)
    _ferry.npy_read_many(ctx, paths, out)
    tmp = paths[5] + ".tmp.npy"
    np.save(tmp, np.full(1000, 99, np.uint8))
    os.replace(tmp, paths[5])
    _ferry.npy_read_many(ctx, paths, out)
    assert (out[5] == 99).all() and (out[4] == 4).all()
