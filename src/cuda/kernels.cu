// kernels.cu — the few GPU kernels ferry needs, compiled by nvcc to a fatbin
// that is embedded in the library and loaded with cuModuleLoadData.
// extern "C" keeps the names unmangled for cuModuleGetFunction.
#include <stdint.h>

// Reverse the bytes of each element in place (big-endian netCDF data, Zarr
// ">" arrays). Grid-stride loops: any n with a bounded grid.
extern "C" __global__ void ferry_bswap2(uint16_t *p, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = (uint16_t)((p[i] >> 8) | (p[i] << 8));
}
extern "C" __global__ void ferry_bswap4(uint32_t *p, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = __byte_perm(p[i], 0, 0x0123);
}
extern "C" __global__ void ferry_bswap8(uint64_t *p, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        uint64_t v = p[i];
        uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
        p[i] = ((uint64_t)__byte_perm(lo, 0, 0x0123) << 32) | __byte_perm(hi, 0, 0x0123);
    }
}
extern "C" __global__ void ferry_bswap16(uint64_t *p, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        uint64_t a = p[2 * i], b = p[2 * i + 1];
        uint32_t alo = (uint32_t)a, ahi = (uint32_t)(a >> 32), blo = (uint32_t)b, bhi = (uint32_t)(b >> 32);
        p[2 * i] = ((uint64_t)__byte_perm(blo, 0, 0x0123) << 32) | __byte_perm(bhi, 0, 0x0123);
        p[2 * i + 1] = ((uint64_t)__byte_perm(alo, 0, 0x0123) << 32) | __byte_perm(ahi, 0, 0x0123);
    }
}

// Scatter packed records: entry i copies len bytes from packed + src to the
// device address dst (ferry_scatter_entry in cuda.h). One block per entry
// (grid-stride over entries); 16-byte words where source and destination
// share their alignment modulo 16, else 4-byte words, else bytes. The packed
// buffer is a device copy of one staging buffer: the many small runs of a
// batch whose rows land in arbitrary order cost one host-to-device copy and
// this one launch instead of one copy each.
struct ferry_scatter_entry { unsigned long long src, dst, len; };

extern "C" __global__ void ferry_scatter(const uint8_t *packed, const ferry_scatter_entry *tab,
                                         unsigned long long n) {
    for (unsigned long long i = blockIdx.x; i < n; i += gridDim.x) {
        const uint8_t *s = packed + tab[i].src;
        uint8_t *d = (uint8_t *)tab[i].dst;
        unsigned long long len = tab[i].len;
        unsigned long long head = 0;
        unsigned w = ((uintptr_t)s ^ (uintptr_t)d) & 15 ? (((uintptr_t)s ^ (uintptr_t)d) & 3 ? 1 : 4) : 16;
        if (w > 1) {
            head = (w - ((uintptr_t)d & (w - 1))) & (w - 1);
            if (head > len) head = len;
        }
        for (unsigned long long k = threadIdx.x; k < head; k += blockDim.x) d[k] = s[k];
        unsigned long long body = w > 1 ? (len - head) / w : 0;
        if (w == 16) {
            const uint4 *s4 = (const uint4 *)(s + head);
            uint4 *d4 = (uint4 *)(d + head);
            for (unsigned long long k = threadIdx.x; k < body; k += blockDim.x) d4[k] = s4[k];
        } else if (w == 4) {
            const uint32_t *s4 = (const uint32_t *)(s + head);
            uint32_t *d4 = (uint32_t *)(d + head);
            for (unsigned long long k = threadIdx.x; k < body; k += blockDim.x) d4[k] = s4[k];
        }
        for (unsigned long long k = head + body * w + threadIdx.x; k < len; k += blockDim.x) d[k] = s[k];
    }
}

