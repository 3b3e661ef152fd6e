/*
 * job.c — ferry._ferry.Job (a ferry_job): a submitted plan; wait, done,
 * cancel, stream_wait. It keeps the plan's references until it completes.
 */
#include "ferry_ext.h"

/* ------------------------------------------------------------------------- */
/* Job                                                                        */
/* ------------------------------------------------------------------------- */
static void job_finish(JobObject *self, int64_t rc) {
    /* Called with the GIL after a wait that did not time out. */
    self->finished = 1;
    self->result = rc;
    if (rc < 0) {
        const char *m = ferry_errmsg(self->ctx->ctx);
        snprintf(self->errmsg, sizeof self->errmsg, "%s", (m && *m) ? m : ferry_strerror((int)rc));
    }
    self->path = ferry_job_path(self->job);
    if (self->refs) refs_users(self->refs, -1);
    Py_CLEAR(self->refs);
}

static PyObject *Job_wait(JobObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"timeout", NULL};
    PyObject *to = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &to)) return NULL;
    if (!self->job) { PyErr_SetString(PyExc_ValueError, "Job not started"); return NULL; }
    if (!self->finished) {
        int64_t ns = -1;
        if (to != Py_None) {
            double s = PyFloat_AsDouble(to);
            if (s == -1.0 && PyErr_Occurred()) return NULL;
            ns = s <= 0 ? 0 : (int64_t)(s * 1e9);
        }
        int64_t rc;
        Py_BEGIN_ALLOW_THREADS
        rc = ferry_job_wait(self->job, ns);
        Py_END_ALLOW_THREADS
        if (rc == FERRY_ETIMEDOUT) return raise_ctx(self->ctx->ctx, (int)rc);
        job_finish(self, rc);
    }
    if (self->result < 0) return raise_code_msg((int)self->result, self->errmsg);
    return PyLong_FromLongLong(self->result);
}

static PyObject *Job_done(JobObject *self, PyObject *noarg) {
    if (!self->job) Py_RETURN_FALSE;
    if (self->finished) Py_RETURN_TRUE;
    int d;
    Py_BEGIN_ALLOW_THREADS
    d = ferry_job_done(self->job);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(d);
}

static PyObject *Job_cancel(JobObject *self, PyObject *noarg) {
    if (self->job && !self->finished) {
        Py_BEGIN_ALLOW_THREADS
        ferry_job_cancel(self->job);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *Job_stream_wait(JobObject *self, PyObject *arg) {
    if (!self->job) { PyErr_SetString(PyExc_ValueError, "Job not started"); return NULL; }
    unsigned long long s = 0;
    if (arg != Py_None) {
        s = PyLong_AsUnsignedLongLong(arg);
        if (s == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_job_stream_wait(self->job, (void *)(uintptr_t)s);
    Py_END_ALLOW_THREADS
    if (rc < 0) return raise_ctx(self->ctx->ctx, rc);
    Py_RETURN_NONE;
}

static PyObject *Job_get_path(JobObject *self, void *c) {
    if (!self->job) return PyUnicode_FromString("auto");
    ferry_path p = self->finished ? self->path : ferry_job_path(self->job);
    return PyUnicode_FromString(ferry_path_name(p));
}

static void Job_dealloc(JobObject *self) {
    if (self->job) {
        ferry_job *j = self->job;
        self->job = NULL;
        Py_BEGIN_ALLOW_THREADS
        ferry_job_destroy(j);     /* waits for completion before the refs go */
        Py_END_ALLOW_THREADS
        if (self->refs) refs_users(self->refs, -1);
    }
    Py_XDECREF(self->refs);
    Py_XDECREF(self->ctx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Job_repr(JobObject *self) {
    if (self->finished)
        return PyUnicode_FromFormat("<ferry.Job done result=%lld path=%s>", (long long)self->result,
                                    ferry_path_name(self->path));
    return PyUnicode_FromFormat("<ferry.Job running>");
}

static PyMethodDef Job_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))Job_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout=None) -> bytes moved; FerryError on failure (code ETIMEDOUT on timeout: the job goes on)"},
    {"done", (PyCFunction)Job_done, METH_NOARGS, "True once complete (successfully or not)"},
    {"cancel", (PyCFunction)Job_cancel, METH_NOARGS, "request cancellation"},
    {"stream_wait", (PyCFunction)Job_stream_wait, METH_O,
     "stream_wait(stream): make a CUstream (int handle; 0/None: legacy default) wait on the job"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Job_getset[] = {
    {"path", (getter)Job_get_path, NULL, "which path served the job", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject JobType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Job",
    .tp_basicsize = sizeof(JobObject),
    .tp_dealloc = (destructor)Job_dealloc,
    .tp_repr = (reprfunc)Job_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A running plan (Context.submit). Keeps the plan's buffers alive until waited on or freed.",
    .tp_methods = Job_methods,
    .tp_getset = Job_getset,
};
