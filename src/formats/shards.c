/* shards.c — the shard-set index (shards.h) the indexers (tar.c, mds.c,
 * imagefolder.c) fill, and its public calls: describe a set's samples and
 * members, plan or read a member's bytes, close it (shardsopen.c opens one). */
#include "formats/shards.h"
#include "codecs/codecs.h"
#include "sources/remote.h"
#include <errno.h>
#include <glob.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>

/* ---- the index --------------------------------------------------------- */
int ferry_shards_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    uint64_t bytes;
    if (ferry_mul_overflow(n, elem, &bytes) || bytes > SIZE_MAX) return ferry_seterr(FERRY_ENOMEM, "shard index too large");
    void *q = realloc(*p, (size_t)bytes);
    if (!q) return ferry_seterr(FERRY_ENOMEM, "out of memory for the shard index (%zu entries)", n);
    *p = q;
    *cap = n;
    return 0;
}

int ferry_shards_str(ferry_shards *s, const char *str, size_t n, uint64_t *off) {
    *off = s->strings.len;
    ferry_sbuf_append(&s->strings, str, n);
    ferry_sbuf_append(&s->strings, "", 1);   /* the separator: each string NUL-terminated */
    return s->strings.oom ? ferry_seterr(FERRY_ENOMEM, "out of memory for the shard index's names") : 0;
}

int ferry_shards_add_file(ferry_shards *s, const char *path, uint64_t size, uint32_t *idx) {
    if (s->nfiles >= UINT32_MAX) return ferry_seterr(FERRY_EINVAL, "%s: more than 2^32 shard files", path);
    int rc = ferry_shards_grow((void **)&s->files, &s->cap_files, s->nfiles + 1, sizeof *s->files);
    if (rc < 0) return rc;
    ferry_shard_file *f = &s->files[s->nfiles];
    memset(f, 0, sizeof *f);
    if ((rc = ferry_shards_str(s, path, strlen(path), &f->path)) < 0) return rc;
    f->size = size;
    *idx = (uint32_t)s->nfiles++;
    return 0;
}

void ferry_shards_hold(ferry_shards *s, uint32_t idx, ferry_file *f) {
    if (f && ferry_remote_is_url(ferry_shards_at(s, s->files[idx].path)) && !s->files[idx].held) s->files[idx].held = f;
    else ferry_file_close(f);
}

int ferry_shards_name(ferry_shards *s, const char *n, size_t len, const char *encoding, uint32_t *idx) {
    for (uint32_t i = 0; i < s->nnames; i++) {
        const char *have = ferry_shards_at(s, s->names[i]);
        if (strlen(have) == len && !memcmp(have, n, len)) {
            const char *enc = s->encodings[i] == UINT64_MAX ? NULL : ferry_shards_at(s, s->encodings[i]);
            if ((enc == NULL) != (encoding == NULL) || (enc && strcmp(enc, encoding)))
                return ferry_seterr(FERRY_EFORMAT, "member \"%.*s\": encoding \"%s\" here, \"%s\" in an earlier shard",
                                    (int)len, n, encoding ? encoding : "", enc ? enc : "");
            *idx = i;
            return 0;
        }
    }
    if (s->nnames == FERRY_SHARD_MAX_NAMES)
        return ferry_seterr(FERRY_EUNSUPPORTED, "more than %d distinct member names (at \"%.*s\")",
                            FERRY_SHARD_MAX_NAMES, (int)FERRY_MIN(len, 64), n);
    int rc = ferry_shards_str(s, n, len, &s->names[s->nnames]);
    if (rc < 0) return rc;
    s->encodings[s->nnames] = UINT64_MAX;
    if (encoding && (rc = ferry_shards_str(s, encoding, strlen(encoding), &s->encodings[s->nnames])) < 0) return rc;
    *idx = s->nnames++;
    return 0;
}

