/* test_npy.c — npy files built byte by byte: every version, orders, dtypes,
 * selections, and malformed headers that must fail with the file and byte. */
#include "check.h"
#include "formats_check.h"
#include "ferry.h"
#include <stdlib.h>
#include <errno.h>
#include <unistd.h>

static ferry_ctx *ctx;

/* preamble + dict padded with spaces and '\n' so data starts 64-aligned */
static size_t make_npy(uint8_t *out, int major, const char *dict, const void *data, size_t dlen) {
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
    size_t total = pre + dl + 1;
    size_t padded = (total + 63) / 64 * 64;
    memcpy(out, "\x93NUMPY", 6);
    out[6] = (uint8_t)major;
    out[7] = 0;
    size_t hlen = padded - pre;
    if (major == 1) { out[8] = (uint8_t)hlen; out[9] = (uint8_t)(hlen >> 8); }
    else for (int i = 0; i < 4; i++) out[8 + i] = (uint8_t)(hlen >> (8 * i));
    memcpy(out + pre, dict, dl);
    memset(out + pre + dl, ' ', padded - pre - dl - 1);
    out[padded - 1] = '\n';
    if (dlen) memcpy(out + padded, data, dlen);
    return padded + dlen;
}

static int64_t read_var(ferry_dataset *ds, const ferry_slice *sel, void *dst, size_t n, unsigned flags) {
    return fc_read(ctx, ds, 0, sel, dst, n, flags);
}

/* Open must fail with `code`, naming the file (and a byte position for EFORMAT). */
static void expect_open_error(const char *path, const char *format, int code, const char *needle) {
    fc_expect_open_error(ctx, path, format, code, needle);
}

static uint8_t file[1 << 16];

