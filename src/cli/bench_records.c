/* bench_records.c — `ferry bench --records SIZE[,SIZE...]`: small random
 * records (shuffled rows of an array, token windows) read from one page-cached
 * file, each measure beside the limits of the same run:
 *   - raw: N threads, one pread per record into a private buffer (the limit
 *     of the page cache and the system calls);
 *   - ferry into host memory: one plan per batch of records (a batch buffer
 *     filled row after row, as a dataset does), --depth batches in flight
 *     (2 by default; the datasets keep prefetch + 1 = 5);
 *   - ferry into device memory, rows in batch order (contiguous destination:
 *     the packed staging buffer reaches the device in one copy) and rows
 *     scattered in a random order (one copy into device scratch, then one
 *     scatter kernel);
 *   - pinned host-to-device copies (the copy limit).
 * With --cold every measurement starts with the file dropped from the page
 * cache (posix_fadvise DONTNEED): shuffled records read cold, where ferry's
 * readahead hints (FERRY_READAHEAD, src/engine/pack.c) are measured. With
 * --reread the batches are submitted with FERRY_REREAD, as the datasets submit
 * their epochs (records of 1 MiB and more then read through the page cache
 * while the file fits the context's share: exec.c, cacheshare.c).
 * Every batch that ferry fills is verified. GB/s are 10^9 bytes/s; CPU us per
 * record (user + system time of the process) is the steadier figure on a
 * machine shared with other work. */
#include "cli/args.h"
#include "cli/cli.h"
#include <getopt.h>
#include "common.h"
#include "engine/gather.h"   /* ferry_gather_counts: how the device batches went */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "cli/bench_util.h"

static double cpu_used_;   /* CPU seconds of the last best measurement */
static unsigned run_flags_; /* --reread: FERRY_REREAD on every batch */

static uint64_t rng_(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

/* a record at byte `off` (a multiple of 8) holds bench_word(off/8 ...) */
static int verify_rec(const uint8_t *p, uint64_t off, uint64_t n) {
    uint64_t w;
    for (uint64_t i = 0; i + 8 <= n; i += 8) { memcpy(&w, p + i, 8); if (w != bench_word((off + i) / 8)) return 0; }
    return 1;
}

static int make_file(const char *path, uint64_t size) {
    struct stat st;
    if (stat(path, &st) == 0 && (uint64_t)st.st_size == size) return 0;
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) return -1;
    size_t chunk = 8u << 20;
    uint64_t *buf = malloc(chunk);
    for (uint64_t off = 0; off < size; off += chunk) {
        size_t n = size - off < chunk ? (size_t)(size - off) : chunk;
        for (size_t i = 0; i < n / 8; i++) buf[i] = bench_word(off / 8 + i);
        if (write(fd, buf, n) != (ssize_t)n) { free(buf); close(fd); return -1; }
    }
    free(buf);
    close(fd);
    return 0;
}

static void warm(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    static uint8_t b[1 << 20];
    while (read(fd, b, sizeof b) > 0) {}
    close(fd);
}

/* the file out of the page cache (clean pages: no root needed) */
static void drop(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* ---- the limit: plain threads, one pread per record ---------------------- */
typedef struct rec_arg { int fd; const uint64_t *offs; uint64_t n, rec, cap; _Atomic uint64_t *next; int err; } rec_arg;

static void *rec_worker(void *p) {
    rec_arg *a = p;
    uint8_t *buf = NULL;
    uint64_t pos = 0;   /* the record goes to buf + pos; cap > rec: a destination that moves, like a batch */
    if (posix_memalign((void **)&buf, 4096, a->cap) != 0) { a->err = 1; return NULL; }
    for (;;) {
        uint64_t i = atomic_fetch_add(a->next, 256);
        if (i >= a->n) break;
        uint64_t e = i + 256 < a->n ? i + 256 : a->n;
        for (; i < e; i++) {
            if (pread(a->fd, buf + pos, a->rec, (off_t)a->offs[i]) != (ssize_t)a->rec) a->err = 1;
            pos = pos + 2 * a->rec <= a->cap ? pos + a->rec : 0;
        }
    }
    free(buf);
    return NULL;
}

static double raw_records(const char *path, const uint64_t *offs, uint64_t n, uint64_t rec, uint64_t cap, int threads) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    _Atomic uint64_t next = 0;
    pthread_t th[256];
    rec_arg a[256];
    double t0 = bench_now(), c0 = bench_cpu_seconds();
    for (int t = 0; t < threads; t++) {
        a[t] = (rec_arg){fd, offs, n, rec, cap, &next, 0};
        pthread_create(&th[t], NULL, rec_worker, &a[t]);
    }
    int err = 0;
    for (int t = 0; t < threads; t++) { pthread_join(th[t], NULL); err |= a[t].err; }
    double dt = bench_now() - t0;
    cpu_used_ = bench_cpu_seconds() - c0;
    close(fd);
    return err ? -1 : dt;
}

