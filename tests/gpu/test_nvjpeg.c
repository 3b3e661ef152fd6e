/* test_nvjpeg.c — ferry_image_decode_cuda: JPEGs made here with TurboJPEG,
 * decoded into device memory on the caller's stream, copied back and compared
 * with ferry's CPU decode (exactly on the stand-in nvJPEG, which decodes with
 * libjpeg-turbo; on a real GPU, whose IDCT and chroma upsampling differ, a
 * mean difference of at most 2 levels on a smooth image). The write is
 * ordered on the stream: behind a 100 ms host function queued first, the
 * pixels are not there until the stream is synchronised
 * (checked on the stand-in driver, where a synchronous copy does not wait for
 * other streams). Truncated and PNG images are refused; the thread's CUDA
 * context is left as it was. Skips without a GPU or without nvJPEG. */
#include "check.h"
#include "ferry_experimental.h"
#include <dlfcn.h>
#include <stdatomic.h>
#include <unistd.h>
#ifdef FERRY_HAVE_TURBOJPEG
#include <turbojpeg.h>
#endif

static ferry_ctx *ctx_;
static struct {
    int (*retain)(void **, int);
    int (*release)(int);
    int (*set_current)(void *);
    int (*get_current)(void **);
    int (*stream_create)(void **, unsigned);
    int (*stream_destroy)(void *);
    int (*stream_sync)(void *);
    int (*host_func)(void *, void (*)(void *), void *);
} cu_;
static void *stream_, *ctx0_;
static int on_sim_;

static int load_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 0;
    on_sim_ = dlsym(lib, "cudasim_count") != NULL;
    *(void **)&cu_.retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&cu_.release = dlsym(lib, "cuDevicePrimaryCtxRelease_v2");
    *(void **)&cu_.set_current = dlsym(lib, "cuCtxSetCurrent");
    *(void **)&cu_.get_current = dlsym(lib, "cuCtxGetCurrent");
    *(void **)&cu_.stream_create = dlsym(lib, "cuStreamCreate");
    *(void **)&cu_.stream_destroy = dlsym(lib, "cuStreamDestroy_v2");
    *(void **)&cu_.stream_sync = dlsym(lib, "cuStreamSynchronize");
    *(void **)&cu_.host_func = dlsym(lib, "cuLaunchHostFunc");
    return cu_.retain && cu_.release && cu_.set_current && cu_.get_current && cu_.stream_create &&
           cu_.stream_destroy && cu_.stream_sync && cu_.host_func;
}

static void sleep_100ms(void *arg) { (void)arg; usleep(100000); }

#ifdef FERRY_HAVE_TURBOJPEG
static unsigned char *jpeg_make(int w, int h, int gray, unsigned long *size) {
    int ch = gray ? 1 : 3;
    uint8_t *src = malloc((size_t)w * h * ch);
    for (int y = 0; y < h; y++)   /* smooth: nvJPEG's upsampling and IDCT differ from libjpeg-turbo's at edges */
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++) src[(y * w + x) * ch + c] = (uint8_t)(x * 200 / w + y * 50 / h + c * 20);
    tjhandle t = tjInitCompress();
    unsigned char *out = NULL;
    *size = 0;
    int rc = tjCompress2(t, src, w, w * ch, h, gray ? TJPF_GRAY : TJPF_RGB, &out, size,
                         gray ? TJSAMP_GRAY : TJSAMP_420, 90, 0);
    tjDestroy(t);
    free(src);
    return rc == 0 ? out : NULL;
}

