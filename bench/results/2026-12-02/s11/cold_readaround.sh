#!/usr/bin/env bash
# cold_readaround.sh — issue 13's cold shuffled rows (1 MiB rows, 150 KB images; page cache dropped
# before each loader) with the cold hints as the records' own bytes (the default) and widened to
# aligned read-around windows (FERRY_READAROUND=1M, 4M), alternated, one process per row, each
# with the 16-worker DataLoader peer of its own run. Run from the repository root on the GPU
# machine after tools/gpu-run.sh wheels build.
out=${OUT:-gpu-out}
cat /sys/block/*/queue/read_ahead_kb 2>/dev/null | head -3 | sed 's/^/read_ahead_kb /'
for cfg in "" "FERRY_READAROUND=1M" "FERRY_READAROUND=4M" "" "FERRY_READAROUND=4M"; do
    echo "== ${cfg:-default}"
    env $cfg timeout 150 python3 bench/bench_torch.py --kinds row,image --gib 8 --cache cold --no-train \
        --workers 16 > "$out/cold-ra.tmp" 2>&1
    grep -E "cold  ferry|Error|error" "$out/cold-ra.tmp" | head -4
done
