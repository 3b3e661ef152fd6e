#!/usr/bin/env bash
# check-exports.sh LIB HEADER... — libferry.so exports exactly the functions the
# public headers declare: nothing internal leaks, nothing public is missing.
set -euo pipefail
lib=$1
shift
header="$*"
cc=${CC:-cc}
# declared: every ferry_* called like a function in the preprocessed header,
# less static inline helpers and typedef'd function pointer types
declared=$(for h in "$@"; do "$cc" -E -P -Iinclude "$h"; done | tr '\n' ' ' | sed 's/;/;\n/g; s/}/}\n/g' |
    grep -v 'static inline' | grep -v 'typedef' | grep -oE '\bferry_[a-z0-9_]+ *\(' | tr -d ' (' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 != "A" {print $3}' | sed 's/@.*//' | sort -u)
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
if [ -n "$extra$missing" ]; then
    [ -n "$extra" ] && echo "  $lib exports names $header does not declare:" $extra
    [ -n "$missing" ] && echo "  $lib does not export names $header declares:" $missing
    echo "  exports: 1 failed"
    exit 1
fi
echo "  exports: $(echo "$exported" | wc -l) symbols, all declared in $header"
