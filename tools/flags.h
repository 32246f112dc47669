/* SPDX-License-Identifier: MIT */
/*
 * tools/flags.h - table-driven command-line flags for the dpshard subcommands. Each command
 * declares one table; the same table parses argv and prints --help, so the help text cannot
 * drift from what is accepted. Flags take the GNU forms "--name value" and "--name=value".
 */
#ifndef DPS_TOOLS_FLAGS_H
#define DPS_TOOLS_FLAGS_H

#include <stddef.h>
#include <stdio.h>

enum dps_flag_type {
	DPS_FLAG_INT,    /* int *, decimal, range [lo, hi] */
	DPS_FLAG_SIZE,   /* size_t *, "4096", "64K", "1M", "1MiB" */
	DPS_FLAG_STR,    /* const char **, borrowed from argv */
	DPS_FLAG_BOOL,   /* int *, set to 1 when present; takes no value */
	DPS_FLAG_DOUBLE, /* double * */
	DPS_FLAG_CHOICE, /* int *, 1 + the index of the value among metavar's "a|b|c" (0: unset) */
	DPS_FLAG_END
};

struct dps_flag {
	const char *name;    /* without the leading "--" */
	enum dps_flag_type type;
	void *ptr;
	const char *metavar; /* e.g. "N"; NULL for booleans */
	const char *help;    /* one line; the default is printed from *ptr */
	long lo, hi;         /* DPS_FLAG_INT range; both 0 means any non-negative int */
	char short_name;     /* optional one-letter form, "-n VALUE" */
};

#define DPS_FLAGS_END { NULL, DPS_FLAG_END, NULL, NULL, NULL, 0, 0, 0 }

/*
 * --dtype, the linear weights' type in memory, into *choice: 1 + the index of auto|f32|bf16
 * (0: unset, auto), so enum dps_shard_dtype is choice - 1.
 */
struct dps_flag dps_flag_dtype(int *choice);

/*
 * --quantization, into *choice: 1 for int8 (0: unset, the checkpoint's own), so enum
 * dps_shard_quant is choice.
 */
struct dps_flag dps_flag_quantization(int *choice);

struct dps_par_cfg;
/*
 * Writes the parallel-layout flags (--tensor-parallel-size, --data-parallel-size, the five
 * component sizes, --enable-expert-parallel, --all2all-backend and the two prefill sizes)
 * into out[0..DPS_PAR_FLAGS-1], pointing at cfg's fields.
 */
#define DPS_PAR_FLAGS 12
void dps_flags_parallel(struct dps_par_cfg *cfg, struct dps_flag *out);

/*
 * Parses argv[0..argc-1] (argv[0] is the first argument after the subcommand name).
 * Positional arguments are collected in order into pos[0..*npos-1] (at most max_pos).
 * Returns 0 on success, 1 when --help was given (usage printed to stdout), or -1 after
 * printing a message naming the bad flag to stderr.
 */
int dps_flags_parse(const struct dps_flag *flags, int argc, char **argv, const char *cmd,
		    const char *synopsis, char **pos, int max_pos, int *npos);

/* Prints "usage: dpshard CMD SYNOPSIS" and every flag with its help and default. */
void dps_flags_usage(FILE *f, const char *cmd, const char *synopsis, const struct dps_flag *flags);

/*
 * A list of integers in [lo, hi] separated by commas or spaces ("1,8,32", "1 403 407") into
 * out (at most cap). Returns how many, or -1 when s holds anything else or more than cap.
 */
int dps_flags_int_list(const char *s, int *out, int cap, long lo, long hi);

#endif
