/* layout.c — ferry_plan_layout: a selection of a chunked array → plan extents.
 *
 * One planner for every chunked format (Zarr in zarr.c, HDF5 / netCDF-4
 * chunk tables from the xarray backend). Per dimension, the chunks the
 * selection touches are listed once (dim_hits: chunk index, first selected
 * index in it, how many); the chunks touched are the cartesian product of
 * those lists, visited in C order of the chunk grid, so a sparse table is
 * searched forward from the last entry found. Each chunk is then one extent:
 * a FILL of its part of the selection when absent, else a READ of its bytes
 * with the chain and a ferry_place from the decoded chunk into dst.
 * ferry.h says what the caller describes; plan.c checks every extent against
 * dst, so nothing a table says can make an extent write outside it. */
#include "formats/layout.h"
#include "formats/select.h"
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>

int64_t ferry_selection_normalize(int ndim, const uint64_t *shape, uint32_t itemsize, const ferry_slice *sel,
                                  ferry_slice *out, const char *file, const char *name) {
    uint64_t bytes = itemsize;
    for (int k = 0; k < ndim; k++) {
        ferry_slice s = sel ? sel[k] : (ferry_slice){0, (int64_t)shape[k], 1};
        /* a C caller's selection is taken as meant: one reaching past the
         * variable is an error, not clipped into a smaller read than asked
         * (Python clips slices as numpy does before they get here) */
        if (s.step < 1 || s.start < 0 || s.stop < 0 || (uint64_t)s.start > shape[k] || (uint64_t)s.stop > shape[k])
            return ferry_seterr(FERRY_EINVAL,
                                "%s: variable \"%s\": dimension %d: selection %lld:%lld:%lld outside 0..%llu",
                                file ? file : "?", name ? name : "?", k, (long long)s.start, (long long)s.stop,
                                (long long)s.step, (unsigned long long)shape[k]);
        if (s.stop < s.start) s.stop = s.start;
        out[k] = s;
        if (ferry_mul_overflow(bytes, ferry_slice_count(s), &bytes) || bytes > (uint64_t)INT64_MAX)
            return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": selection size overflows", file ? file : "?",
                                name ? name : "?");
    }
    return (int64_t)bytes;
}

static const char *lname(const ferry_layout *l) { return l->label ? l->label : "?"; }
static const char *lfile(const ferry_layout *l) { return l->path ? l->path : "layout"; }

int ferry_layout_check(const ferry_layout *l) {
    if (!l) return ferry_seterr(FERRY_EINVAL, "ferry_plan_layout: NULL layout");
    if (l->ndim < 0 || l->ndim > FERRY_MAX_DIMS)
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": %d dimensions (at most %d)", lfile(l), lname(l),
                            l->ndim, FERRY_MAX_DIMS);
    if (l->itemsize < 1 || l->itemsize > (1u << 20))
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": element size %u (1 to 2^20)", lfile(l), lname(l),
                            l->itemsize);
    uint64_t cb = l->itemsize;
    for (int k = 0; k < l->ndim; k++) {
        if (l->chunks[k] < 1 || l->shape[k] > (uint64_t)INT64_MAX || l->chunks[k] > (uint64_t)INT64_MAX)
            return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": dimension %d: shape %llu, chunk %llu",
                                lfile(l), lname(l), k, (unsigned long long)l->shape[k],
                                (unsigned long long)l->chunks[k]);
        if (ferry_mul_overflow(cb, l->chunks[k], &cb) || cb > (uint64_t)INT64_MAX)
            return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": a chunk's size overflows", lfile(l), lname(l));
    }
    if (l->order == FERRY_ORDER_PERM) {
        unsigned seen = 0;
        for (int k = 0; k < l->ndim; k++) {
            if (l->perm[k] < 0 || l->perm[k] >= l->ndim || (seen >> l->perm[k] & 1))
                return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": perm is not a permutation", lfile(l),
                                    lname(l));
            seen |= 1u << l->perm[k];
        }
    } else if (l->order != FERRY_ORDER_C && l->order != FERRY_ORDER_F)
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": unknown order %d", lfile(l), lname(l), (int)l->order);
    if (l->ncodecs < 0 || l->ncodecs > FERRY_MAX_CODECS)
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": %d codecs (at most %d)", lfile(l), lname(l),
                            l->ncodecs, FERRY_MAX_CODECS);
    if (l->swap && (l->swap > 16 || (l->swap & (l->swap - 1)) || l->itemsize % l->swap))
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": swap %u does not divide the %u-byte element",
                            lfile(l), lname(l), l->swap, l->itemsize);
    if (l->table && l->lookup)
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": a table and a lookup", lfile(l), lname(l));
    if (!l->table && !l->lookup && l->ntable)
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": ntable without a table", lfile(l), lname(l));
    return 0;
}

