/* group.c — a group's members, whichever way the group stores them, and the
 * version-1 B-tree walk that symbol-table groups and chunk indexes share.
 *
 *   "Symbol Table Message" (old style): a v1 B-tree of type 0 whose leaves
 *     are symbol nodes ("SNOD": entries of name offset, header address, cache
 *     fields), names in a local heap ("HEAP": data segment size and address).
 *     Members come in name order.
 *   "Link Message"s in the header (compact, new style).
 *   "Link Info Message" with a fractal heap (dense): link messages stored in
 *     the heap, found through the creation-order index (v2 B-tree type 6) when
 *     it exists, else the name index (type 5).
 * Members are listed in creation order where the links record it (netCDF-4
 * lists variables so), else in name order (as HDF5 iterates them).
 * Soft links are followed to the object they name in this file (a dangling
 * one is an error, as netCDF-C and h5py refuse it); external links, whose
 * object lies in another file, are refused naming the link and the file:
 * ferry never reads one file's bytes as another's. */
#include "formats/hdf5/h5.h"
#include <stdlib.h>

typedef struct links {
    h5_file *h;
    const char *what;
    h5_link *v;
    uint64_t *order;
    size_t n, cap;
    int have_order;
    h5_fheap *heap;
} links;

static int push_soft(links *L, const char *name, size_t nlen, const char *target, size_t tlen, uint64_t order);

static int push(links *L, const char *name, size_t nlen, uint64_t addr, uint64_t order) {
    if (L->n >= H5_MAX_MEMBERS) return ferry_seterr(FERRY_EFORMAT, "%s: %s: more than %u links", L->h->path, L->what, H5_MAX_MEMBERS);
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 16;
        h5_link *nv = realloc(L->v, cap * sizeof *nv);
        if (nv) L->v = nv;
        uint64_t *no = realloc(L->order, cap * sizeof *no);
        if (no) L->order = no;
        if (!nv || !no) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", L->h->path);
        L->cap = cap;
    }
    char *s = h5_strndup(L->h, name, nlen);
    if (!s) return FERRY_ENOMEM;
    L->v[L->n] = (h5_link){s, addr, NULL};
    L->order[L->n] = order;
    L->n++;
    return 0;
}

/* A soft link: recorded with its target path, resolved once the group's
 * links are all read (h5_group_links). */
static int push_soft(links *L, const char *name, size_t nlen, const char *target, size_t tlen, uint64_t order) {
    int rc = push(L, name, nlen, H5_UNDEF, order);
    if (rc) return rc;
    char *t = h5_strndup(L->h, target ? target : "", target ? strnlen(target, tlen) : 0);
    if (!t) return FERRY_ENOMEM;
    L->v[L->n - 1].soft = t;
    return 0;
}

/* ---- version-1 B-trees ---------------------------------------------------------- */
typedef struct bt1 {
    h5_file *h;
    const char *what;
    int type;
    uint64_t key_size;
    uint32_t k;                       /* entries per node at most 2k (else read exactly) */
    uint64_t budget;                  /* nodes left to visit */
    h5_bt1_fn fn;
    void *arg;
} bt1;

static int bt1_node(bt1 *t, uint64_t addr, int want_level) {
    h5_file *h = t->h;
    uint64_t abs = h->base + addr, hdr = 8 + 2 * (uint64_t)h->so;
    if (t->budget-- == 0) return h5_fail(h, FERRY_EFORMAT, abs, t->what, "B-tree has more nodes than the file can hold");
    /* the whole node in one read: a node holds at most 2K children */
    uint64_t full = hdr + 2 * (uint64_t)t->k * (h->so + t->key_size) + t->key_size, got;
    const uint8_t *p;
    int rc = h5_read_upto(h, addr, full, &p, &got, t->what);
    if (rc) return rc;
    if (got < hdr || memcmp(p, "TREE", 4) || p[4] != t->type)
        return h5_fail(h, FERRY_EFORMAT, abs, t->what, "not a version-1 B-tree node of type %d", t->type);
    int level = p[5];
    uint32_t n = ferry_le16(p + 6);
    if (want_level >= 0 && level != want_level)
        return h5_fail(h, FERRY_EFORMAT, abs, t->what, "B-tree node at level %d, expected %d", level, want_level);
    uint64_t need = hdr + (uint64_t)n * (h->so + t->key_size) + t->key_size;
    if (need > got && (rc = h5_read(h, addr, need, &p, t->what))) return rc;
    h5_cur c = h5_cur_make(h, p + hdr, need - hdr, abs + hdr);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *key = h5c_bytes(&c, t->key_size);
        uint64_t child = h5c_addr(&c);
        if (c.bad || child == H5_UNDEF) return h5_fail(h, FERRY_EFORMAT, abs, t->what, "bad B-tree child %u", i);
        if (level > 0) rc = bt1_node(t, child, level - 1);
        else rc = t->fn(t->arg, key, child, c.pos - h->so - t->key_size);
        if (rc) return rc;
    }
    return 0;
}

