/* refstargets.c — the files a reference set points into (refstargets.h). */
#include "formats/refstargets.h"
#include "formats/inside.h"
#include "sources/url.h"
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

static char *xstrdup(const char *s) { return s ? strdup(s) : NULL; }

int ferry_refs_targets_init(ferry_refs_targets *T, const char *dir, const char *rootdir, int allow_outside) {
    memset(T, 0, sizeof *T);
    T->dir = dir;
    T->rootdir = rootdir;
    T->allow_outside = allow_outside;
    if (pthread_mutex_init(&T->lock, NULL) != 0) return FERRY_ENOMEM;
    T->lock_ok = 1;
    return 0;
}

void ferry_refs_targets_free(ferry_refs_targets *T) {
    for (size_t i = 0; i < T->n; i++) {
        free(T->t[i].spelled);
        free(T->t[i].path);
        free(T->t[i].why);
    }
    free(T->t);
    free(T->hash);
    if (T->lock_ok) pthread_mutex_destroy(&T->lock);
    memset(T, 0, sizeof *T);
}

static size_t str_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (size_t)(h ^ (h >> 29));
}

int ferry_refs_target_add(ferry_refs_targets *T, const char *file, const char *spelled, uint32_t *out) {
    if (2 * (T->n + 1) > T->mask + 1 || !T->hash) {
        size_t cap = T->hash ? 2 * (T->mask + 1) : 64;
        size_t *h = malloc(cap * sizeof *h);
        if (!h) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
        for (size_t i = 0; i < cap; i++) h[i] = SIZE_MAX;
        for (size_t t = 0; t < T->n; t++) {
            size_t k = str_hash(T->t[t].spelled) & (cap - 1);
            while (h[k] != SIZE_MAX) k = (k + 1) & (cap - 1);
            h[k] = t;
        }
        free(T->hash);
        T->hash = h;
        T->mask = cap - 1;
    }
    size_t k = str_hash(spelled) & T->mask;
    for (; T->hash[k] != SIZE_MAX; k = (k + 1) & T->mask)
        if (!strcmp(T->t[T->hash[k]].spelled, spelled)) { *out = (uint32_t)T->hash[k]; return 0; }
    if (T->n >= UINT32_MAX) return ferry_seterr(FERRY_EFORMAT, "%s: too many target files", file);
    if (T->n == T->cap) {
        size_t cap = T->cap ? 2 * T->cap : 16;
        ferry_refs_target *t = realloc(T->t, cap * sizeof *t);
        if (!t) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
        T->t = t;
        T->cap = cap;
    }
    ferry_refs_target *t = &T->t[T->n];
    memset(t, 0, sizeof *t);
    if (!(t->spelled = strdup(spelled))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
    T->hash[k] = T->n;
    *out = (uint32_t)T->n++;
    return 0;
}

static int remote_scheme(ferry_url_scheme s) {
    return s == FERRY_URL_HTTP || s == FERRY_URL_HTTPS || s == FERRY_URL_S3 || s == FERRY_URL_GS;
}

/* Resolve and look at t: its path and size, or why not. Under r->lock. */
static int target_check(ferry_refs_targets *r, ferry_ctx *ctx, ferry_refs_target *t) {
    if (t->state) return t->state;
    int rc = 0;
    ferry_url_scheme sch = ferry_url_scheme_of(t->spelled);
    char *local = NULL;
    if (sch == FERRY_URL_FILE) {
        ferry_url u;
        rc = ferry_url_parse(t->spelled, NULL, &u);
        if (rc >= 0 && !(local = xstrdup(u.key))) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
        ferry_url_free(&u);
        if (rc >= 0 && !r->rootdir && !r->allow_outside)   /* a remote set naming a local file */
            rc = ferry_seterr(-EACCES, "a local file named by a remote reference set is refused unless allowed "
                              "(allow_outside)");
    } else if (sch == FERRY_URL_NONE) {
        if (t->spelled[0] == '/') local = xstrdup(t->spelled);
        else if ((local = malloc(strlen(r->dir) + strlen(t->spelled) + 2)))
            sprintf(local, "%s/%s", r->dir, t->spelled);
        if (!local) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
        else if (!r->rootdir && t->spelled[0] == '/' && !r->allow_outside)   /* a remote set naming a local file */
            rc = ferry_seterr(-EACCES, "a local file named by a remote reference set is refused unless allowed "
                              "(allow_outside)");
        else if (!r->rootdir && t->spelled[0] != '/') {   /* relative to a remote set: a URL */
            free(t->path);
            t->path = local;
            local = NULL;
            sch = FERRY_URL_HTTP;
        }
    } else if (!remote_scheme(sch)) {
        rc = ferry_seterr(FERRY_EUNSUPPORTED, "its scheme is not one ferry reads (http, https, s3, gs, file)");
    } else if (!(t->path = xstrdup(t->spelled))) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    if (rc >= 0 && local) {
        t->path = local;
        local = NULL;
        if (!r->allow_outside && r->rootdir) {
            rc = ferry_path_inside(r->rootdir, t->path, "reference set's directory");
            if (rc < 0)
                ferry_seterr(rc, "%s lies outside the reference set's directory %s (pass allow_outside to read it)",
                             t->path, r->rootdir);
            else rc = 0;
        }
        struct stat st;
        if (rc >= 0 && stat(t->path, &st) != 0) rc = ferry_seterr(-errno, "%s: %s", t->path, strerror(errno));
        else if (rc >= 0 && !S_ISREG(st.st_mode)) rc = ferry_seterr(FERRY_EINVAL, "%s is not a regular file", t->path);
        else if (rc >= 0) t->size = (uint64_t)st.st_size;
    } else if (rc >= 0) {
        ferry_file *f;
        rc = ferry_file_open(ctx, t->path, FERRY_READ, &f);
        if (rc >= 0) {
            int64_t sz = ferry_file_size(f);
            ferry_file_close(f);
            if (sz < 0) rc = (int)sz;
            else t->size = (uint64_t)sz;
        }
    }
    free(local);
    if (rc < 0) {
        t->why = xstrdup(ferry_lasterr());
        return t->state = rc;
    }
    return t->state = 1;
}

int ferry_refs_target_get(ferry_refs_targets *T, ferry_ctx *ctx, uint32_t i, const ferry_refs_target **out) {
    ferry_refs_target *t = &T->t[i];
    pthread_mutex_lock(&T->lock);
    int st = target_check(T, ctx, t);
    pthread_mutex_unlock(&T->lock);
    *out = t;
    return st;
}
