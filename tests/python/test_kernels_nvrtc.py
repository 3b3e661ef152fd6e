"""The run-time kernel path (src/cuda/nvrtc.c): without an nvcc fatbin the
library compiles src/cuda/kernels.cu with the libnvrtc of the CUDA wheels
torch brings (ferry hands its directory to the library on import, through
ferry_nvrtc_search_dir; it leaves the user's environment alone). NVRTC runs without a
GPU, so the PTX is checked here; loading it is tests/gpu's and cudasim's job."""
import os
import re
import subprocess
import sys

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


def _run(code):
    env = {k: v for k, v in os.environ.items() if k != "FERRY_NVRTC"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "..", "python"),
                                         env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_import_leaves_the_environment_alone():
    # once `import ferry` set os.environ["FERRY_NVRTC"]: a library must not change the
    # user's environment (child processes, other libraries reading it)
    out = _run("import os, ferry; print('FERRY_NVRTC' in os.environ, ferry._ferry.nvrtc_ptx()[0] is not None)")
    here, ptx = out.split()
    assert here == "False"
    ptx_in_process, _ = _ferry.nvrtc_ptx()
    assert ptx == str(ptx_in_process is not None)   # the wheel's libnvrtc is still found


def test_search_dir_is_named_when_nvrtc_is_missing():
    out = _run("from ferry import _ferry; _ferry.nvrtc_search_dir('/nonexistent/nvrtc-lib'); "
               "p, why = _ferry.nvrtc_ptx(); print(p is None); print(why)")
    missing, _, why = out.partition("\n")
    if missing != "True":
        pytest.skip("libnvrtc is on the loader's path here")
    assert "/nonexistent/nvrtc-lib" in why
