"""ferry.checkpoint on the GPU: save/load/load_into of CUDA tensors through the engine's
staged (or cuFile) path, non-contiguous tensors, a > 4 GiB tensor, async_save, DCP with
NCCL on two GPUs. Everything skips with a reason where there is no GPU."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

import ferry  # noqa: E402
from ferry import checkpoint as ck  # noqa: E402

_ctx = ck._io.context()
if _ctx.cuda_device_count() < 1:
    pytest.skip("ferry sees no CUDA device: %s" % _ctx.cuda_status, allow_module_level=True)

PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(ferry.__file__)))
DEV = torch.device("cuda", 0)


def _moved(stats):
    return {k: stats[k]["bytes"] for k in ("cufile", "staged", "host")}


def test_gpu_save_load_dtypes(tmp_path):
    g = torch.Generator(device=DEV).manual_seed(0)
    sd = {
        "f32": torch.randn(333, 77, device=DEV, generator=g),
        "bf16": torch.randn(1024, 1024, device=DEV, generator=g).to(torch.bfloat16),
        "f16": torch.randn(5000, device=DEV, generator=g).half(),
        "i64": torch.arange(12345, device=DEV),
        "u8": torch.randint(0, 255, (4096 * 3 + 5,), device=DEV, dtype=torch.uint8),
        "bool": torch.rand(999, device=DEV, generator=g) > 0.5,
        "fp8": torch.randn(2048, 16, device=DEV, generator=g).to(torch.float8_e4m3fn),
        "zero_d": torch.tensor(3.25, device=DEV),
        "empty": torch.empty(0, 5, device=DEV),
        "cpu_mixed": torch.randn(10, 10),
    }
    p = tmp_path / "g.safetensors"
    _ctx.reset_stats()
    ck.save(sd, p, crc32c=True)
    st = _moved(_ctx.stats())
    assert st["staged"] + st["cufile"] > 0, st
    _ctx.reset_stats()
    got = ck.load(p, device="cuda:0")
    st = _moved(_ctx.stats())
    assert st["staged"] + st["cufile"] > 0, st
    for k, v in sd.items():
        assert got[k].device == DEV
        a = got[k].view(torch.uint8) if got[k].dtype == torch.float8_e4m3fn else got[k]
        b = v.to(DEV)
        b = b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b
        assert torch.equal(a, b), k
    cpu = ck.load(p, device="cpu")
    assert torch.equal(cpu["f32"], sd["f32"].cpu())
    st_ref = pytest.importorskip("safetensors.torch").load_file(str(p), device="cuda:0")
    assert torch.equal(st_ref["bf16"], sd["bf16"])


def test_gpu_non_contiguous_and_load_into(tmp_path):
    base = torch.randn(512, 256, device=DEV)
    sd = {"t": base.t(), "s": base[::3, 5:100], "x": base}
    p = tmp_path / "nc.safetensors"
    ck.save(sd, p)
    got = ck.load(p, device=0)
    for k in sd:
        assert torch.equal(got[k], sd[k])
    targets = {k: torch.zeros_like(v, memory_format=torch.contiguous_format)
               for k, v in sd.items()}
    ptrs = {k: t.data_ptr() for k, t in targets.items()}
    ck.load_into(targets, p)
    for k in sd:
        assert targets[k].data_ptr() == ptrs[k] and torch.equal(targets[k], sd[k])
    # a non-contiguous GPU target and a dtype cast
    big = torch.zeros(512, 256, device=DEV)
    ck.load_into({"t": big.t(), "s": torch.zeros(171, 95, device=DEV, dtype=torch.float64),
                  "x": torch.zeros(512, 256, device=DEV)}, p)
    assert torch.equal(big, base)


def test_gpu_model_roundtrip_and_slices(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 256)).to(DEV)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 256, device=DEV)).sum().backward()
    opt.step()
    p = tmp_path / "m.safetensors"
    ck.save({"model": model.state_dict(), "optim": opt.state_dict()}, p)
    got = ck.load(p, device=DEV)
    m2 = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                             torch.nn.Linear(1024, 256)).to(DEV)
    m2.load_state_dict(got["model"])
    o2 = torch.optim.AdamW(m2.parameters())
    o2.load_state_dict(got["optim"])
    for a, b in zip(m2.parameters(), model.parameters()):
        assert torch.equal(a, b)
    with ck.safe_open(p, device="cuda:0") as f:
        w = model.state_dict()["0.weight"]
        assert torch.equal(f.get_slice("model.0.weight")[100:300, 7:9], w[100:300, 7:9])
        assert torch.equal(f.get_slice("model.0.weight")[::5, 1], w[::5, 1])


def test_gpu_async_save(tmp_path):
    sd = {"w%d" % i: torch.randn(1024, 1024, device=DEV) for i in range(16)}
    snap = {k: v.clone() for k, v in sd.items()}
    p = tmp_path / "a.safetensors"
    fut = ck.async_save(sd, p)
    for v in sd.values():                    # the next "training step" on the same stream
        v.add_(1)
    fut.result(timeout=120)
    got = ck.load(p, device=DEV)
    for k in snap:
        assert torch.equal(got[k], snap[k])
    fut = ck.async_save(sd, p, snapshot="device")
    fut.result(timeout=120)
    got = ck.load(p, device=DEV)
    for k in sd:
        assert torch.equal(got[k], sd[k])


def test_gpu_tensor_over_4gib(tmp_path):
    free, _ = torch.cuda.mem_get_info(DEV)
    n = (4 << 30) + (3 << 20) + 7           # > 4 GiB, odd length
    if free < 2 * n + (1 << 30):
        pytest.skip("needs %.1f GiB of free GPU memory" % ((2 * n + (1 << 30)) / 2 ** 30))
    st = os.statvfs(str(tmp_path))
    if st.f_bavail * st.f_frsize < n + (1 << 30):
        pytest.skip("needs %.1f GiB of free disk in %s" % ((n + (1 << 30)) / 2 ** 30, tmp_path))
    x = (torch.arange(n, device=DEV, dtype=torch.int64) % 251).to(torch.uint8)
    p = tmp_path / "big.safetensors"
    ck.save({"big": x, "tail": torch.ones(3, device=DEV)}, p)
    got = ck.load(p, device=DEV)
    assert got["big"].shape == (n,) and torch.equal(got["big"], x)
    del got
    y = torch.empty_like(x)
    ck.load_into({"big": y, "tail": torch.zeros(3, device=DEV)}, p)
    assert torch.equal(x, y)
    del x, y
    os.unlink(p)


def test_gpu_dcp_single_process(tmp_path):
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    sd = {"w": torch.randn(300, 200, device=DEV), "h": torch.randn(77, device=DEV).half(),
          "step": 4}
    d = tmp_path / "dcp"
    dcp.save(sd, storage_writer=ck.FerryWriter(d))
    out = {"w": torch.zeros(300, 200, device=DEV), "h": torch.zeros(77, device=DEV).half(),
           "step": 0}
    dcp.load(out, storage_reader=ck.FerryReader(d))
    assert torch.equal(out["w"], sd["w"]) and torch.equal(out["h"], sd["h"]) and out["step"] == 4


def test_gpu_dcp_torch_filesystem_writer_into_cuda(tmp_path):
    """FerryReader reads torch FileSystemWriter's .distcp archives straight into CUDA
    tensors through the engine (a transposed tensor through torch's view), and a ferry
    sharded save on the GPU has Hugging Face's names."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    sd = {"w": torch.randn(300, 200), "h": torch.randn(77).to(torch.bfloat16),
          "t": torch.randn(40, 60).t(), "step": 4}
    d = tmp_path / "fsw"
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(d), no_dist=True)
    out = {"w": torch.zeros(300, 200, device=DEV),
           "h": torch.zeros(77, device=DEV, dtype=torch.bfloat16),
           "t": torch.zeros(60, 40, device=DEV), "step": 0}
    _ctx.reset_stats()
    dcp.load(out, storage_reader=ck.FerryReader(d), no_dist=True)
    moved = _moved(_ctx.stats())
    for k in ("w", "h", "t"):
        assert out[k].device == DEV and torch.equal(out[k].cpu(), sd[k]), k
    assert out["step"] == 4
    assert moved["staged"] + moved["cufile"] >= 300 * 200 * 4, moved
    p = tmp_path / "sh" / "model.safetensors"
    big = {"a%d" % i: torch.randn(64, 64, device=DEV) for i in range(4)}
    ck.save(big, p, max_shard_size=2 * 64 * 64 * 4)
    assert sorted(os.listdir(p.parent)) == ["model-00001-of-00002.safetensors",
                                            "model-00002-of-00002.safetensors",
                                            "model.safetensors.index.json"]
    back = ck.load(p, device=DEV)
    assert all(torch.equal(back[k], v) for k, v in big.items())


