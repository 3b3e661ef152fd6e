/* super.c — the HDF5 file under the parser: errors, bounded and cached
 * metadata reads, the lookup3 checksum of version-2 structures, and the
 * superblock (versions 0-3).
 *
 * Superblock layouts (File Format Specification 3.0, "Superblock"):
 *   v0/1: signature, versions (superblock, free space, root symbol table,
 *         reserved, shared header), size of offsets, size of lengths, reserved,
 *         group leaf K (2), group internal K (2), flags (4), [v1: indexed
 *         storage K (2), reserved (2)], base, free-space, end-of-file and
 *         driver addresses, root group symbol table entry.
 *   v2/3: signature, version, size of offsets, size of lengths, flags (1),
 *         base, extension, end-of-file and root object header addresses,
 *         checksum.
 * Every address counts from the base address (the signature's position when
 * a user block precedes it). */
#include "formats/hdf5/h5.h"
#include <stdio.h>
#include <stdlib.h>

struct h5_blk { uint64_t addr, len; uint8_t *data; };

int h5_fail(const h5_file *h, int code, uint64_t pos, const char *what, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ferry_seterr(code, "%s: byte %llu: %s%s%s", h->path, (unsigned long long)pos, what ? what : "",
                        what && *what ? ": " : "", msg);
}

int h5_abs(const h5_file *h, uint64_t addr, uint64_t n, uint64_t *abs, const char *what) {
    uint64_t a, end;
    if (addr == H5_UNDEF || ferry_add_overflow(h->base, addr, &a) || ferry_add_overflow(a, n, &end) ||
        end > h->size)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: %s%s%llu bytes at address %llu: outside the file (%llu bytes)",
                            h->path, (unsigned long long)(h->base + (addr == H5_UNDEF ? 0 : addr)), what ? what : "",
                            what ? ": " : "", (unsigned long long)n, (unsigned long long)addr,
                            (unsigned long long)h->size);
    *abs = a;
    return 0;
}

void *h5_alloc(h5_file *h, size_t n) {
    if (h->nallocs == h->cap_allocs) {
        size_t cap = h->cap_allocs ? h->cap_allocs * 2 : 64;
        void **na = realloc(h->allocs, cap * sizeof *na);
        if (!na) { ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path); return NULL; }
        h->allocs = na;
        h->cap_allocs = cap;
    }
    void *p = calloc(1, n ? n : 1);
    if (!p) { ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path); return NULL; }
    h->allocs[h->nallocs++] = p;
    return p;
}

char *h5_strndup(h5_file *h, const char *s, size_t n) {
    char *p = h5_alloc(h, n + 1);
    if (p) memcpy(p, s, n);
    return p;
}

static size_t blk_hash(uint64_t addr, uint64_t len, size_t mask) {
    uint64_t x = addr * 0x9E3779B97F4A7C15ull ^ (len + 0x632BE59BD9B4E019ull);
    return (size_t)(x ^ (x >> 31)) & mask;
}

static int cache_put(h5_file *h, h5_blk *b) {
    if (2 * (h->tab_n + 1) > h->tab_cap) {
        size_t cap = h->tab_cap ? h->tab_cap * 2 : 256;
        h5_blk **nt = calloc(cap, sizeof *nt);
        if (!nt) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path);
        for (size_t i = 0; i < h->tab_cap; i++)
            if (h->tab[i]) {
                size_t j = blk_hash(h->tab[i]->addr, h->tab[i]->len, cap - 1);
                while (nt[j]) j = (j + 1) & (cap - 1);
                nt[j] = h->tab[i];
            }
        free(h->tab);
        h->tab = nt;
        h->tab_cap = cap;
    }
    size_t j = blk_hash(b->addr, b->len, h->tab_cap - 1);
    while (h->tab[j]) j = (j + 1) & (h->tab_cap - 1);
    h->tab[j] = b;
    h->tab_n++;
    return 0;
}

/* n bytes at abs into d: a small read is served from a window of
 * H5_READ_AHEAD bytes read at once (an open reads thousands of headers of a
 * few hundred bytes each, mostly near one another: one read per window, not
 * per header); a large one is read as it is. Returns the bytes read or a
 * negative ferry_status, as ferry_pread. */
