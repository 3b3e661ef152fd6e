/* zarr.c — Zarr v2 and v3 stores on a local directory, or at a URL (the
 * objects behind the store's prefix stand in for its files: zarr_remote.c).
 *
 * Open: read the metadata (zarr.json for v3; .zarray/.zgroup/.zattrs for v2;
 * consolidated metadata — .zmetadata, or v3 "consolidated_metadata" — when the
 * group has it), and describe every array of the group as a variable: dtype,
 * shape, chunking, fill value, the codec chain in decoding order and the byte
 * layout of a decoded chunk (C order, F order or any v3 `transpose`).
 *
 * Plan: for a selection, visit only the chunks it touches. Each stored chunk
 * is one READ extent of its file (the engine opens it through its cache), with
 * the codec chain and a ferry_place that copies the chunk's part of the
 * selection into the C-order destination; a missing chunk is a FILL extent of
 * the fill value. Sharded arrays (`sharding_indexed`): the shard's index is
 * read at plan time (and its crc32c verified), then each touched inner chunk is
 * one extent at its offset inside the shard file. Uncompressed chunks read only
 * the byte span the selection needs.
 *
 * Anything that would be read wrongly — an unknown codec, filter, dtype, chunk
 * grid or key encoding — is refused with a message naming the file, the byte
 * position and the thing (zarr_arr.err, the variable's `error`), at plan time:
 * the open goes on, so the array is still described (shape, chunks, dimension
 * names, attributes, fill value, dtype as written) and the other arrays of its
 * group stay readable. Malformed metadata fails the open. */
#include "formats/dataset.h"
#include "formats/typestr.h"
#include "formats/json.h"
#include "formats/select.h"
#include "formats/layout.h"
#include "formats/inside.h"
#include "formats/dirnames.h"
#include "formats/zarrmeta.h"
#include "formats/zarr_remote.h"
#include "codecs/codecs.h"
#include "engine/sysio.h"   /* stat and lstat through the test seam (ferry_test_set_syscall) */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#define ZARR_MAX_META ((size_t)64 << 20)   /* one metadata document */
#define ZARR_MAX_CHILDREN 100000
#define EMPTY_U64 UINT64_MAX
#define UNKNOWN_U64 (UINT64_MAX - 1)   /* an uncompressed chunk file not looked at: may be absent */

typedef struct zarr_arr {
    char *name, *dir, *typestr, *dims_json, *attrs_json, *fill_json, *codecs_desc;
    char *err;             /* non-NULL: the array cannot be read; plan_read fails with this */
    int irregular;         /* chunk grid not regular: chunk[] is the shape */
    int zf;                /* 2 or 3 */
    int ndim;
    uint64_t shape[FERRY_MAX_DIMS];
    uint64_t chunk[FERRY_MAX_DIMS];   /* the chunk grid (the shard shape when sharded) */
    uint32_t itemsize;
    uint32_t swap;         /* element size to byteswap for host order (big-endian data), else 0 */
    int fortran;           /* v2 order "F" */
    int perm[FERRY_MAX_DIMS];   /* decoded chunk = logical chunk transposed by perm (C order) */
    char sep;              /* chunk key separator */
    int c_prefix;          /* v3 "default" keys start with "c" */
    int ncodecs;           /* chain for a chunk (the inner chunks when sharded), decoding order */
    ferry_codec codecs[FERRY_MAX_CODECS];
    int sharded;
    uint64_t inner[FERRY_MAX_DIMS];
    int index_at_start, index_crc, index_big;
    uint8_t fill[16];      /* one element in host (little-endian) order */
    int has_fill;          /* fill_value parsed into fill[] and not null */
} zarr_arr;

typedef struct zarr_ds {
    zarr_arr *arrs;
    int narrs;
    char *root;            /* realpath of the store: every file read must resolve under it */
    uint64_t serial;       /* this open's number: the plan memo's key (a later open may reuse the address) */
    ferry_zremote *rs;     /* a store at a URL (zarr_remote.c): its objects stand in for files; root is NULL */
} zarr_ds;

/* ---- small helpers ---------------------------------------------------------- */

static char *xstrdup(const char *s) { return s ? strdup(s) : NULL; }

static char *join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    while (la > 1 && a[la - 1] == '/') la--;
    char *p = malloc(la + 1 + lb + 1);
    if (!p) return NULL;
    memcpy(p, a, la);
    p[la] = '/';
    memcpy(p + la + 1, b, lb + 1);
    return p;
}

/* ---- staying inside the store ----------------------------------------------
 * A store names paths in its metadata (consolidated keys, the group= option)
 * and by its layout (member directories, chunk keys, shard files). A key is
 * taken only when it is a plain relative path: non-empty, no leading "/", no
 * empty, "." or ".." component, no NUL, valid UTF-8 (zarr-python refuses
 * "." and ".." segments the same way: "The path '..' is invalid").
 * Symlinks inside a store are followed only while they stay inside it: every
 * array directory (at open) and every directory holding chunks or shards (at
 * plan time, once per plan) is resolved with realpath(3) and must lie under
 * the store's own resolved path; one that leads outside is refused. Chunk and
 * shard files are opened by the engine with O_NOFOLLOW (FERRY_EXTENT_NOFOLLOW,
 * root = the store): a regular file is read as is, a symlink only when it
 * resolves under the store (else the read fails naming the file), a FIFO or
 * device never. So uncompressed chunks cost no stat at plan time; compressed
 * ones and shards are lstat'ed anyway (their size is needed) and a symlink
 * among them is resolved then too. (A store whose directories are rewritten
 * while it is read is outside this promise: the check and the open are two
 * steps.) */
static int key_ok(const char *k, size_t len) {
    if (!len || strlen(k) != len || k[0] == '/' || !ferry_utf8_valid(k, len)) return 0;
    for (const char *c = k;;) {
        const char *e = strchr(c, '/');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.')) return 0;
        if (!e) return 1;
        c = e + 1;
    }
}

/* 1: path resolves under the store root; 0: it does not exist (nothing to
 * read); a negative code (message set) when it leads outside the store: the
 * rule every multi-file format shares (inside.h). */
static int inside_store(const zarr_ds *z, const char *path) {
    if (z->rs) return 1;   /* a URL: keys are checked by key_ok, listed names are the bucket's own */
    return ferry_path_inside(z->root, path, "store");
}

/* What a plan has found out about chunk directories: the last one found
 * inside (realpath), and the last one known inside without it: the array's
 * directory (resolved inside once per plan; `base`, as the chunk paths spell
 * it) followed only by components that lstat showed to be real directories.
 * A real directory in a directory that resolves inside resolves inside (its
 * realpath is the parent's plus its name), and so does every prefix of such
 * a chain down from base — unlike the prefixes of a directory found inside
 * by realpath, which may have reached it through a link out and back in. */
typedef struct zarr_dirs {
    char inside[PATH_MAX];
    char known[PATH_MAX];
    const char *base;      /* NULL: the array's directory was not found inside */
    size_t baselen;
    struct zarr_prestat *pre;   /* lstats taken ahead for this call's chunks, or NULL */
    size_t pre_at;              /* the chunk being planned in pre, SIZE_MAX: none */
} zarr_dirs;

/* The chunks of one plan call, when there are many: the lstats of their
 * files and of their directories taken at once on several threads
 * (ferry_lstat_many) before the chunks are planned one by one, in the order
 * the layout visits them. A chunk takes a result only for the exact path it
 * was taken for, else it calls lstat itself: the checks below see what lstat
 * said either way, a few milliseconds earlier. */
typedef struct zarr_prestat {
    char **path;           /* chunk i: its file at 2i (NULL: not needed), its directory at 2i+1 (NULL: the one before's) */
    struct stat *st;
    int *err;
    size_t n, cur;         /* chunks listed; cur: the next one plain_chunk expects */
    char *buf_;            /* the paths' memory */
} zarr_prestat;
static void prestat_free(zarr_prestat *pre);

/* lstat, or the result taken ahead for the chunk being planned: slot 0 its
 * file, 1 its directory. */
static int z_lstat(const zarr_dirs *d, const char *path, int slot, struct stat *st) {
    if (d->pre && d->pre_at != SIZE_MAX) {
        size_t i = 2 * d->pre_at + (size_t)slot;
        const char *q = d->pre->path[i];
        if (q && !strcmp(q, path)) {
            if (d->pre->err[i]) { errno = d->pre->err[i]; return -1; }
            *st = d->pre->st[i];
            return 0;
        }
    }
    return ferry_sys()->lstat(path, st);
}

/* dir (dl bytes) inside, learnt with one lstat per component below the
 * longest prefix it shares with d->known (at least base): 1 yes (d->known
 * updated), 0 no such directory (nothing to read), 2 not shown (a component
 * is a symlink, or dir is not below base): realpath decides. Chunk keys
 * c/<t>/0/... put every time step in its own directory; a realpath of each, a
 * readlink per component of the whole path, was most of a many-chunk plan's
 * time (2 lstats now for c/<t>/0 after c/<t-1>/0). */
static int dir_known_inside(const char *dir, size_t dl, zarr_dirs *d) {
    size_t bl = d->baselen;
    if (!d->base || dl <= bl || strncmp(dir, d->base, bl) || dir[bl] != '/') return 2;
    size_t known = bl;   /* dir[0..known) is inside */
    const char *kn = d->known;
    if (!strncmp(kn, d->base, bl) && (kn[bl] == '/' || kn[bl] == 0))
        for (size_t i = bl; i <= dl; i++) {   /* kn's NUL ends the loop: dir has none before dl */
            if (kn[i] != (i < dl ? dir[i] : 0) && !(i == dl && kn[i] == '/')) break;
            if (i == dl || dir[i] == '/') known = i;
        }
    char tmp[PATH_MAX];
    memcpy(tmp, dir, dl);
    tmp[dl] = 0;
    for (size_t i = known + 1; i <= dl; i++) {
        if (i < dl && tmp[i] != '/') continue;
        tmp[i] = 0;
        struct stat st;
        int r = z_lstat(d, tmp, 1, &st);
        if (i < dl) tmp[i] = '/';
        if (r != 0) {
            if (errno == ENOENT || errno == ENOTDIR) return 0;
            return ferry_seterr(-errno, "%s: %s", tmp, strerror(errno));
        }
        if (!S_ISDIR(st.st_mode)) return 2;   /* a symlink (to a directory, or not one) */
    }
    memcpy(d->known, dir, dl);
    d->known[dl] = 0;
    return 1;
}

/* What a plan (ferry_plan_memo) knows of the arrays it read through earlier
 * calls: each array directory found inside the store (realpath: a readlink
 * per component of its path, a quarter of a batch's planning time
 * with 160 calls a plan) and the chunk directory last shown
 * inside below it. Keyed by the open's serial and the variable. */
typedef struct zarr_memo_ent {
    uint64_t serial;
    int var;
    char *known;           /* zarr_dirs.known after its last call; NULL: none yet */
} zarr_memo_ent;
typedef struct zarr_memo {
    zarr_memo_ent *e;
    size_t n, cap;
} zarr_memo;

static void zarr_memo_free(void *m_) {
    zarr_memo *m = m_;
    for (size_t i = 0; i < m->n; i++) free(m->e[i].known);
    free(m->e);
    free(m);
}

/* The plan's entry for (z, var): found, or added when add (NULL: none, or no memory: no memo). */
static zarr_memo_ent *zarr_memo_get(ferry_plan *plan, const zarr_ds *z, int var, int add) {
    zarr_memo *m = ferry_plan_memo(plan, &ferry_format_zarr);
    for (size_t i = 0; m && i < m->n; i++)
        if (m->e[i].serial == z->serial && m->e[i].var == var) return &m->e[i];
    if (!add) return NULL;
    if (!m) {
        if (!(m = calloc(1, sizeof *m))) return NULL;
        if (ferry_plan_set_memo(plan, &ferry_format_zarr, m, zarr_memo_free) < 0) { free(m); return NULL; }
    }
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 16;
        zarr_memo_ent *e = realloc(m->e, cap * sizeof *e);
        if (!e) return NULL;
        m->e = e;
        m->cap = cap;
    }
    m->e[m->n] = (zarr_memo_ent){z->serial, var, NULL};
    return &m->e[m->n++];
}

/* The directory of a chunk or shard file at plan time: 0 when it resolves
 * inside the store, 1 when it does not exist (nothing to read: the chunk is
 * absent), else a negative code. d caches what earlier chunks of the plan
 * showed, so a plan of many chunks resolves each directory once, most with an
 * lstat or two. */
static int chunk_dir_inside(const zarr_ds *z, const char *path, zarr_dirs *d) {
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) : 0;
    if (dl && dl < PATH_MAX && (strncmp(d->inside, path, dl) || d->inside[dl]) &&
        (strncmp(d->known, path, dl) || d->known[dl])) {
        int rc = dir_known_inside(path, dl, d);
        if (rc < 2) return rc < 0 ? rc : rc == 0 ? 1 : 0;
        char dir[PATH_MAX];
        memcpy(dir, path, dl);
        dir[dl] = 0;
        rc = inside_store(z, dir);
        if (rc <= 0) return rc < 0 ? rc : 1;
        memcpy(d->inside, dir, dl + 1);
    }
    return 0;
}

/* A chunk or shard file whose size the plan needs: 1 (present and inside,
 * *st filled), 0 (absent: a fill), or a negative code when it, or a directory
 * on its way, resolves outside the store: one lstat per chunk beyond the
 * directory check. (Its extents also carry FERRY_EXTENT_NOFOLLOW: a link
 * swapped in after the plan is checked again when the engine opens it.) */
static int chunk_inside(const zarr_ds *z, const char *path, zarr_dirs *okdir, struct stat *st) {
    if (z_lstat(okdir, path, 0, st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) return 0;
        return ferry_seterr(-errno, "%s: %s", path, strerror(errno));
    }
    int rc = chunk_dir_inside(z, path, okdir);
    if (rc < 0) return rc;
    if (rc == 1) return 0;   /* gone since the lstat */
    if (S_ISLNK(st->st_mode)) {
        rc = inside_store(z, path);
        if (rc <= 0) return rc;   /* a dangling link: absent */
        if (ferry_sys()->stat(path, st) != 0) return 0;
    }
    return 1;
}

