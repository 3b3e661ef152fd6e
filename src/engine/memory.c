/* memory.c — device allocations, synchronous copies and pinned host memory
 * for tests, benchmarks and the Python module. */
#include "engine/engine.h"
#include <stdlib.h>

static int need_cuda(const ferry_cuda_api **cu) {
    const char *why;
    *cu = ferry_cuda_load(&why);
    return *cu ? 0 : ferry_seterr(FERRY_ENOCUDA, "%s", why);
}

/* Each helper runs on the caller's thread and hands its CUDA context back
 * unchanged (ferry_cuda_current/restore). */
static int cuda_malloc(int device, size_t size, uintptr_t *out) {
    const ferry_cuda_api *cu;
    int rc = need_cuda(&cu);
    if (rc < 0) return rc;
    if ((rc = ferry_cuda_use_device(device < 0 ? 0 : device)) < 0) return rc;
    CUdeviceptr p = 0;
    CUresult r = cu->MemAlloc(&p, size ? size : 1);
    if (r) return ferry_seterr(FERRY_ECUDA, "cuMemAlloc(%zu bytes) on device %d: %s", size, device, ferry_cuda_errstr(r));
    *out = (uintptr_t)p;
    return 0;
}

int ferry_cuda_malloc(ferry_ctx *ctx, int device, size_t size, uintptr_t *out) {
    CUcontext saved = ferry_cuda_current();
    int rc = cuda_malloc(device, size, out);
    ferry_cuda_restore(saved);
    return rc;
}

static int cuda_free(uintptr_t p) {
    const ferry_cuda_api *cu;
    int rc = need_cuda(&cu);
    if (rc < 0) return rc;
    int d = ferry_cuda_pointer_device(p);
    if (d < 0) return d;
    if ((rc = ferry_cuda_use_device(d)) < 0) return rc;
    CUresult r = cu->MemFree((CUdeviceptr)p);
    return r ? ferry_seterr(FERRY_ECUDA, "cuMemFree: %s", ferry_cuda_errstr(r)) : 0;
}

int ferry_cuda_free(ferry_ctx *ctx, uintptr_t p) {
    CUcontext saved = ferry_cuda_current();
    int rc = cuda_free(p);
    ferry_cuda_restore(saved);
    return rc;
}

int ferry_cuda_device_of(ferry_ctx *ctx, uintptr_t ptr) { return ferry_cuda_pointer_device(ptr); }

static int cuda_memcpy(ferry_buf dst, ferry_buf src, size_t n);

int ferry_memcpy(ferry_ctx *ctx, ferry_buf dst, ferry_buf src, size_t n) {
    if (n > dst.size || n > src.size) return ferry_seterr(FERRY_EINVAL, "ferry_memcpy: %zu bytes exceed a buffer", n);
    if (dst.kind == FERRY_MEM_HOST && src.kind == FERRY_MEM_HOST) { memmove(dst.ptr, src.ptr, n); return 0; }
    CUcontext saved = ferry_cuda_current();
    int rc = cuda_memcpy(dst, src, n);
    ferry_cuda_restore(saved);
    return rc;
}

static int cuda_memcpy(ferry_buf dst, ferry_buf src, size_t n) {
    const ferry_cuda_api *cu;
    int rc = need_cuda(&cu);
    if (rc < 0) return rc;
    int d = dst.kind == FERRY_MEM_CUDA ? dst.device : src.device;
    if (d < 0) d = ferry_cuda_pointer_device((uintptr_t)(dst.kind == FERRY_MEM_CUDA ? dst.ptr : src.ptr));
    if (d < 0) return d;
    if ((rc = ferry_cuda_use_device(d)) < 0) return rc;
    /* unified addressing: cuMemcpy takes host and device pointers alike */
    CUresult r = cu->Memcpy((CUdeviceptr)(uintptr_t)dst.ptr, (CUdeviceptr)(uintptr_t)src.ptr, n);
    return r ? ferry_seterr(FERRY_ECUDA, "cuMemcpy: %s", ferry_cuda_errstr(r)) : 0;
}

int ferry_pinned_alloc(ferry_ctx *ctx, size_t size, void **out) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    CUcontext saved = ferry_cuda_current();
    /* portable pinned memory: any context will do, so the thread's own (in
     * practice torch's or cupy's primary context, which lives as long as the
     * process; it also spares rank 1 a context on device 0); device 0's primary
     * context only when the thread has none */
    int ok = cu && (saved || ferry_cuda_use_device(0) == 0) &&
             cu->MemHostAlloc(out, size ? size : 1, FERRY_CU_MEMHOSTALLOC_PORTABLE) == 0;
    ferry_cuda_restore(saved);
    if (ok) return 0;
    if (posix_memalign(out, FERRY_ALIGN, size ? size : 1) != 0) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    return 0;
}

void ferry_pinned_free(ferry_ctx *ctx, void *p) {
    if (!p) return;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    unsigned int mt = 0;
    /* cuMemHostAlloc'd memory is known to the driver; malloc'd memory is not */
    if (cu && cu->PointerGetAttribute(&mt, FERRY_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p) == 0 &&
        mt == FERRY_CU_MEMORYTYPE_HOST) {
        cu->MemFreeHost(p);
        return;
    }
    free(p);
}
