/* imagebatch.c — ferry_image_batch: read a batch of image members, decode
 * them on CPU threads and nvJPEG from one queue, transform each into its row
 * of one array (ferry_experimental.h is the manual).
 *
 * Two phases on threads started for the call (a batch is short CPU work that
 * needs none of the engine's staging, as ferry_image_decode_batch):
 *   1. every thread claims samples one at a time: read the member, probe the
 *      header, draw the crop box and flip, and sort the image: one nvJPEG can
 *      take, or one only the CPU decodes (and why).
 *   2. the queue: the CPU threads take the CPU-only images first, then (AUTO)
 *      images nvJPEG could take, one at a time from the back; the GPU feeder
 *      (the calling thread) takes runs of those from the front (64, else 32,
 *      16 or 8 while CPU threads work beside it: the split follows the two
 *      rates without measuring them, and nvJPEG's states, one a run size, are
 *      not initialised again), decodes each run with one
 *      nvjpegDecodeBatched per backend into scratch device memory and
 *      transforms the run with one kernel launch into the rows.
 *      A run nvJPEG refuses is decoded again on the CPU by the feeder, image by
 *      image, so the error names the image.
 * Images the CPU decoded for a device destination are uploaded and
 * transformed by the same kernel (imagebatch_gpu.c), so the CPU threads
 * spend their time decoding.
 * Rows are written at their sample's position; samples skipped (on_error
 * SKIP) are closed up at the end, in order, on the same stream. */
#include "codecs/imagebatch.h"
#include "engine/ctx.h"
#include <math.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MAX_ENCODED ((uint64_t)1 << 30)     /* an image member past 1 GiB is refused before it is read */

typedef ferry_imgb_item item;
typedef ferry_imgb_run run;

