/* gpudecode_rates.c — which chains the GPU decodes, AUTO's rate table per
 * codec class, and the sizing built on it: chunks per cooperative call, a
 * plan's device cost, the job size a stream of jobs should hold
 * (ferry_plan_job_bytes). */
#include "engine/gpudecode_impl.h"
#include "engine/knobs.h"

static int is_check(uint32_t id) { return id == FERRY_CODEC_CRC32C || id == FERRY_CODEC_FLETCHER32; }

/* checks*, one nvCOMP codec, then optionally SHUFFLE, then optionally BYTESWAP */
int gd_gpu_chain(const ferry_extent *e, chain_info *ci) {
    memset(ci, 0, sizeof *ci);
    int i = 0, n = e->ncodecs;
    while (i < n && is_check(e->codecs[i].id)) i++;
    ci->ncheck = i;
    if (i >= n) return 0;
    ci->codec = e->codecs[i].id;
    switch (ci->codec) {
    case FERRY_CODEC_ZSTD: ci->alg = FERRY_NVCOMP_ZSTD; break;
    case FERRY_CODEC_ZLIB: ci->alg = FERRY_NVCOMP_DEFLATE; break;
    case FERRY_CODEC_LZ4: ci->alg = FERRY_NVCOMP_LZ4; break;
    case FERRY_CODEC_BLOSC: ci->alg = CLASS_BLOSC; break;
    default: return 0;   /* gzip: CRC-32 has no GPU kernel here */
    }
    i++;
    if (i < n && e->codecs[i].id == FERRY_CODEC_SHUFFLE) ci->shuffle = e->codecs[i++].param;
    if (i < n && e->codecs[i].id == FERRY_CODEC_BYTESWAP) ci->swap = e->codecs[i++].param;
    if (ci->swap == 1) ci->swap = 0;
    if (ci->shuffle == 1) ci->shuffle = 0;
    return i == n;
}

/* AUTO, per batch class, from measured rates for device destinations on the
 * GPU machine (16 cores, nvCOMP 6.0; bench/bench_decode.py, its --trace rows,
 * BENCHMARKS.md), GB/s of decoded data:
 *   zstd (Zarr v3, 1 MiB chunks)       ferry GPU 18.3 vs CPU 10.7                       -> GPU
 *   blosc-lz4+shuffle (Zarr v2, 1 MiB) ferry GPU 39.0 vs CPU 27.2                       -> GPU
 *   deflate+shuffle (netCDF-4, 4 MiB)  nvCOMP on every chunk in one call: 6.34 (258
 *                                      chunks), 12.1 (516), 22.0 (1,032), 28.6 (2,064)
 *                                      vs CPU 7.5-7.9                                   -> BOTH
 *   LZ4 (plain)                        nvCOMP 24.1 vs CPU 24.1; its per-chunk latency is
 *                                      not measured yet                                 -> CPU
 * nvCOMP decodes each chunk on one thread block: its rate comes from
 * chunks in flight at once, and one chunk takes chunk / gpu_chunk_mbs however
 * many run beside it (zstd 1 MiB: 32 per call 2.97 GB/s = 11 ms each, 1024
 * per call 53 GB/s). A call of n chunks takes about latency + n x chunk /
 * gpu_gbs: deflate's 516- and 2,064-chunk rows give latency 136 ms for a 4
 * MiB chunk (31 MB/s) and 53 GB/s beyond it (the fit is within 10 % of the
 * other two rows; BENCHMARKS.md's history) — the GPU is
 * fast at deflate only with a whole job in flight, and a job the CPU finishes
 * within a chunk's latency (146 ms for a 1 GiB load) is the CPU's.
 * GPU: every chunk of the class goes to GPU batches, which every worker
 * feeds. BOTH: the chunks form one queue that GPU feeders (a few workers, each
 * claiming a batch at a time) and the other workers (one chunk at a time, on
 * the CPU) drain together, so the rates add and neither waits for a share
 * fixed in advance (FERRY_GPU_CPU_SHARE's fixed split ran at 1.99 GB/s against
 * the CPU's 7.58). A feeder claims only what the GPU finishes — its read at
 * one thread's pread rate, one chunk's latency, the batch at gpu_gbs, after
 * what it already holds — before the CPU workers would finish what is left
 * without it (claim_batch); on a load the CPU finishes within one GPU chunk's
 * latency it claims nothing, and AUTO is the CPU alone. A BOTH queue the CPU
 * alone would take BIG_JOB_LATENCIES chunk latencies or more to decode is
 * run as GPU calls instead (cooperative, every worker reading, the tail on
 * the CPU as for zstd): two feeders reading alone at one thread's pread rate
 * cannot keep a whole job in flight. decode="gpu" sends every chunk nvCOMP
 * can take to GPU batches.
 * call_max / call_bytes: chunks and decoded bytes of one cooperative call at
 * most (ferry_gpudecode_call_chunks): zstd's temp space is ~3 x a call's
 * output and the GPU holds ~500 1 MiB zstd chunks at once, so 256 and 256
 * MiB; deflate is latency-bound, so its calls are as large as a job needs to
 * be in flight at once: up to 1,024 chunks and 512 MiB (8 calls in flight: an
 * 8 GiB job of 4 MiB chunks in three waves), and a queue it decodes within one
 * chunk latency (a 2 or 4 GiB load of 4 MiB chunks) is one call, and jobs in
 * flight together share the calls of a wave (`lat_bound`).
 * stream_bytes: for the same reason a stream of small deflate jobs (a
 * dataset's batches) never fills the GPU: jobs of 160 one-MiB chunks stay on
 * the CPU (8.6 GB/s), and read as jobs of 640 or 1,280 chunks, two in flight,
 * they ran at 1.8-7.4 (XarrayDataset over netCDF-4, on the GPU machine);
 * jobs of 2,560 (2.5 GiB) ran at 19.6, 0.77 of one .load() of the whole set
 * (25.5); 3,840 at 16.8 and 5,120 at 10.6. zstd asks the same: Zarr v3
 * zstd batches of 160 one-MiB chunks, one job each, five in flight, ran at
 * 23.5-26.4 GB/s (0.66-0.69 of its .load()); jobs of 1,280, 2,560 and 5,120
 * chunks, two in flight, at 41.3-43.6, 44.4 and 42.5 (1.07-1.16 of .load(),
 * one run; a third job in flight: 40.2-42.8). Jobs of
 * 640 ran at 19.9-26.7 in both runs that had them. */
