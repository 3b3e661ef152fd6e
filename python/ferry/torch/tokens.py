"""ferry.torch.TokenDataset: (x, y) windows of seq_len+1 tokens from flat token files."""
from __future__ import annotations

import os
import warnings

import numpy as np
import torch

from .. import _ferry
from .._checks import check
from .order import FeistelOrder
from .groups import _Group, _PlannedJob
from .sources import _LITTLE, _expand
from .stream import _BatchStream


_plan_windows = getattr(_ferry, "plan_windows", None)   # TokenDataset's group plans (ext/perm.c)


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


# --------------------------------------------------------------------------------------------
# TokenDataset's one field: windows of seq_len + 1 tokens
# --------------------------------------------------------------------------------------------
_TOKEN_DTYPES = {"uint16": ("<u2", torch.uint16), "uint32": ("<u4", torch.uint32),
                 "int32": ("<i4", torch.int32), "int64": ("<i8", torch.int64)}


class _TokenField:
    name = "tokens"

    def __init__(self, paths, offsets, tokens, seq_len, typestr, dtype):
        self.paths = paths
        self.offsets = np.asarray(offsets, dtype=np.int64)     # byte offset of token 0 per file
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.seq_len = seq_len
        self.itemsize = int(typestr[2:])
        self.windows = np.maximum(0, (self.tokens - 1) // seq_len)
        self.starts = np.concatenate(([0], np.cumsum(self.windows)[:-1])).astype(np.int64)
        self.rows = int(self.windows.sum())
        self.dtype, self.shape = dtype, (seq_len + 1,)
        self.row_bytes = (seq_len + 1) * self.itemsize

    def __repr__(self):
        return f"<tokens files={len(self.paths)} windows={self.rows} of {self.seq_len + 1} {self.dtype}>"

    def read_group(self, ds, rt, plan, order, ranges, g, buf=None):
        """The windows at the epoch positions of `ranges` ((lo, hi) per batch), in batch order,
        into one (total, seq_len + 1) buffer (`buf`, or a new one): one plan_windows call
        (order, file and offset of every window computed in C; files opened as their windows
        come up)."""
        total = sum(hi - lo for lo, hi in ranges)
        if buf is None:
            buf = ds._alloc(rt, (total,) + self.shape, self.dtype)
        if total:
            dev = buf.device.index if buf.is_cuda else -1

            def opener(k):
                p = self.paths[k]
                e = rt.handle(("file", p), lambda p=p: _ferry.File(rt.ctx, p))
                e[1] += 1                   # in use until the group is released
                g.handles.append(e)
                return e[0]
            _ferry.plan_windows(plan, opener, self.starts, self.offsets, self.seq_len * self.itemsize,
                                self.row_bytes, order.n, order.seed, order.epoch, order.shuffle,
                                np.asarray(ranges, dtype=np.int64).reshape(-1),
                                (buf.data_ptr(), total * self.row_bytes, dev))
        return buf

    def read(self, ds, rt, plan, ids, g):
        handles = g.handles
        total = len(ids)
        buf = ds._alloc(rt, (total,) + self.shape, self.dtype)
        if total:
            dev = buf.device.index if buf.is_cuda else -1
            k = np.searchsorted(self.starts, ids, side="right") - 1 if len(self.paths) > 1 \
                else np.zeros(len(ids), dtype=np.int64)
            off = self.offsets[k] + (ids - self.starts[k]) * (self.seq_len * self.itemsize)
            dst = (buf.data_ptr(), total * self.row_bytes, dev)
            rb = self.row_bytes
            doff = np.arange(total, dtype=np.int64) * rb
            # one call for the whole read (a Python call per window was the loader's cost),
            # the windows in batch order over all files: packed staging buffers then hold
            # windows adjacent in the batch, one copy each (see _plan_rows)
            used = np.flatnonzero(np.bincount(k)).tolist() if len(self.paths) > 1 else [0]
            files = []
            for kk in used:
                p = self.paths[kk]
                e = rt.handle(("file", p), lambda p=p: _ferry.File(rt.ctx, p))
                e[1] += 1
                handles.append(e)
                files.append(e[0])
            if len(used) > 1:
                at = np.empty(len(self.paths), dtype=np.int64)
                at[used] = np.arange(len(used), dtype=np.int64)
                plan.read_files_runs(files, at[k], off, rb, dst, doff)
            else:
                plan.read_file_runs(files[0], off, rb, dst, doff)
        return buf


def _load_token_field(ctx, files, seq_len, dtype):
    if dtype not in _TOKEN_DTYPES:
        raise ValueError(f"TokenDataset: dtype must be one of {sorted(_TOKEN_DTYPES)}, not {dtype!r}")
    want, tdt = _TOKEN_DTYPES[dtype]
    paths = _expand(files, ctx)
    offsets, tokens = [], []
    isz = int(want[2:])
    for p in paths:
        try:
            h = _ferry.Dataset(ctx, p)
        except _ferry.FerryError as e:
            if e.code != _ferry.ENOFORMAT:
                raise
            h = None
        if h is None:                                    # raw tokens (nanoGPT's .bin)
            if not p.endswith(".bin"):
                # a glob also matching a README or a .json must not train on its bytes
                raise _ferry.FerryError(_ferry.ENOFORMAT, f"TokenDataset: {p} is neither a 1-D .npy nor a "
                                        "raw token file named *.bin (nanoGPT's layout)")
            if "://" in p and not p.startswith("file://"):   # an object: its size from its open (one request)
                with _ferry.File(ctx, p) as f:
                    size = f.size
            else:
                size = os.path.getsize(p)
            if size % isz:
                raise _ferry.FerryError(_ferry.EINVAL, f"TokenDataset: {p} has {size} bytes, not a "
                                        f"whole number of {dtype} tokens")
            offsets.append(0)
            tokens.append(size // isz)
            continue
        try:
            vs = h.variables()
        finally:
            h.close()
        if len(vs) != 1 or len(vs[0]["shape"]) != 1:
            raise _ferry.FerryError(_ferry.EINVAL, f"TokenDataset: {p} is not one 1-D array "
                                    f"(it holds {[(v['name'], tuple(v['shape'])) for v in vs]})")
        v = vs[0]
        ts = v["typestr"]
        if ts.lstrip("<>=|") != want[1:] or (ts[0] == ">" and isz > 1) or v.get("codecs"):
            raise _ferry.FerryError(_ferry.EINVAL, f"TokenDataset: {p} holds {ts} tokens, "
                                    f"dtype={dtype!r} expects {want}")
        n = int(v["shape"][0])
        if int(v.get("data_bytes") or 0) != n * isz:
            raise _ferry.FerryError(_ferry.EUNSUPPORTED, f"TokenDataset: {p}: tokens are not "
                                    f"stored contiguously")
        offsets.append(int(v.get("data_offset") or 0))
        tokens.append(n)
    if not _LITTLE:
        raise _ferry.FerryError(_ferry.EUNSUPPORTED, "TokenDataset: little-endian hosts only")
    return _TokenField(paths, offsets, tokens, seq_len, want, tdt)


# --------------------------------------------------------------------------------------------
# Token windows of flat token files
# --------------------------------------------------------------------------------------------
class TokenDataset(_BatchStream):
    """(x, y) batches of token windows from flat token files, for language-model training.

    TokenDataset(files, seq_len, batch_size, dtype="uint16", shuffle=None, seed=0,
                 drop_last=True, device=None, rank=None, world_size=None, prefetch=4,
                 out_dtype=torch.int64, threads=0, ctx=None, staging="auto",
                 batches_per_read=None)

    files
        One or many token files: raw little-endian tokens (nanoGPT's train.bin: `dtype` says
        uint16 or uint32) or 1-D .npy arrays (their own dtype, which must match `dtype`). A
        glob, a path or a list.
    Samples
        Window i of a file is tokens [i*seq_len, i*seq_len + seq_len + 1) — seq_len + 1 tokens,
        consecutive windows sharing one token, never crossing a file boundary; a file of T
        tokens has (T - 1) // seq_len windows. A batch is x = window[:, :-1], y = window[:, 1:]
        (both (batch_size, seq_len), contiguous, `out_dtype` — int64 for nn.Embedding and
        cross_entropy — on `device`). shuffle=True visits the windows of an epoch in a random
        order (every window once per epoch); shuffle=False in file order: strided,
        non-overlapping windows for evaluation. Not given (None): True for one more release,
        with a DeprecationWarning; then False, the default of ArrayDataset, XarrayDataset and
        torch's DataLoader (docs/python-extension.md, "Defaults").
    Order, sharding, epochs and resume are those of ArrayDataset (docs/torch.md), except that the
    epoch order is computed on the fly (a Feistel permutation, O(1) memory per rank and worker),
    and drop_last defaults to True (equal batches on every rank).
    batches_per_read
        Batches read by one engine plan (planned in one C call), moved to the device by one
        copy and cast by one kernel for x and y together (None: as many as hold about 32 MiB
        of tokens, at most 64; a pass evens its reads out to one size, at most this). Each
        batch is then a slice of its read's tensors (on CUDA):
        holding one batch keeps its read's memory.
        Resume stays exact per batch; `prefetch` counts batches, rounded up to whole reads.
    progress
        None (off), True/"tqdm" or progress(done_batches, total_batches), as ArrayDataset's.
    """
    _STATE_TAG = "ferry.torch.TokenDataset"
    _STAGE_AHEAD = True

    def __init__(self, files, seq_len, batch_size, dtype="uint16", *, shuffle=None, seed=0,
                 drop_last=True, device=None, rank=None, world_size=None, prefetch=4,
                 out_dtype=torch.int64, threads=0, ctx=None, staging="auto",
                 batches_per_read=None, progress=None):
        super().__init__()
        seq_len = check("TokenDataset", "seq_len", seq_len)
        batches_per_read = check("TokenDataset", "batches_per_read", batches_per_read, none=True)
        if batch_size is None:
            raise ValueError("TokenDataset: batch_size is required")
        if shuffle is None:
            warnings.warn("TokenDataset: shuffle is not given; it defaults to True for one more release, "
                          "then to False as in ArrayDataset, XarrayDataset and torch's DataLoader: pass "
                          "shuffle=True to keep random windows", DeprecationWarning, stacklevel=2)
            shuffle = True
        self._init_stream(batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                          device=device, rank=rank, world_size=world_size, prefetch=prefetch,
                          transform=None, pin_memory=False, threads=threads, ctx=ctx,
                          sample_group=1, progress=progress)
        self._single = True
        self.seq_len = int(seq_len)
        self.out_dtype = out_dtype
        meta_ctx = ctx if ctx is not None else _ferry.Context(threads=1)
        try:
            self._fields = [_load_token_field(meta_ctx, files, self.seq_len, dtype)]
        finally:
            if ctx is None:
                meta_ctx.close()
        self.num_samples = self._fields[0].rows
        if self.num_samples == 0:
            raise ValueError(f"TokenDataset: no window of {self.seq_len + 1} tokens in {files!r}")
        self.staging = staging
        self._staging_per_field(staging)   # "auto" or "engine": one path either way
        if batches_per_read is None:
            # the loader's per-read work (ids, plan, submit, hand-off) was 364 us on the GPU
            # machine at one read per 2 MiB batch; 16 such batches per read make it ~25 us per batch
            per_batch = self.batch_size * self._fields[0].row_bytes
            batches_per_read = max(1, min(64, (32 << 20) // max(1, per_batch)))
        self.batch_group = int(batches_per_read)

    def _make_order(self, epoch):
        return FeistelOrder(self.num_samples, self.seed, epoch, self.shuffle)

    _ORDER_IN_PLAN = _plan_windows is not None

    def _submit(self, rt, order, lay, units, ids=None):
        """A group's plan in one C call (plan_windows: no id, offset or destination array per
        window in Python); the ids path (_BatchStream._submit) for seeds beyond int64."""
        if ids is not None or not self._ORDER_IN_PLAN or not (_I64_MIN <= order.seed <= _I64_MAX and
                                                             _I64_MIN <= order.epoch <= _I64_MAX):
            if ids is None:
                ranges = [lay.unit(s) for s in units]
                ids = np.concatenate([order[lo:hi] for lo, hi in ranges])
            return super()._submit(rt, order, lay, units, ids)
        ranges = [lay.unit(s) for s in units]
        g = _Group()
        g.units, g.sizes, g.handles, g.job, g.path = units, [hi - lo for lo, hi in ranges], [], None, None
        g.extra = []
        f = self._fields[0]
        buf = self._alloc(rt, (sum(g.sizes),) + f.shape, f.dtype)    # on this thread: torch's streams
        g.bufs = [buf]

        def plan_and_submit():
            # plan_windows and submit release the GIL for their C work (on the GPU machine the
            # loader thread was busy 90 us of every 91 us per batch, planning and submitting
            # 4,096 windows per group among it). No reference to the dataset here: its last
            # reference must not be dropped on this thread (its __del__ shuts this thread down)
            plan = _ferry.Plan()
            f.read_group(None, rt, plan, order, ranges, g, buf)
            return rt.ctx.submit(plan, reread=True) if len(plan) else None   # epochs: FERRY_REREAD
        g.job = _PlannedJob(rt.planner().submit(plan_and_submit))
        return g

    def _record_outputs(self, outs, stream):
        # every batch of a group is a view of the group's x and y (_finish): recording one view
        # of each records their blocks (the allocator tracks storage, not views), not 2 calls
        # a batch
        for t in outs[0] if outs else ():
            if t.is_cuda:
                t.record_stream(stream)

    @property
    def num_tokens(self):
        return int(self._fields[0].tokens.sum())

    def _finish(self, g):
        """(x, y) per batch of the read group g. On CUDA x and y of the whole group are cast
        at once (one kernel per read, x and y together: _shift) and batch i is rows [lo, lo + B) of
        them: contiguous views. On the host each batch is cast on its own (the cast is
        memory-bound either way, and a group's int64 copy would be 8x its tokens at once): a
        generator, which _iterate consumes batch by batch."""
        w = g.bufs[0]
        outs, lo = [], 0
        if w.is_cuda:
            # the casts read w on this stream (the consumer's, or ferry's work stream) after
            # the group is dropped: recorded, its block is not handed to the next group's read
            # (the engine's writes are ordered after no torch stream) until they have run.
            # Unrecorded, a consumer queued behind a training step cast the group read after it
            w.record_stream(torch.cuda.current_stream(w.device))
            x, y = self._shift(w)
            for size in g.sizes:
                outs.append((x[lo:lo + size], y[lo:lo + size]))
                lo += size
            return outs
        return self._host_batches(w, g.sizes, self._rt)

    def _host_batches(self, w, sizes, rt):
        # lazily, one batch as it is asked for: casting a whole read at once held 16 int64
        # batches (268 MB) and page-faulted them all afresh (4.3 ms a batch, not 1.6)
        lo = 0
        for k, size in enumerate(sizes):
            out = self._shift(w[lo:lo + size])
            lo += size
            if k == len(sizes) - 1:   # every batch of it is cast (the consumer asks for no more)
                free = _host_reads(rt)
                if len(free) < self._HOST_READS_KEPT:
                    free.append(w)
                w = None
            yield out

    _HOST_READS_KEPT = 4

    def _alloc(self, rt, shape, dtype):
        """A read group's buffer. On the host only the casts read it (every batch handed out is
        a copy: _shift), so it is neither shared (in a DataLoader worker) nor pinned, and it is
        used again once its batches are cast: a fresh 32 MiB buffer per group page-faulted
        all of it under the engine's preads (on two cores, 16 batches of 256 x 8 KiB a read, uint16
        out: 913 -> 2,265 batches/s, process CPU 1,814 -> 667 us a batch; BENCHMARKS.md history)."""
        if rt.device.type == "cuda":
            return super()._alloc(rt, shape, dtype)
        free = _host_reads(rt)
        for i, t in enumerate(free):
            if t.shape == shape and t.dtype == dtype:
                return free.pop(i)
        return torch.empty(shape, dtype=dtype)

    def _shift(self, w):
        """(x, y) of windows w (rows of seq_len + 1 tokens), cast to out_dtype in ONE pass: a
        (2, rows, seq_len) view of w whose [0] is w[:, :-1] and [1] is w[:, 1:] (the same
        memory, y one token on), copied into one contiguous buffer, so x and y are its two
        contiguous halves. One kernel per read group on CUDA, not one per output."""
        dt = self.out_dtype or w.dtype
        rows, width = w.shape
        if not w.is_cuda and dt in _NUMPY_CASTS:
            # torch's CPU casts and copies of uint16/uint32 are slow (256 x 4096
            # tokens: 61 ms to int64, 5 ms a uint16 copy; numpy's astype 7 ms / 0.6 ms)
            n = w.numpy()
            pair = np.lib.stride_tricks.as_strided(n, (2, rows, width - 1),
                                                   (n.strides[1], n.strides[0], n.strides[1]), writeable=False)
            out = torch.from_numpy(pair.astype(_NUMPY_CASTS[dt], order="C"))
        else:
            out = torch.empty((2, rows, width - 1), dtype=dt, device=w.device)
            out.copy_(w.as_strided((2, rows, width - 1), (w.stride(1), w.stride(0), w.stride(1))))
        return out[0], out[1]


def _host_reads(rt):
    """rt's read-group buffers free for TokenDataset's next reads on the host (consumer's thread)."""
    free = rt.__dict__.get("_token_reads")
    return free if free is not None else rt.__dict__.setdefault("_token_reads", [])


_NUMPY_CASTS = {getattr(torch, k): np.dtype(k) for k in
                ("int64", "int32", "int16", "uint16", "uint32", "uint64", "float32", "float64")
                if hasattr(torch, k)}