static int is_file(const zarr_ds *z, const char *path) {
    const char *t;
    size_t n;
    /* an error (not a 404) counts as present: load_json asks again and reports it */
    if (z && z->rs) return ferry_zremote_doc(z->rs, path, ZARR_MAX_META, &t, &n) != 0;
    struct stat st;
    return ferry_sys()->stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int has_meta(const zarr_ds *z, const char *dir, const char *name) {
    char *p = join(dir, name);
    int r = p && is_file(z, p);
    free(p);
    return r;
}

/* Read a whole (small) file. -ENOENT when it does not exist. */
static int read_whole(ferry_ctx *ctx, const char *path, char **out, size_t *len) {
    ferry_file *f;
    *out = NULL;
    int rc = ferry_file_open(ctx, path, FERRY_READ, &f);
    if (rc < 0) return rc;
    int64_t sz = ferry_file_size(f);
    if (sz < 0) { ferry_file_close(f); return (int)sz; }
    if ((uint64_t)sz > ZARR_MAX_META) {
        ferry_file_close(f);
        return ferry_seterr(FERRY_EFORMAT, "%s: metadata of %lld bytes is too large", path, (long long)sz);
    }
    char *buf = malloc((size_t)sz + 1);
    if (!buf) { ferry_file_close(f); return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path); }
    int64_t got = sz ? ferry_pread(f, ferry_host_buf(buf, (size_t)sz), 0, (size_t)sz, FERRY_NO_DIRECT) : 0;
    ferry_file_close(f);
    if (got < 0) { free(buf); return (int)got; }
    buf[got] = 0;
    *out = buf;
    *len = (size_t)got;
    return 0;
}

/* A metadata document of the store at ds (refused when it resolves outside). */
static int load_json(ferry_dataset *ds, const char *path, ferry_json **out) {
    char *text = NULL; size_t len = 0;
    *out = NULL;
    int rc = inside_store(ds->fmt, path);
    if (rc < 0) return rc;
    zarr_ds *z = ds->fmt;
    if (z->rs) {   /* fetched once per open (is_file asked first) */
        const char *t;
        rc = ferry_zremote_doc(z->rs, path, ZARR_MAX_META, &t, &len);
        if (rc == 0) rc = ferry_seterr(-ENOENT, "%s: no such object", path);
        if (rc < 0) return rc;
        if (!(text = malloc(len + 1))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
        memcpy(text, t, len + 1);
    } else {
        rc = read_whole(ds->ctx, path, &text, &len);
    }
    if (rc < 0) return rc;
    rc = ferry_json_parse(text, len, path, 0, out);
    free(text);
    return rc;
}

static char *to_json(const ferry_json *v) {
    ferry_sbuf b = {0};
    ferry_sbuf_json_value(&b, v);
    return ferry_sbuf_take(&b);
}

/* An error in a metadata document: "<file>: byte <pos>: <what>". */
#define MERR(code, file, node, ...) meta_err(code, file, node, __VA_ARGS__)
__attribute__((format(printf, 4, 5)))
static int meta_err(int code, const char *file, const ferry_json *node, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (node) return ferry_seterr(code, "%s: byte %llu: %s", file, (unsigned long long)node->pos, msg);
    return ferry_seterr(code, "%s: %s", file, msg);
}

/* ---- keys a metadata document may hold ----------------------------------------
 * zarr-python refuses a document with a key it does not know (a flipped bit
 * in "attributes" or a codec's "level" is damage, not an extension): v3 top
 * level keys beyond the spec's must be objects with "must_understand": false
 * (the spec's extension rule); a known codec's configuration may hold only
 * that codec's parameters. */
static int in_list(const char *k, const char *const *allowed) {
    for (; *allowed; allowed++)
        if (!strcmp(k, *allowed)) return 1;
    return 0;
}

static int only_keys(const char *file, const ferry_json *obj, const char *const *allowed, const char *what) {
    if (!obj || obj->type != FERRY_JSON_OBJECT) return 0;
    for (size_t i = 0; i < obj->n; i++)
        if (!in_list(obj->items[i].key, allowed))
            return MERR(FERRY_EFORMAT, file, &obj->items[i], "%s: unknown key \"%s\"", what, obj->items[i].key);
    return 0;
}

static int v3_extensions_ok(const char *file, const ferry_json *doc, const char *const *known) {
    if (!doc || doc->type != FERRY_JSON_OBJECT) return 0;
    for (size_t i = 0; i < doc->n; i++) {
        const ferry_json *v = &doc->items[i];
        if (in_list(v->key, known)) continue;
        const ferry_json *mu = ferry_json_get(v, "must_understand");
        if (v->type != FERRY_JSON_OBJECT || !mu || mu->type != FERRY_JSON_BOOL || mu->boolean)
            return MERR(FERRY_EFORMAT, file, v, "unknown key \"%s\" (an extension must be an object with "
                        "\"must_understand\": false)", v->key);
    }
    return 0;
}

static const char *const V3_ARRAY_KEYS[] = {"zarr_format", "node_type", "shape", "data_type", "chunk_grid",
                                            "chunk_key_encoding", "fill_value", "codecs", "attributes",
                                            "storage_transformers", "dimension_names", NULL};
static const char *const V3_GROUP_KEYS[] = {"zarr_format", "node_type", "attributes", "consolidated_metadata", NULL};

/* The parameters of a v3 codec ferry knows (numcodecs.* take their own). */
static int v3_codec_config_ok(const char *file, const char *name, const ferry_json *entry, const ferry_json *cfg) {
    static const char *const entry_keys[] = {"name", "configuration", NULL};
    static const struct { const char *name; const char *keys[6]; } t[] = {
        {"bytes", {"endian", NULL}},
        {"transpose", {"order", NULL}},
        {"gzip", {"level", NULL}},
        {"zstd", {"level", "checksum", NULL}},
        {"crc32c", {NULL}},
        {"blosc", {"typesize", "cname", "clevel", "shuffle", "blocksize", NULL}},
        {"sharding_indexed", {"chunk_shape", "codecs", "index_codecs", "index_location", NULL}},
    };
    if (entry->type == FERRY_JSON_OBJECT) {
        int rc = only_keys(file, entry, entry_keys, "codec");
        if (rc < 0) return rc;
    }
    if (cfg && cfg->type != FERRY_JSON_OBJECT)
        return MERR(FERRY_EFORMAT, file, cfg, "codec \"%s\": configuration must be an object", name);
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (!strcmp(name, t[i].name)) {
            char what[64];
            snprintf(what, sizeof what, "codec \"%s\" configuration", name);
            return only_keys(file, cfg, t[i].keys, what);
        }
    return 0;
}

/* ---- dtypes ------------------------------------------------------------------ */

/* v3 data_type names -> numpy kind and size (endianness comes from `bytes`). */
static int v3_dtype(const char *name, char *kind, uint32_t *size) {
    static const struct { const char *n; char k; uint32_t s; } t[] = {
        {"bool", 'b', 1}, {"int8", 'i', 1}, {"int16", 'i', 2}, {"int32", 'i', 4}, {"int64", 'i', 8},
        {"uint8", 'u', 1}, {"uint16", 'u', 2}, {"uint32", 'u', 4}, {"uint64", 'u', 8},
        {"float16", 'f', 2}, {"float32", 'f', 4}, {"float64", 'f', 8},
        {"complex64", 'c', 8}, {"complex128", 'c', 16},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (!strcmp(name, t[i].n)) { *kind = t[i].k; *size = t[i].s; return 0; }
    return -1;
}

/* ---- fill values ------------------------------------------------------------- */

static uint16_t f64_to_f16(double d) {
    float f = (float)d;
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, mant = x & 0x7fffff;
    int32_t exp = (int32_t)((x >> 23) & 0xff);
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    int32_t e = exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {   /* subnormal half, rounded to nearest even */
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e), half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
    return (uint16_t)half;
}

/* A float fill: a number, "NaN", "Infinity", "-Infinity", or (v3) "0x..."
 * giving the bits. Writes `size` bytes little-endian. */
static int fill_float(const ferry_json *v, uint32_t size, uint8_t *out) {
    double d;
    if (v->type == FERRY_JSON_NUMBER) d = v->num;
    else if (v->type == FERRY_JSON_STRING) {
        const char *s = v->str;
        if (!strcmp(s, "NaN")) d = NAN;
        else if (!strcmp(s, "Infinity")) d = INFINITY;
        else if (!strcmp(s, "-Infinity")) d = -INFINITY;
        else if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
            if (v->len != 2 + 2 * (size_t)size) return -1;
            uint64_t bits = 0;
            for (size_t i = 2; i < v->len; i++) {
                char c = s[i];
                int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
                if (h < 0) return -1;
                bits = bits << 4 | (uint64_t)h;
            }
            for (uint32_t i = 0; i < size; i++) out[i] = (uint8_t)(bits >> (8 * i));
            return 0;
        } else return -1;
    } else return -1;
    if (size == 8) memcpy(out, &d, 8);
    else if (size == 4) { float f = (float)d; memcpy(out, &f, 4); }
    else { uint16_t h = f64_to_f16(d); memcpy(out, &h, 2); }
    return 0;
}

static int b64val(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
}

/* The fill element (little-endian, itemsize bytes) from its JSON. null: zeros. */
static int parse_fill(const ferry_json *v, char kind, uint32_t itemsize, uint8_t *out) {
    memset(out, 0, 16);
    if (!v || v->type == FERRY_JSON_NULL) return 0;
    switch (kind) {
    case 'b':
        if (v->type == FERRY_JSON_BOOL) { out[0] = (uint8_t)v->boolean; return 0; }
        if (v->type == FERRY_JSON_NUMBER) { out[0] = v->num != 0; return 0; }
        return -1;
    case 'i': case 'M': case 'm': {
        int64_t x;
        if (v->type == FERRY_JSON_STRING && (kind == 'M' || kind == 'm') && !strcmp(v->str, "NaT")) x = INT64_MIN;
        else if (ferry_json_i64(v, &x) < 0) {
            if (v->type != FERRY_JSON_NUMBER || v->num != floor(v->num) || fabs(v->num) > 9.2e18) return -1;
            x = (int64_t)v->num;   /* written as 5.0 by some writers */
        }
        for (uint32_t i = 0; i < itemsize && i < 8; i++) out[i] = (uint8_t)((uint64_t)x >> (8 * i));
        return 0;
    }
    case 'u': {
        uint64_t x;
        if (ferry_json_u64(v, &x) < 0) {
            if (v->type != FERRY_JSON_NUMBER || v->num != floor(v->num) || v->num < 0 || v->num > 1.8e19) return -1;
            x = (uint64_t)v->num;
        }
        for (uint32_t i = 0; i < itemsize && i < 8; i++) out[i] = (uint8_t)(x >> (8 * i));
        return 0;
    }
    case 'f': return fill_float(v, itemsize, out);
    case 'c':
        if (v->type == FERRY_JSON_ARRAY && v->n == 2)
            return fill_float(&v->items[0], itemsize / 2, out) || fill_float(&v->items[1], itemsize / 2, out + itemsize / 2) ? -1 : 0;
        if (fill_float(v, itemsize / 2, out) < 0) return -1;   /* a real number: imaginary part 0 */
        return 0;
    case 'S': case 'V': {   /* base64 of the bytes (v2); at most 16 are kept */
        if (v->type == FERRY_JSON_NUMBER && v->num == 0) return 0;
        if (v->type != FERRY_JSON_STRING) return -1;
        uint32_t acc = 0, nb = 0, o = 0;
        for (size_t i = 0; i < v->len; i++) {
            if (v->str[i] == '=') break;
            int x = b64val(v->str[i]);
            if (x < 0) return -1;
            acc = acc << 6 | (uint32_t)x; nb += 6;
            if (nb >= 8) { nb -= 8; if (o < itemsize && o < 16) out[o] = (uint8_t)(acc >> nb); o++; }
        }
        return itemsize > 16 && o ? -2 : 0;
    }
    }
    return -1;
}

/* ---- codec chains ------------------------------------------------------------ */

typedef struct chain_builder {
    ferry_codec c[FERRY_MAX_CODECS * 2];
    int n;
    ferry_sbuf desc;
} chain_builder;

static int chain_push(chain_builder *b, uint32_t id, uint32_t param) {
    if (b->n >= FERRY_MAX_CODECS) return -1;
    b->c[b->n].id = id;
    b->c[b->n].param = param;
    b->n++;
    return 0;
}

static const char *json_name(const ferry_json *c, const char *key) {
    const char *s = ferry_json_str(ferry_json_get(c, key));
    return s ? s : "";
}

/* blosc's inner codec must be one we decode */
static int blosc_cname_ok(const char *cname) {
    return !strcmp(cname, "blosclz") || !strcmp(cname, "lz4") || !strcmp(cname, "lz4hc") || !strcmp(cname, "zlib") ||
           !strcmp(cname, "zstd");
}

/* A bytes->bytes codec (v3 name or numcodecs id) -> ferry codec step.
 * Returns 0, or -1 (unsupported; *why set). */
static int bytes_codec(const char *id, const ferry_json *cfg, uint32_t itemsize, uint32_t *cid, uint32_t *param,
                       const char **why) {
    *param = 0;
    if (!strncmp(id, "numcodecs.", 10)) id += 10;
    if (!strcmp(id, "zlib")) *cid = FERRY_CODEC_ZLIB;
    else if (!strcmp(id, "gzip")) *cid = FERRY_CODEC_GZIP;
    else if (!strcmp(id, "zstd")) *cid = FERRY_CODEC_ZSTD;
    else if (!strcmp(id, "lz4")) *cid = FERRY_CODEC_LZ4;
    else if (!strcmp(id, "crc32c")) *cid = FERRY_CODEC_CRC32C;
    else if (!strcmp(id, "blosc")) {
        const char *cname = json_name(cfg, "cname");
        if (*cname && !blosc_cname_ok(cname)) {
            *why = !strcmp(cname, "snappy") ? "its inner codec snappy is not supported (blosclz, lz4, lz4hc, zlib, zstd are)"
                 : "its inner codec is not supported (blosclz, lz4, lz4hc, zlib, zstd are)";
            return -1;
        }
        *cid = FERRY_CODEC_BLOSC;
    } else if (!strcmp(id, "shuffle")) {
        uint64_t es = itemsize;
        const ferry_json *e = ferry_json_get(cfg, "elementsize");
        if (e && (ferry_json_u64(e, &es) < 0 || es == 0 || es > (1u << 20))) { *why = "shuffle with a bad elementsize"; return -1; }
        *cid = FERRY_CODEC_SHUFFLE;
        *param = (uint32_t)es;
    } else { *why = NULL; return -1; }
    return 0;
}

/* ---- the array description ------------------------------------------------- */

static void arr_free(zarr_arr *a) {
    free(a->name); free(a->dir); free(a->typestr); free(a->dims_json); free(a->attrs_json);
    free(a->fill_json); free(a->codecs_desc); free(a->err);
}

/* Byte position of a metadata node, or of its parent when it is absent. */
static unsigned long long pos_of(const ferry_json *node, const ferry_json *parent) {
    return (unsigned long long)(node ? node->pos : parent ? parent->pos : 0);
}

/* Record why an array cannot be read and go on parsing: the array keeps the
 * rest of its description (shape, chunks, dims, attributes, fill, dtype as
 * written) and every read of it fails with this message. The first reason
 * found is the one kept. Returns 0, or FERRY_ENOMEM. */
__attribute__((format(printf, 2, 3)))
static int arr_unsupported(zarr_arr *a, const char *fmt, ...) {
    if (a->err) return 0;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!(a->err = strdup(msg))) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    return 0;
}
#define UNSUP(...) do { int unsup_rc_ = arr_unsupported(a, __VA_ARGS__); if (unsup_rc_ < 0) return unsup_rc_; } while (0)

