"""kerchunk reference sets: variables ferry's parser describes but cannot read, whose chunks
are all held in the JSON itself, read by zarr-python over those bytes. kerchunk embeds
netCDF-4's variable-length strings this way (vlen_encode="embed": dtype "|O", filter
vlen-utf8, the encoded chunks inline), which the engine has no type for. A variable with a
chunk in another file is not taken here (its file would be read without the C parser's
checks): it keeps ferry's description and its reads fail with the parser's message."""
from __future__ import annotations

import base64
import binascii
import json

from .common import log
from .zarr_py import _zarr_py_spec


class RefsFallback:
    """One scan's view of the reference set from Python, parsed once when first needed: the
    fallback reads below, and the arrays' .zarray documents for their codec encoding."""

    def __init__(self, path: str, group: str | None, store: dict, text: str | None = None):
        self.path = path
        self._text = text     # the JSON of a Parquet reference set (path is its directory)
        self.group = (group or "").strip("/")
        self.store = store
        self._refs = None

    def _load(self) -> dict:
        if self._refs is None:
            try:
                if self._text is not None:
                    doc = json.loads(self._text)
                else:
                    with open(self.path, "rb") as f:
                        doc = json.load(f)
                refs = doc.get("refs", {}) if "version" in doc else doc
                self._refs = refs if isinstance(refs, dict) else {}
            except (OSError, ValueError, AttributeError):
                self._refs = {}
        return self._refs

    def zarray(self, name: str):
        """Array name's .zarray document (a dict), or None: for its codec encoding (zarr_codecs.py)."""
        prefix = f"{self.group}/{name}/" if self.group else f"{name}/"
        v = self._load().get(prefix + ".zarray")
        try:
            if isinstance(v, str):
                v = json.loads(base64.b64decode(v[7:], validate=True) if v.startswith("base64:") else v)
        except (binascii.Error, ValueError):
            return None
        return v if isinstance(v, dict) else None

    def spec(self, name: str, shape: tuple, why: str | None):
        """The zarr-python spec of array name, or None (no zarr, a chunk in another file, bad bytes)."""
        try:
            import zarr
            from zarr.core.buffer import cpu
            from zarr.storage import MemoryStore
        except ImportError:
            return None
        prefix = f"{self.group}/{name}/" if self.group else f"{name}/"
        keys = {}
        for k, v in self._load().items():
            if not k.startswith(prefix):
                continue
            if not isinstance(v, str):
                log.info("%s: variable %s cannot be read by ferry (%s) and its chunks are not all inline: "
                         "loading it raises FerryError", self.path, name, why)
                return None
            try:
                b = base64.b64decode(v[7:], validate=True) if v.startswith("base64:") else v.encode()
            except (binascii.Error, ValueError):
                return None
            keys[k[len(prefix):]] = cpu.Buffer.from_bytes(b)
        try:
            arr = zarr.open_array(store=MemoryStore(keys, read_only=True), mode="r", zarr_format=2)
        except Exception as e:  # noqa: BLE001 — zarr refuses it too: ferry's description stands
            log.info("%s: variable %s: zarr cannot open its inline chunks either (%s)", self.path, name, e)
            return None
        return _zarr_py_spec(self.path, self.group or None, name, self.store, shape, why, arr=arr)
