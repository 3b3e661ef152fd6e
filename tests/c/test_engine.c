/* test_engine.c — the engine on the host path: odd sizes and offsets,
 * unaligned destinations, EOF, empty files, O_DIRECT on and off, writes,
 * plans with placements and fills, concurrency, errors. */
#include "check.h"
#include "ferry.h"
#include "engine/ctx.h"
#include "engine/knobs.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir_[256];

static void make_path(char *out, const char *name) { snprintf(out, 512, "%s/%s", dir_, name); }

static uint8_t byte_at(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

static void write_pattern(const char *path, uint64_t n) {
    FILE *f = fopen(path, "wb");
    uint8_t buf[65536];
    for (uint64_t i = 0; i < n;) {
        size_t c = n - i < sizeof buf ? (size_t)(n - i) : sizeof buf;
        for (size_t k = 0; k < c; k++) buf[k] = byte_at(i + k);
        fwrite(buf, 1, c, f);
        i += c;
    }
    fclose(f);
}

static int check_pattern(const uint8_t *p, uint64_t off, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) if (p[i] != byte_at(off + i)) return 0;
    return 1;
}

static ferry_ctx *make_ctx(int threads, ferry_direct direct) {
    ferry_config c;
    ferry_config_init(&c);
    c.threads = threads;
    c.direct = direct;
    c.no_env = 1;
    c.task_size = 1 << 20;        /* small tasks: many per read */
    c.staging_size = 256 << 10;
    c.small_io = 64 << 10;
    ferry_ctx *ctx = NULL;
    if (ferry_ctx_create(&ctx, &c) != 0) return NULL;
    return ctx;
}

static const uint64_t sizes_[] = {0, 1, 4095, 4096, 4097, (1 << 20) + 3, (5 << 20) + 4097};
static const uint64_t offsets_[] = {0, 1, 4095, 4097};

static void reads_with(int threads, ferry_direct direct) {
    char path[512];
    make_path(path, "pattern.bin");
    uint64_t fsize = (6 << 20) + 12345;
    write_pattern(path, fsize);
    ferry_ctx *ctx = make_ctx(threads, direct);
    CHECK(ctx != NULL);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx, path, FERRY_READ, &f), 0);
    CHECK_EQ_I(ferry_file_size(f), (int64_t)fsize);
    uint8_t *mem = malloc((6 << 20) + 64);
    for (size_t si = 0; si < sizeof sizes_ / sizeof *sizes_; si++)
        for (size_t oi = 0; oi < sizeof offsets_ / sizeof *offsets_; oi++) {
            uint64_t n = sizes_[si], off = offsets_[oi];
            uint8_t *dst = mem + 1;   /* unaligned destination */
            memset(mem, 0xEE, (6 << 20) + 64);
            int64_t got = ferry_pread(f, ferry_host_buf(dst, n), off, n, 0);
            CHECK_EQ_I(got, (int64_t)n);
            CHECK(check_pattern(dst, off, n));
            CHECK(mem[0] == 0xEE && dst[n] == 0xEE);   /* nothing outside the range */
        }
    /* a read that crosses the end of the file returns the bytes that exist */
    int64_t got = ferry_pread(f, ferry_host_buf(mem, 100000), fsize - 1000, 100000, 0);
    CHECK_EQ_I(got, 1000);
    CHECK(check_pattern(mem, fsize - 1000, 1000));
    /* at or after EOF: zero */
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(mem, 10), fsize + 5, 10, 0), 0);
    /* a plan that needs bytes past EOF is an error naming the file */
    ferry_plan *plan;
    ferry_plan_create(&plan);
    ferry_plan_read(plan, f, fsize - 10, 4096 * 3, ferry_host_buf(mem, 4096 * 3), 0);
    int64_t r = ferry_run(ctx, plan, NULL);
    CHECK_EQ_I(r, FERRY_ESHORT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "pattern.bin");
    ferry_plan_destroy(plan);
    ferry_stats st;
    ferry_stats_get(ctx, &st);
    CHECK(st.path[FERRY_PATH_HOST].bytes > 0);
    CHECK(st.path[FERRY_PATH_STAGED].bytes == 0);
    if (direct == FERRY_DIRECT_ON) CHECK(st.direct_bytes > 0 || access("/dev/shm", F_OK) == 0);
    if (direct == FERRY_DIRECT_OFF) CHECK(st.direct_bytes == 0);
    free(mem);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}

