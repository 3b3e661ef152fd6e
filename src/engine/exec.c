/* exec.c — running one task on a worker: the host path (pread into the
 * caller's memory), the staged path (pread into pinned staging buffer i while
 * buffer i-1 is still being copied to the GPU on the worker's stream), the
 * cuFile path, decoded/placed extents, fills and writes. */
#include "engine/engine.h"
#include "engine/cacheshare.h"
#include "engine/io.h"
#include "engine/gpudecode.h"
#include "engine/gather.h"
#include "engine/sysio.h"
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

static void swap_host(uint8_t *p, uint64_t n, unsigned size) {
    for (uint64_t i = 0; i + size <= n; i += size)
        for (unsigned a = 0, b = size - 1; a < b; a++, b--) { uint8_t t = p[i + a]; p[i + a] = p[i + b]; p[i + b] = t; }
}

/* Whether j keeps what it reads of f in the page cache. A FERRY_REREAD job (a
 * dataset's epochs) does while its files fit the context's share
 * (cacheshare.c): it reads them buffered, not with O_DIRECT or GDS, so that
 * the next epoch finds them in memory. Before this, cold shuffled 1 MiB rows
 * (AUTO's O_DIRECT size) came from the disk again every epoch: over 2 GB of
 * npy shards ArrayDataset read 1.30 / 1.22 / 1.28 GB/s in epochs 0-2, where
 * 512 KiB rows, read buffered, ran 1.12 / 5.69 / 5.57 (BENCHMARKS.md, T7:
 * the epoch after a cold one at memory speed since). */
static int keeps_cache(ferry_job *j, ferry_file *f, uint64_t len) {
    return (j->flags & FERRY_REREAD) && len >= FERRY_DIRECT_MIN && ferry_cache_share_holds(j->ctx, f);
}

/* The O_DIRECT policy of j's read of [off, off+len) of f (ferry_use_direct).
 * A read kept in the page cache that finds its range cold announces it first
 * (WILLNEED; FERRY_READAHEAD as for packs, pack.c): the kernel then asks the
 * disk for the whole range at once, where a pread alone asks for it a
 * readahead window (often 128 KiB: read_ahead_kb) after another. */
static int read_direct_policy(ferry_job *j, ferry_file *f, uint64_t off, uint64_t len) {
    if (j->direct != FERRY_DIRECT_AUTO || !keeps_cache(j, f, len)) return j->direct;
    int64_t cached = j->readahead == FERRY_READAHEAD_AUTO && f->size0 > 0
                         ? ferry_file_cached_fd(f->fd, off, len, (uint64_t)f->size0) : -1;   /* < 0: unknown */
    if (j->readahead == FERRY_READAHEAD_ON || (cached >= 0 && (uint64_t)cached * 2 < len))
        ferry_sys()->fadvise(f->fd, (off_t)off, (off_t)len, POSIX_FADV_WILLNEED);
    return FERRY_DIRECT_OFF;
}

/* Read [off, off+len) into host memory dst: buffered, or O_DIRECT straight
 * into dst when both are aligned, or O_DIRECT through a staging buffer. */
