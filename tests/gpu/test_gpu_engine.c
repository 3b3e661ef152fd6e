/* test_gpu_engine.c — every device path byte-exact: staged and cuFile reads
 * and writes of sizes from 0 to several GiB at unaligned offsets, byteswap on
 * the GPU, placements and fills into device memory, stream hand-off. Skips
 * with a reason where there is no GPU. FERRY_GPU_BIG=0 skips the multi-GiB case. */
#include "check.h"
#include "ferry.h"
#include "pack_check.h"
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

static ferry_ctx *ctx_;
static char dir_[256], path_[512];
static uint64_t fsize_;

static inline uint8_t byte_at(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

static void write_pattern(const char *path, uint64_t n) {
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    static uint8_t buf[1 << 20];
    for (uint64_t i = 0; i < n;) {
        size_t c = n - i < sizeof buf ? (size_t)(n - i) : sizeof buf;
        for (size_t k = 0; k < c; k++) buf[k] = byte_at(i + k);
        if (write(fd, buf, c) != (ssize_t)c) break;
        i += c;
    }
    close(fd);
}

static int check_device(uintptr_t d, uint64_t off, uint64_t n, uint64_t file_off) {
    uint8_t *h = malloc(n ? n : 1);
    ferry_memcpy(ctx_, ferry_host_buf(h, n), ferry_cuda_buf(0, d + off, n), n);
    int ok = 1;
    for (uint64_t i = 0; i < n && ok; i++) if (h[i] != byte_at(file_off + i)) ok = 0;
    free(h);
    return ok;
}

static void reads_on(ferry_path path) {
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, path_, FERRY_READ, &f), 0);
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, 64 << 20, &d), 0);
    static const uint64_t sizes[] = {0, 1, 4095, 4096, 4097, 65536 + 3, (1 << 20) + 7, (9 << 20) + 4097, 40 << 20};
    static const uint64_t offs[] = {0, 1, 4095, 4096, 12345};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
        for (size_t oi = 0; oi < sizeof offs / sizeof *offs; oi++) {
            for (int dst_off = 0; dst_off < 2; dst_off++) {
                ferry_plan *p;
                ferry_plan_create(&p);
                ferry_plan_read(p, f, offs[oi], sizes[si], ferry_cuda_buf(0, d, 64 << 20), (uint64_t)dst_off * 3);
                ferry_run_opts o = {.path = path, .threads = 0, .flags = 0};
                int64_t r = ferry_run(ctx_, p, &o);
                ferry_plan_destroy(p);
                CHECK_EQ_I(r, (int64_t)sizes[si]);
                if (r < 0) { fprintf(stderr, "  %s\n", ferry_errmsg(ctx_)); continue; }
                CHECK(check_device(d, (uint64_t)dst_off * 3, sizes[si], offs[oi]));
            }
        }
    ferry_stats st;
    ferry_stats_get(ctx_, &st);
    CHECK(st.path[path].bytes > 0);
    ferry_cuda_free(ctx_, d);
    ferry_file_close(f);
}

static void test_staged_reads(void) { reads_on(FERRY_PATH_STAGED); }

/* cuFile absent or switched off (FERRY_CUFILE=off): nothing to test. Present
 * but without nvidia-fs, its compatibility mode must still run every case. */
static int no_cufile(void) {
    const char *s = ferry_cufile_status(ctx_);
    if (!*s || !(strstr(s, "not found") || strstr(s, "disabled"))) return 0;
    printf("  skip cufile: %s\n", s);
    return 1;
}

static void test_cufile_reads(void) {
    if (!no_cufile()) reads_on(FERRY_PATH_CUFILE);
}

/* With nvidia-fs loaded, AUTO reads device memory with cuFile (GDS), which
 * leaves the page cache out: a FERRY_REREAD job (a dataset's epochs) reads
 * staged instead, through the page cache, so that the next epoch finds its
 * bytes there. nvidia-fs is stood in for through the "access" seam; cuFile
 * itself is the stand-in's or, on a GPU machine without nvidia-fs, its
 * compatibility mode. Byte-exact either way. */
static int with_nvidia_fs(const char *path, int mode) { return strstr(path, "nvidia") ? 0 : access(path, mode); }
static void test_reread_reads_staged_where_gds_is_native(void) {
    if (no_cufile()) return;
    ferry_test_set_syscall("access", (void *)with_nvidia_fs);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, path_, FERRY_READ, &f), 0);
    const uint64_t mib = 1u << 20;
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, 8 * mib, &d), 0);
    for (int reread = 0; reread < 2; reread++) {
        ferry_plan *p;
        ferry_plan_create(&p);
        for (uint64_t i = 0; i < 8; i++)   /* 1 MiB records, every other MiB of the file: not merged */
            ferry_plan_read(p, f, (2 * i + (uint64_t)reread) * mib, mib, ferry_cuda_buf(0, d, 8 * mib), i * mib);
        ferry_run_opts o = {.path = FERRY_PATH_AUTO, .threads = 0, .flags = reread ? FERRY_REREAD : 0};
        ferry_stats_reset(ctx_);
        CHECK_EQ_I(ferry_run(ctx_, p, &o), (int64_t)(8 * mib));
        ferry_plan_destroy(p);
        for (uint64_t i = 0; i < 8; i++) CHECK(check_device(d, i * mib, mib, (2 * i + (uint64_t)reread) * mib));
        ferry_stats st;
        ferry_stats_get(ctx_, &st);
        CHECK_EQ_I(st.path[FERRY_PATH_CUFILE].bytes, reread ? 0 : 8 * mib);
        CHECK_EQ_I(st.path[FERRY_PATH_STAGED].bytes, reread ? 8 * mib : 0);
        if (reread) CHECK_EQ_I(st.direct_bytes, 0);
    }
    ferry_test_set_syscall("access", NULL);
    ferry_cuda_free(ctx_, d);
    ferry_file_close(f);
}

