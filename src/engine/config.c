/* config.c — defaults, FERRY_* environment overrides, path names, and the
 * table of tuning knobs (knobs.h). */
#include "engine/engine.h"
#include "engine/knobs.h"
#include "engine/numa.h"
#include "sources/remote.h"
#include "sources/upload.h"
#include <ctype.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

static const char *const path_names[FERRY_PATH_COUNT_] = {"auto", "cufile", "staged", "host"};

const char *ferry_path_name(ferry_path p) {
    return (p >= 0 && p < FERRY_PATH_COUNT_) ? path_names[p] : "?";
}

int ferry_path_parse(const char *name, ferry_path *out) {
    for (int i = 0; i < FERRY_PATH_COUNT_; i++)
        if (name && strcasecmp(name, path_names[i]) == 0) { *out = (ferry_path)i; return 0; }
    return ferry_seterr(FERRY_EINVAL, "unknown path \"%s\" (auto, cufile, staged, host)", name ? name : "");
}

void ferry_config_init(ferry_config *cfg) { memset(cfg, 0, sizeof *cfg); }

static int env_size(const char *name, size_t *field) {
    const char *s = getenv(name);
    if (!s) return 0;
    int64_t v = ferry_knob_bytes(s);
    if (v < 0) return ferry_seterr(FERRY_EINVAL, "%s=\"%s\": not a size", name, s);
    *field = (size_t)v;
    return 0;
}

static int env_int(const char *name, int *field) {
    const char *s = getenv(name);
    if (!s) return 0;
    int64_t v = ferry_knob_bytes(s);
    if (v < 0 || v > 4096) return ferry_seterr(FERRY_EINVAL, "%s=\"%s\": not a count", name, s);
    *field = (int)v;
    return 0;
}

/* ---- the knobs ---------------------------------------------------------------
 * Every FERRY_* variable the library reads: name, grammar, default, range,
 * one line of doc, scope (knobs.h says what each scope means; where each is
 * read says why its default is what it is). ferry_config's own (FERRY_THREADS
 * to FERRY_DIRECT) are parsed into it by ferry_config_resolve below. */