const char *ferry_image_fallback_name(int reason) {
    static const char *const n[FERRY_IMAGE_FB_COUNT_] = {"png", "cmyk", "sampling", "precision", "large",
                                                          "gpu_error"};
    return reason >= 0 && reason < FERRY_IMAGE_FB_COUNT_ ? n[reason] : NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Record the failure of item i: its code and message, prefixed with the
 * shard file, key and member unless the message already names the sample. */
static int fail(run *r, item *t, int rc) {
    const char *m = ferry_lasterr();
    char buf[2048];
    if (t->key && strstr(m, t->key) && t->path && strstr(m, t->path)) {
        snprintf(buf, sizeof buf, "%s", m);
    } else {
        char key[600], name[300];
        if (t->key) snprintf(key, sizeof key, "sample \"%s\"", t->key);
        else snprintf(key, sizeof key, "sample %lld", (long long)t->sample);
        if (t->name) snprintf(name, sizeof name, " member \"%s\"", t->name);
        else name[0] = 0;
        snprintf(buf, sizeof buf, "%s%s%s%s: %s", t->path ? t->path : "", t->path ? ": " : "", key, name, m);
    }
    t->rc = rc;
    free(t->msg);
    t->msg = strdup(buf);
    if (r->a->on_error == FERRY_ON_ERROR_RAISE) atomic_store(&r->failed, 1);
    return rc;
}

/* ---- phase 1: read, probe, draw ------------------------------------------ */
static int is_image_name(const char *name, const char *enc) {
    static const char *const ext[] = {"jpg", "jpeg", "png"};
    if (enc) return !strcmp(enc, "jpeg") || !strcmp(enc, "png") || !strcmp(enc, "jpg");
    for (int k = 0; k < 3; k++) {
        size_t ln = strlen(name), le = strlen(ext[k]);
        if (!strcmp(name, ext[k]) || (ln > le && name[ln - le - 1] == '.' && !strcmp(name + ln - le, ext[k]))) return 1;
    }
    return 0;
}

static int center_box(uint32_t h, uint32_t w, uint32_t oh, uint32_t ow, ferry_img_box *b) {
    /* the largest box of aspect ow:oh inside h x w, centred */
    double bh = h, bw = w;
    if ((double)w * oh > (double)h * ow) bw = rint((double)h * ow / oh);
    else bh = rint((double)w * oh / ow);
    uint32_t ih = bh < 1 ? 1 : bh > h ? h : (uint32_t)bh, iw = bw < 1 ? 1 : bw > w ? w : (uint32_t)bw;
    /* the offset as torchvision's CenterCrop rounds it: int(round((h - ch) / 2.0)), half to even */
    *b = (ferry_img_box){(uint32_t)rint((h - ih) / 2.0), (uint32_t)rint((w - iw) / 2.0), ih, iw};
    return 0;
}

static int gpu_reason(const ferry_image_info *in) {
    if (in->format != FERRY_IMAGE_JPEG) return FERRY_IMAGE_FB_PNG;
    if (in->cmyk) return FERRY_IMAGE_FB_CMYK;
    if (in->bit_depth != 8) return FERRY_IMAGE_FB_PRECISION;
    switch (in->subsampling) {
    case 444: case 422: case 420: case 440: case 400: break;
    default: return FERRY_IMAGE_FB_SAMPLING;
    }
    if (in->width > FERRY_IMGB_GPU_MAX_SIDE || in->height > FERRY_IMGB_GPU_MAX_SIDE) return FERRY_IMAGE_FB_LARGE;
    return -1;
}

static int prepare(run *r, item *t, size_t i) {
    const ferry_image_batch_args *a = r->a;
    ferry_shards *s = a->shards;
    t->sample = a->samples[i];
    t->reason = -1;
    ferry_sample_info si;
    int rc = ferry_shards_sample(s, t->sample, &si);
    if (rc < 0) return fail(r, t, rc);
    t->key = si.key;
    int m = -1;
    ferry_member_info mi;
    if (si.nmembers > 0 && ferry_shards_member(s, t->sample, 0, &mi) == 0) t->path = mi.path;   /* its shard */
    if (a->member) {
        if ((m = ferry_shards_find(s, t->sample, a->member)) < 0) {
            t->name = a->member;
            return fail(r, t, m);
        }
    } else {
        for (int k = 0; k < si.nmembers && m < 0; k++)
            if (ferry_shards_member(s, t->sample, k, &mi) == 0 && is_image_name(mi.name, mi.encoding)) m = k;
        if (m < 0) {
            t->name = "(an image)";
            return fail(r, t, ferry_seterr(FERRY_ENOTFOUND, "no member named like an image (jpg, jpeg, png); "
                                           "name the member"));
        }
    }
    if ((rc = ferry_shards_member(s, t->sample, m, &mi)) < 0) return fail(r, t, rc);
    t->name = mi.name;
    t->path = mi.path;
    if (mi.size > MAX_ENCODED)
        return fail(r, t, ferry_seterr(FERRY_EUNSUPPORTED, "%llu bytes: ferry decodes images of up to 1 GiB",
                                       (unsigned long long)mi.size));
    t->size = (size_t)mi.size;
    if (!(t->data = malloc(t->size ? t->size : 1))) return fail(r, t, ferry_seterr(FERRY_ENOMEM, "out of memory"));
    int64_t got = ferry_shards_read(s, t->sample, m, t->data, t->size);
    if (got < 0) return fail(r, t, (int)got);
    if ((rc = ferry_image_probe(t->data, t->size, &t->info)) < 0) return fail(r, t, rc);
    if (t->info.format == FERRY_IMAGE_JPEG && !ferry_nvjpeg_has_eoi(t->data, t->size))
        return fail(r, t, ferry_seterr(FERRY_ECODEC, "jpeg: no end-of-image marker after the scan (truncated)"));
    uint32_t h = t->info.height, w = t->info.width;
    const ferry_image_transform *x = &a->xf;
    switch (x->crop) {
    case FERRY_IMAGE_CROP_RANDOM_RESIZED: {
        int dflt = x->scale[0] == 0 && x->scale[1] == 0 && x->ratio[0] == 0 && x->ratio[1] == 0;
        rc = ferry_img_random_resized_crop(a->seed, a->epoch, (uint64_t)t->sample, h, w, dflt ? 0.08 : x->scale[0],
                                           dflt ? 1.0 : x->scale[1], dflt ? 3.0 / 4.0 : x->ratio[0],
                                           dflt ? 4.0 / 3.0 : x->ratio[1], &t->xs.box);
        if (rc < 0) return fail(r, t, rc);
        break;
    }
    case FERRY_IMAGE_CROP_CENTER: center_box(h, w, x->height, x->width, &t->xs.box); break;
    case FERRY_IMAGE_CROP_RESIZE: t->xs.box = (ferry_img_box){0, 0, h, w}; break;
    default:
        if (h != x->height || w != x->width) {
            t->fatal = 1;
            atomic_store(&r->failed, 1);
            return fail(r, t, ferry_seterr(FERRY_EINVAL, "the image is %u x %u, the output %u x %u: without a crop or "
                                           "resize every image must be the output's size (pass a crop or resize)",
                                           h, w, x->height, x->width));
        }
        t->xs.box = (ferry_img_box){0, 0, h, w};
    }
    t->xs.flip = x->flip > 0 && ferry_img_flip_draw(a->seed, a->epoch, (uint64_t)t->sample, x->flip);
    if ((rc = ferry_img_check(&r->o, &t->xs, h, w, "image batch")) < 0) return fail(r, t, rc);
    t->reason = gpu_reason(&t->info);
    return 0;
}

/* ---- decoding on the CPU ---------------------------------------------------- */
/* Decode item i on this thread (upload slot w) and transform it: on the
 * device when the destination is there and the kernel runs (the CPU's time
 * goes to decoding), else here, its row copied to the device if it is there.
 * Transformed here, a JPEG is decoded only in the part its box needs
 * (`part`: jpegregion.c, the whole decode's pixels); uploads are whole images. */
static int cpu_decode(run *r, item *t, size_t i, int w) {
    size_t need = (size_t)t->info.width * t->info.height * 3;
    uint8_t *px = r->kernel ? ferry_imgb_upload_buf(r, w, need) : NULL, *own = NULL, *row = NULL;
    int rc;
    if (!px && !(px = own = malloc(need)))
        return fail(r, t, ferry_seterr(FERRY_ENOMEM, "out of memory for a %u x %u image", t->info.height,
                                       t->info.width));
    ferry_img_box part = {0, 0, t->info.height, t->info.width};
    int64_t got = r->kernel ? ferry_image_decode(t->data, t->size, px, need, 0, NULL)
                            : ferry_image_decode_region(t->data, t->size, px, need, 0, &t->xs.box, &part, NULL);
    if (got < 0) { free(own); return fail(r, t, (int)got); }
    if (r->kernel) {
        rc = ferry_imgb_upload(r, t, i, w, px);
    } else if (r->device < 0) {
        rc = ferry_img_transform_part(px, &part, t->info.height, t->info.width, (size_t)part.w * 3, &t->xs, &r->o,
                                      ferry_imgb_row(r, i));
    } else if (!(row = malloc(r->row))) {
        rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    } else if ((rc = ferry_img_transform_part(px, &part, t->info.height, t->info.width, (size_t)part.w * 3, &t->xs,
                                              &r->o, row)) == 0) {
        /* pageable source: the driver has taken it when the call returns */
        CUresult cr = r->cu->MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)ferry_imgb_row(r, i), row, r->row, r->stream);
        if (cr != 0) rc = ferry_seterr(FERRY_ECUDA, "copying a row to device %d: %s", r->device, ferry_cuda_errstr(cr));
    }
    free(row);
    free(own);
    if (rc < 0) return fail(r, t, rc);
    t->by = 2;
    return 0;
}

