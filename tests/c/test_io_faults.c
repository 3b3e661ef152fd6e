/* test_io_faults.c — the system calls under ferry fail on purpose (through
 * ferry_test_set_syscall): interrupted and short reads are retried and give
 * the right bytes, on the data path (pread, preadv of packed records) and the
 * metadata path (a dataset's header); EIO, ENOSPC, a failing fsync or open
 * are errors that name the file and the byte; huge-page advice refused is no
 * error; FIFOs are refused unless FERRY_ANY_FILE asks. */
#include "check.h"
#include "ferry.h"
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

static char dir_[256], path_[600];
static const size_t fsize_ = (3 << 20) + 12345;

static uint8_t byte_at(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

static ferry_ctx *make_ctx(int threads) {
    ferry_config c;
    ferry_config_init(&c);
    c.threads = threads;
    c.no_env = 1;
    c.direct = FERRY_DIRECT_OFF;
    c.task_size = 1 << 20;
    ferry_ctx *ctx = NULL;
    return ferry_ctx_create(&ctx, &c) == 0 ? ctx : NULL;
}

/* ---- faulty system calls ---------------------------------------------------- */
static _Atomic long calls_, eintrs_;
static _Atomic uint64_t fail_from_ = UINT64_MAX;   /* EIO for reads reaching this offset */
static _Atomic int fail_errno_;

static ssize_t short_eintr_pread(int fd, void *buf, size_t n, off_t off) {
    long c = atomic_fetch_add(&calls_, 1);
    if (c % 3 == 1) { atomic_fetch_add(&eintrs_, 1); errno = EINTR; return -1; }
    return pread(fd, buf, n > 777 ? 777 : n, off);   /* short: at most 777 bytes a call */
}
static ssize_t short_eintr_preadv(int fd, const struct iovec *iov, int n, off_t off) {
    long c = atomic_fetch_add(&calls_, 1);
    if (c % 3 == 1) { atomic_fetch_add(&eintrs_, 1); errno = EINTR; return -1; }
    /* only the first vector, and at most 500 bytes of it */
    size_t len = iov[0].iov_len > 500 ? 500 : iov[0].iov_len;
    return n > 0 ? pread(fd, iov[0].iov_base, len, off) : 0;
}
static ssize_t eio_pread(int fd, void *buf, size_t n, off_t off) {
    if ((uint64_t)off + n > atomic_load(&fail_from_)) { errno = atomic_load(&fail_errno_); return -1; }
    return pread(fd, buf, n, off);
}
static ssize_t eio_preadv(int fd, const struct iovec *iov, int n, off_t off) {
    if ((uint64_t)off + iov[0].iov_len > atomic_load(&fail_from_)) { errno = atomic_load(&fail_errno_); return -1; }
    return preadv(fd, iov, n, off);
}
static ssize_t enospc_pwrite(int fd, const void *buf, size_t n, off_t off) {
    if ((uint64_t)off + n > (1u << 20)) { errno = ENOSPC; return -1; }
    return pwrite(fd, buf, n, off);
}
static int eio_fsync(int fd) { (void)fd; errno = EIO; return -1; }
static int emfile_open(const char *p, int flags, mode_t mode) { (void)p; (void)flags; (void)mode; errno = EMFILE; return -1; }
static _Atomic long madvise_calls_;
static int no_thp_madvise(void *p, size_t n, int advice) {
    (void)p; (void)n; (void)advice;
    atomic_fetch_add(&madvise_calls_, 1);
    errno = EINVAL;   /* a kernel without transparent huge pages */
    return -1;
}

/* ---- tests -------------------------------------------------------------------- */
static int check_pattern(const uint8_t *p, uint64_t off, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) if (p[i] != byte_at(off + i)) return 0;
    return 1;
}

