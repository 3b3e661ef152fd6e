/* fcache.c — files opened by path, kept open across jobs: a Zarr store's
 * chunks or a directory of per-sample .npy files are opened once per context,
 * not per batch. Every job checks, once per file, that the path still names
 * the file it opened (stat: device, inode, size, mtime); otherwise it opens
 * the new one. The number of open entries is bounded by RLIMIT_NOFILE (each
 * may also hold an O_DIRECT descriptor); unused entries are closed oldest
 * first. */
#include "engine/engine.h"
#include "engine/sysio.h"
#include "engine/fcache.h"
#include "sources/remote.h"
#include <errno.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>

struct ferry_fc_entry {
    char *path;
    uint64_t hash;
    ferry_file *f;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    uint64_t checked_job;         /* the last job that checked it */
    int refs;
    int dead;                     /* replaced: out of the table, closed at refs 0 */
    int nofollow;                 /* opened for FERRY_EXTENT_NOFOLLOW reads ... */
    char *link_root;              /* ... through a symlink checked under this root */
    ferry_fc_entry *hnext, *prev, *next;   /* bucket chain; LRU links while refs == 0 */
};

static uint64_t hash_path(const char *s) {
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

int ferry_fcache_init(ferry_fcache *c) {
    memset(c, 0, sizeof *c);
    struct rlimit rl;
    uint64_t lim = 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) lim = rl.rlim_cur;
    else if (getrlimit(RLIMIT_NOFILE, &rl) == 0) lim = 1u << 20;
    /* half the descriptors left after 64 for the application, two per entry */
    uint64_t cap = lim > 128 ? (lim - 64) / 4 : 8;
    if (cap < 8) cap = 8;
    if (cap > 16384) cap = 16384;
    c->cap = (size_t)cap;
    c->nbuckets = 64;
    while (c->nbuckets < c->cap) c->nbuckets *= 2;
    c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
    if (!c->buckets) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    pthread_mutex_init(&c->lock, NULL);
    return 0;
}

