/* s3_upload.c — writing an object to S3 (or GCS's S3-compatible API) from
 * memory, whole or not at all: one PUT below the part size; from it a
 * multipart upload (CreateMultipartUpload, the parts side by side on one
 * libcurl multi handle, CompleteMultipartUpload), aborted
 * (AbortMultipartUpload) on any failure, so that the object at the URL is
 * either the new one or what was there before, and no pending upload is
 * left to be billed. Every request is retried as reads are (http.c: the
 * FERRY_REMOTE_* bounds, backoff with jitter) where the failure is the
 * network's or the server's load. */
#include "common.h"
#include "ferry_experimental.h"
#include "sources/remote.h"
#include "sources/response.h"
#include "sources/s3.h"
#include "sources/sigv4.h"
#include "sources/upload.h"
#include "sources/url.h"
#include <errno.h>
#include <stdlib.h>
#include <strings.h>

int ferry_upload_parts(uint64_t n, uint64_t want, uint64_t *part, uint64_t *nparts) {
    *part = want;
    *nparts = 0;
    if (n > FERRY_S3_MAX_OBJECT)
        return ferry_seterr(FERRY_EINVAL, "%llu bytes: larger than an S3 object may be (5 TiB)", (unsigned long long)n);
    if (n <= want) return 0;
    uint64_t p = want;
    if ((n + p - 1) / p > FERRY_S3_MAX_PARTS) {   /* S3 takes 10,000 parts: larger ones, whole MiB */
        p = (n + FERRY_S3_MAX_PARTS - 1) / FERRY_S3_MAX_PARTS;
        p = (p + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
    }
    *part = p;
    *nparts = (n + p - 1) / p;
    return 0;
}

int ferry_s3_xml_text(const char *body, size_t n, const char *tag, char *out, size_t cap) {
    char open[80], close[80];
    int lo = snprintf(open, sizeof open, "<%s>", tag), lc = snprintf(close, sizeof close, "</%s>", tag);
    if (lo <= 0 || (size_t)lo >= sizeof open || lc <= 0 || (size_t)lc >= sizeof close || !cap) return 0;
    const char *s = memmem(body, n, open, (size_t)lo);
    if (!s) return 0;
    s += lo;
    const char *e = memmem(s, n - (size_t)(s - body), close, (size_t)lc);
    if (!e) return 0;
    static const struct { const char *ent; char c; } ents[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    size_t k = 0;
    while (s < e) {
        char c = *s++;
        if (c == '&') {
            size_t i = 0;
            for (; i < sizeof ents / sizeof *ents; i++) {
                size_t l = strlen(ents[i].ent);
                if ((size_t)(e - (s - 1)) >= l && !memcmp(s - 1, ents[i].ent, l)) { c = ents[i].c; s += l - 1; break; }
            }
        }
        if (k + 1 >= cap) return 0;
        out[k++] = c;
    }
    out[k] = 0;
    return 1;
}

/* The part size asked for: FERRY_REMOTE_PART_SIZE, 16 MiB by default (AWS's
 * guide names 8-16 MB parts; 16 MiB keeps a 100 GiB checkpoint at 6,400
 * parts, under S3's 10,000, without growing them). */
static int part_size_knob(uint64_t *v) {
    *v = 16u << 20;
    const char *s = getenv("FERRY_REMOTE_PART_SIZE");
    if (s && *s && (ferry_size_parse(s, v) < 0 || *v < FERRY_S3_MIN_PART || *v > FERRY_S3_MAX_PART))
        return ferry_seterr(FERRY_EINVAL, "FERRY_REMOTE_PART_SIZE=\"%s\": a size from 5M to 5G (S3's bounds on a part)", s);
    return 0;
}

int ferry_upload_check_env(void) {
    uint64_t v;
    return part_size_knob(&v);
}

/* Which URLs take writes: s3:// and gs:// (through the S3 API); the rest is
 * refused, saying what to do instead. */
static int writable(const char *url) {
    ferry_url_scheme s = ferry_url_scheme_of(url);
    size_t n = strlen(url);
    if ((s == FERRY_URL_S3 || s == FERRY_URL_GS) && url[n - 1] == '/')
        return ferry_seterr(FERRY_EINVAL, "%s: names a folder (a key ending in /); write an object under it, e.g. "
                            "%smodel.safetensors", url, url);
    if (s == FERRY_URL_S3 || s == FERRY_URL_GS) return 0;
    if (s == FERRY_URL_HTTP || s == FERRY_URL_HTTPS)
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: ferry does not write %s URLs: HTTP has no one protocol for writing an "
                            "object whole or not at all (servers differ on PUT); write to s3:// or gs:// (S3 multipart "
                            "upload), or to a local path and upload it", url, s == FERRY_URL_HTTP ? "http://" : "https://");
    if (s == FERRY_URL_NONE || s == FERRY_URL_FILE)
        return ferry_seterr(FERRY_EINVAL, "%s: not an object URL (s3://, gs://): local files are written with "
                            "ferry_file_open and ferry_pwrite", url);
    const char *e = strstr(url, "://");
    return ferry_seterr(FERRY_EUNSUPPORTED, "%s: ferry does not write %.*s:// URLs (s3:// and gs:// only)", url,
                        (int)(e - url), url);
}

#ifndef FERRY_HAVE_CURL
static int no_curl(const char *url) {
    const char *e = strstr(url, "://");
    return ferry_seterr(FERRY_EUNSUPPORTED, "%s: writing %.*s:// URLs needs libcurl, and this ferry was built without "
                        "it (install libcurl's headers, e.g. libcurl4-openssl-dev, and rebuild)", url, (int)(e - url), url);
}
int ferry_object_write(ferry_ctx *ctx, const char *url, const void *data, uint64_t n) {
    if (!ctx || !url || (!data && n)) return ferry_seterr(FERRY_EINVAL, "ferry_object_write: no context, URL or data");
    int rc = writable(url);
    return rc < 0 ? rc : no_curl(url);
}
int ferry_object_delete(ferry_ctx *ctx, const char *url) {
    if (!ctx || !url) return ferry_seterr(FERRY_EINVAL, "ferry_object_delete: no context or URL");
    int rc = writable(url);
    return rc < 0 ? rc : no_curl(url);
}
#else
#include <curl/curl.h>
#include <pthread.h>
#include <time.h>

#define MAX_PAR 64
#define TAG_MAX 136

static pthread_once_t curl_once_ = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc_;
static void curl_init_once(void) { curl_init_rc_ = curl_global_init(CURL_GLOBAL_DEFAULT); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct upload {
    const char *name;          /* the URL as given */
    ferry_url u;
    ferry_s3_auth auth;
    int connections, retries;
    double retry_s, stall_s;
    char ca[1024];             /* the CA bundle to trust, or "" (ferry_remote_ca_bundle) */
    char *upload_id;           /* percent-encoded, as sent and signed */
} upload;

enum { REQ_PUT, REQ_CREATE, REQ_PART, REQ_COMPLETE, REQ_ABORT, REQ_DELETE, REQ_HEAD };
static const char *const req_name[] = {"PUT", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload",
                                       "AbortMultipartUpload", "DELETE", "HEAD"};

/* One request, retried until done. */
typedef struct job {
    int kind, part;            /* part: 1-based (REQ_PART) */
    const uint8_t *body;
    uint64_t off, len;         /* the body's bytes (off: in the object, for messages) */
    int attempts, active, done;
    int gone;                  /* REQ_COMPLETE: a retry found the upload gone (NoSuchUpload) */
    double not_before;
    double first;              /* when its first attempt began: the retry window is each request's own */
    uint64_t size;             /* REQ_HEAD: the object's Content-Length */
    char etag[TAG_MAX];        /* the part's ETag (REQ_PART), the object's (REQ_HEAD) */
    char answer[512];          /* what the answer held (REQ_CREATE: the upload id) */
} job;

/* An easy handle and the request it carries now. */
typedef struct slot {
    CURL *easy;
    struct curl_slist *hdrs;
    job *j;
    char url[8192];
    char query[2048];          /* an upload id is at most 511 bytes, 1533 encoded: it always fits */
    char hash[65];
    uint64_t sent;
    ferry_http_resp resp;
    char body[4096];           /* the answer's body, leading white space skipped (S3 keeps a long
                                  CompleteMultipartUpload alive with spaces) */
    size_t body_len;
    char errbuf[CURL_ERROR_SIZE];
} slot;

static size_t on_header(char *p, size_t sz, size_t nm, void *ud) {
    slot *s = ud;
    if (ferry_http_resp_line(&s->resp, p, sz * nm)) s->body_len = 0;
    return sz * nm;
}

static size_t on_body(char *p, size_t sz, size_t nm, void *ud) {
    slot *s = ud;
    size_t n = sz * nm;
    for (size_t i = 0; i < n; i++) {
        if (!s->body_len && (p[i] == ' ' || p[i] == '\n' || p[i] == '\r' || p[i] == '\t')) continue;
        if (s->body_len + 1 < sizeof s->body) s->body[s->body_len++] = p[i];
    }
    s->body[s->body_len] = 0;
    return n;
}

static size_t on_read(char *buf, size_t sz, size_t nm, void *ud) {
    slot *s = ud;
    uint64_t left = s->j->len - s->sent, cap = (uint64_t)sz * nm;
    size_t k = (size_t)(left < cap ? left : cap);
    memcpy(buf, s->j->body + s->sent, k);
    s->sent += k;
    return k;
}

/* curl rewinds a body it must send again (a redirect, a retried connection) */
static int on_seek(void *ud, curl_off_t off, int origin) {
    slot *s = ud;
    if (origin != SEEK_SET || off < 0 || (uint64_t)off > s->j->len) return CURL_SEEKFUNC_CANTSEEK;
    s->sent = (uint64_t)off;
    return CURL_SEEKFUNC_OK;
}

static int add_header(slot *s, const char *line) {
    struct curl_slist *l = curl_slist_append(s->hdrs, line);
    if (!l) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    s->hdrs = l;
    return 0;
}

static int prepare(upload *up, slot *s, job *j) {
    CURL *e = s->easy;
    curl_easy_reset(e);
    curl_slist_free_all(s->hdrs);
    s->hdrs = NULL;
    s->j = j;
    s->sent = 0;
    s->body_len = 0;
    s->body[0] = 0;
    s->errbuf[0] = 0;
    memset(&s->resp, 0, sizeof s->resp);
    const char *method = "PUT", *sent_query = NULL;
    switch (j->kind) {
    case REQ_CREATE: method = "POST"; snprintf(s->query, sizeof s->query, "uploads="); sent_query = "uploads"; break;
    case REQ_PART: snprintf(s->query, sizeof s->query, "partNumber=%d&uploadId=%s", j->part, up->upload_id); break;
    case REQ_COMPLETE: method = "POST"; snprintf(s->query, sizeof s->query, "uploadId=%s", up->upload_id); break;
    case REQ_ABORT: method = "DELETE"; snprintf(s->query, sizeof s->query, "uploadId=%s", up->upload_id); break;
    case REQ_DELETE: method = "DELETE"; s->query[0] = 0; break;
    case REQ_HEAD: method = "HEAD"; s->query[0] = 0; break;
    default: s->query[0] = 0; break;
    }
    /* small bodies (an index, the completion's XML) are hashed and signed;
     * parts and large objects travel as UNSIGNED-PAYLOAD */
    const char *hash = NULL;
    if (j->len && j->len <= (1u << 20)) {
        uint8_t d[32];
        ferry_sha256(j->body, (size_t)j->len, d);
        ferry_hex32(d, s->hash);
        hash = s->hash;
    } else if (j->len) {
        hash = "UNSIGNED-PAYLOAD";
    }
    ferry_s3_signed sg;
    int rc = ferry_s3_sign_body(&up->auth, &up->u, method, s->query, hash, time(NULL), &sg);
    for (int i = 0; i < sg.n && rc == 0; i++) rc = add_header(s, sg.line[i]);
    if (rc == 0) rc = add_header(s, "Expect:");   /* no 100-continue round trip per part */
    if (rc == 0 && j->kind == REQ_CREATE) rc = add_header(s, "Content-Type: application/octet-stream");
    if (rc == 0 && j->kind == REQ_PUT) rc = add_header(s, "Content-Type: application/octet-stream");
    if (rc == 0 && j->kind == REQ_COMPLETE) rc = add_header(s, "Content-Type: application/xml");
    if (rc < 0) return rc;
    const char *q = sent_query ? sent_query : s->query;
    int w = snprintf(s->url, sizeof s->url, "%s%s%s", up->u.url, *q ? "?" : "", q);
    if (w < 0 || (size_t)w >= sizeof s->url) return ferry_seterr(FERRY_EINVAL, "URL too long");
    curl_easy_setopt(e, CURLOPT_URL, s->url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, s->hdrs);
    if (!strcmp(method, "PUT")) {
        curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)j->len);
        curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(e, CURLOPT_READDATA, s);
        curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(e, CURLOPT_SEEKDATA, s);
    } else if (!strcmp(method, "POST")) {
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, j->len ? (const char *)j->body : "");
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)j->len);
    } else if (!strcmp(method, "HEAD")) {
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    } else {
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    }
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, s);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(e, CURLOPT_PRIVATE, s);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, s->errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "ferry/" FERRY_VERSION_STRING);
    if (up->ca[0]) curl_easy_setopt(e, CURLOPT_CAINFO, up->ca);
    /* a completion of many parts takes S3 minutes, kept alive by a space now
     * and then: only silence ends it */
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, j->kind == REQ_COMPLETE ? 1L : 1024L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)(up->stall_s + 0.5));
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(1000 * (up->stall_s < 10 ? up->stall_s : 10)));
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);   /* the signature names the host */
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(e, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    return 0;
}

