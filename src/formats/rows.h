/* rows.h — the planners of a training batch: rows of many arrays, and token
 * windows mapped through an epoch order. Internal (the Python extension's
 * Plan.read_rows and plan_windows are thin wrappers of these; the fuzzers
 * reach them here).
 *
 * Each planner checks everything it was given before it adds an extent: a
 * refused call leaves the plan as it was. An index outside its array (a row,
 * a range of positions) is -ERANGE, any other bad argument FERRY_EINVAL (the
 * Python adapter raises IndexError and ValueError for them). */
#ifndef FERRY_FORMATS_ROWS_H
#define FERRY_FORMATS_ROWS_H
#include "common.h"

/* One array whose rows (indices along its first dimension) a batch reads. */
typedef struct ferry_rows_src {
    const ferry_layout *layout;   /* a chunked or contiguous layout, or NULL: ds / var */
    ferry_dataset *ds;
    int var;
    int native;                   /* FERRY_NATIVE: data in host byte order */
    ferry_slice sel[FERRY_MAX_DIMS];   /* every dimension's selection; sel[0] is replaced by each row */
    ferry_buf dst;                /* where its rows go (at the caller's offsets) */
    /* filled by ferry_rows_prepare: */
    int ndim;
    uint64_t rows_of;             /* the first dimension's length */
    uint64_t row_bytes;           /* the bytes one row's selection places */
    const char *name;             /* for messages */
} ferry_rows_src;

/* Fill s's derived fields (ndim, rows_of, row_bytes, name) from its layout or
 * its dataset's variable; FERRY_EINVAL naming it when it has no dimension. */
int ferry_rows_prepare(ferry_rows_src *s);

/* Plan rows[0..nrows) of srcs[0..nsrcs) (each prepared): row r of source k
 * goes to byte dst_offsets[r * nsrcs + k] of that source's dst, in the order
 * row by row, each row's sources in turn (the order a loop of one read a row
 * adds them, so the engine packs a batch as it would those). Every row index
 * and offset is checked before anything is planned. Returns the bytes placed,
 * or a negative code with the message set; *failed (may be NULL) names the
 * source whose planning failed (its dataset's context holds the message). */
int64_t ferry_plan_rows(const ferry_rows_src *srcs, size_t nsrcs, const int64_t *rows, size_t nrows,
                        const int64_t *dst_offsets, ferry_plan *plan, size_t *failed);

/* Rows of a batch over shards: shard k holds rows [starts[k], starts[k + 1])
 * of nrows (the last up to nrows; starts ascending from 0, at most nrows; an
 * empty shard shares its successor's start). A run is a longest stretch of
 * batch positions whose rows follow each other in one shard: run r covers
 * positions [lo[r], lo[r] + len[r]) and rows row[r], row[r] + 1, ... counted
 * inside shard shard[r]. Each output array holds n entries (the most runs n
 * rows make). Returns the number of runs; FERRY_EINVAL for bad starts, -ERANGE
 * for a row outside [0, nrows), with nothing written. Pure: no I/O. */
int64_t ferry_row_runs(const int64_t *starts, size_t nshards, uint64_t nrows, const int64_t *ids, size_t n,
                       int64_t *shard, int64_t *row, int64_t *len, int64_t *lo);

/* Token windows: window w of n (over all files) lies in file k, the last
 * whose starts[k] <= w (starts ascending from 0, at most n), and begins at
 * byte offsets[k] + (w - starts[k]) * stride; it is `length` bytes. */
typedef struct ferry_windows {
    uint64_t n, stride, length;
    size_t nfiles;
    const int64_t *starts, *offsets;
} ferry_windows;

/* Check w and the (lo, hi) position pairs ranges[0..2*nranges): FERRY_EINVAL
 * naming what is wrong, else the number of windows they cover. */
int64_t ferry_windows_check(const ferry_windows *w, const int64_t *ranges, size_t nranges);

/* The windows of the positions in ranges (pair after pair), mapped through
 * `order` (ferry_perm_init(n, ...)): ids[j] the window id, file[j] its file
 * (each array has ferry_windows_check's count). Pure: no I/O. */
int ferry_windows_resolve(const ferry_windows *w, const ferry_perm *order, const int64_t *ranges, size_t nranges,
                          int64_t *ids, int32_t *file);

/* Check that every window of file k fits in f (its current size): FERRY_ESHORT
 * naming the file and the bytes, else 0. */
int ferry_windows_fit(const ferry_windows *w, size_t k, ferry_file *f);

/* Plan window j (ids[j] in files[file[j]], each checked with
 * ferry_windows_fit) into dst at j * length, for j < count; FERRY_EINVAL when
 * dst cannot hold them. Returns count, or a negative code; *failed (may be
 * NULL) the window that failed. */
int64_t ferry_plan_windows(const ferry_windows *w, ferry_file *const *files, const int64_t *ids,
                           const int32_t *file, size_t count, ferry_buf dst, ferry_plan *plan, size_t *failed);
#endif
