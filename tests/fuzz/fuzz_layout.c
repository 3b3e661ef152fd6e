/* fuzz_layout.c — ferry_plan_layout and ferry_layout_sort_table with layouts
 * and chunk tables made from the input, HDF5-like: one file of chunks at
 * offsets a table gives (which may lie about offsets, lengths, origins, the
 * codecs a chunk skips), then the plan is run into a destination with guard
 * bytes on both sides. Invariants: a failure says why; a success places
 * exactly the selection's bytes; running never writes outside dst (the guards,
 * and ASan on the exact allocation).
 *
 * Input (every field one byte unless said; short inputs read zeros):
 *   ndim%5; per dim: shape%17, 1+chunk%19; itemsize {1,2,4,8,16,20,3}[b%7];
 *   order%3; ndim perm bytes; swap {0,2,4,8,3}[b%5]; ncodecs%4, then
 *   (id%10, param) each; 16 fill bytes; flags (1 native, 2 stored order,
 *   4|8 table: dense / sparse / lookup / none, 16 file size known);
 *   nentries%48, then per entry: ndim origin bytes (on the grid unless the
 *   top bit is set), offset u16, length u16 (0xffff absent, 0xfffe unsized),
 *   skip; per dim start, stop, step%5; the rest is the file.
 * Then ferry_plan_array plans the same selection of the array stored as is in
 * the file (offset: the first entry's, C or F order, FERRY_EXACT_RUNS when
 * flags has 32), and what it places must equal the file's bytes, element by
 * element (the oracle walks the selection itself). */
#include "fuzz.h"

typedef struct reader { const uint8_t *p; size_t n; } reader;

static uint8_t u8(reader *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}
static uint16_t u16(reader *r) { uint16_t a = u8(r); return (uint16_t)(a | (uint16_t)u8(r) << 8); }

#define MAX_ENTRIES 48
static ferry_chunk entries[MAX_ENTRIES];
static size_t nentries;

static int lookup(void *arg, const uint64_t *idx, ferry_chunk *out) {
    const ferry_layout *l = arg;
    uint64_t lin = 0;
    for (int k = 0; k < l->ndim; k++) lin = lin * 31 + idx[k];
    if (nentries) *out = entries[lin % nentries];
    return 0;
}

/* dst of want bytes between GUARD bytes of 0xa5 on both sides (exact
 * allocation: ASan sees any write past them too) */
enum { GUARD = 64 };
static uint8_t *guarded(uint64_t want) {
    uint8_t *mem = malloc(want + 2 * GUARD);
    if (!mem) abort();
    memset(mem, 0xa5, want + 2 * GUARD);
    return mem;
}
static void check_guards(const uint8_t *mem, uint64_t want) {
    for (size_t i = 0; i < GUARD; i++)
        if (mem[i] != 0xa5 || mem[GUARD + want + i] != 0xa5) abort();
}

/* ferry_plan_array of sel over the file's bytes (file[0..n)) at offset, as
 * layout l's shape, itemsize and order (C unless F) describe them. */
static void fuzz_array(const ferry_layout *lay, const ferry_slice *sel, int valid, uint64_t want, uint64_t offset,
                       int exact, const uint8_t *file, size_t n) {
    ferry_layout l;
    memset(&l, 0, sizeof l);
    l.ndim = lay->ndim;
    l.itemsize = lay->itemsize;
    l.order = lay->order == FERRY_ORDER_F ? FERRY_ORDER_F : FERRY_ORDER_C;
    l.label = "fuzz";
    memcpy(l.shape, lay->shape, sizeof l.shape);
    for (int k = 0; k < l.ndim; k++) l.chunks[k] = 1;
    ferry_file *f;
    if (ferry_file_open(ferry_fuzz_ctx(), lay->path, FERRY_READ, &f)) abort();
    uint8_t *mem = guarded(want);
    ferry_plan *plan;
    if (ferry_plan_create(&plan)) abort();
    int64_t got = ferry_plan_array(f, offset, &l, sel, ferry_host_buf(mem + GUARD, want),
                                   exact ? FERRY_EXACT_RUNS : 0, plan);
    uint64_t stride[FERRY_MAX_DIMS], size = l.itemsize;
    for (int j = 0; j < l.ndim; j++) {
        int k = l.order == FERRY_ORDER_F ? j : l.ndim - 1 - j;
        stride[k] = size;
        size *= l.shape[k];
    }
    if (got < 0) {
        if (!ferry_errmsg(NULL)[0]) abort();
        /* refused only for a bad selection or an array past the end */
        if (valid && offset + size <= n) abort();
    } else {
        if (!valid || (uint64_t)got != want || offset + size > n) abort();
        if (ferry_run(ferry_fuzz_ctx(), plan, NULL) < 0) abort();
        /* the oracle: walk the selection in C order */
        uint64_t idx[FERRY_MAX_DIMS] = {0}, cnt[FERRY_MAX_DIMS];
        for (int k = 0; k < l.ndim; k++) {
            int64_t stop = (uint64_t)sel[k].stop > l.shape[k] ? (int64_t)l.shape[k] : sel[k].stop;
            cnt[k] = stop <= sel[k].start ? 0 : (uint64_t)(stop - sel[k].start - 1) / (uint64_t)sel[k].step + 1;
        }
        for (uint64_t at = 0; at < want; at += l.itemsize) {
            uint64_t src = offset;
            for (int k = 0; k < l.ndim; k++) src += ((uint64_t)sel[k].start + idx[k] * (uint64_t)sel[k].step) * stride[k];
            if (memcmp(mem + GUARD + at, file + src, l.itemsize)) abort();
            for (int k = l.ndim - 1; k >= 0 && ++idx[k] == cnt[k]; k--) idx[k] = 0;
        }
        check_guards(mem, want);
    }
    ferry_plan_destroy(plan);
    ferry_file_close(f);
    free(mem);
}

