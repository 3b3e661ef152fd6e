/* jpeg.c — JPEG decoding through libjpeg-turbo's TurboJPEG API (the 2.x
 * calls, which 3.x keeps).
 *
 * Corrupt data: TJFLAG_STOPONWARNING turns libjpeg's warnings ("Premature end
 * of JPEG file", "Corrupt JPEG data: N extraneous bytes") into errors, so a
 * truncated or damaged image is refused rather than returned in part;
 * TJFLAG_LIMITSCANS refuses progressive images of more than 500 scans (a
 * known way to make a small file cost minutes). 12-bit and lossless JPEGs are
 * refused (libjpeg-turbo's 8-bit API does not decode them).
 *
 * Color: YCbCr and RGB images decode to RGB, gray ones to gray (one channel)
 * or RGB (replicated), as libjpeg converts them. CMYK and YCCK images decode
 * to CMYK and are converted here as Pillow converts CMYK to RGB
 * (R = (255 - C)(255 - K) / 255, rounded): stored inverted when an Adobe
 * APP14 marker is present (Photoshop's convention, which Pillow follows when
 * reading: "CMYK;I"), as is otherwise.
 *
 * The header fields TurboJPEG does not report (progressive, precision, the
 * Adobe marker) come from a walk over the markers before the first scan. */
#include "codecs/image.h"
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#ifdef FERRY_HAVE_TURBOJPEG
#include <turbojpeg.h>
#endif

typedef struct jpeg_markers {
    int progressive, lossless, precision, adobe, found_sof, dht;
} jpeg_markers;

/* Markers from SOI to SOS: segment lengths bounded by n. */
static int jpeg_walk(const uint8_t *p, size_t n, jpeg_markers *m) {
    memset(m, 0, sizeof *m);
    if (n < 4 || p[0] != 0xFF || p[1] != 0xD8) return ferry_seterr(FERRY_ECODEC, "jpeg: byte 0: no SOI marker");
    size_t i = 2;
    while (i + 4 <= n) {
        if (p[i] != 0xFF) return ferry_seterr(FERRY_ECODEC, "jpeg: byte %zu: expected a marker", i);
        uint8_t t = p[i + 1];
        if (t == 0xFF) { i++; continue; }   /* fill bytes */
        if (t == 0xD8 || (t >= 0xD0 && t <= 0xD7) || t == 0x01) { i += 2; continue; }
        if (t == 0xD9) break;
        size_t len = ((size_t)p[i + 2] << 8) | p[i + 3];
        if (len < 2 || len > n - i - 2)
            return ferry_seterr(FERRY_ECODEC, "jpeg: byte %zu: marker 0x%02X: segment of %zu bytes past the end", i, t, len);
        const uint8_t *seg = p + i + 4;
        size_t sl = len - 2;
        if (t >= 0xC0 && t <= 0xCF && t != 0xC4 && t != 0xC8 && t != 0xCC) {
            if (sl < 6) return ferry_seterr(FERRY_ECODEC, "jpeg: byte %zu: SOF segment too short", i);
            m->found_sof = 1;
            m->precision = seg[0];
            m->progressive = t == 0xC2 || t == 0xC6 || t == 0xCA || t == 0xCE;
            m->lossless = t == 0xC3 || t == 0xC7 || t == 0xCB || t == 0xCF;
        } else if (t == 0xC4) {
            m->dht = 1;
        } else if (t == 0xEE && sl >= 12 && !memcmp(seg, "Adobe", 5)) {
            m->adobe = 1;
        } else if (t == 0xDA) {
            break;
        }
        i += 2 + len;
    }
    if (!m->found_sof) return ferry_seterr(FERRY_ECODEC, "jpeg: no frame header (SOF) before the first scan");
    return 0;
}

#ifdef FERRY_HAVE_TURBOJPEG
static pthread_key_t tj_key;
static pthread_once_t tj_once = PTHREAD_ONCE_INIT;
static void tj_free(void *h) { tjDestroy((tjhandle)h); }
static void tj_key_make(void) { (void)pthread_key_create(&tj_key, tj_free); }

/* The calling thread's decompressor, made on first use, freed at thread exit.
 * A decompressor remembers the tables of the images it read (JPEG lets an
 * image omit the Huffman and quantization tables it shares with earlier
 * ones), and one that failed may keep a damaged table: `fresh` and every
 * failure (tj_drop) give the next image a new decompressor. Every decode is
 * fresh (a new decompressor costs well under a microsecond), so no image
 * decodes differently for what came before it on its thread: an image using
 * a table it does not define is refused, as jpegregion.c refuses it; a header
 * probe reuses the decompressor unless the image has no Huffman table. */
static void tj_drop(void) {
    tjhandle h = pthread_getspecific(tj_key);
    if (h) { pthread_setspecific(tj_key, NULL); tjDestroy(h); }
}

static tjhandle tj_get(int fresh) {
    pthread_once(&tj_once, tj_key_make);
    if (fresh) tj_drop();
    tjhandle h = pthread_getspecific(tj_key);
    if (!h && (h = tjInitDecompress()) != NULL && pthread_setspecific(tj_key, h) != 0) {
        tjDestroy(h);
        h = NULL;
    }
    return h;
}

