/* test_multigpu.c — one process, many GPUs: a plan whose extents target a
 * subset of the devices opens contexts on those only; one plan fills every
 * device byte-exact; one context per device in one thread per device, each
 * thread's own current device left as it was (the bug a two-GPU run found:
 * a rank's context left current on the wrong device). On the stand-in driver
 * (tests/cudasim) it asks for 8 devices (FERRY_CUDASIM_DEVICES, unless set);
 * on a real machine it uses what there is and skips below two. Contexts
 * belong to the process, so the order of the tests matters: the subset test
 * runs before anything touches the other devices. */
#include "check.h"
#include "ferry.h"
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

typedef int (*get_state_fn)(int, unsigned *, int *);
typedef int (*device_get_fn)(int *, int);
typedef int (*retain_fn)(void **, int);
typedef int (*ctx_fn)(void *);
typedef int (*ctx_get_fn)(void **);
typedef long (*sim_count_fn)(const char *, int);

static get_state_fn get_state_;
static device_get_fn device_get_;
static retain_fn retain_;
static ctx_fn set_current_;
static ctx_get_fn get_current_;
static sim_count_fn sim_count_;   /* NULL on a real driver */
static ferry_ctx *ctx_;
static ferry_file *file_;
static char path_[512];
static int ndev_;
/* per device: S bytes at d * STRIDE of the file; S is not a multiple of 4 KiB
 * so each extent has an unaligned tail (O_DIRECT bounces it) */
enum { S = (6 << 20) + 1234, STRIDE = 7 << 20 };

static inline uint8_t byte_at(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 13) ^ (uint8_t)(i >> 20); }

static int active(int ord) {
    int dev = -1, on = -1;
    unsigned flags = 0;
    if (device_get_(&dev, ord) != 0 || get_state_(dev, &flags, &on) != 0) return -1;
    return on;
}

/* device d's bytes match the file's [d*STRIDE, +S) */
static int device_matches(ferry_ctx *ctx, uintptr_t dptr, int d) {
    uint8_t *h = malloc(S);
    int ok = ferry_memcpy(ctx, ferry_host_buf(h, S), ferry_cuda_buf(d, dptr, S), S) == 0;
    for (uint64_t i = 0; i < S && ok; i++) ok = h[i] == byte_at((uint64_t)d * STRIDE + i);
    free(h);
    return ok;
}

static int64_t run_plan(const int *devs, int n, uintptr_t *dptr, unsigned flags) {
    ferry_plan *p;
    if (ferry_plan_create(&p) != 0) return -1;
    for (int k = 0; k < n; k++)
        ferry_plan_read(p, file_, (uint64_t)devs[k] * STRIDE, S, ferry_cuda_buf(devs[k], dptr[devs[k]], S), 0);
    ferry_run_opts o = {.flags = flags};
    int64_t got = ferry_run(ctx_, p, &o);
    ferry_plan_destroy(p);
    return got;
}

static void test_plan_for_two_devices_opens_two_contexts(void) {
    int devs[2] = {1, ndev_ - 1};
    uintptr_t d[64] = {0};
    for (int k = 0; k < 2; k++) CHECK_EQ_I(ferry_cuda_malloc(ctx_, devs[k], S, &d[devs[k]]), 0);
    CHECK_EQ_I(run_plan(devs, 2, d, 0), 2 * (int64_t)S);
    for (int k = 0; k < 2; k++) CHECK(device_matches(ctx_, d[devs[k]], devs[k]));
    for (int i = 0; i < ndev_; i++) {
        int want = i == devs[0] || i == devs[1];
        if (active(i) != want) fprintf(stderr, "  device %d: context %s\n", i, want ? "missing" : "opened");
        CHECK_EQ_I(active(i), want);
        if (sim_count_ && !want) {
            CHECK_EQ_I(sim_count_("retains", i), 0);
            CHECK_EQ_I(sim_count_("pinned_allocs", i), 0);
        }
    }
    for (int k = 0; k < 2; k++) ferry_cuda_free(ctx_, d[devs[k]]);
}

static void test_one_plan_fills_every_device(void) {
    uintptr_t d[64] = {0};
    int devs[64];
    for (int i = 0; i < ndev_; i++) { devs[i] = i; CHECK_EQ_I(ferry_cuda_malloc(ctx_, i, S, &d[i]), 0); }
    for (unsigned flags = 0; flags <= FERRY_NO_DIRECT; flags += FERRY_NO_DIRECT) {
        for (int i = 0; i < ndev_; i++) {   /* poison, so a missed extent shows */
            uint8_t *z = calloc(1, S);
            ferry_memcpy(ctx_, ferry_cuda_buf(i, d[i], S), ferry_host_buf(z, S), S);
            free(z);
        }
        CHECK_EQ_I(run_plan(devs, ndev_, d, flags), (int64_t)ndev_ * S);
        for (int i = 0; i < ndev_; i++) {
            int ok = device_matches(ctx_, d[i], i);
            if (!ok) fprintf(stderr, "  device %d wrong (flags %u)\n", i, flags);
            CHECK(ok);
        }
    }
    for (int i = 0; i < ndev_; i++) {
        CHECK_EQ_I(active(i), 1);
        if (sim_count_) CHECK_EQ_I(sim_count_("cross_device_copies", i), 0);
    }
    for (int i = 0; i < ndev_; i++) ferry_cuda_free(ctx_, d[i]);
}

