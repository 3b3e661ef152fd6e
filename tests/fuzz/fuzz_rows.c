/* fuzz_rows.c — the batch planners of src/formats/rows.c with arguments made
 * from the input: ferry_plan_rows over up to four arrays stored as is in one
 * file (the input's tail), and the token-window planner (check, resolve
 * through an epoch order, fit, plan) over the same file. Then each plan runs
 * into a destination with guard bytes. Invariants: a refusal says why and
 * adds nothing; a success places exactly rows x row bytes (windows x length),
 * each row's (window's) bytes equal to the file's at the place the arguments
 * name; nothing is written outside dst.
 *
 * The arrays have no chunk table (every chunk absent: fills), so the rows'
 * checks and order are what is fuzzed here; fuzz_layout has the box planners.
 *
 * Input (one byte each unless said; short inputs read zeros):
 *   nsrc 1 + b%4; per source: ndim 1 + b%3, shape%9 per dim, itemsize
 *   {1,2,4,8}[b%4], a selection of the other dims (start%4, stop%10, 1 + step%3);
 *   nrows b%12, each row b%12 (may be outside); per row and source an offset
 *   u16 (may not fit); then windows: nfiles 1 + b%3, n b%40, stride b%9, length
 *   1 + b%8, per file start b%40 and offset b%64, shuffle, nranges b%4, each
 *   (lo, hi) b%44; then row runs: nshards 1 + b%4, nrows b%30, per shard a
 *   start b%32 (may be out of order), n b%16 ids b%32 (may be outside); the
 *   rest is the file.
 * Row runs: a refusal writes nothing and says why; a success gives runs that,
 * expanded, are the ids in order, each run inside one shard. */
#include "fuzz.h"
#include "formats/rows.h"

typedef struct reader { const uint8_t *p; size_t n; } reader;
static uint8_t u8(reader *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}
static uint16_t u16(reader *r) { uint16_t a = u8(r); return (uint16_t)(a | (uint16_t)u8(r) << 8); }

enum { GUARD = 32, DST = 4096 };
static uint8_t dstmem[DST + 2 * GUARD];

static void guards_check(void) {
    for (size_t i = 0; i < GUARD; i++)
        if (dstmem[i] != 0xa5 || dstmem[GUARD + DST + i] != 0xa5) abort();
}

/* the arrays are layouts without a chunk table: every chunk absent, so each row is a fill
 * (the box planners have fuzz_layout; this target is about the rows' checks and order) */
static void fuzz_rows_part(reader *r) {
    ferry_ctx *ctx = ferry_fuzz_ctx();
    enum { MAXS = 4, MAXR = 12 };
    ferry_layout lay[MAXS];
    ferry_rows_src src[MAXS];
    size_t nsrc = 1 + u8(r) % MAXS;
    for (size_t k = 0; k < nsrc; k++) {
        memset(&lay[k], 0, sizeof lay[k]);
        memset(&src[k], 0, sizeof src[k]);
        lay[k].ndim = 1 + u8(r) % 3;
        for (int d = 0; d < lay[k].ndim; d++) lay[k].shape[d] = lay[k].chunks[d] = u8(r) % 9;
        lay[k].itemsize = (uint32_t[]){1, 2, 4, 8}[u8(r) % 4];
        lay[k].label = "a";
        src[k].layout = &lay[k];
        src[k].sel[0] = (ferry_slice){0, 1, 1};
        for (int d = 1; d < lay[k].ndim; d++) src[k].sel[d] = (ferry_slice){u8(r) % 4, u8(r) % 10, 1 + u8(r) % 3};
        src[k].dst = ferry_host_buf(dstmem + GUARD, DST);
        if (ferry_rows_prepare(&src[k]) < 0) { if (!ferry_errmsg(NULL)[0]) abort(); return; }
    }
    size_t nrows = u8(r) % MAXR;
    int64_t rows[MAXR], offs[MAXR * MAXS];
    for (size_t i = 0; i < nrows; i++) rows[i] = u8(r) % 12;
    for (size_t i = 0; i < nrows * nsrc; i++) offs[i] = u16(r) % (DST + 64);
    ferry_plan *plan;
    if (ferry_plan_create(&plan)) abort();
    memset(dstmem, 0xa5, sizeof dstmem);
    int64_t got = ferry_plan_rows(src, nsrc, rows, nrows, offs, plan, NULL);
    if (got < 0) {
        if (!ferry_errmsg(NULL)[0]) abort();
    } else {
        uint64_t want = 0;
        for (size_t k = 0; k < nsrc; k++) want += nrows * src[k].row_bytes;
        if ((uint64_t)got != want) abort();
        if (ferry_run(ctx, plan, NULL) < 0 && !ferry_errmsg(ctx)[0]) abort();
    }
    guards_check();
    ferry_plan_destroy(plan);
}

