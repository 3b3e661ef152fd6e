/*
 * module.c — the module ferry._ferry itself: FerryError and the raise helpers
 * every binding uses, the module-level functions that belong to no type, the
 * method table and PyInit__ferry (which readies every type). The types live
 * in their own files (ferry_ext.h lists them).
 */
#include "ferry_ext.h"
#include "ferry_experimental.h"

/* ------------------------------------------------------------------------- */
/* Module-wide objects                                                        */
/* ------------------------------------------------------------------------- */
PyObject *FerryError;        /* ferry._ferry.FerryError */

/* Raise FerryError(code, message). msg may be NULL or "": then strerror(code).
 * Messages name files, and a path need not be UTF-8 (os.fsencode'd names):
 * undecodable bytes become \xNN escapes instead of a UnicodeDecodeError. */
PyObject *raise_code_msg(int code, const char *msg) {
    if (!msg || !*msg) msg = ferry_strerror(code);
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "backslashreplace");
    if (!text) return NULL;
    PyObject *exc = PyObject_CallFunction(FerryError, "iN", code, text);
    if (exc) {
        PyErr_SetObject(FerryError, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* Raise for a failing engine call on ctx made by this thread. */
PyObject *raise_ctx(ferry_ctx *ctx, int code) {
    const char *m = ferry_errmsg(ctx);   /* per thread: a failed ferry_ctx_create (ctx NULL) left its message too */
    return raise_code_msg(code, m);
}

/* ------------------------------------------------------------------------- */
/* Module                                                                     */
/* ------------------------------------------------------------------------- */
static PyObject *mod_version(PyObject *m, PyObject *noarg) { return PyUnicode_FromString(ferry_version()); }

static PyObject *mod_strerror(PyObject *m, PyObject *arg) {
    long c = PyLong_AsLong(arg);
    if (c == -1 && PyErr_Occurred()) return NULL;
    return PyUnicode_FromString(ferry_strerror((int)c));
}

static PyObject *mod_crc32c(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"data", "crc", NULL};
    Py_buffer b;
    unsigned long crc = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|k", kwlist, &b, &crc)) return NULL;
    uint32_t r;
    if (b.len > (1 << 16)) {
        Py_BEGIN_ALLOW_THREADS
        r = ferry_crc32c((uint32_t)crc, b.buf, (size_t)b.len);
        Py_END_ALLOW_THREADS
    } else {
        r = ferry_crc32c((uint32_t)crc, b.buf, (size_t)b.len);
    }
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(r);
}

/* hdf5_signature(path) -> byte offset of the HDF5 signature, or -1: the C
 * library decides what is netCDF-4/HDF5, the package then reads it by h5py. */
static PyObject *mod_hdf5_signature(PyObject *m, PyObject *arg) {
    PyObject *patho;
    if (!PyUnicode_FSConverter(arg, &patho)) return NULL;
    ContextObject *c = get_default_ctx();
    if (!c) { Py_DECREF(patho); return NULL; }
    int64_t at;
    Py_BEGIN_ALLOW_THREADS
    at = ferry_hdf5_signature(c->ctx, PyBytes_AS_STRING(patho));
    Py_END_ALLOW_THREADS
    Py_DECREF(patho);
    return PyLong_FromLongLong(at >= 0 ? at : -1);
}

static PyObject *mod_kernels_source(PyObject *m, PyObject *noarg) {
    const char *s;
    Py_BEGIN_ALLOW_THREADS   /* without a fatbin the first call compiles with NVRTC */
    s = ferry_kernels_source();
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(s);
}

static PyObject *mod_kernels_status(PyObject *m, PyObject *noarg) {
    return PyUnicode_FromString(ferry_kernels_status());
}

static PyObject *mod_kernels_ready(PyObject *m, PyObject *arg) {
    long dev = PyLong_AsLong(arg);
    if (dev == -1 && PyErr_Occurred()) return NULL;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = ferry_kernels_ready((int)dev);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ok);
}

/* The PTX NVRTC makes of src/cuda/kernels.cu (whatever the build embedded),
 * or (None, why): lets tests and users check the run-time path anywhere. */
static PyObject *mod_nvrtc_ptx(PyObject *m, PyObject *noarg) {
    const char *ptx;
    Py_BEGIN_ALLOW_THREADS
    ptx = ferry_nvrtc_ptx();
    Py_END_ALLOW_THREADS
    if (ptx) return Py_BuildValue("(ss)", ptx, "");
    return Py_BuildValue("(Os)", Py_None, ferry_nvrtc_status());
}

