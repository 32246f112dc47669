/* SPDX-License-Identifier: MIT */
/*
 * kernels/mxfp4.c - the products with MXFP4 weights (see mxfp4.h): GPT-OSS's expert
 * projections, at decode (m = the rows routed to an expert in one step, mostly 1 to a few,
 * where the product is bound by the weights' bytes) and at prefill (m up to hundreds).
 *
 * dps_linear_mxfp4 splits the rows of W (the output columns) over the rank's pool in slices
 * of whole groups of four rows, and takes one group at a time:
 *
 * - m <= MR (1 with AVX2, 4 with AVX-512): each block of 32 weights is decoded into registers
 *   and used at once by every row of x; the accumulators stay in registers over all of k.
 * - MR < m < BIG_M: the group's four rows are decoded once into the thread's panel (4 x k
 *   floats, which stays in L1 or L2), then multiplied by x, MR rows at a time, with the same
 *   arithmetic as above.
 * - m >= BIG_M: panels of rows are dequantized to f32 and multiplied by dps_linear_f32, whose
 *   kernel blocks for the caches as a large product needs.
 *
 * Either way each weight byte is read and decoded once per call (but when the panels cannot be
 * allocated: then every MR rows of x decode again). Decoding is an exact table
 * lookup of the sixteen codes: every E2M1 value is a bfloat16, so AVX2 looks up the two upper
 * bytes of each value's f32 bits with vpshufb (the lower two are zero) and multiplies by the
 * block's scale; AVX-512 looks up the f32 values, already multiplied by the block's scale, with
 * vpermps. The products are the exact values of the reference (a small integer times a power of
 * two), and every path sums them in the order of gemm.h (sixteen lanes over k in order, FMA,
 * the tree of dot_int.h), as the reference does with fmaf, and as dps_linear_f32 does on the
 * dequantized panels under "auto": all paths give the reference's bits, so a row's result
 * depends neither on the other rows of x (on either side of BIG_M) nor on the number of
 * threads (tests/check_mxfp4.c). Under an explicit --blis-arch the large-m path is BLIS's.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "common/dps.h"
#include "kernels/dot_int.h"
#include "kernels/gemm.h"
#include "kernels/mxfp4.h"
#include "kernels/pool.h"

#define MR_AVX2 1   /* rows of x per pass: 4 x 2 accumulators (16 lanes as two halves) */
#define MR_AVX512 4 /* 4 x 4 of the 32 zmm registers */
#define GROUP 4     /* rows of W per pass */
/*
 * At batch 1 the AVX-512 kernel asks for each line of the codes (and of the scales) into L2
 * as far ahead as the same place in a later group of rows, at least LEAD_MIN bytes on: its
 * four rows side by side are four streams the hardware's prefetcher alone kept at 4.6 GB/s
 * (bench-gpt-oss without -q, one thread, 2026-12-06: the experts at 16-18% of the bandwidth,
 * 51 tokens/s; with the hint 7.9-8.6 GB/s, 28-31%, 61-72 tokens/s; 2 or 4 KiB no different,
 * and less than a group ahead nothing gained, its lines being the group's own).
 */
#define LEAD_MIN 2048

/*
 * From this m on, the product goes through dps_linear_f32 on dequantized panels. Below it the
 * panel kernel here keeps up with BLIS's f32 kernels on the same weights (one Zen 3 core with
 * AVX2, 2880 x 2880: 32-36 GFLOP/s at m = 33..63 against 33-38), but it reads all of x for
 * every four rows of W, which stops fitting the caches as m grows; through dps_linear_f32 the
 * product ran at 38-45 GFLOP/s from m = 64 on.
 */
#define BIG_M 64

/*
 * Bytes of f32 weights per panel of the large-m path: hundreds of rows, work for every thread
 * in each dps_linear_f32, and a panel that stays in L3 while it is multiplied.
 */
#define BIG_PANEL_BYTES ((size_t)4 << 20)

const float dps_mxfp4_values[16] = { 0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
				     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f };

