/* test_jpegregion.c — the partial JPEG decode (ferry_image_decode_region,
 * src/codecs/jpegregion.c) gives, inside the box, the bytes of the whole
 * decode (ferry_image_decode), for 4:2:0, 4:2:2, 4:4:4, 4:4:0, 4:1:1, gray
 * (as RGB and as one channel), baseline and progressive, progressive images
 * missing their last scans (block smoothing), odd sizes: every left edge and
 * every right edge of a box with widths 1 to a whole iMCU and more, every top
 * and bottom edge likewise, and random boxes. Damaged data below the box is an
 * error as in the whole decode. Then ferry_image_batch's rows (the CPU path
 * decodes parts) equal the whole decode + transform byte for byte over many
 * drawn boxes, for uint8 and float32 outputs. */
#include "imagebatch_check.h"
#ifdef IB_HAVE_CODECS
#include "codecs/image.h"

static ferry_ctx *ctx_;
static char dir_[] = "/tmp/ferry-test-jpegregion-XXXXXX";

/* gradients with strong noise: chroma changes from pixel to pixel, so a
 * wrong upsampling neighbour shows */
static uint8_t *noisy(int w, int h, int ch, unsigned seed) {
    uint8_t *p = malloc((size_t)w * h * ch);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++) {
                seed = seed * 1103515245u + 12345u;
                int v = x * 150 / w + y * 70 / h + c * 30 + (int)((seed >> 16) % 81) - 40;
                p[((size_t)y * w + x) * ch + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
    return p;
}

static uint8_t *encode(int w, int h, int ch, int samp, int flags, unsigned seed, size_t *size) {
    uint8_t *px = noisy(w, h, ch, seed);
    tjhandle t = tjInitCompress();
    unsigned char *out = NULL;
    unsigned long n = 0;
    uint8_t *copy = NULL;
    int pf = ch == 1 ? TJPF_GRAY : ch == 4 ? TJPF_CMYK : TJPF_RGB;
    if (t && tjCompress2(t, px, w, w * ch, h, pf, &out, &n, samp, 90, flags) == 0 && (copy = malloc(n))) {
        memcpy(copy, out, n);
        *size = n;
    }
    tjFree(out);
    if (t) tjDestroy(t);
    free(px);
    return copy;
}

/* A progressive JPEG cut after its first `keep` scans, ended by EOI: valid,
 * decoded with block smoothing (the AC refinement it lacks is estimated). */
static size_t keep_scans(uint8_t *p, size_t n, int keep) {
    int scans = 0;
    for (size_t i = 2; i + 1 < n; i++) {
        if (p[i] != 0xFF || p[i + 1] == 0x00 || p[i + 1] == 0xFF || (p[i + 1] >= 0xD0 && p[i + 1] <= 0xD7)) continue;
        if (p[i + 1] == 0xDA && scans++ == keep) {
            p[i + 1] = 0xD9;
            return i + 2;
        }
        if (p[i + 1] != 0xDA && p[i + 1] != 0xD9 && i + 3 < n) i += 1 + (((size_t)p[i + 2] << 8) | p[i + 3]);
    }
    return n;
}

typedef struct img {
    const char *name;
    uint8_t *data;
    size_t size;
    int w, h, ch;          /* ch: the decode's channels */
    uint8_t *full;         /* the whole decode */
} img;

static int load(img *m, const char *name, uint8_t *data, size_t size, int w, int h, int ch) {
    memset(m, 0, sizeof *m);
    m->name = name;
    m->data = data;
    m->size = size;
    m->w = w;
    m->h = h;
    m->ch = ch;
    if (!data) return -1;
    size_t need = (size_t)w * h * ch;
    m->full = malloc(need);
    int64_t got = ferry_image_decode(data, size, m->full, need, ch == 1 ? FERRY_IMAGE_KEEP_GRAY : 0, NULL);
    if (got != (int64_t)need) printf("  %s: whole decode: %s\n", name, ferry_errmsg(NULL));
    return got == (int64_t)need ? 0 : -1;
}

static uint8_t *scratch_;
static long boxes_, partial_;

/* Decode the region of box b; 1 when every pixel of the box equals the whole decode's. */
static int region_equal(const img *m, ferry_img_box b) {
    size_t cap = (size_t)m->w * m->h * m->ch;
    ferry_img_box got;
    memset(scratch_, 0xA5, cap);
    int64_t r = ferry_image_decode_region(m->data, m->size, scratch_, cap, m->ch == 1 ? FERRY_IMAGE_KEEP_GRAY : 0, &b,
                                          &got, NULL);
    boxes_++;
    if (r < 0) {
        printf("  %s box (y %u x %u h %u w %u): %s\n", m->name, b.y, b.x, b.h, b.w, ferry_errmsg(NULL));
        return 0;
    }
    if (r != (int64_t)got.h * got.w * m->ch || got.y > b.y || got.x > b.x || got.y + got.h < b.y + b.h ||
        got.x + got.w < b.x + b.w || got.x + got.w > (uint32_t)m->w || got.y + got.h > (uint32_t)m->h) {
        printf("  %s box (y %u x %u h %u w %u): decoded (y %u x %u h %u w %u), %lld bytes\n", m->name, b.y, b.x, b.h,
               b.w, got.y, got.x, got.h, got.w, (long long)r);
        return 0;
    }
    if (got.w < (uint32_t)m->w || got.h < (uint32_t)m->h) partial_++;
    for (uint32_t y = b.y; y < b.y + b.h; y++) {
        const uint8_t *want = m->full + ((size_t)y * m->w + b.x) * m->ch;
        const uint8_t *have = scratch_ + ((size_t)(y - got.y) * got.w + (b.x - got.x)) * m->ch;
        if (memcmp(want, have, (size_t)b.w * m->ch)) {
            uint32_t x = 0;
            while (!memcmp(want + (size_t)x * m->ch, have + (size_t)x * m->ch, m->ch)) x++;
            printf("  %s box (y %u x %u h %u w %u): pixel (%u, %u) differs from the whole decode\n", m->name, b.y,
                   b.x, b.h, b.w, y, b.x + x);
            return 0;
        }
    }
    return 1;
}

/* every left edge and every right edge (widths 1, 2, 3, 7, 16, 17, 33), every
 * top and bottom edge (heights likewise), with the other axis a middle band
 * and the whole; then random boxes. The number of boxes that differ. */
static int sweep(const img *m, unsigned seed) {
    static const uint32_t sizes[] = {1, 2, 3, 7, 16, 17, 33};
    uint32_t w = (uint32_t)m->w, h = (uint32_t)m->h;
    int bad = 0;
    for (int axis = 0; axis < 2; axis++) {
        uint32_t len = axis ? h : w, other = axis ? w : h;
        ferry_img_box bands[2] = {{0, 0, other, other}, {other / 3, other / 3, other / 3 + 1, other / 3 + 1}};
        for (int bi = 0; bi < 2; bi++)
            for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
                uint32_t s = sizes[k];
                if (s > len) continue;
                for (uint32_t a = 0; a + s <= len; a++)
                    for (int end = 0; end < 2; end++) {
                        uint32_t lo = end ? len - s - a : a;   /* the left (top) edge at a, or the right (bottom) edge at len - a */
                        ferry_img_box b = axis ? (ferry_img_box){lo, bands[bi].x, s, bands[bi].w}
                                               : (ferry_img_box){bands[bi].y, lo, bands[bi].h, s};
                        if (!region_equal(m, b) && ++bad > 5) return bad;
                    }
            }
    }
    for (int k = 0; k < 400; k++) {
        seed = seed * 1103515245u + 12345u;
        uint32_t bw = 1 + (seed >> 8) % w;
        seed = seed * 1103515245u + 12345u;
        uint32_t bh = 1 + (seed >> 8) % h;
        seed = seed * 1103515245u + 12345u;
        uint32_t bx = (seed >> 8) % (w - bw + 1);
        seed = seed * 1103515245u + 12345u;
        uint32_t by = (seed >> 8) % (h - bh + 1);
        if (!region_equal(m, (ferry_img_box){by, bx, bh, bw}) && ++bad > 5) return bad;
    }
    return bad;
}

