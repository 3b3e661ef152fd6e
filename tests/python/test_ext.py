"""ferry._ferry and the ferry package on the host path: reads into numpy,
bytearray and raw pointers, errors, jobs, DLPack / array-interface round trips,
statistics. Golden data are written by numpy in the tests themselves."""
import gc
import os
import sys
import threading

import numpy as np
import pytest

import ferry
from ferry import _ferry


@pytest.fixture
def blob(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=1 << 20, dtype=np.uint8).tobytes() + b"tail!"
    p = tmp_path / "blob.bin"
    p.write_bytes(data)
    return str(p), data


def test_version_and_constants():
    assert ferry.__version__ == _ferry.version() == "0.1.0"
    assert ferry.PATHS == ("auto", "cufile", "staged", "host")
    assert _ferry.strerror(_ferry.ENOTFOUND)
    assert _ferry.CODEC_ZLIB == 1 and _ferry.MAX_DIMS == 16


def test_context_config_and_status(ctx):
    cfg = ctx.config()
    assert cfg["threads"] == 4 and cfg["path"] == "auto"
    assert isinstance(ctx.cuda_status, str) and isinstance(ctx.cufile_status, str)
    assert ctx.cuda_device_count() >= 0
    with pytest.raises(ValueError):
        ferry.Context(path="warp")


@pytest.mark.parametrize("off,n", [(0, 0), (0, 1), (1, 4095), (4095, 4097), (12345, 100000)])
def test_pread_numpy(ctx, blob, off, n):
    path, data = blob
    f = ferry.File(ctx, path)
    a = np.zeros(n, np.uint8)
    assert f.pread(a, off) == n
    assert a.tobytes() == data[off:off + n]
    f.close()


def test_pread_bytearray_memoryview_and_tuple(ctx, blob):
    path, data = blob
    with ferry.File(ctx, path) as f:
        assert f.size == len(data)
        b = bytearray(1000)
        assert f.pread(b, 7) == 1000 and bytes(b) == data[7:1007]
        mv = memoryview(bytearray(50))
        assert f.pread(mv, 3) == 50 and mv.tobytes() == data[3:53]
        a = np.zeros(300, np.uint8)
        assert f.pread((a.ctypes.data, a.nbytes, -1), 99) == 300
        assert a.tobytes() == data[99:399]
        # past the end: a short count like pread
        b = bytearray(100)
        assert f.pread(b, len(data) - 10) == 10
        assert bytes(b[:10]) == data[-10:]


def test_pread_into_readonly_fails(ctx, blob):
    path, _ = blob
    with ferry.File(ctx, path) as f:
        with pytest.raises((ValueError, TypeError, BufferError)):
            f.pread(b"immutable bytes", 0)
        a = np.zeros(10, np.uint8)
        a.flags.writeable = False
        with pytest.raises((ValueError, BufferError)):
            f.pread(a, 0)
        with pytest.raises((ValueError, BufferError)):
            f.pread(np.zeros((10, 10), np.uint8)[:, ::2], 0)   # not contiguous
        with pytest.raises(TypeError):
            f.pread(12345, 0)


def test_pwrite_roundtrip(ctx, tmp_path):
    p = str(tmp_path / "w.bin")
    src = np.arange(10000, dtype=np.int32)
    with ferry.File(ctx, p, "w") as f:
        assert f.pwrite(src, 0) == src.nbytes
        assert f.pwrite(b"xyz", src.nbytes) == 3
        f.sync()
    raw = open(p, "rb").read()
    assert raw[:src.nbytes] == src.tobytes() and raw[-3:] == b"xyz"
    with ferry.File(ctx, p, "r+") as f:
        f.truncate(16)
        assert f.size == 16
        assert 0 <= f.cached() <= 16


