/* SPDX-License-Identifier: MIT */
/*
 * tests/check_sample.c - token sampling: greedy ties to the lowest id; top-k 1 is greedy; the
 * AVX-512 argmax gives the reference's very index on ties, NaNs and signed zeros;
 * temperature sampling follows softmax(logits / T) (frequencies over 200000 draws within a few
 * standard deviations of the probabilities, computed independently in double precision);
 * top-k and top-p never pick outside their set; the same seed gives the same tokens; two
 * threads sampling at once get what they get one after the other; sorting only the head of
 * the vocabulary gives the very tokens the whole sort gives.
 *
 * Speculative verification (dps_sample_verify): greedy accepts the draft exactly when it is the
 * argmax (ties to the lowest id); sampling emits tokens distributed as dps_sample's, checked
 * against an oracle computed here in double precision (softmax of logits / T, the top-k and
 * top-p truncation by dps_sample's rules, renormalised) over 200000 verifications per setting:
 * plain temperature, top-k, top-p, both, a likely, an unlikely and a truncated-away draft. The
 * same checker refuses rules that are wrong (always accepting; drawing from the whole
 * distribution on a rejection; accepting with the untruncated probability). min-p (vLLM's:
 * after temperature, tokens below min_p times the top probability dropped, before top-k and
 * top-p) is in the oracle, in dps_sample's and in the verifier's distributions, and a rule
 * without it is refused.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/sample.h"
#include "tests/oracle.h"
#include "tests/testutil.h"

static const float base[6] = { 1.0f, 2.0f, 0.5f, 2.0f, -1.0f, 0.0f };

static int draw(const struct dps_sampling *p, struct dps_rng *r)
{
	float l[6];
	int scratch[6];

	memcpy(l, base, sizeof(l));
	return dps_sample(l, 6, p, r, scratch);
}

START_TEST(test_greedy)
{
	struct dps_sampling p = { 0.0f, 0, 1.0f, 0 };
	struct dps_rng r;

	dps_rng_seed(&r, 1);
	ck_assert_int_eq(draw(&p, &r), 1); /* 1 and 3 tie: the lower id */
	/* A temperature too small to divide by, or not a number, is greedy, not the last id. */
	p.temperature = 1e-40f;
	ck_assert_int_eq(draw(&p, &r), 1);
	p.temperature = NAN;
	ck_assert_int_eq(draw(&p, &r), 1);
	p.temperature = 0.8f;
	p.top_k = 1;
	for (int i = 0; i < 100; i++)
		ck_assert_int_eq(draw(&p, &r), 1);
}
END_TEST

/* The last index of the largest value: what a careless fast argmax might give. */
static int argmax_last(const float *x, int n)
{
	int best = 0;

	for (int i = 1; i < n; i++)
		if (x[i] >= x[best])
			best = i;
	return best;
}

START_TEST(test_argmax)
{
	/* Every pattern at every length: dps_argmax gives exactly the reference's index
	 * (the lowest among equals; index 0 when x[0] is NaN, NaNs passed over otherwise). */
	static const int lens[] = { 1, 2, 15, 16, 17, 31, 33, 100, 255, 32000 };
	float *x = malloc(sizeof(float) * 32000);
	int ties_seen = 0;

	ck_assert_ptr_nonnull(x);
	for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
		const int n = lens[l];

		for (int pat = 0; pat < 9; pat++) {
			for (int i = 0; i < n; i++) {
				const float r = oracle_f32(0, (uint32_t)i, (uint32_t)(pat + 40));

				x[i] = pat == 0   ? r                                   /* distinct */
				       : pat == 1 ? floorf(r * 3.0f)                    /* many ties */
				       : pat == 2 ? (i % 3 ? r : NAN)                   /* NaNs inside */
				       : pat == 3 ? (i ? r : NAN)                       /* NaN first */
				       : pat == 4 ? (i % 2 ? -0.0f : 0.0f)              /* +-0 only */
				       : pat == 5 ? -INFINITY                           /* nothing larger */
				       : pat == 6 ? (i == n - 1 ? 2.0f : r)             /* the last */
				       : pat == 7 ? (float)(i % 17 == 16) + (i % 7 ? 0.0f : NAN)
						  : (i && i % 3 == 0 ? NAN : r); /* NaNs after a number */
			}
			ck_assert_msg(dps_argmax(x, n) == dps_argmax_ref(x, n),
				      "n %d, pattern %d: %d, the reference %d", n, pat,
				      dps_argmax(x, n), dps_argmax_ref(x, n));
			ties_seen += pat == 1 && argmax_last(x, n) != dps_argmax_ref(x, n);
		}
	}
	/* The tie pattern does tell the lowest index from another: a last-index argmax fails. */
	ck_assert_int_gt(ties_seen, 0);
	free(x);
}
END_TEST

