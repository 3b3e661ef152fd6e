"""FerryBackendArray, the lazy array xarray indexes, and the Dataset.load() that reads all of a
dataset's lazy variables with one plan."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from xarray.backends import BackendArray
from xarray.core import indexing

from .common import _VarSpec

if TYPE_CHECKING:
    from .store import FerryStore


_LOAD_CODE = None


def _loading_dataset():
    """The Dataset whose .load() is on the call stack, if any."""
    global _LOAD_CODE
    if _LOAD_CODE is None:
        import xarray as xr
        _LOAD_CODE = xr.Dataset.load.__code__
    f = sys._getframe(2)
    for _ in range(40):
        if f is None:
            return None
        if f.f_code is _LOAD_CODE:
            return f.f_locals.get("self")
        f = f.f_back
    return None


def _find_backend(data):
    for _ in range(16):
        if isinstance(data, indexing.LazilyIndexedArray):
            if isinstance(data.array, FerryBackendArray):
                return data.array, data.key
        nxt = getattr(data, "array", None)
        if nxt is None or nxt is data:
            return None
        data = nxt
    return None


class FerryBackendArray(BackendArray):
    """One variable; reads become ferry plans touching only the selected chunks."""

    def __init__(self, store: FerryStore, spec: _VarSpec):
        self.store = store
        self.name = spec.name     # not the spec: the store may reopen (fork, pickle) and parse anew
        self.shape = spec.shape
        self.dtype = spec.out_dtype

    @property
    def spec(self) -> _VarSpec:
        return self.store.spec(self.name)

    def __getitem__(self, key: indexing.ExplicitIndexer):
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.OUTER, self._raw)

    def _raw(self, key: tuple):
        return self.store.read(self.name, key)

    async def async_getitem(self, key: indexing.ExplicitIndexer):
        """For ``Dataset.load_async()``: the read runs in a worker thread (the engine
        releases the GIL), so the event loop goes on meanwhile."""
        import asyncio
        return await asyncio.to_thread(self.__getitem__, key)

    def get_duck_array(self):
        return self[indexing.BasicIndexer((slice(None),) * len(self.shape))]