/*
 * The f32 bits of 2^(e - 127) for each E8M0 scale byte e: e << 23 for 1 <= e <= 254; 2^-127 is
 * a subnormal (2^22 of its ulp); 255 is the format's NaN. A table, so that the kernels load a
 * block's scale with one broadcast.
 */
#define SCALE_BITS(e) ((e) == 0 ? 0x00400000u : (e) == 255 ? 0x7fc00000u : (uint32_t)(e) << 23)
#define SCALES_4(e) SCALE_BITS(e), SCALE_BITS(e + 1), SCALE_BITS(e + 2), SCALE_BITS(e + 3)
#define SCALES_16(e) SCALES_4(e), SCALES_4(e + 4), SCALES_4(e + 8), SCALES_4(e + 12)
#define SCALES_64(e) SCALES_16(e), SCALES_16(e + 16), SCALES_16(e + 32), SCALES_16(e + 48)
static const uint32_t scale_bits[256] = { SCALES_64(0), SCALES_64(64), SCALES_64(128),
					  SCALES_64(192) };

static inline float scale_of(uint8_t e)
{
	float f;

	memcpy(&f, &scale_bits[e], sizeof(f));
	return f;
}

/*
 * Element c of row r of W. The product of a code's value (at most three significant bits) and
 * a power of two is exact in f32, down to the smallest, 2^-128, which is a subnormal; only
 * 3 .. 6 times 2^127 and above overflow, to infinity, as the exact value rounds.
 */
static float weight_at(const uint8_t *blocks, const uint8_t *scales, int r, int c, int k)
{
	const size_t b = (size_t)r * (size_t)(k / 32) + (size_t)(c / 32);
	const uint8_t byte = blocks[b * 16 + (size_t)(c % 32) / 2];

	return dps_mxfp4_values[c % 2 ? byte >> 4 : byte & 15] * scale_of(scales[b]);
}

void dps_mxfp4_dequant_row(float *restrict out, const uint8_t *restrict blocks,
			   const uint8_t *restrict scales, int r, int k)
{
	for (int c = 0; c < k; c++)
		out[c] = weight_at(blocks, scales, r, c, k);
}

void dps_linear_mxfp4_ref(float *out, const float *x, const uint8_t *blocks,
			  const uint8_t *scales, int m, int n, int k)
{
	DPS_ASSERT(k % 32 == 0);
	for (int i = 0; i < m; i++) {
		const float *xi = x + (size_t)i * (size_t)k;

		for (int r = 0; r < n; r++) {
			float a[16] = { 0.0f }; /* the order of gemm.h (k is a multiple of 16) */

			for (int c = 0; c < k; c++)
				a[c % 16] = fmaf(weight_at(blocks, scales, r, c, k), xi[c], a[c % 16]);
			out[(size_t)i * (size_t)n + (size_t)r] = dps_dot_tree_ref(a);
		}
	}
}

/* ---- AVX2 --------------------------------------------------------------------------- */

/* A block's scale in every lane: one broadcast load. */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 scale_avx2(uint8_t e)
{
	return _mm256_castsi256_ps(_mm256_set1_epi32((int)scale_bits[e]));
}

/*
 * The 32 weights of one block times s, in order: *wj holds elements 8j .. 8j + 7. A code's
 * f32 bits are two looked-up bytes (the bfloat16 of its value) over 16 zero bits.
 *
 * Assumptions: p is the block's 16 bytes, any alignment. The unpacks work within 128-bit
 * lanes, so the bytes go in first in the order that makes each vector's eight elements
 * consecutive: lane 0 takes bytes 0, 1, 4, 5, 8, 9, 12, 13 (elements 0-3, 8-11, 16-19,
 * 24-27), lane 1 the others.
 */
