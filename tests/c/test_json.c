/* test_json.c — the strict JSON parser and the writer helpers. */
#include "check.h"
#include "formats/json.h"
#include <math.h>

static ferry_json *parse(const char *s) {
    ferry_json *r = NULL;
    int rc = ferry_json_parse(s, strlen(s), "t.json", 0, &r);
    return rc ? NULL : r;
}

/* Parse must fail with EFORMAT and name byte `pos`. */
static void expect_error(const char *s, size_t len, unsigned long long pos) {
    ferry_json *r = NULL;
    int rc = ferry_json_parse(s, len, "t.json", 0, &r);
    CHECK_EQ_I(rc, FERRY_EFORMAT);
    CHECK(r == NULL);
    char want[64];
    snprintf(want, sizeof want, "t.json: byte %llu:", pos);
    CHECK_STR_CONTAINS(ferry_lasterr(), want);
}

static void test_values_and_tree(void) {
    ferry_json *r = parse(" {\"a\": [1, -2.5e3, true, false, null], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\", \"o\": {}} ");
    CHECK(r != NULL);
    if (!r) return;
    CHECK_EQ_I(r->type, FERRY_JSON_OBJECT);
    CHECK_EQ_I(r->n, 3);
    const ferry_json *a = ferry_json_get(r, "a");
    CHECK(a && a->type == FERRY_JSON_ARRAY && a->n == 5);
    if (a && a->n == 5) {
        CHECK(a->items[0].num == 1.0);
        CHECK(a->items[1].num == -2500.0);
        CHECK(!strcmp(a->items[1].str, "-2.5e3"));
        CHECK(a->items[2].type == FERRY_JSON_BOOL && a->items[2].boolean == 1);
        CHECK(a->items[3].type == FERRY_JSON_BOOL && a->items[3].boolean == 0);
        CHECK(a->items[4].type == FERRY_JSON_NULL);
        CHECK_EQ_I(a->pos, 7);
    }
    const char *s = ferry_json_str(ferry_json_get(r, "s"));
    CHECK(s && !strcmp(s, "x\xc3\xa9\xf0\x9f\x98\x80\n"));
    CHECK(ferry_json_get(r, "o") && ferry_json_get(r, "o")->type == FERRY_JSON_OBJECT);
    CHECK(ferry_json_get(r, "missing") == NULL);
    CHECK(ferry_json_get(a, "a") == NULL);     /* not an object */
    ferry_json_free(r);
    ferry_json_free(NULL);
}

static void test_exact_integers(void) {
    ferry_json *r = parse("[18446744073709551615, 18446744073709551616, -9223372036854775808, 9223372036854775807, 1.0, 1e3, -1, 0]");
    CHECK(r != NULL);
    if (!r) return;
    uint64_t u = 0;
    int64_t i = 0;
    CHECK(ferry_json_u64(&r->items[0], &u) == 0 && u == UINT64_MAX);
    CHECK(ferry_json_u64(&r->items[1], &u) == -1);          /* overflows */
    CHECK(ferry_json_i64(&r->items[2], &i) == 0 && i == INT64_MIN);
    CHECK(ferry_json_i64(&r->items[3], &i) == 0 && i == INT64_MAX);
    CHECK(ferry_json_i64(&r->items[0], &i) == -1);
    CHECK(ferry_json_u64(&r->items[4], &u) == -1);          /* not an integer literal */
    CHECK(ferry_json_u64(&r->items[5], &u) == -1);
    CHECK(ferry_json_u64(&r->items[6], &u) == -1);          /* negative */
    CHECK(ferry_json_i64(&r->items[6], &i) == 0 && i == -1);
    CHECK(ferry_json_u64(&r->items[7], &u) == 0 && u == 0);
    CHECK(ferry_json_u64(NULL, &u) == -1);
    ferry_json_free(r);
}

