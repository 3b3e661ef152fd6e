/* nvjpeg.c — JPEG decoding on the GPU through nvJPEG, loaded at run time
 * (libnvjpeg.so.13 or .so.12; FERRY_NVJPEG names a file, or "off"), through
 * one table of function pointers, as nvcomp.c loads nvCOMP. Nothing links
 * nvJPEG; its declarations below follow nvjpeg.h (single-image API).
 *
 * Handles and states. One nvjpegHandle per device, made with that device's
 * primary context current and kept for the process (nvJPEG's handles are
 * thread-safe); one nvjpegJpegState per thread (states are not), remade when
 * the thread decodes for another device or a decode failed (a state that saw
 * corrupt data is not reused), destroyed at thread exit.
 *
 * Corrupt data. nvJPEG checks less than libjpeg-turbo does with warnings as
 * errors (a truncated scan may decode as grey), so the header is parsed on
 * the CPU first (ferry_image_probe) and an image without its end-of-image
 * marker after the first scan is refused before nvJPEG sees it: inside
 * entropy-coded data 0xFF is always followed by 0x00 or a restart marker, so
 * FF D9 there is the real end. CMYK images are refused (decode them on the
 * CPU: nvJPEG's CMYK output is not Pillow's conversion). */
#include "cuda/nvjpeg.h"
#include "common.h"
#include "ferry_experimental.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>


#define NVJ_MAX_DEVICES 64
static nvj_api api_;
static const nvj_api *loaded_;
static char why_[700], desc_[700];
static int tried_;
static pthread_mutex_t lock_ = PTHREAD_MUTEX_INITIALIZER;
static nvj_handle handles_[NVJ_MAX_DEVICES];

static void load_locked(void) {
    void *h;
    if (ferry_cuda_lib_named("FERRY_NVJPEG", "nvJPEG", api_.path, sizeof api_.path, why_, sizeof why_, &h) < 0) return;
    static const char *names[] = {"libnvjpeg.so.13", "libnvjpeg.so.12"};
    for (int i = 0; !h && i < 2; i++) {
        snprintf(api_.path, sizeof api_.path, "%s", names[i]);
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
        snprintf(why_, sizeof why_, "libnvjpeg.so.13 / .so.12 not found (FERRY_NVJPEG, system paths; "
                 "pip install nvidia-nvjpeg-cu13)");
        return;
    }
#define SYM(f, name) do { \
        *(void **)&api_.f = dlsym(h, name); \
        if (!api_.f) { snprintf(why_, sizeof why_, "%s lacks %s", api_.path, name); dlclose(h); return; } \
    } while (0)
    SYM(CreateSimple, "nvjpegCreateSimple");
    SYM(Destroy, "nvjpegDestroy");
    SYM(JpegStateCreate, "nvjpegJpegStateCreate");
    SYM(JpegStateDestroy, "nvjpegJpegStateDestroy");
    SYM(Decode, "nvjpegDecode");
#undef SYM
    *(void **)&api_.GetProperty = dlsym(h, "nvjpegGetProperty");
    /* the batched calls (ferry_image_batch): all or none */
    *(void **)&api_.CreateEx = dlsym(h, "nvjpegCreateEx");
    *(void **)&api_.DecodeBatchedInitialize = dlsym(h, "nvjpegDecodeBatchedInitialize");
    *(void **)&api_.DecodeBatched = dlsym(h, "nvjpegDecodeBatched");
    *(void **)&api_.JpegStreamCreate = dlsym(h, "nvjpegJpegStreamCreate");
    *(void **)&api_.JpegStreamDestroy = dlsym(h, "nvjpegJpegStreamDestroy");
    *(void **)&api_.JpegStreamParse = dlsym(h, "nvjpegJpegStreamParse");
    *(void **)&api_.DecodeBatchedSupported = dlsym(h, "nvjpegDecodeBatchedSupported");
    api_.batched = api_.CreateEx && api_.DecodeBatchedInitialize && api_.DecodeBatched && api_.JpegStreamCreate &&
                   api_.JpegStreamDestroy && api_.JpegStreamParse && api_.DecodeBatchedSupported;
    if (api_.GetProperty) {
        api_.GetProperty(NVJ_PROP_MAJOR, &api_.major);
        api_.GetProperty(NVJ_PROP_MINOR, &api_.minor);
    }
    snprintf(desc_, sizeof desc_, "loaded nvJPEG %d.%d from %s", api_.major, api_.minor, api_.path);
    loaded_ = &api_;   /* the library stays open for the life of the process */
}

