/* streamwait.c — jobs that wait for their callers' CUDA streams
 * (ferry_plan_wait_stream, include/ferry.h says what is waited for).
 *
 * At submit, on the caller's thread, an event is recorded on each stream the
 * plan names, in the stream's context; before a job's task runs, its worker
 * waits for every event on the host (cuEventSynchronize). Why on the host and
 * not cuStreamWaitEvent on the workers' streams: cuFile reads and writes
 * device memory outside any stream, and host memory that a stream's
 * device-to-host copy fills is read by the CPU; one host wait is right on
 * every path. Once a worker has seen every event complete, the job's other
 * tasks skip the driver. */
#include "engine/engine.h"

int ferry_plan_wait_stream(ferry_plan *p, int device, void *stream) {
    if (!p) return ferry_seterr(FERRY_EINVAL, "ferry_plan_wait_stream: NULL plan");
    if (device < -1 || device >= FERRY_MAX_DEVICES)
        return ferry_seterr(FERRY_EINVAL, "ferry_plan_wait_stream: CUDA device %d", device);
    for (int i = 0; i < p->nwait; i++)
        if (p->wait_stream[i] == stream && p->wait_device[i] == device) return 0;
    if (p->nwait == FERRY_MAX_WAIT_STREAMS)
        return ferry_seterr(FERRY_EINVAL, "ferry_plan_wait_stream: more than %d streams", FERRY_MAX_WAIT_STREAMS);
    p->wait_stream[p->nwait] = stream;
    p->wait_device[p->nwait++] = device;
    return 0;
}

/* The context stream s of `device` is taken in (see ferry.h); made current. */
static int stream_context(const ferry_cuda_api *cu, void *s, int device, int first_dev, CUcontext saved,
                          CUcontext *out) {
    CUcontext c = NULL;
    if ((uintptr_t)s > 2 && cu->StreamGetCtx) {   /* a stream of its own (not NULL, legacy, per-thread) */
        CUresult r = cu->StreamGetCtx((CUstream)s, &c);
        if (r != 0)
            return ferry_seterr(FERRY_EINVAL, "ferry_plan_wait_stream: %p is not a CUDA stream: %s", s,
                                ferry_cuda_errstr(r));
    } else if (device < 0) {
        c = saved;
        if (!c) device = first_dev;
    }
    if (!c) {
        if (device < 0)
            return ferry_seterr(FERRY_EINVAL, "ferry_plan_wait_stream: a default stream with device -1, but no "
                                "CUDA context is current and the plan names no device memory");
        int rc = ferry_cuda_use_device(device);
        if (rc < 0) return rc;
        *out = ferry_cuda_current();
        return 0;
    }
    CUresult r = cu->CtxSetCurrent(c);
    if (r != 0) return ferry_seterr(FERRY_ECUDA, "ferry_plan_wait_stream: cuCtxSetCurrent: %s", ferry_cuda_errstr(r));
    *out = c;
    return 0;
}

int ferry_job_record_waits(ferry_job *j, const ferry_plan *p, int first_dev) {
    if (!p->nwait) return 0;
    const char *why;
    const ferry_cuda_api *cu = ferry_cuda_load(&why);
    if (!cu) return ferry_seterr(FERRY_ENOCUDA, "ferry_plan_wait_stream: CUDA is not available: %s", why);
    CUcontext saved = ferry_cuda_current();
    int rc = 0;
    for (int i = 0; i < p->nwait && rc == 0; i++) {
        CUcontext c = NULL;
        if ((rc = stream_context(cu, p->wait_stream[i], p->wait_device[i], first_dev, saved, &c)) < 0) break;
        CUevent ev = NULL;
        CUresult r = cu->EventCreate(&ev, FERRY_CU_EVENT_DISABLE_TIMING | FERRY_CU_EVENT_BLOCKING_SYNC);
        if (r == 0) r = cu->EventRecord(ev, (CUstream)p->wait_stream[i]);
        if (r != 0) {
            if (ev) cu->EventDestroy(ev);
            rc = ferry_seterr(FERRY_ECUDA, "ferry_plan_wait_stream: recording an event on stream %p: %s",
                              p->wait_stream[i], ferry_cuda_errstr(r));
            break;
        }
        j->wait_ev[j->nwait] = ev;
        j->wait_ctx[j->nwait++] = c;
    }
    ferry_cuda_restore(saved);
    return rc;
}

int ferry_job_wait_streams(ferry_job *j) {
    if (!j->nwait || atomic_load(&j->waited)) return 0;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    CUcontext saved = ferry_cuda_current();
    int rc = 0;
    for (int i = 0; i < j->nwait && rc == 0; i++) {
        CUresult r = cu->CtxSetCurrent((CUcontext)j->wait_ctx[i]);   /* the event's own context */
        if (r == 0) r = cu->EventSynchronize((CUevent)j->wait_ev[i]);
        if (r != 0) rc = ferry_seterr(FERRY_ECUDA, "waiting for the caller's CUDA stream: %s", ferry_cuda_errstr(r));
    }
    ferry_cuda_restore(saved);
    if (rc == 0) atomic_store(&j->waited, 1);
    return rc;
}

void ferry_job_free_waits(ferry_job *j) {
    if (!j->nwait) return;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    CUcontext saved = ferry_cuda_current();
    for (int i = 0; i < j->nwait; i++)
        if (cu->CtxSetCurrent((CUcontext)j->wait_ctx[i]) == 0) cu->EventDestroy((CUevent)j->wait_ev[i]);
    ferry_cuda_restore(saved);
    j->nwait = 0;
}
