/* SPDX-License-Identifier: MIT */
/*
 * kernels/q8.c - INT8 weights in blocks of 32 with F16 scales (see q8.h): quantizing weights
 * and activations, and the product in q8.h's order three ways, bit for bit the same: AVX-512
 * with VNNI (vpdpbusd of each slot of a group of sixteen blocks, the stored q + 128 against
 * the signed activations, started from -128 times each block's activation sum, so that each
 * lane ends as its block's exact sum), AVX2 (vpmaddubsw on |x| and the weights with x's
 * signs, then vpmaddwd and vpaddd: the same integers, eight blocks per register), and the
 * plain-C twin. dps_linear_q8 (gemm.c) calls them on its slices of output columns for every
 * product of a quantized model: decode (W streamed from memory once) and prefill.
 *
 * Blocking, as gemm_dot.c: W taken W_BLOCK_BYTES of rows at a time (kept in L2), inside it
 * four rows of W against up to two (AVX-512) or one (AVX2) rows of x per register tile. The
 * blocking changes which tile computes an output and when, never the order of its sum.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "common/f16.h"
#include "kernels/dot_int.h"
#include "kernels/q8.h"

#define W_BLOCK_BYTES ((size_t)192 << 10)
#define GROUP 4 /* rows of W per register tile */
/* How far ahead of the read position the AVX2 tiles prefetch W, in address order. */
#define W_PREFETCH_BYTES ((size_t)16 << 10)
/*
 * The one-row AVX-512 tiles ask for each line of a group's values twice, LINE_FAR ahead
 * (PREFETCHT2) and LINE_AHEAD ahead (PREFETCHT1), as kernels/mxfp4_q8.c does (where the
 * measurements are). A row's scales follow its values in the same stream and are left to the
 * hardware (asking for them too measured the same). One Zen 5 core, bench-110m INT8, batch 1,
 * six interleaved runs of bench decode (2026-12-06): the products read W at a median 77% of
 * the measured bandwidth with gemm_dot.c's page-ahead prefetch (the next page's first lines as
 * a page begins), 100% with this; 175 -> 230 tokens/s.
 */
#define LINE_AHEAD 8192
#define LINE_FAR 16384

/* ---- quantizing ------------------------------------------------------------------------ */

/* The largest |v| of a block of cnt values v. */
static float block_amax(const float *v, int cnt)
{
	float amax = 0.0f;

	for (int j = 0; j < cnt; j++) {
		const float a = fabsf(v[j]);

		amax = a > amax ? a : amax;
	}
	return amax;
}

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
			float df;

			d[b] = dps_f32_to_f16(block_amax(v + c0, cnt) / 127.0f);
			df = dps_f16_to_f32(d[b]);
			for (int j = 0; j < DPS_Q8_BLOCK; j++) {
				long t = 0;

				if (j < cnt && df > 0.0f) {
					t = lrintf(v[c0 + j] / df);
					t = t > 127 ? 127 : t < -127 ? -127 : t;
				}
				q[dps_q8_pos(kb, b, j)] = (uint8_t)(t + 128);
			}
		}
	}
}

void dps_q8_dequantize_row(float *dst, const void *W, int k, size_t r)
{
	const size_t kb = dps_q8_blocks(k);
	const uint8_t *q = dps_q8_row(W, r, k);
	const uint16_t *d = dps_q8_scales(W, r, k);

	for (int c = 0; c < k; c++)
		dst[c] = (float)((int)q[dps_q8_pos(kb, (size_t)c / DPS_Q8_BLOCK, c % DPS_Q8_BLOCK)] -
				 128) * dps_f16_to_f32(d[c / DPS_Q8_BLOCK]);
}

void dps_q8_export_row(int8_t *q, uint16_t *d, const void *W, int k, size_t r)
{
	const size_t kb = dps_q8_blocks(k);
	const uint8_t *v = dps_q8_row(W, r, k);

	for (int c = 0; q && c < k; c++)
		q[c] = (int8_t)((int)v[dps_q8_pos(kb, (size_t)c / DPS_Q8_BLOCK, c % DPS_Q8_BLOCK)] -
				128);
	if (d)
		memcpy(d, dps_q8_scales(W, r, k), kb * sizeof(uint16_t));
}

