/* test_gpu_budget.c — ferry_plan_budget (include/ferry_experimental.h): the
 * size of each job of a stream and the jobs to keep in the engine, from every
 * device byte the stream holds (its destinations, the decode's call slots)
 * and what the caller keeps free. The rule's edges (no free memory, a unit
 * larger than any device, a device that fits one job and not two, nothing
 * decoded on the GPU), then a stream of jobs beside a model that leaves
 * little free: every allocation of the caller — each next group, and what it
 * kept free — succeeds, and every group is byte-exact. Exact sizes need the
 * stand-in driver (FERRY_CUDASIM_MEM sets its device's size; tests/cudasim);
 * on a real GPU the rule's invariants are checked against its free memory.
 * Skips (exit 0, with the reason) without a GPU or without nvCOMP. */
#include "check.h"
#include "ferry.h"
#include "ferry_experimental.h"
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

static ferry_ctx *ctx_;
static char dir_[256];
static const uint64_t MiB = 1u << 20;

typedef long (*cudasim_count_fn)(const char *, int);
static cudasim_count_fn cudasim_counter(void) {
    void *sim = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    cudasim_count_fn f = sim ? (cudasim_count_fn)dlsym(sim, "cudasim_count") : NULL;
    if (sim) dlclose(sim);   /* RTLD_NOLOAD: the driver stays loaded, its symbols valid */
    return f;
}

/* the stand-in's device: `free_b` bytes free beside what is allocated now */
static void sim_free(cudasim_count_fn count, uint64_t free_b) {
    char mem[64];
    snprintf(mem, sizeof mem, "%llu", (unsigned long long)((uint64_t)count("device_live", 0) + free_b));
    setenv("FERRY_CUDASIM_MEM", mem, 1);
}

/* n chunks of cb bytes, zstd level 1, back to back in dir_/name */
typedef struct zchunks { uint8_t *src; uint64_t *off, *len, size; char path[600]; } zchunks;
static void zchunks_write(zchunks *z, const char *name, size_t n, size_t cb, unsigned seed) {
    uint8_t *file = malloc(n * (cb + 64));
    z->src = malloc(n * cb);
    z->off = malloc(n * 8);
    z->len = malloc(n * 8);
    z->size = 0;
    for (size_t i = 0; i < n * cb; i++) z->src[i] = (uint8_t)(((i / 4) * 7 + seed) % 251 ^ ((i % 4 == 3) ? 0x3f : 0));
    for (size_t i = 0; i < n; i++) {
        size_t k = ZSTD_compress(file + z->size, cb + 64, z->src + i * cb, cb, 1);
        if (ZSTD_isError(k)) k = 0;
        z->off[i] = z->size; z->len[i] = k; z->size += k;
    }
    snprintf(z->path, sizeof z->path, "%s/%s", dir_, name);
    int fd = open(z->path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd >= 0) { if (write(fd, file, z->size) != (ssize_t)z->size) z->size = 0; close(fd); }
    free(file);
}
static void zchunks_free(zchunks *z) { free(z->src); free(z->off); free(z->len); }

/* chunks first .. first+n of z (codec `codec`, cb decoded bytes each) into
 * device buffer d (device 0, or host memory when `host`) */
static ferry_plan *chunks_plan(ferry_file *f, const zchunks *z, uint32_t codec, size_t first, size_t n, uint64_t cb,
                               uintptr_t d, int host) {
    ferry_plan *p;
    ferry_plan_create(&p);
    for (size_t i = 0; i < n; i++) {
        ferry_extent e;
        memset(&e, 0, sizeof e);
        e.kind = FERRY_EXTENT_READ; e.file = f; e.offset = z->off[first + i]; e.length = z->len[first + i];
        e.codecs[0] = (ferry_codec){codec, 0}; e.ncodecs = 1;
        e.decoded_size = cb;
        e.dst = host ? ferry_host_buf((void *)d, n * cb) : ferry_cuda_buf(0, d, n * cb);
        e.dst_offset = i * cb;
        CHECK_EQ_I(ferry_plan_add(p, &e), 0);
    }
    return p;
}