static void test_auto_reports_path(void) {
    ferry_file *f;
    ferry_file_open(ctx_, path_, FERRY_READ, &f);
    uintptr_t d;
    ferry_cuda_malloc(ctx_, 0, 8 << 20, &d);
    ferry_stats_reset(ctx_);
    CHECK_EQ_I(ferry_pread(f, ferry_cuda_buf(-1, d, 8 << 20), 0, 8 << 20, 0), 8 << 20);  /* device looked up */
    ferry_stats st;
    ferry_stats_get(ctx_, &st);
    CHECK(st.path[FERRY_PATH_STAGED].bytes + st.path[FERRY_PATH_CUFILE].bytes == (8 << 20));
    CHECK(check_device(d, 0, 8 << 20, 0));
    /* forced host path with device memory is an error, never a fallback */
    ferry_plan *p;
    ferry_plan_create(&p);
    ferry_plan_read(p, f, 0, 100, ferry_cuda_buf(0, d, 100), 0);
    ferry_run_opts o = {.path = FERRY_PATH_HOST, .threads = 0, .flags = 0};
    CHECK_EQ_I(ferry_run(ctx_, p, &o), FERRY_EPATH);
    ferry_plan_destroy(p);
    ferry_cuda_free(ctx_, d);
    ferry_file_close(f);
}

static void test_byteswap_place_fill(void) {
    /* file: 64 big-endian uint32 values 0..63 as an 8x8 array */
    char p[512];
    snprintf(p, sizeof p, "%s/be.bin", dir_);
    uint8_t be[256];
    for (int i = 0; i < 64; i++) { be[4 * i] = 0; be[4 * i + 1] = 0; be[4 * i + 2] = (uint8_t)(i >> 8); be[4 * i + 3] = (uint8_t)i; }
    int fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    CHECK(write(fd, be, sizeof be) == sizeof be);
    close(fd);
    ferry_file *f;
    ferry_file_open(ctx_, p, FERRY_READ, &f);
    uintptr_t d;
    ferry_cuda_malloc(ctx_, 0, 4096, &d);
    ferry_plan *plan;
    ferry_plan_create(&plan);
    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.kind = FERRY_EXTENT_READ; e.file = f; e.length = 256; e.decoded_size = 256;
    e.ncodecs = 1; e.codecs[0].id = FERRY_CODEC_BYTESWAP; e.codecs[0].param = 4;
    e.dst = ferry_cuda_buf(0, d, 4096);
    ferry_plan_add(plan, &e);                       /* whole array, swapped on the GPU */
    ferry_place pl = {2, 4, {3, 2}, {32, 12}, {8, 4}, 4 * 9};   /* rows 1..3, cols 1 and 4 -> a 3x2 box */
    e.place = &pl; e.dst_offset = 1024;
    ferry_plan_add(plan, &e);                       /* placed (swapped on the CPU after decode) */
    ferry_place fp = {1, 4, {5}, {0}, {4}, 0};
    ferry_extent fl;
    memset(&fl, 0, sizeof fl);
    fl.kind = FERRY_EXTENT_FILL; fl.dst = ferry_cuda_buf(0, d, 4096); fl.dst_offset = 2048; fl.place = &fp;
    fl.fill[0] = 0x78; fl.fill[1] = 0x56; fl.fill[2] = 0x34; fl.fill[3] = 0x12;
    ferry_plan_add(plan, &fl);
    CHECK_EQ_I(ferry_run(ctx_, plan, NULL), 512);
    uint32_t h[1024];
    ferry_memcpy(ctx_, ferry_host_buf(h, 4096), ferry_cuda_buf(0, d, 4096), 4096);
    for (int i = 0; i < 64; i++) CHECK_EQ_I(h[i], i);
    for (int r = 0; r < 3; r++) { CHECK_EQ_I(h[256 + 2 * r], 8 * (r + 1) + 1); CHECK_EQ_I(h[256 + 2 * r + 1], 8 * (r + 1) + 4); }
    for (int i = 0; i < 5; i++) CHECK_EQ_I(h[512 + i], 0x12345678);
    ferry_plan_destroy(plan);
    ferry_cuda_free(ctx_, d);
    ferry_file_close(f);
}

