"""Checkpoints through the ferry engine: safetensors files, GPU <-> file, atomic.

    import ferry.checkpoint as ckpt
    ckpt.save(model.state_dict(), "step1000.safetensors")          # GPU -> file, durable, atomic
    sd = ckpt.load("step1000.safetensors", device="cuda:0")       # file -> GPU, one engine plan
    ckpt.load_into(model, "step1000.safetensors")                 # fill existing tensors in place
    fut = ckpt.async_save(model.state_dict(), "step2000.safetensors"); fut.blocked_s
    with ckpt.safe_open("step1000.safetensors", device=0) as f:
        w = f.get_slice("lm_head.weight")[:, :1024]              # reads only the needed bytes
    data = ckpt.save_bytes(sd); sd = ckpt.load_bytes(data)        # as safetensors.torch.save/load
    torch.distributed.checkpoint.save(sd, storage_writer=ckpt.FerryWriter("ckpt/"))

Files are plain safetensors: `safetensors.torch.load_file` reads what ferry writes, and
ferry reads what safetensors and Hugging Face (sharded, model.safetensors.index.json)
write. The header is padded with spaces so tensor data start 4 KiB-aligned, and tensors are
ordered so that almost all of them start on 4 KiB boundaries (see checkpoint/st.py). Nested
state dicts and non-tensor values (an optimizer's state_dict, step counters, numpy RNG
state, ...) are kept in the header's __metadata__ (key "ferry.tree") and come back with
their types; numpy arrays are stored as tensors.

Headers are parsed by the C library (ferry._ferry.Dataset) and tensor bytes are read
through the descriptors that parsed them; all tensor bytes move through ferry's engine.
Progress goes to progress= (off by default) and the "ferry.checkpoint" logger.
"""
from __future__ import annotations

import collections
import os

import ferry as _ferry_pkg

from . import background as _async
from . import io as _io
from . import open as _open
from . import remote as _remote
from . import run as _run
from . import writer as _save
from . import tree as _tree
from . import url as _url
from .. import _checks, _ferry, _nogpu

FerryError = _ferry.FerryError

__all__ = ["save", "load", "load_into", "safe_open", "async_save", "save_bytes", "load_bytes",
           "FerryWriter", "FerryReader", "FerryError", "reserve_pinned", "release_pinned",
           "parse_size"]

CRC_KEY = _open.CRC_KEY
INDEX_SUFFIX = _open.INDEX_SUFFIX
reserve_pinned = _async.reserve_pinned
release_pinned = _async.release_pinned

IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def __getattr__(name):           # the DCP plugin imports torch.distributed lazily
    if name in ("FerryWriter", "FerryReader"):
        from . import dcp as _ckpt_dcp
        return getattr(_ckpt_dcp, name)
    raise AttributeError("module 'ferry.checkpoint' has no attribute %r" % name)


def _torch():
    import torch
    return torch


def _device(device):
    torch = _torch()
    dev = _ferry_pkg._torch_device(device)   # the package's one device parser
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", _ferry_pkg._current_cuda_device())   # the package's one resolver
    return dev


def parse_size(s):
    """Bytes of a size, as every size in ferry is read (ferry.parse_size, the C library's
    ferry_size_parse): "5GB" = 5·10⁹ as Hugging Face reads it, "5GiB" = "5G" = 5·2³⁰; a bare
    number or int is bytes. None stays None."""
    if s is None:
        return None
    if isinstance(s, bool):
        raise TypeError("ferry.checkpoint: a size must be bytes (int) or a string like '5GB'")
    return _ferry_pkg.parse_size(s)



def _max_shard_bytes(max_shard_size):
    return _checks.check_size("ferry.checkpoint", "max_shard_size", max_shard_size)


def _save_target(path, metadata, max_shard_size):
    """What save and async_save check before anything else: (kind, path, user metadata,
    max shard bytes, fsspec filesystem and inner path for URLs fsspec writes, else None,
    None). kind: "local", "object" (s3://, gs://: the C library's uploads; http(s):// is
    refused here) or "url" (fsspec)."""
    kind, p = _url.split(path)
    user_md = _save.check_user_metadata(metadata)
    max_bytes = _max_shard_bytes(max_shard_size)
    fs = inner = None
    if kind == "url" and _url.is_object(p):
        _remote.check_writable(p)
        kind = "object"
    elif kind == "url":
        fs, inner = _url.filesystem(p)
        if max_bytes is not None:
            _io.fail("%s: sharded saves (max_shard_size) are for local paths, s3:// and gs://" % p,
                     _io.EUNSUPPORTED)
    return kind, p, user_md, max_bytes, fs, inner


