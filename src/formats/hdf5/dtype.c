/* dtype.c — the messages that describe a dataset's values: datatype,
 * dataspace, fill value, filter pipeline, data layout; and global heap
 * objects (where variable-length values live).
 *
 * Datatype ("Datatype Message"): class and version (4 bits each), 24 class
 * bits, size (4), then per class: fixed-point bit offset and precision (bit 0
 * of the class bits: big-endian, bit 3: signed); floating point its bit
 * fields (bit 0 big-endian; bit 6, VAX order, is refused); strings nothing
 * (size = fixed length); enumerations a base type, member names (padded to 8
 * bytes before version 3) and values; variable-length a base type (class bits
 * 0-3: 1 = string); compounds are read only as h5py's complex numbers (two
 * floats of one type), enumerations FALSE/TRUE over a byte as numpy's bool.
 * Other classes are described by their typestr and left to the caller to
 * refuse. */
#include "formats/hdf5/h5.h"
#include <stdio.h>

static void set_num(h5_type *t, char kind) {
    static const ferry_dtype ints[2][4] = {{FERRY_DT_U8, FERRY_DT_U16, FERRY_DT_U32, FERRY_DT_U64},
                                           {FERRY_DT_I8, FERRY_DT_I16, FERRY_DT_I32, FERRY_DT_I64}};
    int lg = t->size == 1 ? 0 : t->size == 2 ? 1 : t->size == 4 ? 2 : t->size == 8 ? 3 : -1;
    char order = t->size == 1 ? '|' : t->big_endian ? '>' : '<';
    if (kind == 'f') {
        t->dt = lg == 1 ? FERRY_DT_F16 : lg == 2 ? FERRY_DT_F32 : lg == 3 ? FERRY_DT_F64 : FERRY_DT_UNKNOWN;
    } else {
        t->dt = lg >= 0 ? ints[t->is_signed][lg] : FERRY_DT_UNKNOWN;
        kind = t->is_signed ? 'i' : 'u';
    }
    snprintf(t->typestr, sizeof t->typestr, "%c%c%u", order, kind, t->size);
}