void dps_q8_import_rows(void *dst, int k, const int8_t *q, const uint16_t *d, size_t rows)
{
	const size_t kb = dps_q8_blocks(k);

	for (size_t i = 0; i < rows; i++) {
		uint8_t *v = (uint8_t *)(uintptr_t)dps_q8_row(dst, i, k);

		memset(v, 128, kb * DPS_Q8_BLOCK); /* the padding past k: q = 0 */
		for (int c = 0; c < k; c++)
			v[dps_q8_pos(kb, (size_t)c / DPS_Q8_BLOCK, c % DPS_Q8_BLOCK)] =
				(uint8_t)((int)q[i * (size_t)k + (size_t)c] + 128);
		memcpy((uint16_t *)(uintptr_t)dps_q8_scales(dst, i, k), d + i * kb,
		       kb * sizeof(uint16_t));
	}
}

/*
 * Grows *p to hold want elements of esz bytes (capacity in *cap), 64-byte aligned so that the
 * kernels' 64-byte loads of the activations never straddle two cache lines; the contents need
 * not survive (each use rewrites them). 0 or -ENOMEM.
 */
static int grow(void **p, size_t *cap, size_t want, size_t esz)
{
	void *q;

	if (want <= *cap)
		return 0;
	q = aligned_alloc(64, ((want ? want : 1) * esz + 63) / 64 * 64);
	if (!q)
		return -ENOMEM;
	free(*p);
	*p = q;
	*cap = want;
	return 0;
}

/* 127 / amax, or 0 when amax is 0 or so small (under 127 / FLT_MAX) that the quotient is
 * infinite: such a block quantizes to zeros. */
static inline float act_inverse(float amax)
{
	const float id = amax > 0.0f ? 127.0f / amax : 0.0f;

	return id <= FLT_MAX ? id : 0.0f;
}

/*
 * One block of activations (cnt <= 32 values v) quantized: its scale into *d, its values into
 * q[0..31] (zero past cnt), and -128 times their sum returned. Plain C: lrintf rounds to
 * nearest even in the default rounding mode, as the AVX2 twin's vcvtps2dq does.
 */
static int32_t act_block_ref(const float *v, int cnt, float *d, int8_t *q)
{
	const float amax = block_amax(v, cnt);
	const float id = act_inverse(amax);
	int32_t sum = 0;

	*d = amax / 127.0f;
	for (int j = 0; j < DPS_Q8_BLOCK; j++) {
		q[j] = j < cnt ? (int8_t)lrintf(v[j] * id) : 0;
		sum += q[j];
	}
	return -128 * sum;
}

/* act_block_ref with AVX2: the same max (exact), the same two divisions, the same products
 * rounded the same way. */
__attribute__((target("avx2,fma"))) static int32_t
act_block_avx2(const float *v, int cnt, float *d, int8_t *q)
{
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	__m256 x[4], mx = _mm256_setzero_ps();
	__m256i t[4], sum = _mm256_setzero_si256();
	float amax, id, m8[8];
	int32_t s8[8];
	uint32_t total = 0; /* (a NaN or infinity converts to INT32_MIN: the sum wraps) */

	for (int h = 0; h < 4; h++) {
		const int n = cnt - 8 * h < 0 ? 0 : cnt - 8 * h > 8 ? 8 : cnt - 8 * h;
		const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(n),
							 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));

		x[h] = n == 8 ? _mm256_loadu_ps(v + 8 * h) : _mm256_maskload_ps(v + 8 * h, lanes);
		/* |x| first: a NaN is passed over, as block_amax's comparison does */
		mx = _mm256_max_ps(_mm256_and_ps(x[h], absmask), mx);
	}
	_mm256_storeu_ps(m8, mx);
	amax = 0.0f;
	for (int l = 0; l < 8; l++)
		amax = m8[l] > amax ? m8[l] : amax;
	id = act_inverse(amax);
	*d = amax / 127.0f;
	for (int h = 0; h < 4; h++) {
		t[h] = _mm256_cvtps_epi32(_mm256_mul_ps(x[h], _mm256_set1_ps(id)));
		sum = _mm256_add_epi32(sum, t[h]);
	}
	{
		/* int32 -> int8 (every value in -127..127, or INT32_MIN from a NaN or an infinity,
		 * which saturates to -128): pack twice, then undo the lane order */
		const __m256i w16a = _mm256_packs_epi32(t[0], t[1]), w16b = _mm256_packs_epi32(t[2], t[3]);
		const __m256i b8 = _mm256_packs_epi16(w16a, w16b);
		const __m256i fix = _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6,
										      3, 7));

		_mm256_storeu_si256((__m256i *)(void *)q, fix);
	}
	_mm256_storeu_si256((__m256i *)(void *)s8, sum);
	for (int l = 0; l < 8; l++)
		total += (uint32_t)s8[l];
	return (int32_t)(total * (uint32_t)-128); /* (modulo 2^32, as vpmulld) */
}

