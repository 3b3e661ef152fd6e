/* jpegregion.c — decode only the part of a JPEG that a crop box needs, with
 * the pixels of the whole decode (jpeg.c), through libjpeg-turbo's libjpeg
 * API: jpeg_crop_scanline decodes a band of iMCU columns, jpeg_skip_scanlines
 * passes over the rows above the box without the IDCT, upsampling and color
 * conversion. (TurboJPEG 3's tj3SetCroppingRegion makes the same calls; the
 * TurboJPEG 2.x API, which jpeg.c uses, has no partial decode.)
 *
 * Equal pixels: the decoder runs with jpeg.c's settings (accurate integer
 * IDCT, fancy upsampling, the output color space TurboJPEG picks), and the
 * band is widened where a partial decode differs from the whole one
 * (libjpeg.txt, "Partial image decompression"): fancy 4:2:x upsampling takes
 * the band's first and last chroma columns for the image's edges, so the band
 * reaches max_h_samp_factor pixels past the box on each side inside the image
 * (a pixel's value reads its chroma column's neighbours only); block smoothing
 * of a progressive image that lacks some AC refinement reads the DC values of
 * two blocks on either side, taking the band's first block for the two left
 * of it, so there the band starts two iMCU columns further left (the blocks
 * the upsampler reads are then smoothed as in the whole image; on the right
 * the smoother reads the image's blocks, not the band's). Rows are read from
 * the box's first one; the rows above are skipped (jpeg_skip_scanlines
 * decodes the context rows the upsampler needs).
 * tests/c/test_jpegregion.c checks every box edge position against the whole
 * decode, byte for byte, for each sampling.
 *
 * Damaged data past the box is still an error, as in the whole decode: below
 * the box the entropy decoder runs over every remaining row (skipped rows are
 * Huffman-decoded and discarded), and the stream is read to its EOI marker.
 * Warnings are errors and progressive images of more than 500 scans are
 * refused (TurboJPEG's TJFLAG_STOPONWARNING and TJFLAG_LIMITSCANS, as jpeg.c
 * sets them). Each image gets a new decompressor, so no table of an earlier
 * image is used. */
#include "codecs/image.h"
#include <limits.h>
#include <stdlib.h>

#if defined(FERRY_HAVE_TURBOJPEG) && defined(FERRY_HAVE_LIBJPEG)
#include <setjmp.h>
#include <stdio.h>
#include <jpeglib.h>
/* libjpeg-turbo 2.1 or later: the partial-decode fixes of 2.0.x are in (an
 * older one, or another libjpeg, decodes whole images) */
#if defined(LIBJPEG_TURBO_VERSION_NUMBER) && LIBJPEG_TURBO_VERSION_NUMBER >= 2001000
#define FERRY_JPEG_REGION 1
#endif
#endif

#ifdef FERRY_JPEG_REGION

#define REGION_MAX_SCANS 500

typedef struct region_dec {
    struct jpeg_decompress_struct d;
    struct jpeg_error_mgr err;
    struct jpeg_progress_mgr progress;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX + 64];
    uint8_t *scratch;          /* one band row: rows decoded only to be passed over */
} region_dec;

static void on_error(j_common_ptr c) {
    region_dec *r = (region_dec *)c->client_data;
    (*c->err->format_message)(c, r->msg);
    longjmp(r->jump, 1);
}

/* a warning (corrupt data libjpeg would decode past) is an error; the library never prints */
static void on_message(j_common_ptr c, int level) {
    if (level < 0) on_error(c);
}

static void on_output(j_common_ptr c) { (void)c; }

static void on_progress(j_common_ptr c) {
    region_dec *r = (region_dec *)c->client_data;
    if (c->is_decompressor && ((j_decompress_ptr)c)->input_scan_number > REGION_MAX_SCANS) {
        snprintf(r->msg, sizeof r->msg, "Progressive JPEG image has more than %d scans", REGION_MAX_SCANS);
        longjmp(r->jump, 1);
    }
}

/* Read `rows` rows into dst (NULL: into the scratch row, passed over). */
static void read_rows(region_dec *r, uint8_t *dst, size_t stride, JDIMENSION rows) {
    JSAMPROW ptr[16];
    while (rows > 0) {
        JDIMENSION k = rows < 16 ? rows : 16;
        for (JDIMENSION i = 0; i < k; i++) ptr[i] = dst ? dst + (size_t)i * stride : r->scratch;
        JDIMENSION got = jpeg_read_scanlines(&r->d, ptr, k);
        if (got == 0) {   /* not with an in-memory source; refused rather than looping */
            snprintf(r->msg, sizeof r->msg, "no scanline decoded at row %u", r->d.output_scanline);
            longjmp(r->jump, 1);
        }
        if (dst) dst += (size_t)got * stride;
        rows -= got;
    }
}

