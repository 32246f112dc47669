/* SPDX-License-Identifier: MIT */
/*
 * kernels/gemm_dot.c - dpshard's batch-invariant product out = x . W^T (see gemm.h): every
 * output summed in the one order gemm.h defines, which depends on k only. Three
 * implementations of that order, bit for bit the same: AVX-512 (16-lane accumulators), AVX2
 * with FMA (each 16-lane accumulator as two 8-lane halves, summed one after the other: the
 * lanes are independent, so the halves need not run together), and the plain-C twin with
 * fmaf. dps_linear_f32 (gemm.c) calls them on its slices of columns, for decode (m = the
 * batch, W streamed from memory once) and prefill (m up to --max-num-batched-tokens); from
 * GEMM_TILE_M_MIN rows on the fast two hand the product to the register-tile form of the same
 * order (gemm_tile.c), and take it back only if its buffers cannot be allocated.
 *
 * Blocking: a slice of W is taken W_BLOCK_BYTES of rows at a time (kept in L2) and, for each,
 * x X_BLOCK_BYTES of rows at a time; inside, four rows of W against up to four (AVX-512) or
 * three (AVX2) rows of x per register tile. Decode (one or two rows of x on AVX-512, one on
 * AVX2) reads W one row after the other instead (rows_avx512, rows_avx2): the rows are
 * contiguous, so W is one sequential stream, which this CPU's prefetcher follows far better
 * than four rows side by side: f32 asks for the next page's first lines as each 4 KiB page
 * begins, BF16/F16 for every line twice (rows16_avx512). The blocking changes which tile
 * computes an output and when, never the order of its sum.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <immintrin.h>

#include "common/f16.h"
#include "kernels/dot_int.h"
#include "kernels/gemm.h"
#include "kernels/gemm_int.h"

#define X_BLOCK_BYTES ((size_t)96 << 10)
#define W_BLOCK_BYTES ((size_t)192 << 10)
#define GROUP 4 /* rows of W per register tile */

/* ---- the plain-C twins ---------------------------------------------------------------- */

/* One output in the order of gemm.h. Lanes past k keep their sums, as in the masked tails. */
static float dot_ref(const float *restrict x, const float *restrict w, int k)
{
	float a[16] = { 0.0f };

	for (int c0 = 0; c0 < k; c0 += 16)
		for (int l = 0; l < 16; l++)
			a[l] = c0 + l < k ? fmaf(w[c0 + l], x[c0 + l], a[l]) : a[l];
	return dps_dot_tree_ref(a);
}

void dps_gemm_f32_ref(float *restrict out, int ldo, const float *restrict x,
		      const float *restrict W, int m, int n, int k)
{
	for (int i = 0; i < m; i++)
		for (int r = 0; r < n; r++)
			out[(size_t)i * (size_t)ldo + (size_t)r] =
				dot_ref(x + (size_t)i * (size_t)k, W + (size_t)r * (size_t)k, k);
}

/* dot_ref on a BF16 row, each weight widened first (exact), so the FMAs are dot_ref's. */
static float dot_bf16_ref(const float *restrict x, const uint16_t *restrict w, int k)
{
	float a[16] = { 0.0f };

	for (int c0 = 0; c0 < k; c0 += 16)
		for (int l = 0; l < 16; l++)
			a[l] = c0 + l < k ? fmaf(dps_bf16_to_f32(w[c0 + l]), x[c0 + l], a[l]) : a[l];
	return dps_dot_tree_ref(a);
}

void dps_gemm_bf16_ref(float *restrict out, int ldo, const float *restrict x,
		       const uint16_t *restrict W, int m, int n, int k)
{
	for (int i = 0; i < m; i++)
		for (int r = 0; r < n; r++)
			out[(size_t)i * (size_t)ldo + (size_t)r] =
				dot_bf16_ref(x + (size_t)i * (size_t)k, W + (size_t)r * (size_t)k, k);
}

/* dot_ref on an F16 row, each weight widened first (exact), so the FMAs are dot_ref's. */
static float dot_f16_ref(const float *restrict x, const uint16_t *restrict w, int k)
{
	float a[16] = { 0.0f };

	for (int c0 = 0; c0 < k; c0 += 16)
		for (int l = 0; l < 16; l++)
			a[l] = c0 + l < k ? fmaf(dps_f16_to_f32(w[c0 + l]), x[c0 + l], a[l]) : a[l];
	return dps_dot_tree_ref(a);
}

void dps_gemm_f16_ref(float *restrict out, int ldo, const float *restrict x,
		      const uint16_t *restrict W, int m, int n, int k)
{
	for (int i = 0; i < m; i++)
		for (int r = 0; r < n; r++)
			out[(size_t)i * (size_t)ldo + (size_t)r] =
				dot_f16_ref(x + (size_t)i * (size_t)k, W + (size_t)r * (size_t)k, k);
}

