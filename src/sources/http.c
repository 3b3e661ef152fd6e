/* http.c — remote objects over HTTP(S) range requests with libcurl's multi
 * interface: one read of many MiB becomes requests of FERRY_REMOTE_REQUEST_SIZE
 * run side by side, each conditional on the version seen at open, each
 * retried with backoff where the failure is the network's or the server's
 * load (timeouts, resets, 5xx, 429, SlowDown, short bodies), never where
 * the answer is final (403, 404, 412). */
#include "common.h"
#include "sources/remote.h"
#include "sources/response.h"
#include "sources/s3.h"
#include "sources/upload.h"
#include "sources/url.h"
#include <errno.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int ferry_remote_is_url(const char *path) {
    ferry_url_scheme s = ferry_url_scheme_of(path);
    return s != FERRY_URL_NONE && s != FERRY_URL_FILE;
}

/* The knobs, read from the environment at each open (an object keeps its own).
 * Defaults, until measurements on cloud machines move them:
 *  - request size 8 MiB: AWS's S3 performance guide names 8-16 MB byte-range
 *    GETs; one S3 connection moves about 90 MB/s, so a request is ~0.1 s of
 *    transfer against ~20-50 ms to the first byte: the latency costs a
 *    quarter at most, while a 1 GiB tensor still splits into 128 requests.
 *  - 64 requests in flight per process: at ~90 MB/s each, 64 fill a 50 Gbit/s
 *    NIC; S3 serves 5,500 GETs/s per prefix, far above that rate of 8 MiB
 *    requests. More connections than that mostly add TLS handshakes.
 *  - 10 retries within 60 s, backoff from 0.2 s doubling to 10 s with jitter:
 *    the AWS SDKs' standard mode retries 3 times in ~20 s; a data loader
 *    would rather wait out a longer SlowDown burst than fail an epoch.
 *  - 30 s without a byte (stall) ends a request, which is then retried. */
typedef struct knobs {
    uint64_t request_size;
    int connections, retries;
    double retry_s, stall_s;
    char ca[1024];          /* the CA bundle to trust instead of the system's, or "" */
    const char *ca_var;     /* the variable that named it */
} knobs;

static int env_num(const char *name, double lo, double hi, double *v) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    double x = strtod(s, &end);
    if (end == s || *end || !(x >= lo && x <= hi))
        return ferry_seterr(FERRY_EINVAL, "%s=\"%s\": not a number from %g to %g", name, s, lo, hi);
    *v = x;
    return 0;
}

/* HTTPS servers are verified against the system's CAs, or against one PEM
 * bundle named by FERRY_REMOTE_CA_BUNDLE, else by the names curl's tool and
 * OpenSSL read (CURL_CA_BUNDLE, SSL_CERT_FILE): a private CA, or a test's
 * self-signed server. There is no switch that turns verification off. Ours
 * is checked here; the others are the environment's, and a bad one is named
 * when a request fails on it. */
static int read_ca_bundle(knobs *k) {
    static const char *const vars[] = {"FERRY_REMOTE_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"};
    k->ca[0] = 0;
    k->ca_var = NULL;
    for (size_t i = 0; i < sizeof vars / sizeof *vars && !k->ca_var; i++) {
        const char *v = getenv(vars[i]);
        if (!v || !*v) continue;
        struct stat st;
        const char *bad = strlen(v) >= sizeof k->ca ? "the path is too long"
                        : stat(v, &st) < 0 ? strerror(errno)
                        : !S_ISREG(st.st_mode) ? "not a file"
                        : access(v, R_OK) < 0 ? strerror(errno) : NULL;
        if (bad && i == 0)
            return ferry_seterr(FERRY_EINVAL, "FERRY_REMOTE_CA_BUNDLE=\"%s\": %s; it names a PEM file of the "
                                "certificates to trust", v, bad);
        if (strlen(v) >= sizeof k->ca) continue;
        memcpy(k->ca, v, strlen(v) + 1);
        k->ca_var = vars[i];
    }
    return 0;
}

