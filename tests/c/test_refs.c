/* test_refs.c — kerchunk reference sets through ferry.h alone: a hand-written
 * set (version 0 and 1, inline chunks in text and base64, a zlib chunk in a
 * data file, a gen entry, a child group) reads the values it describes, a
 * key absent from the set is the fill value, and damaged sets fail naming the
 * JSON, the key and the target. (Sets written by kerchunk itself are checked
 * in tests/python/test_refs.py.) */
#include "check.h"
#include "formats_check.h"
#include "ferry.h"
#include <errno.h>
#include <sys/stat.h>
#include <zlib.h>

static ferry_ctx *ctx;

static void put(const char *rel, const char *text) { write_file(tpath(rel), text, strlen(text)); }

static const char *b64(const uint8_t *p, size_t n) {
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    static char out[1024];
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        out[o++] = t[v >> 18 & 63];
        out[o++] = t[v >> 12 & 63];
        out[o++] = i + 1 < n ? t[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? t[v & 63] : '=';
    }
    out[o] = 0;
    return out;
}

#define ZA(shape, chunks, dt, comp, fill)                                                                     \
    "{\\\"zarr_format\\\":2,\\\"shape\\\":" shape ",\\\"chunks\\\":" chunks ",\\\"dtype\\\":\\\"" dt            \
    "\\\",\\\"fill_value\\\":" fill ",\\\"order\\\":\\\"C\\\",\\\"compressor\\\":" comp ",\\\"filters\\\":null}"

/* data.bin: 8 bytes of header, then t's chunk 0 (4 float32), then a zlib
 * stream of t's chunk 1. */
static size_t write_data(float *want) {
    uint8_t buf[256];
    memcpy(buf, "HEADER!!", 8);
    for (int i = 0; i < 8; i++) want[i] = (float)i * 1.5f;
    memcpy(buf + 8, want, 16);
    uLongf zn = sizeof buf - 24;
    if (compress2(buf + 24, &zn, (const Bytef *)(want + 4), 16, 6) != Z_OK) abort();
    write_file(tpath("data.bin"), buf, 24 + zn);
    return zn;
}

/* raw0, c0: the values of keys raw/0 and c/0 (NULL: the good ones) */
static void write_set(const char *name, size_t zn, const char *raw0, const char *c0) {
    char text[4096], c0buf[1100];
    int16_t c[3] = {7, -8, 9};
    snprintf(c0buf, sizeof c0buf, "\"base64:%s\"", b64((const uint8_t *)c, sizeof c));
    snprintf(text, sizeof text,
             "{\"version\": 1, \"templates\": {\"d\": \"data.bin\"},"
             " \"gen\": [{\"key\": \"g/{{i}}\", \"url\": \"{{d}}\", \"offset\": \"{{8 + 4 * i}}\", \"length\": \"4\","
             "            \"dimensions\": {\"i\": {\"stop\": 2}}}],"
             " \"refs\": {\".zgroup\": \"{\\\"zarr_format\\\":2}\", \".zattrs\": \"{\\\"title\\\":\\\"set\\\"}\","
             "  \"t/.zarray\": \"" ZA("[12]", "[4]", "<f4", "{\\\"id\\\":\\\"zlib\\\"}", "-1.0") "\","
             "  \"t/.zattrs\": \"{\\\"_ARRAY_DIMENSIONS\\\":[\\\"n\\\"],\\\"units\\\":\\\"K\\\"}\","
             "  \"t/1\": [\"{{d}}\", 24, %zu],"
             "  \"raw/.zarray\": \"" ZA("[4]", "[4]", "<f4", "null", "null") "\","
             "  \"raw/0\": %s,"
             "  \"c/.zarray\": \"" ZA("[3]", "[3]", "<i2", "null", "0") "\","
             "  \"c/0\": %s,"
             "  \"s/.zarray\": \"" ZA("[2]", "[2]", "|u1", "null", "0") "\", \"s/0\": \"hi\","
             "  \"g/.zarray\": \"" ZA("[2]", "[1]", "<f4", "null", "null") "\","
             "  \"sub/.zgroup\": \"{\\\"zarr_format\\\":2}\","
             "  \"sub/x/.zarray\": \"" ZA("[]", "[]", "<f4", "null", "null") "\", \"sub/x/0\": [\"data.bin\", 12, 4]"
             "  }}",
             zn, raw0 ? raw0 : "[\"data.bin\", 8, 16]", c0 ? c0 : c0buf);
    put(name, text);
}

