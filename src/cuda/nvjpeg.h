/* nvjpeg.h — the few nvJPEG types ferry's loader (nvjpeg.c) uses, declared
 * with nvJPEG's ABI (nvjpeg.h of the nvidia-nvjpeg wheel; checked against it
 * by tests/c/test_cuda_abi.c where it is installed). Nothing links nvJPEG.
 * Internal. */
#ifndef FERRY_NVJPEG_H
#define FERRY_NVJPEG_H
#include <stddef.h>
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
#endif
