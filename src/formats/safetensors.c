/* safetensors.c — .safetensors files and *.safetensors.index.json shard sets.
 *
 * Layout: u64 LE header length N, N bytes of JSON
 *   {"__metadata__": {str: str}, "name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
 * then the data; offsets are relative to byte 8 + N. Checks follow the
 * reference implementation: N <= 100,000,000; every tensor's byte length is
 * its element count times its dtype size; sorted by offset the tensors tile
 * the data exactly (no hole, no overlap) and end where the file ends.
 *
 * Sub-byte dtypes (F4, F6_*) are exposed as bytes: the last dimension is
 * given in bytes (it must hold a whole number of bytes), itemsize 1, and the
 * tensor's attrs record the stored dtype and shape.
 *
 * An index ({"metadata": {...}, "weight_map": {tensor: shard file}}) opens
 * every shard it names (relative to the index's directory); the dataset holds
 * the tensors of all shards, each reading from its own file. A shard is opened
 * only when it resolves inside the index's directory (inside.h): a symlink to
 * a file elsewhere is refused, one that stays inside is followed.
 *
 * The dataset keeps the files open; plans refer to them. */
#include "formats/dataset.h"
#include "formats/json.h"
#include "formats/select.h"
#include "formats/inside.h"
#include "sources/url.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#define ST_MAX_HEADER 100000000ull
#define ST_MAX_INDEX (64ull << 20)

typedef struct st_shard {
    char *path;
    ferry_file *file;
    uint64_t data_start;    /* 8 + N */
    uint64_t file_size;
    ferry_json *hdr;        /* keeps tensor names alive */
} st_shard;

typedef struct st_tensor {
    int shard;
    const ferry_json *node;
    uint64_t begin, end;    /* relative to the shard's data start */
    char *attrs;            /* sub-byte dtypes only, else NULL */
} st_tensor;

typedef struct st_state {
    st_shard *shards;
    int nshards;
    st_tensor *tensors;
    ferry_json *index;      /* the index file's JSON, or NULL */
} st_state;

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int st_probe(const char *path, const uint8_t *head, size_t n, int is_dir) {
    if (is_dir) return 0;
    if (ends_with(path, ".safetensors.index.json")) return 1;
    if (n < 9) return 0;
    uint64_t len = ferry_le64(head);
    return len >= 2 && len <= ST_MAX_HEADER && head[8] == '{';
}

static void st_close(ferry_dataset *ds) {
    st_state *st = ds->fmt;
    if (st) {
        for (int i = 0; i < st->nshards; i++) {
            ferry_file_close(st->shards[i].file);
            ferry_json_free(st->shards[i].hdr);
            free(st->shards[i].path);
        }
        if (st->tensors)
            for (int i = 0; i < ds->nvars; i++) free(st->tensors[i].attrs);
        free(st->shards);
        free(st->tensors);
        ferry_json_free(st->index);
        free(st);
    }
    free(ds->vars);
    free(ds->attrs_json);
    ds->vars = NULL; ds->nvars = 0; ds->attrs_json = NULL; ds->fmt = NULL;
}

/* Read a whole small file region into a malloc'd buffer. */
static int read_exact(ferry_file *f, const char *path, uint64_t off, uint64_t len, char **out) {
    char *b = malloc(len ? len : 1);
    if (!b) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory (%llu bytes)", path, (unsigned long long)len);
    int64_t got = ferry_pread(f, ferry_host_buf(b, len), off, len, FERRY_NO_DIRECT);
    if (got < 0) { free(b); return ferry_preerr((int)got, "%s", path); }
    if ((uint64_t)got != len) {
        free(b);
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: file ends early", path, (unsigned long long)(off + (uint64_t)got));
    }
    *out = b;
    return 0;
}