static int64_t read_to_host(ferry_worker *w, ferry_job *j, ferry_file *f, uint64_t off, uint64_t len, uint8_t *dst) {
    int direct = ferry_use_direct(f, read_direct_policy(j, f, off, len), off, len, 0);
    int dfd = direct ? ferry_file_direct_fd(f) : -1;
    if (dfd < 0) {
        int64_t r = ferry_file_read(f, dst, len, off);
        if (r > 0) ferry_count_io(w->ctx, 0, (uint64_t)r, 0);
        return r;
    }
    uint64_t end = off + len, done = 0;
    if (off % FERRY_ALIGN == 0 && ((uintptr_t)dst % FERRY_ALIGN) == 0) {
        uint64_t mid = ferry_align_down(len);
        int64_t r = mid ? ferry_pread_full(dfd, dst, mid, off) : 0;
        if (r == -EINVAL) { r = ferry_file_read(f, dst, len, off); if (r > 0) ferry_count_io(w->ctx, 0, (uint64_t)r, 0); return r; }
        if (r < 0) return r;
        ferry_count_io(w->ctx, (uint64_t)r, 0, 0);
        if ((uint64_t)r < mid) return r;
        int64_t t = len > mid ? ferry_file_read(f, dst + mid, len - mid, off + mid) : 0;
        if (t < 0) return t;
        ferry_count_io(w->ctx, 0, (uint64_t)t, 0);
        return r + t;
    }
    int rc = ferry_worker_staging(w, -1);
    if (rc < 0) return rc;
    int i = w->next_stage;
    w->next_stage = (i + 1) % w->ctx->cfg.staging_count;
    if ((rc = ferry_stage_wait(w, i)) < 0) return rc;
    size_t S = w->ctx->cfg.staging_size;
    for (uint64_t c = ferry_align_down(off); c < end; c += S) {
        uint64_t want = FERRY_MIN((uint64_t)S, ferry_align_up(end) - c);
        int64_t r = ferry_pread_full(dfd, w->stage[i], want, c);
        if (r == -EINVAL) {   /* accepted at open, refused at read: fall back */
            int64_t b = ferry_file_read(f, dst + done, len - done, off + done);
            return b < 0 ? b : (int64_t)done + b;
        }
        if (r < 0) return r;
        uint64_t lo = FERRY_MAX(c, off), avail_end = c + (uint64_t)r;
        uint64_t hi = FERRY_MIN(FERRY_MIN(c + S, end), avail_end);
        if (hi > lo) { memcpy(dst + (lo - off), w->stage[i] + (lo - c), hi - lo); done += hi - lo; }
        ferry_count_io(w->ctx, (uint64_t)r, 0, 0);
        if (avail_end < FERRY_MIN(c + S, end)) break;   /* end of file */
    }
    return (int64_t)done;
}

/* ---- copies to the device ------------------------------------------------ */
/* Enqueue the copy of decoded bytes (pinned) to device memory, placed or not. */
static int to_device(ferry_worker *w, ferry_job *j, int d, const uint8_t *src, uint64_t n, CUdeviceptr dst, const ferry_place *place) {
    ferry_devstate *ds;
    int rc = ferry_worker_device(w, d, &ds);
    if (rc < 0) return rc;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    rc = ferry_place_device(cu, ds->stream, dst, (uintptr_t)src, 0, place, n);
    if (rc < 0) return rc;
    w->seq[d]++;
    CUresult r = cu->EventRecord(ds->dec_ev, ds->stream);
    if (r) return ferry_seterr(FERRY_ECUDA, "cuEventRecord: %s", ferry_cuda_errstr(r));
    w->dec_seq = w->seq[d];
    w->dec_dev = d;
    ferry_mark_device(w, j, d);
    return 0;
}

