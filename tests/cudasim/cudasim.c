/* cudasim.c — a stand-in for libcuda.so.1 so that ferry's device paths run in
 * `make test` on machines without a GPU. It is not an emulator of the
 * hardware; it keeps the rules of the driver API that ferry's correctness
 * rests on, and is stricter where a real driver would only be slow:
 *
 * - "Device" memory is host memory handed out by cuMemAlloc and known by
 *   range, so every copy checks that its device side lies inside one
 *   allocation (a real GPU would fault or corrupt silently).
 * - Streams are FIFO queues run by their own thread, each operation after a
 *   random delay (FERRY_CUDASIM_DELAY_US, default 100): a buffer reused before
 *   its asynchronous copy ran, or an event not waited for, shows up as wrong
 *   bytes instead of passing by luck.
 * - Pageable host memory behaves as the driver documents: H2D copies take the
 *   source before returning, D2H copies return when done. Pinned memory
 *   (cuMemHostAlloc / cuMemHostRegister) is read and written asynchronously.
 * - Every call that needs a context fails with CUDA_ERROR_INVALID_CONTEXT
 *   when the thread has none; a stream or event used under another device's
 *   context fails with CUDA_ERROR_INVALID_HANDLE ("invalid resource handle").
 * - The legacy stream (NULL) runs synchronously on the calling thread; so do
 *   the handles CU_STREAM_LEGACY (0x1) and CU_STREAM_PER_THREAD (0x2).
 * - A destroyed event lives on until the queued work naming it has run.
 * - The kernels of src/cuda/kernels.cu run by name, on the CPU: byteswaps,
 *   ferry_scatter (packed records to scattered destinations: it reads its
 *   table from "device" memory when it runs, and a destination outside every
 *   allocation aborts the process, as a real GPU faults), ferry_adler32_batch,
 *   ferry_unshuffle_batch, ferry_bitunshuffle_batch and ferry_place_batch
 *   (their device arguments checked; a descriptor naming memory outside a
 *   device allocation is counted as "bad_kernel_args", where a real GPU
 *   would fault).
 * - cuLaunchHostFunc runs a host function on the stream's thread in order:
 *   the stand-in nvCOMP (nvcompsim.c) queues its decoding that way.
 *
 * Tests read what happened through cudasim_count() (dlsym on the loaded
 * library): primary-context retains and pinned allocations per device, and
 * copies made under one device's context into another device's memory,
 * host-to-device copies, kernel launches and cuPointerGetAttribute calls.
 * FERRY_CUDASIM_DEVICES sets the device count (default 2); device d reports
 * PCI bus id 0000:<0x10 + d>:00.0 (cuDeviceGetPCIBusId). FERRY_CUDASIM_NOPIN=1
 * (read at each call) fails cuMemHostAlloc as a locked-memory limit would.
 * FERRY_CUDASIM_MEM=N (bytes, K/M/G suffixes; read at each call) makes each
 * device that big: cuMemAlloc fails with out-of-memory past it, and
 * cuMemGetInfo reports it less what is allocated (default 80G, never full). */

#include "cuda/cuda.h"
#include "codecs/imagexform_core.h"
#include <pthread.h>
#include <sys/mman.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
    OK = 0, E_INVALID_VALUE = 1, E_OUT_OF_MEMORY = 2, E_NOT_INITIALIZED = 3,
    E_NO_DEVICE = 100, E_INVALID_DEVICE = 101, E_INVALID_CONTEXT = 201,
    E_INVALID_HANDLE = 400, E_NOT_FOUND = 500, E_NOT_READY = 600
};
#define MAXDEV 16

struct CUctx_st { int dev; int refs; };
struct CUmod_st { int dev; };
struct CUfunc_st { int swap; int kind; };   /* element size of ferry_bswapN; kind: K_* */
enum { K_SWAP = 0, K_ADLER = 1, K_UNSHUFFLE = 2, K_SCATTER = 3, K_BITUNSHUFFLE = 4, K_PLACE = 5, K_IMGXFORM = 6 };

typedef struct op {
    enum { OP_COPY, OP_RECORD, OP_WAIT, OP_SWAP, OP_SCATTER, OP_HOST, OP_ADLER, OP_UNSHUFFLE, OP_PLACE, OP_IMGXFORM } kind;
    ferry_cuda_img_params img;                     /* IMGXFORM: the batch's output (desc in src, n samples) */
    void (*fn)(void *); void *arg;                 /* HOST */
    uint32_t *out;                                 /* ADLER: ptrs in dst, sizes in src, n */
    uint8_t *dst; const uint8_t *src; size_t n;    /* COPY (src may be owned) */
    void *owned;                                   /* freed after the copy */
    ferry_cu_memcpy2d c2;                          /* 2D copy when c2.Height */
    struct CUevent_st *ev; uint64_t gen;           /* RECORD, WAIT */
    unsigned size;                                 /* SWAP */
    const uint8_t *tab;                            /* SCATTER: entries (src, dst, len), n of them */
    struct op *next;
} op;

struct CUstream_st {
    CUcontext ctx;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv, idle_cv;
    op *head, *tail;
    int busy, stop;
    unsigned seed;
};

struct CUevent_st {
    CUcontext ctx;
    uint64_t recorded, completed;
    int refs;          /* queued operations that name it */
    int destroyed;     /* cuEventDestroy'd: freed when refs reaches 0 (as the driver does) */
};

/* Under ev_mu_: an operation names / stops naming e. */
static void ev_ref(struct CUevent_st *e) { e->refs++; }
static void ev_unref(struct CUevent_st *e) {
    if (--e->refs == 0 && e->destroyed) free(e);
}

