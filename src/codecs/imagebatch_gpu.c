/* imagebatch_gpu.c — the device side of ferry_image_batch (imagebatch.h):
 * device memory kept per device between calls, nvJPEG runs transformed by one
 * kernel launch each, and the upload and transform of images the CPU decoded.
 *
 * Memory. Per device one set is kept for the next call and taken by one call
 * at a time (a concurrent call on the device makes its own): the scratch of a
 * run (its decoded pixels and descriptors: at most FERRY_IMGB_RUN_BYTES
 * unless one image is more) and one upload region per decoding thread (one
 * image and its descriptor). All of it is reused in stream order: the CUDA
 * backend and the copies write on the stream after the kernels that read the
 * last contents; the hardware backend's call comes after the stream is
 * drained. Outgrowing the scratch waits for the stream before the old buffer
 * goes; an outgrown upload region is retired and freed after the call's sync.
 * Nothing is allocated or freed per image once the sizes have settled, so
 * cuMemFree (which waits for the device) stays off the steady state. */
#include "codecs/imagebatch.h"
#include "engine/limits.h"
#include <stdlib.h>

static pthread_mutex_t cache_mu_ = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int busy;
    CUdeviceptr scratch, up[FERRY_IMGB_UP_MAX];
    size_t scratch_size, up_size[FERRY_IMGB_UP_MAX];
    double cpu_rate, gpu_rate;   /* pixels per second of a CPU thread and of the GPU, earlier calls */
} cache_[FERRY_MAX_DEVICES];

void ferry_imgb_dev_take(ferry_imgb_run *r) {
    if (r->device < 0 || r->device >= FERRY_MAX_DEVICES) return;
    pthread_mutex_lock(&cache_mu_);
    r->cpu_rate0 = cache_[r->device].cpu_rate;
    r->gpu_rate0 = cache_[r->device].gpu_rate;
    if (!cache_[r->device].busy) {
        cache_[r->device].busy = 1;
        r->cached = 1;
        r->scratch = cache_[r->device].scratch;
        r->scratch_size = cache_[r->device].scratch_size;
        memcpy(r->up, cache_[r->device].up, sizeof r->up);
        memcpy(r->up_size, cache_[r->device].up_size, sizeof r->up_size);
    }
    pthread_mutex_unlock(&cache_mu_);
}

