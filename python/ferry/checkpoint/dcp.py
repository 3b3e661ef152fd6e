"""torch.distributed.checkpoint storage through the ferry engine.

    import torch.distributed.checkpoint as dcp
    from ferry.checkpoint import FerryWriter, FerryReader
    dcp.save(state_dict, storage_writer=FerryWriter("ckpt/step100"))
    dcp.load(state_dict, storage_reader=FerryReader("ckpt/step100"))

Layout of a checkpoint directory:
    __<rank>_<token>.ferry   one file per rank: the raw bytes of every tensor chunk the rank
                             writes (C order, the tensor's dtype), each starting at a 4 KiB-
                             aligned offset; non-tensor items (DCP's BYTE_IO) as torch.save
                             blobs in the same file. <token> is random per save.
    .metadata                DCP's Metadata, pickled; storage_data maps each MetadataIndex to
                             a FerryStorageInfo(relative_path, offset, length, dtype, shape).
                             (`__<rank>.metadata` per rank with use_collectives=False.)

Each rank writes its whole file with one engine plan (GPU chunks go GPU -> pinned -> file in
the engine) and fsyncs it; the coordinator then writes .metadata atomically (temporary,
fsync, rename, directory fsync). .metadata is the commit point: a save that dies leaves the
previous checkpoint in the directory loadable, because new data files have new names; once
the new .metadata is in place the coordinator removes data files it does not name.

Loading runs one plan per rank. A read item that covers part of a stored chunk (loading with
a different world size or sharding) reads only the byte runs it needs. Directories of torch's
FileSystemWriter (.distcp files of torch.save archives) load the same way: where each
tensor's bytes start comes from its archive's zip directory and data.pkl (_ckpt_dcp_blob).
FerryReader also reads a directory at an http(s)://, s3:// or gs:// URL (storage_options= for
its endpoint and keys): .metadata read whole, the data files by range requests, each object
pinned to one version while it is read. FerryWriter writes local directories only.
"""
from __future__ import annotations

import dataclasses
import functools
import io
import os
import pickle
import re
import sys

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner,
                                                  SavePlan, SavePlanner, WriteItemType)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from torch.distributed.checkpoint.filesystem import _StorageInfo

from . import dcp_blob as _blob
from . import dcp_pickle as _pickle
from . import io as _io
from . import st as _st
from . import url as _url
from .. import _checks, _ferry

METADATA = ".metadata"
_DATA_RE = re.compile(r"^__\d+_[0-9a-f]+\.ferry$")


@dataclasses.dataclass(frozen=True)
class FerryStorageInfo:
    """Where one item of a DCP checkpoint lies: bytes [offset, offset+length) of
    relative_path. Tensors: raw C-order bytes of a chunk of `shape` and `dtype` at
    data_offset (None: at offset, the layout of checkpoints written before the torch.save
    framing). Travels from the ranks to the coordinator; directories written now store
    torch's _StorageInfo (see FerryWriter.finish); older ones store this."""
    relative_path: str
    offset: int
    length: int
    dtype: str | None = None          # "float32", ...; None for BYTE_IO items
    shape: tuple | None = None
    data_offset: int | None = None


# Directories written before the torch.save framing pickled this class under its module's
# name of that time, ferry._ckpt_dcp (before ferry.checkpoint was a package): that name is
# part of their .metadata, so it stays the pickled name and stays importable.
FerryStorageInfo.__module__ = "ferry._ckpt_dcp"
sys.modules.setdefault("ferry._ckpt_dcp", sys.modules[__name__])


LAYOUT_ATTR = "ferry_layout"      # Metadata attribute: {MetadataIndex: (data offset, dtype, shape)}


def _is_local_path(checkpoint_id):
    try:
        return _url.split(checkpoint_id)[0] == "local"
    except Exception:  # noqa: BLE001 — not a path at all: not ours
        return False


