/* nvjpegsim.c — a stand-in libnvjpeg.so.12 for machines without a GPU: the
 * single-image calls ferry makes (nvjpegCreateSimple, nvjpegJpegStateCreate,
 * nvjpegGetImageInfo, nvjpegDecode to interleaved RGB, the destroys), decoded
 * on the CPU by libjpeg-turbo, with nvJPEG's signatures and status codes. Like
 * cudasim.c it keeps the rules ferry's correctness rests on and is stricter
 * where the real library would be undefined:
 *
 * - A state belongs to the handle that made it and is used by one thread at a
 *   time (the real library's rule: a second decode on the same state from
 *   another thread while one runs is counted as "state_shared" and fails);
 *   destroying a handle with live states fails (NVJPEG_STATUS_INVALID_PARAMETER).
 * - nvjpegDecode's destination must lie inside a cuMemAlloc allocation (pitch
 *   x height bytes of channel[0], pitch >= 3 x width); the pixels are written
 *   on the caller's stream (cuLaunchHostFunc of the stand-in driver), after
 *   the work queued before the call: a caller that reads them without
 *   ordering after the stream gets what was there before.
 * - Corrupt data is NVJPEG_STATUS_BAD_JPEG, found on the host before anything
 *   is queued (the real library parses on the host too); libjpeg's warnings
 *   count as corrupt. Formats other than RGBI: NVJPEG_STATUS_INVALID_PARAMETER.
 *
 * The batched calls (nvjpegCreateEx, nvjpegJpegStreamCreate/Parse/Destroy,
 * nvjpegDecodeBatchedSupported, nvjpegDecodeBatchedInitialize,
 * nvjpegDecodeBatched) keep the real library's rules too:
 * - nvjpegCreateEx takes the backends DEFAULT, HYBRID, GPU_HYBRID and
 *   HARDWARE; HARDWARE fails with NVJPEG_STATUS_ARCH_MISMATCH when
 *   NVJPEGSIM_NO_HW=1 (a device without a JPEG engine).
 * - nvjpegDecodeBatchedSupported needs a stream parsed by
 *   nvjpegJpegStreamParse and answers 0 for "supported": on the hardware
 *   backend baseline single-scan JPEGs of 4:4:4, 4:2:2, 4:2:0, 4:4:0 or gray;
 *   four-component JPEGs nowhere.
 * - nvjpegDecodeBatched needs its state initialised
 *   (nvjpegDecodeBatchedInitialize, same handle, RGBI) and decodes exactly
 *   that batch size, call after call; a failed call leaves the state to be
 *   initialised again (a call before that counts as "uninitialized" and
 *   fails, as does one on a state never initialised). The whole batch is
 *   checked on the host before anything is written: one bad image fails the
 *   call (BAD_JPEG) and nothing is queued; an image the hardware backend
 *   cannot take is NVJPEG_STATUS_JPEG_NOT_SUPPORTED there.
 * - The hardware backend writes its output when the call is made, not in
 *   stream order, as the real one does on H100s: a call made while the
 *   stream still has work queued counts as "hw_unordered" (a caller's bug).
 *   The other backends write on the stream.
 *
 * nvjpegsim_count(what): "decodes", "bad_pointer", "state_shared",
 * "live_states", "batched_calls", "hw_images", "hw_unordered",
 * "uninitialized" for the tests. */
#include "cuda/cuda.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

typedef int nvjpegStatus_t;
enum { S_OK = 0, S_NOT_INIT = 1, S_INVALID = 2, S_BAD_JPEG = 3, S_NOT_SUPPORTED = 4, S_ALLOC = 5 };
enum { OUT_RGBI = 5 };
enum { CSS_444 = 0, CSS_422 = 1, CSS_420 = 2, CSS_440 = 3, CSS_411 = 4, CSS_410 = 5, CSS_GRAY = 6, CSS_UNKNOWN = -1 };
#define MAXC 4
typedef struct { unsigned char *channel[MAXC]; size_t pitch[MAXC]; } nvjpegImage_t;

