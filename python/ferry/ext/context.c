/*
 * context.c — ferry._ferry.Context (a ferry_ctx): configuration, statistics,
 * run/submit of plans, memcpy, and the process-wide default context.
 */
#include "ferry_ext.h"
#include "ferry_experimental.h"

static PyObject *default_ctx;       /* lazily created Context (default_context()) */

/* ------------------------------------------------------------------------- */
/* Context                                                                    */
/* ------------------------------------------------------------------------- */

int ctx_check(ContextObject *c) {
    if (!c->ctx || c->closed) {
        PyErr_SetString(PyExc_ValueError, "ferry Context is closed");
        return -1;
    }
    return 0;
}

static const char *direct_name(ferry_direct d) { return ferry_direct_name(d); }

/* A numeric keyword through the package's one validator (ferry/_checks.py: check, or
 * check_size for sizes), so a C type's keywords answer as every Python function's do: the
 * value, or -1 with the ValueError (KeywordTypeError for a wrong type) naming it. NULL: 0. */
static int check_keyword(const char *where, const char *fn, const char *name, PyObject *v,
                         long long lo, long long hi, long long *out) {
    *out = 0;
    if (v == NULL) return 0;
    if (PyLong_CheckExact(v)) {                   /* the common case, without a call */
        long long x = PyLong_AsLongLong(v);
        if (!(x == -1 && PyErr_Occurred()) && x >= lo && x <= hi) { *out = x; return 0; }
        PyErr_Clear();
    }
    PyObject *m = PyImport_ImportModule("ferry._checks");
    if (!m) return -1;
    PyObject *r = PyObject_CallMethod(m, fn, "ssO", where, name, v);
    Py_DECREF(m);
    if (!r) return -1;
    *out = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int Context_init(ContextObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"threads", "path", "direct", "task_size", "staging_size",
                             "staging_count", "small_io", "no_env", NULL};
    int no_env = 0;
    PyObject *path = NULL, *direct = NULL, *threads_o = NULL, *count_o = NULL;
    PyObject *task_o = NULL, *staging_o = NULL, *small_o = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOOOOOOp", kwlist, &threads_o, &path, &direct,
                                     &task_o, &staging_o, &count_o, &small_o, &no_env))
        return -1;
    /* fast-path bounds only; the validator's table (RANGES, SIZES) decides the rest */
    long long threads, staging_count, task_size, staging_size, small_io;
    if (check_keyword("ferry.Context", "check", "threads", threads_o, 0, 256, &threads) < 0 ||
        check_keyword("ferry.Context", "check", "staging_count", count_o, 0, 16, &staging_count) < 0 ||
        check_keyword("ferry.Context", "check_size", "task_size", task_o, 0, 1LL << 40, &task_size) < 0 ||
        check_keyword("ferry.Context", "check_size", "staging_size", staging_o, 0, 1LL << 40, &staging_size) < 0 ||
        check_keyword("ferry.Context", "check_size", "small_io", small_o, 0, 1LL << 40, &small_io) < 0)
        return -1;
    if (self->ctx) { PyErr_SetString(PyExc_RuntimeError, "Context already initialised"); return -1; }
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.threads = threads;
    cfg.task_size = (size_t)task_size;
    cfg.staging_size = (size_t)staging_size;
    cfg.staging_count = staging_count;
    cfg.small_io = (size_t)small_io;
    cfg.no_env = no_env;
    if (parse_path_name(path, &cfg.path) < 0) return -1;
    if (parse_direct_name(direct, &cfg.direct) < 0) return -1;
    ferry_ctx *ctx = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_ctx_create(&ctx, &cfg);
    Py_END_ALLOW_THREADS
    if (rc < 0) { raise_code_msg(rc, ferry_errmsg(NULL)); return -1; }   /* the thread's message: which knob, why */
    self->ctx = ctx;
    self->closed = 0;
    return 0;
}

