/* test_zarr.c — Zarr arrays ferry cannot read (dtypes, codecs, filters, chunk
 * grids, key encodings, nested sharding it lacks), from metadata written by
 * hand: they open, are described as far as their metadata goes (shape,
 * chunks, dimension names, attributes, fill value, dtype as written), carry
 * the reason in ferry_var_info.error, and every read of them fails with it,
 * while malformed metadata still fails the open. (Stores written by
 * zarr-python are checked in tests/python/test_zarr.py.) */
#include "check.h"
#include "formats_check.h"
#include "ferry.h"
#include <stdlib.h>
#include <sys/stat.h>
#include <errno.h>
#include <unistd.h>

static ferry_ctx *ctx;

static void put(const char *rel, const char *text) { write_file(tpath(rel), text, strlen(text)); }
static void mk(const char *rel) { mkdir(tpath(rel), 0755); }

static ferry_dataset *open_ok(const char *rel) {
    ferry_dataset *ds = NULL;
    int rc = ferry_dataset_open(ctx, tpath(rel), NULL, &ds);
    CHECK_EQ_I(rc, 0);
    if (rc) fprintf(stderr, "    %s\n", ferry_errmsg(ctx));
    return rc ? NULL : ds;
}

static int find(ferry_dataset *ds, const char *name, ferry_var_info *vi) {
    int i = ferry_dataset_find(ds, name);
    CHECK(i >= 0);
    if (i < 0) return -1;
    CHECK_EQ_I(ferry_dataset_var(ds, i, vi), 0);
    return i;
}

/* Reading var fails with FERRY_EUNSUPPORTED and the variable's own message
 * (which names `needle`) — the whole array and an empty selection alike. */
static void expect_unreadable(ferry_dataset *ds, int var, const char *needle) {
    ferry_var_info vi;
    CHECK_EQ_I(ferry_dataset_var(ds, var, &vi), 0);
    CHECK(vi.error != NULL);
    if (!vi.error) return;
    CHECK_STR_CONTAINS(vi.error, needle);
    static uint8_t buf[4096];
    CHECK_EQ_I(fc_read(ctx, ds, var, NULL, buf, sizeof buf, FERRY_NATIVE), FERRY_EUNSUPPORTED);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), needle);
    CHECK(!strcmp(ferry_errmsg(ctx), vi.error));
    ferry_slice none[FERRY_MAX_DIMS];
    for (int k = 0; k < FERRY_MAX_DIMS; k++) none[k] = (ferry_slice){0, 0, 1};
    CHECK_EQ_I(fc_read(ctx, ds, var, none, buf, sizeof buf, 0), FERRY_EUNSUPPORTED);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), needle);
}

#define V3_HEAD "{\"zarr_format\": 3, \"node_type\": \"array\", "
#define V3_GRID(c) "\"chunk_grid\": {\"name\": \"regular\", \"configuration\": {\"chunk_shape\": " c "}}, "
#define V3_KEYS "\"chunk_key_encoding\": {\"name\": \"default\", \"configuration\": {\"separator\": \"/\"}}, "

static void test_v3_unknown_codec_keeps_the_description(void) {
    mk("d.zarr");
    put("d.zarr/zarr.json",
        V3_HEAD "\"shape\": [6, 4], \"data_type\": \"int32\", " V3_GRID("[3, 4]") V3_KEYS
        "\"fill_value\": -1, \"codecs\": [{\"name\": \"numcodecs.delta\", \"configuration\": {\"dtype\": \"<i4\"}}, "
        "{\"name\": \"bytes\", \"configuration\": {\"endian\": \"little\"}}, {\"name\": \"zstd\"}], "
        "\"attributes\": {\"units\": \"m\"}, \"dimension_names\": [\"x\", \"y\"]}");
    ferry_dataset *ds = open_ok("d.zarr");   /* a lone array opens too */
    if (!ds) return;
    ferry_var_info vi;
    CHECK_EQ_I(ferry_dataset_var(ds, 0, &vi), 0);
    CHECK(!strcmp(vi.typestr, "<i4"));
    CHECK_EQ_I(vi.dtype, FERRY_DT_I32);
    CHECK_EQ_I(vi.itemsize, 4);
    CHECK_EQ_I(vi.ndim, 2);
    CHECK_EQ_I(vi.shape[0], 6);
    CHECK_EQ_I(vi.shape[1], 4);
    CHECK_EQ_I(vi.chunks[0], 3);
    CHECK_EQ_I(vi.chunks[1], 4);
    CHECK(!strcmp(vi.dims_json, "[\"x\",\"y\"]"));
    CHECK_STR_CONTAINS(vi.attrs_json, "\"units\":\"m\"");
    CHECK(!strcmp(vi.fill_json, "-1"));
    CHECK(!strcmp(vi.codecs, "numcodecs.delta bytes zstd"));
    CHECK_STR_CONTAINS(ferry_dataset_dims_json(ds), "\"x\":{\"size\":6");
    CHECK_STR_CONTAINS(ferry_dataset_dims_json(ds), "\"y\":{\"size\":4");
    CHECK(vi.error != NULL);
    if (vi.error) {
        CHECK_STR_CONTAINS(vi.error, tpath("d.zarr/zarr.json"));
        CHECK_STR_CONTAINS(vi.error, ": byte ");
    }
    expect_unreadable(ds, 0, "codec \"numcodecs.delta\" is not supported");
    ferry_dataset_close(ds);

    /* after the array->bytes codec, big-endian: the typestr keeps the order */
    mk("b.zarr");
    put("b.zarr/zarr.json",
        V3_HEAD "\"shape\": [5], \"data_type\": \"float64\", " V3_GRID("[5]") V3_KEYS
        "\"fill_value\": \"NaN\", \"codecs\": [{\"name\": \"bytes\", \"configuration\": {\"endian\": \"big\"}}, "
        "{\"name\": \"bitround\"}], \"dimension_names\": [\"t\"]}");
    if (!(ds = open_ok("b.zarr"))) return;
    CHECK_EQ_I(ferry_dataset_var(ds, 0, &vi), 0);
    CHECK(!strcmp(vi.typestr, ">f8"));
    CHECK_EQ_I(vi.dtype, FERRY_DT_F64);
    CHECK(!strcmp(vi.fill_json, "\"NaN\""));
    CHECK(!strcmp(vi.codecs, "bytes bitround"));
    expect_unreadable(ds, 0, "codec \"bitround\" is not supported");
    ferry_dataset_close(ds);
}