/* ---- reads ----------------------------------------------------------------- */
static int64_t read_staged(ferry_worker *w, ferry_job *j, ferry_file *f, uint64_t off, uint64_t len, int d,
                           CUdeviceptr dst, unsigned swap, int *deferred) {
    ferry_devstate *ds;
    int rc = ferry_worker_device(w, d, &ds);
    if (rc < 0) return rc;
    if ((rc = ferry_worker_staging(w, d)) < 0) return rc;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    int gpu_swap = swap > 1 && (dst % swap) == 0 && (len % swap) == 0 && ferry_cuda_kernels_ready(d);
    /* A CPU swap needs chunks of whole elements: chunk from `off`, buffered.
     * O_DIRECT chunks are aligned in the file: [align_down(off) + i*S, ...). */
    int direct = (swap <= 1 || gpu_swap) && ferry_use_direct(f, read_direct_policy(j, f, off, len), off, len, 0);
    int dfd = direct ? ferry_file_direct_fd(f) : -1;
    size_t S = w->ctx->cfg.staging_size;
    int k = w->ctx->cfg.staging_count;
    uint64_t end = off + len, done = 0, ndirect = 0, nbuf = 0;
restart:;
    uint64_t base = dfd >= 0 ? ferry_align_down(off) : off;
    for (uint64_t c = base; c < end; c += S) {
        int i = w->next_stage;
        w->next_stage = (i + 1) % k;
        if ((rc = ferry_stage_wait(w, i)) < 0) return rc;
        uint64_t lo = FERRY_MAX(c, off), hi = FERRY_MIN(c + S, end);
        uint8_t *src;
        if (dfd >= 0) {
            int64_t r = ferry_pread_full(dfd, w->stage[i], FERRY_MIN((uint64_t)S, ferry_align_up(end) - c), c);
            if (r == -EINVAL && done == 0) { dfd = -1; goto restart; }   /* accepted at open, refused at read */
            if (r < 0) return r;
            ndirect += (uint64_t)r;
            if (c + (uint64_t)r < hi) hi = c + (uint64_t)r > lo ? c + (uint64_t)r : lo;
            src = w->stage[i] + (lo - c);
        } else {
            int64_t r = ferry_file_read(f, w->stage[i], hi - lo, lo);
            if (r < 0) return r;
            nbuf += (uint64_t)r;
            hi = lo + (uint64_t)r;
            src = w->stage[i];
        }
        if (hi <= lo) break;
        uint64_t n = hi - lo;
        if (swap > 1 && !gpu_swap) swap_host(src, n, swap);
        CUresult e = cu->MemcpyHtoDAsync(dst + (lo - off), src, n, ds->stream);
        if (!e) e = cu->EventRecord(ds->ev[i], ds->stream);
        if (e) return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(e));
        w->seq[d]++;
        w->stage_seq[i] = w->seq[d];
        w->stage_dev[i] = d;
        done += n;
        if (hi < FERRY_MIN(c + S, end)) break;   /* end of file */
    }
    if (gpu_swap && done) {
        if ((rc = ferry_cuda_byteswap(d, dst, done / swap, swap, ds->stream)) < 0) return rc;
        w->seq[d]++;
    }
    ferry_count_io(w->ctx, ndirect, nbuf, 0);
    if (done) {
        ferry_mark_device(w, j, d);
        if ((rc = ferry_worker_defer(w, j, d)) < 0) return rc;
        *deferred = 1;
    }
    return (int64_t)done;
}

/* A remote object bound for device memory: the task's bytes in one read,
 * whose range requests run side by side (sources/http.c), into the worker's
 * pinned input buffer, then one copy. Staging buffer by staging buffer, each
 * 2 MiB would wait a network round trip of its own, one after the other. */
static int64_t read_remote_staged(ferry_worker *w, ferry_job *j, ferry_file *f, uint64_t off, uint64_t len, int d,
                                  CUdeviceptr dst, unsigned swap, int *deferred) {
    int rc = ferry_dec_wait(w);   /* the input buffer may still be the source of a copy */
    if (rc < 0) return rc;
    if ((rc = ferry_worker_grow(w, d, &w->in_buf, &w->in_cap, &w->in_pinned, len ? len : 1)) < 0) return rc;
    int64_t got = ferry_file_read(f, w->in_buf, len, off);
    if (got <= 0) return got;
    if (swap > 1) swap_host(w->in_buf, (uint64_t)got, swap);
    ferry_count_io(w->ctx, 0, (uint64_t)got, 0);
    if ((rc = to_device(w, j, d, w->in_buf, (uint64_t)got, dst, NULL)) < 0) return rc;
    if ((rc = ferry_worker_defer(w, j, d)) < 0) return rc;
    *deferred = 1;
    return got;
}

