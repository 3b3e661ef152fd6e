/* imagexform.c — the image transform after decode (src/codecs/imagexform.h),
 * for the image dataset's host path and for tests against torchvision:
 *   image_transform(src, shape, box, size, flip=False, layout="CHW",
 *                   dtype="uint8", mean=None, std=None) -> bytes
 *   random_resized_crop(seed, epoch, sample, h, w, scale, ratio) -> (y, x, h, w)
 *   center_box(h, w, crop_h, crop_w) -> (y, x, h, w)
 *   flip_draw(seed, epoch, sample, p) -> bool
 * The transform runs without the GIL. */
#include "ferry_ext.h"
#include "codecs/imagexform.h"

static int parse_triple(PyObject *o, float *out, const char *what) {
    if (!o || o == Py_None) return 0;
    PyObject *seq = PySequence_Fast(o, "a sequence of 1 or 3 numbers");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != 1 && n != 3) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: 1 or 3 values, got %zd", what, n);
        return -1;
    }
    for (Py_ssize_t k = 0; k < 3; k++) {
        double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, n == 1 ? 0 : k));
        if (v == -1.0 && PyErr_Occurred()) { Py_DECREF(seq); return -1; }
        out[k] = (float)v;
    }
    Py_DECREF(seq);
    return 1;
}

PyObject *mod_image_transform(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"src", "shape", "box", "size", "flip", "layout", "dtype", "mean", "std", NULL};
    Py_buffer b;
    unsigned h, w, c, by, bx, bh, bw, oh, ow;
    int flip = 0;
    const char *layout = "CHW", *dtype = "uint8";
    PyObject *mean = NULL, *stdv = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*(III)(IIII)(II)|pssOO", kwlist, &b, &h, &w, &c, &by, &bx, &bh, &bw,
                                     &oh, &ow, &flip, &layout, &dtype, &mean, &stdv))
        return NULL;
    ferry_img_out o = {oh, ow, c, FERRY_IMG_CHW, FERRY_DT_U8, {0, 0, 0}, {0, 0, 0}};
    PyObject *res = NULL;
    if (!strcmp(layout, "HWC")) o.layout = FERRY_IMG_HWC;
    else if (strcmp(layout, "CHW")) { PyErr_Format(PyExc_ValueError, "layout %s: CHW or HWC", layout); goto done; }
    ferry_dtype dt;
    if (ferry_dtype_parse(dtype, &dt) < 0) { PyErr_Format(PyExc_ValueError, "dtype %s", dtype); goto done; }
    o.dtype = dt;
    int hm = parse_triple(mean, o.mean, "mean"), hs = hm < 0 ? -1 : parse_triple(stdv, o.std, "std");
    if (hm < 0 || hs < 0) goto done;
    if (hm != hs) { PyErr_SetString(PyExc_ValueError, "mean and std come together"); goto done; }
    if (hs && dt == FERRY_DT_U8) { PyErr_SetString(PyExc_ValueError, "uint8 output is not normalised: no mean/std"); goto done; }
    if ((uint64_t)b.len != (uint64_t)h * w * c) {
        PyErr_Format(PyExc_ValueError, "src holds %zd bytes, shape (%u, %u, %u) needs %llu", b.len, h, w, c,
                     (unsigned long long)h * w * c);
        goto done;
    }
    ferry_img_sample s = {{by, bx, bh, bw}, flip};
    int rc = ferry_img_check(&o, &s, h, w, "image_transform");
    if (rc < 0) { raise_code_msg(rc, ferry_errmsg(NULL)); goto done; }
    res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)ferry_img_out_bytes(&o));
    if (!res) goto done;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_img_transform(b.buf, h, w, (size_t)w * c, &s, &o, PyBytes_AS_STRING(res));
    Py_END_ALLOW_THREADS
    if (rc < 0) { Py_CLEAR(res); raise_code_msg(rc, ferry_errmsg(NULL)); }
done:
    PyBuffer_Release(&b);
    return res;
}

PyObject *mod_random_resized_crop(PyObject *m, PyObject *args) {
    unsigned long long seed, epoch, sample;
    unsigned h, w;
    double s0, s1, r0, r1;
    if (!PyArg_ParseTuple(args, "KKKII(dd)(dd)", &seed, &epoch, &sample, &h, &w, &s0, &s1, &r0, &r1)) return NULL;
    ferry_img_box bx;
    int rc = ferry_img_random_resized_crop(seed, epoch, sample, h, w, s0, s1, r0, r1, &bx);
    if (rc < 0) return raise_code_msg(rc, ferry_errmsg(NULL));
    return Py_BuildValue("(IIII)", bx.y, bx.x, bx.h, bx.w);
}

PyObject *mod_center_box(PyObject *m, PyObject *args) {
    unsigned h, w, ch, cw;
    if (!PyArg_ParseTuple(args, "IIII", &h, &w, &ch, &cw)) return NULL;
    ferry_img_box bx = ferry_img_center_box(h, w, ch, cw);
    return Py_BuildValue("(IIII)", bx.y, bx.x, bx.h, bx.w);
}

PyObject *mod_flip_draw(PyObject *m, PyObject *args) {
    unsigned long long seed, epoch, sample;
    double p;
    if (!PyArg_ParseTuple(args, "KKKd", &seed, &epoch, &sample, &p)) return NULL;
    return PyBool_FromLong(ferry_img_flip_draw(seed, epoch, sample, p));
}
