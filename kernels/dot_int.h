/* SPDX-License-Identifier: MIT */
/*
 * kernels/dot_int.h - the fixed reduction tree of dpshard's dot-product order (gemm.h), shared
 * by the f32 kernels (gemm_dot.c) and the MXFP4 ones (mxfp4.c) so that both end every sum the
 * same way. Private to kernels/.
 *
 * An output's sixteen lane partial sums a[0..15] end as dps_gemm_f32_ref writes it out:
 * h[l] = a[l] + a[l + 8] (l < 8), q[l] = h[l] + h[l + 4] (l < 4), d[l] = q[l] + q[l + 2]
 * (l < 2), sum = d[0] + d[1]. Each is one IEEE f32 add (commutative, so which operand comes
 * first inside one add does not matter).
 */
#ifndef DPS_KERNELS_DOT_INT_H
#define DPS_KERNELS_DOT_INT_H

#include <immintrin.h>

/* The tree on the sixteen lanes of one output, in plain C (a is overwritten). */
static inline float dps_dot_tree_ref(float a[16])
{
	for (int l = 0; l < 8; l++)
		a[l] = a[l] + a[l + 8];
	for (int l = 0; l < 4; l++)
		a[l] = a[l] + a[l + 4];
	for (int l = 0; l < 2; l++)
		a[l] = a[l] + a[l + 2];
	return a[0] + a[1];
}

/*
 * The sums of four outputs, [s0, s1, s2, s3], from their h vectors (h[l] = a[l] + a[l + 8],
 * eight lanes each): the rest of the tree, four outputs at a time.
 */
__attribute__((target("avx2,fma"), always_inline)) static inline __m128
dps_dot_reduce4(__m256 h0, __m256 h1, __m256 h2, __m256 h3)
{
	/* q: [q0 | q1] and [q2 | q3], each q[l] = h[l] + h[l + 4] */
	const __m256 q01 = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20),
					 _mm256_permute2f128_ps(h0, h1, 0x31));
	const __m256 q23 = _mm256_add_ps(_mm256_permute2f128_ps(h2, h3, 0x20),
					 _mm256_permute2f128_ps(h2, h3, 0x31));
	/* d: [d0_0 d0_1 d2_0 d2_1 | d1_0 d1_1 d3_0 d3_1], d[l] = q[l] + q[l + 2] */
	const __m256 d = _mm256_add_ps(
		_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(q01), _mm256_castps_pd(q23))),
		_mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(q01), _mm256_castps_pd(q23))));
	/* [s0 s2 s0 s2 | s1 s3 s1 s3], s = d[0] + d[1] */
	const __m256 s = _mm256_hadd_ps(d, d);

	return _mm_unpacklo_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* h of a 16-lane AVX-512 accumulator: the sum of its two 256-bit halves. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline __m256
dps_dot_halves512(__m512 a)
{
	return _mm256_add_ps(_mm512_castps512_ps256(a),
			     _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/*
 * The first nr (1..4) of four outputs, out[0 .. nr - 1], from their sixteen-lane accumulators
 * through the tree: the end of every AVX-512 tile of four rows of W. One masked store (a loop
 * of nr stores had become a call to memcpy at every tile: 1-2% of a BF16 decode step).
 */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
dps_dot_store4_512(float *out, __m512 a0, __m512 a1, __m512 a2, __m512 a3, int nr)
{
	_mm512_mask_storeu_ps(out, (__mmask16)((1u << nr) - 1),
			      _mm512_castps128_ps512(dps_dot_reduce4(
				      dps_dot_halves512(a0), dps_dot_halves512(a1),
				      dps_dot_halves512(a2), dps_dot_halves512(a3))));
}

#endif