static void test_v3_unknown_dtype_as_written(void) {
    mk("s.zarr");
    put("s.zarr/zarr.json",
        V3_HEAD "\"shape\": [6], "
        "\"data_type\": {\"name\": \"fixed_length_utf32\", \"configuration\": {\"length_bytes\": 16}}, "
        V3_GRID("[3]") V3_KEYS "\"fill_value\": \"\", \"codecs\": [{\"name\": \"bytes\"}, {\"name\": \"zstd\"}], "
        "\"attributes\": {\"a\": 1}, \"dimension_names\": [\"z\"]}");
    ferry_dataset *ds = open_ok("s.zarr");
    if (!ds) return;
    ferry_var_info vi;
    CHECK_EQ_I(ferry_dataset_var(ds, 0, &vi), 0);
    CHECK(!strcmp(vi.typestr, "{\"name\":\"fixed_length_utf32\",\"configuration\":{\"length_bytes\":16}}"));
    CHECK_EQ_I(vi.dtype, FERRY_DT_OTHER);
    CHECK_EQ_I(vi.itemsize, 1);
    CHECK_EQ_I(vi.shape[0], 6);
    CHECK_EQ_I(vi.chunks[0], 3);
    CHECK(!strcmp(vi.dims_json, "[\"z\"]"));
    CHECK(!strcmp(vi.attrs_json, "{\"a\":1}"));
    CHECK(!strcmp(vi.fill_json, "\"\""));
    CHECK(!strcmp(vi.codecs, "bytes zstd"));
    expect_unreadable(ds, 0, "data_type \"fixed_length_utf32\" is not supported");
    ferry_dataset_close(ds);

    /* variable-length strings: an unknown type and its array->bytes codec */
    mk("v.zarr");
    put("v.zarr/zarr.json",
        V3_HEAD "\"shape\": [3], \"data_type\": \"string\", " V3_GRID("[3]") V3_KEYS
        "\"fill_value\": \"\", \"codecs\": [{\"name\": \"vlen-utf8\"}, {\"name\": \"zstd\"}], "
        "\"dimension_names\": [\"n\"]}");
    if (!(ds = open_ok("v.zarr"))) return;
    CHECK_EQ_I(ferry_dataset_var(ds, 0, &vi), 0);
    CHECK(!strcmp(vi.typestr, "string"));
    CHECK(!strcmp(vi.codecs, "vlen-utf8 zstd"));
    CHECK(!strcmp(vi.dims_json, "[\"n\"]"));
    expect_unreadable(ds, 0, "data_type \"string\" is not supported");   /* the first reason found */
    ferry_dataset_close(ds);
}

