/* fdio.c — transfers on a descriptor: full-length pread/preadv/pwrite
 * (EINTR, short transfers) through the system-call table, and how much of a
 * range the page cache holds. No file object, no context: the floor under
 * the engine's files. */
#include "common.h"
#include "base/sysio.h"
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

int64_t ferry_pread_full(int fd, void *buf, size_t len, uint64_t off) {
    size_t done = 0;
    while (done < len) {
        ssize_t r = ferry_sys()->pread(fd, (uint8_t *)buf + done, len - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (r == 0) break;   /* end of file */
        done += (size_t)r;
    }
    return (int64_t)done;
}

int64_t ferry_preadv_full(int fd, struct iovec *iov, int n, uint64_t off) {
    uint64_t done = 0;
    while (n > 0) {
        ssize_t r = ferry_sys()->preadv(fd, iov, n, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (r == 0) break;   /* end of file */
        done += (uint64_t)r;
        /* a short transfer: skip the filled vectors, trim the partial one */
        while (n > 0 && (size_t)r >= iov->iov_len) { r -= (ssize_t)iov->iov_len; iov++; n--; }
        if (n > 0 && r) { iov->iov_base = (uint8_t *)iov->iov_base + r; iov->iov_len -= (size_t)r; }
    }
    return (int64_t)done;
}

int64_t ferry_pwrite_full(int fd, const void *buf, size_t len, uint64_t off) {
    size_t done = 0;
    while (done < len) {
        ssize_t r = ferry_sys()->pwrite(fd, (const uint8_t *)buf + done, len - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (r == 0) return -EIO;
        done += (size_t)r;
    }
    return (int64_t)done;
}

/* Page-cache residency: cachestat(2) where the kernel has it (Linux 6.5+),
 * else mincore(2) over a temporary mapping. */
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct ferry_cachestat_range { uint64_t off, len; };
struct ferry_cachestat { uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted; };

int64_t ferry_file_cached_fd(int fd, uint64_t offset, uint64_t len, uint64_t fsize) {
    if (fd < 0) return -EBADF;   /* a remote object: no page cache to ask */
    if (offset >= fsize || len == 0) return 0;
    if (len > fsize - offset) len = fsize - offset;
    long page = sysconf(_SC_PAGESIZE);
    static _Atomic int no_cachestat;
    if (!no_cachestat) {
        struct ferry_cachestat_range r = {offset, len};
        struct ferry_cachestat cs;
        if (syscall(__NR_cachestat, fd, &r, &cs, 0) == 0) {
            uint64_t pages = (len + (uint64_t)page - 1) / (uint64_t)page;
            uint64_t c = cs.nr_cache > pages ? pages : cs.nr_cache;
            uint64_t b = c * (uint64_t)page;
            return (int64_t)(b > len ? len : b);
        }
        if (errno == ENOSYS) no_cachestat = 1;
    }
    uint64_t start = offset & ~(uint64_t)(page - 1);
    uint64_t maplen = len + (offset - start);
    void *m = mmap(NULL, maplen, PROT_READ, MAP_SHARED, fd, (off_t)start);
    if (m == MAP_FAILED) return -errno;
    size_t npages = (maplen + (uint64_t)page - 1) / (uint64_t)page;
    unsigned char stackvec[256];
    unsigned char *vec = npages <= sizeof stackvec ? stackvec : malloc(npages);
    int64_t res;
    if (!vec) res = FERRY_ENOMEM;
    else if (mincore(m, maplen, vec) != 0) res = -errno;
    else {
        uint64_t n = 0;
        for (size_t i = 0; i < npages; i++) n += vec[i] & 1;
        uint64_t b = n * (uint64_t)page;
        res = (int64_t)(b > len ? len : b);
    }
    if (vec != stackvec) free(vec);
    munmap(m, maplen);
    return res;
}
