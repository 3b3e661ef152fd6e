/* imagexform.h — what happens to a decoded image before it is a training
 * sample: crop, antialiased resize, horizontal flip, normalisation, layout
 * (CHW or HWC) and element type. Internal.
 *
 * One description serves the CPU path (ferry_img_transform, here) and the GPU
 * kernel (src/cuda/kernels.cu ferry_image_xform_batch), which compute every
 * output element the same way: the weights of a separable triangle filter
 * whose support widens with the downscale factor (antialiasing, as PIL and
 * torchvision's resize(antialias=True) build them), applied over both axes in
 * float, rounded to uint8 once (the value torchvision's uint8 resize gives up
 * to its intermediate rounding: within 1), then scaled by 1/255, normalised
 * ((v - mean) / std) and converted. The random choices of
 * RandomResizedCrop and the flip derive from (seed, epoch, sample) alone, so a
 * resumed epoch draws the same crops. */
#ifndef FERRY_CODECS_IMAGEXFORM_H
#define FERRY_CODECS_IMAGEXFORM_H
#include "common.h"

/* A crop box in source pixels: rows [y, y + h), columns [x, x + w). */
typedef struct ferry_img_box { uint32_t y, x, h, w; } ferry_img_box;

typedef enum ferry_img_layout { FERRY_IMG_CHW = 0, FERRY_IMG_HWC = 1 } ferry_img_layout;

/* The batch's output: every sample out_h x out_w x channels, in `layout`, of
 * `dtype` (FERRY_DT_U8: the resized pixels, no normalisation; F32, F16,
 * BF16: v / 255, then (v - mean[c]) / std[c] where std[c] != 0). */
typedef struct ferry_img_out {
    uint32_t out_h, out_w, channels;   /* channels 1 or 3 (the decoded image's) */
    ferry_img_layout layout;
    ferry_dtype dtype;
    float mean[3], std[3];
} ferry_img_out;

/* One sample's transform: its box in the decoded image and whether to flip
 * the output left-right. */
typedef struct ferry_img_sample {
    ferry_img_box box;
    int flip;
} ferry_img_sample;

/* torchvision's RandomResizedCrop(scale=(scale_lo, scale_hi), ratio=(ratio_lo,
 * ratio_hi)) box for an h x w image: ten tries of an area share and a log-
 * uniform aspect ratio, then the centred fallback; the draws come from
 * (seed, epoch, sample) (splitmix64), not from a global generator. */
int ferry_img_random_resized_crop(uint64_t seed, uint64_t epoch, uint64_t sample, uint32_t h, uint32_t w,
                                  double scale_lo, double scale_hi, double ratio_lo, double ratio_hi,
                                  ferry_img_box *out);
/* A coin for the horizontal flip with probability p, from (seed, epoch, sample). */
int ferry_img_flip_draw(uint64_t seed, uint64_t epoch, uint64_t sample, double p);
/* The centred box of at most crop_h x crop_w (torchvision's CenterCrop of a
 * larger image; a smaller side keeps the whole side). */
ferry_img_box ferry_img_center_box(uint32_t h, uint32_t w, uint32_t crop_h, uint32_t crop_w);

/* Output bytes of one sample. */
size_t ferry_img_out_bytes(const ferry_img_out *o);
/* Check o and a sample's box against an h x w source; 0 or FERRY_EINVAL with
 * a message naming `what`. */
int ferry_img_check(const ferry_img_out *o, const ferry_img_sample *s, uint32_t h, uint32_t w, const char *what);

/* Transform one decoded image (h x w x o->channels uint8, rows `stride`
 * bytes apart) into dst (ferry_img_out_bytes(o) bytes). */
int ferry_img_transform(const uint8_t *src, uint32_t h, uint32_t w, size_t stride, const ferry_img_sample *s,
                        const ferry_img_out *o, void *dst);

/* The same where src holds only the part `part` of the h x w image (its
 * pixel (part->y, part->x) first, rows `stride` bytes apart), which must
 * contain the box: the output equals that of the whole image (the box keeps
 * the image's coordinates, so the filter weights are the same). */
int ferry_img_transform_part(const uint8_t *src, const ferry_img_box *part, uint32_t h, uint32_t w, size_t stride,
                             const ferry_img_sample *s, const ferry_img_out *o, void *dst);

/* Float to IEEE half and to bfloat16, round to nearest even (the kernel
 * converts the same way, so the two paths agree bit for bit). */
uint16_t ferry_img_f32_to_f16(float f);
uint16_t ferry_img_f32_to_bf16(float f);
#endif
