/* job.c — running plans: copy and check the plan, choose the path, cut the
 * work into tasks, queue it for the workers (or run a small one on the
 * caller's thread), and wait. */
#include "engine/engine.h"
#include "engine/knobs.h"
#include "engine/sysio.h"
#include "engine/io.h"
#include "engine/gpudecode.h"
#include "engine/gather.h"
#include <errno.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* A plain extent moves bytes unchanged (or only byteswapped) to a contiguous
 * range: it can be cut into tasks and pipelined. */
static int is_plain(const ferry_extent *e) {
    if (e->kind == FERRY_EXTENT_WRITE) return 1;
    if (e->kind != FERRY_EXTENT_READ || (e->place && !(e->flags & FERRY_EXTENT_FLAT_))) return 0;
    return e->ncodecs == 0 || ferry_codecs_only_byteswap(e->codecs, e->ncodecs) > 0;
}

/* A read by path whose placement moves its bytes unchanged to one
 * contiguous range: no codecs (a byteswap is applied per element either way,
 * but packs do not swap), the box starting at the first byte, its elements
 * adjacent in source and destination (C order in both), and as many bytes as
 * the extent reads. Zarr plans every uncompressed chunk so (layout.c keeps
 * the placement for MISSING_FILLS); reading them through the coded path cost
 * a bounce buffer and a memcpy per chunk on the host and, to a GPU, one
 * staged copy per chunk instead of packs (0.49x the rate of the same files
 * read as plain extents). */
static int flat_place(const ferry_extent *e) {
    const ferry_place *p = e->place;
    if (!p || e->kind != FERRY_EXTENT_READ || e->file || e->ncodecs || p->src_offset || p->ndim < 1) return 0;
    uint64_t bytes = p->itemsize;
    for (int k = p->ndim - 1; k >= 0; k--) {
        if (p->count[k] == 0) return 0;
        if (p->count[k] > 1 && (p->src_stride[k] != (int64_t)bytes || p->dst_stride[k] != (int64_t)bytes)) return 0;
        if (ferry_mul_overflow(bytes, p->count[k], &bytes)) return 0;
    }
    return bytes == e->length && e->decoded_size == e->length;
}

static int same_codecs(const ferry_extent *a, const ferry_extent *b) {
    if (a->ncodecs != b->ncodecs) return 0;
    return memcmp(a->codecs, b->codecs, sizeof(ferry_codec) * (size_t)a->ncodecs) == 0;
}

/* Merge b into a when both are plain, of one file, adjacent in the file and in
 * the same buffer: a plan of many small runs becomes few large reads. */
static int try_merge(ferry_extent *a, const ferry_extent *b) {
    if (a->kind != b->kind || !is_plain(a) || !is_plain(b) || !same_codecs(a, b)) return 0;
    if (a->place || b->place) return 0;   /* a flat placement describes its own extent only */
    if (!a->file || a->file != b->file) return 0;
    if (a->dst.kind != b->dst.kind || a->dst.ptr != b->dst.ptr || a->dst.device != b->dst.device) return 0;
    if (a->offset + a->length != b->offset || a->dst_offset + a->length != b->dst_offset) return 0;
    if (a->label != b->label) return 0;
    a->length += b->length;
    a->decoded_size = a->length;
    return 1;
}

int ferry_buf_resolve(ferry_buf *b) {
    if (b->kind != FERRY_MEM_CUDA) return 0;
    if (b->device >= 0) return b->device < FERRY_MAX_DEVICES ? 0 : ferry_seterr(FERRY_EINVAL, "CUDA device %d", b->device);
    int d = ferry_cuda_pointer_device((uintptr_t)b->ptr);
    if (d < 0) return d;
    if (d >= FERRY_MAX_DEVICES) return ferry_seterr(FERRY_EUNSUPPORTED, "CUDA device %d (at most %d)", d, FERRY_MAX_DEVICES);
    b->device = d;
    return 0;
}

/* AUTO and forced paths for plain device extents. Host memory has one path. */
/* local_device: some device extent reads a local file (GDS reads no remote object, so a plan
 * of remote objects only is staged without a fallback counted). */
