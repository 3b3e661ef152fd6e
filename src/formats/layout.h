/* layout.h — the chunked-array planner (ferry_plan_layout) as the formats
 * use it. Internal; a leaf: it needs only common.h.
 *
 * ferry_plan_layout (ferry.h) normalises the selection and plans every chunk
 * of the array. A format with more structure calls the pieces below: Zarr's
 * sharded arrays visit the shards a selection touches (ferry_layout_visit,
 * with the shard grid as the layout), read each shard's index, then plan the
 * inner chunks of that shard only (ferry_layout_plan_box). */
#ifndef FERRY_FORMATS_LAYOUT_H
#define FERRY_FORMATS_LAYOUT_H
#include "common.h"

/* Normalise sel (ndim slices, NULL: everything) against shape as
 * ferry_dataset_plan_read documents: a stop before the start selects nothing;
 * a negative start/stop, a start or stop past the end or a step < 1 is
 * FERRY_EINVAL ("<file>: variable "<name>": dimension k:
 * selection a:b:c outside 0..n"). Writes out[ndim]; returns the selection's
 * bytes (element count × itemsize), or a negative code. */
int64_t ferry_selection_normalize(int ndim, const uint64_t *shape, uint32_t itemsize, const ferry_slice *sel,
                                  ferry_slice *out, const char *file, const char *name);

/* Check a layout describes a plannable array (dims, itemsize, chunk shape,
 * codecs, order, swap); FERRY_EINVAL naming what is wrong. */
int ferry_layout_check(const ferry_layout *l);

/* Call fn(arg, idx) for every chunk-grid index (C order) that the normalised
 * selection sel touches; stops at the first negative return and returns it. */
typedef int (*ferry_grid_fn)(void *arg, const uint64_t *idx);
int ferry_layout_visit(const ferry_layout *l, const ferry_slice *sel, ferry_grid_fn fn, void *arg);

/* A lookup's ferry_chunk.length saying it planned the chunk itself (Zarr: a
 * shard, through its index): the planner adds nothing for it. */
#define FERRY_CHUNK_PLANNED (UINT64_MAX - 2)

/* Plan the part of the normalised selection sel that lies in the box
 * [lo, hi) of the array (chunk-aligned: lo a multiple of the chunk shape;
 * hi may pass the shape; NULL: the whole array). dst is the C-order array of
 * the WHOLE selection. The layout is not checked (ferry_layout_check). A run
 * of absent chunks becomes a few fills, and the records one call may add are
 * bounded (layout.c: plan_bound). Returns 0 or a negative code. */
int ferry_layout_plan_box(const ferry_layout *l, const ferry_slice *sel, const uint64_t *lo, const uint64_t *hi,
                          ferry_buf dst, unsigned flags, ferry_plan *plan);

/* Tests only: the floor of the records bound (layout.c: plan_bound; 0: the
 * default, 2^20), so that a test need not build a plan of a million records. */
void ferry_layout_set_records_floor_(uint64_t floor);

#endif