def _local_dir(path, who):
    """A DCP directory ferry reads and writes: a local path or a file:// URL. Other URLs are
    refused here, before anything is created (an s3:// id must never become ./s3:/...)."""
    kind, p = _url.split(path)
    if kind != "local":
        sch = _url.scheme(p)
        _io.fail("%s: %s reads and writes local directories only: ferry's DCP plugin does not take "
                 "%s:// checkpoint ids. For object storage, save a (gathered) state dict with "
                 "ferry.checkpoint.save(sd, \"%s://.../model.safetensors\", max_shard_size=...) and load "
                 "it with ferry.checkpoint.load (s3:// and gs://: S3 multipart upload), or use torch's "
                 "own storage writer and reader for %s:// (torch.distributed.checkpoint's FsspecWriter "
                 "and FsspecReader)" % (path, who, sch, sch, sch), _io.EUNSUPPORTED)
    return p


def _reader_dir(path, who):
    """A DCP directory FerryReader reads: a local path, a file:// URL, or an http(s)://, s3://
    or gs:// directory URL whose objects the C library reads (without its trailing '/')."""
    kind, p = _url.split(path)
    if kind == "url" and _url.is_object(p):
        p = p.rstrip("/")
        if "://" not in p or not p.split("://", 1)[1]:
            _io.fail("%s: no directory in the URL" % path, _io.EINVAL)
        return p
    return _local_dir(path, who)


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _object_name(directory, name):
    """directory + "/" + name for a DCP file named in the metadata: a plain name only (DCP
    writes __R_N.distcp and .metadata). An https server decodes %2f, '?' starts a query and
    '#' a fragment, so anything else could reach another object on the host."""
    if not name or name in (".", "..") or not _PLAIN_NAME.fullmatch(name):
        _io.fail("%s: corrupted DCP metadata: file name %r" % (directory, name), _io.EFORMAT)
    return directory + "/" + name


_MAX_METADATA = 1 << 30           # a .metadata object read whole at a URL


def _read_object(ctx, url):
    """The bytes of the object at url, read whole (pinned to one version throughout)."""
    f = _ferry.File(ctx, url, "r")
    try:
        if f.size > _MAX_METADATA:
            _io.fail("%s: %d bytes of DCP metadata, more than the %d read" % (url, f.size, _MAX_METADATA),
                     _io.EFORMAT)
        b = bytearray(f.size)
        if f.size and f.pread(b, 0) != f.size:
            _io.fail("%s: shorter than its size" % url, _io.EFORMAT)
        return bytes(b)
    finally:
        f.close()


def _gen_id():
    return os.urandom(8).hex()


def _dtype_name(dt):
    return str(dt).replace("torch.", "")


def _dtype_of(name):
    dt = getattr(torch, str(name), None)
    if not isinstance(dt, torch.dtype):
        raise _io.error("FerryReader: unknown dtype %r in checkpoint metadata" % (name,))
    return dt