static void test_reads_what_the_set_describes(void) {
    float want[8], got[12];
    write_set("refs.json", write_data(want), NULL, NULL);
    const char *format = NULL;
    CHECK_EQ_I(ferry_format_detect(ctx, tpath("refs.json"), &format), 0);
    CHECK(format && !strcmp(format, "refs"));
    ferry_dataset *ds = NULL;
    CHECK_EQ_I(ferry_dataset_open(ctx, tpath("refs.json"), NULL, &ds), 0);
    if (!ds) { fprintf(stderr, "    %s\n", ferry_errmsg(ctx)); return; }
    CHECK(!strcmp(ferry_dataset_format(ds), "refs"));
    CHECK_STR_CONTAINS(ferry_dataset_attrs_json(ds), "\"title\":\"set\"");
    CHECK_STR_CONTAINS(ferry_dataset_groups_json(ds), "\"sub\"");
    CHECK_STR_CONTAINS(ferry_dataset_dims_json(ds), "\"n\":{\"size\":12");
    int t = ferry_dataset_find(ds, "t");
    CHECK(t >= 0);
    ferry_var_info vi;
    CHECK_EQ_I(ferry_dataset_var(ds, t, &vi), 0);
    CHECK_EQ_I(vi.shape[0], 12);
    CHECK_STR_CONTAINS(vi.attrs_json, "\"units\":\"K\"");
    /* t/0 is absent (fill -1), t/1 zlib in data.bin, t/2 absent */
    CHECK_EQ_I(fc_read(ctx, ds, t, NULL, got, sizeof got, FERRY_NATIVE), 48);
    for (int i = 0; i < 4; i++) CHECK(got[i] == -1.0f && got[8 + i] == -1.0f);
    for (int i = 0; i < 4; i++) CHECK(got[4 + i] == want[4 + i]);
    ferry_slice one = {5, 7, 1};
    CHECK_EQ_I(fc_read(ctx, ds, t, &one, got, sizeof got, FERRY_NATIVE), 8);
    CHECK(got[0] == want[5] && got[1] == want[6]);
    CHECK_EQ_I(fc_read(ctx, ds, ferry_dataset_find(ds, "raw"), NULL, got, sizeof got, FERRY_NATIVE), 16);
    for (int i = 0; i < 4; i++) CHECK(got[i] == want[i]);
    int16_t c[3];
    CHECK_EQ_I(fc_read(ctx, ds, ferry_dataset_find(ds, "c"), NULL, c, sizeof c, FERRY_NATIVE), 6);
    CHECK(c[0] == 7 && c[1] == -8 && c[2] == 9);
    char s[2];
    CHECK_EQ_I(fc_read(ctx, ds, ferry_dataset_find(ds, "s"), NULL, s, sizeof s, FERRY_NATIVE), 2);
    CHECK(s[0] == 'h' && s[1] == 'i');
    CHECK_EQ_I(fc_read(ctx, ds, ferry_dataset_find(ds, "g"), NULL, got, sizeof got, FERRY_NATIVE), 8);
    CHECK(got[0] == want[0] && got[1] == want[1]);   /* generated: offsets 8 and 12 */
    ferry_dataset_close(ds);

    ferry_open_opts o = {.group = "sub"};
    CHECK_EQ_I(ferry_dataset_open(ctx, tpath("refs.json"), &o, &ds), 0);
    if (!ds) return;
    CHECK_EQ_I(ferry_dataset_nvars(ds), 1);
    CHECK_EQ_I(fc_read(ctx, ds, 0, NULL, got, sizeof got, FERRY_NATIVE), 4);
    CHECK(got[0] == want[1]);
    ferry_dataset_close(ds);
    o.group = "nope";
    CHECK_EQ_I(ferry_dataset_open(ctx, tpath("refs.json"), &o, &ds), FERRY_ENOTFOUND);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "no group \"nope\"");
}

