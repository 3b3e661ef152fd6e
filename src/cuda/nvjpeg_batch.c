/* nvjpeg_batch.c — nvjpegDecodeBatched for ferry_image_batch (nvjpeg_batch.h
 * says what). Two handles per device, made once with the device's context
 * current and kept for the process: the default backend (CUDA, with the
 * Huffman decode on the host where nvJPEG chooses) and the hardware backend,
 * which nvjpegCreateEx refuses on devices without a JPEG engine (remembered:
 * not asked again). Each batch object holds its own state per backend,
 * initialised (nvjpegDecodeBatchedInitialize) when the batch size changes and
 * after a failed call (which is how a failed state is reset). A closed batch
 * object is kept, one per device, for the next call: states grow their
 * device and pinned buffers on first use, and making them per call would
 * allocate (and free, which waits for the device) every time. */
#include "cuda/nvjpeg_batch.h"
#include "common.h"
#include "ferry_experimental.h"
#include <pthread.h>
#include <stdlib.h>

#define NVJ_BATCH_DEVICES 64
static pthread_mutex_t lock_ = PTHREAD_MUTEX_INITIALIZER;
static nvj_handle def_[NVJ_BATCH_DEVICES], hw_[NVJ_BATCH_DEVICES];
static int hw_tried_[NVJ_BATCH_DEVICES];
static struct ferry_nvj_batch *kept_[NVJ_BATCH_DEVICES];   /* one idle batch object per device */

struct ferry_nvj_batch {
    const nvj_api *nv;
    int dev;
    nvj_handle def, hw;       /* hw NULL: no hardware backend on this device */
    nvj_state def_state, hw_state;
    int def_size, hw_size;    /* the batch size each state was initialised for; 0: initialise */
    nvj_stream parsed;        /* for nvjpegDecodeBatchedSupported */
};

static void batch_destroy(ferry_nvj_batch *b);

int ferry_nvj_batch_open(int dev, ferry_nvj_batch **out) {
    *out = NULL;
    const nvj_api *nv = ferry_nvjpeg_api();
    if (!nv) return ferry_seterr(FERRY_EUNSUPPORTED, "nvjpeg: %s", ferry_nvjpeg_status());
    if (!nv->batched) return ferry_seterr(FERRY_EUNSUPPORTED, "nvjpeg: %s lacks the batched decode calls", nv->path);
    if (dev < 0 || dev >= NVJ_BATCH_DEVICES) return ferry_seterr(FERRY_EINVAL, "nvjpeg: device %d", dev);
    pthread_mutex_lock(&lock_);
    if (kept_[dev]) {   /* the states of an earlier call, their buffers already grown */
        *out = kept_[dev];
        kept_[dev] = NULL;
        pthread_mutex_unlock(&lock_);
        return 0;
    }
    nvj_status s = def_[dev] ? NVJ_OK : nv->CreateEx(NVJ_BACKEND_DEFAULT, NULL, NULL, 0, &def_[dev]);
    if (s == NVJ_OK && !hw_tried_[dev]) {
        hw_tried_[dev] = 1;
        if (nv->CreateEx(NVJ_BACKEND_HARDWARE, NULL, NULL, 0, &hw_[dev]) != NVJ_OK) hw_[dev] = NULL;
    }
    nvj_handle def = def_[dev], hw = hw_[dev];
    pthread_mutex_unlock(&lock_);
    if (s != NVJ_OK) return ferry_nvjpeg_err(s, "nvjpegCreateEx(default backend)");
    ferry_nvj_batch *b = calloc(1, sizeof *b);
    if (!b) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    b->nv = nv;
    b->dev = dev;
    b->def = def;
    b->hw = hw;
    if ((s = nv->JpegStateCreate(def, &b->def_state)) != NVJ_OK) {
        b->def_state = NULL;
        batch_destroy(b);
        return ferry_nvjpeg_err(s, "nvjpegJpegStateCreate");
    }
    if (hw && (nv->JpegStateCreate(hw, &b->hw_state) != NVJ_OK || nv->JpegStreamCreate(hw, &b->parsed) != NVJ_OK)) {
        /* the engine is there but will not give a state: the CUDA backend decodes all */
        if (b->hw_state) nv->JpegStateDestroy(b->hw_state);
        b->hw_state = NULL;
        b->parsed = NULL;
        b->hw = NULL;
    }
    *out = b;
    return 0;
}

