/*
 * images.c — ferry._ferry.Shards (a ferry_shards index of WebDataset tar,
 * Mosaic MDS or image-folder shards) and the image decoders
 * (image_probe, image_decode, image_decode_batch): thin bindings of
 * ferry_experimental.h, the GIL released around every call that reads or
 * decodes. python/ferry/images.py wraps them for users.
 */
#include "ferry_ext.h"
#include "ferry_experimental.h"

typedef struct {
    PyObject_HEAD
    ContextObject *ctx;
    ferry_shards *s;
    int busy;            /* reads running without the GIL: close waits for none, so refuse it */
} ShardsObject;

static int shards_check(ShardsObject *o) {
    if (!o->s) { PyErr_SetString(PyExc_ValueError, "ferry Shards is closed"); return -1; }
    return 0;
}

static void free_paths(char **v, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

static int Shards_init(ShardsObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"paths", "format", "ctx", NULL};
    PyObject *paths, *ctxo = Py_None;
    const char *format = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|zO", kwlist, &paths, &format, &ctxo)) return -1;
    if (self->s) { PyErr_SetString(PyExc_RuntimeError, "Shards already open"); return -1; }
    ContextObject *c = ctx_arg(ctxo);
    if (!c) return -1;
    PyObject *seq = (PyUnicode_Check(paths) || PyBytes_Check(paths) || PyObject_HasAttrString(paths, "__fspath__"))
                        ? PyTuple_Pack(1, paths) : PySequence_Fast(paths, "paths: a path or a sequence of paths");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    char **v = calloc(n ? (size_t)n : 1, sizeof *v);
    if (!v) { Py_DECREF(seq); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = NULL;
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &b)) { free_paths(v, n); Py_DECREF(seq); return -1; }
        v[i] = strdup(PyBytes_AS_STRING(b));
        Py_DECREF(b);
        if (!v[i]) { free_paths(v, n); Py_DECREF(seq); PyErr_NoMemory(); return -1; }
    }
    Py_DECREF(seq);
    ferry_shards *s = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_shards_open(c->ctx, (const char *const *)v, (size_t)n, format, &s);
    Py_END_ALLOW_THREADS
    free_paths(v, n);
    if (rc < 0) { raise_ctx(c->ctx, rc); return -1; }
    Py_INCREF(c);
    Py_XSETREF(self->ctx, c);
    self->s = s;
    return 0;
}

