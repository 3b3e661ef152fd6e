"""ferry.dali — ferry datasets as the source of NVIDIA DALI pipelines.

``DALISource(dataset)`` is a batch source for ``nvidia.dali.fn.external_source`` (batch mode,
``batch_info=True``): each call returns the next batch of a ferry dataset (``XarrayDataset``,
``ArrayDataset``, ``ImageDataset``), already in GPU memory for ``device="gpu"`` — DALI takes it from there with one
device-to-device copy on the stream the batch is ordered on (torch's current stream, which ferry
makes wait for its reads), no host round trip. ``pipeline(dataset, then=...)`` builds a ready
pipeline with the source wired in; ``then`` adds your DALI operators after it::

    import ferry.dali, nvidia.dali.fn as fn
    ds = ferry.torch.XarrayDataset(xr.open_mfdataset("era5_*.nc", engine="ferry"), ["t2m", "z"],
                                   batch_size=16, target_steps=1, shuffle=True, device="cuda")
    pipe = ferry.dali.pipeline(ds, outputs=("x", "y"), layout="CHW",
                               then=lambda x, y: (fn.flip(x, horizontal=1), y))
    pipe.build()
    x, y = pipe.run()           # TensorListGPU; or wrap it in DALIGenericIterator

Image batches: ``pipeline(ImageDataset(...))`` feeds ("image", "label") by default (("image",)
for a set without labels), the image in the dataset's layout (decoded, cropped, flipped and
normalised by ferry), so DALI operators can follow::

    ds = ferry.torch.ImageDataset("train-*.tar", batch_size=256, size=224, flip=0.5,
                                  shuffle=True, device="cuda")
    pipe = ferry.dali.pipeline(ds)                       # outputs ("image", "label"), layout "CHW"

Keys and other str/bytes members can be outputs too (each sample as a uint8 array of its UTF-8
bytes). A batch from which on_error="skip" left images out is smaller: DALI takes batches of
any size up to the pipeline's.

Epochs: the source raises StopIteration at the end of the dataset's epoch (DALI's end of data);
``pipe.reset()`` starts the next one (DALI passes the epoch index to the source, and the source
sets the dataset's epoch from it: epoch = the dataset's epoch when the source was made + DALI's
epoch index).

Resume: the source is a pure function of DALI's (epoch index, iteration), so DALI's own
checkpoints carry its position: build the pipeline with ``enable_checkpointing=True`` (the default
of ``pipeline()``), save ``pipe.checkpoint()``, and rebuild with ``checkpoint=saved``: the next
batch is the one the saved run would have produced next. (ferry's ``dataset.state_dict()`` is
ahead of what the pipeline has returned by DALI's prefetch depth; use DALI's checkpoint.)

DALI is optional (``pip install ferry-io[dali]`` or ``nvidia-dali-cuda130``) and imported only here.
"""
from __future__ import annotations

import collections
import importlib.util

from . import _current_cuda_device
from ._checks import check


def _dali_installed():
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):     # no `nvidia` package at all
        return False


# DALI itself is imported only when a pipeline is built (_dali: it is slow to import); whether
# it is installed is known here, so `import ferry.dali` says what to install
if not _dali_installed():
    raise ImportError("ferry.dali needs NVIDIA DALI: pip install ferry-io[dali] "
                      "(nvidia-dali-cuda130; nvidia-dali-cuda120 for CUDA 12)")

__all__ = ["DALISource", "pipeline"]

# pipeline()'s default for external_source(use_copy_kernel=): how DALI copies each GPU batch
# into its own buffer. False: cudaMemcpyAsync, DALI's default. Its copy kernel did not run faster
# beside the engine's host-to-device copies (on the GPU machine, four epochs back to back:
# 0.94-1.02 x the dataset alone against 0.95-0.99 with the memcpy; BENCHMARKS.md, X3)
COPY_KERNEL = False


def _dali():
    try:
        import nvidia.dali as dali
        import nvidia.dali.fn as fn
    except ImportError as e:   # pragma: no cover - depends on the environment
        raise ImportError(f"ferry.dali needs NVIDIA DALI: pip install ferry-io[dali] ({e})") from e
    return dali, fn


