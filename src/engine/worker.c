/* worker.c — a worker's resources: its staging buffers, a stream and
 * events per device, and the list of tasks whose device copies may still run
 * (completed as their events pass). The threads and their task loop are in
 * pool.c. */
#include "engine/engine.h"
#include "engine/knobs.h"
#include "engine/numa.h"   /* multigpu: worker placement */
#include <sched.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax_() _mm_pause()
#else
#define cpu_relax_() ((void)0)
#endif

/* A 4 KiB-aligned host buffer of n bytes. For work that feeds device dev it is
 * pinned, in dev's primary context: pinned memory belongs to the context that
 * allocated it, and a process that serves only device 1 must never open a
 * context on device 0 (hundreds of MB of that GPU, in every rank). For
 * host-only work (dev < 0) plain memory does and CUDA is not touched. Portable
 * pinned memory serves copies to every device. A failed pin is not retried. */
static int alloc_host(ferry_worker *w, int dev, uint8_t **p, size_t n, int *pinned) {
    *p = NULL;
    *pinned = 0;
    const ferry_cuda_api *cu = dev >= 0 && !w->pin_failed ? ferry_cuda_load(NULL) : NULL;
    if (cu) {
        /* multigpu (numa.c): a pool worker moves to dev's NUMA node before its
         * first pinned allocation, so its staging is first touched there */
        if (!w->is_inline) ferry_numa_place_thread(w->ctx, dev);
        if (ferry_cuda_use_device(dev) == 0) {
            if (cu->MemHostAlloc((void **)p, n, FERRY_CU_MEMHOSTALLOC_PORTABLE) == 0) {
                *pinned = 1;
                return 0;
            }
            *p = NULL;
            w->pin_failed = 1;   /* e.g. the locked-memory limit: do not ask each time */
        }
        ferry_clearerr();        /* a device that cannot be used fails the task later, with its reason */
    }
    /* plain memory: huge pages where it is large enough (hostmem.c) */
    if (ferry_host_alloc(w->ctx, n, (void **)p) < 0) { *p = NULL; return ferry_seterr(FERRY_ENOMEM, "staging: out of memory"); }
    return 0;
}

int ferry_worker_alloc(ferry_worker *w, int dev, uint8_t **p, size_t n, int *pinned) {
    return alloc_host(w, dev, p, n, pinned);
}

void ferry_worker_free_host(uint8_t *p, size_t n, int pinned) {
    if (!p) return;
    if (pinned) {
        const ferry_cuda_api *cu = ferry_cuda_load(NULL);
        if (cu) cu->MemFreeHost(p);
    } else ferry_host_free(NULL, p, n);
}

/* Whether a buffer that is plain host memory should be pinned now: it is
 * about to feed device dev, and pinning has not failed before. */
static int want_pin(const ferry_worker *w, int dev, int pinned) {
    return !pinned && dev >= 0 && !w->pin_failed;
}

int ferry_worker_init(ferry_ctx *ctx, ferry_worker *w, int id) {
    memset(w, 0, sizeof *w);
    w->ctx = ctx;
    w->id = id;
    w->dec_dev = -1;
    w->pack_i = -1;
    for (int i = 0; i < FERRY_MAX_STAGING; i++) w->stage_dev[i] = -1;
    ferry_decode_scratch_init(&w->scratch);
    return 0;
}

/* Staging buffers are allocated on first use, and pinned again once device
 * work needs them: plain ones were only used by host work (nothing in flight). */
int ferry_worker_staging(ferry_worker *w, int dev) {
    if (w->stage[0] && !want_pin(w, dev, w->stage_pinned[0])) return 0;
    for (int i = 0; i < w->ctx->cfg.staging_count; i++) {
        ferry_worker_free_host(w->stage[i], w->ctx->cfg.staging_size, w->stage_pinned[i]);
        int rc = alloc_host(w, dev, &w->stage[i], w->ctx->cfg.staging_size, &w->stage_pinned[i]);
        if (rc < 0) return rc;
    }
    return 0;
}

/* A buffer of at least n bytes, 4 KiB aligned, pinned when it feeds device
 * dev (>= 0); previous contents are not kept. The caller has waited for
 * copies from it. */
int ferry_worker_grow(ferry_worker *w, int dev, uint8_t **buf, size_t *cap, int *pinned, size_t n) {
    if (*cap >= n && *buf && !want_pin(w, dev, *pinned)) return 0;
    size_t nc = *cap ? *cap : (1u << 20);
    while (nc < n) nc *= 2;
    ferry_worker_free_host(*buf, *cap, *pinned);
    *buf = NULL;
    *cap = 0;
    int rc = alloc_host(w, dev, buf, nc, pinned);
    if (rc < 0) return rc;
    *cap = nc;
    return 0;
}

