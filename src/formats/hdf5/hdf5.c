/* hdf5.c — netCDF-4 / HDF5 files as a ferry dataset (ferry_format_ops).
 *
 * open: the superblock, then the group opts->group names ("" or NULL: the
 * root; "a/b" inside it), walked down from the root; the dimension scales of
 * that group and of its ancestors (netCDF-4 dimensions are visible in child
 * groups); then each dataset of the group becomes a variable with its
 * datatype, shape, attributes, dimensions (netcdf4.c), fill value, filters
 * and layout. Child groups are listed in groups_json. A dataset ferry cannot
 * read (variable-length sequences, compound types, a filter without a ferry
 * codec, data outside the file) is still described, with vi->error saying
 * why; reading it fails with that message.
 *
 * Variable-length strings are FERRY_DT_STRING variables whose stored
 * elements are references: read_strings plans their read as any dataset's
 * (16-byte elements, filters and all), runs it, and resolves them (strings.c).
 *
 * plan_read: contiguous and compact data are one strided array in the file
 * (select.c; compact data lies inside the object header); chunked data plans
 * through ferry_layout with the chunk table read from the index on first use
 * (chunks.c) and kept for the dataset's life. The file stays open: plans name it. */
#include "formats/hdf5/h5.h"
#include "formats/layout.h"
#include "formats/select.h"
#include "codecs/h5filters.h"
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct h5var {
    const char *what;                 /* the dataset's path in the file, for messages */
    uint64_t pos;                     /* absolute offset of its object header, for messages */
    h5_type type;
    h5_space space;
    h5_layout lay;
    uint64_t data_abs;                /* contiguous / compact: absolute offset of the data */
    int absent;                       /* contiguous, never written: all fill */
    int ncodecs;
    ferry_codec codecs[FERRY_MAX_CODECS];
    int nfilters;
    uint8_t fill[16];                 /* host order */
    int loaded;                       /* chunk table read */
    h5_chunks ch;
} h5var;

typedef struct h5ds {
    h5_file h;
    ferry_file *file;
    h5_nc *nc;
    h5var *vars;
    pthread_mutex_t mu;               /* chunk tables are read on first plan */
    int mu_ok;
} h5ds;

static const uint8_t SIG[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

static int h5_probe(const char *path, const uint8_t *head, size_t n, int is_dir) {
    (void)path;
    return !is_dir && n >= 8 && !memcmp(head, SIG, 8);
}

static void h5_close(ferry_dataset *ds) {
    h5ds *st = ds->fmt;
    if (st) {
        for (int i = 0; st->vars && i < ds->nvars; i++) { free(st->vars[i].ch.table); free(st->vars[i].ch.index); }
        free(st->vars);
        h5nc_free(st->nc);
        h5_file_free(&st->h);
        ferry_file_close(st->file);
        if (st->mu_ok) pthread_mutex_destroy(&st->mu);
        free(st);
    }
    free(ds->vars);
    free(ds->attrs_json); free(ds->dims_json); free(ds->groups_json);
    ds->vars = NULL; ds->nvars = 0; ds->fmt = NULL;
    ds->attrs_json = ds->dims_json = ds->groups_json = NULL;
}

static char *join(h5_file *h, const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *s = h5_alloc(h, a + b + 2);
    if (!s) return NULL;
    memcpy(s, dir, a);
    if (!a || s[a - 1] != '/') s[a++] = '/';
    memcpy(s + a, name, b);
    return s;
}

/* JSON object of attributes, those of the netCDF-4 bookkeeping left out;
 * *fill_json: the _FillValue's first value (NULL: none). */
static int attrs_json(h5_file *h, const h5_attr *a, size_t n, char **json, char **fill_json) {
    int scale = h5nc_is_scale(h, a, n);
    ferry_sbuf b = {0};
    ferry_sbuf_append(&b, "{", 1);
    int first = 1, rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (h5nc_hidden(a[i].name, scale)) continue;
        if (!first) ferry_sbuf_append(&b, ",", 1);
        first = 0;
        ferry_sbuf_json_string(&b, a[i].name, strlen(a[i].name));
        ferry_sbuf_append(&b, ":", 1);
        rc = h5_attr_json(h, &a[i], &b);
        if (!rc && fill_json && !strcmp(a[i].name, "_FillValue") && a[i].space.ndim >= 0 && a[i].space.npoints >= 1) {
            h5_attr one = a[i];
            one.space.ndim = 0;
            one.space.npoints = 1;
            ferry_sbuf fb = {0};
            if ((rc = h5_attr_json(h, &one, &fb))) { ferry_sbuf_free(&fb); break; }
            char *s = ferry_sbuf_take(&fb);
            if (!s) { rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path); break; }
            /* a number's JSON is {"type":..,"value":[x]}: keep x */
            char *v = !strncmp(s, "{\"type\":", 8) ? strstr(s, "\"value\":[") : NULL;
            if (v) {
                v += 9;
                size_t k = strlen(v);
                if (k >= 2) v[k - 2] = 0;
            }
            *fill_json = h5_strndup(h, v ? v : s, strlen(v ? v : s));
            free(s);
            if (!*fill_json) rc = FERRY_ENOMEM;
        }
    }
    ferry_sbuf_append(&b, "}", 1);
    if (rc) { ferry_sbuf_free(&b); return rc; }
    char *s = ferry_sbuf_take(&b);
    if (!s) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path);
    *json = h5_strndup(h, s, strlen(s));
    free(s);
    return *json ? 0 : FERRY_ENOMEM;
}

