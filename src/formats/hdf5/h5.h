/* h5.h — the HDF5 parser's pieces, shared by the files of src/formats/hdf5/.
 * Internal.
 *
 * The layers, bottom up (HDF5 File Format Specification 3.0 names in quotes):
 *   super.c    the file: cached metadata reads, the "Jenkins lookup3"
 *              checksum, the "Superblock" (versions 0-3)
 *   ohdr.c     "Object Headers" (versions 1 and 2, continuation blocks) as a
 *              list of messages
 *   heap.c     "Fractal Heap" objects and "Version 2 B-trees" (records only)
 *   group.c    group members: "Symbol Table" groups (v1 B-tree + local heap)
 *              and link messages (compact, and dense in a fractal heap)
 *   dtype.c    datatype, dataspace, fill value, filter pipeline and layout
 *              messages; global heap objects
 *   attr.c     attribute messages (compact and dense) to the JSON ferry gives
 *   chunks.c   chunk indexes (v1 B-tree; single chunk, implicit, fixed array,
 *              v2 B-tree) to a ferry_layout chunk table
 *   netcdf4.c  the netCDF-4 conventions: dimensions from dimension scales
 *   strings.c  variable-length strings: stored references through the global heap
 *   hdf5.c     ferry_format_ops: open, close, plan_read
 *
 * Everything read from the file is hostile: every read is bounded by the file
 * size (h5_read), every count by the bytes that hold it, recursion by depth
 * limits, continuation chains and B-tree walks by visited sets. Errors name
 * the file, the byte and the object. Memory is owned by the h5_file: blocks
 * read stay cached (pointers into them live until h5_file_free) and small
 * allocations go to its list (h5_alloc). */
#ifndef FERRY_FORMATS_HDF5_H5_H
#define FERRY_FORMATS_HDF5_H5_H
#include "formats/dataset.h"
#include "formats/json.h"
#include <stdarg.h>

#define H5_UNDEF UINT64_MAX           /* the "undefined address" (all bits set) */
#define H5_MAX_DEPTH 32               /* group nesting, shared/committed type chains */
#define H5_MAX_META ((uint64_t)1 << 30)   /* metadata bytes cached per open file */
#define H5_READ_AHEAD ((uint64_t)8 << 10)  /* a small header read fetches this much: headers,
                                               heaps and B-tree nodes sit close together */
#define H5_MAX_MSGS 65536             /* messages in one object header */
#define H5_MAX_CONT 4096              /* continuation blocks of one object header */
#define H5_MAX_MEMBERS (1u << 24)     /* links in one group */

typedef struct h5_blk h5_blk;

typedef struct h5_file {
    ferry_file *f;
    const char *path;
    uint64_t size;                    /* file size */
    uint64_t base;                    /* absolute offset that addresses count from */
    uint8_t so, sl;                   /* "Size of Offsets", "Size of Lengths" */
    int sb_version;
    int soft_depth;                   /* soft links being resolved (group.c) */
    uint32_t soft_steps;              /* soft links resolved in this file, all told (group.c) */
    uint32_t btree_k_chunk;           /* "Indexed Storage Internal Node K" (32 unless stored) */
    uint64_t root;                    /* root group's object header (relative) */
    uint64_t root_btree, root_heap;   /* superblock v0/1 cached symbol table of the root, or H5_UNDEF */
    h5_blk **tab;                     /* block cache: open addressing on (addr, len) */
    size_t tab_cap, tab_n;
    uint64_t cached;                  /* bytes in the cache */
    struct h5_amemo *amemo;           /* attributes parsed, by object header address (attr.c; the
                                         table is freed with the file by h5_file_free) */
    size_t amemo_cap, amemo_n;
    uint8_t *ra;                      /* read-ahead window: the bytes at [ra_abs, ra_abs + ra_len) */
    uint64_t ra_abs, ra_len;
    void **allocs;                    /* h5_alloc'd pointers */
    size_t nallocs, cap_allocs;
} h5_file;

/* A bounded cursor over bytes read from the file. Reading past the end sets
 * bad (and yields zeros): callers check once after a group of fields. */
typedef struct h5_cur {
    const uint8_t *p, *end;
    uint64_t pos;                     /* absolute file offset of p */
    int bad;
    uint8_t so, sl;
} h5_cur;

