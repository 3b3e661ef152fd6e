/* nvcompsim.c — a stand-in libnvcomp.so.6 for machines without a GPU: the
 * batched decompressors ferry calls (zstd, LZ4, Deflate), done on the CPU by
 * libzstd, liblz4 and zlib, with nvCOMP 5/6's C signatures (options structs
 * by value), status codes and temp-size rules. Like cudasim.c it keeps the
 * rules ferry's correctness rests on and is stricter where the real library
 * would be undefined:
 *
 * - Work is queued on the caller's stream (cuLaunchHostFunc of the stand-in
 *   driver) and runs after the copies queued before it: the pointer and size
 *   arrays are read then, from "device" memory, so an array not yet copied, or
 *   reused before the decode ran, gives wrong results rather than passing.
 * - Every pointer (the arrays, each input and output, temp) must lie inside a
 *   cuMemAlloc allocation, inputs aligned as GetRequiredAlignments says.
 * - temp_bytes must be at least what GetTempSizeAsync returned for the batch's
 *   chunk count and total output (zstd: about 3 x the output, as 5.3 asks;
 *   LZ4 and Deflate: none); a smaller one fails every chunk.
 * - Per chunk: nvcompSuccess and the decoded size, or nvcompErrorCannotDecompress
 *   (corrupt input, or output larger than its buffer).
 *
 * FERRY_NVCOMPSIM_FAIL=notsupported makes every chunk report
 * nvcompErrorNotSupported (ferry must decode them on the CPU);
 * =garbage reports success after writing wrong bytes (ferry's checks must
 * catch it where the chunk carries a checksum). nvcompsim_count(name) tells
 * tests what happened: "batches", "chunks", "temp_too_small", "bad_pointer",
 * "max_per_call" (the most chunks one call was given; "reset_max_per_call"
 * returns it and starts again from 0). */
#include "cuda/cuda.h"
#include <limits.h>
#include <lz4.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

typedef int nvcompStatus_t;
enum { S_OK = 0, S_INVALID = 10, S_NOT_SUPPORTED = 11, S_CANNOT = 12, S_ALIGN = 17 };
typedef struct { int backend; char reserved[60]; } opts_t;   /* every Decompress opts struct: 64 bytes */
typedef struct { uint32_t version, cudart_version; } props_t;
typedef struct { size_t input, output, temp; } align_t;
enum { ZSTD_A = 0, LZ4_A = 1, DEFLATE_A = 2 };
static const align_t aligns[3] = {{1, 1, 8}, {1, 1, 1}, {4, 1, 1}};   /* what 5.3 reports */

CUresult cuLaunchHostFunc(CUstream s, void (*fn)(void *), void *arg);
int cudasim_is_device(CUdeviceptr p, size_t n);

static atomic_long n_batches_, n_chunks_, n_temp_small_, n_bad_ptr_, n_max_call_;
long nvcompsim_count(const char *what) {
    if (!strcmp(what, "batches")) return atomic_load(&n_batches_);
    if (!strcmp(what, "chunks")) return atomic_load(&n_chunks_);
    if (!strcmp(what, "temp_too_small")) return atomic_load(&n_temp_small_);
    if (!strcmp(what, "bad_pointer")) return atomic_load(&n_bad_ptr_);
    if (!strcmp(what, "max_per_call")) return atomic_load(&n_max_call_);
    if (!strcmp(what, "reset_max_per_call")) return atomic_exchange(&n_max_call_, 0);
    return -1;
}

nvcompStatus_t nvcompGetProperties(props_t *p) {
    if (!p) return S_INVALID;
    const char *v = getenv("FERRY_NVCOMPSIM_VERSION");   /* tests of the loader's version check */
    p->version = v ? (uint32_t)atoi(v) : 6000;
    p->cudart_version = 13000;
    return S_OK;
}

const char *nvcompGetStatusString(nvcompStatus_t s) { return s == 0 ? "nvcompSuccess" : "nvcompError"; }

/* FERRY_NVCOMPSIM_TEMP_CHUNK (bytes): more zstd temp space per chunk, as a
 * real nvCOMP's may be (its per-chunk workspace): tests of device budgets */
