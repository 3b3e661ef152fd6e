#!/usr/bin/env bash
# Run C test binaries; each prints "N passed, N failed" last. Sum them.
set -u
p=0; f=0; bad=0
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n1)
    if [ $rc -ne 0 ] || [ -z "$line" ]; then
        printf '%s\n' "$out" | tail -n 40
        echo "FAILED: $t (exit $rc)"; bad=1
    fi
    if [ -n "$line" ]; then
        p=$((p + $(echo "$line" | cut -d' ' -f1))); f=$((f + $(echo "$line" | cut -d' ' -f3)))
    else f=$((f + 1)); fi
    echo "  $(basename "$t"): ${line:-no summary}"
done
echo "c tests: $p passed, $f failed"
exit $bad