static int64_t read_cufile(ferry_worker *w, ferry_job *j, ferry_file *f, uint64_t off, uint64_t len, int d,
                           CUdeviceptr base, uint64_t dst_off, unsigned swap, int *deferred) {
    ferry_cufile_handle fh;
    int rc = ferry_file_cufile(f, &fh);
    if (rc < 0) return rc;
    if ((rc = ferry_cuda_use_device(d)) < 0) return rc;
    const ferry_cufile_api *cf = ferry_cufile_load(NULL);
    uint64_t done = 0;
    while (done < len) {
        ssize_t r = cf->Read(fh, (void *)(uintptr_t)base, len - done, (off_t)(off + done), (off_t)(dst_off + done));
        if (r < 0) {
            if (r == -1) return ferry_seterr(-errno, "cuFileRead: %s", strerror(errno));
            return ferry_seterr(FERRY_ECUFILE, "cuFileRead: %s (%d)", ferry_cufile_errstr((int)-r), (int)-r);
        }
        if (r == 0) break;
        done += (uint64_t)r;
    }
    ferry_count_io(w->ctx, done, 0, 0);
    if (swap > 1 && done) {
        if (!ferry_cuda_kernels_ready(d) || (base + dst_off) % swap)
            return ferry_seterr(FERRY_EUNSUPPORTED, "byteswap on the GPU needs the embedded kernels and aligned memory; use the staged path");
        ferry_devstate *ds;
        if ((rc = ferry_worker_device(w, d, &ds)) < 0) return rc;
        rc = ferry_cuda_byteswap(d, base + dst_off, done / swap, swap, ds->stream);
        if (rc < 0) return rc;
        w->seq[d]++;
        ferry_mark_device(w, j, d);
        if ((rc = ferry_worker_defer(w, j, d)) < 0) return rc;
        *deferred = 1;
    }
    return (int64_t)done;
}

static int short_error(ferry_job *j, const ferry_extent *e, ferry_file *f, uint64_t off, uint64_t len, uint64_t got) {
    return ferry_seterr(FERRY_ESHORT, "file ends at byte %llu but %llu bytes at offset %llu are needed",
                        (unsigned long long)(off + got), (unsigned long long)len, (unsigned long long)off);
}

static int64_t exec_read_plain(ferry_worker *w, ferry_job *j, const ferry_extent *e, ferry_file *f, uint64_t lo,
                               uint64_t hi, int *deferred) {
    uint64_t off = e->offset + lo, len = hi - lo;
    unsigned swap = e->ncodecs ? (unsigned)ferry_codecs_only_byteswap(e->codecs, e->ncodecs) : 0;
    int64_t got;
    ferry_path used;
    if (e->dst.kind == FERRY_MEM_HOST) {
        uint8_t *dst = (uint8_t *)e->dst.ptr + e->dst_offset + lo;
        got = read_to_host(w, j, f, off, len, dst);
        if (got > 0 && swap > 1) swap_host(dst, (uint64_t)got, swap);
        used = FERRY_PATH_HOST;
    } else {
        int d = e->dst.device;
        CUdeviceptr base = (CUdeviceptr)(uintptr_t)e->dst.ptr;
        used = j->path;
        got = -1;
        /* GDS reads local files only: a remote object is staged (not a fallback) */
        if (used == FERRY_PATH_CUFILE && !j->forced && (f->remote || keeps_cache(j, f, len))) used = FERRY_PATH_STAGED;
        if (used == FERRY_PATH_CUFILE) {
            got = read_cufile(w, j, f, off, len, d, base, e->dst_offset + lo, swap, deferred);
            if (got < 0 && !j->forced) {   /* AUTO: this file cannot use GDS; staged serves it */
                pthread_mutex_lock(&w->ctx->stats_lock);
                w->ctx->stats.fallbacks++;
                pthread_mutex_unlock(&w->ctx->stats_lock);
                used = FERRY_PATH_STAGED;
            }
        }
        if (used == FERRY_PATH_STAGED)
            got = f->remote ? read_remote_staged(w, j, f, off, len, d, base + e->dst_offset + lo, swap, deferred)
                            : read_staged(w, j, f, off, len, d, base + e->dst_offset + lo, swap, deferred);
    }
    if (got < 0) return got;
    atomic_fetch_add(&j->path_bytes[used], (uint64_t)got);
    atomic_fetch_add(&j->path_ops[used], 1);
    if ((uint64_t)got < len && !j->allow_short) return short_error(j, e, f, off, len, (uint64_t)got);
    return got;
}

