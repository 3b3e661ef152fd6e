/* test_gpu_imagebatch.c — ferry_image_batch into device memory: nvJPEG's
 * batched decode (the hardware backend and the CUDA backend) beside the CPU
 * threads from one queue, the transform kernel, and the CPU path's rows
 * uploaded. Every row is compared with the CPU path's row (ferry_image_decode
 * + the transform on the CPU): exactly where the CPU decoded it and on the
 * stand-in nvJPEG (which decodes with libjpeg-turbo); on a real GPU within
 * test_nvjpeg.c's bounds for nvJPEG's pixels (4:2:0 color: mean difference
 * <= 2, largest <= 128; gray: <= 1), which the resize only averages.
 * PNG, CMYK and 4:1:1 images fall back to the CPU and are counted by reason; the
 * hardware backend's call is made with the stream drained (the stand-in
 * counts a call made with work queued; NVJPEGSIM_NO_HW=1 runs it as a device
 * without the engine); SKIP closes up the rows of a
 * corrupt image on the device; decode=cpu uses no nvJPEG; the thread's
 * CUDA context is left as it was. Skips without a GPU, nvJPEG or the
 * transform kernel. */
#include "imagebatch_check.h"
#include "cuda/cuda.h"
#include <dlfcn.h>
#include <pthread.h>

#ifdef IB_HAVE_CODECS
static ferry_ctx *ctx_;
static int on_sim_;
static long (*simcount_)(const char *);
static char dir_[] = "/tmp/ferry-test-gpu-imagebatch-XXXXXX";
enum { N = 11 };
static ib_image im_[N];
static ferry_shards *set_;
static CUstream stream_;
static const ferry_cuda_api *cu_;

static long simc(const char *what) { return simcount_ ? simcount_(what) : 0; }
static long (*drvcount_)(const char *, int);   /* the stand-in driver's counters */
static long drvc(const char *what) { return drvcount_ ? drvcount_(what, 0) : 0; }

static void setup(void) {
    static const struct { int kind, w, h; } spec[N] = {
        {IB_BASELINE, 67, 45}, {IB_444, 40, 64}, {IB_GRAY, 33, 31}, {IB_PROGRESSIVE, 80, 60}, {IB_CMYK, 24, 30},
        {IB_PNG, 50, 37}, {IB_BASELINE, 1, 1}, {IB_BASELINE, 300, 200}, {IB_BASELINE, 64, 64}, {IB_GRAY, 90, 70},
        {IB_411, 48, 40}};
    const char *paths[N];
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "g%02d", i);
        ib_make(&im_[i], spec[i].kind, spec[i].w, spec[i].h, 11u + (unsigned)i);
        ib_write(&im_[i], dir_, name);
        paths[i] = im_[i].path;
    }
    if (ferry_shards_open(ctx_, paths, N, "files", &set_) < 0) printf("open: %s\n", ferry_errmsg(ctx_));
}

static ferry_image_batch_args args(const int64_t *s, size_t n, uintptr_t dst, size_t cap) {
    ferry_image_batch_args a;
    memset(&a, 0, sizeof a);
    a.shards = set_;
    a.samples = s;
    a.n = n;
    a.xf.height = 32;
    a.xf.width = 32;
    a.xf.crop = FERRY_IMAGE_CROP_RANDOM_RESIZED;
    a.xf.scale[0] = 0.5;   /* large boxes: the pixels compared are the decoder's, not a few */
    a.xf.scale[1] = 1.0;
    a.xf.ratio[0] = 0.75;
    a.xf.ratio[1] = 4.0 / 3;
    a.xf.flip = 0.5;
    a.xf.layout = FERRY_IMAGE_CHW;
    a.xf.dtype = FERRY_DT_U8;
    a.seed = 3;
    a.epoch = 4;
    a.dst = ferry_cuda_buf(0, dst, cap);
    a.stream = stream_;
    a.threads = 2;
    return a;
}