/* ---- the blocking, shared by both ISAs ------------------------------------------------ */

/*
 * mi (<= the x block) rows of x against rows r0 .. r0 + nr - 1 (nr <= GROUP) of W, whose
 * elements are f32 or BF16 as the function says.
 */
typedef void tile_fn(float *restrict out, int ldo, const float *restrict x,
		     const void *restrict W, int mi, int r0, int nr, int k);

/* Whole groups of rows of k elements of esz bytes, `bytes` at most, at least one group. */
static int rows_in(size_t bytes, int k, size_t esz)
{
	const size_t row = esz * (size_t)(k > 0 ? k : 1);
	const size_t rows = bytes / row / GROUP * GROUP;

	return rows < GROUP ? GROUP : rows > (1u << 20) ? 1 << 20 : (int)rows;
}

/*
 * Assumptions: x is m x k, W is n x k, out is m x n with row stride ldo, all row-major, any
 * alignment. The W block is the outer loop, so W is read from memory once per call.
 */
static void gemm_blocked(tile_fn *tile, int mb_max, float *restrict out, int ldo,
			 const float *restrict x, const void *restrict W, size_t esz, int m, int n,
			 int k)
{
	const int mb_fit = rows_in(X_BLOCK_BYTES, k, sizeof(float));
	const int nb = rows_in(W_BLOCK_BYTES, k, esz);
	const int mb = mb_fit < mb_max ? mb_fit : mb_max;

	for (int r0 = 0; r0 < n; r0 += nb) {
		const int r1 = n - r0 < nb ? n : r0 + nb;

		for (int i0 = 0; i0 < m; i0 += mb) {
			const int mi = m - i0 < mb ? m - i0 : mb;
			float *oi = out + (size_t)i0 * (size_t)ldo;
			const float *xi = x + (size_t)i0 * (size_t)k;

			for (int r = r0; r < r1; r += GROUP)
				tile(oi, ldo, xi, W, mi, r, r1 - r < GROUP ? r1 - r : GROUP, k);
		}
	}
}

/* ---- loading a row of W, f32 or BF16 ---------------------------------------------------- */

/*
 * A BF16 weight is the upper half of the f32 with the same value, so widening is a 16-bit
 * shift, exact: the FMAs that follow are those of the f32 kernel on the widened weights.
 */

/* Row r of W (rows of k elements; BF16 when h16). */
static inline const char *w_row(const void *W, size_t r, int k, const int h16)
{
	return (const char *)W + r * (size_t)k * (h16 ? sizeof(uint16_t) : sizeof(float));
}

/* Sixteen weights of row w from column c. */
__attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) static inline __m512
wload_avx512(const char *w, int c, const int h16)
{
	if (h16 == 2)
		return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(
			(const uint16_t *)(const void *)w + c)));
	if (h16)
		return _mm512_castsi512_ps(_mm512_slli_epi32(
			_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(
				(const uint16_t *)(const void *)w + c))), 16));
	return _mm512_loadu_ps((const float *)(const void *)w + c);
}

/* The first cnt (< 16) weights of row w from column c, +0 in the other lanes; reads no more. */
__attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) static inline __m512
wload_tail_avx512(const char *w, int c, int cnt, const int h16)
{
	uint16_t b[16] = { 0 };

	if (!h16)
		return _mm512_maskz_loadu_ps((__mmask16)((1u << cnt) - 1),
					     (const float *)(const void *)w + c);
	memcpy(b, (const uint16_t *)(const void *)w + c, sizeof(uint16_t) * (size_t)cnt);
	return wload_avx512((const char *)b, 0, h16);
}

/* Eight weights of row w from column c. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256
wload_avx2(const char *w, int c, const int h16)
{
	if (h16 == 2)
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(
			(const uint16_t *)(const void *)w + c)));
	if (h16)
		return _mm256_castsi256_ps(_mm256_slli_epi32(
			_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(
				(const uint16_t *)(const void *)w + c))), 16));
	return _mm256_loadu_ps((const float *)(const void *)w + c);
}

/* The first cnt (< 8) weights of row w from column c (mask: those lanes), +0 in the others. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256
wload_tail_avx2(const char *w, int c, int cnt, __m256i mask, const int h16)
{
	uint16_t b[8] = { 0 };

	if (!h16)
		return _mm256_maskload_ps((const float *)(const void *)w + c, mask);
	memcpy(b, (const uint16_t *)(const void *)w + c, sizeof(uint16_t) * (size_t)cnt);
	return wload_avx2((const char *)b, 0, h16);
}

/* ---- AVX-512 -------------------------------------------------------------------------- */

/*
 * How far ahead of the read position the AVX2 four-row tiles (batch > 1) prefetch W: the rows
 * of a tile are contiguous, so the prefetch runs W_PREFETCH_BYTES ahead in address order, one
 * stream, GROUP lines per 16 columns, into the next tiles whatever k is.
 */
