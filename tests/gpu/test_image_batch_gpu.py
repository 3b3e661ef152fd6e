"""ferry.images.load_batch into device memory (ferry's own device arrays, which
the stand-in driver of tests/cudasim serves too, and torch CUDA tensors):
nvJPEG's batched decode
(hardware engine and CUDA backend) beside the CPU threads, the transform
kernel, against the same call decoded on the CPU into host memory (the CPU
path is libjpeg-turbo + the CPU transform). Bounds are test_nvjpeg.c's for
nvJPEG's pixels (4:2:0 colour: mean difference <= 2, largest <= 128; gray
<= 1; PNG decoded by the CPU on both sides: exact), which the resize only
averages. The rows are written in order on torch's current stream, behind
work queued on it before the call. Skips without CUDA or nvJPEG (the torch
tests without torch's CUDA)."""
import io
import tarfile

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import ferry  # noqa: E402
from ferry import _ferry as F  # noqa: E402
from ferry import images  # noqa: E402

try:
    import torch
    TORCH_CUDA = torch.cuda.is_available()
except ImportError:   # the ferry-array test runs without torch
    torch, TORCH_CUDA = None, False
needs_torch = pytest.mark.skipif(not TORCH_CUDA, reason="torch sees no CUDA device")

SPEC = [("420", 375, 500), ("420", 240, 320), ("gray", 120, 90), ("progressive", 200, 260), ("png", 64, 80),
        ("444", 333, 250), ("420", 1, 1), ("420", 600, 800)]