struct nvjpegHandle { atomic_int states; int magic; int backend; };
struct nvjpegJpegState { struct nvjpegHandle *h; atomic_int busy; int magic; int batch, fmt; };
struct nvjpegJpegStream { struct nvjpegHandle *h; int magic, parsed, progressive, ss, ncomp; };
#define J_MAGIC 0x4e564a4a
enum { BACKEND_DEFAULT = 0, BACKEND_HARDWARE = 3, S_ARCH = 7 };
#define H_MAGIC 0x4e564a48
#define S_MAGIC 0x4e564a53

CUresult cuLaunchHostFunc(CUstream s, void (*fn)(void *), void *arg);
int cudasim_stream_pending(CUstream s);
int cudasim_is_device(CUdeviceptr p, size_t n);

static atomic_long n_decodes_, n_bad_ptr_, n_shared_, n_live_, n_batched_, n_hw_, n_unordered_, n_uninit_;
long nvjpegsim_count(const char *what) {
    if (!strcmp(what, "decodes")) return atomic_load(&n_decodes_);
    if (!strcmp(what, "bad_pointer")) return atomic_load(&n_bad_ptr_);
    if (!strcmp(what, "state_shared")) return atomic_load(&n_shared_);
    if (!strcmp(what, "live_states")) return atomic_load(&n_live_);
    if (!strcmp(what, "batched_calls")) return atomic_load(&n_batched_);
    if (!strcmp(what, "hw_images")) return atomic_load(&n_hw_);
    if (!strcmp(what, "hw_unordered")) return atomic_load(&n_unordered_);
    if (!strcmp(what, "uninitialized")) return atomic_load(&n_uninit_);
    return -1;
}

nvjpegStatus_t nvjpegGetProperty(int type, int *value) {
    if (!value) return S_INVALID;
    *value = type == 0 ? 12 : type == 1 ? 4 : 0;   /* MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL */
    return S_OK;
}

nvjpegStatus_t nvjpegCreateSimple(struct nvjpegHandle **out) {
    if (!out) return S_INVALID;
    struct nvjpegHandle *h = calloc(1, sizeof *h);
    if (!h) return S_ALLOC;
    h->magic = H_MAGIC;
    *out = h;
    return S_OK;
}

nvjpegStatus_t nvjpegDestroy(struct nvjpegHandle *h) {
    if (!h || h->magic != H_MAGIC || atomic_load(&h->states)) return S_INVALID;
    h->magic = 0;
    free(h);
    return S_OK;
}

nvjpegStatus_t nvjpegJpegStateCreate(struct nvjpegHandle *h, struct nvjpegJpegState **out) {
    if (!h || h->magic != H_MAGIC || !out) return S_INVALID;
    struct nvjpegJpegState *s = calloc(1, sizeof *s);
    if (!s) return S_ALLOC;
    s->h = h;
    s->magic = S_MAGIC;
    atomic_fetch_add(&h->states, 1);
    atomic_fetch_add(&n_live_, 1);
    *out = s;
    return S_OK;
}

nvjpegStatus_t nvjpegJpegStateDestroy(struct nvjpegJpegState *s) {
    if (!s || s->magic != S_MAGIC) return S_INVALID;
    atomic_fetch_sub(&s->h->states, 1);
    atomic_fetch_sub(&n_live_, 1);
    s->magic = 0;
    free(s);
    return S_OK;
}

