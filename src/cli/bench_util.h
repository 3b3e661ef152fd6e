/* bench_util.h — what `ferry bench` and `ferry bench --records` share: the
 * clocks they time with and the file pattern one writes and the other
 * verifies (word i of 8 bytes is bench_word(i), a splitmix64 step). */
#ifndef FERRY_CLI_BENCH_UTIL_H
#define FERRY_CLI_BENCH_UTIL_H
#include <stdint.h>
#include <sys/resource.h>
#include <time.h>

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU seconds (user + system) of the whole process so far */
static inline double bench_cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static inline uint64_t bench_word(uint64_t i) {
    uint64_t z = i + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    return z ^ (z >> 27);
}
#endif
