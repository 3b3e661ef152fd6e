"""ferry.torch — a PyTorch streaming dataset fed by ferry's engine.

``ArrayDataset`` is a ``torch.utils.data.IterableDataset`` whose samples are the rows (the first
axis) of one or more arrays stored in ``.npy`` files, safetensors shards or Zarr arrays. A batch
of sample ids becomes one ferry plan (one extent per run of consecutive rows) that the engine's
native threads read straight into tensors allocated by torch on ``device``; no worker processes,
no pickling, no pageable copies. See docs/torch.md for the full guide.

Order and sharding (W ranks, batch B, N samples)
    The epoch order is a permutation of range(N) computed from (seed, epoch) alone, identical on
    every rank and process. Global step s consumes positions [s*W*B, (s+1)*W*B) of that order;
    rank r takes [s*W*B + r*B, s*W*B + (r+1)*B). After k steps exactly the first k*W*B positions
    are consumed whatever W is, so a state saved with W ranks resumes with W' ranks.
    Tail (fewer than W*B positions left): drop_last=True drops it; drop_last=False splits it as
    evenly as possible (contiguous slices, rank order) — every sample exactly once, but ranks
    whose slice is empty yield one batch fewer (use drop_last=True with DDP).
    Inside a DataLoader with num_workers=n, worker w of a rank takes that rank's batches
    w, w+n, w+2n, ...: the DataLoader's round-robin hands them to the training loop in order.
"""
from __future__ import annotations

import collections
import glob as _glob
import math
import os
import re
import sys
import threading

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import _ferry

__all__ = ["ArrayDataset", "XarrayDataset", "epoch_order", "global_state"]

_STATE_TAG = "ferry.torch.ArrayDataset"
_STATE_VERSION = 1

# ferry dtype names (docs/python-extension.md) -> torch dtype attribute names
_TORCH_DTYPES = {
    "b1": "bool", "i1": "int8", "u1": "uint8", "i2": "int16", "u2": "uint16", "i4": "int32",
    "u4": "uint32", "i8": "int64", "u8": "uint64", "f2": "float16", "bf16": "bfloat16",
    "f4": "float32", "f8": "float64", "c8": "complex64", "c16": "complex128",
    "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "M8": "int64", "m8": "int64",
}
_TYPESTR_KIND = {"b": "b1", "i": "i", "u": "u", "f": "f", "c": "c"}
_LITTLE = sys.byteorder == "little"


# --------------------------------------------------------------------------------------------
# Epoch order: a permutation from (seed, epoch) that is the same on every machine and numpy
# version (integer hashing + a stable sort, no library RNG stream involved).
# --------------------------------------------------------------------------------------------
_M64 = (1 << 64) - 1


def _mix64(x):
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _permutation(n, seed, epoch, salt):
    key = int(_mix64(np.array([(seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03
                                + salt * 0x8CB92BA72F3D8DD7 + 1) & _M64], dtype=np.uint64))[0])
    with np.errstate(over="ignore"):
        k = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(key)
    return np.argsort(_mix64(k), kind="stable").astype(np.int64)


def epoch_order(n, seed=0, epoch=0, shuffle=True, block_size=None):
    """The order in which an epoch visits sample ids 0..n-1 (an int64 array of length n).

    shuffle=False: 0, 1, 2, ...  shuffle=True: a permutation determined by (seed, epoch) only.
    block_size=b (with shuffle): blocks of b consecutive ids are visited in a random order, the
    ids inside a block in ascending order — reads stay sequential, batches less random."""
    n = int(n)
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


# --------------------------------------------------------------------------------------------
# Which positions of the epoch order a (rank, worker) reads
# --------------------------------------------------------------------------------------------
class _Layout:
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


# --------------------------------------------------------------------------------------------
# Sources and fields
# --------------------------------------------------------------------------------------------
def _natural_key(s):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _expand(spec):
    if isinstance(spec, (str, os.PathLike)):
        s = os.fspath(spec)
        if any(c in s for c in "*?["):
            paths = sorted(_glob.glob(s), key=_natural_key)
            if not paths:
                raise FileNotFoundError(f"ferry.torch: no files match {s!r}")
            return paths
        return [s]
    if isinstance(spec, (list, np.ndarray)) or hasattr(spec, "__iter__"):
        paths = []
        for p in spec:
            paths.extend(_expand(p))
        if not paths:
            raise ValueError("ferry.torch: an empty list of files")
        return paths
    raise TypeError(f"ferry.torch: a source is a path, a glob, a list of paths or (paths, name); got {spec!r}")


