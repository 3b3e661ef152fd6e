/* nvjpeg.h — the few nvJPEG types ferry's loader (nvjpeg.c) uses, declared
 * with nvJPEG's ABI (nvjpeg.h of the nvidia-nvjpeg wheel; checked against it
 * by tests/c/test_cuda_abi.c where it is installed). Nothing links nvJPEG.
 * Internal. */
#ifndef FERRY_NVJPEG_H
#define FERRY_NVJPEG_H
#include <stddef.h>
#include <stdint.h>
#include "cuda/cuda.h"

typedef int nvj_status;   /* nvjpegStatus_t, an enum: an int */
enum { NVJ_OK = 0, NVJ_NOT_INIT = 1, NVJ_INVALID = 2, NVJ_BAD_JPEG = 3, NVJ_NOT_SUPPORTED = 4, NVJ_ALLOC = 5,
       NVJ_EXEC = 6, NVJ_ARCH = 7, NVJ_INTERNAL = 8, NVJ_IMPL = 9, NVJ_INCOMPLETE = 10 };
enum { NVJ_OUTPUT_RGBI = 5 };                     /* nvjpegOutputFormat_t: interleaved RGB in channel[0] */
enum { NVJ_PROP_MAJOR = 0, NVJ_PROP_MINOR = 1 };   /* libraryPropertyType: MAJOR_VERSION, MINOR_VERSION */
#define NVJ_MAX_COMPONENT 4
typedef struct nvj_image { unsigned char *channel[NVJ_MAX_COMPONENT]; size_t pitch[NVJ_MAX_COMPONENT]; } nvj_image;
typedef void *nvj_handle;     /* nvjpegHandle_t */
typedef void *nvj_state;      /* nvjpegJpegState_t */
typedef void *nvj_stream;     /* nvjpegJpegStream_t */
enum { NVJ_BACKEND_DEFAULT = 0, NVJ_BACKEND_HARDWARE = 3 };   /* nvjpegBackend_t */

/* The loaded library: the single-image calls, and the batched ones where the
 * library has them (NULL otherwise: ferry_image_batch then decodes on the CPU). */
typedef struct nvj_api {
    nvj_status (*CreateSimple)(nvj_handle *);
    nvj_status (*Destroy)(nvj_handle);
    nvj_status (*JpegStateCreate)(nvj_handle, nvj_state *);
    nvj_status (*JpegStateDestroy)(nvj_state);
    nvj_status (*Decode)(nvj_handle, nvj_state, const unsigned char *, size_t, int, nvj_image *, CUstream);
    nvj_status (*GetProperty)(int, int *);   /* optional */
    /* batched (optional, all or none) */
    nvj_status (*CreateEx)(int backend, void *dev_allocator, void *pinned_allocator, unsigned flags, nvj_handle *);
    nvj_status (*DecodeBatchedInitialize)(nvj_handle, nvj_state, int batch_size, int max_cpu_threads, int fmt);
    nvj_status (*DecodeBatched)(nvj_handle, nvj_state, const unsigned char *const *data, const size_t *lengths,
                                nvj_image *destinations, CUstream);
    nvj_status (*JpegStreamCreate)(nvj_handle, nvj_stream *);
    nvj_status (*JpegStreamDestroy)(nvj_stream);
    nvj_status (*JpegStreamParse)(nvj_handle, const unsigned char *, size_t, int save_metadata, int save_stream,
                                  nvj_stream);
    nvj_status (*DecodeBatchedSupported)(nvj_handle, nvj_stream, int *is_supported);   /* 0: supported */
    int batched;   /* 1 when all the batched calls are there */
    int major, minor;
    char path[512];
} nvj_api;

/* The library (loaded once; NULL with ferry_nvjpeg_status saying why). */
const nvj_api *ferry_nvjpeg_api(void);
/* ferry_seterr for a failed nvJPEG call: FERRY_ECODEC for bad or incomplete
 * data, FERRY_EUNSUPPORTED, FERRY_ENOMEM, else FERRY_ECUDA; the message names
 * the call and the status. */
int ferry_nvjpeg_err(nvj_status s, const char *call);
/* 1 when FF D9 follows the first scan's start (nvjpeg.c says why that finds
 * a truncated JPEG). */
int ferry_nvjpeg_has_eoi(const uint8_t *p, size_t n);
#endif
