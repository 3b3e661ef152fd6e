/* shuffle.c — byte unshuffle, bit unshuffle and byteswap: the filters that
 * reorder bytes without changing their number. */
#include "codecs/impl.h"

/* Shuffled layout: byte j of every element, then byte j+1 of every element...
 * A trailing partial element is stored unchanged at the end. */
void ferry_unshuffle(const uint8_t *in, uint8_t *out, size_t n, size_t es) {
    if (es <= 1) { memcpy(out, in, n); return; }
    size_t nel = n / es;
    switch (es) {   /* fixed sizes let the compiler unroll the inner loop */
#define UNSHUF(E) case E: { for (size_t i = 0; i < nel; i++) { for (size_t j = 0; j < E; j++) \
                      out[i * E + j] = in[j * nel + i]; } } break;
    UNSHUF(2) UNSHUF(4) UNSHUF(8)
#undef UNSHUF
    default:
        for (size_t i = 0; i < nel; i++)
            for (size_t j = 0; j < es; j++) out[i * es + j] = in[j * nel + i];
    }
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
 * of nel bits (bit i%8 of byte i/8 is element i). Row r = 8j + k. For each
 * group of 8 elements and each byte j, the 8 row bytes form an 8x8 bit matrix
 * whose transpose is byte j of those 8 elements. */
void ferry_bitunshuffle(const uint8_t *in, uint8_t *out, size_t nel, size_t es) {
    size_t rowbytes = nel / 8;
    for (size_t g = 0; g < rowbytes; g++) {
        for (size_t j = 0; j < es; j++) {
            uint64_t x = 0;
            for (int k = 0; k < 8; k++) x |= (uint64_t)in[(j * 8 + (size_t)k) * rowbytes + g] << (8 * k);
            x = transpose8(x);
            for (int t = 0; t < 8; t++) out[(g * 8 + (size_t)t) * es + j] = (uint8_t)(x >> (8 * t));
        }
    }
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
