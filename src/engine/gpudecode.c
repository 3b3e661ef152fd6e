/* gpudecode.c — the device decode stage: compressed chunks bound for device
 * memory, decoded on the GPU by one batched nvCOMP call per batch.
 *
 * A batch (one task) is a run of chunks with one codec for one device. The
 * worker that takes it reads every chunk's bytes into one pinned buffer,
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
 * box has more than three dimensions of runs, or without the kernels). Batches of one job run on many
 * workers at once, each on its own stream: while one batch decodes, others
 * are being read (the pipeline), and a worker's next batch waits only for its
 * own previous batch's event before reusing its buffers. */
#include "engine/gpudecode.h"
#include "engine/gpudecode_trace.h"
#include "engine/io.h"
#include "codecs/framing.h"
#include "cuda/nvcomp.h"
#include <errno.h>
#include <stdlib.h>
#include <strings.h>

/* ---- names, status --------------------------------------------------------- */
static const char *const decode_names[3] = {"auto", "gpu", "cpu"};

const char *ferry_decode_policy_name(ferry_decode_policy d) { return (d >= 0 && d <= FERRY_DECODE_CPU) ? decode_names[d] : "?"; }

int ferry_decode_policy_parse(const char *name, ferry_decode_policy *out) {
    for (int i = 0; i < 3; i++)
        if (name && strcasecmp(name, decode_names[i]) == 0) { *out = (ferry_decode_policy)i; return 0; }
    return ferry_seterr(FERRY_EINVAL, "unknown decode policy \"%s\" (auto, gpu, cpu)", name ? name : "");
}

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

/* AUTO: the GPU where ferry's own GPU path measured faster than its CPU
 * decoders for device destinations — bench/bench_decode.py on the H200, 16
 * cores, nvCOMP 6.0, 2026-12-01 (BENCHMARKS.md), GB/s of decoded data:
 *   zstd (Zarr v3, 1/4 MiB chunks)       GPU 16.1-18.2  vs CPU 9.8-10.7      -> GPU
 *   blosc-lz4+shuffle (Zarr v2, 1 MiB)   GPU 39.0       vs CPU 27.2          -> GPU
 *   deflate+shuffle (netCDF-4, xarray)   GPU 1.25       vs CPU 7.58 (libdeflate) -> CPU
 *   LZ4 (plain)                          not measured through ferry; nvCOMP 24.1 vs CPU 24.1 -> CPU
 * Deflate was planned as a split between both decoders (nvCOMP's own batched
 * rate is 5.2 GB/s), but ferry's GPU deflate path reaches 1.25 and a split
 * that gave it 61 % of the chunks ran at 1.99: slower than the CPU alone, so
 * AUTO leaves deflate to the CPU. FERRY_GPU_CPU_SHARE=f (0..1) still splits
 * it (f to the CPU), and decode="gpu" sends every chunk nvCOMP can take to
 * the GPU. */
static const int auto_gpu[NCLASS] = {1 /* zstd */, 0 /* LZ4 */, 0 /* deflate */, 1 /* blosc */};

/* The fraction of a job's deflate chunks a split leaves to the CPU: the
 * share FERRY_GPU_CPU_SHARE asks for; -1 when it is not set (AUTO: all CPU). */
static double cpu_share_deflate(const ferry_job *j) {
    const char *s = getenv("FERRY_GPU_CPU_SHARE");
    if (!s || !*s) return -1;
    double v = atof(s);
    return v < 0 ? 0 : v > 1 ? 1 : v;
}

/* ---- plan: batches ----------------------------------------------------------- */
typedef struct gd_batch { size_t first, count; int alg, dev; } gd_batch;

struct ferry_gpudecode_job {
    uint32_t *idx;       /* extent indices, batch by batch */
    uint8_t *owned;      /* per extent: 1 when a batch decodes it */
    gd_batch *b;
    size_t nb;
    ferry_decode_trace *trace;   /* FERRY_DECODE_TRACE=1: per-stage totals (gpudecode_trace.c), else NULL */
};

/* Decoded bytes per batch: large enough that nvCOMP's batched kernels fill
 * the GPU (its rate above was measured on 1,024-chunk batches), small enough
 * that many workers read batches at once (one thread's pread is ~6 GB/s) and
 * that zstd's temp space (~3x the batch's output, nvCOMP 5.3) stays modest:
 * total / (2 x threads), within [4 MiB, 64 MiB]; FERRY_GPU_BATCH overrides. */
static uint64_t batch_target(const ferry_job *j, uint64_t total) {
    const char *s = getenv("FERRY_GPU_BATCH");
    if (s) { int64_t v = ferry_parse_size(s); if (v > 0) return (uint64_t)v; }
    uint64_t t = total / (2 * (uint64_t)(j->max_workers > 0 ? j->max_workers : 1));
    if (t < (4u << 20)) t = 4u << 20;
    if (t > (64u << 20)) t = 64u << 20;
    return t;
}