static int parse_shape(const char *file, const ferry_json *v, const char *what, uint64_t *out, int *ndim) {
    if (!v || v->type != FERRY_JSON_ARRAY) return MERR(FERRY_EFORMAT, file, v, "%s must be an array of integers", what);
    if (v->n > FERRY_MAX_DIMS) return MERR(FERRY_EUNSUPPORTED, file, v, "%s has %zu dimensions (at most %d)", what, v->n, FERRY_MAX_DIMS);
    for (size_t i = 0; i < v->n; i++)
        if (ferry_json_u64(&v->items[i], &out[i]) < 0 || out[i] > (uint64_t)INT64_MAX)
            return MERR(FERRY_EFORMAT, file, &v->items[i], "%s[%zu] is not a non-negative integer", what, i);
    if (*ndim >= 0 && (int)v->n != *ndim)
        return MERR(FERRY_EFORMAT, file, v, "%s has %zu entries, the array has %d dimensions", what, v->n, *ndim);
    *ndim = (int)v->n;
    return 0;
}

/* What needs only the shape: attributes, dimension names (`dims`: v3
 * dimension_names, or NULL to take _ARRAY_DIMENSIONS from v2 attributes) and
 * the fill value as written. Collected before the dtype and codecs, so an
 * array that cannot be read is still described. */
static int collect_desc(zarr_arr *a, const ferry_json *attrs, const ferry_json *dims, const ferry_json *fill) {
    if (attrs && attrs->type == FERRY_JSON_OBJECT && !(a->attrs_json = to_json(attrs))) return FERRY_ENOMEM;
    if (!dims) dims = ferry_json_get(attrs, "_ARRAY_DIMENSIONS");
    if (dims && dims->type == FERRY_JSON_ARRAY && (int)dims->n == a->ndim && !(a->dims_json = to_json(dims)))
        return FERRY_ENOMEM;
    if (!(a->fill_json = to_json(fill ? fill : &(ferry_json){0}))) return FERRY_ENOMEM;
    return 0;
}

