/* refs.c — kerchunk reference sets: a Zarr v2 store described by one JSON
 * document whose keys are the store's keys and whose values say where each
 * key's bytes are:
 *     "t/.zarray": "{\"shape\": ...}"          the bytes themselves (text)
 *     "lat/0": "base64:AAAA..."                 the bytes, base64
 *     "t/0.0.1": ["data.nc", 11448, 121]        121 bytes at 11448 of a file
 *     "t/1.0.1": ["s3://b/data.nc"]             a whole file or object
 * Version 0 is that object itself; version 1 is {"version": 1, "refs": {...},
 * "templates": {...}, "gen": [...]} (refsgen.c renders templates and
 * expands gen). Learnt from kerchunk's specification; no code of its.
 *
 * Open: parse the document, sort the references by key, parse each array's
 * .zarray/.zattrs with zarr.c's own v2 parser (zarrmeta.h), and put the bytes
 * of every inline chunk into one anonymous in-memory file (a memfd, read as
 * /proc/self/fd/N), so that the engine reads and decodes an inline chunk as it
 * does any chunk — on the CPU or the GPU. Plan: the Zarr grid of the selection
 * (ferry_layout), each chunk key looked up: a reference is one READ extent of
 * its target (offset, length), a key absent from the set is the fill value.
 *
 * Targets: a relative path resolves against the JSON's directory; a local
 * file must lie inside that directory (inside.h, the rule of every multi-file
 * format) unless the opener allows it (ferry_open_opts.allow_outside); URLs
 * (http, https, s3, gs) are read through the remote source. Each target is
 * looked at once, when a plan first needs it: it must exist and hold every
 * byte its references name, else the plan fails naming the reference set, the
 * key and the target. */
#include "formats/dataset.h"
#include "formats/json.h"
#include "formats/layout.h"
#include "formats/select.h"
#include "formats/refsgen.h"
#include "formats/refstargets.h"
#include "formats/typestr.h"
#include "formats/zarrmeta.h"
#include "sources/url.h"
#include <fcntl.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define REFS_MAX_REFS ((uint64_t)1 << 26)   /* references in one set, generated ones included */
#define REFS_MAX_GEN_BYTES ((uint64_t)1 << 30)   /* bytes of the keys and URLs "gen" entries make, all told */
#define REFS_MAX_INLINE ((uint64_t)1 << 32) /* bytes of inline chunks held in memory */

enum { REF_INLINE, REF_RANGE, REF_WHOLE };

typedef struct ref_ent {
    const char *key;       /* NUL-terminated (the tree's or the arena's) */
    uint32_t seq;          /* input order: of two references to one key the later stands (gen after refs) */
    uint8_t kind;
    uint8_t b64;           /* INLINE text starting "base64:" */
    uint32_t target;       /* RANGE, WHOLE: index in targets */
    uint64_t off, len;     /* RANGE: in the target; INLINE chunk: in the in-memory file */
    const ferry_json *val; /* INLINE: the value (a string, or an object for metadata) */
} ref_ent;

typedef struct refs_arr {
    char *name;
    char *prefix;          /* its keys start with this ("g/t/") */
    ferry_zarr_v2 m;
} refs_arr;

typedef struct refs_ds {
    char *text;
    ferry_json *root;
    ref_ent *ents;
    size_t nents, capents;
    char **arena;          /* generated keys and rendered URLs */
    size_t narena, caparena;
    ferry_refs_targets targets;
    char *dir;             /* the JSON's directory as the path spells it (a URL's for a remote set) */
    char *rootdir;         /* realpath of dir; NULL for a remote set */
    int memfd;             /* inline chunks, -1 none */
    char memfd_path[40];
    refs_arr *arrs;
    int narrs;
} refs_ds;

static int is_meta_key(const char *k) {
    const char *b = strrchr(k, '/');
    b = b ? b + 1 : k;
    return !strcmp(b, ".zarray") || !strcmp(b, ".zattrs") || !strcmp(b, ".zgroup") || !strcmp(b, ".zmetadata");
}

/* ---- the reference table ------------------------------------------------------ */

static int new_ent(refs_ds *r, const char *file, ref_ent **out) {
    if (r->nents >= REFS_MAX_REFS)
        return ferry_seterr(FERRY_EFORMAT, "%s: more than %llu references", file, (unsigned long long)REFS_MAX_REFS);
    if (r->nents == r->capents) {
        size_t cap = r->capents ? 2 * r->capents : 256;
        ref_ent *e = realloc(r->ents, cap * sizeof *e);
        if (!e) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
        r->ents = e;
        r->capents = cap;
    }
    ref_ent *e = &r->ents[r->nents];
    memset(e, 0, sizeof *e);
    e->seq = (uint32_t)r->nents++;
    *out = e;
    return 0;
}