@pytest.fixture(scope="module")
def shard(ctx, tmp_path_factory):
    st = images.nvjpeg_status()
    if not st.startswith("loaded"):
        pytest.skip(f"nvJPEG: {st}")
    rng = np.random.default_rng(0)
    path = str(tmp_path_factory.mktemp("imgbatch_gpu") / "train-0.tar")
    with tarfile.open(path, "w") as tf:   # WebDataset layout: key.ext members, one sample after another
        for i, (kind, h, w) in enumerate(SPEC):
            y, x = np.mgrid[0:h, 0:w]
            a = np.stack([x * 200 // max(w, 1) + y * 50 // max(h, 1) + 20 * c for c in range(3)], -1)
            a = (a + rng.integers(0, 6, a.shape)).clip(0, 255).astype(np.uint8)   # smooth, as test_nvjpeg's
            b = io.BytesIO()
            if kind == "png":
                Image.fromarray(a).save(b, "PNG")
            elif kind == "gray":
                Image.fromarray(a[:, :, 0]).save(b, "JPEG", quality=90)
            else:
                Image.fromarray(a).save(b, "JPEG", quality=90, progressive=kind == "progressive",
                                        subsampling=0 if kind == "444" else 2)
            data = b.getvalue()
            info = tarfile.TarInfo(f"s{i:04d}.{'png' if kind == 'png' else 'jpg'}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return images.open_shards(path)


def _bound_ok(kind, got, want):
    d = np.abs(got.astype(np.int32) - want.astype(np.int32))
    if kind == "png":
        return d.max() == 0, d
    if kind == "gray":
        return d.max() <= 1, d
    return d.mean() <= 2.0 and d.max() <= 128, d


def test_ferry_device_array(ctx, shard):
    """Into a ferry.Array on device 0: on the stand-in driver and nvJPEG too."""
    samples = [0, 4, 2, 6, 1]
    out = F.empty((len(samples), 3, 32, 32), "|u1", device=0, ctx=ctx)
    r = images.load_batch(shard, samples, out, seed=4, decode="gpu")
    assert r["written"] == len(samples) and r["gpu"] == len(samples) - 1 and r["fallbacks"]["png"] == 1
    got = np.empty((len(samples), 3, 32, 32), np.uint8)
    ctx.memcpy(got, out)
    ref = np.zeros_like(got)
    images.load_batch(shard, samples, ref, seed=4, decode="cpu")
    for i, k in enumerate(samples):
        ok, d = _bound_ok(SPEC[k][0], got[i], ref[i])
        assert ok, f"row {i}: max {d.max()}, mean {d.mean():.3f}"


@needs_torch
@pytest.mark.parametrize("decode", ["auto", "gpu"])
def test_gpu_rows_within_nvjpeg_bounds(shard, decode):
    samples = list(range(len(SPEC))) + [0, 5]
    out = torch.zeros((len(samples), 3, 64, 64), dtype=torch.uint8, device="cuda")
    ref = np.zeros((len(samples), 3, 64, 64), np.uint8)
    before = ferry.stats()["image_gpu"]
    r = images.load_batch(shard, samples, out, flip=0.5, scale=(0.5, 1.0), seed=3, epoch=1, decode=decode)
    images.load_batch(shard, samples, ref, flip=0.5, scale=(0.5, 1.0), seed=3, epoch=1, decode="cpu")
    assert r["written"] == len(samples) and r["gpu"] + r["cpu"] == len(samples)
    assert r["gpu"] >= 1 and ferry.stats()["image_gpu"] - before == r["gpu"]
    assert r["fallbacks"]["png"] == 1 and r["fallbacks"]["gpu_error"] == 0
    if decode == "gpu":
        assert r["gpu"] == len(samples) - 1
    print(f"  decode={decode}: gpu {r['gpu']} (hardware {r['gpu_hardware']}), cpu {r['cpu']}")
    got = out.cpu().numpy()
    for i, k in enumerate(samples):
        ok, d = _bound_ok(SPEC[k][0], got[i], ref[i])
        print(f"  row {i} ({SPEC[k][0]} {SPEC[k][1]}x{SPEC[k][2]}): max {d.max()}, mean {d.mean():.3f}")
        assert ok, f"row {i}"


@needs_torch
def test_bfloat16_on_a_busy_stream(shard):
    """Work queued on torch's current stream before the call (a long sleep,
    then a fill) runs before the rows are written."""
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    samples = [0, 1, 3, 5, 7]
    out = torch.empty((len(samples), 224, 224, 3), dtype=torch.bfloat16, device="cuda")
    ref = np.zeros((len(samples), 224, 224, 3), np.float32)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)     # ~0.1 s of GPU time queued first
        out.fill_(-100.0)                   # then a fill the rows must come after
        r = images.load_batch(shard, samples, out, layout="HWC", mean=mean, std=std, seed=8, decode="gpu")
    assert r["gpu"] == len(samples)
    images.load_batch(shard, samples, ref, layout="HWC", mean=mean, std=std, seed=8, decode="cpu")
    got = out.float().cpu().numpy()
    assert got.min() > -10, "the fill ran after the rows were written"
    d = np.abs(got - ref)
    # in normalised units: test_nvjpeg's mean bound of 2 levels is 2 / 255 / 0.224; bfloat16 adds < 1 %
    assert d.mean() <= 2 / 255 / 0.224 + 0.02, d.mean()


_NO_KERNEL = r"""
import sys, numpy as np
from ferry import _ferry as F, images
ctx = F.Context()
s = images.open_shards(sys.argv[1])
n = len(s)
out = F.empty((n, 3, 24, 24), "|u1", device=0, ctx=ctx)
r = images.load_batch(s, list(range(n)), out, seed=2, flip=0.5)     # auto: no kernel, so the CPU alone
got = np.empty((n, 3, 24, 24), np.uint8); ctx.memcpy(got, out)
ref = np.zeros_like(got); images.load_batch(s, list(range(n)), ref, seed=2, flip=0.5)
assert r["gpu"] == 0 and r["cpu"] == n, r
assert np.array_equal(got, ref)
try:
    images.load_batch(s, [0], F.empty((1, 3, 24, 24), "|u1", device=0, ctx=ctx), decode="gpu")
    raise SystemExit("decode=gpu without the kernel did not fail")
except F.FerryError as e:
    assert "kernel" in str(e), e
print("OK")
"""


def test_without_the_kernel_rows_are_copied(ctx, shard, tmp_path):
    """FERRY_KERNELS=none: the CPU transforms and copies rows; decode="gpu" says why it cannot."""
    import os
    import subprocess
    import sys
    path = shard.sample(0)["members"][0]["path"]
    env = dict(os.environ, FERRY_KERNELS="none")
    r = subprocess.run([sys.executable, "-c", _NO_KERNEL, path], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr
