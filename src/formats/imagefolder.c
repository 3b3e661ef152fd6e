/* imagefolder.c — folders of image files, and flat lists of files.
 *
 * "folder" follows torchvision.datasets.ImageFolder (datasets/folder.py):
 * classes are the sub-folders of the root (symlinks followed), sorted by name,
 * class i the i-th; a class's samples are the files under its folder whose
 * lowercased names end with one of IMG_EXTENSIONS, visited as
 * sorted(os.walk(class_dir, followlinks=True)) visits them: directories in
 * sorted order of their path, files sorted within each. Names compare as
 * Python compares str, which for UTF-8 bytes is strcmp's order. A class with
 * no image is an error, as torchvision's default (allow_empty=False) makes it.
 * Each file is a sample keyed by its path under the root ("cat/001.jpg"),
 * with one member named by its lowercased extension ("jpg").
 *
 * "files" is a list of paths, each a sample keyed by its path less its
 * extension (from the last dot of the basename), one member named by the
 * lowercased extension ("" without one).
 *
 * Both over URLs: a folder at s3://bucket/train/ is the bucket's listing
 * under that prefix (classes its first-level sub-prefixes, the samples in
 * the order os.walk gives the same tree locally, sizes from the listing); a
 * file at a URL is sized by one request for its first byte (16 at a time).
 * Each such member is a whole object, opened when read (shards.c checks the
 * size indexed). */
#include "formats/shards.h"
#include "engine/remotectx.h"
#include "sources/list.h"
#include "sources/remote.h"
#include <dirent.h>
#include <strings.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

#define FOLDER_MAX_DEPTH 32     /* os.walk with followlinks=True loops on a link to a parent: bound it */

static const char *const img_ext[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};

static int is_image(const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof img_ext / sizeof img_ext[0]; i++) {
        size_t e = strlen(img_ext[i]);
        if (n >= e && !strcasecmp(name + n - e, img_ext[i])) return 1;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

typedef struct strlist {
    char **v;
    size_t n, cap;
} strlist;

static int push(strlist *l, char *s) {
    if (!s) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    if (l->n == l->cap) {
        size_t c = l->cap ? 2 * l->cap : 16;
        char **v = realloc(l->v, c * sizeof *v);
        if (!v) { free(s); return ferry_seterr(FERRY_ENOMEM, "out of memory"); }
        l->v = v;
        l->cap = c;
    }
    l->v[l->n++] = s;
    return 0;
}

static void clear(strlist *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    *l = (strlist){0};
}

static char *join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 2);
    if (p) { memcpy(p, a, la); p[la] = '/'; memcpy(p + la + 1, b, lb + 1); }
    return p;
}