static char *keep(refs_ds *r, const char *s) {
    if (r->narena == r->caparena) {
        size_t cap = r->caparena ? 2 * r->caparena : 64;
        char **a = realloc(r->arena, cap * sizeof *a);
        if (!a) return NULL;
        r->arena = a;
        r->caparena = cap;
    }
    char *c = strdup(s);
    if (c) r->arena[r->narena++] = c;
    return c;
}

/* One reference of the "refs" object. */
static int add_ref(refs_ds *r, const char *file, const ferry_json *v, const ferry_json *templates) {
    const char *key = v->key;
    if (!key || strlen(key) != v->keylen || !v->keylen)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: a key that is empty or holds a NUL", file,
                            (unsigned long long)v->pos);
    ref_ent *e;
    int rc = new_ent(r, file, &e);
    if (rc < 0) return rc;
    e->key = key;
    if (v->type == FERRY_JSON_STRING || (v->type == FERRY_JSON_OBJECT && is_meta_key(key))) {
        e->kind = REF_INLINE;
        e->val = v;
        e->b64 = v->type == FERRY_JSON_STRING && v->len >= 7 && !memcmp(v->str, "base64:", 7);
        return 0;
    }
    uint64_t off = 0, len = 0;
    const ferry_json *u = v->type == FERRY_JSON_ARRAY && v->n >= 1 ? &v->items[0] : NULL;
    if (!u || u->type != FERRY_JSON_STRING || (v->n != 1 && v->n != 3) ||
        (v->n == 3 && (ferry_json_u64(&v->items[1], &off) < 0 || ferry_json_u64(&v->items[2], &len) < 0)))
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: key \"%s\": a reference must be a string (the bytes), "
                            "[url] or [url, offset, length] with integers", file, (unsigned long long)v->pos, key);
    const char *url = u->str;
    ferry_sbuf b = {0};
    if (templates && strstr(url, "{{")) {
        char what[512];
        snprintf(what, sizeof what, "%s: byte %llu: key \"%s\"", file, (unsigned long long)u->pos, key);
        rc = ferry_refs_render(u->str, u->len, templates, NULL, NULL, 0, &b, what);
        if (rc < 0) { ferry_sbuf_free(&b); return rc; }
        url = b.p ? b.p : "";
    }
    if (strlen(url) != (url == u->str ? u->len : b.len) || !*url) {
        ferry_sbuf_free(&b);
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: key \"%s\": the url is empty or holds a NUL", file,
                            (unsigned long long)u->pos, key);
    }
    e->kind = v->n == 3 ? REF_RANGE : REF_WHOLE;
    e->off = off;
    e->len = len;
    rc = ferry_refs_target_add(&r->targets, file, url, &e->target);
    ferry_sbuf_free(&b);
    return rc;
}

typedef struct gen_arg { refs_ds *r; const char *file; uint64_t bytes; } gen_arg;

static int gen_emit(void *arg, const char *key, const char *url, int ranged, uint64_t off, uint64_t len) {
    gen_arg *g = arg;
    if (!*key || !*url) return ferry_seterr(FERRY_EFORMAT, "%s: gen: a generated key or url is empty", g->file);
    if ((g->bytes += strlen(key) + strlen(url)) > REFS_MAX_GEN_BYTES)
        return ferry_seterr(FERRY_EFORMAT, "%s: gen: the generated keys and URLs pass %llu bytes", g->file,
                            (unsigned long long)REFS_MAX_GEN_BYTES);
    ref_ent *e;
    int rc = new_ent(g->r, g->file, &e);
    if (rc < 0) return rc;
    if (!(e->key = keep(g->r, key))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", g->file);
    e->kind = ranged ? REF_RANGE : REF_WHOLE;
    e->off = off;
    e->len = len;
    return ferry_refs_target_add(&g->r->targets, g->file, url, &e->target);
}

static int cmp_ent(const void *x, const void *y) {
    const ref_ent *a = x, *b = y;
    int c = strcmp(a->key, b->key);
    return c ? c : (a->seq < b->seq ? -1 : a->seq > b->seq);
}

static const ref_ent *find(const refs_ds *r, const char *key) {
    size_t lo = 0, hi = r->nents;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(r->ents[mid].key, key);
        if (!c) return &r->ents[mid];
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

/* ---- inline bytes ------------------------------------------------------------- */

static int b64v(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
}

/* The bytes of an inline reference (malloc'd into *out), decoding base64.
 * A metadata value given as a JSON object has none (*out NULL, 0). */
static int inline_bytes(const char *file, const ref_ent *e, uint8_t **out, size_t *n) {
    const ferry_json *v = e->val;
    *out = NULL;
    *n = 0;
    if (v->type != FERRY_JSON_STRING) return 0;
    if (!e->b64) {
        if (!(*out = malloc(v->len ? v->len : 1))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
        memcpy(*out, v->str, v->len);
        *n = v->len;
        return 0;
    }
    const char *s = v->str + 7;
    size_t len = v->len - 7;
    while (len && s[len - 1] == '=') len--;
    uint8_t *b = malloc(len * 3 / 4 + 3);
    if (!b) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
    uint32_t acc = 0, bits = 0;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        int x = b64v((unsigned char)s[i]);
        if (x < 0) {
            free(b);
            return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: key \"%s\": bad base64 (character %zu, '%c', of the "
                                "value is not base64)", file, (unsigned long long)v->pos, e->key, i + 7,
                                (s[i] >= 32 && s[i] < 127) ? s[i] : '?');
        }
        acc = (acc << 6) | (uint32_t)x;
        bits += 6;
        if (bits >= 8) { bits -= 8; b[o++] = (uint8_t)(acc >> bits); }
    }
    if (bits >= 6 || (acc & ((1u << bits) - 1))) {   /* a lone 6 bits, or stray bits: cut short */
        free(b);
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: key \"%s\": bad base64 (the value is cut short)", file,
                            (unsigned long long)v->pos, e->key);
    }
    *out = b;
    *n = o;
    return 0;
}

