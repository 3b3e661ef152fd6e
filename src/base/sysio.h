/* sysio.h — the system calls under ferry's file I/O and allocations, in one
 * table that tests replace to make them fail on purpose (SQLite's
 * xSetSystemCall; the public seam is ferry_test_set_syscall in ferry.h), and
 * the descriptor transfers built on it (fdio.c). Internal; the floor. */
#ifndef FERRY_BASE_SYSIO_H
#define FERRY_BASE_SYSIO_H
#include <stddef.h>
#include <stdint.h>
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

/* fdio.c: pread/pwrite until len bytes or EOF (reads); -errno on failure. */
int64_t ferry_pread_full(int fd, void *buf, size_t len, uint64_t off);
int64_t ferry_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);
/* preadv until the vectors are full or EOF (it modifies iov); -errno on failure. */
int64_t ferry_preadv_full(int fd, struct iovec *iov, int n, uint64_t off);
/* Page-cache bytes of [off, off+len) of fd (file size fsize): cachestat(2)
 * where the kernel has it, else mincore(2) over a temporary mapping; -errno
 * (no message) on failure, -EBADF for fd < 0. */
int64_t ferry_file_cached_fd(int fd, uint64_t offset, uint64_t len, uint64_t fsize);
#endif