/* The numpy typestr of a known kind/size/endianness ("<f4", "|b1", "<M8[ns]"). */
static int set_typestr(zarr_arr *a, const char *file, char kind, int big, const char *unit) {
    char ts[64];
    char order = (a->itemsize == 1 && kind != 'c') ? '|' : big ? '>' : '<';
    snprintf(ts, sizeof ts, "%c%c%u%s", order, kind, a->itemsize, unit ? unit : "");
    free(a->typestr);
    if (!(a->typestr = strdup(ts))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
    return 0;
}

/* Check the chunk's byte size fits (skipped when the grid is not regular:
 * there the chunk shape reported is the whole shape). */
static int finish_common(zarr_arr *a, const char *file) {
    if (a->irregular) return 0;
    uint64_t n = a->itemsize;
    const uint64_t *cs = a->sharded ? a->inner : a->chunk;
    for (int k = 0; k < a->ndim; k++) {
        if (cs[k] == 0 || a->chunk[k] == 0)
            return ferry_seterr(FERRY_EFORMAT, "%s: chunk shape has a zero dimension", file);
        if (ferry_mul_overflow(n, cs[k], &n) || n > ((uint64_t)1 << 40))
            return ferry_seterr(FERRY_EFORMAT, "%s: chunk byte size overflows", file);
    }
    return 0;
}

/* ---- v2 ----------------------------------------------------------------------- */

static int parse_v2(zarr_arr *a, const char *file, const ferry_json *za, const ferry_json *attrs) {
    if (!za || za->type != FERRY_JSON_OBJECT) return MERR(FERRY_EFORMAT, file, za, ".zarray must be an object");
    uint64_t zf;
    if (ferry_json_u64(ferry_json_get(za, "zarr_format"), &zf) < 0 || zf != 2)
        return MERR(FERRY_EFORMAT, file, za, "zarr_format must be 2");
    a->zf = 2;
    a->ndim = -1;
    int rc = parse_shape(file, ferry_json_get(za, "shape"), "shape", a->shape, &a->ndim);
    if (rc < 0) return rc;
    if ((rc = parse_shape(file, ferry_json_get(za, "chunks"), "chunks", a->chunk, &a->ndim)) < 0) return rc;
    if (attrs && attrs->type != FERRY_JSON_OBJECT) return MERR(FERRY_EFORMAT, file, attrs, ".zattrs must be an object");
    const ferry_json *fv = ferry_json_get(za, "fill_value");
    /* required by the v2 spec (null is a value): reading missing chunks as 0
     * for a key that is absent would invent data zarr-python refuses to */
    if (!fv) return MERR(FERRY_EFORMAT, file, za, "no fill_value (required; null means none)");
    if ((rc = collect_desc(a, attrs, NULL, fv)) < 0) return ferry_seterr(rc, "%s: out of memory", file);
    const char *order = json_name(za, "order");
    if (*order && strcmp(order, "C") && strcmp(order, "F"))
        return MERR(FERRY_EFORMAT, file, ferry_json_get(za, "order"), "order must be \"C\" or \"F\"");
    a->fortran = *order == 'F';
    for (int k = 0; k < a->ndim; k++) a->perm[k] = a->fortran ? a->ndim - 1 - k : k;
    const ferry_json *sepj = ferry_json_get(za, "dimension_separator");
    a->sep = '.';
    if (sepj && sepj->type != FERRY_JSON_NULL) {
        const char *s = ferry_json_str(sepj);
        if (!s || (strcmp(s, ".") && strcmp(s, "/")))
            return MERR(FERRY_EFORMAT, file, sepj, "dimension_separator must be \".\" or \"/\"");
        a->sep = s[0];
    }

    /* the dtype, kept as written even when ferry cannot read it */
    const ferry_json *dt = ferry_json_get(za, "dtype");
    if (!dt) return MERR(FERRY_EFORMAT, file, za, "no dtype");
    char kind = 0;
    ferry_dtype fdt;
    a->typestr = dt->type == FERRY_JSON_STRING ? xstrdup(dt->str) : to_json(dt);
    if (!a->typestr) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
    if (dt->type != FERRY_JSON_STRING) {
        a->itemsize = 1;   /* unknown; reads fail before using it */
        UNSUP("%s: byte %llu: structured dtype %s is not supported", file, pos_of(dt, za), a->typestr);
    } else if (ferry_typestr_parse(dt->str, strlen(dt->str), &fdt, &a->itemsize, &a->swap) < 0) {
        a->itemsize = 1;
        a->swap = 0;
        UNSUP("%s: byte %llu: dtype \"%s\" is not supported", file, pos_of(dt, za), dt->str);
    } else {
        kind = dt->str[1];
        if (parse_fill(fv, kind, a->itemsize, a->fill) < 0)
            return MERR(FERRY_EFORMAT, file, fv, "fill_value does not suit dtype %s", dt->str);
        a->has_fill = fv->type != FERRY_JSON_NULL;
    }

    /* decoding: compressor first, then the filters in reverse order */
    chain_builder b = {0};
    const ferry_json *comp = ferry_json_get(za, "compressor");
    const ferry_json *filters = ferry_json_get(za, "filters");
    if (filters && filters->type != FERRY_JSON_NULL && filters->type != FERRY_JSON_ARRAY)
        return MERR(FERRY_EFORMAT, file, filters, "filters must be null or an array");
    /* required by the v2 spec (null: uncompressed): a document without it,
     * say one whose key lost a byte, would read compressed bytes as values */
    if (!comp) return MERR(FERRY_EFORMAT, file, za, "no \"compressor\" key (required; null means uncompressed)");
    if (comp->type != FERRY_JSON_NULL && comp->type != FERRY_JSON_OBJECT)
        return MERR(FERRY_EFORMAT, file, comp, "compressor must be null or an object");
    size_t nf = filters && filters->type == FERRY_JSON_ARRAY ? filters->n : 0;
    for (size_t i = 0; i < nf; i++) {   /* description in storage order */
        const char *id = json_name(&filters->items[i], "id");
        ferry_sbuf_printf(&b.desc, "%s%s", b.desc.len ? " " : "", *id ? id : "?");
    }
    if (comp && comp->type == FERRY_JSON_OBJECT) {
        const char *id = json_name(comp, "id");
        if (!strcmp(id, "blosc"))
            ferry_sbuf_printf(&b.desc, "%sblosc(%s,%s)", b.desc.len ? " " : "", json_name(comp, "cname"),
                              ferry_json_get(comp, "shuffle") && ferry_json_get(comp, "shuffle")->num == 2 ? "bitshuffle"
                              : ferry_json_get(comp, "shuffle") && ferry_json_get(comp, "shuffle")->num == 0 ? "noshuffle" : "shuffle");
        else ferry_sbuf_printf(&b.desc, "%s%s", b.desc.len ? " " : "", *id ? id : "?");
    }
    a->codecs_desc = ferry_sbuf_take(&b.desc);
    if (comp && comp->type == FERRY_JSON_OBJECT) {
        const char *id = json_name(comp, "id"), *why = NULL;
        uint32_t cid, param;
        if (bytes_codec(id, comp, a->itemsize, &cid, &param, &why) < 0 || cid == FERRY_CODEC_SHUFFLE)
            UNSUP("%s: byte %llu: compressor \"%s\" is not supported%s%s", file, (unsigned long long)comp->pos, id,
                  why ? ": " : "", why ? why : "");
        else chain_push(&b, cid, param);
    }
    for (size_t i = nf; i-- > 0;) {
        const ferry_json *f = &filters->items[i];
        const char *id = json_name(f, "id"), *why = NULL;
        uint32_t cid, param;
        /* any codec numcodecs applies as a filter: kerchunk's netCDF-4
         * references list [shuffle, zlib] as filters with no compressor */
        if (bytes_codec(id, f, a->itemsize, &cid, &param, &why) < 0)
            UNSUP("%s: byte %llu: filter \"%s\" is not supported%s%s", file, (unsigned long long)f->pos, id,
                  why ? ": " : "", why ? why : "");
        else if (chain_push(&b, cid, param) < 0)
            UNSUP("%s: byte %llu: more than %d codecs", file, (unsigned long long)filters->pos, FERRY_MAX_CODECS);
    }
    a->ncodecs = b.n;
    memcpy(a->codecs, b.c, sizeof a->codecs);
    return finish_common(a, file);
}

/* ---- v3 ----------------------------------------------------------------------- */

/* Named codec entry: {"name": ..., "configuration": {...}} (or a bare string). */
static const char *codec_entry(const ferry_json *c, const ferry_json **cfg) {
    *cfg = NULL;
    if (c->type == FERRY_JSON_STRING) return c->str;
    if (c->type != FERRY_JSON_OBJECT) return NULL;
    *cfg = ferry_json_get(c, "configuration");
    return ferry_json_str(ferry_json_get(c, "name"));
}

/* Parse a v3 codec list into: layout perm (transpose), endianness, and the
 * bytes->bytes chain in decoding order. Sharding recurses once. A codec ferry
 * lacks marks the array unreadable and the rest of the list is still read
 * (for the description); since an unknown codec may be the array->bytes one,
 * a list without a known one is then no error. */
static int parse_v3_codecs(zarr_arr *a, const char *file, const ferry_json *list, int inner, chain_builder *b,
                           int *big) {
    if (!list || list->type != FERRY_JSON_ARRAY || list->n == 0)
        return MERR(FERRY_EFORMAT, file, list, "codecs must be a non-empty array");
    int stage = 0;   /* 0 array->array, 1 after array->bytes */
    int unknown = 0;
    ferry_codec bb[FERRY_MAX_CODECS];
    int nbb = 0;
    for (size_t i = 0; i < list->n; i++) {
        const ferry_json *cfg;
        const char *name = codec_entry(&list->items[i], &cfg);
        const ferry_json *at = &list->items[i];
        unsigned long long pos = (unsigned long long)at->pos;
        if (!name) return MERR(FERRY_EFORMAT, file, at, "codec without a name");
        int crc = v3_codec_config_ok(file, name, at, cfg);
        if (crc < 0) return crc;
        ferry_sbuf_printf(&b->desc, "%s%s", b->desc.len && b->desc.p[b->desc.len - 1] != '[' ? " " : "", name);
        if (!strcmp(name, "transpose")) {
            if (stage) return MERR(FERRY_EFORMAT, file, at, "transpose after the array->bytes codec");
            if (!inner && a->sharded) return MERR(FERRY_EFORMAT, file, at, "transpose after sharding");
            const ferry_json *ord = ferry_json_get(cfg, "order");
            int p[FERRY_MAX_DIMS];
            if (ord && ord->type == FERRY_JSON_STRING && (!strcmp(ord->str, "C") || !strcmp(ord->str, "F"))) {
                for (int k = 0; k < a->ndim; k++) p[k] = ord->str[0] == 'F' ? a->ndim - 1 - k : k;
            } else {
                if (!ord || ord->type != FERRY_JSON_ARRAY || (int)ord->n != a->ndim)
                    return MERR(FERRY_EFORMAT, file, at, "transpose order must list every dimension once");
                int seen[FERRY_MAX_DIMS] = {0};
                for (int k = 0; k < a->ndim; k++) {
                    uint64_t v;
                    if (ferry_json_u64(&ord->items[k], &v) < 0 || v >= (uint64_t)a->ndim || seen[v])
                        return MERR(FERRY_EFORMAT, file, at, "transpose order must list every dimension once");
                    seen[v] = 1;
                    p[k] = (int)v;
                }
            }
            /* transposes compose: decoded = logical.transpose(perm) */
            int np[FERRY_MAX_DIMS];
            for (int k = 0; k < a->ndim; k++) np[k] = a->perm[p[k]];
            memcpy(a->perm, np, sizeof np);
        } else if (!strcmp(name, "bytes")) {
            if (stage) return MERR(FERRY_EFORMAT, file, at, "two array->bytes codecs");
            stage = 1;
            const char *e = json_name(cfg, "endian");
            if (*e && strcmp(e, "little") && strcmp(e, "big"))
                return MERR(FERRY_EFORMAT, file, at, "bytes: endian must be \"little\" or \"big\"");
            *big = !strcmp(e, "big");
        } else if (!strcmp(name, "sharding_indexed")) {
            if (stage) return MERR(FERRY_EFORMAT, file, at, "two array->bytes codecs");
            stage = 1;
            if (inner) {   /* not descended into */
                UNSUP("%s: byte %llu: nested sharding is not supported", file, pos);
                continue;
            }
            for (int k = 0; k < a->ndim; k++)
                if (a->perm[k] != k) {
                    UNSUP("%s: byte %llu: transpose before sharding_indexed is not supported", file, pos);
                    break;
                }
            a->sharded = 1;
            int nd = a->ndim;
            int rc = parse_shape(file, ferry_json_get(cfg, "chunk_shape"), "sharding chunk_shape", a->inner, &nd);
            if (rc < 0) return rc;
            for (int k = 0; k < a->ndim; k++)
                if (a->inner[k] == 0 || (!a->irregular && a->chunk[k] % a->inner[k]))
                    return MERR(FERRY_EFORMAT, file, at, "sharding: inner chunk shape must divide the shard shape");
            const char *loc = json_name(cfg, "index_location");
            if (*loc && strcmp(loc, "start") && strcmp(loc, "end"))
                return MERR(FERRY_EFORMAT, file, at, "sharding: index_location must be \"start\" or \"end\"");
            a->index_at_start = !strcmp(loc, "start");
            /* index codecs: bytes (either endian), then optionally crc32c */
            const ferry_json *ic = ferry_json_get(cfg, "index_codecs");
            if (!ic || ic->type != FERRY_JSON_ARRAY || ic->n == 0)
                return MERR(FERRY_EFORMAT, file, at, "sharding: index_codecs must be a non-empty array");
            for (size_t j = 0; j < ic->n; j++) {
                const ferry_json *icfg;
                const char *in = codec_entry(&ic->items[j], &icfg);
                if (in && !strcmp(in, "bytes") && j == 0) a->index_big = !strcmp(json_name(icfg, "endian"), "big");
                else if (in && !strcmp(in, "crc32c") && j == 1) a->index_crc = 1;
                else UNSUP("%s: byte %llu: shard index codec \"%s\" is not supported", file,
                           (unsigned long long)ic->items[j].pos, in ? in : "?");
            }
            ferry_sbuf_puts(&b->desc, "[");
            rc = parse_v3_codecs(a, file, ferry_json_get(cfg, "codecs"), 1, b, big);
            ferry_sbuf_puts(&b->desc, "]");
            if (rc < 0) return rc;
        } else {
            uint32_t cid, param;
            const char *why = NULL;
            if (!stage) {   /* an array->array (or array->bytes) codec ferry lacks */
                unknown = 1;
                UNSUP("%s: byte %llu: codec \"%s\" is not supported", file, pos, name);
            } else if (bytes_codec(name, cfg, a->itemsize, &cid, &param, &why) < 0) {
                unknown = 1;
                UNSUP("%s: byte %llu: codec \"%s\" is not supported%s%s", file, pos, name, why ? ": " : "",
                      why ? why : "");
            } else if (a->sharded && !inner) {
                UNSUP("%s: byte %llu: codec \"%s\" applied to whole shards is not supported", file, pos, name);
            } else if (nbb >= FERRY_MAX_CODECS) {
                UNSUP("%s: byte %llu: more than %d codecs", file, pos, FERRY_MAX_CODECS);
            } else {
                bb[nbb].id = cid;
                bb[nbb].param = param;
                nbb++;
            }
        }
    }
    if (!stage && !unknown) return MERR(FERRY_EFORMAT, file, list, "no array->bytes codec (bytes or sharding_indexed)");
    /* decoding order: the bytes->bytes codecs reversed */
    if (inner || !a->sharded)
        for (int k = nbb; k-- > 0;)
            if (chain_push(b, bb[k].id, bb[k].param) < 0) {
                UNSUP("%s: byte %llu: more than %d codecs", file, (unsigned long long)list->pos, FERRY_MAX_CODECS);
                break;
            }
    return 0;
}

static int parse_v3_array(zarr_arr *a, const char *file, const ferry_json *m) {
    static const char *const grid_keys[] = {"name", "configuration", NULL}, *const shape_key[] = {"chunk_shape", NULL},
                             *const sep_key[] = {"separator", NULL};
    a->zf = 3;
    a->ndim = -1;
    int rc = v3_extensions_ok(file, m, V3_ARRAY_KEYS);
    if (rc < 0) return rc;
    const ferry_json *at = ferry_json_get(m, "attributes");
    if (at && at->type != FERRY_JSON_OBJECT) return MERR(FERRY_EFORMAT, file, at, "attributes must be an object");
    const ferry_json *g0 = ferry_json_get(m, "chunk_grid"), *k0 = ferry_json_get(m, "chunk_key_encoding");
    if ((rc = only_keys(file, g0, grid_keys, "chunk_grid")) < 0 || (rc = only_keys(file, k0, grid_keys, "chunk_key_encoding")) < 0)
        return rc;
    if (!strcmp(json_name(g0, "name"), "regular") &&
        (rc = only_keys(file, ferry_json_get(g0, "configuration"), shape_key, "chunk_grid configuration")) < 0)
        return rc;
    if ((!strcmp(json_name(k0, "name"), "default") || !strcmp(json_name(k0, "name"), "v2")) &&
        (rc = only_keys(file, ferry_json_get(k0, "configuration"), sep_key, "chunk_key_encoding configuration")) < 0)
        return rc;
    rc = parse_shape(file, ferry_json_get(m, "shape"), "shape", a->shape, &a->ndim);
    if (rc < 0) return rc;
    for (int k = 0; k < a->ndim; k++) a->perm[k] = k;
    const ferry_json *fv = ferry_json_get(m, "fill_value");
    if ((rc = collect_desc(a, ferry_json_get(m, "attributes"), ferry_json_get(m, "dimension_names"), fv)) < 0)
        return ferry_seterr(rc, "%s: out of memory", file);
    const ferry_json *grid = ferry_json_get(m, "chunk_grid");
    if (!strcmp(json_name(grid, "name"), "regular")) {
        if ((rc = parse_shape(file, ferry_json_get(ferry_json_get(grid, "configuration"), "chunk_shape"), "chunk_shape",
                              a->chunk, &a->ndim)) < 0)
            return rc;
    } else {   /* described as one chunk */
        a->irregular = 1;
        memcpy(a->chunk, a->shape, sizeof a->chunk);
        UNSUP("%s: byte %llu: chunk grid \"%s\" is not supported (only regular)", file, pos_of(grid, m),
              json_name(grid, "name"));
    }
    const ferry_json *cke = ferry_json_get(m, "chunk_key_encoding");
    const char *ck = json_name(cke, "name");
    const char *sep = json_name(ferry_json_get(cke, "configuration"), "separator");
    if (!strcmp(ck, "default")) { a->c_prefix = 1; a->sep = '/'; }
    else if (!strcmp(ck, "v2")) { a->c_prefix = 0; a->sep = '.'; }
    else UNSUP("%s: byte %llu: chunk_key_encoding \"%s\" is not supported", file, pos_of(cke, m), ck);
    if (*sep && a->sep) {
        if (strcmp(sep, "/") && strcmp(sep, ".")) return MERR(FERRY_EFORMAT, file, cke, "separator must be \"/\" or \".\"");
        a->sep = sep[0];
    }
    const ferry_json *st = ferry_json_get(m, "storage_transformers");
    if (st && st->type == FERRY_JSON_ARRAY && st->n)
        UNSUP("%s: byte %llu: storage transformers are not supported", file, (unsigned long long)st->pos);
    const ferry_json *dt = ferry_json_get(m, "data_type");
    const char *dname = ferry_json_str(dt);
    if (!dname && dt && dt->type == FERRY_JSON_OBJECT) dname = json_name(dt, "name");
    char kind = 0;
    char unit[40] = "";
    if (dname && (!strcmp(dname, "numpy.datetime64") || !strcmp(dname, "numpy.timedelta64"))) {
        /* {"name": "numpy.datetime64", "configuration": {"unit": "ns", "scale_factor": 1}} */
        const ferry_json *cfg = ferry_json_get(dt, "configuration");
        const char *u = json_name(cfg, "unit");
        uint64_t scale = 1;
        const ferry_json *sf = ferry_json_get(cfg, "scale_factor");
        size_t ul = strlen(u);
        int ok = ul > 0 && ul < 12 && (!sf || (ferry_json_u64(sf, &scale) == 0 && scale >= 1 && scale < 1000000000));
        for (size_t i = 0; ok && i < ul; i++) ok = (u[i] >= 'a' && u[i] <= 'z') || (u[i] >= 'A' && u[i] <= 'Z');
        if (!ok) return MERR(FERRY_EFORMAT, file, dt, "%s: bad unit or scale_factor", dname);
        if (scale > 1) snprintf(unit, sizeof unit, "[%llu%s]", (unsigned long long)scale, u);
        else snprintf(unit, sizeof unit, "[%s]", u);
        kind = dname[6] == 'd' ? 'M' : 'm';
        a->itemsize = 8;
    } else if (!dname || v3_dtype(dname, &kind, &a->itemsize) < 0) {
        /* kept as written: the name, or the whole JSON of a configured type */
        kind = 0;
        a->itemsize = 1;   /* unknown; reads fail before using it */
        a->typestr = !dt ? xstrdup("?") : dt->type == FERRY_JSON_STRING ? xstrdup(dt->str) : to_json(dt);
        if (!a->typestr) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
        UNSUP("%s: byte %llu: data_type \"%s\" is not supported", file, pos_of(dt, m), dname ? dname : "?");
    }
    /* little-endian until the codecs say otherwise */
    if (kind && (rc = set_typestr(a, file, kind, 0, unit)) < 0) return rc;
    chain_builder b = {0};
    int big = 0;
    rc = parse_v3_codecs(a, file, ferry_json_get(m, "codecs"), 0, &b, &big);
    a->codecs_desc = ferry_sbuf_take(&b.desc);
    if (rc < 0) return rc;
    a->ncodecs = b.n;
    memcpy(a->codecs, b.c, sizeof a->codecs);
    if (kind) {
        uint32_t elem = kind == 'c' ? a->itemsize / 2 : a->itemsize;
        a->swap = big && elem > 1 ? elem : 0;
        if (big && (rc = set_typestr(a, file, kind, 1, unit)) < 0) return rc;
        if (parse_fill(fv, kind, a->itemsize, a->fill) < 0)
            return MERR(FERRY_EFORMAT, file, fv, "fill_value does not suit data_type %s", dname);
        a->has_fill = fv && fv->type != FERRY_JSON_NULL;
    }
    return finish_common(a, file);
}

/* ---- nodes, groups ------------------------------------------------------------ */

typedef struct open_ctx {
    ferry_dataset *ds;
    zarr_ds *z;
    int capv;
    ferry_sbuf groups;   /* JSON array being built */
    int ngroups;
    char **gnames;
} open_ctx;

/* Parse one array's metadata. Malformed metadata fails the open; an array
 * ferry cannot read (a->err) is kept, described as far as its metadata goes,
 * and fails at plan time, so its neighbours in a group stay readable and
 * `ferry info` still shows it. */
static int add_array(open_ctx *o, const char *name, const char *dir, const char *file, int zf,
                     const ferry_json *meta, const ferry_json *attrs) {
    zarr_ds *z = o->z;
    int rc = inside_store(z, dir);
    if (rc < 0) return rc;
    if (z->narrs == o->capv) {
        int nc = o->capv ? o->capv * 2 : 8;
        zarr_arr *na = realloc(z->arrs, (size_t)nc * sizeof *na);
        if (!na) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
        z->arrs = na;
        o->capv = nc;
    }
    zarr_arr *a = &z->arrs[z->narrs++];
    memset(a, 0, sizeof *a);
    a->name = xstrdup(name);
    a->dir = xstrdup(dir);
    if (!a->name || !a->dir) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
    rc = zf == 2 ? parse_v2(a, file, meta, attrs) : parse_v3_array(a, file, meta);
    /* malformed metadata after something unsupported: the array is unreadable
     * either way; keep it with the first reason, as a group keeps it */
    if (rc < 0 && (!a->err || rc == FERRY_ENOMEM)) return rc;
    if (rc < 0) ferry_clearerr();
    if (a->err) {
        if (a->ndim < 0) a->ndim = 0;
        if (!a->itemsize) a->itemsize = 1;
        if (!a->typestr && !(a->typestr = xstrdup("?"))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file);
    }
    return 0;
}

static int add_group(open_ctx *o, const char *name) {
    char **ng = realloc(o->gnames, (size_t)(o->ngroups + 1) * sizeof *ng);
    if (!ng) return FERRY_ENOMEM;
    o->gnames = ng;
    if (!(ng[o->ngroups] = strdup(name))) return FERRY_ENOMEM;
    o->ngroups++;
    return 0;
}

static int cmp_str(const void *x, const void *y) { return strcmp(*(char *const *)x, *(char *const *)y); }

/* Child directory names of dir, sorted. */
static int list_children(const zarr_ds *z, const char *dir, char ***out, int *n) {
    *out = NULL; *n = 0;
    if (z->rs) return ferry_zremote_children(z->rs, dir, ZARR_MAX_CHILDREN, out, n);
    DIR *d = opendir(dir);
    if (!d) return ferry_seterr(-errno, "%s: %s", dir, strerror(errno));
    struct dirent *e;
    int cap = 0, rc = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *p = join(dir, e->d_name);
        struct stat st;
        int isdir = p && ferry_sys()->stat(p, &st) == 0 && S_ISDIR(st.st_mode);
        free(p);
        if (!isdir) continue;
        if (*n >= ZARR_MAX_CHILDREN) { rc = ferry_seterr(FERRY_EFORMAT, "%s: too many children", dir); break; }
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nv = realloc(*out, (size_t)cap * sizeof *nv);
            if (!nv) { rc = FERRY_ENOMEM; break; }
            *out = nv;
        }
        if (!((*out)[*n] = strdup(e->d_name))) { rc = FERRY_ENOMEM; break; }
        (*n)++;
    }
    closedir(d);
    if (*n > 1) qsort(*out, (size_t)*n, sizeof **out, cmp_str);
    return rc;
}

