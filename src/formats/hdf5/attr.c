/* attr.c — attributes: the "Attribute Message"s of an object header
 * (compact) and those stored in a fractal heap behind an "Attribute Info
 * Message" (dense: more than 8 attributes, or big ones), and their values as
 * JSON in the shape netCDF classic files give (format.c's netcdf3 notes):
 * numbers {"type": "<typestr>", "value": [...]}, text a string (an array of
 * strings for several). Attributes of a type that has no JSON form here
 * (compound, references, nested variable-length sequences) become null.
 *
 * Message versions: 1 pads the name, datatype and dataspace to 8 bytes; 2
 * does not; 3 adds a character-set byte. A committed datatype (flags bit 0)
 * is followed; a shared dataspace (bit 1) is refused. */
#include "formats/hdf5/h5.h"
#include <math.h>
#include <stdlib.h>

static int parse_attr(h5_file *h, const uint8_t *d, uint64_t len, uint64_t pos, const char *what, h5_attr *a) {
    memset(a, 0, sizeof *a);
    a->pos = pos;
    h5_cur c = h5_cur_make(h, d, len, pos);
    uint8_t version = h5c_u8(&c), flags = h5c_u8(&c);
    uint16_t nlen = h5c_u16(&c), tlen = h5c_u16(&c), slen = h5c_u16(&c);
    if (version == 3) h5c_u8(&c);
    if (c.bad || version < 1 || version > 3)
        return h5_fail(h, FERRY_EFORMAT, pos, what, "attribute message version %u", version);
    int pad = version == 1;
    const uint8_t *name = h5c_bytes(&c, pad ? (nlen + 7u) & ~7u : nlen);
    if (!name || nlen == 0) return h5_fail(h, FERRY_EFORMAT, pos, what, "attribute name truncated");
    a->name = h5_strndup(h, (const char *)name, strnlen((const char *)name, nlen));
    if (!a->name) return FERRY_ENOMEM;
    if (flags & 2) return h5_fail(h, FERRY_EUNSUPPORTED, pos, what, "attribute \"%s\": shared dataspace", a->name);
    uint64_t tpos = c.pos;
    const uint8_t *tb = h5c_bytes(&c, pad ? (tlen + 7u) & ~7u : tlen);
    uint64_t spos = c.pos;
    const uint8_t *sb = h5c_bytes(&c, pad ? (slen + 7u) & ~7u : slen);
    if (c.bad) return h5_fail(h, FERRY_EFORMAT, pos, what, "attribute \"%s\" truncated", a->name);
    char label[300];
    snprintf(label, sizeof label, "%s: attribute \"%s\"", what, a->name);
    h5_cur tc = h5_cur_make(h, tb, tlen, tpos), sc = h5_cur_make(h, sb, slen, spos);
    /* flags bit 0: the datatype is committed (netCDF-4 user-defined types) */
    int rc = (flags & 1) ? h5_dtype_shared(h, tb, tlen, tpos, label, &a->type) : h5_dtype_parse(h, &tc, label, 0, &a->type);
    if (!rc) rc = h5_space_parse(h, &sc, label, &a->space);
    if (rc) return rc;
    uint64_t need;
    if (ferry_mul_overflow(a->space.ndim < 0 ? 0 : a->space.npoints, a->type.size, &need) || need > h5c_left(&c))
        return h5_fail(h, FERRY_EFORMAT, pos, label, "%llu values of %u bytes, %llu bytes stored",
                       (unsigned long long)a->space.npoints, a->type.size, (unsigned long long)h5c_left(&c));
    a->data = c.p;
    a->len = need;
    return 0;
}

typedef struct alist { h5_file *h; const char *what; h5_attr *v; size_t n, cap; h5_fheap *heap; } alist;

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const h5_attr *)a)->name, ((const h5_attr *)b)->name);
}

static int push(alist *L, const uint8_t *d, uint64_t len, uint64_t pos) {
    if (L->n == L->cap) {
        if (L->n >= H5_MAX_MEMBERS) return h5_fail(L->h, FERRY_EFORMAT, pos, L->what, "too many attributes");
        size_t cap = L->cap ? L->cap * 2 : 16;
        h5_attr *nv = realloc(L->v, cap * sizeof *nv);
        if (!nv) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", L->h->path);
        L->v = nv;
        L->cap = cap;
    }
    h5_attr *a = &L->v[L->n];
    int rc = parse_attr(L->h, d, len, pos, L->what, a);
    if (rc == FERRY_EUNSUPPORTED && a->name) {
        /* valid but beyond ferry (a shared dataspace, a type in the shared-
         * message heap): listed with a null value, the rest still read */
        const char *name = a->name;
        memset(a, 0, sizeof *a);
        a->name = name;
        a->pos = pos;
        a->type.cls = H5T_COMPOUND;
        a->space.ndim = -1;
        ferry_clearerr();
        rc = 0;
    }
    if (rc) return rc;
    L->n++;
    return 0;
}

