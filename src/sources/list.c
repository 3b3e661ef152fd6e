/* list.c — listing a bucket under a prefix (list.h). Pages are fetched one
 * after another (each names the next), each request retried with backoff
 * where the failure is the network's or the server's load, as range reads
 * are (http.c), under the same FERRY_REMOTE_RETRIES / _RETRY_SECONDS /
 * _STALL_SECONDS bounds. The bodies are hostile until checked: a page is at
 * most LIST_MAX_BODY bytes, every key must start with the prefix asked for,
 * a listing holds at most the caller's max entries, and a server that names
 * the page it just sent as the next one, or sends more than LIST_MAX_PAGES
 * pages, is an error. */
#include "common.h"
#include "formats/json.h"   /* GCS's JSON list (a leaf parser; no format is involved) */
#include "sources/list.h"
#include "sources/remote.h"   /* ferry_remote_ca_bundle */
#include "sources/response.h"
#include "sources/s3.h"
#include "sources/url.h"
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#define LIST_MAX_BODY ((size_t)32 << 20)   /* a page of 1,000 keys is ~300 KB */
#define LIST_MAX_PAGES 1000000

int ferry_remote_can_list(const char *url) {
    ferry_url_scheme s = ferry_url_scheme_of(url);
    return s == FERRY_URL_S3 || s == FERRY_URL_GS;
}

void ferry_remote_listing_free(ferry_remote_listing *l) {
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) free(l->e[i].name);
    free(l->e);
    memset(l, 0, sizeof *l);
}

/* By name, then objects before folders: an object and a folder may share a
 * name ("x" and "x/..."), and a lookup of the object must not land on the folder. */
static int cmp_entry(const void *a, const void *b) {
    const ferry_remote_entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->dir > y->dir) - (x->dir < y->dir);
}

const ferry_remote_entry *ferry_remote_listing_find(const ferry_remote_listing *l, const char *name) {
    if (!l || !l->n) return NULL;
    ferry_remote_entry probe = {(char *)name, 0, 0};
    const ferry_remote_entry *e = bsearch(&probe, l->e, l->n, sizeof *l->e, cmp_entry);
    return e && !e->dir ? e : NULL;
}

/* One key (decoded, len bytes) of the listing of prefix. */
static int add_entry(ferry_remote_listing *out, const char *key, size_t len, const char *prefix, uint64_t size, int dir,
                     size_t max) {
    size_t pl = strlen(prefix);
    if (len < pl || memcmp(key, prefix, pl) || memchr(key, 0, len))
        return ferry_seterr(FERRY_EFORMAT, "listing of \"%s\": the server sent the key \"%.*s\", which does not start "
                            "with the prefix", prefix, (int)(len > 200 ? 200 : len), key);
    const char *name = key + pl;
    size_t nl = len - pl;
    if (dir && nl && name[nl - 1] == '/') nl--;
    if (!nl) return 0;   /* the prefix itself (a "folder" marker object) */
    if (out->n >= max)
        return ferry_seterr(FERRY_EINVAL, "listing of \"%s\": more than %zu entries", prefix, max);
    if (out->n == out->cap) {
        size_t cap = out->cap ? 2 * out->cap : 256;
        ferry_remote_entry *e = realloc(out->e, cap * sizeof *e);
        if (!e) return ferry_seterr(FERRY_ENOMEM, "out of memory listing \"%s\"", prefix);
        out->e = e;
        out->cap = cap;
    }
    char *s = malloc(nl + 1);
    if (!s) return ferry_seterr(FERRY_ENOMEM, "out of memory listing \"%s\"", prefix);
    memcpy(s, name, nl);
    s[nl] = 0;
    out->e[out->n++] = (ferry_remote_entry){s, dir ? 0 : size, dir};
    return 0;
}

/* ---- ListObjectsV2 XML ------------------------------------------------------ */
/* The text of the first <name ...>...</name> in [p, end): *vs, *ve; returns
 * the position after it, or NULL. Attributes (the root's xmlns) are skipped. */
