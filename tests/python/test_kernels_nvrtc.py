"""The run-time kernel path (src/cuda/nvrtc.c): without an nvcc fatbin the
library compiles src/cuda/kernels.cu with the libnvrtc of the CUDA wheels
torch brings (ferry points FERRY_NVRTC at it on import). NVRTC runs without a
GPU, so the PTX is checked here; loading it is tests/gpu's and cudasim's job."""
import os
import re

import pytest

import ferry
from ferry import _ferry

KERNELS = os.path.join(os.path.dirname(__file__), "..", "..", "src", "cuda", "kernels.cu")


def test_nvrtc_compiles_every_kernel_of_kernels_cu():
    ptx, why = _ferry.nvrtc_ptx()
    if ptx is None:
        pytest.skip(f"no usable libnvrtc here: {why}")
    assert why == ""
    names = re.findall(r'extern "C" __global__ void (\w+)', open(KERNELS).read())
    assert names and all(f".entry {n}(" in ptx for n in names)
    assert ".target sm_75" in ptx


def test_kernels_source_is_consistent():
    src, why = _ferry.kernels_source(), _ferry.kernels_status()
    assert src in ("embedded fatbin", "NVRTC", "none")
    assert (why == "") == (src != "none")
    assert ferry.stats()["kernels"] == src