static void test_writes(ferry_path path) {
    char p[512];
    snprintf(p, sizeof p, "%s/out-%s.bin", dir_, ferry_path_name(path));
    uint64_t n = (13 << 20) + 4097;
    uintptr_t d;
    ferry_cuda_malloc(ctx_, 0, n, &d);
    /* bytes that never passed through the staging buffers (the reads above
     * left the file's own there): a write that does not wait for its
     * device-to-host copy writes stale bytes and fails here */
    uint8_t *h = malloc(n);
    for (uint64_t i = 0; i < n; i++) h[i] = (uint8_t)(byte_at(i) ^ 0x5A);
    ferry_memcpy(ctx_, ferry_cuda_buf(0, d, n), ferry_host_buf(h, n), n);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, p, FERRY_READ | FERRY_WRITE | FERRY_CREATE | FERRY_TRUNC, &f), 0);
    ferry_plan *plan;
    ferry_plan_create(&plan);
    ferry_plan_write(plan, f, 0, 8 << 20, ferry_cuda_buf(0, d, n), 0);
    ferry_plan_write(plan, f, 8 << 20, n - (8 << 20), ferry_cuda_buf(0, d, n), 8 << 20);
    ferry_run_opts o = {.path = path, .threads = 0, .flags = FERRY_SYNC};
    int64_t r = ferry_run(ctx_, plan, &o);
    CHECK_EQ_I(r, (int64_t)n);
    if (r < 0) fprintf(stderr, "  %s\n", ferry_errmsg(ctx_));
    memset(h, 0, n);
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(h, n), 0, n, 0), (int64_t)n);
    int ok = 1;
    for (uint64_t i = 0; i < n && ok; i++) if (h[i] != (uint8_t)(byte_at(i) ^ 0x5A)) ok = 0;
    CHECK(ok);
    free(h);
    ferry_plan_destroy(plan);
    ferry_file_close(f);
    ferry_cuda_free(ctx_, d);
}
static void test_staged_writes(void) { test_writes(FERRY_PATH_STAGED); }
static void test_cufile_writes(void) {
    if (!no_cufile()) test_writes(FERRY_PATH_CUFILE);
}

static void test_stream_wait(void) {
    ferry_file *f;
    ferry_file_open(ctx_, path_, FERRY_READ, &f);
    uintptr_t d;
    ferry_cuda_malloc(ctx_, 0, 32 << 20, &d);
    ferry_plan *plan;
    ferry_plan_create(&plan);
    ferry_plan_read(plan, f, 777, 32 << 20, ferry_cuda_buf(0, d, 32 << 20), 0);
    ferry_job *job;
    CHECK_EQ_I(ferry_submit(ctx_, plan, NULL, &job), 0);
    CHECK_EQ_I(ferry_job_stream_wait(job, NULL), 0);   /* legacy stream waits on the job */
    /* a copy on the legacy stream now sees complete data */
    CHECK(check_device(d, 0, 32 << 20, 777));
    CHECK_EQ_I(ferry_job_wait(job, -1), 32 << 20);
    ferry_job_destroy(job);
    ferry_plan_destroy(plan);
    ferry_cuda_free(ctx_, d);
    ferry_file_close(f);
}

/* A job that fills memory on two devices; the caller's own stream, created
 * in device 0's context, must wait for the copies of both. The caller's
 * stream is used in the caller's context (a stream used under another
 * device's context is an invalid handle). */
static void test_stream_wait_two_devices(void) {
    if (ferry_cuda_device_count(ctx_) < 2) { printf("  skip: one CUDA device\n"); return; }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    int (*retain)(void **, int) = lib ? (int (*)(void **, int))dlsym(lib, "cuDevicePrimaryCtxRetain") : NULL;
    int (*release)(int) = lib ? (int (*)(int))dlsym(lib, "cuDevicePrimaryCtxRelease_v2") : NULL;
    int (*set_current)(void *) = lib ? (int (*)(void *))dlsym(lib, "cuCtxSetCurrent") : NULL;
    int (*stream_create)(void **, unsigned) = lib ? (int (*)(void **, unsigned))dlsym(lib, "cuStreamCreate") : NULL;
    int (*stream_destroy)(void *) = lib ? (int (*)(void *))dlsym(lib, "cuStreamDestroy_v2") : NULL;
    int (*stream_sync)(void *) = lib ? (int (*)(void *))dlsym(lib, "cuStreamSynchronize") : NULL;
    int (*d2h)(void *, unsigned long long, size_t, void *) =
        lib ? (int (*)(void *, unsigned long long, size_t, void *))dlsym(lib, "cuMemcpyDtoHAsync_v2") : NULL;
    CHECK(retain && release && set_current && stream_create && stream_destroy && stream_sync && d2h);
    if (!(retain && release && set_current && stream_create && stream_destroy && stream_sync && d2h)) return;
    void *c0 = NULL, *stream = NULL;
    CHECK_EQ_I(retain(&c0, 0), 0);
    CHECK_EQ_I(set_current(c0), 0);
    CHECK_EQ_I(stream_create(&stream, 1), 0);
    const uint64_t n = 24 << 20;
    uintptr_t d0, d1;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, n, &d0), 0);
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 1, n, &d1), 0);
    ferry_file *f;
    ferry_file_open(ctx_, path_, FERRY_READ, &f);
    ferry_plan *plan;
    ferry_plan_create(&plan);
    ferry_plan_read(plan, f, 100, n, ferry_cuda_buf(0, d0, n), 0);
    ferry_plan_read(plan, f, 300, n, ferry_cuda_buf(1, d1, n), 0);
    ferry_job *job;
    CHECK_EQ_I(ferry_submit(ctx_, plan, NULL, &job), 0);
    /* asked from a thread whose current context is device 1's: the wait is
     * still made in the stream's own context */
    void *c1 = NULL;
    CHECK_EQ_I(retain(&c1, 1), 0);
    CHECK_EQ_I(set_current(c1), 0);
    CHECK_EQ_I(ferry_job_stream_wait(job, stream), 0);
    CHECK_EQ_I(set_current(c0), 0);
    uint8_t *h = malloc(2 * n);
    CHECK_EQ_I(d2h(h, d0, n, stream), 0);        /* ordered after the job by the wait */
    CHECK_EQ_I(d2h(h + n, d1, n, stream), 0);
    CHECK_EQ_I(stream_sync(stream), 0);
    int ok = 1;
    for (uint64_t i = 0; i < n && ok; i++) ok = h[i] == byte_at(100 + i) && h[n + i] == byte_at(300 + i);
    CHECK(ok);
    CHECK_EQ_I(ferry_job_wait(job, -1), (int64_t)(2 * n));
    ferry_job_destroy(job);
    ferry_plan_destroy(plan);
    ferry_file_close(f);
    free(h);
    stream_destroy(stream);
    ferry_cuda_free(ctx_, d0);
    ferry_cuda_free(ctx_, d1);
    set_current(NULL);
    release(0);
    release(1);
}

