/* blosc.c — our own decoder of blosc v1 frames (as c-blosc 1.x and numcodecs
 * write them). Frame layout, all little-endian:
 *   0 version  1 versionlz  2 flags  3 typesize
 *   4 nbytes (u32, decoded size)  8 blocksize (u32)  12 cbytes (u32, frame size)
 *   flags: 0x01 byte shuffle, 0x02 memcpyed (raw data follows the header),
 *          0x04 bitshuffle, 0x10 blocks not split, bits 5-7 inner codec
 *          (0 blosclz, 1 lz4/lz4hc, 2 snappy, 3 zlib, 4 zstd; all but snappy,
 *          which numcodecs does not build, are decoded).
 *   Then one u32 start offset per block; at each start, one stream per split
 *   (typesize splits unless 0x10 is set or the block is the short last one):
 *   i32 compressed size, then that many bytes; a size equal to the split's
 *   decoded size means the bytes are stored raw. */
#include "codecs/impl.h"
#include <stdlib.h>

enum { HDR = 16, F_SHUFFLE = 0x01, F_MEMCPY = 0x02, F_BITSHUFFLE = 0x04, F_DELTA = 0x08, F_NOSPLIT = 0x10 };

static const char *inner_name(int c) {
    static const char *names[8] = {"blosclz", "lz4", "snappy", "zlib", "zstd", "code 5", "code 6", "code 7"};
    return names[c & 7];
}

static int inner_decode(ferry_decode_scratch *s, int codec, const uint8_t *in, size_t n,
                        uint8_t *out, size_t want) {
    switch (codec) {
    case 0: return ferry_blosclz_block(in, n, out, want);
    case 1: return ferry_lz4_block(in, n, out, want);
    case 3: return ferry_zlib_exact(s, in, n, out, want);
    case 4: return ferry_zstd_exact(s, in, n, out, want);
    default:
        return ferry_seterr(FERRY_EUNSUPPORTED, "blosc: inner codec %s is not supported", inner_name(codec));
    }
}

/* Undo the block's filter from tmp into dst (bsize bytes); tmp2: bsize bytes. */
static void unfilter(int version, int flags, size_t ts, const uint8_t *tmp, uint8_t *dst, uint8_t *tmp2,
                     size_t bsize) {
    if (flags & F_SHUFFLE) { ferry_unshuffle(tmp, dst, bsize, ts); return; }
    /* bitshuffle works on whole groups of 8 elements; the rest is stored as
     * is. Format version 2 frames bitshuffled a block only when its element
     * count was a multiple of 8, leaving other blocks untouched. */
    size_t nel = bsize / ts;
    if (version <= 2 && nel % 8 != 0) nel = 0;
    nel -= nel % 8;
    ferry_bitunshuffle(tmp, dst, tmp2, nel, ts);
    memcpy(dst + nel * ts, tmp + nel * ts, bsize - nel * ts);
}

/* The streams of block b (from its start, bstarts[b]) end where? 0 and *end,
 * or an error naming the block. */
static int block_end(const uint8_t *in, size_t cbytes, size_t b, size_t pos, size_t nsplits, size_t *end) {
    for (size_t k = 0; k < nsplits; k++) {
        if (cbytes - pos < 4) return ferry_seterr(FERRY_ECODEC, "blosc: block %zu truncated", b);
        int32_t csize = (int32_t)ferry_le32(in + pos);
        pos += 4;
        if (csize < 0 || (size_t)csize > cbytes - pos)
            return ferry_seterr(FERRY_ECODEC, "blosc: block %zu: stream of %d bytes overruns the frame", b, (int)csize);
        pos += (size_t)csize;
    }
    *end = pos;
    return 0;
}

typedef struct span { size_t lo, hi, b; } span;
static int cmp_span(const void *x, const void *y) {
    const span *a = x, *c = y;
    return a->lo < c->lo ? -1 : a->lo > c->lo;
}

/* c-blosc writes the blocks' streams back to back after the bstarts table,
 * in any order (its threads append each block as it finishes): together they
 * tile [data0, cbytes) exactly. A damaged bstarts entry pointing at another
 * block's streams would otherwise decode that block twice, without an error. */
