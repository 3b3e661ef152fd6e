"""ferry.torch.ArrayDataset on CUDA: batches on cuda:0, stream hand-off, memory reuse, casting.

Skips (with the reason) where torch or ferry cannot use a GPU."""
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

from ferry import _ferry  # noqa: E402
from ferry.torch import ArrayDataset, epoch_order  # noqa: E402

_ctx = _ferry.Context()
if _ctx.cuda_device_count() == 0:
    pytest.skip(f"ferry cannot use CUDA: {_ctx.cuda_status}", allow_module_level=True)

N = 517


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (N, 3, 32, 32), dtype=np.uint8)
    vec = rng.standard_normal((N, 1000)).astype(np.float32)
    ids = np.arange(N, dtype=np.int64)
    lo = 0
    for i, s in enumerate([200, 117, 200]):
        np.save(root / f"img_{i}.npy", img[lo:lo + s])
        np.save(root / f"vec_{i}.npy", vec[lo:lo + s])
        np.save(root / f"id_{i}.npy", ids[lo:lo + s])
        lo += s
    fields = {k: str(root / f"{k}_*.npy") for k in ("img", "vec", "id")}
    return fields, {"img": img, "vec": vec, "id": ids}


@pytest.mark.parametrize("staging", ["auto", "engine"])
def test_batches_on_cuda_equal_numpy(data, staging):
    fields, ref = data
    ds = ArrayDataset(fields=fields, batch_size=64, shuffle=True, seed=1, device="cuda:0",
                      staging=staging)
    seen = []
    for b in ds:
        assert all(v.device == torch.device("cuda", 0) for v in b.values())
        ids = b["id"].cpu().numpy()
        np.testing.assert_array_equal(b["img"].cpu().numpy(), ref["img"][ids])
        np.testing.assert_array_equal(b["vec"].cpu().numpy(), ref["vec"][ids])
        seen += ids.tolist()
    assert seen == epoch_order(N, 1, 0).tolist()
    # one path for every row size: the engine's own (staging="pinned" was removed)
    assert ds.last_path in ("staged", "cufile")
    # device=None picks the GPU
    b = next(iter(ArrayDataset(fields=fields, batch_size=8)))
    assert b["img"].is_cuda