int ferry_shards_begin_sample(ferry_shards *s, const char *k, size_t klen, int32_t label) {
    int rc = ferry_shards_grow((void **)&s->samples, &s->cap_samples, s->nsamples + 1, sizeof *s->samples);
    if (rc < 0) return rc;
    ferry_shard_sample *x = &s->samples[s->nsamples];
    if ((rc = ferry_shards_str(s, k, klen, &x->key)) < 0) return rc;
    x->first = s->nmembers;
    x->nmembers = 0;
    x->label = label;
    s->nsamples++;
    return 0;
}

int ferry_shards_add_member(ferry_shards *s, uint32_t name, uint32_t file, uint64_t offset, uint64_t size,
                            uint64_t where) {
    ferry_shard_sample *x = &s->samples[s->nsamples - 1];
    const char *path = ferry_shards_at(s, s->files[file].path);
    for (uint64_t j = x->first; j < s->nmembers; j++)
        if (s->members[j].name == name)
            return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: sample \"%s\" has two members \"%s\"", path,
                                (unsigned long long)where, ferry_shards_at(s, x->key), ferry_shards_at(s, s->names[name]));
    if (x->nmembers == FERRY_SHARD_MAX_MEMBERS)
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: byte %llu: sample \"%s\" has more than %d members", path,
                            (unsigned long long)where, ferry_shards_at(s, x->key), FERRY_SHARD_MAX_MEMBERS);
    int rc = ferry_shards_grow((void **)&s->members, &s->cap_members, s->nmembers + 1, sizeof *s->members);
    if (rc < 0) return rc;
    s->members[s->nmembers++] = (ferry_shard_member){name, file, offset, size};
    x->nmembers++;
    return 0;
}

void ferry_shards_end_sample(ferry_shards *s) {
    if (s->nsamples && s->samples[s->nsamples - 1].nmembers == 0) s->nsamples--;
}

int ferry_shards_merge(ferry_shards *s, ferry_shards *sub) {
    uint32_t names[FERRY_SHARD_MAX_NAMES], base = (uint32_t)s->nfiles, idx;
    int rc = 0;
    for (uint32_t k = 0; rc >= 0 && k < sub->nnames; k++) {
        const char *nm = ferry_shards_at(sub, sub->names[k]);
        const char *enc = sub->encodings[k] == UINT64_MAX ? NULL : ferry_shards_at(sub, sub->encodings[k]);
        if ((rc = ferry_shards_name(s, nm, strlen(nm), enc, &names[k])) < 0 && sub->nfiles)
            rc = ferry_preerr(rc, "%s", ferry_shards_at(sub, sub->files[0].path));
    }
    for (size_t f = 0; rc >= 0 && f < sub->nfiles; f++) {
        if ((rc = ferry_shards_add_file(s, ferry_shards_at(sub, sub->files[f].path), sub->files[f].size, &idx)) < 0) break;
        s->files[idx].raw_size = sub->files[f].raw_size;
        s->files[idx].held = sub->files[f].held;
        sub->files[f].held = NULL;
        if (s->files[idx].raw_size) rc = ferry_shards_zip_cache(s);
    }
    for (size_t i = 0; rc >= 0 && i < sub->nsamples; i++) {
        const ferry_shard_sample *x = &sub->samples[i];
        const char *key = ferry_shards_at(sub, x->key);
        if ((rc = ferry_shards_begin_sample(s, key, strlen(key), x->label)) < 0) break;
        for (uint32_t m = 0; rc >= 0 && m < x->nmembers; m++) {
            const ferry_shard_member *mem = &sub->members[x->first + m];
            rc = ferry_shards_add_member(s, names[mem->name], base + mem->file, mem->offset, mem->size, mem->offset);
        }
    }
    return rc;
}

/* ---- work side by side --------------------------------------------------- */
typedef struct each_run {
    int (*fn)(void *, size_t);
    void *arg;
    size_t n;
    atomic_size_t next;
    pthread_mutex_t lock;
    size_t first;          /* the lowest i that failed, or n */
    atomic_size_t failed;  /* a copy of first the workers read without the lock */
    int rc;
    char msg[1024];
} each_run;

