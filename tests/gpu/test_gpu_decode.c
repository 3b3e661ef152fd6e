/* test_gpu_decode.c — compressed chunks decoded on the GPU (gpudecode.c):
 * zstd, zlib (+ HDF5 shuffle, fletcher32), LZ4 and Zarr's crc32c, into device
 * memory contiguously and as tiles of a larger array, with byteswap, missing
 * chunks and edge chunks; every result equal to the CPU decoder's and to the
 * source data; corrupt chunks fail naming the file, the chunk and the codec;
 * chunks nvCOMP refuses fall back to the CPU and are counted. Runs on the
 * real GPU with real nvCOMP, and in `make test-cudasim` on the stand-in driver
 * and the stand-in nvCOMP (tests/cudasim/nvcompsim.c). Skips (exit 0, with the
 * reason) without a GPU or without nvCOMP. */
#include "check.h"
#include "ferry.h"
#include "engine/knobs.h"
#include "cuda/nvcomp.h"
#include <dlfcn.h>
#include <fcntl.h>
#include <lz4.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#define FERRY_MIN_(a, b) ((a) < (b) ? (a) : (b))
#include <zstd.h>

static ferry_ctx *ctx_;
static char dir_[256];

/* float32-like data with some structure (compressible, not trivially) */
static void make_data(uint8_t *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(((i / 4) * 7 + seed) % 251 ^ ((i % 4 == 3) ? 0x3f : 0));
}

static size_t zstd_enc(const uint8_t *in, size_t n, uint8_t *out, size_t cap, int level) {
    size_t r = ZSTD_compress(out, cap, in, n, level);
    return ZSTD_isError(r) ? 0 : r;
}
static size_t zlib_enc(const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
    uLongf m = cap;
    return compress2(out, &m, in, n, 4) == Z_OK ? (size_t)m : 0;
}
static size_t lz4_enc(const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
    out[0] = (uint8_t)n; out[1] = (uint8_t)(n >> 8); out[2] = (uint8_t)(n >> 16); out[3] = (uint8_t)(n >> 24);
    int r = LZ4_compress_default((const char *)in, (char *)out + 4, (int)n, (int)cap - 4);
    return r > 0 ? (size_t)r + 4 : 0;
}
static void shuffle(const uint8_t *in, uint8_t *out, size_t n, size_t es) {
    size_t nel = n / es;
    for (size_t i = 0; i < nel; i++) for (size_t b = 0; b < es; b++) out[b * nel + i] = in[i * es + b];
    memcpy(out + nel * es, in + nel * es, n - nel * es);
}
static void put_le32_(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24); }
static void put_le32(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24); }

static int write_file(const char *path, const uint8_t *p, size_t n) {
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) return -1;
    int ok = write(fd, p, n) == (ssize_t)n;
    close(fd);
    return ok ? 0 : -1;
}

/* A context reads its knobs when it is made (engine/knobs.h): a knob for
 * the shared context, set in the environment too for the contexts made later
 * (NULL: unset). */
static void knob(const char *name, const char *v) {
    if (v) setenv(name, v, 1); else unsetenv(name);
    CHECK_EQ_I(ferry_knob_set(ctx_, name, v), 0);
}
static ferry_stats stats_(void) { ferry_stats s; ferry_stats_get(ctx_, &s); return s; }

/* one chunk of `codec` at off/len of f, decoded (cb bytes) into device buffer d
 * (nbytes long) at dst_off */
static void add_chunk(ferry_plan *p, ferry_file *f, uint32_t codec, uint64_t off, uint64_t len, uint64_t cb,
                      uintptr_t d, uint64_t nbytes, uint64_t dst_off) {
    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.kind = FERRY_EXTENT_READ; e.file = f; e.offset = off; e.length = len;
    e.codecs[0] = (ferry_codec){codec, 0}; e.ncodecs = 1;
    e.decoded_size = cb;
    e.dst = ferry_cuda_buf(0, d, nbytes);
    e.dst_offset = dst_off;
    CHECK_EQ_I(ferry_plan_add(p, &e), 0);
}

/* a plan of n zstd chunks of f, chunk i into d at i * cb; chunk `cut_at`
 * (if any: n or more for none) `cut` bytes short */
static ferry_plan *zstd_chunks_plan(ferry_file *f, const uint64_t *off, const uint64_t *len, size_t n, uint64_t cb,
                                    uintptr_t d, size_t cut_at, uint64_t cut) {
    ferry_plan *p;
    ferry_plan_create(&p);
    for (size_t i = 0; i < n; i++)
        add_chunk(p, f, FERRY_CODEC_ZSTD, off[i], len[i] - (i == cut_at ? cut : 0), cb, d, n * cb, i * cb);
    return p;
}

/* The stand-in driver's counters (tests/cudasim: cudasim_count(name, device)),
 * or NULL on a real driver. */
typedef long (*cudasim_count_fn)(const char *, int);
static cudasim_count_fn cudasim_counter(void) {
    void *sim = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    cudasim_count_fn f = sim ? (cudasim_count_fn)dlsym(sim, "cudasim_count") : NULL;
    if (sim) dlclose(sim);   /* RTLD_NOLOAD: the driver stays loaded, its symbols valid */
    return f;
}

/* n chunks of cb bytes (make_data(seed)), each zstd-encoded at `level` (-1:
 * levels 0-3 in turn), back to back in the file dir_/name (its path in
 * z->path): the source, each chunk's offset and length, the file's size. */
typedef struct zchunks { uint8_t *src; uint64_t *off, *len, size; char path[600]; } zchunks;
static void zchunks_write(zchunks *z, const char *name, size_t n, size_t cb, int seed, int level) {
    uint8_t *file = malloc(n * (cb + 64));
    z->src = malloc(n * cb);
    z->off = malloc(n * 8);
    z->len = malloc(n * 8);
    z->size = 0;
    make_data(z->src, n * cb, seed);
    for (size_t i = 0; i < n; i++) {
        size_t k = zstd_enc(z->src + i * cb, cb, file + z->size, cb + 64, level < 0 ? (int)(i % 4) : level);
        z->off[i] = z->size; z->len[i] = k; z->size += k;
    }
    snprintf(z->path, sizeof z->path, "%s/%s", dir_, name);
    write_file(z->path, file, z->size);
    free(file);
}
static void zchunks_free(zchunks *z) { free(z->src); free(z->off); free(z->len); }
/* A context of its own (its own pool of call slots) with `path` open in it as *f. */
static ferry_ctx *ctx_with_file(const char *path, ferry_file **f) {
    ferry_ctx *c = NULL;
    CHECK_EQ_I(ferry_ctx_create(&c, NULL), 0);
    CHECK_EQ_I(ferry_file_open(c, path, FERRY_READ, f), 0);
    return c;
}

/* A 2-D float32 array of R x C elements in chunks of r x c, every chunk
 * encoded by `codec` and stored as its own file (Zarr-like: edge chunks stored
 * full size, chunk (1,1) missing when `hole`), read into device memory with
 * each chunk a tile; checked against the source. */
/* A blosc v1 frame as c-blosc writes it (blosc.c has the layout): LZ4 inner
 * codec, byte shuffle of each block, one stream per byte plane (split), a
 * split LZ4 cannot shrink stored raw. */
static size_t blosc_enc(const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t ts, size_t blocksize) {
    size_t nblocks = (n + blocksize - 1) / blocksize, pos = 16 + 4 * nblocks;
    uint8_t *tmp = malloc(blocksize);
    out[0] = 2; out[1] = 1; out[2] = 0x01 | (1 << 5); out[3] = (uint8_t)ts;
    put_le32_(out + 4, (uint32_t)n); put_le32_(out + 8, (uint32_t)blocksize);
    for (size_t b = 0; b < nblocks; b++) {
        size_t bsize = b == nblocks - 1 ? n - b * blocksize : blocksize;
        int last_short = bsize != blocksize;
        shuffle(in + b * blocksize, tmp, bsize, ts);
        put_le32_(out + 16 + 4 * b, (uint32_t)pos);
        size_t nsplits = !last_short && bsize % ts == 0 ? ts : 1, ne = bsize / nsplits;
        for (size_t k = 0; k < nsplits; k++) {
            int c = LZ4_compress_default((const char *)tmp + k * ne, (char *)out + pos + 4, (int)ne, (int)(cap - pos - 4));
            if (c <= 0 || (size_t)c >= ne) { memcpy(out + pos + 4, tmp + k * ne, ne); c = (int)ne; }
            put_le32_(out + pos, (uint32_t)c);
            pos += 4 + (size_t)c;
        }
    }
    put_le32_(out + 12, (uint32_t)pos);
    free(tmp);
    return pos;
}

enum { C_ZSTD, C_ZLIB_SHUF, C_LZ4, C_ZSTD_CRC, C_ZSTD_BE, C_BLOSC };
static int dev_ = 0;   /* the device grid_case reads into */
/* a grid's chunk files, its plan into device memory d, the data it must read */
typedef struct grid {
    int codec, hole;
    uint64_t R, C, r, c;
    ferry_plan *plan;
    uintptr_t d;
    uint8_t *src;
} grid;
enum { ES = 4 };

