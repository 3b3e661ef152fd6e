"""GPU byteswaps with the kernels NVRTC compiles at run time (the path of a
pip install without nvcc), forced with FERRY_KERNELS=nvrtc on any build: the
PTX must load on the device and big-endian data must arrive in host order.
Each case runs in a fresh process (kernels are loaded once per process).
Runs on a real GPU and on the simulated driver (tests/cudasim)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from ferry import _ferry as F

SCRIPT = r"""
import sys, numpy as np, ferry
from ferry import _ferry as F
ctx = F.Context()
out = {}
for dt in (">i2", ">f4", ">f8", ">c16"):
    x = (np.arange(3000) * 7 - 5000).astype(dt).reshape(30, 100)
    p = sys.argv[1] + "/x.npy"
    np.save(p, x)
    a = ferry.read(p, device=0, ctx=ctx)
    h = np.empty(x.shape, x.dtype.newbyteorder("="))
    if isinstance(a, F.Array):
        ctx.memcpy(h, a)
    else:
        import cupy
        h = cupy.asnumpy(a)
    assert (h == x).all(), dt
print(ferry.stats(ctx)["kernels"], F.kernels_ready(0))
"""


def test_nvrtc_kernels_byteswap_on_the_device(ctx, tmp_path):
    if F.nvrtc_ptx()[0] is None:
        pytest.skip("no usable libnvrtc: " + F.nvrtc_ptx()[1])
    env = dict(os.environ, FERRY_KERNELS="nvrtc")
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["NVRTC", "True"], r.stdout + r.stderr
