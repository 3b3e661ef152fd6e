#!/usr/bin/env bash
# gpu-wheels.sh [--no-dali] — assemble here what tools/gpu-run.sh expects to be
# carried to the GPU machine, which has no registry (../shared/GPU_MACHINE.md):
#   .gpu/whl       cp312 manylinux wheels of the packages the GPU tests and the
#                  benchmarks' peers import (zarr, netCDF4, dask, kvikio, nvCOMP,
#                  xbatcher, ...) and Debian's libdeflate (lib + header) for the
#                  CPU inflater: carried by one call (`carry: [".gpu/whl"]`, step
#                  `wheels`); it must stay under the 64 MiB a call carries.
#   .gpu/whl-ckpt  the checkpoint benchmark's peers (instanttensor, fastsafetensors):
#                  a second call carrying it with step `wheels` adds them.
#   .gpu/whl-remote  bench_remote's server and peer: Debian's nginx (the nginx package's
#                  binary, run from there) and fsspec's HTTP client (aiohttp and its
#                  dependencies) for zarr-python over HTTP; carried beside .gpu/whl.
#   .gpu/d1 .. d5  DALI's 199 MB wheel in parts of 48,000,000 bytes, its md5 and
#                  its own dependencies, one folder per call (steps part1..part5,
#                  then `dali`, on a machine kept warm between the calls).
# Idempotent: a wheel already downloaded is kept. Needs network access to PyPI
# and Debian's archive (this machine, not the GPU one).
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
dl() {   # dl DIR SPEC...: binary wheels for the GPU machine's python (3.12, manylinux 2.28, x86_64)
    local dir=$1; shift
    mkdir -p "$dir"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d "$dir" "$@"
}
# what the GPU machine lacks (GPU_MACHINE.md's table): the tests' reference readers, the peers
# of the benchmarks and their dependencies (torch, numpy, cupy, xarray, h5py are there)
dl .gpu/whl zarr numcodecs donfig google-crc32c msgspec crc32c netCDF4 cftime \
    dask partd locket toolz cloudpickle \
    kvikio-cu13 libkvikio-cu13 rapids-logger nvidia-libnvcomp-cu13 nvidia-nvcomp-cu13 xbatcher h5netcdf torchdata \
    webdataset braceexpand
dl .gpu/whl-ckpt fastsafetensors instanttensor
dl .gpu/whl-remote fsspec aiohttp aiohappyeyeballs aiosignal frozenlist multidict yarl propcache attrs idna \
    typing_extensions