__attribute__((target("avx2,fma"), always_inline)) static inline void
decode_avx2(const uint8_t *p, __m256 s, __m256 *w0, __m256 *w1, __m256 *w2, __m256 *w3)
{
	/* hi8[c], lo8[c]: the bytes of the bfloat16 of dps_mxfp4_values[c] (1.5: 0x3f, 0xc0). */
	const __m256i hi8 = _mm256_setr_epi8(
		0x00, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40, -0x80, -0x41, -0x41, -0x41, -0x40,
		-0x40, -0x40, -0x40, 0x00, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40, -0x80, -0x41,
		-0x41, -0x41, -0x40, -0x40, -0x40, -0x40); /* 0x80, 0xbf, 0xc0 for the negatives */
	const __m256i lo8 = _mm256_setr_epi8(
		0x00, 0x00, -0x80, -0x40, 0x00, 0x40, -0x80, -0x40, 0x00, 0x00, -0x80, -0x40, 0x00,
		0x40, -0x80, -0x40, 0x00, 0x00, -0x80, -0x40, 0x00, 0x40, -0x80, -0x40, 0x00, 0x00,
		-0x80, -0x40, 0x00, 0x40, -0x80, -0x40); /* 0x80 and 0xc0 */
	const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 0, 0, 0, 0, 0, 0, 0, 0,
					      2, 3, 6, 7, 10, 11, 14, 15, 0, 0, 0, 0, 0, 0, 0, 0);
	const __m256i bytes = _mm256_shuffle_epi8(
		_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p)), pick);
	/* Each byte's low nibble (the even element) then its high nibble, as bytes 0..15. */
	const __m256i codes = _mm256_and_si256(
		_mm256_unpacklo_epi8(bytes, _mm256_srli_epi16(bytes, 4)), _mm256_set1_epi8(0x0f));
	const __m256i hi = _mm256_shuffle_epi8(hi8, codes), lo = _mm256_shuffle_epi8(lo8, codes);
	const __m256i h01 = _mm256_unpacklo_epi8(lo, hi), h23 = _mm256_unpackhi_epi8(lo, hi);
	const __m256i zero = _mm256_setzero_si256();

	*w0 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, h01)), s);
	*w1 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, h01)), s);
	*w2 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, h23)), s);
	*w3 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, h23)), s);
}

/*
 * Rows r0 .. r0 + nr - 1 of W (nr <= 4) decoded into panel, row q at panel + q * k.
 * Assumptions: k a multiple of 32; panel holds nr * k floats, any alignment.
 */
__attribute__((target("avx2,fma"))) static void panel_avx2(float *restrict panel,
							   const uint8_t *restrict blocks,
							   const uint8_t *restrict scales, int r0,
							   int nr, int k)
{
	const int nb = k / 32;

	for (int q = 0; q < nr; q++) {
		const size_t row = (size_t)(r0 + q) * (size_t)nb;
		float *pq = panel + (size_t)q * (size_t)k;

		for (int b = 0; b < nb; b++) {
			float *dst = pq + 32 * (size_t)b;
			__m256 w0, w1, w2, w3;

			decode_avx2(blocks + (row + (size_t)b) * 16,
				    scale_avx2(scales[row + (size_t)b]), &w0, &w1, &w2, &w3);
			_mm256_storeu_ps(dst, w0);
			_mm256_storeu_ps(dst + 8, w1);
			_mm256_storeu_ps(dst + 16, w2);
			_mm256_storeu_ps(dst + 24, w3);
		}
	}
}

/*
 * out[i * ldo + r0 + q] (i < mr, q < nr) from rows r0 .. r0 + 3 of W and mr rows of x, the
 * weights decoded here (from_panel 0) or read from panel (1: rows of k floats, from
 * panel_avx2: the same values). Each output is the sixteen lanes of gemm.h's order as two
 * 8-lane halves: w0 and w2 (elements 0-7 and 16-23 of a block) go to lanes 0-7, w1 and w3 to
 * lanes 8-15, each lane over k in order; then the tree of dot_int.h. Inlined once per
 * (mr, from_panel), constants where it is inlined.
 *
 * Assumptions: k a multiple of 32; x is mr x k row-major, any alignment; rows from nr on
 * repeat row r0 (computed, not stored).
 */
