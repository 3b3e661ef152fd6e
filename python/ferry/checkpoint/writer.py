"""Writing checkpoints for ferry.checkpoint: one engine plan, temporaries renamed into place.

Single file: header + tensors go to a temporary beside the target, which is fsynced and
renamed over it (a crash leaves the old file).
Sharded (max_shard_size): Hugging Face's names, as save_pretrained writes them:
<stem>-0000i-of-0000n.safetensors beside <path>.index.json. Every save stamps the index and
each shard with one save id (SAVE_KEY in their metadata), writes the shards as temporaries,
keeps the set in place as hard links in .<index>.ferry-prev.<host>.<pid>.<random>/, renames
the shards over the old names, and only then replaces the index -- the commit point. After
it, the shards only the old index named and the kept copy are removed. The C parser refuses
a set whose ids differ (a reader that opened the old index while shards were replaced) and
the reader then opens the kept copy, whose index is the one in place (_ckpt_open.py): a
reader never gets two saves mixed, and a save killed at any moment leaves the previous set
loadable (through the kept copy until the next save completes). Shards and temporaries of
killed saves are reclaimed by a later save in that directory.
"""
from __future__ import annotations

import collections
import errno
import json
import os
import re
import shutil
import time

from . import io as _io
from . import open as _open
from . import run as _run
from . import st as _st
from . import tree as _tree
from .. import _ferry

INDEX_SUFFIX = _open.INDEX_SUFFIX
ORPHAN_AGE_S = 600      # shards of a killed save (older token-named layout) reclaimed after this
SAVE_KEY = _open.SAVE_KEY
PREV_TAG = _open.PREV_TAG


class Prepared:
    """A state dict reduced to what is written: contiguous tensors by name (+ names in
    the caller's order), the structure metadata, CRCs."""

    def __init__(self, state_dict=None, crc=False, *, struct_md=None, tensors=None):
        if tensors is None:                             # else: async_save's snapshot
            flat = _tree.flatten(state_dict)
            struct_md, tensors = flat.metadata(), flat.tensors
        self.struct_md = struct_md
        self.tensors = collections.OrderedDict()
        for name, t in tensors.items():
            _st.st_dtype(t.dtype)                       # TypeError for unsupported dtypes
            if t.device.type not in ("cpu", "cuda"):
                raise TypeError("ferry.checkpoint: %r is on %s (cpu or cuda only)"
                                % (name, t.device))
            if not t.is_contiguous():
                t = t.contiguous()                      # on the tensor's own device
            self.tensors[name] = t
        self.crcs = {n: _io.u32hex(_io.crc32c_of(t)) for n, t in self.tensors.items()} \
            if crc else {}
        self.crc = bool(crc)
        self.nbytes = sum(t.numel() * t.element_size() for t in self.tensors.values())


def check_user_metadata(metadata):
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


def check_target(path):
    """The file a save of `path` replaces, checked before anything is written:
    "" is refused; a symlink is followed (the file it points to is replaced, the link
    stays); a directory is refused; a parent that is a file is refused; missing parent
    directories are created (logged)."""
    if path == "":
        _io.fail("ferry.checkpoint.save: empty path", _io.EINVAL)
    if "\0" in path:
        _io.fail("ferry.checkpoint.save: %r: a path cannot contain NUL" % (path,), _io.EINVAL)
    final = os.path.realpath(path) if os.path.islink(path) else os.path.abspath(path)
    for p in (final, final + INDEX_SUFFIX):
        if os.path.isdir(p):
            _io.fail("%s: is a directory; save needs a file name (e.g. %s)"
                     % (p, os.path.join(path, "model.safetensors")), -errno.EISDIR)
    d = os.path.dirname(final)
    up = d
    while not os.path.exists(up):
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        _io.fail("%s: cannot save %s: %s is not a directory" % (path, final, up),
                 -errno.ENOTDIR)
    if up != d:
        os.makedirs(d, exist_ok=True)
        _run.log.info("ferry.checkpoint.save: created directory %s", d)
    return final


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


def _stem(final):
    base = os.path.basename(final)
    return base[:-len(".safetensors")] if base.endswith(".safetensors") else base


def _shard_names(final, n):
    """Hugging Face's shard names: model.safetensors -> model-00001-of-00004.safetensors."""
    d, stem = os.path.dirname(final), _stem(final)
    return [os.path.join(d, "%s-%05d-of-%05d.safetensors" % (stem, i + 1, n)) for i in range(n)]


def _set_is_whole(index_path):
    """Whether the sharded set in place opens as one save (the C parser's check)."""
    try:
        ds = _ferry.Dataset(_io.context(), index_path, format="safetensors")
    except _io.FerryError:
        return False
    ds.close()
    return True


def _prev_dirs(index_path, only_dead):
    d, base = os.path.split(index_path)
    try:
        names = os.listdir(d)
    except OSError:
        return []
    return [os.path.join(d, n) for n in names if n.startswith("." + base + PREV_TAG) and
            (not only_dead or _io.dead_writer(d, n, PREV_TAG))]


