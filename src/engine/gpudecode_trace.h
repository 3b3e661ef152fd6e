/* gpudecode_trace.h — where the device decode stage spends its time
 * (gpudecode_trace.c): per-stage totals over every batch of one job, batch
 * shapes, and how many batches were in flight at once. On when
 * FERRY_DECODE_TRACE=1; then each job that planned GPU batches writes one
 * line to stderr when it is freed (a diagnostic the user asked for by name;
 * nothing else in the library prints). Internal. */
#ifndef FERRY_GPUDECODE_TRACE_H
#define FERRY_GPUDECODE_TRACE_H
#include <stdatomic.h>
#include <stdint.h>

typedef enum ferry_dt_stage {
    FERRY_DT_PREV = 0,   /* waiting for the slot's previous batch before reusing its buffers */
    FERRY_DT_LAYOUT,     /* a batch's places in staging, buffer growth (cooperative: once per context) */
    FERRY_DT_SLOTWAIT,   /* cooperative: waiting for a call's slot (its previous call checked) or its setup */
    FERRY_DT_CHECK,      /* cooperative: checking other feeders' calls (finish_batch, its decode wait included) */
    FERRY_DT_READ,       /* pread of the batch's chunks into pinned staging */
    FERRY_DT_FRAME,      /* CPU checks (crc32c, fletcher32) and framing of every chunk */
    FERRY_DT_ENQUEUE,    /* temp sizes, arrays, the H2D copy, nvCOMP and filter kernels enqueued */
    FERRY_DT_CPU,        /* chunks of the batch the CPU decodes (framing the GPU cannot take, fills) */
    FERRY_DT_WAIT,       /* waiting for the batch's decode (its event) */
    FERRY_DT_FALLBACK,   /* chunks nvCOMP failed, decoded again on the CPU */
    FERRY_DT_PLACE,      /* CPU-decoded chunks up, scatter of scratch into the destination enqueued */
    FERRY_DT_ALLOC,      /* buffer growth (pinned / device): included in the stage it happens in */
    FERRY_DT_SHARED,     /* one-queue chunks the CPU workers took (their time is theirs, not counted) */
    FERRY_DT_N
} ferry_dt_stage;

typedef struct ferry_decode_trace {
    _Atomic uint64_t ns[FERRY_DT_N];
    _Atomic uint64_t batches, chunks, items, decoded, cpu_chunks, fallbacks, allocs;
    _Atomic uint64_t shared_cpu_chunks, shared_cpu_bytes;   /* the one queue: taken by CPU workers */
    _Atomic uint64_t min_chunks, max_chunks;
    _Atomic uint64_t t_first, t_last;                        /* first batch start, last batch end (ns) */
    _Atomic int active, max_active;                          /* batches between read and checked */
    _Atomic int in_flight, max_in_flight;                    /* batches enqueued and not yet waited for */
    /* the job's timeline (ns, CLOCK_MONOTONIC; 0 unset): planned, first pread,
     * first copy up, first nvCOMP call enqueued, last pread done, last nvCOMP
     * call enqueued, last decode seen complete */
    uint64_t t_plan;
    _Atomic uint64_t t_read0, t_h2d0, t_nv0, t_read1, t_nv1, t_done;
    _Atomic int64_t chunks_in_flight, max_chunks_in_flight;  /* nvCOMP items enqueued, not yet waited for */
    _Atomic uint64_t max_call;                                /* most items in one batch's calls */
    /* the plan */
    uint64_t plan_batches /* feeders */, plan_target, plan_chunks, plan_shared;
    uint64_t plan_calls, plan_call;   /* cooperative calls, chunks in the first */
    uint64_t plan_tail;               /* chunks AUTO left to the CPU at a cooperative queue's end */
} ferry_decode_trace;

/* FERRY_DECODE_TRACE=1 as ctx reads it (ferry_knob: no_env ignores it; read at
 * every call: a job plans once). */
struct ferry_ctx;
int ferry_dt_enabled(const struct ferry_ctx *ctx);
uint64_t ferry_dt_now(void);
/* Add the time since *t to stage s and set *t to now (tr may be NULL: nothing). */
void ferry_dt_lap(ferry_decode_trace *tr, ferry_dt_stage s, uint64_t *t);
void ferry_dt_add(ferry_decode_trace *tr, ferry_dt_stage s, uint64_t ns);
void ferry_dt_batch_begin(ferry_decode_trace *tr);
/* A batch of `items` nvCOMP inputs enqueued (delta 1) or waited for (-1). */
void ferry_dt_in_flight(ferry_decode_trace *tr, int delta, uint64_t items);
/* *t = v if unset or later than v (first events) / earlier than v (last). */
void ferry_dt_mark(_Atomic uint64_t *t, uint64_t v);
void ferry_dt_mark_max(_Atomic uint64_t *t, uint64_t v);
void ferry_dt_batch_end(ferry_decode_trace *tr, uint64_t chunks, uint64_t items, uint64_t decoded,
                        uint64_t cpu_chunks, uint64_t fallbacks);
/* One line on stderr: "ferry decode trace: job N: ...". */
void ferry_dt_report(const ferry_decode_trace *tr, uint64_t job_id, int threads);
#endif
