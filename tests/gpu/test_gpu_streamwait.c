/* test_gpu_streamwait.c — ferry_plan_wait_stream: a job waits for the work
 * a caller queued on its own CUDA stream before ferry_submit, and submit does
 * not. The caller's stream first runs a host function that sleeps 100 ms, then
 * the copy that produces (or the copy that still reads) the job's memory: a
 * job that did not wait writes the bytes from before the copy, or overwrites
 * memory the copy has not read yet. Every path (staged, cuFile where it runs),
 * device and pinned host memory. Skips where there is no GPU. */
#include "check.h"
#include "ferry.h"
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <unistd.h>

static ferry_ctx *ctx_;
static char dir_[256];

/* the driver calls the test makes itself (the caller's side) */
static struct {
    int (*retain)(void **, int);
    int (*release)(int);
    int (*set_current)(void *);
    int (*stream_create)(void **, unsigned);
    int (*stream_destroy)(void *);
    int (*stream_sync)(void *);
    int (*h2d)(unsigned long long, const void *, size_t, void *);
    int (*d2h)(void *, unsigned long long, size_t, void *);
    int (*host_func)(void *, void (*)(void *), void *);
} cu_;
static void *stream_;    /* the caller's stream, in device 0's primary context */
static atomic_int slept_;

static int load_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 0;
    *(void **)&cu_.retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&cu_.release = dlsym(lib, "cuDevicePrimaryCtxRelease_v2");
    *(void **)&cu_.set_current = dlsym(lib, "cuCtxSetCurrent");
    *(void **)&cu_.stream_create = dlsym(lib, "cuStreamCreate");
    *(void **)&cu_.stream_destroy = dlsym(lib, "cuStreamDestroy_v2");
    *(void **)&cu_.stream_sync = dlsym(lib, "cuStreamSynchronize");
    *(void **)&cu_.h2d = dlsym(lib, "cuMemcpyHtoDAsync_v2");
    *(void **)&cu_.d2h = dlsym(lib, "cuMemcpyDtoHAsync_v2");
    *(void **)&cu_.host_func = dlsym(lib, "cuLaunchHostFunc");
    return cu_.retain && cu_.release && cu_.set_current && cu_.stream_create && cu_.stream_destroy &&
           cu_.stream_sync && cu_.h2d && cu_.d2h && cu_.host_func;
}

static void sleep_100ms(void *arg) {
    (void)arg;
    usleep(100000);
    atomic_store(&slept_, 1);
}

/* Queue on the caller's stream: 100 ms of nothing, then the copy. */
static void stall_stream(void) {
    atomic_store(&slept_, 0);
    CHECK_EQ_I(cu_.host_func(stream_, sleep_100ms, NULL), 0);
}

static inline uint8_t pattern(uint64_t i, unsigned salt) { return (uint8_t)(((i * 2654435761u) >> 13) ^ salt); }

static int is_pattern(const uint8_t *h, uint64_t n, unsigned salt) {
    for (uint64_t i = 0; i < n; i++) if (h[i] != pattern(i, salt)) return 0;
    return 1;
}

static int cufile_off(void) {
    const char *s = ferry_cufile_status(ctx_);
    return *s && (strstr(s, "not found") || strstr(s, "disabled"));
}

/* Submit plan (which waits for stream_), check submit did not wait for the
 * stream, and return the job's result. */
static int64_t submit_and_wait(ferry_plan *plan, ferry_path path) {
    ferry_run_opts o = {.path = path, .flags = FERRY_SYNC};
    ferry_job *job = NULL;
    CHECK_EQ_I(ferry_plan_wait_stream(plan, -1, stream_), 0);
    int rc = ferry_submit(ctx_, plan, &o, &job);
    CHECK_EQ_I(rc, 0);
    if (rc < 0) { fprintf(stderr, "  %s\n", ferry_errmsg(ctx_)); return rc; }
    CHECK(!atomic_load(&slept_));   /* submit returned while the stream still sleeps */
    int64_t r = ferry_job_wait(job, -1);
    if (r < 0) fprintf(stderr, "  %s\n", ferry_errmsg(ctx_));
    CHECK(atomic_load(&slept_));
    ferry_job_destroy(job);
    return r;
}

/* Write: the stream produces the source (device memory by a host-to-device
 * copy, or pinned host memory by a device-to-host copy); the file must hold
 * the produced bytes, not those from before. */
