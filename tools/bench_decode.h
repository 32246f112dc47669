/* SPDX-License-Identifier: MIT */
/* tools/bench_decode.h - bench decode's results and their table (tools/bench_decode_table.c). */
#ifndef DPS_TOOLS_BENCH_DECODE_H
#define DPS_TOOLS_BENCH_DECODE_H

#include "engine/model/model_config.h"
#include "shm/coll.h"
#include "tools/machine.h"

struct result {
	char test[32];
	int batch, prompt, gen;
	double mean, sd;       /* tokens/s */
	double step_ms, coll_ms; /* per step (decode) or per prefill, and its collective part */
	double bytes_per_step; /* decode: weights + KV read per step, every rank */
	double gbs;            /* decode: achieved read rate; prefill: product GFLOP/s */
	double bound;          /* decode: fraction of the bandwidth bound; prefill: of the sgemm rate */
	double calls_per_layer[DPS_COLL_KINDS]; /* decode steps, rank 0 */
	double dispatch_bytes, expert_bytes;    /* decode: per step, every rank */
	double expert_gbs;     /* decode, MoE: bytes / time of the expert products, a rank's mean */
	double expert_busy;    /* decode, MoE: the part of the whole-expert tasks' thread time spent
				* running experts (the rest: the fork and the join); -1: none ran */
	double product_gbs;    /* decode: bytes / time of the products (dps_shard_linear), likewise */
	double product_bytes;  /* decode: the W bytes those products read per step, every rank */
	int real;              /* decode: sequences of every replica together */
};

/* What the table prints besides the results. */
struct bench_table {
	const struct result *res;
	int nres;
	const char *model_dir, *lname;
	int world, threads, bw_threads;    /* ranks, threads per rank, threads of the bandwidth run */
	const struct dps_machine *mach;
	double bw, bw0, bw1, peak;         /* read bytes/s: the bound, before and after the runs;
					    * sgemm GFLOP/s */
	double rank0_bytes;
	int rank0_wt;                      /* enum dps_wtype */
	double rank0_kv;
	int load_given;                    /* --load was given: */
	const int *load;                   /* each replica's percent */
	int dp;
	const struct dps_model_config *cfg;
};

/* Prints the machine, the layout, llama-bench's table and the expert products' read rate. */
void dps_bench_decode_table(const struct bench_table *t);

/* One result as a JSON object of --json's "results", with a comma after it unless last. */
void dps_bench_decode_json_result(const struct result *r, int last);

#endif
