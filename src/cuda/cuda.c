/* cuda.c — dlopen the CUDA driver once, fill the function table, keep one
 * retained primary context per device, and load the embedded kernels. */
#include "cuda/cuda.h"
#include "common.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>

#define MAX_DEVICES 64

static ferry_cuda_api api_;
static const ferry_cuda_api *loaded_;
static const char *why_ = "";
static pthread_once_t once_ = PTHREAD_ONCE_INIT;
static pthread_mutex_t dev_lock_ = PTHREAD_MUTEX_INITIALIZER;
static CUcontext dev_ctx_[MAX_DEVICES];
static CUmodule dev_mod_[MAX_DEVICES];
static CUfunction dev_swap_[MAX_DEVICES][5];   /* by log2(size): 2, 4, 8, 16 */
static CUfunction dev_adler_[MAX_DEVICES], dev_unshuffle_[MAX_DEVICES], dev_bitunshuffle_[MAX_DEVICES], dev_place_[MAX_DEVICES];
static int dev_mod_state_[MAX_DEVICES];        /* 0 untried, 1 ok, -1 failed */
static CUfunction dev_imgxform_[MAX_DEVICES];   /* NULL: a fatbin without ferry_image_xform_batch */
static CUfunction dev_scatter_[MAX_DEVICES];   /* NULL: a fatbin without ferry_scatter */

static void *sym(void *h, const char *name, int *missing) {
    void *p = dlsym(h, name);
    if (!p) *missing = 1;
    return p;
}

