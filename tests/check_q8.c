/* SPDX-License-Identifier: MIT */
/*
 * tests/check_q8.c - INT8 weights (kernels/q8.h). Oracles written here from q8.h's text, not
 * from the kernels' code: the quantization rule (checked element by element in double, the F16
 * scale against the CPU's own F16C rounding), and the order of the sum (a block's exact sum,
 * the per-block f32 scale product, lane b mod 16 and the tree, with the integers computed from
 * signed values in column order rather than the stored, interleaved q + 128). Every path - the
 * plain-C twin, AVX2 and AVX-512 VNNI - is held to that oracle bit for bit at m = 1 .. 129
 * with whole and partial groups of sixteen blocks, partial last blocks and tails in n, and
 * dps_linear_q8 over 1, 2 and 3 threads; a row's result is the same alone and in a batch. The
 * product is also within the quantization error of the f32 product. The activations'
 * quantizers (plain C, AVX2 a block at a time, AVX-512 a group at a time) follow q8.h's rule
 * (zero blocks, subnormals, blocks too small to scale, ties), and the two SIMD ones agree even
 * on NaN and infinities. Two wrong kernels are
 * shown to be caught: blocks in lanes b mod 8, and the activations' scales left out of the
 * per-block product (applied at the end instead).
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "kernels/gemm.h"
#include "kernels/q8.h"

static const int shapes[][3] = { { 1, 67, 70 },	  { 1, 2048, 768 }, { 2, 9, 32 },
				 { 3, 21, 33 },	  { 4, 40, 64 },    { 5, 13, 96 },
				 { 47, 21, 129 }, { 48, 37, 160 },  { 129, 67, 40 },
				 { 1, 9, 2063 },  { 7, 5, 1 },      { 129, 100, 771 },
				 { 1, 6, 512 },   { 3, 6, 544 },    { 2, 5, 800 },
				 { 3, 7, 1000 },  { 2, 5, 2047 } };

static float frand(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* The F16 of f by the CPU (F16C, round to nearest even), as a float. */
__attribute__((target("f16c"))) static float f16_hw(float f)
{
	return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

__attribute__((target("f16c"))) static float f16_widen_hw(uint16_t h)
{
	return _cvtsh_ss(h);
}

/* Weight quantization written from q8.h: signed values q (n x kp) and scales d (n x kb). */
static void quantize_oracle(int8_t *q, float *d, const float *w, int n, int k)
{
	const int kb = (k + 31) / 32;

	for (int r = 0; r < n; r++)
		for (int b = 0; b < kb; b++) {
			double amax = 0;
			float df;

			for (int j = 0; j < 32 && 32 * b + j < k; j++)
				amax = fmax(amax, fabs((double)w[(size_t)r * k + 32 * b + j]));
			df = f16_hw((float)amax / 127.0f);
			d[r * kb + b] = df;
			for (int j = 0; j < 32; j++) {
				double v = 32 * b + j < k ? w[(size_t)r * k + 32 * b + j] / (double)df : 0;

				if (df == 0.0f)
					v = 0;
				v = nearbyint(v); /* ties to even, as the default rounding mode */
				q[(size_t)r * kb * 32 + 32 * b + j] = (int8_t)fmin(127, fmax(-127, v));
			}
		}
}

/*
 * The order of q8.h, written from its text: activations quantized with an f32 scale, each
 * block's exact integer sum P, the scale product s = dx * dw rounded to f32, one fmaf per
 * block into lane b mod 16, the tree. variant 1: every block into lanes 0..7 by b mod 8 (a
 * wrong order); variant 2: the activations' scale applied after the sum (a wrong product).
 * Both must be caught.
 */
static float dot_oracle(const float *x, const int8_t *qw, const float *dw, int k, int variant)
{
	const int kb = (k + 31) / 32;
	float a[16] = { 0 }, dx_last = 0;

	for (int b = 0; b < kb; b++) {
		float amax = 0, dx, id, s;
		int p = 0;

		for (int j = 0; j < 32 && 32 * b + j < k; j++)
			amax = fmaxf(amax, fabsf(x[32 * b + j]));
		dx = amax / 127.0f;
		id = amax > 0 ? 127.0f / amax : 0.0f;
		for (int j = 0; j < 32 && 32 * b + j < k; j++)
			p += (int)nearbyintf(x[32 * b + j] * id) * qw[32 * b + j];
		s = variant == 2 ? dw[b] : dx * dw[b];
		dx_last = dx;
		a[variant == 1 ? b % 8 : b % 16] = fmaf(s, (float)p, a[variant == 1 ? b % 8 : b % 16]);
	}
	for (int l = 0; l < 8; l++)
		a[l] += a[l + 8];
	for (int l = 0; l < 4; l++)
		a[l] += a[l + 4];
	for (int l = 0; l < 2; l++)
		a[l] += a[l + 2];
	return variant == 2 ? (a[0] + a[1]) * dx_last : a[0] + a[1];
}

struct prob {
	int m, n, k;
	float *x, *w;   /* x (m, k), w (n, k) */
	void *wq;       /* w quantized by the kernels (q8.h's layout) */
	int8_t *oq;     /* the oracle's quantization */
	float *od;
	float *want;    /* the oracle's product, row stride n */
};

static void prob_make(struct prob *p, int m, int n, int k, unsigned seed, int variant)
{
	const int kb = (k + 31) / 32;

	p->m = m, p->n = n, p->k = k;
	p->x = malloc(sizeof(float) * (size_t)m * (size_t)k);
	p->w = malloc(sizeof(float) * (size_t)n * (size_t)k);
	p->wq = malloc(dps_q8_bytes((size_t)n, k));
	p->oq = malloc((size_t)n * (size_t)kb * 32);
	p->od = malloc(sizeof(float) * (size_t)n * (size_t)kb);
	p->want = malloc(sizeof(float) * (size_t)m * (size_t)n);
	ck_assert(p->x && p->w && p->wq && p->oq && p->od && p->want);
	for (size_t i = 0; i < (size_t)m * (size_t)k; i++)
		p->x[i] = frand(&seed) * (i % 97 == 5 ? 40.0f : 1.0f);
	for (size_t i = 0; i < (size_t)n * (size_t)k; i++)
		p->w[i] = frand(&seed) * (i % 89 == 3 ? 3.0f : 0.05f);
	if (n > 2) /* a zero row and a zero block: scale 0 */
		for (int c = 0; c < k; c++)
			p->w[(size_t)2 * k + (size_t)c] = 0.0f;
	dps_q8_quantize_rows(p->wq, k, p->w, (size_t)n);
	quantize_oracle(p->oq, p->od, p->w, n, k);
	for (int i = 0; i < m; i++)
		for (int r = 0; r < n; r++)
			p->want[(size_t)i * n + r] = dot_oracle(p->x + (size_t)i * k,
								p->oq + (size_t)r * kb * 32,
								p->od + (size_t)r * kb, k, variant);
}

static void prob_free(struct prob *p)
{
	free(p->x), free(p->w), free(p->wq), free(p->oq), free(p->od), free(p->want);
}

START_TEST(test_quantization_rule)
{
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		struct prob p;
		const int n = shapes[s][1], k = shapes[s][2], kb = (k + 31) / 32;

		prob_make(&p, 1, n, k, 7u + (unsigned)s, 0);
		for (int r = 0; r < n; r++) {
			const uint16_t *d = dps_q8_scales(p.wq, (size_t)r, k);
			int8_t q[2063];
			float deq[2063];

			dps_q8_export_row(q, NULL, p.wq, k, (size_t)r);
			for (int c = 0; c < k; c++)
				ck_assert_msg(q[c] == p.oq[(size_t)r * kb * 32 + c],
					      "k %d row %d value %d: %d, oracle %d", k, r, c,
					      q[c], p.oq[(size_t)r * kb * 32 + c]);
			for (int b = 0; b < kb; b++)
				ck_assert_float_eq(f16_widen_hw(d[b]), p.od[(size_t)r * kb + b]);
			/* the values are the nearest multiples of the scale (within half a step) */
			dps_q8_dequantize_row(deq, p.wq, k, (size_t)r);
			for (int c = 0; c < k; c++) {
				const double df = p.od[(size_t)r * kb + c / 32];

				ck_assert(fabs((double)deq[c] - p.w[(size_t)r * k + c]) <= df * 0.5 + 1e-9 ||
					  fabs(p.w[(size_t)r * k + c]) > 127 * df);
			}
		}
		prob_free(&p);
	}
}
END_TEST

