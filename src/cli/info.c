/* info.c — `ferry info [--json] FILE|DIR...`.
 *
 * For each path: the format, global attributes and dimensions, and every
 * variable with its dtype, shape, chunking, codecs, byte range and
 * attributes. A file of no known format gets its size and how much of it is
 * in the page cache. --json prints one object per path (an array when there
 * are several), with the library's JSON strings (attrs, dims, fill) embedded
 * as JSON values. */
#include "cli/info.h"
#include "ferry_experimental.h"
#include "cli/args.h"
#include "formats/json.h"
#include "engine/numa.h"
#include "engine/knobs.h"
#include "engine/gpudecode.h"   /* ferry_gpudecode_route: which codec goes where */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* the library's one name table (src/base/names.c) */
static const char *dtype_name(ferry_dtype d) { return ferry_dtype_name(d, FERRY_NAME_SHORT); }

static void put_dims(ferry_sbuf *b, const uint64_t *v, int n, int json) {
    ferry_sbuf_puts(b, json ? "[" : "(");
    for (int k = 0; k < n; k++) ferry_sbuf_printf(b, "%s%llu", k ? ", " : "", (unsigned long long)v[k]);
    ferry_sbuf_puts(b, json ? "]" : (n == 1 ? ",)" : ")"));
}

static void human_bytes(char *out, size_t cap, uint64_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double x = (double)n;
    int i = 0;
    while (x >= 1024 && i < 5) { x /= 1024; i++; }
    if (i == 0) snprintf(out, cap, "%llu B", (unsigned long long)n);
    else snprintf(out, cap, "%.1f %s", x, u[i]);
}

/* Size and page-cache residency of a file no format claims. */
static int describe_other(ferry_ctx *ctx, const char *path, const char *why, int json, ferry_sbuf *out) {
    ferry_file *f;
    int rc = ferry_file_open(ctx, path, FERRY_READ, &f);
    if (rc < 0) {
        fprintf(stderr, "ferry info: %s: %s\n", path, ferry_errmsg(ctx)[0] ? ferry_errmsg(ctx) : ferry_strerror(rc));
        return 1;
    }
    int64_t size = ferry_file_size(f);
    int64_t cached = size > 0 ? ferry_file_cached(f, 0, (uint64_t)size) : 0;
    ferry_file_close(f);
    if (json) {
        ferry_sbuf_puts(out, "{\"path\":");
        ferry_sbuf_json_string(out, path, strlen(path));
        ferry_sbuf_printf(out, ",\"format\":null,\"size\":%lld,\"cached\":%lld,\"note\":", (long long)size,
                          (long long)cached);
        ferry_sbuf_json_string(out, why, strlen(why));
        ferry_sbuf_puts(out, "}");
    } else {
        char s1[32], s2[32];
        human_bytes(s1, sizeof s1, size > 0 ? (uint64_t)size : 0);
        human_bytes(s2, sizeof s2, cached > 0 ? (uint64_t)cached : 0);
        ferry_sbuf_printf(out, "%s\n  size %s (%lld bytes)", why, s1, (long long)size);
        if (cached >= 0)
            ferry_sbuf_printf(out, ", in page cache %s (%.0f%%)\n", s2, size > 0 ? 100.0 * (double)cached / (double)size : 0.0);
        else
            ferry_sbuf_printf(out, ", page-cache residency unknown (%s)\n", ferry_strerror((int)cached));
    }
    return 0;
}