#define W_PREFETCH_BYTES ((size_t)32 << 10)
/*
 * The one-row kernels' prefetch: as the read position enters a 4 KiB page, the first lines of
 * the next page, so the hardware's stream (which stops at a page's end) already runs there.
 * Worth little: one Zen 5 core, bench-110m f32, batch 1, four interleaved rounds of bench
 * decode, medians 62.4 tok/s without it and 63.8 with (8 lines; 4 and 16 no better).
 */
#define PAGE_AHEAD 4096
#define PAGE_AHEAD_LINES 8
/* How far ahead the one-row BF16/F16 kernel (rows16_avx512) asks for each line: twice, into
 * L2 and before that with PREFETCHT2 (kernels/mxfp4_q8.c says why). */
#define LINE_AHEAD ((size_t)8 << 10)
#define LINE_FAR ((size_t)16 << 10)

/*
 * The GROUP lines W_PREFETCH_BYTES past the read position at column c (c a multiple of 16)
 * of the tile whose first row is w0: called for every c of f32, every other one of BF16
 * (whose 16 columns of four rows are two lines). Reads nothing: a prefetch past the end of
 * W does not fault.
 */
__attribute__((always_inline)) static inline void
prefetch_next(const char *w0, int c, size_t esz)
{
	const char *p = w0 + W_PREFETCH_BYTES + (size_t)c * esz * GROUP;

	_mm_prefetch(p, _MM_HINT_T0);
	_mm_prefetch(p + 64, _MM_HINT_T0);
	_mm_prefetch(p + 128, _MM_HINT_T0);
	_mm_prefetch(p + 192, _MM_HINT_T0);
}


/*
 * Four rows of W against mr (1..4, a constant where it is inlined) rows of x: out[i][r0 + q]
 * for q < nr, each one 16-lane accumulator over k in order, masked at the tail, then the tree
 * of dot_int.h. Inlined once per mr so the loops unroll and the sixteen accumulators stay in
 * registers.
 *
 * Assumptions: x is mr x k and W n x k row-major (stride k), out has row stride ldo, any
 * alignment; rows r0 + nr .. r0 + 3 of W are not read (their loads repeat row r0); the next
 * four rows of W are prefetched in step with these (decode streams W once).
 */
__attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) static inline void
block_avx512(float *restrict out, int ldo, const float *restrict x, const void *restrict W,
	     int r0, int nr, int k, const int mr, const int h16)
{
	const int tail = k % 16;
	const __mmask16 mask = (__mmask16)((1u << tail) - 1);
	const size_t row = (size_t)k * (h16 ? sizeof(uint16_t) : sizeof(float));
	const size_t esz = h16 ? sizeof(uint16_t) : sizeof(float);
	const char *w0 = w_row(W, (size_t)r0, k, h16);
	const char *w1 = nr > 1 ? w0 + row : w0, *w2 = nr > 2 ? w0 + 2 * row : w0;
	const char *w3 = nr > 3 ? w0 + 3 * row : w0;
	__m512 a[4][GROUP]; /* a[i][q]: row i of x against row r0 + q of W */
	int c = 0;

#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		a[i][0] = a[i][1] = a[i][2] = a[i][3] = _mm512_setzero_ps();
	for (; c + 16 <= k; c += 16) {
		const __m512 w0v = wload_avx512(w0, c, h16), w1v = wload_avx512(w1, c, h16);
		const __m512 w2v = wload_avx512(w2, c, h16), w3v = wload_avx512(w3, c, h16);

		if (mr > 1) {
			/* the next four rows, one line each (BF16: every other line twice) */
			_mm_prefetch(w0 + 4 * row + (size_t)c * esz, _MM_HINT_T0);
			_mm_prefetch(w0 + 5 * row + (size_t)c * esz, _MM_HINT_T0);
			_mm_prefetch(w0 + 6 * row + (size_t)c * esz, _MM_HINT_T0);
			_mm_prefetch(w0 + 7 * row + (size_t)c * esz, _MM_HINT_T0);
		}
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			const __m512 xv = _mm512_loadu_ps(x + (size_t)i * (size_t)k + c);

			a[i][0] = _mm512_fmadd_ps(w0v, xv, a[i][0]);
			a[i][1] = _mm512_fmadd_ps(w1v, xv, a[i][1]);
			a[i][2] = _mm512_fmadd_ps(w2v, xv, a[i][2]);
			a[i][3] = _mm512_fmadd_ps(w3v, xv, a[i][3]);
		}
	}
	if (tail) {
		const __m512 w0v = wload_tail_avx512(w0, c, tail, h16);
		const __m512 w1v = wload_tail_avx512(w1, c, tail, h16);
		const __m512 w2v = wload_tail_avx512(w2, c, tail, h16);
		const __m512 w3v = wload_tail_avx512(w3, c, tail, h16);

#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			const __m512 xv = _mm512_maskz_loadu_ps(mask, x + (size_t)i * (size_t)k + c);

			/* lanes past k keep their sums (an FMA of zeros would turn -0 into +0) */
			a[i][0] = _mm512_mask3_fmadd_ps(w0v, xv, a[i][0], mask);
			a[i][1] = _mm512_mask3_fmadd_ps(w1v, xv, a[i][1], mask);
			a[i][2] = _mm512_mask3_fmadd_ps(w2v, xv, a[i][2], mask);
			a[i][3] = _mm512_mask3_fmadd_ps(w3v, xv, a[i][3], mask);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		dps_dot_store4_512(out + (size_t)i * (size_t)ldo + (size_t)r0, a[i][0], a[i][1], a[i][2],
				   a[i][3], nr);
}

