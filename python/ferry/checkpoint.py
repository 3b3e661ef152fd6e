"""Checkpoints through the ferry engine: safetensors files, GPU <-> file, atomic.

    import ferry.checkpoint as ckpt
    ckpt.save(model.state_dict(), "step1000.safetensors")          # GPU -> file, durable, atomic
    sd = ckpt.load("step1000.safetensors", device="cuda:0")       # file -> GPU, one engine plan
    ckpt.load_into(model, "step1000.safetensors")                 # fill existing tensors in place
    fut = ckpt.async_save(model.state_dict(), "step2000.safetensors"); fut.blocked_s
    with ckpt.safe_open("step1000.safetensors", device=0) as f:
        w = f.get_slice("lm_head.weight")[:, :1024]              # reads only the needed bytes
    torch.distributed.checkpoint.save(sd, storage_writer=ckpt.FerryWriter("ckpt/"))

Files are plain safetensors: `safetensors.torch.load_file` reads what ferry writes, and
ferry reads what safetensors and Hugging Face (sharded, model.safetensors.index.json)
write. The header is padded with spaces so tensor data start 4 KiB-aligned, and tensors are
ordered so that almost all of them start on 4 KiB boundaries (see _ckpt_st.py). Nested
state dicts and non-tensor values (an optimizer's state_dict, step counters, ...) are kept
in the header's __metadata__ (key "ferry.tree") and come back with their types.

Python here only builds headers and plans; all tensor bytes move through ferry's engine.
"""
from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import re
import threading
import time

from . import _ckpt_io as _io
from . import _ckpt_st as _st
from . import _ckpt_tree as _tree
from . import _ferry

FerryError = _ferry.FerryError

__all__ = ["save", "load", "load_into", "safe_open", "async_save", "FerryWriter",
           "FerryReader", "FerryError", "reserve_pinned", "release_pinned"]

CRC_KEY = "ferry.crc32c"         # __metadata__: JSON {tensor name: "8 hex digits"}
INDEX_SUFFIX = ".index.json"

IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def __getattr__(name):           # the DCP plugin imports torch.distributed lazily
    if name in ("FerryWriter", "FerryReader"):
        from . import _ckpt_dcp
        return getattr(_ckpt_dcp, name)
    raise AttributeError("module 'ferry.checkpoint' has no attribute %r" % name)


def _torch():
    import torch
    return torch


def _device(device):
    torch = _torch()
    if isinstance(device, int):
        return torch.device("cuda", device)
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type not in ("cpu", "cuda"):
        raise ValueError("ferry.checkpoint: device must be cpu or cuda, not %s" % dev)
    return dev


def _parse_size(s):
    if s is None:
        return None
    if isinstance(s, int):
        return s
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*", str(s), re.I)
    if not m:
        raise ValueError("ferry.checkpoint: bad size %r (e.g. 5GB, 500MiB, 1000000)" % (s,))
    num, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    base = 1024 if binary else 1000
    return int(num * base ** " KMGT".index(unit or " "))


# =============================================================================== save
class _Prepared:
    """A state dict reduced to what is written: contiguous tensors by name (+ names in
    the caller's order), the structure metadata, CRCs."""

    def __init__(self, state_dict, crc):
        flat = _tree.flatten(state_dict)
        self.struct_md = flat.metadata()
        self.tensors = collections.OrderedDict()
        for name, t in flat.tensors.items():
            _st.st_dtype(t.dtype)                       # TypeError for unsupported dtypes
            if t.device.type not in ("cpu", "cuda"):
                raise TypeError("ferry.checkpoint: %r is on %s (cpu or cuda only)"
                                % (name, t.device))
            if not t.is_contiguous():
                t = t.contiguous()                      # on the tensor's own device
            self.tensors[name] = t
        self.crcs = {}
        if crc:
            for name, t in self.tensors.items():
                self.crcs[name] = _io.u32hex(_io.crc32c_of(t))
        self.nbytes = sum(t.numel() * t.element_size() for t in self.tensors.values())


