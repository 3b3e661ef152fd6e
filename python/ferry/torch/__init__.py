"""ferry.torch — PyTorch streaming datasets fed by ferry's engine.

``ArrayDataset`` is a ``torch.utils.data.IterableDataset`` whose samples are the rows (the first
axis) of one or more arrays stored in ``.npy`` files, safetensors shards or Zarr arrays, or
(``samples="files"``) whole files, one per sample. ``TokenDataset`` yields (x, y) windows of
flat token files; ``ImageDataset`` decoded image batches from WebDataset tar, Mosaic MDS or
ImageFolder shards. They share one contract (_BatchStream: order, sharding, epochs, resume,
prefetch, CUDA hand-off), which a dataset over other samples reuses by describing its fields. A batch
of sample ids becomes one ferry plan (one extent per run of consecutive rows) that the engine's
native threads read straight into tensors allocated by torch on ``device``; no worker processes,
no pickling, no pageable copies. See docs/torch.md for the full guide.

Modules: arrays.py (ArrayDataset), tokens.py (TokenDataset), images.py (ImageDataset),
xarray_dataset.py (XarrayDataset), stream.py (the pipeline they share, with state.py, ahead.py,
groups.py), sources.py and files.py (what a field reads), runtime.py (the engine state and handle cache of one process).

Order and sharding (W ranks, batch B, N samples)
    The epoch order is a permutation of range(N) computed from (seed, epoch) alone, identical on
    every rank and process. Global step s consumes positions [s*W*B, (s+1)*W*B) of that order;
    rank r takes [s*W*B + r*B, s*W*B + (r+1)*B). After k steps exactly the first k*W*B positions
    are consumed whatever W is, so a state saved with W ranks resumes with W' ranks.
    Tail (fewer than W*B positions left): drop_last=True drops it; drop_last=False splits it as
    evenly as possible (contiguous slices, rank order) — every sample exactly once, but ranks
    whose slice is empty yield one batch fewer (use drop_last=True with DDP).
    Inside a DataLoader with num_workers=n, worker w of a rank takes that rank's batches
    w, w+n, w+2n, ...: the DataLoader's round-robin hands them to the training loop in order.

Epochs
    Handing over a pass's last batch ends the pass (Lightning never asks for StopIteration): the
    next iter() is the next epoch. The state stays global: a rank whose share of an uneven tail
    is empty reports the position after its last step (where every rank is at that step) until
    its StopIteration, the step in which the other ranks finish the epoch.
    Worker copies learn their epoch from a shared-memory board (loader.EpochBoard): each
    new DataLoader pass is the next epoch unless set_epoch/load_state_dict in the main process
    chose one. In the main process the next epoch's first reads run while a pass's last batches
    are consumed (_BatchStream, "Epoch boundaries"; FERRY_EPOCH_AHEAD=off turns it off).
"""
from __future__ import annotations

try:   # the one place that says what to install; the modules below import torch plainly
    import torch as _torch  # noqa: F401
except ImportError as e:
    raise ImportError(f"ferry.torch needs PyTorch: pip install ferry-io[torch] ({e})") from e

from .arrays import ArrayDataset, pad_collate
from .images import ImageDataset
from .order import epoch_order
from .state import InaccurateStateWarning, global_state  # noqa: F401 (the warning's class)
from .tokens import TokenDataset

__all__ = ["ArrayDataset", "ImageDataset", "TokenDataset", "XarrayDataset", "epoch_order", "global_state", "pad_collate"]


def __getattr__(name):
    # XarrayDataset lives in its own module (it needs xarray, which ArrayDataset does not)
    if name == "XarrayDataset":
        from .xarray_dataset import XarrayDataset
        return XarrayDataset
    raise AttributeError(f"module 'ferry.torch' has no attribute {name!r}")
