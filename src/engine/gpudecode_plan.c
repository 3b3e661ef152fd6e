/* gpudecode_plan.c — at job build, the chunks the GPU decodes put in
 * queues (one per device and codec class), GPU-only queues cut into
 * cooperative calls; while the job runs, feeders claim batches from the
 * queues and CPU workers single chunks of the shared ones. */
#include "engine/gpudecode_impl.h"
#include "engine/knobs.h"

/* Device memory a job's calls may grow into on device `dev`: what the driver
 * reports free plus the idle call-slot sets the context keeps there (a call
 * reuses them), shared with `others` jobs on the context (a dataset's
 * prefetched batches each take a set; which jobs count: share_pair below),
 * or 0 where the driver cannot say (no cap). */
static uint64_t dev_room(ferry_ctx *ctx, int dev, int others) {
    size_t free_b, total;
    if (!gd_dev_mem(dev, &free_b, &total)) return 0;
    return ((uint64_t)free_b + gd_pool_idle_bytes(ctx, dev)) / (uint64_t)(1 + (others > 0 ? others : 0));
}

/* Cut the job's cooperative queues into calls (gd_cbatch), give each a slot
 * of its device's set in turn, and size the pieces feeders claim. */
static int plan_coop(struct ferry_gpudecode_job *g, const ferry_job *j, int threads) {
    size_t ncb = 0;
    g->nslots = gd_coop_slots(j->ctx);
    g->ring = gd_stage_ring(j->ctx);
    /* the wave: this one and those still running, or two where others are
     * only held (share_pair). A finished job its caller has not yet destroyed
     * (a dataset's batch waiting to be handed out) decodes nothing: counting
     * each as a sharer (active_jobs, the rule before) made XarrayDataset's jobs see
     * 5 and more in flight, so each put its calls in one slot, one after the
     * other: 3 calls of 800 chunks, never two decoding at once, 16.2 GB/s
     * against 21 before (on the GPU machine, FERRY_DECODE_TRACE=1). */
    /* others: submitted and not destroyed, running or held */
    const int running = atomic_load(&j->ctx->running_jobs), others = atomic_load(&j->ctx->active_jobs);
    const int pair = gd_share_pair(j->ctx);
    const int jobs = pair && running == 0 && others > 0 ? 2 : 1 + running;
    const int room_others = pair ? running : others;
    for (size_t qi = 0; qi < g->nq; qi++) {
        gd_queue *q = &g->q[qi];
        if (!q->coop) continue;
        uint64_t mc = 0;
        for (size_t m = 0; m < q->count; m++) mc = FERRY_MAX(mc, j->ext[g->idx[q->first + m]].decoded_size);
        q->target = gd_call_chunks(j->ctx, q->count, mc, g->nslots, q->alg, dev_room(j->ctx, q->dev, room_others), jobs);   /* here: chunks per call */
        ncb += (q->count + q->target - 1) / q->target;
    }
    if (!ncb) return 0;
    if (!(g->cb = calloc(ncb, sizeof *g->cb))) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    long last[FERRY_MAX_DEVICES][GD_MAX_SLOTS];
    int turn[FERRY_MAX_DEVICES] = {0};
    for (int d = 0; d < FERRY_MAX_DEVICES; d++) for (int k = 0; k < GD_MAX_SLOTS; k++) last[d][k] = -1;
    size_t biggest = 0;
    for (size_t qi = 0; qi < g->nq; qi++) {
        gd_queue *q = &g->q[qi];
        if (!q->coop) continue;
        for (size_t m = 0; m < q->count; m += q->target) {
            gd_cbatch *c = &g->cb[g->ncb++];
            c->q = q;
            c->first = q->first + m;
            c->n = FERRY_MIN(q->target, q->count - m);
            c->slot = turn[q->dev];
            turn[q->dev] = (turn[q->dev] + 1) % gd_wave_slots(q->alg, g->nslots, jobs);
            c->prev = last[q->dev][c->slot];
            last[q->dev][c->slot] = (long)(c - g->cb);
            uint64_t h = 0, dec = 0;
            for (size_t k = 0; k < c->n; k++) {
                const ferry_extent *e = &j->ext[g->idx[c->first + k]];
                h += ferry_gpudecode_slot_room(e->length);   /* >= what batch_layout's slots take */
                dec += e->decoded_size;
                g->max_chunk[q->dev] = FERRY_MAX(g->max_chunk[q->dev], e->decoded_size);
            }
            g->max_h[q->dev] = FERRY_MAX(g->max_h[q->dev], h);
            g->max_dec[q->dev] = FERRY_MAX(g->max_dec[q->dev], dec);
            g->max_n[q->dev] = FERRY_MAX(g->max_n[q->dev], c->n);
            biggest = FERRY_MAX(biggest, c->n);
        }
    }
    for (int d = 0; d < FERRY_MAX_DEVICES; d++)
        for (int k = 0; k < GD_MAX_SLOTS; k++)
            if (last[d][k] >= 0) g->cb[last[d][k]].last_of_slot = 1;
    /* pieces: every feeder has about two per call, a few chunks each (one
     * claim per chunk would cost an atomic and a cache line per MiB) */
    g->piece = biggest / (2 * (size_t)(threads > 0 ? threads : 1));
    if (g->piece < 1) g->piece = 1;
    if (g->piece > 16) g->piece = 16;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->mu_init = 1;
    g->ctx = j->ctx;
    return 0;
}

