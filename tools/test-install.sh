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
check "the distribution is ferry-io, Apache-2.0" bash -c "grep -q '^Name: ferry-io' '$S'/ferry_io-*.dist-info/METADATA && grep -q 'Apache-2.0' '$S'/ferry_io-*.dist-info/METADATA && ls '$S'/ferry_io-*.dist-info/licenses/LICENSE"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