static const ferry_knob_row knobs_[] = {
    {"FERRY_GPU_BATCH", FERRY_KNOB_SIZE, "total / (slots x feeders), 4-32 MiB", 1, 0, NULL, 0,
     "decoded bytes of a per-feeder batch; for a GPU-only queue the most bytes of one call"},
    {"FERRY_GPU_SLOTS", FERRY_KNOB_COUNT, "4 per feeder; 8 calls per device", 1, 8, NULL, 0,
     "batches each feeder keeps in flight, or cooperative calls in flight per device"},
    {"FERRY_GPU_CALL", FERRY_KNOB_COUNT, "from the queue (ferry_gpudecode_call_chunks)", 1, 4096, NULL, 0,
     "chunks per cooperative call of a GPU-only queue"},
    {"FERRY_GPU_FEEDERS", FERRY_KNOB_COUNT, "2", 1, 4096, NULL, 0, "GPU feeder threads of a shared CPU + GPU queue"},
    {"FERRY_GPU_TAIL", FERRY_KNOB_WORD, "balance for deflate, on for the rest", 0, 0, "on|off|1|0|balance", 0,
     "how much of a cooperative queue AUTO leaves to the CPU workers"},
    {"FERRY_GPU_CHECK", FERRY_KNOB_WORD, "all", 0, 0, "all|one", 0, "which feeders check a job's launched calls"},
    {"FERRY_GPU_SHARE", FERRY_KNOB_WORD, "pair", 0, 0, "pair|running", 0,
     "which other jobs a job's calls are planned beside"},
    {"FERRY_GPU_LINE", FERRY_KNOB_WORD, "on", 0, 0, "on|off|1|0", 0,
     "chunks at their files' places in a cache line of the pinned staging"},
    {"FERRY_GPU_STAGE", FERRY_KNOB_WORD, "calls", 0, 0, "auto|calls|ring", 1,
     "call slots' host staging: pinned whole (calls), through a pinned ring (ring), or ring first (auto)"},
    {"FERRY_GPU_RING", FERRY_KNOB_SIZE, "8M", 64 << 10, 0, NULL, 0, "bytes of each of a feeder's two pinned ring buffers"},
    {"FERRY_GPU_POOL", FERRY_KNOB_SIZE, "6G, or twice the largest idle set", 0, 0, NULL, 0,
     "bytes of idle call-slot sets a context keeps beyond one per device"},
    {"FERRY_GPU_RATES", FERRY_KNOB_RATES, "the built-in table (gpudecode_rates.c)", 0, 0, NULL, 0,
     "gpu_gbs,chunk_mbs,cpu_gbs_per_thread for shared queues and the big-job rule"},
    {"FERRY_EVENT_SYNC", FERRY_KNOB_WORD, "spin", 0, 0, "spin|blocking", 0,
     "how a worker waits for its copies' CUDA events"},
    {"FERRY_NUMA", FERRY_KNOB_WORD, "auto", 0, 0, "auto|off|0|", 1,
     "workers placed on their GPU's NUMA node"},
    /* ferry_config's, parsed by ferry_config_resolve */
    {"FERRY_THREADS", FERRY_KNOB_INT, "16, or the CPU count if larger", 0, 4096, NULL, 0, "worker threads of a context"},
    {"FERRY_TASK_SIZE", FERRY_KNOB_SIZE, "8M", 0, 0, NULL, 0, "the largest read task"},
    {"FERRY_STAGING_SIZE", FERRY_KNOB_SIZE, "2M", 0, 0, NULL, 0, "each pinned staging buffer"},
    {"FERRY_STAGING_COUNT", FERRY_KNOB_INT, "3 (at least 2)", 0, 4096, NULL, 0, "staging buffers per worker"},
    {"FERRY_SMALL_IO", FERRY_KNOB_SIZE, "the staging size", 0, 0, NULL, 0,
     "requests up to this size run on the caller's thread"},
    {"FERRY_PATH", FERRY_KNOB_WORD, "auto", 0, 0, "auto|cufile|staged|host", 1, "force a path for device memory"},
    {"FERRY_DECODE", FERRY_KNOB_WORD, "auto", 0, 0, "auto|gpu|cpu", 1,
     "where compressed chunks bound for device memory are decoded (ferry info --codecs)"},
    {"FERRY_DIRECT", FERRY_KNOB_WORD, "auto", 0, 0, "auto|on|off|1|0", 1, "O_DIRECT for cold ranges"},
    /* read once per context at first use (job.c, pool.c, gather.c, gpudecode_trace.c) */
    {"FERRY_SPIN_US", FERRY_KNOB_COUNT, "0", 0, 1000, NULL, 0,
     "microseconds an idle worker watches the queue before it sleeps"},
    {"FERRY_READAHEAD", FERRY_KNOB_WORD, "auto", 0, 0, "auto|on|off|1|0", 0,
     "WILLNEED announcements of cold packed records"},
    {"FERRY_READAROUND", FERRY_KNOB_TEXT, "4M", 0, 0, "a power of two from 64K to 1G, or 0 (off)", 0,
     "window that a batch's cold hints are widened to"},
    {"FERRY_PACK_MIN", FERRY_KNOB_SIZE, "64K", 4096, 1 << 30, NULL, 0, "least bytes of a packed task"},
    {"FERRY_MAP_MAX", FERRY_KNOB_SIZE, "64K", 0, 1 << 30, NULL, 0,
     "warm records up to this size are copied from a mapping (0: off)"},
    {"FERRY_GATHER", FERRY_KNOB_TEXT, "64M", 0, 0, "a size from 4K, or auto, off or 0", 0,
     "largest destination span gathered into one pinned image"},
    {"FERRY_DECODE_TRACE", FERRY_KNOB_FLAG, "off", 0, 0, NULL, 0, "one line per GPU-decode job on stderr"},
    /* read once per process, below the engine */
    {"FERRY_CUFILE", FERRY_KNOB_TEXT, "unset: load cuFile", 0, 0, "off", 0, "never load cuFile"},
    {"FERRY_NVRTC", FERRY_KNOB_TEXT, "libnvrtc.so.13/.12 on the library path", 0, 0, "a path", 0,
     "the NVRTC used for run-time kernels"},
    {"FERRY_KERNELS", FERRY_KNOB_WORD, "unset: the embedded fatbin", 0, 0, "nvrtc|none", 0, "which GPU kernels run"},
    {"FERRY_NVCOMP", FERRY_KNOB_TEXT, "the wheel's, then the library path", 0, 0, "a path, or off", 0,
     "which nvCOMP to load"},
    {"FERRY_NVJPEG", FERRY_KNOB_TEXT, "libnvjpeg.so.13, then .12, on the library path", 0, 0, "a path, or off", 0,
     "the nvJPEG library for GPU JPEG decoding"},
    {"FERRY_NO_LIBDEFLATE", FERRY_KNOB_FLAG, "unset: libdeflate where built", 0, 0, NULL, 0,
     "inflate with zlib instead of libdeflate (comparisons)"},
    {"FERRY_REMOTE_REQUEST_SIZE", FERRY_KNOB_SIZE, "8M", 4096, 1ll << 32, NULL, 0,
     "bytes per HTTP range request of a remote object (checked when a context is made)"},
    {"FERRY_REMOTE_CONNECTIONS", FERRY_KNOB_TEXT, "64", 0, 0, "a number from 1 to 1024", 0,
     "range requests in flight in the process"},
    {"FERRY_REMOTE_RETRIES", FERRY_KNOB_TEXT, "10", 0, 0, "a number from 0 to 100", 0,
     "retries of one request (timeouts, resets, 5xx, 429, SlowDown, short bodies)"},
    {"FERRY_REMOTE_RETRY_SECONDS", FERRY_KNOB_TEXT, "60", 0, 0, "seconds from 0 to 86400", 0,
     "time after which a read retries no more"},
    {"FERRY_REMOTE_STALL_SECONDS", FERRY_KNOB_TEXT, "30", 0, 0, "seconds from 1 to 3600", 0,
     "a request moving under 1 KiB/s this long counts as stalled"},
    {"FERRY_REMOTE_CA_BUNDLE", FERRY_KNOB_TEXT, "unset: CURL_CA_BUNDLE, SSL_CERT_FILE, the system's CAs", 0, 0,
     "a PEM file of CA certificates", 0,
     "the CAs that https:// servers' certificates are checked against (there is no switch to skip the check)"},
    {"FERRY_REMOTE_PART_SIZE", FERRY_KNOB_SIZE, "16M", 5ll << 20, 5ll << 30, NULL, 0,
     "bytes per part of an S3 multipart upload (ferry_object_write); objects up to it go in one PUT"},
    {"FERRY_S3_ADDRESSING", FERRY_KNOB_WORD, "auto", 0, 0, "path|virtual|auto", 0,
     "S3 bucket addressing: virtual-hosted on AWS for DNS-safe names"},
    {"FERRY_SYSFS_ROOT", FERRY_KNOB_TEXT, "\"\" (/sys)", 0, 0, "a directory", 0,
     "where the NUMA topology is read from (tests)"},
};
/* The rows that are not FERRY_KNOB_CONTEXT ones (knobs.h). */
static const char *const first_use_[] = {"FERRY_SPIN_US", "FERRY_READAHEAD", "FERRY_READAROUND", "FERRY_PACK_MIN",
                                         "FERRY_MAP_MAX", "FERRY_GATHER", "FERRY_DECODE_TRACE"};
