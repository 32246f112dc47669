/* SPDX-License-Identifier: MIT */
/*
 * tests/check_mxfp4q8.c - the integer form of MXFP4 products (kernels/mxfp4.h, under
 * --quantization int8). The oracle is written here from the headers' text, not from the
 * kernels' code: it reads the blocks as Hugging Face stores them (not re-laid), quantizes the
 * activations per block of 32 (amax / 127, values rounded to nearest even), sums each block's
 * products of 2v and the activation's integer exactly, multiplies by dx * 2^(e - 128) rounded to
 * f32, one fmaf per block into lane b mod 16, and the tree. Every path (plain C, AVX2,
 * AVX-512 VNNI) is held to it bit for bit over m = 1 .. 129, whole and partial groups of
 * sixteen blocks and tails in n; dps_linear_mxfp4_q8 over 1, 2 and 3 threads gives every row of
 * a batch as it is alone; the extreme scales (subnormal powers, overflow, NaN) give the
 * oracle's results; the re-laid weights read back as the stored values; the product is
 * within the activations' quantization error of the exact MXFP4 product. Two wrong oracles
 * (blocks in lanes b mod 8; a block's nibbles read high first) are shown to be caught.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm.h"
#include "kernels/mxfp4.h"
#include "kernels/q8.h"

static const int shapes[][3] = { { 1, 7, 32 },	  { 1, 64, 2880 }, { 2, 9, 96 },
				 { 3, 13, 512 },  { 5, 6, 544 },   { 129, 10, 64 },
				 { 4, 5, 1024 },  { 47, 21, 160 }, { 2, 3, 800 },
				 { 1, 2048, 64 }, { 1, 37, 1024 }, { 1, 40, 512 },
				 { 1, 3, 1536 },  { 1, 39, 1024 } };

static unsigned next(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return *s >> 8;
}

/* The E2M1 value of a code, doubled, written from the format: sign bit 3, exponent bits 1-2,
 * mantissa bit 0 (exponent 0: subnormal 0 or 0.5). */
static int twice_value(int code)
{
	const int e = (code >> 1) & 3, mbit = code & 1, s = code & 8 ? -1 : 1;
	const int v2 = e == 0 ? mbit : (2 + mbit) << (e - 1); /* 2 * (1 + m/2) * 2^(e-1) */

	return s * v2;
}

struct prob {
	int m, n, k;
	float *x;
	uint8_t *blocks, *relaid, *scales;
	float *want;
};

/* variant 1: blocks into lanes b mod 8; variant 2: each byte's nibbles read high first. */
static float dot_oracle(const float *x, const uint8_t *blk, const uint8_t *sc, int k, int variant)
{
	const int kb = k / 32;
	float a[16] = { 0 };

	for (int b = 0; b < kb; b++) {
		float amax = 0, dx, id, s2;
		int p = 0, lane = variant == 1 ? b % 8 : b % 16;

		for (int j = 0; j < 32; j++)
			amax = fmaxf(amax, fabsf(x[32 * b + j]));
		dx = amax / 127.0f;
		id = amax > 0 ? 127.0f / amax : 0.0f;
		for (int j = 0; j < 32; j++) {
			const uint8_t byte = blk[16 * b + j / 2];
			const int hi = (j % 2) ^ (variant == 2);
			const int code = hi ? byte >> 4 : byte & 15;

			p += (int)nearbyintf(x[32 * b + j] * id) * twice_value(code);
		}
		/* 2^(e - 128), exact in f32 down to e = 0 (a subnormal); e = 255 is NaN */
		s2 = sc[b] == 255 ? __builtin_nanf("") : ldexpf(1.0f, sc[b] - 128);
		a[lane] = fmaf(dx * s2, (float)p, a[lane]);
	}
	for (int l = 0; l < 8; l++)
		a[l] += a[l + 8];
	for (int l = 0; l < 4; l++)
		a[l] += a[l + 4];
	for (int l = 0; l < 2; l++)
		a[l] += a[l + 2];
	return a[0] + a[1];
}