# =============================================================================== save
def save(state_dict, path, metadata=None, *, crc32c=False, max_shard_size=None, threads=0,
         durable=True, progress=None):
    """Save a (nested) state dict as a safetensors file at `path`, atomically.

    Tensors may live on the CPU or any CUDA device, in any dtype safetensors names (bf16 and
    fp8 included); non-contiguous ones are made contiguous on their own device first. All
    bytes go through one engine plan (GPU tensors: GPU -> pinned staging -> file inside the
    engine), then the file is fsynced (durable=True), renamed over `path`, and the directory
    fsynced. A save that dies leaves any previous file at `path` untouched; its temporary
    (.<name>.ferry-tmp.*) never gets in the way of a later save and is removed by it.

    path: a local path, a file:// URL, an s3:// or gs:// object (written by the C library:
    one PUT, or an S3 multipart upload aborted on any failure, so the object appears whole
    or not at all; sharded saves upload the shards, then the index), or another URL
    (memory://, ...) written through fsspec when it is installed (refused otherwise);
    http:// and https:// are refused (no write protocol). The target is checked before
    anything is written: "" and directories are refused, as is a parent that is a file;
    missing parent directories are created; a symlink is followed (the file it names is
    replaced, the link stays).
    metadata: {str: str} stored in __metadata__. crc32c: store a CRC32C per tensor and one
    over the header (names, shapes, offsets, metadata, the structure and its values),
    checked by load. max_shard_size (bytes, "5GB" = 5·10⁹, "5GiB" = 5·2³⁰): when the
    tensors exceed it, write shards plus <path>.index.json under Hugging Face's names
    (model-00001-of-00004.safetensors ...), the index last, so a killed save leaves the
    previous set loadable and a reader never gets two saves mixed (docs/checkpoint.md). progress: None, True/"tqdm",
    or progress(done_bytes, total_bytes). Tensors that are the very same view of one
    storage (tied weights) are stored once and tied again by ferry's load.
    """
    threads = _checks.check("ferry.checkpoint.save", "threads", threads)
    kind, p, user_md, max_bytes, fs, inner = _save_target(path, metadata, max_shard_size)
    if kind == "object":
        prep = _save.Prepared(state_dict, crc32c)
        with _run.Timer("save", p) as tm:
            tm.nbytes = prep.nbytes
            _remote.save(prep, p, user_md, max_bytes, threads,
                         _run.reporter(progress, "save " + p.rsplit("/", 1)[-1], prep.nbytes))
        return
    if kind == "url":
        data = save_bytes(state_dict, metadata, crc32c=crc32c, threads=threads,
                          progress=progress)
        with fs.open(inner, "wb") as f:
            f.write(data)
        _run.log.info("save %s: %d bytes through fsspec", p, len(data))
        return
    final = _save.check_target(p)
    prep = _save.Prepared(state_dict, crc32c)
    with _run.Timer("save", p) as tm:
        tm.nbytes = prep.nbytes
        _save.write(prep, final, user_md, max_bytes, threads, durable,
                    _run.reporter(progress, "save " + os.path.basename(p), prep.nbytes))


def save_bytes(state_dict, metadata=None, *, crc32c=False, threads=0, progress=None):
    """The bytes of the safetensors file save() would write (as safetensors.torch.save):
    written through the engine into an anonymous in-memory file, then returned."""
    threads = _checks.check("ferry.checkpoint.save_bytes", "threads", threads)
    user_md = _save.check_user_metadata(metadata)
    prep = _save.Prepared(state_dict, crc32c)
    with _url.MemFile() as mf:
        _save.write(prep, mf.path, user_md, None, threads, durable=False,
                    report=_run.reporter(progress, "save_bytes", prep.nbytes), direct=True)
        return mf.read()