/* ---- the chunks a selection touches ------------------------------------------ */

/* The chunks of one dimension a selection touches, within [lo, hi) of that
 * dimension: chunk index, first selected index in it, how many. */
typedef struct dim_hit { uint64_t chunk, first, n; } dim_hit;

static int dim_hits(ferry_slice s, uint64_t csize, uint64_t lo, uint64_t hi, dim_hit **out, size_t *nout) {
    *out = NULL; *nout = 0;
    uint64_t step = (uint64_t)s.step, start = (uint64_t)s.start, stop = (uint64_t)s.stop;
    if (stop > hi) stop = hi;
    /* first selected index >= lo */
    uint64_t i = start;
    if (i < lo) i = start + (lo - start + step - 1) / step * step;
    size_t cap = 0;
    while (i < stop) {
        uint64_t c = i / csize, cend = stop;
        if (stop / csize > c) cend = (c + 1) * csize;   /* (c+1)*csize <= stop: no overflow */
        uint64_t n = (cend - 1 - i) / step + 1;
        if (*nout == cap) {
            cap = cap ? cap * 2 : 8;
            dim_hit *nv = realloc(*out, cap * sizeof *nv);
            if (!nv) { free(*out); *out = NULL; return ferry_seterr(FERRY_ENOMEM, "chunk planning: out of memory"); }
            *out = nv;
        }
        (*out)[(*nout)++] = (dim_hit){c, i, n};
        if (__builtin_mul_overflow(n, step, &n) || __builtin_add_overflow(i, n, &i)) break;
    }
    return 0;
}

/* Per-dimension hit lists of sel inside [lo, hi), then fn for each product
 * (in C order of the grid: it[] its position in the lists), and once more with
 * h NULL after the last one (the planner's pending fill run). */
typedef struct hit_iter {
    int nd;
    const dim_hit *const *lists;
    const size_t *counts;
    const size_t *it;
} hit_iter;
typedef int (*hits_fn)(void *arg, const dim_hit *const *h, const hit_iter *hi);

static int for_each_hit(const ferry_layout *l, const ferry_slice *sel, const uint64_t *lo, const uint64_t *hi,
                        hits_fn fn, void *arg) {
    int nd = l->ndim, rc = 0;
    dim_hit *lists[FERRY_MAX_DIMS] = {0};
    size_t counts[FERRY_MAX_DIMS] = {0};
    for (int k = 0; k < nd && !rc; k++)
        rc = dim_hits(sel[k], l->chunks[k], lo ? lo[k] : 0, hi && hi[k] < l->shape[k] ? hi[k] : l->shape[k],
                      &lists[k], &counts[k]);
    int empty = 0;
    for (int k = 0; k < nd; k++) if (!counts[k]) empty = 1;
    size_t it[FERRY_MAX_DIMS] = {0};
    hit_iter hx = {nd, (const dim_hit *const *)lists, counts, it};
    while (!rc && !empty) {
        const dim_hit *h[FERRY_MAX_DIMS] = {0};
        for (int k = 0; k < nd; k++) h[k] = &lists[k][it[k]];
        if ((rc = fn(arg, h, &hx)) < 0) break;
        int k = nd - 1;
        while (k >= 0 && ++it[k] == counts[k]) it[k--] = 0;
        if (k < 0) break;
    }
    if (!rc && !empty) rc = fn(arg, NULL, &hx);
    for (int k = 0; k < nd; k++) free(lists[k]);
    return rc < 0 ? rc : 0;
}

typedef struct visit_arg { const ferry_layout *l; ferry_grid_fn fn; void *arg; } visit_arg;

static int visit_one(void *varg, const dim_hit *const *h, const hit_iter *hx) {
    visit_arg *v = varg;
    (void)hx;
    if (!h) return 0;
    uint64_t idx[FERRY_MAX_DIMS];
    for (int k = 0; k < v->l->ndim; k++) idx[k] = h[k]->chunk;
    return v->fn(v->arg, idx);
}

int ferry_layout_visit(const ferry_layout *l, const ferry_slice *sel, ferry_grid_fn fn, void *arg) {
    visit_arg v = {l, fn, arg};
    return for_each_hit(l, sel, NULL, NULL, visit_one, &v);
}

/* ---- planning ----------------------------------------------------------------- */

