/* SPDX-License-Identifier: MIT */
/*
 * kernels/kld.h - how far one model's next-token distributions are from another's, position
 * by position: the statistics llama.cpp's perplexity tool prints with --kl-divergence. P is
 * the base (the f32 model), Q the model under test (BF16 weights, later quantized ones). Per
 * position, from the two rows of logits and the text's next token y:
 *
 *   log P_i = l_i - max(l) - log(sum_j exp(l_j - max(l)))   (in double, the sum in id order;
 *                                                             the same for Q)
 *   KLD     = sum_i P_i (log P_i - log Q_i)                   (nats, the whole vocabulary)
 *   top-1   = [argmax P == argmax Q]                          (equal logits: the lower id)
 *   NLL_P   = -log P_y,  NLL_Q = -log Q_y,  dp = Q_y - P_y
 *
 * and over positions: the mean KLD with the standard error of the mean, sqrt((E[x^2] -
 * E[x]^2) / (N - 1)) as llama.cpp's mean_and_uncertainty; the top-1 agreement with
 * sqrt(p (1 - p) / (N - 1)); each model's perplexity exp(mean NLL) with the error of its mean
 * NLL carried through (PPL * se); ln(PPL_Q / PPL_P) = mean(NLL_Q - NLL_P) with its own
 * standard error (the pairs are correlated); the mean and RMS of dp; the largest KLD.
 * Called by `dpshard bench accuracy` (tools/bench_accuracy.c). Plain C, serial: the same rows
 * give the same bits on every run; a model compared with itself gives exactly 0 and 100%.
 */
#ifndef DPS_KERNELS_KLD_H
#define DPS_KERNELS_KLD_H

#include <stdint.h>

/* Sums over the positions added so far (zero it to start). */
struct dps_kld {
	double sum_kld, sum_kld2, max_kld;
	double sum_nll_p, sum_nll_p2, sum_nll_q, sum_nll_q2, sum_nll_pq;
	double sum_dp, sum_dp2;
	uint64_t same_top, count;
};

struct dps_kld_summary {
	uint64_t count;
	double kld, kld_se, kld_max;
	double top1, top1_se;          /* fractions, 0..1 */
	double ppl_p, ppl_p_se, ppl_q, ppl_q_se;
	double ln_ratio, ln_ratio_se;  /* ln(PPL_Q / PPL_P) */
	double dp_mean, dp_rms;
};

/*
 * Adds one position: p and q are the two models' logits (n each, not modified), y the text's
 * next token. Returns 0, -EINVAL when n < 1 or y is not in [0, n), or -EDOM when a logit is
 * not finite (nothing is added then).
 */
int dps_kld_add(struct dps_kld *a, const float *p, const float *q, int n, int y);

/* The statistics of the positions added (errors 0 below two positions; all 0 with none). */
void dps_kld_summarize(const struct dps_kld *a, struct dps_kld_summary *s);

#endif