/* The message just set becomes the variable's error (reads of it fail with
 * it). code FERRY_EUNSUPPORTED (a valid dataset using what ferry lacks, not a
 * damaged one) ends the message with H5_REFUSED, so that a caller with
 * another reader at hand (the Python package's h5py fallback) can tell a
 * refusal from damage, which no reader should paper over. */
#define H5_REFUSED " (unsupported)"
static void set_error(h5_file *h, ferry_var_info *vi, int code) {
    const char *m = ferry_lasterr();
    size_t n = strlen(m), k = code == FERRY_EUNSUPPORTED ? sizeof H5_REFUSED - 1 : 0;
    char *e = h5_alloc(h, n + k + 1);
    if (e) { memcpy(e, m, n); memcpy(e + n, H5_REFUSED, k); e[n + k] = 0; }
    vi->error = e ? e : "out of memory";
    ferry_clearerr();
}

/* One filter of the pipeline as ferry_var_info.codecs describes it: the
 * codec's name and, in parentheses, what a writer chose (the level; blosc's
 * inner compressor and shuffle), as netCDF-C's nc_inq_var_* report them.
 * Filters ferry does not decode keep their HDF5 name and id. */
static void describe_filter(ferry_sbuf *b, const h5_filters *f, int i) {
    const uint32_t *cd = f->f[i].cd;
    uint32_t ncd = f->f[i].ncd;
    switch (f->f[i].id) {
    case 1: if (ncd >= 1) ferry_sbuf_printf(b, "zlib(level=%u)", cd[0]); else ferry_sbuf_puts(b, "zlib"); return;
    case 2: ferry_sbuf_puts(b, "shuffle"); return;
    case 3: ferry_sbuf_puts(b, "fletcher32"); return;
    case 32015: if (ncd >= 1) ferry_sbuf_printf(b, "zstd(level=%d)", (int)cd[0]); else ferry_sbuf_puts(b, "zstd"); return;
    case 32001: {
        static const char *const inner[] = {"blosclz", "lz4", "lz4hc", "snappy", "zlib", "zstd"};
        if (ncd >= 7)
            ferry_sbuf_printf(b, "blosc(%s,shuffle=%u,level=%u)", cd[6] < 6 ? inner[cd[6]] : "unknown", cd[5], cd[4]);
        else
            ferry_sbuf_puts(b, "blosc");
        return;
    }
    default: break;
    }
    /* a name from the file, kept to letters, digits, '-' and '_' (the
     * description is a space-separated list) */
    char own[33];
    size_t k = 0;
    for (const char *p = f->f[i].name ? f->f[i].name : ""; *p && k < sizeof own - 1; p++)
        if (isalnum((unsigned char)*p) || *p == '-' || *p == '_') own[k++] = *p;
    own[k] = 0;
    const char *name = f->f[i].id == 4 ? "szip" : f->f[i].id == 307 ? "bzip2" : f->f[i].id == 32004 ? "lz4"
                       : f->f[i].id == 32008 ? "bitshuffle" : k ? own : "filter";
    ferry_sbuf_printf(b, "%s(hdf5_filter=%u", name, f->f[i].id);
    if (f->f[i].id == 307 && ncd >= 1) ferry_sbuf_printf(b, ",level=%u", cd[0]);
    if (f->f[i].id == 32008)   /* cd_values[4]: the compression inside bitshuffle's frames */
        ferry_sbuf_puts(b, ncd < 5 || !cd[4] ? ",none" : cd[4] == 2 ? ",lz4" : cd[4] == 3 ? ",zstd" : ",other");
    ferry_sbuf_puts(b, ")");
}