static void test_region_equals_whole_decode(void) {
    static const struct { const char *name; int w, h, ch, samp, flags, keep; } cases[] = {
        {"4:2:0", 83, 75, 3, TJSAMP_420, 0, -1},
        {"4:2:2", 83, 75, 3, TJSAMP_422, 0, -1},
        {"4:4:4", 61, 53, 3, TJSAMP_444, 0, -1},
        {"4:4:0", 61, 75, 3, TJSAMP_440, 0, -1},
        {"4:1:1", 83, 45, 3, TJSAMP_411, 0, -1},
        {"gray as RGB", 61, 53, 1, TJSAMP_GRAY, 0, -1},
        {"gray", 61, 53, 1, TJSAMP_GRAY, 0, -1},
        {"4:2:0 progressive", 83, 75, 3, TJSAMP_420, TJFLAG_PROGRESSIVE, -1},
        {"4:2:2 progressive, 4 scans", 83, 75, 3, TJSAMP_422, TJFLAG_PROGRESSIVE, 4},
        {"4:2:0 progressive, DC scan only", 83, 75, 3, TJSAMP_420, TJFLAG_PROGRESSIVE, 1},
        {"4:2:0 32 x 16 (one iMCU row)", 32, 16, 3, TJSAMP_420, 0, -1},
        {"4:2:0 1 x 1", 1, 1, 3, TJSAMP_420, 0, -1},
        {"4:2:0 1 wide", 1, 40, 3, TJSAMP_420, 0, -1},
        {"4:2:0 1 high", 40, 1, 3, TJSAMP_420, 0, -1}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t n = 0;
        int src_ch = cases[k].samp == TJSAMP_GRAY ? 1 : 3;
        uint8_t *data = encode(cases[k].w, cases[k].h, src_ch, cases[k].samp, cases[k].flags, 11u + (unsigned)k, &n);
        if (data && cases[k].keep >= 0) n = keep_scans(data, n, cases[k].keep);
        int ch = !strcmp(cases[k].name, "gray") ? 1 : 3;
        img m;
        CHECK_EQ_I(load(&m, cases[k].name, data, n, cases[k].w, cases[k].h, ch), 0);
        if (m.full) {
            long before = partial_;
            scratch_ = malloc((size_t)m.w * m.h * m.ch);
            int bad = sweep(&m, 7u + (unsigned)k);
            if (bad) printf("  %s: %d boxes differ\n", cases[k].name, bad);
            CHECK_EQ_I(bad, 0);
            /* the decode was partial (not the whole image every time) where it is built in */
            if (ferry_jpeg_region_supported() && m.w > 32) CHECK(partial_ > before);
            free(scratch_);
        }
        free(m.full);
        free(data);
    }
    printf("  %ld boxes, %ld decoded in part\n", boxes_, partial_);
}