/* The stand-in driver's counters (NULL on a real driver: counts unchecked). */
static long sim_count(const char *what, int dev) {
    static long (*fn)(const char *, int);
    static int tried;
    if (!tried) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        fn = lib ? (long (*)(const char *, int))dlsym(lib, "cudasim_count") : NULL;
        tried = 1;
    }
    return fn ? fn(what, dev) : -1;
}

/* Packed staging into device memory: many small records of several files,
 * byte-exact, with destinations in order (one copy per staging buffer),
 * shuffled with gaps and adjacent in the file but scattered (one copy into
 * device scratch and one scatter kernel per staging buffer). */
static int packed_nofollow_;   /* 1: the records as FERRY_EXTENT_NOFOLLOW reads (a store's chunks) */
static void packed_records(int mode, size_t n, uint64_t max_len, uint64_t seed) {
    pk_set s;
    memset(&s, 0, sizeof s);
    char sub[400];
    snprintf(sub, sizeof sub, "%s/pack", dir_);
    static int written;
    static pk_set files;
    if (!written) { mkdir(sub, 0755); pk_write_files(&files, sub); written = 1; }
    s = files;
    pk_make(&s, n, mode, max_len, seed);
    ferry_file *f[PK_FILES];
    for (int i = 0; i < PK_FILES; i++) CHECK_EQ_I(ferry_file_open(ctx_, s.path[i], FERRY_READ, &f[i]), 0);
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, s.dst_size, &d), 0);
    uint8_t *h = malloc(s.dst_size);
    memset(h, 0xEE, s.dst_size);
    ferry_memcpy(ctx_, ferry_cuda_buf(0, d, s.dst_size), ferry_host_buf(h, s.dst_size), s.dst_size);
    ferry_plan *p;
    ferry_plan_create(&p);
    char root[PATH_MAX];
    if (packed_nofollow_ && realpath(sub, root)) CHECK_EQ_I(pk_plan_nofollow(&s, p, root, ferry_cuda_buf(0, d, s.dst_size)), 0);
    else CHECK_EQ_I(pk_plan(&s, p, f, ferry_cuda_buf(0, d, s.dst_size)), 0);
    long c0 = sim_count("htod_copies", 0), l0 = sim_count("launches", 0);
    ferry_stats_reset(ctx_);
    ferry_run_opts o = {.path = FERRY_PATH_STAGED, .threads = 0, .flags = 0};
    int64_t r = ferry_run(ctx_, p, &o);
    CHECK_EQ_I(r, (int64_t)pk_bytes(&s));
    if (r < 0) fprintf(stderr, "  %s\n", ferry_errmsg(ctx_));
    memset(h, 0, s.dst_size);
    ferry_memcpy(ctx_, ferry_host_buf(h, s.dst_size), ferry_cuda_buf(0, d, s.dst_size), s.dst_size);
    CHECK(pk_verify(&s, h));
    ferry_stats st;
    ferry_stats_get(ctx_, &st);
    uint64_t tasks = st.path[FERRY_PATH_STAGED].ops;
    ferry_config cfg;
    ferry_ctx_config(ctx_, &cfg);
    uint64_t big = 0;   /* records larger than a staging buffer are tasks of their own */
    for (size_t i = 0; i < n; i++) big += s.r[i].len > cfg.staging_size;
    CHECK(tasks * 8 <= n || tasks <= big + pk_bytes(&s) / (64 << 10) + 2);
    if (c0 >= 0) {
        long copies = sim_count("htod_copies", 0) - c0, launches = sim_count("launches", 0) - l0;
        /* every staging buffer filled is sent once: one run when the
         * destinations follow each other, else a copy, its table and a launch */
        long buffers = (long)(2 * pk_bytes(&s) / cfg.staging_size + 2 * tasks);
        if (mode == 0) CHECK(copies <= buffers + (long)(n / 10));   /* duplicates/overlaps break runs */
        else if (mode == 1) { CHECK(copies <= 3 * buffers); CHECK(launches >= 1); }   /* gaps: packs, scatter */
        else CHECK(copies == 1 || (copies <= 3 * buffers && launches >= 1));   /* no gaps: gathered, one copy */
        printf("  mode %d: %zu records, %llu tasks, %ld host-to-device copies, %ld launches\n", mode, n,
               (unsigned long long)tasks, copies, launches);
    }
    ferry_plan_destroy(p);
    free(h);
    free(s.r);
    ferry_cuda_free(ctx_, d);
    for (int i = 0; i < PK_FILES; i++) ferry_file_close(f[i]);
}