static int64_t exec_read_coded(ferry_worker *w, ferry_job *j, const ferry_extent *e, ferry_file *f, int *deferred) {
    int rc = ferry_dec_wait(w);
    if (rc < 0) return rc;
    int host = e->dst.kind == FERRY_MEM_HOST, dev = host ? -1 : e->dst.device;
    if ((rc = ferry_worker_grow(w, dev, &w->in_buf, &w->in_cap, &w->in_pinned, e->length ? e->length : 1)) < 0) return rc;
    int64_t got = read_to_host(w, j, f, e->offset, e->length, w->in_buf);
    if (got < 0) return got;
    if ((uint64_t)got < e->length) return short_error(j, e, f, e->offset, e->length, (uint64_t)got);
    const uint8_t *dec = w->in_buf;
    uint64_t dlen = e->length;
    uint8_t *hdst = host ? (uint8_t *)e->dst.ptr + e->dst_offset : NULL;
    if (e->ncodecs) {
        uint8_t *out;
        if (host && !e->place) out = hdst;
        else {
            if ((rc = ferry_worker_grow(w, dev, &w->dec_buf, &w->dec_cap, &w->dec_pinned, e->decoded_size ? e->decoded_size : 1)) < 0)
                return rc;
            out = w->dec_buf;
        }
        int64_t r = ferry_decode(e->codecs, e->ncodecs, w->in_buf, e->length, out, e->decoded_size, &w->scratch);
        if (r < 0) return r;
        if ((uint64_t)r != e->decoded_size)
            return ferry_seterr(FERRY_ECODEC, "decoded %lld bytes where %llu were expected",
                                (long long)r, (unsigned long long)e->decoded_size);
        ferry_count_io(w->ctx, 0, 0, (uint64_t)r);
        if (ferry_gpudecode_is_fallback(j, e)) {   /* decode "gpu" forced: a chunk nvCOMP does not take */
            pthread_mutex_lock(&w->ctx->stats_lock);
            w->ctx->stats.gpu_cpu_fallbacks++;
            pthread_mutex_unlock(&w->ctx->stats_lock);
        }
        if (host && !e->place) goto done;
        dec = out;
        dlen = e->decoded_size;
    }
    if (host) {
        if (e->place) ferry_place_host(hdst, dec, e->place);
        else memcpy(hdst, dec, dlen);
    } else {
        int d = e->dst.device;
        rc = to_device(w, j, d, dec, dlen, (CUdeviceptr)(uintptr_t)e->dst.ptr + e->dst_offset, e->place);
        if (rc < 0) return rc;
        if ((rc = ferry_worker_defer(w, j, d)) < 0) return rc;
        *deferred = 1;
    }
done:;
    ferry_path used = host ? FERRY_PATH_HOST : FERRY_PATH_STAGED;
    atomic_fetch_add(&j->path_bytes[used], e->length);
    atomic_fetch_add(&j->path_ops[used], 1);
    return (int64_t)e->length;
}

