/*
 * file.c — ferry._ferry.File (a ferry_file): pread, pwrite, sync, truncate,
 * cached, with errors that name the file.
 */
#include "ferry_ext.h"

/* ------------------------------------------------------------------------- */
/* File                                                                       */
/* ------------------------------------------------------------------------- */

int file_check(FileObject *f) {
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

PyTypeObject FileType = {
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
