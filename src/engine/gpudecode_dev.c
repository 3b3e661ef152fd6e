/* gpudecode_dev.c — the GPU decode stage's memory: each feeder's slots,
 * device buffers and pinned ring (up_copy), and the context's pool of slot
 * sets that cooperative calls reuse job after job. */
#include "engine/gpudecode_impl.h"

static size_t pool_trim(ferry_ctx *ctx, int dev);
static int pool_first_coop_job(ferry_ctx *ctx);

int ferry_gpudecode_dev_free(int dev, uint64_t *free_b) {
    size_t f, total;
    *free_b = 0;
    if (!gd_dev_mem(dev, &f, &total)) return 0;
    *free_b = f;
    return 1;
}

size_t ferry_gpudecode_give_back(ferry_ctx *ctx, int dev) { return pool_trim(ctx, dev); }

static void slot_free(const ferry_cuda_api *cu, gd_slot *g) {
    if (g->done) { cu->EventSynchronize(g->done); cu->EventDestroy(g->done); }
    if (g->dec) cu->EventDestroy(g->dec);
    if (g->stream) { cu->StreamSynchronize(g->stream); cu->StreamDestroy(g->stream); }
    if (g->din) cu->MemFree(g->din);
    if (g->dres) cu->MemFree(g->dres);
    if (g->dtemp) cu->MemFree(g->dtemp);
    if (g->dscr) cu->MemFree(g->dscr);
    if (g->darr) cu->MemFree(g->darr);
    /* from ferry_worker_grow: plain ones may be mmapped (hostmem.c), not malloc'd */
    ferry_worker_free_host(g->h, g->hcap, g->hpinned);
    ferry_worker_free_host(g->hres, g->hres_cap, g->hres_pinned);
    ferry_worker_free_host(g->hcpu, g->hcpu_cap, g->hcpu_pinned);
    free(g->ch); free(g->it); free(g->cp); free(g->un); free(g->bu);
}

void ferry_gpudecode_worker_free(ferry_worker *w) {
    struct ferry_gpudecode_worker *gw = w->gpu;
    if (!gw) return;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    for (int d = 0; d < FERRY_MAX_DEVICES; d++) {
        gd_dev *g = &gw->dev[d];
        int used = g->hfb != NULL;
        for (int s = 0; s < GD_MAX_SLOTS; s++) used |= g->sl[s].stream || g->sl[s].h || g->sl[s].ch || g->sl[s].it;
        gd_ring *R = &gw->ring[d];
        used |= R->b[0] || R->b[1] || R->ev[0] || R->ev[1];
        if (!cu || !used) continue;
        ferry_cuda_use_device(d);
        for (int s = 0; s < GD_MAX_SLOTS; s++) slot_free(cu, &g->sl[s]);
        ferry_worker_free_host(g->hfb, g->hfb_cap, g->hfb_pinned);
        for (int i = 0; i < 2; i++) {
            if (R->ev[i]) { cu->EventSynchronize(R->ev[i]); cu->EventDestroy(R->ev[i]); }
            ferry_worker_free_host(R->b[i], R->cap[i], R->pinned[i]);
        }
    }
    free(gw->bs);
    free(gw);
    w->gpu = NULL;
}

/* The trace of the batch this thread runs (allocations are counted into it), or NULL. */
_Thread_local ferry_decode_trace *gd_tl_trace;
/* The context of the job the calling feeder runs (set with gd_tl_trace): an
 * allocation that finds the device full gives back the context's idle call
 * slots first (pool_trim), as a caching allocator does. */
_Thread_local ferry_ctx *gd_tl_ctx;

/* Device memory of at least n bytes (contents not kept) on device dev,
 * which is current. dev_grow doubles (per-feeder batches vary in size); dev_fit takes
 * n rounded up to 2 MiB (to 64 KiB up to 1 MiB): a call slot is grown once to the job's largest
 * call, and doubling a 128 MiB call's payloads (plus its arrays) made 256 MiB
 * per slot, 8 slots each of payloads and of nvCOMP's temp space. */
