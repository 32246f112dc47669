/* SPDX-License-Identifier: MIT */
/*
 * kernels/gemm_tile.c - the register-tile form of dpshard's batch-invariant product (see
 * gemm.h, gemm_int.h), for prefill-sized m: dps_gemm_f32_avx2 / _avx512 (gemm_dot.c) call it
 * from GEMM_TILE_M_MIN rows of x on, on each thread's slice of output columns.
 *
 * The dot-product form keeps one vector accumulator per output, summing k in lanes, and so
 * loads a vector of x and of W for every few FMAs; at large m that makes it load-bound. Here
 * each lane of gemm.h's order becomes a plain sequential sum over a strided subset of k (lane
 * l: columns l, l + 16, l + 32, ... in that order), which an outer-product tile computes with
 * one load per output row and column per step instead of one per output: x and W are packed
 * so that, for each lane in turn, a lane's columns lie one after the other ("lane-major"), and
 * a tile of MR rows of x by NR rows of W broadcasts one value of x per row and FMAs it into MR x
 * NR accumulators, each one output's lane sum, started at +0 and run over the whole lane
 * without a break. The sixteen lane sums of the tile then go through gemm.h's tree, vectorised
 * across the tile's outputs. Each output therefore gets the very FMAs and adds of the
 * dot-product form, in the same order: the bits do not depend on which form ran, nor on m, the
 * tile an output falls in, or the blocking.
 *
 * BF16 weights are widened to f32 (exact) while W is packed, so the kernels and their sums are
 * the f32 ones and a BF16 product is the f32 product of the widened weights, bit for bit.
 *
 * Blocking: x is packed whole, once per call (MR-row panels); W a block of columns at a time
 * (NR-row panels, B_BLOCK_BYTES in all, kept in L2 while every panel of x passes).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "common/f16.h"
#include "kernels/gemm.h"
#include "kernels/gemm_int.h"

#define LANES 16		     /* gemm.h's lanes */
#define B_BLOCK_BYTES ((size_t)256 << 10) /* packed W per block: half of a Zen 3 L2 */

#define PACK_AHEAD 4 /* lines of W prefetched ahead of the packing, per row */

#define MR_AVX2 6 /* 6 x 16: twelve ymm accumulators, two of W, one broadcast */
#define NR_AVX2 16
#define MR_AVX512 12 /* 12 x 32: twenty-four zmm accumulators */
#define NR_AVX512 32

/* ---- the thread's packing buffers ------------------------------------------------------ */

struct grow_buf {
	float *p;
	size_t cap; /* floats */
};

struct tile_bufs {
	struct grow_buf x, w, lanes;
};

static pthread_key_t bufs_key;
static pthread_once_t bufs_once = PTHREAD_ONCE_INIT;
static int bufs_key_rc;

static void bufs_free(void *arg)
{
	struct tile_bufs *b = arg;

	free(b->x.p);
	free(b->w.p);
	free(b->lanes.p);
	free(b);
}

static void bufs_key_make(void)
{
	bufs_key_rc = pthread_key_create(&bufs_key, bufs_free);
}

/* The calling thread's buffers (freed when it exits), or NULL. */
static struct tile_bufs *bufs_get(void)
{
	struct tile_bufs *b;

	pthread_once(&bufs_once, bufs_key_make);
	if (bufs_key_rc)
		return NULL;
	b = pthread_getspecific(bufs_key);
	if (!b) {
		b = calloc(1, sizeof(*b));
		if (!b)
			return NULL;
		if (pthread_setspecific(bufs_key, b)) {
			free(b);
			return NULL;
		}
	}
	return b;
}

/* At least `floats` floats, 64-byte aligned, or NULL (the old contents are not kept). */
static float *grow(struct grow_buf *g, size_t floats)
{
	if (g->cap < floats) {
		const size_t bytes = (sizeof(float) * floats + 63) / 64 * 64;
		float *p = aligned_alloc(64, bytes);

		if (!p)
			return NULL;
		free(g->p);
		g->p = p;
		g->cap = floats;
	}
	return g->p;
}

/* ---- packing --------------------------------------------------------------------------- */

