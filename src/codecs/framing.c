/* framing.c — frame headers and trailers of zstd, zlib, gzip and numcodecs
 * LZ4, parsed on the CPU so that only payloads go to the GPU decoder and every
 * size and check a frame carries is tested (framing.h). Formats: RFC 8878
 * (zstd), RFC 1950 (zlib), RFC 1952 (gzip), numcodecs.lz4. */
#include "codecs/framing.h"
#include "codecs/codecs.h"

#define ZSTD_MAGIC 0xFD2FB528u
#define ZSTD_BLOCK_MAX (128u * 1024u)

int ferry_frame_zstd(const uint8_t *p, size_t n, ferry_frame *out) {
    memset(out, 0, sizeof *out);
    out->alg = FERRY_FRAME_ZSTD;
    if (n >= 4 && (ferry_le32(p) & 0xFFFFFFF0u) == 0x184D2A50u)
        return ferry_seterr(FERRY_EUNSUPPORTED, "zstd: skippable frame");
    if (n < 6 || ferry_le32(p) != ZSTD_MAGIC) return ferry_seterr(FERRY_ECODEC, "zstd: not a zstd frame (bad magic)");
    uint8_t fhd = p[4];
    unsigned fcs_flag = fhd >> 6, single = (fhd >> 5) & 1, checksum = (fhd >> 2) & 1, dict_flag = fhd & 3;
    if (fhd & 0x08) return ferry_seterr(FERRY_ECODEC, "zstd: reserved bit set in the frame header");
    static const unsigned dict_len[4] = {0, 1, 2, 4}, fcs_len[4] = {0, 2, 4, 8};
    size_t pos = 5 + (single ? 0 : 1);
    size_t flen = fcs_flag == 0 ? (single ? 1 : 0) : fcs_len[fcs_flag];
    if (pos + dict_len[dict_flag] + flen > n) return ferry_seterr(FERRY_ECODEC, "zstd: frame header truncated");
    if (!single && (p[5] >> 3) + 10 > 31)   /* Window_Descriptor: windowLog above zstd's maximum */
        return ferry_seterr(FERRY_ECODEC, "zstd: window of 2^%u bytes (at most 2^31)", (unsigned)(p[5] >> 3) + 10);
    uint32_t dict = 0;
    for (unsigned i = 0; i < dict_len[dict_flag]; i++) dict |= (uint32_t)p[pos + i] << (8 * i);
    pos += dict_len[dict_flag];
    uint64_t fcs = UINT64_MAX;
    if (flen) {
        fcs = 0;
        for (size_t i = 0; i < flen; i++) fcs |= (uint64_t)p[pos + i] << (8 * i);
        if (flen == 2) fcs += 256;
    }
    pos += flen;
    /* blocks: 3-byte header (last, type, size), then the block's bytes */
    uint64_t produced = 0;
    for (;;) {
        if (pos + 3 > n) return ferry_seterr(FERRY_ECODEC, "zstd: block header truncated at byte %zu", pos);
        uint32_t h = (uint32_t)p[pos] | ((uint32_t)p[pos + 1] << 8) | ((uint32_t)p[pos + 2] << 16);
        unsigned last = h & 1, type = (h >> 1) & 3;
        uint32_t size = h >> 3;
        pos += 3;
        if (type == 3) return ferry_seterr(FERRY_ECODEC, "zstd: reserved block type at byte %zu", pos - 3);
        if (size > ZSTD_BLOCK_MAX) return ferry_seterr(FERRY_ECODEC, "zstd: block of %u bytes (at most 128 KiB)", size);
        size_t body = type == 1 ? 1 : size;   /* RLE: one byte repeated `size` times */
        if (body > n - pos) return ferry_seterr(FERRY_ECODEC, "zstd: block at byte %zu runs past the chunk's %zu bytes", pos - 3, n);
        if (type != 2) produced += size;
        pos += body;
        if (last) break;
    }
    if (checksum) {
        if (n - pos < 4) return ferry_seterr(FERRY_ECODEC, "zstd: content checksum truncated");
        pos += 4;
    }
    if (fcs != UINT64_MAX && produced > fcs)
        return ferry_seterr(FERRY_ECODEC, "zstd: blocks hold more than the %llu bytes the frame announces", (unsigned long long)fcs);
    out->payload_off = 0;
    out->payload_len = pos;
    out->decoded = fcs;
    if (pos != n) {
        if (n - pos >= 4 && (ferry_le32(p + pos) == ZSTD_MAGIC || (ferry_le32(p + pos) & 0xFFFFFFF0u) == 0x184D2A50u))
            return ferry_seterr(FERRY_EUNSUPPORTED, "zstd: several frames in one chunk");
        return ferry_seterr(FERRY_ECODEC, "zstd: %zu bytes of garbage after the frame", n - pos);
    }
    if (dict) return ferry_seterr(FERRY_EUNSUPPORTED, "zstd: frame needs dictionary %u", dict);
    /* the GPU does not compute XXH64: the CPU decodes and verifies these */
    if (checksum) return ferry_seterr(FERRY_EUNSUPPORTED, "zstd: frame carries a content checksum");
    return 0;
}