/* vpermt2d's lanes that pair two vectors (a's lanes 0-15, b's 16-31): level lv keeps, of each,
 * the lanes whose bit 3 - lv is 0 (first) or 1 (second), in order. */
static const int32_t pair_lanes[4][2][16] = {
	{ { 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23 },
	  { 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31 } },
	{ { 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27 },
	  { 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31 } },
	{ { 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29 },
	  { 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31 } },
	{ { 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30 },
	  { 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31 } },
};

/*
 * Sixteen vectors v[0..15] folded into one whose lane u is the max (op 0) of v[u]'s lanes, or
 * their sum (op 1, in integers); four levels, each pairing the vectors and halving the lanes
 * each keeps (a lane of v[u] meets only lanes of v[u]). The max of numbers >= 0 without NaN
 * and a sum of integers modulo 2^32 do not depend on the order.
 */
__attribute__((target("avx512f"))) static __m512i fold16_avx512(__m512i v[16], int op)
{
	for (int lv = 0, n = 16; lv < 4; lv++, n /= 2) {
		const __m512i ia = _mm512_loadu_si512(pair_lanes[lv][0]);
		const __m512i ib = _mm512_loadu_si512(pair_lanes[lv][1]);

		for (int i = 0; i < n / 2; i++) {
			const __m512i a = _mm512_permutex2var_epi32(v[2 * i], ia, v[2 * i + 1]);
			const __m512i b = _mm512_permutex2var_epi32(v[2 * i], ib, v[2 * i + 1]);

			v[i] = op ? _mm512_add_epi32(a, b)
				  : _mm512_castps_si512(_mm512_max_ps(_mm512_castsi512_ps(a),
								      _mm512_castsi512_ps(b)));
		}
	}
	return v[0];
}

/*
 * A whole group (sixteen blocks of 32 values from v) with AVX-512, as act_block_avx2 does each
 * block: the same max (exact), the same two divisions (sixteen at once, act_inverse's zero
 * where the quotient is infinite), the same products rounded the same way (vcvtps2dq), the same
 * saturation to eight bits (vpmovsdb, as the two packs), the same sums (modulo 2^32); then the
 * group's slots in their order (q8.h): slot j is word j (bytes 4j..4j+3) of each block in turn.
 * d, nc: the group's sixteen scales and sums. 1.5-1.9 times as fast as the blocks one at a time
 * with act_block_avx2 and the slots copied a word at a time (a row in cache on a Zen 5 core,
 * k = 1024: 250-260 ns against 410-475; k = 2880: 806 against 1193); an INT8 product quantizes
 * its rows of x each time it runs, eight times a layer for GPT-OSS's experts at batch 1.
 */
