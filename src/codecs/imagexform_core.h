/* imagexform_core.h — the arithmetic of the image transform, shared by the
 * library's CPU path (imagexform.c) and the stand-in CUDA driver's run of
 * the kernel (tests/cudasim), so both are one code: static inline, needing
 * nothing from the library. src/cuda/kernels.cu ferry_image_xform_batch is
 * the same arithmetic with explicit round-to-nearest intrinsics. Internal. */
#ifndef FERRY_CODECS_IMAGEXFORM_CORE_H
#define FERRY_CODECS_IMAGEXFORM_CORE_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* the most taps one output element reads per axis: a downscale of up to 500x */
#define FERRY_IMG_MAX_TAPS 1024

/* element types of the output (the kernel's `dt`) */
enum { FERRY_IMG_U8 = 0, FERRY_IMG_F32 = 1, FERRY_IMG_F16 = 2, FERRY_IMG_BF16 = 3 };

/* ---- conversions ---------------------------------------------------------- */
static inline uint16_t ferry_img_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);   /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline uint16_t ferry_img_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);                   /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                  /* overflow: infinity */
    if (a < 0x38800000u) {                                                     /* subnormal half or zero */
        if (a < 0x33000000u) return (uint16_t)sign;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23);                                      /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((a - 0x38000000u) >> 13), rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

/* ---- the resize ------------------------------------------------------------- */
/* Output i of n over source [start, start + len): its window [*lo, *lo + count)
 * and normalised weights (PIL's and torchvision's antialiased triangle filter). */
static inline int ferry_img_taps(uint32_t start, uint32_t len, uint32_t n, uint32_t i, uint32_t *lo, float *wt) {
    double scale = (double)len / (double)n, fscale = scale > 1.0 ? scale : 1.0;
    double support = fscale, inv = 1.0 / fscale;
    double center = (double)start + ((double)i + 0.5) * scale;
    double a = floor(center - support + 0.5), b = floor(center + support + 0.5);
    int64_t xmin = a < (double)start ? (int64_t)start : (int64_t)a;
    int64_t xmax = b > (double)start + len ? (int64_t)start + len : (int64_t)b;
    if (xmax <= xmin) xmax = xmin + 1;   /* never an empty window */
    double w[FERRY_IMG_MAX_TAPS], sum = 0;
    int count = (int)(xmax - xmin);
    for (int k = 0; k < count; k++) {
        double t = ((double)(xmin + k) - center + 0.5) * inv;
        t = t < 0 ? -t : t;
        w[k] = t < 1.0 ? 1.0 - t : 0.0;
        sum += w[k];
    }
    for (int k = 0; k < count; k++) wt[k] = (float)(sum > 0 ? w[k] / sum : 1.0 / count);
    *lo = (uint32_t)xmin;
    return count;
}

static inline void ferry_img_store(void *dst, size_t idx, float u8, int dt, float mean, float stdv) {
    if (dt == FERRY_IMG_U8) { ((uint8_t *)dst)[idx] = (uint8_t)u8; return; }
    float v = u8 / 255.0f;
    if (stdv != 0.0f) v = (v - mean) / stdv;
    if (dt == FERRY_IMG_F32) ((float *)dst)[idx] = v;
    else if (dt == FERRY_IMG_F16) ((uint16_t *)dst)[idx] = ferry_img_f16(v);
    else ((uint16_t *)dst)[idx] = ferry_img_bf16(v);
}

/* One sample: the box (by, bx, bh, bw) of an h x w x ch uint8 image to oh x
 * ow in layout 0 (CHW) or 1 (HWC), flipped left-right when flip, where src
 * holds a part of the image from pixel (oy0, ox0) on, rows `stride` bytes apart
 * (the whole image: oy0 = ox0 = 0). The box keeps the image's coordinates, so
 * the weights are those of the whole image's transform whatever part of it
 * src holds. The caller has checked the box and sizes and that src covers
 * the box. 0, or -1 when scratch memory cannot be had. */
static inline int ferry_img_transform_core_at(const uint8_t *src, size_t stride, uint32_t oy0, uint32_t ox0, uint32_t by,
                                              uint32_t bx, uint32_t bh, uint32_t bw, int flip, uint32_t oh,
                                              uint32_t ow, uint32_t ch, int layout, int dt, const float *mean,
                                              const float *stdv, void *dst) {
    uint32_t *xlo = (uint32_t *)malloc(sizeof *xlo * ow);
    int *xn = (int *)malloc(sizeof *xn * ow);
    float *xw = (float *)malloc(sizeof *xw * (size_t)ow * FERRY_IMG_MAX_TAPS);
    /* the row sums of every source row of the box, reused across output rows */
    float *rows = (float *)malloc(sizeof *rows * (size_t)bh * ow * ch);
    if (!xlo || !xn || !xw || !rows) {
        free(xlo); free(xn); free(xw); free(rows);
        return -1;
    }
    for (uint32_t ox = 0; ox < ow; ox++) xn[ox] = ferry_img_taps(bx, bw, ow, ox, &xlo[ox], xw + (size_t)ox * FERRY_IMG_MAX_TAPS);
    for (uint32_t y = 0; y < bh; y++) {
        const uint8_t *row = src + (size_t)(by - oy0 + y) * stride;
        for (uint32_t ox = 0; ox < ow; ox++) {
            const float *wt = xw + (size_t)ox * FERRY_IMG_MAX_TAPS;
            const uint8_t *px = row + (size_t)(xlo[ox] - ox0) * ch;
            for (uint32_t c = 0; c < ch; c++) {
                float acc = 0.0f;
                for (int k = 0; k < xn[ox]; k++) acc = acc + wt[k] * (float)px[(size_t)k * ch + c];
                rows[((size_t)y * ow + ox) * ch + c] = acc;
            }
        }
    }
    float yw[FERRY_IMG_MAX_TAPS];
    for (uint32_t oy = 0; oy < oh; oy++) {
        uint32_t ylo;
        int yn = ferry_img_taps(by, bh, oh, oy, &ylo, yw);
        for (uint32_t ox = 0; ox < ow; ox++) {
            uint32_t dx = flip ? ow - 1 - ox : ox;
            for (uint32_t c = 0; c < ch; c++) {
                float acc = 0.0f;
                for (int k = 0; k < yn; k++) acc = acc + yw[k] * rows[((size_t)(ylo - by + k) * ow + ox) * ch + c];
                float u8 = floorf(acc + 0.5f);
                u8 = u8 < 0.0f ? 0.0f : u8 > 255.0f ? 255.0f : u8;
                size_t idx = layout == 0 ? ((size_t)c * oh + oy) * ow + dx : ((size_t)oy * ow + dx) * ch + c;
                ferry_img_store(dst, idx, u8, dt, mean[c], stdv[c]);
            }
        }
    }
    free(xlo); free(xn); free(xw); free(rows);
    return 0;
}

/* The same over a whole image (rows `stride` bytes apart). */
static inline int ferry_img_transform_core(const uint8_t *src, size_t stride, uint32_t by, uint32_t bx, uint32_t bh,
                                           uint32_t bw, int flip, uint32_t oh, uint32_t ow, uint32_t ch, int layout,
                                           int dt, const float *mean, const float *stdv, void *dst) {
    return ferry_img_transform_core_at(src, stride, 0, 0, by, bx, bh, bw, flip, oh, ow, ch, layout, dt, mean, stdv,
                                       dst);
}
#endif