/* The rule's edges. A stream of zstd chunks of 64 KiB decoded on the GPU,
 * in units (a dataset's batches) of 1 MiB. */
static void test_budget_rule(void) {
    cudasim_count_fn count = cudasim_counter();
    const uint64_t cb = 64 << 10;
    zchunks z;
    zchunks_write(&z, "rule.bin", 16, cb, 3);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, z.path, FERRY_READ, &f), 0);
    const uintptr_t fake = (uintptr_t)1 << 44;   /* addresses only: the plans are inspected, not run */
    static uint8_t hostbuf[16 << 16];
    ferry_plan *zs = chunks_plan(f, &z, FERRY_CODEC_ZSTD, 0, 16, cb, fake, 0);
    ferry_plan *lz = chunks_plan(f, &z, FERRY_CODEC_LZ4, 0, 16, cb, fake, 0);
    ferry_plan *host = chunks_plan(f, &z, FERRY_CODEC_ZSTD, 0, 16, cb, (uintptr_t)hostbuf, 1);
    ferry_budget b;
    uintptr_t held;   /* something allocated: the stand-in's size is then never "0" (no limit) */
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, MiB, &held), 0);
    /* bad arguments */
    CHECK_EQ_I(ferry_plan_budget(ctx_, zs, FERRY_DECODE_GPU, 0, 0, &b), FERRY_EINVAL);
    CHECK_EQ_I(ferry_plan_budget(ctx_, zs, FERRY_DECODE_GPU, MiB, 0, NULL), FERRY_EINVAL);
    CHECK_EQ_I(ferry_plan_budget(ctx_, NULL, FERRY_DECODE_GPU, MiB, 0, &b), FERRY_EINVAL);
    CHECK_EQ_I(ferry_plan_budget(ctx_, zs, 7, MiB, 0, &b), FERRY_EINVAL);
    /* nothing decoded on the GPU: one unit a job, any number of jobs */
    CHECK_EQ_I(ferry_plan_budget(ctx_, zs, FERRY_DECODE_CPU, MiB, 0, &b), 0);
    CHECK(b.units == 1 && b.job_bytes == MiB && b.jobs == 0);
    CHECK_EQ_I(ferry_plan_budget(ctx_, lz, FERRY_DECODE_AUTO, MiB, 0, &b), 0);   /* lz4: the CPU's under AUTO */
    CHECK(b.units == 1 && b.jobs == 0);
    CHECK_EQ_I(ferry_plan_budget(ctx_, host, FERRY_DECODE_GPU, MiB, 0, &b), 0);
    CHECK(b.units == 1 && b.jobs == 0);
    /* a large device: the stream's 2.5 GiB a job, two in the engine, a
     * quarter of the free memory kept by default */
    if (count) sim_free(count, 320ull << 30);
    CHECK_EQ_I(ferry_plan_budget(ctx_, zs, FERRY_DECODE_GPU, MiB, FERRY_KEEP_FREE_DEFAULT, &b), 0);
    printf("  large device: %llu units a job, %d in the engine, %llu MiB in all, %llu MiB free\n",
           (unsigned long long)b.units, b.jobs, (unsigned long long)(b.device_bytes / MiB),
           (unsigned long long)(b.free_bytes / MiB));
    if (count) {
        CHECK_EQ_I(b.units, 2560);
        CHECK_EQ_I(b.jobs, 2);
        CHECK_EQ_I(b.free_bytes, 320ull << 30);
        CHECK_EQ_I(b.keep_free, 80ull << 30);
    }
    CHECK(b.units >= 1 && b.job_bytes == b.units * MiB && b.jobs >= 1);
    CHECK(b.job_device_bytes > 0);
    CHECK(b.device_bytes == (uint64_t)(b.jobs + 2) * b.job_bytes + (uint64_t)b.jobs * b.job_device_bytes);
    CHECK(b.device_bytes + b.keep_free <= b.free_bytes);
    /* a unit larger than any device: a clear error, no overflow */
    CHECK_EQ_I(ferry_plan_budget(ctx_, zs, FERRY_DECODE_GPU, UINT64_MAX / 3, 0, &b), FERRY_ENOMEM);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "decode on the CPU");
    if (count) {
        /* no free memory at all */
        sim_free(count, 0);
        CHECK_EQ_I(ferry_plan_budget(ctx_, zs, FERRY_DECODE_GPU, MiB, FERRY_KEEP_FREE_DEFAULT, &b), FERRY_ENOMEM);
        CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "device 0");
        CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "0 MiB free");
        /* free memory shrinking a MiB at a time (what a model leaves): the
         * stream always fits it less keep_free; jobs shrink, then two in the
         * engine become one, then it fails — never the other way round */
        int last_jobs = 2, saw_one = 0, saw_fail = 0, saw_two = 0;
        uint64_t last_units = UINT64_MAX;
        for (int64_t m = 400; m >= 0; m--) {
            const uint64_t mb = (uint64_t)m;
            sim_free(count, mb * MiB);
            int rc = ferry_plan_budget(ctx_, zs, FERRY_DECODE_GPU, MiB, 8 * MiB, &b);
            if (rc < 0) {
                CHECK_EQ_I(rc, FERRY_ENOMEM);
                if (!saw_fail) {
                    printf("  %llu MiB free: %s\n", (unsigned long long)mb, ferry_errmsg(ctx_));
                    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "needs");
                    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "8 MiB kept free");
                }
                saw_fail = 1;
                last_jobs = 0;
                continue;
            }
            CHECK(!saw_fail);   /* once it fails, less memory fails too */
            CHECK(b.jobs == 1 || b.jobs == 2);
            CHECK(b.jobs <= last_jobs);
            CHECK(b.jobs < last_jobs || b.units <= last_units);
            CHECK(b.device_bytes + 8 * MiB <= mb * MiB);
            if (b.jobs == 1 && !saw_one)
                printf("  %llu MiB free: one job in the engine, %llu units\n", (unsigned long long)mb, (unsigned long long)b.units);
            saw_one |= b.jobs == 1;
            saw_two |= b.jobs == 2;
            last_jobs = b.jobs;
            last_units = b.units;
        }
        CHECK(saw_two && saw_one && saw_fail);
        unsetenv("FERRY_CUDASIM_MEM");
    }
    ferry_plan_destroy(zs); ferry_plan_destroy(lz); ferry_plan_destroy(host);
    ferry_cuda_free(ctx_, held);
    ferry_file_close(f);
    zchunks_free(&z);
}

