/* zarr_remote.h — a Zarr store at a URL (s3://, gs://, http(s)://): what
 * zarr.c asks of a local directory, asked of objects. Metadata documents are
 * fetched once per open (a small ranged read each) and kept; a store's
 * members are found by listing (s3://, gs://; a web server has no listing:
 * there the store needs consolidated metadata); chunk sizes come from a
 * listing of their directory or, where there is none, from opening each chunk
 * object, many at a time; a missing chunk object (404) is absent, the fill
 * value, as a missing chunk file is. Internal. */
#ifndef FERRY_FORMATS_ZARR_REMOTE_H
#define FERRY_FORMATS_ZARR_REMOTE_H
#include "common.h"
#include <stddef.h>
#include <stdint.h>

typedef struct ferry_zremote ferry_zremote;

/* 1 when path is a URL read remotely (not file://). */
int ferry_zremote_is_url(const char *path);
int ferry_zremote_open(ferry_ctx *ctx, const char *root, ferry_zremote **out);
void ferry_zremote_close(ferry_zremote *z);
/* The document at url: 1 with *text (NUL-terminated, owned by z) and *len; 0
 * when there is no such object; a negative code naming url. At most max bytes. */
int ferry_zremote_doc(ferry_zremote *z, const char *url, size_t max, const char **text, size_t *len);
/* The sub-"directories" of dir (a URL), sorted, malloc'ed (free each and the
 * array). FERRY_EUNSUPPORTED naming the store where objects cannot be listed. */
int ferry_zremote_children(ferry_zremote *z, const char *dir, size_t max, char ***names, int *n);
/* The documents docs[0..ndocs) of each member names[0..n) of dir, fetched at
 * once on several threads into the cache ferry_zremote_doc reads (a store
 * without consolidated metadata: one request per document, not one after
 * another). Failures are not kept: the parser asks again and reports them. */
void ferry_zremote_prefetch_docs(ferry_zremote *z, const char *dir, char *const *names, int n,
                                 const char *const *docs, int ndocs, size_t max);
/* 1 when a Zarr store (zarr.json, .zgroup, .zarray or .zmetadata) is at url. */
int ferry_zremote_probe(ferry_ctx *ctx, const char *url);

/* A plan call's knowledge of chunk objects: the listing of the last chunk
 * directory, and sizes fetched ahead (ferry_zremote_prefetch). */
typedef struct ferry_zchunks ferry_zchunks;
ferry_zchunks *ferry_zchunks_new(void);
void ferry_zchunks_free(ferry_zchunks *c);
/* Size of the chunk object at url: 1 (*size set), 0 absent, or a negative
 * code naming url (and the HTTP status). */
int ferry_zremote_chunk(ferry_zremote *z, ferry_zchunks *c, const char *url, uint64_t *size);
/* Sizes of urls[0..n) (chunk objects under the array's URL dir, spread over
 * ndirs directories, of total chunks in its grid) fetched ahead for later
 * ferry_zremote_chunk calls. A store that can be listed: nothing where few
 * directories are touched (each is listed when first asked), one listing of
 * everything under dir where the call touches a quarter of the array or more,
 * else as a web server's: the objects opened at once on several threads. */
int ferry_zremote_prefetch(ferry_zremote *z, ferry_zchunks *c, char *const *urls, size_t n, const char *dir,
                           size_t ndirs, uint64_t total);
#endif
