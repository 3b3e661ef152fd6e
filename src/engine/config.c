/* config.c — defaults, FERRY_* environment overrides, path names, and the
 * table of tuning knobs (knobs.h). */
#include "engine/engine.h"
#include "engine/knobs.h"
#include "engine/numa.h"
#include "sources/remote.h"
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
 * Every FERRY_* tuning variable of the GPU decode stage and the engine's
 * event and NUMA switches: name, grammar, default, range, one line of doc
 * (where each is read says why its default is what it is). The variables
 * config.c parses into ferry_config (FERRY_THREADS, _TASK_SIZE,
 * _STAGING_SIZE, _STAGING_COUNT, _SMALL_IO, _PATH, _DECODE, _DIRECT) and the
 * ones read elsewhere (job.c's FERRY_READAHEAD, _READAROUND, _PACK_MIN,
 * _MAP_MAX; pool.c's FERRY_SPIN_US; gather.c, cufile.c, nvcomp.c, nvrtc.c,
 * kernels_source.c, gpudecode_trace.c, zlib.c) are not in it yet. */
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
};

const ferry_knob_row *ferry_knob_table(size_t *n) {
    *n = sizeof knobs_ / sizeof knobs_[0];
    return knobs_;
}

const char *ferry_knob(const ferry_ctx *ctx, const char *name) {
    if (ctx && ctx->cfg.no_env) return NULL;
    return getenv(name);
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

int ferry_knobs_check(void) {
    for (size_t k = 0; k < sizeof knobs_ / sizeof knobs_[0]; k++) {
        const ferry_knob_row *r = &knobs_[k];
        const char *s = getenv(r->name);
        if (!s) continue;
        int ok = 0;
        char want[160];
        switch (r->kind) {
        case FERRY_KNOB_SIZE: {
            const int64_t v = ferry_knob_bytes(s);
            ok = v >= 0 && v >= r->lo;
            if (r->lo > 0) snprintf(want, sizeof want, "a size from %lld", r->lo);
            else snprintf(want, sizeof want, "a size");
            break;
        }
        case FERRY_KNOB_COUNT: {
            char *end = NULL;
            const long v = strtol(s, &end, 10);
            ok = end != s && !*end && v >= r->lo && v <= r->hi;
            snprintf(want, sizeof want, "a count from %lld to %lld", r->lo, r->hi);
            break;
        }
        case FERRY_KNOB_WORD:
            ok = word_ok(r->words, r->icase, s);
            snprintf(want, sizeof want, "one of %s", r->words);
            break;
        case FERRY_KNOB_RATES: {
            double a, b, c;
            char tail;
            ok = sscanf(s, "%lf,%lf,%lf%c", &a, &b, &c, &tail) == 3 && a > 0 && b > 0 && c > 0;
            snprintf(want, sizeof want, "gpu_gbs,chunk_mbs,cpu_gbs_per_thread (three positive numbers)");
            break;
        }
        }
        if (!ok) return ferry_seterr(FERRY_EINVAL, "%s=\"%s\": use %s (%s)", r->name, s, want, r->doc);
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
        if (p && (rc = ferry_path_parse(p, &c->path)) < 0) return rc;
        const char *dp = getenv("FERRY_DECODE");   /* base/names.c has the names */
        if (dp && (rc = ferry_decode_policy_parse(dp, (ferry_decode_policy *)&c->decode)) < 0) return rc;
        if ((rc = ferry_knobs_check()) < 0) return rc;   /* the knobs' table: FERRY_GPU_*, _EVENT_SYNC, _NUMA */
        if ((rc = ferry_remote_check_env()) < 0) return rc;      /* FERRY_REMOTE_* (sources/http.c) */
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
