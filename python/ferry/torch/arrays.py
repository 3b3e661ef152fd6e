"""ferry.torch.ArrayDataset: samples are the rows of arrays (.npy, safetensors, Zarr), or whole
files (samples="files"); pad_collate for fields whose samples differ in shape."""
from __future__ import annotations


import numpy as np

from .. import _ferry
from .._checks import check
from .files import _file_sig, _load_file_field
from .sources import _load_field
from .stream import _BatchStream


class ArrayDataset(_BatchStream):
    """Batches of samples of arrays in files, read by ferry's engine into torch tensors on `device`.

    ArrayDataset(source=None, *, fields=None, samples="rows", batch_size=256, shuffle=False,
                 seed=0, drop_last=False, device=None, rank=None, world_size=None, prefetch=4,
                 block_size=None, dtype=None, normalize=None, transform=None, collate=None,
                 pin_memory=False, threads=0, ctx=None, sample_group=64, staging="auto")

    source / fields
        `source`: one field, batches are tensors. `fields={"x": ..., "y": ...}`: batches are dicts.
        Each field is a glob ("train/x_*.npy", sorted in natural order: x_2 before x_10), a path,
        a list of paths, or a tuple (paths_or_glob, name) naming the array inside each file (the
        tensor of a safetensors shard, the array of a Zarr group; "grp/arr" for nested Zarr).
        A file holding one array needs no name. All fields must have the same number of samples.
    samples
        "rows" (default): the samples are the rows (first axis) of the arrays, concatenated over
        a field's files. "files": every file is one sample (one .npy per image, DALI's and
        MONAI's layout); a field may also be a directory (its files, natural order). Fields are
        parallel lists: sample i is file i of every field. Scalar files give (B,) batches.
    collate
        samples="files" only: None (default) — every file of a field must have the shape and
        dtype of its first file (else an error naming the file); a callable, or {field:
        callable}, takes the batch's list of sample tensors (of any shapes) and returns the
        field's value: `list` keeps the list, ferry.torch.pad_collate() pads to the largest.
    batch_size
        Samples per batch (per rank), or None to yield single samples (then wrap it in a
        DataLoader with a batch_size to let torch batch them).
    shuffle, seed, block_size
        The epoch order: see epoch_order(). set_epoch(n) selects the epoch.
    device
        "cuda", "cuda:1", torch.device, or "cpu"; None: CUDA when available (host otherwise).
        Inside DataLoader worker processes only "cpu" works (CUDA cannot run in forked workers).
    rank, world_size
        Default: torch.distributed's when it is initialised, else 0 and 1.
    prefetch
        Batches in flight ahead of the one being consumed.
    dtype, normalize
        Casting on the device: dtype=torch.float16 (or {"x": torch.float16}); normalize=(mean,
        std) or {"x": (mean, std)}, scalars or per-channel sequences applied along the first axis
        of a sample (C of CHW): out = (x - mean) / std, in `dtype` (float32 if not given).
    transform
        A callable batch -> batch run after casting; on CUDA it runs on ferry's stream and the
        consumer's current stream waits for it.
    pin_memory
        Host batches in page-locked memory (only when CUDA is available).
    threads, ctx
        Engine threads for a context ferry.torch creates (0: engine default), or a
        ferry._ferry.Context to use in the main process.
    sample_group
        Per-sample mode: samples read per plan.
    staging
        CUDA only; one value or {field: value}: "auto" (default) or "engine", the same: the
        engine moves every field to the GPU itself (cuFile, or its pinned staging buffers,
        records packed back to back, one host-to-device copy per buffer of adjacent rows).
        "pinned" (host-path batches copied by torch) was removed: a ValueError says so.
    progress
        None (off), True/"tqdm" (a tqdm bar over each epoch's batches, or log lines on
        ferry.torch without tqdm) or progress(done_batches, total_batches). Off in DataLoader
        workers.
    """

    _STAGE_AHEAD = True

    def __init__(self, source=None, *, fields=None, samples="rows", batch_size=256, shuffle=False,
                 seed=0, drop_last=False, device=None, rank=None, world_size=None, prefetch=4,
                 block_size=None, dtype=None, normalize=None, transform=None, collate=None,
                 pin_memory=False, threads=0, ctx=None, sample_group=64, staging="auto", progress=None):
        super().__init__()
        if (source is None) == (fields is None):
            raise TypeError("ArrayDataset: give exactly one of `source` or `fields`")
        if samples not in ("rows", "files"):
            raise ValueError(f"ArrayDataset: samples must be 'rows' or 'files', not {samples!r}")
        if collate is not None and samples != "files":
            raise ValueError("ArrayDataset: collate= applies to samples='files' (rows of one "
                             "array all have the same shape)")
        self.block_size = check("ArrayDataset", "block_size", block_size, none=True)
        self._init_stream(batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                          device=device, rank=rank, world_size=world_size, prefetch=prefetch,
                          transform=transform, pin_memory=pin_memory, threads=threads, ctx=ctx,
                          sample_group=sample_group, progress=progress)
        self._single = fields is None
        specs = {"data": source} if self._single else dict(fields)
        if not specs:
            raise ValueError("ArrayDataset: fields is empty")
        self.samples = samples
        self.staging = staging
        collates = _per_field_option(collate, list(specs), self._single, "collate")

        meta_ctx = ctx if ctx is not None else _ferry.Context(threads=1)
        try:
            if samples == "rows":
                self._fields = [_load_field(meta_ctx, k, v) for k, v in specs.items()]
            else:
                self._fields = [_load_file_field(meta_ctx, k, v, collates.get(k))
                                for k, v in specs.items()]
        finally:
            if ctx is None:
                meta_ctx.close()
        n = {f.name: f.rows for f in self._fields}
        if len(set(n.values())) != 1:
            what = "files" if samples == "files" else "rows"
            raise ValueError(f"ArrayDataset: fields have different numbers of {what}: {n}")
        self.num_samples = self._fields[0].rows
        self._convert = self._conversions(dtype, normalize)
        self._staging_per_field(staging)   # "auto" or "engine": one path either way

    def _ahead_stamp(self, order, lay, units):
        """samples="files": every file of the group's samples. Their headers are read when the
        group is submitted (and replaced files opened anew: _plan_sample_files); a file replaced
        between a group read ahead and the next pass would have been read anew by that pass."""
        if self.samples != "files":
            return None
        ids = np.concatenate([np.asarray(order[lo:hi]) for lo, hi in (lay.unit(s) for s in units)])
        return tuple(_file_sig(f.paths[i]) for f in self._fields for i in ids.tolist())


def _per_field_option(v, names, single, what):
    if v is None:
        return {}
    if isinstance(v, dict):
        bad = set(v) - set(names)
        if bad:
            raise KeyError(f"ArrayDataset: {what} names unknown fields {sorted(bad)}")
        return dict(v)
    return {k: v for k in names}


def pad_collate(value=0):
    """A collate= for ragged per-sample files: pads every sample at the end of each axis to the
    largest shape in the batch (with `value`) and stacks them into one tensor."""
    def collate(samples):
        if not samples:
            raise ValueError("pad_collate: an empty batch")
        nd = {t.dim() for t in samples}
        if len(nd) != 1:
            raise ValueError(f"pad_collate: samples have different numbers of axes {sorted(nd)}")
        shape = [max(t.shape[i] for t in samples) for i in range(samples[0].dim())]
        out = samples[0].new_full([len(samples)] + shape, value)
        for i, t in enumerate(samples):
            out[(i,) + tuple(slice(0, d) for d in t.shape)] = t
        return out
    return collate
