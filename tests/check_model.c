/* SPDX-License-Identifier: MIT */
/*
 * tests/check_model.c - the batched step against the single-row reference decoder.
 *
 * The oracle is dps_model_forward_ref fed one token at a time, one sequence alone. Checked:
 * the reference step over many rows and sequences equals it bit for bit (same arithmetic,
 * other order of rows); the fast step (BLIS, fast kernels, thread pool) is within rounding
 * of it for a prompt prefilled in one step and for decode batches mixing sequences; the fast
 * step gives bit-identical logits with 1 and 3 threads; and a row fed at the wrong position
 * is caught by the same comparison.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil.h"
#include "engine/model/mkmodel.h"
#include "engine/model/model.h"
#include "kernels/gemm.h"

static char dir[64];

enum { NSEQ = 3, STEPS = 12 };
static const int prompt_len[NSEQ] = { 7, 1, 4 };

static void setup(void)
{
	char err[256];

	test_tmpdir_make(dir, sizeof(dir), "model");
	ck_assert_msg(!dps_mkmodel(&dps_mkmodel_preset("tiny-gqa")->cfg, 5, DPS_ST_F32, dir, err,
				   sizeof(err)), "%s", err);
}

static void teardown(void)
{
	test_tmpdir_remove(dir);
}

static int token_of(int s, int p)
{
	return (s * 37 + p * 11 + 3) % 300;
}

static void load(struct dps_model *m, int seqs, int rows)
{
	char err[256];

	ck_assert_msg(!dps_model_load(m, dir, &(struct dps_model_opts){ .max_pos = 32,
									 .max_seqs = seqs,
									 .max_rows = rows },
				      err, sizeof(err)), "%s", err);
}

/* ref[s][p] = logits of sequence s at position p, each sequence alone, one token a time. */
static float *reference(void)
{
	struct dps_model m;
	float *ref;
	size_t v;

	load(&m, 1, 1);
	v = (size_t)m.cfg.vocab_size;
	ref = malloc(sizeof(float) * NSEQ * STEPS * v);
	for (int s = 0; s < NSEQ; s++) {
		dps_model_free(&m);
		load(&m, 1, 1);
		for (int p = 0; p < STEPS; p++)
			memcpy(ref + ((size_t)s * STEPS + (size_t)p) * v,
			       dps_model_forward_ref(&m, token_of(s, p), p), sizeof(float) * v);
	}
	dps_model_free(&m);
	return ref;
}

static double max_abs(const float *a, const float *b, size_t n)
{
	double worst = 0;

	for (size_t i = 0; i < n; i++) {
		const double d = fabs((double)a[i] - (double)b[i]);

		if (!(d <= worst))
			worst = isnan(d) ? INFINITY : d;
	}
	return worst;
}

/*
 * Runs every sequence through: first one step with all their prompts (rows of different
 * sequences and lengths mixed), then decode steps of one row per sequence, and stores every
 * row's logits in got (layout of reference()). bad_pos adds 1 to one row's position.
 */