const class_rate gd_auto_table[NCLASS] = {
    [FERRY_NVCOMP_ZSTD] = {MODE_GPU, 53.2, 93.0, 0.67, 256, 256u << 20, 5, 2560ull << 20, 0},
    [FERRY_NVCOMP_LZ4] = {MODE_CPU, 24.1, 0, 1.51, 256, 256u << 20, 3, 0, 0},
    [FERRY_NVCOMP_DEFLATE] = {MODE_BOTH, 53.0, 31.0, 0.46, 1024, 512u << 20, 3, 2560ull << 20, 1},
    [CLASS_BLOSC] = {MODE_GPU, 39.0, 0, 1.70, 256, 256u << 20, 3, 0, 0},
};
/* How a class is decoded under a policy. */
int gd_class_mode(int policy, int cls) {
    if (policy == FERRY_DECODE_GPU) return MODE_GPU;
    if (policy == FERRY_DECODE_CPU) return MODE_CPU;
    return gd_auto_table[cls].mode;
}

/* Chunks per cooperative nvCOMP call. nvCOMP decodes a chunk per thread
 * block and one 1 MiB zstd chunk takes ~11 ms however many run beside it, so
 * its rate is the chunks in flight: on the GPU machine 32 per call gave 2.97 GB/s,
 * 128 11.7, 256 22.2, 1,024 53.2 (BENCHMARKS.md) — the GPU holds ~500 at once.
 * A job's queue is cut into `nslots` calls or more (they pipeline: call k+1 is
 * read and copied up while k decodes, and nslots calls in flight on their own
 * streams), each of 32 chunks at least and at most the class's call_max
 * chunks and call_bytes decoded (the staging and nvCOMP temp space of every
 * slot stay bounded: 8 slots of a 1 MiB zstd-0 call are ~2 GiB of host
 * staging, pinned unless the ring stages them: FERRY_GPU_STAGE). The calls are even, in as
 * few waves of nslots as the caps allow: a last call of a few chunks would
 * take a whole chunk latency of its own (516 x 4 MiB deflate chunks in
 * calls of 64: eight in flight, then a ninth of 4 — 0.37 s, twice the 0.18 s
 * of one call of all 516).
 * With 8 slots, 1,024 x 1 MiB zstd chunks: 8 calls of 128 (the first launched
 * after 128 chunks are read, not 1,024); 4,096: 16 of 256; 256 x 4 MiB: 8 of
 * 32; deflate, 516 x 4 MiB: 8 of 65; 2,064: 24 of 86.
 * A latency-bound class (the table's `lat_bound`: deflate) whose whole queue the
 * GPU decodes within one chunk's latency at its full rate is one call
 * instead, if the device has room for it and it holds at most SOLO_BYTES:
 * the read it would overlap is short beside that latency, and calls side by
 * side decode slower than one call of all their chunks. On the GPU machine,
 * a 4 GiB netCDF-4 load (1,034 x 4 MiB deflate chunks, one run): GPU-only
 * in 1 / 2 / 4 / 8 calls 15.00 / 14.50 / 13.32 / 13.50 GB/s (the job 269 to
 * 306 ms, one call launched 55 ms in); AUTO's 718 in 1 / 2 / 4 / 8 calls
 * 16.18 / 16.02 / 14.82 / 15.14-15.46; the old two waves of 8 calls of 65:
 * 9.24. Both sides scale with the chunk's size, so the rule is a count: up
 * to gpu_gbs / gpu_chunk_mbs chunks (1,709 for deflate) are one call, more
 * keep their calls (2,064 x 4 MiB: 24 of 86; a dataset's 2,560 x 1 MiB: see
 * `jobs` below). Measured for 4 MiB chunks only: a load of fewer 1 MiB ones
 * (a 1 GiB .load(): one call of 1,024) reads for longer beside its 34 ms
 * latency and has not been run both ways.
 * `jobs` jobs running together on the context (this one included: submitted
 * and not yet complete) share a latency-bound class's wave: each cuts its queue into nslots / jobs calls a
 * wave, each up to jobs x call_bytes, so the calls side by side on the
 * device and the bytes they hold stay those of one job. On the GPU machine,
 * XarrayDataset over netCDF-4 (2.5 GiB jobs of 2,560 x 1 MiB chunks, two in
 * flight): 8 calls of 320 each (16 at once) 18.8-21.0 GB/s; 4 of 640 27.7;
 * 2 of 1,280 25.3-26.5; 1 of 2,560 22.3-24.4 (FERRY_GPU_CALL, two runs).
 * FERRY_GPU_CALL overrides the chunk count, FERRY_GPU_BATCH the byte cap. */