def _parse_source(spec):
    """-> (paths, array name or None). A tuple is (paths-or-glob, name); a list is paths."""
    if isinstance(spec, tuple):
        if len(spec) != 2 or not isinstance(spec[1], str):
            raise TypeError("ferry.torch: a tuple source is (paths_or_glob, array_name); "
                            "give several paths as a list")
        return _expand(spec[0]), spec[1]
    return _expand(spec), None


class _Shard:
    __slots__ = ("path", "name", "group", "index", "rows", "offset", "contiguous")


class _Field:
    """One named field: rows concatenated over shards."""

    def __init__(self, name, shards, row_shape, typestr, ferry_dtype, itemsize):
        self.name = name
        self.shards = shards
        rows = np.array([s.rows for s in shards], dtype=np.int64)
        self.starts = np.concatenate(([0], np.cumsum(rows)[:-1])).astype(np.int64)
        self.rows = int(rows.sum())
        self.typestr = typestr
        tname = _TORCH_DTYPES.get(ferry_dtype)
        tdt = getattr(torch, tname, None) if tname else None
        if tdt is not None and torch.empty((), dtype=tdt).element_size() == itemsize:
            self.dtype, self.shape = tdt, tuple(row_shape)
        else:  # bytes, strings, records, dtypes torch lacks: raw bytes, one more axis
            self.dtype, self.shape = torch.uint8, tuple(row_shape) + (itemsize,)
        self.row_bytes = int(np.prod(row_shape, dtype=np.int64)) * itemsize
        self.stored_shape = tuple(row_shape)

    def __repr__(self):
        return f"<field {self.name!r} rows={self.rows} sample={self.shape} {self.dtype}>"


def _native_order(typestr):
    c = typestr[:1]
    if c in "|=":
        return True
    if c == "<":
        return _LITTLE
    if c == ">":
        return not _LITTLE
    return _LITTLE  # "bfloat16", "float8_*": safetensors, little-endian


def _open_var(ctx, path, name):
    """-> (ferry Dataset, variable index, variable dict, group)."""
    ds = _ferry.Dataset(ctx, path)
    group = None
    vs = ds.variables()
    if name is None:
        if len(vs) != 1:
            names = [v["name"] for v in vs]
            ds.close()
            raise ValueError(f"ferry.torch: {path} holds {len(vs)} arrays {names}; name one, "
                             f"e.g. fields={{'x': ({path!r}, {names[0] if names else 'name'!r})}}")
        return ds, 0, vs[0], None
    try:
        idx = ds.find(name)
    except KeyError:
        if "/" not in name.strip("/"):
            ds.close()
            raise KeyError(f"ferry.torch: {path} has no array {name!r} "
                           f"(it has {[v['name'] for v in vs]})") from None
        ds.close()
        group, base = name.strip("/").rsplit("/", 1)
        ds = _ferry.Dataset(ctx, path, group=group)
        try:
            idx = ds.find(base)
        except KeyError:
            ds.close()
            raise KeyError(f"ferry.torch: {path} has no array {name!r}") from None
        vs = ds.variables()
    return ds, idx, vs[idx], group