static void grid_make(grid *g, int codec, uint64_t R, uint64_t C, uint64_t r, uint64_t c, int hole) {
    const size_t es = ES, chunk_bytes = r * c * es;
    uint64_t gr = (R + r - 1) / r, gc = (C + c - 1) / c;
    *g = (grid){codec, hole, R, C, r, c, NULL, 0, malloc(R * C * es)};
    uint8_t *src = g->src, *raw = malloc(chunk_bytes), *tmp = malloc(chunk_bytes);
    size_t cap = chunk_bytes * 2 + 1024;
    uint8_t *enc = malloc(cap);
    make_data(src, R * C * es, (unsigned)codec);
    ferry_plan *plan;
    ferry_plan_create(&plan);
    g->plan = plan;
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, dev_, R * C * es + 8, &d), 0);
    g->d = d;
    float nanfill = -1.0f;
    for (uint64_t i = 0; i < gr; i++)
        for (uint64_t k = 0; k < gc; k++) {
            /* the chunk as stored: full size, the array's values where they exist */
            memset(raw, 0, chunk_bytes);
            uint64_t rows = FERRY_MIN_(r, R - i * r), cols = FERRY_MIN_(c, C - k * c);
            for (uint64_t y = 0; y < rows; y++)
                memcpy(raw + y * c * es, src + ((i * r + y) * C + k * c) * es, cols * es);
            ferry_extent e;
            memset(&e, 0, sizeof e);
            e.kind = FERRY_EXTENT_READ;
            char path[600];
            snprintf(path, sizeof path, "%s/c%d.%llu.%llu", dir_, codec, (unsigned long long)i, (unsigned long long)k);
            size_t n = 0;
            switch (codec) {
            case C_ZSTD: n = zstd_enc(raw, chunk_bytes, enc, cap, 3); e.codecs[0] = (ferry_codec){FERRY_CODEC_ZSTD, 0}; e.ncodecs = 1; break;
            case C_ZSTD_BE:
                for (size_t q = 0; q < chunk_bytes; q += 4) { uint8_t t[4]; memcpy(t, raw + q, 4); for (int b = 0; b < 4; b++) tmp[q + b] = t[3 - b]; }
                n = zstd_enc(tmp, chunk_bytes, enc, cap, 1);
                e.codecs[0] = (ferry_codec){FERRY_CODEC_ZSTD, 0}; e.codecs[1] = (ferry_codec){FERRY_CODEC_BYTESWAP, 4}; e.ncodecs = 2;
                break;
            case C_ZSTD_CRC:
                n = zstd_enc(raw, chunk_bytes, enc, cap, 0);
                put_le32(enc + n, ferry_crc32c(0, enc, n)); n += 4;
                e.codecs[0] = (ferry_codec){FERRY_CODEC_CRC32C, 0}; e.codecs[1] = (ferry_codec){FERRY_CODEC_ZSTD, 0}; e.ncodecs = 2;
                break;
            case C_ZLIB_SHUF:
                shuffle(raw, tmp, chunk_bytes, es);
                n = zlib_enc(tmp, chunk_bytes, enc, cap);
                e.codecs[0] = (ferry_codec){FERRY_CODEC_ZLIB, 0}; e.codecs[1] = (ferry_codec){FERRY_CODEC_SHUFFLE, 4}; e.ncodecs = 2;
                break;
            case C_LZ4: n = lz4_enc(raw, chunk_bytes, enc, cap); e.codecs[0] = (ferry_codec){FERRY_CODEC_LZ4, 0}; e.ncodecs = 1; break;
            case C_BLOSC:   /* noise in the low bytes: their planes stay raw */
                for (size_t q = 0; q < chunk_bytes; q += 4) raw[q] ^= (uint8_t)(q * 2654435761u >> 24);
                if (!(hole && i == 1 && k == 1))
                    for (uint64_t y = 0; y < rows; y++) memcpy(src + ((i * r + y) * C + k * c) * es, raw + y * c * es, cols * es);
                n = blosc_enc(raw, chunk_bytes, enc, cap, es, chunk_bytes > 1024 ? 512 : chunk_bytes);
                e.codecs[0] = (ferry_codec){FERRY_CODEC_BLOSC, 0}; e.ncodecs = 1;
                break;
            }
            CHECK(n > 0);
            if (!(hole && i == 1 && k == 1)) CHECK_EQ_I(write_file(path, enc, n), 0);
            else unlink(path);
            e.path = path;
            e.offset = 0;
            e.length = n;
            e.decoded_size = chunk_bytes;
            e.dst = ferry_cuda_buf(dev_, d, R * C * es);
            e.dst_offset = (i * r * C + k * c) * es;
            e.flags = FERRY_EXTENT_MISSING_FILLS;
            memcpy(e.fill, &nanfill, 4);
            ferry_place pl;
            memset(&pl, 0, sizeof pl);
            pl.ndim = 2; pl.itemsize = 4;
            pl.count[0] = rows; pl.count[1] = cols;
            pl.src_stride[0] = (int64_t)(c * es); pl.src_stride[1] = 4;
            pl.dst_stride[0] = (int64_t)(C * es); pl.dst_stride[1] = 4;
            e.place = &pl;
            e.label = "v";
            CHECK_EQ_I(ferry_plan_add(plan, &e), 0);
        }
    free(raw); free(tmp); free(enc);
}

static ferry_run_opts decode_opts(const char *decode) {
    ferry_run_opts o;
    memset(&o, 0, sizeof o);
    ferry_decode_policy_parse(decode, (ferry_decode_policy *)&o.decode);
    return o;
}

/* what the grid's plan read into device memory, against its data; frees it */
static void grid_check(grid *g, const char *decode) {
    const size_t es = ES;
    uint64_t R = g->R, C = g->C, r = g->r, c = g->c;
    int codec = g->codec, hole = g->hole;
    const uint8_t *src = g->src;
    uintptr_t d = g->d;
    float nanfill = -1.0f;
    uint8_t *back = malloc(R * C * es);
    ferry_memcpy(ctx_, ferry_host_buf(back, R * C * es), ferry_cuda_buf(dev_, d, R * C * es), R * C * es);
    size_t bad = 0;
    for (uint64_t y = 0; y < R; y++)
        for (uint64_t x = 0; x < C; x++) {
            const uint8_t *want = src + (y * C + x) * es;
            if (hole && y / r == 1 && x / c == 1) want = (const uint8_t *)&nanfill;
            if (memcmp(back + (y * C + x) * es, want, es)) bad++;
        }
    if (bad) fprintf(stderr, "  codec %d %llux%llu/%llux%llu %s: %zu wrong elements\n", codec, (unsigned long long)R,
                     (unsigned long long)C, (unsigned long long)r, (unsigned long long)c, decode, bad);
    CHECK_EQ_I(bad, 0);
    ferry_cuda_free(ctx_, d);
    ferry_plan_destroy(g->plan);
    free(g->src); free(back);
}

static void grid_case(int codec, uint64_t R, uint64_t C, uint64_t r, uint64_t c, int hole, const char *decode) {
    grid g;
    grid_make(&g, codec, R, C, r, c, hole);
    ferry_run_opts o = decode_opts(decode);
    int64_t got = ferry_run(ctx_, g.plan, &o);
    if (got < 0) fprintf(stderr, "  %s\n", ferry_errmsg(ctx_));
    CHECK(got > 0);
    grid_check(&g, decode);
}
static void test_zstd_tiles_on_gpu(void) {
    ferry_stats_reset(ctx_);
    grid_case(C_ZSTD, 100, 70, 32, 16, 1, "gpu");
    ferry_stats s = stats_();
    CHECK(s.gpu_chunks >= 15);            /* 4 x 5 chunks, one missing */
    CHECK(s.gpu_batches >= 1);
    CHECK_EQ_I(s.gpu_cpu_fallbacks, 0);   /* the missing chunk is a fill, not a fallback */
}

/* one chunk = the whole array: nvCOMP writes straight into the destination */
static void test_zstd_contiguous(void) {
    ferry_stats_reset(ctx_);
    grid_case(C_ZSTD, 64, 256, 8, 256, 0, "gpu");
    CHECK_EQ_I(stats_().gpu_chunks, 8);
    CHECK_EQ_I(stats_().gpu_cpu_fallbacks, 0);
}

static void test_every_codec_gpu_equals_cpu(void) {
    static const int codecs[] = {C_ZSTD, C_ZLIB_SHUF, C_LZ4, C_ZSTD_CRC, C_ZSTD_BE, C_BLOSC};
    for (size_t i = 0; i < sizeof codecs / sizeof *codecs; i++) {
        ferry_stats_reset(ctx_);
        grid_case(codecs[i], 33, 47, 8, 16, 1, "gpu");
        CHECK(stats_().gpu_chunks > 0);
        grid_case(codecs[i], 33, 47, 8, 16, 1, "cpu");
        grid_case(codecs[i], 40, 32, 40, 32, 0, "auto");
    }
}

/* A second device: batches are per device, decoded on its own streams and
 * scratch, and a plan filling both devices completes both. */
static void test_second_device(void) {
    if (ferry_cuda_device_count(ctx_) < 2) { printf("  (one device: skipped)\n"); return; }
    long (*sim)(const char *, int) = (long (*)(const char *, int))dlsym(RTLD_DEFAULT, "cudasim_count");
    long cross0 = sim ? sim("cross_device_copies", 0) + sim("cross_device_copies", 1) : 0;
    dev_ = 1;
    ferry_stats_reset(ctx_);
    grid_case(C_ZSTD, 40, 40, 16, 16, 1, "gpu");
    grid_case(C_ZLIB_SHUF, 40, 40, 16, 16, 0, "gpu");
    grid_case(C_BLOSC, 40, 40, 16, 16, 0, "gpu");
    dev_ = 0;
    if (sim) CHECK_EQ_I(sim("cross_device_copies", 0) + sim("cross_device_copies", 1), cross0);   /* all under device 1's context */
    CHECK(stats_().gpu_chunks >= 26);
    CHECK_EQ_I(stats_().gpu_cpu_fallbacks, 0);
}

/* AUTO (the built-in measured rates, gpudecode.c): zstd goes to the GPU
 * alone; "cpu" keeps it on the CPU */
static void test_auto_policy(void) {
    ferry_stats_reset(ctx_);
    grid_case(C_ZSTD, 16, 16, 8, 8, 0, "auto");
    CHECK_EQ_I(stats_().gpu_chunks, 4);
    ferry_stats_reset(ctx_);
    grid_case(C_ZSTD, 16, 16, 8, 8, 0, "cpu");
    CHECK_EQ_I(stats_().gpu_chunks, 0);
}

/* One queue, two decoders: under AUTO deflate chunks form one queue that a
 * GPU feeder (batches of 4 chunks here) and the CPU workers (one chunk each)
 * drain together; the feeder claims only what the GPU finishes before the
 * CPU would finish the rest (gpudecode.c's rates). With the built-in rates the
 * 512 MiB model (128 chunks of 16 KiB for 4 MiB ones: the rule compares
 * bytes / rates) is done by the CPU sooner than one GPU chunk's latency: the
 * GPU takes nothing. With rates where the GPU helps but the job is not big
 * enough for GPU calls (FERRY_GPU_RATES: a slow CPU, a chunk latency of 0.7 of
 * the CPU's whole time) both take chunks of the 1 GiB model, none twice or
 * never (the result is byte-exact, gpu_chunks counts only nvCOMP's), none
 * through the fallback. Which side takes how many depends on the threads'
 * scheduling: a run where one side took everything is retried (twice). */
size_t ferry_gpudecode_tasks(const ferry_job *j);   /* internal (gpudecode.h): GPU feeder and shared-chunk tasks */
static void test_one_queue_both_decoders(void) {
    knob("FERRY_GPU_FEEDERS", "1");
    knob("FERRY_GPU_BATCH", "64K");   /* 16 KiB chunks: 4 per batch */
    const char *th = getenv("FERRY_THREADS");
    ferry_stats_reset(ctx_);
    grid_case(C_ZLIB_SHUF, 512, 1024, 64, 64, 0, "auto");
    if (!th) {   /* 16 threads (fewer: the CPU's time grows and the GPU helps) */
        CHECK_EQ_I(stats_().gpu_chunks, 0);
        /* a queue the GPU could never claim from is not made: no GPU feeder tasks, the job is decode="cpu"'s */
        grid g;
        grid_make(&g, C_ZLIB_SHUF, 512, 1024, 64, 64, 0);
        ferry_run_opts o = decode_opts("auto");
        ferry_job *jb;
        CHECK_EQ_I(ferry_submit(ctx_, g.plan, &o, &jb), 0);
        CHECK_EQ_I(ferry_gpudecode_tasks(jb), 0);
        CHECK(ferry_job_wait(jb, -1) > 0);
        ferry_job_destroy(jb);
        grid_check(&g, "auto");
    }
    knob("FERRY_GPU_RATES", "6.34,4.4,0.05");
    int both = 0;
    for (int attempt = 0; attempt < 3 && !both; attempt++) {
        ferry_stats_reset(ctx_);
        grid_case(C_ZLIB_SHUF, 1024, 1024, 64, 64, 1, "auto");   /* 256 chunks, one missing (a fill) */
        ferry_stats s = stats_();
        CHECK_EQ_I(s.gpu_cpu_fallbacks, 0);
        CHECK(s.gpu_chunks <= 255);
        both = s.gpu_chunks > 0 && s.gpu_chunks < 255;
        printf("  attempt %d: GPU %llu chunks in %llu batches, CPU %llu\n", attempt + 1, (unsigned long long)s.gpu_chunks,
               (unsigned long long)s.gpu_batches, (unsigned long long)(255 - s.gpu_chunks));
    }
    if (!th || atoi(th) > 1) CHECK(both);   /* one thread: the feeder runs alone and takes every chunk */
    knob("FERRY_GPU_RATES", NULL);
    /* forced: every chunk on the GPU, no CPU tasks */
    ferry_stats_reset(ctx_);
    grid_case(C_ZLIB_SHUF, 1024, 1024, 64, 64, 0, "gpu");
    CHECK_EQ_I(stats_().gpu_chunks, 256);
    knob("FERRY_GPU_FEEDERS", NULL);
    knob("FERRY_GPU_BATCH", NULL);
}