/* Calls of a wave one job keeps in flight on a device: nslots, or for a
 * latency-bound class its share of them with `jobs` jobs running together
 * (below; plan_coop gives its calls their slots in turn among these). */
int gd_wave_slots(int cls, int nslots, int jobs) {
    const class_rate *cr = &gd_auto_table[cls >= 0 && cls < NCLASS ? cls : FERRY_NVCOMP_ZSTD];
    if (!cr->lat_bound || jobs <= 1 || nslots <= 1) return nslots < 1 ? 1 : nslots;
    return nslots / jobs > 1 ? nslots / jobs : 1;
}

/* A call slot's device buffers beyond dev_per_byte x its call: din and dtemp
 * rounded up to 2 MiB each (dev_fit), darr and dres of 64 KiB at least. */
size_t ferry_gpudecode_call_chunks(size_t count, uint64_t max_chunk, int nslots, int cls, uint64_t dev_free, int jobs) {
    return gd_call_chunks(NULL, count, max_chunk, nslots, cls, dev_free, jobs);
}

size_t gd_call_chunks(const ferry_ctx *ctx, size_t count, uint64_t max_chunk, int nslots, int cls, uint64_t dev_free,
                      int jobs) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_CALL");
    long v = s && *s ? atol(s) : 0;
    if (v > 0) return (size_t)(v > 4096 ? 4096 : v);
    if (nslots < 1) nslots = 1;
    const class_rate *cr = &gd_auto_table[cls >= 0 && cls < NCLASS ? cls : FERRY_NVCOMP_ZSTD];
    uint64_t cap = cr->call_bytes;
    const char *b = ferry_knob(ctx, "FERRY_GPU_BATCH");
    if (b) { int64_t x = ferry_knob_bytes(b); if (x > 0) cap = (uint64_t)x; }
    if (cr->lat_bound && cr->gpu_chunk_mbs > 0 && max_chunk && count) {
        const double bytes = (double)count * (double)max_chunk;
        const uint64_t most = b ? cap : SOLO_BYTES;
        if (bytes / (cr->gpu_gbs * 1e9) <= (double)max_chunk / (cr->gpu_chunk_mbs * 1e6) && bytes <= (double)most &&
            count <= 4096 && (!dev_free || bytes * cr->dev_per_byte <= (double)(dev_free / 2)))
            return count;
    }
    const int mine = gd_wave_slots(cls, nslots, jobs);   /* a wave shared with the other jobs in flight */
    if (mine < nslots && !b) cap *= (uint64_t)(nslots / mine);
    nslots = mine;
    /* the calls in flight take at most half the device memory there is —
     * unless the whole queue does: its calls in flight hold no more than it
     * (a dataset's small job on a nearly full device was cut into calls of
     * one chunk in every slot, each slot's buffers rounded up: more memory,
     * not less, than one call of all of it) */
    uint64_t room = dev_free / 2 / ((uint64_t)nslots * (uint64_t)cr->dev_per_byte);
    const double whole = (double)count * (double)max_chunk * cr->dev_per_byte + (double)SLOT_SLACK;
    if (dev_free && room < cap && !(max_chunk && whole <= (double)(dev_free / 2))) cap = room;
    size_t most = cr->call_max;
    if (max_chunk && (uint64_t)most * max_chunk > cap) most = (size_t)(cap / max_chunk);
    if (most < 1) most = 1;
    size_t per_wave = most * (size_t)nslots;
    size_t waves = (count + per_wave - 1) / per_wave;
    if (waves < 1) waves = 1;
    size_t calls = waves * (size_t)nslots;
    size_t n = (count + calls - 1) / calls;
    if (n < 32) n = 32;
    if (n > most) n = most;
    return n;
}

