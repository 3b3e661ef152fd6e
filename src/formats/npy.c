/* npy.c — NumPy .npy files, format versions 1.0, 2.0 and 3.0.
 *
 * Layout: "\x93NUMPY", major, minor, header length (u16 LE for v1, u32 LE for
 * v2/v3), then a Python-literal dict
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * padded with spaces and a final newline, then the raw array data (C or
 * Fortran order). v3 differs from v2 only in that the header is UTF-8.
 *
 * The dict is parsed strictly by hand: exactly the three keys, each once;
 * strings in single or double quotes without escapes; shape a tuple of
 * non-negative integers (1-tuples need their comma, as in Python). Structured
 * and object dtypes are refused (EUNSUPPORTED): they are not plain arrays.
 *
 * The dataset keeps the file open; plans refer to it, so close the dataset
 * only after the plans made from it have run. */
#include "formats/dataset.h"
#include "formats/typestr.h"
#include "formats/select.h"
#include <stdio.h>
#include <stdlib.h>

#define NPY_MAX_HEADER ((uint64_t)1 << 20)   /* numpy itself refuses > 10000 by default */

typedef struct npy_state {
    ferry_file *file;
    uint64_t file_size;
    int big_endian;      /* data needs a byteswap of swap_size for host order */
    uint32_t swap_size;
    char name[256];
    char typestr[64];
} npy_state;

static int npy_probe(const char *path, const uint8_t *head, size_t n, int is_dir) {
    return !is_dir && n >= 6 && !memcmp(head, "\x93NUMPY", 6);
}

/* ---- the header dict ----------------------------------------------------- */
typedef struct hparse {
    const char *s;
    size_t n, i;
    uint64_t base;       /* file offset of s[0] */
    const char *path;
} hparse;

static int herr(hparse *h, const char *why) {
    return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: npy header: %s", h->path,
                        (unsigned long long)(h->base + h->i), why);
}
static void hws(hparse *h) {
    while (h->i < h->n && (h->s[h->i] == ' ' || h->s[h->i] == '\t' || h->s[h->i] == '\n' || h->s[h->i] == '\r'))
        h->i++;
}
static int hstring(hparse *h, const char **out, size_t *len) {
    if (h->i >= h->n || (h->s[h->i] != '\'' && h->s[h->i] != '"')) return herr(h, "expected a string");
    char q = h->s[h->i++];
    size_t st = h->i;
    while (h->i < h->n && h->s[h->i] != q) {
        if (h->s[h->i] == '\\' || h->s[h->i] == '\n') return herr(h, "unsupported character in string");
        h->i++;
    }
    if (h->i >= h->n) return herr(h, "unterminated string");
    *out = h->s + st;
    *len = h->i - st;
    h->i++;
    return 0;
}
static int hword(hparse *h, const char *w) {
    size_t l = strlen(w);
    if (h->n - h->i < l || memcmp(h->s + h->i, w, l)) return 0;
    /* a whole word: not a prefix of a longer identifier */
    if (h->n - h->i > l) {
        char c = h->s[h->i + l];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_') return 0;
    }
    h->i += l;
    return 1;
}
static int hshape(hparse *h, uint64_t *shape, int *ndim) {
    if (h->i >= h->n || h->s[h->i] != '(') return herr(h, "shape: expected a tuple");
    h->i++;
    int n = 0, trailing_comma = 0;
    for (;;) {
        hws(h);
        if (h->i < h->n && h->s[h->i] == ')') { h->i++; break; }
        if (h->i >= h->n || h->s[h->i] < '0' || h->s[h->i] > '9') return herr(h, "shape: expected a non-negative integer");
        if (n == FERRY_MAX_DIMS) return herr(h, "shape: too many dimensions");
        uint64_t v = 0;
        size_t st = h->i;
        while (h->i < h->n && h->s[h->i] >= '0' && h->s[h->i] <= '9') {
            if (ferry_mul_overflow(v, 10, &v) || ferry_add_overflow(v, (uint64_t)(h->s[h->i] - '0'), &v) ||
                v > (uint64_t)INT64_MAX) {
                h->i = st;
                return herr(h, "shape: dimension too large");
            }
            h->i++;
        }
        if (h->s[st] == '0' && h->i - st > 1) { h->i = st; return herr(h, "shape: leading zero"); }
        if (h->i < h->n && h->s[h->i] == 'L') h->i++;   /* Python 2 writers: (3L, 4L) */
        shape[n++] = v;
        hws(h);
        trailing_comma = 0;
        if (h->i < h->n && h->s[h->i] == ',') { h->i++; trailing_comma = 1; continue; }
        if (h->i < h->n && h->s[h->i] == ')') { h->i++; break; }
        return herr(h, "shape: expected ',' or ')'");
    }
    if (n == 1 && !trailing_comma) { h->i--; return herr(h, "shape: (n) is not a tuple; expected (n,)"); }
    *ndim = n;
    return 0;
}

