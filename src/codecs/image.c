/* image.c — ferry_image_*: pick the decoder by signature, check sizes, and
 * decode batches on threads.
 *
 * A batch runs on the caller's thread and threads-1 threads started for the
 * call, each claiming the next image from a shared counter: images differ in
 * size, so claiming one at a time keeps the threads busy to the end. (The
 * engine's worker pool runs I/O plans; a decode batch is short CPU work that
 * needs none of its staging, so it does not queue behind reads.) */
#include "codecs/image.h"
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

ferry_image_format ferry_image_sniff(const void *data, size_t n) {
    const uint8_t *p = data;
    if (!p) return FERRY_IMAGE_UNKNOWN;
    if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return FERRY_IMAGE_JPEG;
    if (n >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8)) return FERRY_IMAGE_PNG;
    return FERRY_IMAGE_UNKNOWN;
}

int ferry_image_probe(const void *data, size_t n, ferry_image_info *out) {
    if (!data || !out) return ferry_seterr(FERRY_EINVAL, "ferry_image_probe: NULL argument");
    int rc;
    switch (ferry_image_sniff(data, n)) {
    case FERRY_IMAGE_JPEG: rc = ferry_jpeg_probe(data, n, out); break;
    case FERRY_IMAGE_PNG: rc = ferry_png_probe(data, n, out); break;
    default:
        return ferry_seterr(FERRY_EUNSUPPORTED, "not a JPEG or PNG image (first bytes %02X %02X %02X %02X)",
                            n > 0 ? ((const uint8_t *)data)[0] : 0, n > 1 ? ((const uint8_t *)data)[1] : 0,
                            n > 2 ? ((const uint8_t *)data)[2] : 0, n > 3 ? ((const uint8_t *)data)[3] : 0);
    }
    if (rc < 0) return rc;
    if (!out->width || !out->height || out->width > FERRY_IMAGE_MAX_SIDE || out->height > FERRY_IMAGE_MAX_SIDE ||
        (uint64_t)out->width * out->height > FERRY_IMAGE_MAX_PIXELS)
        return ferry_seterr(FERRY_EUNSUPPORTED, "image of %u x %u pixels: ferry decodes up to %llu pixels, %u a side",
                            out->width, out->height, (unsigned long long)FERRY_IMAGE_MAX_PIXELS, FERRY_IMAGE_MAX_SIDE);
    return 0;
}

int ferry_image_out_channels(const ferry_image_info *info, unsigned flags) {
    if (!info) return ferry_seterr(FERRY_EINVAL, "ferry_image_out_channels: info is NULL");
    return (flags & FERRY_IMAGE_KEEP_GRAY) && info->channels <= 2 && !info->cmyk ? 1 : 3;
}

/* Probe, and check flags and the destination's size: the output channels, or a code. */
static int decode_setup(const char *what, const void *data, size_t n, const void *dst, size_t cap, unsigned flags,
                        ferry_image_info *in) {
    if (flags & ~(unsigned)FERRY_IMAGE_KEEP_GRAY) return ferry_seterr(FERRY_EINVAL, "%s: flags 0x%x", what, flags);
    int rc = ferry_image_probe(data, n, in);
    if (rc < 0) return rc;
    int ch = ferry_image_out_channels(in, flags);
    uint64_t need = (uint64_t)in->width * in->height * (uint64_t)ch;
    if (!dst || cap < need)
        return ferry_seterr(FERRY_EINVAL, "a %u x %u x %d image needs %llu bytes; the buffer has %zu", in->height,
                            in->width, ch, (unsigned long long)need, dst ? cap : 0);
    return ch;
}

int64_t ferry_image_decode(const void *data, size_t n, void *dst, size_t cap, unsigned flags, ferry_image_info *info) {
    ferry_image_info tmp, *in = info ? info : &tmp;
    int ch = decode_setup("ferry_image_decode", data, n, dst, cap, flags, in);
    if (ch < 0) return ch;
    int rc = in->format == FERRY_IMAGE_JPEG ? ferry_jpeg_decode(data, n, in, ch, dst) : ferry_png_decode(data, n, in, ch, dst);
    return rc < 0 ? rc : (int64_t)in->width * in->height * ch;
}

