"""ferry.xarray — xarray backend: ``xr.open_dataset(path, engine="ferry", device=0)``
(guide: docs/python-extension.md; the store's own notes: store.py)."""
from __future__ import annotations

from .store import FerryBackendArray, FerryBackendEntrypoint, FerryStore, cupy_meta, open_mfdataset

__all__ = ["FerryBackendEntrypoint", "FerryStore", "FerryBackendArray", "cupy_meta", "open_mfdataset"]