static void test_reads_buffered_1_thread(void) { reads_with(1, FERRY_DIRECT_OFF); }
static void test_reads_buffered_8_threads(void) { reads_with(8, FERRY_DIRECT_OFF); }
static void test_reads_direct_8_threads(void) { reads_with(8, FERRY_DIRECT_ON); }
static void test_reads_auto(void) { reads_with(4, FERRY_DIRECT_AUTO); }

static void test_empty_file(void) {
    char path[512];
    make_path(path, "empty.bin");
    write_pattern(path, 0);
    ferry_ctx *ctx = make_ctx(2, FERRY_DIRECT_AUTO);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx, path, FERRY_READ, &f), 0);
    uint8_t b[16];
    CHECK_EQ_I(ferry_file_size(f), 0);
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(b, 16), 0, 16, 0), 0);
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(b, 0), 0, 0, 0), 0);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}

static void test_errors(void) {
    ferry_ctx *ctx = make_ctx(2, FERRY_DIRECT_AUTO);
    ferry_file *f = NULL;
    char path[512];
    make_path(path, "does-not-exist.bin");
    CHECK_EQ_I(ferry_file_open(ctx, path, FERRY_READ, &f), -ENOENT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "does-not-exist.bin");
    CHECK(f == NULL);
    CHECK_EQ_I(ferry_file_open(ctx, dir_, FERRY_READ, &f), -EISDIR);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "directory");
    CHECK_EQ_I(ferry_file_open(ctx, path, 0, &f), FERRY_EINVAL);
    /* a buffer smaller than the request */
    make_path(path, "small.bin");
    write_pattern(path, 100);
    CHECK_EQ_I(ferry_file_open(ctx, path, FERRY_READ, &f), 0);
    uint8_t b[8];
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(b, 8), 0, 100, 0), FERRY_EINVAL);
    /* writing to a file opened read-only */
    CHECK(ferry_pwrite(f, ferry_host_buf(b, 8), 0, 8, 0) == -EBADF);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "small.bin");
    ferry_file_close(f);
    /* GPU memory without CUDA, or a forced host path with GPU memory */
    if (ferry_cuda_device_count(ctx) == 0) {
        CHECK_EQ_I(ferry_file_open(ctx, path, FERRY_READ, &f), 0);
        CHECK_EQ_I(ferry_pread(f, ferry_cuda_buf(0, 0x1000, 8), 0, 8, 0) < 0, 1);
        CHECK(strlen(ferry_errmsg(ctx)) > 0);
        ferry_file_close(f);
    }
    CHECK(strcmp(ferry_strerror(-ENOENT), strerror(ENOENT)) == 0);
    CHECK(strcmp(ferry_strerror(FERRY_ESHORT), "file ends before the requested data") == 0);
    ferry_file_close(NULL);
    ferry_ctx_destroy(NULL);
    ferry_plan_destroy(NULL);
    ferry_job_destroy(NULL);
    ferry_ctx_destroy(ctx);
}