static void lru_unlink(ferry_fcache *c, ferry_fc_entry *e) {
    if (e->prev) e->prev->next = e->next; else if (c->lru_head == e) c->lru_head = e->next;
    if (e->next) e->next->prev = e->prev; else if (c->lru_tail == e) c->lru_tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push(ferry_fcache *c, ferry_fc_entry *e) {
    e->prev = c->lru_tail;
    e->next = NULL;
    if (c->lru_tail) c->lru_tail->next = e; else c->lru_head = e;
    c->lru_tail = e;
}

static void table_unlink(ferry_fcache *c, ferry_fc_entry *e) {
    ferry_fc_entry **pp = &c->buckets[e->hash & (c->nbuckets - 1)];
    while (*pp && *pp != e) pp = &(*pp)->hnext;
    if (*pp) *pp = e->hnext;
    c->count--;
}

static void entry_free(ferry_fc_entry *e) {
    ferry_file_close(e->f);
    free(e->link_root);
    free(e->path);
    free(e);
}

void ferry_fcache_free(ferry_fcache *c) {
    if (!c->buckets) return;
    for (size_t b = 0; b < c->nbuckets; b++)
        for (ferry_fc_entry *e = c->buckets[b], *n; e; e = n) { n = e->hnext; entry_free(e); }
    free(c->buckets);
    c->buckets = NULL;
    pthread_mutex_destroy(&c->lock);
}

static int same_file(const ferry_fc_entry *e, const struct stat *st) {
    return e->dev == st->st_dev && e->ino == st->st_ino && e->size == st->st_size &&
           e->mtime.tv_sec == st->st_mtim.tv_sec && e->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

/* Under the lock: close unused entries until there is room for one more. */
static void make_room(ferry_fcache *c, ferry_fc_entry **closing) {
    while (c->count >= c->cap && c->lru_head) {
        ferry_fc_entry *e = c->lru_head;
        lru_unlink(c, e);
        table_unlink(c, e);
        e->hnext = *closing;   /* closed after the lock is released */
        *closing = e;
    }
}

static void close_list(ferry_fc_entry *e) {
    for (ferry_fc_entry *n; e; e = n) { n = e->hnext; entry_free(e); }
}

/* An entry serves a NOFOLLOW read only if it was opened with the same care:
 * without links, or through one checked under the same root. */
static int serves(const ferry_fc_entry *e, int nofollow, const char *root) {
    if (!nofollow) return 1;
    return e->nofollow && (!e->link_root || (root && !strcmp(e->link_root, root)));
}

int ferry_fcache_get(ferry_fcache *c, ferry_ctx *ctx, const char *path, int nofollow, const char *root,
                     uint64_t job_id, ferry_file **file, ferry_fc_entry **entry) {
    uint64_t h = hash_path(path);
    *file = NULL;
    *entry = NULL;
    ferry_fc_entry *stale = NULL;
    pthread_mutex_lock(&c->lock);
    ferry_fc_entry *e = c->buckets[h & (c->nbuckets - 1)];
    while (e && (e->hash != h || strcmp(e->path, path) != 0)) e = e->hnext;
    if (e && !serves(e, nofollow, root)) {   /* opened following links: open it again, with care */
        table_unlink(c, e);
        e->dead = 1;
        c->reopens++;
        if (e->refs == 0) { lru_unlink(c, e); e->hnext = NULL; stale = e; }
        e = NULL;
    }
    if (e) {
        if (e->refs++ == 0) lru_unlink(c, e);
        if (e->checked_job == job_id) {
            c->hits++;
            pthread_mutex_unlock(&c->lock);
            *file = e->f;
            *entry = e;
            return 0;
        }
    }
    pthread_mutex_unlock(&c->lock);
    close_list(stale);
    if (e) {   /* first use by this job: is it still the file at this path? */
        struct stat st;
        /* a remote object is not asked again (a request per object per
         * job): its reads are conditional on the version opened, and one
         * that found it replaced marks it, so the next job opens it afresh */
        if (e->f->remote ? !ferry_remote_changed(e->f->remote) : ferry_sys()->stat(path, &st) == 0 && same_file(e, &st)) {
            pthread_mutex_lock(&c->lock);
            e->checked_job = job_id;
            c->hits++;
            pthread_mutex_unlock(&c->lock);
            *file = e->f;
            *entry = e;
            return 0;
        }
        /* replaced, rewritten, truncated or gone: never read it again */
        pthread_mutex_lock(&c->lock);
        if (!e->dead) { e->dead = 1; table_unlink(c, e); c->reopens++; }
        pthread_mutex_unlock(&c->lock);
        ferry_fcache_put(c, e);
    }
    ferry_file *f;
    int linked = 0;
    int rc = nofollow ? ferry_file_open_nofollow(ctx, path, root, &f, &linked)
                      : ferry_file_open_internal(ctx, path, FERRY_READ, &f);
    if (rc < 0) return rc;
    ferry_fc_entry *n = calloc(1, sizeof *n);
    if (!n || !(n->path = strdup(path)) || (linked && !(n->link_root = strdup(root)))) {
        if (n) free(n->path);
        free(n);
        ferry_file_close(f);
        return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
    }
    n->hash = h;
    n->f = f;
    /* the identity the open's own fstat saw (file.c): one fstat per open */
    n->dev = f->dev;
    n->ino = f->ino;
    n->size = f->size0;
    n->mtime = f->mtime0;
    n->checked_job = job_id;
    n->refs = 1;
    n->nofollow = nofollow;
    ferry_fc_entry *closing = NULL;
    pthread_mutex_lock(&c->lock);
    c->opens++;
    /* another worker may have opened the same path meanwhile: keep both
     * correct by letting the newer one replace the table entry */
    ferry_fc_entry **pp = &c->buckets[h & (c->nbuckets - 1)];
    for (ferry_fc_entry *o = *pp; o; o = o->hnext)
        if (o->hash == h && !strcmp(o->path, path)) {
            table_unlink(c, o);
            o->dead = 1;
            if (o->refs == 0) { lru_unlink(c, o); o->hnext = closing; closing = o; }
            break;
        }
    make_room(c, &closing);
    n->hnext = *pp;
    *pp = n;
    c->count++;
    pthread_mutex_unlock(&c->lock);
    close_list(closing);
    *file = f;
    *entry = n;
    return 0;
}

void ferry_fcache_put(ferry_fcache *c, ferry_fc_entry *e) {
    if (!e) return;
    ferry_fc_entry *closing = NULL;
    pthread_mutex_lock(&c->lock);
    if (--e->refs == 0) {
        if (e->dead) { e->hnext = NULL; closing = e; }
        else {
            lru_push(c, e);
            make_room(c, &closing);
        }
    }
    pthread_mutex_unlock(&c->lock);
    close_list(closing);
}
