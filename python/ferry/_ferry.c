/*
 * _ferry.c — the CPython extension: include/ferry.h, one to one, for Python.
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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"

/* ------------------------------------------------------------------------- */
/* DLPack (https://dmlc.github.io/dlpack/latest/): the few structs we export  */
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

enum { kDLCPU = 1, kDLCUDA = 2 };
enum {
    kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6,
    kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12
};

/* ------------------------------------------------------------------------- */
/* Module-wide objects                                                        */
/* ------------------------------------------------------------------------- */
static PyObject *FerryError;        /* ferry._ferry.FerryError */
static PyObject *default_ctx;       /* lazily created Context (default_context()) */

static PyTypeObject ContextType, FileType, DatasetType, PlanType, JobType, ArrayType, BufRefType;

/* Raise FerryError(code, message). msg may be NULL or "": then strerror(code).
 * Messages name files, and a path need not be UTF-8 (os.fsencode'd names):
 * undecodable bytes become \xNN escapes instead of a UnicodeDecodeError. */
static PyObject *raise_code_msg(int code, const char *msg) {
    if (!msg || !*msg) msg = ferry_strerror(code);
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "backslashreplace");
    if (!text) return NULL;
    PyObject *exc = PyObject_CallFunction(FerryError, "iN", code, text);
    if (exc) {
        PyErr_SetObject(FerryError, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* Raise for a failing engine call on ctx made by this thread. */
static PyObject *raise_ctx(ferry_ctx *ctx, int code) {
    const char *m = ctx ? ferry_errmsg(ctx) : "";
    return raise_code_msg(code, m);
}

/* ------------------------------------------------------------------------- */
/* Context                                                                    */
/* ------------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    ferry_ctx *ctx;
    int closed;
} ContextObject;

static int ctx_check(ContextObject *c) {
    if (!c->ctx || c->closed) {
        PyErr_SetString(PyExc_ValueError, "ferry Context is closed");
        return -1;
    }
    return 0;
}

static int parse_path_name(PyObject *o, ferry_path *out) {
    if (o == NULL || o == Py_None) { *out = FERRY_PATH_AUTO; return 0; }
    if (PyLong_Check(o)) {
        long v = PyLong_AsLong(o);
        if (v < 0 || v >= FERRY_PATH_COUNT_) { PyErr_SetString(PyExc_ValueError, "bad path"); return -1; }
        *out = (ferry_path)v;
        return 0;
    }
    const char *s = PyUnicode_AsUTF8(o);
    if (!s) return -1;
    if (ferry_path_parse(s, out) < 0) {
        PyErr_Format(PyExc_ValueError, "unknown path %R (auto, cufile, staged, host)", o);
        return -1;
    }
    return 0;
}

static int parse_direct_name(PyObject *o, ferry_direct *out) {
    if (o == NULL || o == Py_None) { *out = FERRY_DIRECT_AUTO; return 0; }
    if (PyBool_Check(o)) { *out = (o == Py_True) ? FERRY_DIRECT_ON : FERRY_DIRECT_OFF; return 0; }
    const char *s = PyUnicode_AsUTF8(o);
    if (!s) return -1;
    if (ferry_direct_parse(s, out) < 0) {
        PyErr_Format(PyExc_ValueError, "unknown direct policy %R (auto, on, off)", o);
        return -1;
    }
    return 0;
}

static const char *direct_name(ferry_direct d) { return ferry_direct_name(d); }

static int Context_init(ContextObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"threads", "path", "direct", "task_size", "staging_size",
                             "staging_count", "small_io", "no_env", NULL};
    int threads = 0, staging_count = 0, no_env = 0;
    PyObject *path = NULL, *direct = NULL;
    unsigned long long task_size = 0, staging_size = 0, small_io = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iOOKKiKp", kwlist, &threads, &path, &direct,
                                     &task_size, &staging_size, &staging_count, &small_io, &no_env))
        return -1;
    if (self->ctx) { PyErr_SetString(PyExc_RuntimeError, "Context already initialised"); return -1; }
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.threads = threads;
    cfg.task_size = (size_t)task_size;
    cfg.staging_size = (size_t)staging_size;
    cfg.staging_count = staging_count;
    cfg.small_io = (size_t)small_io;
    cfg.no_env = no_env;
    if (parse_path_name(path, &cfg.path) < 0) return -1;
    if (parse_direct_name(direct, &cfg.direct) < 0) return -1;
    ferry_ctx *ctx = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_ctx_create(&ctx, &cfg);
    Py_END_ALLOW_THREADS
    if (rc < 0) { raise_ctx(NULL, rc); return -1; }
    self->ctx = ctx;
    self->closed = 0;
    return 0;
}

static void Context_dealloc(ContextObject *self) {
    if (self->ctx) {
        ferry_ctx *ctx = self->ctx;
        self->ctx = NULL;
        Py_BEGIN_ALLOW_THREADS
        ferry_ctx_destroy(ctx);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Context_close(ContextObject *self, PyObject *noarg) {
    /* Files, datasets, jobs and arrays hold a reference to their Context, so
     * the engine itself is destroyed when the last of them goes; close() makes
     * this object refuse new work. */
    self->closed = 1;
    Py_RETURN_NONE;
}

static PyObject *Context_enter(PyObject *self, PyObject *noarg) { Py_INCREF(self); return self; }
static PyObject *Context_exit(ContextObject *self, PyObject *args) { return Context_close(self, NULL); }

static PyObject *Context_config(ContextObject *self, PyObject *noarg) {
    if (ctx_check(self) < 0) return NULL;
    ferry_config c;
    Py_BEGIN_ALLOW_THREADS
    ferry_ctx_config(self->ctx, &c);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("{s:i,s:K,s:K,s:i,s:s,s:s,s:K,s:O}", "threads", c.threads,
                         "task_size", (unsigned long long)c.task_size,
                         "staging_size", (unsigned long long)c.staging_size,
                         "staging_count", c.staging_count, "path", ferry_path_name(c.path),
                         "direct", direct_name(c.direct), "small_io", (unsigned long long)c.small_io,
                         "no_env", c.no_env ? Py_True : Py_False);
}

static PyObject *path_stats_dict(const ferry_path_stats *p) {
    return Py_BuildValue("{s:K,s:K,s:d}", "bytes", (unsigned long long)p->bytes, "ops",
                         (unsigned long long)p->ops, "seconds", p->seconds);
}

static PyObject *Context_stats(ContextObject *self, PyObject *noarg) {
    if (ctx_check(self) < 0) return NULL;
    ferry_stats s;
    Py_BEGIN_ALLOW_THREADS
    ferry_stats_get(self->ctx, &s);
    Py_END_ALLOW_THREADS
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int p = 1; p < FERRY_PATH_COUNT_; p++) {
        PyObject *v = path_stats_dict(&s.path[p]);
        if (!v || PyDict_SetItemString(d, ferry_path_name((ferry_path)p), v) < 0) {
            Py_XDECREF(v); Py_DECREF(d); return NULL;
        }
        Py_DECREF(v);
    }
#define PUT(name, val)                                                        \
    do {                                                                      \
        PyObject *v_ = PyLong_FromUnsignedLongLong((unsigned long long)(val)); \
        if (!v_ || PyDict_SetItemString(d, name, v_) < 0) {                   \
            Py_XDECREF(v_); Py_DECREF(d); return NULL;                        \
        }                                                                     \
        Py_DECREF(v_);                                                        \
    } while (0)
    PUT("direct_bytes", s.direct_bytes);
    PUT("buffered_bytes", s.buffered_bytes);
    PUT("decoded_bytes", s.decoded_bytes);
    PUT("fallbacks", s.fallbacks);
    PUT("jobs", s.jobs);
    PUT("gpu_decoded_bytes", s.gpu_decoded_bytes);   /* gpudecode.c: nvCOMP's share */
    PUT("gpu_chunks", s.gpu_chunks);
    PUT("gpu_batches", s.gpu_batches);
    PUT("gpu_cpu_fallbacks", s.gpu_cpu_fallbacks);
#undef PUT
    return d;
}

static PyObject *Context_reset_stats(ContextObject *self, PyObject *noarg) {
    if (ctx_check(self) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    ferry_stats_reset(self->ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Context_cuda_device_count(ContextObject *self, PyObject *noarg) {
    if (ctx_check(self) < 0) return NULL;
    int n;
    Py_BEGIN_ALLOW_THREADS
    n = ferry_cuda_device_count(self->ctx);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(n);
}

static PyObject *Context_get_cuda_status(ContextObject *self, void *closure) {
    if (ctx_check(self) < 0) return NULL;
    const char *s;
    Py_BEGIN_ALLOW_THREADS
    s = ferry_cuda_status(self->ctx);
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(s ? s : "");
}

static PyObject *Context_get_cufile_status(ContextObject *self, void *closure) {
    if (ctx_check(self) < 0) return NULL;
    const char *s;
    Py_BEGIN_ALLOW_THREADS
    s = ferry_cufile_status(self->ctx);
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(s ? s : "");
}

static PyObject *Context_get_closed(ContextObject *self, void *closure) {
    return PyBool_FromLong(self->closed || !self->ctx);
}

/* ------------------------------------------------------------------------- */
/* Buffers                                                                    */
/* ------------------------------------------------------------------------- */
/* BufRef: holds a Py_buffer (an export of a buffer-protocol object) for as
 * long as a plan or job may touch the memory. */
typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
} BufRefObject;

static void BufRef_dealloc(BufRefObject *self) {
    if (self->has_view) PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Itemsize of a numpy-style typestr ("<f4", "|S10", "<M8[ns]") or of the
 * names ferry uses for types numpy lacks; 0 if unknown. */
static Py_ssize_t typestr_itemsize(const char *t) {
    if (!t) return 0;
    if (!strcmp(t, "bfloat16")) return 2;
    if (!strcmp(t, "float8_e4m3fn") || !strcmp(t, "float8_e5m2")) return 1;
    if (strlen(t) < 3) return 0;
    if (t[0] != '<' && t[0] != '>' && t[0] != '|' && t[0] != '=') return 0;
    char *end = NULL;
    long n = strtol(t + 2, &end, 10);
    if (end == t + 2 || n <= 0) return 0;
    if (t[1] == 'U') n *= 4;   /* numpy's unicode: UCS-4 code points */
    return (Py_ssize_t)n;
}

typedef struct {
    ferry_buf buf;     /* what the engine gets */
    PyObject *keep;    /* new reference to keep alive (BufRef or the object itself) */
} parsed_buf;

/* Read an int from a sequence item. */
static int seq_item_u64(PyObject *seq, Py_ssize_t i, unsigned long long *out) {
    PyObject *it = PySequence_GetItem(seq, i);
    if (!it) return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(it);
    Py_DECREF(it);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

/* Parse an __array_interface__ / __cuda_array_interface__ dict into a pointer
 * and a byte count; checks C-contiguity (strides None or C strides). */
static int parse_interface(PyObject *d, const char *which, int want_write, uintptr_t *ptr,
                           size_t *nbytes) {
    if (!PyDict_Check(d)) { PyErr_Format(PyExc_TypeError, "%s is not a dict", which); return -1; }
    PyObject *data = PyDict_GetItemString(d, "data");
    PyObject *shape = PyDict_GetItemString(d, "shape");
    PyObject *typestr = PyDict_GetItemString(d, "typestr");
    PyObject *strides = PyDict_GetItemString(d, "strides");
    if (!data || !shape || !typestr) {
        PyErr_Format(PyExc_TypeError, "%s lacks data/shape/typestr", which);
        return -1;
    }
    if (!PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2) {
        PyErr_Format(PyExc_TypeError, "%s: data must be a (ptr, readonly) tuple", which);
        return -1;
    }
    unsigned long long p = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(data, 0));
    if (p == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    int ro = PyObject_IsTrue(PyTuple_GET_ITEM(data, 1));
    if (ro < 0) return -1;
    if (want_write && ro) {
        PyErr_Format(PyExc_ValueError, "destination is read-only (%s)", which);
        return -1;
    }
    const char *ts = PyUnicode_AsUTF8(typestr);
    if (!ts) return -1;
    Py_ssize_t item = typestr_itemsize(ts);
    if (item <= 0) { PyErr_Format(PyExc_TypeError, "%s: unknown typestr %s", which, ts); return -1; }
    Py_ssize_t nd = PySequence_Size(shape);
    if (nd < 0) return -1;
    unsigned long long dims[64];
    if (nd > 64) { PyErr_SetString(PyExc_ValueError, "too many dimensions"); return -1; }
    unsigned long long total = (unsigned long long)item;
    for (Py_ssize_t i = 0; i < nd; i++) {
        if (seq_item_u64(shape, i, &dims[i]) < 0) return -1;
        if (__builtin_mul_overflow(total, dims[i], &total)) {
            PyErr_SetString(PyExc_OverflowError, "array size overflows");
            return -1;
        }
    }
    if (strides && strides != Py_None && total > 0) {
        Py_ssize_t ns = PySequence_Size(strides);
        if (ns != nd) { PyErr_Format(PyExc_ValueError, "%s: strides/shape mismatch", which); return -1; }
        long long expect = (long long)item;
        for (Py_ssize_t i = nd - 1; i >= 0; i--) {
            PyObject *it = PySequence_GetItem(strides, i);
            if (!it) return -1;
            long long s = PyLong_AsLongLong(it);
            Py_DECREF(it);
            if (s == -1 && PyErr_Occurred()) return -1;
            if (dims[i] > 1 && s != expect) {
                PyErr_SetString(PyExc_ValueError, "array must be C-contiguous");
                return -1;
            }
            expect *= (long long)dims[i];
        }
    }
    *ptr = (uintptr_t)p;
    *nbytes = (size_t)total;
    return 0;
}

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

/* Turn obj into a ferry_buf. want_write: destinations must be writable.
 * On success *out holds a new reference in out->keep. */
static int parse_buffer(PyObject *obj, int want_write, parsed_buf *out) {
    out->keep = NULL;
    /* (ptr, nbytes, device) */
    if (PyTuple_Check(obj)) {
        if (PyTuple_GET_SIZE(obj) != 3) {
            PyErr_SetString(PyExc_TypeError, "raw memory must be a (ptr, nbytes, device) tuple");
            return -1;
        }
        unsigned long long p = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(obj, 0));
        if (p == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        unsigned long long n = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(obj, 1));
        if (n == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        long dev = PyLong_AsLong(PyTuple_GET_ITEM(obj, 2));
        if (dev == -1 && PyErr_Occurred()) return -1;
        if (p == 0 && n > 0) { PyErr_SetString(PyExc_ValueError, "NULL pointer"); return -1; }
        out->buf = dev < 0 ? ferry_host_buf((void *)(uintptr_t)p, (size_t)n)
                           : ferry_cuda_buf((int)dev, (uintptr_t)p, (size_t)n);
        Py_INCREF(obj);
        out->keep = obj;
        return 0;
    }
    /* ferry.Array: no need to go through a protocol */
    if (PyObject_TypeCheck(obj, &ArrayType)) {
        ArrayObject *a = (ArrayObject *)obj;
        out->buf = a->device < 0 ? ferry_host_buf((void *)a->ptr, a->nbytes)
                                 : ferry_cuda_buf(a->device, a->ptr, a->nbytes);
        Py_INCREF(obj);
        out->keep = obj;
        return 0;
    }
    /* __cuda_array_interface__: device memory; the engine finds the device */
    PyObject *cai = PyObject_GetAttrString(obj, "__cuda_array_interface__");
    if (cai) {
        uintptr_t p; size_t n;
        int rc = parse_interface(cai, "__cuda_array_interface__", want_write, &p, &n);
        Py_DECREF(cai);
        if (rc < 0) return -1;
        out->buf = ferry_cuda_buf(-1, p, n);
        Py_INCREF(obj);
        out->keep = obj;
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();
    /* buffer protocol: host memory */
    if (PyObject_CheckBuffer(obj)) {
        BufRefObject *r = PyObject_New(BufRefObject, &BufRefType);
        if (!r) return -1;
        r->has_view = 0;
        int flags = PyBUF_C_CONTIGUOUS | (want_write ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(obj, &r->view, flags) < 0) {
            Py_DECREF(r);
            if (want_write && PyErr_ExceptionMatches(PyExc_BufferError)) {
                PyObject *t, *v, *tb;
                PyErr_Fetch(&t, &v, &tb);
                PyErr_Format(PyExc_ValueError,
                             "destination must be writable, C-contiguous memory (%R)", v ? v : Py_None);
                Py_XDECREF(t); Py_XDECREF(v); Py_XDECREF(tb);
            }
            return -1;
        }
        r->has_view = 1;
        out->buf = ferry_host_buf(r->view.buf, (size_t)r->view.len);
        out->keep = (PyObject *)r;
        return 0;
    }
    /* __array_interface__ without the buffer protocol: host memory */
    PyObject *ai = PyObject_GetAttrString(obj, "__array_interface__");
    if (ai) {
        uintptr_t p; size_t n;
        int rc = parse_interface(ai, "__array_interface__", want_write, &p, &n);
        Py_DECREF(ai);
        if (rc < 0) return -1;
        out->buf = ferry_host_buf((void *)p, n);
        Py_INCREF(obj);
        out->keep = obj;
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError,
                 "expected memory: an object with __cuda_array_interface__, the buffer protocol, "
                 "__array_interface__, or a (ptr, nbytes, device) tuple; got %.100s",
                 Py_TYPE(obj)->tp_name);
    return -1;
}

/* ------------------------------------------------------------------------- */
/* Context: run / submit / memory helpers (need Plan and Job, defined below)  */
/* ------------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    ferry_plan *plan;
    PyObject *refs;      /* list: objects whose memory/files the extents name */
    int busy;            /* running without the GIL: refuse mutation */
} PlanObject;

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

/* Files and datasets a running job reads must not be closed under it: count
 * the jobs using each (defined after the File and Dataset types). */
static void refs_users(PyObject *refs, int delta);

/* decode= of run/submit: None, "auto", "gpu" or "cpu" (ferry_decode_policy) */
static int parse_decode_name(const char *s, int *out) {
    ferry_decode_policy d = FERRY_DECODE_AUTO;
    if (s && ferry_decode_policy_parse(s, &d) < 0) {
        PyErr_Format(PyExc_ValueError, "unknown decode %s (auto, gpu, cpu)", s);
        return -1;
    }
    *out = (int)d;
    return 0;
}

static int parse_run_opts(PyObject *path, int threads, int sync, int no_direct, ferry_run_opts *o) {
    memset(o, 0, sizeof *o);
    if (parse_path_name(path, &o->path) < 0) return -1;
    o->threads = threads;
    o->flags = (sync ? FERRY_SYNC : 0) | (no_direct ? FERRY_NO_DIRECT : 0);
    return 0;
}

static PyObject *Context_run(ContextObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"plan", "path", "threads", "sync", "no_direct", "decode", NULL};
    PlanObject *plan;
    PyObject *path = NULL;
    int threads = 0, sync = 0, no_direct = 0;
    const char *decode = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|Oippz", kwlist, &PlanType, &plan, &path,
                                     &threads, &sync, &no_direct, &decode))
        return NULL;
    if (ctx_check(self) < 0) return NULL;
    ferry_run_opts o;
    if (parse_run_opts(path, threads, sync, no_direct, &o) < 0) return NULL;
    if (parse_decode_name(decode, &o.decode) < 0) return NULL;
    int64_t rc;
    plan->busy++;
    refs_users(plan->refs, +1);
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_run(self->ctx, plan->plan, &o);
    Py_END_ALLOW_THREADS
    refs_users(plan->refs, -1);
    plan->busy--;
    if (rc < 0) return raise_ctx(self->ctx, (int)rc);
    return PyLong_FromLongLong(rc);
}

static PyObject *Context_submit(ContextObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"plan", "path", "threads", "sync", "no_direct", "decode", NULL};
    PlanObject *plan;
    PyObject *path = NULL;
    int threads = 0, sync = 0, no_direct = 0;
    const char *decode = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|Oippz", kwlist, &PlanType, &plan, &path,
                                     &threads, &sync, &no_direct, &decode))
        return NULL;
    if (ctx_check(self) < 0) return NULL;
    ferry_run_opts o;
    if (parse_run_opts(path, threads, sync, no_direct, &o) < 0) return NULL;
    if (parse_decode_name(decode, &o.decode) < 0) return NULL;
    JobObject *job = PyObject_New(JobObject, &JobType);
    if (!job) return NULL;
    job->ctx = NULL; job->job = NULL; job->finished = 0; job->result = 0;
    job->errmsg[0] = 0; job->path = FERRY_PATH_AUTO;
    job->refs = PySequence_Tuple(plan->refs);
    if (!job->refs) { Py_DECREF(job); return NULL; }
    Py_INCREF(self);
    job->ctx = self;
    ferry_job *j = NULL;
    int rc;
    plan->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_submit(self->ctx, plan->plan, &o, &j);
    Py_END_ALLOW_THREADS
    plan->busy--;
    if (rc < 0) {
        raise_ctx(self->ctx, rc);
        Py_DECREF(job);
        return NULL;
    }
    job->job = j;
    refs_users(job->refs, +1);   /* released when the job finishes or is freed */
    return (PyObject *)job;
}