static void test_v1_c_order_whole_and_slices(void) {
    float data[12];
    for (int i = 0; i < 12; i++) data[i] = (float)i * 1.5f;
    size_t n = make_npy(file, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", data, sizeof data);
    const char *p = tpath("c.npy");
    write_file(p, file, n);
    ferry_dataset *ds;
    CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
    if (!ds) return;
    CHECK(!strcmp(ferry_dataset_format(ds), "npy"));
    CHECK_EQ_I(ferry_dataset_nvars(ds), 1);
    ferry_var_info vi;
    CHECK_EQ_I(ferry_dataset_var(ds, 0, &vi), 0);
    CHECK(!strcmp(vi.name, "c"));
    CHECK(!strcmp(vi.typestr, "<f4"));
    CHECK_EQ_I(vi.dtype, FERRY_DT_F32);
    CHECK_EQ_I(vi.ndim, 2);
    CHECK_EQ_I(vi.shape[0], 3);
    CHECK_EQ_I(vi.shape[1], 4);
    CHECK_EQ_I(vi.data_offset, n - sizeof data);
    CHECK_EQ_I(vi.data_bytes, 48);
    CHECK_EQ_I(ferry_dataset_find(ds, "c"), 0);
    CHECK_EQ_I(ferry_dataset_find(ds, "nope"), FERRY_ENOTFOUND);
    CHECK(!strcmp(ferry_dataset_attrs_json(ds), "{}"));

    float out[12] = {0};
    CHECK_EQ_I(read_var(ds, NULL, out, sizeof out, 0), 48);
    CHECK(!memcmp(out, data, sizeof data));

    /* rows 0 and 2, columns 1..3 step 2 */
    ferry_slice sel[2] = {{0, 3, 2}, {1, 4, 2}};
    float part[4] = {0};
    CHECK_EQ_I(read_var(ds, sel, part, sizeof part, 0), 16);
    CHECK(part[0] == data[1] && part[1] == data[3] && part[2] == data[9] && part[3] == data[11]);

    /* a stop past the end is refused, not clipped (issue 38.13); an empty
     * selection reads nothing */
    ferry_slice clip[2] = {{2, 99, 1}, {0, 4, 1}};
    CHECK_EQ_I(read_var(ds, clip, part, sizeof part, 0), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "dimension 0: selection 2:99:1 outside 0..3");
    ferry_slice empty[2] = {{2, 2, 1}, {0, 4, 1}};
    CHECK_EQ_I(read_var(ds, empty, part, 0, 0), 0);

    /* bad selections and a small destination are caller errors */
    ferry_slice bad_step[2] = {{0, 3, 0}, {0, 4, 1}};
    CHECK_EQ_I(read_var(ds, bad_step, part, sizeof part, 0), FERRY_EINVAL);
    ferry_slice bad_start[2] = {{-1, 3, 1}, {0, 4, 1}};
    CHECK_EQ_I(read_var(ds, bad_start, part, sizeof part, 0), FERRY_EINVAL);
    ferry_slice past[2] = {{4, 5, 1}, {0, 4, 1}};
    CHECK_EQ_I(read_var(ds, past, part, sizeof part, 0), FERRY_EINVAL);
    CHECK_EQ_I(read_var(ds, NULL, part, sizeof part, 0), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "destination holds 16 bytes");
    ferry_plan *pl;
    ferry_plan_create(&pl);
    CHECK_EQ_I(ferry_dataset_plan_read(ds, 1, NULL, ferry_host_buf(out, sizeof out), 0, pl), FERRY_EINVAL);
    ferry_plan_destroy(pl);
    ferry_dataset_close(ds);
    ferry_dataset_close(NULL);
}

static void test_fortran_order(void) {
    /* F order (2, 3): stored column by column */
    int32_t c[6] = {0, 1, 2, 10, 11, 12};           /* c[i][j] = 10*i + j */
    int32_t f[6] = {0, 10, 1, 11, 2, 12};
    size_t n = make_npy(file, 2, "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }", f, sizeof f);
    const char *p = tpath("f.npy");
    write_file(p, file, n);
    ferry_dataset *ds;
    CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
    if (!ds) return;
    ferry_var_info vi;
    ferry_dataset_var(ds, 0, &vi);
    CHECK_EQ_I(vi.fortran_order, 1);
    int32_t out[6] = {0};
    CHECK_EQ_I(read_var(ds, NULL, out, sizeof out, 0), 24);
    CHECK(!memcmp(out, c, sizeof c));
    CHECK_EQ_I(read_var(ds, NULL, out, sizeof out, FERRY_STORED_ORDER), 24);
    CHECK(!memcmp(out, f, sizeof f));
    ferry_slice sel[2] = {{1, 2, 1}, {0, 3, 2}};
    int32_t part[2];
    CHECK_EQ_I(read_var(ds, sel, part, sizeof part, FERRY_STORED_ORDER), 8);
    CHECK(part[0] == 10 && part[1] == 12);
    ferry_dataset_close(ds);
}

static void test_big_endian_native(void) {
    uint8_t be[8] = {0, 0, 1, 2, 0xff, 0xff, 0xff, 0xfe};
    size_t n = make_npy(file, 3, "{\"descr\": \">i4\", \"fortran_order\": False, \"shape\": (2,)}", be, sizeof be);
    const char *p = tpath("be.npy");
    write_file(p, file, n);
    ferry_dataset *ds;
    CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
    if (!ds) return;
    ferry_var_info vi;
    ferry_dataset_var(ds, 0, &vi);
    CHECK(!strcmp(vi.typestr, ">i4"));
    int32_t out[2];
    CHECK_EQ_I(read_var(ds, NULL, out, sizeof out, FERRY_NATIVE), 8);
    CHECK(out[0] == 258 && out[1] == -2);
    CHECK_EQ_I(read_var(ds, NULL, out, sizeof out, 0), 8);
    CHECK(!memcmp(out, be, 8));
    ferry_slice sel[1] = {{1, 2, 1}};
    CHECK_EQ_I(read_var(ds, sel, out, 4, FERRY_NATIVE), 4);
    CHECK(out[0] == -2);
    ferry_dataset_close(ds);
}

static void test_dtypes(void) {
    static const struct { const char *descr; ferry_dtype dt; uint32_t size; } cases[] = {
        {"|b1", FERRY_DT_BOOL, 1}, {"|i1", FERRY_DT_I8, 1}, {"|u1", FERRY_DT_U8, 1}, {"<i2", FERRY_DT_I16, 2},
        {"<u8", FERRY_DT_U64, 8}, {"<f2", FERRY_DT_F16, 2}, {"<f8", FERRY_DT_F64, 8}, {"<c8", FERRY_DT_C64, 8},
        {">c16", FERRY_DT_C128, 16}, {"<M8[ns]", FERRY_DT_DATETIME64, 8}, {">m8[s]", FERRY_DT_TIMEDELTA64, 8},
        {"<M8", FERRY_DT_DATETIME64, 8}, {"|S1", FERRY_DT_CHAR, 1}, {"|S7", FERRY_DT_BYTES, 7},
        {"|V16", FERRY_DT_BYTES, 16}, {"<U3", FERRY_DT_OTHER, 12}, {"<f16", FERRY_DT_OTHER, 16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dict[160];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (2, 1), }", cases[i].descr);
        uint8_t data[64] = {0};
        size_t n = make_npy(file, 1, dict, data, 2 * cases[i].size);
        const char *p = tpath("d.npy");
        write_file(p, file, n);
        ferry_dataset *ds;
        int rc = ferry_dataset_open(ctx, p, NULL, &ds);
        CHECK_EQ_I(rc, 0);
        if (rc) { fprintf(stderr, "  %s: %s\n", cases[i].descr, ferry_errmsg(ctx)); continue; }
        ferry_var_info vi;
        ferry_dataset_var(ds, 0, &vi);
        CHECK_EQ_I(vi.dtype, cases[i].dt);
        CHECK_EQ_I(vi.itemsize, cases[i].size);
        CHECK(!strcmp(vi.typestr, cases[i].descr));
        ferry_dataset_close(ds);
    }
}

static void test_scalar_and_empty(void) {
    double v = 3.25;
    size_t n = make_npy(file, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (), }", &v, 8);
    const char *p = tpath("s.npy");
    write_file(p, file, n);
    ferry_dataset *ds;
    CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
    if (ds) {
        double out = 0;
        CHECK_EQ_I(read_var(ds, NULL, &out, 8, 0), 8);
        CHECK(out == 3.25);
        ferry_dataset_close(ds);
    }
    n = make_npy(file, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 5), }", NULL, 0);
    write_file(p, file, n);
    CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
    if (ds) {
        CHECK_EQ_I(read_var(ds, NULL, NULL, 0, 0), 0);
        ferry_dataset_close(ds);
    }
}

