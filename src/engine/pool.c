/* pool.c — the worker threads and the one task loop. A worker claims tasks
 * from the context's queue in order, runs them, and before it sleeps waits
 * for its own outstanding copies, so every task completes. Small plans run
 * the same loop on the caller's thread with a borrowed worker. */
#include "engine/engine.h"
#include "engine/knobs.h"
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* FERRY_SPIN_US (default 0, at most 1000): an idle worker watches the queue
 * that long before it sleeps on the condition variable. A batch of small
 * records is tens of microseconds of work for 16 workers; when the queue runs
 * dry between batches every worker sleeps and the next batch wakes each one
 * again, and in a virtual machine a wake-up of an idle vCPU costs tens of
 * microseconds: the same order as the batch. An experiment
 * (bench/bench_records.py runs 50 beside 0): the default moves only with its
 * numbers (a spinning pool costs CPU that a shared machine may want). */
static int spin_us(const ferry_ctx *ctx, int *out) {
    const char *e = ferry_knob(ctx, "FERRY_SPIN_US");
    char *end = NULL;
    long v = e ? strtol(e, &end, 10) : 0;
    if (e && (end == e || *end || v < 0 || v > 1000))
        return ferry_seterr(FERRY_EINVAL, "FERRY_SPIN_US=\"%s\": microseconds from 0 to 1000", e);
    *out = (int)v;
    return 0;
}

void ferry_pool_run_task(ferry_worker *w, ferry_job *job, size_t t, void (*release)(ferry_job *)) {
    int finished = 1;
    if (atomic_load(&job->error) || atomic_load(&job->canceled)) {
        if (atomic_load(&job->canceled)) { ferry_seterr(FERRY_ECANCELED, "job canceled"); ferry_job_fail(job, FERRY_ECANCELED); }
        atomic_fetch_add(&job->tasks_issued, 1);
    } else if ((finished = ferry_job_wait_streams(job)) < 0) {   /* streamwait.c: the callers' streams first */
        ferry_job_fail(job, finished);
        finished = 1;
        atomic_fetch_add(&job->tasks_issued, 1);
    } else {
        finished = ferry_exec_task(w, job, &job->tasks[t]);
    }
    if (release) release(job);
    if (finished) ferry_task_finished(job);
    /* earlier tasks' copies that have passed complete now, not staging_count
     * packs later; a caller's thread drains at the end anyway (and a small
     * read's latency has no room for the query) */
    if (!w->is_inline) ferry_worker_poll(w);
}

void ferry_pool_unlink(ferry_ctx *ctx, ferry_job *job) {
    ferry_job **pp = &ctx->q_head, *prev = NULL;
    while (*pp && *pp != job) { prev = *pp; pp = &(*pp)->qnext; }
    if (*pp) { *pp = job->qnext; if (ctx->q_tail == job) ctx->q_tail = prev; }
}

/* The job's per-call thread slot, given back before the task can complete:
 * an atomic, not a second round trip through ctx->lock per task (the worker
 * takes the lock again at once to claim its next task; 16 workers on tasks
 * of a few records each make that lock the busiest in the engine). A claim
 * that sees the old count only passes the job over once. */
static void release_slot(ferry_job *job) { atomic_fetch_sub(&job->active_workers, 1); }

static void *worker_main(void *arg) {
    ferry_worker *w = arg;
    ferry_ctx *ctx = w->ctx;
    int spun = 0;   /* spun since the last task: sleep now */
    pthread_mutex_lock(&ctx->lock);
    for (;;) {
        ferry_job *job = NULL;
        for (ferry_job *j = ctx->q_head; j; j = j->qnext)
            if (j->next_task < j->ntasks && atomic_load(&j->active_workers) < j->max_workers) { job = j; break; }
        if (!job) {
            if (ctx->stop) break;
            if (w->npending) {
                /* nothing to claim: complete our own outstanding copies, but
                 * take new work the moment it is queued (worker.c says why);
                 * with FERRY_EVENT_SYNC=blocking the wait sleeps, as before */
                unsigned gen = atomic_load(&ctx->work_gen);
                pthread_mutex_unlock(&ctx->lock);
                if (ferry_worker_blocking_waits(w)) ferry_worker_drain(w);
                else ferry_worker_wait_copies(w, &ctx->work_gen, gen);
                pthread_mutex_lock(&ctx->lock);
                continue;
            }
            if (w->pathfile_entry) {   /* nothing to do: no file held open for nothing */
                pthread_mutex_unlock(&ctx->lock);
                ferry_worker_idle(w);
                pthread_mutex_lock(&ctx->lock);
                continue;
            }
            int us = atomic_load(&ctx->spin_us);
            if (us > 0 && !spun) {
                unsigned gen = atomic_load(&ctx->work_gen);
                double end = ferry_now() + us * 1e-6;
                pthread_mutex_unlock(&ctx->lock);
                for (int k = 0; atomic_load(&ctx->work_gen) == gen; k++) {
                    cpu_relax();
                    if ((k & 63) == 0 && ferry_now() > end) break;
                }
                pthread_mutex_lock(&ctx->lock);
                spun = 1;
                continue;
            }
            pthread_cond_wait(&ctx->work_cond, &ctx->lock);
            continue;
        }
        spun = 0;
        size_t t = job->next_task++;
        atomic_fetch_add(&job->active_workers, 1);
        if (job->next_task == job->ntasks) ferry_pool_unlink(ctx, job);   /* fully claimed */
        pthread_mutex_unlock(&ctx->lock);
        ferry_pool_run_task(w, job, t, release_slot);
        pthread_mutex_lock(&ctx->lock);
    }
    pthread_mutex_unlock(&ctx->lock);
    ferry_worker_drain(w);
    return NULL;
}