static const char *element(const char *p, const char *end, const char *name, const char **vs, const char **ve) {
    char open[64], close[66];
    snprintf(open, sizeof open, "<%s", name);
    snprintf(close, sizeof close, "</%s>", name);
    size_t ol = strlen(open), cl = strlen(close);
    for (const char *q = p; q + ol < end; q++) {
        if (*q != '<' || memcmp(q, open, ol) || (q[ol] != '>' && q[ol] != ' ')) continue;
        const char *s = memchr(q + ol, '>', (size_t)(end - q - ol));
        if (!s || s[-1] == '/') continue;   /* <name/>: empty, no text */
        s++;
        for (const char *r = s; r + cl <= end; r++)
            if (*r == '<' && !memcmp(r, close, cl)) {
                *vs = s;
                *ve = r;
                return r + cl;
            }
        return NULL;
    }
    return NULL;
}

static void put_utf8(char **o, unsigned long c) {
    char *p = *o;
    if (c < 0x80) *p++ = (char)c;
    else if (c < 0x800) { *p++ = (char)(0xc0 | c >> 6); *p++ = (char)(0x80 | (c & 63)); }
    else if (c < 0x10000) { *p++ = (char)(0xe0 | c >> 12); *p++ = (char)(0x80 | (c >> 6 & 63)); *p++ = (char)(0x80 | (c & 63)); }
    else { *p++ = (char)(0xf0 | c >> 18); *p++ = (char)(0x80 | (c >> 12 & 63)); *p++ = (char)(0x80 | (c >> 6 & 63)); *p++ = (char)(0x80 | (c & 63)); }
    *o = p;
}

/* XML character data [s, e) with its entities resolved, malloc'ed (*len
 * bytes, NUL-terminated); NULL on an entity ferry does not know or a NUL. */
static char *xml_text(const char *s, const char *e, size_t *len) {
    char *out = malloc((size_t)(e - s) + 1), *o = out;
    if (!out) return NULL;
    while (s < e) {
        if (*s != '&') { *o++ = *s++; continue; }
        const char *semi = memchr(s, ';', (size_t)(e - s));
        if (!semi || semi - s > 12) { free(out); return NULL; }
        size_t n = (size_t)(semi - s - 1);
        const char *nm = s + 1;
        if (n == 3 && !memcmp(nm, "amp", 3)) *o++ = '&';
        else if (n == 2 && !memcmp(nm, "lt", 2)) *o++ = '<';
        else if (n == 2 && !memcmp(nm, "gt", 2)) *o++ = '>';
        else if (n == 4 && !memcmp(nm, "quot", 4)) *o++ = '"';
        else if (n == 4 && !memcmp(nm, "apos", 4)) *o++ = '\'';
        else if (n >= 2 && nm[0] == '#') {
            char num[16];
            memcpy(num, nm + 1, n - 1);
            num[n - 1] = 0;
            char *end;
            unsigned long c = (num[0] == 'x' || num[0] == 'X') ? strtoul(num + 1, &end, 16) : strtoul(num, &end, 10);
            if (*end || c == 0 || c > 0x10ffff || (c >= 0xd800 && c < 0xe000)) { free(out); return NULL; }
            put_utf8(&o, c);
        } else { free(out); return NULL; }
        s = semi + 1;
    }
    *o = 0;
    *len = (size_t)(o - out);
    if (strlen(out) != *len) { free(out); return NULL; }
    return out;
}

static int parse_u64(const char *s, const char *e, uint64_t *v) {
    uint64_t x = 0;
    if (s == e || e - s > 20) return -1;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9' || ferry_mul_overflow(x, 10, &x) || ferry_add_overflow(x, (uint64_t)(*s - '0'), &x)) return -1;
    }
    *v = x;
    return 0;
}