/* A member directory's name must be a UTF-8 string (Zarr keys are; Python
 * gets them as str): one that is not fails the open with the store and the
 * name's bytes, not a UnicodeDecodeError later for the whole store. */
static int member_name_ok(const char *dir, const char *name) {
    size_t n = strlen(name);
    if (ferry_utf8_valid(name, n)) return 0;
    char esc[1024];
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < sizeof esc; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c >= 0x20 && c < 0x7f) esc[o++] = (char)c;
        else o += (size_t)snprintf(esc + o, sizeof esc - o, "\\x%02x", c);
    }
    esc[o] = 0;
    return ferry_seterr(FERRY_EFORMAT, "%s: member \"%s\" has a name that is not valid UTF-8 (Zarr keys are strings)",
                        dir, esc);
}

static void free_names(char **v, int n) { for (int i = 0; i < n; i++) free(v[i]); free(v); }

static const char *basename_of(const char *path, char *buf, size_t cap) {
    size_t l = strlen(path);
    while (l > 1 && path[l - 1] == '/') l--;
    size_t s = l;
    while (s > 0 && path[s - 1] != '/') s--;
    size_t n = l - s;
    if (n >= cap) n = cap - 1;
    memcpy(buf, path + s, n);
    buf[n] = 0;
    if (!n) snprintf(buf, cap, "array");
    return buf;
}

/* v3 node at dir; `rel` is its path inside the store. A group without
 * consolidated metadata of its own is listed from the root's
 * consolidated_metadata when the root has some (its keys are paths from the
 * root), as zarr-python's consolidated open of a group below the root reads
 * it, and as v2's .zmetadata is read. */
static int open_v3(open_ctx *o, const char *dir, const char *rel) {
    char *file = join(dir, "zarr.json");
    if (!file) return FERRY_ENOMEM;
    ferry_json *m = NULL, *rootm = NULL;   /* rootm: the root's zarr.json, when its consolidated metadata lists this group */
    char *rootfile = NULL;
    int rc = load_json(o->ds, file, &m);
    if (rc < 0) { free(file); return rc; }
    uint64_t zf;
    const char *nt = json_name(m, "node_type");
    if (m->type != FERRY_JSON_OBJECT || ferry_json_u64(ferry_json_get(m, "zarr_format"), &zf) < 0 || zf != 3)
        rc = MERR(FERRY_EFORMAT, file, m, "zarr_format must be 3");
    else if (!strcmp(nt, "array")) {
        char nm[256];
        o->ds->store.is_array = 1;
        rc = add_array(o, basename_of(dir, nm, sizeof nm), dir, file, 3, m, NULL);
    } else if (!strcmp(nt, "group") && (rc = v3_extensions_ok(file, m, V3_GROUP_KEYS)) < 0) {
    } else if (!strcmp(nt, "group") && ferry_json_get(m, "attributes") &&
               ferry_json_get(m, "attributes")->type != FERRY_JSON_OBJECT) {
        rc = MERR(FERRY_EFORMAT, file, ferry_json_get(m, "attributes"), "attributes must be an object");
    } else if (!strcmp(nt, "group")) {
        const ferry_json *attrs = ferry_json_get(m, "attributes");
        if (attrs && attrs->type == FERRY_JSON_OBJECT && !(o->ds->attrs_json = to_json(attrs))) rc = FERRY_ENOMEM;
        const ferry_json *cm = ferry_json_get(m, "consolidated_metadata");
        const ferry_json *md = cm && cm->type == FERRY_JSON_OBJECT ? ferry_json_get(cm, "metadata") : NULL;
        char prefix[4098] = "";   /* rel is shorter than 4096 (zarr_open checks) */
        const char *mdfile = file;
        if (!rc && !(md && md->type == FERRY_JSON_OBJECT) && *rel) {
            char *rf = join(o->ds->path, "zarr.json");
            if (!rf) rc = FERRY_ENOMEM;
            else if (is_file(o->z, rf) && !(rc = load_json(o->ds, rf, &rootm))) {
                const ferry_json *rcm = ferry_json_get(rootm, "consolidated_metadata");
                const ferry_json *rmd = rcm && rcm->type == FERRY_JSON_OBJECT ? ferry_json_get(rcm, "metadata") : NULL;
                if (rmd && rmd->type == FERRY_JSON_OBJECT) {
                    md = rmd;
                    mdfile = rootfile = rf;
                    rf = NULL;
                    snprintf(prefix, sizeof prefix, "%s/", rel);
                }
            }
            free(rf);
        }
        size_t pl = strlen(prefix);
        if (!rc && md && md->type == FERRY_JSON_OBJECT) {
            o->ds->store.consolidated = 1;
            for (size_t i = 0; i < md->n && !rc; i++)
                if (!key_ok(md->items[i].key, md->items[i].keylen))
                    rc = MERR(FERRY_EFORMAT, mdfile, &md->items[i],
                              "consolidated_metadata key \"%s\" is not a relative path inside the store "
                              "(empty, absolute, or with an empty, \".\" or \"..\" component)", md->items[i].key);
            for (size_t i = 0; i < md->n && !rc; i++) {
                const ferry_json *c = &md->items[i];
                if (strncmp(c->key, prefix, pl)) continue;      /* not below this group */
                const char *child = c->key + pl;
                if (!*child || strchr(child, '/')) continue;   /* not a direct child */
                const char *cnt = json_name(c, "node_type");
                char *cdir = join(dir, child);
                if (!cdir) { rc = FERRY_ENOMEM; break; }
                if (!strcmp(cnt, "array")) rc = add_array(o, child, cdir, mdfile, 3, c, NULL);
                else if (!strcmp(cnt, "group")) rc = add_group(o, child);
                else rc = MERR(FERRY_EFORMAT, mdfile, c, "consolidated entry \"%s\": unknown node_type", c->key);
                free(cdir);
            }
        } else if (!rc) {
            char **kids; int nk;
            rc = list_children(o->z, dir, &kids, &nk);
            static const char *const v3docs[] = {"zarr.json"};
            if (!rc && o->z->rs) ferry_zremote_prefetch_docs(o->z->rs, dir, kids, nk, v3docs, 1, ZARR_MAX_META);
            for (int i = 0; i < nk && !rc; i++) {
                char *cdir = join(dir, kids[i]);
                char *cf = cdir ? join(cdir, "zarr.json") : NULL;
                if (!cf) { free(cdir); rc = FERRY_ENOMEM; break; }
                if (is_file(o->z, cf)) {
                    ferry_json *cm2 = NULL;
                    rc = member_name_ok(dir, kids[i]);
                    if (!rc) rc = load_json(o->ds, cf, &cm2);
                    if (!rc) {
                        /* a member's zarr.json is as required as the root's:
                         * a damaged one fails the open (as in zarr-python), it
                         * does not make the array vanish from its group */
                        const char *cnt = json_name(cm2, "node_type");
                        uint64_t czf;
                        if (cm2->type != FERRY_JSON_OBJECT || ferry_json_u64(ferry_json_get(cm2, "zarr_format"), &czf) < 0 ||
                            czf != 3)
                            rc = MERR(FERRY_EFORMAT, cf, cm2, "zarr_format must be 3");
                        else if (!strcmp(cnt, "array")) rc = add_array(o, kids[i], cdir, cf, 3, cm2, NULL);
                        else if (!strcmp(cnt, "group")) rc = add_group(o, kids[i]);
                        else rc = MERR(FERRY_EFORMAT, cf, ferry_json_get(cm2, "node_type") ? ferry_json_get(cm2, "node_type") : cm2,
                                       "node_type must be \"array\" or \"group\"");
                    }
                    ferry_json_free(cm2);
                }
                free(cf); free(cdir);
            }
            free_names(kids, nk);
        }
    } else rc = MERR(FERRY_EFORMAT, file, m, "node_type must be \"array\" or \"group\"");
    ferry_json_free(rootm);
    free(rootfile);
    ferry_json_free(m);
    free(file);
    return rc;
}

/* "<prefix><name>" in a v2 consolidated metadata object, through `sorted`
 * (its items sorted by key): a store of 40,000 arrays looks up 40,000
 * .zattrs, and a linear ferry_json_get each made the open take 23 s. */
static int cmp_item_key(const void *x, const void *y) {
    return strcmp((*(const ferry_json *const *)x)->key, (*(const ferry_json *const *)y)->key);
}

static const ferry_json *cons_get(const ferry_json *const *sorted, size_t n, const char *prefix, const char *name) {
    char key[4096];
    if (!sorted || snprintf(key, sizeof key, "%s%s", prefix, name) >= (int)sizeof key) return NULL;
    ferry_json probe;
    probe.key = key;
    const ferry_json *pp = &probe;
    const ferry_json *const *hit = bsearch(&pp, sorted, n, sizeof *sorted, cmp_item_key);
    return hit ? *hit : NULL;
}

