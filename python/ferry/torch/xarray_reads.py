"""XarrayDataset's reads: the group of batches one plan reads, the plans of the rows they need
(built on a planning thread), and the engine-sized jobs in flight (_engine_room)."""
from __future__ import annotations

import collections
import concurrent.futures
import threading

import numpy as np
import torch

from .. import _ferry
from .order import _mix64
from .files import _wait_quietly
from .groups import _Group
from .stream import _BatchStream
from .xarray_discovery import _check_stores, _wrap_handles
from .xarray_samples import _to_dev, _torch_dtype


_MAX_AUTO_GROUP = 64     # batches a read that _read_group picks at most


class _XGroup(_Group):
    """A batch's group; its buffers and open stores are what the planner thread made, so reading
    them (in whatever order the batch stream does) first waits for the planning."""
    __slots__ = ("meta", "stores")

    def _planned(self):
        j = _Group.job.__get__(self)
        if isinstance(j, _Planned):
            j._resolve(raise_errors=False)

    @property
    def bufs(self):
        self._planned()
        return _Group.bufs.__get__(self)

    @bufs.setter
    def bufs(self, v):
        _Group.bufs.__set__(self, v)

    @property
    def handles(self):
        self._planned()
        return _Group.handles.__get__(self)

    @handles.setter
    def handles(self, v):
        _Group.handles.__set__(self, v)


def _lock_of(rt):
    """The lock of rt's open-store table (the planner thread and the consumer both use it)."""
    lk = rt.__dict__.get("_xlock")
    return lk if lk is not None else rt.__dict__.setdefault("_xlock", threading.Lock())


def _planner(rt):
    """rt's planner: ONE thread (batches are submitted to the engine in order), per process."""
    with _lock_of(rt):
        ex = rt.__dict__.get("_xplanner")
        if ex is None:
            ex = rt._xplanner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ferry-xplan")
        return ex


def _unplanned(rt):
    """rt's groups submitted whose planning has not started (oldest first; the consumer's thread)."""
    q = rt.__dict__.get("_xunplanned")
    return q if q is not None else rt.__dict__.setdefault("_xunplanned", collections.deque())


def _engine_budget(ctx, plan, unit_bytes):
    """(batches a read, group jobs in the engine at once) for a stream of plans like `plan` (one
    batch of `unit_bytes` bytes, only inspected), or None where any size runs at the decoders' rate
    (nothing decoded on the GPU): ferry_plan_budget, which counts every device byte the stream
    holds — the groups in the engine, the one handed out and the next one planned, the decode's
    call slots — against the GPU's free memory less what it keeps free for the caller (a quarter,
    64 MiB at least), two jobs in the engine where they fit, else one; a FerryError saying what
    one batch a read needs and how to lower it where even that does not fit."""
    b = ctx.plan_budget(plan, int(unit_bytes))
    if not b["jobs"]:
        return None
    return max(1, min(_MAX_AUTO_GROUP, b["units"])), b["jobs"]


def _in_engine(rt):
    """rt's group jobs submitted with an engine_jobs limit, oldest first (the planner thread's)."""
    q = rt.__dict__.get("_xin_engine")
    return q if q is not None else rt.__dict__.setdefault("_xin_engine", collections.deque())


def _engine_room(rt, limit):
    """Wait (on the planner thread) until fewer than `limit` of rt's jobs are in the engine. A
    job's error is not raised here: the consumer's wait for its group raises it, in turn."""
    q = _in_engine(rt)
    while q and q[0].done():
        q.popleft()
    while len(q) >= limit:
        _wait_quietly(q.popleft())


def _kick(rt):
    """Start the planning of every group submitted so far, in order."""
    q = _unplanned(rt)
    while q:
        q.popleft()._start()


