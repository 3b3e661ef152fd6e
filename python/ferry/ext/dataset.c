/*
 * dataset.c — ferry._ferry.Dataset (a ferry_dataset): a file's or store's
 * parsed metadata (variables, attributes, dimensions, groups), and
 * npy_read_many (n one-sample .npy files into one batch).
 */
#include "ferry_ext.h"

/* ------------------------------------------------------------------------- */
/* Dataset                                                                    */
/* ------------------------------------------------------------------------- */

int ds_check(DatasetObject *d) {
    if (!d->ds) { PyErr_SetString(PyExc_ValueError, "ferry Dataset is closed"); return -1; }
    return 0;
}

static int Dataset_init(DatasetObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"ctx", "path", "format", "group", "allow_outside", "refs_json", NULL};
    PyObject *ctxo, *patho;
    const char *format = NULL, *group = NULL, *refs_json = NULL;
    int allow_outside = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO&|zzpz", kwlist, &ctxo, PyUnicode_FSConverter, &patho,
                                     &format, &group, &allow_outside, &refs_json))
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
    o.allow_outside = allow_outside;
    o.refs_json = refs_json;   /* the str's UTF-8, alive while args are: the call copies it */
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
/* the file a directory (or a directory URL) resolved to: ferry_dataset_path */
static PyObject *Dataset_get_opened(DatasetObject *self, void *c) {
    if (ds_check(self) < 0) return NULL;
    const char *p = ferry_dataset_path(self->ds);
    return PyUnicode_DecodeFSDefault(p ? p : "");
}
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
/* ferry_dataset_store_info: what the parser found about the store (Zarr) */
static PyObject *Dataset_get_store_info(DatasetObject *self, void *c) {
    if (ds_check(self) < 0) return NULL;
    ferry_store_info si;
    int rc = ferry_dataset_store_info(self->ds, &si);
    if (rc < 0) return raise_code_msg(rc, ferry_errmsg(NULL));
    return Py_BuildValue("{s:i,s:O,s:O}", "zarr_format", si.zarr_format, "consolidated",
                         si.consolidated ? Py_True : Py_False, "is_array", si.is_array ? Py_True : Py_False);
}

/* the library's one name table (ferry_dtype_name, src/base/names.c) */
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

/* A list with one(info) for each variable: what variables(), names() and
 * table() build, each with its own per-variable object. */
static PyObject *var_list(DatasetObject *self, PyObject *(*one)(const ferry_var_info *)) {
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
        PyObject *o = one(&vi);
        if (!o) { Py_DECREF(l); return NULL; }
        PyList_SET_ITEM(l, i, o);
    }
    return l;
}

static PyObject *Dataset_variables(DatasetObject *self, PyObject *noarg) { return var_list(self, var_dict); }

static PyObject *var_name(const ferry_var_info *v) { return PyUnicode_FromString(v->name ? v->name : ""); }

/* Only the names: what ferry.open() needs up front (a 1,000-tensor checkpoint
 * opens without building 1,000 info dicts). */
static PyObject *Dataset_names(DatasetObject *self, PyObject *noarg) { return var_list(self, var_name); }

static PyObject *var_row(const ferry_var_info *v) {
    int nd = v->ndim < 0 ? 0 : (v->ndim > FERRY_MAX_DIMS ? FERRY_MAX_DIMS : v->ndim);
    PyObject *shape = u64_tuple(v->shape, nd);
    if (!shape) return NULL;
    return Py_BuildValue("(ssNKKss)", v->name ? v->name : "", v->typestr ? v->typestr : "", shape,
                         (unsigned long long)v->data_offset, (unsigned long long)v->data_bytes,
                         v->path ? v->path : "", v->attrs_json ? v->attrs_json : "{}");
}

/* One tuple per variable, (name, typestr, shape, data_offset, data_bytes, path,
 * attrs): what ferry.checkpoint needs to describe a file's tensors, without building a
 * dict of every field per tensor (a 1,000-tensor checkpoint opens in a third of the time). */
static PyObject *Dataset_table(DatasetObject *self, PyObject *noarg) { return var_list(self, var_row); }

