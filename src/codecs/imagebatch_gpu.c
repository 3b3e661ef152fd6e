/* imagebatch_gpu.c — the device side of ferry_image_batch (imagebatch.h):
 * device sets kept per device between calls, nvJPEG runs transformed by one
 * kernel launch each, and the upload and transform of images the CPU decoded.
 *
 * Nothing here waits for the whole stream. A CPU thread decodes into a
 * pinned buffer of its slot (two in turn: it waits only for the copy out of
 * the one it wrote two images ago) and queues the copy and its kernel; a
 * copy from pageable memory would first wait for everything queued on the
 * stream, nvJPEG's runs included. nvJPEG runs alternate between two scratch
 * buffers: a run waits for the kernel that last read its buffer, not for
 * the CPU threads' uploads queued beside it. The hardware engine writes when
 * it is called, not in stream order, so its group goes on the buffer's own
 * stream (idle by then: its last decode ran before that kernel) after the
 * host has seen the buffer free, and the caller's stream waits for it.
 *
 * Memory grows to the sizes the images need and stays: outgrown device
 * regions are retired and freed after the call's sync, so cuMemFree (which
 * waits for the device) stays off the steady state. */
#include "codecs/imagebatch.h"
#include "engine/limits.h"
#include <stdlib.h>
#include <time.h>

/* Past these, a slot's buffers and a scratch buffer are not kept for later calls (one huge image
 * must not hold gigabytes of device and pinned memory for the process), and an image past
 * SLOT_KEEP goes through pageable memory */
#define SLOT_KEEP ((size_t)64 << 20)
#define SCRATCH_KEEP (FERRY_IMGB_RUN_BYTES + FERRY_IMGB_RUN_BYTES / 4)

static pthread_mutex_t pool_mu_ = PTHREAD_MUTEX_INITIALIZER;
static ferry_imgb_devset *pool_[FERRY_MAX_DEVICES][FERRY_IMGB_SETS];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cu_fail(ferry_imgb_run *r, CUresult cr, const char *what) {
    return ferry_seterr(FERRY_ECUDA, "image batch: %s on device %d: %s", what, r->device, ferry_cuda_errstr(cr));
}

/* The events and streams of a set (made once, with the device current). */
static int set_init(ferry_imgb_run *r, ferry_imgb_devset *d) {
    const ferry_cuda_api *cu = r->cu;
    CUresult cr = 0;
    for (int s = 0; s < 2 && !cr; s++) {
        if (!d->scratch_free[s]) cr = cu->EventCreate(&d->scratch_free[s], FERRY_CU_EVENT_DISABLE_TIMING);
        if (!cr && !d->hw_done[s]) cr = cu->EventCreate(&d->hw_done[s], FERRY_CU_EVENT_DISABLE_TIMING);
        if (!cr && !d->hw_stream[s]) cr = cu->StreamCreate(&d->hw_stream[s], FERRY_CU_STREAM_NON_BLOCKING);
    }
    return cr ? cu_fail(r, cr, "creating the decode's events and streams") : 0;
}

static void set_free(const ferry_cuda_api *cu, ferry_imgb_devset *d) {
    if (!d) return;
    for (int s = 0; s < 2; s++) {
        if (d->scratch[s]) cu->MemFree(d->scratch[s]);
        if (d->desc[s]) cu->MemFreeHost(d->desc[s]);
        if (d->scratch_free[s]) cu->EventDestroy(d->scratch_free[s]);
        if (d->hw_done[s]) cu->EventDestroy(d->hw_done[s]);
        if (d->hw_stream[s]) cu->StreamDestroy(d->hw_stream[s]);
    }
    for (int w = 0; w < FERRY_IMGB_UP_MAX; w++) {
        ferry_imgb_slot *sl = &d->slot[w];
        if (sl->dev) cu->MemFree(sl->dev);
        for (int k = 0; k < 2; k++) {
            if (sl->host[k]) cu->MemFreeHost(sl->host[k]);
            if (sl->copied[k]) cu->EventDestroy(sl->copied[k]);
        }
    }
    free(d);
}

