/* fuzz_image.c — the image decoders (src/codecs/jpeg.c, jpegregion.c, png.c):
 * probe, then decode images of up to 1 MiB of pixels, both channel choices.
 * An input either decodes to exactly the bytes its header announces or fails
 * with a message. A part of it (a box drawn from the input's bytes) decodes
 * when the whole decodes, to the whole decode's pixels, and fails when the
 * whole fails. */
#include "fuzz.h"
#include "ferry_experimental.h"
#include "common.h"
#include "codecs/image.h"

/* the box of image in: from a hash of the input, so a mutation moves it */
static ferry_img_box fuzz_box(const uint8_t *data, size_t size, const ferry_image_info *in) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < size && i < 4096; i++) h = (h ^ data[i]) * 1099511628211ull;
    uint32_t bw = 1 + (uint32_t)(h % in->width), bh = 1 + (uint32_t)((h >> 16) % in->height);
    uint32_t bx = (uint32_t)((h >> 32) % (in->width - bw + 1)), by = (uint32_t)((h >> 48) % (in->height - bh + 1));
    return (ferry_img_box){by, bx, bh, bw};
}

static int fuzz_image(const uint8_t *data, size_t size) {
    static uint8_t out[1 << 20], part[1 << 20];
    ferry_image_info in;
    if (ferry_image_probe(data, size, &in) < 0) {
        if (!ferry_lasterr()[0]) abort();
        return 0;
    }
    for (unsigned flags = 0; flags <= FERRY_IMAGE_KEEP_GRAY; flags++) {
        int ch = ferry_image_out_channels(&in, flags);
        uint64_t need = (uint64_t)in.width * in.height * (uint64_t)ch;
        if (need > sizeof out) continue;
        int64_t r = ferry_image_decode(data, size, out, sizeof out, flags, NULL);
        if (r >= 0 && (uint64_t)r != need) abort();
        if (r < 0 && !ferry_lasterr()[0]) abort();
        ferry_img_box want = fuzz_box(data, size, &in), got;
        int64_t rp = ferry_image_decode_region(data, size, part, sizeof part, flags, &want, &got, NULL);
        if (rp < 0 && !ferry_lasterr()[0]) abort();
        if ((rp < 0) != (r < 0)) abort();   /* damage anywhere fails both */
        if (rp < 0) continue;
        if (got.y > want.y || got.x > want.x || got.y + got.h < want.y + want.h || got.x + got.w < want.x + want.w ||
            got.y + got.h > in.height || got.x + got.w > in.width || (uint64_t)rp != (uint64_t)got.h * got.w * ch)
            abort();
        for (uint32_t y = want.y; y < want.y + want.h; y++)
            if (memcmp(out + ((size_t)y * in.width + want.x) * ch,
                       part + ((size_t)(y - got.y) * got.w + (want.x - got.x)) * ch, (size_t)want.w * ch))
                abort();
    }
    return 0;
}
FERRY_FUZZ_TARGET(image, fuzz_image)