static void test_short_and_interrupted_reads_retried(void) {
    ferry_ctx *ctx = make_ctx(4);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx, path_, FERRY_READ, &f), 0);
    uint8_t *buf = malloc(fsize_);
    CHECK_EQ_I(ferry_test_set_syscall("pread", (void *)short_eintr_pread), 0);
    CHECK_EQ_I(ferry_test_set_syscall("preadv", (void *)short_eintr_preadv), 0);
    atomic_store(&eintrs_, 0);
    /* one large read cut into tasks */
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(buf, fsize_), 5, fsize_ - 5, 0), (int64_t)(fsize_ - 5));
    CHECK(check_pattern(buf, 5, fsize_ - 5));
    /* packed records, adjacent in the file (preadv) and not */
    ferry_plan *p;
    ferry_plan_create(&p);
    memset(buf, 0, fsize_);
    for (int i = 0; i < 400; i++) {
        uint64_t off = i < 200 ? (uint64_t)i * 1000 : 1000000 + (uint64_t)(i * 7919) % 2000000;
        ferry_plan_read(p, f, off, 1000, ferry_host_buf(buf, fsize_), (uint64_t)((i * 37) % 400) * 1000);
    }
    CHECK_EQ_I(ferry_run(ctx, p, NULL), 400 * 1000);
    int ok = 1;
    for (int i = 0; i < 400 && ok; i++) {
        uint64_t off = i < 200 ? (uint64_t)i * 1000 : 1000000 + (uint64_t)(i * 7919) % 2000000;
        ok = check_pattern(buf + (uint64_t)((i * 37) % 400) * 1000, off, 1000);
    }
    CHECK(ok);
    ferry_plan_destroy(p);
    /* the metadata path: a dataset's header read through the same calls */
    char npy[700];
    snprintf(npy, sizeof npy, "%s/a.npy", dir_);
    int fd = open(npy, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    const char hdr[] = "\x93NUMPY\x01\x00\x76\x00{'descr': '<u2', 'fortran_order': False, 'shape': (3, 5), }";
    char full[128];
    memset(full, ' ', sizeof full);
    memcpy(full, hdr, sizeof hdr - 1);
    full[127] = '\n';
    uint16_t data[15];
    for (int i = 0; i < 15; i++) data[i] = (uint16_t)(i * 1001);
    CHECK(write(fd, full, 128) == 128 && write(fd, data, 30) == 30);
    close(fd);
    ferry_dataset *ds;
    CHECK_EQ_I(ferry_dataset_open(ctx, npy, NULL, &ds), 0);
    if (ds) {
        ferry_var_info v;
        ferry_dataset_var(ds, 0, &v);
        CHECK_EQ_I(v.ndim, 2);
        CHECK_EQ_I(v.shape[1], 5);
        ferry_dataset_close(ds);
    }
    CHECK(atomic_load(&eintrs_) > 0);
    ferry_test_set_syscall(NULL, NULL);
    free(buf);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}

static void *no_mmap(void *addr, size_t n, int prot, int flags, int fd, off_t off) {
    (void)addr; (void)n; (void)prot; (void)flags; (void)fd; (void)off;
    errno = ENODEV;
    return MAP_FAILED;
}

