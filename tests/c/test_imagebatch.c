/* test_imagebatch.c — ferry_image_batch into host memory (the CPU path):
 * JPEGs (4:2:0, 4:4:4, 4:1:1, gray, progressive, CMYK) and a PNG of different sizes,
 * each row equal byte for byte to ferry_image_decode + the transform of the
 * box drawn from (seed, epoch, sample), for every crop mode, layout and
 * dtype; the same call again gives the same rows, another epoch other ones.
 * Truncated and corrupt images: RAISE names the shard file, the key and the
 * member; SKIP closes the rows up and reports the positions; the context's
 * stats count them. Arguments that cannot work are refused with a reason. */
#include "imagebatch_check.h"
#ifdef IB_HAVE_CODECS

static ferry_ctx *ctx_;
static char dir_[] = "/tmp/ferry-test-imagebatch-XXXXXX";
enum { N = 9 };
static ib_image im_[N];
static ferry_shards *set_;

static void setup(void) {
    static const struct { int kind, w, h; } spec[N] = {
        {IB_BASELINE, 67, 45}, {IB_444, 40, 64}, {IB_GRAY, 33, 31}, {IB_PROGRESSIVE, 80, 60},
        {IB_CMYK, 24, 30}, {IB_PNG, 50, 37}, {IB_BASELINE, 1, 1}, {IB_BASELINE, 300, 200}, {IB_411, 48, 40}};
    const char *paths[N];
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "img%02d", i);   /* "files" sets keep the given order */
        ib_make(&im_[i], spec[i].kind, spec[i].w, spec[i].h, 7u + (unsigned)i);
        ib_write(&im_[i], dir_, name);
        paths[i] = im_[i].path;
    }
    if (ferry_shards_open(ctx_, paths, N, "files", &set_) < 0) printf("open: %s\n", ferry_errmsg(ctx_));
}

static ferry_image_batch_args args(const int64_t *samples, size_t n, void *dst, size_t cap) {
    ferry_image_batch_args a;
    memset(&a, 0, sizeof a);
    a.shards = set_;
    a.samples = samples;
    a.n = n;
    a.xf.height = 24;
    a.xf.width = 32;
    a.xf.crop = FERRY_IMAGE_CROP_RANDOM_RESIZED;
    a.xf.flip = 0.5;
    a.xf.layout = FERRY_IMAGE_CHW;
    a.xf.dtype = FERRY_DT_U8;
    a.seed = 5;
    a.epoch = 1;
    a.dst = ferry_host_buf(dst, cap);
    a.decode = FERRY_DECODE_CPU;
    a.threads = 3;
    return a;
}

/* every row against the CPU path's */
static int rows_match(const ferry_image_batch_args *a, const uint8_t *got, const int64_t *samples, size_t n) {
    size_t rb = ib_row_bytes(&a->xf);
    uint8_t *want = malloc(rb);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (ib_expected(a, &im_[samples[i]], samples[i], want) < 0 || memcmp(want, got + i * rb, rb)) {
            printf("  row %zu (sample %lld) differs from the CPU path\n", i, (long long)samples[i]);
            bad++;
        }
    }
    free(want);
    return bad == 0;
}

static void check_mode(ferry_image_crop crop, ferry_image_layout layout, ferry_dtype dt, int norm) {
    int64_t s[N + 2] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 3, 0};   /* repeats allowed */
    size_t n = N + 2;
    ferry_image_batch_args a = args(s, n, NULL, 0);
    a.xf.crop = crop;
    a.xf.layout = layout;
    a.xf.dtype = dt;
    if (norm) {
        float m[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
        memcpy(a.xf.mean, m, sizeof m);
        memcpy(a.xf.std, sd, sizeof sd);
    }
    size_t rb = ib_row_bytes(&a.xf);
    uint8_t *out = calloc(n, rb);
    a.dst = ferry_host_buf(out, n * rb);
    ferry_image_batch_stats st;
    memset(&st, 0, sizeof st);
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, &st), (int64_t)n);
    CHECK_EQ_I(st.written, n);
    CHECK_EQ_I(st.cpu, n);
    CHECK_EQ_I(st.gpu, 0);
    CHECK_EQ_I(st.nskipped, 0);
    CHECK(rows_match(&a, out, s, n));
    free(out);
}

