"""An opened checkpoint for ferry.checkpoint: safetensors files and shard indexes parsed
by the C library (ferry._ferry.Dataset), read from the very descriptors that parsed them.

The Dataset keeps every file it parsed open, and plans read tensor bytes through those
descriptors (Plan.read). A checkpoint replaced on disk while it is open (an atomic rename
by a training job saving latest.safetensors) therefore reads as the file whose header was
parsed, never as one file's header paired with another's bytes. C's errors (truncated,
damaged headers, data not exactly covered by the offsets, ...) reach the caller unchanged.

A sharded set whose shards a save replaces while it is opened (the C parser refuses
shards of another save than its index, SAVE_KEY) loads from the copy of the set that
save keeps, or once more from the index in place (Checkpoint._open_set); never mixed.

Python only resolves the conventions around the parser: which file of a directory to
open, the CRCs and structure ferry keeps in __metadata__, and the torch dtypes.
"""
from __future__ import annotations

import collections
import errno
import json
import os
import time

from . import io as _io
from . import st as _st
from . import tree as _tree
from .. import _ferry

CRC_KEY = "ferry.crc32c"         # __metadata__: JSON {tensor name: "8 hex digits"}
INDEX_SUFFIX = ".index.json"
SAVE_KEY = "ferry.save"          # index and shard metadata: the id of the save that wrote them
PREV_TAG = ".ferry-prev."        # .<index>.ferry-prev.<host>.<pid>.<random>/: a set kept by a save
ST_MAX_INDEX = 64 << 20          # the C parser's bound on an index file


class Entry:
    """One tensor: where the C parser found it, and its torch dtype."""
    __slots__ = ("name", "index", "ds", "st", "dtype", "shape", "offset", "nbytes", "path")

    def __init__(self, ds, index, row):
        """row: one tuple of Dataset.table()."""
        self.ds, self.index = ds, index
        self.name, typestr, self.shape, self.offset, self.nbytes, self.path, attrs = row
        self.st = _st.st_of_typestr(typestr)
        if self.st is None:              # sub-byte dtypes: the parser gives bytes + attrs
            try:
                a = json.loads(attrs)
                self.st = a["safetensors_dtype"]
                self.shape = tuple(int(s) for s in a["shape"])
            except (ValueError, KeyError, TypeError):
                self.st = typestr
        self.dtype = _st.torch_dtype(self.st)

    def torch_dtype(self):
        if self.dtype is None:
            _io.fail("%s: tensor %r has dtype %s, which ferry.checkpoint cannot give as a "
                     "torch tensor" % (self.path, self.name, self.st), _io.EUNSUPPORTED)
        return self.dtype


def resolve(path):
    """The file the C parser opens for `path`: a safetensors file, an *.index.json, or,
    for a directory, its model.safetensors / model.safetensors.index.json / single index /
    single safetensors file (the Hugging Face conventions)."""
    if os.path.isdir(path):
        for c in ("model.safetensors", "model.safetensors" + INDEX_SUFFIX):
            if os.path.exists(os.path.join(path, c)):
                return os.path.join(path, c)
        names = sorted(os.listdir(path))
        idx = [n for n in names if n.endswith(".safetensors" + INDEX_SUFFIX)]
        single = [n for n in names if n.endswith(".safetensors")]
        if len(idx) == 1:
            return os.path.join(path, idx[0])
        if len(single) == 1:
            return os.path.join(path, single[0])
        _io.fail("%s: a directory without one model.safetensors or *.index.json" % path,
                 _io.ENOTFOUND)
    if not path.endswith(INDEX_SUFFIX) and not os.path.exists(path) and \
            os.path.exists(path + INDEX_SUFFIX):
        return path + INDEX_SUFFIX
    return path


def _save_id(index_path):
    """SAVE_KEY of an index file's metadata, or None."""
    try:
        with open(index_path, "rb") as f:
            md = json.loads(f.read(ST_MAX_INDEX)).get("metadata")
        v = md.get(SAVE_KEY) if isinstance(md, dict) else None
        return v if isinstance(v, str) else None
    except (OSError, ValueError, AttributeError, RecursionError):
        return None