int ferry_gpudecode_plan(ferry_job *j, int policy) {
    if (policy == FERRY_DECODE_AUTO) policy = j->ctx->cfg.decode;
    if (policy == FERRY_DECODE_CPU) return 0;
    size_t n = j->next, cand = 0;
    uint64_t total = 0;
    chain_info ci;
    /* deflate under AUTO goes to the GPU only as an explicit split */
    double cpu_share = policy == FERRY_DECODE_AUTO ? cpu_share_deflate(j) : 0, acc = 0;
    for (size_t i = 0; i < n; i++) {
        const ferry_extent *e = &j->ext[i];
        if (e->kind == FERRY_EXTENT_READ && e->dst.kind == FERRY_MEM_CUDA && e->decoded_size && gpu_chain(e, &ci) &&
            (policy == FERRY_DECODE_GPU || auto_gpu[ci.alg] || (ci.alg == FERRY_NVCOMP_DEFLATE && cpu_share >= 0))) {
            cand++;
            total += e->decoded_size;
        }
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
    g->b = malloc(cand * sizeof *g->b);
    if (!g->idx || !g->owned || !g->b) { free(g->idx); free(g->owned); free(g->b); free(g); return ferry_seterr(FERRY_ENOMEM, "out of memory"); }
    uint64_t target = batch_target(j, total);
    /* one pass per (device, algorithm): chunks keep plan order inside a batch */
    size_t k = 0;
    for (int d = 0; d < FERRY_MAX_DEVICES && k < cand; d++)
        for (int a = 0; a < NCLASS; a++) {
            uint64_t bytes = 0;
            gd_batch *cur = NULL;
            for (size_t i = 0; i < n; i++) {
                const ferry_extent *e = &j->ext[i];
                if (g->owned[i] || e->kind != FERRY_EXTENT_READ || e->dst.kind != FERRY_MEM_CUDA || e->dst.device != d ||
                    !e->decoded_size || !gpu_chain(e, &ci) || ci.alg != a || !(policy == FERRY_DECODE_GPU || auto_gpu[a] ||
                      (a == FERRY_NVCOMP_DEFLATE && cpu_share >= 0)))
                    continue;
                if (a == FERRY_NVCOMP_DEFLATE && cpu_share > 0 && (acc += cpu_share) >= 1) {
                    acc -= 1;   /* this one is the CPU's (a plain task) */
                    continue;
                }
                if (!cur || bytes + e->decoded_size > target || cur->count >= 4096) {
                    cur = &g->b[g->nb++];
                    *cur = (gd_batch){k, 0, a, d};
                    bytes = 0;
                }
                g->idx[k++] = (uint32_t)i;
                g->owned[i] = 1;
                cur->count++;
                bytes += e->decoded_size;
            }
        }
    if (ferry_dt_enabled() && (g->trace = calloc(1, sizeof *g->trace))) {
        g->trace->plan_batches = g->nb;
        g->trace->plan_target = target;
        g->trace->plan_chunks = cand;
    }
    j->gpu = g;
    return 0;
}

int ferry_gpudecode_owns(const ferry_job *j, size_t i) { return j->gpu && j->gpu->owned[i]; }
size_t ferry_gpudecode_batches(const ferry_job *j) { return j->gpu ? j->gpu->nb : 0; }

void ferry_gpudecode_job_free(ferry_job *j) {
    if (!j || !j->gpu) return;
    if (j->gpu->trace) { ferry_dt_report(j->gpu->trace, j->id, j->max_workers); free(j->gpu->trace); }
    free(j->gpu->idx); free(j->gpu->owned); free(j->gpu->b); free(j->gpu);
    j->gpu = NULL;
}

/* ---- per-worker buffers -------------------------------------------------------- */
typedef struct gd_dev {
    uint8_t *h; size_t hcap; int hpinned;         /* packed chunks, arrays, descriptors (pinned) */
    uint8_t *hres; size_t hres_cap; int hres_pinned; /* statuses, sizes, checks back from the device */
    uint8_t *hcpu; size_t hcpu_cap; int hcpu_pinned; /* chunks decoded on the CPU, before their copy */
    uint8_t *hfb; size_t hfb_cap; int hfb_pinned;    /* one chunk the CPU decodes after nvCOMP failed it */
    CUdeviceptr din, dres, dtemp, dscr;
    size_t din_cap, dres_cap, dtemp_cap, dscr_cap;
    CUevent done;                                  /* recorded after a batch's last device work */
    int pending;
} gd_dev;

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
} gd_chunk;

typedef struct gd_item {  /* one nvCOMP input: a frame, or one split of a blosc block */
    uint32_t chunk;
    int alg;              /* ferry_nvcomp_alg */
    uint64_t in_pos, in_len;   /* in h / din */
    uint64_t out_off, out_len; /* from its chunk's `out` */
    size_t q;             /* its index in the batch's arrays and results */
} gd_item;

typedef struct gd_desc { uint64_t in, out, n, size; int in_din, in_scr, out_scr; } gd_desc;  /* copy / (bit)unshuffle */

struct ferry_gpudecode_worker {
    gd_dev dev[FERRY_MAX_DEVICES];
    gd_chunk *ch; size_t ch_cap;
    gd_item *it; size_t it_n, it_cap;
    gd_desc *cp; size_t cp_n, cp_cap;   /* copies before decoding (blosc raw streams, memcpyed frames) */
    gd_desc *un; size_t un_n, un_cap;   /* unshuffles after decoding */
    gd_desc *bu; size_t bu_n, bu_cap;   /* blosc bit-unshuffles after decoding */
    ferry_blosc_stream *bs;             /* one frame's streams while it is parsed */
};