typedef struct plan_state {
    const ferry_layout *l;
    const ferry_slice *sel;
    ferry_buf dst;
    ferry_plan *plan;
    int64_t dstr[FERRY_MAX_DIMS];      /* destination byte strides */
    int64_t cstr[FERRY_MAX_DIMS];      /* byte strides inside a decoded chunk */
    uint64_t cbytes;                   /* decoded chunk size */
    int native;                        /* append a BYTESWAP of l->swap */
    int fdst;                          /* dst in F order */
    uint8_t fill[16];                  /* in the order the data lands in */
    uint64_t gstr[FERRY_MAX_DIMS];     /* linear grid index strides (tables) */
    size_t cursor;                     /* sparse table: entries before it are passed */
    /* absent chunks: a run of them, consecutive in the visit's order, as
     * linear positions [run_lo, run_hi) in the product of the hit lists */
    int run;
    uint64_t run_lo, run_hi;
    size_t base;                       /* the plan's records when this call began */
    uint64_t bound;                    /* the records it may add (plan_bound) */
} plan_state;

/* The chunk at grid index idx, from the table or the lookup. */
static int find_chunk(plan_state *p, const uint64_t *idx, ferry_chunk *c) {
    const ferry_layout *l = p->l;
    memset(c, 0, sizeof *c);
    c->length = FERRY_CHUNK_ABSENT;
    if (l->lookup) return l->lookup(l->lookup_arg, idx, c);
    if (!l->table) return 0;
    uint64_t lin = 0;
    for (int k = 0; k < l->ndim; k++) lin += idx[k] * p->gstr[k];
    if (!l->table_index) {
        if (lin < l->ntable) *c = l->table[lin];
        return 0;
    }
    size_t a = p->cursor, b = l->ntable;   /* first entry >= lin in [cursor, n) */
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (l->table_index[m] < lin) a = m + 1; else b = m;
    }
    p->cursor = a;
    if (a < l->ntable && l->table_index[a] == lin) *c = l->table[a];
    return 0;
}

/* How many records one planning call may add to a plan. A plan holds one
 * record per stored chunk its selection touches and, for the absent chunks
 * between them, at most 2 x ndim fill records per run (flush_run): so its
 * size follows the chunks that exist, never the chunks the metadata claims.
 * A record costs about a KiB (the extent, its placement, its path) while a
 * stored chunk may place a single element, so a read of many tiny chunks
 * could still need far more memory for its plan than for its data: the
 * records are bounded by max(2^20, dst bytes / 64), a plan at most ~16 times
 * its destination (~1 GiB at the floor). Every read of chunks of 64 bytes or
 * more fits, and so does any read of up to 2^20 chunks; a read past the bound
 * fails naming the file, the variable, the chunks the selection touches and
 * the bound, before the plan has used that memory (a smaller selection, read
 * in turn, plans within it). */
static _Atomic uint64_t records_floor = (uint64_t)1 << 20;
void ferry_layout_set_records_floor_(uint64_t floor) { records_floor = floor ? floor : (uint64_t)1 << 20; }
static uint64_t plan_bound(uint64_t dst_bytes) {
    uint64_t b = dst_bytes / 64, f = records_floor;
    return b > f ? b : f;
}

static int over_bound(plan_state *p, const hit_iter *hx) {
    size_t now = ferry_plan_count(p->plan);
    if (now - p->base <= p->bound) return 0;
    const ferry_layout *l = p->l;
    uint64_t touched = 1;
    for (int k = 0; hx && k < hx->nd; k++) touched *= hx->counts[k];   /* <= the elements selected */
    return ferry_seterr(FERRY_ENOMEM, "%s: variable \"%s\": the selection touches %llu chunks; its plan would pass "
                        "%llu records (max(2^20, destination bytes / 64)): chunks of %llu bytes are too small to "
                        "plan this many at once: read a smaller selection at a time", lfile(l), lname(l),
                        (unsigned long long)touched, (unsigned long long)p->bound,
                        (unsigned long long)p->cbytes);
}

static int add_extent(plan_state *p, const ferry_extent *e, const hit_iter *hx) {
    int rc = ferry_plan_add(p->plan, e);
    if (rc == FERRY_ENOMEM)
        return ferry_seterr(rc, "%s: variable \"%s\": out of memory for a plan of %zu records",
                            lfile(p->l), lname(p->l), ferry_plan_count(p->plan));
    return rc < 0 ? rc : over_bound(p, hx);
}

/* A FILL extent of the fill value over the box pl (count and dst strides set)
 * at dst_off. */
