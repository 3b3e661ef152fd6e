/*
 * layout.c — chunked layouts (ferry_plan_layout): chunk_table() builds a sorted
 * chunk table once per variable; Plan.layout plans a selection of the array.
 */
#include "ferry_ext.h"

/* ---- chunked layouts (ferry_plan_layout) ------------------------------------- */
/* A chunk table sorted for one grid (ferry_layout_sort_table), kept in a
 * capsule so that a variable's table is built once and reused by every plan. */
typedef struct chunk_table {
    int ndim;
    uint64_t shape[FERRY_MAX_DIMS], chunks[FERRY_MAX_DIMS];
    size_t n;
    ferry_chunk *table;
    uint64_t *index;
} chunk_table;

#define CHUNK_TABLE_CAPSULE "ferry._ferry.chunk_table"

static void chunk_table_free(PyObject *cap) {
    chunk_table *t = PyCapsule_GetPointer(cap, CHUNK_TABLE_CAPSULE);
    if (!t) { PyErr_Clear(); return; }
    free(t->table);
    free(t->index);
    free(t);
}

/* a tuple/list of at most FERRY_MAX_DIMS non-negative ints; returns the count or -1 */
int seq_to_u64(PyObject *seq, const char *what, uint64_t *out) {
    PyObject *f = PySequence_Fast(seq, what);
    if (!f) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(f);
    if (n > FERRY_MAX_DIMS) { Py_DECREF(f); PyErr_Format(PyExc_ValueError, "%s: more than %d dimensions", what, FERRY_MAX_DIMS); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long v = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(f, i));
        if (v == (unsigned long long)-1 && PyErr_Occurred()) { Py_DECREF(f); return -1; }
        out[i] = v;
    }
    Py_DECREF(f);
    return (int)n;
}

PyObject *mod_chunk_table(PyObject *mod, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"shape", "chunks", "origins", "offsets", "lengths", "skips", NULL};
    PyObject *shapeo, *chunkso;
    Py_buffer org = {0}, off = {0}, len = {0}, skp = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOy*y*y*|y*", kwlist, &shapeo, &chunkso, &org, &off, &len, &skp))
        return NULL;
    PyObject *result = NULL;
    chunk_table *t = calloc(1, sizeof *t);
    ferry_layout l;
    memset(&l, 0, sizeof l);
    if (!t) { PyErr_NoMemory(); goto done; }
    int nd = seq_to_u64(shapeo, "shape", t->shape);
    if (nd < 0 || seq_to_u64(chunkso, "chunks", t->chunks) != nd) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "chunks must have as many items as shape");
        goto done;
    }
    t->ndim = nd;
    size_t n = (size_t)off.len / 8;
    if ((size_t)off.len != n * 8 || (size_t)len.len != n * 8 || (size_t)org.len != n * 8 * (size_t)nd ||
        (skp.buf && (size_t)skp.len != n * 4)) {
        PyErr_Format(PyExc_ValueError, "chunk_table: %zu offsets need %zu bytes of uint64 origins, %zu of uint64 "
                     "lengths and %zu of uint32 skips", n, n * 8 * (size_t)nd, n * 8, n * 4);
        goto done;
    }
    t->n = n;
    t->table = calloc(n ? n : 1, sizeof *t->table);
    t->index = calloc(n ? n : 1, sizeof *t->index);
    if (!t->table || !t->index) { PyErr_NoMemory(); goto done; }
    for (size_t i = 0; i < n; i++) {
        memcpy(&t->table[i].offset, (const char *)off.buf + 8 * i, 8);
        memcpy(&t->table[i].length, (const char *)len.buf + 8 * i, 8);
        if (skp.buf) memcpy(&t->table[i].skip, (const char *)skp.buf + 4 * i, 4);
    }
    l.ndim = nd;
    l.itemsize = 1;
    memcpy(l.shape, t->shape, sizeof l.shape);
    memcpy(l.chunks, t->chunks, sizeof l.chunks);
    int rc;
    uint64_t *origins = NULL;
    if (n && !(origins = malloc(n * 8 * (size_t)(nd ? nd : 1)))) { PyErr_NoMemory(); goto done; }
    if (n) memcpy(origins, org.buf, n * 8 * (size_t)nd);   /* aligned, and the GIL may go */
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_layout_sort_table(&l, origins, t->table, t->index, n);
    Py_END_ALLOW_THREADS
    free(origins);
    if (rc < 0) { raise_code_msg(rc, ferry_errmsg(NULL)); goto done; }
    result = PyCapsule_New(t, CHUNK_TABLE_CAPSULE, chunk_table_free);
    if (result) t = NULL;
done:
    if (t) { free(t->table); free(t->index); free(t); }
    PyBuffer_Release(&org); PyBuffer_Release(&off); PyBuffer_Release(&len);
    if (skp.buf) PyBuffer_Release(&skp);
    return result;
}