/* Permission denied needs a user without CAP_DAC_OVERRIDE: drop to nobody in a child. */
static void test_permission_denied(void) {
    char path[512];
    make_path(path, "secret.bin");
    write_pattern(path, 10);
    chmod(path, 0);
    pid_t pid = fork();
    if (pid == 0) {
        if (geteuid() == 0 && setuid(65534) != 0) _exit(3);
        ferry_ctx *ctx = make_ctx(1, FERRY_DIRECT_OFF);
        ferry_file *f;
        int rc = ferry_file_open(ctx, path, FERRY_READ, &f);
        _exit(rc == -EACCES && strstr(ferry_errmsg(ctx), "secret.bin") ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void writes_with(ferry_direct direct) {
    char path[512];
    make_path(path, "written.bin");
    ferry_ctx *ctx = make_ctx(4, direct);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx, path, FERRY_READ | FERRY_WRITE | FERRY_CREATE | FERRY_TRUNC, &f), 0);
    uint64_t n = (3 << 20) + 4097;
    uint8_t *src = malloc(n + 1), *back = malloc(n + 1);
    for (uint64_t i = 0; i < n; i++) src[i + 1 - 1] = byte_at(i);
    /* aligned offset with an unaligned source, then an unaligned offset */
    ferry_plan *plan;
    ferry_plan_create(&plan);
    CHECK_EQ_I(ferry_plan_write(plan, f, 0, 2 << 20, ferry_host_buf(src, n), 0), 0);
    CHECK_EQ_I(ferry_plan_write(plan, f, 2 << 20, n - (2 << 20), ferry_host_buf(src, n), 2 << 20), 0);
    ferry_run_opts o = {.path = FERRY_PATH_AUTO, .threads = 0, .flags = FERRY_SYNC};
    CHECK_EQ_I(ferry_run(ctx, plan, &o), (int64_t)n);
    ferry_plan_destroy(plan);
    CHECK_EQ_I(ferry_file_size(f), (int64_t)n);
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(back, n), 0, n, 0), (int64_t)n);
    CHECK(memcmp(src, back, n) == 0);
    /* overwrite in the middle at an odd offset */
    CHECK_EQ_I(ferry_pwrite(f, ferry_host_buf(src + 1, 5000), 777, 5000, 0), 5000);
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(back, 5000), 777, 5000, 0), 5000);
    CHECK(memcmp(src + 1, back, 5000) == 0);
    free(src);
    free(back);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}
static void test_writes_buffered(void) { writes_with(FERRY_DIRECT_OFF); }
static void test_writes_direct(void) { writes_with(FERRY_DIRECT_ON); }

/* A plan of many extents: strided placement, fills, merged adjacent reads. */
static void test_plan_place_fill(void) {
    char path[512];
    make_path(path, "grid.bin");
    /* a 6x8 uint16 C-order array stored contiguously */
    uint16_t grid[6][8];
    for (int i = 0; i < 6; i++) for (int j = 0; j < 8; j++) grid[i][j] = (uint16_t)(i * 100 + j);
    FILE *fp = fopen(path, "wb"); fwrite(grid, sizeof grid, 1, fp); fclose(fp);
    ferry_ctx *ctx = make_ctx(3, FERRY_DIRECT_OFF);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx, path, FERRY_READ, &f), 0);
    /* destination 4x5: rows 1..4 (every other col from 1) of the grid -> dst[0..2], then a filled row */
    uint16_t dst[4][5];
    memset(dst, 0, sizeof dst);
    ferry_plan *plan;
    ferry_plan_create(&plan);
    ferry_place p = {2, 2, {3, 4}, {16, 4}, {10, 2}, 0};
    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.kind = FERRY_EXTENT_READ; e.file = f; e.offset = 1 * 16 + 2; e.length = 3 * 16; e.decoded_size = 48;
    e.dst = ferry_host_buf(dst, sizeof dst); e.dst_offset = 0; e.place = &p; e.label = "grid";
    CHECK_EQ_I(ferry_plan_add(plan, &e), 0);
    ferry_place q = {1, 2, {5}, {0}, {2}, 0};
    ferry_extent fl;
    memset(&fl, 0, sizeof fl);
    fl.kind = FERRY_EXTENT_FILL; fl.dst = ferry_host_buf(dst, sizeof dst); fl.dst_offset = 3 * 10; fl.place = &q;
    fl.fill[0] = 0x34; fl.fill[1] = 0x12;
    CHECK_EQ_I(ferry_plan_add(plan, &fl), 0);
    /* dst[3][4] etc: filled 0x1234; also a contiguous byte fill into nothing is fine */
    CHECK_EQ_I(ferry_run(ctx, plan, NULL), 48);
    for (int i = 0; i < 3; i++) for (int j = 0; j < 4; j++) CHECK_EQ_I(dst[i][j], grid[i + 1][1 + 2 * j]);
    for (int j = 0; j < 5; j++) CHECK_EQ_I(dst[3][j], 0x1234);
    for (int i = 0; i < 3; i++) CHECK_EQ_I(dst[i][4], 0);
    /* a placement reaching outside the destination is refused before any I/O */
    ferry_place bad = {2, 2, {3, 5}, {16, 4}, {10, 2}, 0};
    e.place = &bad;
    CHECK_EQ_I(ferry_plan_add(plan, &e), FERRY_EINVAL);
    ferry_plan_destroy(plan);
    /* many adjacent extents merge into few reads and still land right */
    uint8_t *big = malloc(1 << 20);
    char p2[512];
    make_path(p2, "pattern.bin");
    ferry_file *g;
    CHECK_EQ_I(ferry_file_open(ctx, p2, FERRY_READ, &g), 0);
    ferry_plan_create(&plan);
    for (int i = 0; i < 256; i++) ferry_plan_read(plan, g, 100 + (uint64_t)i * 4096, 4096, ferry_host_buf(big, 1 << 20), (uint64_t)i * 4096);
    CHECK_EQ_I(ferry_plan_count(plan), 256);
    CHECK_EQ_I(ferry_plan_file_bytes(plan), 1 << 20);
    CHECK_EQ_I(ferry_run(ctx, plan, NULL), 1 << 20);
    CHECK(check_pattern(big, 100, 1 << 20));
    ferry_plan_destroy(plan);
    free(big);
    ferry_file_close(g);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}