static void fuzz_windows_part(reader *r, ferry_file *f, const uint8_t *file, size_t fsize) {
    ferry_ctx *ctx = ferry_fuzz_ctx();
    int64_t starts[3], offsets[3], ranges[8];
    ferry_windows w = {0};
    w.nfiles = 1 + u8(r) % 3;
    w.n = u8(r) % 40;
    w.stride = u8(r) % 9;
    w.length = 1 + u8(r) % 8;
    for (size_t k = 0; k < w.nfiles; k++) {
        starts[k] = u8(r) % 40;
        offsets[k] = u8(r) % 64;
    }
    w.starts = starts;
    w.offsets = offsets;
    int shuffle = u8(r) & 1;
    size_t nranges = u8(r) % 4;
    for (size_t i = 0; i < 2 * nranges; i++) ranges[i] = u8(r) % 44;
    int64_t total = ferry_windows_check(&w, ranges, nranges);
    if (total < 0) {
        if (!ferry_errmsg(NULL)[0]) abort();
        return;
    }
    ferry_perm ord;
    if (ferry_perm_init(&ord, w.n, 7, 1, shuffle)) abort();
    int64_t ids[176];
    int32_t fidx[176];
    if (total > 176) abort();   /* 4 ranges of at most 44 */
    if (ferry_windows_resolve(&w, &ord, ranges, nranges, ids, fidx) < 0) abort();
    ferry_file *files[3] = {f, f, f};
    for (int64_t j = 0; j < total; j++) {
        int32_t k = fidx[j];
        if (k < 0 || (size_t)k >= w.nfiles || ids[j] < starts[k] || (uint64_t)ids[j] >= w.n) abort();
        if ((size_t)k + 1 < w.nfiles && ids[j] >= starts[k + 1]) abort();
        if (ferry_windows_fit(&w, (size_t)k, f) < 0) return;   /* a file too short: refused by name */
    }
    ferry_plan *plan;
    if (ferry_plan_create(&plan)) abort();
    memset(dstmem, 0xa5, sizeof dstmem);
    int64_t got = ferry_plan_windows(&w, files, ids, fidx, (size_t)total, ferry_host_buf(dstmem + GUARD, DST), plan, NULL);
    if (got >= 0) {
        if (got != total || ferry_run(ctx, plan, NULL) < 0) abort();
        for (int64_t j = 0; j < total; j++) {
            uint64_t off = (uint64_t)offsets[fidx[j]] + (uint64_t)(ids[j] - starts[fidx[j]]) * w.stride;
            if (off + w.length > fsize || memcmp(dstmem + GUARD + j * w.length, file + off, w.length)) abort();
        }
    } else if (!ferry_errmsg(NULL)[0]) {
        abort();
    }
    guards_check();
    ferry_plan_destroy(plan);
}

static void fuzz_row_runs_part(reader *r) {
    enum { MAXK = 4, MAXN = 16 };
    int64_t starts[MAXK], ids[MAXN], out[4 * MAXN];
    size_t nshards = 1 + u8(r) % MAXK, n = u8(r) % MAXN;
    uint64_t nrows = u8(r) % 30;
    for (size_t k = 0; k < nshards; k++) starts[k] = u8(r) % 32;
    for (size_t i = 0; i < n; i++) ids[i] = u8(r) % 32;
    for (size_t i = 0; i < 4 * MAXN; i++) out[i] = -7;
    int64_t *shard = out, *row = out + n, *len = out + 2 * n, *lo = out + 3 * n;
    int64_t runs = ferry_row_runs(starts, nshards, nrows, ids, n, shard, row, len, lo);
    if (runs < 0) {
        if (!ferry_errmsg(NULL)[0]) abort();
        for (size_t i = 0; i < 4 * MAXN; i++)
            if (out[i] != -7) abort();
        return;
    }
    size_t at = 0;
    for (int64_t q = 0; q < runs; q++) {
        int64_t k = shard[q], end = (size_t)k + 1 < nshards ? starts[k + 1] : (int64_t)nrows;
        if (k < 0 || (size_t)k >= nshards || lo[q] != (int64_t)at || len[q] < 1) abort();
        for (int64_t j = 0; j < len[q]; j++, at++) {
            int64_t id = starts[k] + row[q] + j;
            if (id != ids[at] || id >= end || row[q] < 0) abort();
        }
    }
    if (at != n) abort();
}

static int fuzz_rows(const uint8_t *data, size_t size) {
    reader r = {data, size};
    /* the file: the input itself (its tail is what the windows read) */
    const char *path = ferry_fuzz_file(data, size);
    ferry_file *f;
    if (ferry_file_open(ferry_fuzz_ctx(), path, FERRY_READ, &f) < 0) abort();
    fuzz_rows_part(&r);
    fuzz_windows_part(&r, f, data, size);
    fuzz_row_runs_part(&r);
    ferry_file_close(f);
    return 0;
}
FERRY_FUZZ_TARGET(rows, fuzz_rows)