/*
 * A panel of `rows` (<= w) rows of src (row stride k) in lane-major order: column 16 t + l of
 * row e goes to p[(l * T + t) * w + e], T = ceil(k / 16). Rows rows .. w - 1, and the places
 * of columns past k, hold +0 (the kernels never read the latter).
 */
static void pack_panel(float *restrict p, const float *restrict src, int rows, int w, int k,
		       int T)
{
	if (rows < w || k < LANES * T)
		memset(p, 0, sizeof(float) * (size_t)LANES * (size_t)T * (size_t)w);
	for (int e = 0; e < rows; e++) {
		const float *s = src + (size_t)e * (size_t)k;

		for (int t = 0; t < T; t++) {
			const int c0 = LANES * t, cnt = k - c0 < LANES ? k - c0 : LANES;
			float *d = p + (size_t)t * (size_t)w + (size_t)e;

			for (int l = 0; l < cnt; l++)
				d[(size_t)l * (size_t)T * (size_t)w] = s[c0 + l];
		}
	}
}

/* pack_panel of BF16 (h16 1) or F16 (2) rows, each weight widened to f32 (exact) as it is
 * placed. */
static void pack_panel_half(float *restrict p, const uint16_t *restrict src, int rows, int w,
			    int k, int T, int h16)
{
	if (rows < w || k < LANES * T)
		memset(p, 0, sizeof(float) * (size_t)LANES * (size_t)T * (size_t)w);
	for (int e = 0; e < rows; e++) {
		const uint16_t *s = src + (size_t)e * (size_t)k;

		for (int t = 0; t < T; t++) {
			const int c0 = LANES * t, cnt = k - c0 < LANES ? k - c0 : LANES;
			float *d = p + (size_t)t * (size_t)w + (size_t)e;

			for (int l = 0; l < cnt; l++)
				d[(size_t)l * (size_t)T * (size_t)w] = h16 == 2 ? dps_f16_to_f32(s[c0 + l])
										: dps_bf16_to_f32(s[c0 + l]);
		}
	}
}

/* Eight weights of row s (f32; BF16 widened by a 16-bit shift; F16 by vcvtph2ps; exact). */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256
row8_avx2(const char *s, const int h16)
{
	if (h16 == 2)
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)s));
	if (h16)
		return _mm256_castsi256_ps(_mm256_slli_epi32(
			_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)s)), 16));
	return _mm256_loadu_ps((const float *)(const void *)s);
}

/*
 * pack_panel for sixteen rows (e0 .. e0 + 15) of a w-row panel of W, vectorised: for each t the
 * 16 x 16 block of columns 16 t .. 16 t + 15 is transposed in registers as four 8 x 8 blocks.
 * Requires k a multiple of 16 and all sixteen rows present.
 */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
pack_rows16(float *restrict p, const void *restrict src, int e0, int w, int k, int T,
	    const int h16)
{
	const size_t lane = (size_t)T * (size_t)w; /* floats between lanes l and l + 1 */
	const size_t esz = h16 ? sizeof(uint16_t) : sizeof(float), row = esz * (size_t)k;
	const char *src8 = src;

	for (int t = 0; t < T; t++) {
		/* W comes from memory, sixteen rows at once: more than the hardware prefetches */
		for (int e = 0; e < 16 && t + PACK_AHEAD < T; e++)
			_mm_prefetch(src8 + (size_t)e * row + esz * (size_t)(LANES * (t + PACK_AHEAD)),
				     _MM_HINT_T0);
		for (int rb = 0; rb < 16; rb += 8)
			for (int cb = 0; cb < 16; cb += 8) {
				const char *s = src8 + (size_t)rb * row + esz * (size_t)(LANES * t + cb);
				__m256 r[8], u[8], v[8];

				for (int e = 0; e < 8; e++)
					r[e] = row8_avx2(s + (size_t)e * row, h16);
				for (int e = 0; e < 8; e += 2) {
					u[e] = _mm256_unpacklo_ps(r[e], r[e + 1]);
					u[e + 1] = _mm256_unpackhi_ps(r[e], r[e + 1]);
				}
				for (int e = 0; e < 8; e += 4) {
					v[e] = _mm256_shuffle_ps(u[e], u[e + 2], 0x44);
					v[e + 1] = _mm256_shuffle_ps(u[e], u[e + 2], 0xee);
					v[e + 2] = _mm256_shuffle_ps(u[e + 1], u[e + 3], 0x44);
					v[e + 3] = _mm256_shuffle_ps(u[e + 1], u[e + 3], 0xee);
				}
				/* v[c] (c < 4): column c of rows 0-3 in its low half, column c + 4 in
				 * its high half; v[c + 4] the same of rows 4-7. */
				for (int c = 0; c < 4; c++) {
					const __m256 lo = _mm256_permute2f128_ps(v[c], v[c + 4], 0x20);
					const __m256 hi = _mm256_permute2f128_ps(v[c], v[c + 4], 0x31);
					float *d = p + (size_t)t * (size_t)w + (size_t)(e0 + rb);

					_mm256_storeu_ps(d + (size_t)(cb + c) * lane, lo);
					_mm256_storeu_ps(d + (size_t)(cb + c + 4) * lane, hi);
				}
			}
	}
}