if [ ! -x .gpu/whl-remote/nginx/nginx ]; then
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download nginx >/dev/null 2>&1)
    for d in "$tmp"/*.deb; do dpkg-deb -x "$d" "$tmp/x"; done
    mkdir -p .gpu/whl-remote/nginx
    cp "$tmp"/x/usr/sbin/nginx .gpu/whl-remote/nginx/
    rm -rf "$tmp"
fi
# libdeflate from Debian (gpu-run.sh copies it into .deps, the build links it)
if [ ! -e .gpu/whl/deflate/include/libdeflate.h ]; then
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download libdeflate0 libdeflate-dev >/dev/null)
    for d in "$tmp"/*.deb; do dpkg-deb -x "$d" "$tmp/x"; done
    mkdir -p .gpu/whl/deflate/include .gpu/whl/deflate/lib
    cp "$tmp"/x/usr/include/libdeflate.h .gpu/whl/deflate/include/
    cp -P "$tmp"/x/usr/lib/x86_64-linux-gnu/libdeflate.so* .gpu/whl/deflate/lib/
    rm -rf "$tmp"
fi
# libjpeg-turbo from Debian (gpu-run.sh copies it into .deps: the CPU JPEG decoder)
if [ ! -e .gpu/whl/turbojpeg/include/turbojpeg.h ]; then
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download libturbojpeg0 libturbojpeg0-dev >/dev/null)
    for d in "$tmp"/*.deb; do dpkg-deb -x "$d" "$tmp/x"; done
    mkdir -p .gpu/whl/turbojpeg/include .gpu/whl/turbojpeg/lib
    cp "$tmp"/x/usr/include/turbojpeg.h .gpu/whl/turbojpeg/include/
    cp -P "$tmp"/x/usr/lib/x86_64-linux-gnu/libturbojpeg.so* .gpu/whl/turbojpeg/lib/
    rm -rf "$tmp"
fi
# libjpeg-turbo's libjpeg API from Debian (gpu-run.sh copies it into .deps: the CPU decode of the
# part of a JPEG a crop needs, src/codecs/jpegregion.c); the same 2.1.5 as libturbojpeg above
if [ ! -e .gpu/whl/libjpeg/include/jpeglib.h ]; then
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download libjpeg62-turbo libjpeg62-turbo-dev >/dev/null)
    for d in "$tmp"/*.deb; do dpkg-deb -x "$d" "$tmp/x"; done
    mkdir -p .gpu/whl/libjpeg/include .gpu/whl/libjpeg/lib
    cp "$tmp"/x/usr/include/jpeglib.h "$tmp"/x/usr/include/jmorecfg.h "$tmp"/x/usr/include/jerror.h \
        "$tmp"/x/usr/include/x86_64-linux-gnu/jconfig.h .gpu/whl/libjpeg/include/
    cp -P "$tmp"/x/usr/lib/x86_64-linux-gnu/libjpeg.so* .gpu/whl/libjpeg/lib/
    rm -rf "$tmp"
fi
# libspng from Debian (gpu-run.sh copies it into .deps: the CPU PNG decoder)
if [ ! -e .gpu/whl/spng/include/spng.h ]; then
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download libspng0 libspng-dev >/dev/null 2>&1)
    for d in "$tmp"/*.deb; do dpkg-deb -x "$d" "$tmp/x"; done
    mkdir -p .gpu/whl/spng/include .gpu/whl/spng/lib
    cp "$tmp"/x/usr/include/spng.h .gpu/whl/spng/include/
    cp -P "$tmp"/x/usr/lib/x86_64-linux-gnu/libspng.so* .gpu/whl/spng/lib/
    rm -rf "$tmp"
fi
size=$(du -sb .gpu/whl | cut -f1)
echo ".gpu/whl: $(ls .gpu/whl/*.whl | wc -l) wheels, $((size / 1000000)) MB"
[ "$size" -lt $((58 << 20)) ] || { echo ".gpu/whl is over what one call carries with the tree (64 MiB): move a wheel out"; exit 1; }
[ "${1:-}" = --no-dali ] && exit 0
# DALI in parts: the wheel split (dalipart.a, .b, ...), its md5, and its dependencies in the last part
w=nvidia_dali_cuda130-2.4.0-py3-none-manylinux_2_28_x86_64.whl
mkdir -p .gpu/dali
[ -e ".gpu/dali/$w" ] || dl .gpu/dali nvidia-dali-cuda130==2.4.0
dl .gpu/dali-deps astunparse gast optree makefun nvtx libcst
rm -rf .gpu/d[0-9] .gpu/split
mkdir -p .gpu/split
# 48 MB a part: a call carries 64 MiB with the working tree (about 4 MB), and parts of 62 MB
# stop fitting once the tree passes 3.5 MB
split -b 48000000 -a 1 ".gpu/dali/$w" .gpu/split/dalipart.
n=0
for p in .gpu/split/dalipart.*; do
    n=$((n + 1)); mkdir -p ".gpu/d$n"; mv "$p" ".gpu/d$n/"
done
[ "$n" -le 9 ] || { echo "DALI's wheel needs $n parts: gpu-run.sh takes part1..part9"; exit 1; }
md5sum < ".gpu/dali/$w" | cut -d' ' -f1 > ".gpu/d$n/dali.md5"
cp .gpu/dali-deps/*.whl ".gpu/d$n/"
rmdir .gpu/split
for k in $(seq 1 "$n"); do echo ".gpu/d$k: $(du -sb ".gpu/d$k" | cut -f1) bytes"; done
