/* place.c — strided placement and pattern fill in host memory, the device
 * placement walker (host or device source), and the normalisation both use
 * (fewer, longer runs). */
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

/* ---- device placement: one walker for the host -> device copies of the
 * staged paths (exec.c) and the device -> device copies of the GPU decode
 * stage (a decoded chunk's scratch into its box) ------------------------------ */

/* Host src: one copy when the rows are contiguous, else cuMemcpy2DAsync, else
 * (pitches the driver refuses) row by row. */
static int rows_from_host(const ferry_cuda_api *cu, CUstream s, CUdeviceptr dst, int64_t dpitch, const uint8_t *src,
                          int64_t spitch, size_t width, size_t height) {
    if (height == 1 || (spitch == (int64_t)width && dpitch == (int64_t)width)) {
        CUresult r = cu->MemcpyHtoDAsync(dst, src, width * height, s);
        return r ? ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(r)) : 0;
    }
    if (spitch >= (int64_t)width && dpitch >= (int64_t)width) {
        ferry_cu_memcpy2d m;
        memset(&m, 0, sizeof m);
        m.srcMemoryType = FERRY_CU_MEMORYTYPE_HOST;
        m.srcHost = src;
        m.srcPitch = (size_t)spitch;
        m.dstMemoryType = FERRY_CU_MEMORYTYPE_DEVICE;
        m.dstDevice = dst;
        m.dstPitch = (size_t)dpitch;
        m.WidthInBytes = width;
        m.Height = height;
        if (cu->Memcpy2DAsync(&m, s) == 0) return 0;
        /* pitch beyond the driver's limit: fall through to row copies */
    }
    for (size_t r = 0; r < height; r++) {
        CUresult e = cu->MemcpyHtoDAsync(dst + (CUdeviceptr)((int64_t)r * dpitch), src + (int64_t)r * spitch, width, s);
        if (e) return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(e));
    }
    return 0;
}

/* Device src: cuMemcpy2DAsync, row by row where the driver refuses the pitches. */
static int rows_from_device(const ferry_cuda_api *cu, CUstream s, CUdeviceptr dst, int64_t dpitch, CUdeviceptr src,
                            int64_t spitch, size_t width, size_t height) {
    ferry_cu_memcpy2d m;
    memset(&m, 0, sizeof m);
    m.srcMemoryType = FERRY_CU_MEMORYTYPE_DEVICE;
    m.srcDevice = src;
    m.srcPitch = height == 1 ? width : (size_t)spitch;
    m.dstMemoryType = FERRY_CU_MEMORYTYPE_DEVICE;
    m.dstDevice = dst;
    m.dstPitch = height == 1 ? width : (size_t)dpitch;
    m.WidthInBytes = width;
    m.Height = height;
    if (height == 1 || (spitch >= (int64_t)width && dpitch >= (int64_t)width)) {
        CUresult r = cu->Memcpy2DAsync(&m, s);
        if (r == 0) return 0;
        if (height == 1) return ferry_seterr(FERRY_ECUDA, "cuMemcpy2DAsync: %s", ferry_cuda_errstr(r));
    }
    for (size_t y = 0; y < height; y++) {
        m.srcDevice = src + (CUdeviceptr)((int64_t)y * spitch);
        m.dstDevice = dst + (CUdeviceptr)((int64_t)y * dpitch);
        m.srcPitch = m.dstPitch = width;
        m.Height = 1;
        CUresult r = cu->Memcpy2DAsync(&m, s);
        if (r) return ferry_seterr(FERRY_ECUDA, "cuMemcpy2DAsync: %s", ferry_cuda_errstr(r));
    }
    return 0;
}

static int rows(const ferry_cuda_api *cu, CUstream s, CUdeviceptr dst, int64_t dpitch, uint64_t src, int src_dev,
                int64_t spitch, size_t width, size_t height) {
    return src_dev ? rows_from_device(cu, s, dst, dpitch, (CUdeviceptr)src, spitch, width, height)
                   : rows_from_host(cu, s, dst, dpitch, (const uint8_t *)(uintptr_t)src, spitch, width, height);
}

/* The last dimension (a contiguous run) and the one before it form one 2D
 * copy; the dimensions above are walked. */
static int place_dev_rec(const ferry_cuda_api *cu, CUstream s, CUdeviceptr dst, uint64_t src, int src_dev,
                         const ferry_place *p, int k) {
    int last = p->ndim - 1;
    int inner = p->src_stride[last] == (int64_t)p->itemsize && p->dst_stride[last] == (int64_t)p->itemsize;
    int rows_dim = inner ? last - 1 : last;
    if (k == rows_dim || (rows_dim < 0 && k == 0)) {
        size_t width = inner ? p->count[last] * p->itemsize : p->itemsize;
        if (rows_dim < 0) return rows(cu, s, dst, (int64_t)width, src, src_dev, (int64_t)width, width, 1);
        return rows(cu, s, dst, p->dst_stride[rows_dim], src, src_dev, p->src_stride[rows_dim], width, p->count[rows_dim]);
    }
    for (uint64_t i = 0; i < p->count[k]; i++) {
        int rc = place_dev_rec(cu, s, dst + (CUdeviceptr)((int64_t)i * p->dst_stride[k]),
                               src + (uint64_t)((int64_t)i * p->src_stride[k]), src_dev, p, k + 1);
        if (rc < 0) return rc;
    }
    return 0;
}

int ferry_place_device(const ferry_cuda_api *cu, CUstream s, CUdeviceptr dst, uint64_t src, int src_on_device,
                       const ferry_place *place, uint64_t n) {
    if (!place) return rows(cu, s, dst, (int64_t)n, src, src_on_device, (int64_t)n, n, 1);
    for (int k = 0; k < place->ndim; k++) if (place->count[k] == 0) return 0;
    ferry_place p;
    if (ferry_place_normalize(place, &p) == 0) { p.ndim = 1; p.count[0] = 1; p.src_stride[0] = p.dst_stride[0] = p.itemsize; }
    return place_dev_rec(cu, s, dst, src + p.src_offset, src_on_device, &p, 0);
}

/* Whether a placement copies the whole decoded chunk (decoded bytes) to one
 * contiguous run: the GPU decode stage then decodes straight into it. */
int ferry_place_is_contiguous(const ferry_place *place, uint64_t decoded) {
    if (!place) return 1;
    ferry_place p;
    int m = ferry_place_normalize(place, &p);
    if (place->src_offset) return 0;
    uint64_t elems = 1;
    for (int k = 0; k < place->ndim; k++) elems *= place->count[k];
    if (elems * place->itemsize != decoded) return 0;
    return m == 0 || (m == 1 && p.src_stride[0] == (int64_t)p.itemsize && p.dst_stride[0] == (int64_t)p.itemsize);
}