/* The next image for a CPU thread: CPU-only ones first, then (AUTO) the
 * front of the ones nvJPEG could take. SIZE_MAX when none is left. */
static size_t cpu_claim(run *r) {
    size_t i = SIZE_MAX;
    pthread_mutex_lock(&r->mu);
    if (!atomic_load(&r->failed)) {
        if (r->cpu_next < r->ncpu) i = r->cpu_list[r->cpu_next++];
        else if (r->cpu_takes_gpu_items && r->gpu_next < r->gpu_end) i = r->gpu_list[--r->gpu_end];
    }
    if (i == SIZE_MAX) r->cpu_active--;
    pthread_mutex_unlock(&r->mu);
    return i;
}

static void *cpu_worker(void *arg) {
    run *r = arg;
    CUcontext saved = NULL;
    int switched = 0, w = atomic_fetch_add(&r->next_worker, 1);
    for (size_t i; (i = cpu_claim(r)) != SIZE_MAX;) {
        item *t = &r->it[i];
        if (r->device >= 0 && !switched) {
            saved = ferry_cuda_current();
            int rc = ferry_cuda_use_device(r->device);
            if (rc < 0) { fail(r, t, rc); continue; }
            switched = 1;
        }
        if (r->gpu && t->reason >= 0) t->fellback = 1;
        double t0 = now_s();
        cpu_decode(r, t, i, w);
        double dt = now_s() - t0;
        pthread_mutex_lock(&r->mu);
        r->cpu_s += dt;
        pthread_mutex_unlock(&r->mu);
    }
    if (switched) ferry_cuda_restore(saved);
    return NULL;
}

