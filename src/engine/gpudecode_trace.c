/* gpudecode_trace.c — per-stage time totals of the device decode stage
 * (gpudecode_trace.h says what each stage is). Counters are atomics in the
 * job's GPU state: batches of one job run on many workers at once. Sums are
 * over workers, so a stage's seconds can exceed the job's wall time; compare
 * each with `wall x active workers`. */
#include "engine/gpudecode_trace.h"
#include "engine/knobs.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int ferry_dt_enabled(const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_DECODE_TRACE");
    return s && *s && strcmp(s, "0") != 0;
}

uint64_t ferry_dt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void ferry_dt_add(ferry_decode_trace *tr, ferry_dt_stage s, uint64_t ns) {
    if (tr) atomic_fetch_add(&tr->ns[s], ns);
}

void ferry_dt_lap(ferry_decode_trace *tr, ferry_dt_stage s, uint64_t *t) {
    if (!tr) return;
    uint64_t now = ferry_dt_now();
    atomic_fetch_add(&tr->ns[s], now - *t);
    *t = now;
}

static void max_int(_Atomic int *m, int v) {
    int cur = atomic_load(m);
    while (v > cur && !atomic_compare_exchange_weak(m, &cur, v)) {}
}

static void max_u64(_Atomic uint64_t *m, uint64_t v) {
    uint64_t cur = atomic_load(m);
    while (v > cur && !atomic_compare_exchange_weak(m, &cur, v)) {}
}

static void min_u64(_Atomic uint64_t *m, uint64_t v) {   /* 0 means unset */
    uint64_t cur = atomic_load(m);
    while ((cur == 0 || v < cur) && !atomic_compare_exchange_weak(m, &cur, v)) {}
}

void ferry_dt_batch_begin(ferry_decode_trace *tr) {
    if (!tr) return;
    min_u64(&tr->t_first, ferry_dt_now());
    max_int(&tr->max_active, atomic_fetch_add(&tr->active, 1) + 1);
}

void ferry_dt_in_flight(ferry_decode_trace *tr, int delta, uint64_t items) {
    if (!tr) return;
    int v = atomic_fetch_add(&tr->in_flight, delta) + delta;
    int64_t c = delta > 0 ? (int64_t)items : -(int64_t)items;
    int64_t cv = atomic_fetch_add(&tr->chunks_in_flight, c) + c;
    if (delta > 0) {
        max_int(&tr->max_in_flight, v);
        int64_t cur = atomic_load(&tr->max_chunks_in_flight);
        while (cv > cur && !atomic_compare_exchange_weak(&tr->max_chunks_in_flight, &cur, cv)) {}
        max_u64(&tr->max_call, items);
    }
}

void ferry_dt_mark(_Atomic uint64_t *t, uint64_t v) { min_u64(t, v); }
void ferry_dt_mark_max(_Atomic uint64_t *t, uint64_t v) { max_u64(t, v); }

void ferry_dt_batch_end(ferry_decode_trace *tr, uint64_t chunks, uint64_t items, uint64_t decoded,
                        uint64_t cpu_chunks, uint64_t fallbacks) {
    if (!tr) return;
    atomic_fetch_add(&tr->batches, 1);
    atomic_fetch_add(&tr->chunks, chunks);
    atomic_fetch_add(&tr->items, items);
    atomic_fetch_add(&tr->decoded, decoded);
    atomic_fetch_add(&tr->cpu_chunks, cpu_chunks);
    atomic_fetch_add(&tr->fallbacks, fallbacks);
    min_u64(&tr->min_chunks, chunks ? chunks : 1);
    max_u64(&tr->max_chunks, chunks);
    atomic_fetch_sub(&tr->active, 1);
    max_u64(&tr->t_last, ferry_dt_now());
}

