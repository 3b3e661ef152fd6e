"""Epoch orders and the split of an epoch over ranks and workers (ferry.torch's datasets).

Two orders, both functions of (seed, epoch) alone — the same on every rank, machine and numpy
version (integer hashing only, no library RNG stream):
- epoch_order(): the whole permutation as an int64 array (argsort of hashed ids). O(n) memory;
  ArrayDataset uses it (its golden values are part of saved states).
- FeistelOrder: the same contract computed on the fly for any slice of positions, in O(1)
  memory — a keyed Feistel network over the smallest power-of-4 domain >= n, cycle-walked back
  into [0, n) (Black & Rogaway, "Ciphers with arbitrary finite domains", 2002). TokenDataset uses
  it: 5e7 windows need no 400 MB array per rank and worker. take() runs in C (ferry_perm_take,
  src/formats/perm.c); take_numpy() is the same network in numpy, the reference.
"""
from __future__ import annotations

import numpy as np

from .._checks import check

try:   # the same permutation in C (src/formats/perm.c): ~15x faster per batch of ids
    from .._ferry import order_take as _order_take
except ImportError:                     # pragma: no cover - an extension built before it
    _order_take = None

_M64 = (1 << 64) - 1


def _mix64(x):
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _key(seed, epoch, salt):
    return int(_mix64(np.array([(seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03
                                 + salt * 0x8CB92BA72F3D8DD7 + 1) & _M64], dtype=np.uint64))[0])


def _permutation(n, seed, epoch, salt):
    key = _key(seed, epoch, salt)
    with np.errstate(over="ignore"):
        k = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(key)
    return np.argsort(_mix64(k), kind="stable").astype(np.int64)


def epoch_order(n, seed=0, epoch=0, shuffle=True, block_size=None):
    """The order in which an epoch visits sample ids 0..n-1 (an int64 array of length n).

    shuffle=False: 0, 1, 2, ...  shuffle=True: a permutation determined by (seed, epoch) only.
    block_size=b (with shuffle): blocks of b consecutive ids are visited in a random order, the
    ids inside a block in ascending order — reads stay sequential, batches less random."""
    n, seed, epoch = (check("epoch_order", k, v) for k, v in (("n", n), ("seed", seed), ("epoch", epoch)))
    block_size = check("epoch_order", "block_size", block_size, none=True)
    if not shuffle or n <= 1:
        return np.arange(n, dtype=np.int64)
    if block_size is None or block_size <= 1:
        return _permutation(n, int(seed), int(epoch), 0)
    b = int(block_size)
    nb = -(-n // b)
    blocks = _permutation(nb, int(seed), int(epoch), 1)
    sizes = np.minimum(b, n - blocks * b)
    starts = np.repeat(blocks * b, sizes)
    within = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return starts + within


class FeistelOrder:
    """A permutation of range(n) from (seed, epoch), evaluated per slice: order[lo:hi] is an
    int64 array; nothing of size n is ever built. shuffle=False gives the identity."""

    ROUNDS = 4            # Luby-Rackoff: 4 rounds of a good round function look random

    def __init__(self, n, seed=0, epoch=0, shuffle=True):
        self.n = int(n)
        self.seed, self.epoch = int(seed), int(epoch)
        self.shuffle = bool(shuffle) and self.n > 1
        bits = max(2, int(self.n - 1).bit_length())
        self.half = (bits + 1) // 2                       # domain 4**half >= n, < 4n
        self.mask = np.uint64((1 << self.half) - 1)
        self.shift = np.uint64(64 - self.half)
        # odd multipliers and xor keys per round, from (seed, epoch)
        self.keys = [(np.uint64(_key(int(seed), int(epoch), 16 + 2 * r)),
                      np.uint64(_key(int(seed), int(epoch), 17 + 2 * r) | 1))
                     for r in range(self.ROUNDS)]

    def __len__(self):
        return self.n

    def _encrypt(self, x):
        """One pass of the network over x (uint64 values < 4**half). The round function is a
        multiply-shift hash, (r ^ k) * m >> (64 - half): its top bits depend on every input bit,
        and it costs 3 numpy operations (a splitmix64 round costs 9; ids are computed per
        batch on the hot path: ~25 us for 256 ids)."""
        h, m, sh = np.uint64(self.half), self.mask, self.shift
        left, right = x >> h, x & m
        for k, mul in self.keys:             # array products wrap silently (no errstate needed)
            f = right ^ k
            f *= mul
            f >>= sh
            f ^= left
            left, right = right, f
        left <<= h
        left |= right
        return left

    def take(self, positions):
        """The ids at these positions (an int64 array)."""
        p = np.asarray(positions, dtype=np.int64)
        if p.size and (p.min() < 0 or p.max() >= self.n):
            raise IndexError(f"FeistelOrder: positions outside [0, {self.n})")
        if not self.shuffle:
            return p.copy()
        if _order_take is not None and -(1 << 63) <= self.seed < (1 << 63) and \
                -(1 << 63) <= self.epoch < (1 << 63):
            out = np.empty(p.shape, dtype=np.int64)
            _order_take(self.n, self.seed, self.epoch, True, np.ascontiguousarray(p).reshape(-1),
                        out.reshape(-1))
            return out
        return self.take_numpy(p)

    def take_numpy(self, p):
        """take() in numpy: the reference the C version (ferry_perm_take) is tested against."""
        p = np.asarray(p, dtype=np.int64)
        if not self.shuffle:
            return p.copy()
        y = self._encrypt(p.astype(np.uint64))
        n = np.uint64(self.n)
        idx = np.flatnonzero(y >= n)
        while idx.size:                                   # cycle-walk: < 4 rounds on average
            v = self._encrypt(y[idx])
            y[idx] = v
            idx = idx[v >= n]
        return y.view(np.int64)

    def __getitem__(self, key):
        if not isinstance(key, slice):
            return int(self.take([key])[0])
        lo, hi, step = key.indices(self.n)
        return self.take(np.arange(lo, hi, step, dtype=np.int64))


class Layout:
    """Units (batches, or single samples when batch_size is None) of one rank for one pass.

    Unit s < full covers positions [start + s*W*B + r*B, +B); unit `full` is this rank's share of
    the tail (drop_last=False only, when non-empty)."""

    def __init__(self, n, start, world, rank, batch, drop_last):
        self.n, self.start, self.world, self.rank, self.batch = n, start, world, rank, batch
        self.step = world * batch
        rem = max(0, n - start)
        self.full = rem // self.step
        tail = rem - self.full * self.step
        self.tail = None
        if tail and not drop_last:
            q, m = divmod(tail, world)
            size = q + (1 if rank < m else 0)
            if size:
                lo = start + self.full * self.step + rank * q + min(rank, m)
                self.tail = (lo, lo + size)
        self.count = self.full + (1 if self.tail else 0)

    def unit(self, s):
        if s < self.full:
            lo = self.start + s * self.step + self.rank * self.batch
            return lo, lo + self.batch
        return self.tail

    def consumed_after(self, s):
        """Global positions consumed once every rank has taken units 0..s."""
        return min(self.n, self.start + (s + 1) * self.step)
