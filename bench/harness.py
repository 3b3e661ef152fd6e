"""What the bench_*.py scripts share: optional imports, logging, warming the
page cache, best-of-N timing and a numpy-or-cupy destination."""
import gc
import os
import sys
import time

import numpy as np


def have(mod):
    """True when `mod` imports (a baseline library may be missing on a machine)."""
    try:
        __import__(mod)
        return True
    except Exception:  # noqa: BLE001
        return False


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def files_of(path):
    """The file itself, or every file under a directory (a Zarr store)."""
    if os.path.isfile(path):
        return [path]
    return [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]


def warm(path):
    """Read every byte once, so the timed reads find it in the page cache."""
    for p in files_of(path):
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass


def env_settings(text, what):
    """'NAME=VALUE[,NAME=VALUE...]' -> {NAME: VALUE} (the settings of one row of a sweep);
    a piece without '=' after a setting continues its value (FERRY_GPU_RATES=53,31,0.75);
    anything else ends the run naming `what` and the item, not a row run without it."""
    out, last = {}, None
    for kv in (x.strip() for x in text.split(",") if x.strip()):
        k, eq, v = kv.partition("=")
        if not eq and last is not None:
            out[last] += "," + kv
            continue
        if not eq or not k.strip():
            raise SystemExit(f"{what}: {kv!r} is not NAME=VALUE")
        last = k.strip()
        out[last] = v.strip()
    return out


def best(fn, reps):
    """(fastest of `reps` timed calls, the last call's result); the previous
    result is dropped before each call, so two never hold memory at once."""
    times, out = [], None
    for _ in range(reps):
        out = None
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


class Dev:
    """Where results go: "cpu" (numpy) or a GPU ordinal (cupy)."""

    def __init__(self, device):
        self.cpu = device == "cpu"
        self.device = "cpu" if self.cpu else int(str(device).split(":")[-1])
        if not self.cpu:
            import cupy
            self.cp = cupy

    def to(self, a):
        return np.array(a, copy=True) if self.cpu else self.cp.asarray(a)

    def sync(self):
        if not self.cpu:
            self.cp.cuda.Device(self.device).synchronize()

    def host(self, a):
        return np.asarray(a) if self.cpu else self.cp.asnumpy(self.cp.asarray(a))

    def equal(self, a, b):
        if self.cpu:
            return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
        return bool(self.cp.array_equal(self.cp.asarray(a), self.cp.asarray(b), equal_nan=True))
