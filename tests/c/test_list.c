/* test_list.c — the pure halves of bucket listings (src/sources/list.c):
 * ListObjectsV2 XML pages and GCS JSON list pages as servers send them
 * (namespaces, entities, sub-prefixes, continuation tokens), the refusals of
 * hostile pages (keys outside the prefix, NULs, truncation without a token,
 * too many entries), and the remote options' checks (src/sources/options.c). */
#include "check.h"
#include "ferry.h"
#include "ferry_experimental.h"
#include "sources/list.h"
#include "sources/ropts.h"
#include <stdlib.h>

static const char *PAGE1 =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>data</Name>"
    "<Prefix>st.zarr/x/</Prefix><KeyCount>4</KeyCount><MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter>"
    "<IsTruncated>true</IsTruncated>"
    "<Contents><Key>st.zarr/x/zarr.json</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>"
    "<ETag>&quot;abc&quot;</ETag><Size>312</Size><StorageClass>STANDARD</StorageClass></Contents>"
    "<Contents><Key>st.zarr/x/a&amp;b &#x263A;</Key><Size>7</Size></Contents>"
    "<CommonPrefixes><Prefix>st.zarr/x/c/</Prefix></CommonPrefixes>"
    "<NextContinuationToken>tok/1+2=</NextContinuationToken></ListBucketResult>";

static void test_s3_page(void) {
    ferry_remote_listing L = {0};
    char *next = NULL;
    CHECK_EQ_I(ferry_list_parse_s3(PAGE1, strlen(PAGE1), "st.zarr/x/", &L, 100, &next), 0);
    CHECK_EQ_I(L.n, 3);
    CHECK(next && !strcmp(next, "tok/1+2="));
    CHECK(L.n == 3 && !strcmp(L.e[0].name, "zarr.json") && L.e[0].size == 312 && !L.e[0].dir);
    CHECK(L.n == 3 && !strcmp(L.e[1].name, "a&b \xe2\x98\xba") && L.e[1].size == 7);
    CHECK(L.n == 3 && !strcmp(L.e[2].name, "c") && L.e[2].dir);
    free(next);
    /* the last page: no token */
    const char *last = "<ListBucketResult><IsTruncated>false</IsTruncated>"
                       "<Contents><Key>st.zarr/x/z</Key><Size>0</Size></Contents></ListBucketResult>";
    CHECK_EQ_I(ferry_list_parse_s3(last, strlen(last), "st.zarr/x/", &L, 100, &next), 0);
    CHECK(next == NULL);
    CHECK_EQ_I(L.n, 4);
    ferry_remote_listing_free(&L);
}

static void test_s3_hostile_pages(void) {
    ferry_remote_listing L = {0};
    char *next = NULL;
    const char *outside = "<ListBucketResult><Contents><Key>other/k</Key><Size>1</Size></Contents></ListBucketResult>";
    CHECK_EQ_I(ferry_list_parse_s3(outside, strlen(outside), "st/", &L, 100, &next), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "does not start with the prefix");
    const char *nul = "<ListBucketResult><Contents><Key>st/a&#0;b</Key><Size>1</Size></Contents></ListBucketResult>";
    CHECK_EQ_I(ferry_list_parse_s3(nul, strlen(nul), "st/", &L, 100, &next), FERRY_EFORMAT);
    const char *notoken = "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>";
    CHECK_EQ_I(ferry_list_parse_s3(notoken, strlen(notoken), "st/", &L, 100, &next), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "NextContinuationToken");
    const char *nosize = "<ListBucketResult><Contents><Key>st/a</Key></Contents></ListBucketResult>";
    CHECK_EQ_I(ferry_list_parse_s3(nosize, strlen(nosize), "st/", &L, 100, &next), FERRY_EFORMAT);
    const char *big = "<ListBucketResult><Contents><Key>st/a</Key><Size>99999999999999999999999</Size></Contents>"
                      "</ListBucketResult>";
    CHECK_EQ_I(ferry_list_parse_s3(big, strlen(big), "st/", &L, 100, &next), FERRY_EFORMAT);
    const char *err = "<Error><Code>AccessDenied</Code></Error>";
    CHECK_EQ_I(ferry_list_parse_s3(err, strlen(err), "st/", &L, 100, &next), FERRY_EFORMAT);
    const char *cut = "<ListBucketResult><Contents><Key>st/a";   /* a page cut short */
    CHECK(ferry_list_parse_s3(cut, strlen(cut), "st/", &L, 100, &next) < 0);
    CHECK_EQ_I(L.n, 0);
    const char *three = "<ListBucketResult><Contents><Key>st/a</Key><Size>1</Size></Contents>"
                        "<Contents><Key>st/b</Key><Size>1</Size></Contents></ListBucketResult>";
    CHECK_EQ_I(ferry_list_parse_s3(three, strlen(three), "st/", &L, 1, &next), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "more than 1 entries");
    ferry_remote_listing_free(&L);
    CHECK(next == NULL);
}