static PyObject *Context_memcpy(ContextObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"dst", "src", "nbytes", NULL};
    PyObject *dsto, *srco, *no = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O", kwlist, &dsto, &srco, &no)) return NULL;
    if (ctx_check(self) < 0) return NULL;
    parsed_buf d, s;
    if (parse_buffer(dsto, 1, &d) < 0) return NULL;
    if (parse_buffer(srco, 0, &s) < 0) { Py_DECREF(d.keep); return NULL; }
    size_t n = s.buf.size < d.buf.size ? s.buf.size : d.buf.size;
    if (no != Py_None) {
        unsigned long long v = PyLong_AsUnsignedLongLong(no);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) goto fail;
        if (v > s.buf.size || v > d.buf.size) {
            PyErr_SetString(PyExc_ValueError, "nbytes exceeds a buffer");
            goto fail;
        }
        n = (size_t)v;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_memcpy(self->ctx, d.buf, s.buf, n);
    Py_END_ALLOW_THREADS
    Py_DECREF(d.keep); Py_DECREF(s.keep);
    if (rc < 0) return raise_ctx(self->ctx, rc);
    return PyLong_FromSize_t(n);
fail:
    Py_DECREF(d.keep); Py_DECREF(s.keep);
    return NULL;
}

static PyObject *Context_cuda_device_of(ContextObject *self, PyObject *arg) {
    if (ctx_check(self) < 0) return NULL;
    unsigned long long p = PyLong_AsUnsignedLongLong(arg);
    if (p == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_cuda_device_of(self->ctx, (uintptr_t)p);
    Py_END_ALLOW_THREADS
    if (rc < 0) return raise_ctx(self->ctx, rc);
    return PyLong_FromLong(rc);
}

static PyMethodDef Context_methods[] = {
    {"config", (PyCFunction)Context_config, METH_NOARGS, "Effective configuration as a dict."},
    {"stats", (PyCFunction)Context_stats, METH_NOARGS,
     "Per-path statistics: {'cufile'|'staged'|'host': {'bytes','ops','seconds'}, 'direct_bytes', ...}."},
    {"reset_stats", (PyCFunction)Context_reset_stats, METH_NOARGS, "Zero the statistics."},
    {"cuda_device_count", (PyCFunction)Context_cuda_device_count, METH_NOARGS,
     "Number of CUDA devices (0 without a driver)."},
    {"cuda_device_of", (PyCFunction)Context_cuda_device_of, METH_O,
     "cuda_device_of(ptr) -> device ordinal owning a CUDA pointer."},
    {"run", (PyCFunction)(void (*)(void))Context_run, METH_VARARGS | METH_KEYWORDS,
     "run(plan, path=None, threads=0, sync=False, no_direct=False) -> bytes moved (blocking)."},
    {"submit", (PyCFunction)(void (*)(void))Context_submit, METH_VARARGS | METH_KEYWORDS,
     "submit(plan, path=None, threads=0, sync=False, no_direct=False) -> Job (returns at once)."},
    {"memcpy", (PyCFunction)(void (*)(void))Context_memcpy, METH_VARARGS | METH_KEYWORDS,
     "memcpy(dst, src, nbytes=None) -> bytes copied (synchronous; host or device buffers)."},
    {"close", (PyCFunction)Context_close, METH_NOARGS,
     "Refuse new work; the engine is freed when the last object using it goes."},
    {"__enter__", Context_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Context_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyObject *Context_get_nvcomp_status(ContextObject *self, void *closure) {
    if (ctx_check(self) < 0) return NULL;
    const char *s;
    Py_BEGIN_ALLOW_THREADS
    s = ferry_nvcomp_status(self->ctx);
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(s ? s : "");
}

static PyGetSetDef Context_getset[] = {
    {"nvcomp_status", (getter)Context_get_nvcomp_status, NULL, "'loaded nvCOMP X from PATH', or why not", NULL},
    {"cuda_status", (getter)Context_get_cuda_status, NULL, "'' when CUDA works, else why not", NULL},
    {"cufile_status", (getter)Context_get_cufile_status, NULL, "'' when cuFile works, else why not", NULL},
    {"closed", (getter)Context_get_closed, NULL, "True after close()", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject ContextType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Context",
    .tp_basicsize = sizeof(ContextObject),
    .tp_dealloc = (destructor)Context_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Context(threads=0, path='auto', direct='auto', task_size=0, staging_size=0, "
              "staging_count=0, small_io=0, no_env=False): a ferry engine.",
    .tp_methods = Context_methods,
    .tp_getset = Context_getset,
    .tp_init = (initproc)Context_init,
    .tp_new = PyType_GenericNew,
};

/* The module's default context, created on first use. Borrowed reference. */
static ContextObject *get_default_ctx(void) {
    /* after fork() the inherited context has no workers: the child gets its own */
    static pid_t default_pid;
    if (default_ctx && default_pid != getpid()) Py_CLEAR(default_ctx);   /* destroy is a no-op in a child */
    if (!default_ctx) {
        default_pid = getpid();
        default_ctx = PyObject_CallNoArgs((PyObject *)&ContextType);
        if (!default_ctx) return NULL;
    }
    return (ContextObject *)default_ctx;
}

/* ctx argument: a Context or None (the default context). Borrowed. */
static ContextObject *ctx_arg(PyObject *o) {
    if (o == NULL || o == Py_None) return get_default_ctx();
    if (!PyObject_TypeCheck(o, &ContextType)) {
        PyErr_SetString(PyExc_TypeError, "ctx must be a ferry Context or None");
        return NULL;
    }
    ContextObject *c = (ContextObject *)o;
    if (ctx_check(c) < 0) return NULL;
    return c;
}

/* ------------------------------------------------------------------------- */
/* File and Dataset: each owns one ferry handle, closed by close() or when the  */
/* object goes, and never while a running job uses it. The same layout up to   */
/* the handle lets one set of lifetime functions serve both.                   */
/* ------------------------------------------------------------------------- */
#define HANDLE_HEAD                                                            \
    PyObject_HEAD                                                              \
    ContextObject *ctx;                                                        \
    PyObject *path;                                                            \
    int users;           /* running jobs whose extents name the handle's files */
typedef struct { HANDLE_HEAD void *h; } HandleObject;
typedef void (*handle_close_fn)(void *h);

static void handle_close_now(HandleObject *self, handle_close_fn close_fn) {
    if (self->h) {
        void *h = self->h;
        self->h = NULL;
        Py_BEGIN_ALLOW_THREADS
        close_fn(h);
        Py_END_ALLOW_THREADS
    }
}

static void handle_dealloc(HandleObject *self, handle_close_fn close_fn) {
    handle_close_now(self, close_fn);
    Py_XDECREF(self->path);
    Py_XDECREF(self->ctx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* uses: what the running jobs do with it, for the error ("read", "read or write") */
static PyObject *handle_close(HandleObject *self, handle_close_fn close_fn, const char *uses) {
    if (self->users > 0)
        return PyErr_Format(PyExc_RuntimeError, "%U: cannot close: %d running job(s) %s it; wait for them first",
                            self->path, self->users, uses);
    handle_close_now(self, close_fn);
    Py_RETURN_NONE;
}

static PyObject *Handle_enter(PyObject *self, PyObject *noarg) { Py_INCREF(self); return self; }

/* ------------------------------------------------------------------------- */
/* File                                                                       */
/* ------------------------------------------------------------------------- */
typedef struct { HANDLE_HEAD ferry_file *f; } FileObject;

static int file_check(FileObject *f) {
    if (!f->f) { PyErr_SetString(PyExc_ValueError, "ferry File is closed"); return -1; }
    return 0;
}

static PyObject *raise_file(FileObject *self, int code) {
    const char *m = ferry_errmsg(self->ctx->ctx);
    const char *p = PyUnicode_AsUTF8(self->path);
    if (!p) { PyErr_Clear(); p = "?"; }
    if (m && *m && strstr(m, p)) return raise_code_msg(code, m);
    PyObject *msg = PyUnicode_FromFormat("%s: %s", p, (m && *m) ? m : ferry_strerror(code));
    if (!msg) return NULL;
    raise_code_msg(code, PyUnicode_AsUTF8(msg));
    Py_DECREF(msg);
    return NULL;
}

static int File_init(FileObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"ctx", "path", "mode", NULL};
    PyObject *ctxo, *patho;
    const char *mode = "r";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO&|s", kwlist, &ctxo, PyUnicode_FSConverter, &patho, &mode))
        return -1;
    ContextObject *c = ctx_arg(ctxo);
    if (!c) { Py_DECREF(patho); return -1; }
    int flags;
    if (!strcmp(mode, "r") || !strcmp(mode, "rb")) flags = FERRY_READ;
    else if (!strcmp(mode, "w") || !strcmp(mode, "wb")) flags = FERRY_READ | FERRY_WRITE | FERRY_CREATE | FERRY_TRUNC;
    else if (!strcmp(mode, "r+") || !strcmp(mode, "rb+") || !strcmp(mode, "r+b")) flags = FERRY_READ | FERRY_WRITE;
    else if (!strcmp(mode, "a") || !strcmp(mode, "ab")) flags = FERRY_READ | FERRY_WRITE | FERRY_CREATE;
    else { Py_DECREF(patho); PyErr_Format(PyExc_ValueError, "bad mode %s (r, w, r+, a)", mode); return -1; }
    if (self->f) { Py_DECREF(patho); PyErr_SetString(PyExc_RuntimeError, "File already open"); return -1; }
    Py_INCREF(c);
    Py_XSETREF(self->ctx, c);
    Py_XSETREF(self->path, PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(patho)));
    const char *p = PyBytes_AS_STRING(patho);
    ferry_file *f = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_file_open(c->ctx, p, flags, &f);
    Py_END_ALLOW_THREADS
    Py_DECREF(patho);
    if (!self->path) return -1;
    if (rc < 0) { raise_file(self, rc); return -1; }
    self->f = f;
    return 0;
}

static void file_close_fn(void *f) { ferry_file_close(f); }
static void File_dealloc(FileObject *self) { handle_dealloc((HandleObject *)self, file_close_fn); }
static PyObject *File_close(FileObject *self, PyObject *noarg) {
    return handle_close((HandleObject *)self, file_close_fn, "read or write");
}
static PyObject *File_exit(FileObject *self, PyObject *args) { return File_close(self, NULL); }

static PyObject *File_get_size(FileObject *self, void *closure) {
    if (file_check(self) < 0) return NULL;
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
    n = ferry_file_size(self->f);
    Py_END_ALLOW_THREADS
    if (n < 0) return raise_file(self, (int)n);
    return PyLong_FromLongLong(n);
}

static PyObject *File_get_path(FileObject *self, void *closure) {
    Py_INCREF(self->path);
    return self->path;
}

static PyObject *File_get_closed(FileObject *self, void *closure) { return PyBool_FromLong(self->f == NULL); }

static int opt_len(PyObject *o, size_t dflt, size_t *out) {
    if (o == NULL || o == Py_None) { *out = dflt; return 0; }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (size_t)v;
    return 0;
}

static PyObject *File_pread(FileObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"dst", "offset", "length", "no_direct", NULL};
    PyObject *dsto, *leno = Py_None;
    unsigned long long off = 0;
    int no_direct = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|KOp", kwlist, &dsto, &off, &leno, &no_direct)) return NULL;
    if (file_check(self) < 0) return NULL;
    parsed_buf d;
    if (parse_buffer(dsto, 1, &d) < 0) return NULL;
    size_t len;
    if (opt_len(leno, d.buf.size, &len) < 0) { Py_DECREF(d.keep); return NULL; }
    if (len > d.buf.size) {
        Py_DECREF(d.keep);
        PyErr_Format(PyExc_ValueError, "length %zu exceeds the destination (%zu bytes)", len, d.buf.size);
        return NULL;
    }
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_pread(self->f, d.buf, off, len, no_direct ? FERRY_NO_DIRECT : 0);
    Py_END_ALLOW_THREADS
    Py_DECREF(d.keep);
    if (rc < 0) return raise_file(self, (int)rc);
    return PyLong_FromLongLong(rc);
}

static PyObject *File_pwrite(FileObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"src", "offset", "length", "sync", "no_direct", NULL};
    PyObject *srco, *leno = Py_None;
    unsigned long long off = 0;
    int sync = 0, no_direct = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|KOpp", kwlist, &srco, &off, &leno, &sync, &no_direct))
        return NULL;
    if (file_check(self) < 0) return NULL;
    parsed_buf s;
    if (parse_buffer(srco, 0, &s) < 0) return NULL;
    size_t len;
    if (opt_len(leno, s.buf.size, &len) < 0) { Py_DECREF(s.keep); return NULL; }
    if (len > s.buf.size) {
        Py_DECREF(s.keep);
        PyErr_Format(PyExc_ValueError, "length %zu exceeds the source (%zu bytes)", len, s.buf.size);
        return NULL;
    }
    int64_t rc;
    unsigned flags = (sync ? FERRY_SYNC : 0) | (no_direct ? FERRY_NO_DIRECT : 0);
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_pwrite(self->f, s.buf, off, len, flags);
    Py_END_ALLOW_THREADS
    Py_DECREF(s.keep);
    if (rc < 0) return raise_file(self, (int)rc);
    return PyLong_FromLongLong(rc);
}

static PyObject *File_sync(FileObject *self, PyObject *noarg) {
    if (file_check(self) < 0) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_file_sync(self->f);
    Py_END_ALLOW_THREADS
    if (rc < 0) return raise_file(self, rc);
    Py_RETURN_NONE;
}

static PyObject *File_truncate(FileObject *self, PyObject *arg) {
    if (file_check(self) < 0) return NULL;
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_file_truncate(self->f, n);
    Py_END_ALLOW_THREADS
    if (rc < 0) return raise_file(self, rc);
    Py_RETURN_NONE;
}

static PyObject *File_cached(FileObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"offset", "length", NULL};
    unsigned long long off = 0;
    PyObject *leno = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|KO", kwlist, &off, &leno)) return NULL;
    if (file_check(self) < 0) return NULL;
    int64_t rc;
    uint64_t len;
    if (leno == Py_None) {
        Py_BEGIN_ALLOW_THREADS
        rc = ferry_file_size(self->f);
        Py_END_ALLOW_THREADS
        if (rc < 0) return raise_file(self, (int)rc);
        len = (uint64_t)rc > off ? (uint64_t)rc - off : 0;
    } else {
        unsigned long long v = PyLong_AsUnsignedLongLong(leno);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
        len = v;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_file_cached(self->f, off, len);
    Py_END_ALLOW_THREADS
    if (rc < 0) return raise_file(self, (int)rc);
    return PyLong_FromLongLong(rc);
}

static PyObject *File_repr(FileObject *self) {
    return PyUnicode_FromFormat("<ferry.File %R%s>", self->path, self->f ? "" : " (closed)");
}

static PyMethodDef File_methods[] = {
    {"pread", (PyCFunction)(void (*)(void))File_pread, METH_VARARGS | METH_KEYWORDS,
     "pread(dst, offset=0, length=None, no_direct=False) -> bytes read (length None: all of dst)."},
    {"pwrite", (PyCFunction)(void (*)(void))File_pwrite, METH_VARARGS | METH_KEYWORDS,
     "pwrite(src, offset=0, length=None, sync=False, no_direct=False) -> bytes written."},
    {"sync", (PyCFunction)File_sync, METH_NOARGS, "fsync the file."},
    {"truncate", (PyCFunction)File_truncate, METH_O, "truncate(n): set the file's length."},
    {"cached", (PyCFunction)(void (*)(void))File_cached, METH_VARARGS | METH_KEYWORDS,
     "cached(offset=0, length=None) -> bytes of the range resident in the page cache."},
    {"close", (PyCFunction)File_close, METH_NOARGS, "Close (do not close a file a running job uses)."},
    {"__enter__", Handle_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)File_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef File_getset[] = {
    {"size", (getter)File_get_size, NULL, "current size in bytes", NULL},
    {"path", (getter)File_get_path, NULL, "the path opened", NULL},
    {"closed", (getter)File_get_closed, NULL, "True after close()", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject FileType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.File",
    .tp_basicsize = sizeof(FileObject),
    .tp_dealloc = (destructor)File_dealloc,
    .tp_repr = (reprfunc)File_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "File(ctx, path, mode='r'): an open file (mode r, w, r+, a). ctx None: the default context.",
    .tp_methods = File_methods,
    .tp_getset = File_getset,
    .tp_init = (initproc)File_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------- */
/* Dataset                                                                    */
/* ------------------------------------------------------------------------- */
typedef struct { HANDLE_HEAD ferry_dataset *ds; } DatasetObject;

static int ds_check(DatasetObject *d) {
    if (!d->ds) { PyErr_SetString(PyExc_ValueError, "ferry Dataset is closed"); return -1; }
    return 0;
}

static int Dataset_init(DatasetObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"ctx", "path", "format", "group", NULL};
    PyObject *ctxo, *patho;
    const char *format = NULL, *group = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO&|zz", kwlist, &ctxo, PyUnicode_FSConverter, &patho,
                                     &format, &group))
        return -1;
    ContextObject *c = ctx_arg(ctxo);
    if (!c) { Py_DECREF(patho); return -1; }
    if (self->ds) { Py_DECREF(patho); PyErr_SetString(PyExc_RuntimeError, "Dataset already open"); return -1; }
    Py_INCREF(c);
    Py_XSETREF(self->ctx, c);
    Py_XSETREF(self->path, PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(patho)));
    if (!self->path) { Py_DECREF(patho); return -1; }
    ferry_open_opts o;
    memset(&o, 0, sizeof o);
    o.format = format;
    o.group = group;
    const char *p = PyBytes_AS_STRING(patho);
    ferry_dataset *ds = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_dataset_open(c->ctx, p, &o, &ds);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        const char *m = ferry_errmsg(c->ctx);
        if (m && *m && strstr(m, p)) raise_code_msg(rc, m);
        else {
            PyObject *msg = PyUnicode_FromFormat("%s: %s", p, (m && *m) ? m : ferry_strerror(rc));
            if (msg) { raise_code_msg(rc, PyUnicode_AsUTF8(msg)); Py_DECREF(msg); }
        }
        Py_DECREF(patho);
        return -1;
    }
    Py_DECREF(patho);
    self->ds = ds;
    return 0;
}

static void ds_close_fn(void *ds) { ferry_dataset_close(ds); }
static void Dataset_dealloc(DatasetObject *self) { handle_dealloc((HandleObject *)self, ds_close_fn); }
static PyObject *Dataset_close(DatasetObject *self, PyObject *noarg) {
    return handle_close((HandleObject *)self, ds_close_fn, "read");
}
static PyObject *Dataset_exit(DatasetObject *self, PyObject *args) { return Dataset_close(self, NULL); }

static PyObject *Dataset_get_format(DatasetObject *self, void *c) {
    if (ds_check(self) < 0) return NULL;
    const char *f = ferry_dataset_format(self->ds);
    return PyUnicode_FromString(f ? f : "");
}
static PyObject *Dataset_get_path(DatasetObject *self, void *c) { Py_INCREF(self->path); return self->path; }
static PyObject *Dataset_get_attrs(DatasetObject *self, void *c) {
    if (ds_check(self) < 0) return NULL;
    const char *s = ferry_dataset_attrs_json(self->ds);
    return PyUnicode_FromString(s ? s : "{}");
}
static PyObject *Dataset_get_dims(DatasetObject *self, void *c) {
    if (ds_check(self) < 0) return NULL;
    const char *s = ferry_dataset_dims_json(self->ds);
    return PyUnicode_FromString(s ? s : "{}");
}
static PyObject *Dataset_get_groups(DatasetObject *self, void *c) {
    if (ds_check(self) < 0) return NULL;
    const char *s = ferry_dataset_groups_json(self->ds);
    return PyUnicode_FromString(s ? s : "[]");
}
static PyObject *Dataset_get_closed(DatasetObject *self, void *c) { return PyBool_FromLong(self->ds == NULL); }

/* the library's one name table (ferry_dtype_name, src/engine/names.c) */
static const char *dtype_name(ferry_dtype t) { return ferry_dtype_name(t, FERRY_NAME_SHORT); }

static PyObject *u64_tuple(const uint64_t *v, int n) {
    PyObject *t = PyTuple_New(n);
    if (!t) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *x = PyLong_FromUnsignedLongLong(v[i]);
        if (!x) { Py_DECREF(t); return NULL; }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

static PyObject *var_dict(const ferry_var_info *v) {
    int nd = v->ndim < 0 ? 0 : (v->ndim > FERRY_MAX_DIMS ? FERRY_MAX_DIMS : v->ndim);
    PyObject *shape = u64_tuple(v->shape, nd);
    PyObject *chunks = shape ? u64_tuple(v->chunks, nd) : NULL;
    if (!chunks) { Py_XDECREF(shape); return NULL; }
    /* the data file's path in the file system's encoding (str with surrogate
     * escapes for non-UTF-8 bytes, as os.fsdecode gives), the error readable */
    PyObject *path = PyUnicode_DecodeFSDefault(v->path ? v->path : "");
    PyObject *error = !path ? NULL : v->error ? PyUnicode_DecodeUTF8(v->error, (Py_ssize_t)strlen(v->error),
                                                                      "backslashreplace")
                                              : (Py_INCREF(Py_None), Py_None);
    if (!error) { Py_XDECREF(path); Py_DECREF(shape); Py_DECREF(chunks); return NULL; }
    PyObject *d = Py_BuildValue(
        "{s:s,s:s,s:s,s:I,s:N,s:N,s:O,s:s,s:s,s:s,s:s,s:N,s:K,s:K,s:i,s:N}",
        "name", v->name ? v->name : "", "dtype", dtype_name(v->dtype), "typestr",
        v->typestr ? v->typestr : "", "itemsize", (unsigned)v->itemsize, "shape", shape, "chunks",
        chunks, "fortran_order", v->fortran_order ? Py_True : Py_False, "dims",
        v->dims_json ? v->dims_json : "null", "attrs", v->attrs_json ? v->attrs_json : "{}", "fill",
        v->fill_json ? v->fill_json : "null", "codecs", v->codecs ? v->codecs : "", "path",
        path, "data_offset", (unsigned long long)v->data_offset, "data_bytes",
        (unsigned long long)v->data_bytes, "ndim", nd, "error", error);
    return d;
}

static PyObject *Dataset_variables(DatasetObject *self, PyObject *noarg) {
    if (ds_check(self) < 0) return NULL;
    int n = ferry_dataset_nvars(self->ds);
    if (n < 0) return raise_ctx(self->ctx->ctx, n);
    PyObject *l = PyList_New(n);
    if (!l) return NULL;
    for (int i = 0; i < n; i++) {
        ferry_var_info vi;
        memset(&vi, 0, sizeof vi);
        int rc = ferry_dataset_var(self->ds, i, &vi);
        if (rc < 0) { Py_DECREF(l); return raise_ctx(self->ctx->ctx, rc); }
        PyObject *d = var_dict(&vi);
        if (!d) { Py_DECREF(l); return NULL; }
        PyList_SET_ITEM(l, i, d);
    }
    return l;
}

/* Only the names: what ferry.open() needs up front (a 1,000-tensor checkpoint
 * opens without building 1,000 info dicts). */
static PyObject *Dataset_names(DatasetObject *self, PyObject *noarg) {
    if (ds_check(self) < 0) return NULL;
    int n = ferry_dataset_nvars(self->ds);
    if (n < 0) return raise_ctx(self->ctx->ctx, n);
    PyObject *l = PyList_New(n);
    if (!l) return NULL;
    for (int i = 0; i < n; i++) {
        ferry_var_info vi;
        memset(&vi, 0, sizeof vi);
        int rc = ferry_dataset_var(self->ds, i, &vi);
        if (rc < 0) { Py_DECREF(l); return raise_ctx(self->ctx->ctx, rc); }
        PyObject *s = PyUnicode_FromString(vi.name ? vi.name : "");
        if (!s) { Py_DECREF(l); return NULL; }
        PyList_SET_ITEM(l, i, s);
    }
    return l;
}

/* One tuple per variable, (name, typestr, shape, data_offset, data_bytes, path,
 * attrs): what ferry.checkpoint needs to describe a file's tensors, without building a
 * dict of every field per tensor (a 1,000-tensor checkpoint opens in a third of the time). */
static PyObject *Dataset_table(DatasetObject *self, PyObject *noarg) {
    if (ds_check(self) < 0) return NULL;
    int n = ferry_dataset_nvars(self->ds);
    if (n < 0) return raise_ctx(self->ctx->ctx, n);
    PyObject *l = PyList_New(n);
    if (!l) return NULL;
    for (int i = 0; i < n; i++) {
        ferry_var_info vi;
        memset(&vi, 0, sizeof vi);
        int rc = ferry_dataset_var(self->ds, i, &vi);
        if (rc < 0) { Py_DECREF(l); return raise_ctx(self->ctx->ctx, rc); }
        int nd = vi.ndim < 0 ? 0 : (vi.ndim > FERRY_MAX_DIMS ? FERRY_MAX_DIMS : vi.ndim);
        PyObject *shape = u64_tuple(vi.shape, nd);
        if (!shape) { Py_DECREF(l); return NULL; }
        PyObject *t = Py_BuildValue("(ssNKKss)", vi.name ? vi.name : "", vi.typestr ? vi.typestr : "", shape,
                                    (unsigned long long)vi.data_offset, (unsigned long long)vi.data_bytes,
                                    vi.path ? vi.path : "", vi.attrs_json ? vi.attrs_json : "{}");
        if (!t) { Py_DECREF(l); return NULL; }
        PyList_SET_ITEM(l, i, t);
    }
    return l;
}

/* Index of a variable given by name or index; raises KeyError/IndexError. */
static int ds_var_index(DatasetObject *self, PyObject *var) {
    if (PyLong_Check(var)) {
        long i = PyLong_AsLong(var);
        if (i == -1 && PyErr_Occurred()) return -1;
        int n = ferry_dataset_nvars(self->ds);
        if (i < 0) i += n;
        if (i < 0 || i >= n) { PyErr_Format(PyExc_IndexError, "variable index %ld out of range", i); return -1; }
        return (int)i;
    }
    const char *name = PyUnicode_AsUTF8(var);
    if (!name) return -1;
    int i = ferry_dataset_find(self->ds, name);
    if (i < 0) {
        PyErr_Format(PyExc_KeyError, "%U: no variable named %R", self->path, var);
        return -1;
    }
    return i;
}

static PyObject *Dataset_find(DatasetObject *self, PyObject *name) {
    if (ds_check(self) < 0) return NULL;
    int i = ds_var_index(self, name);
    if (i < 0) return NULL;
    return PyLong_FromLong(i);
}

static PyObject *Dataset_variable(DatasetObject *self, PyObject *var) {
    if (ds_check(self) < 0) return NULL;
    int i = ds_var_index(self, var);
    if (i < 0) return NULL;
    ferry_var_info vi;
    memset(&vi, 0, sizeof vi);
    int rc = ferry_dataset_var(self->ds, i, &vi);
    if (rc < 0) return raise_ctx(self->ctx->ctx, rc);
    return var_dict(&vi);
}

static PyObject *Dataset_repr(DatasetObject *self) {
    if (!self->ds) return PyUnicode_FromFormat("<ferry.Dataset %R (closed)>", self->path);
    return PyUnicode_FromFormat("<ferry.Dataset %R format=%s nvars=%d>", self->path,
                                ferry_dataset_format(self->ds), ferry_dataset_nvars(self->ds));
}

static PyMethodDef Dataset_methods[] = {
    {"variables", (PyCFunction)Dataset_variables, METH_NOARGS, "list of dicts, one per variable"},
    {"names", (PyCFunction)Dataset_names, METH_NOARGS, "list of the variables' names, in file order"},
    {"table", (PyCFunction)Dataset_table, METH_NOARGS,
     "list of (name, typestr, shape, data_offset, data_bytes, path, attrs) tuples, in file order"},
    {"variable", (PyCFunction)Dataset_variable, METH_O, "variable(name_or_index) -> dict"},
    {"find", (PyCFunction)Dataset_find, METH_O, "find(name) -> index (KeyError if missing)"},
    {"close", (PyCFunction)Dataset_close, METH_NOARGS, "close the dataset"},
    {"__enter__", Handle_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Dataset_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Dataset_getset[] = {
    {"format", (getter)Dataset_get_format, NULL, "npy, safetensors, netcdf3, zarr", NULL},
    {"path", (getter)Dataset_get_path, NULL, "the path opened", NULL},
    {"attrs", (getter)Dataset_get_attrs, NULL, "global attributes (JSON)", NULL},
    {"dims", (getter)Dataset_get_dims, NULL, "dimensions (JSON)", NULL},
    {"groups", (getter)Dataset_get_groups, NULL, "child groups (JSON array)", NULL},
    {"closed", (getter)Dataset_get_closed, NULL, "True after close()", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject DatasetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Dataset",
    .tp_basicsize = sizeof(DatasetObject),
    .tp_dealloc = (destructor)Dataset_dealloc,
    .tp_repr = (reprfunc)Dataset_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Dataset(ctx, path, format=None, group=None): parsed metadata of a file or store.",
    .tp_methods = Dataset_methods,
    .tp_getset = Dataset_getset,
    .tp_init = (initproc)Dataset_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------- */
/* Plan                                                                       */
/* ------------------------------------------------------------------------- */
static int Plan_init(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "", kwlist)) return -1;
    if (!self->plan) {
        int rc = ferry_plan_create(&self->plan);
        if (rc < 0) { raise_code_msg(rc, NULL); return -1; }
    }
    if (!self->refs) {
        self->refs = PyList_New(0);
        if (!self->refs) return -1;
    }
    return 0;
}

static void Plan_dealloc(PlanObject *self) {
    ferry_plan_destroy(self->plan);
    Py_XDECREF(self->refs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int plan_check(PlanObject *p) {
    if (!p->plan || !p->refs) { PyErr_SetString(PyExc_ValueError, "Plan not initialised"); return -1; }
    if (p->busy) { PyErr_SetString(PyExc_RuntimeError, "Plan is being submitted by another thread"); return -1; }
    return 0;
}

/* Append a reference to keep alive; steals `o`. */
static int plan_keep(PlanObject *p, PyObject *o) {
    int rc = PyList_Append(p->refs, o);
    Py_DECREF(o);
    return rc;
}

/* selection: None, or a sequence of (start, stop[, step]) */
static int parse_triples(PyObject *sel, ferry_slice *out, int ndim, const char *name) {
    PyObject *seq = PySequence_Fast(sel, "selection must be a sequence of (start, stop, step)");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != ndim) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "selection has %zd dimensions, variable %s has %d", n, name ? name : "?", ndim);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        long long a, b, c = 1;
        if (!PyTuple_Check(it) || !PyArg_ParseTuple(it, "LL|L", &a, &b, &c)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "selection items are (start, stop[, step]) tuples");
            Py_DECREF(seq);
            return -1;
        }
        out[i] = (ferry_slice){a, b, c};
    }
    Py_DECREF(seq);
    return 0;
}

static PyObject *Plan_read(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"dataset", "var", "dst", "selection", "native", "stored_order", NULL};
    DatasetObject *ds;
    PyObject *var, *dsto, *sel = Py_None;
    int native = 1, stored = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OO|Opp", kwlist, &DatasetType, &ds, &var, &dsto, &sel,
                                     &native, &stored))
        return NULL;
    if (plan_check(self) < 0 || ds_check(ds) < 0) return NULL;
    int vi = ds_var_index(ds, var);
    if (vi < 0) return NULL;
    ferry_slice slices[FERRY_MAX_DIMS];
    ferry_slice *sp = NULL;
    if (sel != Py_None) {
        ferry_var_info info;
        memset(&info, 0, sizeof info);
        if (ferry_dataset_var(ds->ds, vi, &info) < 0) return raise_code_msg(FERRY_EINVAL, ferry_errmsg(NULL));
        if (parse_triples(sel, slices, info.ndim, info.name) < 0) return NULL;
        sp = slices;
    }
    parsed_buf d;
    if (parse_buffer(dsto, 1, &d) < 0) return NULL;
    unsigned flags = (native ? FERRY_NATIVE : 0) | (stored ? FERRY_STORED_ORDER : 0);
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_dataset_plan_read(ds->ds, vi, sp, d.buf, flags, self->plan);
    Py_END_ALLOW_THREADS
    if (rc < 0) { Py_DECREF(d.keep); return raise_ctx(ds->ctx->ctx, (int)rc); }
    if (plan_keep(self, d.keep) < 0) return NULL;
    Py_INCREF(ds);
    if (plan_keep(self, (PyObject *)ds) < 0) return NULL;
    return PyLong_FromLongLong(rc);
}