static void test_embedded_nul(void) {
    ferry_json *r = parse("\"a\\u0000b\"");
    CHECK(r && r->len == 3 && r->str[1] == 0 && r->str[2] == 'b');
    ferry_json_free(r);
}

static void test_syntax_errors_name_position(void) {
    expect_error("[1,]", 4, 3);
    expect_error("[1 2]", 5, 3);
    expect_error("{\"a\" 1}", 7, 5);
    expect_error("{\"a\":1,}", 8, 7);
    expect_error("{1:2}", 5, 1);
    expect_error("01", 2, 0);
    expect_error("-", 1, 0);
    expect_error("1.", 2, 0);
    expect_error("1e", 2, 0);
    expect_error("NaN", 3, 0);
    expect_error("Infinity", 8, 0);
    expect_error("tru", 3, 0);
    expect_error("\"abc", 4, 0);
    expect_error("\"a\tb\"", 5, 2);
    expect_error("\"\\x\"", 4, 1);
    expect_error("\"\\u12G4\"", 8, 1);
    expect_error("\"\\ud800\"", 8, 1);           /* lone high surrogate */
    expect_error("\"\\udc00\"", 8, 1);           /* lone low surrogate */
    expect_error("\"\\ud800\\u0041\"", 14, 1);
    expect_error("[] x", 4, 3);
    expect_error("", 0, 0);
    expect_error("   ", 3, 3);
    expect_error("[", 1, 1);
    expect_error("{", 1, 1);
    expect_error("/* c */ 1", 9, 0);
}

static void test_invalid_utf8(void) {
    expect_error("\"\xc0\x80\"", 4, 1);              /* overlong NUL */
    expect_error("\"ab\xed\xa0\x80\"", 7, 3);        /* encoded surrogate */
    expect_error("\"\xf4\x90\x80\x80\"", 6, 1);      /* above U+10FFFF */
    expect_error("\"\xe2\x82\"", 4, 1);              /* truncated sequence */
    expect_error("\"\x80\"", 3, 1);                  /* stray continuation */
    expect_error("\"\xff\"", 3, 1);
    ferry_json *r = parse("\"\xe2\x82\xac\xf0\x9f\x98\x80\"");
    CHECK(r != NULL);
    ferry_json_free(r);
}

static void test_depth_limit(void) {
    char buf[300];
    for (int depth = 63; depth <= 66; depth++) {
        int n = 0;
        for (int i = 0; i < depth; i++) buf[n++] = '[';
        for (int i = 0; i < depth; i++) buf[n++] = ']';
        ferry_json *r = NULL;
        int rc = ferry_json_parse(buf, (size_t)n, "d.json", 0, &r);
        if (depth <= FERRY_JSON_MAX_DEPTH) CHECK_EQ_I(rc, 0);
        else {
            CHECK_EQ_I(rc, FERRY_EFORMAT);
            CHECK_STR_CONTAINS(ferry_lasterr(), "nested too deeply");
            CHECK_STR_CONTAINS(ferry_lasterr(), "byte 64");
        }
        ferry_json_free(r);
    }
}

static void test_duplicate_keys(void) {
    expect_error("{\"a\":1,\"b\":2,\"a\":3}", 19, 17);   /* the duplicate member's value */
    /* a large object goes through the sorting path */
    char buf[2000];
    int n = sprintf(buf, "{");
    for (int i = 0; i < 40; i++) n += sprintf(buf + n, "%s\"k%d\":%d", i ? "," : "", i, i);
    int dup_pos = n + 1;                 /* the key; its value is 5 bytes on */
    n += sprintf(buf + n, ",\"k7\":0}");
    expect_error(buf, (size_t)n, (unsigned long long)dup_pos + 5);
    buf[dup_pos + 2] = '9';   /* "k9"? still a duplicate */
    buf[dup_pos + 1] = 'z';   /* "z9": unique */
    ferry_json *r = NULL;
    CHECK_EQ_I(ferry_json_parse(buf, (size_t)n, "t.json", 0, &r), 0);
    CHECK(r && r->n == 41);
    ferry_json_free(r);
}