__attribute__((target("avx512f"))) static void act_group_avx512(const float *v, float *d,
								 int32_t *nc, int8_t *q)
{
	/* the slots: a 16 x 8 transpose of words in three levels (see below), the first two as
	 * fold16_avx512's second and third, the last also putting the lanes in block order */
	const int32_t(*tr)[2][16] = pair_lanes + 1;
	static const int32_t last[2][16] = {
		{ 0, 2, 16, 18, 8, 10, 24, 26, 4, 6, 20, 22, 12, 14, 28, 30 },
		{ 1, 3, 17, 19, 9, 11, 25, 27, 5, 7, 21, 23, 13, 15, 29, 31 },
	};
	float id[DPS_Q8_GROUP];
	__m512i f[DPS_Q8_GROUP], w[8], t[8];
	__m256i half[2];
	__m512 amax, inv;

	/* |x| first: a NaN is passed over, as block_amax's comparison does */
	for (int u = 0; u < DPS_Q8_GROUP; u++)
		f[u] = _mm512_castps_si512(_mm512_max_ps(
			_mm512_abs_ps(_mm512_loadu_ps(v + DPS_Q8_BLOCK * u + 16)),
			_mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(v + DPS_Q8_BLOCK * u)),
				      _mm512_setzero_ps())));
	amax = _mm512_castsi512_ps(fold16_avx512(f, 0));
	inv = _mm512_div_ps(_mm512_set1_ps(127.0f), amax); /* (+inf where amax is 0: zeroed) */
	_mm512_storeu_ps(id, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(inv, _mm512_set1_ps(FLT_MAX),
								    _CMP_LE_OQ),
						 inv));
	_mm512_storeu_ps(d, _mm512_div_ps(amax, _mm512_set1_ps(127.0f)));
	for (int u = 0; u < DPS_Q8_GROUP; u++) {
		const __m512 s = _mm512_set1_ps(id[u]);
		const __m512 x0 = _mm512_loadu_ps(v + DPS_Q8_BLOCK * u);
		const __m512 x1 = _mm512_loadu_ps(v + DPS_Q8_BLOCK * u + 16);
		const __m512i t0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, s));
		const __m512i t1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, s));

		f[u] = _mm512_add_epi32(t0, t1);
		/* the block's 32 bytes as 8 words; w[p]: block 2p's words, then block 2p + 1's */
		half[u % 2] = _mm256_inserti128_si256(_mm256_castsi128_si256(
							      _mm512_cvtsepi32_epi8(t0)),
						      _mm512_cvtsepi32_epi8(t1), 1);
		if (u % 2)
			w[u / 2] = _mm512_inserti64x4(_mm512_castsi256_si512(half[0]), half[1], 1);
	}
	_mm512_storeu_si512(nc, _mm512_mullo_epi32(fold16_avx512(f, 1), _mm512_set1_epi32(-128)));
	/*
	 * Word j of block u is in w[u / 2], lane 8 (u % 2) + j; slot j wants it in lane u. Each
	 * level pairs two vectors and trades one bit of the vector's number for one of the lane's:
	 * (w[p], w[p + 4]) then (c, c + 2) then (r, r + 1), the last also putting the lanes in
	 * block order.
	 */
	for (int p = 0; p < 4; p++) {
		t[p] = _mm512_permutex2var_epi32(w[p], _mm512_loadu_si512(tr[0][0]), w[p + 4]);
		t[p + 4] = _mm512_permutex2var_epi32(w[p], _mm512_loadu_si512(tr[0][1]), w[p + 4]);
	}
	for (int c0 = 0; c0 < 8; c0 += 4)
		for (int c = c0; c < c0 + 2; c++) {
			const __m512i lo = _mm512_loadu_si512(tr[1][0]);
			const __m512i hi = _mm512_loadu_si512(tr[1][1]);

			w[c] = _mm512_permutex2var_epi32(t[c], lo, t[c + 2]);
			w[c + 2] = _mm512_permutex2var_epi32(t[c], hi, t[c + 2]);
		}
	for (int r = 0; r < 8; r += 2) {
		const __m512i lo = _mm512_loadu_si512(last[0]), hi = _mm512_loadu_si512(last[1]);

		_mm512_storeu_si512(q + 64 * r, _mm512_permutex2var_epi32(w[r], lo, w[r + 1]));
		_mm512_storeu_si512(q + 64 * r + 64, _mm512_permutex2var_epi32(w[r], hi, w[r + 1]));
	}
}

/* 2: act_group_avx512 for whole groups, act_block_avx2 for the rest; 1: act_block_avx2; 0:
 * act_block_ref; -1: not chosen yet (the CPU decides). Read and written atomically: the pool's
 * threads quantize too, and the first to come chooses (every one the same). */
static int act_isa = -1;

void dps_q8_act_isa(int isa)
{
	__atomic_store_n(&act_isa, isa, __ATOMIC_RELAXED);
}

void dps_q8_act_plain(int on)
{
	dps_q8_act_isa(on ? 0 : -1);
}