/* v2 node at dir; `rel` is its path inside the store (for .zmetadata keys). */
static int open_v2(open_ctx *o, const char *dir, const char *rel) {
    int rc = 0;
    char *zarray = join(dir, ".zarray"), *zattrs = join(dir, ".zattrs");
    if (!zarray || !zattrs) { free(zarray); free(zattrs); return FERRY_ENOMEM; }
    if (is_file(o->z, zarray)) {
        ferry_json *za = NULL, *at = NULL;
        rc = load_json(o->ds, zarray, &za);
        if (!rc && is_file(o->z, zattrs)) rc = load_json(o->ds, zattrs, &at);
        char nm[256];
        o->ds->store.is_array = 1;
        if (!rc) rc = add_array(o, basename_of(dir, nm, sizeof nm), dir, zarray, 2, za, at);
        ferry_json_free(za); ferry_json_free(at);
        free(zarray); free(zattrs);
        return rc;
    }
    /* a group: consolidated metadata lives at the store root */
    char *zmeta = join(o->ds->path, ".zmetadata");
    ferry_json *cons = NULL;
    if (!zmeta) rc = FERRY_ENOMEM;
    /* the group's own documents are read even when consolidated metadata
     * stands in for them, as zarr-python reads them: damage there fails */
    char *zgroup = join(dir, ".zgroup");
    if (!zgroup) rc = FERRY_ENOMEM;
    else if (!rc && is_file(o->z, zgroup)) {
        ferry_json *zg = NULL;
        uint64_t zf;
        rc = load_json(o->ds, zgroup, &zg);
        if (!rc && (zg->type != FERRY_JSON_OBJECT || ferry_json_u64(ferry_json_get(zg, "zarr_format"), &zf) < 0 || zf != 2))
            rc = MERR(FERRY_EFORMAT, zgroup, zg, "zarr_format must be 2");
        ferry_json_free(zg);
    }
    free(zgroup);
    if (!rc && is_file(o->z, zattrs)) {
        ferry_json *za = NULL;
        rc = load_json(o->ds, zattrs, &za);
        if (!rc && za->type != FERRY_JSON_OBJECT) rc = MERR(FERRY_EFORMAT, zattrs, za, ".zattrs must be an object");
        ferry_json_free(za);
    }
    if (!rc && is_file(o->z, zmeta)) {
        rc = load_json(o->ds, zmeta, &cons);
        uint64_t cf;
        const ferry_json *m0 = cons ? ferry_json_get(cons, "metadata") : NULL;
        if (!rc && cons->type == FERRY_JSON_OBJECT && m0 && ferry_json_get(cons, "record_size") &&
            !ferry_json_get(cons, "zarr_consolidated_format"))   /* sniffed as a store where it could not look */
            rc = MERR(FERRY_EUNSUPPORTED, zmeta, cons, "a kerchunk Parquet reference set (record_size): ferry reads "
                      "those from local directories (with pyarrow); copy it here or write the references as JSON");
        if (!rc && (cons->type != FERRY_JSON_OBJECT || !m0 || m0->type != FERRY_JSON_OBJECT ||
                    ferry_json_u64(ferry_json_get(cons, "zarr_consolidated_format"), &cf) < 0 || cf != 1))
            rc = MERR(FERRY_EFORMAT, zmeta, cons, "consolidated metadata must be an object with "
                      "\"zarr_consolidated_format\": 1 and a \"metadata\" object");
        for (size_t i = 0; !rc && i < m0->n; i++) {   /* every entry a document of its kind */
            const ferry_json *e = &m0->items[i];
            const char *base = strrchr(e->key, '/');
            base = base ? base + 1 : e->key;
            uint64_t zf;
            if (e->type != FERRY_JSON_OBJECT)
                rc = MERR(FERRY_EFORMAT, zmeta, e, "entry \"%s\" is not an object", e->key);
            else if (!strcmp(base, ".zgroup") &&
                     (ferry_json_u64(ferry_json_get(e, "zarr_format"), &zf) < 0 || zf != 2))
                rc = MERR(FERRY_EFORMAT, zmeta, e, "entry \"%s\": zarr_format must be 2", e->key);
            else if (strcmp(base, ".zgroup") && strcmp(base, ".zattrs") && strcmp(base, ".zarray"))
                rc = MERR(FERRY_EFORMAT, zmeta, e, "entry \"%s\" is not a .zgroup, .zattrs or .zarray", e->key);
        }
    }
    const ferry_json *md = cons ? ferry_json_get(cons, "metadata") : NULL;
    char prefix[4098];   /* rel is shorter than 4096 (zarr_open checks) */
    snprintf(prefix, sizeof prefix, "%s%s", rel, *rel ? "/" : "");
    if (!rc && md && md->type == FERRY_JSON_OBJECT) {
        o->ds->store.consolidated = 1;
        const ferry_json **sorted = malloc((md->n ? md->n : 1) * sizeof *sorted);
        if (!sorted) rc = FERRY_ENOMEM;
        for (size_t i = 0; sorted && i < md->n; i++) sorted[i] = &md->items[i];
        if (sorted) qsort(sorted, md->n, sizeof *sorted, cmp_item_key);
        const ferry_json *gat = cons_get(sorted, md->n, prefix, ".zattrs");
        if (gat && gat->type == FERRY_JSON_OBJECT && !(o->ds->attrs_json = to_json(gat))) rc = FERRY_ENOMEM;
        for (size_t i = 0; i < md->n && !rc; i++)
            if (!key_ok(md->items[i].key, md->items[i].keylen))
                rc = MERR(FERRY_EFORMAT, zmeta, &md->items[i],
                          ".zmetadata key \"%s\" is not a relative path inside the store "
                          "(empty, absolute, or with an empty, \".\" or \"..\" component)", md->items[i].key);
        size_t pl = strlen(prefix);
        for (size_t i = 0; i < md->n && !rc; i++) {
            const char *k = md->items[i].key;
            if (strncmp(k, prefix, pl)) continue;
            const char *rest = k + pl, *slash = strchr(rest, '/');
            if (!slash || slash == rest || strchr(slash + 1, '/')) continue;
            char child[1024];
            size_t cl = (size_t)(slash - rest);
            if (cl >= sizeof child) continue;
            memcpy(child, rest, cl);
            child[cl] = 0;
            if (!strcmp(slash + 1, ".zarray")) {
                char *cdir = join(dir, child);
                char akey[1100];
                snprintf(akey, sizeof akey, "%s/.zattrs", child);
                if (!cdir) { rc = FERRY_ENOMEM; break; }
                rc = add_array(o, child, cdir, zmeta, 2, &md->items[i], cons_get(sorted, md->n, prefix, akey));
                free(cdir);
            } else if (!strcmp(slash + 1, ".zgroup")) rc = add_group(o, child);
        }
        free(sorted);
    } else if (!rc) {
        ferry_json *at = NULL;
        if (is_file(o->z, zattrs)) rc = load_json(o->ds, zattrs, &at);
        if (!rc && at && at->type == FERRY_JSON_OBJECT && !(o->ds->attrs_json = to_json(at))) rc = FERRY_ENOMEM;
        ferry_json_free(at);
        char **kids; int nk;
        if (!rc) {
            rc = list_children(o->z, dir, &kids, &nk);
            static const char *const v2docs[] = {".zarray", ".zgroup", ".zattrs"};
            if (!rc && o->z->rs) ferry_zremote_prefetch_docs(o->z->rs, dir, kids, nk, v2docs, 3, ZARR_MAX_META);
            for (int i = 0; i < nk && !rc; i++) {
                char *cdir = join(dir, kids[i]);
                if (!cdir) { rc = FERRY_ENOMEM; break; }
                int isarr = has_meta(o->z, cdir, ".zarray"), isgrp = !isarr && has_meta(o->z, cdir, ".zgroup");
                if ((isarr || isgrp) && (rc = member_name_ok(dir, kids[i])) < 0) { free(cdir); break; }
                if (isarr) {
                    char *cf = join(cdir, ".zarray"), *ca = join(cdir, ".zattrs");
                    ferry_json *za = NULL, *cat = NULL;
                    rc = cf && ca ? load_json(o->ds, cf, &za) : FERRY_ENOMEM;
                    if (!rc && is_file(o->z, ca)) rc = load_json(o->ds, ca, &cat);
                    if (!rc) rc = add_array(o, kids[i], cdir, cf, 2, za, cat);
                    ferry_json_free(za); ferry_json_free(cat);
                    free(cf); free(ca);
                } else if (isgrp) rc = add_group(o, kids[i]);
                free(cdir);
            }
            free_names(kids, nk);
        }
    }
    ferry_json_free(cons);
    free(zmeta); free(zarray); free(zattrs);
    return rc;
}

static int zarr_probe(const char *path, const uint8_t *head, size_t n, int is_dir) {
    if (!is_dir) return 0;
    return has_meta(NULL, path, "zarr.json") || has_meta(NULL, path, ".zarray") || has_meta(NULL, path, ".zgroup") ||
           has_meta(NULL, path, ".zmetadata");
}

static void zarr_close(ferry_dataset *ds) {
    zarr_ds *z = ds->fmt;
    if (z) {
        for (int i = 0; i < z->narrs; i++) arr_free(&z->arrs[i]);
        free(z->arrs);
        free(z->root);
        ferry_zremote_close(z->rs);
        free(z);
    }
    free(ds->vars);
    free(ds->attrs_json); free(ds->dims_json); free(ds->groups_json);
    ds->vars = NULL; ds->nvars = 0; ds->fmt = NULL;
    ds->attrs_json = ds->dims_json = ds->groups_json = NULL;
}

/* dataset dims: {"name": {"size": n, "unlimited": false}} from the arrays'
 * dimension names (first size seen wins). The names seen so far sit in a
 * hash set: a linear search made a 40,000-array store with one dimension name
 * per array take 7 s to open. */
static size_t str_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (size_t)(h ^ (h >> 29));
}

static char *build_dims(zarr_ds *z) {
    size_t total = 0, cap = 16;
    for (int i = 0; i < z->narrs; i++) total += (size_t)(z->arrs[i].ndim > 0 ? z->arrs[i].ndim : 0);
    while (cap < 2 * total) cap *= 2;
    char **seen = calloc(cap, sizeof *seen);
    if (!seen) return NULL;
    ferry_sbuf b = {0};
    ferry_sbuf_puts(&b, "{");
    int first = 1, oom = 0;
    for (int i = 0; i < z->narrs && !oom; i++) {
        zarr_arr *a = &z->arrs[i];
        if (!a->dims_json) continue;   /* unreadable arrays' names count too */
        ferry_json *d = NULL;
        if (ferry_json_parse(a->dims_json, strlen(a->dims_json), NULL, 0, &d) < 0) { ferry_clearerr(); continue; }
        for (size_t k = 0; k < d->n && (int)k < a->ndim; k++) {
            const char *nm = ferry_json_str(&d->items[k]);
            if (!nm) continue;
            size_t h = str_hash(nm) & (cap - 1);
            while (seen[h] && strcmp(seen[h], nm)) h = (h + 1) & (cap - 1);
            if (seen[h]) continue;
            if (!(seen[h] = strdup(nm))) { oom = 1; break; }
            ferry_sbuf_puts(&b, first ? "" : ",");
            first = 0;
            ferry_sbuf_json_string(&b, nm, d->items[k].len);
            ferry_sbuf_printf(&b, ":{\"size\":%llu,\"unlimited\":false}", (unsigned long long)a->shape[k]);
        }
        ferry_json_free(d);
    }
    for (size_t i = 0; i < cap; i++) free(seen[i]);
    free(seen);
    ferry_sbuf_puts(&b, "}");
    char *out = ferry_sbuf_take(&b);
    if (oom) { free(out); return NULL; }
    return out;
}

static int cmp_arr(const void *x, const void *y) {
    return strcmp(((const zarr_arr *)x)->name, ((const zarr_arr *)y)->name);
}

static int zarr_open(ferry_dataset *ds, const ferry_open_opts *opts) {
    static _Atomic uint64_t opens;
    zarr_ds *z = calloc(1, sizeof *z);
    if (!z) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
    z->serial = atomic_fetch_add(&opens, 1) + 1;
    ds->fmt = z;
    const char *group = opts && opts->group ? opts->group : "";
    while (*group == '/') group++;
    char rel[4096];
    if (strlen(group) >= sizeof rel) return ferry_seterr(FERRY_EINVAL, "%s: group name too long", ds->path);
    snprintf(rel, sizeof rel, "%s", group);
    size_t rl = strlen(rel);
    while (rl && rel[rl - 1] == '/') rel[--rl] = 0;
    if (rl && !key_ok(rel, rl))
        return ferry_seterr(FERRY_EINVAL, "%s: group \"%s\" is not a path inside the store (no empty, \".\" or \"..\" "
                            "component)", ds->path, rel);
    if (ferry_zremote_is_url(ds->path)) {   /* objects, not files: no root to resolve (zarr_remote.c) */
        int rc = ferry_zremote_open(ds->ctx, ds->path, &z->rs);
        if (rc < 0) return rc;
    } else if (!(z->root = realpath(ds->path, NULL))) {
        int e = errno;
        return ferry_seterr(-e, "%s: %s", ds->path, strerror(e));
    }
    char *dir = *rel ? join(ds->path, rel) : xstrdup(ds->path);
    if (!dir) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
    open_ctx o = {ds, z, 0, {0}, 0, NULL};
    int rc;
    if ((rc = inside_store(z, dir)) < 0) {   /* a group that is a symlink leading out */
        free(dir);
        return rc;
    }
    if (has_meta(z, dir, "zarr.json")) {
        ds->store.zarr_format = 3;
        rc = open_v3(&o, dir, rel);
    } else if (has_meta(z, dir, ".zarray") || has_meta(z, dir, ".zgroup") || (!*rel && has_meta(z, dir, ".zmetadata"))) {
        ds->store.zarr_format = 2;
        rc = open_v2(&o, dir, rel);
    }
    else rc = ferry_seterr(FERRY_ENOTFOUND, "%s: no Zarr array or group here (no zarr.json, .zarray or .zgroup)", dir);
    free(dir);
    if (rc == FERRY_ENOMEM && !ferry_lasterr()[0]) ferry_seterr(rc, "%s: out of memory", ds->path);
    if (rc < 0) { free_names(o.gnames, o.ngroups); return rc; }
    /* groups, sorted */
    if (o.ngroups > 1) qsort(o.gnames, (size_t)o.ngroups, sizeof *o.gnames, cmp_str);
    ferry_sbuf g = {0};
    ferry_sbuf_puts(&g, "[");
    for (int i = 0; i < o.ngroups; i++) {
        if (i) ferry_sbuf_puts(&g, ",");
        ferry_sbuf_json_string(&g, o.gnames[i], strlen(o.gnames[i]));
    }
    ferry_sbuf_puts(&g, "]");
    ds->groups_json = ferry_sbuf_take(&g);
    free_names(o.gnames, o.ngroups);
    /* variables, sorted by name (directory order is arbitrary) */
    if (z->narrs > 1) qsort(z->arrs, (size_t)z->narrs, sizeof *z->arrs, cmp_arr);
    ds->vars = calloc((size_t)(z->narrs ? z->narrs : 1), sizeof *ds->vars);
    ds->dims_json = build_dims(z);
    if (!ds->vars || !ds->groups_json || !ds->dims_json) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
    for (int i = 0; i < z->narrs; i++) {
        zarr_arr *a = &z->arrs[i];
        ferry_var_info *vi = &ds->vars[i].info;
        ferry_dtype dt = FERRY_DT_OTHER;
        uint32_t isz, sw;
        if (ferry_typestr_parse(a->typestr, strlen(a->typestr), &dt, &isz, &sw) < 0) dt = FERRY_DT_OTHER;
        vi->name = a->name;
        vi->dtype = dt;
        vi->typestr = a->typestr;
        vi->itemsize = a->itemsize;
        vi->ndim = a->ndim;
        memcpy(vi->shape, a->shape, sizeof vi->shape);
        memcpy(vi->chunks, a->chunk, sizeof vi->chunks);
        vi->fortran_order = a->fortran;
        vi->dims_json = a->dims_json ? a->dims_json : "null";
        vi->attrs_json = a->attrs_json ? a->attrs_json : "{}";
        vi->fill_json = a->fill_json ? a->fill_json : "null";
        vi->codecs = a->codecs_desc ? a->codecs_desc : "";
        vi->path = a->dir;
        vi->error = a->err;
        ds->vars[i].fmt = a;
        if (a->has_fill) ds->vars[i].fill = a->fill;
    }
    ds->nvars = z->narrs;
    return 0;
}

/* ---- plans ---------------------------------------------------------------------- */
/* Planning is ferry_plan_layout's (layout.c): the array's description becomes
 * a ferry_layout, and chunks are found by key (plain arrays: a stat per
 * compressed chunk file) or through each shard's index (sharded arrays). */

