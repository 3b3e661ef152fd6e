"""The Python API's device side: ferry.read / read_many / open(...)[...] with
device=N, and out= device arrays filled in place, on files written by numpy,
safetensors and a raw byte file. Results are cupy arrays where cupy is
installed, else ferry's own device arrays; both are copied back and compared
with numpy. Runs on a real GPU and on the simulated driver (tests/cudasim)."""
import numpy as np
import pytest

import ferry
import ferry_arrays
from ferry import _ferry as F


def host(ctx, a):
    """A device result as numpy (cupy array or ferry.Array)."""
    if isinstance(a, F.Array):
        assert a.device >= 0, "expected device memory"
        ts = a.typestr
        return ferry_arrays.to_numpy(ctx, a, np.dtype(ts))
    import cupy
    assert isinstance(a, cupy.ndarray)
    return cupy.asnumpy(a)


def device_of(a):
    return a.device if isinstance(a, F.Array) else a.device.id


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("api")
    rng = np.random.default_rng(7)
    a = rng.standard_normal((40, 33, 7)).astype("<f4")
    np.save(d / "a.npy", a)
    b = rng.integers(-1000, 1000, (25, 9)).astype(">i8")   # big-endian: swapped on the device
    np.save(d / "b.npy", b)
    raw = rng.integers(0, 256, 100_003, dtype=np.uint8)
    raw.tofile(d / "blob.bin")
    t = {"w": rng.standard_normal((64, 48)).astype("f2"), "i": np.arange(300, dtype="i4")}
    try:
        from safetensors.numpy import save_file
        save_file(t, str(d / "m.safetensors"))
    except ImportError:
        t = None
    return d, a, b, raw, t


def test_read_whole_and_selection_to_device(ctx, files):
    d, a, b, raw, _ = files
    x = ferry.read(d / "a.npy", device=0)
    assert tuple(x.shape) == a.shape and device_of(x) == 0
    np.testing.assert_array_equal(host(ctx, x), a)
    y = ferry.read(d / "a.npy", device="cuda:0", selection=(slice(3, 30, 4), 5, slice(None, None, 2)))
    np.testing.assert_array_equal(host(ctx, y), a[3:30:4, 5, ::2])
    z = ferry.read(d / "b.npy", device=0)
    np.testing.assert_array_equal(host(ctx, z), b.astype("<i8"))
    r = ferry.read(d / "blob.bin", device=0)
    np.testing.assert_array_equal(host(ctx, r), raw)


def test_read_many_to_device(ctx, files):
    d, a, b, raw, t = files
    items = [(d / "a.npy", None, (slice(0, 10),)), (d / "b.npy",), (d / "blob.bin", None, (slice(17, 50_017),))]
    if t is not None:
        items.append((d / "m.safetensors", "w", (slice(5, 60, 3), slice(1, 2))))
    got = ferry.read_many(items, device=0)
    np.testing.assert_array_equal(host(ctx, got[0]), a[:10])
    np.testing.assert_array_equal(host(ctx, got[1]), b.astype("<i8"))
    np.testing.assert_array_equal(host(ctx, got[2]), raw[17:50_017])
    if t is not None:
        np.testing.assert_array_equal(host(ctx, got[3]), t["w"][5:60:3, 1:2])


def test_open_variables_to_device(ctx, files):
    d, _, _, _, t = files
    if t is None:
        pytest.skip("safetensors is not installed")
    f = ferry.open(d / "m.safetensors", device=0)
    np.testing.assert_array_equal(host(ctx, f["i"][100:250:7]), t["i"][100:250:7])
    np.testing.assert_array_equal(host(ctx, f["w"].read()), t["w"])


def test_out_device_array_filled_in_place(ctx, files):
    d, a, _, _, _ = files
    out = ferry_arrays.full(ctx, (10, 33, 7), np.float32)
    ret = ferry.read(d / "a.npy", selection=(slice(20, 30),), out=out)
    assert ret is out or getattr(ret, "ptr", None) == out.ptr
    np.testing.assert_array_equal(ferry_arrays.to_numpy(ctx, out, np.float32), a[20:30])


def test_second_device(ctx, files):
    if ctx.cuda_device_count() < 2:
        pytest.skip("one CUDA device")
    d, a, _, _, _ = files
    x = ferry.read(d / "a.npy", device=1)
    assert device_of(x) == 1
    np.testing.assert_array_equal(host(ctx, x), a)
