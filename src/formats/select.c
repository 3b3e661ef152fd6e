/* select.c — selection over a strided array in a file → plan extents.
 * See select.h for what is read and why. */
#include "formats/select.h"

/* Grouping runs into one placed extent pays when the reads saved cost more
 * than the unused bytes read: always for spans up to PLACE_SMALL, and for
 * spans up to PLACE_MAX when at least a quarter of the bytes are wanted.
 * Runs of PLACE_BIG bytes or more are read on their own (no waste).
 * ferry.h documents this rule at ferry_plan_array. */
#define PLACE_SMALL ((uint64_t)64 << 10)
#define PLACE_MAX ((uint64_t)16 << 20)
#define PLACE_BIG ((uint64_t)256 << 10)
/* FERRY_EXACT_RUNS (DCP: many ranks reading one checkpoint, where every byte
 * read is I/O some rank pays for): a group may read at most one page of bytes
 * the selection does not want, which costs no extra I/O on a page-granular
 * device. */
#define EXACT_SLACK ((uint64_t)4096)

int64_t ferry_select_contiguous(ferry_select_src *src, int fortran) {
    uint64_t s = src->itemsize;
    for (int j = 0; j < src->ndim; j++) {
        int k = fortran ? j : src->ndim - 1 - j;
        src->stride[k] = s;
        if (ferry_mul_overflow(s, src->shape[k], &s)) return -1;
    }
    return s > (uint64_t)INT64_MAX ? -1 : (int64_t)s;
}

int64_t ferry_select_src_init(ferry_select_src *src, ferry_file *f, const ferry_var_info *vi, uint64_t offset,
                              int fortran, uint32_t swap) {
    memset(src, 0, sizeof *src);
    src->file = f;
    src->label = vi->name;
    src->offset = offset;
    src->ndim = vi->ndim;
    src->itemsize = vi->itemsize;
    memcpy(src->shape, vi->shape, sizeof src->shape);
    if (swap > 1) {
        src->ncodecs = 1;
        src->codecs[0] = (ferry_codec){FERRY_CODEC_BYTESWAP, swap};
    }
    return ferry_select_contiguous(src, fortran);
}

int64_t ferry_select_plan(const ferry_select_src *src, const ferry_slice *sel,
                          ferry_buf dst, uint64_t dst_offset, ferry_plan *plan) {
    int n = src->ndim;
    if (n < 0 || n > FERRY_MAX_DIMS || !src->itemsize)
        return ferry_seterr(FERRY_EINVAL, "%s: bad selection source", src->label ? src->label : "?");
    uint64_t count[FERRY_MAX_DIMS], eff[FERRY_MAX_DIMS], dstride[FERRY_MAX_DIMS];
    uint64_t base = src->offset, total = src->itemsize;
    for (int k = 0; k < n; k++) {
        count[k] = ferry_slice_count(sel[k]);
        uint64_t t;
        if (ferry_mul_overflow((uint64_t)sel[k].start, src->stride[k], &t) || ferry_add_overflow(base, t, &base) ||
            ferry_mul_overflow(total, count[k], &total))
            goto overflow;
        /* one index: its stride never matters (and step may be huge) */
        eff[k] = 0;
        if (count[k] > 1 && ferry_mul_overflow(src->stride[k], (uint64_t)sel[k].step, &eff[k])) goto overflow;
    }
    if (total == 0) return 0;
    if (total > (uint64_t)INT64_MAX) goto overflow;
    uint64_t s = src->itemsize;
    for (int k = n - 1; k >= 0; k--) { dstride[k] = s; s *= count[k]; }

    /* Dims in the order of their file stride, smallest first (a C-order
     * array: last dim first; Fortran order: first dim first). */
    int order[FERRY_MAX_DIMS];
    for (int k = 0; k < n; k++) order[k] = k;
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && eff[order[b]] < eff[order[b - 1]]; b--) {
            int t = order[b]; order[b] = order[b - 1]; order[b - 1] = t;
        }
    int in_group[FERRY_MAX_DIMS] = {0};

    /* 1. merge: dims contiguous both in the file and in the destination
     *    become one block (single indices merge trivially) */
    uint64_t block = src->itemsize;
    int i = 0;
    while (i < n) {
        int d = order[i];
        if (count[d] != 1 && !(eff[d] == block && dstride[d] == block)) break;
        block *= count[d];
        in_group[d] = 2;        /* inside the block */
        i++;
    }

    /* 2. group: more dims into one placed extent, while it pays */
    int placed_dims = 0;
    uint64_t span = block, useful = block;
    if (block < PLACE_BIG && block <= UINT32_MAX) {
        for (; i < n; i++) {
            int d = order[i];
            if (src->ncodecs && eff[d] % src->itemsize) break;   /* byteswap needs element alignment */
            uint64_t nspan, t;
            if (ferry_mul_overflow(count[d] - 1, eff[d], &t) || ferry_add_overflow(span, t, &nspan)) break;
            uint64_t nuseful = useful * count[d];
            if (nspan > PLACE_MAX || (nspan > PLACE_SMALL && nspan / 4 > nuseful)) break;
            if (src->exact && nspan - nuseful > EXACT_SLACK) break;
            span = nspan; useful = nuseful;
            in_group[d] = 1;
            placed_dims++;
        }
    }

    ferry_place pl;
    memset(&pl, 0, sizeof pl);
    if (placed_dims) {
        pl.itemsize = (uint32_t)block;
        for (int d = 0; d < n; d++)          /* destination order */
            if (in_group[d] == 1) {
                pl.count[pl.ndim] = count[d];
                pl.src_stride[pl.ndim] = (int64_t)eff[d];
                pl.dst_stride[pl.ndim] = (int64_t)dstride[d];
                pl.ndim++;
            }
    }

    /* 3. the rest are iterated, the largest file stride outermost so the
     *    extents come in file order */
    int outer[FERRY_MAX_DIMS], g = 0;
    for (int k = n - 1; k >= 0; k--)
        if (!in_group[order[k]]) outer[g++] = order[k];

    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.kind = FERRY_EXTENT_READ;
    e.file = src->file;
    e.path = src->file ? NULL : src->path;
    e.length = span;
    e.decoded_size = span;
    e.ncodecs = src->ncodecs;
    memcpy(e.codecs, src->codecs, sizeof e.codecs);
    e.dst = dst;
    e.place = placed_dims ? &pl : NULL;
    e.label = src->label;
    if (!src->file && src->root) { e.flags = FERRY_EXTENT_NOFOLLOW; e.root = src->root; }

    /* odometer over the outer dims: outer[g-1] (smallest stride) fastest */
    uint64_t idx[FERRY_MAX_DIMS] = {0};
    for (;;) {
        uint64_t off = base, doff = dst_offset;
        for (int j = 0; j < g; j++) { off += idx[j] * eff[outer[j]]; doff += idx[j] * dstride[outer[j]]; }
        e.offset = off;
        e.dst_offset = doff;
        int rc = ferry_plan_add(plan, &e);
        if (rc < 0) return rc;
        int j = g - 1;
        while (j >= 0 && ++idx[j] == count[outer[j]]) idx[j--] = 0;
        if (j < 0) break;
    }
    return (int64_t)total;

overflow:
    return ferry_seterr(FERRY_EINVAL, "%s: selection size overflows", src->label ? src->label : "?");
}
