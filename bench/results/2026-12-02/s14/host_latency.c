/* small-read latency into host memory: ferry_pread vs pread, warm page cache,
 * random 4 KiB-aligned offsets, interleaved; p50 / p99 in microseconds */
#include <ferry.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    const char *path = argv[1];
    int fd = open(path, O_RDONLY);
    off_t fsize = lseek(fd, 0, SEEK_END);
    ferry_ctx *ctx; ferry_config c; ferry_config_init(&c);
    if (ferry_ctx_create(&ctx, &c)) return 1;
    ferry_file *f; if (ferry_file_open(ctx, path, FERRY_READ, &f)) return 2;
    static const size_t sizes[] = {4096, 65536, 262144, 1 << 20};
    enum { N = 3000 };
    double *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    void *buf; posix_memalign(&buf, 4096, 1 << 20);
    srand(7);
    for (int s = 0; s < 4; s++) {
        size_t len = sizes[s];
        for (int i = 0; i < N; i++) {
            off_t off = ((off_t)rand() % ((fsize - (off_t)len) / 4096)) * 4096;
            double t0 = now();
            if (ferry_pread(f, ferry_host_buf(buf, 1 << 20), off, len, 0) != (int64_t)len) return 3;
            double t1 = now();
            off_t off2 = ((off_t)rand() % ((fsize - (off_t)len) / 4096)) * 4096;   /* its own offset: not cache-hot */
            if (pread(fd, buf, len, off2) != (ssize_t)len) return 4;
            double t2 = now();
            a[i] = t1 - t0; b[i] = t2 - t1;
        }
        qsort(a, N, sizeof *a, cmp); qsort(b, N, sizeof *b, cmp);
        printf("%7zu B  ferry p50 %7.1f p99 %7.1f   pread p50 %7.1f p99 %7.1f\n", len, a[N / 2], a[N * 99 / 100], b[N / 2], b[N * 99 / 100]);
    }
    ferry_file_close(f); ferry_ctx_destroy(ctx);
    return 0;
}
