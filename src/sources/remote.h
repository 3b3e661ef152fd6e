/* remote.h — remote objects (http://, https://, s3://, gs://) read like
 * files: the seam file.c calls. Each object is pinned to the version it had
 * at open (its ETag, else its Last-Modified date): every later range request
 * is conditional on it, so an object replaced during a read is an error
 * naming it, never a mix of two versions. Internal. */
#ifndef FERRY_SOURCES_REMOTE_H
#define FERRY_SOURCES_REMOTE_H
#include <stddef.h>
#include <stdint.h>
#include "sources/ropts.h"

typedef struct ferry_remote ferry_remote;

/* 1 when path is a URL read remotely (http, https, s3, gs, or a scheme ferry
 * refuses); 0 for plain paths and file:// URLs. */
int ferry_remote_is_url(const char *path);
/* Open the object at url: one ranged GET of its first bytes (kept: headers
 * are read from them without another request) gives its size and version.
 * 0, or a negative code with a message naming url. Without libcurl:
 * FERRY_EUNSUPPORTED naming the scheme. */
int ferry_remote_open(const char *url, ferry_remote **out);
/* The same with the caller's options (ropts.h; NULL: the environment's only). */
int ferry_remote_open_opts(const char *url, const ferry_remote_opts *o, ferry_remote **out);
/* The size of the object at url by one request for its first byte (nothing kept open):
 * 0, -ENOENT when there is none (HTTP 404), or another negative code naming
 * url and the HTTP status. */
int ferry_remote_stat(const char *url, const ferry_remote_opts *o, uint64_t *size);
uint64_t ferry_remote_size(const ferry_remote *r);
/* Read [off, off+len) into buf: len bytes, fewer only where the object
 * ends; a negative code with a message (byte range, HTTP status, the
 * server's message) on failure. Thread-safe: many workers read one object. */
int64_t ferry_remote_pread(ferry_remote *r, void *buf, size_t len, uint64_t off);
/* 1 once a read found the object replaced since open (a cache of open
 * files opens it afresh for the next job). */
int ferry_remote_changed(const ferry_remote *r);
void ferry_remote_close(ferry_remote *r);
/* Validate the FERRY_REMOTE_* variables (ferry_ctx_create). */
int ferry_remote_check_env(void);
/* The bounds every remote request keeps (FERRY_REMOTE_*, read now):
 * requests in flight, retries of one request, the time after which nothing
 * is retried, the stall time. Uploads (s3_upload.c) keep the reads' bounds.
 * 0, or FERRY_EINVAL naming the variable. */
int ferry_remote_limits(int *connections, int *retries, double *retry_s, double *stall_s);
/* The CA bundle HTTPS requests trust (FERRY_REMOTE_CA_BUNDLE, else
 * CURL_CA_BUNDLE, SSL_CERT_FILE) into path, or "" for libcurl's default. */
int ferry_remote_ca_bundle(char *path, size_t cap);
/* Seconds to wait before retry number `attempt` (1, 2, ...): 0.2 s doubling
 * to 10 s, with "equal jitter" (libcurl builds only). */
double ferry_remote_backoff(int attempt);
#endif