// Adler-32 of each of n device buffers (ptrs[i], sizes[i] bytes) into out[i]:
// the zlib trailer check of chunks nvCOMP inflated, computed where the bytes
// are. One block per buffer (grid-stride over buffers). Each thread sums a
// contiguous segment: with b_k the byte at position k of a buffer of len
// bytes, A = 1 + sum b_k and B = len + sum (len - k) b_k (mod 65521).
extern "C" __global__ void ferry_adler32_batch(const unsigned char *const *ptrs, const unsigned long long *sizes,
                                               unsigned *out, unsigned long long n) {
    __shared__ unsigned long long s1[256], s2[256];
    const unsigned M = 65521u;
    for (unsigned long long c = blockIdx.x; c < n; c += gridDim.x) {
        const unsigned char *p = ptrs[c];
        unsigned long long len = sizes[c];
        unsigned long long seg = (len + blockDim.x - 1) / blockDim.x;
        unsigned long long lo = threadIdx.x * seg, hi = lo + seg < len ? lo + seg : len;
        unsigned long long a = 0, b = 0;
        unsigned w = (unsigned)((len - (lo < len ? lo : len)) % M);   // (len - k) mod M for k = lo
        for (unsigned long long k = lo; k < hi; k++) {
            unsigned v = p[k];
            a += v;
            b += (unsigned long long)w * v;   // < 2^24 per step: no overflow before 2^40 steps
            w = w ? w - 1 : M - 1;
        }
        s1[threadIdx.x] = a % M;
        s2[threadIdx.x] = b % M;
        __syncthreads();
        for (unsigned h = blockDim.x / 2; h > 0; h /= 2) {
            if (threadIdx.x < h) {
                s1[threadIdx.x] = (s1[threadIdx.x] + s1[threadIdx.x + h]) % M;
                s2[threadIdx.x] = (s2[threadIdx.x] + s2[threadIdx.x + h]) % M;
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            unsigned A = (unsigned)((1 + s1[0]) % M), B = (unsigned)((len % M + s2[0]) % M);
            out[c] = (B << 16) | A;
        }
        __syncthreads();
    }
}

// Undo HDF5's / blosc's byte shuffle, out of place, for `count` buffers at
// once: desc[4 i .. 4 i + 3] = (in, out, n, size). n bytes of elements of
// `size` bytes were stored as `size` planes of n / size bytes; the bytes past
// the last whole element are copied as they are. size 1 is a plain copy
// (blosc's raw streams). One block per buffer (grid-stride over buffers),
// threads over its output bytes.
// Undo blosc's bitshuffle, out of place, for `count` blocks: desc as above.
// Byte j of element i, bit k, is bit i % 8 of byte i / 8 of row 8 j + k, each
// row nel / 8 bytes (nel: the block's elements, rounded down to 8); bytes past
// nel elements are copied. One thread per output byte.
extern "C" __global__ void ferry_bitunshuffle_batch(const unsigned long long *desc, unsigned long long count) {
    for (unsigned long long d = blockIdx.x; d < count; d += gridDim.x) {
        const unsigned char *in = (const unsigned char *)desc[4 * d];
        unsigned char *out = (unsigned char *)desc[4 * d + 1];
        unsigned long long n = desc[4 * d + 2], size = desc[4 * d + 3];
        unsigned long long nel = (n / size) & ~7ull, rowbytes = nel / 8, body = nel * size;
        for (unsigned long long o = threadIdx.x; o < n; o += blockDim.x) {
            if (o >= body) { out[o] = in[o]; continue; }
            unsigned long long i = o / size, j = o % size;
            const unsigned char *row = in + 8 * j * rowbytes + i / 8;
            unsigned shift = (unsigned)(i % 8), v = 0;
            for (unsigned k = 0; k < 8; k++) v |= ((row[k * rowbytes] >> shift) & 1u) << k;
            out[o] = (unsigned char)v;
        }
    }
}

extern "C" __global__ void ferry_unshuffle_batch(const unsigned long long *desc, unsigned long long count) {
    for (unsigned long long d = blockIdx.x; d < count; d += gridDim.x) {
        const unsigned char *in = (const unsigned char *)desc[4 * d];
        unsigned char *out = (unsigned char *)desc[4 * d + 1];
        unsigned long long n = desc[4 * d + 2], size = desc[4 * d + 3];
        unsigned long long nel = n / size, body = nel * size;
        for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x)
            out[i] = i < body ? in[(i % size) * nel + i / size] : in[i];
    }
}