static void *each_worker(void *p) {
    each_run *e = p;
    for (size_t i; (i = atomic_fetch_add(&e->next, 1)) < e->n;) {
        if (i > atomic_load(&e->failed)) break;   /* a lower one failed: its error is the answer */
        int rc = e->fn(e->arg, i);
        if (rc >= 0) continue;
        pthread_mutex_lock(&e->lock);
        if (i < e->first) {
            e->first = i;
            atomic_store(&e->failed, i);
            e->rc = rc;
            snprintf(e->msg, sizeof e->msg, "%s", ferry_errmsg(NULL));
        }
        pthread_mutex_unlock(&e->lock);
    }
    return NULL;
}

int ferry_shards_each(size_t n, int threads, int (*fn)(void *arg, size_t i), void *arg) {
    each_run e = {.fn = fn, .arg = arg, .n = n, .first = n};
    atomic_init(&e.next, 0);
    atomic_init(&e.failed, n);
    pthread_mutex_init(&e.lock, NULL);
    pthread_t th[64];
    size_t nt = 0, want = FERRY_MIN(n, (size_t)FERRY_MIN(threads, 64));
    while (nt + 1 < want && pthread_create(&th[nt], NULL, each_worker, &e) == 0) nt++;
    each_worker(&e);
    for (size_t t = 0; t < nt; t++) pthread_join(th[t], NULL);
    pthread_mutex_destroy(&e.lock);
    return e.first < n ? ferry_seterr(e.rc, "%s", e.msg) : 0;
}

/* ---- header windows ------------------------------------------------------ */
size_t ferry_window_cap(const ferry_window *w) {
    return !w->mem && ferry_remote_is_url(w->path) ? FERRY_WINDOW_REMOTE : FERRY_WINDOW_MAX;
}

int ferry_window_get(ferry_window *w, uint64_t off, size_t n, size_t want, const uint8_t **p) {
    size_t cap = ferry_window_cap(w);
    if (n > cap || off > w->size || n > w->size - off)
        return ferry_seterr(FERRY_EINVAL, "%s: byte %llu: a %zu-byte header read outside the file", w->path,
                            (unsigned long long)off, n);   /* never: callers check */
    if (w->mem) { *p = w->mem + off; return 0; }
    if (w->win && off >= w->woff && off + n <= w->woff + w->wlen) { *p = w->win + (off - w->woff); return 0; }
    if (!w->win && !(w->win = malloc(cap))) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    want = FERRY_MIN(FERRY_MAX(want, n), cap);
    if (want > w->size - off) want = (size_t)(w->size - off);
    int64_t got = ferry_pread(w->f, ferry_host_buf(w->win, want), off, want, FERRY_NO_DIRECT);
    if (got < 0) return ferry_preerr((int)got, "%s: byte %llu", w->path, (unsigned long long)off);
    if ((uint64_t)got < n)
        return ferry_seterr(FERRY_ESHORT, "%s: byte %llu: the file ends early (it shrank while being read?)", w->path,
                            (unsigned long long)(off + (uint64_t)got));
    w->woff = off;
    w->wlen = (size_t)got;
    *p = w->win;
    return 0;
}

void ferry_window_free(ferry_window *w) {
    free(w->win);
    w->win = NULL;
    w->wlen = 0;
}

/* ---- compressed MDS shards ------------------------------------------------ */
typedef struct zip_cache {
    pthread_mutex_t lock;
    int64_t file;          /* the shard decoded in buf, or -1 */
    uint8_t *buf;
    ferry_decode_scratch scratch;
} zip_cache;

