/* select.h — turn a selection over an uncompressed, strided array in a file
 * into plan extents. Internal; shared by npy, safetensors and netCDF.
 *
 * The stored array is described by per-dimension byte strides, which covers
 * C order, Fortran order and netCDF record variables (dimension 0 strides by
 * the record size, the rest is C order inside a record). The destination is
 * always a C-order array of the selection's shape.
 *
 * What gets read: the innermost dimensions that are contiguous both in the
 * file and in the destination are merged into one block. Each remaining index
 * combination is one run. Runs that are small and close together are grouped
 * into one extent covering them (a little unused data between them is read)
 * with a ferry_place strided placement; otherwise each run is its own extent.
 * So a whole C-order array is one extent, a row slice is one extent, a column
 * of a small array is one extent with a placement, and a column of a huge
 * array is one small read per row (never gigabytes for kilobytes). */
#ifndef FERRY_FORMATS_SELECT_H
#define FERRY_FORMATS_SELECT_H
#include "common.h"

typedef struct ferry_select_src {
    ferry_file *file;          /* the file, or NULL and ... */
    const char *path;          /* ... a path for the engine to open */
    const char *root;          /* with path: a store's root, reads get FERRY_EXTENT_NOFOLLOW */
    const char *label;         /* variable name for the engine's error messages */
    uint64_t offset;           /* byte offset of element (0, ..., 0) */
    int ndim;
    uint64_t shape[FERRY_MAX_DIMS];
    uint64_t stride[FERRY_MAX_DIMS]; /* bytes between consecutive indices of each dim */
    uint32_t itemsize;
    int exact;                 /* FERRY_EXACT_RUNS: group runs only while the unwanted bytes
                                  read stay within EXACT_SLACK (select.c) */
    int ncodecs;               /* element-wise codecs only (BYTESWAP): decoded size = length */
    ferry_codec codecs[FERRY_MAX_CODECS];
} ferry_select_src;

/* Fill src->stride for a contiguous C-order (fortran = 0) or F-order array of
 * src->shape and src->itemsize. Returns the array's byte size, or -1 on overflow. */
int64_t ferry_select_contiguous(ferry_select_src *src, int fortran);

/* src for variable vi stored contiguously in f from byte offset (C order, or F
 * order when fortran): its name, shape and itemsize; swap > 1 adds a byteswap of
 * swap-byte elements (big-endian data read in host order). Returns as
 * ferry_select_contiguous. */
int64_t ferry_select_src_init(ferry_select_src *src, ferry_file *f, const ferry_var_info *vi, uint64_t offset,
                              int fortran, uint32_t swap);

/* Append extents reading sel (src->ndim slices, already validated: 0 <= start
 * <= stop <= shape, step >= 1) into dst at dst_offset, C order. Returns bytes
 * placed, or a negative code (FERRY_ENOMEM, FERRY_EINVAL on overflow). */
int64_t ferry_select_plan(const ferry_select_src *src, const ferry_slice *sel,
                          ferry_buf dst, uint64_t dst_offset, ferry_plan *plan);

/* Number of indices a slice selects. */
static inline uint64_t ferry_slice_count(ferry_slice s) {
    return s.stop <= s.start ? 0 : (uint64_t)(s.stop - s.start - 1) / (uint64_t)s.step + 1;
}
#endif
