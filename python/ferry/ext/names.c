/*
 * names.c — Python names of the library's enums, both ways: path, direct and
 * decode policies, codecs, dtypes and sizes, all through the library's one
 * table (src/base/names.c), so the bindings and the Python modules keep no
 * tables of their own.
 */
#include "ferry_ext.h"

int parse_path_name(PyObject *o, ferry_path *out) {
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

int parse_direct_name(PyObject *o, ferry_direct *out) {
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

/* decode= of run/submit: None, "auto", "gpu" or "cpu" (ferry_decode_policy) */
int parse_decode_name(const char *s, int *out) {
    ferry_decode_policy d = FERRY_DECODE_AUTO;
    if (s && ferry_decode_policy_parse(s, &d) < 0) {
        PyErr_Format(PyExc_ValueError, "unknown decode %s (auto, gpu, cpu)", s);
        return -1;
    }
    *out = (int)d;
    return 0;
}

int parse_codec_id(PyObject *o, uint32_t *out) {
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

/* Names and sizes from the library's one table (src/base/names.c), so the
 * Python modules keep no tables of their own. */
PyObject *mod_dtype_name(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"name", "style", NULL};
    const char *name, *style = "short";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|s", kwlist, &name, &style)) return NULL;
    ferry_name_style st;
    if (!strcmp(style, "short")) st = FERRY_NAME_SHORT;
    else if (!strcmp(style, "long")) st = FERRY_NAME_LONG;
    else if (!strcmp(style, "safetensors")) st = FERRY_NAME_SAFETENSORS;
    else if (!strcmp(style, "typestr")) st = FERRY_NAME_TYPESTR;
    else return PyErr_Format(PyExc_ValueError, "unknown name style %s (short, long, safetensors, typestr)", style);
    ferry_dtype d;
    if (ferry_dtype_parse(name, &d) < 0) return PyErr_Format(PyExc_ValueError, "unknown dtype %s", name);
    const char *r = ferry_dtype_name(d, st);
    if (!r) Py_RETURN_NONE;
    return PyUnicode_FromString(r);
}

PyObject *mod_dtype_itemsize(PyObject *m, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    ferry_dtype d;
    if (ferry_dtype_parse(name, &d) < 0) return PyErr_Format(PyExc_ValueError, "unknown dtype %s", name);
    return PyLong_FromUnsignedLong(ferry_dtype_itemsize(d));
}

PyObject *mod_codec_name(PyObject *m, PyObject *arg) {
    uint32_t id;
    if (parse_codec_id(arg, &id) < 0) return NULL;
    return PyUnicode_FromString(ferry_codec_name((ferry_codec_id)id));
}

PyObject *mod_size_parse(PyObject *m, PyObject *arg) {
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

/* DTYPES: the library's dtype table (src/base/names.c), one tuple
 * (short, long, safetensors or None, typestr or None, bits) per type, so the
 * Python modules translate to torch / numpy dtypes without a table of their own. */
PyObject *dtype_table(void) {
    PyObject *t = PyTuple_New(FERRY_DT_OTHER - FERRY_DT_BOOL);
    if (!t) return NULL;
    for (int d = FERRY_DT_BOOL; d < FERRY_DT_OTHER; d++) {
        ferry_dtype dt = (ferry_dtype)d;
        PyObject *row = Py_BuildValue("(sszzI)", ferry_dtype_name(dt, FERRY_NAME_SHORT),
                                      ferry_dtype_name(dt, FERRY_NAME_LONG), ferry_dtype_name(dt, FERRY_NAME_SAFETENSORS),
                                      ferry_dtype_name(dt, FERRY_NAME_TYPESTR), (unsigned)ferry_dtype_bits(dt));
        if (!row) { Py_DECREF(t); return NULL; }
        PyTuple_SET_ITEM(t, d - FERRY_DT_BOOL, row);
    }
    return t;
}

/* hdf5_filter_codec(filter_id, cd_values, itemsize) -> (codec name, param), or
 * None for a filter ferry has no codec for (ferry_codec_of_hdf5_filter) */
PyObject *mod_hdf5_filter_codec(PyObject *m, PyObject *args) {
    unsigned int id, itemsize;
    PyObject *vals;
    if (!PyArg_ParseTuple(args, "IOI", &id, &vals, &itemsize)) return NULL;
    PyObject *seq = PySequence_Fast(vals, "cd_values must be a sequence of ints");
    if (!seq) return NULL;
    uint32_t cd[8];
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > 8) n = 8;   /* no filter ferry knows reads past its first values */
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == (unsigned long)-1 && PyErr_Occurred()) { Py_DECREF(seq); return NULL; }
        cd[i] = (uint32_t)v;
    }
    Py_DECREF(seq);
    ferry_codec c;
    if (ferry_codec_of_hdf5_filter(id, cd, (size_t)n, itemsize, &c) < 0) Py_RETURN_NONE;
    return Py_BuildValue("(sI)", ferry_codec_name((ferry_codec_id)c.id), (unsigned)c.param);
}