/* Extents that name a path: the engine opens the files itself. */
static void test_plan_paths(void) {
    char path[512];
    make_path(path, "pattern.bin");
    ferry_ctx *ctx = make_ctx(4, FERRY_DIRECT_OFF);
    uint8_t *buf = malloc(64 * 1000);
    ferry_plan *plan;
    ferry_plan_create(&plan);
    for (int i = 0; i < 64; i++) {
        ferry_extent e;
        memset(&e, 0, sizeof e);
        e.kind = FERRY_EXTENT_READ; e.path = path; e.offset = (uint64_t)i * 7777; e.length = 1000;
        e.dst = ferry_host_buf(buf, 64 * 1000); e.dst_offset = (uint64_t)i * 1000;
        CHECK_EQ_I(ferry_plan_add(plan, &e), 0);
    }
    CHECK_EQ_I(ferry_run(ctx, plan, NULL), 64000);
    for (int i = 0; i < 64; i++) CHECK(check_pattern(buf + i * 1000, (uint64_t)i * 7777, 1000));
    ferry_plan_clear(plan);
    ferry_extent e;
    memset(&e, 0, sizeof e);
    char missing[512];
    make_path(missing, "chunk-missing");
    e.kind = FERRY_EXTENT_READ; e.path = missing; e.length = 10; e.dst = ferry_host_buf(buf, 10); e.label = "temperature";
    ferry_plan_add(plan, &e);
    CHECK_EQ_I(ferry_run(ctx, plan, NULL), -ENOENT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "chunk-missing");

    /* FERRY_EXTENT_MISSING_FILLS: an absent file fills the box, a present one
     * is read into it; every other failure stays an error */
    ferry_place pl = {2, 2, {3, 4}, {2 * 100, 2}, {2 * 4, 2}, 0};   /* 3 rows of 4 int16 */
    const char *paths[3] = {missing, path, "/dev/null/x"};             /* ENOENT, file, ENOTDIR */
    for (int k = 0; k < 3; k++) {
        ferry_plan_clear(plan);
        memset(buf, 0x11, 64 * 1000);
        memset(&e, 0, sizeof e);
        e.kind = FERRY_EXTENT_READ; e.path = paths[k]; e.offset = 0; e.length = 2 * 100 * 2 + 8;
        e.dst = ferry_host_buf(buf, 64 * 1000); e.dst_offset = 6; e.place = &pl;
        e.flags = FERRY_EXTENT_MISSING_FILLS;
        e.fill[0] = 0xCD; e.fill[1] = 0xAB;
        CHECK_EQ_I(ferry_plan_add(plan, &e), 0);
        int64_t r = ferry_run(ctx, plan, NULL);
        CHECK_EQ_I(r, k == 1 ? (int64_t)e.length : 0);
        int ok = 1;
        for (int row = 0; row < 3; row++)
            for (int c = 0; c < 8; c++) {
                uint8_t want = k == 1 ? byte_at((uint64_t)row * 200 + (uint64_t)c) : (c % 2 ? 0xAB : 0xCD);
                if (buf[6 + row * 8 + c] != want) ok = 0;
            }
        CHECK(ok && buf[5] == 0x11 && buf[6 + 24] == 0x11);
    }
    ferry_plan_clear(plan);
    e.place = NULL;                                   /* needs a placement */
    CHECK_EQ_I(ferry_plan_add(plan, &e), FERRY_EINVAL);
    e.place = &pl; e.kind = FERRY_EXTENT_FILL;        /* only for reads */
    CHECK_EQ_I(ferry_plan_add(plan, &e), FERRY_EINVAL);
    e.kind = FERRY_EXTENT_READ; e.flags = 1u << 7;    /* unknown flag */
    CHECK_EQ_I(ferry_plan_add(plan, &e), FERRY_EINVAL);
    e.flags = FERRY_EXTENT_MISSING_FILLS; e.path = path; make_path(missing, "dir-not-file");
    mkdir(missing, 0755);                             /* a directory is an error, not absent */
    e.path = missing;
    CHECK_EQ_I(ferry_plan_add(plan, &e), 0);
    CHECK(ferry_run(ctx, plan, NULL) < 0);
    rmdir(missing);
    ferry_plan_destroy(plan);
    free(buf);
    ferry_ctx_destroy(ctx);
}

