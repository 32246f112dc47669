/* SPDX-License-Identifier: MIT */
/*
 * kernels/mxfp4_q8.c - MXFP4 weights against INT8 activations (mxfp4.h, "integer form"): what
 * GPT-OSS's MXFP4 experts run under --quantization int8, as llama.cpp runs MXFP4 against its
 * Q8 activations. Called by dps_linear_mxfp4_q8 (gemm.c) on its slices of output columns.
 *
 * Every E2M1 value times two is a small integer (0, 1, 2, 3, 4, 6, 8, 12, with its sign), so
 * with the activations quantized per block of 32 as kernels/q8.h quantizes them, a block's 32
 * products are one exact integer sum, and only the blocks are summed in f32 - in q8.h's order:
 * a[b mod 16] = fmaf(dx_b * sc_b, P_b, a[b mod 16]), P_b = sum over the block of 2 v * qx,
 * sc_b = 2^(e_b - 128) (the block's scale halved, for the doubled values), then the tree.
 *
 * For that the weights are re-laid once, at load (dps_mxfp4_interleave): a row's blocks in
 * groups of 16, as q8.h's values are, two slots per byte: byte 4u + o of a group's 64-byte
 * load i (u the block, o = 0..3) holds the code of value 8i + o in its low nibble and of value
 * 8i + 4 + o in its high nibble, so the low nibbles of one load are q8.h's slot 2i and the high
 * ones slot 2i + 1. A load of 64 bytes is then 128 weights: one shift and two vpermb (code
 * -> 2v + 128; vpermb reads six bits of an index, so a table of the sixteen values four times
 * over needs no nibble mask) and two vpdpbusd against the activations' slots (started from -128
 * times the blocks' sums); a block's scale is applied as vscalefps of dx by e - 128, the
 * product dx * 2^(e - 128) rounded once as the multiplication rounds it. Decode (one or two
 * rows of x) reads W one row after another instead of four side by side (one stream, as
 * gemm_dot.c's decode does) and looks the nibbles up with vpshufb after a mask (the same
 * bytes as vpermb). The AVX2 twin looks up 2v itself and multiplies with vpmaddubsw on |x| and the
 * values with x's signs (at most 2 * 12 * 127 per pair), then vpmaddwd; the plain-C twin
 * the same integers. All three give the same bits (NaN where NaN: a scale byte of 255, or an
 * infinite activation, makes the output NaN, not always the same NaN).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "kernels/dot_int.h"
#include "kernels/mxfp4.h"
#include "kernels/q8.h"

#define GROUP 4 /* rows of W per tile */
#define W_BURST_BYTES ((size_t)8 << 10)
/*
 * The one-row tiles ask for every line of the codes (and of the scales) LINE_AHEAD bytes ahead
 * into L2. The hardware's prefetcher alone does not keep up with a loop this busy: the lookups
 * and vpdpbusd run at about 34 GB/s of codes in L2 on a Zen 5 core, hardly faster than memory,
 * and without the hint the loads waited and the loop ran in turn (bench-gpt-oss -q int8, batch
 * 1, one thread, three interleaved rounds of 2026-12-06: the experts at 61-66% of the measured
 * read bandwidth with gemm_dot.c's page-ahead prefetch, 74-77% with this one 8 or 16 KiB
 * ahead, 65-68% at 4 KiB; 144-168 -> 174-193 tokens/s).
 *
 * Each line of the codes is asked for twice: LINE_FAR ahead (PREFETCHT2) and again LINE_AHEAD
 * ahead, and no line past the end of the call's rows (what lies there is not this product's).
 * Once is not enough on this CPU: with the weights on huge pages, a throwaway harness running
 * bench-gpt-oss's products (32 random experts of 1024 x 1024 a round, 40 rounds, each round's
 * kernel time against a plain summing loop over the same bytes) read at a median 0.86-0.88 of
 * the plain loop with the one request, 0.94-0.95 with the two (0.91 -> 0.98 for 2880 x 2880,
 * GPT-OSS-20B's shape). Asking only far, or for lines 4 or 12 KiB ahead instead of 8, did
 * worse; a third request, or the scales asked for twice, changed nothing. In the bench (ten
 * interleaved runs of bench-gpt-oss -q int8 on one thread, 2026-12-06) the experts went from a
 * median 83% of the measured bandwidth to 90% with the two requests and 92% with them stopped
 * at the end. Our guess, not measured: a request the core cannot queue when it is issued is
 * dropped, and the second one catches most of those lines.
 */