START_TEST(test_distribution)
{
	const float temps[2] = { 1.0f, 0.5f };

	for (int ti = 0; ti < 2; ti++) {
		struct dps_sampling p = { temps[ti], 0, 1.0f, 0 };
		const int n = 200000;
		int count[6] = { 0 };
		double prob[6], z = 0;
		struct dps_rng r;

		dps_rng_seed(&r, 99);
		for (int i = 0; i < 6; i++)
			z += prob[i] = exp((double)base[i] / temps[ti]);
		for (int i = 0; i < n; i++)
			count[draw(&p, &r)]++;
		for (int i = 0; i < 6; i++) {
			const double pi = prob[i] / z, sd = sqrt(n * pi * (1 - pi));

			ck_assert_msg(fabs(count[i] - n * pi) < 5 * sd + 1,
				      "T=%g token %d: %d draws, expected %.0f", (double)temps[ti], i,
				      count[i], n * pi);
		}
	}
}
END_TEST

START_TEST(test_top_k_top_p)
{
	struct dps_sampling p = { 1.0f, 2, 1.0f, 0 };
	struct dps_rng r;
	int seen[6] = { 0 };

	dps_rng_seed(&r, 5);
	for (int i = 0; i < 20000; i++)
		seen[draw(&p, &r)]++;
	/* top-k 2: only the two tokens of logit 2.0, about equally often */
	ck_assert_int_eq(seen[0] + seen[2] + seen[4] + seen[5], 0);
	ck_assert(seen[1] > 9000 && seen[3] > 9000);
	/* top-p: the smallest set reaching 0.5 of the mass is {1, 3} (0.33 each) */
	memset(seen, 0, sizeof(seen));
	p.top_k = 0;
	p.top_p = 0.5f;
	for (int i = 0; i < 20000; i++)
		seen[draw(&p, &r)]++;
	ck_assert_int_eq(seen[0] + seen[2] + seen[4] + seen[5], 0);
	/* top-p 0.8 adds token 0 (0.12) but not 2 */
	memset(seen, 0, sizeof(seen));
	p.top_p = 0.8f;
	for (int i = 0; i < 20000; i++)
		seen[draw(&p, &r)]++;
	ck_assert_int_gt(seen[0], 0);
	ck_assert_int_eq(seen[2] + seen[4] + seen[5], 0);
}
END_TEST

START_TEST(test_seeded)
{
	struct dps_sampling p = { 1.0f, 0, 0.9f, 0 };
	struct dps_rng a, b, c;
	int diff = 0;

	dps_rng_seed(&a, 7);
	dps_rng_seed(&b, 7);
	dps_rng_seed(&c, 8);
	for (int i = 0; i < 1000; i++) {
		const int x = draw(&p, &a), y = draw(&p, &b), z = draw(&p, &c);

		ck_assert_int_eq(x, y);
		diff += x != z;
	}
	ck_assert_int_gt(diff, 0); /* another seed gives another stream */
}
END_TEST

/* A vocabulary-sized row of logits per thread, different rows, and the draws from it. */
#define CONC_N 4096
#define CONC_DRAWS 200

struct conc {
	float logits[CONC_N];
	int scratch[CONC_N];
	struct dps_sampling p;
	uint64_t seed;
	int tokens[CONC_DRAWS];
};

static void *conc_run(void *arg)
{
	struct conc *c = arg;
	float *l = malloc(sizeof(c->logits));
	struct dps_rng r;

	ck_assert_ptr_nonnull(l);
	dps_rng_seed(&r, c->seed);
	for (int i = 0; i < CONC_DRAWS; i++) {
		memcpy(l, c->logits, sizeof(c->logits));
		c->tokens[i] = dps_sample(l, CONC_N, &c->p, &r, c->scratch);
	}
	free(l);
	return NULL;
}