__attribute__((target("avx2,fma"), always_inline)) static inline void
rows_avx2(float *restrict out, int ldo, const float *restrict x, const uint8_t *blocks,
	  const uint8_t *scales, const float *restrict panel, int r0, int nr, int k, const int mr,
	  const int from_panel)
{
	const int nb = k / 32;
	const uint8_t *bq[GROUP], *sq[GROUP];
	const float *pq[GROUP];
	__m256 lo[MR_AVX2][GROUP], hi[MR_AVX2][GROUP]; /* lanes 0-7 and 8-15 */

	for (int q = 0; q < GROUP; q++) {
		const int row = q < nr ? q : 0;

		bq[q] = blocks + (size_t)(r0 + row) * (size_t)nb * 16;
		sq[q] = scales + (size_t)(r0 + row) * (size_t)nb;
		pq[q] = from_panel ? panel + (size_t)row * (size_t)k : NULL;
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
		for (int q = 0; q < GROUP; q++)
			lo[i][q] = hi[i][q] = _mm256_setzero_ps();
	for (int b = 0; b < nb; b++) {
#pragma GCC unroll 4
		for (int q = 0; q < GROUP; q++) {
			__m256 w0, w1, w2, w3;

			if (from_panel) {
				const float *src = pq[q] + 32 * (size_t)b;

				w0 = _mm256_loadu_ps(src);
				w1 = _mm256_loadu_ps(src + 8);
				w2 = _mm256_loadu_ps(src + 16);
				w3 = _mm256_loadu_ps(src + 24);
			} else {
				decode_avx2(bq[q] + 16 * (size_t)b, scale_avx2(sq[q][b]),
					    &w0, &w1, &w2, &w3);
			}
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++) {
				const float *xb = x + (size_t)i * (size_t)k + 32 * (size_t)b;

				lo[i][q] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb), lo[i][q]);
				hi[i][q] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), hi[i][q]);
				lo[i][q] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xb + 16), lo[i][q]);
				hi[i][q] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xb + 24), hi[i][q]);
			}
		}
	}
	/* All GROUP reduced (constant indices keep the sums in registers), the first nr stored. */
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++) {
		float sums[GROUP];

		_mm_storeu_ps(sums, dps_dot_reduce4(_mm256_add_ps(lo[i][0], hi[i][0]),
						    _mm256_add_ps(lo[i][1], hi[i][1]),
						    _mm256_add_ps(lo[i][2], hi[i][2]),
						    _mm256_add_ps(lo[i][3], hi[i][3])));
		for (int q = 0; q < nr; q++)
			out[(size_t)i * (size_t)ldo + (size_t)(r0 + q)] = sums[q];
	}
}

/* ---- AVX-512 ------------------------------------------------------------------------ */

__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline __m512 scale_avx512(uint8_t e)
{
	return _mm512_castsi512_ps(_mm512_set1_epi32((int)scale_bits[e]));
}

/*
 * The 32 weights of one block in order (*w0: elements 0-15, *w1: 16-31) from table, the
 * sixteen values already times the block's scale. Byte i of the block goes to lane i; vpermps
 * reads the low four bits of each lane, so it gives element 2i from the byte and element 2i + 1
 * from the byte shifted by four, and two two-source permutes interleave them.
 * Assumptions: p is the block's 16 bytes, any alignment.
 */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
decode_avx512(const uint8_t *p, __m512 table, __m512 *w0, __m512 *w1)
{
	const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
	const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30,
					     15, 31);
	const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
	const __m512 even = _mm512_permutexvar_ps(v, table);
	const __m512 odd = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);

	*w0 = _mm512_permutex2var_ps(even, lo, odd);
	*w1 = _mm512_permutex2var_ps(even, hi, odd);
}