/*
 * Decode (mr = 1 or 2 rows of x): rows r0 .. r0 + nr - 1 of W one after the other, each
 * against the mr rows of x, so that W is read as one sequential stream (its rows are
 * contiguous) which the hardware's prefetcher follows by itself. Each output's sum is
 * block_avx512's, lane for lane and in the same order. Four rows read side by side are four
 * streams: one Zen 5 core, m = 1, the bench-110m shapes (12 layers and the head, 438 MB),
 * eight interleaved rounds: four rows with a burst prefetch 13.4 GB/s, one row with none 23.6
 * (a plain read 22), one row with a prefetch 512 B to 4 KiB ahead 18-22; m = 2: 12.3 -> 18.
 */
__attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) static inline void
rows_avx512(float *restrict out, int ldo, const float *restrict x, const void *restrict W,
	    int r0, int nr, int k, const int mr, const int h16)
{
	const int tail = k % 16;
	const __mmask16 mask = (__mmask16)((1u << tail) - 1);
	__m512 a[2][GROUP]; /* a[i][q]: row i of x against row r0 + q of W */

	for (int q = 0; q < GROUP; q++) {
		const char *w = w_row(W, (size_t)r0 + (size_t)(q < nr ? q : 0), k, h16);
		int c = 0;

#pragma GCC unroll 2
		for (int i = 0; i < mr; i++)
			a[i][q] = _mm512_setzero_ps();
		if (q >= nr)
			continue;
		for (; c + 16 <= k; c += 16) {
			const char *p = w + (size_t)c * (h16 ? sizeof(uint16_t) : sizeof(float));
			const __m512 wv = wload_avx512(w, c, h16);

			if (((uintptr_t)p & (PAGE_AHEAD - 1)) < 64)
				for (int z = 0; z < PAGE_AHEAD_LINES; z++)
					_mm_prefetch(p + PAGE_AHEAD + 64 * z, _MM_HINT_T0);
#pragma GCC unroll 2
			for (int i = 0; i < mr; i++)
				a[i][q] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (size_t)i * (size_t)k + c),
							  a[i][q]);
		}
		if (tail) {
			const __m512 wv = wload_tail_avx512(w, c, tail, h16);

#pragma GCC unroll 2
			for (int i = 0; i < mr; i++)
				a[i][q] = _mm512_mask3_fmadd_ps(
					wv, _mm512_maskz_loadu_ps(mask, x + (size_t)i * (size_t)k + c),
					a[i][q], mask);
		}
	}
#pragma GCC unroll 2
	for (int i = 0; i < mr; i++)
		dps_dot_store4_512(out + (size_t)i * (size_t)ldo + (size_t)r0, a[i][0], a[i][1], a[i][2],
				   a[i][3], nr);
}

/*
 * BF16 or F16 at batch 1: the rows one after the other as rows_avx512, 32 columns (one line of
 * W) a pass, each line asked for LINE_FAR and LINE_AHEAD bytes ahead in address order (the
 * rows are contiguous, so the prefetch runs on into the next rows and tiles). Each output's
 * sum is rows_avx512's, lane for lane. One Zen 5 core, the bench-110m shapes in BF16 from huge
 * pages, runs of 21-25 interleaved rounds (2026-12-06): one request 8 KiB ahead 24.4-29.0
 * GB/s, the page-ahead prefetch of f32 24.2, two rows side by side (two chains) with a
 * prefetch stream 8 KiB ahead into L1 (the kernel before) 21.5-26.7, 8-14% behind (medians of
 * the ratios); 4, 12 and 16 KiB ahead measured behind 8. The second, farther request: eight
 * interleaved runs of bench decode, the products at a median 86% -> 100% of the measured
 * bandwidth, 112 -> 131 tokens/s. (f32, whose FMA eats a whole line, keeps the page-ahead
 * prefetch: one request a line measured 9% slower there, the two requests 12%.)
 */
__attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) static inline void
rows16_avx512(float *restrict out, const float *restrict x, const void *restrict W, int r0,
	      int nr, int k, const int h16)
{
	const int tail = k % 16;
	const __mmask16 mask = (__mmask16)((1u << tail) - 1);
	__m512 a[GROUP];

	for (int q = 0; q < GROUP; q++) {
		const char *w = w_row(W, (size_t)r0 + (size_t)q, k, h16);
		__m512 s = _mm512_setzero_ps();
		int c = 0;

		a[q] = s;
		if (q >= nr)
			continue;
		for (; c + 32 <= k; c += 32) {
			_mm_prefetch(w + LINE_FAR + (size_t)c * sizeof(uint16_t), _MM_HINT_T2);
			_mm_prefetch(w + LINE_AHEAD + (size_t)c * sizeof(uint16_t), _MM_HINT_T1);
			s = _mm512_fmadd_ps(wload_avx512(w, c, h16), _mm512_loadu_ps(x + c), s);
			s = _mm512_fmadd_ps(wload_avx512(w, c + 16, h16), _mm512_loadu_ps(x + c + 16),
					    s);
		}
		if (c + 16 <= k) {
			s = _mm512_fmadd_ps(wload_avx512(w, c, h16), _mm512_loadu_ps(x + c), s);
			c += 16;
		}
		if (tail)
			s = _mm512_mask3_fmadd_ps(wload_tail_avx512(w, c, tail, h16),
						  _mm512_maskz_loadu_ps(mask, x + c), s, mask);
		a[q] = s;
	}
	dps_dot_store4_512(out + r0, a[0], a[1], a[2], a[3], nr);
}

/* tile_fn of block_avx512, h16 a constant: rows of x four at a time, then the rest. */
__attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) static inline void
tile_avx512(float *restrict out, int ldo, const float *restrict x, const void *restrict W,
	    int mi, int r0, int nr, int k, const int h16)
{
	int i = 0;

	if (mi == 1 && h16) {
		rows16_avx512(out, x, W, r0, nr, k, h16);
		return;
	}
	if (mi == 1) {
		rows_avx512(out, ldo, x, W, r0, nr, k, 1, h16);
		return;
	}
	if (mi == 2) {
		rows_avx512(out, ldo, x, W, r0, nr, k, 2, h16);
		return;
	}
	for (; i + 4 <= mi; i += 4)
		block_avx512(out + (size_t)i * (size_t)ldo, ldo, x + (size_t)i * (size_t)k, W, r0,
			     nr, k, 4, h16);
	switch (mi - i) {
	case 1:
		block_avx512(out + (size_t)i * (size_t)ldo, ldo, x + (size_t)i * (size_t)k, W, r0,
			     nr, k, 1, h16);
		break;
	case 2:
		block_avx512(out + (size_t)i * (size_t)ldo, ldo, x + (size_t)i * (size_t)k, W, r0,
			     nr, k, 2, h16);
		break;
	case 3:
		block_avx512(out + (size_t)i * (size_t)ldo, ldo, x + (size_t)i * (size_t)k, W, r0,
			     nr, k, 3, h16);
		break;
	default:
		break;
	}
}

__attribute__((target("avx512f,avx2,fma,f16c"))) static void
tile_f32_avx512(float *restrict out, int ldo, const float *restrict x, const void *restrict W,
		int mi, int r0, int nr, int k)
{
	tile_avx512(out, ldo, x, W, mi, r0, nr, k, 0);
}

__attribute__((target("avx512f,avx2,fma,f16c"))) static void
tile_bf16_avx512(float *restrict out, int ldo, const float *restrict x, const void *restrict W,
		 int mi, int r0, int nr, int k)
{
	tile_avx512(out, ldo, x, W, mi, r0, nr, k, 1);
}

void dps_gemm_f32_avx512(float *restrict out, int ldo, const float *restrict x,
			 const float *restrict W, int m, int n, int k)
{
	if (m >= GEMM_TILE_M_MIN && k >= 16 && !dps_gemm_tile_f32_avx512(out, ldo, x, W, m, n, k))
		return;
	gemm_blocked(tile_f32_avx512, 1 << 20, out, ldo, x, W, sizeof(float), m, n, k);
}

__attribute__((target("avx512f,avx2,fma,f16c"))) static void
tile_f16_avx512(float *restrict out, int ldo, const float *restrict x, const void *restrict W,
		int mi, int r0, int nr, int k)
{
	tile_avx512(out, ldo, x, W, mi, r0, nr, k, 2);
}

void dps_gemm_f16_avx512(float *restrict out, int ldo, const float *restrict x,
			 const uint16_t *restrict W, int m, int n, int k)
{
	if (m >= GEMM_TILE_M_MIN && k >= 16 && !dps_gemm_tile_f16_avx512(out, ldo, x, W, m, n, k))
		return;
	gemm_blocked(tile_f16_avx512, 1 << 20, out, ldo, x, W, sizeof(uint16_t), m, n, k);
}