enum { K_GPU = 0, K_CPU = 1, K_FILL = 2, K_DONE = 3 /* nvCOMP failed it, the CPU's result is in place */ };
#define MAX_BLOSC_STREAMS 65536

void ferry_gpudecode_worker_free(ferry_worker *w) {
    struct ferry_gpudecode_worker *gw = w->gpu;
    if (!gw) return;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    for (int d = 0; d < FERRY_MAX_DEVICES; d++) {
        gd_dev *g = &gw->dev[d];
        if (!cu || !(g->h || g->din || g->dres || g->dtemp || g->dscr || g->done || g->hcpu || g->hfb || g->hres)) continue;
        ferry_cuda_use_device(d);
        if (g->done) { cu->EventSynchronize(g->done); cu->EventDestroy(g->done); }
        if (g->din) cu->MemFree(g->din);
        if (g->dres) cu->MemFree(g->dres);
        if (g->dtemp) cu->MemFree(g->dtemp);
        if (g->dscr) cu->MemFree(g->dscr);
        /* from ferry_worker_grow: plain ones may be mmapped (hostmem.c), not malloc'd */
        ferry_worker_free_host(g->h, g->hcap, g->hpinned);
        ferry_worker_free_host(g->hres, g->hres_cap, g->hres_pinned);
        ferry_worker_free_host(g->hcpu, g->hcpu_cap, g->hcpu_pinned);
        ferry_worker_free_host(g->hfb, g->hfb_cap, g->hfb_pinned);
    }
    free(gw->ch); free(gw->it); free(gw->cp); free(gw->un); free(gw->bu); free(gw->bs);
    free(gw);
    w->gpu = NULL;
}

/* The trace of the batch this thread runs (allocations are counted into it), or NULL. */
static _Thread_local ferry_decode_trace *tl_trace;

/* Device memory of at least n bytes (contents not kept); the device is current. */
static int dev_grow(CUdeviceptr *p, size_t *cap, size_t n) {
    if (*cap >= n && *p) return 0;
    uint64_t t0 = tl_trace ? ferry_dt_now() : 0;
    if (tl_trace) atomic_fetch_add(&tl_trace->allocs, 1);
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    size_t nc = *cap ? *cap : (1u << 20);
    while (nc < n) nc *= 2;
    if (*p) cu->MemFree(*p);
    *p = 0; *cap = 0;
    CUresult r = cu->MemAlloc(p, nc);
    if (r) { *p = 0; return ferry_seterr(FERRY_ENOMEM, "GPU decode: cuMemAlloc(%zu): %s", nc, ferry_cuda_errstr(r)); }
    *cap = nc;
    ferry_dt_lap(tl_trace, FERRY_DT_ALLOC, &t0);
    return 0;
}