static void test_v3_group_grids_keys_sharding(void) {
    mk("g.zarr");
    put("g.zarr/zarr.json", "{\"zarr_format\": 3, \"node_type\": \"group\", \"attributes\": {\"title\": \"t\"}}");
    mk("g.zarr/grid");
    put("g.zarr/grid/zarr.json",
        V3_HEAD "\"shape\": [10, 3], \"data_type\": \"float32\", "
        "\"chunk_grid\": {\"name\": \"rectilinear\", \"configuration\": {\"chunk_shapes\": [[4, 6], [3]]}}, " V3_KEYS
        "\"fill_value\": 0.5, \"codecs\": [{\"name\": \"bytes\"}], \"dimension_names\": [\"row\", \"col\"], "
        "\"attributes\": {\"k\": \"grid\"}}");
    mk("g.zarr/keys");
    put("g.zarr/keys/zarr.json",
        V3_HEAD "\"shape\": [8], \"data_type\": \"uint16\", " V3_GRID("[2]")
        "\"chunk_key_encoding\": {\"name\": \"hashed\", \"configuration\": {\"levels\": 2}}, "
        "\"fill_value\": 3, \"codecs\": [{\"name\": \"bytes\"}], \"dimension_names\": [\"k\"]}");
    mk("g.zarr/nested");
    put("g.zarr/nested/zarr.json",
        V3_HEAD "\"shape\": [16], \"data_type\": \"int8\", " V3_GRID("[8]") V3_KEYS
        "\"fill_value\": 0, \"codecs\": [{\"name\": \"sharding_indexed\", \"configuration\": {\"chunk_shape\": [4], "
        "\"codecs\": [{\"name\": \"sharding_indexed\", \"configuration\": {\"chunk_shape\": [2], "
        "\"codecs\": [{\"name\": \"bytes\"}], \"index_codecs\": [{\"name\": \"bytes\"}]}}], "
        "\"index_codecs\": [{\"name\": \"bytes\"}, {\"name\": \"crc32c\"}]}}], \"dimension_names\": [\"s\"]}");
    mk("g.zarr/st");
    put("g.zarr/st/zarr.json",
        V3_HEAD "\"shape\": [4], \"data_type\": \"int64\", " V3_GRID("[4]") V3_KEYS
        "\"fill_value\": 0, \"codecs\": [{\"name\": \"bytes\"}], \"storage_transformers\": [{\"name\": \"x\"}], "
        "\"dimension_names\": [\"q\"]}");
    mk("g.zarr/good");
    put("g.zarr/good/zarr.json",
        V3_HEAD "\"shape\": [4], \"data_type\": \"float32\", " V3_GRID("[2]") V3_KEYS
        "\"fill_value\": 2.5, \"codecs\": [{\"name\": \"bytes\"}], \"dimension_names\": [\"k\"]}");
    ferry_dataset *ds = open_ok("g.zarr");
    if (!ds) return;
    CHECK_EQ_I(ferry_dataset_nvars(ds), 5);
    ferry_var_info vi;
    int i = find(ds, "grid", &vi);
    if (i >= 0) {
        CHECK_EQ_I(vi.chunks[0], 10);   /* one chunk: the shape */
        CHECK_EQ_I(vi.chunks[1], 3);
        CHECK(!strcmp(vi.typestr, "<f4"));
        CHECK(!strcmp(vi.fill_json, "0.5"));
        CHECK(!strcmp(vi.attrs_json, "{\"k\":\"grid\"}"));
        expect_unreadable(ds, i, "chunk grid \"rectilinear\" is not supported");
    }
    if ((i = find(ds, "keys", &vi)) >= 0) {
        CHECK_EQ_I(vi.chunks[0], 2);
        CHECK(!strcmp(vi.typestr, "<u2"));
        CHECK(!strcmp(vi.dims_json, "[\"k\"]"));
        expect_unreadable(ds, i, "chunk_key_encoding \"hashed\" is not supported");
    }
    if ((i = find(ds, "nested", &vi)) >= 0) {
        CHECK_EQ_I(vi.chunks[0], 8);
        CHECK(!strcmp(vi.typestr, "|i1"));
        CHECK(!strcmp(vi.codecs, "sharding_indexed[sharding_indexed]"));
        expect_unreadable(ds, i, "nested sharding is not supported");
    }
    if ((i = find(ds, "st", &vi)) >= 0) {
        CHECK(!strcmp(vi.dims_json, "[\"q\"]"));
        expect_unreadable(ds, i, "storage transformers are not supported");
    }
    /* every array's dimension names count, unreadable or not */
    const char *dims = ferry_dataset_dims_json(ds);
    CHECK_STR_CONTAINS(dims, "\"row\":{\"size\":10");
    CHECK_STR_CONTAINS(dims, "\"col\"");
    CHECK_STR_CONTAINS(dims, "\"s\":{\"size\":16");
    CHECK_STR_CONTAINS(dims, "\"q\"");
    CHECK_STR_CONTAINS(ferry_dataset_attrs_json(ds), "\"title\"");
    /* the neighbour stays readable (its chunks are missing: fills) */
    if ((i = find(ds, "good", &vi)) >= 0) {
        CHECK(vi.error == NULL);
        float got[4] = {0};
        CHECK_EQ_I(fc_read(ctx, ds, i, NULL, got, sizeof got, FERRY_NATIVE), (int64_t)sizeof got);
        for (int k = 0; k < 4; k++) CHECK(got[k] == 2.5f);
    }
    ferry_dataset_close(ds);
}

#define DELTA_ZARRAY \
    "{\"zarr_format\": 2, \"shape\": [30, 4], \"chunks\": [10, 4], \"dtype\": \"<i4\", \"fill_value\": 7, " \
    "\"order\": \"C\", \"filters\": [{\"id\": \"delta\", \"dtype\": \"<i4\"}], \"compressor\": {\"id\": \"zlib\", \"level\": 1}}"
#define DELTA_ZATTRS "{\"_ARRAY_DIMENSIONS\": [\"x\", \"y\"], \"units\": \"m\"}"
#define OBJ_ZARRAY \
    "{\"zarr_format\": 2, \"shape\": [3], \"chunks\": [3], \"dtype\": \"|O\", \"fill_value\": 0, \"order\": \"C\", " \
    "\"filters\": [{\"id\": \"vlen-utf8\"}], \"compressor\": null}"
#define REC_ZARRAY \
    "{\"zarr_format\": 2, \"shape\": [5], \"chunks\": [5], \"dtype\": [[\"a\", \"<i4\"], [\"b\", \"<f8\"]], " \
    "\"fill_value\": \"AAAAAAAAAAAAAAAA\", \"order\": \"C\", \"filters\": null, \"compressor\": null}"
#define SNAPPY_ZARRAY \
    "{\"zarr_format\": 2, \"shape\": [100], \"chunks\": [50], \"dtype\": \">f8\", \"fill_value\": \"NaN\", \"order\": \"F\", " \
    "\"filters\": null, \"compressor\": {\"id\": \"blosc\", \"cname\": \"snappy\", \"clevel\": 5, \"shuffle\": 1}}"

static void check_v2_group(ferry_dataset *ds, const char *meta_file) {
    CHECK_EQ_I(ferry_dataset_nvars(ds), 4);
    ferry_var_info vi;
    int i = find(ds, "delta", &vi);
    if (i >= 0) {
        CHECK(!strcmp(vi.typestr, "<i4"));
        CHECK_EQ_I(vi.dtype, FERRY_DT_I32);
        CHECK_EQ_I(vi.chunks[0], 10);
        CHECK(!strcmp(vi.dims_json, "[\"x\",\"y\"]"));
        CHECK_STR_CONTAINS(vi.attrs_json, "\"units\":\"m\"");
        CHECK(!strcmp(vi.fill_json, "7"));
        CHECK(!strcmp(vi.codecs, "delta zlib"));
        expect_unreadable(ds, i, "filter \"delta\" is not supported");
        CHECK_STR_CONTAINS(vi.error, meta_file);
        CHECK_STR_CONTAINS(vi.error, ": byte ");
    }
    if ((i = find(ds, "obj", &vi)) >= 0) {
        CHECK(!strcmp(vi.typestr, "|O"));
        CHECK_EQ_I(vi.dtype, FERRY_DT_OTHER);
        CHECK(!strcmp(vi.dims_json, "[\"n\"]"));
        CHECK(!strcmp(vi.fill_json, "0"));
        expect_unreadable(ds, i, "dtype \"|O\" is not supported");
    }
    if ((i = find(ds, "rec", &vi)) >= 0) {
        CHECK(!strcmp(vi.typestr, "[[\"a\",\"<i4\"],[\"b\",\"<f8\"]]"));
        CHECK(!strcmp(vi.dims_json, "[\"r\"]"));
        CHECK(!strcmp(vi.fill_json, "\"AAAAAAAAAAAAAAAA\""));
        expect_unreadable(ds, i, "structured dtype");
    }
    if ((i = find(ds, "snappy", &vi)) >= 0) {
        CHECK(!strcmp(vi.typestr, ">f8"));
        CHECK_EQ_I(vi.fortran_order, 1);
        CHECK(!strcmp(vi.fill_json, "\"NaN\""));
        CHECK(!strcmp(vi.codecs, "blosc(snappy,shuffle)"));
        expect_unreadable(ds, i, "snappy is not supported");
    }
    const char *dims = ferry_dataset_dims_json(ds);
    CHECK_STR_CONTAINS(dims, "\"x\":{\"size\":30");
    CHECK_STR_CONTAINS(dims, "\"n\":{\"size\":3");
    CHECK_STR_CONTAINS(dims, "\"r\":{\"size\":5");
    CHECK_STR_CONTAINS(dims, "\"p\":{\"size\":100");
}