static const char *const process_[] = {"FERRY_CUFILE", "FERRY_NVRTC", "FERRY_KERNELS", "FERRY_NVCOMP", "FERRY_NVJPEG",
                                       "FERRY_NO_LIBDEFLATE", "FERRY_REMOTE_REQUEST_SIZE", "FERRY_REMOTE_CONNECTIONS",
                                       "FERRY_REMOTE_RETRIES", "FERRY_REMOTE_RETRY_SECONDS",
                                       "FERRY_REMOTE_STALL_SECONDS", "FERRY_REMOTE_CA_BUNDLE", "FERRY_REMOTE_PART_SIZE", "FERRY_S3_ADDRESSING",
                                       "FERRY_SYSFS_ROOT"};

int ferry_knob_scope(const ferry_knob_row *r) {
    for (size_t i = 0; i < sizeof first_use_ / sizeof first_use_[0]; i++)
        if (!strcmp(r->name, first_use_[i])) return FERRY_KNOB_FIRST_USE;
    for (size_t i = 0; i < sizeof process_ / sizeof process_[0]; i++)
        if (!strcmp(r->name, process_[i])) return FERRY_KNOB_PROCESS;
    return FERRY_KNOB_CONTEXT;
}

const ferry_knob_row *ferry_knob_table(size_t *n) {
    *n = sizeof knobs_ / sizeof knobs_[0];
    return knobs_;
}

static long knob_index(const char *name) {
    for (size_t k = 0; k < sizeof knobs_ / sizeof knobs_[0]; k++)
        if (!strcmp(knobs_[k].name, name)) return (long)k;
    return -1;
}

/* The context and first-use knobs as the environment has them when ctx is
 * made (ferry_ctx_create, after ferry_config_resolve checked them): what
 * ferry_knob gives ctx from then on. */
