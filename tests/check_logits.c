/* SPDX-License-Identifier: MIT */
/*
 * tests/check_logits.c - the logits processors before sampling (kernels/logits.h) against a
 * plain reference written here from vLLM's formulas on dense counts (sampler.py's order:
 * min_tokens masks the stop ids, logit_bias adds, the repetition penalty divides positive and
 * multiplies negative logits of every token of the prompt or the output, frequency subtracts
 * per output occurrence, presence once): equal on every element over random rows, ids and
 * settings; a reference with one rule wrong (the sign, presence per occurrence, repetition on
 * the output alone, the bias after the penalties) differs. A case worked by hand. The
 * token-count map agrees with dense counts over thousands of ids, growing as it fills.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/logits.h"
#include "kernels/sample.h"
#include "tests/testutil.h"

#define LN 48 /* vocabulary of the processors' tests */

struct lcase {
	int prompt[40], np, out[40], no;
	int min_tokens, stop[4], nstop;
	struct dps_logit_bias bias[6];
	int nbias;
	struct dps_penalties pen;
};

/* A fault for the reference to carry, to show that the comparison can fail. */
enum lfault { LF_NONE, LF_REP_SIGN, LF_PRESENCE_PER_TOKEN, LF_REP_OUTPUT_ONLY, LF_BIAS_AFTER };

/*
 * vLLM's processors from its formulas (sampler.py's order; apply_penalties on bin counts):
 * dense counts of the prompt and the output, then every rule on the whole row.
 */
static void rules_ref(float *l, const struct lcase *c, enum lfault fault)
{
	int pc[LN] = { 0 }, oc[LN] = { 0 };
	const float rep = c->pen.repetition;

	for (int i = 0; i < c->np; i++)
		pc[c->prompt[i]]++;
	for (int i = 0; i < c->no; i++)
		oc[c->out[i]]++;
	if (c->no < c->min_tokens)
		for (int i = 0; i < c->nstop; i++)
			l[c->stop[i]] = -INFINITY;
	if (fault != LF_BIAS_AFTER)
		for (int i = 0; i < c->nbias; i++)
			l[c->bias[i].id] += c->bias[i].bias;
	for (int v = 0; v < LN; v++) {
		const int seen = fault == LF_REP_OUTPUT_ONLY ? oc[v] > 0 : pc[v] || oc[v];

		if (rep != 0.0f && rep != 1.0f && seen)
			l[v] = l[v] > 0 || fault == LF_REP_SIGN ? l[v] / rep : l[v] * rep;
	}
	for (int v = 0; v < LN; v++)
		l[v] -= c->pen.frequency * (float)oc[v];
	for (int v = 0; v < LN; v++)
		l[v] -= c->pen.presence * (fault == LF_PRESENCE_PER_TOKEN ? (float)oc[v] :
					   (float)(oc[v] > 0));
	if (fault == LF_BIAS_AFTER)
		for (int i = 0; i < c->nbias; i++)
			l[c->bias[i].id] += c->bias[i].bias;
}

/* What the scheduler does: the map of seen tokens, then the three kernels in order. */
static void rules_lib(float *l, const struct lcase *c)
{
	struct dps_seen s = { 0 };

	for (int i = 0; i < c->np; i++)
		ck_assert_int_eq(dps_seen_add(&s, c->prompt[i], 0), 0);
	for (int i = 0; i < c->no; i++)
		ck_assert_int_eq(dps_seen_add(&s, c->out[i], 1), 0);
	if (c->no < c->min_tokens)
		dps_logits_mask(l, LN, c->stop, c->nstop);
	dps_logits_bias(l, LN, c->bias, c->nbias);
	if (dps_penalties_on(&c->pen))
		dps_logits_penalize(l, LN, &c->pen, &s);
	dps_seen_free(&s);
}

static void lcase_draw(struct lcase *c, struct dps_rng *r, float *row)
{
	static const float reps[5] = { 1.0f, 0.5f, 1.3f, 2.0f, 0.0f };
	const int nr = (int)(dps_rng_uniform(r) * 5);

	memset(c, 0, sizeof(*c));
	for (int v = 0; v < LN; v++)
		row[v] = (dps_rng_uniform(r) - 0.5f) * 8.0f;
	row[(int)(dps_rng_uniform(r) * LN)] = 0.0f; /* a zero logit: neither sign */
	c->np = 1 + (int)(dps_rng_uniform(r) * 39);
	for (int i = 0; i < c->np; i++)
		c->prompt[i] = (int)(dps_rng_uniform(r) * LN / 2); /* repeats likely */
	c->no = (int)(dps_rng_uniform(r) * 40);
	for (int i = 0; i < c->no; i++)
		c->out[i] = LN / 4 + (int)(dps_rng_uniform(r) * LN / 2);
	c->min_tokens = (int)(dps_rng_uniform(r) * 50);
	c->nstop = (int)(dps_rng_uniform(r) * 4);
	for (int i = 0; i < c->nstop; i++)
		c->stop[i] = (int)(dps_rng_uniform(r) * LN);
	c->nbias = (int)(dps_rng_uniform(r) * 6);
	for (int i = 0; i < c->nbias; i++)
		c->bias[i] = (struct dps_logit_bias){ (int)(dps_rng_uniform(r) * LN),
						      (dps_rng_uniform(r) - 0.5f) * 200.0f };
	c->pen.repetition = reps[nr];
	c->pen.presence = dps_rng_uniform(r) < 0.3f ? 0.0f : (dps_rng_uniform(r) - 0.5f) * 4.0f;
	c->pen.frequency = dps_rng_uniform(r) < 0.3f ? 0.0f : (dps_rng_uniform(r) - 0.5f) * 4.0f;
}