int h5_btree1_walk(h5_file *h, uint64_t addr, int type, uint64_t key_size, const char *what, h5_bt1_fn fn, void *arg) {
    bt1 t = {h, what, type, key_size, type == 0 ? 16 : h->btree_k_chunk, h->size / 24 + 1, fn, arg};
    return bt1_node(&t, addr, -1);
}

/* ---- symbol-table groups ---------------------------------------------------------- */
typedef struct stab { links *L; const uint8_t *heap; uint64_t heap_size; } stab;

static int snod(void *arg, const uint8_t *key, uint64_t child, uint64_t pos) {
    stab *s = arg;
    h5_file *h = s->L->h;
    const char *what = s->L->what;
    const uint8_t *p;
    uint64_t esz = 2 * (uint64_t)h->so + 24, abs = h->base + child;
    int rc = h5_read(h, child, 8, &p, what);
    if (rc) return rc;
    if (memcmp(p, "SNOD", 4) || p[4] != 1) return h5_fail(h, FERRY_EFORMAT, abs, what, "symbol node without \"SNOD\"");
    uint32_t n = ferry_le16(p + 6);
    if ((rc = h5_read(h, child, 8 + n * esz, &p, what))) return rc;
    h5_cur c = h5_cur_make(h, p + 8, n * esz, abs + 8);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t at = c.pos, noff = h5c_addr(&c), oh = h5c_addr(&c);
        uint32_t cache = h5c_u32(&c);
        h5c_skip(&c, 4);
        uint32_t value = h5c_u32(&c);   /* cache type 2 (soft link): the link value's heap offset */
        h5c_skip(&c, 12);
        if (c.bad || noff >= s->heap_size)
            return h5_fail(h, FERRY_EFORMAT, at, what, "symbol name offset %llu outside the local heap (%llu bytes)",
                           (unsigned long long)noff, (unsigned long long)s->heap_size);
        const char *name = (const char *)s->heap + noff;
        size_t len = strnlen(name, s->heap_size - noff);
        if (len == s->heap_size - noff) return h5_fail(h, FERRY_EFORMAT, at, what, "symbol name not terminated");
        if (cache == 2) {
            if (value >= s->heap_size || strnlen((const char *)s->heap + value, s->heap_size - value) == s->heap_size - value)
                return h5_fail(h, FERRY_EFORMAT, at, what, "soft link value outside the local heap");
            const char *t = (const char *)s->heap + value;
            if ((rc = push_soft(s->L, name, len, t, strlen(t), s->L->n))) return rc;
            continue;
        }
        if ((rc = push(s->L, name, len, oh, s->L->n))) return rc;
    }
    (void)key; (void)pos;
    return 0;
}

static int stab_links(links *L, uint64_t btree, uint64_t heap) {
    h5_file *h = L->h;
    const uint8_t *p;
    uint64_t hl = 8 + 2 * (uint64_t)h->sl + h->so;
    int rc = h5_read(h, heap, hl, &p, L->what);
    if (rc) return rc;
    if (memcmp(p, "HEAP", 4) || p[4] != 0)
        return h5_fail(h, FERRY_EFORMAT, h->base + heap, L->what, "local heap without \"HEAP\"");
    h5_cur c = h5_cur_make(h, p + 8, hl - 8, h->base + heap + 8);
    stab s = {L, NULL, h5c_len(&c)};
    h5c_len(&c);
    uint64_t data = h5c_addr(&c);
    if ((rc = h5_read(h, data, s.heap_size, &s.heap, L->what))) return rc;
    return h5_btree1_walk(h, btree, 0, h->sl, L->what, snod, &s);
}

