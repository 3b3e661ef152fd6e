/* heap.c — the two structures behind dense groups and dense attributes: the
 * fractal heap (where link and attribute messages are stored) and the
 * version-2 B-tree (whose records hold the heap IDs).
 *
 * Fractal heap ("FRHP"): a doubling table of blocks, `width` columns, rows of
 * block size start, start, 2·start, 4·start, ...; rows up to the maximum
 * direct block size hold direct blocks ("FHDB"), rows past it indirect blocks
 * ("FHIB") that hold a smaller table of their own. A managed object's heap ID
 * gives its offset in the heap's address space and its length: the block
 * holding that offset is found from the root down, and the object lies at
 * (offset - block offset) from the start of the direct block. Tiny objects
 * live inside the ID; huge objects (their own v2 B-tree) are refused.
 *
 * Version-2 B-tree ("BTHD", nodes "BTIN"/"BTLF"): records are only walked in
 * order here, never searched; the width of the child-pointer fields depends
 * on the node size, record size and depth as the specification's "Version 2
 * B-trees" section derives them. */
#include "formats/hdf5/h5.h"
#include <stdlib.h>

#define FH_MAX_ROWS 64

struct h5_fheap {
    uint64_t addr;                  /* header (relative) */
    uint32_t idlen;
    uint16_t filter_len;
    uint8_t flags;
    uint32_t max_managed;
    uint16_t width;
    uint64_t start, max_direct;
    uint16_t max_bits;              /* log2 of the maximum heap size */
    uint64_t root;
    uint16_t root_rows;
    unsigned off_bytes, len_bytes;  /* managed heap ID fields */
    unsigned max_direct_rows;
};

static unsigned log2u(uint64_t v) { unsigned n = 0; while (v > 1) { v >>= 1; n++; } return n; }
static unsigned bytes_for_bits(unsigned bits) { return (bits + 7) / 8; }

int h5_fheap_open(h5_file *h, uint64_t addr, const char *what, h5_fheap **out) {
    const uint8_t *p;
    uint64_t got, abs = h->base + addr;
    int rc = h5_read_upto(h, addr, 4 + 1 + 2 + 2 + 1 + 4 + 12 * 8 + 2 + 2 + 8 + 8 + 2 + 2 + 8 + 2 + 8 + 4 + 4, &p, &got, what);
    if (rc) return rc;
    h5_cur c = h5_cur_make(h, p, got, abs);
    if (got < 4 || memcmp(p, "FRHP", 4)) return h5_fail(h, FERRY_EFORMAT, abs, what, "fractal heap without \"FRHP\"");
    h5c_skip(&c, 4);
    h5_fheap *fh = h5_alloc(h, sizeof *fh);
    if (!fh) return FERRY_ENOMEM;
    fh->addr = addr;
    if (h5c_u8(&c) != 0) return h5_fail(h, FERRY_EUNSUPPORTED, abs + 4, what, "fractal heap version (0 supported)");
    fh->idlen = h5c_u16(&c);
    fh->filter_len = h5c_u16(&c);
    fh->flags = h5c_u8(&c);
    fh->max_managed = h5c_u32(&c);
    h5c_len(&c);                    /* next huge object ID */
    h5c_addr(&c);                   /* huge objects' B-tree */
    h5c_len(&c);                    /* free space */
    h5c_addr(&c);                   /* free-space manager */
    for (int i = 0; i < 8; i++) h5c_len(&c);   /* managed/allocated space, iterator, counts and sizes */
    fh->width = h5c_u16(&c);
    fh->start = h5c_len(&c);
    fh->max_direct = h5c_len(&c);
    fh->max_bits = h5c_u16(&c);
    h5c_u16(&c);                    /* starting rows of the root indirect block */
    fh->root = h5c_addr(&c);
    fh->root_rows = h5c_u16(&c);
    if (fh->filter_len) {
        h5c_len(&c);
        h5c_u32(&c);
        h5c_skip(&c, fh->filter_len);
    }
    uint64_t hdr_len = (uint64_t)(c.p - p);
    if (c.bad) return h5_fail(h, FERRY_EFORMAT, abs, what, "fractal heap header truncated");
    if ((rc = h5_read(h, addr, hdr_len + 4, &p, what)) || (rc = h5_check_sum(h, p, hdr_len + 4, abs, what))) return rc;
    if (fh->filter_len)
        return h5_fail(h, FERRY_EUNSUPPORTED, abs, what, "fractal heap with I/O filters");
    if (fh->width == 0 || (fh->width & (fh->width - 1)) || fh->start == 0 || (fh->start & (fh->start - 1)) ||
        fh->max_direct < fh->start || (fh->max_direct & (fh->max_direct - 1)) || fh->max_bits == 0 || fh->max_bits > 64 ||
        fh->idlen < 2 || fh->idlen > 64 || fh->root_rows > FH_MAX_ROWS)
        return h5_fail(h, FERRY_EFORMAT, abs, what, "fractal heap table (width %u, blocks %llu..%llu, %u bits, ID %u bytes)",
                       fh->width, (unsigned long long)fh->start, (unsigned long long)fh->max_direct, fh->max_bits,
                       fh->idlen);
    fh->off_bytes = bytes_for_bits(fh->max_bits);
    uint64_t lim = FERRY_MIN(fh->max_direct, (uint64_t)fh->max_managed);
    fh->len_bytes = bytes_for_bits(log2u(lim) + 1);
    fh->max_direct_rows = log2u(fh->max_direct) - log2u(fh->start) + 2;
    *out = fh;
    return 0;
}

