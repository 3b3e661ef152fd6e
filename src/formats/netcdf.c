/* netcdf.c — netCDF classic files: CDF-1, CDF-2 (64-bit offset), CDF-5 (64-bit data).
 *
 * Header grammar (all big-endian; "NON_NEG" is 4 bytes in CDF-1/2 and 8 in CDF-5,
 * "OFFSET" is 4 bytes in CDF-1 and 8 in CDF-2/5; tags and nc_type are 4 bytes):
 *   'C' 'D' 'F' version  numrecs(NON_NEG, all ones = streaming)
 *   dim_list   = ABSENT | NC_DIMENSION(10) nelems { name dim_length }      (length 0: the record dim)
 *   gatt_list  = ABSENT | NC_ATTRIBUTE(12) nelems { name nc_type nelems values(padded to 4) }
 *   var_list   = ABSENT | NC_VARIABLE(11) nelems { name ndims dimid* vatt_list nc_type vsize begin(OFFSET) }
 *   name       = nelems(NON_NEG) bytes(padded to 4);  ABSENT = ZERO ZERO (tag 4 bytes, count NON_NEG)
 * Data: a fixed variable is C order at `begin`; a record variable's record i
 * is at begin + i * recsize, where recsize is the sum of the record variables'
 * sizes padded to 4 bytes — except with exactly one record variable, whose
 * records are not padded. Sizes are computed here from the shapes: the stored
 * vsize is unreliable for variables over 4 GiB in CDF-1/2.
 *
 * The dataset keeps the file open; plans refer to it. */
#include "formats/dataset.h"
#include "formats/json.h"
#include "formats/select.h"
#include <stdio.h>
#include <stdlib.h>

#define NC_MAX_HEADER ((uint64_t)256 << 20)
#define NC_DIMENSION 10u
#define NC_VARIABLE 11u
#define NC_ATTRIBUTE 12u

typedef struct nc_type_info { const char *typestr; ferry_dtype dt; uint32_t size; } nc_type_info;
static const nc_type_info nc_types[12] = {
    {NULL, FERRY_DT_UNKNOWN, 0},
    {"|i1", FERRY_DT_I8, 1},     /* NC_BYTE */
    {"|S1", FERRY_DT_CHAR, 1},   /* NC_CHAR */
    {">i2", FERRY_DT_I16, 2},    /* NC_SHORT */
    {">i4", FERRY_DT_I32, 4},    /* NC_INT */
    {">f4", FERRY_DT_F32, 4},    /* NC_FLOAT */
    {">f8", FERRY_DT_F64, 8},    /* NC_DOUBLE */
    {"|u1", FERRY_DT_U8, 1},     /* NC_UBYTE  (CDF-5) */
    {">u2", FERRY_DT_U16, 2},    /* NC_USHORT (CDF-5) */
    {">u4", FERRY_DT_U32, 4},    /* NC_UINT   (CDF-5) */
    {">i8", FERRY_DT_I64, 8},    /* NC_INT64  (CDF-5) */
    {">u8", FERRY_DT_U64, 8},    /* NC_UINT64 (CDF-5) */
};

typedef struct nc_dim { char *name; uint64_t len; } nc_dim;

typedef struct nc_var {
    char *name, *dims_json, *attrs_json, *fill_json;
    uint32_t type;
    int is_record;
    uint64_t begin;
    uint64_t vsize;        /* bytes of one record (record vars) or of the whole var, unpadded */
    uint64_t header_pos;   /* where the variable is described, for messages */
} nc_var;

typedef struct nc_state {
    ferry_file *file;
    int version;
    nc_dim *dims;
    uint64_t ndims;
    nc_var *vars;          /* parallel to ds->vars */
    uint64_t numrecs, recsize;
} nc_state;

static int nc_probe(const char *path, const uint8_t *head, size_t n, int is_dir) {
    return !is_dir && n >= 4 && head[0] == 'C' && head[1] == 'D' && head[2] == 'F' &&
           (head[3] == 1 || head[3] == 2 || head[3] == 5);
}