static size_t temp_rule(int alg, size_t num_chunks, size_t total) {
    const char *e = getenv("FERRY_NVCOMPSIM_TEMP_CHUNK");
    const size_t extra = e && *e ? (size_t)strtoull(e, NULL, 10) : 0;
    return alg == ZSTD_A ? total * 3 + total / 16 + (64 + extra) * num_chunks : 0;
}

static nvcompStatus_t temp_size(int alg, size_t n, size_t max_chunk, opts_t o, size_t *temp, size_t total) {
    (void)max_chunk; (void)o;
    if (!temp) return S_INVALID;
    *temp = temp_rule(alg, n, total);
    return S_OK;
}

static nvcompStatus_t alignments(int alg, opts_t o, align_t *a) {
    (void)o;
    if (!a) return S_INVALID;
    *a = aligns[alg];
    return S_OK;
}

typedef struct job {
    int alg;
    const void *const *in_ptrs; const size_t *in_bytes, *out_cap;
    size_t *out_bytes; size_t n;
    void *temp; size_t temp_bytes;
    void *const *out_ptrs;
    nvcompStatus_t *statuses;
} job;

static int dev_ok(const void *p, size_t n) { return cudasim_is_device((CUdeviceptr)(uintptr_t)p, n); }

static nvcompStatus_t decode_one(int alg, const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *made) {
    *made = 0;
    if (alg == ZSTD_A) {
        size_t r = ZSTD_decompress(out, cap, in, n);
        if (ZSTD_isError(r)) return S_CANNOT;
        *made = r;
    } else if (alg == LZ4_A) {
        if (n > INT_MAX || cap > INT_MAX) return S_CANNOT;
        int r = LZ4_decompress_safe((const char *)in, (char *)out, (int)n, (int)cap);
        if (r < 0) return S_CANNOT;
        *made = (size_t)r;
    } else {
        z_stream z;
        memset(&z, 0, sizeof z);
        if (inflateInit2(&z, -15) != Z_OK) return S_CANNOT;
        z.next_in = (Bytef *)in; z.avail_in = (uInt)n;
        z.next_out = out; z.avail_out = (uInt)cap;
        int r = inflate(&z, Z_FINISH);
        *made = cap - z.avail_out;
        inflateEnd(&z);
        if (r != Z_STREAM_END) return S_CANNOT;
    }
    return S_OK;
}

static void run_job(void *arg) {
    job *j = arg;
    const char *fail = getenv("FERRY_NVCOMPSIM_FAIL");
    atomic_fetch_add(&n_batches_, 1);
    long prev = atomic_load(&n_max_call_);
    while ((long)j->n > prev && !atomic_compare_exchange_weak(&n_max_call_, &prev, (long)j->n)) {}
    int arrays_ok = dev_ok(j->in_ptrs, j->n * sizeof(void *)) && dev_ok(j->in_bytes, j->n * sizeof(size_t)) &&
                    dev_ok(j->out_cap, j->n * sizeof(size_t)) && dev_ok(j->out_ptrs, j->n * sizeof(void *)) &&
                    (!j->out_bytes || dev_ok(j->out_bytes, j->n * sizeof(size_t))) &&
                    (!j->statuses || dev_ok(j->statuses, j->n * sizeof(nvcompStatus_t)));
    if (!arrays_ok) { atomic_fetch_add(&n_bad_ptr_, 1); free(j); return; }   /* the real library would fault */
    size_t total = 0;
    for (size_t i = 0; i < j->n; i++) total += j->out_cap[i];
    size_t need = temp_rule(j->alg, j->n, total);
    int temp_ok = j->temp_bytes >= need && (need == 0 || dev_ok(j->temp, need));
    if (!temp_ok) atomic_fetch_add(&n_temp_small_, 1);
    for (size_t i = 0; i < j->n; i++) {
        const uint8_t *in = j->in_ptrs[i];
        uint8_t *out = j->out_ptrs[i];
        size_t made = 0;
        nvcompStatus_t st;
        if (!temp_ok) st = S_INVALID;
        else if (!dev_ok(in, j->in_bytes[i]) || !dev_ok(out, j->out_cap[i])) { atomic_fetch_add(&n_bad_ptr_, 1); st = S_INVALID; }
        else if ((uintptr_t)in % aligns[j->alg].input || (uintptr_t)out % aligns[j->alg].output) st = S_ALIGN;
        else if (fail && !strcmp(fail, "notsupported")) st = S_NOT_SUPPORTED;
        else {
            st = decode_one(j->alg, in, j->in_bytes[i], out, j->out_cap[i], &made);
            if (st == S_OK && fail && !strcmp(fail, "garbage") && made) out[made / 2] ^= 0x5a;
        }
        if (j->out_bytes) j->out_bytes[i] = made;
        if (j->statuses) j->statuses[i] = st;
        atomic_fetch_add(&n_chunks_, 1);
    }
    free(j);
}

