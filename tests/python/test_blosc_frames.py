"""Blosc frames as numcodecs writes them, through a Zarr v2 store (issue 36.2):
frames compressed on several threads store their blocks out of order (the
bstarts table says where), and must read exactly; a frame whose header field
was damaged (blocksize, nbytes, a block start) is a FerryError naming the
chunk, never other values."""
import struct

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")

import ferry  # noqa: E402


def _store(tmp_path, threads):
    """A v2 store of two 4 MB chunks whose files are frames numcodecs' Blosc
    wrote on `threads` threads (written here: zarr encodes in its own pool)."""
    a = np.random.default_rng(0).integers(0, 1000, (2_000_000,)).astype("<i4")
    p = str(tmp_path / f"b{threads}.zarr")
    blosc = numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, blocksize=4096)
    zarr.create_array(p, shape=a.shape, chunks=(1_000_000,), dtype="<i4", zarr_format=2, compressors=blosc)
    n, use = numcodecs.blosc.get_nthreads(), numcodecs.blosc.use_threads
    numcodecs.blosc.set_nthreads(threads)
    numcodecs.blosc.use_threads = threads > 1
    try:
        for i in range(2):
            with open(f"{p}/{i}", "wb") as f:
                f.write(blosc.encode(a[i * 1_000_000:(i + 1) * 1_000_000]))
    finally:
        numcodecs.blosc.set_nthreads(n)
        numcodecs.blosc.use_threads = use
    return p, a


def test_threaded_frames_read_exactly(tmp_path):
    p, a = _store(tmp_path, 4)
    with open(p + "/0", "rb") as f:
        fr = f.read()
    nb, bs = struct.unpack_from("<II", fr, 4)
    starts = struct.unpack_from(f"<{(nb + bs - 1) // bs}I", fr, 16)
    if list(starts) == sorted(starts):
        pytest.skip("c-blosc wrote this frame's blocks in order")
    assert np.array_equal(ferry.read(p), a)


@pytest.mark.parametrize("field", ["blocksize", "nbytes", "bstart"])
def test_damaged_header_is_an_error(tmp_path, field):
    p, a = _store(tmp_path, 1)
    chunk = p + "/1"
    b = bytearray(open(chunk, "rb").read())
    at = {"blocksize": 8, "nbytes": 4, "bstart": 20}[field]
    v = struct.unpack_from("<I", b, at)[0]
    struct.pack_into("<I", b, at, v ^ (1 << 14) if field != "bstart" else struct.unpack_from("<I", b, 16)[0])
    with open(chunk, "wb") as f:
        f.write(b)
    assert np.array_equal(ferry.read(p, selection=(slice(0, 1_000_000),)), a[:1_000_000])
    with pytest.raises(ferry.FerryError, match="blosc") as ei:
        ferry.read(p)
    assert chunk in str(ei.value)
