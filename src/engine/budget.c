/* budget.c — ferry_plan_budget (include/ferry_experimental.h): how large each
 * job of a stream of jobs should be and how many to keep in the engine, from
 * every device byte the stream holds.
 *
 * A dataset reads groups of batches as jobs: one is consumed while the
 * engine runs the next ones. nvCOMP's deflate and zstd decoders fill the GPU
 * only with thousands of chunks in flight, so such a stream asks for jobs of
 * 2.5 GiB, two in the engine (gpudecode.c's stream_bytes and the dataset's
 * measurements say why). Beside a model that leaves little free memory, all
 * of what the stream holds must fit what is free less what the caller keeps
 * for itself:
 *   (jobs + 2) x job_bytes          destinations: the jobs in the engine, the
 *                                   group being consumed, and the next one,
 *                                   allocated while it waits for room
 * + jobs x job_device_bytes         ferry's decode memory of each job in the
 *                                   engine: its call slots (compressed inputs,
 *                                   nvCOMP's temp space, arrays), dev_per_byte
 *                                   times its largest call per slot it takes,
 *                                   plus the buffers' rounding
 *                                   (ferry_gpudecode_job_device_bytes)
 * <= free - keep_free.
 * Sized by a share of the free memory alone (ferry_plan_job_bytes: 1/26 of
 * it for zstd), XarrayDataset over Zarr zstd beside a model that left 256 MiB
 * free held its groups, its jobs' call slots and the idle sets of earlier
 * jobs, and torch found 2 MiB free for the next 12 MiB group (an 80 GB
 * GPU, tests/gpu). Here the idle sets are given back before the free memory is
 * measured, and the keep_free promise is remembered for the device so that
 * a job's end gives its set back whenever the free memory is below it
 * (gpudecode_dev.c, set_release).
 * Two jobs in the engine, then one, then a clear error: a single job of one
 * unit that does not fit would fail later in the caller's own allocation or
 * in the decode's, far from the cause. */
#include "engine/ctx.h"
#include "engine/gpudecode.h"
#include "engine/plan.h"
#include "cuda/nvcomp.h"
#include "ferry_experimental.h"

#define KEEP_FREE_MIN ((uint64_t)64 << 20)
#define UNIT_MAX ((uint64_t)1 << 50)

/* What a stream of `jobs` jobs of `units` units holds on the device. */
static uint64_t stream_bytes(const ferry_gpudecode_cost *c, uint64_t unit, uint64_t units, int jobs, uint64_t *dec) {
    const uint64_t job = unit * units;
    *dec = ferry_gpudecode_job_device_bytes(c, job, jobs);
    return (uint64_t)(jobs + 2) * job + (uint64_t)jobs * *dec;
}

/* The most units (1 .. most) whose stream fits `room` with `jobs` jobs in
 * the engine, or 0 when one does not: what the stream holds grows with the
 * units, so a bisection finds it. */
