/* SPDX-License-Identifier: MIT */
/*
 * kernels/kernels.h - the numerical kernels of the decoder. Each exists as a plain-C
 * reference (the _ref functions, written for clarity, one element at a time) that the fast
 * versions are tested against. They know nothing of ranks: a sharded caller passes its slice.
 *
 * Conventions: row-major; a weight W of shape (rows, cols) maps x (cols) to
 * out[r] = sum_c W[r*cols + c] * x[c], as a Hugging Face Linear does.
 */
#ifndef DPS_KERNELS_H
#define DPS_KERNELS_H

#include <stddef.h>

/* out = w * x / sqrt(mean(x^2) + eps), n elements. out may alias x. */
void dps_rmsnorm_ref(float *out, const float *x, const float *restrict w, int n, float eps);

/* out[r] = W[r,:] . x for r < rows (W is rows x cols). */
void dps_matvec_ref(float *restrict out, const float *restrict x, const float *restrict W,
		    int rows, int cols);

/*
 * Rotary embedding in Hugging Face's half-split layout. dps_rope_table writes the cos and sin
 * of one position's angles, pos * theta^(-2j/head_dim) for j < head_dim/2 (cs: head_dim
 * floats, the cosines first), once for every layer and both paths (it is not a hot loop, so
 * it has one implementation); dps_rope_ref rotates, in place, element j and j + head_dim/2 of
 * each of n_heads heads by them.
 */
void dps_rope_table(float *cs, int head_dim, int pos, float theta);

/*
 * The same for any RoPE variant: the angles pos * inv_freq[j] (j < head_dim / 2, from
 * dps_cfg_rope_freqs), cos and sin each multiplied by attn_factor (YaRN's; 1 otherwise).
 */
void dps_rope_table_freqs(float *cs, int head_dim, int pos, const float *inv_freq,
			  float attn_factor);
void dps_rope_ref(float *restrict x, int n_heads, int head_dim, const float *restrict cs);

/* rows (n, width) += bias (width) in every row: a Linear's bias; one definition (kernels/fast.c:
 * sixteen at a time with AVX-512, a plain loop otherwise; the same additions either way). */
void dps_add_bias(float *restrict rows, const float *restrict bias, int n, int width);

/* In-place softmax of n values. */
void dps_softmax_ref(float *x, int n);

/* g[i] = silu(g[i]) * u[i]; g and u do not overlap. */
void dps_swiglu_ref(float *restrict g, const float *restrict u, int n);

/*
 * GPT-OSS's clamped SwiGLU: g = min(g, limit), u = clamp(u, -limit, limit),
 * g[i] = (u + 1) * g * sigmoid(1.702 * g).
 */
void dps_swiglu_clamped_ref(float *restrict g, const float *restrict u, int n, float limit);

/*
 * MoE routing of one token: the k largest of n router logits (ties to the lower expert), in
 * descending order, into experts[k], and their softmax (over those k only) into weights[k].
 * Deterministic; its test compares it with a brute-force choice.
 */
void dps_moe_route(const float *logits, int n, int k, int *experts, float *weights);

/* Index of the largest value, the lowest index among equals. */
int dps_argmax_ref(const float *x, int n);

/*
 * Single-query attention over positions first..n_pos-1 for one query head (first > 0: a
 * sliding window): q (head_dim), keys and values with stride kv_stride floats between
 * positions (position t at k + t * kv_stride). out (head_dim) = sum_t p_t v_t, where p is the
 * softmax of the scores q.k_t / sqrt(head_dim) and, when sink is not NULL, of one more logit
 * *sink (GPT-OSS's attention sink: it takes its share of the mass and adds no value).
 * scratch holds n_pos floats. 0 <= first < n_pos.
 */
void dps_attention_ref(float *restrict out, const float *restrict q, const float *restrict k,
		       const float *restrict v, int first, int n_pos, int head_dim,
		       size_t kv_stride, const float *sink, float *restrict scratch);

