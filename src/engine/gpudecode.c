/* gpudecode.c — the device decode stage: compressed chunks bound for device
 * memory, decoded on the GPU by one batched nvCOMP call per batch.
 *
 * The plan puts the chunks the GPU may decode in queues, one per device and
 * class (codec). A GPU-only queue is cut into cooperative calls (gd_cbatch,
 * run_coop): a quarter of the queue each, 32 to 256 chunks, because nvCOMP
 * decodes a chunk per thread block and its rate is the chunks in flight;
 * every feeder reads pieces of the current call into that call's slot (the
 * context's, reused job after job) and copies its piece up (through its own
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
#include "engine/gpudecode.h"
#include "engine/gpudecode_trace.h"
#include "engine/io.h"
#include "engine/knobs.h"
#include "codecs/framing.h"
#include "cuda/nvcomp.h"
#include <errno.h>
#include <stdlib.h>
#include <strings.h>

/* ---- status (the decode policy's names are base/names.c's) ---------------- */
const char *ferry_nvcomp_status(ferry_ctx *ctx) { (void)ctx; return ferry_nvcomp_describe(); }
void ferry_nvcomp_search_dir(const char *dir) { ferry_nvcomp_set_dir(dir); }

/* ---- which chains the GPU decodes ------------------------------------------ */
typedef struct chain_info {
    int ncheck;          /* leading crc32c / fletcher32 steps (verified on the CPU) */
    uint32_t codec;      /* FERRY_CODEC_ZSTD / ZLIB / LZ4 / BLOSC */
    int alg;             /* batch class: a ferry_nvcomp_alg, or CLASS_BLOSC (its inner codec decides) */
    unsigned shuffle;    /* element size of a SHUFFLE step after it, 0 none */
    unsigned swap;       /* element size of a BYTESWAP step after that, 0 none */
} chain_info;

enum { CLASS_BLOSC = FERRY_NVCOMP_NALG, NCLASS };
#define GD_MAX_SLOTS 8   /* batches in flight per feeder (per-feeder batches) or per device (cooperative ones) */
#define GD_SLOTS_DEFAULT 4

static int is_check(uint32_t id) { return id == FERRY_CODEC_CRC32C || id == FERRY_CODEC_FLETCHER32; }