static int exec_fill(ferry_worker *w, ferry_job *j, const ferry_extent *e, uint64_t lo, uint64_t hi, int *deferred) {
    unsigned size = e->place ? e->place->itemsize : 1;
    if (e->dst.kind == FERRY_MEM_HOST) {
        uint8_t *dst = (uint8_t *)e->dst.ptr + e->dst_offset;
        if (e->place) ferry_fill_host(dst, e->fill, size, e->place, 0);
        else ferry_fill_host(dst + lo, e->fill, 1, NULL, hi - lo);
        return 0;
    }
    int rc = ferry_dec_wait(w);
    if (rc < 0) return rc;
    int d = e->dst.device;
    CUdeviceptr dst = (CUdeviceptr)(uintptr_t)e->dst.ptr + e->dst_offset;
    if (!e->place) {
        /* a pattern buffer copied repeatedly */
        uint64_t n = hi - lo, chunk = FERRY_MIN(n, (uint64_t)(4u << 20));
        if ((rc = ferry_worker_grow(w, d, &w->dec_buf, &w->dec_cap, &w->dec_pinned, chunk ? chunk : 1)) < 0) return rc;
        memset(w->dec_buf, e->fill[0], chunk);
        for (uint64_t c = 0; c < n; c += chunk) {
            rc = to_device(w, j, d, w->dec_buf, FERRY_MIN(chunk, n - c), dst + lo + c, NULL);
            if (rc < 0) return rc;
        }
    } else {
        /* fill a contiguous box on the host, then place it like decoded data */
        ferry_place p = *e->place;
        uint64_t elems = 1;
        for (int k = 0; k < p.ndim; k++) if (ferry_mul_overflow(elems, p.count[k], &elems)) return ferry_seterr(FERRY_EINVAL, "fill too large");
        uint64_t bytes;
        if (ferry_mul_overflow(elems, size, &bytes)) return ferry_seterr(FERRY_EINVAL, "fill too large");
        if (!bytes) return 0;
        if ((rc = ferry_worker_grow(w, d, &w->dec_buf, &w->dec_cap, &w->dec_pinned, bytes)) < 0) return rc;
        ferry_place flat = {1, size, {elems}, {size}, {size}, 0};
        ferry_fill_host(w->dec_buf, e->fill, size, &flat, 0);
        int64_t stride = size;
        for (int k = p.ndim - 1; k >= 0; k--) { p.src_stride[k] = stride; stride *= (int64_t)p.count[k]; }
        p.src_offset = 0;
        rc = to_device(w, j, d, w->dec_buf, bytes, dst, &p);
        if (rc < 0) return rc;
    }
    if ((rc = ferry_worker_defer(w, j, d)) < 0) return rc;
    *deferred = 1;
    return 0;
}

/* ---- writes ---------------------------------------------------------------- */
/* Write n bytes from buf (4 KiB aligned) at file offset off: O_DIRECT for the
 * aligned part when allowed, buffered for the rest. */
static int64_t write_block(ferry_worker *w, ferry_file *f, int dfd, const uint8_t *buf, uint64_t n, uint64_t off) {
    uint64_t al = (dfd >= 0 && off % FERRY_ALIGN == 0 && (uintptr_t)buf % FERRY_ALIGN == 0) ? ferry_align_down(n) : 0;
    if (al) {
        int64_t r = ferry_pwrite_full(dfd, buf, al, off);
        if (r == -EINVAL) al = 0;   /* refused at write time: all buffered */
        else if (r < 0) return r;
        else ferry_count_io(w->ctx, al, 0, 0);
    }
    if (n > al) {
        int64_t r = ferry_pwrite_full(f->fd, buf + al, n - al, off + al);
        if (r < 0) return r;
        ferry_count_io(w->ctx, 0, n - al, 0);
    }
    return (int64_t)n;
}

