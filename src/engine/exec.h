/* exec.h — running one task on a worker (exec.c), what the paths share
 * around staging (stage.c), packed staging (pack.c), host and device
 * placement and fills (place.c). Internal. */
#ifndef FERRY_ENGINE_EXEC_H
#define FERRY_ENGINE_EXEC_H
#include "engine/file.h"
#include "engine/job.h"
#include "engine/worker.h"

/* Run one task (a whole extent, a slice of a plain one, or a pack) on w.
 * Returns 1 when the task is complete (the caller calls ferry_task_finished),
 * 0 when its device copies are still running (it completes from w's pending
 * list). Errors are recorded in the job. */
int ferry_exec_task(ferry_worker *w, ferry_job *job, const ferry_task *t);
/* Wait until staging buffer i is no longer the source or target of a copy. */
int ferry_stage_wait(ferry_worker *w, int i);
/* Note that w enqueued device work for job j on device d. */
void ferry_mark_device(ferry_worker *w, ferry_job *j, int d);
/* The open file an extent names by path (from the context's cache, held by w for the job). */
int ferry_path_file(ferry_worker *w, ferry_job *j, const ferry_extent *e, ferry_file **out);
/* Run a pack task (n >= 2 small plain reads): returns bytes or a negative
 * code with the message naming the file and byte that failed. */
int64_t ferry_exec_pack(ferry_worker *w, ferry_job *j, const ferry_task *t, int *deferred);
/* Read a pack task's records into host memory: at their destinations, or
 * with img at img + (dst_offset - lo) (gather.c's pinned image). Bytes read or
 * a negative code with the message naming the file and byte. */
int64_t ferry_pack_read(ferry_worker *w, ferry_job *j, const ferry_task *t, uint8_t *img, uint64_t lo);
/* Wait until the worker's decode buffers are no longer the source of a copy. */
int ferry_dec_wait(ferry_worker *w);
/* Packing into staging buffers (see ferry_task in job.h). */
int ferry_pack_begin(ferry_worker *w, int d);
uint64_t ferry_pack_room(const ferry_worker *w);
uint8_t *ferry_pack_reserve(ferry_worker *w, uint64_t n);
int ferry_pack_place(ferry_worker *w, uint64_t n, CUdeviceptr dst, uintptr_t buf);
int ferry_pack_flush(ferry_worker *w, ferry_job *j, int d);
int ferry_pack_scratch(ferry_worker *w, int d, int i, CUdeviceptr *out);
/* Host-side placement and fill (also used for device fills via pinned memory). */
void ferry_place_host(uint8_t *dst, const uint8_t *src, const ferry_place *p);
void ferry_fill_host(uint8_t *dst, const uint8_t *val, unsigned size, const ferry_place *p, uint64_t bytes);
/* Enqueue on s the copy of n bytes at src (host memory, or device memory
 * when src_on_device) to dst, or of their box under place (NULL: all n bytes
 * to one run): one 2D copy per run of rows, the dimensions above walked. */
int ferry_place_device(const ferry_cuda_api *cu, CUstream s, CUdeviceptr dst, uint64_t src, int src_on_device,
                       const ferry_place *place, uint64_t n);
/* 1 when place (NULL: none) copies all `decoded` bytes to one contiguous run. */
int ferry_place_is_contiguous(const ferry_place *place, uint64_t decoded);
/* Normalise a placement: drop unit dims, merge mergeable dims. Returns ndim. */
int ferry_place_normalize(const ferry_place *in, ferry_place *out);
#endif
