/* check.h — the C tests' tiny harness.
 * A test file defines `static void test_xxx(void)` functions and lists them in
 * main() with RUN(test_xxx); CHECK* record failures without stopping the test.
 * The file ends with `return check_summary();`, which prints the closing line
 * "N passed, N failed" (counted in tests) and returns nonzero on any failure. */
#ifndef FERRY_TEST_CHECK_H
#define FERRY_TEST_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <inttypes.h>

static int check_failures_in_test_;
static int check_passed_, check_failed_;
static const char *check_current_;

#define CHECK(cond) do { if (!(cond)) { check_failures_in_test_++; \
    fprintf(stderr, "  FAIL %s:%d in %s: %s\n", __FILE__, __LINE__, check_current_, #cond); } } while (0)
#define CHECK_EQ_I(a, b) do { long long a_ = (long long)(a), b_ = (long long)(b); if (a_ != b_) { \
    check_failures_in_test_++; fprintf(stderr, "  FAIL %s:%d in %s: %s == %s (%lld vs %lld)\n", \
    __FILE__, __LINE__, check_current_, #a, #b, a_, b_); } } while (0)
#define CHECK_STR_CONTAINS(hay, needle) do { const char *h_ = (hay); if (!h_ || !strstr(h_, (needle))) { \
    check_failures_in_test_++; fprintf(stderr, "  FAIL %s:%d in %s: \"%s\" does not contain \"%s\"\n", \
    __FILE__, __LINE__, check_current_, h_ ? h_ : "(null)", (needle)); } } while (0)

#define RUN(fn) do { check_current_ = #fn; check_failures_in_test_ = 0; fn(); \
    if (check_failures_in_test_) { check_failed_++; fprintf(stderr, "FAIL %s\n", #fn); } \
    else { check_passed_++; } } while (0)

static inline int check_summary(void) {
    printf("%d passed, %d failed\n", check_passed_, check_failed_);
    return check_failed_ ? 1 : 0;
}
#endif
