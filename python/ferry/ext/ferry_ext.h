/*
 * ferry_ext.h — the one internal header of the CPython extension ferry._ferry
 * (python/ferry/ext/, one .c file per type, like KvikIO's per-type binding
 * files): the object layouts, the type objects and the helpers the files share.
 * Not installed, not part of ferry.h.
 *
 * The contract is docs/python-extension.md. Rules kept throughout:
 *  - the GIL is released around every engine call;
 *  - every failure of the engine raises ferry.FerryError(code, message), the
 *    message being ferry_errmsg of the calling thread (or ferry_strerror);
 *  - memory arguments ("buffers") are objects with __cuda_array_interface__,
 *    the buffer protocol, __array_interface__, or (ptr, nbytes, device) tuples;
 *    a Plan keeps a reference to each one (and to each File and Dataset it
 *    names), and a Job keeps those references until it is waited on or freed;
 *  - ferry.Array owns host (4 KiB-aligned) or device memory and hands it out
 *    through __array_interface__, __cuda_array_interface__ (v3) and DLPack.
 * Nothing here prints.
 *
 * Adding a binding: put it in the file of its type (module-level functions
 * that belong to no type: module.c), declare here only what another file uses,
 * and list module functions in module.c's module_methods.
 */
#ifndef FERRY_EXT_H
#define FERRY_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"

/* Everything declared from here on is internal to the extension: only
 * PyInit__ferry (PyMODINIT_FUNC: default visibility) leaves the module, and the
 * names cannot clash with another extension loaded into the same process. */
#pragma GCC visibility push(hidden)

/* ------------------------------------------------------------------------- */
/* DLPack (https://dmlc.github.io/dlpack/latest/): the structs Array exports and buffer.c reads */
/* ------------------------------------------------------------------------- */
typedef struct { uint32_t major, minor; } DLPackVersion;
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 };
enum {
    kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6,
    kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12
};

/* ------------------------------------------------------------------------- */
/* Objects (each type's functions are in the file named after it)             */
/* ------------------------------------------------------------------------- */
/* context.c */
typedef struct {
    PyObject_HEAD
    ferry_ctx *ctx;
    int closed;
} ContextObject;

/* buffer.c */
/* BufRef: holds a Py_buffer (an export of a buffer-protocol object) for as
 * long as a plan or job may touch the memory. */
typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
} BufRefObject;

typedef struct {
    ferry_buf buf;     /* what the engine gets */
    PyObject *keep;    /* new reference to keep alive (BufRef or the object itself) */
} parsed_buf;

/* array.c */
typedef struct {
    PyObject_HEAD
    ContextObject *ctx;   /* holds the engine alive while device memory lives */
    uintptr_t ptr;
    size_t nbytes;
    int device;           /* -1: host */
    int owns;             /* 1: free on dealloc */
    int pinned;           /* host memory from ferry_pinned_alloc */
    size_t alloc;         /* bytes of a ferry_host_alloc block (owned, host, not pinned) */
    int ndim;
    Py_ssize_t shape[FERRY_MAX_DIMS];
    Py_ssize_t strides[FERRY_MAX_DIMS];
    Py_ssize_t itemsize;
    char typestr[32];
    char format[32];      /* struct-module format, "" when none fits */
    int exports;          /* live buffer-protocol exports */
} ArrayObject;

/* plan.c */
typedef struct {
    PyObject_HEAD
    ferry_plan *plan;
    PyObject *refs;      /* list: objects whose memory/files the extents name */
    int busy;            /* running without the GIL: refuse mutation */
} PlanObject;

/* job.c */
typedef struct {
    PyObject_HEAD
    ContextObject *ctx;
    ferry_job *job;
    PyObject *refs;      /* tuple of kept objects; NULL once the job completed */
    int finished;        /* waited to completion */
    int64_t result;      /* bytes or error code once finished */
    char errmsg[1024];
    ferry_path path;
} JobObject;

/* handle.c: File and Dataset share their layout up to the handle, so one set
 * of lifetime functions serves both */
#define HANDLE_HEAD                                                            \
    PyObject_HEAD                                                              \
    ContextObject *ctx;                                                        \
    PyObject *path;                                                            \
    int users;           /* running jobs whose extents name the handle's files */
typedef struct { HANDLE_HEAD void *h; } HandleObject;
typedef void (*handle_close_fn)(void *h);

/* file.c */
typedef struct { HANDLE_HEAD ferry_file *f; } FileObject;

/* context.c */
PyObject *Context_format_detect(ContextObject *self, PyObject *arg);

/* dataset.c */
typedef struct { HANDLE_HEAD ferry_dataset *ds; } DatasetObject;

extern PyTypeObject ContextType, FileType, DatasetType, PlanType, JobType, ArrayType, BufRefType, ShardsType;

/* ------------------------------------------------------------------------- */
/* Shared helpers, by the file that defines them                             */
/* ------------------------------------------------------------------------- */
/* module.c */
extern PyObject *FerryError;        /* ferry._ferry.FerryError */
/* Raise FerryError(code, message); msg NULL or "": strerror(code). Returns NULL. */
PyObject *raise_code_msg(int code, const char *msg);
/* Raise for a failing engine call on ctx made by this thread. Returns NULL. */
PyObject *raise_ctx(ferry_ctx *ctx, int code);

/* names.c */
int parse_path_name(PyObject *o, ferry_path *out);
int parse_direct_name(PyObject *o, ferry_direct *out);
int parse_decode_name(const char *s, int *out);
int parse_codec_id(PyObject *o, uint32_t *out);
PyObject *mod_dtype_name(PyObject *m, PyObject *args, PyObject *kw);
PyObject *mod_dtype_itemsize(PyObject *m, PyObject *arg);
PyObject *mod_codec_name(PyObject *m, PyObject *arg);
PyObject *mod_size_parse(PyObject *m, PyObject *arg);
PyObject *dtype_table(void);
PyObject *mod_hdf5_filter_codec(PyObject *m, PyObject *args);