__attribute__((target("avx2,fma,f16c"))) static void
pack_rows16_f32_avx2(float *restrict p, const void *restrict src, int e0, int w, int k, int T)
{
	pack_rows16(p, src, e0, w, k, T, 0);
}

__attribute__((target("avx2,fma,f16c"))) static void
pack_rows16_bf16_avx2(float *restrict p, const void *restrict src, int e0, int w, int k, int T)
{
	pack_rows16(p, src, e0, w, k, T, 1);
}

__attribute__((target("avx2,fma,f16c"))) static void
pack_rows16_f16_avx2(float *restrict p, const void *restrict src, int e0, int w, int k, int T)
{
	pack_rows16(p, src, e0, w, k, T, 2);
}

/* ---- the tree ------------------------------------------------------------------------- */

/*
 * gemm.h's tree on the sixteen lane sums of every output of a tile (lb: 16 x tile floats,
 * lane-major, tile a multiple of 8), then the rows x cols outputs present to out (row stride
 * ldo; the tile's rows are nr floats apart in lb).
 */
__attribute__((target("avx2,fma"))) static void
tree_store(float *restrict out, int ldo, float *restrict lb, int tile, int nr, int rows,
	   int cols)
{
	for (int half = 8; half >= 2; half /= 2)
		for (int l = 0; l < half; l++)
			for (int e = 0; e < tile; e += 8)
				_mm256_storeu_ps(lb + (size_t)l * tile + e,
						 _mm256_add_ps(_mm256_loadu_ps(lb + (size_t)l * tile + e),
							       _mm256_loadu_ps(lb + (size_t)(l + half) * tile + e)));
	for (int i = 0; i < rows; i++) {
		const float *a = lb + (size_t)i * nr, *b = lb + (size_t)tile + (size_t)i * nr;
		float *o = out + (size_t)i * (size_t)ldo;
		int j = 0;

		for (; j + 8 <= cols; j += 8)
			_mm256_storeu_ps(o + j, _mm256_add_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j)));
		for (; j < cols; j++)
			o[j] = a[j] + b[j];
	}
}

/* ---- the register tiles ----------------------------------------------------------------- */

typedef void kernel_fn(float *restrict lb, const float *restrict pa, const float *restrict pb,
		       int T, int tail);

/*
 * Lane l's sum of each of the tile's outputs into lb[l][i][j]: over its T terms (T - 1 when
 * k % 16 <= l < 16, k not a multiple of 16), each acc = fma(x, w, acc) from +0, in order.
 *
 * Assumptions: pa is a packed panel of MR_AVX2 rows of x, pb one of NR_AVX2 rows of W (pack_panel,
 * same T), pb 32-byte aligned.
 */