class _Planned:
    """The job of a group of batches whose rows and plan are made and submitted to the engine on
    the planner thread. Building a batch's plan (a read per variable and step) and ctx.submit take
    milliseconds of CPU a batch; on the consumer's thread that time is GPU idle whenever the
    consumer waits for its training step (loss.item()). Dev box, 20 variables x 4 steps of
    361x720, consumer-thread CPU per batch: 5.9 ms planning there, 0.8 ms with the planner
    thread. The planning starts when the consumer is about to wait for a group (its planning or
    its reads: _resolve), else once it has handed out the group before it (_kick at the end of
    _finish), never at submit: a planner started at submit ran
    Python beside the hand-off of the group before (the GIL is one), and each C call there that
    released the GIL (job.path, job.done) gave it to the planner. Dev box (2 shared cores), 20
    variables of 45x90, a 6 ms step between batches: _submit of a group of 6 took 1.5 ms of wall
    time, 0.05 ms now; next() per batch, one batch a plan: mean 1.12 -> 0.57 ms, p90 1.45 ->
    0.40 ms. The first use of the job (its path, done, wait, stream_wait) fills the group with what the
    planning made (buffers, open stores, rows) and raises its errors."""

    def __init__(self, ds, rt, g, ids, epoch):
        self.g = g
        self.job = None
        self._ready = False
        self._error = None
        self.fut = None
        self._rtx = rt
        self._args = (ds._plan_group, rt, ids, epoch, list(g.sizes))
        _unplanned(rt).append(self)

    def _start(self):
        if self.fut is None:
            fn, rt = self._args[0], self._args[1]
            self.fut = _planner(rt).submit(fn, *self._args[1:])
            self._args = None

    def _resolve(self, raise_errors=True):
        if not self._ready:
            # The consumer is about to wait (for this group's planning or its reads): every group
            # submitted so far, this one and those behind it, is planned now, during that wait.
            # Left to the end of the hand-off, the group behind was planned only once this one's
            # reads were issued, and with two groups in flight (6 batches a plan, prefetch 4) the
            # engine idled meanwhile (an earlier build on the GPU machine, likely with that rule:
            # uncompressed Zarr 23.0 GB/s with 6 batches a plan against 28.0 with one).
            if self.fut is None or not self.fut.done():
                _kick(self._rtx)
            try:
                bufs, job, handles, meta = self.fut.result()
            except BaseException as e:   # noqa: BLE001 — raised by the job's calls, not by cleanup
                self._error, bufs, job, handles, meta = e, [], None, [], None
            if job is not None and not job.done():
                _kick(self._rtx)
            g = self.g
            g.bufs, g.handles, g.stores = bufs, handles, [e[0] for e in handles]
            g.meta = meta
            self.job, self._ready = job, True
        if raise_errors and self._error is not None:
            raise self._error
        return self.job

    @property
    def path(self):
        j = self._resolve()
        return None if j is None else j.path

    def done(self):
        if self.fut is None or not self.fut.done():
            return False
        j = self._resolve()
        return j is None or j.done()

    def wait(self, timeout=None):
        j = self._resolve()
        return None if j is None else j.wait() if timeout is None else j.wait(timeout)

    def stream_wait(self, stream):
        j = self._resolve()
        if j is not None:
            j.stream_wait(stream)

    def cancel(self):
        if self.fut is None:
            _kick(self._rtx)
        if self.fut.cancel():
            self._ready, self.g.bufs, self.g.handles = True, [], []
            return
        j = self._resolve()
        if j is not None:
            j.cancel()