/* A long load: AUTO with the built-in rates (no FERRY_GPU_RATES). An 8
 * GiB netCDF-4 load of 4 MiB deflate chunks, scaled by 1/256 (the rule
 * compares bytes / rates, so it is the same in chunks): 2,048 chunks of 16
 * KiB = 32 MiB. The CPU alone (16 threads) would take 32 MiB / 7.36 GB/s =
 * 4.6 ms, one GPU chunk's latency is 0.53 ms (4 MiB: 136 ms against the
 * CPU's 1.17 s for 8 GiB): more than BIG_JOB_LATENCIES (2) of them, so the
 * queue is cut into GPU calls that every worker reads, and the last chunks
 * go to the CPU workers: FERRY_GPU_TAIL=on, 15 x 0.46 x 1000 / 31 = 222, as
 * a zstd load's tail does; by default (balance for deflate) 432. The 512 MiB model (test_one_queue_both_decoders) gets no GPU
 * at all. Byte-exact either way. */
static void test_long_deflate_load_runs_as_gpu_calls(void) {
    knob("FERRY_GPU_FEEDERS", "2");   /* the default, said here: the rule's CPU rate is 14 of 16 threads */
    const char *th = getenv("FERRY_THREADS");
    knob("FERRY_GPU_TAIL", "on");
    ferry_stats_reset(ctx_);
    grid_case(C_ZLIB_SHUF, 2048, 4096, 64, 64, 0, "auto");
    ferry_stats s = stats_();
    printf("  8 GiB model, FERRY_GPU_TAIL=on: GPU %llu of 2048 chunks in %llu batches\n", (unsigned long long)s.gpu_chunks,
           (unsigned long long)s.gpu_batches);
    CHECK_EQ_I(s.gpu_cpu_fallbacks, 0);
    if (!th) CHECK_EQ_I(s.gpu_chunks, 2048 - 222);   /* 16 threads, as the rates assume */
    /* the default for deflate, FERRY_GPU_TAIL=balance: t x c / cpu = latency + (n - t) x c / gpu with
     * c = 16 KiB, cpu = 15 x 0.46 GB/s, gpu = 53 GB/s, latency 16 KiB / 31 MB/s:
     * t = (0.528 + 0.633 ms) / 2.683 us = 432 */
    knob("FERRY_GPU_TAIL", NULL);
    ferry_stats_reset(ctx_);
    grid_case(C_ZLIB_SHUF, 2048, 4096, 64, 64, 0, "auto");
    s = stats_();
    printf("  8 GiB model, the default (balance for deflate): GPU %llu of 2048 chunks\n", (unsigned long long)s.gpu_chunks);
    CHECK_EQ_I(s.gpu_cpu_fallbacks, 0);
    if (!th) CHECK_EQ_I(s.gpu_chunks, 2048 - 432);
    knob("FERRY_GPU_FEEDERS", NULL);
}

/* Jobs in flight together: a dataset's prefetched batches. Four 512 MiB-model
 * loads (test_one_queue_both_decoders: 128 deflate chunks each, the built-in
 * rates, 16 threads; alone the GPU takes none) submitted at once: each
 * is planned on its own, and the GPU takes none of any (FERRY_GPU_AHEAD, which
 * sent the jobs behind the first to the GPU, is gone: it ran slower on the GPU machine).
 * Byte-exact; afterwards a job alone takes none either. */
static size_t jobs_in_flight_gpu_chunks(void) {
    enum { NJ = 4 };
    grid g[NJ];
    ferry_job *jobs[NJ];
    ferry_run_opts o = decode_opts("auto");
    for (int k = 0; k < NJ; k++) grid_make(&g[k], C_ZLIB_SHUF, 512, 1024, 64, 64, 0);
    ferry_stats_reset(ctx_);
    for (int k = 0; k < NJ; k++) CHECK_EQ_I(ferry_submit(ctx_, g[k].plan, &o, &jobs[k]), 0);
    for (int k = 0; k < NJ; k++) {
        int64_t got = ferry_job_wait(jobs[k], -1);
        if (got < 0) fprintf(stderr, "  %s\n", ferry_errmsg(ctx_));
        CHECK(got > 0);
        ferry_job_destroy(jobs[k]);
        grid_check(&g[k], "auto");
    }
    ferry_stats s = stats_();
    CHECK_EQ_I(s.gpu_cpu_fallbacks, 0);
    return (size_t)s.gpu_chunks;
}

/* A finished job its caller still holds (a dataset's batch not yet handed
 * out) decodes nothing, so a deflate job planned beside it keeps the calls of
 * a job alone: 2,000 one-KiB chunks (beyond the one-call count) are 8 calls
 * of 250, not the 4 of 500 of two jobs sharing a wave. Counting held jobs as
 * in flight put each of XarrayDataset's jobs in one slot on the GPU machine, its
 * calls one after the other. Byte-exact either way. */
/* A job planned beside a finished job its caller still holds (a dataset's
 * batch waiting to be handed out) shares the wave as one of two (4 calls of
 * 500: the next read is about to come), not as one of every held job (the
 * count of 440bcd8, which put each call in a slot of its own); alone it keeps
 * 8 calls of 250. FERRY_GPU_SHARE=running (the rule before): 250 beside it. */
static void test_held_job_makes_a_pair(void) {
    void *sim = dlopen(getenv("FERRY_NVCOMP") ? getenv("FERRY_NVCOMP") : "libnvcomp.so.6", RTLD_NOW | RTLD_NOLOAD);
    long (*count)(const char *) = sim ? (long (*)(const char *))dlsym(sim, "nvcompsim_count") : NULL;
    grid held, g;
    grid_make(&held, C_ZLIB_SHUF, 64, 64, 16, 16, 0);
    ferry_run_opts o = decode_opts("gpu");
    ferry_job *jh;
    CHECK_EQ_I(ferry_submit(ctx_, held.plan, &o, &jh), 0);
    int64_t held_got = ferry_job_wait(jh, -1);   /* done, not destroyed */
    if (held_got <= 0) fprintf(stderr, "  %s\n", ferry_errmsg(ctx_));
    CHECK(held_got > 0);
    grid_check(&held, "gpu");
    static const struct { const char *share; int held; long per_call; } cases[] = {
        {NULL, 1, 500}, {"running", 1, 250}, {"pair", 1, 500}, {NULL, 0, 250}, {"running", 0, 250},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (!cases[k].held && jh) { ferry_job_destroy(jh); jh = NULL; }
        grid_make(&g, C_ZLIB_SHUF, 640, 800, 16, 16, 0);   /* 40 x 50 chunks of 16 x 16 float32 (the chunk files are rewritten) */
        if (cases[k].share) knob("FERRY_GPU_SHARE", cases[k].share);
        if (count) count("reset_max_per_call");
        int64_t got = ferry_run(ctx_, g.plan, &o);
        knob("FERRY_GPU_SHARE", NULL);
        if (got < 0) fprintf(stderr, "  %s\n", ferry_errmsg(ctx_));
        CHECK(got > 0);
        if (count) CHECK_EQ_I(count("max_per_call"), cases[k].per_call);
        else if (k == 0) printf("  (the calls' sizes need the stand-in nvCOMP; byte-exact only)\n");
        grid_check(&g, "gpu");
    }
    if (jh) ferry_job_destroy(jh);
}

static void test_jobs_in_flight_share_the_gpu(void) {
    knob("FERRY_GPU_BATCH", "64K");   /* 16 KiB chunks: 4 per batch */
    const char *th = getenv("FERRY_THREADS");
    size_t own = jobs_in_flight_gpu_chunks();
    ferry_stats_reset(ctx_);
    grid_case(C_ZLIB_SHUF, 512, 1024, 64, 64, 0, "auto");
    size_t alone = (size_t)stats_().gpu_chunks;
    printf("  4 jobs in flight: GPU %zu of 512 chunks; then a job alone %zu\n", own, alone);
    if (!th) {   /* 16 threads, as the rates assume */
        CHECK_EQ_I(own, 0);
        CHECK_EQ_I(alone, 0);
    }
    knob("FERRY_GPU_BATCH", NULL);
}

/* one chunk file, corrupted in one way, read onto the GPU: an error that names
 * the file, the chunk and the codec */
static void corrupt_case(int codec, int how, const char *want_msg) {
    uint8_t raw[4096], enc[8192], tmp[4096];
    make_data(raw, sizeof raw, 9);
    size_t n;
    ferry_extent e;
    memset(&e, 0, sizeof e);
    if (codec == C_ZSTD) { n = zstd_enc(raw, sizeof raw, enc, sizeof enc, 3); e.codecs[0] = (ferry_codec){FERRY_CODEC_ZSTD, 0}; e.ncodecs = 1; }
    else if (codec == C_ZSTD_CRC) {
        n = zstd_enc(raw, sizeof raw, enc, sizeof enc, 3); put_le32(enc + n, ferry_crc32c(0, enc, n)); n += 4;
        e.codecs[0] = (ferry_codec){FERRY_CODEC_CRC32C, 0}; e.codecs[1] = (ferry_codec){FERRY_CODEC_ZSTD, 0}; e.ncodecs = 2;
    } else if (codec == C_ZLIB_SHUF) {
        shuffle(raw, tmp, sizeof raw, 4); n = zlib_enc(tmp, sizeof raw, enc, sizeof enc);
        e.codecs[0] = (ferry_codec){FERRY_CODEC_ZLIB, 0}; e.codecs[1] = (ferry_codec){FERRY_CODEC_SHUFFLE, 4}; e.ncodecs = 2;
    } else { n = lz4_enc(raw, sizeof raw, enc, sizeof enc); e.codecs[0] = (ferry_codec){FERRY_CODEC_LZ4, 0}; e.ncodecs = 1; }
    e.decoded_size = sizeof raw;
    if (how == 0) n -= 7;                       /* truncated */
    /* a flipped bit: in the middle where a checksum covers it (crc32c, zlib's
     * Adler-32), in the header where none does (zstd without its optional
     * content checksum and LZ4 decode a flipped literal to other bytes of the
     * right size, on the CPU too: nothing can tell) */
    else if (how == 1) enc[codec == C_ZSTD || codec == C_LZ4 ? 1 : n / 2] ^= 0x10;
    else e.decoded_size = sizeof raw - 4;       /* the chunk's declared size is wrong */
    char path[600];
    snprintf(path, sizeof path, "%s/corrupt.bin", dir_);
    write_file(path, enc, n);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx_, path, FERRY_READ, &f), 0);
    uintptr_t d;
    ferry_cuda_malloc(ctx_, 0, sizeof raw, &d);
    e.kind = FERRY_EXTENT_READ;
    e.file = f;
    e.length = n;
    e.dst = ferry_cuda_buf(0, d, sizeof raw);
    e.label = "temp";
    ferry_plan *p;
    ferry_plan_create(&p);
    ferry_plan_add(p, &e);
    ferry_run_opts o;
    memset(&o, 0, sizeof o);
    o.decode = FERRY_DECODE_GPU;
    int64_t r = ferry_run(ctx_, p, &o);
    if (r >= 0) fprintf(stderr, "  codec %d corruption %d decoded without an error\n", codec, how);
    CHECK(r < 0);
    if (r < 0) {
        const char *m = ferry_errmsg(ctx_);
        CHECK_STR_CONTAINS(m, "corrupt.bin");
        CHECK_STR_CONTAINS(m, "variable temp");
        CHECK_STR_CONTAINS(m, "chunk at byte 0");
        CHECK_STR_CONTAINS(m, want_msg);
    }
    ferry_plan_destroy(p);
    ferry_file_close(f);
    ferry_cuda_free(ctx_, d);
}