/* The entries of dir: sub-directories (symlinks followed) into dirs, others into files. */
static int list_dir(const char *dir, strlist *dirs, strlist *files) {
    DIR *d = opendir(dir);
    if (!d) return ferry_seterr(-errno, "%s: %s", dir, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while (rc >= 0 && (errno = 0, e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = join(dir, e->d_name);
        struct stat st;
        int isdir = p && stat(p, &st) == 0 && S_ISDIR(st.st_mode);   /* a dangling link: a file, as os.walk lists it */
        free(p);
        if (isdir) rc = dirs ? push(dirs, strdup(e->d_name)) : 0;
        else if (files) rc = push(files, strdup(e->d_name));
    }
    if (rc >= 0 && errno) rc = ferry_seterr(-errno, "%s: %s", dir, strerror(errno));
    closedir(d);
    return rc;
}

/* Every directory under `dir` (itself included), depth first; sorted later. */
static int walk(const char *dir, int depth, strlist *out) {
    if (depth > FOLDER_MAX_DEPTH)
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: folders nested more than %d deep (a symlink loop?)", dir,
                            FOLDER_MAX_DEPTH);
    int rc = push(out, strdup(dir));
    strlist sub = {0};
    if (rc >= 0) rc = list_dir(dir, &sub, NULL);
    for (size_t i = 0; rc >= 0 && i < sub.n; i++) {
        char *p = join(dir, sub.v[i]);
        rc = p ? walk(p, depth + 1, out) : ferry_seterr(FERRY_ENOMEM, "out of memory");
        free(p);
    }
    clear(&sub);
    return rc;
}

/* size: the file's bytes, or UINT64_MAX to learn them (stat, or one request at a URL). */
static int add_file_sample(ferry_shards *s, const char *path, const char *key, size_t klen, const char *ext,
                           int32_t label, uint64_t size) {
    int rc;
    if (size == UINT64_MAX && ferry_remote_is_url(path)) {
        if ((rc = ferry_remote_stat(path, ferry_ctx_remote_opts(s->ctx), &size)) < 0) return rc;
    } else if (size == UINT64_MAX) {
        struct stat st;
        if (stat(path, &st) != 0) return ferry_seterr(-errno, "%s: %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode)) return ferry_seterr(FERRY_EINVAL, "%s: not a regular file", path);
        size = (uint64_t)st.st_size;
    }
    char lower[64];
    size_t n = strlen(ext);
    if (n >= sizeof lower) return ferry_seterr(FERRY_EUNSUPPORTED, "%s: extension longer than %zu bytes", path, sizeof lower - 1);
    for (size_t i = 0; i <= n; i++) lower[i] = (ext[i] >= 'A' && ext[i] <= 'Z') ? (char)(ext[i] - 'A' + 'a') : ext[i];
    uint32_t file, name;
    if ((rc = ferry_shards_add_file(s, path, size, &file)) < 0 ||
        (rc = ferry_shards_name(s, lower, n, NULL, &name)) < 0 ||
        (rc = ferry_shards_begin_sample(s, key, klen, label)) < 0)
        return rc;
    return ferry_shards_add_member(s, name, file, 0, size, 0);
}

static int class_samples(ferry_shards *s, const char *root, const char *cls, int32_t label) {
    char *top = join(root, cls);
    strlist dirs = {0}, files = {0};
    int rc = top ? walk(top, 0, &dirs) : ferry_seterr(FERRY_ENOMEM, "out of memory");
    if (rc >= 0) qsort(dirs.v, dirs.n, sizeof *dirs.v, cmp_str);
    size_t before = s->nsamples, rl = strlen(root) + 1;
    for (size_t i = 0; rc >= 0 && i < dirs.n; i++) {
        clear(&files);
        if ((rc = list_dir(dirs.v[i], NULL, &files)) < 0) break;
        qsort(files.v, files.n, sizeof *files.v, cmp_str);
        for (size_t j = 0; rc >= 0 && j < files.n; j++) {
            if (!is_image(files.v[j])) continue;
            char *p = join(dirs.v[i], files.v[j]);
            const char *dot = strrchr(files.v[j], '.');
            rc = p ? add_file_sample(s, p, p + rl, strlen(p + rl), dot + 1, label, UINT64_MAX)
                   : ferry_seterr(FERRY_ENOMEM, "out of memory");
            free(p);
        }
    }
    if (rc >= 0 && s->nsamples == before)
        rc = ferry_seterr(FERRY_ENOTFOUND, "%s: class \"%s\" has no image file (extensions .jpg .jpeg .png .ppm .bmp"
                          " .pgm .tif .tiff .webp)", top ? top : root, cls);
    clear(&files);
    clear(&dirs);
    free(top);
    return rc;
}

/* ---- a folder at a URL: one listing ---------------------------------------- */
typedef struct url_entry {
    const char *name;      /* the key under the root: "cat/sub/001.jpg" */
    size_t cls, dir;       /* lengths of its class ("cat") and its directory ("cat/sub", no final '/') */
    uint64_t size;
} url_entry;

/* os.walk's order of the same tree (imagefolder's local walk): class, then
 * directory path (compared as strcmp compares "root/cat/sub"), then file name. */
static int cmp_entry(const void *pa, const void *pb) {
    const url_entry *a = pa, *b = pb;
    int c = strncmp(a->name, b->name, FERRY_MIN(a->cls, b->cls));
    if (c || a->cls != b->cls) return c ? c : (a->cls < b->cls ? -1 : 1);
    c = strncmp(a->name, b->name, FERRY_MIN(a->dir, b->dir));
    if (c || a->dir != b->dir) return c ? c : (a->dir < b->dir ? -1 : 1);
    return strcmp(a->name + a->dir + 1, b->name + b->dir + 1);
}

#define FOLDER_URL_MAX_KEYS ((size_t)10000000)

static int folder_index_url(ferry_shards *s, const char *dir) {
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dl--;
    char *root = malloc(dl + 2);
    if (!root) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    memcpy(root, dir, dl);
    memcpy(root + dl, "/", 2);   /* the prefix listed: "s3://b/train/" */
    ferry_remote_listing L;
    int rc = ferry_remote_list(root, ferry_ctx_remote_opts(s->ctx), 0, FOLDER_URL_MAX_KEYS, &L);
    url_entry *e = rc >= 0 ? calloc(L.n ? L.n : 1, sizeof *e) : NULL;
    size_t n = 0;
    if (rc >= 0 && !e) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    for (size_t i = 0; rc >= 0 && i < L.n; i++) {
        const char *nm = L.e[i].name, *slash = strchr(nm, '/'), *last = strrchr(nm, '/');
        if (L.e[i].dir || !slash || slash == nm || !last[1] || !is_image(last + 1)) continue;   /* root files, markers */
        e[n++] = (url_entry){nm, (size_t)(slash - nm), (size_t)(last - nm), L.e[i].size};
    }
    if (rc >= 0) qsort(e, n, sizeof *e, cmp_entry);
    /* the classes: every first-level sub-prefix, images or not (an empty one is an error, as locally) */
    strlist cls = {0};
    for (size_t i = 0; rc >= 0 && i < L.n; i++) {
        const char *nm = L.e[i].name, *slash = strchr(nm, '/');
        size_t cl = L.e[i].dir ? strlen(nm) : slash ? (size_t)(slash - nm) : 0;
        if (!cl) continue;
        if (cls.n && strlen(cls.v[cls.n - 1]) == cl && !memcmp(cls.v[cls.n - 1], nm, cl)) continue;
        rc = push(&cls, strndup(nm, cl));
    }
    if (rc >= 0) qsort(cls.v, cls.n, sizeof *cls.v, cmp_str);
    size_t u = 0;   /* duplicates left by the listing's order ("a/x", "a-b/y", "a/z") */
    for (size_t i = 0; i < cls.n; i++) {
        if (u && !strcmp(cls.v[u - 1], cls.v[i])) { free(cls.v[i]); continue; }
        cls.v[u++] = cls.v[i];
    }
    cls.n = u;
    if (rc >= 0 && cls.n == 0) rc = ferry_seterr(FERRY_ENOTFOUND, "%s: no class folders (no keys under sub-prefixes)", root);
    if (rc >= 0 && cls.n > INT32_MAX) rc = ferry_seterr(FERRY_EUNSUPPORTED, "%s: too many classes", root);
    if (rc >= 0 && !(s->classes = malloc(cls.n * sizeof *s->classes))) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    size_t j = 0;
    for (size_t c = 0; rc >= 0 && c < cls.n; c++) {
        if ((rc = ferry_shards_str(s, cls.v[c], strlen(cls.v[c]), &s->classes[c])) < 0) break;
        s->nclasses = (uint32_t)(c + 1);
        size_t cl = strlen(cls.v[c]), before = s->nsamples;
        for (; rc >= 0 && j < n && e[j].cls == cl && !memcmp(e[j].name, cls.v[c], cl); j++) {
            char *p = malloc(dl + 2 + strlen(e[j].name));
            if (!p) { rc = ferry_seterr(FERRY_ENOMEM, "out of memory"); break; }
            sprintf(p, "%s%s", root, e[j].name);
            const char *dot = strrchr(e[j].name + e[j].dir + 1, '.');
            rc = add_file_sample(s, p, e[j].name, strlen(e[j].name), dot + 1, (int32_t)c, e[j].size);
            free(p);
        }
        if (rc >= 0 && s->nsamples == before)
            rc = ferry_seterr(FERRY_ENOTFOUND, "%s%s/: class \"%s\" has no image file (extensions .jpg .jpeg .png .ppm"
                              " .bmp .pgm .tif .tiff .webp)", root, cls.v[c], cls.v[c]);
    }
    clear(&cls);
    free(e);
    ferry_remote_listing_free(&L);
    free(root);
    return rc;
}

int ferry_folder_index(ferry_shards *s, const char *dir) {
    if (s->nclasses) return ferry_seterr(FERRY_EINVAL, "%s: one image folder per set", dir);
    if (ferry_remote_is_url(dir)) {
        if (!ferry_remote_can_list(dir))
            return ferry_seterr(FERRY_EUNSUPPORTED, "%s: an image folder at a URL is listed: s3:// and gs:// can be, a web"
                                " server cannot (name the files, format \"files\")", dir);
        return folder_index_url(s, dir);
    }
    strlist cls = {0};
    int rc = list_dir(dir, &cls, NULL);
    if (rc >= 0 && cls.n == 0) rc = ferry_seterr(FERRY_ENOTFOUND, "%s: no class folders", dir);
    if (rc >= 0 && cls.n > INT32_MAX) rc = ferry_seterr(FERRY_EUNSUPPORTED, "%s: too many classes", dir);
    if (rc >= 0) {
        qsort(cls.v, cls.n, sizeof *cls.v, cmp_str);
        if (!(s->classes = malloc(cls.n * sizeof *s->classes))) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    }
    for (size_t i = 0; rc >= 0 && i < cls.n; i++) {
        if ((rc = ferry_shards_str(s, cls.v[i], strlen(cls.v[i]), &s->classes[i])) < 0) break;
        s->nclasses = (uint32_t)(i + 1);
        rc = class_samples(s, dir, cls.v[i], (int32_t)i);
    }
    clear(&cls);
    return rc;
}

/* The sizes of a list's files at URLs, 16 requests at a time (UINT64_MAX: a local file, stat'ed later). */
typedef struct files_run {
    ferry_ctx *ctx;
    const char *const *paths;
    uint64_t *sizes;
} files_run;

static int size_one(void *arg, size_t i) {
    files_run *fr = arg;
    fr->sizes[i] = UINT64_MAX;
    if (!ferry_remote_is_url(fr->paths[i])) return 0;
    return ferry_remote_stat(fr->paths[i], ferry_ctx_remote_opts(fr->ctx), &fr->sizes[i]);
}

int ferry_files_index(ferry_shards *s, const char *const *paths, size_t n) {
    files_run fr = {s->ctx, paths, malloc((n ? n : 1) * sizeof *fr.sizes)};
    int rc = fr.sizes ? ferry_shards_each(n, 16, size_one, &fr) : ferry_seterr(FERRY_ENOMEM, "out of memory");
    for (size_t i = 0; rc >= 0 && i < n; i++) {
        const char *p = paths[i], *base = strrchr(p, '/');
        base = base ? base + 1 : p;
        const char *dot = strrchr(base, '.');
        if (dot == base) dot = NULL;   /* ".hidden": no extension */
        size_t klen = dot ? (size_t)(dot - p) : strlen(p);
        rc = add_file_sample(s, p, p, klen, dot ? dot + 1 : "", -1, fr.sizes[i]);
    }
    free(fr.sizes);
    return rc;
}