/* A read of var fails with code, the message naming the set, key and target. */
static void expect_read_error(const char *set, const char *var, int code, const char *key, const char *needle,
                              const ferry_open_opts *o) {
    ferry_dataset *ds = NULL;
    CHECK_EQ_I(ferry_dataset_open(ctx, tpath(set), o, &ds), 0);
    if (!ds) { fprintf(stderr, "    %s\n", ferry_errmsg(ctx)); return; }
    float got[16];
    CHECK_EQ_I(fc_read(ctx, ds, ferry_dataset_find(ds, var), NULL, got, sizeof got, FERRY_NATIVE), code);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), tpath(set));
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), key);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), needle);
    ferry_dataset_close(ds);
}

static void test_damaged_sets_name_set_key_and_target(void) {
    float want[8];
    size_t zn = write_data(want);
    write_set("past.json", zn, "[\"data.bin\", 100, 16]", NULL);   /* the file holds 24 + zn < 116 */
    expect_read_error("past.json", "raw", FERRY_EFORMAT, "key \"raw/0\"", "past the end of", NULL);
    write_set("gone.json", zn, "[\"gone.bin\", 8, 16]", NULL);
    expect_read_error("gone.json", "raw", -ENOENT, "key \"raw/0\"", "gone.bin", NULL);
    write_set("short.json", zn, "[\"data.bin\", 8, 12]", NULL);
    expect_read_error("short.json", "raw", FERRY_EFORMAT, "key \"raw/0\"", "12 bytes where an uncompressed chunk", NULL);
    write_set("b64.json", zn, NULL, "\"base64:AA*A\"");
    fc_expect_open_error(ctx, tpath("b64.json"), NULL, FERRY_EFORMAT, "key \"c/0\": bad base64");
    write_set("cut.json", zn, NULL, "\"base64:AAAAA\"");
    fc_expect_open_error(ctx, tpath("cut.json"), NULL, FERRY_EFORMAT, "cut short");
    write_set("shape.json", zn, "[\"data.bin\", 8]", NULL);
    fc_expect_open_error(ctx, tpath("shape.json"), NULL, FERRY_EFORMAT, "[url, offset, length]");
    put("badjson.json", "{\"version\": 1, \"refs\": {\".zgroup\": \"{}\",}}");
    fc_expect_open_error(ctx, tpath("badjson.json"), NULL, FERRY_EFORMAT, "JSON");
    put("other.json", "{\"name\": \"a config file\", \"layers\": [1, 2]}");
    fc_expect_open_error(ctx, tpath("other.json"), NULL, FERRY_EFORMAT, "not a kerchunk reference set");
    const char *format = NULL;   /* by content nothing, by name a reference set: its parser's complaint */
    CHECK_EQ_I(ferry_format_detect(ctx, tpath("other.json"), &format), 0);
    CHECK(format && !strcmp(format, "refs"));
    put("v2.json", "{\"version\": 2, \"refs\": {}}");
    fc_expect_open_error(ctx, tpath("v2.json"), NULL, FERRY_EUNSUPPORTED, "version 2");
    write_set("tpl.json", zn, "[\"{{d(x=1)}}\", 8, 16]", NULL);
    fc_expect_open_error(ctx, tpath("tpl.json"), NULL, FERRY_EFORMAT, "template field");
}

