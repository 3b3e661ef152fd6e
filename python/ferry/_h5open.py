"""ferry.open(path, format="hdf5"): a netCDF-4 / HDF5 file through the xarray backend's store,
whose metadata is the C parser's (src/formats/hdf5/) and whose variables the parser refuses as
unsupported (a type or filter ferry lacks) h5py reads. Plain ferry.open reads such files through
the C dataset alone and comes here only when the parser refuses the file itself."""
from __future__ import annotations

import os
from typing import Any

from . import Context, FerryError, Opened, Variable, _alloc, _check_out, _ctx_of, _ferry, _fspath, \
    _sync_producer, normalize_selection, parse_device


def _is_hdf5(path, err: FerryError) -> bool:
    return err.code == _ferry.EUNSUPPORTED and _ferry.hdf5_signature(path) >= 0


class _H5Variable(Variable):
    """A Variable of a netCDF-4/HDF5 file, read through the xarray backend's store."""

    def __init__(self, owner: "_H5Opened", spec):
        enc = spec.encoding
        info = {"name": spec.name, "shape": spec.shape, "typestr": spec.dtype.str,
                "chunks": tuple(enc.get("chunksizes") or spec.shape), "error": None,
                "itemsize": spec.dtype.itemsize}
        super().__init__(owner, info)
        self._spec = spec
        self.__dict__["dims"] = tuple(spec.dims)
        self.__dict__["attrs"] = dict(spec.attrs)
        self.__dict__["dtype"] = spec.dtype

    def read(self, selection: Any = None, *, device: Any = None, out: Any = None, out_bytes: bool = False):
        import numpy as np
        o = self._owner
        triples, sel_shape, squeeze = normalize_selection(selection, self.shape)
        if triples is None:
            triples = [(0, n, 1) for n in self.shape]
        key = tuple(a if ax in squeeze else slice(a, b, st) for ax, (a, b, st) in enumerate(triples))
        final = tuple(n for i, n in enumerate(sel_shape) if i not in squeeze)
        host = np.ascontiguousarray(o._store.read(self._spec.name, key)).reshape(final)
        if out is not None:
            _check_out(out, host.nbytes, final, host.dtype.str, f"{o.path}: {self.name}", out_bytes)
            _sync_producer(out)
            if host.nbytes:
                o._ctx.memcpy(out, host)
            return out
        dev = parse_device(o.device if device is None else device)
        if dev < 0:
            return host
        dst = _alloc(final, host.dtype.str, dev, o._ctx)
        if host.nbytes:
            o._ctx.memcpy(dst, host)
        return dst


class _H5Opened(Opened):
    """ferry.open of a netCDF-4/HDF5 file (format "hdf5"): the xarray backend's
    store (the C parser's metadata, ferry's engine for the data; h5py for the
    variables the parser refuses)."""

    def __init__(self, path, *, device: Any = "cpu", ctx: Context | None = None, group: str | None = None):
        try:
            from .xarray.hdf5 import _h5_groups
            from .xarray.store import FerryStore
        except ImportError as e:
            raise FerryError(_ferry.EUNSUPPORTED, f"{os.fsdecode(path)}: netCDF-4/HDF5 file: format='hdf5' "
                                                  f"reads it through ferry.xarray, which needs xarray ({e})") from None
        self._ctx = _ctx_of(ctx)
        self.path = _fspath(path)
        self.device = device
        self._store = FerryStore(self.path, group=group, device="cpu", ctx=self._ctx)
        self._ds = None
        self.format = "hdf5"
        self.attrs = dict(self._store.attrs)
        self.dims = {d: {"size": int(n), "unlimited": d in self._store.unlimited}
                     for d, n in self._store.dims.items()}
        self.groups = [g for g in _h5_groups(self.path, self._ctx) if g != "/"]
        self._names = dict.fromkeys(self._store.specs)
        self._vars = {}

    def __getitem__(self, name: str) -> Variable:
        v = self._vars.get(name)
        if v is None:
            if name not in self._names:
                raise KeyError(f"{self.path}: no variable named {name!r}")
            v = self._vars[name] = _H5Variable(self, self._store.specs[name])
        return v

    def close(self) -> None:
        self._store.close()