/* The codecs of the registered filters whose framing is HDF5's own (lz4
 * 32004, bitshuffle 32008: src/codecs/h5filters.c): 0 and *k set, 1 for any
 * other filter (ferry_codec_of_hdf5_filter's), or FERRY_EUNSUPPORTED. */
static int filter_codec(h5_file *h, const h5_filters *f, int i, uint32_t itemsize, uint64_t pos, const char *what,
                        ferry_codec *k) {
    const uint32_t *cd = f->f[i].cd;
    uint32_t ncd = f->f[i].ncd;
    if (f->f[i].id == 32004) { *k = (ferry_codec){FERRY_CODEC_H5LZ4, 0}; return 0; }
    if (f->f[i].id != 32008) return 1;
    /* cd_values: major, minor, element size, block size, compression, level */
    uint32_t es = ncd > 2 && cd[2] ? cd[2] : itemsize, block = ncd > 3 ? cd[3] : 0, comp = ncd > 4 ? cd[4] : 0;
    if (!es || es > (1u << 20))
        return h5_fail(h, FERRY_EUNSUPPORTED, pos, what, "bitshuffle filter with %u-byte elements", es);
    if (comp != 0 && comp != FERRY_H5BSHUF_LZ4 && comp != FERRY_H5BSHUF_ZSTD)
        return h5_fail(h, FERRY_EUNSUPPORTED, pos, what, "bitshuffle filter with compression %u (ferry: none, lz4 2, zstd 3)",
                       comp);
    /* compressed frames carry their block size; plain ones use the default */
    size_t def = 8192 / es - (8192 / es) % 8;
    if (def < 128) def = 128;
    if (!comp && block && block != def)
        return h5_fail(h, FERRY_EUNSUPPORTED, pos, what, "bitshuffle filter without compression in blocks of %u elements "
                       "(ferry reads the default, %zu)", block, def);
    *k = (ferry_codec){FERRY_CODEC_BITSHUFFLE, FERRY_H5BSHUF_PARAM(es, comp)};
    return 0;
}

/* Describe dataset o as variable vi/v; a problem with its data (not its
 * header) becomes vi->error. */