enum { PATH_REF, PATH_AVX2, PATH_AVX512, N_PATHS };
static int paths[N_PATHS], n_paths;

static void run_path(int path, float *out, const struct prob *p)
{
	struct dps_q8_act a = { 0 };

	ck_assert_int_eq(dps_q8_act_quantize(&a, p->x, p->m, p->k), 0);
	if (path == PATH_AVX512)
		dps_gemm_q8_avx512(out, p->n, &a, p->wq, p->n);
	else if (path == PATH_AVX2)
		dps_gemm_q8_avx2(out, p->n, &a, p->wq, p->n);
	else
		dps_gemm_q8_ref(out, p->n, &a, p->wq, p->n);
	dps_q8_act_free(&a);
}

START_TEST(test_paths_give_the_order)
{
	const int path = paths[_i];

	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		struct prob p;
		float *got;

		prob_make(&p, shapes[s][0], shapes[s][1], shapes[s][2], 11u + (unsigned)s, 0);
		got = malloc(sizeof(float) * (size_t)p.m * (size_t)p.n);
		run_path(path, got, &p);
		for (int i = 0; i < p.m * p.n; i++)
			ck_assert_msg(!memcmp(&got[i], &p.want[i], sizeof(float)),
				      "path %d, m %d n %d k %d, output %d: %a, oracle %a", path, p.m,
				      p.n, p.k, i, (double)got[i], (double)p.want[i]);
		free(got);
		prob_free(&p);
	}
}
END_TEST