static int dev_alloc(int dev, CUdeviceptr *p, size_t *cap, size_t n, int fit) {
    if (*cap >= n && *p) return 0;
    uint64_t t0 = gd_tl_trace ? ferry_dt_now() : 0;
    if (gd_tl_trace) atomic_fetch_add(&gd_tl_trace->allocs, 1);
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    size_t nc = *cap ? *cap : (1u << 20);
    /* fit: small buffers (a call's arrays and results, kilobytes) in 64 KiB steps, not a whole MiB each */
    if (fit) nc = n <= (1u << 20) ? (n + ((size_t)64 << 10) - 1) & ~(((size_t)64 << 10) - 1)
                                  : (n + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    while (nc < n) nc *= 2;
    if (*p) cu->MemFree(*p);
    *p = 0; *cap = 0;
    CUresult r = cu->MemAlloc(p, nc);
    /* full: the idle sets other jobs left (the pool counts them as room for
     * this job's calls, dev_room) go back to the driver, and one more try —
     * also when none were left: another feeder's trim, waited for, may just
     * have freed them (a stand-in test failed one run in a few without).
     * A model that leaves little free: XarrayDataset over Zarr zstd in 256
     * MiB free on the GPU machine failed here beside earlier jobs' idle sets. */
    if (r == FERRY_CU_ERROR_OUT_OF_MEMORY && gd_tl_ctx) {
        pool_trim(gd_tl_ctx, dev);
        r = cu->MemAlloc(p, nc);
    }
    if (r) {
        *p = 0;
        size_t fr = 0, tot = 0;
        (void)gd_dev_mem(dev, &fr, &tot);
        return ferry_seterr(FERRY_ENOMEM,
                            "GPU decode: cuMemAlloc(%zu) on device %d: %s (%zu MiB free): a job's calls need device memory "
                            "of about 5 x their decoded bytes; lower it with smaller jobs (fewer batches a read), "
                            "FERRY_GPU_SLOTS=1, or decode on the CPU (decode=\"cpu\", FERRY_DECODE=cpu)",
                            nc, dev, ferry_cuda_errstr(r), fr >> 20);
    }
    *cap = nc;
    ferry_dt_lap(gd_tl_trace, FERRY_DT_ALLOC, &t0);
    return 0;
}
int gd_dev_grow(int dev, CUdeviceptr *p, size_t *cap, size_t n) { return dev_alloc(dev, p, cap, n, 0); }
int gd_dev_fit(int dev, CUdeviceptr *p, size_t *cap, size_t n) { return dev_alloc(dev, p, cap, n, 1); }

/* ferry_worker_grow (per worker, reused: it allocates only to grow), timed for the trace. */
int gd_host_grow(ferry_worker *w, int d, uint8_t **buf, size_t *cap, int *pinned, size_t n) {
    if (!gd_tl_trace || (*cap >= n && *buf && *pinned)) return ferry_worker_grow(w, d, buf, cap, pinned, n);
    uint64_t t0 = ferry_dt_now();
    uint8_t *before = *buf;
    int rc = ferry_worker_grow(w, d, buf, cap, pinned, n);
    if (*buf != before) { atomic_fetch_add(&gd_tl_trace->allocs, 1); ferry_dt_lap(gd_tl_trace, FERRY_DT_ALLOC, &t0); }
    return rc;
}

/* FERRY_GPU_STAGE: "calls" (the default), "ring" or "auto". The context's call slots
 * (cooperative calls) hold a whole call's compressed bytes on the host for
 * the CPU's framing checks and fallbacks. "calls" pins them: the first job of
 * a context pins its largest call x 8 slots (a 4 GiB job of 1 MiB chunks:
 * 8 x 256 MiB, ~0.6 s of cuMemHostAlloc on the GPU machine, and 2 GiB pinned for as
 * long as the context lives). "ring": plain memory (an mmap, its pages
 * faulted in by the readers), and every piece goes up through its feeder's
 * ring of two pinned buffers of FERRY_GPU_RING bytes (default 8 MiB): the
 * pinned memory is feeders x 2 x 8 MiB whatever the job, at the price of one
 * memcpy of each piece into the ring. Measured on the GPU machine (BENCHMARKS.md, D4;
 * Zarr v3 zstd-0, 1 MiB chunks, bench_decode --only first): warm jobs
 * calls 25.2 / 36.4 GB/s (1 / 4 GiB) against ring 21.1 / 26.7 (the extra
 * memcpy, on a job that is read-bound); the first job of a process calls
 * 1.2 / 3.4 against ring 2.6 / 7.7. "auto": the first cooperative job of a
 * context runs with the ring, later ones pin their calls — a process that
 * loads once would get the ring's first job (2.2 x the calls' on those rows),
 * one that loads again pays the calls' pinning once, on its second job
 * instead of its first. Not the default until a GPU run measures it
 * (bench_decode.py --only first has its rows): a "best of two" loop would
 * then time a ring job and a pinning one, no warm job. */
int gd_stage_ring(ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_STAGE");
    if (s && strcasecmp(s, "ring") == 0) return 1;
    if (s && strcasecmp(s, "auto") == 0) return pool_first_coop_job(ctx);
    return 0;
}
/* n bytes of slot g's host memory at src up to dst on stream s, which is
 * current (the device too): straight from src when it is pinned staging,
 * else through the calling worker's ring (src may be reused on return). */
int gd_up_copy(ferry_worker *w, gd_slot *g, CUdeviceptr dst, const uint8_t *src, size_t n, CUstream s) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    CUresult r;
    if (!g->hplain) {
        if ((r = cu->MemcpyHtoDAsync(dst, src, n, s))) return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(r));
        return 0;
    }
    gd_ring *R = &w->gpu->ring[g->dev];
    const size_t piece = gd_ring_piece(w->ctx);
    while (n) {
        size_t k = n < piece ? n : piece;
        int i = R->next, rc;
        R->next ^= 1;
        if (!R->ev[i] && (r = cu->EventCreate(&R->ev[i], FERRY_CU_EVENT_DISABLE_TIMING)))
            return ferry_seterr(FERRY_ECUDA, "device %d: GPU decode ring event: %s", g->dev, ferry_cuda_errstr(r));
        if (R->used[i]) {   /* its last copy up must be done before it is refilled */
            if ((r = cu->EventSynchronize(R->ev[i]))) return ferry_seterr(FERRY_ECUDA, "device %d: GPU decode failed: %s", g->dev, ferry_cuda_errstr(r));
            R->used[i] = 0;
        }
        if ((rc = gd_host_grow(w, g->dev, &R->b[i], &R->cap[i], &R->pinned[i], piece)) < 0) return rc;
        memcpy(R->b[i], src, k);
        if ((r = cu->MemcpyHtoDAsync(dst, R->b[i], k, s)) || (r = cu->EventRecord(R->ev[i], s)))
            return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(r));
        R->used[i] = 1;
        src += k; dst += k; n -= k;
    }
    return 0;
}

