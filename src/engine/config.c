/* config.c — defaults, FERRY_* environment overrides, path names. */
#include "engine/engine.h"
#include "engine/numa.h"
#include "engine/gpudecode.h"
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

/* Bytes, or -1 on garbage: the one size grammar of ferry_size_parse (names.c). */
int64_t ferry_parse_size(const char *s) {
    uint64_t v;
    if (ferry_size_parse(s, &v) < 0 || v > (uint64_t)INT64_MAX) return -1;
    return (int64_t)v;
}

static int env_size(const char *name, size_t *field) {
    const char *s = getenv(name);
    if (!s) return 0;
    int64_t v = ferry_parse_size(s);
    if (v < 0) return ferry_seterr(FERRY_EINVAL, "%s=\"%s\": not a size", name, s);
    *field = (size_t)v;
    return 0;
}

static int env_int(const char *name, int *field) {
    const char *s = getenv(name);
    if (!s) return 0;
    int64_t v = ferry_parse_size(s);
    if (v < 0 || v > 4096) return ferry_seterr(FERRY_EINVAL, "%s=\"%s\": not a count", name, s);
    *field = (int)v;
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
        const char *dp = getenv("FERRY_DECODE");   /* gpudecode.c has the names */
        if (dp && (rc = ferry_decode_policy_parse(dp, (ferry_decode_policy *)&c->decode)) < 0) return rc;
        if ((rc = ferry_numa_check_env()) < 0) return rc;   /* multigpu: FERRY_NUMA=auto|off (numa.c) */
        if ((rc = ferry_gpudecode_check_env()) < 0) return rc;   /* FERRY_GPU_* (gpudecode.c) */
        if ((rc = ferry_remote_check_env()) < 0) return rc;      /* FERRY_REMOTE_* (sources/http.c) */
        const char *es = getenv("FERRY_EVENT_SYNC");       /* read by worker.c */
        if (es && strcmp(es, "spin") && strcmp(es, "blocking"))
            return ferry_seterr(FERRY_EINVAL, "FERRY_EVENT_SYNC=\"%s\": use spin or blocking", es);
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
    /* 2 MiB measured best on the H200 machine (49 GB/s staged vs 39 GB/s with
     * 4 MiB, 16 threads, BENCHMARKS.md): the buffer is still in the CPU cache
     * when the copy engine reads it. */
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