static void write_after_producer(ferry_path path, int pinned_src) {
    const uint64_t n = (6 << 20) + 4097;
    char p[512];
    snprintf(p, sizeof p, "%s/w-%s-%d.bin", dir_, ferry_path_name(path), pinned_src);
    uintptr_t d;
    void *h = NULL;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, n, &d), 0);
    CHECK_EQ_I(ferry_pinned_alloc(ctx_, n, &h), 0);
    uint8_t *hb = h;
    /* before: the source holds salt 0x11; the stream's copy brings 0x5A */
    uint8_t *old = malloc(n), *fresh = malloc(n);
    for (uint64_t i = 0; i < n; i++) { old[i] = pattern(i, 0x11); fresh[i] = pattern(i, 0x5A); }
    ferry_buf src;
    if (pinned_src) {   /* device holds 0x5A, pinned host 0x11; the stream copies device -> host */
        ferry_memcpy(ctx_, ferry_cuda_buf(0, d, n), ferry_host_buf(fresh, n), n);
        memcpy(hb, old, n);
        stall_stream();
        CHECK_EQ_I(cu_.d2h(hb, d, n, stream_), 0);
        src = ferry_host_buf(hb, n);
    } else {            /* pinned host holds 0x5A, device 0x11; the stream copies host -> device */
        ferry_memcpy(ctx_, ferry_cuda_buf(0, d, n), ferry_host_buf(old, n), n);
        memcpy(hb, fresh, n);
        stall_stream();
        CHECK_EQ_I(cu_.h2d(d, hb, n, stream_), 0);
        src = ferry_cuda_buf(0, d, n);
    }
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, p, FERRY_READ | FERRY_WRITE | FERRY_CREATE | FERRY_TRUNC, &f), 0);
    ferry_plan *plan;
    ferry_plan_create(&plan);
    ferry_plan_write(plan, f, 0, n, src, 0);
    CHECK_EQ_I(submit_and_wait(plan, pinned_src ? FERRY_PATH_AUTO : path), (int64_t)n);
    memset(old, 0, n);
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(old, n), 0, n, 0), (int64_t)n);
    CHECK(is_pattern(old, n, 0x5A));
    CHECK_EQ_I(cu_.stream_sync(stream_), 0);
    ferry_plan_destroy(plan);
    ferry_file_close(f);
    unlink(p);
    free(old);
    free(fresh);
    ferry_pinned_free(ctx_, h);
    ferry_cuda_free(ctx_, d);
}

/* Read: the stream still reads the destination's old bytes (a device-to-host
 * copy queued behind the sleep); the job must not overwrite them first. */
static void read_after_consumer(ferry_path path) {
    const uint64_t n = (5 << 20) + 333;
    char p[512];
    snprintf(p, sizeof p, "%s/r-%s.bin", dir_, ferry_path_name(path));
    uint8_t *buf = malloc(n);
    for (uint64_t i = 0; i < n; i++) buf[i] = pattern(i, 0x77);   /* the file */
    int fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    CHECK_EQ_I(write(fd, buf, n), (ssize_t)n);
    close(fd);
    uintptr_t d;
    void *h = NULL;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, n, &d), 0);
    CHECK_EQ_I(ferry_pinned_alloc(ctx_, n, &h), 0);
    for (uint64_t i = 0; i < n; i++) buf[i] = pattern(i, 0x22);   /* the destination before */
    ferry_memcpy(ctx_, ferry_cuda_buf(0, d, n), ferry_host_buf(buf, n), n);
    memset(h, 0, n);
    stall_stream();
    CHECK_EQ_I(cu_.d2h(h, d, n, stream_), 0);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, p, FERRY_READ, &f), 0);
    ferry_plan *plan;
    ferry_plan_create(&plan);
    ferry_plan_read(plan, f, 0, n, ferry_cuda_buf(0, d, n), 0);
    CHECK_EQ_I(submit_and_wait(plan, path), (int64_t)n);
    CHECK_EQ_I(cu_.stream_sync(stream_), 0);
    CHECK(is_pattern(h, n, 0x22));      /* the stream's copy saw the old bytes */
    ferry_memcpy(ctx_, ferry_host_buf(buf, n), ferry_cuda_buf(0, d, n), n);
    CHECK(is_pattern(buf, n, 0x77));    /* and the destination holds the file */
    ferry_plan_destroy(plan);
    ferry_file_close(f);
    unlink(p);
    free(buf);
    ferry_pinned_free(ctx_, h);
    ferry_cuda_free(ctx_, d);
}

