/* SPDX-License-Identifier: MIT */
/*
 * tests/check_logprobs.c - Check suite for kernels/logprobs.c: the log-softmax of a row at the
 * sampled token and its k likeliest entries, against a serial oracle written here another way
 * (the log of each probability from a long double softmax, the top k by sorting every entry
 * by value, then id). Cases: random rows of a vocabulary's size, rows with many equal logits
 * (ties: the lower id first), -inf entries, k 0 and DPS_MAX_LOGPROBS, bad arguments refused,
 * the same row giving the same bits twice, and a perturbed row the oracle catches.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/logprobs.h"
#include "tests/testutil.h"

struct ent {
	float l;
	int id;
};

static int by_value_then_id(const void *a, const void *b)
{
	const struct ent *x = a, *y = b;

	if (x->l != y->l)
		return x->l > y->l ? -1 : 1;
	return x->id - y->id;
}

/* The oracle: log p of token and the k likeliest ids, into lp, ids, lps. */
static void oracle(const float *l, int n, int token, int k, double *lp, int *ids, double *lps)
{
	long double z = 0;
	struct ent *e = malloc(sizeof(*e) * (size_t)n);

	ck_assert_ptr_nonnull(e);
	for (int i = 0; i < n; i++) {
		z += expl((long double)l[i]);
		e[i] = (struct ent){ l[i], i };
	}
	*lp = (double)logl(expl((long double)l[token]) / z);
	qsort(e, (size_t)n, sizeof(*e), by_value_then_id);
	for (int j = 0; j < k; j++) {
		ids[j] = e[j].id;
		lps[j] = (double)logl(expl((long double)e[j].l) / z);
	}
	free(e);
}

/* Whether the kernel's answer agrees with the oracle's (within tol for the values). */
static int agrees(const float *l, int n, int token, int k, const struct dps_token_logprobs *o,
		  double tol)
{
	double lp, lps[DPS_MAX_LOGPROBS];
	int ids[DPS_MAX_LOGPROBS];

	oracle(l, n, token, k, &lp, ids, lps);
	if (o->token != token || o->n_top != k || fabs(o->logprob - lp) > tol)
		return 0;
	for (int j = 0; j < k; j++)
		if (o->top[j].id != ids[j] || fabs(o->top[j].logprob - lps[j]) > tol)
			return 0;
	return 1;
}

static float *random_row(int n, unsigned seed, int levels)
{
	float *l = malloc(sizeof(float) * (size_t)n);

	ck_assert_ptr_nonnull(l);
	srand(seed);
	for (int i = 0; i < n; i++)
		l[i] = levels ? (float)(rand() % levels) * 0.5f - 3.0f :
				(float)rand() / (float)RAND_MAX * 16.0f - 8.0f;
	return l;
}

START_TEST(test_against_oracle)
{
	static const int sizes[] = { 1, 7, 512, 32000 };
	struct dps_token_logprobs o, again;

	for (int s = 0; s < 4; s++)
		for (int levels = 0; levels < 12; levels += 5) { /* 0: distinct; 5, 10: many ties */
			const int n = sizes[s];
			float *l = random_row(n, (unsigned)(s * 31 + levels), levels);

			for (int k = 0; k <= DPS_MAX_LOGPROBS; k += 5) {
				const int kk = k < n ? k : n, token = (n * 7 / 9 + k) % n;

				ck_assert_int_eq(dps_logprobs(l, n, token, kk, &o), 0);
				ck_assert_msg(agrees(l, n, token, kk, &o, 1e-5), "n %d k %d levels %d",
					      n, kk, levels);
				for (int j = 1; j < kk; j++) /* sorted, ties by the lower id */
					ck_assert(o.top[j - 1].logprob > o.top[j].logprob ||
						  (o.top[j - 1].logprob == o.top[j].logprob &&
						   o.top[j - 1].id < o.top[j].id));
				ck_assert_int_eq(dps_logprobs(l, n, token, kk, &again), 0);
				ck_assert(!memcmp(&o, &again, sizeof(o))); /* the same bits */
			}
			free(l);
		}
}
END_TEST

START_TEST(test_edges)
{
	float l[6] = { 0.0f, -INFINITY, 2.0f, 2.0f, -INFINITY, 1.0f };
	struct dps_token_logprobs o;

	/* -inf: probability 0, last in the top (after every finite entry, by id) */
	ck_assert_int_eq(dps_logprobs(l, 6, 1, 6, &o), 0);
	ck_assert(isinf(o.logprob) && o.logprob < 0);
	ck_assert_int_eq(o.top[0].id, 2);
	ck_assert_int_eq(o.top[1].id, 3);
	ck_assert_int_eq(o.top[2].id, 5);
	ck_assert_int_eq(o.top[3].id, 0);
	ck_assert_int_eq(o.top[4].id, 1);
	ck_assert_int_eq(o.top[5].id, 4);
	ck_assert(agrees(l, 6, 2, 4, &(struct dps_token_logprobs){ 0 }, 1e-6) == 0);
	ck_assert_int_eq(dps_logprobs(l, 6, 2, 4, &o), 0);
	ck_assert(agrees(l, 6, 2, 4, &o, 1e-6));
	/* bad arguments */
	ck_assert_int_eq(dps_logprobs(l, 6, 6, 1, &o), -EINVAL);
	ck_assert_int_eq(dps_logprobs(l, 6, -1, 1, &o), -EINVAL);
	ck_assert_int_eq(dps_logprobs(l, 6, 0, DPS_MAX_LOGPROBS + 1, &o), -EINVAL);
	ck_assert_int_eq(dps_logprobs(l, 0, 0, 0, &o), -EINVAL);
}
END_TEST

/* The checker can fail: the oracle of a row that differs in one logit disagrees. */
START_TEST(test_fault_caught)
{
	float *l = random_row(512, 5, 0);
	struct dps_token_logprobs o;

	ck_assert_int_eq(dps_logprobs(l, 512, 3, 5, &o), 0);
	ck_assert(agrees(l, 512, 3, 5, &o, 1e-5));
	l[3] += 0.01f; /* the token's own logit */
	ck_assert(!agrees(l, 512, 3, 5, &o, 1e-5));
	l[3] -= 0.01f;
	l[o.top[0].id] -= 100.0f; /* the likeliest falls out of the top */
	ck_assert(!agrees(l, 512, 3, 5, &o, 1e-5));
	free(l);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("logprobs");
	TCase *tc = tcase_create("kernel");

	tcase_add_test(tc, test_against_oracle);
	tcase_add_test(tc, test_edges);
	tcase_add_test(tc, test_fault_caught);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
