/*
 * rows.c — Plan.read_rows: many rows (positions along the first dimension)
 * of many arrays in one call, the planner of a training batch.
 *
 * The planner is the library's (src/formats/rows.c ferry_plan_rows: every
 * row and offset checked first, then the rows planned row by row, each row's
 * arrays in turn, as a loop of one read a row would add them); here each
 * array's description is parsed once a call and the planning runs with the
 * GIL released.
 */
#include "ferry_ext.h"
#include "formats/rows.h"
#include <errno.h>

/* One source of the call: a layout() or a (Dataset, var) pair, its selection
 * (the first dimension replaced per row) and its destination; the planning
 * itself is the library's (src/formats/rows.c). */
static int src_parse(PyObject *o, PyObject *selo, Py_ssize_t k, PlanObject *plan, ferry_rows_src *s,
                     ferry_ctx **ctx) {
    memset(s, 0, sizeof *s);
    *ctx = NULL;
    int native = 1, ndim;
    const char *name;
    if ((s->layout = layout_of(o, &native))) {
        s->native = native;
        ndim = s->layout->ndim;
        name = s->layout->label ? s->layout->label : "array";
    } else if (PyTuple_Check(o) && PyTuple_GET_SIZE(o) == 2 &&
               PyObject_TypeCheck(PyTuple_GET_ITEM(o, 0), &DatasetType)) {
        DatasetObject *ds = (DatasetObject *)PyTuple_GET_ITEM(o, 0);
        if (ds_check(ds) < 0) return -1;
        int vi = ds_var_index(ds, PyTuple_GET_ITEM(o, 1));
        if (vi < 0) return -1;
        ferry_var_info info;
        memset(&info, 0, sizeof info);
        if (ferry_dataset_var(ds->ds, vi, &info) < 0) { raise_code_msg(FERRY_EINVAL, ferry_errmsg(NULL)); return -1; }
        s->ds = ds->ds;
        s->var = vi;
        s->native = 1;
        *ctx = ds->ctx->ctx;
        ndim = info.ndim;
        name = info.name;
        Py_INCREF(ds);   /* the plan may name the dataset's open files */
        if (plan_keep(plan, (PyObject *)ds) < 0) return -1;
    } else {
        PyErr_Format(PyExc_TypeError, "read_rows: sources[%zd] is %s, not a layout() or a (Dataset, var) pair", k,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    if (ndim < 1) {
        PyErr_Format(PyExc_ValueError, "read_rows: %s has no dimension to take rows of", name);
        return -1;
    }
    if (selo == Py_None) {
        uint64_t shape[FERRY_MAX_DIMS] = {0};
        if (s->layout) memcpy(shape, s->layout->shape, sizeof shape);
        else {
            ferry_var_info info;
            ferry_dataset_var(s->ds, s->var, &info);
            memcpy(shape, info.shape, sizeof shape);
        }
        for (int d = 0; d < ndim; d++) s->sel[d] = (ferry_slice){0, (int64_t)shape[d], 1};
    } else if (parse_triples(selo, s->sel, ndim, name) < 0) {
        return -1;
    }
    int rc = ferry_rows_prepare(s);
    if (rc < 0) { raise_code_msg(rc, ferry_errmsg(NULL)); return -1; }
    return 0;
}

/* An int64/uint64 array (column_parse) copied: the caller's array may change
 * once the GIL is released. Values past INT64_MAX come out negative, and are
 * refused as such. NULL with an exception set. */
static int64_t *i64_copy(PyObject *o, const char *what, Py_ssize_t *n) {
    u64_column c;
    if (column_parse(o, "read_rows", what, 0, &c) < 0) return NULL;
    *n = column_len(&c);
    int64_t *out = malloc((size_t)(*n ? *n : 1) * 8);
    if (!out) PyErr_NoMemory();
    for (Py_ssize_t i = 0; out && i < *n; i++) {
        int neg = 0;
        out[i] = (int64_t)column_at(&c, i, &neg);
    }
    column_release(&c);
    return out;
}

PyObject *Plan_read_rows(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"sources", "selections", "rows", "dsts", "dst_offsets", NULL};
    PyObject *srco, *selso, *rowso, *dstso, *offso;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO", kwlist, &srco, &selso, &rowso, &dstso, &offso)) return NULL;
    if (plan_check(self) < 0) return NULL;
    PyObject *result = NULL, *srcs = NULL, *sels = NULL, *dsts = NULL;
    ferry_rows_src *s = NULL;
    ferry_ctx **ctxs = NULL;
    int64_t *rows = NULL, *offs = NULL;
    Py_ssize_t K = 0, R = 0, nofs = 0;
    /* a tuple of the sources: it holds them (their layouts are read without the GIL,
     * while another thread could empty the caller's list) */
    if (!(srcs = PySequence_Tuple(srco)) ||
        !(sels = PySequence_Fast(selso, "read_rows: selections must be a sequence")) ||
        !(dsts = PySequence_Fast(dstso, "read_rows: dsts must be a sequence")))
        goto done;
    K = PySequence_Fast_GET_SIZE(srcs);
    if (PySequence_Fast_GET_SIZE(sels) != K || PySequence_Fast_GET_SIZE(dsts) != K) {
        PyErr_Format(PyExc_ValueError, "read_rows: %zd sources, %zd selections and %zd dsts (one each)", K,
                     PySequence_Fast_GET_SIZE(sels), PySequence_Fast_GET_SIZE(dsts));
        goto done;
    }
    if (!(rows = i64_copy(rowso, "rows", &R)) || !(offs = i64_copy(offso, "dst_offsets", &nofs))) goto done;
    if (nofs != R * K) {
        PyErr_Format(PyExc_ValueError, "read_rows: %zd dst_offsets for %zd rows of %zd sources (rows x sources, "
                     "row by row)", nofs, R, K);
        goto done;
    }
    if (!(s = calloc((size_t)(K ? K : 1), sizeof *s)) || !(ctxs = calloc((size_t)(K ? K : 1), sizeof *ctxs))) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < K; k++) {
        if (src_parse(PySequence_Fast_GET_ITEM(srcs, k), PySequence_Fast_GET_ITEM(sels, k), k, self, &s[k], &ctxs[k]) < 0)
            goto done;
        parsed_buf d;
        if (parse_buffer(PySequence_Fast_GET_ITEM(dsts, k), 1, &d) < 0) goto done;
        s[k].dst = d.buf;
        if (plan_keep(self, d.keep) < 0) goto done;
    }
    int64_t total;
    size_t failed = (size_t)-1;
    Py_BEGIN_ALLOW_THREADS
    total = ferry_plan_rows(s, (size_t)K, rows, (size_t)R, offs, self->plan, &failed);
    Py_END_ALLOW_THREADS
    if (total < 0) {
        if (failed == (size_t)-1)   /* refused before planning: Python's types for bad arguments */
            PyErr_SetString(total == -ERANGE ? PyExc_IndexError : PyExc_ValueError, ferry_errmsg(NULL));
        else if (!ctxs[failed])     /* the extents planned before it stay in the plan: clear it */
            raise_code_msg((int)total, ferry_errmsg(NULL));
        else
            raise_ctx(ctxs[failed], (int)total);
        goto done;
    }
    result = PyLong_FromLongLong(total);
done:
    free(s);
    free(ctxs);
    free(rows);
    free(offs);
    Py_XDECREF(srcs);
    Py_XDECREF(sels);
    Py_XDECREF(dsts);
    return result;
}
