/* mds.c — Mosaic streaming (MDS) directories: index.json and its shards.
 *
 * index.json (mosaicml-streaming's base/format/base/writer.py and
 * mds/writer.py, version 2):
 *   {"version": 2, "shards": [{"format": "mds", "version": 2, "samples": N,
 *     "column_names": [...], "column_encodings": [...], "column_sizes": [n|null],
 *     "compression": null | "zstd" | "zstd:LEVEL" | other,
 *     "raw_data": {"basename": "shard.00000.mds", "bytes": B, ...},
 *     "zip_data": null | {"basename": "shard.00000.mds.zstd", "bytes": Z, ...}, ...}]}
 * Columns are stored in the order of column_names (the writer sorts them);
 * column_sizes gives a fixed-size encoding's bytes ("int": 8, "ndarray:u1:3,4":
 * 12) and null for variable ones. A compressed shard is only its zip_data
 * file (the writer deletes the raw one): zstd of the whole raw shard.
 *
 * A raw shard (MDSWriter.encode_joint_shard, little-endian u32 throughout):
 *   num_samples, then num_samples + 1 offsets (absolute: the first is past
 *   the header and the writer's JSON config, the last is the file's size),
 *   then the samples; sample i is [off[i], off[i+1]): one u32 size per
 *   variable-size column, then every column's bytes in column order.
 * So each sample's member offsets come from its few header bytes: read
 * through windows (shards.h) while samples are small.
 *
 * Checked: the shard's num_samples equals index.json's samples; offsets lie
 * past the table, ascend and end at the file's end; each sample's sizes add
 * up to its span exactly; file sizes equal what index.json records.
 *
 * The directory may be a URL (s3://bucket/mds/, https://host/mds): index.json
 * and the shards are read as objects, 16 shards at a time; each shard stays
 * open in the set, so its members are read from the version indexed
 * (shards.h). */
#include "formats/shards.h"
#include "sources/remote.h"
#include <errno.h>
#include <stdlib.h>

#define MDS_MAX_INDEX ((size_t)64 << 20)
#define MDS_MAX_SHARD ((uint64_t)UINT32_MAX)    /* offsets are u32 */

int ferry_mds_parse_shard(ferry_shards *s, ferry_window *w, uint32_t file, uint64_t samples, const uint32_t *names,
                          const uint64_t *fixed, size_t ncols) {
    const char *path = w->path;
    uint64_t size = w->size;
    const uint8_t *p;
    int rc;
    if (size < 8)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte 0: %llu bytes, too short for an MDS shard", path,
                            (unsigned long long)size);
    if ((rc = ferry_window_get(w, 0, 4, FERRY_WINDOW_MAX, &p)) < 0) return rc;
    uint64_t n = ferry_le32(p);
    if (n != samples)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte 0: %llu samples; index.json says %llu", path,
                            (unsigned long long)n, (unsigned long long)samples);
    uint64_t table_end = 4 + 4 * (n + 1);   /* n < 2^32: no overflow */
    if (table_end > size)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte 0: %llu samples need a %llu-byte offset table; the shard has %llu"
                            " bytes", path, (unsigned long long)n, (unsigned long long)table_end,
                            (unsigned long long)size);
    uint32_t *off = malloc((size_t)(n + 1) * sizeof *off);
    if (!off) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory for %llu offsets", path, (unsigned long long)n);
    for (uint64_t i = 0; i <= n && rc >= 0;) {
        size_t k = (size_t)FERRY_MIN(n + 1 - i, FERRY_WINDOW_MAX / 4);
        if ((rc = ferry_window_get(w, 4 + 4 * i, 4 * k, FERRY_WINDOW_MAX, &p)) < 0) break;
        for (size_t j = 0; j < k; j++) off[i + j] = ferry_le32(p + 4 * j);
        i += k;
    }
    size_t nvar = 0;
    uint64_t fixed_sum = 0;
    for (size_t c = 0; c < ncols; c++) {
        if (fixed[c] == UINT64_MAX) nvar++;
        else fixed_sum += fixed[c];   /* each at most 2^32 (checked by the caller), ncols <= 4096 */
    }
    uint64_t hdr = 4 * nvar, avg = n ? (size - table_end) / n : 0;
    uint64_t *sizes = malloc((ncols ? ncols : 1) * sizeof *sizes);
    char key[320];
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (rc >= 0 && !sizes) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    if (rc >= 0 && (off[0] < table_end || off[n] != size))
        rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: samples span [%u, %u); the offset table ends at %llu and the"
                          " shard at %llu", path, off[0] < table_end ? 4ull : 4 + 4 * n, off[0], off[n],
                          (unsigned long long)table_end, (unsigned long long)size);
    for (uint64_t i = 0; i < n && rc >= 0; i++) {
        uint64_t at = off[i], len;
        if (off[i + 1] < off[i]) {
            rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: sample %llu ends (%u) before it starts (%u)", path,
                              (unsigned long long)(4 + 4 * (i + 1)), (unsigned long long)i, off[i + 1], off[i]);
            break;
        }
        len = off[i + 1] - at;
        if (len < hdr) {
            rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: sample %llu has %llu bytes, fewer than its %zu column sizes",
                              path, (unsigned long long)at, (unsigned long long)i, (unsigned long long)len, nvar);
            break;
        }
        if (hdr && (rc = ferry_window_get(w, at, (size_t)hdr, avg < FERRY_WINDOW_MAX / 4 ? FERRY_WINDOW_MAX : hdr,
                                          &p)) < 0)
            break;
        uint64_t total = hdr + fixed_sum;
        for (size_t c = 0, v = 0; c < ncols; c++) {
            sizes[c] = fixed[c] == UINT64_MAX ? ferry_le32(p + 4 * v++) : fixed[c];
            if (fixed[c] == UINT64_MAX) total += sizes[c];
        }
        if (total != len) {
            rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: sample %llu: its columns add up to %llu bytes, it spans %llu",
                              path, (unsigned long long)at, (unsigned long long)i, (unsigned long long)total,
                              (unsigned long long)len);
            break;
        }
        int kl = snprintf(key, sizeof key, "%.300s:%llu", base, (unsigned long long)i);
        if ((rc = ferry_shards_begin_sample(s, key, (size_t)kl, -1)) < 0) break;
        uint64_t m = at + hdr;
        for (size_t c = 0; c < ncols && rc >= 0; c++) {
            rc = ferry_shards_add_member(s, names[c], file, m, sizes[c], at);
            m += sizes[c];
        }
    }
    free(sizes);
    free(off);
    return rc;
}

