/* shuffle.c — byte unshuffle, bit unshuffle and byteswap: the filters that
 * reorder bytes without changing their number.
 *
 * Byte unshuffle is on the hot path of blosc's default (lz4 + shuffle), so the
 * common element sizes 2, 4 and 8 interleave 16 elements at a time with SSE2
 * unpack instructions (part of x86-64's baseline, so no run-time check);
 * other sizes and other CPUs take the scalar loop. */
#include "codecs/impl.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static void unshuffle_scalar(const uint8_t *in, uint8_t *out, size_t nel, size_t es, size_t from) {
    for (size_t i = from; i < nel; i++)
        for (size_t j = 0; j < es; j++) out[i * es + j] = in[j * nel + i];
}

#if defined(__SSE2__)
#define LD(k) _mm_loadu_si128((const __m128i *)(in + (k) * nel + i))
#define ST(o, v) _mm_storeu_si128((__m128i *)(out + i * es + 16 * (o)), v)

static size_t unshuffle2_sse2(const uint8_t *in, uint8_t *out, size_t nel) {
    const size_t es = 2;
    size_t i = 0;
    for (; i + 16 <= nel; i += 16) {
        __m128i a = LD(0), b = LD(1);
        ST(0, _mm_unpacklo_epi8(a, b));
        ST(1, _mm_unpackhi_epi8(a, b));
    }
    return i;
}

static size_t unshuffle4_sse2(const uint8_t *in, uint8_t *out, size_t nel) {
    const size_t es = 4;
    size_t i = 0;
    for (; i + 16 <= nel; i += 16) {
        __m128i a = LD(0), b = LD(1), c = LD(2), d = LD(3);
        __m128i abl = _mm_unpacklo_epi8(a, b), abh = _mm_unpackhi_epi8(a, b);
        __m128i cdl = _mm_unpacklo_epi8(c, d), cdh = _mm_unpackhi_epi8(c, d);
        ST(0, _mm_unpacklo_epi16(abl, cdl));
        ST(1, _mm_unpackhi_epi16(abl, cdl));
        ST(2, _mm_unpacklo_epi16(abh, cdh));
        ST(3, _mm_unpackhi_epi16(abh, cdh));
    }
    return i;
}

static size_t unshuffle8_sse2(const uint8_t *in, uint8_t *out, size_t nel) {
    const size_t es = 8;
    size_t i = 0;
    for (; i + 16 <= nel; i += 16) {
        __m128i s0 = LD(0), s1 = LD(1), s2 = LD(2), s3 = LD(3), s4 = LD(4), s5 = LD(5), s6 = LD(6), s7 = LD(7);
        /* bytes 0-1, 2-3, 4-5, 6-7 of elements 0-7 (l) and 8-15 (h) */
        __m128i p01l = _mm_unpacklo_epi8(s0, s1), p01h = _mm_unpackhi_epi8(s0, s1);
        __m128i p23l = _mm_unpacklo_epi8(s2, s3), p23h = _mm_unpackhi_epi8(s2, s3);
        __m128i p45l = _mm_unpacklo_epi8(s4, s5), p45h = _mm_unpackhi_epi8(s4, s5);
        __m128i p67l = _mm_unpacklo_epi8(s6, s7), p67h = _mm_unpackhi_epi8(s6, s7);
        /* bytes 0-3 and 4-7 of elements 0-3, 4-7, 8-11, 12-15 */
        __m128i q03a = _mm_unpacklo_epi16(p01l, p23l), q03b = _mm_unpackhi_epi16(p01l, p23l);
        __m128i q03c = _mm_unpacklo_epi16(p01h, p23h), q03d = _mm_unpackhi_epi16(p01h, p23h);
        __m128i q47a = _mm_unpacklo_epi16(p45l, p67l), q47b = _mm_unpackhi_epi16(p45l, p67l);
        __m128i q47c = _mm_unpacklo_epi16(p45h, p67h), q47d = _mm_unpackhi_epi16(p45h, p67h);
        ST(0, _mm_unpacklo_epi32(q03a, q47a)); ST(1, _mm_unpackhi_epi32(q03a, q47a));
        ST(2, _mm_unpacklo_epi32(q03b, q47b)); ST(3, _mm_unpackhi_epi32(q03b, q47b));
        ST(4, _mm_unpacklo_epi32(q03c, q47c)); ST(5, _mm_unpackhi_epi32(q03c, q47c));
        ST(6, _mm_unpacklo_epi32(q03d, q47d)); ST(7, _mm_unpackhi_epi32(q03d, q47d));
    }
    return i;
}
#undef LD
#undef ST
#endif

