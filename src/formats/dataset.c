/* dataset.c — the format-independent half of datasets: detection, the
 * registry of formats, accessors, and selection checks before a format's
 * plan_read sees them. */
#include "formats/dataset.h"
#include "formats/select.h"
#include "formats/layout.h"
#include "formats/sniff.h"
#include "formats/zarr_remote.h"
#include "sources/url.h"
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

/* Probe order matters only for names: magic numbers do not collide. */
static const ferry_format_ops *const formats[] = {
    &ferry_format_npy, &ferry_format_safetensors, &ferry_format_netcdf3,
    &ferry_format_refs,   /* before zarr: a directory of Parquet references also holds a .zmetadata */
    &ferry_format_zarr, &ferry_format_hdf5,
};
#define NFORMATS (sizeof formats / sizeof formats[0])
#define PROBE_BYTES 512

static void dataset_free(ferry_dataset *ds) {
    if (!ds) return;
    free(ds->by_name);
    free(ds->path);
    free(ds);
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static const ferry_format_ops *by_name(const char *path) {
    if (has_suffix(path, ".npy")) return &ferry_format_npy;
    if (has_suffix(path, ".safetensors")) return &ferry_format_safetensors;
    if (has_suffix(path, ".nc") || has_suffix(path, ".nc3") || has_suffix(path, ".cdf")) return &ferry_format_netcdf3;
    if (has_suffix(path, ".h5") || has_suffix(path, ".hdf5") || has_suffix(path, ".nc4")) return &ferry_format_hdf5;
    /* a damaged reference set gets its parser's complaint (a Zarr metadata
     * document named as a file is no reference set) */
    if (has_suffix(path, ".json") && !has_suffix(path, "/zarr.json") && strcmp(path, "zarr.json"))
        return &ferry_format_refs;
    return NULL;
}

static int read_head(ferry_ctx *ctx, const char *path, uint8_t *head, size_t *n) {
    ferry_file *f;
    int rc = ferry_file_open(ctx, path, FERRY_READ, &f);
    if (rc < 0) return rc;
    int64_t got = ferry_pread(f, ferry_host_buf(head, PROBE_BYTES), 0, PROBE_BYTES, FERRY_NO_DIRECT);
    ferry_file_close(f);
    if (got < 0) return (int)got;
    *n = (size_t)got;
    return 0;
}

/* HDF5 (netCDF-4's container, the format xarray writes by default): its
 * superblock signature is at byte 0 or after a user block of 512, 1024,
 * 2048, ... bytes (HDF5 File Format Specification, "Format Signature"); the
 * probe sees only the first, this finds the others. */
int64_t ferry_hdf5_signature(ferry_ctx *ctx, const char *path) {
    static const uint8_t sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    if (!ctx || !path) return ferry_seterr(FERRY_EINVAL, "ferry_hdf5_signature: no context or path");
    ferry_file *f;
    int rc = ferry_file_open(ctx, path, FERRY_READ, &f);
    if (rc < 0) return rc;
    int64_t size = ferry_file_size(f), found = FERRY_ENOFORMAT;
    for (uint64_t off = 0; size >= 0 && off + sizeof sig <= (uint64_t)size; off = off ? off * 2 : 512) {
        uint8_t got[sizeof sig];
        if (ferry_pread(f, ferry_host_buf(got, sizeof got), off, sizeof got, FERRY_NO_DIRECT) != (int64_t)sizeof got)
            break;
        if (!memcmp(got, sig, sizeof sig)) { found = (int64_t)off; break; }
    }
    ferry_file_close(f);
    if (size < 0) return size;
    if (found < 0) return ferry_seterr(FERRY_ENOFORMAT, "%s: no HDF5 signature", path);
    return found;
}

/* A reader's error on a file of another kind is replaced by what the file is
 * and what reads it (sniff.c): "x.safetensors: a torch.save zip archive, not
 * safetensors: read it with torch.load", not a complaint about a header
 * length. Only for FERRY_EFORMAT on a regular file that sniffs as something
 * other than the format tried; otherwise rc and its message stand. */
static int sniffed_error(ferry_ctx *ctx, const char *path, const char *tried, int rc) {
    if (rc != FERRY_EFORMAT) return rc;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return rc;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", ferry_lasterr());
    uint8_t head[PROBE_BYTES];
    size_t n = 0;
    ferry_sniffed sn;
    if (read_head(ctx, path, head, &n) < 0 || !ferry_sniff(head, n, &sn) || (sn.format && !strcmp(sn.format, tried)) ||
        (sn.format && !strcmp(sn.format, "json") &&
         (!strcmp(tried, "safetensors") || !strcmp(tried, "refs")))) {   /* its index; a reference set */
        ferry_seterr(rc, "%s", saved);
        return rc;
    }
    return ferry_seterr(FERRY_EFORMAT, "%s: byte 0: %s, not %s: %s", path, sn.what, tried, sn.todo);   /* what its first bytes are */
}

/* The one format sniffer (ferry_dataset_open and ferry_format_detect): by
 * content, then by a telling name. */
static int detect(ferry_ctx *ctx, const char *path, const ferry_format_ops **ops) {
    *ops = NULL;
    struct stat st;
    /* a URL names one object, whose first bytes tell its format as a file's
     * do, or a Zarr store (a prefix of objects: its metadata objects tell;
     * asked first where the name says so) */
    int url = (ferry_url_scheme_of(path) != FERRY_URL_NONE);
    size_t pl = strlen(path);
    while (pl > 1 && path[pl - 1] == '/') pl--;
    int probed = url && (pl < strlen(path) || (pl >= 5 && !strncmp(path + pl - 5, ".zarr", 5)));
    if (probed && ferry_zremote_probe(ctx, path)) {
        *ops = &ferry_format_zarr;
        return 0;
    }
    if (!url && stat(path, &st) != 0) {
        int e = errno;
        return ferry_seterr(-e, "%s: %s", path, strerror(e));
    }
    int is_dir = !url && S_ISDIR(st.st_mode);
    uint8_t head[PROBE_BYTES];
    size_t n = 0;
    if (!is_dir) {
        int rc = read_head(ctx, path, head, &n);
        if (rc < 0 && url && !probed && (rc == -ENOENT || rc == -EACCES)) {   /* no object there: a store's prefix? */
            char saved[1024];
            snprintf(saved, sizeof saved, "%s", ferry_lasterr());
            if (ferry_zremote_probe(ctx, path)) {
                *ops = &ferry_format_zarr;
                return 0;
            }
            ferry_seterr(rc, "%s", saved);
        }
        if (rc < 0) return url ? rc : ferry_preerr(rc, "%s", path);   /* a remote open's message names its URL */
    }
    for (size_t i = 0; i < NFORMATS && !*ops; i++)
        if (formats[i]->probe(path, head, n, is_dir)) *ops = formats[i];
    if (!*ops && !is_dir && ferry_hdf5_signature(ctx, path) >= 0) *ops = &ferry_format_hdf5;
    ferry_clearerr();
    /* content matched nothing: a telling name still picks the parser, so
     * a damaged "x.npy" gets npy's precise complaint, not a shrug */
    if (!*ops && !is_dir) *ops = by_name(path);
    ferry_sniffed sn;
    if (!*ops && !is_dir && ferry_sniff(head, n, &sn))
        return ferry_seterr(FERRY_ENOFORMAT, "%s: %s, not a file of a format ferry reads (npy, safetensors, "
                            "netCDF classic, Zarr, kerchunk references): %s", path, sn.what, sn.todo);
    if (!*ops)
        return ferry_seterr(FERRY_ENOFORMAT,
                            "%s: not a file or store of a known format (npy, safetensors, "
                            "netCDF classic, Zarr, netCDF-4/HDF5, kerchunk references)", path);
    return 0;
}

int ferry_format_detect(ferry_ctx *ctx, const char *path, const char **format) {
    if (!ctx || !path || !*path || !format) return ferry_seterr(FERRY_EINVAL, "ferry_format_detect: no context, path or out");
    const ferry_format_ops *ops;
    int rc = detect(ctx, path, &ops);
    if (rc < 0) return rc;
    *format = ops->name;
    return 0;
}

/* ---- lookups by name ----------------------------------------------------------
 * f[name] for every variable of a 100,000-tensor checkpoint or a 40,000-
 * variable netCDF file was quadratic (a linear search each: 153 s and 28 s on
 * one CPU core). One table per dataset, built once after the format's open
 * (so finds on a shared dataset only read it): FNV-1a, linear probing, at
 * most half full. A name that appears twice keeps its first index, as the
 * linear search did. */
static size_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (size_t)(h ^ (h >> 29));
}