def _check_user_metadata(metadata):
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise TypeError("ferry.checkpoint: metadata must be a dict of str to str "
                        "(non-tensor values go in the state dict itself)")
    bad = [k for k in metadata if k.startswith("ferry.")]
    if bad:
        raise ValueError("ferry.checkpoint: metadata keys starting with 'ferry.' are reserved: %s"
                         % bad)
    return dict(metadata)


def _shard_names(path, n):
    d, base = os.path.split(path)
    stem = base[:-len(".safetensors")] if base.endswith(".safetensors") else base
    return [os.path.join(d, "%s-%05d-of-%05d.safetensors" % (stem, i + 1, n)) for i in range(n)]


def _split_shards(prep, max_bytes):
    shards, cur, size = [], [], 0
    for name, t in prep.tensors.items():
        nb = t.numel() * t.element_size()
        if cur and size + nb > max_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(name)
        size += nb
    if cur or not shards:
        shards.append(cur)
    return shards


def _read_index_files(index_path):
    """Shard file names an existing index refers to (for cleanup), or []."""
    try:
        with open(index_path, "rb") as f:
            idx = json.loads(f.read(16 << 20))
        return sorted(set(v for v in idx.get("weight_map", {}).values() if isinstance(v, str)))
    except Exception:
        return []


def _safe_member(d, name):
    if not name or os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        return None
    return os.path.join(d, name)


def _write(prep, path, metadata, max_shard_size, threads, durable=True):
    """Write a prepared state dict to `path` (atomically), one engine plan for all files."""
    path = os.fspath(path)
    user_md = _check_user_metadata(metadata)
    max_bytes = _parse_size(max_shard_size)
    if max_bytes is not None and max_bytes <= 0:
        raise ValueError("ferry.checkpoint: max_shard_size must be positive")
    sharded = max_bytes is not None and prep.nbytes > max_bytes
    groups = _split_shards(prep, max_bytes) if sharded else [list(prep.tensors)]
    finals = _shard_names(path, len(groups)) if sharded else [path]
    index_path = path + INDEX_SUFFIX
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    for f in finals + ([index_path] if sharded else []):
        _io.remove_stale_temps(f)

    ctx = _io.context()
    plan = _ferry.Plan()
    files, temps, headers, devices = [], [], [], set()
    try:
        for names, final in zip(groups, finals):
            ents = []
            for n in names:
                t = prep.tensors[n]
                ents.append((n, t.numel() * t.element_size()))
            lay = {n: (b, e) for n, b, e in _st.layout(ents)}
            md = {"format": "pt"}
            md.update(user_md)
            if not sharded:
                md.update(prep.struct_md)
            crcs = {n: prep.crcs[n] for n in names if n in prep.crcs}
            if crcs:
                md[CRC_KEY] = json.dumps(crcs, separators=(",", ":"))
            hdr_list = []
            for n in names:
                t = prep.tensors[n]
                hdr_list.append((n, _st.st_dtype(t.dtype), tuple(t.shape)) + lay[n])
            header = bytearray(_st.build_header(hdr_list, md))
            headers.append(header)
            total = len(header) + sum(e - b for b, e in lay.values())
            tmp = _io.temp_name(final)
            temps.append(tmp)
            f = _ferry.File(ctx, tmp, "w")
            files.append(f)
            f.truncate(total)
            plan.write_file(f, 0, len(header), header)
            for n in names:
                t = prep.tensors[n]
                b, e = lay[n]
                if e > b:
                    plan.write_file(f, len(header) + b, e - b, _io.buf(t))
                    if t.device.type == "cuda":
                        devices.add(_io.cuda_index(t.device))
        if devices:
            _io.sync_devices(devices)
        ctx.run(plan, threads=threads, sync=durable)
        for f in files:
            f.close()
        files = []
        old_index_files = _read_index_files(index_path) if os.path.exists(index_path) else []
        for tmp, final in zip(temps, finals):
            os.replace(tmp, final)
        temps = []
        if durable:
            _io.fsync_dir(d)
        if sharded:
            wm = {}
            for names, final in zip(groups, finals):
                for n in names:
                    wm[n] = os.path.basename(final)
            imd = {"total_size": prep.nbytes}
            imd.update(user_md)
            imd.update(prep.struct_md)
            index = {"metadata": imd, "weight_map": wm}
            _io.write_small_file_atomic(index_path, json.dumps(index, indent=2).encode())
            keep = set(os.path.basename(f) for f in finals)
            for name in old_index_files:              # shards of an older save, now unused
                p = _safe_member(d, name)
                if name not in keep and p and p != os.path.abspath(path):
                    _unlink(p)
            if os.path.isfile(path):                  # a single-file save would shadow us
                _unlink(path)
        elif old_index_files and _is_ferry_index(index_path):
            _unlink(index_path)                       # an older sharded save at this path
            for name in old_index_files:
                p = _safe_member(d, name)
                if p and p != os.path.abspath(path):
                    _unlink(p)
    finally:
        for f in files:
            try:
                f.close()
            except Exception:
                pass
        for tmp in temps:
            _unlink(tmp)