/* ---- header reader: loads the file's head on demand ------------------------ */
typedef struct nc_rd {
    ferry_file *f;
    const char *path;
    uint64_t fsize;
    uint8_t *buf;
    uint64_t have;         /* bytes of the file loaded into buf */
    uint64_t pos;
    int version;
} nc_rd;

static int rd_need(nc_rd *r, uint64_t n, const char *what) {
    uint64_t end;
    if (ferry_add_overflow(r->pos, n, &end) || end > r->fsize)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: header truncated reading %s (file has %llu bytes)", r->path,
                            (unsigned long long)r->pos, what, (unsigned long long)r->fsize);
    if (end <= r->have) return 0;
    if (end > NC_MAX_HEADER)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: header larger than %llu MiB", r->path,
                            (unsigned long long)r->pos, (unsigned long long)(NC_MAX_HEADER >> 20));
    uint64_t want = r->have ? r->have * 2 : 65536;
    if (want < end) want = end;
    if (want > r->fsize) want = r->fsize;
    if (want > NC_MAX_HEADER) want = NC_MAX_HEADER;
    uint8_t *nb = realloc(r->buf, want);
    if (!nb) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", r->path);
    r->buf = nb;
    int64_t got = ferry_pread(r->f, ferry_host_buf(nb + r->have, want - r->have), r->have, want - r->have, FERRY_NO_DIRECT);
    if (got < 0) return ferry_preerr((int)got, "%s", r->path);
    r->have += (uint64_t)got;
    if (end > r->have)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: header truncated reading %s", r->path,
                            (unsigned long long)r->pos, what);
    return 0;
}

static int rd_u32(nc_rd *r, uint32_t *v, const char *what) {
    int rc = rd_need(r, 4, what);
    if (rc) return rc;
    *v = ferry_be32(r->buf + r->pos);
    r->pos += 4;
    return 0;
}

/* A big-endian signed count or offset of `width` bytes (4 or 8) that must not be negative. */
static int rd_nonneg_width(nc_rd *r, int width, uint64_t *v, const char *what) {
    uint64_t at = r->pos;
    int rc = rd_need(r, (uint64_t)width, what);
    if (rc) return rc;
    *v = width == 8 ? ferry_be64(r->buf + r->pos) : ferry_be32(r->buf + r->pos);
    r->pos += (uint64_t)width;
    if (*v > (width == 8 ? (uint64_t)INT64_MAX : (uint64_t)INT32_MAX))
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: negative %s", r->path, (unsigned long long)at, what);
    return 0;
}

/* NON_NEG: 4 bytes (CDF-1/2) or 8 bytes (CDF-5) */
static int rd_nonneg(nc_rd *r, uint64_t *v, const char *what) {
    return rd_nonneg_width(r, r->version == 5 ? 8 : 4, v, what);
}

/* OFFSET: 4 bytes (CDF-1) or 8 bytes (CDF-2, CDF-5) */
static int rd_offset(nc_rd *r, uint64_t *v, const char *what) {
    return rd_nonneg_width(r, r->version == 1 ? 4 : 8, v, what);
}

static uint64_t pad4(uint64_t n) { return (n + 3) & ~(uint64_t)3; }

/* A name: NON_NEG length, bytes, padding to 4. Valid UTF-8, no NUL. */
static int rd_name(nc_rd *r, char **out, const char *what) {
    uint64_t at = r->pos, n;
    int rc = rd_nonneg(r, &n, what);
    if (rc) return rc;
    if (n == 0 || n > 65536)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: %s name length %llu out of range", r->path,
                            (unsigned long long)at, what, (unsigned long long)n);
    if ((rc = rd_need(r, pad4(n), what))) return rc;
    const char *s = (const char *)r->buf + r->pos;
    if (memchr(s, 0, n) || !ferry_utf8_valid(s, n))
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: %s name is not valid UTF-8", r->path,
                            (unsigned long long)r->pos, what);
    char *p = malloc(n + 1);
    if (!p) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", r->path);
    memcpy(p, s, n);
    p[n] = 0;
    r->pos += pad4(n);
    *out = p;
    return 0;
}

