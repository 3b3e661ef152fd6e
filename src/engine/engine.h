/* engine.h — every engine header, for the engine's .c files. Internal.
 * The headers form layers, each including only those below it:
 *   limits.h, file.h, plan.h, fcache.h, sysio.h      leaves
 *   job.h      a job's state (jobstate.c): no workers in it
 *   ctx.h      the context (ctx.c)
 *   worker.h   a worker's resources (worker.c) and the pool (pool.c)
 *   exec.h     running a task (exec.c, pack.c, place.c)
 * job.c (building, submitting and waiting for jobs) and streamwait.c (jobs
 * waiting for callers' CUDA streams) sit on top. */
#ifndef FERRY_ENGINE_H
#define FERRY_ENGINE_H
#include "engine/limits.h"
#include "engine/file.h"
#include "engine/plan.h"
#include "engine/job.h"
#include "engine/ctx.h"
#include "engine/worker.h"
#include "engine/exec.h"
#endif