static void Context_dealloc(ContextObject *self) {
    if (self->ctx) {
        ferry_ctx *ctx = self->ctx;
        self->ctx = NULL;
        Py_BEGIN_ALLOW_THREADS
        ferry_ctx_destroy(ctx);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Context_close(ContextObject *self, PyObject *noarg) {
    /* Files, datasets, jobs and arrays hold a reference to their Context, so
     * the engine itself is destroyed when the last of them goes; close() makes
     * this object refuse new work. */
    self->closed = 1;
    Py_RETURN_NONE;
}

static PyObject *Context_enter(PyObject *self, PyObject *noarg) { Py_INCREF(self); return self; }
static PyObject *Context_exit(ContextObject *self, PyObject *args) { return Context_close(self, NULL); }

static PyObject *Context_config(ContextObject *self, PyObject *noarg) {
    if (ctx_check(self) < 0) return NULL;
    ferry_config c;
    Py_BEGIN_ALLOW_THREADS
    ferry_ctx_config(self->ctx, &c);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("{s:i,s:K,s:K,s:i,s:s,s:s,s:K,s:O}", "threads", c.threads,
                         "task_size", (unsigned long long)c.task_size,
                         "staging_size", (unsigned long long)c.staging_size,
                         "staging_count", c.staging_count, "path", ferry_path_name(c.path),
                         "direct", direct_name(c.direct), "small_io", (unsigned long long)c.small_io,
                         "no_env", c.no_env ? Py_True : Py_False);
}

static PyObject *path_stats_dict(const ferry_path_stats *p) {
    return Py_BuildValue("{s:K,s:K,s:d}", "bytes", (unsigned long long)p->bytes, "ops",
                         (unsigned long long)p->ops, "seconds", p->seconds);
}

static PyObject *Context_stats(ContextObject *self, PyObject *noarg) {
    if (ctx_check(self) < 0) return NULL;
    ferry_stats s;
    Py_BEGIN_ALLOW_THREADS
    ferry_stats_get(self->ctx, &s);
    Py_END_ALLOW_THREADS
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int p = 1; p < FERRY_PATH_COUNT_; p++) {
        PyObject *v = path_stats_dict(&s.path[p]);
        if (!v || PyDict_SetItemString(d, ferry_path_name((ferry_path)p), v) < 0) {
            Py_XDECREF(v); Py_DECREF(d); return NULL;
        }
        Py_DECREF(v);
    }
#define PUT(name, val)                                                        \
    do {                                                                      \
        PyObject *v_ = PyLong_FromUnsignedLongLong((unsigned long long)(val)); \
        if (!v_ || PyDict_SetItemString(d, name, v_) < 0) {                   \
            Py_XDECREF(v_); Py_DECREF(d); return NULL;                        \
        }                                                                     \
        Py_DECREF(v_);                                                        \
    } while (0)
    PUT("direct_bytes", s.direct_bytes);
    PUT("buffered_bytes", s.buffered_bytes);
    PUT("decoded_bytes", s.decoded_bytes);
    PUT("fallbacks", s.fallbacks);
    PUT("jobs", s.jobs);
    PUT("gpu_decoded_bytes", s.gpu_decoded_bytes);   /* gpudecode.c: nvCOMP's share */
    PUT("gpu_chunks", s.gpu_chunks);
    PUT("gpu_batches", s.gpu_batches);
    PUT("gpu_cpu_fallbacks", s.gpu_cpu_fallbacks);
    PUT("image_gpu", s.image_gpu);               /* ferry_image_batch: images nvJPEG decoded */
    PUT("image_cpu", s.image_cpu);
    PUT("image_skipped", s.image_skipped);
    PUT("image_fallbacks", s.image_fallbacks);
#undef PUT
    return d;
}

static PyObject *Context_reset_stats(ContextObject *self, PyObject *noarg) {
    if (ctx_check(self) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    ferry_stats_reset(self->ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Context_cuda_device_count(ContextObject *self, PyObject *noarg) {
    if (ctx_check(self) < 0) return NULL;
    int n;
    Py_BEGIN_ALLOW_THREADS
    n = ferry_cuda_device_count(self->ctx);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(n);
}

static PyObject *Context_get_cuda_status(ContextObject *self, void *closure) {
    if (ctx_check(self) < 0) return NULL;
    const char *s;
    Py_BEGIN_ALLOW_THREADS
    s = ferry_cuda_status(self->ctx);
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(s ? s : "");
}

static PyObject *Context_get_cufile_status(ContextObject *self, void *closure) {
    if (ctx_check(self) < 0) return NULL;
    const char *s;
    Py_BEGIN_ALLOW_THREADS
    s = ferry_cufile_status(self->ctx);
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(s ? s : "");
}

static PyObject *Context_get_closed(ContextObject *self, void *closure) {
    return PyBool_FromLong(self->closed || !self->ctx);
}

/* ------------------------------------------------------------------------- */
/* Context: run / submit / memory helpers                                     */
/* ------------------------------------------------------------------------- */
static int parse_run_opts(PyObject *path, int threads, int sync, int no_direct, int reread, ferry_run_opts *o) {
    memset(o, 0, sizeof *o);
    if (parse_path_name(path, &o->path) < 0) return -1;
    o->threads = threads;
    o->flags = (sync ? FERRY_SYNC : 0) | (no_direct ? FERRY_NO_DIRECT : 0) | (reread ? FERRY_REREAD : 0);
    return 0;
}

/* The arguments run() and submit() share: (plan, path=, threads=, sync=,
 * no_direct=, decode=, reread=) into *plan and *o. -1 with an exception set. */
static int run_args(ContextObject *self, PyObject *args, PyObject *kw, PlanObject **plan, ferry_run_opts *o) {
    static char *kwlist[] = {"plan", "path", "threads", "sync", "no_direct", "decode", "reread", NULL};
    PyObject *path = NULL, *threads_o = NULL;
    int sync = 0, no_direct = 0, reread = 0;
    const char *decode = NULL;
    long long threads;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|OOppzp", kwlist, &PlanType, plan, &path,
                                     &threads_o, &sync, &no_direct, &decode, &reread))
        return -1;
    if (check_keyword("ferry.Context.run/submit", "check", "threads", threads_o, 0, 256, &threads) < 0) return -1;
    if (ctx_check(self) < 0) return -1;
    if (parse_run_opts(path, (int)threads, sync, no_direct, reread, o) < 0) return -1;
    return parse_decode_name(decode, &o->decode);
}

static PyObject *Context_run(ContextObject *self, PyObject *args, PyObject *kw) {
    PlanObject *plan;
    ferry_run_opts o;
    if (run_args(self, args, kw, &plan, &o) < 0) return NULL;
    int64_t rc;
    plan->busy++;
    refs_users(plan->refs, +1);
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_run(self->ctx, plan->plan, &o);
    Py_END_ALLOW_THREADS
    refs_users(plan->refs, -1);
    plan->busy--;
    if (rc < 0) return raise_ctx(self->ctx, (int)rc);
    return PyLong_FromLongLong(rc);
}

static PyObject *Context_submit(ContextObject *self, PyObject *args, PyObject *kw) {
    PlanObject *plan;
    ferry_run_opts o;
    if (run_args(self, args, kw, &plan, &o) < 0) return NULL;
    JobObject *job = PyObject_New(JobObject, &JobType);
    if (!job) return NULL;
    job->ctx = NULL; job->job = NULL; job->finished = 0; job->result = 0;
    job->errmsg[0] = 0; job->path = FERRY_PATH_AUTO;
    job->refs = PySequence_Tuple(plan->refs);
    if (!job->refs) { Py_DECREF(job); return NULL; }
    Py_INCREF(self);
    job->ctx = self;
    ferry_job *j = NULL;
    int rc;
    plan->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_submit(self->ctx, plan->plan, &o, &j);
    Py_END_ALLOW_THREADS
    plan->busy--;
    if (rc < 0) {
        raise_ctx(self->ctx, rc);
        Py_DECREF(job);
        return NULL;
    }
    job->job = j;
    refs_users(job->refs, +1);   /* released when the job finishes or is freed */
    return (PyObject *)job;
}

static PyObject *Context_memcpy(ContextObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"dst", "src", "nbytes", NULL};
    PyObject *dsto, *srco, *no = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O", kwlist, &dsto, &srco, &no)) return NULL;
    if (ctx_check(self) < 0) return NULL;
    parsed_buf d, s;
    if (parse_buffer(dsto, 1, &d) < 0) return NULL;
    if (parse_buffer(srco, 0, &s) < 0) { Py_DECREF(d.keep); return NULL; }
    size_t n = s.buf.size < d.buf.size ? s.buf.size : d.buf.size;
    if (no != Py_None) {
        unsigned long long v = PyLong_AsUnsignedLongLong(no);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) goto fail;
        if (v > s.buf.size || v > d.buf.size) {
            PyErr_SetString(PyExc_ValueError, "nbytes exceeds a buffer");
            goto fail;
        }
        n = (size_t)v;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_memcpy(self->ctx, d.buf, s.buf, n);
    Py_END_ALLOW_THREADS
    Py_DECREF(d.keep); Py_DECREF(s.keep);
    if (rc < 0) return raise_ctx(self->ctx, rc);
    return PyLong_FromSize_t(n);
fail:
    Py_DECREF(d.keep); Py_DECREF(s.keep);
    return NULL;
}

static PyObject *Context_cuda_device_of(ContextObject *self, PyObject *arg) {
    if (ctx_check(self) < 0) return NULL;
    unsigned long long p = PyLong_AsUnsignedLongLong(arg);
    if (p == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_cuda_device_of(self->ctx, (uintptr_t)p);
    Py_END_ALLOW_THREADS
    if (rc < 0) return raise_ctx(self->ctx, rc);
    return PyLong_FromLong(rc);
}

/* job_bytes(plan, decode=None): ferry_plan_job_bytes (ferry.h) */
static PyObject *Context_job_bytes(ContextObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"plan", "decode", NULL};
    PlanObject *plan;
    const char *decode = NULL;
    int policy = FERRY_DECODE_AUTO;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|z", kwlist, &PlanType, &plan, &decode)) return NULL;
    if (ctx_check(self) < 0 || plan_check(plan) < 0 || parse_decode_name(decode, &policy) < 0) return NULL;
    uint64_t b;
    Py_BEGIN_ALLOW_THREADS
    b = ferry_plan_job_bytes(self->ctx, plan->plan, policy);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLongLong(b);
}

/* plan_budget(plan, unit_bytes, keep_free=None, decode=None): ferry_plan_budget
 * (ferry_experimental.h) as a dict; keep_free None: the library's default */
static PyObject *Context_plan_budget(ContextObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"plan", "unit_bytes", "keep_free", "decode", NULL};
    PlanObject *plan;
    unsigned long long unit = 0;
    PyObject *keep_obj = Py_None;
    const char *decode = NULL;
    int policy = FERRY_DECODE_AUTO;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!K|Oz", kwlist, &PlanType, &plan, &unit, &keep_obj, &decode)) return NULL;
    if (ctx_check(self) < 0 || plan_check(plan) < 0 || parse_decode_name(decode, &policy) < 0) return NULL;
    uint64_t keep = FERRY_KEEP_FREE_DEFAULT;
    if (keep_obj != Py_None) {
        keep = PyLong_AsUnsignedLongLong(keep_obj);
        if (keep == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    }
    ferry_budget b;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_plan_budget(self->ctx, plan->plan, policy, (uint64_t)unit, keep, &b);
    Py_END_ALLOW_THREADS
    if (rc < 0) return raise_ctx(self->ctx, rc);
    return Py_BuildValue("{s:K,s:K,s:i,s:K,s:K,s:K,s:K}", "units", (unsigned long long)b.units, "job_bytes",
                         (unsigned long long)b.job_bytes, "jobs", b.jobs, "job_device_bytes",
                         (unsigned long long)b.job_device_bytes, "device_bytes", (unsigned long long)b.device_bytes,
                         "free_bytes", (unsigned long long)b.free_bytes, "keep_free", (unsigned long long)b.keep_free);
}

/* set_remote_option(name, value): ferry_ctx_set_remote_option (ferry_experimental.h); value None unsets */
static PyObject *Context_set_remote_option(ContextObject *self, PyObject *args) {
    const char *name, *value = NULL;
    if (!PyArg_ParseTuple(args, "s|z", &name, &value)) return NULL;
    if (ctx_check(self) < 0) return NULL;
    int rc = ferry_ctx_set_remote_option(self->ctx, name, value);
    if (rc < 0) return raise_ctx(self->ctx, rc);
    Py_RETURN_NONE;
}

/* url_glob(pattern) -> [url, ...]: ferry_url_glob (ferry_experimental.h), sorted */
static PyObject *Context_url_glob(ContextObject *self, PyObject *arg) {
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(arg, &b)) return NULL;
    if (ctx_check(self) < 0) { Py_DECREF(b); return NULL; }
    char *urls = NULL;
    size_t n = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_url_glob(self->ctx, PyBytes_AS_STRING(b), &urls, &n);
    Py_END_ALLOW_THREADS
    Py_DECREF(b);
    if (rc < 0) return raise_ctx(self->ctx, rc);
    PyObject *out = PyList_New((Py_ssize_t)n);
    const char *u = urls;
    for (size_t i = 0; out && i < n; i++) {
        PyObject *s = PyUnicode_DecodeFSDefault(u);
        if (!s) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, (Py_ssize_t)i, s);
        u += strlen(u) + 1;
    }
    free(urls);
    return out;
}