void dps_gemm_bf16_avx512(float *restrict out, int ldo, const float *restrict x,
			  const uint16_t *restrict W, int m, int n, int k)
{
	if (m >= GEMM_TILE_M_MIN && k >= 16 && !dps_gemm_tile_bf16_avx512(out, ldo, x, W, m, n, k))
		return;
	gemm_blocked(tile_bf16_avx512, 1 << 20, out, ldo, x, W, sizeof(uint16_t), m, n, k);
}

/* ---- AVX2 with FMA -------------------------------------------------------------------- */

/*
 * One half of block_avx2 over the columns [c0, c1) (c0 a multiple of 16; c1 too, or k): lanes
 * off .. off + 7 (off 0 or 8) of the accumulators of mr rows of x against w[0..3], continued
 * from acc[i][q][off ..] and left there.
 */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
half_avx2(float acc[][GROUP][16], const float *restrict x, const char *const w[GROUP], int k,
	  int c0, int c1, const int off, const int mr, const int pf, const int h16)
{
	const size_t esz = h16 ? sizeof(uint16_t) : sizeof(float);
	const int tail = c1 % 16, c16 = c1 - tail;
	const int cnt = tail - off < 0 ? 0 : tail - off > 8 ? 8 : tail - off;
	__m256 a[3][GROUP];

#pragma GCC unroll 3
	for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
		for (int q = 0; q < GROUP; q++)
			a[i][q] = _mm256_loadu_ps(acc[i][q] + off);
	for (int c = c0 + off; c < c16; c += 16) {
		const __m256 w0v = wload_avx2(w[0], c, h16), w1v = wload_avx2(w[1], c, h16);
		const __m256 w2v = wload_avx2(w[2], c, h16), w3v = wload_avx2(w[3], c, h16);

		if (pf && !off && (!h16 || !(c & 16)))
			prefetch_next(w[0], c, esz);
#pragma GCC unroll 3
		for (int i = 0; i < mr; i++) {
			const __m256 xv = _mm256_loadu_ps(x + (size_t)i * (size_t)k + c);

			a[i][0] = _mm256_fmadd_ps(w0v, xv, a[i][0]);
			a[i][1] = _mm256_fmadd_ps(w1v, xv, a[i][1]);
			a[i][2] = _mm256_fmadd_ps(w2v, xv, a[i][2]);
			a[i][3] = _mm256_fmadd_ps(w3v, xv, a[i][3]);
		}
	}
	if (cnt) {
		const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt),
							_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
		const int c = c16 + off;
		const __m256 w0v = wload_tail_avx2(w[0], c, cnt, mask, h16);
		const __m256 w1v = wload_tail_avx2(w[1], c, cnt, mask, h16);
		const __m256 w2v = wload_tail_avx2(w[2], c, cnt, mask, h16);
		const __m256 w3v = wload_tail_avx2(w[3], c, cnt, mask, h16);

		const __m256 keep = _mm256_castsi256_ps(mask);

#pragma GCC unroll 3
		for (int i = 0; i < mr; i++) {
			const __m256 xv = _mm256_maskload_ps(x + (size_t)i * (size_t)k + c, mask);

			/* lanes past k keep their sums (an FMA of zeros would turn -0 into +0) */
			a[i][0] = _mm256_blendv_ps(a[i][0], _mm256_fmadd_ps(w0v, xv, a[i][0]), keep);
			a[i][1] = _mm256_blendv_ps(a[i][1], _mm256_fmadd_ps(w1v, xv, a[i][1]), keep);
			a[i][2] = _mm256_blendv_ps(a[i][2], _mm256_fmadd_ps(w2v, xv, a[i][2]), keep);
			a[i][3] = _mm256_blendv_ps(a[i][3], _mm256_fmadd_ps(w3v, xv, a[i][3]), keep);
		}
	}
#pragma GCC unroll 3
	for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
		for (int q = 0; q < GROUP; q++)
			_mm256_storeu_ps(acc[i][q] + off, a[i][q]);
}

/*
 * One row of x against w[0..3] over the columns [c0, c1) (c0 a multiple of 16), both halves
 * of every accumulator at once: eight ymm accumulators fit, so each line of W is loaded once
 * and W is read as one pass. Lane l of each accumulator still sums elements l, l + 16, ...
 * in that order with the same FMAs as half_avx2 (the halves are independent chains).
 */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