static void test_corrupt_chunks_fail_clearly(void) {
    static const int codecs[] = {C_ZSTD, C_ZSTD_CRC, C_ZLIB_SHUF, C_LZ4};
    static const char *names[] = {"zstd", "crc32c", "zlib", "lz4"};
    for (int c = 0; c < 4; c++)
        for (int how = 0; how < 3; how++) {
            corrupt_case(codecs[c], how, c == 1 && how < 2 ? "crc32c" : c == 1 ? "zstd" : names[c]);
        }
}

/* The stand-in's fault switches: chunks nvCOMP says it cannot decode are
 * decoded by the CPU and counted; nvCOMP output that fails zlib's Adler-32 is
 * caught (the CPU then decodes the chunk). */
static void test_fallbacks_counted(void) {
    if (!dlsym(RTLD_DEFAULT, "nvcompsim_count") && !getenv("FERRY_NVCOMP")) { printf("  (fault switches need the stand-in nvCOMP)\n"); return; }
    void *sim = dlopen(getenv("FERRY_NVCOMP"), RTLD_NOW | RTLD_NOLOAD);
    if (!sim || !dlsym(sim, "nvcompsim_count")) { printf("  (fault switches need the stand-in nvCOMP)\n"); return; }
    setenv("FERRY_NVCOMPSIM_FAIL", "notsupported", 1);
    ferry_stats_reset(ctx_);
    grid_case(C_ZSTD, 32, 32, 16, 16, 0, "gpu");
    CHECK_EQ_I(stats_().gpu_cpu_fallbacks, 4);
    CHECK_EQ_I(stats_().gpu_chunks, 0);
    setenv("FERRY_NVCOMPSIM_FAIL", "garbage", 1);
    ferry_stats_reset(ctx_);
    grid_case(C_ZLIB_SHUF, 32, 32, 16, 16, 0, "gpu");
    CHECK_EQ_I(stats_().gpu_cpu_fallbacks, 4);   /* every Adler-32 failed: the CPU decoded them */
    unsetenv("FERRY_NVCOMPSIM_FAIL");
    long (*count)(const char *) = (long (*)(const char *))dlsym(sim, "nvcompsim_count");
    CHECK_EQ_I(count("temp_too_small"), 0);
    CHECK_EQ_I(count("bad_pointer"), 0);
    dlclose(sim);
}

/* pinning refused (a locked-memory limit): the worker's host buffers are
 * plain memory, mmapped from 2 MiB up (hostmem.c), and are given back as
 * such when the context goes (not free()d). Needs the stand-in's switch. */
static void test_unpinned_buffers_released(void) {
    void *sim = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!sim || !dlsym(sim, "cudasim_count")) { printf("  (the pinning switch needs the stand-in driver)\n"); if (sim) dlclose(sim); return; }
    dlclose(sim);
    setenv("FERRY_CUDASIM_NOPIN", "1", 1);
    ferry_ctx *saved = ctx_;
    CHECK_EQ_I(ferry_ctx_create(&ctx_, NULL), 0);
    /* one 4 MiB blosc chunk, its low bytes raw: packed input, scratch and
     * host buffers of more than 2 MiB */
    grid_case(C_BLOSC, 1024, 1024, 1024, 1024, 0, "gpu");
    CHECK_EQ_I(stats_().gpu_chunks, 1);
    grid_case(C_ZSTD, 1024, 1024, 1024, 1024, 0, "cpu");   /* hcpu: the CPU's decoded chunks */
    ferry_ctx_destroy(ctx_);
    ctx_ = saved;
    unsetenv("FERRY_CUDASIM_NOPIN");
}

/* many small chunks of one file: batches split over workers, one H2D each */
static void test_many_chunks_one_file(void) {
    const size_t nchunk = 300, cb = 4096;
    zchunks z;
    zchunks_write(&z, "many.bin", nchunk, cb, 5, -1);
    uint8_t *src = z.src;
    const uint64_t *off = z.off, *len = z.len, pos = z.size;
    const char *path = z.path;
    ferry_file *f;
    ferry_file_open(ctx_, path, FERRY_READ, &f);
    uintptr_t d;
    ferry_cuda_malloc(ctx_, 0, nchunk * cb + 1, &d);
    ferry_plan *p;
    ferry_plan_create(&p);
    for (size_t i = 0; i < nchunk; i++) {
        size_t k = (i * 7) % nchunk;   /* out of file order; an odd address: outputs go through scratch */
        add_chunk(p, f, FERRY_CODEC_ZSTD, off[k], len[k], cb, d + 1, nchunk * cb, k * cb);
    }
    knob("FERRY_GPU_BATCH", "64K");
    uint8_t *back = malloc(nchunk * cb);
    /* all workers as feeders; then 2 threads: 2 feeders run ~10 batches each
     * through their 4 slots (each slot reused: the oldest batch is checked
     * when its slot comes round); then one slot (no overlap at all) */
    for (int round = 0; round < 3; round++) {
        if (round == 2) knob("FERRY_GPU_SLOTS", "1");
        memset(back, 0, nchunk * cb);   /* no stale result of the round before can pass */
        ferry_memcpy(ctx_, ferry_cuda_buf(0, d + 1, nchunk * cb), ferry_host_buf(back, nchunk * cb), nchunk * cb);
        ferry_stats_reset(ctx_);
        ferry_run_opts o;
        memset(&o, 0, sizeof o);
        o.decode = FERRY_DECODE_GPU;
        o.threads = round ? 2 : 0;
        int64_t r = ferry_run(ctx_, p, &o);
        if (r < 0) fprintf(stderr, "  %s\n", ferry_errmsg(ctx_));
        CHECK_EQ_I(r, (int64_t)pos);
        CHECK_EQ_I(stats_().gpu_chunks, nchunk);
        CHECK(stats_().gpu_batches >= 10);
        ferry_memcpy(ctx_, ferry_host_buf(back, nchunk * cb), ferry_cuda_buf(0, d + 1, nchunk * cb), nchunk * cb);
        CHECK(memcmp(back, src, nchunk * cb) == 0);
    }
    knob("FERRY_GPU_SLOTS", NULL);
    knob("FERRY_GPU_BATCH", NULL);
    ferry_plan_destroy(p);
    ferry_file_close(f);
    ferry_cuda_free(ctx_, d);
    free(back);
    zchunks_free(&z);
}

/* Feeders keep two batches in flight: a chunk whose corruption only the
 * decode finds (a flipped byte inside a zlib stream: nvCOMP's output fails
 * the Adler-32, the CPU's inflate fails too), in a later batch while other
 * batches are open, fails the job with its file and byte; nothing hangs, and
 * a read of the same plan without the bad chunk still succeeds after it. */
static void test_corrupt_chunk_with_batches_in_flight(void) {
    const size_t nchunk = 200, cb = 4096, bad = 123;
    uint8_t *src = malloc(nchunk * cb), *file = malloc(nchunk * (cb + 64));
    make_data(src, nchunk * cb, 6);
    uint64_t *off = malloc(nchunk * 8), *len = malloc(nchunk * 8), pos = 0;
    for (size_t i = 0; i < nchunk; i++) {
        size_t n = zlib_enc(src + i * cb, cb, file + pos, cb + 64);
        off[i] = pos; len[i] = n; pos += n;
    }
    file[off[bad] + len[bad] / 2] ^= 0x21;
    char path[600];
    snprintf(path, sizeof path, "%s/inflight.bin", dir_);
    write_file(path, file, pos);
    ferry_file *f;
    ferry_file_open(ctx_, path, FERRY_READ, &f);
    uintptr_t d;
    ferry_cuda_malloc(ctx_, 0, nchunk * cb, &d);
    knob("FERRY_GPU_BATCH", "16K");   /* 4 chunks a batch: 50 batches */
    for (int skip_bad = 0; skip_bad < 2; skip_bad++) {
        ferry_plan *p;
        ferry_plan_create(&p);
        for (size_t i = 0; i < nchunk; i++)
            if (!(skip_bad && i == bad)) add_chunk(p, f, FERRY_CODEC_ZLIB, off[i], len[i], cb, d, nchunk * cb, i * cb);
        ferry_run_opts o;
        memset(&o, 0, sizeof o);
        o.decode = FERRY_DECODE_GPU;
        int64_t r = ferry_run(ctx_, p, &o);
        if (!skip_bad) {
            CHECK(r < 0);
            char want[64];
            snprintf(want, sizeof want, "chunk at byte %llu", (unsigned long long)off[bad]);
            CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "inflight.bin");
            CHECK_STR_CONTAINS(ferry_errmsg(ctx_), want);
            CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "zlib");
        } else {
            if (r < 0) fprintf(stderr, "  %s\n", ferry_errmsg(ctx_));
            CHECK_EQ_I(r, (int64_t)(pos - len[bad]));
            uint8_t *back = malloc(nchunk * cb);
            ferry_memcpy(ctx_, ferry_host_buf(back, nchunk * cb), ferry_cuda_buf(0, d, nchunk * cb), nchunk * cb);
            CHECK(memcmp(back, src, bad * cb) == 0);
            CHECK(memcmp(back + (bad + 1) * cb, src + (bad + 1) * cb, (nchunk - bad - 1) * cb) == 0);
            free(back);
        }
        ferry_plan_destroy(p);
    }
    knob("FERRY_GPU_BATCH", NULL);
    ferry_file_close(f);
    ferry_cuda_free(ctx_, d);
    free(src); free(file); free(off); free(len);
}

/* Where a batch's chunks go in its pinned buffer (gpudecode.c,
 * ferry_gpudecode_slot): at the chunk's place in a 64-byte line of its file,
 * so that the kernel's copy out of the page cache runs at memory speed (a
 * destination 8 bytes after the source read at a quarter of it), moved down
 * where nvCOMP's alignment of the payload after a header asks for it; never
 * before `at`, never more than ferry_gpudecode_slot_room. */
uint64_t ferry_gpudecode_slot(uint64_t at, uint64_t file_off, unsigned hdr, unsigned align);   /* internal (gpudecode.h) */
uint64_t ferry_gpudecode_slot_room(uint64_t len);
static void test_slots_follow_the_file_line(void) {
    CHECK_EQ_I(ferry_gpudecode_slot(0, 0, 0, 8), 0);            /* a Zarr chunk file: line-aligned */
    CHECK_EQ_I(ferry_gpudecode_slot(790001, 0, 0, 8), 790016);  /* the next line after the last chunk */
    CHECK_EQ_I(ferry_gpudecode_slot(100, 4096 + 1234, 0, 1), 146);   /* 1234 mod 64 = 18, the line at 128 */
    CHECK_EQ_I(ferry_gpudecode_slot(0, 0, 2, 4), 62);           /* zlib in its own file: payload at 64 */
    CHECK_EQ_I(ferry_gpudecode_slot(0, 11, 2, 4), 10);          /* moved down one: payload at 12 */
    int bad = 0;
    for (uint64_t at = 0; at < 200; at++)
        for (uint64_t off = 0; off < 130; off++)
            for (unsigned hdr = 0; hdr <= 4; hdr += 2)
                for (unsigned align = 1; align <= 8; align *= 2) {
                    uint64_t s = ferry_gpudecode_slot(at, off, hdr, align), len = 1000 + off;
                    int same_line = (off % 64 + hdr) % align == 0;
                    if (s < at || (s + hdr) % align || (same_line && s % 64 != off % 64) ||
                        (!same_line && (off % 64 - s % 64 + 64) % 64 >= align) ||
                        s + len > at + ferry_gpudecode_slot_room(len))
                        bad++;
                }
    CHECK_EQ_I(bad, 0);
}

