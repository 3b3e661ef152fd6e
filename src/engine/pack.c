/* pack.c — packed staging: many small plain reads in one task. Into host
 * memory each run of extents that are adjacent in one file is one preadv
 * (one pread when it is a single extent) straight into the destinations.
 * Into device memory the extents are read back to back into a staging
 * buffer; the buffer reaches the device in one copy per contiguous
 * destination run, or — when the runs are many (rows of a batch in shuffled
 * order) — in one copy into device scratch followed by one scatter kernel.
 * The depth in flight is then counted in bytes: every staging buffer is full
 * of records, however small they are. */
#include "engine/engine.h"
#include "engine/cacheshare.h"
#include "engine/io.h"
#include "engine/mapread.h"
#include "engine/sysio.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <unistd.h>

/* Runs above this many per staging buffer go through the scatter kernel: each
 * cuMemcpyHtoDAsync costs microseconds of driver time and its own DMA setup,
 * two copies and a launch cost the same as four. */
#define SCATTER_MIN_RUNS 4
/* How often a worker reading records looks at its earlier copies' events
 * (ferry_pack_read): a cuEventQuery is about a microsecond. */
#define POLL_EVERY_S 20e-6

static ferry_file *ext_file(ferry_worker *w, ferry_job *j, const ferry_extent *e, int *rc) {
    ferry_file *f = e->file;
    *rc = 0;
    if (!f) *rc = ferry_path_file(w, j, e, &f);
    return f;
}

static int pack_error(int code, const ferry_extent *e, ferry_file *f, uint64_t byte) {
    const char *name = f ? f->path : e->path ? e->path : "(unknown file)";
    if (e->label) return ferry_preerr(code, "%s: variable %s: byte %llu", name, e->label, (unsigned long long)byte);
    return ferry_preerr(code, "%s: byte %llu", name, (unsigned long long)byte);
}

static int short_read(const ferry_extent *e, ferry_file *f, uint64_t off, uint64_t want, uint64_t got) {
    ferry_seterr(FERRY_ESHORT, "file ends at byte %llu but %llu bytes at offset %llu are needed",
                 (unsigned long long)(off + got), (unsigned long long)want, (unsigned long long)off);
    return pack_error(FERRY_ESHORT, e, f, off);
}

/* Two extents by the same path name the same open file only when they are
 * opened the same way: a FERRY_EXTENT_NOFOLLOW read under one root may not
 * borrow a file opened under another (or opened following links), or the
 * no-follow guarantee of the second is lost. */
static int same_opening(const ferry_extent *a, const ferry_extent *b) {
    if ((a->flags ^ b->flags) & FERRY_EXTENT_NOFOLLOW) return 0;
    if (!(a->flags & FERRY_EXTENT_NOFOLLOW) || a->root == b->root) return 1;
    return a->root && b->root && strcmp(a->root, b->root) == 0;
}

/* How many extents from k on form one run of file f: adjacent in the file,
 * at most max_n of them and max_bytes in all (at least one). */
static size_t file_run(const ferry_job *j, size_t k, size_t end, ferry_file *f, size_t max_n, uint64_t max_bytes,
                       uint64_t *bytes) {
    const ferry_extent *e = &j->ext[k];
    uint64_t b = e->length;
    size_t m = k + 1;
    while (m < end && m - k < max_n) {
        const ferry_extent *x = &j->ext[m];
        if (x->file != e->file || (x->file == NULL && strcmp(x->path, e->path) != 0)) break;
        if (!same_opening(x, e)) break;   /* opened differently: another file for all we know */
        if (x->offset != j->ext[m - 1].offset + j->ext[m - 1].length || b + x->length > max_bytes) break;
        b += x->length;
        m++;
    }
    (void)f;
    *bytes = b;
    return m - k;
}

/* An absent file of a FERRY_EXTENT_MISSING_FILLS extent (a Zarr chunk never
 * written; its placement is flat, job.h): 1 when its box is to be filled
 * instead of read, the error cleared. */