def _keep_previous(index_path, names, durable):
    """Hard links to the whole set in place (index and shards) in a fresh
    .<index>.ferry-prev.* directory, so it stays loadable while its shard names are
    written over; None when there is no whole set, or links cannot be made here."""
    if not os.path.exists(index_path) or not _set_is_whole(index_path):
        return None
    for p in _prev_dirs(index_path, only_dead=True):  # older copies: the set in place is whole
        shutil.rmtree(p, ignore_errors=True)
    d = os.path.dirname(index_path)
    keep = _io.temp_name(index_path).replace(_io.TMP_TAG, PREV_TAG)
    try:
        os.mkdir(keep)
        for n in names:
            p = _safe_member(d, n)
            if p is None or "/" in n:
                raise OSError("not a plain name: %s" % n)
            os.link(p, os.path.join(keep, n))
        os.link(index_path, os.path.join(keep, os.path.basename(index_path)))
        if durable:
            _io.fsync_dir(keep)
            _io.fsync_dir(d)
    except OSError as e:
        _run.log.warning("%s: the previous set could not be kept as hard links (%s); a save "
                         "killed now may leave it mixed (loads then fail, never mix)",
                         index_path, e)
        shutil.rmtree(keep, ignore_errors=True)
        return None
    return keep


def _orphan_re(final):
    return re.compile(r"^%s-[0-9a-f]{12}-\d{5}-of-\d{5}\.safetensors$" % re.escape(_stem(final)))


def _index_files(index_path):
    """Shard file names an existing ferry/HF index names (for cleanup), or []."""
    try:
        with open(index_path, "rb") as f:
            idx = json.loads(f.read(64 << 20))
        wm = idx.get("weight_map") if isinstance(idx, dict) else None
        return sorted(set(v for v in wm.values() if isinstance(v, str))) if isinstance(
            wm, dict) else []
    except (OSError, ValueError, RecursionError):
        return []


def _safe_member(d, name):
    if not name or os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        return None
    return os.path.join(d, name)


def _unlink(p):
    try:
        os.unlink(p)
    except OSError:
        pass


def _header(names, prep, md, data_base=None, shard=""):
    """Header bytes of one file holding `names`; with prep.crc, md gains the header CRC."""
    ents = [(n, prep.tensors[n].numel() * prep.tensors[n].element_size()) for n in names]
    lay = {n: (b, e) for n, b, e in _st.layout(ents)}
    rows = [(n, _st.st_dtype(prep.tensors[n].dtype), tuple(prep.tensors[n].shape)) + lay[n]
            for n in names]
    if prep.crc:
        md[_st.HEADER_CRC_KEY] = "0" * 8                 # fixed width: the length holds
    header = _st.build_header(rows, md)
    if prep.crc:
        base = len(header)
        md[_st.HEADER_CRC_KEY] = _io.u32hex(_st.header_digest(
            md, [(n, dt, shape, base + b, e - b, shard) for n, dt, shape, b, e in rows]))
        header2 = _st.build_header(rows, md)
        assert len(header2) == len(header)
        header = header2
    return bytearray(header), lay


def _file_ops(prep, names, path, sharded, save_id, user_md, keep, ctx, files, ops, devices, temps,
              sink, direct):
    """Open the file holding `names` (at `path`, its temporary, or where sink says) and add
    the writes of its header and tensors to ops; its header (and, sharded, its rows for the
    index's CRC) to keep."""
    md = {"format": "pt"}
    md.update(user_md)
    if not sharded:
        md.update(prep.struct_md)
    else:
        md[SAVE_KEY] = save_id
    crcs = {n: prep.crcs[n] for n in names if n in prep.crcs}
    if crcs:
        md[_open.CRC_KEY] = json.dumps(crcs, separators=(",", ":"))
    header, lay = _header(names, prep, md)
    keep.append(header)
    total = len(header) + sum(e - b for b, e in lay.values())
    tmp = sink(path) if sink else path if direct else _io.temp_name(path)
    if not direct:
        temps.append(tmp)
    f = _ferry.File(ctx, tmp, "w")
    files.append(f)
    f.truncate(total)
    ops.append((len(header), lambda p, f=f, h=header: p.write_file(f, 0, len(h), h)))
    for n in names:
        t = prep.tensors[n]
        b, e = lay[n]
        if e > b:
            ops.append((e - b, lambda p, f=f, o=len(header) + b, nb=e - b, t=t:
                        p.write_file(f, o, nb, _io.buf(t))))
            if t.device.type == "cuda":
                devices.add(_io.cuda_index(t.device))
    if sharded:
        prep_rows = [(n, _st.st_dtype(prep.tensors[n].dtype), tuple(prep.tensors[n].shape),
                      len(header) + lay[n][0], lay[n][1] - lay[n][0],
                      os.path.basename(path)) for n in names]
        keep.append(prep_rows)


