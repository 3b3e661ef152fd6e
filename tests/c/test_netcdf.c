/* test_netcdf.c — netCDF classic files (CDF-1, CDF-2, CDF-5) built byte by
 * byte: dimensions, typed attributes, fixed and record variables, the single
 * record variable and streaming cases, and lying headers. */
#include "check.h"
#include "formats_check.h"
#include "ferry.h"
#include <stdlib.h>

static ferry_ctx *ctx;

/* ---- a tiny big-endian writer --------------------------------------------- */
typedef struct nb { uint8_t p[4096]; size_t n; int ver; } nb;
static void put8(nb *b, uint8_t v) { b->p[b->n++] = v; }
static void put32(nb *b, uint32_t v) { for (int i = 3; i >= 0; i--) put8(b, (uint8_t)(v >> (8 * i))); }
static void put64(nb *b, uint64_t v) { for (int i = 7; i >= 0; i--) put8(b, (uint8_t)(v >> (8 * i))); }
static void nonneg(nb *b, uint64_t v) { if (b->ver == 5) put64(b, v); else put32(b, (uint32_t)v); }
static void offset(nb *b, uint64_t v) { if (b->ver == 1) put32(b, (uint32_t)v); else put64(b, v); }
static void pad(nb *b) { while (b->n % 4) put8(b, 0); }
static void name(nb *b, const char *s) {
    nonneg(b, strlen(s));
    for (const char *c = s; *c; c++) put8(b, (uint8_t)*c);
    pad(b);
}

/* knobs for breaking the header; -1 = leave alone */
typedef struct knobs {
    int ver;
    int64_t numrecs;         /* -2: streaming */
    int64_t c_begin, v_begin, x_dimid, v_type, x_len, dim_tag, gatt_count;
} knobs;
static const knobs OK1 = {1, 2, -1, -1, -1, -1, -1, -1, -1};

/* dims time (unlimited), x = 3; global attrs title = "hi", version = int [1, 2];
 * c(x) short with _FillValue = -1; v(time, x) float; s(time) short. */
static size_t build(uint8_t *out, knobs k) {
    nb hb, *b = &hb;
    uint64_t begins[3] = {0, 0, 0};
    for (int pass = 0; pass < 2; pass++) {
        b->n = 0;
        b->ver = k.ver;
        put8(b, 'C'); put8(b, 'D'); put8(b, 'F'); put8(b, (uint8_t)k.ver);
        if (k.numrecs == -2) nonneg(b, k.ver == 5 ? UINT64_MAX : 0xFFFFFFFFu);
        else nonneg(b, (uint64_t)k.numrecs);
        put32(b, k.dim_tag >= 0 ? (uint32_t)k.dim_tag : 10); nonneg(b, 2);
        name(b, "time"); nonneg(b, 0);
        name(b, "x"); nonneg(b, k.x_len >= 0 ? (uint64_t)k.x_len : 3);
        put32(b, 12); nonneg(b, k.gatt_count >= 0 ? (uint64_t)k.gatt_count : 2);
        name(b, "title"); put32(b, 2); nonneg(b, 2); put8(b, 'h'); put8(b, 'i'); pad(b);
        name(b, "version"); put32(b, 4); nonneg(b, 2); put32(b, 1); put32(b, 2);
        put32(b, 11); nonneg(b, 3);
        /* c(x) short */
        name(b, "c"); nonneg(b, 1); nonneg(b, k.x_dimid >= 0 ? (uint64_t)k.x_dimid : 1);
        put32(b, 12); nonneg(b, 1); name(b, "_FillValue"); put32(b, 3); nonneg(b, 1); put8(b, 0xff); put8(b, 0xff); pad(b);
        put32(b, 3); nonneg(b, 8); offset(b, k.c_begin >= 0 ? (uint64_t)k.c_begin : begins[0]);
        /* v(time, x) float */
        name(b, "v"); nonneg(b, 2); nonneg(b, 0); nonneg(b, 1);
        put32(b, 12); nonneg(b, 1); name(b, "units"); put32(b, 2); nonneg(b, 1); put8(b, 'm'); pad(b);
        put32(b, k.v_type >= 0 ? (uint32_t)k.v_type : 5); nonneg(b, 12); offset(b, k.v_begin >= 0 ? (uint64_t)k.v_begin : begins[1]);
        /* s(time) short */
        name(b, "s"); nonneg(b, 1); nonneg(b, 0);
        put32(b, 0); nonneg(b, 0);
        put32(b, 3); nonneg(b, 4); offset(b, begins[2]);
        begins[0] = b->n;
        begins[1] = b->n + 8;
        begins[2] = b->n + 8 + 12;
    }
    /* c: 1, 2, 3 (+ 2 bytes padding); records: v = 3r, 3r+1, 3r+2; s = 10 + r */
    put32(b, 0x00010002); put32(b, 0x00030000);
    for (int r = 0; r < 2; r++) {
        for (int j = 0; j < 3; j++) {
            float f = (float)(3 * r + j);
            uint32_t u;
            memcpy(&u, &f, 4);
            put32(b, u);
        }
        put32(b, (uint32_t)(10 + r) << 16);
    }
    memcpy(out, b->p, b->n);
    return b->n;
}

