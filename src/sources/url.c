/* url.c — the URL rule: scheme, bucket, key, endpoint, request path.
 * s3://bucket/key goes to the endpoint given (AWS_ENDPOINT_URL), else to
 * AWS's regional endpoint; virtual-hosted style (bucket.s3.region...) is
 * AWS's default for buckets whose names are valid host labels, path style
 * (endpoint/bucket/key) for custom endpoints (MinIO, moto, Ceph, most of
 * which serve no bucket subdomains) and for names with dots (which break the
 * wildcard TLS certificate). gs://bucket/key is path style at
 * storage.googleapis.com, which serves both anonymous reads of public
 * objects and, signed with HMAC keys, its S3-compatible API. */
#include "common.h"
#include "sources/url.h"
#include <ctype.h>
#include <stdlib.h>
#include <strings.h>

ferry_url_scheme ferry_url_scheme_of(const char *s) {
    if (!s) return FERRY_URL_NONE;
    const char *p = s;
    if (!isalpha((unsigned char)*p)) return FERRY_URL_NONE;
    while (isalnum((unsigned char)*p) || *p == '+' || *p == '-' || *p == '.') p++;
    if (strncmp(p, "://", 3)) return FERRY_URL_NONE;
    size_t n = (size_t)(p - s);
    if (n == 4 && !strncasecmp(s, "file", 4)) return FERRY_URL_FILE;
    if (n == 4 && !strncasecmp(s, "http", 4)) return FERRY_URL_HTTP;
    if (n == 5 && !strncasecmp(s, "https", 5)) return FERRY_URL_HTTPS;
    if (n == 2 && !strncasecmp(s, "s3", 2)) return FERRY_URL_S3;
    if (n == 2 && !strncasecmp(s, "gs", 2)) return FERRY_URL_GS;
    return FERRY_URL_OTHER;
}

char *ferry_url_encode(const char *src, size_t n, int keep_slash) {
    static const char hex[] = "0123456789ABCDEF";
    char *out = malloc(3 * n + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)src[i];
        if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) *o++ = (char)c;
        else { *o++ = '%'; *o++ = hex[c >> 4]; *o++ = hex[c & 15]; }
    }
    *o = 0;
    return out;
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

void ferry_url_free(ferry_url *u) {
    if (!u) return;
    free(u->bucket); free(u->key); free(u->host); free(u->path); free(u->query); free(u->url); free(u->region);
    memset(u, 0, sizeof *u);
}

static char *dupn(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) { memcpy(d, s, n); d[n] = 0; }
    return d;
}

static char *cat(const char *a, const char *b, const char *c, const char *d) {
    size_t n = strlen(a) + strlen(b) + strlen(c) + strlen(d) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s%s%s", a, b, c, d);
    return s;
}

/* Bytes a request line cannot carry (controls, DEL; a space where the URL
 * is sent as written): refused, never sent. An s3:// or gs:// key is
 * encoded by ferry, so a space in it is the key's own. */
static int bad_chars(const char *s, int space_ok) {
    for (; *s; s++) if ((unsigned char)*s < 0x20 || *s == 0x7f || (*s == ' ' && !space_ok)) return 1;
    return 0;
}

/* host[:port] of an "http(s)://host[:port][/...]" string into *host; the
 * scheme's length into *slen. */
static int split_endpoint(const char *url, const char *what, char **host, const char **rest, int *https) {
    ferry_url_scheme s = ferry_url_scheme_of(url);
    if (s != FERRY_URL_HTTP && s != FERRY_URL_HTTPS)
        return ferry_seterr(FERRY_EINVAL, "%s \"%s\": not an http:// or https:// URL", what, url);
    *https = s == FERRY_URL_HTTPS;
    const char *h = strstr(url, "://") + 3, *e = h;
    while (*e && *e != '/' && *e != '?' && *e != '#') e++;
    if (e == h) return ferry_seterr(FERRY_EINVAL, "%s \"%s\": no host", what, url);
    if (memchr(h, '@', (size_t)(e - h)))
        return ferry_seterr(FERRY_EINVAL, "%s \"%s\": user names in URLs are not read (credentials come from the environment)", what, url);
    *host = dupn(h, (size_t)(e - h));
    if (!*host) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    *rest = e;
    return 0;
}

