/* lz4.c — LZ4 blocks: numcodecs' LZ4 codec (u32 LE decoded size, then the
 * block) and the raw blocks inside blosc frames. */
#include "codecs/impl.h"
#include <limits.h>
#include <lz4.h>

int ferry_lz4_block(const uint8_t *in, size_t n, uint8_t *out, size_t want) {
    if (n > INT_MAX || want > INT_MAX)
        return ferry_seterr(FERRY_ECODEC, "lz4: block of %zu bytes (to %zu) exceeds LZ4's 2 GiB limit", n, want);
    int got = LZ4_decompress_safe((const char *)in, (char *)out, (int)n, (int)want);
    if (got < 0) return ferry_seterr(FERRY_ECODEC, "lz4: corrupt block");
    if ((size_t)got != want)
        return ferry_seterr(FERRY_ECODEC, "lz4: block decoded to %d bytes, expected %zu", got, want);
    return 0;
}

int64_t ferry_lz4_decode(const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
    if (n < 4) return ferry_seterr(FERRY_ECODEC, "lz4: %zu bytes, too short for the 4-byte size header", n);
    uint32_t want = ferry_le32(in);
    if (want > cap)
        return ferry_seterr(FERRY_ECODEC, "lz4: header says %u bytes, more than the expected %zu", want, cap);
    int rc = ferry_lz4_block(in + 4, n - 4, out, want);
    return rc < 0 ? rc : (int64_t)want;
}