def _is_ferry_index(p):
    try:
        with open(p, "rb") as f:
            idx = json.loads(f.read(16 << 20))
        return isinstance(idx.get("weight_map"), dict)
    except Exception:
        return False


def _unlink(p):
    try:
        os.unlink(p)
    except OSError:
        pass


def save(state_dict, path, metadata=None, *, crc32c=False, max_shard_size=None, threads=0,
         durable=True):
    """Save a (nested) state dict as a safetensors file at `path`, atomically.

    Tensors may live on the CPU or any CUDA device, in any dtype safetensors names (bf16 and
    fp8 included); non-contiguous ones are made contiguous on their own device first. All
    bytes go through one engine plan (GPU tensors: GPU -> pinned staging -> file inside the
    engine), then the file is fsynced (durable=True), renamed over `path`, and the directory
    fsynced. A save that dies leaves any previous file at `path` untouched; its temporary
    (.<name>.ferry-tmp.*) never gets in the way of a later save and is removed by it.

    metadata: {str: str} stored in __metadata__. crc32c: store a CRC32C per tensor, checked
    by load. max_shard_size (bytes or "5GB"): when the tensors exceed it, write
    <stem>-0000i-of-0000n.safetensors shards plus <path>.index.json (Hugging Face layout).
    Tensors that are the very same view of one storage (tied weights) are stored once and
    tied again by ferry's load; safetensors readers see the first name only.
    """
    prep = _Prepared(state_dict, crc32c)
    _write(prep, path, metadata, max_shard_size, threads, durable)


