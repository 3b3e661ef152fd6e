/* io.c — full-length pread/pwrite (EINTR, short transfers) and the O_DIRECT
 * decision. */
#include "engine/io.h"
#include "engine/sysio.h"
#include <errno.h>
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

int ferry_use_direct(ferry_file *f, int policy, uint64_t off, uint64_t len, int writing) {
    if (policy == FERRY_DIRECT_OFF || f->remote) return 0;   /* O_DIRECT is a local file's */
    if (policy == FERRY_DIRECT_AUTO) {
        if (len < FERRY_DIRECT_MIN) return 0;
        if (!writing) {
            int64_t sz = ferry_file_size(f);
            if (sz <= 0) return 0;
            int64_t cached = ferry_file_cached_fd(f->fd, off, len, (uint64_t)sz);
            /* Mostly resident: buffered reads run at memory speed. */
            if (cached < 0 || (uint64_t)cached * 2 >= len) return 0;
        }
    }
    return ferry_file_direct_fd(f) >= 0;
}