static void batch_destroy(ferry_nvj_batch *b) {
    if (b->parsed) b->nv->JpegStreamDestroy(b->parsed);
    if (b->hw_state) b->nv->JpegStateDestroy(b->hw_state);
    if (b->def_state) b->nv->JpegStateDestroy(b->def_state);
    free(b);
}

void ferry_nvj_batch_close(ferry_nvj_batch *b) {
    if (!b) return;
    pthread_mutex_lock(&lock_);
    if (!kept_[b->dev]) {
        kept_[b->dev] = b;
        b = NULL;
    }
    pthread_mutex_unlock(&lock_);
    if (b) batch_destroy(b);
}

int ferry_nvj_batch_has_hw(const ferry_nvj_batch *b) { return b && b->hw != NULL; }

int ferry_nvj_batch_hw_ok(ferry_nvj_batch *b, const uint8_t *data, size_t n) {
    if (!b->hw) return 0;
    /* headers only (save_stream 0): the scan is not copied */
    if (b->nv->JpegStreamParse(b->hw, data, n, 0, 0, b->parsed) != NVJ_OK) return 0;
    int unsupported = 1;
    if (b->nv->DecodeBatchedSupported(b->hw, b->parsed, &unsupported) != NVJ_OK) return 0;
    return unsupported == 0;
}

int ferry_nvj_batch_decode(ferry_nvj_batch *b, int hw, const uint8_t *const *data, const size_t *len, int k,
                           const CUdeviceptr *dst, const size_t *pitch, CUstream stream) {
    if (k <= 0) return 0;
    if (hw && !b->hw) return ferry_seterr(FERRY_EINVAL, "nvjpeg: no hardware backend on device %d", b->dev);
    nvj_image *img = calloc((size_t)k, sizeof *img);
    if (!img) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    for (int j = 0; j < k; j++) {
        img[j].channel[0] = (unsigned char *)(uintptr_t)dst[j];
        img[j].pitch[0] = pitch[j];
    }
    nvj_handle h = hw ? b->hw : b->def;
    nvj_state st = hw ? b->hw_state : b->def_state;
    int rc = 0;
    if (hw) {
        /* the engine's writes are not ordered after the stream's earlier work: a caller gives
         * the hardware group a stream of its own (idle here, so this costs nothing) */
        const ferry_cuda_api *cu = ferry_cuda_load(NULL);
        CUresult r = cu ? cu->StreamSynchronize(stream) : 1;
        if (r != 0) rc = ferry_seterr(FERRY_ECUDA, "nvjpeg: waiting for the stream: %s", ferry_cuda_errstr(r));
    }
    nvj_status s = NVJ_OK;
    int *size = hw ? &b->hw_size : &b->def_size;
    if (rc == 0 && *size != k) {
        *size = 0;
        if ((s = b->nv->DecodeBatchedInitialize(h, st, k, 1, NVJ_OUTPUT_RGBI)) != NVJ_OK)
            rc = ferry_nvjpeg_err(s, "nvjpegDecodeBatchedInitialize");
        else *size = k;
    }
    if (rc == 0 && (s = b->nv->DecodeBatched(h, st, (const unsigned char *const *)data, len, img, stream)) != NVJ_OK) {
        rc = ferry_nvjpeg_err(s, hw ? "nvjpegDecodeBatched (hardware backend)" : "nvjpegDecodeBatched");
        *size = 0;   /* initialised again before its next call */
    }
    free(img);
    return rc;
}
