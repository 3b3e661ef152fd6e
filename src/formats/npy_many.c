/* npy_many.c — a batch of .npy files, one sample each, planned at once.
 *
 * Only the first file's header is parsed before the read (by the npy format
 * itself, with all its checks). Every file's first H bytes (H: the first
 * file's header length) are read beside its data in the same job, so the
 * bytes checked afterwards are those of the very file the data came from.
 * Files written by one numpy for one dtype and shape have byte-identical
 * headers: the check is a memcmp. A file whose header differs is parsed in
 * full: another dtype, shape or order fails the batch naming it; the same
 * array at another offset (another npy version, other padding) is read again
 * from its own offset. */
#include "formats/dataset.h"
#include "formats/typestr.h"
#include <stdlib.h>

struct ferry_npy_batch {
    ferry_ctx *ctx;
    ferry_job *job;
    char **paths;
    size_t n;
    ferry_buf dst;
    uint64_t stride, hlen;
    unsigned flags;
    uint8_t *hdr0;                /* the first file's header bytes */
    uint8_t *hdrs;                /* n * hlen: every file's first hlen bytes */
    ferry_npy_info info;
    int waited;
    int64_t result;
};

static void batch_free(ferry_npy_batch *b) {
    if (!b) return;
    ferry_job_destroy(b->job);
    for (size_t i = 0; b->paths && i < b->n; i++) free(b->paths[i]);
    free(b->paths);
    free(b->hdr0);
    free(b->hdrs);
    free(b);
}

static void shape_text(const ferry_npy_info *in, char *out, size_t cap) {
    size_t k = (size_t)snprintf(out, cap, "%s (", in->typestr);
    for (int d = 0; d < in->ndim && k < cap; d++)
        k += (size_t)snprintf(out + k, cap - k, d ? ", %llu" : "%llu", (unsigned long long)in->shape[d]);
    if (k < cap) snprintf(out + k, cap - k, in->ndim == 1 ? ",)" : ")");
}

/* Parse one file with the npy format: its dtype and shape, and where its data is. */
static int describe(ferry_ctx *ctx, const char *path, ferry_npy_info *info, uint64_t *data_off, ferry_dataset **keep) {
    ferry_open_opts o = {.format = "npy"};
    ferry_dataset *ds;
    int rc = ferry_dataset_open(ctx, path, &o, &ds);
    if (rc < 0) return rc;
    ferry_var_info v;
    if ((rc = ferry_dataset_var(ds, 0, &v)) < 0) { ferry_dataset_close(ds); return rc; }
    memset(info, 0, sizeof *info);
    info->dtype = v.dtype;
    snprintf(info->typestr, sizeof info->typestr, "%s", v.typestr);
    info->itemsize = v.itemsize;
    info->ndim = v.ndim;
    memcpy(info->shape, v.shape, sizeof(uint64_t) * (size_t)v.ndim);
    info->fortran_order = v.fortran_order && v.ndim > 1;
    info->nbytes = v.data_bytes;
    *data_off = v.data_offset;
    if (keep) *keep = ds; else ferry_dataset_close(ds);
    return 0;
}

static int same_array(const ferry_npy_info *a, const ferry_npy_info *b) {
    if (strcmp(a->typestr, b->typestr) || a->ndim != b->ndim || a->fortran_order != b->fortran_order) return 0;
    return memcmp(a->shape, b->shape, sizeof(uint64_t) * (size_t)a->ndim) == 0;
}

static int add_read(ferry_plan *p, const char *path, uint64_t off, uint64_t len, ferry_buf dst, uint64_t dst_off,
                    unsigned swap) {
    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.kind = FERRY_EXTENT_READ;
    e.path = path;
    e.offset = off;
    e.length = e.decoded_size = len;
    e.dst = dst;
    e.dst_offset = dst_off;
    if (swap > 1) { e.ncodecs = 1; e.codecs[0].id = FERRY_CODEC_BYTESWAP; e.codecs[0].param = swap; }
    return ferry_plan_add(p, &e);
}

