/* test_gpu_imagexform.c — the image transform kernel (kernels.cu
 * ferry_image_xform_batch) gives the same bits as the CPU path
 * (codecs/imagexform.c) for every output type and layout, crops that
 * downscale and upscale, flips, one and three channels, and a batch whose
 * samples have different sizes. On the stand-in driver this checks the
 * plumbing (descriptors, arguments, device ranges); on a GPU, the arithmetic.
 * Skips where there is no GPU. */
#include "check.h"
#include "ferry.h"
#include "codecs/imagexform.h"
#include "cuda/cuda.h"
#include <stdlib.h>

static ferry_ctx *ctx_;

static uint8_t *make_image(uint32_t h, uint32_t w, uint32_t c, unsigned seed) {
    uint8_t *p = malloc((size_t)h * w * c);
    for (size_t i = 0; i < (size_t)h * w * c; i++) {
        seed = seed * 1103515245u + 12345u;
        /* smooth gradients with noise: edges and flat parts both */
        size_t px = i / c;
        p[i] = (uint8_t)(((px % w) * 255 / w + (px / w) * 97 / h + ((seed >> 16) & 15)) & 0xff);
    }
    return p;
}

typedef struct img { uint32_t h, w; uint8_t *host; uintptr_t dev; } img;

static void run_case(const char *what, uint32_t c, ferry_dtype dt, ferry_img_layout layout, uint32_t oh, uint32_t ow) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    enum { N = 4 };
    img im[N] = {{375, 500, NULL, 0}, {64, 48, NULL, 0}, {1200, 900, NULL, 0}, {1, 1, NULL, 0}};
    ferry_img_sample smp[N];
    ferry_img_out o = {oh, ow, c, layout, dt, {0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
    if (dt == FERRY_DT_U8) o.std[0] = o.std[1] = o.std[2] = 0;
    size_t ob = ferry_img_out_bytes(&o);
    uintptr_t dout = 0, ddesc = 0;
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, ob * N, &dout), 0);
    CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, 64 * N, &ddesc), 0);
    unsigned long long desc[8 * N];
    for (int i = 0; i < N; i++) {
        im[i].host = make_image(im[i].h, im[i].w, c, 7u + (unsigned)i);
        size_t n = (size_t)im[i].h * im[i].w * c;
        CHECK_EQ_I(ferry_cuda_malloc(ctx_, 0, n, &im[i].dev), 0);
        CHECK_EQ_I(ferry_memcpy(ctx_, ferry_cuda_buf(0, im[i].dev, n), ferry_host_buf(im[i].host, n), n), 0);
        CHECK_EQ_I(ferry_img_random_resized_crop(11, 2, (uint64_t)i, im[i].h, im[i].w, 0.08, 1.0, 3.0 / 4, 4.0 / 3,
                                                 &smp[i].box), 0);
        smp[i].flip = i % 2;
        CHECK_EQ_I(ferry_img_check(&o, &smp[i], im[i].h, im[i].w, what), 0);
        unsigned long long *q = desc + 8 * i;
        q[0] = im[i].dev;
        q[1] = dout + ob * (size_t)i;
        q[2] = (unsigned long long)im[i].w * c;
        q[3] = ((unsigned long long)im[i].h << 32) | im[i].w;
        q[4] = ((unsigned long long)smp[i].box.y << 32) | smp[i].box.x;
        q[5] = ((unsigned long long)smp[i].box.h << 32) | smp[i].box.w;
        q[6] = (unsigned long long)smp[i].flip;
        q[7] = 0;
    }
    CHECK_EQ_I(ferry_memcpy(ctx_, ferry_cuda_buf(0, ddesc, sizeof desc), ferry_host_buf(desc, sizeof desc), sizeof desc), 0);
    ferry_cuda_img_params p = {oh, ow, c, layout == FERRY_IMG_CHW ? 0 : 1,
                               dt == FERRY_DT_U8 ? 0 : dt == FERRY_DT_F32 ? 1 : dt == FERRY_DT_F16 ? 2 : 3,
                               {o.mean[0], o.mean[1], o.mean[2]}, {o.std[0], o.std[1], o.std[2]}};
    CHECK_EQ_I(ferry_cuda_use_device(0), 0);
    CUstream s = NULL;
    CHECK_EQ_I(cu->StreamCreate(&s, 1), 0);
    CHECK_EQ_I(ferry_cuda_image_xform_batch(0, ddesc, N, &p, s), 0);
    CHECK_EQ_I(cu->StreamSynchronize(s), 0);
    cu->StreamDestroy(s);
    uint8_t *got = malloc(ob * N), *want = malloc(ob);
    CHECK_EQ_I(ferry_memcpy(ctx_, ferry_host_buf(got, ob * N), ferry_cuda_buf(0, dout, ob * N), ob * N), 0);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_I(ferry_img_transform(im[i].host, im[i].h, im[i].w, (size_t)im[i].w * c, &smp[i], &o, want), 0);
        size_t diff = 0;
        for (size_t k = 0; k < ob; k++) diff += got[ob * (size_t)i + k] != want[k];
        if (diff) printf("  %s, sample %d (%ux%u box %u,%u %ux%u): %zu of %zu bytes differ\n", what, i, im[i].h,
                         im[i].w, smp[i].box.y, smp[i].box.x, smp[i].box.h, smp[i].box.w, diff, ob);
        CHECK(diff == 0);
        ferry_cuda_free(ctx_, im[i].dev);
        free(im[i].host);
    }
    free(got);
    free(want);
    ferry_cuda_free(ctx_, dout);
    ferry_cuda_free(ctx_, ddesc);
}

static void test_same_bits_as_the_cpu(void) {
    run_case("u8 CHW 3ch 224", 3, FERRY_DT_U8, FERRY_IMG_CHW, 224, 224);
    run_case("f32 CHW 3ch 224", 3, FERRY_DT_F32, FERRY_IMG_CHW, 224, 224);
    run_case("bf16 HWC 3ch 160x128", 3, FERRY_DT_BF16, FERRY_IMG_HWC, 160, 128);
    run_case("f16 CHW 1ch 96", 1, FERRY_DT_F16, FERRY_IMG_CHW, 96, 96);
    run_case("u8 HWC 3ch 1024 (upscale)", 3, FERRY_DT_U8, FERRY_IMG_HWC, 1024, 1024);
}

int main(void) {
    if (ferry_ctx_create(&ctx_, NULL) != 0) return 1;
    if (ferry_cuda_device_count(ctx_) == 0) {
        printf("skipped: no CUDA device (%s)\n", ferry_cuda_status(ctx_));
        printf("0 passed, 0 failed, 1 skipped\n");
        ferry_ctx_destroy(ctx_);
        return 0;
    }
    if (!ferry_kernels_ready(0)) {
        printf("skipped: no GPU kernels in this build (%s)\n", ferry_kernels_status());
        printf("0 passed, 0 failed, 1 skipped\n");
        ferry_ctx_destroy(ctx_);
        return 0;
    }
    RUN(test_same_bits_as_the_cpu);
    ferry_ctx_destroy(ctx_);
    return check_summary();
}
