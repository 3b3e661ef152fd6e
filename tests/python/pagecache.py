"""Taking a file out of the page cache, for tests of what ferry does with cold files."""
import os


def drop_from_page_cache(path):
    """Write back and drop `path`'s cached pages (posix_fadvise DONTNEED): the next read of it
    is cold, except on file systems that keep every page (tmpfs), which the test must check."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