@pytest.mark.parametrize("staging", ["engine", {"img": "auto", "vec": "engine", "id": "engine"}])
@pytest.mark.parametrize("busy", [False, True])
def test_stream_handoff_and_memory_reuse_under_load(data, busy, staging):
    """The consumer works on its own (non-default) stream, delays every check behind a sleep
    kernel and keeps another stream busy with matmuls; every batch must still hold its rows when
    the delayed check runs (no early reuse of its memory, no read before ferry's copies)."""
    fields, ref = data
    img_ref = torch.from_numpy(ref["img"]).cuda()
    vec_ref = torch.from_numpy(ref["vec"]).cuda()
    kw = dict(dtype={"vec": torch.float64}, transform=lambda b: dict(b, twice=b["vec"] * 2)) if busy else {}
    ds = ArrayDataset(fields=fields, batch_size=32, shuffle=True, seed=2, device="cuda:0",
                      prefetch=6, staging=staging, **kw)
    consumer, other = torch.cuda.Stream(), torch.cuda.Stream()
    a = torch.randn(2048, 2048, device="cuda")
    bad = torch.zeros((), dtype=torch.int64, device="cuda")
    count = 0
    consumer.wait_stream(torch.cuda.current_stream())
    other.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(consumer):
        for b in ds:
            with torch.cuda.stream(other):
                for _ in range(4):
                    a = (a @ a).tanh_()
            torch.cuda._sleep(2_000_000)          # the check runs late, on the consumer's stream
            ids = b["id"]
            bad += (b["img"] != img_ref[ids]).sum()
            vec = vec_ref[ids].double() if busy else vec_ref[ids]
            bad += (b["vec"] != vec).sum()
            if busy:
                bad += (b["twice"] != 2 * vec).sum()
            count += 1
            del b
    torch.cuda.synchronize()
    assert count == -(-N // 32)
    assert int(bad) == 0


def test_cast_normalize_transform_on_gpu(data):
    fields, ref = data
    mean, std = (100.0, 110.0, 120.0), (50.0, 60.0, 70.0)
    stream_seen = []
    def tf(b):
        stream_seen.append(torch.cuda.current_stream().cuda_stream)
        return {"img": b["img"].flip(-1), "id": b["id"]}
    ds = ArrayDataset(fields={"img": fields["img"], "id": fields["id"]}, batch_size=50, device="cuda:0",
                      dtype={"img": torch.float16}, normalize={"img": (mean, std)}, transform=tf)
    for b in ds:
        ids = b["id"].cpu().numpy()
        x = (ref["img"][ids].astype(np.float32) - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
        assert b["img"].dtype == torch.float16
        np.testing.assert_allclose(b["img"].float().cpu().numpy(), x[..., ::-1], rtol=3e-3, atol=3e-3)
    # the transform ran on ferry's stream, not the consumer's
    assert stream_seen and all(s != torch.cuda.current_stream().cuda_stream for s in stream_seen)


def test_per_sample_mode_and_resume_on_gpu(data):
    fields, ref = data
    ds = ArrayDataset(fields=fields, batch_size=None, shuffle=True, seed=3, device="cuda:0")
    it = iter(ds)
    first = [int(next(it)["id"]) for _ in range(100)]
    state = ds.state_dict()
    del it
    ds2 = ArrayDataset(fields=fields, batch_size=None, shuffle=True, seed=3, device="cuda:0")
    ds2.load_state_dict(state)
    rest = []
    for s in ds2:
        i = int(s["id"])
        rest.append(i)
        if i % 50 == 0:
            np.testing.assert_array_equal(s["img"].cpu().numpy(), ref["img"][i])
    assert first + rest == epoch_order(N, 3, 0).tolist()


_NCCL_SCRIPT = """
import json, sys
import torch, torch.distributed as dist
sys.path.insert(0, {python!r})
from ferry.torch import ArrayDataset
dist.init_process_group("nccl")
r = dist.get_rank(); torch.cuda.set_device(r)
ds = ArrayDataset(fields={fields!r}, batch_size=16, shuffle=True, seed=4, drop_last=True)
ids = []
for b in ds:
    assert b["img"].device == torch.device("cuda", r)
    t = torch.ones((), device="cuda"); dist.all_reduce(t)
    ids.append(b["id"])
mine = torch.cat(ids)
got = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
dist.all_gather(got, mine)
if r == 0:
    json.dump([g.tolist() for g in got], open({out!r}, "w"))
dist.destroy_process_group()
"""


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for the NCCL test")
def test_two_gpus_nccl(data, tmp_path):
    import json
    fields, _ = data
    out = tmp_path / "out.json"
    script = tmp_path / "nccl_worker.py"
    here = os.path.dirname(os.path.dirname(os.path.abspath(_ferry.__file__)))
    script.write_text(_NCCL_SCRIPT.format(python=here, fields=fields, out=str(out)))
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=2", str(script)], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    g0, g1 = json.loads(out.read_text())
    assert not set(g0) & set(g1)
    full = N // 32 * 32
    assert sorted(g0 + g1) == sorted(epoch_order(N, 4, 0)[:full].tolist())


# ------------------------------------------------------------------------------------------
# samples="files" and TokenDataset on CUDA
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def per_sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_files")
    rng = np.random.default_rng(3)
    n = 70
    img = rng.integers(0, 255, (n, 3, 16, 16), dtype=np.uint8)
    for i in range(n):
        np.save(root / f"img_{i}.npy", img[i])
        np.save(root / f"id_{i}.npy", np.int64(i))
    fields = {"img": str(root / "img_*.npy"), "id": str(root / "id_*.npy")}
    return fields, img


@pytest.mark.parametrize("staging", ["auto", "engine"])
def test_per_sample_files_on_cuda(per_sample, staging):
    fields, img = per_sample
    ds = ArrayDataset(fields=fields, samples="files", batch_size=16, shuffle=True, seed=4,
                      device="cuda:0", staging=staging, dtype={"img": torch.float16})
    seen = []
    for b in ds:
        assert b["img"].is_cuda and b["img"].dtype == torch.float16
        ids = b["id"].cpu().numpy()
        np.testing.assert_array_equal(b["img"].cpu().numpy(), img[ids].astype(np.float16))
        seen += ids.tolist()
    assert seen == epoch_order(len(img), 4, 0).tolist()


def test_per_sample_ragged_collate_on_cuda(tmp_path):
    from ferry.torch import pad_collate
    for i, n in enumerate([3, 7, 5]):
        np.save(tmp_path / f"t{i}.npy", np.arange(n, dtype=np.float32) + i)
    b = next(iter(ArrayDataset(str(tmp_path / "t*.npy"), samples="files", batch_size=3,
                               collate=pad_collate(0), device="cuda:0")))
    assert b.is_cuda and b.shape == (3, 7)
    assert b[0].tolist() == [0, 1, 2, 0, 0, 0, 0] and b[1].tolist() == [1 + k for k in range(7)]


def test_token_windows_on_cuda(tmp_path):
    from ferry.torch import TokenDataset
    toks = np.random.default_rng(0).integers(0, 50257, 64 * 33 + 1, dtype=np.uint16)
    toks.tofile(tmp_path / "train.bin")
    ds = TokenDataset(str(tmp_path / "train.bin"), seq_len=32, batch_size=8, shuffle=False,
                      device="cuda:0")
    xs = []
    for x, y in ds:
        assert x.is_cuda and y.is_cuda and x.dtype == torch.int64 and x.shape == (8, 32)
        assert torch.equal(x[:, 1:], y[:, :-1])
        xs.append(x.cpu().numpy())
    np.testing.assert_array_equal(np.concatenate(xs).reshape(-1), toks[:64 * 32].astype(np.int64))


@pytest.mark.parametrize("staging", ["auto", "engine"])
def test_token_read_groups_on_cuda_equal_host(tmp_path, staging):
    """Batches read 3 at a time and cast once per read on the GPU are the host's batches:
    contiguous (x, y) slices, the same states after each batch, a tail of another size."""
    from ferry.torch import TokenDataset
    toks = np.random.default_rng(1).integers(0, 50257, 7 * 5 * 16 + 9, dtype=np.uint16)
    toks.tofile(tmp_path / "train.bin")
    kw = dict(files=str(tmp_path / "train.bin"), seq_len=16, batch_size=5, seed=3, drop_last=False,
              batches_per_read=3)
    host = TokenDataset(device="cpu", **kw)
    ref = [(x.numpy().copy(), y.numpy().copy(), host.state_dict()["samples_consumed"]) for x, y in host]
    ds = TokenDataset(device="cuda:0", staging=staging, **kw)
    got = [(x, y, ds.state_dict()["samples_consumed"]) for x, y in ds]
    assert len(got) == len(ref)
    for (x, y, s), (rx, ry, rs) in zip(got, ref):
        assert x.is_cuda and x.is_contiguous() and y.is_contiguous() and x.dtype == torch.int64
        np.testing.assert_array_equal(x.cpu().numpy(), rx)
        np.testing.assert_array_equal(y.cpu().numpy(), ry)
        assert s == rs


@pytest.mark.parametrize("prefetch", [0, 4])
def test_token_group_buffer_outlives_a_lagging_consumer(tmp_path, prefetch):
    """The consumer's stream runs a long kernel before each batch (a training step queued
    ahead of the loader): the casts of a read group run long after the loader dropped the
    group, and its buffer must not be handed to a later group's read meanwhile (recorded on
    the stream that casts it). Every batch equals the host's."""
    from ferry.torch import TokenDataset
    toks = np.random.default_rng(2).integers(0, 50257, 40 * 8 * 64 + 1, dtype=np.uint16)
    toks.tofile(tmp_path / "train.bin")
    # prefetch=0: one group in flight, so a dropped group's block is the next allocation's (with
    # more in flight the caching allocator still reuses it, a few groups later)
    kw = dict(files=str(tmp_path / "train.bin"), seq_len=64, batch_size=8, seed=5, batches_per_read=1,
              prefetch=prefetch)
    ref = [(x.numpy().copy(), y.numpy().copy()) for x, y in TokenDataset(device="cpu", **kw)]
    ds = TokenDataset(device="cuda:0", **kw)
    got = []
    for x, y in ds:
        torch.cuda._sleep(20_000_000)      # ~10 ms on the consumer stream, queued before the next casts
        got.append((x, y))
    torch.cuda.synchronize()
    assert len(got) == len(ref) == 40
    for (x, y), (rx, ry) in zip(got, ref):
        np.testing.assert_array_equal(x.cpu().numpy(), rx)
        np.testing.assert_array_equal(y.cpu().numpy(), ry)


@pytest.fixture(scope="module")
def ragged(tmp_path_factory):
    """Per-sample .npy files of one shape (img, id) and of ragged lengths (seq)."""
    root = tmp_path_factory.mktemp("gpu_lag")
    rng = np.random.default_rng(7)
    n = 48
    for i in range(n):
        np.save(root / f"img_{i}.npy", rng.integers(0, 255, (3, 8, 8), dtype=np.uint8))
        np.save(root / f"seq_{i}.npy", rng.standard_normal((2, int(rng.integers(3, 40)))).astype(np.float32))
        np.save(root / f"id_{i}.npy", np.int64(i))
    return {k: str(root / f"{k}_*.npy") for k in ("img", "seq", "id")}


def _lagging_case(data, ragged, case):
    from ferry.torch import pad_collate
    fields = data[0]
    rows = dict(fields={"img": fields["img"], "vec": fields["vec"]}, batch_size=24)
    files = dict(fields={"img": ragged["img"], "id": ragged["id"]}, samples="files", batch_size=4)
    seq = dict(fields={"seq": ragged["seq"], "id": ragged["id"]}, samples="files", batch_size=4,
               collate={"seq": pad_collate(-1.0)})
    return {"rows": rows,
            "rows_cast_normalize": dict(rows, dtype={"img": torch.float16},
                                        normalize={"img": ((10.0, 20.0, 30.0), (2.0, 3.0, 4.0))}),
            "rows_per_sample": dict(rows, batch_size=None, sample_group=16),
            "files": files,
            "files_cast": dict(files, dtype={"img": torch.float32}),
            "files_ragged_collate": seq,
            "files_ragged_collate_cast": dict(seq, dtype={"seq": torch.float64})}[case]


@pytest.mark.parametrize("prefetch", [0, 4])
@pytest.mark.parametrize("case", ["rows", "rows_cast_normalize", "rows_per_sample", "files", "files_cast",
                                  "files_ragged_collate", "files_ragged_collate_cast"])
def test_array_batches_outlive_a_lagging_consumer(data, ragged, case, prefetch):
    """As test_token_group_buffer_outlives_a_lagging_consumer, for ArrayDataset: the consumer's
    stream runs a long kernel after each batch, so every kernel ferry queues on it (casts, a
    collate stacking per-file buffers) runs long after the loader dropped the group; no buffer
    may be handed to a later read meanwhile. Every batch equals the host's. Before the fix the
    ragged collate without a cast (its per-file buffers, read by pad_collate on the consumer's
    stream, were recorded nowhere) handed out later files' values."""
    kw = dict(_lagging_case(data, ragged, case), shuffle=True, seed=6, prefetch=prefetch)
    ref = [{k: v.numpy().copy() for k, v in b.items()} for b in ArrayDataset(device="cpu", **kw)]
    want = [{k: torch.from_numpy(v).cuda() for k, v in r.items()} for r in ref]   # uploaded before: no sync in the loop
    lag = 2_000_000 if kw["batch_size"] is None else 20_000_000   # ~1 ms a sample, ~10 ms a batch
    bad = torch.zeros((), dtype=torch.float64, device="cuda:0")
    n = 0
    for b in ArrayDataset(device="cuda:0", **kw):
        torch.cuda._sleep(lag)             # on the consumer stream, queued before the next batch's work
        w = want[n]
        assert b.keys() == w.keys() and all(v.is_cuda and v.shape == w[k].shape for k, v in b.items())
        for k, v in b.items():             # checked late, on the consumer stream; then the batch is dropped
            tol = 2e-3 * (1 + w[k].double().abs()) if v.dtype == torch.float16 else 0
            bad += ((v.double() - w[k].double()).abs() > tol).sum()
        n += 1
        del b
    torch.cuda.synchronize()
    assert n == len(ref) > 3
    assert int(bad) == 0


def test_normalise_vectors_live_on_the_stream_that_reads_them(data):
    """The normalisation vectors are cached for every dataset of the process; each work stream
    gets its own, allocated on it: a vector allocated on another dataset's stream and dropped by
    the cache's clear could be handed to that stream's next allocation while this stream, lagging,
    still reads it. Before: the second dataset read the first one's (allocated on its stream)."""
    import ferry.torch as ft
    import ferry.torch.groups as ft_groups  # noqa: E402

    def stream_of(t):
        p = t.data_ptr()
        for seg in torch.cuda.memory._snapshot()["segments"]:
            if seg["address"] <= p < seg["address"] + seg["total_size"]:
                return seg["stream"]
    kw = dict(fields={"img": data[0]["img"]}, batch_size=64, device="cuda:0",
              normalize={"img": ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))})
    ft_groups._norm_cache.clear()
    streams, keep = [], []
    for ds in (ArrayDataset(**kw), ArrayDataset(**kw)):
        it = iter(ds)
        keep.append((ds, it, next(it)))
        streams.append(ds._rt.work_stream.cuda_stream)
    torch.cuda.synchronize()
    assert streams[0] != streams[1]
    on = {stream_of(t) for pair in ft_groups._norm_cache.values() for t in pair}
    assert set(streams) <= on