static void batched(int fast, int threads, float *got, int bad_pos)
{
	struct dps_model m;
	int tokens[16], pos[16], seq[16], n = 0;
	char msg[256];
	size_t v;
	const float *lg;

	ck_assert_int_eq(dps_gemm_setup("auto", threads, msg, sizeof(msg)), 0);
	load(&m, NSEQ, 16);
	v = (size_t)m.cfg.vocab_size;
	for (int s = 0; s < NSEQ; s++)
		for (int p = 0; p < prompt_len[s]; p++, n++) {
			tokens[n] = token_of(s, p);
			pos[n] = p;
			seq[n] = s;
		}
	if (bad_pos)
		pos[2]++;
	lg = fast ? dps_model_step(&m, n, tokens, pos, seq, NULL)
		  : dps_model_step_ref(&m, n, tokens, pos, seq, NULL);
	for (int i = 0; i < n; i++)
		memcpy(got + ((size_t)seq[i] * STEPS + (size_t)pos[i] - (bad_pos && i == 2)) * v,
		       lg + (size_t)i * v, sizeof(float) * v);
	for (int p = 1; p < STEPS; p++) {
		n = 0;
		/* Sequences still in their prompt sit this step out; the others decode. */
		for (int s = NSEQ - 1; s >= 0; s--)
			if (p >= prompt_len[s]) {
				tokens[n] = token_of(s, p);
				pos[n] = p;
				seq[n++] = s;
			}
		if (!n)
			continue;
		lg = fast ? dps_model_step(&m, n, tokens, pos, seq, NULL)
			  : dps_model_step_ref(&m, n, tokens, pos, seq, NULL);
		for (int i = 0; i < n; i++)
			memcpy(got + ((size_t)seq[i] * STEPS + (size_t)pos[i]) * v, lg + (size_t)i * v,
			       sizeof(float) * v);
	}
	dps_model_free(&m);
}

START_TEST(test_ref_batched_is_exact)
{
	float *ref = reference(), *got = malloc(sizeof(float) * NSEQ * STEPS * 300);

	batched(0, 1, got, 0);
	ck_assert_int_eq(memcmp(ref, got, sizeof(float) * NSEQ * STEPS * 300), 0);
	free(ref);
	free(got);
}
END_TEST

START_TEST(test_fast_batched_close)
{
	float *ref = reference(), *got = malloc(sizeof(float) * NSEQ * STEPS * 300);
	double e;

	batched(1, 1, got, 0);
	e = max_abs(ref, got, (size_t)NSEQ * STEPS * 300);
	ck_assert_msg(e < 1e-4, "fast vs reference: %g", e);
	free(ref);
	free(got);
}
END_TEST

START_TEST(test_threads_bit_identical)
{
	float *one = malloc(sizeof(float) * NSEQ * STEPS * 300);
	float *three = malloc(sizeof(float) * NSEQ * STEPS * 300);

	batched(1, 1, one, 0);
	batched(1, 3, three, 0);
	ck_assert_int_eq(memcmp(one, three, sizeof(float) * NSEQ * STEPS * 300), 0);
	free(one);
	free(three);
}
END_TEST

START_TEST(test_wrong_position_caught)
{
	float *ref = reference(), *got = malloc(sizeof(float) * NSEQ * STEPS * 300);

	batched(1, 1, got, 1);
	ck_assert_msg(max_abs(ref, got, (size_t)NSEQ * STEPS * 300) > 1e-3,
		      "a row at the wrong position went unnoticed");
	free(ref);
	free(got);
}
END_TEST

START_TEST(test_want_selects_rows)
{
	struct dps_model m;
	const int tokens[4] = { 5, 6, 7, 8 }, pos[4] = { 0, 1, 2, 3 }, seq[4] = { 0 };
	const unsigned char want[4] = { 0, 1, 0, 1 };
	float *all = malloc(sizeof(float) * 4 * 300);
	const float *lg;

	load(&m, 1, 4);
	memcpy(all, dps_model_step(&m, 4, tokens, pos, seq, NULL), sizeof(float) * 4 * 300);
	dps_model_free(&m);
	load(&m, 1, 4);
	lg = dps_model_step(&m, 4, tokens, pos, seq, want);
	ck_assert_int_eq(memcmp(lg, all + 300, sizeof(float) * 300), 0);
	ck_assert_int_eq(memcmp(lg + 300, all + 900, sizeof(float) * 300), 0);
	dps_model_free(&m);
	free(all);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("model");
	TCase *tc = tcase_create("step");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_ref_batched_is_exact);
	tcase_add_test(tc, test_fast_batched_close);
	tcase_add_test(tc, test_threads_bit_identical);
	tcase_add_test(tc, test_wrong_position_caught);
	tcase_add_test(tc, test_want_selects_rows);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
