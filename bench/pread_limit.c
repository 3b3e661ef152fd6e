/* The machine's random small-read limit, for bench_torch.py's token-window rows: T threads each
 * pread()ing LEN bytes at random multiples of STRIDE in FILE for SECONDS; prints GB/s (1e9).
 * No ferry code involved: this is the line a dataset of random records is measured against.
 *   cc -O2 -pthread bench/pread_limit.c -o pread_limit && ./pread_limit FILE LEN STRIDE T SECONDS */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int fd;
static long long len, stride, records;
static double seconds;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *reader(void *arg) {
    uint64_t x = 0x9E3779B97F4A7C15ull * ((uintptr_t)arg + 1);
    char *buf = malloc(len);
    long long *got = calloc(1, sizeof *got);
    if (!buf || !got) return NULL;
    double end = now() + seconds;
    for (long n = 0;; n++) {
        if ((n & 63) == 0 && now() > end) break;
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;                  /* xorshift64 */
        long long off = (long long)(x % (uint64_t)records) * stride;
        ssize_t r = pread(fd, buf, len, off);
        if (r <= 0) break;
        *got += r;
    }
    free(buf);
    return got;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s FILE LEN STRIDE THREADS SECONDS\n", argv[0]);
        return 2;
    }
    fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) { perror(argv[1]); return 1; }
    len = atoll(argv[2]); stride = atoll(argv[3]); seconds = atof(argv[5]);
    int threads = atoi(argv[4]);
    if (len <= 0 || stride <= 0 || threads <= 0 || threads > 1024 || st.st_size < len) return 2;
    records = (st.st_size - len) / stride + 1;
    pthread_t t[1024];
    double t0 = now();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, reader, (void *)(uintptr_t)i);
    long long total = 0;
    for (int i = 0; i < threads; i++) {
        long long *g;
        pthread_join(t[i], (void **)&g);
        if (g) { total += *g; free(g); }
    }
    printf("%.3f\n", total / (now() - t0) / 1e9);
    return 0;
}
