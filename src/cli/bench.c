/* bench.c — `ferry bench`: every path on this machine, warm and cold, each
 * beside the limits measured in the same run (parallel pread into pinned
 * memory, pinned host-to-device copies, raw parallel O_DIRECT read and write)
 * and beside what users do today (one thread: pread into pinned, then copy).
 * Every read is verified. */
#include "cli/cli.h"
#include "cli/args.h"
#include "common.h"
#include "cuda/cuda.h"
#include "cuda/cufile.h"
#include <stdatomic.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include "cli/bench_util.h"

typedef struct bench_opts {
    uint64_t size;
    const char *file;
    int threads, device, reps, cold, keep, json, latency;
} bench_opts;


/* the file's contents: word i of 8 bytes is bench_word(i) */
static void fill_pattern(uint8_t *p, uint64_t off, uint64_t n) {   /* off, n multiples of 8 */
    uint64_t *w = (uint64_t *)p;
    for (uint64_t i = 0; i < n / 8; i++) w[i] = bench_word(off / 8 + i);
}
/* Measurements whose bytes did not verify: the command then exits 1 (a path
 * that cannot run on this machine is reported, not counted). */
static int failed_;

static int verify(const uint8_t *p, uint64_t off, uint64_t n) {
    const uint64_t *w = (const uint64_t *)p;
    for (uint64_t i = 0; i < n / 8; i++) if (w[i] != bench_word(off / 8 + i)) return 0;
    return 1;
}

/* --drop-caches: also drop the whole machine's clean page cache (root only).
 * Off by default: a benchmark must not take other processes' cached files
 * away; the bench file's own pages go with posix_fadvise(DONTNEED). */
static int drop_all_;

static int drop_cache(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    if (drop_all_ && geteuid() == 0) {
        sync();
        FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
        if (f) { fputs("1\n", f); fclose(f); }
    }
    return 0;
}

/* ---- raw baselines: plain threads, no engine ---------------------------- */
typedef struct raw_arg {
    int fd; uint64_t size, chunk; int tid, n; uint8_t *buf; int write; _Atomic uint64_t *next; int err;
} raw_arg;

static void *raw_worker(void *p) {
    raw_arg *a = p;
    for (;;) {
        uint64_t i = atomic_fetch_add(a->next, 1);
        uint64_t off = i * a->chunk;
        if (off >= a->size) break;
        uint64_t n = FERRY_MIN(a->chunk, a->size - off);
        ssize_t r = a->write ? pwrite(a->fd, a->buf, n, (off_t)off) : pread(a->fd, a->buf, n, (off_t)off);
        if (r < 0) { a->err = errno; break; }
    }
    return NULL;
}

/* Parallel pread (or pwrite) of the whole file by n threads into their own buffers. */
static double raw_parallel(const char *path, uint64_t size, int n, int direct, int write, void **bufs, uint64_t chunk) {
    int fd = open(path, (write ? O_WRONLY : O_RDONLY) | (direct ? O_DIRECT : 0));
    if (fd < 0) return -1;
    _Atomic uint64_t next = 0;
    pthread_t t[256];
    raw_arg a[256];
    double t0 = bench_now();
    for (int i = 0; i < n; i++) {
        a[i] = (raw_arg){fd, size, chunk, i, n, bufs[i], write, &next, 0};
        pthread_create(&t[i], NULL, raw_worker, &a[i]);
    }
    int err = 0;
    for (int i = 0; i < n; i++) { pthread_join(t[i], NULL); if (a[i].err) err = a[i].err; }
    if (write) fsync(fd);
    double dt = bench_now() - t0;
    close(fd);
    return err ? -1 : size / dt / 1e9;
}

/* Parallel pread of the whole file into one buffer (each chunk to its place). */
typedef struct into_arg { int fd; uint64_t size, chunk; uint8_t *dst; _Atomic uint64_t *next; int err; } into_arg;
static void *into_worker(void *p) {
    into_arg *a = p;
    for (;;) {
        uint64_t off = atomic_fetch_add(a->next, 1) * a->chunk;
        if (off >= a->size) break;
        uint64_t n = FERRY_MIN(a->chunk, a->size - off);
        if (pread(a->fd, a->dst + off, n, (off_t)off) < 0) { a->err = errno; break; }
    }
    return NULL;
}
static double raw_parallel_into(const char *path, uint64_t size, int n, void *dst, uint64_t chunk) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    _Atomic uint64_t next = 0;
    pthread_t t[256];
    into_arg a[256];
    double t0 = bench_now();
    for (int i = 0; i < n; i++) { a[i] = (into_arg){fd, size, chunk, dst, &next, 0}; pthread_create(&t[i], NULL, into_worker, &a[i]); }
    int err = 0;
    for (int i = 0; i < n; i++) { pthread_join(t[i], NULL); if (a[i].err) err = a[i].err; }
    double dt = bench_now() - t0;
    close(fd);
    return err ? -1 : size / dt / 1e9;
}

