/* perm.c — order_take: ferry_perm_take (src/formats/perm.c) for ferry.torch's TokenDataset,
 * whose epoch order (a keyed permutation evaluated per position) is computed for a group of
 * batches in one call; plan_windows: a group's token windows planned in one call (order,
 * file, offset and destination of every window computed here, no array per window in
 * Python). */
#include "ferry_ext.h"

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
    ferry_perm ord;
    if (ferry_perm_init(&ord, n, seed, epoch, shuffle) < 0)
        return raise_code_msg(FERRY_EINVAL, "plan_windows: n must be below 2**63");
    if (length == 0 || length > (1ull << 40) || stride > (1ull << 40))
        return PyErr_Format(PyExc_ValueError, "plan_windows: length %llu / stride %llu", length, stride);
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
    int64_t *ids = NULL;
    int32_t *fidx = NULL;
    int64_t *own = NULL;
    parsed_buf d = {.keep = NULL};
    const int64_t *starts = sv.buf, *offs = ov.buf, *rng = rv.buf;
    Py_ssize_t nf = sv.shape[0], nr = rv.shape[0] / 2;
    if (nf < 1 || ov.shape[0] != nf || rv.shape[0] % 2) {
        PyErr_Format(PyExc_ValueError, "plan_windows: %zd starts, %zd offsets (equal, at least one), %zd range "
                     "bounds (pairs)", nf, ov.shape[0], rv.shape[0]);
        goto out;
    }
    for (Py_ssize_t k = 0; k < nf; k++)
        if (offs[k] < 0 || starts[k] < 0 || (uint64_t)starts[k] > n || (k == 0 && starts[k] != 0) ||
            (k > 0 && starts[k] < starts[k - 1])) {
            PyErr_Format(PyExc_ValueError, "plan_windows: file %zd: start %lld, offset %lld (starts ascending "
                         "from 0 up to n = %llu, offsets >= 0)", k, (long long)starts[k], (long long)offs[k], n);
            goto out;
        }
    uint64_t total = 0;
    for (Py_ssize_t r = 0; r < nr; r++) {
        if (rng[2 * r] < 0 || rng[2 * r] > rng[2 * r + 1] || (uint64_t)rng[2 * r + 1] > n) {
            PyErr_Format(PyExc_IndexError, "plan_windows: range %zd is [%lld, %lld), outside [0, %llu)", r,
                         (long long)rng[2 * r], (long long)rng[2 * r + 1], n);
            goto out;
        }
        total += (uint64_t)(rng[2 * r + 1] - rng[2 * r]);
    }
    if (parse_buffer(dsto, 1, &d) < 0) goto out;
    if (total > d.buf.size / length) {
        PyErr_Format(PyExc_ValueError, "plan_windows: %llu windows of %llu bytes do not fit the destination "
                     "(%zu bytes)", (unsigned long long)total, length, d.buf.size);
        goto out;
    }
    if (nf > INT32_MAX) { PyErr_SetString(PyExc_ValueError, "plan_windows: more than 2**31 files"); goto out; }
    ids = malloc((total ? total : 1) * sizeof *ids);
    fidx = malloc((total ? total : 1) * sizeof *fidx);
    fobj = calloc((size_t)nf, sizeof *fobj);
    own = malloc(2 * (size_t)nf * sizeof *own);   /* private starts and offsets: read without the GIL */
    used = PyList_New(0);
    if (!ids || !fidx || !fobj || !own || !used) { PyErr_NoMemory(); goto out; }
    memcpy(own, starts, (size_t)nf * sizeof *own);
    memcpy(own + nf, offs, (size_t)nf * sizeof *own);
    starts = own;
    offs = own + nf;
    size_t j = 0;
    for (Py_ssize_t r = 0; r < nr; r++)
        for (int64_t p = rng[2 * r]; p < rng[2 * r + 1]; p++) ids[j++] = p;
    /* the order and each window's file without the GIL (a loader thread plans the next group
     * while the consumer's thread hands batches out): a group of 4,096 windows is ~0.1 ms */
    int64_t prc;
    int nogil = total >= 256;
    PyThreadState *ts = nogil ? PyEval_SaveThread() : NULL;
    prc = ferry_perm_take(&ord, ids, total, ids);   /* in place: each id replaces its position */
    for (j = 0; prc >= 0 && j < total; j++) {
        int64_t w = ids[j];
        Py_ssize_t k = 0;
        if (nf > 1) {   /* the last file whose start is <= w (empty files share starts: skip them) */
            Py_ssize_t lo = 0, hi = nf;
            while (hi - lo > 1) {
                Py_ssize_t mid = lo + (hi - lo) / 2;
                if (starts[mid] <= w) lo = mid; else hi = mid;
            }
            k = lo;
        }
        fidx[j] = (int32_t)k;
    }
    if (ts) PyEval_RestoreThread(ts);
    if (prc < 0) {
        raise_code_msg(FERRY_EINVAL, "plan_windows: a position outside the order");
        goto out;
    }
    /* pass 1: every file a window lies in opened (in the order windows come up) and checked;
     * nothing is added to the plan before all of them pass (a failed call leaves it as it was) */
    for (j = 0; j < total; j++) {
        Py_ssize_t k = fidx[j];
        if (fobj[k]) continue;
        /* first window of file k in this call: open it, check its last window fits */
        FileObject *f = windows_file(files, k);
        if (!f) goto out;
        if (PyList_Append(used, (PyObject *)f) < 0) { Py_DECREF(f); goto out; }
        Py_DECREF(f);   /* `used` holds it */
        fobj[k] = f;
        uint64_t nwin = (k + 1 < nf ? (uint64_t)starts[k + 1] : n) - (uint64_t)starts[k];
        int64_t size = ferry_file_size(f->f);
        const char *path = ferry_file_path(f->f);
        uint64_t span = 0, end = 0;   /* offs < 2^63 and length <= 2^40: their sum fits */
        int over = __builtin_mul_overflow(nwin - 1, (uint64_t)stride, &span) ||
                   __builtin_add_overflow(span, (uint64_t)offs[k] + length, &end);
        if (size < 0) { raise_ctx(f->ctx->ctx, (int)size); goto out; }
        if (over || end > (uint64_t)size) {
            char msg[512];
            snprintf(msg, sizeof msg, "plan_windows: %s: %llu windows of %llu bytes every %llu from byte %lld "
                     "end at byte %llu, the file has %lld", path ? path : "?", (unsigned long long)nwin, length,
                     stride, (long long)offs[k], (unsigned long long)end, (long long)size);
            raise_code_msg(FERRY_ESHORT, msg);
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
    int rc = 0;
    size_t bad = 0;
    plan->busy++;
    ts = nogil ? PyEval_SaveThread() : NULL;
    for (j = 0; j < total && rc >= 0; j++) {
        Py_ssize_t k = fidx[j];
        uint64_t off = (uint64_t)offs[k] + (uint64_t)(ids[j] - starts[k]) * stride;
        rc = ferry_plan_read(plan->plan, fobj[k]->f, off, length, d.buf, j * length);
        bad = j;
    }
    if (ts) PyEval_RestoreThread(ts);
    plan->busy--;
    if (rc < 0) { raise_ctx(fobj[fidx[bad]]->ctx->ctx, rc); goto out; }
    ret = PyLong_FromUnsignedLongLong((unsigned long long)total);
out:
    Py_XDECREF(d.keep);
    Py_XDECREF(used);
    free(fobj);
    free(fidx);
    free(own);
    free(ids);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&ov);
    PyBuffer_Release(&rv);
    return ret;
}