static PyObject *Plan_read_file(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"file", "offset", "length", "dst", "dst_offset", NULL};
    FileObject *f;
    unsigned long long off, len, doff = 0;
    PyObject *dsto;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!KKO|K", kwlist, &FileType, &f, &off, &len, &dsto, &doff))
        return NULL;
    if (plan_check(self) < 0 || file_check(f) < 0) return NULL;
    parsed_buf d;
    if (parse_buffer(dsto, 1, &d) < 0) return NULL;
    if (doff > d.buf.size || len > d.buf.size - doff) {
        Py_DECREF(d.keep);
        PyErr_Format(PyExc_ValueError, "read of %llu bytes at %llu does not fit the destination (%zu bytes)",
                     len, doff, d.buf.size);
        return NULL;
    }
    int rc = ferry_plan_read(self->plan, f->f, off, len, d.buf, doff);
    if (rc < 0) { Py_DECREF(d.keep); return raise_ctx(f->ctx->ctx, rc); }
    if (plan_keep(self, d.keep) < 0) return NULL;
    Py_INCREF(f);
    if (plan_keep(self, (PyObject *)f) < 0) return NULL;
    Py_RETURN_NONE;
}

/* read_file_runs: N plain reads from one file in one call. Python adds one
 * extent per token window or row run; at 1,600 batches/s x 256 windows a
 * read_file call each is ~400k Python->C calls a second on the loader's one
 * thread, so the loop lives here. Every run is checked before any is added,
 * so a refused call leaves the plan as it was. */