static void test_base_offset(void) {
    ferry_json *r = NULL;
    CHECK_EQ_I(ferry_json_parse("[1,,]", 5, "f.safetensors", 8, &r), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_lasterr(), "f.safetensors: byte 11:");
    CHECK_EQ_I(ferry_json_parse("{\"x\": 5}", 8, "f", 100, &r), 0);
    CHECK(r && r->pos == 100 && r->items[0].pos == 106);
    ferry_json_free(r);
}

/* Every proper prefix of a document is an error, never a crash. */
static void test_every_prefix_fails(void) {
    const char *doc = "{\"__metadata__\":{\"k\":\"v\\u00e9\"},\"t\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
    size_t n = strlen(doc);
    for (size_t len = 0; len < n; len++) {
        ferry_json *r = NULL;
        int rc = ferry_json_parse(doc, len, "p", 0, &r);
        CHECK_EQ_I(rc, FERRY_EFORMAT);
        CHECK(r == NULL);
    }
    ferry_json *r = NULL;
    CHECK_EQ_I(ferry_json_parse(doc, n, "p", 0, &r), 0);
    ferry_json_free(r);
}

static void test_writer(void) {
    ferry_sbuf b = {0};
    ferry_sbuf_json_string(&b, "a\"b\\c\n\x01\xc3\xa9\xff", 10);
    char *s = ferry_sbuf_take(&b);
    CHECK(s && !strcmp(s, "\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\\u00ff\""));
    ferry_json *r = s ? parse(s) : NULL;
    CHECK(r && r->type == FERRY_JSON_STRING);
    ferry_json_free(r);
    free(s);

    ferry_sbuf_json_double(&b, NAN, 17);
    ferry_sbuf_puts(&b, " ");
    ferry_sbuf_json_double(&b, -INFINITY, 17);
    ferry_sbuf_puts(&b, " ");
    ferry_sbuf_json_double(&b, 0.1, 17);
    ferry_sbuf_puts(&b, " ");
    ferry_sbuf_json_double(&b, (double)1.1f, 9);
    ferry_sbuf_puts(&b, " ");
    ferry_sbuf_json_double(&b, 1e300, 17);
    ferry_sbuf_printf(&b, " %d", 42);
    s = ferry_sbuf_take(&b);
    CHECK(s && !strcmp(s, "\"NaN\" \"-Infinity\" 0.1 1.1 1e+300 42"));
    free(s);

    const char *doc = "{\"a\":[1,2.50,\"x\"],\"b\":{\"c\":null,\"d\":true},\"e\":18446744073709551615}";
    r = parse(doc);
    CHECK(r != NULL);
    ferry_sbuf_json_value(&b, r);
    s = ferry_sbuf_take(&b);
    CHECK(s && !strcmp(s, doc));
    free(s);
    ferry_json_free(r);

    s = ferry_sbuf_take(&b);          /* nothing appended: "" */
    CHECK(s && !*s);
    free(s);
    ferry_sbuf_free(&b);
}

static void test_utf8_valid(void) {
    CHECK(ferry_utf8_valid("abc\xc3\xa9", 5));
    CHECK(!ferry_utf8_valid("\xc3", 1));
    CHECK(!ferry_utf8_valid("\xed\xb0\x80", 3));
    CHECK(ferry_utf8_valid("", 0));
}

int main(void) {
    RUN(test_values_and_tree);
    RUN(test_exact_integers);
    RUN(test_embedded_nul);
    RUN(test_syntax_errors_name_position);
    RUN(test_invalid_utf8);
    RUN(test_depth_limit);
    RUN(test_duplicate_keys);
    RUN(test_base_offset);
    RUN(test_every_prefix_fails);
    RUN(test_writer);
    RUN(test_utf8_valid);
    return check_summary();
}
