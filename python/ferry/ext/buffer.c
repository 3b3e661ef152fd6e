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

/* Turn obj into a ferry_buf. want_write: destinations must be writable.
 * On success *out holds a new reference in out->keep. */
int parse_buffer(PyObject *obj, int want_write, parsed_buf *out) {
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

PyTypeObject BufRefType;   /* filled in by PyInit__ferry */