static void Shards_dealloc(ShardsObject *self) {
    ferry_shards_close(self->s);
    Py_XDECREF(self->ctx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Shards_close(ShardsObject *self, PyObject *noarg) {
    if (self->busy) return PyErr_Format(PyExc_RuntimeError, "ferry Shards: cannot close while %d read(s) run", self->busy);
    ferry_shards_close(self->s);
    self->s = NULL;
    Py_RETURN_NONE;
}

static Py_ssize_t Shards_len(ShardsObject *self) {
    if (shards_check(self) < 0) return -1;
    return (Py_ssize_t)ferry_shards_count(self->s);
}

static PyObject *Shards_get_format(ShardsObject *self, void *c) {
    if (shards_check(self) < 0) return NULL;
    return PyUnicode_FromString(ferry_shards_format(self->s));
}

static PyObject *Shards_get_nfiles(ShardsObject *self, void *c) {
    if (shards_check(self) < 0) return NULL;
    return PyLong_FromLongLong(ferry_shards_nfiles(self->s));
}

static PyObject *Shards_get_classes(ShardsObject *self, void *c) {
    if (shards_check(self) < 0) return NULL;
    int n = ferry_shards_nclasses(self->s);
    PyObject *l = PyList_New(n);
    for (int i = 0; l && i < n; i++) {
        PyObject *name = PyUnicode_DecodeFSDefault(ferry_shards_class(self->s, i));
        if (!name) { Py_DECREF(l); return NULL; }
        PyList_SET_ITEM(l, i, name);
    }
    return l;
}

/* sample(i) -> {"key", "label", "members": [{"name", "encoding", "path", "offset", "size", "compressed"}]} */
static PyObject *Shards_sample(ShardsObject *self, PyObject *arg) {
    if (shards_check(self) < 0) return NULL;
    long long i = PyLong_AsLongLong(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    ferry_sample_info si;
    int rc = ferry_shards_sample(self->s, i, &si);
    if (rc < 0) {
        if (rc == FERRY_EINVAL) return PyErr_Format(PyExc_IndexError, "%s", ferry_errmsg(self->ctx->ctx));
        return raise_ctx(self->ctx->ctx, rc);
    }
    PyObject *members = PyList_New(si.nmembers);
    for (int m = 0; members && m < si.nmembers; m++) {
        ferry_member_info mi;
        if ((rc = ferry_shards_member(self->s, i, m, &mi)) < 0) { Py_DECREF(members); return raise_ctx(self->ctx->ctx, rc); }
        PyObject *d = Py_BuildValue("{s:s,s:z,s:O&,s:K,s:K,s:O}", "name", mi.name, "encoding", mi.encoding, "path",
                                    PyUnicode_DecodeFSDefault, mi.path, "offset", (unsigned long long)mi.offset, "size",
                                    (unsigned long long)mi.size, "compressed", mi.compressed ? Py_True : Py_False);
        if (!d) { Py_DECREF(members); return NULL; }
        PyList_SET_ITEM(members, m, d);
    }
    if (!members) return NULL;
    return Py_BuildValue("{s:s,s:i,s:N}", "key", si.key, "label", si.label, "members", members);
}

/* read(i, member) -> bytes; member: its index or name */
static PyObject *Shards_read(ShardsObject *self, PyObject *args) {
    long long i;
    PyObject *mo;
    if (!PyArg_ParseTuple(args, "LO", &i, &mo) || shards_check(self) < 0) return NULL;
    int m;
    if (PyUnicode_Check(mo)) {
        const char *name = PyUnicode_AsUTF8(mo);
        if (!name) return NULL;
        m = ferry_shards_find(self->s, i, name);
        if (m == FERRY_ENOTFOUND) return PyErr_Format(PyExc_KeyError, "%s", ferry_errmsg(self->ctx->ctx));
    } else {
        long v = PyLong_AsLong(mo);
        if (v == -1 && PyErr_Occurred()) return NULL;
        m = v < INT32_MIN || v > INT32_MAX ? -1 : (int)v;
    }
    ferry_member_info mi;
    int rc = m < 0 ? m : ferry_shards_member(self->s, i, m, &mi);
    if (rc < 0) {
        if (rc == FERRY_EINVAL) return PyErr_Format(PyExc_IndexError, "%s", ferry_errmsg(self->ctx->ctx));
        return raise_ctx(self->ctx->ctx, rc);
    }
    if (mi.size > (uint64_t)PY_SSIZE_T_MAX) return PyErr_NoMemory();
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)mi.size);
    if (!out) return NULL;
    int64_t got;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    got = ferry_shards_read(self->s, i, m, PyBytes_AS_STRING(out), (size_t)mi.size);
    Py_END_ALLOW_THREADS
    self->busy--;
    if (got < 0) { Py_DECREF(out); return raise_ctx(self->ctx->ctx, (int)got); }
    return out;
}

static PyObject *Shards_enter(PyObject *self, PyObject *noarg) { Py_INCREF(self); return self; }
static PyObject *Shards_exit(ShardsObject *self, PyObject *args) { return Shards_close(self, NULL); }

static PyMethodDef Shards_methods[] = {
    {"sample", (PyCFunction)Shards_sample, METH_O, "sample(i) -> {key, label, members: [{name, encoding, path, offset, size, compressed}]}"},
    {"read", (PyCFunction)Shards_read, METH_VARARGS, "read(i, member) -> bytes of member (an index or a name) of sample i"},
    {"close", (PyCFunction)Shards_close, METH_NOARGS, "free the index"},
    {"__enter__", Shards_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Shards_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Shards_getset[] = {
    {"format", (getter)Shards_get_format, NULL, "\"tar\", \"mds\", \"folder\" or \"files\"", NULL},
    {"nfiles", (getter)Shards_get_nfiles, NULL, "shard files in the set", NULL},
    {"classes", (getter)Shards_get_classes, NULL, "class names of a folder set, in label order", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods Shards_seq = {.sq_length = (lenfunc)Shards_len};

PyTypeObject ShardsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Shards",
    .tp_doc = "Shards(paths, format=None, ctx=None): an index of WebDataset tar, Mosaic MDS or image-folder shards",
    .tp_basicsize = sizeof(ShardsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Shards_init,
    .tp_dealloc = (destructor)Shards_dealloc,
    .tp_methods = Shards_methods,
    .tp_getset = Shards_getset,
    .tp_as_sequence = &Shards_seq,
};

/* ------------------------------------------------------------------------- */
/* Decoders                                                                   */
/* ------------------------------------------------------------------------- */
static PyObject *info_dict(const ferry_image_info *in, unsigned flags) {
    static const char *const fmt[] = {"unknown", "jpeg", "png"};
    return Py_BuildValue("{s:s,s:I,s:I,s:i,s:i,s:O,s:i,s:O,s:i}", "format", fmt[in->format <= 2 ? in->format : 0],
                         "width", in->width, "height", in->height, "channels", in->channels, "subsampling",
                         in->subsampling, "progressive", in->progressive ? Py_True : Py_False, "bit_depth",
                         in->bit_depth, "cmyk", in->cmyk ? Py_True : Py_False, "out_channels",
                         ferry_image_out_channels(in, flags));
}

/* image_probe(data, keep_gray=False) -> dict */
PyObject *mod_image_probe(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"data", "keep_gray", NULL};
    Py_buffer b;
    int keep_gray = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|p", kwlist, &b, &keep_gray)) return NULL;
    ferry_image_info in;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_image_probe(b.buf, (size_t)b.len, &in);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (rc < 0) return raise_code_msg(rc, ferry_errmsg(NULL));
    return info_dict(&in, keep_gray ? FERRY_IMAGE_KEEP_GRAY : 0);
}

/* image_decode(data, out, keep_gray=False) -> dict of the header; out: a writable C-contiguous buffer */
PyObject *mod_image_decode(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"data", "out", "keep_gray", NULL};
    Py_buffer b, o;
    int keep_gray = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*w*|p", kwlist, &b, &o, &keep_gray)) return NULL;
    ferry_image_info in;
    unsigned flags = keep_gray ? FERRY_IMAGE_KEEP_GRAY : 0;
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_image_decode(b.buf, (size_t)b.len, o.buf, (size_t)o.len, flags, &in);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    PyBuffer_Release(&o);
    if (rc < 0) return raise_code_msg((int)rc, ferry_errmsg(NULL));
    return info_dict(&in, flags);
}

/* image_decode_batch(datas, outs, labels=None, keep_gray=False, threads=0) -> list of header dicts */
PyObject *mod_image_decode_batch(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"datas", "outs", "labels", "keep_gray", "threads", NULL};
    PyObject *datas, *outs, *labels = Py_None;
    int keep_gray = 0, threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|Opi", kwlist, &datas, &outs, &labels, &keep_gray, &threads))
        return NULL;
    PyObject *ds = PySequence_Fast(datas, "datas: a sequence of bytes-like objects");
    PyObject *os = ds ? PySequence_Fast(outs, "outs: a sequence of writable buffers") : NULL;
    PyObject *ls = os && labels != Py_None ? PySequence_Fast(labels, "labels: a sequence of str") : NULL;
    if (!os || (labels != Py_None && !ls)) { Py_XDECREF(ds); Py_XDECREF(os); return NULL; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ds);
    PyObject *result = NULL;
    if (PySequence_Fast_GET_SIZE(os) != n || (ls && PySequence_Fast_GET_SIZE(ls) != n)) {
        PyErr_SetString(PyExc_ValueError, "datas, outs and labels must have one length");
        goto done0;
    }
    Py_buffer *views = calloc(2 * (size_t)n + 1, sizeof *views);
    ferry_image_job *jobs = calloc((size_t)n + 1, sizeof *jobs);
    Py_ssize_t got = 0;
    if (!views || !jobs) { PyErr_NoMemory(); goto done; }
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(ds, got), &views[2 * got], PyBUF_SIMPLE) < 0) goto done;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(os, got), &views[2 * got + 1], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            PyBuffer_Release(&views[2 * got]);
            goto done;
        }
        jobs[got].data = views[2 * got].buf;
        jobs[got].size = (size_t)views[2 * got].len;
        jobs[got].dst = views[2 * got + 1].buf;
        jobs[got].cap = (size_t)views[2 * got + 1].len;
        if (ls && !(jobs[got].label = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(ls, got)))) { got++; goto done; }
    }
    unsigned flags = keep_gray ? FERRY_IMAGE_KEEP_GRAY : 0;
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_image_decode_batch(jobs, (size_t)n, flags, threads);
    Py_END_ALLOW_THREADS
    if (rc < 0) { raise_code_msg((int)rc, ferry_errmsg(NULL)); goto done; }
    result = PyList_New(n);
    for (Py_ssize_t i = 0; result && i < n; i++) {
        PyObject *d = info_dict(&jobs[i].info, flags);
        if (!d) { Py_CLEAR(result); break; }
        PyList_SET_ITEM(result, i, d);
    }
