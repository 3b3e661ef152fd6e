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