static const nvj_api *nvj_load(void) {
    if (!__atomic_load_n(&tried_, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&lock_);
        if (!tried_) {
            load_locked();
            __atomic_store_n(&tried_, 1, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&lock_);
    }
    return loaded_;
}

const char *ferry_nvjpeg_status(void) { return nvj_load() ? desc_ : why_; }
const nvj_api *ferry_nvjpeg_api(void) { return nvj_load(); }

static const char *nvj_name(nvj_status s) {
    static const char *const n[] = {"success", "not initialized", "invalid parameter", "bad jpeg",
                                    "jpeg not supported", "allocator failure", "execution failed",
                                    "arch mismatch", "internal error", "implementation not supported",
                                    "incomplete bitstream"};
    return s >= 0 && s <= NVJ_INCOMPLETE ? n[s] : "unknown status";
}

int ferry_nvjpeg_err(nvj_status s, const char *call) {
    int code = (s == NVJ_BAD_JPEG || s == NVJ_INCOMPLETE) ? FERRY_ECODEC
             : (s == NVJ_NOT_SUPPORTED || s == NVJ_IMPL) ? FERRY_EUNSUPPORTED
             : s == NVJ_ALLOC ? FERRY_ENOMEM : FERRY_ECUDA;
    return ferry_seterr(code, "nvjpeg: %s: %s (%d)", call, nvj_name(s), s);
}

/* ---- per-thread state ------------------------------------------------------ */
typedef struct nvj_tls { nvj_state state; int device; } nvj_tls;
static pthread_key_t key_;
static pthread_once_t key_once_ = PTHREAD_ONCE_INIT;
static void tls_free(void *p) {
    nvj_tls *t = p;
    if (t->state && loaded_) loaded_->JpegStateDestroy(t->state);
    free(t);
}
static void key_make(void) { (void)pthread_key_create(&key_, tls_free); }

static void state_drop(nvj_tls *t) {
    if (t->state) loaded_->JpegStateDestroy(t->state);
    t->state = NULL;
}

/* The device's handle and this thread's state for it (the device's context current). */
static int nvj_get(const nvj_api *nv, int dev, nvj_handle *h, nvj_tls **tls) {
    pthread_mutex_lock(&lock_);
    nvj_status s = handles_[dev] ? NVJ_OK : nv->CreateSimple(&handles_[dev]);
    *h = handles_[dev];
    pthread_mutex_unlock(&lock_);
    if (s != NVJ_OK) return ferry_nvjpeg_err(s, "nvjpegCreateSimple");
    pthread_once(&key_once_, key_make);
    nvj_tls *t = pthread_getspecific(key_);
    if (!t) {
        if (!(t = calloc(1, sizeof *t))) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        if (pthread_setspecific(key_, t) != 0) { free(t); return ferry_seterr(FERRY_ENOMEM, "out of memory"); }
    }
    if (t->state && t->device != dev) state_drop(t);
    if (!t->state) {
        if ((s = nv->JpegStateCreate(*h, &t->state)) != NVJ_OK) { t->state = NULL; return ferry_nvjpeg_err(s, "nvjpegJpegStateCreate"); }
        t->device = dev;
    }
    *tls = t;
    return 0;
}

/* FF D9 after the first scan's start (see the top of the file). */
int ferry_nvjpeg_has_eoi(const uint8_t *p, size_t n) {
    size_t i = 2;
    while (i + 4 <= n && p[i] == 0xFF) {   /* walk the segments to SOS */
        uint8_t t = p[i + 1];
        if (t == 0xFF) { i++; continue; }
        if (t == 0xDA) break;
        i += 2 + (((size_t)p[i + 2] << 8) | p[i + 3]);
    }
    for (; i + 1 < n; i++)
        if (p[i] == 0xFF && p[i + 1] == 0xD9) return 1;
    return 0;
}

int64_t ferry_image_decode_cuda(const void *data, size_t n, int device, uintptr_t dst, size_t cap, void *stream,
                                ferry_image_info *info) {
    ferry_image_info tmp, *in = info ? info : &tmp;
    int rc = ferry_image_probe(data, n, in);   /* (a build without libturbojpeg refuses here) */
    if (rc < 0) return rc;
    if (in->format != FERRY_IMAGE_JPEG)
        return ferry_seterr(FERRY_EUNSUPPORTED, "nvjpeg: not a JPEG image (decode PNG on the CPU)");
    if (in->cmyk) return ferry_seterr(FERRY_EUNSUPPORTED, "nvjpeg: a CMYK JPEG: decode it on the CPU");
    if (!ferry_nvjpeg_has_eoi(data, n)) return ferry_seterr(FERRY_ECODEC, "jpeg: no end-of-image marker after the scan (truncated)");
    uint64_t need = (uint64_t)in->width * in->height * 3;
    if (!dst || cap < need)
        return ferry_seterr(FERRY_EINVAL, "a %u x %u x 3 image needs %llu bytes; the buffer has %zu", in->height,
                            in->width, (unsigned long long)need, dst ? cap : 0);
    if (device < 0 || device >= NVJ_MAX_DEVICES) return ferry_seterr(FERRY_EINVAL, "nvjpeg: device %d", device);
    const nvj_api *nv = nvj_load();
    if (!nv) return ferry_seterr(FERRY_EUNSUPPORTED, "nvjpeg: %s", why_);
    CUcontext saved = ferry_cuda_current();
    if ((rc = ferry_cuda_use_device(device)) < 0) return rc;
    nvj_handle h = NULL;
    nvj_tls *t = NULL;
    if ((rc = nvj_get(nv, device, &h, &t)) == 0) {
        nvj_image img;
        memset(&img, 0, sizeof img);
        img.channel[0] = (unsigned char *)dst;
        img.pitch[0] = (size_t)in->width * 3;
        nvj_status s = nv->Decode(h, t->state, data, n, NVJ_OUTPUT_RGBI, &img, (CUstream)stream);
        if (s != NVJ_OK) {
            rc = ferry_nvjpeg_err(s, "nvjpegDecode");
            state_drop(t);
        }
    }
    ferry_cuda_restore(saved);
    return rc < 0 ? rc : (int64_t)need;
}
