/* SPDX-License-Identifier: MIT */
/*
 * kernels/sample.h - choosing the next token from logits: greedy (lowest id among equal
 * maxima), or temperature with optional min-p, top-k and top-p (vLLM's order: temperature,
 * then min-p, then top-k and top-p), driven by a per-request seeded generator so that a
 * sampled run is reproducible. What changes the logits before (penalties, logit bias,
 * min_tokens) is logits.h's.
 */
#ifndef DPS_KERNELS_SAMPLE_H
#define DPS_KERNELS_SAMPLE_H

#include <stdint.h>

struct dps_sampling {
	float temperature; /* 0 = greedy */
	int top_k;         /* 0 = all */
	float top_p;       /* 1 = all */
	uint64_t seed;
	float min_p;       /* 0 = off: after temperature, tokens less likely than min_p times the
			    * likeliest are dropped (vLLM's MinPLogitsProcessor) */
};

struct dps_rng {
	uint64_t s;
};

void dps_rng_seed(struct dps_rng *r, uint64_t seed);
/* Uniform in [0, 1). */
float dps_rng_uniform(struct dps_rng *r);

/*
 * Picks a token from logits (n values; modified: scaled and softmaxed in place when
 * sampling). scratch holds n ints. Returns the token id. Keeps no state of its own: threads
 * may sample at once, each with its own logits, scratch and generator.
 */
int dps_sample(float *logits, int n, const struct dps_sampling *p, struct dps_rng *r,
	       int *scratch);

/*
 * Speculative decoding: verifies the draft token proposed (with certainty: a greedy draft)
 * where the target's logits are these. Greedy (temperature 0): *token is the target's argmax,
 * accepted when it is the draft. Sampling: the standard rejection rule, so that *token is
 * distributed as dps_sample's: accept the draft with the target's probability of it (after
 * temperature, top-k and top-p), else draw from that distribution without the draft token.
 * Returns 1 when the draft was accepted (*token == draft). logits are modified, scratch holds
 * n ints.
 */
int dps_sample_verify(float *logits, int n, const struct dps_sampling *p, struct dps_rng *r,
		      int draft, int *scratch, int *token);

/*
 * Tests: top-k and top-p sort the whole vocabulary (on: 1) instead of only the head they need
 * (0, the default); both give the same tokens.
 */
void dps_sample_whole_sort(int on);

#endif