def test_errors_name_the_file(ctx, tmp_path):
    missing = str(tmp_path / "nope.bin")
    with pytest.raises(ferry.FerryError) as ei:
        ferry.File(ctx, missing)
    e = ei.value
    assert e.code < 0 and "nope.bin" in e.message and "nope.bin" in str(e)
    assert isinstance(e, Exception) and not isinstance(e, OSError)
    with pytest.raises(ferry.FerryError) as ei:
        ferry.File(ctx, str(tmp_path))          # a directory
    assert str(tmp_path) in ei.value.message
    with pytest.raises(ferry.FerryError) as ei:
        ferry.read(missing)
    assert "nope.bin" in str(ei.value)
    # a malformed file of a known format
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'")
    with pytest.raises(ferry.FerryError) as ei:
        ferry.Dataset(ctx, str(bad))
    assert "bad.npy" in ei.value.message


def test_plan_read_file_fill_extent(ctx, blob):
    path, data = blob
    f = ferry.File(ctx, path)
    dst = np.zeros(4096, np.uint8)
    plan = ferry.Plan()
    plan.read_file(f, 100, 1000, dst)
    plan.read_file(f, 5000, 1000, dst, 1000)
    plan.fill(dst, b"\x07", 2000, 96)
    plan.fill(dst, np.int32(-2).tobytes(), 2096, 100)
    assert len(plan) == 4 and plan.file_bytes == 2000
    assert ctx.run(plan) == 2000
    assert dst[:1000].tobytes() == data[100:1100]
    assert dst[1000:2000].tobytes() == data[5000:6000]
    assert (dst[2000:2096] == 7).all()
    assert (dst[2096:2496].view(np.int32) == -2).all()
    assert (dst[2496:] == 0).all()
    with pytest.raises(ValueError):
        plan.read_file(f, 0, 5000, dst)            # does not fit
    with pytest.raises(ValueError):
        plan.fill(dst, b"", 0)


def test_plan_extent_generic(ctx, tmp_path):
    import zlib
    a = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    comp = zlib.compress(a.tobytes())
    p = tmp_path / "c.bin"
    p.write_bytes(b"HEAD" + comp + a.astype(">f4").tobytes())
    plan = ferry.Plan()
    out = np.zeros((64, 32), np.float32)
    plan.extent(path=str(p), offset=4, length=len(comp), codecs=[("zlib", 0)], decoded_size=a.nbytes, dst=out,
                label="a")
    # a tile: rows 10..19, cols 4..11 of the big-endian copy into a (10, 8) box
    tile = np.zeros((10, 8), np.float32)
    plan.extent(path=str(p), offset=4 + len(comp), length=a.nbytes, codecs=[("byteswap", 4)],
                decoded_size=a.nbytes, dst=tile,
                place={"itemsize": 4, "count": [10, 8], "src_stride": [128, 4], "dst_stride": [32, 4],
                       "src_offset": (10 * 32 + 4) * 4})
    fill = np.zeros((3, 5), np.float64)
    plan.extent(kind="fill", dst=fill, fill=np.float64(1.5).tobytes(),
                place={"itemsize": 8, "count": [3, 5], "src_stride": [0, 0], "dst_stride": [40, 8]})
    ctx.run(plan)
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(tile, a[10:20, 4:12])
    assert (fill == 1.5).all()
    with pytest.raises(ValueError):
        plan.extent(path=str(p), offset=0, length=8, codecs=[("zlib", 0)], dst=out)   # decoded_size missing
    with pytest.raises(ValueError):
        plan.extent(kind="fill", dst=fill, fill=b"12")   # fill must be the element size (1 without place)
    with pytest.raises(ValueError):
        plan.extent(kind="teleport", dst=fill)


