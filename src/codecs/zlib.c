/* zlib.c — zlib streams (RFC 1950) and gzip members (RFC 1952): through
 * libdeflate where the build has it (FERRY_HAVE_LIBDEFLATE: 0.29 vs 0.12 GB/s
 * per core for 1 MiB HDF5-shuffled chunks on the GPU machine, 3.39 vs 0.98
 * GB/s on 16 cores; BENCHMARKS.md), else zlib's inflate. Both verify the
 * trailers: zlib's Adler-32, gzip's CRC-32 and ISIZE. One decompressor /
 * z_stream per scratch, reused. */
#include "codecs/impl.h"
#include <stdlib.h>
#include <zlib.h>
#ifdef FERRY_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif

static z_stream *get_stream(ferry_decode_scratch *s, int window_bits) {
    z_stream *z = s->zlib;
    if (!z) {
        z = calloc(1, sizeof *z);
        if (!z) return NULL;
        if (inflateInit2(z, window_bits) != Z_OK) { free(z); return NULL; }
        s->zlib = z;
        return z;
    }
    if (inflateReset2(z, window_bits) != Z_OK) return NULL;
    return z;
}

/* Inflate one stream/member from in into out; *used and *made say how much
 * input it took and output it produced. */
static int inflate_one(z_stream *z, const char *name, const uint8_t *in, size_t n,
                       uint8_t *out, size_t cap, size_t *used, size_t *made) {
    z->next_in = (Bytef *)in;
    z->next_out = out;
    z->avail_in = 0; z->avail_out = 0;
    size_t in_left = n, out_left = cap;
    int rc;
    do {
        /* avail_* are 32-bit: feed at most 1 GiB at a time */
        if (z->avail_in == 0) { z->avail_in = (uInt)FERRY_MIN(in_left, (size_t)1 << 30); in_left -= z->avail_in; }
        if (z->avail_out == 0) { z->avail_out = (uInt)FERRY_MIN(out_left, (size_t)1 << 30); out_left -= z->avail_out; }
        rc = inflate(z, Z_NO_FLUSH);
        if (rc == Z_STREAM_END) break;
        if (rc == Z_BUF_ERROR) {
            if (z->avail_in == 0 && in_left == 0)
                return ferry_seterr(FERRY_ECODEC, "%s: data truncated (stream does not end)", name);
            if (z->avail_out == 0 && out_left == 0)
                return ferry_seterr(FERRY_ECODEC, "%s: decoded data larger than the expected %zu bytes", name, cap);
            continue;
        }
        if (rc != Z_OK)
            return ferry_seterr(FERRY_ECODEC, "%s: corrupt data (%s)", name, z->msg ? z->msg : "inflate failed");
    } while (1);
    *used = n - in_left - z->avail_in;
    *made = cap - out_left - z->avail_out;
    return 0;
}

void ferry_zlib_scratch_free(ferry_decode_scratch *s) {
#ifdef FERRY_HAVE_LIBDEFLATE
    if (s->deflate) libdeflate_free_decompressor(s->deflate);
#endif
    s->deflate = NULL;
}

#ifdef FERRY_HAVE_LIBDEFLATE
/* libdeflate decodes whole streams into a buffer of known size (the chunk's
 * decoded size bounds it), and checks the trailers itself. */
static int64_t deflate_decode(ferry_decode_scratch *s, int gzip, const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
    const char *name = gzip ? "gzip" : "zlib";
    if (!s->deflate && !(s->deflate = libdeflate_alloc_decompressor()))
        return ferry_seterr(FERRY_ENOMEM, "%s: cannot set up libdeflate", name);
    size_t total = 0;
    for (;;) {
        size_t used = 0, made = 0;
        enum libdeflate_result r = gzip ? libdeflate_gzip_decompress_ex(s->deflate, in, n, out + total, cap - total, &used, &made)
                                        : libdeflate_zlib_decompress_ex(s->deflate, in, n, out + total, cap - total, &used, &made);
        if (r == LIBDEFLATE_INSUFFICIENT_SPACE)
            return ferry_seterr(FERRY_ECODEC, "%s: decoded data larger than the expected %zu bytes", name, cap);
        if (r != LIBDEFLATE_SUCCESS)
            return ferry_seterr(FERRY_ECODEC, "%s: corrupt data (libdeflate: %s)", name,
                                r == LIBDEFLATE_BAD_DATA ? "bad data, truncated stream or checksum mismatch" : "short output");
        in += used; n -= used; total += made;
        if (n == 0) return (int64_t)total;
        if (!gzip) return ferry_seterr(FERRY_ECODEC, "zlib: %zu bytes of garbage after the stream", n);
        if (n >= 2 && in[0] == 0x1f && in[1] == 0x8b) continue;
        for (size_t i = 0; i < n; i++)
            if (in[i]) return ferry_seterr(FERRY_ECODEC, "gzip: %zu bytes of garbage after the last member", n);
        return (int64_t)total;
    }
}
#endif

int64_t ferry_zlib_decode(ferry_decode_scratch *s, int gzip, const uint8_t *in, size_t n,
                          uint8_t *out, size_t cap) {
#ifdef FERRY_HAVE_LIBDEFLATE
    static int use = -1;   /* FERRY_NO_LIBDEFLATE=1: zlib, for comparisons (bench_decode.py) */
    if (use < 0) use = !getenv("FERRY_NO_LIBDEFLATE");
    if (use) return deflate_decode(s, gzip, in, n, out, cap);
#endif
    const char *name = gzip ? "gzip" : "zlib";
    size_t total = 0;
    for (;;) {
        z_stream *z = get_stream(s, gzip ? 16 + 15 : 15);
        if (!z) return ferry_seterr(FERRY_ENOMEM, "%s: cannot set up inflate", name);
        size_t used = 0, made = 0;
        int rc = inflate_one(z, name, in, n, out + total, cap - total, &used, &made);
        if (rc < 0) return rc;
        in += used; n -= used; total += made;
        if (n == 0) return (int64_t)total;
        if (!gzip) return ferry_seterr(FERRY_ECODEC, "zlib: %zu bytes of garbage after the stream", n);
        /* gzip: another member follows, or zero padding some writers add */
        if (n >= 2 && in[0] == 0x1f && in[1] == 0x8b) continue;
        for (size_t i = 0; i < n; i++)
            if (in[i]) return ferry_seterr(FERRY_ECODEC, "gzip: %zu bytes of garbage after the last member", n);
        return (int64_t)total;
    }
}

int ferry_zlib_exact(ferry_decode_scratch *s, const uint8_t *in, size_t n, uint8_t *out, size_t want) {
    int64_t got = ferry_zlib_decode(s, 0, in, n, out, want);
    if (got < 0) return (int)got;
    if ((size_t)got != want)
        return ferry_seterr(FERRY_ECODEC, "zlib: decoded %lld bytes, expected %zu", (long long)got, want);
    return 0;
}