static int read_knobs(knobs *k) {
    k->request_size = 8u << 20;
    double conns = 64, retries = 10;
    k->retry_s = 60;
    k->stall_s = 30;
    const char *rs = getenv("FERRY_REMOTE_REQUEST_SIZE");
    if (rs && *rs) {
        uint64_t v;
        if (ferry_size_parse(rs, &v) < 0 || v < 4096 || v > (1ull << 32))
            return ferry_seterr(FERRY_EINVAL, "FERRY_REMOTE_REQUEST_SIZE=\"%s\": a size from 4K to 4G", rs);
        k->request_size = v;
    }
    int rc;
    if ((rc = env_num("FERRY_REMOTE_CONNECTIONS", 1, 1024, &conns)) < 0) return rc;
    if ((rc = env_num("FERRY_REMOTE_RETRIES", 0, 100, &retries)) < 0) return rc;
    if ((rc = env_num("FERRY_REMOTE_RETRY_SECONDS", 0, 86400, &k->retry_s)) < 0) return rc;
    if ((rc = env_num("FERRY_REMOTE_STALL_SECONDS", 1, 3600, &k->stall_s)) < 0) return rc;
    k->connections = (int)conns;
    k->retries = (int)retries;
    return read_ca_bundle(k);
}

int ferry_remote_check_env(void) {
    knobs k;
    int rc = read_knobs(&k);
    return rc;
}

int ferry_remote_ca_bundle(char *path, size_t cap) {
    knobs k;
    int rc = read_knobs(&k);
    if (rc < 0) return rc;
    if (strlen(k.ca) >= cap) return ferry_seterr(FERRY_EINVAL, "%s=\"%s\": the path is too long", k.ca_var, k.ca);
    memcpy(path, k.ca, strlen(k.ca) + 1);
    return 0;
}

int ferry_remote_limits(int *connections, int *retries, double *retry_s, double *stall_s) {
    knobs k;
    int rc = read_knobs(&k);
    if (rc < 0) return rc;
    *connections = k.connections;
    *retries = k.retries;
    *retry_s = k.retry_s;
    *stall_s = k.stall_s;
    return 0;
}

#ifndef FERRY_HAVE_CURL
/* Built without libcurl: every URL but file:// is refused, naming its scheme. */
int ferry_remote_open(const char *url, ferry_remote **out) { return ferry_remote_open_opts(url, NULL, out); }
int ferry_remote_open_opts(const char *url, const ferry_remote_opts *o, ferry_remote **out) {
    (void)o;
    *out = NULL;
    ferry_url u;
    int rc = ferry_url_parse(url, NULL, &u);
    ferry_url_free(&u);
    if (rc < 0) return rc;
    const char *e = strstr(url, "://");
    return ferry_seterr(FERRY_EUNSUPPORTED, "%s: reading %.*s:// URLs needs libcurl, and this ferry was built without it "
                        "(install libcurl's headers, e.g. libcurl4-openssl-dev, and rebuild)", url, (int)(e - url), url);
}
int ferry_remote_stat(const char *url, const ferry_remote_opts *o, uint64_t *size) {
    ferry_remote *r;
    return ferry_remote_open_opts(url, o, &r);
}
uint64_t ferry_remote_size(const ferry_remote *r) { return 0; }
int64_t ferry_remote_pread(ferry_remote *r, void *buf, size_t len, uint64_t off) {
    return ferry_seterr(FERRY_EUNSUPPORTED, "remote objects need libcurl");
}
int ferry_remote_changed(const ferry_remote *r) { return 0; }
void ferry_remote_close(ferry_remote *r) {}
#else
#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>

#define HEAD_BYTES (64u << 10)   /* fetched at open: npy, safetensors and netCDF headers mostly fit */
#define MAX_PAR 64               /* transfers one read keeps in flight at most */
#define TAG_MAX 200

struct ferry_remote {
    char *name;            /* the URL as given */
    ferry_url u;
    ferry_s3_auth auth;    /* s3/gs; auth.access NULL: unsigned */
    int bucket;            /* an s3:// or gs:// object */
    knobs k;
    uint64_t size;
    char etag[TAG_MAX];    /* a strong ETag, as sent ("..."), or "" */
    char lastmod[64];      /* Last-Modified, where no strong ETag */
    char *ca_bundle;       /* the ca_bundle option, or NULL: libcurl's default */
    uint8_t *head;
    size_t head_len;
    _Atomic int changed;
};

