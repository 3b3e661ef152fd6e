/* test_url.c — the URL rule (src/sources/url.c), SHA-256 and HMAC against
 * their standards' vectors (FIPS 180-4 examples, RFC 4231), SigV4 signing
 * against AWS's published examples (the SigV4 test suite's get-vanilla and
 * the S3 "GET Object" example of header-based auth), the signed headers of
 * an S3 request, and the refusals that name what is wrong. */
#include "check.h"
#include "ferry.h"
#include "sources/remote.h"
#include "sources/s3.h"
#include "sources/sigv4.h"
#include "sources/url.h"
#include <stdlib.h>
#include <unistd.h>

static const char *hex_of(const void *p, size_t n) {
    static char out[65];
    uint8_t d[32];
    ferry_sha256(p, n, d);
    ferry_hex32(d, out);
    return out;
}

static void test_sha256_vectors(void) {
    CHECK(!strcmp(hex_of("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    CHECK(!strcmp(hex_of("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    CHECK(!strcmp(hex_of(two, strlen(two)), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
    /* a million 'a', fed in uneven pieces (the buffering across blocks) */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    ferry_sha256_ctx s;
    ferry_sha256_init(&s);
    for (size_t off = 0, step = 1; off < 1000000; off += step, step = step * 3 % 1000 + 1)
        ferry_sha256_update(&s, a + off, off + step > 1000000 ? 1000000 - off : step);
    uint8_t d[32];
    char h[65];
    ferry_sha256_final(&s, d);
    ferry_hex32(d, h);
    CHECK(!strcmp(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
    free(a);
}

static void test_hmac_rfc4231(void) {
    uint8_t d[32];
    char h[65];
    ferry_hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, d);
    ferry_hex32(d, h);
    CHECK(!strcmp(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"));
    /* test case 6: a key longer than the block is hashed first */
    uint8_t key[131];
    memset(key, 0xaa, sizeof key);
    const char *msg = "Test Using Larger Than Block-Size Key - Hash Key First";
    ferry_hmac_sha256(key, sizeof key, msg, strlen(msg), d);
    ferry_hex32(d, h);
    CHECK(!strcmp(h, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"));
}

static const char *EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

static void test_sigv4_get_vanilla(void) {
    ferry_sigv4_header h[] = {{"host", "example.amazonaws.com"}, {"x-amz-date", "20150830T123600Z"}};
    ferry_sigv4_req r = {"GET", "/", "", h, 2, EMPTY, "20150830T123600Z", "us-east-1", "service",
                         "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"};
    char out[512];
    CHECK_EQ_I(ferry_sigv4_authorization(&r, out, sizeof out), 0);
    CHECK(!strcmp(out, "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
                       "SignedHeaders=host;x-amz-date, "
                       "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"));
    CHECK(ferry_sigv4_authorization(&r, out, 40) < 0);   /* too small: refused, not cut */
}

static void test_sigv4_s3_get_object_example(void) {
    ferry_sigv4_header h[] = {{"host", "examplebucket.s3.amazonaws.com"}, {"range", "bytes=0-9"},
                              {"x-amz-content-sha256", EMPTY}, {"x-amz-date", "20130524T000000Z"}};
    ferry_sigv4_req r = {"GET", "/test.txt", "", h, 4, EMPTY, "20130524T000000Z", "us-east-1", "s3",
                         "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"};
    char out[512];
    CHECK_EQ_I(ferry_sigv4_authorization(&r, out, sizeof out), 0);
    CHECK_STR_CONTAINS(out, "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

static void test_amz_date(void) {
    char d[17];
    ferry_amz_date((time_t)1369353600, d);   /* 2013-05-24 00:00:00 UTC */
    CHECK(!strcmp(d, "20130524T000000Z"));
}

static void test_schemes(void) {
    CHECK_EQ_I(ferry_url_scheme_of("/data/a.npy"), FERRY_URL_NONE);
    CHECK_EQ_I(ferry_url_scheme_of("a:b/c.npy"), FERRY_URL_NONE);
    CHECK_EQ_I(ferry_url_scheme_of("C://x"), FERRY_URL_OTHER);
    CHECK_EQ_I(ferry_url_scheme_of("S3://b/k"), FERRY_URL_S3);
    CHECK_EQ_I(ferry_url_scheme_of("gs://b/k"), FERRY_URL_GS);
    CHECK_EQ_I(ferry_url_scheme_of("https://h/k"), FERRY_URL_HTTPS);
    CHECK_EQ_I(ferry_url_scheme_of("file:///x"), FERRY_URL_FILE);
    CHECK(ferry_remote_is_url("s3://b/k") && ferry_remote_is_url("ftp://h/x"));
    CHECK(!ferry_remote_is_url("file:///x") && !ferry_remote_is_url("x.npy"));
}

static void test_s3_styles(void) {
    ferry_url u;
    /* AWS's own endpoint: virtual-hosted for DNS-safe names */
    ferry_url_env aws = {NULL, "eu-west-1", 0};
    CHECK_EQ_I(ferry_url_parse("s3://my-bucket/dir/a b+c%.npy", &aws, &u), 0);
    CHECK(!strcmp(u.host, "my-bucket.s3.eu-west-1.amazonaws.com"));
    CHECK(!strcmp(u.path, "/dir/a%20b%2Bc%25.npy"));
    CHECK(!strcmp(u.url, "https://my-bucket.s3.eu-west-1.amazonaws.com/dir/a%20b%2Bc%25.npy"));
    CHECK(!strcmp(u.key, "dir/a b+c%.npy") && !strcmp(u.bucket, "my-bucket") && u.virtual_host);
    ferry_url_free(&u);
    /* a dotted name: path style (the wildcard certificate does not cover it) */
    CHECK_EQ_I(ferry_url_parse("s3://my.bucket/k", &aws, &u), 0);
    CHECK(!strcmp(u.url, "https://s3.eu-west-1.amazonaws.com/my.bucket/k") && !u.virtual_host);
    ferry_url_free(&u);
    /* a custom endpoint (MinIO, moto): path style, its base path kept */
    ferry_url_env minio = {"http://127.0.0.1:9000/proxy/", NULL, 0};
    CHECK_EQ_I(ferry_url_parse("s3://data/x.npy", &minio, &u), 0);
    CHECK(!strcmp(u.url, "http://127.0.0.1:9000/proxy/data/x.npy"));
    CHECK(!strcmp(u.host, "127.0.0.1:9000") && !strcmp(u.path, "/proxy/data/x.npy") && !strcmp(u.region, "us-east-1"));
    ferry_url_free(&u);
    ferry_url_env forced = {"https://minio.example:9000", "x", 2};
    CHECK_EQ_I(ferry_url_parse("s3://data/x.npy", &forced, &u), 0);
    CHECK(!strcmp(u.url, "https://data.minio.example:9000/x.npy"));
    ferry_url_free(&u);
    /* gs: storage.googleapis.com, path style */
    CHECK_EQ_I(ferry_url_parse("gs://pub/era5/t.nc", NULL, &u), 0);
    CHECK(!strcmp(u.url, "https://storage.googleapis.com/pub/era5/t.nc"));
    ferry_url_free(&u);
}

static void test_http_and_file(void) {
    ferry_url u;
    CHECK_EQ_I(ferry_url_parse("https://h.example:8443/a/b.npy?x=1&y=2#frag", NULL, &u), 0);
    CHECK(!strcmp(u.host, "h.example:8443") && !strcmp(u.path, "/a/b.npy") && !strcmp(u.query, "x=1&y=2"));
    CHECK(!strcmp(u.url, "https://h.example:8443/a/b.npy?x=1&y=2"));
    ferry_url_free(&u);
    CHECK_EQ_I(ferry_url_parse("http://h", NULL, &u), 0);
    CHECK(!strcmp(u.url, "http://h/"));
    ferry_url_free(&u);
    CHECK_EQ_I(ferry_url_parse("file:///tmp/a%20b.npy", NULL, &u), 0);
    CHECK(!strcmp(u.key, "/tmp/a b.npy"));
    ferry_url_free(&u);
    CHECK_EQ_I(ferry_url_parse("file://localhost/x", NULL, &u), 0);
    CHECK(!strcmp(u.key, "/x"));
    ferry_url_free(&u);
}

static void refused(const char *s, const ferry_url_env *env, const char *words) {
    ferry_url u;
    CHECK(ferry_url_parse(s, env, &u) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), words);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), s);
    ferry_url_free(&u);
}

static void test_refusals(void) {
    refused("ftp://h/x", NULL, "\"ftp://\" is not read");
    refused("s3://bucket", NULL, "no bucket");
    refused("s3:///key", NULL, "no bucket");
    refused("s3://bucket/", NULL, "names a bucket, not an object");
    refused("s3://b$d/k", NULL, "bucket name");
    refused("http://", NULL, "no host");
    refused("http://user:pw@h/x", NULL, "user names");
    refused("http://h/a b", NULL, "spaces");
    refused("s3://b/a\nb", NULL, "control characters");
    refused("file://otherhost/x", NULL, "another host");
    refused("file:///a%00b", NULL, "%00");
    ferry_url_env bad = {"ftp://e", NULL, 0};
    refused("s3://b/k", &bad, "AWS_ENDPOINT_URL");
    ferry_url_env badregion = {NULL, "us-east-1.evil.com/x", 0};
    refused("s3://b/k", &badregion, "not a region name");
}

static void test_key_with_query_chars(void) {
    ferry_url u;
    CHECK_EQ_I(ferry_url_parse("s3://b/k?x#y", NULL, &u), 0);
    CHECK(!strcmp(u.path, "/b/k%3Fx%23y") && !strcmp(u.query, ""));   /* "b": too short a host label, path style */
    ferry_url_free(&u);
}

static void test_s3_signed_headers(void) {
    ferry_url u;
    ferry_url_env e = {NULL, "us-east-1", 0};
    CHECK_EQ_I(ferry_url_parse("s3://examplebucket/test.txt", &e, &u), 0);
    ferry_s3_auth a = {0};
    a.access = (char *)"AKIAIOSFODNN7EXAMPLE";
    a.secret = (char *)"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
    a.region = (char *)"us-east-1";
    a.service = "s3";
    ferry_s3_signed s;
    CHECK_EQ_I(ferry_s3_sign(&a, &u, "GET", "", (time_t)1369353600, &s), 0);
    CHECK_EQ_I(s.n, 3);
    CHECK(!strcmp(s.line[0], "x-amz-date: 20130524T000000Z"));
    CHECK_STR_CONTAINS(s.line[1], EMPTY);
    CHECK_STR_CONTAINS(s.line[2], "Authorization: AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
                                  "SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=");
    a.token = (char *)"TOKEN/with+chars=";
    CHECK_EQ_I(ferry_s3_sign(&a, &u, "GET", "", (time_t)1369353600, &s), 0);
    CHECK_EQ_I(s.n, 4);
    CHECK(!strcmp(s.line[2], "x-amz-security-token: TOKEN/with+chars="));
    CHECK_STR_CONTAINS(s.line[3], "SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token, ");
    a.access = NULL;   /* anonymous: nothing signed */
    CHECK_EQ_I(ferry_s3_sign(&a, &u, "GET", "", 0, &s), 0);
    CHECK_EQ_I(s.n, 0);
    ferry_url_free(&u);
}

static void test_s3_setup_from_env(void) {
    /* the shared files are not read for keys given in the environment */
    setenv("AWS_ACCESS_KEY_ID", "AKID", 1);
    unsetenv("AWS_SECRET_ACCESS_KEY");
    setenv("AWS_CONFIG_FILE", "/nonexistent", 1);
    setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent", 1);
    ferry_url u;
    ferry_s3_auth a;
    CHECK(ferry_s3_setup("s3://b/k", &u, &a) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "AWS_ACCESS_KEY_ID is set without AWS_SECRET_ACCESS_KEY");
    ferry_url_free(&u);
    setenv("AWS_SECRET_ACCESS_KEY", "SECRET", 1);
    setenv("AWS_SESSION_TOKEN", "TOK", 1);
    setenv("AWS_REGION", "ap-south-1", 1);
    setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1", 1);
    CHECK_EQ_I(ferry_s3_setup("s3://b/k", &u, &a), 0);
    CHECK(!strcmp(a.access, "AKID") && !strcmp(a.secret, "SECRET") && !strcmp(a.token, "TOK"));
    CHECK(!strcmp(a.region, "ap-south-1") && !strcmp(u.url, "http://127.0.0.1:1/b/k"));
    ferry_s3_auth_free(&a);
    ferry_url_free(&u);
    setenv("FERRY_S3_ADDRESSING", "sideways", 1);
    CHECK(ferry_s3_setup("s3://b/k", &u, &a) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "FERRY_S3_ADDRESSING");
    ferry_url_free(&u);
    unsetenv("FERRY_S3_ADDRESSING");
    /* no keys anywhere: anonymous */
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_SESSION_TOKEN");
    unsetenv("AWS_PROFILE");
    CHECK_EQ_I(ferry_s3_setup("s3://b/k", &u, &a), 0);
    CHECK(!a.access && !a.secret && !a.token && !strcmp(a.source, "anonymous"));
    ferry_s3_auth_free(&a);
    ferry_url_free(&u);
    unsetenv("AWS_REGION");
    unsetenv("AWS_ENDPOINT_URL");
}

static void test_knobs(void) {
    setenv("FERRY_REMOTE_REQUEST_SIZE", "1K", 1);
    CHECK(ferry_remote_check_env() < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "FERRY_REMOTE_REQUEST_SIZE");
    setenv("FERRY_REMOTE_REQUEST_SIZE", "16M", 1);
    setenv("FERRY_REMOTE_CONNECTIONS", "many", 1);
    CHECK(ferry_remote_check_env() < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "FERRY_REMOTE_CONNECTIONS");
    unsetenv("FERRY_REMOTE_CONNECTIONS");
    CHECK_EQ_I(ferry_remote_check_env(), 0);
    unsetenv("FERRY_REMOTE_REQUEST_SIZE");
    /* and ferry_ctx_create refuses them */
    setenv("FERRY_REMOTE_RETRIES", "-1", 1);
    ferry_ctx *ctx = NULL;
    CHECK(ferry_ctx_create(&ctx, NULL) < 0);
    unsetenv("FERRY_REMOTE_RETRIES");
}

static void test_file_open_refusals(void) {
    ferry_ctx *ctx;
    CHECK_EQ_I(ferry_ctx_create(&ctx, NULL), 0);
    ferry_file *f = NULL;
    CHECK(ferry_file_open(ctx, "ftp://h/x.npy", FERRY_READ, &f) < 0 && !f);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "ftp://");
    CHECK_EQ_I(ferry_file_open(ctx, "s3://b/k", FERRY_READ | FERRY_WRITE, &f), FERRY_EUNSUPPORTED);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "read-only");
    /* file:// is the local file */
    char path[] = "/tmp/ferry_test_urlXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK_EQ_I(write(fd, "hello", 5), 5);
    close(fd);
    char url[64];
    snprintf(url, sizeof url, "file://%s", path);
    CHECK_EQ_I(ferry_file_open(ctx, url, FERRY_READ, &f), 0);
    if (f) {
        char buf[8] = {0};
        CHECK_EQ_I(ferry_pread(f, ferry_host_buf(buf, 5), 0, 5, 0), 5);
        CHECK(!memcmp(buf, "hello", 5));
        CHECK(!strcmp(ferry_file_path(f), url));
        ferry_file_close(f);
    }
    unlink(path);
    ferry_ctx_destroy(ctx);
}

int main(void) {
    RUN(test_sha256_vectors);
    RUN(test_hmac_rfc4231);
    RUN(test_sigv4_get_vanilla);
    RUN(test_sigv4_s3_get_object_example);
    RUN(test_amz_date);
    RUN(test_schemes);
    RUN(test_s3_styles);
    RUN(test_http_and_file);
    RUN(test_refusals);
    RUN(test_key_with_query_chars);
    RUN(test_s3_signed_headers);
    RUN(test_s3_setup_from_env);
    RUN(test_knobs);
    RUN(test_file_open_refusals);
    return check_summary();
}
