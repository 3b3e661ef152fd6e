/* cuda.h — the CUDA driver API, reached through dlopen("libcuda.so.1").
 * Only the types and functions ferry uses are declared here, with the
 * driver's ABI (checked against the toolkit's cuda.h by tests/c/test_cuda_abi.c
 * where the toolkit is installed). Nothing links CUDA. Internal. */
#ifndef FERRY_CUDA_H
#define FERRY_CUDA_H
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;          /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef unsigned long long CUdeviceptr;

enum {
    FERRY_CU_ERROR_OUT_OF_MEMORY = 2,      /* CUDA_ERROR_OUT_OF_MEMORY */
    FERRY_CU_MEMORYTYPE_HOST = 1,
    FERRY_CU_MEMORYTYPE_DEVICE = 2,
    FERRY_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    FERRY_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    FERRY_CU_EVENT_BLOCKING_SYNC = 1,
    FERRY_CU_EVENT_DISABLE_TIMING = 2,
    FERRY_CU_STREAM_NON_BLOCKING = 1,
    FERRY_CU_MEMHOSTALLOC_PORTABLE = 1,
    FERRY_CU_MEMHOSTREGISTER_PORTABLE = 1,
    FERRY_CUDA_ERROR_NOT_READY = 600
};

typedef struct ferry_cu_memcpy2d {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} ferry_cu_memcpy2d;

/* One table of function pointers, filled once. */
typedef struct ferry_cuda_api {
    CUresult (*Init)(unsigned);
    CUresult (*DriverGetVersion)(int *);   /* optional: may be NULL (unused) */
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);   /* optional: may be NULL (unused) */
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventQuery)(CUevent);   /* optional: may be NULL (unused) */
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*Memcpy2DAsync)(const ferry_cu_memcpy2d *, CUstream);
    CUresult (*Memcpy)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemHostRegister)(void *, size_t, unsigned);   /* optional: may be NULL (unused) */
    CUresult (*MemHostUnregister)(void *);   /* optional: may be NULL (unused) */
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
    CUresult (*StreamGetCtx)(CUstream, CUcontext *);   /* optional (CUDA 9.2+): may be NULL */
    CUresult (*MemGetInfo)(size_t *, size_t *);        /* optional: may be NULL (free, total of the current context's device) */
} ferry_cuda_api;

/* The start every run-time library loader shares (nvcomp.c, nvjpeg.c): ENV=off
 * refuses ("<what> disabled (ENV=off)"), CUDA must load, and ENV=<file> is
 * opened as given, never second-guessed (path gets it). Returns -1 with why
 * set (the loader stops), or 0 with *h the named file's handle, or NULL when
 * ENV names none (the loader then searches its own names). */
int ferry_cuda_lib_named(const char *env_name, const char *what, char *path, size_t pathcap, char *why,
                         size_t whycap, void **h);

/* Load libcuda.so.1 and cuInit(0) once (thread-safe). Returns the table, or
 * NULL with *why set to a static reason ("libcuda.so.1 not found", ...). */
const ferry_cuda_api *ferry_cuda_load(const char **why);
/* "cuMemAlloc: out of memory (2)" style text for a CUresult. */
const char *ferry_cuda_errstr(CUresult r);
/* Make device `dev`'s primary context current on this thread (retained once
 * per process and device, released at exit by the driver). */
int ferry_cuda_use_device(int dev);
/* The calling thread's current CUDA context (NULL when none or no CUDA), to
 * hand back to ferry_cuda_restore. Work ferry runs on the application's own
 * thread (small plans, memory helpers, teardown) switches contexts; the CUDA
 * runtime (torch, cupy) takes its current device from that thread's context,
 * so those calls must leave it as they found it — else torch on rank 1 of a
 * two-GPU job finds itself on device 0 after a ferry call. */
CUcontext ferry_cuda_current(void);
void ferry_cuda_restore(CUcontext saved);
/* Device ordinal owning a device pointer, or a negative code. */
int ferry_cuda_pointer_device(uintptr_t ptr);

