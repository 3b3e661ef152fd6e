/* nvrtc.c — the GPU kernels compiled at run time, for builds that embedded
 * no fatbin (`pip install .` on a machine without nvcc, the usual case).
 * libnvrtc ships with the CUDA wheels torch depends on (nvidia/cu13/lib/
 * libnvrtc.so.13, nvidia/cuda_nvrtc/lib/libnvrtc.so.12), so it is usually
 * there when a GPU is. It is loaded with dlopen like libcuda: $FERRY_NVRTC
 * (a path), else the directory ferry_nvrtc_search_dir named (the Python
 * package hands it the wheel's lib folder), else the sonames on the loader's
 * path. src/cuda/kernels.cu, embedded as text by
 * tools/embed.sh (ferry_kernels_cu), is compiled once per process to PTX for
 * compute_75, the lowest architecture the nvcc build targets; the driver JITs
 * that PTX for the device. Any failure leaves the CPU byteswap in place and
 * is reported by ferry_nvrtc_status() (`ferry info`). */
#include "ferry.h"
#include "cuda/cuda.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const unsigned char ferry_kernels_cu[];   /* NUL-terminated source */

typedef int nvrtc_result;
typedef struct nvrtc_prog_ *nvrtc_prog;
static struct {
    nvrtc_result (*Create)(nvrtc_prog *, const char *, const char *, int, const char *const *, const char *const *);
    nvrtc_result (*Compile)(nvrtc_prog, int, const char *const *);
    nvrtc_result (*PTXSize)(nvrtc_prog, size_t *);
    nvrtc_result (*PTX)(nvrtc_prog, char *);
    nvrtc_result (*LogSize)(nvrtc_prog, size_t *);
    nvrtc_result (*Log)(nvrtc_prog, char *);
    nvrtc_result (*Destroy)(nvrtc_prog *);
    const char *(*ErrorString)(nvrtc_result);
} nv_;

static pthread_once_t once_ = PTHREAD_ONCE_INIT;
static char *ptx_;
static char why_[1200] = "not tried";

/* NVRTC has no C library headers of its own: kernels.cu's <stdint.h> is this. */
static const char stdint_h[] =
    "typedef unsigned char uint8_t; typedef unsigned short uint16_t;\n"
    "typedef unsigned int uint32_t; typedef unsigned long long uint64_t;\n"
    "typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long long int64_t;\n"
    "typedef unsigned long long uintptr_t; typedef long long intptr_t;\n";

static char dir_[480];
static pthread_mutex_t dir_lock_ = PTHREAD_MUTEX_INITIALIZER;
static int loading_;   /* set once compile_once runs: the directory is then fixed */

void ferry_nvrtc_search_dir(const char *dir) {
    pthread_mutex_lock(&dir_lock_);
    if (!loading_ && dir) snprintf(dir_, sizeof dir_, "%s", dir);
    pthread_mutex_unlock(&dir_lock_);
}

static void *open_nvrtc(void) {
    const char *env = getenv("FERRY_NVRTC");
    if (env && *env) return dlopen(env, RTLD_NOW | RTLD_LOCAL);
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    pthread_mutex_lock(&dir_lock_);
    loading_ = 1;
    pthread_mutex_unlock(&dir_lock_);
    char path[sizeof dir_ + 32];
    for (size_t i = 0; dir_[0] && i < 2; i++) {   /* the wheel's sonames, never its bare .so */
        snprintf(path, sizeof path, "%s/%s", dir_, names[i]);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
    }
    return NULL;
}

static void compile_once(void) {
    void *h = open_nvrtc();
    if (!h) {
        snprintf(why_, sizeof why_, "libnvrtc not found (%s%s%s; set FERRY_NVRTC=/path/to/libnvrtc.so)",
                 getenv("FERRY_NVRTC") ? getenv("FERRY_NVRTC") : "libnvrtc.so.13/.12 not on the loader path",
                 dir_[0] ? " nor in " : "", dir_);
        return;
    }
#define S(f, name) if (!(*(void **)&nv_.f = dlsym(h, name))) { snprintf(why_, sizeof why_, "libnvrtc lacks %s", name); return; }
    S(Create, "nvrtcCreateProgram");
    S(Compile, "nvrtcCompileProgram");
    S(PTXSize, "nvrtcGetPTXSize");
    S(PTX, "nvrtcGetPTX");
    S(LogSize, "nvrtcGetProgramLogSize");
    S(Log, "nvrtcGetProgramLog");
    S(Destroy, "nvrtcDestroyProgram");
    S(ErrorString, "nvrtcGetErrorString");
#undef S
    const char *headers[] = {stdint_h}, *names[] = {"stdint.h"};
    nvrtc_prog prog;
    nvrtc_result r = nv_.Create(&prog, (const char *)ferry_kernels_cu, "kernels.cu", 1, headers, names);
    if (r != 0) { snprintf(why_, sizeof why_, "nvrtcCreateProgram: %s", nv_.ErrorString(r)); return; }
    const char *opts[] = {"--gpu-architecture=compute_75"};
    r = nv_.Compile(prog, 1, opts);
    if (r != 0) {
        size_t n = 0;
        char log[1000] = "";
        if (nv_.LogSize(prog, &n) == 0 && n > 0 && n < sizeof log) nv_.Log(prog, log);
        snprintf(why_, sizeof why_, "nvrtcCompileProgram: %s %s", nv_.ErrorString(r), log);
    } else {
        size_t n = 0;
        char *p = nv_.PTXSize(prog, &n) == 0 && n > 0 ? malloc(n + 1) : NULL;
        if (p && nv_.PTX(prog, p) == 0) {
            p[n] = 0;
            ptx_ = p;   /* kept for the process: every device loads it */
            why_[0] = 0;
        } else {
            free(p);
            snprintf(why_, sizeof why_, "nvrtcGetPTX failed");
        }
    }
    nv_.Destroy(&prog);
}

const char *ferry_nvrtc_ptx(void) {
    pthread_once(&once_, compile_once);
    return ptx_;
}

const char *ferry_nvrtc_status(void) {
    pthread_once(&once_, compile_once);
    return why_;
}