typedef struct region { uintptr_t base; size_t size; int kind, dev; struct region *next; } region;
enum { R_DEVICE = 1, R_PINNED = 2, R_REGISTERED = 3 };

static int ndev_ = 2, inited_;
static struct CUctx_st primary_[MAXDEV];
static region *regions_;
static pthread_mutex_t lock_ = PTHREAD_MUTEX_INITIALIZER;   /* regions, contexts */
static pthread_mutex_t ev_mu_ = PTHREAD_MUTEX_INITIALIZER;  /* every event */
static pthread_cond_t ev_cv_ = PTHREAD_COND_INITIALIZER;
static __thread CUcontext cur_;
static long delay_us_ = 100;
static atomic_long count_retains_[MAXDEV], count_pinned_[MAXDEV], count_cross_[MAXDEV];
static atomic_long count_htod_[MAXDEV], count_launch_[MAXDEV], count_ptrattr_, count_pageable_htod_[MAXDEV];
static atomic_long count_bad_kernel_;
/* bytes of cuMemHostAlloc (allocated in all, live now, the most live at once
 * since the last "reset_pinned_peak") and of cuMemAlloc (calls, bytes) */
static atomic_long count_pinned_bytes_[MAXDEV], count_pinned_live_[MAXDEV], count_pinned_peak_[MAXDEV];
static atomic_long count_dev_allocs_[MAXDEV], count_dev_bytes_[MAXDEV], count_dev_live_[MAXDEV];
int cudasim_is_device(CUdeviceptr p, size_t n);

/* ---- what tests can ask ------------------------------------------------ */
long cudasim_count(const char *what, int dev) {
    if (dev < 0 || dev >= MAXDEV) return -1;
    if (!strcmp(what, "retains")) return atomic_load(&count_retains_[dev]);
    if (!strcmp(what, "pinned_allocs")) return atomic_load(&count_pinned_[dev]);
    /* copies issued under device dev's context into another device's memory */
    if (!strcmp(what, "cross_device_copies")) return atomic_load(&count_cross_[dev]);
    /* host-to-device copies (1D and 2D) and kernel launches under device dev's context */
    if (!strcmp(what, "htod_copies")) return atomic_load(&count_htod_[dev]);
    /* asynchronous copies from pageable memory (the real driver first waits for the stream) */
    if (!strcmp(what, "pageable_htod")) return atomic_load(&count_pageable_htod_[dev]);
    if (!strcmp(what, "launches")) return atomic_load(&count_launch_[dev]);
    /* cuPointerGetAttribute calls, any device */
    if (!strcmp(what, "pointer_attributes")) return atomic_load(&count_ptrattr_);
    if (!strcmp(what, "bad_kernel_args")) return atomic_load(&count_bad_kernel_);
    if (!strcmp(what, "pinned_bytes")) return atomic_load(&count_pinned_bytes_[dev]);
    if (!strcmp(what, "pinned_live")) return atomic_load(&count_pinned_live_[dev]);
    if (!strcmp(what, "pinned_peak")) return atomic_load(&count_pinned_peak_[dev]);
    if (!strcmp(what, "reset_pinned_peak")) {
        atomic_store(&count_pinned_peak_[dev], atomic_load(&count_pinned_live_[dev]));
        return atomic_load(&count_pinned_peak_[dev]);
    }
    if (!strcmp(what, "device_allocs")) return atomic_load(&count_dev_allocs_[dev]);
    if (!strcmp(what, "device_bytes")) return atomic_load(&count_dev_bytes_[dev]);
    if (!strcmp(what, "device_live")) return atomic_load(&count_dev_live_[dev]);
    return -1;
}

/* ---- memory registry ---------------------------------------------------- */
static region *find_locked(uintptr_t p) {
    for (region *r = regions_; r; r = r->next)
        if (p >= r->base && p < r->base + (r->size ? r->size : 1)) return r;
    return NULL;
}

static int lookup(uintptr_t p, size_t n, int *kind, int *dev) {
    pthread_mutex_lock(&lock_);
    region *r = find_locked(p);
    int ok = r && p + n <= r->base + r->size + (r->size == 0);
    if (r) { *kind = r->kind; *dev = r->dev; }
    pthread_mutex_unlock(&lock_);
    return r ? (ok ? 1 : -1) : 0;   /* 1 inside, -1 runs past the end, 0 unknown */
}

static void add_region(uintptr_t base, size_t size, int kind, int dev) {
    region *r = malloc(sizeof *r);
    *r = (region){base, size, kind, dev, NULL};
    pthread_mutex_lock(&lock_);
    r->next = regions_;
    regions_ = r;
    pthread_mutex_unlock(&lock_);
}

static int drop_region(uintptr_t base, int kind) {
    pthread_mutex_lock(&lock_);
    for (region **pp = &regions_; *pp; pp = &(*pp)->next)
        if ((*pp)->base == base && (*pp)->kind == kind) {
            region *r = *pp;
            *pp = r->next;
            if (kind == R_PINNED) atomic_fetch_sub(&count_pinned_live_[r->dev], (long)r->size);
            if (kind == R_DEVICE) atomic_fetch_sub(&count_dev_live_[r->dev], (long)r->size);
            free(r);
            pthread_mutex_unlock(&lock_);
            return 1;
        }
    pthread_mutex_unlock(&lock_);
    return 0;
}

/* A device range [p, p+n) inside one cuMemAlloc allocation; counts copies
 * into another device's memory than the current context's. */