static int blocks_tile(const uint8_t *in, size_t cbytes, size_t data0, size_t nblocks, size_t blocksize,
                       size_t leftover, size_t ts, int flags) {
    size_t at = data0, b;
    for (b = 0; b < nblocks; b++) {   /* the usual case: in order, no memory */
        size_t pos = ferry_le32(in + HDR + 4 * b), end;
        if (pos != at) break;
        int last_short = leftover && b == nblocks - 1;
        size_t bsize = last_short ? leftover : blocksize;
        size_t nsplits = (!(flags & F_NOSPLIT) && !last_short) ? ts : 1;
        if (bsize % nsplits) nsplits = 1;
        int rc = block_end(in, cbytes, b, pos, nsplits, &end);
        if (rc < 0) return rc;
        at = end;
    }
    if (b == nblocks) {
        if (at == cbytes) return 0;
        return ferry_seterr(FERRY_ECODEC, "blosc: byte 12: the blocks' streams end at byte %zu of a %zu-byte frame",
                            at, cbytes);
    }
    span *v = malloc(nblocks * sizeof *v);
    if (!v) return ferry_seterr(FERRY_ENOMEM, "blosc: no memory for %zu block offsets", nblocks);
    int rc = 0;
    for (b = 0; b < nblocks && !rc; b++) {
        size_t pos = ferry_le32(in + HDR + 4 * b);
        if (pos < data0 || pos > cbytes - 4) {
            rc = ferry_seterr(FERRY_ECODEC, "blosc: byte %zu: block %zu starts at %zu, outside the frame's streams "
                              "[%zu, %zu)", HDR + 4 * b, b, pos, data0, cbytes);
            break;
        }
        int last_short = leftover && b == nblocks - 1;
        size_t bsize = last_short ? leftover : blocksize;
        size_t nsplits = (!(flags & F_NOSPLIT) && !last_short) ? ts : 1;
        if (bsize % nsplits) nsplits = 1;
        v[b].lo = pos;
        v[b].b = b;
        rc = block_end(in, cbytes, b, pos, nsplits, &v[b].hi);
    }
    if (!rc) {
        qsort(v, nblocks, sizeof *v, cmp_span);
        at = data0;
        for (b = 0; b < nblocks && !rc; b++) {
            if (v[b].lo != at)
                rc = ferry_seterr(FERRY_ECODEC, "blosc: byte %zu: block %zu starts at %zu; the blocks' streams %s "
                                  "there", HDR + 4 * v[b].b, v[b].b, v[b].lo, v[b].lo < at ? "overlap" : "leave a gap");
            at = v[b].hi;
        }
        if (!rc && at != cbytes)
            rc = ferry_seterr(FERRY_ECODEC, "blosc: byte 12: the blocks' streams end at byte %zu of a %zu-byte frame",
                              at, cbytes);
    }
    free(v);
    return rc;
}

/* The header's fields are checked as c-blosc checks them before it decodes
 * (a frame without checksums: a damaged field must fail here, not decode to
 * other bytes): a known format version, no flag blosc v1 leaves clear (0x08
 * is blosc2's delta filter), typesize >= 1, cbytes between the header and
 * the buffer, a stored (memcpyed) frame exactly its header and nbytes, and
 * else 1 <= blocksize <= nbytes (c-blosc's compressor never writes a larger
 * block: it clamps blocksize to nbytes) with the bstarts table inside cbytes
 * and each block's start past the table. */