int ferry_knobs_snapshot(ferry_ctx *ctx) {
    const size_t n = sizeof knobs_ / sizeof knobs_[0];
    ctx->knob_vals = calloc(n, sizeof *ctx->knob_vals);
    if (!ctx->knob_vals) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    if (ctx->cfg.no_env) return 0;
    for (size_t k = 0; k < n; k++) {
        const char *v = ferry_knob_scope(&knobs_[k]) == FERRY_KNOB_PROCESS ? NULL : getenv(knobs_[k].name);
        if (v && !(ctx->knob_vals[k] = strdup(v))) { ferry_knobs_release(ctx); return ferry_seterr(FERRY_ENOMEM, "out of memory"); }
    }
    return 0;
}

void ferry_knobs_release(ferry_ctx *ctx) {
    if (!ctx->knob_vals) return;
    for (size_t k = 0; k < sizeof knobs_ / sizeof knobs_[0]; k++) free(ctx->knob_vals[k]);
    free(ctx->knob_vals);
    ctx->knob_vals = NULL;
}

int ferry_knob_set(ferry_ctx *ctx, const char *name, const char *value) {
    const long k = knob_index(name);
    if (k < 0 || !ctx || !ctx->knob_vals)
        return ferry_seterr(FERRY_EINVAL, "ferry_knob_set: no knob \"%s\" in the table", name ? name : "");
    char *v = value ? strdup(value) : NULL;
    if (value && !v) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    free(ctx->knob_vals[k]);
    ctx->knob_vals[k] = v;
    return 0;
}

const char *ferry_knob(const ferry_ctx *ctx, const char *name) {
    if (!ctx) return getenv(name);
    if (ctx->cfg.no_env) return NULL;
    const long k = knob_index(name);
    if (k < 0 || !ctx->knob_vals || ferry_knob_scope(&knobs_[k]) == FERRY_KNOB_PROCESS)
        return getenv(name);   /* a name the table lacks, or a process-wide one: the environment */
    return ctx->knob_vals[k];
}

static int word_ok(const char *words, int icase, const char *s) {
    const size_t n = strlen(s);
    for (const char *w = words;;) {
        const char *bar = strchr(w, '|');
        const size_t len = bar ? (size_t)(bar - w) : strlen(w);
        if (len == n && !(icase ? strncasecmp(w, s, n) : strncmp(w, s, n))) return 1;
        if (!bar) return 0;
        w = bar + 1;
    }
}

void ferry_knob_grammar(const ferry_knob_row *r, char *buf, size_t n) {
    switch (r->kind) {
    case FERRY_KNOB_SIZE:
        if (r->hi > 0) snprintf(buf, n, "a size from %lld to %lld", r->lo, r->hi);
        else if (r->lo > 0) snprintf(buf, n, "a size from %lld", r->lo);
        else snprintf(buf, n, "a size");
        break;
    case FERRY_KNOB_COUNT: snprintf(buf, n, "a count from %lld to %lld", r->lo, r->hi); break;
    case FERRY_KNOB_INT: snprintf(buf, n, "an integer from %lld to %lld", r->lo, r->hi); break;
    case FERRY_KNOB_WORD: snprintf(buf, n, "one of %s", r->words); break;
    case FERRY_KNOB_RATES: snprintf(buf, n, "gpu_gbs,chunk_mbs,cpu_gbs_per_thread (three positive numbers)"); break;
    case FERRY_KNOB_TEXT: snprintf(buf, n, "%s", r->words ? r->words : "text"); break;
    case FERRY_KNOB_FLAG: snprintf(buf, n, "set (not 0) = on"); break;
    }
}

int ferry_knobs_check(void) {
    for (size_t k = 0; k < sizeof knobs_ / sizeof knobs_[0]; k++) {
        const ferry_knob_row *r = &knobs_[k];
        if (ferry_knob_scope(r) != FERRY_KNOB_CONTEXT) continue;   /* checked by their readers */
        const char *s = getenv(r->name);
        if (!s) continue;
        int ok = 1;
        switch (r->kind) {
        case FERRY_KNOB_SIZE: {
            const int64_t v = ferry_knob_bytes(s);
            ok = v >= 0 && v >= r->lo && (r->hi <= 0 || v <= r->hi);
            break;
        }
        case FERRY_KNOB_INT: {
            const int64_t v = ferry_knob_bytes(s);
            ok = v >= 0 && v >= r->lo && v <= r->hi;
            break;
        }
        case FERRY_KNOB_COUNT: {
            char *end = NULL;
            const long v = strtol(s, &end, 10);
            ok = end != s && !*end && v >= r->lo && v <= r->hi;
            break;
        }
        case FERRY_KNOB_WORD: ok = word_ok(r->words, r->icase, s); break;
        case FERRY_KNOB_RATES: {
            double a, b, c;
            char tail;
            ok = sscanf(s, "%lf,%lf,%lf%c", &a, &b, &c, &tail) == 3 && a > 0 && b > 0 && c > 0;
            break;
        }
        case FERRY_KNOB_TEXT: case FERRY_KNOB_FLAG: break;
        }
        if (!ok) {
            char want[160];
            ferry_knob_grammar(r, want, sizeof want);
            return ferry_seterr(FERRY_EINVAL, "%s=\"%s\": use %s (%s)", r->name, s, want, r->doc);
        }
    }
    return 0;
}