typedef struct {
    Py_buffer view;
    int have;          /* view holds a buffer (else scalar) */
    int is_signed;
    unsigned long long scalar;
} u64_column;

static int column_parse(PyObject *o, const char *what, int scalar_ok, u64_column *c) {
    memset(c, 0, sizeof *c);
    if (scalar_ok && PyLong_Check(o)) {
        c->scalar = PyLong_AsUnsignedLongLong(o);
        if (c->scalar == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        return 0;
    }
    if (PyObject_GetBuffer(o, &c->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "read_file_runs: %s must be a contiguous 1-D int64/uint64 array%s",
                     what, scalar_ok ? " or an int" : "");
        return -1;
    }
    c->have = 1;
    const char *fmt = c->view.format ? c->view.format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
    int ok = c->view.ndim == 1 && c->view.itemsize == 8 && fmt[0] && !fmt[1] && strchr("qlnQLN", fmt[0]);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "read_file_runs: %s must be a contiguous 1-D int64/uint64 array "
                     "(got format '%s', %d dimensions, %zd-byte items)", what,
                     c->view.format ? c->view.format : "B", c->view.ndim, c->view.itemsize);
        PyBuffer_Release(&c->view);
        c->have = 0;
        return -1;
    }
    c->is_signed = strchr("qln", fmt[0]) != NULL;
    return 0;
}

static Py_ssize_t column_len(const u64_column *c) { return c->have ? c->view.shape[0] : -1; }

/* Value i; -1 (and *neg set) for a negative signed item. */
static unsigned long long column_at(const u64_column *c, Py_ssize_t i, int *neg) {
    if (!c->have) return c->scalar;
    int64_t v;
    memcpy(&v, (const char *)c->view.buf + 8 * i, 8);
    if (c->is_signed && v < 0) *neg = 1;
    return (unsigned long long)v;
}

static void column_release(u64_column *c) {
    if (c->have) PyBuffer_Release(&c->view);
    c->have = 0;
}

/* Check run i; on failure raise FerryError(EINVAL) naming the file and i. */
static int run_check(FileObject *f, Py_ssize_t i, const u64_column *offs, const u64_column *lens,
                     const u64_column *doffs, size_t dst_size, unsigned long long *o, unsigned long long *l,
                     unsigned long long *d) {
    int neg = 0;
    *o = column_at(offs, i, &neg);
    *l = column_at(lens, i, &neg);
    *d = column_at(doffs, i, &neg);
    const char *path = ferry_file_path(f->f);
    char msg[512];
    if (neg)
        snprintf(msg, sizeof msg, "read_file_runs: %s: run %zd: negative offset, length or dst offset "
                 "(%lld, %lld, %lld)", path ? path : "?", i, (long long)*o, (long long)*l, (long long)*d);
    else if (*o > (unsigned long long)INT64_MAX || *l > (unsigned long long)INT64_MAX - *o)
        snprintf(msg, sizeof msg, "read_file_runs: %s: run %zd: %llu bytes at offset %llu pass the "
                 "largest file offset", path ? path : "?", i, *l, *o);
    else if (*d > dst_size || *l > dst_size - *d)
        snprintf(msg, sizeof msg, "read_file_runs: %s: run %zd: %llu bytes at dst offset %llu do not "
                 "fit the destination (%zu bytes)", path ? path : "?", i, *l, *d, dst_size);
    else
        return 0;
    raise_code_msg(FERRY_EINVAL, msg);
    return -1;
}

static PyObject *Plan_read_file_runs(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"file", "offsets", "lengths", "dst", "dst_offsets", NULL};
    FileObject *f;
    PyObject *offo, *leno, *dsto, *doffo;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOOO", kwlist, &FileType, &f, &offo, &leno, &dsto, &doffo))
        return NULL;
    if (plan_check(self) < 0 || file_check(f) < 0) return NULL;
    u64_column offs, lens, doffs;
    memset(&lens, 0, sizeof lens);
    memset(&doffs, 0, sizeof doffs);
    PyObject *ret = NULL;
    parsed_buf d = {.keep = NULL};
    if (column_parse(offo, "offsets", 0, &offs) < 0) return NULL;
    if (column_parse(leno, "lengths", 1, &lens) < 0 || column_parse(doffo, "dst_offsets", 0, &doffs) < 0)
        goto out;
    Py_ssize_t n = column_len(&offs);
    if ((lens.have && column_len(&lens) != n) || column_len(&doffs) != n) {
        PyErr_Format(PyExc_ValueError, "read_file_runs: %zd offsets, %zd lengths, %zd dst_offsets "
                     "(all must be equal; lengths may be one int)", n, lens.have ? column_len(&lens) : n,
                     column_len(&doffs));
        goto out;
    }
    if (parse_buffer(dsto, 1, &d) < 0) goto out;
    unsigned long long o, l, doff;
    for (Py_ssize_t i = 0; i < n; i++)
        if (run_check(f, i, &offs, &lens, &doffs, d.buf.size, &o, &l, &doff) < 0) goto out;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* checked again: the arrays are the caller's and could change under us */
        if (run_check(f, i, &offs, &lens, &doffs, d.buf.size, &o, &l, &doff) < 0) goto out;
        int rc = ferry_plan_read(self->plan, f->f, o, l, d.buf, doff);
        if (rc < 0) { raise_ctx(f->ctx->ctx, rc); goto out; }
    }
    if (n > 0) {
        PyObject *keep = d.keep;
        d.keep = NULL;
        if (plan_keep(self, keep) < 0) goto out;
        Py_INCREF(f);
        if (plan_keep(self, (PyObject *)f) < 0) goto out;
    }
    ret = PyLong_FromSsize_t(n);
out:
    Py_XDECREF(d.keep);
    column_release(&offs);
    column_release(&lens);
    column_release(&doffs);
    return ret;
}

static PyObject *Plan_write_file(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"file", "offset", "length", "src", "src_offset", NULL};
    FileObject *f;
    unsigned long long off, len, soff = 0;
    PyObject *srco;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!KKO|K", kwlist, &FileType, &f, &off, &len, &srco, &soff))
        return NULL;
    if (plan_check(self) < 0 || file_check(f) < 0) return NULL;
    parsed_buf s;
    if (parse_buffer(srco, 0, &s) < 0) return NULL;
    if (soff > s.buf.size || len > s.buf.size - soff) {
        Py_DECREF(s.keep);
        PyErr_Format(PyExc_ValueError, "write of %llu bytes at %llu exceeds the source (%zu bytes)", len,
                     soff, s.buf.size);
        return NULL;
    }
    int rc = ferry_plan_write(self->plan, f->f, off, len, s.buf, soff);
    if (rc < 0) { Py_DECREF(s.keep); return raise_ctx(f->ctx->ctx, rc); }
    if (plan_keep(self, s.keep) < 0) return NULL;
    Py_INCREF(f);
    if (plan_keep(self, (PyObject *)f) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Plan_fill(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"dst", "value", "dst_offset", "count", NULL};
    PyObject *dsto, *cnto = Py_None;
    Py_buffer val;
    unsigned long long doff = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oy*|KO", kwlist, &dsto, &val, &doff, &cnto)) return NULL;
    if (plan_check(self) < 0) { PyBuffer_Release(&val); return NULL; }
    Py_ssize_t item = val.len;
    if (item < 1 || item > 16) {
        PyBuffer_Release(&val);
        PyErr_SetString(PyExc_ValueError, "fill value must be 1 to 16 bytes");
        return NULL;
    }
    parsed_buf d;
    if (parse_buffer(dsto, 1, &d) < 0) { PyBuffer_Release(&val); return NULL; }
    unsigned long long count;
    if (doff > d.buf.size) { count = 0; }
    else count = (d.buf.size - doff) / (size_t)item;
    if (cnto != Py_None) {
        unsigned long long c = PyLong_AsUnsignedLongLong(cnto);
        if (c == (unsigned long long)-1 && PyErr_Occurred()) goto fail;
        if (doff > d.buf.size || c > (d.buf.size - doff) / (size_t)item) {
            PyErr_SetString(PyExc_ValueError, "fill does not fit the destination");
            goto fail;
        }
        count = c;
    }
    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.kind = FERRY_EXTENT_FILL;
    e.dst = d.buf;
    e.dst_offset = doff;
    e.decoded_size = count * (unsigned long long)item;
    e.length = e.decoded_size;   /* FILL: the bytes filled (the engine reads length) */
    memcpy(e.fill, val.buf, (size_t)item);
    ferry_place pl;
    memset(&pl, 0, sizeof pl);
    if (item > 1) {
        pl.ndim = 1;
        pl.itemsize = (uint32_t)item;
        pl.count[0] = count;
        pl.src_stride[0] = 0;
        pl.dst_stride[0] = item;
        e.place = &pl;
    }
    int rc = ferry_plan_add(self->plan, &e);
    PyBuffer_Release(&val);
    if (rc < 0) { Py_DECREF(d.keep); return raise_code_msg(rc, NULL); }
    if (plan_keep(self, d.keep) < 0) return NULL;
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&val);
    Py_DECREF(d.keep);
    return NULL;
}

static int parse_codec_id(PyObject *o, uint32_t *out) {
    if (PyUnicode_Check(o)) {
        const char *s = PyUnicode_AsUTF8(o);
        if (!s) return -1;
        ferry_codec_id id;
        if (ferry_codec_parse(s, &id) == 0) { *out = (uint32_t)id; return 0; }
        PyErr_Format(PyExc_ValueError, "unknown codec %R", o);
        return -1;
    }
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || v > FERRY_CODEC_BYTESWAP) { PyErr_Format(PyExc_ValueError, "unknown codec id %ld", v); return -1; }
    *out = (uint32_t)v;
    return 0;
}

/* codecs: a sequence of names / ids or (name / id, param) pairs, in decoding order */
static int parse_codec_list(PyObject *codecs, ferry_codec *out, int *nout) {
    PyObject *f = PySequence_Fast(codecs, "codecs must be a sequence of (id, param)");
    if (!f) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(f);
    if (n > FERRY_MAX_CODECS) { Py_DECREF(f); PyErr_SetString(PyExc_ValueError, "too many codecs"); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PySequence_Fast_GET_ITEM(f, i);
        PyObject *ido = c, *paro = NULL;
        if (PyTuple_Check(c) || PyList_Check(c)) {
            if (PySequence_Size(c) != 2) { Py_DECREF(f); PyErr_SetString(PyExc_ValueError, "codec must be (id, param)"); return -1; }
            ido = PySequence_Fast_GET_ITEM(c, 0);
            paro = PySequence_Fast_GET_ITEM(c, 1);
        }
        out[i].param = 0;
        if (parse_codec_id(ido, &out[i].id) < 0) { Py_DECREF(f); return -1; }
        if (paro) {
            long p = PyLong_AsLong(paro);
            if (p == -1 && PyErr_Occurred()) { Py_DECREF(f); return -1; }
            out[i].param = (uint32_t)p;
        }
    }
    *nout = (int)n;
    Py_DECREF(f);
    return 0;
}

/* Fill an int64 array of `n` items from a sequence; -1 on error. */
static int seq_to_i64(PyObject *seq, const char *what, int64_t *out, int n) {
    PyObject *f = PySequence_Fast(seq, what);
    if (!f) return -1;
    if (PySequence_Fast_GET_SIZE(f) != n) {
        PyErr_Format(PyExc_ValueError, "place: %s must have %d items", what, n);
        Py_DECREF(f);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(f, i));
        if (v == -1 && PyErr_Occurred()) { Py_DECREF(f); return -1; }
        out[i] = v;
    }
    Py_DECREF(f);
    return 0;
}

/* place dict: itemsize, count, src_stride, dst_stride, src_offset (optional). */
static int parse_place(PyObject *d, ferry_place *pl) {
    memset(pl, 0, sizeof *pl);
    if (!PyDict_Check(d)) { PyErr_SetString(PyExc_TypeError, "place must be a dict or None"); return -1; }
    PyObject *item = PyDict_GetItemString(d, "itemsize");
    PyObject *count = PyDict_GetItemString(d, "count");
    PyObject *ss = PyDict_GetItemString(d, "src_stride");
    PyObject *ds = PyDict_GetItemString(d, "dst_stride");
    PyObject *so = PyDict_GetItemString(d, "src_offset");
    if (!item || !count || !ss || !ds) {
        PyErr_SetString(PyExc_ValueError, "place needs itemsize, count, src_stride, dst_stride");
        return -1;
    }
    long it = PyLong_AsLong(item);
    if (it == -1 && PyErr_Occurred()) return -1;
    if (it < 1 || it > (1L << 30)) { PyErr_SetString(PyExc_ValueError, "place: bad itemsize"); return -1; }
    Py_ssize_t n = PySequence_Size(count);
    if (n < 0) return -1;
    if (n < 1 || n > FERRY_MAX_DIMS) { PyErr_SetString(PyExc_ValueError, "place: count must have 1..16 items"); return -1; }
    int64_t tmp[FERRY_MAX_DIMS];
    if (seq_to_i64(count, "count", tmp, (int)n) < 0) return -1;
    for (int i = 0; i < n; i++) {
        if (tmp[i] < 0) { PyErr_SetString(PyExc_ValueError, "place: negative count"); return -1; }
        pl->count[i] = (uint64_t)tmp[i];
    }
    if (seq_to_i64(ss, "src_stride", pl->src_stride, (int)n) < 0) return -1;
    if (seq_to_i64(ds, "dst_stride", pl->dst_stride, (int)n) < 0) return -1;
    if (so && so != Py_None) {
        unsigned long long v = PyLong_AsUnsignedLongLong(so);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        pl->src_offset = v;
    }
    pl->ndim = (int)n;
    pl->itemsize = (uint32_t)it;
    return 0;
}

