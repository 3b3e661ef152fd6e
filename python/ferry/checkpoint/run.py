"""Running checkpoint plans for ferry.checkpoint, with optional progress reports.

Without progress a save or load is one engine plan. With progress= the same extents are
cut into about 20 plans run one after another, and the callback hears after each how many
bytes are done (the engine reports a plan's completion, not its bytes)."""
from __future__ import annotations

import logging
import time

from . import io as _io
from .. import _ferry, _progress

log = logging.getLogger("ferry.checkpoint")


def reporter(progress, what, total):
    """A function(done_bytes) from the progress= argument, or None: the package's one
    reporter (ferry/_progress.py), logging here to ferry.checkpoint."""
    return _progress.reporter(progress, what, total, log=log, where="ferry.checkpoint")


def run(ops, *, threads=0, sync=False, report=None, cuda_devices=(), files=()):
    """Run ops [(nbytes, add(plan))] on the checkpoint context. sync: fsync the files the
    plans write (with progress: each of `files` once, at the end)."""
    ctx = _io.context()
    total = sum(n for n, _ in ops)
    if report is None:
        plan = _ferry.Plan()
        _io.wait_devices(plan, cuda_devices)   # torch's pending work on those buffers first
        for _, add in ops:
            add(plan)
        if len(plan):
            ctx.run(plan, threads=threads, sync=sync)
        elif sync:
            for f in files:
                f.sync()
        return
    step = max(total // 20, 1)
    done = 0
    report(0)
    plan, in_plan = _ferry.Plan(), 0
    for i, (n, add) in enumerate(ops):
        add(plan)
        in_plan += n
        if in_plan >= step or i == len(ops) - 1:
            if len(plan):
                _io.wait_devices(plan, cuda_devices)
                ctx.run(plan, threads=threads)
            done += in_plan
            report(done)
            plan, in_plan = _ferry.Plan(), 0
    if not ops:
        report(0)
    if sync:
        for f in files:
            f.sync()


class Timer:
    """log.info of what was moved, how many bytes and how fast, when the block ends."""

    def __init__(self, what, path):
        self.what, self.path, self.nbytes = what, path, 0

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb):
        dt = time.perf_counter() - self.t0
        if exc_type is None:
            log.info("%s %s: %d bytes in %.3f s (%.2f GB/s)", self.what, self.path, self.nbytes,
                     dt, self.nbytes / dt / 1e9 if dt > 0 else 0.0)
        else:
            log.debug("%s %s failed after %.3f s: %s", self.what, self.path, dt, exc)
