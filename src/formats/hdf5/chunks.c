/* chunks.c — where a chunked dataset's chunks are: the chunk index, read
 * whole into a ferry_layout chunk table (ferry.h: sorted by grid index,
 * absent chunks left out).
 *
 * Indexes ("Data Layout Message", "Chunk Index" sections of the spec):
 *   v1 B-tree (layout versions 1-3): type-1 nodes whose keys are chunk size
 *     (4), filter mask (4) and the chunk's element offsets (8 each, rank + 1).
 *   Layout version 4:
 *     1 single chunk: the index address is the chunk (filtered size and mask
 *       in the layout message);
 *     2 implicit: chunks stored one after another in grid order, unfiltered;
 *     3 fixed array ("FAHD", data block "FADB", paged past 2^page_bits
 *       entries): address, or address + size + mask when filtered, per chunk
 *       in grid order;
 *     4 extensible array (below);
 *     5 v2 B-tree of type 10 (address, scaled offsets) or 11 (address, size,
 *       mask, scaled offsets).
 * Grid order for implicit and fixed arrays runs over the maximum dimensions
 * (they exist only for datasets that cannot grow past them). A filter mask
 * bit i says pipeline filter i was skipped; the layout lists codecs in
 * decoding order, so it becomes skip bit (n - 1 - i). */
#include "formats/hdf5/h5.h"
#include "formats/layout.h"
#include <stdlib.h>

typedef struct ctab {
    h5_file *h;
    const char *what;
    int ndim, nfilters;
    const uint64_t *dims, *chunk;
    const uint64_t *maxdims;        /* H5_UNDEF: unlimited */
    uint64_t chunk_bytes;
    ferry_chunk *t;
    uint64_t *org;                  /* ndim origins per entry */
    size_t n, cap, limit;
} ctab;

static uint32_t renumber(uint32_t mask, int n) {
    uint32_t s = 0;
    for (int i = 0; i < n; i++)
        if (mask & (1u << i)) s |= 1u << (n - 1 - i);
    return s;
}

static int add(ctab *c, const uint64_t *origin, uint64_t addr, uint64_t size, uint32_t mask, uint64_t pos) {
    for (int k = 0; k < c->ndim; k++) {
        /* past the largest extent the array may ever have: no writer puts a chunk there, the
         * index is damaged (a chunk silently dropped would read as fill values) */
        if (c->maxdims && c->maxdims[k] != H5_UNDEF && origin[k] >= c->maxdims[k])
            return h5_fail(c->h, FERRY_EFORMAT, pos, c->what, "chunk origin %llu in dimension %d is not on the grid "
                           "of the array (its largest extent is %llu)", (unsigned long long)origin[k], k,
                           (unsigned long long)c->maxdims[k]);
        if (origin[k] >= c->dims[k]) return 0;   /* past the current extent (an array shrunk): not read */
    }
    if (addr == H5_UNDEF) return 0;
    if (c->n >= c->limit)
        return h5_fail(c->h, FERRY_EFORMAT, pos, c->what, "more chunk index entries than chunks in the array");
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        ferry_chunk *nt = realloc(c->t, cap * sizeof *nt);
        if (nt) c->t = nt;
        uint64_t *no = realloc(c->org, cap * (size_t)(c->ndim ? c->ndim : 1) * sizeof *no);
        if (no) c->org = no;
        if (!nt || !no) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", c->h->path);
        c->cap = cap;
    }
    uint64_t abs;
    if (ferry_add_overflow(c->h->base, addr, &abs))
        return h5_fail(c->h, FERRY_EFORMAT, pos, c->what, "chunk address %llu", (unsigned long long)addr);
    c->t[c->n] = (ferry_chunk){NULL, abs, size, renumber(mask, c->nfilters)};
    memcpy(c->org + c->n * (size_t)c->ndim, origin, (size_t)c->ndim * sizeof *origin);
    c->n++;
    return 0;
}