static int build_var(h5ds *st, ferry_dataset *ds, const h5_obj *o, const char *name, const h5_attr *a, size_t na,
                     ferry_var_info *vi, ferry_var *fv, h5var *v) {
    h5_file *h = &st->h;
    v->what = o->name;
    v->pos = h->base + o->addr;
    /* netCDF-C stores a variable named like a dimension it does not run along
     * ("lat"(x, lat)) as "_nc4_non_coord_lat": its netCDF name is "lat" */
    static const char non_coord[] = "_nc4_non_coord_";
    vi->name = !strncmp(name, non_coord, sizeof non_coord - 1) && name[sizeof non_coord - 1] ? name + sizeof non_coord - 1
                                                                                            : name;
    vi->path = ds->path;
    vi->codecs = "";
    vi->fill_json = "null";
    vi->dims_json = "[]";
    /* a valid type or shape beyond ferry (a type in the shared-message heap,
     * more than 16 dimensions) makes this variable unreadable, not the file */
    int rc = h5_obj_dtype(h, o, &v->type), unsupported = 0;
    if (rc == FERRY_EUNSUPPORTED) {
        set_error(h, vi, FERRY_EUNSUPPORTED);
        unsupported = 1;
        memset(&v->type, 0, sizeof v->type);
        v->type.cls = H5T_COMPOUND;
        snprintf(v->type.typestr, sizeof v->type.typestr, "unsupported");
    } else if (rc) {
        return rc;
    }
    const h5_msg *m = h5_obj_find(o, H5M_DATASPACE);
    if (!m) return h5_fail(h, FERRY_EFORMAT, h->base + o->addr, o->name, "dataset without a dataspace");
    h5_cur c = h5_cur_make(h, m->data, m->len, m->pos);
    if ((rc = h5_space_parse(h, &c, o->name, &v->space)) == FERRY_EUNSUPPORTED) {
        if (!unsupported) set_error(h, vi, FERRY_EUNSUPPORTED);
        ferry_clearerr();
        unsupported = 1;
        memset(&v->space, 0, sizeof v->space);
    } else if (rc) {
        return rc;
    }
    char *fj = NULL, *aj = NULL, *dj = NULL;
    if ((rc = attrs_json(h, a, na, &aj, &fj))) return rc;
    vi->attrs_json = aj;
    if (fj) vi->fill_json = fj;
    if ((rc = h5nc_var_dims(h, st->nc, o, name, &v->space, a, na, &dj))) return rc;
    vi->dims_json = dj;
    const h5_type *t = &v->type;
    vi->ndim = v->space.ndim < 0 ? 0 : v->space.ndim;
    memcpy(vi->shape, v->space.dims, sizeof vi->shape);
    memcpy(vi->chunks, v->space.dims, sizeof vi->chunks);
    vi->dtype = t->dt;
    vi->itemsize = t->dt == FERRY_DT_UNKNOWN ? 1 : t->size;
    vi->typestr = h5_strndup(h, t->typestr, strlen(t->typestr));
    if (!vi->typestr) return FERRY_ENOMEM;

    /* from here on, what goes wrong is this variable's, not the file's */
    if (unsupported) return 0;
    if (t->dt == FERRY_DT_UNKNOWN) {
        const char *why = t->cls == H5T_VLEN ? (t->vlen_string ? "variable-length strings" : "variable-length sequences")
                          : t->cls == H5T_COMPOUND ? "compound (struct) values" : t->cls == H5T_REFERENCE ? "references"
                          : t->cls == H5T_ARRAY ? "array-typed elements" : "values of this type";
        h5_fail(h, FERRY_EUNSUPPORTED, h->base + o->addr, o->name, "%s (%s) are not read by ferry", why, t->typestr);
        set_error(h, vi, FERRY_EUNSUPPORTED);
        return 0;
    }
    if (v->space.ndim < 0) {
        h5_fail(h, FERRY_EUNSUPPORTED, h->base + o->addr, o->name, "null dataspace (no values)");
        set_error(h, vi, FERRY_EUNSUPPORTED);
        return 0;
    }
    const uint8_t *fp;
    uint64_t fn;
    if ((rc = h5_obj_fill(h, o, t->size, &fp, &fn))) { set_error(h, vi, rc); return 0; }
    if (fp) {
        uint32_t swap = !t->big_endian ? 0 : t->is_complex ? t->size / 2
                        : (t->cls == H5T_INT || t->cls == H5T_FLOAT || t->cls == H5T_ENUM) ? t->size : 0;
        for (uint32_t i = 0; i < t->size && i < 16; i++) v->fill[i] = swap ? fp[(i / swap) * swap + swap - 1 - i % swap] : fp[i];
        /* a string's fill is a reference, for the planner: not a value to hand out */
        if (t->dt != FERRY_DT_STRING) fv->fill = v->fill;
    }
    if ((m = h5_obj_find(o, H5M_EFL))) {
        h5_fail(h, FERRY_EUNSUPPORTED, m->pos, o->name, "data in external files");
        set_error(h, vi, FERRY_EUNSUPPORTED);
        return 0;
    }
    if (!(m = h5_obj_find(o, H5M_LAYOUT))) return h5_fail(h, FERRY_EFORMAT, h->base + o->addr, o->name, "dataset without a layout");
    if ((rc = h5_layout_parse(h, m, o->name, vi->ndim, &v->lay))) {
        if (rc == FERRY_EUNSUPPORTED) { set_error(h, vi, FERRY_EUNSUPPORTED); return 0; }
        return rc;
    }
    const h5_msg *fm = h5_obj_find(o, H5M_FILTERS);
    if (fm) {
        h5_filters f;
        if ((rc = h5_filters_parse(h, fm, o->name, &f))) {
            if (rc == FERRY_EUNSUPPORTED) { set_error(h, vi, FERRY_EUNSUPPORTED); return 0; }
            return rc;
        }
        /* the description first, every filter named with what matters to a
         * writer (levels): an unreadable pipeline is still described */
        ferry_sbuf cb = {0};
        for (int i = f.n - 1; i >= 0; i--) {   /* decoding order: the pipeline reversed */
            if (cb.len) ferry_sbuf_append(&cb, " ", 1);
            describe_filter(&cb, &f, i);
        }
        char *s = ferry_sbuf_take(&cb);
        if (s) { vi->codecs = h5_strndup(h, s, strlen(s)); free(s); }
        if (!vi->codecs) return FERRY_ENOMEM;
        v->nfilters = f.n;
        for (int i = f.n - 1; i >= 0; i--) {
            ferry_codec k;
            int r = filter_codec(h, &f, i, t->size, fm->pos, o->name, &k);
            if (r == 1 && ferry_codec_of_hdf5_filter(f.f[i].id, f.f[i].cd, f.f[i].ncd < 8 ? f.f[i].ncd : 8, t->size, &k) < 0)
                r = h5_fail(h, FERRY_EUNSUPPORTED, fm->pos, o->name,
                            "HDF5 filter %u (\"%s\") has no ferry codec (ferry decodes deflate 1, shuffle 2, "
                            "fletcher32 3, blosc 32001, lz4 32004, bitshuffle 32008, zstd 32015)", f.f[i].id,
                            f.f[i].name ? f.f[i].name : "unnamed");
            if (r < 0) { set_error(h, vi, r); return 0; }
            v->codecs[v->ncodecs++] = k;
        }
    }
    uint64_t bytes = t->size;
    for (int k = 0; k < vi->ndim; k++) bytes *= vi->shape[k];   /* below 2^62 × 2^20: h5_space_parse bounds it */
    if (v->lay.cls == 2) {
        memcpy(vi->chunks, v->lay.chunk, sizeof vi->chunks);
        if (vi->ndim == 0) { h5_fail(h, FERRY_EFORMAT, m->pos, o->name, "chunked scalar"); set_error(h, vi, FERRY_EFORMAT); }
        return 0;
    }
    if (v->ncodecs) {
        h5_fail(h, FERRY_EFORMAT, fm->pos, o->name, "filters on data that is not chunked");
        set_error(h, vi, FERRY_EFORMAT);
        return 0;
    }
    if (v->lay.cls == 1 && v->lay.addr == H5_UNDEF) { v->absent = 1; return 0; }
    if (v->lay.size != UINT64_MAX && v->lay.size < bytes) {
        h5_fail(h, FERRY_EFORMAT, m->pos, o->name, "%llu bytes of data stored, %llu needed", (unsigned long long)v->lay.size,
                (unsigned long long)bytes);
        set_error(h, vi, FERRY_EFORMAT);
        return 0;
    }
    if (v->lay.cls == 0) v->data_abs = v->lay.addr;
    else if (h5_abs(h, v->lay.addr, bytes, &v->data_abs, o->name)) { set_error(h, vi, FERRY_EFORMAT); return 0; }
    vi->data_offset = v->data_abs;
    vi->data_bytes = bytes;
    return 0;
}