int64_t ferry_blosc_decode(ferry_decode_scratch *s, const uint8_t *in, size_t n,
                           uint8_t *out, size_t cap) {
    if (n < HDR) return ferry_seterr(FERRY_ECODEC, "blosc: %zu bytes, too short for the 16-byte header", n);
    int version = in[0], flags = in[2];
    size_t ts = in[3];
    size_t nbytes = ferry_le32(in + 4), blocksize = ferry_le32(in + 8), cbytes = ferry_le32(in + 12);
    if (version == 0 || version > 4)
        return ferry_seterr(FERRY_ECODEC, "blosc: byte 0: unknown format version %d", version);
    if (version >= 3 && (flags & (F_SHUFFLE | F_BITSHUFFLE)) == (F_SHUFFLE | F_BITSHUFFLE))
        return ferry_seterr(FERRY_EUNSUPPORTED, "blosc: blosc2 extended-header frames are not supported");
    if (flags & F_DELTA)
        return ferry_seterr(FERRY_ECODEC, "blosc: byte 2: flags 0x%02x set bit 0x08 (blosc2's delta filter; "
                            "clear in blosc v1 frames)", flags);
    if (ts == 0) return ferry_seterr(FERRY_ECODEC, "blosc: byte 3: typesize 0");
    if (cbytes < HDR || cbytes > n)
        return ferry_seterr(FERRY_ECODEC, "blosc: byte 12: frame says %zu bytes, %zu available", cbytes, n);
    if (nbytes > cap)
        return ferry_seterr(FERRY_ECODEC, "blosc: byte 4: frame holds %zu bytes, more than the expected %zu", nbytes, cap);
    if (nbytes == 0) {   /* c-blosc writes an empty frame as its header alone */
        if (cbytes != HDR)
            return ferry_seterr(FERRY_ECODEC, "blosc: byte 4: no data in a frame of %zu bytes", cbytes);
        return 0;
    }
    if (flags & F_MEMCPY) {
        if (cbytes - HDR != nbytes)
            return ferry_seterr(FERRY_ECODEC, "blosc: byte 12: stored frame of %zu bytes for %zu bytes of data "
                                "(a stored frame is 16 bytes more than its data)", cbytes, nbytes);
        memcpy(out, in + HDR, nbytes);
        return (int64_t)nbytes;
    }
    if (blocksize == 0 || blocksize > nbytes)
        return ferry_seterr(FERRY_ECODEC, "blosc: byte 8: blocksize %zu for a frame of %zu bytes (1 to nbytes)",
                            blocksize, nbytes);
    size_t nblocks = nbytes / blocksize, leftover = nbytes % blocksize;
    if (leftover) nblocks++;
    if (nblocks > (cbytes - HDR) / 4)
        return ferry_seterr(FERRY_ECODEC, "blosc: %zu block offsets do not fit in a %zu-byte frame", nblocks, cbytes);
    size_t data0 = HDR + 4 * nblocks;
    int rc0 = blocks_tile(in, cbytes, data0, nblocks, blocksize, leftover, ts, flags);
    if (rc0 < 0) return rc0;
    int codec = (flags >> 5) & 7;
    int filtered = (flags & F_BITSHUFFLE) || ((flags & F_SHUFFLE) && ts > 1);
    if (filtered && !ferry_scratch_reserve(&s->tmp, &s->tmp_cap, blocksize))
        return ferry_seterr(FERRY_ENOMEM, "blosc: no memory for a %zu-byte block", blocksize);
    if ((flags & F_BITSHUFFLE) && !ferry_scratch_reserve(&s->tmp2, &s->tmp2_cap, blocksize))
        return ferry_seterr(FERRY_ENOMEM, "blosc: no memory for a %zu-byte block", blocksize);
    for (size_t b = 0; b < nblocks; b++) {
        int last_short = leftover && b == nblocks - 1;
        size_t bsize = last_short ? leftover : blocksize;
        size_t pos = ferry_le32(in + HDR + 4 * b);
        if (pos < data0 || pos > cbytes - 4)
            return ferry_seterr(FERRY_ECODEC, "blosc: byte %zu: block %zu starts at %zu, outside the frame's "
                                "streams [%zu, %zu)", HDR + 4 * b, b, pos, data0, cbytes);
        size_t nsplits = (!(flags & F_NOSPLIT) && !last_short) ? ts : 1;
        if (bsize % nsplits) nsplits = 1;
        size_t neblock = bsize / nsplits;
        uint8_t *dst = filtered ? s->tmp : out + b * blocksize;
        for (size_t k = 0; k < nsplits; k++) {
            if (cbytes - pos < 4)
                return ferry_seterr(FERRY_ECODEC, "blosc: block %zu truncated", b);
            int32_t csize = (int32_t)ferry_le32(in + pos);
            pos += 4;
            if (csize < 0 || (size_t)csize > cbytes - pos)
                return ferry_seterr(FERRY_ECODEC, "blosc: block %zu: stream of %d bytes overruns the frame", b, (int)csize);
            if ((size_t)csize == neblock) {
                memcpy(dst + k * neblock, in + pos, neblock);
            } else {
                int rc = inner_decode(s, codec, in + pos, (size_t)csize, dst + k * neblock, neblock);
                if (rc < 0) return ferry_preerr(rc, "blosc: block %zu", b);
            }
            pos += (size_t)csize;
        }
        if (filtered) unfilter(version, flags, ts, s->tmp, out + b * blocksize, s->tmp2, bsize);
    }
    return (int64_t)nbytes;
}
