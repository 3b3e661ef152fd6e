/* fletcher32.c — HDF5's fletcher32 checksum (H5Z fletcher32 filter): sums of
 * big-endian 16-bit words, an odd last byte counting as its high half, both
 * sums folded mod 65535 often enough never to overflow 32 bits. */
#include "codecs/impl.h"

uint32_t ferry_fletcher32(const uint8_t *p, size_t n) {
    uint32_t s1 = 0, s2 = 0;
    size_t words = n / 2;
    while (words) {
        size_t batch = words > 360 ? 360 : words;   /* 360 words keep s2 below 2^32 */
        words -= batch;
        while (batch--) { s1 += ((uint32_t)p[0] << 8) | p[1]; s2 += s1; p += 2; }
        s1 = (s1 & 0xffff) + (s1 >> 16);
        s2 = (s2 & 0xffff) + (s2 >> 16);
    }
    if (n & 1) {
        s1 += (uint32_t)p[0] << 8; s2 += s1;
        s1 = (s1 & 0xffff) + (s1 >> 16);
        s2 = (s2 & 0xffff) + (s2 >> 16);
    }
    s1 = (s1 & 0xffff) + (s1 >> 16);
    s2 = (s2 & 0xffff) + (s2 >> 16);
    return (s2 << 16) | s1;
}
