/* gpudecode.h — the engine's device decode stage (gpudecode*.c, listed in
 * gpudecode_impl.h): compressed chunks bound for device memory decoded by
 * batched nvCOMP calls. Internal; the engine calls these hooks and nothing else. */
#ifndef FERRY_GPUDECODE_H
#define FERRY_GPUDECODE_H
#include "engine/engine.h"

/* A task whose ext field is this is the device decode stage's: task
 * number lo < feeders is a GPU feeder (ferry_gpudecode_run), the others take
 * one chunk each from a shared queue for the CPU (ferry_gpudecode_take_one). */
#define FERRY_GPU_TASK UINT32_MAX

/* At job build, after extents are resolved: pick the extents the GPU decodes
 * (policy, nvCOMP, codec chain, device destination) and put them in queues
 * (one per device and class), stored in job->gpu: GPU-only queues, and
 * shared ones that GPU feeders and CPU workers drain together (AUTO where
 * both together measured faster). Returns 0 (none: job->gpu stays NULL) or a
 * negative code (decode="gpu" forced but nvCOMP cannot run: FERRY_EPATH). */
int ferry_gpudecode_plan(ferry_job *job, int decode_policy);
/* 1 when extent i is in a queue (make_tasks makes no task of its own for it). */
int ferry_gpudecode_owns(const ferry_job *job, size_t i);
/* Number of FERRY_GPU_TASK tasks make_tasks adds (lo = 0 .. n-1): the feeders,
 * then one per chunk of the shared queues. */
size_t ferry_gpudecode_tasks(const ferry_job *job);
/* 1 when FERRY_GPU_TASK task number t is a feeder. */
int ferry_gpudecode_is_feeder(const ferry_job *job, size_t t);
/* A feeder on worker w: reads pieces of the job's cooperative calls (every
 * feeder at once), then claims per-feeder batches of shared queues until they
 * are empty, and returns the file bytes of the calls and batches it checked
 * once its device work is complete (*deferred = 0), or a negative code with a
 * message naming the file, chunk and codec. */
int64_t ferry_gpudecode_run(ferry_worker *w, ferry_job *job, size_t task, int *deferred);
/* The next chunk of a shared queue for the CPU (its extent index), or -1
 * when the queues are empty (the GPU took the rest). */
int64_t ferry_gpudecode_take_one(ferry_job *job);
void ferry_gpudecode_job_free(ferry_job *job);
/* 1 when extent e of job, decoded on the CPU, is a chunk a forced GPU decode
 * sent there (counted in ferry_stats.gpu_cpu_fallbacks): decode "gpu", a
 * device destination, a chain with a decompressing codec. exec.c asks it of
 * every chunk it decodes; the stage counts its own (failed or refused) ones. */
int ferry_gpudecode_is_fallback(const ferry_job *job, const ferry_extent *e);
/* Where a codec step is decoded for a device destination under `policy`
 * (AUTO or GPU; CPU is always the CPU): FERRY_ROUTE_*. ferry info --codecs
 * prints the table this makes (docs/decoding.md has it, checked by a test). */
enum { FERRY_ROUTE_CPU = 0, FERRY_ROUTE_GPU = 1, FERRY_ROUTE_BOTH = 2, FERRY_ROUTE_STEP = 3 };
int ferry_gpudecode_route(uint32_t codec, int policy);
/* One line on how the GPU takes codec (NULL: nothing to add). */
const char *ferry_gpudecode_route_note(uint32_t codec);
/* Chunks per cooperative nvCOMP call for a queue of `count` chunks of class
 * `cls` (a ferry_nvcomp_alg), the largest `max_chunk` decoded bytes, `nslots`
 * calls in flight, `dev_free` bytes of device memory to grow into (0: not
 * known), `jobs` jobs in flight on the context with this one (gpudecode.c
 * says why; exposed for tests/gpu/test_gpu_decode.c). */
size_t ferry_gpudecode_call_chunks(size_t count, uint64_t max_chunk, int nslots, int cls, uint64_t dev_free, int jobs);
/* Where a batch's next chunk goes in its pinned buffer (the first offset at
 * or after `at`: at the chunk's place in a 64-byte line of its file, file
 * offset `file_off`, moved down so that its payload, `hdr` bytes in, is
 * `align`-aligned), and the most bytes a chunk of `len` bytes takes that
 * way (gpudecode.c says why; exposed for tests/c). */
uint64_t ferry_gpudecode_slot(uint64_t at, uint64_t file_off, unsigned hdr, unsigned align);
uint64_t ferry_gpudecode_slot_room(uint64_t len);
/* The context's slot sets for cooperative calls (ctx.c makes and frees it). */
typedef struct ferry_gpudecode_pool ferry_gpudecode_pool;
ferry_gpudecode_pool *ferry_gpudecode_pool_new(void);
void ferry_gpudecode_pool_free(ferry_gpudecode_pool *p);
void ferry_gpudecode_worker_free(ferry_worker *w);

/* What a plan's chunks cost on the device when decoded there under a policy
 * (ferry_plan_budget in budget.c, ferry_plan_job_bytes). */
typedef struct ferry_gpudecode_cost {
    const ferry_ctx *ctx; /* whose knobs (FERRY_GPU_SLOTS) apply */
    int dev;              /* destination device of the chunks the GPU decodes; -1: none */
    int cls;              /* the class whose stream asks the largest job */
    uint64_t want;        /* decoded bytes one job of a stream should hold; 0: any size runs at the
                             rate (nothing decoded on the GPU, or only codecs that need no large job) */
    unsigned per_byte;    /* device bytes a call in flight holds per decoded byte (the plan's most) */
    uint64_t max_chunk;   /* the largest decoded chunk the GPU decodes */
    double in_per_out;    /* their compressed bytes per decoded byte */
    int scratch;          /* some decode into scratch first (not one contiguous run of their destination, or shuffled) */
} ferry_gpudecode_cost;
void ferry_gpudecode_cost_of(ferry_ctx *ctx, const ferry_plan *plan, int policy, ferry_gpudecode_cost *out);
/* Device memory the decode of one job of job_bytes holds at most, with `jobs`
 * jobs of the stream in flight: the call slots its calls take (as
 * ferry_gpudecode_call_chunks cuts them on a device with room), each grown to
 * the largest call — its compressed input, arrays, nvCOMP's temp space (as
 * nvCOMP says), scratch — with their buffers' rounding. */
uint64_t ferry_gpudecode_job_device_bytes(const ferry_gpudecode_cost *c, uint64_t job_bytes, int jobs);
/* The driver's free memory on device dev: 1, or 0 where it cannot say. */
int ferry_gpudecode_dev_free(int dev, uint64_t *free_b);
/* The context's idle decode buffers on device dev given back to the driver;
 * the number of call-slot sets freed. */
size_t ferry_gpudecode_give_back(ferry_ctx *ctx, int dev);
#endif
