#!/usr/bin/env bash
# The optional libraries ferry links where their headers are installed, one
# line each: HEADER DEFINE LIBRARY. The Makefile and setup.py both read this
# list, so `make` and `pip install .` build the same library.
#   libdeflate: zlib/gzip inflate 3.5x faster than zlib (BENCHMARKS.md)
#   libturbojpeg: JPEG decode on the CPU
#   libjpeg (libjpeg-turbo's libjpeg API): decoding only the part of a JPEG a crop needs
#   libspng: PNG decode on the CPU
#   libcurl: remote objects (https://, s3://, gs://)
cat <<'LIST'
libdeflate.h FERRY_HAVE_LIBDEFLATE deflate
turbojpeg.h FERRY_HAVE_TURBOJPEG turbojpeg
jpeglib.h FERRY_HAVE_LIBJPEG jpeg
spng.h FERRY_HAVE_SPNG spng
curl/curl.h FERRY_HAVE_CURL curl
LIST