#define LINE_AHEAD 8192
#define LINE_FAR 16384

/* 2v for each code (the values of dps_mxfp4_values, doubled). */
static const int8_t twice[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

/* The f32 of 2^(e - 128) (e = 0: 2^-128 and e = 1: 2^-127 are subnormal; 255 is NaN). */
static inline float half_scale(uint8_t e)
{
	const uint32_t u = e == 0 ? 0x00200000u : e == 1 ? 0x00400000u : e == 255 ? 0x7fc00000u
			 : (uint32_t)(e - 1) << 23;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* The code of value c (0..31) of block b of a row in the interleaved layout. */
static inline int code_at(const uint8_t *row, size_t kb, size_t b, int c)
{
	const size_t g = b / DPS_Q8_GROUP, u = b % DPS_Q8_GROUP;
	const size_t t = kb - g * DPS_Q8_GROUP < DPS_Q8_GROUP ? kb - g * DPS_Q8_GROUP : DPS_Q8_GROUP;
	const int i = c / 8, o = c % 4, hi = (c % 8) >= 4;
	const uint8_t byte = row[g * DPS_Q8_GROUP * 16 + (size_t)i * 4 * t + 4 * u + (size_t)o];

	return hi ? byte >> 4 : byte & 15;
}

int dps_mxfp4_interleave(uint8_t *blocks, size_t rows, int k)
{
	const size_t kb = (size_t)k / 32;
	uint8_t *src = malloc(kb * 16 + 1);

	if (!src)
		return -ENOMEM;
	for (size_t r = 0; r < rows; r++) {
		uint8_t *row = blocks + r * kb * 16;

		memcpy(src, row, kb * 16);
		for (size_t b = 0; b < kb; b++) {
			const size_t g = b / DPS_Q8_GROUP, u = b % DPS_Q8_GROUP;
			const size_t t = kb - g * DPS_Q8_GROUP < DPS_Q8_GROUP ? kb - g * DPS_Q8_GROUP
									     : DPS_Q8_GROUP;
			const uint8_t *blk = src + b * 16; /* byte j: codes 2j (low), 2j + 1 (high) */

			for (int i = 0; i < 4; i++)
				for (int o = 0; o < 4; o++) {
					const int lc = 8 * i + o, hc = 8 * i + 4 + o;
					const int lo = (blk[lc / 2] >> (4 * (lc % 2))) & 15;
					const int hi = (blk[hc / 2] >> (4 * (hc % 2))) & 15;

					row[g * DPS_Q8_GROUP * 16 + (size_t)i * 4 * t + 4 * u + (size_t)o] =
						(uint8_t)(lo | hi << 4);
				}
		}
	}
	free(src);
	return 0;
}

void dps_mxfp4_deinterleave_row(float *restrict out, const uint8_t *restrict blocks,
				const uint8_t *restrict scales, size_t r, int k)
{
	const size_t kb = (size_t)k / 32;
	const uint8_t *row = blocks + r * kb * 16;

	for (int c = 0; c < k; c++)
		out[c] = (float)twice[code_at(row, kb, (size_t)c / 32, c % 32)] *
			 half_scale(scales[r * kb + (size_t)c / 32]);
}

/* ---- the plain-C twin -------------------------------------------------------------------- */

void dps_gemm_mxfp4q8_ref(float *restrict out, int ldo, const struct dps_q8_act *a,
			  const uint8_t *blocks, const uint8_t *scales, int n)
{
	const size_t kb = dps_q8_blocks(a->k), kp = kb * DPS_Q8_BLOCK;

	for (int i = 0; i < a->m; i++)
		for (int r = 0; r < n; r++) {
			const uint8_t *row = blocks + (size_t)r * kb * 16;
			const int8_t *q = a->q + (size_t)i * kp;
			float acc[16] = { 0.0f };

			for (size_t b = 0; b < kb; b++) {
				int32_t p = 0;

				for (int c = 0; c < DPS_Q8_BLOCK; c++)
					p += twice[code_at(row, kb, b, c)] * q[dps_q8_pos(kb, b, c)];
				acc[b % 16] = fmaf(a->d[(size_t)i * kb + b] *
							   half_scale(scales[(size_t)r * kb + b]),
						   (float)p, acc[b % 16]);
			}
			out[(size_t)i * (size_t)ldo + (size_t)r] = dps_dot_tree_ref(acc);
		}
}

/* ---- AVX-512 with VNNI -------------------------------------------------------------------- */

/* The exponents e - 128 of sixteen blocks' scales as f32 (t of them), and which are 255. */
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline __m512
exps16_avx512(const uint8_t *e, __mmask16 mb, __mmask16 *nan)
{
	const __m512i v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mb, e));

	*nan = _mm512_cmpeq_epi32_mask(v, _mm512_set1_epi32(255));
	return _mm512_cvtepi32_ps(_mm512_sub_epi32(v, _mm512_set1_epi32(128)));
}