/* The batcher's calls (gpudecode.c, ferry_gpudecode_call_chunks): nvCOMP
 * decodes a chunk per thread block, so the calls in flight must carry
 * hundreds of chunks (the GPU machine's card holds ~500 1 MiB zstd chunks at once): with 4
 * calls in flight 1,024 x 1 MiB zstd chunks are 4 calls of 256, 4,096 are 16
 * of 256, 256 x 4 MiB are 4 of 64 (256 MiB a call); with 8 (the default)
 * 1,024 are 8 of 128. Deflate is latency-bound (a 4 MiB chunk takes 136 ms
 * on the GPU machine): a queue it decodes within one such latency (516 or 1,034 x 4
 * MiB) is one call where the device has room; beyond, its calls are even and
 * as few waves of 8 as 512 MiB a call allows — 2,064 x 4 MiB are three waves
 * of 86, not 8 of 128 twice and a last of 16 that would take a whole latency
 * alone; two jobs in flight together share a wave, 4 calls each (a dataset's
 * 2,560 one-MiB chunks: 640 a call, not 320), where zstd's calls stay.
 * Then a plan of 1,024 small chunks runs as exactly 8 calls of 128,
 * every worker reading pieces of each, byte-exact; with a corrupt chunk in
 * the sixth call the job fails naming it, and the same context reads the
 * plan again afterwards; under AUTO the last 108 chunks go to the CPU
 * workers (FERRY_GPU_TAIL=off, or another job in flight: none), byte-exact. */
size_t ferry_gpudecode_call_chunks(size_t count, uint64_t max_chunk, int nslots, int cls, uint64_t dev_free, int jobs);   /* internal (gpudecode.h) */
static void test_calls_of_hundreds_of_chunks(void) {
    const int zstd = FERRY_NVCOMP_ZSTD, deflate = FERRY_NVCOMP_DEFLATE;
    CHECK_EQ_I(ferry_gpudecode_call_chunks(1024, 1u << 20, 4, zstd, 0, 1), 256);
    CHECK_EQ_I(ferry_gpudecode_call_chunks(4096, 1u << 20, 4, zstd, 0, 1), 256);
    CHECK_EQ_I(ferry_gpudecode_call_chunks(256, 4u << 20, 4, zstd, 0, 1), 64);
    CHECK_EQ_I(ferry_gpudecode_call_chunks(160, 1u << 20, 4, zstd, 0, 1), 40);
    CHECK_EQ_I(ferry_gpudecode_call_chunks(10, 1u << 20, 4, zstd, 0, 1), 32);
    CHECK_EQ_I(ferry_gpudecode_call_chunks(1024, 1u << 20, 8, zstd, 0, 1), 128);
    CHECK_EQ_I(ferry_gpudecode_call_chunks(4096, 1u << 20, 8, zstd, 0, 1), 256);
    CHECK_EQ_I(ferry_gpudecode_call_chunks(256, 4u << 20, 8, zstd, 0, 1), 32);
    CHECK_EQ_I(ferry_gpudecode_call_chunks(516, 4u << 20, 8, zstd, 0, 1), 33);      /* 256 MiB a call: two even waves */
    CHECK_EQ_I(ferry_gpudecode_call_chunks(516, 4u << 20, 8, deflate, 0, 1), 516);    /* within one latency: one call */
    CHECK_EQ_I(ferry_gpudecode_call_chunks(1034, 4u << 20, 8, deflate, 0, 1), 1034);
    CHECK_EQ_I(ferry_gpudecode_call_chunks(1034, 4u << 20, 8, deflate, 80ull << 30, 1), 1034);   /* 80 GiB free */
    CHECK_EQ_I(ferry_gpudecode_call_chunks(1034, 4u << 20, 8, deflate, 16ull << 30, 1), 65);     /* no room for it: two waves */
    CHECK_EQ_I(ferry_gpudecode_call_chunks(516, 4u << 20, 8, zstd, 0, 1) < 516, 1);  /* zstd is not latency-bound */
    CHECK_EQ_I(ferry_gpudecode_call_chunks(2064, 4u << 20, 8, deflate, 0, 1), 86);  /* 24 calls: three waves */
    /* two jobs in flight (a dataset's reads): deflate's wave is shared, 4 calls of 640 each, not 8 of 320 */
    CHECK_EQ_I(ferry_gpudecode_call_chunks(2560, 361 * 720 * 4, 8, deflate, 0, 1), 320);
    CHECK_EQ_I(ferry_gpudecode_call_chunks(2560, 361 * 720 * 4, 8, deflate, 0, 2), 640);
    CHECK_EQ_I(ferry_gpudecode_call_chunks(2560, 361 * 720 * 4, 8, deflate, 80ull << 30, 2), 640);   /* 80 GiB free: the share */
    CHECK_EQ_I(ferry_gpudecode_call_chunks(2560, 361 * 720 * 4, 8, deflate, 0, 3), 640);   /* 2 a wave, two waves */
    CHECK_EQ_I(ferry_gpudecode_call_chunks(2560, 1u << 20, 8, zstd, 0, 2), ferry_gpudecode_call_chunks(2560, 1u << 20, 8, zstd, 0, 1));
    CHECK_EQ_I(ferry_gpudecode_call_chunks(6000, 1u << 20, 8, deflate, 0, 1), 375); /* 512 a call at most: two waves of 8 */
    /* a device with 1 GiB free: 8 zstd calls in flight take half of it, 5 bytes a decoded byte (13.4 MB a call) */
    CHECK_EQ_I(ferry_gpudecode_call_chunks(1024, 1u << 20, 8, zstd, 1ull << 30, 1), 12);
    CHECK_EQ_I(ferry_gpudecode_call_chunks(1024, 1u << 20, 8, zstd, 80ull << 30, 1), 128);   /* 80 GiB free: no change */
    const size_t nchunk = 1024, cb = 2048;
    zchunks z;
    zchunks_write(&z, "calls1024.bin", nchunk, cb, 9, 1);
    uint8_t *src = z.src, *back = malloc(nchunk * cb);
    const uint64_t *off = z.off, *len = z.len, pos = z.size;
    const char *path = z.path;
    void *sim = dlopen(getenv("FERRY_NVCOMP") ? getenv("FERRY_NVCOMP") : "libnvcomp.so.6", RTLD_NOW | RTLD_NOLOAD);
    long (*count)(const char *) = sim ? (long (*)(const char *))dlsym(sim, "nvcompsim_count") : NULL;
    uintptr_t d;
    ferry_cuda_malloc(ctx_, 0, nchunk * cb, &d);
    for (int bad = 0; bad < 3; bad++) {   /* clean, a truncated chunk (its frame ends early), clean again */
        ferry_file *f;
        ferry_file_open(ctx_, path, FERRY_READ, &f);
        ferry_plan *p = zstd_chunks_plan(f, off, len, nchunk, cb, d, bad == 1 ? 700 : nchunk, 7);
        memset(back, 0, nchunk * cb);
        ferry_memcpy(ctx_, ferry_cuda_buf(0, d, nchunk * cb), ferry_host_buf(back, nchunk * cb), nchunk * cb);
        ferry_stats_reset(ctx_);
        long calls0 = count ? count("batches") : 0;
        if (count) count("reset_max_per_call");
        ferry_run_opts o;
        memset(&o, 0, sizeof o);
        o.decode = FERRY_DECODE_GPU;
        int64_t r = ferry_run(ctx_, p, &o);
        if (bad == 1) {
            CHECK(r < 0);
            CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "calls1024.bin");
            CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "zstd");
        } else {
            if (r < 0) fprintf(stderr, "  %s\n", ferry_errmsg(ctx_));
            CHECK_EQ_I(r, (int64_t)pos);
            CHECK_EQ_I(stats_().gpu_batches, 8);
            CHECK_EQ_I(stats_().gpu_chunks, nchunk);
            if (count) {
                CHECK_EQ_I(count("batches") - calls0, 8);
                CHECK_EQ_I(count("max_per_call"), 128);
            }
            ferry_memcpy(ctx_, ferry_host_buf(back, nchunk * cb), ferry_cuda_buf(0, d, nchunk * cb), nchunk * cb);
            CHECK(memcmp(back, src, nchunk * cb) == 0);
        }
        if (bad == 2) {   /* AUTO: the same calls, less the tail the CPU workers decode while the GPU drains */
            ferry_plan *p2 = zstd_chunks_plan(f, off, len, nchunk, cb, d, nchunk, 0);
            for (int tail = 1; tail >= 0; tail--) {
                if (!tail) knob("FERRY_GPU_TAIL", "off");
                memset(back, 0, nchunk * cb);
                ferry_memcpy(ctx_, ferry_cuda_buf(0, d, nchunk * cb), ferry_host_buf(back, nchunk * cb), nchunk * cb);
                ferry_stats_reset(ctx_);
                ferry_run_opts oa;
                memset(&oa, 0, sizeof oa);
                oa.decode = FERRY_DECODE_AUTO;
                CHECK_EQ_I(ferry_run(ctx_, p2, &oa), (int64_t)pos);
                /* 16 threads: 15 x 0.67 GB/s x 11.3 ms = 108 chunks of 1 MiB at the built-in rates (the count
                 * does not depend on the chunk size) */
                if (!getenv("FERRY_THREADS")) CHECK_EQ_I(stats_().gpu_chunks, tail ? nchunk - 108 : nchunk);
                CHECK_EQ_I(stats_().decoded_bytes, nchunk * cb);
                ferry_memcpy(ctx_, ferry_host_buf(back, nchunk * cb), ferry_cuda_buf(0, d, nchunk * cb), nchunk * cb);
                CHECK(memcmp(back, src, nchunk * cb) == 0);
            }
            knob("FERRY_GPU_TAIL", NULL);
            /* another job in flight (submitted, not yet destroyed): no tail, the workers have its work */
            uint8_t small[16];
            ferry_plan *ps;
            ferry_plan_create(&ps);
            ferry_extent es;
            memset(&es, 0, sizeof es);
            es.kind = FERRY_EXTENT_READ; es.file = f; es.offset = 0; es.length = sizeof small;
            es.dst = ferry_host_buf(small, sizeof small);
            ferry_plan_add(ps, &es);
            ferry_job *other;
            CHECK_EQ_I(ferry_submit(ctx_, ps, NULL, &other), 0);
            CHECK_EQ_I(ferry_job_wait(other, -1), (int64_t)sizeof small);
            ferry_stats_reset(ctx_);
            ferry_run_opts ob;
            memset(&ob, 0, sizeof ob);
            ob.decode = FERRY_DECODE_AUTO;
            CHECK_EQ_I(ferry_run(ctx_, p2, &ob), (int64_t)pos);
            CHECK_EQ_I(stats_().gpu_chunks, nchunk);
            ferry_job_destroy(other);
            ferry_plan_destroy(ps);
            ferry_plan_destroy(p2);
        }
        ferry_plan_destroy(p);
        ferry_file_close(f);
    }
    ferry_cuda_free(ctx_, d);
    free(back);
    zchunks_free(&z);
}

