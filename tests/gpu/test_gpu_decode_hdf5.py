"""HDF5 (netCDF-4 layout) chunks decoded on the GPU by nvCOMP: shuffle +
deflate (a zlib stream) [+ fletcher32] chunks written by h5py, edge chunks
stored full size, placed as tiles of a device array with decode="gpu" and
"cpu", equal byte for byte to h5py's data. Apart from test_gpu_decode.py so
that it runs where h5py is and zarr is not (a GPU machine may have only one). Skips with
the reason where there is no GPU or no nvCOMP."""
import numpy as np
import pytest

import ferry_arrays
from ferry import _ferry as F


@pytest.fixture(scope="module")
def gctx(ctx):
    if not ctx.nvcomp_status.startswith("loaded"):
        pytest.skip("nvCOMP not loaded: " + ctx.nvcomp_status)
    return ctx


def data(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 100).astype(dtype)


h5py = pytest.importorskip("h5py", reason="h5py is not installed")


def hdf5_chunks(path, name):
    """(chunk offset in elements, byte offset, size) of every stored chunk, from h5py."""
    out = []
    with h5py.File(path, "r") as f:
        d = f[name]
        d.id.chunk_iter(lambda info: out.append((info.chunk_offset, info.byte_offset, info.size)))
        return out, d.chunks, d.shape, d.dtype, d.fletcher32


@pytest.mark.parametrize("dtype", ["<f4", "<f8", "<i2"])
@pytest.mark.parametrize("fletcher", [False, True])
def test_hdf5_zlib_shuffle_on_gpu(gctx, tmp_path, dtype, fletcher):
    """netCDF-4's layout: HDF5 chunks through shuffle + deflate (a zlib stream)
    [+ fletcher32], edge chunks stored full size, placed as tiles."""
    path = str(tmp_path / "t.h5")
    a = data((50, 37), dtype, 3)
    with h5py.File(path, "w") as f:
        f.create_dataset("t2m", data=a, chunks=(16, 10), compression="gzip", compression_opts=4, shuffle=True,
                         fletcher32=fletcher)
    chunks, cshape, shape, dt, _ = hdf5_chunks(path, "t2m")
    es = dt.itemsize
    for decode in ("gpu", "cpu"):
        dst = ferry_arrays.full(gctx, shape, dt)
        plan = F.Plan()
        for (r0, c0), off, size in chunks:
            rows, cols = min(cshape[0], shape[0] - r0), min(cshape[1], shape[1] - c0)
            codecs = ([("fletcher32", 0)] if fletcher else []) + [("zlib", 0), ("shuffle", es)]
            plan.extent(path=path, offset=off, length=size, codecs=codecs, decoded_size=cshape[0] * cshape[1] * es,
                        dst=dst, dst_offset=(r0 * shape[1] + c0) * es, label="t2m",
                        place={"itemsize": es, "count": [rows, cols], "src_stride": [cshape[1] * es, es],
                               "dst_stride": [shape[1] * es, es]})
        gctx.reset_stats()
        gctx.run(plan, decode=decode)
        st = gctx.stats()
        assert ferry_arrays.to_numpy(gctx, dst, dt).tobytes() == a.tobytes(), decode
        if decode == "gpu":
            assert st["gpu_chunks"] == len(chunks) and st["gpu_cpu_fallbacks"] == 0, st
        else:
            assert st["gpu_chunks"] == 0


def test_hdf5_auto_one_queue(gctx, tmp_path, monkeypatch):
    """AUTO on netCDF-4's deflate + shuffle chunks: one queue for the GPU and
    the CPU workers. With the built-in rates a small load stays on the CPU (one
    GPU chunk's latency exceeds the CPU's whole time); with rates where the GPU
    helps (FERRY_GPU_RATES) both may take chunks; either way every chunk is
    decoded once, exactly (h5py's bytes), and none through the fallback."""
    path = str(tmp_path / "q.h5")
    a = data((256, 64), "<f4", 5)
    with h5py.File(path, "w") as f:
        f.create_dataset("t2m", data=a, chunks=(4, 64), compression="gzip", compression_opts=1, shuffle=True)
    chunks, cshape, shape, dt, _ = hdf5_chunks(path, "t2m")
    es = dt.itemsize

    def run(rates):
        if rates:
            monkeypatch.setenv("FERRY_GPU_RATES", rates)
        else:
            monkeypatch.delenv("FERRY_GPU_RATES", raising=False)
        monkeypatch.setenv("FERRY_GPU_BATCH", "4K")   # 4 chunks a batch
        c = F.Context()   # a context reads its knobs when it is made
        dst = ferry_arrays.full(c, shape, dt)
        plan = F.Plan()
        for (r0, c0), off, size in chunks:
            plan.extent(path=path, offset=off, length=size, codecs=[("zlib", 0), ("shuffle", es)],
                        decoded_size=cshape[0] * cshape[1] * es, dst=dst, dst_offset=(r0 * shape[1] + c0) * es)
        c.run(plan)
        st = c.stats()
        assert ferry_arrays.to_numpy(c, dst, dt).tobytes() == a.tobytes()
        assert st["gpu_cpu_fallbacks"] == 0 and st["gpu_chunks"] <= len(chunks), st
        return st["gpu_chunks"]

    assert run(None) == 0 or gctx.config()["threads"] < 16   # fewer threads: the CPU's time grows, the GPU may help
    run("6.34,1000000,0.05")
