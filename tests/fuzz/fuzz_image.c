/* fuzz_image.c — the image decoders (src/codecs/jpeg.c, png.c): probe, then
 * decode images of up to 1 MiB of pixels, both channel choices. An input
 * either decodes to exactly the bytes its header announces or fails with a
 * message. */
#include "fuzz.h"
#include "ferry_experimental.h"
#include "common.h"

static int fuzz_image(const uint8_t *data, size_t size) {
    static uint8_t out[1 << 20];
    ferry_image_info in;
    if (ferry_image_probe(data, size, &in) < 0) {
        if (!ferry_lasterr()[0]) abort();
        return 0;
    }
    for (unsigned flags = 0; flags <= FERRY_IMAGE_KEEP_GRAY; flags++) {
        uint64_t need = (uint64_t)in.width * in.height * (uint64_t)ferry_image_out_channels(&in, flags);
        if (need > sizeof out) continue;
        int64_t r = ferry_image_decode(data, size, out, sizeof out, flags, NULL);
        if (r >= 0 && (uint64_t)r != need) abort();
        if (r < 0 && !ferry_lasterr()[0]) abort();
    }
    return 0;
}
FERRY_FUZZ_TARGET(image, fuzz_image)