/* 2v + 128 of each code, in every 128-bit lane: what vpshufb looks a low nibble up in, and
 * vpermb an index's low six bits (the sixteen values four times over). */
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline __m512i
code_table(void)
{
	return _mm512_broadcast_i32x4(_mm_setr_epi8(
		(char)128, (char)129, (char)130, (char)131, (char)132, (char)134, (char)136,
		(char)140, (char)128, (char)127, (char)126, (char)125, (char)124, (char)122,
		(char)120, (char)116));
}

/* The one-row kernels' requests for a group of codes at pw (and its scales at pe), `left`
 * bytes of the call's codes from pw on: the group's four lines LINE_FAR and LINE_AHEAD ahead,
 * its scales' line LINE_AHEAD / 16 ahead, none past the call's codes. */
__attribute__((always_inline)) static inline void ask_ahead(const char *pw, const char *pe,
							    ptrdiff_t left)
{
	for (int z = 0; z < 4; z++)
		if (left > LINE_FAR + 64 * z)
			_mm_prefetch(pw + LINE_FAR + 64 * z, _MM_HINT_T2);
	for (int z = 0; z < 4; z++)
		if (left > LINE_AHEAD + 64 * z)
			_mm_prefetch(pw + LINE_AHEAD + 64 * z, _MM_HINT_T1);
	if (left > LINE_AHEAD) /* (the scales' line lies as far into the scales) */
		_mm_prefetch(pe + LINE_AHEAD / 16, _MM_HINT_T1);
}

/*
 * mr (1 or 2) rows of x from row i0 of a against rows r0 .. r0 + nr - 1 of W: per group of
 * sixteen blocks, four loads of each row's bytes, their nibbles looked up as 2v + 128 and
 * multiplied by vpdpbusd into the blocks' lanes, then one FMA per output.
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma"), always_inline)) static inline void
block_avx512(float *restrict out, int ldo, const struct dps_q8_act *a, int i0,
	     const uint8_t *blocks, const uint8_t *scales, int r0, int nr, const int mr)
{
	const size_t kb = dps_q8_blocks(a->k), kp = kb * DPS_Q8_BLOCK, rb = kb * 16;
	const __m512i table = code_table();
	const uint8_t *w[GROUP], *e[GROUP];
	__m512 acc[2][GROUP];

	for (int q = 0; q < GROUP; q++) {
		const size_t r = (size_t)r0 + (size_t)(q < nr ? q : 0);

		w[q] = blocks + r * rb;
		e[q] = scales + r * kb;
	}
	if (i0 == 0) {
		/* the tile's rows and their scales (two streams) asked for ahead at once, by the
		 * first rows of x (the hardware's prefetcher alone reads four rows at a quarter of
		 * the bandwidth) */
		for (size_t o = 0; o < (size_t)nr * rb; o += 64)
			_mm_prefetch((const char *)w[0] + W_BURST_BYTES + o, _MM_HINT_T0);
		for (size_t o = 0; o < (size_t)nr * kb; o += 64)
			_mm_prefetch((const char *)e[0] + W_BURST_BYTES / 16 + o, _MM_HINT_T0);
	}
