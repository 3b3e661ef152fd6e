/* test_gpu_contexts.c — ferry opens a CUDA context only on a device it serves.
 * Host-only work opens none; work for device 1 opens none on device 0. Each
 * context holds hundreds of MB of that GPU's memory, and every rank of a job
 * that opens one on device 0 crowds rank 0's GPU. Contexts belong to the
 * process, so this is a program of its own, and its order matters: nothing may
 * touch device 0 before the checks that say it is untouched. The driver itself
 * is asked (cuDevicePrimaryCtxGetState); on the simulated driver of
 * tests/cudasim, also where pinned memory was allocated. */
#include "check.h"
#include "ferry.h"
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

typedef int (*get_state_fn)(int, unsigned *, int *);
typedef int (*device_get_fn)(int *, int);
typedef long (*sim_count_fn)(const char *, int);

static get_state_fn get_state_;
static device_get_fn device_get_;
static sim_count_fn sim_count_;   /* NULL on a real driver */
static ferry_ctx *ctx_;
static char path_[512];
enum { N = 24 << 20 };

static int active(int ord) {
    int dev = -1, on = -1;
    unsigned flags = 0;
    if (device_get_(&dev, ord) != 0 || get_state_(dev, &flags, &on) != 0) return -1;
    return on;
}

static inline uint8_t byte_at(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 11); }

static void test_host_only_work_opens_no_context(void) {
    int ndev = ferry_cuda_device_count(ctx_);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, path_, FERRY_READ | FERRY_WRITE | FERRY_CREATE, &f), 0);
    uint8_t *h = malloc(N + 1);
    for (uint64_t i = 0; i < N; i++) h[i] = byte_at(i);
    /* unaligned source and destination: O_DIRECT bounces through staging */
    memmove(h + 1, h, N);
    CHECK_EQ_I(ferry_pwrite(f, ferry_host_buf(h + 1, N), 0, N, 0), N);
    memset(h, 0, N + 1);
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(h + 1, N), 0, N, 0), N);
    int ok = 1;
    for (uint64_t i = 0; i < N && ok; i++) ok = h[i + 1] == byte_at(i);
    CHECK(ok);
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(h + 1, 1000), 777, 1000, 0), 1000);   /* inline */
    free(h);
    ferry_file_close(f);
    for (int d = 0; d < ndev; d++) CHECK_EQ_I(active(d), 0);
    if (sim_count_) for (int d = 0; d < ndev; d++) CHECK_EQ_I(sim_count_("retains", d), 0);
}

/* Reads (pooled and inline) and writes for device 1 from this thread, which has
 * no context of its own. */
static void test_device1_work_leaves_device0_alone(void) {
    if (ferry_cuda_device_count(ctx_) < 2) { printf("  skip: one CUDA device\n"); return; }
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 1, N, &d), 0);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, path_, FERRY_READ | FERRY_WRITE, &f), 0);
    ferry_buf dev = ferry_cuda_buf(1, d, N);
    for (unsigned flags = 0; flags <= FERRY_NO_DIRECT; flags += FERRY_NO_DIRECT) {
        CHECK_EQ_I(ferry_pread(f, dev, 0, N, flags), N);
        CHECK_EQ_I(ferry_pread(f, dev, 4096 + 5, 3000, flags), 3000);   /* inline */
    }
    CHECK_EQ_I(ferry_pwrite(f, dev, 0, N, 0), N);   /* staged write back */
    uint8_t *h = malloc(N);
    CHECK_EQ_I(ferry_memcpy(ctx_, ferry_host_buf(h, N), dev, N), 0);
    int ok = 1;
    for (uint64_t i = 0; i < 3000 && ok; i++) ok = h[i] == byte_at(4096 + 5 + i);
    for (uint64_t i = 3000; i < N && ok; i++) ok = h[i] == byte_at(i);
    CHECK(ok);
    free(h);
    ferry_file_close(f);
    CHECK_EQ_I(active(1), 1);
    CHECK_EQ_I(active(0), 0);
    if (sim_count_) {
        CHECK_EQ_I(sim_count_("retains", 0), 0);
        CHECK_EQ_I(sim_count_("pinned_allocs", 0), 0);
        CHECK(sim_count_("pinned_allocs", 1) > 0);
        CHECK_EQ_I(sim_count_("cross_device_copies", 1), 0);
    }
    ferry_cuda_free(ctx_, d);
}

/* The check above can fail: work for device 0 does show. */
static void test_device0_work_shows(void) {
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, 4096, &d), 0);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, path_, FERRY_READ, &f), 0);
    CHECK_EQ_I(ferry_pread(f, ferry_cuda_buf(0, d, 4096), 0, 4096, 0), 4096);
    ferry_file_close(f);
    ferry_cuda_free(ctx_, d);
    CHECK_EQ_I(active(0), 1);
}

int main(void) {
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.direct = FERRY_DIRECT_ON;   /* O_DIRECT even for cached data: the bounce buffers run */
    if (ferry_ctx_create(&ctx_, &cfg) != 0) return 1;
    if (ferry_cuda_device_count(ctx_) == 0) {
        printf("skipped: no CUDA device (%s)\n", ferry_cuda_status(ctx_));
        printf("0 passed, 0 failed, 1 skipped\n");
        ferry_ctx_destroy(ctx_);
        return 0;
    }
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    get_state_ = cu ? (get_state_fn)dlsym(cu, "cuDevicePrimaryCtxGetState") : NULL;
    device_get_ = cu ? (device_get_fn)dlsym(cu, "cuDeviceGet") : NULL;
    sim_count_ = cu ? (sim_count_fn)dlsym(cu, "cudasim_count") : NULL;
    if (!get_state_ || !device_get_) { printf("libcuda.so.1 lacks cuDevicePrimaryCtxGetState\n"); return 1; }
    char dir[256];
    snprintf(dir, sizeof dir, "%s/ferry-ctx-XXXXXX", getenv("FERRY_TEST_DIR") ? getenv("FERRY_TEST_DIR") : ".");
    if (!mkdtemp(dir)) return 1;
    snprintf(path_, sizeof path_, "%s/data.bin", dir);
    RUN(test_host_only_work_opens_no_context);
    RUN(test_device1_work_leaves_device0_alone);
    RUN(test_device0_work_shows);
    unlink(path_);
    rmdir(dir);
    ferry_ctx_destroy(ctx_);
    return check_summary();
}
