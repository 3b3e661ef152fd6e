/* nvjpeg_batch.c — nvjpegDecodeBatched for ferry_image_batch (nvjpeg_batch.h
 * says what). Two handles per device, made once with the device's context
 * current and kept for the process: the default backend (CUDA, with the
 * Huffman decode on the host where nvJPEG chooses) and the hardware backend,
 * which nvjpegCreateEx refuses on devices without a JPEG engine (remembered:
 * not asked again). Each batch object holds, per backend, up to NVJ_STATES
 * states, each initialised (nvjpegDecodeBatchedInitialize) for one batch
 * size: a call of a size none has takes the least recently used one and
 * initialises it again, as does a call after a failed one (which is how a
 * failed state is reset). Closed batch objects are kept, NVJ_KEPT per
 * device, for the next calls (calls in flight together each take one):
 * states grow their device and pinned buffers on first use, and making them
 * per call would allocate (and free, which waits for the device) every time. */
#include "cuda/nvjpeg_batch.h"
#include "common.h"
#include "ferry_experimental.h"
#include <pthread.h>
#include <stdlib.h>

#define NVJ_BATCH_DEVICES 64
#define NVJ_KEPT 4            /* idle batch objects kept per device */
#define NVJ_STATES 5          /* states per backend: the run sizes 64, 32, 16, 8 and one other */
static pthread_mutex_t lock_ = PTHREAD_MUTEX_INITIALIZER;
static nvj_handle def_[NVJ_BATCH_DEVICES], hw_[NVJ_BATCH_DEVICES];
static int hw_tried_[NVJ_BATCH_DEVICES];
static struct ferry_nvj_batch *kept_[NVJ_BATCH_DEVICES][NVJ_KEPT];

typedef struct nvj_sized {    /* a state and the batch size it was initialised for (0: initialise) */
    nvj_state st;
    int size;
    unsigned long used;       /* the call count at its last use */
} nvj_sized;

struct ferry_nvj_batch {
    const nvj_api *nv;
    int dev;
    nvj_handle def, hw;       /* hw NULL: no hardware backend on this device */
    nvj_sized def_st[NVJ_STATES], hw_st[NVJ_STATES];
    unsigned long calls;
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
    for (int k = 0; k < NVJ_KEPT; k++)
        if (kept_[dev][k]) {   /* the states of an earlier call, their buffers already grown */
            *out = kept_[dev][k];
            kept_[dev][k] = NULL;
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
    if ((s = nv->JpegStateCreate(def, &b->def_st[0].st)) != NVJ_OK) {
        b->def_st[0].st = NULL;
        batch_destroy(b);
        return ferry_nvjpeg_err(s, "nvjpegJpegStateCreate");
    }
    if (hw && (nv->JpegStateCreate(hw, &b->hw_st[0].st) != NVJ_OK || nv->JpegStreamCreate(hw, &b->parsed) != NVJ_OK)) {
        /* the engine is there but will not give a state: the CUDA backend decodes all */
        if (b->hw_st[0].st) nv->JpegStateDestroy(b->hw_st[0].st);
        b->hw_st[0].st = NULL;
        b->parsed = NULL;
        b->hw = NULL;
    }
    *out = b;
    return 0;
}

static void batch_destroy(ferry_nvj_batch *b) {
    if (b->parsed) b->nv->JpegStreamDestroy(b->parsed);
    for (int k = 0; k < NVJ_STATES; k++) {
        if (b->hw_st[k].st) b->nv->JpegStateDestroy(b->hw_st[k].st);
        if (b->def_st[k].st) b->nv->JpegStateDestroy(b->def_st[k].st);
    }
    free(b);
}

void ferry_nvj_batch_close(ferry_nvj_batch *b) {
    if (!b) return;
    pthread_mutex_lock(&lock_);
    for (int k = 0; k < NVJ_KEPT && b; k++)
        if (!kept_[b->dev][k]) {
            kept_[b->dev][k] = b;
            b = NULL;
        }
    pthread_mutex_unlock(&lock_);
    if (b) batch_destroy(b);
}

/* The state of backend h initialised for batches of k (created, or the
 * least recently used one initialised again): 0, or a code. */
static int sized_state(ferry_nvj_batch *b, nvj_handle h, nvj_sized *v, int k, nvj_sized **out) {
    nvj_sized *pick = NULL, *spare = NULL;
    for (int q = 0; q < NVJ_STATES && !pick; q++)
        if (v[q].st && v[q].size == k) pick = &v[q];
    for (int q = 0; q < NVJ_STATES && !pick && !spare; q++)
        if (!v[q].st) spare = &v[q];
    if (!pick && spare) {
        if (b->nv->JpegStateCreate(h, &spare->st) == NVJ_OK) {
            spare->size = 0;
            pick = spare;
        } else {
            spare->st = NULL;   /* no more states: the least recently used one is initialised again */
        }
    }
    if (!pick) {   /* the least recently used */
        nvj_sized *lru = NULL;
        for (int q = 0; q < NVJ_STATES; q++)
            if (v[q].st && (!lru || v[q].used < lru->used)) lru = &v[q];
        pick = lru;
    }
    if (!pick) return ferry_seterr(FERRY_ENOMEM, "nvjpeg: no decode state on device %d", b->dev);
    if (pick->size != k) {
        pick->size = 0;
        nvj_status s = b->nv->DecodeBatchedInitialize(h, pick->st, k, 1, NVJ_OUTPUT_RGBI);
        if (s != NVJ_OK) return ferry_nvjpeg_err(s, "nvjpegDecodeBatchedInitialize");
        pick->size = k;
    }
    pick->used = ++b->calls;
    *out = pick;
    return 0;
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
    int rc = 0;
    if (hw) {
        /* the engine's writes are not ordered after the stream's earlier work: a caller gives
         * the hardware group a stream of its own (idle here, so this costs nothing) */
        const ferry_cuda_api *cu = ferry_cuda_load(NULL);
        CUresult r = cu ? cu->StreamSynchronize(stream) : 1;
        if (r != 0) rc = ferry_seterr(FERRY_ECUDA, "nvjpeg: waiting for the stream: %s", ferry_cuda_errstr(r));
    }
    nvj_status s = NVJ_OK;
    nvj_sized *st = NULL;
    if (rc == 0) rc = sized_state(b, h, hw ? b->hw_st : b->def_st, k, &st);
    if (rc == 0 && (s = b->nv->DecodeBatched(h, st->st, (const unsigned char *const *)data, len, img, stream)) != NVJ_OK) {
        rc = ferry_nvjpeg_err(s, hw ? "nvjpegDecodeBatched (hardware backend)" : "nvjpegDecodeBatched");
        st->size = 0;   /* initialised again before its next call */
    }
    free(img);
    return rc;
}