START_TEST(test_plain_activations)
{
	/* The plain-C quantizer of the activations gives the SIMD ones' bytes (and the oracle's
	 * products), NaN-free inputs with partial blocks and groups: AVX2 (_i 0) and AVX-512
	 * (_i 1, whole groups; the rest AVX2). */
	const int isa = _i + 1;

	if (isa == 2 && !__builtin_cpu_supports("avx512f")) {
		printf("skipped: the AVX-512 quantizer of activations needs AVX-512F\n");
		return;
	}
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
		printf("skipped: the SIMD quantizers of activations need AVX2 and FMA\n");
		return;
	}
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		struct prob p;
		struct dps_q8_act a = { 0 }, b = { 0 };
		const size_t kb = dps_q8_blocks(shapes[s][2]);
		float *got;

		prob_make(&p, shapes[s][0], shapes[s][1], shapes[s][2], 31u + (unsigned)s, 0);
		dps_q8_act_isa(isa);
		ck_assert_int_eq(dps_q8_act_quantize(&a, p.x, p.m, p.k), 0);
		dps_q8_act_plain(1);
		ck_assert_int_eq(dps_q8_act_quantize(&b, p.x, p.m, p.k), 0);
		got = malloc(sizeof(float) * (size_t)p.m * (size_t)p.n);
		dps_gemm_q8_ref(got, p.n, &b, p.wq, p.n);
		dps_q8_act_plain(0);
		ck_assert(!memcmp(a.q, b.q, (size_t)p.m * kb * 32));
		ck_assert(!memcmp(a.d, b.d, sizeof(float) * (size_t)p.m * kb));
		ck_assert(!memcmp(a.nc, b.nc, sizeof(int32_t) * (size_t)p.m * kb));
		ck_assert(!memcmp(got, p.want, sizeof(float) * (size_t)p.m * (size_t)p.n));
		free(got);
		dps_q8_act_free(&a);
		dps_q8_act_free(&b);
		prob_free(&p);
	}
}
END_TEST

/* a (m rows of k) holds the rule's values want (block after block, in column order), scales
 * wd and sums wnc. */
static void act_matches(const struct dps_q8_act *a, int isa, int m, int k, const int8_t *want,
			const float *wd, const int32_t *wnc)
{
	const int kb = (k + 31) / 32;

	for (int ib = 0; ib < m * kb; ib++) { /* row ib / kb, block ib % kb */
		const int i = ib / kb, b = ib % kb;
		const int8_t *q = a->q + (size_t)i * kb * 32, *w = want + (size_t)ib * 32;

		ck_assert_msg(!memcmp(&a->d[ib], &wd[ib], sizeof(float)),
			      "isa %d k %d row %d block %d: scale %a, rule %a", isa, k, i, b,
			      (double)a->d[ib], (double)wd[ib]);
		ck_assert_int_eq(a->nc[ib], wnc[ib]);
		for (int j = 0; j < 32; j++)
			ck_assert_msg(q[dps_q8_pos((size_t)kb, (size_t)b, j)] == w[j],
				      "isa %d k %d row %d block %d value %d", isa, k, i, b, j);
	}
}

