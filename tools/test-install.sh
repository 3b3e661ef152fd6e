#!/usr/bin/env bash
# make test-install: `pip install .` into a temporary --target (no build
# isolation, no dependencies: offline and quick), then run the installed
# `ferry` command and import ferry from there, outside the checkout.
#   tools/test-install.sh PYTHON
set -u
PY=${1:-${PYTHON:-.venv/bin/python}}
cd "$(dirname "$0")/.."
case "$PY" in /*) ;; */*) PY="$PWD/$PY" ;; esac
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
check() {  # description, command...
    local what=$1; shift
    if "$@" >"$T/out" 2>&1; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "  FAIL $what"; cat "$T/out"; fi
}
if ! "$PY" -m pip install -q --no-deps --no-build-isolation --target "$T/site" . >"$T/log" 2>&1; then
    cat "$T/log"; echo "0 passed, 1 failed"; exit 1
fi
S="$T/site"
check "the ferry command is installed and runs" env PYTHONPATH="$S" "$S/bin/ferry" --help
check "it is the C program" bash -c "head -c4 '$S/ferry/_bin/ferry' | grep -q ELF"
check "ferry info names the GPU kernels" bash -c "PYTHONPATH='$S' '$S/bin/ferry' info | grep -q 'GPU kernels: '"
check "a bad option exits 2" bash -c "PYTHONPATH='$S' '$S/bin/ferry' bench --threads abc; [ \$? -eq 2 ]"
check "import ferry comes from the install" bash -c "cd '$T' && PYTHONPATH='$S' '$PY' -c '
import sys, numpy as np, ferry
assert ferry.__file__.startswith(sys.argv[1]), ferry.__file__
np.save(\"x.npy\", np.arange(10.0)); assert (ferry.read(\"x.npy\") == np.arange(10.0)).all()
print(ferry.stats()[\"kernels\"])' '$S'"
check "the subpackages are installed, the xarray engine's entry point resolves to them" bash -c "cd '$T' && PYTHONPATH='$S' '$PY' -c '
import sys, importlib.metadata as md
for m in (\"ferry/torch/stream.py\", \"ferry/xarray/backend.py\", \"ferry/checkpoint/dcp.py\", \"ferry/__init__.pyi\"):
    open(sys.argv[1] + \"/\" + m).close()
ep = [e for e in md.distribution(\"ferry-io\").entry_points if e.group == \"xarray.backends\"][0]
assert ep.value == \"ferry.xarray:FerryBackendEntrypoint\", ep
cls = ep.load()
assert sys.modules[cls.__module__].__file__.startswith(sys.argv[1]), cls' '$S'"
check "the distribution is ferry-io, Apache-2.0" bash -c "grep -q '^Name: ferry-io' '$S'/ferry_io-*.dist-info/METADATA && grep -q 'Apache-2.0' '$S'/ferry_io-*.dist-info/METADATA && ls '$S'/ferry_io-*.dist-info/licenses/LICENSE"
# without nvcc (NVCC=none): no fatbin, so the kernels come from NVRTC at run
# time when a libnvrtc is found (the ferry command's Python wrapper points
# FERRY_NVRTC at the CUDA wheels'), else none, and `ferry info` says which
if NVCC=none "$PY" -m pip install -q --no-deps --no-build-isolation --target "$T/nok" . >"$T/log" 2>&1; then
    N="$T/nok"
    if PYTHONPATH="$N" "$PY" -c 'from ferry import _ferry; assert _ferry.nvrtc_ptx()[0]' 2>/dev/null; then
        check "without nvcc: ferry info says NVRTC" bash -c "PYTHONPATH='$N' '$N/bin/ferry' info | grep -q 'GPU kernels: NVRTC'"
    fi
    check "without nvcc or NVRTC: ferry info says none, and why" \
        bash -c "FERRY_NVRTC=/nonexistent/libnvrtc.so PYTHONPATH='$N' '$N/bin/ferry' info | grep -q 'GPU kernels: none (.*libnvrtc not found'"
else
    cat "$T/log"; fail=$((fail + 1)); echo "  FAIL pip install . with NVCC=none"
fi
# the sdist alone builds and works: every header and source it needs is in it
# (MANIFEST.in), outside the checkout
if "$PY" setup.py -q sdist -d "$T/dist" >"$T/log" 2>&1; then
    mkdir -p "$T/unpack" && tar -xzf "$T"/dist/ferry_io-*.tar.gz -C "$T/unpack"
    check "the sdist builds outside the checkout" bash -c "cd '$T'/unpack/ferry_io-* && NVCC=none '$PY' -m pip install -q --no-deps --no-build-isolation --target '$T/sd' ."
    check "the package built from the sdist reads a file" bash -c "cd '$T' && PYTHONPATH='$T/sd' '$PY' -c '
import numpy as np, ferry
np.save(\"y.npy\", np.arange(7)); assert (ferry.read(\"y.npy\") == np.arange(7)).all()'"
else
    cat "$T/log"; fail=$((fail + 1)); echo "  FAIL setup.py sdist"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