class Checkpoint:
    """A checkpoint opened through the C parser; close() releases its descriptors.
    remote=True: path is an object URL (http(s)://, s3://, gs://), resolved by the C
    library (a directory URL ending in "/" opens its index or model.safetensors)."""

    def __init__(self, path, display=None, verify=True, remote=False):
        self.path = display or path
        self.check_header = verify
        if remote:
            self.ds = self._open_remote(path)
            target = self.ds.opened
            self.is_index = target.endswith(INDEX_SUFFIX)
        else:
            target = resolve(path)
            self.is_index = target.endswith(INDEX_SUFFIX)
            # format= keeps an .index.json (or a file without the suffix) from being sniffed
            self.ds, target = self._open_set(target) if self.is_index else \
                (_ferry.Dataset(_io.context(), target, format="safetensors"), target)
        try:
            self._describe(target)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _open_set(target):
        """(Dataset, index opened) of a sharded set. A save replacing it renames its
        shards over the old names before it replaces the index, so an index read meanwhile
        may pair with shards of the new save (the C parser refuses: -ESTALE) or name shards
        already removed (-ENOENT). The set then loads from the copy that save keeps (hard
        links in .<index>.ferry-prev.*/) when its index is the one in place, else once more
        from the index in place; a FerryError after that."""
        ctx = _io.context()
        try:
            return _ferry.Dataset(ctx, target, format="safetensors"), target
        except _io.FerryError as e:
            if getattr(e, "code", None) not in (-errno.ESTALE, -errno.ENOENT) or \
                    not os.path.exists(target):
                raise
            first = e
        want = _save_id(target)
        d, base = os.path.split(target)
        try:
            kept = sorted(n for n in os.listdir(d or ".") if n.startswith("." + base + PREV_TAG))
        except OSError:
            kept = []
        for n in kept:
            idx = os.path.join(d, n, base)
            if want is None or _save_id(idx) != want:
                continue
            try:
                return _ferry.Dataset(ctx, idx, format="safetensors"), idx
            except _io.FerryError:
                continue                  # removed meanwhile: its save has committed
        try:
            return _ferry.Dataset(ctx, target, format="safetensors"), target
        except _io.FerryError as e:
            if getattr(e, "code", None) in (-errno.ESTALE, -errno.ENOENT):
                raise e from first
            raise

    @staticmethod
    def _open_remote(url, tries=3):
        """The Dataset of an object URL. A sharded set being saved over meanwhile pairs an
        index with shards of another save (-ESTALE from the C parser, never mixed bytes):
        opened again, after a pause, a few times; then the FerryError, which says so."""
        for i in range(tries):
            try:
                return _ferry.Dataset(_io.context(), url, format="safetensors")
            except _io.FerryError as e:
                if getattr(e, "code", None) != -errno.ESTALE or i + 1 == tries:
                    raise
            time.sleep(0.5 * (i + 1))

    def close(self):
        ds, self.ds = getattr(self, "ds", None), None
        if ds is not None:
            ds.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _describe(self, target):
        self.entries = collections.OrderedDict()
        for i, row in enumerate(self.ds.table()):
            self.entries[row[0]] = Entry(self.ds, i, row)
        raw = json.loads(self.ds.attrs)
        # the index's metadata may hold numbers (total_size); a file's holds strings
        self.metadata = {k: v if isinstance(v, str) else json.dumps(v)
                         for k, v in raw.items()} if raw else None
        md = raw or {}
        self.header_crc = None
        if _st.HEADER_CRC_KEY in md:
            self.header_crc = self._hex(md[_st.HEADER_CRC_KEY], _st.HEADER_CRC_KEY)
            desc = [(e.name, e.st, e.shape, e.offset, e.nbytes,
                     os.path.basename(e.path) if self.is_index else "")
                    for e in self.entries.values()]
            got = _st.header_digest(md, desc)
            if got != self.header_crc and self.check_header:
                _io.fail("%s: the header (tensor names, shapes, offsets or metadata) does not "
                         "match its CRC32C (stored %08x, header %08x): the file is corrupted"
                         % (target, self.header_crc, got), _io.ECHECKSUM)
        self.crcs = {}
        if CRC_KEY in md:
            try:
                crcs = json.loads(md[CRC_KEY])
                if not isinstance(crcs, dict):
                    raise ValueError("not an object")
            except (TypeError, ValueError, RecursionError) as e:
                _io.fail("%s: corrupted %s in the metadata: %s" % (target, CRC_KEY, e))
            for n, v in crcs.items():
                self.crcs[n] = self._hex(v, "%s[%r]" % (CRC_KEY, n))
        self.tree, self.aliases = None, {}
        if _tree.TREE_KEY in md:
            self.tree = _tree.parse(md[_tree.TREE_KEY], target)
        elif _tree.ALIAS_KEY in md:
            try:
                self.aliases = json.loads(md[_tree.ALIAS_KEY])
                if not isinstance(self.aliases, dict) or not all(
                        isinstance(k, str) and isinstance(v, str)
                        for k, v in self.aliases.items()):
                    raise ValueError("not an object of names")
            except (TypeError, ValueError, RecursionError) as e:
                _io.fail("%s: corrupted %s in the metadata: %s" % (target, _tree.ALIAS_KEY, e))
        self.target = target

    def _hex(self, v, what):
        if not isinstance(v, str) or len(v) != 8:
            _io.fail("%s: corrupted %s in the metadata: %r is not 8 hex digits"
                     % (self.path, what, v))
        try:
            return int(v, 16)
        except ValueError:
            _io.fail("%s: corrupted %s in the metadata: %r is not 8 hex digits"
                     % (self.path, what, v))

    # ---------------------------------------------------------------- reading
    def read_box(self, plan, e, sel, dst):
        """Add the read of selection sel [(start, stop, step)] of tensor e into dst."""
        plan.read(self.ds, e.index, _io.buf(dst), selection=[tuple(s) for s in sel])

    def verify(self, tensors):
        for n, t in tensors.items():
            want = self.crcs.get(n)
            if want is None:
                continue
            got = _io.crc32c_of(t)
            if got != want:
                e = self.entries[n]
                _io.fail("%s: tensor %r: CRC32C mismatch (stored %08x, data %08x): the file is "
                         "corrupted" % (e.path, n, want, got), _io.ECHECKSUM)

    def rebuild(self, tensors):
        if self.tree is not None:
            return _tree.decode(self.tree, tensors, self.target)
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