/* ---- link messages ---------------------------------------------------------------- */
static int link_msg(links *L, const uint8_t *d, uint64_t len, uint64_t pos) {
    h5_file *h = L->h;
    h5_cur c = h5_cur_make(h, d, len, pos);
    uint8_t version = h5c_u8(&c), flags = h5c_u8(&c), type = 0;
    if (version != 1) return h5_fail(h, FERRY_EFORMAT, pos, L->what, "link message version %u", version);
    if (flags & 0x08) type = h5c_u8(&c);
    uint64_t order = L->n;
    if (flags & 0x04) { order = h5c_u64(&c); L->have_order = 1; }
    if (flags & 0x10) h5c_u8(&c);
    uint64_t nlen = h5c_un(&c, 1u << (flags & 3));
    const uint8_t *name = h5c_bytes(&c, nlen);
    uint64_t addr = H5_UNDEF;
    const uint8_t *value = NULL;
    uint16_t vlen = 0;
    if (type == 0) addr = h5c_addr(&c);
    else { vlen = h5c_u16(&c); value = h5c_bytes(&c, vlen); }
    if (c.bad || nlen == 0) return h5_fail(h, FERRY_EFORMAT, pos, L->what, "link message truncated");
    if (type == 0) return push(L, (const char *)name, nlen, addr, order);
    if (type == 1) return push_soft(L, (const char *)name, nlen, (const char *)value, vlen, order);
    if (type == 64) {
        /* flags byte, then the file's name and the object's path, each NUL-terminated */
        const char *file = vlen > 1 ? (const char *)value + 1 : "";
        size_t fl = vlen > 1 ? strnlen(file, vlen - 1u) : 0;
        const char *obj = fl + 2 < vlen ? file + fl + 1 : "";
        size_t ol = fl + 2 < vlen ? strnlen(obj, vlen - 2u - fl) : 0;
        return h5_fail(h, FERRY_EUNSUPPORTED, pos, L->what,
                       "\"%.*s\" is an external link to \"%.*s\" in the file \"%.*s\": ferry does not follow links "
                       "into other files (read that file itself)", (int)(nlen > 256 ? 256 : nlen), (const char *)name,
                       (int)ol, obj, (int)fl, file);
    }
    return h5_fail(h, FERRY_EUNSUPPORTED, pos, L->what, "link \"%.*s\" of type %u (user-defined)",
                   (int)(nlen > 256 ? 256 : nlen), (const char *)name, type);
}

static int dense_rec(void *arg, const uint8_t *rec, uint32_t size, uint64_t pos) {
    links *L = arg;
    uint32_t idlen = h5_fheap_idlen(L->heap);
    /* name index (type 5): hash (4), heap ID; creation order (type 6): order (8), heap ID */
    uint32_t skip = size == 4 + idlen ? 4 : 8;
    if (skip + idlen > size) return h5_fail(L->h, FERRY_EFORMAT, pos, L->what, "link record of %u bytes", size);
    const uint8_t *p;
    uint64_t n;
    int rc = h5_fheap_get(L->h, L->heap, rec + skip, idlen, &p, &n);
    if (rc) return rc;
    return link_msg(L, p, n, pos);
}

static int cmp_order(const void *a, const void *b, void *arg) {
    const uint64_t *o = arg;
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return o[x] < o[y] ? -1 : o[x] > o[y] ? 1 : (x > y) - (x < y);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const h5_link *)a)->name, ((const h5_link *)b)->name);
}

int h5_is_group(const h5_obj *o) {
    return h5_obj_find(o, H5M_STAB) || h5_obj_find(o, H5M_LINFO) || h5_obj_find(o, H5M_LINK) || h5_obj_find(o, H5M_GINFO);
}

static int links_of(h5_file *h, const h5_obj *o, int follow, h5_link **out, size_t *n);

/* Soft links one file may resolve in all: depth alone does not bound the
 * work, since links whose paths pass through other links several times
 * multiply it at every level (a small file could ask for 3^25 walks). */
#define H5_MAX_SOFT_STEPS (1u << 16)

/* The object a soft link names: its path walked from the root ("/a/b") or
 * from the link's group ("a/b"), through groups whose soft links resolve the
 * same way (h->soft_depth bounds chains and cycles, h->soft_steps the work). */
