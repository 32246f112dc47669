/* SPDX-License-Identifier: MIT */
/*
 * kernels/q8.c - INT8 weights in blocks of 32 with F16 scales (see q8.h): quantizing weights
 * and activations, and the product in q8.h's order three ways, bit for bit the same: AVX-512
 * with VNNI (vpdpbusd on the stored q + 128 against the signed activations, started from
 * -128 times the activations' sums, which gives each lane's exact integer), AVX2 (vpmaddubsw
 * on |x| and the weights with x's signs, then vpmaddwd: the same integers), and the plain-C
 * twin. dps_linear_q8 (gemm.c) calls them on its slices of output columns for every product
 * of a quantized model: decode (W streamed from memory once) and prefill.
 *
 * Blocking, as gemm_dot.c: W taken W_BLOCK_BYTES of rows at a time (kept in L2), inside it
 * four rows of W against up to four (AVX-512) or one (AVX2) rows of x per register tile. The
 * blocking changes which tile computes an output and when, never the order of its sum.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "common/f16.h"
#include "kernels/dot_int.h"
#include "kernels/q8.h"

#define W_BLOCK_BYTES ((size_t)192 << 10)
#define GROUP 4 /* rows of W per register tile */
/* How far ahead of the read position the one-row tiles prefetch W, in address order. */
#define W_PREFETCH_BYTES ((size_t)16 << 10)

/* ---- quantizing ------------------------------------------------------------------------ */

void dps_q8_quantize_rows(void *dst, int k, const float *src, size_t rows)
{
	const size_t kb = dps_q8_blocks(k);

	for (size_t i = 0; i < rows; i++) {
		uint8_t *q = (uint8_t *)(uintptr_t)dps_q8_row(dst, i, k);
		uint16_t *d = (uint16_t *)(uintptr_t)dps_q8_scales(dst, i, k);
		const float *v = src + i * (size_t)k;

		for (size_t b = 0; b < kb; b++) {
			const int c0 = (int)b * DPS_Q8_BLOCK;
			const int cnt = k - c0 < DPS_Q8_BLOCK ? k - c0 : DPS_Q8_BLOCK;
			float amax = 0.0f, df;

			for (int j = 0; j < cnt; j++)
				amax = fmaxf(amax, fabsf(v[c0 + j]));
			d[b] = dps_f32_to_f16(amax / 127.0f);
			df = dps_f16_to_f32(d[b]);
			for (int j = 0; j < DPS_Q8_BLOCK; j++) {
				long t = 0;

				if (j < cnt && df > 0.0f) {
					t = lrintf(v[c0 + j] / df);
					t = t > 127 ? 127 : t < -127 ? -127 : t;
				}
				q[c0 + j] = (uint8_t)(t + 128);
			}
		}
	}
}

void dps_q8_dequantize_row(float *dst, const void *W, int k, size_t r)
{
	const uint8_t *q = dps_q8_row(W, r, k);
	const uint16_t *d = dps_q8_scales(W, r, k);

	for (int c = 0; c < k; c++)
		dst[c] = (float)((int)q[c] - 128) * dps_f16_to_f32(d[c / DPS_Q8_BLOCK]);
}

/* Grows *p to hold want elements of esz bytes (capacity in *cap). 0 or -ENOMEM. */
static int grow(void **p, size_t *cap, size_t want, size_t esz)
{
	void *q;

	if (want <= *cap)
		return 0;
	q = realloc(*p, want * esz);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = want;
	return 0;
}

int dps_q8_act_quantize(struct dps_q8_act *a, const float *x, int m, int k)
{
	const size_t kb = dps_q8_blocks(k), kp = kb * DPS_Q8_BLOCK, pairs = (kb + 1) / 2;
	const size_t rows = (size_t)(m > 0 ? m : 0);

	if (grow((void **)&a->q, &a->cap_q, rows * kp, 1) ||
	    grow((void **)&a->d, &a->cap_d, rows * kb, sizeof(float)) ||
	    grow((void **)&a->de, &a->cap_de, rows * pairs * 16, sizeof(float)) ||
	    grow((void **)&a->nc, &a->cap_nc, rows * kp / 4, sizeof(int32_t)))
		return -ENOMEM;
	a->m = m;
	a->k = k;
	for (size_t i = 0; i < rows; i++) {
		const float *v = x + i * (size_t)k;
		int8_t *q = a->q + i * kp;
		float *d = a->d + i * kb, *de = a->de + i * pairs * 16;
		int32_t *nc = a->nc + i * kp / 4;

		for (size_t b = 0; b < kb; b++) {
			const int c0 = (int)b * DPS_Q8_BLOCK;
			const int cnt = k - c0 < DPS_Q8_BLOCK ? k - c0 : DPS_Q8_BLOCK;
			float amax = 0.0f, id;

			for (int j = 0; j < cnt; j++)
				amax = fmaxf(amax, fabsf(v[c0 + j]));
			d[b] = amax / 127.0f;
			id = amax > 0.0f ? 127.0f / amax : 0.0f;
			for (int j = 0; j < DPS_Q8_BLOCK; j++)
				q[c0 + j] = j < cnt ? (int8_t)lrintf(v[c0 + j] * id) : 0;
			for (int t = 0; t < DPS_Q8_BLOCK / 4; t++)
				nc[b * 8 + (size_t)t] = -128 * (q[c0 + 4 * t] + q[c0 + 4 * t + 1] +
								q[c0 + 4 * t + 2] + q[c0 + 4 * t + 3]);
		}
		for (size_t p = 0; p < pairs; p++)
			for (int l = 0; l < 16; l++) {
				const size_t b = 2 * p + (size_t)(l >= 8);

				de[p * 16 + (size_t)l] = b < kb ? d[b] : 0.0f;
			}
	}
	return 0;
}

