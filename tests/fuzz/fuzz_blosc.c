/* fuzz_blosc.c — the blosc v1 frame decoder, on its own and followed by the
 * filters it is usually chained with. Any input must give a length within
 * the output buffer or a negative code with a message, never a crash. */
#include "fuzz.h"
#include "codecs/codecs.h"

static int fuzz_blosc(const uint8_t *data, size_t size) {
    static ferry_decode_scratch s;   /* reused like an engine worker's */
    static uint8_t out[1 << 20];
    ferry_codec chain[2] = {{FERRY_CODEC_BLOSC, 0}, {FERRY_CODEC_SHUFFLE, 4}};
    /* room for anything up to 1 MiB, then exactly what the header announces */
    int64_t r = ferry_decode(chain, 1, data, size, out, sizeof out, &s);
    if (r > (int64_t)sizeof out) abort();
    if (r < 0 && !ferry_lasterr()[0]) abort();
    if (size >= 16) {
        size_t want = (size_t)data[4] | (size_t)data[5] << 8 | (size_t)data[6] << 16 | (size_t)data[7] << 24;
        if (want <= sizeof out) {
            r = ferry_decode(chain, 2, data, size, out, want, &s);
            if (r > (int64_t)want) abort();
        }
    }
    return 0;
}
FERRY_FUZZ_TARGET(blosc, fuzz_blosc)