static int fills_absent(const ferry_extent *e, int rc) {
    if ((rc != -ENOENT && rc != -ENOTDIR) || !(e->flags & FERRY_EXTENT_MISSING_FILLS) || !e->place) return 0;
    ferry_clearerr();
    return 1;
}

/* The fill value repeated over the extent's length bytes at dst (flat: the
 * box is those bytes, place->itemsize divides them). */
static void fill_flat(uint8_t *dst, const ferry_extent *e) {
    unsigned size = e->place->itemsize;
    ferry_place flat = {1, size, {e->length / size}, {size}, {size}, 0};
    ferry_fill_host(dst, e->fill, size, &flat, 0);
}

/* ---- cold records: read ahead of the preads ------------------------------ */
/* Hint ranges of one file closer than this are one hint (the gap is read
 * too): a sorted batch of neighbouring rows is then one request to the disk. */
#define HINT_GAP (128u << 10)

static int same_file(const ferry_extent *a, const ferry_extent *b) {
    if (a->file || b->file) return a->file == b->file;
    return strcmp(a->path, b->path) == 0 && same_opening(a, b);
}

/* Whether f's hints may be widened to windows of w bytes. A file of one
 * window or less is hinted whole (one sample a file: its header more). A
 * larger one must fit the context's page-cache share (cacheshare.c): the
 * neighbours a window reads are used only if they are still cached when
 * their turn comes, and a shuffled data set larger than the page cache would
 * pay a whole window per record. */
static int read_around_on(ferry_ctx *ctx, ferry_file *f, uint64_t size, uint64_t w) {
    return size <= w || ferry_cache_share_holds(ctx, f);
}

/* A job of this many records or more is a batch (a dataset's shuffled rows):
 * the sparse reads of a few records keep their own bytes' hints, so a cold
 * lookup of one record never reads a window. */
#define READ_AROUND_MIN_RECORDS 64

/* posix_fadvise(WILLNEED) of [lo, hi) of f. With j->read_around (FERRY_READAROUND,
 * default 4M) a range under a quarter of a window, of a batch's job, in a file
 * the context's share allows (above), is widened to the aligned windows around it — what a
 * memory-mapped reader's faults read around its records, in larger requests:
 * the disk serves a shuffled epoch in windows, and the records a window
 * brought in are in the page cache when their turn comes. Cold shuffled
 * 150,528-byte rows of 8.6 GB, one process per row, read 1.74-2.11 GB/s with
 * the records' own hints, 2.58 with 1M windows, 3.01-3.08 with 4M (the
 * 16-worker DataLoader of each run 2.29-2.69); 1 MiB rows read 1.82-1.88 with
 * their own hints and 1.51-1.68 widened, so ranges of a quarter window and
 * more keep theirs (BENCHMARKS.md, T4: the default against the DataLoader). */
static void hint_range(const ferry_job *j, ferry_file *f, uint64_t lo, uint64_t hi) {
    const uint64_t w = j->read_around, size = (uint64_t)f->size0;
    if (w && hi - lo < w / 4 && j->next >= READ_AROUND_MIN_RECORDS && read_around_on(j->ctx, f, size, w)) {
        lo &= ~(w - 1);
        hi = (hi + w - 1) & ~(w - 1);
        if (hi > size) hi = size;
    }
    if (hi > lo) ferry_sys()->fadvise(f->fd, (off_t)lo, (off_t)(hi - lo), POSIX_FADV_WILLNEED);
}

/* A worker reads its task's records one pread at a time: cold, that is one
 * request in flight per thread, each waiting for the disk (and a record
 * above the kernel's readahead window, 128 KiB by default, is two requests one
 * after the other). Memory-mapped DataLoader workers get the kernel's
 * readahead instead. So when the task's first record is not in the page cache
 * (cachestat, one system call per task; FERRY_READAHEAD=auto), every record
 * of the task is announced first with posix_fadvise(WILLNEED), which starts
 * the reads without waiting: the disk sees all of them at once, and the
 * preads that follow find them in flight or done. Warm tasks pay the one
 * cachestat. FERRY_READAHEAD=on hints always, off never. Failures here are
 * only lost hints: the reads report their own errors.
 * Returns 1 when the task's first record is in the page cache (the check
 * AUTO makes): its small records are then copied from their files' mappings
 * (mapread.c), not read one pread each. */
