"""Zarr arrays' codec encodings as xarray's zarr engine hands them over: ``compressors``,
``filters``, ``shards``, ``chunks`` (the inner chunks of a sharded array), ``preferred_chunks``
and, for Zarr v3, ``serializer`` — zarr-python's own codec objects, so that ``to_zarr`` after
``engine="ferry"`` writes what the source had (zstd level 3 stays level 3).

The objects are built by zarr-python from each array's own metadata document (its .zarray or
zarr.json, else the consolidated copy; a kerchunk reference set's .zarray entry), exactly as zarr.open_array would, without the store
round trip per array; arrays with the same codecs, type and chunking share one build. Without
zarr installed the keys are left out (there is nothing to build them with): logged once."""
from __future__ import annotations

import json
import os

from .common import log


_NOT_CODEC_KEYS = ("shape", "attributes", "dimension_names")   # what the codec objects do not depend on
_warned = False


class ZarrCodecs:
    """One scan's codec encodings. path: the store; group: the node opened; store: the C
    parser's store_info (zarr_format, consolidated, is_array)."""

    def __init__(self, path: str, group: str | None, store: dict, doc=None):
        """doc: name -> the array's .zarray document, for stores that are no directory (a
        kerchunk reference set: refs_py.RefsFallback.zarray)."""
        self.doc_of = doc
        self.path = path
        self.group = (group or "").strip("/")
        self.zv = store["zarr_format"]
        self.is_array = store["is_array"]
        self._cons = None
        self._built: dict = {}
        self._zarr = self._import()

    @staticmethod
    def _import():
        global _warned
        try:
            import zarr
            from zarr.core.array import Array, AsyncArray
            from zarr.core.metadata import ArrayV2Metadata, ArrayV3Metadata
            from zarr.storage import MemoryStore, StorePath
        except ImportError as e:
            if not _warned:
                log.info("zarr is not importable (%s): Zarr variables' encoding has no compressors, filters, "
                         "serializer or shards", e)
                _warned = True
            return None
        del zarr
        return Array, AsyncArray, ArrayV2Metadata, ArrayV3Metadata, StorePath(MemoryStore())

    def _apath(self, name: str) -> str:
        if self.is_array:
            return self.group
        return f"{self.group}/{name}" if self.group else name

    def _doc(self, name: str):
        """The array's metadata document (a dict), or None."""
        if self.doc_of is not None:
            return self.doc_of(name)
        apath = self._apath(name)
        fname = ".zarray" if self.zv == 2 else "zarr.json"
        try:
            with open(os.path.join(self.path, apath, fname), "rb") as f:
                return json.load(f)
        except (OSError, ValueError):
            pass
        if self.zv == 2:   # consolidated metadata only
            if self._cons is None:
                try:
                    with open(os.path.join(self.path, ".zmetadata"), "rb") as f:
                        self._cons = json.load(f).get("metadata", {})
                except (OSError, ValueError, AttributeError):
                    self._cons = {}
            return self._cons.get(f"{apath}/.zarray")
        return None

    def encoding(self, name: str, dims) -> dict:
        """{compressors, filters, shards, chunks, preferred_chunks[, serializer]} of array name,
        or {} when they cannot be built (no zarr, no document, metadata zarr refuses)."""
        if self._zarr is None:
            return {}
        doc = self._doc(name)
        if not isinstance(doc, dict):
            return {}
        key = json.dumps({k: v for k, v in doc.items() if k not in _NOT_CODEC_KEYS}, sort_keys=True)
        arr = self._built.get(key)
        if arr is None:
            Array, AsyncArray, V2, V3, sp = self._zarr
            try:
                meta = (V2 if self.zv == 2 else V3).from_dict(doc)
                arr = Array(AsyncArray(metadata=meta, store_path=sp))
            except Exception as e:  # noqa: BLE001 — zarr refuses the metadata: ferry's description stands
                log.debug("%s: array %s: zarr cannot build its codecs (%s)", self.path, name, e)
                arr = False
            self._built[key] = arr
        if arr is False:
            return {}
        enc = {"chunks": tuple(arr.chunks), "preferred_chunks": dict(zip(dims, arr.chunks)),
               "compressors": arr.compressors, "filters": arr.filters, "shards": arr.shards}
        if self.zv == 3:
            enc["serializer"] = arr.serializer
        return enc