static void load_once(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { why_ = "libcuda.so.1 not found (no NVIDIA driver)"; return; }
    int miss = 0;
#define S(field, name) *(void **)&api_.field = sym(h, name, &miss)
    S(Init, "cuInit");
    S(DeviceGetCount, "cuDeviceGetCount");
    S(DeviceGet, "cuDeviceGet");
    S(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    S(CtxSetCurrent, "cuCtxSetCurrent");
    S(CtxGetCurrent, "cuCtxGetCurrent");
    S(StreamCreate, "cuStreamCreate");
    S(StreamDestroy, "cuStreamDestroy_v2");
    S(StreamSynchronize, "cuStreamSynchronize");
    S(StreamWaitEvent, "cuStreamWaitEvent");
    S(EventCreate, "cuEventCreate");
    S(EventDestroy, "cuEventDestroy_v2");
    S(EventRecord, "cuEventRecord");
    S(EventSynchronize, "cuEventSynchronize");
    S(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    S(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    S(Memcpy2DAsync, "cuMemcpy2DAsync_v2");
    S(Memcpy, "cuMemcpy");
    S(MemHostAlloc, "cuMemHostAlloc");
    S(MemFreeHost, "cuMemFreeHost");
    S(MemAlloc, "cuMemAlloc_v2");
    S(MemFree, "cuMemFree_v2");
    S(PointerGetAttribute, "cuPointerGetAttribute");
    S(GetErrorString, "cuGetErrorString");
    S(ModuleLoadData, "cuModuleLoadData");
    S(ModuleGetFunction, "cuModuleGetFunction");
    S(LaunchKernel, "cuLaunchKernel");
#undef S
    if (miss) { why_ = "libcuda.so.1 lacks a required function (driver too old)"; return; }
    /* optional: NULL where the driver lacks them, and a driver without them
     * must not make the GPU unusable. StreamGetCtx, MemGetInfo and EventQuery
     * have callers that do without them; DriverGetVersion,
     * DevicePrimaryCtxRelease and MemHost(Un)Register have none today. */
    *(void **)&api_.StreamGetCtx = dlsym(h, "cuStreamGetCtx");
    *(void **)&api_.MemGetInfo = dlsym(h, "cuMemGetInfo_v2");
    *(void **)&api_.DriverGetVersion = dlsym(h, "cuDriverGetVersion");
    *(void **)&api_.DevicePrimaryCtxRelease = dlsym(h, "cuDevicePrimaryCtxRelease_v2");
    *(void **)&api_.EventQuery = dlsym(h, "cuEventQuery");
    *(void **)&api_.MemHostRegister = dlsym(h, "cuMemHostRegister_v2");
    *(void **)&api_.MemHostUnregister = dlsym(h, "cuMemHostUnregister");
    CUresult r = api_.Init(0);
    if (r != 0) {
        static char buf[160];
        snprintf(buf, sizeof buf, "cuInit failed: %s", ferry_cuda_errstr(r));
        why_ = buf;
        return;
    }
    int n = 0;
    if (api_.DeviceGetCount(&n) != 0 || n <= 0) { why_ = "no CUDA device"; return; }
    loaded_ = &api_;
}

const ferry_cuda_api *ferry_cuda_load(const char **why) {
    pthread_once(&once_, load_once);
    if (why) *why = loaded_ ? "" : why_;
    return loaded_;
}

const char *ferry_cuda_errstr(CUresult r) {
    const char *s = NULL;
    if (api_.GetErrorString && api_.GetErrorString(r, &s) == 0 && s) return s;
    return "unknown CUDA error";
}

static int retain(int dev) {
    if (dev < 0 || dev >= MAX_DEVICES) return ferry_seterr(FERRY_EINVAL, "CUDA device %d out of range", dev);
    pthread_mutex_lock(&dev_lock_);
    int rc = 0;
    if (!dev_ctx_[dev]) {
        CUdevice d;
        CUresult r = api_.DeviceGet(&d, dev);
        if (r == 0) r = api_.DevicePrimaryCtxRetain(&dev_ctx_[dev], d);
        if (r != 0) rc = ferry_seterr(FERRY_ECUDA, "CUDA device %d: %s", dev, ferry_cuda_errstr(r));
    }
    pthread_mutex_unlock(&dev_lock_);
    return rc;
}

int ferry_cuda_use_device(int dev) {
    const char *why;
    if (!ferry_cuda_load(&why)) return ferry_seterr(FERRY_ENOCUDA, "%s", why);
    int rc = retain(dev);
    if (rc < 0) return rc;
    CUcontext cur = NULL;
    api_.CtxGetCurrent(&cur);
    if (cur != dev_ctx_[dev]) {
        CUresult r = api_.CtxSetCurrent(dev_ctx_[dev]);
        if (r != 0) return ferry_seterr(FERRY_ECUDA, "cuCtxSetCurrent(device %d): %s", dev, ferry_cuda_errstr(r));
    }
    return 0;
}

CUcontext ferry_cuda_current(void) {
    CUcontext cur = NULL;
    if (ferry_cuda_load(NULL)) api_.CtxGetCurrent(&cur);
    return cur;
}

void ferry_cuda_restore(CUcontext saved) {
    if (!ferry_cuda_load(NULL)) return;
    CUcontext cur = NULL;
    api_.CtxGetCurrent(&cur);
    if (cur != saved) api_.CtxSetCurrent(saved);
}

int ferry_cuda_pointer_device(uintptr_t ptr) {
    const char *why;
    if (!ferry_cuda_load(&why)) return ferry_seterr(FERRY_ENOCUDA, "%s", why);
    unsigned int mt = 0;
    int ord = -1;
    CUresult r = api_.PointerGetAttribute(&mt, FERRY_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)ptr);
    if (r != 0 || mt != FERRY_CU_MEMORYTYPE_DEVICE)
        return ferry_seterr(FERRY_EINVAL, "pointer 0x%llx is not CUDA device memory", (unsigned long long)ptr);
    r = api_.PointerGetAttribute(&ord, FERRY_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)ptr);
    if (r != 0) return ferry_seterr(FERRY_ECUDA, "cuPointerGetAttribute: %s", ferry_cuda_errstr(r));
    return ord;
}

/* Kernels are loaded into each device's primary context on first use. */
static int load_kernels(int dev) {
    if (dev_mod_state_[dev]) return dev_mod_state_[dev];
    pthread_mutex_lock(&dev_lock_);
    if (!dev_mod_state_[dev]) {
        int ok = -1;
        const void *image = ferry_kernels_image();   /* fatbin, NVRTC's PTX or none: kernels_source.c */
        if (image && api_.ModuleLoadData(&dev_mod_[dev], image) == 0) {
            static const char *names[5] = {NULL, "ferry_bswap2", "ferry_bswap4", "ferry_bswap8", "ferry_bswap16"};
            ok = 1;
            for (int i = 1; i < 5; i++)
                if (api_.ModuleGetFunction(&dev_swap_[dev][i], dev_mod_[dev], names[i]) != 0) ok = -1;
            if (api_.ModuleGetFunction(&dev_scatter_[dev], dev_mod_[dev], "ferry_scatter") != 0) dev_scatter_[dev] = NULL;
            /* the GPU decoder's kernels (gpudecode.c): optional, NULL when absent */
            if (api_.ModuleGetFunction(&dev_adler_[dev], dev_mod_[dev], "ferry_adler32_batch") != 0) dev_adler_[dev] = NULL;
            if (api_.ModuleGetFunction(&dev_unshuffle_[dev], dev_mod_[dev], "ferry_unshuffle_batch") != 0) dev_unshuffle_[dev] = NULL;
            if (api_.ModuleGetFunction(&dev_bitunshuffle_[dev], dev_mod_[dev], "ferry_bitunshuffle_batch") != 0) dev_bitunshuffle_[dev] = NULL;
            if (api_.ModuleGetFunction(&dev_place_[dev], dev_mod_[dev], "ferry_place_batch") != 0) dev_place_[dev] = NULL;
            /* the image transform after decode (codecs/imagexform.h) */
            if (api_.ModuleGetFunction(&dev_imgxform_[dev], dev_mod_[dev], "ferry_image_xform_batch") != 0)
                dev_imgxform_[dev] = NULL;
        }
        dev_mod_state_[dev] = ok;
    }
    pthread_mutex_unlock(&dev_lock_);
    return dev_mod_state_[dev];
}

int ferry_cuda_kernels_ready(int dev) {
    if (dev < 0 || dev >= MAX_DEVICES || !loaded_) return 0;
    return load_kernels(dev) == 1;
}

int ferry_cuda_byteswap(int dev, CUdeviceptr p, size_t n, unsigned size, CUstream stream) {
    int idx = size == 2 ? 1 : size == 4 ? 2 : size == 8 ? 3 : size == 16 ? 4 : 0;
    if (!idx || load_kernels(dev) != 1) return FERRY_EUNSUPPORTED;
    if (n == 0) return 0;
    unsigned long long count = n;
    void *args[] = {&p, &count};
    unsigned threads = 256;
    unsigned long long blocks = (count + threads - 1) / threads;
    if (blocks > 65535ull * 8) blocks = 65535ull * 8;   /* grid-stride loop covers the rest */
    CUresult r = api_.LaunchKernel(dev_swap_[dev][idx], (unsigned)blocks, 1, 1, threads, 1, 1, 0, stream, args, NULL);
    if (r != 0) return ferry_seterr(FERRY_ECUDA, "byteswap kernel launch: %s", ferry_cuda_errstr(r));
    return 0;
}

int ferry_cuda_scatter_ready(int dev) {
    return ferry_cuda_kernels_ready(dev) && dev_scatter_[dev] != NULL;
}

int ferry_cuda_scatter(int dev, CUdeviceptr packed, CUdeviceptr tab, size_t n, CUstream stream) {
    if (!ferry_cuda_scatter_ready(dev)) return FERRY_EUNSUPPORTED;
    if (n == 0) return 0;
    unsigned long long count = n;
    void *args[] = {&packed, &tab, &count};
    /* one block per run: runs are records of kilobytes, 256 threads move one
     * in a few passes; the grid-stride loop covers more than 65535 runs */
    unsigned blocks = n < 65535 ? (unsigned)n : 65535;
    CUresult r = api_.LaunchKernel(dev_scatter_[dev], blocks, 1, 1, 256, 1, 1, 0, stream, args, NULL);
    if (r != 0) return ferry_seterr(FERRY_ECUDA, "scatter kernel launch: %s", ferry_cuda_errstr(r));
    return 0;
}

int ferry_cuda_adler32_batch(int dev, CUdeviceptr ptrs, CUdeviceptr sizes, CUdeviceptr out, size_t n, CUstream stream) {
    if (dev < 0 || dev >= MAX_DEVICES || load_kernels(dev) != 1 || !dev_adler_[dev]) return FERRY_EUNSUPPORTED;
    if (n == 0) return 0;
    unsigned long long count = n;
    void *args[] = {&ptrs, &sizes, &out, &count};
    unsigned blocks = n > 65535 ? 65535 : (unsigned)n;
    CUresult r = api_.LaunchKernel(dev_adler_[dev], blocks, 1, 1, 256, 1, 1, 0, stream, args, NULL);
    if (r != 0) return ferry_seterr(FERRY_ECUDA, "adler32 kernel launch: %s", ferry_cuda_errstr(r));
    return 0;
}

int ferry_cuda_unshuffle_batch(int dev, CUdeviceptr desc, size_t count, int bits, CUstream stream) {
    if (dev < 0 || dev >= MAX_DEVICES || load_kernels(dev) != 1) return FERRY_EUNSUPPORTED;
    CUfunction f = bits ? dev_bitunshuffle_[dev] : dev_unshuffle_[dev];
    if (!f) return FERRY_EUNSUPPORTED;
    if (count == 0) return 0;
    unsigned long long n = count;
    void *args[] = {&desc, &n};
    unsigned blocks = count > 65535 ? 65535 : (unsigned)count;
    CUresult r = api_.LaunchKernel(f, blocks, 1, 1, 256, 1, 1, 0, stream, args, NULL);
    if (r != 0) return ferry_seterr(FERRY_ECUDA, "unshuffle kernel launch: %s", ferry_cuda_errstr(r));
    return 0;
}

int ferry_cuda_place_batch(int dev, CUdeviceptr desc, size_t count, CUstream stream) {
    if (dev < 0 || dev >= MAX_DEVICES || load_kernels(dev) != 1 || !dev_place_[dev]) return FERRY_EUNSUPPORTED;
    if (count == 0) return 0;
    unsigned long long n = count;
    void *args[] = {&desc, &n};
    unsigned blocks = count > 65535 ? 65535 : (unsigned)count;
    CUresult r = api_.LaunchKernel(dev_place_[dev], blocks, 1, 1, 256, 1, 1, 0, stream, args, NULL);
    if (r != 0) return ferry_seterr(FERRY_ECUDA, "place kernel launch: %s", ferry_cuda_errstr(r));
    return 0;
}

int ferry_cuda_image_xform_batch(int dev, CUdeviceptr desc, size_t count, const ferry_cuda_img_params *p,
                                 CUstream stream) {
    if (dev < 0 || dev >= MAX_DEVICES || load_kernels(dev) != 1 || !dev_imgxform_[dev]) return FERRY_EUNSUPPORTED;
    if (count == 0) return 0;
    unsigned long long n = count;
    unsigned oh = p->out_h, ow = p->out_w, ch = p->channels, layout = p->layout, dt = p->dt;
    float m0 = p->mean[0], m1 = p->mean[1], m2 = p->mean[2], s0 = p->std[0], s1 = p->std[1], s2 = p->std[2];
    void *args[] = {&desc, &n, &oh, &ow, &ch, &layout, &dt, &m0, &m1, &m2, &s0, &s1, &s2};
    /* one thread per output pixel (128 a block: each holds up to 1,024 float
     * weights in local memory), the samples along y (grid-stride past 65535) */
    unsigned long long pixels = (unsigned long long)oh * ow;
    unsigned threads = 128;
    unsigned long long bx = (pixels + threads - 1) / threads;
    if (bx > 0x7fffffffull) return ferry_seterr(FERRY_EINVAL, "image transform: %llu output pixels", pixels);
    unsigned by = count > 65535 ? 65535 : (unsigned)count;
    CUresult r = api_.LaunchKernel(dev_imgxform_[dev], (unsigned)bx, by, 1, threads, 1, 1, 0, stream, args, NULL);
    if (r != 0) return ferry_seterr(FERRY_ECUDA, "image transform kernel launch: %s", ferry_cuda_errstr(r));
    return 0;
}

int ferry_cuda_lib_named(const char *env_name, const char *what, char *path, size_t pathcap, char *why,
                         size_t whycap, void **h) {
    const char *cwhy, *env = getenv(env_name);
    *h = NULL;
    if (env && !strcmp(env, "off")) { snprintf(why, whycap, "%s disabled (%s=off)", what, env_name); return -1; }
    if (!ferry_cuda_load(&cwhy)) { snprintf(why, whycap, "CUDA not available: %s", cwhy); return -1; }
    if (env && *env) {
        snprintf(path, pathcap, "%s", env);
        if (!(*h = dlopen(env, RTLD_NOW | RTLD_LOCAL))) {
            snprintf(why, whycap, "%s=%s: %s", env_name, env, dlerror());
            return -1;
        }
    }
    return 0;
}

/* Whether device's kernels load (ferry.h): kernels_source.c picks the image,
 * this file loads it. */
int ferry_kernels_ready(int device) {
    if (device < 0 || !ferry_cuda_load(NULL)) return 0;
    /* loading a module needs the device's context current: borrow it, and
     * hand the caller's back (torch/cupy read their device from it) */
    CUcontext saved = ferry_cuda_current();
    int ok = ferry_cuda_use_device(device) == 0 && ferry_cuda_kernels_ready(device);
    ferry_cuda_restore(saved);
    return ok;
}
