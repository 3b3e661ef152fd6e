/* Page cache -> memory at a chosen destination alignment: is a pread slower
 * when its destination sits elsewhere in a 64-byte line than its source? The
 * question behind the GPU decode's packed staging (gpudecode.c put each
 * compressed chunk 8-aligned in one pinned buffer, where the uncompressed
 * path reads page-aligned). Measured (BENCHMARKS.md, D5): yes on an AMD EPYC
 * (790 KB files, 2 threads: 18.2 GB/s to 0 mod 64, 4.8 to 8), no on an Intel
 * Xeon (16 threads: 45.0 and 44.9). bench_decode.py runs its -l form as the read bound of a Zarr
 * store's chunk files. No ferry code involved. Writes N files of LEN bytes in DIR (page cache warm
 * from the writes), then T threads pread every file whole into one shared
 * buffer at slots spaced like packed chunks, each slot's start at ALIGN mod
 * 4096, for each ALIGN given; best of REPS passes; prints GB/s (1e9).
 * SRC_OFF=B in the environment: the bytes read start B bytes into each file.
 *   cc -O2 -pthread bench/pread_align.c -o pread_align
 *   ./pread_align DIR N LEN T REPS ALIGN...   (e.g. /tmp/pa 4096 790000 16 5 0 8 64 2)
 *   ./pread_align -l LIST T REPS ALIGN...     (the files named in LIST, one per line, as
 *                                              they are: a store's chunk files, warm) */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int nfiles, *fds;
static long long len, slotsz, *lens, *slots;   /* lens/slots: -l, files of their own sizes */
static uint8_t *buf;
static long align_, src_off;
static _Atomic int next_;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *reader(void *arg) {
    (void)arg;
    for (;;) {
        int i = next_++;
        if (i >= nfiles) break;
        long long n = lens ? lens[i] : len;
        uint8_t *dst = buf + (lens ? (size_t)slots[i] : (size_t)i * slotsz) + align_;
        if (pread(fds[i], dst, n, src_off) != n) { perror("pread"); exit(1); }
    }
    return NULL;
}

/* The one buffer every pread goes to: resident and locked like pinned
 * staging (best effort), so no page faults are timed. */
static int stage(size_t total) {
    buf = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (buf == MAP_FAILED) { perror("mmap"); return -1; }
    mlock(buf, total);
    return 0;
}

/* best GB/s of REPS passes over every file at each ALIGN in av */
static int sweep(int ac, char **av, int threads, int reps, double bytes) {
    pthread_t t[256];
    for (int a = 0; a < ac; a++) {
        align_ = atol(av[a]);
        if (align_ < 0 || align_ >= 4096) return -1;
        double best = 0;
        for (int r = 0; r < reps; r++) {
            next_ = 0;
            double t0 = now();
            for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, reader, NULL);
            for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
            double gbs = bytes / (now() - t0) / 1e9;
            if (gbs > best) best = gbs;
        }
        printf("source at %ld, destination at %4ld mod 4096: %6.2f GB/s (%d files, %.0f bytes, %d threads, best of %d)\n",
               src_off, align_, best, nfiles, bytes, threads, reps);
        fflush(stdout);
    }
    return 0;
}

/* -l LIST THREADS REPS ALIGN...: the listed files, each whole, packed one after
 * another in the buffer on 4 KiB boundaries (+ ALIGN) */
static int list_main(int argc, char **argv) {
    FILE *lf = fopen(argv[2], "r");
    if (!lf) { perror(argv[2]); return 1; }
    int threads = atoi(argv[3]), reps = atoi(argv[4]), cap = 0;
    if (threads <= 0 || threads > 256 || reps <= 0) return 2;
    char path[4096];
    size_t total = 0;
    while (fgets(path, sizeof path, lf)) {
        path[strcspn(path, "\n")] = 0;
        if (!*path) continue;
        int fd = open(path, O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) { perror(path); return 1; }
        if (nfiles == cap) {
            cap = cap ? 2 * cap : 1024;
            fds = realloc(fds, cap * sizeof *fds); lens = realloc(lens, cap * sizeof *lens); slots = realloc(slots, cap * sizeof *slots);
            if (!fds || !lens || !slots) { perror("realloc"); return 1; }
        }
        fds[nfiles] = fd; lens[nfiles] = st.st_size; slots[nfiles] = (long long)total;
        total += ((size_t)st.st_size + 4096 + 4095) / 4096 * 4096;
        nfiles++;
    }
    fclose(lf);
    if (!nfiles) return 2;
    double bytes = 0;
    for (int i = 0; i < nfiles; i++) bytes += (double)lens[i];
    if (stage(total) < 0) return 1;
    return sweep(argc - 5, argv + 5, threads, reps, bytes) < 0 ? 2 : 0;
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "-l") == 0) return list_main(argc, argv);
    if (argc < 7) {
        fprintf(stderr, "usage: %s DIR N LEN THREADS REPS ALIGN... | -l LIST THREADS REPS ALIGN...\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    const char *so = getenv("SRC_OFF");   /* each file's bytes start SRC_OFF into it (a chunk inside an HDF5 file) */
    src_off = so ? atol(so) : 0;
    nfiles = atoi(argv[2]); len = atoll(argv[3]);
    int threads = atoi(argv[4]), reps = atoi(argv[5]);
    if (nfiles <= 0 || len <= 0 || threads <= 0 || threads > 256 || reps <= 0) return 2;
    slotsz = (len + 4096 + 4095) / 4096 * 4096;   /* room for any ALIGN < 4096 beyond a page-aligned start */
    fds = calloc(nfiles, sizeof *fds);
    uint8_t *data = malloc(len);
    if (!fds || !data) { perror("malloc"); return 1; }
    for (long long k = 0; k < len; k++) data[k] = (uint8_t)(k * 2654435761u >> 13);
    char path[4096];
    for (int i = 0; i < nfiles; i++) {
        snprintf(path, sizeof path, "%s/f%05d", dir, i);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || pwrite(fd, data, len, src_off) != len) { perror(path); return 1; }
        fds[i] = fd;
    }
    size_t total = (size_t)nfiles * slotsz;
    if (stage(total) < 0) return 1;
    if (sweep(argc - 6, argv + 6, threads, reps, (double)nfiles * len) < 0) return 2;
    for (int i = 0; i < nfiles; i++) {
        snprintf(path, sizeof path, "%s/f%05d", dir, i);
        close(fds[i]);
        unlink(path);
    }
    return 0;
}