static int add_fill(plan_state *p, ferry_place *pl, uint64_t dst_off, const hit_iter *hx) {
    const ferry_layout *l = p->l;
    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.kind = FERRY_EXTENT_FILL;
    e.dst = p->dst;
    e.dst_offset = dst_off;
    e.label = l->label;
    e.place = pl;
    if (l->itemsize > 16) {
        /* fills repeat at most 16 bytes: a zero fill of wide elements
         * becomes a fill of single bytes over one more dimension */
        if (pl->ndim >= FERRY_MAX_DIMS)
            return ferry_seterr(FERRY_EUNSUPPORTED, "%s: variable \"%s\": absent chunk of a %d-d array of "
                                "%u-byte elements", lfile(l), lname(l), l->ndim, l->itemsize);
        pl->count[pl->ndim] = l->itemsize;
        pl->dst_stride[pl->ndim] = 1;
        pl->src_stride[pl->ndim] = 0;
        pl->ndim++;
        pl->itemsize = 1;
        return add_extent(p, &e, hx);
    }
    memcpy(e.fill, p->fill, l->itemsize);
    return add_extent(p, &e, hx);
}

/* The run of absent chunks [run_lo, run_hi) (linear positions in the product
 * of the hit lists, C order) as few boxes: from each position, the largest
 * aligned block that fits in the run — a range of hits in one dimension k,
 * the dimensions before k fixed, every hit of those after k. Each box is one
 * fill: the selected indices of consecutive hits of a dimension are
 * consecutive in dst. At most 2 x ndim boxes per run. */
static int flush_run(plan_state *p, const hit_iter *hx) {
    if (!p->run) return 0;
    p->run = 0;
    const ferry_layout *l = p->l;
    int nd = hx->nd;
    uint64_t blk[FERRY_MAX_DIMS + 1], total[FERRY_MAX_DIMS];
    blk[nd] = 1;
    for (int k = nd - 1; k >= 0; k--) blk[k] = blk[k + 1] * hx->counts[k];   /* <= elements selected */
    for (int k = 0; k < nd; k++) {
        total[k] = 0;
        for (size_t i = 0; i < hx->counts[k]; i++) total[k] += hx->lists[k][i].n;
    }
    uint64_t pos = p->run_lo, hi = p->run_hi;
    while (pos < hi) {
        size_t idx[FERRY_MAX_DIMS];
        for (int k = 0; k < nd; k++) idx[k] = (size_t)(pos / blk[k + 1] % hx->counts[k]);
        int j = nd - 1;
        while (j > 0 && pos % blk[j] == 0 && pos + blk[j] <= hi) j--;
        /* here blk[j + 1] divides pos and fits: take m steps of dimension j */
        uint64_t m = (hi - pos) / blk[j + 1];
        if (m > hx->counts[j] - idx[j]) m = hx->counts[j] - idx[j];
        ferry_place pl;
        memset(&pl, 0, sizeof pl);
        pl.ndim = nd;
        pl.itemsize = l->itemsize;
        uint64_t dst_off = 0;
        for (int k = 0; k < nd; k++) {
            const ferry_slice *sk = &p->sel[k];
            uint64_t first, count = 0;
            if (k < j) {
                first = hx->lists[k][idx[k]].first;
                count = hx->lists[k][idx[k]].n;
            } else if (k == j) {
                first = hx->lists[k][idx[k]].first;
                for (uint64_t i = 0; i < m; i++) count += hx->lists[k][idx[k] + i].n;
            } else {
                first = hx->lists[k][0].first;
                count = total[k];
            }
            pl.count[k] = count;
            pl.dst_stride[k] = p->dstr[k];
            dst_off += (first - (uint64_t)sk->start) / (uint64_t)sk->step * (uint64_t)p->dstr[k];
        }
        int rc = add_fill(p, &pl, dst_off, hx);
        if (rc < 0) return rc;
        pos += m * blk[j + 1];
    }
    return 0;
}

