/* fuzz_refs.c — the kerchunk reference-set parser (format forced, so every
 * input reaches it): JSON, version 1 templates and gen, inline chunks (base64
 * and text) decoded through the engine, metadata through zarr.c's v2 parser.
 * File targets resolve against /proc/self/fd and are mostly absent: the plan
 * fails naming them, which the harness checks is said. */
#include "fuzz.h"

static int fuzz_refs(const uint8_t *data, size_t size) { return ferry_fuzz_dataset(data, size, "refs"); }
FERRY_FUZZ_TARGET(refs, fuzz_refs)