START_TEST(test_threads)
{
	static struct conc c[2], serial[2];
	pthread_t th[2];
	struct dps_rng g;

	/* Rows with many exact ties (values on a coarse grid), so the order among equals shows. */
	dps_rng_seed(&g, 3);
	for (int t = 0; t < 2; t++) {
		for (int i = 0; i < CONC_N; i++)
			c[t].logits[i] = floorf(dps_rng_uniform(&g) * 64.0f) / 8.0f;
		c[t].p = (struct dps_sampling){ 1.0f, _i ? 40 : 0, 0.9f, 0 };
		c[t].seed = 11 + (uint64_t)t;
		serial[t] = c[t];
	}
	for (int t = 0; t < 2; t++)
		conc_run(&serial[t]);
	for (int rep = 0; rep < 5; rep++) {
		for (int t = 0; t < 2; t++)
			ck_assert_int_eq(pthread_create(&th[t], NULL, conc_run, &c[t]), 0);
		for (int t = 0; t < 2; t++)
			ck_assert_int_eq(pthread_join(th[t], NULL), 0);
		for (int t = 0; t < 2; t++)
			ck_assert_msg(!memcmp(c[t].tokens, serial[t].tokens, sizeof(c[t].tokens)),
				      "thread %d, round %d: tokens differ from the serial run", t, rep);
	}
	/* The comparison can fail: another seed gives other tokens. */
	serial[0].seed++;
	conc_run(&serial[0]);
	ck_assert(memcmp(c[0].tokens, serial[0].tokens, sizeof(c[0].tokens)));
}
END_TEST

/*
 * Top-k and top-p sort only the head of the order they need; the whole sort is the
 * reference. Rows of vocabulary size, peaked, flat, on a coarse grid (ties), with NaNs (every
 * probability NaN, so the head is empty and the whole sort runs: a walk that stopped at the
 * head's end instead is caught), every setting: the same seeds give the same tokens
 * either way, from dps_sample and from dps_sample_verify.
 */
#define HN 32000
START_TEST(test_head_is_whole_sort)
{
	static const struct dps_sampling sets[] = {
		{ 0.7f, 0, 0.9f, 0, 0.0f },   { 1.0f, 40, 1.0f, 0, 0.0f },  { 1.2f, 50, 0.8f, 0, 0.0f },
		{ 0.8f, 0, 0.5f, 0, 0.05f },  { 1.0f, 1, 1.0f, 0, 0.0f },   { 1.0f, 0, 0.999f, 0, 0.0f },
		{ 1.5f, 3000, 0.95f, 0, 0.0f }, { 1.0f, HN - 1, 0.99f, 0, 0.2f },
	};
	float *row = malloc(sizeof(float) * HN), *l = malloc(sizeof(float) * HN);
	int *scratch = malloc(sizeof(int) * HN), varied = 0;
	const int sizes[] = { 6, 100, 4096, HN };

	ck_assert(row && l && scratch);
	for (int z = 0; z < 4; z++)
		for (int pat = 0; pat < 5; pat++) {
			const int n = sizes[z];
			struct dps_rng g;

			dps_rng_seed(&g, 100 + (uint64_t)pat);
			for (int i = 0; i < n; i++) {
				const float u = dps_rng_uniform(&g);

				row[i] = pat == 0   ? u * 4.0f + (i % 997 == 5 ? 9.0f : 0.0f) /* peaked */
					 : pat == 1 ? u * 0.1f                              /* flat */
					 : pat == 2 ? floorf(u * 8.0f) / 2.0f               /* ties */
					 : pat == 3 ? (i % 50 == 7 ? NAN : u * 3.0f)        /* NaNs */
						    : 0.5f;                                  /* all equal */
			}
			for (size_t q = 0; q < sizeof(sets) / sizeof(sets[0]); q++) {
				int got[2][12], acc[2][12];

				for (int whole = 0; whole < 2; whole++) {
					struct dps_rng r;

					dps_sample_whole_sort(whole);
					dps_rng_seed(&r, 9);
					for (int d = 0; d < 6; d++) {
						memcpy(l, row, sizeof(float) * (size_t)n);
						got[whole][d] = dps_sample(l, n, &sets[q], &r, scratch);
						acc[whole][d] = 0;
					}
					for (int d = 6; d < 12; d++) {
						memcpy(l, row, sizeof(float) * (size_t)n);
						acc[whole][d] = dps_sample_verify(l, n, &sets[q], &r,
										  (d * 7919) % n, scratch,
										  &got[whole][d]);
					}
				}
				dps_sample_whole_sort(0);
				ck_assert_msg(!memcmp(got[0], got[1], sizeof(got[0])) &&
						      !memcmp(acc[0], acc[1], sizeof(acc[0])),
					      "n %d, row pattern %d, setting %zu: the head and the whole "
					      "sort differ", n, pat, q);
				for (int d = 1; d < 12; d++)
					varied += got[0][d] != got[0][0];
			}
		}
	/* Not a comparison of constants: the draws do differ from one another. */
	ck_assert_int_gt(varied, 0);
	free(row);
	free(l);
	free(scratch);
}
END_TEST

