"""progress= everywhere it is taken (checkpoint saves and loads, ferry.read, the xarray backend's
loads, dataset epochs; issue 38 item 17): one reporter, off by default.

progress: None/False (off), True or "tqdm" (a tqdm bar when tqdm is installed, else INFO log lines
on the caller's logger), or a callable progress(done, total) (bytes, or batches for an epoch).
The engine reports a plan's completion, not its bytes: callers cut long work into about STEPS
plans run one after another and report after each."""
from __future__ import annotations

import logging

STEPS = 20


def check(where: str, progress):
    """progress, or a ValueError naming where for a value that is none of the accepted ones."""
    if progress is None or progress is False or progress is True or progress == "tqdm" or callable(progress):
        return progress
    raise ValueError(f"{where}: progress must be None, True, 'tqdm' or a callable progress(done, total), "
                     f"not {progress!r}")


def reporter(progress, what: str, total: int, *, unit: str = "B", log: logging.Logger | None = None,
             where: str = "ferry"):
    """A function(done) from the progress= argument, or None when progress is off."""
    check(where, progress)
    if not progress:
        return None
    if callable(progress) and progress is not True:
        return lambda done: progress(done, total)
    log = log or logging.getLogger("ferry")
    words = "bytes" if unit == "B" else unit + "es" if unit.endswith("h") else unit + "s"
    try:
        from tqdm.auto import tqdm
    except ImportError:
        log.info("%s: tqdm is not installed; progress goes to this log", what)
        nxt = [0]

        def line(done):            # about STEPS lines, whatever the number of reports
            if done >= nxt[0] or done >= total:
                log.info("%s: %d of %d %s", what, done, total, words)
                nxt[0] = done + max(1, total // STEPS)
        return line
    bar = tqdm(total=total, unit=unit, unit_scale=unit == "B", desc=what, leave=False)

    def step(done):
        bar.update(done - bar.n)
        if done >= total:
            bar.close()
    return step


def epoch_reporter(progress, name: str, epoch: int, batches: int, in_worker: bool):
    """A dataset pass's report(done_batches): a no-op when progress is off, and in DataLoader
    workers (each would draw its own bar)."""
    rep = None if in_worker else reporter(progress, f"{name} epoch {epoch}", batches, unit="batch",
                                          log=logging.getLogger("ferry.torch"), where=name)
    return rep if rep is not None else (lambda done: None)


def steps(n: int, align: int = 1) -> list:
    """[(lo, hi)] cutting n rows into about STEPS runs of whole multiples of align rows (a
    chunk's rows: no chunk is read twice), for a report after each."""
    if n <= 0:
        return []
    per = max(1, -(-n // STEPS))
    per = -(-per // max(1, align)) * max(1, align)
    return [(lo, min(n, lo + per)) for lo in range(0, n, per)]


class ReadSteps:
    """ferry.read(progress=...): a selection read as about STEPS plans cut along its first axis
    (at the variable's chunk boundaries: no chunk read twice), run one after another, with a
    report after each. run(plan) runs a plan with the read's options; prepare(plan, dst) makes
    a plan wait for the destination's producer stream."""

    def __init__(self, progress, what: str, run, prepare):
        check("ferry.read", progress)
        self.progress, self.what, self.run, self.prepare = progress, what, run, prepare

    def read(self, read_piece, triples, shape, squeeze, itemsize: int, chunk0: int, dst, nbytes: int) -> None:
        """read_piece(plan, triples, destination) adds one piece's read to a plan."""
        import math

        from . import _ferry
        report = reporter(self.progress, self.what, nbytes)
        lay = _ferry.buffer_layout(dst)
        cut = bool(shape) and 0 not in squeeze and lay["device"] is not None and shape[0] > 1
        report(0)
        if not cut:                      # a scalar, an indexed first axis: one plan
            p = _ferry.Plan()
            self.prepare(p, dst)
            read_piece(p, triples, dst)
            self.run(p)
            report(nbytes)
            return
        row = math.prod(shape[1:]) * itemsize
        triples = triples or [(0, n, 1) for n in shape]     # None: the whole variable
        start, _, step = triples[0]
        done = 0
        for lo, hi in steps(shape[0], chunk0 if step == 1 else 1):
            p = _ferry.Plan()
            self.prepare(p, dst)
            first = (start + lo * step, start + (hi - 1) * step + 1, step)
            read_piece(p, [first] + list(triples[1:]), (lay["ptr"] + lo * row, (hi - lo) * row, lay["device"]))
            self.run(p)
            done += (hi - lo) * row
            report(done)