int ferry_list_parse_s3(const char *body, size_t n, const char *prefix, ferry_remote_listing *out, size_t max,
                        char **next) {
    *next = NULL;
    const char *end = body + n, *vs, *ve;
    if (!element(body, end, "ListBucketResult", &vs, &ve))
        return ferry_seterr(FERRY_EFORMAT, "listing of \"%s\": the answer is not a ListBucketResult", prefix);
    const char *lo = vs, *hi = ve;
    int rc = 0;
    /* objects, then sub-prefixes */
    for (const char *p = lo; rc == 0 && (p = element(p, hi, "Contents", &vs, &ve));) {
        const char *ks, *ke, *ss, *se;
        uint64_t size = 0;
        if (!element(vs, ve, "Key", &ks, &ke) || !element(vs, ve, "Size", &ss, &se) || parse_u64(ss, se, &size) < 0)
            return ferry_seterr(FERRY_EFORMAT, "listing of \"%s\": an entry without a Key or a Size", prefix);
        size_t kl;
        char *key = xml_text(ks, ke, &kl);
        if (!key) return ferry_seterr(FERRY_EFORMAT, "listing of \"%s\": a Key with a NUL or an unknown entity", prefix);
        rc = add_entry(out, key, kl, prefix, size, 0, max);
        free(key);
    }
    for (const char *p = lo; rc == 0 && (p = element(p, hi, "CommonPrefixes", &vs, &ve));) {
        const char *ks, *ke;
        if (!element(vs, ve, "Prefix", &ks, &ke))
            return ferry_seterr(FERRY_EFORMAT, "listing of \"%s\": CommonPrefixes without a Prefix", prefix);
        size_t kl;
        char *key = xml_text(ks, ke, &kl);
        if (!key) return ferry_seterr(FERRY_EFORMAT, "listing of \"%s\": a Prefix with a NUL or an unknown entity", prefix);
        rc = add_entry(out, key, kl, prefix, 0, 1, max);
        free(key);
    }
    if (rc < 0) return rc;
    if (element(lo, hi, "IsTruncated", &vs, &ve) && ve - vs == 4 && !memcmp(vs, "true", 4)) {
        size_t tl;
        if (!element(lo, hi, "NextContinuationToken", &vs, &ve) || !(*next = xml_text(vs, ve, &tl)) || !tl) {
            free(*next);
            *next = NULL;
            return ferry_seterr(FERRY_EFORMAT, "listing of \"%s\": IsTruncated without a NextContinuationToken", prefix);
        }
    }
    return 0;
}

/* ---- GCS JSON -------------------------------------------------------------------- */
int ferry_list_parse_gcs(const char *body, size_t n, const char *prefix, ferry_remote_listing *out, size_t max,
                         char **next) {
    *next = NULL;
    ferry_json *j = NULL;
    int rc = ferry_json_parse(body, n, "GCS object list", 0, &j);
    if (rc < 0) return rc;
    const ferry_json *items = ferry_json_get(j, "items"), *pre = ferry_json_get(j, "prefixes"),
                     *tok = ferry_json_get(j, "nextPageToken");
    if (j->type != FERRY_JSON_OBJECT || (items && items->type != FERRY_JSON_ARRAY) || (pre && pre->type != FERRY_JSON_ARRAY) ||
        (tok && tok->type != FERRY_JSON_STRING))
        rc = ferry_seterr(FERRY_EFORMAT, "listing of \"%s\": not a GCS object list", prefix);
    for (size_t i = 0; rc == 0 && items && i < items->n; i++) {
        const ferry_json *nm = ferry_json_get(&items->items[i], "name"), *sz = ferry_json_get(&items->items[i], "size");
        uint64_t size = 0;
        if (!nm || nm->type != FERRY_JSON_STRING || !sz || sz->type != FERRY_JSON_STRING ||
            parse_u64(sz->str, sz->str + sz->len, &size) < 0)
            rc = ferry_seterr(FERRY_EFORMAT, "listing of \"%s\": item %zu without a name or a size", prefix, i);
        else rc = add_entry(out, nm->str, nm->len, prefix, size, 0, max);
    }
    for (size_t i = 0; rc == 0 && pre && i < pre->n; i++) {
        const ferry_json *p = &pre->items[i];
        if (p->type != FERRY_JSON_STRING) rc = ferry_seterr(FERRY_EFORMAT, "listing of \"%s\": a prefix that is not a string", prefix);
        else rc = add_entry(out, p->str, p->len, prefix, 0, 1, max);
    }
    if (rc == 0 && tok && tok->len && !(*next = strdup(tok->str))) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    ferry_json_free(j);
    return rc;
}