/* ---- open / close ------------------------------------------------------- */
static void npy_close(ferry_dataset *ds) {
    npy_state *st = ds->fmt;
    if (st) ferry_file_close(st->file);
    free(st);
    free(ds->vars);
    ds->fmt = NULL;
    ds->vars = NULL;
    ds->nvars = 0;
}

static void stem(const char *path, char *out, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t l = strlen(b);
    if (l > 4 && !strcmp(b + l - 4, ".npy")) l -= 4;
    if (l >= cap) l = cap - 1;
    memcpy(out, b, l);
    out[l] = 0;
    if (!l) snprintf(out, cap, "array");
}

static int npy_open(ferry_dataset *ds, const ferry_open_opts *opts) {
    const char *path = ds->path;
    npy_state *st = calloc(1, sizeof *st);
    ds->vars = calloc(1, sizeof *ds->vars);
    ds->fmt = st;
    if (!st || !ds->vars) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
    int rc = ferry_file_open(ds->ctx, path, FERRY_READ, &st->file);
    if (rc < 0) { st->file = NULL; return ferry_preerr(rc, "%s", path); }
    int64_t fsz = ferry_file_size(st->file);
    if (fsz < 0) return ferry_preerr((int)fsz, "%s", path);
    st->file_size = (uint64_t)fsz;

    uint8_t pre[12];
    int64_t got = ferry_pread(st->file, ferry_host_buf(pre, sizeof pre), 0, sizeof pre, FERRY_NO_DIRECT);
    if (got < 0) return ferry_preerr((int)got, "%s", path);
    if (got < 6 && !memcmp(pre, "\x93NUMPY", (size_t)got))
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %lld: npy magic truncated", path, (long long)got);
    if (got < 6 || memcmp(pre, "\x93NUMPY", 6))
        return ferry_seterr(FERRY_EFORMAT, "%s: byte 0: not an npy file (bad magic)", path);
    if (got < 10) return ferry_seterr(FERRY_EFORMAT, "%s: byte %lld: npy preamble truncated", path, (long long)got);
    int major = pre[6], minor = pre[7];
    if (major < 1 || major > 3 || minor != 0)
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: byte 6: npy format version %d.%d not supported", path, major, minor);
    uint64_t hstart = major == 1 ? 10 : 12, hlen;
    if (major == 1) hlen = ferry_le16(pre + 8);
    else {
        if (got < 12) return ferry_seterr(FERRY_EFORMAT, "%s: byte %lld: npy preamble truncated", path, (long long)got);
        hlen = ferry_le32(pre + 8);
    }
    if (hlen > NPY_MAX_HEADER)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte 8: npy header length %llu too large", path, (unsigned long long)hlen);
    if (hstart + hlen > st->file_size)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: npy header truncated (needs %llu bytes, file has %llu)",
                            path, (unsigned long long)st->file_size, (unsigned long long)(hstart + hlen),
                            (unsigned long long)st->file_size);
    char *hdr = malloc(hlen ? hlen : 1);
    if (!hdr) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
    got = ferry_pread(st->file, ferry_host_buf(hdr, hlen), hstart, hlen, FERRY_NO_DIRECT);
    if (got >= 0 && (uint64_t)got != hlen) got = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: npy header truncated", path,
                                                               (unsigned long long)(hstart + (uint64_t)got));
    if (got < 0) { free(hdr); return (int)got; }

    hparse h = {hdr, hlen, 0, hstart, path};
    const char *descr = NULL; size_t descr_len = 0;
    int fortran = -1, ndim = -1;
    uint64_t shape[FERRY_MAX_DIMS];
    rc = 0;
    /* bytes outside strings must be printable ASCII (v1/v2 are latin-1, v3
     * UTF-8, but nothing non-ASCII belongs in a plain array's header) */
    for (size_t k = 0; k < hlen && !rc; k++) {
        unsigned char c = (unsigned char)hdr[k];
        if (c >= 0x7f || (c < 0x20 && c != '\n' && c != '\t' && c != '\r')) {
            h.i = k;
            rc = herr(&h, "non-ASCII or control byte");
        }
    }
    if (!rc) {
        hws(&h);
        if (h.i >= h.n || hdr[h.i] != '{') rc = herr(&h, "expected '{'");
        else h.i++;
    }
    while (!rc) {
        hws(&h);
        if (h.i < h.n && hdr[h.i] == '}') { h.i++; break; }
        const char *key; size_t klen;
        size_t kpos = h.i;
        if ((rc = hstring(&h, &key, &klen))) break;
        hws(&h);
        if (h.i >= h.n || hdr[h.i] != ':') { rc = herr(&h, "expected ':'"); break; }
        h.i++;
        hws(&h);
        size_t vpos = h.i;
        if (klen == 5 && !memcmp(key, "descr", 5)) {
            if (descr) { h.i = kpos; rc = herr(&h, "duplicate key 'descr'"); break; }
            if (h.i < h.n && hdr[h.i] == '[') {
                rc = ferry_seterr(FERRY_EUNSUPPORTED, "%s: byte %llu: structured npy dtypes are not supported", path,
                                  (unsigned long long)(hstart + h.i));
                break;
            }
            if ((rc = hstring(&h, &descr, &descr_len))) break;
            if (!descr_len) { h.i = vpos; rc = herr(&h, "empty descr"); break; }
        } else if (klen == 13 && !memcmp(key, "fortran_order", 13)) {
            if (fortran >= 0) { h.i = kpos; rc = herr(&h, "duplicate key 'fortran_order'"); break; }
            if (hword(&h, "True")) fortran = 1;
            else if (hword(&h, "False")) fortran = 0;
            else { rc = herr(&h, "fortran_order: expected True or False"); break; }
        } else if (klen == 5 && !memcmp(key, "shape", 5)) {
            if (ndim >= 0) { h.i = kpos; rc = herr(&h, "duplicate key 'shape'"); break; }
            if ((rc = hshape(&h, shape, &ndim))) break;
        } else {
            h.i = kpos;
            rc = herr(&h, "unexpected key (only descr, fortran_order, shape)");
            break;
        }
        hws(&h);
        if (h.i < h.n && hdr[h.i] == ',') { h.i++; continue; }
        if (h.i < h.n && hdr[h.i] == '}') { h.i++; break; }
        rc = herr(&h, "expected ',' or '}'");
    }
    if (!rc) {
        hws(&h);
        if (h.i != h.n) rc = herr(&h, "unexpected text after the dict");
        else if (!descr || fortran < 0 || ndim < 0) rc = herr(&h, "missing key (descr, fortran_order and shape are required)");
    }
    ferry_var_info *vi = &ds->vars[0].info;
    if (!rc) {
        if (descr_len >= sizeof st->typestr) descr_len = sizeof st->typestr - 1;
        memcpy(st->typestr, descr, descr_len);
        st->typestr[descr_len] = 0;
        size_t dpos = (size_t)(descr - hdr);
        int d = ferry_typestr_parse(descr, descr_len, &vi->dtype, &vi->itemsize, &st->swap_size);
        if (d == -2)
            rc = ferry_seterr(FERRY_EUNSUPPORTED, "%s: byte %llu: npy dtype '%s': big-endian element size not supported",
                              path, (unsigned long long)(hstart + dpos), st->typestr);
        else if (d < 0)
            rc = ferry_seterr(descr[0] == '|' && descr_len >= 2 && descr[1] == 'O' ? FERRY_EUNSUPPORTED : FERRY_EFORMAT,
                              "%s: byte %llu: npy dtype '%s' is not a supported fixed-size dtype", path,
                              (unsigned long long)(hstart + dpos), st->typestr);
    }
    free(hdr);
    if (rc) return rc;

    ferry_select_src tmp = {0};
    tmp.ndim = ndim;
    tmp.itemsize = vi->itemsize;
    memcpy(tmp.shape, shape, sizeof(uint64_t) * (size_t)ndim);
    int64_t bytes = ferry_select_contiguous(&tmp, fortran);
    uint64_t data_off = hstart + hlen;
    if (bytes < 0)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: npy shape × itemsize overflows", path, (unsigned long long)hstart);
    if ((uint64_t)bytes > st->file_size - data_off)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: npy data truncated (needs %llu bytes at %llu, file has %llu)",
                            path, (unsigned long long)st->file_size, (unsigned long long)bytes,
                            (unsigned long long)data_off, (unsigned long long)st->file_size);

    st->big_endian = st->swap_size != 0;
    stem(path, st->name, sizeof st->name);
    vi->name = st->name;
    vi->typestr = st->typestr;
    vi->ndim = ndim;
    memcpy(vi->shape, shape, sizeof(uint64_t) * (size_t)ndim);
    memcpy(vi->chunks, shape, sizeof(uint64_t) * (size_t)ndim);
    vi->fortran_order = fortran;
    vi->dims_json = "null";
    vi->attrs_json = "{}";
    vi->fill_json = "null";
    vi->codecs = "";
    vi->path = ds->path;
    vi->data_offset = data_off;
    vi->data_bytes = (uint64_t)bytes;
    ds->nvars = 1;
    return 0;
}

