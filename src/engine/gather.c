/* gather.c — a batch of small records into one device buffer (the rows of a
 * batch tensor, a dataset's token windows): the workers read the records
 * straight into a pinned image of the destination, at the records' own
 * places, as they would into host memory; the worker whose task reads last
 * sends the image in one cuMemcpyHtoDAsync per contiguous destination run —
 * one copy for a batch, whatever the order of its rows.
 *
 * Why: packed staging (pack.c) sends every task's staging buffer by itself,
 * and a batch's tasks are small so that every worker gets some (256 x 8 KiB is
 * 32 tasks of 64 KiB: 32 copies per batch). That ran 8.7 GB/s to the device
 * against 23.6 into host batches of the same records, 10.6 CPU us
 * a record against 4.4: the copies of 16 workers' streams queue on the copy
 * engine at a fixed cost each, and each worker has three staging buffers in
 * flight before it waits. The pinned gathering that ArrayDataset did in
 * Python (34.9 GB/s at 150 KB rows against the engine's 16.8) is this; here
 * it serves every reader. The copy starts only once the batch is read; with
 * two batches in flight the next batch is read meanwhile.
 *
 * The images come from a pool in the context (pinned allocation costs
 * milliseconds): best fit, at most GATHER_SLOTS of them and GATHER_POOL_MAX
 * bytes in all; a job that finds none free runs as packs. FERRY_GATHER=off
 * turns it off (an experiment beside packs); a size sets the
 * largest destination span gathered (default 64M). */
#include "engine/engine.h"
#include "engine/knobs.h"
#include "engine/gather.h"
#include "engine/gpudecode.h"
#include <stdlib.h>

#define GATHER_SLOTS 16
#define GATHER_POOL_MAX (1ull << 30)
#define GATHER_MAX_RUNS 64          /* more runs: packs and the scatter kernel */
#define GATHER_ROUND (2ull << 20)   /* images are rounded up so batches of nearby sizes share them */
/* Records up to this size (on average, as the plan listed them) are gathered; larger
 * ones already make copies big enough per pack task: ArrayDataset's shuffled
 * 150,528-byte rows (38.5 MB batches) ran 19.6 GB/s gathered against 48.2 as packs,
 * while 8 KiB records scattered over a batch ran 27.8 gathered against 9.7 as packs
 * (ferry bench --records, depth 5). The plan's records, not the job's extents: job.c
 * merges records adjacent in the file and in the batch (rows in blocks, block_size=16),
 * and one merged 128 KiB extent sent a batch of 8 KiB rows through packs whole. */
#define GATHER_MAX_EXTENT (64u << 10)

typedef struct gather_slot { uint8_t *p; size_t size; int dev; int busy; } gather_slot;

struct ferry_gather_pool {
    pthread_mutex_t mu;
    uint64_t limit;                /* largest span gathered, 0: off */
    char bad[64];                  /* a FERRY_GATHER that is no size, or "" */
    _Atomic uint64_t n_jobs, n_copies, n_no_image, n_tasks, n_span, n_image;   /* ferry_gather_counts */
    size_t total;                  /* bytes allocated */
    gather_slot s[GATHER_SLOTS];
};

typedef struct gather_run { uint64_t off, len; } gather_run;

struct ferry_gather {
    uint8_t *img;                  /* pinned; img[0] is the destination's byte `lo` */
    int slot, dev;
    uint64_t lo;
    CUdeviceptr base;              /* device address of destination byte lo */
    _Atomic size_t left;           /* tasks still to read */
    uint32_t nruns;
    gather_run runs[GATHER_MAX_RUNS];   /* offsets from lo */
};

/* FERRY_GATHER, read when the context is made (a getenv per plan costs; a
 * bad value fails every plan that could gather, naming it). */
static void parse_limit(ferry_gather_pool *p, const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GATHER");
    p->limit = 64u << 20;
    if (!s || !strcmp(s, "auto")) return;
    if (!strcmp(s, "off") || !strcmp(s, "0")) { p->limit = 0; return; }
    int64_t x = ferry_knob_bytes(s);
    if (x >= 4096 && (uint64_t)x <= GATHER_POOL_MAX / 2) { p->limit = (uint64_t)x; return; }
    p->limit = 0;
    snprintf(p->bad, sizeof p->bad, "%s", s);
}

ferry_gather_pool *ferry_gather_pool_new(const ferry_ctx *ctx) {
    ferry_gather_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    parse_limit(p, ctx);
    return p;
}

static void free_image(gather_slot *s) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    if (s->p && cu) {
        CUcontext saved = ferry_cuda_current();
        if (ferry_cuda_use_device(s->dev) == 0) cu->MemFreeHost(s->p);
        ferry_clearerr();
        ferry_cuda_restore(saved);
    }
    memset(s, 0, sizeof *s);
}