def write(prep, final, user_md, max_bytes, threads, durable=True, report=None, direct=False,
          sink=None, flush=None, window=4):
    """Write a prepared state dict to `final` (checked by check_target), atomically; with
    direct=True straight into `final` (an anonymous memory file: no temporary, no rename).
    sink (for object storage): sink(name) gives the path each file -- `final`, or each
    shard's URL when sharded -- is written to instead (an in-memory file); nothing is
    renamed, and the bytes of a sharded set's index are returned for the caller to write
    last (None when not sharded). flush (with sink): the files are written `window` at a
    time, each batch handed to flush([names]) once written (to be uploaded and freed), so a
    sharded save holds `window` shards in memory, not all of them."""
    sharded = max_bytes is not None and prep.nbytes > max_bytes and (not direct or sink)
    groups = _split_shards(prep, max_bytes) if sharded else [list(prep.tensors)]
    finals = _shard_names(final, len(groups)) if sharded else [final]
    index_path = final + INDEX_SUFFIX
    d = os.path.dirname(final)
    save_id = os.urandom(8).hex()
    if not direct:
        _io.remove_stale_temps(final)        # every dead writer's, in final's directory

    ctx = _io.context()
    files, temps, keep = [], [], []
    todo = list(zip(groups, finals))
    step = window if sink and flush else len(todo)
    try:
        done = 0
        for w in range(0, len(todo), step):
            batch = todo[w:w + step]
            ops, devices = [], set()
            for names, path in batch:
                _file_ops(prep, names, path, sharded, save_id, user_md, keep, ctx, files, ops,
                          devices, temps, sink, direct)
            rep = None if report is None else (lambda x, b=done: report(b + x))
            _run.run(ops, threads=threads, sync=durable and not direct, report=rep,
                     cuda_devices=devices, files=files)
            done += sum(n for n, _ in ops)
            for f in files:
                f.close()
            files = []
            if flush:
                flush([path for _, path in batch])
        if sink:
            return _index_bytes(prep, groups, finals, user_md, keep, save_id) if sharded else None
        if direct:
            return
        old_index_files = _index_files(index_path) if os.path.exists(index_path) else []
        kept = _keep_previous(index_path, old_index_files, durable) if sharded else None
        for tmp, path in zip(temps, finals):
            os.replace(tmp, path)
        temps = []
        if durable:
            _io.fsync_dir(d)
        if sharded:
            _commit_index(prep, final, index_path, groups, finals, user_md, keep, durable,
                          save_id)
            for p in ([kept] if kept else []) + _prev_dirs(index_path, only_dead=True):
                shutil.rmtree(p, ignore_errors=True)
            new = set(os.path.basename(f) for f in finals)
            for name in old_index_files:              # shards of the older save, now unused
                p = _safe_member(d, name)
                if name not in new and p and p != final:
                    _unlink(p)
            if os.path.isfile(final):                 # a single-file save would shadow us
                _unlink(final)
            _reclaim_orphans(final, new)
        elif old_index_files and _is_index(index_path):
            _unlink(index_path)                       # an older sharded save at this path
            for name in old_index_files:
                p = _safe_member(d, name)
                if p and p != final:
                    _unlink(p)
            for p in _prev_dirs(index_path, only_dead=True):
                shutil.rmtree(p, ignore_errors=True)
    finally:
        for f in files:
            try:
                f.close()
            except Exception:
                pass
        for tmp in temps:
            _unlink(tmp)


def _commit_index(prep, final, index_path, groups, finals, user_md, keep, durable, save_id):
    data = _index_bytes(prep, groups, finals, user_md, keep, save_id)
    if durable:
        _io.write_small_file_atomic(index_path, data)
    else:
        tmp = _io.temp_name(index_path)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, index_path)


def _index_bytes(prep, groups, finals, user_md, keep, save_id):
    """The index of a sharded set: Hugging Face's {"metadata", "weight_map"}, with the save
    id, the structure and the CRCs ferry keeps in its metadata."""
    wm = {}
    for names, path in zip(groups, finals):
        for n in names:
            wm[n] = os.path.basename(path)
    imd = {"total_size": prep.nbytes}
    imd.update(user_md)
    imd[SAVE_KEY] = save_id
    imd.update(prep.struct_md)
    if prep.crcs:
        imd[_open.CRC_KEY] = json.dumps(prep.crcs, separators=(",", ":"))
    if prep.crc:
        rows = [r for k in keep if isinstance(k, list) for r in k]
        imd[_st.HEADER_CRC_KEY] = _io.u32hex(_st.header_digest(imd, rows))
    index = {"metadata": imd, "weight_map": wm}
    return json.dumps(index, indent=2).encode()


def _reclaim_orphans(final, keep):
    pat, d, now = _orphan_re(final), os.path.dirname(final), time.time()
    try:
        names = os.listdir(d)
    except OSError:
        return
    for n in names:
        if n in keep or not pat.match(n):
            continue
        p = os.path.join(d, n)
        try:
            if now - os.stat(p).st_mtime > ORPHAN_AGE_S:
                os.unlink(p)
        except OSError:
            pass


def _is_index(p):
    try:
        with open(p, "rb") as f:
            idx = json.loads(f.read(64 << 20))
        return isinstance(idx, dict) and isinstance(idx.get("weight_map"), dict)
    except (OSError, ValueError, RecursionError):
        return False
