"""ferry.torch — PyTorch streaming datasets fed by ferry's engine (guide: docs/torch.md).

ArrayDataset (arrays.py), TokenDataset (tokens.py) and XarrayDataset (xarray_dataset.py) share
one batch pipeline (stream.py): order, sharding, epochs, resume, prefetch, CUDA hand-off."""
from __future__ import annotations

from .order import epoch_order
from .stream import ArrayDataset, InaccurateStateWarning, TokenDataset, global_state, pad_collate

__all__ = ["ArrayDataset", "TokenDataset", "XarrayDataset", "epoch_order", "global_state", "pad_collate"]


def __getattr__(name):
    # XarrayDataset lives in its own module (it needs xarray, which ArrayDataset does not)
    if name == "XarrayDataset":
        from .xarray_dataset import XarrayDataset
        return XarrayDataset
    raise AttributeError(f"module 'ferry.torch' has no attribute {name!r}")