#pragma GCC unroll 2
	for (int i = 0; i < mr; i++)
		acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = _mm512_setzero_ps();
	for (size_t g0 = 0; g0 < kb; g0 += DPS_Q8_GROUP) {
		const size_t t = kb - g0 < DPS_Q8_GROUP ? kb - g0 : DPS_Q8_GROUP, sl = 4 * t;
		const __mmask64 mv = t == 16 ? ~(__mmask64)0 : ((__mmask64)1 << sl) - 1;
		const __mmask16 mb = (__mmask16)((1u << t) - 1);
		__m512i p[2][GROUP];

#pragma GCC unroll 2
		for (int i = 0; i < mr; i++) {
			const __m512i nc = _mm512_maskz_loadu_epi32(mb, a->nc + (size_t)(i0 + i) * kb + g0);

			p[i][0] = p[i][1] = p[i][2] = p[i][3] = nc;
		}
#pragma GCC unroll 4
		for (int l = 0; l < 4; l++) {
			__m512i lo[GROUP], hi[GROUP];

#pragma GCC unroll 4
			for (int q = 0; q < GROUP; q++) {
				const __m512i v = _mm512_maskz_loadu_epi8(mv, w[q] + g0 * 16 + (size_t)l * sl);

				lo[q] = _mm512_permutexvar_epi8(v, table);
				hi[q] = _mm512_permutexvar_epi8(_mm512_srli_epi16(v, 4), table);
			}
#pragma GCC unroll 2
			for (int i = 0; i < mr; i++) {
				const int8_t *xq = a->q + (size_t)(i0 + i) * kp + g0 * DPS_Q8_BLOCK;
				const __m512i x0 = _mm512_maskz_loadu_epi8(mv, xq + (size_t)(2 * l) * sl);
				const __m512i x1 = _mm512_maskz_loadu_epi8(mv, xq + (size_t)(2 * l + 1) * sl);

#pragma GCC unroll 4
				for (int q = 0; q < GROUP; q++)
					p[i][q] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(p[i][q], lo[q], x0),
								      hi[q], x1);
			}
		}
#pragma GCC unroll 4
		for (int q = 0; q < GROUP; q++) {
			__mmask16 nan;
			const __m512 ex = exps16_avx512(e[q] + g0, mb, &nan);

#pragma GCC unroll 2
			for (int i = 0; i < mr; i++) {
				const __m512 dx = _mm512_maskz_loadu_ps(mb, a->d + (size_t)(i0 + i) * kb + g0);

				/* dx * 2^(e - 128), rounded once as the product with the power would
				 * be; the NaN scale makes the block NaN */
				const __m512 sx = _mm512_mask_mov_ps(_mm512_scalef_ps(dx, ex), nan,
								     _mm512_set1_ps(__builtin_nanf("")));

				acc[i][q] = _mm512_fmadd_ps(sx, _mm512_cvtepi32_ps(p[i][q]), acc[i][q]);
			}
		}
	}
#pragma GCC unroll 2
	for (int i = 0; i < mr; i++)
		dps_dot_store4_512(out + (size_t)(i0 + i) * (size_t)ldo + (size_t)r0, acc[i][0],
				   acc[i][1], acc[i][2], acc[i][3], nr);
}

