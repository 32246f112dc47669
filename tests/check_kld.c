/* SPDX-License-Identifier: MIT */
/*
 * tests/check_kld.c - the statistics of `bench accuracy` (kernels/kld.h). Oracles: a
 * two-token case worked by hand (P = (1/4, 3/4), Q = (1/2, 1/2)), and on random rows a naive
 * evaluation of the definitions here, in long double, straight from exp and log without the
 * max shift, and the uncertainties from the deviations around the mean (two passes) rather
 * than the sums of squares. A row against itself gives exactly 0 and agreement; the check
 * can fail: the divergence the wrong way round, KL(Q || P), is not what is reported.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/kld.h"

START_TEST(test_by_hand)
{
	/* logits (0, ln 3) give P = (1/4, 3/4); (5, 5) give Q = (1/2, 1/2); the text's token 1. */
	const float p[2] = { 0.0f, (float)log(3.0) }, q[2] = { 5.0f, 5.0f };
	struct dps_kld a = { 0 };
	struct dps_kld_summary s;
	const double pf = (double)p[1]; /* ln 3 as the float holds it */
	const double p1 = 1.0 / (1.0 + exp(-pf)), p0 = 1.0 - p1;
	/* sum P ln(P / Q), written out */
	const double want = p0 * log(p0 / 0.5) + p1 * log(p1 / 0.5);

	ck_assert_int_eq(dps_kld_add(&a, p, q, 2, 1), 0);
	dps_kld_summarize(&a, &s);
	ck_assert_msg(fabs(s.kld - want) < 1e-15, "KLD %.17g, want %.17g", s.kld, want);
	ck_assert(fabs(s.kld - 0.1308120333) < 1e-7); /* 1/4 ln(1/2) + 3/4 ln(3/2) */
	/* top: P's is token 1; Q's two equal logits give token 0 (the lower id) */
	ck_assert_uint_eq(a.same_top, 0);
	ck_assert(fabs(s.ppl_p - 1.0 / p1) < 1e-12);   /* exp(-ln 3/4) = 4/3 */
	ck_assert(fabs(s.ppl_q - 2.0) < 1e-12);
	ck_assert(fabs(s.dp_mean - (0.5 - p1)) < 1e-15); /* -1/4 */
	ck_assert(fabs(s.ln_ratio - log(2.0 * p1)) < 1e-12);
	ck_assert_uint_eq(s.count, 1);
	ck_assert(s.kld_se == 0.0); /* one position: no error */
	/* The check can fail: the reverse divergence is another number. */
	{
		const double rev = 0.5 * log(0.5 / p0) + 0.5 * log(0.5 / p1);

		ck_assert(fabs(s.kld - rev) > 1e-3);
	}
}
END_TEST

static float frand(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (float)((*s >> 8) & 0xffff) / 8192.0f - 4.0f;
}