/* ---- v1 B-tree ------------------------------------------------------------------- */
static int bt1_chunk(void *arg, const uint8_t *key, uint64_t child, uint64_t pos) {
    ctab *c = arg;
    uint64_t origin[FERRY_MAX_DIMS];
    uint32_t size = ferry_le32(key), mask = ferry_le32(key + 4);
    for (int k = 0; k < c->ndim; k++) {
        origin[k] = ferry_le64(key + 8 + 8 * k);
        if (origin[k] % c->chunk[k])
            return h5_fail(c->h, FERRY_EFORMAT, pos, c->what, "chunk offset %llu off the chunk grid in dimension %d",
                           (unsigned long long)origin[k], k);
    }
    return add(c, origin, child, size, mask, pos);
}

/* ---- grid-ordered indexes: linear index i over the maximum-dimension grid ---------- */
static void origin_of(const ctab *c, const uint64_t *grid, uint64_t i, uint64_t *origin) {
    for (int k = c->ndim - 1; k >= 0; k--) {
        origin[k] = (i % grid[k]) * c->chunk[k];
        i /= grid[k];
    }
}

static int max_grid(const ctab *c, const uint64_t *maxdims, uint64_t *grid, uint64_t *n) {
    *n = 1;
    for (int k = 0; k < c->ndim; k++) {
        uint64_t m = maxdims[k] == H5_UNDEF ? c->dims[k] : maxdims[k];
        grid[k] = m / c->chunk[k] + (m % c->chunk[k] != 0);
        if (ferry_mul_overflow(*n, grid[k], n)) return ferry_seterr(FERRY_EFORMAT, "%s: %s: chunk grid overflows", c->h->path, c->what);
    }
    return 0;
}

static int fixed_array(ctab *c, const h5_layout *lay, const uint64_t *maxdims) {
    h5_file *h = c->h;
    const uint8_t *p;
    uint64_t abs = h->base + lay->index_addr, hl = 4 + 1 + 1 + 1 + 1 + h->sl + h->so + 4;
    int rc = h5_read(h, lay->index_addr, hl, &p, c->what);
    if (rc) return rc;
    if (memcmp(p, "FAHD", 4) || p[4] != 0) return h5_fail(h, FERRY_EFORMAT, abs, c->what, "fixed array without \"FAHD\"");
    if ((rc = h5_check_sum(h, p, hl, abs, c->what))) return rc;
    h5_cur hc = h5_cur_make(h, p + 5, hl - 5, abs + 5);
    uint8_t cid = h5c_u8(&hc), esize = h5c_u8(&hc), pbits = h5c_u8(&hc);
    uint64_t nent = h5c_len(&hc), dblk = h5c_addr(&hc);
    uint64_t grid[FERRY_MAX_DIMS], ngrid;
    if ((rc = max_grid(c, maxdims, grid, &ngrid))) return rc;
    unsigned want = cid ? h->so + 4 + 1 : h->so;
    if (cid > 1 || esize < want || esize > h->so + 8 + 4 || pbits > 32 || nent > ngrid)
        return h5_fail(h, FERRY_EFORMAT, abs, c->what, "fixed array of %llu entries of %u bytes", (unsigned long long)nent, esize);
    if (dblk == H5_UNDEF || nent == 0) return 0;
    uint64_t page = (uint64_t)1 << pbits, npages = nent > page ? (nent + page - 1) / page : 0;
    uint64_t dh = 4 + 1 + 1 + h->so + (npages + 7) / 8, dabs = h->base + dblk;
    uint64_t total = npages ? dh + 4 : dh + nent * esize + 4;
    if ((rc = h5_read(h, dblk, total, &p, c->what))) return rc;
    if (memcmp(p, "FADB", 4)) return h5_fail(h, FERRY_EFORMAT, dabs, c->what, "fixed array block without \"FADB\"");
    if ((rc = h5_check_sum(h, p, total, dabs, c->what))) return rc;
    const uint8_t *bitmap = p + 6 + h->so;
    uint64_t at = dblk + total, origin[FERRY_MAX_DIMS];
    for (uint64_t pg = 0; pg < (npages ? npages : 1); pg++) {
        uint64_t first = pg * page, cnt = npages ? FERRY_MIN(page, nent - first) : nent;
        const uint8_t *e;
        uint64_t epos;
        if (npages) {
            uint64_t bytes = cnt * esize + 4;
            if (!(bitmap[pg / 8] & (0x80 >> (pg % 8)))) { at += bytes; continue; }   /* page never written */
            if ((rc = h5_read(h, at, bytes, &e, c->what)) || (rc = h5_check_sum(h, e, bytes, h->base + at, c->what)))
                return rc;
            epos = h->base + at;
            at += bytes;
        } else {
            e = p + dh;
            epos = dabs + dh;
        }
        h5_cur ec = h5_cur_make(h, e, cnt * esize, epos);
        for (uint64_t i = 0; i < cnt; i++) {
            uint64_t addr = h5c_addr(&ec), size = c->chunk_bytes;
            uint32_t mask = 0;
            if (cid) { size = h5c_un(&ec, esize - h->so - 4); mask = h5c_u32(&ec); }
            else h5c_skip(&ec, esize - h->so);
            origin_of(c, grid, first + i, origin);
            if ((rc = add(c, origin, addr, size, mask, epos))) return rc;
        }
    }
    return 0;
}