static int64_t read_ahead(h5_file *h, uint8_t *d, uint64_t abs, uint64_t n) {
    if (n > H5_READ_AHEAD / 2 || abs >= h->size)
        return ferry_pread(h->f, ferry_host_buf(d, n), abs, n, FERRY_NO_DIRECT);
    if (!(h->ra && abs >= h->ra_abs && abs - h->ra_abs <= h->ra_len && n <= h->ra_len - (abs - h->ra_abs))) {
        if (!h->ra && !(h->ra = malloc(H5_READ_AHEAD))) return FERRY_ENOMEM;
        uint64_t len = h->size - abs < H5_READ_AHEAD ? h->size - abs : H5_READ_AHEAD;
        int64_t got = ferry_pread(h->f, ferry_host_buf(h->ra, len), abs, len, FERRY_NO_DIRECT);
        if (got < 0) { h->ra_len = 0; return got; }
        h->ra_abs = abs;
        h->ra_len = (uint64_t)got;
        if ((uint64_t)got < n) { memcpy(d, h->ra, (size_t)got); return got; }
    }
    memcpy(d, h->ra + (abs - h->ra_abs), n);
    return (int64_t)n;
}

int h5_read(h5_file *h, uint64_t addr, uint64_t n, const uint8_t **out, const char *what) {
    uint64_t abs = 0;
    int rc = h5_abs(h, addr, n, &abs, what);
    if (rc) return rc;
    if (h->tab_cap)
        for (size_t j = blk_hash(abs, n, h->tab_cap - 1); h->tab[j]; j = (j + 1) & (h->tab_cap - 1))
            if (h->tab[j]->addr == abs && h->tab[j]->len == n) { *out = h->tab[j]->data; return 0; }
    if (h->cached + n > H5_MAX_META)
        return ferry_seterr(FERRY_EFORMAT, "%s: %s: more than %llu MiB of metadata", h->path, what ? what : "header",
                            (unsigned long long)(H5_MAX_META >> 20));
    h5_blk *b = malloc(sizeof *b);
    uint8_t *d = malloc(n ? n : 1);
    if (!b || !d) { free(b); free(d); return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path); }
    int64_t got = n ? read_ahead(h, d, abs, n) : 0;
    if (got != (int64_t)n) {
        free(b); free(d);
        if (got < 0) return ferry_preerr((int)got, "%s", h->path);
        return h5_fail(h, FERRY_EFORMAT, abs, what, "file ends inside %llu bytes", (unsigned long long)n);
    }
    *b = (h5_blk){abs, n, d};
    if ((rc = cache_put(h, b))) { free(b); free(d); return rc; }
    h->cached += n;
    *out = d;
    return 0;
}

int h5_read_upto(h5_file *h, uint64_t addr, uint64_t n, const uint8_t **out, uint64_t *got, const char *what) {
    uint64_t abs = 0;
    int rc = h5_abs(h, addr, 0, &abs, what);
    if (rc) return rc;
    if (n > h->size - abs) n = h->size - abs;
    *got = n;
    return h5_read(h, addr, n, out, what);
}

/* Bob Jenkins' lookup3 "hashlittle" over bytes, initial value 0: the checksum
 * of every version-2 HDF5 structure ("Jenkins lookup3"). */
#define ROT(x, k) (((x) << (k)) | ((x) >> (32 - (k))))
uint32_t h5_lookup3(const uint8_t *k, size_t n) {
    uint32_t a, b, c;
    a = b = c = 0xdeadbeefu + (uint32_t)n;
    while (n > 12) {
        a += ferry_le32(k); b += ferry_le32(k + 4); c += ferry_le32(k + 8);
        a -= c; a ^= ROT(c, 4); c += b;
        b -= a; b ^= ROT(a, 6); a += c;
        c -= b; c ^= ROT(b, 8); b += a;
        a -= c; a ^= ROT(c, 16); c += b;
        b -= a; b ^= ROT(a, 19); a += c;
        c -= b; c ^= ROT(b, 4); b += a;
        n -= 12; k += 12;
    }
    if (n == 0) return c;
    uint8_t t[12] = {0};
    memcpy(t, k, n);
    a += ferry_le32(t); b += ferry_le32(t + 4); c += ferry_le32(t + 8);
    c ^= b; c -= ROT(b, 14);
    a ^= c; a -= ROT(c, 11);
    b ^= a; b -= ROT(a, 25);
    c ^= b; c -= ROT(b, 16);
    a ^= c; a -= ROT(c, 4);
    b ^= a; b -= ROT(a, 14);
    c ^= b; c -= ROT(b, 24);
    return c;
}

int h5_check_sum(const h5_file *h, const uint8_t *p, uint64_t n, uint64_t pos, const char *what) {
    if (n < 4) return h5_fail(h, FERRY_EFORMAT, pos, what, "too short for its checksum");
    uint32_t want = ferry_le32(p + n - 4), got = h5_lookup3(p, n - 4);
    if (want != got)
        return h5_fail(h, FERRY_EFORMAT, pos, what, "checksum mismatch (stored %08x, computed %08x): damaged metadata",
                       want, got);
    return 0;
}

