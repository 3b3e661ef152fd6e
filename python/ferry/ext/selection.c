/*
 * selection.c — normalize_selection(): the one place a Python selection
 * becomes the (start, stop, step) triples a plan takes.
 */
#include "ferry_ext.h"

/* ---- selections ------------------------------------------------------------------ */
/* normalize_selection(shape, selection) -> (triples | None, out_shape, squeeze):
 * the one place a Python selection (None; an int, slice or Ellipsis, or a
 * tuple of them; a list of (start, stop[, step])) becomes the triples a plan
 * takes. Negative indices count from the end, slices clip as numpy's do,
 * steps must be positive, ints drop their axis (listed in squeeze). */
PyObject *mod_normalize_selection(PyObject *mod, PyObject *args) {
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
