/* cufile.c — dlopen libcufile.so.0 once; say whether GDS is native or only
 * cuFile's compatibility mode is possible. */
#include "cuda/cufile.h"
#include "cuda/cuda.h"
#include "common.h"
#include "engine/sysio.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ferry_cufile_api api_;
static const ferry_cufile_api *loaded_;
static const char *why_ = "";
static pthread_mutex_t lock_ = PTHREAD_MUTEX_INITIALIZER;
static int tried_;

/* Load and open cuFile once. cuFileDriverOpen wants a current context on some
 * versions: the thread's own, else the primary context of `dev` — the device
 * the asking plan uses, so a process that serves device 1 opens nothing on
 * device 0 — and the thread's context is handed back. */
static void load_locked(int dev) {
    const char *cwhy, *env = getenv("FERRY_CUFILE");
    if (!ferry_cuda_load(&cwhy)) { why_ = cwhy; return; }
    /* FERRY_CUFILE=off: never load cuFile (its set-up costs time and logs, and
     * tests on the simulated driver of tests/cudasim must not reach the real one) */
    if (env && !strcmp(env, "off")) { why_ = "cuFile disabled (FERRY_CUFILE=off)"; return; }
    void *h = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libcufile.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) { why_ = "libcufile.so.0 not found"; return; }
#define S(field, name) do { *(void **)&api_.field = dlsym(h, name); if (!api_.field) { why_ = "libcufile lacks " name; return; } } while (0)
    S(DriverOpen, "cuFileDriverOpen");
    S(HandleRegister, "cuFileHandleRegister");
    S(HandleDeregister, "cuFileHandleDeregister");
    S(Read, "cuFileRead");
    S(Write, "cuFileWrite");
#undef S
    /* optional (nothing registers buffers today): NULL when absent */
    *(void **)&api_.BufRegister = dlsym(h, "cuFileBufRegister");
    *(void **)&api_.BufDeregister = dlsym(h, "cuFileBufDeregister");
    CUcontext saved = ferry_cuda_current();
    if (!saved) ferry_cuda_use_device(dev >= 0 ? dev : 0);
    ferry_cufile_error e = api_.DriverOpen();
    ferry_cuda_restore(saved);
    if (e.err != 0) {
        static char buf[160];
        snprintf(buf, sizeof buf, "cuFileDriverOpen failed: %s (%d)", ferry_cufile_errstr(e.err), e.err);
        why_ = buf;
        return;
    }
    loaded_ = &api_;
}

const ferry_cufile_api *ferry_cufile_load_on(int dev, const char **why) {
    if (!__atomic_load_n(&tried_, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&lock_);
        if (!tried_) {
            load_locked(dev);
            __atomic_store_n(&tried_, 1, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&lock_);
    }
    if (why) *why = loaded_ ? "" : why_;
    return loaded_;
}

const ferry_cufile_api *ferry_cufile_load(const char **why) {
    return ferry_cufile_load_on(-1, why);
}

int ferry_cufile_native(void) {
    /* through the system-call table: a test stands in for a machine with nvidia-fs */
    const ferry_sys_api *sys = ferry_sys();
    return sys->access("/proc/driver/nvidia-fs/stats", F_OK) == 0 || sys->access("/sys/module/nvidia_fs", F_OK) == 0;
}

/* cuFile's CU_FILE_* codes (cufile.h; checked by tests/c/test_cuda_abi.c). */
const char *ferry_cufile_errstr(int err) {
    switch (err) {
    case 0: return "success";
    case 5001: return "driver not initialized (nvidia-fs not loaded and compatibility mode off)";
    case 5002: return "invalid driver property";
    case 5003: return "driver limit not supported";
    case 5004: return "driver version mismatch";
    case 5005: return "driver version read error";
    case 5006: return "driver closing";
    case 5007: return "platform not supported";
    case 5008: return "I/O not supported on this file system";
    case 5009: return "device not supported";
    case 5010: return "nvidia-fs driver error";
    case 5011: return "CUDA driver error";
    case 5012: return "CUDA pointer invalid";
    case 5013: return "CUDA memory type invalid";
    case 5014: return "CUDA pointer range error";
    case 5015: return "CUDA context mismatch";
    case 5016: return "invalid mapping size";
    case 5017: return "invalid mapping range";
    case 5018: return "invalid file type";
    case 5019: return "invalid file open flag";
    case 5020: return "file not opened with O_DIRECT";
    case 5022: return "invalid value";
    case 5023: return "memory already registered";
    case 5024: return "memory not registered";
    case 5025: return "permission denied";
    case 5026: return "driver already open";
    case 5027: return "file handle not registered (cuFile could not use this file)";
    case 5028: return "handle already registered";
    case 5029: return "device not found";
    case 5030: return "internal error";
    case 5031: return "getting a new file descriptor failed";
    case 5033: return "nvidia-fs setup error";
    case 5034: return "I/O disabled (no GDS, compatibility mode off)";
    case 5035: return "batch submit failed";
    case 5036: return "GPU memory pinning failed";
    default: return "cuFile error";
    }
}