/* A region decode without libjpeg-turbo's libjpeg API is a whole decode: the
 * build here has it where the Makefile found jpeglib.h. */
static void test_built_in_where_libjpeg_is(void) {
#ifdef FERRY_HAVE_LIBJPEG
    CHECK_EQ_I(ferry_jpeg_region_supported(), 1);
#else
    CHECK_EQ_I(ferry_jpeg_region_supported(), 0);
#endif
}

/* CMYK images and whole-image boxes decode whole; PNGs too. */
static void test_whole_where_no_part_is_cut(void) {
    size_t n = 0;
    uint8_t *data = encode(40, 30, 4, TJSAMP_444, 0, 3, &n);
    CHECK(data != NULL);
    uint8_t *px = malloc(40 * 30 * 3);
    ferry_img_box want = {5, 6, 7, 8}, got;
    CHECK_EQ_I(ferry_image_decode_region(data, n, px, 40 * 30 * 3, 0, &want, &got, NULL), 40 * 30 * 3);
    CHECK(got.y == 0 && got.x == 0 && got.h == 30 && got.w == 40);
    free(data);
    data = encode(40, 30, 3, TJSAMP_420, 0, 3, &n);
    want = (ferry_img_box){0, 0, 30, 40};
    CHECK_EQ_I(ferry_image_decode_region(data, n, px, 40 * 30 * 3, 0, &want, &got, NULL), 40 * 30 * 3);
    CHECK(got.y == 0 && got.x == 0 && got.h == 30 && got.w == 40);
    want = (ferry_img_box){29, 39, 2, 1};   /* past the bottom */
    CHECK_EQ_I(ferry_image_decode_region(data, n, px, 40 * 30 * 3, 0, &want, &got, NULL), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "outside the 30 x 40 image");
    CHECK_EQ_I(ferry_image_decode_region(data, n, px, 40 * 30 * 3 - 1, 0, &want, &got, NULL), FERRY_EINVAL);
    free(data);
    free(px);
}

