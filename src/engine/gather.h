/* gather.h — a batch of small records into one device buffer through a
 * pinned image of the destination, sent in one copy per contiguous run
 * (gather.c). Internal. */
#ifndef FERRY_ENGINE_GATHER_H
#define FERRY_ENGINE_GATHER_H
#include "engine/job.h"

typedef struct ferry_worker ferry_worker;
typedef struct ferry_gather_pool ferry_gather_pool;

/* After make_tasks: give the job a pinned image when it qualifies (every
 * extent a small plain read into one device buffer, the destination span
 * within FERRY_GATHER, its runs few). 0 whether or not it does (j->gather
 * says), or FERRY_EINVAL for a bad FERRY_GATHER. */
int ferry_gather_plan(ferry_job *j);
/* Run task t of a gathering job: read its records into the image; the task
 * that reads last sends the image (its copies defer the task). Returns the
 * bytes read or a negative code (the job has failed then). */
int64_t ferry_exec_gather(ferry_worker *w, ferry_job *j, const ferry_task *t, int *deferred);
/* The job's image back to the context's pool (job_free: its copies are done). */
void ferry_gather_release(ferry_job *j);
/* The context's pool of images (ctx_create; NULL when out of memory: no gathering). */
ferry_gather_pool *ferry_gather_pool_new(const ferry_ctx *ctx);
/* What gathering did since the context was made, for `ferry bench --records`
 * (internal: the CLI links the static library): jobs gathered, the copies
 * they sent, jobs that qualified but found no free image (ran as packs), the
 * tasks of the gathered jobs, the bytes of their destination spans and of the
 * images they got (best fit: an image made for larger batches serves smaller
 * ones). */
typedef struct ferry_gather_stats {
    uint64_t jobs, copies, no_image, tasks, span_bytes, image_bytes;
} ferry_gather_stats;
void ferry_gather_counts(ferry_ctx *ctx, ferry_gather_stats *out);
/* Free the context's pool (ctx_destroy). */
void ferry_gather_pool_free(ferry_gather_pool *p);
#endif
