/* framing.h — what a GPU decoder needs to know about one compressed chunk,
 * read from its framing on the CPU: where the payload nvCOMP decodes starts
 * and ends, how many bytes it announces, and which trailer check the decoded
 * bytes must pass. Pure parsers over untrusted bytes (tests/fuzz/fuzz_framing.c);
 * no decompression. Internal.
 *
 * Every parser returns 0 with *out filled, or
 *   FERRY_ECODEC        the bytes are not a valid frame of that codec (corrupt,
 *                       truncated, a size that contradicts the chunk's), message set;
 *   FERRY_EUNSUPPORTED  a valid frame the GPU path does not take as one unit
 *                       (several zstd frames, a dictionary, a zstd content
 *                       checksum, a zlib preset dictionary): the CPU decodes it. */
#ifndef FERRY_FRAMING_H
#define FERRY_FRAMING_H
#include "common.h"

typedef enum ferry_frame_alg { FERRY_FRAME_ZSTD = 0, FERRY_FRAME_LZ4 = 1, FERRY_FRAME_DEFLATE = 2 } ferry_frame_alg;
typedef enum ferry_frame_check {
    FERRY_FRAME_CHECK_NONE = 0,
    FERRY_FRAME_CHECK_ADLER32 = 1,   /* zlib trailer: Adler-32 of the decoded bytes */
    FERRY_FRAME_CHECK_CRC32 = 2      /* gzip trailer: CRC-32 of the decoded bytes */
} ferry_frame_check;

typedef struct ferry_frame {
    ferry_frame_alg alg;      /* the nvCOMP decompressor (= ferry_nvcomp_alg) */
    uint64_t payload_off;     /* nvCOMP's input: bytes [payload_off, payload_off + payload_len) */
    uint64_t payload_len;
    uint64_t decoded;         /* decoded size the frame announces; UINT64_MAX when it does not say */
    ferry_frame_check check;
    uint32_t check_value;     /* the trailer's value */
} ferry_frame;

/* One zstd frame (Zarr v3 "zstd", numcodecs Zstd): header, then each block's
 * header walked to the frame's end, which must be the chunk's end. */
int ferry_frame_zstd(const uint8_t *p, size_t n, ferry_frame *out);
/* One zlib stream (RFC 1950): 2-byte header, raw deflate, Adler-32 (big-endian). */
int ferry_frame_zlib(const uint8_t *p, size_t n, ferry_frame *out);
/* One gzip member (RFC 1952): header with its optional fields, raw deflate,
 * CRC-32 and ISIZE (the decoded size mod 2^32, checked against `want`). */
int ferry_frame_gzip(const uint8_t *p, size_t n, uint64_t want, ferry_frame *out);
/* numcodecs LZ4: u32 LE decoded size, then one LZ4 block. */
int ferry_frame_lz4(const uint8_t *p, size_t n, ferry_frame *out);
/* Dispatch on a codec id (FERRY_CODEC_ZSTD/ZLIB/GZIP/LZ4); want is the chunk's
 * decoded size, which an announced size must equal. Other ids: EUNSUPPORTED. */
int ferry_frame_parse(uint32_t codec, const uint8_t *p, size_t n, uint64_t want, ferry_frame *out);

/* A blosc v1 frame (numcodecs Blosc, Zarr v2's default), split into the
 * streams a GPU decodes: each block's splits, in order. */
typedef struct ferry_blosc_stream {
    uint64_t src_off, src_len;   /* the stream's bytes in the frame */
    uint64_t dst_off, dst_len;   /* where it decodes to, before the block's unshuffle */
    int raw;                     /* stored as is: copied, not decoded */
} ferry_blosc_stream;

typedef struct ferry_blosc_frame {
    int inner;                   /* FERRY_CODEC_LZ4 / ZSTD / ZLIB, or 0 for blosclz, snappy, ... */
    int memcpyed;                /* the whole frame is raw bytes at offset 16 */
    int shuffle;                 /* each block byte-shuffled with typesize (0: no filter) */
    int bitshuffle;              /* each block bit-shuffled (then the CPU decodes it) */
    unsigned typesize;
    int version;                 /* format version (<= 2: a block whose element count is not a multiple of 8 is not bitshuffled) */
    uint64_t nbytes, blocksize, nblocks;
    size_t nstreams;             /* streams[0..nstreams) filled (when memcpyed: 0) */
} ferry_blosc_frame;

/* Parse the header and every block's split headers of a blosc v1 frame
 * that must decode to `want` bytes, writing at most `cap` streams.
 * EUNSUPPORTED: blosc2 extended headers, more streams than cap. */
int ferry_frame_blosc(const uint8_t *p, size_t n, uint64_t want, ferry_blosc_frame *out,
                      ferry_blosc_stream *streams, size_t cap);

/* Adler-32 (zlib's checksum), for tests and the CPU-side check. */
uint32_t ferry_adler32(uint32_t adler, const uint8_t *p, size_t n);
#endif