START_TEST(test_against_naive)
{
	enum { N = 200, V = 37 };
	static float p[N][V], q[N][V];
	static long double kl[N], np[N], nq[N], dp[N];
	int y[N], same = 0;
	unsigned seed = 3;
	struct dps_kld a = { 0 }, b = { 0 };
	struct dps_kld_summary s;
	long double mk = 0, mp = 0, mq = 0, md = 0, vk = 0, vp = 0, vq = 0, vr = 0, rms = 0, mx = 0;

	for (int r = 0; r < N; r++) {
		long double zp = 0, zq = 0;
		int tp = 0, tq = 0;

		for (int i = 0; i < V; i++) {
			p[r][i] = frand(&seed);
			/* Q: P disturbed a little, sometimes a lot (so the tops differ now and then) */
			q[r][i] = p[r][i] + frand(&seed) * (r % 5 ? 0.01f : 0.5f);
			zp += expl((long double)p[r][i]);
			zq += expl((long double)q[r][i]);
			tp = p[r][i] > p[r][tp] ? i : tp;
			tq = q[r][i] > q[r][tq] ? i : tq;
		}
		y[r] = (int)(seed % V);
		kl[r] = 0;
		for (int i = 0; i < V; i++) {
			const long double pi = expl((long double)p[r][i]) / zp;
			const long double qi = expl((long double)q[r][i]) / zq;

			kl[r] += pi * logl(pi / qi);
		}
		np[r] = -logl(expl((long double)p[r][y[r]]) / zp);
		nq[r] = -logl(expl((long double)q[r][y[r]]) / zq);
		dp[r] = expl(-nq[r]) - expl(-np[r]);
		same += tp == tq;
		ck_assert_int_eq(dps_kld_add(&a, p[r], q[r], V, y[r]), 0);
		ck_assert_int_eq(dps_kld_add(&b, p[r], p[r], V, y[r]), 0);
	}
	for (int r = 0; r < N; r++) {
		mk += kl[r] / N;
		mp += np[r] / N;
		mq += nq[r] / N;
		md += dp[r] / N;
		rms += dp[r] * dp[r] / N;
		mx = kl[r] > mx ? kl[r] : mx;
	}
	for (int r = 0; r < N; r++) {
		const long double dr = (nq[r] - np[r]) - (mq - mp);

		vk += (kl[r] - mk) * (kl[r] - mk);
		vp += (np[r] - mp) * (np[r] - mp);
		vq += (nq[r] - mq) * (nq[r] - mq);
		vr += dr * dr;
	}
	/* the standard error of a mean: sqrt(sum (x - m)^2 / (N (N - 1))) */
	vk = sqrtl(vk / ((long double)N * (N - 1)));
	vp = sqrtl(vp / ((long double)N * (N - 1)));
	vq = sqrtl(vq / ((long double)N * (N - 1)));
	vr = sqrtl(vr / ((long double)N * (N - 1)));
	dps_kld_summarize(&a, &s);
	ck_assert_uint_eq(s.count, N);
	ck_assert_msg(fabsl(s.kld - mk) < 1e-12L * (1 + mk), "KLD %.17g, naive %.17Lg", s.kld, mk);
	ck_assert(fabsl(s.kld_se - vk) < 1e-9L * (1 + vk));
	ck_assert(fabsl(s.kld_max - mx) < 1e-12L);
	ck_assert(fabs(s.top1 - (double)same / N) < 1e-15);
	ck_assert(same > 0 && same < N); /* both outcomes occur */
	ck_assert(fabs(s.top1_se - sqrt(s.top1 * (1 - s.top1) / (N - 1))) < 1e-15);
	ck_assert(fabsl(s.ppl_p - expl(mp)) < 1e-9L * expl(mp));
	ck_assert(fabsl(s.ppl_q - expl(mq)) < 1e-9L * expl(mq));
	ck_assert(fabsl(s.ppl_p_se - expl(mp) * vp) < 1e-7L * (1 + expl(mp) * vp));
	ck_assert(fabsl(s.ppl_q_se - expl(mq) * vq) < 1e-7L * (1 + expl(mq) * vq));
	ck_assert(fabsl(s.ln_ratio - (mq - mp)) < 1e-12L);
	ck_assert_msg(fabsl(s.ln_ratio_se - vr) < 1e-6L * (1 + vr), "%.17g %.17Lg", s.ln_ratio_se,
		      vr);
	ck_assert(fabsl(s.dp_mean - md) < 1e-13L);
	ck_assert(fabsl(s.dp_rms - sqrtl(rms)) < 1e-12L);

	/* A model against itself: exactly 0, every top the same, equal perplexities. */
	dps_kld_summarize(&b, &s);
	ck_assert(s.kld == 0.0 && s.kld_max == 0.0 && s.kld_se == 0.0);
	ck_assert(s.top1 == 1.0 && s.ln_ratio == 0.0 && s.ppl_p == s.ppl_q && s.dp_rms == 0.0);
}
END_TEST

START_TEST(test_refused)
{
	const float l[3] = { 1.0f, 2.0f, 3.0f }, bad[3] = { 1.0f, NAN, 3.0f };
	const float inf[3] = { 1.0f, INFINITY, 3.0f };
	struct dps_kld a = { 0 };
	struct dps_kld_summary s;

	ck_assert_int_eq(dps_kld_add(&a, l, l, 3, 3), -EINVAL);
	ck_assert_int_eq(dps_kld_add(&a, l, l, 3, -1), -EINVAL);
	ck_assert_int_eq(dps_kld_add(&a, l, l, 0, 0), -EINVAL);
	ck_assert_int_eq(dps_kld_add(&a, l, bad, 3, 0), -EDOM);
	ck_assert_int_eq(dps_kld_add(&a, inf, l, 3, 0), -EDOM);
	ck_assert_uint_eq(a.count, 0);
	dps_kld_summarize(&a, &s);
	ck_assert(s.count == 0 && s.kld == 0.0 && s.ppl_p == 0.0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kld");
	TCase *tc = tcase_create("kld");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_by_hand);
	tcase_add_test(tc, test_against_naive);
	tcase_add_test(tc, test_refused);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