// Place decoded chunks into their boxes of the destination (the tile
// scatter), `count` at once: desc[16 i ..] = (src, dst, width, rows0, rows1,
// rows2, sstride0..2, dstride0..2): rows0 x rows1 x rows2 runs of `width`
// bytes, run (a, b, c) from src + a ss0 + b ss1 + c ss2 to dst + a ds0 + ...
// (strides signed). One block per chunk, threads over each run's bytes.
extern "C" __global__ void ferry_place_batch(const unsigned long long *desc, unsigned long long count) {
    for (unsigned long long d = blockIdx.x; d < count; d += gridDim.x) {
        const unsigned long long *q = desc + 16 * d;
        const unsigned char *src = (const unsigned char *)q[0];
        unsigned char *dst = (unsigned char *)q[1];
        unsigned long long width = q[2], r0 = q[3], r1 = q[4], r2 = q[5];
        long long ss0 = (long long)q[6], ss1 = (long long)q[7], ss2 = (long long)q[8];
        long long ds0 = (long long)q[9], ds1 = (long long)q[10], ds2 = (long long)q[11];
        unsigned long long rows = r0 * r1 * r2;
        for (unsigned long long row = 0; row < rows; row++) {
            unsigned long long c = row % r2, b = (row / r2) % r1, a = row / (r1 * r2);
            const unsigned char *s = src + (long long)a * ss0 + (long long)b * ss1 + (long long)c * ss2;
            unsigned char *t = dst + (long long)a * ds0 + (long long)b * ds1 + (long long)c * ds2;
            for (unsigned long long x = threadIdx.x; x < width; x += blockDim.x) t[x] = s[x];
        }
    }
}

// Image transform after decode (src/codecs/imagexform.c is its CPU twin and
// says why): each thread makes one output pixel of one sample, every channel.
// desc: 8 u64 per sample (src, dst, src row stride, h << 32 | w,
// box y << 32 | x, box h << 32 | w, flip, unused). dt: 0 uint8, 1 float32,
// 2 float16, 3 bfloat16. Every floating-point operation is an explicit
// round-to-nearest intrinsic, so nothing is fused and the CPU twin (built with
// -ffp-contract=off) gets the same bits.
#define FERRY_IMG_MAX_TAPS 1024

__device__ static int ferry_img_taps(unsigned start, unsigned len, unsigned n, unsigned i, unsigned *lo,
                                     float *wt, int store) {
    double scale = __ddiv_rn((double)len, (double)n), fscale = scale > 1.0 ? scale : 1.0;
    double support = fscale, inv = __ddiv_rn(1.0, fscale);
    double center = __dadd_rn((double)start, __dmul_rn(__dadd_rn((double)i, 0.5), scale));
    double a = floor(__dadd_rn(__dsub_rn(center, support), 0.5)), b = floor(__dadd_rn(__dadd_rn(center, support), 0.5));
    long long xmin = a < (double)start ? (long long)start : (long long)a;
    long long end = (long long)start + len;
    long long xmax = b > (double)end ? end : (long long)b;
    if (xmax <= xmin) xmax = xmin + 1;
    int count = (int)(xmax - xmin);
    double sum = 0;
    for (int k = 0; k < count; k++) {
        double t = __dmul_rn(__dadd_rn(__dsub_rn((double)(xmin + k), center), 0.5), inv);
        t = t < 0 ? -t : t;
        sum = __dadd_rn(sum, t < 1.0 ? __dsub_rn(1.0, t) : 0.0);
    }
    if (store)
        for (int k = 0; k < count; k++) {
            double t = __dmul_rn(__dadd_rn(__dsub_rn((double)(xmin + k), center), 0.5), inv);
            t = t < 0 ? -t : t;
            double w = t < 1.0 ? __dsub_rn(1.0, t) : 0.0;
            wt[k] = __double2float_rn(sum > 0 ? __ddiv_rn(w, sum) : __ddiv_rn(1.0, (double)count));
        }
    *lo = (unsigned)xmin;
    return count;
}

__device__ static unsigned short ferry_img_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (unsigned short)(u >> 16);
}

__device__ static unsigned short ferry_img_f16(float f) {
    unsigned u = __float_as_uint(f);
    unsigned sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        if (a < 0x33000000u) return (unsigned short)sign;
        unsigned m = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23);
        unsigned r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (unsigned short)(sign | r);
    }
    unsigned r = (a - 0x38000000u) >> 13, rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return (unsigned short)(sign | r);
}

