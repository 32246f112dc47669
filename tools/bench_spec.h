/* SPDX-License-Identifier: MIT */
/*
 * tools/bench_spec.h - decode throughput with and without Eagle3 speculation, through the
 * serving engine (`dpshard bench decode --speculative-model DIR`; bench_spec.c says how).
 */
#ifndef DPS_TOOLS_BENCH_SPEC_H
#define DPS_TOOLS_BENCH_SPEC_H

#include "engine/runtime/groups.h"

struct dps_bench_spec_opts {
	const char *model, *draft, *blis_arch, *cpu_bind, *layout;
	struct dps_par_cfg par;
	int prompt, threads, reps, vocab;
	const int *gens, *batches, *ks;
	int ng, nb, nk;
	int json, csv;
};

/* Runs and prints the comparison. 0, 1 (a run failed) or 2 (bad options). */
int dps_bench_spec(const struct dps_bench_spec_opts *o);

#endif
