/* test_imagexform.c — the image transform after decode (codecs/imagexform.c):
 * an identity box gives the image back, a flip mirrors it, a flat image stays
 * flat through any crop and scale, the layouts and element types hold the same
 * values, normalisation is (v / 255 - mean) / std, the half and bfloat16
 * conversions round to nearest even, RandomResizedCrop's boxes are
 * reproducible from (seed, epoch, sample) and inside the image, and bad boxes
 * are refused by name. (tests/python/test_imagexform.py compares with
 * torchvision; tests/gpu/test_gpu_imagexform.c the GPU kernel with this.) */
#include "check.h"
#include "codecs/imagexform.h"
#include <math.h>
#include <stdlib.h>

static uint8_t img_[64 * 48 * 3];

static void fill(uint32_t h, uint32_t w, uint32_t c) {
    for (size_t i = 0; i < (size_t)h * w * c; i++) img_[i] = (uint8_t)((i * 37 + (i / (w * c)) * 11) & 0xff);
}

static void test_identity_and_flip(void) {
    fill(48, 64, 3);
    ferry_img_out o = {48, 64, 3, FERRY_IMG_HWC, FERRY_DT_U8, {0}, {0}};
    ferry_img_sample s = {{0, 0, 48, 64}, 0};
    uint8_t out[64 * 48 * 3];
    CHECK_EQ_I(ferry_img_transform(img_, 48, 64, 64 * 3, &s, &o, out), 0);
    CHECK(!memcmp(out, img_, sizeof out));
    s.flip = 1;
    CHECK_EQ_I(ferry_img_transform(img_, 48, 64, 64 * 3, &s, &o, out), 0);
    int ok = 1;
    for (uint32_t y = 0; y < 48; y++)
        for (uint32_t x = 0; x < 64; x++)
            for (uint32_t c = 0; c < 3; c++) ok &= out[(y * 64 + x) * 3 + c] == img_[(y * 64 + 63 - x) * 3 + c];
    CHECK(ok);
    /* a box: the identity of its pixels */
    ferry_img_out ob = {10, 20, 3, FERRY_IMG_HWC, FERRY_DT_U8, {0}, {0}};
    ferry_img_sample sb = {{5, 7, 10, 20}, 0};
    CHECK_EQ_I(ferry_img_transform(img_, 48, 64, 64 * 3, &sb, &ob, out), 0);
    ok = 1;
    for (uint32_t y = 0; y < 10; y++)
        for (uint32_t x = 0; x < 60; x++) ok &= out[y * 60 + x] == img_[(5 + y) * 64 * 3 + 7 * 3 + x];
    CHECK(ok);
}

static void test_flat_stays_flat(void) {
    memset(img_, 173, sizeof img_);
    uint32_t sizes[][2] = {{1, 1}, {7, 3}, {48, 64}, {200, 150}};
    for (int k = 0; k < 4; k++) {
        ferry_img_out o = {sizes[k][0], sizes[k][1], 3, FERRY_IMG_CHW, FERRY_DT_U8, {0}, {0}};
        ferry_img_sample s = {{3, 9, 31, 40}, k & 1};
        uint8_t *out = malloc(ferry_img_out_bytes(&o));
        CHECK_EQ_I(ferry_img_transform(img_, 48, 64, 64 * 3, &s, &o, out), 0);
        int ok = 1;
        for (size_t i = 0; i < ferry_img_out_bytes(&o); i++) ok &= out[i] == 173;
        CHECK(ok);
        free(out);
    }
}

static void test_layouts_and_types(void) {
    fill(48, 64, 3);
    ferry_img_sample s = {{2, 3, 40, 50}, 1};
    ferry_img_out hwc = {24, 30, 3, FERRY_IMG_HWC, FERRY_DT_U8, {0}, {0}};
    ferry_img_out chw = hwc;
    chw.layout = FERRY_IMG_CHW;
    uint8_t a[24 * 30 * 3], b[24 * 30 * 3];
    CHECK_EQ_I(ferry_img_transform(img_, 48, 64, 64 * 3, &s, &hwc, a), 0);
    CHECK_EQ_I(ferry_img_transform(img_, 48, 64, 64 * 3, &s, &chw, b), 0);
    int ok = 1;
    for (int y = 0; y < 24; y++)
        for (int x = 0; x < 30; x++)
            for (int c = 0; c < 3; c++) ok &= a[(y * 30 + x) * 3 + c] == b[(c * 24 + y) * 30 + x];
    CHECK(ok);
    ferry_img_out f = chw;
    f.dtype = FERRY_DT_F32;
    f.mean[0] = 0.485f; f.mean[1] = 0.456f; f.mean[2] = 0.406f;
    f.std[0] = 0.229f; f.std[1] = 0.224f; f.std[2] = 0.225f;
    float fo[24 * 30 * 3];
    CHECK_EQ_I(ferry_img_transform(img_, 48, 64, 64 * 3, &s, &f, fo), 0);
    ok = 1;
    for (int i = 0; i < 24 * 30 * 3; i++) {
        int c = i / (24 * 30);
        float want = ((float)b[i] / 255.0f - f.mean[c]) / f.std[c];
        ok &= fo[i] == want;
    }
    CHECK(ok);
    uint16_t bf[24 * 30 * 3], hf[24 * 30 * 3];
    f.dtype = FERRY_DT_BF16;
    CHECK_EQ_I(ferry_img_transform(img_, 48, 64, 64 * 3, &s, &f, bf), 0);
    f.dtype = FERRY_DT_F16;
    CHECK_EQ_I(ferry_img_transform(img_, 48, 64, 64 * 3, &s, &f, hf), 0);
    ok = 1;
    for (int i = 0; i < 24 * 30 * 3; i++) ok &= bf[i] == ferry_img_f32_to_bf16(fo[i]) && hf[i] == ferry_img_f32_to_f16(fo[i]);
    CHECK(ok);
}