static inline h5_cur h5_cur_make(const h5_file *h, const uint8_t *p, uint64_t n, uint64_t pos) {
    h5_cur c = {p, p + n, pos, 0, h->so, h->sl};
    return c;
}
static inline uint64_t h5c_left(const h5_cur *c) { return (uint64_t)(c->end - c->p); }
static inline uint64_t h5c_un(h5_cur *c, unsigned n) {
    if (c->bad || n > h5c_left(c) || n > 8) { c->bad = 1; c->p = c->end; return 0; }
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)c->p[i] << (8 * i);
    c->p += n; c->pos += n;
    return v;
}
static inline uint8_t h5c_u8(h5_cur *c) { return (uint8_t)h5c_un(c, 1); }
static inline uint16_t h5c_u16(h5_cur *c) { return (uint16_t)h5c_un(c, 2); }
static inline uint32_t h5c_u32(h5_cur *c) { return (uint32_t)h5c_un(c, 4); }
static inline uint64_t h5c_u64(h5_cur *c) { return h5c_un(c, 8); }
static inline uint64_t h5c_len(h5_cur *c) { return h5c_un(c, c->sl); }
/* an address (relative to the base), H5_UNDEF for the undefined one */
static inline uint64_t h5c_addr(h5_cur *c) {
    uint64_t v = h5c_un(c, c->so);
    return c->so < 8 && v == ((uint64_t)1 << (8 * c->so)) - 1 ? H5_UNDEF : v;
}
static inline const uint8_t *h5c_bytes(h5_cur *c, uint64_t n) {
    if (c->bad || n > h5c_left(c)) { c->bad = 1; c->p = c->end; return NULL; }
    const uint8_t *p = c->p;
    c->p += n; c->pos += n;
    return p;
}
static inline void h5c_skip(h5_cur *c, uint64_t n) { (void)h5c_bytes(c, n); }

