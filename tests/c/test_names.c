/* test_names.c — the one table of names (dtypes, codecs, O_DIRECT policies)
 * and the one size grammar: every enum value round-trips through its name,
 * unknown names fail with FERRY_EINVAL, and "5GB" is 5·10⁹ while "5G" and
 * "5GiB" are 5·2³⁰. */
#include "check.h"
#include "ferry.h"

static void test_dtype_names_round_trip(void) {
    for (int d = FERRY_DT_BOOL; d < FERRY_DT_OTHER; d++) {
        for (int st = FERRY_NAME_SHORT; st <= FERRY_NAME_TYPESTR; st++) {
            const char *n = ferry_dtype_name((ferry_dtype)d, (ferry_name_style)st);
            if (!n) { CHECK(st == FERRY_NAME_SAFETENSORS || (st == FERRY_NAME_TYPESTR && d == FERRY_DT_BYTES)); continue; }
            ferry_dtype back = FERRY_DT_UNKNOWN, back_style = FERRY_DT_UNKNOWN;
            CHECK_EQ_I(ferry_dtype_parse(n, &back), 0);
            CHECK_EQ_I(back, d);
            CHECK_EQ_I(ferry_dtype_parse_style(n, (ferry_name_style)st, &back_style), 0);
            CHECK_EQ_I(back_style, d);
        }
        uint32_t bits = ferry_dtype_bits((ferry_dtype)d);
        CHECK_EQ_I(ferry_dtype_itemsize((ferry_dtype)d), bits % 8 ? 0 : bits / 8);
    }
    CHECK(!strcmp(ferry_dtype_name(FERRY_DT_F32, FERRY_NAME_SHORT), "f4"));
    CHECK(!strcmp(ferry_dtype_name(FERRY_DT_BF16, FERRY_NAME_LONG), "bfloat16"));
    CHECK(!strcmp(ferry_dtype_name(FERRY_DT_F8_E4M3, FERRY_NAME_SAFETENSORS), "F8_E4M3"));
    CHECK(ferry_dtype_name(FERRY_DT_C128, FERRY_NAME_SAFETENSORS) == NULL);
    CHECK(!strcmp(ferry_dtype_name((ferry_dtype)999, FERRY_NAME_SHORT), "other"));
    CHECK_EQ_I(ferry_dtype_itemsize(FERRY_DT_C128), 16);
    CHECK_EQ_I(ferry_dtype_itemsize(FERRY_DT_BYTES), 0);
    /* torch's float8 variants and the sub-byte types are names C knows (they were
     * a Python table once); a safetensors header's name is parsed in that style only */
    CHECK(!strcmp(ferry_dtype_name(FERRY_DT_F8_E4M3FNUZ, FERRY_NAME_SAFETENSORS), "F8_E4M3FNUZ"));
    CHECK(!strcmp(ferry_dtype_name(FERRY_DT_F8_E8M0, FERRY_NAME_LONG), "float8_e8m0fnu"));
    CHECK(!strcmp(ferry_dtype_name(FERRY_DT_F32, FERRY_NAME_TYPESTR), "<f4"));
    CHECK(!strcmp(ferry_dtype_name(FERRY_DT_BF16, FERRY_NAME_TYPESTR), "bfloat16"));
    CHECK_EQ_I(ferry_dtype_bits(FERRY_DT_F4_E2M1), 4);
    CHECK_EQ_I(ferry_dtype_itemsize(FERRY_DT_F6_E3M2), 0);
    ferry_dtype s;
    CHECK_EQ_I(ferry_dtype_parse_style("F8_E5M2FNUZ", FERRY_NAME_SAFETENSORS, &s), 0);
    CHECK_EQ_I(s, FERRY_DT_F8_E5M2FNUZ);
    CHECK_EQ_I(ferry_dtype_parse_style("f4", FERRY_NAME_SAFETENSORS, &s), FERRY_EINVAL);
    CHECK_EQ_I(ferry_dtype_parse_style("F4", FERRY_NAME_SAFETENSORS, &s), 0);
    CHECK_EQ_I(s, FERRY_DT_F4_E2M1);
    CHECK_EQ_I(ferry_dtype_parse_style("F4", (ferry_name_style)9, &s), FERRY_EINVAL);
    ferry_dtype d;
    CHECK_EQ_I(ferry_dtype_parse("float33", &d), FERRY_EINVAL);
    CHECK_EQ_I(ferry_dtype_parse("other", &d), FERRY_EINVAL);
    CHECK_EQ_I(ferry_dtype_parse(NULL, &d), FERRY_EINVAL);
}