START_TEST(test_activations_by_the_rule)
{
	/*
	 * Each quantizer of activations (plain C, AVX2, AVX-512) against the rule of q8.h written
	 * here: rows with whole and partial groups and a partial last block (k 1000, 2047; the
	 * values past a row, the next row's first block or what follows the last row, are not
	 * zeros, so a quantizer that read them would be seen), and blocks of zeros, of -0.0, of
	 * subnormals, of values under 127 / FLT_MAX (zeros by the rule), with their max at that
	 * bound (B: 127 / B is FLT_MAX, so they quantize) and one step under it (zeros), of huge
	 * values, and of halves with a max of 127 (scaled by 1: ties that round to even).
	 */
	static const int ks[] = { 1, 31, 33, 511, 512, 513, 1000, 1024, 2047, 2880 };
	enum { M = 3, KMAX = 2880, KINDS = 10 };
	static float x[M * KMAX + 32];
	static int8_t want[M * KMAX];
	const float bound = 0x1.fc0002p-122f, under = 0x1.fcp-122f; /* 127 / FLT_MAX, rounded */

	ck_assert(127.0f / bound == FLT_MAX && isinf(127.0f / under));
	for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
		const int k = ks[ki], kb = (k + 31) / 32;
		float wd[M * 90];
		int32_t wnc[M * 90];
		unsigned seed = 17u + (unsigned)ki;

		for (int i = 0; i < M * k + 32; i++) {
			/* every row's first block plain; the others by kind in turn */
			const int blk = (i % k) / 32, c = (i % k) % 32;
			const int kind = i >= M * k || blk == 0 ? 0 : (blk + i / k) % KINDS;
			const float r = frand(&seed);

			x[i] = kind == 1   ? 0.0f
			       : kind == 2 ? -0.0f
			       : kind == 3 ? r * 1e-39f /* subnormal */
			       : kind == 4 ? r * 1e-37f /* max under 127 / FLT_MAX */
			       : kind == 5 ? c ? r * 0.5f * bound : bound  /* max at the bound */
			       : kind == 6 ? c ? r * 0.5f * under : -under /* a step under it */
			       : kind == 7 ? r * 1e37f			   /* huge */
			       : kind == 8 ? c ? (float)((int)(r * 8) * 2 + 1) * 0.5f : 127.0f
					   : r;
		}
		for (int i = 0; i < M; i++)
			for (int b = 0; b < kb; b++) {
				const float *v = x + (size_t)i * k + 32 * b;
				const int cnt = k - 32 * b < 32 ? k - 32 * b : 32;
				float amax = 0.0f, id;
				int sum = 0;

				for (int j = 0; j < cnt; j++)
					amax = fmaxf(amax, fabsf(v[j]));
				id = 127.0f / amax;
				if (!(amax > 0.0f) || isinf(id))
					id = 0.0f;
				wd[i * kb + b] = amax / 127.0f;
				for (int j = 0; j < 32; j++) {
					const int qv = j < cnt ? (int)nearbyintf(v[j] * id) : 0;

					want[(size_t)i * kb * 32 + 32 * b + j] = (int8_t)qv;
					sum += qv;
				}
				wnc[i * kb + b] = -128 * sum;
			}
		for (int isa = 0; isa <= 2; isa++) {
			struct dps_q8_act a = { 0 };

			if ((isa >= 1 && (!__builtin_cpu_supports("avx2") ||
					  !__builtin_cpu_supports("fma"))) ||
			    (isa == 2 && !__builtin_cpu_supports("avx512f")))
				continue;
			dps_q8_act_isa(isa);
			ck_assert_int_eq(dps_q8_act_quantize(&a, x, M, k), 0);
			act_matches(&a, isa, M, k, want, wd, wnc);
			dps_q8_act_free(&a);
		}
		dps_q8_act_isa(-1);
	}
}
END_TEST