def _load_field(ctx, fname, spec):
    paths, name = _parse_source(spec)
    shards = []
    row_shape = typestr = fdt = itemsize = None
    for p in paths:
        ds, idx, v, group = _open_var(ctx, p, name)
        ds.close()
        shape = tuple(int(d) for d in v["shape"])
        if len(shape) == 0:
            raise ValueError(f"ferry.torch: field {fname!r}: {p} holds a scalar; samples are rows "
                             f"along the first axis")
        if row_shape is None:
            row_shape, typestr, fdt, itemsize = shape[1:], v["typestr"], v.get("dtype"), int(v["itemsize"])
        elif shape[1:] != row_shape or v["typestr"].lstrip("<>=|") != typestr.lstrip("<>=|"):
            raise ValueError(f"ferry.torch: field {fname!r}: {p} has rows {shape[1:]} {v['typestr']}, "
                             f"but {paths[0]} has {row_shape} {typestr}")
        sh = _Shard()
        sh.path, sh.name, sh.group, sh.index, sh.rows = p, v["name"], group, idx, shape[0]
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        sh.offset = int(v.get("data_offset") or 0)
        sh.contiguous = (
            (int(v.get("data_bytes") or 0) == nbytes and nbytes > 0)
            and not (v.get("fortran_order") and sum(d > 1 for d in shape) > 1)
            and not v.get("codecs")
            and _native_order(v["typestr"])
        )
        shards.append(sh)
    if fdt is None:
        k = typestr.lstrip("<>=|")
        fdt = k if k in _TORCH_DTYPES else (k[0] + str(itemsize) if k[:1] in "iufc" else "other")
    return _Field(fname, shards, row_shape, typestr, fdt, itemsize)


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
        if device.type == "cuda":
            # Destination buffers are allocated on a stream that runs no work, and every stream
            # that uses a buffer is recorded on it (record_stream): the caching allocator then
            # hands a block out again only after all that work has finished, which is what the
            # engine (whose copies are not ordered on any torch stream) needs.
            self.alloc_stream = torch.cuda.Stream(device)
            self.work_stream = torch.cuda.Stream(device)   # cast / transform run here

    def handle(self, key, opener):
        e = self.handles.get(key)
        if e is None:
            if len(self.handles) >= self.max_handles:
                for k in [k for k, v in self.handles.items() if v[1] == 0][: len(self.handles) - self.max_handles + 1]:
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
        for h, _ in self.handles.values():
            try:
                h.close()
            except Exception:
                pass
        self.handles.clear()


_PINNED_BELOW = 1 << 20     # staging="auto": rows smaller than this go through pinned batches
_IMPORT_PID = os.getpid()   # a forked child must not use the parent's default context
_FORKED = []   # runtimes inherited from a parent process: kept, never closed


class _Group:
    """A set of units read by one plan/job."""
    __slots__ = ("units", "sizes", "bufs", "job", "handles", "path")