/* Jobs in flight at once on one context (a dataset's prefetched batches):
 * each takes a set of call slots from the context's pool and gives it back.
 * All four jobs progress and are byte-exact, round after round, and the
 * pool keeps the sets: a job of 96 chunks runs 3 calls, each slot pins at
 * most two buffers (its results; its staging with FERRY_GPU_STAGE=calls), so
 * a new set pins at most 6; however the rounds overlap, rounds 2-6 can
 * add at most the 3 sets round 1 did not need (18 allocations). When the pool
 * kept one set, every overlapping job freed its set at its end and the next
 * allocated it again (6 per extra job per round). */
static void test_concurrent_jobs_reuse_slots(void) {
    long (*count)(const char *, int) = cudasim_counter();
    enum { NJ = 4 };
    const size_t nchunk = 96, cb = 4096;
    zchunks z;
    zchunks_write(&z, "concurrent.bin", nchunk, cb, 11, 1);
    uint8_t *src = z.src, *back = malloc(nchunk * cb);
    const uint64_t *off = z.off, *len = z.len, pos = z.size;
    const char *path = z.path;
    ferry_file *f;
    ferry_file_open(ctx_, path, FERRY_READ, &f);
    uintptr_t d[NJ];
    ferry_plan *p[NJ];
    for (int k = 0; k < NJ; k++) {
        ferry_cuda_malloc(ctx_, 0, nchunk * cb, &d[k]);
        p[k] = zstd_chunks_plan(f, off, len, nchunk, cb, d[k], nchunk, 0);
    }
    long pinned0 = 0;
    for (int round = 0; round < 6; round++) {
        if (round == 1 && count) pinned0 = count("pinned_allocs", 0);
        ferry_job *jb[NJ];
        ferry_run_opts o;
        memset(&o, 0, sizeof o);
        o.decode = FERRY_DECODE_GPU;
        for (int k = 0; k < NJ; k++) CHECK_EQ_I(ferry_submit(ctx_, p[k], &o, &jb[k]), 0);
        for (int k = 0; k < NJ; k++) {
            CHECK_EQ_I(ferry_job_wait(jb[k], -1), (int64_t)pos);
            ferry_job_destroy(jb[k]);
        }
        for (int k = 0; k < NJ; k++) {
            memset(back, 0, nchunk * cb);
            ferry_memcpy(ctx_, ferry_host_buf(back, nchunk * cb), ferry_cuda_buf(0, d[k], nchunk * cb), nchunk * cb);
            CHECK(memcmp(back, src, nchunk * cb) == 0);
        }
    }
    if (count) {
        printf("  pinned allocations in rounds 2-6: %ld\n", count("pinned_allocs", 0) - pinned0);
        CHECK(count("pinned_allocs", 0) - pinned0 <= 6 * (NJ - 1));
    }
    /* a fresh context, one job at a time, a pool limit smaller than any set
     * (a 4 GiB job's set is several GiB): the pool still keeps one set per
     * device, so the second job allocates nothing. FERRY_GPU_STAGE=auto
     * (below): the first job goes up through the ring, the second pins its
     * calls' staging, and the third allocates nothing */
    ferry_ctx *c2;
    CHECK_EQ_I(ferry_ctx_create(&c2, NULL), 0);
    ferry_file *f2;
    ferry_file_open(c2, path, FERRY_READ, &f2);
    uintptr_t d2;
    ferry_cuda_malloc(c2, 0, nchunk * cb, &d2);
    ferry_plan *p2 = zstd_chunks_plan(f2, off, len, nchunk, cb, d2, nchunk, 0);
    knob("FERRY_GPU_POOL", "1");
    CHECK_EQ_I(ferry_knob_set(c2, "FERRY_GPU_POOL", "1"), 0);   /* c2 was made before it */
    for (int autostage = 0; autostage < 2; autostage++) {
        if (autostage) {   /* again on a fresh context, FERRY_GPU_STAGE=auto */
            ferry_plan_destroy(p2);
            ferry_file_close(f2);
            ferry_cuda_free(c2, d2);
            ferry_ctx_destroy(c2);
            knob("FERRY_GPU_STAGE", "auto");
            CHECK_EQ_I(ferry_ctx_create(&c2, NULL), 0);
            ferry_file_open(c2, path, FERRY_READ, &f2);
            ferry_cuda_malloc(c2, 0, nchunk * cb, &d2);
            p2 = zstd_chunks_plan(f2, off, len, nchunk, cb, d2, nchunk, 0);
        }
        long pinned_by[3] = {0};
        for (int round = 0; round < 3; round++) {
            pinned0 = count ? count("pinned_allocs", 0) : 0;
            ferry_run_opts o;
            memset(&o, 0, sizeof o);
            o.decode = FERRY_DECODE_GPU;
            CHECK_EQ_I(ferry_run(c2, p2, &o), (int64_t)pos);
            pinned_by[round] = count ? count("pinned_allocs", 0) - pinned0 : 0;
        }
        printf("  one job at a time, FERRY_GPU_STAGE=%s: pinned allocations %ld, %ld, %ld\n",
               autostage ? "auto" : "calls (default)", pinned_by[0], pinned_by[1], pinned_by[2]);
        if (count) {
            if (autostage) CHECK(pinned_by[1] > 0);   /* the calls' staging, pinned by the second job */
            else CHECK_EQ_I(pinned_by[1], 0);
            CHECK_EQ_I(pinned_by[2], 0);
        }
    }
    knob("FERRY_GPU_STAGE", NULL);
    knob("FERRY_GPU_POOL", NULL);
    ferry_plan_destroy(p2);
    ferry_file_close(f2);
    ferry_cuda_free(c2, d2);
    ferry_ctx_destroy(c2);
    for (int k = 0; k < NJ; k++) { ferry_plan_destroy(p[k]); ferry_cuda_free(ctx_, d[k]); }
    ferry_file_close(f);
    free(back);
    zchunks_free(&z);
}

/* A large job after a few small ones that ran at once (a dataset's batches,
 * then a `.load()` in the same process): the pool holds two small idle sets
 * (FERRY_GPU_POOL: room for those, not for the large job's). The large job
 * takes one and grows it; at its end that grown set stays (the small one
 * left stays too: twice the largest set is room for both), so the large
 * job's second run allocates nothing. (Freeing
 * the returning set instead made the second run take the other small set and
 * grow it again: every run a full allocation, the GPU machine's 16 GiB Zarr zstd
 * .load() at the CPU's rate.) Byte-exact throughout. */
static void test_pool_keeps_the_grown_set(void) {
    long (*count)(const char *, int) = cudasim_counter();
    const size_t small = 64, big = 1024, cb = 16384;
    zchunks z;
    zchunks_write(&z, "poolgrow.bin", big, cb, 13, 1);
    uint8_t *src = z.src, *back = malloc(big * cb);
    const uint64_t *off = z.off, *len = z.len, pos = z.size;
    const char *path = z.path;
    ferry_ctx *c;
    CHECK_EQ_I(ferry_ctx_create(&c, NULL), 0);
    ferry_file *f;
    ferry_file_open(c, path, FERRY_READ, &f);
    uintptr_t ds[2], db;
    ferry_plan *ps[2], *pb;
    for (int k = 0; k < 2; k++) {
        ferry_cuda_malloc(c, 0, small * cb, &ds[k]);
        ps[k] = zstd_chunks_plan(f, off, len, small, cb, ds[k], small, 0);
    }
    ferry_cuda_malloc(c, 0, big * cb, &db);
    pb = zstd_chunks_plan(f, off, len, big, cb, db, big, 0);
    knob("FERRY_GPU_POOL", "96M");   /* two small sets (~20 MiB each), not a large one (~300 MiB) */
    CHECK_EQ_I(ferry_knob_set(c, "FERRY_GPU_POOL", "96M"), 0);   /* c was made before it */
    ferry_run_opts o;
    memset(&o, 0, sizeof o);
    o.decode = FERRY_DECODE_GPU;
    ferry_job *jb[2];
    for (int k = 0; k < 2; k++) CHECK_EQ_I(ferry_submit(c, ps[k], &o, &jb[k]), 0);
    for (int k = 0; k < 2; k++) { CHECK(ferry_job_wait(jb[k], -1) > 0); ferry_job_destroy(jb[k]); }
    long allocs[3] = {0};
    for (int round = 0; round < 3; round++) {
        long a0 = count ? count("pinned_allocs", 0) + count("device_allocs", 0) : 0;
        CHECK_EQ_I(ferry_run(c, pb, &o), (int64_t)pos);
        allocs[round] = count ? count("pinned_allocs", 0) + count("device_allocs", 0) - a0 : 0;
        memset(back, 0, big * cb);
        ferry_memcpy(c, ferry_host_buf(back, big * cb), ferry_cuda_buf(0, db, big * cb), big * cb);
        CHECK(memcmp(back, src, big * cb) == 0);
    }
    printf("  large job after two small ones: allocations %ld, then %ld, %ld\n", allocs[0], allocs[1], allocs[2]);
    if (count) {
        CHECK(allocs[0] > 0);
        CHECK_EQ_I(allocs[1], 0);
        CHECK_EQ_I(allocs[2], 0);
    }
    knob("FERRY_GPU_POOL", NULL);
    for (int k = 0; k < 2; k++) { ferry_plan_destroy(ps[k]); ferry_cuda_free(c, ds[k]); }
    ferry_plan_destroy(pb);
    ferry_cuda_free(c, db);
    ferry_file_close(f);
    ferry_ctx_destroy(c);
    free(back);
    zchunks_free(&z);
}

/* A stream of jobs two at a time (a dataset's reads, each submitted while the
 * one before runs), with a pool limit smaller than any set (FERRY_GPU_POOL=1):
 * the pool keeps twice its largest idle set's bytes, so both sets of the
 * stream stay and rounds after the first allocate at most the second set (if
 * round 1 did not overlap). With the limit alone the second set to return
 * evicted the first, and every overlapping round allocated a set again (the
 * GPU machine's netCDF-4 XarrayDataset, 2.5 GiB jobs under the 6 GiB default: 9.9
 * GB/s against 18.9). Byte-exact throughout. */
static void test_pool_keeps_a_stream_s_two_sets(void) {
    long (*count)(const char *, int) = cudasim_counter();
    const size_t nchunk = 96, cb = 4096;
    zchunks z;
    zchunks_write(&z, "stream2.bin", nchunk, cb, 19, 1);
    uint8_t *back = malloc(nchunk * cb);
    ferry_file *f;
    ferry_ctx *c = ctx_with_file(z.path, &f);
    uintptr_t d[2];
    ferry_plan *p[2];
    for (int k = 0; k < 2; k++) {
        ferry_cuda_malloc(c, 0, nchunk * cb, &d[k]);
        p[k] = zstd_chunks_plan(f, z.off, z.len, nchunk, cb, d[k], nchunk, 0);
    }
    knob("FERRY_GPU_POOL", "1");
    CHECK_EQ_I(ferry_knob_set(c, "FERRY_GPU_POOL", "1"), 0);   /* c was made before it */
    ferry_run_opts o = decode_opts("gpu");
    long after1 = 0;
    for (int round = 0; round < 6; round++) {
        if (round == 1 && count) after1 = count("pinned_allocs", 0) + count("device_allocs", 0);
        ferry_job *jb[2];
        for (int k = 0; k < 2; k++) CHECK_EQ_I(ferry_submit(c, p[k], &o, &jb[k]), 0);
        for (int k = 0; k < 2; k++) {
            CHECK_EQ_I(ferry_job_wait(jb[k], -1), (int64_t)z.size);
            ferry_job_destroy(jb[k]);
            memset(back, 0, nchunk * cb);
            ferry_memcpy(c, ferry_host_buf(back, nchunk * cb), ferry_cuda_buf(0, d[k], nchunk * cb), nchunk * cb);
            CHECK(memcmp(back, z.src, nchunk * cb) == 0);
        }
    }
    if (count) {
        long later = count("pinned_allocs", 0) + count("device_allocs", 0) - after1;
        printf("  two jobs at a time, FERRY_GPU_POOL=1: allocations in rounds 2-6: %ld\n", later);
        CHECK(later <= 3 * 3);   /* one set at most: 3 calls, each a result, a staging and an input buffer */
    }
    knob("FERRY_GPU_POOL", NULL);
    for (int k = 0; k < 2; k++) { ferry_plan_destroy(p[k]); ferry_cuda_free(c, d[k]); }
    ferry_file_close(f);
    ferry_ctx_destroy(c);
    free(back);
    zchunks_free(&z);
}