/*
 * block_avx512 for one row of W (codes w, scales e) against mr rows of x from row 0, one group
 * of t blocks from block g0: the same integer sums (in two chains, low and high nibbles, added
 * before the FMA: integers, exact) and the same FMA per output, so the same bits. Each line of
 * the codes is asked for LINE_FAR and LINE_AHEAD bytes ahead, each of the scales LINE_AHEAD.
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma"), always_inline)) static inline void
row_group_avx512(__m512 sum[2], const struct dps_q8_act *a, const uint8_t *w, const uint8_t *e,
		 size_t kb, size_t g0, size_t t, const int mr, const int full, const char *wend)
{
	const size_t kp = kb * DPS_Q8_BLOCK, sl = 4 * t;
	const __mmask64 mv = full ? ~(__mmask64)0 : ((__mmask64)1 << sl) - 1;
	const __mmask16 mb = full ? (__mmask16)0xffff : (__mmask16)((1u << t) - 1);
	const __m512i table = code_table();
	const __m512i nib = _mm512_set1_epi8(15);
	const char *pw = (const char *)(w + g0 * 16), *pe = (const char *)(e + g0);
	__m512i p[2][2];
	__mmask16 nan;
	__m512 ex;

	ask_ahead(pw, pe, wend - pw);
#pragma GCC unroll 2
	for (int i = 0; i < mr; i++) {
		p[i][0] = full ? _mm512_loadu_si512(a->nc + (size_t)i * kb + g0)
			       : _mm512_maskz_loadu_epi32(mb, a->nc + (size_t)i * kb + g0);
		p[i][1] = _mm512_setzero_si512();
	}
#pragma GCC unroll 4
	for (int l = 0; l < 4; l++) {
		const __m512i v = full ? _mm512_loadu_si512(pw + (size_t)l * sl)
				      : _mm512_maskz_loadu_epi8(mv, pw + (size_t)l * sl);
		const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(v, nib));
		const __m512i hi = _mm512_shuffle_epi8(table,
						       _mm512_and_si512(_mm512_srli_epi16(v, 4), nib));

#pragma GCC unroll 2
		for (int i = 0; i < mr; i++) {
			const int8_t *xq = a->q + (size_t)i * kp + g0 * DPS_Q8_BLOCK;

			const int8_t *x0 = xq + (size_t)(2 * l) * sl, *x1 = xq + (size_t)(2 * l + 1) * sl;

			p[i][0] = _mm512_dpbusd_epi32(p[i][0], lo, full ? _mm512_loadu_si512(x0)
								: _mm512_maskz_loadu_epi8(mv, x0));
			p[i][1] = _mm512_dpbusd_epi32(p[i][1], hi, full ? _mm512_loadu_si512(x1)
								: _mm512_maskz_loadu_epi8(mv, x1));
		}
	}
	ex = exps16_avx512(e + g0, mb, &nan);
#pragma GCC unroll 2
	for (int i = 0; i < mr; i++) {
		const float *pd = a->d + (size_t)i * kb + g0;
		const __m512 dx = full ? _mm512_loadu_ps(pd) : _mm512_maskz_loadu_ps(mb, pd);
		const __m512 sx = _mm512_mask_mov_ps(_mm512_scalef_ps(dx, ex), nan,
						     _mm512_set1_ps(__builtin_nanf("")));

		sum[i] = _mm512_fmadd_ps(sx, _mm512_cvtepi32_ps(_mm512_add_epi32(p[i][0], p[i][1])),
					 sum[i]);
	}
}

/*
 * Decode (mr = a->m, 1 or 2): rows r0 .. r0 + nr - 1 of W one after the other, so the codes
 * are read as one stream (and the scales as a second, sixteen times thinner), which this
 * CPU's prefetcher follows far better than four rows side by side (gemm_dot.c's rows_avx512).
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma"), always_inline)) static inline void
rows_avx512(float *restrict out, int ldo, const struct dps_q8_act *a, const uint8_t *blocks,
	    const uint8_t *scales, int r0, int nr, const int mr, const char *wend)
{
	const size_t kb = dps_q8_blocks(a->k), rb = kb * 16;
	__m512 acc[GROUP][2];

	for (int q = 0; q < GROUP; q++) {
		__m512 sum[2] = { _mm512_setzero_ps(), _mm512_setzero_ps() }; /* in registers */

		if (q < nr) {
			const uint8_t *w = blocks + (size_t)(r0 + q) * rb;
			const uint8_t *e = scales + (size_t)(r0 + q) * kb;
			size_t g0 = 0;

			for (; g0 + DPS_Q8_GROUP <= kb; g0 += DPS_Q8_GROUP)
				row_group_avx512(sum, a, w, e, kb, g0, DPS_Q8_GROUP, mr, 1, wend);
			if (g0 < kb)
				row_group_avx512(sum, a, w, e, kb, g0, kb - g0, mr, 0, wend);
		}
		acc[q][0] = sum[0];
		acc[q][1] = sum[1];
	}
#pragma GCC unroll 2
	for (int i = 0; i < mr; i++)
		dps_dot_store4_512(out + (size_t)i * (size_t)ldo + (size_t)r0, acc[0][i], acc[1][i],
				   acc[2][i], acc[3][i], nr);
}