void ferry_worker_free(ferry_worker *w) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    ferry_worker_drain(w);
    if (w->gpu_free) w->gpu_free(w);   /* the GPU decode stage's buffers (gpudecode_dev.c set it) */
    for (int d = 0; d < FERRY_MAX_DEVICES; d++) {
        if (!w->dev[d].ready || !cu) continue;
        ferry_cuda_use_device(d);
        for (int i = 0; i < FERRY_MAX_STAGING; i++) if (w->dev[d].ev[i]) cu->EventDestroy(w->dev[d].ev[i]);
        for (int i = 0; i < FERRY_MAX_STAGING; i++) {
            if (w->dev[d].scratch[i]) cu->MemFree(w->dev[d].scratch[i]);
            if (w->dev[d].dtab[i]) cu->MemFree(w->dev[d].dtab[i]);
        }
        if (w->dev[d].dec_ev) cu->EventDestroy(w->dev[d].dec_ev);
        cu->StreamDestroy(w->dev[d].stream);
    }
    for (int i = 0; i < FERRY_MAX_STAGING; i++) ferry_worker_free_host(w->stage[i], w->ctx->cfg.staging_size, w->stage_pinned[i]);
    for (int i = 0; i < FERRY_MAX_STAGING; i++)
        ferry_worker_free_host((uint8_t *)w->tab[i], FERRY_PACK_RUNS * sizeof(ferry_scatter_entry), w->tab_pinned[i]);
    ferry_worker_free_host(w->in_buf, w->in_cap, w->in_pinned);
    ferry_worker_free_host(w->dec_buf, w->dec_cap, w->dec_pinned);
    ferry_worker_idle(w);
    ferry_decode_scratch_free(&w->scratch);
    free(w->pending);
    memset(w, 0, sizeof *w);
}

/* How a pool worker waits for a staging buffer's copies: spinning in
 * cuEventSynchronize (the context's default, what ferry has always done), or,
 * with FERRY_EVENT_SYNC=blocking, sleeping on events made with
 * CU_EVENT_BLOCKING_SYNC, which leaves the core to the workers still reading
 * (16 spinning waiters on 16 cores compete with the preads they wait for).
 * Callers' threads (small reads) always spin: their latency is the point.
 * An experiment (bench/bench_records.py runs both); the default changes only
 * with its numbers. */
static int blocking_events(ferry_ctx *ctx) {
    int x = atomic_load(&ctx->event_sync);   /* read once per context: 0 not yet, 1 spin, 2 blocking */
    if (!x) {
        const char *e = ferry_knob(ctx, "FERRY_EVENT_SYNC");
        x = e && !strcmp(e, "blocking") ? 2 : 1;
        atomic_store(&ctx->event_sync, x);
    }
    return x == 2;
}

/* The worker's stream and events on device d (created once). */
int ferry_worker_device(ferry_worker *w, int d, ferry_devstate **out) {
    int rc = ferry_cuda_use_device(d);
    if (rc < 0) return rc;
    ferry_devstate *s = &w->dev[d];
    if (!s->ready) {
        const ferry_cuda_api *cu = ferry_cuda_load(NULL);
        CUresult r = cu->StreamCreate(&s->stream, FERRY_CU_STREAM_NON_BLOCKING);
        unsigned ef = FERRY_CU_EVENT_DISABLE_TIMING | (!w->is_inline && blocking_events(w->ctx) ? FERRY_CU_EVENT_BLOCKING_SYNC : 0);
        for (int i = 0; r == 0 && i < FERRY_MAX_STAGING; i++) r = cu->EventCreate(&s->ev[i], ef);
        if (r == 0) r = cu->EventCreate(&s->dec_ev, ef);
        if (r != 0) return ferry_seterr(FERRY_ECUDA, "device %d: creating stream/events: %s", d, ferry_cuda_errstr(r));
        s->ready = 1;
    }
    *out = s;
    return 0;
}

static void finish_completed(ferry_worker *w) {
    size_t k = 0;
    for (size_t i = 0; i < w->npending; i++) {
        ferry_pending *p = &w->pending[i];
        if (w->done_seq[p->dev] >= p->seq) ferry_task_finished(p->job);
        else w->pending[k++] = *p;
    }
    w->npending = k;
}

/* Note that everything enqueued on device d up to seq is complete. */
void ferry_worker_completed(ferry_worker *w, int d, uint64_t seq) {
    if (seq > w->done_seq[d]) w->done_seq[d] = seq;
    finish_completed(w);
}

/* The task's device work ends at w->seq[d]; it completes when that does. */
int ferry_worker_defer(ferry_worker *w, ferry_job *job, int d) {
    if (w->npending == w->cap_pending) {
        size_t nc = w->cap_pending ? w->cap_pending * 2 : 32;
        ferry_pending *p = realloc(w->pending, nc * sizeof *p);
        if (!p) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        w->pending = p;
        w->cap_pending = nc;
    }
    w->pending[w->npending++] = (ferry_pending){job, w->seq[d], d};
    return 0;
}