/* Room for one more element in a growing array. */
int gd_push(void **arr, size_t *n, size_t *cap, size_t size) {
    if (*n < *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 256;
    void *p = realloc(*arr, nc * size);
    if (!p) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    *arr = p;
    *cap = nc;
    return 0;
}


/* ---- cooperative batches: slots per context, calls read by every feeder ---------- */
/* A device's set of slots for cooperative calls: a job takes one per device
 * from the context's pool while it runs and gives it back at its end, so
 * the pinned staging, device buffers and nvCOMP temp space are allocated by
 * the first GPU-decode job of a context (each slot grown once to the job's
 * largest call) and reused by every later one. Jobs that run at once (a
 * dataset's prefetched batches) take a set each: the pool keeps up to
 * POOL_SETS idle sets per device while their bytes stay within POOL_BYTES
 * (FERRY_GPU_POOL, a size, replaces it) or twice its largest idle set's,
 * whichever is more, so that a stream of jobs two at a time (a dataset's
 * reads) keeps both of its sets, also beside a larger set an earlier
 * .load() left. A flat 6 GiB freed one of a dataset's two sets (jobs of 2.5
 * GiB) at every job's end and allocated it again (48 allocations, 1.1-1.5 s)
 * at the next (GPU machine, XarrayDataset over netCDF-4, 16 batches a read: 9.9
 * GB/s; 18.9 with a 32 GiB cap); twice the returning set's freed the
 * .load()'s set at each epoch's end, and an allocation followed in the next
 * (9.8-10.0). One set per device always stays. */
ferry_gpudecode_pool *ferry_gpudecode_pool_new(void) {
    ferry_gpudecode_pool *p = calloc(1, sizeof *p);
    if (p) { pthread_mutex_init(&p->mu, NULL); pthread_mutex_init(&p->trim_mu, NULL); }
    return p;
}

static uint64_t set_bytes(const gd_cset *set) {
    uint64_t b = 0;
    for (int k = 0; k < GD_MAX_SLOTS; k++) {
        const gd_slot *g = &set->sl[k];
        b += g->hcap + g->hres_cap + g->hcpu_cap + g->din_cap + g->dres_cap + g->dtemp_cap + g->dscr_cap + g->darr_cap;
    }
    return b;
}

/* 1 for the context's first cooperative job (counted at its plan), else 0 */
static int pool_first_coop_job(ferry_ctx *ctx) {
    ferry_gpudecode_pool *p = ctx ? ctx->gpu_pool : NULL;
    return p ? atomic_fetch_add(&p->coop_jobs, 1) == 0 : 0;
}

uint64_t gd_pool_idle_bytes(ferry_ctx *ctx, int dev) {
    ferry_gpudecode_pool *p = ctx ? ctx->gpu_pool : NULL;
    uint64_t b = 0;
    if (!p) return 0;
    pthread_mutex_lock(&p->mu);
    for (gd_cset *x = p->idle; x; x = x->next)
        if (x->dev == dev) b += set_bytes(x);
    pthread_mutex_unlock(&p->mu);
    return b;
}

/* Wait for everything queued on the set's streams (the device's context
 * made current for it). Errors are the job's to report, not here: the
 * thread's message (the job's own error, for the caller) is left as it is. */
void gd_set_sync(gd_cset *set) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    if (!cu) return;
    CUcontext saved = ferry_cuda_current();
    if (ferry_cuda_use_device(set->dev) == 0)
        for (int k = 0; k < GD_MAX_SLOTS; k++)
            if (set->sl[k].stream) cu->StreamSynchronize(set->sl[k].stream);
    ferry_cuda_restore(saved);
}

