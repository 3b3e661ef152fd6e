/*
 * plan.c — ferry._ferry.Plan (a ferry_plan): the extents a Context runs —
 * dataset reads, plain file reads and writes, runs, fills and generic extents
 * with codecs and placements. Chunked layouts are in layout.c, selections in
 * selection.c.
 */
#include "ferry_ext.h"

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

int plan_check(PlanObject *p) {
    if (!p->plan || !p->refs) { PyErr_SetString(PyExc_ValueError, "Plan not initialised"); return -1; }
    if (p->busy) { PyErr_SetString(PyExc_RuntimeError, "Plan is being submitted by another thread"); return -1; }
    return 0;
}

/* Append a reference to keep alive; steals `o`. */
int plan_keep(PlanObject *p, PyObject *o) {
    int rc = PyList_Append(p->refs, o);
    Py_DECREF(o);
    return rc;
}

/* selection: None, or a sequence of (start, stop[, step]) */
int parse_triples(PyObject *sel, ferry_slice *out, int ndim, const char *name) {
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
    ferry_slice slices[FERRY_MAX_DIMS], *sp;
    if (ds_selection(ds, vi, sel, slices, &sp) < 0) return NULL;
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
int column_parse(PyObject *o, const char *fn, const char *what, int scalar_ok, u64_column *c) {
    memset(c, 0, sizeof *c);
    if (scalar_ok && PyLong_Check(o)) {
        c->scalar = PyLong_AsUnsignedLongLong(o);
        if (c->scalar == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        return 0;
    }
    if (PyObject_GetBuffer(o, &c->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s must be a contiguous 1-D int64/uint64 array%s",
                     fn, what, scalar_ok ? " or an int" : "");
        return -1;
    }
    c->have = 1;
    const char *fmt = c->view.format ? c->view.format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
    int ok = c->view.ndim == 1 && c->view.itemsize == 8 && fmt[0] && !fmt[1] && strchr("qlnQLN", fmt[0]);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a contiguous 1-D int64/uint64 array "
                     "(got format '%s', %d dimensions, %zd-byte items)", fn, what,
                     c->view.format ? c->view.format : "B", c->view.ndim, c->view.itemsize);
        PyBuffer_Release(&c->view);
        c->have = 0;
        return -1;
    }
    c->is_signed = strchr("qln", fmt[0]) != NULL;
    return 0;
}

Py_ssize_t column_len(const u64_column *c) { return c->have ? c->view.shape[0] : -1; }

/* Value i; -1 (and *neg set) for a negative signed item. */
unsigned long long column_at(const u64_column *c, Py_ssize_t i, int *neg) {
    if (!c->have) return c->scalar;
    int64_t v;
    memcpy(&v, (const char *)c->view.buf + 8 * i, 8);
    if (c->is_signed && v < 0) *neg = 1;
    return (unsigned long long)v;
}

