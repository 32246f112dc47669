/* SPDX-License-Identifier: MIT */
/*
 * kernels/logprobs.c - log-softmax and a partial top-k over one row of logits (see
 * logprobs.h). A row costs one pass for the maximum, one for the sum and one for the top k;
 * only requests that ask for log-probabilities pay it.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kernels/logprobs.h"

int dps_logprobs(const float *logits, int n, int token, int k, struct dps_token_logprobs *out)
{
	double mx = -INFINITY, sum = 0.0, lse;
	int n_top = 0;

	if (n < 1 || token < 0 || token >= n || k < 0 || k > DPS_MAX_LOGPROBS)
		return -EINVAL;
	/* Assumptions: logits contiguous, n values; -inf entries have probability 0. */
	for (int i = 0; i < n; i++)
		if (logits[i] > mx)
			mx = logits[i];
	if (mx == -INFINITY) {
		mx = 0.0; /* every entry -inf (or NaN): no distribution; all stay -inf */
		sum = 0.0;
	} else {
		for (int i = 0; i < n; i++)
			sum += exp((double)logits[i] - mx);
	}
	lse = sum > 0.0 ? mx + log(sum) : INFINITY;
	memset(out, 0, sizeof(*out));
	out->token = token;
	out->logprob = (float)((double)logits[token] - lse);
	/*
	 * The k largest in a sorted array, scanning ids upwards: an entry goes in only when
	 * strictly larger than the last kept (or while fewer than k are kept), and after every
	 * kept entry that is not smaller, so that equal logits keep the lower id first.
	 */
	for (int i = 0; i < n && k > 0; i++) {
		const float l = logits[i];
		int at;

		if (l != l || (n_top == k && !(l > logits[out->top[k - 1].id])))
			continue;
		at = n_top < k ? n_top : k - 1;
		while (at > 0 && logits[out->top[at - 1].id] < l) {
			out->top[at] = out->top[at - 1];
			at--;
		}
		out->top[at].id = i;
		if (n_top < k)
			n_top++;
	}
	for (int j = 0; j < n_top; j++)
		out->top[j].logprob = (float)((double)logits[out->top[j].id] - lse);
	out->n_top = n_top;
	return 0;
}