/* As panel_avx2. */
__attribute__((target("avx512f,avx2,fma"))) static void panel_avx512(float *restrict panel,
							    const uint8_t *restrict blocks,
							    const uint8_t *restrict scales,
							    int r0, int nr, int k)
{
	const __m512 values = _mm512_loadu_ps(dps_mxfp4_values);
	const int nb = k / 32;

	for (int q = 0; q < nr; q++) {
		const size_t row = (size_t)(r0 + q) * (size_t)nb;
		float *pq = panel + (size_t)q * (size_t)k;

		for (int b = 0; b < nb; b++) {
			const __m512 s = scale_avx512(scales[row + (size_t)b]);
			__m512 w0, w1;

			decode_avx512(blocks + (row + (size_t)b) * 16, _mm512_mul_ps(values, s), &w0,
				      &w1);
			_mm512_storeu_ps(pq + 32 * (size_t)b, w0);
			_mm512_storeu_ps(pq + 32 * (size_t)b + 16, w1);
		}
	}
}

/* As rows_avx2, with 16-lane accumulators and up to MR_AVX512 rows of x. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
rows_avx512(float *restrict out, int ldo, const float *restrict x, const uint8_t *blocks,
	    const uint8_t *scales, const float *restrict panel, int r0, int nr, int k,
	    const int mr, const int from_panel)
{
	const __m512 values = _mm512_loadu_ps(dps_mxfp4_values);
	const int nb = k / 32;
	const size_t span = (size_t)GROUP * (size_t)nb * 16; /* a group's codes */
	const size_t lead = span ? (LEAD_MIN + span - 1) / span * span : 0;
	const uint8_t *bq[GROUP], *sq[GROUP];
	const float *pq[GROUP];
	__m512 a[MR_AVX512][GROUP];

	for (int q = 0; q < GROUP; q++) {
		const int row = q < nr ? q : 0;

		bq[q] = blocks + (size_t)(r0 + row) * (size_t)nb * 16;
		sq[q] = scales + (size_t)(r0 + row) * (size_t)nb;
		pq[q] = from_panel ? panel + (size_t)row * (size_t)k : NULL;
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
		for (int q = 0; q < GROUP; q++)
			a[i][q] = _mm512_setzero_ps();
	for (int b = 0; b < nb; b++) {
		if (!from_panel && b % 4 == 0) /* a line of codes a row, of scales every 64 */
#pragma GCC unroll 4
			for (int q = 0; q < GROUP; q++) {
				_mm_prefetch((const char *)bq[q] + 16 * (size_t)b + lead, _MM_HINT_T1);
				if (b % 64 == 0)
					_mm_prefetch((const char *)sq[q] + b + lead / 16, _MM_HINT_T1);
			}
#pragma GCC unroll 4
		for (int q = 0; q < GROUP; q++) {
			__m512 w0, w1;

			if (from_panel) {
				w0 = _mm512_loadu_ps(pq[q] + 32 * (size_t)b);
				w1 = _mm512_loadu_ps(pq[q] + 32 * (size_t)b + 16);
			} else {
				decode_avx512(bq[q] + 16 * (size_t)b,
					      _mm512_mul_ps(values, scale_avx512(sq[q][b])),
					      &w0, &w1);
			}
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++) {
				const float *xb = x + (size_t)i * (size_t)k + 32 * (size_t)b;

				a[i][q] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb), a[i][q]);
				a[i][q] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + 16), a[i][q]);
			}
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		dps_dot_store4_512(out + (size_t)i * (size_t)ldo + (size_t)r0, a[i][0], a[i][1], a[i][2],
				   a[i][3], nr);
}

/* ---- the split over the pool --------------------------------------------------------- */

enum isa { ISA_AVX2, ISA_AVX512 };

struct mxfp4_job {
	float *out;
	const float *x;
	const uint8_t *blocks, *scales;
	int m, n, k, chunks;
	enum isa isa;
	float *panels; /* (threads, GROUP, k): each thread's panel; NULL: decode per MR rows of x */
};