static int build_name_index(ferry_dataset *ds) {
    size_t cap = 16;
    while (cap < 2 * (size_t)ds->nvars) cap *= 2;
    int *t = malloc(cap * sizeof *t);
    if (!t) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory for the name index", ds->path);
    for (size_t i = 0; i < cap; i++) t[i] = -1;
    for (int v = 0; v < ds->nvars; v++) {
        const char *name = ds->vars[v].info.name ? ds->vars[v].info.name : "";
        size_t h = name_hash(name) & (cap - 1);
        while (t[h] >= 0 && strcmp(ds->vars[t[h]].info.name ? ds->vars[t[h]].info.name : "", name))
            h = (h + 1) & (cap - 1);
        if (t[h] < 0) t[h] = v;
    }
    ds->by_name = t;
    ds->by_name_mask = cap - 1;
    return 0;
}

static int format_has_groups(const ferry_format_ops *ops) {
    return !strcmp(ops->name, "zarr") || !strcmp(ops->name, "hdf5") || !strcmp(ops->name, "refs");
}

/* A Hugging Face checkpoint directory (what save_pretrained writes) opens as
 * its checkpoint: model.safetensors.index.json, else the one
 * *.safetensors.index.json, else model.safetensors, else the one *.safetensors.
 * A Zarr store (any of its metadata files present) is never taken for one.
 * 1 with *resolved (malloc'd) set, 0 when dir is no such directory. */
