/* engine.h — the engine's internal structures: context, files, plans, jobs,
 * tasks and workers. Internal. */
#ifndef FERRY_ENGINE_H
#define FERRY_ENGINE_H
#include "common.h"
#include "cuda/cuda.h"
#include "cuda/cufile.h"
#include "codecs/codecs.h"
#include "engine/fcache.h"
#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#define FERRY_ALIGN 4096          /* O_DIRECT and cuFile alignment */
#define FERRY_MAX_WORKERS 256
#define FERRY_MAX_STAGING 16
#define FERRY_MAX_DEVICES 16

int ferry_config_resolve(ferry_config *c);
int64_t ferry_parse_size(const char *s);

/* ---- files --------------------------------------------------------------- */
struct ferry_file {
    ferry_ctx *ctx;
    char *path;
    int fd;                       /* buffered descriptor */
    dev_t dev;                    /* the file it opened: every other descriptor */
    ino_t ino;                    /* (O_DIRECT, cuFile's) must be this inode */
    int flags;                    /* FERRY_READ/WRITE/... */
    pthread_mutex_t lock;         /* guards the lazy members below */
    int dfd;                      /* O_DIRECT descriptor: -1 not tried, -2 refused */
    ferry_cufile_handle cfh;      /* registered cuFile handle (on dfd) */
    int cf_state;                 /* 0 untried, 1 registered, <0 failed (code) */
    char cf_why[160];
    _Atomic int written;          /* a job wrote to it (for FERRY_SYNC) */
};

/* Lazily opened O_DIRECT descriptor; -1 when the file system refuses it. */
int ferry_file_direct_fd(ferry_file *f);
/* Registered cuFile handle, or a negative code with a message. */
int ferry_file_cufile(ferry_file *f, ferry_cufile_handle *out);
int64_t ferry_file_cached_fd(int fd, uint64_t offset, uint64_t len, uint64_t fsize);
int ferry_file_open_internal(ferry_ctx *ctx, const char *path, int flags, ferry_file **out);

/* ---- plans --------------------------------------------------------------- */
struct ferry_plan {
    ferry_extent *ext;            /* ext[i].place points into places[] by index (see plan.c) */
    ferry_place *places;
    size_t n, cap, nplaces, cap_places;
    char *strings;                /* copied paths and labels, offsets stored in the pointers' place */
    size_t nstr, cap_str;
};

/* ---- jobs and tasks ------------------------------------------------------ */
/* A task is either a byte range [lo, hi) of one extent (n == 1), or a pack:
 * n >= 2 whole small plain reads, ext .. ext+n-1, of one destination memory
 * kind and device (any files). Packs are cut by bytes (make_tasks in job.c):
 * a batch of a thousand 8 KiB records is a few tasks, not a thousand.
 *
 * Packing interface (exec_pack_* in exec.c; a device-decode stage reads
 * compressed batches through the same calls):
 *   - ferry_pack_begin(w, d): take the worker's next staging buffer for
 *     device d (waiting for its previous copies), position 0;
 *   - ferry_pack_room(w): bytes left in it;
 *   - ferry_pack_reserve(w, n): n bytes at the current position of the
 *     current buffer to read into (NULL when they do not fit: flush first);
 *   - ferry_pack_place(w, n, dst): the n bytes just reserved go to device
 *     address dst (adjacent runs with adjacent destinations merge);
 *   - ferry_pack_flush(w, j, d): move the buffer to the device: one
 *     cuMemcpyHtoDAsync per contiguous destination run, or, when the runs are
 *     many, one copy of the packed bytes into device scratch and one scatter
 *     kernel (ferry_cuda_scatter); then the buffer's event is recorded.
 *     ferry_pack_scratch(w, d, i) is that device copy of staging buffer i:
 *     a decode stage can copy packed compressed bytes there without placing
 *     them (dst 0) and decode from device memory. */
typedef struct ferry_task {
    uint32_t ext;                 /* index into job->ext (first extent of a pack) */
    uint32_t n;                   /* extents in the task: 1, or >= 2 for a pack */
    uint64_t lo, hi;              /* byte range within the extent (n == 1); for a pack 0 and its bytes */
} ferry_task;

struct ferry_job {
    ferry_ctx *ctx;
    ferry_extent *ext;            /* own copies; place/path/label point into places/strings */
    size_t next;                  /* number of extents */
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
    unsigned flags;               /* FERRY_SYNC, FERRY_NO_DIRECT */
    int direct;                   /* ferry_direct policy for this job */
    int allow_short;              /* ferry_pread: EOF ends the read, not an error */
    int max_workers, active_workers; /* per-call thread limit (under ctx->lock) */
    _Atomic uint64_t worker_mask[FERRY_MAX_WORKERS / 64]; /* workers that enqueued device work */
    _Atomic uint32_t dev_mask;    /* devices with enqueued work */
    double t_start;
    uint64_t id;                  /* unique per context (addresses can be reused) */
    struct ferry_job *qnext;      /* context queue link */
    struct ferry_gpudecode_job *gpu; /* gpudecode.c: batches of chunks decoded by nvCOMP, or NULL */
};