/* The driver's free and total memory of device `dev` (its context made
 * current for the query): 1, or 0 where it cannot say — the caller then
 * caps nothing, and the job's own use of the device reports the failure. */
int gd_dev_mem(int dev, size_t *free_b, size_t *total) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    *free_b = *total = 0;
    if (!cu || !cu->MemGetInfo) return 0;
    CUcontext saved = ferry_cuda_current();
    int ok = 0;
    if (ferry_cuda_use_device(dev) == 0) ok = cu->MemGetInfo(free_b, total) == 0;
    else ferry_clearerr();
    ferry_cuda_restore(saved);
    return ok;
}

void ferry_gpudecode_cost_of(ferry_ctx *ctx, const ferry_plan *plan, int policy, ferry_gpudecode_cost *out) {
    memset(out, 0, sizeof *out);
    out->dev = -1;
    out->ctx = ctx;
    if (!ctx || !plan) return;
    if (policy == FERRY_DECODE_AUTO) policy = ctx->cfg.decode;
    if (policy == FERRY_DECODE_CPU) return;
    uint64_t total = 0, in = 0, of_class[NCLASS] = {0};
    chain_info ci;
    for (size_t i = 0; i < plan->n; i++) {
        const ferry_extent *e = &plan->ext[i];
        if (e->kind != FERRY_EXTENT_READ) continue;
        total += e->decoded_size ? e->decoded_size : e->length;
        if (e->dst.kind == FERRY_MEM_CUDA && e->decoded_size && gd_gpu_chain(e, &ci) && gd_class_mode(policy, ci.alg) != MODE_CPU) {
            of_class[ci.alg] += e->decoded_size;
            in += e->length;
            out->max_chunk = FERRY_MAX(out->max_chunk, e->decoded_size);
            if (!ferry_place_is_contiguous(e->place, e->decoded_size) || ci.shuffle) out->scratch = 1;
            if (out->dev < 0) out->dev = e->dst.device;
        }
    }
    for (int a = 0; a < NCLASS; a++)
        if (of_class[a] && gd_auto_table[a].stream_bytes) {
            const uint64_t w = (uint64_t)((double)gd_auto_table[a].stream_bytes * (double)total / (double)of_class[a]);
            if (w > out->want) { out->want = w; out->cls = a; }
            out->per_byte = FERRY_MAX(out->per_byte, (unsigned)gd_auto_table[a].dev_per_byte);
        }
    uint64_t dec = 0;
    for (int a = 0; a < NCLASS; a++) dec += of_class[a];
    out->in_per_out = dec ? (double)in / (double)dec : 0;
    if (!out->want || !ferry_nvcomp_load(NULL)) out->want = 0;   /* no GPU decode: the CPU's rate at any size */
}