static int device_range(CUdeviceptr p, size_t n) {
    int kind = 0, dev = -1;
    if (lookup((uintptr_t)p, n, &kind, &dev) != 1 || kind != R_DEVICE) return E_INVALID_VALUE;
    if (cur_ && dev != cur_->dev) atomic_fetch_add(&count_cross_[cur_->dev], 1);
    return OK;
}

static int host_pinned(const void *p, size_t n) {
    int kind = 0, dev = -1;
    return lookup((uintptr_t)p, n, &kind, &dev) == 1 && (kind == R_PINNED || kind == R_REGISTERED);
}

/* ---- streams --------------------------------------------------------------- */
static void run_op(op *o) {
    if (o->kind == OP_COPY) {
        if (o->c2.Height) {
            const ferry_cu_memcpy2d *c = &o->c2;
            const uint8_t *s = c->srcMemoryType == FERRY_CU_MEMORYTYPE_HOST ? (const uint8_t *)c->srcHost
                                                                             : (const uint8_t *)(uintptr_t)c->srcDevice;
            uint8_t *d = c->dstMemoryType == FERRY_CU_MEMORYTYPE_HOST ? (uint8_t *)c->dstHost
                                                                       : (uint8_t *)(uintptr_t)c->dstDevice;
            if (o->owned) s = o->owned;
            for (size_t y = 0; y < c->Height; y++)
                memmove(d + c->dstXInBytes + (c->dstY + y) * c->dstPitch,
                        s + (o->owned ? y * c->WidthInBytes : c->srcXInBytes + (c->srcY + y) * c->srcPitch),
                        c->WidthInBytes);
        } else if (o->n) {
            memmove(o->dst, o->src, o->n);
        }
    } else if (o->kind == OP_SWAP) {
        uint8_t *p = o->dst;
        for (size_t i = 0; i < o->n; i++, p += o->size)
            for (unsigned a = 0, b = o->size - 1; a < b; a++, b--) { uint8_t t = p[a]; p[a] = p[b]; p[b] = t; }
    } else if (o->kind == OP_SCATTER) {
        for (size_t i = 0; i < o->n; i++) {
            uint64_t e[3];
            memcpy(e, o->tab + 24 * i, sizeof e);
            int kind = 0, dev = -1;
            if (e[2] && (lookup((uintptr_t)e[1], e[2], &kind, &dev) != 1 || kind != R_DEVICE)) {
                fprintf(stderr, "cudasim: ferry_scatter entry %zu writes %llu bytes at 0x%llx outside device memory\n",
                        i, (unsigned long long)e[2], (unsigned long long)e[1]);
                abort();
            }
            memmove((void *)(uintptr_t)e[1], o->src + e[0], e[2]);
        }
    } else if (o->kind == OP_HOST) {
        o->fn(o->arg);
    } else if (o->kind == OP_ADLER) {
        const uint8_t *const *ptrs = (const uint8_t *const *)o->dst;
        const unsigned long long *sizes = (const unsigned long long *)o->src;
        for (size_t c = 0; c < o->n; c++) {
            uint32_t a = 1, b = 0;
            for (unsigned long long k = 0; k < sizes[c]; k++) { a = (a + ptrs[c][k]) % 65521u; b = (b + a) % 65521u; }
            o->out[c] = (b << 16) | a;
        }
    } else if (o->kind == OP_PLACE) {   /* as kernels.cu's ferry_place_batch; every run checked */
        const unsigned long long *q0 = (const unsigned long long *)o->src;
        for (size_t d = 0; d < o->n; d++) {
            const unsigned long long *q = q0 + 16 * d;
            unsigned long long width = q[2], r0 = q[3], r1 = q[4], r2 = q[5];
            for (unsigned long long a = 0; a < r0; a++)
                for (unsigned long long b = 0; b < r1; b++)
                    for (unsigned long long c = 0; c < r2; c++) {
                        uintptr_t s = (uintptr_t)(q[0] + a * q[6] + b * q[7] + c * q[8]);
                        uintptr_t t = (uintptr_t)(q[1] + a * q[9] + b * q[10] + c * q[11]);
                        if (!cudasim_is_device(s, width) || !cudasim_is_device(t, width)) { atomic_fetch_add(&count_bad_kernel_, 1); continue; }
                        memmove((void *)t, (const void *)s, width);
                    }
        }
    } else if (o->kind == OP_IMGXFORM) {   /* as kernels.cu's ferry_image_xform_batch, on the CPU twin */
        const unsigned long long *desc = (const unsigned long long *)o->src;
        const ferry_cuda_img_params *p = &o->img;
        size_t isz = p->dt == 0 ? 1 : p->dt == 1 ? 4 : 2;
        for (size_t d = 0; d < o->n; d++) {
            const unsigned long long *q = desc + 8 * d;
            uint32_t h = (uint32_t)(q[3] >> 32), by = (uint32_t)(q[4] >> 32), bx = (uint32_t)q[4];
            uint32_t bh = (uint32_t)(q[5] >> 32), bw = (uint32_t)q[5];
            size_t out_bytes = (size_t)p->out_h * p->out_w * p->channels * isz;
            if (!cudasim_is_device((CUdeviceptr)q[0], (size_t)q[2] * h) || !cudasim_is_device((CUdeviceptr)q[1], out_bytes)) {
                atomic_fetch_add(&count_bad_kernel_, 1);   /* a real GPU would fault */
                continue;
            }
            ferry_img_transform_core((const uint8_t *)(uintptr_t)q[0], (size_t)q[2], by, bx, bh, bw, (int)q[6], p->out_h,
                                     p->out_w, p->channels, (int)p->layout, (int)p->dt, p->mean, p->std,
                                     (void *)(uintptr_t)q[1]);
        }
    } else if (o->kind == OP_UNSHUFFLE) {   /* descriptors (in, out, n, size), read when it runs */
        const unsigned long long *desc = (const unsigned long long *)o->src;
        for (size_t d = 0; d < o->n; d++) {
            const uint8_t *in = (const uint8_t *)(uintptr_t)desc[4 * d];
            uint8_t *out = (uint8_t *)(uintptr_t)desc[4 * d + 1];
            size_t n = desc[4 * d + 2], size = desc[4 * d + 3];
            if (!size || !cudasim_is_device((CUdeviceptr)(uintptr_t)in, n) || !cudasim_is_device((CUdeviceptr)(uintptr_t)out, n)) {
                atomic_fetch_add(&count_bad_kernel_, 1);   /* a real GPU would fault */
                continue;
            }
            if (o->size) {   /* bitshuffle, as kernels.cu's ferry_bitunshuffle_batch */
                size_t nel8 = (n / size) & ~(size_t)7, rowbytes = nel8 / 8, body8 = nel8 * size;
                for (size_t x = 0; x < n; x++) {
                    if (x >= body8) { out[x] = in[x]; continue; }
                    size_t i = x / size, j = x % size;
                    unsigned v = 0;
                    for (unsigned k = 0; k < 8; k++) v |= ((in[(8 * j + k) * rowbytes + i / 8] >> (i % 8)) & 1u) << k;
                    out[x] = (uint8_t)v;
                }
                continue;
            }
            size_t nel = n / size, body = nel * size;
            for (size_t i = 0; i < n; i++) out[i] = i < body ? in[(i % size) * nel + i / size] : in[i];
        }
    } else if (o->kind == OP_RECORD) {
        pthread_mutex_lock(&ev_mu_);
        if (o->gen > o->ev->completed) o->ev->completed = o->gen;
        pthread_cond_broadcast(&ev_cv_);
        ev_unref(o->ev);
        pthread_mutex_unlock(&ev_mu_);
    } else if (o->kind == OP_WAIT) {
        pthread_mutex_lock(&ev_mu_);
        while (o->ev->completed < o->gen) pthread_cond_wait(&ev_cv_, &ev_mu_);
        ev_unref(o->ev);
        pthread_mutex_unlock(&ev_mu_);
    }
    free(o->owned);
}

