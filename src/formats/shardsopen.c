/* shardsopen.c — ferry_shards_open: expand the paths' globs, tell the
 * format (tar, MDS, folder, files) and hand each file to its indexer (tar.c,
 * mds.c, imagefolder.c), which fill the index through shards.c. Above the
 * indexers and the index, so neither calls up.
 *
 * URLs: an s3:// or gs:// glob is expanded by listing the bucket
 * (ferry_url_glob, with the context's remote options); http(s):// URLs are
 * taken as written ('?' starts their query). The format of a URL is told
 * without stat: ending in .tar, tar; a last part without a dot (or a final
 * '/'), a directory: MDS when it holds index.json (one request), else a
 * folder when it can be listed; anything else, a file. */
#include "formats/shards.h"
#include "engine/remotectx.h"
#include "sources/list.h"
#include "sources/remote.h"
#include "sources/url.h"
#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <sys/stat.h>

static int has_glob(const char *p) {
    ferry_url_scheme k = ferry_url_scheme_of(p);
    if (k == FERRY_URL_HTTP || k == FERRY_URL_HTTPS) return 0;
    return strpbrk(p, "*?[") != NULL;
}
static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* The format of a URL: see the top of the file. */
static int detect_url(ferry_ctx *ctx, const char *url, const char **fmt) {
    size_t n = strlen(url);
    /* an https URL's query (a presigned URL's signature) is not part of the name */
    const char *q = strncmp(url, "http", 4) ? NULL : strpbrk(url, "?#");
    if (q && q - url >= 4 && !strncmp(q - 4, ".tar", 4)) { *fmt = "tar"; return 0; }
    if (q) n = (size_t)(q - url);
    if (ends_with(url, ".tar")) { *fmt = "tar"; return 0; }
    const char *last = url + n;
    while (last > url && last[-1] == '/') last--;
    const char *seg = last;
    while (seg > url && seg[-1] != '/') seg--;
    int dirlike = last < url + n || !memchr(seg, '.', (size_t)(last - seg));
    if (!dirlike) { *fmt = "files"; return 0; }
    char idx[4096];
    if ((size_t)snprintf(idx, sizeof idx, "%.*s/index.json", (int)(last - url), url) >= sizeof idx)
        return ferry_seterr(FERRY_EINVAL, "%s: URL too long", url);
    uint64_t size;
    int rc = ferry_remote_stat(idx, ferry_ctx_remote_opts(ctx), &size);
    if (rc == 0) { *fmt = "mds"; return 0; }
    if (rc != -ENOENT) return rc;
    ferry_clearerr();
    if (ferry_remote_can_list(url)) { *fmt = "folder"; return 0; }
    if (last < url + n)   /* ends in '/': a directory, and a web server's cannot be listed */
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: no index.json there (not an MDS directory), and an https server "
                            "cannot be listed: name the .tar shards or the image files", url);
    *fmt = "files";
    return 0;
}

static int detect(ferry_ctx *ctx, const char *path, const char **fmt) {
    if (ferry_remote_is_url(path)) return detect_url(ctx, path, fmt);
    struct stat st;
    if (stat(path, &st) != 0) return ferry_seterr(-errno, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        char idx[4096];
        snprintf(idx, sizeof idx, "%s/index.json", path);
        *fmt = stat(idx, &st) == 0 ? "mds" : "folder";
    } else {
        *fmt = ends_with(path, ".tar") ? "tar" : "files";
    }
    return 0;
}

/* ---- tar shards at URLs, indexed side by side ------------------------------
 * Indexing a remote shard is a round trip per window; over many shards one
 * after another they add up, so each shard is indexed into a set of its own
 * on one of up to PAR_THREADS threads, and the sets are merged in the order
 * of the paths (a sample never spans two shards: the merged set equals the one
 * indexed in turn, and the first damaged shard in that order is the error). */
#define PAR_THREADS 16

typedef struct par_run {
    ferry_ctx *ctx;
    char **paths;
    ferry_shards **subs;
} par_run;

static int par_index(void *arg, size_t i) {
    par_run *pr = arg;
    ferry_shards *sub = pr->subs[i] = calloc(1, sizeof *sub);
    if (!sub) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    sub->ctx = pr->ctx;
    sub->format = "tar";
    return ferry_tar_index(sub, pr->paths[i]);
}