int h5_dtype_parse(h5_file *h, h5_cur *c, const char *what, int depth, h5_type *t) {
    memset(t, 0, sizeof *t);
    uint64_t at = c->pos;
    if (depth > H5_MAX_DEPTH) return h5_fail(h, FERRY_EFORMAT, at, what, "datatypes nest too deep");
    uint8_t cv = h5c_u8(c);
    uint32_t bits = (uint32_t)h5c_un(c, 3);
    t->cls = (h5_class)(cv & 0x0f);
    unsigned version = cv >> 4;
    t->size = h5c_u32(c);
    if (c->bad) return h5_fail(h, FERRY_EFORMAT, at, what, "datatype truncated");
    /* version 5 (HDF5 2.0) keeps version 3's encodings for the classes read here */
    if (version < 1 || version > 5) return h5_fail(h, FERRY_EFORMAT, at, what, "datatype version %u", version);
    if (t->size == 0 || t->size > (1u << 20)) return h5_fail(h, FERRY_EFORMAT, at, what, "datatype of %u bytes", t->size);
    t->big_endian = bits & 1;
    switch (t->cls) {
    case H5T_INT:
        t->is_signed = (bits >> 3) & 1;
        h5c_skip(c, 4);
        set_num(t, 'i');
        break;
    case H5T_FLOAT:
        h5c_skip(c, 12);
        if (bits & 0x40) {
            snprintf(t->typestr, sizeof t->typestr, "VAX-f%u", t->size);
            break;
        }
        set_num(t, 'f');
        break;
    case H5T_STRING:
        t->dt = t->size == 1 ? FERRY_DT_CHAR : FERRY_DT_BYTES;
        snprintf(t->typestr, sizeof t->typestr, "|S%u", t->size);
        break;
    case H5T_BITFIELD:
        h5c_skip(c, 4);
        snprintf(t->typestr, sizeof t->typestr, "|V%u", t->size);
        t->dt = FERRY_DT_BYTES;
        break;
    case H5T_OPAQUE:
        h5c_skip(c, bits & 0xff);
        snprintf(t->typestr, sizeof t->typestr, "|V%u", t->size);
        t->dt = FERRY_DT_BYTES;
        break;
    case H5T_REFERENCE:
        snprintf(t->typestr, sizeof t->typestr, "reference");
        break;
    case H5T_ENUM: {
        t->nmembers = bits & 0xffff;
        t->base = h5_alloc(h, sizeof *t->base);
        if (!t->base) return FERRY_ENOMEM;
        int rc = h5_dtype_parse(h, c, what, depth + 1, t->base);
        if (rc) return rc;
        if (t->base->cls != H5T_INT || t->base->size != t->size)
            return h5_fail(h, FERRY_EUNSUPPORTED, at, what, "enumeration over a %s base", t->base->typestr);
        if (t->nmembers > h5c_left(c)) return h5_fail(h, FERRY_EFORMAT, at, what, "%u enum members", t->nmembers);
        t->names = h5_alloc(h, (t->nmembers + 1) * sizeof *t->names);
        if (!t->names) return FERRY_ENOMEM;
        for (uint32_t i = 0; i < t->nmembers; i++) {
            const char *s = (const char *)c->p;
            size_t n = strnlen(s, h5c_left(c));
            if (n == h5c_left(c)) return h5_fail(h, FERRY_EFORMAT, c->pos, what, "enum member name not terminated");
            if (!(t->names[i] = h5_strndup(h, s, n))) return FERRY_ENOMEM;
            h5c_skip(c, version >= 3 ? n + 1 : (n + 8) & ~(size_t)7);
        }
        uint64_t vb;
        if (ferry_mul_overflow(t->nmembers, t->size, &vb)) vb = UINT64_MAX;
        t->values = h5c_bytes(c, vb);
        if (c->bad) return h5_fail(h, FERRY_EFORMAT, at, what, "enumeration truncated");
        t->dt = t->base->dt;
        t->is_signed = t->base->is_signed;
        t->big_endian = t->base->big_endian;
        memcpy(t->typestr, t->base->typestr, sizeof t->typestr);
        /* numpy's bool as h5py stores it: FALSE = 0, TRUE = 1 over one byte */
        if (t->size == 1 && t->nmembers == 2 && !strcmp(t->names[0], "FALSE") && !strcmp(t->names[1], "TRUE") &&
            t->values[0] == 0 && t->values[1] == 1) {
            t->dt = FERRY_DT_BOOL;
            snprintf(t->typestr, sizeof t->typestr, "|b1");
        }
        break;
    }
    case H5T_VLEN: {
        t->vlen_string = (bits & 0x0f) == 1;
        t->base = h5_alloc(h, sizeof *t->base);
        if (!t->base) return FERRY_ENOMEM;
        int rc = h5_dtype_parse(h, c, what, depth + 1, t->base);
        if (rc) return rc;
        snprintf(t->typestr, sizeof t->typestr, "%s", t->vlen_string ? "vlen-string" : "vlen");
        /* bits 0-3 say string or sequence, not a byte order: a stored element is
         * a reference (length, heap collection, object index) in the file's own
         * little-endian fields. Strings of bytes are text ferry reads (strings.c). */
        t->big_endian = 0;
        if (t->vlen_string && t->base->size == 1 && t->size == 4 + (uint32_t)h->so + 4) {
            t->dt = FERRY_DT_STRING;
            snprintf(t->typestr, sizeof t->typestr, "|O");
        }
        break;
    }
    case H5T_COMPOUND: {
        /* h5py's complex numbers: two members of one float type, at 0 and size/2 */
        snprintf(t->typestr, sizeof t->typestr, "compound");
        uint32_t n = bits & 0xffff;
        h5_type m[2];
        uint64_t offs[2] = {0, 0};
        int complex = n == 2;
        for (uint32_t i = 0; i < n && complex; i++) {
            size_t len = strnlen((const char *)c->p, h5c_left(c));
            if (len == h5c_left(c)) return h5_fail(h, FERRY_EFORMAT, c->pos, what, "member name not terminated");
            h5c_skip(c, version >= 3 ? len + 1 : (len + 8) & ~(size_t)7);
            if (version >= 3) {
                unsigned ob = t->size < 256 ? 1 : t->size < 65536 ? 2 : t->size < (1u << 24) ? 3 : 4;
                offs[i] = h5c_un(c, ob);
            } else {
                offs[i] = h5c_u32(c);
                if (version == 1) h5c_skip(c, 1 + 3 + 4 + 4 + 16);   /* array fields of version 1 */
            }
            int rc = h5_dtype_parse(h, c, what, depth + 1, &m[i]);
            if (rc) return rc;
            complex = m[i].cls == H5T_FLOAT && (m[i].size == 4 || m[i].size == 8);
        }
        if (complex && m[0].size == m[1].size && m[0].big_endian == m[1].big_endian && offs[0] == 0 &&
            offs[1] == m[0].size && t->size == 2 * m[0].size) {
            t->dt = m[0].size == 4 ? FERRY_DT_C64 : FERRY_DT_C128;
            t->big_endian = m[0].big_endian;
            t->is_complex = 1;
            snprintf(t->typestr, sizeof t->typestr, "%cc%u", t->big_endian ? '>' : '<', t->size);
        }
        c->p = c->end;                /* the rest unparsed: the caller refuses other compounds */
        break;
    }
    case H5T_ARRAY:
        snprintf(t->typestr, sizeof t->typestr, "array");
        c->p = c->end;
        break;
    default:
        snprintf(t->typestr, sizeof t->typestr, "class-%u", (unsigned)t->cls & 0x0f);
        c->p = c->end;
        break;
    }
    if (c->bad) return h5_fail(h, FERRY_EFORMAT, at, what, "datatype truncated");
    return 0;
}

