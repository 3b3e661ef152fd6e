/* nvjpeg_batch.h — nvJPEG's batched decode for ferry_image_batch: runs of
 * JPEGs decoded to interleaved RGB in device memory by one call, on the
 * hardware JPEG engine where the device has one and the image suits it, on
 * the CUDA backend otherwise. Internal.
 *
 * A batch object belongs to one call on one thread (nvJPEG's states are not
 * thread-safe); the library handles behind it are per device and kept for
 * the process (they are). Every function expects the device's context
 * current on the calling thread. */
#ifndef FERRY_CUDA_NVJPEG_BATCH_H
#define FERRY_CUDA_NVJPEG_BATCH_H
#include "cuda/nvjpeg.h"

typedef struct ferry_nvj_batch ferry_nvj_batch;

/* For device `dev`: 0, or FERRY_EUNSUPPORTED when the loaded nvJPEG lacks the
 * batched calls (or is not loaded), another code when a handle fails. */
int ferry_nvj_batch_open(int dev, ferry_nvj_batch **out);
/* Done with it (the device's idle one is kept for the next open; NULL: no-op). */
void ferry_nvj_batch_close(ferry_nvj_batch *b);
/* 1 when the device has the hardware backend. */
int ferry_nvj_batch_has_hw(const ferry_nvj_batch *b);
/* 1 when the hardware backend takes this JPEG (nvjpegDecodeBatchedSupported),
 * 0 when it does not or the stream does not parse (the CUDA backend then
 * sees it, and reports what is wrong with it). */
int ferry_nvj_batch_hw_ok(ferry_nvj_batch *b, const uint8_t *data, size_t n);
/* Decode k JPEGs into dst[j] (pitch[j] bytes a row, width x 3 used) on
 * `stream`, with the hardware backend when hw (the caller checked each with
 * ferry_nvj_batch_hw_ok). The hardware backend writes when the call is made,
 * not in stream order, so the stream is drained on the host first. 0, or a
 * code with a message naming the call: then none of the k is known good. */
int ferry_nvj_batch_decode(ferry_nvj_batch *b, int hw, const uint8_t *const *data, const size_t *len, int k,
                           const CUdeviceptr *dst, const size_t *pitch, CUstream stream);
#endif