/* A list header: tag + count, or ABSENT (both zero). */
static int rd_list(nc_rd *r, uint32_t want_tag, uint64_t *count, uint64_t min_elem, const char *what) {
    uint64_t at = r->pos;
    uint32_t tag;
    int rc = rd_u32(r, &tag, what);
    if (rc) return rc;
    if ((rc = rd_nonneg(r, count, what))) return rc;
    if (tag == 0 && *count == 0) return 0;
    if (tag != want_tag)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: expected the %s tag (%u), found %u", r->path,
                            (unsigned long long)at, what, want_tag, tag);
    /* each element needs at least min_elem bytes: bounds allocations by the file size */
    if (*count > (r->fsize - r->pos) / min_elem)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: %s count %llu cannot fit in the file", r->path,
                            (unsigned long long)at, what, (unsigned long long)*count);
    return 0;
}

/* ---- attributes → JSON --------------------------------------------------- */
static void put_number(ferry_sbuf *b, uint32_t type, const uint8_t *p) {
    switch (type) {
    case 1: ferry_sbuf_printf(b, "%d", (int)(int8_t)p[0]); break;
    case 7: ferry_sbuf_printf(b, "%u", (unsigned)p[0]); break;
    case 3: ferry_sbuf_printf(b, "%d", (int)(int16_t)(uint16_t)((p[0] << 8) | p[1])); break;
    case 8: ferry_sbuf_printf(b, "%u", (unsigned)(uint16_t)((p[0] << 8) | p[1])); break;
    case 4: ferry_sbuf_printf(b, "%d", (int)(int32_t)ferry_be32(p)); break;
    case 9: ferry_sbuf_printf(b, "%u", (unsigned)ferry_be32(p)); break;
    case 10: ferry_sbuf_printf(b, "%lld", (long long)(int64_t)ferry_be64(p)); break;
    case 11: ferry_sbuf_printf(b, "%llu", (unsigned long long)ferry_be64(p)); break;
    case 5: {
        uint32_t u = ferry_be32(p);
        float f;
        memcpy(&f, &u, 4);
        ferry_sbuf_json_double(b, (double)f, 9);
        break;
    }
    case 6: {
        uint64_t u = ferry_be64(p);
        double d;
        memcpy(&d, &u, 8);
        ferry_sbuf_json_double(b, d, 17);
        break;
    }
    }
}

/* Parse an attribute list into a JSON object; *fill gets the _FillValue's
 * first value as JSON when fill != NULL and the attribute exists. */
static int rd_attrs(nc_rd *r, char **json, char **fill) {
    uint64_t n;
    int rc = rd_list(r, NC_ATTRIBUTE, &n, r->version == 5 ? 20 : 12, "attribute list");
    if (rc) return rc;
    ferry_sbuf b = {0};
    ferry_sbuf_append(&b, "{", 1);
    for (uint64_t i = 0; i < n && !rc; i++) {
        char *name = NULL;
        uint64_t at = r->pos, cnt, bytes;
        uint32_t type;
        if ((rc = rd_name(r, &name, "attribute"))) break;
        if (!(rc = rd_u32(r, &type, "attribute type")) && (type == 0 || type > 11 || (r->version != 5 && type > 6)))
            rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: attribute \"%s\": bad type %u", r->path,
                              (unsigned long long)(r->pos - 4), name, type);
        if (!rc) rc = rd_nonneg(r, &cnt, "attribute length");
        if (!rc && (ferry_mul_overflow(cnt, nc_types[type].size, &bytes) || bytes > r->fsize))
            rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: attribute \"%s\": %llu values cannot fit in the file",
                              r->path, (unsigned long long)at, name, (unsigned long long)cnt);
        if (!rc) rc = rd_need(r, pad4(bytes), "attribute values");
        if (!rc) {
            const uint8_t *v = r->buf + r->pos;
            if (i) ferry_sbuf_append(&b, ",", 1);
            ferry_sbuf_json_string(&b, name, strlen(name));
            ferry_sbuf_append(&b, ":", 1);
            int is_fill = fill && !strcmp(name, "_FillValue");
            if (type == 2) {
                ferry_sbuf_json_string(&b, (const char *)v, bytes);
                if (is_fill) {
                    ferry_sbuf fb = {0};
                    ferry_sbuf_json_string(&fb, (const char *)v, bytes ? 1 : 0);
                    free(*fill);
                    if (!(*fill = ferry_sbuf_take(&fb))) rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", r->path);
                }
            } else {
                ferry_sbuf_printf(&b, "{\"type\":\"%s\",\"value\":[", nc_types[type].typestr);
                for (uint64_t k = 0; k < cnt; k++) {
                    if (k) ferry_sbuf_append(&b, ",", 1);
                    put_number(&b, type, v + k * nc_types[type].size);
                }
                ferry_sbuf_append(&b, "]}", 2);
                if (is_fill && cnt) {
                    ferry_sbuf fb = {0};
                    put_number(&fb, type, v);
                    free(*fill);
                    if (!(*fill = ferry_sbuf_take(&fb))) rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", r->path);
                }
            }
            r->pos += pad4(bytes);
        }
        free(name);
    }
    ferry_sbuf_append(&b, "}", 1);
    if (rc) { ferry_sbuf_free(&b); return rc; }
    if (!(*json = ferry_sbuf_take(&b))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", r->path);
    return 0;
}

