/* args.c — strict option values for the CLI (see args.h). atoi() once let
 * `ferry bench --threads abc` run with 0 threads, silently. */
#include "cli/args.h"
#include "ferry.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int cli_int(const char *cmd, const char *opt, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = v && *v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "ferry %s: --%s: \"%s\" is not an integer in [%ld, %ld]\n", cmd, opt, v ? v : "", lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int cli_size(const char *cmd, const char *opt, const char *v, uint64_t min, uint64_t *out) {
    uint64_t x;
    if (ferry_size_parse(v, &x) < 0 || x < min) {
        fprintf(stderr, "ferry %s: --%s: \"%s\" is not a size of at least %llu bytes "
                        "(e.g. 4096, 512M or 512MiB = 512*2^20, 4GB = 4*10^9)\n",
                cmd, opt, v ? v : "", (unsigned long long)min);
        return -1;
    }
    *out = x;
    return 0;
}

void cli_bad_option(const char *cmd, int c, int optopt_, const char *arg) {
    if (c == ':') fprintf(stderr, "ferry %s: option %s needs a value\n", cmd, arg);
    else if (optopt_) fprintf(stderr, "ferry %s: unknown option -%c\n", cmd, optopt_);
    else fprintf(stderr, "ferry %s: unknown option %s\n", cmd, arg);
    fprintf(stderr, "  (ferry %s --help lists the options)\n", cmd);
}
