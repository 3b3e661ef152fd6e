/* gpudecode.c — the device decode stage: compressed chunks bound for device
 * memory, decoded on the GPU by one batched nvCOMP call per batch. This file
 * is the feeders' run (cooperative calls, then per-feeder batches); the
 * stage's other jobs have a file each: knobs (gpudecode_knobs.c), which
 * chains and AUTO's rates (gpudecode_rates.c), queues and claims
 * (gpudecode_plan.c), slots, rings and the context's pool (gpudecode_dev.c),
 * one batch's launch and finish (gpudecode_batch.c).
 *
 * The plan puts the chunks the GPU may decode in queues, one per device and
 * class (codec). A GPU-only queue is cut into cooperative calls (gd_cbatch,
 * run_coop): a quarter of the queue each, 32 to 256 chunks, because nvCOMP
 * decodes a chunk per thread block and its rate is the chunks in flight;
 * every feeder reads pieces of the current call into that call's slot (the
 * context's, reused job after job) and copies its piece gd_up (through its own
 * small pinned ring: the slot's host bytes are plain memory, up_copy), the
 * reader of the last piece launches the call, up to four calls are in flight per device,
 * and a call is checked (finish_batch) by whoever next needs its slot or at
 * the end. The rest of this comment is the per-feeder batch, which a shared
 * queue uses, and whose steps the calls share.
 * Feeder tasks claim batches from them — runs of chunks from
 * the front of a queue — until they are empty; under AUTO a deflate queue is
 * shared: the other workers take one chunk at a time from it and decode it
 * on the CPU (exec.c), and a feeder claims only what the GPU finishes before
 * the CPU would (claim_batch). A batch is a run of chunks with one codec for
 * one device. The feeder that claims it reads every chunk's bytes into one
 * pinned buffer of one of its slots,
 * checks on the CPU what is cheap there (crc32c / fletcher32 over the encoded
 * bytes, the framing: frame headers, block walk, announced sizes, gzip ISIZE),
 * copies payloads and the pointer/size arrays to the device in one copy, and
 * enqueues one nvCOMP call whose outputs are the destination itself where a
 * chunk is one contiguous, aligned run of it, else device scratch. Then, on
 * the GPU, zlib's Adler-32 of every output; the per-chunk statuses, sizes and
 * checks come back in one copy. While the GPU works the worker decodes, on the
 * CPU, the chunks the GPU does not take (framing it cannot decode as one unit:
 * several frames, dictionaries, zstd content checksums; gzip, whose CRC-32 has
 * no GPU kernel yet; missing chunks become fills). A chunk nvCOMP fails or
 * whose check fails is decoded again on the CPU: if the CPU decodes it the
 * result is used and counted in ferry_stats.gpu_cpu_fallbacks, otherwise the
 * job fails naming the file, the chunk and the codec. Filters then run on the
 * GPU (unshuffle, byteswap) and scratch outputs are placed into the
 * destination by one tile-scatter kernel per batch (device copies where a
 * box has more than three dimensions of runs, or without the kernels).
 * Each slot has its own stream: a feeder keeps up to four batches in flight
 * and checks the oldest only when its slot comes round again (or at the
 * end), and all feeders run at once, so while batches decode others are
 * being read (the pipeline); nvCOMP decodes a chunk per thread block, so its
 * rate is the number of chunks in flight. A feeder's task ends when its
 * device work is complete. FERRY_DECODE_TRACE=1: per-stage times
 * (gpudecode_trace.c). */
#include "engine/gpudecode_impl.h"

/* The end of a step on call c run with mu dropped (its check, its layout):
 * mu taken again, c in `state`, the job failed on an error, the feeders
 * waiting on c woken. Returns rc. */
static int64_t cb_settle(struct ferry_gpudecode_job *G, gd_cbatch *c, int state, int64_t rc) {
    pthread_mutex_lock(&G->mu);
    c->state = state;
    if (rc < 0) G->failed = 1;
    pthread_cond_broadcast(&G->cv);
    return rc;
}