START_TEST(test_simd_activations_agree_on_nan_and_inf)
{
	/* Where the plain twin may differ (lrintf of NaN), the two SIMD quantizers still give the
	 * same bytes, scales and sums: blocks with NaN, an infinity, both, and values far apart in
	 * size. */
	enum { K = 1056 }; /* two whole groups and a partial one */
	static float x[3 * K];
	struct dps_q8_act a = { 0 }, b = { 0 };
	const size_t kb = dps_q8_blocks(K);
	unsigned seed = 5;

	if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx2") ||
	    !__builtin_cpu_supports("fma")) {
		printf("skipped: comparing the SIMD quantizers needs AVX-512F, AVX2 and FMA\n");
		return;
	}
	for (int i = 0; i < 3 * K; i++)
		x[i] = frand(&seed) * (i % 7 == 0 ? 1e30f : i % 5 == 0 ? 1e-30f : 1.0f);
	for (int b0 = 0; b0 < 3 * K; b0 += 32 * 5) {
		x[b0 + 3] = __builtin_nanf("");
		x[b0 + 40] = __builtin_inff();
		x[b0 + 70] = -__builtin_inff();
		x[b0 + 71] = __builtin_nanf("");
	}
	dps_q8_act_isa(1);
	ck_assert_int_eq(dps_q8_act_quantize(&a, x, 3, K), 0);
	dps_q8_act_isa(2);
	ck_assert_int_eq(dps_q8_act_quantize(&b, x, 3, K), 0);
	dps_q8_act_isa(-1);
	ck_assert(!memcmp(a.q, b.q, 3 * kb * 32));
	ck_assert(!memcmp(a.d, b.d, sizeof(float) * 3 * kb));
	ck_assert(!memcmp(a.nc, b.nc, sizeof(int32_t) * 3 * kb));
	/* the check can fail: one value changed changes the bytes */
	x[98] *= 0.25f; /* one of its block's large values: the bytes change */
	ck_assert_int_eq(dps_q8_act_quantize(&b, x, 3, K), 0);
	ck_assert(memcmp(a.q, b.q, 3 * kb * 32));
	dps_q8_act_free(&a);
	dps_q8_act_free(&b);
}
END_TEST

/* A slice of rows [lo, hi) of a bigger weight gives those columns (the threads' split). */
START_TEST(test_row_slices)
{
	struct prob p;
	float *got;
	struct dps_q8_act a = { 0 };

	prob_make(&p, 5, 100, 96, 5u, 0);
	got = calloc((size_t)p.m * (size_t)p.n, sizeof(float));
	ck_assert_int_eq(dps_q8_act_quantize(&a, p.x, p.m, p.k), 0);
	for (int lo = 0; lo < p.n; lo += 37) {
		const int hi = lo + 37 < p.n ? lo + 37 : p.n;

		for (int path = 0; path < n_paths; path++) {
			const void *Wl = dps_q8_row(p.wq, (size_t)lo, p.k);

			memset(got, 0, sizeof(float) * (size_t)p.m * (size_t)p.n);
			if (paths[path] == PATH_AVX512)
				dps_gemm_q8_avx512(got + lo, p.n, &a, Wl, hi - lo);
			else if (paths[path] == PATH_AVX2)
				dps_gemm_q8_avx2(got + lo, p.n, &a, Wl, hi - lo);
			else
				dps_gemm_q8_ref(got + lo, p.n, &a, Wl, hi - lo);
			for (int i = 0; i < p.m; i++)
				for (int c = lo; c < hi; c++)
					ck_assert(!memcmp(&got[(size_t)i * p.n + c],
							  &p.want[(size_t)i * p.n + c], sizeof(float)));
		}
	}
	dps_q8_act_free(&a);
	free(got);
	prob_free(&p);
}
END_TEST