/* Records read into separate buffers that happen to touch in the address
 * space (cupy's pool does that; the stand-in with FERRY_CUDASIM_ADJACENT=1
 * too): packed runs of different buffers must not merge into one copy, which
 * the driver refuses (CUDA_ERROR_INVALID_VALUE, seen on a GPU reading 256
 * .npy files into cupy arrays). 3 buffers take the copy-per-run path, 12 the
 * scatter kernel. */
static void adjacent_buffers(int nb) {
    enum { LEN = 4096 };
    uintptr_t d[16];
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, path_, FERRY_READ, &f), 0);
    ferry_plan *p;
    ferry_plan_create(&p);
    /* four records per buffer, from spaced file offsets (the plan keeps them
     * apart), landing back to back in their buffer (packing joins those) */
    for (int k = 0; k < nb; k++) {
        CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, 4 * LEN, &d[k]), 0);
        for (int j = 0; j < 4; j++)
            CHECK_EQ_I(ferry_plan_read(p, f, (uint64_t)(4 * k + j) * 2 * LEN, LEN, ferry_cuda_buf(0, d[k], 4 * LEN),
                                       (uint64_t)j * LEN), 0);
    }
    int adjacent = 1;
    for (int k = 1; k < nb; k++) adjacent &= d[k] == d[k - 1] + 4 * LEN;
    ferry_run_opts o = {.path = FERRY_PATH_STAGED, .threads = 1, .flags = 0};
    int64_t r = ferry_run(ctx_, p, &o);
    CHECK_EQ_I(r, (int64_t)nb * 4 * LEN);
    if (r < 0) fprintf(stderr, "  %s\n", ferry_errmsg(ctx_));
    for (int k = 0; k < nb; k++) {
        for (int j = 0; j < 4; j++) CHECK(check_device(d[k], (uint64_t)j * LEN, LEN, (uint64_t)(4 * k + j) * 2 * LEN));
        ferry_cuda_free(ctx_, d[k]);
    }
    printf("  %d buffers%s\n", nb, adjacent ? ", adjacent in the address space" : "");
    ferry_plan_destroy(p);
    ferry_file_close(f);
}
static void test_packed_adjacent_buffers(void) { adjacent_buffers(3); adjacent_buffers(12); }

static void test_packed_in_order(void) { packed_records(0, 3000, 20000, 11); }
static void test_packed_shuffled(void) { packed_records(1, 3000, 20000, 12); }
static void test_packed_file_runs(void) { packed_records(2, 4000, 5000, 13); }
static void test_packed_tiny(void) { packed_records(1, 6000, 16, 14); }
/* A batch's device copies complete while its workers go on with the next
 * job: the workers look at their events between tasks. They used to notice
 * only when they waited for that staging buffer again or ran out of work, so
 * a batch of records was done only after the job behind it (here 256 MiB of
 * host reads on the same two workers). */
static void test_packed_completes_between_tasks(void) {
    ferry_config c;
    ferry_config_init(&c);
    c.threads = 2;
    c.no_env = 1;
    ferry_ctx *ctx;
    CHECK_EQ_I(ferry_ctx_create(&ctx, &c), 0);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx, path_, FERRY_READ, &f), 0);
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(ctx, 0, 100 * 4096, &d), 0);
    uint64_t big = 4 * (uint64_t)fsize_;
    uint8_t *host = malloc(big);
    ferry_plan *pa, *pb;
    ferry_plan_create(&pa);
    ferry_plan_create(&pb);
    for (int i = 0; i < 100; i++)
        ferry_plan_read(pa, f, (uint64_t)(i * 7919 % 1000) * 8192, 4096, ferry_cuda_buf(0, d, 100 * 4096), (uint64_t)i * 4096);
    for (int k = 0; k < 4; k++) ferry_plan_read(pb, f, 0, fsize_, ferry_host_buf(host, big), (uint64_t)k * fsize_);
    ferry_run_opts o = {.path = FERRY_PATH_STAGED, .threads = 0, .flags = 0};
    ferry_job *a, *b;
    CHECK_EQ_I(ferry_submit(ctx, pa, &o, &a), 0);
    CHECK_EQ_I(ferry_submit(ctx, pb, NULL, &b), 0);
    CHECK_EQ_I(ferry_job_wait(a, -1), 100 * 4096);
    CHECK(!ferry_job_done(b));
    CHECK_EQ_I(ferry_job_wait(b, -1), (int64_t)big);
    for (int i = 0; i < 100; i += 9) CHECK(check_device(d, (uint64_t)i * 4096, 4096, (uint64_t)(i * 7919 % 1000) * 8192));
    ferry_job_destroy(a);
    ferry_job_destroy(b);
    ferry_plan_destroy(pa);
    ferry_plan_destroy(pb);
    free(host);
    ferry_cuda_free(ctx, d);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}

/* A batch of small records into one device buffer goes through a pinned
 * image of the destination (src/engine/gather.c): one host-to-device copy per
 * contiguous destination run, not one per pack task (256 x 8 KiB was 32
 * copies; on the GPU machine 8.7 GB/s against 23.6 into host memory). Rows in order
 * and shuffled, a second block with a hole between (two runs: the hole keeps
 * its bytes), odd sizes, duplicated records; FERRY_GATHER=off gives the same
 * bytes through packs. Many batches in flight reuse the pool's images. */