typedef struct xfer {
    ferry_remote *r;
    CURL *easy;
    struct curl_slist *hdrs;
    uint8_t *dst;
    uint64_t off, len, got;   /* the range wanted; bytes of it delivered, from off */
    int head;                 /* a HEAD request (open of an empty object) */
    int open;                 /* learns size and version */
    /* the response being received */
    ferry_http_resp resp;
    int started;
    uint64_t pos;             /* the object offset of the next body byte */
    char body[512];
    size_t body_len;
    int stop, changed, bad_start;
    int stalled;              /* ended by on_progress: no byte for stall_s */
    double moved;             /* when the body last grew (or the request began) */
    curl_off_t seen;          /* body bytes then */
    char errbuf[CURL_ERROR_SIZE];
    /* retries */
    int attempts, active, done;
    double not_before;
    char why[700];
} xfer;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- process-wide state: curl's global init, the request slots, clients ---- */
static pthread_once_t curl_once_ = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc_;
static void curl_init_once(void) { curl_init_rc_ = curl_global_init(CURL_GLOBAL_DEFAULT); }

/* Requests in flight in the process, against the cap. */
static pthread_mutex_t slot_lock_ = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t slot_cond_ = PTHREAD_COND_INITIALIZER;
static int slots_used_;

static int slot_take(int cap, int wait) {
    pthread_mutex_lock(&slot_lock_);
    while (wait && slots_used_ >= cap) pthread_cond_wait(&slot_cond_, &slot_lock_);
    int ok = slots_used_ < cap;
    if (ok) slots_used_++;
    pthread_mutex_unlock(&slot_lock_);
    return ok;
}

static void slot_give(void) {
    pthread_mutex_lock(&slot_lock_);
    slots_used_--;
    pthread_cond_signal(&slot_cond_);
    pthread_mutex_unlock(&slot_lock_);
}

/* A client: one multi handle and its easy handles, used by one read at a
 * time; its connections (and TLS sessions, DNS answers) stay open in the
 * multi's cache for the next read that takes it. Idle clients wait in a
 * list; a forked child never uses its parent's (their sockets are shared). */
typedef struct client {
    CURLM *multi;
    CURL *easy[MAX_PAR];
    int busy[MAX_PAR];
    struct client *next;
} client;
static pthread_mutex_t pool_lock_ = PTHREAD_MUTEX_INITIALIZER;
static client *pool_;
static pid_t pool_pid_;

static client *client_get(void) {
    pthread_mutex_lock(&pool_lock_);
    if (pool_pid_ != getpid()) {   /* a forked child: the parent's clients and requests are not its own */
        pool_ = NULL;
        pool_pid_ = getpid();
        pthread_mutex_lock(&slot_lock_);
        slots_used_ = 0;
        pthread_mutex_unlock(&slot_lock_);
    }
    client *c = pool_;
    if (c) pool_ = c->next;
    pthread_mutex_unlock(&pool_lock_);
    if (c) return c;
    c = calloc(1, sizeof *c);
    if (c && !(c->multi = curl_multi_init())) { free(c); c = NULL; }
    if (c) curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS, (long)MAX_PAR);
    return c;
}

static void client_put(client *c) {
    pthread_mutex_lock(&pool_lock_);
    if (pool_pid_ == getpid()) { c->next = pool_; pool_ = c; c = NULL; }
    pthread_mutex_unlock(&pool_lock_);
    if (c) {
        for (int i = 0; i < MAX_PAR; i++) if (c->easy[i]) curl_easy_cleanup(c->easy[i]);
        curl_multi_cleanup(c->multi);
        free(c);
    }
}

/* ---- responses ------------------------------------------------------------ */
static size_t on_header(char *p, size_t sz, size_t nm, void *ud) {
    xfer *x = ud;
    size_t n = sz * nm;
    if (ferry_http_resp_line(&x->resp, p, n)) {   /* a new response: its body starts afresh */
        x->started = 0;
        x->body_len = 0;
    }
    return n;
}

