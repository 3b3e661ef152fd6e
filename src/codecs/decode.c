/* decode.c — run a codec chain over one extent's bytes. Intermediate results
 * ping-pong between the scratch's two buffers; the last step that produces
 * bytes writes straight into the caller's output. Checksum steps only verify
 * and shorten the current bytes, so they cost no copy unless they end the
 * chain. */
#include "codecs/impl.h"
#include "codecs/h5filters.h"
#include <stdlib.h>
#include <zlib.h>
#include <zstd.h>

void ferry_decode_scratch_init(ferry_decode_scratch *s) { memset(s, 0, sizeof *s); }

void ferry_decode_scratch_free(ferry_decode_scratch *s) {
    if (!s) return;
    free(s->buf[0]); free(s->buf[1]); free(s->tmp); free(s->tmp2);
    if (s->zstd) ZSTD_freeDCtx(s->zstd);
    if (s->zlib) { inflateEnd(s->zlib); free(s->zlib); }
    ferry_zlib_scratch_free(s);
    memset(s, 0, sizeof *s);
}

int ferry_codecs_validate(const ferry_codec *chain, int n) {
    if (n < 0 || n > FERRY_MAX_CODECS)
        return ferry_seterr(FERRY_EINVAL, "codec chain of %d steps (at most %d)", n, FERRY_MAX_CODECS);
    for (int i = 0; i < n; i++) {
        uint32_t id = chain[i].id, p = chain[i].param;
        if (id > FERRY_CODEC_BITSHUFFLE)
            return ferry_seterr(FERRY_EINVAL, "codec step %d: unknown codec id %u", i, id);
        if (id == FERRY_CODEC_SHUFFLE && (p == 0 || p > 1u << 20))
            return ferry_seterr(FERRY_EINVAL, "shuffle: element size %u", p);
        if (id == FERRY_CODEC_BYTESWAP && !(p == 1 || p == 2 || p == 4 || p == 8 || p == 16))
            return ferry_seterr(FERRY_EINVAL, "byteswap: element size %u (1, 2, 4, 8 or 16)", p);
        if (id == FERRY_CODEC_BITSHUFFLE && (!FERRY_H5BSHUF_ELSIZE(p) || FERRY_H5BSHUF_ELSIZE(p) > 1u << 20
                                             || !(FERRY_H5BSHUF_COMP(p) == 0 || FERRY_H5BSHUF_COMP(p) == FERRY_H5BSHUF_LZ4
                                                  || FERRY_H5BSHUF_COMP(p) == FERRY_H5BSHUF_ZSTD)))
            return ferry_seterr(FERRY_EINVAL, "bitshuffle: element size %u, compression %u", FERRY_H5BSHUF_ELSIZE(p),
                                FERRY_H5BSHUF_COMP(p));
    }
    return 0;
}

int ferry_codecs_only_byteswap(const ferry_codec *chain, int n) {
    if (n != 1 || chain[0].id != FERRY_CODEC_BYTESWAP) return 0;
    uint32_t p = chain[0].param;
    return (p == 1 || p == 2 || p == 4 || p == 8 || p == 16) ? (int)p : 0;
}

static int is_check(uint32_t id) { return id == FERRY_CODEC_CRC32C || id == FERRY_CODEC_FLETCHER32; }

int ferry_codecs_verify_trailer(uint32_t id, const uint8_t *p, size_t *len) {
    const char *name = ferry_codec_name(id);
    if (*len < 4) return ferry_seterr(FERRY_ECODEC, "%s: %zu bytes, too short for the 4-byte checksum", name, *len);
    size_t n = *len - 4;
    uint32_t stored = ferry_le32(p + n);
    if (id == FERRY_CODEC_CRC32C) {
        uint32_t c = ferry_crc32c(0, p, n);
        if (c != stored)
            return ferry_seterr(FERRY_ECHECKSUM, "crc32c: checksum mismatch (stored %08x, computed %08x)", stored, c);
    } else {
        uint32_t c = ferry_fletcher32(p, n);
        /* HDF5 1.6.0-1.6.2 wrote the value with each 16-bit half byte-swapped;
         * HDF5 itself still accepts that form. */
        uint32_t r = ((c & 0x00ff00ffu) << 8) | ((c >> 8) & 0x00ff00ffu);
        if (c != stored && r != stored)
            return ferry_seterr(FERRY_ECHECKSUM, "fletcher32: checksum mismatch (stored %08x, computed %08x)", stored, c);
    }
    *len = n;
    return 0;
}