static void gathered(const char *env, uint64_t rec, uint64_t N, int shuffled, int jobs, int want) {
    if (env) setenv("FERRY_GATHER", env, 1); else unsetenv("FERRY_GATHER");
    ferry_ctx *ctx;
    CHECK_EQ_I(ferry_ctx_create(&ctx, NULL), 0);
    unsetenv("FERRY_GATHER");
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx, path_, FERRY_READ, &f), 0);
    enum { HOLE = 4099 };
    uint64_t size = 2 * N * rec + HOLE + 5;
    uintptr_t d[4];
    ferry_plan *p[4];
    ferry_job *jb[4];
    uint64_t (*off)[512] = malloc(4 * sizeof *off);
    uint64_t st = 77 + rec;
    uint8_t *h = malloc(size);
    for (int k = 0; k < jobs; k++) {
        CHECK_EQ_I(ferry_cuda_malloc(ctx, 0, size, &d[k]), 0);
        memset(h, 0xEE, size);
        ferry_memcpy(ctx, ferry_cuda_buf(0, d[k], size), ferry_host_buf(h, size), size);
        ferry_plan_create(&p[k]);
        for (uint64_t i = 0; i < 2 * N; i++) {
            uint64_t slot = shuffled ? (i * 97 + (uint64_t)k) % (2 * N) : i;   /* 97 is prime to 2N: a permutation */
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            off[k][slot] = (i % 9 == 4 && i) ? off[k][shuffled ? ((i - 1) * 97 + (uint64_t)k) % (2 * N) : i - 1]
                                             : (st >> 20) % (fsize_ - rec);   /* every 9th a duplicate of the one before */
            uint64_t dst = slot * rec + (slot >= N ? HOLE : 0) + 1;
            CHECK_EQ_I(ferry_plan_read(p[k], f, off[k][slot], rec, ferry_cuda_buf(0, d[k], size), dst), 0);
        }
    }
    long c0 = sim_count("htod_copies", 0);
    for (int k = 0; k < jobs; k++) CHECK_EQ_I(ferry_submit(ctx, p[k], NULL, &jb[k]), 0);
    for (int k = 0; k < jobs; k++) CHECK_EQ_I(ferry_job_wait(jb[k], -1), (int64_t)(2 * N * rec));
    long copies = sim_count("htod_copies", 0) - c0;
    for (int k = 0; k < jobs; k++) {
        ferry_job_destroy(jb[k]);
        ferry_memcpy(ctx, ferry_host_buf(h, size), ferry_cuda_buf(0, d[k], size), size);
        int ok = h[0] == 0xEE && h[size - 1] == 0xEE && h[size - 2] == 0xEE;
        for (uint64_t i = 0; i < HOLE && ok; i++) ok = h[1 + N * rec + i] == 0xEE;
        for (uint64_t slot = 0; slot < 2 * N && ok; slot++) {
            const uint8_t *q = h + slot * rec + (slot >= N ? HOLE : 0) + 1;
            for (uint64_t b = 0; b < rec && ok; b++) ok = q[b] == byte_at(off[k][slot] + b);
        }
        CHECK(ok);
        ferry_plan_destroy(p[k]);
        ferry_cuda_free(ctx, d[k]);
    }
    printf("  %s, records of %llu bytes%s, %d batches: %ld host-to-device copies\n", env ? env : "gather auto",
           (unsigned long long)rec, shuffled ? " shuffled" : "", jobs, copies);
    if (c0 >= 0 && want) CHECK_EQ_I(copies, 2 * jobs);   /* two runs per batch */
    if (c0 >= 0 && !want) CHECK(copies > 2 * jobs);
    free(h);
    free(off);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}
static void test_gathered_batches(void) {
    gathered(NULL, 8192, 256, 0, 1, 1);
    gathered(NULL, 8192, 256, 1, 4, 1);
    gathered(NULL, 4097, 200, 1, 3, 1);
    gathered(NULL, 150528, 128, 1, 2, 0);   /* 38.5 MB per batch of large records: packs */
    gathered("off", 8192, 256, 1, 2, 0);
}

/* Rows read in blocks (ArrayDataset block_size=16: 16 rows adjacent in the file
 * and in the batch) are merged by the job into 128 KiB extents; the batch is
 * still 8 KiB records and is gathered whole: one host-to-device copy. It went
 * through packs (32 copies) while gathering looked at the merged extents. */
static void test_gathered_merged_records(void) {
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, path_, FERRY_READ, &f), 0);
    enum { N = 256, REC = 8192, BLOCK = 16 };
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, N * REC, &d), 0);
    uint64_t base[N / BLOCK], st = 991;
    for (int b = 0; b < N / BLOCK; b++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        base[b] = (st >> 20) % (fsize_ - BLOCK * REC);
    }
    ferry_plan *p;
    ferry_plan_create(&p);
    for (int i = 0; i < N; i++)
        CHECK_EQ_I(ferry_plan_read(p, f, base[i / BLOCK] + (uint64_t)(i % BLOCK) * REC, REC,
                                   ferry_cuda_buf(0, d, N * REC), (uint64_t)i * REC), 0);
    long c0 = sim_count("htod_copies", 0);
    CHECK_EQ_I(ferry_run(ctx_, p, NULL), (int64_t)N * REC);
    long copies = sim_count("htod_copies", 0) - c0;
    printf("  %d records of %d bytes in blocks of %d: %ld host-to-device copies\n", N, REC, BLOCK, copies);
    if (c0 >= 0) CHECK_EQ_I(copies, 1);
    uint8_t *h = malloc(N * REC);
    ferry_memcpy(ctx_, ferry_host_buf(h, N * REC), ferry_cuda_buf(0, d, N * REC), N * REC);
    int ok = 1;
    for (int i = 0; i < N && ok; i++)
        for (int b = 0; b < REC && ok; b++)
            ok = h[(size_t)i * REC + b] == byte_at(base[i / BLOCK] + (uint64_t)(i % BLOCK) * REC + b);
    CHECK(ok);
    ferry_plan_destroy(p);
    free(h);
    ferry_cuda_free(ctx_, d);
    ferry_file_close(f);
}

