/* main.c — the `ferry` command: dispatch to subcommands. */
#include "cli/cli.h"
#include "cli/info.h"
#include <stdio.h>
#include <string.h>

static void usage(FILE *to) {
    fprintf(to,
            "ferry %s — move array data between files and GPU or host memory\n"
            "\n"
            "usage:\n"
            "  ferry info [--json] FILE|DIR...   what a file holds: variables, dtypes, shapes, chunks,\n"
            "                                    codecs, byte ranges; or size and page-cache residency\n"
            "  ferry info [--json]               this build and machine: CUDA, cuFile, GPU kernels\n"
            "  ferry bench [options]             measure every path on this machine, warm and cold,\n"
            "                                    beside the machine's limits (ferry bench --help)\n"
            "  ferry version                     print the version\n"
            "  ferry --help                      this text\n"
            "\n"
            "environment: FERRY_THREADS, FERRY_TASK_SIZE, FERRY_STAGING_SIZE, FERRY_STAGING_COUNT,\n"
            "             FERRY_PATH=auto|cufile|staged|host, FERRY_DIRECT=auto|on|off, FERRY_SMALL_IO,\n"
            "             FERRY_DECODE=auto|gpu|cpu, FERRY_NVCOMP=PATH|off, FERRY_GPU_BATCH\n"
            "             (ferry info without a path: which of CUDA, cuFile, nvCOMP, nvJPEG loaded, or why not)\n"
            "sizes: 8M = 8MiB = 8*2^20 bytes, 8MB = 8*10^6 (options and FERRY_* variables alike)\n",
            ferry_version());
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) { usage(stdout); return 0; }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) { printf("ferry %s\n", ferry_version()); return 0; }
    if (!strcmp(cmd, "bench")) return ferry_cli_bench(argc - 1, argv + 1);
    ferry_ctx *ctx;
    if (ferry_ctx_create(&ctx, NULL) != 0) { fprintf(stderr, "ferry: %s\n", ferry_errmsg(NULL)); return 1; }
    int rc;
    if (!strcmp(cmd, "info")) rc = ferry_cli_info(ctx, argc - 1, argv + 1);
    else {
        fprintf(stderr, "ferry: unknown command \"%s\" (try ferry --help)\n", cmd);
        rc = 2;
    }
    ferry_ctx_destroy(ctx);
    return rc;
}