/* Cases of seed where the library and the reference with fault differ (0: all agree). */
static int rules_mismatches(uint64_t seed, int cases, enum lfault fault)
{
	struct dps_rng r;
	int bad = 0;

	dps_rng_seed(&r, seed);
	for (int k = 0; k < cases; k++) {
		struct lcase c;
		float a[LN], b[LN];
		int differ = 0;

		lcase_draw(&c, &r, a);
		memcpy(b, a, sizeof(a));
		rules_ref(a, &c, fault);
		rules_lib(b, &c);
		for (int v = 0; v < LN; v++)
			differ |= !(a[v] == b[v]); /* -0 equals 0; -inf equals -inf */
		bad += differ;
	}
	return bad;
}

START_TEST(test_logits_rules)
{
	ck_assert_int_eq(rules_mismatches(31, 2000, LF_NONE), 0);
	/* The comparison can fail: each wrong rule is caught in some case. */
	ck_assert_int_gt(rules_mismatches(31, 2000, LF_REP_SIGN), 0);
	ck_assert_int_gt(rules_mismatches(31, 2000, LF_PRESENCE_PER_TOKEN), 0);
	ck_assert_int_gt(rules_mismatches(31, 2000, LF_REP_OUTPUT_ONLY), 0);
	ck_assert_int_gt(rules_mismatches(31, 2000, LF_BIAS_AFTER), 0);
}
END_TEST

START_TEST(test_logits_known)
{
	/* By hand: token 1 in the prompt, token 2 twice in the output, token 3 never seen. */
	float l[4] = { 1.0f, 2.0f, -2.0f, 3.0f };
	struct dps_seen s = { 0 };
	const struct dps_penalties pen = { 2.0f, 0.5f, 0.25f };
	const struct dps_logit_bias b = { 3, -1.0f };
	const int stop = 0;

	ck_assert_int_eq(dps_seen_add(&s, 1, 0), 0);
	ck_assert_int_eq(dps_seen_add(&s, 2, 1), 0);
	ck_assert_int_eq(dps_seen_add(&s, 2, 1), 0);
	ck_assert_int_eq(dps_seen_add(&s, -1, 1), -EINVAL);
	dps_logits_mask(l, 4, &stop, 1);
	dps_logits_bias(l, 4, &b, 1);
	dps_logits_penalize(l, 4, &pen, &s);
	ck_assert(isinf(l[0]) && l[0] < 0);
	ck_assert(l[1] == 1.0f);                       /* 2 / 2 */
	ck_assert(l[2] == -4.0f - 2 * 0.25f - 0.5f);   /* -2 x 2, then frequency and presence */
	ck_assert(l[3] == 2.0f);                       /* the bias alone */
	dps_seen_free(&s);
}
END_TEST

START_TEST(test_seen_map)
{
	enum { V = 20000, ADDS = 60000 };
	static uint32_t out[V], prompt[V];
	struct dps_seen s = { 0 };
	struct dps_rng r;
	uint32_t distinct = 0;

	memset(out, 0, sizeof(out));
	memset(prompt, 0, sizeof(prompt));
	dps_rng_seed(&r, 3);
	for (int i = 0; i < ADDS; i++) {
		const int id = (int)(dps_rng_uniform(&r) * (i < ADDS / 2 ? V : V / 8));
		const int o = i % 3 != 0;

		distinct += !out[id] && !prompt[id];
		if (o)
			out[id]++;
		else
			prompt[id] = 1;
		ck_assert_int_eq(dps_seen_add(&s, id, o), 0);
	}
	ck_assert_uint_eq(s.n, distinct);
	ck_assert_uint_le(s.cap, 4 * distinct + 64); /* bounded by what was seen */
	for (int id = 0; id < V; id++) {
		const struct dps_seen_slot *e = dps_seen_find(&s, id);

		if (!out[id] && !prompt[id]) {
			ck_assert_ptr_null(e);
			continue;
		}
		ck_assert_ptr_nonnull(e);
		ck_assert_uint_eq(e->out, out[id]);
		ck_assert_uint_eq(e->prompt, prompt[id]);
	}
	dps_seen_free(&s);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("logits");
	TCase *tc = tcase_create("logits");

	tcase_add_test(tc, test_logits_rules);
	tcase_add_test(tc, test_logits_known);
	tcase_add_test(tc, test_seen_map);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
