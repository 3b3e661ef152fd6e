#!/usr/bin/env bash
# make test: every suite, then one closing line "N passed, N failed".
set -u
PYTHON=${PYTHON:-.venv/bin/python}
P=0; F=0; S=0; rc=0
count() {  # add "a passed, b failed[, c skipped]" style numbers found in $1
    local line=$1 n
    n=$(echo "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' | head -1); P=$((P + ${n:-0}))
    n=$(echo "$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' | head -1); F=$((F + ${n:-0}))
    n=$(echo "$line" | grep -oE '[0-9]+ error' | grep -oE '[0-9]+' | head -1); F=$((F + ${n:-0}))
    n=$(echo "$line" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' | head -1); S=$((S + ${n:-0}))
}
run() {  # name, command...
    local name=$1; shift
    echo "== $name"
    local log; log=$(mktemp)
    "$@" 2>&1 | tee "$log"; local r=${PIPESTATUS[0]}
    local line; line=$(grep -E '([0-9]+ passed|[0-9]+ failed|[0-9]+ error|[0-9]+ skipped)' "$log" | tail -n1)
    count "$line"
    if [ "$r" -ne 0 ]; then echo "== $name: FAILED (exit $r)"; rc=1; [ -z "$line" ] && F=$((F + 1)); fi
    rm -f "$log"
}
run "C tests" make --no-print-directory test-c PYTHON="$PYTHON"
run "C tests under ASan+UBSan, fuzz corpus replay" make --no-print-directory test-asan PYTHON="$PYTHON"
run "the Python extension under ASan+UBSan" make --no-print-directory test-asan-python PYTHON="$PYTHON"
run "Python tests" env PYTHONPATH=python "$PYTHON" -m pytest -q -p no:cacheprovider tests/python
run "pip install . into a temporary directory" make --no-print-directory test-install PYTHON="$PYTHON"
run "GPU tests (skip without a GPU)" env PYTHONPATH=python tests/gpu/run.sh "$PYTHON"
run "GPU tests on the simulated driver (tests/cudasim)" make --no-print-directory test-cudasim PYTHON="$PYTHON"
echo "total: $P passed, $F failed, $S skipped"
[ $F -eq 0 ] || rc=1
exit $rc