static int checkpoint_dir(const char *dir, char **resolved) {
    static const char *zarr_files[] = {".zgroup", ".zarray", ".zmetadata", "zarr.json"};
    char probe[4096];
    struct stat st;
    for (size_t k = 0; k < sizeof zarr_files / sizeof *zarr_files; k++) {
        snprintf(probe, sizeof probe, "%s/%s", dir, zarr_files[k]);
        if (stat(probe, &st) == 0) return 0;
    }
    static const char *preferred[] = {"model.safetensors.index.json", "model.safetensors"};
    static const char *suffixes[] = {".safetensors.index.json", ".safetensors"};
    for (size_t k = 0; k < 2; k++) {
        snprintf(probe, sizeof probe, "%s/%s", dir, preferred[k]);
        if (stat(probe, &st) == 0 && S_ISREG(st.st_mode)) return (*resolved = strdup(probe)) ? 1 : FERRY_ENOMEM;
        DIR *d = opendir(dir);
        if (!d) return 0;
        char *only = NULL;
        int found = 0;
        size_t sl = strlen(suffixes[k]);
        for (struct dirent *e; (e = readdir(d));) {
            size_t nl = strlen(e->d_name);
            if (nl <= sl || strcmp(e->d_name + nl - sl, suffixes[k]) || e->d_name[0] == '.') continue;
            if (found++) continue;
            snprintf(probe, sizeof probe, "%s/%s", dir, e->d_name);
            only = strdup(probe);
        }
        closedir(d);
        if (found == 1 && only) { *resolved = only; return 1; }
        free(only);
        if (found > 1) return 0;   /* several checkpoints side by side: the caller names one */
    }
    return 0;
}