static int retryable_curl(CURLcode c) {
    switch (c) {
    case CURLE_OPERATION_TIMEDOUT: case CURLE_COULDNT_CONNECT: case CURLE_RECV_ERROR: case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE: case CURLE_GOT_NOTHING: case CURLE_SSL_CONNECT_ERROR: case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM: case CURLE_COULDNT_RESOLVE_HOST: case CURLE_AGAIN: case CURLE_SEND_FAIL_REWIND:
        return 1;
    default:
        return 0;
    }
}

enum { DONE = 0, RETRY = 1 };

/* What a finished request means: DONE, RETRY or a negative code; why says why. */
static int classify(upload *up, slot *s, CURLcode res, char *why, size_t cap) {
    job *j = s->j;
    if (res != CURLE_OK) {
        snprintf(why, cap, "%s%s%.300s%s", curl_easy_strerror(res), s->errbuf[0] ? ": " : "", s->errbuf,
                 res == CURLE_PEER_FAILED_VERIFICATION && !strstr(s->errbuf, "host name")
                 ? " (the endpoint's TLS certificate was not trusted; FERRY_REMOTE_CA_BUNDLE names the CA bundle to trust)" : "");
        return retryable_curl(res) ? RETRY : FERRY_EIO;
    }
    long st = s->resp.status;
    char msg[300];
    ferry_http_server_message(s->body, s->body_len, msg, sizeof msg);
    /* CompleteMultipartUpload may answer 200 and fail in its body */
    int body_error = st == 200 && !strncmp(s->body, "<?xml", 5) && strstr(s->body, "<Error>");
    if (st >= 200 && st < 300 && !body_error) {
        if (j->kind == REQ_HEAD) {
            j->size = s->resp.have_clen ? s->resp.clen : UINT64_MAX;
            snprintf(j->etag, sizeof j->etag, "%.130s", s->resp.etag);
        }
        if (j->kind == REQ_PART) {
            size_t el = strlen(s->resp.etag);
            if (!el || el >= sizeof j->etag) {
                snprintf(why, cap, "HTTP %ld with %s ETag", st, el ? "an overlong" : "no");
                return FERRY_EIO;
            }
            memcpy(j->etag, s->resp.etag, el + 1);
        }
        if (j->kind == REQ_CREATE && !ferry_s3_xml_text(s->body, s->body_len, "UploadId", j->answer, sizeof j->answer)) {
            snprintf(why, cap, "HTTP %ld without an UploadId: %.200s", st, s->body);
            return FERRY_EIO;
        }
        return DONE;
    }
    snprintf(why, cap, "HTTP %ld%s%s%s%s", st, *ferry_http_reason(st) ? " " : "", ferry_http_reason(st),
             *msg ? ": " : "", msg);
    if ((st == 401 || st == 403) && !up->auth.access && strlen(why) + 80 < cap)
        strcat(why, " (no credentials were found: the request went unsigned)");
    if (body_error)
        return strstr(s->body, "<Code>InternalError</Code>") || strstr(s->body, "<Code>SlowDown</Code>") ? RETRY : FERRY_EIO;
    if ((j->kind == REQ_DELETE || j->kind == REQ_ABORT) && st == 404) return DONE;   /* gone already */
    /* a completion retried after its answer was lost finds the upload gone:
     * the caller asks the object whether it is this upload's */
    if (j->kind == REQ_COMPLETE && st == 404 && j->attempts > 1 && strstr(s->body, "<Code>NoSuchUpload</Code>")) {
        j->gone = 1;
        return DONE;
    }
    if (st == 408 || st == 429 || st >= 500 || (st == 400 && strstr(s->body, "<Code>RequestTimeout</Code>"))) return RETRY;
    if (st == 404) return -ENOENT;
    if (st == 403 || st == 401) return -EACCES;
    return FERRY_EIO;
}