int ferry_npy_batch_submit(ferry_ctx *ctx, const char *const *paths, size_t n, ferry_buf dst, uint64_t stride,
                           unsigned flags, ferry_npy_info *info, ferry_npy_batch **out) {
    if (!ctx || !out || (n && !paths)) return ferry_seterr(FERRY_EINVAL, "ferry_npy_batch_submit: NULL argument");
    *out = NULL;
    if (n == 0) return ferry_seterr(FERRY_EINVAL, "ferry_npy_batch_submit: no files");
    for (size_t i = 0; i < n; i++)
        if (!paths[i] || !*paths[i]) return ferry_seterr(FERRY_EINVAL, "ferry_npy_batch_submit: path %zu is empty", i);
    ferry_npy_batch *b = calloc(1, sizeof *b);
    if (!b) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    b->ctx = ctx;
    b->dst = dst;
    b->flags = flags;
    uint64_t data_off;
    int rc = describe(ctx, paths[0], &b->info, &data_off, NULL);
    if (rc < 0) { free(b); return rc; }
    if (b->info.fortran_order && !(flags & FERRY_STORED_ORDER)) {
        free(b);
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: Fortran-order npy files: pass FERRY_STORED_ORDER to copy them as stored",
                            paths[0]);
    }
    uint64_t nb = b->info.nbytes, end;
    if (stride == 0) stride = nb;
    if (stride < nb) {
        free(b);
        return ferry_seterr(FERRY_EINVAL, "%s: stride %llu is smaller than the array's %llu bytes", paths[0],
                            (unsigned long long)stride, (unsigned long long)nb);
    }
    if (ferry_mul_overflow(stride, n - 1, &end) || ferry_add_overflow(end, nb, &end) || end > dst.size) {
        free(b);
        return ferry_seterr(FERRY_EINVAL, "%zu arrays of %llu bytes %llu apart do not fit the destination of %zu bytes",
                            n, (unsigned long long)nb, (unsigned long long)stride, dst.size);
    }
    b->stride = stride;
    b->hlen = data_off;
    b->n = n;
    /* the first file's header bytes, as parsed: the header read, then parsed
     * again — a file replaced between the two is not taken for the other */
    b->hdr0 = malloc(b->hlen ? b->hlen : 1);
    if (!b->hdr0) { free(b); return ferry_seterr(FERRY_ENOMEM, "out of memory"); }
    ferry_file *f0;
    if ((rc = ferry_file_open(ctx, paths[0], FERRY_READ, &f0)) < 0) { free(b->hdr0); free(b); return rc; }
    int64_t got = ferry_pread(f0, ferry_host_buf(b->hdr0, b->hlen), 0, b->hlen, FERRY_NO_DIRECT);
    ferry_file_close(f0);
    ferry_npy_info again;
    uint64_t off2 = 0;
    if (got >= 0 && (uint64_t)got != b->hlen) got = ferry_seterr(FERRY_ESHORT, "%s: shorter than its header", paths[0]);
    if (got >= 0) got = describe(ctx, paths[0], &again, &off2, NULL);
    if (got >= 0 && (off2 != data_off || !same_array(&again, &b->info)))
        got = ferry_seterr(FERRY_EIO, "%s: the file changed while its header was read", paths[0]);
    if (got < 0) { free(b->hdr0); free(b); return (int)got; }
    unsigned swap = 0;
    if (flags & FERRY_NATIVE) {
        ferry_dtype dt;
        uint32_t isz, sw = 0;
        if (ferry_typestr_parse(b->info.typestr, strlen(b->info.typestr), &dt, &isz, &sw) == 0) swap = sw;
    }
    b->paths = calloc(n, sizeof *b->paths);
    b->hdrs = malloc(n * b->hlen > 0 ? n * b->hlen : 1);
    ferry_plan *p = NULL;
    if (!b->paths || !b->hdrs || ferry_plan_create(&p) < 0) { batch_free(b); return ferry_seterr(FERRY_ENOMEM, "out of memory"); }
    for (size_t i = 0; i < n && rc >= 0; i++)
        if (!(b->paths[i] = strdup(paths[i]))) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    ferry_buf hb = ferry_host_buf(b->hdrs, n * b->hlen);
    /* into host memory: header and data of a file side by side (one preadv);
     * into device memory: every header first (one host pack), then the data
     * (device packs) — a pack holds one memory kind */
    int interleave = dst.kind == FERRY_MEM_HOST;
    for (size_t i = 0; i < n && rc >= 0; i++) {
        rc = add_read(p, b->paths[i], 0, b->hlen, hb, i * b->hlen, 0);
        if (rc >= 0 && interleave) rc = add_read(p, b->paths[i], b->hlen, nb, dst, i * stride, swap);
    }
    for (size_t i = 0; !interleave && i < n && rc >= 0; i++) rc = add_read(p, b->paths[i], b->hlen, nb, dst, i * stride, swap);
    ferry_run_opts ro = {FERRY_PATH_AUTO, 0, flags & FERRY_REREAD, FERRY_DECODE_AUTO};
    if (rc >= 0) rc = ferry_submit(ctx, p, &ro, &b->job);
    ferry_plan_destroy(p);
    if (rc < 0) { batch_free(b); return rc; }
    if (info) *info = b->info;
    *out = b;
    return 0;
}

