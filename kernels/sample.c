/* SPDX-License-Identifier: MIT */
/*
 * kernels/sample.c - token sampling (see sample.h). Runs once per generated token on the
 * vocabulary's logits; top-k and top-p sort only the head of the vocabulary they need
 * (head_sorted), with the whole sort as the fallback that gives the same answer.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/sample.h"

void dps_rng_seed(struct dps_rng *r, uint64_t seed)
{
	r->s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
	if (!r->s)
		r->s = 1;
}

float dps_rng_uniform(struct dps_rng *r)
{
	/* xorshift64*, top 24 bits */
	r->s ^= r->s >> 12;
	r->s ^= r->s << 25;
	r->s ^= r->s >> 27;
	return (float)((r->s * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

/*
 * Orders token ids by probability, highest first, the lower id first among equals; NaN sorts
 * after every number so that the order stays total (qsort's contract) on a broken row. The
 * probabilities come through qsort_r's argument, not a global: threads sample at once.
 */
static int cmp_desc(const void *a, const void *b, void *probs)
{
	const float *const v = probs;
	const int i = *(const int *)a, j = *(const int *)b;
	const float x = v[i], y = v[j];

	if (x > y)
		return -1;
	if (x < y)
		return 1;
	if (!isnan(x) != !isnan(y))
		return isnan(x) ? 1 : -1;
	return (i > j) - (i < j); /* lower id first among equals */
}

/*
 * min-p on probabilities (n, summing to 1): those below min_p times the largest become 0 and
 * the rest are renormalised, as vLLM masks their logits to -inf before top-k and top-p.
 */
static void min_p_cut(float *probs, int n, float min_p)
{
	float top = 0.0f, sum = 0.0f;

	for (int i = 0; i < n; i++)
		top = probs[i] > top ? probs[i] : top;
	for (int i = 0; i < n; i++) {
		if (probs[i] < top * min_p)
			probs[i] = 0.0f;
		sum += probs[i];
	}
	if (sum > 0.0f)
		for (int i = 0; i < n; i++)
			probs[i] /= sum;
}

/*
 * The kept set wants the head of the order cmp_desc defines, not the whole order: a vocabulary
 * of 128k sorted at every token took 18 ms. So the probabilities are first binned by their
 * top bits (SEL_SHIFT: eight of exponent and four of mantissa; for numbers >= 0 the bits
 * order as the values do), and from the top bin down the bins are taken until they hold at
 * least `need` tokens and, for top-p, a little more mass than top_p. The tokens of those bins
 * are a prefix of the whole order (every token left out is smaller than every token taken),
 * so sorting them alone and walking them gives exactly what sorting everything gives, as
 * long as the walk ends inside them; when it would go past (NaNs, min-p's zeros, rounding),
 * the caller sorts everything.
 */
#define SEL_SHIFT 19
#define SEL_BINS 2048 /* 1.0 is in bin 2032; a probability is at most 1 */

static _Atomic int whole_sort; /* tests: always sort everything (dps_sample_whole_sort) */

void dps_sample_whole_sort(int on)
{
	whole_sort = on;
}

/* The bin of a probability: -1 for NaN, 0 for either zero, the top bits otherwise. */
static inline int bin_of(float p)
{
	uint32_t u;

	if (!(p > 0.0f))
		return p == 0.0f ? 0 : -1;
	memcpy(&u, &p, sizeof(u));
	return (int)(u >> SEL_SHIFT) < SEL_BINS ? (int)(u >> SEL_SHIFT) : SEL_BINS - 1;
}

/* The prefix's ids into scratch, sorted; returns how many. */
static int head_sorted(const float *probs, int n, int need, float top_p, int *scratch)
{
	int count[SEL_BINS] = { 0 }, c = 0, b;
	double mass[SEL_BINS] = { 0 }, m = 0.0;

	for (int i = 0; i < n; i++) {
		b = bin_of(probs[i]);
		if (b >= 0) {
			count[b]++;
			mass[b] += probs[i];
		}
	}
	for (b = SEL_BINS - 1; b > 0; b--) {
		c += count[b];
		m += mass[b];
		if (c >= need && (top_p >= 1.0f || m >= (double)top_p + 1e-3))
			break;
	}
	c = 0;
	for (int i = 0; i < n; i++)
		if (bin_of(probs[i]) >= b)
			scratch[c++] = i;
	qsort_r(scratch, (size_t)c, sizeof(int), cmp_desc, (void *)probs);
	return c;
}

/*
 * Walks the first `have` ids of scratch (sorted by cmp_desc) for the kept prefix: the top k,
 * cut where min-p's zeros start and where the mass reaches top_p. Returns its length, or -1
 * when the walk would need ids past `have`.
 */
static int walk(const float *probs, const int *scratch, int have, int k,
		const struct dps_sampling *p, float *mass)
{
	*mass = 0.0f;
	for (int i = 0; i < k; i++) {
		if (i == have)
			return -1;
		if (p->min_p > 0.0f && i && probs[scratch[i]] == 0.0f)
			return i; /* the rest was cut by min-p: never a fallback */
		*mass += probs[scratch[i]];
		if (*mass >= p->top_p)
			return i + 1;
	}
	return k;
}

/*
 * Scales logits by 1 / temperature and softmaxes them in place (then min-p); returns how many
 * tokens are kept. Without top-k or top-p: all n, in id order (*sorted 0, *mass 1). Otherwise
 * the top k, then the smallest prefix whose mass reaches top_p: their ids in scratch by
 * probability (*sorted 1), their total in *mass.
 */
static int kept_set(float *logits, int n, const struct dps_sampling *p, int *scratch,
		    int *sorted, float *mass)
{
	const int top_k = p->top_k > 0 && p->top_k < n;
	const int k = top_k ? p->top_k : n;
	int kept;

	dps_softmax_temp(logits, n, p->temperature);
	if (p->min_p > 0.0f)
		min_p_cut(logits, n, p->min_p);
	*mass = 1.0f;
	*sorted = !(k == n && p->top_p >= 1.0f);
	if (!*sorted)
		return n;
	kept = whole_sort ? -1
			  : walk(logits, scratch,
				 head_sorted(logits, n, top_k ? k : 1, p->top_p, scratch), k, p, mass);
	if (kept >= 0)
		return kept;
	for (int i = 0; i < n; i++) /* the head was not enough: the whole order */
		scratch[i] = i;
	qsort_r(scratch, (size_t)n, sizeof(int), cmp_desc, logits);
	return walk(logits, scratch, n, k, p, mass);
}

int dps_sample(float *logits, int n, const struct dps_sampling *p, struct dps_rng *r, int *scratch)
{
	int k, i, sorted;
	float u, cum, mass;

	/* Below this, logits / T overflow: the distribution is the argmax anyway. */
	if (!(p->temperature >= 1e-6f))
		return dps_argmax(logits, n);
	k = kept_set(logits, n, p, scratch, &sorted, &mass);
	if (!sorted) {
		/* Plain sampling over the whole distribution. */
		u = dps_rng_uniform(r);
		cum = 0.0f;
		for (i = 0; i < n; i++) {
			cum += logits[i];
			if (u < cum)
				return i;
		}
		/* Rounding left u above the total: the last token that can be chosen. */
		for (i = n - 1; i > 0 && logits[i] == 0.0f; i--)
			;
		return i;
	}
	u = dps_rng_uniform(r) * mass;
	cum = 0.0f;
	for (i = 0; i < k; i++) {
		cum += logits[scratch[i]];
		if (u < cum)
			return scratch[i];
	}
	return scratch[k - 1];
}

int dps_sample_verify(float *logits, int n, const struct dps_sampling *p, struct dps_rng *r,
		      int draft, int *scratch, int *token)
{
	int k, i, sorted, kept = 0;
	float mass, pd = 0.0f, rest, u, cum;

	if (!(p->temperature >= 1e-6f)) {
		*token = dps_argmax(logits, n);
		return *token == draft;
	}
	/* The kept set exactly as dps_sample keeps it. */
	k = kept_set(logits, n, p, scratch, &sorted, &mass);
	if (sorted)
		for (i = 0; i < k; i++)
			kept |= scratch[i] == draft;
	else
		kept = draft >= 0 && draft < n;
	/* The draft is one token with certainty: accept it with the target's probability. */
	if (kept)
		pd = logits[draft] / mass;
	u = dps_rng_uniform(r);
	if (u < pd) {
		*token = draft;
		return 1;
	}
	/* Rejected: the target's distribution without the draft token, renormalised. */
	rest = mass - (kept ? logits[draft] : 0.0f);
	if (!(rest > 0.0f)) {
		*token = draft; /* only rounding gets here: the draft held all the mass */
		return 1;
	}
	u = dps_rng_uniform(r) * rest;
	cum = 0.0f;
	for (i = 0; i < k; i++) {
		const int x = sorted ? scratch[i] : i;

		if (x == draft)
			continue;
		cum += logits[x];
		if (u < cum) {
			*token = x;
			return 0;
		}
	}
	/* Rounding left u above the sum: the last keepable token other than the draft. */
	for (i = k - 1; i >= 0; i--) {
		const int x = sorted ? scratch[i] : i;

		if (x != draft && logits[x] > 0.0f) {
			*token = x;
			return 0;
		}
	}
	*token = draft;
	return 1;
}