static size_t on_body(char *p, size_t sz, size_t nm, void *ud) {
    xfer *x = ud;
    size_t n = sz * nm;
    ferry_remote *r = x->r;
    if (x->resp.status < 200 || x->resp.status >= 300) {   /* an error's body: its message */
        size_t k = n < sizeof x->body - 1 - x->body_len ? n : sizeof x->body - 1 - x->body_len;
        memcpy(x->body + x->body_len, p, k);
        x->body_len += k;
        x->body[x->body_len] = 0;
        return n;
    }
    if (!x->started) {
        x->started = 1;
        x->pos = x->resp.status == 206 && x->resp.have_crange == 1 ? x->resp.cr_start : 0;
        if (x->resp.status == 206 && x->resp.have_crange != 1) { x->bad_start = 1; return 0; }
        if (!x->open) {
            /* the response must be the version opened, whatever the server
             * made of If-Match (If-Unmodified-Since): same ETag (else same
             * Last-Modified), same size */
            uint64_t total = x->resp.have_crange == 1 ? x->resp.cr_total : x->resp.clen;
            if ((r->etag[0] && x->resp.etag[0] && strcmp(r->etag, x->resp.etag)) ||
                (!r->etag[0] && r->lastmod[0] && x->resp.lastmod[0] && strcmp(r->lastmod, x->resp.lastmod)) ||
                ((x->resp.have_crange == 1 || x->resp.status == 200) && total != r->size)) {
                x->changed = 1;
                return 0;
            }
        }
        if (x->pos > x->off + x->got) { x->bad_start = 1; return 0; }
    }
    uint64_t want = x->off + x->got, want_end = x->off + x->len, lo = x->pos, hi = x->pos + n;
    if (lo <= want && hi > want && want < want_end) {
        uint64_t take = (hi < want_end ? hi : want_end) - want;
        memcpy(x->dst + x->got, p + (want - lo), (size_t)take);
        x->got += take;
    }
    x->pos = hi;
    if (x->got == x->len && hi >= want_end && x->resp.status == 200 && (!x->resp.have_clen || hi < x->resp.clen)) {
        x->stop = 1;   /* a server that ignored Range: the rest is not wanted */
        return 0;
    }
    return n;
}

/* The CA bundle r's requests trust, or NULL (libcurl's default); *var (if
 * var) says who named it: the ca_bundle option first, then the variables. */
static const char *ca_of(const ferry_remote *r, const char **var) {
    if (var) *var = r->ca_bundle ? "the ca_bundle option" : r->k.ca_var;
    return r->ca_bundle ? r->ca_bundle : r->k.ca[0] ? r->k.ca : NULL;
}

/* A request whose body has not grown for stall_s is ended at once (and
 * retried). LOW_SPEED_TIME alone judges a rate averaged over curl's last
 * seconds, so a body that stops after a burst was ended seconds late. */
static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    xfer *x = ud;
    double t = now_s();
    if (dlnow != x->seen) {
        x->seen = dlnow;
        x->moved = t;
    } else if (t - x->moved > x->r->k.stall_s) {
        x->stalled = 1;
        return 1;
    }
    return 0;
}

static int retryable_curl(CURLcode c) {
    switch (c) {
    case CURLE_OPERATION_TIMEDOUT: case CURLE_COULDNT_CONNECT: case CURLE_RECV_ERROR: case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE: case CURLE_GOT_NOTHING: case CURLE_SSL_CONNECT_ERROR: case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM: case CURLE_COULDNT_RESOLVE_HOST: case CURLE_AGAIN:
        return 1;
    default:
        return 0;
    }
}

enum { DONE = 0, RETRY = 1, NEED_HEAD = 2 };

/* What a finished transfer means: DONE, RETRY (x->why says why), NEED_HEAD,
 * or a negative code (x->why says why). */