/* Rows r0 .. r0 + nr - 1 of W against all of x, with AVX2; panel as in struct mxfp4_job. */
__attribute__((target("avx2,fma"))) static void group_avx2(const struct mxfp4_job *j, int r0,
							   int nr, float *panel)
{
	if (panel)
		panel_avx2(panel, j->blocks, j->scales, r0, nr, j->k);
	for (int i = 0; i < j->m; i += MR_AVX2) {
		float *o = j->out + (size_t)i * (size_t)j->n;
		const float *xi = j->x + (size_t)i * (size_t)j->k;

		if (panel)
			rows_avx2(o, j->n, xi, j->blocks, j->scales, panel, r0, nr, j->k, 1, 1);
		else
			rows_avx2(o, j->n, xi, j->blocks, j->scales, NULL, r0, nr, j->k, 1, 0);
	}
}

/* As group_avx2. */
__attribute__((target("avx512f,avx2,fma"))) static void group_avx512(const struct mxfp4_job *j, int r0,
							    int nr, float *panel)
{
	if (panel)
		panel_avx512(panel, j->blocks, j->scales, r0, nr, j->k);
	for (int i = 0; i < j->m; i += MR_AVX512) {
		float *o = j->out + (size_t)i * (size_t)j->n;
		const float *xi = j->x + (size_t)i * (size_t)j->k;
		const int mr = j->m - i < MR_AVX512 ? j->m - i : MR_AVX512;
		const uint8_t *bl = j->blocks, *sc = j->scales;

		if (panel) {
			switch (mr) {
			case 1: rows_avx512(o, j->n, xi, bl, sc, panel, r0, nr, j->k, 1, 1); break;
			case 2: rows_avx512(o, j->n, xi, bl, sc, panel, r0, nr, j->k, 2, 1); break;
			case 3: rows_avx512(o, j->n, xi, bl, sc, panel, r0, nr, j->k, 3, 1); break;
			default: rows_avx512(o, j->n, xi, bl, sc, panel, r0, nr, j->k, 4, 1); break;
			}
		} else {
			switch (mr) {
			case 1: rows_avx512(o, j->n, xi, bl, sc, NULL, r0, nr, j->k, 1, 0); break;
			case 2: rows_avx512(o, j->n, xi, bl, sc, NULL, r0, nr, j->k, 2, 0); break;
			case 3: rows_avx512(o, j->n, xi, bl, sc, NULL, r0, nr, j->k, 3, 0); break;
			default: rows_avx512(o, j->n, xi, bl, sc, NULL, r0, nr, j->k, 4, 0); break;
			}
		}
	}
}

static void mxfp4_slice(void *arg, int chunk, int tid)
{
	const struct mxfp4_job *j = arg;
	float *panel = j->panels ? j->panels + (size_t)tid * GROUP * (size_t)j->k : NULL;
	int lo, hi;

	dps_pool_split(j->n, GROUP, chunk, j->chunks, &lo, &hi);
	for (int r = lo; r < hi; r += GROUP) {
		const int nr = hi - r < GROUP ? hi - r : GROUP;

		if (j->isa == ISA_AVX512)
			group_avx512(j, r, nr, panel);
		else
			group_avx2(j, r, nr, panel);
	}
}

struct dequant_job {
	float *panel; /* (rows, k) */
	const uint8_t *blocks, *scales;
	int r0, rows, k, chunks;
	enum isa isa;
};

static void dequant_slice(void *arg, int chunk, int tid)
{
	const struct dequant_job *d = arg;
	int lo, hi;

	(void)tid;
	dps_pool_split(d->rows, GROUP, chunk, d->chunks, &lo, &hi);
	for (int r = lo; r < hi; r += GROUP) {
		const int nr = hi - r < GROUP ? hi - r : GROUP;
		float *p = d->panel + (size_t)r * (size_t)d->k;

		if (d->isa == ISA_AVX512)
			panel_avx512(p, d->blocks, d->scales, d->r0 + r, nr, d->k);
		else
			panel_avx2(p, d->blocks, d->scales, d->r0 + r, nr, d->k);
	}
}