static int tj_err(tjhandle h, const char *what) {
    int rc = ferry_seterr(FERRY_ECODEC, "jpeg: %s: %s", what, tjGetErrorStr2(h));
    tj_drop();
    return rc;
}

int ferry_jpeg_probe(const uint8_t *data, size_t n, ferry_image_info *out) {
    jpeg_markers m;
    int rc = jpeg_walk(data, n, &m);
    if (rc < 0) return rc;
    tjhandle h = tj_get(!m.dht);
    if (!h) return ferry_seterr(FERRY_ENOMEM, "jpeg: cannot make a TurboJPEG decompressor");
    int w, ht, ss, cs;
    if (n > ULONG_MAX || tjDecompressHeader3(h, data, (unsigned long)n, &w, &ht, &ss, &cs) != 0)
        return tj_err(h, "header");
    static const int sub[] = {444, 422, 420, 400, 440, 411, 441};
    memset(out, 0, sizeof *out);
    out->format = FERRY_IMAGE_JPEG;
    out->width = (uint32_t)w;
    out->height = (uint32_t)ht;
    out->channels = cs == TJCS_GRAY ? 1 : (cs == TJCS_CMYK || cs == TJCS_YCCK) ? 4 : 3;
    out->subsampling = ss >= 0 && ss < (int)(sizeof sub / sizeof sub[0]) ? sub[ss] : 0;
    out->progressive = m.progressive;
    out->bit_depth = m.precision;
    out->cmyk = out->channels == 4;
    if (m.precision != 8 || m.lossless)
        return ferry_seterr(FERRY_EUNSUPPORTED, "jpeg: a %d-bit%s JPEG: ferry decodes 8-bit lossy JPEGs", m.precision,
                            m.lossless ? " lossless" : "");
    if (w <= 0 || ht <= 0) return ferry_seterr(FERRY_ECODEC, "jpeg: image of %d x %d pixels", w, ht);
    return 0;
}

/* Pillow's CMYK -> RGB (Convert.c cmyk2rgb): nk = 255 - K; R = nk - C * nk / 255 (rounded). */
static uint8_t cmyk_mix(unsigned c, unsigned nk) {
    unsigned t = c * nk + 128;
    return (uint8_t)(nk - ((t + (t >> 8)) >> 8));
}

int ferry_jpeg_decode(const uint8_t *data, size_t n, const ferry_image_info *info, int ch, uint8_t *dst) {
    jpeg_markers m;
    int rc = jpeg_walk(data, n, &m);
    if (rc < 0) return rc;
    tjhandle h = tj_get(1);
    if (!h) return ferry_seterr(FERRY_ENOMEM, "jpeg: cannot make a TurboJPEG decompressor");
    int flags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS | TJFLAG_ACCURATEDCT;
    int w = (int)info->width, ht = (int)info->height;
    if (!info->cmyk) {
        int pf = ch == 1 ? TJPF_GRAY : TJPF_RGB;
        if (tjDecompress2(h, data, (unsigned long)n, dst, w, w * ch, ht, pf, flags) != 0) return tj_err(h, "decode");
        return 0;
    }
    uint8_t *cmyk = malloc((size_t)w * (size_t)ht * 4);
    if (!cmyk) return ferry_seterr(FERRY_ENOMEM, "jpeg: out of memory for a %d x %d CMYK image", w, ht);
    if (tjDecompress2(h, data, (unsigned long)n, cmyk, w, w * 4, ht, TJPF_CMYK, flags) != 0) {
        rc = tj_err(h, "decode");
        free(cmyk);
        return rc;
    }
    size_t px = (size_t)w * (size_t)ht;
    uint8_t inv = m.adobe ? 0xFF : 0;
    for (size_t i = 0; i < px; i++) {
        const uint8_t *q = cmyk + 4 * i;
        unsigned nk = 255u - (uint8_t)(q[3] ^ inv);
        uint8_t r = cmyk_mix((uint8_t)(q[0] ^ inv), nk), g = cmyk_mix((uint8_t)(q[1] ^ inv), nk),
                b = cmyk_mix((uint8_t)(q[2] ^ inv), nk);
        dst[3 * i] = r;   /* ch is 3: only gray images decode to one channel */
        dst[3 * i + 1] = g;
        dst[3 * i + 2] = b;
    }
    free(cmyk);
    return 0;
}
#else
int ferry_jpeg_probe(const uint8_t *data, size_t n, ferry_image_info *out) {
    jpeg_markers m;
    int rc = jpeg_walk(data, n, &m);
    if (rc < 0) return rc;
    return ferry_seterr(FERRY_EUNSUPPORTED, "jpeg: this ferry was built without libturbojpeg");
}
int ferry_jpeg_decode(const uint8_t *data, size_t n, const ferry_image_info *info, int ch, uint8_t *dst) {
    return ferry_seterr(FERRY_EUNSUPPORTED, "jpeg: this ferry was built without libturbojpeg");
}
#endif