static int emit(plan_state *p, const dim_hit *const *h, const uint64_t *idx, const ferry_chunk *c,
                const hit_iter *hx) {
    const ferry_layout *l = p->l;
    ferry_place pl;
    memset(&pl, 0, sizeof pl);
    pl.ndim = l->ndim;
    pl.itemsize = l->itemsize;
    uint64_t dst_off = 0, src_off = 0, span = l->itemsize;
    for (int k = 0; k < l->ndim; k++) {
        const ferry_slice *s = &p->sel[k];
        uint64_t origin = idx[k] * l->chunks[k];
        pl.count[k] = h[k]->n;
        pl.dst_stride[k] = p->dstr[k];
        pl.src_stride[k] = h[k]->n > 1 ? p->cstr[k] * s->step : p->cstr[k];   /* cstr*step < cbytes when n > 1 */
        dst_off += (h[k]->first - (uint64_t)s->start) / (uint64_t)s->step * (uint64_t)p->dstr[k];
        src_off += (h[k]->first - origin) * (uint64_t)p->cstr[k];
        span += (h[k]->n - 1) * (uint64_t)pl.src_stride[k];
    }
    if (l->ndim == 0) {   /* a scalar: a one-element box */
        pl.ndim = 1; pl.count[0] = 1; pl.dst_stride[0] = pl.src_stride[0] = l->itemsize;
    }
    if (c->length == FERRY_CHUNK_ABSENT) return add_fill(p, &pl, dst_off, hx);
    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.dst = p->dst;
    e.dst_offset = dst_off;
    e.label = l->label;
    e.place = &pl;
    const char *path = c->path ? c->path : l->path;
    if (!path) return ferry_seterr(FERRY_EINVAL, "layout: variable \"%s\": a chunk with no file", lname(l));
    /* the chain for this chunk: the layout's less what its mask skips */
    int raw = 1;
    for (int i = 0; i < l->ncodecs; i++) {
        if (c->skip >> i & 1) continue;
        if (e.ncodecs >= FERRY_MAX_CODECS)
            return ferry_seterr(FERRY_EUNSUPPORTED, "%s: variable \"%s\": too many codecs", lfile(l), lname(l));
        e.codecs[e.ncodecs++] = l->codecs[i];
        if (l->codecs[i].id != FERRY_CODEC_BYTESWAP) raw = 0;
    }
    if (p->native) {
        if (e.ncodecs >= FERRY_MAX_CODECS)
            return ferry_seterr(FERRY_EUNSUPPORTED, "%s: variable \"%s\": too many codecs", lfile(l), lname(l));
        e.codecs[e.ncodecs++] = (ferry_codec){FERRY_CODEC_BYTESWAP, l->swap};
    }
    e.kind = FERRY_EXTENT_READ;
    e.path = path;
    if (l->root) {   /* a store's file: no symlink leads the read out of it */
        e.flags |= FERRY_EXTENT_NOFOLLOW;
        e.root = l->root;
    }
    if (c->length == FERRY_CHUNK_UNSIZED) {
        if (!raw || l->itemsize > 16)
            return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": a chunk of unknown size needs an uncompressed "
                                "chain and elements of at most 16 bytes", path, lname(l));
    } else if (!c->path && l->file_size &&
               (c->offset > l->file_size || c->length > l->file_size - c->offset)) {
        uint64_t lin = 0;
        for (int k = 0; k < l->ndim; k++) lin = lin * ((l->shape[k] + l->chunks[k] - 1) / l->chunks[k]) + idx[k];
        return ferry_seterr(FERRY_EFORMAT, "%s: variable \"%s\": chunk %llu (offset %llu, %llu bytes) lies outside "
                            "the %llu-byte file", path, lname(l), (unsigned long long)lin,
                            (unsigned long long)c->offset, (unsigned long long)c->length,
                            (unsigned long long)l->file_size);
    }
    if (raw) {
        /* stored as is: read only the span the selection covers */
        /* an uncompressed chunk is exactly a chunk's bytes, as zarr-python
         * requires (it reshapes them): a longer one read from its start would
         * place bytes that are not this chunk's. A chunk file not looked at
         * is checked when the engine opens it (file_size). */
        if (c->length == FERRY_CHUNK_UNSIZED) {
            e.flags |= FERRY_EXTENT_MISSING_FILLS;
            e.file_size = p->cbytes;
            memcpy(e.fill, p->fill, l->itemsize);
        } else if (c->length != p->cbytes)
            return ferry_seterr(FERRY_EFORMAT, "%s: variable \"%s\": chunk holds %llu bytes, an uncompressed chunk is "
                                "exactly %llu", path, lname(l), (unsigned long long)c->length,
                                (unsigned long long)p->cbytes);
        if (ferry_add_overflow(c->offset, src_off, &e.offset))
            return ferry_seterr(FERRY_EFORMAT, "%s: variable \"%s\": chunk offset %llu overflows", path, lname(l),
                                (unsigned long long)c->offset);
        e.length = span;
        e.decoded_size = span;
        pl.src_offset = 0;
        /* a box contiguous in the chunk and in dst needs no placement (and
         * then goes straight to dst), unless absence must fill it */
        if (!(e.flags & FERRY_EXTENT_MISSING_FILLS)) {
            int contiguous = 1;
            uint64_t es = l->itemsize, ed = l->itemsize;
            for (int k = l->ndim - 1; k >= 0 && contiguous; k--) {
                if (pl.count[k] > 1 && ((uint64_t)pl.src_stride[k] != es || (uint64_t)pl.dst_stride[k] != ed))
                    contiguous = 0;
                es *= pl.count[k]; ed *= pl.count[k];
            }
            if (contiguous) e.place = NULL;
        }
    } else {
        e.offset = c->offset;
        e.length = c->length;
        e.decoded_size = p->cbytes;
        pl.src_offset = src_off;
        /* A whole chunk whose bytes land contiguously in dst needs no
         * placement: the engine then decodes straight into host memory. */
        int whole = src_off == 0 && span == p->cbytes;
        for (int k = 0; k < l->ndim && whole; k++)
            if (pl.count[k] > 1 && pl.src_stride[k] != pl.dst_stride[k]) whole = 0;
        if (whole) e.place = NULL;
    }
    return add_extent(p, &e, hx);
}

