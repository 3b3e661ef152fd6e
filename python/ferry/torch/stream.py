"""The batch pipeline ferry.torch's datasets share (_BatchStream): configuration, device and
runtime, and one pass's iteration; the package docstring says what it promises."""
from __future__ import annotations

import collections
import os
import threading

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .. import _current_cuda_device, _ferry, _torch_device
from .._checks import check
from .._nogpu import no_gpu
from .._progress import check as _check_progress, epoch_reporter as _epoch_reporter
from .loader import EpochBoard, auto_collation, pass_tag
from .order import Layout as _Layout
from .ahead import _EpochAhead, _epoch_ahead
from .groups import _GroupIO, _even_group, _groups_in_flight
from .runtime import _AT_FORK, _FORKED, _IMPORT_PID, _Runtime, _collect_before_fork
from .state import _STATE_TAG, _StreamState




# --------------------------------------------------------------------------------------------
# The dataset contract (order, sharding, epochs, resume, prefetch, hand-off), shared by
# ArrayDataset and TokenDataset (and meant for XarrayDataset): a subclass describes its samples
# with `_fields` (objects with name, shape, dtype, row_bytes and read()) and `num_samples`.
# --------------------------------------------------------------------------------------------
class _BatchStream(_StreamState, _EpochAhead, _GroupIO, IterableDataset):
    """The contract ArrayDataset, TokenDataset and XarrayDataset share (the module's docstring
    says what it promises); _iterate runs one pass, keeping up to `depth` read groups in flight
    (_groups_in_flight), the one being handed out included.

    Epoch boundaries
        Once a pass (in the main process) has submitted its last group, it submits the first
        groups of the next pass — the one the next iter() runs if nothing changes in between:
        epoch + 1 from its start — while its last batches are consumed, as many as keep `depth`
        groups in flight (GPU memory holds no more groups than within an epoch). Without them an
        epoch's first next() waited for a whole read group (GPU machine, XarrayDataset, netCDF-4,
        17 batches a read: 216 ms); DALI's readers also read across the boundary. The groups are
        kept on the dataset, and the next pass starts with them only if everything that decides
        their contents is what it would plan: the runtime (device), epoch, start 0 and no resumed
        worker position, rank, world size, batch size, drop_last, the number of samples, seed,
        shuffle, block_size, the group size and the units themselves, and for samples="files" every
        file unchanged (_ahead_stamp). Otherwise (set_epoch to another epoch, load_state_dict of
        another position, a pass broken off mid-epoch, another device) they are waited for and
        dropped, and the pass plans as without them. A read error in a kept group is raised at that
        group's turn in the next pass, as without it; a group dropped raises nothing. After the
        last epoch the kept groups hold their memory until the next iter() or the dataset's end.
        Passes in DataLoader workers, and prefetch=0, read nothing ahead. FERRY_EPOCH_AHEAD=off
        (read at each iter(); "on" or unset: the default) turns it off: a pass then neither uses
        nor submits the next pass's groups.
    """
    _STATE_TAG = _STATE_TAG
    # issue the next group's casts and transform while this one is handed out
    # (_stage_ahead); a subclass whose _finish may raise about its files opts in once its
    # errors may surface a group early
    _STAGE_AHEAD = False
    # a subclass whose _submit maps its units' positions through the order itself (in C:
    # TokenDataset's plan_windows) is handed no precomputed ids
    _ORDER_IN_PLAN = False

    def _init_stream(self, *, batch_size, shuffle, seed, drop_last, device, rank, world_size,
                     prefetch, transform, pin_memory, threads, ctx, sample_group, progress=None):
        name = type(self).__name__
        self.progress = _check_progress(name, progress)   # a bar (or log lines) over each epoch's batches
        batch_size = check(name, "batch_size", batch_size, none=True)
        prefetch, seed, threads = (check(name, k, v) for k, v in
                                   (("prefetch", prefetch), ("seed", seed), ("threads", threads)))
        sample_group = check(name, "sample_group", sample_group)
        world_size = check(name, "world_size", world_size, none=True)
        rank = check(name, "rank", rank, none=True, hi=None if world_size is None else world_size - 1)
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.device = None if device is None else _torch_device(device)   # ferry's one device parser (__init__.py)
        self.rank, self.world_size = rank, world_size
        self.prefetch = int(prefetch)
        self.transform = transform
        self.pin_memory = bool(pin_memory)
        self.threads = int(threads)
        self.sample_group = max(1, int(sample_group))
        # batches read by one plan (and handed to the device by one copy): a subclass whose
        # batches are small sets it (TokenDataset), so per-batch Python work falls on many
        # batches; each batch handed out is then a slice of its group's tensors
        self.batch_group = 1
        self._ctx_arg, self._ctx_pid = ctx, os.getpid()
        self._rt = None
        self._rt_lock = threading.Lock()
        self.block_size = getattr(self, "block_size", None)
        self._convert = {}
        # progress (global; see state_dict)
        self._epoch = 0
        self._consumed = 0
        self._resume = None        # per-worker state to restore exactly (StatefulDataLoader)
        self._worker_progress = None
        self._generation = 0
        self._pass_over = False    # this rank's share is used up, the epoch not: see end_of_pass
        self._passes = 0           # passes started by this copy (a worker's tag; see loader.py)
        self._order_cache = None
        self._ahead = None         # the next pass's first groups (_Ahead), read by this pass's end
        self._board = EpochBoard()  # epochs counted across DataLoader worker passes
        self.last_path = None      # engine path that served the latest batch

    # ---------------------------------------------------------------- configuration helpers
    @property
    def fields(self):
        """{name: (sample shape, torch dtype)} of what a batch holds (before casting)."""
        return {f.name: (f.shape, f.dtype) for f in self._fields}

    def _conversions(self, dtype, normalize):
        names = [f.name for f in self._fields]
        cls = type(self).__name__
        def per_field(v, what):
            if v is None:
                return {}
            if isinstance(v, dict):
                bad = set(v) - set(names)
                if bad:
                    raise KeyError(f"{cls}: {what} names unknown fields {sorted(bad)}")
                return dict(v)
            if not self._single and len(names) > 1:
                raise ValueError(f"{cls}: with several fields, give {what} as a dict")
            return {names[0]: v}
        dts, norms = per_field(dtype, "dtype"), per_field(normalize, "normalize")
        conv = {}
        for f in self._fields:
            dt, nm = dts.get(f.name), norms.get(f.name)
            if dt is None and nm is None:
                continue
            if nm is not None:
                mean, std = nm
                mean = np.asarray(mean, dtype=np.float64).reshape(-1)
                std = np.asarray(std, dtype=np.float64).reshape(-1)
                if np.any(std == 0):
                    raise ValueError(f"{cls}: normalize std has a zero")
                c = max(mean.size, std.size)
                if c > 1 and (not f.shape or f.shape[0] != c):
                    raise ValueError(f"{cls}: normalize for {f.name!r} has {c} channels, "
                                     f"samples are {f.shape}")
                if dt is None:
                    dt = f.dtype if f.dtype.is_floating_point else torch.float32
                nm = (mean, 1.0 / std)
            conv[f.name] = (dt, nm)
        return conv

    def _staging_per_field(self, staging):
        """Check `staging` (one value or {field: value}); every field takes the engine's path."""
        names = [f.name for f in self._fields]
        cls = type(self).__name__
        spec = staging if isinstance(staging, dict) else {k: staging for k in names}
        bad = set(spec) - set(names)
        if bad:
            raise KeyError(f"{cls}: staging names unknown fields {sorted(bad)}")
        for f in self._fields:
            v = spec.get(f.name, "auto")
            if v == "pinned":
                # refused, not taken as a synonym: it chose another mechanism (host-path reads
                # into torch's pinned tensors, one torch copy per field), which no longer exists
                raise ValueError(
                    f"{cls}: staging='pinned' was removed: every field reaches the GPU through "
                    f"the engine's own pinned staging (staging='engine', also what 'auto' means); "
                    f"see docs/torch.md")
            if v not in ("auto", "engine"):
                raise ValueError(f"{cls}: staging must be 'auto' or 'engine', not {v!r}")

    def _dist(self):
        rank, world = self.rank, self.world_size
        if rank is None or world is None:
            d = torch.distributed
            if d.is_available() and d.is_initialized():
                rank = d.get_rank() if rank is None else rank
                world = d.get_world_size() if world is None else world
            else:
                rank = 0 if rank is None else rank
                world = 1 if world is None else world
        if not 0 <= rank < world:
            raise ValueError(f"{type(self).__name__}: rank {rank} outside world_size {world}")
        return int(rank), int(world)

    def _resolve_device(self, in_worker):
        dev = self.device
        if dev is None:
            dev = torch.device("cuda") if (not in_worker and torch.cuda.is_available()) else torch.device("cpu")
        if dev.type == "cuda":
            if in_worker:
                raise RuntimeError(
                    "ferry.torch.%s: device=%r inside a DataLoader worker process. CUDA "
                    "cannot be used in forked workers ('Cannot re-initialize CUDA in forked "
                    "subprocess'), and ferry already reads in native threads: use "
                    "DataLoader(ds, batch_size=None, num_workers=0), or device='cpu' to read on the "
                    "host path in workers." % (type(self).__name__, str(dev)))
            if dev.index is None:
                dev = torch.device("cuda", _current_cuda_device())
        elif dev.type != "cpu":
            raise ValueError(f"{type(self).__name__}: device must be CUDA or CPU, not {dev}")
        return dev

    def _runtime(self, device, in_worker, num_workers):
        pid = os.getpid()
        with self._rt_lock:
            rt = self._rt
            if rt is not None and rt.pid == pid and rt.device == device:
                return rt
            if rt is not None and rt.pid == pid:
                self._drop_ahead()      # their jobs use rt's open files and its device
                rt.close()
            elif rt is not None:
                # inherited through fork: its engine threads do not exist here, so it must never
                # be destroyed in this process (that would wait for them)
                _FORKED.append(rt)
            if self._ctx_arg is not None and self._ctx_pid != pid:
                _FORKED.append(self._ctx_arg)
                self._ctx_arg = None
            if self._ctx_arg is not None:
                ctx = self._ctx_arg
            elif self.threads == 0 and not in_worker and pid == _IMPORT_PID and \
                    hasattr(_ferry, "default_context"):
                ctx = _ferry.default_context()      # one engine per process
            else:
                threads = self.threads
                if threads == 0 and in_worker:
                    threads = max(2, (os.cpu_count() or 4) // max(1, num_workers))
                ctx = _ferry.Context(threads=threads)
            err = no_gpu(f"ferry.torch.{type(self).__name__}", device, ctx) if device.type == "cuda" else None
            if err is not None:
                raise err
            self._rt = _Runtime(ctx, device)
            if device.type == "cuda" and not _AT_FORK and hasattr(os, "register_at_fork"):
                os.register_at_fork(before=_collect_before_fork)
                _AT_FORK.append(True)
            return self._rt

    def __getstate__(self):
        st = self.__dict__.copy()
        st["_rt"] = None
        st["_rt_lock"] = None
        st["_order_cache"] = None
        st["_ahead"] = None     # jobs of this process's engine, and the buffers they fill
        st["_ctx_arg"] = None   # contexts do not travel between processes
        # the epoch board travels as shared memory to spawned workers (torch's ForkingPickler
        # reduction) and as a private copy through plain pickle
        return st

    def __setstate__(self, st):
        self.__dict__.update(st)
        self._rt_lock = threading.Lock()

    def __del__(self):
        self._drop_ahead()          # no job may outlive its buffers
        rt = getattr(self, "_rt", None)
        if rt is not None and rt.pid == os.getpid():
            rt.close()

    # ---------------------------------------------------------------- iteration
    def __iter__(self):
        self._check_loader(auto_collation())
        return self._iterate()

    def _start(self, in_worker, wid, nw, world, rank, batch):
        """-> (epoch, start position, units already taken by this worker or None when done)."""
        res, self._resume = self._resume, None
        tag = pass_tag(get_worker_info(), self._passes) if in_worker else 0
        self._passes += 1
        if res is not None:
            want = {"id": wid, "num_workers": nw, "world_size": world, "rank": rank, "batch": batch}
            got = {k: res.get(k) for k in want}
            if got != want:
                raise ValueError(
                    "%s: this state was saved by DataLoader worker %r and resumes exactly "
                    "only with the same layout %r (here %r). To resume with other ranks or workers, "
                    "load ferry.torch.global_state(loader.state_dict()) into the dataset with "
                    "ds.load_state_dict() before building the DataLoader."
                    % (type(self).__name__, res.get("id"), got, want))
            epoch = int(res["epoch"])
            self._epoch = epoch
            if in_worker:
                self._board.resumed(wid, nw, tag, epoch)
            return epoch, int(res["start"]), (None if res.get("ended") else int(res["taken"]))
        if in_worker:
            # the worker copy cannot see the main process: the board says which epoch this pass is
            epoch, start = self._board.join(wid, nw, tag)
            self._epoch = epoch
            return epoch, start, 0
        self._sync_from_workers()
        if self._pass_over:             # this rank's last pass delivered all it had: next epoch
            self._epoch, self._consumed, self._pass_over = self._epoch + 1, 0, False
        start = min(self._consumed, self.num_samples)   # a state saved after the last batch: n
        return self._epoch, start, 0

    def _iterate(self):
        ahead_on = _epoch_ahead()       # checked in workers too, where nothing is read ahead
        winfo = get_worker_info()
        in_worker = winfo is not None
        wid, nw = (winfo.id, winfo.num_workers) if in_worker else (0, 1)
        rank, world = self._dist()
        device = self._resolve_device(in_worker)
        rt = self._runtime(device, in_worker, nw)
        batch = self.batch_size or 1
        n = self.num_samples

        self._generation += 1
        gen = self._generation
        epoch, start, skip = self._start(in_worker, wid, nw, world, rank, batch)
        lay = _Layout(n, start, world, rank, batch, self.drop_last)
        mine = range(0) if skip is None else range(wid + skip * nw, lay.count, nw)
        last = mine[-1] if len(mine) else None
        taken = 0 if skip is None else skip
        report = _epoch_reporter(self.progress, type(self).__name__, epoch, len(mine), in_worker)
        if in_worker:
            self._worker_progress = {"id": wid, "num_workers": nw, "world_size": world, "rank": rank,
                                     "batch": batch, "start": start, "taken": taken, "epoch": epoch,
                                     "count": lay.count, "ended": False}
        order = self._order(epoch)
        per_sample = self.batch_size is None
        read_units = self.sample_group if per_sample else self._read_group(rt)
        group_units = _even_group(len(mine), read_units)
        group_bytes = group_units * batch * sum(int(getattr(f, "row_bytes", 0) or 0) for f in self._fields)
        depth = self._read_depth(rt, _groups_in_flight(self.prefetch, 1 if per_sample else group_units,
                                                       group_bytes, rt.staging_bytes))
        ids_for = self._ids_source(order, lay, mine, group_units)
        ahead_on = ahead_on and not in_worker
        # the groups the pass before submitted for this one, if it would submit the same
        pending = collections.deque(self._take_ahead(
            self._ahead_key(rt, epoch, start, skip, rank, world, group_units) if ahead_on else None,
            order, mine, group_units))
        unit_iter = iter(mine[sum(len(g.units) for g in pending):])
        read_ahead = ahead_on and self.prefetch > 0      # prefetch=0: nothing read ahead
        retiring = collections.deque()

        def submit_next():
            units = []
            for s in unit_iter:
                units.append(s)
                if len(units) == group_units:
                    break
            if not units:
                return False
            pending.append(self._submit(rt, order, lay, units,
                                        None if ids_for is None else ids_for(units)))
            return True

        def end_of_pass(position):
            # every unit of this rank's pass has been handed over: the pass is over now, whether
            # or not the consumer ever asks for the StopIteration (Lightning stops after len()
            # batches), and the next iter() is the next epoch. The state stays the global
            # position: when this rank's share of an uneven tail is empty (drop_last=False) the
            # other ranks still have one step of the epoch, so the epoch is complete only at the
            # position n (or, drop_last=True, after the last full step); until then the state is
            # `position`, where the epoch is once every rank has taken as many steps as this one.
            if in_worker:
                self._worker_progress["ended"] = True
                self._board.ended(wid)
            elif position >= n:
                self._epoch, self._consumed, self._pass_over = epoch + 1, 0, False
                self._board.publish(self._epoch, 0)
            else:
                self._epoch, self._consumed, self._pass_over = epoch, position, True
                self._board.publish(epoch + 1, 0)   # a worker pass after this one: next epoch

        def other_ranks_step():
            # the consumer asked past this rank's last unit: in lock step that is the step in
            # which the other ranks take the rest of the tail, which completes the epoch
            if not in_worker and self._pass_over and gen == self._generation:
                self._epoch, self._consumed, self._pass_over = epoch + 1, 0, False

        exhausted = False
        try:
            if last is None and gen == self._generation:
                end_of_pass(n if self.drop_last else start)
            while True:
                while not exhausted and len(pending) < depth:
                    exhausted = not submit_next()
                if exhausted and read_ahead and gen == self._generation:
                    self._read_ahead(rt, epoch + 1, rank, world, read_units, depth - len(pending))
                if not pending:
                    break
                g = pending.popleft()
                outs = self._handoff(rt, g, retiring)
                if pending and self._STAGE_AHEAD and rt.device.type == "cuda":
                    self._stage_ahead(rt, pending[0], retiring)
                self._retire(retiring, block=False)
                for s, out in zip(g.units, outs):
                    if gen == self._generation:
                        taken += 1
                        # the last batch of a drop_last epoch completes it (the tail is dropped)
                        self._consumed = n if (self.drop_last and s == lay.count - 1) \
                            else lay.consumed_after(s)
                        if in_worker:
                            self._worker_progress["taken"] = taken
                        else:
                            self._board.set_position(self._consumed)
                        if s == last:
                            end_of_pass(self._consumed)
                    report(mine.index(s) + 1)
                    yield out
            other_ranks_step()
        finally:
            self._abandon(rt, pending)
            pending.clear()
            self._retire(retiring, block=True, raise_errors=False)
            if read_ahead:
                self._start_planning(rt)    # the next pass's groups, while nothing is handed out

    def _abandon(self, rt, groups):
        """Wait for the groups' jobs and give back what they hold: buffers must outlive the
        engine's use of them. Their errors are nobody's: no batch of them is handed out."""
        for g in groups:
            try:
                if g.job is not None:
                    g.job.wait()
            except Exception:
                pass
            self._release(rt, g)

    # ---------------------------------------------------------------- introspection
    def stats(self):
        """The engine's statistics for this process (ferry.Context.stats()), or {}."""
        rt = self._rt
        return rt.ctx.stats() if rt is not None and rt.pid == os.getpid() else {}

    def __repr__(self):
        return (f"{type(self).__name__}({self.num_samples} samples, fields={self._fields}, "
                f"batch_size={self.batch_size}, shuffle={self.shuffle}, epoch={self._epoch}, "
                f"consumed={self._consumed})")