static void test_random_resized_u8_chw(void) { check_mode(FERRY_IMAGE_CROP_RANDOM_RESIZED, FERRY_IMAGE_CHW, FERRY_DT_U8, 0); }
static void test_random_resized_bf16_hwc_normalised(void) {
    check_mode(FERRY_IMAGE_CROP_RANDOM_RESIZED, FERRY_IMAGE_HWC, FERRY_DT_BF16, 1);
}
static void test_center_f32(void) { check_mode(FERRY_IMAGE_CROP_CENTER, FERRY_IMAGE_CHW, FERRY_DT_F32, 1); }
static void test_resize_f16(void) { check_mode(FERRY_IMAGE_CROP_RESIZE, FERRY_IMAGE_HWC, FERRY_DT_F16, 0); }

static void test_center_box_is_the_largest_of_the_output_aspect(void) {
    int64_t s[1] = {0};   /* 67 wide, 45 high, to 24 x 32: a 45 x 60 box at x round(3.5) = 4, as torchvision */
    ferry_image_batch_args a = args(s, 1, NULL, 0);
    a.xf.crop = FERRY_IMAGE_CROP_CENTER;
    ferry_img_sample b = ib_box(&a, 0, 45, 67);
    CHECK_EQ_I(b.box.h, 45);
    CHECK_EQ_I(b.box.w, 60);
    CHECK_EQ_I(b.box.x, 4);
    CHECK_EQ_I(b.box.y, 0);
}

static void test_same_draws_again_other_epoch_differs(void) {
    int64_t s[4] = {7, 3, 0, 1};
    ferry_image_batch_args a = args(s, 4, NULL, 0);
    size_t rb = ib_row_bytes(&a.xf);
    uint8_t *x = malloc(4 * rb), *y = malloc(4 * rb), *z = malloc(4 * rb);
    a.dst = ferry_host_buf(x, 4 * rb);
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), 4);
    a.dst = ferry_host_buf(y, 4 * rb);
    a.threads = 1;
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), 4);
    CHECK(memcmp(x, y, 4 * rb) == 0);
    a.epoch = 2;
    a.dst = ferry_host_buf(z, 4 * rb);
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), 4);
    CHECK(memcmp(x, z, 4 * rb) != 0);
    free(x);
    free(y);
    free(z);
}

static void test_no_crop_needs_the_output_size(void) {
    int64_t s[2] = {2, 6};   /* 33 x 31 and 1 x 1 */
    ferry_image_batch_args a = args(s, 2, NULL, 0);
    a.xf.crop = FERRY_IMAGE_CROP_NONE;
    a.xf.height = 31;
    a.xf.width = 33;
    size_t rb = ib_row_bytes(&a.xf);
    uint8_t *out = malloc(2 * rb);
    a.dst = ferry_host_buf(out, 2 * rb);
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "pass a crop or resize");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "img06.jpg");
    a.on_error = FERRY_ON_ERROR_SKIP;   /* the arguments are wrong, not the image: still an error */
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "pass a crop or resize");
    a.on_error = FERRY_ON_ERROR_RAISE;
    a.n = 1;
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), 1);
    CHECK(rows_match(&a, out, s, 1));
    free(out);
}

/* a copy of image k with bytes changed, as its own one-sample shard */
static ferry_shards *damaged(int k, const char *name, int truncate) {
    ib_image d = im_[k];
    d.data = malloc(d.size);
    memcpy(d.data, im_[k].data, d.size);
    if (truncate) d.size = d.size * 2 / 3;
    else
        for (size_t i = d.size / 2; i < d.size / 2 + 40 && i + 2 < d.size; i++) d.data[i] = 0xFF;   /* a run of markers in the scan */
    ib_write(&d, dir_, name);
    free(d.data);
    const char *paths[N + 1];
    for (int i = 0; i < N; i++) paths[i] = im_[i].path;
    paths[N] = d.path;
    ferry_shards *s = NULL;
    CHECK_EQ_I(ferry_shards_open(ctx_, paths, N + 1, "files", &s), 0);
    return s;
}

static void test_corrupt_raise_names_file_key_member(void) {
    for (int trunc = 1; trunc >= 0; trunc--) {
        ferry_shards *s = damaged(7, trunc ? "cut" : "flipped", trunc);
        int64_t smp[3] = {0, N, 1};
        ferry_image_batch_args a = args(smp, 3, NULL, 0);
        a.shards = s;
        size_t rb = ib_row_bytes(&a.xf);
        uint8_t *out = malloc(3 * rb);
        a.dst = ferry_host_buf(out, 3 * rb);
        CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), FERRY_ECODEC);
        const char *m = ferry_errmsg(ctx_);
        CHECK_STR_CONTAINS(m, trunc ? "/cut.jpg" : "/flipped.jpg");
        CHECK_STR_CONTAINS(m, trunc ? "sample \"" : "member \"jpg\"");
        CHECK_STR_CONTAINS(m, "member \"jpg\"");
        free(out);
        ferry_shards_close(s);
    }
}