static int plan_one(void *arg, const dim_hit *const *h, const hit_iter *hx) {
    plan_state *p = arg;
    if (!h) return flush_run(p, hx);   /* after the last chunk */
    uint64_t idx[FERRY_MAX_DIMS];
    for (int k = 0; k < p->l->ndim; k++) idx[k] = h[k]->chunk;
    ferry_chunk c;
    int rc = find_chunk(p, idx, &c);
    if (rc < 0) return rc;
    if (c.length == FERRY_CHUNK_ABSENT && hx->nd > 0) {   /* joins the run, or starts one */
        uint64_t pos = 0;
        for (int k = 0; k < hx->nd; k++) pos = pos * hx->counts[k] + hx->it[k];
        if (p->run && pos == p->run_hi) { p->run_hi++; return 0; }
        if ((rc = flush_run(p, hx)) < 0) return rc;
        p->run = 1;
        p->run_lo = pos;
        p->run_hi = pos + 1;
        return 0;
    }
    if ((rc = flush_run(p, hx)) < 0) return rc;
    if (c.length == FERRY_CHUNK_PLANNED) return over_bound(p, hx);   /* the lookup planned it (a shard) */
    return emit(p, h, idx, &c, hx);
}

/* One chunk holding the whole array, stored as is (HDF5's contiguous layout):
 * the selection is a strided array in one file, which select.c plans best
 * (merged runs, grouped small ones, never a whole span for a column). */
static int plan_single(plan_state *p, const ferry_chunk *c) {
    const ferry_layout *l = p->l;
    ferry_select_src src;
    memset(&src, 0, sizeof src);
    src.path = c->path ? c->path : l->path;
    src.root = l->root;
    src.label = l->label;
    src.offset = c->offset;
    src.ndim = l->ndim;
    src.itemsize = l->itemsize;
    for (int k = 0; k < l->ndim; k++) { src.shape[k] = l->shape[k]; src.stride[k] = (uint64_t)p->cstr[k]; }
    for (int i = 0; i < l->ncodecs; i++)
        if (!(c->skip >> i & 1)) src.codecs[src.ncodecs++] = l->codecs[i];
    if (p->native) src.codecs[src.ncodecs++] = (ferry_codec){FERRY_CODEC_BYTESWAP, l->swap};
    int64_t rc = ferry_select_plan(&src, p->sel, p->dst, 0, p->plan);
    return rc < 0 ? (int)rc : 0;
}

static int single_raw(const ferry_layout *l, const ferry_chunk *c, const plan_state *p) {
    if (c->length == FERRY_CHUNK_ABSENT || c->length == FERRY_CHUNK_UNSIZED || c->length == FERRY_CHUNK_PLANNED ||
        c->length != p->cbytes)
        return 0;
    if (!(c->path || l->path) || p->fdst) return 0;
    int n = 0;
    for (int i = 0; i < l->ncodecs; i++)
        if (!(c->skip >> i & 1)) {
            if (l->codecs[i].id != FERRY_CODEC_BYTESWAP) return 0;
            n++;
        }
    if (n + (p->native ? 1 : 0) > FERRY_MAX_CODECS) return 0;
    if (!c->path && l->file_size && (c->offset > l->file_size || c->length > l->file_size - c->offset)) return 0;
    return 1;
}