/* A shared datatype message (d, len at pos): the address of a committed
 * datatype, followed (through further shared messages, a bounded chain) to
 * the datatype itself. Types in the shared-message heap are refused. */
int h5_dtype_shared(h5_file *h, const uint8_t *d, uint64_t len, uint64_t pos, const char *what, h5_type *t) {
    for (int hop = 0;; hop++) {
        if (hop > H5_MAX_DEPTH) return h5_fail(h, FERRY_EFORMAT, pos, what, "shared datatypes chain too long");
        h5_cur c = h5_cur_make(h, d, len, pos);
        uint8_t version = h5c_u8(&c), kind = h5c_u8(&c);
        if (version == 1) h5c_skip(&c, 6);
        if (version == 3 && kind != 2)
            return h5_fail(h, FERRY_EUNSUPPORTED, pos, what, "datatype shared through the shared-message heap");
        uint64_t addr = h5c_addr(&c);
        if (c.bad || version < 1 || version > 3) return h5_fail(h, FERRY_EFORMAT, pos, what, "shared datatype message");
        h5_obj to;
        int rc = h5_ohdr_read(h, addr, what, &to);
        if (rc) return rc;
        const h5_msg *tm = h5_obj_find(&to, H5M_DTYPE);
        if (!tm) return h5_fail(h, FERRY_EFORMAT, h->base + addr, what, "committed datatype without a datatype");
        if (!(tm->flags & 0x02)) {
            h5_cur tc = h5_cur_make(h, tm->data, tm->len, tm->pos);
            return h5_dtype_parse(h, &tc, what, 0, t);
        }
        d = tm->data;
        len = tm->len;
        pos = tm->pos;
    }
}

int h5_obj_dtype(h5_file *h, const h5_obj *o, h5_type *t) {
    const h5_msg *m = h5_obj_find(o, H5M_DTYPE);
    if (!m) return h5_fail(h, FERRY_EFORMAT, h->base + o->addr, o->name, "dataset without a datatype message");
    if (m->flags & 0x02) return h5_dtype_shared(h, m->data, m->len, m->pos, o->name, t);   /* a committed type */
    h5_cur c = h5_cur_make(h, m->data, m->len, m->pos);
    return h5_dtype_parse(h, &c, o->name, 0, t);
}