/* dev_fit's rounding (dev_alloc) */
static uint64_t fit_size(uint64_t n) {
    const uint64_t step = n <= (1u << 20) ? (uint64_t)64 << 10 : (uint64_t)2 << 20;
    return (n + step - 1) / step * step;
}

uint64_t ferry_gpudecode_job_device_bytes(const ferry_gpudecode_cost *c, uint64_t job_bytes, int jobs) {
    if (!c || !c->want || !job_bytes) return 0;
    const uint64_t chunk = c->max_chunk ? c->max_chunk : (uint64_t)1 << 20;
    const int nslots = gd_coop_slots(c->ctx);
    const size_t count = (size_t)((job_bytes + chunk - 1) / chunk);
    const size_t n = gd_call_chunks(c->ctx, count, chunk, nslots, c->cls, 0, jobs);
    const size_t calls = (count + n - 1) / n;
    const int wave = gd_wave_slots(c->cls, nslots, jobs);
    const uint64_t slots = calls < (size_t)wave ? calls : (uint64_t)wave;
    /* every slot the job takes is grown to its largest call (coop_setup):
     * its compressed chunks and arrays (din), arrays and results (darr,
     * dres), nvCOMP's temp space (asked of nvCOMP where it says, else the
     * table's dev_per_byte less the input and output), scratch outputs */
    const uint64_t k = n < count ? n : count, call = k * chunk;
    const double ratio = c->in_per_out > 0 && c->in_per_out < 2 ? c->in_per_out : 1.0;
    const uint64_t in = fit_size(k * ferry_gpudecode_slot_room((uint64_t)((double)chunk * ratio) + 1) + 128 * k + 64);
    uint64_t temp = 0;
    size_t t = 0;
    const ferry_nvcomp_api *nv = ferry_nvcomp_load(NULL);
    ferry_nvcomp_opts opts;
    memset(&opts, 0, sizeof opts);
    if (nv && c->cls < FERRY_NVCOMP_NALG && c->dev >= 0) {
        CUcontext saved = ferry_cuda_current();
        if (ferry_cuda_use_device(c->dev) == 0 && !ferry_nvcomp_temp_size(nv, c->cls, k, chunk, opts, &t, call, NULL))
            temp = fit_size(t ? t : 1);
        else
            ferry_clearerr();
        ferry_cuda_restore(saved);
    }
    if (!temp) temp = call * (c->per_byte > 2 ? c->per_byte - 2 : 1);
    const uint64_t slot = in + fit_size(128 * k + 64) + fit_size(32 * k + 64) + temp + (c->scratch ? 2 * call : 0);
    return slots * slot;
}

/* ferry_plan_job_bytes (include/ferry.h): the class whose stream_bytes asks
 * the most, scaled by its share of the plan's decoded bytes, and at most the
 * share of the device memory the driver reports free that leaves half of it
 * free with the caller's jobs in flight: two in the engine, each holding its
 * destination and call slots of dev_per_byte times its bytes (inputs,
 * scratch, nvCOMP's temp space), and the one being consumed its destination —
 * free / (2 x (2 x (1 + dev_per_byte) + 1)): zstd 1/26, deflate 1/18. The
 * context's idle call slots do not count: they hold calls, not destinations.
 * ferry_plan_budget (ferry_experimental.h, budget.c) is the rule that counts
 * every byte the stream holds; this one is kept for its callers. */
uint64_t ferry_plan_job_bytes(ferry_ctx *ctx, const ferry_plan *plan, int policy) {
    ferry_gpudecode_cost c;
    ferry_gpudecode_cost_of(ctx, plan, policy, &c);
    uint64_t want = c.want;
    size_t free_b, dev_total;
    if (want && gd_dev_mem(c.dev, &free_b, &dev_total)) {
        (void)dev_total;   /* free <= total: the free memory alone caps it */
        const uint64_t cap = (uint64_t)free_b / (2u * (2u * (1u + c.per_byte) + 1u));
        if (cap < want) want = cap ? cap : 1;
    }
    return want;
}

