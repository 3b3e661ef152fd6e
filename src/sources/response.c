/* response.c — reading HTTP response headers and error bodies (response.h). */
#include "common.h"
#include "sources/response.h"
#include <ctype.h>
#include <strings.h>

static int hname(const char *line, size_t n, const char *name, const char **val) {
    size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) || line[k] != ':') return 0;
    const char *v = line + k + 1;
    while (v < line + n && (*v == ' ' || *v == '\t')) v++;
    *val = v;
    return 1;
}

static void copy_val(char *dst, size_t cap, const char *v, const char *end) {
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t')) end--;
    size_t n = (size_t)(end - v) < cap - 1 ? (size_t)(end - v) : cap - 1;
    memcpy(dst, v, n);
    dst[n] = 0;
}

/* A decimal number at *p, advancing *p; -1 if none. No sign ("-1" is no
 * byte position) and at most 18 digits (below 10^18: no overflow). */
static int64_t num(const char **p) {
    const char *s = *p;
    int64_t v = 0;
    int d = 0;
    while (isdigit((unsigned char)*s) && d < 18) { v = v * 10 + (*s++ - '0'); d++; }
    if (!d || isdigit((unsigned char)*s)) return -1;
    *p = s;
    return v;
}

int ferry_http_resp_line(ferry_http_resp *r, const char *p, size_t n) {
    const char *v, *end = p + n;
    if (n > 5 && !strncmp(p, "HTTP/", 5)) {   /* a new response (after a redirect or a 100) */
        memset(r, 0, sizeof *r);
        const char *s = memchr(p, ' ', n);
        if (s && s + 4 <= end && isdigit((unsigned char)s[1]) && isdigit((unsigned char)s[2]) && isdigit((unsigned char)s[3]))
            r->status = (s[1] - '0') * 100 + (s[2] - '0') * 10 + (s[3] - '0');
        return 1;
    }
    char tmp[128];
    if (hname(p, n, "content-range", &v)) {
        copy_val(tmp, sizeof tmp, v, end);
        const char *q = tmp;
        if (strncasecmp(q, "bytes ", 6)) return 0;
        q += 6;
        if (*q == '*') {
            q++;
            int64_t t = *q == '/' ? (q++, num(&q)) : -1;
            if (t >= 0 && !*q) { r->have_crange = 2; r->cr_total = (uint64_t)t; }
            return 0;
        }
        int64_t a = num(&q), b = *q == '-' ? (q++, num(&q)) : -1, t = *q == '/' ? (q++, num(&q)) : -1;
        if (a >= 0 && b >= a && t > b && !*q) {
            r->have_crange = 1;
            r->cr_start = (uint64_t)a;
            r->cr_end = (uint64_t)b;
            r->cr_total = (uint64_t)t;
        }
    } else if (hname(p, n, "content-length", &v)) {
        copy_val(tmp, sizeof tmp, v, end);
        const char *q = tmp;
        int64_t c = num(&q);
        if (c >= 0 && !*q) { r->clen = (uint64_t)c; r->have_clen = 1; }
    } else if (hname(p, n, "etag", &v)) {
        copy_val(r->etag, sizeof r->etag, v, end);
    } else if (hname(p, n, "last-modified", &v)) {
        copy_val(r->lastmod, sizeof r->lastmod, v, end);
    }
    return 0;
}

static const char *find(const char *b, size_t n, const char *w) {
    size_t k = strlen(w);
    for (size_t i = 0; i + k <= n; i++) if (!memcmp(b + i, w, k)) return b + i;
    return NULL;
}

static size_t printable(char *out, size_t cap, const char *s, size_t n, size_t o) {
    for (size_t i = 0; i < n && o + 1 < cap; i++) out[o++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : ' ';
    return o;
}

void ferry_http_server_message(const char *b, size_t n, char *out, size_t cap) {
    if (!cap) return;
    out[0] = 0;
    if (cap > 201) cap = 201;
    const char *c = find(b, n, "<Code>"), *ce = c ? find(c, n - (size_t)(c - b), "</Code>") : NULL;
    size_t o = 0;
    if (c && ce) {
        const char *m = find(b, n, "<Message>"), *me = m ? find(m, n - (size_t)(m - b), "</Message>") : NULL;
        o = printable(out, cap, c + 6, (size_t)(ce - c - 6), 0);
        if (m && me && o + 3 < cap) {
            out[o++] = ':';
            out[o++] = ' ';
            o = printable(out, cap, m + 9, (size_t)(me - m - 9), o);
        }
    } else {
        o = printable(out, cap, b, n, 0);
    }
    while (o && out[o - 1] == ' ') o--;
    out[o] = 0;
}

const char *ferry_http_reason(long s) {
    switch (s) {
    case 301: return "Moved Permanently"; case 307: return "Temporary Redirect";
    case 400: return "Bad Request"; case 401: return "Unauthorized"; case 403: return "Forbidden";
    case 404: return "Not Found"; case 408: return "Request Timeout"; case 412: return "Precondition Failed";
    case 416: return "Range Not Satisfiable"; case 429: return "Too Many Requests";
    case 500: return "Internal Server Error"; case 502: return "Bad Gateway";
    case 503: return "Service Unavailable"; case 504: return "Gateway Timeout";
    default: return "";
    }
}