/* ferry_plan_job_bytes: the decoded bytes a job of a stream should hold.
 * GPU-decoded deflate and zstd ask for 2.5 GiB of their bytes, scaled by
 * their share of the plan, at most 1/18 (deflate) or 1/26 (zstd) of the
 * device's free memory (the stand-in's FERRY_CUDASIM_MEM less what is
 * allocated; a model may hold most of it); lz4 (the CPU's under AUTO), the
 * CPU policy and host destinations ask nothing. The plans are never run (their chunks are not
 * real deflate). */
static void test_job_bytes_hint(void) {
    long (*count)(const char *, int) = cudasim_counter();
    const uint64_t MiB = 1u << 20, want = 2560 * MiB;
    ferry_file *f;
    zchunks z;
    zchunks_write(&z, "hint.bin", 4, 4096, 23, 1);
    CHECK_EQ_I(ferry_file_open(ctx_, z.path, FERRY_READ, &f), 0);
    const uintptr_t fake = (uintptr_t)1 << 44;   /* addresses only: nothing runs */
    ferry_plan *defl, *mixed, *zs, *lz, *host;
    ferry_plan_create(&defl); ferry_plan_create(&mixed); ferry_plan_create(&zs); ferry_plan_create(&lz);
    ferry_plan_create(&host);
    for (int i = 0; i < 8; i++) {
        add_chunk(defl, f, FERRY_CODEC_ZLIB, 0, 100, MiB, fake, 8 * MiB, (uint64_t)i * MiB);
        add_chunk(mixed, f, i % 4 ? FERRY_CODEC_ZSTD : FERRY_CODEC_ZLIB, 0, 100, MiB, fake, 8 * MiB, (uint64_t)i * MiB);
        add_chunk(zs, f, FERRY_CODEC_ZSTD, 0, 100, MiB, fake, 8 * MiB, (uint64_t)i * MiB);
        add_chunk(lz, f, FERRY_CODEC_LZ4, 0, 100, MiB, fake, 8 * MiB, (uint64_t)i * MiB);
        ferry_extent e;
        memset(&e, 0, sizeof e);
        e.kind = FERRY_EXTENT_READ; e.file = f; e.offset = 0; e.length = 100;
        e.codecs[0] = (ferry_codec){FERRY_CODEC_ZLIB, 0}; e.ncodecs = 1; e.decoded_size = MiB;
        static uint8_t hostbuf[1];
        e.dst = ferry_host_buf(hostbuf, 8 * MiB);
        e.dst_offset = (uint64_t)i * MiB;
        CHECK_EQ_I(ferry_plan_add(host, &e), 0);
    }
    if (count) setenv("FERRY_CUDASIM_MEM", "320G", 1);   /* 1/18 of it: 17.8 GiB, no cap */
    uint64_t got = ferry_plan_job_bytes(ctx_, defl, FERRY_DECODE_AUTO);
    printf("  deflate plan: %llu MiB a job\n", (unsigned long long)(got / MiB));
    if (count) CHECK_EQ_I(got, want);
    else CHECK(got > 0 && got <= want);   /* a real device: its memory may cap it */
    /* a quarter deflate, three quarters zstd: deflate's share asks the most */
    if (count) CHECK_EQ_I(ferry_plan_job_bytes(ctx_, mixed, FERRY_DECODE_AUTO), 4 * want);
    if (count) CHECK_EQ_I(ferry_plan_job_bytes(ctx_, zs, FERRY_DECODE_AUTO), want);
    CHECK_EQ_I(ferry_plan_job_bytes(ctx_, defl, FERRY_DECODE_CPU), 0);
    CHECK_EQ_I(ferry_plan_job_bytes(ctx_, zs, FERRY_DECODE_CPU), 0);
    CHECK_EQ_I(ferry_plan_job_bytes(ctx_, lz, FERRY_DECODE_AUTO), 0);
    CHECK_EQ_I(ferry_plan_job_bytes(ctx_, host, FERRY_DECODE_GPU), 0);
    CHECK_EQ_I(ferry_plan_job_bytes(ctx_, NULL, FERRY_DECODE_AUTO), 0);
    if (count) {
        /* a sixteenth of what the device has free (earlier tests' idle call
         * slots hold some of it: they do not count, they hold calls) */
        /* deflate's calls hold 3 device bytes a decoded byte: two jobs in the
         * engine and one consumed leave half the free memory at 1/18 of it each
         * (earlier tests' idle call slots hold some of it: they do not count) */
        setenv("FERRY_CUDASIM_MEM", "16G", 1);
        const uint64_t live = (uint64_t)count("device_live", 0);
        CHECK_EQ_I(ferry_plan_job_bytes(ctx_, defl, FERRY_DECODE_GPU), ((16ull << 30) - live) / 18);
        CHECK_EQ_I(ferry_plan_job_bytes(ctx_, zs, FERRY_DECODE_GPU), ((16ull << 30) - live) / 26);   /* zstd: 5 */
        /* a model holds 15 of the 16 GiB: a share of the free GiB (a dataset's
         * groups sized for the whole device did not fit beside it) */
        uintptr_t model = 0;
        CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, 15ull << 30, &model), 0);
        CHECK_EQ_I(ferry_plan_job_bytes(ctx_, defl, FERRY_DECODE_GPU), ((1ull << 30) - live) / 18);
        ferry_cuda_free(ctx_, model);
        CHECK_EQ_I(ferry_plan_job_bytes(ctx_, defl, FERRY_DECODE_GPU), ((16ull << 30) - live) / 18);
        unsetenv("FERRY_CUDASIM_MEM");
    }
    ferry_plan_destroy(defl); ferry_plan_destroy(mixed); ferry_plan_destroy(zs); ferry_plan_destroy(lz);
    ferry_plan_destroy(host);
    ferry_file_close(f);
    zchunks_free(&z);
}

/* A device a model has nearly filled, beside the idle call slots of earlier
 * jobs that ran together (a dataset's reads: each took a set, the context
 * keeps them, and the room a job's calls are sized for counts them): a job
 * whose calls need more than the set it takes gets its memory by giving the
 * other idle sets back (dev_alloc, pool_trim) instead of failing with
 * cuMemAlloc out of memory (XarrayDataset over Zarr zstd in 256 MiB free on
 * the GPU machine). Byte-exact; the slots of the job are back in the
 * pool afterwards. */
static void test_full_device_gives_back_idle_slots(void) {
    long (*count)(const char *, int) = cudasim_counter();
    if (!count) { printf("  (needs the stand-in driver)\n"); return; }
    enum { NJ = 4 };
    const size_t nchunk = 512, cb = 16384;
    zchunks z;
    zchunks_write(&z, "trim.bin", nchunk, cb, 29, 1);
    /* eight workers whatever FERRY_THREADS says: jobs in flight together overlap */
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.threads = 8;
    cfg.no_env = 1;
    ferry_ctx *c = NULL;
    CHECK_EQ_I(ferry_ctx_create(&c, &cfg), 0);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(c, z.path, FERRY_READ, &f), 0);
    ferry_run_opts o = decode_opts("gpu");
    uintptr_t d[NJ];
    ferry_plan *p[NJ];
    for (int k = 0; k < NJ; k++) {
        CHECK_EQ_I(ferry_cuda_malloc(c, 0, nchunk * cb, &d[k]), 0);
        p[k] = zstd_chunks_plan(f, z.off, z.len, nchunk, cb, d[k], nchunk, 0);
    }
    const long dest = count("device_live", 0);
    CHECK_EQ_I(ferry_run(c, p[0], &o), (int64_t)z.size);   /* alone: one set */
    const long one = count("device_live", 0) - dest;
    int sets = 1;
    for (int tries = 0; tries < 20 && sets < 2; tries++) {   /* together: a set each, while they overlap */
        ferry_job *jb[NJ];
        for (int k = 0; k < NJ; k++) CHECK_EQ_I(ferry_submit(c, p[k], &o, &jb[k]), 0);
        for (int k = 0; k < NJ; k++) {
            CHECK_EQ_I(ferry_job_wait(jb[k], -1), (int64_t)z.size);
            ferry_job_destroy(jb[k]);
        }
        sets = (int)((count("device_live", 0) - dest + one / 2) / one);
    }
    printf("  %d idle call-slot sets of %ld bytes after jobs in flight together\n", sets, one);
    CHECK(sets >= 2);
    /* a model takes all but 1 MiB; the next job's chunks are sixteen times as
     * large (256 KiB): the set it takes must grow past what is free */
    zchunks z4;
    zchunks_write(&z4, "trim4.bin", nchunk, 16 * cb, 31, 1);
    ferry_file *f4;
    CHECK_EQ_I(ferry_file_open(c, z4.path, FERRY_READ, &f4), 0);
    uintptr_t d4;
    CHECK_EQ_I(ferry_cuda_malloc(c, 0, nchunk * 16 * cb, &d4), 0);
    char mem[64];
    snprintf(mem, sizeof mem, "%ld", count("device_live", 0) + (1l << 20));
    setenv("FERRY_CUDASIM_MEM", mem, 1);
    ferry_plan *p4 = zstd_chunks_plan(f4, z4.off, z4.len, nchunk, 16 * cb, d4, nchunk, 0);
    int64_t got = ferry_run(c, p4, &o);
    if (got < 0) fprintf(stderr, "  %s\n", ferry_errmsg(c));
    CHECK_EQ_I(got, (int64_t)z4.size);
    uint8_t *back = malloc(nchunk * 16 * cb);
    ferry_memcpy(c, ferry_host_buf(back, nchunk * 16 * cb), ferry_cuda_buf(0, d4, nchunk * 16 * cb), nchunk * 16 * cb);
    CHECK(memcmp(back, z4.src, nchunk * 16 * cb) == 0);
    unsetenv("FERRY_CUDASIM_MEM");
    free(back);
    ferry_plan_destroy(p4);
    for (int k = 0; k < NJ; k++) { ferry_plan_destroy(p[k]); ferry_cuda_free(c, d[k]); }
    ferry_cuda_free(c, d4);
    ferry_file_close(f4);
    ferry_file_close(f);
    ferry_ctx_destroy(c);
    zchunks_free(&z4);
    zchunks_free(&z);
}

/* A small device (FERRY_CUDASIM_MEM: 16 MiB of destination and 48 MiB more
 * free): a job's calls are sized so that those in flight take at most half
 * of what is free (dev_room); at the GPU machine's sizes (8 calls of 128 chunks, 112
 * MiB of slots for this job: test_first_job_footprint) it failed with
 * cuMemAlloc out of memory. Byte-exact, and the error path is kept: with 256
 * KiB free (4 MiB ran, in calls of a few chunks, once a call's arrays took
 * 64 KiB, not 1 MiB each) the job fails naming cuMemAlloc and how to need
 * less, nothing left half-done. */