static int64_t exec_write(ferry_worker *w, ferry_job *j, const ferry_extent *e, ferry_file *f, uint64_t lo, uint64_t hi) {
    uint64_t off = e->offset + lo, len = hi - lo;
    int direct = ferry_use_direct(f, j->direct, off, len, 1) && off % FERRY_ALIGN == 0;
    int dfd = direct ? ferry_file_direct_fd(f) : -1;
    size_t S = w->ctx->cfg.staging_size;
    int k = w->ctx->cfg.staging_count, rc;
    ferry_path used = FERRY_PATH_HOST;
    atomic_store(&f->written, 1);
    if (e->dst.kind == FERRY_MEM_HOST) {
        const uint8_t *src = (const uint8_t *)e->dst.ptr + e->dst_offset + lo;
        if (dfd < 0 || (uintptr_t)src % FERRY_ALIGN == 0) {
            int64_t r = write_block(w, f, dfd, src, len, off);
            if (r < 0) return r;
        } else {
            /* O_DIRECT needs an aligned source: bounce through staging */
            if ((rc = ferry_worker_staging(w, -1)) < 0) return rc;
            int i = w->next_stage;
            w->next_stage = (i + 1) % k;
            if ((rc = ferry_stage_wait(w, i)) < 0) return rc;
            for (uint64_t c = 0; c < len; c += S) {
                uint64_t n = FERRY_MIN((uint64_t)S, len - c);
                memcpy(w->stage[i], src + c, n);
                int64_t r = write_block(w, f, dfd, w->stage[i], n, off + c);
                if (r < 0) return r;
            }
        }
    } else {
        int d = e->dst.device;
        CUdeviceptr src = (CUdeviceptr)(uintptr_t)e->dst.ptr + e->dst_offset + lo;
        used = j->path;
        if (used == FERRY_PATH_CUFILE) {
            ferry_cufile_handle fh;
            rc = ferry_file_cufile(f, &fh);
            if (rc < 0 && j->forced) return rc;
            if (rc < 0) used = FERRY_PATH_STAGED;
            else {
                if ((rc = ferry_cuda_use_device(d)) < 0) return rc;
                const ferry_cufile_api *cf = ferry_cufile_load(NULL);
                uint64_t done = 0;
                while (done < len) {
                    ssize_t r = cf->Write(fh, e->dst.ptr, len - done, (off_t)(off + done), (off_t)(e->dst_offset + lo + done));
                    if (r < 0) {
                        if (r == -1) return ferry_seterr(-errno, "cuFileWrite: %s", strerror(errno));
                        return ferry_seterr(FERRY_ECUFILE, "cuFileWrite: %s (%d)", ferry_cufile_errstr((int)-r), (int)-r);
                    }
                    if (r == 0) return ferry_seterr(FERRY_EIO, "cuFileWrite wrote nothing");
                    done += (uint64_t)r;
                }
                ferry_count_io(w->ctx, len, 0, 0);
            }
        }
        if (used == FERRY_PATH_STAGED) {
            /* device -> staging i (async) while staging i-1 is written */
            ferry_devstate *ds;
            if ((rc = ferry_worker_device(w, d, &ds)) < 0) return rc;
            if ((rc = ferry_worker_staging(w, d)) < 0) return rc;
            const ferry_cuda_api *cu = ferry_cuda_load(NULL);
            uint64_t nchunks = (len + S - 1) / S;
            int first = w->next_stage;
            for (int b = 0; b < k; b++) if ((rc = ferry_stage_wait(w, b)) < 0) return rc;
            for (uint64_t c = 0; c < nchunks + (uint64_t)k; c++) {
                if (c >= (uint64_t)k) {   /* write chunk c-k once its copy is done */
                    uint64_t q = c - (uint64_t)k;
                    if (q >= nchunks) continue;
                    int i = (int)((first + q) % (uint64_t)k);
                    CUresult r = cu->EventSynchronize(ds->ev[i]);
                    if (r) return ferry_seterr(FERRY_ECUDA, "device %d: copy failed: %s", d, ferry_cuda_errstr(r));
                    uint64_t n = FERRY_MIN((uint64_t)S, len - q * S);
                    int64_t wr = write_block(w, f, dfd, w->stage[i], n, off + q * S);
                    if (wr < 0) return wr;
                }
                if (c < nchunks) {
                    int i = (int)((first + c) % (uint64_t)k);
                    uint64_t n = FERRY_MIN((uint64_t)S, len - c * S);
                    CUresult r = cu->MemcpyDtoHAsync(w->stage[i], src + c * S, n, ds->stream);
                    if (!r) r = cu->EventRecord(ds->ev[i], ds->stream);
                    if (r) return ferry_seterr(FERRY_ECUDA, "cuMemcpyDtoHAsync: %s", ferry_cuda_errstr(r));
                    w->seq[d]++;
                    w->stage_seq[i] = w->seq[d];
                    w->stage_dev[i] = d;
                }
            }
            w->next_stage = (int)((first + nchunks) % (uint64_t)k);
        }
    }
    atomic_fetch_add(&j->path_bytes[used], len);
    atomic_fetch_add(&j->path_ops[used], 1);
    return (int64_t)len;
}

