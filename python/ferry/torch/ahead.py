"""The next pass's first read groups, read while a pass hands out its last batches
(_BatchStream, "Epoch boundaries"; FERRY_EPOCH_AHEAD)."""
from __future__ import annotations

import itertools
import os

import numpy as np

from .order import Layout as _Layout
from .groups import _even_group
from .runtime import _FORKED


def _env_on(name, default):
    """An on/off setting from the environment: `default` when unset; any other value is
    refused (ferry never ignores a bad setting)."""
    v = os.environ.get(name)
    if v is None:
        return default
    if v in ("on", "off"):
        return v == "on"
    raise ValueError(f'{name}="{v}": use on or off')


def _epoch_ahead():
    """FERRY_EPOCH_AHEAD: whether a pass reads the next pass's first groups (on, the default) or
    not (off)."""
    return _env_on("FERRY_EPOCH_AHEAD", True)


class _Ahead:
    """The next pass's first read groups, submitted while a pass hands out its last batches
    (_BatchStream._read_ahead). They live on the dataset, not in the pass's generator, whose
    `finally` would wait for them and drop them; `key` is everything that decides their
    contents, and the next pass takes them only if it would have submitted the same groups."""
    __slots__ = ("pid", "rt", "key", "epoch", "lay", "units", "ids_for", "groups", "stamps")


class _IdsAhead:
    """Sample ids of the coming units, computed CHUNK units at a time from an order evaluated
    on the fly (FeistelOrder): numpy's per-call cost then falls on 16 batches, not one
    (256 ids 220 us in one call, 4096 ids 610 us)."""
    CHUNK = 16

    def __init__(self, order, lay, mine, chunk=CHUNK):
        self.order, self.lay, self.mine, self.cache = order, lay, mine, {}
        self.chunk = chunk

    def __call__(self, units):
        parts = []
        for s in units:
            if s not in self.cache:
                self._fill(s)
            parts.append(self.cache.pop(s))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _fill(self, s):
        k = self.mine.index(s)
        nxt = self.mine[k:k + self.chunk]
        ranges = [self.lay.unit(u) for u in nxt]
        ids = self.order.take(np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in ranges]))
        sizes = np.cumsum([hi - lo for lo, hi in ranges])[:-1]
        self.cache.clear()
        self.cache.update(zip(nxt, np.split(ids, sizes)))


class _EpochAhead:
    """The next pass's first reads, submitted at the end of a pass (_BatchStream, "Epoch
    boundaries")."""

    def _ids_source(self, order, lay, mine, group_units):
        """The sample ids of a pass's units, computed ahead in chunks from an order evaluated on
        the fly (None: _submit slices the order, or maps positions itself)."""
        if hasattr(order, "take") and not self._ORDER_IN_PLAN:
            return _IdsAhead(order, lay, mine, max(_IdsAhead.CHUNK, group_units))
        return None

    # ---------------------------------------------------------------- the next pass's first reads
    def _ahead_key(self, rt, epoch, start, skip, rank, world, group_units):
        """Everything that decides the groups a pass submits first (the order is (num_samples,
        seed, epoch, shuffle, block_size); the layout (num_samples, start, world, rank, batch,
        drop_last)). rt compares by identity: another device or a new engine is another key."""
        return (rt, rt.device, epoch, start, skip, rank, world, self.batch_size, self.drop_last,
                self.num_samples, self.seed, self.shuffle, self.block_size, group_units)

    def _read_ahead(self, rt, epoch, rank, world, read_units, room):
        """Submit the first groups of the pass after this one (epoch `epoch` from its start, in
        the main process) until `room` of them are kept. A submit that raises ends it: those
        units are the next pass's to submit, and their error is raised there, as without it.
        read_units: the units a read may take; that pass evens them out over its own units."""
        lay = _Layout(self.num_samples, 0, world, rank, self.batch_size or 1, self.drop_last)
        group_units = _even_group(lay.count, read_units)
        key = self._ahead_key(rt, epoch, 0, 0, rank, world, group_units)
        a = self._ahead
        if a is None or a.key != key:
            self._drop_ahead()
            a = _Ahead()
            a.pid, a.rt, a.key, a.epoch, a.groups, a.stamps = os.getpid(), rt, key, epoch, [], []
            a.lay = lay
            units = range(a.lay.count)
            a.units = iter(units)
            a.ids_for = self._ids_source(self._order(epoch), a.lay, units, group_units)
            self._ahead = a
        # the order from the cache, and into it: XarrayDataset reads the epoch of its random
        # patches off the cached order (_epoch_of_order)
        order = self._order(epoch)
        while len(a.groups) < room:
            units = list(itertools.islice(a.units, group_units))
            if not units:
                return
            try:
                stamp = self._ahead_stamp(order, a.lay, units)      # before the files are read
                g = self._submit(rt, order, a.lay, units, None if a.ids_for is None else a.ids_for(units))
            except Exception:
                a.units = iter(())
                return
            a.groups.append(g)
            a.stamps.append(stamp)

    def _ahead_stamp(self, order, lay, units):
        """What must not change between the submit of a group read ahead and the pass that takes
        it, for the group to hold what that pass would read (None: nothing; rows and token
        windows are read through files opened once per process, which a replaced file does not
        change, and XarrayDataset's hand-off checks its files itself)."""
        return None

    def _take_ahead(self, key, order, mine, group_units):
        """The kept groups (_Ahead) as this pass's first pending groups when they are what it
        would submit first (key None: use none); else they are waited for and dropped."""
        a = self._ahead
        if a is not None and key is not None and self._ahead_fits(a, key, order, mine, group_units):
            self._ahead = None
            return a.groups
        self._drop_ahead()
        return []

    def _ahead_fits(self, a, key, order, mine, group_units):
        """Whether the kept groups `a` are the first groups this pass (key, mine) would submit:
        made in this process for the same key, the same units, their files unchanged."""
        if a.pid != os.getpid() or a.key != key:
            return False
        if any(g.units != list(mine[k * group_units:(k + 1) * group_units]) for k, g in enumerate(a.groups)):
            return False
        try:
            return all(st is None or self._ahead_stamp(order, a.lay, g.units) == st
                       for g, st in zip(a.groups, a.stamps))
        except OSError:         # a file gone: the pass submits that group itself (and says so)
            return False

    def _drop_ahead(self):
        """Wait for the kept groups and drop them (a mismatch, another runtime, the dataset's end)."""
        a, self._ahead = getattr(self, "_ahead", None), None
        if a is None:
            return
        if a.pid != os.getpid():
            # inherited through fork: jobs of the parent's engine, whose threads do not exist
            # here; never waited for or freed in this process (as _FORKED runtimes)
            _FORKED.append(a)
            return
        self._abandon(a.rt, a.groups)