/* One thread per device, as a framework's per-device thread would: it makes
 * its device current itself, creates its own ferry context, reads its share
 * (pooled and inline), and finds its device still current afterwards. */
typedef struct { int dev; int ok; int current_kept; } thread_arg;

static void *per_device(void *p) {
    thread_arg *a = p;
    void *mine = NULL, *after = NULL;
    int dev = -1;
    if (device_get_(&dev, a->dev) != 0 || retain_(&mine, dev) != 0 || set_current_(mine) != 0) return NULL;
    ferry_ctx *c;
    if (ferry_ctx_create(&c, NULL) != 0) return NULL;
    ferry_file *f;
    uintptr_t d;
    if (ferry_file_open(c, path_, FERRY_READ, &f) == 0 && ferry_cuda_malloc(c, a->dev, S, &d) == 0) {
        ferry_buf dst = ferry_cuda_buf(a->dev, d, S);
        int64_t got = ferry_pread(f, dst, (uint64_t)a->dev * STRIDE, S, 0);
        int ok = got == S && device_matches(c, d, a->dev);
        /* a small read runs on this thread (inline) */
        got = ferry_pread(f, ferry_cuda_buf(a->dev, d + 4096, 5000), (uint64_t)a->dev * STRIDE + 4096, 5000, 0);
        ok = ok && got == 5000 && device_matches(c, d, a->dev);
        get_current_(&after);
        a->current_kept = after == mine;
        a->ok = ok;
        ferry_cuda_free(c, d);
        ferry_file_close(f);
    }
    ferry_ctx_destroy(c);
    get_current_(&after);
    a->current_kept = a->current_kept && after == mine;
    return NULL;
}

static void test_one_context_per_device_in_its_own_thread(void) {
    pthread_t t[64];
    thread_arg a[64];
    long cross0[64];
    for (int i = 0; i < ndev_; i++) cross0[i] = sim_count_ ? sim_count_("cross_device_copies", i) : 0;
    for (int i = 0; i < ndev_; i++) {
        a[i] = (thread_arg){i, 0, 0};
        pthread_create(&t[i], NULL, per_device, &a[i]);
    }
    for (int i = 0; i < ndev_; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < ndev_; i++) {
        if (!a[i].ok || !a[i].current_kept) fprintf(stderr, "  device %d: ok %d current kept %d\n", i, a[i].ok, a[i].current_kept);
        CHECK(a[i].ok);
        CHECK(a[i].current_kept);
        if (sim_count_) CHECK_EQ_I(sim_count_("cross_device_copies", i), cross0[i]);
    }
}

int main(void) {
    setenv("FERRY_CUDASIM_DEVICES", "8", 0);   /* the stand-in reads it; a real driver does not */
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.direct = FERRY_DIRECT_ON;   /* O_DIRECT even for cached data: the bounce buffers run too */
    if (ferry_ctx_create(&ctx_, &cfg) != 0) return 1;
    ndev_ = ferry_cuda_device_count(ctx_);
    if (ndev_ > 64) ndev_ = 64;
    if (ndev_ < 2) {
        printf("skipped: %s\n", ndev_ ? "one CUDA device" : ferry_cuda_status(ctx_));
        printf("0 passed, 0 failed, 1 skipped\n");
        ferry_ctx_destroy(ctx_);
        return 0;
    }
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    get_state_ = (get_state_fn)dlsym(cu, "cuDevicePrimaryCtxGetState");
    device_get_ = (device_get_fn)dlsym(cu, "cuDeviceGet");
    retain_ = (retain_fn)dlsym(cu, "cuDevicePrimaryCtxRetain");
    set_current_ = (ctx_fn)dlsym(cu, "cuCtxSetCurrent");
    get_current_ = (ctx_get_fn)dlsym(cu, "cuCtxGetCurrent");
    sim_count_ = (sim_count_fn)dlsym(cu, "cudasim_count");
    if (!get_state_ || !device_get_ || !retain_ || !set_current_ || !get_current_) {
        printf("libcuda.so.1 lacks a function this test needs\n");
        return 1;
    }
    printf("  %d devices\n", ndev_);
    char dir[256];
    snprintf(dir, sizeof dir, "%s/ferry-mgpu-XXXXXX", getenv("FERRY_TEST_DIR") ? getenv("FERRY_TEST_DIR") : ".");
    if (!mkdtemp(dir)) return 1;
    snprintf(path_, sizeof path_, "%s/data.bin", dir);
    FILE *w = fopen(path_, "wb");
    uint64_t total = (uint64_t)ndev_ * STRIDE;
    uint8_t *buf = malloc(1 << 20);
    for (uint64_t at = 0; at < total; at += 1 << 20) {
        for (uint64_t i = 0; i < (1 << 20); i++) buf[i] = byte_at(at + i);
        fwrite(buf, 1, 1 << 20, w);
    }
    free(buf);
    fclose(w);
    if (ferry_file_open(ctx_, path_, FERRY_READ, &file_) != 0) return 1;
    RUN(test_plan_for_two_devices_opens_two_contexts);
    RUN(test_one_plan_fills_every_device);
    RUN(test_one_context_per_device_in_its_own_thread);
    ferry_file_close(file_);
    unlink(path_);
    rmdir(dir);
    ferry_ctx_destroy(ctx_);
    return check_summary();
}