/* Check the launched call b (mu held on entry and return; dropped while checking). */
static int64_t coop_check(ferry_worker *w, ferry_job *j, struct ferry_gpudecode_job *G, size_t b) {
    gd_cbatch *c = &G->cb[b];
    c->state = CB_CHECKING;
    c->checker = w;
    pthread_mutex_unlock(&G->mu);
    uint64_t t0 = G->trace ? ferry_dt_now() : 0;
    gd_slot *g = &G->set[c->q->dev]->sl[c->slot];
    int64_t rc = gd_finish_batch(w, j, g, G->trace);
    ferry_dt_lap(G->trace, FERRY_DT_CHECK, &t0);
    return cb_settle(G, c, CB_DONE, rc);
}

/* Lay out call b on its slot (mu held on entry and return, dropped while
 * it runs): its chunks' places, and the first time a slot serves a job, its
 * buffers grown to the job's largest call — pinned staging, device payloads,
 * arrays, results and nvCOMP's temp space (zstd: ~3 x the call's output) —
 * so that no call of the job allocates after it. The call's previous user
 * of the slot is checked (CB_DONE) or there is none. */
static int coop_setup(ferry_worker *w, ferry_job *j, struct ferry_gpudecode_job *G, size_t b) {
    gd_cbatch *c = &G->cb[b];
    c->state = CB_SETUP;
    pthread_mutex_unlock(&G->mu);
    uint64_t t0 = G->trace ? ferry_dt_now() : 0;
    int d = c->q->dev;
    gd_slot *g = &G->set[d]->sl[c->slot];
    g->hplain = G->ring;
    int rc = gd_batch_layout(w, j, c->q, G->idx + c->first, c->n, g, G->trace, G->max_h[d] + 128 * G->max_n[d] + 64, G->max_h[d]);
    /* (blosc's splits may ask more arrays and results: they grow then) */
    if (rc >= 0) rc = gd_dev_fit(g->dev, &g->darr, &g->darr_cap, 128 * G->max_n[d] + 64);
    if (rc >= 0) rc = gd_dev_fit(g->dev, &g->dres, &g->dres_cap, 32 * G->max_n[d] + 64);
    if (rc >= 0) rc = gd_host_grow(w, d, &g->hres, &g->hres_cap, &g->hres_pinned, 32 * G->max_n[d] + 64);
    if (rc >= 0 && c->q->alg < FERRY_NVCOMP_NALG) {
        size_t t = 0;
        ferry_nvcomp_opts opts;
        memset(&opts, 0, sizeof opts);
        const ferry_nvcomp_api *nv = ferry_nvcomp_load(NULL);
        if (!ferry_nvcomp_temp_size(nv, c->q->alg, G->max_n[d], G->max_chunk[d], opts, &t, G->max_dec[d], g->stream) && t)
            rc = gd_dev_fit(g->dev, &g->dtemp, &g->dtemp_cap, t);
    }
    ferry_dt_lap(G->trace, FERRY_DT_LAYOUT, &t0);
    return (int)cb_settle(G, c, CB_FILL, rc);
}

/* Make call b ready to be read into (mu held): its slot's previous call
 * checked — by this feeder, if it is launched and nobody checks it yet —
 * then its layout, by whichever feeder comes first. A feeder that would
 * wait lays out a later call whose slot is free instead (the first job of a
 * context grows every slot's buffers this way at once, not one after
 * another). Returns the bytes of calls this feeder checked, or a negative
 * code. */