int ferry_frame_zlib(const uint8_t *p, size_t n, ferry_frame *out) {
    memset(out, 0, sizeof *out);
    out->alg = FERRY_FRAME_DEFLATE;
    if (n < 2 + 1 + 4) return ferry_seterr(FERRY_ECODEC, "zlib: %zu bytes, too short for a stream", n);
    unsigned cmf = p[0], flg = p[1];
    if ((cmf & 15) != 8 || (cmf >> 4) > 7 || ((cmf << 8) | flg) % 31 != 0)
        return ferry_seterr(FERRY_ECODEC, "zlib: bad stream header (%02x %02x)", cmf, flg);
    if (flg & 0x20) return ferry_seterr(FERRY_EUNSUPPORTED, "zlib: stream needs a preset dictionary");
    out->payload_off = 2;
    out->payload_len = n - 2 - 4;
    out->decoded = UINT64_MAX;
    out->check = FERRY_FRAME_CHECK_ADLER32;
    out->check_value = ferry_be32(p + n - 4);
    return 0;
}

int ferry_frame_gzip(const uint8_t *p, size_t n, uint64_t want, ferry_frame *out) {
    memset(out, 0, sizeof *out);
    out->alg = FERRY_FRAME_DEFLATE;
    if (n < 10 + 1 + 8) return ferry_seterr(FERRY_ECODEC, "gzip: %zu bytes, too short for a member", n);
    if (p[0] != 0x1f || p[1] != 0x8b || p[2] != 8) return ferry_seterr(FERRY_ECODEC, "gzip: bad member header");
    unsigned flg = p[3];
    if (flg & 0xE0) return ferry_seterr(FERRY_ECODEC, "gzip: reserved flag bits set");
    size_t pos = 10, end = n - 8;
    if (flg & 4) {   /* FEXTRA */
        if (pos + 2 > end) return ferry_seterr(FERRY_ECODEC, "gzip: header truncated");
        size_t xlen = ferry_le16(p + pos);
        if (xlen > end - pos - 2) return ferry_seterr(FERRY_ECODEC, "gzip: extra field runs past the member");
        pos += 2 + xlen;
    }
    for (unsigned bit = 8; bit <= 16; bit <<= 1) {   /* FNAME, FCOMMENT: zero-terminated */
        if (!(flg & bit)) continue;
        while (pos < end && p[pos]) pos++;
        if (pos >= end) return ferry_seterr(FERRY_ECODEC, "gzip: header truncated");
        pos++;
    }
    if (flg & 2) pos += 2;   /* FHCRC */
    if (pos >= end) return ferry_seterr(FERRY_ECODEC, "gzip: header truncated");
    uint32_t isize = ferry_le32(p + n - 4);
    if (isize != (uint32_t)want)
        return ferry_seterr(FERRY_ECODEC, "gzip: member says it holds %u bytes (mod 2^32), the chunk needs %llu",
                            isize, (unsigned long long)want);
    out->payload_off = pos;
    out->payload_len = end - pos;
    out->decoded = UINT64_MAX;
    out->check = FERRY_FRAME_CHECK_CRC32;
    out->check_value = ferry_le32(p + n - 8);
    return 0;
}