int h5_space_parse(const h5_file *h, h5_cur *c, const char *what, h5_space *s) {
    memset(s, 0, sizeof *s);
    uint64_t at = c->pos;
    uint8_t version = h5c_u8(c), ndim = h5c_u8(c), flags = h5c_u8(c), type = 1;
    if (version == 1) h5c_skip(c, 5);
    else if (version == 2) type = h5c_u8(c);
    else return h5_fail(h, FERRY_EFORMAT, at, what, "dataspace version %u", version);
    if (ndim > FERRY_MAX_DIMS)
        return h5_fail(h, ndim > 32 ? FERRY_EFORMAT : FERRY_EUNSUPPORTED, at, what, "%u dimensions (at most %d)", ndim,
                       FERRY_MAX_DIMS);
    if (type == 2) { s->ndim = -1; return c->bad ? h5_fail(h, FERRY_EFORMAT, at, what, "dataspace truncated") : 0; }
    if (type > 2) return h5_fail(h, FERRY_EFORMAT, at, what, "dataspace type %u", type);
    s->ndim = type == 0 ? 0 : ndim;
    s->npoints = 1;
    int over = 0;
    for (int k = 0; k < s->ndim; k++) {
        s->dims[k] = h5c_len(c);
        over |= ferry_mul_overflow(s->npoints, s->dims[k], &s->npoints);
    }
    for (int k = 0; k < s->ndim; k++) s->maxdims[k] = (flags & 1) ? h5c_len(c) : s->dims[k];
    if (c->bad) return h5_fail(h, FERRY_EFORMAT, at, what, "dataspace truncated");
    if (over || s->npoints > ((uint64_t)1 << 62)) return h5_fail(h, FERRY_EFORMAT, at, what, "dataspace too large");
    return 0;
}

int h5_obj_fill(h5_file *h, const h5_obj *o, uint32_t size, const uint8_t **p, uint64_t *n) {
    *p = NULL;
    *n = 0;
    const h5_msg *m = h5_obj_find(o, H5M_FILL);
    if (m) {
        h5_cur c = h5_cur_make(h, m->data, m->len, m->pos);
        uint8_t version = h5c_u8(&c);
        int defined = 0;
        if (version == 1 || version == 2) {
            h5c_skip(&c, 2);
            defined = h5c_u8(&c);
            if (version == 1 || defined) {
                uint32_t k = h5c_u32(&c);
                const uint8_t *v = h5c_bytes(&c, k);
                if (k && v) { *p = v; *n = k; }
            }
        } else if (version == 3) {
            uint8_t flags = h5c_u8(&c);
            if (flags & 0x20) {
                uint32_t k = h5c_u32(&c);
                const uint8_t *v = h5c_bytes(&c, k);
                if (k && v) { *p = v; *n = k; }
            }
        } else {
            return h5_fail(h, FERRY_EFORMAT, m->pos, o->name, "fill value message version %u", version);
        }
        if (c.bad) return h5_fail(h, FERRY_EFORMAT, m->pos, o->name, "fill value message truncated");
    }
    if (!*p && (m = h5_obj_find(o, H5M_FILL_OLD))) {
        h5_cur c = h5_cur_make(h, m->data, m->len, m->pos);
        uint32_t k = h5c_u32(&c);
        const uint8_t *v = h5c_bytes(&c, k);
        if (c.bad) return h5_fail(h, FERRY_EFORMAT, m->pos, o->name, "fill value message truncated");
        if (k) { *p = v; *n = k; }
    }
    if (*p && *n != size)
        return h5_fail(h, FERRY_EFORMAT, m->pos, o->name, "fill value of %llu bytes for %u-byte elements",
                       (unsigned long long)*n, size);
    return 0;
}