int64_t ferry_image_decode_region(const void *data, size_t n, void *dst, size_t cap, unsigned flags,
                                  const ferry_img_box *want, ferry_img_box *got, ferry_image_info *info) {
    ferry_image_info tmp, *in = info ? info : &tmp;
    if (!want || !got) return ferry_seterr(FERRY_EINVAL, "ferry_image_decode_region: NULL box");
    int ch = decode_setup("ferry_image_decode_region", data, n, dst, cap, flags, in);
    if (ch < 0) return ch;
    if (!want->w || !want->h || want->x >= in->width || want->y >= in->height || want->w > in->width - want->x ||
        want->h > in->height - want->y)
        return ferry_seterr(FERRY_EINVAL, "ferry_image_decode_region: box (y %u, x %u, %u x %u) outside the %u x %u "
                            "image", want->y, want->x, want->h, want->w, in->height, in->width);
    int rc;
    if (in->format == FERRY_IMAGE_JPEG) {
        rc = ferry_jpeg_decode_region(data, n, in, ch, want, got, dst);
    } else {
        *got = (ferry_img_box){0, 0, in->height, in->width};
        rc = ferry_png_decode(data, n, in, ch, dst);
    }
    return rc < 0 ? rc : (int64_t)got->h * got->w * ch;
}

/* ---- batches ------------------------------------------------------------- */
typedef struct batch {
    ferry_image_job *jobs;
    size_t n;
    unsigned flags;
    atomic_size_t next;
    pthread_mutex_t lock;
    size_t first_bad;        /* lowest failing index, n when none */
    char msg[1024];          /* its message */
} batch;

static void *batch_run(void *arg) {
    batch *b = arg;
    for (size_t i; (i = atomic_fetch_add(&b->next, 1)) < b->n;) {
        ferry_image_job *j = &b->jobs[i];
        memset(&j->info, 0, sizeof j->info);
        j->result = ferry_image_decode(j->data, j->size, j->dst, j->cap, b->flags, &j->info);
        if (j->result < 0) {
            if (j->label) ferry_preerr((int)j->result, "%s", j->label);
            pthread_mutex_lock(&b->lock);
            if (i < b->first_bad) {
                b->first_bad = i;
                snprintf(b->msg, sizeof b->msg, "%s", ferry_lasterr());
            }
            pthread_mutex_unlock(&b->lock);
        }
    }
    return NULL;
}

int64_t ferry_image_decode_batch(ferry_image_job *jobs, size_t n, unsigned flags, int threads) {
    if (!jobs && n) return ferry_seterr(FERRY_EINVAL, "ferry_image_decode_batch: jobs is NULL");
    if (n > INT64_MAX) return ferry_seterr(FERRY_EINVAL, "ferry_image_decode_batch: n too large");
    if (threads < 0) return ferry_seterr(FERRY_EINVAL, "ferry_image_decode_batch: threads %d", threads);
    if (threads == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c < 1 ? 1 : c > 16 ? 16 : (int)c;
    }
    if ((size_t)threads > n) threads = n ? (int)n : 1;
    batch b = {.jobs = jobs, .n = n, .flags = flags, .first_bad = n};
    atomic_init(&b.next, 0);
    pthread_mutex_init(&b.lock, NULL);
    pthread_t *t = threads > 1 ? calloc((size_t)threads - 1, sizeof *t) : NULL;
    int started = 0;
    for (int k = 0; t && k < threads - 1; k++, started++)
        if (pthread_create(&t[k], NULL, batch_run, &b) != 0) break;   /* fewer threads: the rest still runs */
    batch_run(&b);
    for (int k = 0; k < started; k++) pthread_join(t[k], NULL);
    free(t);
    pthread_mutex_destroy(&b.lock);
    if (b.first_bad < n) {
        ferry_seterr((int)jobs[b.first_bad].result, "%s", b.msg);
        return jobs[b.first_bad].result;
    }
    return (int64_t)n;
}