int ferry_frame_lz4(const uint8_t *p, size_t n, ferry_frame *out) {
    memset(out, 0, sizeof *out);
    out->alg = FERRY_FRAME_LZ4;
    if (n < 4) return ferry_seterr(FERRY_ECODEC, "lz4: %zu bytes, too short for the 4-byte size header", n);
    out->payload_off = 4;
    out->payload_len = n - 4;
    out->decoded = ferry_le32(p);
    if (out->payload_len == 0 && out->decoded) return ferry_seterr(FERRY_ECODEC, "lz4: empty block for %llu bytes", (unsigned long long)out->decoded);
    return 0;
}

int ferry_frame_parse(uint32_t codec, const uint8_t *p, size_t n, uint64_t want, ferry_frame *out) {
    int rc;
    switch (codec) {
    case FERRY_CODEC_ZSTD: rc = ferry_frame_zstd(p, n, out); break;
    case FERRY_CODEC_ZLIB: rc = ferry_frame_zlib(p, n, out); break;
    case FERRY_CODEC_GZIP: rc = ferry_frame_gzip(p, n, want, out); break;
    case FERRY_CODEC_LZ4: rc = ferry_frame_lz4(p, n, out); break;
    default: return ferry_seterr(FERRY_EUNSUPPORTED, "codec %u has no GPU decoder", codec);
    }
    if (rc == 0 && out->decoded != UINT64_MAX && out->decoded != want)
        return ferry_seterr(FERRY_ECODEC, "%s: frame announces %llu decoded bytes, the chunk needs %llu",
                            ferry_codec_name(codec), (unsigned long long)out->decoded, (unsigned long long)want);
    return rc;
}