static void *stream_main(void *arg) {
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break;
        op *o = s->head;
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        s->busy = 1;
        unsigned d = delay_us_ > 0 ? (unsigned)(rand_r(&s->seed) % (unsigned)(delay_us_ + 1)) : 0;
        pthread_mutex_unlock(&s->mu);
        if (d) usleep(d);
        run_op(o);
        free(o);
        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        if (!s->head) pthread_cond_broadcast(&s->idle_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void drain(struct CUstream_st *s) {
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy) pthread_cond_wait(&s->idle_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* CU_STREAM_LEGACY (0x1) and CU_STREAM_PER_THREAD (0x2) are the calling
 * thread's default streams: run like the legacy stream (NULL). */
static CUstream default_stream(CUstream s) { return (uintptr_t)s <= 2 ? NULL : s; }

/* Check the stream against the current context; NULL is the legacy stream. */
static int stream_ok(CUstream s) {
    if (!cur_) return E_INVALID_CONTEXT;
    if (s && s->ctx != cur_) return E_INVALID_HANDLE;
    return OK;
}

/* Queue o on s, or run it now on the legacy stream. */
static void submit(CUstream s, op *o) {
    if (!s) { run_op(o); free(o); return; }
    o->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = o; else s->head = o;
    s->tail = o;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static op *new_op(int kind) {
    op *o = calloc(1, sizeof *o);
    o->kind = kind;
    return o;
}

/* ---- the driver API ------------------------------------------------------- */
/* The driver's private tables: libnvrtc (ferry's run-time kernels, src/cuda/
 * nvrtc.c) looks this up in whatever libcuda.so.1 is loaded and crashed when it
 * was missing. The stand-in has none to offer. */
CUresult cuGetExportTable(const void **table, const void *id) {
    (void)id;
    if (table) *table = NULL;
    return E_NOT_FOUND;
}

CUresult cuInit(unsigned flags) {
    (void)flags;
    const char *n = getenv("FERRY_CUDASIM_DEVICES");
    const char *d = getenv("FERRY_CUDASIM_DELAY_US");
    pthread_mutex_lock(&lock_);
    if (!inited_) {
        if (n) ndev_ = atoi(n);
        if (ndev_ < 0) ndev_ = 0;
        if (ndev_ > MAXDEV) ndev_ = MAXDEV;
        if (d) delay_us_ = atol(d);
        for (int i = 0; i < MAXDEV; i++) primary_[i].dev = i;
        inited_ = 1;
    }
    pthread_mutex_unlock(&lock_);
    return OK;
}

CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { if (!inited_) return E_NOT_INITIALIZED; *n = ndev_; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ord) {
    if (!inited_) return E_NOT_INITIALIZED;
    if (ord < 0 || ord >= ndev_) return E_INVALID_DEVICE;
    *d = ord;
    return OK;
}

/* Device d sits at PCI 0000:<0x10 + d>:00.0: a test's fake sysfs
 * (FERRY_SYSFS_ROOT, numa.c) gives those functions their NUMA nodes. */
CUresult cuDeviceGetPCIBusId(char *out, int len, CUdevice d) {
    if (!inited_) return E_NOT_INITIALIZED;
    if (d < 0 || d >= ndev_ || !out || len < 13) return E_INVALID_VALUE;
    snprintf(out, (size_t)len, "0000:%02X:00.0", 0x10 + d);
    return OK;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (d < 0 || d >= ndev_) return E_INVALID_DEVICE;
    pthread_mutex_lock(&lock_);
    primary_[d].refs++;
    pthread_mutex_unlock(&lock_);
    atomic_fetch_add(&count_retains_[d], 1);
    *c = &primary_[d];
    return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (d < 0 || d >= ndev_) return E_INVALID_DEVICE;
    pthread_mutex_lock(&lock_);
    int bad = primary_[d].refs <= 0;
    if (!bad) primary_[d].refs--;
    pthread_mutex_unlock(&lock_);
    return bad ? E_INVALID_CONTEXT : OK;
}

/* Whether device d's primary context is alive (retained and not released). */
CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned *flags, int *active) {
    if (d < 0 || d >= ndev_) return E_INVALID_DEVICE;
    pthread_mutex_lock(&lock_);
    *flags = 0;
    *active = primary_[d].refs > 0;
    pthread_mutex_unlock(&lock_);
    return OK;
}

CUresult cuCtxSetCurrent(CUcontext c) { cur_ = c; return OK; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = cur_; return OK; }

CUresult cuStreamCreate(CUstream *out, unsigned flags) {
    (void)flags;
    if (!cur_) return E_INVALID_CONTEXT;
    struct CUstream_st *s = calloc(1, sizeof *s);
    s->ctx = cur_;
    s->seed = (unsigned)(uintptr_t)s ^ (unsigned)time(NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) { free(s); return E_OUT_OF_MEMORY; }
    *out = s;
    return OK;
}

CUresult cuStreamDestroy_v2(CUstream s) {
    if (!s) return E_INVALID_HANDLE;
    drain(s);   /* the driver lets queued work finish */
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    free(s);
    return OK;
}

CUresult cuStreamGetCtx(CUstream s, CUcontext *c) {
    s = default_stream(s);
    if (!s) { *c = cur_; return cur_ ? OK : E_INVALID_CONTEXT; }
    *c = s->ctx;
    return OK;
}

CUresult cuStreamSynchronize(CUstream s) {
    s = default_stream(s);
    if (!cur_) return E_INVALID_CONTEXT;
    if (s) drain(s);
    return OK;
}

CUresult cuEventCreate(CUevent *e, unsigned flags) {
    (void)flags;
    if (!cur_) return E_INVALID_CONTEXT;
    *e = calloc(1, sizeof **e);
    (*e)->ctx = cur_;
    return OK;
}

CUresult cuEventDestroy_v2(CUevent e) {
    pthread_mutex_lock(&ev_mu_);
    e->destroyed = 1;
    if (e->refs == 0) free(e);
    pthread_mutex_unlock(&ev_mu_);
    return OK;
}

CUresult cuEventRecord(CUevent e, CUstream s) {
    s = default_stream(s);
    int rc = stream_ok(s);
    if (rc) return rc;
    if (e->ctx != (s ? s->ctx : cur_)) return E_INVALID_HANDLE;
    op *o = new_op(OP_RECORD);
    pthread_mutex_lock(&ev_mu_);
    o->ev = e;
    o->gen = ++e->recorded;
    ev_ref(e);
    pthread_mutex_unlock(&ev_mu_);
    submit(s, o);
    return OK;
}

CUresult cuEventQuery(CUevent e) {
    pthread_mutex_lock(&ev_mu_);
    int done = e->completed >= e->recorded;
    pthread_mutex_unlock(&ev_mu_);
    return done ? OK : E_NOT_READY;
}

CUresult cuEventSynchronize(CUevent e) {
    pthread_mutex_lock(&ev_mu_);
    uint64_t want = e->recorded;
    while (e->completed < want) pthread_cond_wait(&ev_cv_, &ev_mu_);
    pthread_mutex_unlock(&ev_mu_);
    return OK;
}

/* The event may belong to any context (the driver allows cross-device waits). */
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
    s = default_stream(s);
    (void)flags;
    int rc = stream_ok(s);
    if (rc) return rc;
    op *o = new_op(OP_WAIT);
    pthread_mutex_lock(&ev_mu_);
    o->ev = e;
    o->gen = e->recorded;
    ev_ref(e);
    pthread_mutex_unlock(&ev_mu_);
    submit(s, o);
    return OK;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    s = default_stream(s);
    int rc = stream_ok(s);
    if (rc) return rc;
    atomic_fetch_add(&count_htod_[cur_->dev], 1);
    if (n && (rc = device_range(dst, n))) return rc;
    op *o = new_op(OP_COPY);
    o->dst = (uint8_t *)(uintptr_t)dst;
    o->n = n;
    if (host_pinned(src, n) || !n) {
        o->src = src;
    } else {                 /* pageable: the driver takes the bytes now */
        atomic_fetch_add(&count_pageable_htod_[cur_->dev], 1);
        o->owned = malloc(n);
        memcpy(o->owned, src, n);
        o->src = o->owned;
    }
    submit(s, o);
    return OK;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    s = default_stream(s);
    int rc = stream_ok(s);
    if (rc) return rc;
    if (n && (rc = device_range(src, n))) return rc;
    op *o = new_op(OP_COPY);
    o->dst = dst;
    o->src = (const uint8_t *)(uintptr_t)src;
    o->n = n;
    int pinned = host_pinned(dst, n) || !n;
    submit(s, o);
    if (!pinned && s) drain(s);   /* pageable: returns when the copy is done */
    return OK;
}

static int range2d(int type, const void *host, CUdeviceptr dev, size_t x, size_t y, size_t pitch,
                   size_t w, size_t h) {
    if (type == FERRY_CU_MEMORYTYPE_DEVICE)
        return h ? device_range(dev + x + y * pitch, (h - 1) * pitch + w) : OK;
    if (type == FERRY_CU_MEMORYTYPE_HOST) return host ? OK : E_INVALID_VALUE;
    return E_INVALID_VALUE;
}

CUresult cuMemcpy2DAsync_v2(const ferry_cu_memcpy2d *c, CUstream s) {
    s = default_stream(s);
    int rc = stream_ok(s);
    if (rc) return rc;
    if (!c->Height || !c->WidthInBytes) return OK;
    if (c->dstMemoryType == FERRY_CU_MEMORYTYPE_DEVICE) atomic_fetch_add(&count_htod_[cur_->dev], 1);
    if (c->srcPitch < c->WidthInBytes || c->dstPitch < c->WidthInBytes) return E_INVALID_VALUE;
    if ((rc = range2d(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY, c->srcPitch,
                      c->WidthInBytes, c->Height)) ||
        (rc = range2d(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY, c->dstPitch,
                      c->WidthInBytes, c->Height)))
        return rc;
    op *o = new_op(OP_COPY);
    o->c2 = *c;
    int src_host = c->srcMemoryType == FERRY_CU_MEMORYTYPE_HOST;
    int dst_host = c->dstMemoryType == FERRY_CU_MEMORYTYPE_HOST;
    const uint8_t *sh = src_host ? (const uint8_t *)c->srcHost + c->srcXInBytes + c->srcY * c->srcPitch : NULL;
    size_t span = (c->Height - 1) * c->srcPitch + c->WidthInBytes;
    if (src_host && !host_pinned(sh, span)) {   /* pageable source: taken now, packed */
        uint8_t *b = malloc(c->WidthInBytes * c->Height);
        for (size_t y = 0; y < c->Height; y++) memcpy(b + y * c->WidthInBytes, sh + y * c->srcPitch, c->WidthInBytes);
        o->owned = b;
    }
    int dst_pageable = dst_host &&
        !host_pinned((uint8_t *)c->dstHost + c->dstXInBytes + c->dstY * c->dstPitch,
                     (c->Height - 1) * c->dstPitch + c->WidthInBytes);
    submit(s, o);
    if (dst_pageable && s) drain(s);
    return OK;
}

/* cuMemcpy: synchronous, on the legacy stream, device or host on either side. */
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    if (!cur_) return E_INVALID_CONTEXT;
    int k1 = 0, k2 = 0, d1, d2;
    if (!n) return OK;
    int a = lookup((uintptr_t)dst, n, &k1, &d1), b = lookup((uintptr_t)src, n, &k2, &d2);
    if (a < 0 || b < 0) return E_INVALID_VALUE;
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return OK;
}

CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    if (!cur_) return E_INVALID_CONTEXT;
    const char *nopin = getenv("FERRY_CUDASIM_NOPIN");
    if (nopin && *nopin == '1') return E_OUT_OF_MEMORY;
    if (posix_memalign(p, 4096, n ? n : 1) != 0) return E_OUT_OF_MEMORY;
    add_region((uintptr_t)*p, n, R_PINNED, cur_->dev);
    atomic_fetch_add(&count_pinned_[cur_->dev], 1);
    atomic_fetch_add(&count_pinned_bytes_[cur_->dev], (long)n);
    long live = atomic_fetch_add(&count_pinned_live_[cur_->dev], (long)n) + (long)n;
    for (long pk = atomic_load(&count_pinned_peak_[cur_->dev]); live > pk;)
        if (atomic_compare_exchange_weak(&count_pinned_peak_[cur_->dev], &pk, live)) break;
    return OK;
}