static void *prepare_worker(void *arg) {
    run *r = arg;
    for (size_t i; (i = atomic_fetch_add(&r->next, 1)) < r->n;)
        if (!atomic_load(&r->failed)) prepare(r, &r->it[i], i);
    return NULL;
}

/* Run fn on `threads` threads: the caller's and threads - 1 started here
 * (fewer when they cannot be started: the work still gets done). */
static void on_threads(int threads, void *(*fn)(void *), void *arg, int caller_too) {
    pthread_t t[64];
    int started = 0, want = threads - (caller_too ? 1 : 0);
    if (want > 64) want = 64;
    for (; started < want; started++)
        if (pthread_create(&t[started], NULL, fn, arg) != 0) break;
    if (caller_too || started == 0) fn(arg);
    for (int k = 0; k < started; k++) pthread_join(t[k], NULL);
}

/* ---- the GPU feeder ------------------------------------------------------------- */
/* Decode runs until the queue is empty, starting with idx[0..k) (claimed
 * before the CPU threads started, so that a slow start of this thread does
 * not leave the GPU without work). Images of a run the GPU did not finish
 * (nvJPEG refused their group, no device memory) are decoded here on the
 * CPU, image by image, so an error names its image. */
static void gpu_feeder(run *r, ferry_nvj_batch *b, size_t *idx, int k) {
    int w = atomic_fetch_add(&r->next_worker, 1);
    for (; k > 0; k = ferry_imgb_gpu_claim(r, idx)) {
        double t0 = now_s();
        ferry_imgb_gpu_run(r, b, idx, k);
        r->gpu_s += now_s() - t0;
        for (int j = 0; j < k; j++) {
            item *t = &r->it[idx[j]];
            if (t->by != 1 && !atomic_load(&r->failed)) {
                t->reason = FERRY_IMAGE_FB_GPU_ERROR;
                t->fellback = 1;
                cpu_decode(r, t, idx[j], w);
            }
        }
    }
}

