/* codecs.h — CPU decoding of one extent's bytes (file bytes -> array bytes).
 * Internal. Called by the engine's worker threads; each worker owns one
 * ferry_decode_scratch, so nothing here takes a lock and, once the scratch is
 * warm, nothing is allocated per call.
 *
 * A chain is a list of ferry_codec steps (include/ferry.h) in *decoding*
 * order: chain[0] is applied to the bytes read from the file, chain[n-1]
 * produces the array bytes. Errors return a negative ferry_status with a
 * ferry_seterr message that names the codec and what is wrong; the caller
 * prefixes the file and offset (ferry_preerr).
 *
 * This interface is shared with the engine (src/engine/): extend it, never
 * change it incompatibly. */
#ifndef FERRY_CODECS_H
#define FERRY_CODECS_H
#include "common.h"

/* Per-worker state. Treat the fields as private; the struct is public only so
 * the engine can embed it. Zero-initialised (or _init) is a valid empty state. */
typedef struct ferry_decode_scratch {
    uint8_t *buf[2];     /* ping-pong buffers for intermediate steps, grown on demand */
    size_t cap[2];
    uint8_t *tmp;        /* one blosc block while it is unshuffled */
    size_t tmp_cap;
    uint8_t *tmp2;       /* one blosc block between bitshuffle's two passes */
    size_t tmp2_cap;
    void *zstd;          /* ZSTD_DCtx *, created on first use */
    void *zlib;          /* z_stream *, inflateInit'ed on first use, inflateReset after */
    void *deflate;       /* struct libdeflate_decompressor * (builds with libdeflate), on first use */
} ferry_decode_scratch;

void ferry_decode_scratch_init(ferry_decode_scratch *s);
/* Free everything the scratch holds; leaves it in the _init state. NULL: no-op. */
void ferry_decode_scratch_free(ferry_decode_scratch *s);

/* Apply chain[0..n) to in[0..in_len) and write the result to out[0..out_cap).
 * Returns the decoded length (<= out_cap), or a negative code:
 *   FERRY_ECODEC     corrupt or truncated data, or output larger than out_cap
 *   FERRY_ECHECKSUM  crc32c / fletcher32 mismatch
 *   FERRY_EUNSUPPORTED  a valid frame using something not implemented
 *                    (blosc's blosclz or snappy inner codecs, ...)
 *   FERRY_EINVAL     bad chain (unknown id, bad element size, n out of range)
 *   FERRY_ENOMEM
 * n == 0 copies in to out. in and out must not overlap. */
int64_t ferry_decode(const ferry_codec *chain, int n, const uint8_t *in, size_t in_len,
                     uint8_t *out, size_t out_cap, ferry_decode_scratch *s);

/* If the chain is exactly one BYTESWAP step and nothing else, return its
 * element size (1, 2, 4, 8 or 16); otherwise 0. The engine may then do the
 * swap on the GPU instead of calling ferry_decode (decoded_size == length). */
int ferry_codecs_only_byteswap(const ferry_codec *chain, int n);

/* Check a chain without data: every id known, every param valid.
 * Returns 0 or FERRY_EINVAL / FERRY_EUNSUPPORTED with a message. */
int ferry_codecs_validate(const ferry_codec *chain, int n);

/* ferry_codec_name (a codec id's name, for messages) is public: ferry.h, src/base/names.c. */
/* Verify the trailing 4-byte checksum of a CRC32C or FLETCHER32 step over
 * p[0..*len-4) and shorten *len by 4 (the GPU decoder checks encoded bytes
 * on the CPU with this before their payload goes to the device).
 * FERRY_ECHECKSUM / FERRY_ECODEC with a message. */
int ferry_codecs_verify_trailer(uint32_t id, const uint8_t *p, size_t *len);

/* CRC-32C (Castagnoli), as used by Zarr v3's crc32c codec: crc starts at 0
 * for a fresh computation; feed the previous result to continue. */
uint32_t ferry_crc32c(uint32_t crc, const void *data, size_t n);

#endif
