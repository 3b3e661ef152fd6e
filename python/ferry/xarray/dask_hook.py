"""Dask with data on a GPU: cupy-typed chunks and meta for variables a store puts on a device
(_install_dask_hook, cupy_meta), and open_mfdataset with device=."""
from __future__ import annotations


from xarray.core import indexing

import ferry
from .array import FerryBackendArray


# ---------------------------------------------------------------------------
# dask chunks of device variables: cupy, with cupy meta
# ---------------------------------------------------------------------------
_DEVICE_CHUNK_PREFIX = "ferry-device-"


def _device_meta(data):
    """A zero-size cupy array typed like `data` (what xarray hands
    dask.array.from_array) when it is a ferry variable read into GPU memory; else None."""
    if not isinstance(data, indexing.ImplicitToExplicitIndexingAdapter):
        return None
    inner = data.array
    for _ in range(8):   # only xarray's pass-through wrappers: a decoding step in between may be numpy-only
        if isinstance(inner, (indexing.CopyOnWriteArray, indexing.MemoryCachedArray)):
            inner = inner.array
        else:
            break
    if not isinstance(inner, indexing.LazilyIndexedArray) or not isinstance(inner.array, FerryBackendArray):
        return None
    arr = inner.array
    if arr.store.device < 0 or arr.spec.device < 0:
        return None
    cupy = ferry._cupy()
    if cupy is None:
        return None
    with cupy.cuda.Device(arr.spec.device):
        return cupy.empty((0,) * len(data.shape), dtype=data.dtype)


def _install_dask_hook():
    """xarray's DaskManager.from_array gives every lazy backend array ``meta=np.ndarray``
    and dask then calls ``np.asarray`` on each chunk: for a GPU variable a copy to the
    host, or an error. For ferry's GPU variables (only those) build the dask array
    with cupy meta and the chunks as the backend returns them; every other array goes
    to xarray's method unchanged. xarray has no backend hook for this (it chunks after
    the backend returns), hence the wrapper."""
    try:
        from xarray.namedarray.daskmanager import DaskManager
    except ImportError:
        return
    orig = DaskManager.from_array
    if getattr(orig, "_ferry_wrapped", False):
        return

    def from_array(self, data, chunks, **kwargs):
        meta = _device_meta(data)
        if meta is None:
            return orig(self, data, chunks, **kwargs)
        import dask.array as da
        kw = dict(kwargs)
        name = kw.pop("name", None)
        kw.update(meta=meta, asarray=False)
        lazy = da.from_array(data, chunks, name=name if name else True, **kw)
        return lazy.map_blocks(_duck_chunk, dtype=data.dtype, meta=meta, name=_DEVICE_CHUNK_PREFIX + lazy.name)

    from_array._ferry_wrapped = True
    from_array.__wrapped__ = orig
    from_array.__doc__ = orig.__doc__
    DaskManager.from_array = from_array


def cupy_meta(ds):
    """Kept for code written before GPU variables had cupy dask chunks by default:
    make the dask arrays of ``ds`` that ferry reads into GPU memory cupy-backed dask
    arrays (chunks and ``meta`` cupy). Arrays that already are (what
    ``open_dataset(..., engine="ferry", device=0, chunks=...)`` and ``open_mfdataset``
    give now) are left as they are."""
    import cupy
    out = ds.copy()
    for name, v in out.variables.items():
        if v.encoding.get("ferry_device", -1) < 0:
            continue
        if str(getattr(v.data, "name", "")).startswith(_DEVICE_CHUNK_PREFIX):
            continue
        new = _rechunk_on_device(v.data, cupy.empty((0,) * v.ndim, dtype=v.dtype))
        if new is not None:
            v.data = new
    return out


def _rechunk_on_device(data, meta):
    """A dask array over the same lazy source as `data`, whose chunks are read
    as the backend returns them (no np.asarray) and typed like `meta`."""
    try:
        import dask.array as da
    except ImportError:
        return None
    if not isinstance(data, da.Array):
        return None
    src = None
    for val in dict(data.__dask_graph__()).values():
        val = getattr(val, "value", val)            # dask task-spec DataNode
        if isinstance(val, indexing.ImplicitToExplicitIndexingAdapter) and tuple(val.shape) == data.shape:
            src = val
            break
    if src is None:
        return None
    arr = da.from_array(src, chunks=data.chunks, asarray=False, meta=meta, name=data.name + "-ferry")
    return arr.map_blocks(_duck_chunk, dtype=data.dtype, meta=meta)


def _duck_chunk(x):
    get = getattr(x, "get_duck_array", None)
    return get() if get is not None else x