/* ferry_worker_grow (per worker, reused: it allocates only to grow), timed for the trace. */
static int host_grow(ferry_worker *w, int d, uint8_t **buf, size_t *cap, int *pinned, size_t n) {
    if (!tl_trace || (*cap >= n && *buf && *pinned)) return ferry_worker_grow(w, d, buf, cap, pinned, n);
    uint64_t t0 = ferry_dt_now();
    uint8_t *before = *buf;
    int rc = ferry_worker_grow(w, d, buf, cap, pinned, n);
    if (*buf != before) { atomic_fetch_add(&tl_trace->allocs, 1); ferry_dt_lap(tl_trace, FERRY_DT_ALLOC, &t0); }
    return rc;
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

/* ---- device placement: scratch -> destination box -------------------------------- */
static int copy_dd(const ferry_cuda_api *cu, CUstream s, CUdeviceptr dst, int64_t dpitch, CUdeviceptr src,
                   int64_t spitch, size_t width, size_t height) {
    ferry_cu_memcpy2d m;
    memset(&m, 0, sizeof m);
    m.srcMemoryType = FERRY_CU_MEMORYTYPE_DEVICE;
    m.srcDevice = src;
    m.srcPitch = height == 1 ? width : (size_t)spitch;
    m.dstMemoryType = FERRY_CU_MEMORYTYPE_DEVICE;
    m.dstDevice = dst;
    m.dstPitch = height == 1 ? width : (size_t)dpitch;
    m.WidthInBytes = width;
    m.Height = height;
    if (height == 1 || (spitch >= (int64_t)width && dpitch >= (int64_t)width)) {
        CUresult r = cu->Memcpy2DAsync(&m, s);
        if (r == 0) return 0;
        if (height == 1) return ferry_seterr(FERRY_ECUDA, "cuMemcpy2DAsync: %s", ferry_cuda_errstr(r));
    }
    for (size_t y = 0; y < height; y++) {   /* pitches the driver refuses: row by row */
        m.srcDevice = src + (CUdeviceptr)((int64_t)y * spitch);
        m.dstDevice = dst + (CUdeviceptr)((int64_t)y * dpitch);
        m.srcPitch = m.dstPitch = width;
        m.Height = 1;
        CUresult r = cu->Memcpy2DAsync(&m, s);
        if (r) return ferry_seterr(FERRY_ECUDA, "cuMemcpy2DAsync: %s", ferry_cuda_errstr(r));
    }
    return 0;
}

static int place_rec(const ferry_cuda_api *cu, CUstream s, CUdeviceptr dst, CUdeviceptr src, const ferry_place *p, int k) {
    int last = p->ndim - 1;
    int inner = p->src_stride[last] == (int64_t)p->itemsize && p->dst_stride[last] == (int64_t)p->itemsize;
    int rows = inner ? last - 1 : last;
    if (k == rows || (rows < 0 && k == 0)) {
        size_t width = inner ? p->count[last] * p->itemsize : p->itemsize;
        if (rows < 0) return copy_dd(cu, s, dst, (int64_t)width, src, (int64_t)width, width, 1);
        return copy_dd(cu, s, dst, p->dst_stride[rows], src, p->src_stride[rows], width, p->count[rows]);
    }
    for (uint64_t i = 0; i < p->count[k]; i++) {
        int rc = place_rec(cu, s, dst + (CUdeviceptr)((int64_t)i * p->dst_stride[k]),
                           src + (CUdeviceptr)((int64_t)i * p->src_stride[k]), p, k + 1);
        if (rc < 0) return rc;
    }
    return 0;
}

/* Copy the decoded chunk at src into its box of dst (all of it when there is no placement). */
static int place_dev(const ferry_cuda_api *cu, CUstream s, CUdeviceptr dst, CUdeviceptr src, const ferry_place *place,
                     uint64_t decoded) {
    if (!place) return copy_dd(cu, s, dst, (int64_t)decoded, src, (int64_t)decoded, decoded, 1);
    for (int k = 0; k < place->ndim; k++) if (place->count[k] == 0) return 0;
    ferry_place p;
    if (ferry_place_normalize(place, &p) == 0) { p.ndim = 1; p.count[0] = 1; p.src_stride[0] = p.dst_stride[0] = p.itemsize; }
    return place_rec(cu, s, dst, src + p.src_offset, &p, 0);
}

/* The tile-scatter descriptor (16 u64, ferry_cuda_place_batch) of a chunk
 * at src whose box goes to dst; 0 when the box needs more than 3 dimensions
 * of runs (then place_dev's copies do it). */
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

/* Read every chunk of the batch into its slot of h. */
static int read_chunks(ferry_worker *w, ferry_job *j, gd_dev *g, gd_chunk *ch, size_t n, uint64_t *file_bytes) {
    ferry_file *pf = NULL;
    int rc = 0, pf_nofollow = 0;
    for (size_t k = 0; k < n && rc >= 0; k++) {
        const ferry_extent *e = &j->ext[ch[k].ext];
        ferry_file *f = e->file;
        if (!f) {
            int nofollow = (e->flags & FERRY_EXTENT_NOFOLLOW) != 0;
            if (!pf || strcmp(pf->path, e->path) != 0 || (nofollow && !pf_nofollow)) {
                if (pf) ferry_file_close(pf);
                pf = NULL;
                pf_nofollow = nofollow;
                rc = ferry_file_open_extent(w->ctx, e, &pf);
                if ((rc == -ENOENT || rc == -ENOTDIR) && (e->flags & FERRY_EXTENT_MISSING_FILLS)) {
                    ferry_clearerr();   /* an absent chunk: its box gets the fill value */
                    rc = 0;
                    ch[k].kind = K_FILL;
                    continue;
                }
                if (rc < 0) { ferry_preerr(rc, "%s", e->path); break; }
            }
            f = pf;
        }
        int64_t got = ferry_pread_full(f->fd, g->h + ch[k].slot, e->length, e->offset);
        if (got < 0) { rc = ferry_preerr((int)got, "%s: byte %llu", f->path, (unsigned long long)e->offset); break; }
        if ((uint64_t)got < e->length) {
            rc = ferry_seterr(FERRY_ESHORT, "%s: file ends at byte %llu but the chunk at byte %llu has %llu bytes",
                              f->path, (unsigned long long)(e->offset + (uint64_t)got), (unsigned long long)e->offset,
                              (unsigned long long)e->length);
            break;
        }
        *file_bytes += (uint64_t)got;
    }
    if (pf) ferry_file_close(pf);
    return rc;
}

/* Decide, for one chunk read into h, how the GPU decodes it: its items,
 * copies and unshuffles, its output and final places (scratch as offsets
 * from *scr). K_CPU when the GPU cannot take it; an error when it is corrupt. */
static int classify(struct ferry_gpudecode_worker *gw, gd_dev *g, const ferry_nvcomp_api *nv, const ferry_extent *e,
                    gd_chunk *c, uint32_t ci_idx, int kernels, uint64_t *scr) {
    CUdeviceptr dst = (CUdeviceptr)(uintptr_t)e->dst.ptr + e->dst_offset;
    int contig = place_is_contiguous(e->place, e->decoded_size);
    size_t len = e->length;
    const uint8_t *p = g->h + c->slot;
    int rc;
    for (int i = 0; i < c->ci.ncheck; i++)
        if ((rc = ferry_codecs_verify_trailer(e->codecs[i].id, p, &len)) < 0) return rc;
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
    c->item0 = gw->it_n;
    if (c->ci.codec != FERRY_CODEC_BLOSC) {
        if ((rc = push((void **)&gw->it, &gw->it_n, &gw->it_cap, sizeof *gw->it)) < 0) return rc;
        gw->it[gw->it_n++] = (gd_item){ci_idx, alg, c->slot + c->fr.payload_off, c->fr.payload_len, 0, e->decoded_size, 0};
    } else if (bf.memcpyed) {
        if ((rc = add_desc(&gw->cp, &gw->cp_n, &gw->cp_cap, (gd_desc){c->slot + 16, 0, e->decoded_size, 1, 1, 0, 0})) < 0) return rc;
        gw->cp[gw->cp_n - 1].out = ci_idx;   /* resolved to the chunk's fin below (memcpyed frames are not shuffled) */
        gw->cp[gw->cp_n - 1].out_scr = -1;
        unshuffle_size = 0;
    } else {
        for (size_t i = 0; i < bf.nstreams; i++) {
            const ferry_blosc_stream *st = &gw->bs[i];
            if (st->raw) {
                if ((rc = add_desc(&gw->cp, &gw->cp_n, &gw->cp_cap, (gd_desc){c->slot + st->src_off, st->dst_off, st->dst_len, 1, 1, 0, 0})) < 0)
                    return rc;
                gw->cp[gw->cp_n - 1].out_scr = -2 - (int)ci_idx;   /* relative to the chunk's out */
                continue;
            }
            if ((rc = push((void **)&gw->it, &gw->it_n, &gw->it_cap, sizeof *gw->it)) < 0) return rc;
            gw->it[gw->it_n++] = (gd_item){ci_idx, alg, c->slot + st->src_off, st->src_len, st->dst_off, st->dst_len, 0};
        }
    }
    c->nitems = gw->it_n - c->item0;
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
                if (bf.bitshuffle && !copy_only) rc = add_desc(&gw->bu, &gw->bu_n, &gw->bu_cap, dd);
                else rc = add_desc(&gw->un, &gw->un_n, &gw->un_cap, dd);
                if (rc < 0) return rc;
            }
        } else {
            if ((rc = add_desc(&gw->un, &gw->un_n, &gw->un_cap, (gd_desc){0, 0, e->decoded_size, (uint64_t)unshuffle_size, 0, 0, 0})) < 0) return rc;
            gw->un[gw->un_n - 1].in_scr = (int)ci_idx;
        }
    }
    return 0;
}