/* A metadata document of the set, parsed (NULL: the key is absent). */
static int meta_doc(refs_ds *r, const char *file, const char *key, ferry_json **out, const ferry_json **direct) {
    *out = NULL;
    *direct = NULL;
    const ref_ent *e = find(r, key);
    if (!e) return 0;
    char what[1024];
    snprintf(what, sizeof what, "%s: key \"%s\"", file, key);
    if (e->kind != REF_INLINE)
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: metadata held in another file is not supported (only inline)", what);
    if (e->val->type == FERRY_JSON_OBJECT) { *direct = e->val; return 0; }
    uint8_t *b;
    size_t n;
    int rc = inline_bytes(file, e, &b, &n);
    if (rc < 0) return rc;
    rc = ferry_json_parse((const char *)b, n, what, 0, out);
    free(b);
    return rc;
}

/* Every inline chunk into the in-memory file; its offset and length noted. */
static int store_inline(refs_ds *r, const char *file) {
    uint64_t at = 0;
    for (size_t i = 0; i < r->nents; i++) {
        ref_ent *e = &r->ents[i];
        if (e->kind != REF_INLINE || is_meta_key(e->key)) continue;
        uint8_t *b;
        size_t n;
        int rc = inline_bytes(file, e, &b, &n);
        if (rc < 0) return rc;
        if (r->memfd < 0) {
            r->memfd = memfd_create("ferry-refs-inline", MFD_CLOEXEC);
            if (r->memfd < 0) {
                int err = errno;
                free(b);
                return ferry_seterr(-err, "%s: key \"%s\": no in-memory file for inline chunks: %s", file, e->key,
                                    strerror(err));
            }
            snprintf(r->memfd_path, sizeof r->memfd_path, "/proc/self/fd/%d", r->memfd);
        }
        if (at + n > REFS_MAX_INLINE) {
            free(b);
            return ferry_seterr(FERRY_EFORMAT, "%s: more than %llu bytes of inline chunks", file,
                                (unsigned long long)REFS_MAX_INLINE);
        }
        for (size_t done = 0; done < n;) {
            ssize_t w = pwrite(r->memfd, b + done, n - done, (off_t)(at + done));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                int err = w < 0 ? errno : ENOSPC;
                free(b);
                return ferry_seterr(-err, "%s: key \"%s\": storing an inline chunk: %s", file, e->key, strerror(err));
            }
            done += (size_t)w;
        }
        free(b);
        e->off = at;
        e->len = n;
        at += n;
    }
    return 0;
}

/* ---- opening -------------------------------------------------------------------- */

