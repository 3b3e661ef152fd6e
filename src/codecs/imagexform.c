/* imagexform.c — crop, antialiased resize, flip, normalise and convert one
 * decoded image on the CPU (imagexform.h says what and why). The GPU kernel
 * ferry_image_xform_batch (src/cuda/kernels.cu) computes each element with
 * the same operations in the same order: weights in double, normalised, then
 * float; for each source row of the output's vertical window, the row's sum
 * over the horizontal window (float multiplies and adds, left to right), then
 * the vertical sum (top to bottom); one rounding to uint8. Here the row sums
 * are kept and reused across output rows (the separable order), which gives
 * the same floats: so the two paths agree bit for bit. */
#include "codecs/imagexform.h"
#include "codecs/imagexform_core.h"

/* ---- deterministic draws ------------------------------------------------ */
static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t draw_state(uint64_t seed, uint64_t epoch, uint64_t sample, uint64_t stream) {
    uint64_t s = seed;
    uint64_t a = splitmix(&s) ^ epoch;
    uint64_t b = splitmix(&a) ^ sample;
    uint64_t c = splitmix(&b) ^ stream;
    return splitmix(&c);
}
static double uniform(uint64_t *s) { return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0); }
/* an integer in [lo, hi] */
static uint32_t randint(uint64_t *s, uint32_t lo, uint32_t hi) {
    return lo + (uint32_t)(uniform(s) * ((double)hi - lo + 1.0));
}

int ferry_img_random_resized_crop(uint64_t seed, uint64_t epoch, uint64_t sample, uint32_t h, uint32_t w,
                                  double scale_lo, double scale_hi, double ratio_lo, double ratio_hi,
                                  ferry_img_box *out) {
    if (!out || !h || !w || !(scale_lo > 0) || scale_lo > scale_hi || !(ratio_lo > 0) || ratio_lo > ratio_hi)
        return ferry_seterr(FERRY_EINVAL, "random resized crop: an empty image, or scale (%g, %g) / ratio (%g, %g) "
                            "not positive and ordered", scale_lo, scale_hi, ratio_lo, ratio_hi);
    uint64_t st = draw_state(seed, epoch, sample, 1);
    double area = (double)h * (double)w, lr0 = log(ratio_lo), lr1 = log(ratio_hi);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (scale_lo + (scale_hi - scale_lo) * uniform(&st));
        double aspect = exp(lr0 + (lr1 - lr0) * uniform(&st));
        double cw = rint(sqrt(target * aspect)), ch = rint(sqrt(target / aspect));   /* Python round(): half to even */
        if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
            out->h = (uint32_t)ch;
            out->w = (uint32_t)cw;
            out->y = randint(&st, 0, h - out->h);
            out->x = randint(&st, 0, w - out->w);
            return 0;
        }
    }
    /* torchvision's fallback: the whole image, its ratio clamped into range, centred */
    double in_ratio = (double)w / (double)h;
    uint32_t cw = w, ch = h;
    if (in_ratio < ratio_lo) ch = (uint32_t)rint(w / ratio_lo);
    else if (in_ratio > ratio_hi) cw = (uint32_t)rint(h * ratio_hi);
    if (!ch) ch = 1;
    if (!cw) cw = 1;
    *out = (ferry_img_box){(h - ch) / 2, (w - cw) / 2, ch, cw};
    return 0;
}

int ferry_img_flip_draw(uint64_t seed, uint64_t epoch, uint64_t sample, double p) {
    uint64_t st = draw_state(seed, epoch, sample, 2);
    return uniform(&st) < p;
}

ferry_img_box ferry_img_center_box(uint32_t h, uint32_t w, uint32_t crop_h, uint32_t crop_w) {
    uint32_t ch = crop_h < h ? crop_h : h, cw = crop_w < w ? crop_w : w;
    /* torchvision: top = int(round((h - ch) / 2.0)) */
    return (ferry_img_box){(uint32_t)rint((h - ch) / 2.0), (uint32_t)rint((w - cw) / 2.0), ch, cw};
}

/* ---- conversions ---------------------------------------------------------- */
uint16_t ferry_img_f32_to_bf16(float f) { return ferry_img_bf16(f); }
uint16_t ferry_img_f32_to_f16(float f) { return ferry_img_f16(f); }