static int64_t coop_ready(ferry_worker *w, ferry_job *j, struct ferry_gpudecode_job *G, size_t b) {
    gd_cbatch *c = &G->cb[b];
    int64_t total = 0, rc;
    uint64_t t0 = G->trace ? ferry_dt_now() : 0;
    for (;;) {
        if (G->failed || atomic_load(&j->error) || atomic_load(&j->canceled)) return total ? total : 0;
        if (c->state >= CB_FILL) break;
        if (c->state == CB_NEW) {
            gd_cbatch *p = c->prev >= 0 ? &G->cb[c->prev] : NULL;
            if (p && p->state == CB_LAUNCHED) {
                if ((rc = coop_check(w, j, G, (size_t)c->prev)) < 0) return rc;
                total += rc;
                continue;
            }
            if (!p || p->state == CB_DONE) {
                ferry_dt_lap(G->trace, FERRY_DT_SLOTWAIT, &t0);
                if ((rc = coop_setup(w, j, G, b)) < 0) return rc;
                t0 = G->trace ? ferry_dt_now() : 0;
                break;
            }
        }
        size_t ahead = 0;   /* a later call whose slot is free */
        for (size_t k = b + 1; k < G->ncb && k < b + (size_t)G->nslots && !ahead; k++) {
            gd_cbatch *x = &G->cb[k];
            if (x->state == CB_NEW && (x->prev < 0 || G->cb[x->prev].state == CB_DONE)) ahead = k;
        }
        if (ahead) {
            if ((rc = coop_setup(w, j, G, ahead)) < 0) return rc;
            continue;
        }
        pthread_cond_wait(&G->cv, &G->mu);   /* its previous call is filling or being checked; or its setup runs */
    }
    ferry_dt_lap(G->trace, FERRY_DT_SLOTWAIT, &t0);
    return total;
}

/* A feeder on cooperative calls: until every call is claimed, take a piece
 * of the current one (readying it first), read it into the call's slot and
 * copy it up; launch the call when its last piece is read. Then check every
 * launched call nobody checks yet. Returns the file bytes of the calls it
 * checked, or a negative code (the job fails; other feeders stop). */