static void test_v2_unsupported_dtypes_filters_compressors(void) {
    mk("g2.zarr");
    put("g2.zarr/.zgroup", "{\"zarr_format\": 2}");
    const char *names[] = {"delta", "obj", "rec", "snappy"};
    const char *zarrays[] = {DELTA_ZARRAY, OBJ_ZARRAY, REC_ZARRAY, SNAPPY_ZARRAY};
    const char *zattrs[] = {DELTA_ZATTRS, "{\"_ARRAY_DIMENSIONS\": [\"n\"]}", "{\"_ARRAY_DIMENSIONS\": [\"r\"]}",
                            "{\"_ARRAY_DIMENSIONS\": [\"p\"]}"};
    char rel[64];
    for (int k = 0; k < 4; k++) {
        snprintf(rel, sizeof rel, "g2.zarr/%s", names[k]);
        mk(rel);
        snprintf(rel, sizeof rel, "g2.zarr/%s/.zarray", names[k]);
        put(rel, zarrays[k]);
        snprintf(rel, sizeof rel, "g2.zarr/%s/.zattrs", names[k]);
        put(rel, zattrs[k]);
    }
    ferry_dataset *ds = open_ok("g2.zarr");
    if (ds) { check_v2_group(ds, tpath("g2.zarr/delta/.zarray")); ferry_dataset_close(ds); }
    /* the same from consolidated metadata: the positions are in .zmetadata */
    put("g2.zarr/.zmetadata",
        "{\"zarr_consolidated_format\": 1, \"metadata\": {\".zgroup\": {\"zarr_format\": 2}, "
        "\"delta/.zarray\": " DELTA_ZARRAY ", \"delta/.zattrs\": " DELTA_ZATTRS ", "
        "\"obj/.zarray\": " OBJ_ZARRAY ", \"obj/.zattrs\": {\"_ARRAY_DIMENSIONS\": [\"n\"]}, "
        "\"rec/.zarray\": " REC_ZARRAY ", \"rec/.zattrs\": {\"_ARRAY_DIMENSIONS\": [\"r\"]}, "
        "\"snappy/.zarray\": " SNAPPY_ZARRAY ", \"snappy/.zattrs\": {\"_ARRAY_DIMENSIONS\": [\"p\"]}}}");
    ds = open_ok("g2.zarr");
    if (ds) { check_v2_group(ds, tpath("g2.zarr/.zmetadata")); ferry_dataset_close(ds); }
    /* a lone v2 array opens as well */
    ds = open_ok("g2.zarr/delta");
    if (ds) {
        ferry_var_info vi;
        CHECK_EQ_I(ferry_dataset_var(ds, 0, &vi), 0);
        CHECK(!strcmp(vi.dims_json, "[\"x\",\"y\"]"));
        expect_unreadable(ds, 0, "filter \"delta\"");
        ferry_dataset_close(ds);
    }
}

static void test_malformed_metadata_still_fails(void) {
    mk("m1.zarr");   /* a malformed shape beside an unknown codec */
    put("m1.zarr/zarr.json",
        V3_HEAD "\"shape\": [6, \"x\"], \"data_type\": \"int32\", " V3_GRID("[3, 4]") V3_KEYS
        "\"fill_value\": 0, \"codecs\": [{\"name\": \"numcodecs.delta\"}, {\"name\": \"bytes\"}]}");
    fc_expect_open_error(ctx, tpath("m1.zarr"), NULL, FERRY_EFORMAT, "shape[1]");
    mk("m2.zarr");   /* an empty codec list */
    put("m2.zarr/zarr.json",
        V3_HEAD "\"shape\": [6], \"data_type\": \"int32\", " V3_GRID("[3]") V3_KEYS "\"fill_value\": 0, \"codecs\": []}");
    fc_expect_open_error(ctx, tpath("m2.zarr"), NULL, FERRY_EFORMAT, "codecs must be a non-empty array");
    mk("m3.zarr");   /* a fill that does not suit a known dtype */
    put("m3.zarr/.zarray",
        "{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [2], \"dtype\": \"<i4\", \"fill_value\": \"abc\", "
        "\"order\": \"C\", \"filters\": null, \"compressor\": null}");
    fc_expect_open_error(ctx, tpath("m3.zarr"), NULL, FERRY_EFORMAT, "fill_value does not suit dtype <i4");
    mk("m4.zarr");   /* malformed in a group: the whole open fails, as before */
    put("m4.zarr/.zgroup", "{\"zarr_format\": 2}");
    mk("m4.zarr/a");
    put("m4.zarr/a/.zarray",
        "{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [2], \"dtype\": \"<i4\", \"fill_value\": 0, "
        "\"order\": \"X\", \"filters\": [{\"id\": \"delta\"}], \"compressor\": null}");
    fc_expect_open_error(ctx, tpath("m4.zarr"), NULL, FERRY_EFORMAT, "order must be");
}