typedef struct member {
    const char *name, *path;
    h5_obj o;
    h5_attr *a;
    size_t na;
    h5_space sp;
    int is_group, is_data;
    int soft;                         /* reached through a soft link */
} member;

/* Read the members of group g (its path gpath): headers, attributes, dataspaces;
 * record its dimension scales (local: the opened group). */
static int scan_group(h5ds *st, const h5_obj *g, const char *gpath, int local, member **out, size_t *n) {
    h5_file *h = &st->h;
    h5_link *links;
    size_t nl;
    int rc = h5_group_links(h, g, &links, &nl);
    if (rc) return rc;
    member *ms = h5_alloc(h, nl * sizeof *ms);
    if (!ms) return FERRY_ENOMEM;
    for (size_t i = 0; i < nl; i++) {
        member *m = &ms[i];
        m->name = links[i].name;
        if (!(m->path = join(h, gpath, m->name))) return FERRY_ENOMEM;
        if ((rc = h5_ohdr_read(h, links[i].addr, m->path, &m->o))) return rc;
        m->is_group = h5_is_group(&m->o);
        m->soft = links[i].soft != NULL;
        m->is_data = h5_obj_find(&m->o, H5M_LAYOUT) != NULL;
        if (!m->is_data) continue;
        if ((rc = h5_obj_attrs(h, &m->o, &m->a, &m->na))) return rc;
        const h5_msg *sm = h5_obj_find(&m->o, H5M_DATASPACE);
        if (sm) {
            h5_cur c = h5_cur_make(h, sm->data, sm->len, sm->pos);
            rc = h5_space_parse(h, &c, m->path, &m->sp);
            if (rc == FERRY_EUNSUPPORTED) { ferry_clearerr(); memset(&m->sp, 0, sizeof m->sp); rc = 0; }   /* build_var says why */
            if (rc) return rc;
        }
        int is_var;
        if ((rc = h5nc_add_scale(h, st->nc, &m->o, m->name, &m->sp, m->a, m->na, local, &is_var))) return rc;
        if (!is_var) m->is_data = 0;   /* a dimension only */
    }
    *out = ms;
    *n = nl;
    return 0;
}