/* A bucket name that can be a DNS label of the virtual host (S3's rules:
 * 3-63 of a-z 0-9 '-', no dots: a dotted name breaks the TLS wildcard). */
static int dns_bucket(const char *b) {
    size_t n = strlen(b);
    if (n < 3 || n > 63) return 0;
    for (const char *p = b; *p; p++)
        if (!(islower((unsigned char)*p) || isdigit((unsigned char)*p) || *p == '-')) return 0;
    return b[0] != '-' && b[n - 1] != '-';
}

static int parse_bucket_url(const char *s, const ferry_url_env *env, ferry_url *u) {
    const char *b = strstr(s, "://") + 3, *slash = strchr(b, '/');
    const char *kind = u->scheme == FERRY_URL_S3 ? "s3" : "gs";
    if (!slash || slash == b) return ferry_seterr(FERRY_EINVAL, "%s: no bucket (%s://BUCKET/KEY)", s, kind);
    if (!slash[1]) return ferry_seterr(FERRY_EINVAL, "%s: names a bucket, not an object (%s://BUCKET/KEY)", s, kind);
    u->bucket = dupn(b, (size_t)(slash - b));
    u->key = strdup(slash + 1);
    if (!u->bucket || !u->key) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    for (const char *p = u->bucket; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '-' || *p == '.' || *p == '_'))
            return ferry_seterr(FERRY_EINVAL, "%s: bucket name \"%s\" has the character '%c' (letters, digits, '-', '.', '_')",
                                s, u->bucket, *p);
    /* every byte of the key is the key's ('?' and '#' included): encoded, never a query */
    char *ekey = ferry_url_encode(u->key, strlen(u->key), 1), *ebucket = ferry_url_encode(u->bucket, strlen(u->bucket), 0);
    if (!ekey || !ebucket) { free(ekey); free(ebucket); return ferry_seterr(FERRY_ENOMEM, "out of memory"); }
    const char *region = env && env->region && *env->region ? env->region : "us-east-1";
    u->region = strdup(region);
    const char *endpoint = env && env->endpoint && *env->endpoint ? env->endpoint : NULL;
    char *own = NULL;
    int rc = 0;
    if (!endpoint) {
        if (u->scheme == FERRY_URL_GS) endpoint = "https://storage.googleapis.com";
        else {
            for (const char *p = region; *p; p++)
                if (!(isalnum((unsigned char)*p) || *p == '-')) {
                    free(ekey); free(ebucket);
                    return ferry_seterr(FERRY_EINVAL, "%s: region \"%s\" is not a region name", s, region);
                }
            endpoint = own = cat("https://s3.", region, ".amazonaws.com", "");
        }
    }
    int https = 0;
    const char *rest = NULL;
    char *host = NULL;
    if (!endpoint || !u->region) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    else if ((rc = split_endpoint(endpoint, u->scheme == FERRY_URL_S3 ? "endpoint (AWS_ENDPOINT_URL)" : "endpoint (STORAGE_EMULATOR_HOST)",
                                  &host, &rest, &https)) < 0)
        ferry_preerr(rc, "%s", s);
    if (rc == 0) {
        /* an endpoint with a base path (a proxy's prefix) keeps it in front */
        size_t bl = strlen(rest);
        while (bl && rest[bl - 1] == '/') bl--;
        char *base = dupn(rest, bl);
        int addressing = env ? env->addressing : 0;
        int virt = u->scheme == FERRY_URL_S3 &&
                   (addressing == 2 || (addressing == 0 && own && dns_bucket(u->bucket)));
        const char *sch = https ? "https://" : "http://";
        if (!base) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
        else if (virt) {
            u->virtual_host = 1;
            u->host = cat(u->bucket, ".", host, "");
            u->path = cat(base, "/", ekey, "");
        } else {
            u->host = strdup(host);
            u->path = cat(base, "/", ebucket, "/");
            if (u->path) { char *p = cat(u->path, ekey, "", ""); free(u->path); u->path = p; }
        }
        if (rc == 0) {
            u->query = strdup("");
            if (u->host && u->path) u->url = cat(sch, u->host, u->path, "");
            if (!u->host || !u->path || !u->query || !u->url) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
        }
        free(base);
    }
    free(host); free(own); free(ekey); free(ebucket);
    return rc;
}