#ifndef FERRY_HAVE_CURL
int ferry_remote_list(const char *url, const ferry_remote_opts *o, int one_level, size_t max, ferry_remote_listing *out) {
    (void)o; (void)one_level; (void)max;
    memset(out, 0, sizeof *out);
    return ferry_seterr(FERRY_EUNSUPPORTED, "%s: listing objects needs libcurl, and this ferry was built without it", url);
}
#else
#include <curl/curl.h>

typedef struct page {
    char *buf;
    size_t len, cap;
    int over;
} page;

static size_t on_data(char *p, size_t sz, size_t nm, void *ud) {
    page *b = ud;
    size_t n = sz * nm;
    if (b->len + n > LIST_MAX_BODY) { b->over = 1; return 0; }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 65536;
        while (cap < b->len + n + 1) cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) return 0;
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, p, n);
    b->len += n;
    b->buf[b->len] = 0;
    return n;
}

static double env_d(const char *name, double dflt) {
    const char *s = getenv(name);
    char *end;
    double v = s && *s ? strtod(s, &end) : dflt;
    return s && *s && !*end ? v : dflt;   /* validated at ferry_ctx_create (http.c) */
}

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct lister {
    const char *what;            /* the URL listed, for messages */
    ferry_url u;                 /* s3: the bucket's request URL (path ends at the bucket) */
    ferry_s3_auth auth;
    int s3;                      /* 1: ListObjectsV2 (signed when auth has keys); 0: GCS JSON */
    char *gcs_base;              /* GCS: ENDPOINT/storage/v1/b/BUCKET/o */
    const char *ca;
    CURL *easy;
} lister;

/* GET one page (query canonical: sorted, encoded) into b: 0, or a negative
 * code with the message (status and the server's words) set. */
static int get_page(lister *L, const char *query, page *b) {
    int retries = (int)env_d("FERRY_REMOTE_RETRIES", 10);
    double budget = env_d("FERRY_REMOTE_RETRY_SECONDS", 60), stall = env_d("FERRY_REMOTE_STALL_SECONDS", 30);
    double t0 = mono(), wait = 0.2;
    const char *base = L->s3 ? L->u.url : L->gcs_base;
    size_t ul = strlen(base) + strlen(query) + 2;
    char *url = malloc(ul);
    if (!url) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    snprintf(url, ul, "%s?%s", base, query);
    char why[600] = "";
    int rc = 0;
    for (int attempt = 1;; attempt++) {
        b->len = 0;
        b->over = 0;
        if (b->buf) b->buf[0] = 0;
        struct curl_slist *h = NULL;
        if (L->s3) {
            ferry_s3_signed sg;
            if ((rc = ferry_s3_sign(&L->auth, &L->u, "GET", query, time(NULL), &sg)) < 0) break;
            for (int i = 0; i < sg.n; i++) {
                struct curl_slist *l = curl_slist_append(h, sg.line[i]);
                if (!l) { rc = ferry_seterr(FERRY_ENOMEM, "out of memory"); break; }
                h = l;
            }
            if (rc < 0) { curl_slist_free_all(h); break; }
        }
        CURL *e = L->easy;
        curl_easy_reset(e);
        char errbuf[CURL_ERROR_SIZE] = "";
        curl_easy_setopt(e, CURLOPT_URL, url);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, b);
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_USERAGENT, "ferry/" FERRY_VERSION_STRING);
        curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "");
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)(stall + 0.5));
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(1000 * (stall < 10 ? stall : 10)));
        if (L->ca) curl_easy_setopt(e, CURLOPT_CAINFO, L->ca);
#if LIBCURL_VERSION_NUM >= 0x075500
        curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