struct submitter { ferry_ctx *ctx; const char *path; int ok; };

static void *submit_many(void *arg) {
    struct submitter *s = arg;
    ferry_file *f;
    s->ok = ferry_file_open(s->ctx, s->path, FERRY_READ, &f) == 0;
    uint8_t *buf = malloc(3 << 20);
    for (int round = 0; round < 20 && s->ok; round++) {
        uint64_t off = (uint64_t)round * 12345;
        ferry_plan *plan;
        ferry_plan_create(&plan);
        ferry_plan_read(plan, f, off, 3 << 20, ferry_host_buf(buf, 3 << 20), 0);
        ferry_job *job;
        if (ferry_submit(s->ctx, plan, NULL, &job) != 0) s->ok = 0;
        ferry_plan_destroy(plan);   /* the job owns a copy */
        if (s->ok && ferry_job_wait(job, -1) != (3 << 20)) s->ok = 0;
        if (s->ok && !ferry_job_done(job)) s->ok = 0;
        ferry_job_destroy(job);
        if (s->ok && !check_pattern(buf, off, 3 << 20)) s->ok = 0;
    }
    free(buf);
    ferry_file_close(f);
    return NULL;
}

static void test_concurrent_submitters(void) {
    char path[512];
    make_path(path, "pattern.bin");
    ferry_ctx *ctx = make_ctx(6, FERRY_DIRECT_OFF);
    pthread_t t[8];
    struct submitter s[8];
    for (int i = 0; i < 8; i++) { s[i] = (struct submitter){ctx, path, 0}; pthread_create(&t[i], NULL, submit_many, &s[i]); }
    for (int i = 0; i < 8; i++) { pthread_join(t[i], NULL); CHECK(s[i].ok); }
    ferry_stats st;
    ferry_stats_get(ctx, &st);
    CHECK_EQ_I(st.jobs, 8 * 20);
    ferry_ctx_destroy(ctx);
}

static void test_async_and_timeout(void) {
    char path[512];
    make_path(path, "pattern.bin");
    ferry_ctx *ctx = make_ctx(2, FERRY_DIRECT_OFF);
    ferry_file *f;
    ferry_file_open(ctx, path, FERRY_READ, &f);
    uint8_t *buf = malloc(6 << 20);
    ferry_plan *plan;
    ferry_plan_create(&plan);
    ferry_plan_read(plan, f, 0, 6 << 20, ferry_host_buf(buf, 6 << 20), 0);
    ferry_run_opts o = {.path = FERRY_PATH_AUTO, .threads = 1, .flags = 0};   /* one worker for this call */
    ferry_job *job;
    CHECK_EQ_I(ferry_submit(ctx, plan, &o, &job), 0);
    int64_t r = ferry_job_wait(job, 0);
    CHECK(r == FERRY_ETIMEDOUT || r == (6 << 20));
    CHECK_EQ_I(ferry_job_wait(job, -1), 6 << 20);
    CHECK_EQ_I(ferry_job_path(job), FERRY_PATH_HOST);
    ferry_job_destroy(job);
    CHECK(check_pattern(buf, 0, 6 << 20));
    /* cancel: the job fails with ECANCELED or has already finished */
    CHECK_EQ_I(ferry_submit(ctx, plan, NULL, &job), 0);
    ferry_job_cancel(job);
    r = ferry_job_wait(job, -1);
    CHECK(r == FERRY_ECANCELED || r == (6 << 20));
    ferry_job_destroy(job);
    ferry_plan_destroy(plan);
    free(buf);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}