static int cold_hints(ferry_worker *w, ferry_job *j, const ferry_task *t) {
    if (j->readahead == FERRY_READAHEAD_OFF) return 0;
    size_t k = t->ext, end = (size_t)t->ext + t->n;
    const ferry_extent *e = &j->ext[k];
    int rc;
    ferry_file *f = ext_file(w, j, e, &rc);
    if (rc < 0) { ferry_clearerr(); return 0; }
    if (j->readahead == FERRY_READAHEAD_AUTO) {
        int64_t c = ferry_file_cached_fd(f->fd, e->offset, e->length, e->offset + e->length);
        if (c < 0) return 0;                              /* unknown: preads, no hints */
        if ((uint64_t)c >= e->length) return 1;           /* warm: no hints */
    }
    const ferry_extent *cur = e;   /* the range being gathered, of file f */
    uint64_t lo = e->offset, hi = e->offset + e->length, hinted = 1;
    for (size_t m = k + 1; m <= end; m++) {
        const ferry_extent *x = m < end ? &j->ext[m] : NULL;
        if (x && same_file(x, cur) && x->offset >= lo && x->offset <= hi + HINT_GAP) {
            if (x->offset + x->length > hi) hi = x->offset + x->length;
            hinted++;
            continue;
        }
        hint_range(j, f, lo, hi);
        if (!x) break;
        if (!same_file(x, cur)) {
            f = ext_file(w, j, x, &rc);
            if (rc < 0) { ferry_clearerr(); break; }
        }
        cur = x;
        lo = x->offset;
        hi = x->offset + x->length;
        hinted++;
    }
    w->hinted += hinted;
    return 0;
}

/* Read bytes at off of f into dst: from f's mapping when the task is warm
 * and they are few (j->map_max), else with pread. */
static int64_t read_run(const ferry_job *j, ferry_file *f, int warm, uint8_t *dst, uint64_t bytes, uint64_t off) {
    if (warm && bytes <= j->map_max && ferry_map_read(f, dst, off, bytes)) return (int64_t)bytes;
    return ferry_file_read(f, dst, bytes, off);
}

/* ---- into host memory ----------------------------------------------------- */
/* Read task t's records into host memory: each at its own destination, or,
 * with img, at img + (dst_offset - lo) (gather.c: a pinned image of a device
 * buffer). Each run of records adjacent in one file is one preadv. */
