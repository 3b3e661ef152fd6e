/* select.c — selection over a strided array in a file → plan extents.
 * See select.h for what is read and why. */
#include "formats/select.h"

/* Grouping runs into one placed extent pays when the reads saved cost more
 * than the unused bytes read: always for spans up to PLACE_SMALL, and for
 * spans up to PLACE_MAX when at least a quarter of the bytes are wanted.
 * Runs of PLACE_BIG bytes or more are read on their own (no waste). */
#define PLACE_SMALL ((uint64_t)64 << 10)
#define PLACE_MAX ((uint64_t)16 << 20)
#define PLACE_BIG ((uint64_t)256 << 10)

int64_t ferry_select_contiguous(ferry_select_src *src, int fortran) {
    uint64_t s = src->itemsize;
    for (int j = 0; j < src->ndim; j++) {
        int k = fortran ? j : src->ndim - 1 - j;
        src->stride[k] = s;
        if (ferry_mul_overflow(s, src->shape[k], &s)) return -1;
    }
    return s > (uint64_t)INT64_MAX ? -1 : (int64_t)s;
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

    /* dims k+1..n-1 merge into one block contiguous in file and destination */
    uint64_t block = src->itemsize;
    int k = n - 1;
    while (k >= 0 && (count[k] == 1 || eff[k] == block)) { block *= count[k]; k--; }

    /* dims g..k grouped into one placed extent, while it pays */
    int g = k + 1, placed_dims = 0;
    uint64_t span = block, useful = block;
    if (block < PLACE_BIG && block <= UINT32_MAX) {
        while (g > 0) {
            int d = g - 1;
            if (count[d] == 1) { g--; continue; }
            if (src->ncodecs && eff[d] % src->itemsize) break;   /* byteswap needs element alignment */
            uint64_t nspan, t, nuseful;
            if (ferry_mul_overflow(count[d] - 1, eff[d], &t) || ferry_add_overflow(span, t, &nspan)) break;
            nuseful = useful * count[d];
            if (nspan > PLACE_MAX || (nspan > PLACE_SMALL && nspan / 4 > nuseful)) break;
            span = nspan; useful = nuseful; g--; placed_dims++;
        }
    }
    if (!placed_dims) { g = k + 1; span = block; }

    ferry_place pl;
    memset(&pl, 0, sizeof pl);
    if (placed_dims) {
        pl.ndim = k - g + 1;
        pl.itemsize = (uint32_t)block;
        for (int d = g; d <= k; d++) {
            pl.count[d - g] = count[d];
            pl.src_stride[d - g] = (int64_t)eff[d];
            pl.dst_stride[d - g] = (int64_t)dstride[d];
        }
    }

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

    /* odometer over the outer dims 0..g-1 */
    uint64_t idx[FERRY_MAX_DIMS] = {0};
    for (;;) {
        uint64_t off = base, doff = dst_offset;
        for (int d = 0; d < g; d++) { off += idx[d] * eff[d]; doff += idx[d] * dstride[d]; }
        e.offset = off;
        e.dst_offset = doff;
        int rc = ferry_plan_add(plan, &e);
        if (rc < 0) return rc;
        int d = g - 1;
        while (d >= 0 && ++idx[d] == count[d]) idx[d--] = 0;
        if (d < 0) break;
    }
    return (int64_t)total;

overflow:
    return ferry_seterr(FERRY_EINVAL, "%s: selection size overflows", src->label ? src->label : "?");
}