static PyObject *Plan_extent(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"file", "path", "offset", "length", "codecs", "decoded_size", "dst",
                             "dst_offset", "place", "kind", "fill", "label", NULL};
    PyObject *fileo = Py_None, *patho = Py_None, *codecs = Py_None, *decso = Py_None, *dsto = Py_None;
    PyObject *placeo = Py_None;
    unsigned long long off = 0, len = 0, doff = 0;
    const char *kind = "read", *label = NULL;
    Py_buffer fill = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOKKOOOKOsy*z", kwlist, &fileo, &patho, &off, &len, &codecs,
                                     &decso, &dsto, &doff, &placeo, &kind, &fill, &label))
        return NULL;
    PyObject *pathb = NULL;
    parsed_buf d = {.keep = NULL};
    PyObject *result = NULL;
    ferry_extent e;
    ferry_place pl;
    memset(&e, 0, sizeof e);
    if (plan_check(self) < 0) goto done;
    if (!strcmp(kind, "read")) e.kind = FERRY_EXTENT_READ;
    else if (!strcmp(kind, "fill")) e.kind = FERRY_EXTENT_FILL;
    else if (!strcmp(kind, "write")) e.kind = FERRY_EXTENT_WRITE;
    else { PyErr_Format(PyExc_ValueError, "kind must be 'read', 'fill' or 'write', not %s", kind); goto done; }
    if (e.kind != FERRY_EXTENT_FILL) {
        if (fileo != Py_None) {
            if (!PyObject_TypeCheck(fileo, &FileType)) { PyErr_SetString(PyExc_TypeError, "file must be a ferry File"); goto done; }
            if (file_check((FileObject *)fileo) < 0) goto done;
            e.file = ((FileObject *)fileo)->f;
        } else if (patho != Py_None) {
            if (!PyUnicode_FSConverter(patho, &pathb)) goto done;
            e.path = PyBytes_AS_STRING(pathb);
        } else {
            PyErr_SetString(PyExc_ValueError, "a read or write extent needs file= or path=");
            goto done;
        }
    }
    e.offset = off;
    e.length = len;
    if (codecs != Py_None && parse_codec_list(codecs, e.codecs, &e.ncodecs) < 0) goto done;
    if (decso != Py_None) {
        unsigned long long v = PyLong_AsUnsignedLongLong(decso);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) goto done;
        e.decoded_size = v;
    } else if (e.kind == FERRY_EXTENT_READ || e.kind == FERRY_EXTENT_WRITE) {
        if (e.ncodecs) { PyErr_SetString(PyExc_ValueError, "decoded_size is required with codecs"); goto done; }
        e.decoded_size = len;
    }
    if (dsto == Py_None) { PyErr_SetString(PyExc_ValueError, "dst is required"); goto done; }
    if (parse_buffer(dsto, e.kind != FERRY_EXTENT_WRITE, &d) < 0) goto done;
    e.dst = d.buf;
    e.dst_offset = doff;
    if (placeo != Py_None) {
        if (parse_place(placeo, &pl) < 0) goto done;
        e.place = &pl;
    }
    if (e.kind == FERRY_EXTENT_FILL) {
        size_t want = e.place ? e.place->itemsize : 1;
        if (fill.buf == NULL || (size_t)fill.len != want || want > 16) {
            PyErr_Format(PyExc_ValueError, "fill must be %zu bytes (the element size, at most 16)", want);
            goto done;
        }
        memcpy(e.fill, fill.buf, want);
        if (decso == Py_None) {
            if (e.place) {
                uint64_t tot = pl.itemsize;
                for (int i = 0; i < pl.ndim; i++) tot *= pl.count[i];
                e.decoded_size = tot;
            } else {
                e.decoded_size = len ? len : (d.buf.size > doff ? d.buf.size - doff : 0);
            }
        }
        e.length = e.decoded_size;   /* FILL: the bytes filled (the engine reads length) */
    }
    /* Bounds check of a contiguous placement here: a clear Python error. */
    if (!e.place && e.kind != FERRY_EXTENT_WRITE &&
        (doff > d.buf.size || e.decoded_size > d.buf.size - doff)) {
        PyErr_Format(PyExc_ValueError, "extent of %llu bytes at %llu does not fit dst (%zu bytes)",
                     (unsigned long long)e.decoded_size, doff, d.buf.size);
        goto done;
    }
    e.label = label;
    int rc = ferry_plan_add(self->plan, &e);
    if (rc < 0) { raise_code_msg(rc, NULL); goto done; }
    if (plan_keep(self, d.keep) < 0) { d.keep = NULL; goto done; }
    d.keep = NULL;
    if (fileo != Py_None && e.kind != FERRY_EXTENT_FILL) {
        Py_INCREF(fileo);
        if (plan_keep(self, fileo) < 0) goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    Py_XDECREF(d.keep);
    Py_XDECREF(pathb);
    if (fill.buf) PyBuffer_Release(&fill);
    return result;
}

static PyObject *Plan_clear(PlanObject *self, PyObject *noarg) {
    if (plan_check(self) < 0) return NULL;
    ferry_plan_clear(self->plan);
    if (PyList_SetSlice(self->refs, 0, PyList_GET_SIZE(self->refs), NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

static Py_ssize_t Plan_len(PlanObject *self) {
    if (!self->plan) return 0;
    return (Py_ssize_t)ferry_plan_count(self->plan);
}

static PyObject *Plan_get_file_bytes(PlanObject *self, void *c) {
    if (!self->plan) return PyLong_FromLong(0);
    return PyLong_FromUnsignedLongLong(ferry_plan_file_bytes(self->plan));
}

static PyObject *Plan_repr(PlanObject *self) {
    return PyUnicode_FromFormat("<ferry.Plan extents=%zd file_bytes=%llu>", Plan_len(self),
                                self->plan ? (unsigned long long)ferry_plan_file_bytes(self->plan) : 0ULL);
}

/* ---- chunked layouts (ferry_plan_layout) ------------------------------------- */
/* A chunk table sorted for one grid (ferry_layout_sort_table), kept in a
 * capsule so that a variable's table is built once and reused by every plan. */
typedef struct chunk_table {
    int ndim;
    uint64_t shape[FERRY_MAX_DIMS], chunks[FERRY_MAX_DIMS];
    size_t n;
    ferry_chunk *table;
    uint64_t *index;
} chunk_table;

#define CHUNK_TABLE_CAPSULE "ferry._ferry.chunk_table"

static void chunk_table_free(PyObject *cap) {
    chunk_table *t = PyCapsule_GetPointer(cap, CHUNK_TABLE_CAPSULE);
    if (!t) { PyErr_Clear(); return; }
    free(t->table);
    free(t->index);
    free(t);
}

/* a tuple/list of at most FERRY_MAX_DIMS non-negative ints; returns the count or -1 */
static int seq_to_u64(PyObject *seq, const char *what, uint64_t *out) {
    PyObject *f = PySequence_Fast(seq, what);
    if (!f) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(f);
    if (n > FERRY_MAX_DIMS) { Py_DECREF(f); PyErr_Format(PyExc_ValueError, "%s: more than %d dimensions", what, FERRY_MAX_DIMS); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long v = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(f, i));
        if (v == (unsigned long long)-1 && PyErr_Occurred()) { Py_DECREF(f); return -1; }
        out[i] = v;
    }
    Py_DECREF(f);
    return (int)n;
}

static PyObject *mod_chunk_table(PyObject *mod, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"shape", "chunks", "origins", "offsets", "lengths", "skips", NULL};
    PyObject *shapeo, *chunkso;
    Py_buffer org = {0}, off = {0}, len = {0}, skp = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOy*y*y*|y*", kwlist, &shapeo, &chunkso, &org, &off, &len, &skp))
        return NULL;
    PyObject *result = NULL;
    chunk_table *t = calloc(1, sizeof *t);
    ferry_layout l;
    memset(&l, 0, sizeof l);
    if (!t) { PyErr_NoMemory(); goto done; }
    int nd = seq_to_u64(shapeo, "shape", t->shape);
    if (nd < 0 || seq_to_u64(chunkso, "chunks", t->chunks) != nd) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "chunks must have as many items as shape");
        goto done;
    }
    t->ndim = nd;
    size_t n = (size_t)off.len / 8;
    if ((size_t)off.len != n * 8 || (size_t)len.len != n * 8 || (size_t)org.len != n * 8 * (size_t)nd ||
        (skp.buf && (size_t)skp.len != n * 4)) {
        PyErr_Format(PyExc_ValueError, "chunk_table: %zu offsets need %zu bytes of uint64 origins, %zu of uint64 "
                     "lengths and %zu of uint32 skips", n, n * 8 * (size_t)nd, n * 8, n * 4);
        goto done;
    }
    t->n = n;
    t->table = calloc(n ? n : 1, sizeof *t->table);
    t->index = calloc(n ? n : 1, sizeof *t->index);
    if (!t->table || !t->index) { PyErr_NoMemory(); goto done; }
    for (size_t i = 0; i < n; i++) {
        memcpy(&t->table[i].offset, (const char *)off.buf + 8 * i, 8);
        memcpy(&t->table[i].length, (const char *)len.buf + 8 * i, 8);
        if (skp.buf) memcpy(&t->table[i].skip, (const char *)skp.buf + 4 * i, 4);
    }
    l.ndim = nd;
    l.itemsize = 1;
    memcpy(l.shape, t->shape, sizeof l.shape);
    memcpy(l.chunks, t->chunks, sizeof l.chunks);
    int rc;
    uint64_t *origins = NULL;
    if (n && !(origins = malloc(n * 8 * (size_t)(nd ? nd : 1)))) { PyErr_NoMemory(); goto done; }
    if (n) memcpy(origins, org.buf, n * 8 * (size_t)nd);   /* aligned, and the GIL may go */
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_layout_sort_table(&l, origins, t->table, t->index, n);
    Py_END_ALLOW_THREADS
    free(origins);
    if (rc < 0) { raise_code_msg(rc, ferry_errmsg(NULL)); goto done; }
    result = PyCapsule_New(t, CHUNK_TABLE_CAPSULE, chunk_table_free);
    if (result) t = NULL;
done:
    if (t) { free(t->table); free(t->index); free(t); }
    PyBuffer_Release(&org); PyBuffer_Release(&off); PyBuffer_Release(&len);
    if (skp.buf) PyBuffer_Release(&skp);
    return result;
}

static PyObject *Plan_layout(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"dst", "shape", "chunks", "itemsize", "table", "path", "codecs", "swap", "fill",
                             "order", "selection", "native", "label", "file_size", NULL};
    PyObject *dsto, *shapeo, *chunkso, *tableo = Py_None, *patho = Py_None, *codecs = Py_None, *sel = Py_None;
    unsigned int itemsize, swap = 0;
    unsigned long long file_size = 0;
    Py_buffer fill = {0};
    const char *order = "C", *label = NULL;
    int native = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOI|OOOIy*sOpzK", kwlist, &dsto, &shapeo, &chunkso, &itemsize,
                                     &tableo, &patho, &codecs, &swap, &fill, &order, &sel, &native, &label,
                                     &file_size))
        return NULL;
    PyObject *result = NULL, *pathb = NULL;
    parsed_buf d = {.keep = NULL};
    ferry_layout l;
    memset(&l, 0, sizeof l);
    if (plan_check(self) < 0) goto done;
    int nd = seq_to_u64(shapeo, "shape", l.shape);
    if (nd < 0 || seq_to_u64(chunkso, "chunks", l.chunks) != nd) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "chunks must have as many items as shape");
        goto done;
    }
    l.ndim = nd;
    l.itemsize = itemsize;
    l.swap = swap;
    l.file_size = file_size;
    l.label = label;
    if (!strcmp(order, "C")) l.order = FERRY_ORDER_C;
    else if (!strcmp(order, "F")) l.order = FERRY_ORDER_F;
    else { PyErr_Format(PyExc_ValueError, "order must be 'C' or 'F', not %s", order); goto done; }
    if (fill.buf) {
        if ((size_t)fill.len > 16 || (fill.len && (size_t)fill.len != itemsize)) {
            PyErr_Format(PyExc_ValueError, "fill must be the %u-byte element (at most 16 bytes)", itemsize);
            goto done;
        }
        memcpy(l.fill, fill.buf, (size_t)fill.len);
    }
    if (codecs != Py_None && parse_codec_list(codecs, l.codecs, &l.ncodecs) < 0) goto done;
    if (patho != Py_None) {
        if (!PyUnicode_FSConverter(patho, &pathb)) goto done;
        l.path = PyBytes_AS_STRING(pathb);
    }
    if (tableo != Py_None) {
        chunk_table *t = PyCapsule_GetPointer(tableo, CHUNK_TABLE_CAPSULE);
        if (!t) goto done;
        if (t->ndim != nd || memcmp(t->shape, l.shape, sizeof(uint64_t) * (size_t)nd) ||
            memcmp(t->chunks, l.chunks, sizeof(uint64_t) * (size_t)nd)) {
            PyErr_SetString(PyExc_ValueError, "the chunk table was made for another shape or chunk shape");
            goto done;
        }
        l.table = t->table;
        l.table_index = t->index;
        l.ntable = t->n;
    }
    ferry_slice slices[FERRY_MAX_DIMS];
    if (sel != Py_None && parse_triples(sel, slices, nd, label) < 0) goto done;
    if (parse_buffer(dsto, 1, &d) < 0) goto done;
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_plan_layout(&l, sel != Py_None ? slices : NULL, d.buf, native ? FERRY_NATIVE : 0, self->plan);
    Py_END_ALLOW_THREADS
    if (rc < 0) { raise_code_msg((int)rc, ferry_errmsg(NULL)); goto done; }
    if (plan_keep(self, d.keep) < 0) { d.keep = NULL; goto done; }
    d.keep = NULL;
    result = PyLong_FromLongLong(rc);
done:
    Py_XDECREF(d.keep);
    Py_XDECREF(pathb);
    if (fill.buf) PyBuffer_Release(&fill);
    return result;
}

/* ---- selections ------------------------------------------------------------------ */
/* normalize_selection(shape, selection) -> (triples | None, out_shape, squeeze):
 * the one place a Python selection (None; an int, slice or Ellipsis, or a
 * tuple of them; a list of (start, stop[, step])) becomes the triples a plan
 * takes. Negative indices count from the end, slices clip as numpy's do,
 * steps must be positive, ints drop their axis (listed in squeeze). */