int h5_filters_parse(h5_file *h, const h5_msg *m, const char *what, h5_filters *out) {
    memset(out, 0, sizeof *out);
    h5_cur c = h5_cur_make(h, m->data, m->len, m->pos);
    uint8_t version = h5c_u8(&c), n = h5c_u8(&c);
    if (version == 1) h5c_skip(&c, 6);
    else if (version != 2) return h5_fail(h, FERRY_EFORMAT, m->pos, what, "filter pipeline version %u", version);
    if (n > FERRY_MAX_CODECS - 1)
        return h5_fail(h, n > 32 ? FERRY_EFORMAT : FERRY_EUNSUPPORTED, m->pos, what, "%u filters (at most %d)", n,
                       FERRY_MAX_CODECS - 1);
    for (int i = 0; i < n; i++) {
        uint64_t at = c.pos;
        uint16_t id = h5c_u16(&c), nlen = (version == 1 || id >= 256) ? h5c_u16(&c) : 0;
        out->f[i].id = id;
        out->f[i].flags = h5c_u16(&c);
        uint32_t ncd = h5c_u16(&c);
        out->f[i].ncd = ncd;
        const uint8_t *name = h5c_bytes(&c, version == 1 ? (nlen + 7u) & ~7u : nlen);
        if (name && nlen) {
            size_t k = strnlen((const char *)name, nlen);
            out->f[i].name = h5_strndup(h, (const char *)name, k);
            if (!out->f[i].name) return FERRY_ENOMEM;
        }
        for (uint32_t k = 0; k < ncd; k++) {
            uint32_t v = h5c_u32(&c);
            if (k < 8) out->f[i].cd[k] = v;
        }
        if (version == 1 && (ncd & 1)) h5c_skip(&c, 4);
        if (c.bad) return h5_fail(h, FERRY_EFORMAT, at, what, "filter pipeline truncated");
    }
    out->n = n;
    return 0;
}

