/* test_hdf5_probe.c — netCDF-4/HDF5 files are recognised by their superblock
 * signature (at 0, or after a user block of 512, 1024, 2048... bytes) and go
 * to the HDF5 parser, which names what is wrong with a damaged superblock,
 * never a netCDF-3 "bad magic". (test_hdf5.c reads real files;
 * tests/python/test_hdf5_c.py checks files h5py and netCDF4 write.) */
#include "check.h"
#include "formats_check.h"
#include "ferry.h"
#include <errno.h>
#include <unistd.h>

static ferry_ctx *ctx;
static const uint8_t sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
static uint8_t buf[8192];

static const char *with_sig_at(const char *name, size_t at, size_t total) {
    memset(buf, 0x5a, sizeof buf);
    memcpy(buf + at, sig, sizeof sig);
    const char *p = tpath(name);
    write_file(p, buf, total);
    return p;
}

static void test_signature_at_zero_and_after_user_blocks(void) {
    size_t offs[] = {0, 512, 1024, 2048, 4096};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        const char *p = with_sig_at("a.nc", offs[i], offs[i] + 64);
        CHECK_EQ_I(ferry_hdf5_signature(ctx, p), (long long)offs[i]);
        /* 0x5a after the signature: superblock version 90 */
        fc_expect_open_error(ctx, p, NULL, FERRY_EUNSUPPORTED, "superblock: version 90 (0-3 supported)");
        CHECK(!strstr(ferry_errmsg(ctx), "bad magic"));
    }
    /* any name: the content decides */
    fc_expect_open_error(ctx, with_sig_at("data.nc", 0, 100), NULL, FERRY_EUNSUPPORTED, "superblock");
    uint8_t v0[12] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n', 0, 0, 0, 0};   /* version 0, cut short */
    write_file(tpath("data.h5"), v0, sizeof v0);
    fc_expect_open_error(ctx, tpath("data.h5"), "hdf5", FERRY_EFORMAT, "superblock: truncated");
}

static void test_no_signature_or_wrong_place(void) {
    const char *p = with_sig_at("b.nc", 1000, 2000);     /* not a user-block size */
    CHECK_EQ_I(ferry_hdf5_signature(ctx, p), FERRY_ENOFORMAT);
    /* netCDF-3 by name, as before; its bytes (all 0x5a) sniff as text: named as what it is (sniff.c) */
    fc_expect_open_error(ctx, p, NULL, FERRY_EFORMAT, "plain text, not netcdf3");
    p = with_sig_at("short.bin", 0, 7);                    /* signature cut short */
    CHECK_EQ_I(ferry_hdf5_signature(ctx, p), FERRY_ENOFORMAT);
    CHECK_EQ_I(ferry_hdf5_signature(ctx, tpath("missing.nc")), -ENOENT);
}

/* ferry_format_detect: the sniffer ferry_dataset_open uses, for callers (the
 * xarray backend) that must choose between C and h5py; it once had a Python twin
 * that checked user blocks only up to 4096 bytes and refused a damaged "x.nc" */
static void test_format_detect(void) {
    const char *fmt = NULL;
    CHECK_EQ_I(ferry_format_detect(ctx, with_sig_at("a.nc", 0, 64), &fmt), 0);
    CHECK(fmt && !strcmp(fmt, "hdf5"));
    static uint8_t big[8192 + 64];                  /* a user block of 8192: past the old Python probe */
    memset(big, 0x5a, sizeof big);
    memcpy(big + 8192, sig, sizeof sig);
    write_file(tpath("big.nc"), big, sizeof big);
    fmt = NULL;
    CHECK_EQ_I(ferry_format_detect(ctx, tpath("big.nc"), &fmt), 0);
    CHECK(fmt && !strcmp(fmt, "hdf5"));
    fmt = NULL;
    CHECK_EQ_I(ferry_format_detect(ctx, with_sig_at("b.nc", 1000, 2000), &fmt), 0);   /* no signature */
    CHECK(fmt && !strcmp(fmt, "netcdf3"));          /* by its name: the parser then says what is wrong */
    CHECK_EQ_I(ferry_format_detect(ctx, with_sig_at("short.bin", 0, 7), &fmt), FERRY_ENOFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "short.bin");
    CHECK_EQ_I(ferry_format_detect(ctx, tpath("missing.nc"), &fmt), -ENOENT);
    CHECK_EQ_I(ferry_format_detect(ctx, dir, &fmt), FERRY_ENOFORMAT);   /* a directory that is no store */
    CHECK_EQ_I(ferry_format_detect(ctx, NULL, &fmt), FERRY_EINVAL);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/ferry-hdf5-XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    if (ferry_ctx_create(&ctx, NULL) != 0) return 1;
    RUN(test_signature_at_zero_and_after_user_blocks);
    RUN(test_no_signature_or_wrong_place);
    RUN(test_format_detect);
    ferry_ctx_destroy(ctx);
    const char *names[] = {"a.nc", "data.h5", "b.nc", "short.bin", "big.nc"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unlink(tpath(names[i]));
    rmdir(dir);
    return check_summary();
}
