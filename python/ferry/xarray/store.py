"""FerryStore, the data store of ferry.xarray: one opened file or store, its scan, pickling
and reopening in other processes, and the check that the file is still the one parsed."""
from __future__ import annotations

import collections
import os
import pickle
import threading
import weakref
from typing import Any

import numpy as np
from xarray.backends.common import AbstractDataStore
from xarray.core import indexing
from xarray.core.variable import Variable

import ferry
from ferry import _ferry
from ferry._checks import check
from .array import FerryBackendArray
from .common import _VarSpec, _describe_ident, _file_identity, _format_of, _is_time_like, _route
from .dask_hook import _install_dask_hook
from .hdf5 import _h5_scan
from .reads import _StoreReads
from .scan import _c_scan, _utf8_path
from .._remote import is_url, remote_context


_reopen_mutex = threading.Lock()


def _reopen_lock():
    return _reopen_mutex


def _new_reopen_lock_in_child():
    # a lock held by another thread at fork() would stay held forever in the child
    global _reopen_mutex
    _reopen_mutex = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_reopen_lock_in_child)

# Stores reopened from pickles, per process: a dask worker unpickles the same
# store for many tasks, and should parse the file once (CachingFileManager's
# cache does the same for xarray's engines). Weak, plus a few strong references
# so that a store survives between two tasks.
_STORES: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
_RECENT: collections.deque = collections.deque(maxlen=32)


def _store_key(args, expect):
    try:
        return pickle.dumps((args, expect), protocol=4)
    except Exception:  # noqa: BLE001 — unpicklable decoder objects: no sharing
        return None


def _remember_store(args, expect, store):
    key = _store_key(args, expect)
    if key is not None:
        with _reopen_lock():
            _STORES.setdefault(key, store)


def _reopen_store(args, expect):
    """Unpickling a FerryStore: the store of this process for these arguments, or a
    new one opened by path and checked against what the pickling process saw."""
    key = _store_key(args, expect)
    with _reopen_lock():
        s = _STORES.get(key) if key is not None else None
    if s is not None:
        return s
    filename, group, device, threads, path_policy = args[:5]
    mask_and_scale, decode_times, decode_timedelta, decode = args[5:9]
    allow_outside = args[9] if len(args) > 9 else False
    storage_options = args[10] if len(args) > 10 else None
    s = FerryStore(filename, group=group, device=device, threads=threads, path_policy=path_policy, decode=decode,
                   mask_and_scale=mask_and_scale, decode_times=decode_times, decode_timedelta=decode_timedelta,
                   _expect=expect, allow_outside=allow_outside, storage_options=storage_options)
    with _reopen_lock():
        if key is not None:
            s = _STORES.setdefault(key, s)
        _RECENT.append(s)
    return s


