/* impl.h — the pieces decode.c chains together. Internal to src/codecs/.
 * Each decoder writes at most `cap` bytes to out and returns the number
 * written, or a negative ferry_status with a message naming the codec. */
#ifndef FERRY_CODECS_IMPL_H
#define FERRY_CODECS_IMPL_H
#include "codecs/codecs.h"

/* Make *buf hold at least need bytes (keeps the old allocation when it is
 * big enough, so a warm scratch never allocates). NULL on ENOMEM. */
uint8_t *ferry_scratch_reserve(uint8_t **buf, size_t *cap, size_t need);

int64_t ferry_zlib_decode(ferry_decode_scratch *s, int gzip, const uint8_t *in, size_t n,
                          uint8_t *out, size_t cap);
/* Free the libdeflate decompressor of a scratch (zlib.c), if any. */
void ferry_zlib_scratch_free(ferry_decode_scratch *s);
int64_t ferry_zstd_decode(ferry_decode_scratch *s, const uint8_t *in, size_t n,
                          uint8_t *out, size_t cap);
/* numcodecs LZ4: u32 LE decoded size, then one LZ4 block */
int64_t ferry_lz4_decode(const uint8_t *in, size_t n, uint8_t *out, size_t cap);
/* A raw LZ4 block that must decode to exactly `want` bytes (blosc's inner codec). */
int ferry_lz4_block(const uint8_t *in, size_t n, uint8_t *out, size_t want);
/* A BloscLZ stream (blosc's default inner codec) that must decode to exactly `want` bytes. */
int ferry_blosclz_block(const uint8_t *in, size_t n, uint8_t *out, size_t want);
/* A zlib stream / zstd frame that must decode to exactly `want` bytes. */
int ferry_zlib_exact(ferry_decode_scratch *s, const uint8_t *in, size_t n, uint8_t *out, size_t want);
int ferry_zstd_exact(ferry_decode_scratch *s, const uint8_t *in, size_t n, uint8_t *out, size_t want);
int64_t ferry_blosc_decode(ferry_decode_scratch *s, const uint8_t *in, size_t n,
                           uint8_t *out, size_t cap);

/* Filters: out-of-place, n bytes. Bytes past the last whole element are copied. */
void ferry_unshuffle(const uint8_t *in, uint8_t *out, size_t n, size_t elsize);
/* Undo bitshuffle of nel elements (nel a multiple of 8) of elsize bytes;
 * tmp holds nel * elsize bytes. */
void ferry_bitunshuffle(const uint8_t *in, uint8_t *out, uint8_t *tmp, size_t nel, size_t elsize);
void ferry_byteswap(const uint8_t *in, uint8_t *out, size_t n, size_t elsize);

/* HDF5 fletcher32 over n bytes (the value its filter appends). */
uint32_t ferry_fletcher32(const uint8_t *p, size_t n);
#endif