/* Run jobs js[0..n) to completion: 0, or a negative code with the message
 * set (which request, which bytes, why). */
static int run(upload *up, job *js, size_t n) {
    int par = up->connections < MAX_PAR ? up->connections : MAX_PAR;
    if ((size_t)par > n) par = (int)n;
    CURLM *multi = curl_multi_init();
    slot *slots = calloc((size_t)par, sizeof *slots);
    int rc = 0;
    if (!multi || !slots) rc = ferry_seterr(FERRY_ENOMEM, "out of memory for an HTTP client");
    for (int i = 0; i < par && rc == 0; i++)
        if (!(slots[i].easy = curl_easy_init())) rc = ferry_seterr(FERRY_ENOMEM, "out of memory for an HTTP client");
    if (rc == 0) curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, (long)par);
    size_t left = n, nactive = 0;
    char why[700];
    while (left && rc == 0) {
        double now = now_s(), wake = now + 0.1;
        for (size_t i = 0; i < n && rc == 0 && nactive < (size_t)par; i++) {
            job *j = &js[i];
            if (j->done || j->active) continue;
            if (j->not_before > now) { if (j->not_before < wake) wake = j->not_before; continue; }
            slot *s = NULL;
            for (int k = 0; k < par && !s; k++) if (!slots[k].j) s = &slots[k];
            if ((rc = prepare(up, s, j)) < 0) { s->j = NULL; break; }
            j->active = 1;
            if (!j->attempts++) j->first = now;
            nactive++;
            curl_multi_add_handle(multi, s->easy);
        }
        if (rc < 0) break;
        if (nactive == 0) {
            double d = wake - now;
            if (d > 0) { struct timespec ts = {(time_t)d, (long)((d - (time_t)d) * 1e9)}; nanosleep(&ts, NULL); }
            continue;
        }
        int running;
        CURLMcode mc = curl_multi_perform(multi, &running);
        if (mc != CURLM_OK) { rc = ferry_seterr(FERRY_EIO, "libcurl: %s", curl_multi_strerror(mc)); break; }
        CURLMsg *m;
        int q;
        while ((m = curl_multi_info_read(multi, &q))) {
            if (m->msg != CURLMSG_DONE) continue;
            slot *s;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&s);
            CURLcode res = m->data.result;
            curl_multi_remove_handle(multi, s->easy);
            job *j = s->j;
            int k = classify(up, s, res, why, sizeof why);
            s->j = NULL;
            j->active = 0;
            nactive--;
            double t = now_s();
            char what[120];
            if (j->kind == REQ_PART)
                snprintf(what, sizeof what, "part %d (bytes %llu-%llu)", j->part, (unsigned long long)j->off,
                         (unsigned long long)(j->off + j->len - 1));
            else
                snprintf(what, sizeof what, "%s", req_name[j->kind]);
            if (k == DONE) { j->done = 1; left--; }
            else if (k == RETRY && j->attempts <= up->retries && t - j->first < up->retry_s)
                j->not_before = t + ferry_remote_backoff(j->attempts);
            else if (rc == 0 && k == RETRY)
                rc = ferry_seterr(FERRY_EIO, "%s: %s (gave up after %d attempts in %.1f s; FERRY_REMOTE_RETRIES, "
                                  "FERRY_REMOTE_RETRY_SECONDS)", what, why, j->attempts, t - j->first);
            else if (rc == 0)
                rc = ferry_seterr(k, "%s: %s", what, why);
        }
        if (left && rc == 0) {
            int ms = (int)((wake - now_s()) * 1000);
            curl_multi_poll(multi, NULL, 0, ms < 1 ? 1 : ms > 100 ? 100 : ms, NULL);
        }
    }
    for (int i = 0; slots && i < par; i++) {
        if (slots[i].j) curl_multi_remove_handle(multi, slots[i].easy);
        if (slots[i].easy) curl_easy_cleanup(slots[i].easy);
        curl_slist_free_all(slots[i].hdrs);
    }
    free(slots);
    if (multi) curl_multi_cleanup(multi);
    return rc;
}

