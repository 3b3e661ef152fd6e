/* The decode of a crop's part against the whole decode, one thread, on the same build: for each
 * JPEG given, a RandomResizedCrop box (torchvision's defaults, drawn as ferry_image_batch draws
 * them), then the CPU milliseconds per image (best of 5 passes) of
 *   whole decode          ferry_image_decode (TurboJPEG, every pixel)
 *   part decode           ferry_image_decode_region (src/codecs/jpegregion.c: the box's band)
 *   ... + transform       the box resized to 224 x 224 (uint8 CHW), as the batch's CPU path does
 * and the share of the pixels the part decode produced. bench_image_roi.py measures the batch.
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc bench/image_region.c -o image_region \
 *      build/libferry.a $(cat build/libferry.libs) && ./image_region FILE.jpg ...
 * (bench_image_roi.py's set: its tar under /tmp/ferry-bench-roi, extracted). */
#include "codecs/image.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int n = argc - 1;
    if (n < 1) {
        fprintf(stderr, "usage: %s FILE.jpg...\n", argv[0]);
        return 2;
    }
    uint8_t **data = calloc((size_t)n, sizeof *data);
    size_t *size = calloc((size_t)n, sizeof *size), cap = 0;
    ferry_image_info *info = calloc((size_t)n, sizeof *info);
    for (int i = 0; i < n; i++) {
        FILE *f = fopen(argv[i + 1], "rb");
        if (!f || fseek(f, 0, SEEK_END) != 0) { fprintf(stderr, "%s: cannot read\n", argv[i + 1]); return 1; }
        size[i] = (size_t)ftell(f);
        rewind(f);
        data[i] = malloc(size[i]);
        if (fread(data[i], 1, size[i], f) != size[i]) { fprintf(stderr, "%s: short read\n", argv[i + 1]); return 1; }
        fclose(f);
        if (ferry_image_probe(data[i], size[i], &info[i]) < 0) { fprintf(stderr, "%s: %s\n", argv[i + 1], ferry_lasterr()); return 1; }
        size_t need = (size_t)info[i].width * info[i].height * 3;
        if (need > cap) cap = need;
    }
    uint8_t *px = malloc(cap), *row = malloc(224 * 224 * 3);
    ferry_img_out o = {224, 224, 3, FERRY_IMG_CHW, FERRY_DT_U8, {0, 0, 0}, {0, 0, 0}};
    static const char *const names[4] = {"whole decode", "part decode", "whole decode + transform",
                                         "part decode + transform"};
    printf("%d JPEGs; the part decode is %s in this build\n", n,
           ferry_jpeg_region_supported() ? "built in" : "NOT built in (no libjpeg-turbo libjpeg API: whole images)");
    for (int mode = 0; mode < 4; mode++) {
        double best = 1e30, share = 0;
        for (int pass = 0; pass < 5; pass++) {
            double t0 = cpu_now(), px_part = 0, px_all = 0;
            for (int i = 0; i < n; i++) {
                ferry_img_sample s = {{0, 0, 0, 0}, 0};
                ferry_img_random_resized_crop(1, (uint64_t)pass, (uint64_t)i, info[i].height, info[i].width, 0.08,
                                              1.0, 3.0 / 4.0, 4.0 / 3.0, &s.box);
                ferry_img_box got = {0, 0, info[i].height, info[i].width};
                int64_t r = mode % 2 == 0 ? ferry_image_decode(data[i], size[i], px, cap, 0, NULL)
                                          : ferry_image_decode_region(data[i], size[i], px, cap, 0, &s.box, &got, NULL);
                if (r < 0) { fprintf(stderr, "%s: %s\n", argv[i + 1], ferry_lasterr()); return 1; }
                if (mode >= 2 && ferry_img_transform_part(px, &got, info[i].height, info[i].width, (size_t)got.w * 3,
                                                          &s, &o, row) < 0) {
                    fprintf(stderr, "%s: %s\n", argv[i + 1], ferry_lasterr());
                    return 1;
                }
                px_part += (double)got.h * got.w;
                px_all += (double)info[i].height * info[i].width;
            }
            double ms = (cpu_now() - t0) * 1e3 / n;
            if (ms < best) best = ms;
            share = px_part / px_all;
        }
        printf("%-26s %6.3f CPU ms/img  (pixels decoded: %4.1f %%)\n", names[mode], best, share * 100);
    }
    return 0;
}