# --------------------------------------------------------------------------------------------
# The dataset
# --------------------------------------------------------------------------------------------
class ArrayDataset(IterableDataset):
    """Batches of rows of arrays in files, read by ferry's engine into torch tensors on `device`.

    ArrayDataset(source=None, *, fields=None, batch_size=256, shuffle=False, seed=0,
                 drop_last=False, device=None, rank=None, world_size=None, prefetch=4,
                 block_size=None, dtype=None, normalize=None, transform=None,
                 pin_memory=False, threads=0, ctx=None, sample_group=64, staging="auto")

    source / fields
        `source`: one field, batches are tensors. `fields={"x": ..., "y": ...}`: batches are dicts.
        Each field is a glob ("train/x_*.npy", sorted in natural order: x_2 before x_10), a path,
        a list of paths, or a tuple (paths_or_glob, name) naming the array inside each file (the
        tensor of a safetensors shard, the array of a Zarr group; "grp/arr" for nested Zarr).
        A file holding one array needs no name. All fields must have the same number of rows.
    batch_size
        Rows per batch (per rank), or None to yield single samples.
    shuffle, seed, block_size
        The epoch order: see epoch_order(). set_epoch(n) selects the epoch.
    device
        "cuda", "cuda:1", torch.device, or "cpu"; None: CUDA when available (host otherwise).
        Inside DataLoader worker processes only "cpu" works (CUDA cannot run in forked workers).
    rank, world_size
        Default: torch.distributed's when it is initialised, else 0 and 1.
    prefetch
        Batches in flight ahead of the one being consumed.
    dtype, normalize
        Casting on the device: dtype=torch.float16 (or {"x": torch.float16}); normalize=(mean,
        std) or {"x": (mean, std)}, scalars or per-channel sequences applied along the first axis
        of a sample (C of CHW): out = (x - mean) / std, in `dtype` (float32 if not given).
    transform
        A callable batch -> batch run after casting; on CUDA it runs on ferry's stream and the
        consumer's current stream waits for it.
    pin_memory
        Host batches in page-locked memory (only when CUDA is available).
    threads, ctx
        Engine threads for a context ferry.torch creates (0: engine default), or a
        ferry._ferry.Context to use in the main process.
    sample_group
        Per-sample mode: samples read per plan.
    staging
        CUDA only; one value or {field: value}. "engine": the engine moves rows to the GPU itself
        (cuFile, or its pinned staging buffers and one host-to-device copy per run of rows).
        "pinned": the engine reads on its host path into pinned batches (torch's pinned caching
        allocator) and torch copies each field to the GPU in one copy on ferry's stream — fewer,
        larger copies when rows are small. "auto" (default): "pinned" for fields whose rows are
        under 1 MiB, else "engine".
    """

    def __init__(self, source=None, *, fields=None, batch_size=256, shuffle=False, seed=0,
                 drop_last=False, device=None, rank=None, world_size=None, prefetch=4,
                 block_size=None, dtype=None, normalize=None, transform=None, pin_memory=False,
                 threads=0, ctx=None, sample_group=64, staging="auto"):
        super().__init__()
        if (source is None) == (fields is None):
            raise TypeError("ArrayDataset: give exactly one of `source` or `fields`")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"ArrayDataset: batch_size must be a positive int or None, not {batch_size!r}")
        if prefetch < 0:
            raise ValueError("ArrayDataset: prefetch must be >= 0")
        self._single = fields is None
        specs = {"data": source} if self._single else dict(fields)
        if not specs:
            raise ValueError("ArrayDataset: fields is empty")
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.block_size = None if block_size is None else int(block_size)
        self.drop_last = bool(drop_last)
        self.device = None if device is None else torch.device(device)
        self.rank, self.world_size = rank, world_size
        self.prefetch = int(prefetch)
        self.transform = transform
        self.pin_memory = bool(pin_memory)
        self.threads = int(threads)
        self.sample_group = max(1, int(sample_group))
        self.staging = staging
        self._ctx_arg, self._ctx_pid = ctx, os.getpid()
        self._rt = None
        self._rt_lock = threading.Lock()

        meta_ctx = ctx if ctx is not None else _ferry.Context(threads=1)
        try:
            self._fields = [_load_field(meta_ctx, k, v) for k, v in specs.items()]
        finally:
            if ctx is None:
                meta_ctx.close()
        n = {f.name: f.rows for f in self._fields}
        if len(set(n.values())) != 1:
            raise ValueError(f"ArrayDataset: fields have different numbers of rows: {n}")
        self.num_samples = self._fields[0].rows
        self._convert = self._conversions(dtype, normalize)
        self._staging = self._staging_per_field(staging)

        # progress (global; see state_dict)
        self._epoch = 0
        self._consumed = 0
        self._resume = None        # per-worker state to restore exactly (StatefulDataLoader)
        self._worker_progress = None
        self._generation = 0
        self._order_cache = None
        self.last_path = None      # engine path that served the latest batch

    # ---------------------------------------------------------------- configuration helpers
    @property
    def fields(self):
        """{name: (sample shape, torch dtype)} of what a batch holds (before casting)."""
        return {f.name: (f.shape, f.dtype) for f in self._fields}

    def _conversions(self, dtype, normalize):
        names = [f.name for f in self._fields]
        def per_field(v, what):
            if v is None:
                return {}
            if isinstance(v, dict):
                bad = set(v) - set(names)
                if bad:
                    raise KeyError(f"ArrayDataset: {what} names unknown fields {sorted(bad)}")
                return dict(v)
            if not self._single and len(names) > 1:
                raise ValueError(f"ArrayDataset: with several fields, give {what} as a dict")
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
                    raise ValueError("ArrayDataset: normalize std has a zero")
                c = max(mean.size, std.size)
                if c > 1 and (not f.shape or f.shape[0] != c):
                    raise ValueError(f"ArrayDataset: normalize for {f.name!r} has {c} channels, "
                                     f"samples are {f.shape}")
                if dt is None:
                    dt = f.dtype if f.dtype.is_floating_point else torch.float32
                nm = (mean, 1.0 / std)
            conv[f.name] = (dt, nm)
        return conv

    def _staging_per_field(self, staging):
        names = [f.name for f in self._fields]
        spec = staging if isinstance(staging, dict) else {k: staging for k in names}
        bad = set(spec) - set(names)
        if bad:
            raise KeyError(f"ArrayDataset: staging names unknown fields {sorted(bad)}")
        out = {}
        for f in self._fields:
            v = spec.get(f.name, "auto")
            if v not in ("auto", "engine", "pinned"):
                raise ValueError(f"ArrayDataset: staging must be 'auto', 'engine' or 'pinned', not {v!r}")
            if v == "auto":
                v = "pinned" if f.row_bytes < _PINNED_BELOW else "engine"
            out[f.name] = v == "pinned"
        return out

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
            raise ValueError(f"ArrayDataset: rank {rank} outside world_size {world}")
        return int(rank), int(world)

    def _resolve_device(self, in_worker):
        dev = self.device
        if dev is None:
            dev = torch.device("cuda") if (not in_worker and torch.cuda.is_available()) else torch.device("cpu")
        if dev.type == "cuda":
            if in_worker:
                raise RuntimeError(
                    "ferry.torch.ArrayDataset: device=%r inside a DataLoader worker process. CUDA "
                    "cannot be used in forked workers ('Cannot re-initialize CUDA in forked "
                    "subprocess'), and ferry already reads in native threads: use "
                    "DataLoader(ds, batch_size=None, num_workers=0), or device='cpu' to read on the "
                    "host path in workers." % str(dev))
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.type != "cpu":
            raise ValueError(f"ArrayDataset: device must be CUDA or CPU, not {dev}")
        return dev

    def _runtime(self, device, in_worker, num_workers):
        pid = os.getpid()
        with self._rt_lock:
            rt = self._rt
            if rt is not None and rt.pid == pid and rt.device == device:
                return rt
            if rt is not None and rt.pid == pid:
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
            if device.type == "cuda" and ctx.cuda_device_count() == 0:
                raise RuntimeError(f"ferry.torch: torch sees {device} but ferry cannot use CUDA: "
                                   f"{ctx.cuda_status or 'no CUDA device'}")
            self._rt = _Runtime(ctx, device)
            return self._rt

    def __getstate__(self):
        st = self.__dict__.copy()
        st["_rt"] = None
        st["_rt_lock"] = None
        st["_order_cache"] = None
        st["_ctx_arg"] = None   # contexts do not travel between processes
        return st

    def __setstate__(self, st):
        self.__dict__.update(st)
        self._rt_lock = threading.Lock()

    def __del__(self):
        rt = getattr(self, "_rt", None)
        if rt is not None and rt.pid == os.getpid():
            rt.close()

    # ---------------------------------------------------------------- order and length
    def _order(self, epoch):
        key = (self.num_samples, self.seed, epoch, self.shuffle, self.block_size)
        c = self._order_cache
        if c is None or c[0] != key:
            c = self._order_cache = (key, epoch_order(self.num_samples, self.seed, epoch,
                                                      self.shuffle, self.block_size))
        return c[1]

    def __len__(self):
        """Batches (samples when batch_size is None) this rank yields in a whole epoch."""
        rank, world = self._dist()
        return _Layout(self.num_samples, 0, world, rank, self.batch_size or 1, self.drop_last).count

    def set_epoch(self, epoch):
        """Select the epoch (its order). A different epoch starts at its beginning; the current
        epoch keeps its position (so set_epoch after load_state_dict resumes mid-epoch)."""
        epoch = int(epoch)
        if epoch != self._epoch:
            self._epoch, self._consumed, self._resume = epoch, 0, None

    @property
    def epoch(self):
        return self._epoch

    # ---------------------------------------------------------------- state (torchdata Stateful)
    def state_dict(self):
        """The global position: {"epoch", "samples_consumed", "seed", ...} — identical on every
        rank, valid for any world size. Inside DataLoader workers (StatefulDataLoader) each
        worker's state also carries "worker", for an exact resume with the same layout;
        global_state() turns a StatefulDataLoader state into a global one."""
        st = {
            "_tag": _STATE_TAG, "version": _STATE_VERSION,
            "epoch": self._epoch, "samples_consumed": int(self._consumed),
            "seed": self.seed, "shuffle": self.shuffle, "block_size": self.block_size,
            "num_samples": self.num_samples, "batch_size": self.batch_size,
            "drop_last": self.drop_last,
        }
        if self._worker_progress is not None:
            st["worker"] = dict(self._worker_progress)
        return st

    def load_state_dict(self, state):
        if not isinstance(state, dict) or state.get("_tag") != _STATE_TAG:
            raise ValueError("ArrayDataset.load_state_dict: not a state saved by ArrayDataset.state_dict()")
        if int(state["num_samples"]) != self.num_samples:
            raise ValueError(f"ArrayDataset.load_state_dict: the state is for {state['num_samples']} "
                             f"samples, this dataset has {self.num_samples}")
        self.seed = int(state["seed"])
        self.shuffle = bool(state["shuffle"])
        self.block_size = state["block_size"]
        self._epoch = int(state["epoch"])
        self._consumed = int(state["samples_consumed"])
        self._resume = dict(state["worker"]) if state.get("worker") else None
        self._worker_progress = None
        self._order_cache = None

    # ---------------------------------------------------------------- iteration
    def __iter__(self):
        return self._iterate()

    def _iterate(self):
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

        # where this pass starts
        skip = 0
        res, self._resume = self._resume, None
        prev = self._worker_progress
        if res is not None:
            want = {"id": wid, "num_workers": nw, "world_size": world, "rank": rank, "batch": batch}
            got = {k: res.get(k) for k in want}
            if got != want:
                raise ValueError(
                    "ArrayDataset: this state was saved by DataLoader worker %r and resumes exactly "
                    "only with the same layout %r (here %r). To resume with other ranks or workers, "
                    "load ferry.torch.global_state(loader.state_dict()) into the dataset with "
                    "ds.load_state_dict() before building the DataLoader." % (res.get("id"), got, want))
            start, skip = int(res["start"]), int(res["taken"])
            if res.get("ended"):
                skip = None   # this worker had finished the epoch
        elif in_worker and prev is not None and prev.get("ended") and prev.get("epoch") == self._epoch:
            # a persistent worker starting its next pass: the next epoch
            self._epoch, self._consumed = self._epoch + 1, 0
            start = 0
        else:
            start = self._consumed
            if start >= n and not in_worker:   # a state saved after the last batch
                start = n
        epoch = self._epoch
        lay = _Layout(n, start, world, rank, batch, self.drop_last)
        mine = [] if skip is None else range(wid + skip * nw, lay.count, nw)
        taken = 0 if skip is None else skip
        if in_worker:
            self._worker_progress = {"id": wid, "num_workers": nw, "world_size": world, "rank": rank,
                                     "batch": batch, "start": start, "taken": taken, "epoch": epoch,
                                     "count": lay.count, "ended": False}
        order = self._order(epoch)
        per_sample = self.batch_size is None
        group_units = self.sample_group if per_sample else 1
        unit_iter = iter(mine)

        pending = collections.deque()
        retiring = collections.deque()

        def submit_next():
            units = []
            for s in unit_iter:
                units.append(s)
                if len(units) == group_units:
                    break
            if not units:
                return False
            pending.append(self._submit(rt, order, lay, units))
            return True

        exhausted = False
        try:
            while True:
                while not exhausted and len(pending) < self.prefetch + 1:
                    exhausted = not submit_next()
                if not pending:
                    break
                g = pending.popleft()
                outs = self._handoff(rt, g, retiring)
                self._retire(retiring, block=False)
                for s, out in zip(g.units, outs):
                    if gen == self._generation:
                        taken += 1
                        # the last batch of a drop_last epoch completes it (the tail is dropped)
                        self._consumed = n if (self.drop_last and s == lay.count - 1) \
                            else lay.consumed_after(s)
                        if in_worker:
                            self._worker_progress["taken"] = taken
                    yield out
            if gen == self._generation:
                if in_worker:
                    self._worker_progress["ended"] = True
                else:
                    self._epoch, self._consumed = epoch + 1, 0
        finally:
            # buffers must outlive the engine's use of them
            for g in pending:
                try:
                    if g.job is not None:
                        g.job.wait()
                except Exception:
                    pass
                self._release(rt, g)
            pending.clear()
            self._retire(retiring, block=True, raise_errors=False)

    # ---------------------------------------------------------------- reading
    def _alloc(self, rt, shape, dtype, pinned=False):
        if rt.device.type == "cuda" and pinned:
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        if rt.device.type == "cuda":
            with torch.cuda.stream(rt.alloc_stream):
                return torch.empty(shape, dtype=dtype, device=rt.device)
        if get_worker_info() is not None:
            return torch.empty(shape, dtype=dtype).share_memory_()   # no copy when sent to the loader
        if self.pin_memory and torch.cuda.is_available():
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        return torch.empty(shape, dtype=dtype)

    def _submit(self, rt, order, lay, units):
        ranges = [lay.unit(s) for s in units]
        ids = order[ranges[0][0]:ranges[0][1]] if len(ranges) == 1 else \
            np.concatenate([order[lo:hi] for lo, hi in ranges])
        total = len(ids)
        g = _Group()
        g.units, g.sizes, g.handles, g.job, g.path = units, [hi - lo for lo, hi in ranges], [], None, None
        g.bufs = [self._alloc(rt, (total,) + f.shape, f.dtype, self._staging[f.name]) for f in self._fields]
        plan = _ferry.Plan()
        for f, buf in zip(self._fields, g.bufs):
            if f.row_bytes == 0 or total == 0:
                continue
            dev = buf.device.index if buf.is_cuda else -1
            self._plan_field(rt, plan, f, ids, buf.data_ptr(), total * f.row_bytes, dev, g.handles)
        if len(plan):
            g.job = rt.ctx.submit(plan)
        return g

    def _plan_field(self, rt, plan, f, ids, ptr, nbytes, dev, handles):
        if len(f.shards) == 1:
            shard_idx = np.zeros(len(ids), dtype=np.int64)
            local = ids
        else:
            shard_idx = np.searchsorted(f.starts, ids, side="right") - 1
            local = ids - f.starts[shard_idx]
        if len(ids) > 1:
            brk = np.flatnonzero((np.diff(local) != 1) | (np.diff(shard_idx) != 0)) + 1
            run_lo = np.concatenate(([0], brk))
            run_hi = np.concatenate((brk, [len(ids)]))
        else:
            run_lo, run_hi = np.array([0]), np.array([len(ids)])
        rb = f.row_bytes
        dst = (ptr, nbytes, dev)
        seen = {}
        for j0, j1, k, row in zip(run_lo.tolist(), run_hi.tolist(),
                                  shard_idx[run_lo].tolist(), local[run_lo].tolist()):
            sh = f.shards[k]
            cnt = j1 - j0
            if sh.contiguous:
                key = ("file", sh.path)
                e = seen.get(key) or rt.handle(key, lambda p=sh.path: _ferry.File(rt.ctx, p))
                plan.read_file(e[0], sh.offset + row * rb, cnt * rb, dst, j0 * rb)
            else:
                key = ("ds", sh.path, sh.group)
                e = seen.get(key) or rt.handle(
                    key, lambda s=sh: _ferry.Dataset(rt.ctx, s.path) if s.group is None
                    else _ferry.Dataset(rt.ctx, s.path, group=s.group))
                sel = [(row, row + cnt, 1)] + [(0, d, 1) for d in f.stored_shape]
                plan.read(e[0], sh.name, (ptr + j0 * rb, cnt * rb, dev), selection=sel, native=True)
            if key not in seen:
                seen[key] = e
                e[1] += 1
                handles.append(e)

    def _release(self, rt, g):
        for e in g.handles:
            e[1] -= 1
        g.handles = []

    def _retire(self, retiring, block, raise_errors=True):
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
        job = g.job
        if job is not None:
            g.path = job.path
            self.last_path = g.path
        if rt.device.type != "cuda":
            if job is not None:
                job.wait()
            self._release(rt, g)
            return self._finish(g)
        consumer = torch.cuda.current_stream(rt.device)
        host = [not b.is_cuda for b in g.bufs]          # fields read into pinned host memory
        pinned = any(host)
        side = pinned or bool(self._convert) or self.transform is not None
        stream = rt.work_stream if side else consumer
        if job is not None:
            if pinned:
                job.wait()                    # host-path reads complete before torch copies them
            if not all(host):
                job.stream_wait(stream.cuda_stream)   # the engine's device copies, no host wait
            if pinned or job.done():
                if not pinned:
                    job.wait()                # surfaces a read error now rather than later
                self._release(rt, g)
            else:
                retiring.append(g)            # buffers stay referenced until the job is done
        else:
            self._release(rt, g)
        if side:
            with torch.cuda.stream(stream):
                for b, h in zip(g.bufs, host):
                    if not h:
                        b.record_stream(stream)
                # pinned blocks are reused only after these copies (torch records the stream)
                g.bufs = [b.to(rt.device, non_blocking=True) if h else b for b, h in zip(g.bufs, host)]
                outs = self._finish(g)
            consumer.wait_stream(stream)
        else:
            outs = self._finish(g)
        for o in outs:
            _record(o, consumer)
        return outs

    def _finish(self, g):
        """Cast/normalise the group's buffers, split into units, apply the transform."""
        tensors = []
        for f, b in zip(self._fields, g.bufs):
            c = self._convert.get(f.name)
            tensors.append(b if c is None else _apply_convert(b, c, f))
        outs = []
        per_sample = self.batch_size is None
        if per_sample:
            parts = [[t[i] for i in range(len(g.sizes))] for t in tensors]
        else:
            parts = [[t] for t in tensors]
        for i in range(len(g.units)):
            if self._single:
                o = parts[0][i]
            else:
                o = {f.name: p[i] for f, p in zip(self._fields, parts)}
            if self.transform is not None:
                o = self.transform(o)
            outs.append(o)
        return outs

    # ---------------------------------------------------------------- introspection
    def stats(self):
        """The engine's statistics for this process (ferry.Context.stats()), or {}."""
        rt = self._rt
        return rt.ctx.stats() if rt is not None and rt.pid == os.getpid() else {}

    def __repr__(self):
        return (f"ArrayDataset({self.num_samples} samples, fields={self._fields}, "
                f"batch_size={self.batch_size}, shuffle={self.shuffle}, epoch={self._epoch}, "
                f"consumed={self._consumed})")