/* ---- extensible array (one unlimited dimension) ------------------------------------ */
/* Element i of the array is chunk i in grid order with the unlimited axis
 * moved first ("swizzled"); the first elements live in the index block
 * ("EAIB"), the rest in data blocks ("EADB") grouped by super block s, which
 * holds 2^(s/2) data blocks of 2^((s+1)/2) · min elements each. The index
 * block points straight at the data blocks of its first 2·log2(min pointers)
 * super blocks and at secondary blocks ("EASB") for the others. */
typedef struct ea {
    ctab *c;
    uint8_t cid, esize, off_bytes;
    uint64_t page_n;                  /* elements per data block page */
    uint64_t grid[FERRY_MAX_DIMS];
    int perm[FERRY_MAX_DIMS];         /* swizzled order: the unlimited axis first */
    uint64_t limit;                   /* elements that can name a chunk */
} ea;

static int ea_elements(ea *e, const uint8_t *p, uint64_t n, uint64_t first, uint64_t pos) {
    ctab *c = e->c;
    h5_cur ec = h5_cur_make(c->h, p, n * e->esize, pos);
    for (uint64_t i = 0; i < n && first + i < e->limit; i++) {
        uint64_t addr = h5c_addr(&ec), size = c->chunk_bytes, origin[FERRY_MAX_DIMS], idx = first + i;
        uint32_t mask = 0;
        if (e->cid) { size = h5c_un(&ec, e->esize - c->h->so - 4); mask = h5c_u32(&ec); }
        else h5c_skip(&ec, e->esize - c->h->so);
        for (int k = c->ndim - 1; k >= 0; k--) {
            int ax = e->perm[k];
            origin[ax] = (idx % e->grid[ax]) * c->chunk[ax];
            idx /= e->grid[ax];
        }
        int rc = add(c, origin, addr, size, mask, pos);
        if (rc) return rc;
    }
    return ec.bad ? h5_fail(c->h, FERRY_EFORMAT, pos, c->what, "extensible array elements truncated") : 0;
}

/* One data block of n elements (index `first`) at addr; paged when n > page_n
 * (then bits bit0, bit0 + 1, ... of `init`, when given, say which pages were
 * ever written: the secondary block's bits run on across its data blocks). */
static int ea_dblock(ea *e, uint64_t addr, uint64_t n, uint64_t first, const uint8_t *init, uint64_t bit0) {
    h5_file *h = e->c->h;
    const char *what = e->c->what;
    uint64_t abs = h->base + addr, pre = 4 + 1 + 1 + h->so + e->off_bytes;
    const uint8_t *p;
    int rc;
    if (n <= e->page_n) {
        uint64_t total = pre + n * e->esize + 4;
        if ((rc = h5_read(h, addr, total, &p, what))) return rc;
        if (memcmp(p, "EADB", 4)) return h5_fail(h, FERRY_EFORMAT, abs, what, "data block without \"EADB\"");
        if ((rc = h5_check_sum(h, p, total, abs, what))) return rc;
        return ea_elements(e, p + pre, n, first, abs + pre);
    }
    if ((rc = h5_read(h, addr, pre + 4, &p, what))) return rc;
    if (memcmp(p, "EADB", 4)) return h5_fail(h, FERRY_EFORMAT, abs, what, "data block without \"EADB\"");
    if ((rc = h5_check_sum(h, p, pre + 4, abs, what))) return rc;
    uint64_t at = addr + pre + 4, bytes = e->page_n * e->esize + 4;
    for (uint64_t pg = 0; pg * e->page_n < n; pg++, at += bytes) {
        if (first + pg * e->page_n >= e->limit) break;
        uint64_t bit = bit0 + pg;
        if (init && !(init[bit / 8] & (0x80 >> (bit % 8)))) continue;   /* page never written */
        if ((rc = h5_read(h, at, bytes, &p, what)) || (rc = h5_check_sum(h, p, bytes, h->base + at, what))) return rc;
        if ((rc = ea_elements(e, p, e->page_n, first + pg * e->page_n, h->base + at))) return rc;
    }
    return 0;
}