static int choose_path(ferry_ctx *ctx, ferry_path want, int has_device, int local_device, int dev, ferry_path *out,
                       int *forced) {
    if (want == FERRY_PATH_AUTO) want = ctx->cfg.path;
    *forced = want != FERRY_PATH_AUTO;
    const char *why;
    if (has_device && !ferry_cuda_load(&why))
        return ferry_seterr(FERRY_ENOCUDA, "device memory given but CUDA is not available: %s", why);
    switch (want) {
    case FERRY_PATH_HOST:
        if (has_device) return ferry_seterr(FERRY_EPATH, "path \"host\" was forced but the plan names GPU memory");
        *out = FERRY_PATH_HOST;
        return 0;
    case FERRY_PATH_STAGED:
        *out = FERRY_PATH_STAGED;
        return 0;
    case FERRY_PATH_CUFILE:
        if (has_device && !ferry_cufile_load_on(dev, &why))
            return ferry_seterr(FERRY_EPATH, "path \"cufile\" was forced but cuFile cannot run: %s", why);
        *out = FERRY_PATH_CUFILE;
        return 0;
    default:
        *out = FERRY_PATH_STAGED;
        if (has_device && ferry_cufile_native() && ferry_cufile_load_on(dev, NULL)) *out = FERRY_PATH_CUFILE;
        else if (has_device && local_device && ferry_cufile_load_on(dev, NULL)) {
            pthread_mutex_lock(&ctx->stats_lock);
            ctx->stats.fallbacks++;
            pthread_mutex_unlock(&ctx->stats_lock);
        }
        return 0;
    }
}

static void job_free(ferry_job *j) {
    if (!j) return;
    free(j->ext);
    free(j->places);
    free(j->strings);
    free(j->tasks);
    ferry_gather_release(j);
    ferry_gpudecode_job_free(j);
    ferry_job_free_waits(j);   /* streamwait.c */
    pthread_mutex_destroy(&j->lock);
    pthread_cond_destroy(&j->cond);
    free(j);
}

static int add_task(ferry_job *j, size_t *cap, uint32_t ext, uint32_t n, uint64_t lo, uint64_t hi) {
    if (j->ntasks == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        ferry_task *t = realloc(j->tasks, nc * sizeof *t);
        if (!t) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        j->tasks = t;
        *cap = nc;
    }
    j->tasks[j->ntasks++] = (ferry_task){ext, n, lo, hi};
    return 0;
}

/* A size setting of the environment (unless the context ignores it): *out
 * is dflt when unset, an error naming it when outside [lo, 1G]. */
static int size_policy(const ferry_ctx *ctx, const char *name, uint64_t dflt, int64_t lo, const char *want,
                       uint64_t *out) {
    const char *s = ferry_knob(ctx, name);
    *out = dflt;
    if (!s) return 0;
    int64_t v = ferry_knob_bytes(s);
    if (v < lo || v > (1ll << 30)) return ferry_seterr(FERRY_EINVAL, "%s=\"%s\": %s", name, s, want);
    *out = (uint64_t)v;
    return 0;
}

/* FERRY_PACK_MIN (default 64 KiB): the least bytes of a pack
 * task. Larger packs mean fewer claims and, into device memory, fewer and
 * larger host-to-device copies (each has a fixed cost of microseconds), but
 * fewer tasks per batch for the workers to share: an experiment
 * (bench/bench_records.py runs 256K beside the default); the default moves
 * only with its numbers. */
static int pack_min_policy(const ferry_ctx *ctx, uint64_t *out) {
    return size_policy(ctx, "FERRY_PACK_MIN", 64u << 10, 4096, "a size from 4K to 1G", out);
}

/* FERRY_MAP_MAX (default 64 KiB): warm packed records of up to this many
 * bytes (a run of adjacent ones in all) are copied from a mapping of their
 * file instead of read with pread (mapread.c says why); 0 turns it off. */
static int map_max_policy(const ferry_ctx *ctx, uint64_t *out) {
    return size_policy(ctx, "FERRY_MAP_MAX", 64u << 10, 0, "a size up to 1G (0: off)", out);
}

/* FERRY_READAROUND (default 4M; 0: off): the cold hints of packed records
 * (pack.c, hint_range) cover the aligned windows of this many bytes around
 * each record, as a memory-mapped reader's faults do. */
static int read_around_policy(const ferry_ctx *ctx, uint64_t *out) {
    int rc = size_policy(ctx, "FERRY_READAROUND", 4u << 20, 0, "a power of two from 64K to 1G (0: off)", out);
    if (rc == 0 && *out && (*out < (64u << 10) || (*out & (*out - 1))))
        return ferry_seterr(FERRY_EINVAL, "FERRY_READAROUND=\"%s\": a power of two from 64K to 1G (0: off)",
                            ferry_knob(ctx, "FERRY_READAROUND"));
    return rc;
}

