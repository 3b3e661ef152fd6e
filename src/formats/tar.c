/* tar.c — WebDataset shards: tar archives indexed from their headers.
 *
 * A tar archive is a run of 512-byte headers, each followed by its member's
 * data padded to 512 bytes, ended by a zero block (POSIX asks for two; one is
 * enough to know the archive ended; what follows is record padding). Header
 * fields (POSIX.1-1988 ustar, with GNU's and pax's extensions):
 *   0 name[100]  100 mode  108 uid  116 gid  124 size[12]  136 mtime[12]
 *   148 chksum[8]  156 typeflag  157 linkname[100]  257 magic[6] "ustar\0"
 *   (GNU: "ustar  \0")  263 version  265 uname  297 gname  329/337 devices
 *   345 prefix[155] (ustar only; GNU keeps times there).
 * Numbers are octal text, or base-256 (first byte 0x80) for sizes past 8 GiB.
 * The checksum is the sum of the header's bytes with its own field read as
 * spaces (as unsigned bytes; old writers summed signed bytes: both accepted).
 * Extensions honoured: GNU 'L' (the next member's long name), pax 'x' records
 * "LEN key=value\n" with path and size (size overrides the header's); 'g'
 * global records are checked and ignored, 'K' (long link names) skipped.
 * Refused: GNU sparse members ('S', pax GNU.sparse.*) and multi-volume
 * continuations ('M'): their data is not the member's bytes.
 *
 * Samples are grouped as webdataset groups them (tariterators.py): regular
 * files only; names matching __*__ (optionally followed by /...) skipped; the
 * key is the path up to the first dot of the basename, the member name the
 * rest, lowercased (ASCII); a basename without a dot (or starting with one)
 * is skipped; consecutive members with one key make one sample, two members
 * of one name in a sample are an error.
 *
 * Reading: headers are read through windows of up to 1 MiB (8 MiB for a
 * shard at a URL, where each read is a request), so archives of small members
 * cost one read per many headers; when members are large the window shrinks
 * to a header's worth, so no member's bytes are read here. A shard at a URL
 * stays open in the set (shards.h): its members are read from the version
 * indexed. */
#include "formats/shards.h"
#include <stdlib.h>

#define TAR_BLOCK 512u
#define TAR_MAX_NAME (64u << 10)      /* a long name or pax path: PATH_MAX is 4096; a margin */
#define TAR_MAX_PAX (1u << 20)        /* pax records of one member */

typedef struct tar_src {
    const char *path;
    uint64_t size;
    ferry_window w;
    uint64_t avg;          /* running mean of member sizes: the window's size follows it */
} tar_src;

/* Point *p at file bytes [off, off + n) (the caller checked they are inside
 * the file): whole windows (1 MiB, 8 MiB at a URL: shards.h) while members
 * average under a quarter of one, else a header's worth. */
static int src_get(tar_src *r, uint64_t off, size_t n, const uint8_t **p) {
    size_t win = ferry_window_cap(&r->w);
    return ferry_window_get(&r->w, off, n, r->avg < win / 4 ? win : 2 * TAR_BLOCK, p);
}

/* An octal field (leading spaces or NULs, digits, then space/NUL to the end)
 * or a base-256 one. 0, or -1 when malformed or too large. */
static int tar_number(const uint8_t *p, size_t n, uint64_t *out) {
    uint64_t v = 0;
    if (p[0] & 0x80) {   /* base-256, big-endian, positive only */
        if (p[0] != 0x80) return -1;
        for (size_t i = 1; i < n; i++) {
            if (v >> 56) return -1;
            v = (v << 8) | p[i];
        }
        *out = v;
        return 0;
    }
    size_t i = 0;
    while (i < n && (p[i] == ' ' || p[i] == 0)) i++;
    int digits = 0;
    while (i < n && p[i] >= '0' && p[i] <= '7') {
        if (v >> 61) return -1;
        v = v * 8 + (uint64_t)(p[i] - '0');
        i++;
        digits++;
    }
    for (; i < n; i++)
        if (p[i] != ' ' && p[i] != 0) return -1;
    if (!digits) v = 0;   /* an empty field reads as 0, as GNU tar and Python's tarfile read it */
    *out = v;
    return 0;
}

static int tar_checksum_ok(const uint8_t *h) {
    uint64_t want;
    if (tar_number(h + 148, 8, &want) < 0) return 0;
    uint64_t u = 0;
    int64_t sg = 0;
    for (size_t i = 0; i < TAR_BLOCK; i++) {
        uint8_t c = (i >= 148 && i < 156) ? ' ' : h[i];
        u += c;
        sg += (int8_t)c;
    }
    return want == u || (int64_t)want == sg;
}

static int all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

typedef struct pending {
    char *name;            /* from 'L' or pax path, or NULL */
    uint64_t size;
    int has_size;
} pending;

