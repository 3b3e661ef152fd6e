/* statmany.c — lstat(2) of many paths at once, for formats that plan many
 * files (beside them: the engine's thread count is its only tie to the
 * context) (a Zarr array's compressed chunks: their sizes, and the directories
 * they lie in, checked to stay inside the store). One lstat costs a walk of
 * the whole path (~2 µs); a 4 GiB Zarr v3 zstd load of 4,096 chunks, each in
 * its own directory c/<t>/, makes 8,192 of them: one after the other they took
 * 17.8-19.5 ms of open + plan against ~100 ms for the job itself. Path walks
 * of distinct files scale over threads (RCU lookups), so up to the engine's
 * thread count of short-lived threads walk them in parallel while the
 * planning thread would have waited anyway: 19.5 -> 4.3 ms with 16 threads,
 * 15.7 -> 8.4-8.9 ms with 2 (BENCHMARKS.md, "Development machine"). The
 * results are exactly what lstat said (through the sysio seam), so a format's
 * checks on them are unchanged. */
#include "engine/ctx.h"   /* the context's thread count */
#include "base/sysio.h"
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>

/* Below this many paths one thread does them (a thread's start is ~20 µs). */
#define PER_THREAD 128
#define MAX_THREADS 16

typedef struct stat_work {
    char *const *paths;
    size_t n;
    struct stat *st;
    int *err;
    _Atomic size_t next;
} stat_work;

enum { CLAIM = 16 };   /* paths a thread claims at a time: one atomic per 16 walks */

static void *stat_loop(void *arg) {
    stat_work *w = arg;
    for (;;) {
        size_t lo = atomic_fetch_add(&w->next, CLAIM);
        if (lo >= w->n) return NULL;
        size_t hi = lo + CLAIM < w->n ? lo + CLAIM : w->n;
        for (size_t i = lo; i < hi; i++) {
            if (!w->paths[i]) { w->err[i] = ENOENT; continue; }
            w->err[i] = ferry_sys()->lstat(w->paths[i], &w->st[i]) == 0 ? 0 : errno;
        }
    }
}

void ferry_lstat_many(ferry_ctx *ctx, char *const *paths, size_t n, struct stat *st, int *err) {
    stat_work w = {paths, n, st, err, 0};
    int want = ctx && ctx->cfg.threads > 0 ? ctx->cfg.threads : 1;
    if (want > MAX_THREADS) want = MAX_THREADS;
    if ((size_t)want > n / PER_THREAD) want = (int)(n / PER_THREAD);
    pthread_t th[MAX_THREADS];
    int started = 0;
    for (int i = 1; i < want; i++) {   /* this thread is the first */
        if (pthread_create(&th[started], NULL, stat_loop, &w) != 0) break;   /* fewer threads: still all done */
        started++;
    }
    stat_loop(&w);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
}