static int earray(ctab *c, const h5_layout *lay, const uint64_t *maxdims) {
    h5_file *h = c->h;
    const char *what = c->what;
    const uint8_t *p;
    uint64_t abs = h->base + lay->index_addr, hl = 4 + 1 + 1 + 6 + 6 * (uint64_t)h->sl + h->so + 4;
    int rc = h5_read(h, lay->index_addr, hl, &p, what);
    if (rc) return rc;
    if (memcmp(p, "EAHD", 4) || p[4] != 0) return h5_fail(h, FERRY_EFORMAT, abs, what, "extensible array without \"EAHD\"");
    if ((rc = h5_check_sum(h, p, hl, abs, what))) return rc;
    h5_cur hc = h5_cur_make(h, p + 5, hl - 5, abs + 5);
    ea e = {.c = c};
    e.cid = h5c_u8(&hc);
    e.esize = h5c_u8(&hc);
    uint8_t max_bits = h5c_u8(&hc), iblk_n = h5c_u8(&hc), dblk_min = h5c_u8(&hc), sblk_min_ptrs = h5c_u8(&hc),
            page_bits = h5c_u8(&hc);
    for (int i = 0; i < 4; i++) h5c_len(&hc);   /* secondary / data block counts and sizes */
    uint64_t max_set = h5c_len(&hc);
    h5c_len(&hc);                               /* elements realized */
    uint64_t iblock = h5c_addr(&hc);
    unsigned want = e.cid ? h->so + 4 + 1 : h->so;
    if (e.cid > 1 || e.esize < want || e.esize > h->so + 8 + 4 || max_bits == 0 || max_bits > 64 || dblk_min == 0 ||
        (dblk_min & (dblk_min - 1)) || sblk_min_ptrs == 0 || (sblk_min_ptrs & (sblk_min_ptrs - 1)) || page_bits > 32)
        return h5_fail(h, FERRY_EFORMAT, abs, what, "extensible array parameters");
    e.off_bytes = (uint8_t)((max_bits + 7) / 8);
    e.page_n = (uint64_t)1 << page_bits;
    /* the grid, the unlimited axis first */
    int unlim = -1, n = 0;
    for (int k = 0; k < c->ndim; k++)
        if (maxdims[k] == H5_UNDEF) unlim = k;
    if (unlim < 0) return h5_fail(h, FERRY_EFORMAT, abs, what, "extensible array index without an unlimited dimension");
    e.perm[n++] = unlim;
    uint64_t ngrid = 1;
    for (int k = 0; k < c->ndim; k++) {
        uint64_t m = k == unlim ? c->dims[k] : maxdims[k];
        e.grid[k] = m / c->chunk[k] + (m % c->chunk[k] != 0);
        if (k != unlim) e.perm[n++] = k;
        if (ferry_mul_overflow(ngrid, e.grid[k] ? e.grid[k] : 1, &ngrid)) ngrid = UINT64_MAX;
    }
    if (e.grid[unlim] == 0) e.grid[unlim] = 1;
    e.limit = FERRY_MIN(max_set, ngrid);
    if (iblock == H5_UNDEF || e.limit == 0) return 0;

    /* super blocks: how many, which the index block covers */
    unsigned lmin = 0, lptrs = 0;
    while ((1u << lmin) < dblk_min) lmin++;
    while ((1u << lptrs) < sblk_min_ptrs) lptrs++;
    if (max_bits < lmin) return h5_fail(h, FERRY_EFORMAT, abs, what, "extensible array parameters");
    unsigned nsblks = 1 + max_bits - lmin, ib_sblks = 2 * lptrs;
    uint64_t ib_dptrs = 2 * ((uint64_t)sblk_min_ptrs - 1), ib_sptrs = nsblks > ib_sblks ? nsblks - ib_sblks : 0;
    uint64_t ibl = 4 + 1 + 1 + h->so + (uint64_t)iblk_n * e.esize + (ib_dptrs + ib_sptrs) * h->so + 4;
    uint64_t iabs = h->base + iblock;
    if ((rc = h5_read(h, iblock, ibl, &p, what))) return rc;
    if (memcmp(p, "EAIB", 4)) return h5_fail(h, FERRY_EFORMAT, iabs, what, "index block without \"EAIB\"");
    if ((rc = h5_check_sum(h, p, ibl, iabs, what))) return rc;
    uint64_t off = 6 + h->so;
    if ((rc = ea_elements(&e, p + off, iblk_n, 0, iabs + off))) return rc;
    off += (uint64_t)iblk_n * e.esize;
    h5_cur dp = h5_cur_make(h, p + off, ib_dptrs * h->so, iabs + off);
    h5_cur sp = h5_cur_make(h, p + off + ib_dptrs * h->so, ib_sptrs * h->so, iabs + off + ib_dptrs * h->so);
    uint64_t start = iblk_n;
    for (unsigned s = 0; s < nsblks && start < e.limit; s++) {
        uint64_t ndblks = (uint64_t)1 << (s / 2), dn = ((uint64_t)1 << ((s + 1) / 2)) * dblk_min;
        if (s < ib_sblks) {
            for (uint64_t d = 0; d < ndblks && start < e.limit; d++, start += dn) {
                uint64_t a = h5c_addr(&dp);
                if (dp.bad) return h5_fail(h, FERRY_EFORMAT, iabs, what, "index block truncated");
                if (a != H5_UNDEF && (rc = ea_dblock(&e, a, dn, start, NULL, 0))) return rc;
            }
            continue;
        }
        uint64_t sb = h5c_addr(&sp);
        if (sp.bad) return h5_fail(h, FERRY_EFORMAT, iabs, what, "index block truncated");
        if (sb == H5_UNDEF) { start += ndblks * dn; continue; }
        uint64_t npages = dn > e.page_n ? dn / e.page_n : 0, mask_bytes = npages ? (npages + 7) / 8 : 0;
        uint64_t spre = 4 + 1 + 1 + h->so + e.off_bytes, sl = spre + ndblks * (mask_bytes + h->so) + 4;
        const uint8_t *q;
        if ((rc = h5_read(h, sb, sl, &q, what))) return rc;
        if (memcmp(q, "EASB", 4)) return h5_fail(h, FERRY_EFORMAT, h->base + sb, what, "secondary block without \"EASB\"");
        if ((rc = h5_check_sum(h, q, sl, h->base + sb, what))) return rc;
        const uint8_t *masks = q + spre;
        h5_cur bp = h5_cur_make(h, q + spre + ndblks * mask_bytes, ndblks * h->so, h->base + sb + spre + ndblks * mask_bytes);
        for (uint64_t d = 0; d < ndblks && start < e.limit; d++, start += dn) {
            uint64_t a = h5c_addr(&bp);
            if (a != H5_UNDEF && (rc = ea_dblock(&e, a, dn, start, npages ? masks : NULL, d * npages))) return rc;
        }
    }
    return 0;
}