/* Records up to this size are packed (AUTO reads them buffered anyway; the
 * O_DIRECT policy ON keeps them one task each, where alignment decides). */
#define PACK_MAX_EXTENT (1u << 20)

/* FERRY_EXTENT_NOFOLLOW reads (every chunk of a store) pack too: a pack opens
 * each file through ferry_path_file, which keeps the no-follow open and its
 * root, and a run never joins extents opened differently (pack.c). */
static int packable(const ferry_job *j, const ferry_extent *e, size_t staging) {
    if (e->kind != FERRY_EXTENT_READ || e->ncodecs || e->length == 0) return 0;
    /* a flat placement's extent (a whole uncompressed chunk file) packs: a
     * pack fills it when its file is absent (MISSING_FILLS, pack.c) */
    if (e->place && !(e->flags & FERRY_EXTENT_FLAT_)) return 0;
    if (e->flags & ~(unsigned)(FERRY_EXTENT_NOFOLLOW | FERRY_EXTENT_MISSING_FILLS | FERRY_EXTENT_FLAT_)) return 0;
    if (j->direct == FERRY_DIRECT_ON || e->length > PACK_MAX_EXTENT) return 0;
    return e->dst.kind == FERRY_MEM_HOST || e->length <= staging;
}

/* Cut the work into tasks by bytes. Runs of small plain reads (of one memory
 * kind and device) become packs of about `pack` bytes each: enough tasks for
 * every worker twice, at least 64 KiB each (a task claim costs a lock and a
 * wake-up: 16 reads of 4 KiB amortise it), at most task_size. Large plain extents are cut at task_size
 * boundaries aligned in the file (so O_DIRECT middles stay aligned);
 * byteswapped ones at multiples of the element size from the extent start.
 * Other extents are one task each. */
static int make_tasks(ferry_job *j, size_t task_size, size_t staging) {
    size_t cap = 0;
    /* gpudecode.c: its GPU feeders, then one task per chunk of a queue the
     * GPU shares with the CPU, queued first so that the CPU's tasks run on
     * the other workers while batches are read and decoded */
    for (size_t b = 0; b < ferry_gpudecode_tasks(j); b++)
        if (add_task(j, &cap, FERRY_GPU_TASK, 1, b, b + 1) < 0) return FERRY_ENOMEM;
    uint64_t packed = 0;
    for (size_t i = 0; i < j->next; i++)
        if (!ferry_gpudecode_owns(j, i) && packable(j, &j->ext[i], staging)) packed += j->ext[i].length;
    uint64_t pack = packed / (2 * (uint64_t)(j->max_workers > 0 ? j->max_workers : 1));
    if (pack < j->pack_min) pack = j->pack_min;
    if (pack > task_size) pack = task_size;
    for (size_t i = 0; i < j->next;) {
        const ferry_extent *e = &j->ext[i];
        if (ferry_gpudecode_owns(j, i)) { i++; continue; }   /* decoded on the GPU: in a batch task above */
        if (packable(j, e, staging)) {
            size_t m = i + 1;
            uint64_t bytes = e->length;
            while (m < j->next && m - i < UINT32_MAX && bytes < pack) {
                const ferry_extent *x = &j->ext[m];
                if (ferry_gpudecode_owns(j, m) || !packable(j, x, staging) || x->dst.kind != e->dst.kind || x->dst.device != e->dst.device) break;
                bytes += x->length;
                m++;
            }
            if (m - i >= 2) {
                if (add_task(j, &cap, (uint32_t)i, (uint32_t)(m - i), 0, bytes) < 0) return FERRY_ENOMEM;
                i = m;
                continue;
            }
        }
        uint64_t len = e->length;
        /* an extent that may be filled instead (MISSING_FILLS) is one task: its fill is the whole box */
        if (!is_plain(e) || len <= task_size || (e->flags & FERRY_EXTENT_MISSING_FILLS)) {
            if (add_task(j, &cap, (uint32_t)i, 1, 0, len) < 0) return FERRY_ENOMEM;
            i++;
            continue;
        }
        int swap = e->ncodecs ? ferry_codecs_only_byteswap(e->codecs, e->ncodecs) : 0;
        uint64_t lo = 0;
        while (lo < len) {
            uint64_t hi;
            if (swap) hi = lo + task_size;                                  /* multiple of 16 */
            else hi = ferry_align_down(e->offset + lo + task_size) - e->offset; /* aligned in the file */
            if (hi <= lo) hi = lo + task_size;
            if (hi > len) hi = len;
            if (add_task(j, &cap, (uint32_t)i, 1, lo, hi) < 0) return FERRY_ENOMEM;
            lo = hi;
        }
        i++;
    }
    return 0;
}

