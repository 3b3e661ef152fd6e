#!/usr/bin/env bash
# Small-read latency into host memory (page cache warm), ferry_pread against a plain pread of
# other random offsets of the same file, at HEAD and at the round's start (3a9c431^), alternated.
# Usage (from the repository root, after `make lib`): bash bench/results/2026-12-02/s14/host_latency.sh [REPS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../../../.." && pwd); t=$(mktemp -d)
git clone -q "$root" "$t/old" && git -C "$t/old" checkout -q 3a9c431^ && make -C "$t/old" -s -j2 lib >/dev/null 2>&1
libs="-lzstd -llz4 -lz -ldl -lpthread -lm"
cc -O2 -I"$t/old/include" -o "$t/lat_old" "$here/host_latency.c" "$t/old/build/libferry.a" $libs
cc -O2 -I"$root/include" -o "$t/lat_new" "$here/host_latency.c" "$root/build/libferry.a" $libs -ldeflate
head -c $((256 << 20)) /dev/urandom > "$t/f.bin"; cat "$t/f.bin" > /dev/null
for r in $(seq 1 "${1:-6}"); do
    echo "== round start (3a9c431^), rep $r"; "$t/lat_old" "$t/f.bin"
    echo "== HEAD ($(git -C "$root" rev-parse --short HEAD)), rep $r"; "$t/lat_new" "$t/f.bin"
done
rm -rf "$t"
