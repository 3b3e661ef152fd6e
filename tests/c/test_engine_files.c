/* test_engine_files.c — files that change under ferry: the open-file cache
 * reads the new file after a replace (rename), a rewrite or a truncation
 * between batches and fails clearly after a delete, never returns stale
 * bytes; it stays within its descriptor bound over hundreds of files; and a
 * ferry_file's O_DIRECT descriptor is the file first opened even when a
 * rename replaced its path in between. */
#include "check.h"
#include "engine/engine.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir_[256];

static void put_file(const char *path, uint8_t seed, size_t n) {
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(seed + i * 7);
    if (write(fd, b, n) != (ssize_t)n) fprintf(stderr, "short write\n");
    close(fd);
    free(b);
}

static int has_seed(const uint8_t *p, uint8_t seed, size_t off, size_t n) {
    for (size_t i = 0; i < n; i++) if (p[i] != (uint8_t)(seed + (off + i) * 7)) return 0;
    return 1;
}

static ferry_ctx *make_ctx(int threads, ferry_direct direct) {
    ferry_config c;
    ferry_config_init(&c);
    c.threads = threads;
    c.direct = direct;
    c.no_env = 1;
    ferry_ctx *ctx = NULL;
    return ferry_ctx_create(&ctx, &c) == 0 ? ctx : NULL;
}

/* Read n bytes at off of `path` by path (the cache), in one job of several
 * extents so that more than one worker may open it. */
static int64_t read_by_path(ferry_ctx *ctx, const char *path, uint8_t *dst, uint64_t off, uint64_t n) {
    ferry_plan *p;
    ferry_plan_create(&p);
    for (uint64_t k = 0; k < 4; k++) {
        ferry_extent e;
        memset(&e, 0, sizeof e);
        e.kind = FERRY_EXTENT_READ;
        e.path = path;
        e.offset = off + k * n / 4;
        e.length = e.decoded_size = (k == 3 ? n - 3 * (n / 4) : n / 4);
        e.dst = ferry_host_buf(dst, n);
        e.dst_offset = k * (n / 4);
        ferry_plan_add(p, &e);
    }
    int64_t r = ferry_run(ctx, p, NULL);
    ferry_plan_destroy(p);
    return r;
}

static void test_replaced_between_batches(void) {
    ferry_ctx *ctx = make_ctx(4, FERRY_DIRECT_AUTO);
    char path[512], tmp[600];
    snprintf(path, sizeof path, "%s/sample.bin", dir_);
    snprintf(tmp, sizeof tmp, "%s/sample.bin.tmp", dir_);
    const size_t n = 200000;
    uint8_t *buf = malloc(n);
    put_file(path, 1, n);
    CHECK_EQ_I(read_by_path(ctx, path, buf, 0, n), (int64_t)n);
    CHECK(has_seed(buf, 1, 0, n));
    uint64_t opens = ctx->files.opens;
    CHECK_EQ_I(read_by_path(ctx, path, buf, 0, n), (int64_t)n);   /* unchanged: no new open */
    CHECK_EQ_I(ctx->files.opens, opens);
    /* replaced by rename with a file of the same size and the same mtime:
     * only the inode tells them apart */
    struct stat st;
    stat(path, &st);
    put_file(tmp, 2, n);
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    utimensat(AT_FDCWD, tmp, times, 0);
    CHECK_EQ_I(rename(tmp, path), 0);
    memset(buf, 0, n);
    CHECK_EQ_I(read_by_path(ctx, path, buf, 0, n), (int64_t)n);
    CHECK(has_seed(buf, 2, 0, n));
    /* rewritten in place (same inode, new mtime) */
    usleep(10000);
    put_file(path, 3, n);
    CHECK_EQ_I(read_by_path(ctx, path, buf, 0, n), (int64_t)n);
    CHECK(has_seed(buf, 3, 0, n));
    /* truncated: the bytes past the new end are an error naming the file */
    CHECK_EQ_I(truncate(path, n / 2), 0);
    CHECK_EQ_I(read_by_path(ctx, path, buf, 0, n), FERRY_ESHORT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "sample.bin");
    CHECK_EQ_I(read_by_path(ctx, path, buf, 0, n / 2), (int64_t)(n / 2));
    CHECK(has_seed(buf, 3, 0, n / 2));
    /* deleted: ENOENT naming the file, not the old bytes */
    unlink(path);
    CHECK_EQ_I(read_by_path(ctx, path, buf, 0, n / 2), -ENOENT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "sample.bin");
    /* and back */
    put_file(path, 4, n);
    CHECK_EQ_I(read_by_path(ctx, path, buf, 0, n), (int64_t)n);
    CHECK(has_seed(buf, 4, 0, n));
    free(buf);
    ferry_ctx_destroy(ctx);
}

