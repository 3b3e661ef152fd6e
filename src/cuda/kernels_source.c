/* kernels_source.c — which GPU kernel image this build carries, so that
 * `ferry info` and ferry.stats() can say it: a build without nvcc embeds an
 * empty image and device-side steps (byteswapping big-endian data) then run
 * on the CPU, which is correct but slower and must not go unnoticed. */
#include "cuda/cuda.h"
#include <ferry.h>      /* the declaration, with its export attribute */

const char *ferry_kernels_source(void) {
    return ferry_kernels_fatbin_size > 0 ? "embedded fatbin" : "none";
}
