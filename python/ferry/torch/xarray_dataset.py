"""ferry.torch.XarrayDataset — shuffled training batches of xarray data, read by ferry's engine.

A sample is a position along one dimension of a set of gridded variables (``time``), with
optional history (``input_steps``), forecast targets (``target_steps`` at ``lead``) and spatial
patches. A batch is ONE ferry plan over every variable and file it touches; time steps shared by
several samples of a batch are read (and decoded) once. CF decoding (fill values → NaN,
scale/offset, ``_Unsigned``) and normalisation run on the batch's device.

Channel order (documented, fixed): for each step (inputs first, oldest first), for each variable
in the order given, the variable's non-spatial, non-sample dims flattened in C order (levels)::

    x[:, s*C + c]      s = input step 0..input_steps-1, c over (var0 levels..., var1 levels..., ...)

Order, sharding, epochs, resume and prefetch are ArrayDataset's (ferry.torch): the same
permutation of sample ids from (seed, epoch), the same rank/worker split, the same state_dict.

What is read: the files behind the dataset, reopened by path in each process (with a fresh
engine context there), so the dataset pickles and works in DataLoader workers. The xarray
Dataset given is used for discovery only: which files, which time steps of each file, and which
index ranges of the other dimensions (``ds.sel(level=[500, 850])`` reads only those levels).
"""
from __future__ import annotations

import numpy as np
import torch

from .._checks import check
from .stream import _BatchStream
from .xarray_discovery import _XarrayDiscovery
from .xarray_reads import _XarrayReads
from .xarray_samples import _XarraySamples

__all__ = ["XarrayDataset"]