/* A gathered batch with a record past the end of its file fails naming the
 * file and byte, and sends nothing: the destination keeps its bytes. */
static void test_gathered_short_read(void) {
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, path_, FERRY_READ, &f), 0);
    enum { N = 100, REC = 4096 };
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, N * REC, &d), 0);
    uint8_t *h = malloc(N * REC);
    memset(h, 0xEE, N * REC);
    ferry_memcpy(ctx_, ferry_cuda_buf(0, d, N * REC), ferry_host_buf(h, N * REC), N * REC);
    ferry_plan *p;
    ferry_plan_create(&p);
    for (int i = 0; i < N; i++)
        ferry_plan_read(p, f, i == 57 ? fsize_ - 100 : (uint64_t)i * 3 * REC, REC, ferry_cuda_buf(0, d, N * REC), (uint64_t)i * REC);
    long c0 = sim_count("htod_copies", 0);
    int64_t r = ferry_run(ctx_, p, NULL);
    CHECK_EQ_I(r, FERRY_ESHORT);
    CHECK(strstr(ferry_errmsg(ctx_), "pattern.bin") != NULL);
    if (c0 >= 0) CHECK_EQ_I(sim_count("htod_copies", 0) - c0, 0);
    memset(h, 0, N * REC);
    ferry_memcpy(ctx_, ferry_host_buf(h, N * REC), ferry_cuda_buf(0, d, N * REC), N * REC);
    int ok = 1;
    for (int i = 0; i < N * REC && ok; i++) ok = h[i] == 0xEE;
    CHECK(ok);
    ferry_plan_destroy(p);
    free(h);
    ferry_cuda_free(ctx_, d);
    ferry_file_close(f);
}

/* store chunks (no-follow reads by path) pack into device memory too */
static void test_packed_nofollow(void) {
    packed_nofollow_ = 1;
    packed_records(1, 3000, 20000, 15);
    packed_records(0, 2000, 9000, 16);
    packed_nofollow_ = 0;
}
static void test_packed_seeds(void) {
    for (uint64_t seed = 20; seed < 32; seed++) packed_records((int)(seed % 3), 200, 1 + seed * 3001, seed);
}

/* The destination's device is resolved once per buffer when the plan is
 * submitted, not per extent: a 10,000-chunk read into one array of unknown
 * device (device -1) asks the driver twice, not 20,000 times. */
static void test_device_resolved_once(void) {
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, path_, FERRY_READ, &f), 0);
    enum { N = 10000, CH = 100 };
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, (size_t)N * CH, &d), 0);
    ferry_plan *p;
    ferry_plan_create(&p);
    for (int i = 0; i < N; i++)   /* every other chunk: no merging into one extent */
        ferry_plan_read(p, f, (uint64_t)i * 2 * CH, CH, ferry_cuda_buf(-1, d, (size_t)N * CH), (uint64_t)i * CH);
    long a0 = sim_count("pointer_attributes", 0);
    CHECK_EQ_I(ferry_run(ctx_, p, NULL), (int64_t)N * CH);
    long calls = sim_count("pointer_attributes", 0) - a0;
    if (a0 >= 0) {
        printf("  %d extents, %ld cuPointerGetAttribute calls\n", N, calls);
        CHECK(calls <= 2);
    }
    CHECK(check_device(d, (uint64_t)(N - 1) * CH, CH, (uint64_t)(N - 1) * 2 * CH));
    a0 = sim_count("pointer_attributes", 0);
    CHECK_EQ_I(ferry_pread(f, ferry_cuda_buf(-1, d, 4096), 0, 4096, 0), 4096);   /* one extent: once */
    if (a0 >= 0) CHECK(sim_count("pointer_attributes", 0) - a0 <= 2);
    ferry_plan_destroy(p);
    ferry_cuda_free(ctx_, d);
    ferry_file_close(f);
}

/* A .npy file as numpy writes version 1.0: magic, version, u16 header
 * length, the dict padded with spaces to a multiple of 64 bytes, newline. */
static void write_npy(const char *path, const char *descr, const char *shape, const void *data, size_t n) {
    char dict[256];
    int dl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    size_t total = ((10 + (size_t)dl + 1 + 63) / 64) * 64;
    uint8_t hdr[512];
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    hdr[8] = (uint8_t)((total - 10) & 0xff);
    hdr[9] = (uint8_t)((total - 10) >> 8);
    memset(hdr + 10, ' ', total - 10);
    memcpy(hdr + 10, dict, (size_t)dl);
    hdr[total - 1] = '\n';
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    CHECK(write(fd, hdr, total) == (ssize_t)total);
    CHECK(write(fd, data, n) == (ssize_t)n);
    close(fd);
}

/* ferry_npy_read_many into device memory: one-sample files as one batch,
 * little-endian bytes packed, big-endian ones swapped on the way; a file of
 * another shape fails naming it. */
