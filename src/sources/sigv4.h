/* sigv4.h — SHA-256, HMAC-SHA256 and AWS Signature Version 4 request
 * signing (header-based). Internal; a leaf.
 *
 * Why ferry signs by itself rather than with libcurl's CURLOPT_AWS_SIGV4:
 * what curl signs has changed from release to release (x-amz-content-sha256
 * only from 7.86, query strings sorted and encoded only from 8.x, session
 * tokens never added for you), so one ferry binary would sign differently
 * on each machine's libcurl; these ~250 lines sign the same everywhere and are
 * checked against AWS's published examples (tests/c/test_url.c). */
#ifndef FERRY_SOURCES_SIGV4_H
#define FERRY_SOURCES_SIGV4_H
#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct ferry_sha256_ctx {
    uint32_t h[8];
    uint64_t n;          /* bytes hashed */
    uint8_t buf[64];
    size_t fill;
} ferry_sha256_ctx;
void ferry_sha256_init(ferry_sha256_ctx *s);
void ferry_sha256_update(ferry_sha256_ctx *s, const void *p, size_t n);
void ferry_sha256_final(ferry_sha256_ctx *s, uint8_t out[32]);
void ferry_sha256(const void *p, size_t n, uint8_t out[32]);
void ferry_hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32]);
/* 64 lowercase hex digits and a NUL. */
void ferry_hex32(const uint8_t in[32], char out[65]);

/* One header that is signed: a lowercase name, its value (trimmed). */
typedef struct ferry_sigv4_header { const char *name, *value; } ferry_sigv4_header;

typedef struct ferry_sigv4_req {
    const char *method;         /* "GET", "HEAD" */
    const char *path;           /* percent-encoded as sent */
    const char *query;          /* canonical query (sorted, encoded), "" for none */
    const ferry_sigv4_header *headers;   /* sorted by name, lowercase; host and x-amz-date among them */
    int nheaders;
    const char *payload_hash;   /* hex SHA-256 of the body (of "" for GET/HEAD) */
    const char *amz_date;       /* "YYYYMMDDTHHMMSSZ" */
    const char *region, *service;
    const char *access_key, *secret_key;
} ferry_sigv4_req;

/* The Authorization header's value for r into out (cap bytes; 0, or
 * FERRY_EINVAL when it does not fit). */
int ferry_sigv4_authorization(const ferry_sigv4_req *r, char *out, size_t cap);
/* "YYYYMMDDTHHMMSSZ" of t (UTC). */
void ferry_amz_date(time_t t, char out[17]);
#endif
