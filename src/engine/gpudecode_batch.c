/* gpudecode_batch.c — one batch (a per-feeder batch or a cooperative call)
 * on a slot: read its chunks into pinned staging, check and classify them on
 * the CPU, launch one nvCOMP call and the filters, and finish it: statuses
 * back, failures decoded again on the CPU, placement into the destination. */
#include "engine/gpudecode_impl.h"

/* ---- device placement: scratch -> destination box (place.c walks it) ---------------- */
/* The tile-scatter descriptor (16 u64, ferry_cuda_place_batch) of a chunk
 * at src whose box goes to dst; 0 when the box needs more than 3 dimensions
 * of runs (then ferry_place_device's copies do it). */
static int place_desc(uint64_t *q, CUdeviceptr dst, CUdeviceptr src, const ferry_place *place, uint64_t decoded) {
    memset(q, 0, 16 * sizeof *q);
    q[3] = q[4] = q[5] = 1;
    if (!place) { q[0] = src; q[1] = dst; q[2] = decoded; return 1; }
    ferry_place p;
    int m = ferry_place_normalize(place, &p);
    for (int k = 0; k < place->ndim; k++) if (place->count[k] == 0) { q[2] = 0; q[0] = src; q[1] = dst; return 1; }
    if (m == 0) { p.ndim = m = 1; p.count[0] = 1; p.src_stride[0] = p.dst_stride[0] = p.itemsize; }
    int inner = p.src_stride[m - 1] == (int64_t)p.itemsize && p.dst_stride[m - 1] == (int64_t)p.itemsize;
    int rows = inner ? m - 1 : m;
    if (rows > 3) return 0;
    q[0] = src + p.src_offset;
    q[1] = dst;
    q[2] = inner ? p.count[m - 1] * p.itemsize : p.itemsize;
    for (int k = 0; k < rows; k++) {   /* right-aligned into the three row dimensions */
        int slot = 3 - rows + k;
        q[3 + slot] = p.count[k];
        q[6 + slot] = (uint64_t)p.src_stride[k];
        q[9 + slot] = (uint64_t)p.dst_stride[k];
    }
    return 1;
}

static void count_stats(ferry_ctx *ctx, uint64_t gpu_bytes, uint64_t gpu_chunks, uint64_t fallbacks, uint64_t decoded) {
    pthread_mutex_lock(&ctx->stats_lock);
    ctx->stats.gpu_decoded_bytes += gpu_bytes;
    ctx->stats.gpu_chunks += gpu_chunks;
    ctx->stats.gpu_batches += 1;
    ctx->stats.gpu_cpu_fallbacks += fallbacks;
    ctx->stats.decoded_bytes += decoded;
    pthread_mutex_unlock(&ctx->stats_lock);
}

/* Prefix the current message with the chunk's file, variable, byte and codec. */
static int chunk_err(int code, const ferry_extent *e, const char *path, const chain_info *ci) {
    if (e->label)
        return ferry_preerr(code, "%s: variable %s: chunk at byte %llu (%llu bytes, %s)", path, e->label,
                            (unsigned long long)e->offset, (unsigned long long)e->length, ferry_codec_name(ci->codec));
    return ferry_preerr(code, "%s: chunk at byte %llu (%llu bytes, %s)", path, (unsigned long long)e->offset,
                        (unsigned long long)e->length, ferry_codec_name(ci->codec));
}

static const char *ext_path(const ferry_extent *e) { return e->file ? e->file->path : e->path ? e->path : "(chunk)"; }

/* The whole chain on the CPU, into out (decoded_size bytes). */
static int cpu_decode(ferry_worker *w, const ferry_extent *e, const uint8_t *in, uint8_t *out) {
    int64_t r = ferry_decode(e->codecs, e->ncodecs, in, e->length, out, e->decoded_size, &w->scratch);
    if (r < 0) return (int)r;
    if ((uint64_t)r != e->decoded_size)
        return ferry_seterr(FERRY_ECODEC, "decoded %lld bytes where %llu were expected", (long long)r,
                            (unsigned long long)e->decoded_size);
    return 0;
}

static void fill_pattern(uint8_t *out, uint64_t n, const ferry_extent *e) {
    unsigned size = e->place ? e->place->itemsize : 1;
    if (size == 0 || size > 16) size = 1;
    for (uint64_t i = 0; i < n; i++) out[i] = e->fill[i % size];
}

static int add_desc(gd_desc **arr, size_t *n, size_t *cap, gd_desc d) {
    int rc = gd_push((void **)arr, n, cap, sizeof **arr);
    if (rc < 0) return rc;
    (*arr)[(*n)++] = d;
    return 0;
}

/* Read every chunk of the batch into its slot of h. Files named by path come
 * from the context's open-file cache, as for every other reader (a batch
 * used to open and close each chunk's file itself). */