static int cmp_tensor_off(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Parse one shard's header, appending its tensors to ds->vars / st->tensors
 * (capacity ensured by the caller growing them). */
static int grow_vars(ferry_dataset *ds, st_state *st, size_t *cap, size_t need);

/* rc with the message naming path once (a remote open's message names its URL already) */
static int named(int rc, const char *path) {
    const char *m = ferry_lasterr();
    size_t n = strlen(path);
    return !strncmp(m, path, n) && m[n] == ':' ? rc : ferry_preerr(rc, "%s", path);
}

static int parse_shard(ferry_dataset *ds, st_state *st, int si, int want_metadata, size_t *cap) {
    st_shard *sh = &st->shards[si];
    const char *path = sh->path;
    int rc = ferry_file_open(ds->ctx, path, FERRY_READ, &sh->file);
    if (rc < 0) { sh->file = NULL; return named(rc, path); }
    int64_t fsz = ferry_file_size(sh->file);
    if (fsz < 0) return ferry_preerr((int)fsz, "%s", path);
    sh->file_size = (uint64_t)fsz;
    if (sh->file_size < 8)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: file too short for a safetensors header length", path,
                            (unsigned long long)sh->file_size);
    uint8_t pre[8];
    int64_t got = ferry_pread(sh->file, ferry_host_buf(pre, 8), 0, 8, FERRY_NO_DIRECT);
    if (got < 0) return ferry_preerr((int)got, "%s", path);
    if (got != 8) return ferry_seterr(FERRY_EFORMAT, "%s: byte %lld: file ends early", path, (long long)got);
    uint64_t n = ferry_le64(pre);
    if (n > ST_MAX_HEADER)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte 0: safetensors header length %llu exceeds 100 MB", path,
                            (unsigned long long)n);
    if (n > sh->file_size - 8)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte 0: safetensors header length %llu runs past the end of the file (%llu bytes)",
                            path, (unsigned long long)n, (unsigned long long)sh->file_size);
    char *text;
    if ((rc = read_exact(sh->file, path, 8, n, &text))) return rc;
    if (!n || text[0] != '{') {
        free(text);
        return ferry_seterr(FERRY_EFORMAT, "%s: byte 8: safetensors header does not start with '{'", path);
    }
    rc = ferry_json_parse(text, n, path, 8, &sh->hdr);
    free(text);
    if (rc) return rc;
    if (sh->hdr->type != FERRY_JSON_OBJECT)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte 8: safetensors header is not a JSON object", path);
    sh->data_start = 8 + n;
    uint64_t data_len = sh->file_size - sh->data_start;
    if ((rc = grow_vars(ds, st, cap, (size_t)ds->nvars + sh->hdr->n))) return rc;

    int first = ds->nvars;
    for (size_t i = 0; i < sh->hdr->n; i++) {
        const ferry_json *m = &sh->hdr->items[i];
        if (!strcmp(m->key, "__metadata__") && m->keylen == 12) {
            if (m->type != FERRY_JSON_OBJECT)
                return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: __metadata__ is not an object", path,
                                    (unsigned long long)m->pos);
            for (size_t k = 0; k < m->n; k++)
                if (m->items[k].type != FERRY_JSON_STRING)
                    return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: __metadata__ value \"%s\" is not a string", path,
                                        (unsigned long long)m->items[k].pos, m->items[k].key);
            if (want_metadata && !ds->attrs_json) {
                ferry_sbuf b = {0};
                ferry_sbuf_json_value(&b, m);
                if (!(ds->attrs_json = ferry_sbuf_take(&b))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
            }
            continue;
        }
        if (strlen(m->key) != m->keylen)
            return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: tensor name contains a NUL character", path,
                                (unsigned long long)m->pos);
        if (m->type != FERRY_JSON_OBJECT)
            return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: tensor \"%s\": entry is not an object", path,
                                (unsigned long long)m->pos, m->key);
        const ferry_json *jd = ferry_json_get(m, "dtype"), *js = ferry_json_get(m, "shape"),
                         *jo = ferry_json_get(m, "data_offsets");
        if (!jd || !js || !jo)
            return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: tensor \"%s\": needs dtype, shape and data_offsets", path,
                                (unsigned long long)m->pos, m->key);
        /* the names are names.c's safetensors column; bits < 8: sub-byte, packed */
        ferry_dtype dt = FERRY_DT_UNKNOWN;
        if (jd->type != FERRY_JSON_STRING || ferry_dtype_parse_style(jd->str, FERRY_NAME_SAFETENSORS, &dt) < 0)
            return ferry_seterr(jd->type == FERRY_JSON_STRING ? FERRY_EUNSUPPORTED : FERRY_EFORMAT,
                                "%s: byte %llu: tensor \"%s\": unknown dtype %s%s%s", path, (unsigned long long)jd->pos,
                                m->key, jd->type == FERRY_JSON_STRING ? "\"" : "",
                                jd->type == FERRY_JSON_STRING ? jd->str : "(not a string)",
                                jd->type == FERRY_JSON_STRING ? "\"" : "");
        if (js->type != FERRY_JSON_ARRAY || js->n > FERRY_MAX_DIMS)
            return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: tensor \"%s\": shape must be an array of at most %d integers",
                                path, (unsigned long long)js->pos, m->key, FERRY_MAX_DIMS);
        ferry_var *v = &ds->vars[ds->nvars];
        st_tensor *t = &st->tensors[ds->nvars];
        memset(v, 0, sizeof *v);
        memset(t, 0, sizeof *t);
        ferry_var_info *vi = &v->info;
        uint64_t nel = 1, nz = 1, nzbytes;   /* nz: product of the non-zero dimensions */
        int overflow = 0;
        for (size_t k = 0; k < js->n; k++) {
            if (ferry_json_u64(&js->items[k], &vi->shape[k]) || vi->shape[k] > (uint64_t)INT64_MAX)
                return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: tensor \"%s\": shape[%zu] is not a non-negative integer",
                                    path, (unsigned long long)js->items[k].pos, m->key, k);
            overflow |= ferry_mul_overflow(nel, vi->shape[k], &nel);
            if (vi->shape[k]) overflow |= ferry_mul_overflow(nz, vi->shape[k], &nz);
        }
        /* numpy and torch refuse a shape whose non-zero dimensions overflow even
         * when another is 0 ([0, 2^62, 2^62]): refuse it here, with the byte */
        uint64_t bits;
        const uint32_t dt_bits = ferry_dtype_bits(dt);
        if (overflow || ferry_mul_overflow(nel, dt_bits, &bits) || ferry_mul_overflow(nz, (dt_bits + 7) / 8, &nzbytes) ||
            nzbytes > (uint64_t)INT64_MAX)
            return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: tensor \"%s\": shape × dtype size overflows", path,
                                (unsigned long long)js->pos, m->key);
        if (jo->type != FERRY_JSON_ARRAY || jo->n != 2 || ferry_json_u64(&jo->items[0], &t->begin) ||
            ferry_json_u64(&jo->items[1], &t->end) || t->end < t->begin)
            return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: tensor \"%s\": data_offsets must be [begin, end] with begin <= end",
                                path, (unsigned long long)jo->pos, m->key);
        if (bits % 8 || t->end - t->begin != bits / 8)
            return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: tensor \"%s\": data_offsets span %llu bytes, dtype %s × shape needs %llu%s",
                                path, (unsigned long long)jo->pos, m->key, (unsigned long long)(t->end - t->begin), jd->str,
                                (unsigned long long)(bits / 8), bits % 8 ? " and a fraction" : "");
        if (t->end > data_len)
            return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: tensor \"%s\": data_offsets end %llu past the data (%llu bytes)",
                                path, (unsigned long long)jo->pos, m->key, (unsigned long long)t->end,
                                (unsigned long long)data_len);
        vi->ndim = (int)js->n;
        vi->dtype = dt_bits < 8 ? FERRY_DT_OTHER : dt;   /* sub-byte types are exposed as bytes */
        vi->typestr = ferry_dtype_name(dt, FERRY_NAME_TYPESTR);
        vi->itemsize = dt_bits / 8;
        vi->attrs_json = "{}";
        if (dt_bits < 8) {
            /* expose as bytes along the last dimension */
            ferry_sbuf b = {0};
            ferry_sbuf_printf(&b, "{\"safetensors_dtype\":\"%s\",\"shape\":[", jd->str);
            for (int k = 0; k < vi->ndim; k++) ferry_sbuf_printf(&b, "%s%llu", k ? "," : "", (unsigned long long)vi->shape[k]);
            ferry_sbuf_puts(&b, "]}");
            if (!(t->attrs = ferry_sbuf_take(&b))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
            vi->attrs_json = t->attrs;
            vi->itemsize = 1;
            if (vi->ndim == 0 || (vi->shape[vi->ndim - 1] * dt_bits) % 8) {
                vi->ndim = 1;
                vi->shape[0] = bits / 8;
            } else {
                vi->shape[vi->ndim - 1] = vi->shape[vi->ndim - 1] * dt_bits / 8;
            }
        }
        memcpy(vi->chunks, vi->shape, sizeof vi->shape);
        vi->name = m->key;
        vi->dims_json = "null";
        vi->fill_json = "null";
        vi->codecs = "";
        vi->path = sh->path;
        vi->data_offset = sh->data_start + t->begin;
        vi->data_bytes = t->end - t->begin;
        t->shard = si;
        t->node = m;
        v->fmt = t;
        ds->nvars++;
    }

    /* the tensors must tile [0, data_len) exactly */
    int cnt = ds->nvars - first;
    st_tensor **order = malloc((size_t)(cnt ? cnt : 1) * sizeof *order);
    if (!order) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
    for (int i = 0; i < cnt; i++) order[i] = &st->tensors[first + i];
    qsort(order, (size_t)cnt, sizeof *order, cmp_tensor_off);
    uint64_t end = 0;
    rc = 0;
    for (int i = 0; i < cnt && !rc; i++) {
        if (order[i]->begin != end)
            rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: tensor \"%s\": data_offsets [%llu, %llu] %s the previous tensor (ends at %llu)",
                              path, (unsigned long long)order[i]->node->pos, order[i]->node->key,
                              (unsigned long long)order[i]->begin, (unsigned long long)order[i]->end,
                              order[i]->begin < end ? "overlap" : "leave a hole after", (unsigned long long)end);
        end = order[i]->end;
    }
    free(order);
    if (!rc && end != data_len)
        rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: tensors cover %llu bytes of data but the file holds %llu after the header",
                          path, (unsigned long long)(sh->data_start + end), (unsigned long long)end, (unsigned long long)data_len);
    return rc;
}