static void test_gcs_page(void) {
    ferry_remote_listing L = {0};
    char *next = NULL;
    const char *page = "{\"kind\":\"storage#objects\",\"nextPageToken\":\"CgRh\",\"prefixes\":[\"st/c/\"],"
                       "\"items\":[{\"name\":\"st/zarr.json\",\"size\":\"42\"},{\"name\":\"st/b\",\"size\":\"0\"}]}";
    CHECK_EQ_I(ferry_list_parse_gcs(page, strlen(page), "st/", &L, 100, &next), 0);
    CHECK(next && !strcmp(next, "CgRh"));
    free(next);
    CHECK_EQ_I(L.n, 3);
    CHECK(L.n == 3 && !strcmp(L.e[0].name, "zarr.json") && L.e[0].size == 42);
    CHECK(L.n == 3 && !strcmp(L.e[2].name, "c") && L.e[2].dir);
    const char *bad = "{\"items\":[{\"name\":\"st/x\",\"size\":12}]}";   /* GCS sends sizes as strings */
    CHECK_EQ_I(ferry_list_parse_gcs(bad, strlen(bad), "st/", &L, 100, &next), FERRY_EFORMAT);
    const char *empty = "{\"kind\":\"storage#objects\"}";
    CHECK_EQ_I(ferry_list_parse_gcs(empty, strlen(empty), "st/", &L, 100, &next), 0);
    CHECK(next == NULL);
    ferry_remote_listing_free(&L);
}

static void test_options(void) {
    ferry_remote_opts o;
    ferry_remote_opts_init(&o);
    CHECK_EQ_I(ferry_remote_opts_set(&o, "endpoint_url", "http://127.0.0.1:9000"), 0);
    CHECK_EQ_I(ferry_remote_opts_set(&o, "endpoint_url", "ftp://x"), FERRY_EINVAL);
    CHECK_EQ_I(ferry_remote_opts_set(&o, "addressing", "virtual"), 0);
    CHECK_EQ_I(o.addressing, 2);
    CHECK_EQ_I(ferry_remote_opts_set(&o, "addressing", "sideways"), FERRY_EINVAL);
    CHECK_EQ_I(ferry_remote_opts_set(&o, "anon", "true"), 0);
    CHECK_EQ_I(o.anon, 1);
    CHECK_EQ_I(ferry_remote_opts_set(&o, "anon", "maybe"), FERRY_EINVAL);
    CHECK_EQ_I(ferry_remote_opts_set(&o, "region", "eu-west-1"), 0);
    CHECK_EQ_I(ferry_remote_opts_set(&o, "region", "eu/west"), FERRY_EINVAL);
    CHECK_EQ_I(ferry_remote_opts_set(&o, "ca_bundle", "/no/such/ca.pem"), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "ca_bundle");
    CHECK_EQ_I(ferry_remote_opts_set(&o, "secret", "s\r\nX-Injected: 1"), FERRY_EINVAL);
    CHECK_EQ_I(ferry_remote_opts_set(&o, "endpont_url", "http://x"), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "unknown remote option \"endpont_url\"");
    CHECK_EQ_I(ferry_remote_opts_set(&o, "endpoint_url", NULL), 0);
    CHECK(o.endpoint == NULL);
    ferry_remote_opts_free(&o);
    /* through a context */
    ferry_ctx *ctx;
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.threads = 1;
    CHECK_EQ_I(ferry_ctx_create(&ctx, &cfg), 0);
    CHECK_EQ_I(ferry_ctx_set_remote_option(ctx, "key", "AKID"), 0);
    CHECK_EQ_I(ferry_ctx_set_remote_option(ctx, "nope", "1"), FERRY_EINVAL);
    char *urls = NULL;
    size_t n = 9;
    CHECK_EQ_I(ferry_url_glob(ctx, "https://example.invalid/*.npy", &urls, &n), FERRY_EUNSUPPORTED);
    CHECK(urls == NULL && n == 0);
    ferry_ctx_destroy(ctx);
}

int main(void) {
    RUN(test_s3_page);
    RUN(test_s3_hostile_pages);
    RUN(test_gcs_page);
    RUN(test_options);
    return check_summary();
}