static int64_t run_coop(ferry_worker *w, ferry_job *j, struct ferry_gpudecode_job *G) {
    ferry_decode_trace *tr = G->trace;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    int64_t total = 0, rc = 0;
    int last_launcher = 0;
    pthread_mutex_lock(&G->mu);
    for (int d = 0; d < FERRY_MAX_DEVICES; d++)   /* this job's sets: the first feeder takes them */
        if (G->max_n[d] && !G->set[d] && !(G->set[d] = gd_set_acquire(j->ctx, d))) {
            G->failed = 1;
            rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
        }
    while (rc >= 0) {
        size_t b = atomic_load(&G->cb_cur);
        if (b >= G->ncb || G->failed) break;
        if ((rc = coop_ready(w, j, G, b)) < 0) break;
        total += rc;
        if (G->failed || atomic_load(&j->error) || atomic_load(&j->canceled)) break;
        gd_cbatch *c = &G->cb[b];
        size_t k0 = atomic_fetch_add(&c->next, G->piece);
        if (k0 >= c->n) {   /* its pieces are all claimed: the next call */
            atomic_compare_exchange_strong(&G->cb_cur, &b, b + 1);
            continue;
        }
        pthread_mutex_unlock(&G->mu);
        size_t k1 = FERRY_MIN(k0 + G->piece, c->n);
        gd_slot *g = &G->set[c->q->dev]->sl[c->slot];
        uint64_t t0 = tr ? ferry_dt_now() : 0, bytes = 0;
        if (tr) ferry_dt_mark(&tr->t_read0, t0);
        rc = ferry_cuda_use_device(c->q->dev);
        if (rc >= 0) rc = gd_read_chunks(w, j, g, k0, k1, &bytes);
        if (tr && rc >= 0) ferry_dt_mark_max(&tr->t_read1, ferry_dt_now());
        if (rc >= 0) {   /* this piece up now, while the others are read */
            uint64_t lo = g->ch[k0].slot / 8 * 8, hi = g->ch[k1 - 1].slot + j->ext[g->ch[k1 - 1].ext].length;
            if (tr) ferry_dt_mark(&tr->t_h2d0, ferry_dt_now());
            rc = gd_up_copy(w, g, g->din + lo, g->h + lo, hi - lo, g->stream);
        }
        ferry_dt_lap(tr, FERRY_DT_READ, &t0);
        int launched = 0;
        if (rc >= 0) {
            atomic_fetch_add(&c->file_bytes, bytes);
            if (atomic_fetch_add(&c->read, k1 - k0) + (k1 - k0) == c->n) {   /* the last piece: launch the call */
                g->file_bytes = atomic_load(&c->file_bytes);
                rc = gd_batch_launch(w, j, g, tr, 1);
                launched = rc >= 0;
            }
        }
        pthread_mutex_lock(&G->mu);
        if (rc < 0) { G->failed = 1; pthread_cond_broadcast(&G->cv); break; }
        if (launched) {
            c->state = CB_LAUNCHED;
            last_launcher = ++G->coop_launched == G->ncb;
            pthread_cond_broadcast(&G->cv);
        }
    }
    /* check what is launched and unchecked, in order: any feeder, or with
     * FERRY_GPU_CHECK=one only the one that launched the last call */
    int checks = !gd_check_by_one(j->ctx) || last_launcher;
    for (size_t b = 0; checks && rc >= 0 && b < G->ncb && !G->failed; b++)
        if (G->cb[b].state == CB_LAUNCHED) {
            int64_t x = coop_check(w, j, G, b);
            if (x < 0) rc = x; else total += x;
        }
    if (rc < 0) G->failed = 1;
    int failed = G->failed || atomic_load(&j->error) || atomic_load(&j->canceled);
    /* the placements this feeder enqueued that no later layout of their slot waits for */
    gd_slot *mine[FERRY_MAX_DEVICES * GD_MAX_SLOTS];
    int nmine = 0;
    for (size_t b = 0; !failed && rc >= 0 && b < G->ncb; b++)
        if (G->cb[b].checker == w && G->cb[b].last_of_slot && nmine < FERRY_MAX_DEVICES * GD_MAX_SLOTS)
            mine[nmine++] = &G->set[G->cb[b].q->dev]->sl[G->cb[b].slot];
    pthread_cond_broadcast(&G->cv);
    pthread_mutex_unlock(&G->mu);
    /* complete before the task ends: nothing this feeder enqueued outlives
     * it. Its reads and launches are covered by the check of their call
     * (EventSynchronize of its decode), the placement a check enqueues by
     * the next layout of that slot (it waits for the slot's done event) or,
     * for a slot's last call, by its checker here; after a failure every
     * feeder waits for everything. A feeder that did neither returns at once
     * (its worker takes the CPU's tail of the job while the GPU finishes). */
    for (int m = 0; m < nmine; m++) {
        ferry_cuda_use_device(mine[m]->dev);
        CUresult r = cu->EventSynchronize(mine[m]->done);
        if (r && rc >= 0) rc = ferry_seterr(FERRY_ECUDA, "device %d: GPU decode failed: %s", mine[m]->dev, ferry_cuda_errstr(r));
    }
    for (int d = 0; d < FERRY_MAX_DEVICES && (failed || rc < 0); d++) {
        if (!G->set[d]) continue;
        ferry_cuda_use_device(d);
        for (int k = 0; k < G->nslots; k++) {
            gd_slot *g = &G->set[d]->sl[k];
            if (!g->stream) continue;
            CUresult r = cu->StreamSynchronize(g->stream);
            if (r && rc >= 0) rc = ferry_seterr(FERRY_ECUDA, "device %d: GPU decode failed: %s", d, ferry_cuda_errstr(r));
        }
    }
    /* every feeder is through and every call checked: the sets go back to
     * the context now, not when the caller frees the job (after a failure
     * feeders may never start: ferry_gpudecode_job_free gives them back) */
    if (rc >= 0 && atomic_fetch_add(&G->coop_done, 1) + 1 == G->feeders) {
        pthread_mutex_lock(&G->mu);
        int all = !G->failed;
        for (size_t b = 0; all && b < G->ncb; b++) all = G->cb[b].state == CB_DONE;
        for (int d = 0; all && d < FERRY_MAX_DEVICES; d++)
            if (G->set[d]) { gd_set_release(j->ctx, G->set[d]); G->set[d] = NULL; }
        pthread_mutex_unlock(&G->mu);
    }
    return rc < 0 ? rc : total;
}