static void test_eio_names_file_and_byte(void) {
    ferry_ctx *ctx = make_ctx(4);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx, path_, FERRY_READ, &f), 0);
    uint8_t *buf = malloc(fsize_);
    ferry_test_set_syscall("pread", (void *)eio_pread);
    ferry_test_set_syscall("preadv", (void *)eio_preadv);
    ferry_test_set_syscall("mmap", (void *)no_mmap);   /* warm small records would be copied from a mapping */
    atomic_store(&fail_errno_, EIO);
    atomic_store(&fail_from_, 2u << 20);
    int64_t r = ferry_pread(f, ferry_host_buf(buf, fsize_), 0, fsize_, 0);
    CHECK_EQ_I(r, -EIO);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), path_);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "byte ");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "Input/output error");
    /* packed records: the record that failed is named by its offset */
    ferry_plan *p;
    ferry_plan_create(&p);
    for (int i = 0; i < 100; i++) ferry_plan_read(p, f, (uint64_t)i * 30000, 100, ferry_host_buf(buf, fsize_), (uint64_t)i * 100);
    CHECK_EQ_I(ferry_run(ctx, p, NULL), -EIO);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), path_);
    char at[64];
    /* the first record reaching 2 MiB: 2097152 / 30000 -> record 70 at 2100000 */
    snprintf(at, sizeof at, "byte %d", 70 * 30000);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), at);
    ferry_plan_destroy(p);
    /* metadata: a header read that fails is an error naming the file */
    atomic_store(&fail_from_, 0);
    ferry_dataset *ds = NULL;
    int rc = ferry_dataset_open(ctx, path_, NULL, &ds);
    CHECK(rc < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), path_);
    ferry_test_set_syscall(NULL, NULL);
    /* after the faults: everything reads again */
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(buf, fsize_), 0, fsize_, 0), (int64_t)fsize_);
    CHECK(check_pattern(buf, 0, fsize_));
    free(buf);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}

static void test_enospc_and_fsync(void) {
    ferry_ctx *ctx = make_ctx(2);
    char out[700];
    snprintf(out, sizeof out, "%s/out.bin", dir_);
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx, out, FERRY_WRITE | FERRY_CREATE | FERRY_TRUNC, &f), 0);
    size_t n = 3 << 20;
    uint8_t *src = malloc(n);
    memset(src, 7, n);
    ferry_test_set_syscall("pwrite", (void *)enospc_pwrite);
    CHECK_EQ_I(ferry_pwrite(f, ferry_host_buf(src, n), 0, n, 0), -ENOSPC);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "out.bin");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "No space left on device");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "byte ");
    ferry_test_set_syscall("pwrite", NULL);
    ferry_test_set_syscall("fsync", (void *)eio_fsync);
    CHECK_EQ_I(ferry_pwrite(f, ferry_host_buf(src, n), 0, n, FERRY_SYNC), -EIO);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "out.bin: fsync");
    CHECK_EQ_I(ferry_file_sync(f), -EIO);
    ferry_test_set_syscall("fsync", NULL);
    CHECK_EQ_I(ferry_pwrite(f, ferry_host_buf(src, n), 0, n, FERRY_SYNC), (int64_t)n);
    ferry_test_set_syscall("open", (void *)emfile_open);
    ferry_file *g = NULL;
    CHECK_EQ_I(ferry_file_open(ctx, out, FERRY_READ, &g), -EMFILE);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "out.bin: cannot open");
    ferry_test_set_syscall(NULL, NULL);
    CHECK_EQ_I(ferry_test_set_syscall("no_such_call", NULL), FERRY_EINVAL);
    free(src);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}

/* Host memory ferry allocates: 2 MiB-aligned huge-page mappings, and the same
 * memory (only smaller pages) where the kernel refuses the advice. */
static void test_host_alloc_thp_and_fallback(void) {
    ferry_ctx *ctx = make_ctx(2);
    for (int thp = 1; thp >= 0; thp--) {
        atomic_store(&madvise_calls_, 0);
        if (!thp) ferry_test_set_syscall("madvise", (void *)no_thp_madvise);
        static const size_t sizes[] = {1, 4095, (2 << 20) - 1, 2 << 20, (7 << 20) + 3};
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            void *p = NULL;
            CHECK_EQ_I(ferry_host_alloc(ctx, sizes[k], &p), 0);
            CHECK(p != NULL && (uintptr_t)p % 4096 == 0);
            if (sizes[k] >= (2u << 20)) CHECK((uintptr_t)p % (2u << 20) == 0);
            memset(p, 0x5C, sizes[k]);
            ferry_host_free(ctx, p, sizes[k]);
        }
        if (!thp) CHECK_EQ_I(atomic_load(&madvise_calls_), 2);   /* asked, refused, no error */
        ferry_test_set_syscall(NULL, NULL);
    }
    /* ferry fills memory it allocated (the workers touch it first) */
    ferry_file *f;
    CHECK_EQ_I(ferry_file_open(ctx, path_, FERRY_READ, &f), 0);
    void *p;
    CHECK_EQ_I(ferry_host_alloc(ctx, fsize_, &p), 0);
    CHECK_EQ_I(ferry_pread(f, ferry_host_buf(p, fsize_), 0, fsize_, 0), (int64_t)fsize_);
    CHECK(check_pattern(p, 0, fsize_));
    ferry_host_free(ctx, p, fsize_);
    ferry_file_close(f);
    ferry_ctx_destroy(ctx);
}