int h5_layout_parse(const h5_file *h, const h5_msg *m, const char *what, int rank, h5_layout *out) {
    memset(out, 0, sizeof *out);
    h5_cur c = h5_cur_make(h, m->data, m->len, m->pos);
    uint8_t version = h5c_u8(&c);
    out->version = version;
    out->addr = H5_UNDEF;
    out->size = UINT64_MAX;
    if (version == 1 || version == 2) {
        unsigned nd = h5c_u8(&c);
        out->cls = h5c_u8(&c);
        h5c_skip(&c, 5);
        if (out->cls != 0) out->addr = h5c_addr(&c);
        if (nd < 1 || nd > FERRY_MAX_DIMS + 1)
            return h5_fail(h, FERRY_EFORMAT, m->pos, what, "layout of %u dimensions", nd);
        uint64_t dims[FERRY_MAX_DIMS + 1];
        for (unsigned k = 0; k < nd; k++) dims[k] = h5c_u32(&c);
        if (out->cls == 2) {
            out->ndim = (int)nd - 1;
            memcpy(out->chunk, dims, (size_t)out->ndim * sizeof *dims);
        } else if (out->cls == 0) {
            out->size = h5c_u32(&c);
            out->addr = c.pos;
            h5c_skip(&c, out->size);
        }
    } else if (version >= 3 && version <= 5) {
        /* version 5 (HDF5 2.0) lays out these classes as version 4 does */
        out->cls = h5c_u8(&c);
        if (out->cls == 0) {
            out->size = h5c_u16(&c);
            out->addr = c.pos;        /* absolute: the data is in the message */
            h5c_skip(&c, out->size);
        } else if (out->cls == 1) {
            out->addr = h5c_addr(&c);
            out->size = h5c_len(&c);
        } else if (out->cls == 2) {
            unsigned enc = 4;
            if (version >= 4) out->flags = h5c_u8(&c);
            unsigned nd = h5c_u8(&c);
            if (version >= 4) enc = h5c_u8(&c);
            else out->index_addr = h5c_addr(&c);
            if (nd < 1 || nd > FERRY_MAX_DIMS + 1 || enc < 1 || enc > 8)
                return h5_fail(h, FERRY_EFORMAT, m->pos, what, "chunked layout of %u dimensions (%u-byte sizes)", nd, enc);
            out->ndim = (int)nd - 1;
            for (unsigned k = 0; k < nd; k++) {
                uint64_t v = h5c_un(&c, enc);
                if (k < (unsigned)out->ndim) out->chunk[k] = v;
            }
            if (version >= 4) {
                out->index = h5c_u8(&c);
                switch (out->index) {
                case 1: if (out->flags & 2) { out->single_size = h5c_len(&c); out->single_mask = h5c_u32(&c); } break;
                case 2: break;
                case 3: out->fa_page_bits = h5c_u8(&c); break;
                case 4: for (int i = 0; i < 5; i++) out->ea[i] = h5c_u8(&c); break;
                case 5: out->bt2_node = h5c_u32(&c); h5c_skip(&c, 2); break;
                default: return h5_fail(h, FERRY_EFORMAT, m->pos, what, "chunk index type %d", out->index);
                }
                out->index_addr = h5c_addr(&c);
            }
        } else if (out->cls == 3) {
            return h5_fail(h, FERRY_EUNSUPPORTED, m->pos, what, "virtual dataset (its data lives in other files)");
        }
    } else {
        return h5_fail(h, FERRY_EFORMAT, m->pos, what, "layout message version %u", version);
    }
    if (c.bad) return h5_fail(h, FERRY_EFORMAT, m->pos, what, "layout message truncated");
    if (out->cls > 2) return h5_fail(h, FERRY_EFORMAT, m->pos, what, "layout class %d", out->cls);
    if (out->cls == 2) {
        if (out->ndim != rank)
            return h5_fail(h, FERRY_EFORMAT, m->pos, what, "chunks of %d dimensions for a %d-dimensional dataset",
                           out->ndim, rank);
        for (int k = 0; k < out->ndim; k++)
            if (out->chunk[k] == 0 || out->chunk[k] > UINT32_MAX)
                return h5_fail(h, FERRY_EFORMAT, m->pos, what, "chunk dimension %d of %llu", k,
                               (unsigned long long)out->chunk[k]);
    }
    return 0;
}

int h5_gheap_get(h5_file *h, uint64_t addr, uint32_t index, const char *what, const uint8_t **p, uint64_t *n) {
    const uint8_t *b;
    uint64_t abs = h->base + addr, hl = 8 + h->sl;
    int rc = h5_read(h, addr, hl, &b, what);
    if (rc) return rc;
    if (memcmp(b, "GCOL", 4) || b[4] != 1)
        return h5_fail(h, FERRY_EFORMAT, abs, what, "global heap collection without \"GCOL\"");
    h5_cur c = h5_cur_make(h, b + 8, h->sl, abs + 8);
    uint64_t size = h5c_len(&c);
    if (size < hl || size > h->size) return h5_fail(h, FERRY_EFORMAT, abs, what, "global heap collection of %llu bytes",
                                                    (unsigned long long)size);
    if ((rc = h5_read(h, addr, size, &b, what))) return rc;
    c = h5_cur_make(h, b + hl, size - hl, abs + hl);
    while (h5c_left(&c) >= 8 + (uint64_t)h->sl) {
        uint16_t ix = h5c_u16(&c);
        h5c_skip(&c, 6);
        uint64_t len = h5c_len(&c);
        if (ix == 0) break;           /* free space: the rest of the collection */
        const uint8_t *d = h5c_bytes(&c, len);
        h5c_skip(&c, ((len + 7) & ~(uint64_t)7) - len < h5c_left(&c) ? ((len + 7) & ~(uint64_t)7) - len : h5c_left(&c));
        if (c.bad) break;
        if (ix == index) { *p = d; *n = len; return 0; }
    }
    return h5_fail(h, FERRY_EFORMAT, abs, what, "global heap object %u not found", index);
}