static int grow_vars(ferry_dataset *ds, st_state *st, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    if (need > (size_t)INT32_MAX) return ferry_seterr(FERRY_ENOMEM, "%s: too many tensors", ds->path);
    size_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    ferry_var *nv = realloc(ds->vars, nc * sizeof *nv);
    if (nv) ds->vars = nv;
    st_tensor *nt = realloc(st->tensors, nc * sizeof *nt);
    if (nt) st->tensors = nt;
    if (!nv || !nt) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
    /* vars point at tensors: re-aim after a move */
    for (int i = 0; i < ds->nvars; i++) ds->vars[i].fmt = &st->tensors[i];
    *cap = nc;
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const ferry_var *)a)->info.name, ((const ferry_var *)b)->info.name);
}

/* ferry's sharded saves write Hugging Face's fixed shard names and stamp the
 * index and every shard with one save id ("ferry.save" in their metadata). An
 * index read while a save renames its shards into place may name shards of
 * that other save: a set whose ids differ is refused with -ESTALE ("the set
 * changed while it was opened"), which the caller answers by opening the set
 * again. Sets without ids (other writers) are taken as they are. */
static const char *save_id(const ferry_json *md) {
    const ferry_json *v = md && md->type == FERRY_JSON_OBJECT ? ferry_json_get(md, "ferry.save") : NULL;
    return v && v->type == FERRY_JSON_STRING ? v->str : NULL;
}