int64_t ferry_pack_read(ferry_worker *w, ferry_job *j, const ferry_task *t, uint8_t *img, uint64_t lo) {
    size_t end = (size_t)t->ext + t->n;
    uint64_t total = 0;
    struct iovec iov[64];
    const int warm = cold_hints(w, j, t);
    /* copies this worker sent (a gathered batch's, gather.c) complete while it
     * reads: its batch is done when the copy is, not a task later (a task of
     * 150 KB rows is 200 us of preads, the time the next batch has to start) */
    int watch = w->npending && !w->is_inline;
    double next_poll = watch ? ferry_now() + POLL_EVERY_S : 0;
    for (size_t k = t->ext; k < end;) {
        const ferry_extent *e = &j->ext[k];
        int rc;
        if (watch && w->npending && ferry_now() > next_poll) {
            ferry_worker_poll(w);
            next_poll = ferry_now() + POLL_EVERY_S;
        }
        ferry_file *f = ext_file(w, j, e, &rc);
        if (rc < 0 && fills_absent(e, rc)) {
            fill_flat(img ? img + (e->dst_offset - lo) : (uint8_t *)e->dst.ptr + e->dst_offset, e);
            k++;
            continue;
        }
        if (rc < 0) return pack_error(rc, e, NULL, e->offset);
        uint64_t bytes;
        size_t n = file_run(j, k, end, f, sizeof iov / sizeof *iov, UINT64_MAX, &bytes);
        int64_t r;
        if (n == 1) {
            uint8_t *dst = img ? img + (e->dst_offset - lo) : (uint8_t *)e->dst.ptr + e->dst_offset;
            r = read_run(j, f, warm, dst, e->length, e->offset);
        } else if (warm && bytes <= j->map_max) {   /* a short run to scattered places: a copy each */
            r = 0;
            for (size_t i = 0; i < n && r >= 0; i++) {
                const ferry_extent *x = &j->ext[k + i];
                uint8_t *dst = img ? img + (x->dst_offset - lo) : (uint8_t *)x->dst.ptr + x->dst_offset;
                int64_t got = read_run(j, f, warm, dst, x->length, x->offset);
                if (got < 0) r = got;
                else {
                    r += got;
                    if ((uint64_t)got < x->length) break;   /* the file ends here */
                }
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                const ferry_extent *x = &j->ext[k + i];
                iov[i].iov_base = img ? img + (x->dst_offset - lo) : (uint8_t *)x->dst.ptr + x->dst_offset;
                iov[i].iov_len = x->length;
            }
            r = ferry_file_readv(f, iov, (int)n, e->offset);
        }
        if (r < 0) {   /* a local pread's errno has no message yet; a remote read's has its own */
            if (!ferry_lasterr()[0]) ferry_seterr((int)r, "%s", ferry_strerror((int)r));
            return pack_error((int)r, e, f, e->offset);
        }
        if ((uint64_t)r < bytes) {   /* name the extent the file ended in */
            uint64_t at = e->offset + (uint64_t)r;
            size_t i = k;
            while (i + 1 < k + n && j->ext[i].offset + j->ext[i].length <= at) i++;
            return short_read(&j->ext[i], f, j->ext[i].offset, j->ext[i].length, at - j->ext[i].offset);
        }
        total += (uint64_t)r;
        k += n;
    }
    /* once per task, not per run: the stats lock is shared by every worker, and a
     * task of shuffled 4 KiB records is hundreds of runs (a failed task's job fails) */
    ferry_count_io(w->ctx, 0, total, 0);
    return (int64_t)total;
}

static int64_t pack_host(ferry_worker *w, ferry_job *j, const ferry_task *t) {
    int64_t r = ferry_pack_read(w, j, t, NULL, 0);
    if (r < 0) return r;
    atomic_fetch_add(&j->path_bytes[FERRY_PATH_HOST], (uint64_t)r);
    atomic_fetch_add(&j->path_ops[FERRY_PATH_HOST], 1);
    return r;
}

/* ---- the packing calls ------------------------------------------------------ */
int ferry_pack_begin(ferry_worker *w, int d) {
    int rc = ferry_worker_staging(w, d);
    if (rc < 0) return rc;
    int i = w->next_stage;
    w->next_stage = (i + 1) % w->ctx->cfg.staging_count;
    if ((rc = ferry_stage_wait(w, i)) < 0) return rc;
    if (!w->tab[i]) {
        rc = ferry_worker_alloc(w, d, (uint8_t **)&w->tab[i], FERRY_PACK_RUNS * sizeof(ferry_scatter_entry),
                                &w->tab_pinned[i]);
        if (rc < 0) return rc;
    }
    w->pack_i = i;
    w->pack_pos = 0;
    w->pack_runs = 0;
    return 0;
}

uint64_t ferry_pack_room(const ferry_worker *w) {
    if (w->pack_i < 0 || w->pack_runs >= FERRY_PACK_RUNS) return 0;
    return w->ctx->cfg.staging_size - w->pack_pos;
}

uint8_t *ferry_pack_reserve(ferry_worker *w, uint64_t n) {
    if (n > ferry_pack_room(w)) return NULL;
    return w->stage[w->pack_i] + w->pack_pos;
}

