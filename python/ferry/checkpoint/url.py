"""Paths, URLs and in-memory files for ferry.checkpoint.

A path with a scheme is never taken as a local path: file:// URLs are local files;
http://, https://, s3:// and gs:// objects are read by the C library (remote.py), and
s3:// and gs:// written by it (S3 multipart upload); http(s):// destinations are refused
by it. Other URLs (memory://, hf://, ...) go through fsspec when it is installed -- the
checkpoint is built in memory and written with one fs.open(url, "wb") (loads: read with
one fs.open(url, "rb")) -- and are refused with a FerryError when it is not.
In-memory files are Linux memfds, reached by the C library as /proc/self/fd/N."""
from __future__ import annotations

import errno
import os
import re

from . import io as _io

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


OBJECT_SCHEMES = ("http", "https", "s3", "gs")   # read (and s3, gs written) by the C library
WRITE_SCHEMES = ("s3", "gs")


def scheme(url):
    """The lowercase scheme of a URL split() called "url"."""
    return _SCHEME.match(url).group(1).lower()


def is_object(url):
    """Whether the C library reads this URL itself (no fsspec)."""
    return scheme(url) in OBJECT_SCHEMES


def split(path):
    """("local", path) or ("url", url) for what a caller passed (str, bytes, PathLike)."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError("ferry.checkpoint: a path must be str, bytes or os.PathLike, not %s"
                        % type(path).__name__)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    m = _SCHEME.match(path)
    if not m:
        return "local", path
    if m.group(1).lower() == "file":
        from urllib.parse import unquote, urlsplit
        u = urlsplit(path)
        if u.netloc not in ("", "localhost"):
            _io.fail("%s: file:// URLs name a local file (file:///abs/path), not host %r"
                     % (path, u.netloc), _io.EINVAL)
        return "local", unquote(u.path)
    return "url", path


def filesystem(url):
    """(fsspec filesystem, path inside it), or FerryError when fsspec is missing."""
    try:
        import fsspec
    except ImportError:
        _io.fail("%s: a URL, and fsspec is not installed (pip install fsspec plus the "
                 "file system's package, e.g. s3fs); ferry.checkpoint never takes a URL as "
                 "a local path" % url, _io.EUNSUPPORTED)
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        _io.fail("%s: fsspec cannot open this URL: %s" % (url, e), _io.EUNSUPPORTED)


class MemFile:
    """An anonymous in-memory file the C library opens by path (/proc/self/fd/N)."""

    def __init__(self, data=None, name="ferry-checkpoint"):
        if not hasattr(os, "memfd_create"):
            _io.fail("ferry.checkpoint: in-memory checkpoints need Linux (memfd_create)",
                     _io.EUNSUPPORTED)
        self.fd = os.memfd_create(name, getattr(os, "MFD_CLOEXEC", 0))
        self.path = "/proc/self/fd/%d" % self.fd
        if data is not None:
            view = memoryview(data).cast("B")
            off = 0
            while off < len(view):
                off += os.pwrite(self.fd, view[off:off + (1 << 30)], off)

    def read(self):
        size = os.fstat(self.fd).st_size
        out = bytearray(size)
        view, off = memoryview(out), 0
        while off < size:
            n = os.preadv(self.fd, [view[off:]], off)
            if n <= 0:
                _io.fail("ferry.checkpoint: in-memory file ended early", -errno.EIO)
            off += n
        return bytes(out)

    def close(self):
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()
