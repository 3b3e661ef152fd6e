/*
 * array.c — ferry._ferry.Array and empty(): memory ferry owns (host, pinned or
 * CUDA device), exported through __array_interface__,
 * __cuda_array_interface__ (v3), the buffer protocol and DLPack.
 */
#include "ferry_ext.h"

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
    /* numpy's typestrs start with a byte order; bfloat16 and the float8
     * types have none and no numpy dtype: numpy would say only "data type
     * 'bfloat16' not understood", so say where such an array can go. */
    if (!strchr("<>|", self->typestr[0])) {
        PyErr_Format(PyExc_TypeError,
                     "a %s array has no numpy dtype: read it with torch.from_dlpack(a) (or any DLPack "
                     "consumer), or convert it in torch (.float())",
                     self->typestr);
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

PyTypeObject ArrayType = {
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

PyObject *mod_empty(PyObject *m, PyObject *args, PyObject *kw) {
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
