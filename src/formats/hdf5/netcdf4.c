/* netcdf4.c — the netCDF-4 conventions on top of HDF5: named dimensions.
 *
 * netCDF-4 (and h5netcdf) store a dimension as an HDF5 dimension scale: a
 * dataset with the attribute CLASS = "DIMENSION_SCALE", named after the
 * dimension; its first axis's current size is the dimension's length, and
 * an unlimited maximum makes the dimension unlimited (and its length the
 * longest of the variables along it, as netCDF-C reports it). A dimension that has
 * no coordinate variable is still a dataset, whose NAME attribute starts
 * "This is a netCDF dimension but not a netCDF variable": it is not listed as
 * a variable. Every other variable names its dimensions by the
 * DIMENSION_LIST attribute: per axis, a variable-length list of object
 * references (addresses of dimension scales). A multi-dimensional coordinate
 * variable (itself a scale) lists its dimensions as _Netcdf4Coordinates, ids
 * matching the scales' _Netcdf4Dimid. An axis with no dimension scale (files
 * h5py writes) gets a phony dimension "phony_dim_<id>", one per distinct
 * length shared by the variables of the group, numbered as netCDF-C numbers
 * them (after the real dimensions; see phony()). */
#include "formats/hdf5/h5.h"
#include <stdio.h>
#include <stdlib.h>

#define NOT_A_VARIABLE "This is a netCDF dimension but not a netCDF variable"

typedef struct h5_dim {
    uint64_t addr;                    /* the scale's header (H5_UNDEF: phony) */
    const char *name;
    uint64_t size;
    int unlimited, used, local;
    int64_t dimid;
    size_t ord;                       /* order found, to keep qsort stable */
} h5_dim;

struct h5_nc {
    h5_dim *d;
    size_t n, cap;
};

h5_nc *h5nc_new(h5_file *h) { return h5_alloc(h, sizeof(h5_nc)); }
void h5nc_free(h5_nc *nc) { if (nc) free(nc->d); }

static int add_dim(h5_file *h, h5_nc *nc, h5_dim d) {
    if (nc->n == nc->cap) {
        size_t cap = nc->cap ? nc->cap * 2 : 16;
        h5_dim *nd = realloc(nc->d, cap * sizeof *nd);
        if (!nd) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path);
        nc->d = nd;
        nc->cap = cap;
    }
    d.ord = nc->n;
    nc->d[nc->n++] = d;
    return 0;
}

static const h5_attr *find_attr(const h5_attr *a, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(a[i].name, name)) return &a[i];
    return NULL;
}

static int64_t attr_int(const h5_attr *a) {
    if (!a || a->type.cls != H5T_INT || a->len < a->type.size || a->type.size > 8) return -1;
    uint64_t v = 0;
    for (uint32_t i = 0; i < a->type.size; i++)
        v |= (uint64_t)a->data[a->type.big_endian ? a->type.size - 1 - i : i] << (8 * i);
    return v > (uint64_t)INT32_MAX ? -1 : (int64_t)v;
}

int h5nc_is_scale(h5_file *h, const h5_attr *a, size_t n) {
    const h5_attr *c = find_attr(a, n, "CLASS");
    const char *s = c ? h5_attr_string(h, c) : NULL;
    return s && !strcmp(s, "DIMENSION_SCALE");
}

int h5nc_add_scale(h5_file *h, h5_nc *nc, const h5_obj *o, const char *name, const h5_space *sp, const h5_attr *a,
                   size_t n, int local, int *is_var) {
    *is_var = 1;
    if (!h5nc_is_scale(h, a, n)) return 0;
    const h5_attr *na = find_attr(a, n, "NAME");
    const char *s = na ? h5_attr_string(h, na) : NULL;
    if (s && !strncmp(s, NOT_A_VARIABLE, strlen(NOT_A_VARIABLE))) *is_var = 0;
    h5_dim d = {o->addr, name, 0, 0, 0, local, attr_int(find_attr(a, n, "_Netcdf4Dimid")), 0};
    if (sp->ndim >= 1) {
        d.size = sp->dims[0];
        d.unlimited = sp->maxdims[0] == H5_UNDEF;
    }
    return add_dim(h, nc, d);
}