class XarrayDataset(_XarrayDiscovery, _XarraySamples, _XarrayReads, _BatchStream):
    """Batches of samples along one dimension of gridded xarray variables, on `device`.

    XarrayDataset(data, variables=None, *, sample_dim="time", batch_size=16, input_steps=1,
                  target_steps=0, lead=1, target_variables=None, patch=None,
                  patch_mode="random", shuffle=False, seed=0, drop_last=False, device=None,
                  rank=None, world_size=None, prefetch=4, normalize=None, stats_file=None,
                  stats_steps=64, nan_to=None, return_mask=False, return_time=False,
                  dtype=torch.float32, group=None, transform=None, threads=0,
                  batches_per_read=None)

    data
        An xarray Dataset opened with ``engine="ferry"`` (one file, ``open_mfdataset``, Zarr, a
        DataTree node's ``.to_dataset()``), possibly selected along any dimension with
        ``sel``/``isel`` (the selection is matched by coordinate values), or paths: a glob, a
        path, or a list (concatenated along ``sample_dim`` in natural order).
    variables
        Names of the data variables stacked into ``x`` (default: every data variable that has
        ``sample_dim`` as its first dimension). Each must have ``sample_dim`` first and the same
        two trailing (spatial) dims; dims in between (levels) become channels.
    input_steps, target_steps, lead
        Sample i starting at step t gives x from steps t .. t+input_steps-1 and, when
        target_steps > 0, y from steps t+input_steps-1+lead .. (+target_steps-1) of
        ``target_variables`` (default: `variables`). Windows never leave the sample dim. Windows
        pair positions along the dim, so when a window spans more than one step and the dim has a
        numeric or datetime coordinate, its spacing must be constant (a gap raises ValueError).
    patch, patch_mode
        patch=(h, w): spatial windows. "random": one window per sample at a position drawn from
        (seed, epoch, sample); "tile": every sample is (step, tile) over a grid of
        non-overlapping h×w tiles (a remainder smaller than a tile is not used).
    normalize, stats_file, stats_steps
        None, {var: (mean, std)} (scalars or one value per channel), or "compute": per-channel
        mean/std over `stats_steps` evenly spaced steps (NaN ignored), computed once here and
        cached in `stats_file` (JSON) when given. out = (x - mean) / std.
    nan_to, return_mask
        Missing values are NaN after decoding; nan_to=v replaces them (after normalising);
        return_mask=True adds batch["mask"] (True where x is valid).
    return_time
        batch["time"]: the sample dim's coordinate at each sample's first input step (int64:
        datetime64 in ns since 1970, else the raw numbers as float64).
    Others as ArrayDataset: shuffle, seed, drop_last, device, rank, world_size, prefetch,
    transform (batch -> batch), threads.
    batches_per_read
        Batches read by one plan (one engine job). Each batch handed out is its own block of its
        group's stack (no batch shares memory with another); the group's memory is freed when all
        of its batches are. None (the default): 1, except on a GPU where the engine asks for
        larger jobs (ferry_plan_budget): deflate-compressed (netCDF-4) and zstd-compressed
        (Zarr) data, whose GPU decoders need thousands of chunks at once — there as many batches
        as make 2.5 GiB, fewer where the groups and their decode buffers would not fit beside
        what the GPU has free (a quarter of it, 64 MiB at least, stays free for the model), three
        such groups in flight whatever `prefetch` asks (the one handed out and two in the engine,
        or one where two do not fit; prefetch=0: one); a FerryError where one batch does not:
        on the GPU machine, 20 variables of 361 x 720 float32, batch 8, 17 batches a read ran at
        21.9-23.3 GB/s (netCDF-4) against 8.1-8.6 with one, and 16 at 44.4
        (Zarr zstd) against 23.5-26.4 (BENCHMARKS.md). Uncompressed and blosc data keep 1. The
        value in use is ``batch_group`` once iteration has begun. A pass reads at most that many
        a plan, evened out over its batches (104 in reads of 17: 7 reads of 15, the last 14).
    progress
        None (off), True/"tqdm" or progress(done_batches, total_batches), as ArrayDataset's.

    Batches are dicts: "x" (B, C*input_steps, H, W) and "y" (B, C_y*target_steps, H, W) when
    target_steps > 0, in `dtype`.
    """

    def __init__(self, data, variables=None, *, sample_dim="time", batch_size=16, input_steps=1,
                 target_steps=0, lead=1, target_variables=None, patch=None, patch_mode="random",
                 shuffle=False, seed=0, drop_last=False, device=None, rank=None, world_size=None,
                 prefetch=4, normalize=None, stats_file=None, stats_steps=64, nan_to=None,
                 return_mask=False, return_time=False, dtype=torch.float32, group=None,
                 transform=None, threads=0, block_size=None, batches_per_read=None, progress=None):
        torch.utils.data.IterableDataset.__init__(self)
        batch_size, input_steps, target_steps, lead, prefetch, stats_steps = (
            check("XarrayDataset", k, v) for k, v in (
                ("batch_size", batch_size), ("input_steps", input_steps), ("target_steps", target_steps),
                ("lead", lead), ("prefetch", prefetch), ("stats_steps", stats_steps)))
        block_size = check("XarrayDataset", "block_size", block_size, none=True)
        batches_per_read = check("XarrayDataset", "batches_per_read", batches_per_read, none=True)
        if patch_mode not in ("random", "tile"):
            raise ValueError(f"XarrayDataset: patch_mode must be 'random' or 'tile', not {patch_mode!r}")
        self.sample_dim = sample_dim
        self.input_steps, self.target_steps, self.lead = input_steps, target_steps, lead
        self.out_dtype = dtype
        self.nan_to = nan_to
        self.return_mask = bool(return_mask)
        self.return_time = bool(return_time)
        self.patch_mode = patch_mode

        segs, ds_meta, var_names = self._discover(data, variables, sample_dim, group)
        self._segs = segs
        self._seg_g0 = np.array([s.g0 for s in segs], dtype=np.int64)
        self.steps = int(sum(s.hi - s.lo for s in segs))
        tvars = list(var_names) if target_variables is None else list(target_variables)
        all_names = list(dict.fromkeys(list(var_names) + (tvars if target_steps else [])))
        self._vars = {n: self._var_info(ds_meta, n, sample_dim) for n in all_names}
        self._check_files(all_names)
        self.variables, self.target_variables = list(var_names), tvars if target_steps else []
        sp = {v.spatial for v in self._vars.values()}
        if len(sp) != 1:
            raise ValueError(f"XarrayDataset: variables have different spatial shapes "
                             f"{ {n: v.spatial for n, v in self._vars.items()} }")
        self.spatial = sp.pop()
        self._times = self._time_numbers(ds_meta, sample_dim) if return_time else None

        self.span = input_steps + ((lead + target_steps - 1) if target_steps else 0)
        self.n_starts = self.steps - self.span + 1
        if self.n_starts < 1:
            raise ValueError(f"XarrayDataset: {self.steps} steps along {sample_dim!r} are fewer than one "
                             f"sample needs ({self.span})")
        if self.span > 1:
            self._check_spacing(ds_meta, sample_dim)
        self.patch = None if patch is None else tuple(int(p) for p in patch)
        self.tiles = (1, 1)
        if self.patch is not None:
            if len(self.patch) != 2 or min(self.patch) < 1 or self.patch[0] > self.spatial[0] \
                    or self.patch[1] > self.spatial[1]:
                raise ValueError(f"XarrayDataset: patch {patch!r} does not fit the grid {self.spatial}")
            for n, v in self._vars.items():
                for d, p in zip(v.dims[-2:], v.post[-2:]):
                    if p is not None:
                        raise ValueError(f"XarrayDataset: patch= needs the spatial dims in file order, but "
                                         f"{n!r} selects {d!r} in another order (reversed or out of order): "
                                         "select it in increasing order and flip in transform=")
            if patch_mode == "tile":
                self.tiles = (self.spatial[0] // self.patch[0], self.spatial[1] // self.patch[1])
        ntiles = self.tiles[0] * self.tiles[1]

        # the batch stream shared with ArrayDataset (order, layout, epochs, state, runtime)
        self.block_size = block_size
        self._init_stream(batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                          device=device, rank=rank, world_size=world_size, prefetch=prefetch,
                          transform=transform, pin_memory=False, threads=threads, ctx=None, sample_group=1,
                          progress=progress)
        self.staging = "engine"
        self._single = False
        self._fields = []
        self.num_samples = self.n_starts * ntiles

        self._init_slabs()
        self.batch_group = self._group_size(batches_per_read)     # _BatchStream's batches per plan
        self._group_auto, self._auto_groups = batches_per_read is None, {}   # _read_group
        self._norm = None
        self._norm = self._normalisation(normalize, stats_file, int(stats_steps))

    # ---------------------------------------------------------------- introspection
    @property
    def fields(self):
        c = sum(self._vars[n].channels for n in self.variables)
        out = {"x": ((c * self.input_steps,) + (self.patch or self.spatial), self.out_dtype)}
        if self.target_steps:
            cy = sum(self._vars[n].channels for n in self.target_variables)
            out["y"] = ((cy * self.target_steps,) + (self.patch or self.spatial), self.out_dtype)
        return out

    def channel_names(self, which="x"):
        """Names of the channels of x (or y), in order: "var[level index...]@step"."""
        names = self.variables if which == "x" else self.target_variables
        steps = range(self.input_steps) if which == "x" else range(self.target_steps)
        out = []
        for s in steps:
            for n in names:
                lv = self._vars[n].levels
                if lv:
                    out.extend(f"{n}{list(ix)}@{s}" for ix in np.ndindex(*lv))
                else:
                    out.append(f"{n}@{s}")
        return out

    def __repr__(self):
        return (f"XarrayDataset({self.num_samples} samples over {self.steps} steps of {self.sample_dim!r}, "
                f"x={self.variables}, y={self.target_variables}, batch_size={self.batch_size}, "
                f"epoch={self._epoch}, consumed={self._consumed})")


