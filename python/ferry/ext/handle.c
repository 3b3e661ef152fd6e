/*
 * handle.c — the lifetime shared by File and Dataset (HANDLE_HEAD in
 * ferry_ext.h): close now, close on dealloc, refuse to close while a running
 * job uses the handle, and the per-job count of those users.
 */
#include "ferry_ext.h"

/* ------------------------------------------------------------------------- */
/* File and Dataset: each owns one ferry handle, closed by close() or when the  */
/* object goes, and never while a running job uses it. The same layout up to   */
/* the handle lets one set of lifetime functions serve both.                   */
/* ------------------------------------------------------------------------- */

static void handle_close_now(HandleObject *self, handle_close_fn close_fn) {
    if (self->h) {
        void *h = self->h;
        self->h = NULL;
        Py_BEGIN_ALLOW_THREADS
        close_fn(h);
        Py_END_ALLOW_THREADS
    }
}

void handle_dealloc(HandleObject *self, handle_close_fn close_fn) {
    handle_close_now(self, close_fn);
    Py_XDECREF(self->path);
    Py_XDECREF(self->ctx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* uses: what the running jobs do with it, for the error ("read", "read or write") */
PyObject *handle_close(HandleObject *self, handle_close_fn close_fn, const char *uses) {
    if (self->users > 0)
        return PyErr_Format(PyExc_RuntimeError, "%U: cannot close: %d running job(s) %s it; wait for them first",
                            self->path, self->users, uses);
    handle_close_now(self, close_fn);
    Py_RETURN_NONE;
}

PyObject *Handle_enter(PyObject *self, PyObject *noarg) { Py_INCREF(self); return self; }

/* Files and datasets a running job reads must not be closed under it: count
 * the jobs using each. */
void refs_users(PyObject *refs, int delta) {
    if (!refs) return;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(refs);
    PyObject **items = PySequence_Fast_ITEMS(refs);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_TypeCheck(items[i], &FileType) || PyObject_TypeCheck(items[i], &DatasetType))
            ((HandleObject *)items[i])->users += delta;
    }
}
