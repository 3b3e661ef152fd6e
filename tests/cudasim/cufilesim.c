/* cufilesim.c — a stand-in for libcufile.so.0 next to the stand-in driver
 * (cudasim.c), so that ferry's cuFile path (forced with FERRY_PATH=cufile;
 * AUTO prefers the staged path without nvidia-fs) runs in `make test`. It
 * behaves like cuFile's compatibility mode, with the checks that matter:
 * - cuFileDriverOpen and every I/O need a current CUDA context;
 * - a handle is registered from an O_DIRECT file descriptor only (cuFile
 *   refuses others) and reads/writes through its own buffered descriptor, so
 *   unaligned offsets and lengths work as in compatibility mode;
 * - the device side, buffer + offset .. + size, must lie in device memory
 *   (cuPointerGetAttribute of the stand-in driver).
 * Built into its own directory: only the C tests put it on the library path
 * (torch, in pytest, loads the real one). */
#include "cuda/cuda.h"
#include "cuda/cufile.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

CUresult cuCtxGetCurrent(CUcontext *c);
CUresult cuPointerGetAttribute(void *out, int attr, CUdeviceptr p);

/* cuFile's codes (the texts are in src/cuda/cufile.c) */
enum { CU_FILE_SUCCESS = 0, CU_FILE_DRIVER_NOT_INITIALIZED = 5001, CU_FILE_INVALID_VALUE = 5022,
       CU_FILE_CUDA_DRIVER_ERROR = 5011, CU_FILE_CUDA_POINTER_RANGE_ERROR = 5014,
       CU_FILE_O_DIRECT_NOT_SET = 5020 };

typedef struct { int fd; } sim_handle;
static int opened_;

static ferry_cufile_error err(int e) { return (ferry_cufile_error){e, 0}; }

static int has_context(void) {
    CUcontext c = NULL;
    return cuCtxGetCurrent(&c) == 0 && c != NULL;
}

ferry_cufile_error cuFileDriverOpen(void) {
    if (!has_context()) return err(CU_FILE_CUDA_DRIVER_ERROR);
    opened_ = 1;
    return err(CU_FILE_SUCCESS);
}

ferry_cufile_error cuFileHandleRegister(ferry_cufile_handle *out, ferry_cufile_descr *d) {
    if (!opened_) return err(CU_FILE_DRIVER_NOT_INITIALIZED);
    if (!d || d->type != 1) return err(CU_FILE_INVALID_VALUE);
    int fl = fcntl(d->handle.fd, F_GETFL);
    if (fl < 0) return err(CU_FILE_INVALID_VALUE);
    if (!(fl & O_DIRECT)) return err(CU_FILE_O_DIRECT_NOT_SET);
    char p[64];
    snprintf(p, sizeof p, "/proc/self/fd/%d", d->handle.fd);
    int fd = open(p, (fl & O_ACCMODE) | O_CLOEXEC);
    if (fd < 0) return err(CU_FILE_INVALID_VALUE);
    sim_handle *h = malloc(sizeof *h);
    h->fd = fd;
    *out = h;
    return err(CU_FILE_SUCCESS);
}

void cuFileHandleDeregister(ferry_cufile_handle fh) {
    sim_handle *h = fh;
    if (!h) return;
    close(h->fd);
    free(h);
}

ferry_cufile_error cuFileBufRegister(const void *p, size_t n, int flags) {
    (void)p; (void)n; (void)flags;
    return err(opened_ ? CU_FILE_SUCCESS : CU_FILE_DRIVER_NOT_INITIALIZED);
}

ferry_cufile_error cuFileBufDeregister(const void *p) {
    (void)p;
    return err(opened_ ? CU_FILE_SUCCESS : CU_FILE_DRIVER_NOT_INITIALIZED);
}

/* The device bytes [p, p+n): device memory at both ends. */
static int device_span(CUdeviceptr p, size_t n) {
    unsigned a = 0, b = 0;
    if (!n) return 1;
    return cuPointerGetAttribute(&a, FERRY_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) == 0 &&
           cuPointerGetAttribute(&b, FERRY_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + n - 1) == 0 &&
           a == FERRY_CU_MEMORYTYPE_DEVICE && b == FERRY_CU_MEMORYTYPE_DEVICE;
}

ssize_t cuFileRead(ferry_cufile_handle fh, void *base, size_t n, off_t file_off, off_t dev_off) {
    sim_handle *h = fh;
    if (!h || file_off < 0 || dev_off < 0) return -CU_FILE_INVALID_VALUE;
    if (!has_context()) return -CU_FILE_CUDA_DRIVER_ERROR;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)base + (CUdeviceptr)dev_off;
    if (!device_span(p, n)) return -CU_FILE_CUDA_POINTER_RANGE_ERROR;
    return pread(h->fd, (void *)(uintptr_t)p, n, file_off);   /* -1 with errno, as cuFile */
}

ssize_t cuFileWrite(ferry_cufile_handle fh, const void *base, size_t n, off_t file_off, off_t dev_off) {
    sim_handle *h = fh;
    if (!h || file_off < 0 || dev_off < 0) return -CU_FILE_INVALID_VALUE;
    if (!has_context()) return -CU_FILE_CUDA_DRIVER_ERROR;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)base + (CUdeviceptr)dev_off;
    if (!device_span(p, n)) return -CU_FILE_CUDA_POINTER_RANGE_ERROR;
    return pwrite(h->fd, (const void *)(uintptr_t)p, n, file_off);
}