static int classify(xfer *x, CURLcode res) {
    ferry_remote *r = x->r;
    char msg[300];
    if (x->changed || x->resp.status == 412) {
        atomic_store(&r->changed, 1);
        const char *was = r->etag[0] ? r->etag : r->lastmod, *now = r->etag[0] ? x->resp.etag : x->resp.lastmod;
        int moved = now[0] && strcmp(now, was);
        snprintf(x->why, sizeof x->why, "the object changed since it was opened (%s %.120s%s%.120s): %s; open it again to read the new version",
                 r->etag[0] ? "ETag" : "Last-Modified", was, moved ? ", now " : "", moved ? now : "",
                 x->resp.status == 412 ? "HTTP 412 Precondition Failed" : "the server sent another version");
        return FERRY_EIO;
    }
    if (x->bad_start) {
        snprintf(x->why, sizeof x->why, "HTTP %ld: the response starts at byte %llu, not at %llu as asked", x->resp.status,
                 (unsigned long long)x->pos, (unsigned long long)(x->off + x->got));
        return FERRY_EIO;
    }
    if (res == CURLE_PEER_FAILED_VERIFICATION || res == CURLE_SSL_CACERT_BADFILE) {   /* final: say whom to trust */
        const char *why = x->errbuf[0] ? x->errbuf : curl_easy_strerror(res), *var = NULL, *ca = ca_of(r, &var);
        char by[300] = "";   /* with the rest, within x->why */
        if (ca) snprintf(by, sizeof by, " by the CA bundle %.200s (%s)", ca, var);
        if (res == CURLE_SSL_CACERT_BADFILE)
            snprintf(x->why, sizeof x->why, "the CA bundle %.300s (%s) could not be read: %.200s", ca ? ca : "",
                     ca ? var : "libcurl's default", why);
        else if (strstr(why, "host name"))   /* trusted, but issued for another name */
            snprintf(x->why, sizeof x->why, "the server's TLS certificate does not name this host (%.200s); "
                     "use a host name the certificate holds", why);
        else
            snprintf(x->why, sizeof x->why, "the server's TLS certificate was not trusted%.299s (%.200s); to trust it, %s",
                     by, why, ca && strcmp(var, "CURL_CA_BUNDLE") && strcmp(var, "SSL_CERT_FILE") ? "add the certificate of the CA that signed it to that file"
                     : "name a PEM file holding the certificate of the CA that signed it in FERRY_REMOTE_CA_BUNDLE");
        return FERRY_EIO;
    }
    if (x->stalled) {
        snprintf(x->why, sizeof x->why, "no byte came for %g s (FERRY_REMOTE_STALL_SECONDS) after %llu of %llu bytes",
                 x->r->k.stall_s, (unsigned long long)x->got, (unsigned long long)x->len);
        return RETRY;
    }
    if (res != CURLE_OK && !(res == CURLE_WRITE_ERROR && x->stop)) {
        int w = snprintf(x->why, sizeof x->why, "%s%s%.300s", curl_easy_strerror(res), x->errbuf[0] ? ": " : "", x->errbuf);
        if (x->got && w > 0 && (size_t)w < sizeof x->why)
            snprintf(x->why + w, sizeof x->why - (size_t)w, " (after %llu of %llu bytes)", (unsigned long long)x->got,
                     (unsigned long long)x->len);
        return retryable_curl(res) ? RETRY : FERRY_EIO;
    }
    long s = x->resp.status;
    if (s == 200 || s == 206) {
        if (x->head || x->open) return DONE;
        if (x->got == x->len || x->off + x->got >= r->size) return DONE;
        snprintf(x->why, sizeof x->why, "HTTP %ld: short body: %llu of %llu bytes", s, (unsigned long long)x->got,
                 (unsigned long long)x->len);
        return RETRY;
    }
    ferry_http_server_message(x->body, x->body_len, msg, sizeof msg);
    snprintf(x->why, sizeof x->why, "HTTP %ld%s%s%s%s", s, *ferry_http_reason(s) ? " " : "", ferry_http_reason(s),
             *msg ? ": " : "", msg);
    if ((s == 301 || s == 307) && r->bucket && strlen(x->why) + 60 < sizeof x->why)
        strcat(x->why, " (AWS_REGION: the bucket's region; AWS_ENDPOINT_URL)");
    if (s == 416 && x->open) return NEED_HEAD;
    if (s == 416 && x->off >= r->size) return DONE;
    if (s == 408 || s == 429 || s >= 500 || (s == 400 && strstr(x->body, "<Code>RequestTimeout</Code>"))) return RETRY;
    if (s == 404) return -ENOENT;
    if (s == 403 || s == 401) return -EACCES;
    return FERRY_EIO;
}