int ferry_exec_task(ferry_worker *w, ferry_job *j, const ferry_task *t) {
    ferry_clearerr();
    int deferred = 0;
    int64_t r = 0;
    ferry_task one;
    if (t->ext == FERRY_GPU_TASK && ferry_gpudecode_is_feeder(j, (size_t)t->lo)) {
        /* gpudecode.c: batches of chunks nvCOMP decodes; its errors name the chunk */
        r = ferry_gpudecode_run(w, j, (size_t)t->lo, &deferred);
        if (r < 0) ferry_job_fail(j, (int)r);
        else atomic_fetch_add(&j->bytes, (uint64_t)r);
        goto issued;
    }
    if (t->ext == FERRY_GPU_TASK) {   /* the next chunk of a queue the GPU shares with the CPU: decoded here */
        int64_t i = ferry_gpudecode_take_one(j);
        if (i < 0) goto issued;       /* the GPU took the rest */
        one = (ferry_task){(uint32_t)i, 1, 0, j->ext[i].length};
        t = &one;
    }
    const ferry_extent *e = &j->ext[t->ext];
    ferry_file *f = e->file;
    if (j->gather) {   /* gather.c: the records into the job's pinned image; it fails the job itself */
        r = ferry_exec_gather(w, j, t, &deferred);
        if (r < 0 && !deferred) ferry_worker_drain(w);
        else if (r >= 0) atomic_fetch_add(&j->bytes, (uint64_t)r);
        goto issued;
    }
    if (t->n > 1) {   /* a pack: its errors already name the extent's file and byte */
        r = ferry_exec_pack(w, j, t, &deferred);
        if (r < 0) {
            if (e->dst.kind == FERRY_MEM_CUDA && !deferred) ferry_worker_drain(w);
            ferry_job_fail(j, (int)r);
        } else {
            atomic_fetch_add(&j->bytes, (uint64_t)r);
        }
        goto issued;
    }
    if (e->kind != FERRY_EXTENT_FILL && !f) r = ferry_path_file(w, j, e, &f);
    if ((r == -ENOENT || r == -ENOTDIR) && (e->flags & FERRY_EXTENT_MISSING_FILLS)) {
        ferry_clearerr();   /* an absent chunk: its box gets the fill value */
        r = exec_fill(w, j, e, 0, 0, &deferred);
    } else if (r >= 0) {
        switch (e->kind) {
        case FERRY_EXTENT_WRITE: r = exec_write(w, j, e, f, t->lo, t->hi); break;
        case FERRY_EXTENT_FILL: r = exec_fill(w, j, e, t->lo, t->hi, &deferred); break;
        default:
            if ((e->place && !(e->flags & FERRY_EXTENT_FLAT_)) ||   /* flat: job.h */
                (e->ncodecs && !ferry_codecs_only_byteswap(e->codecs, e->ncodecs)))
                r = exec_read_coded(w, j, e, f, &deferred);
            else
                r = exec_read_plain(w, j, e, f, t->lo, t->hi, &deferred);
        }
    }
    if (r < 0) {
        if (e->dst.kind == FERRY_MEM_CUDA && !deferred) ferry_worker_drain(w);   /* no copy outlives a failed task */
        const char *name = f ? f->path : e->path ? e->path : "(fill)";
        if (e->label)
            ferry_preerr((int)r, "%s: variable %s: byte %llu", name, e->label, (unsigned long long)(e->offset + t->lo));
        else
            ferry_preerr((int)r, "%s: byte %llu", name, (unsigned long long)(e->offset + t->lo));
        ferry_job_fail(j, (int)r);
    } else if (e->kind != FERRY_EXTENT_FILL) {
        atomic_fetch_add(&j->bytes, (uint64_t)r);
    }
issued:;
    size_t issued = atomic_fetch_add(&j->tasks_issued, 1) + 1;
    if (issued == j->ntasks) {
        pthread_mutex_lock(&j->lock);
        pthread_cond_broadcast(&j->cond);
        pthread_mutex_unlock(&j->lock);
    }
    return !deferred;
}