static int dense_rec(void *arg, const uint8_t *rec, uint32_t size, uint64_t pos) {
    alist *L = arg;
    if (size < 8) return h5_fail(L->h, FERRY_EFORMAT, pos, L->what, "attribute record of %u bytes", size);
    const uint8_t *p;
    uint64_t n;
    int rc = h5_fheap_get(L->h, L->heap, rec, 8, &p, &n);
    return rc ? rc : push(L, p, n, pos);
}

/* Attributes already parsed, by object header address: an open checks every
 * object of the file (walk_group) and then builds the group's variables from
 * the same objects, and a variable's dense attributes are a B-tree walk and a
 * heap each; parsed once, kept in the file's arena like every parse. */
struct h5_amemo {
    uint64_t addr;
    h5_attr *a;
    size_t n;
    int used;
};

static size_t amemo_slot(uint64_t addr, size_t cap) {
    uint64_t x = addr * 0x9E3779B97F4A7C15ull;
    return (size_t)(x ^ (x >> 29)) & (cap - 1);
}

static const struct h5_amemo *amemo_get(const h5_file *h, uint64_t addr) {
    if (!h->amemo_cap) return NULL;
    for (size_t j = amemo_slot(addr, h->amemo_cap); h->amemo[j].used; j = (j + 1) & (h->amemo_cap - 1))
        if (h->amemo[j].addr == addr) return &h->amemo[j];
    return NULL;
}

/* Remember (addr -> a, n); out of memory only forgets (the next call parses again). */
static void amemo_put(h5_file *h, uint64_t addr, h5_attr *a, size_t n) {
    if (2 * (h->amemo_n + 1) > h->amemo_cap) {
        size_t cap = h->amemo_cap ? h->amemo_cap * 2 : 64;
        struct h5_amemo *nt = calloc(cap, sizeof *nt);
        if (!nt) return;
        for (size_t i = 0; i < h->amemo_cap; i++)
            if (h->amemo[i].used) {
                size_t j = amemo_slot(h->amemo[i].addr, cap);
                while (nt[j].used) j = (j + 1) & (cap - 1);
                nt[j] = h->amemo[i];
            }
        free(h->amemo);
        h->amemo = nt;
        h->amemo_cap = cap;
    }
    size_t j = amemo_slot(addr, h->amemo_cap);
    while (h->amemo[j].used) j = (j + 1) & (h->amemo_cap - 1);
    h->amemo[j] = (struct h5_amemo){addr, a, n, 1};
    h->amemo_n++;
}

int h5_obj_attrs(h5_file *h, const h5_obj *o, h5_attr **out, size_t *n) {
    const struct h5_amemo *hit = amemo_get(h, o->addr);
    if (hit) { *out = hit->a; *n = hit->n; return 0; }
    alist L = {.h = h, .what = o->name};
    int rc = 0;
    for (int i = 0; i < o->nmsgs && !rc; i++)
        if (o->msgs[i].type == H5M_ATTR) rc = push(&L, o->msgs[i].data, o->msgs[i].len, o->msgs[i].pos);
    const h5_msg *m = h5_obj_find(o, H5M_AINFO);
    if (!rc && m) {
        h5_cur c = h5_cur_make(h, m->data, m->len, m->pos);
        uint8_t version = h5c_u8(&c), flags = h5c_u8(&c);
        if (flags & 1) h5c_u16(&c);
        uint64_t heap = h5c_addr(&c), names = h5c_addr(&c), byorder = (flags & 2) ? h5c_addr(&c) : H5_UNDEF;
        if (c.bad || version != 0) rc = h5_fail(h, FERRY_EFORMAT, m->pos, o->name, "attribute info message");
        else if (heap != H5_UNDEF) {
            rc = h5_fheap_open(h, heap, o->name, &L.heap);
            if (!rc) rc = byorder != H5_UNDEF ? h5_btree2_walk(h, byorder, 9, o->name, dense_rec, &L)
                                              : h5_btree2_walk(h, names, 8, o->name, dense_rec, &L);
            /* the name index is in hash order: name order, as HDF5 lists them */
            if (!rc && byorder == H5_UNDEF && L.n) qsort(L.v, L.n, sizeof *L.v, cmp_name);
        }
    }
    if (rc) { free(L.v); return rc; }
    *out = h5_alloc(h, L.n * sizeof **out);
    if (!*out) { free(L.v); return FERRY_ENOMEM; }
    if (L.n) memcpy(*out, L.v, L.n * sizeof **out);
    free(L.v);
    *n = L.n;
    amemo_put(h, o->addr, *out, *n);
    return 0;
}