static void prob_make(struct prob *p, int m, int n, int k, unsigned seed, int variant)
{
	const size_t bb = dps_mxfp4_block_bytes(n, k), sb = dps_mxfp4_scale_bytes(n, k);

	p->m = m, p->n = n, p->k = k;
	p->x = malloc(sizeof(float) * (size_t)m * (size_t)k);
	p->blocks = malloc(bb);
	p->relaid = malloc(bb);
	p->scales = malloc(sb);
	p->want = malloc(sizeof(float) * (size_t)m * (size_t)n);
	ck_assert(p->x && p->blocks && p->relaid && p->scales && p->want);
	for (size_t i = 0; i < (size_t)m * (size_t)k; i++) {
		/* a spread of magnitudes, some zeros and a zero block now and then */
		const unsigned r = next(&seed);

		p->x[i] = r % 17 == 0 || (i / 32) % 23 == 5 ? 0.0f
			  : (float)((int)(r % 4001) - 2000) / (float)(1 + r % 300);
	}
	for (size_t i = 0; i < bb; i++)
		p->blocks[i] = (uint8_t)next(&seed);
	for (size_t i = 0; i < sb; i++)
		p->scales[i] = (uint8_t)(112 + next(&seed) % 24);
	memcpy(p->relaid, p->blocks, bb);
	ck_assert_int_eq(dps_mxfp4_interleave(p->relaid, (size_t)n, k), 0);
	for (int i = 0; i < m; i++)
		for (int r = 0; r < n; r++)
			p->want[(size_t)i * n + r] =
				dot_oracle(p->x + (size_t)i * k, p->blocks + (size_t)r * (k / 32) * 16,
					   p->scales + (size_t)r * (k / 32), k, variant);
}

static void prob_free(struct prob *p)
{
	free(p->x);
	free(p->blocks);
	free(p->relaid);
	free(p->scales);
	free(p->want);
}

enum { PATH_REF, PATH_AVX2, PATH_AVX512, N_PATHS };
static int paths[N_PATHS], n_paths;

static void run_path(int path, float *out, int ldo, const struct dps_q8_act *a,
		     const uint8_t *blocks, const uint8_t *scales, int n)
{
	if (path == PATH_AVX512)
		dps_gemm_mxfp4q8_avx512(out, ldo, a, blocks, scales, n);
	else if (path == PATH_AVX2)
		dps_gemm_mxfp4q8_avx2(out, ldo, a, blocks, scales, n);
	else
		dps_gemm_mxfp4q8_ref(out, ldo, a, blocks, scales, n);
}

/* Every path's product of a and p's weights gives want's bits (NaN where want is NaN). */
static void paths_give(const float *want, const struct dps_q8_act *a, const struct prob *p)
{
	float *got = malloc(sizeof(float) * (size_t)p->m * (size_t)p->n);

	ck_assert(got);
	for (int path = 0; path < n_paths; path++) {
		run_path(paths[path], got, p->n, a, p->relaid, p->scales, p->n);
		for (int i = 0; i < p->m * p->n; i++)
			ck_assert_msg(isnan(want[i]) ? isnan(got[i])
						     : !memcmp(&got[i], &want[i], sizeof(float)),
				      "path %d, k %d, output %d: %a, oracle %a", paths[path], p->k,
				      i, (double)got[i], (double)want[i]);
	}
	free(got);
}

START_TEST(test_relaid_reads_back)
{
	/* Every stored value, including the subnormal scales 0 and 1 and the NaN scale 255. */
	const int n = 5, k = 576; /* 18 blocks: a whole group and a partial one */
	uint8_t *blocks = malloc(dps_mxfp4_block_bytes(n, k)), *scales = malloc((size_t)n * 18);
	uint8_t *relaid = malloc(dps_mxfp4_block_bytes(n, k));
	float want[576], got[576];
	unsigned seed = 99;

	ck_assert(blocks && scales && relaid);
	for (size_t i = 0; i < dps_mxfp4_block_bytes(n, k); i++)
		blocks[i] = (uint8_t)next(&seed);
	for (int i = 0; i < n * 18; i++)
		scales[i] = (uint8_t)(i < 6 ? (int[]){ 0, 1, 2, 127, 254, 255 }[i] : 100 + i);
	memcpy(relaid, blocks, dps_mxfp4_block_bytes(n, k));
	ck_assert_int_eq(dps_mxfp4_interleave(relaid, (size_t)n, k), 0);
	ck_assert(memcmp(relaid, blocks, dps_mxfp4_block_bytes(n, k))); /* it moved something */
	for (int r = 0; r < n; r++) {
		dps_mxfp4_dequant_row(want, blocks, scales, r, k);
		dps_mxfp4_deinterleave_row(got, relaid, scales, (size_t)r, k);
		for (int c = 0; c < k; c++)
			ck_assert_msg(isnan(want[c]) ? isnan(got[c]) : want[c] == got[c],
				      "row %d column %d: %a, stored %a", r, c, (double)got[c],
				      (double)want[c]);
	}
	free(blocks);
	free(scales);
	free(relaid);
}
END_TEST

