/* glob.c — the objects a URL glob names (ferry_url_glob): the bucket listed
 * from the pattern's literal directory, each key matched part by part. */
#include "common.h"
#include "sources/glob.h"
#include "sources/list.h"
#include "sources/url.h"
#include <fnmatch.h>
#include <stdlib.h>

#define GLOB_MAX_KEYS ((size_t)10000000)

/* key matches pat, both '/'-separated; "**" as a whole part: any number of parts. */
static int match_parts(const char *pat, const char *key) {
    const char *ps = strchr(pat, '/'), *ks = strchr(key, '/');
    size_t pl = ps ? (size_t)(ps - pat) : strlen(pat);
    if (pl == 2 && pat[0] == '*' && pat[1] == '*') {
        if (!ps) return 1;                                 /* trailing **: everything below */
        for (const char *k = key;; k = strchr(k, '/') + 1) {
            if (match_parts(ps + 1, k)) return 1;
            if (!strchr(k, '/')) return 0;
        }
    }
    char p[1024], k[1024];
    size_t kl = ks ? (size_t)(ks - key) : strlen(key);
    if (pl >= sizeof p || kl >= sizeof k) return 0;
    memcpy(p, pat, pl); p[pl] = 0;
    memcpy(k, key, kl); k[kl] = 0;
    if (fnmatch(p, k, 0) != 0) return 0;
    if (!ps || !ks) return !ps && !ks;
    return match_parts(ps + 1, ks + 1);
}

int ferry_remote_glob(const char *pattern, const ferry_remote_opts *o, char **urls, size_t *n) {
    *urls = NULL;
    *n = 0;
    if (!ferry_remote_can_list(pattern))
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: globs expand over s3:// and gs:// objects (their buckets are "
                            "listed); a web server's URLs are named one by one", pattern ? pattern : "(null)");
    const char *b = strstr(pattern, "://") + 3, *slash = strchr(b, '/');
    if (!slash || slash == b) return ferry_seterr(FERRY_EINVAL, "%s: no bucket", pattern);
    const char *key = slash + 1;
    size_t lit = strcspn(key, "*?[");
    size_t dir = lit;                      /* list from the last '/' before the first wildcard */
    while (dir && key[dir - 1] != '/') dir--;
    int recursive = strchr(key + dir, '/') != NULL;
    size_t head = (size_t)(key - pattern);
    char *lurl = malloc(head + dir + 1);
    if (!lurl) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    memcpy(lurl, pattern, head + dir);
    lurl[head + dir] = 0;
    ferry_remote_listing L;
    int rc = ferry_remote_list(lurl, o, !recursive, GLOB_MAX_KEYS, &L);
    free(lurl);
    if (rc < 0) return rc;
    size_t total = 0, count = 0;
    for (size_t i = 0; i < L.n; i++) {
        /* a non-match is marked as a folder (any size, UINT64_MAX too, is a server's to send) */
        if (L.e[i].dir || !match_parts(key + dir, L.e[i].name)) { L.e[i].dir = 1; continue; }
        total += head + dir + strlen(L.e[i].name) + 1;
        count++;
    }
    char *out = count ? malloc(total) : NULL, *w = out;
    if (count && !out) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < L.n; i++) {
        if (L.e[i].dir) continue;
        memcpy(w, pattern, head + dir);
        w += head + dir;
        size_t nl = strlen(L.e[i].name) + 1;
        memcpy(w, L.e[i].name, nl);
        w += nl;
    }
    ferry_remote_listing_free(&L);
    if (rc < 0) { free(out); return rc; }
    *urls = out;
    *n = count;
    return 0;
}