/* format_detect(path): ferry_format_detect with this context (its remote options);
 * the module's format_detect calls it with the default context */
PyObject *Context_format_detect(ContextObject *self, PyObject *arg) {
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(arg, &b)) return NULL;
    if (ctx_check(self) < 0) { Py_DECREF(b); return NULL; }
    const char *fmt = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_format_detect(self->ctx, PyBytes_AS_STRING(b), &fmt);
    Py_END_ALLOW_THREADS
    Py_DECREF(b);
    if (rc < 0) return raise_ctx(self->ctx, rc);
    return PyUnicode_FromString(fmt);
}

static PyMethodDef Context_methods[] = {
    {"config", (PyCFunction)Context_config, METH_NOARGS, "Effective configuration as a dict."},
    {"set_remote_option", (PyCFunction)Context_set_remote_option, METH_VARARGS,
     "set_remote_option(name, value): an option of the remote objects this context opens "
     "(ferry_ctx_set_remote_option: endpoint_url, region, addressing, key, secret, token, profile, anon, "
     "ca_bundle); None unsets"},
    {"url_glob", (PyCFunction)Context_url_glob, METH_O,
     "url_glob(pattern) -> [url, ...]: the s3:// or gs:// objects a glob names, sorted (ferry_url_glob)"},
    {"format_detect", (PyCFunction)Context_format_detect, METH_O,
     "format_detect(path) -> format name, with this context's remote options (ferry_format_detect)"},
    {"stats", (PyCFunction)Context_stats, METH_NOARGS,
     "Per-path statistics: {'cufile'|'staged'|'host': {'bytes','ops','seconds'}, 'direct_bytes', ...}."},
    {"reset_stats", (PyCFunction)Context_reset_stats, METH_NOARGS, "Zero the statistics."},
    {"cuda_device_count", (PyCFunction)Context_cuda_device_count, METH_NOARGS,
     "Number of CUDA devices (0 without a driver)."},
    {"cuda_device_of", (PyCFunction)Context_cuda_device_of, METH_O,
     "cuda_device_of(ptr) -> device ordinal owning a CUDA pointer."},
    {"run", (PyCFunction)(void (*)(void))Context_run, METH_VARARGS | METH_KEYWORDS,
     "run(plan, path=None, threads=0, sync=False, no_direct=False, decode=None, reread=False) -> bytes moved (blocking). "
     "reread: the bytes will be read again (a dataset's epochs): keep them in the page cache (FERRY_REREAD)."},
    {"submit", (PyCFunction)(void (*)(void))Context_submit, METH_VARARGS | METH_KEYWORDS,
     "submit(plan, path=None, threads=0, sync=False, no_direct=False, decode=None, reread=False) -> Job (returns at once)."},
    {"job_bytes", (PyCFunction)(void (*)(void))Context_job_bytes, METH_VARARGS | METH_KEYWORDS,
     "job_bytes(plan, decode=None) -> decoded bytes one job of a stream of plans like this one should hold "
     "(0: any size runs at the decoders' rate)."},
    {"plan_budget", (PyCFunction)(void (*)(void))Context_plan_budget, METH_VARARGS | METH_KEYWORDS,
     "plan_budget(plan, unit_bytes, keep_free=None, decode=None) -> {'units', 'job_bytes', 'jobs', "
     "'job_device_bytes', 'device_bytes', 'free_bytes', 'keep_free'}: ferry_plan_budget (ferry_experimental.h), "
     "how large each job of a stream of plans like this one should be (whole units of unit_bytes) and how many "
     "to keep in the engine (0: any); FerryError where even one unit does not fit."},
    {"memcpy", (PyCFunction)(void (*)(void))Context_memcpy, METH_VARARGS | METH_KEYWORDS,
     "memcpy(dst, src, nbytes=None) -> bytes copied (synchronous; host or device buffers)."},
    {"close", (PyCFunction)Context_close, METH_NOARGS,
     "Refuse new work; the engine is freed when the last object using it goes."},
    {"__enter__", Context_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Context_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyObject *Context_get_nvcomp_status(ContextObject *self, void *closure) {
    if (ctx_check(self) < 0) return NULL;
    const char *s;
    Py_BEGIN_ALLOW_THREADS
    s = ferry_nvcomp_status(self->ctx);
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(s ? s : "");
}

static PyGetSetDef Context_getset[] = {
    {"nvcomp_status", (getter)Context_get_nvcomp_status, NULL, "'loaded nvCOMP X from PATH', or why not", NULL},
    {"cuda_status", (getter)Context_get_cuda_status, NULL, "'' when CUDA works, else why not", NULL},
    {"cufile_status", (getter)Context_get_cufile_status, NULL, "'' when cuFile works, else why not", NULL},
    {"closed", (getter)Context_get_closed, NULL, "True after close()", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject ContextType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Context",
    .tp_basicsize = sizeof(ContextObject),
    .tp_dealloc = (destructor)Context_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Context(threads=0, path='auto', direct='auto', task_size=0, staging_size=0, "
              "staging_count=0, small_io=0, no_env=False): a ferry engine.",
    .tp_methods = Context_methods,
    .tp_getset = Context_getset,
    .tp_init = (initproc)Context_init,
    .tp_new = PyType_GenericNew,
};

/* The module's default context, created on first use. Borrowed reference. */
ContextObject *get_default_ctx(void) {
    /* after fork() the inherited context has no workers: the child gets its own */
    static pid_t default_pid;
    if (default_ctx && default_pid != getpid()) Py_CLEAR(default_ctx);   /* destroy is a no-op in a child */
    if (!default_ctx) {
        default_pid = getpid();
        default_ctx = PyObject_CallNoArgs((PyObject *)&ContextType);
        if (!default_ctx) return NULL;
    }
    return (ContextObject *)default_ctx;
}

/* ctx argument: a Context or None (the default context). Borrowed. */
ContextObject *ctx_arg(PyObject *o) {
    if (o == NULL || o == Py_None) return get_default_ctx();
    if (!PyObject_TypeCheck(o, &ContextType)) {
        PyErr_SetString(PyExc_TypeError, "ctx must be a ferry Context or None");
        return NULL;
    }
    ContextObject *c = (ContextObject *)o;
    if (ctx_check(c) < 0) return NULL;
    return c;
}
