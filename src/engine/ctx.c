/* ctx.c — the engine object: configuration, worker pool lifetime, statistics,
 * and what the CUDA / cuFile loaders said. */
#include "engine/engine.h"
#include "engine/knobs.h"
#include "engine/gather.h"
#include "engine/gpudecode.h"
#include "engine/remotectx.h"
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* This process's id, kept and renewed in a child by fork's atfork hook: a
 * getpid() per job was a system call per small read (about 7 % of a 4 KiB
 * ferry_pread from the page cache). A child made
 * without fork's hooks (a raw clone) that kept using a context is not caught. */
static _Atomic pid_t self_pid;
static pthread_once_t pid_once = PTHREAD_ONCE_INIT;
static void pid_renew(void) { atomic_store(&self_pid, getpid()); }
static void pid_init(void) {
    pid_renew();
    pthread_atfork(NULL, NULL, pid_renew);
}
static pid_t this_pid(void) {
    pthread_once(&pid_once, pid_init);
    return atomic_load(&self_pid);
}

int ferry_ctx_create(ferry_ctx **out, const ferry_config *cfg) {
    if (!out) return ferry_seterr(FERRY_EINVAL, "ferry_ctx_create: NULL out");
    *out = NULL;
    ferry_ctx *c = calloc(1, sizeof *c);
    if (!c) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    if (cfg) c->cfg = *cfg; else ferry_config_init(&c->cfg);
    int rc = ferry_config_resolve(&c->cfg);
    if (rc < 0) { free(c); return rc; }
    if ((rc = ferry_knobs_snapshot(c)) < 0) { free(c); return rc; }   /* what ferry_knob reads (config.c) */
    c->workers = calloc((size_t)c->cfg.threads, sizeof *c->workers);
    if (!c->workers) { ferry_knobs_release(c); free(c); return ferry_seterr(FERRY_ENOMEM, "out of memory"); }
    if ((rc = ferry_fcache_init(&c->files)) < 0) { free(c->workers); ferry_knobs_release(c); free(c); return rc; }
    c->gather_pool = ferry_gather_pool_new(c);   /* NULL: batches run as packs */
    c->gpu_pool = ferry_gpudecode_pool_new();           /* NULL: each job allocates its own slots */
    c->pid = this_pid();
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->work_cond, NULL);
    pthread_mutex_init(&c->stats_lock, NULL);
    *out = c;
    return 0;
}

int ferry_ctx_check_pid(const ferry_ctx *c) {
    if (c->pid == this_pid()) return 0;
    return ferry_seterr(FERRY_EINVAL, "this context was created in process %d and cannot be used after fork(): "
                        "create a new one in the child", (int)c->pid);
}

void ferry_ctx_destroy(ferry_ctx *c) {
    if (!c) return;
    /* In a forked child the workers do not exist and the pinned memory belongs
     * to the parent's CUDA context: leave everything alone (a small leak). */
    if (c->pid != this_pid()) return;
    /* jobs hold no reference to the context beyond their lifetime: wait for them */
    pthread_mutex_lock(&c->lock);
    while (atomic_load(&c->active_jobs) > 0) {
        pthread_mutex_unlock(&c->lock);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    ferry_pool_stop(c);
    ferry_fcache_free(&c->files);
    ferry_ctx_remote_free(c);
    ferry_gather_pool_free(c->gather_pool);
    ferry_gpudecode_pool_free(c->gpu_pool);
    free(c->workers);
    ferry_knobs_release(c);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->work_cond);
    pthread_mutex_destroy(&c->stats_lock);
    free(c);
}

void ferry_ctx_config(const ferry_ctx *c, ferry_config *out) { *out = c->cfg; }

int ferry_cuda_device_count(ferry_ctx *c) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    int n = 0;
    if (cu && cu->DeviceGetCount(&n) != 0) n = 0;
    return n;
}

const char *ferry_cuda_status(ferry_ctx *c) {
    const char *why;
    ferry_cuda_load(&why);
    return why;
}

const char *ferry_cufile_status(ferry_ctx *c) {
    const char *why;
    if (!ferry_cufile_load(&why)) return why;
    if (!ferry_cufile_native())
        return "cuFile loads, but nvidia-fs is not loaded: only cuFile's compatibility mode can run "
               "(AUTO uses the staged path; FERRY_PATH=cufile forces cuFile)";
    return "";
}

void ferry_stats_get(ferry_ctx *c, ferry_stats *out) {
    pthread_mutex_lock(&c->stats_lock);
    *out = c->stats;
    pthread_mutex_unlock(&c->stats_lock);
}

void ferry_stats_reset(ferry_ctx *c) {
    pthread_mutex_lock(&c->stats_lock);
    memset(&c->stats, 0, sizeof c->stats);
    pthread_mutex_unlock(&c->stats_lock);
}
