/* info.h — `ferry info [--json] FILE|DIR...`: what a file or store holds. */
#ifndef FERRY_CLI_INFO_H
#define FERRY_CLI_INFO_H
#include "ferry.h"

/* argv[0] is the subcommand name ("info"); the options and paths follow.
 * Prints to stdout (errors to stderr). Returns the process exit status:
 * 0 when every path was described, 1 when one could not be read, 2 on a usage
 * error. A file of no known format is not an error: its size and page-cache
 * residency are shown instead. */
int ferry_cli_info(ferry_ctx *ctx, int argc, char **argv);

/* A torch.distributed.checkpoint directory (info_dcp.c): 1 when DIR holds a
 * `.metadata` and its description was appended to out, 0 when DIR is no DCP
 * checkpoint, -1 after printing why it could not be read. */
struct ferry_sbuf;
int ferry_cli_info_dcp(const char *dir, int json, struct ferry_sbuf *out);
#endif