static int setup(upload *up, const char *url) {
    memset(up, 0, sizeof *up);
    up->name = url;
    int rc = writable(url);
    if (rc < 0) return rc;
    pthread_once(&curl_once_, curl_init_once);
    if (curl_init_rc_ != CURLE_OK) return ferry_seterr(FERRY_EIO, "%s: libcurl failed to start: %s", url, curl_easy_strerror(curl_init_rc_));
    if ((rc = ferry_remote_limits(&up->connections, &up->retries, &up->retry_s, &up->stall_s)) < 0) return rc;
    if ((rc = ferry_remote_ca_bundle(up->ca, sizeof up->ca)) < 0) return rc;
    return ferry_s3_setup(url, &up->u, &up->auth);
}

static void teardown(upload *up) {
    ferry_url_free(&up->u);
    ferry_s3_auth_free(&up->auth);
    free(up->upload_id);
    up->upload_id = NULL;
}

/* The completion's body: every part's number and ETag, in order. */
static char *complete_xml(const job *parts, uint64_t n, size_t *len) {
    static const char head[] = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
    static const char tail[] = "</CompleteMultipartUpload>";
    size_t cap = sizeof head + sizeof tail + (size_t)n * (64 + 5 * TAG_MAX);   /* an entity is 5 bytes at most */
    char *out = malloc(cap), *o = out;
    if (!out) return NULL;
    o += sprintf(o, "%s", head);
    for (uint64_t i = 0; i < n; i++) {
        o += sprintf(o, "<Part><PartNumber>%d</PartNumber><ETag>", parts[i].part);
        for (const char *c = parts[i].etag; *c; c++)
            o += *c == '&' ? sprintf(o, "&amp;") : *c == '<' ? sprintf(o, "&lt;") : *c == '>' ? sprintf(o, "&gt;")
                                                                                            : sprintf(o, "%c", *c);
        o += sprintf(o, "</ETag></Part>");
    }
    o += sprintf(o, "%s", tail);
    *len = (size_t)(o - out);
    return out;
}