CUresult cuMemFreeHost(void *p) {
    if (!drop_region((uintptr_t)p, R_PINNED)) return E_INVALID_VALUE;
    free(p);
    return OK;
}

CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
    (void)flags;
    if (!cur_) return E_INVALID_CONTEXT;
    add_region((uintptr_t)p, n, R_REGISTERED, cur_->dev);
    return OK;
}

CUresult cuMemHostUnregister(void *p) {
    return drop_region((uintptr_t)p, R_REGISTERED) ? OK : E_INVALID_VALUE;
}

/* FERRY_CUDASIM_ADJACENT=1: allocations are carved back to back out of one
 * arena (256-byte granules, never reused), as a real driver often places
 * consecutive cuMemAlloc blocks and cupy's pool hands out blocks that touch:
 * a copy spanning two of them must fail as it does there (one copy may not
 * cross allocations), which separately malloc'ed regions would never show. */
static uint8_t *arena_;
static size_t arena_used_;
static pthread_mutex_t arena_mu_ = PTHREAD_MUTEX_INITIALIZER;
#define ARENA_SIZE ((size_t)8 << 30)   /* address space only (MAP_NORESERVE): pages as touched */
static void *arena_take(size_t n) {
    n = (n + 255) & ~(size_t)255;
    pthread_mutex_lock(&arena_mu_);
    if (!arena_) {
        void *a = mmap(NULL, ARENA_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        arena_ = a == MAP_FAILED ? NULL : a;
    }
    void *m = NULL;
    if (arena_ && arena_used_ + n <= ARENA_SIZE) { m = arena_ + arena_used_; arena_used_ += n; }
    pthread_mutex_unlock(&arena_mu_);
    return m;
}
static int adjacent_mode(void) {
    static int v = -1;
    if (v < 0) { const char *e = getenv("FERRY_CUDASIM_ADJACENT"); v = e && *e == '1'; }
    return v;
}

/* FERRY_CUDASIM_MEM: the device's size, 0 when unset (no limit) */
static size_t sim_mem(void) {
    const char *e = getenv("FERRY_CUDASIM_MEM");
    if (!e || !*e) return 0;
    char *end;
    double v = strtod(e, &end);
    size_t mul = *end == 'K' ? 1u << 10 : *end == 'M' ? 1u << 20 : *end == 'G' ? 1u << 30 : 1;
    return v > 0 ? (size_t)(v * (double)mul) : 0;
}

CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total) {
    if (!cur_) return E_INVALID_CONTEXT;
    size_t t = sim_mem() ? sim_mem() : (size_t)80 << 30;
    long live = atomic_load(&count_dev_live_[cur_->dev]);
    *total = t;
    *free_b = live > 0 && (size_t)live >= t ? 0 : t - (size_t)(live > 0 ? live : 0);
    return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (!cur_) return E_INVALID_CONTEXT;
    if (!n) return E_INVALID_VALUE;
    size_t lim = sim_mem();
    if (lim && (size_t)atomic_load(&count_dev_live_[cur_->dev]) + n > lim) return E_OUT_OF_MEMORY;
    void *m;
    if (adjacent_mode()) {
        if (!(m = arena_take(n))) return E_OUT_OF_MEMORY;
    } else if (posix_memalign(&m, 256, n) != 0) return E_OUT_OF_MEMORY;
    memset(m, 0xA5, n);   /* device memory starts as garbage, not zeros */
    add_region((uintptr_t)m, n, R_DEVICE, cur_->dev);
    atomic_fetch_add(&count_dev_allocs_[cur_->dev], 1);
    atomic_fetch_add(&count_dev_bytes_[cur_->dev], (long)n);
    atomic_fetch_add(&count_dev_live_[cur_->dev], (long)n);
    *p = (CUdeviceptr)(uintptr_t)m;
    return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    if (!drop_region((uintptr_t)p, R_DEVICE)) return E_INVALID_VALUE;
    uint8_t *m = (uint8_t *)(uintptr_t)p;
    if (!(arena_ && m >= arena_ && m < arena_ + ARENA_SIZE)) free(m);   /* arena blocks are never reused */
    return OK;
}