# ---------------------------------------------------------------------------
# the store
# ---------------------------------------------------------------------------
class FerryStore(_StoreReads, AbstractDataStore):
    """A file or store opened for xarray; reads go through one ferry Context.

    Like xarray's CachingFileManager, a store is a recipe as much as a handle:
    it pickles as its open arguments plus what it found (the file's identity
    and every variable's shape and dtype), reopens by path in a new process
    (or after ``close()``, or in a forked child, whose inherited context and
    HDF5 handles belong to the parent) with that process's default context,
    and refuses with FerryError when the file it finds is not the one it
    parsed (replaced, or changed in place)."""

    def __init__(self, filename: str, *, group: str | None = None, device: Any = "cpu", threads: int = 0,
                 path_policy: str | None = None, decode: str | None = None, mask_and_scale: bool = True,
                 decode_times: Any = True, decode_timedelta: Any = None, ctx=None, lock=None, _expect=None,
                 path: str | None = None, allow_outside: bool = False, progress: Any = None,
                 storage_options: dict | None = None):
        self.filename = os.fspath(filename)
        self.allow_outside = bool(allow_outside)   # kerchunk references: files outside the JSON's directory
        # a URL's storage_options: a context holding them (ferry._remote), kept for pickling
        self.storage_options = dict(storage_options) if storage_options else None
        if ctx is None and self.storage_options:
            ctx = remote_context(self.storage_options)
        # lock= as xarray's engines take it: held around every read when given (a
        # lock is not pickled: another process has its own)
        self._user_lock = lock if hasattr(lock, "acquire") and hasattr(lock, "release") else None
        self.group = group
        self.device = ferry.parse_device(device)
        self.threads = check("ferry.xarray (engine=\"ferry\")", "threads", threads, none=True) or 0
        self.path_policy = _route(path_policy, path, "FerryStore")
        self.decode = decode   # where compressed chunks decode: None/"auto", "gpu" (nvCOMP), "cpu"
        ferry._progress.check("ferry.xarray (engine=\"ferry\")", progress)
        self.progress = progress   # Dataset.load() reported (reads.py); not pickled: a dask task's own
        self._ctx = ctx          # None: the default context of whichever process reads
        self._decoding = (mask_and_scale, decode_times, decode_timedelta)
        if self.device >= 0:
            # only a store with GPU variables needs cupy-typed dask chunks: importing
            # ferry.xarray (xarray's engine guessing does) changes nothing in xarray
            _install_dask_hook()
        if self.device >= 0 and ferry._cupy() is None:
            gpu = ferry._nogpu.no_gpu(self.filename, device)     # where cupy would not help either, say so
            raise ImportError(f"engine='ferry' with device={device!r} returns cupy arrays: install cupy "
                              "(or use device='cpu')" + (f". Also {gpu}" if gpu else ""))
        self._closed = False
        self._h5 = None
        self._cds = None
        self._alias = self._alias_fd = None
        self._open(_expect)

    @property
    def ctx(self):
        return self._ctx if self._ctx is not None else ferry.default_context()

    def _open(self, expect=None):
        """Parse the file (again): specs, attributes, dimensions and its identity."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._cache: dict = {}
        self.format = _format_of(self.filename, self._ctx)
        # a URL's object is pinned to one version per open by the C library (ETag)
        before = _file_identity(self.filename) if self.format != "zarr" and not is_url(self.filename) else None
        cpath = None
        if not _utf8_path(self.filename) and os.path.isdir("/proc/self/fd") and not is_url(self.filename):
            # the extension hands C strings back as UTF-8: give the parser an
            # ASCII name of the same file (the descriptor lives as long as the store)
            self._alias_fd = os.open(self.filename, os.O_RDONLY | os.O_CLOEXEC)
            cpath = f"/proc/self/fd/{self._alias_fd}"
        self._alias = cpath
        if self.format == "hdf5":
            # h5py only for the variables the C parser refuses (self._h5 None when none)
            specs, gattrs, dims, unlimited, self._cds, self._h5 = _h5_scan(self.filename, self.group, self.ctx,
                                                                           cpath, before)
        else:
            specs, gattrs, dims, unlimited, self._cds = _c_scan(self.filename, self.format, self.group, self.ctx,
                                                                cpath, self.allow_outside)
        self.format = self._cds.format
        self._ident = before
        if before is not None and _file_identity(self.filename) != before:
            raise ferry.FerryError(_ferry.EIO, f"{self.filename}: the file changed while it was being opened")
        self.specs = {s.name: s for s in specs}
        self.attrs = gattrs
        self.dims = dims
        self.unlimited = unlimited
        self._assign_devices(*self._decoding)
        if expect is not None:
            ident, summary = expect
            if ident != self._ident or summary != self._summary():
                self.close()
                raise ferry.FerryError(_ferry.EIO, f"{self.filename}: the file changed since it was opened "
                                       f"(found {_describe_ident(self._ident)}, expected {_describe_ident(ident)}"
                                       f"{'' if summary == self._summary() else ', other variables'}): "
                                       "open it again")

    def _summary(self) -> tuple:
        return tuple(sorted((s.name, s.shape, s.dtype.str, s.out_dtype.str, s.device) for s in self.specs.values()))

    def _live(self):
        """Make this store usable in the calling process: reopen after fork(),
        unpickling elsewhere or close()."""
        if self._pid == os.getpid() and not self._closed:
            return
        with _reopen_lock():
            if self._pid == os.getpid() and not self._closed:
                return
            expect = (self._ident, self._summary())
            if self._pid != os.getpid():
                # the parent's handles: leave them to the parent (closing an inherited
                # HDF5 file or C dataset here would act on the parent's state)
                self._h5 = None
                self._cds = None
                self._alias_fd = None
            else:
                self.close()
            self._closed = False
            self._open(expect)

    def spec(self, name) -> _VarSpec:
        self._live()
        return self.specs[name]

    def _check_unchanged(self):
        """The file at our path is still the one whose metadata we parsed."""
        if self._ident is None:
            return
        try:
            now = _file_identity(self.filename)
        except OSError as e:
            raise ferry.FerryError(_ferry.EIO, f"{self.filename}: the file is gone since it was opened ({e})") \
                from None
        if now != self._ident:
            raise ferry.FerryError(_ferry.EIO, f"{self.filename}: the file changed since it was opened "
                                   f"(found {_describe_ident(now)}, expected {_describe_ident(self._ident)}): "
                                   "open it again")

    def __reduce__(self):
        args = (self.filename, self.group, self.device, self.threads, self.path_policy) + tuple(self._decoding) \
            + (self.decode, self.allow_outside) + ((self.storage_options,) if self.storage_options else ())
        expect = (self._ident, self._summary())
        _remember_store(args, expect, self)
        return (_reopen_store, (args, expect))

    # -- which variables go to the GPU ---------------------------------------
    def _assign_devices(self, mask_and_scale, decode_times, decode_timedelta):
        if self.device < 0:
            return
        coords = set(self.dims)
        for s in self.specs.values():
            for key in ("coordinates", "bounds", "grid_mapping", "ancillary_variables"):
                v = s.attrs.get(key)
                if isinstance(v, str):
                    coords.update(x.split(":")[-1].strip() for x in v.split())
        gc = self.attrs.get("coordinates")
        if isinstance(gc, str):
            coords.update(gc.split())
        for s in self.specs.values():
            if s.name in coords or not s.shape or s.kind not in ("ferry", "h5py"):
                continue
            if s.dtype.kind not in "iuf":
                continue
            if _is_time_like(s.attrs.get("units")) or "dtype" in s.attrs or "calendar" in s.attrs:
                continue
            s.device = self.device
            s.encoding["ferry_device"] = self.device
            if mask_and_scale:
                self._plan_gpu_decode(s, decode_times, decode_timedelta)

    def _plan_gpu_decode(self, s: _VarSpec, decode_times, decode_timedelta):
        """Let xarray's CF mask/scale coders decode a zero-size stand-in; keep the
        transforms they chose, to apply them to the cupy data after each read."""
        from xarray.coding import variables as cv
        from xarray.coding.common import _ElementwiseFunctionArray
        keys = ("_FillValue", "missing_value", "scale_factor", "add_offset", "_Unsigned")
        if not any(k in s.attrs for k in keys):
            return
        dummy = Variable(s.dims, np.zeros((0,) * len(s.shape), dtype=s.dtype), dict(s.attrs), dict(s.encoding))
        v = dummy
        for coder in (cv.CFMaskCoder(decode_times=False, decode_timedelta=False),
                      cv.CFScaleOffsetCoder(decode_times=False, decode_timedelta=False)):
            v = coder.decode(v, name=s.name)
        funcs = []
        d = v._data
        while isinstance(d, _ElementwiseFunctionArray):
            funcs.append(d.func)
            d = d.array
        funcs.reverse()
        s.gpu_decode = funcs
        s.out_dtype = v.dtype
        s.attrs = dict(v.attrs)
        s.encoding = dict(v.encoding)
        s.encoding["ferry_decoded_on_device"] = True

    # -- AbstractDataStore ---------------------------------------------------
    def get_variables(self):
        self._live()
        out = {}
        keys: dict = {}   # ndim -> the whole-array key, one per rank (indexers are immutable)
        for name, s in self.specs.items():
            arr = FerryBackendArray(self, s)
            nd = len(s.shape)
            key = keys.get(nd)
            if key is None:
                key = keys[nd] = indexing.BasicIndexer((slice(None),) * nd)
            data = indexing.LazilyIndexedArray(arr, key)
            out[name] = Variable(s.dims, data, dict(s.attrs), dict(s.encoding), fastpath=True)
        return out

    def get_attrs(self):
        return dict(self.attrs)

    def get_dimensions(self):
        return dict(self.dims)

    def get_encoding(self):
        if self.format == "hdf5":   # as the netcdf4 engine: the key even when the set is empty
            return {"unlimited_dims": set(self.unlimited)}
        return {"unlimited_dims": set(self.unlimited)} if self.unlimited else {}

    def close(self):
        """Close the file; a later read reopens it (as xarray's own engines do)."""
        self._closed = True
        if self._pid != os.getpid():     # a forked child: the handles are the parent's
            self._h5 = self._cds = None
            return
        if self._h5 is not None:
            try:
                self._h5.close()
            except Exception:  # noqa: BLE001
                pass
            self._h5 = None
        if self._cds is not None:
            self._cds.close()
            self._cds = None
        if self._alias_fd is not None:
            os.close(self._alias_fd)
            self._alias_fd = None


