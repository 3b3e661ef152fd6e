#!/usr/bin/env bash
# embed.sh NAME FILE: print a C file defining `const unsigned char NAME[]` and NAME_size.
set -euo pipefail
name=$1 file=$2
echo "/* generated from $file by tools/embed.sh */"
echo "#include <stddef.h>"
echo "const unsigned char ${name}[] __attribute__((aligned(64))) = {"
od -An -v -tx1 "$file" | sed -e 's/ *\([0-9a-f][0-9a-f]\)/0x\1,/g'
echo "0x00 };"
echo "const size_t ${name}_size = $(stat -c %s "$file");"
