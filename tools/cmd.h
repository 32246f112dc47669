/* SPDX-License-Identifier: MIT */
/*
 * tools/cmd.h - the dpshard subcommands. Each takes the arguments after its own name and
 * returns the process exit status (0 success, 1 runtime failure, 2 usage error).
 */
#ifndef DPS_TOOLS_CMD_H
#define DPS_TOOLS_CMD_H

int dps_cmd_groups(int argc, char **argv);
int dps_cmd_bench(int argc, char **argv);
int dps_bench_coll(int argc, char **argv);
int dps_cmd_convert(int argc, char **argv);
int dps_cmd_generate(int argc, char **argv);
int dps_cmd_mkmodel(int argc, char **argv);

#endif
