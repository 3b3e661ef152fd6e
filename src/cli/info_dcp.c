/* info_dcp.c — `ferry info DIR` for a torch.distributed.checkpoint directory
 * (torch's FileSystemWriter or ferry's FerryWriter): its entries, their
 * dtypes, shapes and chunk counts, and the data files with their bytes.
 *
 * `.metadata` is a pickle. It is read with src/formats/pickle.c, which runs
 * nothing: the walk below looks for the names torch's dataclasses pickle
 * under (Metadata.state_dict_metadata: FQN -> TensorStorageMetadata |
 * BytesStorageMetadata; Metadata.storage_data: MetadataIndex -> a storage
 * record with relative_path, offset, length), so a crafted directory can at
 * worst be described wrongly, never run code. */
#include "cli/info.h"
#include "formats/json.h"
#include "formats/pickle.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DCP_METADATA_MAX (1ull << 30)   /* a checkpoint of millions of tensors stays far below */

static int read_all(const char *path, uint8_t **out, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size > DCP_METADATA_MAX) {
        fclose(f);
        return -2;
    }
    uint8_t *b = malloc((size_t)st.st_size + 1);
    size_t got = b ? fread(b, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    if (!b || got != (size_t)st.st_size) { free(b); return -1; }
    *out = b;
    *n = got;
    return 0;
}

/* torch.Size((a, b, ...)) pickles as REDUCE(torch.Size, ((a, b, ...),)) */
static const ferry_pk *size_tuple(const ferry_pk *sz) {
    if (!ferry_pk_is(sz, "torch", "Size") || !sz->args || sz->args->kind != FERRY_PK_TUPLE || sz->args->count != 1)
        return NULL;
    const ferry_pk *t = sz->args->items[0];
    if (t->kind != FERRY_PK_TUPLE && t->kind != FERRY_PK_LIST) return NULL;
    for (size_t k = 0; k < t->count; k++)
        if (t->items[k]->kind != FERRY_PK_INT || t->items[k]->big || t->items[k]->i < 0) return NULL;
    return t;
}

/* TensorProperties pickles its state as a tuple (dtype, layout, requires_grad,
 * memory_format, pin_memory); older torch as a dict with "dtype" */
static const char *dtype_of(const ferry_pk *props) {
    if (!props || props->kind != FERRY_PK_OBJ || !props->state) return NULL;
    const ferry_pk *d = props->state->kind == FERRY_PK_TUPLE && props->state->count
                            ? props->state->items[0] : ferry_pk_attr(props, "dtype");
    return d && d->kind == FERRY_PK_GLOBAL && !strcmp(d->s, "torch") ? d->name : NULL;
}

static int bad_metadata(const char *mpath, const char *why) {
    fprintf(stderr, "ferry info: %s: %s (not a torch.distributed.checkpoint Metadata this reader knows)\n", mpath, why);
    return -1;
}

typedef struct dcp_file { const char *name; uint64_t bytes; } dcp_file;

