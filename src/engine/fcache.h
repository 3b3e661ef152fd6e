/* fcache.h — the context's cache of files opened by path (chunk files of a
 * store, one .npy per sample). Internal; a leaf: it knows files only as
 * ferry_file pointers. */
#ifndef FERRY_ENGINE_FCACHE_H
#define FERRY_ENGINE_FCACHE_H
#include "ferry.h"
#include <pthread.h>
#include <stdint.h>

typedef struct ferry_fc_entry ferry_fc_entry;

typedef struct ferry_fcache {
    pthread_mutex_t lock;
    ferry_fc_entry **buckets;     /* by hash of the path */
    size_t nbuckets, count, cap;  /* cap: bounded by RLIMIT_NOFILE */
    ferry_fc_entry *lru_head, *lru_tail;   /* unreferenced entries, oldest first */
    uint64_t opens, hits, reopens;        /* for tests */
} ferry_fcache;

int ferry_fcache_init(ferry_fcache *c);
/* Close every file (none may be in use). */
void ferry_fcache_free(ferry_fcache *c);
/* The open file for path, as it is now: an entry is trusted for one job
 * (job_id); the first use by another job stats the path and reopens it when
 * the path names another file (device, inode), or the size or mtime changed —
 * a file replaced, rewritten or truncated between batches is read afresh,
 * never stale. nofollow: opened as a FERRY_EXTENT_NOFOLLOW read (no symlink
 * but one resolving under root); an entry opened otherwise is not reused for
 * it. Opening happens outside the lock (workers open in parallel).
 * The caller releases the entry with ferry_fcache_put. */
int ferry_fcache_get(ferry_fcache *c, ferry_ctx *ctx, const char *path, int nofollow, const char *root,
                     uint64_t job_id, ferry_file **file, ferry_fc_entry **entry);
void ferry_fcache_put(ferry_fcache *c, ferry_fc_entry *entry);
#endif
