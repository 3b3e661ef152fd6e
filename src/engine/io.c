/* io.c — the O_DIRECT decision (the full-length transfers it goes with are
 * base/fdio.c's). */
#include "engine/io.h"
#include "engine/sysio.h"
#include <errno.h>
#include <sys/uio.h>
#include <unistd.h>

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