/* FERRY_READAHEAD, unless the context ignores the environment. */
static int readahead_policy(const ferry_ctx *ctx, int *out) {
    const char *s = ferry_knob(ctx, "FERRY_READAHEAD");
    *out = FERRY_READAHEAD_AUTO;
    if (!s || !strcmp(s, "auto")) return 0;
    if (!strcmp(s, "off") || !strcmp(s, "0")) *out = FERRY_READAHEAD_OFF;
    else if (!strcmp(s, "on") || !strcmp(s, "1")) *out = FERRY_READAHEAD_ON;
    else return ferry_seterr(FERRY_EINVAL, "FERRY_READAHEAD=\"%s\": use auto, on or off", s);
    return 0;
}

/* Build a job from a plan: own copies, resolved pointers, merged extents. */
static int job_build(ferry_ctx *ctx, const ferry_plan *plan, const ferry_run_opts *opts, ferry_job **out) {
    ferry_job *j = calloc(1, sizeof *j);
    if (!j) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    pthread_mutex_init(&j->lock, NULL);
    pthread_cond_init(&j->cond, NULL);
    j->ctx = ctx;
    j->id = atomic_fetch_add(&ctx->next_job_id, 1) + 1;
    j->flags = opts ? opts->flags : 0;
    /* another family's flag (FERRY_NATIVE, FERRY_EXACT_RUNS) passed here would
     * otherwise mean whatever run flag shares its bit, or nothing */
    if (j->flags & ~(unsigned)(FERRY_SYNC | FERRY_NO_DIRECT | FERRY_REREAD)) {
        unsigned bad = j->flags;
        job_free(j);
        return ferry_seterr(FERRY_EINVAL, "run flags 0x%x: unknown bits (FERRY_SYNC, FERRY_NO_DIRECT, FERRY_REREAD)", bad);
    }
    j->direct = (j->flags & FERRY_NO_DIRECT) ? FERRY_DIRECT_OFF : ctx->cfg.direct;
    /* read once per context (a getenv scan costs a 4 KiB read's latency a
     * tenth); a bad value fails every plan until the context is made anew */
    if (!atomic_load(&ctx->job_env_ready)) {
        int ra;
        uint64_t pm, mm, rr;
        if (readahead_policy(ctx, &ra) < 0 || pack_min_policy(ctx, &pm) < 0 || map_max_policy(ctx, &mm) < 0 ||
            read_around_policy(ctx, &rr) < 0) {
            job_free(j);
            return FERRY_EINVAL;
        }
        atomic_store(&ctx->readahead, ra);
        atomic_store(&ctx->pack_min, pm);
        atomic_store(&ctx->map_max, mm);
        atomic_store(&ctx->read_around, rr);
        atomic_store(&ctx->job_env_ready, 1);   /* racing threads store the same values */
    }
    j->readahead = atomic_load(&ctx->readahead);
    j->pack_min = atomic_load(&ctx->pack_min);
    j->map_max = atomic_load(&ctx->map_max);
    j->read_around = atomic_load(&ctx->read_around);
    j->max_workers = opts && opts->threads > 0 ? opts->threads : ctx->cfg.threads;
    if (j->max_workers > ctx->cfg.threads) j->max_workers = ctx->cfg.threads;
    size_t n = plan->n;
    j->plan_records = n;
    j->ext = malloc((n ? n : 1) * sizeof *j->ext);
    j->places = malloc((plan->nplaces ? plan->nplaces : 1) * sizeof *j->places);
    j->strings = malloc(plan->nstr ? plan->nstr : 1);
    if (!j->ext || !j->places || !j->strings) { job_free(j); return ferry_seterr(FERRY_ENOMEM, "out of memory"); }
    if (plan->nplaces) memcpy(j->places, plan->places, plan->nplaces * sizeof *j->places);
    if (plan->nstr) memcpy(j->strings, plan->strings, plan->nstr);
    int has_dev = 0, local_dev = 0, first_dev = -1;
    /* buffers of unknown device (device < 0) are looked up once per distinct
     * buffer, not per extent: a 10,000-chunk read into one array asks the
     * driver once (two cuPointerGetAttribute calls), not 20,000 times */
    enum { SEEN = 8 };
    void *seen_ptr[SEEN];
    int seen_dev[SEEN], nseen = 0;
    for (size_t i = 0; i < n; i++) {
        ferry_extent e = plan->ext[i];
        if (e.place) e.place = &j->places[(uintptr_t)e.place - 1];
        if (e.path) e.path = j->strings + ((uintptr_t)e.path - 1);
        if (flat_place(&e)) e.flags |= FERRY_EXTENT_FLAT_;
        if (e.label) e.label = j->strings + ((uintptr_t)e.label - 1);
        if (e.root) e.root = j->strings + ((uintptr_t)e.root - 1);
        int rc = 0, k;
        if (e.dst.kind == FERRY_MEM_CUDA && e.dst.device < 0) {
            for (k = 0; k < nseen && seen_ptr[k] != e.dst.ptr; k++) {}
            if (k < nseen) e.dst.device = seen_dev[k];
            else if ((rc = ferry_buf_resolve(&e.dst)) == 0) {
                k = nseen < SEEN ? nseen++ : (int)(i % SEEN);
                seen_ptr[k] = e.dst.ptr;
                seen_dev[k] = e.dst.device;
            }
        } else {
            rc = ferry_buf_resolve(&e.dst);
        }
        if (rc < 0) { job_free(j); return rc; }
        if (e.dst.kind == FERRY_MEM_CUDA && !has_dev++) first_dev = e.dst.device;
        if (!local_dev && e.dst.kind == FERRY_MEM_CUDA &&
            !(e.file ? e.file->remote != NULL : e.path && strstr(e.path, "://")))
            local_dev = 1;
        if (j->next > 0 && try_merge(&j->ext[j->next - 1], &e)) continue;
        j->ext[j->next++] = e;
    }
    int rc = choose_path(ctx, opts ? opts->path : FERRY_PATH_AUTO, has_dev, local_dev, first_dev, &j->path,
                         &j->forced);
    if (rc < 0) { job_free(j); return rc; }
    rc = ferry_gpudecode_plan(j, opts ? opts->decode : FERRY_DECODE_AUTO);   /* gpudecode.c */
    if (rc < 0) { job_free(j); return rc; }
    rc = make_tasks(j, ctx->cfg.task_size, ctx->cfg.staging_size);
    if (rc < 0) { job_free(j); return rc; }
    rc = ferry_gather_plan(j);   /* gather.c: a batch into one device buffer, one copy per run */
    if (rc < 0) { job_free(j); return rc; }
    rc = ferry_job_record_waits(j, plan, first_dev);   /* streamwait.c: last, on the caller's thread */
    if (rc < 0) { job_free(j); return rc; }
    *out = j;
    return 0;
}

