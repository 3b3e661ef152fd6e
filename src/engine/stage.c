/* stage.c — what the paths share around a worker's staging: waiting for a
 * staging or decode buffer's copy to finish, marking the devices a job's
 * work went to, counting bytes by kind, and the open file an extent names by
 * path. exec.c, pack.c, gather.c and the GPU decode stage call these; they
 * call nothing of those. */
#include "engine/engine.h"

void ferry_count_io(ferry_ctx *ctx, uint64_t direct, uint64_t buffered, uint64_t decoded) {
    pthread_mutex_lock(&ctx->stats_lock);
    ctx->stats.direct_bytes += direct;
    ctx->stats.buffered_bytes += buffered;
    ctx->stats.decoded_bytes += decoded;
    pthread_mutex_unlock(&ctx->stats_lock);
}

/* Wait until staging buffer i is no longer the source or target of a copy. */
int ferry_stage_wait(ferry_worker *w, int i) {
    int d = w->stage_dev[i];
    if (d < 0 || w->done_seq[d] >= w->stage_seq[i]) return 0;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    CUresult r = cu->EventSynchronize(w->dev[d].ev[i]);
    if (r != 0) return ferry_seterr(FERRY_ECUDA, "device %d: copy failed: %s", d, ferry_cuda_errstr(r));
    ferry_worker_completed(w, d, w->stage_seq[i]);
    return 0;
}

int ferry_dec_wait(ferry_worker *w) {
    int d = w->dec_dev;
    if (d < 0 || w->done_seq[d] >= w->dec_seq) return 0;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    CUresult r = cu->EventSynchronize(w->dev[d].dec_ev);
    if (r != 0) return ferry_seterr(FERRY_ECUDA, "device %d: copy failed: %s", d, ferry_cuda_errstr(r));
    ferry_worker_completed(w, d, w->dec_seq);
    return 0;
}

void ferry_mark_device(ferry_worker *w, ferry_job *j, int d) {
    if (!w->is_inline) atomic_fetch_or(&j->worker_mask[w->id / 64], 1ull << (w->id % 64));
    atomic_fetch_or(&j->dev_mask, 1u << d);
}

/* An extent's file_size (ferry.h): the size the file had when it was opened
 * must be exactly that (a longer chunk file read from its start would be
 * another array's bytes; zarr-python refuses both a shorter and a longer one). */
static int path_size_ok(const ferry_extent *e, const ferry_file *f) {
    if (!e->file_size || (f->size0 >= 0 && (uint64_t)f->size0 == e->file_size)) return 0;
    return ferry_seterr(FERRY_EFORMAT, "the chunk file holds %lld bytes, an uncompressed chunk is exactly %llu",
                        (long long)f->size0, (unsigned long long)e->file_size);
}

/* Files named by path come from the context's open-file cache (opened by the
 * worker that first needs one, so many files open in parallel); the worker
 * holds the last one for the rest of the job's tasks (a shard read as many
 * extents looks it up once). */
int ferry_path_file(ferry_worker *w, ferry_job *j, const ferry_extent *e, ferry_file **out) {
    const char *path = e->path;
    int nofollow = (e->flags & FERRY_EXTENT_NOFOLLOW) != 0;
    const char *root = nofollow ? e->root : NULL;
    if (w->pathfile && w->pathfile_job == j->id && strcmp(w->pathfile->path, path) == 0 &&
        (!nofollow || (w->pathfile_nofollow && (w->pathfile_root == root ||
                                                (root && w->pathfile_root && !strcmp(w->pathfile_root, root)))))) {
        *out = w->pathfile;
        return path_size_ok(e, w->pathfile);
    }
    ferry_worker_idle(w);
    int rc = ferry_fcache_get(&w->ctx->files, w->ctx, path, nofollow, root, j->id, &w->pathfile, &w->pathfile_entry);
    if (rc < 0) return rc;
    w->pathfile_job = j->id;
    w->pathfile_nofollow = nofollow;
    w->pathfile_root = root;   /* the job's copy: lives as long as pathfile_job */
    *out = w->pathfile;
    return path_size_ok(e, w->pathfile);
}