void column_release(u64_column *c) {
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

/* add_runs: runs of several files, each naming its file by index (idxo; NULL:
 * every run reads files[0], as read_file_runs does). The runs enter the plan in the order given, whichever file
 * they read: a shuffled batch's rows drawn from several shards then reach
 * the engine in destination order, so a packed staging buffer holds rows
 * that are adjacent in the batch and goes to the device in one copy. Grouped
 * by file (one read_file_runs per shard), the rows of one staging buffer
 * land every few rows apart and each buffer needed the scatter kernel
 * (stand-in driver, 256 shuffled 150,528-byte rows of 4 shards: 32 kernel
 * launches and 64 copies a batch, against none and 32). */
static PyObject *add_runs(PlanObject *self, PyObject *fileso, PyObject *idxo, PyObject *offo, PyObject *leno,
                          PyObject *dsto, PyObject *doffo) {
    if (plan_check(self) < 0) return NULL;
    PyObject *files = PySequence_Fast(fileso, "read_files_runs: files must be a sequence of File");
    if (!files) return NULL;
    Py_ssize_t nf = PySequence_Fast_GET_SIZE(files);
    for (Py_ssize_t i = 0; i < nf; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(files, i);
        if (!PyObject_TypeCheck(o, &FileType)) {
            PyErr_Format(PyExc_TypeError, "read_files_runs: files[%zd] is %s, not a File", i, Py_TYPE(o)->tp_name);
            Py_DECREF(files);
            return NULL;
        }
        if (file_check((FileObject *)o) < 0) { Py_DECREF(files); return NULL; }
    }
    u64_column idx, offs, lens, doffs;
    memset(&idx, 0, sizeof idx);   /* no index column: scalar 0, the first file */
    memset(&offs, 0, sizeof offs);
    memset(&lens, 0, sizeof lens);
    memset(&doffs, 0, sizeof doffs);
    PyObject *ret = NULL;
    parsed_buf d = {.keep = NULL};
    const char *fn = idxo ? "read_files_runs" : "read_file_runs";
    if (idxo && column_parse(idxo, fn, "file_index", 0, &idx) < 0) { Py_DECREF(files); return NULL; }
    if (column_parse(offo, fn, "offsets", 0, &offs) < 0 || column_parse(leno, fn, "lengths", 1, &lens) < 0 ||
        column_parse(doffo, fn, "dst_offsets", 0, &doffs) < 0)
        goto out;
    Py_ssize_t n = column_len(&offs);
    if ((idx.have && column_len(&idx) != n) || (lens.have && column_len(&lens) != n) || column_len(&doffs) != n) {
        PyErr_Format(PyExc_ValueError, "%s: %zd file_index, %zd offsets, %zd lengths, %zd "
                     "dst_offsets (all must be equal; lengths may be one int)",
                     idxo ? "read_files_runs" : "read_file_runs", idx.have ? column_len(&idx) : n, n,
                     lens.have ? column_len(&lens) : n, column_len(&doffs));
        goto out;
    }
    if (parse_buffer(dsto, 1, &d) < 0) goto out;
    unsigned long long o, l, doff;
    for (int pass = 0; pass < 2; pass++) {   /* pass 0 checks every run; pass 1 checks again (the arrays
                                                are the caller's and could change under us) and adds */
        for (Py_ssize_t i = 0; i < n; i++) {
            int neg = 0;
            unsigned long long k = column_at(&idx, i, &neg);
            if (neg || k >= (unsigned long long)nf) {
                PyErr_Format(PyExc_IndexError, "read_files_runs: run %zd: file_index %lld outside the %zd files",
                             i, neg ? -1LL : (long long)k, nf);
                goto out;
            }
            FileObject *f = (FileObject *)PySequence_Fast_GET_ITEM(files, (Py_ssize_t)k);
            if (run_check(f, i, &offs, &lens, &doffs, d.buf.size, &o, &l, &doff) < 0) goto out;
            if (pass == 0) continue;
            int rc = ferry_plan_read(self->plan, f->f, o, l, d.buf, doff);
            if (rc < 0) { raise_ctx(f->ctx->ctx, rc); goto out; }
        }
    }
    if (n > 0) {
        PyObject *keep = d.keep;
        d.keep = NULL;
        if (plan_keep(self, keep) < 0) goto out;
        PyObject *keepf = PySequence_Tuple(files);   /* the Files live as long as the plan, */
        if (!keepf || plan_keep(self, keepf) < 0) goto out;   /* whatever the caller's list becomes */
    }
    ret = PyLong_FromSsize_t(n);
out:
    Py_XDECREF(d.keep);
    Py_DECREF(files);
    column_release(&idx);
    column_release(&offs);
    column_release(&lens);
    column_release(&doffs);
    return ret;
}

static PyObject *Plan_read_file_runs(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"file", "offsets", "lengths", "dst", "dst_offsets", NULL};
    FileObject *f;
    PyObject *offo, *leno, *dsto, *doffo;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOOO", kwlist, &FileType, &f, &offo, &leno, &dsto, &doffo))
        return NULL;
    PyObject *files = PyTuple_Pack(1, (PyObject *)f);
    if (!files) return NULL;
    PyObject *r = add_runs(self, files, NULL, offo, leno, dsto, doffo);
    Py_DECREF(files);
    return r;
}

static PyObject *Plan_read_files_runs(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"files", "file_index", "offsets", "lengths", "dst", "dst_offsets", NULL};
    PyObject *fileso, *idxo, *offo, *leno, *dsto, *doffo;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO", kwlist, &fileso, &idxo, &offo, &leno, &dsto, &doffo))
        return NULL;
    return add_runs(self, fileso, idxo, offo, leno, dsto, doffo);
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