START_TEST(test_paths_give_the_order)
{
	const int path = paths[_i];

	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		struct prob p;
		struct dps_q8_act a = { 0 };
		float *got;

		prob_make(&p, shapes[s][0], shapes[s][1], shapes[s][2], 7u + (unsigned)s, 0);
		got = malloc(sizeof(float) * (size_t)p.m * (size_t)p.n);
		ck_assert_int_eq(dps_q8_act_quantize(&a, p.x, p.m, p.k), 0);
		run_path(path, got, p.n, &a, p.relaid, p.scales, p.n);
		for (int i = 0; i < p.m * p.n; i++)
			ck_assert_msg(!memcmp(&got[i], &p.want[i], sizeof(float)),
				      "path %d, m %d n %d k %d, output %d: %a, oracle %a", path, p.m,
				      p.n, p.k, i, (double)got[i], (double)p.want[i]);
		dps_q8_act_free(&a);
		free(got);
		prob_free(&p);
	}
}
END_TEST

START_TEST(test_extreme_scales)
{
	/* The scales 0 and 1 (subnormal powers), 2, 254 (overflow to infinity) and 255 (NaN):
	 * every path gives the oracle's bits, or NaN where it does, and a block with the NaN
	 * scale makes its output NaN. _i 0: three rows of x, k 544 (a partial group); _i 1: one
	 * row, k 1024 (whole groups: the one-row kernel's whole tiles, then a tail of two rows). */
	const int m = _i ? 1 : 3, n = _i ? 18 : 16, k = _i ? 1024 : 544, kb = k / 32;
	struct prob p;
	struct dps_q8_act a = { 0 };
	float *want;
	static const uint8_t ex[] = { 0, 1, 2, 254, 255, 3, 127, 128 };

	prob_make(&p, m, n, k, 41u, 0);
	for (int r = 0; r < p.n; r++)
		for (int b = 0; b < kb; b++)
			p.scales[r * kb + b] = r < 8 && b == r ? ex[r] : r < 8 ? 0 : (uint8_t)(1 + r % 3);
	want = malloc(sizeof(float) * (size_t)p.m * (size_t)p.n);
	ck_assert_int_eq(dps_q8_act_quantize(&a, p.x, p.m, p.k), 0);
	for (int i = 0; i < p.m; i++)
		for (int r = 0; r < p.n; r++)
			want[(size_t)i * p.n + r] = dot_oracle(p.x + (size_t)i * p.k,
							       p.blocks + (size_t)r * kb * 16,
							       p.scales + (size_t)r * kb, p.k, 0);
	for (int i = 0; i < p.m; i++)
		ck_assert(isnan(want[(size_t)i * p.n + 4]));
	paths_give(want, &a, &p);
	dps_q8_act_free(&a);
	free(want);
	prob_free(&p);
}
END_TEST