/* Whether the object is this upload's, after a completion whose answer was
 * lost: its size, and a multipart ETag of as many parts ("...-N"). */
static int completed_before(upload *up, uint64_t n, uint64_t nparts) {
    job head = {.kind = REQ_HEAD};
    int rc = run(up, &head, 1);
    if (rc < 0) return rc;
    char tail[32];
    snprintf(tail, sizeof tail, "-%llu\"", (unsigned long long)nparts);
    size_t el = strlen(head.etag), tl = strlen(tail);
    if (head.size == n && el > tl && !strcmp(head.etag + el - tl, tail)) return 0;
    return ferry_seterr(FERRY_EIO, "CompleteMultipartUpload: retried after a lost answer, the upload was gone "
                        "(NoSuchUpload) and the object is not this upload's (%llu bytes, ETag %s; expected %llu bytes "
                        "in %llu parts)", (unsigned long long)head.size, head.etag[0] ? head.etag : "none",
                        (unsigned long long)n, (unsigned long long)nparts);
}

static int multipart(upload *up, const uint8_t *data, uint64_t n, uint64_t part, uint64_t nparts) {
    job create = {.kind = REQ_CREATE};
    int rc = run(up, &create, 1);
    if (rc < 0) return rc;
    if (!(up->upload_id = ferry_url_encode(create.answer, strlen(create.answer), 0)))
        return ferry_seterr(FERRY_ENOMEM, "out of memory");
    job *parts = calloc((size_t)nparts, sizeof *parts);
    if (!parts) rc = ferry_seterr(FERRY_ENOMEM, "out of memory for %llu parts", (unsigned long long)nparts);
    for (uint64_t i = 0; parts && i < nparts; i++) {
        parts[i].kind = REQ_PART;
        parts[i].part = (int)i + 1;
        parts[i].off = i * part;
        parts[i].len = i + 1 < nparts ? part : n - i * part;
        parts[i].body = data + parts[i].off;
    }
    if (rc == 0) rc = run(up, parts, (size_t)nparts);
    size_t xlen = 0;
    char *xml = rc == 0 ? complete_xml(parts, nparts, &xlen) : NULL;
    if (rc == 0 && !xml) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    if (rc == 0) {
        job done = {.kind = REQ_COMPLETE, .body = (const uint8_t *)xml, .len = xlen};
        rc = run(up, &done, 1);
        if (rc == 0 && done.gone) rc = completed_before(up, n, nparts);
    }
    free(xml);
    free(parts);
    if (rc < 0) {   /* abort: the parts are dropped, the object is what it was */
        char first[1200];
        snprintf(first, sizeof first, "%s", ferry_lasterr());
        job abort = {.kind = REQ_ABORT};
        int ra = run(up, &abort, 1);
        if (ra < 0)
            ferry_seterr(rc, "%s; the upload could not be aborted either (%s): upload id %s stays pending until "
                         "aborted (aws s3api abort-multipart-upload, or a lifecycle rule "
                         "AbortIncompleteMultipartUpload)", first, ferry_lasterr(), create.answer);
        else
            ferry_seterr(rc, "%s; the upload was aborted: the object is as it was", first);
    }
    return rc;
}

