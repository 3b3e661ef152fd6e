/* test_images.c — the image decoders (ferry_image_*): JPEGs made here with
 * TurboJPEG's compressor and decoded both by ferry and by TurboJPEG directly
 * (the same pixels), PNGs made with libspng's encoder; truncated and damaged
 * images refused with a message; batches on threads name the failing image.
 * Each part reports a skip in a build without its library. */
#include "check.h"
#include "ferry_experimental.h"
#ifdef FERRY_HAVE_TURBOJPEG
#include <turbojpeg.h>
#endif
#ifdef FERRY_HAVE_SPNG
#include <spng.h>
#endif

static uint8_t *gradient(int w, int h, int ch) {
    uint8_t *p = malloc((size_t)w * h * ch);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++) p[((size_t)y * w + x) * ch + c] = (uint8_t)(x * 7 + y * 3 + c * 50);
    return p;
}

static void test_sniff(void) {
    CHECK_EQ_I(ferry_image_sniff("\xFF\xD8\xFF\xE0", 4), FERRY_IMAGE_JPEG);
    CHECK_EQ_I(ferry_image_sniff("\x89PNG\r\n\x1a\n", 8), FERRY_IMAGE_PNG);
    CHECK_EQ_I(ferry_image_sniff("GIF89a", 6), FERRY_IMAGE_UNKNOWN);
    CHECK_EQ_I(ferry_image_sniff("\xFF\xD8", 2), FERRY_IMAGE_UNKNOWN);
    ferry_image_info in;
    CHECK_EQ_I(ferry_image_probe("GIF89a", 6, &in), FERRY_EUNSUPPORTED);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "not a JPEG or PNG");
}

#ifdef FERRY_HAVE_TURBOJPEG
static unsigned char *jpeg_make(int w, int h, int ch, int subsamp, int flags, unsigned long *size) {
    tjhandle t = tjInitCompress();
    uint8_t *src = gradient(w, h, ch);
    unsigned char *out = NULL;
    *size = 0;
    int rc = tjCompress2(t, src, w, w * ch, h, ch == 1 ? TJPF_GRAY : TJPF_RGB, &out, size, subsamp, 90, flags);
    free(src);
    tjDestroy(t);
    return rc == 0 ? out : NULL;
}

static void test_jpeg_same_pixels_as_turbojpeg(void) {
    struct { int ch, sub, flags, want_sub; } cases[] = {
        {3, TJSAMP_420, 0, 420}, {3, TJSAMP_422, 0, 422}, {3, TJSAMP_444, 0, 444},
        {3, TJSAMP_420, TJFLAG_PROGRESSIVE, 420}, {1, TJSAMP_GRAY, 0, 400}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        unsigned long n;
        unsigned char *j = jpeg_make(45, 31, cases[k].ch, cases[k].sub, cases[k].flags, &n);
        CHECK(j != NULL);
        if (!j) continue;
        ferry_image_info in;
        CHECK_EQ_I(ferry_image_probe(j, n, &in), 0);
        CHECK_EQ_I(in.width, 45);
        CHECK_EQ_I(in.height, 31);
        CHECK_EQ_I(in.subsampling, cases[k].want_sub);
        CHECK_EQ_I(in.progressive, (cases[k].flags & TJFLAG_PROGRESSIVE) != 0);
        CHECK_EQ_I(in.channels, cases[k].ch);
        static uint8_t got[45 * 31 * 3], want[45 * 31 * 3];
        CHECK_EQ_I(ferry_image_decode(j, n, got, sizeof got, 0, NULL), 45 * 31 * 3);
        tjhandle d = tjInitDecompress();
        CHECK_EQ_I(tjDecompress2(d, j, n, want, 45, 45 * 3, 31, TJPF_RGB, TJFLAG_ACCURATEDCT), 0);
        CHECK(!memcmp(got, want, sizeof got));
        if (cases[k].ch == 1) {
            CHECK_EQ_I(ferry_image_decode(j, n, got, sizeof got, FERRY_IMAGE_KEEP_GRAY, NULL), 45 * 31);
            CHECK_EQ_I(tjDecompress2(d, j, n, want, 45, 45, 31, TJPF_GRAY, TJFLAG_ACCURATEDCT), 0);
            CHECK(!memcmp(got, want, 45 * 31));
        }
        tjDestroy(d);
        /* too small a buffer: refused before decoding */
        CHECK_EQ_I(ferry_image_decode(j, n, got, 100, 0, NULL), FERRY_EINVAL);
        CHECK_STR_CONTAINS(ferry_errmsg(NULL), "needs 4185 bytes");
        tjFree(j);
    }
}

static void test_jpeg_corrupt_is_an_error(void) {
    unsigned long n;
    unsigned char *j = jpeg_make(64, 48, 3, TJSAMP_420, 0, &n);
    static uint8_t out[64 * 48 * 3];
    /* truncated in the scan: libjpeg's "premature end" warning is an error */
    CHECK_EQ_I(ferry_image_decode(j, n - 40, out, sizeof out, 0, NULL), FERRY_ECODEC);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "jpeg");
    /* truncated in the headers */
    CHECK_EQ_I(ferry_image_decode(j, 100, out, sizeof out, 0, NULL), FERRY_ECODEC);
    /* and a good one decodes after the failures (a fresh decompressor) */
    CHECK_EQ_I(ferry_image_decode(j, n, out, sizeof out, 0, NULL), (int64_t)sizeof out);
    /* a segment length past the end */
    uint8_t *bad = malloc(n);
    memcpy(bad, j, n);
    bad[4] = 0xFF;
    bad[5] = 0xF0;
    CHECK_EQ_I(ferry_image_probe(bad, n, &(ferry_image_info){0}), FERRY_ECODEC);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "past the end");
    free(bad);
    tjFree(j);
}