void ferry_imgb_dev_give(ferry_imgb_run *r) {
    if (r->device < 0) return;
    for (size_t k = 0; k < r->nretired; k++) r->cu->MemFree(r->retired[k]);
    free(r->retired);
    r->retired = NULL;
    r->nretired = 0;
    if (r->device >= FERRY_MAX_DEVICES) return;
    pthread_mutex_lock(&cache_mu_);
    if (r->cpu_s > 0) {   /* this call's rates, folded in halfway */
        double c = r->cpu_px / r->cpu_s, *old = &cache_[r->device].cpu_rate;
        *old = *old > 0 ? (*old + c) / 2 : c;
    }
    if (r->gpu_s > 0 && r->gpu_px > 0) {
        double g = r->gpu_px / r->gpu_s, *old = &cache_[r->device].gpu_rate;
        *old = *old > 0 ? (*old + g) / 2 : g;
    }
    if (r->cached) {
        cache_[r->device].scratch = r->scratch;
        cache_[r->device].scratch_size = r->scratch_size;
        memcpy(cache_[r->device].up, r->up, sizeof r->up);
        memcpy(cache_[r->device].up_size, r->up_size, sizeof r->up_size);
        cache_[r->device].busy = 0;
    }
    pthread_mutex_unlock(&cache_mu_);
    if (!r->cached) {
        if (r->scratch) r->cu->MemFree(r->scratch);
        for (int w = 0; w < FERRY_IMGB_UP_MAX; w++)
            if (r->up[w]) r->cu->MemFree(r->up[w]);
    }
    r->scratch = 0;
    memset(r->up, 0, sizeof r->up);
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

int ferry_imgb_upload(ferry_imgb_run *r, const ferry_imgb_item *t, size_t i, int w, const uint8_t *px) {
    if (w < 0 || w >= FERRY_IMGB_UP_MAX) return ferry_seterr(FERRY_EINVAL, "image batch: upload slot %d", w);
    size_t bytes = (size_t)t->info.width * t->info.height * 3, at = (bytes + 255) & ~(size_t)255, need = at + 64;
    if (r->up_size[w] < need) {
        /* the old region may still be read by a queued kernel: it goes after the call's sync */
        CUdeviceptr p = 0;
        size_t want = need + need / 4;
        CUresult cr = r->cu->MemAlloc(&p, want);
        if (cr != 0) return ferry_seterr(FERRY_ENOMEM, "image batch: %zu bytes of device memory on device %d: %s",
                                         want, r->device, ferry_cuda_errstr(cr));
        if (r->up[w]) {
            pthread_mutex_lock(&r->mu);
            int ok = 1;
            if (r->nretired == r->capretired) {
                size_t c = r->capretired ? 2 * r->capretired : 8;
                CUdeviceptr *v = realloc(r->retired, c * sizeof *v);
                if (v) { r->retired = v; r->capretired = c; } else ok = 0;
            }
            if (ok) r->retired[r->nretired++] = r->up[w];
            pthread_mutex_unlock(&r->mu);
            if (!ok) {
                r->cu->MemFree(p);
                return ferry_seterr(FERRY_ENOMEM, "out of memory");
            }
        }
        r->up[w] = p;
        r->up_size[w] = want;
    }
    unsigned long long desc[8];
    describe(r, t, i, r->up[w], desc);
    ferry_cuda_img_params p = ferry_imgb_params(r);
    int rc = 0;
    pthread_mutex_lock(&r->stream_mu);
    /* pageable sources: the driver has taken them when the calls return */
    CUresult cr = r->cu->MemcpyHtoDAsync(r->up[w], px, bytes, r->stream);
    if (cr == 0) cr = r->cu->MemcpyHtoDAsync(r->up[w] + at, desc, sizeof desc, r->stream);
    if (cr != 0) rc = ferry_seterr(FERRY_ECUDA, "image batch: copying an image to device %d: %s", r->device,
                                   ferry_cuda_errstr(cr));
    else rc = ferry_cuda_image_xform_batch(r->device, r->up[w] + at, 1, &p, r->stream);
    pthread_mutex_unlock(&r->stream_mu);
    if (rc == FERRY_EUNSUPPORTED) rc = ferry_seterr(rc, "image batch: the transform kernel is not loaded");
    return rc;
}

/* The scratch for a run of `need` bytes (0 with the message set when the
 * device has no memory for it: the run goes to the CPU). */
static CUdeviceptr scratch_get(ferry_imgb_run *r, size_t need) {
    if (r->scratch && r->scratch_size >= need) return r->scratch;
    if (r->scratch) {
        r->cu->StreamSynchronize(r->stream);   /* earlier runs are done with it */
        r->cu->MemFree(r->scratch);
        r->scratch = 0;
        r->scratch_size = 0;
    }
    size_t want = need + need / 4;
    CUdeviceptr p = 0;
    CUresult cr = r->cu->MemAlloc(&p, want);
    if (cr != 0) {
        want = need;
        cr = r->cu->MemAlloc(&p, want);
    }
    if (cr != 0) {
        ferry_seterr(FERRY_ENOMEM, "nvjpeg: %zu bytes of device memory on device %d: %s", need, r->device,
                     ferry_cuda_errstr(cr));
        return 0;
    }
    r->scratch = p;
    r->scratch_size = want;
    return p;
}

static int keep_host(ferry_imgb_run *r, void *p) {
    if (r->nhost == r->caphost) {
        size_t c = r->caphost ? 2 * r->caphost : 16;
        void **v = realloc(r->hostkeep, c * sizeof *v);
        if (!v) return -1;
        r->hostkeep = v;
        r->caphost = c;
    }
    r->hostkeep[r->nhost++] = p;
    return 0;
}

void ferry_imgb_gpu_run(ferry_imgb_run *r, ferry_nvj_batch *b, const size_t *idx, int k) {
    size_t total = 0, off[FERRY_IMGB_RUN_MAX];
    for (int j = 0; j < k; j++) {
        const ferry_imgb_item *t = &r->it[idx[j]];
        off[j] = total;
        total += ((size_t)t->info.width * t->info.height * 3 + 255) & ~(size_t)255;
    }
    size_t desc_at = total;
    total += (size_t)k * 64;
    CUdeviceptr mem = scratch_get(r, total);
    CUresult cr;
    int hw[FERRY_IMGB_RUN_MAX], ok[FERRY_IMGB_RUN_MAX] = {0};
    if (!mem) goto done;   /* no memory on the device: these go to the CPU */
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
        if (pass == 0) pthread_mutex_lock(&r->stream_mu);
        int drc = m ? ferry_nvj_batch_decode(b, pass == 0, data, len, m, dst, pitch, r->stream) : -1;
        if (pass == 0) pthread_mutex_unlock(&r->stream_mu);
        if (m && drc == 0) {
            for (int q = 0; q < m; q++) ok[sel[q]] = 1 + (pass == 0);
        }
    }
    unsigned long long *desc = malloc((size_t)k * 64);
    int nd = 0;
    if (!desc || keep_host(r, desc) < 0) {
        free(desc);
        for (int j = 0; j < k; j++) ok[j] = 0;
        ferry_seterr(FERRY_ENOMEM, "out of memory");
    } else {
        for (int j = 0; j < k; j++) {
            if (!ok[j]) continue;
            describe(r, &r->it[idx[j]], idx[j], mem + off[j], desc + 8 * nd++);
        }
    }
    if (nd) {
        ferry_cuda_img_params p = ferry_imgb_params(r);
        cr = r->cu->MemcpyHtoDAsync(mem + desc_at, desc, (size_t)nd * 64, r->stream);
        int rc = cr ? ferry_seterr(FERRY_ECUDA, "image transform descriptors: %s", ferry_cuda_errstr(cr))
                    : ferry_cuda_image_xform_batch(r->device, mem + desc_at, (size_t)nd, &p, r->stream);
        if (rc < 0)   /* the kernel did not start: these rows are done on the CPU */
            for (int j = 0; j < k; j++) ok[j] = 0;
    }
    for (int j = 0; j < k; j++)
        if (ok[j]) {
            r->it[idx[j]].by = 1;
            r->it[idx[j]].hw = ok[j] == 2;
        }
done:;
}