# =============================================================================== load
class _Checkpoint:
    """An opened checkpoint (one file or an index of shards): checked headers."""

    def __init__(self, path):
        path = os.fspath(path)
        self.path = path
        self.index_path = None
        files = self._resolve(path)
        self.headers = []
        self.entries = collections.OrderedDict()
        self.crcs = {}
        self.metadata = None
        for p in files:
            h = _parse_file(p)
            self.headers.append(h)
            md = h.metadata or {}
            if CRC_KEY in md:
                try:
                    crcs = json.loads(md[CRC_KEY])
                    if not isinstance(crcs, dict):
                        raise ValueError
                except ValueError:
                    _io.fail("%s: corrupted %s in __metadata__" % (p, CRC_KEY))
                for n, v in crcs.items():
                    try:
                        self.crcs[(p, n)] = int(v, 16)
                    except (TypeError, ValueError):
                        _io.fail("%s: corrupted CRC32C for tensor %r" % (p, n))
        if self.index_path is None:
            h = self.headers[0]
            self.entries.update(h.entries)
            self.metadata = h.metadata
        else:
            by_file = {h.path: h for h in self.headers}
            for name, fn in self.weight_map.items():
                h = by_file[fn]
                e = h.entries.get(name)
                if e is None:
                    _io.fail("%s: tensor %r is listed in %s but missing from the shard"
                             % (fn, name, self.index_path), _io.ENOTFOUND)
                self.entries[name] = e
            md = self.index_md
            self.metadata = {k: v for k, v in md.items() if isinstance(v, str)}
            self.metadata.update({k: str(v) for k, v in md.items() if not isinstance(v, str)})
        md = self.metadata or {}
        self.tree = None
        self.aliases = {}
        try:
            if _tree.TREE_KEY in md:
                self.tree = json.loads(md[_tree.TREE_KEY])
            elif _tree.ALIAS_KEY in md:
                self.aliases = json.loads(md[_tree.ALIAS_KEY])
                if not isinstance(self.aliases, dict):
                    raise ValueError("not an object")
        except ValueError as e:
            _io.fail("%s: corrupted ferry structure metadata: %s" % (path, e))

    def _resolve(self, path):
        if os.path.isdir(path):
            cands = ["model.safetensors", "model.safetensors" + INDEX_SUFFIX]
            for c in cands:
                if os.path.exists(os.path.join(path, c)):
                    return self._resolve(os.path.join(path, c))
            names = sorted(os.listdir(path))
            idx = [n for n in names if n.endswith(".safetensors" + INDEX_SUFFIX)]
            single = [n for n in names if n.endswith(".safetensors")]
            if len(idx) == 1:
                return self._resolve(os.path.join(path, idx[0]))
            if len(single) == 1:
                return [os.path.join(path, single[0])]
            _io.fail("%s: a directory without one model.safetensors or *.index.json" % path,
                     _io.ENOTFOUND)
        if path.endswith(INDEX_SUFFIX) or (not os.path.exists(path) and
                                           os.path.exists(path + INDEX_SUFFIX)):
            ip = path if path.endswith(INDEX_SUFFIX) else path + INDEX_SUFFIX
            return self._load_index(ip)
        if not os.path.exists(path):
            _io.fail("%s: no such file" % path, -2)
        return [path]

    def _load_index(self, ip):
        self.index_path = ip
        try:
            with open(ip, "rb") as f:
                raw = f.read(_st.MAX_HEADER + 1)
            idx = json.loads(raw.decode("utf-8"))
            wm = idx["weight_map"]
            if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in wm.items()):
                raise ValueError("weight_map must map tensor names to file names")
            md = idx.get("metadata") or {}
            if not isinstance(md, dict):
                raise ValueError("metadata must be an object")
        except FileNotFoundError:
            _io.fail("%s: no such file" % ip, -2)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            _io.fail("%s: corrupted index: %s" % (ip, e))
        d = os.path.dirname(os.path.abspath(ip))
        self.weight_map = {}
        files = []
        for name, fn in wm.items():
            p = _safe_member(d, fn)
            if p is None:
                _io.fail("%s: shard name %r points outside the directory" % (ip, fn))
            self.weight_map[name] = p
            if p not in files:
                files.append(p)
        self.index_md = md
        return files

    # ---------------------------------------------------------------- reading
    def read(self, names, device, threads=0, verify=True, dests=None):
        """Read the named tensors with one engine plan. dests: optional {name: tensor}
        to read into (contiguous, right dtype/shape). Returns {name: tensor}."""
        torch = _torch()
        ctx = _io.context()
        plan = _ferry.Plan()
        out = {}
        files = {}
        devs = set()
        try:
            for n in names:
                e = self.entries[n]
                t = None if dests is None else dests.get(n)
                if t is None:
                    t = torch.empty(e.shape, dtype=e.dtype, device=device)
                out[n] = t
                if e.nbytes == 0:
                    continue
                f = files.get(e.path)
                if f is None:
                    f = files[e.path] = _ferry.File(ctx, e.path, "r")
                plan.read_file(f, e.offset, e.nbytes, _io.buf(t))
                if t.device.type == "cuda":
                    devs.add(_io.cuda_index(t.device))
            if devs:
                _io.sync_devices(devs)       # torch's allocations/pending work, before the engine
            if len(plan):
                ctx.run(plan, threads=threads)
        finally:
            for f in files.values():
                f.close()
        if verify:
            self.verify(out)
        return out

    def verify(self, tensors):
        for n, t in tensors.items():
            e = self.entries[n]
            want = self.crcs.get((e.path, n))
            if want is None:
                continue
            got = _io.crc32c_of(t)
            if got != want:
                _io.fail("%s: tensor %r: CRC32C mismatch (stored %08x, data %08x): the file is "
                         "corrupted" % (e.path, n, want, got), _io.ECHECKSUM)

    def rebuild(self, tensors):
        if self.tree is not None:
            def get(n):
                if not isinstance(n, str) or n not in tensors:
                    _io.fail("%s: structure metadata names tensor %r, which the file lacks"
                             % (self.path, n), _io.ENOTFOUND)
                return tensors[n]
            try:
                return _tree.decode(self.tree, get)
            except _tree.TreeError as e:
                _io.fail("%s: corrupted ferry structure metadata: %s" % (self.path, e))
        out = dict(tensors)
        for alias, target in self.aliases.items():
            if target in out:
                out[alias] = out[target]
        return out

    def path_map(self):
        """{key path: tensor name} of the stored structure."""
        if self.tree is not None:
            return _tree.tensor_paths(self.tree)
        m = {(n,): n for n in self.entries}
        for alias, target in self.aliases.items():
            if target in self.entries:
                m[(alias,)] = target
        return m


