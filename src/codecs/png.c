/* png.c — PNG decoding through libspng.
 *
 * Every color type and bit depth decodes to 8-bit RGB (spng's SPNG_FMT_RGB8:
 * palettes expanded, gray replicated, alpha and tRNS dropped, 16-bit samples
 * reduced to their high byte, as Pillow's RGB;16B raw mode reads them); gray
 * images asked for as one channel keep the first of the three. Chunk CRCs
 * and the zlib stream's Adler-32 are checked (spng's defaults): a flipped bit
 * is an error, never a changed pixel. Ancillary chunks are bounded (64 MiB
 * each and in all) so a hostile file cannot make the decoder hold much more
 * than its image. */
#include "codecs/image.h"
#include <stdlib.h>
#ifdef FERRY_HAVE_SPNG
#include <spng.h>

#define PNG_CHUNK_LIMIT ((size_t)64 << 20)

static int png_open(const uint8_t *data, size_t n, spng_ctx **out, struct spng_ihdr *ihdr) {
    spng_ctx *c = spng_ctx_new(0);
    if (!c) return ferry_seterr(FERRY_ENOMEM, "png: cannot make a decoder");
    int e = spng_set_png_buffer(c, data, n);
    if (!e) e = spng_set_image_limits(c, FERRY_IMAGE_MAX_SIDE, FERRY_IMAGE_MAX_SIDE);
    if (!e) e = spng_set_chunk_limits(c, PNG_CHUNK_LIMIT, PNG_CHUNK_LIMIT);
    if (!e) e = spng_get_ihdr(c, ihdr);
    if (e) {
        spng_ctx_free(c);
        return ferry_seterr(e == SPNG_ESIGNATURE ? FERRY_EUNSUPPORTED : FERRY_ECODEC, "png: header: %s",
                            spng_strerror(e));
    }
    *out = c;
    return 0;
}

int ferry_png_probe(const uint8_t *data, size_t n, ferry_image_info *out) {
    spng_ctx *c;
    struct spng_ihdr h;
    int rc = png_open(data, n, &c, &h);
    if (rc < 0) return rc;
    spng_ctx_free(c);
    memset(out, 0, sizeof *out);
    out->format = FERRY_IMAGE_PNG;
    out->width = h.width;
    out->height = h.height;
    out->channels = h.color_type == SPNG_COLOR_TYPE_GRAYSCALE ? 1
                  : h.color_type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA ? 2
                  : h.color_type == SPNG_COLOR_TYPE_TRUECOLOR_ALPHA ? 4 : 3;
    out->progressive = h.interlace_method != 0;
    out->bit_depth = h.bit_depth;
    return 0;
}

int ferry_png_decode(const uint8_t *data, size_t n, const ferry_image_info *info, int ch, uint8_t *dst) {
    spng_ctx *c;
    struct spng_ihdr h;
    int rc = png_open(data, n, &c, &h);
    if (rc < 0) return rc;
    size_t px = (size_t)info->width * info->height, need = 0;
    uint8_t *rgb = ch == 3 ? dst : malloc(px * 3);
    int e = rgb ? spng_decoded_image_size(c, SPNG_FMT_RGB8, &need) : SPNG_EMEM;
    if (!e && need != px * 3) e = SPNG_EINTERNAL;
    if (!e) e = spng_decode_image(c, rgb, need, SPNG_FMT_RGB8, 0);
    if (e) rc = ferry_seterr(e == SPNG_EMEM ? FERRY_ENOMEM : FERRY_ECODEC, "png: decode: %s", spng_strerror(e));
    else if (ch == 1)
        for (size_t i = 0; i < px; i++) dst[i] = rgb[3 * i];
    if (rgb != dst) free(rgb);
    spng_ctx_free(c);
    return rc;
}
#else
int ferry_png_probe(const uint8_t *data, size_t n, ferry_image_info *out) {
    return ferry_seterr(FERRY_EUNSUPPORTED, "png: this ferry was built without libspng");
}
int ferry_png_decode(const uint8_t *data, size_t n, const ferry_image_info *info, int ch, uint8_t *dst) {
    return ferry_seterr(FERRY_EUNSUPPORTED, "png: this ferry was built without libspng");
}
#endif