/*
 * The same over a paged KV cache: position t's key is at k + table[t / block_size] *
 * block_stride + (t % block_size) * kv_stride (floats), its value likewise from v.
 */
void dps_attention_paged_ref(float *restrict out, const float *restrict q,
			     const float *restrict k, const float *restrict v,
			     const int *restrict table, int block_size, size_t block_stride,
			     int first, int n_pos, int head_dim, size_t kv_stride,
			     const float *sink, float *restrict scratch);

/* out = row token of table (dim floats per row): the embedding lookup. */
void dps_embedding_ref(float *restrict out, const float *restrict table, int dim, int token);

/*
 * The fast twins (kernels/fast.c): the same signatures and contracts, results within rounding
 * of the references.
 */
void dps_rmsnorm(float *out, const float *x, const float *restrict w, int n, float eps);
void dps_rope(float *restrict x, int n_heads, int head_dim, const float *restrict cs);
void dps_softmax(float *x, int n);
/* x[i] / t for every i (a division), then dps_softmax: the sampler's temperature (t > 0 and
 * finite). A row with a NaN gives every probability NaN, as the reference does. */
void dps_softmax_temp(float *x, int n, float t);
void dps_swiglu(float *restrict g, const float *restrict u, int n);
void dps_swiglu_clamped(float *restrict g, const float *restrict u, int n, float limit);
void dps_embedding(float *restrict out, const float *restrict table, int dim, int token);
/* (This one gives exactly the reference's index, NaNs and equal values included.) */
int dps_argmax(const float *x, int n);
void dps_attention(float *restrict out, const float *restrict q, const float *restrict k,
		   const float *restrict v, int first, int n_pos, int head_dim, size_t kv_stride,
		   const float *sink, float *restrict scratch);
void dps_attention_paged(float *restrict out, const float *restrict q, const float *restrict k,
			 const float *restrict v, const int *restrict table, int block_size,
			 size_t block_stride, int first, int n_pos, int head_dim, size_t kv_stride,
			 const float *sink, float *restrict scratch);

/*
 * nh (1 .. DPS_ATTN_HEADS) heads of one row at once: head x's query at q + x * q_stride, its
 * keys and values at k + off[x] and v + off[x] in each position's row (paged as above), its
 * sink at sinks[x] (sinks may be NULL), its output at out + x * out_stride, its scores at
 * scratch + x * s_stride (s_stride >= n_pos). Each head's output is, bit for bit, what
 * dps_attention_paged gives it alone; with AVX-512 and a head_dim of 64 or 128 the heads
 * read each position's keys and values together (one pass), otherwise one head at a time.
 */
#define DPS_ATTN_HEADS 4
void dps_attention_paged_heads(float *restrict out, size_t out_stride, const float *restrict q,
			       size_t q_stride, int nh, const size_t *off,
			       const float *restrict k, const float *restrict v,
			       const int *restrict table, int block_size, size_t block_stride,
			       int first, int n_pos, int head_dim, size_t kv_stride,
			       const float *sinks, float *restrict scratch, size_t s_stride);

/*
 * The two paths dps_attention_paged chooses between at run time, for the tests to reach
 * both: the first requires AVX-512F, the second AVX2 and FMA; the caller checks.
 */
void dps_attention_paged_avx512(float *restrict out, const float *restrict q,
				const float *restrict k, const float *restrict v,
				const int *restrict table, int block_size, size_t block_stride,
				int first, int n_pos, int head_dim, size_t kv_stride,
				const float *sink, float *restrict scratch);
void dps_attention_paged_avx2(float *restrict out, const float *restrict q,
			      const float *restrict k, const float *restrict v,
			      const int *restrict table, int block_size, size_t block_stride,
			      int first, int n_pos, int head_dim, size_t kv_stride,
			      const float *sink, float *restrict scratch);

#endif