/* A feeder (one task): claims batches from the job's queues until they are
 * empty, up to gd_slots() in flight per device — the next batches are read,
 * framed and enqueued before the oldest one's results are checked (when its
 * slot comes round again, or at the end) — and returns once its device work
 * is complete (the bytes of every batch it ran, or the first error). */
int64_t ferry_gpudecode_run(ferry_worker *w, ferry_job *j, size_t task, int *deferred) {
    (void)task;
    *deferred = 0;
    struct ferry_gpudecode_job *G = j->gpu;
    ferry_decode_trace *tr = G->trace;
    if (!w->gpu) {
        if (!(w->gpu = calloc(1, sizeof *w->gpu))) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        w->gpu_free = ferry_gpudecode_worker_free;   /* worker.c frees it without calling up into this file */
    }
    int64_t total_coop = 0;
    gd_tl_trace = tr;
    gd_tl_ctx = j->ctx;
    if (G->ncb) {   /* cooperative calls first; then any shared queue's batches below */
        int64_t c = run_coop(w, j, G);
        if (c < 0) { gd_tl_trace = NULL; gd_tl_ctx = NULL; return c; }
        total_coop = c;
    }
    const int nslots = gd_slots(j->ctx);
    /* every feeder starts on slot 0: one that runs a single batch per job
     * reuses the same buffers job after job instead of growing them all */
    for (int d = 0; d < FERRY_MAX_DEVICES; d++) w->gpu->dev[d].cur = 0;
    enum { CAP = GD_MAX_SLOTS * FERRY_MAX_DEVICES };
    gd_slot *fifo[CAP];   /* open batches, oldest first */
    size_t head = 0, cnt = 0;
    int64_t total = 0, rc = 0;
    for (;;) {
        if (atomic_load(&j->error) || atomic_load(&j->canceled)) break;
        gd_queue *Q;
        const uint32_t *idx;
        size_t n;
        if (!gd_claim_batch(G, j, &Q, &idx, &n)) break;
        gd_dev *gdv = &w->gpu->dev[Q->dev];
        gd_slot *g = &gdv->sl[gdv->cur];
        gdv->cur = (gdv->cur + 1) % nslots;
        while (g->open && cnt && rc >= 0) {   /* its slot came round: check the batches up to it */
            gd_slot *o = fifo[head];
            head = (head + 1) % CAP;
            cnt--;
            if ((rc = gd_finish_batch(w, j, o, tr)) >= 0) total += rc;
        }
        if (rc < 0 || (rc = gd_start_batch(w, j, Q, idx, n, g, tr)) < 0) break;
        fifo[(head + cnt) % CAP] = g;
        cnt++;
    }
    while (rc >= 0 && cnt) {
        gd_slot *o = fifo[head];
        head = (head + 1) % CAP;
        cnt--;
        if ((rc = gd_finish_batch(w, j, o, tr)) >= 0) total += rc;
    }
    /* complete before the task ends: nothing of this job's batches outlives
     * it, a failed one included (its slots are synchronized, their results
     * dropped) */
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    for (int d = 0; d < FERRY_MAX_DEVICES; d++)
        for (int k = 0; k < GD_MAX_SLOTS; k++) {
            gd_slot *g = &w->gpu->dev[d].sl[k];
            if (!g->busy && !g->open) continue;
            ferry_cuda_use_device(d);
            CUresult r = cu->StreamSynchronize(g->stream);
            if (r && rc >= 0) rc = ferry_seterr(FERRY_ECUDA, "device %d: GPU decode failed: %s", d, ferry_cuda_errstr(r));
            if (g->flying) { ferry_dt_in_flight(tr, -1, g->it_n); g->flying = 0; }
            if (g->open) ferry_dt_batch_end(tr, g->n, g->it_n, 0, g->cpu_fallbacks, 0);
            g->busy = g->open = 0;
        }
    gd_tl_trace = NULL;
    gd_tl_ctx = NULL;
    return rc < 0 ? rc : total + total_coop;
}