static int64_t read_var(ferry_dataset *ds, const char *var, const ferry_slice *sel, void *dst, size_t n, unsigned flags) {
    return fc_read(ctx, ds, ferry_dataset_find(ds, var), sel, dst, n, flags);
}

static void expect_open_error(const char *path, const char *format, int code, const char *needle) {
    fc_expect_open_error(ctx, path, format, code, needle);
}

static uint8_t file[8192];

static void check_good(knobs k) {
    size_t n = build(file, k);
    const char *p = tpath("g.nc");
    write_file(p, file, n);
    ferry_dataset *ds;
    CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
    if (!ds) { fprintf(stderr, "  %s\n", ferry_errmsg(ctx)); return; }
    CHECK(!strcmp(ferry_dataset_format(ds), "netcdf3"));
    CHECK(!strcmp(ferry_dataset_attrs_json(ds), "{\"title\":\"hi\",\"version\":{\"type\":\">i4\",\"value\":[1,2]}}"));
    CHECK(!strcmp(ferry_dataset_dims_json(ds),
                  "{\"time\":{\"size\":2,\"unlimited\":true},\"x\":{\"size\":3,\"unlimited\":false}}"));
    CHECK_EQ_I(ferry_dataset_nvars(ds), 3);
    ferry_var_info vi;
    ferry_dataset_var(ds, ferry_dataset_find(ds, "c"), &vi);
    CHECK(!strcmp(vi.typestr, ">i2"));
    CHECK(!strcmp(vi.fill_json, "-1"));
    CHECK(!strcmp(vi.dims_json, "[\"x\"]"));
    CHECK(!strcmp(vi.attrs_json, "{\"_FillValue\":{\"type\":\">i2\",\"value\":[-1]}}"));
    CHECK_EQ_I(vi.data_bytes, 6);
    ferry_dataset_var(ds, ferry_dataset_find(ds, "v"), &vi);
    CHECK_EQ_I(vi.ndim, 2);
    CHECK_EQ_I(vi.shape[0], 2);
    CHECK_EQ_I(vi.chunks[0], 1);
    CHECK(!strcmp(vi.attrs_json, "{\"units\":\"m\"}"));

    int16_t c[3];
    CHECK_EQ_I(read_var(ds, "c", NULL, c, sizeof c, FERRY_NATIVE), 6);
    CHECK(c[0] == 1 && c[1] == 2 && c[2] == 3);
    CHECK_EQ_I(read_var(ds, "c", NULL, c, sizeof c, 0), 6);
    CHECK(c[0] == 0x0100);                        /* as stored: big-endian */
    float v[6];
    CHECK_EQ_I(read_var(ds, "v", NULL, v, sizeof v, FERRY_NATIVE), 24);
    for (int i = 0; i < 6; i++) CHECK(v[i] == (float)i);
    ferry_slice sel[2] = {{1, 2, 1}, {0, 3, 2}};
    CHECK_EQ_I(read_var(ds, "v", sel, v, 8, FERRY_NATIVE), 8);
    CHECK(v[0] == 3 && v[1] == 5);
    int16_t s[2];
    CHECK_EQ_I(read_var(ds, "s", NULL, s, sizeof s, FERRY_NATIVE), 4);
    CHECK(s[0] == 10 && s[1] == 11);
    ferry_slice one[1] = {{1, 2, 1}};
    CHECK_EQ_I(read_var(ds, "s", one, s, 2, FERRY_NATIVE), 2);
    CHECK(s[0] == 11);
    ferry_dataset_close(ds);
}

static void test_cdf1(void) { check_good(OK1); }
static void test_cdf2(void) { knobs k = OK1; k.ver = 2; check_good(k); }
static void test_cdf5(void) { knobs k = OK1; k.ver = 5; check_good(k); }
static void test_streaming_numrecs(void) {
    knobs k = OK1;
    k.numrecs = -2;
    check_good(k);
    k.ver = 5;
    check_good(k);
}