/* ---- super.c ---------------------------------------------------------------- */
/* Format a FERRY_EFORMAT (or code) error: "<file>: byte <pos>: <what>: <msg>". */
int h5_fail(const h5_file *h, int code, uint64_t pos, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Absolute offset of relative address addr with n bytes there inside the
 * file, else FERRY_EFORMAT naming what. */
int h5_abs(const h5_file *h, uint64_t addr, uint64_t n, uint64_t *abs, const char *what);
/* n bytes at relative address addr (cached for the file's life). */
int h5_read(h5_file *h, uint64_t addr, uint64_t n, const uint8_t **out, const char *what);
/* As h5_read, but reads min(n, bytes to the end of the file) into *got. */
int h5_read_upto(h5_file *h, uint64_t addr, uint64_t n, const uint8_t **out, uint64_t *got, const char *what);
void *h5_alloc(h5_file *h, size_t n);        /* zeroed; NULL: out of memory (message set) */
char *h5_strndup(h5_file *h, const char *s, size_t n);
uint32_t h5_lookup3(const uint8_t *k, size_t n);
/* Check the trailing Jenkins checksum of the n bytes at p (the last 4 are the checksum). */
int h5_check_sum(const h5_file *h, const uint8_t *p, uint64_t n, uint64_t pos, const char *what);
int h5_file_open(h5_file *h, ferry_file *f, const char *path);
void h5_file_free(h5_file *h);
/* Free the read-ahead window (h5_read makes a new one when it next needs it). */
void h5_read_ahead_drop(h5_file *h);

/* ---- ohdr.c ----------------------------------------------------------------- */
enum {
    H5M_DATASPACE = 0x1, H5M_LINFO = 0x2, H5M_DTYPE = 0x3, H5M_FILL_OLD = 0x4, H5M_FILL = 0x5,
    H5M_LINK = 0x6, H5M_EFL = 0x7, H5M_LAYOUT = 0x8, H5M_GINFO = 0xA, H5M_FILTERS = 0xB,
    H5M_ATTR = 0xC, H5M_CONT = 0x10, H5M_STAB = 0x11, H5M_AINFO = 0x15,
};
typedef struct h5_msg {
    uint16_t type;
    uint8_t flags;                    /* bit 1: shared */
    uint64_t pos;                     /* absolute offset of its data */
    const uint8_t *data;
    uint64_t len;
} h5_msg;
typedef struct h5_obj {
    uint64_t addr;                    /* relative address of the header */
    const char *name;                 /* for messages: the object's path */
    h5_msg *msgs;
    int nmsgs;
} h5_obj;
int h5_ohdr_read(h5_file *h, uint64_t addr, const char *name, h5_obj *out);
const h5_msg *h5_obj_find(const h5_obj *o, uint16_t type);   /* first message of a type, or NULL */

/* ---- heap.c ----------------------------------------------------------------- */
typedef struct h5_fheap h5_fheap;
int h5_fheap_open(h5_file *h, uint64_t addr, const char *what, h5_fheap **out);
/* The object a heap ID names: *p points to its len bytes (in the cache). */
int h5_fheap_get(h5_file *h, h5_fheap *fh, const uint8_t *id, uint32_t idlen, const uint8_t **p, uint64_t *len);
uint32_t h5_fheap_idlen(const h5_fheap *fh);
/* Call fn for each record of the v2 B-tree at addr (type must match). */
typedef int (*h5_rec_fn)(void *arg, const uint8_t *rec, uint32_t size, uint64_t pos);
int h5_btree2_walk(h5_file *h, uint64_t addr, int type, const char *what, h5_rec_fn fn, void *arg);

/* ---- group.c ---------------------------------------------------------------- */
/* Version-1 B-tree of type (0 groups, 1 chunks) with keys of key_size bytes:
 * fn for each leaf child with its left key, in order; levels must descend by
 * one, and the node count is bounded by the file size. */
typedef int (*h5_bt1_fn)(void *arg, const uint8_t *key, uint64_t child, uint64_t pos);
int h5_btree1_walk(h5_file *h, uint64_t addr, int type, uint64_t key_size, const char *what, h5_bt1_fn fn, void *arg);
typedef struct h5_link {
    const char *name;
    uint64_t addr;                    /* the object's header (soft links resolved) */
    const char *soft;                 /* a soft link's target path, else NULL */
} h5_link;
/* The links of the group whose header is o (creation order, else name
 * order), soft links resolved; an external link is FERRY_EUNSUPPORTED naming
 * it and its file, a dangling soft link FERRY_EFORMAT. */
int h5_group_links(h5_file *h, const h5_obj *o, h5_link **out, size_t *n);
int h5_is_group(const h5_obj *o);

/* ---- dtype.c ---------------------------------------------------------------- */
typedef enum h5_class {
    H5T_INT = 0, H5T_FLOAT = 1, H5T_TIME = 2, H5T_STRING = 3, H5T_BITFIELD = 4, H5T_OPAQUE = 5,
    H5T_COMPOUND = 6, H5T_REFERENCE = 7, H5T_ENUM = 8, H5T_VLEN = 9, H5T_ARRAY = 10,
} h5_class;
typedef struct h5_type {
    h5_class cls;
    uint32_t size;
    int big_endian, is_signed;
    int vlen_string;                  /* VLEN: 1 string, 0 sequence */
    int is_complex;                   /* COMPOUND of two floats: complex (swapped by halves) */
    struct h5_type *base;             /* ENUM and VLEN: the base type */
    uint32_t nmembers;                /* ENUM */
    const char **names;               /* ENUM member names */
    const uint8_t *values;            /* ENUM values: nmembers × base->size */
    ferry_dtype dt;                   /* FERRY_DT_UNKNOWN when ferry has none */
    char typestr[24];                 /* "<f4", ">i2", "|S8", ... */
} h5_type;
int h5_dtype_parse(h5_file *h, h5_cur *c, const char *what, int depth, h5_type *t);
int h5_dtype_shared(h5_file *h, const uint8_t *d, uint64_t len, uint64_t pos, const char *what, h5_type *t);
/* The object's datatype, following a shared (committed) one. */
int h5_obj_dtype(h5_file *h, const h5_obj *o, h5_type *t);
typedef struct h5_space {
    int ndim;                         /* -1: null dataspace (no elements) */
    uint64_t dims[FERRY_MAX_DIMS], maxdims[FERRY_MAX_DIMS];
    uint64_t npoints;
} h5_space;
int h5_space_parse(const h5_file *h, h5_cur *c, const char *what, h5_space *s);
typedef struct h5_filters {
    int n;
    struct { uint16_t id, flags; uint32_t ncd; uint32_t cd[8]; const char *name; } f[FERRY_MAX_CODECS];
} h5_filters;
int h5_filters_parse(h5_file *h, const h5_msg *m, const char *what, h5_filters *out);
typedef struct h5_layout {
    int cls;                          /* 0 compact, 1 contiguous, 2 chunked */
    int version;
    uint64_t addr, size;              /* contiguous: relative address, bytes; compact: absolute pos, bytes */
    int ndim;                         /* chunked: dataset rank */
    uint64_t chunk[FERRY_MAX_DIMS];
    int index;                        /* v4 chunk index type (1..5); 0: v1 B-tree */
    uint64_t index_addr;
    uint8_t flags;                    /* v4 chunked flags */
    uint64_t single_size;             /* v4 single filtered chunk */
    uint32_t single_mask;
    uint8_t fa_page_bits;             /* fixed array */
    uint8_t ea[5];                    /* extensible array parameters */
    uint32_t bt2_node;                /* v2 B-tree node size */
} h5_layout;
int h5_layout_parse(const h5_file *h, const h5_msg *m, const char *what, int rank, h5_layout *out);
/* Fill value of the object (its type's byte order), *n 0 when undefined. */
int h5_obj_fill(h5_file *h, const h5_obj *o, uint32_t size, const uint8_t **p, uint64_t *n);
/* A global heap object (vlen data): addr + index, its bytes and length. */
int h5_gheap_get(h5_file *h, uint64_t addr, uint32_t index, const char *what, const uint8_t **p, uint64_t *n);

/* ---- attr.c ----------------------------------------------------------------- */
typedef struct h5_attr {
    const char *name;
    h5_type type;
    h5_space space;
    const uint8_t *data;              /* raw values */
    uint64_t len;
    uint64_t pos;                     /* absolute offset of the message */
} h5_attr;
/* Every attribute of the object (compact and dense), in creation order where known. */
int h5_obj_attrs(h5_file *h, const h5_obj *o, h5_attr **out, size_t *n);
/* Append attribute a's value as JSON ({"type","value"} for numbers, strings as strings). */
int h5_attr_json(h5_file *h, const h5_attr *a, ferry_sbuf *b);
/* a as a string (fixed or vlen, one element), or NULL. */
const char *h5_attr_string(h5_file *h, const h5_attr *a);

/* ---- chunks.c --------------------------------------------------------------- */
typedef struct h5_chunks {
    ferry_chunk *table;
    uint64_t *index;
    size_t n;
} h5_chunks;
/* The chunk table of a chunked dataset of extent dims[ndim] (sorted, for a
 * ferry_layout of the given shape, each >= dims: netCDF-4 pads variables to
 * their unlimited dimensions' lengths). nfilters: pipeline length (filter
 * masks are renumbered). */
int h5_chunks_read(h5_file *h, const h5_layout *lay, int ndim, const uint64_t *dims, const uint64_t *maxdims,
                   const uint64_t *shape, int nfilters, uint32_t itemsize, const char *what, h5_chunks *out);

/* ---- strings.c -------------------------------------------------------------- */
/* The count references (refsize bytes each, as a variable-length string
 * dataset stores them) of variable `what` (header at absolute pos, for
 * messages) as strings: the global heap collections they name read from f by
 * plans on ctx. out is the caller's to free, also after an error. */
int h5_strings_resolve(h5_file *h, ferry_ctx *ctx, ferry_file *f, const uint8_t *refs, uint64_t count,
                       uint32_t refsize, const char *what, uint64_t pos, const ferry_run_opts *opts, ferry_strings *out);

/* ---- netcdf4.c -------------------------------------------------------------- */
typedef struct h5_nc h5_nc;
h5_nc *h5nc_new(h5_file *h);
void h5nc_free(h5_nc *nc);
int h5nc_is_scale(h5_file *h, const h5_attr *a, size_t n);
/* Record o (link name, dataspace, attributes) when it is a dimension scale;
 * *is_var 0 for a dimension without a variable. local: in the opened group. */
int h5nc_add_scale(h5_file *h, h5_nc *nc, const h5_obj *o, const char *name, const h5_space *sp, const h5_attr *a,
                   size_t n, int local, int *is_var);
/* JSON array of o's dimension names (allocated in h). */
int h5nc_var_dims(h5_file *h, h5_nc *nc, const h5_obj *o, const char *name, const h5_space *sp, const h5_attr *a,
                  size_t n, char **dims_json);
int h5nc_hidden(const char *attr_name, int is_scale);
void h5nc_pad(h5_nc *nc, const char *dims_json, int ndim, uint64_t *shape);
/* {"name": {"size": n, "unlimited": bool}} of the group's and the used dimensions (malloc'd). */
int h5nc_dims_json(h5_file *h, h5_nc *nc, char **out);
#endif
