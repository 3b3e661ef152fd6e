/* test_safetensors.c — safetensors files built byte by byte: dtypes,
 * metadata, slices, index shard sets, and hostile headers. */
#include "check.h"
#include "formats_check.h"
#include "ferry.h"
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static ferry_ctx *ctx;

static uint8_t file[1 << 16];

/* u64 LE length, header padded with spaces to 8 bytes, data */
static size_t make_st(uint8_t *out, const char *hdr, const void *data, size_t dlen) {
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(out + 8, hdr, hl);
    memset(out + 8 + hl, ' ', padded - hl);
    if (dlen) memcpy(out + 8 + padded, data, dlen);
    return 8 + padded + dlen;
}

static int64_t read_var(ferry_dataset *ds, int var, const ferry_slice *sel, void *dst, size_t n) {
    return fc_read(ctx, ds, var, sel, dst, n, FERRY_NATIVE);
}

static void expect_open_error(const char *path, const char *format, int code, const char *needle) {
    fc_expect_open_error(ctx, path, format, code, needle);
}

static const char *GOOD_HDR =
    "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"caf\\u00e9\"},"
    "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"h\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,2],\"data_offsets\":[32,36]},"
    "\"z\":{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[36,36]}}";

static void good_data(uint8_t *d) {
    float w[6] = {0, 1, 2, 3, 4, 5};
    memcpy(d, w, 24);
    for (int i = 0; i < 12; i++) d[24 + i] = (uint8_t)(0xa0 + i);
}

static void test_good_file(void) {
    uint8_t data[36];
    good_data(data);
    size_t n = make_st(file, GOOD_HDR, data, sizeof data);
    const char *p = tpath("m.safetensors");
    write_file(p, file, n);
    ferry_dataset *ds;
    CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
    if (!ds) { fprintf(stderr, "%s\n", ferry_errmsg(ctx)); return; }
    CHECK(!strcmp(ferry_dataset_format(ds), "safetensors"));
    CHECK(!strcmp(ferry_dataset_attrs_json(ds), "{\"format\":\"pt\",\"note\":\"caf\xc3\xa9\"}"));
    CHECK_EQ_I(ferry_dataset_nvars(ds), 4);
    int w = ferry_dataset_find(ds, "w"), h = ferry_dataset_find(ds, "h"), q = ferry_dataset_find(ds, "q");
    CHECK(w >= 0 && h >= 0 && q >= 0);
    ferry_var_info vi;
    ferry_dataset_var(ds, h, &vi);
    CHECK_EQ_I(vi.dtype, FERRY_DT_BF16);
    CHECK(!strcmp(vi.typestr, "bfloat16"));
    CHECK_EQ_I(vi.itemsize, 2);
    size_t hdr_end = n - sizeof data;
    CHECK_EQ_I(vi.data_offset, hdr_end + 24);
    ferry_dataset_var(ds, q, &vi);
    CHECK_EQ_I(vi.dtype, FERRY_DT_F8_E4M3);
    CHECK(!strcmp(vi.typestr, "float8_e4m3fn"));

    float out[6];
    CHECK_EQ_I(read_var(ds, w, NULL, out, sizeof out), 24);
    CHECK(out[0] == 0 && out[5] == 5);
    /* column 1 (a slice along the last dim), then row 1 */
    ferry_slice col[2] = {{0, 2, 1}, {1, 2, 1}};
    CHECK_EQ_I(read_var(ds, w, col, out, 8), 8);
    CHECK(out[0] == 1 && out[1] == 4);
    ferry_slice row[2] = {{1, 2, 1}, {0, 3, 1}};
    CHECK_EQ_I(read_var(ds, w, row, out, 12), 12);
    CHECK(out[0] == 3 && out[2] == 5);
    uint8_t b[8];
    CHECK_EQ_I(read_var(ds, h, NULL, b, 8), 8);
    CHECK(b[0] == 0xa0 && b[7] == 0xa7);
    CHECK_EQ_I(read_var(ds, ferry_dataset_find(ds, "z"), NULL, NULL, 0), 0);
    ferry_dataset_close(ds);
}