static int read_text(ferry_ctx *ctx, const char *path, char **out, size_t *len) {
    ferry_file *f;
    int rc = ferry_file_open(ctx, path, FERRY_READ, &f);
    if (rc < 0) return rc;
    int64_t sz = ferry_file_size(f);
    if (sz >= 0 && (uint64_t)sz > FERRY_JSON_MAX_BYTES)
        sz = ferry_seterr(FERRY_EFORMAT, "%s: a reference set of %lld bytes is larger than ferry reads (%llu)", path,
                          (long long)sz, (unsigned long long)FERRY_JSON_MAX_BYTES);
    char *buf = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (sz >= 0 && !buf) sz = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
    int64_t got = sz > 0 ? ferry_pread(f, ferry_host_buf(buf, (size_t)sz), 0, (size_t)sz, FERRY_NO_DIRECT) : sz;
    ferry_file_close(f);
    if (got < 0) { free(buf); return (int)got; }
    buf[got] = 0;
    *out = buf;
    *len = (size_t)got;
    return 0;
}

/* A directory of kerchunk Parquet references: a .zmetadata whose object has
 * a "record_size" (fsspec's LazyReferenceMapper writes it after "metadata",
 * so the head or the tail of the file holds it; a Zarr store's consolidated
 * metadata has none). The probe of every directory pays a stat, and a
 * directory with a .zmetadata one open and two reads. */
static int parquet_dir(const char *path) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/.zmetadata", path) >= (int)sizeof p) return 0;
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return 0;
    struct stat st;
    char buf[1025];
    int found = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        off_t at[2] = {0, st.st_size > 1024 ? st.st_size - 1024 : 0};
        for (int k = 0; k < 2 && !found; k++) {
            ssize_t n = pread(fd, buf, 1024, at[k]);
            found = n > 0 && memmem(buf, (size_t)n, "\"record_size\"", 13) != NULL;
        }
    }
    close(fd);
    return found;
}

/* Head of a JSON reference set: an object whose first keys (within the head)
 * are kerchunk's: "version" with "refs", or Zarr v2 keys of a version 0 set. */
static int refs_probe(const char *path, const uint8_t *head, size_t n, int is_dir) {
    if (is_dir) return parquet_dir(path);
    size_t i = 0;
    while (i < n && (head[i] == ' ' || head[i] == '\t' || head[i] == '\n' || head[i] == '\r')) i++;
    if (i >= n || head[i] != '{') return 0;
    const char *h = (const char *)head + i;
    size_t m = n - i;
    return (memmem(h, m, "\"version\"", 9) && memmem(h, m, "\"refs\"", 6)) || memmem(h, m, "\".zgroup\"", 9) ||
           memmem(h, m, "/.zarray\"", 9) || memmem(h, m, "\".zattrs\"", 9) || memmem(h, m, "/.zattrs\"", 9);
}

static void refs_close(ferry_dataset *ds) {
    refs_ds *r = ds->fmt;
    if (r) {
        for (int i = 0; i < r->narrs; i++) {
            free(r->arrs[i].name);
            free(r->arrs[i].prefix);
            ferry_zarr_v2_free(&r->arrs[i].m);
        }
        free(r->arrs);
        ferry_refs_targets_free(&r->targets);
        for (size_t i = 0; i < r->narena; i++) free(r->arena[i]);
        free(r->arena);
        free(r->ents);
        ferry_json_free(r->root);
        free(r->text);
        free(r->dir);
        free(r->rootdir);
        if (r->memfd >= 0) close(r->memfd);
        free(r);
    }
    free(ds->vars);
    free(ds->attrs_json); free(ds->dims_json); free(ds->groups_json);
    ds->vars = NULL; ds->nvars = 0; ds->fmt = NULL;
    ds->attrs_json = ds->dims_json = ds->groups_json = NULL;
}