#else
        curl_easy_setopt(e, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
        CURLcode res = curl_easy_perform(e);
        curl_slist_free_all(h);
        long status = 0;
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
        int retry = 0;
        if (b->over) {
            rc = ferry_seterr(FERRY_EFORMAT, "%s: a listing page of more than %zu bytes", L->what, LIST_MAX_BODY);
            break;
        }
        if (res != CURLE_OK) {
            snprintf(why, sizeof why, "%s%s%.300s", curl_easy_strerror(res), errbuf[0] ? ": " : "", errbuf);
            retry = res == CURLE_OPERATION_TIMEDOUT || res == CURLE_COULDNT_CONNECT || res == CURLE_RECV_ERROR ||
                    res == CURLE_SEND_ERROR || res == CURLE_PARTIAL_FILE || res == CURLE_GOT_NOTHING ||
                    res == CURLE_COULDNT_RESOLVE_HOST || res == CURLE_SSL_CONNECT_ERROR;
            if (!retry) { rc = ferry_seterr(FERRY_EIO, "%s: listing: %s", L->what, why); break; }
        } else if (status == 200) {
            rc = 0;
            break;
        } else {
            char msg[300];
            ferry_http_server_message(b->buf ? b->buf : "", b->len, msg, sizeof msg);
            snprintf(why, sizeof why, "HTTP %ld%s%s%s%s", status, *ferry_http_reason(status) ? " " : "",
                     ferry_http_reason(status), *msg ? ": " : "", msg);
            retry = status == 408 || status == 429 || status >= 500;
            if (!retry) {
                int code = status == 404 ? -ENOENT : (status == 403 || status == 401) ? -EACCES : FERRY_EIO;
                rc = ferry_seterr(code, "%s: listing: %s", L->what, why);
                break;
            }
        }
        double now = mono();
        if (attempt > retries || now - t0 >= budget) {
            rc = ferry_seterr(FERRY_EIO, "%s: listing: %s (gave up after %d attempts in %.1f s; FERRY_REMOTE_RETRIES, "
                              "FERRY_REMOTE_RETRY_SECONDS)", L->what, why, attempt, now - t0);
            break;
        }
        static _Thread_local unsigned seed;
        if (!seed) seed = (unsigned)(mono() * 1e6) ^ (unsigned)(uintptr_t)&seed;
        double d = wait / 2 + wait / 2 * ((double)rand_r(&seed) / RAND_MAX);   /* equal jitter, as http.c */
        struct timespec ts = {(time_t)d, (long)((d - (time_t)d) * 1e9)};
        nanosleep(&ts, NULL);
        if (wait < 10) wait *= 2;
    }
    free(url);
    return rc;
}

/* name=value appended to a query being built (value percent-encoded). */
static int qadd(char *q, size_t cap, const char *name, const char *value) {
    char *v = ferry_url_encode(value, strlen(value), 0);
    if (!v) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    size_t l = strlen(q);
    int w = snprintf(q + l, cap - l, "%s%s=%s", l ? "&" : "", name, v);
    free(v);
    if (w < 0 || (size_t)w >= cap - l) return ferry_seterr(FERRY_EINVAL, "listing: a query of more than %zu bytes", cap);
    return 0;
}

