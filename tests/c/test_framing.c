/* test_framing.c — the GPU decoder's framing parsers (src/codecs/framing.c)
 * on frames libzstd, zlib and liblz4 write, and on broken ones; and the CPU
 * inflate's trailer checks (libdeflate where built with it, else zlib):
 * a wrong Adler-32, gzip CRC-32 or ISIZE is an error, never data. */
#include "check.h"
#include "codecs/codecs.h"
#include "codecs/framing.h"
#include <lz4.h>
#include <zlib.h>
#include <zstd.h>

static uint8_t src_[20000], enc_[40000], out_[20000];

static void fill_src(void) { for (size_t i = 0; i < sizeof src_; i++) src_[i] = (uint8_t)((i * 31) % 253 ^ (i >> 7)); }

static void test_zstd_frames(void) {
    ferry_frame fr;
    for (int level = -1; level <= 19; level += 5) {
        size_t n = ZSTD_compress(enc_, sizeof enc_, src_, sizeof src_, level);
        CHECK_EQ_I(ferry_frame_parse(FERRY_CODEC_ZSTD, enc_, n, sizeof src_, &fr), 0);
        CHECK_EQ_I(fr.payload_off, 0);
        CHECK_EQ_I(fr.payload_len, n);
        CHECK_EQ_I(fr.decoded, sizeof src_);
        /* the chunk says another size: refused before any GPU work */
        CHECK_EQ_I(ferry_frame_parse(FERRY_CODEC_ZSTD, enc_, n, sizeof src_ - 1, &fr), FERRY_ECODEC);
        CHECK_STR_CONTAINS(ferry_lasterr(), "announces");
        /* truncated anywhere: an error */
        for (size_t cut = 1; cut < n; cut += n / 7 + 1) CHECK(ferry_frame_zstd(enc_, n - cut, &fr) < 0);
        /* two frames: valid, but for the CPU */
        memcpy(enc_ + n, enc_, n);
        CHECK_EQ_I(ferry_frame_zstd(enc_, 2 * n, &fr), FERRY_EUNSUPPORTED);
    }
    /* a content checksum: the CPU verifies it (no XXH64 on the GPU) */
    ZSTD_CCtx *c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
    size_t n = ZSTD_compress2(c, enc_, sizeof enc_, src_, 1000);
    ZSTD_freeCCtx(c);
    CHECK_EQ_I(ferry_frame_zstd(enc_, n, &fr), FERRY_EUNSUPPORTED);
    CHECK_STR_CONTAINS(ferry_lasterr(), "checksum");
    enc_[0] ^= 1;
    CHECK_EQ_I(ferry_frame_zstd(enc_, n, &fr), FERRY_ECODEC);
    CHECK_STR_CONTAINS(ferry_lasterr(), "magic");
}

static void test_zlib_and_gzip(void) {
    ferry_frame fr;
    uLongf m = sizeof enc_;
    compress2(enc_, &m, src_, sizeof src_, 4);
    CHECK_EQ_I(ferry_frame_parse(FERRY_CODEC_ZLIB, enc_, m, sizeof src_, &fr), 0);
    CHECK_EQ_I(fr.payload_off, 2);
    CHECK_EQ_I(fr.payload_len, m - 6);
    CHECK_EQ_I(fr.check, FERRY_FRAME_CHECK_ADLER32);
    CHECK_EQ_I(fr.check_value, ferry_adler32(1, src_, sizeof src_));
    CHECK_EQ_I(fr.check_value, (uint32_t)adler32(1, src_, sizeof src_));
    enc_[1] ^= 1;   /* header check bits */
    CHECK_EQ_I(ferry_frame_zlib(enc_, m, &fr), FERRY_ECODEC);
    /* gzip: header fields walked, ISIZE against the chunk */
    z_stream z;
    memset(&z, 0, sizeof z);
    deflateInit2(&z, 4, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY);
    gz_header h;
    memset(&h, 0, sizeof h);
    h.name = (Bytef *)"chunk.bin";
    h.comment = (Bytef *)"a comment";
    deflateSetHeader(&z, &h);
    z.next_in = src_; z.avail_in = sizeof src_; z.next_out = enc_; z.avail_out = sizeof enc_;
    deflate(&z, Z_FINISH);
    size_t g = sizeof enc_ - z.avail_out;
    deflateEnd(&z);
    CHECK_EQ_I(ferry_frame_parse(FERRY_CODEC_GZIP, enc_, g, sizeof src_, &fr), 0);
    CHECK_EQ_I(fr.payload_off, 10 + 10 + 10);
    CHECK_EQ_I(fr.check_value, (uint32_t)crc32(0, src_, sizeof src_));
    CHECK_EQ_I(ferry_frame_parse(FERRY_CODEC_GZIP, enc_, g, sizeof src_ + 1, &fr), FERRY_ECODEC);
    CHECK_STR_CONTAINS(ferry_lasterr(), "holds");
}