/* ---- v2 B-tree ---------------------------------------------------------------------- */
typedef struct bt2c { ctab *c; int filtered; } bt2c;

static int bt2_chunk(void *arg, const uint8_t *rec, uint32_t size, uint64_t pos) {
    bt2c *b = arg;
    ctab *c = b->c;
    h5_cur r = h5_cur_make(c->h, rec, size, pos);
    uint64_t addr = h5c_addr(&r), csize = c->chunk_bytes, origin[FERRY_MAX_DIMS];
    uint32_t mask = 0;
    if (b->filtered) {
        uint64_t fixed = (uint64_t)c->h->so + 4 + 8 * (uint64_t)c->ndim;
        if (size <= fixed || size - fixed > 8) return h5_fail(c->h, FERRY_EFORMAT, pos, c->what, "chunk record of %u bytes", size);
        csize = h5c_un(&r, (unsigned)(size - fixed));
        mask = h5c_u32(&r);
    }
    for (int k = 0; k < c->ndim; k++) {
        uint64_t s = h5c_u64(&r);
        if (ferry_mul_overflow(s, c->chunk[k], &origin[k])) origin[k] = UINT64_MAX;
    }
    if (r.bad) return h5_fail(c->h, FERRY_EFORMAT, pos, c->what, "chunk record truncated");
    return add(c, origin, addr, csize, mask, pos);
}

