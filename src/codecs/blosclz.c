/* blosclz.c — c-blosc's default inner codec (BloscLZ, a FastLZ level-2
 * descendant), decoded from this description of its stream:
 *
 *   The first byte's top three bits are a marker; its low five bits are the
 *   first control byte. A control byte c < 32 starts a literal run of c + 1
 *   bytes that follow it. A control byte c >= 32 is a match: length
 *   L = (c >> 5) + 2 (when c >> 5 == 7, add every following byte up to and
 *   including the first that is not 255), then one byte b:
 *     near:  distance = ((c & 31) << 8) + b + 1            (up to 8191)
 *     far:   when c & 31 == 31 and b == 255, two more bytes give a big-
 *            endian x and distance = x + 8191 + 1
 *   and L bytes are copied from distance bytes back (overlapping: distance
 *   1 repeats the last byte). After either, the next byte is the next
 *   control byte; the stream ends when the input does.
 *
 * Every read and write is checked against the input and the `want` bytes
 * the caller expects, and the stream must produce exactly `want`. */
#include "codecs/impl.h"

#define BLZ_MAX_DISTANCE 8191u

int ferry_blosclz_block(const uint8_t *in, size_t n, uint8_t *out, size_t want) {
    if (n == 0) return ferry_seterr(FERRY_ECODEC, "blosclz: empty stream");
    size_t ip = 1, op = 0;
    unsigned ctrl = in[0] & 31u;
    for (;;) {
        if (ctrl < 32) {
            size_t run = (size_t)ctrl + 1;
            if (run > n - ip) return ferry_seterr(FERRY_ECODEC, "blosclz: literal run past the end of the stream");
            if (run > want - op) return ferry_seterr(FERRY_ECODEC, "blosclz: output longer than the expected %zu bytes", want);
            memcpy(out + op, in + ip, run);
            ip += run;
            op += run;
        } else {
            size_t len = (ctrl >> 5) + 2;
            if ((ctrl >> 5) == 7) {
                uint8_t code;
                do {
                    if (ip >= n) return ferry_seterr(FERRY_ECODEC, "blosclz: match length past the end of the stream");
                    code = in[ip++];
                    len += code;
                } while (code == 255);
            }
            if (ip >= n) return ferry_seterr(FERRY_ECODEC, "blosclz: match distance past the end of the stream");
            uint8_t b = in[ip++];
            size_t dist = ((size_t)(ctrl & 31) << 8) + b + 1;
            if (b == 255 && (ctrl & 31) == 31) {
                if (n - ip < 2) return ferry_seterr(FERRY_ECODEC, "blosclz: far distance past the end of the stream");
                dist = ((size_t)in[ip] << 8 | in[ip + 1]) + BLZ_MAX_DISTANCE + 1;
                ip += 2;
            }
            if (dist > op) return ferry_seterr(FERRY_ECODEC, "blosclz: match reaches %zu bytes before the output", dist - op);
            if (len > want - op) return ferry_seterr(FERRY_ECODEC, "blosclz: output longer than the expected %zu bytes", want);
            const uint8_t *src = out + op - dist;
            uint8_t *dst = out + op;
            if (dist >= len) memcpy(dst, src, len);
            else for (size_t k = 0; k < len; k++) dst[k] = src[k];   /* overlapping: a repeat */
            op += len;
        }
        if (ip >= n) break;
        ctrl = in[ip++];
    }
    if (op != want) return ferry_seterr(FERRY_ECODEC, "blosclz: stream decoded to %zu bytes, expected %zu", op, want);
    return 0;
}