/* Damaged bytes below the box, or a cut stream, are errors as in the whole decode. */
static void test_damage_below_the_box_is_an_error(void) {
    for (int progressive = 0; progressive < 2; progressive++)
        for (int cut = 0; cut < 2; cut++) {
            size_t n = 0;
            uint8_t *data = encode(160, 120, 3, TJSAMP_420, progressive ? TJFLAG_PROGRESSIVE : 0, 5, &n);
            CHECK(data != NULL);
            if (!data) continue;
            if (cut) n = n * 9 / 10;
            else
                for (size_t i = n - n / 12; i < n - n / 12 + 24; i++) data[i] = 0xFF;   /* markers in the last rows' data */
            size_t cap = 160 * 120 * 3;
            uint8_t *px = malloc(cap);
            int64_t whole = ferry_image_decode(data, n, px, cap, 0, NULL);
            CHECK_EQ_I(whole, FERRY_ECODEC);
            ferry_img_box want = {0, 40, 16, 30}, got;
            CHECK_EQ_I(ferry_image_decode_region(data, n, px, cap, 0, &want, &got, NULL), FERRY_ECODEC);
            CHECK_STR_CONTAINS(ferry_errmsg(NULL), "jpeg: ");
            free(px);
            free(data);
        }
}

/* An image without quantization tables of its own, decoded after one with
 * them on the same thread, is refused by both decoders (a decompressor kept
 * from the earlier image would have used its tables). */
static void test_tables_of_an_earlier_image_are_not_used(void) {
    size_t n = 0;
    uint8_t *a = encode(48, 32, 3, TJSAMP_420, 0, 9, &n);
    CHECK(a != NULL);
    if (!a) return;
    uint8_t *b = malloc(n);
    size_t m = 0, i = 2;
    memcpy(b, a, 2);
    m = 2;
    while (i + 4 <= n && a[i] == 0xFF && a[i + 1] != 0xDA) {   /* the segments before the scan, less DQT */
        size_t len = 2 + (((size_t)a[i + 2] << 8) | a[i + 3]);
        if (a[i + 1] != 0xDB) { memcpy(b + m, a + i, len); m += len; }
        i += len;
    }
    memcpy(b + m, a + i, n - i);
    m += n - i;
    CHECK(m < n);
    uint8_t *px = malloc(48 * 32 * 3);
    ferry_img_box want = {3, 20, 9, 9}, got;
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_I(ferry_image_decode(a, n, px, 48 * 32 * 3, 0, NULL), 48 * 32 * 3);
        CHECK_EQ_I(ferry_image_decode(b, m, px, 48 * 32 * 3, 0, NULL), FERRY_ECODEC);
        CHECK_STR_CONTAINS(ferry_errmsg(NULL), "Quantization table");
        CHECK_EQ_I(ferry_image_decode(a, n, px, 48 * 32 * 3, 0, NULL), 48 * 32 * 3);
        CHECK_EQ_I(ferry_image_decode_region(b, m, px, 48 * 32 * 3, 0, &want, &got, NULL), FERRY_ECODEC);
        CHECK_STR_CONTAINS(ferry_errmsg(NULL), "Quantization table");
    }
    free(px);
    free(a);
    free(b);
}

/* ---- ferry_image_batch: the rows of the CPU path ------------------------- */
enum { NB = 7 };
static ib_image bim_[NB];

