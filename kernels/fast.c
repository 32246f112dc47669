/* SPDX-License-Identifier: MIT */
/*
 * kernels/fast.c - the fast twins of the reference kernels (see kernels.h): AVX-512 where the
 * CPU has it, the reference otherwise (attention also has an AVX2 path, for the machines
 * without AVX-512). Sums run in a different order from the references (sixteen or eight
 * lanes, then a tree), and exp is a polynomial accurate to about 2 ulp, so results are equal
 * within rounding, not bit for bit; on one CPU they are deterministic.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "kernels/kernels.h"

static int have_avx512(void)
{
	static int known = -1;

	if (known < 0) {
		__builtin_cpu_init();
		known = __builtin_cpu_supports("avx512f") ? 1 : 0;
	}
	return known;
}

static int have_avx2(void)
{
	static int known = -1;

	if (known < 0) {
		__builtin_cpu_init();
		known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
	}
	return known;
}

/*
 * e^x for sixteen floats: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor polynomial to
 * degree 7 (relative error below 2e-8 on that range), then scaled by 2^n. Inputs below -104
 * give 0 and above 88.7 give +inf, as expf does.
 */
/* Assumptions: sixteen independent lanes; no memory. */
__attribute__((target("avx512f"))) static __m512 exp16(__m512 x)
{
	const __m512 lo = _mm512_set1_ps(-104.0f), hi = _mm512_set1_ps(88.8f);
	const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
	const __m512 ln2hi = _mm512_set1_ps(0.693359375f), ln2lo = _mm512_set1_ps(-2.12194440e-4f);
	__m512 n, r, p;

	x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
	n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT);
	r = _mm512_fnmadd_ps(n, ln2hi, x);
	r = _mm512_fnmadd_ps(n, ln2lo, r);
	p = _mm512_set1_ps(1.0f / 5040.0f);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
	return _mm512_scalef_ps(p, n);
}

/*
 * exp16's twin for eight floats, the same arithmetic: without scalef, 2^n (n in [-150, 128])
 * is two normal powers of two, 2^(n >> 1) and 2^(n - (n >> 1)); the first product is exact and
 * the second rounds once, to a subnormal, zero or infinity where scalef would, so both give
 * the same bits.
 */
/* Assumptions: eight independent lanes; no memory. */
__attribute__((target("avx2,fma"))) static __m256 exp8(__m256 x)
{
	const __m256 lo = _mm256_set1_ps(-104.0f), hi = _mm256_set1_ps(88.8f);
	const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
	const __m256 ln2hi = _mm256_set1_ps(0.693359375f), ln2lo = _mm256_set1_ps(-2.12194440e-4f);
	const __m256i bias = _mm256_set1_epi32(127);
	__m256 n, r, p;
	__m256i ni, n1;

	x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
	n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	r = _mm256_fnmadd_ps(n, ln2hi, x);
	r = _mm256_fnmadd_ps(n, ln2lo, r);
	p = _mm256_set1_ps(1.0f / 5040.0f);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	ni = _mm256_cvtps_epi32(n);
	n1 = _mm256_srai_epi32(ni, 1);
	p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
	return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(
					 _mm256_add_epi32(_mm256_sub_epi32(ni, n1), bias), 23)));
}

static inline __mmask16 tail_mask(int left)
{
	return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

/*
 * Assumptions: n >= 1, any alignment (the tail is a masked load); out may alias x (each
 * element is read before it is written); the sum of squares runs in 16 lanes, then reduced.
 */
__attribute__((target("avx512f"))) static void rmsnorm512(float *out, const float *x,
							  const float *restrict w, int n, float eps)
{
	__m512 acc = _mm512_setzero_ps(), s;
	float ss;

	for (int i = 0; i < n; i += 16) {
		const __m512 v = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);

		acc = _mm512_fmadd_ps(v, v, acc);
	}
	ss = _mm512_reduce_add_ps(acc) / (float)n + eps;
	s = _mm512_set1_ps(1.0f / sqrtf(ss));
	for (int i = 0; i < n; i += 16) {
		const __mmask16 m = tail_mask(n - i);
		const __m512 v = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, x + i));

		_mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), v));
	}
}

