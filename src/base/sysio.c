/* sysio.c — the system-call table of sysio.h and the test seam that swaps
 * its entries. Every entry defaults to libc's function; open goes through a
 * wrapper because libc's is variadic. */
#include "common.h"
#include "engine/sysio.h"
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

static int sys_open(const char *path, int flags, mode_t mode) { return open(path, flags, mode); }

static const ferry_sys_api libc_ = {sys_open, close, pread, preadv, pwrite, fsync, fstat, stat, lstat, ftruncate, madvise, mmap, posix_fadvise, access};
static ferry_sys_api table_ = {sys_open, close, pread, preadv, pwrite, fsync, fstat, stat, lstat, ftruncate, madvise, mmap, posix_fadvise, access};

const ferry_sys_api *ferry_sys(void) { return &table_; }

int ferry_test_set_syscall(const char *name, void *fn) {
    static const struct { const char *name; size_t off; } slots[] = {
        {"open", offsetof(ferry_sys_api, open)},     {"close", offsetof(ferry_sys_api, close)},
        {"pread", offsetof(ferry_sys_api, pread)},   {"preadv", offsetof(ferry_sys_api, preadv)},
        {"pwrite", offsetof(ferry_sys_api, pwrite)}, {"fsync", offsetof(ferry_sys_api, fsync)},
        {"fstat", offsetof(ferry_sys_api, fstat)},   {"stat", offsetof(ferry_sys_api, stat)},
        {"lstat", offsetof(ferry_sys_api, lstat)},
        {"ftruncate", offsetof(ferry_sys_api, ftruncate)}, {"madvise", offsetof(ferry_sys_api, madvise)},
        {"mmap", offsetof(ferry_sys_api, mmap)},     {"posix_fadvise", offsetof(ferry_sys_api, fadvise)},
        {"access", offsetof(ferry_sys_api, access)},
    };
    if (!name) {   /* all back to libc */
        table_ = libc_;
        return 0;
    }
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (!strcmp(name, slots[i].name)) {
            void **slot = (void **)((char *)&table_ + slots[i].off);
            *slot = fn ? fn : *(void *const *)((const char *)&libc_ + slots[i].off);
            return 0;
        }
    return ferry_seterr(FERRY_EINVAL, "ferry_test_set_syscall: no system call \"%s\"", name);
}
