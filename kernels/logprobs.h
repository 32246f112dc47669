/* SPDX-License-Identifier: MIT */
/*
 * kernels/logprobs.h - the log-probabilities a request asks for ("logprobs", "top_logprobs"):
 * the log-softmax of one row of logits, the sampled token's value and the k likeliest tokens.
 * Called by the scheduler (engine/serve/sched.c) on a replica's TP rank 0, once per sampled
 * token of a request that asks for them, on the raw model output (vLLM V1's default
 * logprobs-mode, raw_logprobs: before logit_bias, the penalties, temperature, top-k and
 * top-p). Plain C, serial, in double: the same row gives the same bits on every rank and run.
 */
#ifndef DPS_KERNELS_LOGPROBS_H
#define DPS_KERNELS_LOGPROBS_H

#include <stdint.h>

#define DPS_MAX_LOGPROBS 20 /* top_logprobs at most (vLLM's default max_logprobs is 20) */

struct dps_logprob {
	int32_t id;
	float logprob;
};

/* One sampled token with its log-probability and the likeliest tokens at its position. */
struct dps_token_logprobs {
	int32_t token;
	float logprob;                       /* of token */
	int32_t n_top;
	int32_t prompt;                      /* 1: a prompt token's (not sampled), set by the
					      * scheduler; dps_logprobs sets 0 */
	struct dps_logprob top[DPS_MAX_LOGPROBS]; /* (n_top) likeliest first; equal logits: the
						   * lower id first */
};

/*
 * The log-softmax of logits (n values, not modified) at token, and its k likeliest entries,
 * into *out: log p_i = l_i - max - log(sum_j exp(l_j - max)), the sum in double in id order.
 * NaN logits never rank among the top. Returns 0, or -EINVAL when n < 1, token is not in
 * [0, n) or k is not in [0, DPS_MAX_LOGPROBS].
 */
int dps_logprobs(const float *logits, int n, int token, int k, struct dps_token_logprobs *out);

#endif