/* ---- the call ------------------------------------------------------------------ */
static int check_args(ferry_ctx *ctx, const ferry_image_batch_args *a, run *r) {
    if (!ctx || !a) return ferry_seterr(FERRY_EINVAL, "ferry_image_batch: NULL context or arguments");
    if (!a->shards) return ferry_seterr(FERRY_EINVAL, "ferry_image_batch: no shard set");
    if (a->n && !a->samples) return ferry_seterr(FERRY_EINVAL, "ferry_image_batch: samples is NULL");
    const ferry_image_transform *x = &a->xf;
    if ((unsigned)x->crop > FERRY_IMAGE_CROP_NONE) return ferry_seterr(FERRY_EINVAL, "ferry_image_batch: crop %d", x->crop);
    if (!(x->flip >= 0 && x->flip <= 1)) return ferry_seterr(FERRY_EINVAL, "ferry_image_batch: flip probability %g", x->flip);
    if (a->on_error != FERRY_ON_ERROR_RAISE && a->on_error != FERRY_ON_ERROR_SKIP)
        return ferry_seterr(FERRY_EINVAL, "ferry_image_batch: on_error %d", a->on_error);
    if ((unsigned)a->decode > FERRY_DECODE_CPU) return ferry_seterr(FERRY_EINVAL, "ferry_image_batch: decode %d", a->decode);
    if (a->threads < 0) return ferry_seterr(FERRY_EINVAL, "ferry_image_batch: threads %d", a->threads);
    if ((unsigned)x->layout > FERRY_IMAGE_HWC) return ferry_seterr(FERRY_EINVAL, "ferry_image_batch: layout %d", x->layout);
    for (int c = 0; c < 3; c++)
        if (x->dtype == FERRY_DT_U8 && (x->mean[c] != 0 || x->std[c] != 0))
            return ferry_seterr(FERRY_EINVAL, "ferry_image_batch: uint8 output is not normalised (mean and std 0)");
    r->o = (ferry_img_out){x->height, x->width, 3, x->layout == FERRY_IMAGE_CHW ? FERRY_IMG_CHW : FERRY_IMG_HWC,
                           x->dtype, {x->mean[0], x->mean[1], x->mean[2]}, {x->std[0], x->std[1], x->std[2]}};
    int rc = ferry_img_check(&r->o, NULL, 0, 0, "ferry_image_batch");
    if (rc < 0) return rc;
    r->row = ferry_img_out_bytes(&r->o);
    uint64_t need;
    if (ferry_mul_overflow(r->row, a->n, &need) || (a->n && !a->dst.ptr) || a->dst.size < need)   /* n 0: any dst */
        return ferry_seterr(FERRY_EINVAL, "ferry_image_batch: %zu rows of %zu bytes do not fit the %zu-byte destination",
                            a->n, r->row, a->dst.ptr ? a->dst.size : 0);
    if (a->dst.kind == FERRY_MEM_CUDA) r->device = a->dst.device;
    else if (a->dst.kind == FERRY_MEM_HOST) r->device = -1;
    else return ferry_seterr(FERRY_EINVAL, "ferry_image_batch: the destination must be host or CUDA device memory");
    return 0;
}

/* Decide who decodes: 0, or FERRY_EPATH for a forced GPU that cannot run. */
static int choose(run *r, ferry_nvj_batch **b) {
    ferry_config cfg;
    ferry_ctx_config(r->ctx, &cfg);
    int pol = r->a->decode != FERRY_DECODE_AUTO ? (int)r->a->decode : cfg.decode;
    *b = NULL;
    if (pol == FERRY_DECODE_CPU) return 0;
    if (r->device < 0) {
        if (pol == FERRY_DECODE_GPU)
            return ferry_seterr(FERRY_EPATH, "ferry_image_batch: decode=gpu needs a device destination");
        return 0;
    }
    const char *why = NULL;
    char msg[900];
    ferry_cuda_img_params p = {1, 1, 3, 0, 0, {0, 0, 0}, {0, 0, 0}};
    if (ferry_cuda_image_xform_batch(r->device, 0, 0, &p, r->stream) < 0) why = "the image transform kernel is not loaded";
    else if (ferry_nvj_batch_open(r->device, b) < 0) {
        snprintf(msg, sizeof msg, "%s", ferry_lasterr());
        why = msg;
    }
    if (why) {
        if (pol == FERRY_DECODE_GPU) return ferry_seterr(FERRY_EPATH, "ferry_image_batch: decode=gpu: %s", why);
        return 0;
    }
    r->gpu = 1;
    r->cpu_takes_gpu_items = pol == FERRY_DECODE_AUTO;
    return 0;
}