int dps_q8_act_quantize(struct dps_q8_act *a, const float *x, int m, int k)
{
	const size_t kb = dps_q8_blocks(k), kp = kb * DPS_Q8_BLOCK;
	const size_t rows = (size_t)(m > 0 ? m : 0);
	int isa = __atomic_load_n(&act_isa, __ATOMIC_RELAXED), avx2;

	if (isa < 0) {
		__builtin_cpu_init();
		isa = !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 0
		      : __builtin_cpu_supports("avx512f")				 ? 2
											 : 1;
		__atomic_store_n(&act_isa, isa, __ATOMIC_RELAXED);
	}
	avx2 = isa > 0;
	if (grow((void **)&a->q, &a->cap_q, rows * kp, 1) ||
	    grow((void **)&a->d, &a->cap_d, rows * kb, sizeof(float)) ||
	    grow((void **)&a->nc, &a->cap_nc, rows * kb, sizeof(int32_t)))
		return -ENOMEM;
	a->m = m;
	a->k = k;
	for (size_t i = 0; i < rows; i++) {
		const float *v = x + i * (size_t)k;
		int8_t *q = a->q + i * kp;

		for (size_t g0 = 0; g0 < kb; g0 += DPS_Q8_GROUP) {
			const size_t t = kb - g0 < DPS_Q8_GROUP ? kb - g0 : DPS_Q8_GROUP;
			int32_t blk[DPS_Q8_GROUP][DPS_Q8_BLOCK / 4]; /* each block's 8 slots of 4 */

			/* a whole group whose every value is there */
			if (isa == 2 && t == DPS_Q8_GROUP &&
			    (g0 + DPS_Q8_GROUP) * DPS_Q8_BLOCK <= (size_t)k) {
				act_group_avx512(v + g0 * DPS_Q8_BLOCK, a->d + i * kb + g0,
						 a->nc + i * kb + g0, q + g0 * DPS_Q8_BLOCK);
				continue;
			}
			for (size_t u = 0; u < t; u++) {
				const size_t b = g0 + u;
				const int c0 = (int)b * DPS_Q8_BLOCK;
				const int cnt = k - c0 < DPS_Q8_BLOCK ? k - c0 : DPS_Q8_BLOCK;

				a->nc[i * kb + b] = avx2 ? act_block_avx2(v + c0, cnt, &a->d[i * kb + b],
									  (int8_t *)blk[u])
							 : act_block_ref(v + c0, cnt, &a->d[i * kb + b],
									 (int8_t *)blk[u]);
			}
			/* the group's slots: slot j holds bytes 4j..4j+3 of each block in turn */
			for (size_t j = 0; j < DPS_Q8_BLOCK / 4; j++)
				for (size_t u = 0; u < t; u++)
					memcpy(q + g0 * DPS_Q8_BLOCK + j * 4 * t + 4 * u, &blk[u][j], 4);
		}
	}
	return 0;
}