int ferry_pack_place(ferry_worker *w, uint64_t n, CUdeviceptr dst, uintptr_t buf) {
    if (w->pack_i < 0 || n > w->ctx->cfg.staging_size - w->pack_pos)
        return ferry_seterr(FERRY_EINVAL, "pack: %llu bytes do not fit the staging buffer", (unsigned long long)n);
    ferry_scatter_entry *tab = w->tab[w->pack_i];
    if (dst) {
        ferry_scatter_entry *last = w->pack_runs ? &tab[w->pack_runs - 1] : NULL;
        if (last && last->src + last->len == w->pack_pos && last->dst + last->len == dst && w->pack_last_buf == buf)
            last->len += n;
        else if (w->pack_runs < FERRY_PACK_RUNS) tab[w->pack_runs++] = (ferry_scatter_entry){w->pack_pos, dst, n};
        else return ferry_seterr(FERRY_EINVAL, "pack: more than %d runs in one staging buffer", FERRY_PACK_RUNS);
        w->pack_last_buf = buf;
    }
    w->pack_pos += n;
    return 0;
}

int ferry_pack_scratch(ferry_worker *w, int d, int i, CUdeviceptr *out) {
    ferry_devstate *ds = &w->dev[d];
    if (!ds->scratch[i]) {
        const ferry_cuda_api *cu = ferry_cuda_load(NULL);
        CUresult r = cu->MemAlloc(&ds->scratch[i], w->ctx->cfg.staging_size);
        if (r == 0) r = cu->MemAlloc(&ds->dtab[i], FERRY_PACK_RUNS * sizeof(ferry_scatter_entry));
        if (r != 0) {
            if (ds->scratch[i]) cu->MemFree(ds->scratch[i]);
            ds->scratch[i] = 0;
            return ferry_seterr(FERRY_ECUDA, "device %d: scratch for packed staging: %s", d, ferry_cuda_errstr(r));
        }
    }
    *out = ds->scratch[i];
    return 0;
}

int ferry_pack_flush(ferry_worker *w, ferry_job *j, int d) {
    int i = w->pack_i;
    if (i < 0) return 0;
    w->pack_i = -1;
    if (!w->pack_pos) return 0;
    ferry_devstate *ds;
    int rc = ferry_worker_device(w, d, &ds);
    if (rc < 0) return rc;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    const ferry_scatter_entry *tab = w->tab[i];
    uint32_t n = w->pack_runs;
    CUresult e = 0;
    if (n >= SCATTER_MIN_RUNS && ferry_cuda_scatter_ready(d)) {
        CUdeviceptr scratch;
        if ((rc = ferry_pack_scratch(w, d, i, &scratch)) < 0) return rc;
        e = cu->MemcpyHtoDAsync(scratch, w->stage[i], w->pack_pos, ds->stream);
        if (!e) e = cu->MemcpyHtoDAsync(ds->dtab[i], tab, n * sizeof *tab, ds->stream);
        if (e) return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(e));
        if ((rc = ferry_cuda_scatter(d, scratch, ds->dtab[i], n, ds->stream)) < 0) return rc;
    } else {
        for (uint32_t k = 0; k < n && !e; k++)
            e = cu->MemcpyHtoDAsync((CUdeviceptr)tab[k].dst, w->stage[i] + tab[k].src, tab[k].len, ds->stream);
    }
    if (!e) e = cu->EventRecord(ds->ev[i], ds->stream);
    if (e) return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(e));
    w->seq[d]++;
    w->stage_seq[i] = w->seq[d];
    w->stage_dev[i] = d;
    ferry_mark_device(w, j, d);
    return 0;
}