/* The metadata of every group and dataset of the file, read and checked as
 * netCDF-C reads it when it opens a file (links, object headers, datatypes,
 * dataspaces, layouts, filters, attributes; not the chunk indexes): a file
 * damaged in a group other than the one opened is refused, as netCDF4 and
 * h5netcdf refuse it, never half read. What ferry merely lacks (FERRY_EUNSUPPORTED)
 * is left to the opened group's variables to report. seen: headers already
 * walked (hard links may form cycles); *budget bounds the work. */
typedef struct walk { uint64_t *seen; size_t n, cap; uint64_t budget; } walk;   /* seen: open addressing, addr + 1 */

/* 1: addr was seen before; 0: now recorded; < 0: out of memory */
static int walk_seen(h5_file *h, walk *w, uint64_t addr) {
    if (2 * (w->n + 1) > w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 256;
        uint64_t *t = calloc(cap, sizeof *t);
        if (!t) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", h->path);
        for (size_t i = 0; i < w->cap; i++) {
            if (!w->seen[i]) continue;
            size_t j = (size_t)(w->seen[i] * 0x9E3779B97F4A7C15ull) & (cap - 1);
            while (t[j]) j = (j + 1) & (cap - 1);
            t[j] = w->seen[i];
        }
        free(w->seen);
        w->seen = t;
        w->cap = cap;
    }
    uint64_t key = addr + 1;
    size_t j = (size_t)(key * 0x9E3779B97F4A7C15ull) & (w->cap - 1);
    while (w->seen[j]) {
        if (w->seen[j] == key) return 1;
        j = (j + 1) & (w->cap - 1);
    }
    w->seen[j] = key;
    w->n++;
    return 0;
}

static int walk_ok(int rc) {
    if (rc == FERRY_EUNSUPPORTED) { ferry_clearerr(); return 0; }
    return rc;
}

static int walk_group(h5_file *h, walk *w, const h5_obj *g, const char *gpath, int depth) {
    if (depth > H5_MAX_DEPTH) return h5_fail(h, FERRY_EFORMAT, h->base + g->addr, gpath, "groups nest deeper than %d", H5_MAX_DEPTH);
    h5_link *links = NULL;   /* stays NULL when the group's links are beyond ferry (an external link) */
    size_t nl = 0;
    int rc = walk_ok(h5_group_links(h, g, &links, &nl));
    if (rc || !links) return rc;
    for (size_t i = 0; i < nl && !rc; i++) {
        int seen = walk_seen(h, w, links[i].addr);
        if (seen < 0) return seen;
        if (seen) continue;
        if (!w->budget--) return 0;   /* past any real file's object count: stop checking, do not refuse */
        const char *path = join(h, gpath, links[i].name);
        if (!path) return FERRY_ENOMEM;
        h5_obj o;
        if ((rc = walk_ok(h5_ohdr_read(h, links[i].addr, path, &o)))) break;
        if (!o.msgs) continue;
        h5_attr *a;
        size_t na;
        if ((rc = walk_ok(h5_obj_attrs(h, &o, &a, &na)))) break;
        if (h5_obj_find(&o, H5M_LAYOUT)) {
            h5_type t;
            h5_space sp;
            memset(&sp, 0, sizeof sp);
            if ((rc = walk_ok(h5_obj_dtype(h, &o, &t)))) break;
            const h5_msg *m = h5_obj_find(&o, H5M_DATASPACE);
            if (!m) { rc = h5_fail(h, FERRY_EFORMAT, h->base + o.addr, path, "dataset without a dataspace"); break; }
            h5_cur c = h5_cur_make(h, m->data, m->len, m->pos);
            if ((rc = walk_ok(h5_space_parse(h, &c, path, &sp)))) break;
            h5_layout lay;
            if ((rc = walk_ok(h5_layout_parse(h, h5_obj_find(&o, H5M_LAYOUT), path, sp.ndim < 0 ? 0 : sp.ndim, &lay)))) break;
            if ((m = h5_obj_find(&o, H5M_FILTERS))) {
                h5_filters f;
                if ((rc = walk_ok(h5_filters_parse(h, m, path, &f)))) break;
            }
        } else if (h5_is_group(&o)) {
            rc = walk_group(h, w, &o, path, depth + 1);
        }
    }
    return rc;
}