def test_job_bytes_host_plans_ask_nothing(ctx, tmp_path):
    """Context.job_bytes (ferry_plan_job_bytes): a plan whose chunks are decoded on the CPU (host
    destinations, or no nvCOMP) runs at its rate at any size: 0, under every policy; a policy name
    that is not one is an error. The GPU side is tests/gpu (test_gpu_decode.c, the XarrayDataset
    groups)."""
    import zlib
    p = tmp_path / "z.bin"
    p.write_bytes(zlib.compress(bytes(4096)))
    plan = ferry.Plan()
    out = np.zeros(4096, np.uint8)
    plan.extent(path=str(p), offset=0, length=p.stat().st_size, codecs=[("zlib", 0)], decoded_size=4096, dst=out)
    for decode in (None, "auto", "cpu", "gpu"):
        assert ctx.job_bytes(plan, decode=decode) == 0
    assert ctx.job_bytes(ferry.Plan()) == 0
    with pytest.raises(ValueError):
        ctx.job_bytes(plan, decode="quantum")
    with pytest.raises(TypeError):
        ctx.job_bytes("not a plan")


def test_plan_budget_host_plans(ctx, tmp_path):
    """Context.plan_budget (ferry_plan_budget): nothing decoded on the GPU (host destinations)
    is one unit a job and no limit on jobs in the engine, under every policy; a unit of 0 bytes,
    a bad policy or a non-plan are errors. The GPU side is tests/gpu (test_gpu_budget.c, the
    XarrayDataset groups)."""
    import zlib
    p = tmp_path / "z.bin"
    p.write_bytes(zlib.compress(bytes(4096)))
    plan = ferry.Plan()
    out = np.zeros(4096, np.uint8)
    plan.extent(path=str(p), offset=0, length=p.stat().st_size, codecs=[("zlib", 0)], decoded_size=4096, dst=out)
    for decode in (None, "auto", "cpu", "gpu"):
        b = ctx.plan_budget(plan, 1 << 20, decode=decode)
        assert (b["units"], b["job_bytes"], b["jobs"], b["job_device_bytes"]) == (1, 1 << 20, 0, 0)
    assert ctx.plan_budget(plan, 4096, keep_free=0)["jobs"] == 0
    with pytest.raises(ferry.FerryError, match="unit_bytes is 0"):
        ctx.plan_budget(plan, 0)
    with pytest.raises(ValueError):
        ctx.plan_budget(plan, 4096, decode="quantum")
    with pytest.raises(TypeError):
        ctx.plan_budget("not a plan", 4096)


def test_codec_error_is_ferry_error(ctx, tmp_path):
    p = tmp_path / "junk.bin"
    p.write_bytes(b"not zlib at all" * 10)
    plan = ferry.Plan()
    out = np.zeros(1000, np.uint8)
    plan.extent(path=str(p), offset=0, length=150, codecs=["zlib"], decoded_size=1000, dst=out, label="junkvar")
    with pytest.raises(ferry.FerryError) as ei:
        ctx.run(plan)
    assert ei.value.code < 0 and ei.value.message


def test_jobs_keep_buffers_alive(ctx, blob):
    path, data = blob
    f = ferry.File(ctx, path)
    plan = ferry.Plan()
    dst = bytearray(len(data))
    plan.read_file(f, 0, len(data), dst)
    job = ctx.submit(plan, threads=2)
    del plan
    gc.collect()
    with pytest.raises(BufferError):
        dst.extend(b"x")              # exported while the job may run
    assert job.wait() == len(data)
    assert job.done() and job.path == "host"
    assert bytes(dst) == data
    dst.extend(b"x")                  # released after wait
    # a job freed without wait completes first
    plan = ferry.Plan()
    a = np.zeros(len(data), np.uint8)
    plan.read_file(f, 0, len(data), a)
    j2 = ctx.submit(plan)
    del j2
    gc.collect()
    assert a.tobytes() == data


def test_job_failure_raises(ctx, tmp_path):
    p = tmp_path / "short.bin"
    p.write_bytes(b"12345")
    f = ferry.File(ctx, str(p))
    plan = ferry.Plan()
    plan.read_file(f, 0, 100, bytearray(100))
    job = ctx.submit(plan)
    with pytest.raises(ferry.FerryError) as ei:
        job.wait()
    assert ei.value.code == _ferry.ESHORT and "short.bin" in ei.value.message
    with pytest.raises(ferry.FerryError):
        job.wait()                     # the result is kept