int gd_read_chunks(ferry_worker *w, ferry_job *j, gd_slot *g, size_t k0, size_t k1, uint64_t *file_bytes) {
    gd_chunk *ch = g->ch;
    for (size_t k = k0; k < k1; k++) {
        const ferry_extent *e = &j->ext[ch[k].ext];
        ferry_file *f = e->file;
        if (!f) {
            int rc = ferry_path_file(w, j, e, &f);
            if ((rc == -ENOENT || rc == -ENOTDIR) && (e->flags & FERRY_EXTENT_MISSING_FILLS)) {
                ferry_clearerr();   /* an absent chunk: its box gets the fill value */
                ch[k].kind = K_FILL;
                continue;
            }
            if (rc < 0) return ferry_preerr(rc, "%s", e->path);
        }
        int64_t got = ferry_file_read(f, g->h + ch[k].slot, e->length, e->offset);
        if (got < 0) return ferry_preerr((int)got, "%s: byte %llu", f->path, (unsigned long long)e->offset);
        if ((uint64_t)got < e->length)
            return ferry_seterr(FERRY_ESHORT, "%s: file ends at byte %llu but the chunk at byte %llu has %llu bytes",
                                f->path, (unsigned long long)(e->offset + (uint64_t)got), (unsigned long long)e->offset,
                                (unsigned long long)e->length);
        *file_bytes += (uint64_t)got;
        /* the CPU's checks (crc32c, fletcher32 over the encoded bytes) here,
         * by the reader, so that a cooperative call's checks are spread over
         * every feeder (~280 us per 1 MiB crc32c on one core) */
        size_t len = e->length;
        for (int i = 0; i < ch[k].ci.ncheck; i++) {
            int rc = ferry_codecs_verify_trailer(e->codecs[i].id, g->h + ch[k].slot, &len);
            if (rc < 0) return chunk_err(rc, e, ext_path(e), &ch[k].ci);
        }
        ch[k].len = len;
    }
    return 0;
}

/* Decide, for one chunk read into h, how the GPU decodes it: its items,
 * copies and unshuffles, its output and final places (scratch as offsets
 * from *scr). K_CPU when the GPU cannot take it; an error when it is corrupt. */
