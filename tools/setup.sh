#!/usr/bin/env bash
# Install what building and testing ferry needs, idempotently.
#   tools/setup.sh PYTHON
# - Debian packages (compiler, zlib/zstd/lz4 headers, clang for fuzzers) with apt
#   when they are missing and apt is usable.
# - When PYTHON is the project's .venv interpreter: create .venv and pip install
#   requirements-dev.txt (torch from PyPI brings its CUDA libraries: torch
#   imports them even on a machine without a GPU).
# - Any other PYTHON (e.g. python3 on a machine without a registry) is used as it is.
set -euo pipefail
PY=${1:-.venv/bin/python}
cd "$(dirname "$0")/.."

need_pkgs=()
have_hdr() { [ -e "/usr/include/$1" ] || [ -e ".deps/include/$1" ]; }
have_hdr zlib.h || need_pkgs+=(zlib1g-dev)
have_hdr zstd.h || need_pkgs+=(libzstd-dev)
have_hdr lz4.h  || need_pkgs+=(liblz4-dev)
have_hdr libdeflate.h || need_pkgs+=(libdeflate-dev)   # CPU inflate, 3.5x zlib (optional: zlib serves without it)
have_hdr turbojpeg.h || need_pkgs+=(libturbojpeg0-dev)  # JPEG decode on the CPU
have_hdr jpeglib.h || need_pkgs+=(libjpeg-dev)  # decoding only the part of a JPEG a crop needs
have_hdr spng.h || need_pkgs+=(libspng-dev)             # PNG decode on the CPU
have_hdr x86_64-linux-gnu/curl/curl.h || have_hdr curl/curl.h || need_pkgs+=(libcurl4-openssl-dev)  # remote objects
command -v nginx >/dev/null || need_pkgs+=(nginx-light)  # the remote-read tests' loopback HTTP server
command -v cc >/dev/null || need_pkgs+=(gcc)
command -v make >/dev/null || need_pkgs+=(make)
command -v clang >/dev/null || need_pkgs+=(clang)
if [ "$PY" = ".venv/bin/python" ] && ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    need_pkgs+=(python3-venv python3-dev)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "setup: apt-get install ${need_pkgs[*]}"
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
    else
        echo "setup: missing ${need_pkgs[*]} and cannot apt-get install them" >&2
        case " ${need_pkgs[*]} " in *" clang "*) ;; esac
    fi
fi

if [ "$PY" != ".venv/bin/python" ]; then
    "$PY" -c 'import numpy' || { echo "setup: $PY has no numpy" >&2; exit 1; }
    exit 0
fi

stamp=.venv/.ferry-setup
want="$(cat requirements-dev.txt requirements-nodeps.txt tools/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip setuptools wheel
.venv/bin/python -m pip install -q -r requirements-dev.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null
echo "$want" > "$stamp"