/* object_write(url, data): ferry_object_write of a contiguous buffer (an
 * mmap of the checkpoint's in-memory file: sent without a copy), GIL
 * released; object_delete(url). FerryError naming the URL. */
static PyObject *mod_object_write(PyObject *m, PyObject *args) {
    PyObject *urlo;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "O&y*", PyUnicode_FSConverter, &urlo, &b)) return NULL;
    ContextObject *c = get_default_ctx();
    int rc = -1;
    if (c) {
        Py_BEGIN_ALLOW_THREADS
        rc = ferry_object_write(c->ctx, PyBytes_AS_STRING(urlo), b.buf, (uint64_t)b.len);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&b);
    Py_DECREF(urlo);
    if (!c) return NULL;
    if (rc < 0) return raise_ctx(c->ctx, rc);
    Py_RETURN_NONE;
}

static PyObject *mod_object_delete(PyObject *m, PyObject *arg) {
    PyObject *urlo;
    if (!PyUnicode_FSConverter(arg, &urlo)) return NULL;
    ContextObject *c = get_default_ctx();
    int rc = -1;
    if (c) {
        Py_BEGIN_ALLOW_THREADS
        rc = ferry_object_delete(c->ctx, PyBytes_AS_STRING(urlo));
        Py_END_ALLOW_THREADS
    }
    Py_DECREF(urlo);
    if (!c) return NULL;
    if (rc < 0) return raise_ctx(c->ctx, rc);
    Py_RETURN_NONE;
}

static PyObject *mod_default_context(PyObject *m, PyObject *noarg) {
    ContextObject *c = get_default_ctx();
    if (!c) return NULL;
    Py_INCREF(c);
    return (PyObject *)c;
}

/* The directories of the CUDA wheels' libraries, handed to the library by
 * `import ferry` (which leaves the user's environment alone). */
static PyObject *set_search_dir(PyObject *arg, void (*set)(const char *)) {
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(arg, &b)) return NULL;
    set(PyBytes_AS_STRING(b));
    Py_DECREF(b);
    Py_RETURN_NONE;
}

static PyObject *mod_nvcomp_search_dir(PyObject *m, PyObject *arg) { return set_search_dir(arg, ferry_nvcomp_search_dir); }
static PyObject *mod_nvrtc_search_dir(PyObject *m, PyObject *arg) { return set_search_dir(arg, ferry_nvrtc_search_dir); }

/* format_detect(path) -> "npy", "safetensors", "netcdf3", "zarr" or "hdf5":
 * ferry_format_detect, the sniffer ferry_dataset_open uses (FerryError when none). */
static PyObject *mod_format_detect(PyObject *m, PyObject *arg) {
    ContextObject *c = get_default_ctx();
    return c ? Context_format_detect(c, arg) : NULL;
}