nvjpegStatus_t nvjpegGetImageInfo(struct nvjpegHandle *h, const unsigned char *data, size_t length, int *ncomp,
                                  int *subsampling, int *widths, int *heights) {
    if (!h || h->magic != H_MAGIC || !data || !length || !ncomp || !subsampling || !widths || !heights) return S_INVALID;
    tjhandle t = tjInitDecompress();
    int w, ht, ss, cs;
    int rc = tjDecompressHeader3(t, data, length, &w, &ht, &ss, &cs);
    tjDestroy(t);
    if (rc) return S_BAD_JPEG;
    static const int css[] = {CSS_444, CSS_422, CSS_420, CSS_GRAY, CSS_440, CSS_411};
    *ncomp = cs == TJCS_GRAY ? 1 : (cs == TJCS_CMYK || cs == TJCS_YCCK) ? 4 : 3;
    *subsampling = ss >= 0 && ss < 6 ? css[ss] : CSS_UNKNOWN;
    for (int c = 0; c < MAXC; c++) { widths[c] = c < *ncomp ? w : 0; heights[c] = c < *ncomp ? ht : 0; }
    return S_OK;
}

typedef struct put_op {
    unsigned char *dst;
    size_t pitch;
    int w, h;
    unsigned char *rgb;
} put_op;

static void put_run(void *arg) {
    put_op *p = arg;
    for (int y = 0; y < p->h; y++) memcpy(p->dst + (size_t)y * p->pitch, p->rgb + (size_t)y * p->w * 3, (size_t)p->w * 3);
    free(p->rgb);
    free(p);
}

nvjpegStatus_t nvjpegDecode(struct nvjpegHandle *h, struct nvjpegJpegState *s, const unsigned char *data, size_t length,
                            int output_format, nvjpegImage_t *dst, CUstream stream) {
    if (!h || h->magic != H_MAGIC || !s || s->magic != S_MAGIC || s->h != h || !data || !length || !dst)
        return S_INVALID;
    if (output_format != OUT_RGBI) return S_INVALID;
    if (atomic_exchange(&s->busy, 1)) { atomic_fetch_add(&n_shared_, 1); return S_INVALID; }
    nvjpegStatus_t rc = S_OK;
    tjhandle t = tjInitDecompress();
    int w, ht, ss, cs;
    unsigned char *rgb = NULL;
    if (tjDecompressHeader3(t, data, length, &w, &ht, &ss, &cs)) rc = S_BAD_JPEG;
    else if (cs == TJCS_CMYK || cs == TJCS_YCCK) rc = S_NOT_SUPPORTED;
    else if (dst->pitch[0] < (size_t)w * 3 ||
             !cudasim_is_device((CUdeviceptr)(uintptr_t)dst->channel[0], dst->pitch[0] * (size_t)ht)) {
        atomic_fetch_add(&n_bad_ptr_, 1);
        rc = S_INVALID;
    } else if (!(rgb = malloc((size_t)w * ht * 3))) rc = S_ALLOC;
    else if (tjDecompress2(t, data, length, rgb, w, w * 3, ht, TJPF_RGB, TJFLAG_STOPONWARNING | TJFLAG_ACCURATEDCT))
        rc = S_BAD_JPEG;
    tjDestroy(t);
    if (rc == S_OK) {
        put_op *p = malloc(sizeof *p);
        *p = (put_op){dst->channel[0], dst->pitch[0], w, ht, rgb};
        if (cuLaunchHostFunc(stream, put_run, p) != 0) { free(p); rc = S_INVALID; }
        else { rgb = NULL; atomic_fetch_add(&n_decodes_, 1); }
    }
    free(rgb);
    atomic_store(&s->busy, 0);
    return rc;
}

/* ---- the batched API --------------------------------------------------------- */
nvjpegStatus_t nvjpegCreateEx(int backend, void *dev_allocator, void *pinned_allocator, unsigned flags,
                              struct nvjpegHandle **out) {
    (void)dev_allocator; (void)pinned_allocator; (void)flags;
    if (!out || backend < 0 || backend > BACKEND_HARDWARE) return S_INVALID;
    const char *nohw = getenv("NVJPEGSIM_NO_HW");
    if (backend == BACKEND_HARDWARE && nohw && !strcmp(nohw, "1")) return S_ARCH;
    nvjpegStatus_t rc = nvjpegCreateSimple(out);
    if (rc == S_OK) (*out)->backend = backend;
    return rc;
}