int64_t ferry_decode(const ferry_codec *chain, int n, const uint8_t *in, size_t in_len,
                     uint8_t *out, size_t out_cap, ferry_decode_scratch *s) {
    int rc = ferry_codecs_validate(chain, n);
    if (rc < 0) return rc;
    const uint8_t *cur = in;
    size_t len = in_len;
    int curbuf = -1;   /* which scratch buffer holds cur, -1: neither */
    /* Index of the last step that produces new bytes; later steps only verify. */
    int last_prod = -1;
    for (int i = 0; i < n; i++)
        if (!is_check(chain[i].id) && chain[i].id != FERRY_CODEC_NONE) last_prod = i;
    for (int i = 0; i < n; i++) {
        uint32_t id = chain[i].id;
        if (id == FERRY_CODEC_NONE) continue;
        if (is_check(id)) {
            rc = ferry_codecs_verify_trailer(id, cur, &len);
            if (rc < 0) return rc;
            continue;
        }
        /* Where this step writes: out when nothing but checks follow and no
         * check will strip bytes after it; otherwise a scratch buffer sized for
         * the final output plus the trailers later steps strip. */
        size_t trailers = 0;
        for (int k = i + 1; k < n; k++) trailers += is_check(chain[k].id) ? 4 : 0;
        uint8_t *dst;
        size_t cap = out_cap + trailers;
        int dstbuf = -1;
        if (i == last_prod && trailers == 0) {
            dst = out;
        } else {
            dstbuf = curbuf == 0 ? 1 : 0;
            size_t need = cap;
            if (id == FERRY_CODEC_SHUFFLE || id == FERRY_CODEC_BYTESWAP) need = len;
            if (!ferry_scratch_reserve(&s->buf[dstbuf], &s->cap[dstbuf], need ? need : 1))
                return ferry_seterr(FERRY_ENOMEM, "%s: no memory for %zu bytes", ferry_codec_name(id), need);
            dst = s->buf[dstbuf];
            if (id == FERRY_CODEC_SHUFFLE || id == FERRY_CODEC_BYTESWAP) cap = FERRY_MAX(cap, len);
        }
        int64_t got;
        switch (id) {
        case FERRY_CODEC_ZLIB: got = ferry_zlib_decode(s, 0, cur, len, dst, cap); break;
        case FERRY_CODEC_GZIP: got = ferry_zlib_decode(s, 1, cur, len, dst, cap); break;
        case FERRY_CODEC_ZSTD: got = ferry_zstd_decode(s, cur, len, dst, cap); break;
        case FERRY_CODEC_LZ4: got = ferry_lz4_decode(cur, len, dst, cap); break;
        case FERRY_CODEC_BLOSC: got = ferry_blosc_decode(s, cur, len, dst, cap); break;
        case FERRY_CODEC_H5LZ4: got = ferry_h5lz4_decode(cur, len, dst, cap); break;
        case FERRY_CODEC_BITSHUFFLE: got = ferry_h5bitshuffle_decode(s, cur, len, dst, cap, chain[i].param); break;
        case FERRY_CODEC_SHUFFLE:
        case FERRY_CODEC_BYTESWAP:
            if (len > cap)
                return ferry_seterr(FERRY_ECODEC, "%s: %zu bytes, more than the expected %zu",
                                    ferry_codec_name(id), len, cap);
            if (id == FERRY_CODEC_SHUFFLE) ferry_unshuffle(cur, dst, len, chain[i].param);
            else ferry_byteswap(cur, dst, len, chain[i].param);
            got = (int64_t)len;
            break;
        default:
            return ferry_seterr(FERRY_EINVAL, "codec %u cannot decode", id);
        }
        if (got < 0) return got;
        cur = dst; len = (size_t)got; curbuf = dstbuf;
    }
    if (cur != out) {   /* nothing produced into out: copy what is left */
        if (len > out_cap)
            return ferry_seterr(FERRY_ECODEC, "decoded %zu bytes, more than the expected %zu", len, out_cap);
        memcpy(out, cur, len);
    }
    return (int64_t)len;
}