/* ---- speculative verification ---------------------------------------------------------- */

/* Row for the verification tests: 0 and 4 tie (so top-k 2 keeps 2 and 0, not 4). */
#define VN 8
static const float vbase[VN] = { 1.5f, 0.2f, 2.5f, -0.7f, 1.5f, 0.9f, -2.0f, 0.0f };

static int verify(const float *row, int n, const struct dps_sampling *p, struct dps_rng *r,
		  int draft, int *token)
{
	float l[64];
	int scratch[64];

	memcpy(l, row, sizeof(float) * (size_t)n);
	return dps_sample_verify(l, n, p, r, draft, scratch, token);
}

START_TEST(test_verify_greedy)
{
	struct dps_sampling p = { 0.0f, 0, 1.0f, 0 };
	const float neg[4] = { -3.0f, -1.0f, -2.0f, -1.0f };
	const float last[5] = { 0.0f, 1.0f, 2.0f, 3.0f, 4.0f };
	struct dps_rng r;
	int tok = -7;

	dps_rng_seed(&r, 1);
	/* The argmax is the draft: accepted. */
	ck_assert_int_eq(verify(base, 6, &p, &r, 1, &tok), 1);
	ck_assert_int_eq(tok, 1);
	/* 1 and 3 tie: the lower id is the target's token, so a draft of 3 is rejected. */
	tok = -7;
	ck_assert_int_eq(verify(base, 6, &p, &r, 3, &tok), 0);
	ck_assert_int_eq(tok, 1);
	tok = -7;
	ck_assert_int_eq(verify(base, 6, &p, &r, 0, &tok), 0);
	ck_assert_int_eq(tok, 1);
	ck_assert_int_eq(verify(neg, 4, &p, &r, 3, &tok), 0);
	ck_assert_int_eq(tok, 1);
	ck_assert_int_eq(verify(neg, 4, &p, &r, 1, &tok), 1);
	ck_assert_int_eq(tok, 1);
	ck_assert_int_eq(verify(last, 5, &p, &r, 0, &tok), 0);
	ck_assert_int_eq(tok, 4);
	ck_assert_int_eq(verify(last, 5, &p, &r, 4, &tok), 1);
	ck_assert_int_eq(tok, 4);
	/* A temperature too small to divide by, or not a number, is greedy too. */
	p.temperature = 1e-40f;
	ck_assert_int_eq(verify(base, 6, &p, &r, 3, &tok), 0);
	ck_assert_int_eq(tok, 1);
	p.temperature = NAN;
	ck_assert_int_eq(verify(base, 6, &p, &r, 1, &tok), 1);
	ck_assert_int_eq(tok, 1);
	/* Top-k 1 at a temperature: one token keeps all the mass, accepted always, others never. */
	p.temperature = 0.8f;
	p.top_k = 1;
	for (int i = 0; i < 1000; i++) {
		ck_assert_int_eq(verify(base, 6, &p, &r, 1, &tok), 1);
		ck_assert_int_eq(tok, 1);
		ck_assert_int_eq(verify(base, 6, &p, &r, 3, &tok), 0);
		ck_assert_int_eq(tok, 1);
	}
}
END_TEST

/*
 * The oracle: the distribution dps_sample draws from, in double precision. Sorted by
 * probability, highest first, the lower id first among equals; the top k kept, then the
 * smallest prefix whose mass reaches top_p; renormalised. Settings keep clear of the top-p
 * boundary (float and double would then agree on the set anyway); asserted.
 */