/* The header of file i differs from the first's: the same array stored
 * otherwise is read again from its own offset; another array is an error. */
static int64_t fix_up(ferry_npy_batch *b, size_t i) {
    ferry_npy_info mine;
    uint64_t off;
    ferry_dataset *ds;
    int rc = describe(b->ctx, b->paths[i], &mine, &off, &ds);
    if (rc < 0) return rc;
    if (!same_array(&mine, &b->info)) {
        char a[256], c[256];
        shape_text(&mine, a, sizeof a);
        shape_text(&b->info, c, sizeof c);
        ferry_dataset_close(ds);
        return ferry_seterr(FERRY_EFORMAT, "%s: npy array %s%s differs from the batch's first file %s: %s%s", b->paths[i], a,
                            mine.fortran_order ? " in Fortran order" : "", b->paths[0], c,
                            b->info.fortran_order ? " in Fortran order" : "");
    }
    ferry_buf sub = b->dst;
    sub.ptr = (uint8_t *)sub.ptr + i * b->stride;
    sub.size = b->info.nbytes;
    ferry_plan *p;
    if ((rc = ferry_plan_create(&p)) < 0) { ferry_dataset_close(ds); return rc; }
    int64_t r = ferry_dataset_plan_read(ds, 0, NULL, sub,
                                        (b->flags & FERRY_NATIVE) | (b->info.fortran_order ? FERRY_STORED_ORDER : 0), p);
    ferry_run_opts ro = {FERRY_PATH_AUTO, 0, b->flags & FERRY_REREAD, FERRY_DECODE_AUTO};
    if (r >= 0) r = ferry_run(b->ctx, p, &ro);
    ferry_plan_destroy(p);
    ferry_dataset_close(ds);
    return r;
}

int64_t ferry_npy_batch_wait(ferry_npy_batch *b) {
    if (!b) return ferry_seterr(FERRY_EINVAL, "ferry_npy_batch_wait: NULL batch");
    if (b->waited) return b->result < 0 ? ferry_seterr((int)b->result, "ferry_npy_batch_wait: already waited for (failed)")
                                        : b->result;
    b->waited = 1;
    int64_t r = ferry_job_wait(b->job, -1);
    ferry_job_destroy(b->job);
    b->job = NULL;
    if (r < 0) return b->result = r;
    /* every file, the first included (it may have been replaced since
     * submit), against the header parsed at submit */
    for (size_t i = 0; i < b->n; i++) {
        if (!memcmp(b->hdrs + i * b->hlen, b->hdr0, b->hlen)) continue;
        int64_t f = fix_up(b, i);
        if (f < 0) return b->result = f;
    }
    return b->result = (int64_t)(b->n * b->info.nbytes);
}

void ferry_npy_batch_destroy(ferry_npy_batch *b) {
    if (b && !b->waited && b->job) ferry_job_wait(b->job, -1);
    batch_free(b);
}

int64_t ferry_npy_read_many(ferry_ctx *ctx, const char *const *paths, size_t n, ferry_buf dst, uint64_t stride,
                            unsigned flags, ferry_npy_info *info) {
    ferry_npy_batch *b;
    int rc = ferry_npy_batch_submit(ctx, paths, n, dst, stride, flags, info, &b);
    if (rc < 0) return rc;
    int64_t r = ferry_npy_batch_wait(b);
    ferry_npy_batch_destroy(b);
    return r;
}
