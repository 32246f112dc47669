/* SPDX-License-Identifier: MIT */
/*
 * tests/check_sample.c - token sampling: greedy ties to the lowest id; top-k 1 is greedy;
 * temperature sampling follows softmax(logits / T) (frequencies over 200000 draws within a few
 * standard deviations of the probabilities, computed independently in double precision);
 * top-k and top-p never pick outside their set; the same seed gives the same tokens; two
 * threads sampling at once get what they get one after the other.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/sample.h"
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

int main(void)
{
	Suite *s = suite_create("sample");
	TCase *tc = tcase_create("sample");

	tcase_add_test(tc, test_greedy);
	tcase_add_test(tc, test_distribution);
	tcase_add_test(tc, test_top_k_top_p);
	tcase_add_test(tc, test_seeded);
	tcase_add_loop_test(tc, test_threads, 0, 2); /* top-p alone, then top-k and top-p */
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