void dps_q8_act_free(struct dps_q8_act *a)
{
	free(a->q);
	free(a->d);
	free(a->de);
	free(a->nc);
	memset(a, 0, sizeof(*a));
}

/* ---- the plain-C twin -------------------------------------------------------------------- */

/* One output in q8.h's order: activations row (q, d) against weight row (w, dw), kb blocks. */
static float dot_q8_ref(const int8_t *q, const float *d, const uint8_t *w, const uint16_t *dw,
			size_t kb)
{
	float a[16] = { 0.0f };

	for (size_t b = 0; b < kb; b++) {
		const float s = d[b] * dps_f16_to_f32(dw[b]);

		for (int l = 0; l < 8; l++) {
			const size_t c = b * DPS_Q8_BLOCK + 4 * (size_t)l;
			int32_t p = 0;

			for (int j = 0; j < 4; j++)
				p += (int32_t)q[c + (size_t)j] * ((int32_t)w[c + (size_t)j] - 128);
			a[8 * (b & 1) + (size_t)l] = fmaf(s, (float)p, a[8 * (b & 1) + (size_t)l]);
		}
	}
	return dps_dot_tree_ref(a);
}

void dps_gemm_q8_ref(float *restrict out, int ldo, const struct dps_q8_act *a, const void *W,
		     int n)
{
	const size_t kb = dps_q8_blocks(a->k), kp = kb * DPS_Q8_BLOCK;

	for (int i = 0; i < a->m; i++)
		for (int r = 0; r < n; r++)
			out[(size_t)i * (size_t)ldo + (size_t)r] =
				dot_q8_ref(a->q + (size_t)i * kp, a->d + (size_t)i * kb,
					   dps_q8_row(W, (size_t)r, a->k),
					   dps_q8_scales(W, (size_t)r, a->k), kb);
}

/* ---- the blocking, shared by both ISAs ------------------------------------------------ */

/* Rows r0 .. r0 + nr - 1 (nr <= GROUP) of W against every row of a, into out's columns
 * r0 .. r0 + nr - 1. */
typedef void q8_tile_fn(float *restrict out, int ldo, const struct dps_q8_act *a,
			const void *W, int r0, int nr);

/*
 * Assumptions: out is a->m x n with row stride ldo; W's row c goes to out's column c. The W
 * block is the outer loop, so W is read from memory once per call, and every row of x passes
 * each block while it is in L2.
 */
static void q8_blocked(q8_tile_fn *tile, float *restrict out, int ldo,
		       const struct dps_q8_act *a, const void *W, int n)
{
	const size_t row = dps_q8_row_bytes(a->k);
	size_t nb = W_BLOCK_BYTES / (row ? row : 1) / GROUP * GROUP;

	nb = nb < GROUP ? GROUP : nb;
	for (size_t c0 = 0; c0 < (size_t)n; c0 += nb) {
		const size_t c1 = (size_t)n - c0 < nb ? (size_t)n : c0 + nb;

		for (size_t c = c0; c < c1; c += GROUP)
			tile(out, ldo, a, W, (int)c, c1 - c < GROUP ? (int)(c1 - c) : GROUP);
	}
}

/* ---- AVX-512 with VNNI -------------------------------------------------------------------- */

/* The scales of blocks b and b + 1 of a weight row, lanes 0..7 and 8..15 (b + 1 < kb). */
__attribute__((target("avx512f,avx512bw,avx512vnni,f16c"), always_inline)) static inline __m512
scales2_avx512(const uint16_t *dw, size_t b)
{
	const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
	uint32_t two;

	memcpy(&two, dw + b, sizeof(two));
	return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(
		_mm_cvtph_ps(_mm_cvtsi32_si128((int)two))));
}