static void test_corrupt_skip_closes_rows_up(void) {
    ferry_shards *s = damaged(7, "cut2", 1);
    int64_t smp[5] = {3, N, 1, N, 5};
    ferry_image_batch_args a = args(smp, 5, NULL, 0);
    a.shards = s;
    a.on_error = FERRY_ON_ERROR_SKIP;
    size_t rb = ib_row_bytes(&a.xf);
    uint8_t *out = malloc(5 * rb);
    a.dst = ferry_host_buf(out, 5 * rb);
    size_t skipped[5];
    ferry_image_batch_stats st;
    memset(&st, 0, sizeof st);
    st.skipped = skipped;
    ferry_stats before, after;
    ferry_stats_get(ctx_, &before);
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, &st), 3);
    ferry_stats_get(ctx_, &after);
    CHECK_EQ_I(st.written, 3);
    CHECK_EQ_I(st.nskipped, 2);
    CHECK_EQ_I(skipped[0], 1);
    CHECK_EQ_I(skipped[1], 3);
    CHECK_EQ_I(after.image_skipped - before.image_skipped, 2);
    CHECK_EQ_I(after.image_cpu - before.image_cpu, 3);
    int64_t kept[3] = {3, 1, 5};
    CHECK(rows_match(&a, out, kept, 3));
    free(out);
    ferry_shards_close(s);
}

static void test_member_by_name(void) {
    int64_t s[2] = {0, 5};
    ferry_image_batch_args a = args(s, 2, NULL, 0);
    size_t rb = ib_row_bytes(&a.xf);
    uint8_t *out = malloc(2 * rb);
    a.dst = ferry_host_buf(out, 2 * rb);
    a.member = "jpg";
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), FERRY_ENOTFOUND);   /* sample 5 is a PNG */
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "img05.png: sample");   /* the shard, the key */
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "member \"jpg\"");
    a.n = 1;
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), 1);
    free(out);
}

static void test_refusals(void) {
    int64_t s[2] = {0, 1};
    ferry_image_batch_args a = args(s, 2, NULL, 0);
    size_t rb = ib_row_bytes(&a.xf);
    uint8_t *out = malloc(2 * rb);
    a.dst = ferry_host_buf(out, 2 * rb - 1);
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "do not fit");
    a.dst = ferry_host_buf(out, 2 * rb);
    a.decode = FERRY_DECODE_GPU;
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), FERRY_EPATH);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "device destination");
    a.decode = FERRY_DECODE_CPU;
    a.xf.mean[0] = 0.5f;
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), FERRY_EINVAL);
    a.xf.mean[0] = 0;
    a.xf.flip = 2;
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), FERRY_EINVAL);
    a.xf.flip = 0;
    int64_t far[1] = {N + 5};
    a.samples = far;
    a.n = 1;
    CHECK(ferry_image_batch(ctx_, &a, NULL) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx_), "sample 14");
    a.n = 0;
    CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), 0);
    CHECK(ferry_image_fallback_name(FERRY_IMAGE_FB_CMYK) && !strcmp(ferry_image_fallback_name(FERRY_IMAGE_FB_CMYK), "cmyk"));
    CHECK(ferry_image_fallback_name(FERRY_IMAGE_FB_COUNT_) == NULL);
    free(out);
}

#endif

int main(void) {
#ifndef IB_HAVE_CODECS
    printf("skipped: built without libturbojpeg or libspng\n0 passed, 0 failed, 1 skipped\n");
    return 0;
#else
    if (ferry_ctx_create(&ctx_, NULL) != 0 || !mkdtemp(dir_)) return 1;
    setup();
    if (!set_) return 1;
    RUN(test_random_resized_u8_chw);
    RUN(test_random_resized_bf16_hwc_normalised);
    RUN(test_center_f32);
    RUN(test_resize_f16);
    RUN(test_center_box_is_the_largest_of_the_output_aspect);
    RUN(test_same_draws_again_other_epoch_differs);
    RUN(test_no_crop_needs_the_output_size);
    RUN(test_corrupt_raise_names_file_key_member);
    RUN(test_corrupt_skip_closes_rows_up);
    RUN(test_member_by_name);
    RUN(test_refusals);
    ferry_shards_close(set_);
    for (int i = 0; i < N; i++) {
        unlink(im_[i].path);
        free(im_[i].data);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir_);
    if (system(cmd) != 0) printf("could not remove %s\n", dir_);
    ferry_ctx_destroy(ctx_);
    return check_summary();
#endif
}
