/* gpudecode_knobs.c — the GPU decode stage's status calls and the readers
 * of its FERRY_GPU_* knobs (knobs.h's table has their grammar): batch size,
 * slots, feeders, the CPU's tail, who checks, how jobs share calls, where
 * chunks sit in the staging. Each says why its default is what it is. Calls
 * nothing of the stage. */
#include "engine/gpudecode_impl.h"

/* ---- status (the decode policy's names are base/names.c's) ---------------- */
const char *ferry_nvcomp_status(ferry_ctx *ctx) { (void)ctx; return ferry_nvcomp_describe(); }
void ferry_nvcomp_search_dir(const char *dir) { ferry_nvcomp_set_dir(dir); }

/* Decoded bytes per batch: large enough that nvCOMP's batched kernels fill
 * the GPU (its limit above was measured on 1,024-chunk calls), small enough
 * that every feeder has batches to read while others decode (one thread's
 * pread is ~6 GB/s) and that zstd's temp space (~3x the batch's output,
 * nvCOMP 5.3) and the pinned memory of every slot of every feeder stay
 * modest: the queue's bytes / (slots x feeders), within [4 MiB, 32 MiB]
 * (a whole 1 GiB job in flight at once: nvCOMP's rate is the number of
 * chunks in flight, FERRY_DECODE_TRACE) (shared queues: the GPU's part of them, within
 * [4 MiB, 256 MiB]: deflate decodes one chunk per thread block, so more
 * chunks per call is the only way to fill the GPU); FERRY_GPU_BATCH overrides. */
uint64_t gd_batch_target(const ferry_ctx *ctx, uint64_t bytes, size_t feeders, int shared, double share) {
    /* (share: the GPU's part of the sum of rates, for a shared queue) */
    const char *s = ferry_knob(ctx, "FERRY_GPU_BATCH");
    if (s) { int64_t v = ferry_knob_bytes(s); if (v > 0) return (uint64_t)v; }
    uint64_t t = (uint64_t)((double)bytes * (shared ? share : 1.0)) / ((uint64_t)gd_slots(ctx) * (feeders ? feeders : 1));
    uint64_t hi = shared ? (256u << 20) : (32u << 20);
    if (t < (4u << 20)) t = 4u << 20;
    if (t > hi) t = hi;
    return t;
}

/* FERRY_GPU_CHECK: who checks a job's launched cooperative calls once every
 * piece is read. "all" (the default): every feeder checks the calls that
 * are launched and nobody checks yet, so up to one worker per call waits for
 * the GPU (cuEventSynchronize) — a deflate call's latency is 100-200 ms.
 * "one": only the feeder that launches the job's last call checks them, in
 * order, and the others return at once: their workers take the next job's
 * tasks (a dataset's groups in flight) or the CPU's tail. That feeder is
 * running whatever happens to the others (a feeder that never starts, the
 * job failed or canceled, launches nothing); after a failure every feeder
 * that runs waits for the streams, as with "all". On the GPU machine three
 * cooperative jobs in flight ran slower than two (XarrayDataset over
 * netCDF-4, 16 batches a read: 14.0 against 18.9 GB/s), likely because the
 * first job's checkers held the workers the next ones' reads need. Measured
 * on the GPU machine, not the default: XarrayDataset over netCDF-4 read
 * 18.6 GB/s against 19.2 and idled the GPU 31.7 % against 17.2 %; a 4 GiB
 * zstd job's AUTO 46.5 against 43.5-45.6 (the spread of the default). */
int gd_check_by_one(const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_CHECK");
    return s && !strcmp(s, "one");
}

/* FERRY_GPU_TAIL: how much of a cooperative queue AUTO leaves to the CPU
 * workers. "on": what they decode in one GPU chunk latency, a quarter of the
 * queue at most; "off": none; "balance": as many as make the CPU's part end
 * when the GPU's does — t chunks of mean size c with t x c / cpu = latency +
 * (n - t) x c / gpu, half the queue at most. For a latency-bound class the
 * GPU's part is mostly its latency, so the CPU can take more than one
 * latency's worth (deflate on the GPU machine, 2 GiB of 4 MiB chunks: 258 of 516 instead of
 * 129; the GPU's 387 ended at 0.228 s, the CPU's 129 well before). The
 * default: balance for deflate (the class both decoders share), on for the
 * others — on the GPU machine, a 4 GiB netCDF-4 .load() in one run: balance
 * 15.25 GB/s (GPU share 69 %), on 14.45 (79 %); the other classes' tails were
 * not measured both ways. */
