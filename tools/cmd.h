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
int dps_cmd_quantize(int argc, char **argv);
int dps_bench_decode(int argc, char **argv);
int dps_bench_accuracy(int argc, char **argv);
int dps_cmd_serve(int argc, char **argv);
int dps_bench_serve(int argc, char **argv);
int dps_bench_sweep(int argc, char **argv);
int dps_cmd_tokenize(int argc, char **argv);
int dps_cmd_detokenize(int argc, char **argv);
int dps_bench_tokenize(int argc, char **argv);

#include <stddef.h>
/*
 * Writes the directory of preset model `preset` (seed 0) in the user's cache into dir,
 * making it on first use; who names the command in messages. Returns 0 or a negative code
 * after a message.
 */
int dps_cached_preset(const char *preset, const char *who, char *dir, size_t len);
/*
 * Writes the directory of the default model (stories260K, converted by make) into dir: the
 * build tree's beside the running binary, else the installed one. Returns 0, or -ENOENT after
 * a message naming both places; who names the command in it.
 */
int dps_default_model(const char *who, char *dir, size_t len);

#include "engine/model/safetensors.h"
/* The --dtype of convert and mkmodel (f32, bf16, f16) of command cmd. 0, or -1 after a
 * message. */
int dps_tool_parse_dtype(const char *cmd, const char *s, enum dps_st_dtype *dt);

#endif
