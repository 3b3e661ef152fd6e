#!/usr/bin/env bash
# cold_lookahead.sh — claims that announce the task FERRY_LOOKAHEAD claims later (default: the job's
# workers) against FERRY_LOOKAHEAD=0 (each task announces itself just before it reads, as before),
# alternated, one process each: cold 1 MiB records of one 4.3 GB file through `ferry bench --records
# --reread` (batches of 32 submitted with FERRY_REREAD, as the datasets submit; 6 in flight) beside 16
# threads of pread; then cold shuffled 1 MiB rows (8.6 GB of npy shards, batch 32) and 150,528-byte
# image rows (batch 256) through ArrayDataset beside the 16-worker DataLoader of the same process.
out=${OUT:-gpu-out}
for cfg in "FERRY_LOOKAHEAD=0" "" "FERRY_LOOKAHEAD=0" ""; do
    echo "== records ${cfg:-default} $(date -u +%H:%M:%S)"
    env $cfg timeout 90 ./build/ferry bench --records 1M --count 4000 --batch 32 --cold --depth 6 --reps 2 --reread \
        --file "$PWD/ferry-records.bin" 2>&1 | grep -E "limit|batches|O_DIRECT" | grep -v gathered
done
rm -f "$PWD/ferry-records.bin"
for kind in row image; do
    for cfg in "FERRY_LOOKAHEAD=0" "" "FERRY_LOOKAHEAD=0" ""; do
        [ "$kind" = image ] && [ -n "${SHORT:-}" ] && break
        echo "== $kind ${cfg:-default} $(date -u +%H:%M:%S)"
        env $cfg timeout 100 python3 bench/bench_torch.py --kinds $kind --gib 8 --cache cold --no-train \
            --workers 16 --seconds 6 > "$out/cold-$kind.tmp" 2>&1
        grep -E "cold  ferry|Error|error|!!" "$out/cold-$kind.tmp" | head -4
        grep -E "^$kind" "$out/cold-$kind.tmp" | head -12 >> "$out/cold-$kind-all.txt"
    done
done
