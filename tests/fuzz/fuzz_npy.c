/* fuzz_npy.c — the npy parser (format forced, so every input reaches it),
 * then reads of every small variable through the engine. */
#include "fuzz.h"

static int fuzz_npy(const uint8_t *data, size_t size) { return ferry_fuzz_dataset(data, size, "npy"); }
FERRY_FUZZ_TARGET(npy, fuzz_npy)