static PyObject *var_meta(const ferry_var_info *v) {
    int nd = v->ndim < 0 ? 0 : (v->ndim > FERRY_MAX_DIMS ? FERRY_MAX_DIMS : v->ndim);
    PyObject *shape = u64_tuple(v->shape, nd);
    PyObject *chunks = shape ? u64_tuple(v->chunks, nd) : NULL;
    if (!chunks) { Py_XDECREF(shape); return NULL; }
    PyObject *error = v->error ? PyUnicode_DecodeUTF8(v->error, (Py_ssize_t)strlen(v->error), "backslashreplace")
                               : (Py_INCREF(Py_None), Py_None);
    if (!error) { Py_DECREF(shape); Py_DECREF(chunks); return NULL; }
    return Py_BuildValue("(ssNNsssKN)", v->name ? v->name : "", v->typestr ? v->typestr : "", shape, chunks,
                         v->dims_json ? v->dims_json : "null", v->attrs_json ? v->attrs_json : "{}",
                         v->codecs ? v->codecs : "", (unsigned long long)v->data_bytes, error);
}

/* One tuple per variable, (name, typestr, shape, chunks, dims, attrs, codecs,
 * data_bytes, error), dims and attrs as JSON: what an xarray open needs of every
 * variable in one call, without the dict of every field variables() builds. */
static PyObject *Dataset_meta(DatasetObject *self, PyObject *noarg) { return var_list(self, var_meta); }

/* Index of a variable given by name or index; raises KeyError/IndexError. */
int ds_selection(DatasetObject *self, int vi, PyObject *sel, ferry_slice *slices, ferry_slice **sp) {
    *sp = NULL;
    if (sel == Py_None) return 0;
    ferry_var_info info;
    memset(&info, 0, sizeof info);
    if (ferry_dataset_var(self->ds, vi, &info) < 0) {
        raise_code_msg(FERRY_EINVAL, ferry_errmsg(NULL));
        return -1;
    }
    if (parse_triples(sel, slices, info.ndim, info.name) < 0) return -1;
    *sp = slices;
    return 0;
}

int ds_var_index(DatasetObject *self, PyObject *var) {
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

/* fill(index) -> bytes | None: ferry_dataset_fill, the one decoder of Zarr fill values */
static PyObject *Dataset_fill(DatasetObject *self, PyObject *arg) {
    if (ds_check(self) < 0) return NULL;
    long li = PyLong_AsLong(arg);
    if (li == -1 && PyErr_Occurred()) return NULL;
    int index = li < 0 || li > INT32_MAX ? -1 : (int)li;   /* -1: refused by ferry_dataset_var */
    ferry_var_info vi;
    int rc = ferry_dataset_var(self->ds, index, &vi);
    if (rc < 0) return raise_ctx(self->ctx->ctx, rc);
    PyObject *b = PyBytes_FromStringAndSize(NULL, vi.itemsize);
    if (!b) return NULL;
    rc = ferry_dataset_fill(self->ds, index, PyBytes_AS_STRING(b), vi.itemsize);
    if (rc <= 0) {
        Py_DECREF(b);
        if (rc < 0) return raise_ctx(self->ctx->ctx, rc);
        Py_RETURN_NONE;
    }
    return b;
}

/* read_strings(var, selection=None, threads=0) -> list of str: a FERRY_DT_STRING
 * variable's selection in C order (ferry_dataset_read_strings, the GIL released),
 * each element decoded as UTF-8 (bytes that are not: surrogate escapes, as os.fsdecode). */
static PyObject *Dataset_read_strings(DatasetObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"var", "selection", "threads", NULL};
    PyObject *var, *sel = Py_None;
    int threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Oi", kwlist, &var, &sel, &threads)) return NULL;
    if (ds_check(self) < 0) return NULL;
    int vi = ds_var_index(self, var);
    if (vi < 0) return NULL;
    ferry_slice slices[FERRY_MAX_DIMS], *sp;
    if (ds_selection(self, vi, sel, slices, &sp) < 0) return NULL;
    ferry_run_opts ro;
    memset(&ro, 0, sizeof ro);
    ro.threads = threads < 0 ? 0 : threads;
    ferry_strings st;
    int64_t rc;
    self->users++;   /* not closed under the read */
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_dataset_read_strings(self->ds, vi, sp, &ro, &st);
    Py_END_ALLOW_THREADS
    self->users--;
    if (rc < 0) { ferry_strings_free(&st); return raise_ctx(self->ctx->ctx, (int)rc); }
    PyObject *l = PyList_New((Py_ssize_t)st.count);
    for (uint64_t i = 0; l && i < st.count; i++) {
        PyObject *u = PyUnicode_DecodeUTF8(st.data + st.offsets[i], (Py_ssize_t)(st.offsets[i + 1] - st.offsets[i]),
                                           "surrogateescape");
        if (!u) { Py_CLEAR(l); break; }
        PyList_SET_ITEM(l, (Py_ssize_t)i, u);
    }
    ferry_strings_free(&st);
    return l;
}

