#!/usr/bin/env bash
# records_env.sh — cold 1 MiB records of one 4.3 GB file (ferry bench --records, batches of 32, 6 in
# flight) into host and device batches under engine settings, against 16 threads of pread in each
# run: why the device path read 1.41 GB/s where the host path read 2.06 and pread 2.40 (12:44).
out=${OUT:-gpu-out}
for cfg in "" "FERRY_DIRECT=off" "FERRY_THREADS=32" "FERRY_STAGING_SIZE=4M" "FERRY_DIRECT=off FERRY_THREADS=32"; do
    echo "== ${cfg:-default} $(date -u +%H:%M:%S)"
    env $cfg timeout 100 ./build/ferry bench --records 1M --count 4000 --batch 32 --cold --depth 6 --reps 2 \
        --file "$PWD/ferry-records.bin" 2>&1 | grep -E "limit|batches|O_DIRECT" | grep -v "gathered"
done
rm -f "$PWD/ferry-records.bin"
