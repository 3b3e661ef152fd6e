/* fuzz_url.c — what ferry reads of strings it is given and of bytes a
 * server sends: the first byte picks the parser. 0: a URL (ferry_url_parse,
 * with AWS's default endpoint and with a custom one), whose request URL must
 * hold no space or control byte; 1: response header lines, split at '\n',
 * whose Content-Range must be ordered (start <= end < total); 2: an error
 * body's message, which must be printable and bounded. */
#include "fuzz.h"
#include "sources/response.h"
#include "sources/url.h"

static void check_url(const ferry_url *u) {
    if (!u->url) return;
    for (const char *p = u->url; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == ' ') abort();
    if (u->scheme == FERRY_URL_S3 || u->scheme == FERRY_URL_GS)
        if (!u->host || !u->path || u->path[0] != '/' || strchr(u->host, '/')) abort();
}

static int fuzz_url(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0] % 3;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    if (mode == 0) {
        char *z = malloc(n + 1);
        if (!z) return 0;
        memcpy(z, s, n);
        z[n] = 0;
        ferry_url_env envs[2] = {{NULL, "eu-west-1", 0}, {"http://127.0.0.1:9000/base", NULL, 2}};
        for (int i = 0; i < 2; i++) {
            ferry_url u;
            if (ferry_url_parse(z, &envs[i], &u) == 0) check_url(&u);
            ferry_url_free(&u);
        }
        free(z);
    } else if (mode == 1) {
        ferry_http_resp r;
        memset(&r, 0, sizeof r);
        for (size_t a = 0; a < n;) {
            const char *nl = memchr(s + a, '\n', n - a);
            size_t len = nl ? (size_t)(nl - (s + a)) + 1 : n - a;
            (void)ferry_http_resp_line(&r, s + a, len);
            if (r.have_crange == 1 && !(r.cr_start <= r.cr_end && r.cr_end < r.cr_total)) abort();
            if (r.etag[sizeof r.etag - 1] || r.lastmod[sizeof r.lastmod - 1]) abort();
            a += len;
        }
    } else {
        char out[256];
        memset(out, 'x', sizeof out);
        ferry_http_server_message(s, n, out, sizeof out);
        size_t k = strlen(out);
        if (k > 200) abort();
        for (size_t i = 0; i < k; i++) if (out[i] < 0x20 || out[i] >= 0x7f) abort();
    }
    return 0;
}
FERRY_FUZZ_TARGET(url, fuzz_url)