/* What describes a chunked array to ferry_plan_layout, parsed once: the
 * layout, and the Python objects its pointers point into (the path's bytes,
 * the table's capsule), held as long as the layout is. */
typedef struct layout_held {
    ferry_layout l;
    int native;
    PyObject *pathb, *table, *labelb;
} layout_held;

static void layout_held_clear(layout_held *h) {
    Py_CLEAR(h->pathb);
    Py_CLEAR(h->table);
    Py_CLEAR(h->labelb);
}

/* Fill h from the arguments Plan.layout and layout() share; -1 with an
 * exception set (h cleared). */
static int layout_parse(layout_held *h, PyObject *shapeo, PyObject *chunkso, unsigned int itemsize, PyObject *tableo,
                        PyObject *patho, PyObject *codecs, unsigned int swap, const Py_buffer *fill, const char *order,
                        int native, const char *label, unsigned long long file_size) {
    memset(h, 0, sizeof *h);
    ferry_layout *l = &h->l;
    int nd = seq_to_u64(shapeo, "shape", l->shape);
    if (nd < 0 || seq_to_u64(chunkso, "chunks", l->chunks) != nd) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "chunks must have as many items as shape");
        goto fail;
    }
    l->ndim = nd;
    l->itemsize = itemsize;
    l->swap = swap;
    l->file_size = file_size;
    h->native = native;
    if (label) {
        if (!(h->labelb = PyBytes_FromString(label))) goto fail;
        l->label = PyBytes_AS_STRING(h->labelb);
    }
    if (!strcmp(order, "C")) l->order = FERRY_ORDER_C;
    else if (!strcmp(order, "F")) l->order = FERRY_ORDER_F;
    else { PyErr_Format(PyExc_ValueError, "order must be 'C' or 'F', not %s", order); goto fail; }
    if (fill && fill->buf) {
        if ((size_t)fill->len > 16 || (fill->len && (size_t)fill->len != itemsize)) {
            PyErr_Format(PyExc_ValueError, "fill must be the %u-byte element (at most 16 bytes)", itemsize);
            goto fail;
        }
        memcpy(l->fill, fill->buf, (size_t)fill->len);
    }
    if (codecs != Py_None && parse_codec_list(codecs, l->codecs, &l->ncodecs) < 0) goto fail;
    if (patho != Py_None) {
        if (!PyUnicode_FSConverter(patho, &h->pathb)) goto fail;
        l->path = PyBytes_AS_STRING(h->pathb);
    }
    if (tableo != Py_None) {
        chunk_table *t = PyCapsule_GetPointer(tableo, CHUNK_TABLE_CAPSULE);
        if (!t) goto fail;
        if (t->ndim != nd || memcmp(t->shape, l->shape, sizeof(uint64_t) * (size_t)nd) ||
            memcmp(t->chunks, l->chunks, sizeof(uint64_t) * (size_t)nd)) {
            PyErr_SetString(PyExc_ValueError, "the chunk table was made for another shape or chunk shape");
            goto fail;
        }
        l->table = t->table;
        l->table_index = t->index;
        l->ntable = t->n;
        Py_INCREF(tableo);
        h->table = tableo;
    }
    return 0;
fail:
    layout_held_clear(h);
    return -1;
}

PyObject *Plan_layout(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"dst", "shape", "chunks", "itemsize", "table", "path", "codecs", "swap", "fill",
                             "order", "selection", "native", "label", "file_size", NULL};
    PyObject *dsto, *shapeo, *chunkso, *tableo = Py_None, *patho = Py_None, *codecs = Py_None, *sel = Py_None;
    unsigned int itemsize, swap = 0;
    unsigned long long file_size = 0;
    Py_buffer fill = {0};
    const char *order = "C", *label = NULL;
    int native = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOI|OOOIy*sOpzK", kwlist, &dsto, &shapeo, &chunkso, &itemsize,
                                     &tableo, &patho, &codecs, &swap, &fill, &order, &sel, &native, &label,
                                     &file_size))
        return NULL;
    PyObject *result = NULL;
    parsed_buf d = {.keep = NULL};
    layout_held h;
    memset(&h, 0, sizeof h);
    if (plan_check(self) < 0 ||
        layout_parse(&h, shapeo, chunkso, itemsize, tableo, patho, codecs, swap, &fill, order, native, label,
                     file_size) < 0)
        goto done;
    ferry_slice slices[FERRY_MAX_DIMS];
    if (sel != Py_None && parse_triples(sel, slices, h.l.ndim, label) < 0) goto done;
    if (parse_buffer(dsto, 1, &d) < 0) goto done;
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_plan_layout(&h.l, sel != Py_None ? slices : NULL, d.buf, native ? FERRY_NATIVE : 0, self->plan);
    Py_END_ALLOW_THREADS
    if (rc < 0) { raise_code_msg((int)rc, ferry_errmsg(NULL)); goto done; }
    if (plan_keep(self, d.keep) < 0) { d.keep = NULL; goto done; }
    d.keep = NULL;
    result = PyLong_FromLongLong(rc);