/* ---- open / close -------------------------------------------------------- */
static void nc_close(ferry_dataset *ds) {
    nc_state *st = ds->fmt;
    if (st) {
        ferry_file_close(st->file);
        for (uint64_t i = 0; i < st->ndims && st->dims; i++) free(st->dims[i].name);
        free(st->dims);
        if (st->vars)
            for (int i = 0; i < ds->nvars; i++) {
                free(st->vars[i].name); free(st->vars[i].dims_json);
                free(st->vars[i].attrs_json); free(st->vars[i].fill_json);
            }
        free(st->vars);
        free(st);
    }
    free(ds->vars);
    free(ds->attrs_json);
    free(ds->dims_json);
    ds->vars = NULL; ds->nvars = 0; ds->fmt = NULL; ds->attrs_json = ds->dims_json = NULL;
}

typedef struct span { uint64_t begin, end; int var; } span;
static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int parse_header(ferry_dataset *ds, nc_state *st, nc_rd *r) {
    const char *path = ds->path;
    int rc = rd_need(r, 4, "magic");
    if (rc) return rc;
    if (memcmp(r->buf, "CDF", 3) || (r->buf[3] != 1 && r->buf[3] != 2 && r->buf[3] != 5))
        return ferry_seterr(FERRY_EFORMAT, "%s: byte 0: not a netCDF classic file (bad magic)", path);
    st->version = r->version = r->buf[3];
    r->pos = 4;

    /* numrecs; all ones = streaming, computed from the file size below */
    int streaming = 0;
    uint64_t at = r->pos;
    if (r->version == 5) {
        if ((rc = rd_need(r, 8, "numrecs"))) return rc;
        st->numrecs = ferry_be64(r->buf + r->pos);
        r->pos += 8;
        if (st->numrecs == UINT64_MAX) streaming = 1;
    } else {
        uint32_t x;
        if ((rc = rd_u32(r, &x, "numrecs"))) return rc;
        st->numrecs = x;
        if (x == 0xFFFFFFFFu) streaming = 1;
    }
    if (!streaming && st->numrecs > (uint64_t)INT64_MAX)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: negative numrecs", path, (unsigned long long)at);

    /* dimensions */
    uint64_t nd;
    if ((rc = rd_list(r, NC_DIMENSION, &nd, r->version == 5 ? 16 : 8, "dimension list"))) return rc;
    st->dims = calloc(nd ? nd : 1, sizeof *st->dims);
    if (!st->dims) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
    int64_t record_dim = -1;
    for (uint64_t i = 0; i < nd; i++) {
        at = r->pos;
        if ((rc = rd_name(r, &st->dims[i].name, "dimension"))) return rc;
        st->ndims = i + 1;
        if ((rc = rd_nonneg(r, &st->dims[i].len, "dimension length"))) return rc;
        if (st->dims[i].len == 0) {
            if (record_dim >= 0)
                return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: a second unlimited dimension (\"%s\")", path,
                                    (unsigned long long)at, st->dims[i].name);
            record_dim = (int64_t)i;
        }
    }

    /* global attributes */
    if ((rc = rd_attrs(r, &ds->attrs_json, NULL))) return rc;

    /* variables */
    uint64_t nv;
    if ((rc = rd_list(r, NC_VARIABLE, &nv, r->version == 5 ? 40 : 24, "variable list"))) return rc;
    if (nv > (uint64_t)INT32_MAX) return ferry_seterr(FERRY_EFORMAT, "%s: too many variables", path);
    st->vars = calloc(nv ? nv : 1, sizeof *st->vars);
    ds->vars = calloc(nv ? nv : 1, sizeof *ds->vars);
    if (!st->vars || !ds->vars) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
    uint64_t dimids[FERRY_MAX_DIMS];
    for (uint64_t i = 0; i < nv; i++) {
        nc_var *v = &st->vars[i];
        ferry_var_info *vi = &ds->vars[i].info;
        ds->vars[i].fmt = v;
        v->header_pos = r->pos;
        if ((rc = rd_name(r, &v->name, "variable"))) return rc;
        ds->nvars = (int)i + 1;
        uint64_t ndv;
        at = r->pos;
        if ((rc = rd_nonneg(r, &ndv, "variable rank"))) return rc;
        if (ndv > FERRY_MAX_DIMS)
            return ferry_seterr(ndv > r->fsize ? FERRY_EFORMAT : FERRY_EUNSUPPORTED,
                                "%s: byte %llu: variable \"%s\": %llu dimensions (at most %d supported)", path,
                                (unsigned long long)at, v->name, (unsigned long long)ndv, FERRY_MAX_DIMS);
        ferry_sbuf db = {0};
        ferry_sbuf_append(&db, "[", 1);
        for (uint64_t k = 0; k < ndv; k++) {
            at = r->pos;
            if ((rc = rd_nonneg(r, &dimids[k], "dimension id"))) { ferry_sbuf_free(&db); return rc; }
            if (dimids[k] >= st->ndims) {
                ferry_sbuf_free(&db);
                return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: variable \"%s\": dimension id %llu out of range", path,
                                    (unsigned long long)at, v->name, (unsigned long long)dimids[k]);
            }
            if ((int64_t)dimids[k] == record_dim && k != 0) {
                ferry_sbuf_free(&db);
                return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: variable \"%s\": the unlimited dimension is not first",
                                    path, (unsigned long long)at, v->name);
            }
            if (k) ferry_sbuf_append(&db, ",", 1);
            const char *dn = st->dims[dimids[k]].name;
            ferry_sbuf_json_string(&db, dn, strlen(dn));
        }
        ferry_sbuf_append(&db, "]", 1);
        if (!(v->dims_json = ferry_sbuf_take(&db))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
        if ((rc = rd_attrs(r, &v->attrs_json, &v->fill_json))) return rc;
        at = r->pos;
        if ((rc = rd_u32(r, &v->type, "variable type"))) return rc;
        if (v->type == 0 || v->type > 11 || (r->version != 5 && v->type > 6))
            return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: variable \"%s\": bad type %u", path,
                                (unsigned long long)at, v->name, v->type);
        uint64_t vsize_stored;
        if ((rc = rd_nonneg(r, &vsize_stored, "vsize"))) return rc;
        if ((rc = rd_offset(r, &v->begin, "begin"))) return rc;

        v->is_record = ndv > 0 && (int64_t)dimids[0] == record_dim;
        vi->name = v->name;
        vi->dtype = nc_types[v->type].dt;
        vi->typestr = nc_types[v->type].typestr;
        vi->itemsize = nc_types[v->type].size;
        vi->ndim = (int)ndv;
        uint64_t sz = vi->itemsize;
        for (uint64_t k = 0; k < ndv; k++) {
            vi->shape[k] = st->dims[dimids[k]].len;   /* record dim: numrecs, set below */
            vi->chunks[k] = vi->shape[k];
            if (k == 0 && v->is_record) continue;
            if (ferry_mul_overflow(sz, vi->shape[k], &sz) || sz > (uint64_t)INT64_MAX)
                return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: variable \"%s\": size overflows", path,
                                    (unsigned long long)v->header_pos, v->name);
        }
        v->vsize = sz;
        vi->dims_json = v->dims_json;
        vi->attrs_json = v->attrs_json;
        vi->fill_json = v->fill_json ? v->fill_json : "null";
        vi->codecs = "";
        vi->path = ds->path;
    }
    uint64_t header_end = r->pos;

    /* record size: padded sizes, except a lone record variable */
    uint64_t nrec_vars = 0, min_rec_begin = UINT64_MAX;
    st->recsize = 0;
    for (int i = 0; i < ds->nvars; i++)
        if (st->vars[i].is_record) {
            nrec_vars++;
            if (st->vars[i].begin < min_rec_begin) min_rec_begin = st->vars[i].begin;
            if (ferry_add_overflow(st->recsize, pad4(st->vars[i].vsize), &st->recsize))
                return ferry_seterr(FERRY_EFORMAT, "%s: record size overflows", path);
        }
    if (nrec_vars == 1)
        for (int i = 0; i < ds->nvars; i++)
            if (st->vars[i].is_record) st->recsize = st->vars[i].vsize;
    if (streaming) {
        st->numrecs = 0;
        if (nrec_vars && st->recsize && min_rec_begin < r->fsize) st->numrecs = (r->fsize - min_rec_begin) / st->recsize;
    }

    /* shapes of record variables, extents inside the file, no overlaps */
    span *spans = malloc(((size_t)ds->nvars + 1) * sizeof *spans);
    if (!spans) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
    int nspans = 0;
    for (int i = 0; i < ds->nvars && !rc; i++) {
        nc_var *v = &st->vars[i];
        ferry_var_info *vi = &ds->vars[i].info;
        uint64_t end = v->begin;
        int bad = 0;
        if (v->is_record) {
            vi->shape[0] = st->numrecs;
            vi->chunks[0] = 1;
            if (st->numrecs && v->vsize) {
                uint64_t t;
                bad = ferry_mul_overflow(st->numrecs - 1, st->recsize, &t) || ferry_add_overflow(end, t, &end) ||
                      ferry_add_overflow(end, v->vsize, &end);
            }
            if (st->recsize == v->vsize || st->numrecs <= 1) {
                vi->data_offset = v->begin;
                vi->data_bytes = st->numrecs * v->vsize;
            }
        } else {
            bad = ferry_add_overflow(end, v->vsize, &end);
            vi->data_offset = v->begin;
            vi->data_bytes = v->vsize;
            if (!bad && v->vsize) spans[nspans++] = (span){v->begin, end, i};
        }
        if (bad || end > r->fsize)
            rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: variable \"%s\": data [%llu, %llu) past the end of the file (%llu bytes)",
                              path, (unsigned long long)v->header_pos, v->name, (unsigned long long)v->begin,
                              bad ? 0ull : (unsigned long long)end, (unsigned long long)r->fsize);
        else if ((v->vsize && v->begin < header_end) && (!v->is_record || st->numrecs))
            rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: variable \"%s\": begin %llu lies inside the header (ends at %llu)",
                              path, (unsigned long long)v->header_pos, v->name, (unsigned long long)v->begin,
                              (unsigned long long)header_end);
    }
    if (!rc && nrec_vars > 1) {
        /* inside a record, the record variables' slices must not overlap nor
         * run past the record (netCDF-C refuses such a file: a flipped bit in
         * a `begin` that pairs one variable's bytes with its neighbour's) */
        span *rs = malloc((size_t)nrec_vars * sizeof *rs);
        if (!rs) rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
        int nr = 0;
        for (int i = 0; i < ds->nvars && rs; i++)
            if (st->vars[i].is_record) rs[nr++] = (span){st->vars[i].begin, st->vars[i].begin + pad4(st->vars[i].vsize), i};
        if (rs) qsort(rs, (size_t)nr, sizeof *rs, cmp_span);
        for (int i = 0; i < nr && !rc; i++)
            if ((i + 1 < nr && rs[i].end > rs[i + 1].begin) || rs[i].end - min_rec_begin > st->recsize)
                rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: record variable \"%s\": begin %llu puts its %llu bytes "
                                  "per record over %s", path, (unsigned long long)st->vars[rs[i].var].header_pos,
                                  st->vars[rs[i].var].name, (unsigned long long)rs[i].begin,
                                  (unsigned long long)st->vars[rs[i].var].vsize,
                                  i + 1 < nr && rs[i].end > rs[i + 1].begin ? "the next record variable's" : "the next record");
        free(rs);
    }
    if (!rc && nrec_vars && st->numrecs) {
        /* the record block as one span, so fixed data cannot overlap it */
        uint64_t end = min_rec_begin;
        if (!ferry_mul_overflow(st->numrecs, st->recsize, &end) && !ferry_add_overflow(end, min_rec_begin, &end) &&
            end > min_rec_begin)
            spans[nspans++] = (span){min_rec_begin, FERRY_MIN(end, r->fsize), -1};
    }
    if (!rc) {
        qsort(spans, (size_t)nspans, sizeof *spans, cmp_span);
        for (int i = 1; i < nspans && !rc; i++)
            if (spans[i].begin < spans[i - 1].end) {
                int a = spans[i - 1].var >= 0 ? spans[i - 1].var : spans[i].var;
                rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: variable \"%s\": data overlaps another variable's", path,
                                  (unsigned long long)st->vars[a].header_pos, st->vars[a].name);
            }
    }
    free(spans);
    if (rc) return rc;

    /* dimensions JSON */
    ferry_sbuf b = {0};
    ferry_sbuf_append(&b, "{", 1);
    for (uint64_t i = 0; i < st->ndims; i++) {
        if (i) ferry_sbuf_append(&b, ",", 1);
        ferry_sbuf_json_string(&b, st->dims[i].name, strlen(st->dims[i].name));
        int unl = (int64_t)i == record_dim;
        ferry_sbuf_printf(&b, ":{\"size\":%llu,\"unlimited\":%s}", (unsigned long long)(unl ? st->numrecs : st->dims[i].len),
                          unl ? "true" : "false");
    }
    ferry_sbuf_append(&b, "}", 1);
    if (!(ds->dims_json = ferry_sbuf_take(&b))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
    return 0;
}