static void test_lz4(void) {
    ferry_frame fr;
    int n = LZ4_compress_default((const char *)src_, (char *)enc_ + 4, sizeof src_, sizeof enc_ - 4);
    uint32_t sz = sizeof src_;
    memcpy(enc_, &sz, 4);
    CHECK_EQ_I(ferry_frame_parse(FERRY_CODEC_LZ4, enc_, (size_t)n + 4, sizeof src_, &fr), 0);
    CHECK_EQ_I(fr.payload_off, 4);
    CHECK_EQ_I(ferry_frame_parse(FERRY_CODEC_LZ4, enc_, (size_t)n + 4, 100, &fr), FERRY_ECODEC);
    CHECK_EQ_I(ferry_frame_parse(FERRY_CODEC_LZ4, enc_, 3, 100, &fr), FERRY_ECODEC);
}

/* The CPU inflate (libdeflate or zlib) refuses a stream whose trailer lies. */
static void test_cpu_inflate_checks_trailers(void) {
    ferry_decode_scratch s;
    ferry_decode_scratch_init(&s);
    ferry_codec zl = {FERRY_CODEC_ZLIB, 0}, gz = {FERRY_CODEC_GZIP, 0};
    uLongf m = sizeof enc_;
    compress2(enc_, &m, src_, sizeof src_, 6);
    CHECK_EQ_I(ferry_decode(&zl, 1, enc_, m, out_, sizeof out_, &s), (int64_t)sizeof src_);
    CHECK(memcmp(out_, src_, sizeof src_) == 0);
    enc_[m - 1] ^= 1;   /* Adler-32 */
    CHECK_EQ_I(ferry_decode(&zl, 1, enc_, m, out_, sizeof out_, &s), FERRY_ECODEC);
    CHECK_STR_CONTAINS(ferry_lasterr(), "zlib");
    z_stream z;
    memset(&z, 0, sizeof z);
    deflateInit2(&z, 4, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY);
    z.next_in = src_; z.avail_in = sizeof src_; z.next_out = enc_; z.avail_out = sizeof enc_;
    deflate(&z, Z_FINISH);
    size_t g = sizeof enc_ - z.avail_out;
    deflateEnd(&z);
    CHECK_EQ_I(ferry_decode(&gz, 1, enc_, g, out_, sizeof out_, &s), (int64_t)sizeof src_);
    for (int which = 0; which < 2; which++) {   /* CRC-32, then ISIZE */
        enc_[g - 8 + 4 * which] ^= 1;
        CHECK_EQ_I(ferry_decode(&gz, 1, enc_, g, out_, sizeof out_, &s), FERRY_ECODEC);
        CHECK_STR_CONTAINS(ferry_lasterr(), "gzip");
        enc_[g - 8 + 4 * which] ^= 1;
    }
    /* output larger than the chunk: an error, not a truncation */
    CHECK_EQ_I(ferry_decode(&gz, 1, enc_, g, out_, sizeof src_ - 1, &s), FERRY_ECODEC);
    ferry_decode_scratch_free(&s);
}

int main(void) {
    fill_src();
    RUN(test_zstd_frames);
    RUN(test_zlib_and_gzip);
    RUN(test_lz4);
    RUN(test_cpu_inflate_checks_trailers);
    return check_summary();
}
