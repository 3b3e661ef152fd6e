/* runstream.h — ferry_run of a large GPU-decoded read as a stream of jobs
 * (runstream.c says when and why). Internal. */
#ifndef FERRY_ENGINE_RUNSTREAM_H
#define FERRY_ENGINE_RUNSTREAM_H
#include "common.h"

/* Runs plan as a stream of jobs when it should: *ran = 1, and the result is
 * the bytes moved or a negative code. *ran = 0: nothing ran; the result is 0
 * (run it as one job) or a negative code (FERRY_RUN_PIECES is malformed). */
int64_t ferry_run_stream(ferry_ctx *ctx, const ferry_plan *plan, const ferry_run_opts *opts, int *ran);

#endif