/* Decode the whole compressed shard `file` into a new buffer of its raw_size. */
int ferry_shards_unzip(ferry_shards *s, uint32_t file, ferry_decode_scratch *scratch, uint8_t **out) {
    const ferry_shard_file *f = &s->files[file];
    const char *path = ferry_shards_at(s, f->path);
    *out = NULL;
    if (f->size > SIZE_MAX || f->raw_size > SIZE_MAX)
        return ferry_seterr(FERRY_ENOMEM, "%s: shard too large for memory", path);
    uint8_t *zip = malloc(f->size ? (size_t)f->size : 1), *raw = malloc(f->raw_size ? (size_t)f->raw_size : 1);
    ferry_file *fh = f->held;
    int rc = (!zip || !raw) ? ferry_seterr(FERRY_ENOMEM, "%s: out of memory for a %llu-byte shard", path,
                                           (unsigned long long)f->raw_size)
                            : fh ? 0 : ferry_file_open(s->ctx, path, FERRY_READ, &fh);
    if (rc == 0) {
        int64_t got = ferry_pread(fh, ferry_host_buf(zip, (size_t)f->size), 0, (size_t)f->size, FERRY_NO_DIRECT);
        if (got >= 0 && (uint64_t)got != f->size)
            rc = ferry_seterr(FERRY_ESHORT, "%s: %lld bytes, %llu when the set was opened", path, (long long)got,
                              (unsigned long long)f->size);
        else if (got < 0) rc = (int)got;
    }
    if (fh != f->held) ferry_file_close(fh);
    if (rc == 0) {
        ferry_codec zstd = {FERRY_CODEC_ZSTD, 0};
        int64_t n = ferry_decode(&zstd, 1, zip, (size_t)f->size, raw, (size_t)f->raw_size, scratch);
        if (n < 0) rc = ferry_preerr((int)n, "%s: compressed shard", path);
        else if ((uint64_t)n != f->raw_size)
            rc = ferry_seterr(FERRY_EFORMAT, "%s: decodes to %lld bytes; index.json says raw_data has %llu", path,
                              (long long)n, (unsigned long long)f->raw_size);
    }
    free(zip);
    if (rc < 0) { free(raw); return rc; }
    *out = raw;
    return 0;
}

void ferry_shards_close(ferry_shards *s) {
    if (!s) return;
    zip_cache *z = s->zip;
    if (z) {
        pthread_mutex_destroy(&z->lock);
        free(z->buf);
        ferry_decode_scratch_free(&z->scratch);
        free(z);
    }
    for (size_t i = 0; i < s->nfiles; i++) ferry_file_close(s->files[i].held);
    ferry_sbuf_free(&s->strings);
    free(s->files);
    free(s->samples);
    free(s->members);
    free(s->classes);
    free(s);
}

/* ---- describing --------------------------------------------------------- */
const char *ferry_shards_format(const ferry_shards *s) { return s ? s->format : NULL; }
int64_t ferry_shards_count(const ferry_shards *s) { return s ? (int64_t)s->nsamples : FERRY_EINVAL; }
int64_t ferry_shards_nfiles(const ferry_shards *s) { return s ? (int64_t)s->nfiles : FERRY_EINVAL; }
int ferry_shards_nclasses(const ferry_shards *s) { return s ? (int)s->nclasses : FERRY_EINVAL; }
const char *ferry_shards_class(const ferry_shards *s, int i) {
    return s && i >= 0 && (uint32_t)i < s->nclasses ? ferry_shards_at(s, s->classes[i]) : NULL;
}

static int sample_at(const ferry_shards *s, int64_t i, const ferry_shard_sample **x) {
    if (!s) return ferry_seterr(FERRY_EINVAL, "shard set is NULL");
    if (i < 0 || (uint64_t)i >= s->nsamples)
        return ferry_seterr(FERRY_EINVAL, "sample %lld: the set has %zu samples", (long long)i, s->nsamples);
    *x = &s->samples[i];
    return 0;
}