static void oracle(const float *logits, int n, const struct dps_sampling *p, double *q)
{
	double z[64], mx = -INFINITY, sum = 0, mass = 0;
	int ord[64], k;

	ck_assert_int_le(n, 64);
	for (int i = 0; i < n; i++) {
		z[i] = (double)logits[i] / (double)p->temperature;
		mx = z[i] > mx ? z[i] : mx;
	}
	for (int i = 0; i < n; i++)
		sum += z[i] = exp(z[i] - mx);
	if (p->min_p > 0) {
		/* min-p: exp(z - mx) is the ratio to the top probability already */
		const double cut = p->min_p;

		sum = 0;
		for (int i = 0; i < n; i++) {
			ck_assert_msg(fabs(z[i] - cut) > 1e-3, "min_p %g too close to a boundary", cut);
			z[i] = z[i] < cut ? 0 : z[i];
			sum += z[i];
		}
	}
	for (int i = 0; i < n; i++) {
		int j = i;

		z[i] /= sum;
		for (ord[i] = i; j > 0 && z[ord[j - 1]] < z[i]; j--) /* stable: ids ascend */
			ord[j] = ord[j - 1];
		ord[j] = i;
	}
	k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
	if (p->top_p < 1.0f)
		for (int i = 0; i < k; i++) {
			mass += z[ord[i]];
			ck_assert_msg(fabs(mass - p->top_p) > 1e-4, "top_p %g too close to a boundary",
				      (double)p->top_p);
			if (mass >= p->top_p) {
				k = i + 1;
				break;
			}
		}
	mass = 0;
	for (int i = 0; i < k; i++)
		mass += z[ord[i]];
	for (int i = 0; i < n; i++)
		q[i] = 0;
	for (int i = 0; i < k; i++)
		q[ord[i]] = z[ord[i]] / mass;
}

/*
 * The checker: each token's count within 5 standard errors of trials x q (never drawn when
 * q is 0), and the chi-square sum over the kept tokens far below what a wrong rule gives.
 * Returns 0, or 1 with the first failure in why.
 */
static int check_counts(const long *count, const double *q, int n, long trials, char *why,
			size_t len)
{
	double chi2 = 0;
	int df = -1;

	for (int i = 0; i < n; i++) {
		const double e = (double)trials * q[i], sd = sqrt(e * (1 - q[i]));

		if (q[i] == 0) {
			if (count[i]) {
				snprintf(why, len, "token %d, outside the kept set, drawn %ld times", i,
					 count[i]);
				return 1;
			}
			continue;
		}
		if (fabs((double)count[i] - e) > 5 * sd + 1) {
			snprintf(why, len, "token %d drawn %ld times, expected %.1f +- %.1f", i,
				 count[i], e, sd);
			return 1;
		}
		chi2 += ((double)count[i] - e) * ((double)count[i] - e) / e;
		df++;
	}
	if (df > 0 && chi2 > df + 8 * sqrt(2.0 * df)) {
		snprintf(why, len, "chi-square %.1f over %d degrees of freedom", chi2, df);
		return 1;
	}
	return 0;
}

struct vset {
	const char *what;
	struct dps_sampling p;
	int draft;
};

static const struct vset vsets[] = {
	{ "plain, likely draft", { 1.0f, 0, 1.0f, 0 }, 2 },
	{ "plain, unlikely draft", { 1.0f, 0, 1.0f, 0 }, 6 },
	{ "cold, very likely draft", { 0.25f, 0, 1.0f, 0 }, 2 },
	{ "hot, tied draft", { 1.7f, 0, 1.0f, 0 }, 4 },
	{ "top-k 3, tied draft kept", { 0.7f, 3, 1.0f, 0 }, 4 },
	{ "top-k 2, tied draft cut", { 1.0f, 2, 1.0f, 0 }, 4 },
	{ "top-p 0.85, last kept draft", { 1.0f, 0, 0.85f, 0 }, 5 },
	{ "top-p 0.8, draft cut", { 1.3f, 0, 0.8f, 0 }, 1 },
	{ "top-k 3 and top-p 0.6, draft kept", { 1.0f, 3, 0.6f, 0 }, 0 },
	{ "top-k 5 and top-p 0.9, draft cut", { 0.8f, 5, 0.9f, 0 }, 7 },
	{ "min-p 0.15, draft kept", { 1.0f, 0, 1.0f, 0, 0.15f }, 5 },
	{ "min-p 0.15, draft cut", { 1.0f, 0, 1.0f, 0, 0.15f }, 1 },
	{ "min-p 0.3 and top-p 0.8, draft kept", { 1.0f, 0, 0.8f, 0, 0.3f }, 0 },
	{ "min-p 0.3 and top-k 2, draft cut", { 1.0f, 2, 1.0f, 0, 0.3f }, 4 },
	{ "cold min-p 0.5, draft kept", { 0.6f, 0, 1.0f, 0, 0.5f }, 2 },
};

