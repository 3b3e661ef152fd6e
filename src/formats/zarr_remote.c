/* zarr_remote.c — a Zarr store at a URL (zarr_remote.h). */
#include "formats/zarr_remote.h"
#include "engine/remotectx.h"
#include "sources/list.h"
#include "sources/remote.h"
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#define LIST_DIR_MAX ((size_t)1 << 20)   /* names in one chunk directory's listing; more: each chunk opened */
#define PREFETCH_THREADS 16

typedef struct zdoc { char *url, *text; size_t len; int present; } zdoc;

struct ferry_zremote {
    ferry_ctx *ctx;
    char *root;
    int listable;
    zdoc *docs;
    size_t ndocs, capdocs;
};

int ferry_zremote_is_url(const char *path) { return ferry_remote_is_url(path); }

int ferry_zremote_open(ferry_ctx *ctx, const char *root, ferry_zremote **out) {
    *out = NULL;
    ferry_zremote *z = calloc(1, sizeof *z);
    if (!z || !(z->root = strdup(root))) { free(z); return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", root); }
    size_t l = strlen(z->root);
    while (l > 1 && z->root[l - 1] == '/') z->root[--l] = 0;
    z->ctx = ctx;
    z->listable = ferry_remote_can_list(root);
    *out = z;
    return 0;
}

void ferry_zremote_close(ferry_zremote *z) {
    if (!z) return;
    for (size_t i = 0; i < z->ndocs; i++) { free(z->docs[i].url); free(z->docs[i].text); }
    free(z->docs);
    free(z->root);
    free(z);
}

/* The object at url read whole (at most max bytes): 1, 0 absent, or an error. */
static int fetch(ferry_ctx *ctx, const char *url, size_t max, char **text, size_t *len) {
    ferry_file *f;
    *text = NULL;
    *len = 0;
    int rc = ferry_file_open(ctx, url, FERRY_READ, &f);
    if (rc == -ENOENT) { ferry_clearerr(); return 0; }
    if (rc < 0) return rc;
    int64_t sz = ferry_file_size(f);
    if (sz >= 0 && (uint64_t)sz > max) {
        ferry_file_close(f);
        return ferry_seterr(FERRY_EFORMAT, "%s: metadata of %lld bytes is too large", url, (long long)sz);
    }
    char *buf = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (sz >= 0 && !buf) { ferry_file_close(f); return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", url); }
    int64_t got = sz > 0 ? ferry_pread(f, ferry_host_buf(buf, (size_t)sz), 0, (size_t)sz, FERRY_NO_DIRECT) : sz;
    ferry_file_close(f);
    if (got < 0) { free(buf); return (int)got; }
    buf[got] = 0;
    *text = buf;
    *len = (size_t)got;
    return 1;
}

/* Keep url's document (text owned from here on; present 0: no such object). */
static int doc_put(ferry_zremote *z, const char *url, char *text, size_t len, int present) {
    if (z->ndocs == z->capdocs) {
        size_t cap = z->capdocs ? 2 * z->capdocs : 16;
        zdoc *d = realloc(z->docs, cap * sizeof *d);
        if (!d) { free(text); return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", url); }
        z->docs = d;
        z->capdocs = cap;
    }
    char *u = strdup(url);
    if (!u) { free(text); return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", url); }
    z->docs[z->ndocs++] = (zdoc){u, text, len, present};
    return 0;
}

int ferry_zremote_doc(ferry_zremote *z, const char *url, size_t max, const char **text, size_t *len) {
    for (size_t i = 0; i < z->ndocs; i++)
        if (!strcmp(z->docs[i].url, url)) {
            *text = z->docs[i].text;
            *len = z->docs[i].len;
            return z->docs[i].present;
        }
    char *t;
    size_t n;
    int rc = fetch(z->ctx, url, max, &t, &n);
    if (rc < 0) return rc;
    int present = rc;
    if ((rc = doc_put(z, url, t, n, present)) < 0) return rc;
    *text = t;
    *len = n;
    return present;
}

/* ---- members' documents, many at once --------------------------------------- */
typedef struct docjob {
    ferry_ctx *ctx;
    char **urls;
    char **text;
    size_t *len;
    int *present;
    size_t n, next, max;
    pthread_mutex_t lock;
} docjob;

static void *doc_worker(void *arg) {
    docjob *j = arg;
    for (;;) {
        pthread_mutex_lock(&j->lock);
        size_t i = j->next++;
        pthread_mutex_unlock(&j->lock);
        if (i >= j->n) return NULL;
        int rc = fetch(j->ctx, j->urls[i], j->max, &j->text[i], &j->len[i]);
        j->present[i] = rc;   /* an error is not kept: the parser asks again, and reports it */
        if (rc < 0) ferry_clearerr();
    }
}

void ferry_zremote_prefetch_docs(ferry_zremote *z, const char *dir, char *const *names, int n,
                                 const char *const *docs, int ndocs, size_t max) {
    size_t total = (size_t)(n > 0 ? n : 0) * (size_t)(ndocs > 0 ? ndocs : 0);
    if (total < 2) return;
    docjob j = {z->ctx, calloc(total, sizeof(char *)), calloc(total, sizeof(char *)), calloc(total, sizeof(size_t)),
                calloc(total, sizeof(int)), total, 0, max, PTHREAD_MUTEX_INITIALIZER};
    int ok = j.urls && j.text && j.len && j.present;
    for (size_t k = 0; ok && k < total; k++) {
        const char *nm = names[k / (size_t)ndocs], *doc = docs[k % (size_t)ndocs];
        size_t l = strlen(dir) + strlen(nm) + strlen(doc) + 3;
        if (!(j.urls[k] = malloc(l))) { ok = 0; break; }
        snprintf(j.urls[k], l, "%s/%s/%s", dir, nm, doc);
    }
    if (ok) {
        pthread_t th[PREFETCH_THREADS];
        int nt = total < PREFETCH_THREADS ? (int)total : PREFETCH_THREADS, started = 0;
        for (int i = 0; i < nt; i++)
            if (pthread_create(&th[i], NULL, doc_worker, &j) == 0) started++;
        if (!started) doc_worker(&j);
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        for (size_t k = 0; k < total; k++)
            if (j.present[k] >= 0) {   /* doc_put owns the text from here, kept or freed */
                doc_put(z, j.urls[k], j.text[k], j.len[k], j.present[k]);
                j.text[k] = NULL;
            }
        ferry_clearerr();   /* an unkept document is fetched again when asked */
    }
    for (size_t k = 0; j.urls && k < total; k++) free(j.urls[k]);
    for (size_t k = 0; j.text && k < total; k++) free(j.text[k]);
    free(j.urls); free(j.text); free(j.len); free(j.present);
    pthread_mutex_destroy(&j.lock);
}

int ferry_zremote_children(ferry_zremote *z, const char *dir, size_t max, char ***names, int *n) {
    *names = NULL;
    *n = 0;
    if (!z->listable)
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: a store without consolidated metadata at a web server's URL cannot be "
                            "read (its members are found by listing, which s3:// and gs:// have; write it with "
                            "consolidated metadata, e.g. zarr.consolidate_metadata)", dir);
    size_t l = strlen(dir);
    char *prefix = malloc(l + 2);
    if (!prefix) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    memcpy(prefix, dir, l);
    while (l && prefix[l - 1] == '/') l--;
    prefix[l] = '/';
    prefix[l + 1] = 0;
    ferry_remote_listing L;
    int rc = ferry_remote_list(prefix, ferry_ctx_remote_opts(z->ctx), 1, max, &L);
    free(prefix);
    if (rc < 0) return rc;
    size_t k = 0;
    for (size_t i = 0; i < L.n; i++) k += L.e[i].dir;
    char **v = k ? malloc(k * sizeof *v) : NULL;
    if (k && !v) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < L.n; i++) {
        if (!L.e[i].dir) continue;
        const char *nm = L.e[i].name;
        /* a listing is the server's word: a member "." or ".." (or with a '/')
         * would name objects outside the store once joined to a URL */
        if (!strcmp(nm, ".") || !strcmp(nm, "..") || strchr(nm, '/'))
            rc = ferry_seterr(FERRY_EFORMAT, "%s: the listing names a member \"%s\", which is no key inside the store",
                              dir, nm);
        else { v[(*n)++] = L.e[i].name; L.e[i].name = NULL; }
    }
    ferry_remote_listing_free(&L);
    if (rc < 0) { free(v); *n = 0; return rc; }
    *names = v;
    return 0;
}

int ferry_zremote_probe(ferry_ctx *ctx, const char *url) {
    static const char *names[] = {"zarr.json", ".zmetadata", ".zgroup", ".zarray"};
    size_t l = strlen(url);
    while (l && url[l - 1] == '/') l--;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char *u = malloc(l + strlen(names[i]) + 2);
        if (!u) return 0;
        snprintf(u, l + strlen(names[i]) + 2, "%.*s/%s", (int)l, url, names[i]);
        ferry_file *f;
        int rc = ferry_file_open(ctx, u, FERRY_READ, &f);
        free(u);
        if (rc == 0) { ferry_file_close(f); return 1; }
        if (rc != -ENOENT) break;   /* another answer (403, no server): not a store's, and not worth more requests */
    }
    ferry_clearerr();
    return 0;
}

/* ---- chunk sizes ------------------------------------------------------------- */
typedef struct zsize { char *url; uint64_t size; int present; } zsize;

struct ferry_zchunks {
    char *dir;                  /* the directory listed (URL, no trailing '/'), or NULL */
    int dir_listed;             /* 1: L is its listing; 0: too large or failed: each chunk opened */
    ferry_remote_listing L;
    zsize *pre;                 /* sizes fetched ahead, sorted by url */
    size_t npre;
};

ferry_zchunks *ferry_zchunks_new(void) { return calloc(1, sizeof(ferry_zchunks)); }

void ferry_zchunks_free(ferry_zchunks *c) {
    if (!c) return;
    free(c->dir);
    ferry_remote_listing_free(&c->L);
    for (size_t i = 0; i < c->npre; i++) free(c->pre[i].url);
    free(c->pre);
    free(c);
}

static int cmp_zsize(const void *a, const void *b) { return strcmp(((const zsize *)a)->url, ((const zsize *)b)->url); }

/* Size of one object (one request for its first byte): 1, 0 (404), or an error naming it. */
static int open_size(ferry_ctx *ctx, const char *url, uint64_t *size) {
    int rc = ferry_remote_stat(url, ferry_ctx_remote_opts(ctx), size);
    if (rc == -ENOENT) { ferry_clearerr(); return 0; }
    return rc < 0 ? rc : 1;
}

int ferry_zremote_chunk(ferry_zremote *z, ferry_zchunks *c, const char *url, uint64_t *size) {
    if (c->npre) {
        zsize probe = {(char *)url, 0, 0};
        const zsize *hit = bsearch(&probe, c->pre, c->npre, sizeof *c->pre, cmp_zsize);
        if (hit) { *size = hit->size; return hit->present; }
    }
    const char *slash = strrchr(url, '/');
    if (!z->listable || !slash) return open_size(z->ctx, url, size);
    size_t dl = (size_t)(slash - url);
    if (!c->dir || strncmp(c->dir, url, dl) || c->dir[dl]) {
        free(c->dir);
        ferry_remote_listing_free(&c->L);
        c->dir_listed = 0;
        if (!(c->dir = malloc(dl + 2))) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        memcpy(c->dir, url, dl + 1);   /* with its '/': the listing's prefix */
        c->dir[dl + 1] = 0;
        int rc = ferry_remote_list(c->dir, ferry_ctx_remote_opts(z->ctx), 1, LIST_DIR_MAX, &c->L);
        c->dir[dl] = 0;
        if (rc == FERRY_EINVAL) ferry_clearerr();   /* more names than LIST_DIR_MAX: each chunk is opened */
        else if (rc < 0) return rc;
        else c->dir_listed = 1;
    }
    if (!c->dir_listed) return open_size(z->ctx, url, size);
    const ferry_remote_entry *e = ferry_remote_listing_find(&c->L, slash + 1);
    if (!e) return 0;
    *size = e->size;
    return 1;
}

typedef struct prefetch {
    ferry_ctx *ctx;
    char *const *urls;
    zsize *out;
    size_t n;
    size_t next;
    pthread_mutex_t lock;
    int rc;
    char msg[1024];
} prefetch;

static void *prefetch_worker(void *arg) {
    prefetch *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        size_t i = p->rc < 0 ? p->n : p->next++;
        pthread_mutex_unlock(&p->lock);
        if (i >= p->n) return NULL;
        uint64_t size = 0;
        int rc = open_size(p->ctx, p->urls[i], &size);
        if (rc < 0) {
            pthread_mutex_lock(&p->lock);
            if (p->rc == 0) { p->rc = rc; snprintf(p->msg, sizeof p->msg, "%s", ferry_lasterr()); }
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        p->out[i].size = size;
        p->out[i].present = rc;
    }
}

/* The sizes of urls[0..n) from one listing of everything under dir: 1 done,
 * 0 not (more names than the bound: opened one by one instead), or an error. */
static int sizes_from_listing(ferry_zremote *z, char *const *urls, size_t n, const char *dir, zsize *out) {
    size_t dl = strlen(dir);
    char *prefix = malloc(dl + 2);
    if (!prefix) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    snprintf(prefix, dl + 2, "%s/", dir);
    ferry_remote_listing L;
    int rc = ferry_remote_list(prefix, ferry_ctx_remote_opts(z->ctx), 0, 4 * n + 1000, &L);
    free(prefix);
    if (rc == FERRY_EINVAL) { ferry_clearerr(); return 0; }
    if (rc < 0) return rc;
    for (size_t i = 0; i < n; i++) {
        const ferry_remote_entry *e = strncmp(urls[i], dir, dl) || urls[i][dl] != '/' ? NULL
                                      : ferry_remote_listing_find(&L, urls[i] + dl + 1);
        out[i].present = e != NULL;
        out[i].size = e ? e->size : 0;
    }
    ferry_remote_listing_free(&L);
    return 1;
}

int ferry_zremote_prefetch(ferry_zremote *z, ferry_zchunks *c, char *const *urls, size_t n, const char *dir,
                           size_t ndirs, uint64_t total) {
    if (n == 0 || (z->listable && ndirs < 4)) return 0;   /* each directory's listing answers */
    zsize *out = calloc(n, sizeof *out);
    if (!out) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    prefetch p = {z->ctx, urls, out, n, n, PTHREAD_MUTEX_INITIALIZER, 0, ""};
    int listed = z->listable && (uint64_t)n >= total / 4 ? sizes_from_listing(z, urls, n, dir, out) : 0;
    if (listed < 0) { free(out); return listed; }
    if (!listed) p.next = 0;   /* else nothing left for the threads */
    pthread_t th[PREFETCH_THREADS];
    int nt = listed ? 0 : n < PREFETCH_THREADS ? (int)n : PREFETCH_THREADS, started = 0;
    for (int i = 0; i < nt; i++)
        if (pthread_create(&th[i], NULL, prefetch_worker, &p) == 0) started++;
    if (!started && !listed) prefetch_worker(&p);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&p.lock);
    int rc = p.rc;
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (!(out[i].url = strdup(urls[i]))) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    if (p.rc < 0) ferry_seterr(p.rc, "%s", p.msg);
    if (rc < 0) {
        for (size_t i = 0; i < n; i++) free(out[i].url);
        free(out);
        return rc;
    }
    for (size_t i = 0; i < c->npre; i++) free(c->pre[i].url);
    free(c->pre);
    qsort(out, n, sizeof *out, cmp_zsize);
    c->pre = out;
    c->npre = n;
    return 0;
}