/* Hundreds of files by path with a descriptor limit of 128: the cache keeps
 * at most its bound open and every byte is right, batch after batch. */
static void test_many_files_bounded(void) {
    struct rlimit old, rl;
    getrlimit(RLIMIT_NOFILE, &old);
    rl = old;
    rl.rlim_cur = 128;
    CHECK_EQ_I(setrlimit(RLIMIT_NOFILE, &rl), 0);
    ferry_ctx *ctx = make_ctx(4, FERRY_DIRECT_AUTO);
    CHECK(ctx && ctx->files.cap <= 32);
    enum { NF = 300, REC = 5000 };
    static char paths[NF][512];
    for (int i = 0; i < NF; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/many-%03d.bin", dir_, i);
        put_file(paths[i], (uint8_t)i, REC);
    }
    uint8_t *buf = malloc((size_t)NF * REC);
    for (int round = 0; round < 3; round++) {
        ferry_plan *p;
        ferry_plan_create(&p);
        for (int i = 0; i < NF; i++) {
            int k = (i * 37 + round * 11) % NF;   /* another order each batch */
            ferry_extent e;
            memset(&e, 0, sizeof e);
            e.kind = FERRY_EXTENT_READ;
            e.path = paths[k];
            e.length = e.decoded_size = REC;
            e.dst = ferry_host_buf(buf, (size_t)NF * REC);
            e.dst_offset = (uint64_t)i * REC;
            ferry_plan_add(p, &e);
        }
        memset(buf, 0, (size_t)NF * REC);
        int64_t r = ferry_run(ctx, p, NULL);
        CHECK_EQ_I(r, (int64_t)NF * REC);
        if (r < 0) fprintf(stderr, "  %s\n", ferry_errmsg(ctx));
        int ok = 1;
        for (int i = 0; i < NF && ok; i++) ok = has_seed(buf + (size_t)i * REC, (uint8_t)((i * 37 + round * 11) % NF), 0, REC);
        CHECK(ok);
        CHECK(ctx->files.count <= ctx->files.cap);
        ferry_plan_destroy(p);
    }
    free(buf);
    ferry_ctx_destroy(ctx);
    setrlimit(RLIMIT_NOFILE, &old);
    for (int i = 0; i < NF; i++) unlink(paths[i]);
}

/* ferry_file_open, then another file renamed over the path, then reads that
 * open O_DIRECT descriptors: they are the first file's bytes. */
static void test_direct_reopen_same_inode(void) {
    ferry_ctx *ctx = make_ctx(2, FERRY_DIRECT_ON);
    char path[512], tmp[600];
    snprintf(path, sizeof path, "%s/ckpt.bin", dir_);
    snprintf(tmp, sizeof tmp, "%s/ckpt.bin.tmp", dir_);
    const size_t n = 4 << 20;
    put_file(path, 10, n);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx, path, FERRY_READ, &f), 0);
    put_file(tmp, 20, n);
    CHECK_EQ_I(rename(tmp, path), 0);
    uint8_t *buf;
    CHECK_EQ_I(posix_memalign((void **)&buf, 4096, n), 0);
    ferry_stats_reset(ctx);
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(buf, n), 0, n, 0), (int64_t)n);
    CHECK(has_seed(buf, 10, 0, n));
    /* the O_DIRECT descriptor, where the file system has one, is the same inode */
    int dfd = ferry_file_direct_fd(f);
    if (dfd >= 0) {
        struct stat a, b;
        fstat(dfd, &a);
        fstat(f->fd, &b);
        CHECK(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
        ferry_stats st;
        ferry_stats_get(ctx, &st);
        CHECK(st.direct_bytes > 0);
    } else {
        printf("  (this file system refuses O_DIRECT: buffered reads checked)\n");
    }
    free(buf);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}