void ferry_gather_pool_free(ferry_gather_pool *p) {
    if (!p) return;
    for (int i = 0; i < GATHER_SLOTS; i++) free_image(&p->s[i]);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* A free image of at least n bytes pinned for device d, or -1 (mu held). */
static int image_get(ferry_gather_pool *p, int d, size_t n) {
    int best = -1;
    for (int i = 0; i < GATHER_SLOTS; i++) {
        gather_slot *s = &p->s[i];
        if (s->p && !s->busy && s->dev == d && s->size >= n && (best < 0 || s->size < p->s[best].size)) best = i;
    }
    if (best >= 0) { p->s[best].busy = 1; return best; }
    size_t want = (n + GATHER_ROUND - 1) / GATHER_ROUND * GATHER_ROUND;
    /* room: drop idle images (smallest first would keep the large; any will do) */
    int empty = -1;
    for (int i = 0; i < GATHER_SLOTS; i++) if (!p->s[i].p) { empty = i; break; }
    for (int i = 0; i < GATHER_SLOTS && (empty < 0 || p->total + want > GATHER_POOL_MAX); i++) {
        gather_slot *s = &p->s[i];
        if (!s->p || s->busy) continue;
        p->total -= s->size;
        free_image(s);
        if (empty < 0) empty = i;
    }
    if (empty < 0 || p->total + want > GATHER_POOL_MAX) return -1;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    if (!cu) return -1;
    CUcontext saved = ferry_cuda_current();   /* the caller's thread: its context back */
    void *m = NULL;
    int ok = ferry_cuda_use_device(d) == 0 && cu->MemHostAlloc(&m, want, FERRY_CU_MEMHOSTALLOC_PORTABLE) == 0;
    ferry_clearerr();
    ferry_cuda_restore(saved);
    if (!ok) return -1;   /* no pinned memory (the locked-memory limit): packs do without */
    p->s[empty] = (gather_slot){m, want, d, 1};
    p->total += want;
    return empty;
}

static int cmp_run(const void *a, const void *b) {
    const gather_run *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int gatherable(const ferry_job *j, const ferry_extent *e, const ferry_extent *e0) {
    if (e->kind != FERRY_EXTENT_READ || e->place || e->ncodecs || e->length == 0) return 0;
    if (e->flags & ~(unsigned)FERRY_EXTENT_NOFOLLOW) return 0;   /* MISSING_FILLS: per extent (exec.c) */
    if (j->direct == FERRY_DIRECT_ON) return 0;
    return e->dst.kind == FERRY_MEM_CUDA && e->dst.ptr == e0->dst.ptr && e->dst.device == e0->dst.device;
}

int ferry_gather_plan(ferry_job *j) {
    ferry_gather_pool *p = j->ctx->gather_pool;
    if (!p || j->next < 2 || j->ntasks < 1 || ferry_gpudecode_tasks(j)) return 0;
    const ferry_extent *e0 = &j->ext[0];
    if (e0->dst.kind != FERRY_MEM_CUDA) return 0;
    if (p->bad[0]) return ferry_seterr(FERRY_EINVAL, "FERRY_GATHER=\"%s\": off, auto or a size from 4K to 512M", p->bad);
    uint64_t limit = p->limit;
    if (limit == 0) return 0;
    uint64_t lo = UINT64_MAX, hi = 0, total = 0;
    int sorted = 1;   /* rows in order: no sort (a 4096-window plan is ~0.2 ms of qsort) */
    for (size_t i = 0; i < j->next; i++) {
        const ferry_extent *e = &j->ext[i];
        if (!gatherable(j, e, e0)) return 0;
        if (i && e->dst_offset < j->ext[i - 1].dst_offset) sorted = 0;
        if (e->dst_offset < lo) lo = e->dst_offset;
        if (e->dst_offset + e->length > hi) hi = e->dst_offset + e->length;
        total += e->length;
    }
    if (total > (uint64_t)GATHER_MAX_EXTENT * (j->plan_records ? j->plan_records : 1)) return 0;
    /* every task whole extents (packable ones are never cut: they are below task_size) */
    for (size_t t = 0; t < j->ntasks; t++)
        if (j->tasks[t].ext >= j->next || (j->tasks[t].n == 1 && (j->tasks[t].lo != 0 || j->tasks[t].hi != j->ext[j->tasks[t].ext].length)))
            return 0;
    /* a sparse destination would pin (and read back nothing of) its holes */
    if (hi - lo > limit || hi - lo > 2 * total + (1u << 20)) return 0;
    gather_run *r = malloc(j->next * sizeof *r);
    if (!r) return 0;
    for (size_t i = 0; i < j->next; i++) r[i] = (gather_run){j->ext[i].dst_offset - lo, j->ext[i].length};
    if (!sorted) qsort(r, j->next, sizeof *r, cmp_run);
    size_t nr = 0;   /* the union of the destinations: every byte in it is some record's */
    for (size_t i = 0; i < j->next; i++) {
        if (nr && r[i].off <= r[nr - 1].off + r[nr - 1].len) {
            uint64_t end = r[i].off + r[i].len;
            if (end > r[nr - 1].off + r[nr - 1].len) r[nr - 1].len = end - r[nr - 1].off;
        } else r[nr++] = r[i];
    }
    struct ferry_gather *g = nr <= GATHER_MAX_RUNS ? calloc(1, sizeof *g) : NULL;
    if (!g) { free(r); return 0; }
    memcpy(g->runs, r, nr * sizeof *r);
    g->nruns = (uint32_t)nr;
    free(r);
    pthread_mutex_lock(&p->mu);
    g->slot = image_get(p, e0->dst.device, hi - lo);
    size_t img_size = 0;
    if (g->slot >= 0) { g->img = p->s[g->slot].p; img_size = p->s[g->slot].size; }
    pthread_mutex_unlock(&p->mu);
    if (g->slot < 0) { atomic_fetch_add(&p->n_no_image, 1); free(g); return 0; }
    atomic_fetch_add(&p->n_jobs, 1);
    atomic_fetch_add(&p->n_tasks, j->ntasks);
    atomic_fetch_add(&p->n_span, hi - lo);
    atomic_fetch_add(&p->n_image, img_size);
    g->dev = e0->dst.device;
    g->lo = lo;
    g->base = (CUdeviceptr)(uintptr_t)e0->dst.ptr + lo;
    atomic_store(&g->left, j->ntasks);
    j->gather = g;
    return 0;
}

void ferry_gather_release(ferry_job *j) {
    struct ferry_gather *g = j->gather;
    if (!g) return;
    ferry_gather_pool *p = j->ctx->gather_pool;
    pthread_mutex_lock(&p->mu);
    p->s[g->slot].busy = 0;
    pthread_mutex_unlock(&p->mu);
    free(g);
    j->gather = NULL;
}

/* The image to the device: one copy per run, on the worker's stream, its
 * event the worker's decode event (exec.c waits for that one before it
 * reuses its decode buffers; a stream runs in order, so recording it again
 * on the same device covers the earlier copies too). */
static int gather_send(ferry_worker *w, ferry_job *j, struct ferry_gather *g, int *deferred) {
    int d = g->dev, rc;
    if (w->dec_dev >= 0 && w->dec_dev != d && (rc = ferry_dec_wait(w)) < 0) return rc;   /* another device's */
    ferry_devstate *ds;
    if ((rc = ferry_worker_device(w, d, &ds)) < 0) return rc;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    CUresult e = 0;
    for (uint32_t k = 0; k < g->nruns && !e; k++)
        e = cu->MemcpyHtoDAsync(g->base + g->runs[k].off, g->img + g->runs[k].off, g->runs[k].len, ds->stream);
    if (!e) e = cu->EventRecord(ds->dec_ev, ds->stream);
    if (e) return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(e));
    atomic_fetch_add(&j->ctx->gather_pool->n_copies, g->nruns);
    w->seq[d]++;
    w->dec_seq = w->seq[d];
    w->dec_dev = d;
    ferry_mark_device(w, j, d);
    if ((rc = ferry_worker_defer(w, j, d)) < 0) return rc;
    *deferred = 1;
    return 0;
}

int64_t ferry_exec_gather(ferry_worker *w, ferry_job *j, const ferry_task *t, int *deferred) {
    struct ferry_gather *g = j->gather;
    int64_t r = ferry_pack_read(w, j, t, g->img, g->lo);
    if (r < 0) ferry_job_fail(j, (int)r);
    else {
        atomic_fetch_add(&j->path_bytes[FERRY_PATH_STAGED], (uint64_t)r);
        atomic_fetch_add(&j->path_ops[FERRY_PATH_STAGED], 1);
    }
    /* the last reader sends: every other task's records are in the image then
     * (the decrement orders their writes before this one's copies) */
    if (atomic_fetch_sub(&g->left, 1) == 1 && !atomic_load(&j->error) && !atomic_load(&j->canceled)) {
        int rc = gather_send(w, j, g, deferred);
        if (rc < 0) {
            ferry_preerr(rc, "device %d: gathered batch", g->dev);
            ferry_job_fail(j, rc);
            if (r >= 0) r = rc;
        }
    }
    return r;
}

void ferry_gather_counts(ferry_ctx *ctx, ferry_gather_stats *out) {
    ferry_gather_pool *p = ctx->gather_pool;
    memset(out, 0, sizeof *out);
    if (!p) return;
    out->jobs = atomic_load(&p->n_jobs);
    out->copies = atomic_load(&p->n_copies);
    out->no_image = atomic_load(&p->n_no_image);
    out->tasks = atomic_load(&p->n_tasks);
    out->span_bytes = atomic_load(&p->n_span);
    out->image_bytes = atomic_load(&p->n_image);
}