class _XarrayReads:
    """XarrayDataset's reads: group sizes, plans of the rows a group needs (planned on a
    thread), and the engine jobs in flight."""

    @staticmethod
    def _group_size(batches_per_read):
        return 1 if batches_per_read is None else batches_per_read    # checked by XarrayDataset

    def _dev(self, rt, key, make):
        """A small tensor on rt's device made once per process (index lists, normalisation)."""
        cache = getattr(rt, "_xcache", None)
        if cache is None:
            cache = rt._xcache = {}
        t = cache.get(key)
        if t is None:
            t = cache[key] = _to_dev(make(), rt.device)
        return t

    # ---------------------------------------------------------------- reading
    def _store(self, rt, seg, handles, seen):
        key = ("xstore", seg.path, seg.group)
        e = seen.get(key)
        if e is None:
            from ..xarray.store import FerryStore
            def opener():
                from ..xarray.common import _describe_ident
                st = FerryStore(seg.path, group=seg.group, device="cpu", ctx=rt.ctx, mask_and_scale=False,
                                decode_times=False)
                want = self._idents.get((seg.path, seg.group))
                if want is not None and st._ident is not None and st._ident != want:
                    st.close()
                    raise _ferry.FerryError(_ferry.EIO, f"{seg.path}: the file changed since the XarrayDataset "
                                            f"was made (found {_describe_ident(st._ident)}, expected "
                                            f"{_describe_ident(want)}): make the dataset again")
                return st
            with _lock_of(rt):
                e = rt.handle(key, opener)
                e[1] += 1
            seen[key] = e
            handles.append(e)
        return e[0]

    def _specs(self, st, seen):
        """The store's specs of every variable read, checked once per store: read by ferry's engine."""
        key = ("specs", id(st))
        sp = seen.get(key)
        if sp is None:
            sp = {}
            for slab in self._slabs:
                for n, _, _, _ in slab.items:
                    s = st.specs[n]
                    if s.kind not in ("ferry", "h5"):
                        raise _ferry.FerryError(_ferry.EUNSUPPORTED, s.error or f"{st.filename}: variable {n}: "
                                                f"read by {s.kind}, not by ferry's engine")
                    sp[n] = s
            seen[key] = sp
        return sp

    def _plan_whole_rows(self, rt, plan, row_steps, seg_of, places, dev, handles, seen):
        """_plan_rows without patches: ONE Plan.read_rows a run of rows in one file, in C. Each
        row's variables go to their channels of the row, and the extents enter the plan as the
        row-by-row loop adds them. That loop made a Python call a row and variable, 2,400 for a
        group of 120 samples of 20 variables: a median of 13 ms of the planner's CPU a group for
        netCDF-4, 27 ms for Zarr zstd, on the GPU machine, the engine idle meanwhile whenever both
        groups in flight were read before the consumer asked for the next. On two CPU cores, 36x72
        grids: netCDF-4 7.0-7.4 -> 0.7-1.7 ms a group;
        Zarr zstd 20.2-23.8 -> 16.7-17.9 (its chunk files' lstats, in C, remain)."""
        R = len(row_steps)
        _, bases, row_bytes, names, offs, _, tails = zip(*places)
        dsts = [(base, R * row, dev) for base, row in zip(bases, row_bytes)]
        sels = [[(0, 1, 1)] + tail for tail in tails]
        # offset of row r's variable k in its slab: r * (the slab's row bytes) + k's place in the row
        at = np.arange(R, dtype=np.int64)[:, None] * np.array(row_bytes, np.int64) + np.array(offs, np.int64)
        cuts = (np.flatnonzero(np.diff(seg_of)) + 1).tolist()      # where the rows' file changes
        for r, e in zip([0] + cuts, cuts + [R]):
            seg = self._segs[int(seg_of[r])]
            st = self._store(rt, seg, handles, seen)
            specs = self._specs(st, seen)
            steps = np.ascontiguousarray(row_steps[r:e] - seg.g0 + seg.lo, dtype=np.int64)
            plan.read_rows([st._row_source(specs[n]) for n in names], sels, steps, dsts, at[r:e].reshape(-1))

    def _read_rows(self, rt, row_steps, boxes, engine_jobs=None):
        """ONE plan reading rows (a global step each, and a patch corner each when `boxes`) of every
        variable into the slabs: [(R, channels of the slab, h, w)], the job, the handles.
        engine_jobs: submitted once fewer than that many of rt's jobs made so are in the engine
        (_engine_room; on the planner thread)."""
        row_steps = np.asarray(row_steps, dtype=np.int64)
        R = len(row_steps)
        bufs = []
        for slab in self._slabs:
            hw = self.patch if boxes is not None else slab.spatial
            bufs.append(self._alloc(rt, (R, slab.C) + tuple(hw), _torch_dtype(slab.dtype)))
        plan, handles = _ferry.Plan(), []
        self._plan_rows(rt, plan, row_steps, boxes, [b.data_ptr() for b in bufs], handles)
        try:
            if engine_jobs and len(plan):
                _engine_room(rt, engine_jobs)
            job = rt.ctx.submit(plan, reread=True) if len(plan) else None   # epochs: FERRY_REREAD
        except BaseException:
            self._release(rt, _wrap_handles(handles))       # the stores taken so far
            raise
        if engine_jobs and job is not None:
            _in_engine(rt).append(job)
        return bufs, job, handles

    def _plan_rows(self, rt, plan, row_steps, boxes, bases, handles):
        """Add to `plan` the reads of rows (as _read_rows) into slabs at the addresses `bases`; the
        stores it opens are appended to `handles` (released here on an error)."""
        R = len(row_steps)
        seen = {}
        seg_of = np.searchsorted(self._seg_g0, row_steps, side="right") - 1
        dev = -1 if rt.device.type != "cuda" else rt.device.index
        places = []
        for slab, base in zip(self._slabs, bases):
            hw = self.patch if boxes is not None else slab.spatial
            plane = int(np.prod(hw, dtype=np.int64)) * slab.dtype.itemsize
            # per variable: (slab, its address, bytes of a row, name, offset in a row, bytes,
            # the selection of the dims after the sample dim as triples)
            for n, off, rc, _ in slab.items:
                if rc * plane:
                    sel = self._vars[n].sel
                    places.append((slab, base, slab.C * plane, n, off * plane, rc * plane,
                                   [(s.start, s.stop, s.step) for s in sel]))
        try:
            if boxes is None and places:
                self._plan_whole_rows(rt, plan, row_steps, seg_of, places, dev, handles, seen)
                _check_stores(handles)
                return
            # one row (a step of one file) at a time: each variable's channels of a row are one
            # contiguous block of the slab, whatever else shares it
            for r in (range(R) if places else ()):
                seg = self._segs[int(seg_of[r])]
                t = int(row_steps[r]) - seg.g0 + seg.lo
                st = self._store(rt, seg, handles, seen)
                specs = self._specs(st, seen)
                head = (t, t + 1, 1)
                if boxes is not None:
                    y0, x0 = int(boxes[r][0]), int(boxes[r][1])
                for slab, ptr, row, n, off, nb, tri in places:
                    if boxes is not None:
                        (ys, _, yst), (xs, _, xst) = tri[-2], tri[-1]
                        tri = tri[:-2] + [(ys + y0 * yst, ys + (y0 + self.patch[0]) * yst, yst),
                                          (xs + x0 * xst, xs + (x0 + self.patch[1]) * xst, xst)]
                    st._plan_triples(plan, specs[n], [head] + tri, (ptr + r * row + off, nb, dev))
            _check_stores(handles)
        except BaseException:
            self._release(rt, _wrap_handles(handles))       # the stores taken so far
            raise

    def _read_group(self, rt):
        """Batches read by one plan. batches_per_read=None on a GPU: as many as make a job of the
        decoded bytes the engine's budget gives (_engine_budget, from a plan of one row that is
        never run): 1 for uncompressed and blosc data; netCDF-4 deflate and Zarr zstd, 2.5 GiB
        (GPU machine, 20 variables of 361 x 720 float32, batch 8: 17 batches a read; deflate
        23.3 GB/s against 8.1-8.6 with one, zstd 44.4 with 16 against 23.5-26.4; BENCHMARKS.md)."""
        if not self._group_auto or rt.device.type != "cuda" or not self._slabs:
            return self.batch_group
        key = str(rt.device)
        if key not in self._auto_groups:
            plan, handles = _ferry.Plan(), []
            fake = 1 << 44     # addresses only: the plan is inspected, never submitted
            bases = [fake + (k << 36) for k in range(len(self._slabs))]
            self._plan_rows(rt, plan, np.zeros(1, dtype=np.int64), None, bases, handles)
            self._release(rt, _wrap_handles(handles))
            rows = self.batch_size * (self.input_steps + self.target_steps)
            per_batch = rows * sum(s.C * int(np.prod(s.spatial, dtype=np.int64)) * s.dtype.itemsize
                                   for s in self._slabs)
            self._auto_groups[key] = _engine_budget(rt.ctx, plan, per_batch)
        got = self._auto_groups[key]
        self.batch_group = got[0] if got else 1
        return self.batch_group

    def _read_depth(self, rt, depth):
        """Engine-sized groups (_read_group: the engine asked for a job size, whatever number of
        batches that made): three in flight, the one handed out and two in the engine. Each is
        planned at once but submitted only when fewer than two of them are in the engine
        (_engine_room): ferry_plan_budget sizes a job for two in the engine, or one where two do
        not fit beside what the GPU has free (then two in flight).
        - A third job in the engine made them slower (GPU machine, netCDF-4, 16 batches a read,
          same run: two groups 18.9 GB/s, three 14.0: cooperative jobs at once share the engine's
          workers; Zarr zstd, 8 and 16 a read: 41.3-43.6 and 44.4 with two, 40.2-41.4 and 42.8
          with three; in another run, three: netCDF-4 0.75 x over four epochs).
        - Two in flight (the one handed out and one read) left the engine one job whenever the
          consumer took its time over a group: a deflate job alone took ~150 ms where two at once
          gave one every ~88 (its GPU latency), and at a pass's end the next epoch's first group
          was submitted only when the last one was handed out. DALI's pipeline began every other
          netCDF-4 epoch ~200 ms late, and so did a loop that copies and waits for each batch,
          without DALI (GPU machine: 0.86-0.90 x the dataset alone over four epochs; three in
          flight: 0.95-1.00 x; BENCHMARKS.md, X3, and its history)."""
        got = self._auto_groups.get(str(rt.device)) if self._group_auto else None
        if got:
            return 1 if depth <= 1 else got[1] + 1
        return depth

    def _engine_jobs(self, rt):
        """How many of this runtime's group jobs may be in the engine at once (None: any)."""
        got = self._auto_groups.get(str(rt.device)) if self._group_auto else None
        return got[1] if got else None

    def _sample_boxes(self, ids, epoch):
        """Sample ids -> (start steps, patch corners or None)."""
        ntiles = self.tiles[0] * self.tiles[1]
        t = ids // ntiles
        if self.patch is None:
            return t, None
        H, W = self.spatial
        ph, pw = self.patch
        if self.patch_mode == "tile":
            tile = ids % ntiles
            return t, np.stack([(tile // self.tiles[1]) * ph, (tile % self.tiles[1]) * pw], axis=1)
        with np.errstate(over="ignore"):
            key = np.uint64((self.seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03 + 0x5851F42D4C957F2D) & _M64)
            h = _mix64(ids.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9) + key)
        oy = (h % np.uint64(H - ph + 1)).astype(np.int64)
        ox = ((h >> np.uint64(32)) % np.uint64(W - pw + 1)).astype(np.int64)
        return t, np.stack([oy, ox], axis=1)

    def _submit(self, rt, order, lay, units, ids=None):
        """One plan for the batches `units` (batches_per_read of them): their rows side by side
        in one stack, batch after batch, so each batch is a block of it. The rows and the plan
        are made on the planner thread (_group_rows, _read_rows): this thread, the consumer's,
        only takes the sample ids."""
        ranges = [lay.unit(s) for s in units]
        if ids is None:
            ids = np.concatenate([order[lo:hi] for lo, hi in ranges]) if len(ranges) > 1 else \
                order[ranges[0][0]:ranges[0][1]]
        g = _XGroup()
        g.units, g.sizes, g.handles, g.job, g.path = units, [hi - lo for lo, hi in ranges], [], None, None
        g.meta = None
        g.stores, g.bufs = [], []
        g.job = _Planned(self, rt, g, np.asarray(ids, dtype=np.int64), self._epoch_of_order(order))
        return g

    def _group_rows(self, ids, epoch, sizes):
        """Sample ids of a group's batches (of `sizes`) -> (start steps, the global step of each
        row of the stack, each sample's rows (samples, I+K), patch corners of the rows or None)."""
        t0, boxes = self._sample_boxes(ids, epoch)
        I, K, L = self.input_steps, self.target_steps, self.lead
        offs = np.asarray(list(range(I)) + [I - 1 + L + k for k in range(K)], dtype=np.int64)
        need = t0[:, None] + offs[None, :]        # (samples, I+K) global steps
        if boxes is not None:
            # every sample's window in its own rows (windows of one step rarely coincide)
            rows, inv = need.ravel(), np.arange(need.size, dtype=np.int64).reshape(need.shape)
            return t0, rows, inv, np.repeat(boxes, I + K, axis=0)
        # a step several samples of a batch need is read once; rows in order of first use, so a
        # batch of distinct single steps is its own block of the stack in batch order. Steps are
        # not shared between the batches of a group: each batch is its own block, and no batch
        # handed out aliases another's memory (a loop may modify a batch in place)
        rows, inv, lo, nrows = [], [], 0, 0
        for size in sizes:
            part = need[lo:lo + size]
            u, first, pinv = np.unique(part.ravel(), return_index=True, return_inverse=True)
            by_use = np.argsort(first, kind="stable")
            rank = np.empty_like(by_use)
            rank[by_use] = np.arange(len(by_use))
            inv.append(rank[pinv.ravel()].reshape(part.shape) + nrows)    # rows of this batch's block
            rows.append(u[by_use])
            lo, nrows = lo + size, nrows + len(u)
        return t0, np.concatenate(rows), np.concatenate(inv), None

    def _plan_group(self, rt, ids, epoch, sizes):
        """The planner thread's work for a group: its rows, then ONE plan reading them."""
        t0, rows, inv, row_boxes = self._group_rows(ids, epoch, sizes)
        bufs, job, handles = self._read_rows(rt, rows, row_boxes, self._engine_jobs(rt))
        return bufs, job, handles, (bufs, inv, t0, rows, row_boxes is not None)

    def _start_planning(self, rt):
        # at a pass's end: the next pass's groups (_BatchStream._read_ahead) are planned now, not
        # at that pass's first wait; and none is left unplanned on the dataset, where its _Planned
        # (holding the dataset) would make a cycle that the cyclic GC may end on the planner
        # thread, whose __del__ would then wait for planning queued behind itself
        _kick(rt)

    def _release(self, rt, g):
        with _lock_of(rt):          # the planner thread takes handles while this one gives them back
            _BatchStream._release(self, rt, g)

    def _finish(self, g):
        bufs, inv, t0, rows, patched = g.meta
        _check_stores([(st,) for st in g.stores])
        rt = self._rt
        I, K = self.input_steps, self.target_steps
        dec = self._stack(rt, bufs, rows, patched)

        views = []      # row ranges of the stack handed out as views (every output owns its memory)

        def take(binv, cols, pick, which):
            want = binv[:, cols].reshape(-1)
            a, b = (int(want[0]), int(want[0]) + len(want)) if len(want) else (0, 0)
            if b > a and np.array_equal(want, np.arange(a, b)) and all(b <= lo or a >= hi for lo, hi in views):
                t = dec[a:b]                                     # a block of the stack: a view
                views.append((a, b))
            else:       # rows another output also holds (y of t = x of t + 1): a copy of them
                t = dec.index_select(0, _to_dev(torch.from_numpy(np.ascontiguousarray(want)), dec.device))
            if isinstance(pick, slice):
                t = t[:, pick]
            elif pick is not None:
                t = t.index_select(1, self._dev(rt, ("chan", which), lambda: torch.from_numpy(pick)))
            return t.reshape((len(binv), -1) + tuple(t.shape[-2:]))

        outs, lo = [], 0
        for size in g.sizes:
            binv, bt0 = inv[lo:lo + size], t0[lo:lo + size]
            lo += size
            out = {}
            x = take(binv, slice(0, I), self._xch, "x")
            if self.return_mask:
                out["mask"] = ~torch.isnan(x)
            if self.nan_to is not None:
                x = torch.nan_to_num_(x, nan=float(self.nan_to))
            out["x"] = x
            if K:
                y = take(binv, slice(I, I + K), self._ych, "y")
                if self.nan_to is not None:
                    y = torch.nan_to_num_(y, nan=float(self.nan_to))
                out["y"] = y
            if self.return_time:
                out["time"] = _to_dev(torch.from_numpy(np.ascontiguousarray(self._times[bt0])), x.device)
            if self.transform is not None:
                out = self.transform(out)
            outs.append(out)
        _kick(rt)           # the groups submitted behind this one: planned while it is consumed
        return outs

    def _alloc(self, rt, shape, dtype, pinned=False):
        if rt.device.type == "cuda":
            with torch.cuda.stream(rt.alloc_stream):
                return torch.empty(shape, dtype=dtype, device=rt.device)
        from torch.utils.data import get_worker_info
        if get_worker_info() is not None:
            return torch.empty(shape, dtype=dtype).share_memory_()
        return torch.empty(shape, dtype=dtype)


_M64 = (1 << 64) - 1
