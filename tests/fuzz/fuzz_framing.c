/* fuzz_framing.c — the GPU decoder's framing parsers (src/codecs/framing.c)
 * over hostile bytes. The first byte picks the codec (zstd, zlib, gzip,
 * numcodecs LZ4), the rest is the chunk. Any input must give 0 with a payload
 * inside the chunk, or a negative code with a message; a zstd frame the
 * parser accepts must be one libzstd agrees is one whole frame of the same
 * announced size (the parser and the CPU decoder must not disagree about
 * where a frame ends). */
#include "fuzz.h"
#include "codecs/codecs.h"
#include "codecs/framing.h"
#include <zstd.h>

static int fuzz_framing(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if ((data[0] & 7) >= 4) {   /* blosc: every stream inside the frame and inside the decoded chunk */
        static ferry_blosc_stream st[4096];
        ferry_blosc_frame bf;
        uint64_t want = size >= 9 ? ferry_le32(data + 5) : 0;
        ferry_clearerr();
        int rc = ferry_frame_blosc(data + 1, size - 1, want, &bf, st, 4096);
        if (rc < 0) {
            if (!ferry_lasterr()[0] || (rc != FERRY_ECODEC && rc != FERRY_EUNSUPPORTED)) abort();
            return 0;
        }
        if (bf.nbytes != want || bf.nstreams > 4096) abort();
        for (size_t i = 0; i < bf.nstreams; i++) {
            if (st[i].src_off > size - 1 || st[i].src_len > size - 1 - st[i].src_off) abort();
            if (st[i].dst_off > bf.nbytes || st[i].dst_len > bf.nbytes - st[i].dst_off) abort();
        }
        return 0;
    }
    static const uint32_t ids[4] = {FERRY_CODEC_ZSTD, FERRY_CODEC_ZLIB, FERRY_CODEC_GZIP, FERRY_CODEC_LZ4};
    uint32_t id = ids[data[0] & 3];
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    ferry_clearerr();
    ferry_frame fr;
    uint64_t want = n >= 4 ? ferry_le32(p + n - 4) : 0;   /* gzip: make ISIZE agree sometimes */
    int rc = ferry_frame_parse(id, p, n, want, &fr);
    if (rc < 0) {
        if (!ferry_lasterr()[0]) abort();
        if (rc != FERRY_ECODEC && rc != FERRY_EUNSUPPORTED) abort();
        return 0;
    }
    if (fr.payload_off > n || fr.payload_len > n - fr.payload_off) abort();
    if (id == FERRY_CODEC_ZSTD) {
        size_t whole = ZSTD_findFrameCompressedSize(p, n);
        if (ZSTD_isError(whole) || whole != n) abort();
        unsigned long long c = ZSTD_getFrameContentSize(p, n);
        if (c == ZSTD_CONTENTSIZE_ERROR) abort();
        if ((c == ZSTD_CONTENTSIZE_UNKNOWN) != (fr.decoded == UINT64_MAX)) abort();
        if (c != ZSTD_CONTENTSIZE_UNKNOWN && c != fr.decoded) abort();
    }
    return 0;
}
FERRY_FUZZ_TARGET(framing, fuzz_framing)