/* context.c */
int ctx_check(ContextObject *c);
/* The module's default context, created on first use. Borrowed reference. */
ContextObject *get_default_ctx(void);
/* ctx argument: a Context or None (the default context). Borrowed. */
ContextObject *ctx_arg(PyObject *o);

/* buffer.c */
void BufRef_dealloc(BufRefObject *self);
/* Itemsize of a numpy-style typestr or of ferry's names for types numpy lacks; 0 if unknown. */
Py_ssize_t typestr_itemsize(const char *t);
/* Turn obj into a ferry_buf (want_write: destinations must be writable); on
 * success out->keep holds a new reference that keeps the memory alive. */
int parse_buffer(PyObject *obj, int want_write, parsed_buf *out);
/* buffer_layout(obj): the layout parse_buffer reads (typestr, shape, strides, contiguous,
 * readonly, device, stream, ptr, nbytes, source), for Python's checks of out= */
PyObject *mod_buffer_layout(PyObject *m, PyObject *obj);

/* handle.c */
void handle_dealloc(HandleObject *self, handle_close_fn close_fn);
PyObject *handle_close(HandleObject *self, handle_close_fn close_fn, const char *uses);
PyObject *Handle_enter(PyObject *self, PyObject *noarg);
/* Count (delta +1/-1) the running jobs that use each File and Dataset in refs. */
void refs_users(PyObject *refs, int delta);

/* file.c */
int file_check(FileObject *f);

/* dataset.c */
int ds_check(DatasetObject *d);
/* Index of a variable given by name or index; raises KeyError/IndexError. */
int ds_var_index(DatasetObject *self, PyObject *var);
/* Variable vi's selection `sel` (None: the whole variable, *sp NULL) parsed into
 * slices[FERRY_MAX_DIMS] (*sp = slices); -1 with an exception set. */
int ds_selection(DatasetObject *self, int vi, PyObject *sel, ferry_slice *slices, ferry_slice **sp);
PyObject *mod_npy_read_many(PyObject *m, PyObject *args, PyObject *kw);

/* perm.c */
PyObject *mod_order_take(PyObject *m, PyObject *args);
PyObject *mod_plan_windows(PyObject *m, PyObject *args);
PyObject *mod_row_runs(PyObject *m, PyObject *args);
/* imagexform.c: the image transform after decode */
PyObject *mod_image_transform(PyObject *m, PyObject *args, PyObject *kw);
PyObject *mod_random_resized_crop(PyObject *m, PyObject *args);
PyObject *mod_center_box(PyObject *m, PyObject *args);
PyObject *mod_flip_draw(PyObject *m, PyObject *args);

/* plan.c */
int plan_check(PlanObject *p);
/* Append a reference to keep alive; steals `o`. */
int plan_keep(PlanObject *p, PyObject *o);
/* selection: None, or a sequence of (start, stop[, step]) */
int parse_triples(PyObject *sel, ferry_slice *out, int ndim, const char *name);
int parse_codec_list(PyObject *codecs, ferry_codec *out, int *nout);
/* A contiguous 1-D int64/uint64 array (or, scalar_ok, one int) given for a
 * column of a batched call: read_file_runs' offsets, read_rows' rows. fn and
 * what name the call and the argument in the TypeError. */
typedef struct {
    Py_buffer view;
    int have;          /* view holds a buffer (else scalar) */
    int is_signed;
    unsigned long long scalar;
} u64_column;
int column_parse(PyObject *o, const char *fn, const char *what, int scalar_ok, u64_column *c);
Py_ssize_t column_len(const u64_column *c);
/* Value i; *neg set for a negative signed item. */
unsigned long long column_at(const u64_column *c, Py_ssize_t i, int *neg);
void column_release(u64_column *c);
/* Fill an int64 array of `n` items from a sequence; -1 on error. */
int seq_to_i64(PyObject *seq, const char *what, int64_t *out, int n);

/* layout.c */
/* a tuple/list of at most FERRY_MAX_DIMS non-negative ints; returns the count or -1 */
int seq_to_u64(PyObject *seq, const char *what, uint64_t *out);
PyObject *mod_chunk_table(PyObject *mod, PyObject *args, PyObject *kw);
PyObject *Plan_layout(PlanObject *self, PyObject *args, PyObject *kw);
/* ferry._ferry.layout(): a parsed chunked layout (a capsule) for Plan.read_rows */
PyObject *mod_layout(PyObject *mod, PyObject *args, PyObject *kw);
/* The layout in a capsule made by layout() (and its native flag), or NULL if o is none */
const ferry_layout *layout_of(PyObject *o, int *native);

/* rows.c */
PyObject *Plan_read_rows(PlanObject *self, PyObject *args, PyObject *kw);
PyObject *Plan_read_array(PlanObject *self, PyObject *args, PyObject *kw);

/* selection.c */
PyObject *mod_normalize_selection(PyObject *mod, PyObject *args);

/* images.c (Shards, and the image decoders) */
PyObject *mod_image_probe(PyObject *m, PyObject *args, PyObject *kw);
PyObject *mod_image_decode(PyObject *m, PyObject *args, PyObject *kw);
PyObject *mod_image_decode_batch(PyObject *m, PyObject *args, PyObject *kw);
PyObject *mod_image_batch(PyObject *m, PyObject *args, PyObject *kw);
PyObject *mod_nvjpeg_status(PyObject *m, PyObject *noarg);

/* array.c */
PyObject *mod_empty(PyObject *m, PyObject *args, PyObject *kw);

#endif
