/* hostmem.c — host memory ferry allocates for arrays it returns and for its
 * own plain staging: 2 MiB-aligned anonymous mappings advised for transparent
 * huge pages, left untouched so that the workers that fill them fault their
 * pages in (in parallel, one 2 MiB page per fault where THP is on) instead of
 * the allocating thread touching 4 KiB at a time. numpy gets THP for its large
 * allocations the same way; ferry's posix_memalign did not (16.4 vs 21.4 GB/s
 * into fresh memory; BENCHMARKS.md, T3 for ferry.read today). Where THP is off (or madvise is
 * refused) the mapping is plain 4 KiB pages: same semantics, no error.
 * Smaller blocks come from posix_memalign (4 KiB aligned). */
#include "engine/engine.h"
#include "engine/sysio.h"
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_2M ((size_t)2 << 20)

static size_t round_page(size_t n) { return (n + 4095) & ~(size_t)4095; }

int ferry_host_alloc(ferry_ctx *ctx, size_t size, void **out) {
    (void)ctx;
    if (!out) return ferry_seterr(FERRY_EINVAL, "ferry_host_alloc: NULL out");
    *out = NULL;
    if (size < HUGE_2M) {
        void *p;
        if (posix_memalign(&p, 4096, round_page(size ? size : 1)) != 0)
            return ferry_seterr(FERRY_ENOMEM, "out of memory (%zu bytes)", size);
        *out = p;
        return 0;
    }
    size_t len = round_page(size), span = len + HUGE_2M;
    if (span < len) return ferry_seterr(FERRY_ENOMEM, "out of memory (%zu bytes)", size);
    uint8_t *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return ferry_seterr(FERRY_ENOMEM, "out of memory (%zu bytes): %s", size, strerror(errno));
    /* keep the 2 MiB-aligned part, give back the rest */
    uint8_t *a = (uint8_t *)(((uintptr_t)m + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1));
    if (a > m) munmap(m, (size_t)(a - m));
    size_t tail = (size_t)((m + span) - (a + len));
    if (tail) munmap(a + len, tail);
    /* advice only: EINVAL where the kernel has no THP, ignored where it is off */
    ferry_sys()->madvise(a, len, MADV_HUGEPAGE);
    *out = a;
    return 0;
}

void ferry_host_free(ferry_ctx *ctx, void *p, size_t size) {
    (void)ctx;
    if (!p) return;
    if (size < HUGE_2M) free(p);
    else munmap(p, round_page(size));
}