static void check_decode(int gray) {
    enum { W = 67, H = 45 };
    unsigned long n;
    unsigned char *j = jpeg_make(W, H, gray, &n);
    static uint8_t want[W * H * 3], got[W * H * 3];
    CHECK_EQ_I(ferry_image_decode(j, n, want, sizeof want, 0, NULL), (int64_t)sizeof want);
    uintptr_t d = 0;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, sizeof got, &d), 0);
    memset(got, 0, sizeof got);
    CHECK_EQ_I(ferry_memcpy(ctx_, ferry_cuda_buf(0, d, sizeof got), ferry_host_buf(got, sizeof got), sizeof got), 0);
    CHECK_EQ_I(cu_.host_func(stream_, sleep_100ms, NULL), 0);   /* the decode's write waits behind this */
    void *before = NULL;
    cu_.get_current(&before);
    ferry_image_info in;
    CHECK_EQ_I(ferry_image_decode_cuda(j, n, 0, d, sizeof got, stream_, &in), (int64_t)sizeof got);
    void *after = NULL;
    cu_.get_current(&after);
    CHECK(before == after);
    CHECK_EQ_I(in.width, W);
    CHECK_EQ_I(in.height, H);
    tjFree(j);   /* the data may go once the call returned */
    if (on_sim_) {
        CHECK_EQ_I(ferry_memcpy(ctx_, ferry_host_buf(got, sizeof got), ferry_cuda_buf(0, d, sizeof got), sizeof got), 0);
        int all_zero = 1;
        for (size_t i = 0; i < sizeof got; i++) all_zero &= got[i] == 0;
        CHECK(all_zero);   /* not yet: still queued behind the host function */
    }
    CHECK_EQ_I(cu_.stream_sync(stream_), 0);
    CHECK_EQ_I(ferry_memcpy(ctx_, ferry_host_buf(got, sizeof got), ferry_cuda_buf(0, d, sizeof got), sizeof got), 0);
    int maxdiff = 0;
    long sum = 0;
    for (size_t i = 0; i < sizeof got; i++) {
        int df = abs((int)got[i] - (int)want[i]);
        sum += df;
        if (df > maxdiff) maxdiff = df;
    }
    double mean = (double)sum / sizeof got;
    printf("  nvjpeg %s: from the CPU decode, max abs diff %d, mean %.3f\n", gray ? "gray" : "4:2:0", maxdiff, mean);
    /* A real nvJPEG upsamples 4:2:0 chroma its own way, not libjpeg-turbo's "fancy" (triangular)
     * upsampling: at sharp colour edges of this synthetic image single values differ a lot (max
     * 95 on an H100, nvJPEG 13.0) while the image as a whole agrees (mean 0.95). The mean is the
     * check that matters (a wrong decode is tens of levels off on average); gray has no chroma
     * and must agree exactly. */
    CHECK(on_sim_ ? maxdiff == 0 : gray ? maxdiff <= 1 : (mean <= 2.0 && maxdiff <= 128));
    ferry_cuda_free(ctx_, d);
}

static void test_decode_rgb(void) { check_decode(0); }
static void test_decode_gray(void) { check_decode(1); }

static void test_refusals(void) {
    unsigned long n;
    unsigned char *j = jpeg_make(32, 32, 0, &n);
    uintptr_t d = 0;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, 32 * 32 * 3, &d), 0);
    CHECK_EQ_I(ferry_image_decode_cuda(j, n - 20, 0, d, 32 * 32 * 3, stream_, NULL), FERRY_ECODEC);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "end-of-image");
    CHECK_EQ_I(ferry_image_decode_cuda(j, n, 0, d, 32 * 32 * 3 - 1, stream_, NULL), FERRY_EINVAL);
    static const uint8_t png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R',
                                  0, 0, 0, 1, 0, 0, 0, 1, 8, 2, 0, 0, 0, 0x90, 0x77, 0x53, 0xDE};
    CHECK(ferry_image_decode_cuda(png, sizeof png, 0, d, 32 * 32 * 3, stream_, NULL) < 0);
    /* a good one still decodes after the failures */
    CHECK_EQ_I(ferry_image_decode_cuda(j, n, 0, d, 32 * 32 * 3, stream_, NULL), 32 * 32 * 3);
    CHECK_EQ_I(cu_.stream_sync(stream_), 0);
    ferry_cuda_free(ctx_, d);
    tjFree(j);
}
#endif

int main(void) {
    if (ferry_ctx_create(&ctx_, NULL) != 0) return 1;
    if (ferry_cuda_device_count(ctx_) == 0 || !load_driver()) {
        printf("skipped: no CUDA device (%s)\n", ferry_cuda_status(ctx_));
        printf("0 passed, 0 failed, 1 skipped\n");
        ferry_ctx_destroy(ctx_);
        return 0;
    }
    const char *st = ferry_nvjpeg_status();
    if (strncmp(st, "loaded", 6)) {
        printf("skipped: %s\n0 passed, 0 failed, 1 skipped\n", st);
        ferry_ctx_destroy(ctx_);
        return 0;
    }
    printf("  %s\n", st);
#ifdef FERRY_HAVE_TURBOJPEG
    if (cu_.retain(&ctx0_, 0) != 0 || cu_.set_current(ctx0_) != 0 || cu_.stream_create(&stream_, 1) != 0) {
        printf("could not make a stream on device 0\n");
        return 1;
    }
    RUN(test_decode_rgb);
    RUN(test_decode_gray);
    RUN(test_refusals);
    cu_.set_current(ctx0_);
    cu_.stream_destroy(stream_);
    cu_.set_current(NULL);
    cu_.release(0);
#else
    printf("skipped: built without libturbojpeg (the header probe needs it)\n");
#endif
    ferry_ctx_destroy(ctx_);
    return check_summary();
}