class DALISource:
    """A batch-mode, ``batch_info=True`` source for ``fn.external_source`` over a ferry dataset.

    DALISource(dataset, outputs=None, keep=4)

    dataset
        A ferry.torch dataset yielding batches: tensors, or dicts of tensors.
    outputs
        For dict batches, the keys in the order the external source returns them (give
        ``num_outputs=len(outputs)`` to external_source); None for tensor batches.
    keep
        Batches kept referenced after being handed to DALI (their memory must not be reused
        while DALI's copy of them may still be in flight; DALI copies on the batch's stream, so
        a few suffice).
    """

    def __init__(self, dataset, outputs=None, keep=4):
        self.dataset = dataset
        self.outputs = None if outputs is None else tuple(outputs)
        self._epoch0 = int(getattr(dataset, "epoch", 0))
        # a state loaded into the dataset before the source was made (mid-epoch): DALI's epoch
        # index 0 continues from it
        self._consumed0 = int(dataset.state_dict().get("samples_consumed", 0)) \
            if hasattr(dataset, "state_dict") else 0
        self._it = None
        self._pos = None                 # (DALI epoch index, iteration) of the next batch of _it
        self._kept = collections.deque(maxlen=check("DALISource", "keep", keep))

    @property
    def num_outputs(self):
        return None if self.outputs is None else len(self.outputs)

    def _seek(self, epoch_idx, iteration):
        ds = self.dataset
        st = ds.state_dict()
        rank, world = ds._dist()
        per_step = world * int(ds.batch_size or 1)
        st["epoch"] = self._epoch0 + int(epoch_idx)
        base = self._consumed0 if int(epoch_idx) == 0 else 0
        st["samples_consumed"] = min(int(st["num_samples"]), base + int(iteration) * per_step)
        st.pop("worker", None)
        ds.load_state_dict(st)
        self._it = iter(ds)
        self._pos = (int(epoch_idx), int(iteration))

    def __call__(self, info=None):
        if info is None:                       # plain callable use: the next batch
            want = self._pos or (0, 0)
        elif isinstance(info, int):            # a per-iteration index source
            want = ((self._pos or (0, 0))[0], int(info))
        else:                                  # nvidia.dali.types.BatchInfo
            want = (int(info.epoch_idx), int(info.iteration))
        if self._it is None or self._pos != want:
            self._seek(*want)
        try:
            batch = next(self._it)
        except StopIteration:
            self._it = None
            self._pos = (want[0] + 1, 0)
            raise
        self._pos = (want[0], want[1] + 1)
        self._kept.append(batch)
        if self.outputs is None:
            if isinstance(batch, dict):
                raise TypeError("DALISource: the dataset yields dicts; name the keys with outputs=(...)")
            return _for_dali(batch)
        if not isinstance(batch, dict):
            raise TypeError("DALISource: outputs= given but the dataset yields "
                            f"{type(batch).__name__}, not dicts")
        missing = [k for k in self.outputs if k not in batch]
        if missing:
            raise KeyError(f"DALISource: batches have no {missing} (they have {sorted(batch)})")
        return tuple(_for_dali(batch[k]) for k in self.outputs)


def _for_dali(t):
    """GPU tensors go as they are (DALI copies them on torch's current stream, which ferry's
    dataset made wait for the batch); host tensors as numpy views (DALI would otherwise ask
    torch for a CUDA stream even for host data).

    The copy stays: with external_source(no_copy=True) DALI reads the batch's memory itself
    without waiting for the stream the batch is ordered on, and behind a stream lagging 10 ms
    (tests/gpu's lagging-stream case) 99-100 % of the elements it returned were wrong (the
    source kept every batch referenced for prefetch_queue_depth + 2 calls). Nor is the copy what
    a DALI epoch costs beyond the dataset's (BENCHMARKS.md's history: an epoch's first batch, and
    DALI's own work per iteration)."""
    if getattr(t, "is_cuda", False):
        _order_on_current_device(t)
        return t
    if hasattr(t, "numpy"):
        return t.numpy()
    if isinstance(t, (list, tuple)):          # an image batch's keys, texts, ragged members
        return [_sample_for_dali(v) for v in t]
    return t


def _sample_for_dali(v):
    """One sample of a list-valued member: tensors as numpy, str and bytes as uint8 arrays."""
    import numpy as np
    if hasattr(v, "numpy"):
        return v.cpu().numpy() if getattr(v, "is_cuda", False) else v.numpy()
    if isinstance(v, str):
        v = v.encode("utf-8")
    if isinstance(v, (bytes, bytearray)):
        return np.frombuffer(bytes(v), np.uint8)
    raise TypeError(f"DALISource: a batch member of {type(v).__name__} values has no DALI form; "
                    f"leave it out of outputs=")