static int member_at(const ferry_shards *s, int64_t i, int m, const ferry_shard_sample **x,
                     const ferry_shard_member **mem) {
    int rc = sample_at(s, i, x);
    if (rc < 0) return rc;
    if (m < 0 || (uint32_t)m >= (*x)->nmembers)
        return ferry_seterr(FERRY_EINVAL, "sample \"%s\": member %d: it has %u members", ferry_shards_at(s, (*x)->key),
                            m, (*x)->nmembers);
    *mem = &s->members[(*x)->first + (uint32_t)m];
    return 0;
}

int ferry_shards_sample(const ferry_shards *s, int64_t i, ferry_sample_info *out) {
    const ferry_shard_sample *x = NULL;
    int rc = sample_at(s, i, &x);
    if (rc < 0) return rc;
    if (!out) return ferry_seterr(FERRY_EINVAL, "ferry_shards_sample: out is NULL");
    out->key = ferry_shards_at(s, x->key);
    out->nmembers = (int)x->nmembers;
    out->label = x->label;
    return 0;
}

int ferry_shards_member(const ferry_shards *s, int64_t i, int m, ferry_member_info *out) {
    const ferry_shard_sample *x = NULL;
    const ferry_shard_member *mem = NULL;
    int rc = member_at(s, i, m, &x, &mem);
    if (rc < 0) return rc;
    if (!out) return ferry_seterr(FERRY_EINVAL, "ferry_shards_member: out is NULL");
    const ferry_shard_file *f = &s->files[mem->file];
    out->name = ferry_shards_at(s, s->names[mem->name]);
    out->encoding = s->encodings[mem->name] == UINT64_MAX ? NULL : ferry_shards_at(s, s->encodings[mem->name]);
    out->path = ferry_shards_at(s, f->path);
    out->offset = mem->offset;
    out->size = mem->size;
    out->compressed = f->raw_size != 0;
    return 0;
}

int ferry_shards_find(const ferry_shards *s, int64_t i, const char *name) {
    const ferry_shard_sample *x = NULL;
    int rc = sample_at(s, i, &x);
    if (rc < 0) return rc;
    if (!name) return ferry_seterr(FERRY_EINVAL, "ferry_shards_find: name is NULL");
    for (uint32_t m = 0; m < x->nmembers; m++)
        if (!strcmp(ferry_shards_at(s, s->names[s->members[x->first + m].name]), name)) return (int)m;
    return ferry_seterr(FERRY_ENOTFOUND, "sample \"%s\" (%lld): no member \"%s\"", ferry_shards_at(s, x->key),
                        (long long)i, name);
}

/* ---- reading ------------------------------------------------------------ */
int64_t ferry_shards_plan_member(const ferry_shards *s, int64_t i, int m, ferry_buf dst, uint64_t dst_offset,
                                 ferry_plan *plan) {
    const ferry_shard_sample *x = NULL;
    const ferry_shard_member *mem = NULL;
    int rc = member_at(s, i, m, &x, &mem);
    if (rc < 0) return rc;
    const ferry_shard_file *f = &s->files[mem->file];
    const char *path = ferry_shards_at(s, f->path), *key = ferry_shards_at(s, x->key);
    if (f->raw_size)
        return ferry_seterr(FERRY_EUNSUPPORTED, "%s: sample \"%s\" member \"%s\": the shard is compressed as a whole;"
                            " read it with ferry_shards_read", path, key, ferry_shards_at(s, s->names[mem->name]));
    uint64_t end;
    if (ferry_add_overflow(dst_offset, mem->size, &end) || end > dst.size)
        return ferry_seterr(FERRY_EINVAL, "sample \"%s\" member \"%s\": %llu bytes at %llu do not fit a %zu-byte buffer",
                            key, ferry_shards_at(s, s->names[mem->name]), (unsigned long long)mem->size,
                            (unsigned long long)dst_offset, dst.size);
    char label[512];
    snprintf(label, sizeof label, "sample \"%s\" member \"%s\"", key, ferry_shards_at(s, s->names[mem->name]));
    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.kind = FERRY_EXTENT_READ;
    if (f->held) e.file = f->held;   /* a URL: the version indexed, not whatever the path names now */
    else e.path = path;
    e.offset = mem->offset;
    e.length = e.decoded_size = mem->size;
    e.dst = dst;
    e.dst_offset = dst_offset;
    e.label = label;
    if ((rc = ferry_plan_add(plan, &e)) < 0) return rc;
    return (int64_t)mem->size;
}

