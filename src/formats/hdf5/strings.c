/* strings.c — variable-length strings: the references a dataset stores, one
 * per element, resolved through the file's global heap.
 *
 * A stored element of a variable-length string type (File Format
 * Specification 3.0, "Variable-Length" datatype, and "Global Heap") is
 *   length (4 bytes: characters), collection address (Size of Offsets),
 *   object index (4 bytes)
 * and the characters are object `index` of the "Global Heap Collection" at
 * that address: "GCOL", version 1, 3 reserved bytes, the collection's size
 * (Size of Lengths, header included), then objects, each an index (2), a
 * reference count (2), 4 reserved bytes, its size (Size of Lengths) and its
 * data padded to a multiple of 8; index 0 is the free space that ends the
 * list.
 *
 * Many elements share a collection (HDF5 fills collections of 4 KiB and
 * more), so the distinct collections a selection names are read once each,
 * by plans (one for all of them, one more for those longer than the first
 * read), indexed, and then every element is looked up. Collections in a valid
 * file do not overlap: together they hold at most the file's bytes, which
 * bounds what a hostile file can make this read. */
#include "formats/hdf5/h5.h"
#include <stdlib.h>

#define GCOL_FIRST 4096               /* HDF5's smallest collection: read this much at once */

typedef struct gobj { uint32_t index; uint64_t off, len; } gobj;
typedef struct gcol {
    uint64_t addr, abs, size;         /* relative and absolute offset, bytes (header included) */
    uint8_t *data;
    uint64_t got;                     /* bytes of data read */
    gobj *objs;                       /* by index */
    size_t nobjs;
} gcol;

typedef struct gtab {
    gcol *c;                          /* open addressing on addr; addr H5_UNDEF: empty */
    size_t cap, n;
} gtab;

static size_t gtab_slot(const gtab *t, uint64_t addr) {
    uint64_t x = addr * 0x9E3779B97F4A7C15ull;
    size_t j = (size_t)(x ^ (x >> 29)) & (t->cap - 1);
    while (t->c[j].addr != H5_UNDEF && t->c[j].addr != addr) j = (j + 1) & (t->cap - 1);
    return j;
}

/* Room for one more collection: the table grows at half full. */
static int gtab_grow(const h5_file *h, gtab *t) {
    if (2 * (t->n + 1) <= t->cap) return 0;
    gtab old = *t;
    t->cap = old.cap ? 2 * old.cap : 64;
    if (!(t->c = malloc(t->cap * sizeof *t->c))) { *t = old; return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path); }
    for (size_t i = 0; i < t->cap; i++) t->c[i] = (gcol){.addr = H5_UNDEF};
    for (size_t i = 0; i < old.cap; i++)
        if (old.c[i].addr != H5_UNDEF) t->c[gtab_slot(t, old.c[i].addr)] = old.c[i];
    free(old.c);
    return 0;
}

static void gtab_free(gtab *t) {
    for (size_t i = 0; i < t->cap; i++) { free(t->c[i].data); free(t->c[i].objs); }
    free(t->c);
}

/* One element's reference. */
static void ref_parse(const h5_file *h, const uint8_t *p, uint32_t refsize, uint32_t *len, uint64_t *addr,
                      uint32_t *ix) {
    h5_cur c = h5_cur_make(h, p, refsize, 0);
    *len = h5c_u32(&c);
    *addr = h5c_addr(&c);
    *ix = h5c_u32(&c);
}

static int cmp_obj(const void *a, const void *b) {
    uint32_t x = ((const gobj *)a)->index, y = ((const gobj *)b)->index;
    return x < y ? -1 : x > y;
}