/* ---- ferry: one plan per batch, `depth` batches in flight ----------------- */
#define MAX_DEPTH 16

static double ferry_records(ferry_ctx *ctx, ferry_file *f, const uint64_t *offs, uint64_t n, uint64_t rec,
                            uint64_t batch, int depth, ferry_buf *bufs, int scatter, uint8_t *check, char *why,
                            size_t whylen) {
    ferry_plan *plans[MAX_DEPTH];
    ferry_job *jobs[MAX_DEPTH] = {0};
    uint64_t first[MAX_DEPTH] = {0};
    uint32_t *perm = malloc(batch * sizeof *perm);
    for (uint64_t i = 0; i < batch; i++) perm[i] = (uint32_t)i;
    uint64_t s = 12345;
    if (scatter)
        for (uint64_t i = batch - 1; i > 0; i--) { uint64_t k = rng_(&s) % (i + 1); uint32_t t = perm[i]; perm[i] = perm[k]; perm[k] = t; }
    for (int k = 0; k < depth; k++) ferry_plan_create(&plans[k]);
    uint64_t nb = n / batch;
    int bad = 0;
    double t0 = bench_now(), c0 = bench_cpu_seconds();
    for (uint64_t b = 0; b < nb + (uint64_t)depth && !bad; b++) {
        int k = (int)(b % (uint64_t)depth);
        if (jobs[k]) {   /* the batch submitted depth batches ago */
            int64_t r = ferry_job_wait(jobs[k], -1);
            if (r != (int64_t)(batch * rec)) { snprintf(why, whylen, "%s", ferry_errmsg(ctx)); bad = 1; }
            ferry_job_destroy(jobs[k]);
            jobs[k] = NULL;
            if (!bad && first[k] / batch + 1 == nb) {   /* verify the last batch */
                const uint8_t *p = bufs[k].ptr;
                if (bufs[k].kind == FERRY_MEM_CUDA) {
                    ferry_memcpy(ctx, ferry_host_buf(check, batch * rec), bufs[k], batch * rec);
                    p = check;
                }
                for (uint64_t i = 0; i < batch && !bad; i++)
                    if (!verify_rec(p + perm[i] * rec, offs[first[k] + i], rec)) { snprintf(why, whylen, "VERIFY FAILED"); bad = 2; }
            }
        }
        if (b >= nb || bad) continue;
        ferry_plan_clear(plans[k]);
        for (uint64_t i = 0; i < batch; i++)
            ferry_plan_read(plans[k], f, offs[b * batch + i], rec, bufs[k], perm[i] * rec);
        first[k] = b * batch;
        ferry_run_opts o = {FERRY_PATH_AUTO, 0, run_flags_, FERRY_DECODE_AUTO};
        if (ferry_submit(ctx, plans[k], &o, &jobs[k]) != 0) { snprintf(why, whylen, "%s", ferry_errmsg(ctx)); bad = 1; }
    }
    double dt = bench_now() - t0;
    cpu_used_ = bench_cpu_seconds() - c0;
    for (int k = 0; k < depth; k++) { ferry_job_destroy(jobs[k]); ferry_plan_destroy(plans[k]); }
    free(perm);
    if (bad == 2) return -2;
    return bad ? -1 : dt;
}

static void print_row(const char *what, uint64_t bytes, uint64_t n, double dt, double cpu, double limit_dt, const char *why) {
    if (dt < 0) { printf("  %-44s %s\n", what, why && *why ? why : "failed"); return; }
    printf("  %-44s %8.2f GB/s %8.3f us/record %7.3f CPU us/record", what, bytes / dt / 1e9, dt * 1e6 / (double)n,
           cpu * 1e6 / (double)n);
    if (limit_dt > 0) printf("   %.2fx the limit", limit_dt / dt);
    printf("\n");
}