void dps_rmsnorm(float *out, const float *x, const float *restrict w, int n, float eps)
{
	if (have_avx512())
		rmsnorm512(out, x, w, n, eps);
	else
		dps_rmsnorm_ref(out, x, w, n, eps);
}

/*
 * Assumptions: head_dim even; cs from dps_rope_table (cos then sin of head_dim / 2 angles);
 * the two halves of a head are independent lanes, which the compiler vectorises.
 */
void dps_rope(float *restrict x, int n_heads, int head_dim, const float *restrict cs)
{
	const int half = head_dim / 2;
	const float *c = cs, *s = cs + half;

	for (int h = 0; h < n_heads; h++) {
		float *v0 = x + (size_t)h * (size_t)head_dim, *v1 = v0 + half;

		for (int j = 0; j < half; j++) {
			const float x0 = v0[j], x1 = v1[j];

			v0[j] = x0 * c[j] - x1 * s[j];
			v1[j] = x0 * s[j] + x1 * c[j];
		}
	}
}

/*
 * In-place softmax of x[0..n) and, when sink is not NULL, of one more logit *sink that joins
 * the max and the sum (and is not stored).
 * Assumptions: n >= 1, any alignment; three passes (max, exponentials and their 16-lane sum,
 * scale), masked loads for the tail, masked-out lanes -inf for the max and 0 for the sum.
 */
__attribute__((target("avx512f"))) static void softmax512(float *x, int n, const float *sink)
{
	__m512 vmax = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps(), inv;
	float max, total;

	for (int i = 0; i < n; i += 16)
		vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY),
								tail_mask(n - i), x + i));
	max = _mm512_reduce_max_ps(vmax);
	if (sink && *sink > max)
		max = *sink;
	vmax = _mm512_set1_ps(max);
	for (int i = 0; i < n; i += 16) {
		const __mmask16 m = tail_mask(n - i);
		const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmax));

		sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
		_mm512_mask_storeu_ps(x + i, m, e);
	}
	total = _mm512_reduce_add_ps(sum);
	if (sink)
		total += _mm512_cvtss_f32(exp16(_mm512_set1_ps(*sink - max)));
	inv = _mm512_set1_ps(1.0f / total);
	for (int i = 0; i < n; i += 16) {
		const __mmask16 m = tail_mask(n - i);

		_mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
	}
}

void dps_softmax(float *x, int n)
{
	if (have_avx512())
		softmax512(x, n, NULL);
	else
		dps_softmax_ref(x, n);
}

/* x[i] / t in place (a division, as the reference divides); whether no x[i] is NaN. */
__attribute__((target("avx512f"))) static int divide512(float *x, int n, float t)
{
	const __m512 tv = _mm512_set1_ps(t);
	__mmask16 nan = 0;

	for (int i = 0; i < n; i += 16) {
		const __mmask16 m = tail_mask(n - i);
		const __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), tv);

		nan |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
		_mm512_mask_storeu_ps(x + i, m, v);
	}
	return !nan;
}

/*
 * The sampler's softmax. A row with a NaN (a broken model) takes the reference, which makes
 * every probability NaN, as it always did: softmax512 would instead drop the NaN from the max
 * and give its token about 0 (exp16 clamps), depending on where the NaN sits.
 */
void dps_softmax_temp(float *x, int n, float t)
{
	if (have_avx512()) {
		if (divide512(x, n, t))
			softmax512(x, n, NULL);
		else
			dps_softmax_ref(x, n);
		return;
	}
	for (int i = 0; i < n; i++)
		x[i] /= t;
	dps_softmax_ref(x, n);
}

/* Sixteen sums at a time, masked tail: the same additions, so the same bits. */
__attribute__((target("avx512f"))) static void add_bias512(float *restrict rows,
							   const float *restrict bias, int n, int width)
{
	for (int i = 0; i < n; i++) {
		float *r = rows + (size_t)i * (size_t)width;

		for (int j = 0; j < width; j += 16) {
			const __mmask16 m = tail_mask(width - j);

			_mm512_mask_storeu_ps(r + j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, r + j),
								      _mm512_maskz_loadu_ps(m, bias + j)));
		}
	}
}