static void test_batch_names_the_failing_image(void) {
    enum { N = 12 };
    unsigned long n;
    unsigned char *j = jpeg_make(40, 30, 3, TJSAMP_422, 0, &n);
    static uint8_t out[N][40 * 30 * 3], ref[40 * 30 * 3];
    ferry_image_job jobs[N];
    char labels[N][32];
    for (int i = 0; i < N; i++) {
        snprintf(labels[i], sizeof labels[i], "sample-%02d.jpg", i);
        jobs[i] = (ferry_image_job){.data = j, .size = n, .dst = out[i], .cap = sizeof out[i], .label = labels[i]};
    }
    CHECK_EQ_I(ferry_image_decode_batch(jobs, N, 0, 4), N);
    CHECK_EQ_I(ferry_image_decode(j, n, ref, sizeof ref, 0, NULL), (int64_t)sizeof ref);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_I(jobs[i].result, (int64_t)sizeof ref);
        CHECK(!memcmp(out[i], ref, sizeof ref));
        CHECK_EQ_I(jobs[i].info.width, 40);
    }
    jobs[9].size = n / 2;
    jobs[5].size = n - 30;
    CHECK_EQ_I(ferry_image_decode_batch(jobs, N, 0, 3), FERRY_ECODEC);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "sample-05.jpg: jpeg");   /* the first failing one */
    CHECK(jobs[9].result < 0 && jobs[4].result > 0 && jobs[11].result > 0);
    CHECK_EQ_I(ferry_image_decode_batch(jobs, 0, 0, 0), 0);
    CHECK_EQ_I(ferry_image_decode_batch(NULL, 1, 0, 0), FERRY_EINVAL);
    tjFree(j);
}
#endif

#ifdef FERRY_HAVE_SPNG
static void *png_make(int w, int h, int color_type, int depth, size_t *size) {
    int ch = color_type == SPNG_COLOR_TYPE_GRAYSCALE ? 1 : color_type == SPNG_COLOR_TYPE_TRUECOLOR ? 3 : 4;
    uint8_t *px = gradient(w, h, ch * depth / 8);
    spng_ctx *c = spng_ctx_new(SPNG_CTX_ENCODER);
    spng_set_option(c, SPNG_ENCODE_TO_BUFFER, 1);
    struct spng_ihdr ih = {.width = (uint32_t)w, .height = (uint32_t)h, .bit_depth = (uint8_t)depth,
                           .color_type = (uint8_t)color_type};
    spng_set_ihdr(c, &ih);
    int e = spng_encode_image(c, px, (size_t)w * h * ch * depth / 8, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    void *out = e ? NULL : spng_get_png_buffer(c, size, &e);
    spng_ctx_free(c);
    free(px);
    return out;
}

static void test_png(void) {
    size_t n;
    uint8_t *p = png_make(21, 13, SPNG_COLOR_TYPE_TRUECOLOR, 8, &n);
    CHECK(p != NULL);
    if (!p) return;
    ferry_image_info in;
    CHECK_EQ_I(ferry_image_probe(p, n, &in), 0);
    CHECK_EQ_I(in.format, FERRY_IMAGE_PNG);
    CHECK_EQ_I(in.width, 21);
    CHECK_EQ_I(in.channels, 3);
    static uint8_t out[21 * 13 * 3];
    uint8_t *want = gradient(21, 13, 3);
    CHECK_EQ_I(ferry_image_decode(p, n, out, sizeof out, 0, NULL), (int64_t)sizeof out);
    CHECK(!memcmp(out, want, sizeof out));
    /* RGBA: the alpha dropped, the colours kept */
    size_t n4;
    uint8_t *p4 = png_make(21, 13, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA, 8, &n4);
    uint8_t *rgba = gradient(21, 13, 4);
    CHECK_EQ_I(ferry_image_decode(p4, n4, out, sizeof out, 0, NULL), (int64_t)sizeof out);
    int same = 1;
    for (int i = 0; i < 21 * 13; i++) same &= !memcmp(out + 3 * i, rgba + 4 * i, 3);
    CHECK(same);
    /* gray, one channel kept */
    size_t ng;
    uint8_t *pg = png_make(21, 13, SPNG_COLOR_TYPE_GRAYSCALE, 8, &ng);
    uint8_t *g = gradient(21, 13, 1);
    CHECK_EQ_I(ferry_image_decode(pg, ng, out, sizeof out, FERRY_IMAGE_KEEP_GRAY, NULL), 21 * 13);
    CHECK(!memcmp(out, g, 21 * 13));
    /* damaged: truncated, and one flipped bit (the CRC) */
    CHECK_EQ_I(ferry_image_decode(p, n / 2, out, sizeof out, 0, NULL), FERRY_ECODEC);
    p[n / 2] ^= 0x08;
    CHECK(ferry_image_decode(p, n, out, sizeof out, 0, NULL) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "png");
    free(p); free(p4); free(pg); free(want); free(rgba); free(g);
}
#endif

int main(void) {
    RUN(test_sniff);
#ifdef FERRY_HAVE_TURBOJPEG
    RUN(test_jpeg_same_pixels_as_turbojpeg);
    RUN(test_jpeg_corrupt_is_an_error);
    RUN(test_batch_names_the_failing_image);
#else
    printf("skipped: JPEG (built without libturbojpeg)\n");
#endif
#ifdef FERRY_HAVE_SPNG
    RUN(test_png);
#else
    printf("skipped: PNG (built without libspng)\n");
#endif
    return check_summary();
}