void dps_q8_act_free(struct dps_q8_act *a)
{
	free(a->q);
	free(a->d);
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
		int32_t p = 0;

		for (int c = 0; c < DPS_Q8_BLOCK; c++) {
			const size_t at = dps_q8_pos(kb, b, c);

			p += (int32_t)q[at] * ((int32_t)w[at] - 128);
		}
		a[b % 16] = fmaf(d[b] * dps_f16_to_f32(dw[b]), (float)p, a[b % 16]);
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

/*
 * One group (t blocks from block g0; full: t == 16, a constant where inlined) of mr rows of x
 * (from row i0 of a) against four rows of W (w[q], scales dw[q]): the block sums by vpdpbusd,
 * one 64-byte slot at a time, then one FMA per output into acc. Lanes past t load zeros and
 * keep their sums.
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"), always_inline)) static inline void
group_avx512(__m512 acc[2][GROUP], const struct dps_q8_act *a, int i0,
	     const uint8_t *const w[GROUP], const uint16_t *const dw[GROUP], size_t kb,
	     size_t g0, size_t t, const int mr, const int full)
{
	const size_t kp = kb * DPS_Q8_BLOCK, off = g0 * DPS_Q8_BLOCK, sl = 4 * t;
	const __mmask64 mv = full ? ~(__mmask64)0 : ((__mmask64)1 << sl) - 1;
	const __mmask16 mb = full ? (__mmask16)0xffff : (__mmask16)((1u << t) - 1);
	__m512i p[2][GROUP];

#pragma GCC unroll 2
	for (int i = 0; i < mr; i++) {
		const __m512i nc = full ? _mm512_loadu_si512(a->nc + (size_t)(i0 + i) * kb + g0)
					: _mm512_maskz_loadu_epi32(mb, a->nc + (size_t)(i0 + i) * kb + g0);

		p[i][0] = p[i][1] = p[i][2] = p[i][3] = nc;
	}
#pragma GCC unroll 8
	for (int j = 0; j < 8; j++) {
		const size_t at = off + (size_t)j * sl;
		__m512i wv[GROUP];

#pragma GCC unroll 4
		for (int q = 0; q < GROUP; q++)
			wv[q] = full ? _mm512_loadu_si512(w[q] + at)
				     : _mm512_maskz_loadu_epi8(mv, w[q] + at);
#pragma GCC unroll 2
		for (int i = 0; i < mr; i++) {
			const int8_t *xq = a->q + (size_t)(i0 + i) * kp + at;
			const __m512i xv = full ? _mm512_loadu_si512(xq) : _mm512_maskz_loadu_epi8(mv, xq);

#pragma GCC unroll 4
			for (int q = 0; q < GROUP; q++)
				p[i][q] = _mm512_dpbusd_epi32(p[i][q], wv[q], xv);
		}
	}
#pragma GCC unroll 4
	for (int q = 0; q < GROUP; q++) {
		const __m512 sw = _mm512_cvtph_ps(full ? _mm256_loadu_si256((const void *)(dw[q] + g0))
						       : _mm256_maskz_loadu_epi16(mb, dw[q] + g0));

#pragma GCC unroll 2
		for (int i = 0; i < mr; i++) {
			const float *dx = a->d + (size_t)(i0 + i) * kb + g0;
			const __m512 s = _mm512_mul_ps(full ? _mm512_loadu_ps(dx)
							    : _mm512_maskz_loadu_ps(mb, dx), sw);

			acc[i][q] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p[i][q]), acc[i][q]);
		}
	}
}

/*
 * mr (1 or 2, a constant where inlined) rows of x, from row i0 of a, against rows r0 ..
 * r0 + nr - 1 of W, one group of sixteen blocks at a time.
 *
 * Assumptions: rows of W are row_bytes apart; rows r0 + nr .. r0 + 3 are not read (their
 * loads repeat row r0); masked loads read nothing past the mask.
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"), always_inline)) static inline void
q8_block_avx512(float *restrict out, int ldo, const struct dps_q8_act *a, int i0,
		const void *W, int r0, int nr, const int mr)
{
	const int k = a->k;
	const size_t kb = dps_q8_blocks(k);
	const uint8_t *w[GROUP];
	const uint16_t *dw[GROUP];
	__m512 acc[2][GROUP];
	size_t g0 = 0;

	for (int q = 0; q < GROUP; q++) {
		const size_t r = (size_t)r0 + (size_t)(q < nr ? q : 0);

		w[q] = dps_q8_row(W, r, k);
		dw[q] = dps_q8_scales(W, r, k);
	}
#pragma GCC unroll 2
	for (int i = 0; i < mr; i++)
		acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = _mm512_setzero_ps();
	for (; g0 + DPS_Q8_GROUP <= kb; g0 += DPS_Q8_GROUP)
		group_avx512(acc, a, i0, w, dw, kb, g0, DPS_Q8_GROUP, mr, 1);
	if (g0 < kb)
		group_avx512(acc, a, i0, w, dw, kb, g0, kb - g0, mr, 0);
#pragma GCC unroll 2
	for (int i = 0; i < mr; i++)
		dps_dot_store4_512(out + (size_t)(i0 + i) * (size_t)ldo + (size_t)r0, acc[i][0],
				   acc[i][1], acc[i][2], acc[i][3], nr);
}

/*
 * group_avx512 for one row of W (w, scales dw) against mr rows of x from row 0: the same
 * vpdpbusd per slot and the same FMA per output, so the same bits. Each line of the group's
 * values is asked for LINE_FAR and LINE_AHEAD bytes ahead.
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"), always_inline)) static inline void
row_group_avx512(__m512 acc[2], const struct dps_q8_act *a, const uint8_t *w,
		 const uint16_t *dw, size_t kb, size_t g0, size_t t, const int mr, const int full)
{
	const size_t kp = kb * DPS_Q8_BLOCK, off = g0 * DPS_Q8_BLOCK, sl = 4 * t;
	const __mmask64 mv = full ? ~(__mmask64)0 : ((__mmask64)1 << sl) - 1;
	const __mmask16 mb = full ? (__mmask16)0xffff : (__mmask16)((1u << t) - 1);
	__m512i p[2][2]; /* two chains a row of x (even and odd slots): integers, exact */

#pragma GCC unroll 2
	for (int i = 0; i < mr; i++) {
		p[i][0] = full ? _mm512_loadu_si512(a->nc + (size_t)i * kb + g0)
			       : _mm512_maskz_loadu_epi32(mb, a->nc + (size_t)i * kb + g0);
		p[i][1] = _mm512_setzero_si512();
	}
	for (int z = 0; z < 8; z++) {
		_mm_prefetch((const char *)(w + off) + LINE_FAR + 64 * z, _MM_HINT_T2);
		_mm_prefetch((const char *)(w + off) + LINE_AHEAD + 64 * z, _MM_HINT_T1);
	}
#pragma GCC unroll 8
	for (int j = 0; j < 8; j++) {
		const size_t at = off + (size_t)j * sl;
		const char *pw = (const char *)w + at;
		const __m512i wv = full ? _mm512_loadu_si512(pw) : _mm512_maskz_loadu_epi8(mv, pw);

#pragma GCC unroll 2
		for (int i = 0; i < mr; i++) {
			const int8_t *xq = a->q + (size_t)i * kp + at;

			p[i][j & 1] = _mm512_dpbusd_epi32(p[i][j & 1], wv,
							  full ? _mm512_loadu_si512(xq)
							       : _mm512_maskz_loadu_epi8(mv, xq));
		}
	}
	{
		const __m512 sw = _mm512_cvtph_ps(full ? _mm256_loadu_si256((const void *)(dw + g0))
						       : _mm256_maskz_loadu_epi16(mb, dw + g0));

#pragma GCC unroll 2
		for (int i = 0; i < mr; i++) {
			const float *dx = a->d + (size_t)i * kb + g0;
			const __m512 sc = _mm512_mul_ps(full ? _mm512_loadu_ps(dx)
							     : _mm512_maskz_loadu_ps(mb, dx), sw);

			acc[i] = _mm512_fmadd_ps(
				sc, _mm512_cvtepi32_ps(_mm512_add_epi32(p[i][0], p[i][1])), acc[i]);
		}
	}
}