/* Shuffled layout: byte j of every element, then byte j+1 of every element...
 * A trailing partial element is stored unchanged at the end. */
void ferry_unshuffle(const uint8_t *in, uint8_t *out, size_t n, size_t es) {
    if (es <= 1) { memcpy(out, in, n); return; }
    size_t nel = n / es, done = 0;
#if defined(__SSE2__)
    if (es == 2) done = unshuffle2_sse2(in, out, nel);
    else if (es == 4) done = unshuffle4_sse2(in, out, nel);
    else if (es == 8) done = unshuffle8_sse2(in, out, nel);
#endif
    unshuffle_scalar(in, out, nel, es, done);
    memcpy(out + nel * es, in + nel * es, n - nel * es);
}

/* Transpose an 8x8 bit matrix held as 8 bytes (row r = byte r, column c = bit c). */
static inline uint64_t transpose8(uint64_t x) {
    uint64_t t;
    t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAull;  x ^= t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCull; x ^= t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ull; x ^= t ^ (t << 28);
    return x;
}

/* Bitshuffled layout: for byte j of the element and bit k of that byte, a row
 * of nel bits (bit i%8 of byte i/8 is element i); row r = 8j + k.
 * Undone in two passes through tmp (nel * es bytes):
 *  1. per byte plane j, the 8 rows are 8 "streams" of nel/8 bytes: a byte
 *     unshuffle with element size 8 puts the 8 row bytes of each group of 8
 *     elements side by side — an 8x8 bit matrix whose transpose is byte j of
 *     those 8 elements, contiguous: the byte-shuffled layout;
 *  2. a byte unshuffle of element size es. */
void ferry_bitunshuffle(const uint8_t *in, uint8_t *out, uint8_t *tmp, size_t nel, size_t es) {
    size_t rowbytes = nel / 8;
    for (size_t j = 0; j < es; j++) {
        uint8_t *plane = tmp + j * nel;
        ferry_unshuffle(in + j * nel, plane, nel, 8);
        for (size_t g = 0; g < rowbytes; g++) {
            uint64_t x;
            memcpy(&x, plane + 8 * g, 8);
            x = transpose8(x);
            memcpy(plane + 8 * g, &x, 8);
        }
    }
    ferry_unshuffle(tmp, out, nel * es, es);
}

void ferry_byteswap(const uint8_t *in, uint8_t *out, size_t n, size_t es) {
    size_t nel = n / es;
    switch (es) {
    case 2: for (size_t i = 0; i < nel; i++) { uint16_t v; memcpy(&v, in + 2 * i, 2); v = __builtin_bswap16(v); memcpy(out + 2 * i, &v, 2); } break;
    case 4: for (size_t i = 0; i < nel; i++) { uint32_t v; memcpy(&v, in + 4 * i, 4); v = __builtin_bswap32(v); memcpy(out + 4 * i, &v, 4); } break;
    case 8: for (size_t i = 0; i < nel; i++) { uint64_t v; memcpy(&v, in + 8 * i, 8); v = __builtin_bswap64(v); memcpy(out + 8 * i, &v, 8); } break;
    default:
        for (size_t i = 0; i < nel; i++)
            for (size_t j = 0; j < es; j++) out[i * es + j] = in[i * es + es - 1 - j];
    }
    memcpy(out + nel * es, in + nel * es, n - nel * es);
}