static PyMethodDef module_methods[] = {
    {"nvcomp_search_dir", mod_nvcomp_search_dir, METH_O,
     "nvcomp_search_dir(dir): where libnvcomp.so.6/.so.5 may be (the wheel's lib64), before the system paths"},
    {"nvrtc_search_dir", mod_nvrtc_search_dir, METH_O,
     "nvrtc_search_dir(dir): where libnvrtc.so.13/.12 may be (the CUDA wheels' lib), after FERRY_NVRTC and "
     "before the loader's path (ferry_nvrtc_search_dir)"},
    {"hdf5_filter_codec", mod_hdf5_filter_codec, METH_VARARGS,
     "hdf5_filter_codec(filter_id, cd_values, itemsize) -> (codec name, param), or None when ferry has no "
     "codec for that HDF5 filter (ferry_codec_of_hdf5_filter)"},
    {"format_detect", mod_format_detect, METH_O,
     "format_detect(path) -> 'npy', 'safetensors', 'netcdf3', 'zarr' or 'hdf5' (ferry_format_detect; "
     "FerryError ENOFORMAT when none)"},
    {"version", mod_version, METH_NOARGS, "the library's version string"},
    {"strerror", mod_strerror, METH_O, "strerror(code) -> name of a return code"},
    {"crc32c", (PyCFunction)(void (*)(void))mod_crc32c, METH_VARARGS | METH_KEYWORDS,
     "crc32c(data, crc=0) -> CRC-32C of a contiguous buffer (continue from crc)"},
    {"default_context", mod_default_context, METH_NOARGS, "the process-wide Context, created on first use"},
    {"object_write", mod_object_write, METH_VARARGS,
     "object_write(url, data): write an s3:// or gs:// object whole or not at all (ferry_object_write)"},
    {"object_delete", mod_object_delete, METH_O, "object_delete(url): delete an s3:// or gs:// object"},
    {"chunk_table", (PyCFunction)(void (*)(void))mod_chunk_table, METH_VARARGS | METH_KEYWORDS,
     "chunk_table(shape, chunks, origins, offsets, lengths, skips=None) -> a sorted chunk table for "
     "Plan.layout (uint64 origins: n x ndim element coordinates; uint64 offsets, lengths; uint32 skips)"},
    {"layout", (PyCFunction)(void (*)(void))mod_layout, METH_VARARGS | METH_KEYWORDS,
     "layout(shape, chunks, itemsize, table=None, path=None, codecs=None, swap=0, fill=b'', order='C', "
     "native=True, label=None, file_size=0) -> a chunked array described once (Plan.layout's arguments "
     "without dst and selection), for Plan.read_rows"},
    {"normalize_selection", mod_normalize_selection, METH_VARARGS,
     "normalize_selection(shape, selection) -> (triples or None, out_shape, squeeze_axes)"},
    {"dtype_name", (PyCFunction)(void (*)(void))mod_dtype_name, METH_VARARGS | METH_KEYWORDS,
     "dtype_name(name, style='short') -> the dtype's name in style short ('f4'), long ('float32') or "
     "safetensors ('F32'; None where safetensors has none); name may be of any style"},
    {"dtype_itemsize", mod_dtype_itemsize, METH_O, "dtype_itemsize(name) -> bytes per element (0: varies)"},
    {"codec_name", mod_codec_name, METH_O, "codec_name(id or name) -> the codec's name"},
    {"buffer_layout", mod_buffer_layout, METH_O,
     "buffer_layout(obj) -> {typestr, shape, strides, contiguous, readonly, device, stream, ptr, nbytes, source}: "
     "a memory argument as the engine takes it (device: -1 host, N CUDA, None unknown)"},
    {"size_parse", mod_size_parse, METH_O,
     "size_parse(s) -> bytes: '8M'/'8MiB' = 8*2**20, '5GB' = 5*10**9 (ferry_size_parse); ints pass through"},
    {"kernels_source", mod_kernels_source, METH_NOARGS,
     "kernels_source() -> 'embedded fatbin', 'NVRTC' or 'none' (GPU byteswaps then run on the CPU)"},
    {"kernels_status", mod_kernels_status, METH_NOARGS,
     "kernels_status() -> '' when GPU kernels are available, else why NVRTC could not compile them"},
    {"kernels_ready", mod_kernels_ready, METH_O,
     "kernels_ready(device) -> True when the GPU kernel image loads on that CUDA device"},
    {"nvrtc_ptx", mod_nvrtc_ptx, METH_NOARGS,
     "nvrtc_ptx() -> (ptx, '') compiled by NVRTC from src/cuda/kernels.cu, or (None, why)"},
    {"hdf5_signature", mod_hdf5_signature, METH_O,
     "hdf5_signature(path) -> byte offset of the HDF5 (netCDF-4) signature, or -1 when there is none"},
    {"empty", (PyCFunction)(void (*)(void))mod_empty, METH_VARARGS | METH_KEYWORDS,
     "empty(shape, typestr, device=-1, ctx=None, pinned=False) -> Array "
     "(host: 4 KiB-aligned; device: cuMemAlloc; pinned: page-locked host memory)"},
    {"npy_read_many", (PyCFunction)(void (*)(void))mod_npy_read_many, METH_VARARGS | METH_KEYWORDS,
     "npy_read_many(ctx, paths, dst, stride=0, native=True, stored_order=False, reread=False) -> dict: n one-sample .npy "
     "files of one dtype and shape into dst (file i at byte i*stride; 0: packed), every header checked "
     "(FerryError naming a file whose dtype or shape differs); returns typestr, shape, fortran_order, nbytes"},
    {"image_probe", (PyCFunction)(void (*)(void))mod_image_probe, METH_VARARGS | METH_KEYWORDS,
     "image_probe(data, keep_gray=False) -> the header of a JPEG or PNG image as a dict"},
    {"image_decode", (PyCFunction)(void (*)(void))mod_image_decode, METH_VARARGS | METH_KEYWORDS,
     "image_decode(data, out, keep_gray=False) -> header dict; the HWC uint8 pixels written to out"},
    {"image_decode_batch", (PyCFunction)(void (*)(void))mod_image_decode_batch, METH_VARARGS | METH_KEYWORDS,
     "image_decode_batch(datas, outs, labels=None, keep_gray=False, threads=0) -> header dicts"},
    {"nvjpeg_status", mod_nvjpeg_status, METH_NOARGS,
     "nvjpeg_status() -> 'loaded nvJPEG M.N from PATH', or why nvJPEG is not loaded (loads CUDA and nvJPEG once)"},
    {"image_batch", (PyCFunction)(void (*)(void))mod_image_batch, METH_VARARGS | METH_KEYWORDS,
     "image_batch(shards, samples, out, height, width, layout='CHW', dtype='uint8', crop='random_resized', "
     "scale=(0.08, 1.0), ratio=(3/4, 4/3), flip=0.0, mean=None, std=None, seed=0, epoch=0, member=None, "
     "on_error='raise', decode='auto', threads=0, stream=0) -> {written, skipped, gpu, gpu_hardware, cpu, "
     "fallbacks}: ferry_image_batch (ferry_experimental.h) into out (rows of height x width x 3)"},
    {"order_take", mod_order_take, METH_VARARGS,
     "order_take(n, seed, epoch, shuffle, positions, out): out[i] = the keyed epoch order of "
     "[0, n) at positions[i] (int64 arrays; ferry_perm_take)"},
    {"row_runs", mod_row_runs, METH_VARARGS,
     "row_runs(starts, nrows, ids, out) -> count: the runs of a batch's rows over shards starting at rows "
     "starts (ferry_row_runs): out[0..3, :count] = each run's shard, row in the shard, length, first position"},
    {"plan_windows", mod_plan_windows, METH_VARARGS,
     "plan_windows(plan, files, starts, offsets, stride, length, n, seed, epoch, shuffle, ranges, dst) -> "
     "count: the windows at epoch positions [lo, hi) of each (lo, hi) pair in ranges, mapped through the "
     "epoch order, read one after another into dst (window w of file k: starts[k] <= w, at byte "
     "offsets[k] + (w - starts[k]) * stride, length bytes; files: File sequence or callable k -> File)"},
    {"image_transform", (PyCFunction)(void (*)(void))mod_image_transform, METH_VARARGS | METH_KEYWORDS,
     "image_transform(src, shape, box, size, flip=False, layout='CHW', dtype='uint8', mean=None, std=None) -> bytes"},
    {"random_resized_crop", mod_random_resized_crop, METH_VARARGS,
     "random_resized_crop(seed, epoch, sample, h, w, scale, ratio) -> (y, x, h, w)"},
    {"center_box", mod_center_box, METH_VARARGS, "center_box(h, w, crop_h, crop_w) -> (y, x, h, w)"},
    {"flip_draw", mod_flip_draw, METH_VARARGS, "flip_draw(seed, epoch, sample, p) -> bool"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_ferry",
    "ferry's C extension: contexts, files, datasets, plans, jobs and arrays (see docs/python-extension.md).",
    -1, module_methods, NULL, NULL, NULL, NULL};

/* FerryError(code, message) is how the library raises it; FerryError(message)
 * and FerryError(message=...) must work too, because torch's DataLoader
 * re-raises a worker's exception in the main process as type(e)(text) (once the
 * code was taken for the message and str() was empty). __reduce__ keeps code,
 * message and every keyword attribute (path=, ...) across pickling. */
static const char ferror_src[] =
    "class FerryError(Exception):\n"
    "    \"\"\"An error from the ferry library: .code (a negative ferry_status or -errno; None\n"
    "    when made from a message alone), .message (also str()), and any keyword attributes\n"
    "    (e.g. path=). FerryError(code, message), FerryError(message) and\n"
    "    FerryError(message=..., code=...) all work; pickling keeps every attribute.\"\"\"\n"
    "    def __init__(self, *args, **attrs):\n"
    "        code = attrs.pop('code', None)\n"
    "        message = attrs.pop('message', None)\n"
    "        rest = list(args)\n"
    "        if code is None and rest and type(rest[0]) is int:\n"
    "            code = rest.pop(0)\n"
    "        if message is None and rest:\n"
    "            message = rest.pop(0)\n"
    "        message = '' if message is None else str(message)\n"
    "        super().__init__(code, message, *rest)\n"
    "        self.code = code\n"
    "        self.message = message\n"
    "        self.__dict__.update(attrs)\n"
    "    def __str__(self):\n"
    "        return self.message if self.message or self.code is None else 'ferry error %s' % (self.code,)\n"
    "    def __reduce__(self):\n"
    "        return (type(self), (self.code, self.message), dict(self.__dict__))\n"
    "FerryError.__module__ = 'ferry'\n";

static int make_ferry_error(PyObject *m) {
    PyObject *g = PyDict_New();
    if (!g) return -1;
    PyObject *name = PyUnicode_FromString("ferry._ferry");
    if (!name || PyDict_SetItemString(g, "__builtins__", PyEval_GetBuiltins()) < 0 ||
        PyDict_SetItemString(g, "__name__", name) < 0) {
        Py_XDECREF(name);
        Py_DECREF(g);
        return -1;
    }
    Py_DECREF(name);
    PyObject *r = PyRun_String(ferror_src, Py_file_input, g, g);
    if (!r) { Py_DECREF(g); return -1; }
    Py_DECREF(r);
    FerryError = PyDict_GetItemString(g, "FerryError");
    Py_XINCREF(FerryError);
    Py_DECREF(g);
    if (!FerryError) return -1;
    Py_INCREF(FerryError);
    return PyModule_AddObject(m, "FerryError", FerryError);
}

PyMODINIT_FUNC PyInit__ferry(void) {
    PyTypeObject *types[] = {&ContextType, &FileType, &DatasetType, &PlanType, &JobType, &ArrayType, &BufRefType,
                             &ShardsType};
    BufRefType.tp_name = "ferry._ferry._BufRef";
    BufRefType.tp_basicsize = sizeof(BufRefObject);
    BufRefType.tp_dealloc = (destructor)BufRef_dealloc;
    BufRefType.tp_flags = Py_TPFLAGS_DEFAULT;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (PyType_Ready(types[i]) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    if (make_ferry_error(m) < 0) goto fail;
    struct { const char *name; PyTypeObject *t; } exported[] = {
        {"Context", &ContextType}, {"File", &FileType}, {"Dataset", &DatasetType},
        {"Plan", &PlanType}, {"Job", &JobType}, {"Array", &ArrayType}, {"Shards", &ShardsType}};
    for (size_t i = 0; i < sizeof exported / sizeof exported[0]; i++) {
        Py_INCREF(exported[i].t);
        if (PyModule_AddObject(m, exported[i].name, (PyObject *)exported[i].t) < 0) {
            Py_DECREF(exported[i].t);
            goto fail;
        }
    }
    PyObject *paths = Py_BuildValue("(ssss)", "auto", "cufile", "staged", "host");
    if (!paths || PyModule_AddObject(m, "PATHS", paths) < 0) { Py_XDECREF(paths); goto fail; }
    PyObject *dtypes = dtype_table();
    if (!dtypes || PyModule_AddObject(m, "DTYPES", dtypes) < 0) { Py_XDECREF(dtypes); goto fail; }
    if (PyModule_AddStringConstant(m, "__version__", FERRY_VERSION_STRING) < 0) goto fail;
    struct { const char *name; long v; } consts[] = {
        {"EINVAL", FERRY_EINVAL}, {"ENOMEM", FERRY_ENOMEM}, {"EIO", FERRY_EIO}, {"ESHORT", FERRY_ESHORT},
        {"EFORMAT", FERRY_EFORMAT}, {"EUNSUPPORTED", FERRY_EUNSUPPORTED}, {"ENOCUDA", FERRY_ENOCUDA},
        {"ECUDA", FERRY_ECUDA}, {"ENOCUFILE", FERRY_ENOCUFILE}, {"ECUFILE", FERRY_ECUFILE},
        {"ECODEC", FERRY_ECODEC}, {"ECHECKSUM", FERRY_ECHECKSUM}, {"ENOTFOUND", FERRY_ENOTFOUND},
        {"ETIMEDOUT", FERRY_ETIMEDOUT}, {"ECANCELED", FERRY_ECANCELED}, {"EPATH", FERRY_EPATH}, {"ENOFORMAT", FERRY_ENOFORMAT},
        {"CODEC_NONE", FERRY_CODEC_NONE}, {"CODEC_ZLIB", FERRY_CODEC_ZLIB}, {"CODEC_GZIP", FERRY_CODEC_GZIP},
        {"CODEC_ZSTD", FERRY_CODEC_ZSTD}, {"CODEC_LZ4", FERRY_CODEC_LZ4}, {"CODEC_BLOSC", FERRY_CODEC_BLOSC},
        {"CODEC_SHUFFLE", FERRY_CODEC_SHUFFLE}, {"CODEC_CRC32C", FERRY_CODEC_CRC32C},
        {"CODEC_FLETCHER32", FERRY_CODEC_FLETCHER32}, {"CODEC_BYTESWAP", FERRY_CODEC_BYTESWAP},
        {"MAX_DIMS", FERRY_MAX_DIMS}, {"MAX_CODECS", FERRY_MAX_CODECS},
        {"MAX_WAIT_STREAMS", FERRY_MAX_WAIT_STREAMS}};
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].v) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