/*
 * Decode (mr = a->m, 1 or 2): rows r0 .. r0 + nr - 1 of W one after the other. A row is one
 * contiguous range (values, then scales), so W is read as one stream, which this CPU's
 * prefetcher follows far better than four rows side by side (gemm_dot.c's rows_avx512; one
 * Zen 5 core, bench-110m INT8, batch 1, bench decode: 88 -> 164 tok/s).
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"), always_inline)) static inline void
q8_rows_avx512(float *restrict out, int ldo, const struct dps_q8_act *a, const void *W, int r0,
	       int nr, const int mr)
{
	const int k = a->k;
	const size_t kb = dps_q8_blocks(k);
	__m512 acc[GROUP][2];

	for (int q = 0; q < GROUP; q++) {
		const uint8_t *w = dps_q8_row(W, (size_t)r0 + (size_t)(q < nr ? q : 0), k);
		const uint16_t *dw = dps_q8_scales(W, (size_t)r0 + (size_t)(q < nr ? q : 0), k);
		__m512 sum[2] = { _mm512_setzero_ps(), _mm512_setzero_ps() }; /* in registers */
		size_t g0 = 0;

		if (q < nr) {
			for (; g0 + DPS_Q8_GROUP <= kb; g0 += DPS_Q8_GROUP)
				row_group_avx512(sum, a, w, dw, kb, g0, DPS_Q8_GROUP, mr, 1);
			if (g0 < kb)
				row_group_avx512(sum, a, w, dw, kb, g0, kb - g0, mr, 0);
		}
		acc[q][0] = sum[0];
		acc[q][1] = sum[1];
	}
#pragma GCC unroll 2
	for (int i = 0; i < mr; i++)
		dps_dot_store4_512(out + (size_t)i * (size_t)ldo + (size_t)r0, acc[0][i], acc[1][i],
				   acc[2][i], acc[3][i], nr);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))) static void
q8_tile_avx512(float *restrict out, int ldo, const struct dps_q8_act *a, const void *W,
	       int r0, int nr)
{
	int i = 0;

	if (a->m == 1) {
		q8_rows_avx512(out, ldo, a, W, r0, nr, 1);
		return;
	}
	if (a->m == 2) {
		q8_rows_avx512(out, ldo, a, W, r0, nr, 2);
		return;
	}
	for (; i + 2 <= a->m; i += 2)
		q8_block_avx512(out, ldo, a, i, W, r0, nr, 2);
	if (i < a->m)
		q8_block_avx512(out, ldo, a, i, W, r0, nr, 1);
}

void dps_gemm_q8_avx512(float *restrict out, int ldo, const struct dps_q8_act *a,
			const void *W, int n)
{
	q8_blocked(q8_tile_avx512, out, ldo, a, W, n);
}

/* ---- AVX2 ------------------------------------------------------------------------------ */

