"""samples="files" for ArrayDataset: one .npy or .safetensors file (or Zarr array) per sample,
the fields over them and the batch jobs that read them."""
from __future__ import annotations

import os

import numpy as np

from .. import _ferry
from .sources import _expand, _native_order, _natural_key, _open_var, _torch_dtype


# --------------------------------------------------------------------------------------------
# samples="files": one file is one sample
# --------------------------------------------------------------------------------------------
_SAMPLE_EXTS = (".npy", ".safetensors")


def _is_zarr_store(d):
    """Whether directory d is a Zarr store (one array source), as the C library's one
    sniffer (ferry_format_detect) says, not a directory of per-sample files."""
    try:
        return _ferry.format_detect(d) == "zarr"
    except _ferry.FerryError:
        return False


def _expand_files(spec):
    """A field of per-sample files: a glob, a directory (its .npy and .safetensors files in
    natural order; other files there are not samples), a list."""
    if isinstance(spec, (str, os.PathLike)) and os.path.isdir(os.fspath(spec)) and \
            not _is_zarr_store(os.fspath(spec)):
        d = os.fspath(spec)
        names = sorted((e.name for e in os.scandir(d) if not e.name.startswith(".")
                        and e.name.endswith(_SAMPLE_EXTS) and e.is_file()), key=_natural_key)
        if not names:
            raise FileNotFoundError(f"ferry.torch: no {' or '.join(_SAMPLE_EXTS)} files in "
                                    f"directory {d!r} (give a glob for other names)")
        return [os.path.join(d, x) for x in names]
    if isinstance(spec, (list, tuple)) and not (isinstance(spec, tuple) and len(spec) == 2
                                               and isinstance(spec[1], str)):
        out = []
        for p in spec:
            out.extend(_expand_files(p))
        return out
    return _expand(spec)


class _FileField:
    """A field whose samples are whole files (each holding one array)."""

    def __init__(self, name, paths, array, shape, typestr, itemsize, collate):
        self.name, self.paths, self.array, self.collate = name, paths, array, collate
        self.rows = len(paths)
        self.typestr = typestr
        self.itemsize = itemsize
        tdt = _torch_dtype(typestr, itemsize)
        if tdt is None:
            raise ValueError(f"ferry.torch: field {name!r}: {paths[0]} holds {typestr}, a type "
                             f"torch has no dtype for")
        self.dtype, self.shape = tdt, tuple(shape)
        self.row_bytes = int(np.prod(shape, dtype=np.int64)) * itemsize

    def __repr__(self):
        return f"<field {self.name!r} files={self.rows} sample={self.shape} {self.dtype}>"

    def read(self, ds, rt, plan, ids, g):
        paths = [self.paths[i] for i in ids.tolist()]
        if self.collate is None:
            buf = ds._alloc(rt, (len(paths),) + self.shape, self.dtype)
            if self.npy_batch:
                g.extra.append(_NpyBatchJob(rt, self, paths, buf))
            else:
                _plan_sample_files(rt, plan, self, paths, buf, g.handles)
            return buf
        return _plan_sample_files(rt, plan, self, paths, None, g.handles,
                                  alloc=lambda shape: ds._alloc(rt, shape, self.dtype))


def _var_info(v):
    return tuple(int(d) for d in v["shape"]), v["typestr"], int(v["itemsize"])


def _same_type(a, b):
    return a.lstrip("<>=|") == b.lstrip("<>=|") and _native_order(a) == _native_order(b)


class _NpyBatchJob:
    """One batch of a per-sample .npy field through the engine's batch reader
    (_ferry.npy_read_many: every header and file read in one engine job, through the
    context's open-file cache). The call is synchronous and releases the GIL, so it runs on
    the runtime's reader threads; the object answers as a Job does. Device memory is complete
    when the call returns, so stream_wait() waits on the host."""
    path = "npy_batch"

    def __init__(self, rt, f, paths, buf):
        self.f, self.paths = f, paths
        dev = buf.device.index if buf.is_cuda else -1
        dst = (buf.data_ptr(), len(paths) * f.row_bytes, dev)
        # reread: a dataset's files come round again next epoch (FERRY_REREAD keeps them cached)
        self.future = rt.reader().submit(_ferry.npy_read_many, rt.ctx, paths, dst, f.row_bytes, reread=True)

    def done(self):
        return self.future.done()

    def wait(self, timeout=None):
        f = self.f
        try:
            info = self.future.result(timeout)
        except _ferry.FerryError as e:
            raise _ferry.FerryError(e.code, f"ferry.torch: field {f.name!r}: {e}; its samples are "
                                    f"{f.shape} {f.typestr} (from {f.paths[0]}); files of other "
                                    f"shapes need collate= (e.g. ferry.torch.pad_collate())") from None
        shape = tuple(int(d) for d in info["shape"])
        if shape != f.shape or not _same_type(info["typestr"], f.typestr):
            # the batch's first file sets the batch reader's shape: it must be the field's
            raise _ferry.FerryError(
                _ferry.EINVAL,
                f"ferry.torch: field {f.name!r}: {self.paths[0]} holds {shape} {info['typestr']}, "
                f"but the field's samples are {f.shape} {f.typestr} (from {f.paths[0]}); files "
                f"of other shapes need collate= (e.g. ferry.torch.pad_collate())")
        return len(self.paths) * f.row_bytes

    def stream_wait(self, stream):
        self.wait()

    def cancel(self):
        self.future.cancel()


