#include <ferry.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(int argc, char **argv) {
    size_t len = (size_t)atol(argv[2]);
    ferry_ctx *ctx; ferry_config c; ferry_config_init(&c);
    ferry_ctx_create(&ctx, &c);
    ferry_file *f; ferry_file_open(ctx, argv[1], FERRY_READ, &f);
    void *buf; posix_memalign(&buf, 4096, 1 << 20);
    srand(7);
    struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
    int n = 300000;
    for (int i = 0; i < n; i++) {
        uint64_t off = ((uint64_t)rand() % ((256u << 20) / 4096 - 256)) * 4096;
        if (ferry_pread(f, ferry_host_buf(buf, 1 << 20), off, len, 0) != (int64_t)len) return 3;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.3f us per read\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e3 / n);
    return 0;
}