/* The arrays and child groups of the group at prefix. */
static int collect(ferry_dataset *ds, refs_ds *r, const char *prefix) {
    const char *file = ds->path;
    size_t pl = strlen(prefix);
    int cap = 0, rc = 0, ngroups = 0;
    const char **groups = NULL;
    for (size_t i = 0; i < r->nents && rc == 0; i++) {
        const char *k = r->ents[i].key;
        if (strncmp(k, prefix, pl)) continue;
        const char *rest = k + pl, *slash = strchr(rest, '/');
        if (!slash || slash == rest) continue;
        int arr = !strcmp(slash, "/.zarray"), grp = !strcmp(slash, "/.zgroup");
        if (grp) {
            const char **g = realloc(groups, (size_t)(ngroups + 1) * sizeof *g);
            if (!g) { rc = FERRY_ENOMEM; break; }
            groups = g;
            groups[ngroups++] = k;   /* the name is k + pl up to the slash */
        }
        if (!arr) continue;
        if (r->narrs == cap) {
            cap = cap ? 2 * cap : 16;
            refs_arr *na = realloc(r->arrs, (size_t)cap * sizeof *na);
            if (!na) { rc = FERRY_ENOMEM; break; }
            r->arrs = na;
        }
        refs_arr *a = &r->arrs[r->narrs];
        memset(a, 0, sizeof *a);
        size_t nl = (size_t)(slash - rest);
        a->name = strndup(rest, nl);
        a->prefix = strndup(k, pl + nl + 1);
        if (!a->name || !a->prefix) { free(a->name); free(a->prefix); rc = FERRY_ENOMEM; break; }
        r->narrs++;
        char akey[PATH_MAX + 16], what[PATH_MAX + 600];
        snprintf(akey, sizeof akey, "%s.zattrs", a->prefix);
        snprintf(what, sizeof what, "%s: key \"%s\"", file, k);
        ferry_json *za = NULL, *at = NULL;
        const ferry_json *zad = NULL, *atd = NULL;
        rc = meta_doc(r, file, k, &za, &zad);
        if (rc == 0) rc = meta_doc(r, file, akey, &at, &atd);
        if (rc == 0) rc = ferry_zarr_v2_parse(what, za ? za : zad, at ? at : atd, &a->m);
        ferry_json_free(za);
        ferry_json_free(at);
    }
    if (rc == 0) {
        ferry_sbuf g = {0};
        ferry_sbuf_puts(&g, "[");
        for (int i = 0; i < ngroups; i++) {
            const char *nm = groups[i] + pl;
            ferry_sbuf_puts(&g, i ? "," : "");
            ferry_sbuf_json_string(&g, nm, (size_t)(strchr(nm, '/') - nm));
        }
        ferry_sbuf_puts(&g, "]");
        if (!(ds->groups_json = ferry_sbuf_take(&g))) rc = FERRY_ENOMEM;
    }
    free(groups);
    if (rc == FERRY_ENOMEM && !ferry_lasterr()[0]) ferry_seterr(rc, "%s: out of memory", file);
    return rc;
}

/* dataset dims: {"name": {"size": n, "unlimited": false}}, first size seen. */
static char *build_dims(refs_ds *r) {
    ferry_sbuf b = {0};
    char **seen = NULL;
    size_t nseen = 0, cap = 0;
    int oom = 0;
    ferry_sbuf_puts(&b, "{");
    for (int i = 0; i < r->narrs && !oom; i++) {
        const ferry_zarr_v2 *m = &r->arrs[i].m;
        ferry_json *d = NULL;
        if (!m->dims_json || ferry_json_parse(m->dims_json, strlen(m->dims_json), NULL, 0, &d) < 0) {
            ferry_clearerr();
            continue;
        }
        for (size_t k = 0; k < d->n && (int)k < m->ndim && !oom; k++) {
            const char *nm = ferry_json_str(&d->items[k]);
            if (!nm) continue;
            /* a sorted list of the names seen: a set of thousands of arrays stays fast */
            size_t lo = 0, hi = nseen;
            while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (strcmp(seen[mid], nm) < 0) lo = mid + 1; else hi = mid;
            }
            if (lo < nseen && !strcmp(seen[lo], nm)) continue;
            if (nseen == cap) {
                cap = cap ? 2 * cap : 16;
                char **s = realloc(seen, cap * sizeof *s);
                if (!s) { oom = 1; break; }
                seen = s;
            }
            memmove(seen + lo + 1, seen + lo, (nseen - lo) * sizeof *seen);
            if (!(seen[lo] = strdup(nm))) { oom = 1; break; }
            nseen++;
            ferry_sbuf_puts(&b, b.len > 1 ? "," : "");
            ferry_sbuf_json_string(&b, nm, d->items[k].len);
            ferry_sbuf_printf(&b, ":{\"size\":%llu,\"unlimited\":false}", (unsigned long long)m->shape[k]);
        }
        ferry_json_free(d);
    }
    for (size_t i = 0; i < nseen; i++) free(seen[i]);
    free(seen);
    ferry_sbuf_puts(&b, "}");
    char *out = ferry_sbuf_take(&b);
    if (oom) { free(out); return NULL; }
    return out;
}

static int cmp_arr(const void *x, const void *y) {
    return strcmp(((const refs_arr *)x)->name, ((const refs_arr *)y)->name);
}

