/* formats_check.h — helpers the format tests share: a temporary directory and
 * files in it, running a dataset read plan, and expecting an open to fail with a given code and a message naming the file
 * (and a byte position for FERRY_EFORMAT). Include after check.h. */
#ifndef FERRY_TEST_FORMATS_CHECK_H
#define FERRY_TEST_FORMATS_CHECK_H
#include "check.h"
#include "ferry.h"
#include <stdio.h>
#include <stdlib.h>

/* The test's temporary directory (the test fills it with mkdtemp). */
static char dir[64];

/* dir/name, in one of 8 rotating buffers (so a few can be used at once). */
static inline const char *tpath(const char *name) {
    static char bufs[8][256];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, 256, "%s/%s", dir, name);
    return b;
}

static inline void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

/* Plan and run a read of variable `var` (selection sel, or NULL) into host memory. */
static inline int64_t fc_read(ferry_ctx *ctx, ferry_dataset *ds, int var, const ferry_slice *sel, void *dst,
                              size_t n, unsigned flags) {
    ferry_plan *p;
    ferry_plan_create(&p);
    int64_t rc = ferry_dataset_plan_read(ds, var, sel, ferry_host_buf(dst, n), flags, p);
    if (rc >= 0) {
        int64_t got = ferry_run(ctx, p, NULL);
        if (got < 0) rc = got;
    }
    ferry_plan_destroy(p);
    return rc;
}

static inline void fc_expect_open_error(ferry_ctx *ctx, const char *path, const char *format, int code,
                                        const char *needle) {
    ferry_open_opts o = {.format = format};
    ferry_dataset *ds = (ferry_dataset *)1;
    int rc = ferry_dataset_open(ctx, path, &o, &ds);
    CHECK_EQ_I(rc, code);
    CHECK(ds == NULL);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), path);
    if (code == FERRY_EFORMAT) CHECK_STR_CONTAINS(ferry_errmsg(ctx), "byte ");
    if (needle) CHECK_STR_CONTAINS(ferry_errmsg(ctx), needle);
    if (rc == 0) ferry_dataset_close(ds);
}
#endif