def pipeline(dataset, *, outputs=None, then=None, device_id=None, num_threads=2, prefetch_queue_depth=2,
             layout=None, enable_checkpointing=True, checkpoint=None, use_copy_kernel=None, **pipeline_kwargs):
    """A DALI Pipeline whose input is `dataset` through a DALISource.

    outputs: the batch dict keys to feed (None: tensor batches); then: a function of the source's
    DataNodes returning the pipeline's outputs (your DALI operators), default: the source's
    outputs as they are. device_id: the GPU (default: the dataset's device; None and a CPU
    dataset give a CPU-only pipeline). layout: DALI layout string(s) of a sample, e.g. "CHW".
    use_copy_kernel: external_source's option (DALI copies each GPU batch with a kernel instead
    of cudaMemcpyAsync); None: ferry's choice, COPY_KERNEL.
    For an ImageDataset, outputs=None feeds ("image", "label") (("image",) without labels) and
    layout=None gives the image the dataset's layout.
    The source object is the pipeline's ``ferry_source`` attribute."""
    device_id, num_threads = (check("ferry.dali.pipeline", k, v, none=k == "device_id")
                              for k, v in (("device_id", device_id), ("num_threads", num_threads)))
    if not isinstance(prefetch_queue_depth, dict):       # DALI's {"cpu_size": .., "gpu_size": ..} passes
        prefetch_queue_depth = check("ferry.dali.pipeline", "prefetch_queue_depth", prefetch_queue_depth)
    dali, fn = _dali()
    if outputs is None and hasattr(dataset, "_sample_members"):        # an ImageDataset
        outputs = ("image", "label") if dataset._sample_members.has_label else ("image",)
        if layout is None:
            layout = [dataset.layout] + [""] * (len(outputs) - 1) if len(outputs) > 1 else dataset.layout
    dev = getattr(dataset, "device", None)
    if device_id is None and dev is not None and getattr(dev, "type", None) == "cuda":
        device_id = dev.index if dev.index is not None else _current_cuda_device()
    if device_id is None and dev is None:
        import torch
        if torch.cuda.is_available():
            device_id = _current_cuda_device()
    src = DALISource(dataset, outputs)
    bs = int(getattr(dataset, "batch_size", None) or 1)
    pipe = dali.Pipeline(batch_size=bs, num_threads=num_threads, device_id=device_id,
                         prefetch_queue_depth=prefetch_queue_depth,
                         enable_checkpointing=enable_checkpointing, checkpoint=checkpoint, **pipeline_kwargs)
    where = "gpu" if device_id is not None and (dev is None or getattr(dev, "type", "cuda") == "cuda") else "cpu"
    with pipe:
        kw = {"use_copy_kernel": COPY_KERNEL if use_copy_kernel is None else bool(use_copy_kernel)}
        if layout is not None:
            kw["layout"] = layout
        if src.num_outputs is None:
            nodes = (fn.external_source(source=src, batch=True, batch_info=True, device=where, **kw),)
        else:
            nodes = tuple(fn.external_source(source=src, num_outputs=src.num_outputs, batch=True,
                                             batch_info=True, device=where, **kw))
        outs = then(*nodes) if then is not None else nodes
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        pipe.set_outputs(*outs)
    pipe.ferry_source = src
    return pipe


def _order_on_current_device(t):
    """DALI copies a torch tensor on torch.cuda.current_stream() of the CURRENT device, while
    ferry's dataset ordered the batch after its reads and recorded its memory on the current
    stream of the batch's device: the same stream, unless the batch's device is not the current
    one (a dataset on cuda:1 without torch.cuda.set_device(1)). Then DALI's stream waits for the
    batch's and the batch's memory is recorded on DALI's stream too, so the copy neither reads
    before ferry's reads land nor after the block went to a later read. (Same device: nothing to
    do, and a consumer stream lagging behind a training step delays DALI's copy, not its order.)"""
    import torch
    dali_stream = torch.cuda.current_stream()
    own = torch.cuda.current_stream(t.device)
    if dali_stream.device != own.device:
        dali_stream.wait_stream(own)
        t.record_stream(dali_stream)