int ferry_pool_start(ferry_ctx *ctx, int want) {
    if (ctx->nworkers == 0 && !ctx->cfg.no_env) {
        int us, rc = spin_us(ctx, &us);
        if (rc < 0) return rc;
        atomic_store(&ctx->spin_us, us);
    }
    while (ctx->nworkers < want) {
        ferry_worker *w = &ctx->workers[ctx->nworkers];
        int rc = ferry_worker_init(ctx, w, ctx->nworkers);
        if (rc < 0) return rc;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            ferry_worker_free(w);
            return ferry_seterr(FERRY_ENOMEM, "cannot start worker thread");
        }
        ctx->nworkers++;
    }
    return 0;
}

void ferry_pool_enqueue(ferry_ctx *ctx, ferry_job *j) {
    j->qnext = NULL;
    if (ctx->q_tail) ctx->q_tail->qnext = j; else ctx->q_head = j;
    ctx->q_tail = j;
    atomic_fetch_add(&ctx->work_gen, 1);
    pthread_cond_broadcast(&ctx->work_cond);
}

/* Workers for small requests run on callers' threads: a few kept for reuse. */
static ferry_worker *inline_worker_get(ferry_ctx *ctx) {
    pthread_mutex_lock(&ctx->lock);
    ferry_worker *w = ctx->ninline_free ? ctx->inline_free[--ctx->ninline_free] : NULL;
    pthread_mutex_unlock(&ctx->lock);
    if (w) return w;
    w = calloc(1, sizeof *w);
    if (w && ferry_worker_init(ctx, w, FERRY_MAX_WORKERS - 1) < 0) { free(w); w = NULL; }
    if (w) w->is_inline = 1;
    return w;
}

static void inline_worker_put(ferry_ctx *ctx, ferry_worker *w) {
    ferry_worker_idle(w);
    pthread_mutex_lock(&ctx->lock);
    if (ctx->ninline_free < (int)(sizeof ctx->inline_free / sizeof ctx->inline_free[0])) {
        ctx->inline_free[ctx->ninline_free++] = w;
        w = NULL;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (w) { ferry_worker_free(w); free(w); }
}

int ferry_pool_run_inline(ferry_ctx *ctx, ferry_job *j) {
    CUcontext saved = ferry_cuda_current();    /* the caller's thread: hand its context back */
    ferry_worker *w = inline_worker_get(ctx);
    if (!w) { ferry_cuda_restore(saved); return FERRY_ENOMEM; }
    for (size_t t = 0; t < j->ntasks; t++) ferry_pool_run_task(w, j, t, NULL);
    ferry_worker_drain(w);
    inline_worker_put(ctx, w);
    ferry_cuda_restore(saved);
    return 0;
}

void ferry_pool_stop(ferry_ctx *c) {
    pthread_mutex_lock(&c->lock);
    c->stop = 1;
    pthread_cond_broadcast(&c->work_cond);
    pthread_mutex_unlock(&c->lock);
    for (int i = 0; i < c->nworkers; i++) pthread_join(c->workers[i].thread, NULL);
    CUcontext saved = ferry_cuda_current();    /* freeing streams switches this thread's context */
    for (int i = 0; i < c->nworkers; i++) ferry_worker_free(&c->workers[i]);
    for (int i = 0; i < c->ninline_free; i++) { ferry_worker_free(c->inline_free[i]); free(c->inline_free[i]); }
    c->nworkers = c->ninline_free = 0;
    ferry_cuda_restore(saved);
}
