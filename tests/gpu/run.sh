#!/usr/bin/env bash
# GPU tests: the C device-path suite, then pytest tests/gpu. Each skips with a
# reason where there is no GPU. Prints the pytest/C closing lines.
#   tests/gpu/run.sh PYTHON
set -u
PY=${1:-python3}
cd "$(dirname "$0")/../.."
rc=0
ctests=$(ls tests/gpu/test_*.c | sed 's|^tests/gpu/\(.*\)\.c$|build/tests/gpu/\1|')
make --no-print-directory $ctests PYTHON="$PY" >/dev/null || exit 1
tools/run-c-tests.sh $ctests || rc=1
if ls tests/gpu/test_*.py >/dev/null 2>&1; then
    PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} "$PY" -m pytest -q -p no:cacheprovider -rs tests/gpu; r=$?
    # exit 5: nothing collected is not a failure here
    [ $r -eq 0 ] || [ $r -eq 5 ] || rc=1
fi
exit $rc