/* Check collection g's header (read in full or not) and index its objects. */
static int gcol_index(h5_file *h, gcol *g, const char *what) {
    uint64_t hl = 8 + h->sl;
    h5_cur c = h5_cur_make(h, g->data, g->size, g->abs);
    h5c_skip(&c, hl);
    size_t cap = 0;
    while (h5c_left(&c) >= 8 + (uint64_t)h->sl) {   /* each object takes 8 + sl bytes at least: bounded */
        uint64_t at = c.pos;
        uint16_t ix = h5c_u16(&c);
        h5c_skip(&c, 6);              /* reference count, reserved */
        uint64_t len = h5c_len(&c);
        if (ix == 0) break;           /* free space: the rest of the collection */
        uint64_t off = (uint64_t)(c.p - g->data);
        if (len > h5c_left(&c))
            return h5_fail(h, FERRY_EFORMAT, at, what, "global heap object %u of %llu bytes runs past its collection "
                           "(%llu bytes at byte %llu)", ix, (unsigned long long)len, (unsigned long long)g->size,
                           (unsigned long long)g->abs);
        uint64_t pad = (len + 7) & ~(uint64_t)7;
        h5c_skip(&c, pad < h5c_left(&c) ? pad : h5c_left(&c));
        if (g->nobjs == cap) {
            cap = cap ? 2 * cap : 64;
            gobj *o = realloc(g->objs, cap * sizeof *o);
            if (!o) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path);
            g->objs = o;
        }
        g->objs[g->nobjs++] = (gobj){ix, off, len};
    }
    if (g->nobjs) qsort(g->objs, g->nobjs, sizeof *g->objs, cmp_obj);
    for (size_t i = 1; i < g->nobjs; i++)
        if (g->objs[i].index == g->objs[i - 1].index)
            return h5_fail(h, FERRY_EFORMAT, g->abs, what, "global heap collection holds object %u twice",
                           g->objs[i].index);
    return 0;
}

static const gobj *gcol_find(const gcol *g, uint32_t ix) {
    if (!g->objs) return NULL;
    size_t lo = 0, hi = g->nobjs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->objs[mid].index == ix) return &g->objs[mid];
        if (g->objs[mid].index < ix) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static int run_plan(ferry_ctx *ctx, ferry_plan *p, const ferry_run_opts *opts) {
    if (!ferry_plan_count(p)) return 0;
    int64_t r = ferry_run(ctx, p, opts);
    ferry_plan_clear(p);
    return r < 0 ? (int)r : 0;
}

/* Read every collection of t: the first GCOL_FIRST bytes of each (or its
 * header, when collections that small would not fit the file), then the rest
 * of those that are longer. */
static int gcols_read(h5_file *h, ferry_ctx *ctx, ferry_file *f, gtab *t, const ferry_run_opts *opts,
                      const char *what) {
    uint64_t hl = 8 + h->sl, first = GCOL_FIRST, want;
    if (ferry_mul_overflow(t->n, GCOL_FIRST, &want) || want > h->size) first = hl;
    ferry_plan *p;
    int rc = ferry_plan_create(&p);
    if (rc < 0) return rc;
    for (size_t i = 0; i < t->cap && !rc; i++) {
        gcol *g = &t->c[i];
        if (g->addr == H5_UNDEF) continue;
        g->got = h->size - g->abs < first ? h->size - g->abs : first;
        if (!(g->data = malloc(g->got))) rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path);
        else rc = ferry_plan_read(p, f, g->abs, g->got, ferry_host_buf(g->data, g->got), 0);
    }
    if (!rc) rc = run_plan(ctx, p, opts);
    uint64_t total = 0;
    for (size_t i = 0; i < t->cap && !rc; i++) {
        gcol *g = &t->c[i];
        if (g->addr == H5_UNDEF) continue;
        h5_cur c = h5_cur_make(h, g->data, g->got, g->abs);
        const uint8_t *sig = h5c_bytes(&c, 4);
        uint8_t version = h5c_u8(&c);
        h5c_skip(&c, 3);
        g->size = h5c_len(&c);
        if (c.bad || memcmp(sig, "GCOL", 4) || version != 1) {
            rc = h5_fail(h, FERRY_EFORMAT, g->abs, what, "no global heap collection (\"GCOL\", version 1) here");
            break;
        }
        if (g->size < hl || g->size > h->size - g->abs) {
            rc = h5_fail(h, FERRY_EFORMAT, g->abs, what, "global heap collection of %llu bytes in a file of %llu",
                         (unsigned long long)g->size, (unsigned long long)h->size);
            break;
        }
        total += g->size;             /* each at most the file size, at most 2^26 of them: no overflow */
        if (total > 2 * FERRY_STRINGS_MAX_BYTES) {   /* a hostile file's one short string in a huge heap */
            rc = h5_fail(h, FERRY_EUNSUPPORTED, g->abs, what, "the strings of this read live in global heap "
                         "collections of more than %llu bytes: more than ferry reads for one call",
                         (unsigned long long)(2 * FERRY_STRINGS_MAX_BYTES));
            break;
        }
        if (total > h->size) {
            rc = h5_fail(h, FERRY_EFORMAT, g->abs, what, "global heap collections of more bytes (%llu) than the file "
                         "holds (%llu): they overlap", (unsigned long long)total, (unsigned long long)h->size);
            break;
        }
        if (g->size > g->got) {
            uint8_t *d = realloc(g->data, g->size);
            if (!d) { rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path); break; }
            g->data = d;
            rc = ferry_plan_read(p, f, g->abs + g->got, g->size - g->got, ferry_host_buf(g->data, g->size), g->got);
        }
        g->got = g->size;             /* once the plan has run */
    }
    if (!rc) rc = run_plan(ctx, p, opts);
    ferry_plan_destroy(p);
    for (size_t i = 0; i < t->cap && !rc; i++)
        if (t->c[i].addr != H5_UNDEF) rc = gcol_index(h, &t->c[i], what);
    return rc;
}