int gd_tail_mode(const ferry_ctx *ctx, int cls) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_TAIL");
    if (!s) return cls == FERRY_NVCOMP_DEFLATE ? TAIL_BALANCE : TAIL_ON;
    if (!strcmp(s, "off") || !strcmp(s, "0")) return TAIL_OFF;
    return !strcmp(s, "balance") ? TAIL_BALANCE : TAIL_ON;
}

/* Calls in flight per device for cooperative batches: FERRY_GPU_SLOTS (1 ..
 * GD_MAX_SLOTS), default 8. On the GPU machine (4 GiB of 1 MiB zstd
 * chunks in 16 calls of 256) four slots made the readers wait 10 ms each for
 * a call's slot (its decode not done: 1,024 chunks in flight where the GPU
 * runs ~500 at once) and the job ran 112-119 ms; eight: no wait, 105 ms
 * (41 GB/s). The price: up to 8 x 256 MiB of staging per device (pinned
 * by default; plain memory with FERRY_GPU_STAGE=ring). */
int gd_coop_slots(const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_SLOTS");
    int v = s && *s ? atoi(s) : GD_MAX_SLOTS;
    return v < 1 ? 1 : v > GD_MAX_SLOTS ? GD_MAX_SLOTS : v;
}

/* FERRY_GPU_SHARE: which of the other jobs on the context a job's calls are
 * planned beside. "pair" (the default): a job planned while another is held
 * (finished, not yet destroyed: a dataset's batch waiting to be handed out)
 * shares the wave as one of two, since the dataset's next read is about to
 * be submitted beside it; and the device's room is divided among the
 * running jobs only, since a finished job's call slots are back in the pool
 * (counted in the room) and its destination is already out of the driver's
 * free memory. "running" (the rule before): the wave is shared among running
 * jobs only and the room among every held job too — of 53 XarrayDataset jobs
 * over netCDF-4, 21 ran as 8 calls of 300 and 18 were cut into 12-24 smaller
 * calls by the room. On the GPU machine, one run, 16 GiB sets,
 * alternated: netCDF-4 21.93 / 22.14 GB/s "running" against 28.07 / 28.03
 * "pair" (FERRY_GPU_CALL=640, 4 calls of 640 uncapped: 28.31); Zarr zstd
 * 46.82 / 47.22 against 50.81 / 49.92 (the room alone: zstd is not
 * latency-bound); GPU idle behind a 10 GB/s step with the loop waiting on
 * the host, netCDF-4: 5.2 % against 1.5 %. */
int gd_share_pair(const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_SHARE");
    return !s || strcmp(s, "running") != 0;
}

/* GPU feeders for shared queues: a few workers (each has gd_slots()
 * batches in flight); the rest decode on the CPU. FERRY_GPU_FEEDERS overrides. */
size_t gd_shared_feeders(const ferry_ctx *ctx, int threads) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_FEEDERS");
    long v = s && *s ? atol(s) : 2;
    if (v > threads - 1) v = threads - 1;
    if (v < 1) v = 1;
    return (size_t)v;
}

/* Slots a feeder (per-feeder batches) or a device's set (cooperative calls)
 * uses: FERRY_GPU_SLOTS (1 .. GD_MAX_SLOTS), default 4. */
int gd_slots(const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_SLOTS");
    int v = s && *s ? atoi(s) : GD_SLOTS_DEFAULT;
    return v < 1 ? 1 : v > GD_MAX_SLOTS ? GD_MAX_SLOTS : v;
}
size_t gd_ring_piece(const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_RING");
    int64_t v = s && *s ? ferry_knob_bytes(s) : -1;
    return v >= (64 << 10) ? (size_t)v : v >= 0 ? (size_t)64 << 10 : (size_t)8 << 20;
}

int gd_line_slots(const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_LINE");
    return !(s && (strcasecmp(s, "off") == 0 || strcmp(s, "0") == 0));
}

uint64_t gd_pool_bytes(const ferry_ctx *ctx, uint64_t largest) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_POOL");
    int64_t v = s && *s ? ferry_knob_bytes(s) : -1;
    return FERRY_MAX(v >= 0 ? (uint64_t)v : POOL_BYTES, 2 * largest);
}