int ferry_imgb_dev_take(ferry_imgb_run *r) {
    if (r->device < 0) return 0;
    ferry_imgb_devset *d = NULL;
    int dev = r->device < FERRY_MAX_DEVICES ? r->device : -1;
    pthread_mutex_lock(&pool_mu_);
    if (dev >= 0) {
        for (int k = 0; k < FERRY_IMGB_SETS && !d; k++) {
            if (!pool_[dev][k] && !(pool_[dev][k] = calloc(1, sizeof(ferry_imgb_devset)))) break;
            if (!pool_[dev][k]->busy) d = pool_[dev][k];
        }
        if (d) d->busy = 1;
    }
    pthread_mutex_unlock(&pool_mu_);
    if (!d) {   /* every kept set is in use: the call's own, freed at the end */
        if (!(d = calloc(1, sizeof *d))) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        r->ds_own = 1;
    }
    r->ds = d;
    return set_init(r, d);
}

/* After the call's sync: what one huge image grew is not kept. */
static void set_trim(const ferry_cuda_api *cu, ferry_imgb_devset *d) {
    for (int s = 0; s < 2; s++)
        if (d->scratch_size[s] > SCRATCH_KEEP) {
            cu->MemFree(d->scratch[s]);
            d->scratch[s] = 0;
            d->scratch_size[s] = 0;
        }
    for (int w = 0; w < FERRY_IMGB_UP_MAX; w++)
        if (d->slot[w].dev_size > SLOT_KEEP) {
            cu->MemFree(d->slot[w].dev);
            d->slot[w].dev = 0;
            d->slot[w].dev_size = 0;
        }
}

void ferry_imgb_dev_give(ferry_imgb_run *r) {
    if (r->device < 0) return;
    if (r->ds && !r->ds_own) set_trim(r->cu, r->ds);
    for (size_t k = 0; k < r->nretired; k++) r->cu->MemFree(r->retired[k]);
    free(r->retired);
    r->retired = NULL;
    r->nretired = 0;
    pthread_mutex_lock(&pool_mu_);
    if (r->ds && !r->ds_own) r->ds->busy = 0;
    pthread_mutex_unlock(&pool_mu_);
    if (r->ds_own) set_free(r->cu, r->ds);
    r->ds = NULL;
}

ferry_cuda_img_params ferry_imgb_params(const ferry_imgb_run *r) {
    ferry_cuda_img_params p = {r->o.out_h, r->o.out_w, 3, r->o.layout == FERRY_IMG_CHW ? 0 : 1,
                               r->o.dtype == FERRY_DT_U8 ? 0 : r->o.dtype == FERRY_DT_F32 ? 1
                               : r->o.dtype == FERRY_DT_F16 ? 2 : 3,
                               {r->o.mean[0], r->o.mean[1], r->o.mean[2]}, {r->o.std[0], r->o.std[1], r->o.std[2]}};
    return p;
}

/* An item's kernel descriptor (kernels.cu ferry_image_xform_batch): its pixels at src. */
static void describe(const ferry_imgb_run *r, const ferry_imgb_item *t, size_t i, CUdeviceptr src,
                     unsigned long long *q) {
    q[0] = src;
    q[1] = (unsigned long long)(uintptr_t)ferry_imgb_row(r, i);
    q[2] = (unsigned long long)t->info.width * 3;
    q[3] = ((unsigned long long)t->info.height << 32) | t->info.width;
    q[4] = ((unsigned long long)t->xs.box.y << 32) | t->xs.box.x;
    q[5] = ((unsigned long long)t->xs.box.h << 32) | t->xs.box.w;
    q[6] = (unsigned long long)t->xs.flip;
    q[7] = 0;
}

/* Device memory of at least `need` bytes at *p (size *have), growing it;
 * an outgrown region may still be read by queued work: retired, freed after
 * the call's sync. */