int h5_chunks_read(h5_file *h, const h5_layout *lay, int ndim, const uint64_t *dims, const uint64_t *maxdims,
                   const uint64_t *shape, int nfilters, uint32_t itemsize, const char *what, h5_chunks *out) {
    memset(out, 0, sizeof *out);
    ctab c = {.h = h, .what = what, .ndim = ndim, .nfilters = nfilters, .dims = dims, .chunk = lay->chunk,
              .maxdims = maxdims};
    c.chunk_bytes = itemsize;
    uint64_t grid = 1;
    for (int k = 0; k < ndim; k++) {
        if (ferry_mul_overflow(c.chunk_bytes, lay->chunk[k], &c.chunk_bytes))
            return ferry_seterr(FERRY_EFORMAT, "%s: %s: chunk size overflows", h->path, what);
        uint64_t g = dims[k] / lay->chunk[k] + (dims[k] % lay->chunk[k] != 0);
        if (ferry_mul_overflow(grid, g, &grid)) grid = UINT64_MAX;
    }
    c.limit = grid < (uint64_t)SIZE_MAX / 64 ? (size_t)grid : SIZE_MAX / 64;
    int rc = 0;
    uint64_t zero[FERRY_MAX_DIMS] = {0};
    if (lay->index_addr == H5_UNDEF || grid == 0) rc = 0;   /* nothing written yet: all fill */
    else if (lay->version < 4) rc = h5_btree1_walk(h, lay->index_addr, 1, 8 + 8 * (uint64_t)(ndim + 1), what, bt1_chunk, &c);
    else switch (lay->index) {
    case 1:
        rc = add(&c, zero, lay->index_addr, (lay->flags & 2) ? lay->single_size : c.chunk_bytes, lay->single_mask,
                 h->base + lay->index_addr);
        break;
    case 2: {
        uint64_t g[FERRY_MAX_DIMS], n, origin[FERRY_MAX_DIMS];
        if ((rc = max_grid(&c, maxdims, g, &n))) break;
        for (uint64_t i = 0; i < n && !rc; i++) {
            uint64_t addr;
            if (ferry_mul_overflow(i, c.chunk_bytes, &addr) || ferry_add_overflow(addr, lay->index_addr, &addr) ||
                addr > h->size) {
                rc = h5_fail(h, FERRY_EFORMAT, h->base + lay->index_addr, what, "implicit chunks pass the end of the file");
                break;
            }
            origin_of(&c, g, i, origin);
            rc = add(&c, origin, addr, c.chunk_bytes, 0, h->base + lay->index_addr);
        }
        break;
    }
    case 3: rc = fixed_array(&c, lay, maxdims); break;
    case 4: rc = earray(&c, lay, maxdims); break;
    case 5: {
        bt2c b = {&c, nfilters > 0};
        rc = h5_btree2_walk(h, lay->index_addr, b.filtered ? 11 : 10, what, bt2_chunk, &b);
        break;
    }
    default:
        rc = h5_fail(h, FERRY_EFORMAT, h->base + lay->index_addr, what, "chunk index type %d", lay->index);
    }
    if (!rc && c.n) {
        ferry_layout l = {.ndim = ndim, .itemsize = itemsize, .label = what};
        memcpy(l.shape, shape, (size_t)ndim * sizeof *dims);
        memcpy(l.chunks, lay->chunk, (size_t)ndim * sizeof *dims);
        out->index = malloc(c.n * sizeof *out->index);
        if (!out->index) rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path);
        else rc = ferry_layout_sort_table(&l, c.org, c.t, out->index, c.n);
        if (rc && rc != FERRY_ENOMEM) rc = ferry_preerr(rc, "%s: %s: chunk index", h->path, what);
    }
    free(c.org);
    if (rc) { free(c.t); free(out->index); out->index = NULL; return rc; }
    out->table = c.t;
    out->n = c.n;
    return 0;
}