static int submit_job(ferry_ctx *ctx, ferry_job *j, int allow_inline) {
    int rc = ferry_ctx_check_pid(ctx);
    if (rc < 0) return rc;
    j->t_start = ferry_now();
    atomic_fetch_add(&ctx->active_jobs, 1);
    atomic_fetch_add(&ctx->running_jobs, 1);   /* until ferry_job_complete (jobstate.c) */
    if (j->ntasks == 0) { ferry_job_complete(j); return 0; }
    uint64_t total = 0;
    for (size_t i = 0; i < j->next; i++) total += j->ext[i].length;
    /* a few small extents: the caller's thread; many small extents (chunks to
     * decompress, records packed into a few tasks) still go to the pool,
     * where they run in parallel — counting tasks here sent a batch of 256
     * 8 KiB records (a few packs) to one thread: 16 GB/s against a 39 GB/s
     * pread limit; a job that waits for a caller's stream never
     * runs here: ferry_submit must not wait for the stream */
    if (allow_inline && !j->nwait && ((total <= ctx->cfg.small_io && j->next <= 4 && j->ntasks <= 4) || j->max_workers <= 1) &&
        ferry_pool_run_inline(ctx, j) == 0)
        return 0;
    pthread_mutex_lock(&ctx->lock);
    int want = j->max_workers;
    if ((size_t)want > j->ntasks && ctx->nworkers < want) want = (int)(j->ntasks > (size_t)ctx->nworkers ? j->ntasks : (size_t)ctx->nworkers);
    rc = ferry_pool_start(ctx, want);
    if (rc < 0 && ctx->nworkers == 0) {
        pthread_mutex_unlock(&ctx->lock);
        atomic_fetch_sub(&ctx->running_jobs, 1);
        atomic_fetch_sub(&ctx->active_jobs, 1);
        return rc;
    }
    ferry_pool_enqueue(ctx, j);
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}