int ferry_url_parse(const char *s, const ferry_url_env *env, ferry_url *u) {
    memset(u, 0, sizeof *u);
    u->scheme = ferry_url_scheme_of(s);
    if (u->scheme == FERRY_URL_NONE) return ferry_seterr(FERRY_EINVAL, "%s: not a URL", s ? s : "(null)");
    if (u->scheme == FERRY_URL_OTHER) {
        const char *e = strstr(s, "://");
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: the scheme \"%.*s://\" is not read by ferry (file, http, https, s3, gs)",
                            s, (int)(e - s), s);
    }
    int keyed = u->scheme == FERRY_URL_S3 || u->scheme == FERRY_URL_GS;
    if (bad_chars(s, keyed))
        return ferry_seterr(FERRY_EINVAL, "%s: a URL cannot hold %scontrol characters", s, keyed ? "" : "spaces or ");
    if (u->scheme == FERRY_URL_FILE) {
        const char *h = s + 7, *p = strchr(h, '/');
        if (!p) return ferry_seterr(FERRY_EINVAL, "%s: no path (file:///PATH)", s);
        if (p != h && !((size_t)(p - h) == 9 && !strncasecmp(h, "localhost", 9)))
            return ferry_seterr(FERRY_EUNSUPPORTED, "%s: file:// URLs of another host (%.*s) are not read", s, (int)(p - h), h);
        /* the path, percent-decoded (RFC 8089); a %00 would cut it short: refused */
        char *d = malloc(strlen(p) + 1), *o = d;
        if (!d) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        for (const char *q = p; *q; q++) {
            if (*q == '%' && hexval(q[1]) >= 0 && hexval(q[2]) >= 0) {
                int c = hexval(q[1]) * 16 + hexval(q[2]);
                if (c == 0) { free(d); return ferry_seterr(FERRY_EINVAL, "%s: %%00 in a path", s); }
                *o++ = (char)c;
                q += 2;
            } else if (*q == '?' || *q == '#') {
                break;   /* a query or fragment is no part of a file's path */
            } else {
                *o++ = *q;
            }
        }
        *o = 0;
        u->key = d;
        return 0;
    }
    if (u->scheme == FERRY_URL_S3 || u->scheme == FERRY_URL_GS) return parse_bucket_url(s, env, u);
    /* http(s): sent as written (already encoded by whoever wrote it); the
     * fragment is the client's, never sent */
    int https;
    const char *rest;
    int rc = split_endpoint(s, "URL", &u->host, &rest, &https);
    if (rc < 0) return rc;
    const char *q = strchr(rest, '?'), *f = strchr(rest, '#');
    const char *pend = q ? q : f ? f : rest + strlen(rest);
    u->path = pend == rest ? strdup("/") : dupn(rest, (size_t)(pend - rest));
    u->query = q ? dupn(q + 1, (size_t)((f && f > q ? f : q + strlen(q)) - (q + 1))) : strdup("");
    if (!u->path || !u->query) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    u->url = cat(https ? "https://" : "http://", u->host, u->path, "");
    if (u->url && *u->query) { char *x = cat(u->url, "?", u->query, ""); free(u->url); u->url = x; }
    if (!u->url) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    return 0;
}
