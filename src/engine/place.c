/* place.c — strided placement and pattern fill in host memory, and the
 * normalisation both the host and the device paths use (fewer, longer runs). */
#include "engine/engine.h"

int ferry_place_normalize(const ferry_place *in, ferry_place *out) {
    *out = *in;
    int n = 0;
    /* drop unit dimensions (their stride never matters) */
    for (int k = 0; k < in->ndim; k++) {
        if (in->count[k] == 1) continue;
        out->count[n] = in->count[k];
        out->src_stride[n] = in->src_stride[k];
        out->dst_stride[n] = in->dst_stride[k];
        n++;
    }
    /* innermost element run as a pseudo-dimension of `itemsize` bytes: merge
     * dims from the inside out while both sides stay contiguous */
    int m = 0;
    for (int k = 0; k < n; k++) {
        if (m > 0) {
            int j = m - 1;
            if (out->src_stride[j] == (int64_t)out->count[k] * out->src_stride[k] &&
                out->dst_stride[j] == (int64_t)out->count[k] * out->dst_stride[k]) {
                out->count[j] *= out->count[k];
                out->src_stride[j] = out->src_stride[k];
                out->dst_stride[j] = out->dst_stride[k];
                continue;
            }
        }
        out->count[m] = out->count[k];
        out->src_stride[m] = out->src_stride[k];
        out->dst_stride[m] = out->dst_stride[k];
        m++;
    }
    out->ndim = m;
    return m;
}

/* Copy with the innermost dimension as one memcpy when it is contiguous. */
static void place_rec(uint8_t *dst, const uint8_t *src, const ferry_place *p, int k) {
    if (k == p->ndim - 1) {
        uint64_t n = p->count[k];
        if (p->src_stride[k] == (int64_t)p->itemsize && p->dst_stride[k] == (int64_t)p->itemsize) {
            memcpy(dst, src, n * p->itemsize);
            return;
        }
        for (uint64_t i = 0; i < n; i++)
            memcpy(dst + (int64_t)i * p->dst_stride[k], src + (int64_t)i * p->src_stride[k], p->itemsize);
        return;
    }
    for (uint64_t i = 0; i < p->count[k]; i++)
        place_rec(dst + (int64_t)i * p->dst_stride[k], src + (int64_t)i * p->src_stride[k], p, k + 1);
}

void ferry_place_host(uint8_t *dst, const uint8_t *src, const ferry_place *in) {
    ferry_place p;
    for (int k = 0; k < in->ndim; k++) if (in->count[k] == 0) return;
    if (ferry_place_normalize(in, &p) == 0) { memcpy(dst, src + p.src_offset, p.itemsize); return; }
    place_rec(dst, src + p.src_offset, &p, 0);
}

static void fill_run(uint8_t *dst, const uint8_t *val, unsigned size, uint64_t n) {
    if (size == 1) { memset(dst, val[0], n); return; }
    /* write one element, then double the filled prefix */
    if (n == 0) return;
    memcpy(dst, val, size);
    uint64_t done = size, total = n * size;
    while (done < total) {
        uint64_t c = done < total - done ? done : total - done;
        memcpy(dst + done, dst, c);
        done += c;
    }
}

static void fill_rec(uint8_t *dst, const uint8_t *val, const ferry_place *p, int k) {
    if (k == p->ndim - 1) {
        if (p->dst_stride[k] == (int64_t)p->itemsize) { fill_run(dst, val, p->itemsize, p->count[k]); return; }
        for (uint64_t i = 0; i < p->count[k]; i++) memcpy(dst + (int64_t)i * p->dst_stride[k], val, p->itemsize);
        return;
    }
    for (uint64_t i = 0; i < p->count[k]; i++) fill_rec(dst + (int64_t)i * p->dst_stride[k], val, p, k + 1);
}

void ferry_fill_host(uint8_t *dst, const uint8_t *val, unsigned size, const ferry_place *in, uint64_t bytes) {
    if (!in) { fill_run(dst, val, 1, bytes); return; }
    ferry_place p = *in;
    for (int k = 0; k < in->ndim; k++) if (in->count[k] == 0) return;
    /* src strides are meaningless for fills: make them equal to dst so dims merge */
    for (int k = 0; k < in->ndim; k++) p.src_stride[k] = p.dst_stride[k];
    ferry_place q;
    if (ferry_place_normalize(&p, &q) == 0) { memcpy(dst, val, size); return; }
    fill_rec(dst, val, &q, 0);
}
