/* SPDX-License-Identifier: MIT */
/*
 * kernels/ref.c - plain-C reference kernels (see kernels.h): the oracle the fast kernels are
 * compared with, and the path a single rank uses until the BLIS-backed ones are in.
 */
#include <math.h>

#include "kernels/kernels.h"

void dps_rmsnorm_ref(float *out, const float *x, const float *restrict w, int n, float eps)
{
	float ss = 0.0f;

	for (int i = 0; i < n; i++)
		ss += x[i] * x[i];
	ss /= (float)n;
	ss += eps;
	ss = 1.0f / sqrtf(ss);
	for (int i = 0; i < n; i++)
		out[i] = w[i] * (ss * x[i]);
}

void dps_matvec_ref(float *restrict out, const float *restrict x, const float *restrict W,
		    int rows, int cols)
{
	for (int r = 0; r < rows; r++) {
		const float *row = W + (size_t)r * (size_t)cols;
		float acc = 0.0f;

		for (int c = 0; c < cols; c++)
			acc += row[c] * x[c];
		out[r] = acc;
	}
}

void dps_rope_table(float *cs, int head_dim, int pos, float theta)
{
	const int half = head_dim / 2;

	for (int j = 0; j < half; j++) {
		const float freq = 1.0f / powf(theta, (float)(2 * j) / (float)head_dim);
		const float a = (float)pos * freq;

		cs[j] = cosf(a);
		cs[half + j] = sinf(a);
	}
}

void dps_rope_table_freqs(float *cs, int head_dim, int pos, const float *inv_freq,
			  float attn_factor)
{
	const int half = head_dim / 2;

	for (int j = 0; j < half; j++) {
		const float a = (float)pos * inv_freq[j];

		cs[j] = cosf(a) * attn_factor;
		cs[half + j] = sinf(a) * attn_factor;
	}
}

void dps_rope_ref(float *restrict x, int n_heads, int head_dim, const float *restrict cs)
{
	const int half = head_dim / 2;

	for (int h = 0; h < n_heads; h++) {
		float *v = x + (size_t)h * (size_t)head_dim;

		for (int j = 0; j < half; j++) {
			const float c = cs[j], s = cs[half + j];
			const float x0 = v[j], x1 = v[j + half];

			v[j] = x0 * c - x1 * s;
			v[j + half] = x0 * s + x1 * c;
		}
	}
}

void dps_softmax_ref(float *x, int n)
{
	float max = x[0], sum = 0.0f;

	for (int i = 1; i < n; i++)
		if (x[i] > max)
			max = x[i];
	for (int i = 0; i < n; i++) {
		x[i] = expf(x[i] - max);
		sum += x[i];
	}
	for (int i = 0; i < n; i++)
		x[i] /= sum;
}

void dps_swiglu_ref(float *restrict g, const float *restrict u, int n)
{
	for (int i = 0; i < n; i++)
		g[i] = g[i] * (1.0f / (1.0f + expf(-g[i]))) * u[i];
}

int dps_argmax_ref(const float *x, int n)
{
	int best = 0;

	for (int i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

void dps_embedding_ref(float *restrict out, const float *restrict table, int dim, int token)
{
	const float *row = table + (size_t)token * (size_t)dim;

	for (int i = 0; i < dim; i++)
		out[i] = row[i];
}

/* Softmax of scratch[first..n_pos) and the sink logit (when given), then the weighted values. */
static void attend_values(float *restrict out, const float *restrict v, const int *table,
			  int block_size, size_t block_stride, int first, int n_pos, int head_dim,
			  size_t kv_stride, const float *sink, float *restrict p)
{
	float max = sink ? *sink : p[first], sum = 0.0f;

	for (int t = first; t < n_pos; t++)
		if (p[t] > max)
			max = p[t];
	for (int t = first; t < n_pos; t++) {
		p[t] = expf(p[t] - max);
		sum += p[t];
	}
	if (sink)
		sum += expf(*sink - max);
	for (int t = first; t < n_pos; t++)
		p[t] /= sum;
	for (int i = 0; i < head_dim; i++)
		out[i] = 0.0f;
	for (int t = first; t < n_pos; t++) {
		const size_t at = (size_t)table[t / block_size] * block_stride +
				  (size_t)(t % block_size) * kv_stride;

		for (int i = 0; i < head_dim; i++)
			out[i] += p[t] * v[at + (size_t)i];
	}
}

void dps_attention_paged_ref(float *restrict out, const float *restrict q,
			     const float *restrict k, const float *restrict v,
			     const int *restrict table, int block_size, size_t block_stride,
			     int first, int n_pos, int head_dim, size_t kv_stride,
			     const float *sink, float *restrict scratch)
{
	const float scale = 1.0f / sqrtf((float)head_dim);

	for (int t = first; t < n_pos; t++) {
		const size_t at = (size_t)table[t / block_size] * block_stride +
				  (size_t)(t % block_size) * kv_stride;
		float s = 0.0f;

		for (int i = 0; i < head_dim; i++)
			s += q[i] * k[at + (size_t)i];
		scratch[t] = s * scale;
	}
	attend_values(out, v, table, block_size, block_stride, first, n_pos, head_dim, kv_stride,
		      sink, scratch);
}

void dps_attention_ref(float *restrict out, const float *restrict q, const float *restrict k,
		       const float *restrict v, int first, int n_pos, int head_dim,
		       size_t kv_stride, const float *sink, float *restrict scratch)
{
	static const int one_block[1] = { 0 };

	/* Contiguous positions are one block of n_pos positions. */
	dps_attention_paged_ref(out, q, k, v, one_block, n_pos, 0, first, n_pos, head_dim,
				kv_stride, sink, scratch);
}

void dps_swiglu_clamped_ref(float *restrict g, const float *restrict u, int n, float limit)
{
	for (int i = 0; i < n; i++) {
		const float gi = g[i] < limit ? g[i] : limit;
		const float ui = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];

		g[i] = (ui + 1.0f) * (gi * (1.0f / (1.0f + expf(-1.702f * gi))));
	}
}

void dps_moe_route(const float *logits, int n, int k, int *experts, float *weights)
{
	float max, sum = 0.0f;

	/* Selection by repeated maximum: k is small (up to a few dozen). */
	for (int j = 0; j < k; j++) {
		int best = -1;

		for (int e = 0; e < n; e++) {
			int taken = 0;

			for (int q = 0; q < j && !taken; q++)
				taken = experts[q] == e;
			if (!taken && (best < 0 || logits[e] > logits[best]))
				best = e;
		}
		experts[j] = best;
	}
	max = logits[experts[0]];
	for (int j = 0; j < k; j++) {
		weights[j] = expf(logits[experts[j]] - max);
		sum += weights[j];
	}
	for (int j = 0; j < k; j++)
		weights[j] /= sum;
}