/* One read of n bytes of `path` as a FERRY_EXTENT_NOFOLLOW extent under root. */
static int64_t read_nofollow(ferry_ctx *ctx, const char *path, const char *root, uint8_t *dst, uint64_t n) {
    ferry_plan *p;
    ferry_plan_create(&p);
    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.kind = FERRY_EXTENT_READ;
    e.path = path;
    e.flags = FERRY_EXTENT_NOFOLLOW;
    e.root = root;
    e.length = e.decoded_size = n;
    e.dst = ferry_host_buf(dst, n);
    int64_t r = ferry_plan_add(p, &e);
    if (r == 0) r = ferry_run(ctx, p, NULL);
    ferry_plan_destroy(p);
    return r;
}

/* FERRY_EXTENT_NOFOLLOW (a store's chunk files, issue 16.1 without a stat per
 * chunk at plan time): a regular file is read; a symlink only when it
 * resolves under root, else -EACCES naming the file (-ELOOP without a root);
 * a dangling link is absent; a FIFO is refused at once (it would block an
 * open); an entry the cache opened following links does not serve it. */
static void test_nofollow(void) {
    ferry_ctx *ctx = make_ctx(2, FERRY_DIRECT_OFF);
    CHECK(ctx != NULL);
    if (!ctx) return;
    char top[PATH_MAX], store[PATH_MAX + 8], a[PATH_MAX + 24], in[PATH_MAX + 24], out[PATH_MAX + 24],
        outside[PATH_MAX + 24], dangling[PATH_MAX + 24], fifo[PATH_MAX + 24], twice[PATH_MAX + 24];
    CHECK(realpath(dir_, top) != NULL);
    snprintf(store, sizeof store, "%s/store", top);
    mkdir(store, 0755);
    snprintf(a, sizeof a, "%s/a", store);
    snprintf(in, sizeof in, "%s/in", store);
    snprintf(twice, sizeof twice, "%s/twice", store);
    snprintf(out, sizeof out, "%s/out", store);
    snprintf(outside, sizeof outside, "%s/outside", top);
    snprintf(dangling, sizeof dangling, "%s/dangling", store);
    snprintf(fifo, sizeof fifo, "%s/fifo", store);
    put_file(a, 1, 64);
    put_file(outside, 9, 64);
    CHECK(symlink("a", in) == 0);
    CHECK(symlink("in", twice) == 0);
    CHECK(symlink(outside, out) == 0);
    CHECK(symlink("nothere", dangling) == 0);
    CHECK(mkfifo(fifo, 0644) == 0);
    uint8_t buf[64];
    memset(buf, 0, sizeof buf);
    CHECK_EQ_I(read_nofollow(ctx, a, store, buf, 64), 64);
    CHECK(has_seed(buf, 1, 0, 64));
    memset(buf, 0, sizeof buf);
    CHECK_EQ_I(read_nofollow(ctx, in, store, buf, 64), 64);   /* a link inside: followed */
    CHECK(has_seed(buf, 1, 0, 64));
    memset(buf, 0, sizeof buf);
    CHECK_EQ_I(read_nofollow(ctx, twice, store, buf, 64), 64);   /* a link to a link, inside */
    CHECK(has_seed(buf, 1, 0, 64));
    memset(buf, 0, sizeof buf);
    CHECK_EQ_I(read_nofollow(ctx, out, store, buf, 64), -EACCES);   /* a link leading out */
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), out);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "outside the store");
    CHECK(!has_seed(buf, 9, 0, 64));
    CHECK_EQ_I(read_nofollow(ctx, in, NULL, buf, 64), -ELOOP);   /* no root: no link at all */
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "is a symlink");
    CHECK_EQ_I(read_nofollow(ctx, dangling, store, buf, 64), -ENOENT);
    CHECK_EQ_I(read_nofollow(ctx, fifo, store, buf, 64), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "not a regular file");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), fifo);
    /* a plain read by path follows the link (its caller's choice) and caches
     * the open file; a NOFOLLOW read of the same path then opens it again */
    memset(buf, 0, sizeof buf);
    CHECK_EQ_I(read_by_path(ctx, out, buf, 0, 64), 64);
    CHECK(has_seed(buf, 9, 0, 64));
    memset(buf, 0, sizeof buf);
    CHECK_EQ_I(read_nofollow(ctx, out, store, buf, 64), -EACCES);
    CHECK(!has_seed(buf, 9, 0, 64));
    /* and a link followed under one root does not serve a read under another */
    CHECK_EQ_I(read_nofollow(ctx, out, top, buf, 64), 64);
    CHECK_EQ_I(read_nofollow(ctx, out, store, buf, 64), -EACCES);
    /* the plan refuses what it cannot honour */
    ferry_plan *p;
    ferry_plan_create(&p);
    ferry_extent e;
    memset(&e, 0, sizeof e);
    e.kind = FERRY_EXTENT_READ;
    e.path = a;
    e.flags = FERRY_EXTENT_NOFOLLOW;
    e.root = "relative/root";
    e.length = e.decoded_size = 64;
    e.dst = ferry_host_buf(buf, 64);
    CHECK_EQ_I(ferry_plan_add(p, &e), FERRY_EINVAL);
    ferry_file *f = NULL;
    CHECK_EQ_I(ferry_file_open(ctx, a, FERRY_READ, &f), 0);
    e.root = store;
    e.file = f;
    CHECK_EQ_I(ferry_plan_add(p, &e), FERRY_EINVAL);
    ferry_file_close(f);
    ferry_plan_destroy(p);
    ferry_ctx_destroy(ctx);
}

