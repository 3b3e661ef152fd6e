/* ferry_experimental.h — interfaces whose shape may still change between
 * minor versions. Include it after (or instead of) ferry.h; ferry.h does not
 * include it. Its functions are exported like ferry.h's (`make test-c`
 * checks `nm -D` against both headers).
 */
#ifndef FERRY_EXPERIMENTAL_H
#define FERRY_EXPERIMENTAL_H

#include "ferry.h"

#ifdef __cplusplus
extern "C" {
#endif
FERRY_API_BEGIN

/* ------------------------------------------------------------------------- */
/* Device memory budget of a stream of jobs                                   */
/* ------------------------------------------------------------------------- */
/** What a stream of jobs (a dataset's groups of batches, each read while the
 *  one before is consumed) may hold on its device: ferry_plan_budget. */
typedef struct ferry_budget {
    uint64_t units;            /* whole units (the caller's unit_bytes) one job holds, >= 1 */
    uint64_t job_bytes;        /* units x unit_bytes: the decoded bytes of one job */
    int jobs;                  /* jobs to keep in the engine at once, besides the one being
                                  consumed: 2, or 1 where two do not fit; 0 where nothing is
                                  decoded on the GPU (any number: only the destinations count) */
    uint64_t job_device_bytes; /* device memory ferry's decode of one such job holds at most
                                  (compressed inputs, nvCOMP's temp space, call arrays) */
    uint64_t device_bytes;     /* all the stream holds at most: jobs + 2 destinations (the jobs in
                                  the engine, the one consumed, the next one allocated while it
                                  waits for room) and jobs x job_device_bytes */
    uint64_t free_bytes;       /* the device's free memory at the call, after ferry gave back
                                  its idle decode buffers there (0: the driver cannot say) */
    uint64_t keep_free;        /* what the budget leaves free (keep_free, or its default) */
} ferry_budget;

/** keep_free value asking for the default: a quarter of the free memory, 64 MiB at least. */
#define FERRY_KEEP_FREE_DEFAULT UINT64_MAX

/** The size of each job and how many to keep in the engine when plans like
 *  `like` are run as a stream of jobs, one rule for every dataset.
 *  `like`: a plan like the caller's jobs (one unit is enough), only inspected
 *  for what its chunks are decoded by under `decode` (a ferry_decode_policy;
 *  FERRY_DECODE_AUTO: the context's), their device and their largest chunk;
 *  its addresses need not be real. `unit_bytes`: the destination bytes of one
 *  unit a job holds a whole number of (a batch). `keep_free`: device bytes the
 *  stream leaves free at all times for the caller's own use (a model's next
 *  allocations), FERRY_KEEP_FREE_DEFAULT for the default.
 *
 *  Chunks nvCOMP's deflate and zstd decode (ferry_plan_job_bytes says why)
 *  ask for jobs of 2.5 GiB of their bytes, two in the engine. Each job in the
 *  engine holds its destination and ferry's decode memory (job_device_bytes:
 *  the call slots its calls take, each call's compressed input and nvCOMP's
 *  temp space, dev_per_byte times the call's decoded bytes, plus rounding);
 *  the caller holds two more destinations. The job is the most units
 *  (at most the 2.5 GiB) for which all of it, device_bytes, fits in the free
 *  memory less keep_free with two jobs in the engine; where even one unit
 *  does not fit two, one job; where one does not fit either, FERRY_ENOMEM
 *  with a message naming the device, what one job of one unit needs, what
 *  is free, and how to lower it. The context's idle decode buffers on the
 *  device (call slots of earlier jobs) are given back first, and the context
 *  remembers keep_free for the device: from then on a job that ends gives
 *  its idle decode buffers there back whenever the free memory is below it,
 *  so that the caller's next allocation finds them free.
 *  Nothing decoded on the GPU (host destinations, CPU codecs, the CPU policy,
 *  no nvCOMP): units 1 and jobs 0. Returns 0 or a negative ferry_status. */
int ferry_plan_budget(ferry_ctx *ctx, const ferry_plan *like, int decode, uint64_t unit_bytes, uint64_t keep_free,
                      ferry_budget *out);

FERRY_API_END
#ifdef __cplusplus
}
#endif
#endif