static void set_free(gd_cset *set) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    if (cu) {
        CUcontext saved = ferry_cuda_current();
        if (ferry_cuda_use_device(set->dev) == 0)
            for (int k = 0; k < GD_MAX_SLOTS; k++) slot_free(cu, &set->sl[k]);
        ferry_clearerr();
        ferry_cuda_restore(saved);
    }
    free(set);
}

/* Every idle set of device dev in the context's pool freed (their streams
 * are idle: a set is returned only once its job is complete; other devices'
 * sets stay); the number freed. A call made while another trims returns
 * once that one's sets are freed. */
static size_t pool_trim(ferry_ctx *ctx, int dev) {
    ferry_gpudecode_pool *p = ctx ? ctx->gpu_pool : NULL;
    if (!p) return 0;
    pthread_mutex_lock(&p->trim_mu);
    pthread_mutex_lock(&p->mu);
    gd_cset *drop = NULL;
    for (gd_cset **pp = &p->idle; *pp;) {
        gd_cset *x = *pp;
        if (x->dev != dev) { pp = &x->next; continue; }
        *pp = x->next;
        x->next = drop;
        drop = x;
    }
    pthread_mutex_unlock(&p->mu);
    size_t n = 0;
    while (drop) { gd_cset *x = drop; drop = x->next; set_free(x); n++; }   /* outside mu: cuMemFree waits */
    pthread_mutex_unlock(&p->trim_mu);
    return n;
}

void ferry_gpudecode_pool_free(ferry_gpudecode_pool *p) {
    if (!p) return;
    while (p->idle) { gd_cset *s = p->idle; p->idle = s->next; set_free(s); }
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->trim_mu);
    free(p);
}