#define VTRIALS 200000

/*
 * A verification rule, the library's or a wrong one: emits a token for setting s (whose
 * kept distribution is q, and untruncated distribution full) and returns whether it
 * accepted the draft. No ck_assert in here: Check records every assertion's location, too
 * slow for a loop of 200000.
 */
struct vctx {
	const struct vset *s;
	double q[VN], full[VN];
};

typedef int (*rule_fn)(const struct vctx *c, struct dps_rng *r, int *token);

static int rule_real(const struct vctx *c, struct dps_rng *r, int *token)
{
	return verify(vbase, VN, &c->s->p, r, c->s->draft, token);
}

/* Wrong: accepts every draft. */
static int rule_accept_all(const struct vctx *c, struct dps_rng *r, int *token)
{
	*token = c->s->draft;
	return 1;
}

/* Wrong: on a rejection, draws from the whole kept distribution, the draft included. */
static int rule_no_removal(const struct vctx *c, struct dps_rng *r, int *token)
{
	float l[VN];
	int scratch[VN];

	if (verify(vbase, VN, &c->s->p, r, c->s->draft, token))
		return 1;
	memcpy(l, vbase, sizeof(l));
	*token = dps_sample(l, VN, &c->s->p, r, scratch);
	return *token == c->s->draft;
}

/* Wrong: accepts with the draft's probability before top-k/top-p renormalisation. */
static int rule_untruncated(const struct vctx *c, struct dps_rng *r, int *token)
{
	const int d = c->s->draft;
	double u, cum = 0;

	if (c->q[d] > 0 && dps_rng_uniform(r) < c->full[d]) {
		*token = d;
		return 1;
	}
	u = dps_rng_uniform(r) * (1 - c->q[d]);
	for (int i = 0; i < VN; i++) {
		if (i == d)
			continue;
		cum += c->q[i];
		if (u < cum) {
			*token = i;
			return 0;
		}
	}
	for (*token = VN - 1; *token == d || c->q[*token] == 0; --*token)
		;
	return 0;
}

/* dps_sample itself (no draft): its draws must follow the same distribution. */
static int rule_sample(const struct vctx *c, struct dps_rng *r, int *token)
{
	float l[VN];
	int scratch[VN];

	memcpy(l, vbase, sizeof(l));
	*token = dps_sample(l, VN, &c->s->p, r, scratch);
	return *token == c->s->draft;
}

/* Wrong: samples as if min-p were off. */
static int rule_no_min_p(const struct vctx *c, struct dps_rng *r, int *token)
{
	struct dps_sampling p = c->s->p;

	p.min_p = 0;
	return verify(vbase, VN, &p, r, c->s->draft, token);
}

/*
 * Runs VTRIALS verifications of setting s by rule and checks the tokens; 0 when they pass.
 * Every rule must emit a token in the vocabulary, and report an acceptance exactly when it
 * emits the draft.
 */
static int run_rule(const struct vset *s, rule_fn rule, uint64_t seed, char *why, size_t len)
{
	const struct dps_sampling plain = { s->p.temperature, 0, 1.0f, 0 };
	long count[VN] = { 0 }, bad = 0;
	struct vctx c = { .s = s };
	struct dps_rng r;

	oracle(vbase, VN, &s->p, c.q);
	oracle(vbase, VN, &plain, c.full);
	dps_rng_seed(&r, seed);
	for (long t = 0; t < VTRIALS; t++) {
		int tok = -1;
		const int acc = rule(&c, &r, &tok);

		if (tok < 0 || tok >= VN || acc != (tok == s->draft))
			bad++;
		else
			count[tok]++;
	}
	ck_assert_msg(!bad, "%s: %ld verifications emitted a token outside the vocabulary or "
		      "reported acceptance wrongly", s->what, bad);
	return check_counts(count, c.q, VN, VTRIALS, why, len);
}