__attribute__((target("avx2,fma"))) static void
kernel_avx2(float *restrict lb, const float *restrict pa, const float *restrict pb, int T, int tail)
{
	for (int l = 0; l < LANES; l++) {
		const int tl = tail && l >= tail ? T - 1 : T;
		const float *a = pa + (size_t)l * (size_t)T * MR_AVX2;
		const float *b = pb + (size_t)l * (size_t)T * NR_AVX2;
		float *d = lb + (size_t)l * (MR_AVX2 * NR_AVX2);
		__m256 c[MR_AVX2][2];

#pragma GCC unroll 6
		for (int i = 0; i < MR_AVX2; i++)
			c[i][0] = c[i][1] = _mm256_setzero_ps();
		for (int t = 0; t < tl; t++, a += MR_AVX2, b += NR_AVX2) {
			const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);

#pragma GCC unroll 6
			for (int i = 0; i < MR_AVX2; i++) {
				const __m256 ai = _mm256_broadcast_ss(a + i);

				c[i][0] = _mm256_fmadd_ps(ai, b0, c[i][0]);
				c[i][1] = _mm256_fmadd_ps(ai, b1, c[i][1]);
			}
		}
#pragma GCC unroll 6
		for (int i = 0; i < MR_AVX2; i++) {
			_mm256_storeu_ps(d + i * NR_AVX2, c[i][0]);
			_mm256_storeu_ps(d + i * NR_AVX2 + 8, c[i][1]);
		}
	}
}

/* kernel_avx2 with MR_AVX512 x NR_AVX512 outputs in zmm registers; pb 64-byte aligned. */
__attribute__((target("avx512f,avx2,fma"))) static void
kernel_avx512(float *restrict lb, const float *restrict pa, const float *restrict pb, int T,
	      int tail)
{
	for (int l = 0; l < LANES; l++) {
		const int tl = tail && l >= tail ? T - 1 : T;
		const float *a = pa + (size_t)l * (size_t)T * MR_AVX512;
		const float *b = pb + (size_t)l * (size_t)T * NR_AVX512;
		float *d = lb + (size_t)l * (MR_AVX512 * NR_AVX512);
		__m512 c[MR_AVX512][2];

#pragma GCC unroll 12
		for (int i = 0; i < MR_AVX512; i++)
			c[i][0] = c[i][1] = _mm512_setzero_ps();
		for (int t = 0; t < tl; t++, a += MR_AVX512, b += NR_AVX512) {
			const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);

#pragma GCC unroll 12
			for (int i = 0; i < MR_AVX512; i++) {
				const __m512 ai = _mm512_set1_ps(a[i]);

				c[i][0] = _mm512_fmadd_ps(ai, b0, c[i][0]);
				c[i][1] = _mm512_fmadd_ps(ai, b1, c[i][1]);
			}
		}
#pragma GCC unroll 12
		for (int i = 0; i < MR_AVX512; i++) {
			_mm512_storeu_ps(d + i * NR_AVX512, c[i][0]);
			_mm512_storeu_ps(d + i * NR_AVX512 + 16, c[i][1]);
		}
	}
}

/* ---- the blocking ----------------------------------------------------------------------- */

/*
 * Assumptions: x is m x k, W n x k (f32, or BF16 or F16 when h16 is 1 or 2: widened as it is
 * packed), out
 * m x n with row stride ldo, all row-major, any alignment; k >= 1. The caller has checked
 * the CPU runs `kern`.
 */
