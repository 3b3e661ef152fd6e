/* zstd.c — zstd frames (one or several, with or without a content size)
 * through one reusable ZSTD_DCtx per scratch. */
#include "codecs/impl.h"
#include <zstd.h>
#include <zstd_errors.h>

int64_t ferry_zstd_decode(ferry_decode_scratch *s, const uint8_t *in, size_t n,
                          uint8_t *out, size_t cap) {
    if (!s->zstd && !(s->zstd = ZSTD_createDCtx()))
        return ferry_seterr(FERRY_ENOMEM, "zstd: cannot create a decompression context");
    /* A frame that announces more than we expect is refused before any work */
    unsigned long long want = ZSTD_getFrameContentSize(in, n);
    if (want == ZSTD_CONTENTSIZE_ERROR)
        return ferry_seterr(FERRY_ECODEC, "zstd: not a zstd frame (bad magic or header)");
    if (want != ZSTD_CONTENTSIZE_UNKNOWN && want > cap)
        return ferry_seterr(FERRY_ECODEC, "zstd: frame holds %llu bytes, more than the expected %zu", want, cap);
    size_t r = ZSTD_decompressDCtx(s->zstd, out, cap, in, n);
    if (ZSTD_isError(r)) {
        if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall)
            return ferry_seterr(FERRY_ECODEC, "zstd: decoded data larger than the expected %zu bytes", cap);
        return ferry_seterr(FERRY_ECODEC, "zstd: %s", ZSTD_getErrorName(r));
    }
    return (int64_t)r;
}

int ferry_zstd_exact(ferry_decode_scratch *s, const uint8_t *in, size_t n, uint8_t *out, size_t want) {
    int64_t got = ferry_zstd_decode(s, in, n, out, want);
    if (got < 0) return (int)got;
    if ((size_t)got != want)
        return ferry_seterr(FERRY_ECODEC, "zstd: decoded %lld bytes, expected %zu", (long long)got, want);
    return 0;
}
