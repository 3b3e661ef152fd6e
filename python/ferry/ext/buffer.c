/*
 * buffer.c — memory arguments ("buffers"): objects with
 * __cuda_array_interface__, the buffer protocol, __array_interface__, a
 * ferry.Array or a (ptr, nbytes, device) tuple become a ferry_buf plus the
 * reference that keeps the memory alive (a _BufRef for buffer-protocol exports).
 */
#include "ferry_ext.h"

/* ------------------------------------------------------------------------- */
/* Buffers                                                                    */
/* ------------------------------------------------------------------------- */
void BufRef_dealloc(BufRefObject *self) {
    if (self->has_view) PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Itemsize of a numpy-style typestr ("<f4", "|S10", "<M8[ns]") or of the
 * names ferry uses for types numpy lacks; 0 if unknown (or below a byte). */
Py_ssize_t typestr_itemsize(const char *t) {
    if (!t) return 0;
    if (t[0] != '<' && t[0] != '>' && t[0] != '|' && t[0] != '=') {
        /* a type numpy lacks, by the library's table ("bfloat16", "float8_e4m3fnuz") */
        ferry_dtype d;
        return ferry_dtype_parse_style(t, FERRY_NAME_TYPESTR, &d) == 0 ? (Py_ssize_t)ferry_dtype_itemsize(d) : 0;
    }
    if (strlen(t) < 3) return 0;
    char *end = NULL;
    long n = strtol(t + 2, &end, 10);
    if (end == t + 2 || n <= 0) return 0;
    if (t[1] == 'U') n *= 4;   /* numpy's unicode: UCS-4 code points */
    return (Py_ssize_t)n;
}


/* ------------------------------------------------------------------------- */
/* Layouts: what a memory argument is, read once (issue 37: Python asks       */
/* buffer_layout instead of re-deriving it from each protocol)                */
/* ------------------------------------------------------------------------- */
typedef struct {
    const char *source;   /* the protocol it came through (buffer_layout's "source") */
    uintptr_t ptr;
    size_t nbytes;
    int device;           /* -1 host; >= 0 CUDA ordinal; -2 CUDA memory, ordinal unknown */
    int readonly, contiguous, ndim, has_strides;
    char typestr[32];     /* "" when the protocol does not say */
    long long shape[64], strides[64];   /* strides in bytes */
    PyObject *stream;     /* __cuda_array_interface__ v3 "stream" (new reference) or NULL */
    PyObject *keep;       /* new reference keeping the memory alive */
} layout;

static void layout_clear(layout *L) {
    Py_CLEAR(L->stream);
    Py_CLEAR(L->keep);
}

/* C order: strides (when given) are those of a C-contiguous array of the shape */
static void set_contiguity(layout *L, long long item) {
    L->contiguous = 1;
    if (!L->has_strides || L->nbytes == 0) return;
    long long expect = item;
    for (int i = L->ndim - 1; i >= 0; i--) {
        if (L->shape[i] > 1 && L->strides[i] != expect) { L->contiguous = 0; return; }
        expect *= L->shape[i];
    }
}

static int layout_shape_bytes(layout *L, long long item) {
    unsigned long long total = (unsigned long long)item;
    for (int i = 0; i < L->ndim; i++)
        if (L->shape[i] < 0 || __builtin_mul_overflow(total, (unsigned long long)L->shape[i], &total)) {
            PyErr_SetString(PyExc_OverflowError, "array size overflows");
            return -1;
        }
    L->nbytes = (size_t)total;
    return 0;
}

/* An __array_interface__ / __cuda_array_interface__ dict. */
static int from_interface(PyObject *d, const char *which, layout *L) {
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
    const char *ts = PyUnicode_AsUTF8(typestr);
    if (!ts) return -1;
    Py_ssize_t item = typestr_itemsize(ts);
    if (item <= 0) { PyErr_Format(PyExc_TypeError, "%s: unknown typestr %s", which, ts); return -1; }
    snprintf(L->typestr, sizeof L->typestr, "%s", ts);
    Py_ssize_t nd = PySequence_Size(shape);
    if (nd < 0) return -1;
    if (nd > 64) { PyErr_SetString(PyExc_ValueError, "too many dimensions"); return -1; }
    L->ndim = (int)nd;
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *it = PySequence_GetItem(shape, i);
        if (!it) return -1;
        L->shape[i] = PyLong_AsLongLong(it);
        Py_DECREF(it);
        if (L->shape[i] == -1 && PyErr_Occurred()) return -1;
    }
    if (layout_shape_bytes(L, item) < 0) return -1;
    if (strides && strides != Py_None) {
        if (PySequence_Size(strides) != nd) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: strides/shape mismatch", which);
            return -1;
        }
        L->has_strides = 1;
        for (Py_ssize_t i = 0; i < nd; i++) {
            PyObject *it = PySequence_GetItem(strides, i);
            if (!it) return -1;
            L->strides[i] = PyLong_AsLongLong(it);
            Py_DECREF(it);
            if (L->strides[i] == -1 && PyErr_Occurred()) return -1;
        }
    }
    set_contiguity(L, item);
    L->ptr = (uintptr_t)p;
    L->readonly = ro;
    PyObject *st = PyDict_GetItemString(d, "stream");
    if (st && st != Py_None) { Py_INCREF(st); L->stream = st; }
    return 0;
}

