/* fuzz_hdf5.c — the HDF5 / netCDF-4 parser (format forced, so every input
 * reaches it), then reads of every small variable through the engine. */
#include "fuzz.h"

static int fuzz_hdf5(const uint8_t *data, size_t size) { return ferry_fuzz_dataset(data, size, "hdf5"); }
FERRY_FUZZ_TARGET(hdf5, fuzz_hdf5)