typedef struct zarr_plan_ctx {
    zarr_arr *a;
    ferry_ctx *ctx;
    int raw;                           /* the chain is element-wise only */
    int stat_raw;                      /* look at uncompressed chunk files too (raw_chunks) */
    char path[PATH_MAX];
    /* sharded arrays: the shard being planned */
    ferry_layout inner;                /* inner-chunk layout, path = the shard */
    const ferry_slice *sel;
    ferry_buf dst;
    unsigned flags;
    ferry_plan *plan;
    uint64_t *index;                   /* the shard's index, host order; NULL: shard absent */
    uint64_t *index_buf;              /* its buffer, reused for every shard */
    size_t cap;
    uint64_t shard_idx[FERRY_MAX_DIMS], file_size;
    ferry_dataset *ds;
    zarr_dirs okdir;                   /* chunk_inside's cache of directories found inside */
    ferry_dirnames names;              /* list_max: the listing of the last chunk directory */
    size_t list_max;                   /* > 0: absent chunk files are learnt from listings of up to
                                          this many names (plain_chunk) */
    ferry_zchunks *zc;                 /* a store at a URL: chunk objects' sizes (zarr_remote.c) */
} zarr_plan_ctx;

static size_t put_u64(char *out, uint64_t v) {
    char t[20];
    size_t n = 0;
    do { t[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    for (size_t i = 0; i < n; i++) out[i] = t[n - 1 - i];
    return n;
}

/* chunk key for grid index idx, appended to dir: dir/c/1/2 (v3, "/"),
 * dir/1.2 (v2), dir/0 (v2 scalar). Without snprintf: a plan of thousands of
 * chunks formats each key twice (prestat_fill, then the plan), and printf's
 * machinery was a tenth of such a plan's time. */
static int chunk_path(zarr_plan_ctx *p, const uint64_t *idx) {
    zarr_arr *a = p->a;
    size_t dl = strlen(a->dir);
    if (dl >= PATH_MAX) return ferry_seterr(FERRY_EINVAL, "%s: chunk path too long", a->dir);
    char tmp[PATH_MAX + FERRY_MAX_DIMS * 21 + 4];
    memcpy(tmp, a->dir, dl);
    size_t n = dl;
    tmp[n++] = '/';
    if (a->c_prefix) tmp[n++] = 'c';
    for (int k = 0; k < a->ndim; k++) {
        if (k || a->c_prefix) tmp[n++] = a->sep;
        n += put_u64(tmp + n, idx[k]);
    }
    if (a->ndim == 0 && !a->c_prefix) tmp[n++] = '0';
    if (n >= sizeof p->path) return ferry_seterr(FERRY_EINVAL, "%s: chunk path too long", a->dir);
    memcpy(p->path, tmp, n);
    p->path[n] = 0;
    return 0;
}

/* A plain array's chunk: its file. An uncompressed chunk's bytes are known
 * without looking at its file (a stat costs ~1 µs, most of the plan's time for
 * many chunks): the engine fills its box if the file is absent. Only its
 * directory is checked here (once per plan); the file itself is opened with
 * O_NOFOLLOW (the layout's root: FERRY_EXTENT_NOFOLLOW), so a chunk that is a
 * symlink is followed only when it resolves inside the store, at read time,
 * and one leading out fails the read naming the file. Compressed chunks need
 * their size: one lstat each, and a symlink resolved now. */
/* A chunk whose directory does not exist is absent without a look at its
 * file (a store whose metadata claims 2^40 chunks and holds none plans one
 * fill). And when a call places fewer than RAW_STAT_BYTES per chunk on
 * average over PRESTAT_MIN chunks or more (chunks of a few elements, or a
 * column through many chunks), each
 * record (about a KiB: extent, placement, path) outweighs what it places:
 * then uncompressed chunk files are looked at after all (p->stat_raw), so
 * that absent ones join their neighbours' fill instead of costing a record
 * each, and a stat is little beside the open and read of a present one. */
#define RAW_STAT_BYTES 256
static int raw_chunks(const zarr_plan_ctx *p) { return p->raw && !p->stat_raw && p->a->itemsize <= 16; }

/* A chunk object of a store at a URL: an uncompressed one is read without a
 * look first (its 404 is a fill, as a missing file is); a compressed one
 * needs its size: its directory's listing, or the object itself. */
static int remote_chunk_size(zarr_plan_ctx *p, ferry_chunk *c) {
    uint64_t size = 0;
    int rc = ferry_zremote_chunk(((zarr_ds *)p->ds->fmt)->rs, p->zc, p->path, &size);
    if (rc < 0) return rc;
    c->length = rc ? size : FERRY_CHUNK_ABSENT;
    return 0;
}

static int plain_chunk_at(zarr_plan_ctx *p, ferry_chunk *c) {
    int rc;
    c->path = p->path;
    if (p->zc) {
        if (raw_chunks(p)) { c->length = FERRY_CHUNK_UNSIZED; return 0; }
        return remote_chunk_size(p, c);
    }
    if (raw_chunks(p)) {
        if ((rc = chunk_dir_inside(p->ds->fmt, p->path, &p->okdir)) < 0) return rc;
        c->length = rc == 1 ? FERRY_CHUNK_ABSENT : FERRY_CHUNK_UNSIZED;
        return 0;
    }
    struct stat st;
    if ((rc = chunk_inside(p->ds->fmt, p->path, &p->okdir, &st)) < 0) return rc;
    if (rc == 0) { c->length = FERRY_CHUNK_ABSENT; return 0; }
    c->length = (uint64_t)st.st_size;
    return 0;
}

/* In a plan of very many chunks (list_max set): 1 when p->path is not in its
 * directory's listing (absent: no lstat), 0 when it may exist, or an error. */
static int listed_absent(zarr_plan_ctx *p) {
    if (!p->list_max) return 0;
    const char *slash = strrchr(p->path, '/');
    size_t dl = slash ? (size_t)(slash - p->path) : 0;
    if (!dl) return 0;
    if (!ferry_dirnames_is(&p->names, p->path, dl)) {
        int rc = ferry_dirnames_load(&p->names, p->path, dl, p->list_max);
        if (rc == FERRY_ENOMEM) return ferry_seterr(rc, "%s: out of memory listing the chunks", p->a->dir);
        if (rc != 0) { p->list_max = 0; return 0; }   /* too many names, or unreadable: an lstat each */
    }
    return !ferry_dirnames_has(&p->names, p->path + dl + 1);
}

static int plain_chunk(void *arg, const uint64_t *idx, ferry_chunk *c) {
    zarr_plan_ctx *p = arg;
    int rc = chunk_path(p, idx);
    if (rc < 0) return rc;
    if ((rc = listed_absent(p)) != 0) {
        c->path = p->path;
        c->length = FERRY_CHUNK_ABSENT;
        return rc < 0 ? rc : 0;
    }
    zarr_prestat *pre = p->okdir.pre;
    p->okdir.pre_at = SIZE_MAX;
    if (pre && pre->cur < pre->n && !strcmp(pre->path[2 * pre->cur], p->path)) p->okdir.pre_at = pre->cur++;
    rc = plain_chunk_at(p, c);
    p->okdir.pre_at = SIZE_MAX;
    return rc;
}

/* An inner chunk of the shard being planned: its index entry. */
static int shard_inner(void *arg, const uint64_t *idx, ferry_chunk *c) {
    zarr_plan_ctx *p = arg;
    zarr_arr *a = p->a;
    c->length = FERRY_CHUNK_ABSENT;
    if (!p->index) return 0;
    uint64_t lin = 0;
    for (int k = 0; k < a->ndim; k++) {
        uint64_t per = a->chunk[k] / a->inner[k];
        lin = lin * per + (idx[k] - p->shard_idx[k] * per);
    }
    uint64_t off = p->index[2 * lin], nb = p->index[2 * lin + 1];
    if (off == EMPTY_U64 && nb == EMPTY_U64) return 0;
    if (off > p->file_size || nb > p->file_size - off)
        return ferry_seterr(FERRY_EFORMAT, "%s: shard index entry %llu (offset %llu, %llu bytes) lies outside the %llu-byte shard",
                            p->path, (unsigned long long)lin, (unsigned long long)off, (unsigned long long)nb,
                            (unsigned long long)p->file_size);
    c->offset = off;
    c->length = nb;
    return 0;
}

/* One shard the selection touches: read and check its index, then plan the
 * inner chunks inside it; 1 when the shard is absent (nothing planned). */
static int shard_chunk(void *arg, const uint64_t *idx) {
    zarr_plan_ctx *p = arg;
    zarr_arr *a = p->a;
    uint64_t n_inner = 1;
    for (int k = 0; k < a->ndim; k++) {
        p->shard_idx[k] = idx[k];
        if (ferry_mul_overflow(n_inner, a->chunk[k] / a->inner[k], &n_inner) || n_inner > ((uint64_t)1 << 40))
            return ferry_seterr(FERRY_EFORMAT, "%s: too many inner chunks per shard", a->dir);
    }
    int rc = chunk_path(p, idx);
    if (rc < 0) return rc;
    p->index = NULL;
    p->file_size = 0;
    struct stat st;
    if (p->zc) {   /* a shard object: its size from a listing or itself */
        ferry_chunk sc;
        if ((rc = remote_chunk_size(p, &sc)) < 0) return rc;
        rc = sc.length != FERRY_CHUNK_ABSENT;
        st.st_size = rc ? (off_t)sc.length : 0;
        if (rc && sc.length > (uint64_t)INT64_MAX) return ferry_seterr(FERRY_EFORMAT, "%s: size out of range", p->path);
    } else if ((rc = chunk_inside(p->ds->fmt, p->path, &p->okdir, &st)) < 0) return rc;
    if (rc == 0) return 1;   /* the whole shard is missing: a fill, with its absent neighbours' */
    {
        rc = 0;
        uint64_t fsz = (uint64_t)st.st_size, isz;
        if (ferry_mul_overflow(n_inner, 16, &isz) || ferry_add_overflow(isz, a->index_crc ? 4 : 0, &isz) || isz > fsz)
            return ferry_seterr(FERRY_EFORMAT, "%s: shard of %llu bytes is too small for its index of %llu inner chunks",
                                p->path, (unsigned long long)fsz, (unsigned long long)n_inner);
        if (p->cap < isz) {   /* one buffer reused for every shard of the plan */
            uint64_t *ni = realloc(p->index_buf, (size_t)isz);
            if (!ni) return ferry_seterr(FERRY_ENOMEM, "%s: no memory for the shard index", p->path);
            p->index_buf = ni;
            p->cap = (size_t)isz;
        }
        ferry_file *f;
        if ((rc = ferry_file_open(p->ctx, p->path, FERRY_READ, &f)) < 0) return rc;
        uint64_t ioff = a->index_at_start ? 0 : fsz - isz;
        int64_t got = ferry_pread(f, ferry_host_buf(p->index_buf, (size_t)isz), ioff, (size_t)isz, FERRY_NO_DIRECT);
        ferry_file_close(f);
        if (got < 0) return (int)got;
        if ((uint64_t)got != isz) return ferry_seterr(FERRY_EFORMAT, "%s: shard index truncated", p->path);
        uint8_t *ib = (uint8_t *)p->index_buf;
        if (a->index_crc) {
            uint32_t want = ferry_le32(ib + isz - 4), c = ferry_crc32c(0, ib, (size_t)(isz - 4));
            if (want != c)
                return ferry_seterr(FERRY_ECHECKSUM, "%s: byte %llu: shard index crc32c mismatch (stored %08x, computed %08x)",
                                    p->path, (unsigned long long)ioff, want, c);
        }
        /* decode entries in place to host-order u64 */
        for (uint64_t i = 0; i < 2 * n_inner; i++) {
            uint64_t v = a->index_big ? ferry_be64(ib + 8 * i) : ferry_le64(ib + 8 * i);
            memcpy(ib + 8 * i, &v, 8);
        }
        p->index = p->index_buf;
        p->file_size = fsz;
    }
    uint64_t lo[FERRY_MAX_DIMS], hi[FERRY_MAX_DIMS];
    for (int k = 0; k < a->ndim; k++) { lo[k] = idx[k] * a->chunk[k]; hi[k] = lo[k] + a->chunk[k]; }
    p->inner.path = p->path;
    p->inner.file_size = p->file_size;
    rc = ferry_layout_plan_box(&p->inner, p->sel, lo, hi, p->dst, p->flags, p->plan);
    if (rc == FERRY_ENOMEM && !ferry_lasterr()[0]) ferry_seterr(rc, "%s: out of memory", p->path);
    return rc;
}

/* The shard grid's lookup: an absent shard is an absent chunk of the shard
 * grid (runs of them are a few fills), a present one has its inner chunks
 * planned here. */
static int shard_lookup(void *arg, const uint64_t *idx, ferry_chunk *c) {
    zarr_plan_ctx *p = arg;
    int rc = p->list_max ? chunk_path(p, idx) : 0;
    if (rc == 0 && p->list_max) rc = listed_absent(p);
    if (rc != 0) {
        c->length = FERRY_CHUNK_ABSENT;
        return rc < 0 ? rc : 0;
    }
    rc = shard_chunk(arg, idx);
    if (rc < 0) return rc;
    c->length = rc == 1 ? FERRY_CHUNK_ABSENT : FERRY_CHUNK_PLANNED;
    return 0;
}

/* ---- many chunks: their lstats at once ------------------------------------ */
/* Fewer chunks than this in one call are checked one by one (a 160-read batch
 * plans one chunk per call); more than PRESTAT_MAX are too: the list holds two
 * paths and two struct stat per chunk, ~27 MB at 65,536 chunks (a 64 GiB
 * load of 1 MiB chunks). */
#define PRESTAT_MIN 256
#define PRESTAT_MAX ((size_t)1 << 16)

typedef struct prestat_list {
    zarr_plan_ctx *p;
    char *buf;             /* the paths, NUL-terminated, back to back */
    size_t len, cap;
    size_t *off;           /* 2 per chunk into buf; SIZE_MAX: none */
    size_t n, ncap;
    size_t last_dir;       /* offset of the last directory listed, SIZE_MAX: none */
} prestat_list;

static int list_str(prestat_list *L, const char *s, size_t n, size_t *at) {
    if (L->len + n + 1 > L->cap) {
        size_t cap = L->cap ? L->cap : 1 << 16;
        while (cap < L->len + n + 1) cap *= 2;
        char *b = realloc(L->buf, cap);
        if (!b) return FERRY_ENOMEM;
        L->buf = b;
        L->cap = cap;
    }
    memcpy(L->buf + L->len, s, n);
    L->buf[L->len + n] = 0;
    *at = L->len;
    L->len += n + 1;
    return 0;
}

/* ferry_layout_visit's callback: chunk idx's file and (when it changes) its directory. */
static int list_chunk(void *arg, const uint64_t *idx) {
    prestat_list *L = arg;
    if (L->n == PRESTAT_MAX) return FERRY_EINVAL;   /* stops the visit: too many to list */
    int rc = chunk_path(L->p, idx);
    if (rc < 0) return rc;
    if (L->n == L->ncap) {
        size_t cap = L->ncap ? 2 * L->ncap : 1024;
        size_t *o = realloc(L->off, 2 * cap * sizeof *o);
        if (!o) return FERRY_ENOMEM;
        L->off = o;
        L->ncap = cap;
    }
    const char *path = L->p->path, *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) : 0, *o = &L->off[2 * L->n];
    if ((rc = list_str(L, path, strlen(path), &o[0])) < 0) return rc;
    o[1] = SIZE_MAX;
    if (dl && (L->last_dir == SIZE_MAX || strncmp(L->buf + L->last_dir, path, dl) || L->buf[L->last_dir + dl])) {
        if ((rc = list_str(L, path, dl, &o[1])) < 0) return rc;
        L->last_dir = o[1];
    }
    L->n++;
    return 0;
}

/* At most how many chunks sel touches (per dimension: its indices, or the chunks
 * from its first index's to its last's): a call planning fewer than
 * PRESTAT_MIN lists nothing (a batch's 160 calls plan one chunk each). */
static uint64_t chunks_touched_max(const ferry_layout *l, const ferry_slice *sel) {
    uint64_t n = 1;
    for (int k = 0; k < l->ndim; k++) {
        uint64_t c = ferry_slice_count(sel[k]);
        if (c == 0) return 0;
        uint64_t first = (uint64_t)sel[k].start, last = first + (c - 1) * (uint64_t)sel[k].step;
        uint64_t span = last / l->chunks[k] - first / l->chunks[k] + 1;
        if (span < c) c = span;
        if (ferry_mul_overflow(n, c, &n)) return UINT64_MAX;
    }
    return n;
}

/* The lstats of the chunks this call will plan (sel over l), taken at once:
 * 0 and pre filled, or -1 (too few or too many chunks, no memory: each chunk
 * is checked by itself, as before). */
static int prestat_fill(zarr_plan_ctx *p, const ferry_layout *l, const ferry_slice *sel, zarr_prestat *pre) {
    if (chunks_touched_max(l, sel) < PRESTAT_MIN) return -1;
    prestat_list L = {p, NULL, 0, 0, NULL, 0, 0, SIZE_MAX};
    int rc = ferry_layout_visit(l, sel, list_chunk, &L);
    ferry_clearerr();
    if (rc < 0 || L.n < PRESTAT_MIN) { free(L.buf); free(L.off); return -1; }
    size_t m = 2 * L.n, wanted = 0;
    pre->buf_ = L.buf;   /* from here on prestat_free frees everything */
    pre->path = malloc(m * sizeof *pre->path);
    pre->st = malloc(m * sizeof *pre->st);
    pre->err = malloc(m * sizeof *pre->err);
    char **want = malloc(m * sizeof *want);
    int ok = pre->path && pre->st && pre->err && want;
    int raw = raw_chunks(p);   /* their files are not looked at: only the directories */
    for (size_t i = 0; ok && i < m; i++) {
        pre->path[i] = L.off[i] == SIZE_MAX ? NULL : L.buf + L.off[i];
        want[i] = (i % 2 == 0 && raw) ? NULL : pre->path[i];
        wanted += want[i] != NULL;
    }
    free(L.off);
    ok = ok && wanted >= PRESTAT_MIN;   /* else uncompressed chunks in a few directories: nothing to gain */
    if (ok) ferry_lstat_many(p->ctx, want, m, pre->st, pre->err);
    free(want);
    if (!ok) { prestat_free(pre); return -1; }
    pre->n = L.n;
    pre->cur = 0;
    return 0;
}

static void prestat_free(zarr_prestat *pre) {
    free(pre->path);
    free(pre->st);
    free(pre->err);
    free(pre->buf_);
    memset(pre, 0, sizeof *pre);
}

/* A store at a URL: the sizes of the compressed chunk (or shard) objects this
 * call touches, found before planning rather than one request after another
 * while planning: at a web server by opening them on several threads; in a
 * bucket the same where they lie in many directories (v3's c/<t>/...: one
 * listing per directory, one after another, would cost more), unless the call
 * touches a good part of the array: then one listing of the array's keys. */
static int remote_prefetch(zarr_plan_ctx *p, const ferry_layout *l, const ferry_slice *sel) {
    if (raw_chunks(p) && !p->a->sharded) return 0;
    ferry_layout grid = *l;
    if (p->a->sharded) memcpy(grid.chunks, p->a->chunk, sizeof grid.chunks);
    uint64_t touched = chunks_touched_max(&grid, sel);
    if (touched < 2 || touched > PRESTAT_MAX) return 0;   /* one by one (or the listing) */
    prestat_list L = {p, NULL, 0, 0, NULL, 0, 0, SIZE_MAX};
    int rc = ferry_layout_visit(&grid, sel, list_chunk, &L);
    char **urls = rc < 0 ? NULL : malloc((L.n ? L.n : 1) * sizeof *urls);
    if (rc < 0 || !urls) {
        ferry_clearerr();
        free(L.buf); free(L.off); free(urls);
        return 0;   /* planned one by one instead */
    }
    size_t ndirs = 0;
    for (size_t i = 0; i < L.n; i++) {
        urls[i] = L.buf + L.off[2 * i];
        ndirs += L.off[2 * i + 1] != SIZE_MAX;   /* list_chunk notes each change of directory */
    }
    uint64_t total = 1;
    for (int k = 0; k < grid.ndim; k++)
        if (ferry_mul_overflow(total, (grid.shape[k] + grid.chunks[k] - 1) / grid.chunks[k], &total)) total = UINT64_MAX;
    rc = ferry_zremote_prefetch(((zarr_ds *)p->ds->fmt)->rs, p->zc, urls, L.n, p->a->dir, ndirs, total);
    free(urls); free(L.buf); free(L.off);
    return rc;
}

static int64_t zarr_plan(ferry_dataset *ds, int var, const ferry_slice *sel, ferry_buf dst, unsigned flags,
                         ferry_plan *plan) {
    zarr_arr *a = ds->vars[var].fmt;
    if (a->err) return ferry_seterr(FERRY_EUNSUPPORTED, "%s", a->err);
    zarr_plan_ctx *p = calloc(1, sizeof *p);
    if (!p) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
    p->a = a; p->ds = ds; p->ctx = ds->ctx; p->sel = sel; p->dst = dst; p->flags = flags; p->plan = plan;
    ferry_layout *l = &p->inner;
    l->ndim = a->ndim;
    memcpy(l->shape, a->shape, sizeof l->shape);
    memcpy(l->chunks, a->sharded ? a->inner : a->chunk, sizeof l->chunks);
    l->order = a->fortran ? FERRY_ORDER_F : FERRY_ORDER_PERM;
    memcpy(l->perm, a->perm, sizeof l->perm);
    l->itemsize = a->itemsize;
    l->swap = a->swap;
    l->ncodecs = a->ncodecs;
    memcpy(l->codecs, a->codecs, sizeof l->codecs);
    memcpy(l->fill, a->fill, sizeof l->fill);
    l->label = a->name;
    l->root = ((zarr_ds *)ds->fmt)->root;   /* chunk files are opened O_NOFOLLOW, links checked under it */
    int remote = ((zarr_ds *)ds->fmt)->rs != NULL;   /* objects: no directories, links or lstats */
    if (remote && !(p->zc = ferry_zchunks_new())) { free(p); return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path); }
    /* once per plan (see zarr_dirs), the plan's earlier calls included (zarr_memo) */
    zarr_memo_ent *me = remote ? NULL : zarr_memo_get(plan, ds->fmt, var, 0);
    if (!remote && (me || (strlen(a->dir) < PATH_MAX && inside_store(ds->fmt, a->dir) == 1))) {
        p->okdir.base = a->dir;
        p->okdir.baselen = strlen(a->dir);
        while (p->okdir.baselen > 1 && a->dir[p->okdir.baselen - 1] == '/') p->okdir.baselen--;
        if (!me) me = zarr_memo_get(plan, ds->fmt, var, 1);
        if (me && me->known) snprintf(p->okdir.known, sizeof p->okdir.known, "%s", me->known);
    }
    ferry_clearerr();
    p->raw = 1;
    for (int i = 0; i < a->ncodecs; i++) if (a->codecs[i].id != FERRY_CODEC_BYTESWAP) p->raw = 0;
    uint64_t total = a->itemsize;
    for (int k = 0; k < a->ndim; k++) total *= ferry_slice_count(sel[k]);
    int rc = ferry_layout_check(l);
    if (!rc && remote) rc = remote_prefetch(p, l, sel);
    if (!rc && !a->sharded && !remote) {   /* a plan of many chunks placing little each (raw_chunks) */
        uint64_t touched = chunks_touched_max(l, sel);
        p->stat_raw = touched >= PRESTAT_MIN && touched > total / RAW_STAT_BYTES;
    }
    if (!rc && a->sharded) {
        l->lookup = shard_inner;
        l->lookup_arg = p;
        ferry_layout shards = *l;   /* the shard grid, planned with shard_lookup */
        memcpy(shards.chunks, a->chunk, sizeof shards.chunks);
        shards.lookup = shard_lookup;
        uint64_t nshards = chunks_touched_max(&shards, sel);   /* listed as plain chunks are (below) */
        if (nshards > PRESTAT_MAX && !remote) p->list_max = nshards > SIZE_MAX / 4 ? SIZE_MAX : (size_t)nshards * 4;
        uint64_t lo[FERRY_MAX_DIMS] = {0};   /* a box: no whole-array probe of shard 0 */
        rc = ferry_layout_plan_box(&shards, sel, lo, shards.shape, dst, flags, plan);
    } else if (!rc) {
        zarr_prestat pre = {0};
        /* More chunks than one lstat batch holds, each looked at: listing their
         * directories answers which exist (a listing costs less than the lstats
         * of the chunks it answers for, hence at most 4 names a chunk). */
        uint64_t touched = chunks_touched_max(l, sel);
        if (remote) {
        } else if (!raw_chunks(p) && touched > PRESTAT_MAX)
            p->list_max = touched > SIZE_MAX / 4 ? SIZE_MAX : (size_t)touched * 4;
        else if (prestat_fill(p, l, sel, &pre) == 0) p->okdir.pre = &pre;
        p->okdir.pre_at = SIZE_MAX;
        l->lookup = plain_chunk;
        l->lookup_arg = p;
        rc = ferry_layout_plan_box(l, sel, NULL, NULL, dst, flags, plan);
        p->okdir.pre = NULL;
        prestat_free(&pre);
    }
    if (rc == FERRY_ENOMEM && !ferry_lasterr()[0]) ferry_seterr(rc, "%s: out of memory", a->dir);
    if (me && p->okdir.known[0] && (!me->known || strcmp(me->known, p->okdir.known))) {
        free(me->known);
        me->known = strdup(p->okdir.known);   /* NULL (no memory): the next call starts from the array's directory */
    }
    free(p->index_buf);
    ferry_dirnames_free(&p->names);
    ferry_zchunks_free(p->zc);
    free(p);
    return rc < 0 ? rc : (int64_t)total;
}

