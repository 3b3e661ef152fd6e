/* s3.h — what an s3:// or gs:// object's requests need from the
 * environment: endpoint, region, credentials; and the signed headers of one
 * request. Internal. */
#ifndef FERRY_SOURCES_S3_H
#define FERRY_SOURCES_S3_H
#include "sources/ropts.h"
#include "sources/url.h"
#include <time.h>

typedef struct ferry_s3_auth {
    char *access, *secret, *token;   /* all NULL: anonymous (unsigned requests) */
    char *region;                    /* signing region */
    const char *service;             /* "s3" */
    char source[96];                 /* where the credentials came from, for messages */
} ferry_s3_auth;

/* Parse url (s3:// or gs://) with the environment's endpoint, region and
 * addressing, and load credentials (s3: AWS_ACCESS_KEY_ID /
 * AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else the AWS_PROFILE section of
 * ~/.aws/credentials; gs: GS_ACCESS_KEY_ID / GS_SECRET_ACCESS_KEY HMAC keys;
 * none: anonymous). 0 or a negative code naming url. */
int ferry_s3_setup(const char *url, ferry_url *u, ferry_s3_auth *a);
/* The same with the caller's options (ropts.h) before the environment:
 * endpoint_url, region, addressing, profile; key/secret/token or anon in
 * place of the environment's credentials. */
int ferry_s3_setup_opts(const char *url, const ferry_remote_opts *o, ferry_url *u, ferry_s3_auth *a);
void ferry_s3_auth_free(ferry_s3_auth *a);

/* The headers that sign one request without a body (GET, HEAD), as
 * "Name: value" lines: x-amz-date, x-amz-content-sha256, x-amz-security-token
 * when a session token is given, Authorization. Nothing for anonymous
 * access. query: the canonical query ("" for none). */
typedef struct ferry_s3_signed { char line[4][4096]; int n; } ferry_s3_signed;
int ferry_s3_sign(const ferry_s3_auth *a, const ferry_url *u, const char *method, const char *query, time_t now,
                  ferry_s3_signed *out);
/* The same for a request with a body: payload_hash is the hex SHA-256 of the
 * body, or "UNSIGNED-PAYLOAD" (an uploaded part, which TLS protects in
 * transit; hashing gigabytes on one core would cap the upload); NULL: the
 * empty body's. */
int ferry_s3_sign_body(const ferry_s3_auth *a, const ferry_url *u, const char *method, const char *query,
                       const char *payload_hash, time_t now, ferry_s3_signed *out);
#endif