static int grow_dev(ferry_imgb_run *r, CUdeviceptr *p, size_t *have, size_t need) {
    if (*have >= need) return 0;
    CUdeviceptr q = 0;
    size_t want = need + need / 4;
    CUresult cr = r->cu->MemAlloc(&q, want);
    if (cr != 0) return ferry_seterr(FERRY_ENOMEM, "image batch: %zu bytes of device memory on device %d: %s",
                                     want, r->device, ferry_cuda_errstr(cr));
    if (*p) {
        pthread_mutex_lock(&r->mu);
        int ok = 1;
        if (r->nretired == r->capretired) {
            size_t c = r->capretired ? 2 * r->capretired : 8;
            CUdeviceptr *v = realloc(r->retired, c * sizeof *v);
            if (v) { r->retired = v; r->capretired = c; } else ok = 0;
        }
        if (ok) r->retired[r->nretired++] = *p;
        pthread_mutex_unlock(&r->mu);
        if (!ok) {
            r->cu->MemFree(q);
            return ferry_seterr(FERRY_ENOMEM, "out of memory");
        }
    }
    *p = q;
    *have = want;
    return 0;
}

static size_t px_at(const ferry_imgb_item *t) {   /* where the descriptor goes, after the pixels */
    return ((size_t)t->info.width * t->info.height * 3 + 255) & ~(size_t)255;
}

uint8_t *ferry_imgb_upload_buf(ferry_imgb_run *r, int w, size_t bytes) {
    if (w < 0 || w >= FERRY_IMGB_UP_MAX || !r->ds) return NULL;
    ferry_imgb_slot *sl = &r->ds->slot[w];
    int k = sl->next;
    size_t need = ((bytes + 255) & ~(size_t)255) + 64;
    if (need > SLOT_KEEP) return NULL;   /* a huge image: pageable, nothing pinned kept for it */
    if (!sl->copied[k] && r->cu->EventCreate(&sl->copied[k], FERRY_CU_EVENT_DISABLE_TIMING) != 0) {
        sl->copied[k] = NULL;
        return NULL;
    }
    double t0 = now_s();
    CUresult cr = r->cu->EventSynchronize(sl->copied[k]);   /* the copy out of it, two images ago */
    double dt = now_s() - t0;
    pthread_mutex_lock(&r->mu);
    r->wait_s += dt;
    pthread_mutex_unlock(&r->mu);
    if (cr != 0) return NULL;
    if (sl->host_size[k] < need) {
        if (sl->host[k]) r->cu->MemFreeHost(sl->host[k]);
        sl->host[k] = NULL;
        sl->host_size[k] = 0;
        void *p = NULL;
        size_t want = need + need / 4;
        if (r->cu->MemHostAlloc(&p, want, 0) != 0) return NULL;
        sl->host[k] = p;
        sl->host_size[k] = want;
    }
    return sl->host[k];
}

int ferry_imgb_upload(ferry_imgb_run *r, const ferry_imgb_item *t, size_t i, int w, uint8_t *px) {
    if (w < 0 || w >= FERRY_IMGB_UP_MAX) return ferry_seterr(FERRY_EINVAL, "image batch: upload slot %d", w);
    ferry_imgb_slot *sl = &r->ds->slot[w];
    size_t bytes = (size_t)t->info.width * t->info.height * 3, at = px_at(t);
    int rc = grow_dev(r, &sl->dev, &sl->dev_size, at + 64);
    if (rc < 0) return rc;
    unsigned long long local[8], *desc = local;
    int pinned = px == sl->host[sl->next];
    if (pinned) desc = (unsigned long long *)(px + at);   /* one copy carries both */
    describe(r, t, i, sl->dev, desc);
    ferry_cuda_img_params p = ferry_imgb_params(r);
    CUresult cr;
    if (pinned) {
        cr = r->cu->MemcpyHtoDAsync(sl->dev, px, at + 64, r->stream);
        if (cr == 0) cr = r->cu->EventRecord(sl->copied[sl->next], r->stream);
        sl->next ^= 1;
    } else {   /* pageable: the driver has taken the bytes when the calls return */
        cr = r->cu->MemcpyHtoDAsync(sl->dev, px, bytes, r->stream);
        if (cr == 0) cr = r->cu->MemcpyHtoDAsync(sl->dev + at, desc, 64, r->stream);
    }
    if (cr != 0) return cu_fail(r, cr, "copying an image");
    rc = ferry_cuda_image_xform_batch(r->device, sl->dev + at, 1, &p, r->stream);
    if (rc == FERRY_EUNSUPPORTED) rc = ferry_seterr(rc, "image batch: the transform kernel is not loaded");
    return rc;
}