static void test_half_and_bfloat16(void) {
    CHECK_EQ_I(ferry_img_f32_to_f16(1.0f), 0x3c00);
    CHECK_EQ_I(ferry_img_f32_to_f16(-2.0f), 0xc000);
    CHECK_EQ_I(ferry_img_f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ_I(ferry_img_f32_to_f16(1e6f), 0x7c00);
    CHECK_EQ_I(ferry_img_f32_to_f16(5.9604645e-8f), 0x0001);     /* the smallest subnormal */
    CHECK_EQ_I(ferry_img_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* a tie: to even */
    CHECK_EQ_I(ferry_img_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
    CHECK_EQ_I(ferry_img_f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_I(ferry_img_f32_to_bf16(-0.0f), 0x8000);
    CHECK_EQ_I(ferry_img_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);  /* a tie: to even */
    CHECK_EQ_I(ferry_img_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    CHECK(ferry_img_f32_to_bf16(NAN) & 0x7f);                       /* NaN stays NaN */
}

static void test_random_resized_crop(void) {
    ferry_img_box a, b;
    int differ = 0;
    for (uint64_t i = 0; i < 200; i++) {
        CHECK_EQ_I(ferry_img_random_resized_crop(5, 1, i, 375, 500, 0.08, 1.0, 0.75, 4.0 / 3, &a), 0);
        CHECK_EQ_I(ferry_img_random_resized_crop(5, 1, i, 375, 500, 0.08, 1.0, 0.75, 4.0 / 3, &b), 0);
        CHECK(!memcmp(&a, &b, sizeof a));
        CHECK(a.h >= 1 && a.w >= 1 && a.y + a.h <= 375 && a.x + a.w <= 500);
        double area = (double)a.h * a.w / (375.0 * 500.0), r = (double)a.w / a.h;
        CHECK(area >= 0.07 && area <= 1.0 && r > 0.7 && r < 1.4);
        CHECK_EQ_I(ferry_img_random_resized_crop(5, 2, i, 375, 500, 0.08, 1.0, 0.75, 4.0 / 3, &b), 0);
        differ += memcmp(&a, &b, sizeof a) != 0;
    }
    CHECK(differ > 190);   /* another epoch, other boxes */
    /* no box can have that ratio: the centred fallback, ratio clamped */
    CHECK_EQ_I(ferry_img_random_resized_crop(1, 0, 0, 10, 1000, 0.9, 1.0, 1.0, 1.0, &a), 0);
    CHECK(a.h == 10 && a.w == 10 && a.x == 495 && a.y == 0);
    CHECK(ferry_img_random_resized_crop(1, 0, 0, 10, 10, 0.5, 0.1, 1, 1, &a) == FERRY_EINVAL);
    int heads = 0;
    for (uint64_t i = 0; i < 1000; i++) heads += ferry_img_flip_draw(3, 0, i, 0.5);
    CHECK(heads > 430 && heads < 570);
    ferry_img_box c = ferry_img_center_box(375, 500, 224, 224);
    CHECK(c.y == 76 && c.x == 138 && c.h == 224 && c.w == 224);
}

static void test_refusals(void) {
    ferry_img_out o = {224, 224, 3, FERRY_IMG_CHW, FERRY_DT_F32, {0}, {0}};
    ferry_img_sample s = {{10, 0, 300, 100}, 0};
    CHECK(ferry_img_check(&o, &s, 300, 100, "sample 7") == FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "sample 7");
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "outside the 300 x 100 image");
    ferry_img_sample big = {{0, 0, 60000, 60000}, 0};
    ferry_img_out tiny = {2, 2, 3, FERRY_IMG_CHW, FERRY_DT_U8, {0}, {0}};
    CHECK(ferry_img_check(&tiny, &big, 60000, 60000, "x") == FERRY_EINVAL);
    o.channels = 4;
    CHECK(ferry_img_check(&o, NULL, 1, 1, "x") == FERRY_EINVAL);
    o.channels = 3;
    o.dtype = FERRY_DT_I32;
    CHECK(ferry_img_check(&o, NULL, 1, 1, "x") == FERRY_EINVAL);
}

int main(void) {
    RUN(test_identity_and_flip);
    RUN(test_flat_stays_flat);
    RUN(test_layouts_and_types);
    RUN(test_half_and_bfloat16);
    RUN(test_random_resized_crop);
    RUN(test_refusals);
    return check_summary();
}