void ferry_dt_report(const ferry_decode_trace *tr, uint64_t job_id, int threads) {
    static const char *const names[FERRY_DT_N] = {"prev_wait", "layout", "slot_wait", "check", "read", "frame", "enqueue",
                                                  "cpu_chunks", "wait", "fallback", "place", "alloc", "shared"};
    char buf[2048];
    size_t n = 0;
    uint64_t b = atomic_load(&tr->batches), first = atomic_load(&tr->t_first), last = atomic_load(&tr->t_last);
    double wall = last > first ? (double)(last - first) * 1e-9 : 0;
    uint64_t dec = atomic_load(&tr->decoded);
    n += (size_t)snprintf(buf + n, sizeof buf - n,
                          "ferry decode trace: job %llu: planned %llu feeders (%llu chunks, %llu cooperative calls of %llu chunks, "
                          "target %.1f MiB per feeder batch; %llu chunks in the one queue, %llu left to the CPU at the end), ran %llu batches, %llu chunks (min %llu, avg %.1f, max %llu per batch), "
                          "%llu nvCOMP items, %.1f MiB decoded in %.4f s (%.2f GB/s), threads %d, batches open (read "
                          "to checked) max %d, decoding (enqueued to waited for) max %d; CPU: %llu chunks in batches, %llu fallbacks, one queue "
                          "%llu chunks (%.1f MiB); %llu allocations; seconds summed over workers:",
                          (unsigned long long)job_id, (unsigned long long)tr->plan_batches,
                          (unsigned long long)tr->plan_chunks, (unsigned long long)tr->plan_calls,
                          (unsigned long long)tr->plan_call, (double)tr->plan_target / 1048576.0,
                          (unsigned long long)tr->plan_shared, (unsigned long long)tr->plan_tail, (unsigned long long)b,
                          (unsigned long long)atomic_load(&tr->chunks), (unsigned long long)atomic_load(&tr->min_chunks),
                          b ? (double)atomic_load(&tr->chunks) / (double)b : 0.0,
                          (unsigned long long)atomic_load(&tr->max_chunks), (unsigned long long)atomic_load(&tr->items),
                          (double)dec / 1048576.0, wall, wall > 0 ? (double)dec / wall * 1e-9 : 0.0, threads,
                          atomic_load(&tr->max_active), atomic_load(&tr->max_in_flight),
                          (unsigned long long)atomic_load(&tr->cpu_chunks), (unsigned long long)atomic_load(&tr->fallbacks),
                          (unsigned long long)atomic_load(&tr->shared_cpu_chunks),
                          (double)atomic_load(&tr->shared_cpu_bytes) / 1048576.0,
                          (unsigned long long)atomic_load(&tr->allocs));
    for (int s = 0; s < FERRY_DT_N && n < sizeof buf; s++) {
        if (s == FERRY_DT_SHARED) continue;
        n += (size_t)snprintf(buf + n, sizeof buf - n, " %s %.4f", names[s], (double)atomic_load(&tr->ns[s]) * 1e-9);
    }
    /* the timeline: where the job's wall time goes (ms from the plan) */
    uint64_t t0 = tr->t_plan;
    const uint64_t marks[7] = {atomic_load(&tr->t_read0), atomic_load(&tr->t_h2d0), atomic_load(&tr->t_nv0),
                               atomic_load(&tr->t_read1), atomic_load(&tr->t_nv1), atomic_load(&tr->t_done), last};
    static const char *const mnames[7] = {"first_read", "first_h2d", "first_nvcomp", "last_read_done", "last_nvcomp",
                                          "last_decode_done", "last_batch_end"};
    if (n < sizeof buf) n += (size_t)snprintf(buf + n, sizeof buf - n, "; timeline ms from plan:");
    for (int k = 0; k < 7 && n < sizeof buf; k++) {
        if (marks[k] && t0 && marks[k] >= t0) n += (size_t)snprintf(buf + n, sizeof buf - n, " %s %.3f", mnames[k], (double)(marks[k] - t0) * 1e-6);
        else n += (size_t)snprintf(buf + n, sizeof buf - n, " %s -", mnames[k]);
    }
    if (n < sizeof buf)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "; GPU: max chunks in flight %lld, max chunks per call %llu",
                              (long long)atomic_load(&tr->max_chunks_in_flight), (unsigned long long)atomic_load(&tr->max_call));
    fprintf(stderr, "%s\n", buf);
}