int ferry_layout_plan_box(const ferry_layout *l, const ferry_slice *sel, const uint64_t *lo, const uint64_t *hi,
                          ferry_buf dst, unsigned flags, ferry_plan *plan) {
    plan_state *p = calloc(1, sizeof *p);
    if (!p) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", lfile(l));
    p->l = l; p->sel = sel; p->dst = dst; p->plan = plan;
    p->base = ferry_plan_count(plan);
    p->bound = plan_bound(dst.size);
    int nd = l->ndim;
    /* destination strides: C order of the selection (F order when asked to
     * keep a whole F-order array as stored) */
    int whole = 1;
    uint64_t cnt[FERRY_MAX_DIMS];
    for (int k = 0; k < nd; k++) {
        cnt[k] = ferry_slice_count(sel[k]);
        if (sel[k].start != 0 || (uint64_t)sel[k].stop != l->shape[k] || sel[k].step != 1) whole = 0;
    }
    p->fdst = whole && l->order == FERRY_ORDER_F && (flags & FERRY_STORED_ORDER);
    int64_t s = l->itemsize;
    for (int j = 0; j < nd; j++) {
        int k = p->fdst ? j : nd - 1 - j;
        p->dstr[k] = s;
        s *= (int64_t)cnt[k];
    }
    /* strides inside a decoded chunk */
    s = l->itemsize;
    for (int j = nd - 1; j >= 0; j--) {
        int k = l->order == FERRY_ORDER_PERM ? l->perm[j] : l->order == FERRY_ORDER_F ? nd - 1 - j : j;
        p->cstr[k] = s;
        s *= (int64_t)l->chunks[k];
    }
    p->cbytes = (uint64_t)s;
    /* big-endian data: swap to host order when asked, else keep it (and the
     * fill value) as stored */
    memcpy(p->fill, l->fill, sizeof p->fill);
    if (l->swap > 1) {
        if (flags & FERRY_NATIVE) p->native = 1;
        else
            for (uint32_t o = 0; o + l->swap <= l->itemsize && o + l->swap <= 16; o += l->swap)
                for (uint32_t i = 0; i < l->swap / 2; i++) {
                    uint8_t t = p->fill[o + i]; p->fill[o + i] = p->fill[o + l->swap - 1 - i]; p->fill[o + l->swap - 1 - i] = t;
                }
    }
    int rc = 0;
    if (l->table) {   /* linear grid strides; the grid's size must fit */
        uint64_t g = 1;
        for (int k = nd - 1; k >= 0; k--) {
            p->gstr[k] = g;
            uint64_t n = l->shape[k] ? (l->shape[k] - 1) / l->chunks[k] + 1 : 0;
            if (ferry_mul_overflow(g, n, &g)) {
                rc = ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": the chunk grid is too large for a table",
                                  lfile(l), lname(l));
                break;
            }
        }
    }
    /* probed only where it can apply: a table, or an element-wise chain (a
     * lookup may cost a stat) */
    int single = !lo && !hi;
    for (int i = 0; i < l->ncodecs && single && !l->table; i++)
        if (l->codecs[i].id != FERRY_CODEC_BYTESWAP) single = 0;
    for (int k = 0; k < nd && single; k++) if (l->chunks[k] < l->shape[k]) single = 0;
    if (!rc && single && nd > 0) {
        uint64_t zero[FERRY_MAX_DIMS] = {0};
        ferry_chunk c;
        rc = find_chunk(p, zero, &c);
        if (!rc && single_raw(l, &c, p)) {
            rc = plan_single(p, &c);
            free(p);
            return rc;
        }
        p->cursor = 0;
    }
    if (!rc) rc = for_each_hit(l, sel, lo, hi, plan_one, p);
    free(p);
    return rc;
}

int64_t ferry_plan_layout(const ferry_layout *l, const ferry_slice *sel, ferry_buf dst, unsigned flags,
                          ferry_plan *plan) {
    if (!plan) return ferry_seterr(FERRY_EINVAL, "ferry_plan_layout: NULL plan");
    int rc = ferry_layout_check(l);
    if (rc < 0) return rc;
    ferry_slice norm[FERRY_MAX_DIMS];
    int64_t bytes = ferry_selection_normalize(l->ndim, l->shape, l->itemsize, sel, norm, lfile(l), lname(l));
    if (bytes < 0) return bytes;
    if (dst.size < (uint64_t)bytes)
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": destination holds %llu bytes, selection needs %llu",
                            lfile(l), lname(l), (unsigned long long)dst.size, (unsigned long long)bytes);
    if (bytes == 0) return 0;
    rc = ferry_layout_plan_box(l, norm, NULL, NULL, dst, flags, plan);
    return rc < 0 ? rc : bytes;
}

/* ---- an array stored as is in an open file -------------------------------------- */