/* (GCC 12 at -O2 left the plain loop scalar: 1.5% of a GPT-OSS-shaped decode step, its
 * expert biases read from memory one float at a time.) */
void dps_add_bias(float *restrict rows, const float *restrict bias, int n, int width)
{
	if (have_avx512()) {
		add_bias512(rows, bias, n, width);
		return;
	}
	for (int i = 0; i < n; i++)
		for (int j = 0; j < width; j++)
			rows[(size_t)i * (size_t)width + (size_t)j] += bias[j];
}

/* Assumptions: g and u do not overlap; any alignment; elementwise, masked tail. */
__attribute__((target("avx512f"))) static void swiglu512(float *restrict g,
							 const float *restrict u, int n)
{
	const __m512 one = _mm512_set1_ps(1.0f);

	for (int i = 0; i < n; i += 16) {
		const __mmask16 m = tail_mask(n - i);
		const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
		const __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(
								      _mm512_setzero_ps(), gv))));

		_mm512_mask_storeu_ps(g + i, m,
				      _mm512_mul_ps(_mm512_mul_ps(gv, sig),
						    _mm512_maskz_loadu_ps(m, u + i)));
	}
}

void dps_swiglu(float *restrict g, const float *restrict u, int n)
{
	if (have_avx512())
		swiglu512(g, u, n);
	else
		dps_swiglu_ref(g, u, n);
}

/* Assumptions: as swiglu512; limit > 0. */
__attribute__((target("avx512f"))) static void swiglu_clamped512(float *restrict g,
								 const float *restrict u, int n,
								 float limit)
{
	const __m512 one = _mm512_set1_ps(1.0f), lim = _mm512_set1_ps(limit);
	const __m512 nlim = _mm512_set1_ps(-limit), alpha = _mm512_set1_ps(-1.702f);

	for (int i = 0; i < n; i += 16) {
		const __mmask16 m = tail_mask(n - i);
		const __m512 gv = _mm512_min_ps(_mm512_maskz_loadu_ps(m, g + i), lim);
		const __m512 uv = _mm512_max_ps(_mm512_min_ps(_mm512_maskz_loadu_ps(m, u + i), lim),
						nlim);
		const __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_mul_ps(alpha,
											     gv))));

		_mm512_mask_storeu_ps(g + i, m,
				      _mm512_mul_ps(_mm512_add_ps(uv, one), _mm512_mul_ps(gv, sig)));
	}
}

void dps_swiglu_clamped(float *restrict g, const float *restrict u, int n, float limit)
{
	if (have_avx512())
		swiglu_clamped512(g, u, n, limit);
	else
		dps_swiglu_clamped_ref(g, u, n, limit);
}

void dps_embedding(float *restrict out, const float *restrict table, int dim, int token)
{
	memcpy(out, table + (size_t)token * (size_t)dim, sizeof(float) * (size_t)dim);
}

/* Contiguous positions are one block of n_pos: the paged kernel with a table of one entry. */
void dps_attention(float *restrict out, const float *restrict q, const float *restrict k,
		   const float *restrict v, int first, int n_pos, int head_dim, size_t kv_stride,
		   const float *sink, float *restrict scratch)
{
	static const int one_block[1] = { 0 };

	dps_attention_paged(out, q, k, v, one_block, n_pos > 0 ? n_pos : 1, 0, first, n_pos,
			    head_dim, kv_stride, sink, scratch);
}

/* Position t's row of a paged cache (k or v), as dps_attention_paged_ref finds it. */
static inline const float *paged_row(const float *base, const int *restrict table, int bs,
				     size_t block_stride, size_t kv_stride, int t)
{
	return base + (size_t)table[t / bs] * block_stride + (size_t)(t % bs) * kv_stride;
}

/*
 * out = sum over t in [first, n_pos), in that order, of p_t v_t for a head of ns * 16 values:
 * the ns sixteen-lane slices of out accumulate side by side, position after position, so V is
 * read in one pass and the ns chains of FMAs overlap; each value's sum is the one the loop
 * below (a slice at a time) makes, term for term and in the same order.
 */