/* rows on the device against the CPU path's; exact: every byte */
static void compare(const ferry_image_batch_args *a, uintptr_t d, const int64_t *s, size_t n, int exact_all) {
    size_t rb = ib_row_bytes(&a->xf);
    uint8_t *got = malloc(n * rb), *want = malloc(rb);
    CHECK_EQ_I(ferry_memcpy(ctx_, ferry_host_buf(got, n * rb), ferry_cuda_buf(0, d, n * rb), n * rb), 0);
    for (size_t i = 0; i < n; i++) {
        const ib_image *im = &im_[s[i]];
        CHECK_EQ_I(ib_expected(a, im, s[i], want), 0);
        int maxd = 0;
        long sum = 0;
        for (size_t k = 0; k < rb; k++) {
            int df = abs((int)got[i * rb + k] - (int)want[k]);
            sum += df;
            if (df > maxd) maxd = df;
        }
        double mean = (double)sum / rb;
        int cpu_only = im->kind == IB_PNG || im->kind == IB_CMYK || im->kind == IB_411;
        int ok = (exact_all || on_sim_ || cpu_only) ? maxd == 0
                 : im->kind == IB_GRAY ? maxd <= 1 : (mean <= 2.0 && maxd <= 128);
        if (!ok || (!on_sim_ && !cpu_only && !exact_all))
            printf("  row %zu (kind %d, %dx%d): max diff %d, mean %.3f\n", i, im->kind, im->w, im->h, maxd, mean);
        CHECK(ok);
    }
    free(got);
    free(want);
}

static void run_policy(ferry_decode_policy pol) {
    int64_t s[N + 2] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 8};
    size_t n = N + 2;
    ferry_image_batch_args a = args(s, n, 0, 0);
    size_t rb = ib_row_bytes(&a.xf);
    uintptr_t d = 0;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, n * rb, &d), 0);
    a.dst = ferry_cuda_buf(0, d, n * rb);
    a.decode = pol;
    ferry_image_batch_stats st;
    memset(&st, 0, sizeof st);
    long unordered = simc("hw_unordered"), batched = simc("batched_calls");
    CUcontext before = ferry_cuda_current();
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, &st), (int64_t)n);
    CHECK(ferry_cuda_current() == before);
    printf("  %s: gpu %zu (hardware %zu), cpu %zu, fallbacks png %zu cmyk %zu gpu_error %zu\n",
           ferry_decode_policy_name(pol), st.gpu, st.gpu_hw, st.cpu, st.fallbacks[FERRY_IMAGE_FB_PNG],
           st.fallbacks[FERRY_IMAGE_FB_CMYK], st.fallbacks[FERRY_IMAGE_FB_GPU_ERROR]);
    CHECK_EQ_I(st.gpu + st.cpu, n);
    CHECK_EQ_I(st.written, n);
    if (pol == FERRY_DECODE_CPU) {
        CHECK_EQ_I(st.gpu, 0);
        CHECK_EQ_I(simc("batched_calls"), batched);
    } else {
        CHECK_EQ_I(st.fallbacks[FERRY_IMAGE_FB_PNG], 1);
        CHECK_EQ_I(st.fallbacks[FERRY_IMAGE_FB_CMYK], 1);
        CHECK_EQ_I(st.fallbacks[FERRY_IMAGE_FB_SAMPLING], 1);
        CHECK_EQ_I(st.fallbacks[FERRY_IMAGE_FB_GPU_ERROR], 0);
        if (pol == FERRY_DECODE_GPU) CHECK_EQ_I(st.gpu, n - 3);
        else CHECK(st.gpu >= 1);
        if (on_sim_) {
            const char *nohw = getenv("NVJPEGSIM_NO_HW");
            if (nohw && !strcmp(nohw, "1")) CHECK_EQ_I(st.gpu_hw, 0);   /* no engine: the CUDA backend decodes all */
            else CHECK(st.gpu_hw >= 1);
            CHECK(st.gpu_hw < st.gpu || pol != FERRY_DECODE_GPU);   /* the progressive one is the CUDA backend's */
            CHECK_EQ_I(simc("hw_unordered"), unordered);
        }
    }
    compare(&a, d, s, n, pol == FERRY_DECODE_CPU);
    ferry_cuda_free(ctx_, d);
}

static void test_auto_both_decoders(void) { run_policy(FERRY_DECODE_AUTO); }
static void test_gpu_forced(void) { run_policy(FERRY_DECODE_GPU); }
static void test_cpu_forced_uploads(void) { run_policy(FERRY_DECODE_CPU); }