int ferry_remote_list(const char *url, const ferry_remote_opts *o, int one_level, size_t max, ferry_remote_listing *out) {
    memset(out, 0, sizeof *out);
    if (!ferry_remote_can_list(url))
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: objects of this scheme cannot be listed (s3:// and gs:// can; a "
                            "web server's URLs are named one by one)", url);
    const char *b = strstr(url, "://") + 3, *slash = strchr(b, '/');
    size_t bl = slash ? (size_t)(slash - b) : strlen(b);
    const char *prefix = slash ? slash + 1 : "";
    if (!bl) return ferry_seterr(FERRY_EINVAL, "%s: no bucket", url);
    int gs = ferry_url_scheme_of(url) == FERRY_URL_GS;
    lister L = {0};
    L.what = url;
    L.ca = o ? o->ca_bundle : NULL;
    char ca_env[1024];   /* else the variables' (FERRY_REMOTE_CA_BUNDLE, ...), as reads trust */
    if (!L.ca) {
        int crc = ferry_remote_ca_bundle(ca_env, sizeof ca_env);
        if (crc < 0) return crc;
        if (ca_env[0]) L.ca = ca_env;
    }
    /* the bucket's URL and credentials, as an object's: "BUCKET/_", its key then taken off */
    char *obj = malloc(bl + 16);
    if (!obj) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    snprintf(obj, bl + 16, "%s://%.*s/_", gs ? "gs" : "s3", (int)bl, b);
    int rc = ferry_s3_setup_opts(obj, o, &L.u, &L.auth);
    free(obj);
    if (rc < 0) { ferry_preerr(rc, "%s", url); ferry_url_free(&L.u); return rc; }
    L.u.path[strlen(L.u.path) - 1] = 0;   /* ".../BUCKET/" or "/" */
    L.u.url[strlen(L.u.url) - 1] = 0;
    L.s3 = !gs || L.auth.access != NULL;
    if (!L.s3) {
        /* GCS's JSON API: ENDPOINT/storage/v1/b/BUCKET/o (the endpoint: the URL
         * the object requests go to, less the bucket's path) */
        size_t hl = strlen(L.u.url) - strlen(L.u.path), n = hl + 64 + 3 * bl;
        char *eb = ferry_url_encode(b, bl, 0);
        const char *base_path = L.u.path;
        size_t bpl = strlen(base_path);
        /* path style: BASE/BUCKET/ -> BASE */
        size_t keep = bpl > bl + 1 ? bpl - bl - 2 : 0;
        if (eb && (L.gcs_base = malloc(n + keep))) {
            memcpy(L.gcs_base, L.u.url, hl);
            memcpy(L.gcs_base + hl, base_path, keep);
            snprintf(L.gcs_base + hl + keep, n - hl, "/storage/v1/b/%s/o", eb);
        }
        free(eb);
        if (!L.gcs_base) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    }
    if (rc == 0 && !(L.easy = curl_easy_init())) rc = ferry_seterr(FERRY_ENOMEM, "out of memory for an HTTP client");
    page pg = {0};
    char *token = NULL;
    for (long pages = 0; rc == 0; pages++) {
        if (pages >= LIST_MAX_PAGES) { rc = ferry_seterr(FERRY_EFORMAT, "%s: a listing of more than %d pages", url, LIST_MAX_PAGES); break; }
        char q[8192] = "";
        /* canonical order: names sorted */
        if (L.s3) {
            if (token) rc = qadd(q, sizeof q, "continuation-token", token);
            if (!rc && one_level) rc = qadd(q, sizeof q, "delimiter", "/");
            if (!rc) rc = qadd(q, sizeof q, "list-type", "2");
            if (!rc) rc = qadd(q, sizeof q, "max-keys", "1000");
            if (!rc) rc = qadd(q, sizeof q, "prefix", prefix);
        } else {
            if (one_level) rc = qadd(q, sizeof q, "delimiter", "/");
            if (!rc) rc = qadd(q, sizeof q, "maxResults", "1000");
            if (!rc && token) rc = qadd(q, sizeof q, "pageToken", token);
            if (!rc) rc = qadd(q, sizeof q, "prefix", prefix);
        }
        if (rc < 0) break;
        if ((rc = get_page(&L, q, &pg)) < 0) break;
        char *next = NULL;
        rc = L.s3 ? ferry_list_parse_s3(pg.buf ? pg.buf : "", pg.len, prefix, out, max, &next)
                  : ferry_list_parse_gcs(pg.buf ? pg.buf : "", pg.len, prefix, out, max, &next);
        if (rc < 0) { ferry_preerr(rc, "%s", url); break; }
        if (next && token && !strcmp(next, token)) {
            free(next);
            rc = ferry_seterr(FERRY_EFORMAT, "%s: the server named the same listing page twice", url);
            break;
        }
        free(token);
        token = next;
        if (!token) break;
    }
    free(token);
    free(pg.buf);
    if (L.easy) curl_easy_cleanup(L.easy);
    free(L.gcs_base);
    ferry_url_free(&L.u);
    ferry_s3_auth_free(&L.auth);
    if (rc == 0 && out->n > 1) {
        qsort(out->e, out->n, sizeof *out->e, cmp_entry);
        size_t w = 1;   /* a key both an object and a prefix's name (x and x/...) keeps both; true duplicates go */
        for (size_t i = 1; i < out->n; i++) {
            if (!strcmp(out->e[i].name, out->e[w - 1].name) && out->e[i].dir == out->e[w - 1].dir) { free(out->e[i].name); continue; }
            out->e[w++] = out->e[i];
        }
        out->n = w;
    }
    if (rc < 0) ferry_remote_listing_free(out);
    return rc;
}
#endif