static int refs_open(ferry_dataset *ds, const ferry_open_opts *opts) {
    const char *file = ds->path;
    const char *given = opts ? opts->refs_json : NULL;
    struct stat st;
    if (!given && ferry_url_scheme_of(file) == FERRY_URL_NONE && stat(file, &st) == 0 && S_ISDIR(st.st_mode))
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: kerchunk Parquet references: ferry's C library reads JSON "
                            "reference sets (version 0 and 1); the Python package reads Parquet ones with pyarrow "
                            "(ferry.open, engine=\"ferry\"), or write the references as JSON (kerchunk's translate() "
                            "output, json.dump'ed)", file);
    refs_ds *r = calloc(1, sizeof *r);
    if (!r) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
    r->memfd = -1;
    ds->fmt = r;
    /* the directory relative targets resolve against: the one holding the
     * JSON file (or the Parquet directory the caller read: "refs.parq/" too) */
    size_t flen = strlen(file);
    while (flen > 1 && file[flen - 1] == '/') flen--;
    const char *slash = memrchr(file, '/', flen);
    int remote = ferry_url_scheme_of(file) != FERRY_URL_NONE;
    r->dir = slash ? strndup(file, (size_t)(slash - file) ? (size_t)(slash - file) : 1) : strdup(".");
    if (!r->dir) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
    if (!remote && !(r->rootdir = realpath(r->dir, NULL)))
        return ferry_seterr(-errno, "%s: its directory %s: %s", file, r->dir, strerror(errno));
    size_t len = 0;
    int rc = ferry_refs_targets_init(&r->targets, r->dir, r->rootdir, opts && opts->allow_outside);
    if (rc < 0) return ferry_seterr(rc, "%s: out of memory", file);
    if (given) {   /* the caller's JSON (a Parquet reference set it read), not the file's */
        len = strlen(given);
        if (len > FERRY_JSON_MAX_BYTES)
            return ferry_seterr(FERRY_EFORMAT, "%s: a reference set of %zu bytes of JSON is larger than ferry reads "
                                "(%llu)", file, len, (unsigned long long)FERRY_JSON_MAX_BYTES);
        if (!(r->text = malloc(len + 1))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
        memcpy(r->text, given, len + 1);
    } else if ((rc = read_text(ds->ctx, file, &r->text, &len)) < 0) {
        return rc;
    }
    if ((rc = ferry_json_parse(r->text, len, file, 0, &r->root)) < 0) return rc;
    const ferry_json *root = r->root, *refs = root, *templates = NULL, *gen = NULL;
    if (root->type != FERRY_JSON_OBJECT)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: a reference set must be a JSON object", file,
                            (unsigned long long)root->pos);
    const ferry_json *ver = ferry_json_get(root, "version");
    if (ver) {
        uint64_t v;
        if (ferry_json_u64(ver, &v) < 0 || v != 1)
            return ferry_seterr(FERRY_EUNSUPPORTED, "%s: byte %llu: reference set version %.*s (ferry reads 0 and 1)",
                                file, (unsigned long long)ver->pos, (int)(ver->len < 32 ? ver->len : 32),
                                ver->str ? ver->str : "?");
        refs = ferry_json_get(root, "refs");
        templates = ferry_json_get(root, "templates");
        gen = ferry_json_get(root, "gen");
        if ((refs && refs->type != FERRY_JSON_OBJECT) || (templates && templates->type != FERRY_JSON_OBJECT))
            return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: \"refs\" and \"templates\" must be objects", file,
                                (unsigned long long)(refs && refs->type != FERRY_JSON_OBJECT ? refs->pos : templates->pos));
    }
    /* a JSON file of another kind (a name that ends in .json is tried here
     * when nothing else claims it) is refused, not opened as an empty store */
    int zarr_keys = 0;
    for (size_t i = 0; refs && i < refs->n && !zarr_keys; i++) {
        const char *k = refs->items[i].key, *b = strrchr(k, '/');
        zarr_keys = !strcmp(b ? b + 1 : k, ".zgroup") || !strcmp(b ? b + 1 : k, ".zarray");
    }
    if (!zarr_keys)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: not a kerchunk reference set: no \".zgroup\" or "
                            "\"<array>/.zarray\" key", file, (unsigned long long)root->pos);
    for (size_t i = 0; refs && i < refs->n && rc == 0; i++) rc = add_ref(r, file, &refs->items[i], templates);
    gen_arg ga = {r, file, 0};
    if (rc == 0) rc = ferry_refs_gen(gen, templates, file, REFS_MAX_REFS, gen_emit, &ga);
    if (rc < 0) return rc;
    /* sorted by key; of duplicates the last given stands (kerchunk: gen after refs) */
    qsort(r->ents, r->nents, sizeof *r->ents, cmp_ent);
    size_t w = 0;
    for (size_t i = 0; i < r->nents; i++) {
        if (w && !strcmp(r->ents[w - 1].key, r->ents[i].key)) w--;
        r->ents[w++] = r->ents[i];
    }
    r->nents = w;
    if ((rc = store_inline(r, file)) < 0) return rc;

    /* the group */
    const char *group = opts && opts->group ? opts->group : "";
    while (*group == '/') group++;
    char prefix[PATH_MAX];
    size_t gl = strlen(group);
    while (gl && group[gl - 1] == '/') gl--;
    if (gl + 2 > sizeof prefix) return ferry_seterr(FERRY_EINVAL, "%s: group name too long", file);
    memcpy(prefix, group, gl);
    if (gl) prefix[gl++] = '/';
    prefix[gl] = 0;
    char key[PATH_MAX + 16];
    snprintf(key, sizeof key, "%s.zarray", prefix);
    if (find(r, key))
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: key \"%s\": the node opened is an array; open its group", file, key);
    snprintf(key, sizeof key, "%s.zgroup", prefix);
    if (gl && !find(r, key)) return ferry_seterr(FERRY_ENOTFOUND, "%s: no group \"%.*s\"", file, (int)gl - 1, prefix);
    ferry_json *gdoc = NULL;
    const ferry_json *gdirect = NULL;
    if ((rc = meta_doc(r, file, key, &gdoc, &gdirect)) < 0) return rc;
    uint64_t zf = 0;
    const ferry_json *g = gdoc ? gdoc : gdirect;
    if (g && (g->type != FERRY_JSON_OBJECT || ferry_json_u64(ferry_json_get(g, "zarr_format"), &zf) < 0 || zf != 2))
        rc = ferry_seterr(FERRY_EUNSUPPORTED, "%s: key \"%s\": zarr_format must be 2 (ferry reads references to "
                          "Zarr v2 stores)", file, key);
    ferry_json_free(gdoc);
    if (rc < 0) return rc;
    snprintf(key, sizeof key, "%s.zattrs", prefix);
    if ((rc = meta_doc(r, file, key, &gdoc, &gdirect)) < 0) return rc;
    g = gdoc ? gdoc : gdirect;
    if (g && g->type != FERRY_JSON_OBJECT) rc = ferry_seterr(FERRY_EFORMAT, "%s: key \"%s\" must be an object", file, key);
    else if (g) {
        ferry_sbuf b = {0};
        ferry_sbuf_json_value(&b, g);
        if (!(ds->attrs_json = ferry_sbuf_take(&b))) rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
    }
    ferry_json_free(gdoc);
    if (rc < 0 || (rc = collect(ds, r, prefix)) < 0) return rc;
    if (r->narrs > 1) qsort(r->arrs, (size_t)r->narrs, sizeof *r->arrs, cmp_arr);
    ds->store.zarr_format = 2;
    ds->vars = calloc((size_t)(r->narrs ? r->narrs : 1), sizeof *ds->vars);
    ds->dims_json = build_dims(r);
    if (!ds->vars || !ds->dims_json) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
    for (int i = 0; i < r->narrs; i++) {
        refs_arr *a = &r->arrs[i];
        ferry_var_info *vi = &ds->vars[i].info;
        ferry_dtype dt = FERRY_DT_OTHER;
        uint32_t isz, sw;
        if (ferry_typestr_parse(a->m.typestr, strlen(a->m.typestr), &dt, &isz, &sw) < 0) dt = FERRY_DT_OTHER;
        vi->name = a->name;
        vi->dtype = dt;
        vi->typestr = a->m.typestr;
        vi->itemsize = a->m.itemsize;
        vi->ndim = a->m.ndim;
        memcpy(vi->shape, a->m.shape, sizeof vi->shape);
        memcpy(vi->chunks, a->m.chunk, sizeof vi->chunks);
        vi->fortran_order = a->m.fortran;
        vi->dims_json = a->m.dims_json ? a->m.dims_json : "null";
        vi->attrs_json = a->m.attrs_json ? a->m.attrs_json : "{}";
        vi->fill_json = a->m.fill_json ? a->m.fill_json : "null";
        vi->codecs = a->m.codecs_desc ? a->m.codecs_desc : "";
        vi->path = ds->path;
        vi->error = a->m.err;
        ds->vars[i].fmt = a;
        if (a->m.has_fill) ds->vars[i].fill = a->m.fill;
    }
    ds->nvars = r->narrs;
    return 0;
}