done:
    for (Py_ssize_t i = 0; i < got; i++) { PyBuffer_Release(&views[2 * i]); PyBuffer_Release(&views[2 * i + 1]); }
    free(views);
    free(jobs);
done0:
    Py_DECREF(ds);
    Py_DECREF(os);
    Py_XDECREF(ls);
    return result;
}

/* nvjpeg_status() -> "loaded nvJPEG 12.4 from ..." or why not (loads CUDA and nvJPEG once) */
PyObject *mod_nvjpeg_status(PyObject *m, PyObject *noarg) {
    const char *s;
    Py_BEGIN_ALLOW_THREADS
    s = ferry_nvjpeg_status();
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(s);
}

/* ------------------------------------------------------------------------- */
/* Batches: ferry_image_batch                                                 */
/* ------------------------------------------------------------------------- */
static int word_index(const char *w, const char *const *words, int n, const char *what) {
    for (int i = 0; i < n; i++)
        if (words[i] && !strcmp(w, words[i])) return i;
    PyErr_Format(PyExc_ValueError, "%s: %s is not one of the accepted values", what, w);
    return -1;
}

static int float3(PyObject *o, float *out, const char *what) {
    if (o == Py_None) return 0;
    PyObject *seq = PySequence_Fast(o, "a sequence of 1 or 3 numbers");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != 1 && n != 3) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: 1 or 3 values, got %zd", what, n);
        return -1;
    }
    for (int k = 0; k < 3; k++) {
        double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, n == 1 ? 0 : k));
        if (v == -1.0 && PyErr_Occurred()) { Py_DECREF(seq); return -1; }
        out[k] = (float)v;
    }
    Py_DECREF(seq);
    return 1;
}