static void describe_json(ferry_dataset *ds, const char *path, ferry_sbuf *b) {
    ferry_sbuf_puts(b, "{\"path\":");
    ferry_sbuf_json_string(b, path, strlen(path));
    ferry_sbuf_printf(b, ",\"format\":\"%s\",\"attrs\":%s,\"dims\":%s,\"groups\":%s,\"variables\":[",
                      ferry_dataset_format(ds), ferry_dataset_attrs_json(ds), ferry_dataset_dims_json(ds),
                      ferry_dataset_groups_json(ds));
    for (int i = 0; i < ferry_dataset_nvars(ds); i++) {
        ferry_var_info v;
        if (ferry_dataset_var(ds, i, &v) < 0) continue;
        ferry_sbuf_puts(b, i ? ",{\"name\":" : "{\"name\":");
        ferry_sbuf_json_string(b, v.name, strlen(v.name));
        ferry_sbuf_printf(b, ",\"dtype\":\"%s\",\"typestr\":", dtype_name(v.dtype));
        ferry_sbuf_json_string(b, v.typestr, strlen(v.typestr));
        ferry_sbuf_printf(b, ",\"itemsize\":%u,\"shape\":", v.itemsize);
        put_dims(b, v.shape, v.ndim, 1);
        ferry_sbuf_puts(b, ",\"chunks\":");
        put_dims(b, v.chunks, v.ndim, 1);
        ferry_sbuf_printf(b, ",\"fortran_order\":%s,\"dims\":%s,\"attrs\":%s,\"fill\":%s,\"codecs\":",
                          v.fortran_order ? "true" : "false", v.dims_json, v.attrs_json, v.fill_json);
        ferry_sbuf_json_string(b, v.codecs, strlen(v.codecs));
        ferry_sbuf_puts(b, ",\"path\":");
        ferry_sbuf_json_string(b, v.path, strlen(v.path));
        ferry_sbuf_printf(b, ",\"data_offset\":%llu,\"data_bytes\":%llu,\"error\":", (unsigned long long)v.data_offset,
                          (unsigned long long)v.data_bytes);
        if (v.error) ferry_sbuf_json_string(b, v.error, strlen(v.error));
        else ferry_sbuf_puts(b, "null");
        ferry_sbuf_puts(b, "}");
    }
    ferry_sbuf_puts(b, "]}");
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static void describe_text(ferry_dataset *ds, const char *path, ferry_sbuf *b) {
    int n = ferry_dataset_nvars(ds);
    ferry_sbuf_printf(b, "%s: %s, %d variable%s\n", path, ferry_dataset_format(ds), n, n == 1 ? "" : "s");
    if (!strcmp(ferry_dataset_format(ds), "safetensors")) {
        /* a checkpoint: its tensors' bytes and the shard files holding them */
        uint64_t total = 0;
        int files = 0, np = 0;
        const char **paths = malloc(sizeof *paths * (size_t)(n ? n : 1));
        for (int i = 0; i < n; i++) {
            ferry_var_info v;
            if (ferry_dataset_var(ds, i, &v) < 0) continue;
            total += v.data_bytes;
            if (paths && v.path) paths[np++] = v.path;
        }
        if (paths) {   /* distinct files: sorted, then counted once each (100,000 tensors stay fast) */
            qsort(paths, (size_t)np, sizeof *paths, cmp_str);
            for (int i = 0; i < np; i++) files += !i || strcmp(paths[i], paths[i - 1]);
        }
        free(paths);
        char hb[32];
        human_bytes(hb, sizeof hb, total);
        ferry_sbuf_printf(b, "  %d tensor%s, %llu bytes in %d file%s (%s)\n", n, n == 1 ? "" : "s",
                          (unsigned long long)total, files, files == 1 ? "" : "s", hb);
    }
    if (strcmp(ferry_dataset_attrs_json(ds), "{}")) ferry_sbuf_printf(b, "  attributes: %s\n", ferry_dataset_attrs_json(ds));
    if (strcmp(ferry_dataset_dims_json(ds), "{}")) ferry_sbuf_printf(b, "  dimensions: %s\n", ferry_dataset_dims_json(ds));
    if (strcmp(ferry_dataset_groups_json(ds), "[]")) ferry_sbuf_printf(b, "  groups: %s\n", ferry_dataset_groups_json(ds));
    for (int i = 0; i < n; i++) {
        ferry_var_info v;
        if (ferry_dataset_var(ds, i, &v) < 0) continue;
        ferry_sbuf shape = {0};
        put_dims(&shape, v.shape, v.ndim, 0);
        char *sh = ferry_sbuf_take(&shape);
        /* variable-length strings: the type by name, and the bytes stored are references to them */
        int text = v.dtype == FERRY_DT_STRING;
        ferry_sbuf_printf(b, "  %-24s %-12s %-18s", v.name, text ? "string" : v.typestr, sh ? sh : "?");
        free(sh);
        if (memcmp(v.chunks, v.shape, sizeof(uint64_t) * (size_t)v.ndim)) {
            ferry_sbuf_puts(b, " chunks ");
            put_dims(b, v.chunks, v.ndim, 0);
        }
        if (v.fortran_order) ferry_sbuf_puts(b, " F-order");
        if (v.codecs[0]) ferry_sbuf_printf(b, " codecs %s", v.codecs);
        if (v.data_bytes) {
            char hb[32];
            human_bytes(hb, sizeof hb, v.data_bytes);
            ferry_sbuf_printf(b, " %s [%llu, %llu) %s", text ? "references" : "bytes", (unsigned long long)v.data_offset,
                              (unsigned long long)(v.data_offset + v.data_bytes), hb);
        }
        if (v.path && strcmp(v.path, path)) ferry_sbuf_printf(b, " in %s", v.path);
        ferry_sbuf_puts(b, "\n");
        if (strcmp(v.dims_json, "null")) ferry_sbuf_printf(b, "      dims %s\n", v.dims_json);
        if (strcmp(v.fill_json, "null")) ferry_sbuf_printf(b, "      fill %s\n", v.fill_json);
        if (strcmp(v.attrs_json, "{}")) ferry_sbuf_printf(b, "      attrs %s\n", v.attrs_json);
        if (v.error) ferry_sbuf_printf(b, "      unreadable: %s\n", v.error);
    }
}

static void usage(FILE *to) {
    fprintf(to, "usage: ferry info [--json] [--knobs] [--codecs] [--depth N] [FILE|DIR|URL...]\n"
                "  Variables, tensors or arrays with dtype, shape, chunks, codecs, byte ranges and\n"
                "  attributes; for other files, the size and how much is in the page cache.\n"
                "  DIR: a Zarr store or group (its subgroups too, --depth levels down, default 1;\n"
                "  0: this group only), a Hugging Face checkpoint directory (its index or\n"
                "  model.safetensors), or a torch.distributed.checkpoint directory.\n"
                "  URL: an http(s)://, s3:// or gs:// object; a checkpoint directory URL ending in /\n"
                "  (its model.safetensors.index.json or model.safetensors; objects are not listed).\n"
                "  Without a path: this build and machine (version, CUDA, cuFile, nvCOMP, nvJPEG, GPU kernels,\n"
                "  decode policy). --knobs: the FERRY_* variables ferry reads (name, grammar, default,\n"
                "  what it does, when it is read, and its value where set). --codecs: where each codec of a\n"
                "  chain bound for device memory is decoded under each decode policy.\n");
}

/* A table built in b printed (a JSON array closed first); 0. */
static int print_table(ferry_sbuf *b, int json) {
    if (json) ferry_sbuf_puts(b, "]\n");
    char *out = ferry_sbuf_take(b);
    if (out) fputs(out, stdout);
    free(out);
    fflush(stdout);
    return 0;
}

/* `ferry info --codecs`: where each codec step of a chain bound for device
 * memory is decoded under each policy, from the code that decides
 * (gpudecode_rates.c); a Markdown table, which docs/decoding.md carries as
 * printed (tests/python/test_cli.py compares them). Host destinations always
 * decode on the CPU. */
static int describe_codecs(int json) {
    static const char *const where[] = {"CPU", "GPU", "both", "with its codec"};
    ferry_sbuf b = {0};
    if (json) ferry_sbuf_puts(&b, "[");
    else ferry_sbuf_puts(&b, "| codec | `auto` | `gpu` | `cpu` | how |\n|---|---|---|---|---|\n");
    for (uint32_t id = FERRY_CODEC_ZLIB; id <= FERRY_CODEC_BYTESWAP; id++) {
        const int a = ferry_gpudecode_route(id, FERRY_DECODE_AUTO), g = ferry_gpudecode_route(id, FERRY_DECODE_GPU);
        const char *note = ferry_gpudecode_route_note(id);
        const char *gpu = g == FERRY_ROUTE_CPU ? "CPU, counted in gpu_cpu_fallbacks" : where[g];
        if (json)
            ferry_sbuf_printf(&b, "%s{\"codec\":\"%s\",\"auto\":\"%s\",\"gpu\":\"%s\",\"cpu\":\"CPU\"}", id > 1 ? "," : "",
                              ferry_codec_name(id), where[a], gpu);
        else
            ferry_sbuf_printf(&b, "| %s | %s | %s | CPU | %s |\n", ferry_codec_name(id), where[a], gpu, note ? note : "");
    }
    return print_table(&b, json);
}

/* `ferry info --knobs`: the knobs' table (config.c) */
static int describe_knobs(int json) {
    size_t n;
    const ferry_knob_row *t = ferry_knob_table(&n);
    static const char *const kinds[] = {"size", "count", "word", "rates", "integer", "text", "flag"};
    static const char *const scopes[] = {"context", "first use", "process"};
    ferry_sbuf b = {0};
    if (json) ferry_sbuf_puts(&b, "[");
    for (size_t k = 0; k < n; k++) {
        const ferry_knob_row *r = &t[k];
        char grammar[200];
        ferry_knob_grammar(r, grammar, sizeof grammar);
        const char *v = getenv(r->name);
        const int scope = ferry_knob_scope(r);
        if (json) {
            ferry_sbuf_printf(&b, "%s{\"name\":\"%s\",\"kind\":\"%s\",\"scope\":\"%s\",\"grammar\":", k ? "," : "",
                              r->name, kinds[r->kind], scopes[scope]);
            ferry_sbuf_json_string(&b, grammar, strlen(grammar));
            ferry_sbuf_puts(&b, ",\"default\":");
            ferry_sbuf_json_string(&b, r->def, strlen(r->def));
            ferry_sbuf_puts(&b, ",\"doc\":");
            ferry_sbuf_json_string(&b, r->doc, strlen(r->doc));
            ferry_sbuf_puts(&b, ",\"value\":");
            if (v) ferry_sbuf_json_string(&b, v, strlen(v));
            else ferry_sbuf_puts(&b, "null");
            ferry_sbuf_puts(&b, "}");
        } else {
            ferry_sbuf_printf(&b, "%-26s %-40s default %s%s%s\n  %26s %s (read: %s)\n", r->name, grammar, r->def,
                              v ? "; set: " : "", v ? v : "", "", r->doc, scopes[scope]);
        }
    }
    return print_table(&b, json);
}

/* `ferry info` alone: what this build and machine can do, and which GPU
 * kernel image is in use (a build without nvcc byteswaps on the CPU). */
static int describe_library(ferry_ctx *ctx, int json) {
    const char *cuda = ferry_cuda_status(ctx), *cufile = ferry_cufile_status(ctx), *nv = ferry_nvcomp_status(ctx);
    int ndev = ferry_cuda_device_count(ctx);
    ferry_config cfg;
    ferry_ctx_config(ctx, &cfg);
    const char *kern = ferry_kernels_source(), *kern_why = ferry_kernels_status();
    char kern_note[700] = "";
    if (!strcmp(kern, "NVRTC")) snprintf(kern_note, sizeof kern_note, " (src/cuda/kernels.cu compiled at run time)");
    else if (!strcmp(kern, "none"))
        snprintf(kern_note, sizeof kern_note, " (device data is byteswapped on the CPU before the copy: %s)", kern_why);
    if (json) {
        ferry_sbuf b = {0};
        ferry_sbuf_printf(&b, "{\"version\":\"%s\",\"cuda_devices\":%d,\"cuda\":", ferry_version(), ndev);
        ferry_sbuf_json_string(&b, cuda, strlen(cuda));
        ferry_sbuf_puts(&b, ",\"cufile\":");
        ferry_sbuf_json_string(&b, cufile, strlen(cufile));
        ferry_sbuf_puts(&b, ",\"nvcomp\":");
        ferry_sbuf_json_string(&b, nv, strlen(nv));
        const char *nvj = ferry_nvjpeg_status();
        ferry_sbuf_puts(&b, ",\"nvjpeg\":");
        ferry_sbuf_json_string(&b, nvj, strlen(nvj));
        char numa[1024];   /* multigpu: the NUMA line of the text form */
        ferry_numa_describe(numa, sizeof numa, ndev);
        ferry_sbuf_puts(&b, ",\"numa\":");
        ferry_sbuf_json_string(&b, numa, strlen(numa));
        ferry_sbuf_printf(&b, ",\"decode\":\"%s\"", ferry_decode_policy_name((ferry_decode_policy)cfg.decode));
        ferry_sbuf_printf(&b, ",\"kernels\":\"%s\",\"kernels_status\":", kern);
        ferry_sbuf_json_string(&b, kern_why, strlen(kern_why));
        ferry_sbuf_printf(&b, ",\"threads\":%d,\"path\":\"%s\",\"direct\":\"%s\"}\n",
                          cfg.threads, ferry_path_name(cfg.path), ferry_direct_name(cfg.direct));
        char *t = ferry_sbuf_take(&b);
        if (t) fputs(t, stdout);
        free(t);
    } else {
        printf("ferry %s\n", ferry_version());
        printf("  CUDA: %s (%d device%s)\n", *cuda ? cuda : "available", ndev, ndev == 1 ? "" : "s");
        printf("  cuFile: %s\n", *cufile ? cufile : "GDS available");
        printf("  nvCOMP: %s\n", nv);
        printf("  nvJPEG: %s (image batches)\n", ferry_nvjpeg_status());
        printf("  decode: %s (FERRY_DECODE)\n", ferry_decode_policy_name((ferry_decode_policy)cfg.decode));
        printf("  GPU kernels: %s%s\n", kern, kern_note);
        char numa[1024];   /* multigpu: the host's NUMA topology and each GPU's node */
        ferry_numa_describe(numa, sizeof numa, ndev);
        printf("  NUMA: %s\n", numa);
        printf("  engine: %d threads, path %s, O_DIRECT %s, staging %d x %zu KiB per thread\n", cfg.threads,
               ferry_path_name(cfg.path), ferry_direct_name(cfg.direct), cfg.staging_count, cfg.staging_size >> 10);
    }
    fflush(stdout);
    return 0;
}

/* A Zarr group's subgroups, `depth` levels down: each described as its own
 * store (text: after the group; JSON: a "subgroups" array in its object). */
static void describe(ferry_ctx *ctx, ferry_dataset *ds, const char *path, int json, int depth, ferry_sbuf *out);

static void describe_subgroups(ferry_ctx *ctx, ferry_dataset *ds, const char *path, int json, int depth,
                               ferry_sbuf *out) {
    ferry_json *groups = NULL;
    const char *gj = ferry_dataset_groups_json(ds);
    if (depth <= 0 || strcmp(ferry_dataset_format(ds), "zarr") || ferry_json_parse(gj, strlen(gj), path, 0, &groups) < 0)
        return;
    int first = 1;
    for (size_t k = 0; groups->type == FERRY_JSON_ARRAY && k < groups->n; k++) {
        const ferry_json *g = &groups->items[k];
        if (g->type != FERRY_JSON_STRING) continue;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", path, g->str);
        ferry_dataset *sds = NULL;
        if (json) ferry_sbuf_puts(out, first ? ",\"subgroups\":[" : ",");
        if (ferry_dataset_open(ctx, sub, NULL, &sds) == 0) {
            describe(ctx, sds, sub, json, depth - 1, out);
            ferry_dataset_close(sds);
        } else if (json) {
            ferry_sbuf_puts(out, "{\"path\":");
            ferry_sbuf_json_string(out, sub, strlen(sub));
            ferry_sbuf_puts(out, ",\"error\":");
            ferry_sbuf_json_string(out, ferry_errmsg(ctx), strlen(ferry_errmsg(ctx)));
            ferry_sbuf_puts(out, "}");
        } else {
            ferry_sbuf_printf(out, "%s: unreadable: %s\n", sub, ferry_errmsg(ctx));
        }
        first = 0;
    }
    if (json && !first) ferry_sbuf_puts(out, "]");
    ferry_json_free(groups);
}

static void describe(ferry_ctx *ctx, ferry_dataset *ds, const char *path, int json, int depth, ferry_sbuf *out) {
    if (json) {
        describe_json(ds, path, out);
        out->len--;   /* reopen the object for its subgroups */
        describe_subgroups(ctx, ds, path, json, depth, out);
        ferry_sbuf_puts(out, "}");
    } else {
        describe_text(ds, path, out);
        describe_subgroups(ctx, ds, path, json, depth, out);
    }
}

int ferry_cli_info(ferry_ctx *ctx, int argc, char **argv) {
    int json = 0, status = 0, depth = 1, knobs = 0, codecs = 0;
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'}, {"json", no_argument, NULL, 'j'}, {"knobs", no_argument, NULL, 'k'},
        {"codecs", no_argument, NULL, 'c'},
        {"depth", required_argument, NULL, 'd'}, {NULL, 0, NULL, 0}};
    optind = 0;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1;) {
        if (c == 'h') { usage(stdout); return 0; }
        if (c == 'j') { json = 1; continue; }
        if (c == 'd') {
            if (cli_int("info", "depth", optarg, 0, 64, &depth)) return 2;
            continue;
        }
        if (c == 'k') { knobs = 1; continue; }
        if (c == 'c') { codecs = 1; continue; }
        cli_bad_option("info", c, optopt, argv[optind - 1]);
        return 2;
    }
    int npaths = argc - optind;
    if (knobs) return describe_knobs(json);
    if (codecs) return describe_codecs(json);
    if (!npaths) return describe_library(ctx, json);
    if (json && npaths > 1) printf("[");
    int printed = 0;
    for (int i = optind; i < argc; i++) {
        const char *path = argv[i];
        ferry_sbuf out = {0};
        ferry_dataset *ds = NULL;
        struct stat dst;
        int dcp = stat(path, &dst) == 0 && S_ISDIR(dst.st_mode) ? ferry_cli_info_dcp(path, json, &out) : 0;
        int rc = dcp ? 0 : ferry_dataset_open(ctx, path, NULL, &ds);
        if (dcp < 0) {
            status = 1;
        } else if (dcp) {
            /* described */
        } else if (rc == 0) {
            describe(ctx, ds, path, json, depth, &out);
            ferry_dataset_close(ds);
        } else {
            struct stat st;
            char msg[1100];
            snprintf(msg, sizeof msg, "%s", ferry_errmsg(ctx)[0] ? ferry_errmsg(ctx) : ferry_strerror(rc));
            if (rc == FERRY_ENOFORMAT && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                status |= describe_other(ctx, path, msg, json, &out);
            } else {
                fprintf(stderr, "ferry info: %s\n", msg);
                status = 1;
            }
        }
        char *text = ferry_sbuf_take(&out);
        if (text && *text) {
            if (json && printed) printf(",");
            fputs(text, stdout);
            if (json && npaths == 1) printf("\n");
            printed++;
        }
        free(text);
    }
    if (json && npaths > 1) printf("]\n");
    fflush(stdout);
    return status;
}
