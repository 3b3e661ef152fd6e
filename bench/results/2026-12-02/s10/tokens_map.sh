#!/usr/bin/env bash
# tokens_map.sh — issue 13's 8 KiB token windows with warm small records copied from their file's
# mapping (FERRY_MAP_MAX=64K, the default since this session) and without (FERRY_MAP_MAX=0: one
# pread each, as before), alternated, one process per row (the setting is read when a context is
# made); then `ferry bench --records` both ways. Run from the repository root on the GPU machine,
# after tools/gpu-run.sh wheels build.
out=${OUT:-gpu-out}
for cfg in "FERRY_MAP_MAX=0" "" "FERRY_MAP_MAX=0" ""; do
    echo "== ${cfg:-default}"
    env $cfg timeout 80 python3 bench/bench_torch.py --kinds tokens --token-gib 4 --seconds 3 --no-train \
        > "$out/tokens-map.tmp" 2>&1
    grep -E "^tokens:|engine alone|TokenDataset|Error|error" "$out/tokens-map.tmp" | grep -v "^#" | head -8
done
for cfg in "FERRY_MAP_MAX=0" "" "FERRY_MAP_MAX=256K"; do
    echo "== ferry bench --records, ${cfg:-default}"
    env $cfg timeout 100 ./build/ferry bench --records 8192,150528 --count 100000 --batch 256 --size 8G \
        --file "$PWD/ferry-records.bin" --reps 2 2>&1 | grep -E "limit|ferry ->|H2D" | head -14
done
