/* imagebatch_check.h — images for the ferry_image_batch tests (tests/c and
 * tests/gpu): JPEGs encoded here by TurboJPEG (baseline 4:2:0, 4:4:4, gray,
 * progressive, CMYK) and PNGs by libspng, written as a "files" shard set, and
 * the row the CPU path must give for each sample (decoded by
 * ferry_image_decode, boxed and transformed by codecs/imagexform, computed
 * here without ferry_image_batch). Needs FERRY_HAVE_TURBOJPEG and
 * FERRY_HAVE_SPNG. */
#ifndef FERRY_TEST_IMAGEBATCH_CHECK_H
#define FERRY_TEST_IMAGEBATCH_CHECK_H
#if defined(FERRY_HAVE_TURBOJPEG) && defined(FERRY_HAVE_SPNG)
#define IB_HAVE_CODECS 1
#include "check.h"
#include "ferry_experimental.h"
#include "codecs/imagexform.h"
#include <math.h>
#include <spng.h>
#include <stdlib.h>
#include <turbojpeg.h>
#include <unistd.h>

enum { IB_BASELINE, IB_444, IB_GRAY, IB_PROGRESSIVE, IB_CMYK, IB_PNG, IB_411 };

typedef struct ib_image {
    int kind, w, h;
    unsigned char *data;
    size_t size;
    char path[256];
} ib_image;

/* smooth gradients plus a little noise: edges and flat parts both */
static inline uint8_t *ib_pixels(int w, int h, int ch, unsigned seed) {
    uint8_t *p = malloc((size_t)w * h * ch);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++) {
                seed = seed * 1103515245u + 12345u;
                p[((size_t)y * w + x) * ch + c] = (uint8_t)(x * 180 / w + y * 60 / h + c * 25 + ((seed >> 16) & 7));
            }
    return p;
}

static inline void ib_make(ib_image *im, int kind, int w, int h, unsigned seed) {
    im->kind = kind;
    im->w = w;
    im->h = h;
    if (kind == IB_PNG) {
        uint8_t *px = ib_pixels(w, h, 4, seed);   /* RGBA: the alpha is dropped on decode */
        spng_ctx *e = spng_ctx_new(SPNG_CTX_ENCODER);
        spng_set_option(e, SPNG_ENCODE_TO_BUFFER, 1);
        struct spng_ihdr ih = {(uint32_t)w, (uint32_t)h, 8, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA, 0, 0, 0};
        spng_set_ihdr(e, &ih);
        int rc = spng_encode_image(e, px, (size_t)w * h * 4, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
        int err = 0;
        im->data = rc ? NULL : spng_get_png_buffer(e, &im->size, &err);
        spng_ctx_free(e);
        free(px);
        return;
    }
    int ch = kind == IB_GRAY ? 1 : kind == IB_CMYK ? 4 : 3;
    uint8_t *px = ib_pixels(w, h, ch, seed);
    tjhandle t = tjInitCompress();
    unsigned long n = 0;
    im->data = NULL;
    int pf = kind == IB_GRAY ? TJPF_GRAY : kind == IB_CMYK ? TJPF_CMYK : TJPF_RGB;
    int ss = kind == IB_GRAY ? TJSAMP_GRAY : kind == IB_444 ? TJSAMP_444 : kind == IB_411 ? TJSAMP_411 : TJSAMP_420;
    int flags = kind == IB_PROGRESSIVE ? TJFLAG_PROGRESSIVE : 0;
    unsigned char *out = NULL;
    if (tjCompress2(t, px, w, w * ch, h, pf, &out, &n, ss, 90, flags) == 0) {
        im->data = malloc(n);
        memcpy(im->data, out, n);
        im->size = n;
    }
    tjFree(out);
    tjDestroy(t);
    free(px);
}

static inline void ib_write(ib_image *im, const char *dir, const char *name) {
    snprintf(im->path, sizeof im->path, "%s/%s.%s", dir, name, im->kind == IB_PNG ? "png" : "jpg");
    FILE *f = fopen(im->path, "wb");
    if (f) {
        fwrite(im->data, 1, im->size, f);
        fclose(f);
    }
}

/* The box ferry_image_batch draws for one sample (center: computed here
 * from its definition, the largest centred box of the output's aspect). */
static inline ferry_img_sample ib_box(const ferry_image_batch_args *a, int64_t sample, uint32_t h, uint32_t w) {
    ferry_img_sample s;
    memset(&s, 0, sizeof s);
    const ferry_image_transform *x = &a->xf;
    if (x->crop == FERRY_IMAGE_CROP_RANDOM_RESIZED) {
        int d = x->scale[0] == 0 && x->scale[1] == 0;
        ferry_img_random_resized_crop(a->seed, a->epoch, (uint64_t)sample, h, w, d ? 0.08 : x->scale[0],
                                      d ? 1.0 : x->scale[1], d ? 0.75 : x->ratio[0], d ? 4.0 / 3 : x->ratio[1], &s.box);
    } else if (x->crop == FERRY_IMAGE_CROP_CENTER) {
        /* out aspect ow/oh; the image wider than that: full height */
        double bw = w, bh = h;
        if ((double)w * x->height > (double)h * x->width) bw = rint((double)h * x->width / x->height);
        else bh = rint((double)w * x->height / x->width);
        s.box.h = (uint32_t)bh;
        s.box.w = (uint32_t)bw;
        s.box.y = (uint32_t)rint((h - s.box.h) / 2.0);   /* torchvision's CenterCrop rounding */
        s.box.x = (uint32_t)rint((w - s.box.w) / 2.0);
    } else {
        s.box = (ferry_img_box){0, 0, h, w};
    }
    s.flip = x->flip > 0 && ferry_img_flip_draw(a->seed, a->epoch, (uint64_t)sample, x->flip);
    return s;
}

/* The CPU path's row for image im as sample `sample`: 0, or a negative code. */
static inline int ib_expected(const ferry_image_batch_args *a, const ib_image *im, int64_t sample, void *row) {
    ferry_image_info in;
    if (ferry_image_probe(im->data, im->size, &in) < 0) return -1;
    size_t need = (size_t)in.width * in.height * 3;
    uint8_t *px = malloc(need);
    int64_t got = ferry_image_decode(im->data, im->size, px, need, 0, NULL);
    if (got < 0) { free(px); return (int)got; }
    ferry_img_sample s = ib_box(a, sample, in.height, in.width);
    const ferry_image_transform *x = &a->xf;
    ferry_img_out o = {x->height, x->width, 3, x->layout == FERRY_IMAGE_CHW ? FERRY_IMG_CHW : FERRY_IMG_HWC, x->dtype,
                       {x->mean[0], x->mean[1], x->mean[2]}, {x->std[0], x->std[1], x->std[2]}};
    int rc = ferry_img_transform(px, in.height, in.width, (size_t)in.width * 3, &s, &o, row);
    free(px);
    return rc;
}

static inline size_t ib_row_bytes(const ferry_image_transform *x) {
    return (size_t)x->height * x->width * 3 * ferry_dtype_itemsize(x->dtype);
}
#else
#include "check.h"
#include "ferry_experimental.h"
#endif
#endif