static void test_small_device_smaller_calls(void) {
    long (*count)(const char *, int) = cudasim_counter();
    if (!count) { printf("  (needs the stand-in driver)\n"); return; }
    const size_t nchunk = 1024, cb = 16384;
    zchunks z;
    zchunks_write(&z, "smalldev.bin", nchunk, cb, 17, 1);
    uint8_t *back = malloc(nchunk * cb);
    ferry_file *f;
    ferry_ctx *c = ctx_with_file(z.path, &f);
    char mem[64];
    snprintf(mem, sizeof mem, "%ld", count("device_live", 0) + (long)(nchunk * cb) + (48l << 20));
    setenv("FERRY_CUDASIM_MEM", mem, 1);
    uintptr_t d;
    CHECK_EQ_I(ferry_cuda_malloc(c, 0, nchunk * cb, &d), 0);
    ferry_plan *p = zstd_chunks_plan(f, z.off, z.len, nchunk, cb, d, nchunk, 0);
    ferry_run_opts o = decode_opts("gpu");
    int64_t got = ferry_run(c, p, &o);
    if (got < 0) fprintf(stderr, "  %s\n", ferry_errmsg(c));
    CHECK_EQ_I(got, (int64_t)z.size);
    ferry_memcpy(c, ferry_host_buf(back, nchunk * cb), ferry_cuda_buf(0, d, nchunk * cb), nchunk * cb);
    CHECK(memcmp(back, z.src, nchunk * cb) == 0);
    printf("  small device: %ld bytes of device memory in use at the end\n", count("device_live", 0));
    ferry_plan_destroy(p);
    ferry_cuda_free(c, d);
    ferry_ctx_destroy(c);   /* its slot sets too: the next context starts from nothing */
    CHECK_EQ_I(ferry_ctx_create(&c, NULL), 0);
    snprintf(mem, sizeof mem, "%ld", count("device_live", 0) + (long)(nchunk * cb) + (256l << 10));
    setenv("FERRY_CUDASIM_MEM", mem, 1);
    ferry_file *f2;
    ferry_file_open(c, z.path, FERRY_READ, &f2);
    CHECK_EQ_I(ferry_cuda_malloc(c, 0, nchunk * cb, &d), 0);
    p = zstd_chunks_plan(f2, z.off, z.len, nchunk, cb, d, nchunk, 0);
    got = ferry_run(c, p, &o);
    CHECK(got < 0 && strstr(ferry_errmsg(c), "cuMemAlloc"));
    CHECK_STR_CONTAINS(ferry_errmsg(c), "decode on the CPU");
    unsetenv("FERRY_CUDASIM_MEM");
    ferry_plan_destroy(p);
    ferry_cuda_free(c, d);
    ferry_file_close(f2);
    ferry_file_close(f);
    ferry_ctx_destroy(c);
    free(back);
    zchunks_free(&z);
}

/* The first GPU-decode job of a context (issue: `open_dataset(...,
 * device=0).load()` once in a process): what it allocates, pinned and on the
 * device, for 1,024 and 4,096 chunks (16 and 64 MiB of incompressible 16 KiB
 * chunks), 4 workers, FERRY_GPU_RING=1M. FERRY_GPU_STAGE=calls pinned each of
 * the 8 call slots to the job's largest call (8 x 256 chunks for 4,096: twice
 * the 1,024 job's); the default ring pins two 1 MiB buffers per feeder and
 * the slots' result buffers whatever the job (< 2 x 4 + 8 + 2 MiB here), the
 * calls' inputs in plain memory and on the device; FERRY_GPU_STAGE=auto
 * pins the first job as the ring does. Byte-exact every way, the context's
 * second job allocates nothing with calls or ring (auto pins its calls then:
 * test_concurrent_jobs_reuse_slots), and a truncated chunk still fails by
 * name with the ring. */
static void test_first_job_footprint(void) {
    long (*count)(const char *, int) = cudasim_counter();
    if (!count || count("pinned_peak", 0) < 0) { printf("  (the footprint counts need the stand-in driver)\n"); return; }
    const size_t cb = 16384, most = 4096;
    uint8_t *src = malloc(most * cb), *file = malloc(most * (cb + 64)), *back = malloc(most * cb);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < most * cb; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; src[i] = (uint8_t)x; }
    uint64_t *off = malloc(most * 8), *len = malloc(most * 8), pos = 0;
    for (size_t i = 0; i < most; i++) {
        size_t n = zstd_enc(src + i * cb, cb, file + pos, cb + 64, 1);
        off[i] = pos; len[i] = n; pos += n;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/footprint.bin", dir_);
    write_file(path, file, pos);
    long peak[3][2] = {{0}};
    static const char *stage[3] = {"calls", "ring", "auto"};
    knob("FERRY_GPU_RING", "1M");
    for (int ring = 0; ring < 3; ring++)   /* 0 calls, 1 ring, 2 auto */
        for (int big = 0; big < 2; big++) {
            const size_t nchunk = big ? 4096 : 1024;
            knob("FERRY_GPU_STAGE", stage[ring]);
            ferry_ctx *c;   /* a fresh context: its first job */
            CHECK_EQ_I(ferry_ctx_create(&c, NULL), 0);
            ferry_file *f;
            ferry_file_open(c, path, FERRY_READ, &f);
            uintptr_t d;
            ferry_cuda_malloc(c, 0, nchunk * cb, &d);
            for (int bad = 0; bad < 1 + (ring == 1 && big); bad++) {
                ferry_plan *p = zstd_chunks_plan(f, off, len, nchunk, cb, d, bad ? 3000 : nchunk, 9);
                uint64_t want = 0;
                for (size_t i = 0; i < nchunk; i++) want += len[i];
                long pa = count("pinned_allocs", 0), pb = count("pinned_bytes", 0), da = count("device_allocs", 0), db = count("device_bytes", 0);
                count("reset_pinned_peak", 0);
                long live = count("pinned_live", 0);
                ferry_run_opts o;
                memset(&o, 0, sizeof o);
                o.decode = FERRY_DECODE_GPU;
                o.threads = 4;
                int64_t r = ferry_run(c, p, &o);
                if (bad) {
                    CHECK(r < 0);
                    CHECK_STR_CONTAINS(ferry_errmsg(c), "footprint.bin");
                    CHECK_STR_CONTAINS(ferry_errmsg(c), "zstd");
                } else {
                    if (r < 0) fprintf(stderr, "  %s\n", ferry_errmsg(c));
                    CHECK_EQ_I(r, (int64_t)want);
                    memset(back, 0, nchunk * cb);
                    ferry_memcpy(c, ferry_host_buf(back, nchunk * cb), ferry_cuda_buf(0, d, nchunk * cb), nchunk * cb);
                    CHECK(memcmp(back, src, nchunk * cb) == 0);
                    peak[ring][big] = count("pinned_peak", 0) - live;
                    printf("  first job, %zu x 16 KiB (%.1f MiB compressed), FERRY_GPU_STAGE=%s: pinned %ld allocations, %.1f MiB"
                           " (most at once %.1f MiB); device %ld allocations, %.1f MiB\n",
                           nchunk, want / 1048576.0, stage[ring], count("pinned_allocs", 0) - pa,
                           (count("pinned_bytes", 0) - pb) / 1048576.0, peak[ring][big] / 1048576.0,
                           count("device_allocs", 0) - da, (count("device_bytes", 0) - db) / 1048576.0);
                    /* the context's second job: the ring and the slots are reused, nothing is allocated */
                    pa = count("pinned_allocs", 0), da = count("device_allocs", 0);
                    memset(back, 0, nchunk * cb);
                    ferry_memcpy(c, ferry_cuda_buf(0, d, nchunk * cb), ferry_host_buf(back, nchunk * cb), nchunk * cb);
                    CHECK_EQ_I(ferry_run(c, p, &o), (int64_t)want);
                    if (ring < 2) {
                        CHECK_EQ_I(count("pinned_allocs", 0) - pa, 0);
                        CHECK_EQ_I(count("device_allocs", 0) - da, 0);
                    }
                    ferry_memcpy(c, ferry_host_buf(back, nchunk * cb), ferry_cuda_buf(0, d, nchunk * cb), nchunk * cb);
                    CHECK(memcmp(back, src, nchunk * cb) == 0);
                }
                ferry_plan_destroy(p);
            }
            ferry_file_close(f);
            ferry_cuda_free(c, d);
            ferry_ctx_destroy(c);
            knob("FERRY_GPU_STAGE", NULL);
        }
    knob("FERRY_GPU_RING", NULL);
    CHECK(peak[0][1] >= 8 * 256 * (long)cb);   /* calls: 8 slots of 256 chunks pinned */
    CHECK(peak[0][1] > peak[0][0]);
    for (int big = 0; big < 2; big++) {
        CHECK(peak[1][big] <= (2 * 4 + 8 + 2) * (1l << 20));
        CHECK(peak[2][big] <= (2 * 4 + 8 + 2) * (1l << 20));   /* auto's first job: the ring's */
    }
    free(src); free(file); free(off); free(len); free(back);
}

static void test_status_says_what_loaded(void) {
    const char *s = ferry_nvcomp_status(ctx_);
    CHECK_STR_CONTAINS(s, "loaded nvCOMP");
    printf("  %s\n", s);
}

int main(void) {
    if (ferry_ctx_create(&ctx_, NULL) < 0 || ferry_cuda_device_count(ctx_) < 1) {
        printf("skipped: no CUDA device (%s)\n0 passed, 0 failed, 1 skipped\n", ctx_ ? ferry_cuda_status(ctx_) : "no context");
        return 0;
    }
    if (strncmp(ferry_nvcomp_status(ctx_), "loaded", 6) != 0) {
        printf("skipped: nvCOMP not loaded (%s)\n0 passed, 0 failed, 1 skipped\n", ferry_nvcomp_status(ctx_));
        ferry_ctx_destroy(ctx_);
        return 0;
    }
    snprintf(dir_, sizeof dir_, "/tmp/ferry_gpudecode_%d", (int)getpid());
    mkdir(dir_, 0755);
    RUN(test_status_says_what_loaded);
    RUN(test_slots_follow_the_file_line);
    RUN(test_zstd_tiles_on_gpu);
    RUN(test_zstd_contiguous);
    RUN(test_every_codec_gpu_equals_cpu);
    RUN(test_auto_policy);
    RUN(test_second_device);
    RUN(test_one_queue_both_decoders);
    RUN(test_long_deflate_load_runs_as_gpu_calls);
    RUN(test_jobs_in_flight_share_the_gpu);
    RUN(test_held_job_makes_a_pair);
    RUN(test_corrupt_chunks_fail_clearly);
    RUN(test_fallbacks_counted);
    RUN(test_many_chunks_one_file);
    RUN(test_corrupt_chunk_with_batches_in_flight);
    RUN(test_calls_of_hundreds_of_chunks);
    RUN(test_concurrent_jobs_reuse_slots);
    RUN(test_pool_keeps_the_grown_set);
    RUN(test_pool_keeps_a_stream_s_two_sets);
    RUN(test_job_bytes_hint);
    RUN(test_small_device_smaller_calls);
    RUN(test_full_device_gives_back_idle_slots);
    RUN(test_first_job_footprint);
    RUN(test_unpinned_buffers_released);
    ferry_ctx_destroy(ctx_);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir_);
    if (system(cmd)) {}
    return check_summary();
}