def test_threads_release_gil(ctx, blob):
    path, data = blob
    errors = []

    def work():
        try:
            for _ in range(20):
                a = np.empty(len(data), np.uint8)
                with ferry.File(ctx, path) as f:
                    f.pread(a)
                assert a.tobytes() == data
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    ts = [threading.Thread(target=work) for _ in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors


def test_array_host_interfaces():
    a = ferry.empty((3, 4), np.float32)
    assert isinstance(a, ferry.Array)
    assert a.shape == (3, 4) and a.typestr == "<f4" and a.device == -1 and a.nbytes == 48
    assert a.ptr % 4096 == 0
    n = np.asarray(a)
    assert n.shape == (3, 4) and n.dtype == np.float32
    n[...] = np.arange(12).reshape(3, 4)
    ai = a.__array_interface__
    assert ai["version"] == 3 and ai["data"][0] == a.ptr and ai["typestr"] == "<f4"
    with pytest.raises(AttributeError):
        a.__cuda_array_interface__
    mv = memoryview(a)
    assert mv.format in ("<f", "f") and mv.shape == (3, 4)
    assert a.__dlpack_device__() == (1, 0)
    back = np.from_dlpack(a)
    np.testing.assert_array_equal(back, np.arange(12).reshape(3, 4))
    back[0, 0] = 99                       # shared memory, no copy
    assert n[0, 0] == 99
    del a, n, mv
    gc.collect()
    assert back[0, 0] == 99               # the capsule keeps the memory alive


def test_array_datetime_and_big_endian():
    a = ferry.empty(5, "<M8[ns]")
    assert np.asarray(a).dtype == np.dtype("<M8[ns]")
    with pytest.raises(BufferError):
        a.__dlpack__()
    b = ferry.empty(5, ">i4")
    with pytest.raises(BufferError):
        b.__dlpack__()
    u = ferry.empty(3, "<U4")
    assert u.nbytes == 48


def test_array_as_plan_destination(ctx, blob):
    path, data = blob
    a = ferry.empty(4096, np.uint8)
    with ferry.File(ctx, path) as f:
        assert f.pread(a, 10) == 4096
    assert np.asarray(a).tobytes() == data[10:4106]


def test_dlpack_torch_roundtrip(ctx):
    torch = pytest.importorskip("torch")
    a = ferry.empty((4, 5), np.float32)
    np.asarray(a)[...] = np.arange(20, dtype=np.float32).reshape(4, 5)
    t = torch.from_dlpack(a)
    assert t.shape == (4, 5) and t.dtype == torch.float32 and t.device.type == "cpu"
    assert t.data_ptr() == a.ptr
    assert torch.equal(t, torch.arange(20, dtype=torch.float32).reshape(4, 5))
    h = ferry.empty((2, 3), "bfloat16")
    tb = torch.from_dlpack(h)
    assert tb.dtype == torch.bfloat16
    # legacy capsule protocol too
    cap = a.__dlpack__()
    t2 = torch.utils.dlpack.from_dlpack(cap)
    assert t2.data_ptr() == a.ptr
    del a, cap
    gc.collect()
    assert float(t2[3, 4]) == 19.0


def test_read_into_torch_out(tmp_path):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).standard_normal((7, 9)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = torch.empty((7, 9), dtype=torch.float32)
    r = ferry.read(tmp_path / "x.npy", out=out)
    assert r is out
    np.testing.assert_array_equal(out.numpy(), x)


def test_unconsumed_capsule_frees():
    a = ferry.empty(1000, np.uint8)
    before = sys.getrefcount(a)
    cap = a.__dlpack__()
    assert sys.getrefcount(a) == before + 1
    del cap
    gc.collect()
    assert sys.getrefcount(a) == before
    capv = a.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(capv)
    del capv
    assert sys.getrefcount(a) == before


def test_ferry_read_npy_and_selection(tmp_path):
    x = np.arange(24, dtype=">i4").reshape(2, 3, 4)
    np.save(tmp_path / "x.npy", x)
    r = ferry.read(tmp_path / "x.npy")
    assert isinstance(r, np.ndarray) and r.dtype == np.dtype("=i4")
    np.testing.assert_array_equal(r, x)
    np.testing.assert_array_equal(ferry.read(tmp_path / "x.npy", selection=(1, slice(0, 3, 2))), x[1, 0:3:2])
    np.testing.assert_array_equal(ferry.read(tmp_path / "x.npy", selection=(Ellipsis, -1)), x[..., -1])
    out = np.zeros((2, 3, 4), np.int32)
    assert ferry.read(tmp_path / "x.npy", out=out) is out
    np.testing.assert_array_equal(out, x)
    with pytest.raises(ferry.FerryError):
        ferry.read(tmp_path / "x.npy", out=np.zeros(5, np.int32))
    with pytest.raises(IndexError):
        ferry.read(tmp_path / "x.npy", selection=(5,))


def test_ferry_read_raw_bytes(tmp_path, blob):
    path, data = blob
    r = ferry.read(path)
    assert r.dtype == np.uint8 and r.tobytes() == data
    r = ferry.read(path, selection=slice(10, 20))
    assert r.tobytes() == data[10:20]


def test_ferry_open_and_read_many(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    w = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.int64)}
    safetensors.save_file(w, str(tmp_path / "m.safetensors"))
    np.save(tmp_path / "a.npy", np.arange(10.0))
    f = ferry.open(tmp_path / "m.safetensors")
    assert f.format == "safetensors" and set(f) == {"w", "b"}
    # names come in file order (safetensors sorts its header by offset), Variables on demand
    assert list(f.keys()) == f._ds.names() and len(f) == 2 and "w" in f and "nope" not in f
    with pytest.raises(KeyError, match="nope"):
        f["nope"]
    assert set(f.variables) == {"w", "b"} and f.variables["w"] is f["w"]
    assert f["w"].shape == (2, 3) and f["w"].dtype == np.float32
    np.testing.assert_array_equal(f["w"][1], w["w"][1])
    np.testing.assert_array_equal(np.asarray(f["b"]), w["b"])
    with pytest.raises(ValueError):
        ferry.read(tmp_path / "m.safetensors")        # name required
    with pytest.raises((KeyError, ferry.FerryError)):
        ferry.read(tmp_path / "m.safetensors", "nope")
    ferry.reset_stats()
    for q in (tmp_path / "m.safetensors", tmp_path / "a.npy"):   # header reads are jobs too
        ferry.open(q).close()
    jobs_open = ferry.stats()["jobs"]
    ferry.reset_stats()
    res = ferry.read_many([(tmp_path / "m.safetensors", "w", None), (tmp_path / "m.safetensors", "b", None),
                           (tmp_path / "a.npy", None, (slice(2, 8, 3),))])
    assert ferry.stats()["jobs"] == jobs_open + 1            # one plan, one job
    np.testing.assert_array_equal(res[0], w["w"])
    np.testing.assert_array_equal(res[1], w["b"])
    np.testing.assert_array_equal(res[2], np.arange(10.0)[2:8:3])
    f.close()


