/* jobstate.c — how a job ends: its first error, its tasks counted down, and
 * completion (statistics folded into the context, written files synced,
 * waiters woken). Workers and callers' threads both end tasks here; nothing
 * here knows how tasks are run. */
#include "engine/engine.h"
#include "engine/sysio.h"
#include <errno.h>

void ferry_job_fail(ferry_job *job, int code) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&job->error, &expected, code)) {
        pthread_mutex_lock(&job->lock);
        snprintf(job->errmsg, sizeof job->errmsg, "%s", ferry_lasterr()[0] ? ferry_lasterr() : ferry_strerror(code));
        pthread_mutex_unlock(&job->lock);
    }
}

/* Fold the job's counters into the context statistics and sync written files. */
void ferry_job_complete(ferry_job *j) {
    ferry_ctx *ctx = j->ctx;
    if ((j->flags & FERRY_SYNC) && !atomic_load(&j->error)) {
        for (size_t i = 0; i < j->next; i++) {
            ferry_file *f = j->ext[i].kind == FERRY_EXTENT_WRITE ? j->ext[i].file : NULL;
            if (!f || !atomic_exchange(&f->written, 0)) continue;
            if (ferry_sys()->fsync(f->fd) != 0) {
                ferry_seterr(-errno, "%s: fsync: %s", f->path, strerror(errno));
                ferry_job_fail(j, -errno);
            }
        }
    }
    double dt = ferry_now() - j->t_start;
    pthread_mutex_lock(&ctx->stats_lock);
    for (int p = 1; p < FERRY_PATH_COUNT_; p++) {
        uint64_t b = atomic_load(&j->path_bytes[p]), o = atomic_load(&j->path_ops[p]);
        if (!b && !o) continue;
        ctx->stats.path[p].bytes += b;
        ctx->stats.path[p].ops += o;
        ctx->stats.path[p].seconds += dt;
    }
    ctx->stats.jobs++;
    pthread_mutex_unlock(&ctx->stats_lock);
    atomic_fetch_sub(&ctx->running_jobs, 1);   /* before done: once it is set the waiter may free j */
    pthread_mutex_lock(&j->lock);
    j->done = 1;
    pthread_cond_broadcast(&j->cond);
    pthread_mutex_unlock(&j->lock);
}

void ferry_task_finished(ferry_job *j) {
    /* read ntasks first: once the last task is counted the waiter may free j */
    size_t n = j->ntasks;
    size_t d = atomic_fetch_add(&j->tasks_done, 1) + 1;
    if (d == n) ferry_job_complete(j);
}

