#!/usr/bin/env bash
# fuzz.sh — build every tests/fuzz/fuzz_*.c as a libFuzzer binary (clang,
# -fsanitize=fuzzer,address,undefined) and run each for a bounded time.
#   FUZZ_SECONDS=60   seconds per target          FUZZ_TARGETS="json npy"  a subset
#   FUZZ_JOBS=1       parallel fuzzing processes  FUZZ_CC=clang
# New inputs collect in build-fuzz/corpus/NAME (not committed); crashes are
# written to build-fuzz/crashes/ and make the script fail. Seeds come from
# tests/fuzz/corpus/NAME. Reproduce a crash with `build-fuzz/fuzz_NAME FILE`,
# then add the file to tests/fuzz/corpus/NAME/ as a regression input.
set -euo pipefail
cd "$(dirname "$0")/.."
CC=${FUZZ_CC:-clang}
SECS=${FUZZ_SECONDS:-60}
JOBS=${FUZZ_JOBS:-1}
OUT=build-fuzz
command -v "$CC" >/dev/null || { echo "fuzz: $CC not found (libFuzzer needs clang)"; exit 1; }
[ -f build/kernels_fatbin.c ] || make -s build/kernels_fatbin.c
[ -f build/kernels_cu.c ] || make -s build/kernels_cu.c   # nvrtc.c compiles its text
mkdir -p "$OUT/obj" "$OUT/crashes"
FLAGS=(-g -O1 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -I.deps/include -Itests/fuzz -pthread
       -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
LIBS=(-L.deps/lib -lzstd -llz4 -lz -ldl -lpthread -lm)
# the optional libraries the Makefile links where installed (tools/optional-libs.sh):
# without them the image decoders would only refuse
ma=/usr/include/$("$CC" -print-multiarch 2>/dev/null || true)
while read -r hdr def lib; do
    if [ -e "/usr/include/$hdr" ] || [ -e "$ma/$hdr" ] || [ -e ".deps/include/$hdr" ]; then
        FLAGS+=(-D"$def"); LIBS+=(-l"$lib")
    fi
done < <(tools/optional-libs.sh)

# the library, instrumented for coverage (rebuilt only when a source is newer)
objs=()
for src in src/base/*.c src/engine/*.c src/cuda/*.c src/formats/*.c src/formats/hdf5/*.c src/codecs/*.c src/sources/*.c build/kernels_fatbin.c build/kernels_cu.c; do
    o="$OUT/obj/$(echo "$src" | tr / _).o"
    objs+=("$o")
    if [ ! -f "$o" ] || [ "$src" -nt "$o" ] || [ include/ferry.h -nt "$o" ]; then
        echo "$CC -fsanitize=fuzzer-no-link $src"
        "$CC" "${FLAGS[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$o" &
        while [ "$(jobs -r | wc -l)" -ge "$(nproc)" ]; do sleep 0.1; done
    fi
done
wait
rm -f "$OUT/libferry-fuzz.a"
ar rcs "$OUT/libferry-fuzz.a" "${objs[@]}"

status=0
for src in tests/fuzz/fuzz_*.c; do
    name=$(basename "$src" .c); name=${name#fuzz_}
    if [ -n "${FUZZ_TARGETS:-}" ] && ! grep -qw "$name" <<<"$FUZZ_TARGETS"; then continue; fi
    "$CC" "${FLAGS[@]}" -fsanitize=fuzzer -DFERRY_LIBFUZZER "$src" "$OUT/libferry-fuzz.a" "${LIBS[@]}" -o "$OUT/fuzz_$name"
    mkdir -p "$OUT/corpus/$name" "tests/fuzz/corpus/$name"
    echo "fuzz: $name for ${SECS}s"
    if ! ASAN_OPTIONS=detect_leaks=1 "$OUT/fuzz_$name" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
            -jobs="$JOBS" -workers="$JOBS" -print_final_stats=1 -artifact_prefix="$OUT/crashes/$name-" \
            "$OUT/corpus/$name" "tests/fuzz/corpus/$name" >"$OUT/$name.log" 2>&1; then
        echo "fuzz: $name FAILED (see $OUT/$name.log and $OUT/crashes/)"
        tail -n 30 "$OUT/$name.log"
        status=1
    else
        grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$OUT/$name.log" | sed "s/^/  $name /" || true
    fi
done
exit $status
