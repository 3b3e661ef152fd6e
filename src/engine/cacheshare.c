/* cacheshare.c — how much of the page cache a context's data sets may count
 * on keeping: half the machine's memory.
 *
 * Two decisions rest on it, both about files a caller reads again and again
 * (a dataset's shards, epoch after epoch):
 *   - read-around windows (pack.c, hint_range): the neighbours a window reads
 *     are used only if they are still cached when their turn comes;
 *   - FERRY_REREAD jobs reading through the page cache instead of O_DIRECT
 *     (exec.c): the next epoch finds the bytes in memory only if the epoch
 *     before did not evict them.
 * A data set larger than the share would evict itself before it comes round
 * again: then windows cost their whole size per record and the page cache
 * costs a copy for nothing, so both stop. Files are counted once each, as
 * they are first asked about — a shuffled data set's shards open one by one
 * — and the share never comes back within a context: the bytes already read
 * the other way cost at most the share, once. A file the open-file cache
 * (fcache.c) closed and opened again is counted again: the count errs on the
 * side of a data set larger than memory. */
#include "engine/cacheshare.h"
#include <sched.h>
#include <unistd.h>

static _Atomic uint64_t share_override;
void ferry_cache_share_set(uint64_t bytes) { atomic_store(&share_override, bytes); }

static uint64_t share_bytes(void) {
    static _Atomic uint64_t half;
    uint64_t o = atomic_load(&share_override);
    if (o) return o;
    uint64_t v = atomic_load(&half);
    if (!v) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        v = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : 1;
        atomic_store(&half, v);
    }
    return v;
}

/* f->share_counted: 0 not yet, 1 being counted, 2 counted. A worker asking
 * while another counts the same file waits for the verdict (a few
 * instructions away): before, it took the file as held because share_full
 * was not set yet, so one read of a data set past the share kept the page
 * cache (and was announced) while the rest read as others. */
int ferry_cache_share_holds(ferry_ctx *ctx, ferry_file *f) {
    if (atomic_load(&ctx->share_full)) return 0;
    int fresh = 0;
    if (atomic_compare_exchange_strong(&f->share_counted, &fresh, 1)) {
        uint64_t size = f->size0 > 0 ? (uint64_t)f->size0 : 0;
        if (atomic_fetch_add(&ctx->share_used, size) + size > share_bytes()) atomic_store(&ctx->share_full, 1);
        atomic_store(&f->share_counted, 2);
    } else {
        while (atomic_load(&f->share_counted) != 2) sched_yield();
    }
    return !atomic_load(&ctx->share_full);
}
