"""XarrayDataset's samples: normalisation statistics, the batch's layout (slabs of channels),
CF decoding (mask, scale, offset) and stacking on the device."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import torch

from .xarray_discovery import _check_stores, _wrap_handles


_UNSIGNED = {torch.int8: torch.uint8, torch.int16: torch.uint16, torch.int32: torch.uint32,
             torch.int64: torch.uint64}


def _decode_into(raw, cf, dst):
    """Stored values (torch, native order) -> floats in dst (same shape; it may be raw itself when
    the stored type is dst's), fills as NaN. A NaN fill of float data is already NaN and stays
    NaN through scale/offset: no mask, no kernel (xarray writes _FillValue=NaN on every float
    variable)."""
    x = raw
    if cf["unsigned"] and raw.dtype in _UNSIGNED:
        x = raw.view(_UNSIGNED[raw.dtype])
    mask = None
    for fv in cf["fills"]:
        if isinstance(fv, float) and math.isnan(fv):
            continue                # NaN in float data is NaN decoded; integers are never NaN
        if cf["unsigned"] and not x.is_floating_point() and fv < 0:
            fv = fv + (1 << (8 * raw.element_size()))    # fill given in the signed type
        m = x == fv
        mask = m if mask is None else (mask | m)
    comp = cf.get("compute")
    work = dst
    if comp is not None and _NP_TORCH[np.dtype(comp)] != dst.dtype:
        # scaled in the type xarray scales in, then cast: a float32 batch of int16 data packed
        # with float64 scale/offset equals xarray's decode cast to float32 (scaling in float32
        # was 1 ulp off)
        work = x.to(_NP_TORCH[np.dtype(comp)])
    elif not (dst.dtype == x.dtype and dst.data_ptr() == x.data_ptr() and dst.stride() == x.stride()):
        dst.copy_(x)
    if cf["scale"] is not None:
        work.mul_(cf["scale"])
    if cf["offset"] is not None:
        work.add_(cf["offset"])
    if mask is not None:
        work.masked_fill_(mask, float("nan"))
    if work is not dst:
        dst.copy_(work)
    return dst


_NP_TORCH = {np.dtype(k): getattr(torch, v) for k, v in (
    ("bool", "bool"), ("int8", "int8"), ("uint8", "uint8"), ("int16", "int16"), ("uint16", "uint16"),
    ("int32", "int32"), ("uint32", "uint32"), ("int64", "int64"), ("uint64", "uint64"),
    ("float16", "float16"), ("float32", "float32"), ("float64", "float64"))}


def _torch_dtype(dt):
    t = _NP_TORCH.get(np.dtype(dt).newbyteorder("="))
    if t is None:
        raise TypeError(f"XarrayDataset: variables of dtype {dt} cannot be batched")
    return t


class _Slab:
    """One destination buffer of a batch's plan: (rows, C, h, w) of one stored dtype, holding
    variables' channels side by side: items (name, channel offset, channels read, levels read)."""
    __slots__ = ("dtype", "plain", "spatial", "items", "C")

    def __init__(self, dtype, plain, spatial):
        self.dtype, self.plain, self.spatial, self.items, self.C = np.dtype(dtype), plain, spatial, [], 0

    def add(self, name, channels, levels):
        self.items.append((name, self.C, channels, levels))
        self.C += channels


def _channel_pick(ranges, total):
    """Channels (offset, count) of the stack, in order -> None (all of them), a slice, or indices."""
    idx = np.concatenate([np.arange(o, o + c, dtype=np.int64) for o, c in ranges]) if ranges else \
        np.zeros(0, dtype=np.int64)
    if len(idx) == total and np.array_equal(idx, np.arange(total)):
        return None
    if len(idx) and np.array_equal(idx, np.arange(idx[0], idx[0] + len(idx))):
        return slice(int(idx[0]), int(idx[0]) + len(idx))
    return idx


def _to_dev(t, device):
    """A small host tensor on `device` without a host sync: through pinned memory, copied on the
    current stream (a pageable copy to the GPU waits for the stream, i.e. for the consumer's
    training step: the idle the dataset caused behind a step)."""
    t = torch.as_tensor(t)
    if torch.device(device).type != "cuda":
        return t
    # lagging streams are safe: torch's pinned block is kept until this copy has run (the host
    # allocator records it on the stream), and the cached device copies are never written again
    return t.pin_memory().to(device, non_blocking=True)


class _XarraySamples:
    """XarrayDataset's samples: normalisation statistics, the batch's layout (slabs of
    channels), CF decoding and stacking."""

    # ---------------------------------------------------------------- normalisation
    def _normalisation(self, normalize, stats_file, stats_steps):
        if normalize is None:
            return None
        names = list(dict.fromkeys(self.variables + self.target_variables))
        if isinstance(normalize, str):
            if normalize != "compute":
                raise ValueError(f"XarrayDataset: normalize must be None, a dict or 'compute', not {normalize!r}")
            stats = None
            key = json.loads(json.dumps(self._stats_key(names, stats_steps)))     # as the file holds it
            if stats_file and os.path.exists(stats_file):
                with open(stats_file) as fh:
                    saved = json.load(fh)
                if saved.get("key") == key:
                    stats = {k: (np.asarray(m), np.asarray(s)) for k, (m, s) in saved["stats"].items()}
            if stats is None:
                stats = self._compute_stats(names, stats_steps)
                if stats_file:
                    tmp = stats_file + ".tmp"
                    with open(tmp, "w") as fh:
                        json.dump({"key": key, "stats": {k: (m.tolist(), s.tolist()) for k, (m, s) in stats.items()}}, fh)
                    os.replace(tmp, stats_file)
        elif isinstance(normalize, dict):
            bad = set(normalize) - set(names)
            if bad:
                raise KeyError(f"XarrayDataset: normalize names unknown variables {sorted(bad)}")
            stats = {}
            for n, (m, s) in normalize.items():
                c = self._vars[n].channels
                m = np.broadcast_to(np.asarray(m, dtype=np.float64).reshape(-1), (c,)).copy() \
                    if np.size(m) in (1, c) else None
                s = np.broadcast_to(np.asarray(s, dtype=np.float64).reshape(-1), (c,)).copy() \
                    if np.size(s) in (1, c) else None
                if m is None or s is None:
                    raise ValueError(f"XarrayDataset: normalize[{n!r}] needs 1 or {c} values")
                stats[n] = (m, s)
        else:
            raise TypeError("XarrayDataset: normalize must be None, a dict or 'compute'")
        for n, (m, s) in stats.items():
            if np.any(s == 0) or not np.all(np.isfinite(s)):
                raise ValueError(f"XarrayDataset: normalize std of {n!r} has zeros or non-finite values")
        return stats

    def _stats_key(self, names, stats_steps):
        """What the computed stats depend on: the files (path, size, mtime), the steps of each read,
        and each variable's selection."""
        def file_id(path):
            try:
                st = os.stat(path)
                return [os.path.abspath(path), st.st_size, st.st_mtime_ns]
            except OSError:
                return [os.path.abspath(path), None, None]

        def sl(x):
            return [x.start, x.stop, x.step]
        sel = {n: {"dims": list(self._vars[n].dims), "sel": [sl(x) for x in self._vars[n].sel],
                   "post": [None if p is None else np.asarray(p).tolist() for p in self._vars[n].post]}
               for n in names}
        files = [file_id(p) + [g] for p, g in dict.fromkeys((sg.path, sg.group) for sg in self._segs)]
        segs = [[os.path.abspath(sg.path), sg.lo, sg.hi, sg.g0] for sg in self._segs]
        return {"variables": names, "steps": self.steps, "stats_steps": stats_steps, "files": files,
                "segments": segs, "selection": sel}

    def _compute_stats(self, names, stats_steps):
        """Per-channel mean/std over evenly spaced steps, NaN ignored, in float64."""
        steps = np.unique(np.linspace(0, self.steps - 1, min(self.steps, max(1, stats_steps))).astype(np.int64))
        device = self._resolve_device(False)
        rt = self._runtime(device, False, 1)
        bufs, job, handles = self._read_rows(rt, steps, None)
        try:
            if job is not None:
                job.wait()
            _check_stores(handles)
        finally:
            self._release(rt, _wrap_handles(handles))
        dec = self._stack(rt, bufs, steps, normalise=False)
        out = {}
        for n in names:
            c0, c = self._coff[n], self._vars[n].channels
            x = dec[:, c0:c0 + c].to(torch.float64)
            x = x.transpose(0, 1).reshape(c, -1)
            mean = torch.nanmean(x, dim=1)
            std = torch.sqrt(torch.nanmean((x - mean[:, None]) ** 2, dim=1))
            out[n] = (mean.cpu().numpy(), std.cpu().numpy())
        return out

    # ---------------------------------------------------------------- the batch's layout
    def _init_slabs(self):
        """Where each variable's channels go. The stack (rows, C, H, W) holds every variable read
        (x's, then y's others), channels in the documented order. Variables of one stored dtype read
        without re-indexing share one slab (a destination buffer of the same layout): the engine
        writes each variable's channels of a row straight into its place in the stack, so for
        float32 data stored as float32 the slab IS the batch (no copy, no kernel; GPU machine,
        netCDF-3: XarrayDataset 26 GB/s = 0.60x of .load() while it decoded, gathered and
        concatenated per variable). A variable read as a bounding range (post-selection) has a slab
        of its own."""
        names = list(dict.fromkeys(self.variables + self.target_variables))
        self._coff, c = {}, 0
        for n in names:
            self._coff[n] = c
            c += self._vars[n].channels
        self._C = c
        self._fdt = self.out_dtype if self.out_dtype.is_floating_point else torch.float32
        slabs, shared = [], {}
        for n in names:
            v = self._vars[n]
            reads = [len(range(*s.indices(10 ** 18))) for s in v.sel]
            plain = all(p is None for p in v.post)
            s = shared.get(v.dtype) if plain else None
            if s is None:
                s = _Slab(v.dtype, plain, tuple(reads[-2:]))
                slabs.append(s)
                if plain:
                    shared[v.dtype] = s
            s.add(n, int(np.prod(reads[:-2], dtype=np.int64)), tuple(reads[:-2]))
        self._slabs = slabs
        # variables whose stored values are their decoded values in every file (float data with no
        # scale/offset and no fill but NaN): nothing to do for them in place (slicing 20 of them
        # was 1.4 ms a batch)
        self._as_stored = {n for n in names if np.dtype(self._vars[n].dtype).kind == "f" and all(
            not cf["unsigned"] and cf["scale"] is None and cf["offset"] is None and
            all(isinstance(f, float) and math.isnan(f) for f in cf["fills"])
            for cf in self._cfs.get(n, [self._vars[n].cf]))}
        one = slabs[0]
        self._in_place = len(slabs) == 1 and one.plain and _torch_dtype(one.dtype) == self._fdt
        self._xch = _channel_pick([(self._coff[n], self._vars[n].channels) for n in self.variables], c)
        self._ych = _channel_pick([(self._coff[n], self._vars[n].channels) for n in self.target_variables], c)

    def _stack(self, rt, bufs, row_steps, patched=False, normalise=True):
        """The slabs' raw values -> the stack (R, C, H, W) of decoded, normalised floats, on the
        current stream, without a host sync (index and parameter tensors are made once)."""
        if rt.device.type == "cuda":
            cur = torch.cuda.current_stream(rt.device)
            # a consumer lagging behind a training step runs all of this late: the slabs are
            # recorded here, the stack and temporaries are allocated here (tests/gpu lagging test)
            for b in bufs:                  # allocated on the engine's stream, used on this one
                b.record_stream(cur)
        R = len(row_steps)
        if self._in_place:
            dec = bufs[0]
            slab = self._slabs[0]
            for n, off, rc, _ in slab.items:
                if n not in self._as_stored:
                    self._decode_var(rt, dec[:, off:off + rc], n, dec[:, off:off + rc], row_steps)
        else:
            hw = tuple(self.patch) if patched else tuple(self.spatial)
            dec = torch.empty((R, self._C) + hw, dtype=self._fdt, device=rt.device)
            for slab, buf in zip(self._slabs, bufs):
                for n, off, rc, levels in slab.items:
                    v, c0 = self._vars[n], self._coff[n]
                    dst = dec[:, c0:c0 + v.channels]
                    src = buf[:, off:off + rc]
                    if slab.plain:
                        self._decode_var(rt, src, n, dst, row_steps)
                        continue
                    tmp = torch.empty(src.shape, dtype=self._fdt, device=rt.device)
                    self._decode_var(rt, src, n, tmp, row_steps)
                    tmp = tmp.reshape((R,) + levels + tuple(src.shape[2:]))
                    for ax, p in enumerate(v.post):
                        if p is not None:
                            tmp = tmp.index_select(1 + ax, self._dev(rt, ("post", n, ax), lambda p=p: p))
                    dst.copy_(tmp.reshape(dst.shape))
        if normalise and self._norm is not None:
            m = self._dev(rt, ("mean", self._fdt), lambda: self._norm_vec(0))
            s = self._dev(rt, ("istd", self._fdt), lambda: self._norm_vec(1))
            dec.sub_(m.view(1, -1, 1, 1)).mul_(s.view(1, -1, 1, 1))
        return dec

    def _norm_vec(self, which):
        """Per-channel mean (0) or 1/std (1) over the stack (0 and 1 where not normalised)."""
        out = np.full(self._C, 0.0 if which == 0 else 1.0)
        for n, (m, s) in self._norm.items():
            c0, c = self._coff[n], self._vars[n].channels
            out[c0:c0 + c] = m if which == 0 else 1.0 / s
        return torch.from_numpy(out).to(self._fdt)

    def _decode_var(self, rt, src, n, dst, row_steps):
        """CF-decode one variable's rows (each with its file's parameters) from src into dst."""
        cfs = self._cfs.get(n, [self._vars[n].cf])
        if len(cfs) == 1:
            _decode_into(src, cfs[0], dst)
            return
        st = np.asarray(row_steps, dtype=np.int64)
        which = self._seg_cf[n][np.searchsorted(self._seg_g0, st, side="right") - 1]
        for k in np.unique(which):
            rows = np.flatnonzero(which == k)
            if rows[-1] - rows[0] + 1 == len(rows):            # a range of rows: views, in place
                sl = slice(int(rows[0]), int(rows[-1]) + 1)
                _decode_into(src[sl], cfs[int(k)], dst[sl])
            else:
                idx = _to_dev(torch.from_numpy(rows), dst.device)
                part = torch.empty((len(rows),) + tuple(dst.shape[1:]), dtype=dst.dtype, device=dst.device)
                _decode_into(src.index_select(0, idx), cfs[int(k)], part)
                dst.index_copy_(0, idx, part)