static int dataset_open(ferry_ctx *ctx, const char *path, const ferry_open_opts *opts, ferry_dataset **out);

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* A Hugging Face checkpoint directory named by URL (objects are not listed:
 * the two names save_pretrained writes are tried): "URL/" opens
 * URL/model.safetensors.index.json, else URL/model.safetensors; a URL with no
 * object, asked as safetensors or as nothing in particular, is tried as such
 * a directory, then as URL.index.json (a sharded save's index). 1 opened
 * (*out set), 0 none of them exists (the caller goes on), or the negative
 * code of one that exists but does not open. */
static int checkpoint_url(ferry_ctx *ctx, const char *url, const ferry_open_opts *opts, ferry_dataset **out) {
    static const char *names[] = {"/model.safetensors.index.json", "/model.safetensors", ".index.json"};
    size_t n = strlen(url);
    int slash = url[n - 1] == '/';
    /* x.safetensors: only its index beside it; an index: nothing else */
    size_t first = ends_with(url, ".safetensors") ? 2 : 0, last = slash ? 2 : ends_with(url, ".index.json") ? 0 : 3;
    ferry_open_opts o = *opts;
    o.format = "safetensors";
    for (size_t k = first; k < last; k++) {
        char *p = malloc(n + 40);
        if (!p) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", url);
        snprintf(p, n + 40, "%.*s%s", (int)(slash ? n - 1 : n), url, names[k]);
        int rc = dataset_open(ctx, p, &o, out);
        free(p);
        if (rc == 0) return 1;
        if (rc != -ENOENT) return rc;
    }
    return 0;
}

static int is_object_url(const char *path) {
    ferry_url_scheme s = ferry_url_scheme_of(path);
    return s == FERRY_URL_HTTP || s == FERRY_URL_HTTPS || s == FERRY_URL_S3 || s == FERRY_URL_GS;
}

int ferry_dataset_open(ferry_ctx *ctx, const char *path, const ferry_open_opts *opts, ferry_dataset **out) {
    if (!out) return ferry_seterr(FERRY_EINVAL, "ferry_dataset_open: out is NULL");
    *out = NULL;
    if (!ctx || !path || !*path) return ferry_seterr(FERRY_EINVAL, "ferry_dataset_open: no context or path");
    ferry_open_opts dflt = {0};
    if (!opts) opts = &dflt;
    int st = !opts->format || !*opts->format || !strcmp(opts->format, "safetensors");
    if (!st || !is_object_url(path)) return dataset_open(ctx, path, opts, out);
    int asked = opts->format && *opts->format;
    if (path[strlen(path) - 1] == '/') {
        /* asked for nothing in particular, a URL the rule refuses ("s3://bucket/") is said so */
        ferry_url u = {0};
        int bad = asked ? 0 : ferry_url_parse(path, NULL, &u);
        ferry_url_free(&u);
        if (bad < 0) return bad;
        int r = checkpoint_url(ctx, path, opts, out);
        if (r != 0) return r < 0 ? r : 0;
        if (asked)
            return ferry_seterr(-ENOENT, "%s: neither model.safetensors.index.json nor model.safetensors is there "
                                "(objects are not listed: name the checkpoint's file)", path);
        return dataset_open(ctx, path, opts, out);
    }
    int rc = dataset_open(ctx, path, opts, out);
    if (rc != -ENOENT) return rc;
    /* asked for nothing in particular: only names a checkpoint may have (no
     * suffix, or .safetensors), not a missing x.npy, cost the extra requests */
    const char *last = strrchr(path, '/');
    if (!asked && strchr(last ? last : path, '.') && !ends_with(path, ".safetensors")) return rc;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", ferry_lasterr());
    int r = checkpoint_url(ctx, path, opts, out);
    if (r != 0) return r < 0 ? r : 0;
    return ferry_seterr(rc, "%s", saved);
}

static int dataset_open(ferry_ctx *ctx, const char *path, const ferry_open_opts *opts, ferry_dataset **out) {
    if (!out) return ferry_seterr(FERRY_EINVAL, "ferry_dataset_open: out is NULL");
    *out = NULL;
    if (!ctx || !path || !*path) return ferry_seterr(FERRY_EINVAL, "ferry_dataset_open: no context or path");
    ferry_open_opts dflt = {0};
    if (!opts) opts = &dflt;
    /* file:// is a local path at the door: stores, directories and their links are local files */
    if (ferry_url_scheme_of(path) == FERRY_URL_FILE) {
        ferry_url u;
        int rc = ferry_url_parse(path, NULL, &u);
        if (rc >= 0) rc = ferry_dataset_open(ctx, u.key, opts, out);
        ferry_url_free(&u);
        return rc;
    }
    struct stat dst;
    char *resolved = NULL;
    if ((!opts->format || !*opts->format || !strcmp(opts->format, "safetensors")) && stat(path, &dst) == 0 &&
        S_ISDIR(dst.st_mode)) {
        int r = checkpoint_dir(path, &resolved);
        if (r < 0) return ferry_seterr(r, "%s: out of memory", path);
        if (r > 0) {
            int rc = ferry_dataset_open(ctx, resolved, opts, out);
            free(resolved);
            return rc;
        }
    }

    const ferry_format_ops *ops = NULL;
    if (opts->refs_json) {   /* a reference set the caller read: its JSON is the "refs" format's */
        if (opts->format && *opts->format && strcmp(opts->format, "refs"))
            return ferry_seterr(FERRY_EINVAL, "%s: refs_json is a kerchunk reference set, not format \"%s\"", path,
                                opts->format);
        ops = &ferry_format_refs;
    }
    if (!ops && opts->format && *opts->format) {
        for (size_t i = 0; i < NFORMATS && !ops; i++)
            if (!strcmp(formats[i]->name, opts->format)) ops = formats[i];
        if (!ops)
            return ferry_seterr(FERRY_EINVAL, "%s: unknown format \"%s\" (npy, safetensors, netcdf3, zarr, hdf5, refs)",
                                path, opts->format);
    }

    struct stat st;
    if (ops && !(ferry_url_scheme_of(path) != FERRY_URL_NONE) && stat(path, &st) != 0) {
        int e = errno;
        return ferry_seterr(-e, "%s: %s", path, strerror(e));
    }
    if (!ops) {
        int rc = detect(ctx, path, &ops);
        if (rc < 0) return rc;
    }

    /* A group asked of a format that has none is not its root: "no group", as
     * netCDF4 answers for a netCDF-4 file (xarray's group= on a classic file) */
    if (opts->group && *opts->group && strcmp(opts->group, "/") && !format_has_groups(ops))
        return ferry_seterr(FERRY_ENOTFOUND, "%s: no group \"%s\" (a %s file has only its root group)", path,
                            opts->group, ops->name);

    ferry_dataset *ds = calloc(1, sizeof *ds);
    if (!ds || !(ds->path = strdup(path))) {
        free(ds);
        return ferry_seterr(FERRY_ENOMEM, "%s: out of memory", path);
    }
    ds->ctx = ctx;
    ds->ops = ops;
    int rc = ops->open(ds, opts);
    if (rc < 0) rc = sniffed_error(ctx, path, ops->name, rc);
    /* Every format: a shape whose non-zero dimensions times the item size
     * overflow a signed 64-bit size (numpy's and torch's limit, even when
     * another dimension is 0) is refused at open, not by numpy later. */
    for (int v = 0; rc >= 0 && v < ds->nvars; v++) {
        const ferry_var_info *vi = &ds->vars[v].info;
        uint64_t n = vi->itemsize ? vi->itemsize : 1;
        int over = 0;
        for (int k = 0; k < vi->ndim; k++)
            if (vi->shape[k]) over |= ferry_mul_overflow(n, vi->shape[k], &n);
        if (over || n > (uint64_t)INT64_MAX)
            rc = ferry_seterr(FERRY_EFORMAT, "%s: variable \"%s\": shape × itemsize overflows 2^63 bytes "
                              "(numpy and torch cannot hold it)", path, vi->name ? vi->name : "?");
    }
    if (rc >= 0) rc = build_name_index(ds);
    if (rc < 0) {
        ops->close(ds);
        dataset_free(ds);
        return rc;
    }
    *out = ds;
    return 0;
}

void ferry_dataset_close(ferry_dataset *ds) {
    if (!ds) return;
    ds->ops->close(ds);
    dataset_free(ds);
}

const char *ferry_dataset_format(const ferry_dataset *ds) { return ds ? ds->ops->name : ""; }
const char *ferry_dataset_path(const ferry_dataset *ds) { return ds ? ds->path : ""; }
const char *ferry_dataset_attrs_json(const ferry_dataset *ds) {
    return ds && ds->attrs_json ? ds->attrs_json : "{}";
}
const char *ferry_dataset_dims_json(const ferry_dataset *ds) {
    return ds && ds->dims_json ? ds->dims_json : "{}";
}
int ferry_dataset_store_info(const ferry_dataset *ds, ferry_store_info *out) {
    if (!ds || !out) return ferry_seterr(FERRY_EINVAL, "ferry_dataset_store_info: NULL argument");
    *out = ds->store;
    return 0;
}

const char *ferry_dataset_groups_json(const ferry_dataset *ds) {
    return ds && ds->groups_json ? ds->groups_json : "[]";
}
int ferry_dataset_nvars(const ferry_dataset *ds) { return ds ? ds->nvars : 0; }

int ferry_dataset_var(const ferry_dataset *ds, int index, ferry_var_info *out) {
    if (!ds || !out) return ferry_seterr(FERRY_EINVAL, "ferry_dataset_var: NULL argument");
    if (index < 0 || index >= ds->nvars)
        return ferry_seterr(FERRY_EINVAL, "%s: variable index %d out of range (%d variables)", ds->path, index,
                            ds->nvars);
    *out = ds->vars[index].info;
    return 0;
}

int ferry_dataset_fill(const ferry_dataset *ds, int var, void *out, size_t cap) {
    if (!ds || !out) return ferry_seterr(FERRY_EINVAL, "ferry_dataset_fill: NULL argument");
    if (var < 0 || var >= ds->nvars)
        return ferry_seterr(FERRY_EINVAL, "%s: variable index %d out of range (%d variables)", ds->path, var,
                            ds->nvars);
    const ferry_var *v = &ds->vars[var];
    if (!v->fill) return 0;
    uint32_t n = v->info.itemsize;
    if (cap < n)
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": its fill value needs %u bytes, not %zu", ds->path,
                            v->info.name, n, cap);
    memset(out, 0, n);
    memcpy(out, v->fill, n < 16 ? n : 16);
    return (int)n;
}

