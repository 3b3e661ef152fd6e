/* common.h — small helpers every part of the library uses: error messages,
 * overflow-checked arithmetic, little/big-endian loads. Internal.
 *
 * Public and internal names. One rule: a name is public if and only if
 * include/ferry.h declares it (inside its FERRY_API_BEGIN/END region);
 * everything declared in a header under src/ is internal, whatever its
 * prefix. Internal names share the `ferry_` prefix (renaming them all would
 * collide with everyone's work for no gain to users), so they are marked by
 * where they live and by the build: the library's objects are compiled with
 * -fvisibility=hidden and linked with src/libferry.map, so libferry.so
 * exports exactly ferry.h's functions, and `make test-c` checks that with
 * nm -D (tools/check-exports.sh). Every header under src/ says "Internal" in
 * its first comment; a function moving into ferry.h becomes API and needs its
 * lifetimes and errors documented there. */
#ifndef FERRY_COMMON_H
#define FERRY_COMMON_H
#include "ferry.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Record a message for ferry_errmsg (thread-local, printf-style) and return code.
 * Messages name the file, the byte position and the variable where known:
 *   return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: bad magic", path, off); */
int ferry_seterr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefix the current message: "context: <old message>"; returns code. */
int ferry_preerr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A format's memo on the plan it plans into (plan.c): what it checked once
 * for this plan and may take as known in later calls planning into the same
 * plan (zarr.c: the array directories found inside their store). Freed with
 * the plan and by ferry_plan_clear, so "once per plan" means the plan, not one
 * call: a dataset's batch of 160 reads (20 variables x 8 steps) resolves each
 * array's directory once. ferry_plan_memo: the memo `owner` set, or NULL.
 * ferry_plan_set_memo: replace it (the old one released); 0, or FERRY_EINVAL
 * when a memo of another owner is held (one owner per plan). */
void *ferry_plan_memo(ferry_plan *plan, const void *owner);
int ferry_plan_set_memo(ferry_plan *plan, const void *owner, void *memo, void (*release)(void *));

/* lstat(2) of paths[0..n) on up to the context's thread count of threads
 * (formats/statmany.c; a NULL path gives ENOENT): err[i] is 0 and st[i] filled, or
 * err[i] is lstat's errno. For formats that plan many files at once. */
struct stat;
void ferry_lstat_many(ferry_ctx *ctx, char *const *paths, size_t n, struct stat *st, int *err);

/* Seconds on the monotonic clock (base/time.c). */
double ferry_now(void);

/* The calling thread's message buffer. */
const char *ferry_lasterr(void);
void ferry_clearerr(void);

/* Overflow-checked arithmetic: true on overflow. */
static inline bool ferry_mul_overflow(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool ferry_add_overflow(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}

static inline uint16_t ferry_le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t ferry_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t ferry_le64(const uint8_t *p) { return ferry_le32(p) | ((uint64_t)ferry_le32(p + 4) << 32); }
static inline uint32_t ferry_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static inline uint64_t ferry_be64(const uint8_t *p) { return ((uint64_t)ferry_be32(p) << 32) | ferry_be32(p + 4); }

#define FERRY_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FERRY_MAX(a, b) ((a) > (b) ? (a) : (b))
#endif
