/* runstream.c — ferry_run of a large GPU-decoded read as a stream of jobs.
 *
 * nvCOMP's deflate and zstd keep their rate only in jobs of thousands of
 * chunks, and a job's GPU calls wait for its reads: the last call of a job
 * decodes while nothing else is read, and its reads ran while the GPU had
 * little to do. A dataset's stream of jobs of ferry_plan_job_bytes each, two
 * in the engine, overlaps one job's reads with the other's decode calls: on
 * the H200 (2026-12-04, BENCHMARKS.md, sixteenth session) it read the same
 * 16 GiB sets 1.14-1.45 x faster than one .load() of each as a single job
 * (netCDF-4 28.87 against 22.26 GB/s, Zarr zstd 54.59 against 43.13). So
 * ferry_run, which every whole read reaches (ferry.read, read_many, the
 * xarray backend's .load(), the C API), runs a plan of at least two such
 * jobs' worth the same way: cut at extent boundaries into pieces of equal
 * decoded bytes, at most two in the engine, the next submitted when the
 * oldest completes.
 *
 * What may be cut: reads and fills only (a write plan's FERRY_SYNC is one
 * durable unit), and no caller's stream to wait for (each piece would record
 * its own event at its own time; one event for all is what the caller asked
 * for). The extents of a plan are independent of each other — a job runs
 * them in any order on any worker — so pieces change no result. A failed
 * piece cancels the rest; the first error is returned with its message, and
 * nothing runs after ferry_run returns.
 *
 * FERRY_RUN_PIECES=N (an experiment's knob, as FERRY_GPU_* are): exactly N
 * pieces (1: one job, as before); unset or "auto": the rule above. */
#include "engine/engine.h"
#include "engine/plan.h"
#include "engine/runstream.h"
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

enum { IN_ENGINE = 2 };   /* as XarrayDataset's engine-sized groups (_ENGINE_JOBS) */

static uint64_t ext_bytes(const ferry_extent *e) { return e->decoded_size ? e->decoded_size : e->length; }

/* The pieces a plan should run as: 1 when it runs as one job. */
static int run_pieces(ferry_ctx *ctx, const ferry_plan *plan, const ferry_run_opts *opts, uint64_t *total_out) {
    if (plan->nwait || plan->n < 2) return 1;
    uint64_t total = 0;
    for (size_t i = 0; i < plan->n; i++) {
        if (plan->ext[i].kind != FERRY_EXTENT_READ && plan->ext[i].kind != FERRY_EXTENT_FILL) return 1;
        total += ext_bytes(&plan->ext[i]);
    }
    *total_out = total;
    const char *s = getenv("FERRY_RUN_PIECES");
    if (s && *s && strcasecmp(s, "auto")) {
        long v = atol(s);
        return v < 1 ? 1 : v > (long)plan->n ? (int)plan->n : (int)v;
    }
    uint64_t piece = ferry_plan_job_bytes(ctx, plan, opts ? opts->decode : FERRY_DECODE_AUTO);
    if (!piece || total < 2 * piece) return 1;
    uint64_t n = (total + piece / 2) / piece;   /* the nearest count of pieces of about `piece` */
    return n > plan->n ? (int)plan->n : (int)n;
}

static int pieces_knob_check(void) {
    const char *s = getenv("FERRY_RUN_PIECES");
    if (!s || !*s || !strcasecmp(s, "auto")) return 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 1)
        return ferry_seterr(FERRY_EINVAL, "FERRY_RUN_PIECES=\"%s\": use auto or a count of jobs (1: one job)", s);
    return 0;
}

/* Wait for and destroy job j; the first error (code and message) is kept. */
static void finish(ferry_job *j, int64_t *bytes, int *err, char *msg, size_t cap) {
    int64_t r = ferry_job_wait(j, -1);
    if (r < 0 && !*err) {
        *err = (int)r;
        snprintf(msg, cap, "%s", ferry_lasterr());
    } else if (r > 0) {
        *bytes += r;
    }
    ferry_job_destroy(j);
}

int64_t ferry_run_stream(ferry_ctx *ctx, const ferry_plan *plan, const ferry_run_opts *opts, int *ran) {
    *ran = 0;
    if (!ctx || !plan) return 0;   /* ferry_submit says what is wrong */
    uint64_t total = 0;
    int rc = pieces_knob_check();
    if (rc < 0) return rc;
    int pieces = run_pieces(ctx, plan, opts, &total);
    if (pieces <= 1) return 0;
    *ran = 1;
    ferry_job *flight[IN_ENGINE] = {0};
    int head = 0, live = 0, err = 0;
    int64_t bytes = 0;
    char msg[1024] = "";
    size_t a = 0;
    uint64_t acc = 0;   /* decoded bytes of extents [0, a) */
    for (int k = 0; k < pieces && !err && a < plan->n; k++) {
        /* [a, b): the extents up to the (k+1)-th equal share of the decoded bytes */
        uint64_t goal = total / (uint64_t)pieces * (uint64_t)(k + 1);
        size_t b = a;
        if (k == pieces - 1) b = plan->n;
        else
            while (b < plan->n && (b == a || acc < goal)) acc += ext_bytes(&plan->ext[b++]);
        if (live == IN_ENGINE) {   /* room: the oldest completes first */
            finish(flight[head], &bytes, &err, msg, sizeof msg);
            flight[head] = NULL;
            head = (head + 1) % IN_ENGINE;
            live--;
            if (err) break;
        }
        ferry_plan view = *plan;   /* the same places and strings, a run of the extents */
        view.ext = plan->ext + a;
        view.n = b - a;
        ferry_job *j;
        rc = ferry_submit(ctx, &view, opts, &j);
        if (rc < 0) {
            err = rc;
            snprintf(msg, sizeof msg, "%s", ferry_lasterr());
            break;
        }
        flight[(head + live) % IN_ENGINE] = j;
        live++;
        a = b;
    }
    if (err)
        for (int i = 0; i < live; i++) ferry_job_cancel(flight[(head + i) % IN_ENGINE]);
    for (; live > 0; live--, head = (head + 1) % IN_ENGINE) finish(flight[head], &bytes, &err, msg, sizeof msg);
    if (err) return ferry_seterr(err, "%s", msg);
    return bytes;
}