static int resolve(h5_file *h, const h5_obj *g, h5_link *l) {
    if (h->soft_depth >= H5_MAX_DEPTH)
        return h5_fail(h, FERRY_EFORMAT, h->base + g->addr, g->name, "soft link \"%s\": more than %d links to follow",
                       l->name, H5_MAX_DEPTH);
    if (++h->soft_steps > H5_MAX_SOFT_STEPS)
        return h5_fail(h, FERRY_EFORMAT, h->base + g->addr, g->name, "soft link \"%s\": the file's soft links "
                       "ask for more than %u resolutions", l->name, H5_MAX_SOFT_STEPS);
    h->soft_depth++;
    const char *p = l->soft;
    h5_obj cur = *g;
    int rc = 0;
    if (*p == '/') rc = h5_ohdr_read(h, h->root, "/", &cur);
    while (!rc) {
        while (*p == '/') p++;
        if (!*p) break;
        size_t k = strcspn(p, "/");
        h5_link *ls;
        size_t n, i = 0;
        if (!h5_is_group(&cur) || (rc = links_of(h, &cur, 0, &ls, &n))) {
            if (!rc) rc = FERRY_ENOTFOUND;
            break;
        }
        while (i < n && (strlen(ls[i].name) != k || memcmp(ls[i].name, p, k))) i++;
        if (i == n) { rc = FERRY_ENOTFOUND; break; }
        if (ls[i].soft && (rc = resolve(h, &cur, &ls[i]))) break;
        uint64_t addr = ls[i].addr;
        p += k;
        rc = h5_ohdr_read(h, addr, l->soft, &cur);
    }
    h->soft_depth--;
    if (rc == FERRY_ENOTFOUND)
        return h5_fail(h, FERRY_EFORMAT, h->base + g->addr, g->name, "soft link \"%s\" to \"%s\": no such object",
                       l->name, l->soft);
    if (rc) return rc;
    l->addr = cur.addr;
    return 0;
}

int h5_group_links(h5_file *h, const h5_obj *o, h5_link **out, size_t *n) { return links_of(h, o, 1, out, n); }

/* follow: resolve soft links (0 while resolving one: a link to its own group
 * would otherwise resolve itself) */
static int links_of(h5_file *h, const h5_obj *o, int follow, h5_link **out, size_t *n) {
    links L = {.h = h, .what = o->name};
    int rc = 0;
    const h5_msg *m;
    if ((m = h5_obj_find(o, H5M_STAB))) {
        h5_cur c = h5_cur_make(h, m->data, m->len, m->pos);
        uint64_t bt = h5c_addr(&c), heap = h5c_addr(&c);
        if (c.bad) return h5_fail(h, FERRY_EFORMAT, m->pos, o->name, "symbol table message truncated");
        rc = stab_links(&L, bt, heap);
    } else if (o->addr == h->root && h->root_btree != H5_UNDEF && !h5_obj_find(o, H5M_LINFO)) {
        rc = stab_links(&L, h->root_btree, h->root_heap);
    } else {
        for (int i = 0; i < o->nmsgs && !rc; i++)
            if (o->msgs[i].type == H5M_LINK) rc = link_msg(&L, o->msgs[i].data, o->msgs[i].len, o->msgs[i].pos);
        if (!rc && (m = h5_obj_find(o, H5M_LINFO))) {
            h5_cur c = h5_cur_make(h, m->data, m->len, m->pos);
            uint8_t version = h5c_u8(&c), flags = h5c_u8(&c);
            if (flags & 1) h5c_u64(&c);
            uint64_t heap = h5c_addr(&c), names = h5c_addr(&c), byorder = (flags & 2) ? h5c_addr(&c) : H5_UNDEF;
            if (c.bad || version != 0) rc = h5_fail(h, FERRY_EFORMAT, m->pos, o->name, "link info message");
            else if (heap != H5_UNDEF) {
                rc = h5_fheap_open(h, heap, o->name, &L.heap);
                if (!rc) rc = byorder != H5_UNDEF ? h5_btree2_walk(h, byorder, 6, o->name, dense_rec, &L)
                                                  : h5_btree2_walk(h, names, 5, o->name, dense_rec, &L);
            }
        }
    }
    if (!rc && L.n && L.have_order) {
        /* creation order, as netCDF-4 lists variables */
        size_t *ix = malloc(L.n * sizeof *ix);
        h5_link *sorted = malloc(L.n * sizeof *sorted);
        if (!ix || !sorted) rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path);
        else {
            for (size_t i = 0; i < L.n; i++) ix[i] = i;
            qsort_r(ix, L.n, sizeof *ix, cmp_order, L.order);
            for (size_t i = 0; i < L.n; i++) sorted[i] = L.v[ix[i]];
            memcpy(L.v, sorted, L.n * sizeof *sorted);
        }
        free(ix);
        free(sorted);
    } else if (!rc && L.n) {
        /* no creation order: name order, as HDF5 lists such groups */
        qsort(L.v, L.n, sizeof *L.v, cmp_name);
    }
    free(L.order);
    for (size_t i = 0; i < L.n && !rc && follow; i++)
        if (L.v[i].soft) rc = resolve(h, o, &L.v[i]);
    if (rc) { free(L.v); return rc; }
    *out = h5_alloc(h, L.n * sizeof **out);
    if (!*out) { free(L.v); return FERRY_ENOMEM; }
    if (L.n) memcpy(*out, L.v, L.n * sizeof **out);
    free(L.v);
    *n = L.n;
    return 0;
}
