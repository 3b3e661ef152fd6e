#!/usr/bin/env bash
# gpu-run.sh STEP... — build and run on the GPU machine (no registry there):
# the system python3, carried headers in .deps/include, the machine's own
# zstd/lz4/zlib runtime libraries. Logs go to $OUT (or ./gpu-out).
#   steps: wheels build test ctest bench benchwarm sweep engine pybench
#          part1..part5 dali (DALI's wheel in parts) records decode xtrain plan
#          formats xbench (bench_xarray, BXARGS) torchbench (bench_torch, BTARGS) records (BRARGS)
#          ckptbench (bench_checkpoint, BCARGS) remotebench (bench_remote, BRMARGS) chunkfiles (bench_chunkfiles, BCFARGS) nccl (the two-GPU tests)
#          multigpu (issue 11's tests on 2..8 GPUs) mgbench, then mgranks (bench_multigpu in
#          two commands: limits/file->GPU/decode, then datasets/checkpoints; MGARGS)
#   wheels: pip-installs .gpu/whl*/*.whl (carry ".gpu/whl": zarr, numcodecs,
#           netCDF4, dask, ... downloaded here for Python 3.12 by tools/gpu-wheels.sh,
#           which also makes .gpu/whl-ckpt and DALI's parts .gpu/d1..d5) into /tmp/site.
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
[ -d /tmp/site ] && export PYTHONPATH=$PYTHONPATH:/tmp/site
[ -d /tmp/site-dali ] && export PYTHONPATH=$PYTHONPATH:/tmp/site-dali
export CUFILE_ENV_PATH_JSON=$PWD/tests/gpu/cufile-compat.json CUFILE_ALLOW_COMPAT_MODE=true CUFILE_FORCE_COMPAT_MODE=true CUFILE_LOGFILE_PATH=$OUT/cufile.log
mkdir -p .deps/lib
for l in zstd lz4 z; do
    so=$(ls /usr/lib/x86_64-linux-gnu/lib$l.so.1 /lib/x86_64-linux-gnu/lib$l.so.1 /usr/lib64/lib$l.so.1 2>/dev/null | head -1)
    [ -n "$so" ] && ln -sf "$so" .deps/lib/lib$l.so
done
# bench NAME SECONDS LINES ARGS...: bench/NAME.py into $OUT/NAME.txt, show its last LINES.
# The *ARGS variables are split on spaces, not parsed by a shell: give values without quotes
# (BXTARGS="--sync-sweep 4:auto:dali;4:auto:copy"; quotes would reach the script as characters)
bench() {
    local name=$1 secs=$2 lines=$3; shift 3
    timeout "$secs" python3 "bench/$name.py" "$@" > "$OUT/$name.txt" 2>&1; echo "$name exit $?"
    tail -n "$lines" "$OUT/$name.txt"
}
# carried libdeflate (Debian's libdeflate0/-dev, .gpu/whl/deflate): the CPU inflater the
# build picks up from .deps, found at run time through LD_LIBRARY_PATH
if [ -d .gpu/whl/deflate ]; then
    mkdir -p .deps/include .deps/lib
    cp .gpu/whl/deflate/include/libdeflate.h .deps/include/
    cp .gpu/whl/deflate/lib/libdeflate.so* .deps/lib/
fi
# carried libjpeg-turbo (Debian's libturbojpeg0/-dev, .gpu/whl/turbojpeg): the CPU JPEG decoder
if [ -d .gpu/whl/turbojpeg ]; then
    mkdir -p .deps/include .deps/lib
    cp .gpu/whl/turbojpeg/include/turbojpeg.h .deps/include/
    cp -P .gpu/whl/turbojpeg/lib/libturbojpeg.so* .deps/lib/