static int tar_index_parallel(ferry_shards *s, char **paths, size_t n) {
    par_run pr = {.ctx = s->ctx, .paths = paths, .subs = calloc(n, sizeof *pr.subs)};
    if (!pr.subs) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    int rc = ferry_shards_each(n, PAR_THREADS, par_index, &pr);
    for (size_t i = 0; i < n; i++) {
        if (rc >= 0) rc = ferry_shards_merge(s, pr.subs[i]);
        ferry_shards_close(pr.subs[i]);
    }
    free(pr.subs);
    return rc;
}

static int open_one_format(ferry_shards *s, const char *fmt, char **paths, size_t n) {
    int rc = 0;
    if (!strcmp(fmt, "files")) return ferry_files_index(s, (const char *const *)paths, n);
    size_t urls = 0;
    for (size_t i = 0; i < n; i++) urls += (size_t)ferry_remote_is_url(paths[i]);
    if (!strcmp(fmt, "tar") && n > 1 && urls == n) return tar_index_parallel(s, paths, n);
    for (size_t i = 0; i < n && rc >= 0; i++) {
        if (!strcmp(fmt, "tar")) rc = ferry_tar_index(s, paths[i]);
        else if (!strcmp(fmt, "mds")) rc = ferry_mds_index(s, paths[i]);
        else rc = ferry_folder_index(s, paths[i]);
    }
    return rc;
}

int ferry_shards_open(ferry_ctx *ctx, const char *const *paths, size_t n, const char *format, ferry_shards **out) {
    if (!out) return ferry_seterr(FERRY_EINVAL, "ferry_shards_open: out is NULL");
    *out = NULL;
    if (!ctx || (!paths && n)) return ferry_seterr(FERRY_EINVAL, "ferry_shards_open: NULL argument");
    if (n == 0) return ferry_seterr(FERRY_EINVAL, "ferry_shards_open: no paths");
    static const char *const formats[] = {"tar", "mds", "folder", "files"};
    const char *fmt = NULL;
    if (format) {
        for (size_t i = 0; i < 4; i++)
            if (!strcmp(format, formats[i])) fmt = formats[i];
        if (!fmt) return ferry_seterr(FERRY_EINVAL, "shard format \"%s\": not tar, mds, folder or files", format);
    }
    /* expand the globs */
    char **list = NULL;
    size_t nlist = 0, cap = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc >= 0; i++) {
        if (!paths[i]) { rc = ferry_seterr(FERRY_EINVAL, "ferry_shards_open: path %zu is NULL", i); break; }
        glob_t g = {0};
        int expanded = has_glob(paths[i]), url = ferry_remote_is_url(paths[i]);
        char *urls = NULL;   /* a URL glob's matches, NUL-separated, in bytewise order */
        size_t nurls = 0;
        if (expanded && url) {
            if ((rc = ferry_url_glob(ctx, paths[i], &urls, &nurls)) < 0) break;
            if (nurls == 0) { rc = ferry_seterr(-ENOENT, "%s: no object matches", paths[i]); break; }
        } else if (expanded) {
            int gr = glob(paths[i], 0, NULL, &g);
            if (gr == GLOB_NOMATCH) { rc = ferry_seterr(-ENOENT, "%s: no file matches", paths[i]); break; }
            if (gr != 0) { globfree(&g); rc = ferry_seterr(-EIO, "%s: glob failed", paths[i]); break; }
        }
        size_t k = !expanded ? 1 : url ? nurls : g.gl_pathc;
        const char *u = urls;
        if ((rc = ferry_shards_grow((void **)&list, &cap, nlist + k, sizeof *list)) == 0)
            for (size_t j = 0; j < k; j++) {
                const char *p = !expanded ? paths[i] : url ? u : g.gl_pathv[j];
                if (url && expanded) u += strlen(u) + 1;
                if (!(list[nlist] = strdup(p))) { rc = ferry_seterr(FERRY_ENOMEM, "out of memory"); break; }
                nlist++;
            }
        free(urls);
        if (expanded && !url) globfree(&g);
    }
    if (rc >= 0 && !fmt) rc = detect(ctx, list[0], &fmt);
    ferry_shards *s = rc >= 0 ? calloc(1, sizeof *s) : NULL;
    if (rc >= 0 && !s) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    if (s) {
        s->ctx = ctx;
        s->format = fmt;
        rc = open_one_format(s, fmt, list, nlist);
    }
    for (size_t i = 0; i < nlist; i++) free(list[i]);
    free(list);
    if (rc < 0) { ferry_shards_close(s); return rc; }
    *out = s;
    return 0;
}