static int classify(struct ferry_gpudecode_worker *gw, gd_slot *g, const ferry_nvcomp_api *nv, const ferry_extent *e,
                    gd_chunk *c, uint32_t ci_idx, int kernels, uint64_t *scr) {
    CUdeviceptr dst = (CUdeviceptr)(uintptr_t)e->dst.ptr + e->dst_offset;
    int contig = ferry_place_is_contiguous(e->place, e->decoded_size);
    size_t len = c->len;   /* checked by read_chunks */
    const uint8_t *p = g->h + c->slot;
    int rc;
    ferry_blosc_frame bf;
    memset(&bf, 0, sizeof bf);
    int unshuffle_size = 0;   /* element size of the unshuffle after decoding, 0 none */
    if (c->ci.codec == FERRY_CODEC_BLOSC) {
        if (!gw->bs && !(gw->bs = malloc(MAX_BLOSC_STREAMS * sizeof *gw->bs))) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        rc = ferry_frame_blosc(p, len, e->decoded_size, &bf, gw->bs, MAX_BLOSC_STREAMS);
        if (rc == 0 && (c->ci.shuffle || bf.inner == FERRY_CODEC_ZLIB))
            rc = FERRY_EUNSUPPORTED;   /* a shuffle after blosc; zlib inside blosc (unaligned payloads) */
        if (bf.shuffle || bf.bitshuffle) unshuffle_size = (int)bf.typesize;
    } else {
        rc = ferry_frame_parse(c->ci.codec, p, len, e->decoded_size, &c->fr);
        if (rc == 0 && c->fr.check == FERRY_FRAME_CHECK_CRC32) rc = FERRY_EUNSUPPORTED;   /* no GPU CRC-32 (gzip) */
        unshuffle_size = (int)c->ci.shuffle;
    }
    if (rc == FERRY_EUNSUPPORTED) { ferry_clearerr(); c->kind = K_CPU; }
    else if (rc < 0) return rc;
    int need_kernels = unshuffle_size || c->ci.swap || c->fr.check == FERRY_FRAME_CHECK_ADLER32 ||
                       (c->ci.codec == FERRY_CODEC_BLOSC && (bf.memcpyed || bf.nstreams));
    if (c->kind == K_GPU && need_kernels && !kernels) c->kind = K_CPU;   /* no embedded kernels: the CPU does it all */
    int alg = c->ci.codec == FERRY_CODEC_BLOSC ? (bf.inner == FERRY_CODEC_ZSTD ? FERRY_NVCOMP_ZSTD : FERRY_NVCOMP_LZ4) : c->ci.alg;
    const ferry_nvcomp_align *al = &nv->alg[alg].align;
    if (c->kind == K_GPU) {   /* inputs as nvCOMP wants them aligned */
        if (c->ci.codec == FERRY_CODEC_BLOSC) {
            for (size_t i = 0; i < bf.nstreams; i++)
                if (!gw->bs[i].raw && ((c->slot + gw->bs[i].src_off) % al->input || gw->bs[i].dst_off % al->output)) c->kind = K_CPU;
        } else if ((c->slot + c->fr.payload_off) % al->input) {
            c->kind = K_CPU;   /* an unusual header length: not worth a copy */
        }
    }
    /* where it ends: dst when the chunk is one contiguous run of it, aligned
     * for the swap kernel; else scratch, placed afterwards */
    int fin_dst = contig && (!c->ci.swap || dst % c->ci.swap == 0);
    if (c->kind == K_GPU && !unshuffle_size && dst % al->output) fin_dst = 0;   /* nvCOMP writes there itself */
    if (fin_dst) c->fin = dst;
    else { c->fin = *scr; c->fin_scr = 1; *scr += gd_up(e->decoded_size, 256); c->placed = 1; }
    if (c->kind != K_GPU) return 0;
    if (unshuffle_size) { c->out = *scr; c->out_scr = 1; *scr += gd_up(e->decoded_size, 256); }
    else { c->out = c->fin; c->out_scr = c->fin_scr; }
    /* nvCOMP items, copies, unshuffles (addresses relative to out/fin/din: fixed up later) */
    c->item0 = g->it_n;
    if (c->ci.codec != FERRY_CODEC_BLOSC) {
        if ((rc = gd_push((void **)&g->it, &g->it_n, &g->it_cap, sizeof *g->it)) < 0) return rc;
        g->it[g->it_n++] = (gd_item){ci_idx, alg, c->slot + c->fr.payload_off, c->fr.payload_len, 0, e->decoded_size, 0};
    } else if (bf.memcpyed) {
        if ((rc = add_desc(&g->cp, &g->cp_n, &g->cp_cap, (gd_desc){c->slot + 16, 0, e->decoded_size, 1, 1, 0, 0})) < 0) return rc;
        g->cp[g->cp_n - 1].out = ci_idx;   /* resolved to the chunk's fin below (memcpyed frames are not shuffled) */
        g->cp[g->cp_n - 1].out_scr = -1;
        unshuffle_size = 0;
    } else {
        for (size_t i = 0; i < bf.nstreams; i++) {
            const ferry_blosc_stream *st = &gw->bs[i];
            if (st->raw) {
                if ((rc = add_desc(&g->cp, &g->cp_n, &g->cp_cap, (gd_desc){c->slot + st->src_off, st->dst_off, st->dst_len, 1, 1, 0, 0})) < 0)
                    return rc;
                g->cp[g->cp_n - 1].out_scr = -2 - (int)ci_idx;   /* relative to the chunk's out */
                continue;
            }
            if ((rc = gd_push((void **)&g->it, &g->it_n, &g->it_cap, sizeof *g->it)) < 0) return rc;
            g->it[g->it_n++] = (gd_item){ci_idx, alg, c->slot + st->src_off, st->src_len, st->dst_off, st->dst_len, 0};
        }
    }
    c->nitems = g->it_n - c->item0;
    if (unshuffle_size) {
        if (c->ci.codec == FERRY_CODEC_BLOSC) {   /* blosc (bit)shuffles each block by itself */
            for (uint64_t b = 0; b < bf.nblocks; b++) {
                uint64_t bsize = FERRY_MIN(bf.blocksize, bf.nbytes - b * bf.blocksize);
                gd_desc dd = {b * bf.blocksize, b * bf.blocksize, bsize, (uint64_t)unshuffle_size, 0, (int)ci_idx, 0};
                /* as blosc.c's unfilter: a format version <= 2 block whose element
                 * count is not a multiple of 8 was not bitshuffled, and is copied
                 * (byte unshuffle of size 1); any other bitshuffled block is
                 * bit-unshuffled, 1-byte elements included */
                int copy_only = bf.bitshuffle && bf.version <= 2 && (bsize / bf.typesize) % 8;
                if (copy_only) dd.size = 1;
                if (bf.bitshuffle && !copy_only) rc = add_desc(&g->bu, &g->bu_n, &g->bu_cap, dd);
                else rc = add_desc(&g->un, &g->un_n, &g->un_cap, dd);
                if (rc < 0) return rc;
            }
        } else {
            if ((rc = add_desc(&g->un, &g->un_n, &g->un_cap, (gd_desc){0, 0, e->decoded_size, (uint64_t)unshuffle_size, 0, 0, 0})) < 0) return rc;
            g->un[g->un_n - 1].in_scr = (int)ci_idx;
        }
    }
    return 0;
}

/* A slot's stream and events on device d (the device is current). */
static int slot_ready(gd_slot *g, int d) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    CUresult r = 0;
    if (!g->stream) r = cu->StreamCreate(&g->stream, FERRY_CU_STREAM_NON_BLOCKING);
    if (!r && !g->dec) r = cu->EventCreate(&g->dec, FERRY_CU_EVENT_DISABLE_TIMING);
    if (!r && !g->done) r = cu->EventCreate(&g->done, FERRY_CU_EVENT_DISABLE_TIMING);
    if (r) return ferry_seterr(FERRY_ECUDA, "device %d: GPU decode stream/events: %s", d, ferry_cuda_errstr(r));
    return 0;
}