uint32_t h5_fheap_idlen(const h5_fheap *fh) { return fh->idlen; }

#define FH_WHOLE_BLOCK ((uint64_t)1 << 20)   /* direct blocks read whole up to this size */

static uint64_t row_size(const h5_fheap *fh, unsigned r) {
    return r == 0 ? fh->start : fh->start << (r - 1);
}

/* Find the direct block holding heap offset `off`, from the indirect block at
 * addr (nrows rows, heap offset `ioff`), down at most FH_MAX_ROWS levels. */
static int find_direct(h5_file *h, h5_fheap *fh, uint64_t addr, unsigned nrows, uint64_t ioff, uint64_t off,
                       int depth, uint64_t *daddr, uint64_t *doff, uint64_t *dsize) {
    const char *what = "fractal heap";
    if (depth > FH_MAX_ROWS) return h5_fail(h, FERRY_EFORMAT, h->base + addr, what, "indirect blocks nest too deep");
    uint64_t entries = (uint64_t)nrows * fh->width;
    uint64_t hdr = 4 + 1 + h->so + fh->off_bytes, total = hdr + entries * h->so + 4;
    const uint8_t *p;
    int rc = h5_read(h, addr, total, &p, what);
    if (rc) return rc;
    uint64_t abs = h->base + addr;
    if (memcmp(p, "FHIB", 4)) return h5_fail(h, FERRY_EFORMAT, abs, what, "indirect block without \"FHIB\"");
    if ((rc = h5_check_sum(h, p, total, abs, what))) return rc;
    h5_cur c = h5_cur_make(h, p + hdr, entries * h->so, abs + hdr);
    uint64_t o = ioff;
    for (unsigned r = 0; r < nrows; r++) {
        uint64_t rs = row_size(fh, r);
        for (unsigned k = 0; k < fh->width; k++) {
            uint64_t child = h5c_addr(&c);
            if (off >= o && off - o < rs) {
                if (child == H5_UNDEF)
                    return h5_fail(h, FERRY_EFORMAT, abs, what, "heap offset %llu lies in an unallocated block",
                                   (unsigned long long)off);
                if (r < fh->max_direct_rows) { *daddr = child; *doff = o; *dsize = rs; return 0; }
                unsigned sub = log2u(rs) - log2u(fh->start) - log2u(fh->width) + 1;
                if (sub == 0 || sub > nrows)
                    return h5_fail(h, FERRY_EFORMAT, abs, what, "indirect block of %u rows", sub);
                return find_direct(h, fh, child, sub, o, off, depth + 1, daddr, doff, dsize);
            }
            o += rs;
        }
    }
    return h5_fail(h, FERRY_EFORMAT, abs, what, "heap offset %llu outside the heap", (unsigned long long)off);
}