typedef struct gd_counts { uint64_t chunks, items, decoded, cpu, fallbacks; int flying; } gd_counts;

static int64_t run_batch(ferry_worker *w, ferry_job *j, size_t bi, int *deferred, ferry_decode_trace *tr, gd_counts *cnt);

int64_t ferry_gpudecode_run(ferry_worker *w, ferry_job *j, size_t bi, int *deferred) {
    ferry_decode_trace *tr = j->gpu->trace;
    gd_counts c;
    memset(&c, 0, sizeof c);
    tl_trace = tr;
    ferry_dt_batch_begin(tr);
    int64_t r = run_batch(w, j, bi, deferred, tr, &c);
    if (c.flying) ferry_dt_in_flight(tr, -1);
    ferry_dt_batch_end(tr, c.chunks, c.items, c.decoded, c.cpu, c.fallbacks);
    tl_trace = NULL;
    return r;
}

/* One batch: read, frame, enqueue, CPU chunks, wait, check, place (the
 * header comment); stage times into tr when tracing. */
static int64_t run_batch(ferry_worker *w, ferry_job *j, size_t bi, int *deferred, ferry_decode_trace *tr, gd_counts *cnt) {
    uint64_t tlap = tr ? ferry_dt_now() : 0;
    const gd_batch *B = &j->gpu->b[bi];
    const int d = B->dev;
    const size_t n = B->count;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    const ferry_nvcomp_api *nv = ferry_nvcomp_load(NULL);
    ferry_devstate *ds;
    int rc = ferry_worker_device(w, d, &ds);
    if (rc < 0) return rc;
    CUstream s = ds->stream;
    if (!w->gpu && !(w->gpu = calloc(1, sizeof *w->gpu))) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    struct ferry_gpudecode_worker *gw = w->gpu;
    gd_dev *g = &gw->dev[d];
    CUresult r;
    if (!g->done && (r = cu->EventCreate(&g->done, FERRY_CU_EVENT_DISABLE_TIMING)))
        return ferry_seterr(FERRY_ECUDA, "cuEventCreate: %s", ferry_cuda_errstr(r));
    if (g->pending) {   /* this worker's previous batch: its buffers are reused below */
        if ((r = cu->EventSynchronize(g->done))) return ferry_seterr(FERRY_ECUDA, "device %d: GPU decode failed: %s", d, ferry_cuda_errstr(r));
        g->pending = 0;
    }
    ferry_dt_lap(tr, FERRY_DT_PREV, &tlap);
    cnt->chunks = n;
    if (gw->ch_cap < n) {
        gd_chunk *c = realloc(gw->ch, n * sizeof *c);
        if (!c) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        gw->ch = c;
        gw->ch_cap = n;
    }
    gd_chunk *ch = gw->ch;
    const uint32_t *idx = j->gpu->idx + B->first;
    int kernels = ferry_cuda_kernels_ready(d);
    gw->it_n = gw->cp_n = gw->un_n = gw->bu_n = 0;

    /* slots: each chunk starts `lead` bytes into an 8-aligned slot so that the
     * payload after its header (zlib: 2 bytes, numcodecs LZ4: 4) is aligned
     * as nvCOMP requires, and the framed bytes stay intact for the CPU */
    uint64_t hsize = 0, file_bytes = 0;
    for (size_t k = 0; k < n; k++) {
        const ferry_extent *e = &j->ext[idx[k]];
        memset(&ch[k], 0, sizeof ch[k]);
        ch[k].ext = idx[k];
        gpu_chain(e, &ch[k].ci);
        unsigned hdr = ch[k].ci.codec == FERRY_CODEC_ZLIB ? 2 : ch[k].ci.codec == FERRY_CODEC_LZ4 ? 4 : 0;
        ch[k].slot = hsize + (8 - hdr) % 8;
        hsize += up(e->length + 8, 8);
    }
    if ((rc = host_grow(w, d, &g->h, &g->hcap, &g->hpinned, hsize ? hsize : 1)) < 0) return rc;
    if ((rc = read_chunks(w, j, g, ch, n, &file_bytes)) < 0) return rc;
    ferry_dt_lap(tr, FERRY_DT_READ, &tlap);

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
    if (scr && (rc = dev_grow(&g->dscr, &g->dscr_cap, scr)) < 0) return rc;
    for (size_t k = 0; k < n; k++) {
        if (ch[k].out_scr) ch[k].out += g->dscr;
        if (ch[k].fin_scr) ch[k].fin += g->dscr;
    }
    ferry_dt_lap(tr, FERRY_DT_FRAME, &tlap);
    cnt->items = gw->it_n;

    /* the arrays nvCOMP reads, per algorithm, then the descriptors, after the payloads */
    size_t na[FERRY_NVCOMP_NALG] = {0, 0, 0}, q0[FERRY_NVCOMP_NALG];
    uint64_t max_out[FERRY_NVCOMP_NALG] = {0, 0, 0}, tot_out[FERRY_NVCOMP_NALG] = {0, 0, 0};
    for (size_t i = 0; i < gw->it_n; i++) {
        gd_item *it = &gw->it[i];
        na[it->alg]++;
        tot_out[it->alg] += it->out_len;
        if (it->out_len > max_out[it->alg]) max_out[it->alg] = it->out_len;
    }
    size_t nitems = gw->it_n, q = 0;
    for (int a = 0; a < FERRY_NVCOMP_NALG; a++) { q0[a] = q; q += na[a]; }
    const uint64_t arr = up(hsize, 64);
    const uint64_t a_cp = arr + 32 * (uint64_t)nitems, a_un = a_cp + 32 * (uint64_t)gw->cp_n;
    const uint64_t a_bu = a_un + 32 * (uint64_t)gw->un_n, htotal = a_bu + 32 * (uint64_t)gw->bu_n;
    const uint64_t res_size = up(4 * (uint64_t)nitems, 8), res_adler = res_size + 8 * (uint64_t)nitems;
    const uint64_t res_total = res_adler + 4 * (uint64_t)nitems + 8;
    int any_gpu = nitems || gw->cp_n || gw->un_n || gw->bu_n;
    size_t temp = 0;
    ferry_nvcomp_opts opts;
    memset(&opts, 0, sizeof opts);
    if (any_gpu) {
        if (htotal > g->hcap) {   /* the arrays did not fit behind the payloads: grow, keeping the chunks */
            uint8_t *nb = NULL; size_t ncap = 0; int npin = 0;
            if ((rc = host_grow(w, d, &nb, &ncap, &npin, htotal)) < 0) return rc;
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
        if ((rc = dev_grow(&g->din, &g->din_cap, htotal)) < 0) return rc;
        if ((rc = dev_grow(&g->dres, &g->dres_cap, res_total)) < 0) return rc;
        if (temp && (rc = dev_grow(&g->dtemp, &g->dtemp_cap, temp)) < 0) return rc;
        if ((rc = host_grow(w, d, &g->hres, &g->hres_cap, &g->hres_pinned, res_total)) < 0) return rc;
        /* items: q ordered by algorithm; four arrays of nitems u64 entries */
        uint64_t *in_ptrs = (uint64_t *)(g->h + arr), *in_bytes = in_ptrs + nitems, *out_ptrs = in_bytes + nitems,
                 *out_caps = out_ptrs + nitems;
        size_t next[FERRY_NVCOMP_NALG];
        memcpy(next, q0, sizeof next);
        for (size_t i = 0; i < nitems; i++) {
            gd_item *it = &gw->it[i];
            it->q = next[it->alg]++;
            in_ptrs[it->q] = g->din + it->in_pos;
            in_bytes[it->q] = it->in_len;
            out_ptrs[it->q] = ch[it->chunk].out + it->out_off;
            out_caps[it->q] = it->out_len;
        }
        uint64_t *cp = (uint64_t *)(g->h + a_cp), *un = (uint64_t *)(g->h + a_un), *bu = (uint64_t *)(g->h + a_bu);
        for (size_t i = 0; i < gw->cp_n; i++) {
            const gd_desc *dd = &gw->cp[i];
            uint64_t out = dd->out_scr == -1 ? ch[dd->out].fin : ch[-2 - dd->out_scr].out + dd->out;
            cp[4 * i] = g->din + dd->in; cp[4 * i + 1] = out; cp[4 * i + 2] = dd->n; cp[4 * i + 3] = 1;
        }
        for (size_t i = 0; i < gw->un_n; i++) {
            const gd_desc *dd = &gw->un[i];
            un[4 * i] = ch[dd->in_scr].out + dd->in; un[4 * i + 1] = ch[dd->in_scr].fin + dd->out;
            un[4 * i + 2] = dd->n; un[4 * i + 3] = dd->size;
        }
        for (size_t i = 0; i < gw->bu_n; i++) {
            const gd_desc *dd = &gw->bu[i];
            bu[4 * i] = ch[dd->in_scr].out + dd->in; bu[4 * i + 1] = ch[dd->in_scr].fin + dd->out;
            bu[4 * i + 2] = dd->n; bu[4 * i + 3] = dd->size;
        }
        /* one copy up; copies, one nvCOMP call per algorithm, Adler-32s,
         * unshuffles, byteswaps; one copy of the results back */
        if ((r = cu->MemcpyHtoDAsync(g->din, g->h, htotal, s)))
            return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(r));
        if (gw->cp_n && (rc = ferry_cuda_unshuffle_batch(d, g->din + a_cp, gw->cp_n, 0, s)) < 0) goto fail_sync;
        for (int a = 0; a < FERRY_NVCOMP_NALG; a++) {
            if (!na[a]) continue;
            CUdeviceptr base = g->din + arr;
            ferry_nvcomp_status_t st = nv->alg[a].DecompressAsync(
                (const void *const *)(uintptr_t)(base + 8 * q0[a]), (const size_t *)(uintptr_t)(base + 8 * (nitems + q0[a])),
                (const size_t *)(uintptr_t)(base + 8 * (3 * nitems + q0[a])), (size_t *)(uintptr_t)(g->dres + res_size + 8 * q0[a]),
                na[a], temp ? (void *)(uintptr_t)g->dtemp : NULL, temp, (void *const *)(uintptr_t)(base + 8 * (2 * nitems + q0[a])),
                opts, (ferry_nvcomp_status_t *)(uintptr_t)(g->dres + 4 * q0[a]), s);
            if (st) {
                rc = ferry_seterr(FERRY_ECUDA, "nvCOMP batched %s decompress of %zu chunks: %s",
                                  a == FERRY_NVCOMP_ZSTD ? "zstd" : a == FERRY_NVCOMP_LZ4 ? "LZ4" : "Deflate", na[a], ferry_nvcomp_errstr(st));
                goto fail_sync;
            }
            if (a == FERRY_NVCOMP_DEFLATE &&
                (rc = ferry_cuda_adler32_batch(d, base + 8 * (2 * nitems + q0[a]), base + 8 * (3 * nitems + q0[a]),
                                               g->dres + res_adler + 4 * q0[a], na[a], s)) < 0)
                goto fail_sync;
        }
        if (gw->un_n && (rc = ferry_cuda_unshuffle_batch(d, g->din + a_un, gw->un_n, 0, s)) < 0) goto fail_sync;
        if (gw->bu_n && (rc = ferry_cuda_unshuffle_batch(d, g->din + a_bu, gw->bu_n, 1, s)) < 0) goto fail_sync;
        for (size_t k = 0; k < n; k++)
            if (ch[k].kind == K_GPU && ch[k].ci.swap &&
                (rc = ferry_cuda_byteswap(d, ch[k].fin, j->ext[ch[k].ext].decoded_size / ch[k].ci.swap, ch[k].ci.swap, s)) < 0)
                goto fail_sync;
        if ((r = cu->MemcpyDtoHAsync(g->hres, g->dres, res_total, s)) || (r = cu->EventRecord(g->done, s))) {
            rc = ferry_seterr(FERRY_ECUDA, "cuMemcpyDtoHAsync: %s", ferry_cuda_errstr(r));
            goto fail_sync;
        }
        if (tr) { ferry_dt_in_flight(tr, 1); cnt->flying = 1; }
    }
    ferry_dt_lap(tr, FERRY_DT_ENQUEUE, &tlap);

    /* meanwhile: the chunks the CPU decodes */
    uint64_t fallbacks = 0;
    if (cpu_total && (rc = host_grow(w, d, &g->hcpu, &g->hcpu_cap, &g->hcpu_pinned, cpu_total)) < 0) goto fail_sync;
    for (size_t k = 0; k < n; k++) {
        gd_chunk *c = &ch[k];
        const ferry_extent *e = &j->ext[c->ext];
        if (c->kind == K_FILL) fill_pattern(g->hcpu + c->cpu_pos, e->decoded_size, e);
        else if (c->kind == K_CPU) {
            if ((rc = cpu_decode(w, e, g->h + c->slot, g->hcpu + c->cpu_pos)) < 0) { chunk_err(rc, e, ext_path(e), &c->ci); goto fail_sync; }
            fallbacks++;
        }
    }
    cnt->cpu = fallbacks;
    ferry_dt_lap(tr, FERRY_DT_CPU, &tlap);

    /* results: statuses, sizes, Adler-32s of every item */
    uint64_t gpu_bytes = 0, gpu_chunks = 0;
    if (any_gpu) {
        if ((r = cu->EventSynchronize(g->done))) { rc = ferry_seterr(FERRY_ECUDA, "device %d: GPU decode failed: %s", d, ferry_cuda_errstr(r)); goto fail_sync; }
        ferry_dt_lap(tr, FERRY_DT_WAIT, &tlap);
        if (cnt->flying) { ferry_dt_in_flight(tr, -1); cnt->flying = 0; }
        const int32_t *sts = (const int32_t *)g->hres;
        const uint64_t *sizes = (const uint64_t *)(g->hres + res_size);
        const uint32_t *adl = (const uint32_t *)(g->hres + res_adler);
        for (size_t k = 0; k < n; k++) {
            gd_chunk *c = &ch[k];
            if (c->kind != K_GPU) continue;
            const ferry_extent *e = &j->ext[c->ext];
            const char *why = NULL;
            char buf[96];
            for (size_t i = c->item0; i < c->item0 + c->nitems && !why; i++) {
                const gd_item *it = &gw->it[i];
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
            if ((rc = host_grow(w, d, &g->hfb, &g->hfb_cap, &g->hfb_pinned, e->decoded_size)) < 0) goto fail_sync;
            if ((rc = cpu_decode(w, e, g->h + c->slot, g->hfb)) < 0) {
                ferry_preerr(rc, "nvCOMP: %s; the CPU decoder", why);
                chunk_err(rc, e, ext_path(e), &c->ci);
                goto fail_sync;
            }
            /* the CPU ran the whole chain: its bytes go where the filters' went */
            if ((r = cu->MemcpyHtoDAsync(c->fin, g->hfb, e->decoded_size, s)) || (r = cu->StreamSynchronize(s))) {
                rc = ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(r));
                goto fail_sync;
            }
            c->kind = K_DONE;
            fallbacks++;
        }
    }
    cnt->fallbacks = fallbacks - cnt->cpu;
    ferry_dt_lap(tr, FERRY_DT_FALLBACK, &tlap);

    /* CPU-decoded chunks up, then scratch placed into the boxes: one tile
     * scatter kernel for the batch (its descriptors through h and din, both
     * free again: the decode is complete), copies where it cannot */
    size_t nplace = 0;
    uint64_t *pd = NULL;
    for (size_t k = 0; k < n; k++) nplace += ch[k].placed;
    if (nplace && kernels) {
        if ((rc = host_grow(w, d, &g->h, &g->hcap, &g->hpinned, 128 * nplace)) < 0) goto fail_sync;
        if ((rc = dev_grow(&g->din, &g->din_cap, 128 * nplace)) < 0) goto fail_sync;
        pd = (uint64_t *)g->h;
    }
    size_t np = 0;
    for (size_t k = 0; k < n; k++) {
        gd_chunk *c = &ch[k];
        const ferry_extent *e = &j->ext[c->ext];
        if ((c->kind == K_CPU || c->kind == K_FILL) && (r = cu->MemcpyHtoDAsync(c->fin, g->hcpu + c->cpu_pos, e->decoded_size, s))) {
            rc = ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(r));
            goto fail_sync;
        }
        if (!c->placed) continue;
        CUdeviceptr base = (CUdeviceptr)(uintptr_t)e->dst.ptr + e->dst_offset;
        if (pd && place_desc(pd + 16 * np, base, c->fin, e->place, e->decoded_size)) { np++; continue; }
        if ((rc = place_dev(cu, s, base, c->fin, e->place, e->decoded_size)) < 0) goto fail_sync;
    }
    if (np) {
        if ((r = cu->MemcpyHtoDAsync(g->din, g->h, 128 * np, s))) {
            rc = ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(r));
            goto fail_sync;
        }
        if ((rc = ferry_cuda_place_batch(d, g->din, np, s)) < 0) goto fail_sync;
    }
    if ((r = cu->EventRecord(g->done, s))) { rc = ferry_seterr(FERRY_ECUDA, "cuEventRecord: %s", ferry_cuda_errstr(r)); goto fail_sync; }
    g->pending = 1;
    w->seq[d]++;
    if ((rc = ferry_worker_defer(w, j, d)) < 0) goto fail_sync;
    *deferred = 1;
    atomic_fetch_or(&j->dev_mask, 1u << d);
    if (!w->is_inline) atomic_fetch_or(&j->worker_mask[w->id / 64], 1ull << (w->id % 64));
    atomic_fetch_add(&j->path_bytes[FERRY_PATH_STAGED], file_bytes);
    atomic_fetch_add(&j->path_ops[FERRY_PATH_STAGED], n);
    {
        uint64_t dec = 0;
        for (size_t k = 0; k < n; k++) dec += j->ext[ch[k].ext].decoded_size;
        count_stats(w->ctx, gpu_bytes, gpu_chunks, fallbacks, dec);
        cnt->decoded = dec;
    }
    ferry_dt_lap(tr, FERRY_DT_PLACE, &tlap);
    return (int64_t)file_bytes;
fail_sync:
    cu->StreamSynchronize(s);   /* nothing of this batch outlives its failure */
    return rc;
}