static PyObject *mod_normalize_selection(PyObject *mod, PyObject *args) {
    PyObject *shapeo, *sel;
    if (!PyArg_ParseTuple(args, "OO", &shapeo, &sel)) return NULL;
    uint64_t shape[FERRY_MAX_DIMS];
    int nd = seq_to_u64(shapeo, "shape", shape);
    if (nd < 0) return NULL;
    PyObject *out_shape = PyTuple_New(nd), *items = NULL, *triples = NULL, *squeeze = NULL, *result = NULL;
    if (!out_shape) return NULL;
    if (sel == Py_None) {
        for (int k = 0; k < nd; k++) {
            PyObject *v = PyLong_FromUnsignedLongLong(shape[k]);
            if (!v) goto done;
            PyTuple_SET_ITEM(out_shape, k, v);
        }
        result = Py_BuildValue("OOO", Py_None, out_shape, squeeze = PyTuple_New(0));
        goto done;
    }
    /* the items, one per axis before Ellipsis expansion */
    if (PyTuple_Check(sel)) { Py_INCREF(sel); items = sel; }
    else if (PyList_Check(sel) && PyList_GET_SIZE(sel) > 0) {
        int all_seq = 1;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(sel); i++) {
            PyObject *x = PyList_GET_ITEM(sel, i);
            if (!PyTuple_Check(x) && !PyList_Check(x)) all_seq = 0;
        }
        items = all_seq ? PyList_AsTuple(sel) : PyTuple_Pack(1, sel);
    } else items = PyTuple_Pack(1, sel);
    if (!items) goto done;
    Py_ssize_t ni = PyTuple_GET_SIZE(items), ell = -1;
    for (Py_ssize_t i = 0; i < ni; i++)
        if (PyTuple_GET_ITEM(items, i) == Py_Ellipsis) {
            if (ell >= 0) { PyErr_SetString(PyExc_IndexError, "an index can only have a single ellipsis ('...')"); goto done; }
            ell = i;
        }
    Py_ssize_t given = ell >= 0 ? ni - 1 : ni;
    if (given > nd) { PyErr_Format(PyExc_IndexError, "too many indices: %zd for %d dimensions", given, nd); goto done; }
    triples = PyList_New(0);
    squeeze = PyList_New(0);
    if (!triples || !squeeze) goto done;
    int k = 0;
    for (Py_ssize_t i = 0; i <= ni && k < nd; i++) {
        PyObject *s = i < ni ? PyTuple_GET_ITEM(items, i) : NULL;   /* past the end: whole axes */
        int fill_axes = s == Py_Ellipsis ? (int)(nd - given) : s == NULL ? nd - k : 1;
        for (int r = 0; r < fill_axes; r++, k++) {
            Py_ssize_t n = (Py_ssize_t)shape[k], start, stop, step, count;
            PyObject *sl = NULL;
            if (s && s != Py_Ellipsis && (PyTuple_Check(s) || PyList_Check(s))) {
                PyObject *t = PySequence_Tuple(s);
                if (!t) goto done;
                sl = PyObject_Call((PyObject *)&PySlice_Type, t, NULL);
                Py_DECREF(t);
                if (!sl) goto done;
            } else if (!s || s == Py_Ellipsis) {
                sl = PySlice_New(NULL, NULL, NULL);
                if (!sl) goto done;
            } else if (PySlice_Check(s)) { Py_INCREF(s); sl = s; }
            if (sl) {
                int bad = PySlice_Unpack(sl, &start, &stop, &step) < 0;
                Py_DECREF(sl);
                if (bad) goto done;
                if (step <= 0) { PyErr_SetString(PyExc_IndexError, "only positive slice steps are supported"); goto done; }
                count = PySlice_AdjustIndices(n, &start, &stop, step);
                if (count == 0) start = stop = 0;
            } else {
                PyObject *ix = PyNumber_Index(s);
                if (!ix) {
                    PyErr_Format(PyExc_TypeError, "unsupported index %R (ints and slices only)", s);
                    goto done;
                }
                Py_ssize_t v = PyLong_AsSsize_t(ix);
                Py_DECREF(ix);
                if (v == -1 && PyErr_Occurred()) goto done;
                Py_ssize_t orig = v;
                if (v < 0) v += n;
                if (v < 0 || v >= n) {
                    PyErr_Format(PyExc_IndexError, "index %zd out of range for dimension %d of size %zd", orig, k, n);
                    goto done;
                }
                start = v; stop = v + 1; step = 1; count = 1;
                PyObject *ax = PyLong_FromLong(k);
                if (!ax || PyList_Append(squeeze, ax) < 0) { Py_XDECREF(ax); goto done; }
                Py_DECREF(ax);
            }
            PyObject *tr = Py_BuildValue("(nnn)", start, stop, step), *c = PyLong_FromSsize_t(count);
            if (!tr || !c || PyList_Append(triples, tr) < 0) { Py_XDECREF(tr); Py_XDECREF(c); goto done; }
            Py_DECREF(tr);
            PyTuple_SET_ITEM(out_shape, k, c);
        }
    }
    {
        PyObject *sq = PyList_AsTuple(squeeze);
        if (!sq) goto done;
        result = Py_BuildValue("OON", triples, out_shape, sq);
    }
done:
    Py_XDECREF(items);
    Py_XDECREF(triples);
    Py_XDECREF(squeeze);
    Py_DECREF(out_shape);
    return result;
}

static PyMethodDef Plan_methods[] = {
    {"read", (PyCFunction)(void (*)(void))Plan_read, METH_VARARGS | METH_KEYWORDS,
     "read(dataset, var, dst, selection=None, native=True, stored_order=False) -> bytes placed"},
    {"read_file", (PyCFunction)(void (*)(void))Plan_read_file, METH_VARARGS | METH_KEYWORDS,
     "read_file(file, offset, length, dst, dst_offset=0)"},
    {"read_file_runs", (PyCFunction)(void (*)(void))Plan_read_file_runs, METH_VARARGS | METH_KEYWORDS,
     "read_file_runs(file, offsets, lengths, dst, dst_offsets) -> runs added: read_file for each i of "
     "offsets[i], lengths[i] (or one int), dst_offsets[i] (contiguous 1-D int64/uint64 arrays), all checked "
     "first"},
    {"write_file", (PyCFunction)(void (*)(void))Plan_write_file, METH_VARARGS | METH_KEYWORDS,
     "write_file(file, offset, length, src, src_offset=0)"},
    {"fill", (PyCFunction)(void (*)(void))Plan_fill, METH_VARARGS | METH_KEYWORDS,
     "fill(dst, value: bytes, dst_offset=0, count=None): repeat value (1..16 bytes)"},
    {"extent", (PyCFunction)(void (*)(void))Plan_extent, METH_VARARGS | METH_KEYWORDS,
     "extent(file=None, path=None, offset=0, length=0, codecs=None, decoded_size=None, dst=None, "
     "dst_offset=0, place=None, kind='read', fill=b'', label=None): append one generic extent"},
    {"layout", (PyCFunction)(void (*)(void))Plan_layout, METH_VARARGS | METH_KEYWORDS,
     "layout(dst, shape, chunks, itemsize, table=None, path=None, codecs=None, swap=0, fill=b'', order='C', "
     "selection=None, native=True, label=None, file_size=0) -> bytes placed: ferry_plan_layout of a chunked "
     "array (table: a chunk_table(); None: every chunk absent)"},
    {"clear", (PyCFunction)Plan_clear, METH_NOARGS, "remove all extents"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Plan_getset[] = {
    {"file_bytes", (getter)Plan_get_file_bytes, NULL, "bytes the plan reads from or writes to files", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods Plan_as_seq = {.sq_length = (lenfunc)Plan_len};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_repr = (reprfunc)Plan_repr,
    .tp_as_sequence = &Plan_as_seq,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(): a list of extents (reads, writes, fills) for Context.run/submit.",
    .tp_methods = Plan_methods,
    .tp_getset = Plan_getset,
    .tp_init = (initproc)Plan_init,
    .tp_new = PyType_GenericNew,
};

static void refs_users(PyObject *refs, int delta) {
    if (!refs) return;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(refs);
    PyObject **items = PySequence_Fast_ITEMS(refs);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_TypeCheck(items[i], &FileType) || PyObject_TypeCheck(items[i], &DatasetType))
            ((HandleObject *)items[i])->users += delta;
    }
}

/* ------------------------------------------------------------------------- */
/* Job                                                                        */
/* ------------------------------------------------------------------------- */
static void job_finish(JobObject *self, int64_t rc) {
    /* Called with the GIL after a wait that did not time out. */
    self->finished = 1;
    self->result = rc;
    if (rc < 0) {
        const char *m = ferry_errmsg(self->ctx->ctx);
        snprintf(self->errmsg, sizeof self->errmsg, "%s", (m && *m) ? m : ferry_strerror((int)rc));
    }
    self->path = ferry_job_path(self->job);
    if (self->refs) refs_users(self->refs, -1);
    Py_CLEAR(self->refs);
}

static PyObject *Job_wait(JobObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"timeout", NULL};
    PyObject *to = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &to)) return NULL;
    if (!self->job) { PyErr_SetString(PyExc_ValueError, "Job not started"); return NULL; }
    if (!self->finished) {
        int64_t ns = -1;
        if (to != Py_None) {
            double s = PyFloat_AsDouble(to);
            if (s == -1.0 && PyErr_Occurred()) return NULL;
            ns = s <= 0 ? 0 : (int64_t)(s * 1e9);
        }
        int64_t rc;
        Py_BEGIN_ALLOW_THREADS
        rc = ferry_job_wait(self->job, ns);
        Py_END_ALLOW_THREADS
        if (rc == FERRY_ETIMEDOUT) return raise_ctx(self->ctx->ctx, (int)rc);
        job_finish(self, rc);
    }
    if (self->result < 0) return raise_code_msg((int)self->result, self->errmsg);
    return PyLong_FromLongLong(self->result);
}

static PyObject *Job_done(JobObject *self, PyObject *noarg) {
    if (!self->job) Py_RETURN_FALSE;
    if (self->finished) Py_RETURN_TRUE;
    int d;
    Py_BEGIN_ALLOW_THREADS
    d = ferry_job_done(self->job);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(d);
}