class _Jobs:
    """Several jobs of one batch, answering as one Job."""

    def __init__(self, jobs):
        self.jobs = jobs

    @property
    def path(self):
        return self.jobs[0].path

    def done(self):
        return all(j.done() for j in self.jobs)

    def wait(self, timeout=None):
        err, n = None, 0
        for j in self.jobs:
            try:
                n += j.wait() or 0
            except Exception as e:           # every job is waited for before the error goes up
                err = err or e
        if err is not None:
            raise err
        return n

    def stream_wait(self, stream):
        for j in self.jobs:
            j.stream_wait(stream)


def _wait_quietly(job):
    try:
        job.wait()
    except Exception:
        pass


def _plan_sample_files(rt, plan, f, paths, dst, handles, alloc=None):
    """THE per-sample read of one batch: file j of `paths` -> sample j, all into one plan.

    dst: the batch tensor (every file must have f's shape and type; sample j at j*row_bytes),
    or None with alloc(shape) -> tensor for each file (ragged fields; returns the list).
    Today this opens and parses each file here, in Python (the context's handle cache keeps
    recent ones); the engine's call that plans N per-sample .npy files at once replaces the
    loop below, with the same contract: one plan, the same destinations, and an error naming
    the file whose shape or type differs."""
    dev = dst.device.index if dst is not None and dst.is_cuda else -1
    out = []
    seen = set()
    for j, p in enumerate(paths):
        key = ("ds", p, None)
        # a file replaced since it was cached (another inode, size or mtime) is opened again:
        # its new header decides, never the old one. Only cached handles are checked (a fresh
        # open is of the current file); the signature is taken before the open, so a replace
        # racing it is caught at the file's next batch.
        cached = key in rt.handles
        sig = _file_sig(p)
        e = rt.handle(key, lambda p=p: _ferry.Dataset(rt.ctx, p))
        if not cached or len(e) < 3:
            e[2:] = [sig]
        elif e[2] != sig:
            rt.handles.pop(key, None)
            e = rt.handle(key, lambda p=p: _ferry.Dataset(rt.ctx, p))
            e[2:] = [sig]
        if key not in seen:
            seen.add(key)
            e[1] += 1
            handles.append(e)
        h = e[0]
        v = h.variable(f.array) if f.array is not None else _only_var(h, p, f.name)
        shape, typestr, itemsize = _var_info(v)
        if not _same_type(typestr, f.typestr) or itemsize != f.itemsize or \
                (dst is not None and shape != f.shape):
            raise _ferry.FerryError(
                _ferry.EINVAL,
                f"ferry.torch: field {f.name!r}: {p} holds {shape} {typestr}, but the field's "
                f"samples are {f.shape} {f.typestr} (from {f.paths[0]}); files of other shapes "
                f"need collate= (e.g. ferry.torch.pad_collate()) ")
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        if dst is None:
            t = alloc(shape)
            out.append(t)
            if nbytes:
                plan.read(h, v["name"], (t.data_ptr(), nbytes, t.device.index if t.is_cuda else -1),
                          native=True)
        elif nbytes:
            plan.read(h, v["name"], (dst.data_ptr() + j * nbytes, nbytes, dev), native=True)
    return out if dst is None else None


def _file_sig(path):
    """What tells a file replaced or rewritten from the one read before: inode, device, size,
    mtime (OSError when it is gone)."""
    st = os.stat(path)
    return st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns


def _only_var(h, path, field):
    vs = h.variables()
    if len(vs) != 1:
        raise ValueError(f"ferry.torch: field {field!r}: {path} holds {len(vs)} arrays "
                         f"{[v['name'] for v in vs]}; name one: ({path!r}, name)")
    return vs[0]


def _load_file_field(ctx, fname, spec, collate):
    array = None
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], str):
        spec, array = spec
    paths = _expand_files(spec)
    if not paths:
        raise ValueError(f"ferry.torch: field {fname!r} has no files")
    ds, idx, v, _ = _open_var(ctx, paths[0], array)
    ds.close()
    shape, typestr, itemsize = _var_info(v)
    if v.get("error"):
        raise _ferry.FerryError(_ferry.EUNSUPPORTED, f"ferry.torch: {paths[0]}: {v['error']}")
    f = _FileField(fname, paths, array, shape, typestr, itemsize, collate)
    # the engine's batch reader takes plain one-array .npy files (C or big-endian order)
    f.npy_batch = hasattr(_ferry, "npy_read_many") and array is None and \
        not v.get("fortran_order") and all(p.endswith(".npy") for p in paths)
    return f