extern "C" __global__ void ferry_image_xform_batch(const unsigned long long *desc, unsigned long long count,
                                                   unsigned oh, unsigned ow, unsigned ch, unsigned layout,
                                                   unsigned dt, float m0, float m1, float m2, float s0,
                                                   float s1, float s2) {
    unsigned long long pix = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (pix >= (unsigned long long)oh * ow) return;
    unsigned oy = (unsigned)(pix / ow), ox = (unsigned)(pix % ow);
    float mean[3] = {m0, m1, m2}, stdv[3] = {s0, s1, s2};
    float xw[FERRY_IMG_MAX_TAPS];
    for (unsigned long long n = blockIdx.y; n < count; n += gridDim.y) {
        const unsigned long long *d = desc + 8 * n;
        const unsigned char *src = (const unsigned char *)d[0];
        unsigned long long stride = d[2];
        unsigned by = (unsigned)(d[4] >> 32), bx = (unsigned)d[4], bh = (unsigned)(d[5] >> 32), bw = (unsigned)d[5];
        int flip = (int)d[6];
        unsigned xlo, ylo;
        int xn = ferry_img_taps(bx, bw, ow, ox, &xlo, xw, 1);
        int yn = ferry_img_taps(by, bh, oh, oy, &ylo, xw, 0);
        float acc[3] = {0.0f, 0.0f, 0.0f};
        // the vertical weights one row at a time: the same arithmetic as the CPU's taps()
        double scale = __ddiv_rn((double)bh, (double)oh), fscale = scale > 1.0 ? scale : 1.0;
        double inv = __ddiv_rn(1.0, fscale);
        double center = __dadd_rn((double)by, __dmul_rn(__dadd_rn((double)oy, 0.5), scale));
        double sum = 0;
        for (int j = 0; j < yn; j++) {
            double t = __dmul_rn(__dadd_rn(__dsub_rn((double)(ylo + j), center), 0.5), inv);
            t = t < 0 ? -t : t;
            sum = __dadd_rn(sum, t < 1.0 ? __dsub_rn(1.0, t) : 0.0);
        }
        for (int k = 0; k < yn; k++) {
            double t = __dmul_rn(__dadd_rn(__dsub_rn((double)(ylo + k), center), 0.5), inv);
            t = t < 0 ? -t : t;
            double w = t < 1.0 ? __dsub_rn(1.0, t) : 0.0;
            float yw = __double2float_rn(sum > 0 ? __ddiv_rn(w, sum) : __ddiv_rn(1.0, (double)yn));
            const unsigned char *row = src + (unsigned long long)(ylo + k) * stride;
            for (unsigned c = 0; c < ch; c++) {
                float r = 0.0f;
                for (int j = 0; j < xn; j++)
                    r = __fadd_rn(r, __fmul_rn(xw[j], (float)row[(unsigned long long)(xlo + j) * ch + c]));
                acc[c] = __fadd_rn(acc[c], __fmul_rn(yw, r));
            }
        }
        unsigned dx = flip ? ow - 1 - ox : ox;
        for (unsigned c = 0; c < ch; c++) {
            float u8 = floorf(__fadd_rn(acc[c], 0.5f));
            u8 = u8 < 0.0f ? 0.0f : u8 > 255.0f ? 255.0f : u8;
            unsigned long long idx = layout == 0 ? ((unsigned long long)c * oh + oy) * ow + dx
                                                 : ((unsigned long long)oy * ow + dx) * ch + c;
            if (dt == 0) { ((unsigned char *)d[1])[idx] = (unsigned char)u8; continue; }
            float v = __fdiv_rn(u8, 255.0f);
            if (stdv[c] != 0.0f) v = __fdiv_rn(__fsub_rn(v, mean[c]), stdv[c]);
            if (dt == 1) ((float *)d[1])[idx] = v;
            else if (dt == 2) ((unsigned short *)d[1])[idx] = ferry_img_f16(v);
            else ((unsigned short *)d[1])[idx] = ferry_img_bf16(v);
        }
    }
}