static void test_codec_and_policy_names(void) {
    for (int c = FERRY_CODEC_NONE; c <= FERRY_CODEC_BYTESWAP; c++) {
        ferry_codec_id back;
        CHECK_EQ_I(ferry_codec_parse(ferry_codec_name((ferry_codec_id)c), &back), 0);
        CHECK_EQ_I(back, c);
    }
    ferry_codec_id z;
    CHECK_EQ_I(ferry_codec_parse("deflate", &z), 0);
    CHECK_EQ_I(z, FERRY_CODEC_ZLIB);
    CHECK_EQ_I(ferry_codec_parse("lzma", &z), FERRY_EINVAL);
    CHECK(!strcmp(ferry_codec_name((ferry_codec_id)77), "unknown"));
    for (int p = FERRY_DIRECT_AUTO; p <= FERRY_DIRECT_OFF; p++) {
        ferry_direct back;
        CHECK_EQ_I(ferry_direct_parse(ferry_direct_name((ferry_direct)p), &back), 0);
        CHECK_EQ_I(back, p);
    }
    /* HDF5 filter ids: the table the xarray backend's h5py path once kept in Python */
    ferry_codec c;
    uint32_t cd[1] = {8};
    CHECK_EQ_I(ferry_codec_of_hdf5_filter(2, cd, 1, 4, &c), 0);
    CHECK(c.id == FERRY_CODEC_SHUFFLE && c.param == 8);          /* cd_values[0] wins */
    CHECK_EQ_I(ferry_codec_of_hdf5_filter(2, NULL, 0, 4, &c), 0);
    CHECK(c.id == FERRY_CODEC_SHUFFLE && c.param == 4);          /* else the element size */
    CHECK_EQ_I(ferry_codec_of_hdf5_filter(1, cd, 1, 4, &c), 0);
    CHECK(c.id == FERRY_CODEC_ZLIB && c.param == 0);
    CHECK_EQ_I(ferry_codec_of_hdf5_filter(32015, NULL, 0, 4, &c), 0);
    CHECK(c.id == FERRY_CODEC_ZSTD);
    CHECK_EQ_I(ferry_codec_of_hdf5_filter(32004, NULL, 0, 4, &c), FERRY_EUNSUPPORTED);   /* LZ4's HDF5 framing */
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "32004");
    ferry_direct dd;
    CHECK_EQ_I(ferry_direct_parse("sometimes", &dd), FERRY_EINVAL);
    for (int p = FERRY_PATH_AUTO; p < FERRY_PATH_COUNT_; p++) {
        ferry_path back;
        CHECK_EQ_I(ferry_path_parse(ferry_path_name((ferry_path)p), &back), 0);
        CHECK_EQ_I(back, p);
    }
}

static void expect_size(const char *s, uint64_t want) {
    uint64_t v = 0;
    int rc = ferry_size_parse(s, &v);
    if (rc != 0 || v != want) fprintf(stderr, "  size \"%s\": rc %d, %llu (want %llu)\n", s, rc,
                                      (unsigned long long)v, (unsigned long long)want);
    CHECK_EQ_I(rc, 0);
    CHECK(v == want);
}

static void test_sizes_mean_one_thing(void) {
    expect_size("4096", 4096);
    expect_size("0", 0);
    expect_size("8M", 8ull << 20);           /* the FERRY_* variables' meaning, kept */
    expect_size("8MiB", 8ull << 20);
    expect_size("8mib", 8ull << 20);
    expect_size("5GB", 5000000000ull);       /* as Hugging Face's max_shard_size reads it */
    expect_size("5 GB", 5000000000ull);
    expect_size("5G", 5ull << 30);
    expect_size("5GiB", 5ull << 30);
    expect_size("1.5K", 1536);
    expect_size("2.5GB", 2500000000ull);
    expect_size("100B", 100);
    expect_size("1P", 1ull << 50);
    expect_size("1T", 1ull << 40);
    const char *bad[] = {"", "G", "abc", "-1", "5X", "5GiBs", "1.", ".5K", "0.3", "1.0001K", "5iB",
                         "99999999999999999999", "20000000P", NULL};
    for (int i = 0; bad[i]; i++) {
        uint64_t v = 12345;
        int rc = ferry_size_parse(bad[i], &v);
        if (rc != FERRY_EINVAL) fprintf(stderr, "  \"%s\" accepted as %llu\n", bad[i], (unsigned long long)v);
        CHECK_EQ_I(rc, FERRY_EINVAL);
    }
}

static void test_env_sizes_use_the_same_grammar(void) {
    setenv("FERRY_STAGING_SIZE", "8M", 1);
    setenv("FERRY_TASK_SIZE", "16MB", 1);
    ferry_ctx *ctx;
    CHECK_EQ_I(ferry_ctx_create(&ctx, NULL), 0);
    ferry_config c;
    ferry_ctx_config(ctx, &c);
    CHECK(c.staging_size == (8u << 20));
    CHECK(c.task_size == (16000000 + 4095) / 4096 * 4096);   /* SI, rounded up to 4 KiB */
    ferry_ctx_destroy(ctx);
    setenv("FERRY_STAGING_SIZE", "8 bananas", 1);
    CHECK(ferry_ctx_create(&ctx, NULL) == FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "FERRY_STAGING_SIZE");
    unsetenv("FERRY_STAGING_SIZE");
    unsetenv("FERRY_TASK_SIZE");
}

int main(void) {
    RUN(test_dtype_names_round_trip);
    RUN(test_codec_and_policy_names);
    RUN(test_sizes_mean_one_thing);
    RUN(test_env_sizes_use_the_same_grammar);
    return check_summary();
}
