/* plan.c — plans: growable arrays of extents. Placements and strings are kept
 * in side arrays and referenced by index (stored in the pointer fields as
 * index+1) so that growing never leaves a dangling pointer; ferry_submit
 * turns them back into pointers in the job's own copy. */
#include "engine/engine.h"
#include <stdlib.h>

int ferry_plan_create(ferry_plan **out) {
    if (!out) return ferry_seterr(FERRY_EINVAL, "ferry_plan_create: NULL out");
    *out = calloc(1, sizeof **out);
    return *out ? 0 : ferry_seterr(FERRY_ENOMEM, "out of memory");
}

static void memo_drop(ferry_plan *p) {
    if (p->memo && p->memo_release) p->memo_release(p->memo);
    p->memo = NULL;
    p->memo_owner = NULL;
    p->memo_release = NULL;
}

void *ferry_plan_memo(ferry_plan *p, const void *owner) { return p && p->memo_owner == owner ? p->memo : NULL; }

int ferry_plan_set_memo(ferry_plan *p, const void *owner, void *memo, void (*release)(void *)) {
    if (p->memo_owner && p->memo_owner != owner) return FERRY_EINVAL;
    if (p->memo != memo) memo_drop(p);
    p->memo_owner = owner;
    p->memo = memo;
    p->memo_release = release;
    return 0;
}

void ferry_plan_destroy(ferry_plan *p) {
    if (!p) return;
    memo_drop(p);
    free(p->ext);
    free(p->places);
    free(p->strings);
    free(p);
}

void ferry_plan_clear(ferry_plan *p) { p->n = p->nplaces = p->nstr = 0; p->last_root = 0; p->nwait = 0; memo_drop(p); }
size_t ferry_plan_count(const ferry_plan *p) { return p ? p->n : 0; }

uint64_t ferry_plan_file_bytes(const ferry_plan *p) {
    uint64_t t = 0;
    for (size_t i = 0; p && i < p->n; i++)
        if (p->ext[i].kind != FERRY_EXTENT_FILL) t += p->ext[i].length;
    return t;
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    void *n = realloc(*arr, nc * elem);
    if (!n) return ferry_seterr(FERRY_ENOMEM, "plan: out of memory");
    *arr = n;
    *cap = nc;
    return 0;
}

static int add_string(ferry_plan *p, const char *s, const char **slot) {
    if (!s) { *slot = NULL; return 0; }
    size_t len = strlen(s) + 1;
    if (grow((void **)&p->strings, &p->cap_str, p->nstr + len, 1) < 0) return FERRY_ENOMEM;
    memcpy(p->strings + p->nstr, s, len);
    *slot = (const char *)(uintptr_t)(p->nstr + 1);
    p->nstr += len;
    return 0;
}

static int check_buf(const ferry_extent *e, uint64_t bytes, const char *what) {
    uint64_t end;
    if (ferry_add_overflow(e->dst_offset, bytes, &end) || end > e->dst.size)
        return ferry_seterr(FERRY_EINVAL, "%s%s%s: %llu bytes at offset %llu exceed the %s buffer of %zu bytes",
                            e->label ? "variable " : "", e->label ? e->label : "extent",
                            "", (unsigned long long)bytes, (unsigned long long)e->dst_offset, what, e->dst.size);
    return 0;
}

/* Validate what can be validated without I/O: buffer bounds of contiguous and
 * placed destinations, codec chains, counts. */
