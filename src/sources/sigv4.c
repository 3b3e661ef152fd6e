/* sigv4.c — SHA-256 (FIPS 180-4), HMAC (RFC 2104) and the SigV4 steps:
 * canonical request, string to sign, the signing key derived from the secret
 * by date, region and service, and the signature (AWS's "Signature Version 4
 * signing process" and the S3 "header-based auth" pages). */
#include "common.h"
#include "sources/sigv4.h"
#include <stdlib.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

void ferry_sha256_init(ferry_sha256_ctx *s) {
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof iv);
    s->n = 0;
    s->fill = 0;
}

void ferry_sha256_update(ferry_sha256_ctx *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->n += n;
    while (n) {
        if (s->fill == 0 && n >= 64) { block(s->h, p); p += 64; n -= 64; continue; }
        size_t take = 64 - s->fill < n ? 64 - s->fill : n;
        memcpy(s->buf + s->fill, p, take);
        s->fill += take; p += take; n -= take;
        if (s->fill == 64) { block(s->h, s->buf); s->fill = 0; }
    }
}

void ferry_sha256_final(ferry_sha256_ctx *s, uint8_t out[32]) {
    uint64_t bits = s->n * 8;
    uint8_t pad = 0x80, zero = 0, len[8];
    ferry_sha256_update(s, &pad, 1);
    while (s->fill != 56) ferry_sha256_update(s, &zero, 1);
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
    ferry_sha256_update(s, len, 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24); out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8); out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

void ferry_sha256(const void *p, size_t n, uint8_t out[32]) {
    ferry_sha256_ctx s;
    ferry_sha256_init(&s);
    ferry_sha256_update(&s, p, n);
    ferry_sha256_final(&s, out);
}

void ferry_hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32]) {
    uint8_t k[64] = {0}, pad[64], inner[32];
    if (klen > 64) ferry_sha256(key, klen, k);
    else memcpy(k, key, klen);
    ferry_sha256_ctx s;
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    ferry_sha256_init(&s);
    ferry_sha256_update(&s, pad, 64);
    ferry_sha256_update(&s, msg, mlen);
    ferry_sha256_final(&s, inner);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    ferry_sha256_init(&s);
    ferry_sha256_update(&s, pad, 64);
    ferry_sha256_update(&s, inner, 32);
    ferry_sha256_final(&s, out);
}

void ferry_hex32(const uint8_t in[32], char out[65]) {
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) { out[2 * i] = hex[in[i] >> 4]; out[2 * i + 1] = hex[in[i] & 15]; }
    out[64] = 0;
}

void ferry_amz_date(time_t t, char out[17]) {
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

/* Append to a growing string; *ok cleared when memory runs out. */
static void put(char **s, size_t *len, size_t *cap, const char *a, int *ok) {
    size_t n = strlen(a);
    if (*len + n + 1 > *cap) {
        size_t c = (*cap ? *cap * 2 : 512);
        while (c < *len + n + 1) c *= 2;
        char *t = realloc(*s, c);
        if (!t) { *ok = 0; return; }
        *s = t;
        *cap = c;
    }
    memcpy(*s + *len, a, n + 1);
    *len += n;
}

int ferry_sigv4_authorization(const ferry_sigv4_req *r, char *out, size_t cap) {
    char *cr = NULL, signed_names[512] = "";
    size_t len = 0, c = 0, sl = 0;
    int ok = 1;
    put(&cr, &len, &c, r->method, &ok); put(&cr, &len, &c, "\n", &ok);
    put(&cr, &len, &c, r->path, &ok); put(&cr, &len, &c, "\n", &ok);
    put(&cr, &len, &c, r->query ? r->query : "", &ok); put(&cr, &len, &c, "\n", &ok);
    for (int i = 0; i < r->nheaders; i++) {
        put(&cr, &len, &c, r->headers[i].name, &ok); put(&cr, &len, &c, ":", &ok);
        put(&cr, &len, &c, r->headers[i].value, &ok); put(&cr, &len, &c, "\n", &ok);
        int w = snprintf(signed_names + sl, sizeof signed_names - sl, "%s%s", i ? ";" : "", r->headers[i].name);
        if (w < 0 || (size_t)w >= sizeof signed_names - sl) ok = 0;
        else sl += (size_t)w;
    }
    put(&cr, &len, &c, "\n", &ok);
    put(&cr, &len, &c, signed_names, &ok); put(&cr, &len, &c, "\n", &ok);
    put(&cr, &len, &c, r->payload_hash, &ok);
    if (!ok) { free(cr); return ferry_seterr(FERRY_ENOMEM, "out of memory signing a request"); }
    uint8_t d[32];
    char crhex[65], date[9], scope[200], sts[400];
    ferry_sha256(cr, len, d);
    free(cr);
    ferry_hex32(d, crhex);
    memcpy(date, r->amz_date, 8);
    date[8] = 0;
    int w = snprintf(scope, sizeof scope, "%s/%s/%s/aws4_request", date, r->region, r->service);
    if (w < 0 || (size_t)w >= sizeof scope) return ferry_seterr(FERRY_EINVAL, "region or service name too long to sign");
    snprintf(sts, sizeof sts, "AWS4-HMAC-SHA256\n%s\n%s\n%s", r->amz_date, scope, crhex);
    /* kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request") */
    size_t sk = strlen(r->secret_key);
    char *k0 = malloc(sk + 5);
    if (!k0) return ferry_seterr(FERRY_ENOMEM, "out of memory signing a request");
    memcpy(k0, "AWS4", 4);
    memcpy(k0 + 4, r->secret_key, sk + 1);
    uint8_t k[32];
    ferry_hmac_sha256(k0, sk + 4, date, 8, k);
    memset(k0, 0, sk + 4);
    free(k0);
    ferry_hmac_sha256(k, 32, r->region, strlen(r->region), k);
    ferry_hmac_sha256(k, 32, r->service, strlen(r->service), k);
    ferry_hmac_sha256(k, 32, "aws4_request", 12, k);
    ferry_hmac_sha256(k, 32, sts, strlen(sts), d);
    char sig[65];
    ferry_hex32(d, sig);
    w = snprintf(out, cap, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s", r->access_key, scope,
                 signed_names, sig);
    if (w < 0 || (size_t)w >= cap) return ferry_seterr(FERRY_EINVAL, "signed Authorization header too long");
    return 0;
}
