/* io.h — low-level file transfers used by the paths. Internal. */
#ifndef FERRY_ENGINE_IO_H
#define FERRY_ENGINE_IO_H
#include "engine/file.h"
#include "engine/limits.h"
#include "base/sysio.h"   /* the full-length transfers and page-cache residency (base/fdio.c) */
/* The smallest range AUTO reads or writes with O_DIRECT: below it the page
 * cache costs less than a device round trip. */
#define FERRY_DIRECT_MIN (1u << 20)
/* Whether to use O_DIRECT for this range under `policy` (ferry_direct):
 * AUTO: ranges of FERRY_DIRECT_MIN or more that are mostly not in the page cache (reads),
 * or 1 MiB or more (writes). Also requires the file system to accept O_DIRECT. */
int ferry_use_direct(ferry_file *f, int policy, uint64_t off, uint64_t len, int writing);

static inline uint64_t ferry_align_down(uint64_t x) { return x & ~(uint64_t)(FERRY_ALIGN - 1); }
static inline uint64_t ferry_align_up(uint64_t x) { return (x + FERRY_ALIGN - 1) & ~(uint64_t)(FERRY_ALIGN - 1); }
#endif
