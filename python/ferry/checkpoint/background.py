"""async_save for ferry.checkpoint: snapshot into reused pinned host buffers, write in a
background thread through the same writer as save().

Fork safety: the writing thread, its executor and the pinned buffers belong to the
process that made them. A forked child starts with none of them (os.register_at_fork), so
async_save(...).result() in a child returns even while the parent's writer is busy."""
from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
import time

from .. import _checks
from . import io as _io
from . import writer as _save
from . import st as _st
from . import tree as _tree


def _torch():
    import torch
    return torch


_pool_lock = threading.Lock()
_free_arenas = []          # [(tensor uint8, aligned offset, nbytes usable, registered)]
_executor = None


def _after_fork_in_child():
    """The parent's writer thread does not exist here and its locks may be held: start
    afresh. The parent's pinned buffers are dropped without unregistering (CUDA cannot be
    used in a forked child; the memory is the child's copy)."""
    global _pool_lock, _executor
    _pool_lock = threading.Lock()
    _executor = None
    del _free_arenas[:]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _executor_get():
    global _executor
    with _pool_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="ferry-async-save")
        return _executor


def _arena_get(nbytes, pinned):
    """A host buffer of >= nbytes, 4 KiB-aligned, page-locked when CUDA is present.
    Arenas are kept for later async saves (release_pinned() frees them)."""
    torch = _torch()
    with _pool_lock:
        best = None
        for a in _free_arenas:
            if a[2] >= nbytes and a[3] == pinned and (best is None or a[2] < best[2]):
                best = a
        if best is not None:
            del _free_arenas[next(i for i, a in enumerate(_free_arenas) if a is best)]
            return best
    raw = torch.empty(nbytes + 4096, dtype=torch.uint8)
    off = (-raw.data_ptr()) % 4096
    registered = False
    if pinned and nbytes:
        try:
            rc = torch.cuda.cudart().cudaHostRegister(raw.data_ptr() + off, nbytes, 0)
            registered = int(rc) == 0 if not hasattr(rc, "value") else rc.value == 0
        except Exception:
            registered = False
    return (raw, off, nbytes, pinned, registered)


def _arena_put(a):
    with _pool_lock:
        _free_arenas.append(a)
        # keep at most two arenas
        while len(_free_arenas) > 2:
            _arena_free(_free_arenas.pop(0))


def _arena_free(a):
    raw, off, nbytes, pinned, registered = a
    if registered:
        try:
            _torch().cuda.cudart().cudaHostUnregister(raw.data_ptr() + off)
        except Exception:
            pass


def _snapshot_bytes(state_dict, snapshot="host"):
    flat = _tree.flatten(state_dict)
    total = 0
    for t in flat.tensors.values():
        if snapshot in ("device", "gpu") and t.device.type == "cuda":
            continue
        total += -(-(t.numel() * t.element_size()) // 4096) * 4096
    return total


def reserve_pinned(state_dict_or_nbytes, snapshot="host"):
    """Allocate and page-lock the host buffer async_save will use for this state dict (or
    this many bytes) now, e.g. at start-up, so the first async_save blocks only for its
    copies (pinning 4 GiB takes ~1.4 s on the GPU machine)."""
    torch = _torch()
    n = _checks.check_size("ferry.checkpoint.reserve_pinned", "nbytes", state_dict_or_nbytes) \
        if isinstance(state_dict_or_nbytes, (int, float, str)) else _snapshot_bytes(state_dict_or_nbytes, snapshot)
    if n > 0:
        _arena_put(_arena_get(n, torch.cuda.is_available()))


def release_pinned():
    """Free the pinned host buffers kept by async_save."""
    with _pool_lock:
        while _free_arenas:
            _arena_free(_free_arenas.pop())


def async_save(state_dict, write, crc32c=False, snapshot="host"):
    """Snapshot state_dict and run write(prepared) in the writing thread; returns the
    Future (result: what write returns). See ferry.checkpoint.async_save."""
    torch = _torch()
    t0 = time.perf_counter()
    if snapshot not in ("host", "device", "pinned", "gpu"):
        raise ValueError("ferry.checkpoint.async_save: snapshot must be 'host' or 'device'")
    flat = _tree.flatten(state_dict)
    items = list(flat.tensors.items())
    for n, t in items:
        _st.st_dtype(t.dtype)
    on_gpu = snapshot in ("device", "gpu")
    total = 0
    slots = []
    for n, t in items:
        nb = t.numel() * t.element_size()
        if on_gpu and t.device.type == "cuda":
            slots.append(None)
        else:
            slots.append(total)
            total += -(-nb // 4096) * 4096
    pinned = torch.cuda.is_available()
    arena = _arena_get(total, pinned) if total else None
    snap = collections.OrderedDict()
    events = []
    devs = set()
    try:
        with torch.no_grad():
            for (n, t), off in zip(items, slots):
                if off is None:
                    s = t.clone(memory_format=torch.contiguous_format)
                else:
                    nb = t.numel() * t.element_size()
                    if nb == 0:
                        s = torch.empty(t.shape, dtype=t.dtype)
                    else:
                        raw, base = arena[0], arena[1]
                        s = raw[base + off: base + off + nb].view(t.dtype).view(t.shape)
                        s.copy_(t, non_blocking=t.device.type == "cuda")
                if t.device.type == "cuda":
                    devs.add(_io.cuda_index(t.device))
                snap[n] = s
            for d in sorted(devs):
                ev = torch.cuda.Event()
                ev.record(torch.cuda.current_stream(d))
                events.append(ev)
    except BaseException:
        if arena is not None:
            _arena_put(arena)
        raise
    struct_md = flat.metadata()
    del flat, items                     # the snapshot holds what the writer needs

    def work():
        try:
            for ev in events:
                ev.synchronize()
            return write(_save.Prepared(crc=crc32c, struct_md=struct_md, tensors=snap))
        finally:
            snap.clear()
            if arena is not None:
                _arena_put(arena)

    fut = _executor_get().submit(work)
    fut.blocked_s = time.perf_counter() - t0
    return fut