CUresult cuPointerGetAttribute(void *out, int attr, CUdeviceptr p) {
    int kind = 0, dev = -1;
    atomic_fetch_add(&count_ptrattr_, 1);
    if (lookup((uintptr_t)p, 1, &kind, &dev) == 0) return E_INVALID_VALUE;
    if (attr == FERRY_CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
        *(unsigned *)out = kind == R_DEVICE ? FERRY_CU_MEMORYTYPE_DEVICE : FERRY_CU_MEMORYTYPE_HOST;
    else if (attr == FERRY_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
        *(int *)out = dev;
    else
        return E_INVALID_VALUE;
    return OK;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
    switch (r) {
    case OK: *s = "no error"; break;
    case E_INVALID_VALUE: *s = "invalid argument"; break;
    case E_OUT_OF_MEMORY: *s = "out of memory"; break;
    case E_NOT_INITIALIZED: *s = "initialization error"; break;
    case E_INVALID_DEVICE: *s = "invalid device ordinal"; break;
    case E_INVALID_CONTEXT: *s = "invalid device context"; break;
    case E_INVALID_HANDLE: *s = "invalid resource handle"; break;
    case E_NOT_FOUND: *s = "named symbol not found"; break;
    case E_NOT_READY: *s = "device not ready"; break;
    default: return E_INVALID_VALUE;
    }
    return OK;
}

CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    (void)image;
    if (!cur_) return E_INVALID_CONTEXT;
    static struct CUmod_st mods[MAXDEV];   /* never unloaded, as by ferry */
    mods[cur_->dev].dev = cur_->dev;
    *m = &mods[cur_->dev];
    return OK;
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    (void)m;
    static struct CUfunc_st swaps[5] = {{0, K_SWAP}, {2, K_SWAP}, {4, K_SWAP}, {8, K_SWAP}, {16, K_SWAP}};
    static struct CUfunc_st scatter = {0, K_SCATTER};
    if (!strcmp(name, "ferry_scatter")) { *f = &scatter; return OK; }
    if (!strcmp(name, "ferry_bswap2")) *f = &swaps[1];
    else if (!strcmp(name, "ferry_bswap4")) *f = &swaps[2];
    else if (!strcmp(name, "ferry_bswap8")) *f = &swaps[3];
    else if (!strcmp(name, "ferry_bswap16")) *f = &swaps[4];
    else if (!strcmp(name, "ferry_adler32_batch")) { static struct CUfunc_st k = {0, K_ADLER}; *f = &k; }
    else if (!strcmp(name, "ferry_place_batch")) { static struct CUfunc_st k = {0, K_PLACE}; *f = &k; }
    else if (!strcmp(name, "ferry_image_xform_batch")) { static struct CUfunc_st k = {0, K_IMGXFORM}; *f = &k; }
    else if (!strcmp(name, "ferry_bitunshuffle_batch")) { static struct CUfunc_st k = {1, K_BITUNSHUFFLE}; *f = &k; }
    else if (!strcmp(name, "ferry_unshuffle_batch")) { static struct CUfunc_st k = {0, K_UNSHUFFLE}; *f = &k; }
    else return E_NOT_FOUND;
    return OK;
}

/* The byteswap kernels: (pointer, element count); ferry_scatter: (packed,
 * table, entry count), the table read when the kernel runs. */
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, CUstream s, void **args, void **extra) {
    s = default_stream(s);
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)extra;
    int rc = stream_ok(s);
    if (rc) return rc;
    atomic_fetch_add(&count_launch_[cur_->dev], 1);
    if (f->kind == K_SCATTER) {
        CUdeviceptr packed = *(CUdeviceptr *)args[0], tab = *(CUdeviceptr *)args[1];
        unsigned long long n = *(unsigned long long *)args[2];
        if (n && ((rc = device_range(tab, n * 24)) || (rc = device_range(packed, 1)))) return rc;
        op *o = new_op(OP_SCATTER);
        o->src = (const uint8_t *)(uintptr_t)packed;
        o->tab = (const uint8_t *)(uintptr_t)tab;
        o->n = n;
        submit(s, o);
        return OK;
    }
    if (f->kind == K_ADLER) {   /* (ptrs, sizes, out, n): the arrays are device memory, read when it runs */
        CUdeviceptr ptrs = *(CUdeviceptr *)args[0], sizes = *(CUdeviceptr *)args[1], out = *(CUdeviceptr *)args[2];
        unsigned long long n = *(unsigned long long *)args[3];
        if (n && ((rc = device_range(ptrs, n * 8)) || (rc = device_range(sizes, n * 8)) || (rc = device_range(out, n * 4))))
            return rc;
        op *o = new_op(OP_ADLER);
        o->dst = (uint8_t *)(uintptr_t)ptrs;
        o->src = (const uint8_t *)(uintptr_t)sizes;
        o->out = (uint32_t *)(uintptr_t)out;
        o->n = n;
        submit(s, o);
        return OK;
    }
    if (f->kind == K_PLACE) {   /* (desc, count): 16 u64 per chunk, read when it runs */
        CUdeviceptr desc = *(CUdeviceptr *)args[0];
        unsigned long long n = *(unsigned long long *)args[1];
        if (n && (rc = device_range(desc, n * 128))) return rc;
        op *o = new_op(OP_PLACE);
        o->src = (const uint8_t *)(uintptr_t)desc;
        o->n = n;
        submit(s, o);
        return OK;
    }
    if (f->kind == K_IMGXFORM) {   /* (desc, count, oh, ow, ch, layout, dt, mean[3], std[3]) */
        CUdeviceptr desc = *(CUdeviceptr *)args[0];
        unsigned long long n = *(unsigned long long *)args[1];
        if (n && (rc = device_range(desc, n * 64))) return rc;
        op *o = new_op(OP_IMGXFORM);
        o->src = (const uint8_t *)(uintptr_t)desc;
        o->n = n;
        o->img = (ferry_cuda_img_params){*(unsigned *)args[2], *(unsigned *)args[3], *(unsigned *)args[4],
                                         *(unsigned *)args[5], *(unsigned *)args[6],
                                         {*(float *)args[7], *(float *)args[8], *(float *)args[9]},
                                         {*(float *)args[10], *(float *)args[11], *(float *)args[12]}};
        submit(s, o);
        return OK;
    }
    if (f->kind == K_UNSHUFFLE || f->kind == K_BITUNSHUFFLE) {   /* (desc, count) */
        CUdeviceptr desc = *(CUdeviceptr *)args[0];
        unsigned long long n = *(unsigned long long *)args[1];
        if (n && (rc = device_range(desc, n * 32))) return rc;
        op *o = new_op(OP_UNSHUFFLE);
        o->src = (const uint8_t *)(uintptr_t)desc;
        o->n = n;
        o->size = f->kind == K_BITUNSHUFFLE;   /* 1: bits */
        submit(s, o);
        return OK;
    }
    CUdeviceptr p = *(CUdeviceptr *)args[0];
    unsigned long long n = *(unsigned long long *)args[1];
    if (n && (rc = device_range(p, n * f->swap))) return rc;
    op *o = new_op(OP_SWAP);
    o->dst = (uint8_t *)(uintptr_t)p;
    o->n = n;
    o->size = f->swap;
    submit(s, o);
    return OK;
}

/* cuLaunchHostFunc: fn(arg) on the stream's thread, after the work queued before it. */
CUresult cuLaunchHostFunc(CUstream s, void (*fn)(void *), void *arg) {
    s = default_stream(s);
    int rc = stream_ok(s);
    if (rc) return rc;
    if (!fn) return E_INVALID_VALUE;
    op *o = new_op(OP_HOST);
    o->fn = fn;
    o->arg = arg;
    submit(s, o);
    return OK;
}

/* For the stand-in nvJPEG: 1 when stream s has work queued or running (the
 * legacy stream never has: it runs on the caller). */
int cudasim_stream_pending(CUstream s) {
    s = default_stream(s);
    if (!s) return 0;
    pthread_mutex_lock(&s->mu);
    int busy = s->head || s->busy;
    pthread_mutex_unlock(&s->mu);
    return busy;
}

/* For the stand-in nvCOMP: 1 when [p, p+n) lies inside one device allocation. */
int cudasim_is_device(CUdeviceptr p, size_t n) {
    int kind = 0, dev = -1;
    return lookup((uintptr_t)p, n ? n : 1, &kind, &dev) == 1 && kind == R_DEVICE;
}
