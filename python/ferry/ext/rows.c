/*
 * rows.c — Plan.read_rows: many rows (positions along the first dimension)
 * of many arrays in one call, the planner of a training batch.
 *
 * XarrayDataset plans a read group of 120 samples of 20 variables as 2,400
 * reads of one time step each. Made one Python call at a time (Plan.layout,
 * Plan.read) they took a median of 13 ms of the planner thread's CPU a group
 * for netCDF-4 and 27 ms for Zarr zstd on the H200 (2026-12-04 01:51,
 * bench/results/2026-12-04), against 1-2 ms for its buffers and the submit,
 * and the engine idled for that long whenever both groups in flight were read
 * before the consumer asked for the next. Here the loop is C: each array's
 * description is parsed once a call, the rows are planned with the GIL
 * released, and the extents enter the plan in the order the loop in Python
 * added them (row by row, each row's arrays in turn), so the engine packs and
 * copies a batch as before.
 */
#include "ferry_ext.h"

/* One array of the call: a chunked layout (layout()) or a variable of an
 * open Dataset, its selection (the first dimension replaced per row), and
 * the destination its rows go into. */
typedef struct {
    const ferry_layout *layout;   /* or NULL: ds/var */
    ferry_dataset *ds;
    ferry_ctx *ctx;               /* the dataset's: where its errors are told */
    int var, ndim, native;
    uint64_t rows_of;             /* the first dimension's length */
    uint64_t row_bytes;           /* what one row's selection places: its destination, exactly */
    ferry_slice sel[FERRY_MAX_DIMS];
    ferry_buf dst;
    const char *name;
} row_src;

static int src_parse(PyObject *o, PyObject *selo, Py_ssize_t k, PlanObject *plan, row_src *s) {
    memset(s, 0, sizeof *s);
    int native = 1;
    uint64_t shape[FERRY_MAX_DIMS] = {0}, itemsize = 1;
    if ((s->layout = layout_of(o, &native))) {
        s->ndim = s->layout->ndim;
        s->native = native;
        memcpy(shape, s->layout->shape, sizeof shape);
        itemsize = s->layout->itemsize;
        s->name = s->layout->label ? s->layout->label : "array";
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
        s->ctx = ds->ctx->ctx;
        s->var = vi;
        s->ndim = info.ndim;
        s->native = 1;
        memcpy(shape, info.shape, sizeof shape);
        itemsize = info.itemsize;
        s->name = info.name;
        Py_INCREF(ds);   /* the plan may name the dataset's open files */
        if (plan_keep(plan, (PyObject *)ds) < 0) return -1;
    } else {
        PyErr_Format(PyExc_TypeError, "read_rows: sources[%zd] is %s, not a layout() or a (Dataset, var) pair", k,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    if (s->ndim < 1) {
        PyErr_Format(PyExc_ValueError, "read_rows: %s has no dimension to take rows of", s->name);
        return -1;
    }
    s->rows_of = shape[0];
    if (selo == Py_None) {
        for (int d = 0; d < s->ndim; d++) s->sel[d] = (ferry_slice){0, (int64_t)shape[d], 1};
    } else if (parse_triples(selo, s->sel, s->ndim, s->name) < 0) {
        return -1;
    }
    /* a row's bytes: one index of the first dimension, the selection of the
     * others clipped to the shape as the planners clip it (a negative start
     * or a step < 1 they refuse, naming the array) */
    s->row_bytes = itemsize;
    for (int d = 1; d < s->ndim; d++) {
        ferry_slice x = s->sel[d];
        int64_t stop = x.stop > (int64_t)shape[d] ? (int64_t)shape[d] : x.stop;
        uint64_t n = x.start >= 0 && x.step >= 1 && stop > x.start ? (uint64_t)((stop - x.start + x.step - 1) / x.step) : 0;
        s->row_bytes *= n;
    }
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
    row_src *s = NULL;
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
    if (!(s = calloc((size_t)(K ? K : 1), sizeof *s))) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t k = 0; k < K; k++) {
        if (src_parse(PySequence_Fast_GET_ITEM(srcs, k), PySequence_Fast_GET_ITEM(sels, k), k, self, &s[k]) < 0)
            goto done;
        parsed_buf d;
        if (parse_buffer(PySequence_Fast_GET_ITEM(dsts, k), 1, &d) < 0) goto done;
        s[k].dst = d.buf;
        if (plan_keep(self, d.keep) < 0) goto done;
    }
    /* every row and offset checked before any is planned: a refused call adds nothing */
    for (Py_ssize_t r = 0; r < R; r++)
        for (Py_ssize_t k = 0; k < K; k++) {
            int64_t t = rows[r], o = offs[r * K + k];
            if (t < 0 || (uint64_t)t >= s[k].rows_of) {
                PyErr_Format(PyExc_IndexError, "read_rows: row %zd: index %lld outside the %llu of %s", r,
                             (long long)t, (unsigned long long)s[k].rows_of, s[k].name);
                goto done;
            }
            if (o < 0 || (uint64_t)o > s[k].dst.size || s[k].row_bytes > s[k].dst.size - (uint64_t)o) {
                PyErr_Format(PyExc_ValueError, "read_rows: row %zd of %s: %llu bytes at dst offset %lld do not fit "
                             "its destination (%zu bytes)", r, s[k].name, (unsigned long long)s[k].row_bytes,
                             (long long)o, s[k].dst.size);
                goto done;
            }
        }
    int64_t total = 0, rc = 0;
    Py_ssize_t failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < R && rc >= 0; r++)
        for (Py_ssize_t k = 0; k < K && rc >= 0; k++) {
            row_src *x = &s[k];
            ferry_slice sel[FERRY_MAX_DIMS];
            memcpy(sel, x->sel, sizeof sel);
            sel[0] = (ferry_slice){rows[r], rows[r] + 1, 1};
            ferry_buf sub = x->dst;
            sub.ptr = (char *)sub.ptr + offs[r * K + k];
            sub.size = (size_t)x->row_bytes;
            unsigned flags = x->native ? FERRY_NATIVE : 0;
            rc = x->layout ? ferry_plan_layout(x->layout, sel, sub, flags, self->plan)
                           : ferry_dataset_plan_read(x->ds, x->var, sel, sub, flags, self->plan);
            if (rc >= 0) total += rc;
            else failed = k;
        }
    Py_END_ALLOW_THREADS
    if (rc < 0) {   /* the extents planned before it stay in the plan, as with one call a row: clear it */
        if (s[failed].layout) raise_code_msg((int)rc, ferry_errmsg(NULL));
        else raise_ctx(s[failed].ctx, (int)rc);
        goto done;
    }
    result = PyLong_FromLongLong(total);
done:
    free(s);
    free(rows);
    free(offs);
    Py_XDECREF(srcs);
    Py_XDECREF(sels);
    Py_XDECREF(dsts);
    return result;
}
