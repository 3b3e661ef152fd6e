/* perm.c — order_take: ferry_perm_take (src/formats/perm.c) for ferry.torch's TokenDataset,
 * whose epoch order (a keyed permutation evaluated per position) is computed for a group of
 * batches in one call. */
#include "ferry_ext.h"

static int int64_column(PyObject *o, const char *what, int writable, Py_buffer *v) {
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "order_take: %s must be a contiguous%s 1-D int64 array", what,
                     writable ? " writable" : "");
        return -1;
    }
    const char *fmt = v->format ? v->format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
    if (v->ndim != 1 || v->itemsize != 8 || !fmt[0] || fmt[1] || !strchr("qln", fmt[0])) {
        PyErr_Format(PyExc_TypeError, "order_take: %s must be a contiguous 1-D int64 array (got format "
                     "'%s', %d dimensions)", what, v->format ? v->format : "B", v->ndim);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

/* order_take(n, seed, epoch, shuffle, positions, out): out[i] = the epoch order at
 * positions[i] (ferry_perm_take). One call per group of batches; the GIL is released for
 * long calls. */
PyObject *mod_order_take(PyObject *m, PyObject *args) {
    unsigned long long n;
    long long seed, epoch;
    int shuffle;
    PyObject *po, *oo;
    if (!PyArg_ParseTuple(args, "KLLpOO:order_take", &n, &seed, &epoch, &shuffle, &po, &oo)) return NULL;
    ferry_perm ord;
    if (ferry_perm_init(&ord, n, seed, epoch, shuffle) < 0)
        return raise_code_msg(FERRY_EINVAL, "order_take: n must be below 2**63");
    Py_buffer pv, ov;
    if (int64_column(po, "positions", 0, &pv) < 0) return NULL;
    if (int64_column(oo, "out", 1, &ov) < 0) { PyBuffer_Release(&pv); return NULL; }
    if (ov.shape[0] != pv.shape[0]) {
        PyBuffer_Release(&pv);
        PyBuffer_Release(&ov);
        return PyErr_Format(PyExc_ValueError, "order_take: %zd positions, out has %zd", pv.shape[0], ov.shape[0]);
    }
    size_t count = (size_t)pv.shape[0];
    int64_t rc;
    if (count >= 4096) {
        Py_BEGIN_ALLOW_THREADS
        rc = ferry_perm_take(&ord, pv.buf, count, ov.buf);
        Py_END_ALLOW_THREADS
    } else {
        rc = ferry_perm_take(&ord, pv.buf, count, ov.buf);
    }
    PyBuffer_Release(&pv);
    PyBuffer_Release(&ov);
    if (rc < 0) {
        char msg[96];
        snprintf(msg, sizeof msg, "order_take: a position outside [0, %llu)", n);
        return raise_code_msg((int)rc, msg);
    }
    Py_RETURN_NONE;
}
