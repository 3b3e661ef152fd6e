"""Zarr stores written by zarr-python, read by ferry straight into CUDA memory
(cupy arrays, torch tensors and ferry's own device arrays) through the engine,
compared bit for bit with zarr's own read. Skips with a reason where there is
no GPU or no zarr (and per backend where cupy/torch lack CUDA)."""
import random

import numpy as np
import pytest

zarr = pytest.importorskip("zarr", reason="zarr-python is not installed")
numcodecs = pytest.importorskip("numcodecs", reason="numcodecs is not installed")
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec  # noqa: E402

import ferry_arrays  # noqa: E402
from ferry import _ferry as F  # noqa: E402


def _backends():
    out = []
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            out.append("cupy")
    except Exception:
        pass
    try:
        import torch
        if torch.cuda.is_available():
            out.append("torch")
    except Exception:
        pass
    return out + ["ferry"]   # ferry's own device arrays (tests/gpu/ferry_arrays.py)


BACKENDS = _backends()


def device_empty(ctx, backend, shape, dtype):
    if backend == "ferry":
        return ferry_arrays.full(ctx, shape, dtype)
    if backend == "cupy":
        import cupy
        return cupy.full(shape, 0x5A, dtype=dtype)
    import torch
    tdt = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32, "int16": torch.int16,
           "uint8": torch.uint8, "int64": torch.int64}[np.dtype(dtype).name]
    return torch.full(shape, 0x5A, dtype=tdt, device="cuda")


def to_host(ctx, backend, arr, dtype):
    if backend == "ferry":
        return ferry_arrays.to_numpy(ctx, arr, dtype)
    if backend == "cupy":
        import cupy
        return cupy.asnumpy(arr)
    return arr.cpu().numpy()


def read_gpu(ctx, backend, path, selection=None):
    ds = F.Dataset(ctx, path)
    v = ds.variables()[0]
    shape = v["shape"] if selection is None else tuple(len(range(*s)) for s in selection)
    ts = "<" + v["typestr"][1:] if v["typestr"][0] == ">" else v["typestr"]
    dst = device_empty(ctx, backend, shape, np.dtype(ts))
    plan = F.Plan()
    plan.read(ds, 0, dst, selection=selection, native=True)
    ctx.run(plan)
    ds.close()
    return to_host(ctx, backend, dst, np.dtype(ts))


def same(a, b):
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b).astype(np.asarray(b).dtype.newbyteorder("="), copy=False)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def selections(shape, n, seed):
    rnd = random.Random(seed)
    for _ in range(n):
        sel = []
        for s in shape:
            a = rnd.randrange(0, s)
            b = rnd.randrange(a + 1, s + 1)
            sel.append((a, b, rnd.choice([1, 1, 2, 5])))
        yield sel


def make_store(tmp_path, kind):
    rng = np.random.default_rng(7)
    p = str(tmp_path / f"{kind}.zarr")
    shape = (130, 77)
    a = (rng.standard_normal(shape) * 10).astype("<f4")
    if kind == "v2_blosc":
        z = zarr.create_array(p, shape=shape, chunks=(32, 20), dtype="<f4", zarr_format=2,
                              compressors=numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE))
    elif kind == "v2_uncompressed_F":
        z = zarr.create_array(p, shape=shape, chunks=(32, 20), dtype="<f4", zarr_format=2, order="F",
                              compressors=None)
    elif kind == "v3_zstd_missing_nan":
        z = zarr.create_array(p, shape=shape, chunks=(32, 20), dtype="<f4", zarr_format=3,
                              compressors=[ZstdCodec(level=1)], fill_value=float("nan"))
        z[40:90, 10:50] = a[40:90, 10:50]
        return p, z
    elif kind == "v3_big_endian":
        z = zarr.create_array(p, shape=shape, chunks=(32, 20), dtype="<f4", zarr_format=3,
                              serializer=BytesCodec(endian="big"), compressors=None)
    elif kind == "v3_sharded":
        z = zarr.create_array(p, shape=shape, chunks=(64, 40), dtype="<f4", zarr_format=3,
                              serializer=ShardingCodec(chunk_shape=(16, 10),
                                                       codecs=[BytesCodec(), BloscCodec(cname="zstd")]),
                              compressors=None)
        z[0:100, :] = a[0:100, :]
        return p, z
    elif kind == "v3_crc32c":
        z = zarr.create_array(p, shape=shape, chunks=(32, 20), dtype="<f4", zarr_format=3,
                              compressors=[ZstdCodec(level=1), Crc32cCodec()])
    else:
        raise ValueError(kind)
    z[...] = a
    return p, z


KINDS = ["v2_blosc", "v2_uncompressed_F", "v3_zstd_missing_nan", "v3_big_endian", "v3_sharded", "v3_crc32c"]


@pytest.mark.parametrize("backend", ["cupy", "torch", "ferry"])
@pytest.mark.parametrize("kind", KINDS)
def test_zarr_to_gpu(ctx, tmp_path, kind, backend):
    if backend not in BACKENDS:
        pytest.skip(f"{backend} with CUDA is not available")
    p, z = make_store(tmp_path, kind)
    want = z[...]
    assert same(read_gpu(ctx, backend, p), want)
    for sel in selections(z.shape, 5, hash(kind) & 0xFFFF):
        w = z[tuple(slice(*s) for s in sel)]
        assert same(read_gpu(ctx, backend, p, sel), w), sel


@pytest.mark.parametrize("compressed", [False, True])
def test_zarr_with_holes_to_each_device(ctx, tmp_path, compressed):
    """Big-endian chunks (swapped on the device), absent chunks filled there,
    into every device's memory (ferry's own device arrays)."""
    p = str(tmp_path / "h.zarr")
    z = zarr.create_array(p, shape=(40, 33), chunks=(9, 10), dtype=">f8", zarr_format=3, fill_value=7.5,
                          compressors=[ZstdCodec(level=1)] if compressed else None,
                          serializer=BytesCodec(endian="big"))
    z[3:12, 4:9] = 1.25
    z[30:40, 30:33] = np.arange(30.0).reshape(10, 3)
    want = z[...].astype("<f8")
    ds = F.Dataset(ctx, p)
    for dev in range(min(ctx.cuda_device_count(), 2)):
        a = F.empty((40, 33), "<f8", dev, ctx)
        plan = F.Plan()
        plan.read(ds, 0, a, None, True)
        ctx.run(plan)
        assert ctx.cuda_device_of(a.ptr) == dev
        np.testing.assert_array_equal(ferry_arrays.to_numpy(ctx, a, "<f8"), want)
    ds.close()
