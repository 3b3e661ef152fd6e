/* rows.c — the planners of a training batch (rows.h says what each takes).
 *
 * XarrayDataset plans a read group of 120 samples of 20 variables as 2,400
 * reads of one time step each; TokenDataset a batch as windows of tokens at
 * positions of an epoch order. One C call a group: made one Python call a
 * read, the planning cost the loader's thread more CPU than the buffers and
 * the submit (BENCHMARKS.md, X3), and the engine idled for it. */
#include "formats/rows.h"
#include <errno.h>
#include <stdlib.h>

int ferry_rows_prepare(ferry_rows_src *s) {
    uint64_t shape[FERRY_MAX_DIMS] = {0}, itemsize = 1;
    if (s->layout) {
        s->ndim = s->layout->ndim;
        memcpy(shape, s->layout->shape, sizeof shape);
        itemsize = s->layout->itemsize;
        s->name = s->layout->label ? s->layout->label : "array";
    } else {
        ferry_var_info info;
        memset(&info, 0, sizeof info);
        int rc = ferry_dataset_var(s->ds, s->var, &info);
        if (rc < 0) return rc;
        s->ndim = info.ndim;
        memcpy(shape, info.shape, sizeof shape);
        itemsize = info.itemsize;
        s->name = info.name;
    }
    if (s->ndim < 1) return ferry_seterr(FERRY_EINVAL, "read_rows: %s has no dimension to take rows of", s->name);
    s->rows_of = shape[0];
    /* a row's bytes: one index of the first dimension, the selection of the
     * others clipped to the shape as the planners clip it (a negative start or
     * a step < 1 they refuse, naming the array) */
    s->row_bytes = itemsize;
    for (int d = 1; d < s->ndim; d++) {
        ferry_slice x = s->sel[d];
        int64_t stop = x.stop > (int64_t)shape[d] ? (int64_t)shape[d] : x.stop;
        uint64_t n = x.start >= 0 && x.step >= 1 && stop > x.start ? (uint64_t)((stop - x.start + x.step - 1) / x.step) : 0;
        if (ferry_mul_overflow(s->row_bytes, n, &s->row_bytes))
            return ferry_seterr(FERRY_EINVAL, "read_rows: a row of %s overflows 2^64 bytes", s->name);
    }
    return 0;
}

int64_t ferry_plan_rows(const ferry_rows_src *srcs, size_t nsrcs, const int64_t *rows, size_t nrows,
                        const int64_t *dst_offsets, ferry_plan *plan, size_t *failed) {
    if (!plan || (nsrcs && !srcs) || (nrows && (!rows || (nsrcs && !dst_offsets))))
        return ferry_seterr(FERRY_EINVAL, "read_rows: NULL argument");
    /* every row and offset checked before any is planned: a refused call adds nothing */
    for (size_t r = 0; r < nrows; r++)
        for (size_t k = 0; k < nsrcs; k++) {
            const ferry_rows_src *s = &srcs[k];
            int64_t t = rows[r], o = dst_offsets[r * nsrcs + k];
            if (t < 0 || (uint64_t)t >= s->rows_of)
                return ferry_seterr(-ERANGE, "read_rows: row %zu: index %lld outside the %llu of %s", r,
                                    (long long)t, (unsigned long long)s->rows_of, s->name);
            if (o < 0 || (uint64_t)o > s->dst.size || s->row_bytes > s->dst.size - (uint64_t)o)
                return ferry_seterr(FERRY_EINVAL, "read_rows: row %zu of %s: %llu bytes at dst offset %lld do not "
                                    "fit its destination (%zu bytes)", r, s->name,
                                    (unsigned long long)s->row_bytes, (long long)o, s->dst.size);
        }
    int64_t total = 0;
    for (size_t r = 0; r < nrows; r++)
        for (size_t k = 0; k < nsrcs; k++) {
            const ferry_rows_src *x = &srcs[k];
            ferry_slice sel[FERRY_MAX_DIMS];
            memcpy(sel, x->sel, sizeof sel);
            sel[0] = (ferry_slice){rows[r], rows[r] + 1, 1};
            ferry_buf sub = x->dst;
            sub.ptr = (char *)sub.ptr + dst_offsets[r * nsrcs + k];
            sub.size = (size_t)x->row_bytes;
            unsigned flags = x->native ? FERRY_NATIVE : 0;
            int64_t rc = x->layout ? ferry_plan_layout(x->layout, sel, sub, flags, plan)
                                   : ferry_dataset_plan_read(x->ds, x->var, sel, sub, flags, plan);
            if (rc < 0) {   /* the extents planned before it stay in the plan, as with one call a row */
                if (failed) *failed = k;
                return rc;
            }
            total += rc;
        }
    return total;
}

