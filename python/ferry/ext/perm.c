/* perm.c — order_take: ferry_perm_take (src/formats/perm.c) for ferry.torch's TokenDataset,
 * whose epoch order (a keyed permutation evaluated per position) is computed for a group of
 * batches in one call; plan_windows: a group's token windows planned in one call (order,
 * file, offset and destination of every window computed here, no array per window in
 * Python). */
#include "ferry_ext.h"
#include "formats/rows.h"
#include <errno.h>

static int int64_column_of(const char *fn, PyObject *o, const char *what, int writable, Py_buffer *v) {
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s must be a contiguous%s 1-D int64 array", fn, what,
                     writable ? " writable" : "");
        return -1;
    }
    const char *fmt = v->format ? v->format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
    if (v->ndim != 1 || v->itemsize != 8 || !fmt[0] || fmt[1] || !strchr("qln", fmt[0])) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a contiguous 1-D int64 array (got format "
                     "'%s', %d dimensions)", fn, what, v->format ? v->format : "B", v->ndim);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static int int64_column(PyObject *o, const char *what, int writable, Py_buffer *v) {
    return int64_column_of("order_take", o, what, writable, v);
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

/* row_runs(starts, nrows, ids, out) -> number of runs: the runs of a batch's rows over
 * shards (ferry_row_runs): out is a writable C-contiguous (4, len(ids)) int64 array whose
 * rows receive each run's shard, row inside the shard, length and first batch position;
 * the first `count` columns are the runs. A row outside [0, nrows): IndexError. */
PyObject *mod_row_runs(PyObject *m, PyObject *args) {
    PyObject *so, *io, *oo;
    unsigned long long nrows;
    if (!PyArg_ParseTuple(args, "OKOO:row_runs", &so, &nrows, &io, &oo)) return NULL;
    Py_buffer sv, iv, ov;
    if (int64_column_of("row_runs", so, "starts", 0, &sv) < 0) return NULL;
    if (int64_column_of("row_runs", io, "ids", 0, &iv) < 0) { PyBuffer_Release(&sv); return NULL; }
    if (PyObject_GetBuffer(oo, &ov, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&sv);
        PyBuffer_Release(&iv);
        PyErr_Clear();
        return PyErr_Format(PyExc_TypeError, "row_runs: out must be a writable C-contiguous (4, n) int64 array");
    }
    size_t n = (size_t)iv.shape[0];
    int64_t rc;
    if (ov.itemsize != 8 || (size_t)ov.len != 4 * n * 8) {
        PyErr_Format(PyExc_ValueError, "row_runs: out holds %zd bytes; (4, %zu) int64 needs %zu", ov.len, n, 4 * n * 8);
        rc = INT64_MIN;
    } else {
        int64_t *o = ov.buf;
        rc = ferry_row_runs(sv.buf, (size_t)sv.shape[0], nrows, iv.buf, n, o, o + n, o + 2 * n, o + 3 * n);
    }
    PyBuffer_Release(&sv);
    PyBuffer_Release(&iv);
    PyBuffer_Release(&ov);
    if (rc == INT64_MIN) return NULL;
    if (rc < 0) {
        PyErr_SetString(rc == -ERANGE ? PyExc_IndexError : PyExc_ValueError, ferry_errmsg(NULL));
        return NULL;
    }
    return PyLong_FromLongLong(rc);
}

/* The File for file k of a plan_windows call: files[k] of a sequence, or files(k) of a
 * callable (the dataset opens its files as their windows come up: a corpus of thousands of
 * files is not opened whole for one group). New reference, or NULL with an exception. */
static FileObject *windows_file(PyObject *files, Py_ssize_t k) {
    PyObject *o = PyCallable_Check(files) ? PyObject_CallFunction(files, "n", k) : PySequence_GetItem(files, k);
    if (!o) return NULL;
    if (!PyObject_TypeCheck(o, &FileType)) {
        PyErr_Format(PyExc_TypeError, "plan_windows: file %zd is %s, not a File", k, Py_TYPE(o)->tp_name);
        Py_DECREF(o);
        return NULL;
    }
    if (file_check((FileObject *)o) < 0) { Py_DECREF(o); return NULL; }
    return (FileObject *)o;
}

/* plan_windows(plan, files, starts, offsets, stride, length, n, seed, epoch, shuffle, ranges, dst)
 *   -> number of windows planned.
 * Window id w (of n, over all files) lies in file k with starts[k] <= w < starts[k+1] (n after
 * the last) and begins at byte offsets[k] + (w - starts[k]) * stride of it; it is `length`
 * bytes. ranges holds (lo, hi) pairs of epoch positions: the positions lo..hi-1 of each pair,
 * pair after pair, are mapped through the epoch order (ferry_perm_init(n, seed, epoch,
 * shuffle)) to window ids, and window j of that sequence is read to dst at byte j * length:
 * batch after batch, rows in order, so a gathered group is one contiguous destination run.
 * files: a sequence of File, or a callable k -> File called once per file a window of this
 * call lies in. Every window is checked to lie inside its file's current size (a clear error
 * naming the file, never a short read later) and the destination to hold them all. */
PyObject *mod_plan_windows(PyObject *m, PyObject *args) {
    PlanObject *plan;
    PyObject *files, *so, *oo, *ro, *dsto;
    unsigned long long stride, length, n;
    long long seed, epoch;
    int shuffle;
    if (!PyArg_ParseTuple(args, "O!OOOKKKLLpOO:plan_windows", &PlanType, &plan, &files, &so, &oo, &stride, &length,
                          &n, &seed, &epoch, &shuffle, &ro, &dsto))
        return NULL;
    if (plan_check(plan) < 0) return NULL;
    Py_buffer sv, ov, rv;
    if (int64_column_of("plan_windows", so, "starts", 0, &sv) < 0) return NULL;
    if (int64_column_of("plan_windows", oo, "offsets", 0, &ov) < 0) { PyBuffer_Release(&sv); return NULL; }
    if (int64_column_of("plan_windows", ro, "ranges", 0, &rv) < 0) {
        PyBuffer_Release(&sv);
        PyBuffer_Release(&ov);
        return NULL;
    }
    PyObject *ret = NULL, *used = NULL;
    FileObject **fobj = NULL;
    ferry_file **ff = NULL;
    int64_t *ids = NULL;
    int32_t *fidx = NULL;
    int64_t *own = NULL;
    parsed_buf d = {.keep = NULL};
    Py_ssize_t nf = sv.shape[0], nr = rv.shape[0] / 2;
    if (nf < 1 || ov.shape[0] != nf || rv.shape[0] % 2) {
        PyErr_Format(PyExc_ValueError, "plan_windows: %zd starts, %zd offsets (equal, at least one), %zd range "
                     "bounds (pairs)", nf, ov.shape[0], rv.shape[0]);
        goto out;
    }
    /* private starts, offsets and ranges: the library reads them without the GIL */
    own = malloc((2 * (size_t)nf + 2 * (size_t)nr + 1) * sizeof *own);
    if (!own) { PyErr_NoMemory(); goto out; }
    memcpy(own, sv.buf, (size_t)nf * sizeof *own);
    memcpy(own + nf, ov.buf, (size_t)nf * sizeof *own);
    memcpy(own + 2 * nf, rv.buf, 2 * (size_t)nr * sizeof *own);
    ferry_windows w = {n, stride, length, (size_t)nf, own, own + nf};
    const int64_t *rng = own + 2 * nf;
    ferry_perm ord;
    if (ferry_perm_init(&ord, n, seed, epoch, shuffle) < 0) {
        raise_code_msg(FERRY_EINVAL, "plan_windows: n must be below 2**63");
        goto out;
    }
    int64_t checked = ferry_windows_check(&w, rng, (size_t)nr);
    if (checked < 0) {   /* Python's types for bad arguments (src/formats/rows.h) */
        PyErr_SetString(checked == -ERANGE ? PyExc_IndexError : PyExc_ValueError, ferry_errmsg(NULL));
        goto out;
    }
    size_t total = (size_t)checked;
    if (parse_buffer(dsto, 1, &d) < 0) goto out;
    if (total > d.buf.size / length) {
        PyErr_Format(PyExc_ValueError, "plan_windows: %zu windows of %llu bytes do not fit the destination "
                     "(%zu bytes)", total, length, d.buf.size);
        goto out;
    }
    ids = malloc((total ? total : 1) * sizeof *ids);
    fidx = malloc((total ? total : 1) * sizeof *fidx);
    fobj = calloc((size_t)nf, sizeof *fobj);
    ff = calloc((size_t)nf, sizeof *ff);
    used = PyList_New(0);
    if (!ids || !fidx || !fobj || !ff || !used) { PyErr_NoMemory(); goto out; }
    /* the order and each window's file without the GIL (a loader thread plans the next group
     * while the consumer's thread hands batches out): a group of 4,096 windows is ~0.1 ms */
    int prc;
    int nogil = total >= 256;
    PyThreadState *ts = nogil ? PyEval_SaveThread() : NULL;
    prc = ferry_windows_resolve(&w, &ord, rng, (size_t)nr, ids, fidx);
    if (ts) PyEval_RestoreThread(ts);
    if (prc < 0) { raise_code_msg(prc, ferry_errmsg(NULL)); goto out; }
    /* pass 1: every file a window lies in opened (in the order windows come up) and checked;
     * nothing is added to the plan before all of them pass (a failed call leaves it as it was) */
    for (size_t j = 0; j < total; j++) {
        Py_ssize_t k = fidx[j];
        if (fobj[k]) continue;
        FileObject *f = windows_file(files, k);
        if (!f) goto out;
        if (PyList_Append(used, (PyObject *)f) < 0) { Py_DECREF(f); goto out; }
        Py_DECREF(f);   /* `used` holds it */
        fobj[k] = f;
        ff[k] = f->f;
        int rc = ferry_windows_fit(&w, (size_t)k, f->f);
        if (rc < 0) {
            if (rc == FERRY_ESHORT) raise_code_msg(rc, ferry_errmsg(NULL));
            else raise_ctx(f->ctx->ctx, rc);
            goto out;
        }
    }
    /* pass 2: the reads. The destination and the Files are kept by the plan first, so that
     * even an add failing half way (out of memory) leaves no extent naming a freed File; the
     * plan is busy meanwhile (another thread's submit or add is refused, not raced) */
    if (total > 0) {
        PyObject *keep = d.keep;
        d.keep = NULL;
        if (plan_keep(plan, keep) < 0) goto out;
        PyObject *u = used;
        used = NULL;
        if (plan_keep(plan, u) < 0) goto out;
    }
    int64_t rc;
    size_t bad = 0;
    plan->busy++;
    ts = nogil ? PyEval_SaveThread() : NULL;
    rc = ferry_plan_windows(&w, ff, ids, fidx, total, d.buf, plan->plan, &bad);
    if (ts) PyEval_RestoreThread(ts);
    plan->busy--;
    if (rc < 0) { raise_ctx(fobj[fidx[bad]]->ctx->ctx, (int)rc); goto out; }
    ret = PyLong_FromUnsignedLongLong((unsigned long long)total);
out:
    Py_XDECREF(d.keep);
    Py_XDECREF(used);
    free(fobj);
    free(ff);
    free(fidx);
    free(own);
    free(ids);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&ov);
    PyBuffer_Release(&rv);
    return ret;
}