static int close_up(run *r, size_t *written) {
    size_t j = 0;
    int rc = 0;
    for (size_t i = 0; i < r->n; i++) {
        if (r->it[i].rc) continue;
        if (j != i) {
            if (r->device < 0) memmove(ferry_imgb_row(r, j), ferry_imgb_row(r, i), r->row);
            else if (!rc) {
                ferry_cu_memcpy2d c;
                memset(&c, 0, sizeof c);
                c.srcMemoryType = c.dstMemoryType = FERRY_CU_MEMORYTYPE_DEVICE;
                c.srcDevice = (CUdeviceptr)(uintptr_t)ferry_imgb_row(r, i);
                c.dstDevice = (CUdeviceptr)(uintptr_t)ferry_imgb_row(r, j);
                c.srcPitch = c.dstPitch = c.WidthInBytes = r->row;
                c.Height = 1;
                CUresult cr = r->cu->Memcpy2DAsync(&c, r->stream);
                if (cr) rc = ferry_seterr(FERRY_ECUDA, "ferry_image_batch: moving row %zu to %zu: %s", i, j,
                                          ferry_cuda_errstr(cr));
            }
        }
        j++;
    }
    *written = j;
    return rc;
}

int64_t ferry_image_batch(ferry_ctx *ctx, const ferry_image_batch_args *a, ferry_image_batch_stats *stats) {
    run r;
    memset(&r, 0, sizeof r);
    size_t written = 0, nskip = 0;
    int rc = check_args(ctx, a, &r);
    if (rc < 0) return rc;
    r.ctx = ctx;
    r.a = a;
    r.n = a->n;
    r.stream = (CUstream)a->stream;
    size_t *skipped_out = stats ? stats->skipped : NULL;
    if (stats) memset(stats, 0, sizeof *stats);
    if (stats) stats->skipped = skipped_out;
    if (!r.n) return 0;
    int threads = a->threads;
    if (threads == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c < 1 ? 1 : c > 16 ? 16 : (int)c;
    }
    if (threads > FERRY_IMGB_THREADS_MAX) threads = FERRY_IMGB_THREADS_MAX;
    CUcontext saved = NULL;
    if (r.device >= 0) {
        const char *why = NULL;
        if (!(r.cu = ferry_cuda_load(&why))) return ferry_seterr(FERRY_ENOCUDA, "ferry_image_batch: %s", why);
        saved = ferry_cuda_current();
        if ((rc = ferry_cuda_use_device(r.device)) < 0) return rc;
    }
    ferry_nvj_batch *b = NULL;
    if ((rc = choose(&r, &b)) < 0) {
        if (r.device >= 0) ferry_cuda_restore(saved);
        return rc;
    }
    if (r.device >= 0) {   /* the kernel also transforms what the CPU decodes; the device's kept memory */
        ferry_cuda_img_params p = ferry_imgb_params(&r);
        r.kernel = ferry_cuda_image_xform_batch(r.device, 0, 0, &p, r.stream) == 0;
        if ((rc = ferry_imgb_dev_take(&r)) < 0) goto out;
    }
    r.it = calloc(r.n, sizeof *r.it);
    r.cpu_list = calloc(r.n, sizeof *r.cpu_list);
    r.gpu_list = calloc(r.n, sizeof *r.gpu_list);
    if (!r.it || !r.cpu_list || !r.gpu_list) {
        rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
        goto out;
    }
    pthread_mutex_init(&r.mu, NULL);
    atomic_init(&r.next, 0);
    atomic_init(&r.next_worker, 0);
    atomic_init(&r.failed, 0);
    size_t nt = (size_t)threads < r.n ? (size_t)threads : r.n;
    double t_start = now_s();
    on_threads((int)nt, prepare_worker, &r, 1);
    double t_prepared = now_s();
    for (size_t i = 0; i < r.n; i++) {
        if (r.it[i].rc) continue;
        if (r.gpu && r.it[i].reason < 0) r.gpu_list[r.ngpu++] = i;
        else r.cpu_list[r.ncpu++] = i;
    }
    /* phase 2: the CPU threads beside the feeder (the caller), or the caller among them */
    r.gpu_end = r.ngpu;
    size_t cpu_work = r.ncpu + (r.gpu && !r.cpu_takes_gpu_items ? 0 : r.ngpu);
    int ncpu_threads = (int)((size_t)threads < cpu_work ? (size_t)threads : cpu_work);
    r.cpu_active = ncpu_threads;
    if (r.gpu) {
        pthread_t t[64];
        size_t first[FERRY_IMGB_RUN_MAX];
        int started = 0, k0 = ferry_imgb_gpu_claim(&r, first);
        for (; started < ncpu_threads && started < 64; started++)
            if (pthread_create(&t[started], NULL, cpu_worker, &r) != 0) break;
        pthread_mutex_lock(&r.mu);
        r.cpu_active -= ncpu_threads - started;   /* those that did not start (those that did may be done) */
        pthread_mutex_unlock(&r.mu);
        gpu_feeder(&r, b, first, k0);
        if (started == 0) { r.cpu_active = 1; cpu_worker(&r); }   /* no thread started: the caller does it */
        for (int k = 0; k < started; k++) pthread_join(t[k], NULL);
    } else if (ncpu_threads > 0) {
        on_threads(ncpu_threads, cpu_worker, &r, 1);
    }
    pthread_mutex_destroy(&r.mu);
    /* the first failure (by position) */
    size_t bad = r.n, fatal = r.n;
    for (size_t i = 0; i < r.n && bad == r.n; i++)
        if (r.it[i].rc) bad = i;
    for (size_t i = 0; i < r.n && fatal == r.n; i++)
        if (r.it[i].fatal) fatal = i;
    if (fatal < r.n) bad = fatal;
    written = r.n;
    if (bad < r.n && (a->on_error == FERRY_ON_ERROR_RAISE || fatal < r.n)) {
        rc = ferry_seterr(r.it[bad].rc, "%s", r.it[bad].msg ? r.it[bad].msg : "image batch: failed");
    } else if (bad < r.n) {
        rc = close_up(&r, &written);
        for (size_t i = 0; i < r.n; i++)
            if (r.it[i].rc) {
                if (skipped_out) skipped_out[nskip] = i;
                nskip++;
            }
    }
    if (r.device >= 0) {   /* the rows are there, and the scratch is free to go */
        CUresult cr = r.cu->StreamSynchronize(r.stream);
        if (cr && rc >= 0) rc = ferry_seterr(FERRY_ECUDA, "ferry_image_batch: the stream failed: %s", ferry_cuda_errstr(cr));
    }
    ferry_image_batch_stats st;
    memset(&st, 0, sizeof st);
    for (size_t i = 0; i < r.n; i++) {
        const item *t = &r.it[i];
        if (t->by == 1) st.gpu++;
        if (t->by == 1 && t->hw) st.gpu_hw++;
        if (t->by == 2) st.cpu++;
        if (t->by == 2 && t->fellback && t->reason >= 0) st.fallbacks[t->reason]++;
    }
    st.written = written;
    st.nskipped = nskip;
    st.seconds = now_s() - t_start;
    st.prepare_s = t_prepared - t_start;
    st.cpu_decode_s = r.cpu_s;
    st.gpu_s = r.gpu_s;
    st.wait_s = r.wait_s;
    st.skipped = skipped_out;
    if (stats) *stats = st;
    uint64_t fb = 0;
    for (int k = 0; k < FERRY_IMAGE_FB_COUNT_; k++) fb += st.fallbacks[k];
    pthread_mutex_lock(&ctx->stats_lock);
    ctx->stats.image_gpu += st.gpu;
    ctx->stats.image_cpu += st.cpu;
    ctx->stats.image_skipped += nskip;
    ctx->stats.image_fallbacks += fb;
    pthread_mutex_unlock(&ctx->stats_lock);
out:
    if (r.device >= 0) {
        ferry_imgb_dev_give(&r);   /* the stream has run (or nothing ran on the device memory) */
        ferry_cuda_restore(saved);
    }
    for (size_t i = 0; r.it && i < r.n; i++) {
        free(r.it[i].data);
        free(r.it[i].msg);
    }
    free(r.it);
    free(r.cpu_list);
    free(r.gpu_list);
    ferry_nvj_batch_close(b);
    return rc < 0 ? rc : (int64_t)written;
}