/* pax records "LEN key=value\n": path and size kept; sparse refused. */
static int tar_pax(tar_src *r, const uint8_t *p, size_t n, uint64_t at, pending *pd, int global) {
    size_t i = 0;
    while (i < n) {
        if (p[i] == 0 && all_zero(p + i, n - i)) break;   /* some writers pad with NULs */
        size_t len = 0, st = i;
        while (i < n && p[i] >= '0' && p[i] <= '9' && len < TAR_MAX_PAX) len = len * 10 + (size_t)(p[i++] - '0');
        if (i >= n || p[i] != ' ' || len <= i - st + 1 || len > n - st || p[st + len - 1] != '\n')
            return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: malformed pax record", r->path,
                                (unsigned long long)(at + st));
        const uint8_t *kv = p + i + 1, *end = p + st + len - 1;
        const uint8_t *eq = memchr(kv, '=', (size_t)(end - kv));
        if (!eq) return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: pax record without '='", r->path,
                                     (unsigned long long)(at + st));
        size_t klen = (size_t)(eq - kv), vlen = (size_t)(end - eq - 1);
        const char *v = (const char *)eq + 1;
        if (klen >= 10 && !memcmp(kv, "GNU.sparse", 10))
            return ferry_seterr(FERRY_EUNSUPPORTED, "%s: byte %llu: a GNU sparse member (pax %.*s): not read", r->path,
                                (unsigned long long)(at + st), (int)klen, (const char *)kv);
        if (!global && klen == 4 && !memcmp(kv, "path", 4)) {
            if (vlen == 0 || vlen > TAR_MAX_NAME || memchr(v, 0, vlen))
                return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: pax path of %zu bytes", r->path,
                                    (unsigned long long)(at + st), vlen);
            free(pd->name);
            if (!(pd->name = strndup(v, vlen))) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        } else if (!global && klen == 4 && !memcmp(kv, "size", 4)) {
            uint64_t sz = 0;
            size_t j = 0;
            for (; j < vlen && v[j] >= '0' && v[j] <= '9'; j++)
                if (ferry_mul_overflow(sz, 10, &sz) || ferry_add_overflow(sz, (uint64_t)(v[j] - '0'), &sz)) break;
            if (j != vlen || vlen == 0)
                return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: pax size \"%.*s\"", r->path,
                                    (unsigned long long)(at + st), (int)FERRY_MIN(vlen, 32), v);
            pd->size = sz;
            pd->has_size = 1;
        }
        i = st + len;
    }
    return 0;
}

/* webdataset's rules (see the top of the file): add the member or skip it. */
static int tar_member(ferry_shards *s, char *name, uint32_t file, uint64_t off, uint64_t size, uint64_t hdr) {
    size_t n = strlen(name);
    if (n >= 4 && name[0] == '_' && name[1] == '_') {   /* __meta__ or __meta__/... */
        const char *slash = memchr(name + 2, '/', n - 2);
        size_t seg = slash ? (size_t)(slash - name) : n;
        if (seg >= 4 && name[seg - 1] == '_' && name[seg - 2] == '_') return 0;
    }
    char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    char *dot = strchr(base, '.');
    if (!dot || dot == base) return 0;
    size_t klen = (size_t)(dot - name);
    char *ext = dot + 1;   /* lowercased in place: name is the walker's copy */
    size_t elen = n - klen - 1;
    for (size_t i = 0; i < elen; i++)
        if (ext[i] >= 'A' && ext[i] <= 'Z') ext[i] = (char)(ext[i] - 'A' + 'a');
    int rc;
    uint32_t nm;
    if ((rc = ferry_shards_name(s, ext, elen, NULL, &nm)) < 0)
        return ferry_preerr(rc, "%s: byte %llu", ferry_shards_at(s, s->files[file].path), (unsigned long long)hdr);
    /* the same sample as the member before: its key, in the same shard */
    int same = s->nsamples && s->samples[s->nsamples - 1].nmembers && s->members[s->nmembers - 1].file == file;
    if (same) {
        const char *k = ferry_shards_at(s, s->samples[s->nsamples - 1].key);
        same = strlen(k) == klen && !memcmp(k, name, klen);
    }
    if (!same && (rc = ferry_shards_begin_sample(s, name, klen, -1)) < 0) return rc;
    return ferry_shards_add_member(s, nm, file, off, size, hdr);
}