static void test_all_dtypes(void) {
    static const struct { const char *name; int bytes; ferry_dtype dt; } cases[] = {
        {"BOOL", 1, FERRY_DT_BOOL}, {"U8", 1, FERRY_DT_U8}, {"I8", 1, FERRY_DT_I8}, {"F8_E5M2", 1, FERRY_DT_F8_E5M2},
        {"F8_E4M3", 1, FERRY_DT_F8_E4M3}, {"F8_E8M0", 1, FERRY_DT_F8_E8M0}, {"F8_E4M3FNUZ", 1, FERRY_DT_F8_E4M3FNUZ},
        {"F8_E5M2FNUZ", 1, FERRY_DT_F8_E5M2FNUZ}, {"I16", 2, FERRY_DT_I16}, {"U16", 2, FERRY_DT_U16},
        {"F16", 2, FERRY_DT_F16}, {"BF16", 2, FERRY_DT_BF16}, {"I32", 4, FERRY_DT_I32}, {"U32", 4, FERRY_DT_U32},
        {"F32", 4, FERRY_DT_F32}, {"I64", 8, FERRY_DT_I64}, {"U64", 8, FERRY_DT_U64}, {"F64", 8, FERRY_DT_F64},
        {"C64", 8, FERRY_DT_C64},
    };
    uint8_t data[64] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char hdr[200];
        snprintf(hdr, sizeof hdr, "{\"t\":{\"dtype\":\"%s\",\"shape\":[2,2],\"data_offsets\":[0,%d]}}", cases[i].name,
                 4 * cases[i].bytes);
        size_t n = make_st(file, hdr, data, (size_t)(4 * cases[i].bytes));
        const char *p = tpath("d.safetensors");
        write_file(p, file, n);
        ferry_dataset *ds;
        CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
        if (!ds) continue;
        ferry_var_info vi;
        ferry_dataset_var(ds, 0, &vi);
        CHECK_EQ_I(vi.dtype, cases[i].dt);
        CHECK_EQ_I(vi.itemsize, cases[i].bytes);
        ferry_dataset_close(ds);
    }
    /* sub-byte: F4 [3, 4] is 6 bytes, exposed as [3, 2] bytes */
    size_t n = make_st(file, "{\"t\":{\"dtype\":\"F4\",\"shape\":[3,4],\"data_offsets\":[0,6]}}", data, 6);
    const char *p = tpath("f4.safetensors");
    write_file(p, file, n);
    ferry_dataset *ds;
    CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
    if (ds) {
        ferry_var_info vi;
        ferry_dataset_var(ds, 0, &vi);
        CHECK_EQ_I(vi.itemsize, 1);
        CHECK_EQ_I(vi.shape[0], 3);
        CHECK_EQ_I(vi.shape[1], 2);
        CHECK_STR_CONTAINS(vi.attrs_json, "\"safetensors_dtype\":\"F4\"");
        CHECK_EQ_I(vi.dtype, FERRY_DT_OTHER);
        CHECK(!strcmp(vi.typestr, "float4_e2m1fn_x2"));
        ferry_dataset_close(ds);
    }
    n = make_st(file, "{\"t\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", data, 2);
    write_file(p, file, n);
    expect_open_error(p, NULL, FERRY_EFORMAT, "fraction");
}