/* The last shard whose start is <= id (an empty shard shares its successor's
 * start, so the search passes over it); starts ascending from starts[0] = 0. */
static size_t shard_of(const int64_t *starts, size_t n, int64_t id) {
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (starts[mid] <= id) lo = mid;
        else hi = mid;
    }
    return lo;
}

int64_t ferry_windows_check(const ferry_windows *w, const int64_t *ranges, size_t nranges) {
    if (!w || !w->nfiles || !w->starts || !w->offsets || (nranges && !ranges))
        return ferry_seterr(FERRY_EINVAL, "plan_windows: no files or NULL arrays");
    if (w->n > (uint64_t)INT64_MAX) return ferry_seterr(FERRY_EINVAL, "plan_windows: n must be below 2**63");
    if (w->length == 0 || w->length > (1ull << 40) || w->stride > (1ull << 40))
        return ferry_seterr(FERRY_EINVAL, "plan_windows: length %llu / stride %llu (1..2^40, 0..2^40)",
                            (unsigned long long)w->length, (unsigned long long)w->stride);
    if (w->nfiles > INT32_MAX) return ferry_seterr(FERRY_EINVAL, "plan_windows: more than 2**31 files");
    for (size_t k = 0; k < w->nfiles; k++) {
        int64_t s = w->starts[k], o = w->offsets[k];
        if (o < 0 || s < 0 || (uint64_t)s > w->n || (k == 0 && s != 0) || (k > 0 && s < w->starts[k - 1]))
            return ferry_seterr(FERRY_EINVAL, "plan_windows: file %zu: start %lld, offset %lld (starts ascending "
                                "from 0 up to n = %llu, offsets >= 0)", k, (long long)s, (long long)o,
                                (unsigned long long)w->n);
    }
    uint64_t total = 0;
    for (size_t r = 0; r < nranges; r++) {
        int64_t lo = ranges[2 * r], hi = ranges[2 * r + 1];
        if (lo < 0 || lo > hi || (uint64_t)hi > w->n)
            return ferry_seterr(-ERANGE, "plan_windows: range %zu is [%lld, %lld), outside [0, %llu)", r,
                                (long long)lo, (long long)hi, (unsigned long long)w->n);
        total += (uint64_t)(hi - lo);   /* each at most n < 2^63: no pair overflows, and the sum is bounded below */
        if (total > (uint64_t)INT64_MAX) return ferry_seterr(FERRY_EINVAL, "plan_windows: 2^63 windows or more");
    }
    return (int64_t)total;
}

int ferry_windows_resolve(const ferry_windows *w, const ferry_perm *order, const int64_t *ranges, size_t nranges,
                          int64_t *ids, int32_t *file) {
    size_t j = 0;
    for (size_t r = 0; r < nranges; r++)
        for (int64_t p = ranges[2 * r]; p < ranges[2 * r + 1]; p++) ids[j++] = p;
    if (ferry_perm_take(order, ids, j, ids) < 0)   /* in place: each id replaces its position */
        return ferry_seterr(FERRY_EINVAL, "plan_windows: a position outside the order (its n is not the windows')");
    for (size_t i = 0; i < j; i++) file[i] = (int32_t)shard_of(w->starts, w->nfiles, ids[i]);
    return 0;
}