/* ---- report ---------------------------------------------------------------- */
static int json_;
static void row(const char *what, double gbs, double cpu_per_gb, const char *note) {
    if (json_) {
        printf("{\"what\": \"%s\", \"gbps\": %.3f, \"cpu_s_per_gb\": %.3f, \"note\": \"%s\"}\n", what, gbs, cpu_per_gb, note ? note : "");
        return;
    }
    if (gbs < 0) printf("  %-52s %10s   %s\n", what, "failed", note ? note : "");
    else if (cpu_per_gb >= 0) printf("  %-52s %7.2f GB/s  cpu %.2f s/GB  %s\n", what, gbs, cpu_per_gb, note ? note : "");
    else printf("  %-52s %7.2f GB/s  %s\n", what, gbs, note ? note : "");
}

/* "1.23x NAME", and where ferry is more than 5 % above the limit row, that
 * row is no limit at this size (a small --size measures the raw baseline's
 * thread start-up and first touches more than the machine's bound): say so
 * rather than print a ratio above 1 beside the word "limit". */
static void vs_limit(char *note, size_t cap, double rate, double limit, const char *name) {
    if (limit <= 0 || rate < 0) { snprintf(note, cap, "no %s measured", name); return; }
    double r = rate / limit;
    if (r > 1.05)
        snprintf(note, cap, "%.2fx %s: above it, so that row is no limit at this --size (try a larger one)", r, name);
    else
        snprintf(note, cap, "%.2fx %s", r, name);
}

/* bufs[256] below holds one staging buffer per raw-baseline thread */
#define FERRY_MAX_WORKERS_CLI 256

static void usage(FILE *to) {
    fprintf(to, "usage: ferry bench [--size SIZE] [--file PATH] [--threads N] [--device N]\n"
                "                   [--reps N] [--no-cold] [--no-latency] [--keep] [--json] [--drop-caches]\n"
                "       ferry bench --records SIZE[,SIZE...] [--count N] [--batch N] ...  (small random records)\n"
                "  --opt VALUE and --opt=VALUE both work. SIZE: 4G or 4GiB = 4*2^30, 4GB = 4*10^9.\n"
                "  --threads 1..256 (default: the engine's), --reps >= 1 (default 3).\n"
                "  Creates PATH (default ./ferry-bench.bin, size 512M), measures this machine's\n"
                "  limits and every ferry path warm and cold (cold needs posix_fadvise or root),\n"
                "  verifies every byte, prints GB/s (10^9 bytes/s, best of --reps) and ratios.\n"
                "  Cold runs drop the bench file's pages only (posix_fadvise DONTNEED);\n"
                "  --drop-caches (root) also drops the machine's whole clean page cache.\n");
}

typedef struct ctxs { ferry_ctx *ctx; ferry_file *f; } ctxs;

/* best-of-reps ferry read of the whole file into dst; verifies; cold drops the cache first */
static double ferry_read_rate(ferry_ctx *ctx, ferry_file *f, ferry_buf dst, uint64_t size, ferry_path path,
                              int reps, int cold, const char *file, uint8_t *check, double *cpu_gb, char *why, size_t whylen) {
    double best = -1, bestcpu = 0;
    for (int r = 0; r < reps; r++) {
        if (cold) drop_cache(file);
        ferry_plan *plan;
        ferry_plan_create(&plan);
        ferry_plan_read(plan, f, 0, size, dst, 0);
        ferry_run_opts o = {path, 0, 0, FERRY_DECODE_AUTO};
        double c0 = bench_cpu_seconds(), t0 = bench_now();
        int64_t got = ferry_run(ctx, plan, &o);
        double dt = bench_now() - t0, dc = bench_cpu_seconds() - c0;
        ferry_plan_destroy(plan);
        if (got != (int64_t)size) { snprintf(why, whylen, "%s", ferry_errmsg(ctx)); return -1; }
        if (dst.kind == FERRY_MEM_CUDA) {
            if (ferry_memcpy(ctx, ferry_host_buf(check, size), dst, size) != 0) { snprintf(why, whylen, "%s", ferry_errmsg(ctx)); return -1; }
            if (!verify(check, 0, size)) { failed_++; snprintf(why, whylen, "VERIFY FAILED"); return -1; }
        } else if (!verify(dst.ptr, 0, size)) { failed_++; snprintf(why, whylen, "VERIFY FAILED"); return -1; }
        double gbs = size / dt / 1e9;
        if (gbs > best) { best = gbs; bestcpu = dc / (size / 1e9); }
        if (dst.kind == FERRY_MEM_HOST) memset(dst.ptr, 0, 4096);
    }
    *cpu_gb = bestcpu;
    return best;
}