/* Every key a store names stays inside it (issue 16.1): consolidated keys of
 * both versions, the group option, member directories and chunk files that
 * are symlinks leading out. A secret outside the store must never be read. */
#define V2_ARR "{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [4], \"dtype\": \"|u1\", \"fill_value\": 0, " \
               "\"order\": \"C\", \"filters\": null, \"compressor\": null}"
#define V3_ARR V3_HEAD "\"shape\": [4], \"data_type\": \"uint8\", " V3_GRID("[4]") V3_KEYS \
               "\"fill_value\": 0, \"codecs\": [{\"name\": \"bytes\"}]}"

static void test_keys_stay_inside_the_store(void) {
    mk("out"); mk("out/c");
    put("out/c/0", "SECR");   /* what ".." as an array would read */
    put("out/0", "SECR");
    mk("out/t.zarr");
    put("out/t.zarr/zarr.json",
        "{\"zarr_format\": 3, \"node_type\": \"group\", \"consolidated_metadata\": {\"kind\": \"inline\", "
        "\"must_understand\": false, \"metadata\": {\"..\": " V3_ARR "}}}");
    fc_expect_open_error(ctx, tpath("out/t.zarr"), NULL, FERRY_EFORMAT, "key \"..\" is not a relative path");
    const char *bad[] = {"/abs", ".", "a/../..", "a//b", "a/"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char doc[1024];
        snprintf(doc, sizeof doc,
                 "{\"zarr_format\": 3, \"node_type\": \"group\", \"consolidated_metadata\": {\"kind\": \"inline\", "
                 "\"must_understand\": false, \"metadata\": {\"%s\": %s}}}", bad[i], V3_ARR);
        put("out/t.zarr/zarr.json", doc);
        fc_expect_open_error(ctx, tpath("out/t.zarr"), NULL, FERRY_EFORMAT, "is not a relative path");
    }
    mk("out/u.zarr");
    put("out/u.zarr/.zgroup", "{\"zarr_format\": 2}");
    put("out/u.zarr/.zmetadata", "{\"zarr_consolidated_format\": 1, \"metadata\": {\".zgroup\": {\"zarr_format\": 2}, "
                                  "\"../.zarray\": " V2_ARR "}}");
    fc_expect_open_error(ctx, tpath("out/u.zarr"), NULL, FERRY_EFORMAT, ".zmetadata key \"../.zarray\"");
    /* the group option */
    ferry_open_opts o = {0};
    o.group = "../out";
    ferry_dataset *ds = NULL;
    CHECK_EQ_I(ferry_dataset_open(ctx, tpath("out/u.zarr"), &o, &ds), FERRY_EINVAL);
    o.group = "./a";
    CHECK_EQ_I(ferry_dataset_open(ctx, tpath("out/u.zarr"), &o, &ds), FERRY_EINVAL);
    /* a member directory that is a symlink leading out */
    mk("out/w"); put("out/w/.zarray", V2_ARR); put("out/w/0", "SECR");
    mk("out/s.zarr");
    put("out/s.zarr/.zgroup", "{\"zarr_format\": 2}");
    if (symlink(tpath("out/w"), tpath("out/s.zarr/a")) == 0)
        fc_expect_open_error(ctx, tpath("out/s.zarr"), NULL, -EACCES, "outside the store");
    /* a chunk that is a symlink leading out: refused at read time */
    mk("out/k.zarr");
    put("out/k.zarr/.zarray", V2_ARR);
    if (symlink(tpath("out/0"), tpath("out/k.zarr/0")) == 0) {
        ds = open_ok("out/k.zarr");
        if (ds) {
            uint8_t buf[4] = {0};
            CHECK(fc_read(ctx, ds, 0, NULL, buf, 4, 0) < 0);
            CHECK_STR_CONTAINS(ferry_errmsg(ctx), "outside the store");
            CHECK(memcmp(buf, "SECR", 4) != 0);
            ferry_dataset_close(ds);
        }
    }
    /* a symlink that stays inside is followed */
    mk("out/i.zarr"); mk("out/i.zarr/data");
    put("out/i.zarr/.zarray", V2_ARR);
    put("out/i.zarr/data/zero", "ABCD");
    if (symlink("data/zero", tpath("out/i.zarr/0")) == 0) {
        ds = open_ok("out/i.zarr");
        if (ds) {
            uint8_t buf[4] = {0};
            CHECK_EQ_I(fc_read(ctx, ds, 0, NULL, buf, 4, 0), 4);
            CHECK(!memcmp(buf, "ABCD", 4));
            ferry_dataset_close(ds);
        }
    }
}

/* Uncompressed chunks are planned without a stat (FERRY_CHUNK_UNSIZED); the
 * engine opens them with O_NOFOLLOW under the store's root. A chunk replaced
 * by a symlink leading out between plan and run is refused naming the file;
 * a FIFO chunk is refused without blocking; a dangling link reads as absent. */