int ferry_submit(ferry_ctx *ctx, const ferry_plan *plan, const ferry_run_opts *opts, ferry_job **out) {
    if (!ctx || !plan || !out) return ferry_seterr(FERRY_EINVAL, "ferry_submit: NULL argument");
    *out = NULL;
    ferry_job *j;
    int rc = job_build(ctx, plan, opts, &j);
    if (rc < 0) return rc;
    rc = submit_job(ctx, j, 1);
    if (rc < 0) { job_free(j); return rc; }
    *out = j;
    return 0;
}

int64_t ferry_job_wait(ferry_job *j, int64_t timeout_ns) {
    if (!j) return ferry_seterr(FERRY_EINVAL, "ferry_job_wait: NULL job");
    /* FERRY_SPIN_US (pool.c): watch the count of finished tasks that long
     * before sleeping, so the caller learns at once that a batch is done and
     * can queue the next one (no wake-up of a halted vCPU in between) */
    int spin = atomic_load(&j->ctx->spin_us);
    if (spin > 0 && timeout_ns != 0) {
        double end = ferry_now() + spin * 1e-6;
        for (int k = 0; atomic_load(&j->tasks_done) < j->ntasks; k++)
            if ((k & 63) == 0 && ferry_now() > end) break;
    }
    pthread_mutex_lock(&j->lock);
    if (timeout_ns < 0) {
        while (!j->done) pthread_cond_wait(&j->cond, &j->lock);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ns / 1000000000;
        ts.tv_nsec += timeout_ns % 1000000000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        while (!j->done)
            if (pthread_cond_timedwait(&j->cond, &j->lock, &ts) != 0) break;
        if (!j->done) {
            pthread_mutex_unlock(&j->lock);
            return ferry_seterr(FERRY_ETIMEDOUT, "job still running");
        }
    }
    pthread_mutex_unlock(&j->lock);
    int err = atomic_load(&j->error);
    if (err) return ferry_seterr(err, "%s", j->errmsg);
    return (int64_t)atomic_load(&j->bytes);
}

int ferry_job_done(ferry_job *j) {
    pthread_mutex_lock(&j->lock);
    int d = j->done;
    pthread_mutex_unlock(&j->lock);
    return d;
}

ferry_path ferry_job_path(ferry_job *j) {
    for (int p = 1; p < FERRY_PATH_COUNT_; p++)
        if (p != FERRY_PATH_HOST && atomic_load(&j->path_ops[p])) return (ferry_path)p;
    return atomic_load(&j->path_ops[FERRY_PATH_HOST]) ? FERRY_PATH_HOST : j->path;
}

void ferry_job_cancel(ferry_job *j) { if (j) atomic_store(&j->canceled, 1); }

void ferry_job_destroy(ferry_job *j) {
    if (!j) return;
    ferry_job_wait(j, -1);
    ferry_ctx *ctx = j->ctx;
    /* the job may still sit (fully claimed) at the queue head: unlink under the lock */
    pthread_mutex_lock(&ctx->lock);
    ferry_pool_unlink(ctx, j);
    pthread_mutex_unlock(&ctx->lock);
    job_free(j);
    atomic_fetch_sub(&ctx->active_jobs, 1);
}

int64_t ferry_run(ferry_ctx *ctx, const ferry_plan *plan, const ferry_run_opts *opts) {
    ferry_job *j;
    int rc = ferry_submit(ctx, plan, opts, &j);
    if (rc < 0) return rc;
    int64_t r = ferry_job_wait(j, -1);
    ferry_job_destroy(j);
    return r;
}