int64_t ferry_row_runs(const int64_t *starts, size_t nshards, uint64_t nrows, const int64_t *ids, size_t n,
                       int64_t *shard, int64_t *row, int64_t *len, int64_t *lo) {
    if (!nshards || !starts || (n && (!ids || !shard || !row || !len || !lo)))
        return ferry_seterr(FERRY_EINVAL, "row_runs: no shards or NULL arrays");
    if (nrows > (uint64_t)INT64_MAX) return ferry_seterr(FERRY_EINVAL, "row_runs: nrows must be below 2**63");
    for (size_t k = 0; k < nshards; k++) {
        int64_t s = starts[k];
        if (s < 0 || (uint64_t)s > nrows || (k == 0 && s != 0) || (k > 0 && s < starts[k - 1]))
            return ferry_seterr(FERRY_EINVAL, "row_runs: shard %zu starts at row %lld (starts ascending from 0 up "
                                "to the %llu rows)", k, (long long)s, (unsigned long long)nrows);
    }
    for (size_t i = 0; i < n; i++)   /* every row checked before any output is written */
        if (ids[i] < 0 || (uint64_t)ids[i] >= nrows)
            return ferry_seterr(-ERANGE, "row_runs: position %zu is row %lld, outside [0, %llu)", i,
                                (long long)ids[i], (unsigned long long)nrows);
    int64_t runs = 0;
    size_t k_prev = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = shard_of(starts, nshards, ids[i]);
        if (runs && k == k_prev && ids[i] == ids[i - 1] + 1) {
            len[runs - 1]++;
            continue;
        }
        shard[runs] = (int64_t)k;
        row[runs] = ids[i] - starts[k];
        len[runs] = 1;
        lo[runs] = (int64_t)i;
        runs++;
        k_prev = k;
    }
    return runs;
}

int ferry_windows_fit(const ferry_windows *w, size_t k, ferry_file *f) {
    uint64_t nwin = (k + 1 < w->nfiles ? (uint64_t)w->starts[k + 1] : w->n) - (uint64_t)w->starts[k];
    int64_t size = ferry_file_size(f);
    if (size < 0) return (int)size;
    if (!nwin) return 0;
    uint64_t span = 0, end = 0;   /* offsets < 2^63 and length <= 2^40: their sum fits */
    int over = ferry_mul_overflow(nwin - 1, w->stride, &span) ||
               ferry_add_overflow(span, (uint64_t)w->offsets[k] + w->length, &end);
    if (over || end > (uint64_t)size) {
        const char *path = ferry_file_path(f);
        return ferry_seterr(FERRY_ESHORT, "plan_windows: %s: %llu windows of %llu bytes every %llu from byte %lld "
                            "end at byte %llu, the file has %lld", path ? path : "?", (unsigned long long)nwin,
                            (unsigned long long)w->length, (unsigned long long)w->stride, (long long)w->offsets[k],
                            (unsigned long long)end, (long long)size);
    }
    return 0;
}

int64_t ferry_plan_windows(const ferry_windows *w, ferry_file *const *files, const int64_t *ids,
                           const int32_t *file, size_t count, ferry_buf dst, ferry_plan *plan, size_t *failed) {
    if (count > dst.size / w->length)
        return ferry_seterr(FERRY_EINVAL, "plan_windows: %zu windows of %llu bytes do not fit the destination "
                            "(%zu bytes)", count, (unsigned long long)w->length, dst.size);
    for (size_t j = 0; j < count; j++) {
        int32_t k = file[j];
        if (k < 0 || (size_t)k >= w->nfiles || ids[j] < w->starts[k] ||
            (uint64_t)ids[j] >= ((size_t)k + 1 < w->nfiles ? (uint64_t)w->starts[k + 1] : w->n)) {
            if (failed) *failed = j;
            return ferry_seterr(FERRY_EINVAL, "plan_windows: window %zu (id %lld) is not in file %d", j,
                                (long long)ids[j], (int)k);
        }
        uint64_t off = (uint64_t)w->offsets[k] + (uint64_t)(ids[j] - w->starts[k]) * w->stride;
        int rc = ferry_plan_read(plan, files[k], off, w->length, dst, j * w->length);
        if (rc < 0) {
            if (failed) *failed = j;
            return rc;
        }
    }
    return (int64_t)count;
}