__attribute__((target("avx512f"), always_inline)) static inline void
weighted_v512(float *restrict out, const float *restrict v, const int *restrict table, int bs,
	      size_t block_stride, int first, int n_pos, size_t kv_stride,
	      const float *restrict p, const int ns)
{
	__m512 acc[8];

#pragma GCC unroll 8
	for (int j = 0; j < ns; j++)
		acc[j] = _mm512_setzero_ps();
	for (int t = first; t < n_pos; t++) {
		const float *vt = paged_row(v, table, bs, block_stride, kv_stride, t);
		const __m512 pt = _mm512_set1_ps(p[t]);

#pragma GCC unroll 8
		for (int j = 0; j < ns; j++)
			acc[j] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(vt + 16 * j), acc[j]);
	}
#pragma GCC unroll 8
	for (int j = 0; j < ns; j++)
		_mm512_storeu_ps(out + 16 * j, acc[j]);
}

/*
 * Assumptions: head_dim >= 1 (any value; a multiple of 16 is fastest); 0 <= first < n_pos;
 * positions found through the block table as dps_attention_paged_ref says, only those of
 * [first, n_pos) read; scratch holds n_pos floats (the window's at scratch + first); out does
 * not alias q, k or v.
 */
__attribute__((target("avx512f"))) void dps_attention_paged_avx512(
	float *restrict out, const float *restrict q, const float *restrict k,
	const float *restrict v, const int *restrict table, int bs, size_t block_stride, int first,
	int n_pos, int head_dim, size_t kv_stride, const float *sink, float *restrict scratch)
{
	const float scale = 1.0f / sqrtf((float)head_dim);

	for (int t = first; t < n_pos; t++) {
		const float *kt = paged_row(k, table, bs, block_stride, kv_stride, t);
		__m512 acc = _mm512_setzero_ps();

		for (int i = 0; i < head_dim; i += 16) {
			const __mmask16 m = tail_mask(head_dim - i);

			acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i),
					      _mm512_maskz_loadu_ps(m, kt + i), acc);
		}
		scratch[t] = _mm512_reduce_add_ps(acc) * scale;
	}
	softmax512(scratch + first, n_pos - first, sink);
	switch (head_dim) { /* the usual sizes: every slice's chain at once, V read in one pass */
	case 64:
		weighted_v512(out, v, table, bs, block_stride, first, n_pos, kv_stride, scratch, 4);
		return;
	case 128:
		weighted_v512(out, v, table, bs, block_stride, first, n_pos, kv_stride, scratch, 8);
		return;
	default:
		break;
	}
	for (int i = 0; i < head_dim; i += 16) {
		const __mmask16 m = tail_mask(head_dim - i);
		__m512 acc = _mm512_setzero_ps();

		for (int t = first; t < n_pos; t++) {
			const float *vt = paged_row(v, table, bs, block_stride, kv_stride, t);

			acc = _mm512_fmadd_ps(_mm512_set1_ps(scratch[t]),
					      _mm512_maskz_loadu_ps(m, vt + i), acc);
		}
		_mm512_mask_storeu_ps(out + i, m, acc);
	}
}

/* ---- AVX2 ---------------------------------------------------------------------------- */