START_TEST(test_every_scale_byte)
{
	/* Each row of W has one live block (the others' codes are zeros, their scales 127), so
	 * an output is that block's multiplier dx * 2^(e - 128) times its integer sum, rounded
	 * once: every scale byte e 0 .. 255 against blocks of x whose own scales (amax / 127) are
	 * subnormal (amax not under 127 / FLT_MAX, where q8.h makes a block zeros), normal or
	 * near overflow, so that the multipliers underflow, round to subnormals or overflow, and
	 * every path gives the oracle's bits (NaN where it is NaN). _i 0: one row of x, k 1024
	 * (the one-row kernel's whole tiles, then a tail of three); _i 1: three rows, k 544, the
	 * live blocks in the whole group and in the partial one; _i 2: two rows (the two-row
	 * kernel), k 1024. */
	const int m = (int[]){ 1, 3, 2 }[_i], k = _i == 1 ? 544 : 1024, n = 7 * 256 + 3, kb = k / 32;
	static const float mag[] = { 1e-36f, 4e-37f, 5.5e-37f, 1.0f, 3e-20f, 2e29f, 1e34f };
	struct prob p;
	struct dps_q8_act a = { 0 };
	float *want;
	unsigned seed = 23;
	int subnormal = 0, infinite = 0;

	prob_make(&p, m, n, k, 43u, 0);
	for (int i = 0; i < m; i++)
		for (int b = 0; b < kb; b++) {
			/* the block's largest value is +-f, so its own scale is f / 127 */
			const float f = mag[(i * kb + b) % 7];

			for (int j = 0; j < 32; j++)
				p.x[(size_t)i * k + 32 * (size_t)b + (size_t)j] =
					f * (float)((int)(next(&seed) % 255) - 127) / 127.0f;
			p.x[(size_t)i * k + 32 * (size_t)b + (size_t)(b % 32)] = b % 2 ? f : -f;
		}
	for (int r = 0; r < n; r++) {
		/* its magnitude r / 256 (for x's first row), in blocks 0 .. 27, or 0 .. 16 */
		const int live = (r / 256) % 7 + (_i == 1 ? 10 * (r % 2) : 7 * (r % 4));

		for (int b = 0; b < kb; b++) {
			p.scales[r * kb + b] = b == live ? (uint8_t)(r % 256) : 127;
			if (b != live)
				memset(p.blocks + ((size_t)r * kb + (size_t)b) * 16, 0, 16);
		}
	}
	memcpy(p.relaid, p.blocks, dps_mxfp4_block_bytes(n, k));
	ck_assert_int_eq(dps_mxfp4_interleave(p.relaid, (size_t)n, k), 0);
	want = malloc(sizeof(float) * (size_t)m * (size_t)n);
	ck_assert_int_eq(dps_q8_act_quantize(&a, p.x, m, k), 0);
	for (int i = 0; i < m; i++)
		for (int r = 0; r < n; r++) {
			const float w = dot_oracle(p.x + (size_t)i * k, p.blocks + (size_t)r * kb * 16,
						   p.scales + (size_t)r * kb, k, 0);

			want[(size_t)i * n + r] = w;
			subnormal += w != 0 && fabsf(w) < 0x1p-126f;
			infinite += isinf(w) != 0;
		}
	ck_assert_int_gt(subnormal, 20); /* (what the rows are for) */
	ck_assert_int_gt(infinite, 20);
	paths_give(want, &a, &p);
	dps_q8_act_free(&a);
	free(want);
	prob_free(&p);
}
END_TEST

