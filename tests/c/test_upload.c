/* test_upload.c — what ferry_object_write decides before the network
 * (src/sources/s3_upload.c): how an object is cut into parts within S3's
 * bounds, what an S3 XML answer says, the signed headers of a body, and the
 * refusals that name the URL and what to do. The uploads themselves run
 * against moto's S3 server in tests/python/test_remote_checkpoint.py. */
#include "check.h"
#include "ferry.h"
#include "ferry_experimental.h"
#include "sources/s3.h"
#include "sources/upload.h"
#include <errno.h>
#include <stdlib.h>

static void test_parts(void) {
    uint64_t part, n;
    CHECK_EQ_I(ferry_upload_parts(0, 16 << 20, &part, &n), 0);
    CHECK_EQ_I(n, 0);                                   /* one PUT, even of nothing */
    CHECK_EQ_I(ferry_upload_parts(16 << 20, 16 << 20, &part, &n), 0);
    CHECK_EQ_I(n, 0);                                   /* the part size itself: one PUT */
    CHECK_EQ_I(ferry_upload_parts((16 << 20) + 1, 16 << 20, &part, &n), 0);
    CHECK_EQ_I(n, 2);
    CHECK_EQ_I(part, 16 << 20);
    /* 1 TiB at 16 MiB would be 65,536 parts: S3 takes 10,000, so parts grow by whole MiB */
    CHECK_EQ_I(ferry_upload_parts(1ull << 40, 16 << 20, &part, &n), 0);
    CHECK(n <= 10000 && n * part >= (1ull << 40) && (n - 1) * part < (1ull << 40));
    CHECK_EQ_I(part % (1u << 20), 0);
    CHECK_EQ_I(part, 105ull << 20);
    /* exactly 10,000 parts stays as asked */
    CHECK_EQ_I(ferry_upload_parts(10000ull * (5 << 20), 5 << 20, &part, &n), 0);
    CHECK_EQ_I(n, 10000);
    CHECK_EQ_I(part, 5 << 20);
    /* S3's largest object is 5 TiB */
    CHECK_EQ_I(ferry_upload_parts((5ull << 40) + 1, 16 << 20, &part, &n), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "5 TiB");
}

static void test_xml_text(void) {
    char out[64];
    const char *ok = "<?xml version=\"1.0\"?><InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key>"
                     "<UploadId>abc-DEF_1&amp;2</UploadId></InitiateMultipartUploadResult>";
    CHECK_EQ_I(ferry_s3_xml_text(ok, strlen(ok), "UploadId", out, sizeof out), 1);
    CHECK(!strcmp(out, "abc-DEF_1&2"));
    CHECK_EQ_I(ferry_s3_xml_text(ok, strlen(ok), "Key", out, sizeof out), 1);
    CHECK(!strcmp(out, "k"));
    CHECK_EQ_I(ferry_s3_xml_text(ok, strlen(ok), "Missing", out, sizeof out), 0);
    CHECK_EQ_I(ferry_s3_xml_text(ok, strlen(ok), "UploadId", out, 5), 0);          /* does not fit */
    /* the body is not NUL-terminated where n ends: a tag cut by n is not found */
    size_t cut = (size_t)(strstr(ok, "</UploadId>") - ok) + 3;
    CHECK_EQ_I(ferry_s3_xml_text(ok, cut, "UploadId", out, sizeof out), 0);
    const char *ents = "<ETag>&quot;x&quot;&lt;&gt;&apos;&bogus;</ETag>";
    CHECK_EQ_I(ferry_s3_xml_text(ents, strlen(ents), "ETag", out, sizeof out), 1);
    CHECK(!strcmp(out, "\"x\"<>'&bogus;"));
    const char *amp_end = "<A>&am</A>";
    CHECK_EQ_I(ferry_s3_xml_text(amp_end, strlen(amp_end), "A", out, sizeof out), 1);
    CHECK(!strcmp(out, "&am"));
}

