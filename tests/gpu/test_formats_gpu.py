"""npy, safetensors and netCDF classic files written by their reference
libraries, read by ferry straight into CUDA memory through the engine
(byteswaps and strided placements done on the device side), compared bit for
bit with numpy. Skips with a reason where there is no GPU (cupy or torch
arrays where installed, else ferry's own device arrays)."""
import random

import numpy as np
import pytest

import ferry_arrays
from ferry import _ferry as F


def _backend():
    try:
        import torch
        if torch.cuda.is_available():
            return "torch"
    except Exception:
        pass
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return "cupy"
    except Exception:
        pass
    return "ferry"   # ferry's own device arrays (tests/gpu/ferry_arrays.py)


BACKEND = _backend()


def device_bytes(ctx, n):
    """A CUDA byte buffer, filled with a marker so unwritten bytes show."""
    if BACKEND == "ferry":
        return ferry_arrays.full(ctx, (max(n, 1),), np.uint8)
    if BACKEND == "torch":
        import torch
        return torch.full((max(n, 1),), 0x5A, dtype=torch.uint8, device="cuda")
    import cupy
    return cupy.full((max(n, 1),), 0x5A, dtype=cupy.uint8)


def to_host(ctx, buf, n):
    if BACKEND == "ferry":
        return ferry_arrays.to_numpy(ctx, buf, np.uint8)[:n].tobytes()
    if BACKEND == "torch":
        return buf[:n].cpu().numpy().tobytes()
    import cupy
    return cupy.asnumpy(buf[:n]).tobytes()


def read_to_gpu(ctx, ds, name, sel=None, native=True):
    info = ds.variables()[ds.find(name) if isinstance(name, str) else name]
    shape = info["shape"] if sel is None else tuple(len(range(*s)) for s in sel)
    n = int(np.prod(shape)) * info["itemsize"]
    buf = device_bytes(ctx, n)
    plan = F.Plan()
    assert plan.read(ds, name, buf, selection=sel, native=native) == n
    if n:
        job = ctx.submit(plan)
        job.wait()
        assert job.path in ("staged", "cufile")
    return to_host(ctx, buf, n)


def expect(a):
    a = np.array(a, order="C")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("="))
    return a.tobytes()


def random_selection(rng, shape):
    out = []
    for n in shape:
        start = rng.randrange(0, n)
        out.append((start, rng.randrange(start, n + 1), rng.choice([1, 2, 3])))
    return out


@pytest.mark.parametrize("dt,order", [(">f4", "C"), ("<f8", "F"), (">i2", "F"), ("<c8", "C"), ("|u1", "C")])
def test_npy_to_gpu(tmp_path, ctx, dt, order):
    a = np.asarray((np.random.default_rng(0).standard_normal((33, 17, 5)) * 50).astype(dt), order=order)
    p = str(tmp_path / "a.npy")
    np.save(p, a)
    ds = F.Dataset(ctx, p)
    assert read_to_gpu(ctx, ds, 0) == expect(a)
    r = random.Random(dt + order)
    for _ in range(10):
        sel = random_selection(r, a.shape)
        assert read_to_gpu(ctx, ds, 0, sel) == expect(a[tuple(slice(*s) for s in sel)])


def test_large_npy_to_gpu(tmp_path, ctx):
    a = np.random.default_rng(1).standard_normal((4096, 4096)).astype(">f4")   # 64 MiB: many tasks
    p = str(tmp_path / "big.npy")
    np.save(p, a)
    ds = F.Dataset(ctx, p)
    assert read_to_gpu(ctx, ds, 0) == expect(a)
    assert read_to_gpu(ctx, ds, 0, [(0, 4096, 3), (5, 4000, 7)]) == expect(a[::3, 5:4000:7])


def test_safetensors_to_gpu(tmp_path, ctx):
    st = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(2)
    tensors = {"w": rng.standard_normal((64, 48)).astype("f4"), "h": rng.standard_normal((7, 9)).astype("f2"),
               "i": np.arange(100, dtype="i8")}
    p = str(tmp_path / "m.safetensors")
    st.save_file(tensors, p)
    ds = F.Dataset(ctx, p)
    for name, a in tensors.items():
        assert read_to_gpu(ctx, ds, name) == expect(a)
    assert read_to_gpu(ctx, ds, "w", [(3, 60, 5), (1, 2, 1)]) == expect(tensors["w"][3:60:5, 1:2])


def test_safetensors_bf16_fp8_to_gpu(tmp_path, ctx):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    t = {"bf": torch.randn(31, 17).to(torch.bfloat16), "f8": torch.rand(8, 8).to(torch.float8_e4m3fn)}
    p = str(tmp_path / "t.safetensors")
    st.save_file(t, p)
    ds = F.Dataset(ctx, p)
    for name, x in t.items():
        raw = x.contiguous().view(torch.uint8).numpy().tobytes()
        assert read_to_gpu(ctx, ds, name) == raw


@pytest.mark.parametrize("fmt", ["NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET", "NETCDF3_64BIT_DATA"])
def test_netcdf3_to_gpu(tmp_path, ctx, fmt):
    netCDF4 = pytest.importorskip("netCDF4")
    p = str(tmp_path / "t.nc")
    rng = np.random.default_rng(3)
    data = {"t2m": rng.standard_normal((12, 20, 30)).astype("f4"), "sp": rng.standard_normal((12, 20, 30)).astype("f8"),
            "flag": rng.integers(-100, 100, (12,)).astype("i2")}
    with netCDF4.Dataset(p, "w", format=fmt) as nc:
        nc.createDimension("time", None); nc.createDimension("lat", 20); nc.createDimension("lon", 30)
        for name, a in data.items():
            v = nc.createVariable(name, a.dtype, ("time", "lat", "lon")[:a.ndim])
            v[:] = a
        z = nc.createVariable("orog", "f4", ("lat", "lon"))
        z[:] = rng.standard_normal((20, 30)).astype("f4")
        data["orog"] = np.asarray(z[:])
    ds = F.Dataset(ctx, p)
    r = random.Random(fmt)
    for name, a in data.items():
        assert read_to_gpu(ctx, ds, name) == expect(a), name
        for _ in range(5):
            sel = random_selection(r, a.shape)
            assert read_to_gpu(ctx, ds, name, sel) == expect(a[tuple(slice(*s) for s in sel)]), (name, sel)
    # as stored: big-endian bytes, untouched
    assert read_to_gpu(ctx, ds, "t2m", native=False) == np.array(data["t2m"], dtype=">f4").tobytes()