def test_stats_show_host_path(tmp_path, blob):
    path, data = blob
    c = ferry.Context()
    c.reset_stats()
    with ferry.File(c, path) as f:
        a = np.empty(len(data), np.uint8)
        f.pread(a)
    s = c.stats()
    assert s["host"]["bytes"] >= len(data) and s["host"]["ops"] >= 1
    assert s["staged"]["bytes"] == 0 and s["cufile"]["bytes"] == 0
    assert s["jobs"] >= 1
    assert s["direct_bytes"] + s["buffered_bytes"] >= len(data)


def test_forced_device_path_without_gpu_is_an_error(ctx, blob):
    if ctx.cuda_device_count() > 0:
        pytest.skip("a GPU is present")
    with pytest.raises(ferry.FerryError) as ei:
        ferry.empty(10, np.uint8, device=0, ctx=ctx)
    assert ei.value.code == _ferry.ENOCUDA


def test_parse_device():
    assert ferry.parse_device("cpu") == -1 and ferry.parse_device(None) == -1
    assert ferry.parse_device(1) == 1 and ferry.parse_device("cuda:2") == 2 and ferry.parse_device("cuda") == 0
    with pytest.raises(ValueError):
        ferry.parse_device("tpu")


def test_parse_device_refuses_what_it_cannot_read(tmp_path):
    """One parser for every device= (ferry.read, xarray, the torch datasets,
    checkpoints): a torch.device of another type was taken for CUDA device 0,
    "cuda:-1" and -2 for the CPU, "cuda:x" raised int()'s bare message."""
    torch = pytest.importorskip("torch")
    for bad in (torch.device("meta"), "cuda:-1", "cuda:x", "cuda:", -2):
        with pytest.raises(ValueError, match="unknown device"):
            ferry.parse_device(bad)
    with pytest.raises(TypeError):
        ferry.parse_device(1.5)
    assert ferry.parse_device(torch.device("cuda", 3)) == 3 and ferry.parse_device(torch.device("cpu")) == -1
    assert ferry.parse_device(-1) == -1 and ferry.parse_device(" GPU:1 ") == 1
    assert ferry._torch_device("cuda") == torch.device("cuda") and ferry._torch_device(2) == torch.device("cuda", 2)
    from ferry import checkpoint
    with pytest.raises(ValueError, match="unknown device"):
        checkpoint.load("unused.safetensors", device="meta")
    import ferry.torch as ft
    np.save(tmp_path / "x.npy", np.arange(8.0))
    with pytest.raises(ValueError, match="unknown device"):
        ft.ArrayDataset(str(tmp_path / "x.npy"), batch_size=1, device="meta")
    assert ft.ArrayDataset(str(tmp_path / "x.npy"), batch_size=1, device="cuda:1").device == torch.device("cuda", 1)


