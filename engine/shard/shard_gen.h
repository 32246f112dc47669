/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/shard_gen.h - generating a replica's prompts on the sharded model: the step loop of
 * `dpshard generate` across ranks and of the equivalence tests.
 *
 * Each step feeds every prompt still to be fed (prefill rows, up to max_rows) and one decode
 * row per sequence that has sampled its next token. Uncoupled replicas (every component size
 * 1, no expert parallelism) step on their own. Coupled replicas agree before every step with
 * the _get_dp_padding all-reduce over the DP group (each writes its row count, whether it has
 * prompt rows and whether it has work into its own slot; sum; max): the prefill graph runs
 * when any replica prefills, otherwise the decode graph on the largest batch, the others
 * padding theirs (token 0 at position 0, no KV write, never sampled); a replica with nothing
 * to do runs such a dummy batch; the loop ends when no replica has work.
 */
#ifndef DPS_ENGINE_SHARD_GEN_H
#define DPS_ENGINE_SHARD_GEN_H

#include <stdint.h>

#include "engine/shard/shard.h"
#include "kernels/sample.h"

struct dps_gen_req {
	const int *prompt; /* token ids, BOS included */
	int n_prompt;      /* >= 1 */
	int max_pos;       /* positions in all, prompt included (as generate's -n) */
	int index;         /* the caller's id of the request (seeds its sampler: seed + index) */
};

/*
 * Called for every sampled token: request index, the position whose logits gave it, the token,
 * those logits (vocab floats; as given to the sampler). Returns nonzero to end the request.
 */
typedef int (*dps_gen_cb)(void *arg, int index, int pos, int token, const float *logits,
			  int vocab);

struct dps_gen_stats {
	uint64_t steps, dummy_steps, padded_rows;
};

/*
 * Generates reqs[0..n-1] (n <= the shard's max_seqs, sequence slots 0..n-1) to completion.
 * coupled: replicas step together (see above). Returns 0 or the first error of a collective.
 */
int dps_shard_generate(struct dps_shard *s, const struct dps_gen_req *reqs, int n, int coupled,
		       const struct dps_sampling *sp, dps_gen_cb cb, void *arg,
		       struct dps_gen_stats *st);

#endif