int ferry_object_write(ferry_ctx *ctx, const char *url, const void *data, uint64_t n) {
    if (!ctx || !url || (!data && n)) return ferry_seterr(FERRY_EINVAL, "ferry_object_write: no context, URL or data");
    upload up;
    uint64_t want, part, nparts;
    int rc = setup(&up, url);   /* its errors name url */
    if (rc == 0 && ((rc = part_size_knob(&want)) < 0 || (rc = ferry_upload_parts(n, want, &part, &nparts)) < 0))
        ferry_preerr(rc, "%s", url);
    if (rc == 0) {
        if (nparts == 0) {
            job put = {.kind = REQ_PUT, .body = data, .len = n};
            rc = run(&up, &put, 1);
        } else {
            rc = multipart(&up, data, n, part, nparts);
        }
        if (rc < 0) ferry_preerr(rc, "%s", url);
    }
    teardown(&up);
    return rc < 0 ? rc : 0;
}

int ferry_object_delete(ferry_ctx *ctx, const char *url) {
    if (!ctx || !url) return ferry_seterr(FERRY_EINVAL, "ferry_object_delete: no context or URL");
    upload up;
    int rc = setup(&up, url);
    if (rc == 0) {
        job del = {.kind = REQ_DELETE};
        if ((rc = run(&up, &del, 1)) < 0) ferry_preerr(rc, "%s", url);
    }
    teardown(&up);
    return rc < 0 ? rc : 0;
}
#endif