/* A DLPack capsule's tensor (torch's CPU tensors have no other protocol). */
static int from_dlpack(PyObject *obj, layout *L) {
    PyObject *cap = PyObject_CallMethod(obj, "__dlpack__", NULL);
    if (!cap) return -1;
    DLManagedTensor *m = PyCapsule_IsValid(cap, "dltensor") ? PyCapsule_GetPointer(cap, "dltensor") : NULL;
    if (!m) {
        Py_DECREF(cap);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "__dlpack__ did not return a DLPack tensor");
        return -1;
    }
    DLTensor *t = &m->dl_tensor;
    if (t->ndim < 0 || t->ndim > 64 || t->dtype.lanes != 1 || t->dtype.bits % 8) {
        Py_DECREF(cap);
        PyErr_SetString(PyExc_TypeError, "a DLPack tensor ferry cannot describe (vector lanes, bits, rank)");
        return -1;
    }
    int item = t->dtype.bits / 8;
    const char *bo = item == 1 ? "|" : (PY_LITTLE_ENDIAN ? "<" : ">");
    switch (t->dtype.code) {
    case kDLInt: snprintf(L->typestr, sizeof L->typestr, "%si%d", bo, item); break;
    case kDLUInt: snprintf(L->typestr, sizeof L->typestr, "%su%d", bo, item); break;
    case kDLFloat: snprintf(L->typestr, sizeof L->typestr, "%sf%d", bo, item); break;
    case kDLComplex: snprintf(L->typestr, sizeof L->typestr, "%sc%d", bo, item); break;
    case kDLBool: snprintf(L->typestr, sizeof L->typestr, "|b1"); break;
    case kDLBfloat: snprintf(L->typestr, sizeof L->typestr, "bfloat16"); break;
    case kDLFloat8_e4m3fn: snprintf(L->typestr, sizeof L->typestr, "float8_e4m3fn"); break;
    case kDLFloat8_e5m2: snprintf(L->typestr, sizeof L->typestr, "float8_e5m2"); break;
    default: snprintf(L->typestr, sizeof L->typestr, "|V%d", item); break;
    }
    L->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) L->shape[i] = (long long)t->shape[i];
    if (layout_shape_bytes(L, item) < 0) { Py_DECREF(cap); return -1; }
    if (t->strides) {
        L->has_strides = 1;
        for (int i = 0; i < t->ndim; i++) L->strides[i] = (long long)t->strides[i] * item;   /* elements -> bytes */
    }
    set_contiguity(L, item);
    L->ptr = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
    L->device = t->device.device_type == kDLCUDA ? t->device.device_id
              : t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost ? -1 : -3;
    if (L->device == -3) {
        Py_DECREF(cap);
        PyErr_Format(PyExc_TypeError, "DLPack device type %d: ferry reads into CPU or CUDA memory",
                     (int)t->device.device_type);
        return -1;
    }
    L->keep = cap;      /* the capsule's destructor calls the producer's deleter */
    return 0;
}