/*
 * mr (1..4, a constant where inlined) rows of x, from row i0 of a, against four rows of W:
 * sixteen-lane accumulators, lanes 0..7 taking the even blocks and 8..15 the odd ones, each
 * pair of blocks one 64-byte load of every row; a last odd block takes lanes 0..7 alone.
 *
 * Assumptions: rows of W are kp bytes (a multiple of 32), rows of a->q kp bytes; rows
 * r0 + nr .. r0 + 3 are not read (their loads repeat row r0).
 */
__attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma,f16c"), always_inline)) static inline void
q8_block_avx512(float *restrict out, int ldo, const struct dps_q8_act *a, int i0,
		const void *W, int r0, int nr, const int mr)
{
	const int k = a->k;
	const size_t kb = dps_q8_blocks(k), kp = kb * DPS_Q8_BLOCK, pairs = (kb + 1) / 2;
	const uint8_t *w[GROUP];
	const uint16_t *dw[GROUP];
	__m512 acc[4][GROUP];
	size_t b = 0;

	for (int q = 0; q < GROUP; q++) {
		const size_t r = (size_t)r0 + (size_t)(q < nr ? q : 0);

		w[q] = dps_q8_row(W, r, k);
		dw[q] = dps_q8_scales(W, r, k);
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = _mm512_setzero_ps();
	for (; b + 2 <= kb; b += 2) {
		const size_t c = b * DPS_Q8_BLOCK;
		__m512i wv[GROUP];
		__m512 sw[GROUP];

#pragma GCC unroll 4
		for (int q = 0; q < GROUP; q++) {
			wv[q] = _mm512_loadu_si512((const void *)(w[q] + c));
			sw[q] = scales2_avx512(dw[q], b);
		}
		if (mr == 1) /* decode: W streamed once, one stream ahead in address order */
			_mm_prefetch((const char *)w[0] + W_PREFETCH_BYTES + c * GROUP, _MM_HINT_T0);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			const size_t ii = (size_t)(i0 + i);
			const __m512i xv = _mm512_loadu_si512((const void *)(a->q + ii * kp + c));
			const __m512i nc = _mm512_loadu_si512((const void *)(a->nc + ii * kp / 4 + c / 4));
			const __m512 dx = _mm512_loadu_ps(a->de + (ii * pairs + b / 2) * 16);

#pragma GCC unroll 4
			for (int q = 0; q < GROUP; q++) {
				const __m512i p = _mm512_dpbusd_epi32(nc, wv[q], xv);

				acc[i][q] = _mm512_fmadd_ps(_mm512_mul_ps(dx, sw[q]),
							    _mm512_cvtepi32_ps(p), acc[i][q]);
			}
		}
	}
	if (b < kb) { /* a last, odd block: lanes 0..7 */
		const size_t c = b * DPS_Q8_BLOCK;
		__m512i wv[GROUP];
		__m512 sw[GROUP];

#pragma GCC unroll 4
		for (int q = 0; q < GROUP; q++) {
			wv[q] = _mm512_castsi256_si512(_mm256_loadu_si256((const void *)(w[q] + c)));
			sw[q] = _mm512_set1_ps(_cvtsh_ss(dw[q][b]));
		}
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			const size_t ii = (size_t)(i0 + i);
			const __m512i xv = _mm512_castsi256_si512(
				_mm256_loadu_si256((const void *)(a->q + ii * kp + c)));
			const __m512i nc = _mm512_castsi256_si512(
				_mm256_loadu_si256((const void *)(a->nc + ii * kp / 4 + c / 4)));
			const __m512 dx = _mm512_loadu_ps(a->de + (ii * pairs + b / 2) * 16);

#pragma GCC unroll 4
			for (int q = 0; q < GROUP; q++) {
				const __m512i p = _mm512_dpbusd_epi32(nc, wv[q], xv);

				acc[i][q] = _mm512_mask3_fmadd_ps(_mm512_mul_ps(dx, sw[q]),
								  _mm512_cvtepi32_ps(p), acc[i][q],
								  (__mmask16)0x00ff);
			}
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++) {
		float s[4];

		_mm_storeu_ps(s, dps_dot_reduce4(dps_dot_halves512(acc[i][0]),
						 dps_dot_halves512(acc[i][1]),
						 dps_dot_halves512(acc[i][2]),
						 dps_dot_halves512(acc[i][3])));
		for (int q = 0; q < nr; q++)
			out[(size_t)(i0 + i) * (size_t)ldo + (size_t)(r0 + q)] = s[q];
	}
}

__attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma,f16c"))) static void
q8_tile_avx512(float *restrict out, int ldo, const struct dps_q8_act *a, const void *W,
	       int r0, int nr)
{
	int i = 0;

	for (; i + 4 <= a->m; i += 4)
		q8_block_avx512(out, ldo, a, i, W, r0, nr, 4);
	switch (a->m - i) {
	case 1:
		q8_block_avx512(out, ldo, a, i, W, r0, nr, 1);
		break;
	case 2:
		q8_block_avx512(out, ldo, a, i, W, r0, nr, 2);
		break;
	case 3:
		q8_block_avx512(out, ldo, a, i, W, r0, nr, 3);
		break;
	default:
		break;
	}
}

void dps_gemm_q8_avx512(float *restrict out, int ldo, const struct dps_q8_act *a,
			const void *W, int n)
{
	q8_blocked(q8_tile_avx512, out, ldo, a, W, n);
}

/* ---- AVX2 ------------------------------------------------------------------------------ */

/*
 * One block (32 values) of a row of x (q, |q|) against a weight row's stored values w: the
 * eight lanes of q8.h's p, exact. vpmaddubsw multiplies |x| (unsigned) by the weight with x's
 * sign (vpsignb; zero where x is zero) and adds pairs, at most 2 * 127 * 127 < 2^15, so it
 * never saturates; vpmaddwd adds the pairs into int32.
 */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256i
p_avx2(__m256i xq, __m256i xa, const uint8_t *w)
{
	const __m256i ws = _mm256_xor_si256(_mm256_loadu_si256((const void *)w),
					    _mm256_set1_epi8((char)0x80)); /* q + 128 -> q */

	return _mm256_madd_epi16(_mm256_maddubs_epi16(xa, _mm256_sign_epi8(ws, xq)),
				 _mm256_set1_epi16(1));
}

/*
 * Every row of x against four rows of W, one row of x at a time: two 8-lane accumulators per
 * row of W (even and odd blocks: lanes 0..7 and 8..15 of q8.h), summed at the end as the
 * AVX-512 kernel's halves are.
 */
__attribute__((target("avx2,fma,f16c"))) static void
q8_tile_avx2(float *restrict out, int ldo, const struct dps_q8_act *a, const void *W,
	     int r0, int nr)
{
	const int k = a->k;
	const size_t kb = dps_q8_blocks(k), kp = kb * DPS_Q8_BLOCK;
	const uint8_t *w[GROUP];
	const uint16_t *dw[GROUP];

	for (int q = 0; q < GROUP; q++) {
		const size_t r = (size_t)r0 + (size_t)(q < nr ? q : 0);

		w[q] = dps_q8_row(W, r, k);
		dw[q] = dps_q8_scales(W, r, k);
	}
	for (int i = 0; i < a->m; i++) {
		const int8_t *xq = a->q + (size_t)i * kp;
		const float *dx = a->d + (size_t)i * kb;
		__m256 lo[GROUP], hi[GROUP];
		float s[4];

#pragma GCC unroll 4
		for (int q = 0; q < GROUP; q++)
			lo[q] = hi[q] = _mm256_setzero_ps();
		for (size_t b = 0; b < kb; b++) {
			const size_t c = b * DPS_Q8_BLOCK;
			const __m256i xv = _mm256_loadu_si256((const void *)(xq + c));
			const __m256i xa = _mm256_abs_epi8(xv);
			const __m256 d = _mm256_set1_ps(dx[b]);

			if (a->m == 1)
				_mm_prefetch((const char *)w[0] + W_PREFETCH_BYTES + c * GROUP,
					     _MM_HINT_T0);
#pragma GCC unroll 4
			for (int q = 0; q < GROUP; q++) {
				const __m256 sv = _mm256_mul_ps(d, _mm256_set1_ps(_cvtsh_ss(dw[q][b])));
				const __m256 p = _mm256_cvtepi32_ps(p_avx2(xv, xa, w[q] + c));

				if (b & 1)
					hi[q] = _mm256_fmadd_ps(sv, p, hi[q]);
				else
					lo[q] = _mm256_fmadd_ps(sv, p, lo[q]);
			}
		}
		_mm_storeu_ps(s, dps_dot_reduce4(_mm256_add_ps(lo[0], hi[0]),
						 _mm256_add_ps(lo[1], hi[1]),
						 _mm256_add_ps(lo[2], hi[2]),
						 _mm256_add_ps(lo[3], hi[3])));
		for (int q = 0; q < nr; q++)
			out[(size_t)i * (size_t)ldo + (size_t)(r0 + q)] = s[q];
	}
}

void dps_gemm_q8_avx2(float *restrict out, int ldo, const struct dps_q8_act *a, const void *W,
		      int n)
{
	q8_blocked(q8_tile_avx2, out, ldo, a, W, n);
}