row1_avx2(float acc[][GROUP][16], const float *restrict x, const char *const w[GROUP], int k,
	  int c0, int c1, const int pf, const int h16)
{
	const size_t esz = h16 ? sizeof(uint16_t) : sizeof(float);
	const int c16 = c1 - c1 % 16;
	__m256 lo[GROUP], hi[GROUP];

#pragma GCC unroll 4
	for (int q = 0; q < GROUP; q++) {
		lo[q] = _mm256_loadu_ps(acc[0][q]);
		hi[q] = _mm256_loadu_ps(acc[0][q] + 8);
	}
	for (int c = c0; c < c16; c += 16) {
		const __m256 xl = _mm256_loadu_ps(x + c), xh = _mm256_loadu_ps(x + c + 8);

		if (pf && (!h16 || !(c & 16)))
			prefetch_next(w[0], c, esz);
#pragma GCC unroll 4
		for (int q = 0; q < GROUP; q++) {
			lo[q] = _mm256_fmadd_ps(wload_avx2(w[q], c, h16), xl, lo[q]);
			hi[q] = _mm256_fmadd_ps(wload_avx2(w[q], c + 8, h16), xh, hi[q]);
		}
	}
#pragma GCC unroll 4
	for (int q = 0; q < GROUP; q++) {
		_mm256_storeu_ps(acc[0][q], lo[q]);
		_mm256_storeu_ps(acc[0][q] + 8, hi[q]);
	}
	if (c16 < c1) { /* the tail, each half as half_avx2 does it */
		half_avx2(acc, x, w, k, c16, c1, 0, 1, 0, h16);
		half_avx2(acc, x, w, k, c16, c1, 8, 1, 0, h16);
	}
}

/*
 * mr (<= 3) rows of x against four rows of W over the columns [c0, c1): lanes 0..7 of every
 * accumulator first, then lanes 8..15, twelve 8-lane accumulators at a time in the sixteen
 * ymm registers, continued from acc. Lane l still sums elements l, l + 16, l + 32, ... in that
 * order, with the same FMAs, so the results are those of AVX-512 bit for bit.
 *
 * Assumptions: x is mr x k and W n x k row-major (stride k), any alignment; rows r0 + nr ..
 * r0 + 3 of W are not read (their loads repeat row r0); maskload reads nothing past the mask.
 */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
block_avx2(float acc[][GROUP][16], const float *restrict x, const void *restrict W, int r0,
	   int nr, int k, int c0, int c1, const int mr, const int pf, const int h16)
{
	const size_t row = (size_t)k * (h16 ? sizeof(uint16_t) : sizeof(float));
	const char *w0 = w_row(W, (size_t)r0, k, h16);
	const char *const w[GROUP] = { w0, nr > 1 ? w0 + row : w0, nr > 2 ? w0 + 2 * row : w0,
				       nr > 3 ? w0 + 3 * row : w0 };

	if (mr == 1) {
		row1_avx2(acc, x, w, k, c0, c1, pf, h16);
		return;
	}
	half_avx2(acc, x, w, k, c0, c1, 0, mr, pf, h16);
	half_avx2(acc, x, w, k, c0, c1, 8, mr, pf, h16);
}

/*
 * Decode at batch 1: rows r0 .. r0 + nr - 1 of W one after the other against one row of x, W
 * read as one stream as rows_avx512 reads it; lanes 0..7 and 8..15 of each accumulator are
 * two chains, summed in block_avx2's order (the tail as half_avx2 does it).
 */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