int64_t ferry_plan_array(ferry_file *f, uint64_t offset, const ferry_layout *lay, const ferry_slice *sel,
                         ferry_buf dst, unsigned flags, ferry_plan *plan) {
    if (!plan || !f || !lay) return ferry_seterr(FERRY_EINVAL, "ferry_plan_array: NULL argument");
    const char *file = ferry_file_path(f);
    ferry_layout copy = *lay, *l = &copy;   /* chunks do not matter here; errors name the file */
    for (int k = 0; k < FERRY_MAX_DIMS; k++) copy.chunks[k] = 1;
    copy.path = file;
    int rc = ferry_layout_check(l);
    if (rc < 0) return rc;
    if (l->order == FERRY_ORDER_PERM || l->ncodecs || l->table || l->lookup || l->swap)
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": ferry_plan_array reads C- or F-order arrays "
                            "stored as is (no codecs, swap, perm or chunk table)", file, lname(l));
    ferry_select_src src;
    memset(&src, 0, sizeof src);
    src.file = f;
    src.label = l->label;
    src.offset = offset;
    src.exact = (flags & FERRY_EXACT_RUNS) != 0;
    src.ndim = l->ndim;
    src.itemsize = l->itemsize;
    memcpy(src.shape, l->shape, sizeof src.shape);
    int64_t size = ferry_select_contiguous(&src, l->order == FERRY_ORDER_F);
    int64_t fsize = ferry_file_size(f);
    if (fsize < 0) return fsize;
    if (size < 0 || offset > (uint64_t)fsize || (uint64_t)size > (uint64_t)fsize - offset)
        return ferry_seterr(FERRY_EFORMAT, "%s: variable \"%s\": the array's bytes [%llu, +%lld) pass the end of "
                            "the %lld-byte file", file, lname(l), (unsigned long long)offset, (long long)size,
                            (long long)fsize);
    ferry_slice norm[FERRY_MAX_DIMS];
    int64_t bytes = ferry_selection_normalize(l->ndim, l->shape, l->itemsize, sel, norm, file, lname(l));
    if (bytes < 0) return bytes;
    if (dst.size < (uint64_t)bytes)
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": destination holds %llu bytes, selection needs %llu",
                            file, lname(l), (unsigned long long)dst.size, (unsigned long long)bytes);
    if (bytes == 0) return 0;
    return ferry_select_plan(&src, norm, dst, 0, plan);
}

/* ---- tables keyed by chunk origin (h5py's chunk_iter) --------------------------- */

typedef struct keyed { uint64_t index; size_t pos; } keyed;

static int cmp_keyed(const void *x, const void *y) {
    const keyed *a = x, *b = y;
    return a->index < b->index ? -1 : a->index > b->index;
}

int ferry_layout_sort_table(const ferry_layout *l, const uint64_t *origins, ferry_chunk *table, uint64_t *index,
                            size_t n) {
    int rc = ferry_layout_check(l);
    if (rc < 0) return rc;
    if (n && (!origins || !table || !index)) return ferry_seterr(FERRY_EINVAL, "ferry_layout_sort_table: NULL argument");
    int nd = l->ndim;
    uint64_t grid[FERRY_MAX_DIMS], g = 1;
    for (int k = 0; k < nd; k++) {
        grid[k] = l->shape[k] ? (l->shape[k] - 1) / l->chunks[k] + 1 : 0;
        if (ferry_mul_overflow(g, grid[k], &g))
            return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": the chunk grid is too large for a table", lfile(l),
                                lname(l));
    }
    if (n > g) return ferry_seterr(FERRY_EFORMAT, "%s: variable \"%s\": %zu chunk table entries for a grid of %llu "
                                   "chunks", lfile(l), lname(l), n, (unsigned long long)g);
    keyed *kv = malloc((n ? n : 1) * sizeof *kv);
    ferry_chunk *copy = malloc((n ? n : 1) * sizeof *copy);
    if (!kv || !copy) { free(kv); free(copy); return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", lfile(l)); }
    for (size_t i = 0; i < n && !rc; i++) {
        uint64_t lin = 0;
        for (int k = 0; k < nd; k++) {
            uint64_t o = origins[i * (size_t)nd + (size_t)k];
            if (o % l->chunks[k] || o >= l->shape[k]) {
                rc = ferry_seterr(FERRY_EFORMAT, "%s: variable \"%s\": chunk table entry %zu: origin %llu of "
                                  "dimension %d is not on the grid of %llu-element chunks of a %llu-element "
                                  "dimension", lfile(l), lname(l), i, (unsigned long long)o, k,
                                  (unsigned long long)l->chunks[k], (unsigned long long)l->shape[k]);
                break;
            }
            lin = lin * grid[k] + o / l->chunks[k];
        }
        kv[i] = (keyed){lin, i};
    }
    if (!rc) {
        qsort(kv, n, sizeof *kv, cmp_keyed);
        for (size_t i = 1; i < n && !rc; i++)
            if (kv[i].index == kv[i - 1].index)
                rc = ferry_seterr(FERRY_EFORMAT, "%s: variable \"%s\": chunk table entries %zu and %zu are the same "
                                  "chunk", lfile(l), lname(l), kv[i - 1].pos, kv[i].pos);
    }
    if (!rc && n) {
        memcpy(copy, table, n * sizeof *copy);
        for (size_t i = 0; i < n; i++) { table[i] = copy[kv[i].pos]; index[i] = kv[i].index; }
    }
    free(kv);
    free(copy);
    return rc;
}