static void test_signed_body(void) {
    setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "secret", 1);
    setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9", 1);
    unsetenv("AWS_SESSION_TOKEN");
    ferry_url u;
    ferry_s3_auth a;
    CHECK_EQ_I(ferry_s3_setup("s3://b/k", &u, &a), 0);
    ferry_s3_signed plain, body, unsigned_;
    CHECK_EQ_I(ferry_s3_sign(&a, &u, "GET", "", 1700000000, &plain), 0);
    CHECK_EQ_I(ferry_s3_sign_body(&a, &u, "GET", "", NULL, 1700000000, &body), 0);
    /* no body: the very headers ferry_s3_sign gives */
    CHECK_EQ_I(plain.n, body.n);
    for (int i = 0; i < plain.n && i < body.n; i++) CHECK(!strcmp(plain.line[i], body.line[i]));
    CHECK_EQ_I(ferry_s3_sign_body(&a, &u, "PUT", "partNumber=1&uploadId=x", "UNSIGNED-PAYLOAD", 1700000000, &unsigned_), 0);
    CHECK(!strcmp(unsigned_.line[1], "x-amz-content-sha256: UNSIGNED-PAYLOAD"));
    CHECK(strcmp(unsigned_.line[unsigned_.n - 1], plain.line[plain.n - 1]));   /* another signature */
    ferry_url_free(&u);
    ferry_s3_auth_free(&a);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_ENDPOINT_URL");
}

static void test_refusals(void) {
    ferry_ctx *ctx;
    CHECK_EQ_I(ferry_ctx_create(&ctx, NULL), 0);
    const char data[] = "x";
    CHECK_EQ_I(ferry_object_write(ctx, "https://host/a.safetensors", data, 1), FERRY_EUNSUPPORTED);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "https://host/a.safetensors: ferry does not write https:// URLs");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "s3://");
    CHECK_EQ_I(ferry_object_write(ctx, "http://host/a", data, 1), FERRY_EUNSUPPORTED);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "http://");
    CHECK_EQ_I(ferry_object_write(ctx, "/tmp/a", data, 1), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "ferry_pwrite");
    CHECK_EQ_I(ferry_object_write(ctx, "file:///tmp/a", data, 1), FERRY_EINVAL);
    CHECK_EQ_I(ferry_object_write(ctx, "ftp://h/a", data, 1), FERRY_EUNSUPPORTED);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "ftp://");
    CHECK_EQ_I(ferry_object_write(ctx, "s3://bucket/", data, 1) < 0, 1);             /* no key */
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "s3://bucket/");
    CHECK_EQ_I(ferry_object_write(ctx, "s3://bucket/ckpt/", data, 1), FERRY_EINVAL);  /* a folder */
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "s3://bucket/ckpt/model.safetensors");
    CHECK_EQ_I(ferry_object_write(NULL, "s3://b/k", data, 1), FERRY_EINVAL);
    CHECK_EQ_I(ferry_object_write(ctx, "s3://b/k", NULL, 1), FERRY_EINVAL);
    CHECK_EQ_I(ferry_object_delete(ctx, "https://host/a"), FERRY_EUNSUPPORTED);
    /* a part size outside S3's bounds names the variable */
    setenv("FERRY_REMOTE_PART_SIZE", "1M", 1);
    setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9", 1);
    int rc = ferry_object_write(ctx, "s3://b/k", data, 1);
#ifdef FERRY_HAVE_CURL
    CHECK_EQ_I(rc, FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "FERRY_REMOTE_PART_SIZE");
#else
    CHECK_EQ_I(rc, FERRY_EUNSUPPORTED);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "needs libcurl");
#endif
    /* and a context is not made under it (every knob is checked at ferry_ctx_create) */
    ferry_ctx *bad = NULL;
    CHECK_EQ_I(ferry_ctx_create(&bad, NULL), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "FERRY_REMOTE_PART_SIZE");
    ferry_ctx_destroy(bad);
    unsetenv("FERRY_REMOTE_PART_SIZE");
#ifdef FERRY_HAVE_CURL
    /* nothing listens on port 9: a refused connection, retried within bounds, then named */
    setenv("FERRY_REMOTE_RETRIES", "1", 1);
    rc = ferry_object_write(ctx, "s3://b/k", data, 1);
    CHECK(rc < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "s3://b/k: PUT: ");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "2 attempts");
    unsetenv("FERRY_REMOTE_RETRIES");
#endif
    unsetenv("AWS_ENDPOINT_URL");
    ferry_ctx_destroy(ctx);
}

int main(void) {
    RUN(test_parts);
    RUN(test_xml_text);
    RUN(test_signed_body);
    RUN(test_refusals);
    return check_summary();
}