static void test_npy_batch_device(void) {
    enum { N = 40, R = 5, C = 7 };
    char paths[N][512];
    const char *pp[N];
    for (int i = 0; i < N; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/sample%02d.npy", dir_, i);
        pp[i] = paths[i];
        uint8_t be[R * C * 2];
        for (int k = 0; k < R * C; k++) { uint16_t v = (uint16_t)(i * 1000 + k); be[2 * k] = (uint8_t)(v >> 8); be[2 * k + 1] = (uint8_t)v; }
        write_npy(paths[i], ">u2", "(5, 7)", be, sizeof be);
    }
    uintptr_t d;
    size_t nb = (size_t)N * R * C * 2;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, nb, &d), 0);
    ferry_npy_info info;
    int64_t r = ferry_npy_read_many(ctx_, pp, N, ferry_cuda_buf(0, d, nb), 0, FERRY_NATIVE, &info);
    CHECK_EQ_I(r, (int64_t)nb);
    if (r < 0) fprintf(stderr, "  %s\n", ferry_errmsg(ctx_));
    CHECK_EQ_I(info.ndim, 2);
    CHECK_EQ_I(info.shape[1], C);
    uint16_t *h = malloc(nb);
    ferry_memcpy(ctx_, ferry_host_buf(h, nb), ferry_cuda_buf(0, d, nb), nb);
    int ok = 1;
    for (int i = 0; i < N && ok; i++)
        for (int k = 0; k < R * C && ok; k++) ok = h[i * R * C + k] == (uint16_t)(i * 1000 + k);
    CHECK(ok);
    /* the same bytes as stored (no swap): packed reads */
    r = ferry_npy_read_many(ctx_, pp, N, ferry_cuda_buf(0, d, nb), 0, 0, NULL);
    CHECK_EQ_I(r, (int64_t)nb);
    ferry_memcpy(ctx_, ferry_host_buf(h, nb), ferry_cuda_buf(0, d, nb), nb);
    ok = 1;
    for (int i = 0; i < N && ok; i++)
        for (int k = 0; k < R * C && ok; k++) ok = h[i * R * C + k] == (uint16_t)((((i * 1000 + k) & 0xff) << 8) | ((i * 1000 + k) >> 8));
    CHECK(ok);
    uint8_t other[R * C * 2] = {0};
    write_npy(paths[17], ">u2", "(7, 5)", other, sizeof other);
    CHECK_EQ_I(ferry_npy_read_many(ctx_, pp, N, ferry_cuda_buf(0, d, nb), 0, FERRY_NATIVE, NULL), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "sample17.npy");
    free(h);
    ferry_cuda_free(ctx_, d);
}

static void test_big(void) {
    const char *big = getenv("FERRY_GPU_BIG");
    if (big && !strcmp(big, "0")) return;
    /* 4.5 GiB: more than 32-bit sizes, many tasks, every worker */
    char p[512];
    snprintf(p, sizeof p, "%s/big.bin", dir_);
    uint64_t n = (4ull << 30) + (512ull << 20) + 4097;
    write_pattern(p, n);
    ferry_file *f;
    ferry_file_open(ctx_, p, FERRY_READ, &f);
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, n, &d), 0);
    CHECK_EQ_I(ferry_pread(f, ferry_cuda_buf(0, d, n), 0, n, 0), (int64_t)n);
    uint8_t *h = malloc(n);
    ferry_memcpy(ctx_, ferry_host_buf(h, n), ferry_cuda_buf(0, d, n), n);
    int ok = 1;
    for (uint64_t i = 0; i < n && ok; i++) if (h[i] != byte_at(i)) ok = 0;
    CHECK(ok);
    free(h);
    ferry_cuda_free(ctx_, d);
    ferry_file_close(f);
    unlink(p);
}

int main(void) {
    if (ferry_ctx_create(&ctx_, NULL) != 0) return 1;
    if (ferry_cuda_device_count(ctx_) == 0) {
        printf("skipped: no CUDA device (%s)\n", ferry_cuda_status(ctx_));
        printf("0 passed, 0 failed, 1 skipped\n");
        ferry_ctx_destroy(ctx_);
        return 0;
    }
    printf("cuFile: %s\n", *ferry_cufile_status(ctx_) ? ferry_cufile_status(ctx_) : "GDS available");
    snprintf(dir_, sizeof dir_, "%s/ferry-gpu-XXXXXX", getenv("FERRY_TEST_DIR") ? getenv("FERRY_TEST_DIR") : ".");
    if (!mkdtemp(dir_)) return 1;
    snprintf(path_, sizeof path_, "%s/pattern.bin", dir_);
    fsize_ = 64 << 20;
    write_pattern(path_, fsize_);
    RUN(test_staged_reads);
    RUN(test_cufile_reads);
    RUN(test_auto_reports_path);
    RUN(test_reread_reads_staged_where_gds_is_native);
    RUN(test_byteswap_place_fill);
    RUN(test_staged_writes);
    RUN(test_cufile_writes);
    RUN(test_stream_wait);
    RUN(test_stream_wait_two_devices);
    RUN(test_packed_adjacent_buffers);
    RUN(test_packed_in_order);
    RUN(test_packed_shuffled);
    RUN(test_packed_file_runs);
    RUN(test_packed_tiny);
    RUN(test_packed_seeds);
    RUN(test_packed_nofollow);
    RUN(test_packed_completes_between_tasks);
    RUN(test_gathered_batches);
    RUN(test_gathered_short_read);
    RUN(test_gathered_merged_records);
    RUN(test_npy_batch_device);
    RUN(test_device_resolved_once);
    RUN(test_big);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir_);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir_);
    ferry_ctx_destroy(ctx_);
    return check_summary();
}