/* Set up x's request on easy handle e. */
static int prepare(xfer *x, CURL *e) {
    ferry_remote *r = x->r;
    curl_easy_reset(e);
    x->easy = e;
    memset(&x->resp, 0, sizeof x->resp);
    x->started = x->stop = x->changed = x->bad_start = x->stalled = 0;
    x->moved = now_s();
    x->seen = 0;
    x->errbuf[0] = 0;
    x->body_len = 0;
    x->body[0] = 0;
    curl_slist_free_all(x->hdrs);
    x->hdrs = NULL;
    if (r->bucket) {
        ferry_s3_signed sg;
        int rc = ferry_s3_sign(&r->auth, &r->u, x->head ? "HEAD" : "GET", "", time(NULL), &sg);
        if (rc < 0) return rc;
        for (int i = 0; i < sg.n; i++) {
            struct curl_slist *l = curl_slist_append(x->hdrs, sg.line[i]);
            if (!l) return ferry_seterr(FERRY_ENOMEM, "out of memory");
            x->hdrs = l;
        }
    }
    char cond[TAG_MAX + 40] = "";
    if (r->etag[0]) snprintf(cond, sizeof cond, "If-Match: %s", r->etag);
    else if (r->lastmod[0]) snprintf(cond, sizeof cond, "If-Unmodified-Since: %s", r->lastmod);
    if (cond[0]) {
        struct curl_slist *l = curl_slist_append(x->hdrs, cond);
        if (!l) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        x->hdrs = l;
    }
    char range[64];
    snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)(x->off + x->got),
             (unsigned long long)(x->off + x->len - 1));
    curl_easy_setopt(e, CURLOPT_URL, r->u.url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->hdrs);
    if (x->head) curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    else curl_easy_setopt(e, CURLOPT_RANGE, range);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "ferry/" FERRY_VERSION_STRING);
    const char *ca = ca_of(r, NULL);
    if (ca) curl_easy_setopt(e, CURLOPT_CAINFO, ca);
    /* a request that moves under 1 KiB/s for stall_s is ended (and retried):
     * a stalled server, or one that trickles */
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)(r->k.stall_s + 0.5));
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(1000 * (r->k.stall_s < 10 ? r->k.stall_s : 10)));
    curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(e, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
    /* signed requests are never redirected (the signature names the host);
     * plain URLs follow a few */
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, r->bucket ? 0L : 1L);
    curl_easy_setopt(e, CURLOPT_MAXREDIRS, 5L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(e, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    return 0;
}

double ferry_remote_backoff(int attempt) {
    double b = 0.2;
    for (int i = 1; i < attempt && b < 10; i++) b *= 2;
    if (b > 10) b = 10;
    static _Thread_local unsigned seed;
    if (!seed) seed = (unsigned)(now_s() * 1e6) ^ (unsigned)(uintptr_t)&seed;
    return b / 2 + b / 2 * ((double)rand_r(&seed) / RAND_MAX);   /* "equal jitter": never all at once */
}

/* Run transfers xs[0..n) to completion: 0, NEED_HEAD, or a negative code
 * with the message set (byte range and why). */
static int run(ferry_remote *r, xfer *xs, size_t n) {
    client *c = client_get();
    if (!c) return ferry_seterr(FERRY_ENOMEM, "out of memory for an HTTP client");
    const double t0 = now_s();
    size_t left = n, nactive = 0;
    int rc = 0;
    while (left && rc == 0) {
        double now = now_s(), wake = now + 0.1;
        /* start what may start */
        for (size_t i = 0; i < n && rc == 0 && nactive < MAX_PAR; i++) {
            xfer *x = &xs[i];
            if (x->done || x->active) continue;
            if (x->not_before > now) { if (x->not_before < wake) wake = x->not_before; continue; }
            if (!slot_take(r->k.connections, nactive == 0)) break;
            int slot = 0;
            while (slot < MAX_PAR && c->busy[slot]) slot++;
            if (!c->easy[slot] && !(c->easy[slot] = curl_easy_init())) { slot_give(); rc = ferry_seterr(FERRY_ENOMEM, "out of memory"); break; }
            if ((rc = prepare(x, c->easy[slot])) < 0) { slot_give(); break; }
            c->busy[slot] = 1;
            x->active = 1;
            x->attempts++;
            nactive++;
            curl_multi_add_handle(c->multi, x->easy);
        }
        if (rc < 0) break;
        if (nactive == 0) {   /* all waiting out a backoff */
            double d = wake - now;
            if (d > 0) { struct timespec ts = {(time_t)d, (long)((d - (time_t)d) * 1e9)}; nanosleep(&ts, NULL); }
            continue;
        }
        int running;
        CURLMcode mc = curl_multi_perform(c->multi, &running);
        if (mc != CURLM_OK) { rc = ferry_seterr(FERRY_EIO, "libcurl: %s", curl_multi_strerror(mc)); break; }
        CURLMsg *m;
        int q, finished = 0;
        while ((m = curl_multi_info_read(c->multi, &q))) {
            if (m->msg != CURLMSG_DONE) continue;
            finished = 1;
            CURL *e = m->easy_handle;
            CURLcode res = m->data.result;
            xfer *x;
            curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&x);
            curl_multi_remove_handle(c->multi, e);
            for (int s = 0; s < MAX_PAR; s++) if (c->easy[s] == e) c->busy[s] = 0;
            slot_give();
            x->active = 0;
            nactive--;
            int k = classify(x, res);
            double t = now_s();
            if (k == DONE) { x->done = 1; left--; }
            else if (k == NEED_HEAD && rc == 0) rc = NEED_HEAD;
            else if (k == RETRY && x->attempts <= r->k.retries && t - t0 < r->k.retry_s) {
                x->not_before = t + ferry_remote_backoff(x->attempts);
            } else if (rc == 0) {
                const char *what = x->head ? "HEAD" : "bytes";
                if (k == RETRY)
                    rc = ferry_seterr(FERRY_EIO, "%s %llu-%llu: %s (gave up after %d attempts in %.1f s; FERRY_REMOTE_RETRIES, "
                                      "FERRY_REMOTE_RETRY_SECONDS)", what, (unsigned long long)x->off,
                                      (unsigned long long)(x->off + x->len - 1), x->why, x->attempts, t - t0);
                else
                    rc = ferry_seterr(k, "%s %llu-%llu: %s", what, (unsigned long long)x->off,
                                      (unsigned long long)(x->off + x->len - 1), x->why);
            }
        }
        /* a finished transfer freed a slot: start the next at once, not
         * after the poll's timeout (each request would cost it) */
        if (left && rc == 0 && !finished) {
            int ms = (int)((wake - now_s()) * 1000);
            curl_multi_poll(c->multi, NULL, 0, ms < 1 ? 1 : ms > 100 ? 100 : ms, NULL);
        }
    }
    for (size_t i = 0; i < n; i++) {   /* a failed read leaves nothing running */
        if (xs[i].active) {
            curl_multi_remove_handle(c->multi, xs[i].easy);
            slot_give();
            xs[i].active = 0;
        }
        curl_slist_free_all(xs[i].hdrs);
        xs[i].hdrs = NULL;
    }
    memset(c->busy, 0, sizeof c->busy);
    client_put(c);
    return rc;
}

