/* h5filters.h — HDF5's lz4 (32004) and bitshuffle (32008) filter framings
 * (h5filters.c). Internal. */
#ifndef FERRY_CODECS_H5FILTERS_H
#define FERRY_CODECS_H5FILTERS_H
#include "codecs/codecs.h"

/* FERRY_CODEC_BITSHUFFLE's param: the element size (below 2^24) and, in the
 * top byte, the compression inside the frame: 0 none, 2 lz4, 3 zstd (the
 * filter's cd_values[4]). */
#define FERRY_H5BSHUF_LZ4 2u
#define FERRY_H5BSHUF_ZSTD 3u
#define FERRY_H5BSHUF_PARAM(elsize, comp) ((uint32_t)(elsize) | (uint32_t)(comp) << 24)
#define FERRY_H5BSHUF_ELSIZE(param) ((param) & 0xffffffu)
#define FERRY_H5BSHUF_COMP(param) ((param) >> 24)

int64_t ferry_h5lz4_decode(const uint8_t *in, size_t n, uint8_t *out, size_t cap);
int64_t ferry_h5bitshuffle_decode(ferry_decode_scratch *s, const uint8_t *in, size_t n, uint8_t *out, size_t cap,
                                  uint32_t param);
#endif