int ferry_gpudecode_plan(ferry_job *j, int policy) {
    if (policy == FERRY_DECODE_AUTO) policy = j->ctx->cfg.decode;
    j->decode_gpu = policy == FERRY_DECODE_GPU;
    if (policy == FERRY_DECODE_CPU) return 0;
    size_t n = j->next, cand = 0;
    chain_info ci;
    for (size_t i = 0; i < n; i++) {
        const ferry_extent *e = &j->ext[i];
        if (e->kind == FERRY_EXTENT_READ && e->dst.kind == FERRY_MEM_CUDA && e->decoded_size && gd_gpu_chain(e, &ci) &&
            gd_class_mode(policy, ci.alg) != MODE_CPU)
            cand++;
    }
    if (!cand) return 0;
    const char *why;
    if (!ferry_nvcomp_load(&why)) {
        if (policy == FERRY_DECODE_GPU)
            return ferry_seterr(FERRY_EPATH, "decode \"gpu\" was asked for but nvCOMP cannot run: %s", why);
        return 0;   /* AUTO: the CPU decodes, as without a GPU */
    }
    struct ferry_gpudecode_job *g = calloc(1, sizeof *g);
    if (!g) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    g->idx = malloc(cand * sizeof *g->idx);
    g->owned = calloc(n, 1);
    if (!g->idx || !g->owned) { free(g->idx); free(g->owned); free(g); return ferry_seterr(FERRY_ENOMEM, "out of memory"); }
    const int threads = j->max_workers > 0 ? j->max_workers : 1;
    const size_t sh_feeders = gd_shared_feeders(j->ctx, threads);
    size_t k = 0, gpu_only = 0, shared = 0, max_batches = 0, tail_total = 0;
    /* one queue per (device, class): chunks keep plan order inside it */
    for (int d = 0; d < FERRY_MAX_DEVICES && k < cand; d++)
        for (int a = 0; a < NCLASS; a++) {
            int mode = gd_class_mode(policy, a);
            if (mode == MODE_CPU) continue;
            gd_queue *q = &g->q[g->nq];
            q->first = k;
            uint64_t bytes = 0, max_chunk = 0;
            for (size_t i = 0; i < n; i++) {
                const ferry_extent *e = &j->ext[i];
                if (e->kind != FERRY_EXTENT_READ || e->dst.kind != FERRY_MEM_CUDA || e->dst.device != d || !e->decoded_size ||
                    !gd_gpu_chain(e, &ci) || ci.alg != a)
                    continue;
                g->idx[k++] = (uint32_t)i;
                g->owned[i] = 1;
                bytes += e->decoded_size;
                max_chunk = FERRY_MAX(max_chunk, e->decoded_size);
            }
            q->count = k - q->first;
            if (!q->count) continue;
            q->alg = a;
            q->dev = d;
            class_rate cr_env, *cr = &cr_env;
            cr_env = gd_auto_table[a];
            /* FERRY_GPU_RATES=gpu_gbs,chunk_mbs,cpu_gbs_per_thread: the table's
             * numbers for shared queues, to measure another machine (and the
             * stand-in's tests) without a rebuild */
            const char *rs = ferry_knob(j->ctx, "FERRY_GPU_RATES");
            if (rs && sscanf(rs, "%lf,%lf,%lf", &cr_env.gpu_gbs, &cr_env.gpu_chunk_mbs, &cr_env.cpu_gbs_per_thread) == 3 &&
                (cr_env.gpu_gbs <= 0 || cr_env.gpu_chunk_mbs <= 0 || cr_env.cpu_gbs_per_thread <= 0))
                cr_env = gd_auto_table[a];
            q->latency = cr->gpu_chunk_mbs > 0 ? (double)max_chunk / (cr->gpu_chunk_mbs * 1e6) : 0;
            q->shared = mode == MODE_BOTH;
            /* a job the CPU alone takes BIG_JOB_LATENCIES chunk latencies or
             * more to decode: GPU calls (every worker reading them) with the
             * CPU tail, not a shared queue (the table's comment says why) */
            if (q->shared && policy != FERRY_DECODE_GPU && q->latency > 0 &&
                (double)bytes / (cr->cpu_gbs_per_thread * 1e9 * threads) >= BIG_JOB_LATENCIES * q->latency)
                q->shared = 0;
            q->coop = !q->shared;
            /* AUTO, cooperative: the queue's last chunks are left to the CPU
             * workers (ordinary tasks, run as feeders finish reading). The
             * GPU's last call ends one chunk's latency after its last read
             * (1 MiB zstd: ~11 ms, a third of a 1 GiB job); in that time the
             * other workers decode on the CPU (threads - 1) x latency x
             * their rate: (threads - 1) x cpu_gbs x 1000 / chunk_mbs chunks
             * (zstd on the GPU machine: 15 x 0.67 x 1000 / 93 = 108), at most a quarter of
             * the queue. Only for a job alone on its context: with other jobs
             * in flight (a dataset's prefetched batches) the workers read
             * their calls during the drain instead, and the GPU's time is
             * not idle. FERRY_GPU_TAIL=off: none; =balance: see tail_mode. */
            const int tm = gd_tail_mode(j->ctx, a);
            if (q->coop && policy == FERRY_DECODE_AUTO && tm != TAIL_OFF && gd_auto_table[a].gpu_chunk_mbs > 0 && threads > 1 &&
                q->count >= 64 && atomic_load(&j->ctx->active_jobs) == 0) {
                size_t tail = (size_t)((double)(threads - 1) * gd_auto_table[a].cpu_gbs_per_thread * 1e3 / gd_auto_table[a].gpu_chunk_mbs);
                if (tail > q->count / 4) tail = q->count / 4;
                if (tm == TAIL_BALANCE && cr->gpu_chunk_mbs > 0) {
                    double c = (double)bytes / (double)q->count, nq = (double)q->count;
                    double cpu = (threads - 1) * cr->cpu_gbs_per_thread * 1e9, gpu = cr->gpu_gbs * 1e9;
                    double lat = (double)max_chunk / (cr->gpu_chunk_mbs * 1e6);
                    double t = (lat + nq * c / gpu) / (c / cpu + c / gpu);
                    tail = t > (double)(q->count / 2) ? q->count / 2 : (size_t)t;
                }
                for (size_t m = k - tail; m < k; m++) {
                    g->owned[g->idx[m]] = 0;
                    bytes -= j->ext[g->idx[m]].decoded_size;
                }
                k -= tail;
                q->count -= tail;
                cand -= tail;
                tail_total += tail;
            }
            int cpu_threads = threads - (int)sh_feeders > 0 ? threads - (int)sh_feeders : 1;
            q->bytes = bytes;
            q->cpu_bps = cr->cpu_gbs_per_thread * 1e9 * cpu_threads;
            q->gpu_bps = cr->gpu_gbs * 1e9;
            /* a shared queue the CPU workers finish within one GPU chunk's
             * latency: claim_batch never takes any of it (its room only
             * shrinks), so it is no queue at all — the job runs as decode="cpu"
             * would, without GPU feeder tasks (a random time step of a
             * netCDF-4 file: one chunk) */
            if (q->shared && q->latency > 0 && (double)bytes / q->cpu_bps <= q->latency) {
                for (size_t m = q->first; m < k; m++) g->owned[g->idx[m]] = 0;
                cand -= q->count;
                k = q->first;
                continue;
            }
            double share = q->gpu_bps / (q->gpu_bps + q->cpu_bps);
            q->target = gd_batch_target(j->ctx, bytes, q->shared ? sh_feeders : (size_t)threads, q->shared, share);
            if (q->shared) shared += q->count; else gpu_only += q->count;
            size_t nb = (size_t)(bytes / q->target) + 1;
            if (nb > max_batches) max_batches = nb;
            g->nq++;
        }
    /* feeders: every worker for GPU-only queues (reading is spread over all
     * of them), a few where a queue is shared; never more than there are batches */
    if (!g->nq) { free(g->idx); free(g->owned); free(g); return 0; }   /* every queue was the CPU's */
    int rc = plan_coop(g, j, threads);
    if (rc < 0) { j->gpu = g; ferry_gpudecode_job_free(j); return rc; }
    if (g->ncb) {   /* every feeder reads pieces of the cooperative calls */
        size_t pieces = 0;
        for (size_t b = 0; b < g->ncb; b++) pieces += (g->cb[b].n + g->piece - 1) / g->piece;
        if (pieces > max_batches) max_batches = pieces;
    }
    g->feeders = gpu_only ? (size_t)threads : sh_feeders;
    if (g->feeders > max_batches) g->feeders = max_batches;
    if (g->feeders < 1) g->feeders = 1;
    g->cpu_slots = shared;
    if (ferry_dt_enabled(j->ctx) && (g->trace = calloc(1, sizeof *g->trace))) {
        g->trace->plan_batches = g->feeders;
        g->trace->plan_target = g->nq && !g->q[0].coop ? g->q[0].target : 0;
        g->trace->plan_call = g->ncb ? g->cb[0].n : 0;
        g->trace->plan_calls = g->ncb;
        g->trace->plan_chunks = cand;
        g->trace->plan_shared = shared;
        g->trace->plan_tail = tail_total;
        g->trace->t_plan = ferry_dt_now();
    }
    j->gpu = g;
    return 0;
}