rows_avx2(float *restrict out, const float *restrict x, const void *restrict W, int r0, int nr,
	  int k, const int h16)
{
	const size_t esz = h16 ? sizeof(uint16_t) : sizeof(float);
	const int tail = k % 16, c16 = k - tail;
	__m256 h[GROUP];
	float s[4];

	for (int q = 0; q < GROUP; q++) {
		const char *w = w_row(W, (size_t)r0 + (size_t)(q < nr ? q : 0), k, h16);
		__m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();

		if (q < nr) {
			for (int c = 0; c < c16; c += 16) {
				const char *p = w + (size_t)c * esz;

				if (((uintptr_t)p & (PAGE_AHEAD - 1)) < 64)
					for (int z = 0; z < PAGE_AHEAD_LINES; z++)
						_mm_prefetch(p + PAGE_AHEAD + 64 * z, _MM_HINT_T0);
				lo = _mm256_fmadd_ps(wload_avx2(w, c, h16), _mm256_loadu_ps(x + c), lo);
				hi = _mm256_fmadd_ps(wload_avx2(w, c + 8, h16), _mm256_loadu_ps(x + c + 8),
						     hi);
			}
			for (int off = 0; off < tail; off += 8) {
				const int cnt = tail - off > 8 ? 8 : tail - off;
				const __m256i mask = _mm256_cmpgt_epi32(
					_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
				const __m256 wv = wload_tail_avx2(w, c16 + off, cnt, mask, h16);
				const __m256 xv = _mm256_maskload_ps(x + c16 + off, mask);
				__m256 *a = off ? &hi : &lo;

				/* lanes past k keep their sums (an FMA of zeros would turn -0 into +0) */
				*a = _mm256_blendv_ps(*a, _mm256_fmadd_ps(wv, xv, *a),
						      _mm256_castsi256_ps(mask));
			}
		}
		h[q] = _mm256_add_ps(lo, hi);
	}
	_mm_storeu_ps(s, dps_dot_reduce4(h[0], h[1], h[2], h[3]));
	for (int q = 0; q < nr; q++)
		out[r0 + q] = s[q];
}

/* Columns of a chunk: the four rows of W stay in L1 while every row of the x block passes. */
#define KC_AVX2 1024
#define MB_AVX2 48 /* the most rows of x per tile_avx2 (its accumulators: 12 KiB of stack) */

/*
 * The x block (mi <= MB_AVX2 rows) against four rows of W, in chunks of KC_AVX2 columns: the
 * accumulators wait in acc between chunks. The first tile of each chunk prefetches the next
 * rows of W; the others find theirs in cache.
 */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
tile_avx2(float *restrict out, int ldo, const float *restrict x, const void *restrict W, int mi,
	  int r0, int nr, int k, const int h16)
{
	const size_t lx = (size_t)k;
	float acc[MB_AVX2][GROUP][16];

	if (mi == 1) {
		rows_avx2(out, x, W, r0, nr, k, h16);
		return;
	}
	memset(acc, 0, sizeof(acc[0]) * (size_t)mi); /* +0 in every lane */

	for (int c0 = 0; c0 < k || c0 == 0; c0 += KC_AVX2) {
		const int c1 = k - c0 < KC_AVX2 ? k : c0 + KC_AVX2;
		int i = 0;

		if (mi >= 3) {
			block_avx2(acc, x, W, r0, nr, k, c0, c1, 3, 1, h16);
			for (i = 3; i + 3 <= mi; i += 3)
				block_avx2(acc + i, x + i * lx, W, r0, nr, k, c0, c1, 3, 0, h16);
		}
		if (mi - i == 2)
			block_avx2(acc + i, x + i * lx, W, r0, nr, k, c0, c1, 2, i == 0, h16);
		else if (mi - i == 1)
			block_avx2(acc + i, x + i * lx, W, r0, nr, k, c0, c1, 1, i == 0, h16);
		if (c1 >= k)
			break;
	}
	for (int i = 0; i < mi; i++) {
		float s[4];

		_mm_storeu_ps(s, dps_dot_reduce4(
				    _mm256_add_ps(_mm256_loadu_ps(acc[i][0]), _mm256_loadu_ps(acc[i][0] + 8)),
				    _mm256_add_ps(_mm256_loadu_ps(acc[i][1]), _mm256_loadu_ps(acc[i][1] + 8)),
				    _mm256_add_ps(_mm256_loadu_ps(acc[i][2]), _mm256_loadu_ps(acc[i][2] + 8)),
				    _mm256_add_ps(_mm256_loadu_ps(acc[i][3]), _mm256_loadu_ps(acc[i][3] + 8))));
		for (int q = 0; q < nr; q++)
			out[(size_t)i * (size_t)ldo + (size_t)(r0 + q)] = s[q];
	}
}

__attribute__((target("avx2,fma,f16c"))) static void
tile_f32_avx2(float *restrict out, int ldo, const float *restrict x, const void *restrict W,
	      int mi, int r0, int nr, int k)
{
	tile_avx2(out, ldo, x, W, mi, r0, nr, k, 0);
}

__attribute__((target("avx2,fma,f16c"))) static void
tile_bf16_avx2(float *restrict out, int ldo, const float *restrict x, const void *restrict W,
	       int mi, int r0, int nr, int k)
{
	tile_avx2(out, ldo, x, W, mi, r0, nr, k, 1);
}

void dps_gemm_f32_avx2(float *restrict out, int ldo, const float *restrict x,
		       const float *restrict W, int m, int n, int k)
{
	if (m >= GEMM_TILE_M_MIN && k >= 16 && !dps_gemm_tile_f32_avx2(out, ldo, x, W, m, n, k))
		return;
	gemm_blocked(tile_f32_avx2, MB_AVX2, out, ldo, x, W, sizeof(float), m, n, k);
}

void dps_gemm_bf16_avx2(float *restrict out, int ldo, const float *restrict x,
			const uint16_t *restrict W, int m, int n, int k)
{
	if (m >= GEMM_TILE_M_MIN && k >= 16 && !dps_gemm_tile_bf16_avx2(out, ldo, x, W, m, n, k))
		return;
	gemm_blocked(tile_bf16_avx2, MB_AVX2, out, ldo, x, W, sizeof(uint16_t), m, n, k);
}

__attribute__((target("avx2,fma,f16c"))) static void
tile_f16_avx2(float *restrict out, int ldo, const float *restrict x, const void *restrict W,
	      int mi, int r0, int nr, int k)
{
	tile_avx2(out, ldo, x, W, mi, r0, nr, k, 2);
}

void dps_gemm_f16_avx2(float *restrict out, int ldo, const float *restrict x,
		       const uint16_t *restrict W, int m, int n, int k)
{
	if (m >= GEMM_TILE_M_MIN && k >= 16 && !dps_gemm_tile_f16_avx2(out, ldo, x, W, m, n, k))
		return;
	gemm_blocked(tile_f16_avx2, MB_AVX2, out, ldo, x, W, sizeof(uint16_t), m, n, k);
}