int h5_fheap_get(h5_file *h, h5_fheap *fh, const uint8_t *id, uint32_t idlen, const uint8_t **p, uint64_t *len) {
    const char *what = "fractal heap";
    uint64_t abs = h->base + fh->addr;
    if (idlen < 1) return h5_fail(h, FERRY_EFORMAT, abs, what, "empty heap ID");
    unsigned kind = (id[0] >> 4) & 3;
    if ((id[0] >> 6) != 0) return h5_fail(h, FERRY_EFORMAT, abs, what, "heap ID version %u", id[0] >> 6);
    if (kind == 2) {                /* tiny: the object is in the ID */
        uint64_t n = (uint64_t)(id[0] & 0x0f) + 1;
        if (n > idlen - 1) return h5_fail(h, FERRY_EFORMAT, abs, what, "tiny object of %llu bytes", (unsigned long long)n);
        *p = id + 1;
        *len = n;
        return 0;
    }
    if (kind != 0) return h5_fail(h, FERRY_EUNSUPPORTED, abs, what, "huge objects (heap ID type %u)", kind);
    if (1 + fh->off_bytes + fh->len_bytes > idlen)
        return h5_fail(h, FERRY_EFORMAT, abs, what, "heap ID of %u bytes too short", idlen);
    h5_cur c = {id + 1, id + idlen, 0, 0, h->so, h->sl};
    uint64_t off = h5c_un(&c, fh->off_bytes), n = h5c_un(&c, fh->len_bytes);
    if (fh->root == H5_UNDEF) return h5_fail(h, FERRY_EFORMAT, abs, what, "object in an empty heap");
    uint64_t daddr = fh->root, doff = 0, dsize = fh->start;
    int rc;
    if (fh->root_rows && (rc = find_direct(h, fh, fh->root, fh->root_rows, 0, off, 0, &daddr, &doff, &dsize))) return rc;
    uint64_t in = off - doff, dhdr = 4 + 1 + h->so + fh->off_bytes + ((fh->flags & 2) ? 4 : 0);
    if (off < doff || in < dhdr || n > dsize || in > dsize - n)
        return h5_fail(h, FERRY_EFORMAT, abs, what, "object [%llu, +%llu) outside its %llu-byte block",
                       (unsigned long long)off, (unsigned long long)n, (unsigned long long)dsize);
    /* the whole direct block, read (and cached) once: a variable's dense
     * attributes are many objects of one block, each read apart otherwise.
     * A block larger than FH_WHOLE_BLOCK (big attribute values) is read by
     * its header and the object alone, as ever. */
    const uint8_t *b;
    uint64_t got;
    if (dsize > FH_WHOLE_BLOCK) {
        if ((rc = h5_read(h, daddr, 5, &b, what))) return rc;
        if (memcmp(b, "FHDB", 4)) return h5_fail(h, FERRY_EFORMAT, h->base + daddr, what, "direct block without \"FHDB\"");
        if ((rc = h5_read(h, daddr + in, n, p, what))) return rc;
        *len = n;
        return 0;
    }
    if ((rc = h5_read_upto(h, daddr, dsize, &b, &got, what))) return rc;
    if (got < 5 || memcmp(b, "FHDB", 4))
        return h5_fail(h, FERRY_EFORMAT, h->base + daddr, what, "direct block without \"FHDB\"");
    if (in + n > got)
        return h5_fail(h, FERRY_EFORMAT, h->base + daddr + in, what, "file ends inside %llu bytes", (unsigned long long)n);
    *p = b + in;
    *len = n;
    return 0;
}

/* ---- version-2 B-trees -------------------------------------------------------- */
#define BT2_MAX_DEPTH 16

typedef struct bt2 {
    h5_file *h;
    const char *what;
    int type;
    uint32_t node_size;
    uint16_t rec_size;
    uint64_t max_nrec[BT2_MAX_DEPTH + 1];
    unsigned nrec_bytes, cum_bytes[BT2_MAX_DEPTH + 1];
    uint64_t budget;                /* records left to visit (the header's total) */
    h5_rec_fn fn;
    void *arg;
} bt2;

static unsigned enc_size(uint64_t v) { return log2u(v) / 8 + 1; }