static PyMethodDef Dataset_methods[] = {
    {"variables", (PyCFunction)Dataset_variables, METH_NOARGS, "list of dicts, one per variable"},
    {"names", (PyCFunction)Dataset_names, METH_NOARGS, "list of the variables' names, in file order"},
    {"meta", (PyCFunction)Dataset_meta, METH_NOARGS,
     "list of (name, typestr, shape, chunks, dims_json, attrs_json, codecs, data_bytes, error) tuples, in file "
     "order"},
    {"table", (PyCFunction)Dataset_table, METH_NOARGS,
     "list of (name, typestr, shape, data_offset, data_bytes, path, attrs) tuples, in file order"},
    {"variable", (PyCFunction)Dataset_variable, METH_O, "variable(name_or_index) -> dict"},
    {"find", (PyCFunction)Dataset_find, METH_O, "find(name) -> index (KeyError if missing)"},
    {"fill", (PyCFunction)Dataset_fill, METH_O,
     "fill(index) -> the fill element (itemsize bytes, little-endian) or None (ferry_dataset_fill)"},
    {"read_strings", (PyCFunction)(void (*)(void))Dataset_read_strings, METH_VARARGS | METH_KEYWORDS,
     "read_strings(var, selection=None, threads=0) -> list of str: a string variable's selection "
     "[(start, stop, step)], C order (ferry_dataset_read_strings)"},
    {"close", (PyCFunction)Dataset_close, METH_NOARGS, "close the dataset"},
    {"__enter__", Handle_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Dataset_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Dataset_getset[] = {
    {"format", (getter)Dataset_get_format, NULL, "npy, safetensors, netcdf3, zarr, hdf5", NULL},
    {"path", (getter)Dataset_get_path, NULL, "the path opened", NULL},
    {"opened", (getter)Dataset_get_opened, NULL,
     "the file opened: path, or the checkpoint file a directory (or directory URL) resolved to", NULL},
    {"attrs", (getter)Dataset_get_attrs, NULL, "global attributes (JSON)", NULL},
    {"dims", (getter)Dataset_get_dims, NULL, "dimensions (JSON)", NULL},
    {"groups", (getter)Dataset_get_groups, NULL, "child groups (JSON array)", NULL},
    {"closed", (getter)Dataset_get_closed, NULL, "True after close()", NULL},
    {"store_info", (getter)Dataset_get_store_info, NULL,
     "{'zarr_format': 2, 3 or 0, 'consolidated': bool, 'is_array': bool} (ferry_dataset_store_info)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject DatasetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Dataset",
    .tp_basicsize = sizeof(DatasetObject),
    .tp_dealloc = (destructor)Dataset_dealloc,
    .tp_repr = (reprfunc)Dataset_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Dataset(ctx, path, format=None, group=None, allow_outside=False, refs_json=None): parsed metadata "
              "of a file or store (refs_json: a kerchunk reference set's JSON, read instead of path)",
    .tp_methods = Dataset_methods,
    .tp_getset = Dataset_getset,
    .tp_init = (initproc)Dataset_init,
    .tp_new = PyType_GenericNew,
};

/* npy_read_many(ctx, paths, dst, stride=0, native=True, stored_order=False, reread=False)
 * -> {"typestr", "shape", "fortran_order", "nbytes"}: ferry_npy_read_many (n
 * one-sample .npy files into one batch; the GIL is released while it runs). */
PyObject *mod_npy_read_many(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"ctx", "paths", "dst", "stride", "native", "stored_order", "reread", NULL};
    ContextObject *c;
    PyObject *pathso, *dsto;
    unsigned long long stride = 0;
    int native = 1, stored = 0, reread = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OO|Kppp", kwlist, &ContextType, &c, &pathso, &dsto, &stride,
                                     &native, &stored, &reread))
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
    unsigned flags = (native ? FERRY_NATIVE : 0) | (stored ? FERRY_STORED_ORDER : 0) | (reread ? FERRY_REREAD : 0);
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