static void test_bf16_hwc_normalised(void) {
    int64_t s[4] = {7, 0, 8, 1};
    ferry_image_batch_args a = args(s, 4, 0, 0);
    a.xf.dtype = FERRY_DT_BF16;
    a.xf.layout = FERRY_IMAGE_HWC;
    float m[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    memcpy(a.xf.mean, m, sizeof m);
    memcpy(a.xf.std, sd, sizeof sd);
    a.decode = FERRY_DECODE_GPU;
    size_t rb = ib_row_bytes(&a.xf);
    uintptr_t d = 0;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, 4 * rb, &d), 0);
    a.dst = ferry_cuda_buf(0, d, 4 * rb);
    ferry_image_batch_stats st;
    memset(&st, 0, sizeof st);
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, &st), 4);
    CHECK_EQ_I(st.gpu, 4);
    if (on_sim_) compare(&a, d, s, 4, 1);   /* bit for bit: the kernel and the CPU path agree */
    ferry_cuda_free(ctx_, d);
}

/* the scratch kept between calls grows: a 1 x 1 image first, then runs of
 * larger ones (the old buffer goes only after the stream ran) */
static void test_scratch_grows(void) {
    int64_t s1[1] = {6}, s2[5] = {8, 7, 0, 7, 9};
    for (int round = 0; round < 2; round++) {
        const int64_t *s = round ? s2 : s1;
        size_t n = round ? 5 : 1;
        ferry_image_batch_args a = args(s, n, 0, 0);
        a.decode = FERRY_DECODE_GPU;
        size_t rb = ib_row_bytes(&a.xf);
        uintptr_t d = 0;
        CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, n * rb, &d), 0);
        a.dst = ferry_cuda_buf(0, d, n * rb);
        ferry_image_batch_stats st;
        memset(&st, 0, sizeof st);
        CHECK_EQ_I(ferry_image_batch(ctx_, &a, &st), (int64_t)n);
        CHECK_EQ_I(st.gpu, n);
        compare(&a, d, s, n, 0);
        ferry_cuda_free(ctx_, d);
    }
}

/* AUTO on a batch of JPEGs nvJPEG takes, twice (the second call starts from
 * the first's rates): every row right whoever decoded it, the GPU in it. How
 * the queue splits depends on the rates (and, on the stand-in, whose "GPU"
 * decodes on the calling thread, on the host's scheduling): printed, not
 * checked; the benchmark measures it. */
static void test_auto_shares_the_queue(void) {
    enum { M = 48 };
    int64_t s[M];
    static const int64_t jpegs[] = {0, 1, 2, 6, 7, 8, 9};
    for (int i = 0; i < M; i++) s[i] = jpegs[i % 7];
    ferry_image_batch_args a = args(s, M, 0, 0);
    size_t rb = ib_row_bytes(&a.xf);
    uintptr_t d = 0;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, M * rb, &d), 0);
    a.dst = ferry_cuda_buf(0, d, M * rb);
    a.threads = 3;
    for (int round = 0; round < 2; round++) {   /* the second starts from the first's rates */
        ferry_image_batch_stats st;
        memset(&st, 0, sizeof st);
        CHECK_EQ_I(ferry_image_batch(ctx_, &a, &st), M);
        printf("  auto, %d JPEGs, round %d: gpu %zu, cpu %zu\n", M, round, st.gpu, st.cpu);
        CHECK(st.gpu >= 1);
        CHECK_EQ_I(st.gpu + st.cpu, M);
        CHECK_EQ_I(st.fallbacks[FERRY_IMAGE_FB_GPU_ERROR], 0);
        compare(&a, d, s, M, 0);
    }
    ferry_cuda_free(ctx_, d);
}

/* two calls at once on device 0, each on its own stream: one takes the kept
 * scratch, the other makes its own; both right */
typedef struct conc { int64_t s[6]; uintptr_t d; CUstream stream; int64_t rc; ferry_image_batch_stats st; } conc;
static void *conc_run(void *arg) {
    conc *c = arg;
    ferry_image_batch_args a = args(c->s, 6, 0, 0);
    a.dst = ferry_cuda_buf(0, c->d, 6 * ib_row_bytes(&a.xf));
    a.stream = c->stream;
    a.decode = FERRY_DECODE_GPU;
    memset(&c->st, 0, sizeof c->st);
    c->rc = ferry_image_batch(ctx_, &a, &c->st);
    return NULL;
}