/* codecs: a sequence of names / ids or (name / id, param) pairs, in decoding order */
int parse_codec_list(PyObject *codecs, ferry_codec *out, int *nout) {
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
int seq_to_i64(PyObject *seq, const char *what, int64_t *out, int n) {
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

/* wait_stream(stream, device=-1): ferry_plan_wait_stream (stream: a CUstream
 * handle as an int; None or 0: the legacy default stream) */
static PyObject *Plan_wait_stream(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"stream", "device", NULL};
    PyObject *so;
    int device = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|i", kwlist, &so, &device)) return NULL;
    if (plan_check(self) < 0) return NULL;
    unsigned long long s = 0;
    if (so != Py_None) {
        s = PyLong_AsUnsignedLongLong(so);
        if (s == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    }
    int rc = ferry_plan_wait_stream(self->plan, device, (void *)(uintptr_t)s);
    if (rc < 0) return raise_code_msg(rc, ferry_errmsg(NULL));
    Py_RETURN_NONE;
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

static PyMethodDef Plan_methods[] = {
    {"read", (PyCFunction)(void (*)(void))Plan_read, METH_VARARGS | METH_KEYWORDS,
     "read(dataset, var, dst, selection=None, native=True, stored_order=False) -> bytes placed"},
    {"read_file", (PyCFunction)(void (*)(void))Plan_read_file, METH_VARARGS | METH_KEYWORDS,
     "read_file(file, offset, length, dst, dst_offset=0)"},
    {"read_file_runs", (PyCFunction)(void (*)(void))Plan_read_file_runs, METH_VARARGS | METH_KEYWORDS,
     "read_file_runs(file, offsets, lengths, dst, dst_offsets) -> runs added: read_file for each i of "
     "offsets[i], lengths[i] (or one int), dst_offsets[i] (contiguous 1-D int64/uint64 arrays), all checked "
     "first"},
    {"read_files_runs", (PyCFunction)(void (*)(void))Plan_read_files_runs, METH_VARARGS | METH_KEYWORDS,
     "read_files_runs(files, file_index, offsets, lengths, dst, dst_offsets) -> runs added: read_file_runs "
     "over several files, run i reading files[file_index[i]]; the runs keep the order given"},
    {"write_file", (PyCFunction)(void (*)(void))Plan_write_file, METH_VARARGS | METH_KEYWORDS,
     "write_file(file, offset, length, src, src_offset=0)"},
    {"fill", (PyCFunction)(void (*)(void))Plan_fill, METH_VARARGS | METH_KEYWORDS,
     "fill(dst, value: bytes, dst_offset=0, count=None): repeat value (1..16 bytes)"},
    {"extent", (PyCFunction)(void (*)(void))Plan_extent, METH_VARARGS | METH_KEYWORDS,
     "extent(file=None, path=None, offset=0, length=0, codecs=None, decoded_size=None, dst=None, "
     "dst_offset=0, place=None, kind='read', fill=b'', label=None): append one generic extent"},
    {"read_array", (PyCFunction)(void (*)(void))Plan_read_array, METH_VARARGS | METH_KEYWORDS,
     "read_array(file, offset, shape, itemsize, dst, selection=None, order='C', label=None, exact=False) -> "
     "bytes placed: "
     "selection [(start, stop, step)] of an array stored as is at offset of file (ferry_plan_array)"},
    {"layout", (PyCFunction)(void (*)(void))Plan_layout, METH_VARARGS | METH_KEYWORDS,
     "layout(dst, shape, chunks, itemsize, table=None, path=None, codecs=None, swap=0, fill=b'', order='C', "
     "selection=None, native=True, label=None, file_size=0) -> bytes placed: ferry_plan_layout of a chunked "
     "array (table: a chunk_table(); None: every chunk absent)"},
    {"read_rows", (PyCFunction)(void (*)(void))Plan_read_rows, METH_VARARGS | METH_KEYWORDS,
     "read_rows(sources, selections, rows, dsts, dst_offsets) -> bytes placed: for each row index rows[i] "
     "(outer) and each source k (inner: a layout() or a (Dataset, var) pair), the selection k (ndim triples, "
     "None: all) with its first dimension at rows[i], into dsts[k] at byte offset dst_offsets[i * K + k]; "
     "int64 arrays; every row and offset is checked before any is planned (rows.c)"},
    {"wait_stream", (PyCFunction)(void (*)(void))Plan_wait_stream, METH_VARARGS | METH_KEYWORDS,
     "wait_stream(stream, device=-1): jobs of this plan first wait for the work queued on a CUstream "
     "(int; None/0: legacy default, 1 legacy, 2 per-thread) before submit (ferry_plan_wait_stream)"},
    {"clear", (PyCFunction)Plan_clear, METH_NOARGS, "remove all extents and streams"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Plan_getset[] = {
    {"file_bytes", (getter)Plan_get_file_bytes, NULL, "bytes the plan reads from or writes to files", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods Plan_as_seq = {.sq_length = (lenfunc)Plan_len};

PyTypeObject PlanType = {
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
