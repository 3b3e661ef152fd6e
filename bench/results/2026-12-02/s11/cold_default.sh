#!/usr/bin/env bash
# cold_default.sh — after FERRY_READAROUND became the default (4M windows for ranges under 1M in a
# batch's job): cold shuffled 1 MiB rows and 150 KB images, the default against FERRY_READAROUND=0,
# one process each, with the 16-worker DataLoader of its own run.
out=${OUT:-gpu-out}
for cfg in "" "FERRY_READAROUND=0"; do
    echo "== ${cfg:-default}"
    env $cfg timeout 120 python3 bench/bench_torch.py --kinds row,image --gib 8 --cache cold --no-train \
        --workers 16 > "$out/cold-def.tmp" 2>&1
    grep -E "cold  ferry|Error|error" "$out/cold-def.tmp" | head -4
done