/*
 * The large-m product: panels of rows of W dequantized over the pool, each multiplied by
 * dps_linear_f32 (which uses the pool itself) and copied into its columns of out. Returns 0,
 * or -ENOMEM when the panel or its product cannot be had (nothing written then).
 */
static int linear_big(const struct mxfp4_job *j, struct dps_pool *pool)
{
	const size_t k = (size_t)j->k;
	const size_t fit = BIG_PANEL_BYTES / sizeof(float) / (k ? k : 1) / GROUP * GROUP;
	const int rows = fit < GROUP ? GROUP : fit < (size_t)j->n ? (int)fit : j->n;
	float *panel = malloc(sizeof(float) * (size_t)rows * k);
	float *tmp = rows < j->n ? malloc(sizeof(float) * (size_t)rows * (size_t)j->m) : NULL;

	if (!panel || (rows < j->n && !tmp)) {
		free(panel);
		free(tmp);
		return -ENOMEM;
	}
	for (int r0 = 0; r0 < j->n; r0 += rows) {
		const int nr = j->n - r0 < rows ? j->n - r0 : rows;
		struct dequant_job d = { panel, j->blocks, j->scales, r0, nr, j->k, j->chunks,
					 j->isa };

		dps_pool_run(pool, d.chunks, dequant_slice, &d);
		if (!tmp) { /* one panel: all of W */
			dps_linear_f32(j->out, j->x, panel, j->m, nr, j->k);
			break;
		}
		dps_linear_f32(tmp, j->x, panel, j->m, nr, j->k);
		for (int i = 0; i < j->m; i++)
			memcpy(j->out + (size_t)i * (size_t)j->n + (size_t)r0,
			       tmp + (size_t)i * (size_t)nr, sizeof(float) * (size_t)nr);
	}
	free(panel);
	free(tmp);
	return 0;
}

static void linear_mxfp4(float *out, const float *x, const uint8_t *blocks,
			 const uint8_t *scales, int m, int n, int k, enum isa isa)
{
	struct dps_pool *pool = dps_gemm_pool();
	const int threads = dps_pool_size(pool);
	struct mxfp4_job j = { out, x, blocks, scales, m, n, k, threads > 1 ? 4 * threads : 1, isa,
			       NULL };

	DPS_ASSERT(m >= 0 && n >= 0 && k >= 0 && k % 32 == 0);
	if (!m || !n)
		return;
	if (m >= BIG_M && !linear_big(&j, pool))
		return;
	/* Without the panels (no memory), every MR rows of x decode the weights again. */
	if (m > (isa == ISA_AVX512 ? MR_AVX512 : MR_AVX2))
		j.panels = malloc(sizeof(float) * (size_t)threads * GROUP * (size_t)k);
	dps_pool_run(pool, j.chunks, mxfp4_slice, &j);
	free(j.panels);
}

void dps_linear_mxfp4_avx2(float *out, const float *x, const uint8_t *blocks,
			   const uint8_t *scales, int m, int n, int k)
{
	linear_mxfp4(out, x, blocks, scales, m, n, k, ISA_AVX2);
}

void dps_linear_mxfp4_avx512(float *out, const float *x, const uint8_t *blocks,
			     const uint8_t *scales, int m, int n, int k)
{
	linear_mxfp4(out, x, blocks, scales, m, n, k, ISA_AVX512);
}

void dps_linear_mxfp4(float *out, const float *x, const uint8_t *blocks, const uint8_t *scales,
		      int m, int n, int k)
{
	static int isa = -1; /* 2: AVX-512F, 1: AVX2 and FMA, 0: neither */

	if (isa < 0) {
		__builtin_cpu_init();
		isa = __builtin_cpu_supports("avx512f")                                      ? 2
		    : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1
										       : 0;
	}
	if (isa == 2)
		dps_linear_mxfp4_avx512(out, x, blocks, scales, m, n, k);
	else if (isa == 1)
		dps_linear_mxfp4_avx2(out, x, blocks, scales, m, n, k);
	else
		dps_linear_mxfp4_ref(out, x, blocks, scales, m, n, k);
}
