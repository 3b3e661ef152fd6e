/* cli.h — subcommands of the `ferry` command. */
#ifndef FERRY_CLI_H
#define FERRY_CLI_H
#include "ferry.h"
/* argv[0] is the subcommand name. Return the process exit status. */
int ferry_cli_bench(int argc, char **argv);
/* ferry bench --records ...: small random records (bench_records.c). */
int ferry_cli_bench_records(int argc, char **argv);
#endif