static h5_dim *by_addr(h5_nc *nc, uint64_t addr) {
    for (size_t i = 0; i < nc->n; i++)
        if (nc->d[i].addr == addr) return &nc->d[i];
    return NULL;
}

static h5_dim *by_id(h5_nc *nc, int64_t id) {
    for (size_t i = 0; i < nc->n; i++)
        if (nc->d[i].addr != H5_UNDEF && nc->d[i].dimid == id && id >= 0) return &nc->d[i];
    return NULL;
}

/* The scale that DIMENSION_LIST's element k references, or NULL. */
static h5_dim *listed(h5_file *h, h5_nc *nc, const h5_attr *dl, int k) {
    const h5_type *t = &dl->type;
    if (t->cls != H5T_VLEN || !t->base || t->base->cls != H5T_REFERENCE || t->base->size != h->so ||
        dl->space.ndim != 1 || (uint64_t)k >= dl->space.npoints)
        return NULL;
    h5_cur c = h5_cur_make(h, dl->data + (uint64_t)k * t->size, t->size, dl->pos);
    uint32_t len = h5c_u32(&c);
    uint64_t addr = h5c_addr(&c);
    uint32_t ix = h5c_u32(&c);
    const uint8_t *p;
    uint64_t n;
    if (c.bad || len < 1 || h5_gheap_get(h, addr, ix, dl->name, &p, &n) || n < h->so) {
        ferry_clearerr();
        return NULL;
    }
    h5_cur r = h5_cur_make(h, p, n, 0);
    return by_addr(nc, h5c_addr(&r));
}

static h5_dim *phony(h5_file *h, h5_nc *nc, uint64_t size, h5_dim **taken, int ntaken) {
    for (size_t i = 0; i < nc->n; i++) {
        h5_dim *d = &nc->d[i];
        if (d->addr != H5_UNDEF || d->size != size) continue;
        int busy = 0;
        for (int k = 0; k < ntaken; k++) busy |= taken[k] == d;
        if (!busy) return d;
    }
    /* netCDF-C names a phony dimension by the dimension id it gets: the real dimensions it
     * registered before (this group's and its ancestors') and the phony ones made before it
     * come first. (It reads a group's subgroups before the group's variables, so a group with
     * subgroups that hold dimensions numbers its phony ones after theirs: not counted here.) */
    char name[32];
    snprintf(name, sizeof name, "phony_dim_%zu", nc->n);
    h5_dim d = {H5_UNDEF, h5_strndup(h, name, strlen(name)), size, 0, 0, 1, -1, 0};
    if (!d.name || add_dim(h, nc, d)) return NULL;
    return &nc->d[nc->n - 1];
}

int h5nc_var_dims(h5_file *h, h5_nc *nc, const h5_obj *o, const char *name, const h5_space *sp, const h5_attr *a,
                  size_t n, char **dims_json) {
    h5_dim *got[FERRY_MAX_DIMS] = {0};
    int nd = sp->ndim < 0 ? 0 : sp->ndim;
    const h5_attr *dl = find_attr(a, n, "DIMENSION_LIST");
    h5_dim *self = by_addr(nc, o->addr);
    if (self && nd == 1) got[0] = self;
    else if (self) {
        /* a multi-dimensional coordinate variable: dimension ids */
        const h5_attr *co = find_attr(a, n, "_Netcdf4Coordinates");
        if (co && co->type.cls == H5T_INT && co->space.ndim == 1 && co->space.npoints == (uint64_t)nd)
            for (int k = 0; k < nd; k++) {
                h5_attr one = *co;
                one.data = co->data + (uint64_t)k * co->type.size;
                got[k] = by_id(nc, attr_int(&one));
            }
        if (!got[0]) got[0] = self;
    } else if (dl) {
        for (int k = 0; k < nd; k++) got[k] = listed(h, nc, dl, k);
    }
    ferry_sbuf b = {0};
    ferry_sbuf_append(&b, "[", 1);
    for (int k = 0; k < nd; k++) {
        if (!got[k] || (got[k]->size != sp->dims[k] && !got[k]->unlimited)) got[k] = phony(h, nc, sp->dims[k], got, k);
        if (!got[k]) { ferry_sbuf_free(&b); return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path); }
        got[k]->used = 1;
        /* an unlimited dimension is as long as the longest variable along it
         * (its scale may never have been extended) */
        if (got[k]->unlimited && sp->dims[k] > got[k]->size) got[k]->size = sp->dims[k];
        if (k) ferry_sbuf_append(&b, ",", 1);
        ferry_sbuf_json_string(&b, got[k]->name, strlen(got[k]->name));
    }
    ferry_sbuf_append(&b, "]", 1);
    (void)name;
    char *s = ferry_sbuf_take(&b);
    if (!s) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path);
    *dims_json = h5_strndup(h, s, strlen(s));
    free(s);
    return *dims_json ? 0 : FERRY_ENOMEM;
}

