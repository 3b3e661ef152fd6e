/* list.h — what a bucket holds under a prefix: S3's ListObjectsV2 (signed,
 * page after page) for s3:// and, with HMAC keys, gs://; GCS's JSON API
 * (anonymous, public buckets) for gs:// without keys. For Zarr stores
 * without consolidated metadata, chunk sizes, and globs over objects.
 * Internal. */
#ifndef FERRY_SOURCES_LIST_H
#define FERRY_SOURCES_LIST_H
#include <stddef.h>
#include <stdint.h>
#include "sources/ropts.h"

typedef struct ferry_remote_entry {
    char *name;      /* relative to the prefix listed */
    uint64_t size;   /* bytes of an object; 0 for a sub-prefix */
    int dir;         /* 1: a sub-prefix ("directory"; name without its trailing '/') */
} ferry_remote_entry;

typedef struct ferry_remote_listing {
    ferry_remote_entry *e;   /* sorted by name (bytewise) */
    size_t n, cap;
} ferry_remote_listing;

/* 1 when url names objects that can be listed (s3://, gs://). */
int ferry_remote_can_list(const char *url);
/* List the keys that start with url's key part (s3://bucket/PREFIX, also
 * s3://bucket for all; "dir/" lists dir's keys, "dir/a" the keys starting
 * with "dir/a"). one_level: keys directly under the prefix, and the
 * sub-prefixes as dir entries ('/' delimits); else every key below. More than
 * max entries: FERRY_EINVAL naming the URL. 0, or a negative code with a
 * message naming the URL, the HTTP status and the server's message. */
int ferry_remote_list(const char *url, const ferry_remote_opts *o, int one_level, size_t max, ferry_remote_listing *out);
void ferry_remote_listing_free(ferry_remote_listing *l);
/* The entry named name (an object, not a sub-prefix), or NULL. */
const ferry_remote_entry *ferry_remote_listing_find(const ferry_remote_listing *l, const char *name);

/* The pure halves, fuzzed and tested without a server: one page of a
 * ListObjectsV2 XML body or a GCS JSON list body appended to out (names
 * with the prefix, which every key must start with, taken off); *next gets
 * the continuation token (malloc'ed) or NULL when the listing is complete. */
int ferry_list_parse_s3(const char *body, size_t n, const char *prefix, ferry_remote_listing *out, size_t max,
                        char **next);
int ferry_list_parse_gcs(const char *body, size_t n, const char *prefix, ferry_remote_listing *out, size_t max,
                         char **next);
#endif
