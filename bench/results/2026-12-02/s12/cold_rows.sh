#!/usr/bin/env bash
# cold_rows.sh — the disk's own cold rate (ferry bench, O_DIRECT and buffered, 4 GiB) and the engine
# on cold 1 MiB / 150 KB records against 16 threads of pread; then cold shuffled 1 MiB rows (8.6 GB of
# npy shards, batch 32), each loader run once more right after its cold run without dropping the page
# cache (--again: the next epoch of data that fits in memory): the default (FERRY_REREAD: the dataset's
# cold 1 MiB rows read through the page cache, announced) against FERRY_DIRECT=on (O_DIRECT, as AUTO
# read them before), alternated, one process each, with the 16-worker DataLoader of its own run.
out=${OUT:-gpu-out}
timeout 120 ./build/ferry bench --size 4G --reps 1 --no-latency --file "$PWD/ferry-bench.bin" > "$out/disk.tmp" 2>&1
echo "ferry bench exit $?"; grep -E "O_DIRECT|cold|buffered" "$out/disk.tmp" | head -12; rm -f "$PWD/ferry-bench.bin"
timeout 150 ./build/ferry bench --records 1M,150528 --count 4000 --batch 32 --cold --depth 6 --reps 2 \
    --file "$PWD/ferry-records.bin" 2>&1 | grep -vE "^$"; rm -f "$PWD/ferry-records.bin"
for cfg in "" "FERRY_DIRECT=on" "" "FERRY_DIRECT=on"; do
    echo "== ${cfg:-default} $(date -u +%H:%M:%S)"
    env $cfg timeout 110 python3 bench/bench_torch.py --kinds row --gib 8 --cache cold --again --no-train \
        --workers 16 --seconds 6 > "$out/cold-rows.tmp" 2>&1
    grep -E "cold  ferry|again ferry|Error|error|!!" "$out/cold-rows.tmp" | head -6
    grep -E "^row" "$out/cold-rows.tmp" | head -12 >> "$out/cold-rows-all.txt"
done
