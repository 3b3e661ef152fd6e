/* args.h — option values of the `ferry` subcommands, checked strictly: a bad
 * value prints "ferry CMD: --OPT: ..." to stderr and the caller exits 2. */
#ifndef FERRY_CLI_ARGS_H
#define FERRY_CLI_ARGS_H
#include <stdint.h>

/* An integer in [lo, hi] (decimal, nothing after it). 0, or -1 after the message. */
int cli_int(const char *cmd, const char *opt, const char *v, long lo, long hi, int *out);
/* A size in ferry_size_parse's grammar ("4G", "512MiB", "5GB"), at least min. */
int cli_size(const char *cmd, const char *opt, const char *v, uint64_t min, uint64_t *out);
/* The message for getopt_long's '?' (unknown option) or ':' (missing value),
 * given the option character getopt returned and argv[optind - 1]. */
void cli_bad_option(const char *cmd, int c, int optopt_, const char *arg);
#endif
