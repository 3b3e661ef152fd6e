/* gpudecode_impl.h — what the GPU decode stage's files share: the queues,
 * cooperative calls and job of gpudecode_plan.c, the slots and rings of
 * gpudecode_dev.c, the rate table of gpudecode_rates.c, and each file's calls
 * the others make. Internal to the stage: the engine calls gpudecode.h. The
 * files, lowest first: gpudecode_knobs.c, gpudecode_rates.c, gpudecode_dev.c,
 * gpudecode_plan.c, gpudecode_batch.c, gpudecode.c (the feeders' run). */
#ifndef FERRY_GPUDECODE_IMPL_H
#define FERRY_GPUDECODE_IMPL_H
#include "engine/gpudecode.h"
#include "engine/gpudecode_trace.h"
#include "engine/io.h"
#include "engine/knobs.h"
#include "codecs/framing.h"
#include "cuda/nvcomp.h"
#include <errno.h>
#include <stdlib.h>
#include <strings.h>

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
#define BIG_JOB_LATENCIES 2.0
#define PREAD_GBS 6.0   /* one thread's page-cache pread, GPU machine (BENCHMARKS.md, E1): a feeder reads its batch alone */

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

enum { TAIL_OFF = 0, TAIL_ON = 1, TAIL_BALANCE = 2 };
#define SLOT_SLACK ((uint64_t)9 << 19)
#define SOLO_BYTES (8ull << 30)   /* a solo call's decoded bytes at most: its compressed bytes are staged (pinned) at once */
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

/* A feeder's pinned ring for one device: two buffers of gd_ring_piece() bytes
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

#define MAX_BLOSC_STREAMS 65536

#define POOL_SETS 8
#define POOL_BYTES (6ull << 30)

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

/* gpudecode_dev.c: the trace of the batch this thread runs (allocations are
 * counted into it) and the context of the job the calling feeder runs (an
 * allocation that finds the device full gives back its idle call slots
 * first); gpudecode.c sets both around a feeder's run. */
extern _Thread_local ferry_decode_trace *gd_tl_trace;
extern _Thread_local ferry_ctx *gd_tl_ctx;
/* x rounded up to a multiple of a */
static inline uint64_t gd_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
/* gpudecode_rates.c: AUTO's rates per class */
extern const class_rate gd_auto_table[NCLASS];

/* gpudecode_knobs.c */
uint64_t gd_batch_target(const ferry_ctx *ctx, uint64_t bytes, size_t feeders, int shared, double share);
int gd_check_by_one(const ferry_ctx *ctx);
int gd_tail_mode(const ferry_ctx *ctx, int cls);
size_t gd_shared_feeders(const ferry_ctx *ctx, int threads);
int gd_share_pair(const ferry_ctx *ctx);
uint64_t gd_pool_bytes(const ferry_ctx *ctx, uint64_t largest);
int gd_slots(const ferry_ctx *ctx);
int gd_line_slots(const ferry_ctx *ctx);
size_t gd_ring_piece(const ferry_ctx *ctx);
int gd_coop_slots(const ferry_ctx *ctx);

/* gpudecode_rates.c */
/* ferry_gpudecode_call_chunks with ctx's knobs (NULL: the environment) */
size_t gd_call_chunks(const ferry_ctx *ctx, size_t count, uint64_t max_chunk, int nslots, int cls, uint64_t dev_free,
                      int jobs);
int gd_gpu_chain(const ferry_extent *e, chain_info *ci);
int gd_class_mode(int policy, int cls);
int gd_dev_mem(int dev, size_t *free_b, size_t *total);
int gd_wave_slots(int cls, int nslots, int jobs);

/* gpudecode_dev.c */
void gd_set_sync(gd_cset *set);
void gd_set_release(ferry_ctx *ctx, gd_cset *set);
uint64_t gd_pool_idle_bytes(ferry_ctx *ctx, int dev);
gd_cset *gd_set_acquire(ferry_ctx *ctx, int dev);
int gd_host_grow(ferry_worker *w, int d, uint8_t **buf, size_t *cap, int *pinned, size_t n);
int gd_up_copy(ferry_worker *w, gd_slot *g, CUdeviceptr dst, const uint8_t *src, size_t n, CUstream s);
int gd_stage_ring(ferry_ctx *ctx);
int gd_push(void **arr, size_t *n, size_t *cap, size_t size);
int gd_dev_fit(int dev, CUdeviceptr *p, size_t *cap, size_t n);
int gd_dev_grow(int dev, CUdeviceptr *p, size_t *cap, size_t n);

/* gpudecode_plan.c */
int gd_claim_batch(struct ferry_gpudecode_job *g, const ferry_job *j, gd_queue **qout, const uint32_t **idx,
                   size_t *count);

/* gpudecode_batch.c */
int64_t gd_finish_batch(ferry_worker *w, ferry_job *j, gd_slot *g, ferry_decode_trace *tr);
int gd_read_chunks(ferry_worker *w, ferry_job *j, gd_slot *g, size_t k0, size_t k1, uint64_t *file_bytes);
int gd_batch_layout(ferry_worker *w, ferry_job *j, gd_queue *Q, const uint32_t *idx, size_t n, gd_slot *g,
                    ferry_decode_trace *tr, uint64_t min_h, uint64_t min_din);
int gd_start_batch(ferry_worker *w, ferry_job *j, gd_queue *Q, const uint32_t *idx, size_t n, gd_slot *g,
                   ferry_decode_trace *tr);
int gd_batch_launch(ferry_worker *w, ferry_job *j, gd_slot *g, ferry_decode_trace *tr, int coop);
#endif