/* ---- values ----------------------------------------------------------------------- */
static uint64_t load(const uint8_t *p, uint32_t n, int be) {
    uint64_t v = 0;
    for (uint32_t i = 0; i < n; i++) v |= (uint64_t)p[be ? n - 1 - i : i] << (8 * i);
    return v;
}

static double half(uint16_t u) {
    int e = (u >> 10) & 0x1f, m = u & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (u & 0x8000) ? -v : v;
}

static void put_number(ferry_sbuf *b, const h5_type *t, const uint8_t *p) {
    uint64_t u = load(p, t->size, t->big_endian);
    if (t->cls == H5T_FLOAT) {
        if (t->size == 2) ferry_sbuf_json_double(b, half((uint16_t)u), 5);
        else if (t->size == 4) { uint32_t x = (uint32_t)u; float f; memcpy(&f, &x, 4); ferry_sbuf_json_double(b, f, 9); }
        else { double d; memcpy(&d, &u, 8); ferry_sbuf_json_double(b, d, 17); }
    } else if (t->is_signed) {
        int64_t s = t->size < 8 && (u >> (8 * t->size - 1)) ? (int64_t)(u | (~(uint64_t)0 << (8 * t->size))) : (int64_t)u;
        ferry_sbuf_printf(b, "%lld", (long long)s);
    } else {
        ferry_sbuf_printf(b, "%llu", (unsigned long long)u);
    }
}

/* Element i as text: *s, *n (fixed strings stop at the first NUL), or NULL. */
static int element_text(h5_file *h, const h5_attr *a, uint64_t i, const char **s, uint64_t *n) {
    const uint8_t *p = a->data + i * a->type.size;
    if (a->type.cls == H5T_STRING) {
        *s = (const char *)p;
        *n = strnlen(*s, a->type.size);
        return 0;
    }
    /* variable-length: length (4), global heap collection address, object index (4) */
    h5_cur c = h5_cur_make(h, p, a->type.size, a->pos);
    uint32_t len = h5c_u32(&c);
    uint64_t addr = h5c_addr(&c);
    uint32_t ix = h5c_u32(&c);
    if (c.bad) return h5_fail(h, FERRY_EFORMAT, a->pos, a->name, "variable-length value truncated");
    if (len == 0 || addr == 0 || addr == H5_UNDEF) { *s = ""; *n = 0; return 0; }
    const uint8_t *d;
    uint64_t dn;
    int rc = h5_gheap_get(h, addr, ix, a->name, &d, &dn);
    if (rc) return rc;
    if (len > dn) return h5_fail(h, FERRY_EFORMAT, a->pos, a->name, "string of %u bytes in a %llu-byte heap object", len,
                                 (unsigned long long)dn);
    *s = (const char *)d;
    *n = strnlen(*s, len);
    return 0;
}

static int is_text(const h5_type *t) {
    return t->cls == H5T_STRING || (t->cls == H5T_VLEN && t->vlen_string && t->base && t->base->size == 1);
}

int h5_attr_json(h5_file *h, const h5_attr *a, ferry_sbuf *b) {
    const h5_type *t = &a->type;
    uint64_t n = a->space.ndim < 0 ? 0 : a->space.npoints;
    if (is_text(t)) {
        /* no values (h5py.Empty, a null dataspace): the empty text, as netCDF4 reads it */
        if (n == 0) { ferry_sbuf_append(b, "\"\"", 2); return 0; }
        if (n != 1) ferry_sbuf_append(b, "[", 1);
        for (uint64_t i = 0; i < n; i++) {
            const char *s;
            uint64_t k;
            int rc = element_text(h, a, i, &s, &k);
            if (rc) return rc;
            if (i) ferry_sbuf_append(b, ",", 1);
            ferry_sbuf_json_string(b, s, k);
        }
        if (n != 1) ferry_sbuf_append(b, "]", 1);
        return 0;
    }
    if ((t->cls == H5T_INT || t->cls == H5T_FLOAT || t->cls == H5T_ENUM) && t->dt != FERRY_DT_UNKNOWN) {
        ferry_sbuf_printf(b, "{\"type\":\"%s\",\"value\":[", t->typestr);
        for (uint64_t i = 0; i < n; i++) {
            if (i) ferry_sbuf_append(b, ",", 1);
            put_number(b, t, a->data + i * t->size);
        }
        ferry_sbuf_append(b, "]}", 2);
        return 0;
    }
    ferry_sbuf_append(b, "null", 4);
    return 0;
}

const char *h5_attr_string(h5_file *h, const h5_attr *a) {
    if (!is_text(&a->type) || a->space.ndim < 0 || a->space.npoints != 1) return NULL;
    const char *s;
    uint64_t k;
    if (element_text(h, a, 0, &s, &k)) { ferry_clearerr(); return NULL; }
    return h5_strndup(h, s, k);
}