/* ---- the batch ------------------------------------------------------------------- */
/* A batch on slot g, in three steps: gd_batch_layout (its stream and events,
 * the slot's previous batch placed, every chunk's place in pinned staging h),
 * gd_read_chunks (any feeder, any range of its chunks), gd_batch_launch (check and
 * frame every chunk on the CPU, enqueue the copy up, the nvCOMP calls, the
 * filters and the results' copy back on the slot's stream, then decode on
 * the CPU the chunks the GPU does not take). finish_batch completes it.
 * min_h / min_din: sizes to grow h and din to at least (cooperative slots are
 * grown once to the job's largest call, 0 otherwise). */
int gd_batch_layout(ferry_worker *w, ferry_job *j, gd_queue *Q, const uint32_t *idx, size_t n, gd_slot *g,
                    ferry_decode_trace *tr, uint64_t min_h, uint64_t min_din) {
    uint64_t tlap = tr ? ferry_dt_now() : 0;
    const int d = Q->dev;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    int rc = ferry_cuda_use_device(d);
    if (rc < 0) return rc;
    if ((rc = slot_ready(g, d)) < 0) return rc;
    CUresult r;
    if (g->busy) {   /* the slot's previous batch may still be placed from its buffers */
        if ((r = cu->EventSynchronize(g->done))) return ferry_seterr(FERRY_ECUDA, "device %d: GPU decode failed: %s", d, ferry_cuda_errstr(r));
        g->busy = 0;
    }
    ferry_dt_lap(tr, FERRY_DT_PREV, &tlap);
    ferry_dt_batch_begin(tr);
    g->dev = d;
    g->n = n;
    g->q = Q;
    g->file_bytes = g->cpu_fallbacks = 0;
    g->flying = 0;
    g->open = 1;   /* from here on finish_batch or the feeder's failure path ends it */
    if (g->ch_cap < n) {
        gd_chunk *c = realloc(g->ch, n * sizeof *c);
        if (!c) return ferry_seterr(FERRY_ENOMEM, "out of memory");
        g->ch = c;
        g->ch_cap = n;
    }
    gd_chunk *ch = g->ch;
    g->kernels = ferry_cuda_kernels_ready(d);
    g->it_n = g->cp_n = g->un_n = g->bu_n = 0;

    /* slots: where each chunk's framed bytes go (intact, for the CPU's checks) */
    const ferry_nvcomp_api *nv = ferry_nvcomp_load(NULL);
    const int line = gd_line_slots(j->ctx);
    uint64_t hsize = 0;
    for (size_t k = 0; k < n; k++) {
        const ferry_extent *e = &j->ext[idx[k]];
        memset(&ch[k], 0, sizeof ch[k]);
        ch[k].ext = idx[k];
        gd_gpu_chain(e, &ch[k].ci);
        unsigned hdr = ch[k].ci.codec == FERRY_CODEC_ZLIB ? 2 : ch[k].ci.codec == FERRY_CODEC_LZ4 ? 4 : 0;
        unsigned align = 8;   /* blosc's inner streams, and any codec nvCOMP does not say */
        if (nv && ch[k].ci.alg < FERRY_NVCOMP_NALG && nv->alg[ch[k].ci.alg].align.input) align = (unsigned)nv->alg[ch[k].ci.alg].align.input;
        ch[k].slot = line ? ferry_gpudecode_slot(hsize, e->offset, hdr, align) : hsize + (8 - hdr) % 8;
        hsize = line ? ch[k].slot + e->length : hsize + gd_up(e->length + 8, 8);
    }
    g->hsize = hsize;
    if ((rc = gd_host_grow(w, g->hplain ? -1 : d, &g->h, &g->hcap, &g->hpinned, FERRY_MAX(hsize, min_h) ? FERRY_MAX(hsize, min_h) : 1)) < 0)
        return rc;
    if (min_din && (rc = gd_dev_fit(g->dev, &g->din, &g->din_cap, FERRY_MAX(hsize, min_din))) < 0) return rc;
    ferry_dt_lap(tr, FERRY_DT_LAYOUT, &tlap);
    return 0;
}
/* The rest of a batch whose chunks are all in h (batch_layout says what).
 * coop: the payloads are on the device already (each reader copied its
 * range up); only the arrays go up, into darr. */