static nvcompStatus_t decompress(int alg, const void *const *in_ptrs, const size_t *in_bytes, const size_t *out_cap,
                                 size_t *out_bytes, size_t n, void *temp, size_t temp_bytes, void *const *out_ptrs,
                                 opts_t o, nvcompStatus_t *statuses, CUstream stream) {
    if (o.backend < 0 || o.backend > 2) return S_INVALID;
    if (n == 0) return S_OK;
    if (!in_ptrs || !in_bytes || !out_cap || !out_ptrs) return S_INVALID;
    job *j = malloc(sizeof *j);
    if (!j) return S_INVALID;
    *j = (job){alg, in_ptrs, in_bytes, out_cap, out_bytes, n, temp, temp_bytes, out_ptrs, statuses};
    if (cuLaunchHostFunc(stream, run_job, j) != 0) { free(j); return 1000; /* nvcompErrorCudaError */ }
    return S_OK;
}

typedef struct sjob { int alg; const void *const *in_ptrs; const size_t *in_bytes; size_t *out; size_t n; } sjob;
static void run_size(void *arg) {
    sjob *j = arg;
    for (size_t i = 0; i < j->n; i++) {
        size_t v = 0;
        if (j->alg == ZSTD_A) {
            unsigned long long c = ZSTD_getFrameContentSize(j->in_ptrs[i], j->in_bytes[i]);
            v = c >= ZSTD_CONTENTSIZE_ERROR - 1 ? 0 : (size_t)c;
        }
        j->out[i] = v;   /* LZ4 / Deflate: nvCOMP must decode to know; the stand-in says 0 */
    }
    free(j);
}
static nvcompStatus_t sizes(int alg, const void *const *in_ptrs, const size_t *in_bytes, size_t *out, size_t n, CUstream s) {
    sjob *j = malloc(sizeof *j);
    if (!j) return S_INVALID;
    *j = (sjob){alg, in_ptrs, in_bytes, out, n};
    if (cuLaunchHostFunc(s, run_size, j) != 0) { free(j); return 1000; }
    return S_OK;
}

#define ALG(Name, A) \
    nvcompStatus_t nvcompBatched##Name##DecompressGetTempSizeAsync(size_t n, size_t max_chunk, opts_t o, size_t *temp, size_t total) { \
        return temp_size(A, n, max_chunk, o, temp, total); } \
    nvcompStatus_t nvcompBatched##Name##DecompressGetRequiredAlignments(opts_t o, align_t *a) { return alignments(A, o, a); } \
    nvcompStatus_t nvcompBatched##Name##DecompressAsync(const void *const *in_ptrs, const size_t *in_bytes, const size_t *out_cap, \
        size_t *out_bytes, size_t n, void *const temp, size_t temp_bytes, void *const *out_ptrs, opts_t o, \
        nvcompStatus_t *statuses, CUstream stream) { \
        return decompress(A, in_ptrs, in_bytes, out_cap, out_bytes, n, temp, temp_bytes, out_ptrs, o, statuses, stream); } \
    nvcompStatus_t nvcompBatched##Name##GetDecompressSizeAsync(const void *const *in_ptrs, const size_t *in_bytes, size_t *out, \
        size_t n, CUstream s) { return sizes(A, in_ptrs, in_bytes, out, n, s); }
ALG(Zstd, ZSTD_A)
ALG(LZ4, LZ4_A)
ALG(Deflate, DEFLATE_A)
