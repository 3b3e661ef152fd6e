/* fuzz_safetensors.c — the safetensors parser (format forced, so every input reaches it),
 * then reads of every small variable through the engine. */
#include "fuzz.h"

static int fuzz_safetensors(const uint8_t *data, size_t size) { return ferry_fuzz_dataset(data, size, "safetensors"); }
FERRY_FUZZ_TARGET(safetensors, fuzz_safetensors)