int gd_batch_launch(ferry_worker *w, ferry_job *j, gd_slot *g, ferry_decode_trace *tr, int coop) {
    uint64_t tlap = tr ? ferry_dt_now() : 0;
    const int d = g->dev;
    const size_t n = g->n;
    const uint64_t hsize = g->hsize;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    const ferry_nvcomp_api *nv = ferry_nvcomp_load(NULL);
    struct ferry_gpudecode_worker *gw = w->gpu;
    gd_chunk *ch = g->ch;
    const int kernels = g->kernels;
    CUstream s = g->stream;
    CUresult r;
    int rc = ferry_cuda_use_device(d);
    if (rc < 0) return rc;


    /* CPU checks and framing: items, descriptors, outputs */
    uint64_t scr = 0, cpu_total = 0;
    for (size_t k = 0; k < n; k++) {
        gd_chunk *c = &ch[k];
        const ferry_extent *e = &j->ext[c->ext];
        if (c->kind == K_GPU && (rc = classify(gw, g, nv, e, c, (uint32_t)k, kernels, &scr)) < 0)
            return chunk_err(rc, e, ext_path(e), &c->ci);
        if (c->kind == K_GPU) continue;
        if (c->kind == K_FILL) {   /* classify chose the others' places */
            CUdeviceptr dst = (CUdeviceptr)(uintptr_t)e->dst.ptr + e->dst_offset;
            if (ferry_place_is_contiguous(e->place, e->decoded_size)) c->fin = dst;
            else { c->fin = scr; c->fin_scr = 1; scr += gd_up(e->decoded_size, 256); c->placed = 1; }
        }
        c->cpu_pos = cpu_total;
        cpu_total += gd_up(e->decoded_size, 64);
    }
    if (scr && (rc = gd_dev_grow(g->dev, &g->dscr, &g->dscr_cap, scr)) < 0) return rc;
    for (size_t k = 0; k < n; k++) {
        if (ch[k].out_scr) ch[k].out += g->dscr;
        if (ch[k].fin_scr) ch[k].fin += g->dscr;
    }
    ferry_dt_lap(tr, FERRY_DT_FRAME, &tlap);

    /* the arrays nvCOMP reads, per algorithm, then the descriptors, after the payloads */
    size_t na[FERRY_NVCOMP_NALG] = {0, 0, 0}, q0[FERRY_NVCOMP_NALG];
    uint64_t max_out[FERRY_NVCOMP_NALG] = {0, 0, 0}, tot_out[FERRY_NVCOMP_NALG] = {0, 0, 0};
    for (size_t i = 0; i < g->it_n; i++) {
        gd_item *it = &g->it[i];
        na[it->alg]++;
        tot_out[it->alg] += it->out_len;
        if (it->out_len > max_out[it->alg]) max_out[it->alg] = it->out_len;
    }
    size_t nitems = g->it_n, q = 0;
    for (int a = 0; a < FERRY_NVCOMP_NALG; a++) { q0[a] = q; q += na[a]; }
    const uint64_t arr = gd_up(hsize, 64);
    const uint64_t a_cp = arr + 32 * (uint64_t)nitems, a_un = a_cp + 32 * (uint64_t)g->cp_n;
    const uint64_t a_bu = a_un + 32 * (uint64_t)g->un_n, htotal = a_bu + 32 * (uint64_t)g->bu_n;
    const uint64_t res_size = g->res_size = gd_up(4 * (uint64_t)nitems, 8);
    const uint64_t res_adler = g->res_adler = res_size + 8 * (uint64_t)nitems;
    const uint64_t res_total = res_adler + 4 * (uint64_t)nitems + 8;
    int any_gpu = g->any_gpu = nitems || g->cp_n || g->un_n || g->bu_n;
    size_t temp = 0;
    ferry_nvcomp_opts opts;
    memset(&opts, 0, sizeof opts);
    if (any_gpu) {
        if (htotal > g->hcap) {   /* the arrays did not fit behind the payloads: grow, keeping the chunks */
            if (coop && (r = cu->StreamSynchronize(s)))   /* the readers' copies up from h may be pending */
                return ferry_seterr(FERRY_ECUDA, "device %d: GPU decode failed: %s", d, ferry_cuda_errstr(r));
            uint8_t *nb = NULL; size_t ncap = 0; int npin = 0;
            if ((rc = gd_host_grow(w, g->hplain ? -1 : d, &nb, &ncap, &npin, htotal)) < 0) return rc;
            memcpy(nb, g->h, hsize);
            uint8_t *ob = g->h; size_t ocap = g->hcap; int opin = g->hpinned;
            g->h = nb; g->hcap = ncap; g->hpinned = npin;
            ferry_worker_free_host(ob, ocap, opin);
        }
        for (int a = 0; a < FERRY_NVCOMP_NALG; a++) {
            if (!na[a]) continue;
            size_t t = 0;
            ferry_nvcomp_status_t st = ferry_nvcomp_temp_size(nv, a, na[a], max_out[a], opts, &t, tot_out[a], s);
            if (st) return ferry_seterr(FERRY_ECUDA, "nvCOMP batched decompress: temp size for %zu chunks: %s", na[a], ferry_nvcomp_errstr(st));
            if (t > temp) temp = t;   /* the calls run one after another on one stream: one temp serves all */
        }
        /* device arrays: behind the payloads in din, or (coop: din holds the
         * payloads already) in darr */
        if (coop ? (rc = gd_dev_grow(g->dev, &g->darr, &g->darr_cap, htotal - arr)) < 0 : (rc = gd_dev_grow(g->dev, &g->din, &g->din_cap, htotal)) < 0)
            return rc;
        const CUdeviceptr abase = coop ? g->darr : g->din + arr;
        if ((rc = gd_dev_grow(g->dev, &g->dres, &g->dres_cap, res_total)) < 0) return rc;
        if (temp && (rc = gd_dev_grow(g->dev, &g->dtemp, &g->dtemp_cap, temp)) < 0) return rc;
        if ((rc = gd_host_grow(w, d, &g->hres, &g->hres_cap, &g->hres_pinned, res_total)) < 0) return rc;
        /* items: q ordered by algorithm; four arrays of nitems u64 entries */
        uint64_t *in_ptrs = (uint64_t *)(g->h + arr), *in_bytes = in_ptrs + nitems, *out_ptrs = in_bytes + nitems,
                 *out_caps = out_ptrs + nitems;
        size_t next[FERRY_NVCOMP_NALG];
        memcpy(next, q0, sizeof next);
        for (size_t i = 0; i < nitems; i++) {
            gd_item *it = &g->it[i];
            it->q = next[it->alg]++;
            in_ptrs[it->q] = g->din + it->in_pos;
            in_bytes[it->q] = it->in_len;
            out_ptrs[it->q] = ch[it->chunk].out + it->out_off;
            out_caps[it->q] = it->out_len;
        }
        uint64_t *cp = (uint64_t *)(g->h + a_cp), *un = (uint64_t *)(g->h + a_un), *bu = (uint64_t *)(g->h + a_bu);
        for (size_t i = 0; i < g->cp_n; i++) {
            const gd_desc *dd = &g->cp[i];
            uint64_t out = dd->out_scr == -1 ? ch[dd->out].fin : ch[-2 - dd->out_scr].out + dd->out;
            cp[4 * i] = g->din + dd->in; cp[4 * i + 1] = out; cp[4 * i + 2] = dd->n; cp[4 * i + 3] = 1;
        }
        for (size_t i = 0; i < g->un_n; i++) {
            const gd_desc *dd = &g->un[i];
            un[4 * i] = ch[dd->in_scr].out + dd->in; un[4 * i + 1] = ch[dd->in_scr].fin + dd->out;
            un[4 * i + 2] = dd->n; un[4 * i + 3] = dd->size;
        }
        for (size_t i = 0; i < g->bu_n; i++) {
            const gd_desc *dd = &g->bu[i];
            bu[4 * i] = ch[dd->in_scr].out + dd->in; bu[4 * i + 1] = ch[dd->in_scr].fin + dd->out;
            bu[4 * i + 2] = dd->n; bu[4 * i + 3] = dd->size;
        }
        /* one copy up; copies, one nvCOMP call per algorithm, Adler-32s,
         * unshuffles, byteswaps; one copy of the results back */
        if (tr) ferry_dt_mark(&tr->t_h2d0, ferry_dt_now());
        if ((rc = coop ? gd_up_copy(w, g, g->darr, g->h + arr, htotal - arr, s) : gd_up_copy(w, g, g->din, g->h, htotal, s)) < 0) return rc;
        if (g->cp_n && (rc = ferry_cuda_unshuffle_batch(d, abase + (a_cp - arr), g->cp_n, 0, s)) < 0) return rc;
        if (tr && nitems) { uint64_t t = ferry_dt_now(); ferry_dt_mark(&tr->t_nv0, t); ferry_dt_mark_max(&tr->t_nv1, t); }
        for (int a = 0; a < FERRY_NVCOMP_NALG; a++) {
            if (!na[a]) continue;
            CUdeviceptr base = abase;
            ferry_nvcomp_status_t st = nv->alg[a].DecompressAsync(
                (const void *const *)(uintptr_t)(base + 8 * q0[a]), (const size_t *)(uintptr_t)(base + 8 * (nitems + q0[a])),
                (const size_t *)(uintptr_t)(base + 8 * (3 * nitems + q0[a])), (size_t *)(uintptr_t)(g->dres + res_size + 8 * q0[a]),
                na[a], temp ? (void *)(uintptr_t)g->dtemp : NULL, temp, (void *const *)(uintptr_t)(base + 8 * (2 * nitems + q0[a])),
                opts, (ferry_nvcomp_status_t *)(uintptr_t)(g->dres + 4 * q0[a]), s);
            if (st)
                return ferry_seterr(FERRY_ECUDA, "nvCOMP batched %s decompress of %zu chunks: %s",
                                    a == FERRY_NVCOMP_ZSTD ? "zstd" : a == FERRY_NVCOMP_LZ4 ? "LZ4" : "Deflate", na[a], ferry_nvcomp_errstr(st));
            if (a == FERRY_NVCOMP_DEFLATE &&
                (rc = ferry_cuda_adler32_batch(d, base + 8 * (2 * nitems + q0[a]), base + 8 * (3 * nitems + q0[a]),
                                               g->dres + res_adler + 4 * q0[a], na[a], s)) < 0)
                return rc;
        }
        if (g->un_n && (rc = ferry_cuda_unshuffle_batch(d, abase + (a_un - arr), g->un_n, 0, s)) < 0) return rc;
        if (g->bu_n && (rc = ferry_cuda_unshuffle_batch(d, abase + (a_bu - arr), g->bu_n, 1, s)) < 0) return rc;
        for (size_t k = 0; k < n; k++)
            if (ch[k].kind == K_GPU && ch[k].ci.swap &&
                (rc = ferry_cuda_byteswap(d, ch[k].fin, j->ext[ch[k].ext].decoded_size / ch[k].ci.swap, ch[k].ci.swap, s)) < 0)
                return rc;
        if ((r = cu->MemcpyDtoHAsync(g->hres, g->dres, res_total, s)) || (r = cu->EventRecord(g->dec, s)))
            return ferry_seterr(FERRY_ECUDA, "cuMemcpyDtoHAsync: %s", ferry_cuda_errstr(r));
        ferry_dt_in_flight(tr, 1, nitems);
        g->flying = 1;
    }
    ferry_dt_lap(tr, FERRY_DT_ENQUEUE, &tlap);

    /* meanwhile: the chunks the CPU decodes */
    if (cpu_total && (rc = gd_host_grow(w, d, &g->hcpu, &g->hcpu_cap, &g->hcpu_pinned, cpu_total)) < 0) return rc;
    for (size_t k = 0; k < n; k++) {
        gd_chunk *c = &ch[k];
        const ferry_extent *e = &j->ext[c->ext];
        if (c->kind == K_FILL) fill_pattern(g->hcpu + c->cpu_pos, e->decoded_size, e);
        else if (c->kind == K_CPU) {
            if ((rc = cpu_decode(w, e, g->h + c->slot, g->hcpu + c->cpu_pos)) < 0) return chunk_err(rc, e, ext_path(e), &c->ci);
            g->cpu_fallbacks++;
        }
    }
    ferry_dt_lap(tr, FERRY_DT_CPU, &tlap);
    return 0;
}