static void test_chunk_files_opened_without_following(void) {
    mk("out");
    put("out/0", "SECR");
    mk("nf1.zarr");
    put("nf1.zarr/.zarray", V2_ARR);
    put("nf1.zarr/0", "ABCD");
    ferry_dataset *ds = open_ok("nf1.zarr");
    if (ds) {
        uint8_t buf[4] = {0};
        ferry_plan *p;
        ferry_plan_create(&p);
        CHECK_EQ_I(ferry_dataset_plan_read(ds, 0, NULL, ferry_host_buf(buf, 4), 0, p), 4);
        unlink(tpath("nf1.zarr/0"));
        CHECK(symlink(tpath("out/0"), tpath("nf1.zarr/0")) == 0);
        CHECK(ferry_run(ctx, p, NULL) < 0);
        CHECK_STR_CONTAINS(ferry_errmsg(ctx), "outside the store");
        CHECK_STR_CONTAINS(ferry_errmsg(ctx), "nf1.zarr/0");
        CHECK(memcmp(buf, "SECR", 4) != 0);
        ferry_plan_destroy(p);
        ferry_dataset_close(ds);
    }
    mk("nf2.zarr");
    put("nf2.zarr/.zarray", V2_ARR);
    if (mkfifo(tpath("nf2.zarr/0"), 0644) == 0 && (ds = open_ok("nf2.zarr"))) {
        uint8_t buf[4] = {0};
        CHECK_EQ_I(fc_read(ctx, ds, 0, NULL, buf, 4, 0), FERRY_EINVAL);
        CHECK_STR_CONTAINS(ferry_errmsg(ctx), "not a regular file");
        CHECK_STR_CONTAINS(ferry_errmsg(ctx), "nf2.zarr/0");
        ferry_dataset_close(ds);
    }
    mk("nf3.zarr");
    put("nf3.zarr/.zarray", V2_ARR);
    if (symlink("nothere", tpath("nf3.zarr/0")) == 0 && (ds = open_ok("nf3.zarr"))) {
        uint8_t buf[4] = {1, 1, 1, 1};
        CHECK_EQ_I(fc_read(ctx, ds, 0, NULL, buf, 4, 0), 4);
        CHECK(!memcmp(buf, "\0\0\0\0", 4));
        ferry_dataset_close(ds);
    }
}

/* "Once per plan" is the plan, across calls (zarr.c's plan memo): a batch's
 * reads of one array resolve its directory once. The promise stays per plan:
 * after ferry_plan_clear, and for another store planned into the same plan,
 * a chunk directory that became (or is) a symlink leading out is refused. */
static void test_plan_memo_is_per_plan(void) {
    mk("pmo"); mk("pmo/c");
    put("pmo/c/0", "SECR");
    mk("pm1.zarr"); mk("pm1.zarr/c");
    put("pm1.zarr/zarr.json", V3_ARR);
    put("pm1.zarr/c/0", "ABCD");
    mk("pm2.zarr");
    put("pm2.zarr/zarr.json", V3_ARR);
    if (symlink(tpath("pmo/c"), tpath("pm2.zarr/c")) != 0) return;
    ferry_dataset *ds = open_ok("pm1.zarr"), *ds2 = open_ok("pm2.zarr");
    if (!ds || !ds2) return;
    uint8_t buf[4][4];
    memset(buf, 0, sizeof buf);
    ferry_plan *p;
    ferry_plan_create(&p);
    CHECK_EQ_I(ferry_dataset_plan_read(ds, 0, NULL, ferry_host_buf(buf[0], 4), 0, p), 4);
    CHECK_EQ_I(ferry_dataset_plan_read(ds, 0, NULL, ferry_host_buf(buf[1], 4), 0, p), 4);   /* from the memo */
    /* another store into the same plan: its own check */
    CHECK(ferry_dataset_plan_read(ds2, 0, NULL, ferry_host_buf(buf[2], 4), 0, p) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "outside the store");
    CHECK(ferry_run(ctx, p, NULL) >= 0);
    CHECK(!memcmp(buf[0], "ABCD", 4) && !memcmp(buf[1], "ABCD", 4));
    CHECK(memcmp(buf[2], "SECR", 4) != 0);
    /* the chunk directory swapped for a link out: a cleared plan checks again */
    CHECK(rename(tpath("pm1.zarr/c"), tpath("pm1.zarr/c.old")) == 0);
    CHECK(symlink(tpath("pmo/c"), tpath("pm1.zarr/c")) == 0);
    ferry_plan_clear(p);
    CHECK(ferry_dataset_plan_read(ds, 0, NULL, ferry_host_buf(buf[3], 4), 0, p) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "outside the store");
    CHECK(ferry_run(ctx, p, NULL) >= 0);
    CHECK(memcmp(buf[3], "SECR", 4) != 0);
    ferry_plan_destroy(p);
    ferry_dataset_close(ds);
    ferry_dataset_close(ds2);
}

/* Required keys are required (issue 16.4): a v2 array without fill_value, a
 * v3 member whose node_type is damaged. */
static void test_required_keys(void) {
    mk("r1.zarr");
    put("r1.zarr/.zarray", "{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [4], \"dtype\": \"|u1\", "
                           "\"order\": \"C\", \"filters\": null, \"compressor\": null}");
    fc_expect_open_error(ctx, tpath("r1.zarr"), NULL, FERRY_EFORMAT, "no fill_value");
    mk("r2.zarr"); mk("r2.zarr/a");
    put("r2.zarr/zarr.json", "{\"zarr_format\": 3, \"node_type\": \"group\"}");
    put("r2.zarr/a/zarr.json", "{\"zarr_format\": 3, \"node_type\": \"arrax\", \"shape\": [4]}");
    fc_expect_open_error(ctx, tpath("r2.zarr"), NULL, FERRY_EFORMAT, "node_type must be");
}

/* A v2 array's "compressor" is required (null: uncompressed): a key that lost
 * a byte ("cmpressor") would read a blosc frame's bytes as values. Issue 36.1. */
static void test_v2_compressor_key_required(void) {
    mk("k.zarr");
    put("k.zarr/.zarray", "{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [4], \"dtype\": \"|u1\", "
                          "\"fill_value\": 0, \"order\": \"C\", \"filters\": null, "
                          "\"cmpressor\": {\"id\": \"blosc\", \"cname\": \"lz4\", \"clevel\": 5, \"shuffle\": 1}}");
    fc_expect_open_error(ctx, tpath("k.zarr"), NULL, FERRY_EFORMAT, "no \"compressor\" key");
    fc_expect_open_error(ctx, tpath("k.zarr"), NULL, FERRY_EFORMAT, "k.zarr/.zarray");
}