int ferry_dataset_find(const ferry_dataset *ds, const char *name) {
    if (!ds || !name) return ferry_seterr(FERRY_EINVAL, "ferry_dataset_find: NULL argument");
    if (ds->by_name)
        for (size_t h = name_hash(name) & ds->by_name_mask; ds->by_name[h] >= 0; h = (h + 1) & ds->by_name_mask) {
            const char *n = ds->vars[ds->by_name[h]].info.name;
            if (n && !strcmp(n, name)) return ds->by_name[h];
        }
    return ferry_seterr(FERRY_ENOTFOUND, "%s: no variable named \"%s\"", ds->path, name);
}

int64_t ferry_dataset_plan_read(ferry_dataset *ds, int var, const ferry_slice *sel,
                                ferry_buf dst, unsigned flags, ferry_plan *plan) {
    if (!ds || !plan) return ferry_seterr(FERRY_EINVAL, "ferry_dataset_plan_read: NULL argument");
    if (var < 0 || var >= ds->nvars)
        return ferry_seterr(FERRY_EINVAL, "%s: variable index %d out of range (%d variables)", ds->path, var,
                            ds->nvars);
    const ferry_var_info *vi = &ds->vars[var].info;
    if (vi->error) return ferry_seterr(FERRY_EUNSUPPORTED, "%s", vi->error);   /* even an empty selection */
    if (vi->dtype == FERRY_DT_STRING)
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\" holds variable-length strings: read it with "
                            "ferry_dataset_read_strings", ds->path, vi->name);
    /* Normalise: NULL is everything; a negative start/stop, a start or stop
     * past the end or a step below 1 is a caller error, not something to
     * guess about (clipped, a read of 0:721 on 24 elements gave 24, silently;
     * Python clips its slices as numpy does before they get here). */
    ferry_slice norm[FERRY_MAX_DIMS];
    int64_t nbytes = ferry_selection_normalize(vi->ndim, vi->shape, vi->itemsize, sel, norm, ds->path, vi->name);
    if (nbytes < 0) return nbytes;
    uint64_t bytes = (uint64_t)nbytes;
    if (dst.size < bytes)
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": destination holds %llu bytes, selection needs %llu",
                            ds->path, vi->name, (unsigned long long)dst.size, (unsigned long long)bytes);
    if (bytes == 0) return 0;
    return ds->ops->plan_read(ds, var, norm, dst, flags, plan);
}

