/* cufile.h — GPUDirect Storage (libcufile.so.0) through dlopen. Only what
 * ferry uses, with cuFile's ABI (CUfileDescr_t, CUfileError_t). Internal. */
#ifndef FERRY_CUFILE_H
#define FERRY_CUFILE_H
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef void *ferry_cufile_handle;

typedef struct ferry_cufile_error { int err; int cu_err; } ferry_cufile_error;  /* CUfileError_t */

typedef struct ferry_cufile_descr {   /* CUfileDescr_t */
    int type;                         /* CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1 */
    union { int fd; void *handle; } handle;
    const void *fs_ops;
} ferry_cufile_descr;

typedef struct ferry_cufile_api {
    ferry_cufile_error (*DriverOpen)(void);
    ferry_cufile_error (*HandleRegister)(ferry_cufile_handle *, ferry_cufile_descr *);
    void (*HandleDeregister)(ferry_cufile_handle);
    ferry_cufile_error (*BufRegister)(const void *, size_t, int);   /* optional: may be NULL (unused) */
    ferry_cufile_error (*BufDeregister)(const void *);   /* optional: may be NULL (unused) */
    ssize_t (*Read)(ferry_cufile_handle, void *, size_t, off_t, off_t);
    ssize_t (*Write)(ferry_cufile_handle, const void *, size_t, off_t, off_t);
} ferry_cufile_api;

/* Load libcufile.so.0 and cuFileDriverOpen once (CUDA must load first).
 * NULL with *why set when cuFile cannot be used at all. The driver is opened
 * in the calling thread's context, else in device dev's primary context
 * (ferry_cufile_load: device 0). */
const ferry_cufile_api *ferry_cufile_load_on(int dev, const char **why);
const ferry_cufile_api *ferry_cufile_load(const char **why);
/* 1 when real GDS can work on this machine (the nvidia-fs module is loaded,
 * or the driver reports P2PDMA); 0 when only cuFile's compatibility mode (POSIX
 * inside cuFile) could run — AUTO then prefers the staged path. */
int ferry_cufile_native(void);
/* Text of a cuFile error code (5001..). */
const char *ferry_cufile_errstr(int err);
#endif