static int gemm_tiled(kernel_fn *kern, const int mr, const int nr, float *restrict out, int ldo,
		      const float *restrict x, const void *restrict W, const int h16, int m,
		      int n, int k)
{
	const size_t esz = h16 ? sizeof(uint16_t) : sizeof(float);
	const int T = (k + LANES - 1) / LANES, tail = k % LANES;
	const size_t pa_len = (size_t)LANES * (size_t)T * (size_t)mr; /* floats per panel */
	const size_t pb_len = (size_t)LANES * (size_t)T * (size_t)nr;
	const int pm = (m + mr - 1) / mr, pn_all = (n + nr - 1) / nr;
	const size_t fit = B_BLOCK_BYTES / (sizeof(float) * pb_len);
	const int pn_max = fit < 1 ? 1 : fit > (size_t)pn_all ? pn_all : (int)fit;
	struct tile_bufs *bf = bufs_get();
	float *pa, *pb, *lb;

	if (!bf)
		return -ENOMEM;
	pa = grow(&bf->x, pa_len * (size_t)pm);
	pb = grow(&bf->w, pb_len * (size_t)pn_max);
	lb = grow(&bf->lanes, (size_t)LANES * (size_t)(mr * nr));
	if (!pa || !pb || !lb)
		return -ENOMEM;

	for (int p = 0; p < pm; p++)
		pack_panel(pa + (size_t)p * pa_len, x + (size_t)p * (size_t)mr * (size_t)k,
			   m - p * mr < mr ? m - p * mr : mr, mr, k, T);
	for (int q0 = 0; q0 < pn_all; q0 += pn_max) {
		const int pn = pn_all - q0 < pn_max ? pn_all - q0 : pn_max;

		for (int q = 0; q < pn; q++) {
			const int j = (q0 + q) * nr, rows = n - j < nr ? n - j : nr;
			float *dst = pb + (size_t)q * pb_len;
			const char *src = (const char *)W + (size_t)j * (size_t)k * esz;

			if (rows == nr && !tail)
				for (int e0 = 0; e0 < nr; e0 += 16)
					(h16 == 2 ? pack_rows16_f16_avx2
					 : h16	  ? pack_rows16_bf16_avx2
						  : pack_rows16_f32_avx2)(
						dst, src + (size_t)e0 * (size_t)k * esz, e0, nr, k, T);
			else if (h16)
				pack_panel_half(dst, (const uint16_t *)(const void *)src, rows, nr, k, T,
						h16);
			else
				pack_panel(dst, (const float *)(const void *)src, rows, nr, k, T);
		}
		for (int p = 0; p < pm; p++) {
			const int i = p * mr, rows = m - i < mr ? m - i : mr;

			for (int q = 0; q < pn; q++) {
				const int j = (q0 + q) * nr, cols = n - j < nr ? n - j : nr;

				kern(lb, pa + (size_t)p * pa_len, pb + (size_t)q * pb_len, T, tail);
				tree_store(out + (size_t)i * (size_t)ldo + (size_t)j, ldo, lb, mr * nr, nr,
					   rows, cols);
			}
		}
	}
	return 0;
}

int dps_gemm_tile_f32_avx2(float *restrict out, int ldo, const float *restrict x,
			   const float *restrict W, int m, int n, int k)
{
	return gemm_tiled(kernel_avx2, MR_AVX2, NR_AVX2, out, ldo, x, W, 0, m, n, k);
}

int dps_gemm_tile_bf16_avx2(float *restrict out, int ldo, const float *restrict x,
			    const uint16_t *restrict W, int m, int n, int k)
{
	return gemm_tiled(kernel_avx2, MR_AVX2, NR_AVX2, out, ldo, x, W, 1, m, n, k);
}

int dps_gemm_tile_f32_avx512(float *restrict out, int ldo, const float *restrict x,
			     const float *restrict W, int m, int n, int k)
{
	return gemm_tiled(kernel_avx512, MR_AVX512, NR_AVX512, out, ldo, x, W, 0, m, n, k);
}

int dps_gemm_tile_bf16_avx512(float *restrict out, int ldo, const float *restrict x,
			      const uint16_t *restrict W, int m, int n, int k)
{
	return gemm_tiled(kernel_avx512, MR_AVX512, NR_AVX512, out, ldo, x, W, 1, m, n, k);
}

int dps_gemm_tile_f16_avx2(float *restrict out, int ldo, const float *restrict x,
			   const uint16_t *restrict W, int m, int n, int k)
{
	return gemm_tiled(kernel_avx2, MR_AVX2, NR_AVX2, out, ldo, x, W, 2, m, n, k);
}

int dps_gemm_tile_f16_avx512(float *restrict out, int ldo, const float *restrict x,
			     const uint16_t *restrict W, int m, int n, int k)
{
	return gemm_tiled(kernel_avx512, MR_AVX512, NR_AVX512, out, ldo, x, W, 2, m, n, k);
}