static PyObject *Job_cancel(JobObject *self, PyObject *noarg) {
    if (self->job && !self->finished) {
        Py_BEGIN_ALLOW_THREADS
        ferry_job_cancel(self->job);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *Job_stream_wait(JobObject *self, PyObject *arg) {
    if (!self->job) { PyErr_SetString(PyExc_ValueError, "Job not started"); return NULL; }
    unsigned long long s = 0;
    if (arg != Py_None) {
        s = PyLong_AsUnsignedLongLong(arg);
        if (s == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_job_stream_wait(self->job, (void *)(uintptr_t)s);
    Py_END_ALLOW_THREADS
    if (rc < 0) return raise_ctx(self->ctx->ctx, rc);
    Py_RETURN_NONE;
}

static PyObject *Job_get_path(JobObject *self, void *c) {
    if (!self->job) return PyUnicode_FromString("auto");
    ferry_path p = self->finished ? self->path : ferry_job_path(self->job);
    return PyUnicode_FromString(ferry_path_name(p));
}

static void Job_dealloc(JobObject *self) {
    if (self->job) {
        ferry_job *j = self->job;
        self->job = NULL;
        Py_BEGIN_ALLOW_THREADS
        ferry_job_destroy(j);     /* waits for completion before the refs go */
        Py_END_ALLOW_THREADS
        if (self->refs) refs_users(self->refs, -1);
    }
    Py_XDECREF(self->refs);
    Py_XDECREF(self->ctx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Job_repr(JobObject *self) {
    if (self->finished)
        return PyUnicode_FromFormat("<ferry.Job done result=%lld path=%s>", (long long)self->result,
                                    ferry_path_name(self->path));
    return PyUnicode_FromFormat("<ferry.Job running>");
}

static PyMethodDef Job_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))Job_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout=None) -> bytes moved; FerryError on failure (code ETIMEDOUT on timeout: the job goes on)"},
    {"done", (PyCFunction)Job_done, METH_NOARGS, "True once complete (successfully or not)"},
    {"cancel", (PyCFunction)Job_cancel, METH_NOARGS, "request cancellation"},
    {"stream_wait", (PyCFunction)Job_stream_wait, METH_O,
     "stream_wait(stream): make a CUstream (int handle; 0/None: legacy default) wait on the job"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Job_getset[] = {
    {"path", (getter)Job_get_path, NULL, "which path served the job", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject JobType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Job",
    .tp_basicsize = sizeof(JobObject),
    .tp_dealloc = (destructor)Job_dealloc,
    .tp_repr = (reprfunc)Job_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A running plan (Context.submit). Keeps the plan's buffers alive until waited on or freed.",
    .tp_methods = Job_methods,
    .tp_getset = Job_getset,
};

/* ------------------------------------------------------------------------- */
/* Array                                                                      */
/* ------------------------------------------------------------------------- */
/* struct-module format for a typestr, "" if none (DLPack/array interface only). */
static void typestr_format(const char *t, char *fmt, size_t n) {
    fmt[0] = 0;
    if (strlen(t) < 3) return;
    char order = t[0] == '|' ? '=' : t[0];
    char kind = t[1];
    long sz = strtol(t + 2, NULL, 10);
    const char *c = NULL;
    switch (kind) {
    case 'b': if (sz == 1) c = "?"; break;
    case 'i': c = sz == 1 ? "b" : sz == 2 ? "h" : sz == 4 ? "i" : sz == 8 ? "q" : NULL; break;
    case 'u': c = sz == 1 ? "B" : sz == 2 ? "H" : sz == 4 ? "I" : sz == 8 ? "Q" : NULL; break;
    case 'f': c = sz == 2 ? "e" : sz == 4 ? "f" : sz == 8 ? "d" : NULL; break;
    case 'c': c = sz == 8 ? "Zf" : sz == 16 ? "Zd" : NULL; break;
    case 'S':
        if (t[2] && !strchr(t + 2, '[')) snprintf(fmt, n, "%lds", sz);
        return;
    default: break;
    }
    if (c) snprintf(fmt, n, "%c%s", order, c);
}

static void Array_dealloc(ArrayObject *self) {
    if (self->owns && self->ptr) {
        if (self->device >= 0) {
            if (self->ctx && self->ctx->ctx) {
                ferry_ctx *c = self->ctx->ctx;
                uintptr_t p = self->ptr;
                Py_BEGIN_ALLOW_THREADS
                ferry_cuda_free(c, p);
                Py_END_ALLOW_THREADS
            }
        } else if (self->pinned && self->ctx && self->ctx->ctx) {
            ferry_pinned_free(self->ctx->ctx, (void *)self->ptr);
        } else {
            ferry_host_free(NULL, (void *)self->ptr, self->alloc);
        }
    }
    self->ptr = 0;
    Py_XDECREF(self->ctx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Array_get_shape(ArrayObject *self, void *c) {
    PyObject *t = PyTuple_New(self->ndim);
    if (!t) return NULL;
    for (int i = 0; i < self->ndim; i++) PyTuple_SET_ITEM(t, i, PyLong_FromSsize_t(self->shape[i]));
    return t;
}

static PyObject *strides_or_none(ArrayObject *self) { Py_RETURN_NONE; }

static PyObject *Array_array_interface(ArrayObject *self, void *c) {
    if (self->device >= 0) {
        PyErr_SetString(PyExc_AttributeError, "device Array: use __cuda_array_interface__ or DLPack");
        return NULL;
    }
    PyObject *shape = Array_get_shape(self, NULL);
    if (!shape) return NULL;
    return Py_BuildValue("{s:i,s:N,s:s,s:(KO),s:N}", "version", 3, "shape", shape, "typestr",
                         self->typestr, "data", (unsigned long long)self->ptr, Py_False, "strides",
                         strides_or_none(self));
}

static PyObject *Array_cuda_array_interface(ArrayObject *self, void *c) {
    if (self->device < 0) {
        PyErr_SetString(PyExc_AttributeError, "host Array: use __array_interface__, the buffer protocol or DLPack");
        return NULL;
    }
    PyObject *shape = Array_get_shape(self, NULL);
    if (!shape) return NULL;
    /* "stream": None — ferry completes its copies before handing the array
     * out (blocking reads, or Job.wait), so consumers need no synchronisation. */
    return Py_BuildValue("{s:i,s:N,s:s,s:(KO),s:N,s:O}", "version", 3, "shape", shape, "typestr",
                         self->typestr, "data", (unsigned long long)self->ptr, Py_False, "strides",
                         strides_or_none(self), "stream", Py_None);
}

static int Array_getbuffer(ArrayObject *self, Py_buffer *view, int flags) {
    if (self->device >= 0) {
        PyErr_SetString(PyExc_BufferError, "device memory has no buffer protocol");
        view->obj = NULL;
        return -1;
    }
    if ((flags & PyBUF_FORMAT) == PyBUF_FORMAT && !self->format[0]) {
        PyErr_Format(PyExc_BufferError, "typestr %s has no buffer-protocol format", self->typestr);
        view->obj = NULL;
        return -1;
    }
    view->buf = (void *)self->ptr;
    view->obj = (PyObject *)self;
    Py_INCREF(self);
    view->len = (Py_ssize_t)self->nbytes;
    view->readonly = 0;
    view->internal = NULL;
    view->suboffsets = NULL;
    if ((flags & PyBUF_ND) != PyBUF_ND) {
        /* a plain run of bytes */
        view->itemsize = 1;
        view->format = NULL;
        view->ndim = 1;
        view->shape = NULL;
        view->strides = NULL;
        return 0;
    }
    view->itemsize = self->itemsize;
    view->format = (flags & PyBUF_FORMAT) == PyBUF_FORMAT ? self->format : NULL;
    view->ndim = self->ndim;
    view->shape = self->shape;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? self->strides : NULL;
    self->exports++;
    return 0;
}

static void Array_releasebuffer(ArrayObject *self, Py_buffer *view) {
    if (view->shape) self->exports--;
}

static PyBufferProcs Array_as_buffer = {
    .bf_getbuffer = (getbufferproc)Array_getbuffer,
    .bf_releasebuffer = (releasebufferproc)Array_releasebuffer,
};

/* DLPack dtype from a typestr; -1 with BufferError if it cannot be exported. */
static int dl_dtype(const char *t, DLDataType *dt) {
    dt->lanes = 1;
    if (!strcmp(t, "bfloat16")) { dt->code = kDLBfloat; dt->bits = 16; return 0; }
    if (!strcmp(t, "float8_e4m3fn")) { dt->code = kDLFloat8_e4m3fn; dt->bits = 8; return 0; }
    if (!strcmp(t, "float8_e5m2")) { dt->code = kDLFloat8_e5m2; dt->bits = 8; return 0; }
    long sz = strlen(t) >= 3 ? strtol(t + 2, NULL, 10) : 0;
    if (sz <= 0) goto bad;
    if (t[0] == '>' && sz > 1) {
        PyErr_Format(PyExc_BufferError, "DLPack needs native byte order; typestr %s is big-endian", t);
        return -1;
    }
    dt->bits = (uint8_t)(sz * 8);
    switch (t[1]) {
    case 'b': dt->code = kDLBool; return 0;
    case 'i': dt->code = kDLInt; return 0;
    case 'u': dt->code = kDLUInt; return 0;
    case 'f': dt->code = kDLFloat; return 0;
    case 'c': dt->code = kDLComplex; return 0;
    default: break;
    }
bad:
    PyErr_Format(PyExc_BufferError, "typestr %s cannot be exported through DLPack", t);
    return -1;
}

/* Legacy DLManagedTensor: one allocation holds the struct, shape and strides. */
typedef struct { DLManagedTensor m; int64_t dims[2 * FERRY_MAX_DIMS]; } dl_legacy;
typedef struct { DLManagedTensorVersioned m; int64_t dims[2 * FERRY_MAX_DIMS]; } dl_versioned;

static void dl_release_owner(void *owner) {
    if (!owner) return;
    if (Py_IsInitialized()) {
        PyGILState_STATE g = PyGILState_Ensure();
        Py_DECREF((PyObject *)owner);
        PyGILState_Release(g);
    }
}

static void dl_legacy_deleter(DLManagedTensor *self) {
    dl_release_owner(self->manager_ctx);
    free(self);
}

static void dl_versioned_deleter(DLManagedTensorVersioned *self) {
    dl_release_owner(self->manager_ctx);
    free(self);
}

static void dl_capsule_legacy_destructor(PyObject *cap) {
    /* Only an unconsumed capsule (still named "dltensor") is ours to free. */
    if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        if (m && m->deleter) m->deleter(m);
    } else {
        PyErr_Clear();
    }
}

static void dl_capsule_versioned_destructor(PyObject *cap) {
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m && m->deleter) m->deleter(m);
    } else {
        PyErr_Clear();
    }
}

static void fill_dltensor(ArrayObject *self, DLTensor *t, int64_t *dims, DLDataType dt) {
    t->data = (void *)self->ptr;
    t->device.device_type = self->device >= 0 ? kDLCUDA : kDLCPU;
    t->device.device_id = self->device >= 0 ? self->device : 0;
    t->ndim = self->ndim;
    t->dtype = dt;
    int64_t *shape = dims, *strides = dims + FERRY_MAX_DIMS;
    int64_t acc = 1;
    for (int i = self->ndim - 1; i >= 0; i--) {
        shape[i] = self->shape[i];
        strides[i] = acc;
        acc *= self->shape[i] > 0 ? self->shape[i] : 1;
    }
    t->shape = shape;
    t->strides = strides;
    t->byte_offset = 0;
}

static PyObject *Array_dlpack(ArrayObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *maxv = Py_None, *dldev = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO", kwlist, &stream, &maxv, &dldev, &copy)) return NULL;
    /* stream: ferry's data is complete when the Array is handed out, so there
     * is nothing for the consumer's stream to wait on. */
    if (dldev != Py_None) {
        int dtype = 0, did = 0;
        if (!PyArg_ParseTuple(dldev, "ii", &dtype, &did)) return NULL;
        int mine = self->device >= 0 ? kDLCUDA : kDLCPU;
        int myid = self->device >= 0 ? self->device : 0;
        if (dtype != mine || did != myid) {
            PyErr_SetString(PyExc_BufferError, "ferry.Array cannot be exported to another device (copy it)");
            return NULL;
        }
    }
    if (copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "ferry.Array exports without copying only (copy=True unsupported)");
        return NULL;
    }
    DLDataType dt;
    if (dl_dtype(self->typestr, &dt) < 0) return NULL;
    int versioned = 0;
    if (maxv != Py_None) {
        long major = 0, minor = 0;
        if (!PyArg_ParseTuple(maxv, "ll", &major, &minor)) return NULL;
        versioned = major >= 1;
    }
    if (versioned) {
        dl_versioned *v = calloc(1, sizeof *v);
        if (!v) return PyErr_NoMemory();
        v->m.version.major = 1;
        v->m.version.minor = 0;
        v->m.flags = 0;
        fill_dltensor(self, &v->m.dl_tensor, v->dims, dt);
        v->m.manager_ctx = self;
        v->m.deleter = dl_versioned_deleter;
        PyObject *cap = PyCapsule_New(&v->m, "dltensor_versioned", dl_capsule_versioned_destructor);
        if (!cap) { free(v); return NULL; }
        Py_INCREF(self);
        return cap;
    }
    dl_legacy *l = calloc(1, sizeof *l);
    if (!l) return PyErr_NoMemory();
    fill_dltensor(self, &l->m.dl_tensor, l->dims, dt);
    l->m.manager_ctx = self;
    l->m.deleter = dl_legacy_deleter;
    PyObject *cap = PyCapsule_New(&l->m, "dltensor", dl_capsule_legacy_destructor);
    if (!cap) { free(l); return NULL; }
    Py_INCREF(self);
    return cap;
}

static PyObject *Array_dlpack_device(ArrayObject *self, PyObject *noarg) {
    if (self->device >= 0) return Py_BuildValue("(ii)", kDLCUDA, self->device);
    return Py_BuildValue("(ii)", kDLCPU, 0);
}

static PyObject *Array_get_typestr(ArrayObject *self, void *c) { return PyUnicode_FromString(self->typestr); }
static PyObject *Array_get_device(ArrayObject *self, void *c) { return PyLong_FromLong(self->device); }
static PyObject *Array_get_nbytes(ArrayObject *self, void *c) { return PyLong_FromSize_t(self->nbytes); }
static PyObject *Array_get_ptr(ArrayObject *self, void *c) { return PyLong_FromUnsignedLongLong(self->ptr); }
static PyObject *Array_get_ndim(ArrayObject *self, void *c) { return PyLong_FromLong(self->ndim); }
static PyObject *Array_get_itemsize(ArrayObject *self, void *c) { return PyLong_FromSsize_t(self->itemsize); }
static PyObject *Array_get_pinned(ArrayObject *self, void *c) { return PyBool_FromLong(self->pinned); }

static PyObject *Array_repr(ArrayObject *self) {
    PyObject *shape = Array_get_shape(self, NULL);
    if (!shape) return NULL;
    PyObject *r = self->device >= 0
                      ? PyUnicode_FromFormat("<ferry.Array shape=%R typestr=%s device=cuda:%d>", shape,
                                             self->typestr, self->device)
                      : PyUnicode_FromFormat("<ferry.Array shape=%R typestr=%s device=cpu>", shape, self->typestr);
    Py_DECREF(shape);
    return r;
}

static Py_ssize_t Array_len(ArrayObject *self) {
    if (self->ndim == 0) { PyErr_SetString(PyExc_TypeError, "len() of a 0-d Array"); return -1; }
    return self->shape[0];
}

static PyMethodDef Array_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))Array_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None) -> PyCapsule"},
    {"__dlpack_device__", (PyCFunction)Array_dlpack_device, METH_NOARGS, "(device_type, device_id)"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Array_getset[] = {
    {"__array_interface__", (getter)Array_array_interface, NULL, "numpy array interface (host)", NULL},
    {"__cuda_array_interface__", (getter)Array_cuda_array_interface, NULL, "CUDA array interface v3 (device)", NULL},
    {"shape", (getter)Array_get_shape, NULL, "shape", NULL},
    {"typestr", (getter)Array_get_typestr, NULL, "numpy-style type string", NULL},
    {"device", (getter)Array_get_device, NULL, "CUDA device, -1 for host", NULL},
    {"nbytes", (getter)Array_get_nbytes, NULL, "bytes", NULL},
    {"ptr", (getter)Array_get_ptr, NULL, "address", NULL},
    {"ndim", (getter)Array_get_ndim, NULL, "dimensions", NULL},
    {"itemsize", (getter)Array_get_itemsize, NULL, "bytes per element", NULL},
    {"pinned", (getter)Array_get_pinned, NULL, "page-locked host memory", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods Array_as_seq = {.sq_length = (lenfunc)Array_len};

static PyTypeObject ArrayType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Array",
    .tp_basicsize = sizeof(ArrayObject),
    .tp_dealloc = (destructor)Array_dealloc,
    .tp_repr = (reprfunc)Array_repr,
    .tp_as_sequence = &Array_as_seq,
    .tp_as_buffer = &Array_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory ferry owns (ferry.empty): host (4 KiB-aligned) or CUDA device memory, "
              "exported through __array_interface__, __cuda_array_interface__ and DLPack.",
    .tp_methods = Array_methods,
    .tp_getset = Array_getset,
};

static PyObject *mod_empty(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"shape", "typestr", "device", "ctx", "pinned", NULL};
    PyObject *shapeo, *ctxo = Py_None;
    const char *typestr;
    int device = -1, pinned = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Os|iOp", kwlist, &shapeo, &typestr, &device, &ctxo, &pinned))
        return NULL;
    Py_ssize_t item = typestr_itemsize(typestr);
    if (item <= 0 || strlen(typestr) >= 32) { PyErr_Format(PyExc_ValueError, "unknown typestr %s", typestr); return NULL; }
    int64_t dims[FERRY_MAX_DIMS];
    int nd;
    if (PyLong_Check(shapeo)) {
        nd = 1;
        dims[0] = PyLong_AsLongLong(shapeo);
        if (dims[0] == -1 && PyErr_Occurred()) return NULL;
    } else {
        Py_ssize_t n = PySequence_Size(shapeo);
        if (n < 0) return NULL;
        if (n > FERRY_MAX_DIMS) { PyErr_SetString(PyExc_ValueError, "too many dimensions"); return NULL; }
        nd = (int)n;
        if (seq_to_i64(shapeo, "shape", dims, nd) < 0) return NULL;
    }
    /* numpy's rule: the product of the non-zero dimensions times the item size
     * fits in Py_ssize_t (also for a zero-size array), so the C-order strides
     * below cannot overflow either (UBSan once caught that for (0, 2**63-1)) */
    uint64_t span = (uint64_t)item;
    int empty_ = 0;
    for (int i = 0; i < nd; i++) {
        if (dims[i] < 0) { PyErr_SetString(PyExc_ValueError, "negative dimension"); return NULL; }
        if (dims[i] == 0) { empty_ = 1; continue; }
        if (__builtin_mul_overflow(span, (uint64_t)dims[i], &span) || span > (uint64_t)PY_SSIZE_T_MAX) {
            PyErr_SetString(PyExc_OverflowError, "array too large");
            return NULL;
        }
    }
    uint64_t total = empty_ ? 0 : span;
    ContextObject *c = NULL;
    if (device >= 0 || pinned || ctxo != Py_None) {
        c = ctx_arg(ctxo);
        if (!c) return NULL;
    }
    ArrayObject *a = PyObject_New(ArrayObject, &ArrayType);
    if (!a) return NULL;
    a->ctx = NULL; a->ptr = 0; a->nbytes = (size_t)total; a->device = device < 0 ? -1 : device;
    a->owns = 1; a->pinned = 0; a->ndim = nd; a->itemsize = item; a->exports = 0;
    snprintf(a->typestr, sizeof a->typestr, "%s", typestr);
    typestr_format(typestr, a->format, sizeof a->format);
    Py_ssize_t acc = item;
    for (int i = nd - 1; i >= 0; i--) {
        a->shape[i] = (Py_ssize_t)dims[i];
        a->strides[i] = acc;
        acc *= dims[i] > 0 ? (Py_ssize_t)dims[i] : 1;
    }
    if (c) { Py_INCREF(c); a->ctx = c; }
    size_t alloc = total ? (size_t)total : 1;
    if (device >= 0) {
        uintptr_t p = 0;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = ferry_cuda_malloc(c->ctx, device, alloc, &p);
        Py_END_ALLOW_THREADS
        if (rc < 0) { raise_ctx(c->ctx, rc); Py_DECREF(a); return NULL; }
        a->ptr = p;
    } else if (pinned) {
        void *p = NULL;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = ferry_pinned_alloc(c->ctx, alloc, &p);
        Py_END_ALLOW_THREADS
        if (rc < 0) { raise_ctx(c->ctx, rc); Py_DECREF(a); return NULL; }
        a->ptr = (uintptr_t)p;
        a->pinned = 1;
    } else {
        /* huge pages from 2 MiB on, untouched until ferry's workers fill it */
        void *p = NULL;
        if (ferry_host_alloc(NULL, alloc, &p) < 0) { Py_DECREF(a); return PyErr_NoMemory(); }
        a->ptr = (uintptr_t)p;
        a->alloc = alloc;
    }
    return (PyObject *)a;
}

/* ------------------------------------------------------------------------- */
/* Module                                                                     */
/* ------------------------------------------------------------------------- */
static PyObject *mod_version(PyObject *m, PyObject *noarg) { return PyUnicode_FromString(ferry_version()); }

static PyObject *mod_strerror(PyObject *m, PyObject *arg) {
    long c = PyLong_AsLong(arg);
    if (c == -1 && PyErr_Occurred()) return NULL;
    return PyUnicode_FromString(ferry_strerror((int)c));
}

static PyObject *mod_crc32c(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"data", "crc", NULL};
    Py_buffer b;
    unsigned long crc = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|k", kwlist, &b, &crc)) return NULL;
    uint32_t r;
    if (b.len > (1 << 16)) {
        Py_BEGIN_ALLOW_THREADS
        r = ferry_crc32c((uint32_t)crc, b.buf, (size_t)b.len);
        Py_END_ALLOW_THREADS
    } else {
        r = ferry_crc32c((uint32_t)crc, b.buf, (size_t)b.len);
    }
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(r);
}

/* hdf5_signature(path) -> byte offset of the HDF5 signature, or -1: the C
 * library decides what is netCDF-4/HDF5, the package then reads it by h5py. */
static PyObject *mod_hdf5_signature(PyObject *m, PyObject *arg) {
    PyObject *patho;
    if (!PyUnicode_FSConverter(arg, &patho)) return NULL;
    ContextObject *c = get_default_ctx();
    if (!c) { Py_DECREF(patho); return NULL; }
    int64_t at;
    Py_BEGIN_ALLOW_THREADS
    at = ferry_hdf5_signature(c->ctx, PyBytes_AS_STRING(patho));
    Py_END_ALLOW_THREADS
    Py_DECREF(patho);
    return PyLong_FromLongLong(at >= 0 ? at : -1);
}

/* Names and sizes from the library's one table (src/engine/names.c), so the
 * Python modules keep no tables of their own. */
static PyObject *mod_dtype_name(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"name", "style", NULL};
    const char *name, *style = "short";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|s", kwlist, &name, &style)) return NULL;
    ferry_name_style st;
    if (!strcmp(style, "short")) st = FERRY_NAME_SHORT;
    else if (!strcmp(style, "long")) st = FERRY_NAME_LONG;
    else if (!strcmp(style, "safetensors")) st = FERRY_NAME_SAFETENSORS;
    else return PyErr_Format(PyExc_ValueError, "unknown name style %s (short, long, safetensors)", style);
    ferry_dtype d;
    if (ferry_dtype_parse(name, &d) < 0) return PyErr_Format(PyExc_ValueError, "unknown dtype %s", name);
    const char *r = ferry_dtype_name(d, st);
    if (!r) Py_RETURN_NONE;
    return PyUnicode_FromString(r);
}

static PyObject *mod_dtype_itemsize(PyObject *m, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    ferry_dtype d;
    if (ferry_dtype_parse(name, &d) < 0) return PyErr_Format(PyExc_ValueError, "unknown dtype %s", name);
    return PyLong_FromUnsignedLong(ferry_dtype_itemsize(d));
}

static PyObject *mod_codec_name(PyObject *m, PyObject *arg) {
    uint32_t id;
    if (parse_codec_id(arg, &id) < 0) return NULL;
    return PyUnicode_FromString(ferry_codec_name((ferry_codec_id)id));
}

static PyObject *mod_size_parse(PyObject *m, PyObject *arg) {
    if (PyLong_Check(arg)) {
        long long v = PyLong_AsLongLong(arg);
        if (v == -1 && PyErr_Occurred()) return NULL;
        if (v < 0) return PyErr_Format(PyExc_ValueError, "%lld: a size cannot be negative", v);
        return PyLong_FromLongLong(v);
    }
    const char *s = PyUnicode_AsUTF8(arg);
    if (!s) return NULL;
    uint64_t v;
    if (ferry_size_parse(s, &v) < 0) {
        PyErr_SetString(PyExc_ValueError, ferry_errmsg(NULL));
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(v);
}

static PyObject *mod_kernels_source(PyObject *m, PyObject *noarg) {
    const char *s;
    Py_BEGIN_ALLOW_THREADS   /* without a fatbin the first call compiles with NVRTC */
    s = ferry_kernels_source();
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(s);
}

static PyObject *mod_kernels_status(PyObject *m, PyObject *noarg) {
    return PyUnicode_FromString(ferry_kernels_status());
}

static PyObject *mod_kernels_ready(PyObject *m, PyObject *arg) {
    long dev = PyLong_AsLong(arg);
    if (dev == -1 && PyErr_Occurred()) return NULL;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = ferry_kernels_ready((int)dev);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ok);
}