static int64_t npy_plan_read(ferry_dataset *ds, int var, const ferry_slice *sel, ferry_buf dst, unsigned flags,
                             ferry_plan *plan) {
    npy_state *st = ds->fmt;
    const ferry_var_info *vi = &ds->vars[0].info;
    ferry_select_src src;
    ferry_select_src_init(&src, st->file, vi, vi->data_offset, vi->fortran_order,
                          (flags & FERRY_NATIVE) && st->big_endian ? st->swap_size : 0);
    int whole = 1;
    for (int k = 0; k < vi->ndim; k++)
        if (sel[k].start != 0 || (uint64_t)sel[k].stop != vi->shape[k] || sel[k].step != 1) whole = 0;
    if (vi->fortran_order && whole && (flags & FERRY_STORED_ORDER)) {
        /* keep F order: the bytes as stored, one extent */
        ferry_extent e;
        memset(&e, 0, sizeof e);
        e.kind = FERRY_EXTENT_READ;
        e.file = st->file;
        e.offset = vi->data_offset;
        e.length = e.decoded_size = vi->data_bytes;
        e.ncodecs = src.ncodecs;
        memcpy(e.codecs, src.codecs, sizeof e.codecs);
        e.dst = dst;
        e.label = vi->name;
        int rc = ferry_plan_add(plan, &e);
        return rc < 0 ? rc : (int64_t)vi->data_bytes;
    }
    return ferry_select_plan(&src, sel, dst, 0, plan);
}

const ferry_format_ops ferry_format_npy = {"npy", npy_probe, npy_open, npy_close, npy_plan_read, NULL};