static _Atomic int fstats_;
static int counting_fstat(int fd, struct stat *st) { fstats_++; return fstat(fd, st); }

/* A chunk file opened through the open-file cache costs one fstat (the
 * open's own: file type, inode, and the identity the cache checks later),
 * not two; a later job checks it with one stat of the path and no fstat. */
static void test_one_fstat_per_open(void) {
    ferry_ctx *ctx = make_ctx(2, FERRY_DIRECT_OFF);
    enum { N = 24 };
    const size_t n = 4096;
    char path[N][512];
    uint8_t *buf = malloc(n);
    for (int i = 0; i < N; i++) {
        snprintf(path[i], sizeof path[i], "%s/chunk%d", dir_, i);
        put_file(path[i], (uint8_t)i, n);
    }
    CHECK_EQ_I(ferry_test_set_syscall("fstat", (void *)counting_fstat), 0);
    fstats_ = 0;
    for (int i = 0; i < N; i++) CHECK_EQ_I(read_by_path(ctx, path[i], buf, 0, n), (int64_t)n);
    CHECK_EQ_I(fstats_, N);
    fstats_ = 0;
    for (int i = 0; i < N; i++) {
        CHECK_EQ_I(read_by_path(ctx, path[i], buf, 0, n), (int64_t)n);
        CHECK(has_seed(buf, (uint8_t)i, 0, n));
    }
    CHECK_EQ_I(fstats_, 0);
    ferry_test_set_syscall(NULL, NULL);
    /* the identity kept is still the file's: a rewrite in place is seen */
    usleep(10000);
    put_file(path[3], 99, n + 8);
    CHECK_EQ_I(read_by_path(ctx, path[3], buf, 0, n), (int64_t)n);
    CHECK(has_seed(buf, 99, 0, n));
    free(buf);
    ferry_ctx_destroy(ctx);
}

int main(void) {
    snprintf(dir_, sizeof dir_, "%s/ferry-files-XXXXXX", getenv("FERRY_TEST_DIR") ? getenv("FERRY_TEST_DIR") : ".");
    if (!mkdtemp(dir_)) return 1;
    RUN(test_replaced_between_batches);
    RUN(test_many_files_bounded);
    RUN(test_direct_reopen_same_inode);
    RUN(test_nofollow);
    RUN(test_one_fstat_per_open);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir_);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir_);
    return check_summary();
}
