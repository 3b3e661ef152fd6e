/* ropts.h — the options of remote objects that a caller gives with a
 * context (ferry_ctx_set_remote_option; Python's storage_options), beside and
 * before the environment: endpoint, region, addressing style, credentials or
 * anonymous access, a CA bundle. Internal; a leaf. */
#ifndef FERRY_SOURCES_ROPTS_H
#define FERRY_SOURCES_ROPTS_H

typedef struct ferry_remote_opts {
    char *endpoint;        /* "http(s)://host[:port]": s3:// (and gs://) requests go there */
    char *key, *secret;    /* credentials (s3: AWS keys; gs: HMAC keys) */
    char *token;           /* a session token with them */
    char *profile;         /* a section of ~/.aws/credentials */
    char *region;          /* the S3 signing region */
    char *ca_bundle;       /* a PEM file of the certificates https:// servers are checked against */
    int anon;              /* 1: unsigned requests, whatever credentials the environment holds */
    int addressing;        /* -1: the environment's (FERRY_S3_ADDRESSING); 0 auto, 1 path, 2 virtual */
} ferry_remote_opts;

/* Options as none given: every field from the environment. */
void ferry_remote_opts_init(ferry_remote_opts *o);
/* Set name to value (NULL: back to the environment's). Names: endpoint_url,
 * key, secret, token, profile, region, addressing (auto|path|virtual), anon
 * (true|false), ca_bundle (a readable file). 0, or FERRY_EINVAL naming the
 * option and what it takes. */
int ferry_remote_opts_set(ferry_remote_opts *o, const char *name, const char *value);
void ferry_remote_opts_free(ferry_remote_opts *o);
#endif