/* ---- index.json ------------------------------------------------------------ */
static int read_small(ferry_ctx *ctx, const char *path, size_t max, char **out, size_t *len) {
    ferry_file *f;
    int rc = ferry_file_open(ctx, path, FERRY_READ, &f);
    if (rc < 0) return ferry_preerr(rc, "%s", path);
    int64_t size = ferry_file_size(f);
    char *buf = NULL;
    if (size < 0) rc = (int)size;
    else if ((uint64_t)size > max)
        rc = ferry_seterr(FERRY_EFORMAT, "%s: %lld bytes, more than the %zu an index may have", path, (long long)size, max);
    else if (!(buf = malloc((size_t)size + 1))) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    else {
        int64_t got = ferry_pread(f, ferry_host_buf(buf, (size_t)size), 0, (size_t)size, FERRY_NO_DIRECT);
        if (got != size) rc = got < 0 ? (int)got : ferry_seterr(FERRY_ESHORT, "%s: shorter than its size", path);
    }
    ferry_file_close(f);
    if (rc < 0) { free(buf); return rc; }
    buf[size] = 0;
    *out = buf;
    *len = (size_t)size;
    return 0;
}

static int field_err(const char *path, const ferry_json *at, size_t shard, const char *what) {
    return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: shards[%zu]: %s", path, (unsigned long long)(at ? at->pos : 0),
                        shard, what);
}

/* A shard's file: dir/basename; the basename must be a plain name. */
static int shard_file(const char *dir, const char *ipath, const ferry_json *info, size_t k, char *out, size_t cap,
                      uint64_t *bytes) {
    const char *b = ferry_json_str(ferry_json_get(info, "basename"));
    if (!b || !*b || strchr(b, '/') || !strcmp(b, "..") || !strcmp(b, "."))
        return field_err(ipath, info, k, "basename: expected a file name");
    if (ferry_json_u64(ferry_json_get(info, "bytes"), bytes) < 0)
        return field_err(ipath, info, k, "bytes: expected a byte count");
    if ((size_t)snprintf(out, cap, "%s/%s", dir, b) >= cap) return field_err(ipath, info, k, "path too long");
    return 0;
}