int ferry_cli_info_dcp(const char *dir, int json, ferry_sbuf *out) {
    char mpath[4096];
    snprintf(mpath, sizeof mpath, "%s/.metadata", dir);
    struct stat st;
    if (stat(mpath, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    uint8_t *data = NULL;
    size_t n = 0;
    int rr = read_all(mpath, &data, &n);
    if (rr == -2) return bad_metadata(mpath, "larger than 1 GiB");
    if (rr < 0) { fprintf(stderr, "ferry info: %s: cannot read\n", mpath); return -1; }
    ferry_pickle *pk;
    if (ferry_pickle_parse(data, n, mpath, &pk) < 0) {
        free(data);
        fprintf(stderr, "ferry info: %s\n", ferry_errmsg(NULL));
        return -1;
    }
    free(data);
    int rc = 0;
    const ferry_pk *root = ferry_pickle_root(pk);
    const ferry_pk *sdm = ferry_pk_attr(root, "state_dict_metadata");
    const ferry_pk *sd = ferry_pk_attr(root, "storage_data");
    if (!ferry_pk_is(root, NULL, "Metadata") || !sdm || sdm->kind != FERRY_PK_DICT) {
        ferry_pickle_free(pk);
        return bad_metadata(mpath, "no Metadata with a state_dict_metadata dict");
    }
    /* the data files and the bytes each holds, from the storage records */
    dcp_file *files = NULL;
    size_t nfiles = 0;
    uint64_t total = 0;
    for (size_t k = 0; sd && sd->kind == FERRY_PK_DICT && k + 1 < sd->count; k += 2) {
        const ferry_pk *rec = sd->items[k + 1];
        const ferry_pk *rel = ferry_pk_attr(rec, "relative_path"), *len = ferry_pk_attr(rec, "length");
        if (!rel || rel->kind != FERRY_PK_STR || !len || len->kind != FERRY_PK_INT || len->i < 0) continue;
        size_t f = 0;
        while (f < nfiles && strcmp(files[f].name, rel->s)) f++;
        if (f == nfiles) {
            dcp_file *t = realloc(files, (nfiles + 1) * sizeof *t);
            if (!t) { rc = -1; break; }
            files = t;
            files[nfiles++] = (dcp_file){rel->s, 0};
        }
        files[f].bytes += (uint64_t)len->i;
        total += (uint64_t)len->i;
    }
    size_t ntensors = 0, nbytes_items = 0;
    for (size_t k = 0; k + 1 < sdm->count; k += 2)
        ferry_pk_is(sdm->items[k + 1], NULL, "BytesStorageMetadata") ? nbytes_items++ : ntensors++;
    const char *writer = nfiles && strstr(files[0].name, ".ferry") ? "ferry's FerryWriter" : "torch's FileSystemWriter";
    if (json) {
        ferry_sbuf_puts(out, "{\"path\":");
        ferry_sbuf_json_string(out, dir, strlen(dir));
        ferry_sbuf_printf(out, ",\"format\":\"dcp\",\"total_bytes\":%llu,\"files\":{", (unsigned long long)total);
        for (size_t f = 0; f < nfiles; f++) {
            if (f) ferry_sbuf_puts(out, ",");
            ferry_sbuf_json_string(out, files[f].name, strlen(files[f].name));
            ferry_sbuf_printf(out, ":%llu", (unsigned long long)files[f].bytes);
        }
        ferry_sbuf_puts(out, "},\"entries\":[");
    } else {
        ferry_sbuf_printf(out, "%s: torch.distributed.checkpoint (%s), %zu tensor%s, %zu bytes item%s; "
                          "%llu bytes in %zu data file%s\n", dir, writer, ntensors, ntensors == 1 ? "" : "s",
                          nbytes_items, nbytes_items == 1 ? "" : "s", (unsigned long long)total, nfiles,
                          nfiles == 1 ? "" : "s");
    }
    for (size_t k = 0; k + 1 < sdm->count; k += 2) {
        const ferry_pk *key = sdm->items[k], *v = sdm->items[k + 1];
        const char *name = key->kind == FERRY_PK_STR ? key->s : "?";
        int is_bytes = ferry_pk_is(v, NULL, "BytesStorageMetadata");
        const char *dt = is_bytes ? NULL : dtype_of(ferry_pk_attr(v, "properties"));
        const ferry_pk *shape = is_bytes ? NULL : size_tuple(ferry_pk_attr(v, "size"));
        const ferry_pk *chunks = ferry_pk_attr(v, "chunks");
        size_t nchunks = chunks && chunks->kind == FERRY_PK_LIST ? chunks->count : 0;
        if (json) {
            ferry_sbuf_puts(out, k ? ",{\"name\":" : "{\"name\":");
            ferry_sbuf_json_string(out, name, strlen(name));
            if (is_bytes) { ferry_sbuf_puts(out, ",\"kind\":\"bytes\"}"); continue; }
            ferry_sbuf_puts(out, ",\"kind\":\"tensor\",\"dtype\":");
            if (dt) ferry_sbuf_json_string(out, dt, strlen(dt));
            else ferry_sbuf_puts(out, "null");
            ferry_sbuf_puts(out, ",\"shape\":");
            if (shape) {
                ferry_sbuf_puts(out, "[");
                for (size_t d = 0; d < shape->count; d++)
                    ferry_sbuf_printf(out, "%s%lld", d ? "," : "", (long long)shape->items[d]->i);
                ferry_sbuf_puts(out, "]");
            } else {
                ferry_sbuf_puts(out, "null");
            }
            ferry_sbuf_printf(out, ",\"chunks\":%zu}", nchunks);
        } else if (is_bytes) {
            ferry_sbuf_printf(out, "  %-32s bytes (a pickled object)\n", name);
        } else {
            ferry_sbuf shp = {0};
            ferry_sbuf_puts(&shp, "(");
            for (size_t d = 0; shape && d < shape->count; d++)
                ferry_sbuf_printf(&shp, "%s%lld", d ? ", " : "", (long long)shape->items[d]->i);
            ferry_sbuf_puts(&shp, shape && shape->count == 1 ? ",)" : ")");
            char *s = ferry_sbuf_take(&shp);
            ferry_sbuf_printf(out, "  %-32s %-10s %-18s %zu chunk%s\n", name, dt ? dt : "?", shape ? (s ? s : "") : "?",
                              nchunks, nchunks == 1 ? "" : "s");
            free(s);
        }
    }
    if (json) ferry_sbuf_puts(out, "]}");
    else
        for (size_t f = 0; f < nfiles; f++)
            ferry_sbuf_printf(out, "  file %s: %llu bytes\n", files[f].name, (unsigned long long)files[f].bytes);
    free(files);
    ferry_pickle_free(pk);
    return rc < 0 ? rc : 1;
}