def test_memcpy_host_and_cancel(ctx, blob):
    a = np.arange(1000, dtype=np.int32)
    b = np.zeros_like(a)
    assert ctx.memcpy(b, a) == a.nbytes
    np.testing.assert_array_equal(a, b)
    c = bytearray(8)
    assert ctx.memcpy(c, a, 8) == 8 and bytes(c) == a[:2].tobytes()
    with pytest.raises(ValueError):
        ctx.memcpy(c, a, 4000)
    path, data = blob
    with ferry.File(ctx, path) as f:
        plan = ferry.Plan()
        out = np.zeros(len(data), np.uint8)
        plan.read_file(f, 0, len(data), out)
        job = ctx.submit(plan)
        job.cancel()
        try:
            job.wait()                      # finished before the cancel, or canceled
        except ferry.FerryError as e:
            assert e.code == _ferry.ECANCELED
        assert job.done()


def test_plan_busy_and_clear(ctx, blob):
    path, _ = blob
    with ferry.File(ctx, path) as f:
        plan = ferry.Plan()
        buf = bytearray(100)
        plan.read_file(f, 0, 100, buf)
        plan.clear()
        assert len(plan) == 0
        buf.extend(b"x")                    # the export was released by clear()


def test_plan_wait_stream_arguments_and_no_cuda(ctx, blob):
    """Plan.wait_stream (ferry_plan_wait_stream): bad devices and a 9th stream are
    refused when added; without a CUDA driver the submit fails, naming the call,
    instead of running the plan without the wait. (The wait itself:
    tests/gpu/test_gpu_streamwait.c on the stand-in driver and the GPU.)"""
    path, data = blob
    with ferry.File(ctx, path) as f:
        plan = ferry.Plan()
        buf = bytearray(100)
        plan.read_file(f, 0, 100, buf)
        with pytest.raises(ferry.FerryError) as e:
            plan.wait_stream(0, device=99)
        assert e.value.code == _ferry.EINVAL and "CUDA device 99" in str(e.value)
        for d in range(_ferry.MAX_WAIT_STREAMS):
            plan.wait_stream(None, device=d)
        plan.wait_stream(None, device=0)              # the same (stream, device) again: one
        with pytest.raises(ferry.FerryError) as e:
            plan.wait_stream(2, device=0)
        assert e.value.code == _ferry.EINVAL and "more than 8 streams" in str(e.value)
        if ctx.cuda_device_count() == 0:
            with pytest.raises(ferry.FerryError) as e:
                ctx.run(plan)
            assert e.value.code == _ferry.ENOCUDA and "ferry_plan_wait_stream" in str(e.value)
            assert bytes(buf) == bytes(100)           # nothing was read
        plan.clear()                                  # forgets the streams too
        plan.read_file(f, 0, 100, buf)
        assert ctx.run(plan) == 100 and bytes(buf) == data[:100]