/* The context's idle call slots of an earlier job go back to the driver
 * before the free memory is measured: they count as free. */
static void test_budget_gives_back_idle_slots(void) {
    cudasim_count_fn count = cudasim_counter();
    if (!count) { printf("  (needs the stand-in driver)\n"); return; }
    const uint64_t cb = 64 << 10;
    const size_t n = 256;
    zchunks z;
    zchunks_write(&z, "idle.bin", n, cb, 5);
    ferry_ctx *c = NULL;
    CHECK_EQ_I(ferry_ctx_create(&c, NULL), 0);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(c, z.path, FERRY_READ, &f), 0);
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(c, 0, n * cb, &d), 0);
    ferry_plan *p = chunks_plan(f, &z, FERRY_CODEC_ZSTD, 0, n, cb, d, 0);
    ferry_run_opts o;
    memset(&o, 0, sizeof o);
    o.decode = FERRY_DECODE_GPU;
    const long before = count("device_live", 0);
    CHECK_EQ_I(ferry_run(c, p, &o), (int64_t)z.size);
    const long idle = count("device_live", 0) - before;
    printf("  an earlier job left %ld bytes of idle call slots\n", idle);
    CHECK(idle > 0);
    sim_free(count, 256 * MiB);
    ferry_budget b;
    CHECK_EQ_I(ferry_plan_budget(c, p, FERRY_DECODE_GPU, MiB, FERRY_KEEP_FREE_DEFAULT, &b), 0);
    CHECK_EQ_I(b.free_bytes, 256 * MiB + (uint64_t)idle);
    CHECK_EQ_I(count("device_live", 0), before);
    unsetenv("FERRY_CUDASIM_MEM");
    ferry_plan_destroy(p);
    ferry_cuda_free(c, d);
    ferry_file_close(f);
    ferry_ctx_destroy(c);
    zchunks_free(&z);
}