void ferry_imgb_gpu_run(ferry_imgb_run *r, ferry_nvj_batch *b, const size_t *idx, int k) {
    ferry_imgb_devset *d = r->ds;
    size_t total = 0, off[FERRY_IMGB_RUN_MAX];
    for (int j = 0; j < k; j++) {
        off[j] = total;
        total += px_at(&r->it[idx[j]]);
    }
    size_t desc_at = total;
    total += (size_t)k * 64;
    int s = d->next, hw[FERRY_IMGB_RUN_MAX], ok[FERRY_IMGB_RUN_MAX] = {0};
    d->next ^= 1;
    double t0 = now_s();
    CUresult cr = r->cu->EventSynchronize(d->scratch_free[s]);   /* the kernel that read it last */
    pthread_mutex_lock(&r->mu);
    r->wait_s += now_s() - t0;
    pthread_mutex_unlock(&r->mu);
    if (cr != 0) { cu_fail(r, cr, "waiting for the scratch"); return; }
    if (!d->desc[s]) {
        void *p = NULL;
        if (r->cu->MemHostAlloc(&p, FERRY_IMGB_RUN_MAX * 64, 0) != 0) {
            ferry_seterr(FERRY_ENOMEM, "image batch: pinned memory for descriptors");
            return;   /* these go to the CPU */
        }
        d->desc[s] = p;
    }
    if (d->scratch_size[s] < total) {   /* free now: the host saw its last reader finish */
        if (d->scratch[s]) r->cu->MemFree(d->scratch[s]);
        d->scratch[s] = 0;
        d->scratch_size[s] = 0;
        size_t want = total + total / 4;
        CUdeviceptr p = 0;
        if ((cr = r->cu->MemAlloc(&p, want)) != 0) cr = r->cu->MemAlloc(&p, want = total);
        if (cr != 0) {
            ferry_seterr(FERRY_ENOMEM, "nvjpeg: %zu bytes of device memory on device %d: %s", total, r->device,
                         ferry_cuda_errstr(cr));
            return;   /* these go to the CPU */
        }
        d->scratch[s] = p;
        d->scratch_size[s] = want;
    }
    CUdeviceptr mem = d->scratch[s];
    for (int j = 0; j < k; j++) hw[j] = ferry_nvj_batch_hw_ok(b, r->it[idx[j]].data, r->it[idx[j]].size);
    for (int pass = 0; pass < 2; pass++) {   /* the hardware group, then the CUDA backend's */
        const uint8_t *data[FERRY_IMGB_RUN_MAX];
        size_t len[FERRY_IMGB_RUN_MAX], pitch[FERRY_IMGB_RUN_MAX];
        CUdeviceptr dst[FERRY_IMGB_RUN_MAX];
        int sel[FERRY_IMGB_RUN_MAX], m = 0;
        for (int j = 0; j < k; j++) {
            if (hw[j] != (pass == 0)) continue;
            const ferry_imgb_item *t = &r->it[idx[j]];
            data[m] = t->data;
            len[m] = t->size;
            dst[m] = mem + off[j];
            pitch[m] = (size_t)t->info.width * 3;
            sel[m++] = j;
        }
        if (!m) continue;
        CUstream on = pass == 0 ? d->hw_stream[s] : r->stream;
        if (pass == 0) {
            /* the run before went on the other buffer's stream with this batch object's states,
             * which nvJPEG does not promise to share between streams with work in flight: it
             * finishes first (its event is stale, already complete, when it had no group) */
            double t1 = now_s();
            cr = r->cu->EventSynchronize(d->hw_done[s ^ 1]);
            pthread_mutex_lock(&r->mu);
            r->wait_s += now_s() - t1;
            pthread_mutex_unlock(&r->mu);
            if (cr != 0) { cu_fail(r, cr, "waiting for the last hardware decode"); continue; }
        }
        int drc = ferry_nvj_batch_decode(b, pass == 0, data, len, m, dst, pitch, on);
        if (drc != 0 && pass == 0) r->cu->StreamSynchronize(on);   /* whatever the engine took is done */
        if (drc == 0 && pass == 0) {   /* the kernel below reads what the engine wrote */
            cr = r->cu->EventRecord(d->hw_done[s], on);
            if (cr == 0) cr = r->cu->StreamWaitEvent(r->stream, d->hw_done[s], 0);
            if (cr != 0) {
                cu_fail(r, cr, "ordering the hardware decode");
                r->cu->StreamSynchronize(on);   /* the engine's writes are done before the buffer is reused */
                drc = -1;
            }
        }
        if (drc == 0)
            for (int q = 0; q < m; q++) ok[sel[q]] = 1 + (pass == 0);
    }
    unsigned long long *desc = d->desc[s];
    int nd = 0;
    for (int j = 0; j < k; j++) {
        if (!ok[j]) continue;
        describe(r, &r->it[idx[j]], idx[j], mem + off[j], desc + 8 * nd++);
    }
    if (nd) {
        ferry_cuda_img_params p = ferry_imgb_params(r);
        cr = r->cu->MemcpyHtoDAsync(mem + desc_at, desc, (size_t)nd * 64, r->stream);
        int rc = cr ? cu_fail(r, cr, "copying the transform's descriptors")
                    : ferry_cuda_image_xform_batch(r->device, mem + desc_at, (size_t)nd, &p, r->stream);
        if (rc < 0)   /* the kernel did not start: these rows are done on the CPU */
            for (int j = 0; j < k; j++) ok[j] = 0;
    }
    /* behind the kernel (or the decodes, when it did not start): the buffer's next run waits for it */
    if ((cr = r->cu->EventRecord(d->scratch_free[s], r->stream)) != 0) {
        cu_fail(r, cr, "recording the scratch's release");
        r->cu->StreamSynchronize(r->stream);
    }
    for (int j = 0; j < k; j++)
        if (ok[j]) {
            r->it[idx[j]].by = 1;
            r->it[idx[j]].hw = ok[j] == 2;
        }
}