/* ---- plans ---------------------------------------------------------------------- */

typedef struct refs_plan_ctx {
    ferry_dataset *ds;
    refs_ds *r;
    refs_arr *a;
    uint64_t chunk_bytes;   /* a decoded chunk */
    int raw;                /* no codec but a byteswap: a reference must hold a whole chunk */
    char key[PATH_MAX + FERRY_MAX_DIMS * 21 + 4];
} refs_plan_ctx;

static int chunk_lookup(void *arg, const uint64_t *idx, ferry_chunk *c) {
    refs_plan_ctx *p = arg;
    refs_arr *a = p->a;
    const char *file = p->ds->path;
    int n = snprintf(p->key, sizeof p->key, "%s", a->prefix);
    for (int k = 0; k < a->m.ndim && n < (int)sizeof p->key; k++) {
        if (k) p->key[n++] = a->m.sep;
        if (n < (int)sizeof p->key) n += snprintf(p->key + n, sizeof p->key - (size_t)n, "%llu", (unsigned long long)idx[k]);
    }
    if (a->m.ndim == 0 && n < (int)sizeof p->key) n += snprintf(p->key + n, sizeof p->key - (size_t)n, "0");
    if (n >= (int)sizeof p->key) return ferry_seterr(FERRY_EINVAL, "%s: chunk key of %s too long", file, a->name);
    const ref_ent *e = find(p->r, p->key);
    c->skip = 0;
    if (!e) { c->length = FERRY_CHUNK_ABSENT; return 0; }   /* never written: the fill value */
    if (e->kind == REF_INLINE) {
        c->path = p->r->memfd_path;
        c->offset = e->off;
        c->length = e->len;
    } else {
        const ferry_refs_target *t;
        int st = ferry_refs_target_get(&p->r->targets, p->ds->ctx, e->target, &t);
        if (st < 0)
            return ferry_seterr(st, "%s: key \"%s\": target \"%s\": %s", file, e->key, t->spelled, t->why ? t->why : "");
        uint64_t end;
        if (e->kind == REF_WHOLE) {
            c->offset = 0;
            c->length = t->size;
        } else if (ferry_add_overflow(e->off, e->len, &end) || end > t->size) {
            return ferry_seterr(FERRY_EFORMAT, "%s: key \"%s\": [\"%s\", %llu, %llu] lies past the end of %s "
                                "(%llu bytes)", file, e->key, t->spelled, (unsigned long long)e->off,
                                (unsigned long long)e->len, t->path, (unsigned long long)t->size);
        } else {
            c->offset = e->off;
            c->length = e->len;
        }
        c->path = t->path;
    }
    if (p->raw && c->length != p->chunk_bytes)
        return ferry_seterr(FERRY_EFORMAT, "%s: key \"%s\": %llu bytes where an uncompressed chunk of %s holds %llu",
                            file, e->key, (unsigned long long)c->length, a->name, (unsigned long long)p->chunk_bytes);
    return 0;
}