/* What obj is, through the first protocol it speaks: a (ptr, nbytes, device)
 * tuple, ferry.Array, __cuda_array_interface__, the buffer protocol (with
 * __array_interface__'s typestr where the object has one), __array_interface__,
 * DLPack. Sets L->keep. full: a layout for buffer_layout, which also asks the
 * driver which device a __cuda_array_interface__ pointer is on and numpy which
 * type a buffer holds (parse_buffer, on every plan's hot path, needs neither:
 * the engine finds the device itself). -1 with a Python error when obj is no
 * memory. */
static int describe(PyObject *obj, layout *L, int full) {
    memset(L, 0, sizeof *L);
    L->device = -1;
    L->contiguous = 1;
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
        L->source = "tuple";
        L->ptr = (uintptr_t)p;
        L->nbytes = (size_t)n;
        L->device = dev < 0 ? -1 : (int)dev;
        snprintf(L->typestr, sizeof L->typestr, "|u1");
        L->ndim = 1;
        L->shape[0] = (long long)n;
        Py_INCREF(obj);
        L->keep = obj;
        return 0;
    }
    if (PyObject_TypeCheck(obj, &ArrayType)) {
        ArrayObject *a = (ArrayObject *)obj;
        L->source = "array";
        L->ptr = a->ptr;
        L->nbytes = a->nbytes;
        L->device = a->device < 0 ? -1 : a->device;
        snprintf(L->typestr, sizeof L->typestr, "%s", a->typestr);
        L->ndim = a->ndim;
        for (int i = 0; i < a->ndim; i++) L->shape[i] = a->shape[i];
        Py_INCREF(obj);
        L->keep = obj;
        return 0;
    }
    PyObject *cai = PyObject_GetAttrString(obj, "__cuda_array_interface__");
    if (cai) {
        int rc = from_interface(cai, "__cuda_array_interface__", L);
        Py_DECREF(cai);
        if (rc < 0) { layout_clear(L); return -1; }
        L->source = "cuda_array_interface";
        /* the pointer's own device (the driver knows it); -2 where it cannot say */
        ContextObject *c = full && L->nbytes ? get_default_ctx() : NULL;
        int d = c ? ferry_cuda_device_of(c->ctx, L->ptr) : -1;
        L->device = d >= 0 ? d : -2;
        PyErr_Clear();
        Py_INCREF(obj);
        L->keep = obj;
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();
    if (PyObject_CheckBuffer(obj)) {
        BufRefObject *r = PyObject_New(BufRefObject, &BufRefType);
        if (!r) return -1;
        r->has_view = 0;
        if (PyObject_GetBuffer(obj, &r->view, PyBUF_STRIDES) < 0) { Py_DECREF(r); return -1; }
        r->has_view = 1;
        Py_buffer *v = &r->view;
        L->source = "buffer";
        L->keep = (PyObject *)r;
        L->ptr = (uintptr_t)v->buf;
        L->nbytes = (size_t)v->len;
        L->readonly = v->readonly;
        L->contiguous = PyBuffer_IsContiguous(v, 'C');
        L->ndim = v->ndim > 64 ? 64 : v->ndim;
        for (int i = 0; i < L->ndim; i++) {
            L->shape[i] = v->shape ? v->shape[i] : (long long)(v->len / (v->itemsize ? v->itemsize : 1));
            if (v->strides) { L->strides[i] = v->strides[i]; L->has_strides = 1; }
        }
        /* numpy's typestr where the object has one (no struct format asked: numpy
         * exports datetime64 and other types the struct module lacks as bytes) */
        PyObject *ai = full ? PyObject_GetAttrString(obj, "__array_interface__") : NULL;
        PyObject *ts = ai && PyDict_Check(ai) ? PyDict_GetItemString(ai, "typestr") : NULL;
        const char *t = ts ? PyUnicode_AsUTF8(ts) : NULL;
        if (t) snprintf(L->typestr, sizeof L->typestr, "%s", t);
        else if (v->itemsize == 1) snprintf(L->typestr, sizeof L->typestr, "|u1");
        else snprintf(L->typestr, sizeof L->typestr, "|V%zd", v->itemsize);
        Py_XDECREF(ai);
        PyErr_Clear();
        return 0;
    }
    PyObject *ai = PyObject_GetAttrString(obj, "__array_interface__");
    if (ai) {
        int rc = from_interface(ai, "__array_interface__", L);
        Py_DECREF(ai);
        if (rc < 0) { layout_clear(L); return -1; }
        L->source = "array_interface";
        L->device = -1;
        Py_INCREF(obj);
        L->keep = obj;
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();
    if (PyObject_HasAttrString(obj, "__dlpack__")) {
        if (from_dlpack(obj, L) < 0) { layout_clear(L); return -1; }
        L->source = "dlpack";
        return 0;
    }
    PyErr_Format(PyExc_TypeError,
                 "expected memory: an object with __cuda_array_interface__, the buffer protocol, "
                 "__array_interface__, DLPack, or a (ptr, nbytes, device) tuple; got %.100s",
                 Py_TYPE(obj)->tp_name);
    return -1;
}

/* Turn obj into a ferry_buf. want_write: destinations must be writable.
 * On success *out holds a new reference in out->keep. */
int parse_buffer(PyObject *obj, int want_write, parsed_buf *out) {
    out->keep = NULL;
    layout L;
    if (describe(obj, &L, 0) < 0) return -1;
    if (want_write && L.readonly) {
        PyErr_Format(PyExc_ValueError, "destination is read-only (%s)", L.source);
        layout_clear(&L);
        return -1;
    }
    if (!L.contiguous) {
        PyErr_Format(PyExc_ValueError, "memory must be C-contiguous (%s)", L.source);
        layout_clear(&L);
        return -1;
    }
    out->buf = L.device == -1 ? ferry_host_buf((void *)L.ptr, L.nbytes)
                              : ferry_cuda_buf(L.device >= 0 ? L.device : -1, L.ptr, L.nbytes);
    out->keep = L.keep;
    L.keep = NULL;
    layout_clear(&L);
    return 0;
}

/* buffer_layout(obj) -> dict: what parse_buffer reads of a memory argument. */
PyObject *mod_buffer_layout(PyObject *m, PyObject *obj) {
    layout L;
    if (describe(obj, &L, 1) < 0) return NULL;
    PyObject *shape = PyTuple_New(L.ndim), *strides = NULL, *r = NULL;
    if (!shape) goto done;
    for (int i = 0; i < L.ndim; i++) PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(L.shape[i]));
    if (L.has_strides) {
        if (!(strides = PyTuple_New(L.ndim))) goto done;
        for (int i = 0; i < L.ndim; i++) PyTuple_SET_ITEM(strides, i, PyLong_FromLongLong(L.strides[i]));
    } else {
        Py_INCREF(Py_None);
        strides = Py_None;
    }
    PyObject *dev = L.device == -2 ? (Py_INCREF(Py_None), Py_None) : PyLong_FromLong(L.device);
    r = Py_BuildValue("{s:s,s:s,s:N,s:N,s:O,s:O,s:N,s:O,s:K,s:K}", "source", L.source,
                      "typestr", L.typestr, "shape", shape, "strides", strides,
                      "contiguous", L.contiguous ? Py_True : Py_False,
                      "readonly", L.readonly ? Py_True : Py_False, "device", dev,
                      "stream", L.stream ? L.stream : Py_None,
                      "ptr", (unsigned long long)L.ptr, "nbytes", (unsigned long long)L.nbytes);
    shape = strides = NULL;     /* stolen by N */
done:
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    layout_clear(&L);
    return r;
}

PyTypeObject BufRefType;   /* filled in by PyInit__ferry */
