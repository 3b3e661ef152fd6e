"""What ferry.torch's datasets need to know about the DataLoader that runs them.

EpochBoard — epochs without set_epoch. A DataLoader with workers runs the dataset in copies
(forked or spawned), one fresh set per epoch unless persistent_workers=True, and Lightning never
calls set_epoch: a copy cannot learn from the main process which epoch it is in. Mosaic's
StreamingDataset solves this with an epoch counter in shared memory that the workers of a pass
agree on (streaming/base/dataset.py, `_resume_incr_epoch` under a shared lock); LitData's
StreamingDataLoader instead sets the epoch from the loader (which a plain DataLoader cannot).
ferry keeps the counter in a small shared-memory tensor made by the main process (inherited on
fork, passed by handle on spawn) and needs no lock: each worker writes only its own slot, and a
pass is recognised by a tag every worker of that pass computes alike — the DataLoader's base seed
(get_worker_info().seed - id, drawn afresh for each iter(loader)) and the worker copy's own count
of passes (which advances in step for persistent workers). The first worker of a new pass finds
no slot with its tag and takes max(epoch in the slots) + 1; its siblings, reading before or after
it wrote, reach the same number. A slot is one int64 (tag and epoch packed), so a read never sees
half a write.

auto_collation() — whether the DataLoader iterating us batches what we yield again
(DataLoader(ds) with its default batch_size=1 turns ferry's (B, ...) batches into (1, B, ...)).
torch's _IterableDatasetFetcher calls iter(dataset) from its __init__ with `auto_collation`
already set on itself, in the main process and in workers alike; we look for it on the stack.
"""
from __future__ import annotations

import sys

import numpy as np
import torch

SLOTS = 256                    # DataLoader workers per dataset copy the board can track
_EPOCH_BITS = 22               # epochs < 4M; the tag keeps 40 bits
_EPOCH_MASK = (1 << _EPOCH_BITS) - 1
_TAG_MASK = (1 << 40) - 1

# board layout (int64): [base epoch, base position, started[SLOTS], ended[SLOTS], workers[SLOTS]]
_BASE_EPOCH, _BASE_POS, _STARTED = 0, 1, 2
_ENDED = _STARTED + SLOTS
_WORKERS = _ENDED + SLOTS


def pass_tag(winfo, local_passes):
    """The tag shared by every worker of one DataLoader pass."""
    seed = getattr(winfo, "seed", None)
    base = 0 if seed is None else int(seed) - int(winfo.id)
    x = (base * 0x9E3779B97F4A7C15 + (local_passes + 1) * 0xD1B54A32D192ED03) & ((1 << 64) - 1)
    x ^= x >> 31
    return (x & _TAG_MASK) or 1


class EpochBoard:
    """Epoch bookkeeping shared between a dataset in the main process and its worker copies."""

    def __init__(self):
        self.t = torch.zeros(_WORKERS + SLOTS, dtype=torch.int64).share_memory_()

    @property
    def a(self):
        return self.t.numpy()

    # ---- main process
    def publish(self, epoch, position):
        """The main process chose (epoch, position): the next worker pass starts there."""
        a = self.a
        a[_STARTED:] = 0
        a[_BASE_POS] = int(position)
        a[_BASE_EPOCH] = int(epoch)

    def set_position(self, position):
        self.a[_BASE_POS] = int(position)

    def latest(self):
        """None when no worker pass ran since the last publish, else (epoch, position at its
        start, whether every worker of it has yielded its last batch)."""
        a = self.a
        started = a[_STARTED:_ENDED]
        used = np.flatnonzero(started)
        if used.size == 0:
            return None
        vals = started[used] - 1
        eps = vals & _EPOCH_MASK
        e = int(eps.max())
        mine = used[eps == e]
        nw = int(a[_WORKERS + mine[0]])
        ended = all(a[_ENDED + w] == a[_STARTED + w] for w in range(nw)) and \
            all((int(a[_STARTED + w]) - 1) & _EPOCH_MASK == e for w in range(nw))
        pos = int(a[_BASE_POS]) if e == int(a[_BASE_EPOCH]) else 0
        return e, pos, ended

    # ---- worker copies
    def join(self, wid, num_workers, tag):
        """Worker `wid` starts the pass `tag`: returns (epoch, start position) of the pass."""
        if not 0 <= wid < SLOTS:
            raise RuntimeError(f"ferry.torch: more than {SLOTS} DataLoader workers")
        a = self.a
        base_e, base_pos = int(a[_BASE_EPOCH]), int(a[_BASE_POS])
        started = a[_STARTED:_ENDED].copy()
        used = started[started != 0] - 1
        if used.size == 0:
            e = base_e                              # the first pass since the main process chose
        else:
            tags, eps = used >> _EPOCH_BITS, used & _EPOCH_MASK
            same = eps[tags == tag]
            e = int(same[0]) if same.size else int(eps.max()) + 1
        if e > _EPOCH_MASK:
            raise RuntimeError("ferry.torch: epoch counter overflow")
        a[_WORKERS + wid] = num_workers
        a[_ENDED + wid] = 0
        a[_STARTED + wid] = ((tag << _EPOCH_BITS) | e) + 1
        return e, (base_pos if e == base_e else 0)

    def resumed(self, wid, num_workers, tag, epoch):
        """Worker `wid` resumes an exact per-worker state (StatefulDataLoader) in `epoch`."""
        a = self.a
        a[_WORKERS + wid] = num_workers
        a[_ENDED + wid] = 0
        a[_STARTED + wid] = ((tag << _EPOCH_BITS) | int(epoch)) + 1

    def ended(self, wid):
        a = self.a
        a[_ENDED + wid] = a[_STARTED + wid]


def auto_collation(max_depth=8):
    """(auto_collation, collate_fn) of the torch DataLoader fetcher calling iter() on us, or None
    when we are not being iterated by a DataLoader's fetcher."""
    f = sys._getframe(1)
    for _ in range(max_depth):
        if f is None:
            return None
        # only the fetcher's __init__ frame is looked into: reading f_locals of any other frame
        # (Python < 3.13) pins a snapshot of its locals on it, and the caller's `del ds` no
        # longer freed the dataset (its engine, its threads) until that function returned
        if f.f_code.co_name != "__init__":
            f = f.f_back
            continue
        s = f.f_locals.get("self")
        if s is not None and type(s).__name__ == "_IterableDatasetFetcher" and \
                hasattr(s, "auto_collation"):
            return bool(s.auto_collation), getattr(s, "collate_fn", None)
        f = f.f_back
    return None