/* ---- workers ------------------------------------------------------------- */
typedef struct ferry_devstate {   /* a worker's per-device CUDA objects */
    CUstream stream;
    CUevent ev[FERRY_MAX_STAGING];
    CUevent dec_ev;
    int ready;
    CUdeviceptr scratch[FERRY_MAX_STAGING]; /* device copy of staging buffer i (packs; lazily) */
    CUdeviceptr dtab[FERRY_MAX_STAGING];    /* its scatter table */
} ferry_devstate;

#define FERRY_PACK_RUNS 4096      /* scatter entries per staging buffer */

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
    int is_inline;
    struct ferry_gpudecode_worker *gpu; /* gpudecode.c: its pinned/device buffers, or NULL */
} ferry_worker;

struct ferry_ctx {
    ferry_config cfg;
    pthread_mutex_t lock;
    pthread_cond_t work_cond;
    ferry_job *q_head, *q_tail;   /* jobs with tasks left to claim */
    ferry_worker *workers;
    int nworkers;                 /* started */
    int stop;
    ferry_worker *inline_free[8]; /* workers for small requests run on callers' threads */
    int ninline_free;
    pthread_mutex_t stats_lock;
    ferry_stats stats;
    _Atomic int active_jobs;
    _Atomic uint64_t next_job_id;
    pid_t pid;                    /* the creating process: a forked child has no workers */
    ferry_fcache files;           /* files opened by path (fcache.c) */
};
/* FERRY_EINVAL with a message when called in a process forked from the creator. */
int ferry_ctx_check_pid(const ferry_ctx *ctx);

double ferry_now(void);
void ferry_job_fail(ferry_job *job, int code);
int ferry_worker_init(ferry_ctx *ctx, ferry_worker *w, int id);
void ferry_worker_free(ferry_worker *w);
/* Run one task (a whole extent or a slice of a plain one) on worker w.
 * Returns 1 when the task is complete (the caller calls ferry_task_finished),
 * 0 when its device copies are still running (it completes from w's pending
 * list). Errors are recorded in the job. */
int ferry_exec_task(ferry_worker *w, ferry_job *job, const ferry_task *t);
/* Buffers for work that feeds device dev (pinned in dev's context), or host
 * work (dev < 0: plain memory, CUDA untouched). */
int ferry_worker_staging(ferry_worker *w, int dev);
int ferry_worker_grow(ferry_worker *w, int dev, uint8_t **buf, size_t *cap, int *pinned, size_t n);
/* A 4 KiB-aligned buffer of n bytes, pinned in dev's context when dev >= 0. */
int ferry_worker_alloc(ferry_worker *w, int dev, uint8_t **p, size_t n, int *pinned);
int ferry_worker_device(ferry_worker *w, int d, ferry_devstate **out);
/* Wait until staging buffer i is no longer the source or target of a copy. */
int ferry_stage_wait(ferry_worker *w, int i);
/* Count bytes read/written with O_DIRECT, buffered, and decoded. */
void ferry_count_io(ferry_ctx *ctx, uint64_t direct, uint64_t buffered, uint64_t decoded);
/* Note that w enqueued device work for job j on device d. */
void ferry_mark_device(ferry_worker *w, ferry_job *j, int d);
/* The open file an extent names by path (opened by the worker, kept for the job). */
int ferry_path_file(ferry_worker *w, ferry_job *j, const char *path, ferry_file **out);
/* Run a pack task (n >= 2 small plain reads): returns bytes or a negative
 * code with the message naming the file and byte that failed. */
int64_t ferry_exec_pack(ferry_worker *w, ferry_job *j, const ferry_task *t, int *deferred);
/* Packing into staging buffers (see ferry_task above). */
int ferry_pack_begin(ferry_worker *w, int d);
uint64_t ferry_pack_room(const ferry_worker *w);
uint8_t *ferry_pack_reserve(ferry_worker *w, uint64_t n);
int ferry_pack_place(ferry_worker *w, uint64_t n, CUdeviceptr dst);
int ferry_pack_flush(ferry_worker *w, ferry_job *j, int d);
int ferry_pack_scratch(ferry_worker *w, int d, int i, CUdeviceptr *out);
void ferry_worker_completed(ferry_worker *w, int d, uint64_t seq);
int ferry_worker_defer(ferry_worker *w, ferry_job *job, int d);
/* The worker has no job: let go of the file it held. */
void ferry_worker_idle(ferry_worker *w);
/* Complete every pending device task of w (wait for its streams). */
void ferry_worker_drain(ferry_worker *w);
/* A task's device work (if any) is complete. */
void ferry_task_finished(ferry_job *job);
/* Host-side placement and fill (also used for device fills via pinned memory). */
void ferry_place_host(uint8_t *dst, const uint8_t *src, const ferry_place *p);
void ferry_fill_host(uint8_t *dst, const uint8_t *val, unsigned size, const ferry_place *p, uint64_t bytes);
/* Normalise a placement: drop unit dims, merge mergeable dims. Returns ndim. */
int ferry_place_normalize(const ferry_place *in, ferry_place *out);
/* Resolve buffer device ids (device < 0 -> look up). */
int ferry_buf_resolve(ferry_buf *b);
#endif