/*
 * One row of x against whole tiles of rows whose groups are all whole (k a multiple of 512):
 * row_group_avx512's operations in its order, so the same bits, in plainer loops (the groups
 * and a group's four loads not unrolled). Measured faster from memory than rows_avx512 for
 * these rows, for a reason not found (code placement, most likely; unrolling or rolling either
 * loop in rows_avx512 alone did not reproduce it): a throwaway harness replaying
 * bench-gpt-oss's expert products read 0.90-0.93 of a plain summing loop with it against
 * 0.87-0.91 (four runs of 60 rounds, 2026-12-06), and in ten interleaved pairs of `bench decode
 * --preset bench-gpt-oss -p 16 -n 128 -b 1 -r 3 -q int8 --threads-per-rank 1` the experts went
 * from a median 89.5% of the measured bandwidth to 92% (217 -> 232 tokens/s).
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma"), noinline)) static void
rows1_whole(float *restrict out, const struct dps_q8_act *a, const uint8_t *blocks,
	    const uint8_t *scales, int n, const char *wend)
{
	const size_t kb = dps_q8_blocks(a->k), rb = kb * 16;
	const __m512i table = code_table();
	const __m512i nib = _mm512_set1_epi8(15);

	for (int r0 = 0; r0 + GROUP <= n; r0 += GROUP) {
		__m512 acc[GROUP];

		for (int q = 0; q < GROUP; q++) {
			const char *w = (const char *)blocks + (size_t)(r0 + q) * rb;
			const uint8_t *e = scales + (size_t)(r0 + q) * kb;
			__m512 sum = _mm512_setzero_ps();

			for (size_t g0 = 0; g0 < kb; g0 += DPS_Q8_GROUP) {
				const char *pw = w + g0 * 16;
				const int8_t *xq = a->q + g0 * DPS_Q8_BLOCK;
				__m512i p0 = _mm512_loadu_si512(a->nc + g0),
					p1 = _mm512_setzero_si512();
				__mmask16 nan;
				__m512 ex, sx;

				ask_ahead(pw, (const char *)(e + g0), wend - pw);
#pragma GCC unroll 1
				for (int l = 0; l < 4; l++) {
					const __m512i v = _mm512_loadu_si512(pw + 64 * l);
					const __m512i lo =
						_mm512_shuffle_epi8(table, _mm512_and_si512(v, nib));
					const __m512i hi = _mm512_shuffle_epi8(
						table, _mm512_and_si512(_mm512_srli_epi16(v, 4), nib));

					p0 = _mm512_dpbusd_epi32(p0, lo,
								 _mm512_loadu_si512(xq + 128 * l));
					p1 = _mm512_dpbusd_epi32(p1, hi,
								 _mm512_loadu_si512(xq + 128 * l + 64));
				}
				ex = exps16_avx512(e + g0, 0xffff, &nan);
				sx = _mm512_mask_mov_ps(
					_mm512_scalef_ps(_mm512_loadu_ps(a->d + g0), ex), nan,
					_mm512_set1_ps(__builtin_nanf("")));
				sum = _mm512_fmadd_ps(sx, _mm512_cvtepi32_ps(_mm512_add_epi32(p0, p1)),
						      sum);
			}
			acc[q] = sum;
		}
		dps_dot_store4_512(out + r0, acc[0], acc[1], acc[2], acc[3], GROUP);
	}
}

/* One row of x: rows1_whole for the whole tiles when every group is whole, rows_avx512 for the
 * other tiles (rows2_avx512: rows_avx512 over every tile, for two rows of x). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma"), noinline)) static void
rows1_avx512(float *restrict out, int ldo, const struct dps_q8_act *a, const uint8_t *blocks,
	     const uint8_t *scales, int n)
{
	const char *wend = (const char *)blocks + (size_t)n * dps_q8_blocks(a->k) * 16;
	int r0 = 0;

	if (dps_q8_blocks(a->k) % DPS_Q8_GROUP == 0) { /* whole groups: whole tiles first */
		rows1_whole(out, a, blocks, scales, n, wend);
		r0 = n / GROUP * GROUP;
	}
	for (; r0 < n; r0 += GROUP)
		rows_avx512(out, ldo, a, blocks, scales, r0, n - r0 < GROUP ? n - r0 : GROUP, 1,
			    wend);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma"), noinline)) static void
