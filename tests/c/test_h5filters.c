/* test_h5filters.c — HDF5's lz4 (32004) and bitshuffle (32008) framings
 * (src/codecs/h5filters.c) through ferry_decode: frames built here with
 * liblz4 / libzstd and a bit-by-bit bitshuffle written from the format's
 * definition decode to the data; every truncation and a sweep of bit flips
 * give an error or the right bytes, never a crash (run it under ASan). The
 * files hdf5plugin writes are checked in tests/python/test_hdf5_c.py. */
#include "check.h"
#include "codecs/codecs.h"
#include "codecs/h5filters.h"
#include "ferry.h"
#include <lz4.h>
#include <zstd.h>

static void put_be(uint8_t *p, uint64_t v, int n) {
    for (int i = n - 1; i >= 0; i--) { p[i] = (uint8_t)v; v >>= 8; }
}

/* bitshuffle of m elements (m % 8 == 0): row 8j+k holds bit k of byte j of every element */
static void bitshuffle(const uint8_t *in, uint8_t *out, size_t m, size_t es) {
    memset(out, 0, m * es);
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < es; j++)
            for (int k = 0; k < 8; k++)
                if (in[i * es + j] >> k & 1) out[(j * 8 + k) * (m / 8) + i / 8] |= (uint8_t)(1u << (i % 8));
}

/* a bitshuffle frame: comp 0 none (default blocks), 2 lz4, 3 zstd (blocks of `block` elements) */
static size_t bs_frame(const uint8_t *data, size_t nel, size_t es, unsigned comp, size_t block, uint8_t *out) {
    size_t pos = 0;
    if (comp) {
        put_be(out, nel * es, 8);
        put_be(out + 8, block * es, 4);
        pos = 12;
    } else {
        block = 8192 / es - (8192 / es) % 8;
        if (block < 128) block = 128;
    }
    uint8_t *t = malloc(block * es);
    size_t done = 0;
    while (nel - done >= 8) {
        size_t m = nel - done < block ? (nel - done) - (nel - done) % 8 : block;
        bitshuffle(data + done * es, comp ? t : out + pos, m, es);
        if (comp == 2) {
            int c = LZ4_compress_default((const char *)t, (char *)out + pos + 4, (int)(m * es), LZ4_compressBound((int)(m * es)));
            put_be(out + pos, (uint64_t)c, 4);
            pos += 4 + (size_t)c;
        } else if (comp == 3) {
            size_t c = ZSTD_compress(out + pos + 4, ZSTD_compressBound(m * es), t, m * es, 3);
            put_be(out + pos, c, 4);
            pos += 4 + c;
        } else {
            pos += m * es;
        }
        done += m;
    }
    memcpy(out + pos, data + done * es, (nel - done) * es);
    free(t);
    return pos + (nel - done) * es;
}

/* an lz4 filter frame: blocks of `block` bytes, one stored raw when LZ4 does not shrink it */
static size_t lz4_frame(const uint8_t *data, size_t n, size_t block, uint8_t *out) {
    put_be(out, n, 8);
    put_be(out + 8, block, 4);
    size_t pos = 12;
    for (size_t d = 0; d < n; d += block) {
        size_t b = n - d < block ? n - d : block;
        int c = LZ4_compress_default((const char *)data + d, (char *)out + pos + 4, (int)b, LZ4_compressBound((int)b));
        if ((size_t)c >= b) { memcpy(out + pos + 4, data + d, b); c = (int)b; }
        put_be(out + pos, (uint64_t)c, 4);
        pos += 4 + (size_t)c;
    }
    return pos;
}

/* decodes to data; every truncation fails; bit flips fail or give data */
static void sweep(ferry_codec k, const uint8_t *frame, size_t n, const uint8_t *data, size_t want) {
    ferry_decode_scratch s;
    ferry_decode_scratch_init(&s);
    uint8_t *out = malloc(want + 1), *b = malloc(n + 1);
    CHECK_EQ_I(ferry_decode(&k, 1, frame, n, out, want, &s), (int64_t)want);
    CHECK(!memcmp(out, data, want));
    for (size_t cut = 0; cut < n; cut++) {
        memcpy(b, frame, cut);
        int64_t got = ferry_decode(&k, 1, b, cut, out, want, &s);
        CHECK(got < 0 || (got == (int64_t)want && !memcmp(out, data, want)) || (size_t)got < want);
    }
    for (size_t at = 0; at < n; at += 1 + n / 300) {
        memcpy(b, frame, n);
        b[at] ^= (uint8_t)(1u << (at % 8));
        int64_t got = ferry_decode(&k, 1, b, n, out, want, &s);
        (void)got;   /* any result but a crash or an overrun (ASan) */
    }
    free(out);
    free(b);
    ferry_decode_scratch_free(&s);
}

static uint8_t *sample(size_t n) {
    uint8_t *p = malloc(n);
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) { x = x * 1103515245u + 12345u; p[i] = (uint8_t)((i / 7) + (x >> 28)); }
    return p;
}

static void test_lz4_frames(void) {
    size_t n = 10007;
    uint8_t *d = sample(n), *f = malloc(2 * n + 4096);
    size_t blocks[] = {1024, 4096, 1 << 20, 7};
    for (int i = 0; i < 4; i++) {
        size_t m = lz4_frame(d, n, blocks[i], f);
        sweep((ferry_codec){FERRY_CODEC_H5LZ4, 0}, f, m, d, n);
    }
    free(d);
    free(f);
}

static void test_bitshuffle_frames(void) {
    size_t es_list[] = {1, 2, 4, 8, 16, 3};
    for (int e = 0; e < 6; e++) {
        size_t es = es_list[e], nel = 1003;   /* a partial block and 3 trailing elements */
        uint8_t *d = sample(nel * es), *f = malloc(4 * nel * es + 4096);
        for (unsigned comp = 0; comp <= 3; comp++) {
            if (comp == 1) continue;
            size_t m = bs_frame(d, nel, es, comp, 256, f);
            sweep((ferry_codec){FERRY_CODEC_BITSHUFFLE, FERRY_H5BSHUF_PARAM(es, comp)}, f, m, d, nel * es);
        }
        free(d);
        free(f);
    }
}

static void test_bad_params_refused(void) {
    ferry_codec bad[] = {{FERRY_CODEC_BITSHUFFLE, 0}, {FERRY_CODEC_BITSHUFFLE, FERRY_H5BSHUF_PARAM(4, 1)},
                         {FERRY_CODEC_BITSHUFFLE, FERRY_H5BSHUF_PARAM(4, 7)}};
    for (int i = 0; i < 3; i++) CHECK(ferry_codecs_validate(&bad[i], 1) == FERRY_EINVAL);
    ferry_codec ok = {FERRY_CODEC_BITSHUFFLE, FERRY_H5BSHUF_PARAM(4, 2)};
    CHECK_EQ_I(ferry_codecs_validate(&ok, 1), 0);
    /* a compressed frame whose block is not a multiple of 8 elements */
    uint8_t f[16] = {0};
    put_be(f, 40, 8);
    put_be(f + 8, 12, 4);
    uint8_t out[40];
    ferry_decode_scratch s;
    ferry_decode_scratch_init(&s);
    CHECK(ferry_decode(&ok, 1, f, sizeof f, out, sizeof out, &s) == FERRY_ECODEC);
    ferry_decode_scratch_free(&s);
}

int main(void) {
    RUN(test_lz4_frames);
    RUN(test_bitshuffle_frames);
    RUN(test_bad_params_refused);
    return check_summary();
}