/* The PTX NVRTC makes of src/cuda/kernels.cu (whatever the build embedded),
 * or (None, why): lets tests and users check the run-time path anywhere. */
static PyObject *mod_nvrtc_ptx(PyObject *m, PyObject *noarg) {
    const char *ptx;
    Py_BEGIN_ALLOW_THREADS
    ptx = ferry_nvrtc_ptx();
    Py_END_ALLOW_THREADS
    if (ptx) return Py_BuildValue("(ss)", ptx, "");
    return Py_BuildValue("(Os)", Py_None, ferry_nvrtc_status());
}

static PyObject *mod_default_context(PyObject *m, PyObject *noarg) {
    ContextObject *c = get_default_ctx();
    if (!c) return NULL;
    Py_INCREF(c);
    return (PyObject *)c;
}

/* npy_read_many(ctx, paths, dst, stride=0, native=True, stored_order=False)
 * -> {"typestr", "shape", "fortran_order", "nbytes"}: ferry_npy_read_many (n
 * one-sample .npy files into one batch; the GIL is released while it runs). */
static PyObject *mod_npy_read_many(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"ctx", "paths", "dst", "stride", "native", "stored_order", NULL};
    ContextObject *c;
    PyObject *pathso, *dsto;
    unsigned long long stride = 0;
    int native = 1, stored = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OO|Kpp", kwlist, &ContextType, &c, &pathso, &dsto, &stride,
                                     &native, &stored))
        return NULL;
    if (ctx_check(c) < 0) return NULL;
    PyObject *seq = PySequence_Fast(pathso, "paths must be a sequence of str, bytes or os.PathLike");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **enc = PyMem_Calloc((size_t)(n ? n : 1), sizeof *enc);
    const char **paths = PyMem_Calloc((size_t)(n ? n : 1), sizeof *paths);
    PyObject *res = NULL;
    parsed_buf d;
    d.keep = NULL;
    if (!enc || !paths) { PyErr_NoMemory(); goto out; }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &enc[i])) goto out;
        paths[i] = PyBytes_AS_STRING(enc[i]);
    }
    if (parse_buffer(dsto, 1, &d) < 0) goto out;
    unsigned flags = (native ? FERRY_NATIVE : 0) | (stored ? FERRY_STORED_ORDER : 0);
    ferry_npy_info info;
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_npy_read_many(c->ctx, paths, (size_t)n, d.buf, stride, flags, &info);
    Py_END_ALLOW_THREADS
    if (rc < 0) { raise_ctx(c->ctx, (int)rc); goto out; }
    PyObject *shape = PyTuple_New(info.ndim);
    if (!shape) goto out;
    for (int k = 0; k < info.ndim; k++) PyTuple_SET_ITEM(shape, k, PyLong_FromUnsignedLongLong(info.shape[k]));
    res = Py_BuildValue("{s:s,s:N,s:O,s:K}", "typestr", info.typestr, "shape", shape, "fortran_order",
                        info.fortran_order ? Py_True : Py_False, "nbytes", (unsigned long long)info.nbytes);
out:
    Py_XDECREF(d.keep);
    for (Py_ssize_t i = 0; enc && i < n; i++) Py_XDECREF(enc[i]);
    PyMem_Free(enc);
    PyMem_Free(paths);
    Py_DECREF(seq);
    return res;
}

static PyObject *mod_nvcomp_search_dir(PyObject *m, PyObject *arg) {
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(arg, &b)) return NULL;
    ferry_nvcomp_search_dir(PyBytes_AS_STRING(b));
    Py_DECREF(b);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"nvcomp_search_dir", mod_nvcomp_search_dir, METH_O,
     "nvcomp_search_dir(dir): where libnvcomp.so.6/.so.5 may be (the wheel's lib64), before the system paths"},
    {"version", mod_version, METH_NOARGS, "the library's version string"},
    {"strerror", mod_strerror, METH_O, "strerror(code) -> name of a return code"},
    {"crc32c", (PyCFunction)(void (*)(void))mod_crc32c, METH_VARARGS | METH_KEYWORDS,
     "crc32c(data, crc=0) -> CRC-32C of a contiguous buffer (continue from crc)"},
    {"default_context", mod_default_context, METH_NOARGS, "the process-wide Context, created on first use"},
    {"chunk_table", (PyCFunction)(void (*)(void))mod_chunk_table, METH_VARARGS | METH_KEYWORDS,
     "chunk_table(shape, chunks, origins, offsets, lengths, skips=None) -> a sorted chunk table for "
     "Plan.layout (uint64 origins: n x ndim element coordinates; uint64 offsets, lengths; uint32 skips)"},
    {"normalize_selection", mod_normalize_selection, METH_VARARGS,
     "normalize_selection(shape, selection) -> (triples or None, out_shape, squeeze_axes)"},
    {"dtype_name", (PyCFunction)(void (*)(void))mod_dtype_name, METH_VARARGS | METH_KEYWORDS,
     "dtype_name(name, style='short') -> the dtype's name in style short ('f4'), long ('float32') or "
     "safetensors ('F32'; None where safetensors has none); name may be of any style"},
    {"dtype_itemsize", mod_dtype_itemsize, METH_O, "dtype_itemsize(name) -> bytes per element (0: varies)"},
    {"codec_name", mod_codec_name, METH_O, "codec_name(id or name) -> the codec's name"},
    {"size_parse", mod_size_parse, METH_O,
     "size_parse(s) -> bytes: '8M'/'8MiB' = 8*2**20, '5GB' = 5*10**9 (ferry_size_parse); ints pass through"},
    {"kernels_source", mod_kernels_source, METH_NOARGS,
     "kernels_source() -> 'embedded fatbin', 'NVRTC' or 'none' (GPU byteswaps then run on the CPU)"},
    {"kernels_status", mod_kernels_status, METH_NOARGS,
     "kernels_status() -> '' when GPU kernels are available, else why NVRTC could not compile them"},
    {"kernels_ready", mod_kernels_ready, METH_O,
     "kernels_ready(device) -> True when the GPU kernel image loads on that CUDA device"},
    {"nvrtc_ptx", mod_nvrtc_ptx, METH_NOARGS,
     "nvrtc_ptx() -> (ptx, '') compiled by NVRTC from src/cuda/kernels.cu, or (None, why)"},
    {"hdf5_signature", mod_hdf5_signature, METH_O,
     "hdf5_signature(path) -> byte offset of the HDF5 (netCDF-4) signature, or -1 when there is none"},
    {"empty", (PyCFunction)(void (*)(void))mod_empty, METH_VARARGS | METH_KEYWORDS,
     "empty(shape, typestr, device=-1, ctx=None, pinned=False) -> Array "
     "(host: 4 KiB-aligned; device: cuMemAlloc; pinned: page-locked host memory)"},
    {"npy_read_many", (PyCFunction)(void (*)(void))mod_npy_read_many, METH_VARARGS | METH_KEYWORDS,
     "npy_read_many(ctx, paths, dst, stride=0, native=True, stored_order=False) -> dict: n one-sample .npy "
     "files of one dtype and shape into dst (file i at byte i*stride; 0: packed), every header checked "
     "(FerryError naming a file whose dtype or shape differs); returns typestr, shape, fortran_order, nbytes"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_ferry",
    "ferry's C extension: contexts, files, datasets, plans, jobs and arrays (see docs/python-extension.md).",
    -1, module_methods, NULL, NULL, NULL, NULL};

/* FerryError(code, message) is how the library raises it; FerryError(message)
 * and FerryError(message=...) must work too, because torch's DataLoader
 * re-raises a worker's exception in the main process as type(e)(text) (once the
 * code was taken for the message and str() was empty). __reduce__ keeps code,
 * message and every keyword attribute (path=, ...) across pickling. */
static const char ferror_src[] =
    "class FerryError(Exception):\n"
    "    \"\"\"An error from the ferry library: .code (a negative ferry_status or -errno; None\n"
    "    when made from a message alone), .message (also str()), and any keyword attributes\n"
    "    (e.g. path=). FerryError(code, message), FerryError(message) and\n"
    "    FerryError(message=..., code=...) all work; pickling keeps every attribute.\"\"\"\n"
    "    def __init__(self, *args, **attrs):\n"
    "        code = attrs.pop('code', None)\n"
    "        message = attrs.pop('message', None)\n"
    "        rest = list(args)\n"
    "        if code is None and rest and type(rest[0]) is int:\n"
    "            code = rest.pop(0)\n"
    "        if message is None and rest:\n"
    "            message = rest.pop(0)\n"
    "        message = '' if message is None else str(message)\n"
    "        super().__init__(code, message, *rest)\n"
    "        self.code = code\n"
    "        self.message = message\n"
    "        self.__dict__.update(attrs)\n"
    "    def __str__(self):\n"
    "        return self.message if self.message or self.code is None else 'ferry error %s' % (self.code,)\n"
    "    def __reduce__(self):\n"
    "        return (type(self), (self.code, self.message), dict(self.__dict__))\n"
    "FerryError.__module__ = 'ferry'\n";

static int make_ferry_error(PyObject *m) {
    PyObject *g = PyDict_New();
    if (!g) return -1;
    PyObject *name = PyUnicode_FromString("ferry._ferry");
    if (!name || PyDict_SetItemString(g, "__builtins__", PyEval_GetBuiltins()) < 0 ||
        PyDict_SetItemString(g, "__name__", name) < 0) {
        Py_XDECREF(name);
        Py_DECREF(g);
        return -1;
    }
    Py_DECREF(name);
    PyObject *r = PyRun_String(ferror_src, Py_file_input, g, g);
    if (!r) { Py_DECREF(g); return -1; }
    Py_DECREF(r);
    FerryError = PyDict_GetItemString(g, "FerryError");
    Py_XINCREF(FerryError);
    Py_DECREF(g);
    if (!FerryError) return -1;
    Py_INCREF(FerryError);
    return PyModule_AddObject(m, "FerryError", FerryError);
}

static int add_thin2_bindings(PyObject *m);   /* the marked block at the end of this file */

PyMODINIT_FUNC PyInit__ferry(void) {
    PyTypeObject *types[] = {&ContextType, &FileType, &DatasetType, &PlanType, &JobType, &ArrayType, &BufRefType};
    BufRefType.tp_name = "ferry._ferry._BufRef";
    BufRefType.tp_basicsize = sizeof(BufRefObject);
    BufRefType.tp_dealloc = (destructor)BufRef_dealloc;
    BufRefType.tp_flags = Py_TPFLAGS_DEFAULT;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (PyType_Ready(types[i]) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    if (make_ferry_error(m) < 0) goto fail;
    struct { const char *name; PyTypeObject *t; } exported[] = {
        {"Context", &ContextType}, {"File", &FileType}, {"Dataset", &DatasetType},
        {"Plan", &PlanType}, {"Job", &JobType}, {"Array", &ArrayType}};
    for (size_t i = 0; i < sizeof exported / sizeof exported[0]; i++) {
        Py_INCREF(exported[i].t);
        if (PyModule_AddObject(m, exported[i].name, (PyObject *)exported[i].t) < 0) {
            Py_DECREF(exported[i].t);
            goto fail;
        }
    }
    PyObject *paths = Py_BuildValue("(ssss)", "auto", "cufile", "staged", "host");
    if (!paths || PyModule_AddObject(m, "PATHS", paths) < 0) { Py_XDECREF(paths); goto fail; }
    if (PyModule_AddStringConstant(m, "__version__", FERRY_VERSION_STRING) < 0) goto fail;
    struct { const char *name; long v; } consts[] = {
        {"EINVAL", FERRY_EINVAL}, {"ENOMEM", FERRY_ENOMEM}, {"EIO", FERRY_EIO}, {"ESHORT", FERRY_ESHORT},
        {"EFORMAT", FERRY_EFORMAT}, {"EUNSUPPORTED", FERRY_EUNSUPPORTED}, {"ENOCUDA", FERRY_ENOCUDA},
        {"ECUDA", FERRY_ECUDA}, {"ENOCUFILE", FERRY_ENOCUFILE}, {"ECUFILE", FERRY_ECUFILE},
        {"ECODEC", FERRY_ECODEC}, {"ECHECKSUM", FERRY_ECHECKSUM}, {"ENOTFOUND", FERRY_ENOTFOUND},
        {"ETIMEDOUT", FERRY_ETIMEDOUT}, {"ECANCELED", FERRY_ECANCELED}, {"EPATH", FERRY_EPATH}, {"ENOFORMAT", FERRY_ENOFORMAT},
        {"CODEC_NONE", FERRY_CODEC_NONE}, {"CODEC_ZLIB", FERRY_CODEC_ZLIB}, {"CODEC_GZIP", FERRY_CODEC_GZIP},
        {"CODEC_ZSTD", FERRY_CODEC_ZSTD}, {"CODEC_LZ4", FERRY_CODEC_LZ4}, {"CODEC_BLOSC", FERRY_CODEC_BLOSC},
        {"CODEC_SHUFFLE", FERRY_CODEC_SHUFFLE}, {"CODEC_CRC32C", FERRY_CODEC_CRC32C},
        {"CODEC_FLETCHER32", FERRY_CODEC_FLETCHER32}, {"CODEC_BYTESWAP", FERRY_CODEC_BYTESWAP},
        {"MAX_DIMS", FERRY_MAX_DIMS}, {"MAX_CODECS", FERRY_MAX_CODECS}};
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].v) < 0) goto fail;
    if (add_thin2_bindings(m) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}

/* ---- thin2 bindings (issue 10 item 3): the dtype table and the NVRTC search
 * directory. Kept in one block until _ferry.c is split by type (split2);
 * then they move to the module's file. ------------------------------------ */

static PyObject *mod_nvrtc_search_dir(PyObject *m, PyObject *arg) {
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(arg, &b)) return NULL;
    ferry_nvrtc_search_dir(PyBytes_AS_STRING(b));
    Py_DECREF(b);
    Py_RETURN_NONE;
}

/* format_detect(path) -> "npy", "safetensors", "netcdf3", "zarr" or "hdf5":
 * ferry_format_detect, the sniffer ferry_dataset_open uses (FerryError when none). */
static PyObject *mod_format_detect(PyObject *m, PyObject *arg) {
    PyObject *patho;
    if (!PyUnicode_FSConverter(arg, &patho)) return NULL;
    ContextObject *c = get_default_ctx();
    if (!c) { Py_DECREF(patho); return NULL; }
    const char *fmt = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_format_detect(c->ctx, PyBytes_AS_STRING(patho), &fmt);
    Py_END_ALLOW_THREADS
    Py_DECREF(patho);
    if (rc < 0) return raise_ctx(c->ctx, rc);
    return PyUnicode_FromString(fmt);
}

static PyMethodDef thin2_methods[] = {
    {"format_detect", mod_format_detect, METH_O,
     "format_detect(path) -> 'npy', 'safetensors', 'netcdf3', 'zarr' or 'hdf5' (ferry_format_detect; "
     "FerryError ENOFORMAT when none)"},
    {"nvrtc_search_dir", mod_nvrtc_search_dir, METH_O,
     "nvrtc_search_dir(dir): where libnvrtc.so.13/.12 may be (the CUDA wheels' lib), after FERRY_NVRTC and "
     "before the loader's path (ferry_nvrtc_search_dir)"},
    {NULL, NULL, 0, NULL}};

/* DTYPES: the library's dtype table (src/engine/names.c), one tuple
 * (short, long, safetensors or None, typestr or None, bits) per type, so the
 * Python modules translate to torch / numpy dtypes without a table of their own. */
static PyObject *dtype_table(void) {
    PyObject *t = PyTuple_New(FERRY_DT_OTHER - FERRY_DT_BOOL);
    if (!t) return NULL;
    for (int d = FERRY_DT_BOOL; d < FERRY_DT_OTHER; d++) {
        const char *st = ferry_dtype_name((ferry_dtype)d, FERRY_NAME_SAFETENSORS);
        const char *ts = ferry_dtype_name((ferry_dtype)d, FERRY_NAME_TYPESTR);
        PyObject *row = Py_BuildValue("(sszzI)", ferry_dtype_name((ferry_dtype)d, FERRY_NAME_SHORT),
                                      ferry_dtype_name((ferry_dtype)d, FERRY_NAME_LONG), st, ts,
                                      (unsigned)ferry_dtype_bits((ferry_dtype)d));
        if (!row) { Py_DECREF(t); return NULL; }
        PyTuple_SET_ITEM(t, d - FERRY_DT_BOOL, row);
    }
    return t;
}

static int add_thin2_bindings(PyObject *m) {
    if (PyModule_AddFunctions(m, thin2_methods) < 0) return -1;
    PyObject *t = dtype_table();
    if (!t || PyModule_AddObject(m, "DTYPES", t) < 0) { Py_XDECREF(t); return -1; }
    return 0;
}
