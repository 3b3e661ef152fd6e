/* refstargets.h — the files and objects a kerchunk reference set points
 * into, each resolved and looked at once. Internal; used by refs.c.
 *
 * A target is named as the reference spells it: a path relative to the
 * set's directory, an absolute path, a file:// URL, or an http(s)/s3/gs URL
 * (read through the remote source). A local file must resolve inside the
 * set's directory (inside.h) unless the opener allowed files outside; it
 * must exist and be a regular file. A remote object is opened once for its
 * size. The first plan that needs a target does this, under a lock (a
 * dataset may be planned from many threads); the answer, good or bad, is
 * kept for the dataset's life. */
#ifndef FERRY_FORMATS_REFSTARGETS_H
#define FERRY_FORMATS_REFSTARGETS_H
#include "common.h"
#include <pthread.h>

typedef struct ferry_refs_target {
    char *spelled;         /* as the reference names it */
    char *path;            /* what is read: a local path or a URL */
    int state;             /* 0 not looked at, 1 ok, < 0 the error code (why) */
    char *why;
    uint64_t size;
} ferry_refs_target;

typedef struct ferry_refs_targets {
    ferry_refs_target *t;
    size_t n, cap;
    size_t *hash;          /* open addressing by spelling, SIZE_MAX empty */
    size_t mask;
    const char *dir;       /* the set's directory as spelled (a URL's for a remote set) */
    const char *rootdir;   /* its realpath; NULL for a remote set */
    int allow_outside;
    pthread_mutex_t lock;
    int lock_ok;
} ferry_refs_targets;

/* dir and rootdir must outlive T. 0, or FERRY_ENOMEM. */
int ferry_refs_targets_init(ferry_refs_targets *T, const char *dir, const char *rootdir, int allow_outside);
void ferry_refs_targets_free(ferry_refs_targets *T);
/* The index of the target spelled so, added when new (file names the set in messages). */
int ferry_refs_target_add(ferry_refs_targets *T, const char *file, const char *spelled, uint32_t *out);
/* Target i resolved and looked at (once): 1 and *out, or its negative code
 * (the reason in (*out)->why, which the caller puts in its own message). */
int ferry_refs_target_get(ferry_refs_targets *T, ferry_ctx *ctx, uint32_t i, const ferry_refs_target **out);

#endif
