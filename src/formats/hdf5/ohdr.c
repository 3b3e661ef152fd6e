/* ohdr.c — object headers as a flat list of messages.
 *
 * Version 1 ("Version 1 Object Headers"): version, reserved, message count
 * (2), reference count (4), header size (4), padding to 16 bytes; messages
 * are type (2), size (2), flags (1), reserved (3), data padded to 8 bytes.
 * Version 2: "OHDR", version, flags, optional times (16) and attribute
 * phase-change values (4), size of chunk 0 (1, 2, 4 or 8 bytes by flags),
 * messages of type (1), size (2), flags (1), creation order (2, by flags),
 * then a gap and a checksum. Both continue in blocks named by continuation
 * messages (address, length); version 2's blocks start "OCHK" and end in a
 * checksum. A chain that loops or grows past H5_MAX_CONT blocks is refused. */
#include "formats/hdf5/h5.h"
#include <stdlib.h>

typedef struct cont { uint64_t addr, len; } cont;

typedef struct ohdr_rd {
    h5_file *h;
    const char *name;
    int version, track_order;
    h5_msg *msgs;
    int n, cap;
    cont *todo;
    int ntodo, done;
} ohdr_rd;

static int add_msg(ohdr_rd *r, h5_msg m) {
    if (r->n == r->cap) {
        if (r->n >= H5_MAX_MSGS)
            return h5_fail(r->h, FERRY_EFORMAT, m.pos, r->name, "more than %d header messages", H5_MAX_MSGS);
        int cap = r->cap ? r->cap * 2 : 16;
        h5_msg *nm = realloc(r->msgs, (size_t)cap * sizeof *nm);
        if (!nm) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", r->h->path);
        r->msgs = nm;
        r->cap = cap;
    }
    r->msgs[r->n++] = m;
    return 0;
}

static int add_cont(ohdr_rd *r, const h5_msg *m) {
    h5_cur c = h5_cur_make(r->h, m->data, m->len, m->pos);
    cont k;
    k.addr = h5c_addr(&c);
    k.len = h5c_len(&c);
    if (c.bad) return h5_fail(r->h, FERRY_EFORMAT, m->pos, r->name, "continuation message truncated");
    if (r->ntodo >= H5_MAX_CONT)
        return h5_fail(r->h, FERRY_EFORMAT, m->pos, r->name, "more than %d continuation blocks", H5_MAX_CONT);
    for (int i = 0; i < r->ntodo; i++)
        if (r->todo[i].addr == k.addr)
            return h5_fail(r->h, FERRY_EFORMAT, m->pos, r->name, "continuation chain loops (block at %llu again)",
                           (unsigned long long)k.addr);
    if (k.addr == H5_UNDEF || k.len == 0 || k.len > r->h->size)
        return h5_fail(r->h, FERRY_EFORMAT, m->pos, r->name, "continuation block at %llu of %llu bytes",
                       (unsigned long long)k.addr, (unsigned long long)k.len);
    if (r->ntodo % 16 == 0) {
        cont *nt = realloc(r->todo, (size_t)(r->ntodo + 16) * sizeof *nt);
        if (!nt) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", r->h->path);
        r->todo = nt;
    }
    r->todo[r->ntodo++] = k;
    return 0;
}

/* The messages of one block: c spans them exactly. */
static int read_msgs(ohdr_rd *r, h5_cur *c) {
    unsigned hdr = r->version == 1 ? 8 : 4 + (r->track_order ? 2 : 0);
    while (h5c_left(c) >= hdr) {
        uint64_t at = c->pos;
        h5_msg m = {0};
        uint64_t len;
        if (r->version == 1) {
            m.type = h5c_u16(c);
            len = h5c_u16(c);
            m.flags = h5c_u8(c);
            h5c_skip(c, 3);
        } else {
            m.type = h5c_u8(c);
            len = h5c_u16(c);
            m.flags = h5c_u8(c);
            if (r->track_order) h5c_skip(c, 2);
        }
        m.pos = c->pos;
        m.len = len;
        if (len > h5c_left(c))
            return h5_fail(r->h, FERRY_EFORMAT, at, r->name, "message of type %u claims %llu bytes, %llu left in its block",
                           m.type, (unsigned long long)len, (unsigned long long)h5c_left(c));
        m.data = h5c_bytes(c, len);
        if (r->version == 1 && (len & 7))
            return h5_fail(r->h, FERRY_EFORMAT, at, r->name, "message size %llu not a multiple of 8", (unsigned long long)len);
        int rc;
        if (m.type == H5M_CONT) rc = add_cont(r, &m);
        else rc = add_msg(r, m);
        if (rc) return rc;
    }
    return 0;
}