fi
# carried libjpeg (Debian's libjpeg62-turbo/-dev, .gpu/whl/libjpeg): the CPU decode of a crop's part
if [ -d .gpu/whl/libjpeg ]; then
    mkdir -p .deps/include .deps/lib
    cp .gpu/whl/libjpeg/include/*.h .deps/include/
    cp -P .gpu/whl/libjpeg/lib/libjpeg.so* .deps/lib/
fi
# carried libspng (Debian's libspng0/-dev, .gpu/whl/spng): the CPU PNG decoder
if [ -d .gpu/whl/spng ]; then
    mkdir -p .deps/include .deps/lib
    cp .gpu/whl/spng/include/spng.h .deps/include/
    cp -P .gpu/whl/spng/lib/libspng.so* .deps/lib/
fi
export LD_LIBRARY_PATH=$PWD/.deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# nvCOMP from the carried wheel (the Python package finds it itself; the C tests need the path)
for so in /tmp/site/nvidia/libnvcomp/lib64/libnvcomp.so.6 /tmp/site/nvidia/libnvcomp/lib64/libnvcomp.so.5; do
    [ -z "${FERRY_NVCOMP:-}" ] && [ -e "$so" ] && export FERRY_NVCOMP=$so
done
# This VM has no udev database, and cuFile (even in compatibility mode)
# refuses files whose block device has no udev properties. To exercise
# ferry's cuFile code path (tests/gpu, C or Python), record the one property it asks for.
cufile_udev() {
    local dev; dev=$(mountpoint -d "$(df --output=target . | tail -1)" 2>/dev/null)
    if [ -n "$dev" ] && [ ! -e "/run/udev/data/b$dev" ]; then
        mkdir -p /run/udev/data && printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n' > "/run/udev/data/b$dev"
        echo "wrote /run/udev/data/b$dev for cuFile" >> "$OUT/machine.txt"
    fi
}
for step in "$@"; do
    case $step in
    wheels)
        if ls .gpu/whl*/*.whl >/dev/null 2>&1; then   # .gpu/whl, or .gpu/whl-ckpt (tools/gpu-wheels.sh)
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
                .gpu/whl*/*.whl > "$OUT/wheels.log" 2>&1; echo "wheels exit $?"
            export PYTHONPATH=$PWD/python:/tmp/site
            for so in /tmp/site/nvidia/libnvcomp/lib64/libnvcomp.so.6 /tmp/site/nvidia/libnvcomp/lib64/libnvcomp.so.5; do
                [ -z "${FERRY_NVCOMP:-}" ] && [ -e "$so" ] && export FERRY_NVCOMP=$so
            done
            python3 -c 'import zarr, numcodecs, netCDF4, dask; print("zarr", zarr.__version__, "netCDF4", netCDF4.__version__, "dask", dask.__version__)'
        fi ;;
    build)
        { nvidia-smi -L; nproc; free -g | head -2; df -h . | tail -1; command -v nvcc; python3 -V;
          python3 -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)'; } > "$OUT/machine.txt" 2>&1
        nvinc=; [ -d /tmp/site/nvidia/libnvcomp/include ] && nvinc="-idirafter /tmp/site/nvidia/libnvcomp/include"
        make -j16 lib cli python build/tests/gpu/test_gpu_engine build/tests/test_cuda_abi PYTHON=python3 NVCOMP_INC="$nvinc" \
            > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
        build/tests/test_cuda_abi 2>&1 | tail -3
        echo "build ok" ;;
    test)
        cufile_udev
        FERRY_TEST_DIR=$PWD timeout 400 tests/gpu/run.sh python3 > "$OUT/gpu-tests.log" 2>&1; echo "gpu tests exit $?"
        grep -E "passed|failed|FAIL|skip" "$OUT/gpu-tests.log" | tail -25 ;;
    bench)
        timeout 300 ./build/ferry bench --size 4G --reps 3 --drop-caches --file "$PWD/ferry-bench.bin" > "$OUT/bench.txt" 2>&1; echo "bench exit $?"
        cat "$OUT/bench.txt" ;;
    ctest)
        cufile_udev
        FERRY_TEST_DIR=$PWD FERRY_GPU_BIG=0 timeout 120 build/tests/gpu/test_gpu_engine > "$OUT/gpu-ctest.log" 2>&1; echo "gpu C tests exit $?"
        tail -3 "$OUT/gpu-ctest.log" ;;
    benchwarm)
        timeout 200 ./build/ferry bench --size 4G --reps 2 --no-cold --file "$PWD/ferry-bench.bin" > "$OUT/bench-warm.txt" 2>&1; echo "bench exit $?"
        cat "$OUT/bench-warm.txt" ;;
    sweep)
        # staged warm and cold rates under other thread / staging settings
        for cfg in "16 4M 8M" "24 4M 8M" "32 4M 8M" "16 8M 16M" "16 2M 8M" "4 4M 8M"; do
            set -- $cfg
            echo "== threads $1 staging $2 task $3" >> "$OUT/sweep.txt"
            FERRY_THREADS=$1 FERRY_STAGING_SIZE=$2 FERRY_TASK_SIZE=$3 timeout 120 ./build/ferry bench --size 4G --reps 2 \
                --no-latency --file "$PWD/ferry-bench.bin" 2>&1 | grep -E "ferry file|O_DIRECT read" >> "$OUT/sweep.txt"
        done
        cat "$OUT/sweep.txt" ;;
    engine) bench bench_engine 200 1000 --gib 4 ;;
    formats) bench bench_formats 400 25 ${BFARGS:-} ;;
    xbench) bench bench_xarray 500 25 ${BXARGS:-} ;;
    torchbench) bench bench_torch 500 30 ${BTARGS:-} ;;
    ckptbench) bench bench_checkpoint 500 30 ${BCARGS:-} ;;
    remotebench)   # carry .gpu/whl-remote too (nginx, fsspec's HTTP client); BRMARGS
        PATH=$PWD/.gpu/whl-remote/nginx:$PATH bench bench_remote 500 30 ${BRMARGS:-}
        PATH=$PWD/.gpu/whl-remote/nginx:$PATH bench bench_remote_zarr 500 30 --device 0 ;;
    nccl)
        PYTHONPATH=$PYTHONPATH timeout 300 python3 -m pytest -q -p no:cacheprovider -rs \
            tests/gpu/test_torch_gpu.py::test_two_gpus_nccl tests/gpu/test_checkpoint_gpu.py::test_gpu_dcp_nccl_two_gpus \
            > "$OUT/nccl.log" 2>&1; echo "nccl tests exit $?"
        tail -15 "$OUT/nccl.log" ;;
    multigpu|mgbench)
        # nvidia-h200-x2/x4/x8: NVLink multicast (NVLS) must stay off on those machines
        export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
        { nvidia-smi topo -m; numactl --hardware; for f in /sys/bus/pci/devices/*/numa_node; do
              d=${f%/numa_node}; [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] && echo "${d##*/} $(cat "$d/class") node $(cat "$f")"
          done; ./build/ferry info; } > "$OUT/multigpu-topology.txt" 2>&1
        grep -E "NUMA|CUDA" "$OUT/multigpu-topology.txt"
        if [ "$step" = multigpu ]; then
            make --no-print-directory build/tests/gpu/test_multigpu build/tests/gpu/test_gpu_contexts PYTHON=python3 > /dev/null || exit 1
            FERRY_TEST_DIR=$PWD timeout 120 tools/run-c-tests.sh build/tests/gpu/test_multigpu build/tests/gpu/test_gpu_contexts \
                > "$OUT/multigpu-ctest.log" 2>&1; echo "multigpu C tests exit $?"; tail -4 "$OUT/multigpu-ctest.log"
            # two runs: node ids of a module that skips as a whole fail collection
            timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_multigpu_ranks.py \
                > "$OUT/multigpu-pytest.log" 2>&1; echo "multigpu ranks pytest exit $?"; tail -5 "$OUT/multigpu-pytest.log"
            timeout 280 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_torch_gpu.py::test_two_gpus_nccl \
                tests/gpu/test_checkpoint_gpu.py::test_gpu_dcp_nccl_two_gpus \
                > "$OUT/multigpu-nccl.log" 2>&1; echo "two-GPU nccl pytest exit $?"; tail -5 "$OUT/multigpu-nccl.log"
        else   # two commands of < 10 min: mgbench (limits, file->GPU, decode), then mgranks
            bench bench_multigpu 590 40 --dir "$PWD" --skip datasets,checkpoint --json "$OUT/bench_multigpu_io.json" ${MGARGS:-}
        fi ;;
    mgranks)
        export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
        agg=; [ -f "$OUT/bench_multigpu_io.json" ] && agg="--aggregate-from $OUT/bench_multigpu_io.json"
        timeout 590 python3 bench/bench_multigpu.py --dir "$PWD" --skip limits,aggregate,decode $agg \
            --json "$OUT/bench_multigpu_ranks.json" ${MGARGS:-} > "$OUT/bench_multigpu_ranks.txt" 2>&1
        echo "bench_multigpu (ranks) exit $?"; tail -n 30 "$OUT/bench_multigpu_ranks.txt" ;;
    part*)
        # DALI's wheel comes in parts (one carried folder .gpu/dN per call): keep each in /tmp/parts
        n=${step#part}; mkdir -p /tmp/parts && cp .gpu/d$n/* /tmp/parts/ && echo "part $n kept: $(ls /tmp/parts | wc -l) files" ;;
    dali)
        [ -d /tmp/parts ] || { echo "dali: /tmp/parts is gone (the machine went cold): carry the parts again"; exit 1; }
        w=/tmp/parts/nvidia_dali_cuda130-2.4.0-py3-none-manylinux_2_28_x86_64.whl
        cat /tmp/parts/dalipart.? > "$w"
        [ "$(md5sum < "$w" | cut -d' ' -f1)" = "$(cat /tmp/parts/dali.md5)" ] || { echo "dali: md5 mismatch"; exit 1; }
        # a target of its own: pip --target does not merge into /tmp/site/nvidia (nvCOMP is there)
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-dali "$w" \
            /tmp/parts/*.whl > "$OUT/dali-install.log" 2>&1; echo "dali install exit $?"
        # nvidia/ is a namespace split over several directories: let each portion be found
        for d in /tmp/site/nvidia /tmp/site-dali/nvidia; do
            [ -d "$d" ] && printf '__path__ = __import__("pkgutil").extend_path(__path__, __name__)\n' > "$d/__init__.py"
        done
        export PYTHONPATH=$PYTHONPATH:/tmp/site-dali
        python3 -c 'import nvidia.dali as d; print("DALI", d.__version__)' ;;
    records) bench bench_records 420 80 ${BRARGS:---gib 8 --count 200000 --reps 3} --dir "$PWD" ;;
    decode) bench bench_decode 400 40 ${BDARGS:-} ;;
    chunkfiles) bench bench_chunkfiles 500 12 --dir "$PWD" ${BCFARGS:---device 0} ;;
    xtrain) bench bench_xarray_training 500 40 ${BXTARGS:---gib 2} ;;
    plan) PYTHONPATH=$PYTHONPATH bench bench_plan 120 20 ;;
    pybench)
        for b in bench/bench_*.py; do
            timeout 240 python3 "$b" --smoke > "$OUT/$(basename "$b" .py).txt" 2>&1; echo "$b exit $?"
            tail -15 "$OUT/$(basename "$b" .py).txt"
        done ;;
    esac
done