/* The GPU-decode and event tuning variables are checked when a context is
 * made: a misspelt value fails there, naming it (it used to mean the
 * default quietly: FERRY_GPU_STAGE=rign staged like "calls"). */
static void test_tuning_env_checked(void) {
    static const char *bad[][2] = {
        {"FERRY_GPU_STAGE", "rign"}, {"FERRY_GPU_SLOTS", "9"}, {"FERRY_GPU_SLOTS", "four"},
        {"FERRY_GPU_CALL", "0"}, {"FERRY_GPU_TAIL", "maybe"},
        {"FERRY_GPU_RING", "4K"}, {"FERRY_GPU_BATCH", "lots"}, {"FERRY_GPU_POOL", "-1"},
        {"FERRY_GPU_FEEDERS", "2x"}, {"FERRY_GPU_RATES", "6.3,25"}, {"FERRY_GPU_RATES", "6.3,25,0.4,1"},
        {"FERRY_GPU_CHECK", "some"}, {"FERRY_GPU_SHARE", "held"}, {"FERRY_EVENT_SYNC", "sleep"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv(bad[i][0], bad[i][1], 1);
        ferry_ctx *ctx = NULL;
        CHECK_EQ_I(ferry_ctx_create(&ctx, NULL), FERRY_EINVAL);
        CHECK_STR_CONTAINS(ferry_errmsg(NULL), bad[i][0]);
        CHECK_STR_CONTAINS(ferry_errmsg(NULL), bad[i][1]);
        unsetenv(bad[i][0]);
    }
    static const char *good[][2] = {
        {"FERRY_GPU_STAGE", "ring"}, {"FERRY_GPU_STAGE", "calls"}, {"FERRY_GPU_SLOTS", "8"},
        {"FERRY_GPU_RING", "16M"}, {"FERRY_GPU_RATES", "6.34,25,0.46"},
        {"FERRY_GPU_TAIL", "balance"}, {"FERRY_GPU_TAIL", "off"}, {"FERRY_GPU_TAIL", "on"}, {"FERRY_GPU_STAGE", "auto"},
        {"FERRY_GPU_CHECK", "one"}, {"FERRY_GPU_CHECK", "all"}, {"FERRY_GPU_SHARE", "pair"}, {"FERRY_GPU_SHARE", "running"},
        {"FERRY_EVENT_SYNC", "blocking"},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        setenv(good[i][0], good[i][1], 1);
        ferry_ctx *ctx = NULL;
        CHECK_EQ_I(ferry_ctx_create(&ctx, NULL), 0);
        ferry_ctx_destroy(ctx);
        unsetenv(good[i][0]);
    }
}

/* The knobs' table (config.c, `ferry info --knobs`): every row named,
 * documented, with a default; the context knobs checked when a context is
 * made (a bad value fails ferry_ctx_create naming it); a context made with
 * no_env checks none and ferry_knob gives it none, and its readers (the GPU
 * decode stage, the job knobs, the pool's spin, gather, the workers' event
 * waits, NUMA placement) read nothing of the environment: a read runs with
 * every knob of the table set to garbage. */
static void test_knob_table_and_no_env(void) {
    size_t n;
    const ferry_knob_row *t = ferry_knob_table(&n);
    CHECK(n >= 40);
    for (size_t k = 0; k < n; k++) {
        CHECK(!strncmp(t[k].name, "FERRY_", 6) && t[k].def && *t[k].def && t[k].doc && *t[k].doc);
        CHECK(t[k].kind != FERRY_KNOB_WORD || (t[k].words && *t[k].words));
        CHECK((t[k].kind != FERRY_KNOB_COUNT && t[k].kind != FERRY_KNOB_INT) || t[k].lo <= t[k].hi);
        for (size_t m = 0; m < k; m++) CHECK(strcmp(t[k].name, t[m].name) != 0);
    }
    char **saved = calloc(n, sizeof *saved);   /* the caller's values (make test-cudasim sets some) */
    for (size_t k = 0; k < n; k++) saved[k] = getenv(t[k].name) ? strdup(getenv(t[k].name)) : NULL;
    for (size_t k = 0; k < n; k++) {
        setenv(t[k].name, "(not a value)", 1);
        ferry_ctx *ctx = NULL;
        if (ferry_knob_scope(&t[k]) == FERRY_KNOB_CONTEXT) {
            CHECK_EQ_I(ferry_ctx_create(&ctx, NULL), FERRY_EINVAL);   /* every context row checked */
            CHECK_STR_CONTAINS(ferry_errmsg(NULL), t[k].name);
        }
        ferry_config cfg;
        ferry_config_init(&cfg);
        cfg.no_env = 1;
        CHECK_EQ_I(ferry_ctx_create(&ctx, &cfg), 0);
        CHECK(ferry_knob(ctx, t[k].name) == NULL);
        ferry_ctx_destroy(ctx);
        CHECK_STR_CONTAINS(ferry_knob(NULL, t[k].name), "not a value");
        if (saved[k]) setenv(t[k].name, saved[k], 1); else unsetenv(t[k].name);
    }
    /* all of them at once, but the process-wide loaders' (no context governs those) */
    for (size_t k = 0; k < n; k++)
        if (ferry_knob_scope(&t[k]) != FERRY_KNOB_PROCESS) setenv(t[k].name, "(not a value)", 1);
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.no_env = 1;
    cfg.threads = 4;
    ferry_ctx *ctx = NULL;
    CHECK_EQ_I(ferry_ctx_create(&ctx, &cfg), 0);
    enum { N = 256, SZ = 4096 };
    char path[] = "/tmp/ferry_knobs_XXXXXX";
    int fd = mkstemp(path);
    uint8_t *src = malloc(N * SZ), *dst = calloc(N, SZ);
    for (size_t i = 0; i < (size_t)N * SZ; i++) src[i] = (uint8_t)(i * 13 + 5);
    CHECK(fd >= 0 && write(fd, src, (size_t)N * SZ) == (ssize_t)N * SZ);
    close(fd);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx, path, FERRY_READ, &f), 0);
    ferry_plan *p;
    ferry_plan_create(&p);
    for (int i = 0; i < N; i++)   /* small records in shuffled order: packs, the pool, the job knobs */
        ferry_plan_read(p, f, (uint64_t)((i * 97) % N) * SZ, SZ, ferry_host_buf(dst, (size_t)N * SZ), (uint64_t)i * SZ);
    CHECK_EQ_I(ferry_run(ctx, p, NULL), (int64_t)N * SZ);
    int ok = 1;
    for (int i = 0; i < N && ok; i++) ok = !memcmp(dst + (size_t)i * SZ, src + (size_t)((i * 97) % N) * SZ, SZ);
    CHECK(ok);
    ferry_plan_destroy(p);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
    unlink(path);
    free(src);
    free(dst);
    for (size_t k = 0; k < n; k++) {
        if (saved[k]) setenv(t[k].name, saved[k], 1); else unsetenv(t[k].name);
        free(saved[k]);
    }
    free(saved);
}