static int mds_shard(ferry_shards *s, const char *dir, const char *ipath, const ferry_json *sh, size_t k) {
    const ferry_json *names = ferry_json_get(sh, "column_names"), *encs = ferry_json_get(sh, "column_encodings");
    const ferry_json *sizes = ferry_json_get(sh, "column_sizes"), *zip = ferry_json_get(sh, "zip_data");
    const char *fmt = ferry_json_str(ferry_json_get(sh, "format"));
    uint64_t samples;
    if (!sh || sh->type != FERRY_JSON_OBJECT) return field_err(ipath, sh, k, "expected an object");
    if (!fmt || strcmp(fmt, "mds"))
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: shards[%zu]: format \"%s\": ferry reads \"mds\" shards", ipath, k,
                            fmt ? fmt : "(missing)");
    if (ferry_json_u64(ferry_json_get(sh, "samples"), &samples) < 0 || samples > UINT32_MAX)
        return field_err(ipath, sh, k, "samples: expected a count below 2^32");
    if (!names || names->type != FERRY_JSON_ARRAY || !encs || encs->type != FERRY_JSON_ARRAY || !sizes ||
        sizes->type != FERRY_JSON_ARRAY || names->n != encs->n || names->n != sizes->n || names->n == 0)
        return field_err(ipath, sh, k, "column_names, column_encodings and column_sizes: expected arrays of one length");
    if (names->n > FERRY_SHARD_MAX_MEMBERS) return field_err(ipath, names, k, "too many columns");
    size_t nc = names->n;
    uint32_t *nm = malloc(nc * sizeof *nm);
    uint64_t *fixed = malloc(nc * sizeof *fixed);
    int rc = (!nm || !fixed) ? ferry_seterr(FERRY_ENOMEM, "out of memory") : 0;
    for (size_t c = 0; c < nc && rc >= 0; c++) {
        const char *n = ferry_json_str(&names->items[c]), *e = ferry_json_str(&encs->items[c]);
        if (!n || !e || !*n || !*e) { rc = field_err(ipath, &names->items[c], k, "column name or encoding not a string"); break; }
        if (sizes->items[c].type == FERRY_JSON_NULL) fixed[c] = UINT64_MAX;
        else if (ferry_json_u64(&sizes->items[c], &fixed[c]) < 0 || fixed[c] > UINT32_MAX) {
            rc = field_err(ipath, &sizes->items[c], k, "column size: expected null or a byte count");
            break;
        }
        if ((rc = ferry_shards_name(s, n, strlen(n), e, &nm[c])) < 0) rc = ferry_preerr(rc, "%s: shards[%zu]", ipath, k);
    }
    char path[4096];
    uint64_t bytes = 0, raw_bytes = 0;
    if (rc >= 0) rc = shard_file(dir, ipath, ferry_json_get(sh, "raw_data"), k, path, sizeof path, &raw_bytes);
    if (rc >= 0 && raw_bytes > MDS_MAX_SHARD) rc = field_err(ipath, sh, k, "raw_data: more than 4 GiB");
    int zipped = zip && zip->type != FERRY_JSON_NULL;
    if (rc >= 0 && zipped) {
        const char *comp = ferry_json_str(ferry_json_get(sh, "compression"));
        if (!comp || strncmp(comp, "zstd", 4) || (comp[4] && comp[4] != ':'))
            rc = ferry_seterr(FERRY_EUNSUPPORTED, "%s: shards[%zu]: compression \"%s\": ferry reads zstd-compressed"
                              " shards only", ipath, k, comp ? comp : "(missing)");
        else rc = shard_file(dir, ipath, zip, k, path, sizeof path, &bytes);
    } else {
        bytes = raw_bytes;
    }
    /* opened once: its size checked against index.json's, its header parsed
     * through it, and at a URL kept by the set (its reads pinned to this version) */
    ferry_file *f = NULL;
    int64_t have = 0;
    if (rc >= 0 && (rc = ferry_file_open(s->ctx, path, FERRY_READ, &f)) < 0)
        rc = ferry_preerr(rc, "shards[%zu] of %s", k, ipath);
    if (rc >= 0 && (have = ferry_file_size(f)) < 0) rc = (int)have;
    if (rc >= 0 && (uint64_t)have != bytes)
        rc = ferry_seterr(FERRY_EFORMAT, "%s: %llu bytes; %s says %llu (truncated or replaced?)", path,
                          (unsigned long long)have, ipath, (unsigned long long)bytes);
    uint32_t file;
    if (rc >= 0) rc = ferry_shards_add_file(s, path, bytes, &file);
    if (rc >= 0 && ferry_remote_is_url(path)) {
        ferry_shards_hold(s, file, f);
        f = NULL;
    }
    if (rc >= 0 && !zipped) {
        ferry_window w = {.path = path, .size = bytes, .f = f ? f : s->files[file].held};
        rc = ferry_mds_parse_shard(s, &w, file, samples, nm, fixed, nc);
        ferry_window_free(&w);
    } else if (rc >= 0) {
        uint8_t *raw = NULL;
        ferry_decode_scratch scratch;
        ferry_decode_scratch_init(&scratch);
        s->files[file].raw_size = raw_bytes;
        if ((rc = ferry_shards_zip_cache(s)) >= 0 && (rc = ferry_shards_unzip(s, file, &scratch, &raw)) >= 0) {
            ferry_window w = {.path = path, .size = raw_bytes, .mem = raw};
            rc = ferry_mds_parse_shard(s, &w, file, samples, nm, fixed, nc);
        }
        if (raw_bytes == 0 && rc >= 0) rc = field_err(ipath, sh, k, "raw_data: 0 bytes");
        free(raw);
        ferry_decode_scratch_free(&scratch);
    }
    ferry_file_close(f);
    free(nm);
    free(fixed);
    return rc;
}