static void test_staged_write_waits(void) { write_after_producer(FERRY_PATH_STAGED, 0); }
static void test_cufile_write_waits(void) {
    if (cufile_off()) { printf("  skip cufile: %s\n", ferry_cufile_status(ctx_)); return; }
    write_after_producer(FERRY_PATH_CUFILE, 0);
}
static void test_pinned_write_waits(void) { write_after_producer(FERRY_PATH_AUTO, 1); }
static void test_staged_read_waits(void) { read_after_consumer(FERRY_PATH_STAGED); }
static void test_cufile_read_waits(void) {
    if (cufile_off()) { printf("  skip cufile: %s\n", ferry_cufile_status(ctx_)); return; }
    read_after_consumer(FERRY_PATH_CUFILE);
}

/* The default streams (NULL/legacy, per-thread) of a given device, from a
 * thread with no current context; bad arguments; clear forgets the streams. */
static void test_default_streams_and_limits(void) {
    CHECK_EQ_I(cu_.set_current(NULL), 0);
    uint8_t *h = malloc(4096);
    ferry_plan *plan;
    ferry_plan_create(&plan);
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, 4096, &d), 0);
    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.kind = FERRY_EXTENT_FILL; e.dst = ferry_cuda_buf(0, d, 4096); e.length = e.decoded_size = 4096; e.fill[0] = 0x3C;
    CHECK_EQ_I(ferry_plan_add(plan, &e), 0);
    CHECK_EQ_I(ferry_plan_wait_stream(plan, 0, NULL), 0);
    CHECK_EQ_I(ferry_plan_wait_stream(plan, 0, (void *)(uintptr_t)2), 0);
    CHECK_EQ_I(ferry_plan_wait_stream(plan, 0, NULL), 0);              /* the same pair again: one */
    CHECK_EQ_I(ferry_run(ctx_, plan, NULL), 0);
    ferry_memcpy(ctx_, ferry_host_buf(h, 4096), ferry_cuda_buf(0, d, 4096), 4096);
    int ok = 1;
    for (int i = 0; i < 4096; i++) ok &= h[i] == 0x3C;
    CHECK(ok);
    /* device -1 and a default stream, no context current: the plan's device */
    ferry_plan_clear(plan);
    CHECK_EQ_I(ferry_plan_add(plan, &e), 0);
    CHECK_EQ_I(ferry_plan_wait_stream(plan, -1, NULL), 0);
    CHECK_EQ_I(ferry_run(ctx_, plan, NULL), 0);
    CHECK_EQ_I(ferry_plan_wait_stream(plan, 99, NULL), FERRY_EINVAL);
    CHECK_EQ_I(ferry_plan_wait_stream(plan, -2, NULL), FERRY_EINVAL);
    ferry_plan_clear(plan);
    for (int k = 0; k < FERRY_MAX_WAIT_STREAMS; k++) CHECK_EQ_I(ferry_plan_wait_stream(plan, k, NULL), 0);
    CHECK_EQ_I(ferry_plan_wait_stream(plan, -1, NULL), FERRY_EINVAL);   /* a 9th */
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "more than 8 streams");
    ferry_plan_clear(plan);   /* forgets them: 8 others fit again */
    for (int k = 0; k < FERRY_MAX_WAIT_STREAMS; k++) CHECK_EQ_I(ferry_plan_wait_stream(plan, k, (void *)(uintptr_t)2), 0);
    ferry_plan_destroy(plan);
    ferry_cuda_free(ctx_, d);
    free(h);
}

int main(void) {
    if (ferry_ctx_create(&ctx_, NULL) != 0) return 1;
    if (ferry_cuda_device_count(ctx_) == 0 || !load_driver()) {
        printf("skipped: no CUDA device (%s)\n", ferry_cuda_status(ctx_));
        printf("0 passed, 0 failed, 1 skipped\n");
        ferry_ctx_destroy(ctx_);
        return 0;
    }
    snprintf(dir_, sizeof dir_, "%s/ferry-sw-XXXXXX", getenv("FERRY_TEST_DIR") ? getenv("FERRY_TEST_DIR") : ".");
    if (!mkdtemp(dir_)) return 1;
    void *c0 = NULL;
    if (cu_.retain(&c0, 0) != 0 || cu_.set_current(c0) != 0 || cu_.stream_create(&stream_, 1) != 0) {
        printf("could not make a stream on device 0\n");
        return 1;
    }
    RUN(test_staged_write_waits);
    RUN(test_cufile_write_waits);
    RUN(test_pinned_write_waits);
    RUN(test_staged_read_waits);
    RUN(test_cufile_read_waits);
    RUN(test_default_streams_and_limits);
    cu_.set_current(c0);
    cu_.stream_destroy(stream_);
    cu_.set_current(NULL);
    cu_.release(0);
    rmdir(dir_);
    ferry_ctx_destroy(ctx_);
    return check_summary();
}
