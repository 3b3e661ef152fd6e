/* worker.h — a worker: its staging buffers, streams and events per device,
 * and the tasks whose device copies may still run (worker.c); the pool of
 * worker threads and the one task loop both the pool and callers' threads
 * run (pool.c). Internal. */
#ifndef FERRY_ENGINE_WORKER_H
#define FERRY_ENGINE_WORKER_H
#include "common.h"
#include "codecs/codecs.h"
#include "cuda/cuda.h"
#include "engine/fcache.h"
#include "engine/job.h"
#include "engine/limits.h"
#include <pthread.h>

typedef struct ferry_devstate {   /* a worker's per-device CUDA objects */
    CUstream stream;
    CUevent ev[FERRY_MAX_STAGING];
    CUevent dec_ev;
    int ready;
    CUdeviceptr scratch[FERRY_MAX_STAGING]; /* device copy of staging buffer i (packs; lazily) */
    CUdeviceptr dtab[FERRY_MAX_STAGING];    /* its scatter table */
} ferry_devstate;


typedef struct ferry_pending {    /* a task whose device copies may still run */
    ferry_job *job;
    uint64_t seq;                 /* complete once done_seq[dev] >= seq */
    int dev;
} ferry_pending;

typedef struct ferry_worker {
    ferry_ctx *ctx;
    int id;
    pthread_t thread;
    uint8_t *stage[FERRY_MAX_STAGING];  /* pinned (or aligned host) staging buffers */
    int stage_pinned[FERRY_MAX_STAGING];
    int pin_failed;                     /* cuMemHostAlloc failed once: plain memory from now on */
    int stage_dev[FERRY_MAX_STAGING];   /* device whose stream last used the buffer, -1 none */
    int next_stage;
    ferry_scatter_entry *tab[FERRY_MAX_STAGING]; /* pinned: runs of a packed staging buffer */
    int tab_pinned[FERRY_MAX_STAGING];
    int pack_i;                          /* packing: staging buffer in use, -1 none */
    uint64_t pack_pos;                   /* bytes packed into it */
    uint32_t pack_runs;                  /* entries in tab[pack_i] */
    uintptr_t pack_last_buf;             /* the destination buffer of the last run: runs merge only
                                            inside one buffer (two allocations can be adjacent in
                                            the address space, and one copy may not span both) */
    ferry_devstate dev[FERRY_MAX_DEVICES];
    uint8_t *in_buf; size_t in_cap; int in_pinned; /* encoded bytes of one extent (aligned) */
    uint8_t *dec_buf; size_t dec_cap; int dec_pinned; int dec_dev; /* decoded bytes */
    ferry_decode_scratch scratch;
    ferry_pending *pending; size_t npending, cap_pending;
    uint64_t seq[FERRY_MAX_DEVICES];      /* device work enqueued so far (per device stream) */
    uint64_t done_seq[FERRY_MAX_DEVICES]; /* known complete */
    uint64_t stage_seq[FERRY_MAX_STAGING];/* seq recorded with each staging event */
    uint64_t dec_seq;
    ferry_file *pathfile;                 /* last file an extent named by path ... */
    ferry_fc_entry *pathfile_entry;       /* ... its open-file cache entry (held) ... */
    uint64_t pathfile_job;                /* ... checked for this job id (never reused across jobs) */
    const char *pathfile_root;            /* ... opened NOFOLLOW (pathfile_nofollow) under this root */
    int pathfile_nofollow;
    int is_inline;
    uint64_t hinted;                      /* cold records announced with WILLNEED (pack.c; tests read it) */
    struct ferry_gpudecode_worker *gpu; /* gpudecode_dev.c: its pinned/device buffers, or NULL */
    void (*gpu_free)(struct ferry_worker *w); /* set with gpu by its owner: frees it (ferry_worker_free calls it) */
} ferry_worker;

int ferry_worker_init(ferry_ctx *ctx, ferry_worker *w, int id);
void ferry_worker_free(ferry_worker *w);
/* Buffers for work that feeds device dev (pinned in dev's context), or host
 * work (dev < 0: plain memory, CUDA untouched). */
int ferry_worker_staging(ferry_worker *w, int dev);
int ferry_worker_grow(ferry_worker *w, int dev, uint8_t **buf, size_t *cap, int *pinned, size_t n);
/* A 4 KiB-aligned buffer of n bytes, pinned in dev's context when dev >= 0. */
int ferry_worker_alloc(ferry_worker *w, int dev, uint8_t **p, size_t n, int *pinned);
/* Release a buffer from ferry_worker_alloc / ferry_worker_grow: n is the
 * capacity it was allocated with (plain memory of 2 MiB and more is mmapped,
 * hostmem.c), pinned as it reported. NULL is ignored. */
void ferry_worker_free_host(uint8_t *p, size_t n, int pinned);
int ferry_worker_device(ferry_worker *w, int d, ferry_devstate **out);
void ferry_worker_completed(ferry_worker *w, int d, uint64_t seq);
int ferry_worker_defer(ferry_worker *w, ferry_job *job, int d);
/* The worker has no job: let go of the file it held. */
void ferry_worker_idle(ferry_worker *w);
/* Complete the pending tasks whose device work has passed (never waits);
 * -1 when an event reports a failed copy or none covers the last device
 * work (ferry_worker_drain reports or waits for it). */
int ferry_worker_poll(ferry_worker *w);
/* Idle with copies in flight: poll them until they pass or *gen != seen
 * (new work queued). */
void ferry_worker_wait_copies(ferry_worker *w, _Atomic unsigned *gen, unsigned seen);
/* FERRY_EVENT_SYNC=blocking: waits sleep instead of spinning. */
int ferry_worker_blocking_waits(const ferry_worker *w);
/* Complete every pending device task of w (wait for its streams). */
void ferry_worker_drain(ferry_worker *w);

/* ---- the pool (pool.c) ---------------------------------------------------- */
/* Run task t of job on w — or skip it when the job failed or was canceled —
 * and complete it unless its device copies still run. release(job), when
 * given, runs before the task can complete (completion lets the job's owner
 * free it): the pool gives back the job's per-call thread slot there. */
void ferry_pool_run_task(ferry_worker *w, ferry_job *job, size_t t, void (*release)(ferry_job *));
/* Start worker threads until `want` run (ctx->lock held). */
int ferry_pool_start(ferry_ctx *ctx, int want);
/* Queue a job for the workers (takes ctx->lock). */
void ferry_pool_enqueue(ferry_ctx *ctx, ferry_job *job);
/* Take job off the queue if it is there (ctx->lock held). */
void ferry_pool_unlink(ferry_ctx *ctx, ferry_job *job);
/* Run every task of job on the calling thread with a borrowed worker; 0, or
 * FERRY_ENOMEM when no worker could be made (the caller queues it instead). */
int ferry_pool_run_inline(ferry_ctx *ctx, ferry_job *job);
/* Stop and free every worker (ctx_destroy). */
void ferry_pool_stop(ferry_ctx *ctx);
#endif