int64_t ferry_dataset_read_strings(ferry_dataset *ds, int var, const ferry_slice *sel, const ferry_run_opts *opts,
                                   ferry_strings *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!ds || !out) return ferry_seterr(FERRY_EINVAL, "ferry_dataset_read_strings: NULL argument");
    if (var < 0 || var >= ds->nvars)
        return ferry_seterr(FERRY_EINVAL, "%s: variable index %d out of range (%d variables)", ds->path, var,
                            ds->nvars);
    const ferry_var_info *vi = &ds->vars[var].info;
    if (vi->error) return ferry_seterr(FERRY_EUNSUPPORTED, "%s", vi->error);
    if (vi->dtype != FERRY_DT_STRING || !ds->ops->read_strings)
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\" holds %s, not variable-length strings: read it with "
                            "ferry_dataset_plan_read", ds->path, vi->name, vi->typestr ? vi->typestr : "other values");
    ferry_slice norm[FERRY_MAX_DIMS];
    int64_t nbytes = ferry_selection_normalize(vi->ndim, vi->shape, vi->itemsize, sel, norm, ds->path, vi->name);
    if (nbytes < 0) return nbytes;
    uint64_t count = (uint64_t)nbytes / vi->itemsize;
    if (count > FERRY_STRINGS_MAX_COUNT)
        return ferry_seterr(FERRY_EINVAL, "%s: variable \"%s\": a selection of %llu strings is more than one read "
                            "takes (%llu): read it in parts", ds->path, vi->name, (unsigned long long)count,
                            (unsigned long long)FERRY_STRINGS_MAX_COUNT);
    int64_t rc = ds->ops->read_strings(ds, var, norm, opts, out);
    if (rc < 0) ferry_strings_free(out);
    return rc;
}

void ferry_strings_free(ferry_strings *s) {
    if (!s) return;
    free(s->offsets);
    free(s->data);
    memset(s, 0, sizeof *s);
}