/* One record variable of bytes: records are not padded. */
static void test_single_record_variable(void) {
    nb hb, *b = &hb;
    uint64_t begin = 0;
    for (int pass = 0; pass < 2; pass++) {
        b->n = 0; b->ver = 1;
        put8(b, 'C'); put8(b, 'D'); put8(b, 'F'); put8(b, 1);
        put32(b, 5);
        put32(b, 10); put32(b, 1); name(b, "t"); put32(b, 0);
        put32(b, 0); put32(b, 0);
        put32(b, 11); put32(b, 1);
        name(b, "b"); put32(b, 1); put32(b, 0); put32(b, 0); put32(b, 0);
        put32(b, 1); put32(b, 4); put32(b, (uint32_t)begin);
        begin = b->n;
    }
    for (int i = 0; i < 5; i++) put8(b, (uint8_t)(100 + i));
    const char *p = tpath("single.nc");
    write_file(p, b->p, b->n);
    ferry_dataset *ds;
    CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
    if (!ds) { fprintf(stderr, "  %s\n", ferry_errmsg(ctx)); return; }
    ferry_var_info vi;
    ferry_dataset_var(ds, 0, &vi);
    CHECK_EQ_I(vi.shape[0], 5);
    CHECK(!strcmp(vi.typestr, "|i1"));
    CHECK_EQ_I(vi.data_offset, begin);
    CHECK_EQ_I(vi.data_bytes, 5);
    int8_t out[5];
    CHECK_EQ_I(read_var(ds, "b", NULL, out, 5, FERRY_NATIVE), 5);
    CHECK(out[0] == 100 && out[4] == 104);
    ferry_slice sel[1] = {{1, 5, 3}};
    CHECK_EQ_I(read_var(ds, "b", sel, out, 2, FERRY_NATIVE), 2);
    CHECK(out[0] == 101 && out[1] == 104);
    ferry_dataset_close(ds);
}

static void test_lying_headers(void) {
    const char *p = tpath("bad.nc");
    size_t good_n = build(file, OK1);
    knobs k;
#define BAD(field, value, needle) do { k = OK1; k.field = value; size_t n_ = build(file, k); \
        write_file(p, file, n_); expect_open_error(p, NULL, FERRY_EFORMAT, needle); } while (0)
    BAD(c_begin, 8, "inside the header");
    BAD(c_begin, 100000, "past the end");
    BAD(v_begin, 100000, "past the end");
    BAD(x_dimid, 7, "dimension id 7 out of range");
    BAD(x_dimid, 0, "past the end");   /* c becomes a record variable the file cannot hold */
    BAD(v_type, 7, "bad type");
    BAD(v_type, 0, "bad type");
    BAD(x_len, 0x80000000, "negative");
    BAD(dim_tag, 11, "tag");
    BAD(gatt_count, 0x7fffffff, "cannot fit");
    BAD(numrecs, 1000, "past the end");
#undef BAD
    /* fixed data overlapping the records */
    k = OK1;
    k.c_begin = (int64_t)good_n - 30;
    size_t n = build(file, k);
    write_file(p, file, n);
    expect_open_error(p, NULL, FERRY_EFORMAT, "overlaps");

    /* wrong magic: unknown to detection; forced, a format error */
    n = build(file, OK1);
    file[3] = 3;
    write_file(p, file, n);
    expect_open_error(p, NULL, FERRY_EFORMAT, "bad magic");            /* by its name */
    const char *q = tpath("bad.dat");
    write_file(q, file, n);
    expect_open_error(q, NULL, FERRY_ENOFORMAT, "known format");
    expect_open_error(q, "netcdf3", FERRY_EFORMAT, "bad magic");
}

static void test_every_truncation(void) {
    const char *p = tpath("trunc.nc");
    knobs ks[2] = {OK1, OK1};
    ks[1].ver = 5;
    for (int v = 0; v < 2; v++) {
        size_t n = build(file, ks[v]);
        /* the last record's trailing pad (2 bytes) may be missing */
        for (size_t len = 0; len < n - 2; len++) {
            write_file(p, file, len);
            expect_open_error(p, "netcdf3", FERRY_EFORMAT, NULL);
        }
    }
}

/* xarray's group= on a classic file: "no group", never the root read as if it were the group */
static void test_group_of_a_file_without_groups(void) {
    const char *p = tpath("groups.nc");
    size_t n = build(file, OK1);
    write_file(p, file, n);
    ferry_open_opts o = {.group = "nope"};
    ferry_dataset *ds = NULL;
    CHECK(ferry_dataset_open(ctx, p, &o, &ds) == FERRY_ENOTFOUND);
    CHECK(ds == NULL);
    CHECK(strstr(ferry_errmsg(ctx), "no group \"nope\"") != NULL);
    CHECK(strstr(ferry_errmsg(ctx), "groups.nc") != NULL);
    o.group = "/";   /* the root, named */
    CHECK(ferry_dataset_open(ctx, p, &o, &ds) == 0);
    ferry_dataset_close(ds);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/ferry_test_nc_XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.no_env = 1;
    if (ferry_ctx_create(&ctx, &cfg)) { fprintf(stderr, "ctx\n"); return 1; }
    RUN(test_cdf1);
    RUN(test_cdf2);
    RUN(test_cdf5);
    RUN(test_streaming_numrecs);
    RUN(test_single_record_variable);
    RUN(test_lying_headers);
    RUN(test_every_truncation);
    RUN(test_group_of_a_file_without_groups);
    ferry_ctx_destroy(ctx);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    return check_summary();
}