/* The embedded GPU kernels (tools/embed.sh output; size 0 without nvcc). */
extern const unsigned char ferry_kernels_fatbin[];
extern const size_t ferry_kernels_fatbin_size;
/* Byte-swap n elements of `size` bytes in device memory, on `stream`, with
 * device `dev` current. Returns FERRY_EUNSUPPORTED when no kernels are embedded. */
/* The image load_kernels hands to cuModuleLoadData: the embedded fatbin, else
 * NVRTC's PTX (nvrtc.c), else NULL (CPU byteswaps); FERRY_KERNELS=nvrtc|none
 * overrides. Decided in kernels_source.c, reported by ferry_kernels_source(). */
const void *ferry_kernels_image(void);
/* 1 when the embedded kernels load on device dev. */
int ferry_cuda_kernels_ready(int dev);
int ferry_cuda_byteswap(int dev, CUdeviceptr p, size_t n, unsigned size, CUstream stream);

/* One run of a packed staging buffer: len bytes at packed + src go to the
 * device address dst (the layout kernels.cu's ferry_scatter reads). */
typedef struct ferry_scatter_entry { uint64_t src, dst, len; } ferry_scatter_entry;
/* 1 when the scatter kernel is loaded on device dev. */
int ferry_cuda_scatter_ready(int dev);
/* Enqueue on `stream` (device dev current): for each of the n entries of tab
 * (device memory), copy entry.len bytes from packed + entry.src to entry.dst.
 * FERRY_EUNSUPPORTED when no kernels are embedded. */
int ferry_cuda_scatter(int dev, CUdeviceptr packed, CUdeviceptr tab, size_t n, CUstream stream);
/* The GPU decoder's kernels (src/cuda/kernels.cu), device dev current:
 * Adler-32 of n device buffers (ptrs, sizes: device arrays of n pointers and
 * 64-bit sizes) into out (n uint32); HDF5/blosc byte unshuffle of `count`
 * buffers described by the device array desc of (in, out, n, size) u64
 * quadruples (in and out not overlapping; size 1 copies); bits: blosc's
 * bitshuffle instead (rows of nel/8 bytes, nel rounded down to 8).
 * FERRY_EUNSUPPORTED without those kernels. */
int ferry_cuda_adler32_batch(int dev, CUdeviceptr ptrs, CUdeviceptr sizes, CUdeviceptr out, size_t n, CUstream stream);
int ferry_cuda_unshuffle_batch(int dev, CUdeviceptr desc, size_t count, int bits, CUstream stream);
/* The tile scatter: `count` chunks placed into their boxes, desc a device
 * array of 16 u64 each (src, dst, width, rows0..2, src strides 0..2, dst
 * strides 0..2, 4 unused): rows0 x rows1 x rows2 runs of width bytes. */
int ferry_cuda_place_batch(int dev, CUdeviceptr desc, size_t count, CUstream stream);
/* The image transform after decode (src/codecs/imagexform.h; kernels.cu
 * ferry_image_xform_batch): `count` samples described by the device array
 * desc of 8 u64 each (src, dst, src row stride, h << 32 | w, box y << 32 | x,
 * box h << 32 | w, flip, 0), every one to out_h x out_w x channels in layout
 * (0 CHW, 1 HWC) of dt (0 uint8, 1 float32, 2 float16, 3 bfloat16), then
 * normalised with mean/std where std != 0. FERRY_EUNSUPPORTED without the
 * kernel. The caller checks each box (ferry_img_check). */
typedef struct ferry_cuda_img_params {
    uint32_t out_h, out_w, channels, layout, dt;
    float mean[3], std[3];
} ferry_cuda_img_params;
int ferry_cuda_image_xform_batch(int dev, CUdeviceptr desc, size_t count, const ferry_cuda_img_params *p,
                                 CUstream stream);
#endif