static int h5_open(ferry_dataset *ds, const ferry_open_opts *opts) {
    h5ds *st = calloc(1, sizeof *st);
    ds->fmt = st;
    if (!st) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
    if (pthread_mutex_init(&st->mu, NULL)) return ferry_seterr(FERRY_ENOMEM, "%s: no mutex", ds->path);
    st->mu_ok = 1;
    int rc = ferry_file_open(ds->ctx, ds->path, FERRY_READ, &st->file);
    if (rc < 0) { st->file = NULL; return ferry_preerr(rc, "%s", ds->path); }
    h5_file *h = &st->h;
    if ((rc = h5_file_open(h, st->file, ds->path))) return rc;
    if (!(st->nc = h5nc_new(h))) return FERRY_ENOMEM;

    /* down to the group asked for, scanning each ancestor for dimensions */
    const char *want = opts && opts->group ? opts->group : "";
    h5_obj g;
    if ((rc = h5_ohdr_read(h, h->root, "/", &g))) return rc;
    walk w = {.budget = 1u << 20};
    if ((rc = walk_seen(h, &w, h->root)) >= 0) rc = walk_group(h, &w, &g, "/", 0);
    free(w.seen);
    if (rc) return rc;
    char *gpath = "/";
    member *ms;
    size_t nm;
    for (int depth = 0;; depth++) {
        while (*want == '/') want++;
        int last = !*want;
        if ((rc = scan_group(st, &g, gpath, last, &ms, &nm))) return rc;
        if (last) break;
        if (depth >= H5_MAX_DEPTH)
            return ferry_seterr(FERRY_EINVAL, "%s: group \"%s\" nests deeper than %d", ds->path, opts->group, H5_MAX_DEPTH);
        size_t k = strcspn(want, "/");
        size_t i = 0;
        while (i < nm && (strlen(ms[i].name) != k || memcmp(ms[i].name, want, k) || !ms[i].is_group)) i++;
        if (i == nm)
            return ferry_seterr(FERRY_ENOTFOUND, "%s: no group \"%.*s\" in \"%s\"", ds->path, (int)k, want, gpath);
        g = ms[i].o;
        gpath = (char *)ms[i].path;
        want += k;
    }

    /* variables and child groups */
    int nv = 0;
    for (size_t i = 0; i < nm; i++) nv += ms[i].is_data;
    ds->vars = calloc((size_t)nv + 1, sizeof *ds->vars);
    st->vars = calloc((size_t)nv + 1, sizeof *st->vars);
    if (!ds->vars || !st->vars) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
    ferry_sbuf gb = {0};
    ferry_sbuf_append(&gb, "[", 1);
    for (size_t i = 0; i < nm; i++) {
        /* child groups by hard link only: a soft link to a group names a group
         * listed where it lives (and may point up the tree: no cycles to walk) */
        if (ms[i].is_group && !ms[i].is_data && !ms[i].soft) {
            if (gb.len > 1) ferry_sbuf_append(&gb, ",", 1);
            ferry_sbuf_json_string(&gb, ms[i].name, strlen(ms[i].name));
        }
        if (!ms[i].is_data) continue;
        int k = ds->nvars;
        ds->vars[k].fmt = &st->vars[k];
        ds->nvars++;
        if ((rc = build_var(st, ds, &ms[i].o, ms[i].name, ms[i].a, ms[i].na, &ds->vars[k].info, &ds->vars[k], &st->vars[k]))) {
            ferry_sbuf_free(&gb);
            return rc;
        }
    }
    ferry_sbuf_append(&gb, "]", 1);
    /* netCDF-4: a variable along an unlimited dimension is as long as the
     * dimension (the rest reads as fill, as netCDF-C and h5netcdf give it) */
    for (int k = 0; k < ds->nvars && !rc; k++) {
        ferry_var_info *vi = &ds->vars[k].info;
        if (st->vars[k].lay.cls == 2 && !vi->error) h5nc_pad(st->nc, vi->dims_json, vi->ndim, vi->shape);
    }
    if (!(ds->groups_json = ferry_sbuf_take(&gb))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);

    /* the group's own attributes, and its dimensions */
    h5_attr *ga;
    size_t nga;
    char *aj;
    if ((rc = h5_obj_attrs(h, &g, &ga, &nga)) || (rc = attrs_json(h, ga, nga, &aj, NULL))) return rc;
    if (!(ds->attrs_json = strdup(aj))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
    rc = h5nc_dims_json(h, st->nc, &ds->dims_json);
    h5_read_ahead_drop(h);   /* the window serves bursts (the open, a chunk index): not kept per open file */
    return rc;
}

static int chunk_absent(void *arg, const uint64_t *idx, ferry_chunk *out) {
    (void)arg; (void)idx;
    *out = (ferry_chunk){NULL, 0, FERRY_CHUNK_ABSENT, 0};
    return 0;
}

static int64_t h5_plan_read(ferry_dataset *ds, int var, const ferry_slice *sel, ferry_buf dst, unsigned flags,
                            ferry_plan *plan) {
    h5ds *st = ds->fmt;
    h5var *v = &st->vars[var];
    const ferry_var_info *vi = &ds->vars[var].info;
    uint32_t swap = v->type.big_endian && v->type.size > 1 && v->type.cls != H5T_STRING
                    ? (v->type.is_complex ? v->type.size / 2 : v->type.size) : 0;
    uint64_t total = vi->itemsize;
    for (int k = 0; k < vi->ndim; k++) total *= ferry_slice_count(sel[k]);
    if (v->lay.cls != 2 && !v->absent) {
        ferry_select_src src;
        ferry_select_src_init(&src, st->file, vi, v->data_abs, 0, (flags & FERRY_NATIVE) ? swap : 0);
        src.label = vi->name;
        return ferry_select_plan(&src, sel, dst, 0, plan);
    }
    ferry_layout l = {.ndim = vi->ndim, .itemsize = vi->itemsize, .swap = swap, .label = vi->name, .path = ds->path,
                      .file_size = st->h.size, .order = FERRY_ORDER_C};
    memcpy(l.shape, vi->shape, sizeof l.shape);
    memcpy(l.fill, v->fill, sizeof l.fill);
    if (v->absent) {
        memcpy(l.chunks, vi->shape, sizeof l.chunks);
        for (int k = 0; k < l.ndim; k++) if (!l.chunks[k]) l.chunks[k] = 1;
        l.lookup = chunk_absent;
    } else {
        memcpy(l.chunks, v->lay.chunk, sizeof l.chunks);
        l.ncodecs = v->ncodecs;
        memcpy(l.codecs, v->codecs, sizeof l.codecs);
        pthread_mutex_lock(&st->mu);
        int rc = 0;
        if (!v->loaded) {
            rc = h5_chunks_read(&st->h, &v->lay, vi->ndim, v->space.dims, v->space.maxdims, vi->shape, v->nfilters,
                                vi->itemsize, v->what, &v->ch);
            v->loaded = rc == 0;
            h5_read_ahead_drop(&st->h);
        }
        pthread_mutex_unlock(&st->mu);
        if (rc) return rc;
        static const ferry_chunk none = {0};
        static const uint64_t none_ix = 0;
        l.table = v->ch.n ? v->ch.table : &none;
        l.table_index = v->ch.n ? v->ch.index : &none_ix;
        l.ntable = v->ch.n;
    }
    int rc = ferry_layout_check(&l);
    if (!rc) rc = ferry_layout_plan_box(&l, sel, NULL, NULL, dst, flags, plan);
    return rc < 0 ? rc : (int64_t)total;
}

static int64_t h5_read_strings(ferry_dataset *ds, int var, const ferry_slice *sel, const ferry_run_opts *opts,
                               ferry_strings *out) {
    h5ds *st = ds->fmt;
    const h5var *v = &st->vars[var];
    const ferry_var_info *vi = &ds->vars[var].info;
    uint64_t count = 1;
    for (int k = 0; k < vi->ndim; k++) count *= ferry_slice_count(sel[k]);   /* bounded by the caller */
    uint64_t bytes = count * vi->itemsize;
    uint8_t *refs = malloc(bytes ? bytes : 1);
    if (!refs) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
    int64_t rc = 0;
    if (bytes) {
        ferry_plan *p;
        if ((rc = ferry_plan_create(&p)) >= 0) {
            rc = h5_plan_read(ds, var, sel, ferry_host_buf(refs, bytes), 0, p);
            if (rc >= 0) rc = ferry_run(ds->ctx, p, opts);
            ferry_plan_destroy(p);
        }
    }
    if (rc >= 0)
        rc = h5_strings_resolve(&st->h, ds->ctx, st->file, refs, count, vi->itemsize, v->what, v->pos, opts, out);
    free(refs);
    return rc < 0 ? rc : (int64_t)count;
}

const ferry_format_ops ferry_format_hdf5 = {"hdf5", h5_probe, h5_open, h5_close, h5_plan_read, h5_read_strings};