/* The decode proper; errors longjmp to the caller's setjmp. */
static void region_run(region_dec *r, const uint8_t *data, size_t n, const ferry_image_info *info, int ch,
                       const ferry_img_box *want, ferry_img_box *got, uint8_t *dst) {
    j_decompress_ptr d = &r->d;
    jpeg_create_decompress(d);
    r->progress.progress_monitor = on_progress;
    d->progress = &r->progress;
    jpeg_mem_src(d, data, (unsigned long)n);
    jpeg_read_header(d, TRUE);
    d->out_color_space = ch == 1 ? JCS_GRAYSCALE : JCS_EXT_RGB;
    d->dct_method = JDCT_ISLOW;
    jpeg_start_decompress(d);
    if (d->output_width != info->width || d->output_height != info->height || d->output_components != ch) {
        snprintf(r->msg, sizeof r->msg, "decoder output %u x %u x %d, the header said %u x %u x %d",
                 d->output_height, d->output_width, d->output_components, info->height, info->width, ch);
        longjmp(r->jump, 1);
    }
    uint32_t w = info->width, h = info->height;
    uint32_t imcu = d->num_components == 1 ? (uint32_t)DCTSIZE : (uint32_t)DCTSIZE * (uint32_t)d->max_h_samp_factor;
    uint32_t fancy = (uint32_t)d->max_h_samp_factor;
    uint32_t left = d->progressive_mode ? 2 * imcu + fancy : fancy, right = fancy;
    uint32_t x0 = want->x > left ? want->x - left : 0, end = want->x + want->w;
    uint32_t x1 = w - end > right ? end + right : w;
    JDIMENSION xoff = x0, bw = x1 - x0;
    jpeg_crop_scanline(d, &xoff, &bw);   /* xoff moves left to an iMCU boundary */
    if (xoff > want->x || xoff + bw < end) {
        snprintf(r->msg, sizeof r->msg, "the band (x %u, %u wide) misses the box", xoff, bw);
        longjmp(r->jump, 1);
    }
    size_t stride = (size_t)bw * (size_t)ch;
    if (!(r->scratch = malloc(stride))) {
        snprintf(r->msg, sizeof r->msg, "out of memory for a row of %u pixels", bw);
        longjmp(r->jump, 1);
    }
    if (want->y > 0) jpeg_skip_scanlines(d, want->y);
    read_rows(r, dst, stride, want->h);
    /* Rows below the box: entropy-decoded to the last but one (damaged data
     * there is an error, as in the whole decode), the last one read, so that
     * the decoder reads the stream to its end. A multi-scan image was read
     * whole by jpeg_start_decompress: skipping to its end is enough. */
    JDIMENSION rest = h - (want->y + want->h);
    if (rest > 0) {
        if (jpeg_has_multiple_scans(d)) {
            jpeg_skip_scanlines(d, rest);
        } else {
            if (rest > 1) jpeg_skip_scanlines(d, rest - 1);
            read_rows(r, NULL, stride, 1);
        }
    }
    jpeg_finish_decompress(d);
    *got = (ferry_img_box){want->y, xoff, want->h, bw};
}

int ferry_jpeg_decode_region(const uint8_t *data, size_t n, const ferry_image_info *info, int ch,
                             const ferry_img_box *want, ferry_img_box *got, uint8_t *dst) {
    uint32_t w = info->width, h = info->height;
    if (!want->w || !want->h || want->x >= w || want->y >= h || want->w > w - want->x || want->h > h - want->y)
        return ferry_seterr(FERRY_EINVAL, "jpeg: region (y %u, x %u, %u x %u) outside the %u x %u image", want->y,
                            want->x, want->h, want->w, h, w);
    /* the whole image, or colors converted here after the decode: the whole decode */
    if (info->cmyk || (want->w == w && want->h == h) || n > ULONG_MAX) {
        *got = (ferry_img_box){0, 0, h, w};
        return ferry_jpeg_decode(data, n, info, ch, dst);
    }
    region_dec *r = calloc(1, sizeof *r);
    if (!r) return ferry_seterr(FERRY_ENOMEM, "jpeg: out of memory for a decoder");
    r->d.client_data = r;   /* jpeg_create_decompress keeps it */
    r->d.err = jpeg_std_error(&r->err);
    r->err.error_exit = on_error;
    r->err.emit_message = on_message;
    r->err.output_message = on_output;
    int rc = 0;
    if (setjmp(r->jump) == 0) region_run(r, data, n, info, ch, want, got, dst);
    else rc = ferry_seterr(FERRY_ECODEC, "jpeg: decode: %s", r->msg);
    jpeg_destroy_decompress(&r->d);
    free(r->scratch);
    free(r);
    return rc;
}

int ferry_jpeg_region_supported(void) { return 1; }
#else
/* Without libjpeg's API the whole image is decoded (or refused by jpeg.c). */
int ferry_jpeg_decode_region(const uint8_t *data, size_t n, const ferry_image_info *info, int ch,
                             const ferry_img_box *want, ferry_img_box *got, uint8_t *dst) {
    (void)want;
    *got = (ferry_img_box){0, 0, info->height, info->width};
    return ferry_jpeg_decode(data, n, info, ch, dst);
}

int ferry_jpeg_region_supported(void) { return 0; }
#endif