static int cmp_d(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

int ferry_cli_bench(int argc, char **argv) {
    bench_opts o = {512ull << 20, "ferry-bench.bin", 0, 0, 3, 1, 0, 0, 1};
    /* --records: the small-record benchmark (bench_records.c) parses its own options */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--records") || !strncmp(argv[i], "--records=", 10)) return ferry_cli_bench_records(argc, argv);
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},       {"no-cold", no_argument, NULL, 'C'},
        {"no-latency", no_argument, NULL, 'L'}, {"keep", no_argument, NULL, 'k'},
        {"json", no_argument, NULL, 'j'},       {"size", required_argument, NULL, 's'},
        {"file", required_argument, NULL, 'f'}, {"threads", required_argument, NULL, 't'},
        {"device", required_argument, NULL, 'd'}, {"reps", required_argument, NULL, 'r'},
        {"drop-caches", no_argument, NULL, 'D'},  {NULL, 0, NULL, 0}};
    optind = 0;   /* full reset: main() may have parsed before */
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1;) {
        int bad = 0;
        switch (c) {
        case 'h': usage(stdout); return 0;
        case 'C': o.cold = 0; break;
        case 'L': o.latency = 0; break;
        case 'k': o.keep = 1; break;
        case 'j': o.json = 1; break;
        case 'D': drop_all_ = 1; break;
        case 's': bad = cli_size("bench", "size", optarg, 1, &o.size); break;
        case 'f': o.file = optarg; break;
        case 't': bad = cli_int("bench", "threads", optarg, 1, FERRY_MAX_WORKERS_CLI, &o.threads); break;
        case 'd': bad = cli_int("bench", "device", optarg, 0, 1023, &o.device); break;
        case 'r': bad = cli_int("bench", "reps", optarg, 1, 1000, &o.reps); break;
        default: cli_bad_option("bench", c, optopt, argv[optind - 1]); return 2;
        }
        if (bad) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "ferry bench: unexpected argument \"%s\" (ferry bench --help)\n", argv[optind]);
        return 2;
    }
    json_ = o.json;
    o.size = (o.size + (4 << 20) - 1) & ~(uint64_t)((4 << 20) - 1);
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.threads = o.threads;
    ferry_ctx *ctx;
    if (ferry_ctx_create(&ctx, &cfg) != 0) { fprintf(stderr, "ferry bench: %s\n", ferry_errmsg(NULL)); return 1; }
    ferry_ctx_config(ctx, &cfg);
    int ndev = ferry_cuda_device_count(ctx);
    int gpu = ndev > o.device;
    if (!json_) {
        printf("ferry bench %s: file %s, %.2f GB, %d threads, staging %d x %zu KiB per thread\n", ferry_version(), o.file,
               o.size / 1e9, cfg.threads, cfg.staging_count, cfg.staging_size >> 10);
        printf("  CUDA: %s\n", gpu ? "available" : (*ferry_cuda_status(ctx) ? ferry_cuda_status(ctx) : "no such device"));
        printf("  cuFile: %s\n", *ferry_cufile_status(ctx) ? ferry_cufile_status(ctx) : "GDS available");
    }
    uint8_t *host = NULL;
    if (posix_memalign((void **)&host, 4096, o.size) != 0) { fprintf(stderr, "ferry bench: out of memory\n"); return 1; }
    int nraw = cfg.threads;
    void *bufs[256];
    uint64_t chunk = 4u << 20;
    for (int i = 0; i < nraw; i++) if (ferry_pinned_alloc(ctx, chunk, &bufs[i]) != 0) return 1;
    for (int i = 0; i < nraw; i++) fill_pattern(bufs[i], 0, chunk);

    /* 1. write the file: raw parallel O_DIRECT (durable) is the write limit; ferry host->file */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.raw", o.file);
    { int fd = open(tmp, O_CREAT | O_TRUNC | O_WRONLY, 0644); if (fd >= 0) close(fd); }
    double raw_w = raw_parallel(tmp, o.size, nraw < 8 ? nraw : 8, 1, 1, bufs, chunk);
    if (raw_w < 0) raw_w = raw_parallel(tmp, o.size, nraw < 8 ? nraw : 8, 0, 1, bufs, chunk);
    unlink(tmp);
    fill_pattern(host, 0, o.size);
    ferry_file *f;
    if (ferry_file_open(ctx, o.file, FERRY_READ | FERRY_WRITE | FERRY_CREATE | FERRY_TRUNC, &f) != 0) {
        fprintf(stderr, "ferry bench: %s\n", ferry_errmsg(ctx));
        return 1;
    }
    if (!json_) printf("\nwrites (durable: fsync included)\n");
    row("limit: raw parallel O_DIRECT write, 8 threads", raw_w, -1, "");
    double c0 = bench_cpu_seconds(), t0 = bench_now();
    int64_t w = ferry_pwrite(f, ferry_host_buf(host, o.size), 0, o.size, FERRY_SYNC);
    double hw = w == (int64_t)o.size ? o.size / (bench_now() - t0) / 1e9 : -1;
    char note[512];
    snprintf(note, sizeof note, "%.2fx the raw limit", raw_w > 0 ? hw / raw_w : 0);
    row("ferry host memory -> file", hw, (bench_cpu_seconds() - c0) / (o.size / 1e9), w < 0 ? ferry_errmsg(ctx) : note);

    uintptr_t dptr = 0;
    if (gpu && ferry_cuda_malloc(ctx, o.device, o.size, &dptr) != 0) { fprintf(stderr, "ferry bench: %s\n", ferry_errmsg(ctx)); gpu = 0; }
    ferry_buf dbuf = ferry_cuda_buf(o.device, dptr, o.size);
    if (gpu) {
        ferry_memcpy(ctx, dbuf, ferry_host_buf(host, o.size), o.size);
        char path2[4096];
        snprintf(path2, sizeof path2, "%s.gpu", o.file);
        ferry_file *g;
        if (ferry_file_open(ctx, path2, FERRY_READ | FERRY_WRITE | FERRY_CREATE | FERRY_TRUNC, &g) == 0) {
            c0 = bench_cpu_seconds(); t0 = bench_now();
            w = ferry_pwrite(g, dbuf, 0, o.size, FERRY_SYNC);
            double gw = w == (int64_t)o.size ? o.size / (bench_now() - t0) / 1e9 : -1;
            snprintf(note, sizeof note, "%.2fx the raw limit", raw_w > 0 ? gw / raw_w : 0);
            row("ferry GPU memory -> file (staged)", gw, (bench_cpu_seconds() - c0) / (o.size / 1e9), w < 0 ? ferry_errmsg(ctx) : note);
            /* the GPU-written file must hold the same bytes */
            memset(host, 0, o.size);
            if (ferry_pread(g, ferry_host_buf(host, o.size), 0, o.size, 0) != (int64_t)o.size || !verify(host, 0, o.size))
                { failed_++; row("ferry GPU memory -> file (staged)", -1, -1, "VERIFY FAILED"); }
            ferry_file_close(g);
            unlink(path2);
        }
    }

    /* 2. warm page cache: limits */
    if (ferry_pread(f, ferry_host_buf(host, o.size), 0, o.size, 0) != (int64_t)o.size) { fprintf(stderr, "ferry bench: %s\n", ferry_errmsg(ctx)); return 1; }
    if (!json_) printf("\nreads, page cache warm (best of %d)\n", o.reps);
    double lim_pread = 0;
    void *bigpin = NULL;
    if (ferry_pinned_alloc(ctx, o.size, &bigpin) == 0) {
        for (int r = 0; r < o.reps; r++) { double x = raw_parallel_into(o.file, o.size, nraw, bigpin, chunk); if (x > lim_pread) lim_pread = x; }
        ferry_pinned_free(ctx, bigpin);
    }
    snprintf(note, sizeof note, "%d threads, 4 MiB preads into one pinned buffer of the file's size", nraw);
    row("limit: parallel pread -> pinned memory", lim_pread, -1, note);
    double lim_h2d = 0, user1 = 0;
    const ferry_cuda_api *cu = gpu ? ferry_cuda_load(NULL) : NULL;
    if (gpu) {
        ferry_cuda_use_device(o.device);
        CUstream s;
        cu->StreamCreate(&s, FERRY_CU_STREAM_NON_BLOCKING);
        uint64_t n = FERRY_MIN(o.size, (uint64_t)(1u << 30));
        void *pin;
        ferry_pinned_alloc(ctx, n, &pin);
        for (int r = 0; r < o.reps; r++) {
            double a = bench_now();
            for (uint64_t off = 0; off < o.size; off += n) cu->MemcpyHtoDAsync(dptr + off, pin, FERRY_MIN(n, o.size - off), s);
            cu->StreamSynchronize(s);
            double x = o.size / (bench_now() - a) / 1e9;
            if (x > lim_h2d) lim_h2d = x;
        }
        ferry_pinned_free(ctx, pin);
        row("limit: pinned host -> device copy, one stream", lim_h2d, -1, "");
        /* what users do today: one thread, pread into a pinned buffer, copy, repeat */
        int fd = open(o.file, O_RDONLY);
        for (int r = 0; r < o.reps && fd >= 0; r++) {
            double a = bench_now();
            for (uint64_t off = 0; off < o.size; off += chunk) {
                uint64_t m = FERRY_MIN(chunk, o.size - off);
                if (pread(fd, bufs[0], m, (off_t)off) != (ssize_t)m) break;
                cu->MemcpyHtoDAsync(dptr + off, bufs[0], m, s);
                cu->StreamSynchronize(s);
            }
            double x = o.size / (bench_now() - a) / 1e9;
            if (x > user1) user1 = x;
        }
        if (fd >= 0) close(fd);
        cu->StreamDestroy(s);
        row("today: 1 thread pread -> pinned, then copy", user1, -1, "");
    }
    double cpu_gb;
    char why[1024] = "";
    double hwarm = ferry_read_rate(ctx, f, ferry_host_buf(host, o.size), o.size, FERRY_PATH_AUTO, o.reps, 0, o.file, NULL, &cpu_gb, why, sizeof why);
    vs_limit(note, sizeof note, hwarm, lim_pread, "the parallel pread limit");
    row("ferry file -> host memory (host path)", hwarm, cpu_gb, hwarm < 0 ? why : note);
    if (gpu) {
        double sw = ferry_read_rate(ctx, f, dbuf, o.size, FERRY_PATH_STAGED, o.reps, 0, o.file, host, &cpu_gb, why, sizeof why);
        snprintf(note, sizeof note, "%.2fx pread limit, %.2fx H2D limit, %.1fx today's 1-thread path",
                 sw / lim_pread, lim_h2d > 0 ? sw / lim_h2d : 0, user1 > 0 ? sw / user1 : 0);
        if (lim_pread > 0 && sw > 1.05 * lim_pread) {
            size_t used = strlen(note);
            snprintf(note + used, sizeof note - used, " (above the pread row: no limit at this --size)");
        }
        row("ferry file -> GPU memory (staged)", sw, cpu_gb, sw < 0 ? why : note);
        double cw = ferry_read_rate(ctx, f, dbuf, o.size, FERRY_PATH_CUFILE, o.reps, 0, o.file, host, &cpu_gb, why, sizeof why);
        row(ferry_cufile_native() ? "ferry file -> GPU memory (cufile, GDS)" : "ferry file -> GPU memory (cufile, compat mode)",
            cw, cpu_gb, cw < 0 ? why : "");
    }

    /* 3. cold cache */
    if (o.cold) {
        if (!json_) printf("\nreads, page cache cold (posix_fadvise DONTNEED%s before each run)\n", drop_all_ && geteuid() == 0 ? " + drop_caches" : "");
        drop_cache(o.file);
        ferry_file *probe;
        ferry_file_open(ctx, o.file, FERRY_READ, &probe);
        int64_t res = ferry_file_cached(probe, 0, o.size);
        ferry_file_close(probe);
        if (!json_) printf("  (after dropping: %.1f%% of the file still cached)\n", 100.0 * (double)res / (double)o.size);
        double lim_cold = 0;
        void *dbufs[256];
        for (int i = 0; i < nraw; i++) dbufs[i] = bufs[i];
        int nt[4] = {1, 4, 8, 32};
        for (int k = 0; k < 4; k++) {
            int t = nt[k] > nraw ? nraw : nt[k];
            drop_cache(o.file);
            double x = raw_parallel(o.file, o.size, t, 1, 0, dbufs, chunk);
            snprintf(note, sizeof note, "%d threads", t);
            row("limit: raw parallel O_DIRECT read", x, -1, note);
            if (x > lim_cold) lim_cold = x;
        }
        double hc = ferry_read_rate(ctx, f, ferry_host_buf(host, o.size), o.size, FERRY_PATH_AUTO, 1, 1, o.file, NULL, &cpu_gb, why, sizeof why);
        vs_limit(note, sizeof note, hc, lim_cold, "the raw O_DIRECT limit");
        row("ferry file -> host memory, cold", hc, cpu_gb, hc < 0 ? why : note);
        if (gpu) {
            double sc = ferry_read_rate(ctx, f, dbuf, o.size, FERRY_PATH_STAGED, 1, 1, o.file, host, &cpu_gb, why, sizeof why);
            vs_limit(note, sizeof note, sc, lim_cold, "the raw O_DIRECT limit");
            row("ferry file -> GPU memory (staged), cold", sc, cpu_gb, sc < 0 ? why : note);
        }
    }

    /* 4. small reads into GPU memory: latency */
    if (gpu && o.latency) {
        if (!json_) printf("\nsmall reads into GPU memory, page cache warm: latency p50 / p99 (microseconds)\n");
        /* warm the page cache through it (O_DIRECT reads of a cold file would not) */
        ferry_pread(f, ferry_host_buf(host, o.size), 0, o.size, FERRY_NO_DIRECT);
        static const uint64_t sz[4] = {4096, 65536, 262144, 1 << 20};
        int fd = open(o.file, O_RDONLY);
        ferry_cuda_use_device(o.device);
        for (int k = 0; k < 4; k++) {
            enum { N = 300 };
            double a[N], b[N];
            for (int i = 0; i < N; i++) {
                uint64_t off = (bench_word((uint64_t)i * 7 + k) % (o.size / 4096 - 256)) * 4096;
                /* alternate which goes first, so neither always finds the other's pages cached */
                for (int pass = 0; pass < 2; pass++) {
                    if ((pass == 0) == (i % 2 == 0)) {
                        double t = bench_now();
                        ferry_pread(f, ferry_cuda_buf(o.device, dptr, sz[k]), off, sz[k], 0);
                        a[i] = (bench_now() - t) * 1e6;
                    } else {
                        double t = bench_now();
                        if (pread(fd, bufs[0], sz[k], (off_t)off) < 0) break;
                        cu->MemcpyHtoDAsync(dptr, bufs[0], sz[k], NULL);
                        cu->StreamSynchronize(NULL);
                        b[i] = (bench_now() - t) * 1e6;
                    }
                }
            }
            qsort(a, N, sizeof *a, cmp_d);
            qsort(b, N, sizeof *b, cmp_d);
            if (json_) printf("{\"what\": \"latency %" PRIu64 "\", \"ferry_p50_us\": %.1f, \"ferry_p99_us\": %.1f, \"pread_copy_p50_us\": %.1f, \"pread_copy_p99_us\": %.1f}\n",
                              sz[k], a[N / 2], a[N * 99 / 100], b[N / 2], b[N * 99 / 100]);
            else printf("  %7" PRIu64 " bytes: ferry %7.1f / %7.1f   pread + copy %7.1f / %7.1f\n", sz[k], a[N / 2], a[N * 99 / 100], b[N / 2], b[N * 99 / 100]);
        }
        if (fd >= 0) close(fd);
    }

    ferry_stats st;
    ferry_stats_get(ctx, &st);
    if (!json_) {
        printf("\npaths used (ferry_stats): ");
        for (int p = 1; p < FERRY_PATH_COUNT_; p++)
            printf("%s %.2f GB in %" PRIu64 " ops; ", ferry_path_name((ferry_path)p), st.path[p].bytes / 1e9, st.path[p].ops);
        printf("O_DIRECT %.2f GB, buffered %.2f GB\n", st.direct_bytes / 1e9, st.buffered_bytes / 1e9);
    }
    if (gpu) ferry_cuda_free(ctx, dptr);
    for (int i = 0; i < nraw; i++) ferry_pinned_free(ctx, bufs[i]);
    free(host);
    ferry_file_close(f);
    if (!o.keep) unlink(o.file);
    ferry_ctx_destroy(ctx);
    if (failed_) fprintf(stderr, "ferry bench: %d measurement(s) did not verify\n", failed_);
    return failed_ ? 1 : 0;
}