/* An uncompressed chunk file is exactly a chunk's bytes (zarr-python refuses a
 * shorter and a longer one alike): the read fails naming the chunk file, even
 * when the selection needs only the chunk's first bytes. Issue 36.1. */
static void test_raw_chunk_size_checked(void) {
    static const char *const v[2][2] = {
        {"s2.zarr", "s2.zarr/.zarray"}, {"s3.zarr", "s3.zarr/zarr.json"}};
    for (int fmt = 0; fmt < 2; fmt++) {
        mk(v[fmt][0]);
        if (fmt == 0)
            put(v[fmt][1], "{\"zarr_format\": 2, \"shape\": [8], \"chunks\": [4], \"dtype\": \"|u1\", "
                           "\"fill_value\": 0, \"order\": \"C\", \"filters\": null, \"compressor\": null}");
        else
            put(v[fmt][1], V3_HEAD "\"shape\": [8], \"data_type\": \"uint8\", " V3_GRID("[4]") V3_KEYS
                           "\"fill_value\": 0, \"codecs\": [{\"name\": \"bytes\"}]}");
        char c0[64], c1[64];
        snprintf(c0, sizeof c0, "%s/%s0", v[fmt][0], fmt ? "c/" : "");
        snprintf(c1, sizeof c1, "%s/%s1", v[fmt][0], fmt ? "c/" : "");
        if (fmt) { char cd[64]; snprintf(cd, sizeof cd, "%s/c", v[fmt][0]); mk(cd); }
        ferry_dataset *ds = open_ok(v[fmt][0]);
        if (!ds) return;
        uint8_t buf[8];
        ferry_slice first2[1] = {{0, 2, 1}}, second[1] = {{4, 8, 1}};
        write_file(tpath(c0), "ABCD", 4);            /* exact: read */
        write_file(tpath(c1), "EFGHIJ", 6);          /* longer */
        CHECK_EQ_I(fc_read(ctx, ds, 0, first2, buf, sizeof buf, 0), 2);
        CHECK(!memcmp(buf, "AB", 2));
        CHECK(fc_read(ctx, ds, 0, second, buf, sizeof buf, 0) == FERRY_EFORMAT);
        CHECK_STR_CONTAINS(ferry_errmsg(ctx), c1);
        CHECK_STR_CONTAINS(ferry_errmsg(ctx), "holds 6 bytes, an uncompressed chunk is exactly 4");
        write_file(tpath(c0), "ABC", 3);             /* shorter, though the selection needs 2 bytes */
        CHECK(fc_read(ctx, ds, 0, first2, buf, sizeof buf, 0) == FERRY_EFORMAT);
        CHECK_STR_CONTAINS(ferry_errmsg(ctx), c0);
        CHECK_STR_CONTAINS(ferry_errmsg(ctx), "holds 3 bytes");
        CHECK(fc_read(ctx, ds, 0, NULL, buf, sizeof buf, 0) < 0);   /* whole: both */
        ferry_dataset_close(ds);
    }
}

/* What the metadata claims costs nothing until chunks exist (issue 36.4): an
 * array of 2^40 one-element chunks, none written — v3 with no chunk
 * directory, v2 whose chunks would sit beside .zarray, v3 sharded — read over
 * 300,000 elements plans one fill and gives the fill value; a few chunks
 * written give their values and a few records more. */
static void test_claimed_chunks_cost_nothing(void) {
    static const char *const docs[3][2] = {
        {"h3.zarr", V3_HEAD "\"shape\": [1099511627776], \"data_type\": \"float64\", " V3_GRID("[1]") V3_KEYS
                    "\"fill_value\": 1.5, \"codecs\": [{\"name\": \"bytes\", \"configuration\": {\"endian\": \"little\"}}]}"},
        {"h2.zarr", "{\"zarr_format\": 2, \"shape\": [1099511627776], \"chunks\": [1], \"dtype\": \"<f8\", "
                    "\"fill_value\": 1.5, \"order\": \"C\", \"filters\": null, \"compressor\": null}"},
        {"hs.zarr", V3_HEAD "\"shape\": [1099511627776], \"data_type\": \"float64\", " V3_GRID("[2]") V3_KEYS
                    "\"fill_value\": 1.5, \"codecs\": [{\"name\": \"sharding_indexed\", \"configuration\": "
                    "{\"chunk_shape\": [1], \"codecs\": [{\"name\": \"bytes\", \"configuration\": {\"endian\": \"little\"}}], "
                    "\"index_codecs\": [{\"name\": \"bytes\", \"configuration\": {\"endian\": \"little\"}}]}}]}"},
    };
    enum { N = 300000 };
    double *buf = malloc(N * sizeof *buf);
    if (!buf) return;
    for (int d = 0; d < 3; d++) {
        char meta[64];
        mk(docs[d][0]);
        snprintf(meta, sizeof meta, "%s/%s", docs[d][0], d == 1 ? ".zarray" : "zarr.json");
        put(meta, docs[d][1]);
        ferry_dataset *ds = open_ok(docs[d][0]);
        if (!ds) continue;
        ferry_slice sel[1] = {{1000, 1000 + N, 1}};
        for (int written = 0; written < 2; written++) {
            if (written && d < 2) {   /* chunks 1000 and 1002 (v2: beside .zarray) */
                double v[2] = {7.0, 8.0};
                char c[96];
                if (d == 0) { snprintf(c, sizeof c, "%s/c", docs[d][0]); mk(c); }
                snprintf(c, sizeof c, "%s/%s1000", docs[d][0], d == 0 ? "c/" : "");
                write_file(tpath(c), &v[0], 8);
                snprintf(c, sizeof c, "%s/%s1002", docs[d][0], d == 0 ? "c/" : "");
                write_file(tpath(c), &v[1], 8);
            } else if (written) {
                /* shard 500 holds elements 1000, 1001: inner chunk 0 written (7.0), 1 absent */
                uint8_t shard[8 + 32];
                double v = 7.0;
                uint64_t idx[4] = {0, 8, UINT64_MAX, UINT64_MAX};
                memcpy(shard, &v, 8);
                memcpy(shard + 8, idx, 32);
                char c[96];
                snprintf(c, sizeof c, "%s/c", docs[d][0]); mk(c);
                snprintf(c, sizeof c, "%s/c/500", docs[d][0]);
                write_file(tpath(c), shard, sizeof shard);
            }
            for (int i = 0; i < N; i++) buf[i] = 0;
            ferry_plan *p;
            ferry_plan_create(&p);
            int64_t rc = ferry_dataset_plan_read(ds, 0, sel, ferry_host_buf(buf, N * sizeof *buf), 0, p);
            CHECK_EQ_I(rc, (int64_t)N * 8);
            size_t records = ferry_plan_count(p);
            if (rc >= 0) CHECK(ferry_run(ctx, p, NULL) >= 0);
            else fprintf(stderr, "    %s\n", ferry_errmsg(ctx));
            ferry_plan_destroy(p);
            CHECK(records <= (written ? 5u : 1u));
            if (records > (written ? 5u : 1u)) fprintf(stderr, "    %s: %zu records\n", docs[d][0], records);
            int bad = 0;
            for (int i = 0; i < N; i++) {
                double w = 1.5;
                if (written && i == 0) w = 7.0;
                if (written && i == 2 && d < 2) w = 8.0;
                bad += buf[i] != w;
            }
            CHECK_EQ_I(bad, 0);
        }
        ferry_dataset_close(ds);
    }
    free(buf);
}