def _keeps_error(fn):
    """DCP hands what a storage layer raises to the caller only inside its own
    CheckpointException (a BaseException), and an error reading .metadata only as the text
    of an AssertionError of its own. So the first FerryError of a save or load (reset()
    starts one) is kept in the writer's or reader's .error, for the caller to raise:
        except CheckpointException as e: raise reader.error or e"""
    @functools.wraps(fn)
    def run(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except _io.FerryError as e:
            if getattr(self, "error", None) is None:
                self.error = e
            raise
    return run


class FerryWriter(StorageWriter):
    """StorageWriter writing raw, 4 KiB-aligned tensor bytes per rank through ferry.

    path: the checkpoint directory (created if missing). threads: engine workers (0: the
    context's). sync_files: fsync data files before the metadata is written (durable).
    overwrite: allow saving over an existing checkpoint in `path` (safely: see module doc).
    error: the first FerryError of the last save (DCP raises it wrapped in its
    CheckpointException; `raise writer.error or e` gives it back with its path)."""

    def __init__(self, path=None, *, threads=0, sync_files=True, overwrite=True):
        super().__init__()
        self.path = _local_dir(path, type(self).__name__) if path is not None else None
        self.threads = _checks.check("ferry.checkpoint." + type(self).__name__, "threads", threads)
        self.sync_files = sync_files
        self.overwrite = overwrite
        self.rank = None
        self.is_coordinator = False
        self.use_collectives = True
        self.save_id = _gen_id()
        self.error = None          # the first FerryError of this save (see _keeps_error)

    # -- protocol ----------------------------------------------------------------
    def reset(self, checkpoint_id=None):
        self.error = None
        if checkpoint_id:
            self.path = _local_dir(checkpoint_id, type(self).__name__)
        self.save_id = _gen_id()

    @_keeps_error
    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self.error = None          # a save starts here (DCP calls reset() only with an id)
        if self.path is None:
            raise ValueError("FerryWriter: no checkpoint path (pass one or a checkpoint_id)")
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def storage_meta(self):
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _is_local_path(checkpoint_id)

    @_keeps_error
    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        os.makedirs(self.path, exist_ok=True)
        if not self.overwrite and os.path.exists(os.path.join(self.path, METADATA)):
            raise RuntimeError("FerryWriter: a checkpoint exists in %s and overwrite=False"
                               % self.path)
        if self.rank is not None and not self.use_collectives:
            plan = dataclasses.replace(plan, storage_data="__%d_" % self.rank)
        return plan

    def prepare_global_plan(self, plans):
        return [dataclasses.replace(p, storage_data="__%d_" % i) if p.storage_data is None
                else p for i, p in enumerate(plans)]

    @_keeps_error
    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        prefix = plan.storage_data if isinstance(plan.storage_data, str) else \
            "__%d_" % (self.rank or 0)
        fname = "%s%s.ferry" % (prefix, _gen_id())
        fpath = os.path.join(self.path, fname)
        pieces = []          # (file offset, buffer): the frames and BYTE_IO blobs, tensors
        results = []
        off = 0
        devices = set()
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                data = planner.resolve_data(item)
                if isinstance(data, io.BytesIO):
                    raw = bytearray(data.getbuffer())
                else:
                    b = io.BytesIO()
                    torch.save(data, b)
                    raw = bytearray(b.getbuffer())
                pieces.append((off, raw))
                info = FerryStorageInfo(fname, off, len(raw))
                off += len(raw)
            else:
                t = planner.resolve_data(item).detach()
                if t.device.type not in ("cpu", "cuda"):
                    t = t.cpu()
                if not t.is_contiguous():
                    t = t.contiguous()
                nb = t.numel() * t.element_size()
                if t.device.type == "cuda":
                    devices.add(_io.cuda_index(t.device))
                head, tail = _blob.framing(t.dtype, t.shape)
                # the archive starts where its raw bytes land 4 KiB-aligned
                data_at = -(-(off + len(head)) // _st.ALIGN) * _st.ALIGN
                start = data_at - len(head)
                pieces += [(start, bytearray(head)), (data_at, t),
                           (data_at + nb, bytearray(tail))]
                info = FerryStorageInfo(fname, start, len(head) + nb + len(tail),
                                        _dtype_name(t.dtype), tuple(int(x) for x in t.shape),
                                        data_at)
                off = data_at + nb + len(tail)
            results.append(WriteResult(index=item.index, size_in_bytes=info.length,
                                       storage_data=info))
        ctx = _io.context()
        f = _ferry.File(ctx, fpath, "w")
        try:
            f.truncate(off)
            p = _ferry.Plan()
            for o, src in pieces:
                n = src.numel() * src.element_size() if isinstance(src, torch.Tensor) \
                    else len(src)
                if n:
                    p.write_file(f, o, n, _io.buf(src) if isinstance(src, torch.Tensor)
                                 else src)
            _io.wait_devices(p, devices)
            if len(p):
                ctx.run(p, threads=self.threads, sync=self.sync_files)
            elif self.sync_files:
                f.sync()
        except BaseException:
            f.close()
            try:
                os.unlink(fpath)
            except OSError:
                pass
            raise
        f.close()
        fut = Future()
        fut.set_result(results)
        return fut

    @_keeps_error
    def finish(self, metadata: Metadata, results) -> None:
        # storage_data holds torch's own _StorageInfo, so FileSystemReader (and
        # dcp_to_torch_save) read the directory; where ferry's raw bytes start inside each
        # archive goes in an extra attribute torch ignores: builtins and MetadataIndex only.
        storage, layout = {}, {}
        for rs in results:
            for wr in rs:
                i = wr.storage_data
                storage[wr.index] = _StorageInfo(i.relative_path, i.offset, i.length)
                if i.dtype is not None:
                    layout[wr.index] = (i.data_offset, i.dtype, tuple(i.shape))
        metadata.storage_data = storage
        setattr(metadata, LAYOUT_ATTR, layout)
        metadata.storage_meta = self.storage_meta()
        if self.use_collectives or self.rank is None:
            name = METADATA
        else:
            name = "__%d%s" % (self.rank, METADATA)
        final = os.path.join(self.path, name)
        _io.remove_stale_temps(final)            # of coordinators killed earlier
        _io.write_small_file_atomic(final, pickle.dumps(metadata))
        if name == METADATA:
            used = set(info.relative_path for info in storage.values())
            for n in os.listdir(self.path):
                if _DATA_RE.match(n) and n not in used:
                    try:
                        os.unlink(os.path.join(self.path, n))
                    except OSError:
                        pass


_MISSING = object()


def _int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _ints(v):
    return isinstance(v, (tuple, list)) and all(_int(x) and x >= 0 for x in v)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _field(obj, name, p, what):
    v = getattr(obj, name, _MISSING)
    if v is _MISSING:
        raise _io.error("%s: corrupted DCP metadata: %s has no field %r" % (p, what, name))
    return v


def check_metadata(md, p):
    """Check unpickled DCP metadata before anything trusts it: every field there with the
    right type, tensor chunks inside their tensor and covering it, one storage record per
    chunk and per bytes item, and ferry's layout (data offset, dtype, shape) equal to what
    the tensor's own metadata says. FerryError naming p (the .metadata file) otherwise."""
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, MetadataIndex,
                                                       TensorStorageMetadata)

    def bad(msg):
        raise _io.error("%s: corrupted DCP metadata: %s" % (p, msg))

    sdm = _field(md, "state_dict_metadata", p, "Metadata")
    storage = _field(md, "storage_data", p, "Metadata")
    layout = getattr(md, LAYOUT_ATTR, None) or {}
    for name, v in (("state_dict_metadata", sdm), ("storage_data", storage),
                    (LAYOUT_ATTR, layout)):
        if not isinstance(v, dict):
            bad("%s is %s, not a dict" % (name, "None" if v is None else "a " + type(v).__name__))
    for idx, info in storage.items():
        if not isinstance(idx, MetadataIndex) or not isinstance(getattr(idx, "fqn", None), str):
            bad("storage_data key %r is not a MetadataIndex" % (idx,))
        if not isinstance(info, (_StorageInfo, FerryStorageInfo)):
            bad("storage_data[%s] is a %s" % (idx.fqn, type(info).__name__))
        rp = _field(info, "relative_path", p, "storage_data[%s]" % idx.fqn)
        off = _field(info, "offset", p, "storage_data[%s]" % idx.fqn)
        n = _field(info, "length", p, "storage_data[%s]" % idx.fqn)
        if not isinstance(rp, str) or not rp or "/" in rp or "\0" in rp or rp in (".", ".."):
            bad("storage_data[%s] names %r, not a file of the directory" % (idx.fqn, rp))
        if not (_int(off) and _int(n) and off >= 0 and n >= 0):
            bad("storage_data[%s] has offset %r, length %r" % (idx.fqn, off, n))
        if getattr(info, "transform_descriptors", None):
            raise _io.error("%s: storage_data[%s] is stored through transforms %r, which "
                            "FerryReader does not undo" % (p, idx.fqn,
                                                           info.transform_descriptors),
                            _io.EUNSUPPORTED)
    for fqn, m in sdm.items():
        if not isinstance(fqn, str):
            bad("state dict key %r is not a string" % (fqn,))
        if isinstance(m, BytesStorageMetadata):
            if MetadataIndex(fqn) not in storage:
                bad("no storage record for bytes item %r" % fqn)
            continue
        if not isinstance(m, TensorStorageMetadata):
            bad("%r is described by a %s" % (fqn, type(m).__name__))
        props = _field(m, "properties", p, "metadata of %r" % fqn)
        dtype = _field(props, "dtype", p, "properties of %r" % fqn)
        size = _field(m, "size", p, "metadata of %r" % fqn)
        chunks = _field(m, "chunks", p, "metadata of %r" % fqn)
        if not isinstance(dtype, torch.dtype) or not _ints(size) or not isinstance(chunks, list):
            bad("%r has dtype %r, size %r, chunks of type %s"
                % (fqn, dtype, size, type(chunks).__name__))
        covered = 0
        for c in chunks:
            offs = _field(c, "offsets", p, "a chunk of %r" % fqn)
            sizes = _field(c, "sizes", p, "a chunk of %r" % fqn)
            if not (_ints(offs) and _ints(sizes) and len(offs) == len(sizes) == len(size)) or \
                    any(o + s > n for o, s, n in zip(offs, sizes, size)):
                bad("%r: chunk at %s of %s is not inside its %s tensor"
                    % (fqn, offs, sizes, list(size)))
            covered += _numel(sizes)
            idx = MetadataIndex(fqn, offs)
            info = storage.get(idx)
            if info is None:
                bad("no storage record for chunk %s of %r" % (list(offs), fqn))
            if isinstance(info, FerryStorageInfo):
                lay = (info.offset, info.dtype, info.shape)
            else:
                lay = layout.get(idx)
            if lay is None:
                continue                  # a torch FileSystemWriter record
            ok = isinstance(lay, tuple) and len(lay) == 3 and _int(lay[0]) and lay[0] >= 0 \
                and _ints(lay[2])
            if not ok or lay[1] != _dtype_name(dtype) or tuple(lay[2]) != tuple(sizes):
                bad("%r: ferry layout %r disagrees with the tensor's metadata (%s, chunk %s)"
                    % (fqn, lay, _dtype_name(dtype), list(sizes)))
        if covered != _numel(size):
            bad("%r: chunks hold %d elements of its %d (size %s)"
                % (fqn, covered, _numel(size), list(size)))
    for idx in layout:
        if idx not in storage:
            bad("ferry layout for %s, which has no storage record" % (idx,))


def inside(root, path, what="directory"):
    """path, refused (FerryError) when it resolves outside root: the rule and the words of
    the C library's multi-file formats (src/formats/inside.c)."""
    r, top = os.path.realpath(path), os.path.realpath(root)
    if r != top and not r.startswith(top.rstrip("/") + "/"):
        _io.fail("%s: resolves to %s, outside the %s %s (a symlink leading out is refused)"
                 % (path, r, what, top), -13)
    return path


def _pread_at(f, base):
    """pread(n, at): n bytes at byte base + at of ferry File f (ValueError if short)."""
    def pread(n, at):
        b = bytearray(n)
        if n and f.pread(b, base + at) != n:
            raise ValueError("%s: short read of %d bytes at %d" % (f.path, n, base + at))
        return b
    return pread


def _holds_tensor(planner, fqn):
    sd = getattr(planner, "state_dict", None)
    v = sd.get(fqn, None) if isinstance(sd, dict) else None
    return isinstance(v, torch.Tensor) or type(v).__name__ == "ShardedTensor"


class FerryReader(StorageReader):
    """StorageReader for checkpoints written by FerryWriter, or by torch's own
    FileSystemWriter (its torch.save archives, read without unpickling anything that can
    run code). threads: engine workers.

    safe=True (the default): nothing in the directory can run code. .metadata is read
    with a restricted unpickler that builds only DCP's metadata types (FerryError for
    anything else, and for attribute setting on anything it did not build); non-tensor
    items (DCP's bytes items) are read with torch.load(weights_only=True) and handed to
    the planner re-saved from what that built, so the planner's own torch.load sees only
    plain values; a key stored as bytes where the state dict holds a tensor is refused.

    safe=False runs the directory's pickles: .metadata is unpickled as torch's
    FileSystemReader unpickles it, and bytes items go to the planner as stored (torch's
    DefaultLoadPlanner torch.load()s them with weights_only=False). Only for directories
    you trust, or non-tensor values torch.load(weights_only=True) refuses.

    path may be a directory URL (s3://bucket/ckpt/step100, gs://..., https://...): the
    objects are read by the C library, with storage_options (endpoint_url, key, secret, anon,
    ...: ferry._remote) or the environment's settings.

    error: the first FerryError of the last load. DCP raises it wrapped in its
    CheckpointException (a BaseException; a .metadata error only as text inside an
    AssertionError), so `except CheckpointException as e: raise reader.error or e` gives
    the caller the FerryError naming the file."""

    def __init__(self, path=None, *, threads=0, safe=True, storage_options=None):
        super().__init__()
        self.path = _reader_dir(path, type(self).__name__) if path is not None else None
        self.storage_options = dict(storage_options) if storage_options else None
        self.threads = _checks.check("ferry.checkpoint." + type(self).__name__, "threads", threads)
        self.safe = safe
        self.storage_data = {}
        self.layout = {}
        self.load_id = _gen_id()
        self.rank = None
        self.metadata = None
        self.error = None          # the first FerryError of this load (see _keeps_error)

    def reset(self, checkpoint_id=None):
        self.error = None
        self.storage_data = {}
        if checkpoint_id:
            self.path = _reader_dir(checkpoint_id, type(self).__name__)
        self.load_id = _gen_id()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        if _is_local_path(checkpoint_id):
            return True
        try:
            kind, p = _url.split(checkpoint_id)
            return kind == "url" and _url.is_object(p)
        except Exception:  # noqa: BLE001 — not a path at all: not ours
            return False

    def _remote(self):
        return _url.split(self.path)[0] == "url"

    def _ctx(self):
        """The context reads run on: storage_options' (ferry._remote), else the default."""
        if self.storage_options:
            from .._remote import remote_context
            return remote_context(self.storage_options)
        return _io.context()

    def _file(self, ctx, relative_path):
        """The ferry File of a DCP data file named in the metadata (its basename, inside the
        directory: a symlink leading out of a local one is refused)."""
        name = os.path.basename(relative_path)
        if self._remote():
            return _ferry.File(ctx, _object_name(self.path, name), "r")
        return _ferry.File(ctx, inside(self.path, os.path.join(self.path, name)), "r")

    @_keeps_error
    def read_metadata(self, *args, **kwargs) -> Metadata:
        rank = kwargs.get("rank")
        if rank is None:
            self.error = None      # a load starts here (DCP calls reset() only with an id)
        name = METADATA if rank is None else "__%d%s" % (rank, METADATA)
        remote = self._remote()
        p = _object_name(self.path, name) if remote else os.path.join(self.path, name)
        try:
            if remote:
                try:
                    data = _read_object(self._ctx(), p)
                except _io.FerryError as e:
                    if getattr(e, "code", None) == -2:
                        raise FileNotFoundError(p)
                    raise
                md = _pickle.load(io.BytesIO(data), p, self.safe)
            else:
                with open(inside(self.path, p), "rb") as f:
                    md = _pickle.load(f, p, self.safe)
        except FileNotFoundError:
            raise _io.error("%s: no DCP metadata (not a checkpoint, or the save did not "
                            "finish)" % p, -2)
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError,
                ValueError, IndexError, KeyError, RecursionError, OverflowError,
                MemoryError, UnicodeDecodeError) as e:
            raise _io.error("%s: corrupted DCP metadata: %s: %s" % (p, type(e).__name__, e))
        if not isinstance(md, Metadata):
            raise _io.error("%s: not DCP metadata" % p)
        check_metadata(md, p)
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        elif not isinstance(md.storage_meta, StorageMeta):
            raise _io.error("%s: corrupted DCP metadata: storage_meta is a %s"
                            % (p, type(md.storage_meta).__name__))
        md.storage_meta.load_id = self.load_id
        return md

    @_keeps_error
    def set_up_storage_reader(self, metadata: Metadata, is_coordinator, *args, **kwargs):
        self.storage_data = metadata.storage_data
        self.metadata = metadata
        self.layout = getattr(metadata, LAYOUT_ATTR, None) or {}
        if not isinstance(self.layout, dict):
            raise _io.error("%s: corrupted ferry layout in the DCP metadata" % self.path)
        self.rank = kwargs.get("rank")
        if not isinstance(self.storage_data, dict):
            raise _io.error("%s: DCP metadata without ferry storage data" % self.path)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def _record(self, f, info, fqn):
        """(raw data start, length) of the torch.save archive at info in file f."""
        pread = _pread_at(f, info.offset)
        try:
            at, n = _blob.locate(pread, info.length, "%s: item %r (bytes [%d, %d))"
                                 % (f.path, fqn, info.offset, info.offset + info.length))
        except ValueError as e:
            raise _io.error("%s: corrupted checkpoint: %s" % (self.path, e), _io.EFORMAT)
        return info.offset + at, n

    def _foreign(self, f, info, item):
        """A tensor item of a directory torch's FileSystemWriter wrote: a torch.save
        archive of the chunk, described through its zip directory and data.pkl (read by a
        loader that builds nothing, _blob.describe) and checked against the tensor's
        metadata. ("raw", data start, dtype name, shape) for C-order data, read like
        FerryWriter's; ("strided", dtype, size, stride, element offset, storage start,
        storage bytes) otherwise."""
        fqn = item.storage_index.fqn
        what = "%s: item %r (bytes [%d, %d))" % (f.path, fqn, info.offset,
                                                 info.offset + info.length)
        try:
            dtype, size, stride, eoff, start, nb = _blob.describe(
                _pread_at(f, info.offset), info.length, what)
        except ValueError as e:
            raise _io.error("%s: corrupted checkpoint: %s" % (self.path, e), _io.EFORMAT)
        md = (getattr(self.metadata, "state_dict_metadata", None) or {}).get(fqn)
        want = None
        for c in getattr(md, "chunks", None) or ():
            if tuple(c.offsets) == tuple(item.storage_index.offset or ()):
                want = tuple(c.sizes)
        if md is None or md.properties.dtype != dtype or want != size:
            raise _io.error("%s: holds a %s tensor of shape %s; the metadata says %s of %s"
                            % (what, _dtype_name(dtype), list(size),
                               getattr(getattr(md, "properties", None), "dtype", None),
                               list(want) if want is not None else None), _io.EFORMAT)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if _numel(size) and eoff + sum((n - 1) * st for n, st in zip(size, stride)) >= \
                nb // itemsize:
            raise _io.error("%s: size %s, stride %s at element %d run past its %d-byte "
                            "storage" % (what, list(size), list(stride), eoff, nb), _io.EFORMAT)
        c_order, step = True, 1
        for n, st in reversed(list(zip(size, stride))):
            if n > 1 and st != step:
                c_order = False
            step *= n
        if c_order:
            return "raw", info.offset + start + eoff * itemsize, _dtype_name(dtype), size
        return "strided", dtype, size, stride, eoff, info.offset + start, nb

    def _bytes_for(self, item, raw, path):
        """What the planner gets for a bytes item: in safe mode the value as
        torch.load(weights_only=True) builds it, saved again."""
        if not self.safe:
            return io.BytesIO(bytes(raw))
        try:
            obj = torch.load(io.BytesIO(bytes(raw)), weights_only=True)
        except Exception as e:  # noqa: BLE001 — anything the loader refuses
            raise _io.error("%s: item %r: torch.load(weights_only=True) does not read its "
                            "bytes (%s: %s); FerryReader(safe=True) loads nothing else -- "
                            "pass safe=False only for a directory you trust"
                            % (path, item.storage_index.fqn, type(e).__name__,
                               str(e).splitlines()[0] if str(e) else ""), _io.EFORMAT)
        b = io.BytesIO()
        torch.save(obj, b)
        b.seek(0)
        return b

    @_keeps_error
    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        ctx = self._ctx()
        p = _ferry.Plan()
        files = {}
        after = []           # (kind, item, payload)
        devices = set()
        try:
            for item in plan.items:
                info = self.storage_data.get(item.storage_index)
                fqn = item.storage_index.fqn
                raw_at, dtype_name, shape, foreign = None, None, None, False
                if isinstance(info, FerryStorageInfo):          # before the torch framing
                    raw_at, dtype_name, shape = info.offset, info.dtype, info.shape
                elif isinstance(info, _StorageInfo) and (
                        item.type == LoadItemType.BYTE_IO or item.storage_index in self.layout):
                    if item.type != LoadItemType.BYTE_IO:
                        try:
                            raw_at, dtype_name, shape = self.layout[item.storage_index]
                            raw_at, shape = int(raw_at), tuple(int(x) for x in shape)
                        except (TypeError, ValueError):
                            raise _io.error("%s: corrupted ferry layout for %s"
                                            % (self.path, item.storage_index))
                elif isinstance(info, _StorageInfo):
                    foreign = True                 # torch's FileSystemWriter: a torch.save
                else:
                    raise _io.error("%s: no storage entry for %s in the DCP metadata"
                                    % (self.path, item.storage_index))
                f = files.get(info.relative_path)
                if f is None:
                    f = files[info.relative_path] = self._file(ctx, info.relative_path)
                if f.size < info.offset + info.length:
                    raise _io.error("%s: truncated: item %r needs bytes [%d, %d) but the file "
                                    "has %d" % (f.path, fqn, info.offset,
                                                info.offset + info.length, f.size),
                                    _io.EFORMAT)
                if item.type == LoadItemType.BYTE_IO:
                    if _holds_tensor(planner, fqn):
                        raise _io.error("%s: item %r is stored as bytes (a pickled value) but "
                                        "the state dict holds a tensor there: refused"
                                        % (f.path, fqn), _io.EFORMAT)
                    b = bytearray(info.length)
                    if info.length:
                        p.read_file(f, info.offset, info.length, b)
                    after.append(("bytes", item, (b, f.path)))
                    continue
                if foreign:
                    got = self._foreign(f, info, item)
                    if got[0] == "strided":            # not C order: the whole storage, then
                        _, dtype, size, stride, eoff, at, nb = got      # torch's own view
                        b = bytearray(nb)
                        if nb:
                            p.read_file(f, at, nb, b)
                        after.append(("strided", item, (b, dtype, size, stride, eoff)))
                        continue
                    _, raw_at, dtype_name, shape = got
                dtype = _dtype_of(dtype_name)
                shape = tuple(shape)
                itemsize = torch.empty((), dtype=dtype).element_size()
                nbytes = _numel(shape) * itemsize
                if foreign:
                    pass                               # placed by _foreign from the archive
                elif isinstance(info, FerryStorageInfo):
                    where = (raw_at, nbytes) if nbytes == info.length else None
                else:
                    where = self._record(f, info, fqn)
                    if nbytes == 0 and where[1] == 0:
                        where = (raw_at, 0)        # nothing to read: no position to agree on
                if not foreign and where != (raw_at, nbytes):
                    raise _io.error("%s: corrupted metadata for %r: shape %s of %s at byte %d "
                                    "(%d bytes) is not the item's stored data (%s)"
                                    % (f.path, fqn, list(shape), dtype_name, raw_at, nbytes,
                                       "%d bytes at %d" % (where[1], where[0]) if where
                                       else "%d bytes" % info.length))
                target = planner.resolve_tensor(item).detach()
                lengths = tuple(int(x) for x in item.lengths)
                sel = [(int(o), int(o) + L, 1) for o, L in zip(item.storage_offsets, lengths)]
                if tuple(target.shape) != lengths:
                    raise _io.error("%s: %s: the planner asks for a %s region into a %s tensor"
                                    % (self.path, fqn, list(lengths),
                                       list(target.shape)), _io.EINVAL)
                direct = (target.dtype == dtype and target.is_contiguous() and
                          target.device.type in ("cpu", "cuda"))
                if direct:
                    dst = target
                else:
                    dev = target.device if target.device.type in ("cpu", "cuda") else "cpu"
                    dst = torch.empty(lengths, dtype=dtype, device=dev)
                if dst.device.type == "cuda":
                    devices.add(_io.cuda_index(dst.device))
                # exact: every rank reads only the runs its box needs (ferry.h)
                p.read_array(f, raw_at, shape, itemsize, _io.buf(dst), selection=sel,
                             label=fqn, exact=True)
                after.append(("tensor", item, (target, dst)))
            _io.wait_devices(p, devices)
            if len(p):
                ctx.run(p, threads=self.threads)
        finally:
            for f in files.values():
                f.close()
        for kind, item, payload in after:
            if kind == "bytes":
                raw, path = payload
                planner.load_bytes(item, self._bytes_for(item, raw, path))
            elif kind == "strided":
                raw, dtype, size, stride, eoff = payload
                src = torch.frombuffer(raw, dtype=torch.uint8) if raw else \
                    torch.empty(0, dtype=torch.uint8)
                src = src.view(dtype).as_strided(size, stride, eoff)
                for dim, (o, n) in enumerate(zip(item.storage_offsets, item.lengths)):
                    src = src.narrow(dim, int(o), int(n))
                target = planner.resolve_tensor(item).detach()
                if tuple(target.shape) != tuple(src.shape):
                    raise _io.error("%s: %s: the planner asks for a %s region into a %s tensor"
                                    % (self.path, item.storage_index.fqn, list(src.shape),
                                       list(target.shape)), _io.EINVAL)
                with torch.no_grad():
                    target.copy_(src)
                planner.commit_tensor(item, target)
            else:
                target, dst = payload
                if dst is not target:
                    with torch.no_grad():
                        target.copy_(dst)
                planner.commit_tensor(item, target)
        fut = Future()
        fut.set_result(None)
        return fut