static void test_fifo_refused(void) {
    ferry_ctx *ctx = make_ctx(2);
    char fifo[700];
    snprintf(fifo, sizeof fifo, "%s/x.npy", dir_);
    CHECK_EQ_I(mkfifo(fifo, 0644), 0);
    ferry_file *f = NULL;
    /* before: open() of a FIFO for reading waited for a writer forever */
    CHECK_EQ_I(ferry_file_open(ctx, fifo, FERRY_READ, &f), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "is a FIFO, not a regular file");
    ferry_dataset *ds = NULL;
    CHECK(ferry_dataset_open(ctx, fifo, NULL, &ds) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "FIFO");
    CHECK_EQ_I(ferry_file_open(ctx, fifo, FERRY_READ | FERRY_ANY_FILE, &f), 0);   /* asked for */
    ferry_file_close(f);
    CHECK_EQ_I(ferry_file_open(ctx, "/dev/null", FERRY_READ, &f), FERRY_EINVAL);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "character device");
    ferry_ctx_destroy(ctx);
}

/* ---- a Zarr plan's chunk lookups --------------------------------------------- */
/* A compressed chunk's size is an lstat at plan time, and so is each chunk
 * directory's check that it stays in the store; with 256 chunks or more they
 * are taken at once on several threads (zarr.c prestat_fill). Either way an
 * lstat that fails with EIO is an error naming the chunk — never an absent
 * chunk planned as a fill, which would hand back fill values for data that
 * exists — and one that says ENOENT is the fill. */
static char fail_sub_[64];                  /* lstat of a path ending in this fails */
static _Atomic int lstat_errno_;
static _Atomic long lstat_calls_;
static int faulty_lstat(const char *path, struct stat *st) {
    atomic_fetch_add(&lstat_calls_, 1);
    size_t n = strlen(path), m = strlen(fail_sub_);
    if (m && n >= m && !strcmp(path + n - m, fail_sub_)) { errno = atomic_load(&lstat_errno_); return -1; }
    return lstat(path, st);
}

static void write_steps_store(const char *store, int steps) {
    char p[900];
    mkdir(store, 0755);
    snprintf(p, sizeof p, "%s/zarr.json", store);
    FILE *f = fopen(p, "w");
    fprintf(f, "{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": [%d, 4], \"data_type\": \"float32\", "
               "\"chunk_grid\": {\"name\": \"regular\", \"configuration\": {\"chunk_shape\": [1, 4]}}, "
               "\"chunk_key_encoding\": {\"name\": \"default\", \"configuration\": {\"separator\": \"/\"}}, "
               "\"fill_value\": 0, \"codecs\": [{\"name\": \"bytes\", \"configuration\": {\"endian\": \"little\"}}, "
               "{\"name\": \"zstd\"}]}", steps);
    fclose(f);
    snprintf(p, sizeof p, "%s/c", store);
    mkdir(p, 0755);
    for (int t = 0; t < steps; t++) {
        snprintf(p, sizeof p, "%s/c/%d", store, t);
        mkdir(p, 0755);
        snprintf(p, sizeof p, "%s/c/%d/0", store, t);
        f = fopen(p, "w");
        fputs("not decoded: the plan needs only the size", f);
        fclose(f);
    }
}

