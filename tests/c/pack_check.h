/* pack_check.h — plans of many small records for the packed-staging tests
 * (tests/c/test_engine_pack.c on the host, tests/gpu/test_gpu_engine.c into
 * device memory): several files, odd sizes and offsets, duplicated and
 * overlapping records, runs adjacent in a file, destinations in order, in a
 * shuffled order with gaps, and adjacent in memory but not in the file. */
#ifndef FERRY_TEST_PACK_CHECK_H
#define FERRY_TEST_PACK_CHECK_H
#include "ferry.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PK_FILES 5
static uint8_t pk_byte(int file, uint64_t i) { return (uint8_t)(((i + 131u * (uint64_t)file) * 2654435761u) >> 11); }
static uint64_t pk_rng(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

typedef struct pk_rec { int file; uint64_t off, len, dst; } pk_rec;
typedef struct pk_set {
    char path[PK_FILES][600];
    uint64_t fsize[PK_FILES];
    pk_rec *r;
    size_t n;
    uint64_t dst_size;   /* bytes the destination needs (gaps included) */
} pk_set;

static void pk_write_files(pk_set *s, const char *dir) {
    for (int f = 0; f < PK_FILES; f++) {
        snprintf(s->path[f], sizeof s->path[f], "%s/rec%d.bin", dir, f);
        s->fsize[f] = 300000 + 77777u * (uint64_t)f;
        int fd = open(s->path[f], O_CREAT | O_TRUNC | O_WRONLY, 0644);
        uint8_t *b = malloc(s->fsize[f]);
        for (uint64_t i = 0; i < s->fsize[f]; i++) b[i] = pk_byte(f, i);
        if (write(fd, b, s->fsize[f]) != (ssize_t)s->fsize[f]) fprintf(stderr, "short write\n");
        close(fd);
        free(b);
    }
}

/* mode 0: destinations in record order, back to back (one run per buffer);
 * 1: shuffled order with gaps; 2: runs adjacent in the file going to
 * non-adjacent places (preadv / many runs). Sizes from 1 byte to max_len. */
static void pk_make(pk_set *s, size_t n, int mode, uint64_t max_len, uint64_t seed) {
    s->r = calloc(n, sizeof *s->r);
    s->n = n;
    uint64_t st = seed * 2 + 1;
    for (size_t i = 0; i < n; i++) {
        pk_rec *r = &s->r[i];
        uint64_t k = pk_rng(&st) % 100;
        r->len = k < 10 ? 1 + pk_rng(&st) % 16 : k < 15 ? 4095 + pk_rng(&st) % 3 : 1 + pk_rng(&st) % max_len;
        if (i > 0 && k < 8) { *r = s->r[i - 1]; continue; }                     /* duplicate */
        if (i > 0 && k >= 8 && k < 14 && s->r[i - 1].len > 2) {                   /* overlapping */
            *r = s->r[i - 1];
            r->off += r->len / 2;
            r->len = r->len / 2 + 3;
        } else if (i > 0 && (mode == 2 ? k < 70 : k < 30)) {                      /* adjacent in the file */
            r->file = s->r[i - 1].file;
            r->off = s->r[i - 1].off + s->r[i - 1].len;
        } else {
            r->file = (int)(pk_rng(&st) % PK_FILES);
            r->off = pk_rng(&st) % s->fsize[r->file];
        }
        if (r->off + r->len > s->fsize[r->file]) r->off = s->fsize[r->file] - r->len;
    }
    /* destinations */
    size_t *order = malloc(n * sizeof *order);
    for (size_t i = 0; i < n; i++) order[i] = i;
    if (mode != 0)
        for (size_t i = n - 1; i > 0; i--) { size_t k = pk_rng(&st) % (i + 1), t = order[i]; order[i] = order[k]; order[k] = t; }
    uint64_t pos = 3;   /* an odd start */
    for (size_t i = 0; i < n; i++) {
        pk_rec *r = &s->r[order[i]];
        r->dst = pos;
        pos += r->len + (mode == 1 ? pk_rng(&st) % 9 : 0);
    }
    s->dst_size = pos + 5;
    free(order);
}

/* Add the records to plan: every third by path, the rest through files[]. */
static int pk_plan(const pk_set *s, ferry_plan *p, ferry_file **files, ferry_buf dst) {
    for (size_t i = 0; i < s->n; i++) {
        const pk_rec *r = &s->r[i];
        ferry_extent e;
        memset(&e, 0, sizeof e);
        e.kind = FERRY_EXTENT_READ;
        if (i % 3 == 2) e.path = s->path[r->file]; else e.file = files[r->file];
        e.offset = r->off;
        e.length = e.decoded_size = r->len;
        e.dst = dst;
        e.dst_offset = r->dst;
        int rc = ferry_plan_add(p, &e);
        if (rc < 0) return rc;
    }
    return 0;
}

/* The records as FERRY_EXTENT_NOFOLLOW reads by path under root (a store's
 * chunk files): they pack like any (issue 13's review, round 2). */
static int pk_plan_nofollow(const pk_set *s, ferry_plan *p, const char *root, ferry_buf dst) {
    for (size_t i = 0; i < s->n; i++) {
        const pk_rec *r = &s->r[i];
        ferry_extent e;
        memset(&e, 0, sizeof e);
        e.kind = FERRY_EXTENT_READ;
        e.path = s->path[r->file];
        e.flags = FERRY_EXTENT_NOFOLLOW;
        e.root = root;
        e.offset = r->off;
        e.length = e.decoded_size = r->len;
        e.dst = dst;
        e.dst_offset = r->dst;
        int rc = ferry_plan_add(p, &e);
        if (rc < 0) return rc;
    }
    return 0;
}

/* 1 when host memory `got` (dst_size bytes, 0xEE before the read) holds every
 * record at its place and 0xEE elsewhere. */
static int pk_verify(const pk_set *s, const uint8_t *got) {
    uint8_t *want = malloc(s->dst_size), *mark = calloc(s->dst_size, 1);
    memset(want, 0xEE, s->dst_size);
    for (size_t i = 0; i < s->n; i++)
        for (uint64_t k = 0; k < s->r[i].len; k++) want[s->r[i].dst + k] = pk_byte(s->r[i].file, s->r[i].off + k);
    int ok = memcmp(want, got, s->dst_size) == 0;
    if (!ok)
        for (uint64_t i = 0; i < s->dst_size; i++)
            if (want[i] != got[i]) { fprintf(stderr, "  first difference at destination byte %llu\n", (unsigned long long)i); break; }
    free(want);
    free(mark);
    return ok;
}

static uint64_t pk_bytes(const pk_set *s) {
    uint64_t t = 0;
    for (size_t i = 0; i < s->n; i++) t += s->r[i].len;
    return t;
}
#endif
