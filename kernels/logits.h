/* SPDX-License-Identifier: MIT */
/*
 * kernels/logits.h - what vLLM does to a request's logits before it samples, in its order
 * (vllm/v1/sample/sampler.py): the stop ids masked while fewer than min_tokens tokens were
 * generated, logit_bias added, then the repetition, frequency and presence penalties. These
 * change the argmax, so they apply to greedy requests as well; temperature, min_p, top-k and
 * top-p follow in dps_sample (sample.h). Called by the scheduler (engine/serve/sched.c) on a
 * replica's TP rank 0, once per sampled token of a request that asks for one of them.
 *
 * The penalties read how often each token was seen: struct dps_seen, one per request, an
 * open-addressing map from token id to (in the prompt, count in the output), so that a step
 * costs the distinct tokens seen, not the vocabulary or the sequence, and a request's memory
 * is bounded by its distinct tokens (at most max_model_len).
 */
#ifndef DPS_KERNELS_LOGITS_H
#define DPS_KERNELS_LOGITS_H

#include <stdint.h>

struct dps_logit_bias {
	int32_t id;
	float bias;      /* added to logits[id] */
};

/* vLLM's penalties; every field 0 (repetition 0 or 1) is off. */
struct dps_penalties {
	float repetition; /* > 0: a seen token's logit divided by it when positive, multiplied when
			   * not (prompt and output tokens) */
	float presence;   /* subtracted once from every token of the output */
	float frequency;  /* subtracted per occurrence in the output */
};

struct dps_seen_slot {
	int32_t id;      /* -1: empty */
	uint32_t out;    /* times in the output */
	uint32_t prompt; /* 1: in the prompt */
};

struct dps_seen {
	struct dps_seen_slot *slot; /* (cap) */
	uint32_t cap, n;            /* a power of two (0 before the first add); slots used */
};

/* Whether p changes anything. */
static inline int dps_penalties_on(const struct dps_penalties *p)
{
	return (p->repetition != 0.0f && p->repetition != 1.0f) || p->presence != 0.0f ||
	       p->frequency != 0.0f;
}

/*
 * Counts token id once more: in the output when output, else as seen in the prompt. The map
 * grows (doubling, at half full). Returns 0, -EINVAL (id < 0) or -ENOMEM (s unchanged).
 */
int dps_seen_add(struct dps_seen *s, int id, int output);
/* The slot of id, or NULL when it was never seen. */
const struct dps_seen_slot *dps_seen_find(const struct dps_seen *s, int id);
void dps_seen_free(struct dps_seen *s);

/* logits[ids[i]] = -inf (ids outside [0, n) skipped): min_tokens's stop ids. */
void dps_logits_mask(float *logits, int n, const int *ids, int n_ids);
/* logits[b[i].id] += b[i].bias (ids outside [0, n) skipped). */
void dps_logits_bias(float *logits, int n, const struct dps_logit_bias *b, int n_bias);
/*
 * The penalties on logits (n values, in place) for the tokens of s: repetition on every seen
 * token, then frequency and presence on the output's. Ids outside [0, n) are skipped.
 */
void dps_logits_penalize(float *logits, int n, const struct dps_penalties *p,
			 const struct dps_seen *s);

#endif