# =============================================================================== load
def _open_ck(path, verify=True):
    """A Checkpoint for a local path or file:// URL, or an http(s)://, s3:// or gs://
    object (or directory URL) read by the C library; other URLs are read through fsspec
    into an in-memory file that lives as long as the Checkpoint."""
    kind, p = _url.split(path)
    if kind == "local":
        if p == "":
            _io.fail("ferry.checkpoint: empty path", _io.EINVAL)
        return _open.Checkpoint(p, verify=verify)
    if _url.is_object(p):
        return _open.Checkpoint(p, verify=verify, remote=True)
    fs, inner = _url.filesystem(p)
    if inner.endswith(INDEX_SUFFIX):
        _io.fail("%s: sharded checkpoints are loaded from local paths" % p, _io.EUNSUPPORTED)
    try:
        with fs.open(inner, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        _io.fail("%s: no such file" % p, -2)
    return _bytes_ck(data, p, verify)


def _bytes_ck(data, name, verify=True):
    mf = _url.MemFile(data)
    try:
        ck = _open.Checkpoint(mf.path, display=name, verify=verify)
    finally:
        mf.close()                       # the Dataset holds its own descriptor
    return ck


def _empty(e, device, shape=None):
    """torch.empty for tensor e, or FerryError naming the file and tensor (a damaged
    shape torch cannot lay out, e.g. a zero-size tensor whose strides overflow)."""
    shape = e.shape if shape is None else shape
    try:
        with _nogpu.device_alloc("%s: tensor %r" % (e.path, e.name), device):   # no GPU: said once
            return _torch().empty(shape, dtype=e.torch_dtype(), device=device)
    except (RuntimeError, OverflowError, ValueError) as err:
        _io.fail("%s: tensor %r of shape %s cannot be allocated: %s"
                 % (e.path, e.name, list(shape), err), _io.EFORMAT)


def _read_all(ck, names, device, threads, verify, dests=None, progress=None, what="load"):
    ops, out, devs = [], {}, set()
    for n in names:
        t = None if dests is None else dests.get(n)
        e = ck.entries[n]
        if t is None:
            t = _empty(e, device)
        out[n] = t
        if t.device.type == "cuda":
            devs.add(_io.cuda_index(t.device))
        if e.nbytes:
            ops.append((e.nbytes, lambda p, e=e, t=t: p.read(ck.ds, e.index, _io.buf(t))))
    total = sum(n for n, _ in ops)
    _run.run(ops, threads=threads, report=_run.reporter(progress, what, total),
             cuda_devices=devs)
    if verify:
        ck.verify(out)
    return out, total


def load(path, device="cpu", *, threads=0, verify=True, progress=None):
    """Load a checkpoint (a ferry or safetensors file, a sharded index, a directory
    holding one, a file:// URL, an http(s)://, s3:// or gs:// object or directory URL
    ("s3://b/ckpt/": its model.safetensors.index.json or model.safetensors; every object
    read pinned to the version it had when opened) or, through fsspec, another URL) into
    tensors torch
    allocates on `device` ("cpu", "cuda:N", N). All tensors of all shards are read by one
    engine plan, from the files whose headers were parsed. Nesting and non-tensor values
    saved by ferry come back as saved; plain safetensors files give {name: tensor}. Stored
    CRC32Cs are checked unless verify=False. progress: as in save()."""
    threads = _checks.check("ferry.checkpoint.load", "threads", threads)
    dev = _device(device)
    ck = _open_ck(path, verify)
    try:
        with _run.Timer("load", ck.path) as tm:
            tensors, tm.nbytes = _read_all(ck, list(ck.entries), dev, threads, verify,
                                           progress=progress)
        return ck.rebuild(tensors)
    finally:
        ck.close()


def load_bytes(data, device="cpu", *, threads=0, verify=True):
    """Load a checkpoint from the bytes of a safetensors file (as safetensors.torch.load;
    what save_bytes returns), through the C parser and the engine."""
    threads = _checks.check("ferry.checkpoint.load_bytes", "threads", threads)
    ck = _bytes_ck(data, "<bytes>", verify)
    try:
        tensors, _ = _read_all(ck, list(ck.entries), _device(device), threads, verify)
        return ck.rebuild(tensors)
    finally:
        ck.close()


def load_into(state_dict, path, *, strict=True, threads=0, verify=True, progress=None):
    """Fill the tensors of `state_dict` (a nested state dict, or an nn.Module) in place from
    a checkpoint, without a second copy of the model: contiguous tensors of the stored
    dtype are read straight into their memory (GPU or CPU); others through a temporary and
    copy_(). Non-tensor values in the file are ignored (use load() for those). Returns
    (missing_keys, unexpected_keys); strict=True raises FerryError if either is non-empty.
    Shapes must match. Numpy arrays stored by save are values, not targets."""
    threads = _checks.check("ferry.checkpoint.load_into", "threads", threads)
    torch = _torch()
    if isinstance(state_dict, torch.nn.Module):
        state_dict = state_dict.state_dict()
    ck = _open_ck(path, verify)
    try:
        return _load_into(ck, state_dict, strict, threads, verify, progress)
    finally:
        ck.close()


def _load_into(ck, state_dict, strict, threads, verify, progress):
    torch = _torch()
    pmap = ck.path_map()
    values = _tree.numpy_names(ck.tree) if ck.tree is not None else set()
    flat_file = ck.tree is None
    targets = list(_tree.leaf_tensors(state_dict))
    dests, copies, used, missing = {}, [], set(), []
    seen_mem = {}
    for p, t in targets:
        name = pmap.get(p)
        if name is None and flat_file:
            dotted = ".".join(str(k) for k in p)
            name = dotted if dotted in ck.entries else None
        if name is None or name not in ck.entries:
            missing.append(".".join(str(k) for k in p))
            continue
        used.add(name)
        e = ck.entries[name]
        e.torch_dtype()
        if tuple(t.shape) != e.shape:
            _io.fail("%s: tensor %r has shape %s in the file but %s in the state dict"
                     % (e.path, name, list(e.shape), list(t.shape)), _io.EINVAL)
        key = _tree._view_key(t)
        if key is not None and key in seen_mem:
            continue                       # tied: filled once
        if key is not None:
            seen_mem[key] = name
        if name in dests:                  # two different targets for one stored tensor
            copies.append((t, name))
            continue
        if t.dtype == e.dtype and t.is_contiguous() and t.device.type in ("cpu", "cuda"):
            dests[name] = t
        else:
            tmp = _empty(e, t.device)
            dests[name] = tmp
            copies.append((t, name))
    unexpected = [n for n in ck.entries if n not in used and n not in values]
    if strict and (missing or unexpected):
        _io.fail("%s: state dict and checkpoint differ: missing in the file %s; unexpected in "
                 "the file %s" % (ck.path, missing[:10], unexpected[:10]), _io.ENOTFOUND)
    with _run.Timer("load_into", ck.path) as tm:
        got, tm.nbytes = _read_all(ck, list(dests), None, threads, verify, dests=dests,
                                   progress=progress, what="load_into")
    with torch.no_grad():
        for t, name in copies:
            t.copy_(got[name])
    return IncompatibleKeys(missing, unexpected)


class _SliceView:
    """f.get_slice(name): shape/dtype, and [...] reads only the bytes of the selection."""

    def __init__(self, handle, name):
        self._h, self._name = handle, name
        self._e = handle._ck.entries[name]

    def get_shape(self):
        return list(self._e.shape)

    def get_dtype(self):
        return self._e.st

    @property
    def shape(self):
        return self._e.shape

    @property
    def dtype(self):
        return self._e.dtype

    def __getitem__(self, key):
        return self._h._read_slice(self._e, key)


def _normalize_key(key, shape):
    """Python indexing -> (per-dim (start, stop, step), result shape): the C library's one
    normaliser (ferry_select); this adds only torch's None (a new axis of 1)."""
    key = key if isinstance(key, tuple) else (key,)
    sel, box, squeeze = _ferry.normalize_selection(tuple(shape), tuple(k for k in key if k is not None))
    kept = iter(n for i, n in enumerate(box) if i not in squeeze)
    n_index = sum(k is not None and k is not Ellipsis for k in key)
    out = []
    for k in key:
        if k is None:
            out.append(1)
        elif k is Ellipsis:
            out.extend(next(kept) for _ in range(len(shape) - n_index))
        elif isinstance(k, slice):
            out.append(next(kept))
    out.extend(kept)
    return sel if sel is not None else [(0, n, 1) for n in shape], tuple(out)


class safe_open:
    """A safetensors-style handle: keys(), metadata(), get_tensor(name), get_slice(name)[..],
    get_tensors(names) (one plan). Works on single files and sharded indexes."""

    def __init__(self, path, framework="pt", device="cpu", *, threads=0, verify=True):
        if framework not in ("pt", "torch", "pytorch"):
            raise ValueError("ferry.checkpoint.safe_open gives torch tensors (framework='pt')")
        self._dev = _device(device)
        self._ck = _open_ck(path, verify)
        self._threads = _checks.check("ferry.checkpoint.safe_open", "threads", threads)
        self._verify = verify

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Release the file descriptors (tensors already read stay valid)."""
        self._ck.close()

    def keys(self):
        return list(self._ck.entries)

    def offset_keys(self):
        return [e.name for e in sorted(self._ck.entries.values(),
                                       key=lambda e: (e.path, e.offset))]

    def metadata(self):
        return self._ck.metadata

    def _entry(self, name):
        e = self._ck.entries.get(name)
        if e is None:
            raise error_notfound(self._ck.path, name)
        return e

    def _live(self):
        if self._ck.ds is None:
            _io.fail("%s: safe_open handle is closed" % self._ck.path, _io.EINVAL)

    def get_tensor(self, name):
        self._entry(name)
        self._live()
        return _read_all(self._ck, [name], self._dev, self._threads, self._verify)[0][name]

    def get_tensors(self, names=None):
        names = list(self._ck.entries) if names is None else list(names)
        for n in names:
            self._entry(n)
        self._live()
        return _read_all(self._ck, names, self._dev, self._threads, self._verify)[0]

    def get_slice(self, name):
        self._entry(name)
        return _SliceView(self, name)

    def load(self):
        """Everything, nesting restored (like ferry.checkpoint.load)."""
        return self._ck.rebuild(self.get_tensors())

    def _read_slice(self, e, key):
        torch = _torch()
        sel, out_shape = _normalize_key(key, e.shape)
        box_shape = tuple(len(range(*s)) for s in sel)
        dst = _empty(e, self._dev, box_shape)
        if dst.numel() == 0:
            return dst.reshape(out_shape)
        self._live()
        if self._verify and e.name in self._ck.crcs:
            # a stored CRC covers the whole tensor: read and verify it, then slice
            full = self.get_tensor(e.name)
            idx = tuple(slice(a, b, c) for a, b, c in sel)
            return full[idx].contiguous().reshape(out_shape)
        ops = [(dst.numel() * dst.element_size(),
                lambda p: self._ck.read_box(p, e, sel, dst))]
        _run.run(ops, threads=self._threads,
                 cuda_devices={_io.cuda_index(dst.device)} if dst.device.type == "cuda" else ())
        return dst.reshape(out_shape)


def error_notfound(path, name):
    return _io.error("%s: no tensor named %r" % (path, name), _io.ENOTFOUND)


def async_save(state_dict, path, metadata=None, *, crc32c=False, max_shard_size=None,
               threads=0, durable=True, snapshot="host", progress=None):
    """Save in the background; returns a concurrent.futures.Future (result: the path).

    The caller is blocked only while a snapshot is taken: snapshot="host" enqueues copies
    of every tensor into a reused, page-locked, 4 KiB-aligned host buffer (GPU tensors:
    asynchronous device-to-host copies on the current stream, so later work on that
    stream -- the next optimizer step -- is ordered after them); snapshot="device" clones
    GPU tensors on their GPU (fast, costs GPU memory). The writing thread waits for the
    copies, then writes through the engine exactly like save() (the same path checks,
    made before the snapshot). future.blocked_s is how long the caller was blocked. Saves
    run one after another in submission order. Fork-safe: a child starts its own writer."""
    threads = _checks.check("ferry.checkpoint.async_save", "threads", threads)
    kind, p, user_md, max_bytes, fs, inner = _save_target(path, metadata, max_shard_size)
    if kind == "object":

        def write(prep):
            with _run.Timer("async_save", p) as tm:
                tm.nbytes = prep.nbytes
                _remote.save(prep, p, user_md, max_bytes, threads,
                             _run.reporter(progress, "save " + p.rsplit("/", 1)[-1], prep.nbytes))
            return p
    elif kind == "url":

        def write(prep):
            with _url.MemFile() as mf:
                _save.write(prep, mf.path, user_md, None, threads, durable=False, direct=True)
                data = mf.read()
            with fs.open(inner, "wb") as f:
                f.write(data)
            return p
    else:
        final = _save.check_target(p)

        def write(prep):
            with _run.Timer("async_save", p) as tm:
                tm.nbytes = prep.nbytes
                _save.write(prep, final, user_md, max_bytes, threads, durable,
                            _run.reporter(progress, "save " + os.path.basename(p),
                                          prep.nbytes))
            return p
    return _async.async_save(state_dict, write, crc32c=crc32c, snapshot=snapshot)
