/* kernels_source.c — which GPU kernel image the library loads, decided here
 * once: the nvcc fatbin embedded at build time, else the kernels compiled at
 * run time by NVRTC (nvrtc.c), else none: device-side steps (byteswapping
 * big-endian data) then run on the CPU, correct but slower, and `ferry info`
 * and ferry.stats() say so. FERRY_KERNELS=nvrtc|none overrides the choice
 * (tests of the NVRTC path on a build that has a fatbin; bisecting). */
#include "ferry.h"      /* the declarations, with their export attribute */
#include "cuda/cuda.h"
#include <stdlib.h>
#include <string.h>

typedef enum { K_FATBIN, K_NVRTC, K_NONE } kernels_choice;

static kernels_choice choice(void) {
    const char *e = getenv("FERRY_KERNELS");
    if (e && !strcmp(e, "none")) return K_NONE;
    if (e && !strcmp(e, "nvrtc")) return ferry_nvrtc_ptx() ? K_NVRTC : K_NONE;
    if (ferry_kernels_fatbin_size > 0) return K_FATBIN;
    return ferry_nvrtc_ptx() ? K_NVRTC : K_NONE;
}

const void *ferry_kernels_image(void) {
    switch (choice()) {
    case K_FATBIN: return ferry_kernels_fatbin;
    case K_NVRTC: return ferry_nvrtc_ptx();
    default: return NULL;
    }
}

const char *ferry_kernels_source(void) {
    static const char *const names[] = {"embedded fatbin", "NVRTC", "none"};
    return names[choice()];
}

const char *ferry_kernels_status(void) {
    const char *e = getenv("FERRY_KERNELS");
    if (choice() != K_NONE) return "";
    if (e && !strcmp(e, "none")) return "FERRY_KERNELS=none";
    return ferry_nvrtc_status();
}
