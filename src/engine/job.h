/* job.h — a running plan's state: its extents, its tasks, its counters and
 * how it completes (jobstate.c). Internal; a leaf: it knows nothing of the
 * workers that run it. */
#ifndef FERRY_ENGINE_JOB_H
#define FERRY_ENGINE_JOB_H
#include "common.h"
#include "engine/limits.h"
#include <pthread.h>
#include <stdatomic.h>

/* Internal extent flag (ferry_plan_add refuses it from callers): the
 * extent's placement only copies its bytes, unchanged, to one contiguous
 * range — a whole uncompressed Zarr chunk, which keeps its placement for
 * FERRY_EXTENT_MISSING_FILLS (the fill of an absent file needs the element
 * size). Set by ferry_job_build; such an extent is read like a plain one
 * (packed, straight into host memory), its placement used only to fill. */
#define FERRY_EXTENT_FLAT_ (1u << 30)

/* A task is either a byte range [lo, hi) of one extent (n == 1), or a pack:
 * n >= 2 whole small plain reads, ext .. ext+n-1, of one destination memory
 * kind and device (any files). Packs are cut by bytes (make_tasks in job.c):
 * a batch of a thousand 8 KiB records is a few tasks, not a thousand.
 *
 * Packing interface (pack.c; a device-decode stage reads
 * compressed batches through the same calls):
 *   - ferry_pack_begin(w, d): take the worker's next staging buffer for
 *     device d (waiting for its previous copies), position 0;
 *   - ferry_pack_room(w): bytes left in it;
 *   - ferry_pack_reserve(w, n): n bytes at the current position of the
 *     current buffer to read into (NULL when they do not fit: flush first);
 *   - ferry_pack_place(w, n, dst, buf): the n bytes just reserved go to device
 *     address dst inside the caller's buffer buf (adjacent runs with adjacent
 *     destinations in the same buffer merge: cupy's pool, for one, hands out
 *     separate cudaMalloc blocks that touch, and a copy spanning two of them
 *     is CUDA_ERROR_INVALID_VALUE);
 *   - ferry_pack_flush(w, j, d): move the buffer to the device: one
 *     cuMemcpyHtoDAsync per contiguous destination run, or, when the runs are
 *     many, one copy of the packed bytes into device scratch and one scatter
 *     kernel (ferry_cuda_scatter); then the buffer's event is recorded.
 *     ferry_pack_scratch(w, d, i) is that device copy of staging buffer i.
 *     Bytes reserved but not placed (dst 0) are not copied by the flush: a
 *     decode stage that wants packed compressed bytes on the device copies
 *     them into the scratch itself. */
typedef struct ferry_task {
    uint32_t ext;                 /* index into job->ext (first extent of a pack) */
    uint32_t n;                   /* extents in the task: 1, or >= 2 for a pack */
    uint64_t lo, hi;              /* byte range within the extent (n == 1); for a pack 0 and its bytes */
} ferry_task;

struct ferry_job {
    ferry_ctx *ctx;
    ferry_extent *ext;            /* own copies; place/path/label point into places/strings */
    size_t next;                  /* number of extents */
    size_t plan_records;          /* the plan's extents before merging (gather.c: the records' size) */
    ferry_place *places;
    char *strings;
    ferry_task *tasks;
    size_t ntasks;
    size_t next_task;             /* next task to claim (under ctx->lock) */
    _Atomic size_t tasks_issued;  /* reads done, device copies enqueued */
    _Atomic size_t tasks_done;    /* everything complete */
    _Atomic uint64_t bytes;       /* file bytes moved */
    _Atomic uint64_t path_bytes[FERRY_PATH_COUNT_];
    _Atomic uint64_t path_ops[FERRY_PATH_COUNT_];
    _Atomic int error;            /* first error code, 0 if none */
    _Atomic int canceled;
    char errmsg[1024];
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;                     /* under lock: complete (stats folded, files synced) */
    ferry_path path;              /* path for plain device extents: CUFILE or STAGED */
    int forced;                   /* the path was forced (no fallback allowed) */
    int decode_gpu;               /* decode "gpu" was forced: a chunk for a device the CPU decodes is a
                                     gpu_cpu_fallback (ferry_gpudecode_plan sets it) */
    unsigned flags;               /* FERRY_SYNC, FERRY_NO_DIRECT */
    int direct;                   /* ferry_direct policy for this job */
    int allow_short;              /* ferry_pread: EOF ends the read, not an error */
    int readahead;                /* FERRY_READAHEAD_*: hints for cold packed records (pack.c) */
    uint64_t pack_min;            /* least bytes of a pack task (FERRY_PACK_MIN, job.c) */
    uint64_t map_max;             /* warm records this size or less come from a mapping (FERRY_MAP_MAX, pack.c) */
    uint64_t read_around;         /* cold records' hints widened to aligned windows this large (FERRY_READAROUND, pack.c: hint_range) */
    int max_workers;              /* per-call thread limit */
    _Atomic int active_workers;   /* workers in one of its tasks: raised under ctx->lock when a
                                     task is claimed, lowered without it (pool.c) */
    _Atomic uint64_t worker_mask[FERRY_MAX_WORKERS / 64]; /* workers that enqueued device work */
    _Atomic uint32_t dev_mask;    /* devices with enqueued work */
    double t_start;
    uint64_t id;                  /* unique per context (addresses can be reused) */
    struct ferry_job *qnext;      /* context queue link */
    struct ferry_gpudecode_job *gpu; /* gpudecode.c: batches of chunks decoded by nvCOMP, or NULL */
    void *wait_ev[FERRY_MAX_WAIT_STREAMS];  /* streamwait.c: CUevents recorded at submit on the callers' streams */
    void *wait_ctx[FERRY_MAX_WAIT_STREAMS]; /* each event's CUcontext */
    int nwait;
    _Atomic int waited;           /* every event seen complete: later tasks skip the driver */
    struct ferry_gather *gather;  /* gather.c: the pinned image its records are read into, or NULL */
};

/* FERRY_READAHEAD=off|auto|on (auto: hint a pack's records when its first
 * one is not in the page cache; pack.c says why). */
enum { FERRY_READAHEAD_OFF = 0, FERRY_READAHEAD_AUTO = 1, FERRY_READAHEAD_ON = 2 };

/* Record the job's first error (code and the thread's message). */
void ferry_job_fail(ferry_job *job, int code);
/* Complete the job now (a job of no tasks; else the last task does it). */
void ferry_job_complete(ferry_job *job);
/* A task's device work (if any) is complete; the last one completes the job
 * (stats folded, written files synced). The job may be freed once it returns. */
void ferry_task_finished(ferry_job *job);
/* streamwait.c: ferry_plan_wait_stream's events. Record them at submit (the
 * caller's thread; first_dev: the plan's first device, -1 none); wait for them
 * before a task (any worker; 0 at once once they have passed); destroy them. */
int ferry_job_record_waits(ferry_job *job, const ferry_plan *plan, int first_dev);
int ferry_job_wait_streams(ferry_job *job);
void ferry_job_free_waits(ferry_job *job);
/* Resolve buffer device ids (device < 0 -> look up). */
int ferry_buf_resolve(ferry_buf *b);
#endif