/* A training loop beside a model that fills the GPU (tests/gpu's
 * test_engine_sized_groups_on_a_nearly_full_gpu[zarrz], which failed on an
 * 80 GB GPU: torch found 2 MiB free for the next 12 MiB group while the dataset's
 * decode buffers held the rest). Its shape: batches of 4 MiB in chunks of
 * 512 KiB, zstd; the device has `free_mb` MiB free beside what is allocated
 * now (the stand-in's size); nvCOMP's temp space is `temp_chunk` bytes a
 * chunk more than the stand-in's rule (a real nvCOMP's may be: the fixed 5
 * device bytes a decoded byte of ferry_plan_job_bytes then falls short). A
 * stream of groups runs as the budget says, the way XarrayDataset runs it:
 * each group's destination allocated by the caller, then submitted once
 * fewer than `jobs` are in the engine, the oldest handed out (checked
 * byte-exact) and freed when the next one is. After every hand-out the caller
 * allocates what the budget kept free (a model's next allocation), and every
 * group's allocation succeeds: ferry's call slots, running or idle, never
 * hold what the caller was promised. `old`: sized as before this budget
 * (ferry_plan_job_bytes, two jobs in the engine), to show the failure: the
 * caller's allocations fail, or ferry's own. */
static int last_jobs_;   /* the jobs in the engine the last stream ran with */
static int stream_beside_a_model(uint64_t free_mb, uint64_t temp_chunk, int groups, int old) {
    cudasim_count_fn count = cudasim_counter();
    const uint64_t cb = 512 << 10, unit = 4 * MiB;
    const size_t per_unit = (size_t)(unit / cb), nchunk = 24 * per_unit;
    zchunks z;
    zchunks_write(&z, "stream.bin", nchunk, cb, 7);
    ferry_ctx *c = NULL;
    CHECK_EQ_I(ferry_ctx_create(&c, NULL), 0);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(c, z.path, FERRY_READ, &f), 0);
    ferry_run_opts o;
    memset(&o, 0, sizeof o);
    o.decode = FERRY_DECODE_GPU;
    char tc[32];
    snprintf(tc, sizeof tc, "%llu", (unsigned long long)temp_chunk);
    setenv("FERRY_NVCOMPSIM_TEMP_CHUNK", tc, 1);
    /* the model: all but free_mb MiB */
    if (count) sim_free(count, free_mb * MiB);
    const uintptr_t fake = (uintptr_t)1 << 44;
    ferry_plan *like = chunks_plan(f, &z, FERRY_CODEC_ZSTD, 0, per_unit, cb, fake, 0);
    ferry_budget b;
    int rc = 0, failures = 0;
    if (old) {
        memset(&b, 0, sizeof b);
        const uint64_t jb = ferry_plan_job_bytes(c, like, FERRY_DECODE_GPU);
        b.units = jb ? (jb + unit - 1) / unit : 1;
        b.job_bytes = b.units * unit;
        b.jobs = 2;
        b.keep_free = 2 * MiB;   /* torch's next small allocation */
    } else {
        rc = ferry_plan_budget(c, like, FERRY_DECODE_GPU, unit, FERRY_KEEP_FREE_DEFAULT, &b);
        if (rc < 0) fprintf(stderr, "  %s\n", ferry_errmsg(c));
        CHECK_EQ_I(rc, 0);
    }
    ferry_plan_destroy(like);
    printf("  %llu MiB free, temp +%llu KiB a chunk%s: %llu batches a group, %d in the engine, %llu MiB kept free, "
           "%llu MiB of decode buffers a job\n",
           (unsigned long long)free_mb, (unsigned long long)(temp_chunk >> 10), old ? " (the rule before)" : "",
           (unsigned long long)b.units, b.jobs, (unsigned long long)(b.keep_free / MiB),
           (unsigned long long)(b.job_device_bytes / MiB));
    last_jobs_ = b.jobs;
    if (rc < 0 || b.jobs < 1) { failures++; goto out; }
    const size_t gchunks = (size_t)b.units * per_unit, ngroups_file = nchunk / gchunks;
    CHECK(ngroups_file >= 1);
    enum { MAXG = 64 };
    uintptr_t dst[MAXG] = {0};
    ferry_job *job[MAXG] = {0};
    ferry_plan *plan[MAXG] = {0};
    size_t first[MAXG];
    int engine_head = 0, consumed = -1, bad = 0, failed_alloc = 0, g;
    uint8_t *back = malloc(b.job_bytes);
    for (g = 0; g <= groups && g < MAXG; g++) {
        if (g < groups && ferry_cuda_malloc(c, 0, b.job_bytes, &dst[g]) < 0) {   /* the caller's next group */
            fprintf(stderr, "  group %d: the caller's allocation of %llu MiB failed: %s\n", g,
                    (unsigned long long)(b.job_bytes / MiB), ferry_errmsg(c));
            failed_alloc++;
            break;
        }
        /* room in the engine: wait for the oldest; it is handed out, and the
         * group handed out before it is freed (its batches dropped) */
        while (engine_head < g && (g - engine_head >= b.jobs || g == groups)) {
            const int k = engine_head++;
            int64_t got = ferry_job_wait(job[k], -1);
            uint64_t want = 0;
            for (size_t i = 0; i < gchunks; i++) want += z.len[first[k] + i];
            if (got != (int64_t)want) { fprintf(stderr, "  group %d: %s\n", k, ferry_errmsg(c)); bad++; }
            ferry_job_destroy(job[k]);
            job[k] = NULL;
            ferry_plan_destroy(plan[k]);
            ferry_memcpy(c, ferry_host_buf(back, b.job_bytes), ferry_cuda_buf(0, dst[k], b.job_bytes), b.job_bytes);
            if (got >= 0 && memcmp(back, z.src + first[k] * cb, b.job_bytes) != 0) bad++;
            if (consumed >= 0) { ferry_cuda_free(c, dst[consumed]); dst[consumed] = 0; }
            consumed = k;
            uintptr_t m;   /* the model's next allocation: what the budget kept free */
            if (ferry_cuda_malloc(c, 0, b.keep_free, &m) < 0) {
                fprintf(stderr, "  after group %d: the model's allocation of %llu MiB failed\n", k,
                        (unsigned long long)(b.keep_free / MiB));
                failed_alloc++;
            } else {
                ferry_cuda_free(c, m);
            }
        }
        if (g == groups) break;
        first[g] = (size_t)(g % (int)ngroups_file) * gchunks;
        plan[g] = chunks_plan(f, &z, FERRY_CODEC_ZSTD, first[g], gchunks, cb, dst[g], 0);
        CHECK_EQ_I(ferry_submit(c, plan[g], &o, &job[g]), 0);
    }
    for (int k = 0; k < MAXG; k++) {
        if (job[k]) { ferry_job_wait(job[k], -1); ferry_job_destroy(job[k]); ferry_plan_destroy(plan[k]); }
        if (dst[k]) ferry_cuda_free(c, dst[k]);
    }
    if (!old) {
        CHECK_EQ_I(failed_alloc, 0);
        CHECK_EQ_I(bad, 0);
    }
    failures += failed_alloc + bad;
    free(back);