static void test_config_env(void) {
    setenv("FERRY_THREADS", "3", 1);
    setenv("FERRY_TASK_SIZE", "2M", 1);
    setenv("FERRY_STAGING_SIZE", "1M", 1);
    setenv("FERRY_PATH", "staged", 1);
    ferry_ctx *ctx;
    CHECK_EQ_I(ferry_ctx_create(&ctx, NULL), 0);
    ferry_config c;
    ferry_ctx_config(ctx, &c);
    CHECK_EQ_I(c.threads, 3);
    CHECK_EQ_I(c.task_size, 2 << 20);
    CHECK_EQ_I(c.path, FERRY_PATH_STAGED);
    CHECK(c.staging_count >= 2);
    ferry_ctx_destroy(ctx);
    setenv("FERRY_PATH", "warp", 1);
    CHECK_EQ_I(ferry_ctx_create(&ctx, NULL), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "warp");
    unsetenv("FERRY_THREADS"); unsetenv("FERRY_TASK_SIZE"); unsetenv("FERRY_PATH"); unsetenv("FERRY_STAGING_SIZE");
    ferry_path p;
    CHECK_EQ_I(ferry_path_parse("cufile", &p), 0);
    CHECK_EQ_I(p, FERRY_PATH_CUFILE);
    CHECK(strcmp(ferry_path_name(FERRY_PATH_STAGED), "staged") == 0);
    CHECK(strcmp(ferry_version(), FERRY_VERSION_STRING) == 0);
}