/* Lanes below left (all eight when left >= 8) set, for the masked loads and stores. */
__attribute__((target("avx2,fma"))) static inline __m256i tail_mask8(int left)
{
	return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The sum of the eight lanes, by a fixed tree. */
__attribute__((target("avx2,fma"))) static inline float sum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* The largest of the eight lanes. */
__attribute__((target("avx2,fma"))) static inline float max8(__m256 v)
{
	__m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_max_ps(s, _mm_movehl_ps(s, s));
	s = _mm_max_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/*
 * softmax512's twin in eight lanes. Assumptions: as softmax512; maskload/maskstore for the
 * tail (masked-out lanes read as 0, so the max blends -inf into them).
 */
__attribute__((target("avx2,fma"))) static void softmax256(float *x, int n, const float *sink)
{
	const __m256 ninf = _mm256_set1_ps(-INFINITY);
	__m256 vmax = ninf, sum = _mm256_setzero_ps(), inv;
	float max, total;

	for (int i = 0; i < n; i += 8) {
		const __m256i m = tail_mask8(n - i);

		vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, m),
							     _mm256_castsi256_ps(m)));
	}
	max = max8(vmax);
	if (sink && *sink > max)
		max = *sink;
	vmax = _mm256_set1_ps(max);
	for (int i = 0; i < n; i += 8) {
		const __m256i m = tail_mask8(n - i);
		const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), vmax)),
					       _mm256_castsi256_ps(m));

		sum = _mm256_add_ps(sum, e);
		_mm256_maskstore_ps(x + i, m, e);
	}
	total = sum8(sum);
	if (sink)
		total += _mm256_cvtss_f32(exp8(_mm256_set1_ps(*sink - max)));
	inv = _mm256_set1_ps(1.0f / total);
	for (int i = 0; i < n; i += 8) {
		const __m256i m = tail_mask8(n - i);

		_mm256_maskstore_ps(x + i, m, _mm256_mul_ps(_mm256_maskload_ps(x + i, m), inv));
	}
}

/* Assumptions: as dps_attention_paged_avx512, in eight lanes with masked tails. */
__attribute__((target("avx2,fma"))) void dps_attention_paged_avx2(
	float *restrict out, const float *restrict q, const float *restrict k,
	const float *restrict v, const int *restrict table, int bs, size_t block_stride, int first,
	int n_pos, int head_dim, size_t kv_stride, const float *sink, float *restrict scratch)
{
	const float scale = 1.0f / sqrtf((float)head_dim);

	for (int t = first; t < n_pos; t++) {
		const float *kt = paged_row(k, table, bs, block_stride, kv_stride, t);
		__m256 acc = _mm256_setzero_ps();

		for (int i = 0; i < head_dim; i += 8) {
			const __m256i m = tail_mask8(head_dim - i);

			acc = _mm256_fmadd_ps(_mm256_maskload_ps(q + i, m),
					      _mm256_maskload_ps(kt + i, m), acc);
		}
		scratch[t] = sum8(acc) * scale;
	}
	softmax256(scratch + first, n_pos - first, sink);
	for (int i = 0; i < head_dim; i += 8) {
		const __m256i m = tail_mask8(head_dim - i);
		__m256 acc = _mm256_setzero_ps();

		for (int t = first; t < n_pos; t++) {
			const float *vt = paged_row(v, table, bs, block_stride, kv_stride, t);

			acc = _mm256_fmadd_ps(_mm256_set1_ps(scratch[t]), _mm256_maskload_ps(vt + i, m),
					      acc);
		}
		_mm256_maskstore_ps(out + i, m, acc);
	}
}

/*
 * weighted_v512 for hh heads at once (their rows of V at off[0..hh-1] in each position's row):
 * one pass over the positions reads every head's values of a position together.
 */
__attribute__((target("avx512f"), always_inline)) static inline void
weighted_heads512(float *restrict out, size_t out_stride, const float *restrict v,
		  const size_t *off, const int *restrict table, int bs, size_t block_stride,
		  int first, int n_pos, size_t kv_stride, const float *restrict p, size_t p_stride,
		  const int hh, const int ns)
{
	__m512 acc[4][8];

#pragma GCC unroll 4
	for (int h = 0; h < hh; h++)
#pragma GCC unroll 8
		for (int j = 0; j < ns; j++)
			acc[h][j] = _mm512_setzero_ps();
	for (int b = first / bs; b * bs < n_pos; b++) { /* block by block: no division a row */
		const float *vb = v + (size_t)table[b] * block_stride;
		const int t0 = b * bs > first ? b * bs : first;
		const int t1 = (b + 1) * bs < n_pos ? (b + 1) * bs : n_pos;

		for (int t = t0; t < t1; t++) {
			const float *vt = vb + (size_t)(t - b * bs) * kv_stride;

#pragma GCC unroll 4
			for (int h = 0; h < hh; h++) {
				const __m512 pt = _mm512_set1_ps(p[(size_t)h * p_stride + (size_t)t]);

#pragma GCC unroll 8
				for (int j = 0; j < ns; j++)
					acc[h][j] = _mm512_fmadd_ps(
						pt, _mm512_loadu_ps(vt + off[h] + 16 * j), acc[h][j]);
			}
		}
	}
#pragma GCC unroll 4
	for (int h = 0; h < hh; h++)
#pragma GCC unroll 8
		for (int j = 0; j < ns; j++)
			_mm512_storeu_ps(out + (size_t)h * out_stride + 16 * j, acc[h][j]);
}