int ferry_job_stream_wait(ferry_job *j, void *stream) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    if (!cu) return ferry_seterr(FERRY_ENOCUDA, "ferry_job_stream_wait: CUDA not available");
    /* Wait (on the host) only until every read is done and its copies are
     * enqueued; the copies themselves are awaited by the stream. */
    pthread_mutex_lock(&j->lock);
    while (!j->done && atomic_load(&j->tasks_issued) < j->ntasks) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        pthread_cond_timedwait(&j->cond, &j->lock, &ts);
    }
    int done = j->done;
    pthread_mutex_unlock(&j->lock);
    int err = atomic_load(&j->error);
    if (err) return ferry_seterr(err, "%s", j->errmsg);
    if (done) return 0;
    CUcontext saved = NULL;
    cu->CtxGetCurrent(&saved);
    /* The caller's stream is used in its own context, which may be another
     * device's than the job's (events of any device may be waited for). The
     * default streams (NULL, legacy 0x1, per-thread 0x2) are the caller's
     * context's; with no context current, the job's device's. */
    CUcontext sctx = saved;
    if ((uintptr_t)stream > 2 && cu->StreamGetCtx && cu->StreamGetCtx((CUstream)stream, &sctx) != 0)
        return ferry_seterr(FERRY_EINVAL, "ferry_job_stream_wait: not a CUDA stream");
    int rc = 0;
    ferry_ctx *ctx = j->ctx;
    uint32_t devs = atomic_load(&j->dev_mask);
    for (int w = 0; w < ctx->nworkers && rc == 0; w++) {
        if (!(atomic_load(&j->worker_mask[w / 64]) & (1ull << (w % 64)))) continue;
        for (int d = 0; d < FERRY_MAX_DEVICES && rc == 0; d++) {
            if (!(devs & (1u << d)) || !ctx->workers[w].dev[d].ready) continue;
            if ((rc = ferry_cuda_use_device(d)) < 0) break;
            CUevent ev = NULL;
            CUresult r = cu->EventCreate(&ev, FERRY_CU_EVENT_DISABLE_TIMING);
            if (r == 0) r = cu->EventRecord(ev, ctx->workers[w].dev[d].stream);
            if (r == 0 && sctx) r = cu->CtxSetCurrent(sctx);
            if (r == 0) r = cu->StreamWaitEvent((CUstream)stream, ev, 0);
            if (ev && ferry_cuda_use_device(d) == 0) cu->EventDestroy(ev);   /* freed once the wait is met */
            if (r != 0) rc = ferry_seterr(FERRY_ECUDA, "ferry_job_stream_wait: %s", ferry_cuda_errstr(r));
        }
    }
    cu->CtxSetCurrent(saved);
    return rc;
}

/* ---- blocking one-extent calls ------------------------------------------ */
/* ferry_pread/ferry_pwrite: a one-extent plan on the stack, run at once (small
 * ones on the caller's thread). Reads may stop at EOF; writes may not. */
static int64_t one_extent(ferry_file *f, ferry_extent_kind kind, ferry_buf buf, uint64_t offset, size_t len,
                          unsigned flags) {
    if (!f) return ferry_seterr(FERRY_EINVAL, "NULL file");
    ferry_ctx *ctx = f->ctx;
    /* a one-slot plan on the stack, filled by the plan builder (its checks,
     * no allocation: an extent by file with no placement copies no string) */
    ferry_extent slot;
    ferry_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.ext = &slot;
    plan.cap = 1;
    int rc = kind == FERRY_EXTENT_READ ? ferry_plan_read(&plan, f, offset, len, buf, 0)
                                       : ferry_plan_write(&plan, f, offset, len, buf, 0);
    if (rc < 0) return ferry_preerr(rc, "%s", f->path);
    ferry_run_opts o = {FERRY_PATH_AUTO, 0, flags, FERRY_DECODE_AUTO};
    ferry_job *j;
    rc = job_build(ctx, &plan, &o, &j);
    if (rc < 0) return rc;
    j->allow_short = kind == FERRY_EXTENT_READ;
    rc = submit_job(ctx, j, 1);
    if (rc < 0) { job_free(j); return rc; }
    int64_t r = ferry_job_wait(j, -1);
    ferry_job_destroy(j);
    return r;
}

int64_t ferry_pread(ferry_file *f, ferry_buf dst, uint64_t offset, size_t len, unsigned flags) {
    return one_extent(f, FERRY_EXTENT_READ, dst, offset, len, flags);
}

int64_t ferry_pwrite(ferry_file *f, ferry_buf src, uint64_t offset, size_t len, unsigned flags) {
    return one_extent(f, FERRY_EXTENT_WRITE, src, offset, len, flags);
}
