/* fuzz_netcdf.c — the netcdf parser (format forced, so every input reaches it),
 * then reads of every small variable through the engine. */
#include "fuzz.h"

static int fuzz_netcdf(const uint8_t *data, size_t size) { return ferry_fuzz_dataset(data, size, "netcdf3"); }
FERRY_FUZZ_TARGET(netcdf, fuzz_netcdf)