/* ---- checks --------------------------------------------------------------- */
size_t ferry_img_out_bytes(const ferry_img_out *o) {
    return (size_t)o->out_h * o->out_w * o->channels * ferry_dtype_itemsize(o->dtype);
}

int ferry_img_check(const ferry_img_out *o, const ferry_img_sample *s, uint32_t h, uint32_t w, const char *what) {
    if (!o || !o->out_h || !o->out_w || o->out_h > 65536 || o->out_w > 65536)
        return ferry_seterr(FERRY_EINVAL, "%s: output size must be 1..65536 on each side", what);
    if (o->channels != 1 && o->channels != 3)
        return ferry_seterr(FERRY_EINVAL, "%s: %u channels (1 or 3 are transformed)", what, o->channels);
    if (o->dtype != FERRY_DT_U8 && o->dtype != FERRY_DT_F32 && o->dtype != FERRY_DT_F16 &&
        o->dtype != FERRY_DT_BF16)
        return ferry_seterr(FERRY_EINVAL, "%s: output dtype %s (uint8, float32, float16 or bfloat16)", what,
                            ferry_dtype_name(o->dtype, FERRY_NAME_SHORT));
    if (o->layout != FERRY_IMG_CHW && o->layout != FERRY_IMG_HWC)
        return ferry_seterr(FERRY_EINVAL, "%s: layout must be CHW or HWC", what);
    if (!s) return 0;
    const ferry_img_box *b = &s->box;
    if (!b->h || !b->w || b->y > h || b->x > w || b->h > h - b->y || b->w > w - b->x)
        return ferry_seterr(FERRY_EINVAL, "%s: crop box (y %u, x %u, %u x %u) outside the %u x %u image", what, b->y,
                            b->x, b->h, b->w, h, w);
    if (b->h / o->out_h >= FERRY_IMG_MAX_TAPS / 2 - 1 || b->w / o->out_w >= FERRY_IMG_MAX_TAPS / 2 - 1)
        return ferry_seterr(FERRY_EINVAL, "%s: a %u x %u box to %u x %u is a downscale past 500x", what, b->h, b->w,
                            o->out_h, o->out_w);
    return 0;
}

int ferry_img_transform(const uint8_t *src, uint32_t h, uint32_t w, size_t stride, const ferry_img_sample *s,
                        const ferry_img_out *o, void *dst) {
    ferry_img_box whole = {0, 0, h, w};
    return ferry_img_transform_part(src, &whole, h, w, stride, s, o, dst);
}

int ferry_img_transform_part(const uint8_t *src, const ferry_img_box *part, uint32_t h, uint32_t w, size_t stride,
                             const ferry_img_sample *s, const ferry_img_out *o, void *dst) {
    int rc = ferry_img_check(o, s, h, w, "image transform");
    if (rc < 0) return rc;
    const ferry_img_box *b = &s->box;
    if (!part || b->y < part->y || b->x < part->x || b->y - part->y + (uint64_t)b->h > part->h ||
        b->x - part->x + (uint64_t)b->w > part->w)
        return ferry_seterr(FERRY_EINVAL, "image transform: crop box (y %u, x %u, %u x %u) outside the decoded part "
                            "(y %u, x %u, %u x %u)", b->y, b->x, b->h, b->w, part ? part->y : 0, part ? part->x : 0,
                            part ? part->h : 0, part ? part->w : 0);
    int dt = o->dtype == FERRY_DT_U8 ? FERRY_IMG_U8 : o->dtype == FERRY_DT_F32 ? FERRY_IMG_F32
             : o->dtype == FERRY_DT_F16 ? FERRY_IMG_F16 : FERRY_IMG_BF16;
    if (ferry_img_transform_core_at(src, stride, part->y, part->x, b->y, b->x, b->h, b->w, s->flip, o->out_h, o->out_w,
                                    o->channels, o->layout == FERRY_IMG_CHW ? 0 : 1, dt, o->mean, o->std, dst) < 0)
        return ferry_seterr(FERRY_ENOMEM, "image transform: out of memory for a %u x %u box", b->h, b->w);
    return 0;
}
