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
a different world size or sharding) reads only the byte runs it needs.
"""
from __future__ import annotations

import dataclasses
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
from .. import _ferry

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
        _io.fail("%s: %s reads and writes local directories only (for object stores use torch's own "
                 "storage writers and readers, or ferry.checkpoint.save with an fsspec URL)" % (path, who),
                 _io.EINVAL)
    return p


def _gen_id():
    return os.urandom(8).hex()


def _dtype_name(dt):
    return str(dt).replace("torch.", "")


def _dtype_of(name):
    dt = getattr(torch, str(name), None)
    if not isinstance(dt, torch.dtype):
        raise _io.error("FerryReader: unknown dtype %r in checkpoint metadata" % (name,))
    return dt


class FerryWriter(StorageWriter):
    """StorageWriter writing raw, 4 KiB-aligned tensor bytes per rank through ferry.

    path: the checkpoint directory (created if missing). threads: engine workers (0: the
    context's). sync_files: fsync data files before the metadata is written (durable).
    overwrite: allow saving over an existing checkpoint in `path` (safely: see module doc)."""

    def __init__(self, path=None, *, threads=0, sync_files=True, overwrite=True):
        super().__init__()
        self.path = _local_dir(path, type(self).__name__) if path is not None else None
        self.threads = threads
        self.sync_files = sync_files
        self.overwrite = overwrite
        self.rank = None
        self.is_coordinator = False
        self.use_collectives = True
        self.save_id = _gen_id()

    # -- protocol ----------------------------------------------------------------
    def reset(self, checkpoint_id=None):
        if checkpoint_id:
            self.path = _local_dir(checkpoint_id, type(self).__name__)
        self.save_id = _gen_id()

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
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
        _io.write_small_file_atomic(final, pickle.dumps(metadata))
        if name == METADATA:
            used = set(info.relative_path for info in storage.values())
            for n in os.listdir(self.path):
                if _DATA_RE.match(n) and n not in used:
                    try:
                        os.unlink(os.path.join(self.path, n))
                    except OSError:
                        pass


class FerryReader(StorageReader):
    """StorageReader for checkpoints written by FerryWriter. threads: engine workers.

    .metadata is a pickle, read as torch's FileSystemReader reads it: unpickling a file
    from someone else can run code. safe=True reads it with a restricted unpickler that
    builds only DCP's metadata types (FerryError for anything else): use it for
    directories you do not trust."""

    def __init__(self, path=None, *, threads=0, safe=False):
        super().__init__()
        self.path = _local_dir(path, type(self).__name__) if path is not None else None
        self.threads = threads
        self.safe = safe
        self.storage_data = {}
        self.layout = {}
        self.load_id = _gen_id()
        self.rank = None

    def reset(self, checkpoint_id=None):
        self.storage_data = {}
        if checkpoint_id:
            self.path = _local_dir(checkpoint_id, type(self).__name__)
        self.load_id = _gen_id()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _is_local_path(checkpoint_id)

    def read_metadata(self, *args, **kwargs) -> Metadata:
        rank = kwargs.get("rank")
        name = METADATA if rank is None else "__%d%s" % (rank, METADATA)
        p = os.path.join(self.path, name)
        try:
            with open(p, "rb") as f:
                md = _pickle.load(f, p, self.safe)
        except FileNotFoundError:
            raise _io.error("%s: no DCP metadata (not a checkpoint, or the save did not "
                            "finish)" % p, -2)
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError,
                ValueError, IndexError, KeyError, RecursionError) as e:
            raise _io.error("%s: corrupted DCP metadata: %s" % (p, e))
        if not isinstance(md, Metadata):
            raise _io.error("%s: not DCP metadata" % p)
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator, *args, **kwargs):
        self.storage_data = metadata.storage_data
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

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        ctx = _io.context()
        p = _ferry.Plan()
        files = {}
        after = []           # (kind, item, payload)
        devices = set()
        try:
            for item in plan.items:
                info = self.storage_data.get(item.storage_index)
                raw_at, dtype_name, shape = None, None, None
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
                else:
                    raise _io.error("%s: no ferry storage entry for %s (checkpoint not "
                                    "written by FerryWriter? torch's FileSystemReader "
                                    "reads those)" % (self.path, item.storage_index))
                f = files.get(info.relative_path)
                if f is None:
                    fp = os.path.join(self.path, os.path.basename(info.relative_path))
                    f = files[info.relative_path] = _ferry.File(ctx, fp, "r")
                if f.size < info.offset + info.length:
                    raise _io.error("%s: truncated: item %s needs bytes [%d, %d) but the file "
                                    "has %d" % (f.path, item.storage_index.fqn, info.offset,
                                                info.offset + info.length, f.size),
                                    _io.EFORMAT)
                if item.type == LoadItemType.BYTE_IO:
                    b = bytearray(info.length)
                    if info.length:
                        p.read_file(f, info.offset, info.length, b)
                    after.append(("bytes", item, b))
                    continue
                dtype = _dtype_of(dtype_name)
                shape = tuple(shape)
                itemsize = torch.empty((), dtype=dtype).element_size()
                n = 1
                for s in shape:
                    n *= s
                inside = info.offset <= raw_at and \
                    raw_at + n * itemsize <= info.offset + info.length
                if not inside or (isinstance(info, FerryStorageInfo) and
                                  n * itemsize != info.length):
                    raise _io.error("%s: corrupted metadata for %s: shape %s of %s at byte %d "
                                    "is not inside the item's %d bytes at %d"
                                    % (self.path, item.storage_index.fqn, list(shape),
                                       dtype_name, raw_at, info.length, info.offset))
                target = planner.resolve_tensor(item).detach()
                lengths = tuple(int(x) for x in item.lengths)
                sel = [(int(o), int(o) + L, 1) for o, L in zip(item.storage_offsets, lengths)]
                if tuple(target.shape) != lengths:
                    raise _io.error("%s: %s: the planner asks for a %s region into a %s tensor"
                                    % (self.path, item.storage_index.fqn, list(lengths),
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
                             label=item.storage_index.fqn, exact=True)
                after.append(("tensor", item, (target, dst)))
            _io.wait_devices(p, devices)
            if len(p):
                ctx.run(p, threads=self.threads)
        finally:
            for f in files.values():
                f.close()
        for kind, item, payload in after:
            if kind == "bytes":
                planner.load_bytes(item, io.BytesIO(bytes(payload)))
            else:
                target, dst = payload
                if dst is not target:
                    with torch.no_grad():
                        target.copy_(dst)
                planner.commit_tensor(item, target)
        fut = Future()
        fut.set_result(None)
        return fut
