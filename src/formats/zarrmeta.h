/* zarrmeta.h — a Zarr v2 array's metadata (.zarray and .zattrs) parsed from
 * documents already in memory, by zarr.c's own parser: for formats that
 * describe a Zarr store without its directory (kerchunk references, refs.c).
 * Internal.
 *
 * The rules are zarr.c's: malformed metadata is an error (message set,
 * naming `file` and the byte of the document); metadata of an array ferry
 * cannot read (an unknown codec, dtype) is no error: the description is
 * filled as far as it goes and `err` says why reads must fail. */
#ifndef FERRY_FORMATS_ZARRMETA_H
#define FERRY_FORMATS_ZARRMETA_H
#include "common.h"
#include "formats/json.h"

typedef struct ferry_zarr_v2 {
    char *typestr;        /* the dtype as written ("<f4"; JSON text of a structured one; "?") */
    char *dims_json;      /* _ARRAY_DIMENSIONS as JSON, or NULL */
    char *attrs_json;     /* .zattrs as JSON, or NULL */
    char *fill_json;      /* fill_value as written */
    char *codecs_desc;    /* filters and compressor, storage order ("shuffle zlib") */
    char *err;            /* non-NULL: reads fail with this message */
    int ndim;
    uint64_t shape[FERRY_MAX_DIMS];
    uint64_t chunk[FERRY_MAX_DIMS];
    uint32_t itemsize;
    uint32_t swap;        /* element size to byteswap for host order, else 0 */
    int fortran;          /* order "F" */
    char sep;             /* chunk key separator, '.' or '/' */
    int ncodecs;          /* decoding order */
    ferry_codec codecs[FERRY_MAX_CODECS];
    uint8_t fill[16];     /* one element, host order */
    int has_fill;         /* fill_value not null */
} ferry_zarr_v2;

/* Parse zarray (and zattrs, which may be NULL) into *out. `file` names the
 * documents in messages ("refs.json: key \"t/.zarray\""). 0, or a negative
 * code with the message set (then *out holds nothing to free). */
int ferry_zarr_v2_parse(const char *file, const ferry_json *zarray, const ferry_json *zattrs, ferry_zarr_v2 *out);
void ferry_zarr_v2_free(ferry_zarr_v2 *m);

#endif
