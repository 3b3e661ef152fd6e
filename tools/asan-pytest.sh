#!/usr/bin/env bash
# make test-asan-python: a focused pytest subset on the extension built with
# ASan+UBSan (build-asan/py), libasan preloaded into the uninstrumented Python.
#   tools/asan-pytest.sh PYTHON PKGDIR
# Tests that import torch are left out: torch's own libraries are not meant
# to run under a preloaded ASan runtime. A sanitizer report aborts the process
# (-fno-sanitize-recover), which pytest's exit code and the summary line show.
set -u
PY=$1 PKG=$2
cd "$(dirname "$0")/.."
if ! "$PY" -c 'import numpy, pytest' 2>/dev/null; then
    echo "ASan Python tests: $PY has no numpy/pytest: 1 skipped"; exit 0
fi
LIBASAN=$(${CC:-cc} -print-file-name=libasan.so)
[ -e "$LIBASAN" ] || { echo "ASan Python tests: no libasan.so: 1 skipped"; exit 0; }
echo "  the extension under ASan+UBSan ($PKG/ferry), pytest subset:"
LD_PRELOAD="$LIBASAN" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
PYTHONPATH="$PKG" PYTHONMALLOC=malloc "$PY" -m pytest -q -p no:cacheprovider -x \
    -k "not torch and not dataloader" \
    tests/python/test_ext.py tests/python/test_read_out.py tests/python/test_errors.py tests/python/test_names.py \
    tests/python/test_formats_npy.py tests/python/test_formats_safetensors.py tests/python/test_formats_netcdf3.py \
    tests/python/test_paths_and_shapes.py tests/python/test_plan_windows.py tests/python/test_plan_rows.py \
    tests/python/test_remote.py tests/python/test_remote_tls.py 2>&1 | tail -n 15
exit "${PIPESTATUS[0]}"