static void remote_free(ferry_remote *r) {
    if (!r) return;
    ferry_url_free(&r->u);
    ferry_s3_auth_free(&r->auth);
    free(r->head);
    free(r->ca_bundle);
    free(r->name);
    free(r);
}

/* The version to pin: a strong ETag, else Last-Modified (a weak ETag,
 * W/"...", never matches If-Match). */
static void take_version(ferry_remote *r, const xfer *x) {
    if (x->resp.etag[0] && strncmp(x->resp.etag, "W/", 2)) snprintf(r->etag, sizeof r->etag, "%s", x->resp.etag);
    else if (x->resp.lastmod[0]) snprintf(r->lastmod, sizeof r->lastmod, "%s", x->resp.lastmod);
}

/* A handle for url with no request made yet: the knobs read, the URL parsed
 * (signing set up for s3:// and gs://), o's CA bundle kept. 0, or a negative
 * code with nothing left allocated. */
static int remote_new(const char *url, const ferry_remote_opts *o, ferry_remote **out) {
    *out = NULL;
    pthread_once(&curl_once_, curl_init_once);
    if (curl_init_rc_ != CURLE_OK) return ferry_seterr(FERRY_EIO, "%s: libcurl failed to start: %s", url, curl_easy_strerror(curl_init_rc_));
    ferry_remote *r = calloc(1, sizeof *r);
    if (!r || !(r->name = strdup(url))) { free(r); return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", url); }
    int rc = read_knobs(&r->k);
    ferry_url_scheme s = ferry_url_scheme_of(url);
    if (rc == 0 && (s == FERRY_URL_S3 || s == FERRY_URL_GS)) {
        r->bucket = 1;
        rc = ferry_s3_setup_opts(url, o, &r->u, &r->auth);
    } else if (rc == 0) {
        rc = ferry_url_parse(url, NULL, &r->u);
    }
    if (rc == 0 && o && o->ca_bundle && !(r->ca_bundle = strdup(o->ca_bundle))) rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", url);
    if (rc < 0) { remote_free(r); return rc; }
    *out = r;
    return 0;
}

int ferry_remote_open(const char *url, ferry_remote **out) { return ferry_remote_open_opts(url, NULL, out); }

int ferry_remote_open_opts(const char *url, const ferry_remote_opts *o, ferry_remote **out) {
    *out = NULL;
    ferry_remote *r;
    int rc = remote_new(url, o, &r);
    if (rc < 0) return rc;
    if (!(r->head = malloc(HEAD_BYTES))) rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", url);
    if (rc < 0) { remote_free(r); return rc; }
    xfer x = {.r = r, .dst = r->head, .off = 0, .len = HEAD_BYTES, .open = 1};
    rc = run(r, &x, 1);
    if (rc == NEED_HEAD) {   /* an empty object: no range of it exists */
        xfer h = {.r = r, .head = 1, .open = 1};
        rc = run(r, &h, 1);
        if (rc == 0) {
            r->size = h.resp.clen;
            take_version(r, &h);
            if (!h.resp.have_clen) rc = ferry_seterr(FERRY_EIO, "HEAD: no Content-Length");
        }
    } else if (rc == 0) {
        take_version(r, &x);
        if (x.resp.status == 206 && x.resp.have_crange == 1) r->size = x.resp.cr_total;
        else if (x.resp.status == 200 && x.resp.have_clen) r->size = x.resp.clen;
        else if (x.resp.status == 200 && !x.stop) r->size = x.got;   /* the whole body came: it is the size */
        else rc = ferry_seterr(FERRY_EIO, "HTTP %ld: the response gives no size (no Content-Range or Content-Length)", x.resp.status);
        r->head_len = (size_t)(x.got < r->size ? x.got : r->size);
    }
    if (rc < 0) {
        ferry_preerr(rc, "%s", url);
        remote_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

/* The size of the object at url, nothing kept: a GET of its first byte (not
 * a HEAD: a server that answers a HEAD with a body, as some do for errors,
 * would leave bytes on the kept-alive connection for the next response). */
int ferry_remote_stat(const char *url, const ferry_remote_opts *o, uint64_t *size) {
    ferry_remote *r;
    int rc = remote_new(url, o, &r);
    if (rc < 0) return rc;
    uint8_t one;
    xfer x = {.r = r, .dst = &one, .off = 0, .len = 1, .open = 1};
    rc = run(r, &x, 1);
    if (rc == NEED_HEAD) {   /* no byte 0: an empty object */
        *size = 0;
        rc = 0;
    } else if (rc == 0) {
        if (x.resp.status == 206 && x.resp.have_crange == 1) *size = x.resp.cr_total;
        else if (x.resp.status == 200 && x.resp.have_clen) *size = x.resp.clen;
        else rc = ferry_seterr(FERRY_EIO, "HTTP %ld: the response gives no size (no Content-Range or Content-Length)",
                               x.resp.status);
    }
    if (rc < 0) ferry_preerr(rc, "%s", url);
    remote_free(r);
    return rc;
}

uint64_t ferry_remote_size(const ferry_remote *r) { return r->size; }
int ferry_remote_changed(const ferry_remote *r) { return atomic_load(&r->changed); }
void ferry_remote_close(ferry_remote *r) { remote_free(r); }

int64_t ferry_remote_pread(ferry_remote *r, void *buf, size_t len, uint64_t off) {
    if (off >= r->size || len == 0) return 0;
    if (len > r->size - off) len = (size_t)(r->size - off);
    uint8_t *dst = buf;
    size_t done = 0;
    if (off < r->head_len) {   /* the first bytes, fetched at open */
        done = (size_t)(r->head_len - off) < len ? (size_t)(r->head_len - off) : len;
        memcpy(dst, r->head + off, done);
        if (done == len) return (int64_t)len;
    }
    uint64_t start = off + done, rest = len - done, rs = r->k.request_size;
    size_t n = (size_t)((rest + rs - 1) / rs);
    xfer one, *xs = n == 1 ? &one : calloc(n, sizeof *xs);
    if (!xs) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    if (n == 1) memset(&one, 0, sizeof one);
    for (size_t i = 0; i < n; i++) {
        xs[i].r = r;
        xs[i].off = start + i * rs;
        xs[i].len = i + 1 < n ? rs : rest - i * rs;
        xs[i].dst = dst + done + i * rs;
    }
    int rc = run(r, xs, n);
    if (xs != &one) free(xs);
    return rc < 0 ? rc : (int64_t)len;
}
#endif