gd_cset *gd_set_acquire(ferry_ctx *ctx, int dev) {
    ferry_gpudecode_pool *p = ctx->gpu_pool;
    gd_cset *got = NULL;
    if (p) {   /* the largest idle set of the device: the likeliest to need no growth */
        pthread_mutex_lock(&p->mu);
        gd_cset **best = NULL;
        for (gd_cset **pp = &p->idle; *pp; pp = &(*pp)->next)
            if ((*pp)->dev == dev && (!best || set_bytes(*pp) > set_bytes(*best))) best = pp;
        if (best) { got = *best; *best = got->next; }
        pthread_mutex_unlock(&p->mu);
    }
    if (!got && (got = calloc(1, sizeof *got))) got->dev = dev;
    if (got) got->next = NULL;
    return got;
}

/* The job is complete (every feeder synchronized the set's streams). The set
 * just used goes back to the pool first (it is grown to the latest job's
 * calls, the likeliest to fit the next); idle sets of its device beyond
 * POOL_SETS, and then the smallest idle sets while the pool is over
 * pool_bytes, are freed — never the last one of a device. Freeing the
 * returning set instead (as before) made a pool of a few small sets (a
 * dataset's concurrent batches) cost a large job a full allocation each time
 * it ran: it took a small set, grew it, and had it freed at its end (GPU machine:
 * a 16 GiB Zarr zstd .load() at 10.7 GB/s, the CPU's rate, after netCDF-4
 * batches in the same process; 38.8 without them). */
void gd_set_release(ferry_ctx *ctx, gd_cset *set) {
    for (int k = 0; k < GD_MAX_SLOTS; k++) { set->sl[k].open = set->sl[k].flying = 0; set->sl[k].q = NULL; }
    ferry_gpudecode_pool *p = ctx ? ctx->gpu_pool : NULL;
    if (!p) { set_free(set); return; }
    gd_cset *drop = NULL;
    pthread_mutex_lock(&p->mu);
    set->next = p->idle;
    p->idle = set;
    uint64_t largest = 0;
    for (gd_cset *x = p->idle; x; x = x->next) largest = FERRY_MAX(largest, set_bytes(x));
    const uint64_t cap = gd_pool_bytes(ctx, largest);
    for (;;) {   /* evict one idle set at a time: the smallest of those that may go */
        int same = 0;
        uint64_t bytes = 0;
        for (gd_cset *x = p->idle; x; x = x->next) { same += x->dev == set->dev; bytes += set_bytes(x); }
        int over_count = same > POOL_SETS, over_bytes = bytes > cap;
        if (!over_count && !over_bytes) break;
        gd_cset **victim = NULL;
        for (gd_cset **pp = &p->idle; *pp; pp = &(*pp)->next) {
            gd_cset *x = *pp;
            if (x == set) continue;   /* the one just returned stays */
            if (over_count && x->dev != set->dev) continue;
            if (!over_count) {   /* over bytes: never a device's last set */
                int of_dev = 0;
                for (gd_cset *y = p->idle; y; y = y->next) of_dev += y->dev == x->dev;
                if (of_dev < 2) continue;
            }
            if (!victim || set_bytes(x) < set_bytes(*victim)) victim = pp;
        }
        if (!victim) break;
        gd_cset *x = *victim;
        *victim = x->next;
        x->next = drop;
        drop = x;
    }
    pthread_mutex_unlock(&p->mu);
    while (drop) { gd_cset *x = drop; drop = x->next; set_free(x); }   /* outside the lock: cuMemFree waits */
    /* a stream budgeted with ferry_plan_budget promised its caller keep_free
     * bytes of the device: idle sets are not kept below it (a model's next
     * allocation cannot take them back the way dev_alloc does). A GPU of 80 GB
     * ran out of memory in torch, allocating a dataset's next group beside
     * the idle sets of its earlier jobs. */
    const uint64_t keep = set->dev >= 0 && set->dev < FERRY_MAX_DEVICES ? atomic_load(&ctx->gpu_keep_free[set->dev]) : 0;
    uint64_t free_b;
    if (keep && ferry_gpudecode_dev_free(set->dev, &free_b) && free_b < keep) pool_trim(ctx, set->dev);
}