/* All three steps on one feeder (per-feeder batches: shared queues). */
int gd_start_batch(ferry_worker *w, ferry_job *j, gd_queue *Q, const uint32_t *idx, size_t n, gd_slot *g,
                   ferry_decode_trace *tr) {
    int rc = gd_batch_layout(w, j, Q, idx, n, g, tr, 0, 0);
    if (rc < 0) return rc;
    uint64_t tlap = tr ? ferry_dt_now() : 0;
    if (tr) ferry_dt_mark(&tr->t_read0, tlap);
    if ((rc = gd_read_chunks(w, j, g, 0, n, &g->file_bytes)) < 0) return rc;
    ferry_dt_lap(tr, FERRY_DT_READ, &tlap);
    if (tr) ferry_dt_mark_max(&tr->t_read1, tlap);
    return gd_batch_launch(w, j, g, tr, 0);
}

/* Second half of the batch in slot g: wait for its decode, check every
 * item's status, size and Adler-32 (the CPU decodes again what fails: its
 * limits, or the corruption it names), then enqueue the CPU-decoded chunks'
 * copies up and the placement of scratch into the destination. Returns the
 * batch's file bytes. */
int64_t gd_finish_batch(ferry_worker *w, ferry_job *j, gd_slot *g, ferry_decode_trace *tr) {
    uint64_t tlap = tr ? ferry_dt_now() : 0;
    const int d = g->dev;
    const size_t n = g->n;
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    gd_dev *gdv = &w->gpu->dev[d];
    gd_chunk *ch = g->ch;
    CUstream s = g->stream;
    CUresult r;
    int rc = ferry_cuda_use_device(d);
    if (rc < 0) return rc;
    uint64_t fallbacks = g->cpu_fallbacks, gpu_bytes = 0, gpu_chunks = 0, dec = 0;
    if (g->any_gpu) {
        r = cu->EventSynchronize(g->dec);
        ferry_dt_lap(tr, FERRY_DT_WAIT, &tlap);
        if (tr) ferry_dt_mark_max(&tr->t_done, ferry_dt_now());
        if (g->flying) { ferry_dt_in_flight(tr, -1, g->it_n); g->flying = 0; }
        if (r) return ferry_seterr(FERRY_ECUDA, "device %d: GPU decode failed: %s", d, ferry_cuda_errstr(r));
        const int32_t *sts = (const int32_t *)g->hres;
        const uint64_t *sizes = (const uint64_t *)(g->hres + g->res_size);
        const uint32_t *adl = (const uint32_t *)(g->hres + g->res_adler);
        for (size_t k = 0; k < n; k++) {
            gd_chunk *c = &ch[k];
            if (c->kind != K_GPU) continue;
            const ferry_extent *e = &j->ext[c->ext];
            const char *why = NULL;
            char buf[96];
            for (size_t i = c->item0; i < c->item0 + c->nitems && !why; i++) {
                const gd_item *it = &g->it[i];
                if (sts[it->q]) why = ferry_nvcomp_errstr(sts[it->q]);
                else if (sizes[it->q] != it->out_len) {
                    snprintf(buf, sizeof buf, "decoded %llu bytes where %llu were expected", (unsigned long long)sizes[it->q],
                             (unsigned long long)it->out_len);
                    why = buf;
                } else if (it->alg == FERRY_NVCOMP_DEFLATE && c->fr.check == FERRY_FRAME_CHECK_ADLER32 && adl[it->q] != c->fr.check_value) {
                    snprintf(buf, sizeof buf, "Adler-32 %08x, the stream says %08x", adl[it->q], c->fr.check_value);
                    why = buf;
                }
            }
            if (!why) { gpu_bytes += e->decoded_size; gpu_chunks++; continue; }
            /* nvCOMP could not, or its output fails the check: the CPU decodes
             * it (nvCOMP's limits) or names the corruption */
            if ((rc = gd_host_grow(w, d, &gdv->hfb, &gdv->hfb_cap, &gdv->hfb_pinned, e->decoded_size)) < 0) return rc;
            if ((rc = cpu_decode(w, e, g->h + c->slot, gdv->hfb)) < 0) {
                ferry_preerr(rc, "nvCOMP: %s; the CPU decoder", why);
                return chunk_err(rc, e, ext_path(e), &c->ci);
            }
            /* the CPU ran the whole chain: its bytes go where the filters' went */
            if ((r = cu->MemcpyHtoDAsync(c->fin, gdv->hfb, e->decoded_size, s)) || (r = cu->StreamSynchronize(s)))
                return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(r));
            c->kind = K_DONE;
            fallbacks++;
        }
    }
    ferry_dt_lap(tr, FERRY_DT_FALLBACK, &tlap);

    /* CPU-decoded chunks up, then scratch placed into the boxes: one tile
     * scatter kernel for the batch (its descriptors through h and din, both
     * free again: the decode is complete), copies where it cannot */
    size_t nplace = 0;
    uint64_t *pd = NULL;
    for (size_t k = 0; k < n; k++) nplace += ch[k].placed;
    if (nplace && g->kernels) {
        if ((rc = gd_host_grow(w, g->hplain ? -1 : d, &g->h, &g->hcap, &g->hpinned, 128 * nplace)) < 0) return rc;
        if ((rc = gd_dev_grow(g->dev, &g->din, &g->din_cap, 128 * nplace)) < 0) return rc;
        pd = (uint64_t *)g->h;
    }
    size_t np = 0;
    for (size_t k = 0; k < n; k++) {
        gd_chunk *c = &ch[k];
        const ferry_extent *e = &j->ext[c->ext];
        dec += e->decoded_size;
        if ((c->kind == K_CPU || c->kind == K_FILL) && (r = cu->MemcpyHtoDAsync(c->fin, g->hcpu + c->cpu_pos, e->decoded_size, s)))
            return ferry_seterr(FERRY_ECUDA, "cuMemcpyHtoDAsync: %s", ferry_cuda_errstr(r));
        if (!c->placed) continue;
        CUdeviceptr base = (CUdeviceptr)(uintptr_t)e->dst.ptr + e->dst_offset;
        if (pd && place_desc(pd + 16 * np, base, c->fin, e->place, e->decoded_size)) { np++; continue; }
        if ((rc = ferry_place_device(cu, s, base, c->fin, 1, e->place, e->decoded_size)) < 0) return rc;
    }
    if (np) {
        if ((rc = gd_up_copy(w, g, g->din, g->h, 128 * np, s)) < 0) return rc;
        if ((rc = ferry_cuda_place_batch(d, g->din, np, s)) < 0) return rc;
    }
    if ((r = cu->EventRecord(g->done, s))) return ferry_seterr(FERRY_ECUDA, "cuEventRecord: %s", ferry_cuda_errstr(r));
    g->open = 0;   /* checked: only on success (a failure leaves it open: the feeder synchronizes it) */
    g->busy = 1;
    if (g->q->shared) atomic_fetch_sub(&g->q->gpu_out, dec);
    atomic_fetch_add(&j->path_bytes[FERRY_PATH_STAGED], g->file_bytes);
    atomic_fetch_add(&j->path_ops[FERRY_PATH_STAGED], n);
    count_stats(w->ctx, gpu_bytes, gpu_chunks, fallbacks, dec);
    ferry_dt_lap(tr, FERRY_DT_PLACE, &tlap);
    ferry_dt_batch_end(tr, n, g->it_n, dec, g->cpu_fallbacks, fallbacks - g->cpu_fallbacks);
    return (int64_t)g->file_bytes;
}