static int same_save(const st_state *st, const char *path) {
    const char *want = save_id(ferry_json_get(st->index, "metadata"));
    for (int s = 0; s < st->nshards; s++) {
        const char *got = save_id(ferry_json_get(st->shards[s].hdr, "__metadata__"));
        if ((want || got) && (!want || !got || strcmp(want, got)))
            return ferry_seterr(-ESTALE, "%s: shard %s belongs to save %s, the index to save %s (the set was "
                                "replaced while it was opened)", path, st->shards[s].path, got ? got : "(none)",
                                want ? want : "(none)");
    }
    return 0;
}

static int open_index(ferry_dataset *ds, st_state *st, size_t *cap) {
    const char *path = ds->path;
    ferry_file *f;
    int rc = ferry_file_open(ds->ctx, path, FERRY_READ, &f);
    if (rc < 0) return named(rc, path);
    int64_t sz = ferry_file_size(f);
    if (sz < 0 || (uint64_t)sz > ST_MAX_INDEX) {
        ferry_file_close(f);
        return sz < 0 ? ferry_preerr((int)sz, "%s", path)
                      : ferry_seterr(FERRY_EFORMAT, "%s: byte 0: index file larger than 64 MiB", path);
    }
    char *text;
    rc = read_exact(f, path, 0, (uint64_t)sz, &text);
    ferry_file_close(f);
    if (rc) return rc;
    rc = ferry_json_parse(text, (size_t)sz, path, 0, &st->index);
    free(text);
    if (rc) return rc;
    const ferry_json *wm = ferry_json_get(st->index, "weight_map");
    if (!wm || wm->type != FERRY_JSON_OBJECT)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte 0: index has no \"weight_map\" object", path);
    const ferry_json *meta = ferry_json_get(st->index, "metadata");
    if (meta) {
        ferry_sbuf b = {0};
        ferry_sbuf_json_value(&b, meta);
        if (!(ds->attrs_json = ferry_sbuf_take(&b))) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
    }
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path + 1) : 0;
    st->shards = calloc(wm->n ? wm->n : 1, sizeof *st->shards);
    if (!st->shards) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
    int *shard_of = calloc(wm->n ? wm->n : 1, sizeof *shard_of);
    if (!shard_of) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < wm->n && !rc; i++) {
        const ferry_json *e = &wm->items[i];
        if (e->type != FERRY_JSON_STRING || !e->len || strlen(e->str) != e->len || e->str[0] == '/' ||
            strstr(e->str, "..")) {
            rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: weight_map[\"%s\"] is not a plain relative file name", path,
                              (unsigned long long)e->pos, e->key);
            break;
        }
        int found = -1;
        for (int s = 0; s < st->nshards && found < 0; s++)
            if (!strcmp(st->shards[s].path + dirlen, e->str)) found = s;
        if (found < 0) {
            found = st->nshards;
            char *p = malloc(dirlen + e->len + 1);
            if (!p) { rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path); break; }
            memcpy(p, path, dirlen);
            memcpy(p + dirlen, e->str, e->len + 1);
            st->shards[st->nshards++].path = p;
        }
        shard_of[i] = found;
    }
    /* shards stay inside the index's directory (resolved once: links in its own path are the user's);
     * an index read from a URL names objects beside it, which have no links to follow */
    char *root = NULL;
    int remote = ferry_url_scheme_of(path) > FERRY_URL_FILE;
    if (!rc && !remote) {
        char *dir = dirlen ? strndup(path, dirlen) : strdup(".");
        if (!dir) rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
        else if (!(root = realpath(dir, NULL))) rc = ferry_seterr(-errno, "%s: %s: %s", path, dir, strerror(errno));
        free(dir);
    }
    for (int s = 0; s < st->nshards && !rc; s++) {
        int in = remote ? 1 : ferry_path_inside(root, st->shards[s].path, "directory");
        if (in < 0) rc = ferry_preerr(in, "%s: weight_map", path);
        else rc = parse_shard(ds, st, s, !ds->attrs_json, cap);
    }
    free(root);
    if (!rc) rc = same_save(st, path);
    /* every weight_map entry must name a tensor that its shard holds */
    ferry_var *sorted = NULL;
    if (!rc && ds->nvars) {
        sorted = malloc((size_t)ds->nvars * sizeof *sorted);
        if (!sorted) rc = ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
        else {
            memcpy(sorted, ds->vars, (size_t)ds->nvars * sizeof *sorted);
            qsort(sorted, (size_t)ds->nvars, sizeof *sorted, cmp_name);
        }
    }
    for (size_t i = 0; i < wm->n && !rc; i++) {
        const ferry_json *e = &wm->items[i];
        ferry_var key;
        key.info.name = e->key;
        const ferry_var *hit = sorted ? bsearch(&key, sorted, (size_t)ds->nvars, sizeof *sorted, cmp_name) : NULL;
        if (!hit || ((const st_tensor *)hit->fmt)->shard != shard_of[i])
            rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: weight_map: tensor \"%s\" is not in %s", path,
                              (unsigned long long)e->pos, e->key, e->str);
    }
    free(sorted);
    free(shard_of);
    return rc;
}