/* The shards of a directory at a URL, 16 at a time: each into a set of its
 * own, merged in index.json's order (the first failing shard in that order is
 * the error). */
typedef struct mds_run {
    ferry_ctx *ctx;
    const char *dir, *ipath;
    const ferry_json *shards;
    ferry_shards **subs;
} mds_run;

static int mds_one(void *arg, size_t k) {
    mds_run *m = arg;
    ferry_shards *sub = m->subs[k] = calloc(1, sizeof *sub);
    if (!sub) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    sub->ctx = m->ctx;
    sub->format = "mds";
    return mds_shard(sub, m->dir, m->ipath, &m->shards->items[k], k);
}

static int mds_parallel(ferry_shards *s, const char *dir, const char *ipath, const ferry_json *shards) {
    mds_run m = {s->ctx, dir, ipath, shards, calloc(shards->n, sizeof *m.subs)};
    if (!m.subs) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    /* a compressed shard is held twice while it is indexed (its zstd bytes and the decoded
     * shard, up to 4 GiB): fewer side by side when any is compressed */
    int threads = 16;
    for (size_t k = 0; k < shards->n && threads > 2; k++) {
        const ferry_json *zip = ferry_json_get(&shards->items[k], "zip_data");
        if (zip && zip->type != FERRY_JSON_NULL) threads = 2;
    }
    int rc = ferry_shards_each(shards->n, threads, mds_one, &m);
    for (size_t k = 0; k < shards->n; k++) {
        if (rc >= 0) rc = ferry_shards_merge(s, m.subs[k]);
        ferry_shards_close(m.subs[k]);
    }
    free(m.subs);
    return rc;
}

int ferry_mds_index(ferry_shards *s, const char *dir_in) {
    char ipath[4096], dir[4096];
    size_t dl = strlen(dir_in);
    while (dl > 1 && dir_in[dl - 1] == '/') dl--;   /* "s3://b/mds/": the shards are s3://b/mds/NAME */
    if (dl >= sizeof dir) return ferry_seterr(FERRY_EINVAL, "%s: path too long", dir_in);
    memcpy(dir, dir_in, dl);
    dir[dl] = 0;
    if ((size_t)snprintf(ipath, sizeof ipath, "%s/index.json", dir) >= sizeof ipath)
        return ferry_seterr(FERRY_EINVAL, "%s: path too long", dir);
    char *text = NULL;
    size_t len = 0;
    int rc = read_small(s->ctx, ipath, MDS_MAX_INDEX, &text, &len);
    if (rc < 0) return rc;
    ferry_json *root = NULL;
    rc = ferry_json_parse(text, len, ipath, 0, &root);
    const ferry_json *shards = rc >= 0 ? ferry_json_get(root, "shards") : NULL;
    uint64_t version = 0;
    if (rc >= 0 && (ferry_json_u64(ferry_json_get(root, "version"), &version) < 0 || version != 2))
        rc = ferry_seterr(FERRY_EUNSUPPORTED, "%s: index version %llu: ferry reads version 2", ipath,
                          (unsigned long long)version);
    if (rc >= 0 && (!shards || shards->type != FERRY_JSON_ARRAY))
        rc = ferry_seterr(FERRY_EFORMAT, "%s: \"shards\": expected an array", ipath);
    if (rc >= 0 && shards->n > 1 && ferry_remote_is_url(dir)) rc = mds_parallel(s, dir, ipath, shards);
    else
        for (size_t k = 0; rc >= 0 && k < shards->n; k++) rc = mds_shard(s, dir, ipath, &shards->items[k], k);
    ferry_json_free(root);
    free(text);
    return rc;
}
