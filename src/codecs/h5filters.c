/* h5filters.c — two registered HDF5 filters whose chunk framing is their own:
 *
 * lz4 (HDF5 filter 32004, H5Zlz4): a header of the decoded size (u64,
 *   big-endian) and the block size (u32 BE), then each block as a u32 BE
 *   stored size and that many bytes: an LZ4 block, or the block's bytes as
 *   they are when the stored size equals the block's (LZ4 did not shrink it).
 *   The last block holds what is left.
 *
 * bitshuffle (HDF5 filter 32008): the elements are bit-transposed in blocks
 *   of block_size elements (the layout shuffle.c's ferry_bitunshuffle undoes;
 *   a block's element count is a multiple of 8: the last block is cut down
 *   to one and the size % 8 elements left over are stored as they are).
 *   Compressed (cd_values[4] 2 lz4, 3 zstd): a header of the decoded size
 *   (u64 BE) and the block size in bytes (u32 BE), then each block as a u32
 *   BE stored size and an LZ4 block (or a zstd frame) of the bit-transposed
 *   block; the leftover elements follow as they are. Uncompressed: the blocks
 *   back to back, of the default block size (8 KiB of elements, a multiple
 *   of 8 elements, at least 128).
 *
 * The framings were learnt from the filters' format descriptions; every
 * length read is checked against the bytes there and the bytes expected. */
#include "codecs/impl.h"
#include "codecs/h5filters.h"
#include <stdlib.h>

static uint64_t be64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}
static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

int64_t ferry_h5lz4_decode(const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
    if (n < 12) return ferry_seterr(FERRY_ECODEC, "hdf5 lz4: %zu bytes, too short for the 12-byte header", n);
    uint64_t total = be64(in), block = be32(in + 8);
    if (total > cap)
        return ferry_seterr(FERRY_ECODEC, "hdf5 lz4: header says %llu bytes, more than the expected %zu",
                            (unsigned long long)total, cap);
    if (total && !block) return ferry_seterr(FERRY_ECODEC, "hdf5 lz4: block size 0");
    size_t pos = 12;
    for (uint64_t done = 0; done < total;) {
        uint64_t want = total - done < block ? total - done : block;
        if (n - pos < 4) return ferry_seterr(FERRY_ECODEC, "hdf5 lz4: block at byte %zu truncated", pos);
        uint32_t stored = be32(in + pos);
        pos += 4;
        if (stored > n - pos)
            return ferry_seterr(FERRY_ECODEC, "hdf5 lz4: block at byte %zu says %u bytes, %zu there", pos - 4, stored, n - pos);
        if (stored == want) {
            memcpy(out + done, in + pos, want);
        } else {
            int rc = ferry_lz4_block(in + pos, stored, out + done, (size_t)want);
            if (rc < 0) return rc;
        }
        pos += stored;
        done += want;
    }
    return (int64_t)total;
}

/* bitshuffle's default block: 8 KiB of elements, a multiple of 8, at least 128 */
static size_t default_block(size_t es) {
    size_t b = 8192 / es;
    b -= b % 8;
    return b < 128 ? 128 : b;
}

int64_t ferry_h5bitshuffle_decode(ferry_decode_scratch *s, const uint8_t *in, size_t n, uint8_t *out, size_t cap,
                                  uint32_t param) {
    size_t es = FERRY_H5BSHUF_ELSIZE(param);
    unsigned comp = FERRY_H5BSHUF_COMP(param);
    if (!es) return ferry_seterr(FERRY_ECODEC, "bitshuffle: element size 0");
    uint64_t total;
    size_t block, pos = 0;
    if (comp) {
        if (n < 12) return ferry_seterr(FERRY_ECODEC, "bitshuffle: %zu bytes, too short for the 12-byte header", n);
        total = be64(in);
        uint32_t bbytes = be32(in + 8);
        if (bbytes % es || (bbytes / es) % 8 || !bbytes)
            return ferry_seterr(FERRY_ECODEC, "bitshuffle: block of %u bytes is not a multiple of 8 elements of %zu bytes",
                                bbytes, es);
        block = bbytes / es;
        pos = 12;
    } else {
        total = n;
        block = default_block(es);
    }
    if (total > cap)
        return ferry_seterr(FERRY_ECODEC, "bitshuffle: %llu bytes, more than the expected %zu", (unsigned long long)total, cap);
    if (total % es)
        return ferry_seterr(FERRY_ECODEC, "bitshuffle: %llu bytes is not a whole number of %zu-byte elements",
                            (unsigned long long)total, es);
    size_t nel = (size_t)(total / es), done = 0;
    /* scratch for the largest block this chunk holds, not the header's claim
     * (a few bytes may claim a 4 GiB block) */
    size_t bbytes = (nel < block ? nel - nel % 8 : block) * es;
    if (bbytes && (!ferry_scratch_reserve(&s->tmp, &s->tmp_cap, bbytes) ||
                   !ferry_scratch_reserve(&s->tmp2, &s->tmp2_cap, bbytes)))
        return ferry_seterr(FERRY_ENOMEM, "bitshuffle: no memory for a block of %zu bytes", bbytes);
    while (nel - done >= 8) {
        size_t m = nel - done < block ? (nel - done) - (nel - done) % 8 : block, mb = m * es;
        const uint8_t *t;
        if (comp) {
            if (n - pos < 4) return ferry_seterr(FERRY_ECODEC, "bitshuffle: block at byte %zu truncated", pos);
            uint32_t stored = be32(in + pos);
            pos += 4;
            if (stored > n - pos)
                return ferry_seterr(FERRY_ECODEC, "bitshuffle: block at byte %zu says %u bytes, %zu there", pos - 4, stored,
                                    n - pos);
            int rc = comp == FERRY_H5BSHUF_LZ4 ? ferry_lz4_block(in + pos, stored, s->tmp, mb)
                                               : ferry_zstd_exact(s, in + pos, stored, s->tmp, mb);
            if (rc < 0) return rc;
            pos += stored;
            t = s->tmp;
        } else {
            t = in + pos;
            pos += mb;
        }
        ferry_bitunshuffle(t, out + done * es, s->tmp2, m, es);
        done += m;
    }
    size_t rest = (nel - done) * es;   /* fewer than 8 elements: stored as they are */
    if (n - pos < rest) return ferry_seterr(FERRY_ECODEC, "bitshuffle: %zu trailing bytes, %zu there", rest, n - pos);
    memcpy(out + done * es, in + pos, rest);
    return (int64_t)total;
}
