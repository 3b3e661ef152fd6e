/* mapread.c — small records copied out of a mapping of their file.
 *
 * A pread of 8 KiB from the page cache costs a system call and a page-cache
 * lookup per page on top of the copy: 16 threads of random 8 KiB preads stop
 * near 40 GB/s, while a copy of the same bytes out of a mapping of the file is
 * a memcpy at memory speed (2 threads over random 8,192-byte windows of a 2 GB
 * file in the page cache: pread 6.3 GB/s, memcpy from the mapping 14.9).
 * TokenDataset's 8 KiB windows read at 0.74-0.88 x the random 8 KiB pread
 * limit with the mapping (BENCHMARKS.md, T2), 0.56-0.59 x without. So warm
 * small records (pack.c decides which) are copied from a read-only shared
 * mapping of the whole file, made once per open file.
 *
 * A mapping has one hazard a pread has not: touching a page beyond the end of
 * a file that was truncated after it was mapped (or a page the disk cannot
 * read) raises SIGBUS instead of returning an error. Every copy therefore
 * runs under a guard: a SIGBUS handler, installed once and chained to the one
 * it replaced, jumps out of a guarded copy, the file's mapping is marked
 * broken, and the caller preads instead — which reports the short read or the
 * I/O error with the file's name and byte, as without a mapping. A fault
 * outside a guarded copy goes to the previous handler (or the default
 * action), as if ferry had installed none. Another library that installs its
 * own SIGBUS handler later (torch's DataLoader workers do) is chained to as
 * well: the guard checks every few thousand copies that its handler is still
 * the one in place and puts it back in front otherwise. */
#include "engine/engine.h"
#include "engine/mapread.h"
#include "engine/sysio.h"
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>

/* ---- the SIGBUS guard ------------------------------------------------------ */
static _Thread_local sigjmp_buf *volatile guard_;
static _Thread_local unsigned copies_;
static struct sigaction prev_;                 /* the handler ours replaced */
static pthread_mutex_t install_mu_ = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int installed_;                 /* set under install_mu_ */
static _Thread_local int chaining_;            /* in the previous handler: one that chains back to ours ends here */

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    sigjmp_buf *g = guard_;
    if (g) {
        guard_ = NULL;
        siglongjmp(*g, 1);
    }
    struct sigaction p = prev_;
    if (!chaining_) {
        chaining_ = 1;
        if ((p.sa_flags & SA_SIGINFO) && p.sa_sigaction) { p.sa_sigaction(sig, si, uc); chaining_ = 0; return; }
        if (!(p.sa_flags & SA_SIGINFO) && p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) {
            p.sa_handler(sig);
            chaining_ = 0;
            return;
        }
        chaining_ = 0;
    }
    /* the default action: returning re-runs the access, which now ends the
     * process as it would have without ferry */
    signal(SIGBUS, SIG_DFL);
}

static int is_ours(const struct sigaction *sa) { return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == on_sigbus; }

/* Put the handler in front of SIGBUS (again), keeping the one there to chain to. */
static int install(void) {
    pthread_mutex_lock(&install_mu_);
    struct sigaction cur;
    int ok = sigaction(SIGBUS, NULL, &cur) == 0;
    if (ok && !is_ours(&cur)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;   /* NODEFER: not left blocked after the jump */
        sigemptyset(&sa.sa_mask);
        prev_ = cur;
        ok = sigaction(SIGBUS, &sa, NULL) == 0;
    }
    if (ok) installed_ = 1;
    pthread_mutex_unlock(&install_mu_);
    return ok;
}

static int guard_ready(void) {
    if ((copies_++ & 4095) != 0 && installed_) return 1;
    struct sigaction cur;
    if (installed_ && sigaction(SIGBUS, NULL, &cur) == 0 && is_ours(&cur)) return 1;
    return install();
}

/* ---- the mapping --------------------------------------------------------- */
/* A file is mapped only once the page cache holds all of it (but a 256th):
 * a copy from a mapping that touches a page not in memory is a major fault,
 * a synchronous read of that page alone (MADV_RANDOM: no read-around, which
 * would read 128 KiB for a 4 KiB window), where a pread of the record is one
 * request and pack.c's cold hints put a whole task's in flight. A token file
 * larger than the page cache, or one read cold in its first epoch, so keeps
 * its preads; the residency check (one cachestat over the file) is made again
 * every RECHECK_S seconds, or 50 times its own duration if that is longer,
 * until the file is resident. pack.c's per-task check still decides each
 * task: pages evicted later fault, which is slow, never wrong. */
#define RECHECK_S 1.0

static int map_file(ferry_file *f) {
    pthread_mutex_lock(&f->lock);
    int st = atomic_load(&f->map_state);
    /* the size it had when opened (no second fstat): bytes it has grown by
     * since are read with pread; FERRY_ANY_FILE may be a device */
    const uint64_t size = f->size0 > 0 ? (uint64_t)f->size0 : 0;
    if (st == 0 && (!(f->flags & FERRY_READ) || (f->flags & (FERRY_WRITE | FERRY_ANY_FILE)) || size == 0 || f->fd < 0 ||
                    size > (uint64_t)SIZE_MAX))
        st = -1;
    double t0 = st == 0 ? ferry_now() : 0;
    if (st == 0 && t0 >= atomic_load(&f->map_check_at)) {
        int64_t c = ferry_file_cached_fd(f->fd, 0, size, size);
        double took = ferry_now() - t0;
        if (c >= 0 && (uint64_t)c >= size - size / 256) {
            void *m = ferry_sys()->mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, f->fd, 0);
            if (m == MAP_FAILED) st = -1;
            else {
                ferry_sys()->madvise(m, (size_t)size, MADV_RANDOM);   /* only a hint: failure changes nothing */
                f->map = m;
                f->map_len = size;
                st = 1;
            }
        } else {
            atomic_store(&f->map_check_at, t0 + (50 * took > RECHECK_S ? 50 * took : RECHECK_S));
        }
    }
    if (st != 0) atomic_store_explicit(&f->map_state, st, memory_order_release);
    pthread_mutex_unlock(&f->lock);
    return st;
}

int ferry_map_read(ferry_file *f, void *dst, uint64_t off, uint64_t len) {
    int st = atomic_load_explicit(&f->map_state, memory_order_acquire);
    /* not yet resident: looked at again only once its time has come (a
     * clock read, not the lock, per record until then) */
    if (st == 0 && ferry_now() >= atomic_load_explicit(&f->map_check_at, memory_order_relaxed)) st = map_file(f);
    if (st != 1 || off > f->map_len || len > f->map_len - off || !guard_ready()) return 0;
    sigjmp_buf env;
    if (sigsetjmp(env, 0)) {   /* the copy faulted: this file's mapping is not used again */
        atomic_store(&f->map_state, -1);
        return 0;
    }
    guard_ = &env;
    atomic_signal_fence(memory_order_seq_cst);   /* the copy stays between the guard's two stores */
    memcpy(dst, f->map + off, (size_t)len);
    atomic_signal_fence(memory_order_seq_cst);
    guard_ = NULL;
    return 1;
}

void ferry_map_release(ferry_file *f) {
    if (f->map) munmap(f->map, (size_t)f->map_len);
    f->map = NULL;
    f->map_len = 0;
}