static void test_malformed_headers(void) {
    static const struct { const char *dict; int code; const char *needle; } cases[] = {
        {"{'descr': '<f4', 'fortran_order': False}", FERRY_EFORMAT, "missing key"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", FERRY_EFORMAT, "unexpected key"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", FERRY_EFORMAT, "duplicate"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", FERRY_EFORMAT, "non-negative"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", FERRY_EFORMAT, "not a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296)}", FERRY_EFORMAT, "overflows"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", FERRY_EFORMAT, "too large"},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", FERRY_EFORMAT, "True or False"},
        {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}", FERRY_EFORMAT, "True or False"},
        {"{'descr': '|O', 'fortran_order': False, 'shape': (2,)}", FERRY_EUNSUPPORTED, "dtype"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", FERRY_EUNSUPPORTED, "structured"},
        {"{'descr': '<x4', 'fortran_order': False, 'shape': (2,)}", FERRY_EFORMAT, "dtype"},
        {"{'descr': '<i3', 'fortran_order': False, 'shape': (2,)}", FERRY_EFORMAT, "dtype"},
        {"{'descr': '<M8[n s]', 'fortran_order': False, 'shape': (2,)}", FERRY_EFORMAT, "dtype"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", FERRY_EFORMAT, "after the dict"},
        {"{'descr': '<f\xe9" "4', 'fortran_order': False, 'shape': (2,)}", FERRY_EFORMAT, "non-ASCII"},
        {"{'descr': '<f4\\n', 'fortran_order': False, 'shape': (2,)}", FERRY_EFORMAT, "string"},
        {"['descr', '<f4']", FERRY_EFORMAT, "expected '{'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", FERRY_EFORMAT, NULL},
    };
    uint8_t data[64] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = make_npy(file, 1, cases[i].dict, data, sizeof data);
        const char *p = tpath("bad.npy");
        write_file(p, file, n);
        expect_open_error(p, NULL, cases[i].code, cases[i].needle);
    }
}

static void test_bad_preamble_and_truncation(void) {
    float data[6] = {1, 2, 3, 4, 5, 6};
    size_t n = make_npy(file, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data, sizeof data);
    const char *p = tpath("t.npy");
    /* wrong magic: not detected as npy at all; forced, it is a format error */
    uint8_t bad[256];
    memcpy(bad, file, n);
    bad[1] = 'M';
    write_file(p, bad, n);
    expect_open_error(p, NULL, FERRY_EFORMAT, "bad magic");            /* by its name */
    const char *q = tpath("t.bin");
    write_file(q, bad, n);
    expect_open_error(q, NULL, FERRY_ENOFORMAT, "not a file or store of a known format");
    expect_open_error(q, "npy", FERRY_EFORMAT, "bad magic");
    memcpy(bad, file, n);
    bad[6] = 4;
    write_file(p, bad, n);
    expect_open_error(p, NULL, FERRY_EUNSUPPORTED, "version 4.0");
    memcpy(bad, file, n);
    bad[8] = 0xff; bad[9] = 0xff;   /* header length past the end */
    write_file(p, bad, n);
    expect_open_error(p, NULL, FERRY_EFORMAT, "truncated");
    /* every truncation fails cleanly */
    for (size_t len = 0; len < n; len++) {
        write_file(p, file, len);
        expect_open_error(p, "npy", FERRY_EFORMAT, NULL);
    }
    write_file(p, file, n);
    ferry_dataset *ds;
    CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
    ferry_dataset_close(ds);
}

static void test_open_errors(void) {
    ferry_dataset *ds;
    CHECK(ferry_dataset_open(ctx, tpath("missing.npy"), NULL, &ds) == -ENOENT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "missing.npy");
    ferry_open_opts o = {.format = "hdf9"};
    const char *p = tpath("c.npy");
    CHECK_EQ_I(ferry_dataset_open(ctx, p, &o, &ds), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "unknown format");
    /* a directory nobody claims */
    CHECK_EQ_I(ferry_dataset_open(ctx, dir, NULL, &ds), FERRY_ENOFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), dir);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/ferry_test_npy_XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.no_env = 1;
    if (ferry_ctx_create(&ctx, &cfg)) { fprintf(stderr, "ctx\n"); return 1; }
    RUN(test_v1_c_order_whole_and_slices);
    RUN(test_fortran_order);
    RUN(test_big_endian_native);
    RUN(test_dtypes);
    RUN(test_scalar_and_empty);
    RUN(test_malformed_headers);
    RUN(test_bad_preamble_and_truncation);
    RUN(test_open_errors);
    ferry_ctx_destroy(ctx);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    return check_summary();
}