int ferry_imgb_gpu_claim(ferry_imgb_run *r, size_t *idx) {
    int k = 0;
    pthread_mutex_lock(&r->mu);
    size_t left = r->ngpu - r->gpu_next, want = left, bytes = 0;
    double share = 1.0;   /* of the pixels left: all, when the CPU threads are done or not sharing */
    if (r->cpu_takes_gpu_items && r->cpu_active) {
        /* beside busy CPU threads: the share the GPU finishes when they finish the rest, by the
         * rates measured (in this call, else earlier ones); half before there are any */
        double g = r->gpu_s > 0 ? r->gpu_px / r->gpu_s : r->gpu_rate0;
        double c = r->cpu_s > 0 ? r->cpu_px / r->cpu_s : r->cpu_rate0;
        share = g > 0 && c > 0 ? g / (g + c * r->cpu_active) : 0.5;
    }
    double left_px = 0, take_px = 0;
    for (size_t q = r->gpu_next; share < 1.0 && q < r->ngpu; q++)
        left_px += (double)r->it[r->gpu_list[q]].info.width * r->it[r->gpu_list[q]].info.height;
    if (want > FERRY_IMGB_RUN_MAX) want = FERRY_IMGB_RUN_MAX;
    if (atomic_load(&r->failed)) want = 0;
    for (; (size_t)k < want; k++) {   /* at most FERRY_IMGB_RUN_BYTES of pixels; one image at least */
        const ferry_imgb_item *t = &r->it[r->gpu_list[r->gpu_next]];
        double px = (double)t->info.width * t->info.height;
        bytes += (size_t)px * 3;
        if (k && (bytes > FERRY_IMGB_RUN_BYTES || (share < 1.0 && take_px + px / 2 > share * left_px))) break;
        take_px += px;
        idx[k] = r->gpu_list[r->gpu_next++];
    }
    pthread_mutex_unlock(&r->mu);
    return k;
}

