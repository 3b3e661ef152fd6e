"""Read groups of ferry.torch's batch pipeline: how many batches a group holds and how many
groups are in flight, and the submission, retirement and hand-off of their batches (_GroupIO)."""
from __future__ import annotations


import numpy as np
import torch
from torch.utils.data import get_worker_info

from .. import _ferry
from .files import _Jobs, _wait_quietly


_FILL_STAGINGS = 2          # on CUDA, batches in flight hold at least twice the engine's staging
_MAX_GROUPS = 64            # ... but never more groups than this (tiny batches)


def _even_group(count, read_units):
    """Units per read for a pass of `count` units when a read may take `read_units`: as many
    reads as read_units gives, of one size, so the pass's last read is not a sliver. With two
    groups in flight (the one handed out and the one being read) a last read of two batches
    left the engine idle while the group before it was consumed, and the next epoch's first
    read (_read_ahead) started two batches before it was needed (GPU machine, netCDF-4, 104
    batches in reads of 17: 6 x 17 + 2; its first next() waited 70-77 ms). Evened: 7 x 15 (the
    last 14), and the first next() took 0.9-1.2 ms (BENCHMARKS.md's history)."""
    if count <= 0 or read_units <= 1:
        return max(1, read_units)
    reads = -(-count // read_units)
    return -(-count // reads)


def _groups_in_flight(prefetch, group_units, group_bytes, staging_bytes):
    """Groups read ahead of the consumer, the one being handed out included: prefetch + 1
    units, counted in groups when batches are grouped. On CUDA (staging_bytes: all of the
    engine's staging buffers) also enough groups to fill twice that: the engine keeps its 16
    workers busy only with bytes queued, not batches (GPU machine, ferry bench --records, 150 KB
    rows: 35.5 GB/s with 2 batches of 38.5 MB in flight, 47.4 with 5; a batch of 256 8 KiB
    windows is 2 MiB, one staging buffer). prefetch=0 means no read-ahead and keeps it."""
    depth = prefetch + 1 if group_units == 1 else 1 + -(-prefetch // group_units)
    if prefetch > 0 and group_bytes > 0 and staging_bytes > 0:
        depth = max(depth, min(_MAX_GROUPS, -(-_FILL_STAGINGS * staging_bytes // group_bytes)))
    return depth


class _Group:
    """A set of units read by one plan/job."""
    __slots__ = ("units", "sizes", "bufs", "job", "handles", "path", "extra", "staged")


class _PlannedJob:
    """The job of a group planned and submitted on the runtime's planner thread: the calls
    _BatchStream makes on a job, each first waiting for the planning (whose error, a file
    shorter than its windows say, is raised here: at the group's turn, after the groups
    before it)."""
    __slots__ = ("_future", "_job")

    def __init__(self, future):
        self._future, self._job = future, None

    def _get(self):
        if self._future is not None:
            f, self._future = self._future, None
            self._job = f.result()
        return self._job

    def done(self):
        if self._future is not None and not self._future.done():
            return False
        j = self._get()
        return j is None or j.done()

    def wait(self):
        j = self._get()
        return None if j is None else j.wait()

    def stream_wait(self, stream):
        j = self._get()
        if j is not None:
            j.stream_wait(stream)

    @property
    def path(self):
        j = self._get()
        return None if j is None else j.path


_norm_cache = {}


def _apply_convert(t, conv, f):
    dt, nm = conv
    if nm is None:
        return t if t.dtype == dt else t.to(dt)
    mean, inv_std = nm
    # per stream: the vectors are allocated on the stream that reads them, so dropping them
    # (the clear below) cannot hand their blocks to another stream while a lagging kernel of
    # this one still reads them (one cache is shared by every dataset's work stream)
    stream = torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None
    key = (mean.tobytes(), inv_std.tobytes(), dt, t.device, t.dim(), stream)
    c = _norm_cache.get(key)
    if c is None:
        shape = [1] * t.dim()
        if max(mean.size, inv_std.size) > 1:
            shape[1] = -1
        m = torch.tensor(mean, dtype=torch.float32).reshape(shape).to(device=t.device, dtype=dt)
        s = torch.tensor(inv_std, dtype=torch.float32).reshape(shape).to(device=t.device, dtype=dt)
        if len(_norm_cache) > 64:
            _norm_cache.clear()
        c = _norm_cache[key] = (m, s)
    return t.to(dt).sub_(c[0]).mul_(c[1])   # in place when t is already dt: t is ferry's own buffer


def _record(o, stream):
    if isinstance(o, torch.Tensor):
        if o.is_cuda:
            o.record_stream(stream)
    elif isinstance(o, dict):
        for v in o.values():
            _record(v, stream)
    elif isinstance(o, (list, tuple)):
        for v in o:
            _record(v, stream)


class _GroupIO:
    """A _BatchStream's read groups: submission, retirement, and the hand-off of their batches
    (casts, transform, CUDA streams)."""

    def _start_planning(self, rt):
        """Start planning the groups submitted whose planning waits for a hand-off (XarrayDataset
        plans on a thread, at the consumer's next wait). Here _submit plans every group itself."""

    # ---------------------------------------------------------------- reading
    def _read_group(self, rt):
        """Batches one plan reads on rt (XarrayDataset picks it from the data when not given)."""
        return self.batch_group

    def _read_depth(self, rt, depth):
        """Groups in flight on rt, the one handed out included (XarrayDataset sets its engine-sized
        groups)."""
        return depth

    def _alloc(self, rt, shape, dtype):
        if rt.device.type == "cuda":
            with torch.cuda.stream(rt.alloc_stream):
                return torch.empty(shape, dtype=dtype, device=rt.device)
        if get_worker_info() is not None:
            return torch.empty(shape, dtype=dtype).share_memory_()   # no copy when sent to the loader
        if self.pin_memory and torch.cuda.is_available():
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        return torch.empty(shape, dtype=dtype)

    def _submit(self, rt, order, lay, units, ids=None):
        ranges = [lay.unit(s) for s in units]
        if ids is None:
            ids = order[ranges[0][0]:ranges[0][1]] if len(ranges) == 1 else \
                np.concatenate([order[lo:hi] for lo, hi in ranges])
        g = _Group()
        g.units, g.sizes, g.handles, g.job, g.path = units, [hi - lo for lo, hi in ranges], [], None, None
        g.extra = []                  # jobs besides the plan's (per-sample .npy batches)
        plan = _ferry.Plan()
        try:
            g.bufs = [f.read(self, rt, plan, ids, g) for f in self._fields]
        except BaseException:
            for j in g.extra:
                _wait_quietly(j)
            raise
        jobs = ([rt.ctx.submit(plan, reread=True)] if len(plan) else []) + g.extra   # epochs: FERRY_REREAD
        g.job = None if not jobs else jobs[0] if len(jobs) == 1 else _Jobs(jobs)
        return g

    def _release(self, rt, g):
        for e in g.handles:
            e[1] -= 1
        g.handles = []

    def _retire(self, retiring, block, raise_errors=True):
        """Wait for and release handed-out groups, oldest first: all of them (block), else until
        at most prefetch + 2 remain and the oldest's job is still running (a consumer that queues
        its steps without waiting for them runs that far ahead of the engine; waiting sooner
        made the GPU idle more, BENCHMARKS.md's history)."""
        rt = self._rt
        limit = self.prefetch + 2
        while retiring:
            g = retiring[0]
            if not block and len(retiring) <= limit and not g.job.done():
                break
            retiring.popleft()
            try:
                g.job.wait()
            except Exception:
                if raise_errors:
                    if rt is not None:
                        self._release(rt, g)
                    raise
            if rt is not None:
                self._release(rt, g)

    def _handoff(self, rt, g, retiring):
        """Make group g's data usable by the consumer; returns one output per unit."""
        staged = getattr(g, "staged", None)
        if staged is not None:                  # its copies and casts were issued ahead
            g.staged = None
            ready, outs = staged
            consumer = torch.cuda.current_stream(rt.device)
            consumer.wait_event(ready)
            self.last_path = g.path
            self._record_outputs(outs, consumer)
            return outs
        job = g.job
        if job is not None:
            g.path = job.path
            self.last_path = g.path
        if rt.device.type != "cuda":
            if job is not None:
                job.wait()
                # a job that had moved no byte yet named the path it was planned with;
                # once done, the path that served it
                g.path = job.path
                self.last_path = g.path
            self._release(rt, g)
            return self._finish(g)
        consumer = torch.cuda.current_stream(rt.device)
        side = self._needs_side_stream(g)
        stream = rt.work_stream if side else consumer
        outs = self._issue(rt, g, retiring, stream, side)
        if side:
            consumer.wait_stream(stream)
        self._record_outputs(outs, consumer)
        return outs

    def _record_outputs(self, outs, stream):
        """Tell the caching allocator that `stream` (the consumer's) uses the outputs."""
        for o in outs:
            _record(o, stream)

    def _needs_side_stream(self, g):
        return bool(self._convert) or self.transform is not None

    def _stage_ahead(self, rt, g, retiring):
        """Issue the next group's casts and transform now, on ferry's stream, when its job is
        already done (no host wait): the consumer then finds them done when it gets there,
        instead of waiting for work issued just before its step. Groups that need none of
        that are left to _handoff."""
        if getattr(g, "staged", None) is not None or not self._needs_side_stream(g):
            return
        job = g.job
        if job is not None:
            if not job.done():
                return
            try:
                job.wait()          # done: at once. A failed read is raised by _handoff, after
            except Exception:       # the batches before it have been handed out
                return
            g.path = job.path
        stream = rt.work_stream
        outs = self._issue(rt, g, retiring, stream, True)
        ready = torch.cuda.Event()
        ready.record(stream)
        g.staged = (ready, outs)

    def _issue(self, rt, g, retiring, stream, side):
        """Queue g's device work on `stream` (the consumer's, or ferry's work stream): wait for
        the engine's copies, cast, split, transform."""
        job = g.job
        if job is not None:
            # A finished job's copies have passed on the device (the engine completes device
            # tasks by their events): nothing to wait for. Only an unfinished one is waited on
            # by the stream, and that wait is wider than the job: stream_wait records an event
            # on every worker's stream now, behind copies of later batches queued there since —
            # with the engine ahead, the step waited for most of the newest batch's copy.
            done = job.done()
            if not done:
                job.stream_wait(stream.cuda_stream)   # the engine's device copies, no host wait
            if done:
                job.wait()                    # surfaces a read error now rather than later
                self._release(rt, g)
            else:
                retiring.append(g)            # buffers stay referenced until the job is done
        else:
            self._release(rt, g)
        if not side:
            # a collate (samples="files", ragged) reads the per-file buffers on the consumer's
            # stream: recorded there, or a later group's read may be handed their blocks while
            # a consumer lagging behind a training step has not stacked them yet (the outputs,
            # recorded by _handoff, are new tensors, not views of them)
            for b in g.bufs:
                if isinstance(b, list):
                    _record(b, stream)
            return self._finish(g)
        with torch.cuda.stream(stream):
            for b in g.bufs:
                _record(b, stream)
            return list(self._finish(g))

    def _finish(self, g):
        """Cast/normalise the group's buffers, split into units, apply the transform."""
        values = []
        for f, b in zip(self._fields, g.bufs):
            c = self._convert.get(f.name)
            if c is not None:
                b = [_apply_convert(t, c, f) for t in b] if isinstance(b, list) else _apply_convert(b, c, f)
            values.append(b)
        outs = []
        per_sample = self.batch_size is None
        lo = 0
        for i, size in enumerate(g.sizes):
            parts = {}
            for f, v in zip(self._fields, values):
                if per_sample:
                    parts[f.name] = v[i]
                elif len(g.sizes) > 1:            # a group of batches: batch i is a slice
                    parts[f.name] = f.collate(v[lo:lo + size]) if isinstance(v, list) else v[lo:lo + size]
                elif isinstance(v, list):
                    parts[f.name] = f.collate(v)
                else:
                    parts[f.name] = v
            lo += size
            o = self._output(parts)
            if self.transform is not None:
                o = self.transform(o)
            outs.append(o)
        return outs

    def _output(self, parts):
        """One batch (or sample) from {field: value}: a tensor for a single source, else a dict."""
        return next(iter(parts.values())) if self._single else parts
