/* fuzz_imagebatch.c — ferry_image_batch on the CPU into host memory, the
 * input a WebDataset tar: every sample whose image header probes (up to 64 K
 * pixels, so a run stays quick) goes into one batch, twice: on_error SKIP must
 * write the others and report the rest in order, RAISE must succeed only when
 * SKIP skipped none, and fail with a message otherwise. */
#include "fuzz.h"
#include "ferry_experimental.h"
#include "common.h"

static int fuzz_imagebatch(const uint8_t *data, size_t size) {
    ferry_ctx *ctx = ferry_fuzz_ctx();
    const char *path = ferry_fuzz_file(data, size);
    ferry_shards *s = NULL;
    if (ferry_shards_open(ctx, &path, 1, "tar", &s) < 0) {
        if (s || !ferry_errmsg(ctx)[0]) abort();
        return 0;
    }
    enum { MAXN = 16, H = 6, W = 5 };
    int64_t idx[MAXN];
    size_t n = 0;
    static uint8_t head[1 << 16];
    for (int64_t i = 0; i < ferry_shards_count(s) && n < MAXN; i++) {
        ferry_sample_info si;
        if (ferry_shards_sample(s, i, &si)) abort();
        for (int m = 0; m < si.nmembers; m++) {
            ferry_member_info mi;
            ferry_image_info in;
            if (ferry_shards_member(s, i, m, &mi)) abort();
            if (mi.size > sizeof head || ferry_shards_read(s, i, m, head, sizeof head) < 0) continue;
            if (ferry_image_probe(head, (size_t)mi.size, &in) == 0 && (uint64_t)in.width * in.height <= (1u << 16)) {
                idx[n++] = i;
                break;
            }
        }
    }
    static uint8_t out[MAXN * 3 * H * W];
    size_t skipped[MAXN];
    ferry_image_batch_args a;
    memset(&a, 0, sizeof a);
    a.shards = s;
    a.samples = idx;
    a.n = n;
    a.xf.height = H;
    a.xf.width = W;
    a.xf.crop = (ferry_image_crop)(size % 3);   /* random-resized, center or resize */
    a.xf.flip = 0.5;
    a.xf.dtype = FERRY_DT_U8;
    a.dst = ferry_host_buf(out, sizeof out);
    a.decode = FERRY_DECODE_CPU;
    a.threads = 2;
    a.on_error = FERRY_ON_ERROR_SKIP;
    ferry_image_batch_stats st;
    memset(&st, 0, sizeof st);
    st.skipped = skipped;
    int64_t got = ferry_image_batch(ctx, &a, &st);
    if (got < 0) {   /* SKIP fails only for the call itself, never for an image */
        if (!ferry_errmsg(ctx)[0]) abort();
    } else {
        if ((size_t)got != st.written || st.written + st.nskipped != n || st.cpu != st.written) abort();
        for (size_t k = 0; k < st.nskipped; k++)
            if (skipped[k] >= n || (k && skipped[k] <= skipped[k - 1])) abort();
    }
    a.on_error = FERRY_ON_ERROR_RAISE;
    int64_t r2 = ferry_image_batch(ctx, &a, NULL);
    if (got >= 0 && (r2 >= 0) != (st.nskipped == 0)) abort();
    if (r2 < 0 && !ferry_errmsg(ctx)[0]) abort();
    ferry_shards_close(s);
    return 0;
}
FERRY_FUZZ_TARGET(imagebatch, fuzz_imagebatch)