_norm_cache = {}


def _apply_convert(t, conv, f):
    dt, nm = conv
    if nm is None:
        return t if t.dtype == dt else t.to(dt)
    mean, inv_std = nm
    key = (mean.tobytes(), inv_std.tobytes(), dt, t.device, t.dim())
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


# --------------------------------------------------------------------------------------------
# StatefulDataLoader states -> one global state
# --------------------------------------------------------------------------------------------
def _find_states(obj, out):
    if isinstance(obj, dict):
        if obj.get("_tag") == _STATE_TAG:
            out.append(obj)
            return
        for v in obj.values():
            _find_states(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _find_states(v, out)


def global_state(loader_state):
    """A global ArrayDataset state from a StatefulDataLoader.state_dict() (any number of
    workers): load it with ArrayDataset.load_state_dict() to resume with any number of ranks or
    workers. With several ranks, any one rank's loader state will do."""
    states = []
    _find_states(loader_state, states)
    if not states:
        raise ValueError("global_state: no ArrayDataset state in this state dict")
    workers = [s for s in states if s.get("worker")]
    if not workers:
        return max(states, key=lambda s: (s["epoch"], s["samples_consumed"]))
    # the DataLoader hands batches over in order, so the furthest worker marks the global position
    epoch = max(s["worker"]["epoch"] for s in workers)
    cur = [s for s in workers if s["worker"]["epoch"] == epoch]
    base = dict(cur[0])
    base.pop("worker", None)
    n = int(base["num_samples"])
    nw = cur[0]["worker"]["num_workers"]
    if len(cur) == nw and all(s["worker"]["ended"] for s in cur):
        base.update(epoch=epoch + 1, samples_consumed=0)
        return base
    steps = 0
    for s in cur:
        w = s["worker"]
        if w["taken"] > 0:
            steps = max(steps, w["id"] + (w["taken"] - 1) * w["num_workers"] + 1)
    w = cur[0]["worker"]
    consumed = min(n, w["start"] + steps * w["world_size"] * w["batch"])
    if consumed >= n or steps >= w.get("count", steps + 1):     # the epoch was complete
        base.update(epoch=epoch + 1, samples_consumed=0)
    else:
        base.update(epoch=epoch, samples_consumed=consumed)
    return base


def __getattr__(name):
    # XarrayDataset lives in its own module (it needs xarray, which ArrayDataset does not)
    if name == "XarrayDataset":
        from ._xarray_dataset import XarrayDataset
        return XarrayDataset
    raise AttributeError(f"module 'ferry.torch' has no attribute {name!r}")
