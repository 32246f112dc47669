/* SPDX-License-Identifier: MIT */
/*
 * kernels/kld.c - the KL divergence and top-1 agreement of two models' next-token
 * distributions (kernels/kld.h has the definitions).
 */
#include <errno.h>
#include <math.h>

#include "kernels/kld.h"

/* The log of the softmax's denominator, max + log(sum exp(l - max)), and the argmax (the
 * lower id on equal logits), in double. -EDOM when a logit is not finite. */
static int log_norm(const float *l, int n, double *lse, int *top)
{
	double mx = l[0], s = 0.0;
	int best = 0;

	for (int i = 0; i < n; i++) {
		if (!isfinite(l[i]))
			return -EDOM;
		if (l[i] > mx) {
			mx = l[i];
			best = i;
		}
	}
	for (int i = 0; i < n; i++)
		s += exp((double)l[i] - mx);
	*lse = mx + log(s);
	*top = best;
	return 0;
}

int dps_kld_add(struct dps_kld *a, const float *p, const float *q, int n, int y)
{
	double zp, zq, kld = 0.0;
	int tp, tq, rc;

	if (n < 1 || y < 0 || y >= n)
		return -EINVAL;
	rc = log_norm(p, n, &zp, &tp);
	if (!rc)
		rc = log_norm(q, n, &zq, &tq);
	if (rc)
		return rc;
	for (int i = 0; i < n; i++) {
		const double lp = (double)p[i] - zp, lq = (double)q[i] - zq;

		kld += exp(lp) * (lp - lq);
	}
	{
		const double nll_p = zp - (double)p[y], nll_q = zq - (double)q[y];
		const double dp = exp(-nll_q) - exp(-nll_p);

		a->sum_kld += kld;
		a->sum_kld2 += kld * kld;
		if (kld > a->max_kld || !a->count)
			a->max_kld = kld;
		a->sum_nll_p += nll_p;
		a->sum_nll_p2 += nll_p * nll_p;
		a->sum_nll_q += nll_q;
		a->sum_nll_q2 += nll_q * nll_q;
		a->sum_nll_pq += nll_p * nll_q;
		a->sum_dp += dp;
		a->sum_dp2 += dp * dp;
		a->same_top += tp == tq;
		a->count++;
	}
	return 0;
}

/* The standard error of a mean from the sums of x and x^2 over n values (0 below 2). */
static double mean_se(double sum, double sum2, double n)
{
	const double m = sum / n, var = sum2 / n - m * m;

	return n > 1 && var > 0 ? sqrt(var / (n - 1)) : 0.0;
}

void dps_kld_summarize(const struct dps_kld *a, struct dps_kld_summary *s)
{
	const double n = (double)a->count;

	*s = (struct dps_kld_summary){ .count = a->count };
	if (!a->count)
		return;
	s->kld = a->sum_kld / n;
	s->kld_se = mean_se(a->sum_kld, a->sum_kld2, n);
	s->kld_max = a->max_kld;
	s->top1 = (double)a->same_top / n;
	s->top1_se = n > 1 ? sqrt(s->top1 * (1.0 - s->top1) / (n - 1)) : 0.0;
	s->ppl_p = exp(a->sum_nll_p / n);
	s->ppl_p_se = s->ppl_p * mean_se(a->sum_nll_p, a->sum_nll_p2, n);
	s->ppl_q = exp(a->sum_nll_q / n);
	s->ppl_q_se = s->ppl_q * mean_se(a->sum_nll_q, a->sum_nll_q2, n);
	/* NLL_Q - NLL_P: its sum of squares from the three sums kept. */
	s->ln_ratio = (a->sum_nll_q - a->sum_nll_p) / n;
	s->ln_ratio_se = mean_se(a->sum_nll_q - a->sum_nll_p,
				 a->sum_nll_q2 - 2.0 * a->sum_nll_pq + a->sum_nll_p2, n);
	s->dp_mean = a->sum_dp / n;
	s->dp_rms = sqrt(a->sum_dp2 / n);
}