/* Where in a batch's pinned buffer a chunk's bytes go: the first position at
 * or after `at` that sits where the chunk's first byte sits in its 64-byte
 * line of the file (its page-cache copy), moved down to the nearest position
 * whose payload, `hdr` bytes in (zlib 2, numcodecs LZ4 4), is aligned as
 * nvCOMP reads it (`align`, a power of two up to 64). Why: the kernel copies
 * a pread out of the page cache at memory speed when source and destination
 * share their place in a cache line, and several times slower when the
 * destination sits a few bytes after the source — bench/pread_align.c, 790 KB
 * files (Zarr zstd chunks) read whole on a 2-thread AMD EPYC run (BENCHMARKS.md,
 * D5): destination at 0 mod 64 18.2 GB/s, at 8 (the packing
 * before: 8-aligned slots) 4.8, at 2 4.3; a source at 1234 mod 4096 read to
 * 1234 14.6, to 1232 10.7, to 1236 4.0. The GPU machine's Intel Xeon copies
 * at one speed whatever the places (16 threads: 45.0 GB/s at 0, 44.9 at 8; a
 * 4 GiB Zarr zstd job the same within the run's spread, BENCHMARKS.md, D5
 * and D1). Costs at most 63 bytes per chunk
 * (ferry_gpudecode_slot_room). FERRY_GPU_LINE=off: the 8-aligned slots. */
uint64_t ferry_gpudecode_slot(uint64_t at, uint64_t file_off, unsigned hdr, unsigned align) {
    if (!align || align > 64 || (align & (align - 1))) align = 8;
    const uint64_t src = file_off % 64;
    const uint64_t want = (src + 64 - (src + hdr) % align) % 64;   /* <= src, payload aligned */
    return at + (want + 64 - at % 64) % 64;
}
uint64_t ferry_gpudecode_slot_room(uint64_t len) { return gd_up(len, 8) + 72; }

/* ---- which codec goes where (ferry info --codecs) ------------------------------- */
static int decompresses(uint32_t id) {
    return id == FERRY_CODEC_ZLIB || id == FERRY_CODEC_GZIP || id == FERRY_CODEC_ZSTD || id == FERRY_CODEC_LZ4 ||
           id == FERRY_CODEC_BLOSC;
}

int ferry_gpudecode_is_fallback(const ferry_job *j, const ferry_extent *e) {
    if (!j->decode_gpu || e->dst.kind != FERRY_MEM_CUDA) return 0;
    for (int i = 0; i < e->ncodecs; i++)
        if (decompresses(e->codecs[i].id)) return 1;
    return 0;
}

/* From the code that decides: a one-codec chain through gd_gpu_chain, its
 * class through gd_class_mode. The steps around a codec (checks before it,
 * unshuffle and byteswap after it) go where their codec goes. */
int ferry_gpudecode_route(uint32_t codec, int policy) {
    if (policy == FERRY_DECODE_CPU) return FERRY_ROUTE_CPU;
    if (!decompresses(codec)) return FERRY_ROUTE_STEP;
    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.codecs[0].id = codec;
    e.ncodecs = 1;
    chain_info ci;
    if (!gd_gpu_chain(&e, &ci)) return FERRY_ROUTE_CPU;
    const int mode = gd_class_mode(policy, ci.alg);
    return mode == MODE_GPU ? FERRY_ROUTE_GPU : mode == MODE_BOTH ? FERRY_ROUTE_BOTH : FERRY_ROUTE_CPU;
}

const char *ferry_gpudecode_route_note(uint32_t codec) {
    switch (codec) {
    case FERRY_CODEC_GZIP: return "its CRC-32 has no GPU kernel";
    case FERRY_CODEC_ZLIB: return "nvCOMP deflate; AUTO: GPU feeders and CPU workers share one queue, the GPU "
                                  "taking only what it finishes first";
    case FERRY_CODEC_ZSTD: return "nvCOMP zstd; a chunk of several frames, a dictionary or a content checksum: "
                                  "the CPU";
    case FERRY_CODEC_LZ4: return "nvCOMP LZ4; AUTO: the CPU (a tie where measured)";
    case FERRY_CODEC_BLOSC: return "lz4 or zstd inside on the GPU; blosclz, snappy, zlib inside on the CPU";
    case FERRY_CODEC_CRC32C: case FERRY_CODEC_FLETCHER32: return "checked on the CPU before its codec";
    case FERRY_CODEC_SHUFFLE: case FERRY_CODEC_BYTESWAP: return "where its codec decodes (GPU kernels after a GPU codec)";
    default: return NULL;
    }
}