/* ---- into device memory -------------------------------------------------- */
static int64_t pack_device(ferry_worker *w, ferry_job *j, const ferry_task *t, int *deferred) {
    const ferry_extent *first = &j->ext[t->ext];
    int d = first->dst.device, rc;
    ferry_devstate *ds;
    if ((rc = ferry_worker_device(w, d, &ds)) < 0) return rc;
    size_t end = (size_t)t->ext + t->n;
    uint64_t S = w->ctx->cfg.staging_size, total = 0;
    int64_t result = 0;
    uint64_t seq0 = w->seq[d];
    const int warm = cold_hints(w, j, t);
    if ((rc = ferry_pack_begin(w, d)) < 0) return rc;
    for (size_t k = t->ext; k < end;) {
        const ferry_extent *e = &j->ext[k];
        ferry_file *f = ext_file(w, j, e, &rc);
        if (rc < 0 && fills_absent(e, rc)) {   /* the fill goes through staging like a read */
            uint8_t *buf = w->pack_runs < FERRY_PACK_RUNS ? ferry_pack_reserve(w, e->length) : NULL;
            if (!buf && ((rc = ferry_pack_flush(w, j, d)) < 0 || (rc = ferry_pack_begin(w, d)) < 0)) { result = rc; break; }
            if (!buf) buf = ferry_pack_reserve(w, e->length);
            fill_flat(buf, e);
            if ((rc = ferry_pack_place(w, e->length, (CUdeviceptr)(uintptr_t)e->dst.ptr + e->dst_offset,
                                       (uintptr_t)e->dst.ptr)) < 0) { result = rc; break; }
            k++;
            continue;
        }
        if (rc < 0) { result = pack_error(rc, e, NULL, e->offset); break; }
        uint64_t bytes;
        size_t n = file_run(j, k, end, f, FERRY_PACK_RUNS, S, &bytes);
        uint8_t *buf = w->pack_runs + n <= FERRY_PACK_RUNS ? ferry_pack_reserve(w, bytes) : NULL;
        if (!buf) {   /* full: send it, continue in the next buffer */
            if ((rc = ferry_pack_flush(w, j, d)) < 0 || (rc = ferry_pack_begin(w, d)) < 0) { result = rc; break; }
            buf = ferry_pack_reserve(w, bytes);
        }
        int64_t r = read_run(j, f, warm, buf, bytes, e->offset);
        if (r < 0) { ferry_seterr((int)r, "%s", strerror((int)-r)); result = pack_error((int)r, e, f, e->offset); break; }
        if ((uint64_t)r < bytes) {
            uint64_t at = e->offset + (uint64_t)r;
            size_t i = k;
            while (i + 1 < k + n && j->ext[i].offset + j->ext[i].length <= at) i++;
            result = short_read(&j->ext[i], f, j->ext[i].offset, j->ext[i].length, at - j->ext[i].offset);
            break;
        }
        for (size_t i = 0; i < n && rc >= 0; i++) {
            const ferry_extent *x = &j->ext[k + i];
            rc = ferry_pack_place(w, x->length, (CUdeviceptr)(uintptr_t)x->dst.ptr + x->dst_offset,
                                  (uintptr_t)x->dst.ptr);
        }
        if (rc < 0) { result = rc; break; }
        total += bytes;
        k += n;
    }
    ferry_count_io(w->ctx, 0, total, 0);   /* once per task (see pack_host) */
    /* what was packed is sent even after an error: its copies complete like any */
    if ((rc = ferry_pack_flush(w, j, d)) < 0 && result >= 0) result = rc;
    if (w->seq[d] > seq0) {
        if ((rc = ferry_worker_defer(w, j, d)) < 0) return rc;
        *deferred = 1;
    }
    if (result < 0) return result;
    atomic_fetch_add(&j->path_bytes[FERRY_PATH_STAGED], total);
    atomic_fetch_add(&j->path_ops[FERRY_PATH_STAGED], 1);
    return (int64_t)total;
}

int64_t ferry_exec_pack(ferry_worker *w, ferry_job *j, const ferry_task *t, int *deferred) {
    if (j->ext[t->ext].dst.kind == FERRY_MEM_HOST) return pack_host(w, j, t);
    return pack_device(w, j, t, deferred);
}