/* checks*, one nvCOMP codec, then optionally SHUFFLE, then optionally BYTESWAP */
static int gpu_chain(const ferry_extent *e, chain_info *ci) {
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
enum { MODE_CPU = 0, MODE_GPU = 1, MODE_BOTH = 2 };
typedef struct class_rate {
    int mode;
    double gpu_gbs;              /* nvCOMP's batched rate with the GPU full */
    double gpu_chunk_mbs;        /* one chunk's decode rate on the GPU (its latency: chunk / this) */
    double cpu_gbs_per_thread;   /* ferry's CPU decode, 16 threads / 16 */
    size_t call_max;             /* chunks per cooperative call, at most */
    uint64_t call_bytes;         /* decoded bytes per cooperative call, at most */
    int dev_per_byte;            /* device bytes a call in flight holds per decoded byte (inputs,
                                    scratch, nvCOMP's temp space: zstd's is ~3 x the output) */
    uint64_t stream_bytes;       /* decoded bytes of the class one job of a stream of jobs should
                                    hold (ferry_plan_job_bytes); 0: any size runs at the rate */
    int lat_bound;               /* latency-bound: a queue the GPU decodes within one chunk latency
                                    is one call, and jobs in flight together share a wave's calls
                                    (ferry_gpudecode_call_chunks says why) */
} class_rate;
static const class_rate auto_table[NCLASS] = {
    [FERRY_NVCOMP_ZSTD] = {MODE_GPU, 53.2, 93.0, 0.67, 256, 256u << 20, 5, 2560ull << 20, 0},
    [FERRY_NVCOMP_LZ4] = {MODE_CPU, 24.1, 0, 1.51, 256, 256u << 20, 3, 0, 0},
    [FERRY_NVCOMP_DEFLATE] = {MODE_BOTH, 53.0, 31.0, 0.46, 1024, 512u << 20, 3, 2560ull << 20, 1},
    [CLASS_BLOSC] = {MODE_GPU, 39.0, 0, 1.70, 256, 256u << 20, 3, 0, 0},
};
#define BIG_JOB_LATENCIES 2.0
#define PREAD_GBS 6.0   /* one thread's page-cache pread, GPU machine (BENCHMARKS.md, E1): a feeder reads its batch alone */

/* How a class is decoded under a policy. */
static int class_mode(int policy, int cls) {
    if (policy == FERRY_DECODE_GPU) return MODE_GPU;
    if (policy == FERRY_DECODE_CPU) return MODE_CPU;
    return auto_table[cls].mode;
}

/* ---- plan: queues of chunks ------------------------------------------------- */
/* A queue: the chunks of one class for one device, idx[first .. first+count),
 * claimed from the front: by GPU feeders a batch at a time, and, when
 * shared (MODE_BOTH), by CPU workers one at a time. */
typedef struct gd_queue {
    size_t first, count;
    _Atomic size_t next;     /* chunks claimed so far (may pass count: CPU claims overshoot) */
    int alg, dev, shared;
    int coop;                /* GPU-only: its batches are cooperative (cbatch), read by every feeder */
    uint64_t target;         /* decoded bytes per batch */
    /* shared queues: what claim_batch weighs (bytes, seconds) */
    uint64_t bytes;          /* decoded bytes of the whole queue */
    _Atomic uint64_t taken;  /* decoded bytes claimed by either side */
    _Atomic uint64_t gpu_out;/* decoded bytes the GPU holds (claimed, not yet checked) */
    double cpu_bps, gpu_bps, latency;  /* CPU workers' rate, the GPU's, one chunk's GPU latency */
} gd_queue;

/* A cooperative batch: the chunks of one nvCOMP call (a run of a GPU-only
 * queue), read into one slot of the job's slot set by every feeder at once,
 * a piece of a few chunks per claim; the feeder that reads its last piece
 * launches it (framing, one call), and whoever next needs its slot — or any
 * feeder at the end — checks it (finish_batch). */
enum { CB_NEW = 0, CB_SETUP, CB_FILL, CB_LAUNCHED, CB_CHECKING, CB_DONE };
typedef struct gd_cbatch {
    gd_queue *q;
    size_t first, n;              /* g->idx[first .. first+n) */
    int slot;                     /* its slot in the device's set */
    long prev;                    /* the batch that used that slot before it, -1 none */
    int last_of_slot;             /* no later call of the job uses its slot */
    const void *checker;          /* the feeder (worker) that checked it */
    int state;                    /* CB_*, under the job's mu */
    _Atomic size_t next;          /* chunks claimed for reading */
    _Atomic size_t read;          /* chunks read (the one that reads the last launches) */
    _Atomic uint64_t file_bytes;
} gd_cbatch;

struct gd_cset;
struct ferry_gpudecode_job {
    uint32_t *idx;       /* extent indices, queue by queue (plan order inside each) */
    uint8_t *owned;      /* per extent: 1 when a queue holds it */
    gd_queue q[FERRY_MAX_DEVICES * NCLASS];
    size_t nq;
    size_t feeders;      /* FERRY_GPU_TASK tasks 0 .. feeders-1: GPU feeders */
    size_t cpu_slots;    /* tasks feeders .. feeders+cpu_slots-1: one shared chunk each on the CPU */
    ferry_decode_trace *trace;   /* FERRY_DECODE_TRACE=1: per-stage totals (gpudecode_trace.c), else NULL */
    /* cooperative batches (GPU-only queues) */
    gd_cbatch *cb;
    size_t ncb, piece;           /* batches; chunks a feeder reads per claim */
    _Atomic size_t cb_cur;       /* the batch feeders are reading now */
    int nslots;                  /* slots per device set: batches in flight */
    int ring;                    /* calls' inputs in plain host memory, up through each feeder's pinned ring (stage_ring) */
    uint64_t max_h[FERRY_MAX_DEVICES], max_dec[FERRY_MAX_DEVICES], max_chunk[FERRY_MAX_DEVICES];
    size_t max_n[FERRY_MAX_DEVICES];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int mu_init, failed;
    _Atomic size_t coop_done;    /* feeders through run_coop: the last gives the sets back */
    size_t coop_launched;        /* calls launched (mu): FERRY_GPU_CHECK=one's checker launched the last */
    struct gd_cset *set[FERRY_MAX_DEVICES];   /* from the context's pool while the job runs */
    ferry_ctx *ctx;
};

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
static int gd_slots(const ferry_ctx *ctx);
static int stage_ring(ferry_ctx *ctx);
static int pool_first_coop_job(ferry_ctx *ctx);

static uint64_t batch_target(const ferry_ctx *ctx, uint64_t bytes, size_t feeders, int shared, double share) {
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
static int check_by_one(const ferry_ctx *ctx) {
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
enum { TAIL_OFF = 0, TAIL_ON = 1, TAIL_BALANCE = 2 };
static int tail_mode(const ferry_ctx *ctx, int cls) {
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
static int coop_slots(const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_SLOTS");
    int v = s && *s ? atoi(s) : GD_MAX_SLOTS;
    return v < 1 ? 1 : v > GD_MAX_SLOTS ? GD_MAX_SLOTS : v;
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
static int wave_slots(int cls, int nslots, int jobs) {
    const class_rate *cr = &auto_table[cls >= 0 && cls < NCLASS ? cls : FERRY_NVCOMP_ZSTD];
    if (!cr->lat_bound || jobs <= 1 || nslots <= 1) return nslots < 1 ? 1 : nslots;
    return nslots / jobs > 1 ? nslots / jobs : 1;
}

/* A call slot's device buffers beyond dev_per_byte x its call: din and dtemp
 * rounded up to 2 MiB each (dev_fit), darr and dres of 64 KiB at least. */
#define SLOT_SLACK ((uint64_t)9 << 19)
#define SOLO_BYTES (8ull << 30)   /* a solo call's decoded bytes at most: its compressed bytes are staged (pinned) at once */
size_t ferry_gpudecode_call_chunks(size_t count, uint64_t max_chunk, int nslots, int cls, uint64_t dev_free, int jobs) {
    const char *s = getenv("FERRY_GPU_CALL");
    long v = s && *s ? atol(s) : 0;
    if (v > 0) return (size_t)(v > 4096 ? 4096 : v);
    if (nslots < 1) nslots = 1;
    const class_rate *cr = &auto_table[cls >= 0 && cls < NCLASS ? cls : FERRY_NVCOMP_ZSTD];
    uint64_t cap = cr->call_bytes;
    const char *b = getenv("FERRY_GPU_BATCH");
    if (b) { int64_t x = ferry_knob_bytes(b); if (x > 0) cap = (uint64_t)x; }
    if (cr->lat_bound && cr->gpu_chunk_mbs > 0 && max_chunk && count) {
        const double bytes = (double)count * (double)max_chunk;
        const uint64_t most = b ? cap : SOLO_BYTES;
        if (bytes / (cr->gpu_gbs * 1e9) <= (double)max_chunk / (cr->gpu_chunk_mbs * 1e6) && bytes <= (double)most &&
            count <= 4096 && (!dev_free || bytes * cr->dev_per_byte <= (double)(dev_free / 2)))
            return count;
    }
    const int mine = wave_slots(cls, nslots, jobs);   /* a wave shared with the other jobs in flight */
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

static uint64_t pool_idle_bytes(ferry_ctx *ctx, int dev);
static size_t pool_trim(ferry_ctx *ctx, int dev);
static int place_is_contiguous(const ferry_place *place, uint64_t decoded);

/* The driver's free and total memory of device `dev` (its context made
 * current for the query): 1, or 0 where it cannot say — the caller then
 * caps nothing, and the job's own use of the device reports the failure. */
static int dev_mem(int dev, size_t *free_b, size_t *total) {
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

/* Device memory a job's calls may grow into on device `dev`: what the driver
 * reports free plus the idle call-slot sets the context keeps there (a call
 * reuses them), shared with `others` jobs on the context (a dataset's
 * prefetched batches each take a set; which jobs count: share_pair below),
 * or 0 where the driver cannot say (no cap). */
static uint64_t dev_room(ferry_ctx *ctx, int dev, int others) {
    size_t free_b, total;
    if (!dev_mem(dev, &free_b, &total)) return 0;
    return ((uint64_t)free_b + pool_idle_bytes(ctx, dev)) / (uint64_t)(1 + (others > 0 ? others : 0));
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
static int share_pair(const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_SHARE");
    return !s || strcmp(s, "running") != 0;
}

/* Cut the job's cooperative queues into calls (gd_cbatch), give each a slot
 * of its device's set in turn, and size the pieces feeders claim. */
static int plan_coop(struct ferry_gpudecode_job *g, const ferry_job *j, int threads) {
    size_t ncb = 0;
    g->nslots = coop_slots(j->ctx);
    g->ring = stage_ring(j->ctx);
    /* the wave: this one and those still running, or two where others are
     * only held (share_pair). A finished job its caller has not yet destroyed
     * (a dataset's batch waiting to be handed out) decodes nothing: counting
     * each as a sharer (active_jobs, the rule before) made XarrayDataset's jobs see
     * 5 and more in flight, so each put its calls in one slot, one after the
     * other: 3 calls of 800 chunks, never two decoding at once, 16.2 GB/s
     * against 21 before (on the GPU machine, FERRY_DECODE_TRACE=1). */
    /* others: submitted and not destroyed, running or held */
    const int running = atomic_load(&j->ctx->running_jobs), others = atomic_load(&j->ctx->active_jobs);
    const int pair = share_pair(j->ctx);
    const int jobs = pair && running == 0 && others > 0 ? 2 : 1 + running;
    const int room_others = pair ? running : others;
    for (size_t qi = 0; qi < g->nq; qi++) {
        gd_queue *q = &g->q[qi];
        if (!q->coop) continue;
        uint64_t mc = 0;
        for (size_t m = 0; m < q->count; m++) mc = FERRY_MAX(mc, j->ext[g->idx[q->first + m]].decoded_size);
        q->target = ferry_gpudecode_call_chunks(q->count, mc, g->nslots, q->alg, dev_room(j->ctx, q->dev, room_others), jobs);   /* here: chunks per call */
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
            turn[q->dev] = (turn[q->dev] + 1) % wave_slots(q->alg, g->nslots, jobs);
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

/* GPU feeders for shared queues: a few workers (each has gd_slots()
 * batches in flight); the rest decode on the CPU. FERRY_GPU_FEEDERS overrides. */
static size_t shared_feeders(const ferry_ctx *ctx, int threads) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_FEEDERS");
    long v = s && *s ? atol(s) : 2;
    if (v > threads - 1) v = threads - 1;
    if (v < 1) v = 1;
    return (size_t)v;
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
        if (e->dst.kind == FERRY_MEM_CUDA && e->decoded_size && gpu_chain(e, &ci) && class_mode(policy, ci.alg) != MODE_CPU) {
            of_class[ci.alg] += e->decoded_size;
            in += e->length;
            out->max_chunk = FERRY_MAX(out->max_chunk, e->decoded_size);
            if (!place_is_contiguous(e->place, e->decoded_size) || ci.shuffle) out->scratch = 1;
            if (out->dev < 0) out->dev = e->dst.device;
        }
    }
    for (int a = 0; a < NCLASS; a++)
        if (of_class[a] && auto_table[a].stream_bytes) {
            const uint64_t w = (uint64_t)((double)auto_table[a].stream_bytes * (double)total / (double)of_class[a]);
            if (w > out->want) { out->want = w; out->cls = a; }
            out->per_byte = FERRY_MAX(out->per_byte, (unsigned)auto_table[a].dev_per_byte);
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
    const int nslots = coop_slots(c->ctx);
    const size_t count = (size_t)((job_bytes + chunk - 1) / chunk);
    const size_t n = ferry_gpudecode_call_chunks(count, chunk, nslots, c->cls, 0, jobs);
    const size_t calls = (count + n - 1) / n;
    const int wave = wave_slots(c->cls, nslots, jobs);
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

int ferry_gpudecode_dev_free(int dev, uint64_t *free_b) {
    size_t f, total;
    *free_b = 0;
    if (!dev_mem(dev, &f, &total)) return 0;
    *free_b = f;
    return 1;
}

size_t ferry_gpudecode_give_back(ferry_ctx *ctx, int dev) { return pool_trim(ctx, dev); }

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
    if (want && dev_mem(c.dev, &free_b, &dev_total)) {
        (void)dev_total;   /* free <= total: the free memory alone caps it */
        const uint64_t cap = (uint64_t)free_b / (2u * (2u * (1u + c.per_byte) + 1u));
        if (cap < want) want = cap ? cap : 1;
    }
    return want;
}

int ferry_gpudecode_plan(ferry_job *j, int policy) {
    if (policy == FERRY_DECODE_AUTO) policy = j->ctx->cfg.decode;
    if (policy == FERRY_DECODE_CPU) return 0;
    size_t n = j->next, cand = 0;
    chain_info ci;
    for (size_t i = 0; i < n; i++) {
        const ferry_extent *e = &j->ext[i];
        if (e->kind == FERRY_EXTENT_READ && e->dst.kind == FERRY_MEM_CUDA && e->decoded_size && gpu_chain(e, &ci) &&
            class_mode(policy, ci.alg) != MODE_CPU)
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
    const size_t sh_feeders = shared_feeders(j->ctx, threads);
    size_t k = 0, gpu_only = 0, shared = 0, max_batches = 0, tail_total = 0;
    /* one queue per (device, class): chunks keep plan order inside it */
    for (int d = 0; d < FERRY_MAX_DEVICES && k < cand; d++)
        for (int a = 0; a < NCLASS; a++) {
            int mode = class_mode(policy, a);
            if (mode == MODE_CPU) continue;
            gd_queue *q = &g->q[g->nq];
            q->first = k;
            uint64_t bytes = 0, max_chunk = 0;
            for (size_t i = 0; i < n; i++) {
                const ferry_extent *e = &j->ext[i];
                if (e->kind != FERRY_EXTENT_READ || e->dst.kind != FERRY_MEM_CUDA || e->dst.device != d || !e->decoded_size ||
                    !gpu_chain(e, &ci) || ci.alg != a)
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
            cr_env = auto_table[a];
            /* FERRY_GPU_RATES=gpu_gbs,chunk_mbs,cpu_gbs_per_thread: the table's
             * numbers for shared queues, to measure another machine (and the
             * stand-in's tests) without a rebuild */
            const char *rs = ferry_knob(j->ctx, "FERRY_GPU_RATES");
            if (rs && sscanf(rs, "%lf,%lf,%lf", &cr_env.gpu_gbs, &cr_env.gpu_chunk_mbs, &cr_env.cpu_gbs_per_thread) == 3 &&
                (cr_env.gpu_gbs <= 0 || cr_env.gpu_chunk_mbs <= 0 || cr_env.cpu_gbs_per_thread <= 0))
                cr_env = auto_table[a];
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
            const int tm = tail_mode(j->ctx, a);
            if (q->coop && policy == FERRY_DECODE_AUTO && tm != TAIL_OFF && auto_table[a].gpu_chunk_mbs > 0 && threads > 1 &&
                q->count >= 64 && atomic_load(&j->ctx->active_jobs) == 0) {
                size_t tail = (size_t)((double)(threads - 1) * auto_table[a].cpu_gbs_per_thread * 1e3 / auto_table[a].gpu_chunk_mbs);
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
            q->target = batch_target(j->ctx, bytes, q->shared ? sh_feeders : (size_t)threads, q->shared, share);
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
    if (ferry_dt_enabled() && (g->trace = calloc(1, sizeof *g->trace))) {
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
static int claim_batch(struct ferry_gpudecode_job *g, const ferry_job *j, gd_queue **qout, const uint32_t **idx,
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

struct gd_cset;
static void set_release(ferry_ctx *ctx, struct gd_cset *set);

static void set_sync(struct gd_cset *set);
void ferry_gpudecode_job_free(ferry_job *j) {
    if (!j || !j->gpu) return;
    if (j->gpu->trace) { ferry_dt_report(j->gpu->trace, j->id, j->max_workers); free(j->gpu->trace); }
    /* sets still held: a failed or canceled job whose checking feeder never
     * ran; what it launched completes before the set serves another job */
    for (int d = 0; d < FERRY_MAX_DEVICES; d++)
        if (j->gpu->set[d]) { set_sync(j->gpu->set[d]); set_release(j->gpu->ctx, j->gpu->set[d]); }
    if (j->gpu->mu_init) { pthread_mutex_destroy(&j->gpu->mu); pthread_cond_destroy(&j->gpu->cv); }
    free(j->gpu->cb);
    free(j->gpu->idx); free(j->gpu->owned); free(j->gpu);
    j->gpu = NULL;
}

/* ---- per-worker buffers -------------------------------------------------------- */
typedef struct gd_chunk {
    uint32_t ext;
    int kind;            /* K_GPU, K_CPU (decoded on the CPU), K_FILL (missing file), K_DONE */
    uint64_t slot;       /* offset of its bytes in h */
    chain_info ci;
    ferry_frame fr;      /* zstd / zlib / LZ4 framing */
    CUdeviceptr out;     /* where nvCOMP writes (dst, or scratch before an unshuffle) */
    CUdeviceptr fin;     /* the decoded chunk after filters: dst, or scratch to place from */
    int out_scr, fin_scr;/* out / fin hold offsets into dscr until it is allocated */
    int placed;          /* fin is scratch: copy (place) it into dst */
    size_t item0, nitems;/* its nvCOMP inputs */
    uint64_t cpu_pos;    /* K_CPU / K_FILL: offset in hcpu */
    size_t len;          /* its bytes once the checks' trailers are verified and cut (read_chunks) */
} gd_chunk;

typedef struct gd_item {  /* one nvCOMP input: a frame, or one split of a blosc block */
    uint32_t chunk;
    int alg;              /* ferry_nvcomp_alg */
    uint64_t in_pos, in_len;   /* in h / din */
    uint64_t out_off, out_len; /* from its chunk's `out` */
    size_t q;             /* its index in the batch's arrays and results */
} gd_item;

typedef struct gd_desc { uint64_t in, out, n, size; int in_din, in_scr, out_scr; } gd_desc;  /* copy / (bit)unshuffle */

/* One batch in flight: its buffers, stream and events, and what checking its
 * results needs. A feeder has GD_MAX_SLOTS per device (FERRY_GPU_SLOTS of them
 * used, default 4), so that it reads and frames the next batches while the
 * earlier ones decode on their own streams: nvCOMP decodes a chunk per
 * thread block, so its rate is the number of chunks in flight. */
typedef struct gd_slot {
    uint8_t *h; size_t hcap; int hpinned;         /* packed chunks, arrays, descriptors (pinned, or plain: hplain) */
    uint8_t *hres; size_t hres_cap; int hres_pinned; /* statuses, sizes, checks back from the device */
    uint8_t *hcpu; size_t hcpu_cap; int hcpu_pinned; /* chunks decoded on the CPU, before their copy */
    CUdeviceptr din, dres, dtemp, dscr, darr;     /* darr: a cooperative batch's arrays (din holds its payloads) */
    size_t din_cap, dres_cap, dtemp_cap, dscr_cap, darr_cap;
    CUstream stream;
    CUevent dec;         /* recorded after the decode and the results' copy back */
    CUevent done;        /* recorded after the batch's last device work (placement) */
    int busy;            /* done recorded: the device may still read its buffers */
    int open;            /* enqueued, results not yet checked (finish_batch) */
    gd_chunk *ch; size_t ch_cap;
    gd_item *it; size_t it_n, it_cap;
    gd_desc *cp; size_t cp_n, cp_cap;   /* copies before decoding (blosc raw streams, memcpyed frames) */
    gd_desc *un; size_t un_n, un_cap;   /* unshuffles after decoding */
    gd_desc *bu; size_t bu_n, bu_cap;   /* blosc bit-unshuffles after decoding */
    /* the batch in it */
    int dev, kernels, any_gpu, flying;
    size_t n;
    gd_queue *q;         /* its queue (the job's): a shared one counts what the GPU holds */
    uint64_t file_bytes, res_size, res_adler, cpu_fallbacks;
    uint64_t hsize;      /* bytes of h the chunks take (the arrays follow) */
    int hplain;          /* h is plain host memory: what goes up from it passes the feeder's ring (up_copy) */
} gd_slot;

typedef struct gd_dev {
    gd_slot sl[GD_MAX_SLOTS];
    int cur;                                       /* the slot the next batch takes */
    uint8_t *hfb; size_t hfb_cap; int hfb_pinned;  /* one chunk the CPU decodes after nvCOMP failed it */
} gd_dev;

/* A feeder's pinned ring for one device: two buffers of ring_piece() bytes
 * that pieces of plain host memory pass through on their way up, each
 * reused once the copy from it is done (its event). */
typedef struct gd_ring {
    uint8_t *b[2]; size_t cap[2]; int pinned[2];
    CUevent ev[2];
    int used[2];         /* ev recorded after a copy from b: wait before refilling */
    int next;
} gd_ring;

struct ferry_gpudecode_worker {
    gd_dev dev[FERRY_MAX_DEVICES];
    gd_ring ring[FERRY_MAX_DEVICES];
    ferry_blosc_stream *bs;             /* one frame's streams while it is parsed */
};

enum { K_GPU = 0, K_CPU = 1, K_FILL = 2, K_DONE = 3 /* nvCOMP failed it, the CPU's result is in place */ };

/* Slots a feeder (per-feeder batches) or a device's set (cooperative calls)
 * uses: FERRY_GPU_SLOTS (1 .. GD_MAX_SLOTS), default 4. */
static int gd_slots(const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_SLOTS");
    int v = s && *s ? atoi(s) : GD_SLOTS_DEFAULT;
    return v < 1 ? 1 : v > GD_MAX_SLOTS ? GD_MAX_SLOTS : v;
}
#define MAX_BLOSC_STREAMS 65536

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
static _Thread_local ferry_decode_trace *tl_trace;
/* The context of the job the calling feeder runs (set with tl_trace): an
 * allocation that finds the device full gives back the context's idle call
 * slots first (pool_trim), as a caching allocator does. */
static _Thread_local ferry_ctx *tl_ctx;
static size_t pool_trim(ferry_ctx *ctx, int dev);

/* Device memory of at least n bytes (contents not kept) on device dev,
 * which is current. dev_grow doubles (per-feeder batches vary in size); dev_fit takes
 * n rounded up to 2 MiB (to 64 KiB up to 1 MiB): a call slot is grown once to the job's largest
 * call, and doubling a 128 MiB call's payloads (plus its arrays) made 256 MiB
 * per slot, 8 slots each of payloads and of nvCOMP's temp space. */
static int dev_alloc(int dev, CUdeviceptr *p, size_t *cap, size_t n, int fit) {
    if (*cap >= n && *p) return 0;
    uint64_t t0 = tl_trace ? ferry_dt_now() : 0;
    if (tl_trace) atomic_fetch_add(&tl_trace->allocs, 1);
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
    if (r == FERRY_CU_ERROR_OUT_OF_MEMORY && tl_ctx) {
        pool_trim(tl_ctx, dev);
        r = cu->MemAlloc(p, nc);
    }
    if (r) {
        *p = 0;
        size_t fr = 0, tot = 0;
        (void)dev_mem(dev, &fr, &tot);
        return ferry_seterr(FERRY_ENOMEM,
                            "GPU decode: cuMemAlloc(%zu) on device %d: %s (%zu MiB free): a job's calls need device memory "
                            "of about 5 x their decoded bytes; lower it with smaller jobs (fewer batches a read), "
                            "FERRY_GPU_SLOTS=1, or decode on the CPU (decode=\"cpu\", FERRY_DECODE=cpu)",
                            nc, dev, ferry_cuda_errstr(r), fr >> 20);
    }
    *cap = nc;
    ferry_dt_lap(tl_trace, FERRY_DT_ALLOC, &t0);
    return 0;
}
static int dev_grow(int dev, CUdeviceptr *p, size_t *cap, size_t n) { return dev_alloc(dev, p, cap, n, 0); }
static int dev_fit(int dev, CUdeviceptr *p, size_t *cap, size_t n) { return dev_alloc(dev, p, cap, n, 1); }

/* ferry_worker_grow (per worker, reused: it allocates only to grow), timed for the trace. */
static int host_grow(ferry_worker *w, int d, uint8_t **buf, size_t *cap, int *pinned, size_t n) {
    if (!tl_trace || (*cap >= n && *buf && *pinned)) return ferry_worker_grow(w, d, buf, cap, pinned, n);
    uint64_t t0 = ferry_dt_now();
    uint8_t *before = *buf;
    int rc = ferry_worker_grow(w, d, buf, cap, pinned, n);
    if (*buf != before) { atomic_fetch_add(&tl_trace->allocs, 1); ferry_dt_lap(tl_trace, FERRY_DT_ALLOC, &t0); }
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
static int stage_ring(ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_STAGE");
    if (s && strcasecmp(s, "ring") == 0) return 1;
    if (s && strcasecmp(s, "auto") == 0) return pool_first_coop_job(ctx);
    return 0;
}
static size_t ring_piece(const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_RING");
    int64_t v = s && *s ? ferry_knob_bytes(s) : -1;
    return v >= (64 << 10) ? (size_t)v : v >= 0 ? (size_t)64 << 10 : (size_t)8 << 20;
}

/* n bytes of slot g's host memory at src up to dst on stream s, which is
 * current (the device too): straight from src when it is pinned staging,
 * else through the calling worker's ring (src may be reused on return). */
static int up_copy(ferry_worker *w, gd_slot *g, CUdeviceptr dst, const uint8_t *src, size_t n, CUstream s) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    CUresult r;
    if (!g->hplain) {
        if ((r = cu->MemcpyHtoDAsync(dst, src, n, s))) return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(r));
        return 0;
    }
    gd_ring *R = &w->gpu->ring[g->dev];
    const size_t piece = ring_piece(w->ctx);
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
        if ((rc = host_grow(w, g->dev, &R->b[i], &R->cap[i], &R->pinned[i], piece)) < 0) return rc;
        memcpy(R->b[i], src, k);
        if ((r = cu->MemcpyHtoDAsync(dst, R->b[i], k, s)) || (r = cu->EventRecord(R->ev[i], s)))
            return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(r));
        R->used[i] = 1;
        src += k; dst += k; n -= k;
    }
    return 0;
}

/* Room for one more element in a growing array. */
static int push(void **arr, size_t *n, size_t *cap, size_t size) {
    if (*n < *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 256;
    void *p = realloc(*arr, nc * size);
    if (!p) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    *arr = p;
    *cap = nc;
    return 0;
}

static uint64_t up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* ---- device placement: scratch -> destination box (place.c walks it) ---------------- */
/* The tile-scatter descriptor (16 u64, ferry_cuda_place_batch) of a chunk
 * at src whose box goes to dst; 0 when the box needs more than 3 dimensions
 * of runs (then ferry_place_device's copies do it). */
static int place_desc(uint64_t *q, CUdeviceptr dst, CUdeviceptr src, const ferry_place *place, uint64_t decoded) {
    memset(q, 0, 16 * sizeof *q);
    q[3] = q[4] = q[5] = 1;
    if (!place) { q[0] = src; q[1] = dst; q[2] = decoded; return 1; }
    ferry_place p;
    int m = ferry_place_normalize(place, &p);
    for (int k = 0; k < place->ndim; k++) if (place->count[k] == 0) { q[2] = 0; q[0] = src; q[1] = dst; return 1; }
    if (m == 0) { p.ndim = m = 1; p.count[0] = 1; p.src_stride[0] = p.dst_stride[0] = p.itemsize; }
    int inner = p.src_stride[m - 1] == (int64_t)p.itemsize && p.dst_stride[m - 1] == (int64_t)p.itemsize;
    int rows = inner ? m - 1 : m;
    if (rows > 3) return 0;
    q[0] = src + p.src_offset;
    q[1] = dst;
    q[2] = inner ? p.count[m - 1] * p.itemsize : p.itemsize;
    for (int k = 0; k < rows; k++) {   /* right-aligned into the three row dimensions */
        int slot = 3 - rows + k;
        q[3 + slot] = p.count[k];
        q[6 + slot] = (uint64_t)p.src_stride[k];
        q[9 + slot] = (uint64_t)p.dst_stride[k];
    }
    return 1;
}

/* A placement that copies the whole decoded chunk to one contiguous run. */
static int place_is_contiguous(const ferry_place *place, uint64_t decoded) {
    if (!place) return 1;
    ferry_place p;
    int m = ferry_place_normalize(place, &p);
    if (place->src_offset) return 0;
    uint64_t elems = 1;
    for (int k = 0; k < place->ndim; k++) elems *= place->count[k];
    if (elems * place->itemsize != decoded) return 0;
    return m == 0 || (m == 1 && p.src_stride[0] == (int64_t)p.itemsize && p.dst_stride[0] == (int64_t)p.itemsize);
}

/* ---- the batch ------------------------------------------------------------------- */
static void count_stats(ferry_ctx *ctx, uint64_t gpu_bytes, uint64_t gpu_chunks, uint64_t fallbacks, uint64_t decoded) {
    pthread_mutex_lock(&ctx->stats_lock);
    ctx->stats.gpu_decoded_bytes += gpu_bytes;
    ctx->stats.gpu_chunks += gpu_chunks;
    ctx->stats.gpu_batches += 1;
    ctx->stats.gpu_cpu_fallbacks += fallbacks;
    ctx->stats.decoded_bytes += decoded;
    pthread_mutex_unlock(&ctx->stats_lock);
}

/* Prefix the current message with the chunk's file, variable, byte and codec. */
static int chunk_err(int code, const ferry_extent *e, const char *path, const chain_info *ci) {
    if (e->label)
        return ferry_preerr(code, "%s: variable %s: chunk at byte %llu (%llu bytes, %s)", path, e->label,
                            (unsigned long long)e->offset, (unsigned long long)e->length, ferry_codec_name(ci->codec));
    return ferry_preerr(code, "%s: chunk at byte %llu (%llu bytes, %s)", path, (unsigned long long)e->offset,
                        (unsigned long long)e->length, ferry_codec_name(ci->codec));
}

static const char *ext_path(const ferry_extent *e) { return e->file ? e->file->path : e->path ? e->path : "(chunk)"; }

/* The whole chain on the CPU, into out (decoded_size bytes). */
static int cpu_decode(ferry_worker *w, const ferry_extent *e, const uint8_t *in, uint8_t *out) {
    int64_t r = ferry_decode(e->codecs, e->ncodecs, in, e->length, out, e->decoded_size, &w->scratch);
    if (r < 0) return (int)r;
    if ((uint64_t)r != e->decoded_size)
        return ferry_seterr(FERRY_ECODEC, "decoded %lld bytes where %llu were expected", (long long)r,
                            (unsigned long long)e->decoded_size);
    return 0;
}

static void fill_pattern(uint8_t *out, uint64_t n, const ferry_extent *e) {
    unsigned size = e->place ? e->place->itemsize : 1;
    if (size == 0 || size > 16) size = 1;
    for (uint64_t i = 0; i < n; i++) out[i] = e->fill[i % size];
}

static int add_desc(gd_desc **arr, size_t *n, size_t *cap, gd_desc d) {
    int rc = push((void **)arr, n, cap, sizeof **arr);
    if (rc < 0) return rc;
    (*arr)[(*n)++] = d;
    return 0;
}

/* Read every chunk of the batch into its slot of h. Files named by path come
 * from the context's open-file cache, as for every other reader (a batch
 * used to open and close each chunk's file itself). */
static int read_chunks(ferry_worker *w, ferry_job *j, gd_slot *g, size_t k0, size_t k1, uint64_t *file_bytes) {
    gd_chunk *ch = g->ch;
    for (size_t k = k0; k < k1; k++) {
        const ferry_extent *e = &j->ext[ch[k].ext];
        ferry_file *f = e->file;
        if (!f) {
            int rc = ferry_path_file(w, j, e, &f);
            if ((rc == -ENOENT || rc == -ENOTDIR) && (e->flags & FERRY_EXTENT_MISSING_FILLS)) {
                ferry_clearerr();   /* an absent chunk: its box gets the fill value */
                ch[k].kind = K_FILL;
                continue;
            }
            if (rc < 0) return ferry_preerr(rc, "%s", e->path);
        }
        int64_t got = ferry_file_read(f, g->h + ch[k].slot, e->length, e->offset);
        if (got < 0) return ferry_preerr((int)got, "%s: byte %llu", f->path, (unsigned long long)e->offset);
        if ((uint64_t)got < e->length)
            return ferry_seterr(FERRY_ESHORT, "%s: file ends at byte %llu but the chunk at byte %llu has %llu bytes",
                                f->path, (unsigned long long)(e->offset + (uint64_t)got), (unsigned long long)e->offset,
                                (unsigned long long)e->length);
        *file_bytes += (uint64_t)got;
        /* the CPU's checks (crc32c, fletcher32 over the encoded bytes) here,
         * by the reader, so that a cooperative call's checks are spread over
         * every feeder (~280 us per 1 MiB crc32c on one core) */
        size_t len = e->length;
        for (int i = 0; i < ch[k].ci.ncheck; i++) {
            int rc = ferry_codecs_verify_trailer(e->codecs[i].id, g->h + ch[k].slot, &len);
            if (rc < 0) return chunk_err(rc, e, ext_path(e), &ch[k].ci);
        }
        ch[k].len = len;
    }
    return 0;
}

/* Decide, for one chunk read into h, how the GPU decodes it: its items,
 * copies and unshuffles, its output and final places (scratch as offsets
 * from *scr). K_CPU when the GPU cannot take it; an error when it is corrupt. */
static int classify(struct ferry_gpudecode_worker *gw, gd_slot *g, const ferry_nvcomp_api *nv, const ferry_extent *e,
                    gd_chunk *c, uint32_t ci_idx, int kernels, uint64_t *scr) {
    CUdeviceptr dst = (CUdeviceptr)(uintptr_t)e->dst.ptr + e->dst_offset;
    int contig = place_is_contiguous(e->place, e->decoded_size);
    size_t len = c->len;   /* checked by read_chunks */
    const uint8_t *p = g->h + c->slot;
    int rc;
    ferry_blosc_frame bf;
    memset(&bf, 0, sizeof bf);
    int unshuffle_size = 0;   /* element size of the unshuffle after decoding, 0 none */
    if (c->ci.codec == FERRY_CODEC_BLOSC) {
        if (!gw->bs && !(gw->bs = malloc(MAX_BLOSC_STREAMS * sizeof *gw->bs))) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        rc = ferry_frame_blosc(p, len, e->decoded_size, &bf, gw->bs, MAX_BLOSC_STREAMS);
        if (rc == 0 && (c->ci.shuffle || bf.inner == FERRY_CODEC_ZLIB))
            rc = FERRY_EUNSUPPORTED;   /* a shuffle after blosc; zlib inside blosc (unaligned payloads) */
        if (bf.shuffle || bf.bitshuffle) unshuffle_size = (int)bf.typesize;
    } else {
        rc = ferry_frame_parse(c->ci.codec, p, len, e->decoded_size, &c->fr);
        if (rc == 0 && c->fr.check == FERRY_FRAME_CHECK_CRC32) rc = FERRY_EUNSUPPORTED;   /* no GPU CRC-32 (gzip) */
        unshuffle_size = (int)c->ci.shuffle;
    }
    if (rc == FERRY_EUNSUPPORTED) { ferry_clearerr(); c->kind = K_CPU; }
    else if (rc < 0) return rc;
    int need_kernels = unshuffle_size || c->ci.swap || c->fr.check == FERRY_FRAME_CHECK_ADLER32 ||
                       (c->ci.codec == FERRY_CODEC_BLOSC && (bf.memcpyed || bf.nstreams));
    if (c->kind == K_GPU && need_kernels && !kernels) c->kind = K_CPU;   /* no embedded kernels: the CPU does it all */
    int alg = c->ci.codec == FERRY_CODEC_BLOSC ? (bf.inner == FERRY_CODEC_ZSTD ? FERRY_NVCOMP_ZSTD : FERRY_NVCOMP_LZ4) : c->ci.alg;
    const ferry_nvcomp_align *al = &nv->alg[alg].align;
    if (c->kind == K_GPU) {   /* inputs as nvCOMP wants them aligned */
        if (c->ci.codec == FERRY_CODEC_BLOSC) {
            for (size_t i = 0; i < bf.nstreams; i++)
                if (!gw->bs[i].raw && ((c->slot + gw->bs[i].src_off) % al->input || gw->bs[i].dst_off % al->output)) c->kind = K_CPU;
        } else if ((c->slot + c->fr.payload_off) % al->input) {
            c->kind = K_CPU;   /* an unusual header length: not worth a copy */
        }
    }
    /* where it ends: dst when the chunk is one contiguous run of it, aligned
     * for the swap kernel; else scratch, placed afterwards */
    int fin_dst = contig && (!c->ci.swap || dst % c->ci.swap == 0);
    if (c->kind == K_GPU && !unshuffle_size && dst % al->output) fin_dst = 0;   /* nvCOMP writes there itself */
    if (fin_dst) c->fin = dst;
    else { c->fin = *scr; c->fin_scr = 1; *scr += up(e->decoded_size, 256); c->placed = 1; }
    if (c->kind != K_GPU) return 0;
    if (unshuffle_size) { c->out = *scr; c->out_scr = 1; *scr += up(e->decoded_size, 256); }
    else { c->out = c->fin; c->out_scr = c->fin_scr; }
    /* nvCOMP items, copies, unshuffles (addresses relative to out/fin/din: fixed up later) */
    c->item0 = g->it_n;
    if (c->ci.codec != FERRY_CODEC_BLOSC) {
        if ((rc = push((void **)&g->it, &g->it_n, &g->it_cap, sizeof *g->it)) < 0) return rc;
        g->it[g->it_n++] = (gd_item){ci_idx, alg, c->slot + c->fr.payload_off, c->fr.payload_len, 0, e->decoded_size, 0};
    } else if (bf.memcpyed) {
        if ((rc = add_desc(&g->cp, &g->cp_n, &g->cp_cap, (gd_desc){c->slot + 16, 0, e->decoded_size, 1, 1, 0, 0})) < 0) return rc;
        g->cp[g->cp_n - 1].out = ci_idx;   /* resolved to the chunk's fin below (memcpyed frames are not shuffled) */
        g->cp[g->cp_n - 1].out_scr = -1;
        unshuffle_size = 0;
    } else {
        for (size_t i = 0; i < bf.nstreams; i++) {
            const ferry_blosc_stream *st = &gw->bs[i];
            if (st->raw) {
                if ((rc = add_desc(&g->cp, &g->cp_n, &g->cp_cap, (gd_desc){c->slot + st->src_off, st->dst_off, st->dst_len, 1, 1, 0, 0})) < 0)
                    return rc;
                g->cp[g->cp_n - 1].out_scr = -2 - (int)ci_idx;   /* relative to the chunk's out */
                continue;
            }
            if ((rc = push((void **)&g->it, &g->it_n, &g->it_cap, sizeof *g->it)) < 0) return rc;
            g->it[g->it_n++] = (gd_item){ci_idx, alg, c->slot + st->src_off, st->src_len, st->dst_off, st->dst_len, 0};
        }
    }
    c->nitems = g->it_n - c->item0;
    if (unshuffle_size) {
        if (c->ci.codec == FERRY_CODEC_BLOSC) {   /* blosc (bit)shuffles each block by itself */
            for (uint64_t b = 0; b < bf.nblocks; b++) {
                uint64_t bsize = FERRY_MIN(bf.blocksize, bf.nbytes - b * bf.blocksize);
                gd_desc dd = {b * bf.blocksize, b * bf.blocksize, bsize, (uint64_t)unshuffle_size, 0, (int)ci_idx, 0};
                /* as blosc.c's unfilter: a format version <= 2 block whose element
                 * count is not a multiple of 8 was not bitshuffled, and is copied
                 * (byte unshuffle of size 1); any other bitshuffled block is
                 * bit-unshuffled, 1-byte elements included */
                int copy_only = bf.bitshuffle && bf.version <= 2 && (bsize / bf.typesize) % 8;
                if (copy_only) dd.size = 1;
                if (bf.bitshuffle && !copy_only) rc = add_desc(&g->bu, &g->bu_n, &g->bu_cap, dd);
                else rc = add_desc(&g->un, &g->un_n, &g->un_cap, dd);
                if (rc < 0) return rc;
            }
        } else {
            if ((rc = add_desc(&g->un, &g->un_n, &g->un_cap, (gd_desc){0, 0, e->decoded_size, (uint64_t)unshuffle_size, 0, 0, 0})) < 0) return rc;
            g->un[g->un_n - 1].in_scr = (int)ci_idx;
        }
    }
    return 0;
}

/* A slot's stream and events on device d (the device is current). */
static int slot_ready(gd_slot *g, int d) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    CUresult r = 0;
    if (!g->stream) r = cu->StreamCreate(&g->stream, FERRY_CU_STREAM_NON_BLOCKING);
    if (!r && !g->dec) r = cu->EventCreate(&g->dec, FERRY_CU_EVENT_DISABLE_TIMING);
    if (!r && !g->done) r = cu->EventCreate(&g->done, FERRY_CU_EVENT_DISABLE_TIMING);
    if (r) return ferry_seterr(FERRY_ECUDA, "device %d: GPU decode stream/events: %s", d, ferry_cuda_errstr(r));
    return 0;
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
uint64_t ferry_gpudecode_slot_room(uint64_t len) { return up(len, 8) + 72; }

static int line_slots(const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_LINE");
    return !(s && (strcasecmp(s, "off") == 0 || strcmp(s, "0") == 0));
}

/* A batch on slot g, in three steps: batch_layout (its stream and events,
 * the slot's previous batch placed, every chunk's place in pinned staging h),
 * read_chunks (any feeder, any range of its chunks), batch_launch (check and
 * frame every chunk on the CPU, enqueue the copy up, the nvCOMP calls, the
 * filters and the results' copy back on the slot's stream, then decode on
 * the CPU the chunks the GPU does not take). finish_batch completes it.
 * min_h / min_din: sizes to grow h and din to at least (cooperative slots are
 * grown once to the job's largest call, 0 otherwise). */
static int batch_layout(ferry_worker *w, ferry_job *j, gd_queue *Q, const uint32_t *idx, size_t n, gd_slot *g,
                        ferry_decode_trace *tr, uint64_t min_h, uint64_t min_din) {
    uint64_t tlap = tr ? ferry_dt_now() : 0;
    const int d = Q->dev;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    int rc = ferry_cuda_use_device(d);
    if (rc < 0) return rc;
    if ((rc = slot_ready(g, d)) < 0) return rc;
    CUresult r;
    if (g->busy) {   /* the slot's previous batch may still be placed from its buffers */
        if ((r = cu->EventSynchronize(g->done))) return ferry_seterr(FERRY_ECUDA, "device %d: GPU decode failed: %s", d, ferry_cuda_errstr(r));
        g->busy = 0;
    }
    ferry_dt_lap(tr, FERRY_DT_PREV, &tlap);
    ferry_dt_batch_begin(tr);
    g->dev = d;
    g->n = n;
    g->q = Q;
    g->file_bytes = g->cpu_fallbacks = 0;
    g->flying = 0;
    g->open = 1;   /* from here on finish_batch or the feeder's failure path ends it */
    if (g->ch_cap < n) {
        gd_chunk *c = realloc(g->ch, n * sizeof *c);
        if (!c) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        g->ch = c;
        g->ch_cap = n;
    }
    gd_chunk *ch = g->ch;
    g->kernels = ferry_cuda_kernels_ready(d);
    g->it_n = g->cp_n = g->un_n = g->bu_n = 0;

    /* slots: where each chunk's framed bytes go (intact, for the CPU's checks) */
    const ferry_nvcomp_api *nv = ferry_nvcomp_load(NULL);
    const int line = line_slots(j->ctx);
    uint64_t hsize = 0;
    for (size_t k = 0; k < n; k++) {
        const ferry_extent *e = &j->ext[idx[k]];
        memset(&ch[k], 0, sizeof ch[k]);
        ch[k].ext = idx[k];
        gpu_chain(e, &ch[k].ci);
        unsigned hdr = ch[k].ci.codec == FERRY_CODEC_ZLIB ? 2 : ch[k].ci.codec == FERRY_CODEC_LZ4 ? 4 : 0;
        unsigned align = 8;   /* blosc's inner streams, and any codec nvCOMP does not say */
        if (nv && ch[k].ci.alg < FERRY_NVCOMP_NALG && nv->alg[ch[k].ci.alg].align.input) align = (unsigned)nv->alg[ch[k].ci.alg].align.input;
        ch[k].slot = line ? ferry_gpudecode_slot(hsize, e->offset, hdr, align) : hsize + (8 - hdr) % 8;
        hsize = line ? ch[k].slot + e->length : hsize + up(e->length + 8, 8);
    }
    g->hsize = hsize;
    if ((rc = host_grow(w, g->hplain ? -1 : d, &g->h, &g->hcap, &g->hpinned, FERRY_MAX(hsize, min_h) ? FERRY_MAX(hsize, min_h) : 1)) < 0)
        return rc;
    if (min_din && (rc = dev_fit(g->dev, &g->din, &g->din_cap, FERRY_MAX(hsize, min_din))) < 0) return rc;
    ferry_dt_lap(tr, FERRY_DT_LAYOUT, &tlap);
    return 0;
}
/* The rest of a batch whose chunks are all in h (batch_layout says what).
 * coop: the payloads are on the device already (each reader copied its
 * range up); only the arrays go up, into darr. */
static int batch_launch(ferry_worker *w, ferry_job *j, gd_slot *g, ferry_decode_trace *tr, int coop) {
    uint64_t tlap = tr ? ferry_dt_now() : 0;
    const int d = g->dev;
    const size_t n = g->n;
    const uint64_t hsize = g->hsize;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    const ferry_nvcomp_api *nv = ferry_nvcomp_load(NULL);
    struct ferry_gpudecode_worker *gw = w->gpu;
    gd_chunk *ch = g->ch;
    const int kernels = g->kernels;
    CUstream s = g->stream;
    CUresult r;
    int rc = ferry_cuda_use_device(d);
    if (rc < 0) return rc;


    /* CPU checks and framing: items, descriptors, outputs */
    uint64_t scr = 0, cpu_total = 0;
    for (size_t k = 0; k < n; k++) {
        gd_chunk *c = &ch[k];
        const ferry_extent *e = &j->ext[c->ext];
        if (c->kind == K_GPU && (rc = classify(gw, g, nv, e, c, (uint32_t)k, kernels, &scr)) < 0)
            return chunk_err(rc, e, ext_path(e), &c->ci);
        if (c->kind == K_GPU) continue;
        if (c->kind == K_FILL) {   /* classify chose the others' places */
            CUdeviceptr dst = (CUdeviceptr)(uintptr_t)e->dst.ptr + e->dst_offset;
            if (place_is_contiguous(e->place, e->decoded_size)) c->fin = dst;
            else { c->fin = scr; c->fin_scr = 1; scr += up(e->decoded_size, 256); c->placed = 1; }
        }
        c->cpu_pos = cpu_total;
        cpu_total += up(e->decoded_size, 64);
    }
    if (scr && (rc = dev_grow(g->dev, &g->dscr, &g->dscr_cap, scr)) < 0) return rc;
    for (size_t k = 0; k < n; k++) {
        if (ch[k].out_scr) ch[k].out += g->dscr;
        if (ch[k].fin_scr) ch[k].fin += g->dscr;
    }
    ferry_dt_lap(tr, FERRY_DT_FRAME, &tlap);

    /* the arrays nvCOMP reads, per algorithm, then the descriptors, after the payloads */
    size_t na[FERRY_NVCOMP_NALG] = {0, 0, 0}, q0[FERRY_NVCOMP_NALG];
    uint64_t max_out[FERRY_NVCOMP_NALG] = {0, 0, 0}, tot_out[FERRY_NVCOMP_NALG] = {0, 0, 0};
    for (size_t i = 0; i < g->it_n; i++) {
        gd_item *it = &g->it[i];
        na[it->alg]++;
        tot_out[it->alg] += it->out_len;
        if (it->out_len > max_out[it->alg]) max_out[it->alg] = it->out_len;
    }
    size_t nitems = g->it_n, q = 0;
    for (int a = 0; a < FERRY_NVCOMP_NALG; a++) { q0[a] = q; q += na[a]; }
    const uint64_t arr = up(hsize, 64);
    const uint64_t a_cp = arr + 32 * (uint64_t)nitems, a_un = a_cp + 32 * (uint64_t)g->cp_n;
    const uint64_t a_bu = a_un + 32 * (uint64_t)g->un_n, htotal = a_bu + 32 * (uint64_t)g->bu_n;
    const uint64_t res_size = g->res_size = up(4 * (uint64_t)nitems, 8);
    const uint64_t res_adler = g->res_adler = res_size + 8 * (uint64_t)nitems;
    const uint64_t res_total = res_adler + 4 * (uint64_t)nitems + 8;
    int any_gpu = g->any_gpu = nitems || g->cp_n || g->un_n || g->bu_n;
    size_t temp = 0;
    ferry_nvcomp_opts opts;
    memset(&opts, 0, sizeof opts);
    if (any_gpu) {
        if (htotal > g->hcap) {   /* the arrays did not fit behind the payloads: grow, keeping the chunks */
            if (coop && (r = cu->StreamSynchronize(s)))   /* the readers' copies up from h may be pending */
                return ferry_seterr(FERRY_ECUDA, "device %d: GPU decode failed: %s", d, ferry_cuda_errstr(r));
            uint8_t *nb = NULL; size_t ncap = 0; int npin = 0;
            if ((rc = host_grow(w, g->hplain ? -1 : d, &nb, &ncap, &npin, htotal)) < 0) return rc;
            memcpy(nb, g->h, hsize);
            uint8_t *ob = g->h; size_t ocap = g->hcap; int opin = g->hpinned;
            g->h = nb; g->hcap = ncap; g->hpinned = npin;
            ferry_worker_free_host(ob, ocap, opin);
        }
        for (int a = 0; a < FERRY_NVCOMP_NALG; a++) {
            if (!na[a]) continue;
            size_t t = 0;
            ferry_nvcomp_status_t st = ferry_nvcomp_temp_size(nv, a, na[a], max_out[a], opts, &t, tot_out[a], s);
            if (st) return ferry_seterr(FERRY_ECUDA, "nvCOMP batched decompress: temp size for %zu chunks: %s", na[a], ferry_nvcomp_errstr(st));
            if (t > temp) temp = t;   /* the calls run one after another on one stream: one temp serves all */
        }
        /* device arrays: behind the payloads in din, or (coop: din holds the
         * payloads already) in darr */
        if (coop ? (rc = dev_grow(g->dev, &g->darr, &g->darr_cap, htotal - arr)) < 0 : (rc = dev_grow(g->dev, &g->din, &g->din_cap, htotal)) < 0)
            return rc;
        const CUdeviceptr abase = coop ? g->darr : g->din + arr;
        if ((rc = dev_grow(g->dev, &g->dres, &g->dres_cap, res_total)) < 0) return rc;
        if (temp && (rc = dev_grow(g->dev, &g->dtemp, &g->dtemp_cap, temp)) < 0) return rc;
        if ((rc = host_grow(w, d, &g->hres, &g->hres_cap, &g->hres_pinned, res_total)) < 0) return rc;
        /* items: q ordered by algorithm; four arrays of nitems u64 entries */
        uint64_t *in_ptrs = (uint64_t *)(g->h + arr), *in_bytes = in_ptrs + nitems, *out_ptrs = in_bytes + nitems,
                 *out_caps = out_ptrs + nitems;
        size_t next[FERRY_NVCOMP_NALG];
        memcpy(next, q0, sizeof next);
        for (size_t i = 0; i < nitems; i++) {
            gd_item *it = &g->it[i];
            it->q = next[it->alg]++;
            in_ptrs[it->q] = g->din + it->in_pos;
            in_bytes[it->q] = it->in_len;
            out_ptrs[it->q] = ch[it->chunk].out + it->out_off;
            out_caps[it->q] = it->out_len;
        }
        uint64_t *cp = (uint64_t *)(g->h + a_cp), *un = (uint64_t *)(g->h + a_un), *bu = (uint64_t *)(g->h + a_bu);
        for (size_t i = 0; i < g->cp_n; i++) {
            const gd_desc *dd = &g->cp[i];
            uint64_t out = dd->out_scr == -1 ? ch[dd->out].fin : ch[-2 - dd->out_scr].out + dd->out;
            cp[4 * i] = g->din + dd->in; cp[4 * i + 1] = out; cp[4 * i + 2] = dd->n; cp[4 * i + 3] = 1;
        }
        for (size_t i = 0; i < g->un_n; i++) {
            const gd_desc *dd = &g->un[i];
            un[4 * i] = ch[dd->in_scr].out + dd->in; un[4 * i + 1] = ch[dd->in_scr].fin + dd->out;
            un[4 * i + 2] = dd->n; un[4 * i + 3] = dd->size;
        }
        for (size_t i = 0; i < g->bu_n; i++) {
            const gd_desc *dd = &g->bu[i];
            bu[4 * i] = ch[dd->in_scr].out + dd->in; bu[4 * i + 1] = ch[dd->in_scr].fin + dd->out;
            bu[4 * i + 2] = dd->n; bu[4 * i + 3] = dd->size;
        }
        /* one copy up; copies, one nvCOMP call per algorithm, Adler-32s,
         * unshuffles, byteswaps; one copy of the results back */
        if (tr) ferry_dt_mark(&tr->t_h2d0, ferry_dt_now());
        if ((rc = coop ? up_copy(w, g, g->darr, g->h + arr, htotal - arr, s) : up_copy(w, g, g->din, g->h, htotal, s)) < 0) return rc;
        if (g->cp_n && (rc = ferry_cuda_unshuffle_batch(d, abase + (a_cp - arr), g->cp_n, 0, s)) < 0) return rc;
        if (tr && nitems) { uint64_t t = ferry_dt_now(); ferry_dt_mark(&tr->t_nv0, t); ferry_dt_mark_max(&tr->t_nv1, t); }
        for (int a = 0; a < FERRY_NVCOMP_NALG; a++) {
            if (!na[a]) continue;
            CUdeviceptr base = abase;
            ferry_nvcomp_status_t st = nv->alg[a].DecompressAsync(
                (const void *const *)(uintptr_t)(base + 8 * q0[a]), (const size_t *)(uintptr_t)(base + 8 * (nitems + q0[a])),
                (const size_t *)(uintptr_t)(base + 8 * (3 * nitems + q0[a])), (size_t *)(uintptr_t)(g->dres + res_size + 8 * q0[a]),
                na[a], temp ? (void *)(uintptr_t)g->dtemp : NULL, temp, (void *const *)(uintptr_t)(base + 8 * (2 * nitems + q0[a])),
                opts, (ferry_nvcomp_status_t *)(uintptr_t)(g->dres + 4 * q0[a]), s);
            if (st)
                return ferry_seterr(FERRY_ECUDA, "nvCOMP batched %s decompress of %zu chunks: %s",
                                    a == FERRY_NVCOMP_ZSTD ? "zstd" : a == FERRY_NVCOMP_LZ4 ? "LZ4" : "Deflate", na[a], ferry_nvcomp_errstr(st));
            if (a == FERRY_NVCOMP_DEFLATE &&
                (rc = ferry_cuda_adler32_batch(d, base + 8 * (2 * nitems + q0[a]), base + 8 * (3 * nitems + q0[a]),
                                               g->dres + res_adler + 4 * q0[a], na[a], s)) < 0)
                return rc;
        }
        if (g->un_n && (rc = ferry_cuda_unshuffle_batch(d, abase + (a_un - arr), g->un_n, 0, s)) < 0) return rc;
        if (g->bu_n && (rc = ferry_cuda_unshuffle_batch(d, abase + (a_bu - arr), g->bu_n, 1, s)) < 0) return rc;
        for (size_t k = 0; k < n; k++)
            if (ch[k].kind == K_GPU && ch[k].ci.swap &&
                (rc = ferry_cuda_byteswap(d, ch[k].fin, j->ext[ch[k].ext].decoded_size / ch[k].ci.swap, ch[k].ci.swap, s)) < 0)
                return rc;
        if ((r = cu->MemcpyDtoHAsync(g->hres, g->dres, res_total, s)) || (r = cu->EventRecord(g->dec, s)))
            return ferry_seterr(FERRY_ECUDA, "cuMemcpyDtoHAsync: %s", ferry_cuda_errstr(r));
        ferry_dt_in_flight(tr, 1, nitems);
        g->flying = 1;
    }
    ferry_dt_lap(tr, FERRY_DT_ENQUEUE, &tlap);

    /* meanwhile: the chunks the CPU decodes */
    if (cpu_total && (rc = host_grow(w, d, &g->hcpu, &g->hcpu_cap, &g->hcpu_pinned, cpu_total)) < 0) return rc;
    for (size_t k = 0; k < n; k++) {
        gd_chunk *c = &ch[k];
        const ferry_extent *e = &j->ext[c->ext];
        if (c->kind == K_FILL) fill_pattern(g->hcpu + c->cpu_pos, e->decoded_size, e);
        else if (c->kind == K_CPU) {
            if ((rc = cpu_decode(w, e, g->h + c->slot, g->hcpu + c->cpu_pos)) < 0) return chunk_err(rc, e, ext_path(e), &c->ci);
            g->cpu_fallbacks++;
        }
    }
    ferry_dt_lap(tr, FERRY_DT_CPU, &tlap);
    return 0;
}

/* All three steps on one feeder (per-feeder batches: shared queues). */
static int start_batch(ferry_worker *w, ferry_job *j, gd_queue *Q, const uint32_t *idx, size_t n, gd_slot *g,
                       ferry_decode_trace *tr) {
    int rc = batch_layout(w, j, Q, idx, n, g, tr, 0, 0);
    if (rc < 0) return rc;
    uint64_t tlap = tr ? ferry_dt_now() : 0;
    if (tr) ferry_dt_mark(&tr->t_read0, tlap);
    if ((rc = read_chunks(w, j, g, 0, n, &g->file_bytes)) < 0) return rc;
    ferry_dt_lap(tr, FERRY_DT_READ, &tlap);
    if (tr) ferry_dt_mark_max(&tr->t_read1, tlap);
    return batch_launch(w, j, g, tr, 0);
}

/* Second half of the batch in slot g: wait for its decode, check every
 * item's status, size and Adler-32 (the CPU decodes again what fails: its
 * limits, or the corruption it names), then enqueue the CPU-decoded chunks'
 * copies up and the placement of scratch into the destination. Returns the
 * batch's file bytes. */
static int64_t finish_batch(ferry_worker *w, ferry_job *j, gd_slot *g, ferry_decode_trace *tr) {
    uint64_t tlap = tr ? ferry_dt_now() : 0;
    const int d = g->dev;
    const size_t n = g->n;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    gd_dev *gdv = &w->gpu->dev[d];
    gd_chunk *ch = g->ch;
    CUstream s = g->stream;
    CUresult r;
    int rc = ferry_cuda_use_device(d);
    if (rc < 0) return rc;
    uint64_t fallbacks = g->cpu_fallbacks, gpu_bytes = 0, gpu_chunks = 0, dec = 0;
    if (g->any_gpu) {
        r = cu->EventSynchronize(g->dec);
        ferry_dt_lap(tr, FERRY_DT_WAIT, &tlap);
        if (tr) ferry_dt_mark_max(&tr->t_done, ferry_dt_now());
        if (g->flying) { ferry_dt_in_flight(tr, -1, g->it_n); g->flying = 0; }
        if (r) return ferry_seterr(FERRY_ECUDA, "device %d: GPU decode failed: %s", d, ferry_cuda_errstr(r));
        const int32_t *sts = (const int32_t *)g->hres;
        const uint64_t *sizes = (const uint64_t *)(g->hres + g->res_size);
        const uint32_t *adl = (const uint32_t *)(g->hres + g->res_adler);
        for (size_t k = 0; k < n; k++) {
            gd_chunk *c = &ch[k];
            if (c->kind != K_GPU) continue;
            const ferry_extent *e = &j->ext[c->ext];
            const char *why = NULL;
            char buf[96];
            for (size_t i = c->item0; i < c->item0 + c->nitems && !why; i++) {
                const gd_item *it = &g->it[i];
                if (sts[it->q]) why = ferry_nvcomp_errstr(sts[it->q]);
                else if (sizes[it->q] != it->out_len) {
                    snprintf(buf, sizeof buf, "decoded %llu bytes where %llu were expected", (unsigned long long)sizes[it->q],
                             (unsigned long long)it->out_len);
                    why = buf;
                } else if (it->alg == FERRY_NVCOMP_DEFLATE && c->fr.check == FERRY_FRAME_CHECK_ADLER32 && adl[it->q] != c->fr.check_value) {
                    snprintf(buf, sizeof buf, "Adler-32 %08x, the stream says %08x", adl[it->q], c->fr.check_value);
                    why = buf;
                }
            }
            if (!why) { gpu_bytes += e->decoded_size; gpu_chunks++; continue; }
            /* nvCOMP could not, or its output fails the check: the CPU decodes
             * it (nvCOMP's limits) or names the corruption */
            if ((rc = host_grow(w, d, &gdv->hfb, &gdv->hfb_cap, &gdv->hfb_pinned, e->decoded_size)) < 0) return rc;
            if ((rc = cpu_decode(w, e, g->h + c->slot, gdv->hfb)) < 0) {
                ferry_preerr(rc, "nvCOMP: %s; the CPU decoder", why);
                return chunk_err(rc, e, ext_path(e), &c->ci);
            }
            /* the CPU ran the whole chain: its bytes go where the filters' went */
            if ((r = cu->MemcpyHtoDAsync(c->fin, gdv->hfb, e->decoded_size, s)) || (r = cu->StreamSynchronize(s)))
                return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(r));
            c->kind = K_DONE;
            fallbacks++;
        }
    }
    ferry_dt_lap(tr, FERRY_DT_FALLBACK, &tlap);

    /* CPU-decoded chunks up, then scratch placed into the boxes: one tile
     * scatter kernel for the batch (its descriptors through h and din, both
     * free again: the decode is complete), copies where it cannot */
    size_t nplace = 0;
    uint64_t *pd = NULL;
    for (size_t k = 0; k < n; k++) nplace += ch[k].placed;
    if (nplace && g->kernels) {
        if ((rc = host_grow(w, g->hplain ? -1 : d, &g->h, &g->hcap, &g->hpinned, 128 * nplace)) < 0) return rc;
        if ((rc = dev_grow(g->dev, &g->din, &g->din_cap, 128 * nplace)) < 0) return rc;
        pd = (uint64_t *)g->h;
    }
    size_t np = 0;
    for (size_t k = 0; k < n; k++) {
        gd_chunk *c = &ch[k];
        const ferry_extent *e = &j->ext[c->ext];
        dec += e->decoded_size;
        if ((c->kind == K_CPU || c->kind == K_FILL) && (r = cu->MemcpyHtoDAsync(c->fin, g->hcpu + c->cpu_pos, e->decoded_size, s)))
            return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(r));
        if (!c->placed) continue;
        CUdeviceptr base = (CUdeviceptr)(uintptr_t)e->dst.ptr + e->dst_offset;
        if (pd && place_desc(pd + 16 * np, base, c->fin, e->place, e->decoded_size)) { np++; continue; }
        if ((rc = ferry_place_device(cu, s, base, c->fin, 1, e->place, e->decoded_size)) < 0) return rc;
    }
    if (np) {
        if ((rc = up_copy(w, g, g->din, g->h, 128 * np, s)) < 0) return rc;
        if ((rc = ferry_cuda_place_batch(d, g->din, np, s)) < 0) return rc;
    }
    if ((r = cu->EventRecord(g->done, s))) return ferry_seterr(FERRY_ECUDA, "cuEventRecord: %s", ferry_cuda_errstr(r));
    g->open = 0;   /* checked: only on success (a failure leaves it open: the feeder synchronizes it) */
    g->busy = 1;
    if (g->q->shared) atomic_fetch_sub(&g->q->gpu_out, dec);
    atomic_fetch_add(&j->path_bytes[FERRY_PATH_STAGED], g->file_bytes);
    atomic_fetch_add(&j->path_ops[FERRY_PATH_STAGED], n);
    count_stats(w->ctx, gpu_bytes, gpu_chunks, fallbacks, dec);
    ferry_dt_lap(tr, FERRY_DT_PLACE, &tlap);
    ferry_dt_batch_end(tr, n, g->it_n, dec, g->cpu_fallbacks, fallbacks - g->cpu_fallbacks);
    return (int64_t)g->file_bytes;
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
#define POOL_SETS 8
#define POOL_BYTES (6ull << 30)

static uint64_t pool_bytes(const ferry_ctx *ctx, uint64_t largest) {
    const char *s = ferry_knob(ctx, "FERRY_GPU_POOL");
    int64_t v = s && *s ? ferry_knob_bytes(s) : -1;
    return FERRY_MAX(v >= 0 ? (uint64_t)v : POOL_BYTES, 2 * largest);
}
typedef struct gd_cset {
    gd_slot sl[GD_MAX_SLOTS];
    int dev;
    struct gd_cset *next;
} gd_cset;

struct ferry_gpudecode_pool {
    pthread_mutex_t mu;
    pthread_mutex_t trim_mu;   /* one pool_trim at a time: a feeder that finds the device full
                                  while another trims waits for the memory that one frees */
    gd_cset *idle;        /* at most POOL_SETS per device, bytes as pool_bytes says */
    _Atomic unsigned long coop_jobs;   /* cooperative jobs planned (stage_ring's "auto") */
};

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

static uint64_t pool_idle_bytes(ferry_ctx *ctx, int dev) {
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
static void set_sync(gd_cset *set) {
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

static gd_cset *set_acquire(ferry_ctx *ctx, int dev) {
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
static void set_release(ferry_ctx *ctx, gd_cset *set) {
    for (int k = 0; k < GD_MAX_SLOTS; k++) { set->sl[k].open = set->sl[k].flying = 0; set->sl[k].q = NULL; }
    ferry_gpudecode_pool *p = ctx ? ctx->gpu_pool : NULL;
    if (!p) { set_free(set); return; }
    gd_cset *drop = NULL;
    pthread_mutex_lock(&p->mu);
    set->next = p->idle;
    p->idle = set;
    uint64_t largest = 0;
    for (gd_cset *x = p->idle; x; x = x->next) largest = FERRY_MAX(largest, set_bytes(x));
    const uint64_t cap = pool_bytes(ctx, largest);
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
    int64_t rc = finish_batch(w, j, g, G->trace);
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
    int rc = batch_layout(w, j, c->q, G->idx + c->first, c->n, g, G->trace, G->max_h[d] + 128 * G->max_n[d] + 64, G->max_h[d]);
    /* (blosc's splits may ask more arrays and results: they grow then) */
    if (rc >= 0) rc = dev_fit(g->dev, &g->darr, &g->darr_cap, 128 * G->max_n[d] + 64);
    if (rc >= 0) rc = dev_fit(g->dev, &g->dres, &g->dres_cap, 32 * G->max_n[d] + 64);
    if (rc >= 0) rc = host_grow(w, d, &g->hres, &g->hres_cap, &g->hres_pinned, 32 * G->max_n[d] + 64);
    if (rc >= 0 && c->q->alg < FERRY_NVCOMP_NALG) {
        size_t t = 0;
        ferry_nvcomp_opts opts;
        memset(&opts, 0, sizeof opts);
        const ferry_nvcomp_api *nv = ferry_nvcomp_load(NULL);
        if (!ferry_nvcomp_temp_size(nv, c->q->alg, G->max_n[d], G->max_chunk[d], opts, &t, G->max_dec[d], g->stream) && t)
            rc = dev_fit(g->dev, &g->dtemp, &g->dtemp_cap, t);
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
        if (G->max_n[d] && !G->set[d] && !(G->set[d] = set_acquire(j->ctx, d))) {
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
        if (rc >= 0) rc = read_chunks(w, j, g, k0, k1, &bytes);
        if (tr && rc >= 0) ferry_dt_mark_max(&tr->t_read1, ferry_dt_now());
        if (rc >= 0) {   /* this piece up now, while the others are read */
            uint64_t lo = g->ch[k0].slot / 8 * 8, hi = g->ch[k1 - 1].slot + j->ext[g->ch[k1 - 1].ext].length;
            if (tr) ferry_dt_mark(&tr->t_h2d0, ferry_dt_now());
            rc = up_copy(w, g, g->din + lo, g->h + lo, hi - lo, g->stream);
        }
        ferry_dt_lap(tr, FERRY_DT_READ, &t0);
        int launched = 0;
        if (rc >= 0) {
            atomic_fetch_add(&c->file_bytes, bytes);
            if (atomic_fetch_add(&c->read, k1 - k0) + (k1 - k0) == c->n) {   /* the last piece: launch the call */
                g->file_bytes = atomic_load(&c->file_bytes);
                rc = batch_launch(w, j, g, tr, 1);
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
    int checks = !check_by_one(j->ctx) || last_launcher;
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
            if (G->set[d]) { set_release(j->ctx, G->set[d]); G->set[d] = NULL; }
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
    tl_trace = tr;
    tl_ctx = j->ctx;
    if (G->ncb) {   /* cooperative calls first; then any shared queue's batches below */
        int64_t c = run_coop(w, j, G);
        if (c < 0) { tl_trace = NULL; tl_ctx = NULL; return c; }
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
        if (!claim_batch(G, j, &Q, &idx, &n)) break;
        gd_dev *gdv = &w->gpu->dev[Q->dev];
        gd_slot *g = &gdv->sl[gdv->cur];
        gdv->cur = (gdv->cur + 1) % nslots;
        while (g->open && cnt && rc >= 0) {   /* its slot came round: check the batches up to it */
            gd_slot *o = fifo[head];
            head = (head + 1) % CAP;
            cnt--;
            if ((rc = finish_batch(w, j, o, tr)) >= 0) total += rc;
        }
        if (rc < 0 || (rc = start_batch(w, j, Q, idx, n, g, tr)) < 0) break;
        fifo[(head + cnt) % CAP] = g;
        cnt++;
    }
    while (rc >= 0 && cnt) {
        gd_slot *o = fifo[head];
        head = (head + 1) % CAP;
        cnt--;
        if ((rc = finish_batch(w, j, o, tr)) >= 0) total += rc;
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
    tl_trace = NULL;
    tl_ctx = NULL;
    return rc < 0 ? rc : total + total_coop;
}