def _parse_file(p):
    head, size = _io.read_head(p)
    h = _st.parse_header(p, head, size, _io.fail)
    if isinstance(h, int):
        _io.fail("%s: file changed while reading its header" % p)
    return h


def load(path, device="cpu", *, threads=0, verify=True):
    """Load a checkpoint (a ferry or safetensors file, a sharded index, or a directory
    holding one) into tensors torch allocates on `device` ("cpu", "cuda:N", N). All
    tensors of all shards are read by one engine plan. Nesting and non-tensor values saved
    by ferry come back as saved; plain safetensors files give {name: tensor}. Stored
    CRC32Cs are checked unless verify=False."""
    dev = _device(device)
    ck = _Checkpoint(path)
    tensors = ck.read(list(ck.entries), dev, threads=threads, verify=verify)
    return ck.rebuild(tensors)


def load_into(state_dict, path, *, strict=True, threads=0, verify=True):
    """Fill the tensors of `state_dict` (a nested state dict, or an nn.Module) in place from
    a checkpoint, without a second copy of the model: contiguous tensors of the stored
    dtype are read straight into their memory (GPU or CPU); others through a temporary and
    copy_(). Non-tensor values in the file are ignored (use load() for those). Returns
    (missing_keys, unexpected_keys); strict=True raises FerryError if either is non-empty.
    Shapes must match."""
    torch = _torch()
    if isinstance(state_dict, torch.nn.Module):
        state_dict = state_dict.state_dict()
    ck = _Checkpoint(path)
    pmap = ck.path_map()
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
            tmp = torch.empty(e.shape, dtype=e.dtype, device=t.device)
            dests[name] = tmp
            copies.append((t, name))
    unexpected = [n for n in ck.entries if n not in used]
    if strict and (missing or unexpected):
        _io.fail("%s: state dict and checkpoint differ: missing in the file %s; unexpected in "
                 "the file %s" % (ck.path, missing[:10], unexpected[:10]), _io.ENOTFOUND)
    got = ck.read(list(dests), None, threads=threads, verify=verify, dests=dests)
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
    """Python indexing -> (per-dim (start, stop, step), result shape, dims kept)."""
    if not isinstance(key, tuple):
        key = (key,)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("only one Ellipsis allowed")
    nd = len(shape)
    n_index = sum(1 for k in key if k is not Ellipsis and k is not None)
    if n_index > nd:
        raise IndexError("too many indices for a tensor of %d dimensions" % nd)
    full = []
    for k in key:
        if k is Ellipsis:
            full.extend([slice(None)] * (nd - n_index))
        else:
            full.append(k)
    full.extend([slice(None)] * (nd - len([k for k in full if k is not None])))
    sel, out_shape, dim = [], [], 0
    for k in full:
        if k is None:
            out_shape.append(1)
            continue
        n = shape[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step <= 0:
                raise IndexError("ferry.checkpoint: slices need a positive step")
            cnt = max(0, -(-(stop - start) // step))
            stop = start + cnt * step if cnt else start
            sel.append((start, stop, step))
            out_shape.append(cnt)
        else:
            try:
                i = int(k.__index__())
            except AttributeError:
                raise IndexError("ferry.checkpoint: get_slice takes ints, slices and ...; "
                                 "got %r" % (k,))
            if i < 0:
                i += n
            if not 0 <= i < n:
                raise IndexError("index %d out of range for dimension %d of size %d"
                                 % (int(k), dim, n))
            sel.append((i, i + 1, 1))
        dim += 1
    return sel, tuple(out_shape)


class safe_open:
    """A safetensors-style handle: keys(), metadata(), get_tensor(name), get_slice(name)[..],
    get_tensors(names) (one plan). Works on single files and sharded indexes."""

    def __init__(self, path, framework="pt", device="cpu", *, threads=0, verify=True):
        if framework not in ("pt", "torch", "pytorch"):
            raise ValueError("ferry.checkpoint.safe_open gives torch tensors (framework='pt')")
        self._ck = _Checkpoint(path)
        self._dev = _device(device)
        self._threads = threads
        self._verify = verify
        self._datasets = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for ds in self._datasets.values():
            if ds is not None:
                try:
                    ds.close()
                except Exception:
                    pass
        self._datasets = {}

    def keys(self):
        return list(self._ck.entries)

    def offset_keys(self):
        return [e.name for e in sorted(self._ck.entries.values(),
                                       key=lambda e: (e.path, e.begin))]

    def metadata(self):
        return self._ck.metadata

    def _entry(self, name):
        e = self._ck.entries.get(name)
        if e is None:
            raise error_notfound(self._ck.path, name)
        return e

    def get_tensor(self, name):
        self._entry(name)
        return self._ck.read([name], self._dev, self._threads, self._verify)[name]

    def get_tensors(self, names=None):
        names = list(self._ck.entries) if names is None else list(names)
        for n in names:
            self._entry(n)
        return self._ck.read(names, self._dev, self._threads, self._verify)

    def get_slice(self, name):
        self._entry(name)
        return _SliceView(self, name)

    def load(self):
        """Everything, nesting restored (like ferry.checkpoint.load)."""
        return self._ck.rebuild(self.get_tensors())

    def _dataset(self, path):
        if path not in self._datasets:
            try:
                self._datasets[path] = _ferry.Dataset(_io.context(), path, format="safetensors")
            except (FerryError, TypeError, ValueError):
                self._datasets[path] = None
        return self._datasets[path]

    def _read_slice(self, e, key):
        torch = _torch()
        sel, out_shape = _normalize_key(key, e.shape)
        box_shape = tuple(len(range(*s)) for s in sel)
        dst = torch.empty(box_shape, dtype=e.dtype, device=self._dev)
        n = dst.numel()
        if n and not (self._verify and (e.path, e.name) in self._ck.crcs):
            if self._read_box(e, sel, dst):
                return dst.reshape(out_shape)
        elif n == 0:
            return dst.reshape(out_shape)
        # A stored CRC covers the whole tensor: verify it, then slice.
        full = self._ck.read([e.name], self._dev, self._threads, self._verify)[e.name]
        idx = tuple(slice(a, b, c) for a, b, c in sel)
        return full[idx].contiguous().reshape(out_shape)

    def _read_box(self, e, sel, dst):
        """Read selection `sel` of entry e into dst with one plan. True when done."""
        ctx = _io.context()
        dev = dst.device
        if dev.type == "cuda":
            _io.sync_devices({_io.cuda_index(dev)})
        ds = self._dataset(e.path)
        if ds is not None:
            try:
                plan = _ferry.Plan()
                plan.read(ds, e.name, _io.buf(dst), selection=[tuple(s) for s in sel])
                ctx.run(plan, threads=self._threads)
                return True
            except FerryError as err:
                if getattr(err, "code", None) not in (_io.EUNSUPPORTED, _io.EINVAL,
                                                      _io.ENOTFOUND):
                    raise
        # Our own plan: contiguous runs of the box, or a covering range and a strided copy.
        f = _ferry.File(ctx, e.path, "r")
        try:
            plan = _ferry.Plan()
            fix = _io.plan_box(plan, f, e.offset, e.shape, e.dtype, e.itemsize, sel, dst)
            ctx.run(plan, threads=self._threads)
        finally:
            f.close()
        if fix is not None:
            fix()
        return True


def error_notfound(path, name):
    return _io.error("%s: no tensor named %r" % (path, name), _io.ENOTFOUND)


# ========================================================================= async save
_pool_lock = threading.Lock()
_free_arenas = []          # [(tensor uint8, aligned offset, nbytes usable, registered)]
_executor = None


def _executor_get():
    global _executor
    with _pool_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="ferry-async-save")
        return _executor


def _arena_get(nbytes, pinned):
    """A host buffer of >= nbytes, 4 KiB-aligned, page-locked when CUDA is present.
    Arenas are kept for later async saves (release_pinned() frees them)."""
    torch = _torch()
    with _pool_lock:
        best = None
        for a in _free_arenas:
            if a[2] >= nbytes and a[3] == pinned and (best is None or a[2] < best[2]):
                best = a
        if best is not None:
            del _free_arenas[next(i for i, a in enumerate(_free_arenas) if a is best)]
            return best
    raw = torch.empty(nbytes + 4096, dtype=torch.uint8)
    off = (-raw.data_ptr()) % 4096
    registered = False
    if pinned and nbytes:
        try:
            rc = torch.cuda.cudart().cudaHostRegister(raw.data_ptr() + off, nbytes, 0)
            registered = int(rc) == 0 if not hasattr(rc, "value") else rc.value == 0
        except Exception:
            registered = False
    return (raw, off, nbytes, pinned, registered)


def _arena_put(a):
    with _pool_lock:
        _free_arenas.append(a)
        # keep at most two arenas
        while len(_free_arenas) > 2:
            _arena_free(_free_arenas.pop(0))


def _arena_free(a):
    raw, off, nbytes, pinned, registered = a
    if registered:
        try:
            _torch().cuda.cudart().cudaHostUnregister(raw.data_ptr() + off)
        except Exception:
            pass


def _snapshot_bytes(state_dict, snapshot="host"):
    flat = _tree.flatten(state_dict)
    total = 0
    for t in flat.tensors.values():
        if snapshot in ("device", "gpu") and t.device.type == "cuda":
            continue
        total += -(-(t.numel() * t.element_size()) // 4096) * 4096
    return total


def reserve_pinned(state_dict_or_nbytes, snapshot="host"):
    """Allocate and page-lock the host buffer async_save will use for this state dict (or
    this many bytes) now, e.g. at start-up, so the first async_save blocks only for its
    copies (pinning 4 GiB takes ~1.4 s on the H200 machine)."""
    torch = _torch()
    n = state_dict_or_nbytes if isinstance(state_dict_or_nbytes, int) else \
        _snapshot_bytes(state_dict_or_nbytes, snapshot)
    if n > 0:
        _arena_put(_arena_get(n, torch.cuda.is_available()))


def release_pinned():
    """Free the pinned host buffers kept by async_save."""
    with _pool_lock:
        while _free_arenas:
            _arena_free(_free_arenas.pop())


def async_save(state_dict, path, metadata=None, *, crc32c=False, max_shard_size=None,
               threads=0, durable=True, snapshot="host"):
    """Save in the background; returns a concurrent.futures.Future (result: path).

    The caller is blocked only while a snapshot is taken: snapshot="host" enqueues copies
    of every tensor into a reused, page-locked, 4 KiB-aligned host buffer (GPU tensors:
    asynchronous device-to-host copies on the current stream, so later work on that
    stream -- the next optimizer step -- is ordered after them); snapshot="device" clones
    GPU tensors on their GPU (fast, costs GPU memory). The writing thread waits for the
    copies, then writes through the engine exactly like save(). future.blocked_s is how
    long the caller was blocked. Saves run one after another in submission order."""
    torch = _torch()
    t0 = time.perf_counter()
    if snapshot not in ("host", "device", "pinned", "gpu"):
        raise ValueError("ferry.checkpoint.async_save: snapshot must be 'host' or 'device'")
    flat = _tree.flatten(state_dict)
    user_md = _check_user_metadata(metadata)
    items = list(flat.tensors.items())
    for n, t in items:
        _st.st_dtype(t.dtype)
    on_gpu = snapshot in ("device", "gpu")
    total = 0
    slots = []
    for n, t in items:
        nb = t.numel() * t.element_size()
        if on_gpu and t.device.type == "cuda":
            slots.append(None)
        else:
            slots.append(total)
            total += -(-nb // 4096) * 4096
    pinned = torch.cuda.is_available()
    arena = _arena_get(total, pinned) if total else None
    snap = collections.OrderedDict()
    events = []
    devs = set()
    try:
        with torch.no_grad():
            for (n, t), off in zip(items, slots):
                if off is None:
                    s = t.clone(memory_format=torch.contiguous_format)
                else:
                    nb = t.numel() * t.element_size()
                    if nb == 0:
                        s = torch.empty(t.shape, dtype=t.dtype)
                    else:
                        raw, base = arena[0], arena[1]
                        s = raw[base + off: base + off + nb].view(t.dtype).view(t.shape)
                        s.copy_(t, non_blocking=t.device.type == "cuda")
                if t.device.type == "cuda":
                    devs.add(_io.cuda_index(t.device))
                snap[n] = s
            for d in sorted(devs):
                ev = torch.cuda.Event()
                ev.record(torch.cuda.current_stream(d))
                events.append(ev)
    except BaseException:
        if arena is not None:
            _arena_put(arena)
        raise
    struct_md = flat.metadata()

    def work():
        try:
            for ev in events:
                ev.synchronize()
            prep = _Prepared.__new__(_Prepared)
            prep.struct_md = struct_md
            prep.tensors = snap
            prep.crcs = {}
            if crc32c:
                for n, t in snap.items():
                    prep.crcs[n] = _io.u32hex(_io.crc32c_of(t))
            prep.nbytes = sum(t.numel() * t.element_size() for t in snap.values())
            _write(prep, path, user_md or None, max_shard_size, threads, durable)
            return os.fspath(path)
        finally:
            snap.clear()
            if arena is not None:
                _arena_put(arena)

    fut = _executor_get().submit(work)
    fut.blocked_s = time.perf_counter() - t0
    return fut