out:
    unsetenv("FERRY_CUDASIM_MEM");
    unsetenv("FERRY_NVCOMPSIM_TEMP_CHUNK");
    ferry_file_close(f);
    ferry_ctx_destroy(c);
    zchunks_free(&z);
    return failures;
}

static void test_stream_beside_a_model(void) {
    if (!cudasim_counter()) { printf("  (needs the stand-in driver: a real GPU runs it in tests/gpu's Python test)\n"); return; }
    /* the rule before, for the record (not checked: whether its two jobs'
     * call slots are held at once when the caller allocates is timing): the
     * caller's allocation of a later 12 MiB group fails, as on the 80 GB GPU */
    const int before = stream_beside_a_model(256, 2 * MiB, 16, 1);
    printf("  the rule before: %d failures\n", before);
    stream_beside_a_model(256, 0, 12, 0);          /* the GPU test's 256 MiB */
    CHECK_EQ_I(last_jobs_, 2);
    stream_beside_a_model(256, 2 * MiB, 12, 0);    /* a larger temp space: smaller groups */
    stream_beside_a_model(120, 2 * MiB, 8, 0);     /* less: one job in the engine */
    CHECK_EQ_I(last_jobs_, 1);
    /* less still: no stream fits beside the 64 MiB kept free; the budget
     * says so, how much one job of one batch needs and how to lower it */
    cudasim_count_fn count = cudasim_counter();
    ferry_file *f;
    zchunks z;
    zchunks_write(&z, "nofit.bin", 8, 512 << 10, 9);
    CHECK_EQ_I(ferry_file_open(ctx_, z.path, FERRY_READ, &f), 0);
    ferry_plan *like = chunks_plan(f, &z, FERRY_CODEC_ZSTD, 0, 8, 512 << 10, (uintptr_t)1 << 44, 0);
    uintptr_t held;   /* something allocated: the stand-in's size is then never "0" (no limit) */
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, MiB, &held), 0);
    sim_free(count, 96 * MiB);
    setenv("FERRY_NVCOMPSIM_TEMP_CHUNK", "2097152", 1);
    ferry_budget b;
    CHECK_EQ_I(ferry_plan_budget(ctx_, like, FERRY_DECODE_GPU, 4 * MiB, FERRY_KEEP_FREE_DEFAULT, &b), FERRY_ENOMEM);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "needs 43 MiB at least");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "beside the 64 MiB kept free, and the device has 96 MiB free");
    unsetenv("FERRY_NVCOMPSIM_TEMP_CHUNK");
    unsetenv("FERRY_CUDASIM_MEM");
    ferry_cuda_free(ctx_, held);
    ferry_plan_destroy(like);
    ferry_file_close(f);
    zchunks_free(&z);
}

int main(void) {
    /* the stand-in's device work takes up to 2 ms an operation: a stream's
     * two jobs in the engine decode at once (each holds its call slots) */
    setenv("FERRY_CUDASIM_DELAY_US", "2000", 0);
    if (ferry_ctx_create(&ctx_, NULL) < 0 || ferry_cuda_device_count(ctx_) < 1) {
        printf("skipped: no CUDA device (%s)\n0 passed, 0 failed, 1 skipped\n", ctx_ ? ferry_cuda_status(ctx_) : "no context");
        return 0;
    }
    if (strncmp(ferry_nvcomp_status(ctx_), "loaded", 6) != 0) {
        printf("skipped: nvCOMP not loaded (%s)\n0 passed, 0 failed, 1 skipped\n", ferry_nvcomp_status(ctx_));
        ferry_ctx_destroy(ctx_);
        return 0;
    }
    snprintf(dir_, sizeof dir_, "/tmp/ferry_budget_%d", (int)getpid());
    mkdir(dir_, 0755);
    RUN(test_budget_rule);
    RUN(test_budget_gives_back_idle_slots);
    RUN(test_stream_beside_a_model);
    ferry_ctx_destroy(ctx_);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir_);
    if (system(cmd)) {}
    return check_summary();
}