/* Complete, without waiting, the pending tasks whose copies have passed:
 * called between tasks. A deferred task used to complete only when its
 * worker waited for that staging buffer again (staging_count packs later) or
 * ran out of work, so with a queue that never empties a batch's job was done
 * only once the worker had read most of the next batch — two batches in
 * flight behaved like one. cuEventQuery of the newest event first: a stream
 * runs in order, so the newest one passed completes everything before it. */
int ferry_worker_poll(ferry_worker *w) {
    if (!w->npending) return 0;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    if (!cu || !cu->EventQuery) return -1;
    int failed = 0;
    for (int d = 0; d < FERRY_MAX_DEVICES; d++) {
        if (!w->dev[d].ready || w->done_seq[d] >= w->seq[d]) continue;
        CUevent ev[FERRY_MAX_STAGING + 1];
        uint64_t sq[FERRY_MAX_STAGING + 1];
        int n = 0;
        for (int i = 0; i < FERRY_MAX_STAGING; i++)
            if (w->stage_dev[i] == d && w->stage_seq[i] > w->done_seq[d]) { ev[n] = w->dev[d].ev[i]; sq[n++] = w->stage_seq[i]; }
        if (w->dec_dev == d && w->dec_seq > w->done_seq[d]) { ev[n] = w->dev[d].dec_ev; sq[n++] = w->dec_seq; }
        for (int a = 1; a < n; a++)   /* newest first */
            for (int b = a; b > 0 && sq[b] > sq[b - 1]; b--) {
                CUevent te = ev[b]; ev[b] = ev[b - 1]; ev[b - 1] = te;
                uint64_t ts = sq[b]; sq[b] = sq[b - 1]; sq[b - 1] = ts;
            }
        /* work enqueued after the newest event (a byteswap kernel after its
         * copies, exec.c) is complete only when a drain says so */
        if (n == 0 || sq[0] < w->seq[d]) failed = 1;
        if (n && ferry_cuda_use_device(d) < 0) { ferry_clearerr(); continue; }
        for (int k = 0; k < n; k++) {
            CUresult r = cu->EventQuery(ev[k]);
            if (r == 0) { ferry_worker_completed(w, d, sq[k]); break; }
            if (r != FERRY_CUDA_ERROR_NOT_READY) { failed = 1; break; }   /* a failed copy: a drain reports it */
        }
    }
    return failed ? -1 : 0;   /* -1: an event failed, or no event covers the last work */
}

/* FERRY_EVENT_SYNC=blocking: waits sleep (blocking_events above). */
int ferry_worker_blocking_waits(const ferry_worker *w) { return blocking_events(w->ctx); }

/* Nothing to claim but copies in flight: watch them and the queue together,
 * polling the events every few microseconds, and return as soon as they have
 * passed or new work is queued (*gen moves). An idle worker used to drain
 * (cuStreamSynchronize) first: with the copy engine behind by a batch, it
 * took no task of the next batch until its copies, queued behind everyone's,
 * had run, so reading and copying took turns instead of overlapping. A
 * failed copy (or no cuEventQuery, or device work after the newest event)
 * is left to the drain, which reports it (or waits for the stream). */
void ferry_worker_wait_copies(ferry_worker *w, _Atomic unsigned *gen, unsigned seen) {
    while (w->npending) {
        if (ferry_worker_poll(w) < 0) { ferry_worker_drain(w); return; }
        if (!w->npending) return;
        /* yield, not spin: on a core of its own it returns at once, where
         * the cores are fewer than the threads (or a stream's own threads, as
         * on the stand-in driver) it leaves the core to the readers */
        double until = ferry_now() + 4e-6;
        for (int k = 0; atomic_load(gen) == seen; k++) {
            if (k & 1) sched_yield(); else cpu_relax_();
            if (ferry_now() > until) break;
        }
        if (atomic_load(gen) != seen) return;
    }
}

void ferry_worker_idle(ferry_worker *w) {
    if (w->pathfile_entry) ferry_fcache_put(&w->ctx->files, w->pathfile_entry);
    w->pathfile_entry = NULL;
    w->pathfile = NULL;
}

void ferry_worker_drain(ferry_worker *w) {
    if (!w->npending) return;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    for (int d = 0; d < FERRY_MAX_DEVICES; d++) {
        if (!w->dev[d].ready || w->done_seq[d] >= w->seq[d]) continue;
        ferry_cuda_use_device(d);
        CUresult r = cu->StreamSynchronize(w->dev[d].stream);
        if (r != 0) {
            ferry_seterr(FERRY_ECUDA, "device %d: copies failed: %s", d, ferry_cuda_errstr(r));
            for (size_t i = 0; i < w->npending; i++)
                if (w->pending[i].dev == d) ferry_job_fail(w->pending[i].job, FERRY_ECUDA);
        }
        w->done_seq[d] = w->seq[d];
    }
    finish_completed(w);
}