static int read_v1(ohdr_rd *r, uint64_t addr) {
    const uint8_t *p;
    int rc = h5_read(r->h, addr, 16, &p, r->name);
    if (rc) return rc;
    uint64_t abs = r->h->base + addr;
    uint32_t size = ferry_le32(p + 8);
    if (p[0] != 1) return h5_fail(r->h, FERRY_EFORMAT, abs, r->name, "object header version %u (1 or 2)", p[0]);
    r->version = 1;
    cont first = {addr + 16, size};
    if (size && (rc = h5_read(r->h, first.addr, size, &p, r->name))) return rc;
    h5_cur c = h5_cur_make(r->h, p, size, abs + 16);
    if ((rc = read_msgs(r, &c))) return rc;
    for (; r->done < r->ntodo; r->done++) {
        cont k = r->todo[r->done];
        if ((rc = h5_read(r->h, k.addr, k.len, &p, r->name))) return rc;
        c = h5_cur_make(r->h, p, k.len, r->h->base + k.addr);
        if ((rc = read_msgs(r, &c))) return rc;
    }
    return 0;
}

static int read_v2(ohdr_rd *r, uint64_t addr) {
    const uint8_t *p;
    uint64_t got, abs = r->h->base + addr;
    int rc = h5_read_upto(r->h, addr, 4 + 2 + 16 + 4 + 8, &p, &got, r->name);
    if (rc) return rc;
    h5_cur c = h5_cur_make(r->h, p, got, abs);
    h5c_skip(&c, 4);
    uint8_t version = h5c_u8(&c), flags = h5c_u8(&c);
    if (version != 2) return h5_fail(r->h, FERRY_EFORMAT, abs + 4, r->name, "object header version %u (2)", version);
    if (flags & 0x20) h5c_skip(&c, 16);
    if (flags & 0x10) h5c_skip(&c, 4);
    uint64_t size0 = h5c_un(&c, 1u << (flags & 3));
    if (c.bad) return h5_fail(r->h, FERRY_EFORMAT, abs, r->name, "object header truncated");
    r->version = 2;
    r->track_order = (flags & 0x04) != 0;
    uint64_t pre = (uint64_t)(c.p - p), total;
    if (ferry_add_overflow(pre + 4, size0, &total) || total > r->h->size)
        return h5_fail(r->h, FERRY_EFORMAT, abs, r->name, "object header chunk of %llu bytes", (unsigned long long)size0);
    if ((rc = h5_read(r->h, addr, total, &p, r->name))) return rc;
    if ((rc = h5_check_sum(r->h, p, total, abs, r->name))) return rc;
    c = h5_cur_make(r->h, p + pre, size0, abs + pre);
    if ((rc = read_msgs(r, &c))) return rc;
    for (; r->done < r->ntodo; r->done++) {
        cont k = r->todo[r->done];
        if (k.len < 8) return h5_fail(r->h, FERRY_EFORMAT, r->h->base + k.addr, r->name, "continuation block too short");
        if ((rc = h5_read(r->h, k.addr, k.len, &p, r->name))) return rc;
        if (memcmp(p, "OCHK", 4))
            return h5_fail(r->h, FERRY_EFORMAT, r->h->base + k.addr, r->name, "continuation block without \"OCHK\"");
        if ((rc = h5_check_sum(r->h, p, k.len, r->h->base + k.addr, r->name))) return rc;
        c = h5_cur_make(r->h, p + 4, k.len - 8, r->h->base + k.addr + 4);
        if ((rc = read_msgs(r, &c))) return rc;
    }
    return 0;
}

int h5_ohdr_read(h5_file *h, uint64_t addr, const char *name, h5_obj *out) {
    memset(out, 0, sizeof *out);
    ohdr_rd r = {.h = h, .name = name};
    const uint8_t *p;
    int rc = h5_read(h, addr, 4, &p, name);
    if (!rc) rc = !memcmp(p, "OHDR", 4) ? read_v2(&r, addr) : read_v1(&r, addr);
    free(r.todo);
    if (!rc) {
        /* the list lives as long as the file's other metadata */
        out->msgs = h5_alloc(h, (size_t)r.n * sizeof *r.msgs);
        if (!out->msgs) rc = FERRY_ENOMEM;
        else if (r.n) memcpy(out->msgs, r.msgs, (size_t)r.n * sizeof *r.msgs);
    }
    free(r.msgs);
    if (rc) return rc;
    out->addr = addr;
    out->name = name;
    out->nmsgs = r.n;
    return 0;
}

const h5_msg *h5_obj_find(const h5_obj *o, uint16_t type) {
    for (int i = 0; i < o->nmsgs; i++)
        if (o->msgs[i].type == type) return &o->msgs[i];
    return NULL;
}