START_TEST(test_linear_threads_and_batches)
{
	/* dps_linear_q8 over _i + 1 threads: every row of a batch of 129 as it is alone. */
	struct prob p;
	float *got, one[300];
	char msg[256];

	ck_assert_int_eq(dps_gemm_setup("auto", _i + 1, msg, sizeof(msg)), 0);
	prob_make(&p, 129, 300, 200, 3u, 0);
	got = malloc(sizeof(float) * (size_t)p.m * (size_t)p.n);
	dps_linear_q8(got, p.x, p.wq, p.m, p.n, p.k);
	for (int i = 0; i < p.m; i++) {
		ck_assert(!memcmp(got + (size_t)i * p.n, p.want + (size_t)i * p.n,
				  sizeof(float) * (size_t)p.n));
		dps_linear_q8(one, p.x + (size_t)i * p.k, p.wq, 1, p.n, p.k);
		ck_assert(!memcmp(one, p.want + (size_t)i * p.n, sizeof(float) * (size_t)p.n));
	}
	dps_linear_w(one, p.x, p.wq, DPS_WT_Q8, 1, p.n, p.k);
	ck_assert(!memcmp(one, p.want, sizeof(float) * (size_t)p.n));
	dps_linear_q8_ref(got, p.x, p.wq, p.m, p.n, p.k);
	ck_assert(!memcmp(got, p.want, sizeof(float) * (size_t)p.m * (size_t)p.n));
	free(got);
	prob_free(&p);
}
END_TEST

START_TEST(test_close_to_f32)
{
	/* The product is the f32 product within the quantization error of both operands. */
	struct prob p;
	float *got;

	prob_make(&p, 4, 64, 768, 17u, 0);
	got = malloc(sizeof(float) * (size_t)p.m * (size_t)p.n);
	dps_linear_q8(got, p.x, p.wq, p.m, p.n, p.k);
	for (int i = 0; i < p.m; i++)
		for (int r = 0; r < p.n; r++) {
			double exact = 0, bound = 0;

			for (int c = 0; c < p.k; c++) {
				const double x = p.x[(size_t)i * p.k + c], w = p.w[(size_t)r * p.k + c];

				exact += x * w;
				bound += fabs(x) * 0.05 * 3 / 127 + fabs(w) * 40 / 127; /* half-steps, generous */
			}
			ck_assert_msg(fabs(got[(size_t)i * p.n + r] - exact) <= 0.5 * bound,
				      "%g vs %g (bound %g)", (double)got[(size_t)i * p.n + r], exact,
				      0.5 * bound);
		}
	free(got);
	prob_free(&p);
}
END_TEST

START_TEST(test_wrong_products_are_caught)
{
	for (int variant = 1; variant <= 2; variant++) {
		struct prob p;
		float *got;
		int differ = 0;

		prob_make(&p, 3, 40, 800, 23u, variant);
		got = malloc(sizeof(float) * (size_t)p.m * (size_t)p.n);
		run_path(PATH_REF, got, &p);
		for (int i = 0; i < p.m * p.n; i++)
			differ += !!memcmp(&got[i], &p.want[i], sizeof(float));
		ck_assert_msg(differ > p.m * p.n / 4, "variant %d: only %d of %d outputs differ",
			      variant, differ, p.m * p.n);
		free(got);
		prob_free(&p);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("q8");
	TCase *tc = tcase_create("q8");
	SRunner *sr;
	int failed;

	__builtin_cpu_init();
	if (!__builtin_cpu_supports("f16c")) {
		printf("skipped: the oracle converts with F16C, which this CPU lacks\n");
		return 77;
	}
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_quantization_rule);
	paths[n_paths++] = PATH_REF;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		paths[n_paths++] = PATH_AVX2;
	else
		printf("skipped: dps_gemm_q8_avx2 needs AVX2 and FMA, which this CPU lacks\n");
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
		paths[n_paths++] = PATH_AVX512;
	else
		printf("skipped: dps_gemm_q8_avx512 needs AVX-512 BW, VL and VNNI, which this CPU lacks\n");
	tcase_add_loop_test(tc, test_paths_give_the_order, 0, n_paths);
	tcase_add_loop_test(tc, test_plain_activations, 0, 2);
	tcase_add_test(tc, test_activations_by_the_rule);
	tcase_add_test(tc, test_simd_activations_agree_on_nan_and_inf);
	tcase_add_test(tc, test_row_slices);
	tcase_add_loop_test(tc, test_linear_threads_and_batches, 0, 3);
	tcase_add_test(tc, test_close_to_f32);
	tcase_add_test(tc, test_wrong_products_are_caught);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
