/* gpudecode.h — the engine's device decode stage (gpudecode.c): compressed
 * chunks bound for device memory decoded by batched nvCOMP calls. Internal;
 * the engine calls these four hooks and nothing else. */
#ifndef FERRY_GPUDECODE_H
#define FERRY_GPUDECODE_H
#include "engine/engine.h"

/* A task whose ext field is this runs batch number task->lo of job->gpu. */
#define FERRY_GPU_TASK UINT32_MAX

/* At job build, after extents are resolved: pick the extents the GPU decodes
 * (policy, nvCOMP, codec chain, device destination) and group them into
 * batches, stored in job->gpu. Returns 0 (none: job->gpu stays NULL) or a
 * negative code (decode="gpu" forced but nvCOMP cannot run: FERRY_EPATH). */
int ferry_gpudecode_plan(ferry_job *job, int decode_policy);
/* 1 when extent i belongs to a GPU batch (make_tasks skips it). */
int ferry_gpudecode_owns(const ferry_job *job, size_t i);
/* Number of batches (make_tasks adds one FERRY_GPU_TASK task per batch). */
size_t ferry_gpudecode_batches(const ferry_job *job);
/* Run batch b on worker w: returns the file bytes read, or a negative code
 * with a message naming the file, chunk and codec. *deferred as in exec.c. */
int64_t ferry_gpudecode_run(ferry_worker *w, ferry_job *job, size_t b, int *deferred);
void ferry_gpudecode_job_free(ferry_job *job);
void ferry_gpudecode_worker_free(ferry_worker *w);
#endif