/* SIZE[,SIZE...] through the one size grammar (cli_size: ferry_size_parse). A
 * strtoull loop once stopped at the K of "4K" and then spun there forever. */
#define MAX_RECORD_SIZES 16
static int parse_records(const char *list, uint64_t *recs, int *n) {
    char buf[512];
    if (snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf) {
        fprintf(stderr, "ferry bench: --records: the list is too long\n");
        return -1;
    }
    *n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_RECORD_SIZES) {
            fprintf(stderr, "ferry bench: --records: at most %d sizes\n", MAX_RECORD_SIZES);
            return -1;
        }
        if (cli_size("bench", "records", tok, 8, &recs[(*n)++]) < 0) return -1;
    }
    if (!*n) return cli_size("bench", "records", list, 8, &recs[0]);
    return 0;
}

int ferry_cli_bench_records(int argc, char **argv) {
    const char *file = "ferry-records.bin", *list = "150528,8192,4096";
    uint64_t size = 4ull << 30, count = 100000, batch = 256;
    int threads = 16, device = 0, reps = 2, failed = 0, cold = 0, depth = 2;
    /* the same strict option parsing as every `ferry` command (args.h): a bad value
     * or an unknown option is a message and exit status 2, never a silent default */
    static const struct option longopts[] = {
        {"records", required_argument, NULL, 'R'}, {"file", required_argument, NULL, 'f'},
        {"size", required_argument, NULL, 's'},    {"count", required_argument, NULL, 'n'},
        {"batch", required_argument, NULL, 'b'},   {"threads", required_argument, NULL, 't'},
        {"device", required_argument, NULL, 'd'},  {"reps", required_argument, NULL, 'r'},
        {"cold", no_argument, NULL, 'C'},          {"depth", required_argument, NULL, 'D'},
        {"reread", no_argument, NULL, 'E'},        {NULL, 0, NULL, 0}};
    int count_i = (int)count, batch_i = (int)batch;
    run_flags_ = 0;
    optind = 0;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, ":", longopts, NULL)) != -1;) {
        int bad = 0;
        switch (c) {
        case 'R': list = optarg; break;
        case 'f': file = optarg; break;
        case 's': bad = cli_size("bench", "size", optarg, 1 << 20, &size); break;
        case 'n': bad = cli_int("bench", "count", optarg, 1, 1 << 30, &count_i); break;
        case 'b': bad = cli_int("bench", "batch", optarg, 1, 1 << 20, &batch_i); break;
        case 't': bad = cli_int("bench", "threads", optarg, 1, 256, &threads); break;
        case 'd': bad = cli_int("bench", "device", optarg, 0, 1023, &device); break;
        case 'r': bad = cli_int("bench", "reps", optarg, 1, 1000, &reps); break;
        case 'C': cold = 1; break;
        case 'E': run_flags_ |= FERRY_REREAD; break;
        case 'D': bad = cli_int("bench", "depth", optarg, 1, MAX_DEPTH, &depth); break;
        default:
            cli_bad_option("bench", c, optopt, argv[optind - 1]);
            fprintf(stderr, "usage: ferry bench --records SIZE[,SIZE...] [--file PATH] [--size N] [--count N]\n"
                            "                   [--batch N] [--threads N] [--device N] [--reps N] [--cold]\n"
                            "                   [--depth N (batches in flight, 1-16)] [--reread]\n");
            return 2;
        }
        if (bad) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "ferry bench: unexpected argument \"%s\" (ferry bench --help)\n", argv[optind]);
        return 2;
    }
    count = (uint64_t)count_i;
    batch = (uint64_t)batch_i;
    uint64_t recs[MAX_RECORD_SIZES];
    int nrecs;
    if (parse_records(list, recs, &nrecs) < 0) return 2;
    if (count < batch) { fprintf(stderr, "ferry bench: --count %llu is below --batch %llu\n",
                                 (unsigned long long)count, (unsigned long long)batch); return 2; }
    size &= ~(uint64_t)7;
    if (make_file(file, size) != 0) { fprintf(stderr, "ferry bench: cannot write %s: %s\n", file, strerror(errno)); return 1; }
    if (!cold) warm(file);
    ferry_ctx *ctx;
    if (ferry_ctx_create(&ctx, NULL) != 0) { fprintf(stderr, "ferry bench: %s\n", ferry_errmsg(NULL)); return 1; }
    ferry_config cfg;
    ferry_ctx_config(ctx, &cfg);
    int gpu = ferry_cuda_device_count(ctx) > device;
    printf("ferry bench --records: %s, %.2f GB %s, %llu random records per size, batches of %llu,\n"
           "  raw limit with %d threads; ferry with %d threads, staging %d x %zu KiB, %d batches in flight%s; best of %d\n",
           file, size / 1e9, cold ? "dropped from the page cache before each measurement" : "page-cached",
           (unsigned long long)count, (unsigned long long)batch, threads, cfg.threads,
           cfg.staging_count, cfg.staging_size >> 10, depth, run_flags_ & FERRY_REREAD ? " (FERRY_REREAD)" : "", reps);
    ferry_file *f;
    if (ferry_file_open(ctx, file, FERRY_READ, &f) != 0) { fprintf(stderr, "ferry bench: %s\n", ferry_errmsg(ctx)); return 1; }
    if (gpu) {   /* the copy limit: pinned host -> device, 256 MiB */
        uint64_t n = 256u << 20;
        void *h;
        uintptr_t d;
        if (ferry_pinned_alloc(ctx, n, &h) == 0 && ferry_cuda_malloc(ctx, device, n, &d) == 0) {
            memset(h, 1, n);
            double best = 1e9;
            for (int r = 0; r < 3; r++) {
                double t0 = bench_now();
                ferry_memcpy(ctx, ferry_cuda_buf(device, d, n), ferry_host_buf(h, n), n);
                double dt = bench_now() - t0;
                if (dt < best) best = dt;
            }
            printf("  %-44s %8.2f GB/s\n", "pinned host->device copy (256 MiB)", n / best / 1e9);
            ferry_cuda_free(ctx, d);
            ferry_pinned_free(ctx, h);
        }
    }
    for (int ri = 0; ri < nrecs; ri++) {
        uint64_t rec = recs[ri];
        if (rec < 8 || rec % 8 || rec > size) { fprintf(stderr, "ferry bench: record size %llu (a multiple of 8 up to the file size)\n", (unsigned long long)rec); continue; }
        uint64_t nrec = size / rec, n = count / batch * batch;
        uint64_t *offs = malloc(n * sizeof *offs), s = 0x1234567 + rec;
        for (uint64_t i = 0; i < n; i++) offs[i] = (rng_(&s) % nrec) * rec;
        uint64_t bytes = n * rec;
        printf(" records of %llu bytes (%.2f GB per pass):\n", (unsigned long long)rec, bytes / 1e9);
        double lim = 1e9, lim_cpu = 0;
        for (int r = 0; r < reps; r++) {
            if (cold) drop(file);
            double dt = raw_records(file, offs, n, rec, rec, threads);
            if (dt > 0 && dt < lim) { lim = dt; lim_cpu = cpu_used_; }
        }
        char label[96];
        snprintf(label, sizeof label, "pread limit, %d threads", threads);
        print_row(label, bytes, n, lim, lim_cpu, -1, NULL);
        /* the same preads into a batch-sized destination per thread: the limit
         * reuses one record-sized buffer that stays in the CPU cache, where a
         * batch is fresh memory (8 KiB records: 2.10 CPU us per record for the
         * limit, 2.40 for this row, 2.38 for ferry into host batches) */
        double lim2 = 1e9, lim2_cpu = 0;
        uint64_t cap = batch * rec > rec ? batch * rec : rec;
        for (int r = 0; r < reps; r++) {
            if (cold) drop(file);
            double dt = raw_records(file, offs, n, rec, cap, threads);
            if (dt > 0 && dt < lim2) { lim2 = dt; lim2_cpu = cpu_used_; }
        }
        snprintf(label, sizeof label, "pread, %d threads, into batch-sized buffers", threads);
        print_row(label, bytes, n, lim2, lim2_cpu, lim, NULL);
        uint8_t *check = malloc(batch * rec);
        /* mode 0: host batches; 1: device, rows in order; 2: device, rows scattered.
         * The two device modes run interleaved, rep by rep, each rep in the other
         * order: what one leaves behind (the gather pool's images, sized for the
         * record size before) or a drift of the machine falls on both, not on the
         * one that runs first (8 KiB in order once read 17.1 GB/s against 27.8
         * scattered, in order always measured first after 150 KB records) */
        static const char *names[3] = {"ferry -> host batches", "ferry -> device batches (rows in order)",
                                       "ferry -> device batches (rows scattered)"};
        int nmodes = gpu ? 3 : 1;
        ferry_buf bufs[3][MAX_DEPTH];
        int ok[3] = {1, 1, 1};
        double best[3] = {-1, -1, -1}, best_cpu[3] = {0, 0, 0};
        char why[3][512] = {"", "", ""};
        ferry_gather_stats gs0[3], gs1[3];
        memset(gs1, 0, sizeof gs1);
        uint64_t io_direct[3] = {0, 0, 0}, io_buffered[3] = {0, 0, 0};   /* how ferry's rows read, every rep */
        for (int mode = 0; mode < nmodes; mode++)
            for (int k = 0; k < depth; k++) {
                if (mode == 0) {
                    void *h = NULL;
                    ok[mode] &= posix_memalign(&h, 4096, batch * rec) == 0;
                    if (h) memset(h, 0, batch * rec);
                    bufs[mode][k] = ferry_host_buf(h, batch * rec);
                } else {
                    uintptr_t d = 0;
                    ok[mode] &= ferry_cuda_malloc(ctx, device, batch * rec, &d) == 0;
                    bufs[mode][k] = ferry_cuda_buf(device, d, batch * rec);
                }
            }
        for (int r = 0; r < reps; r++) {
            int seq[3] = {0, r % 2 ? 2 : 1, r % 2 ? 1 : 2};
            for (int si = 0; si < nmodes; si++) {
                int mode = seq[si];
                if (!ok[mode] || (r > 0 && best[mode] < 0)) continue;   /* failed: not again */
                if (cold) drop(file);
                ferry_gather_stats a, b;
                ferry_gather_counts(ctx, &a);
                ferry_stats_reset(ctx);
                double dt = ferry_records(ctx, f, offs, n, rec, batch, depth, bufs[mode], mode == 2, check, why[mode],
                                          sizeof why[mode]);
                ferry_gather_counts(ctx, &b);
                ferry_stats io;
                ferry_stats_get(ctx, &io);
                io_direct[mode] += io.direct_bytes;
                io_buffered[mode] += io.buffered_bytes;
                if (r == 0) gs0[mode] = a;
                gs1[mode].jobs += b.jobs - a.jobs;
                gs1[mode].copies += b.copies - a.copies;
                gs1[mode].no_image += b.no_image - a.no_image;
                gs1[mode].tasks += b.tasks - a.tasks;
                gs1[mode].span_bytes += b.span_bytes - a.span_bytes;
                gs1[mode].image_bytes += b.image_bytes - a.image_bytes;
                if (dt == -2) failed = 1;
                if (dt > 0 && (best[mode] < 0 || dt < best[mode])) { best[mode] = dt; best_cpu[mode] = cpu_used_; }
                if (dt < 0) best[mode] = -1, ok[mode] = 0;
            }
        }
        (void)gs0;
        for (int mode = 0; mode < nmodes; mode++) {
            print_row(names[mode], bytes, n, best[mode], best_cpu[mode], lim, why[mode]);
            printf("    read with O_DIRECT %.2f GB, through the page cache %.2f GB (every rep)\n",
                   (double)io_direct[mode] / 1e9, (double)io_buffered[mode] / 1e9);
            if (mode > 0) {   /* gathered (src/engine/gather.c) or packed, over every rep */
                const ferry_gather_stats *g = &gs1[mode];
                uint64_t nb = (uint64_t)reps * (n / batch);
                printf("    %llu of %llu batches gathered", (unsigned long long)g->jobs, (unsigned long long)nb);
                if (g->jobs)
                    printf(" (%.2f copies, %.1f tasks of %.0f KiB each; %.1f MiB spans in %.1f MiB images)",
                           (double)g->copies / (double)g->jobs, (double)g->tasks / (double)g->jobs,
                           (double)g->span_bytes / (double)g->tasks / 1024.0,
                           (double)g->span_bytes / (double)g->jobs / 1048576.0,
                           (double)g->image_bytes / (double)g->jobs / 1048576.0);
                printf("%s\n", g->no_image ? ", some found no free pinned image" : "");
            }
        }
        for (int mode = 0; mode < nmodes; mode++)
            for (int k = 0; k < depth; k++) {
                if (mode == 0) free(bufs[mode][k].ptr);
                else if (bufs[mode][k].ptr) ferry_cuda_free(ctx, (uintptr_t)bufs[mode][k].ptr);
            }
        free(check);
        free(offs);
    }
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
    return failed;
}
