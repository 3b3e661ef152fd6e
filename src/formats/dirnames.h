/* dirnames.h — the names in one directory, sorted, for presence tests.
 * Internal; a leaf: it needs only common.h.
 *
 * A Zarr plan touching very many chunks asks, per chunk, whether its file
 * exists; beyond a few tens of thousands of chunks one listing of their
 * directory answers that faster than an lstat each (zarr.c). */
#ifndef FERRY_FORMATS_DIRNAMES_H
#define FERRY_FORMATS_DIRNAMES_H
#include "common.h"

typedef struct ferry_dirnames {
    char *dir;        /* the directory listed (NULL: none yet) */
    char **names;     /* n names, sorted (strcmp) */
    size_t n;
    char *buf;        /* their bytes */
    size_t len;
} ferry_dirnames;

/* List dir (dl bytes of it) into d, replacing what d held: 0, or 1 when it
 * holds more than max_names entries (d then empty, with no directory: the
 * caller looks at each file itself), or a negative code (no memory; a
 * directory that cannot be read other than by not existing). A directory
 * that does not exist lists as empty. */
int ferry_dirnames_load(ferry_dirnames *d, const char *dir, size_t dl, size_t max_names);
/* Whether d holds d->dir's listing (dl bytes of dir). */
int ferry_dirnames_is(const ferry_dirnames *d, const char *dir, size_t dl);
/* Whether name is in the listing. */
int ferry_dirnames_has(const ferry_dirnames *d, const char *name);
void ferry_dirnames_free(ferry_dirnames *d);
#endif