static void test_hostile_headers(void) {
    static const struct { const char *hdr; size_t dlen; int code; const char *needle; } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, FERRY_EFORMAT, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20, FERRY_EFORMAT, "hole"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, FERRY_EFORMAT, "cover"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, FERRY_EFORMAT, "past the data"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, FERRY_EFORMAT, "needs 12"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, FERRY_EFORMAT, "begin <= end"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, FERRY_EFORMAT, "non-negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, FERRY_EFORMAT, "non-negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, FERRY_EFORMAT, "overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[18446744073709551616],\"data_offsets\":[0,8]}}", 8, FERRY_EFORMAT, "non-negative"},
        {"{\"a\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, FERRY_EUNSUPPORTED, "unknown dtype"},
        {"{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, FERRY_EFORMAT, "unknown dtype"},
        /* ferry's and numpy's names for F32 are no safetensors names */
        {"{\"a\":{\"dtype\":\"f4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, FERRY_EUNSUPPORTED, "unknown dtype"},
        {"{\"a\":{\"dtype\":\"<f4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, FERRY_EUNSUPPORTED, "unknown dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, FERRY_EFORMAT, "needs dtype"},
        {"{\"a\":[1,2]}", 0, FERRY_EFORMAT, "not an object"},
        {"{\"__metadata__\":{\"k\":1}}", 0, FERRY_EFORMAT, "not a string"},
        {"{\"__metadata__\":[]}", 0, FERRY_EFORMAT, "__metadata__"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, FERRY_EFORMAT, "duplicate"},
        {"{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, FERRY_EFORMAT, "NUL"},
        {"{\"\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, FERRY_EFORMAT, "UTF-8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", 8, FERRY_EFORMAT, "JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, FERRY_EFORMAT, "at most"},
    };
    uint8_t data[32] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = make_st(file, cases[i].hdr, data, cases[i].dlen);
        const char *p = tpath("bad.safetensors");
        write_file(p, file, n);
        expect_open_error(p, NULL, cases[i].code, cases[i].needle);
    }
}

static void test_header_length(void) {
    const char *p = tpath("len.safetensors");
    uint8_t b[16] = {0};
    /* 200 MB: over the limit */
    uint64_t big = 200000000ull;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(big >> (8 * i));
    b[8] = '{';
    write_file(p, b, 16);
    expect_open_error(p, "safetensors", FERRY_EFORMAT, "100 MB");
    /* 1000: past the end of a 16-byte file */
    memset(b, 0, 8);
    b[0] = 0xe8; b[1] = 0x03;
    write_file(p, b, 16);
    expect_open_error(p, NULL, FERRY_EFORMAT, "past the end");
    /* not a JSON object */
    size_t n = make_st(file, "[1,2,3]", NULL, 0);
    write_file(p, file, n);
    expect_open_error(p, "safetensors", FERRY_EFORMAT, "'{'");
}

static void test_every_truncation(void) {
    uint8_t data[36];
    good_data(data);
    size_t n = make_st(file, GOOD_HDR, data, sizeof data);
    const char *p = tpath("trunc.safetensors");
    for (size_t len = 0; len < n; len++) {
        write_file(p, file, len);
        expect_open_error(p, "safetensors", FERRY_EFORMAT, NULL);
    }
}

static void test_index_shards(void) {
    float a[2] = {1, 2}, b[3] = {3, 4, 5};
    size_t n = make_st(file, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", a, 8);
    write_file(tpath("model-00001-of-00002.safetensors"), file, n);
    n = make_st(file, "{\"__metadata__\":{\"x\":\"y\"},\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", b, 12);
    write_file(tpath("model-00002-of-00002.safetensors"), file, n);
    const char *idx = "{\"metadata\":{\"total_size\":20},\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                      "\"b\":\"model-00002-of-00002.safetensors\"}}";
    const char *p = tpath("model.safetensors.index.json");
    write_file(p, idx, strlen(idx));
    ferry_dataset *ds;
    CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
    if (ds) {
        CHECK(!strcmp(ferry_dataset_format(ds), "safetensors"));
        CHECK(!strcmp(ferry_dataset_attrs_json(ds), "{\"total_size\":20}"));
        CHECK_EQ_I(ferry_dataset_nvars(ds), 2);
        int ib = ferry_dataset_find(ds, "b");
        ferry_var_info vi;
        ferry_dataset_var(ds, ib, &vi);
        CHECK_STR_CONTAINS(vi.path, "model-00002-of-00002.safetensors");
        float out[3];
        ferry_slice s[1] = {{1, 3, 1}};
        CHECK_EQ_I(read_var(ds, ib, s, out, 8), 8);
        CHECK(out[0] == 4 && out[1] == 5);
        CHECK_EQ_I(read_var(ds, ferry_dataset_find(ds, "a"), NULL, out, 8), 8);
        CHECK(out[0] == 1 && out[1] == 2);
        ferry_dataset_close(ds);
    }
    /* an entry naming a tensor its shard does not hold */
    idx = "{\"weight_map\":{\"a\":\"model-00002-of-00002.safetensors\",\"b\":\"model-00002-of-00002.safetensors\"}}";
    write_file(p, idx, strlen(idx));
    expect_open_error(p, NULL, FERRY_EFORMAT, "is not in");
    idx = "{\"weight_map\":{\"a\":\"../etc/passwd\"}}";
    write_file(p, idx, strlen(idx));
    expect_open_error(p, NULL, FERRY_EFORMAT, "relative file name");
    idx = "{\"weight_map\":{\"a\":\"missing.safetensors\"}}";
    write_file(p, idx, strlen(idx));
    ferry_dataset *d2 = NULL;
    CHECK(ferry_dataset_open(ctx, p, NULL, &d2) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "missing.safetensors");
    idx = "{\"metadata\":{}}";
    write_file(p, idx, strlen(idx));
    expect_open_error(p, NULL, FERRY_EFORMAT, "weight_map");
    /* the same tensor in two shards */
    n = make_st(file, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", a, 8);
    write_file(tpath("dup.safetensors"), file, n);
    idx = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"dup.safetensors\"}}";
    write_file(p, idx, strlen(idx));
    expect_open_error(p, NULL, FERRY_EFORMAT, NULL);
}

/* a shard that is a symlink resolving outside the index's directory is refused
 * (the rule Zarr stores follow, inside.h); one that stays inside is followed */
static void test_index_shard_links(void) {
    float a[2] = {6, 7};
    size_t n = make_st(file, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", a, 8);
    char m[600], sub[600], link[700], target[700];
    snprintf(m, sizeof m, "%s/links", dir);
    snprintf(sub, sizeof sub, "%s/links/real", dir);
    CHECK(mkdir(m, 0755) == 0 && mkdir(sub, 0755) == 0);
    write_file(tpath("outside.safetensors"), file, n);
    write_file(tpath("links/real/in.safetensors"), file, n);
    snprintf(link, sizeof link, "%s/links/out.safetensors", dir);
    CHECK(symlink("../outside.safetensors", link) == 0);
    snprintf(link, sizeof link, "%s/links/in.safetensors", dir);
    CHECK(symlink("real/in.safetensors", link) == 0);
    const char *p = tpath("links/model.safetensors.index.json");
    const char *idx = "{\"weight_map\":{\"a\":\"in.safetensors\"}}";
    write_file(p, idx, strlen(idx));
    ferry_dataset *ds = NULL;
    CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
    if (ds) {
        float out[2] = {0, 0};
        CHECK_EQ_I(read_var(ds, 0, NULL, out, 8), 8);
        CHECK(out[0] == 6 && out[1] == 7);
        ferry_dataset_close(ds);
    }
    idx = "{\"weight_map\":{\"a\":\"out.safetensors\"}}";
    write_file(p, idx, strlen(idx));
    snprintf(target, sizeof target, "outside the directory");
    expect_open_error(p, NULL, -EACCES, target);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "out.safetensors");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "a symlink leading out is refused");
}

/* ferry's sharded saves stamp index and shards with one save id: shards of
 * another save than the index are refused with -ESTALE; sets without ids open */
static void test_index_save_ids(void) {
    float a[2] = {1, 2};
    size_t n = make_st(file, "{\"__metadata__\":{\"ferry.save\":\"s2\"},"
                             "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", a, 8);
    write_file(tpath("ids-00001-of-00001.safetensors"), file, n);
    const char *p = tpath("ids.safetensors.index.json");
    const char *idx = "{\"metadata\":{\"ferry.save\":\"s1\"},\"weight_map\":{\"a\":\"ids-00001-of-00001.safetensors\"}}";
    write_file(p, idx, strlen(idx));
    expect_open_error(p, NULL, -ESTALE, "belongs to save s2, the index to save s1");
    idx = "{\"weight_map\":{\"a\":\"ids-00001-of-00001.safetensors\"}}";   /* index without an id */
    write_file(p, idx, strlen(idx));
    expect_open_error(p, NULL, -ESTALE, "the index to save (none)");
    idx = "{\"metadata\":{\"ferry.save\":\"s2\"},\"weight_map\":{\"a\":\"ids-00001-of-00001.safetensors\"}}";
    write_file(p, idx, strlen(idx));
    ferry_dataset *ds = NULL;
    CHECK_EQ_I(ferry_dataset_open(ctx, p, NULL, &ds), 0);
    ferry_dataset_close(ds);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/ferry_test_st_XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.no_env = 1;
    if (ferry_ctx_create(&ctx, &cfg)) { fprintf(stderr, "ctx\n"); return 1; }
    RUN(test_good_file);
    RUN(test_all_dtypes);
    RUN(test_hostile_headers);
    RUN(test_header_length);
    RUN(test_every_truncation);
    RUN(test_index_shards);
    RUN(test_index_shard_links);
    RUN(test_index_save_ids);
    ferry_ctx_destroy(ctx);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    return check_summary();
}
