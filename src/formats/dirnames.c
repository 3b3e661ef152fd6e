/* dirnames.c — one directory's names, sorted (dirnames.h). */
#include "formats/dirnames.h"
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

void ferry_dirnames_free(ferry_dirnames *d) {
    free(d->dir);
    free(d->names);
    free(d->buf);
    memset(d, 0, sizeof *d);
}

static int cmp_name(const void *x, const void *y) { return strcmp(*(char *const *)x, *(char *const *)y); }

int ferry_dirnames_is(const ferry_dirnames *d, const char *dir, size_t dl) {
    return d->dir && !strncmp(d->dir, dir, dl) && d->dir[dl] == 0;
}

int ferry_dirnames_load(ferry_dirnames *d, const char *dir, size_t dl, size_t max_names) {
    ferry_dirnames_free(d);
    char *path = malloc(dl + 1);
    if (!path) return FERRY_ENOMEM;
    memcpy(path, dir, dl);
    path[dl] = 0;
    DIR *dp = opendir(path);
    if (!dp) {
        if (errno == ENOENT || errno == ENOTDIR) { d->dir = path; return 0; }
        int e = errno;
        free(path);
        return -e;
    }
    size_t cap = 0, *off = NULL, ncap = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(dp))) {
        if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2]))) continue;
        if (d->n == max_names) { rc = 1; break; }
        size_t nl = strlen(de->d_name) + 1;
        if (d->len + nl > cap) {
            size_t c = cap ? 2 * cap : 4096;
            while (c < d->len + nl) c *= 2;
            char *b = realloc(d->buf, c);
            if (!b) { rc = FERRY_ENOMEM; break; }
            d->buf = b;
            cap = c;
        }
        if (d->n == ncap) {
            size_t c = ncap ? 2 * ncap : 256;
            size_t *o = realloc(off, c * sizeof *o);
            if (!o) { rc = FERRY_ENOMEM; break; }
            off = o;
            ncap = c;
        }
        memcpy(d->buf + d->len, de->d_name, nl);
        off[d->n++] = d->len;
        d->len += nl;
    }
    closedir(dp);
    if (!rc && d->n && !(d->names = malloc(d->n * sizeof *d->names))) rc = FERRY_ENOMEM;
    if (rc) {
        free(off);
        free(path);
        ferry_dirnames_free(d);
        return rc;
    }
    for (size_t i = 0; i < d->n; i++) d->names[i] = d->buf + off[i];
    free(off);
    qsort(d->names, d->n, sizeof *d->names, cmp_name);
    d->dir = path;
    return 0;
}

int ferry_dirnames_has(const ferry_dirnames *d, const char *name) {
    size_t a = 0, b = d->n;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        int c = strcmp(d->names[m], name);
        if (!c) return 1;
        if (c < 0) a = m + 1; else b = m;
    }
    return 0;
}