/*
 * nh (<= DPS_ATTN_HEADS) heads of head_dim ns * 16 at once, each exactly as
 * dps_attention_paged_avx512 computes it (the same FMAs in the same order, the same softmax),
 * but reading each position's keys, then its values, for every head in one pass: the heads of
 * a position are neighbours in the cache, and heads sharing a KV head (GQA) read it once.
 */
__attribute__((target("avx512f"), always_inline)) static inline void
heads512(float *restrict out, size_t out_stride, const float *restrict q, size_t q_stride,
	 int nh, const size_t *off, const float *restrict k, const float *restrict v,
	 const int *restrict table, int bs, size_t block_stride, int first, int n_pos,
	 size_t kv_stride, const float *sinks, float *restrict scratch, size_t s_stride,
	 const int ns)
{
	const float scale = 1.0f / sqrtf((float)(16 * ns)); /* as dps_attention_paged_avx512's */
	int h = 0;

	for (int b = first / bs; b * bs < n_pos; b++) { /* block by block: no division a row */
		const float *kb = k + (size_t)table[b] * block_stride;
		const int t0 = b * bs > first ? b * bs : first;
		const int t1 = (b + 1) * bs < n_pos ? (b + 1) * bs : n_pos;

		for (int t = t0; t < t1; t++) {
			const float *kt = kb + (size_t)(t - b * bs) * kv_stride;

			for (int x = 0; x < nh; x++) {
				const float *qx = q + (size_t)x * q_stride;
				__m512 acc = _mm512_setzero_ps();

#pragma GCC unroll 8
				for (int j = 0; j < ns; j++)
					acc = _mm512_fmadd_ps(_mm512_loadu_ps(qx + 16 * j),
							      _mm512_loadu_ps(kt + off[x] + 16 * j), acc);
				scratch[(size_t)x * s_stride + (size_t)t] =
					_mm512_reduce_add_ps(acc) * scale;
			}
		}
	}
	for (int x = 0; x < nh; x++)
		softmax512(scratch + (size_t)x * s_stride + first, n_pos - first,
			   sinks ? sinks + x : NULL);
	/* sixteen accumulators a pass: four heads of 64, two of 128 */
	for (; h + (ns == 4 ? 4 : 2) <= nh; h += ns == 4 ? 4 : 2) {
		if (ns == 4)
			weighted_heads512(out + (size_t)h * out_stride, out_stride, v, off + h, table,
					  bs, block_stride, first, n_pos, kv_stride,
					  scratch + (size_t)h * s_stride, s_stride, 4, 4);
		else
			weighted_heads512(out + (size_t)h * out_stride, out_stride, v, off + h, table,
					  bs, block_stride, first, n_pos, kv_stride,
					  scratch + (size_t)h * s_stride, s_stride, 2, 8);
	}
	for (; h < nh; h++)
		weighted_heads512(out + (size_t)h * out_stride, out_stride, v, off + h, table, bs,
				  block_stride, first, n_pos, kv_stride,
				  scratch + (size_t)h * s_stride, s_stride, 1, ns);
}

