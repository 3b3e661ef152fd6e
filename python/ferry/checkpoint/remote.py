"""Checkpoints in object storage (s3://, gs://) through the C library.

Saves: each file (the checkpoint, or each shard) is written by the engine into an anonymous
in-memory file, then uploaded from its mapping, without a copy, by ferry_object_write: one
PUT, or an S3 multipart upload that is aborted on any failure -- the object appears whole
or not at all. Shards are written and uploaded SHARDS_AT_ONCE at a time, so a save holds
that many shards in memory. A sharded save uploads its shards under Hugging Face's names, each stamped
with the save's id, then the index (the commit point), then deletes what the previous save
left that this one does not use (the old index's other shards; a single file at the same
name, which a load would find first). Loads: the C parser opens the URL (a directory URL
ending in "/" opens its model.safetensors.index.json or model.safetensors) and reads every
object pinned to the version (ETag) it opened; a reader that meets the index of one save
and a shard of another is refused by the parser (-ESTALE) and opens the set again
(open.py): two saves are never mixed.

http:// and https:// destinations are refused by the C library (no write protocol).
"""
from __future__ import annotations

import mmap
import os

from . import io as _io
from . import run as _run
from . import url as _url
from . import writer as _save
from .. import _ferry

INDEX_SUFFIX = _save.INDEX_SUFFIX


def check_writable(url):
    """Refuse, before any work, a URL the C library does not write (http://, https://, a
    folder s3://b/dir/): an empty write there is refused without a request."""
    if _url.scheme(url) not in _url.WRITE_SCHEMES or url.endswith("/"):
        _ferry.object_write(url, b"")


def _upload(url, mf):
    size = os.fstat(mf.fd).st_size
    if size == 0:
        _ferry.object_write(url, b"")
        return 0
    with mmap.mmap(mf.fd, size, prot=mmap.PROT_READ) as m:
        _ferry.object_write(url, m)
    return size


SHARDS_AT_ONCE = 4   # shards uploaded side by side: many small shards are not one round trip each


def _upload_all(files):
    """Upload every (url, in-memory file) of files, up to SHARDS_AT_ONCE at once (each
    call releases the GIL; its parts run side by side within it). The first FerryError
    is raised once all have ended (none is left half done: each is whole or absent)."""
    items = list(files.items())
    if len(items) == 1:
        return [_upload(*items[0])]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(min(SHARDS_AT_ONCE, len(items)), thread_name_prefix="ferry-upload") as ex:
        futs = [ex.submit(_upload, u, mf) for u, mf in items]
        return [f.result() for f in futs]


def _shards_of(index_url):
    """Shard URLs the index in place names (for cleanup), or [] where there is none or it
    does not open."""
    try:
        ds = _ferry.Dataset(_io.context(), index_url, format="safetensors")
    except _io.FerryError:
        return []
    try:
        return sorted(set(row[5] for row in ds.table()))
    finally:
        ds.close()


def _delete(url):
    try:
        _ferry.object_delete(url)
    except _io.FerryError as e:   # the save itself is complete: say so, keep going
        _run.log.warning("%s: left in place: %s", url, e)


def save(prep, url, user_md, max_bytes, threads, report=None):
    """Write a prepared state dict to the object `url` (and its shards beside it)."""
    files, sizes, written = {}, [], []

    def sink(path):
        mf = _url.MemFile(name="ferry-upload")
        files[path] = mf
        return mf.path

    def flush(paths):            # a batch of files written: upload it, then free its memory
        batch = {p: files[p] for p in paths}
        try:
            sizes.extend(_upload_all(batch))
            written.extend(paths)
        finally:
            for p, mf in batch.items():
                mf.close()
                del files[p]

    index_url = url + INDEX_SUFFIX
    old = _shards_of(index_url)  # what the save in place uses, before any of it is replaced
    try:
        index = _save.write(prep, url, user_md, max_bytes, threads, durable=False, report=report,
                            direct=True, sink=sink, flush=flush, window=SHARDS_AT_ONCE)
        if index is not None:
            _ferry.object_write(index_url, index)  # the commit point
            _delete(url)                          # a single file here would be opened first
            new = set(written)
            for s in old:
                if s not in new:
                    _delete(s)
        elif old:
            _delete(index_url)                    # an older sharded save at this name
            for s in old:
                if s != url:
                    _delete(s)
        _run.log.info("save %s: %d bytes in %d object%s", url, sum(sizes), len(sizes),
                      "" if len(sizes) == 1 else "s")
    finally:
        for mf in files.values():
            mf.close()