int h5_strings_resolve(h5_file *h, ferry_ctx *ctx, ferry_file *f, const uint8_t *refs, uint64_t count,
                       uint32_t refsize, const char *what, uint64_t pos, const ferry_run_opts *opts, ferry_strings *out) {
    if (refsize != 4u + h->so + 4u)
        return h5_fail(h, FERRY_EFORMAT, pos, what, "variable-length references of %u bytes (%u expected)", refsize,
                       4u + h->so + 4u);
    uint64_t hl = 8 + h->sl;
    gtab t = {0};
    int rc = gtab_grow(h, &t);
    if (rc) return rc;
    /* the distinct collections named */
    for (uint64_t i = 0; i < count && !rc; i++) {
        uint32_t len, ix;
        uint64_t addr;
        ref_parse(h, refs + i * refsize, refsize, &len, &addr, &ix);
        if (!len) continue;           /* "" or a NULL pointer: no heap object */
        if (addr == 0 || addr == H5_UNDEF) {
            rc = h5_fail(h, FERRY_EFORMAT, pos, what, "element %llu of the selection: a string of %u bytes without a "
                         "heap collection", (unsigned long long)i, len);
            break;
        }
        size_t j = gtab_slot(&t, addr);
        if (t.c[j].addr == addr) continue;
        uint64_t abs;
        if ((rc = h5_abs(h, addr, hl, &abs, what))) break;
        if ((uint64_t)(t.n + 1) * hl > h->size) {
            rc = h5_fail(h, FERRY_EFORMAT, abs, what, "more global heap collections (%zu) than a file of %llu bytes "
                         "holds", t.n + 1, (unsigned long long)h->size);
            break;
        }
        if ((rc = gtab_grow(h, &t))) break;
        t.c[gtab_slot(&t, addr)] = (gcol){.addr = addr, .abs = abs};
        t.n++;
    }
    if (!rc && t.n) rc = gcols_read(h, ctx, f, &t, opts, what);
    /* the text's size, then the text */
    uint64_t total = 0;
    for (int pass = 0; pass < 2 && !rc; pass++) {
        if (pass == 1) {
            out->offsets = malloc((count + 1) * sizeof *out->offsets);
            out->data = malloc(total + 1);
            if (!out->offsets || !out->data) { rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path); break; }
            out->offsets[0] = 0;
            total = 0;
        }
        for (uint64_t i = 0; i < count; i++) {
            uint32_t len, ix;
            uint64_t addr, n = 0;
            ref_parse(h, refs + i * refsize, refsize, &len, &addr, &ix);
            const char *s = "";
            if (len) {
                const gcol *g = &t.c[gtab_slot(&t, addr)];
                const gobj *o = gcol_find(g, ix);
                if (!o) {
                    rc = h5_fail(h, FERRY_EFORMAT, g->abs, what, "element %llu of the selection: global heap object "
                                 "%u not found", (unsigned long long)i, ix);
                    break;
                }
                if (len > o->len) {
                    rc = h5_fail(h, FERRY_EFORMAT, g->abs + o->off, what, "element %llu of the selection: a string "
                                 "of %u bytes in a %llu-byte heap object", (unsigned long long)i, len,
                                 (unsigned long long)o->len);
                    break;
                }
                s = (const char *)g->data + o->off;
                n = strnlen(s, len);
            }
            if (pass == 0) {
                total += n;
                if (total > FERRY_STRINGS_MAX_BYTES) {
                    rc = ferry_seterr(FERRY_EINVAL, "%s: %s: a selection of %llu strings holds more than %llu bytes "
                                      "of text (the most one read takes): read it in parts", h->path, what,
                                      (unsigned long long)count, (unsigned long long)FERRY_STRINGS_MAX_BYTES);
                    break;
                }
            } else {
                memcpy(out->data + total, s, n);
                total += n;
                out->offsets[i + 1] = total;
            }
        }
    }
    if (!rc) {
        out->data[total] = 0;
        out->count = count;
    }
    gtab_free(&t);
    return rc;
}
