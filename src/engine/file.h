/* file.h — an open file: a buffered descriptor, lazily an O_DIRECT one and a
 * cuFile handle, all of one inode; or a remote object (sources/remote.h),
 * which has none of them. Internal; a leaf. */
#ifndef FERRY_ENGINE_FILE_H
#define FERRY_ENGINE_FILE_H
#include "common.h"
#include "cuda/cufile.h"
#include "base/sysio.h"   /* ferry_file_cached_fd */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>
#include <time.h>

struct ferry_remote;

struct ferry_file {
    ferry_ctx *ctx;
    char *path;
    struct ferry_remote *remote;  /* a remote object (fd -1, no O_DIRECT, no cuFile), or NULL */
    int fd;                       /* buffered descriptor */
    dev_t dev;                    /* the file it opened: every other descriptor */
    ino_t ino;                    /* (O_DIRECT, cuFile's) must be this inode */
    off_t size0;                  /* its size and mtime when opened (the open-file */
    struct timespec mtime0;       /* cache's identity check, without a second fstat) */
    int flags;                    /* FERRY_READ/WRITE/... */
    pthread_mutex_t lock;         /* guards the lazy members below */
    int dfd;                      /* O_DIRECT descriptor: -1 not tried, -2 refused */
    ferry_cufile_handle cfh;      /* registered cuFile handle (on dfd) */
    int cf_state;                 /* 0 untried, 1 registered, <0 failed (code) */
    char cf_why[160];
    _Atomic int written;          /* a job wrote to it (for FERRY_SYNC) */
    _Atomic int map_state;        /* its read-only mapping (mapread.c): 0 untried, 1 mapped, -1 none or broken */
    uint8_t *map;                 /* set before map_state becomes 1 */
    uint64_t map_len;             /* the file's size when it was mapped */
    _Atomic double map_check_at;  /* ferry_now() from which an unmapped file's residency is looked at again */
    _Atomic int share_counted;    /* 2: its size is in ctx->share_used; 1: being added (cacheshare.c) */
};

/* The seam every read of a file's bytes goes through: [off, off+len) into
 * buf, len bytes or fewer where the file ends. A local file: pread (-errno on
 * failure, no message); a remote object: its range requests (a negative code
 * with the message set). */
int64_t ferry_file_read(ferry_file *f, void *buf, size_t len, uint64_t off);
/* The same into vectors (it modifies iov). */
struct iovec;
int64_t ferry_file_readv(ferry_file *f, struct iovec *iov, int n, uint64_t off);
/* Lazily opened O_DIRECT descriptor; -1 when the file system refuses it. */
int ferry_file_direct_fd(ferry_file *f);
/* Registered cuFile handle, or a negative code with a message. */
int ferry_file_cufile(ferry_file *f, ferry_cufile_handle *out);
int ferry_file_open_internal(ferry_ctx *ctx, const char *path, int flags, ferry_file **out);
/* Read-only open for a FERRY_EXTENT_NOFOLLOW extent (see ferry.h): a regular
 * file, or a symlink resolving under root. *linked (may be NULL) is set when
 * the path was a symlink, followed. */
int ferry_file_open_nofollow(ferry_ctx *ctx, const char *path, const char *root, ferry_file **out, int *linked);
/* The file an extent names by path, opened read-only as its flags say. */
int ferry_file_open_extent(ferry_ctx *ctx, const ferry_extent *e, ferry_file **out);
#endif