static void test_cached(void) {
    char path[512];
    make_path(path, "pattern.bin");
    ferry_ctx *ctx = make_ctx(1, FERRY_DIRECT_OFF);
    ferry_file *f;
    ferry_file_open(ctx, path, FERRY_READ, &f);
    int64_t sz = ferry_file_size(f);
    int64_t c = ferry_file_cached(f, 0, (uint64_t)sz);
    CHECK(c >= 0 && c <= sz);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}

/* A forked child cannot use the parent's engine (its workers do not exist
 * there): submitting fails with a clear error and destroying is harmless; a
 * context the child makes works there, and is refused in the child's child. */
static void test_fork_child(void) {
    char path[512];
    make_path(path, "pattern.bin");
    ferry_ctx *ctx = make_ctx(2, FERRY_DIRECT_OFF);
    ferry_file *f;
    ferry_file_open(ctx, path, FERRY_READ, &f);
    uint8_t *buf = malloc(1 << 20);
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(buf, 1 << 20), 0, 1 << 20, 0), 1 << 20);   /* workers start */
    pid_t pid = fork();
    if (pid == 0) {
        int64_t r = ferry_pread(f, ferry_host_buf(buf, 1 << 20), 0, 1 << 20, 0);
        int ok = r == FERRY_EINVAL && strstr(ferry_errmsg(ctx), "fork") != NULL;
        ferry_ctx_destroy(ctx);                       /* must not hang */
        ferry_ctx *mine;                              /* a new context works */
        ok = ok && ferry_ctx_create(&mine, NULL) == 0;
        ferry_file *g;
        ok = ok && ferry_file_open(mine, path, FERRY_READ, &g) == 0;
        ok = ok && ferry_pread(g, ferry_host_buf(buf, 1 << 20), 7, 1 << 20, 0) == (1 << 20) && check_pattern(buf, 7, 1 << 20);
        /* a grandchild is refused the child's context too (the process id ferry keeps is
         * renewed at every fork, not only the first) */
        pid_t gp = ok ? fork() : -1;
        if (gp == 0) {
            int64_t rg = ferry_pread(g, ferry_host_buf(buf, 1 << 20), 0, 1 << 20, 0);
            _exit(rg == FERRY_EINVAL && strstr(ferry_errmsg(mine), "fork") != NULL ? 0 : 1);
        }
        int gs = 0;
        ok = ok && gp > 0 && waitpid(gp, &gs, 0) == gp && WIFEXITED(gs) && WEXITSTATUS(gs) == 0;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    free(buf);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}

int main(void) {
    snprintf(dir_, sizeof dir_, "%s/ferry-test-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir_)) { perror("mkdtemp"); return 1; }
    RUN(test_reads_buffered_1_thread);
    RUN(test_reads_buffered_8_threads);
    RUN(test_reads_direct_8_threads);
    RUN(test_reads_auto);
    RUN(test_empty_file);
    RUN(test_errors);
    RUN(test_permission_denied);
    RUN(test_writes_buffered);
    RUN(test_writes_direct);
    RUN(test_plan_place_fill);
    RUN(test_plan_paths);
    RUN(test_concurrent_submitters);
    RUN(test_async_and_timeout);
    RUN(test_config_env);
    RUN(test_tuning_env_checked);
    RUN(test_knob_table_and_no_env);
    RUN(test_cached);
    RUN(test_fork_child);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir_);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir_);
    return check_summary();
}