static const uint8_t SIG[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

int h5_file_open(h5_file *h, ferry_file *f, const char *path) {
    h->f = f;
    h->path = path;
    int64_t sz = ferry_file_size(f);
    if (sz < 0) return ferry_preerr((int)sz, "%s", path);
    h->size = (uint64_t)sz;
    h->root_btree = h->root_heap = H5_UNDEF;
    h->btree_k_chunk = 32;
    /* the signature: at 0, 512, 1024, 2048, ... (after a user block) */
    uint64_t at = 0;
    const uint8_t *p;
    for (;; at = at ? at * 2 : 512) {
        if (at + 8 > h->size) return ferry_seterr(FERRY_ENOFORMAT, "%s: no HDF5 signature", path);
        h->base = 0;
        int rc = h5_read(h, at, 8, &p, "signature");
        if (rc) return rc;
        if (!memcmp(p, SIG, 8)) break;
    }
    uint64_t got;
    int rc = h5_read_upto(h, at, 128, &p, &got, "superblock");
    if (rc) return rc;
    h5_cur c = {p, p + got, at, 0, 8, 8};
    h5c_skip(&c, 8);
    h->sb_version = h5c_u8(&c);
    const char *what = "superblock";
    if (c.bad) return h5_fail(h, FERRY_EFORMAT, at, what, "truncated");
    if (h->sb_version > 3) return h5_fail(h, FERRY_EUNSUPPORTED, at + 8, what, "version %d (0-3 supported)", h->sb_version);
    uint64_t base, eof;
    if (h->sb_version <= 1) {
        h5c_skip(&c, 4);                       /* free-space, root symbol table, reserved, shared header versions */
        h->so = c.so = h5c_u8(&c);
        h->sl = c.sl = h5c_u8(&c);
        h5c_skip(&c, 1);
        h5c_skip(&c, 4);                       /* group K values */
        h5c_skip(&c, 4);                       /* consistency flags */
        if (h->sb_version == 1) {
            uint16_t k = h5c_u16(&c);
            if (k) h->btree_k_chunk = k;
            h5c_skip(&c, 2);
        }
    } else {
        h->so = c.so = h5c_u8(&c);
        h->sl = c.sl = h5c_u8(&c);
        h5c_skip(&c, 1);
    }
    if (c.bad) return h5_fail(h, FERRY_EFORMAT, at, what, "truncated");
    if ((h->so != 2 && h->so != 4 && h->so != 8) || (h->sl != 2 && h->sl != 4 && h->sl != 8))
        return h5_fail(h, FERRY_EFORMAT, at + 13, what, "size of offsets %u / lengths %u (2, 4 or 8)", h->so, h->sl);
    base = h5c_addr(&c);
    if (h->sb_version <= 1) {
        h5c_addr(&c);                          /* free-space info */
        eof = h5c_addr(&c);
        h5c_addr(&c);                          /* driver info */
        /* root group symbol table entry: link name offset, header address,
         * cache type, reserved, scratch (B-tree and heap when cache type 1) */
        h5c_addr(&c);
        h->root = h5c_addr(&c);
        uint32_t cache = h5c_u32(&c);
        h5c_skip(&c, 4);
        if (cache == 1) { h->root_btree = h5c_addr(&c); h->root_heap = h5c_addr(&c); }
    } else {
        h5c_addr(&c);                          /* superblock extension */
        eof = h5c_addr(&c);
        h->root = h5c_addr(&c);
        uint64_t n = (uint64_t)(c.p - p);
        h5c_skip(&c, 4);                       /* the checksum, which must be there */
        if (!c.bad && (rc = h5_check_sum(h, p, n + 4, at, what))) return rc;
    }
    if (c.bad) return h5_fail(h, FERRY_EFORMAT, at, what, "truncated");
    /* addresses count from the signature's place: the stored base address
     * (that place, or 0 in a file copied behind a user block) is not trusted */
    (void)base;
    (void)eof;
    h->base = at;
    if (h->root == H5_UNDEF) return h5_fail(h, FERRY_EFORMAT, at, what, "no root group");
    return 0;
}

void h5_read_ahead_drop(h5_file *h) {
    free(h->ra);
    h->ra = NULL;
    h->ra_abs = h->ra_len = 0;
}

void h5_file_free(h5_file *h) {
    for (size_t i = 0; i < h->tab_cap; i++)
        if (h->tab[i]) { free(h->tab[i]->data); free(h->tab[i]); }
    free(h->tab);
    for (size_t i = 0; i < h->nallocs; i++) free(h->allocs[i]);
    free(h->allocs);
    free(h->ra);
    free(h->amemo);   /* attr.c's table; the attribute lists it points at are allocations above */
    memset(h, 0, sizeof *h);
}