def test_gpu_dcp_boxes_into_cuda_tensors(tmp_path):
    """FerryReader's boxes (ferry_plan_array, exact runs) into CUDA tensors: every shape of
    tests/python/test_checkpoint_dcp_boxes.py, equal to torch's FileSystemReader."""
    pytest.importorskip("torch.distributed.checkpoint")
    import random
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import test_checkpoint_dcp_boxes as tb
    import torch.distributed.checkpoint as dcp
    sd = tb._state()
    a, b = tb._save_both(tmp_path, sd)
    rng = random.Random(12)
    boxes = {k: tb._boxes(tuple(t.shape), rng, 12 if t.dim() else 0) for k, t in sd.items()}
    boxes["s"] = [((), ())]
    boxes["wide"] += [((0, 350), (300, 1)), ((10, 10), (280, 680))]
    want = tb._load(dcp.FileSystemReader(str(a)), boxes)
    got = tb._load(ck.FerryReader(str(b)), boxes, device=DEV)
    assert set(got) == set(want)
    for key, w in want.items():
        assert got[key].device == DEV and torch.equal(got[key].cpu(), w), key


def test_gpu_caller_cuda_context_is_handed_back(tmp_path):
    """ferry runs small plans on the caller's thread and switches CUDA contexts
    there; it must hand the thread's context back unchanged (here: none), or the
    CUDA runtime (torch, cupy) changes its current device under the caller."""
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    p = tmp_path / "small.bin"
    data = os.urandom(4096)
    p.write_bytes(data)
    out = torch.zeros(4096, dtype=torch.uint8, device=DEV)
    torch.cuda.synchronize()
    ctx = ferry.default_context()
    f = ferry.File(ctx, str(p))
    saved = ctypes.c_void_p()
    assert cu.cuCtxGetCurrent(ctypes.byref(saved)) == 0
    cur = ctypes.c_void_p()
    try:
        assert cu.cuCtxSetCurrent(None) == 0
        plan = ferry.Plan()
        plan.read_file(f, 0, 4096, out)
        ctx.run(plan)                                 # small: on this thread
        pinned = ferry.empty((64,), "u1", device="cpu", pinned=True)   # page-locked helper
        del pinned
        assert cu.cuCtxGetCurrent(ctypes.byref(cur)) == 0
        left = cur.value
    finally:
        cu.cuCtxSetCurrent(saved)
        f.close()
    assert left is None, "ferry left a CUDA context current on the caller's thread"
    assert bytes(out.cpu().numpy()) == data


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_gpu_second_device_keeps_torch_device(tmp_path):
    """Save from and load into cuda:1 with cuda:1 current (rank 1 of a job):
    torch's current device is still 1 afterwards and the data round-trips."""
    with torch.cuda.device(1):
        x = torch.randn(1000, 37, device="cuda:1")
        small = torch.arange(10, device="cuda:1")
        p = tmp_path / "d1.safetensors"
        ck.save({"x": x, "small": small}, p)
        assert torch.cuda.current_device() == 1
        back = ck.load(p, device="cuda:1")
        assert torch.cuda.current_device() == 1
        assert back["x"].device == torch.device("cuda", 1)
        assert torch.equal(back["x"], x) and torch.equal(back["small"], small)


