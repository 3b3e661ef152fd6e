/* ctx.h — the engine object: configuration, the job queue, the worker pool's
 * anchor, statistics, the open-file cache. Internal. */
#ifndef FERRY_ENGINE_CTX_H
#define FERRY_ENGINE_CTX_H
#include "common.h"
#include "engine/fcache.h"
#include "engine/limits.h"
#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

typedef struct ferry_worker ferry_worker;   /* worker.h */

struct ferry_ctx {
    ferry_config cfg;
    pthread_mutex_t lock;
    pthread_cond_t work_cond;
    ferry_job *q_head, *q_tail;   /* jobs with tasks left to claim */
    _Atomic unsigned work_gen;    /* bumped by every enqueue: what idle workers spin on (pool.c) */
    _Atomic int spin_us;          /* FERRY_SPIN_US: how long an idle worker spins before it sleeps */
    char **knob_vals;             /* the knobs' table's values when it was made (config.c: ferry_knob) */
    _Atomic int event_sync;       /* FERRY_EVENT_SYNC read once (worker.c): 0 not yet, 1 spin, 2 blocking */
    _Atomic int job_env_ready;    /* FERRY_READAHEAD, FERRY_PACK_MIN, FERRY_MAP_MAX read (job.c, once per context) */
    _Atomic int readahead;
    _Atomic uint64_t pack_min;
    _Atomic uint64_t map_max;
    _Atomic uint64_t read_around;
    _Atomic uint64_t share_used;  /* sizes of the files counted against the page-cache share (cacheshare.c) */
    _Atomic int share_full;       /* those passed it: no more read-around windows, REREAD jobs read as others */
    ferry_worker *workers;
    int nworkers;                 /* started */
    int stop;
    ferry_worker *inline_free[8]; /* workers for small requests run on callers' threads */
    int ninline_free;
    pthread_mutex_t stats_lock;
    ferry_stats stats;
    _Atomic int active_jobs;      /* submitted and not yet destroyed (a finished job its caller holds counts) */
    _Atomic int running_jobs;     /* submitted and not yet complete: the jobs whose work is on the workers and devices */
    _Atomic uint64_t next_job_id;
    pid_t pid;                    /* the creating process: a forked child has no workers */
    ferry_fcache files;           /* files opened by path (fcache.c) */
    struct ferry_gather_pool *gather_pool; /* pinned images of gathered batches (gather.c) */
    struct ferry_gpudecode_pool *gpu_pool; /* slots of cooperative GPU decode calls (gpudecode_dev.c) */
    struct ferry_remote_opts *remote;   /* ferry_ctx_set_remote_option's (remotectx.c), or NULL */
    _Atomic uint64_t gpu_keep_free[FERRY_MAX_DEVICES]; /* ferry_plan_budget's keep_free per device (budget.c):
                                                          a job's end gives idle decode buffers back below it */
};
/* FERRY_EINVAL with a message when called in a process forked from the creator. */
int ferry_ctx_check_pid(const ferry_ctx *ctx);
int ferry_config_resolve(ferry_config *c);
/* Count bytes read/written with O_DIRECT, buffered, and decoded. */
void ferry_count_io(ferry_ctx *ctx, uint64_t direct, uint64_t buffered, uint64_t decoded);
#endif