/* A call like the one before it, warm: nothing allocated (the device's kept
 * set and nvJPEG's states are reused) and nothing copied from pageable memory
 * (a copy from there first waits for all the stream's work), for both
 * decoders and for the CPU's alone. */
static void test_warm_calls_allocate_nothing(void) {
    if (!on_sim_) return;
    int64_t s[8] = {0, 1, 2, 7, 8, 9, 5, 6};   /* baseline, 4:4:4, gray, large, PNG */
    ferry_image_batch_args a = args(s, 8, 0, 0);
    a.threads = 1;   /* one upload slot: it sees every image in the first call (more would grow
                        as later calls hand a slot a larger image than it had, then settle) */
    size_t rb = ib_row_bytes(&a.xf);
    uintptr_t d = 0;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, 8 * rb, &d), 0);
    a.dst = ferry_cuda_buf(0, d, 8 * rb);
    static const ferry_decode_policy pols[2] = {FERRY_DECODE_AUTO, FERRY_DECODE_CPU};
    for (int q = 0; q < 2; q++) {
        ferry_decode_policy pol = pols[q];
        a.decode = pol;
        CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), 8);   /* the first grows what it needs */
        long dev = drvc("device_allocs"), pin = drvc("pinned_allocs"), pageable = drvc("pageable_htod");
        for (int k = 0; k < 3; k++) CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), 8);
        CHECK_EQ_I(drvc("device_allocs"), dev);
        CHECK_EQ_I(drvc("pinned_allocs"), pin);
        CHECK_EQ_I(drvc("pageable_htod"), pageable);
        compare(&a, d, s, 8, pol == FERRY_DECODE_CPU);
    }
    ferry_cuda_free(ctx_, d);
}

static void test_concurrent_calls(void) {
    conc c[2] = {{{7, 0, 8, 1, 9, 2}, 0, NULL, 0, {0}}, {{9, 8, 7, 7, 0, 1}, 0, NULL, 0, {0}}};
    ferry_image_batch_args a0 = args(c[0].s, 6, 0, 0);
    size_t rb = ib_row_bytes(&a0.xf);
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, 6 * rb, &c[k].d), 0);
        CHECK_EQ_I(ferry_cuda_use_device(0), 0);
        CHECK_EQ_I(cu_->StreamCreate(&c[k].stream, 1), 0);
    }
    pthread_t t[2];
    for (int k = 0; k < 2; k++) CHECK_EQ_I(pthread_create(&t[k], NULL, conc_run, &c[k]), 0);
    for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_I(c[k].rc, 6);
        CHECK_EQ_I(c[k].st.gpu, 6);
        ferry_image_batch_args a = args(c[k].s, 6, c[k].d, 6 * rb);
        compare(&a, c[k].d, c[k].s, 6, 0);
        CHECK_EQ_I(ferry_cuda_use_device(0), 0);
        cu_->StreamDestroy(c[k].stream);
        ferry_cuda_free(ctx_, c[k].d);
    }
    CHECK_EQ_I(simc("state_shared"), 0);
}

/* a truncated copy of image 7 and, on the stand-in, one with its scan
 * damaged (nvJPEG refuses the run; the CPU, image by image, names it) */
