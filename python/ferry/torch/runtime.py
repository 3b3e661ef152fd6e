"""A dataset's engine state in one process (_Runtime): its context, device, CUDA streams and the
cache of open file handles, and what a fork must not inherit."""
from __future__ import annotations

import collections
import os
import threading

import torch



# --------------------------------------------------------------------------------------------
# Per-process runtime: engine context, open files, CUDA streams. Never pickled, rebuilt after
# fork (engine threads do not survive fork).
# --------------------------------------------------------------------------------------------
class _Runtime:
    def __init__(self, ctx, device):
        self.pid = os.getpid()
        self.ctx = ctx
        self.device = device
        self.handles = collections.OrderedDict()   # key -> [handle, jobs in flight using it]
        try:
            import resource
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except Exception:  # pragma: no cover
            soft = 1024
        self.max_handles = max(16, min(512, soft // 8 if soft > 0 else 128))
        self.alloc_stream = self.work_stream = None
        self.decode_stream = None   # ImageDataset's batch copies: READERS streams (made on first use)
        self._reader = None
        self._planner = None
        self.staging_bytes = 0    # all of the engine's staging buffers (CUDA: _groups_in_flight)
        if device.type == "cuda":
            c = ctx.config()
            self.staging_bytes = c["threads"] * c["staging_size"] * c["staging_count"]
            # Destination buffers are allocated on a stream that runs no work, and every stream
            # that uses a buffer is recorded on it (record_stream): the caching allocator then
            # hands a block out again only after all that work has finished, which is what the
            # engine (whose copies are not ordered on any torch stream) needs.
            self.alloc_stream = torch.cuda.Stream(device)
            self.work_stream = torch.cuda.Stream(device)   # cast / transform run here

    READERS = 2     # batch calls in flight at once: one runs while the other finishes its tail

    def reader(self):
        """Threads that run the engine's synchronous batch calls (they release the GIL)."""
        if self._reader is None:
            import concurrent.futures
            self._reader = concurrent.futures.ThreadPoolExecutor(self.READERS, thread_name_prefix="ferry-npy")
        return self._reader

    def planner(self):
        """One thread that plans and submits read groups (TokenDataset) while the consumer's
        thread hands batches out: one, so that groups reach the engine in order and the handle
        cache is used by one thread at a time."""
        if self._planner is None:
            import concurrent.futures
            self._planner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ferry-plan")
        return self._planner

    def handle(self, key, opener):
        e = self.handles.get(key)
        if e is None:
            if len(self.handles) >= self.max_handles:
                # the oldest idle handles go, a batch's worth at a time (per-sample files open
                # hundreds per batch: one scan per eviction would be quadratic)
                want = len(self.handles) - self.max_handles + max(1, self.max_handles // 8)
                idle = []
                for k, v in self.handles.items():
                    if v[1] == 0:
                        idle.append(k)
                        if len(idle) >= want:
                            break
                for k in idle:
                    h = self.handles.pop(k)[0]
                    try:
                        h.close()
                    except Exception:
                        pass
            e = self.handles[key] = [opener(), 0]
        else:
            self.handles.move_to_end(key)
        return e

    def close(self):
        if self._planner is not None:
            # on the planner thread itself (a last reference dropped there), it cannot be joined
            on_it = threading.current_thread().name.startswith("ferry-plan")
            self._planner.shutdown(wait=not on_it)
            self._planner = None
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None
        for e in self.handles.values():
            h = e[0]
            try:
                h.close()
            except Exception:
                pass
        self.handles.clear()


_IMPORT_PID = os.getpid()   # a forked child must not use the parent's default context


_FORKED = []   # runtimes inherited from a parent process: kept, never closed


def _collect_before_fork():
    # A forked child (a DataLoader worker of another dataset, say) inherits the parent's
    # uncollected garbage; when the child's cyclic GC frees a CUDA tensor that ferry recorded
    # on its streams, torch's allocator calls CUDA there and aborts the child ("CUDA error:
    # initialization error" in insert_events). Collecting in the parent first, once ferry has
    # made CUDA batches, leaves the child nothing of ours to free (bench_xarray_training on a GPU:
    # the isel DataLoader peer after XarrayDataset rows).
    import gc
    gc.collect()


_AT_FORK = []   # registered once, by the first runtime on a CUDA device
