#!/usr/bin/env bash
# cold_rows.sh — issue 13's cold shuffled 1 MiB rows (0.82 x the best DataLoader at 01:48) under
# engine settings, one process per setting: does this virtio disk, fastest with few requests in
# flight (BENCHMARKS: O_DIRECT 1.83 GB/s with one thread, 1.50 with 16), read the rows faster with
# fewer workers, or without the WILLNEED hints that put every record of a task in flight at once?
# Each row: bench_torch.py's cold row loaders (ArrayDataset, the engine alone, DataLoader at 16).
# Run from the repository root on the GPU machine, after tools/gpu-run.sh wheels build.
out=${OUT:-gpu-out}
for cfg in "" "FERRY_READAHEAD=off" "FERRY_THREADS=8" "FERRY_READAHEAD=off FERRY_THREADS=4" \
           "FERRY_READAHEAD=off FERRY_THREADS=8" ""; do
    echo "== ${cfg:-default}"
    env $cfg timeout 100 python3 bench/bench_torch.py --kinds row --gib 8 --cache cold --seconds 4 --no-train \
        --workers 16 > "$out/cold-rows.tmp" 2>&1
    grep -E "^row |ferry|DataLoader|Error|error" "$out/cold-rows.tmp" | grep -v "^#" | head -8
done
