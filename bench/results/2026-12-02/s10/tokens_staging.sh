#!/usr/bin/env bash
# tokens_staging.sh — issue 13's 8 KiB token windows under smaller staging buffers, one process per
# setting (the settings are read when a context is made). The question: does a worker's ring of
# staging buffers (3 x 2 MiB by default, 96 MiB over 16 workers) cost the preads their
# destination's cache, as a 2-core experiment suggests (a pread of 8 KiB into a 96 MiB ring per
# thread read 20 % slower than into a ring of 6 MiB or less)? Each row: bench_torch.py's token
# rows (TokenDataset, the engine alone, the pread limit before/after).
# Run from the repository root on the GPU machine, after tools/gpu-run.sh wheels build.
out=${OUT:-gpu-out}
for cfg in "" "FERRY_STAGING_SIZE=256K" "FERRY_STAGING_SIZE=512K" "FERRY_STAGING_SIZE=1M" \
           "FERRY_STAGING_SIZE=256K FERRY_STAGING_COUNT=6" ""; do
    echo "== ${cfg:-default}"
    env $cfg timeout 80 python3 bench/bench_torch.py --kinds tokens --token-gib 4 --seconds 3 --no-train \
        > "$out/tokens-staging.tmp" 2>&1
    grep -E "^tokens:|engine alone|TokenDataset|Error|error" "$out/tokens-staging.tmp" | grep -v "^#" | head -8
done