const ferry_format_ops ferry_format_zarr = {"zarr", zarr_probe, zarr_open, zarr_close, zarr_plan, NULL};

/* ---- the v2 parser for documents in memory (zarrmeta.h) --------------------- */

int ferry_zarr_v2_parse(const char *file, const ferry_json *zarray, const ferry_json *zattrs, ferry_zarr_v2 *out) {
    zarr_arr a;
    memset(&a, 0, sizeof a);
    memset(out, 0, sizeof *out);
    int rc = parse_v2(&a, file, zarray, zattrs);
    /* as add_array: malformed after unsupported keeps the first reason */
    if (rc < 0 && (!a.err || rc == FERRY_ENOMEM)) { arr_free(&a); return rc; }
    if (rc < 0) ferry_clearerr();
    if (a.err) {
        if (a.ndim < 0) a.ndim = 0;
        if (!a.itemsize) a.itemsize = 1;
        if (!a.typestr && !(a.typestr = xstrdup("?"))) { arr_free(&a); return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", file); }
    }
    out->typestr = a.typestr; out->dims_json = a.dims_json; out->attrs_json = a.attrs_json;
    out->fill_json = a.fill_json; out->codecs_desc = a.codecs_desc; out->err = a.err;
    out->ndim = a.ndim;
    memcpy(out->shape, a.shape, sizeof out->shape);
    memcpy(out->chunk, a.chunk, sizeof out->chunk);
    out->itemsize = a.itemsize; out->swap = a.swap; out->fortran = a.fortran; out->sep = a.sep;
    out->ncodecs = a.ncodecs;
    memcpy(out->codecs, a.codecs, sizeof out->codecs);
    memcpy(out->fill, a.fill, sizeof out->fill);
    out->has_fill = a.has_fill;
    free(a.name); free(a.dir);
    return 0;
}

void ferry_zarr_v2_free(ferry_zarr_v2 *m) {
    if (!m) return;
    free(m->typestr); free(m->dims_json); free(m->attrs_json); free(m->fill_json); free(m->codecs_desc); free(m->err);
    memset(m, 0, sizeof *m);
}