START_TEST(test_verify_distribution)
{
	const struct vset *s = &vsets[_i];
	char why[256] = "";
	double q[VN];

	oracle(vbase, VN, &s->p, q);
	ck_assert_msg(!run_rule(s, rule_real, 1000 + (uint64_t)_i, why, sizeof(why)), "%s: %s",
		      s->what, why);
	ck_assert_msg(!run_rule(s, rule_sample, 2000 + (uint64_t)_i, why, sizeof(why)),
		      "%s, dps_sample: %s", s->what, why);
	/* The draft's acceptance rate is its kept probability: checked with the counts, since
	 * rule_real asserts that the draft is emitted exactly when accepted. Settings that cut
	 * the draft away never emit it. */
	if (strstr(s->what, "cut"))
		ck_assert(q[s->draft] == 0);
	else
		ck_assert(q[s->draft] > 0);
}
END_TEST

START_TEST(test_verify_checker_can_fail)
{
	char why[256];

	/* The oracle itself, on a known case: top-k 2 keeps 2 and 0 (0 before 4 in the tie). */
	{
		double q[VN];

		oracle(vbase, VN, &vsets[5].p, q);
		ck_assert(q[2] > 0.7 && q[2] < 0.75 && q[0] > 0.25 && q[0] < 0.3);
		ck_assert(q[1] == 0 && q[3] == 0 && q[4] == 0 && q[5] == 0 && q[6] == 0 && q[7] == 0);
	}
	/* Always accepting: the draft far too often, or drawn outside the kept set. */
	for (int i = 0; i < (int)(sizeof(vsets) / sizeof(vsets[0])); i += 3) {
		why[0] = 0;
		ck_assert_msg(run_rule(&vsets[i], rule_accept_all, 7, why, sizeof(why)),
			      "accept-all passed on %s", vsets[i].what);
		ck_assert(why[0]);
	}
	/* No removal on a rejection: the draft gains q(1 - q); even the unlikely draft shows. */
	ck_assert_msg(run_rule(&vsets[0], rule_no_removal, 8, why, sizeof(why)),
		      "no-removal passed on %s", vsets[0].what);
	ck_assert_msg(run_rule(&vsets[1], rule_no_removal, 9, why, sizeof(why)),
		      "no-removal passed on %s", vsets[1].what);
	ck_assert_msg(run_rule(&vsets[4], rule_no_removal, 10, why, sizeof(why)),
		      "no-removal passed on %s", vsets[4].what);
	/* Acceptance by the untruncated probability: the kept draft comes out too rarely. */
	ck_assert_msg(run_rule(&vsets[6], rule_untruncated, 11, why, sizeof(why)),
		      "untruncated passed on %s", vsets[6].what);
	ck_assert_msg(run_rule(&vsets[4], rule_untruncated, 12, why, sizeof(why)),
		      "untruncated passed on %s", vsets[4].what);
	/* ... while the wrong rule's machinery is right where it should agree: on a plain
	 * setting nothing is truncated, so it is the correct rule. */
	ck_assert_msg(!run_rule(&vsets[0], rule_untruncated, 13, why, sizeof(why)), "%s", why);
	/* Sampling without min-p where it is asked for: the cut tokens come out. */
	ck_assert_msg(run_rule(&vsets[10], rule_no_min_p, 14, why, sizeof(why)),
		      "no-min-p passed on %s", vsets[10].what);
	ck_assert_msg(run_rule(&vsets[14], rule_no_min_p, 15, why, sizeof(why)),
		      "no-min-p passed on %s", vsets[14].what);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("sample");
	TCase *tc = tcase_create("sample");
	TCase *tv = tcase_create("verify");

	tcase_add_test(tc, test_greedy);
	tcase_add_test(tc, test_argmax);
	tcase_add_test(tc, test_distribution);
	tcase_add_test(tc, test_top_k_top_p);
	tcase_add_test(tc, test_seeded);
	tcase_add_loop_test(tc, test_threads, 0, 2); /* top-p alone, then top-k and top-p */
	tcase_add_test(tc, test_head_is_whole_sort);
	suite_add_tcase(s, tc);
	tcase_set_timeout(tv, 30);
	tcase_add_test(tv, test_verify_greedy);
	tcase_add_loop_test(tv, test_verify_distribution, 0, (int)(sizeof(vsets) / sizeof(vsets[0])));
	tcase_add_test(tv, test_verify_checker_can_fail);
	suite_add_tcase(s, tv);
	return test_run_suite(s);
}