NCCL_WORKER = r"""
import os, sys, datetime
sys.path.insert(0, {pydir!r})
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard
from ferry import checkpoint as ck

def main(rank, world, d, port):
    import faulthandler
    faulthandler.dump_traceback_later(75)      # where a rank hangs, if one does
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=90))
    mesh = init_device_mesh("cuda", (world,))
    g = torch.Generator().manual_seed(1)
    full = torch.randn(1024, 512, generator=g)
    sd = {{"w": distribute_tensor(full.cuda(), mesh, [Shard(0)]), "step": 3}}
    dcp.save(sd, storage_writer=ck.FerryWriter(d))
    assert torch.cuda.current_device() == rank, "device changed under torch"
    back = {{"w": distribute_tensor(torch.zeros(1024, 512).cuda(), mesh, [Shard(1)]), "step": 0}}
    dcp.load(back, storage_reader=ck.FerryReader(d))
    assert torch.equal(back["w"].full_tensor().cpu(), full) and back["step"] == 3
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    import torch.multiprocessing as mp
    mp.spawn(main, args=(2, sys.argv[1], int(sys.argv[2])), nprocs=2, join=True)
    print("OK")
"""


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DCP with NCCL needs 2 GPUs")
def test_gpu_dcp_nccl_two_gpus(tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    script = tmp_path / "w.py"
    script.write_text(NCCL_WORKER.format(pydir=PYDIR))
    d = tmp_path / "dcp"
    env = dict(os.environ, PYTHONPATH=PYDIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
               NCCL_NVLS_ENABLE="0")
    r = subprocess.run([sys.executable, str(script), str(d), str(port)], capture_output=True,
                       env=env, timeout=300)
    assert r.returncode == 0 and b"OK" in r.stdout, r.stderr.decode()[-12000:]
    # world size 1 on cuda:0
    out = {"w": torch.zeros(1024, 512, device=DEV), "step": 0}
    import torch.distributed.checkpoint as dcp
    dcp.load(out, storage_reader=ck.FerryReader(d))
    g = torch.Generator().manual_seed(1)
    assert torch.equal(out["w"].cpu(), torch.randn(1024, 512, generator=g))


def test_gpu_new_paths_bytes_numpy_progress_dcp_torch_tools(tmp_path):
    """The paths added with the C-parser reader on the GPU: bytes API, numpy values in a
    state loaded to cuda, progress, slices through the C planner, a FerryWriter directory of
    CUDA tensors read by torch's own dcp_to_torch_save."""
    np = pytest.importorskip("numpy")
    g = torch.Generator(device=DEV).manual_seed(5)
    sd = {"w": torch.randn(512, 384, device=DEV, generator=g).to(torch.bfloat16),
          "b": torch.randn(384, device=DEV, generator=g), "rng": np.random.get_state(),
          "step": 9}
    data = ck.save_bytes(sd, crc32c=True)
    got = ck.load_bytes(data, device=DEV)
    assert got["w"].device == DEV and torch.equal(got["w"], sd["w"])
    assert isinstance(got["rng"][1], np.ndarray) and np.array_equal(got["rng"][1], sd["rng"][1])
    p = tmp_path / "p.safetensors"
    calls = []
    ck.save(sd, p, progress=lambda d, t: calls.append(d))
    got = ck.load(p, device=DEV, progress=lambda d, t: calls.append(d))
    assert calls and torch.equal(got["b"], sd["b"])
    with ck.safe_open(p, device=DEV) as f:
        assert torch.equal(f.get_slice("w")[100:300:3, 7:200], sd["w"][100:300:3, 7:200])
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    fu = pytest.importorskip("torch.distributed.checkpoint.format_utils")
    d = tmp_path / "dcp"
    dcp.save({"w": sd["w"], "b": sd["b"], "step": 9}, storage_writer=ck.FerryWriter(d),
             no_dist=True)
    fu.dcp_to_torch_save(d, tmp_path / "full.pt")
    full = torch.load(tmp_path / "full.pt", weights_only=False)
    assert torch.equal(full["w"], sd["w"].cpu()) and full["step"] == 9


def test_gpu_remote_hf_directory_over_http(monkeypatch):
    """A Hugging Face index directory served over HTTP (the loopback range server) loads
    into CUDA tensors equal to the tensors saved, every range pinned to its object's ETag."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
    from rangeserver import RangeServer, ferry_reads_urls
    if not ferry_reads_urls():
        pytest.skip("ferry was built without libcurl (no remote objects)")
    st_torch = pytest.importorskip("safetensors.torch")
    import json
    monkeypatch.setenv("FERRY_REMOTE_REQUEST_SIZE", "256K")
    g = torch.Generator().manual_seed(1)
    sd = {"a": torch.randn(700, 900, generator=g), "b": torch.randn(300, 64, generator=g).to(torch.bfloat16),
          "c": torch.arange(1000, dtype=torch.int64)}
    s = RangeServer().start()
    try:
        shards = {"model-00001-of-00002.safetensors": ["a"], "model-00002-of-00002.safetensors": ["b", "c"]}
        wm = {}
        for name, keys in shards.items():
            s.put("ck/" + name, st_torch.save({k: sd[k] for k in keys}))
            wm.update({k: name for k in keys})
        s.put("ck/model.safetensors.index.json", json.dumps({"metadata": {}, "weight_map": wm}).encode())
        got = ck.load(f"http://127.0.0.1:{s.port}/ck/", device="cuda:0")
        assert set(got) == set(sd)
        for k, v in sd.items():
            assert got[k].device == DEV and torch.equal(got[k].cpu(), v), k
        with ck.safe_open(f"http://127.0.0.1:{s.port}/ck/model.safetensors.index.json", device=0) as f:
            assert torch.equal(f.get_slice("a")[10:20, 5:500].cpu(), sd["a"][10:20, 5:500])
    finally:
        s.stop()
