/* sysio.h — the system calls under ferry's file I/O and allocations, in one
 * table that tests replace to make them fail on purpose (SQLite's
 * xSetSystemCall; the public seam is ferry_test_set_syscall in ferry.h).
 * Internal; a leaf. */
#ifndef FERRY_ENGINE_SYSIO_H
#define FERRY_ENGINE_SYSIO_H
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef struct ferry_sys_api {
    int (*open)(const char *path, int flags, mode_t mode);
    int (*close)(int fd);
    ssize_t (*pread)(int fd, void *buf, size_t n, off_t off);
    ssize_t (*preadv)(int fd, const struct iovec *iov, int n, off_t off);
    ssize_t (*pwrite)(int fd, const void *buf, size_t n, off_t off);
    int (*fsync)(int fd);
    int (*fstat)(int fd, struct stat *st);
    int (*stat)(const char *path, struct stat *st);
    int (*lstat)(const char *path, struct stat *st);   /* formats' plan-time lookups (zarr.c, statmany.c) */
    int (*ftruncate)(int fd, off_t len);
    int (*madvise)(void *p, size_t n, int advice);
    void *(*mmap)(void *addr, size_t n, int prot, int flags, int fd, off_t off);   /* files' mappings (mapread.c) */
    int (*fadvise)(int fd, off_t off, off_t len, int advice);   /* cold records' hints (pack.c) */
    int (*access)(const char *path, int mode);   /* whether nvidia-fs is loaded: GDS native (cuda/cufile.c) */
} ferry_sys_api;

/* The table in use (libc's functions unless a test replaced some). */
const ferry_sys_api *ferry_sys(void);
#endif