/* image_batch(shards, samples, out, height, width, layout="CHW", dtype="uint8", crop="random_resized",
 *             scale=(0.08, 1.0), ratio=(0.75, 4/3), flip=0.0, mean=None, std=None, seed=0, epoch=0,
 *             member=None, on_error="raise", decode="auto", threads=0, stream=0) -> dict */
PyObject *mod_image_batch(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"shards", "samples", "out", "height", "width", "layout", "dtype", "crop", "scale",
                             "ratio", "flip", "mean", "std", "seed", "epoch", "member", "on_error", "decode",
                             "threads", "stream", NULL};
    PyObject *so, *samples, *out, *crop = Py_None, *mean = Py_None, *stdv = Py_None;
    unsigned h, w;
    const char *layout = "CHW", *dtype = "uint8", *member = NULL, *on_error = "raise", *decode = "auto";
    double s0 = 0.08, s1 = 1.0, r0 = 3.0 / 4.0, r1 = 4.0 / 3.0, flip = 0;
    unsigned long long seed = 0, epoch = 0, stream = 0;
    int threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOII|ssO(dd)(dd)dOOKKzssiK", kwlist, &ShardsType, &so, &samples,
                                     &out, &h, &w, &layout, &dtype, &crop, &s0, &s1, &r0, &r1, &flip, &mean, &stdv,
                                     &seed, &epoch, &member, &on_error, &decode, &threads, &stream))
        return NULL;
    ShardsObject *sh = (ShardsObject *)so;
    if (shards_check(sh) < 0) return NULL;
    ferry_image_batch_args a;
    memset(&a, 0, sizeof a);
    static const char *const crops[] = {"random_resized", "center", "resize"};
    static const char *const layouts[] = {"CHW", "HWC"}, *const errs[] = {"raise", "skip"};
    static const char *const decs[] = {"auto", "gpu", "cpu"};
    int ci = 3;
    if (crop != Py_None) {
        const char *c = PyUnicode_Check(crop) ? PyUnicode_AsUTF8(crop) : NULL;
        if (!c) return PyErr_Format(PyExc_TypeError, "crop: a str or None");
        if ((ci = word_index(c, crops, 3, "crop (random_resized, center, resize or None)")) < 0) return NULL;
    }
    int li = word_index(layout, layouts, 2, "layout (CHW or HWC)"), ei = li < 0 ? -1 : word_index(on_error, errs, 2, "on_error (raise or skip)");
    int di = ei < 0 ? -1 : word_index(decode, decs, 3, "decode (auto, gpu or cpu)");
    if (di < 0) return NULL;
    ferry_dtype dt;
    if (ferry_dtype_parse(dtype, &dt) < 0 || (dt != FERRY_DT_U8 && dt != FERRY_DT_F16 && dt != FERRY_DT_BF16 && dt != FERRY_DT_F32))
        return PyErr_Format(PyExc_ValueError, "dtype %s: uint8, float16, bfloat16 or float32", dtype);
    a.xf.height = h;
    a.xf.width = w;
    a.xf.crop = (ferry_image_crop)ci;
    a.xf.scale[0] = s0; a.xf.scale[1] = s1; a.xf.ratio[0] = r0; a.xf.ratio[1] = r1;
    a.xf.flip = flip;
    a.xf.layout = (ferry_image_layout)li;
    a.xf.dtype = dt;
    int hm = float3(mean, a.xf.mean, "mean"), hs = hm < 0 ? -1 : float3(stdv, a.xf.std, "std");
    if (hm < 0 || hs < 0) return NULL;
    if ((hm || hs) && dt == FERRY_DT_U8)
        return PyErr_Format(PyExc_ValueError, "uint8 output is not normalised: pass mean=None and std=None");
    if (hm != hs) return PyErr_Format(PyExc_ValueError, "mean and std come together");
    a.seed = seed;
    a.epoch = epoch;
    a.member = member;
    a.on_error = (ferry_on_error)ei;
    a.decode = di == 0 ? FERRY_DECODE_AUTO : di == 1 ? FERRY_DECODE_GPU : FERRY_DECODE_CPU;
    a.threads = threads;
    a.stream = (void *)(uintptr_t)stream;
    a.shards = sh->s;
    PyObject *seq = PySequence_Fast(samples, "samples: a sequence of sample indices");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t *idx = malloc(((size_t)n + 1) * sizeof *idx);
    size_t *skipped = malloc(((size_t)n + 1) * sizeof *skipped);
    PyObject *res = NULL;
    parsed_buf d = {0};
    if (!idx || !skipped) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) goto done;
        idx[i] = v;
    }
    if (parse_buffer(out, 1, &d) < 0) goto done;
    a.samples = idx;
    a.n = (size_t)n;
    a.dst = d.buf;
    ferry_image_batch_stats st;
    memset(&st, 0, sizeof st);
    st.skipped = skipped;
    int64_t rc;
    sh->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_image_batch(sh->ctx->ctx, &a, &st);
    Py_END_ALLOW_THREADS
    sh->busy--;
    if (rc < 0) { raise_ctx(sh->ctx->ctx, (int)rc); goto done; }
    PyObject *sk = PyList_New((Py_ssize_t)st.nskipped), *fb = sk ? PyDict_New() : NULL;
    for (size_t i = 0; sk && i < st.nskipped; i++) {
        PyObject *v = PyLong_FromSize_t(st.skipped[i]);
        if (!v) { Py_CLEAR(sk); break; }
        PyList_SET_ITEM(sk, (Py_ssize_t)i, v);
    }
    for (int k = 0; sk && fb && k < FERRY_IMAGE_FB_COUNT_; k++) {
        PyObject *v = PyLong_FromSize_t(st.fallbacks[k]);
        if (!v || PyDict_SetItemString(fb, ferry_image_fallback_name(k), v) < 0) { Py_XDECREF(v); Py_CLEAR(fb); break; }
        Py_DECREF(v);
    }
    if (sk && fb)
        res = Py_BuildValue("{s:n,s:N,s:n,s:n,s:n,s:N,s:{s:d,s:d,s:d,s:d,s:d}}", "written", (Py_ssize_t)st.written,
                            "skipped", sk, "gpu", (Py_ssize_t)st.gpu, "gpu_hardware", (Py_ssize_t)st.gpu_hw, "cpu",
                            (Py_ssize_t)st.cpu, "fallbacks", fb, "seconds", "call", st.seconds, "prepare",
                            st.prepare_s, "cpu_decode", st.cpu_decode_s, "gpu", st.gpu_s, "wait", st.wait_s);
    else { Py_XDECREF(sk); Py_XDECREF(fb); }
done:
    Py_XDECREF(d.keep);
    Py_DECREF(seq);
    free(idx);
    free(skipped);
    return res;
}