static int validate(const ferry_extent *e) {
    if (e->kind != FERRY_EXTENT_READ && e->kind != FERRY_EXTENT_FILL && e->kind != FERRY_EXTENT_WRITE)
        return ferry_seterr(FERRY_EINVAL, "extent: unknown kind %d", (int)e->kind);
    if (e->kind != FERRY_EXTENT_FILL && !e->file && !e->path)
        return ferry_seterr(FERRY_EINVAL, "extent: no file and no path");
    if (e->kind == FERRY_EXTENT_WRITE && (e->place || e->ncodecs))
        return ferry_seterr(FERRY_EINVAL, "write extents take no placement and no codecs");
    if (e->kind == FERRY_EXTENT_WRITE && !e->file)
        return ferry_seterr(FERRY_EINVAL, "write extents need an open file");
    if (e->flags & ~(unsigned)(FERRY_EXTENT_MISSING_FILLS | FERRY_EXTENT_NOFOLLOW))
        return ferry_seterr(FERRY_EINVAL, "extent: unknown flags 0x%x", e->flags);
    if ((e->flags & FERRY_EXTENT_MISSING_FILLS) &&
        (e->kind != FERRY_EXTENT_READ || e->file || !e->place || e->place->itemsize > 16))
        return ferry_seterr(FERRY_EINVAL, "extent: MISSING_FILLS needs a read by path with a placement "
                                          "of elements of at most 16 bytes");
    if (e->file_size && (e->kind != FERRY_EXTENT_READ || e->file))
        return ferry_seterr(FERRY_EINVAL, "extent: file_size needs a read by path");
    if ((e->flags & FERRY_EXTENT_NOFOLLOW) && (e->kind != FERRY_EXTENT_READ || e->file))
        return ferry_seterr(FERRY_EINVAL, "extent: NOFOLLOW needs a read by path");
    if ((e->flags & FERRY_EXTENT_NOFOLLOW) && e->root && e->root[0] != '/')
        return ferry_seterr(FERRY_EINVAL, "extent: NOFOLLOW root \"%s\" is not an absolute path", e->root);
    if (e->ncodecs < 0 || e->ncodecs > FERRY_MAX_CODECS)
        return ferry_seterr(FERRY_EINVAL, "extent: %d codecs (at most %d)", e->ncodecs, FERRY_MAX_CODECS);
    if (e->ncodecs) {
        int rc = ferry_codecs_validate(e->codecs, e->ncodecs);
        if (rc < 0) return rc;
    }
    if (e->dst.kind != FERRY_MEM_HOST && e->dst.kind != FERRY_MEM_CUDA)
        return ferry_seterr(FERRY_EINVAL, "extent: unknown memory kind %d", (int)e->dst.kind);
    if (!e->dst.ptr && e->dst.size) return ferry_seterr(FERRY_EINVAL, "extent: NULL buffer");
    uint64_t decoded = e->kind == FERRY_EXTENT_READ && e->ncodecs ? e->decoded_size : e->length;
    if (!e->place) {
        if (e->kind == FERRY_EXTENT_FILL) return check_buf(e, e->length, "destination");
        return check_buf(e, decoded, e->kind == FERRY_EXTENT_WRITE ? "source" : "destination");
    }
    const ferry_place *pl = e->place;
    if (pl->ndim < 0 || pl->ndim > FERRY_MAX_DIMS || pl->itemsize == 0 || pl->itemsize > (1u << 20))
        return ferry_seterr(FERRY_EINVAL, "placement: bad ndim %d or itemsize %u", pl->ndim, pl->itemsize);
    if (e->kind == FERRY_EXTENT_FILL && pl->itemsize > 16)
        return ferry_seterr(FERRY_EINVAL, "fill: element of %u bytes (at most 16)", pl->itemsize);
    /* The box's extreme byte positions must fall inside both buffers. */
    int64_t smin = 0, smax = 0, dmin = 0, dmax = 0;
    for (int k = 0; k < pl->ndim; k++) {
        if (pl->count[k] == 0) return 0;   /* empty box: nothing to check, nothing to do */
        __int128 ds = (__int128)pl->src_stride[k] * (__int128)(pl->count[k] - 1);
        __int128 dd = (__int128)pl->dst_stride[k] * (__int128)(pl->count[k] - 1);
        if (ds > INT64_MAX || ds < INT64_MIN || dd > INT64_MAX || dd < INT64_MIN)
            return ferry_seterr(FERRY_EINVAL, "placement: strides overflow");
        if (ds < 0) smin += (int64_t)ds; else smax += (int64_t)ds;
        if (dd < 0) dmin += (int64_t)dd; else dmax += (int64_t)dd;
    }
    if (e->kind != FERRY_EXTENT_FILL &&
        ((int64_t)pl->src_offset + smin < 0 || (uint64_t)((int64_t)pl->src_offset + smax) + pl->itemsize > decoded))
        return ferry_seterr(FERRY_EINVAL, "%s%s: placement reads outside the %llu decoded bytes",
                            e->label ? "variable " : "extent", e->label ? e->label : "",
                            (unsigned long long)decoded);
    if ((int64_t)e->dst_offset + dmin < 0 ||
        (uint64_t)((int64_t)e->dst_offset + dmax) + pl->itemsize > e->dst.size)
        return ferry_seterr(FERRY_EINVAL, "%s%s: placement writes outside the destination buffer of %zu bytes",
                            e->label ? "variable " : "extent", e->label ? e->label : "", e->dst.size);
    return 0;
}

int ferry_plan_add(ferry_plan *p, const ferry_extent *e) {
    if (!p || !e) return ferry_seterr(FERRY_EINVAL, "ferry_plan_add: NULL argument");
    int rc = validate(e);
    if (rc < 0) return rc;
    if (grow((void **)&p->ext, &p->cap, p->n + 1, sizeof *p->ext) < 0) return FERRY_ENOMEM;
    ferry_extent c = *e;
    if (c.kind != FERRY_EXTENT_READ || c.ncodecs == 0) c.decoded_size = c.length;
    if (e->place) {
        if (grow((void **)&p->places, &p->cap_places, p->nplaces + 1, sizeof *p->places) < 0) return FERRY_ENOMEM;
        p->places[p->nplaces] = *e->place;
        c.place = (const ferry_place *)(uintptr_t)(p->nplaces + 1);
        p->nplaces++;
    }
    if (add_string(p, e->file ? NULL : e->path, &c.path) < 0) return FERRY_ENOMEM;
    if (add_string(p, e->label, &c.label) < 0) return FERRY_ENOMEM;
    c.root = NULL;
    if ((e->flags & FERRY_EXTENT_NOFOLLOW) && e->root) {
        /* every chunk of a store names the same root: kept once */
        if (p->last_root && !strcmp(p->strings + (p->last_root - 1), e->root))
            c.root = (const char *)p->last_root;
        else if (add_string(p, e->root, &c.root) < 0) return FERRY_ENOMEM;
        else p->last_root = (uintptr_t)c.root;
    }
    p->ext[p->n++] = c;
    return 0;
}

/* A plain extent: len bytes at offset, contiguous in memory at buf+buf_offset. */
static int plan_plain(ferry_plan *p, ferry_extent_kind kind, ferry_file *f, uint64_t offset, uint64_t len,
                      ferry_buf buf, uint64_t buf_offset) {
    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.kind = kind;
    e.file = f;
    e.offset = offset;
    e.length = len;
    e.decoded_size = len;
    e.dst = buf;
    e.dst_offset = buf_offset;
    return ferry_plan_add(p, &e);
}

int ferry_plan_read(ferry_plan *p, ferry_file *f, uint64_t offset, uint64_t len, ferry_buf dst, uint64_t dst_offset) {
    return plan_plain(p, FERRY_EXTENT_READ, f, offset, len, dst, dst_offset);
}

int ferry_plan_write(ferry_plan *p, ferry_file *f, uint64_t offset, uint64_t len, ferry_buf src, uint64_t src_offset) {
    return plan_plain(p, FERRY_EXTENT_WRITE, f, offset, len, src, src_offset);
}
