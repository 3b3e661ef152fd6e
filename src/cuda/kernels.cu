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
