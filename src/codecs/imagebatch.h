/* imagebatch.h — the state of one ferry_image_batch call, shared by its two
 * files: imagebatch.c (reading, probing, the queue, the CPU decoders, the
 * call) and imagebatch_gpu.c (the device side: scratch memory kept per
 * device, nvJPEG runs, the transform kernel for images either decoder made).
 * imagebatch_gpu.c calls nothing of imagebatch.c. Internal. */
#ifndef FERRY_CODECS_IMAGEBATCH_H
#define FERRY_CODECS_IMAGEBATCH_H
#include "codecs/image.h"
#include "codecs/imagexform.h"
#include "cuda/cuda.h"
#include "cuda/nvjpeg_batch.h"
#include <pthread.h>
#include <stdatomic.h>

#define FERRY_IMGB_GPU_MAX_SIDE 16384u                 /* past this the CPU decodes (FERRY_IMAGE_FB_LARGE) */
#define FERRY_IMGB_RUN_MAX 64                          /* images in one nvJPEG run */
#define FERRY_IMGB_RUN_BYTES ((size_t)256 << 20)       /* pixels of one run (its scratch), unless one image is more */
#define FERRY_IMGB_THREADS_MAX 64                      /* CPU threads of one call */
#define FERRY_IMGB_UP_MAX (FERRY_IMGB_THREADS_MAX + 1) /* upload slots: one per CPU thread and the feeder */
#define FERRY_IMGB_SETS 4                              /* device sets kept per device (calls in flight at once) */

typedef struct ferry_imgb_item {
    int64_t sample;
    uint8_t *data;            /* the encoded bytes */
    size_t size;
    ferry_image_info info;
    ferry_img_sample xs;      /* box and flip */
    int reason;               /* why only the CPU may decode it; -1: nvJPEG may */
    int by;                   /* 0 not decoded, 1 GPU, 2 CPU */
    int hw;                   /* decoded by the hardware JPEG engine */
    int fellback;             /* bound for the GPU, decoded on the CPU: the reason counted */
    int rc;                   /* 0 or the failure's code */
    int fatal;                /* a failure of the call's arguments, not of the image: raised even with SKIP */
    char *msg;                /* its message, naming the shard file, key and member */
    const char *path, *key, *name;
} ferry_imgb_item;

/* A CPU thread's upload slot: its image and descriptor on the device, and
 * two pinned host buffers it decodes into in turn (the copy out of one runs
 * while the thread decodes into the other). */
typedef struct ferry_imgb_slot {
    CUdeviceptr dev;
    size_t dev_size;
    uint8_t *host[2];
    size_t host_size[2];
    CUevent copied[2];               /* recorded behind the copy out of host[k] */
    int next;
} ferry_imgb_slot;

/* The device memory of one call, kept per device for later calls (a pool of
 * FERRY_IMGB_SETS: calls in flight together each take one). nvJPEG runs
 * alternate between two scratch buffers, so a run is decoded while the
 * kernel of the one before reads the other; each buffer has its pinned
 * descriptors, the event recorded behind the last kernel that read it, and
 * a stream of its own for the hardware engine (whose writes are not ordered
 * behind the stream's earlier work: the host waits for scratch_free first,
 * and the caller's stream waits for hw_done). */
typedef struct ferry_imgb_devset {
    int busy;
    CUdeviceptr scratch[2];
    size_t scratch_size[2];
    unsigned long long *desc[2];     /* pinned, FERRY_IMGB_RUN_MAX descriptors */
    CUevent scratch_free[2], hw_done[2];
    CUstream hw_stream[2];
    int next;                        /* the scratch buffer of the next run */
    ferry_imgb_slot slot[FERRY_IMGB_UP_MAX];
} ferry_imgb_devset;

typedef struct ferry_imgb_run {
    ferry_ctx *ctx;
    const ferry_image_batch_args *a;
    ferry_imgb_item *it;
    size_t n;
    ferry_img_out o;
    size_t row;                      /* bytes of one row */
    int device;                      /* -1: a host destination */
    CUstream stream;
    const ferry_cuda_api *cu;
    int gpu, cpu_takes_gpu_items;    /* the feeder runs; CPU threads also take images nvJPEG could */
    int kernel;                      /* device destination and the transform kernel: CPU-decoded images
                                        are uploaded and transformed on the device */
    atomic_size_t next;              /* phase 1 */
    atomic_int failed;               /* RAISE: stop claiming */
    atomic_int next_worker;          /* each decoding thread's upload slot */
    pthread_mutex_t mu;              /* the queue, the CPU rates, the retired regions */
    size_t *cpu_list, ncpu, cpu_next;
    size_t *gpu_list, ngpu, gpu_next, gpu_end;   /* the GPU takes from the front, CPU threads the back */
    int cpu_active;                  /* CPU threads still claiming */
    double cpu_s;                    /* under mu: thread-seconds the CPU threads spent decoding */
    double gpu_s;                    /* the feeder's runs */
    double wait_s;                   /* under mu: thread-seconds decoding threads waited for the device */
    /* device memory and pinned buffers: one set of the device's pool (or the call's own) */
    ferry_imgb_devset *ds;
    int ds_own;                      /* the pool was all taken: freed after the final sync */
    CUdeviceptr *retired;            /* outgrown upload regions (under mu), freed after the final sync */
    size_t nretired, capretired;
} ferry_imgb_run;

/* imagebatch_gpu.c */
/* Take a device set of the pool (or make the call's own): 0 or a code with
 * the message set (a device destination, its context current). */
int ferry_imgb_dev_take(ferry_imgb_run *r);
/* After the stream ran: give the set back (or free the call's own). */
void ferry_imgb_dev_give(ferry_imgb_run *r);
/* Claim the next nvJPEG run from the front of the queue (idx:
 * FERRY_IMGB_RUN_MAX entries); its size, 0 when the GPU is done. */
int ferry_imgb_gpu_claim(ferry_imgb_run *r, size_t *idx);
/* Decode and transform the run idx[0..k) on the GPU: items done get by = 1;
 * the others (nvJPEG refused their group, no memory, the kernel did not
 * start) are left for the caller to decode on the CPU. */
void ferry_imgb_gpu_run(ferry_imgb_run *r, ferry_nvj_batch *b, const size_t *idx, int k);
/* A pinned buffer of slot w for `bytes` of decoded pixels, free to be
 * written (the copy out of it two images ago is done); NULL when pinned
 * memory cannot be had (the caller decodes into its own memory). */
uint8_t *ferry_imgb_upload_buf(ferry_imgb_run *r, int w, size_t bytes);
/* Upload the decoded pixels px of item i (slot w; px the slot's buffer from
 * ferry_imgb_upload_buf, or the caller's own memory) and queue its transform
 * into its row: 0 or a code with the message set. */
int ferry_imgb_upload(ferry_imgb_run *r, const ferry_imgb_item *t, size_t i, int w, uint8_t *px);
/* The kernel's parameters for the call's output. */
ferry_cuda_img_params ferry_imgb_params(const ferry_imgb_run *r);

static inline uint8_t *ferry_imgb_row(const ferry_imgb_run *r, size_t i) {
    return (uint8_t *)r->a->dst.ptr + i * r->row;
}
#endif