nvjpegStatus_t nvjpegJpegStreamCreate(struct nvjpegHandle *h, struct nvjpegJpegStream **out) {
    if (!h || h->magic != H_MAGIC || !out) return S_INVALID;
    struct nvjpegJpegStream *j = calloc(1, sizeof *j);
    if (!j) return S_ALLOC;
    j->h = h;
    j->magic = J_MAGIC;
    *out = j;
    return S_OK;
}

nvjpegStatus_t nvjpegJpegStreamDestroy(struct nvjpegJpegStream *j) {
    if (!j || j->magic != J_MAGIC) return S_INVALID;
    j->magic = 0;
    free(j);
    return S_OK;
}

/* SOF2 (progressive) among the segments before the first scan */
static int is_progressive(const unsigned char *p, size_t n) {
    size_t i = 2;
    while (i + 4 <= n && p[i] == 0xFF) {
        unsigned char t = p[i + 1];
        if (t == 0xFF) { i++; continue; }
        if (t == 0xC2) return 1;
        if (t == 0xDA) break;
        i += 2 + (((size_t)p[i + 2] << 8) | p[i + 3]);
    }
    return 0;
}

/* header facts: 0, or S_BAD_JPEG */
static int header(const unsigned char *data, size_t length, int *w, int *ht, int *ss, int *cs) {
    tjhandle t = tjInitDecompress();
    int rc = tjDecompressHeader3(t, data, (unsigned long)length, w, ht, ss, cs);
    tjDestroy(t);
    return rc ? S_BAD_JPEG : S_OK;
}

nvjpegStatus_t nvjpegJpegStreamParse(struct nvjpegHandle *h, const unsigned char *data, size_t length,
                                     int save_metadata, int save_stream, struct nvjpegJpegStream *j) {
    (void)save_metadata; (void)save_stream;
    if (!h || h->magic != H_MAGIC || !j || j->magic != J_MAGIC || !data || !length) return S_INVALID;
    int w, ht, ss, cs;
    j->parsed = 0;
    if (header(data, length, &w, &ht, &ss, &cs)) return S_BAD_JPEG;
    j->parsed = 1;
    j->progressive = is_progressive(data, length);
    j->ss = ss;
    j->ncomp = cs == TJCS_GRAY ? 1 : (cs == TJCS_CMYK || cs == TJCS_YCCK) ? 4 : 3;
    return S_OK;
}

static int hw_takes(int progressive, int ss, int ncomp) {
    return !progressive && ncomp != 4 && (ss == TJSAMP_444 || ss == TJSAMP_422 || ss == TJSAMP_420 ||
                                          ss == TJSAMP_440 || ss == TJSAMP_GRAY);
}

nvjpegStatus_t nvjpegDecodeBatchedSupported(struct nvjpegHandle *h, struct nvjpegJpegStream *j, int *is_supported) {
    if (!h || h->magic != H_MAGIC || !j || j->magic != J_MAGIC || !j->parsed || !is_supported) return S_INVALID;
    int ok = h->backend == BACKEND_HARDWARE ? hw_takes(j->progressive, j->ss, j->ncomp) : j->ncomp != 4;
    *is_supported = ok ? 0 : 1;   /* 0: supported */
    return S_OK;
}

nvjpegStatus_t nvjpegDecodeBatchedInitialize(struct nvjpegHandle *h, struct nvjpegJpegState *s, int batch_size,
                                             int max_cpu_threads, int output_format) {
    if (!h || h->magic != H_MAGIC || !s || s->magic != S_MAGIC || s->h != h || batch_size <= 0 ||
        max_cpu_threads <= 0 || output_format != OUT_RGBI)
        return S_INVALID;
    s->batch = batch_size;
    s->fmt = output_format;
    return S_OK;
}