static int nc_open(ferry_dataset *ds, const ferry_open_opts *opts) {
    nc_state *st = calloc(1, sizeof *st);
    ds->fmt = st;
    if (!st) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
    int rc = ferry_file_open(ds->ctx, ds->path, FERRY_READ, &st->file);
    if (rc < 0) { st->file = NULL; return ferry_preerr(rc, "%s", ds->path); }
    int64_t fsz = ferry_file_size(st->file);
    if (fsz < 0) return ferry_preerr((int)fsz, "%s", ds->path);
    nc_rd r = {st->file, ds->path, (uint64_t)fsz, NULL, 0, 0, 0};
    rc = parse_header(ds, st, &r);
    free(r.buf);
    return rc;
}

static int64_t nc_plan_read(ferry_dataset *ds, int var, const ferry_slice *sel, ferry_buf dst, unsigned flags,
                            ferry_plan *plan) {
    nc_state *st = ds->fmt;
    const nc_var *v = &st->vars[var];
    const ferry_var_info *vi = &ds->vars[var].info;
    ferry_select_src src;
    /* big-endian on disk: swapped to host order when asked */
    ferry_select_src_init(&src, st->file, vi, v->begin, 0, (flags & FERRY_NATIVE) ? vi->itemsize : 0);
    if (v->is_record) src.stride[0] = st->recsize;
    return ferry_select_plan(&src, sel, dst, 0, plan);
}

const ferry_format_ops ferry_format_netcdf3 = {"netcdf3", nc_probe, nc_open, nc_close, nc_plan_read, NULL};