START_TEST(test_row_slices)
{
	/* A slice of rows [lo, hi) gives those columns: the threads' split. _i 0: three rows of
	 * x, k 544; _i 1: one row, k 1024 (slices of 13 rows: whole tiles and tails of one). */
	struct prob p;
	struct dps_q8_act a = { 0 };
	float *got;

	prob_make(&p, _i ? 1 : 3, 50, _i ? 1024 : 544, 5u, 0);
	got = calloc((size_t)p.m * (size_t)p.n, sizeof(float));
	ck_assert_int_eq(dps_q8_act_quantize(&a, p.x, p.m, p.k), 0);
	for (int lo = 0; lo < p.n; lo += 13) {
		const int hi = lo + 13 < p.n ? lo + 13 : p.n;

		for (int path = 0; path < n_paths; path++) {
			run_path(paths[path], got + lo, p.n, &a,
				 p.relaid + dps_mxfp4_block_bytes(lo, p.k),
				 p.scales + dps_mxfp4_scale_bytes(lo, p.k), hi - lo);
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
	/* dps_linear_mxfp4_q8 over _i + 1 threads: every row of a batch of 129 as it is alone. */
	struct prob p;
	float *got, one[300];
	char msg[256];

	ck_assert_int_eq(dps_gemm_setup("auto", _i + 1, msg, sizeof(msg)), 0);
	prob_make(&p, 129, 300, 288, 3u, 0);
	got = malloc(sizeof(float) * (size_t)p.m * (size_t)p.n);
	dps_linear_mxfp4_q8(got, p.x, p.relaid, p.scales, p.m, p.n, p.k);
	for (int i = 0; i < p.m; i++) {
		ck_assert(!memcmp(got + (size_t)i * p.n, p.want + (size_t)i * p.n,
				  sizeof(float) * (size_t)p.n));
		dps_linear_mxfp4_q8(one, p.x + (size_t)i * p.k, p.relaid, p.scales, 1, p.n, p.k);
		ck_assert(!memcmp(one, p.want + (size_t)i * p.n, sizeof(float) * (size_t)p.n));
	}
	free(got);
	prob_free(&p);
}
END_TEST

START_TEST(test_close_to_exact)
{
	/* Within the activations' quantization error (half a step of amax / 127 per value) of the
	 * exact product of the stored weights. */
	struct prob p;
	float *got, *exact, wrow[2880];

	prob_make(&p, 3, 40, 2880, 17u, 0);
	got = malloc(sizeof(float) * (size_t)p.m * (size_t)p.n);
	exact = malloc(sizeof(float) * (size_t)p.m * (size_t)p.n);
	dps_linear_mxfp4_q8(got, p.x, p.relaid, p.scales, p.m, p.n, p.k);
	dps_linear_mxfp4_ref(exact, p.x, p.blocks, p.scales, p.m, p.n, p.k);
	for (int r = 0; r < p.n; r++) {
		dps_mxfp4_dequant_row(wrow, p.blocks, p.scales, r, p.k);
		for (int i = 0; i < p.m; i++) {
			const float *x = p.x + (size_t)i * p.k;
			double bound = 0;

			for (int b = 0; b < p.k / 32; b++) {
				float amax = 0;

				for (int j = 0; j < 32; j++)
					amax = fmaxf(amax, fabsf(x[32 * b + j]));
				for (int j = 0; j < 32; j++)
					bound += 0.5 * amax / 127 * fabs(wrow[32 * b + j]);
			}
			ck_assert_msg(fabs(got[(size_t)i * p.n + r] - exact[(size_t)i * p.n + r]) <=
					      bound * 1.01 + 1e-6,
				      "%g vs %g (bound %g)", (double)got[(size_t)i * p.n + r],
				      (double)exact[(size_t)i * p.n + r], bound);
		}
	}
	free(got);
	free(exact);
	prob_free(&p);
}
END_TEST

START_TEST(test_wrong_orders_are_caught)
{
	for (int variant = 1; variant <= 2; variant++) {
		struct prob p;
		struct dps_q8_act a = { 0 };
		float *got;
		int differ = 0;

		prob_make(&p, 3, 40, 800, 23u, variant);
		got = malloc(sizeof(float) * (size_t)p.m * (size_t)p.n);
		ck_assert_int_eq(dps_q8_act_quantize(&a, p.x, p.m, p.k), 0);
		dps_gemm_mxfp4q8_ref(got, p.n, &a, p.relaid, p.scales, p.n);
		for (int i = 0; i < p.m * p.n; i++)
			differ += !!memcmp(&got[i], &p.want[i], sizeof(float));
		ck_assert_msg(differ > p.m * p.n / 4, "variant %d: only %d of %d outputs differ",
			      variant, differ, p.m * p.n);
		dps_q8_act_free(&a);
		free(got);
		prob_free(&p);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("mxfp4q8");
	TCase *tc = tcase_create("mxfp4q8");
	SRunner *sr;
	int failed;

	__builtin_cpu_init();
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_relaid_reads_back);
	paths[n_paths++] = PATH_REF;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	    __builtin_cpu_supports("f16c"))
		paths[n_paths++] = PATH_AVX2;
	else
		printf("skipped: dps_gemm_mxfp4q8_avx2 needs AVX2, FMA and F16C, which this CPU lacks\n");
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
	    __builtin_cpu_supports("avx512vbmi"))
		paths[n_paths++] = PATH_AVX512;
	else
		printf("skipped: dps_gemm_mxfp4q8_avx512 needs AVX-512 BW, VL, VNNI and VBMI, which this CPU lacks\n");
	tcase_add_loop_test(tc, test_paths_give_the_order, 0, n_paths);
	tcase_add_loop_test(tc, test_extreme_scales, 0, 2);
	tcase_add_loop_test(tc, test_every_scale_byte, 0, 3);
	tcase_add_loop_test(tc, test_row_slices, 0, 2);
	tcase_add_loop_test(tc, test_linear_threads_and_batches, 0, 3);
	tcase_add_test(tc, test_close_to_exact);
	tcase_add_test(tc, test_wrong_orders_are_caught);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