static int tar_walk(ferry_shards *s, tar_src *r, uint32_t file) {
    pending pd = {0};
    uint64_t off = 0, nmem = 0, total = 0;
    int rc = 0;
    char *name = malloc(TAR_MAX_NAME + 1);
    if (!name) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    for (;;) {
        const uint8_t *h;
        if (r->size - off < TAR_BLOCK) {
            rc = off == r->size
                ? ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: the archive ends without its end-of-archive block"
                               " (truncated?)", r->path, (unsigned long long)off)
                : ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: the file ends %llu bytes into a header (truncated?)",
                               r->path, (unsigned long long)off, (unsigned long long)(r->size - off));
            break;
        }
        if ((rc = src_get(r, off, TAR_BLOCK, &h)) < 0) break;
        if (all_zero(h, TAR_BLOCK)) {
            if (pd.name || pd.has_size)
                rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: the archive ends after an extended header",
                                  r->path, (unsigned long long)off);
            break;
        }
        /* the name, for messages, before anything else is trusted */
        size_t nl = strnlen((const char *)h, 100);
        if (!tar_checksum_ok(h)) {
            rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: header of member \"%.*s\": bad checksum (damaged or not a"
                              " tar file)", r->path, (unsigned long long)off, (int)nl, (const char *)h);
            break;
        }
        uint64_t size;
        if (tar_number(h + 124, 12, &size) < 0) {
            rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: member \"%.*s\": bad size field", r->path,
                              (unsigned long long)(off + 124), (int)nl, (const char *)h);
            break;
        }
        char type = (char)h[156];
        int regular = type == '0' || type == 0 || type == '7';
        if (regular && pd.has_size) size = pd.size;
        int has_data = regular || !(type >= '1' && type <= '6');
        if (!has_data) size = 0;
        uint64_t data = off + TAR_BLOCK, padded;
        int overflow = ferry_add_overflow(size, TAR_BLOCK - 1, &padded);
        padded &= ~(uint64_t)(TAR_BLOCK - 1);
        if (overflow || padded > r->size - data) {
            rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: member \"%.*s\": %llu bytes of data, the file has %llu"
                              " after its header (truncated?)", r->path, (unsigned long long)off, (int)nl,
                              (const char *)h, (unsigned long long)size, (unsigned long long)(r->size - data));
            break;
        }
        if (type == 'L' || type == 'x' || type == 'g') {
            size_t lim = type == 'L' ? TAR_MAX_NAME : TAR_MAX_PAX;
            if (size > lim) {
                rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: %s of %llu bytes (at most %zu)", r->path,
                                  (unsigned long long)off, type == 'L' ? "GNU long name" : "pax header",
                                  (unsigned long long)size, lim);
                break;
            }
            const uint8_t *d;
            if ((rc = src_get(r, data, (size_t)size, &d)) < 0) break;
            if (type == 'L') {
                size_t ln = strnlen((const char *)d, (size_t)size);
                free(pd.name);
                if (ln == 0 || !(pd.name = strndup((const char *)d, ln))) {
                    rc = ln ? ferry_seterr(FERRY_ENOMEM, "out of memory")
                            : ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: empty GNU long name", r->path,
                                           (unsigned long long)off);
                    pd.name = NULL;
                    break;
                }
            } else if ((rc = tar_pax(r, d, (size_t)size, data, &pd, type == 'g')) < 0) {
                break;
            }
            off = data + padded;
            continue;
        }
        if (type == 'S' || type == 'M') {
            rc = ferry_seterr(FERRY_EUNSUPPORTED, "%s: byte %llu: member \"%.*s\": a GNU %s member: not read", r->path,
                              (unsigned long long)off, (int)nl, (const char *)h,
                              type == 'S' ? "sparse" : "multi-volume");
            break;
        }
        if (regular) {
            if (pd.name) {
                snprintf(name, TAR_MAX_NAME + 1, "%s", pd.name);
            } else {
                int posix = !memcmp(h + 257, "ustar\0", 6);
                size_t pl = posix ? strnlen((const char *)h + 345, 155) : 0;
                snprintf(name, TAR_MAX_NAME + 1, "%.*s%s%.*s", (int)pl, (const char *)h + 345, pl ? "/" : "", (int)nl,
                         (const char *)h);
            }
            if ((rc = tar_member(s, name, file, data, size, off)) < 0) break;
            nmem++;
            total += size;
            r->avg = total / nmem;
        }
        free(pd.name);
        pd = (pending){0};
        off = data + padded;
    }
    free(pd.name);
    free(name);
    return rc;
}

int ferry_tar_index(ferry_shards *s, const char *path) {
    ferry_file *f;
    int rc = ferry_file_open(s->ctx, path, FERRY_READ, &f);
    if (rc < 0) return rc;
    int64_t size = ferry_file_size(f);
    uint32_t file;
    if (size < 0) rc = (int)size;
    else if ((rc = ferry_shards_add_file(s, path, (uint64_t)size, &file)) == 0) {
        tar_src r = {.path = path, .size = (uint64_t)size, .w = {.path = path, .size = (uint64_t)size, .f = f}};
        rc = tar_walk(s, &r, file);
        ferry_window_free(&r.w);
        if (rc >= 0) {
            ferry_shards_hold(s, file, f);
            return rc;
        }
    }
    ferry_file_close(f);
    return rc;
}

int ferry_tar_index_mem(ferry_shards *s, const char *name, const uint8_t *data, size_t n) {
    uint32_t file;
    int rc = ferry_shards_add_file(s, name, n, &file);
    if (rc < 0) return rc;
    tar_src r = {.path = name, .size = n, .w = {.path = name, .size = n, .mem = data}};
    return tar_walk(s, &r, file);
}