typedef struct batch_put { int n; put_op ops[]; } batch_put;
static void batch_run(void *arg) {
    batch_put *b = arg;
    for (int i = 0; i < b->n; i++) {
        put_op *p = &b->ops[i];
        for (int y = 0; y < p->h; y++)
            memcpy(p->dst + (size_t)y * p->pitch, p->rgb + (size_t)y * p->w * 3, (size_t)p->w * 3);
        free(p->rgb);
    }
    free(b);
}

nvjpegStatus_t nvjpegDecodeBatched(struct nvjpegHandle *h, struct nvjpegJpegState *s, const unsigned char *const *data,
                                   const size_t *lengths, nvjpegImage_t *dst, CUstream stream) {
    if (!h || h->magic != H_MAGIC || !s || s->magic != S_MAGIC || s->h != h || !data || !lengths || !dst)
        return S_INVALID;
    if (s->batch <= 0) { atomic_fetch_add(&n_uninit_, 1); return S_INVALID; }
    if (atomic_exchange(&s->busy, 1)) { atomic_fetch_add(&n_shared_, 1); return S_INVALID; }
    int n = s->batch, hw = h->backend == BACKEND_HARDWARE;
    batch_put *b = calloc(1, sizeof *b + (size_t)n * sizeof(put_op));
    nvjpegStatus_t rc = b ? S_OK : S_ALLOC;
    tjhandle t = tjInitDecompress();
    for (int i = 0; rc == S_OK && i < n; i++) {
        int w, ht, ss, cs;
        if (!data[i] || !lengths[i]) { rc = S_INVALID; break; }
        if (header(data[i], lengths[i], &w, &ht, &ss, &cs)) { rc = S_BAD_JPEG; break; }
        int ncomp = cs == TJCS_GRAY ? 1 : (cs == TJCS_CMYK || cs == TJCS_YCCK) ? 4 : 3;
        if (ncomp == 4 || (hw && !hw_takes(is_progressive(data[i], lengths[i]), ss, ncomp))) { rc = S_NOT_SUPPORTED; break; }
        if (dst[i].pitch[0] < (size_t)w * 3 ||
            !cudasim_is_device((CUdeviceptr)(uintptr_t)dst[i].channel[0], dst[i].pitch[0] * (size_t)ht)) {
            atomic_fetch_add(&n_bad_ptr_, 1);
            rc = S_INVALID;
            break;
        }
        unsigned char *rgb = malloc((size_t)w * ht * 3);
        if (!rgb) { rc = S_ALLOC; break; }
        b->ops[b->n++] = (put_op){dst[i].channel[0], dst[i].pitch[0], w, ht, rgb};
        if (tjDecompress2(t, data[i], (unsigned long)lengths[i], rgb, w, w * 3, ht, TJPF_RGB,
                          TJFLAG_STOPONWARNING | TJFLAG_ACCURATEDCT))
            rc = S_BAD_JPEG;
    }
    tjDestroy(t);
    if (rc == S_OK) {
        atomic_fetch_add(&n_batched_, 1);
        atomic_fetch_add(&n_decodes_, n);
        if (hw) {
            atomic_fetch_add(&n_hw_, n);
            if (cudasim_stream_pending(stream)) atomic_fetch_add(&n_unordered_, 1);
            batch_run(b);   /* now, not in stream order: the real engine's behaviour */
        } else if (cuLaunchHostFunc(stream, batch_run, b) != 0) {
            rc = S_INVALID;
        }
    }
    if (rc != S_OK && b) {
        for (int i = 0; i < b->n; i++) free(b->ops[i].rgb);
        free(b);
    }
    if (rc != S_OK) s->batch = 0;   /* a failed batch: initialised again before the next call */
    atomic_store(&s->busy, 0);
    return rc;
}