int ferry_gpudecode_owns(const ferry_job *j, size_t i) { return j->gpu && j->gpu->owned[i]; }
size_t ferry_gpudecode_tasks(const ferry_job *j) { return j->gpu ? j->gpu->feeders + j->gpu->cpu_slots : 0; }
int ferry_gpudecode_is_feeder(const ferry_job *j, size_t t) { return j->gpu && t < j->gpu->feeders; }

/* Claim the next batch for a feeder: the front run of a queue, up to its
 * target bytes (and 4096 chunks); of a shared queue at most the GPU's share
 * of what is left, so that the CPU workers and the GPU finish together.
 * 0 when every queue is empty. */
int gd_claim_batch(struct ferry_gpudecode_job *g, const ferry_job *j, gd_queue **qout, const uint32_t **idx,
                   size_t *count) {
    for (size_t qi = 0; qi < g->nq; qi++) {
        gd_queue *q = &g->q[qi];
        if (q->coop) continue;   /* its calls are read by every feeder (run_coop) */
        size_t cur = atomic_load(&q->next);
        while (cur < q->count) {
            size_t left = q->count - cur, take = 0;
            uint64_t bytes = 0;
            while (take < left && take < 4096) {
                uint64_t b = j->ext[g->idx[q->first + cur + take]].decoded_size;
                if (take && bytes + b > q->target) break;
                bytes += b;
                take++;
            }
            if (q->shared) {   /* only what the GPU finishes before the CPU workers would */
                uint64_t left_bytes = q->bytes - FERRY_MIN(q->bytes, atomic_load(&q->taken));
                uint64_t gpu_holds = atomic_load(&q->gpu_out);
                double cpu_t = (double)left_bytes / q->cpu_bps;
                double room = cpu_t - q->latency - (double)gpu_holds / q->gpu_bps;
                double x = room > 0 ? room / (1.0 / q->gpu_bps + 1.0 / (PREAD_GBS * 1e9) + 1.0 / q->cpu_bps) : 0;
                while (take && (double)bytes > x) bytes -= j->ext[g->idx[q->first + cur + --take]].decoded_size;
                if (!take) break;   /* the CPU finishes the rest sooner: not this queue */
            }
            if (atomic_compare_exchange_weak(&q->next, &cur, cur + take)) {
                if (q->shared) {
                    atomic_fetch_add(&q->taken, bytes);
                    atomic_fetch_add(&q->gpu_out, bytes);
                }
                *qout = q;
                *idx = g->idx + q->first + cur;
                *count = take;
                return 1;
            }
        }
    }
    return 0;
}