static int bt2_node(bt2 *t, uint64_t addr, uint64_t nrec, int depth) {
    h5_file *h = t->h;
    uint64_t abs = h->base + addr;
    if (nrec > t->max_nrec[depth] || nrec > t->budget)
        return h5_fail(h, FERRY_EFORMAT, abs, t->what, "B-tree node claims %llu records", (unsigned long long)nrec);
    const uint8_t *p;
    int rc = h5_read(h, addr, t->node_size, &p, t->what);
    if (rc) return rc;
    if (memcmp(p, depth ? "BTIN" : "BTLF", 4) || p[4] != 0 || p[5] != t->type)
        return h5_fail(h, FERRY_EFORMAT, abs, t->what, "not a version-2 B-tree %s node of type %d",
                       depth ? "internal" : "leaf", t->type);
    unsigned ptr = depth ? h->so + t->nrec_bytes + (depth > 1 ? t->cum_bytes[depth - 1] : 0) : 0;
    uint64_t used = 6 + nrec * t->rec_size + (depth ? (nrec + 1) * ptr : 0);
    if (used + 4 > t->node_size) return h5_fail(h, FERRY_EFORMAT, abs, t->what, "B-tree node overfull");
    if ((rc = h5_check_sum(h, p, used + 4, abs, t->what))) return rc;
    h5_cur c = h5_cur_make(h, p + 6 + nrec * t->rec_size, depth ? (nrec + 1) * ptr : 0, abs + 6 + nrec * t->rec_size);
    /* in order: child 0, record 0, child 1, ... */
    for (uint64_t i = 0; i <= nrec; i++) {
        if (depth) {
            uint64_t child = h5c_addr(&c), cn = h5c_un(&c, t->nrec_bytes);
            if (depth > 1) h5c_un(&c, t->cum_bytes[depth - 1]);
            if (c.bad || child == H5_UNDEF) return h5_fail(h, FERRY_EFORMAT, abs, t->what, "bad child pointer");
            if ((rc = bt2_node(t, child, cn, depth - 1))) return rc;
        }
        if (i < nrec) {
            if (t->budget == 0) return h5_fail(h, FERRY_EFORMAT, abs, t->what, "more records than the header says");
            t->budget--;
            if ((rc = t->fn(t->arg, p + 6 + i * t->rec_size, t->rec_size, abs + 6 + i * t->rec_size))) return rc;
        }
    }
    return 0;
}

int h5_btree2_walk(h5_file *h, uint64_t addr, int type, const char *what, h5_rec_fn fn, void *arg) {
    const uint8_t *p;
    uint64_t abs = h->base + addr, hl = 4 + 1 + 1 + 4 + 2 + 2 + 1 + 1 + h->so + 2 + h->sl + 4;
    int rc = h5_read(h, addr, hl, &p, what);
    if (rc) return rc;
    if (memcmp(p, "BTHD", 4) || p[4] != 0)
        return h5_fail(h, FERRY_EFORMAT, abs, what, "not a version-2 B-tree header (\"BTHD\", version 0)");
    if ((rc = h5_check_sum(h, p, hl, abs, what))) return rc;
    if (p[5] != type) return h5_fail(h, FERRY_EFORMAT, abs, what, "B-tree of type %u, expected %d", p[5], type);
    h5_cur c = h5_cur_make(h, p + 6, hl - 6, abs + 6);
    bt2 t = {.h = h, .what = what, .type = type, .fn = fn, .arg = arg};
    t.node_size = h5c_u32(&c);
    t.rec_size = h5c_u16(&c);
    uint16_t depth = h5c_u16(&c);
    h5c_skip(&c, 2);
    uint64_t root = h5c_addr(&c), root_n = h5c_u16(&c), total = h5c_len(&c);
    if (t.node_size < 16 || t.node_size > (1u << 24) || t.rec_size == 0 || depth > BT2_MAX_DEPTH ||
        t.rec_size > t.node_size - 10)
        return h5_fail(h, FERRY_EFORMAT, abs, what, "B-tree node size %u, record size %u, depth %u", t.node_size,
                       t.rec_size, depth);
    if (root == H5_UNDEF || total == 0) return 0;
    t.max_nrec[0] = (t.node_size - 10) / t.rec_size;
    t.nrec_bytes = enc_size(t.max_nrec[0]);
    uint64_t cum = t.max_nrec[0];
    for (int d = 1; d <= depth; d++) {
        unsigned ptr = h->so + t.nrec_bytes + (d > 1 ? t.cum_bytes[d - 1] : 0);
        if (t.node_size - 10 < ptr) return h5_fail(h, FERRY_EFORMAT, abs, what, "B-tree nodes too small");
        t.max_nrec[d] = (t.node_size - 10 - ptr) / (t.rec_size + ptr);
        uint64_t next;
        if (ferry_mul_overflow(t.max_nrec[d] + 1, cum, &next) || ferry_add_overflow(next, t.max_nrec[d], &next))
            next = UINT64_MAX;
        cum = next;
        t.cum_bytes[d] = enc_size(cum) > 8 ? 8 : enc_size(cum);
    }
    t.cum_bytes[0] = 0;
    /* each record is stored once: more visits than the file can hold
     * records means nodes are shared (a hostile tree), not a bigger index */
    t.budget = FERRY_MIN(total, h->size / t.rec_size + 1);
    return bt2_node(&t, root, root_n, depth);
}