/*
 * The sums of eight blocks (one lane each) over the 8 slots of a group: w and x point at
 * slot 0 of these eight blocks, sl bytes between slots, cnt (1..8) blocks present (lanes
 * past them load zeros). vpmaddubsw multiplies |x| (unsigned) by the weight with x's sign
 * (vpsignb; zero where x is zero) and adds pairs, at most 2 * 127 * 127 < 2^15, so it never
 * saturates; vpmaddwd adds the pairs into int32, and the slots add up exactly.
 */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256i
sums8_avx2(const uint8_t *w, const int8_t *x, size_t sl, int cnt)
{
	const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt),
						 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	__m256i p = _mm256_setzero_si256();

	for (int j = 0; j < 8; j++) {
		const __m256i wv = cnt == 8 ? _mm256_loadu_si256((const void *)(w + (size_t)j * sl))
					    : _mm256_maskload_epi32((const int *)(const void *)(
							      w + (size_t)j * sl), lanes);
		const __m256i xv = cnt == 8 ? _mm256_loadu_si256((const void *)(x + (size_t)j * sl))
					    : _mm256_maskload_epi32((const int *)(const void *)(
							      x + (size_t)j * sl), lanes);
		/* q + 128 -> q (a masked-off lane of zeros becomes -128, times x = 0: nothing) */
		const __m256i ws = _mm256_xor_si256(wv, _mm256_set1_epi8((char)0x80));

		p = _mm256_add_epi32(p, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(xv),
									       _mm256_sign_epi8(ws, xv)),
							  _mm256_set1_epi16(1)));
	}
	return p;
}

/*
 * Every row of x against rows r0 .. r0 + nr - 1 of W, one pair of W row and x row at a time:
 * the even and odd halves of a group (blocks 0..7 and 8..15: lanes 0..7 and 8..15 of q8.h)
 * in two 8-lane accumulators, summed at the end as the AVX-512 kernel's halves are.
 */
__attribute__((target("avx2,fma,f16c"))) static void
q8_tile_avx2(float *restrict out, int ldo, const struct dps_q8_act *a, const void *W,
	     int r0, int nr)
{
	const int k = a->k;
	const size_t kb = dps_q8_blocks(k), kp = kb * DPS_Q8_BLOCK;

	for (int i = 0; i < a->m; i++) {
		const int8_t *xq = a->q + (size_t)i * kp;
		const float *dx = a->d + (size_t)i * kb;
		__m256 h[GROUP];
		float s[4];

		for (int q = 0; q < GROUP; q++) {
			const uint8_t *w = dps_q8_row(W, (size_t)r0 + (size_t)(q < nr ? q : 0), k);
			const uint16_t *dw = dps_q8_scales(W, (size_t)r0 + (size_t)(q < nr ? q : 0), k);
			__m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();

			for (size_t g0 = 0; g0 < kb; g0 += DPS_Q8_GROUP) {
				const size_t t = kb - g0 < DPS_Q8_GROUP ? kb - g0 : DPS_Q8_GROUP;
				const size_t off = g0 * DPS_Q8_BLOCK, sl = 4 * t;
				const int nlo = t < 8 ? (int)t : 8, nhi = (int)t - nlo;
				float dxs[16] = { 0 }, dws[16] = { 0 };

				if (a->m == 1)
					_mm_prefetch((const char *)w + off + W_PREFETCH_BYTES, _MM_HINT_T0);
				for (size_t u = 0; u < t; u++) {
					dxs[u] = dx[g0 + u];
					dws[u] = _cvtsh_ss(dw[g0 + u]);
				}
				lo = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dxs), _mm256_loadu_ps(dws)),
						     _mm256_cvtepi32_ps(sums8_avx2(w + off, xq + off, sl, nlo)),
						     lo);
				if (nhi)
					hi = _mm256_fmadd_ps(
						_mm256_mul_ps(_mm256_loadu_ps(dxs + 8), _mm256_loadu_ps(dws + 8)),
						_mm256_cvtepi32_ps(sums8_avx2(w + off + 32, xq + off + 32, sl, nhi)),
						hi);
			}
			h[q] = _mm256_add_ps(lo, hi);
		}
		_mm_storeu_ps(s, dps_dot_reduce4(h[0], h[1], h[2], h[3]));
		for (int q = 0; q < nr; q++)
			out[(size_t)i * (size_t)ldo + (size_t)(r0 + q)] = s[q];
	}
}

void dps_gemm_q8_avx2(float *restrict out, int ldo, const struct dps_q8_act *a, const void *W,
		      int n)
{
	q8_blocked(q8_tile_avx2, out, ldo, a, W, n);
}
