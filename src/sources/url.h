/* url.h — the one URL rule of ferry: which strings are URLs, and what a
 * remote object's URL means (where its requests go, what they sign).
 * Internal; a leaf (the caller reads the environment and passes it in, so
 * that tests give every input). */
#ifndef FERRY_SOURCES_URL_H
#define FERRY_SOURCES_URL_H
#include <stddef.h>

typedef enum ferry_url_scheme {
    FERRY_URL_NONE = 0,   /* a plain path */
    FERRY_URL_FILE,       /* file:///path (host empty or localhost) */
    FERRY_URL_HTTP,
    FERRY_URL_HTTPS,
    FERRY_URL_S3,         /* s3://bucket/key */
    FERRY_URL_GS,         /* gs://bucket/key */
    FERRY_URL_OTHER       /* scheme://... of a kind ferry does not read */
} ferry_url_scheme;

/* What the parse of an s3:// or gs:// URL takes from outside the URL. */
typedef struct ferry_url_env {
    const char *endpoint;   /* "http(s)://host[:port]" or NULL: the service's own */
    const char *region;     /* S3 signing region; NULL: us-east-1 */
    int addressing;         /* 0 auto, 1 path style, 2 virtual-hosted style */
} ferry_url_env;

typedef struct ferry_url {
    ferry_url_scheme scheme;
    char *bucket;      /* s3, gs */
    char *key;         /* s3, gs: the object key as written; file: the local path (decoded) */
    char *host;        /* the Host header: host[:port] */
    char *path;        /* the request path, percent-encoded as sent and signed */
    char *query;       /* http(s): the query as written, without '?'; else "" */
    char *url;         /* the request URL: scheme://host/path[?query] */
    char *region;      /* s3: signing region */
    int virtual_host;  /* s3: the bucket is in the host name */
} ferry_url;

/* The scheme of s (FERRY_URL_NONE for a plain path: no "name://" prefix). */
ferry_url_scheme ferry_url_scheme_of(const char *s);
/* Parse s (env may be NULL: defaults). 0, or FERRY_EINVAL with a message
 * naming s and what is wrong. ferry_url_free releases it (also after a
 * failed parse). */
int ferry_url_parse(const char *s, const ferry_url_env *env, ferry_url *out);
void ferry_url_free(ferry_url *u);
/* Percent-encode src as SigV4's UriEncode: unreserved characters
 * (A-Z a-z 0-9 - _ . ~) stay, '/' stays when keep_slash, the rest become %XX.
 * Returns a malloc'ed string or NULL. */
char *ferry_url_encode(const char *src, size_t n, int keep_slash);
#endif