def test_close_while_a_job_runs_is_refused(tmp_path):
    """A File or Dataset a running job reads cannot be closed under it."""
    import numpy as np
    import ferry
    p = tmp_path / "a.npy"
    np.save(p, np.arange(1 << 20, dtype=np.float32))
    ctx = ferry.Context(threads=2)
    f = ferry.File(ctx, str(p))
    ds = ferry.Dataset(ctx, str(p))
    out = np.empty(1 << 20, dtype=np.float32)
    raw = np.empty(4 << 20, dtype=np.uint8)
    plan = ferry.Plan()
    plan.read(ds, 0, out)
    plan.read_file(f, 0, 4 << 20, raw)
    job = ctx.submit(plan)
    with pytest.raises(RuntimeError, match="running job"):
        f.close()
    with pytest.raises(RuntimeError, match="running job"):
        ds.close()
    job.wait()
    f.close()
    ds.close()
    assert np.array_equal(out, np.arange(1 << 20, dtype=np.float32))


def test_forked_child_gets_its_own_default_context(tmp_path):
    """After fork() the default context is recreated; an inherited one says why it cannot run."""
    import os
    import numpy as np
    import ferry
    p = tmp_path / "b.npy"
    np.save(p, np.arange(1000, dtype=np.int64))
    assert np.array_equal(ferry.read(str(p)), np.arange(1000))    # parent's engine has started
    mine = ferry.Context(threads=2)
    assert np.array_equal(ferry.read(str(p), ctx=mine), np.arange(1000))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ok = np.array_equal(ferry.read(str(p)), np.arange(1000))
            try:
                ferry.read(str(p), ctx=mine)
                inherited_refused = False
            except ferry.FerryError as e:
                inherited_refused = "fork" in str(e)
            code = 0 if ok and inherited_refused else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_crc32c_matches_the_reference():
    import crc32c as ref
    data = np.random.default_rng(1).integers(0, 255, size=(1 << 20) + 3, dtype=np.uint8)
    assert _ferry.crc32c(b"123456789") == 0xE3069283
    assert _ferry.crc32c(data) == ref.crc32c(data.tobytes())
    part = _ferry.crc32c(data[:1000])
    assert _ferry.crc32c(data[1000:], part) == ref.crc32c(data.tobytes())


def test_unknown_format_reads_as_bytes_but_unsupported_npy_raises(tmp_path):
    """Only "no known format" falls back to raw bytes; a recognised file ferry
    cannot read (object dtype) is an error, never silently raw bytes."""
    raw = tmp_path / "blob.bin"
    raw.write_bytes(bytes(range(200)))
    assert np.array_equal(ferry.read(str(raw)), np.arange(200, dtype=np.uint8))
    with pytest.raises(ferry.FerryError) as e:
        ferry.Dataset(ferry.default_context(), str(raw))
    assert e.value.code == _ferry.ENOFORMAT
    obj = tmp_path / "obj.npy"
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ferry.FerryError) as e:
        ferry.read(str(obj))
    assert e.value.code == _ferry.EUNSUPPORTED