/* Attributes that carry the netCDF-4 / dimension-scale bookkeeping above,
 * not data: CLASS, NAME and REFERENCE_LIST only on a dimension scale (a
 * plain dataset may have attributes of those names). */
int h5nc_hidden(const char *name, int is_scale) {
    static const char *const always[] = {"DIMENSION_LIST", "_Netcdf4Dimid", "_Netcdf4Coordinates", "_NCProperties",
                                         "_nc3_strict", "_SuperblockVersion", "_IsNetcdf4"};
    for (size_t i = 0; i < sizeof always / sizeof always[0]; i++)
        if (!strcmp(name, always[i])) return 1;
    return is_scale && (!strcmp(name, "CLASS") || !strcmp(name, "NAME") || !strcmp(name, "REFERENCE_LIST"));
}

static int cmp_dimid(const void *a, const void *b) {
    const h5_dim *x = a, *y = b;
    int64_t i = x->dimid < 0 ? INT64_MAX : x->dimid, j = y->dimid < 0 ? INT64_MAX : y->dimid;
    return i < j ? -1 : i > j ? 1 : (x->ord > y->ord) - (x->ord < y->ord);
}

/* In netCDF-4's order (dimension ids), phony dimensions last. */
int h5nc_dims_json(h5_file *h, h5_nc *nc, char **out) {
    ferry_sbuf b = {0};
    ferry_sbuf_append(&b, "{", 1);
    int first = 1;
    if (nc->n) qsort(nc->d, nc->n, sizeof *nc->d, cmp_dimid);   /* after every variable took its dimensions */
    for (size_t i = 0; i < nc->n; i++) {
        const h5_dim *d = &nc->d[i];
        if (!d->local && !d->used) continue;
        int dup = 0;
        for (size_t j = 0; j < i; j++) dup |= (nc->d[j].local || nc->d[j].used) && !strcmp(nc->d[j].name, d->name);
        if (dup) continue;
        if (!first) ferry_sbuf_append(&b, ",", 1);
        first = 0;
        ferry_sbuf_json_string(&b, d->name, strlen(d->name));
        ferry_sbuf_printf(&b, ":{\"size\":%llu,\"unlimited\":%s}", (unsigned long long)d->size,
                          d->unlimited ? "true" : "false");
    }
    ferry_sbuf_append(&b, "}", 1);
    if (!(*out = ferry_sbuf_take(&b))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path);
    return 0;
}

/* Grow shape[k] to the length of dimension k when it is unlimited. dims_json
 * is the array h5nc_var_dims wrote (names only, escaped as JSON strings). */
void h5nc_pad(h5_nc *nc, const char *dims_json, int ndim, uint64_t *shape) {
    ferry_json *j = NULL;
    if (ferry_json_parse(dims_json, strlen(dims_json), "dims", 0, &j)) { ferry_clearerr(); return; }
    for (int k = 0; k < ndim && j->type == FERRY_JSON_ARRAY && (size_t)k < j->n; k++) {
        const char *name = j->items[k].type == FERRY_JSON_STRING ? j->items[k].str : NULL;
        for (size_t i = 0; name && i < nc->n; i++)
            if (nc->d[i].unlimited && nc->d[i].addr != H5_UNDEF && !strcmp(nc->d[i].name, name) &&
                nc->d[i].size > shape[k])
                shape[k] = nc->d[i].size;
    }
    ferry_json_free(j);
}
