/* SPDX-License-Identifier: MIT */
/*
 * tools/gen_ranks.h - `dpshard generate` across TP x DP rank processes (see gen_ranks.c).
 */
#ifndef DPS_TOOLS_GEN_RANKS_H
#define DPS_TOOLS_GEN_RANKS_H

#include "engine/runtime/groups.h"
#include "engine/model/tok.h"
#include "engine/serve/sched.h"
#include "kernels/sample.h"

struct dps_gen_ranks_opts {
	struct dps_par_cfg par;
	const char *model, *cpu_bind, *blis_arch;
	enum dps_shard_dtype dtype; /* --dtype */
	enum dps_shard_quant quant; /* --quantization */
	int threads;               /* per rank; 0 = the CPUs the placement gave it */
	int n_prompts;
	const int *const *prompts; /* (n_prompts) token ids */
	const int *n_prompt;
	const char *const *texts;  /* (n_prompts) the prompts as given, for the headings */
	int steps;                 /* positions per prompt, prompt included */
	struct dps_sampling sampling;
	/* --requests: each request's own parameters and replica (NULL: from the flags) */
	const struct dps_req_params *params;
	const int *replica;
	int jsonl;                 /* print one JSON object per request */
	/* the engine's sizes (0: defaults) */
	int block_size, max_num_seqs, max_model_len, max_batched_tokens;
	size_t kv_cache_memory;
	const char *decode_buckets;
	const char *spec_model;    /* Eagle3 draft (NULL: none) */
	int spec_k;                /* its tokens per step */
	const int *end;            /* (n_end) ids that end a sequence */
	int n_end;
	const struct dps_tok *tok; /* NULL: print ids */
	int completion_only;       /* print the completion without its prompt (--chat) */
	int ids_out, verbose, trace;
	int rank_timeout;          /* seconds: a rank with requests that makes no progress this
				    * long is hung and the run fails (0: never) */
};

/* Runs the instance and prints every completion under its prompt. 0 or a negative code. */
int dps_generate_ranks(const struct dps_gen_ranks_opts *o);

#endif