static int st_open(ferry_dataset *ds, const ferry_open_opts *opts) {
    st_state *st = calloc(1, sizeof *st);
    ds->fmt = st;
    if (!st) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
    size_t cap = 0;
    int rc;
    if (ends_with(ds->path, ".index.json")) {
        rc = open_index(ds, st, &cap);
    } else {
        st->shards = calloc(1, sizeof *st->shards);
        if (!st->shards || !(st->shards[0].path = strdup(ds->path)))
            return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
        st->nshards = 1;
        rc = parse_shard(ds, st, 0, 1, &cap);
    }
    if (rc) return rc;
    /* duplicate names across shards would make find() ambiguous */
    if (ds->nvars > 1) {
        ferry_var *copy = malloc((size_t)ds->nvars * sizeof *copy);
        if (!copy) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", ds->path);
        memcpy(copy, ds->vars, (size_t)ds->nvars * sizeof *copy);
        qsort(copy, (size_t)ds->nvars, sizeof *copy, cmp_name);
        for (int i = 1; i < ds->nvars && !rc; i++)
            if (!strcmp(copy[i - 1].info.name, copy[i].info.name))
                rc = ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: tensor \"%s\" appears in more than one shard (%s)",
                                  copy[i].info.path, (unsigned long long)((const st_tensor *)copy[i].fmt)->node->pos,
                                  copy[i].info.name, ds->path);
        free(copy);
    }
    return rc;
}

static int64_t st_plan_read(ferry_dataset *ds, int var, const ferry_slice *sel, ferry_buf dst, unsigned flags,
                            ferry_plan *plan) {
    st_state *st = ds->fmt;
    const ferry_var_info *vi = &ds->vars[var].info;
    const st_tensor *t = ds->vars[var].fmt;
    ferry_select_src src;
    ferry_select_src_init(&src, st->shards[t->shard].file, vi, vi->data_offset, 0, 0);
    return ferry_select_plan(&src, sel, dst, 0, plan);
}

const ferry_format_ops ferry_format_safetensors = {"safetensors", st_probe, st_open, st_close, st_plan_read, NULL};
