/* time.c — the one clock the library measures with (statistics, waits,
 * residency re-checks): monotonic, in seconds. */
#include "common.h"
#include <time.h>

double ferry_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