int ferry_config_resolve(ferry_config *c) {
    int rc;
    if (!c->no_env) {
        if ((rc = env_int("FERRY_THREADS", &c->threads)) < 0) return rc;
        if ((rc = env_size("FERRY_TASK_SIZE", &c->task_size)) < 0) return rc;
        if ((rc = env_size("FERRY_STAGING_SIZE", &c->staging_size)) < 0) return rc;
        if ((rc = env_int("FERRY_STAGING_COUNT", &c->staging_count)) < 0) return rc;
        if ((rc = env_size("FERRY_SMALL_IO", &c->small_io)) < 0) return rc;
        const char *p = getenv("FERRY_PATH");
        if (p && (rc = ferry_path_parse(p, &c->path)) < 0) return ferry_preerr(rc, "FERRY_PATH=\"%s\"", p);
        const char *dp = getenv("FERRY_DECODE");   /* base/names.c has the names */
        if (dp && (rc = ferry_decode_policy_parse(dp, (ferry_decode_policy *)&c->decode)) < 0)
            return ferry_preerr(rc, "FERRY_DECODE=\"%s\"", dp);
        if ((rc = ferry_knobs_check()) < 0) return rc;   /* the table's context knobs: FERRY_GPU_*, _EVENT_SYNC, _NUMA */
        if ((rc = ferry_remote_check_env()) < 0) return rc;      /* FERRY_REMOTE_* (sources/http.c) */
        if ((rc = ferry_upload_check_env()) < 0) return rc;      /* FERRY_REMOTE_PART_SIZE (sources/s3_upload.c) */
        const char *d = getenv("FERRY_DIRECT");
        if (d) {
            if (!strcasecmp(d, "auto")) c->direct = FERRY_DIRECT_AUTO;
            else if (!strcasecmp(d, "on") || !strcmp(d, "1")) c->direct = FERRY_DIRECT_ON;
            else if (!strcasecmp(d, "off") || !strcmp(d, "0")) c->direct = FERRY_DIRECT_OFF;
            else return ferry_seterr(FERRY_EINVAL, "FERRY_DIRECT=\"%s\": use auto, on or off", d);
        }
    }
    if (c->threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        c->threads = n > 16 ? (int)n : 16;
    }
    if (c->threads > FERRY_MAX_WORKERS) c->threads = FERRY_MAX_WORKERS;
    if (c->task_size == 0) c->task_size = 8u << 20;
    /* 2 MiB measured best (49 GB/s staged against 34-39 with 4 MiB buffers, 16
     * threads; BENCHMARKS.md, E1 for today's rate): the buffer is still in the
     * CPU cache when the copy engine reads it. */
    if (c->staging_size == 0) c->staging_size = 2u << 20;
    c->staging_size = (c->staging_size + FERRY_ALIGN - 1) & ~(size_t)(FERRY_ALIGN - 1);
    if (c->task_size < c->staging_size) c->task_size = c->staging_size;
    c->task_size = (c->task_size + FERRY_ALIGN - 1) & ~(size_t)(FERRY_ALIGN - 1);
    if (c->staging_count <= 0) c->staging_count = 3;
    if (c->staging_count < 2) c->staging_count = 2;
    if (c->staging_count > FERRY_MAX_STAGING) c->staging_count = FERRY_MAX_STAGING;
    /* A request that fits one staging buffer gains nothing from the pool (it
     * is one pread and one copy either way): run it on the caller's thread. */
    if (c->small_io == 0) c->small_io = c->staging_size;
    if (c->decode < 0 || c->decode > FERRY_DECODE_CPU) return ferry_seterr(FERRY_EINVAL, "bad decode policy %d", c->decode);
    if (c->path < 0 || c->path >= FERRY_PATH_COUNT_) return ferry_seterr(FERRY_EINVAL, "bad path %d", c->path);
    return 0;
}
