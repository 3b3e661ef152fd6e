/* file.c — open files: a buffered descriptor always, an O_DIRECT descriptor
 * and a cuFile handle lazily (each opened once per file, never per task);
 * or, for a URL, a remote object read through sources/ behind the same
 * ferry_file (ferry_file_read is the one place that tells them apart). */
#include "engine/engine.h"
#include "engine/io.h"
#include "engine/mapread.h"
#include "engine/sysio.h"
#include "engine/remotectx.h"
#include "sources/remote.h"
#include "sources/url.h"
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static int file_from_fd(ferry_ctx *ctx, int fd, const char *path, int flags, ferry_file **out);

/* A remote object as a ferry_file: no descriptor, O_DIRECT refused (-2),
 * cuFile refused with its reason, the size it had at open. */
static int open_remote(ferry_ctx *ctx, const char *url, int flags, ferry_file **out) {
    if (flags & (FERRY_WRITE | FERRY_CREATE | FERRY_TRUNC))
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: remote objects are read-only here (open with FERRY_READ)", url);
    ferry_remote *r;
    int rc = ferry_remote_open_opts(url, ferry_ctx_remote_opts(ctx), &r);
    if (rc < 0) return rc;
    ferry_file *f = calloc(1, sizeof *f);
    char *p = strdup(url);
    if (!f || !p) { free(f); free(p); ferry_remote_close(r); return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", url); }
    f->ctx = ctx;
    f->path = p;
    f->remote = r;
    f->fd = -1;
    f->dfd = -2;
    f->flags = FERRY_READ;
    f->size0 = (off_t)ferry_remote_size(r);
    f->cf_state = FERRY_ENOCUFILE;
    snprintf(f->cf_why, sizeof f->cf_why, "a remote object: GPUDirect Storage reads local files only");
    atomic_store(&f->map_state, -1);
    pthread_mutex_init(&f->lock, NULL);
    *out = f;
    return 0;
}

int ferry_file_open_internal(ferry_ctx *ctx, const char *path, int flags, ferry_file **out) {
    *out = NULL;
    if (!path || !*path) return ferry_seterr(FERRY_EINVAL, "empty path");
    if (!(flags & (FERRY_READ | FERRY_WRITE)))
        return ferry_seterr(FERRY_EINVAL, "%s: open flags need FERRY_READ or FERRY_WRITE", path);
    if (flags & ~(FERRY_READ | FERRY_WRITE | FERRY_CREATE | FERRY_TRUNC | FERRY_ANY_FILE))
        return ferry_seterr(FERRY_EINVAL, "%s: unknown open flags 0x%x", path, (unsigned)flags);
    ferry_url_scheme scheme = ferry_url_scheme_of(path);
    if (scheme == FERRY_URL_FILE) {   /* file:///path: the local file, named as given */
        ferry_url u;
        int rc = ferry_url_parse(path, NULL, &u);
        if (rc == 0) {
            rc = ferry_file_open_internal(ctx, u.key, flags, out);
            if (rc == 0) {
                char *p = strdup(path);
                if (p) { free((*out)->path); (*out)->path = p; }
            }
        }
        ferry_url_free(&u);
        return rc;
    }
    if (scheme != FERRY_URL_NONE) return open_remote(ctx, path, flags, out);
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer forever
     * (the file type is only known once it is open); cleared again below */
    int oflags = O_CLOEXEC | O_NONBLOCK;
    if ((flags & FERRY_READ) && (flags & FERRY_WRITE)) oflags |= O_RDWR;
    else if (flags & FERRY_WRITE) oflags |= O_WRONLY;
    else oflags |= O_RDONLY;
    if (flags & FERRY_CREATE) oflags |= O_CREAT;
    if (flags & FERRY_TRUNC) oflags |= O_TRUNC;
    const ferry_sys_api *sys = ferry_sys();
    int fd = sys->open(path, oflags, 0644);
    if (fd < 0) {
        int e = errno;
        return ferry_seterr(-e, "%s: cannot open: %s", path, strerror(e));
    }
    return file_from_fd(ctx, fd, path, flags, out);
}

static int file_from_fd(ferry_ctx *ctx, int fd, const char *path, int flags, ferry_file **out) {
    const ferry_sys_api *sys = ferry_sys();
    struct stat st;
    if (sys->fstat(fd, &st) != 0) {
        int e = errno;
        sys->close(fd);
        return ferry_seterr(-e, "%s: fstat: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        sys->close(fd);
        return ferry_seterr(-EISDIR, "%s: is a directory", path);
    }
    if (!S_ISREG(st.st_mode) && !(flags & FERRY_ANY_FILE)) {
        const char *kind = S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISCHR(st.st_mode) ? "a character device"
                         : S_ISBLK(st.st_mode) ? "a block device" : S_ISSOCK(st.st_mode) ? "a socket" : "not a file";
        sys->close(fd);
        return ferry_seterr(FERRY_EINVAL, "%s: is %s, not a regular file (FERRY_ANY_FILE opens it)", path, kind);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    ferry_file *f = calloc(1, sizeof *f);
    char *p = strdup(path);
    if (!f || !p) { free(f); free(p); sys->close(fd); return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path); }
    f->ctx = ctx;
    f->path = p;
    f->fd = fd;
    f->flags = flags;
    f->dfd = -1;
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    f->size0 = st.st_size;
    f->mtime0 = st.st_mtim;
    pthread_mutex_init(&f->lock, NULL);
    *out = f;
    return 0;
}

/* 1 when the resolved path r lies under root (itself resolved). */
static int under_root(const char *r, const char *root) {
    size_t rl = strlen(root);
    while (rl > 1 && root[rl - 1] == '/') rl--;
    return !strncmp(r, root, rl) && (r[rl] == 0 || r[rl] == '/' || rl == 1);
}

/* O_NOFOLLOW: a chunk file that is a symlink cannot lead the read out of its
 * store (the directories on the way were checked by the planner). Only a
 * symlink costs a realpath; then the resolved path, which has no links left,
 * is opened (a link swapped in meanwhile fails with ELOOP). file_from_fd
 * refuses anything but a regular file (O_NONBLOCK: a FIFO fails at once). */
int ferry_file_open_nofollow(ferry_ctx *ctx, const char *path, const char *root, ferry_file **out, int *linked) {
    *out = NULL;
    if (linked) *linked = 0;
    if (!path || !*path) return ferry_seterr(FERRY_EINVAL, "empty path");
    const ferry_sys_api *sys = ferry_sys();
    const int oflags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
    int fd = sys->open(path, oflags, 0);
    if (fd < 0 && errno == ELOOP) {
        char *r = realpath(path, NULL);
        if (!r) {
            int e = errno;   /* a dangling link: ENOENT, absent */
            return ferry_seterr(-e, "%s: cannot open: %s", path, strerror(e));
        }
        int rc = 0;
        if (!root) rc = ferry_seterr(-ELOOP, "%s: is a symlink (to %s); not followed for this read", path, r);
        else if (!under_root(r, root))
            rc = ferry_seterr(-EACCES, "%s: resolves to %s, outside the store %s (a symlink leading out is refused)",
                              path, r, root);
        else if ((fd = sys->open(r, oflags, 0)) < 0) {
            int e = errno;
            rc = ferry_seterr(-e, "%s: cannot open %s: %s", path, r, strerror(e));
        }
        free(r);
        if (rc < 0) return rc;
        if (linked) *linked = 1;
    } else if (fd < 0) {
        int e = errno;
        return ferry_seterr(-e, "%s: cannot open: %s", path, strerror(e));
    }
    return file_from_fd(ctx, fd, path, FERRY_READ, out);
}

int ferry_file_open_extent(ferry_ctx *ctx, const ferry_extent *e, ferry_file **out) {
    if (e->flags & FERRY_EXTENT_NOFOLLOW) return ferry_file_open_nofollow(ctx, e->path, e->root, out, NULL);
    return ferry_file_open_internal(ctx, e->path, FERRY_READ, out);
}

int ferry_file_open(ferry_ctx *ctx, const char *path, int flags, ferry_file **out) {
    if (!ctx || !out) return ferry_seterr(FERRY_EINVAL, "ferry_file_open: NULL argument");
    return ferry_file_open_internal(ctx, path, flags, out);
}

int ferry_file_close(ferry_file *f) {
    if (!f) return 0;
    int rc = 0;
    if (f->cf_state == 1) {
        const ferry_cufile_api *cf = ferry_cufile_load(NULL);
        if (cf) cf->HandleDeregister(f->cfh);
    }
    if (f->dfd >= 0) ferry_sys()->close(f->dfd);
    ferry_map_release(f);
    if (f->remote) ferry_remote_close(f->remote);
    else if (ferry_sys()->close(f->fd) != 0) rc = ferry_seterr(-errno, "%s: close: %s", f->path, strerror(errno));
    pthread_mutex_destroy(&f->lock);
    free(f->path);
    free(f);
    return rc;
}

int64_t ferry_file_size(ferry_file *f) {
    if (f->remote) return (int64_t)ferry_remote_size(f->remote);   /* the version pinned at open */
    struct stat st;
    if (ferry_sys()->fstat(f->fd, &st) != 0) return ferry_seterr(-errno, "%s: fstat: %s", f->path, strerror(errno));
    return (int64_t)st.st_size;
}

const char *ferry_file_path(const ferry_file *f) { return f ? f->path : ""; }

int64_t ferry_file_read(ferry_file *f, void *buf, size_t len, uint64_t off) {
    if (f->remote) return ferry_remote_pread(f->remote, buf, len, off);
    return ferry_pread_full(f->fd, buf, len, off);
}

int64_t ferry_file_readv(ferry_file *f, struct iovec *iov, int n, uint64_t off) {
    if (!f->remote) return ferry_preadv_full(f->fd, iov, n, off);
    /* vectors of one contiguous range: read one after the other */
    uint64_t done = 0;
    for (int i = 0; i < n; i++) {
        int64_t r = ferry_remote_pread(f->remote, iov[i].iov_base, iov[i].iov_len, off + done);
        if (r < 0) return r;
        done += (uint64_t)r;
        if ((size_t)r < iov[i].iov_len) break;   /* the object ends */
    }
    return (int64_t)done;
}

int ferry_file_sync(ferry_file *f) {
    if (f->remote) return 0;   /* read-only: nothing to make durable */
    if (ferry_sys()->fsync(f->fd) != 0) return ferry_seterr(-errno, "%s: fsync: %s", f->path, strerror(errno));
    return 0;
}

int ferry_file_truncate(ferry_file *f, uint64_t size) {
    if (f->remote) return ferry_seterr(FERRY_EUNSUPPORTED, "%s: remote objects are read-only", f->path);
    if (ferry_sys()->ftruncate(f->fd, (off_t)size) != 0)
        return ferry_seterr(-errno, "%s: ftruncate to %llu: %s", f->path, (unsigned long long)size, strerror(errno));
    return 0;
}

int ferry_file_direct_fd(ferry_file *f) {
    int d = __atomic_load_n(&f->dfd, __ATOMIC_ACQUIRE);
    if (d >= 0) return d;
    if (d == -2) return -1;
    pthread_mutex_lock(&f->lock);
    if (f->dfd == -1) {
        int oflags = O_CLOEXEC | O_DIRECT;
        if ((f->flags & FERRY_READ) && (f->flags & FERRY_WRITE)) oflags |= O_RDWR;
        else if (f->flags & FERRY_WRITE) oflags |= O_WRONLY;
        else oflags |= O_RDONLY;
        /* A second open file description (O_DIRECT is a property of the
         * description: a dup would share it with the buffered fd), of the
         * same file: through /proc/self/fd, which names the open inode even
         * after a rename replaced the path; by path only where /proc is
         * missing. Either way it must be the inode the buffered fd has — a
         * file renamed over the path between the two opens would pair one
         * file's header with another file's bytes — else no O_DIRECT at all
         * (buffered reads of the right file). tmpfs and some FUSE file
         * systems refuse O_DIRECT. */
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", f->fd);
        int fd = ferry_sys()->open(proc, oflags, 0);
        if (fd < 0 && (errno == ENOENT || errno == ENOTDIR)) fd = ferry_sys()->open(f->path, oflags, 0);
        struct stat st;
        if (fd >= 0 && (ferry_sys()->fstat(fd, &st) != 0 || st.st_dev != f->dev || st.st_ino != f->ino)) {
            ferry_sys()->close(fd);
            fd = -1;
        }
        __atomic_store_n(&f->dfd, fd >= 0 ? fd : -2, __ATOMIC_RELEASE);
    }
    d = f->dfd;
    pthread_mutex_unlock(&f->lock);
    return d >= 0 ? d : -1;
}

int ferry_file_cufile(ferry_file *f, ferry_cufile_handle *out) {
    pthread_mutex_lock(&f->lock);
    int rc;
    if (f->cf_state == 0) {
        const char *why;
        const ferry_cufile_api *cf = ferry_cufile_load(&why);
        if (!cf) {
            f->cf_state = FERRY_ENOCUFILE;
            snprintf(f->cf_why, sizeof f->cf_why, "%s", why);
        } else {
            pthread_mutex_unlock(&f->lock);
            int dfd = ferry_file_direct_fd(f);
            pthread_mutex_lock(&f->lock);
            if (f->cf_state == 0) {
                if (dfd < 0) {
                    f->cf_state = FERRY_ENOCUFILE;
                    snprintf(f->cf_why, sizeof f->cf_why, "the file system refuses O_DIRECT");
                } else {
                    ferry_cufile_descr d;
                    memset(&d, 0, sizeof d);
                    d.type = 1;
                    d.handle.fd = dfd;
                    ferry_cufile_error e = cf->HandleRegister(&f->cfh, &d);
                    if (e.err == 0) f->cf_state = 1;
                    else {
                        f->cf_state = FERRY_ENOCUFILE;
                        snprintf(f->cf_why, sizeof f->cf_why, "cuFileHandleRegister failed: %s (%d)",
                                 ferry_cufile_errstr(e.err), e.err);
                    }
                }
            }
        }
    }
    if (f->cf_state == 1) { *out = f->cfh; rc = 0; }
    else rc = ferry_seterr(f->cf_state, "%s: %s", f->path, f->cf_why);
    pthread_mutex_unlock(&f->lock);
    return rc;
}

int64_t ferry_file_cached(ferry_file *f, uint64_t offset, uint64_t len) {
    if (f->remote) return 0;   /* nothing of it is in the page cache */
    int64_t sz = ferry_file_size(f);
    if (sz < 0) return sz;
    int64_t r = ferry_file_cached_fd(f->fd, offset, len, (uint64_t)sz);
    if (r < 0) return ferry_seterr((int)r, "%s: page-cache residency: %s", f->path, ferry_strerror((int)r));
    return r;
}