static int fuzz_layout(const uint8_t *data, size_t size) {
    reader r = {data, size};
    ferry_layout l;
    memset(&l, 0, sizeof l);
    l.ndim = u8(&r) % 5;
    uint64_t grid[FERRY_MAX_DIMS];
    for (int k = 0; k < l.ndim; k++) {
        l.shape[k] = u8(&r) % 17;
        l.chunks[k] = 1 + u8(&r) % 19;
        grid[k] = (l.shape[k] + l.chunks[k] - 1) / l.chunks[k];
    }
    static const uint32_t items[] = {1, 2, 4, 8, 16, 20, 3};
    l.itemsize = items[u8(&r) % 7];
    l.order = (ferry_order)(u8(&r) % 3);
    for (int k = 0; k < l.ndim; k++) l.perm[k] = u8(&r) % (l.ndim ? l.ndim : 1);
    static const uint32_t swaps[] = {0, 2, 4, 8, 3};
    l.swap = swaps[u8(&r) % 5];
    l.ncodecs = u8(&r) % 4;
    for (int i = 0; i < l.ncodecs; i++) {
        l.codecs[i].id = u8(&r) % 10;
        l.codecs[i].param = u8(&r);
    }
    for (int i = 0; i < 16; i++) l.fill[i] = u8(&r);
    uint8_t flags = u8(&r);
    int mode = (flags >> 2) & 3;
    nentries = u8(&r) % MAX_ENTRIES;
    uint64_t origins[MAX_ENTRIES * FERRY_MAX_DIMS], index[MAX_ENTRIES];
    for (size_t i = 0; i < nentries; i++) {
        for (int k = 0; k < l.ndim; k++) {
            uint8_t b = u8(&r);
            origins[i * (size_t)l.ndim + (size_t)k] = b & 0x80 ? b : (grid[k] ? b % grid[k] : 0) * l.chunks[k];
        }
        entries[i].path = NULL;
        entries[i].offset = u16(&r);
        uint16_t len = u16(&r);
        entries[i].length = len == 0xffff ? FERRY_CHUNK_ABSENT : len == 0xfffe ? FERRY_CHUNK_UNSIZED : len;
        entries[i].skip = u8(&r);
    }
    ferry_slice sel[FERRY_MAX_DIMS];
    for (int k = 0; k < l.ndim; k++) {
        sel[k].start = u8(&r) % 20;
        sel[k].stop = u8(&r) % 22;
        sel[k].step = u8(&r) % 5;
    }
    l.path = ferry_fuzz_file(r.p, r.n);
    if (flags & 16) l.file_size = r.n;
    l.label = "fuzz";
    if (mode == 0) {            /* dense: entry i is grid chunk i */
        l.table = entries;
        l.ntable = nentries;
    } else if (mode == 1) {     /* sparse, keyed by origin as h5py gives it */
        int rc = ferry_layout_sort_table(&l, origins, entries, index, nentries);
        if (rc < 0) {
            if (!ferry_errmsg(NULL)[0]) abort();
            return 0;
        }
        for (size_t i = 1; i < nentries; i++) if (index[i - 1] >= index[i]) abort();
        l.table = entries;
        l.table_index = index;
        l.ntable = nentries;
    } else if (mode == 2) {
        l.lookup = lookup;
        l.lookup_arg = &l;
    }
    /* dst: exactly the selection's bytes, between guards */
    uint64_t want = l.itemsize;
    int valid = 1;
    for (int k = 0; k < l.ndim; k++) {
        ferry_slice s = sel[k];
        if (s.step < 1 || (uint64_t)s.start > l.shape[k]) valid = 0;
        int64_t stop = (uint64_t)s.stop > l.shape[k] ? (int64_t)l.shape[k] : s.stop;
        want *= stop <= s.start || s.step < 1 ? 0 : (uint64_t)(stop - s.start - 1) / (uint64_t)s.step + 1;
    }
    uint8_t *mem = guarded(want);
    ferry_plan *plan;
    if (ferry_plan_create(&plan)) abort();
    unsigned pf = (flags & 1 ? FERRY_NATIVE : 0) | (flags & 2 ? FERRY_STORED_ORDER : 0);
    int64_t got = ferry_plan_layout(&l, sel, ferry_host_buf(mem + GUARD, want), pf, plan);
    if (got < 0) {
        if (!ferry_errmsg(NULL)[0]) abort();
    } else {
        if (!valid || (uint64_t)got != want) abort();
        if (ferry_plan_count(plan) < 20000) {
            int64_t ran = ferry_run(ferry_fuzz_ctx(), plan, NULL);
            if (ran < 0 && !ferry_errmsg(NULL)[0]) abort();
        }
        check_guards(mem, want);
    }
    ferry_plan_destroy(plan);
    free(mem);
    fuzz_array(&l, sel, valid, want, nentries ? entries[0].offset : 0, flags & 32, r.p, r.n);
    return 0;
}
FERRY_FUZZ_TARGET(layout, fuzz_layout)
