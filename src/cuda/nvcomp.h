/* nvcomp.h — nvCOMP's batched C API (libnvcomp.so.6 / .so.5) through dlopen.
 * Only what ferry uses: the batched decompressors of zstd, LZ4 and Deflate.
 * Declared here with nvCOMP's ABI (checked against the wheel's headers by
 * tests/c/test_cuda_abi.c); nothing links nvCOMP. Internal.
 *
 * Versions. nvCOMP 5 changed the batched API: every decompressor takes an
 * options struct by value (64 bytes: a backend enum, then reserved bytes) and
 * GetTempSizeAsync gained max_total_uncompressed_bytes. 4.x and earlier use
 * other signatures: ferry refuses them by version (nvcompGetProperties) rather
 * than call them with the wrong arguments. 6.0 renamed the temp-size query:
 * 5.x's GetTempSizeAsync(n, max, opts, &temp, total) became
 * GetTempSize(n, max, opts, &temp, total, stream) — one more argument, found
 * by test_cuda_abi against the 6.0 wheel's headers (the release notes did
 * not say). Both are looked up and ferry_nvcomp_temp_size calls the
 * one the library has. The other batched signatures are unchanged; the
 * version check accepts majors 5 and 6 only, so a later break is refused,
 * not miscalled. */
#ifndef FERRY_NVCOMP_H
#define FERRY_NVCOMP_H
#include <stddef.h>
#include <stdint.h>
#include "cuda/cuda.h"

typedef int ferry_nvcomp_status_t;   /* nvcompStatus_t */
enum {
    FERRY_NVCOMP_SUCCESS = 0,
    FERRY_NVCOMP_INVALID_VALUE = 10,
    FERRY_NVCOMP_NOT_SUPPORTED = 11,
    FERRY_NVCOMP_CANNOT_DECOMPRESS = 12,
    FERRY_NVCOMP_BAD_CHECKSUM = 13,
    FERRY_NVCOMP_OUTPUT_TOO_SMALL = 15,
    FERRY_NVCOMP_ALIGNMENT = 17,
    FERRY_NVCOMP_CHUNK_TOO_LARGE = 18,
    FERRY_NVCOMP_WRONG_INPUT_LENGTH = 20,
    FERRY_NVCOMP_CUDA_ERROR = 1000,
    FERRY_NVCOMP_INTERNAL = 10000
};

/* nvcompBatched{Zstd,LZ4,Deflate}DecompressOpts_t: all three are 64 bytes
 * whose first int is the backend (0 = default); zero is the default for
 * every field ferry leaves alone (LZ4: data type char, no bitshuffle). */
typedef struct ferry_nvcomp_opts { int backend; char reserved[60]; } ferry_nvcomp_opts;

typedef struct ferry_nvcomp_props { uint32_t version; uint32_t cudart_version; } ferry_nvcomp_props;
typedef struct ferry_nvcomp_align { size_t input, output, temp; } ferry_nvcomp_align;

typedef ferry_nvcomp_status_t (*ferry_nvcomp_temp_fn)(size_t num_chunks, size_t max_uncompressed_chunk_bytes,
                                                       ferry_nvcomp_opts opts, size_t *temp_bytes,
                                                       size_t max_total_uncompressed_bytes);
typedef ferry_nvcomp_status_t (*ferry_nvcomp_temp6_fn)(size_t num_chunks, size_t max_uncompressed_chunk_bytes,
                                                        ferry_nvcomp_opts opts, size_t *temp_bytes,
                                                        size_t max_total_uncompressed_bytes, CUstream stream);
typedef ferry_nvcomp_status_t (*ferry_nvcomp_decompress_fn)(
    const void *const *d_in_ptrs, const size_t *d_in_bytes, const size_t *d_out_buffer_bytes,
    size_t *d_out_actual_bytes, size_t num_chunks, void *d_temp, size_t temp_bytes, void *const *d_out_ptrs,
    ferry_nvcomp_opts opts, ferry_nvcomp_status_t *d_statuses, CUstream stream);
typedef ferry_nvcomp_status_t (*ferry_nvcomp_size_fn)(const void *const *d_in_ptrs, const size_t *d_in_bytes,
                                                       size_t *d_out_bytes, size_t num_chunks, CUstream stream);
typedef ferry_nvcomp_status_t (*ferry_nvcomp_align_fn)(ferry_nvcomp_opts opts, ferry_nvcomp_align *out);

/* The algorithms ferry decodes on the GPU, indexing ferry_nvcomp_api.alg. */
typedef enum ferry_nvcomp_alg { FERRY_NVCOMP_ZSTD = 0, FERRY_NVCOMP_LZ4 = 1, FERRY_NVCOMP_DEFLATE = 2,
                                FERRY_NVCOMP_NALG = 3 } ferry_nvcomp_alg;

typedef struct ferry_nvcomp_alg_api {
    ferry_nvcomp_temp_fn GetTempSizeAsync;      /* 5.x: nvcompBatchedXDecompressGetTempSizeAsync */
    ferry_nvcomp_temp6_fn GetTempSize;          /* 6.x: nvcompBatchedXDecompressGetTempSize (+ stream) */
    ferry_nvcomp_decompress_fn DecompressAsync; /* nvcompBatchedXDecompressAsync */
    ferry_nvcomp_size_fn GetDecompressSizeAsync;/* nvcompBatchedXGetDecompressSizeAsync (optional) */
    ferry_nvcomp_align_fn GetRequiredAlignments;/* nvcompBatchedXDecompressGetRequiredAlignments (optional) */
    ferry_nvcomp_align align;                   /* what it requires (defaults from the 5.x headers) */
} ferry_nvcomp_alg_api;

typedef struct ferry_nvcomp_api {
    ferry_nvcomp_alg_api alg[FERRY_NVCOMP_NALG];
    ferry_nvcomp_status_t (*GetProperties)(ferry_nvcomp_props *);
    const char *(*GetStatusString)(ferry_nvcomp_status_t);   /* optional */
    int major, minor, patch;
    char path[512];                             /* the file that was loaded */
} ferry_nvcomp_api;

/* Temp bytes for a batch of `a` (whichever query the loaded library has). */
ferry_nvcomp_status_t ferry_nvcomp_temp_size(const ferry_nvcomp_api *nv, int a, size_t num_chunks,
                                             size_t max_uncompressed_chunk_bytes, ferry_nvcomp_opts opts,
                                             size_t *temp_bytes, size_t max_total_uncompressed_bytes, CUstream stream);

/* Load nvCOMP once (thread-safe): FERRY_NVCOMP (a file, or "off"), then the
 * directory set by ferry_nvcomp_set_dir (the Python layer hands it the wheel's
 * lib64), then the loader's own search (LD_LIBRARY_PATH, system paths);
 * libnvcomp.so.6 before libnvcomp.so.5 in each. NULL with *why set (static
 * text) when it cannot be used. CUDA must be loadable too. */
const ferry_nvcomp_api *ferry_nvcomp_load(const char **why);
/* A directory to look in before the system paths; only effective before the
 * first ferry_nvcomp_load. Copies the string. */
void ferry_nvcomp_set_dir(const char *dir);
/* "loaded nvCOMP 5.3.0 from /path/libnvcomp.so.5", or why it is not loaded. */
const char *ferry_nvcomp_describe(void);
/* Text of an nvcompStatus_t. */
const char *ferry_nvcomp_errstr(ferry_nvcomp_status_t s);
#endif
