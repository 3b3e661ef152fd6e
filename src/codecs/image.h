/* image.h — the image decoders behind ferry_image_* (ferry_experimental.h).
 * Internal. jpeg.c (libjpeg-turbo's TurboJPEG API) and png.c (libspng) each
 * probe a header and decode into a caller's HWC uint8 buffer; image.c picks
 * one by signature and runs batches on threads. Each sets ferry_seterr's
 * message on failure (the caller prefixes the sample's name). Without its
 * library (FERRY_HAVE_TURBOJPEG / FERRY_HAVE_SPNG unset) a decoder refuses
 * with FERRY_EUNSUPPORTED. */
#ifndef FERRY_CODECS_IMAGE_H
#define FERRY_CODECS_IMAGE_H
#include "common.h"
#include "ferry_experimental.h"
#include "codecs/imagexform.h"

/* Largest image either decoder accepts: 2^28 pixels, each side below 2^16
 * (JPEG's limit; PNG images past it are refused, not decoded in part). */
#define FERRY_IMAGE_MAX_SIDE 65535u
#define FERRY_IMAGE_MAX_PIXELS ((uint64_t)1 << 28)

int ferry_jpeg_probe(const uint8_t *data, size_t n, ferry_image_info *out);
/* Decode to `ch` channels (1 or 3) into dst (width * height * ch bytes). */
int ferry_jpeg_decode(const uint8_t *data, size_t n, const ferry_image_info *info, int ch, uint8_t *dst);
/* Decode at least the box `want` of the image (jpegregion.c: the part a crop
 * needs, with the whole decode's pixels) into dst, rows got->w * ch bytes
 * apart: *got is the region decoded (it contains want; the whole image where
 * no partial decode is built in, for CMYK images and for a box of the whole
 * image). dst holds width * height * ch bytes. */
int ferry_jpeg_decode_region(const uint8_t *data, size_t n, const ferry_image_info *info, int ch,
                             const ferry_img_box *want, ferry_img_box *got, uint8_t *dst);
/* 1 where ferry_jpeg_decode_region decodes parts (libjpeg-turbo's libjpeg API built in), else 0. */
int ferry_jpeg_region_supported(void);
/* ferry_image_decode of the region of `want` (ferry_jpeg_decode_region for a
 * JPEG; the whole image otherwise): the bytes written, got->h * got->w * the
 * channels; dst holds the whole image. */
int64_t ferry_image_decode_region(const void *data, size_t n, void *dst, size_t cap, unsigned flags,
                                  const ferry_img_box *want, ferry_img_box *got, ferry_image_info *info);
int ferry_png_probe(const uint8_t *data, size_t n, ferry_image_info *out);
int ferry_png_decode(const uint8_t *data, size_t n, const ferry_image_info *info, int ch, uint8_t *dst);
#endif