rows2_avx512(float *restrict out, int ldo, const struct dps_q8_act *a, const uint8_t *blocks,
	     const uint8_t *scales, int n)
{
	const char *wend = (const char *)blocks + (size_t)n * dps_q8_blocks(a->k) * 16;

	for (int r0 = 0; r0 < n; r0 += GROUP)
		rows_avx512(out, ldo, a, blocks, scales, r0, n - r0 < GROUP ? n - r0 : GROUP, 2,
			    wend);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma"))) void
dps_gemm_mxfp4q8_avx512(float *restrict out, int ldo, const struct dps_q8_act *a,
			const uint8_t *blocks, const uint8_t *scales, int n)
{
	if (a->m == 1) {
		rows1_avx512(out, ldo, a, blocks, scales, n);
		return;
	}
	if (a->m == 2) {
		rows2_avx512(out, ldo, a, blocks, scales, n);
		return;
	}
	for (int r0 = 0; r0 < n; r0 += GROUP) {
		const int nr = n - r0 < GROUP ? n - r0 : GROUP;
		int i = 0;

		for (; i + 2 <= a->m; i += 2)
			block_avx512(out, ldo, a, i, blocks, scales, r0, nr, 2);
		if (i < a->m)
			block_avx512(out, ldo, a, i, blocks, scales, r0, nr, 1);
	}
}

/* ---- AVX2 ------------------------------------------------------------------------------ */

/*
 * Eight blocks' sums (lanes) over a group: w at the group's first byte for these blocks
 * (blocks 0..7, or 8..15 at +32), x at the activations' group, sl the slot width, cnt (1..8)
 * blocks present.
 */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256i
sums8_avx2(const uint8_t *w, const int8_t *x, size_t sl, int cnt)
{
	const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt),
						 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	const __m256i table = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8,
					       -12, 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4,
					       -6, -8, -12);
	const __m256i nib = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
	__m256i p = _mm256_setzero_si256();

	for (int l = 0; l < 4; l++) {
		const __m256i v = _mm256_maskload_epi32((const int *)(const void *)(w + (size_t)l * sl),
							lanes);

		for (int h = 0; h < 2; h++) {
			const __m256i xv = _mm256_maskload_epi32(
				(const int *)(const void *)(x + (size_t)(2 * l + h) * sl), lanes);
			const __m256i codes = _mm256_and_si256(h ? _mm256_srli_epi16(v, 4) : v, nib);
			const __m256i wv = _mm256_shuffle_epi8(table, codes);

			p = _mm256_add_epi32(p, _mm256_madd_epi16(
						      _mm256_maddubs_epi16(_mm256_abs_epi8(xv),
									   _mm256_sign_epi8(wv, xv)),
						      ones));
		}
	}
	return p;
}

__attribute__((target("avx2,fma,f16c"))) void
dps_gemm_mxfp4q8_avx2(float *restrict out, int ldo, const struct dps_q8_act *a,
		      const uint8_t *blocks, const uint8_t *scales, int n)
{
	const size_t kb = dps_q8_blocks(a->k), kp = kb * DPS_Q8_BLOCK, rb = kb * 16;

	/* tiles of rows outer, so that a tile's bytes stay in cache for every row of x */
	for (int r0 = 0; r0 < n; r0 += GROUP)
		for (int i = 0; i < a->m; i++) {
			const int nr = n - r0 < GROUP ? n - r0 : GROUP;
			__m256 h[GROUP];
			float s[4];

			for (int q = 0; q < GROUP; q++) {
				const size_t r = (size_t)r0 + (size_t)(q < nr ? q : 0);
				const uint8_t *w = blocks + r * rb, *e = scales + r * kb;
				__m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();

				for (size_t g0 = 0; g0 < kb; g0 += DPS_Q8_GROUP) {
					const size_t t = kb - g0 < DPS_Q8_GROUP ? kb - g0 : DPS_Q8_GROUP;
					const size_t sl = 4 * t;
					const int nlo = t < 8 ? (int)t : 8, nhi = (int)t - nlo;
					const int8_t *xq = a->q + (size_t)i * kp + g0 * DPS_Q8_BLOCK;
					float ss[16] = { 0 };

					for (size_t u = 0; u < t; u++)
						ss[u] = a->d[(size_t)i * kb + g0 + u] * half_scale(e[g0 + u]);
					lo = _mm256_fmadd_ps(_mm256_loadu_ps(ss),
							     _mm256_cvtepi32_ps(sums8_avx2(w + g0 * 16, xq, sl, nlo)),
							     lo);
					if (nhi)
						hi = _mm256_fmadd_ps(
							_mm256_loadu_ps(ss + 8),
							_mm256_cvtepi32_ps(sums8_avx2(w + g0 * 16 + 32, xq + 32,
										      sl, nhi)),
							hi);
				}
				h[q] = _mm256_add_ps(lo, hi);
			}
			_mm_storeu_ps(s, dps_dot_reduce4(h[0], h[1], h[2], h[3]));
			for (int q = 0; q < nr; q++)
				out[(size_t)i * (size_t)ldo + (size_t)(r0 + q)] = s[q];
		}
}
