/* fuzz.h — what every fuzz target includes. See replay.c for the convention.
 *
 * A target file tests/fuzz/fuzz_NAME.c defines
 *     static int fuzz_NAME(const uint8_t *data, size_t size) { ...; return 0; }
 *     FERRY_FUZZ_TARGET(NAME, fuzz_NAME)
 * Built with -DFERRY_LIBFUZZER (tools/fuzz.sh) the macro defines libFuzzer's
 * LLVMFuzzerTestOneInput; otherwise it registers the function under NAME so
 * that the replay driver (replay.c, linked with every fuzz_*.c) runs the
 * files of tests/fuzz/corpus/NAME/ through it. */
#ifndef FERRY_FUZZ_H
#define FERRY_FUZZ_H
#include "ferry.h"
#include <stddef.h>
#include <stdint.h>

typedef int (*ferry_fuzz_fn)(const uint8_t *data, size_t size);

#ifdef FERRY_LIBFUZZER
#define FERRY_FUZZ_TARGET(name, fn) \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { (void)fn(data, size); return 0; }
#else
void ferry_fuzz_register(const char *name, ferry_fuzz_fn fn);
#define FERRY_FUZZ_TARGET(name, fn) \
    __attribute__((constructor)) static void ferry_fuzz_register_##name(void) { ferry_fuzz_register(#name, fn); }
#endif

/* Shared helpers (defined static inline so each target stays one file). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* One context per process, reused across inputs (made with 2 threads so runs
 * are quick and still exercise the worker pool). */
static inline ferry_ctx *ferry_fuzz_ctx(void) {
    static ferry_ctx *ctx;
    if (!ctx) {
        ferry_config cfg;
        ferry_config_init(&cfg);
        cfg.threads = 2;
        cfg.no_env = 1;
        cfg.path = FERRY_PATH_HOST;
        if (ferry_ctx_create(&ctx, &cfg)) abort();
    }
    return ctx;
}

/* A path whose contents are exactly data[0..size): a memfd, rewritten per input. */
static inline const char *ferry_fuzz_file(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("ferry-fuzz", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) abort();
    return path;
}

/* count × the elements slice s takes, saturating past 2^32 (a bound to compare, not a size). */
static inline uint64_t ferry_slice_count_hint(ferry_slice s, uint64_t count) {
    uint64_t n = s.stop > s.start && s.step > 0 ? ((uint64_t)(s.stop - s.start) + (uint64_t)s.step - 1) / (uint64_t)s.step
                                                : 0;
    return n > (1ull << 32) || count > (1ull << 32) ? (1ull << 33) : count * n;
}

/* Open path as `format`, then exercise every accessor and read every
 * variable (whole, and a strided selection) when its plan has fewer than
 * max_extents extents. */
static inline int ferry_fuzz_open_group(const char *path, const char *format, const char *group,
                                        size_t max_extents) {
    ferry_ctx *ctx = ferry_fuzz_ctx();
    ferry_open_opts o = {.format = format, .group = group};
    ferry_dataset *ds = NULL;
    if (ferry_dataset_open(ctx, path, &o, &ds) < 0) {
        if (ds) abort();                       /* failure leaves *out NULL */
        if (!ferry_errmsg(ctx)[0]) abort();     /* and always says why */
        return 0;
    }
    (void)strlen(ferry_dataset_attrs_json(ds));
    (void)strlen(ferry_dataset_dims_json(ds));
    (void)strlen(ferry_dataset_groups_json(ds));
    ferry_store_info si;
    if (ferry_dataset_store_info(ds, &si) || si.zarr_format < 0 || si.zarr_format > 3 ||
        (si.is_array && ferry_dataset_nvars(ds) != 1))
        abort();
    static uint8_t buf[1 << 20];
    for (int i = 0; i < ferry_dataset_nvars(ds); i++) {
        ferry_var_info vi;
        if (ferry_dataset_var(ds, i, &vi)) abort();
        (void)strlen(vi.name); (void)strlen(vi.typestr); (void)strlen(vi.dims_json);
        (void)strlen(vi.attrs_json); (void)strlen(vi.fill_json); (void)strlen(vi.codecs);
        if (ferry_dataset_find(ds, vi.name) < 0) abort();
        uint8_t fill[16 + 1];
        int fn = vi.itemsize <= 16 ? ferry_dataset_fill(ds, i, fill, sizeof fill) : 0;
        if (fn != 0 && fn != (int)vi.itemsize) abort();   /* the element, or none */
        ferry_slice sel[FERRY_MAX_DIMS];
        for (int pass = 0; pass < 2; pass++) {
            for (int k = 0; k < vi.ndim; k++) {
                int64_t n = (int64_t)(vi.shape[k] > INT64_MAX ? INT64_MAX : vi.shape[k]);
                sel[k] = pass ? (ferry_slice){n / 3, n, 2} : (ferry_slice){0, n, 1};
            }
            ferry_plan *plan;
            if (ferry_plan_create(&plan)) abort();
            int64_t got = ferry_dataset_plan_read(ds, i, sel, ferry_host_buf(buf, sizeof buf),
                                                  pass ? FERRY_NATIVE : FERRY_STORED_ORDER, plan);
            if (got >= 0 && ferry_plan_count(plan) < max_extents) (void)ferry_run(ctx, plan, NULL);
            ferry_plan_destroy(plan);
            /* variable-length strings: read at once (small selections: the
             * references alone take 16 bytes an element) */
            uint64_t count = 1;
            for (int k = 0; k < vi.ndim; k++) count = ferry_slice_count_hint(sel[k], count);
            if (vi.dtype == FERRY_DT_STRING && count <= (1u << 16)) {
                ferry_strings st;
                int64_t n = ferry_dataset_read_strings(ds, i, sel, NULL, &st);
                if (n >= 0 && ((uint64_t)n != st.count || !st.offsets || !st.data || st.offsets[0] ||
                               st.data[st.offsets[st.count]]))
                    abort();
                for (uint64_t k = 0; n >= 0 && k < st.count; k++)
                    if (st.offsets[k + 1] < st.offsets[k]) abort();
                if (n < 0 && !ferry_errmsg(ctx)[0]) abort();
                ferry_strings_free(&st);
            }
        }
    }
    ferry_dataset_close(ds);
    return 0;
}

static inline int ferry_fuzz_open_path(const char *path, const char *format, size_t max_extents) {
    return ferry_fuzz_open_group(path, format, NULL, max_extents);
}

/* Write data to a file and open it as `format` (ferry_fuzz_open_path). */
static inline int ferry_fuzz_dataset(const uint8_t *data, size_t size, const char *format) {
    return ferry_fuzz_open_path(ferry_fuzz_file(data, size), format, 100000);
}
#endif