static void test_batch_rows_equal_whole_decode(void) {
    static const struct { int samp, flags, w, h; } spec[NB] = {
        {TJSAMP_420, 0, 333, 251}, {TJSAMP_422, 0, 301, 227}, {TJSAMP_444, 0, 250, 199},
        {TJSAMP_GRAY, 0, 277, 211}, {TJSAMP_411, 0, 256, 180}, {TJSAMP_420, TJFLAG_PROGRESSIVE, 289, 203},
        {TJSAMP_440, 0, 210, 290}};
    const char *paths[NB];
    for (int i = 0; i < NB; i++) {
        ib_image *b = &bim_[i];
        memset(b, 0, sizeof *b);
        b->kind = IB_BASELINE;
        b->w = spec[i].w;
        b->h = spec[i].h;
        b->data = encode(spec[i].w, spec[i].h, spec[i].samp == TJSAMP_GRAY ? 1 : 3, spec[i].samp, spec[i].flags,
                         21u + (unsigned)i, &b->size);
        char name[16];
        snprintf(name, sizeof name, "b%02d", i);
        ib_write(b, dir_, name);
        paths[i] = b->path;
    }
    ferry_shards *set = NULL;
    CHECK_EQ_I(ferry_shards_open(ctx_, paths, NB, "files", &set), 0);
    if (!set) return;
    enum { S = 8 * NB };
    int64_t samples[S];
    for (int i = 0; i < S; i++) samples[i] = i % NB;
    static const ferry_dtype dts[2] = {FERRY_DT_U8, FERRY_DT_F32};
    int bad = 0;
    for (int di = 0; di < 2; di++)
        for (uint64_t epoch = 0; epoch < 6; epoch++) {
            ferry_image_batch_args a;
            memset(&a, 0, sizeof a);
            a.shards = set;
            a.samples = samples;
            a.n = S;
            a.xf.height = a.xf.width = 56;
            a.xf.crop = FERRY_IMAGE_CROP_RANDOM_RESIZED;
            a.xf.flip = 0.5;
            a.xf.layout = di ? FERRY_IMAGE_HWC : FERRY_IMAGE_CHW;
            a.xf.dtype = dts[di];
            if (di)
                for (int c = 0; c < 3; c++) { a.xf.mean[c] = 0.45f; a.xf.std[c] = 0.225f; }
            a.seed = 3;
            a.epoch = epoch;
            a.decode = FERRY_DECODE_CPU;
            a.threads = 2;
            size_t rb = ib_row_bytes(&a.xf);
            uint8_t *out = malloc(S * rb), *want = malloc(rb);
            a.dst = ferry_host_buf(out, S * rb);
            CHECK_EQ_I(ferry_image_batch(ctx_, &a, NULL), S);
            /* the same sample index recurs: the draws differ only by (seed, epoch, sample) */
            for (int i = 0; i < S; i++) {
                CHECK_EQ_I(ib_expected(&a, &bim_[samples[i]], samples[i], want), 0);
                if (memcmp(want, out + (size_t)i * rb, rb)) {
                    if (bad++ < 5) printf("  dtype %d epoch %llu row %d (image %lld) differs from the whole decode\n", di,
                                          (unsigned long long)epoch, i, (long long)samples[i]);
                }
            }
            free(out);
            free(want);
        }
    CHECK_EQ_I(bad, 0);
    ferry_shards_close(set);
    for (int i = 0; i < NB; i++) {
        unlink(bim_[i].path);
        free(bim_[i].data);
    }
}
#endif

int main(void) {
#ifndef IB_HAVE_CODECS
    (void)check_current_;
    (void)check_failures_in_test_;
    printf("skipped: built without libturbojpeg or libspng\n0 passed, 0 failed, 1 skipped\n");
    return 0;
#else
    if (ferry_ctx_create(&ctx_, NULL) != 0 || !mkdtemp(dir_)) return 1;
    RUN(test_built_in_where_libjpeg_is);
    RUN(test_region_equals_whole_decode);
    RUN(test_whole_where_no_part_is_cut);
    RUN(test_damage_below_the_box_is_an_error);
    RUN(test_tables_of_an_earlier_image_are_not_used);
    RUN(test_batch_rows_equal_whole_decode);
    rmdir(dir_);
    ferry_ctx_destroy(ctx_);
    return check_summary();
#endif
}
