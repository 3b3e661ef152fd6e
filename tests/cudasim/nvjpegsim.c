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
 * nvjpegsim_count(what): "decodes", "bad_pointer", "state_shared",
 * "live_states" for the tests. */
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

struct nvjpegHandle { atomic_int states; int magic; };
struct nvjpegJpegState { struct nvjpegHandle *h; atomic_int busy; int magic; };
#define H_MAGIC 0x4e564a48
#define S_MAGIC 0x4e564a53

CUresult cuLaunchHostFunc(CUstream s, void (*fn)(void *), void *arg);
int cudasim_is_device(CUdeviceptr p, size_t n);

static atomic_long n_decodes_, n_bad_ptr_, n_shared_, n_live_;
long nvjpegsim_count(const char *what) {
    if (!strcmp(what, "decodes")) return atomic_load(&n_decodes_);
    if (!strcmp(what, "bad_pointer")) return atomic_load(&n_bad_ptr_);
    if (!strcmp(what, "state_shared")) return atomic_load(&n_shared_);
    if (!strcmp(what, "live_states")) return atomic_load(&n_live_);
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
