"""Paths of every kind (str, bytes, PathLike, os.fsencode'd names that are not
UTF-8) open in ferry.open / ferry.read / read_many, and shapes no array library
can hold become a FerryError naming the file and variable (issue 16 items 6/7).
Files are written by numpy (np.save) or byte by byte for shapes numpy refuses."""
import os
import pathlib
import struct

import numpy as np
import pytest

import ferry
from ferry import _ferry


def write_npy_header(path, descr, shape):
    """An npy file numpy itself cannot write (its shape is too large to hold)."""
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    h = d.encode() + b" " * ((64 - (10 + len(d) + 1) % 64) % 64) + b"\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h)


@pytest.fixture
def odd_dir(tmp_path):
    d = os.fsencode(tmp_path) + b"/caf\xe9-\xff"       # not UTF-8
    try:
        os.mkdir(d)
    except (OSError, UnicodeError):
        pytest.skip("file system refuses non-UTF-8 names")
    return d


def test_bytes_and_non_utf8_paths(odd_dir):
    x = np.arange(12, dtype=np.int16).reshape(3, 4)
    p = odd_dir + b"/x.npy"
    with open(p, "wb") as f:
        np.save(f, x)
    for path in (p, os.fsdecode(p), pathlib.Path(os.fsdecode(p))):
        np.testing.assert_array_equal(ferry.read(path), x)
        with ferry.open(path) as f:
            assert list(f) == ["x"] and os.fsencode(f.path) == p
            np.testing.assert_array_equal(f["x"][1:], x[1:])
    np.testing.assert_array_equal(ferry.read_many([(p, None, (slice(0, 2),))])[0], x[:2])
    raw = odd_dir + b"/raw.bin"
    with open(raw, "wb") as f:
        f.write(b"hello")
    assert ferry.read(raw).tobytes() == b"hello"


def test_error_naming_a_non_utf8_path_is_a_ferry_error(odd_dir):
    with pytest.raises(ferry.FerryError) as ei:
        ferry.read(odd_dir + b"/missing.npy")
    assert "missing.npy" in str(ei.value) and "\\xe9" in str(ei.value)
    bad = odd_dir + b"/bad.npy"
    with open(bad, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00\x10\x00{'descr': junk}\n")
    with pytest.raises(ferry.FerryError, match="bad.npy"):
        ferry.open(bad)


@pytest.mark.parametrize("descr,shape", [("<f8", (2**62, 0)), ("<u1", (0, 2**63 - 1, 2)), ("<f4", (0, 2**62))])
def test_zero_size_shapes_no_library_can_hold(tmp_path, descr, shape):
    p = tmp_path / "z.npy"
    write_npy_header(p, descr, shape)
    with pytest.raises(ValueError):
        np.load(p)                                   # numpy refuses it too
    with pytest.raises(ferry.FerryError) as ei:
        ferry.read(p)
    assert str(p) in str(ei.value)


def test_zero_size_shape_that_fits_reads_like_numpy(tmp_path):
    p = tmp_path / "z.npy"
    write_npy_header(p, "<f8", (0, 2**40))
    r = ferry.read(p)
    assert r.shape == np.load(p).shape == (0, 2**40) and r.dtype == np.float64


def test_empty_strides_do_not_overflow():
    # the stride loop once computed 8 * (2**63 - 1) in a signed integer (UBSan)
    with pytest.raises(OverflowError):
        _ferry.empty((0, 2**63 - 1), "<f8")
    a = _ferry.empty((0, 2**62), "<u1")
    assert np.asarray(a).shape == (0, 2**62) and a.nbytes == 0