/* Layout as src/codecs/blosc.c describes it (the CPU decoder of the same frames). */
int ferry_frame_blosc(const uint8_t *p, size_t n, uint64_t want, ferry_blosc_frame *out,
                      ferry_blosc_stream *streams, size_t cap) {
    memset(out, 0, sizeof *out);
    if (n < 16) return ferry_seterr(FERRY_ECODEC, "blosc: %zu bytes, too short for the 16-byte header", n);
    int version = p[0], flags = p[2];
    size_t ts = p[3];
    uint64_t nbytes = ferry_le32(p + 4), blocksize = ferry_le32(p + 8), cbytes = ferry_le32(p + 12);
    if (version == 0 || version > 4) return ferry_seterr(FERRY_ECODEC, "blosc: unknown format version %d", version);
    if (version >= 3 && (flags & 0x05) == 0x05)
        return ferry_seterr(FERRY_EUNSUPPORTED, "blosc: blosc2 extended-header frame");
    if (cbytes < 16 || cbytes > n) return ferry_seterr(FERRY_ECODEC, "blosc: frame says %llu bytes, %zu available", (unsigned long long)cbytes, n);
    if (nbytes != want)
        return ferry_seterr(FERRY_ECODEC, "blosc: frame holds %llu bytes, the chunk needs %llu", (unsigned long long)nbytes,
                            (unsigned long long)want);
    out->nbytes = nbytes;
    out->typesize = (unsigned)ts;
    out->version = version;
    static const int inner[8] = {0, FERRY_CODEC_LZ4, 0, FERRY_CODEC_ZLIB, FERRY_CODEC_ZSTD, 0, 0, 0};
    out->inner = inner[(flags >> 5) & 7];
    if (nbytes == 0) return 0;
    if (flags & 0x02) {
        if (cbytes - 16 < nbytes) return ferry_seterr(FERRY_ECODEC, "blosc: stored frame of %llu bytes holds fewer than %llu",
                                                      (unsigned long long)cbytes, (unsigned long long)nbytes);
        out->memcpyed = 1;
        return 0;
    }
    if (ts == 0) return ferry_seterr(FERRY_ECODEC, "blosc: typesize 0");
    if (blocksize == 0) return ferry_seterr(FERRY_ECODEC, "blosc: blocksize 0");
    if (blocksize > nbytes) blocksize = nbytes;
    uint64_t nblocks = nbytes / blocksize, leftover = nbytes % blocksize;
    if (leftover) nblocks++;
    if (nblocks > (cbytes - 16) / 4)
        return ferry_seterr(FERRY_ECODEC, "blosc: %llu block offsets do not fit in a %llu-byte frame",
                            (unsigned long long)nblocks, (unsigned long long)cbytes);
    out->blocksize = blocksize;
    out->nblocks = nblocks;
    /* the CPU decoder's rule (blosc.c unfilter): byte shuffle wins when a v1/v2
     * frame sets both flags, so both decoders give the same bytes */
    out->bitshuffle = (flags & 0x04) && !(flags & 0x01);
    out->shuffle = (flags & 0x01) && ts > 1;
    uint64_t data0 = 16 + 4 * nblocks;
    size_t k = 0;
    for (uint64_t b = 0; b < nblocks; b++) {
        int last_short = leftover && b == nblocks - 1;
        uint64_t bsize = last_short ? leftover : blocksize;
        uint64_t pos = ferry_le32(p + 16 + 4 * b);
        if (pos < data0 || pos > cbytes)
            return ferry_seterr(FERRY_ECODEC, "blosc: block %llu starts at %llu, outside the frame", (unsigned long long)b,
                                (unsigned long long)pos);
        uint64_t nsplits = (!(flags & 0x10) && !last_short) ? ts : 1;
        if (bsize % nsplits) nsplits = 1;
        uint64_t neblock = bsize / nsplits;
        for (uint64_t sp = 0; sp < nsplits; sp++) {
            if (cbytes - pos < 4) return ferry_seterr(FERRY_ECODEC, "blosc: block %llu truncated", (unsigned long long)b);
            int32_t csize = (int32_t)ferry_le32(p + pos);
            pos += 4;
            if (csize < 0 || (uint64_t)csize > cbytes - pos)
                return ferry_seterr(FERRY_ECODEC, "blosc: block %llu: stream of %d bytes overruns the frame",
                                    (unsigned long long)b, (int)csize);
            if (k == cap) return ferry_seterr(FERRY_EUNSUPPORTED, "blosc: more than %zu streams in one frame", cap);
            streams[k++] = (ferry_blosc_stream){pos, (uint64_t)csize, b * blocksize + sp * neblock, neblock,
                                                (uint64_t)csize == neblock};
            pos += (uint64_t)csize;
        }
    }
    out->nstreams = k;
    if (!out->inner) {   /* valid, but blosclz / snappy have no GPU decoder: only raw streams could go */
        for (size_t i = 0; i < k; i++)
            if (!streams[i].raw) return ferry_seterr(FERRY_EUNSUPPORTED, "blosc: inner codec %d has no GPU decoder", (flags >> 5) & 7);
    }
    return 0;
}

uint32_t ferry_adler32(uint32_t adler, const uint8_t *p, size_t n) {
    uint32_t a = adler & 0xffff, b = adler >> 16;
    while (n) {
        size_t k = n < 5552 ? n : 5552;   /* largest run before b can overflow 32 bits */
        n -= k;
        while (k--) { a += *p++; b += a; }
        a %= 65521u;
        b %= 65521u;
    }
    return (b << 16) | a;
}