static void test_skip_on_device(void) {
    ib_image cut = im_[7], bad = im_[8];
    cut.data = malloc(cut.size);
    memcpy(cut.data, im_[7].data, cut.size);
    cut.size = cut.size * 2 / 3;
    ib_write(&cut, dir_, "cut");
    bad.data = malloc(bad.size);
    memcpy(bad.data, im_[8].data, bad.size);
    for (size_t i = bad.size / 2; i < bad.size / 2 + 30; i++) bad.data[i] = 0xFF;
    ib_write(&bad, dir_, "bad");
    const char *paths[N + 2];
    for (int i = 0; i < N; i++) paths[i] = im_[i].path;
    paths[N] = cut.path;
    paths[N + 1] = bad.path;
    ferry_shards *set = NULL;
    CHECK_EQ_I(ferry_shards_open(ctx_, paths, N + 2, "files", &set), 0);
    int64_t s[6] = {0, N, 1, on_sim_ ? N + 1 : 9, 6, 3};
    ferry_image_batch_args a = args(s, 6, 0, 0);
    a.shards = set;
    a.decode = FERRY_DECODE_GPU;
    a.on_error = FERRY_ON_ERROR_SKIP;
    size_t rb = ib_row_bytes(&a.xf);
    uintptr_t d = 0;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, 6 * rb, &d), 0);
    a.dst = ferry_cuda_buf(0, d, 6 * rb);
    size_t skipped[6];
    ferry_image_batch_stats st;
    memset(&st, 0, sizeof st);
    st.skipped = skipped;
    int64_t want = on_sim_ ? 4 : 5;
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, &st), want);
    CHECK_EQ_I(st.skipped, skipped);
    CHECK_EQ_I(skipped[0], 1);
    if (on_sim_) {
        CHECK_EQ_I(st.nskipped, 2);
        CHECK_EQ_I(skipped[1], 3);
        CHECK(st.fallbacks[FERRY_IMAGE_FB_GPU_ERROR] >= 1);   /* its run went to the CPU */
        int64_t kept[4] = {0, 1, 6, 3};
        compare(&a, d, kept, 4, 0);
    } else {
        int64_t kept[5] = {0, 1, 9, 6, 3};
        compare(&a, d, kept, 5, 0);
    }
    a.on_error = FERRY_ON_ERROR_RAISE;
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), FERRY_ECODEC);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "/cut.jpg");
    ferry_cuda_free(ctx_, d);
    ferry_shards_close(set);
    free(cut.data);
    free(bad.data);
}
#endif

int main(void) {
    ferry_ctx *c;
    if (ferry_ctx_create(&c, NULL) != 0) return 1;
    if (ferry_cuda_device_count(c) == 0) {
        printf("skipped: no CUDA device (%s)\n0 passed, 0 failed, 1 skipped\n", ferry_cuda_status(c));
        ferry_ctx_destroy(c);
        return 0;
    }
#ifndef IB_HAVE_CODECS
    printf("skipped: built without libturbojpeg or libspng\n0 passed, 0 failed, 1 skipped\n");
    ferry_ctx_destroy(c);
    return 0;
#else
    ctx_ = c;
    const char *st = ferry_nvjpeg_status();
    ferry_cuda_img_params p = {1, 1, 3, 0, 0, {0, 0, 0}, {0, 0, 0}};
    if (strncmp(st, "loaded", 6) || ferry_cuda_use_device(0) < 0 ||
        ferry_cuda_image_xform_batch(0, 0, 0, &p, NULL) < 0) {
        printf("skipped: %s\n0 passed, 0 failed, 1 skipped\n", strncmp(st, "loaded", 6) ? st : "no transform kernel");
        ferry_ctx_destroy(c);
        return 0;
    }
    printf("  %s\n", st);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    on_sim_ = lib && dlsym(lib, "cudasim_count") != NULL;
    if (on_sim_) *(void **)&drvcount_ = dlsym(lib, "cudasim_count");
    void *nv = dlopen(getenv("FERRY_NVJPEG") ? getenv("FERRY_NVJPEG") : "libnvjpeg.so.12", RTLD_NOW | RTLD_NOLOAD);
    if (nv) *(void **)&simcount_ = dlsym(nv, "nvjpegsim_count");
    cu_ = ferry_cuda_load(NULL);
    if (!mkdtemp(dir_) || cu_->StreamCreate(&stream_, 1) != 0) return 1;
    setup();
    if (!set_) return 1;
    RUN(test_scratch_grows);
    RUN(test_auto_both_decoders);
    RUN(test_gpu_forced);
    RUN(test_auto_shares_the_queue);
    RUN(test_concurrent_calls);
    RUN(test_cpu_forced_uploads);
    RUN(test_warm_calls_allocate_nothing);
    RUN(test_bf16_hwc_normalised);
    RUN(test_skip_on_device);
    cu_->StreamDestroy(stream_);
    ferry_shards_close(set_);
    for (int i = 0; i < N; i++) free(im_[i].data);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir_);
    if (system(cmd) != 0) printf("could not remove %s\n", dir_);
    ferry_ctx_destroy(ctx_);
    return check_summary();
#endif
}