/* ferry_dataset_store_info and ferry_dataset_fill: what the parser found,
 * so that no caller reads the store's documents again. A v3 root whose
 * consolidated_metadata lists g1 and its array: g1 opened as a group is listed
 * from it (the array on disk but not in it stays unlisted, as zarr's
 * consolidated open has it); fill values decoded once ("0x..." bits, NaN, null). */
static void test_store_info_fill_and_root_consolidated_groups(void) {
    mk("c.zarr");
    mk("c.zarr/g1");
    mk("c.zarr/g1/a");
    mk("c.zarr/g1/late");
#define ARR(fill) V3_HEAD "\"shape\": [4], \"data_type\": \"float32\", " V3_GRID("[2]") V3_KEYS \
    "\"fill_value\": " fill ", \"codecs\": [{\"name\": \"bytes\"}], \"dimension_names\": [\"x\"]}"
    put("c.zarr/zarr.json", "{\"zarr_format\": 3, \"node_type\": \"group\", \"consolidated_metadata\": {"
        "\"kind\": \"inline\", \"must_understand\": false, \"metadata\": {"
        "\"g1\": {\"zarr_format\": 3, \"node_type\": \"group\"}, \"g1/a\": " ARR("\"0x3f800000\"") "}}}");
    put("c.zarr/g1/zarr.json", "{\"zarr_format\": 3, \"node_type\": \"group\"}");
    put("c.zarr/g1/a/zarr.json", ARR("\"0x3f800000\""));
    put("c.zarr/g1/late/zarr.json", ARR("null"));
    ferry_store_info si;
    ferry_open_opts o = {.group = "g1"};
    ferry_dataset *ds = NULL;
    CHECK_EQ_I(ferry_dataset_open(ctx, tpath("c.zarr"), &o, &ds), 0);
    if (!ds) return;
    CHECK_EQ_I(ferry_dataset_store_info(ds, &si), 0);
    CHECK_EQ_I(si.zarr_format, 3);
    CHECK_EQ_I(si.consolidated, 1);
    CHECK_EQ_I(si.is_array, 0);
    CHECK_EQ_I(ferry_dataset_nvars(ds), 1);   /* "late" is not in the consolidated listing */
    float f = 0;
    CHECK_EQ_I(ferry_dataset_fill(ds, 0, &f, sizeof f), 4);
    CHECK(f == 1.0f);
    CHECK_EQ_I(ferry_dataset_fill(ds, 0, &f, 2), FERRY_EINVAL);
    CHECK_EQ_I(ferry_dataset_fill(ds, 1, &f, sizeof f), FERRY_EINVAL);
    ferry_dataset_close(ds);
    ds = open_ok("c.zarr/g1/late");   /* a store of one array, fill null */
    if (!ds) return;
    CHECK_EQ_I(ferry_dataset_store_info(ds, &si), 0);
    CHECK_EQ_I(si.zarr_format, 3);
    CHECK_EQ_I(si.consolidated, 0);
    CHECK_EQ_I(si.is_array, 1);
    CHECK_EQ_I(ferry_dataset_fill(ds, 0, &f, sizeof f), 0);
    ferry_dataset_close(ds);
#undef ARR
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/ferry_test_zarr_XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.no_env = 1;
    if (ferry_ctx_create(&ctx, &cfg)) { fprintf(stderr, "ctx\n"); return 1; }
    RUN(test_v3_unknown_codec_keeps_the_description);
    RUN(test_v3_unknown_dtype_as_written);
    RUN(test_v3_group_grids_keys_sharding);
    RUN(test_v2_unsupported_dtypes_filters_compressors);
    RUN(test_malformed_metadata_still_fails);
    RUN(test_keys_stay_inside_the_store);
    RUN(test_chunk_files_opened_without_following);
    RUN(test_plan_memo_is_per_plan);
    RUN(test_required_keys);
    RUN(test_v2_compressor_key_required);
    RUN(test_raw_chunk_size_checked);
    RUN(test_claimed_chunks_cost_nothing);
    RUN(test_store_info_fill_and_root_consolidated_groups);
    ferry_ctx_destroy(ctx);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    return check_summary();
}