static void test_outside_the_directory_only_when_allowed(void) {
    float want[8];
    size_t zn = write_data(want);
    mkdir(tpath("sub"), 0755);
    write_set("sub/up.json", zn, "[\"../data.bin\", 8, 16]", NULL);
    expect_read_error("sub/up.json", "raw", -EACCES, "key \"raw/0\"", "outside the reference set's directory", NULL);
    ferry_open_opts o = {.allow_outside = 1};
    ferry_dataset *ds = NULL;
    CHECK_EQ_I(ferry_dataset_open(ctx, tpath("sub/up.json"), &o, &ds), 0);
    float got[4];
    if (ds) CHECK_EQ_I(fc_read(ctx, ds, ferry_dataset_find(ds, "raw"), NULL, got, sizeof got, FERRY_NATIVE), 16);
    if (ds) CHECK(got[3] == want[3]);
    ferry_dataset_close(ds);
    /* a URL scheme ferry does not read is refused by name */
    write_set("ftp.json", zn, "[\"ftp://h/data.bin\", 8, 16]", NULL);
    expect_read_error("ftp.json", "raw", FERRY_EUNSUPPORTED, "key \"raw/0\"", "ftp://h/data.bin", NULL);
}

/* opts->refs_json: a Parquet reference directory's references as JSON, read
 * instead of the directory (which the C library refuses alone); targets resolve
 * beside the directory, as beside a JSON file */
static void test_references_given_as_json(void) {
    float want[8], got[4];
    write_data(want);
    mkdir(tpath("p.parq"), 0755);
    put("p.parq/.zmetadata", "{\"metadata\": {\".zgroup\": {\"zarr_format\": 2}}, \"record_size\": 10}");
    const char *format = NULL;
    CHECK_EQ_I(ferry_format_detect(ctx, tpath("p.parq"), &format), 0);
    CHECK(format && !strcmp(format, "refs"));
    fc_expect_open_error(ctx, tpath("p.parq"), NULL, FERRY_EUNSUPPORTED, "pyarrow");
    ferry_open_opts o = {.refs_json = "{\"version\": 1, \"refs\": {\".zgroup\": \"{\\\"zarr_format\\\":2}\","
                                      " \"raw/.zarray\": \"" ZA("[4]", "[4]", "<f4", "null", "null") "\","
                                      " \"raw/0\": [\"data.bin\", 8, 16]}}"};
    ferry_dataset *ds = NULL;
    CHECK_EQ_I(ferry_dataset_open(ctx, tpath("p.parq/"), &o, &ds), 0);
    if (!ds) { fprintf(stderr, "    %s\n", ferry_errmsg(ctx)); return; }
    CHECK(!strcmp(ferry_dataset_format(ds), "refs"));
    CHECK_EQ_I(fc_read(ctx, ds, ferry_dataset_find(ds, "raw"), NULL, got, sizeof got, FERRY_NATIVE), 16);
    for (int i = 0; i < 4; i++) CHECK(got[i] == want[i]);
    ferry_dataset_close(ds);
    o.format = "zarr";   /* JSON references are the refs format's */
    ds = (ferry_dataset *)1;
    CHECK_EQ_I(ferry_dataset_open(ctx, tpath("p.parq"), &o, &ds), FERRY_EINVAL);
    CHECK(ds == NULL);
    o.format = NULL;
    o.refs_json = "{\"version\": 1, \"refs\": [";   /* damaged: named by the path given */
    fc_expect_open_error(ctx, tpath("p.parq"), NULL, FERRY_EUNSUPPORTED, NULL);
    CHECK_EQ_I(ferry_dataset_open(ctx, tpath("p.parq"), &o, &ds), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "p.parq");
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/ferry_test_refs_XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.no_env = 1;
    if (ferry_ctx_create(&ctx, &cfg)) { fprintf(stderr, "ctx\n"); return 1; }
    RUN(test_reads_what_the_set_describes);
    RUN(test_damaged_sets_name_set_key_and_target);
    RUN(test_outside_the_directory_only_when_allowed);
    RUN(test_references_given_as_json);
    ferry_ctx_destroy(ctx);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    return check_summary();
}