static uint64_t most_units(const ferry_gpudecode_cost *c, uint64_t unit, uint64_t most, int jobs, uint64_t room) {
    uint64_t dec;
    if (stream_bytes(c, unit, 1, jobs, &dec) > room) return 0;
    uint64_t lo = 1, hi = most;
    while (lo < hi) {
        const uint64_t mid = lo + (hi - lo + 1) / 2;
        if (stream_bytes(c, unit, mid, jobs, &dec) <= room) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static unsigned long long mib_up(uint64_t b) { return (unsigned long long)((b >> 20) + ((b & ((1u << 20) - 1)) != 0)); }

static const char *class_name(int cls) {
    return cls == FERRY_NVCOMP_ZSTD ? "zstd" : cls == FERRY_NVCOMP_DEFLATE ? "deflate" : cls == FERRY_NVCOMP_LZ4 ? "lz4" : "blosc";
}

int ferry_plan_budget(ferry_ctx *ctx, const ferry_plan *like, int decode, uint64_t unit_bytes, uint64_t keep_free,
                      ferry_budget *out) {
    if (!out) return ferry_seterr(FERRY_EINVAL, "ferry_plan_budget: out is NULL");
    memset(out, 0, sizeof *out);
    if (!ctx || !like) return ferry_seterr(FERRY_EINVAL, "ferry_plan_budget: %s is NULL", ctx ? "the plan" : "the context");
    if (!unit_bytes) return ferry_seterr(FERRY_EINVAL, "ferry_plan_budget: unit_bytes is 0 (the bytes of one batch)");
    /* what a stream of such units holds is computed in 64 bits: a unit of a
     * pebibyte or more fits no device (and would overflow) */
    if (unit_bytes > UNIT_MAX) unit_bytes = UNIT_MAX;
    if (decode < FERRY_DECODE_AUTO || decode > FERRY_DECODE_CPU)
        return ferry_seterr(FERRY_EINVAL, "ferry_plan_budget: decode policy %d (auto, gpu or cpu)", decode);
    out->units = 1;
    out->job_bytes = unit_bytes;
    ferry_gpudecode_cost c;
    ferry_gpudecode_cost_of(ctx, like, decode, &c);
    if (!c.want || c.dev < 0 || c.dev >= FERRY_MAX_DEVICES) return 0;   /* nothing decoded on the GPU: any size, any number */
    /* the units the stream asks for: its 2.5 GiB, one at least */
    uint64_t most = c.want / unit_bytes + (c.want % unit_bytes != 0);
    if (most < 1) most = 1;
    /* the context's idle call slots on the device go back first: the jobs
     * will grow their own, and what they held is then measured as free */
    ferry_gpudecode_give_back(ctx, c.dev);
    uint64_t free_b = 0;
    if (!ferry_gpudecode_dev_free(c.dev, &free_b)) {   /* the driver cannot say: no cap */
        out->units = most;
        out->job_bytes = most * unit_bytes;
        out->jobs = 2;
        out->device_bytes = stream_bytes(&c, unit_bytes, most, 2, &out->job_device_bytes);
        out->keep_free = keep_free == FERRY_KEEP_FREE_DEFAULT ? 0 : keep_free;
        return 0;
    }
    if (keep_free == FERRY_KEEP_FREE_DEFAULT) keep_free = FERRY_MAX(free_b / 4, KEEP_FREE_MIN);
    out->free_bytes = free_b;
    out->keep_free = keep_free;
    const uint64_t room = free_b > keep_free ? free_b - keep_free : 0;
    for (int jobs = 2; jobs >= 1; jobs--) {
        const uint64_t u = most_units(&c, unit_bytes, most, jobs, room);
        if (!u) continue;
        out->units = u;
        out->job_bytes = u * unit_bytes;
        out->jobs = jobs;
        out->device_bytes = stream_bytes(&c, unit_bytes, u, jobs, &out->job_device_bytes);
        atomic_store(&ctx->gpu_keep_free[c.dev], keep_free);
        return 0;
    }
    uint64_t dec;
    const uint64_t need = stream_bytes(&c, unit_bytes, 1, 1, &dec);
    return ferry_seterr(FERRY_ENOMEM,
                        "device %d: a stream of jobs whose %s chunks are decoded on the GPU needs %llu MiB at least "
                        "(one job of one unit of %llu MiB in the engine: its destination and %llu MiB of decode buffers; "
                        "two more destinations, the one consumed and the next one) beside the %llu MiB kept free, and "
                        "the device has %llu MiB free: lower it with a smaller unit (batch size), less kept free, "
                        "or decode on the CPU (decode=\"cpu\", FERRY_DECODE=cpu)",
                        c.dev, class_name(c.cls), mib_up(need), mib_up(unit_bytes), mib_up(dec),
                        mib_up(keep_free), (unsigned long long)(free_b >> 20));
}