static int64_t refs_plan(ferry_dataset *ds, int var, const ferry_slice *sel, ferry_buf dst, unsigned flags,
                         ferry_plan *plan) {
    refs_arr *a = ds->vars[var].fmt;
    if (a->m.err) return ferry_seterr(FERRY_EUNSUPPORTED, "%s", a->m.err);
    refs_plan_ctx *p = calloc(1, sizeof *p);
    if (!p) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
    p->ds = ds;
    p->r = ds->fmt;
    p->a = a;
    ferry_layout l;
    memset(&l, 0, sizeof l);
    l.ndim = a->m.ndim;
    memcpy(l.shape, a->m.shape, sizeof l.shape);
    memcpy(l.chunks, a->m.chunk, sizeof l.chunks);
    l.order = a->m.fortran ? FERRY_ORDER_F : FERRY_ORDER_C;
    l.itemsize = a->m.itemsize;
    l.swap = a->m.swap;
    l.ncodecs = a->m.ncodecs;
    memcpy(l.codecs, a->m.codecs, sizeof l.codecs);
    memcpy(l.fill, a->m.fill, sizeof l.fill);
    l.label = a->name;
    l.lookup = chunk_lookup;
    l.lookup_arg = p;
    p->raw = 1;
    for (int i = 0; i < a->m.ncodecs; i++)
        if (a->m.codecs[i].id != FERRY_CODEC_BYTESWAP) p->raw = 0;
    p->chunk_bytes = a->m.itemsize;
    for (int k = 0; k < a->m.ndim; k++) p->chunk_bytes *= a->m.chunk[k];   /* bounded by zarr.c's finish_common */
    uint64_t total = a->m.itemsize;
    for (int k = 0; k < a->m.ndim; k++) total *= ferry_slice_count(sel[k]);
    int rc = ferry_layout_check(&l);
    if (!rc) rc = ferry_layout_plan_box(&l, sel, NULL, NULL, dst, flags, plan);
    if (rc == FERRY_ENOMEM && !ferry_lasterr()[0]) ferry_seterr(rc, "%s: out of memory", ds->path);
    free(p);
    return rc < 0 ? rc : (int64_t)total;
}

const ferry_format_ops ferry_format_refs = {"refs", refs_probe, refs_open, refs_close, refs_plan, NULL};