int64_t ferry_gpudecode_take_one(ferry_job *j) {
    struct ferry_gpudecode_job *g = j->gpu;
    for (size_t qi = 0; g && qi < g->nq; qi++) {
        gd_queue *q = &g->q[qi];
        if (!q->shared || atomic_load(&q->next) >= q->count) continue;
        size_t cur = atomic_fetch_add(&q->next, 1);
        if (cur >= q->count) continue;
        uint32_t i = g->idx[q->first + cur];
        atomic_fetch_add(&q->taken, j->ext[i].decoded_size);
        if (g->trace) {
            atomic_fetch_add(&g->trace->shared_cpu_chunks, 1);
            atomic_fetch_add(&g->trace->shared_cpu_bytes, j->ext[i].decoded_size);
        }
        return i;
    }
    return -1;
}

void ferry_gpudecode_job_free(ferry_job *j) {
    if (!j || !j->gpu) return;
    if (j->gpu->trace) { ferry_dt_report(j->gpu->trace, j->id, j->max_workers); free(j->gpu->trace); }
    /* sets still held: a failed or canceled job whose checking feeder never
     * ran; what it launched completes before the set serves another job */
    for (int d = 0; d < FERRY_MAX_DEVICES; d++)
        if (j->gpu->set[d]) { gd_set_sync(j->gpu->set[d]); gd_set_release(j->gpu->ctx, j->gpu->set[d]); }
    if (j->gpu->mu_init) { pthread_mutex_destroy(&j->gpu->mu); pthread_cond_destroy(&j->gpu->cv); }
    free(j->gpu->cb);
    free(j->gpu->idx); free(j->gpu->owned); free(j->gpu);
    j->gpu = NULL;
}
