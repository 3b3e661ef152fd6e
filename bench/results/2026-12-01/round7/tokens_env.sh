#!/usr/bin/env bash
# tokens_env.sh — TokenDataset ("base") and the engine alone on its plans ("eng6": 6 reads in
# flight) under engine settings, one process per setting (the settings are read when a context is
# made), 4 s a row. An experiment for issue 13's 8 KiB windows (0.61 x the pread limit): does the
# engine's thread count against the 16 cores (the dataset adds a consumer, a loader and a planner
# thread), the gathered copy, the idle workers' spin or the event waits move it?
# Run from the repository root on the GPU machine, after tools/gpu-run.sh wheels build.
# round6's script; its own sys.path entries assume an exp/ folder, so bench/ and python/ come from
# PYTHONPATH (the 23:56 and 00:03 runs used a copy of it with those two paths set for this folder)
exp=bench/results/2026-12-01/round6/tokens_exp.py
export PYTHONPATH=$PWD/bench:$PWD/python${PYTHONPATH:+:$PYTHONPATH}
for cfg in "" "FERRY_THREADS=12" "FERRY_THREADS=14" "FERRY_THREADS=20" "FERRY_GATHER=off" \
           "FERRY_SPIN_US=50" "FERRY_EVENT_SYNC=blocking" ""; do
    echo "== ${cfg:-default}"
    env $cfg timeout 60 python3 "$exp" --token-gib 4 --seconds 4 --only base,eng6 2>&1 | grep -E "ROW|Error|error"
done