/* heads512 for a head of 64 (ns = 4) or 128 (ns = 8), each size compiled with its constant. */
__attribute__((target("avx512f"))) static void
heads512_any(float *restrict out, size_t out_stride, const float *restrict q, size_t q_stride,
	     int nh, const size_t *off, const float *restrict k, const float *restrict v,
	     const int *restrict table, int bs, size_t block_stride, int first, int n_pos,
	     size_t kv_stride, const float *sinks, float *restrict scratch, size_t s_stride, int ns)
{
	if (ns == 4)
		heads512(out, out_stride, q, q_stride, nh, off, k, v, table, bs, block_stride, first,
			 n_pos, kv_stride, sinks, scratch, s_stride, 4);
	else
		heads512(out, out_stride, q, q_stride, nh, off, k, v, table, bs, block_stride, first,
			 n_pos, kv_stride, sinks, scratch, s_stride, 8);
}

void dps_attention_paged_heads(float *restrict out, size_t out_stride, const float *restrict q,
			       size_t q_stride, int nh, const size_t *off,
			       const float *restrict k, const float *restrict v,
			       const int *restrict table, int block_size, size_t block_stride,
			       int first, int n_pos, int head_dim, size_t kv_stride,
			       const float *sinks, float *restrict scratch, size_t s_stride)
{
	if (nh > DPS_ATTN_HEADS)
		abort(); /* the caller's contract */
	if (have_avx512() && (head_dim == 64 || head_dim == 128)) {
		heads512_any(out, out_stride, q, q_stride, nh, off, k, v, table, block_size,
			     block_stride, first, n_pos, kv_stride, sinks, scratch, s_stride,
			     head_dim / 16);
		return;
	}
	for (int x = 0; x < nh; x++)
		dps_attention_paged(out + (size_t)x * out_stride, q + (size_t)x * q_stride,
				    k + off[x], v + off[x], table, block_size, block_stride, first,
				    n_pos, head_dim, kv_stride, sinks ? sinks + x : NULL,
				    scratch + (size_t)x * s_stride);
}

void dps_attention_paged(float *restrict out, const float *restrict q, const float *restrict k,
			 const float *restrict v, const int *restrict table, int block_size,
			 size_t block_stride, int first, int n_pos, int head_dim, size_t kv_stride,
			 const float *sink, float *restrict scratch)
{
	if (have_avx512())
		dps_attention_paged_avx512(out, q, k, v, table, block_size, block_stride, first,
					   n_pos, head_dim, kv_stride, sink, scratch);
	else if (have_avx2())
		dps_attention_paged_avx2(out, q, k, v, table, block_size, block_stride, first, n_pos,
					 head_dim, kv_stride, sink, scratch);
	else
		dps_attention_paged_ref(out, q, k, v, table, block_size, block_stride, first, n_pos,
					head_dim, kv_stride, sink, scratch);
}

/*
 * The reference's answer, sixteen lanes at a time. The reference keeps index 0 when x[0] is
 * NaN (nothing compares greater than a NaN) and otherwise passes NaNs over; +0 and -0 compare
 * equal, so the first of them wins. Each lane keeps the first of its largest values (a
 * strict, ordered greater-than, from -inf, so no NaN enters); then, unless nothing beats
 * x[0], the lowest index among the lanes that hold the overall largest. A choice, not a sum:
 * the same index as the reference, always.
 */
__attribute__((target("avx512f"))) static int argmax512(const float *x, int n)
{
	const __m512 none = _mm512_set1_ps(-INFINITY);
	const __m512i step = _mm512_set1_epi32(16);
	__m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
	__m512i at = _mm512_setzero_si512();
	__m512 best = none;
	float top;

	for (long i = 0; i < n; i += 16) {
		const __mmask16 in = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
		const __m512 v = _mm512_mask_loadu_ps(none, in, x + i);
		const __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);

		best = _mm512_mask_mov_ps(best, gt, v);
		at = _mm512_mask_mov_epi32(at, gt, idx);
		idx = _mm512_add_epi32(idx, step);
	}
	top = _mm512_reduce_max_ps(best);
	if (!(top > x[0]))
		return 0;
	return _mm512_mask_reduce_min_epi32(_mm512_cmp_ps_mask(best, _mm512_set1_ps(top), _CMP_EQ_OQ),
					    at);
}

int dps_argmax(const float *x, int n)
{
	if (n < 2)
		return 0;
	return have_avx512() ? argmax512(x, n) : dps_argmax_ref(x, n);
}