/* The plan of the whole array, and its message: rc. */
static int64_t plan_steps(ferry_ctx *ctx, const char *store, int *extents) {
    ferry_dataset *ds = NULL;
    int64_t rc = ferry_dataset_open(ctx, store, NULL, &ds);
    CHECK_EQ_I(rc, 0);
    if (rc) return rc;
    static float out[1000 * 4];
    ferry_plan *pl;
    ferry_plan_create(&pl);
    rc = ferry_dataset_plan_read(ds, 0, NULL, ferry_host_buf(out, sizeof out), 0, pl);
    *extents = (int)ferry_plan_count(pl);
    ferry_plan_destroy(pl);
    ferry_dataset_close(ds);
    return rc;
}

static void test_zarr_chunk_lstat_faults(void) {
    ferry_ctx *ctx = make_ctx(4);
    static const int steps[] = {10, 300};          /* one by one; at once, on 4 threads */
    for (int s = 0; s < 2; s++) {
        char store[600];
        snprintf(store, sizeof store, "%s/steps%d.zarr", dir_, steps[s]);
        write_steps_store(store, steps[s]);
        int k = steps[s] - 3, n = 0;
        CHECK_EQ_I(ferry_test_set_syscall("lstat", (void *)faulty_lstat), 0);
        static const struct { const char *what; int err; } cases[] = {
            {"file EIO", EIO}, {"dir EIO", EIO}, {"file ENOENT", ENOENT}, {"none", 0}};
        for (int c = 0; c < 4; c++) {
            if (c == 0 || c == 2) snprintf(fail_sub_, sizeof fail_sub_, "/c/%d/0", k);
            else if (c == 1) snprintf(fail_sub_, sizeof fail_sub_, "/c/%d", k);
            else fail_sub_[0] = 0;
            atomic_store(&lstat_errno_, cases[c].err);
            atomic_store(&lstat_calls_, 0);
            int64_t rc = plan_steps(ctx, store, &n);
            CHECK(atomic_load(&lstat_calls_) >= steps[s]);   /* the lookups went through the seam */
            if (cases[c].err == EIO) {
                CHECK(rc < 0);
                char want[64];
                snprintf(want, sizeof want, "/c/%d", k);
                CHECK_STR_CONTAINS(ferry_errmsg(ctx), want);
                CHECK_STR_CONTAINS(ferry_errmsg(ctx), strerror(EIO));
            } else {
                CHECK_EQ_I(rc, (int64_t)steps[s] * 16);   /* planned: a fill for the absent chunk */
                CHECK_EQ_I(n, steps[s]);
            }
            if ((cases[c].err == EIO) != (rc < 0)) fprintf(stderr, "    %d steps, %s: rc %lld, %s\n", steps[s],
                                                          cases[c].what, (long long)rc, ferry_errmsg(ctx));
        }
        ferry_test_set_syscall(NULL, NULL);
    }
    ferry_ctx_destroy(ctx);
}

int main(void) {
    snprintf(dir_, sizeof dir_, "%s/ferry-faults-XXXXXX", getenv("FERRY_TEST_DIR") ? getenv("FERRY_TEST_DIR") : "/tmp");
    if (!mkdtemp(dir_)) return 1;
    snprintf(path_, sizeof path_, "%s/pattern.bin", dir_);
    int fd = open(path_, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    uint8_t *b = malloc(fsize_);
    for (size_t i = 0; i < fsize_; i++) b[i] = byte_at(i);
    if (write(fd, b, fsize_) != (ssize_t)fsize_) return 1;
    close(fd);
    free(b);
    RUN(test_short_and_interrupted_reads_retried);
    RUN(test_eio_names_file_and_byte);
    RUN(test_enospc_and_fsync);
    RUN(test_host_alloc_thp_and_fallback);
    RUN(test_fifo_refused);
    RUN(test_zarr_chunk_lstat_faults);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir_);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir_);
    return check_summary();
}