done:
    Py_XDECREF(d.keep);
    layout_held_clear(&h);
    if (fill.buf) PyBuffer_Release(&fill);
    return result;
}

/* ferry._ferry.layout(): a layout_held in a capsule, for Plan.read_rows
 * (rows.c), which plans many rows of many arrays in one call. */
#define LAYOUT_CAPSULE "ferry._ferry.layout"

static void layout_capsule_free(PyObject *cap) {
    layout_held *h = PyCapsule_GetPointer(cap, LAYOUT_CAPSULE);
    if (!h) { PyErr_Clear(); return; }
    layout_held_clear(h);
    free(h);
}

PyObject *mod_layout(PyObject *mod, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"shape", "chunks", "itemsize", "table", "path", "codecs", "swap", "fill", "order",
                             "native", "label", "file_size", NULL};
    PyObject *shapeo, *chunkso, *tableo = Py_None, *patho = Py_None, *codecs = Py_None;
    unsigned int itemsize, swap = 0;
    unsigned long long file_size = 0;
    Py_buffer fill = {0};
    const char *order = "C", *label = NULL;
    int native = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOI|OOOIy*spzK", kwlist, &shapeo, &chunkso, &itemsize, &tableo,
                                     &patho, &codecs, &swap, &fill, &order, &native, &label, &file_size))
        return NULL;
    PyObject *result = NULL;
    layout_held *h = malloc(sizeof *h);
    if (!h) { PyErr_NoMemory(); goto done; }
    if (layout_parse(h, shapeo, chunkso, itemsize, tableo, patho, codecs, swap, &fill, order, native, label,
                     file_size) < 0) {
        free(h);
        goto done;
    }
    if (!(result = PyCapsule_New(h, LAYOUT_CAPSULE, layout_capsule_free))) { layout_held_clear(h); free(h); }
done:
    if (fill.buf) PyBuffer_Release(&fill);
    return result;
}

const ferry_layout *layout_of(PyObject *o, int *native) {
    if (!PyCapsule_IsValid(o, LAYOUT_CAPSULE)) return NULL;
    layout_held *h = PyCapsule_GetPointer(o, LAYOUT_CAPSULE);
    if (native) *native = h->native;
    return &h->l;
}

/* Plan.read_array: a box of an array stored as is in an open file
 * (ferry_plan_array), the planner of DCP's stored tensors. */
PyObject *Plan_read_array(PlanObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"file", "offset", "shape", "itemsize", "dst", "selection", "order", "label", "exact",
                             NULL};
    int exact = 0;
    FileObject *f;
    unsigned long long offset;
    unsigned int itemsize;
    PyObject *shapeo, *dsto, *sel = Py_None;
    const char *order = "C", *label = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!KOIO|Oszp", kwlist, &FileType, &f, &offset, &shapeo, &itemsize,
                                     &dsto, &sel, &order, &label, &exact))
        return NULL;
    if (plan_check(self) < 0 || file_check(f) < 0) return NULL;
    ferry_layout l;
    memset(&l, 0, sizeof l);
    int nd = seq_to_u64(shapeo, "shape", l.shape);
    if (nd < 0) return NULL;
    l.ndim = nd;
    memcpy(l.chunks, l.shape, sizeof l.chunks);
    for (int k = 0; k < nd; k++) if (!l.chunks[k]) l.chunks[k] = 1;
    l.itemsize = itemsize;
    l.label = label;
    if (!strcmp(order, "C")) l.order = FERRY_ORDER_C;
    else if (!strcmp(order, "F")) l.order = FERRY_ORDER_F;
    else { PyErr_Format(PyExc_ValueError, "order must be 'C' or 'F', not %s", order); return NULL; }
    ferry_slice slices[FERRY_MAX_DIMS];
    if (sel != Py_None && parse_triples(sel, slices, nd, label) < 0) return NULL;
    parsed_buf d;
    if (parse_buffer(dsto, 1, &d) < 0) return NULL;
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_plan_array(f->f, offset, &l, sel != Py_None ? slices : NULL, d.buf, exact ? FERRY_EXACT_RUNS : 0,
                          self->plan);
    Py_END_ALLOW_THREADS
    if (rc < 0) { Py_DECREF(d.keep); return raise_ctx(f->ctx->ctx, (int)rc); }
    if (plan_keep(self, d.keep) < 0) return NULL;
    Py_INCREF(f);
    if (plan_keep(self, (PyObject *)f) < 0) return NULL;
    return PyLong_FromLongLong(rc);
}