int ferry_imgb_gpu_claim(ferry_imgb_run *r, size_t *idx) {
    int k = 0;
    pthread_mutex_lock(&r->mu);
    size_t left = r->gpu_end - r->gpu_next, want = left, bytes = 0;
    /* Runs of a few fixed sizes (64, 32, 16, 8), so that nvJPEG's states, one a size, are not
     * initialised again call after call; beside CPU threads, fewer than 8 are left to them */
    if (want >= FERRY_IMGB_RUN_MAX) want = FERRY_IMGB_RUN_MAX;
    else if (r->cpu_takes_gpu_items && r->cpu_active) {
        size_t c = FERRY_IMGB_RUN_MAX / 2;
        while (c >= 8 && c > want) c /= 2;
        want = c >= 8 ? c : 0;
    }
    if (atomic_load(&r->failed)) want = 0;
    for (; (size_t)k < want; k++) {   /* at most FERRY_IMGB_RUN_BYTES of pixels; one image at least */
        const ferry_imgb_item *t = &r->it[r->gpu_list[r->gpu_next]];
        bytes += (size_t)t->info.width * t->info.height * 3;
        if (k && bytes > FERRY_IMGB_RUN_BYTES) break;
        idx[k] = r->gpu_list[r->gpu_next++];
    }
    pthread_mutex_unlock(&r->mu);
    return k;
}
