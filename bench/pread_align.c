/* Page cache -> memory at a chosen destination alignment: is a pread slower
 * when its destination is not cache-line aligned? The question behind the
 * GPU decode's packed staging (gpudecode.c puts each compressed chunk 8-byte
 * aligned in one pinned buffer, where the uncompressed path reads page-aligned):
 * the kernel's copy out of the page cache (rep movsb) splits every store
 * across two cache lines when the destination is off a 64-byte line.
 * No ferry code involved. Writes N files of LEN bytes in DIR (page cache warm
 * from the writes), then T threads pread every file whole into one shared
 * buffer at slots spaced like packed chunks, each slot's start at ALIGN mod
 * 4096, for each ALIGN given; best of REPS passes; prints GB/s (1e9).
 * SRC_OFF=B in the environment: the bytes read start B bytes into each file.
 *   cc -O2 -pthread bench/pread_align.c -o pread_align
 *   ./pread_align DIR N LEN T REPS ALIGN...   (e.g. /tmp/pa 4096 790000 16 5 0 8 64 4096) */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static int nfiles, *fds;
static long long len, slotsz;
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
        uint8_t *dst = buf + (size_t)i * slotsz + align_;
        if (pread(fds[i], dst, len, src_off) != len) { perror("pread"); exit(1); }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s DIR N LEN THREADS REPS ALIGN...\n", argv[0]);
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
    for (long long k = 0; k < len; k++) data[k] = (uint8_t)(k * 2654435761u >> 13);
    char path[4096];
    for (int i = 0; i < nfiles; i++) {
        snprintf(path, sizeof path, "%s/f%05d", dir, i);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || pwrite(fd, data, len, src_off) != len) { perror(path); return 1; }
        fds[i] = fd;
    }
    size_t total = (size_t)nfiles * slotsz;
    buf = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (buf == MAP_FAILED) { perror("mmap"); return 1; }
    mlock(buf, total);   /* like pinned staging: resident, no faults while timed (best effort) */
    pthread_t t[256];
    for (int a = 6; a < argc; a++) {
        align_ = atol(argv[a]);
        if (align_ < 0 || align_ >= 4096) return 2;
        double best = 0;
        for (int r = 0; r < reps; r++) {
            next_ = 0;
            double t0 = now();
            for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, reader, NULL);
            for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
            double gbs = (double)nfiles * len / (now() - t0) / 1e9;
            if (gbs > best) best = gbs;
        }
        printf("source at %ld, destination at %4ld mod 4096: %6.2f GB/s (%d files of %lld bytes, %d threads, best of %d)\n",
               src_off, align_, best, nfiles, len, threads, reps);
        fflush(stdout);
    }
    for (int i = 0; i < nfiles; i++) {
        snprintf(path, sizeof path, "%s/f%05d", dir, i);
        close(fds[i]);
        unlink(path);
    }
    return 0;
}