static int64_t read_zipped(ferry_shards *s, const ferry_shard_member *mem, void *dst) {
    zip_cache *z = s->zip;
    if (!z) return ferry_seterr(FERRY_EINVAL, "compressed shard cache missing");
    pthread_mutex_lock(&z->lock);
    int rc = 0;
    if (z->file != (int64_t)mem->file) {
        free(z->buf);
        z->buf = NULL;
        z->file = -1;
        if ((rc = ferry_shards_unzip(s, mem->file, &z->scratch, &z->buf)) == 0) z->file = mem->file;
    }
    if (rc == 0) memcpy(dst, z->buf + mem->offset, (size_t)mem->size);   /* bounds checked at open */
    pthread_mutex_unlock(&z->lock);
    return rc < 0 ? rc : (int64_t)mem->size;
}

int ferry_shards_zip_cache(ferry_shards *s) {
    if (s->zip) return 0;
    zip_cache *z = calloc(1, sizeof *z);
    if (!z) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    pthread_mutex_init(&z->lock, NULL);
    z->file = -1;
    ferry_decode_scratch_init(&z->scratch);
    s->zip = z;
    return 0;
}

int64_t ferry_shards_read(ferry_shards *s, int64_t i, int m, void *dst, size_t cap) {
    const ferry_shard_sample *x = NULL;
    const ferry_shard_member *mem = NULL;
    int rc = member_at(s, i, m, &x, &mem);
    if (rc < 0) return rc;
    const char *path = ferry_shards_at(s, s->files[mem->file].path), *key = ferry_shards_at(s, x->key);
    const char *name = ferry_shards_at(s, s->names[mem->name]);
    if (!dst || cap < mem->size)
        return ferry_seterr(FERRY_EINVAL, "sample \"%s\" member \"%s\": %llu bytes do not fit %zu", key, name,
                            (unsigned long long)mem->size, dst ? cap : 0);
    int64_t got;
    if (s->files[mem->file].raw_size) {
        got = read_zipped(s, mem, dst);
    } else {
        ferry_file *f = s->files[mem->file].held;
        if (!f && (rc = ferry_file_open(s->ctx, path, FERRY_READ, &f)) < 0) return rc;
        /* an object read whole (a "files" or "folder" member at a URL) is
         * opened again for each read: one version throughout the read, and
         * it must be the size indexed */
        int64_t now = f != s->files[mem->file].held && ferry_remote_is_url(path) ? ferry_file_size(f) : -1;
        if (now >= 0 && (uint64_t)now != s->files[mem->file].size) {
            ferry_file_close(f);
            return ferry_seterr(FERRY_EIO, "%s: sample \"%s\" member \"%s\": the object has %lld bytes, %llu when"
                                " the set was opened (replaced since?)", path, key, name, (long long)now,
                                (unsigned long long)s->files[mem->file].size);
        }
        got = ferry_pread(f, ferry_host_buf(dst, cap), mem->offset, (size_t)mem->size, 0);
        if (f != s->files[mem->file].held) ferry_file_close(f);
        if (got >= 0 && (uint64_t)got < mem->size)
            return ferry_seterr(FERRY_ESHORT, "%s: byte %llu: sample \"%s\" member \"%s\": the file ends %llu bytes"
                                " into its %llu (changed since the set was opened?)", path,
                                (unsigned long long)(mem->offset + (uint64_t)got), key, name,
                                (unsigned long long)got, (unsigned long long)mem->size);
    }
    if (got < 0) return ferry_preerr((int)got, "sample \"%s\" member \"%s\"", key, name);
    return got;
}
