/* SPDX-License-Identifier: MIT */
/*
 * tests/check_mxfp4.c - the MXFP4 products (kernels/mxfp4.c). The decoding against a table
 * built here from the OCP Microscaling spec's definitions (E2M1: sign bit 3, exponent bits
 * 2..1 with bias 1 and a subnormal at exponent 0, mantissa bit 0; E8M0: 2^(e - 127), 255 NaN),
 * for every code and the extreme scales; the reference product against dequantization and the
 * f32 reference; the fast product, by each path this CPU can run, against the reference on
 * decode and prefill shapes with one and several pool threads, its results independent of the
 * thread count and, below the large-m path, of the other rows of the batch; and a flipped
 * nibble caught by the same comparison.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil.h"
#include "tests/oracle.h"
#include "kernels/gemm.h"
#include "kernels/mxfp4.h"

typedef void (*product_fn)(float *, const float *, const uint8_t *, const uint8_t *, int, int,
			   int);

/* E2M1 as the spec defines it, in double. */
static double spec_e2m1(int code)
{
	const int sign = code >> 3 & 1, exp = code >> 1 & 3, man = code & 1;
	const double mag = exp ? ldexp(1.0 + man / 2.0, exp - 1) : man / 2.0;

	return sign ? -mag : mag;
}

/* E8M0 as the spec defines it. */
static double spec_e8m0(int e)
{
	return e == 255 ? NAN : ldexp(1.0, e - 127);
}

/* An MXFP4 matrix of (n, k): random codes, scales in [lo, hi]. */
struct mat {
	int n, k;
	uint8_t *blocks, *scales;
};

static struct mat mat_make(int n, int k, uint32_t salt, int lo, int hi)
{
	struct mat w = { n, k, malloc(dps_mxfp4_block_bytes(n, k) + 1),
			 malloc(dps_mxfp4_scale_bytes(n, k) + 1) };

	ck_assert(w.blocks && w.scales);
	for (size_t i = 0; i < dps_mxfp4_block_bytes(n, k); i++)
		w.blocks[i] = (uint8_t)oracle_hash(1, (uint32_t)i, salt);
	for (size_t i = 0; i < dps_mxfp4_scale_bytes(n, k); i++)
		w.scales[i] = (uint8_t)(lo + (int)(oracle_hash(2, (uint32_t)i, salt) %
						   (uint32_t)(hi - lo + 1)));
	return w;
}

static void mat_free(struct mat *w)
{
	free(w->blocks);
	free(w->scales);
}

static float *floats(size_t n, uint32_t salt)
{
	float *x = malloc(sizeof(float) * (n ? n : 1));

	ck_assert_ptr_nonnull(x);
	for (size_t i = 0; i < n; i++)
		x[i] = oracle_f32(3, (uint32_t)i, salt);
	return x;
}

START_TEST(test_values)
{
	for (int c = 0; c < 16; c++) {
		ck_assert_msg((double)dps_mxfp4_values[c] == spec_e2m1(c), "code %d: %g", c,
			      (double)dps_mxfp4_values[c]);
		ck_assert_int_eq(!!signbit(dps_mxfp4_values[c]), c >= 8);
	}
}
END_TEST

START_TEST(test_dequant_row)
{
	/* Every code in every block (rotated by the block's index), on the second of two rows. */
	static const int scales[] = { 0, 1, 2, 100, 126, 127, 128, 200, 252, 253, 254, 255 };
	enum { NB = sizeof(scales) / sizeof(scales[0]), K = 32 * NB };
	uint8_t blocks[2 * NB * 16], sc[2 * NB];
	float row[K];

	memset(blocks, 0xff, sizeof(blocks));
	memset(sc, 127, sizeof(sc));
	for (int b = 0; b < NB; b++) {
		for (int i = 0; i < 16; i++)
			blocks[(NB + b) * 16 + i] =
				(uint8_t)((2 * i + b) % 16 | ((2 * i + 1 + b) % 16) << 4);
		sc[NB + b] = (uint8_t)scales[b];
	}
	dps_mxfp4_dequant_row(row, blocks, sc, 1, K);
	for (int c = 0; c < K; c++) {
		const int b = c / 32, code = (c % 32 + b) % 16, e = scales[b];
		const double want = spec_e2m1(code) * spec_e8m0(e);
		const double got = row[c];

		if (e == 255)
			ck_assert_msg(isnan(got), "e=255 code %d: %g", code, got);
		else if (fabs(want) > FLT_MAX) /* 3 .. 6 times 2^127: the f32 rounds to inf */
			ck_assert_msg(isinf(got) && (got < 0) == (want < 0), "e=%d code %d: %g", e,
				      code, got);
		else
			ck_assert_msg(got == want && !!signbit(got) == !!signbit(want),
				      "e=%d code %d: %a, want %a", e, code, got, want);
	}
	/* Row 0 is all code 15 at scale 127. */
	dps_mxfp4_dequant_row(row, blocks, sc, 0, K);
	for (int c = 0; c < K; c++)
		ck_assert(row[c] == -6.0f);
}
END_TEST

/* The exact product in double, and the sum of |x w| that sets the tolerance. */
static void oracle(double *want, double *mag, const float *x, const struct mat *w, int m)
{
	float *row = malloc(sizeof(float) * (size_t)(w->k ? w->k : 1));

	ck_assert_ptr_nonnull(row);
	for (int r = 0; r < w->n; r++) {
		dps_mxfp4_dequant_row(row, w->blocks, w->scales, r, w->k);
		for (int i = 0; i < m; i++) {
			double s = 0, a = 0;

			for (int c = 0; c < w->k; c++) {
				s += (double)x[(size_t)i * w->k + c] * row[c];
				a += fabs((double)x[(size_t)i * w->k + c] * row[c]);
			}
			want[(size_t)i * w->n + r] = s;
			mag[(size_t)i * w->n + r] = a;
		}
	}
	free(row);
}

/*
 * How many of the count results are off by more than tol times the sum of |x w| of their
 * output (f32 rounding in any order stays far inside for random signs); the first is *bad.
 */
static int count_off(const float *got, const double *want, const double *mag, int count,
		     double tol, int *bad)
{
	int off = 0;

	for (int e = 0; e < count; e++)
		if (!(fabs((double)got[e] - want[e]) <= tol * mag[e])) {
			if (!off++)
				*bad = e;
		}
	return off;
}

START_TEST(test_ref_vs_dequant)
{
	/*
	 * The reference equals dequantization followed by the f32 reference product, within 1e-6
	 * of the sum of |x w| (the same sums in the same order: equal, unless the compiler fuses
	 * one side's multiply-adds).
	 */
	static const int shapes[][3] = { { 1, 1, 32 }, { 3, 5, 64 }, { 7, 100, 2880 },
					 { 16, 64, 96 } };

	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
		struct mat w = mat_make(n, k, 10 + (uint32_t)s, 110, 140);
		float *x = floats((size_t)m * k, 11), *wf = malloc(sizeof(float) * (size_t)n * k);
		float *a = malloc(sizeof(float) * (size_t)m * n), *b = malloc(sizeof(float) * (size_t)m * n);
		double *want = malloc(sizeof(double) * (size_t)m * n);
		double *mag = malloc(sizeof(double) * (size_t)m * n);

		oracle(want, mag, x, &w, m);
		for (int r = 0; r < n; r++)
			dps_mxfp4_dequant_row(wf + (size_t)r * k, w.blocks, w.scales, r, k);
		dps_linear_mxfp4_ref(a, x, w.blocks, w.scales, m, n, k);
		dps_linear_f32_ref(b, x, wf, m, n, k);
		/* The same order (gemm.h) on the same exact weights: the same bits. */
		for (int e = 0; e < m * n; e++)
			ck_assert_msg(!memcmp(&a[e], &b[e], sizeof(float)),
				      "m=%d n=%d k=%d [%d]: %a vs %a", m, n, k, e, (double)a[e],
				      (double)b[e]);
		mat_free(&w);
		free(x);
		free(wf);
		free(a);
		free(b);
		free(want);
		free(mag);
	}
}
END_TEST

/* The paths under test: the dispatcher, then each half the CPU runs (main fills the rest). */
static product_fn paths[3] = { dps_linear_mxfp4 };
static const char *path_names[3] = { "dps_linear_mxfp4" };
static int n_paths = 1;

static const int ms[] = { 1, 2, 3, 7, 16, 33, 70 }; /* 70: dequantized panels and sgemm */
static const int ns[] = { 1, 5, 64, 100 };
static const int ks[] = { 32, 64, 2880 };
#define NK (int)(sizeof(ks) / sizeof(ks[0]))

START_TEST(test_fast_vs_ref)
{
	/* One k per test; every m and n, with one and three threads, bit-identical between them. */
	const product_fn fn = paths[_i / NK];
	const char *name = path_names[_i / NK];
	const int k = ks[_i % NK];
	char msg[256];

	for (size_t in = 0; in < sizeof(ns) / sizeof(ns[0]); in++)
		for (size_t im = 0; im < sizeof(ms) / sizeof(ms[0]); im++) {
			const int m = ms[im], n = ns[in];
			const size_t mn = (size_t)m * n;
			struct mat w = mat_make(n, k, 20 + (uint32_t)(in * 8 + im), 112, 136);
			float *x = floats((size_t)m * k, 21 + (uint32_t)im);
			float *ref = malloc(sizeof(float) * mn), *one = malloc(sizeof(float) * mn);
			float *got = malloc(sizeof(float) * mn);
			double *want = malloc(sizeof(double) * mn), *mag = malloc(sizeof(double) * mn);
			int bad = 0, off;

			oracle(want, mag, x, &w, m);
			dps_linear_mxfp4_ref(ref, x, w.blocks, w.scales, m, n, k);
			off = count_off(ref, want, mag, (int)mn, 1e-5, &bad);
			ck_assert_msg(!off, "ref m=%d n=%d k=%d: %d off, [%d] %g vs %g", m, n, k, off,
				      bad, (double)ref[bad], want[bad]);
			for (int t = 1; t <= 3; t += 2) {
				float *out = t == 1 ? one : got;

				ck_assert_int_eq(dps_gemm_setup("auto", t, msg, sizeof(msg)), 0);
				fn(out, x, w.blocks, w.scales, m, n, k);
				off = count_off(out, want, mag, (int)mn, 1e-5, &bad);
				ck_assert_msg(!off, "%s m=%d n=%d k=%d, %d threads: %d off, [%d] %g vs %g (ref %g)",
					      name, m, n, k, t, off, bad, (double)out[bad], want[bad],
					      (double)ref[bad]);
	/* Every path sums in the reference's order: its bits. */
				for (size_t e = 0; e < mn; e++)
					ck_assert_msg(!memcmp(&out[e], &ref[e], sizeof(float)),
						      "%s m=%d n=%d k=%d, %d threads: [%zu] %a, ref %a",
						      name, m, n, k, t, e, (double)out[e], (double)ref[e]);
			}
			ck_assert_msg(!memcmp(one, got, sizeof(float) * mn),
				      "%s m=%d n=%d k=%d: 1 and 3 threads differ", name, m, n, k);
			mat_free(&w);
			free(x);
			free(ref);
			free(one);
			free(got);
			free(want);
			free(mag);
		}
}
END_TEST

START_TEST(test_batch_invariant)
{
	/*
	 * On both sides of the large-m path (m = 63 and 127 around BIG_M = 64), each row's outputs
	 * are those of that row alone, bit for bit.
	 */
	enum { N = 37, K = 320, M = 127 };
	const product_fn fn = paths[_i];
	struct mat w = mat_make(N, K, 30, 100, 150);
	float *x = floats((size_t)M * K, 31), *all = malloc(sizeof(float) * M * N), one[N];
	char msg[256];

	ck_assert_int_eq(dps_gemm_setup("auto", 2, msg, sizeof(msg)), 0);
	for (int m = 1; m <= M; m = m * 2 + 1) {
		fn(all, x, w.blocks, w.scales, m, N, K);
		for (int i = 0; i < m; i++) {
			fn(one, x + (size_t)i * K, w.blocks, w.scales, 1, N, K);
			ck_assert_msg(!memcmp(one, all + (size_t)i * N, sizeof(one)), "%s m=%d row %d",
				      path_names[_i], m, i);
		}
	}
	mat_free(&w);
	free(x);
	free(all);
}
END_TEST

START_TEST(test_decode_exact)
{
	/*
	 * x = the identity picks each weight out alone, so the products show the decoded values
	 * bit for bit (zeros and sums of zeros are exact): every code at the extreme scales,
	 * subnormals included (the blocks of scale 253 and 254 keep to the codes that stay
	 * finite), by each regime: one row of x at a time, 3 and 33 rows, and all K (large m).
	 */
	static const uint8_t scales[] = { 0, 1, 2, 126, 127, 128, 252, 253, 254 };
	enum { NB = sizeof(scales) / sizeof(scales[0]), K = 32 * NB, N = 7 };
	static const int groups[] = { 1, 3, 33, K };
	const product_fn fn = paths[_i];
	struct mat w = mat_make(N, K, 60, 127, 127);
	float *x = calloc((size_t)K * K, sizeof(float)), *out = malloc(sizeof(float) * K * N);
	float row[K];

	for (int r = 0; r < N; r++)
		for (int b = 0; b < NB; b++) {
			w.scales[r * NB + b] = scales[b];
			if (scales[b] >= 253)
				for (int i = 0; i < 16; i++)
					w.blocks[(r * NB + b) * 16 + i] &= 0xbb; /* |code| <= 1.5 */
		}
	for (int i = 0; i < K; i++)
		x[(size_t)i * K + i] = 1.0f;
	for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++) {
		for (int i = 0; i < K; i += groups[g]) {
			const int m = K - i < groups[g] ? K - i : groups[g];

			fn(out + (size_t)i * N, x + (size_t)i * K, w.blocks, w.scales, m, N, K);
		}
		for (int r = 0; r < N; r++) {
			dps_mxfp4_dequant_row(row, w.blocks, w.scales, r, K);
			for (int c = 0; c < K; c++)
				ck_assert_msg(out[(size_t)c * N + r] == row[c], "%s, %d rows at a time: "
					      "row %d col %d (scale %d): %a, want %a", path_names[_i],
					      groups[g], r, c, scales[c / 32], (double)out[(size_t)c * N + r],
					      (double)row[c]);
		}
	}
	mat_free(&w);
	free(x);
	free(out);
}
END_TEST

START_TEST(test_flipped_nibble_is_caught)
{
	/*
	 * The comparison above fails when one weight is wrong: bit 2 of one code flipped (its
	 * magnitude moves by at least 2) in a block of scale 1, against x = 1 there.
	 */
	enum { M = 2, N = 5, K = 64 };
	const product_fn fn = paths[_i];
	struct mat w = mat_make(N, K, 40, 120, 134);
	float *x = floats((size_t)M * K, 41), got[M * N];
	double want[M * N], mag[M * N];
	const int r = 3, c = 45; /* row 3, block 1, byte 6, high nibble */
	int bad = -1;

	for (int i = 0; i < M; i++)
		x[i * K + c] = 1.0f;
	w.scales[r * (K / 32) + c / 32] = 127;
	oracle(want, mag, x, &w, M);
	fn(got, x, w.blocks, w.scales, M, N, K);
	ck_assert_int_eq(count_off(got, want, mag, M * N, 1e-5, &bad), 0);
	w.blocks[(r * (K / 32) + c / 32) * 16 + (c % 32) / 2] ^= 0x40;
	fn(got, x, w.blocks, w.scales, M, N, K);
	ck_assert_int_eq(count_off(got, want, mag, M * N, 1e-5, &bad), M);
	ck_assert_int_eq(bad, r);
	mat_free(&w);
	free(x);
}
END_TEST

START_TEST(test_empty_and_nan_scale)
{
	/* m = 0 writes nothing; a block of scale 255 (NaN) makes its outputs NaN, as the
	 * reference does. */
	enum { N = 4, K = 64 };
	const product_fn fn = paths[_i];
	struct mat w = mat_make(N, K, 50, 120, 134);
	float *x = floats(K, 51), got[N] = { 7, 7, 7, 7 }, ref[N];

	fn(got, x, w.blocks, w.scales, 0, N, K);
	ck_assert(got[0] == 7 && got[3] == 7);
	w.scales[2 * (K / 32) + 1] = 255;
	fn(got, x, w.blocks, w.scales, 1, N, K);
	dps_linear_mxfp4_ref(ref, x, w.blocks, w.scales, 1, N, K);
	for (int r = 0; r < N; r++)
		ck_assert_msg(r == 2 ? isnan(got[r]) && isnan(ref[r])
				     : !isnan(got[r]) && fabsf(got[r] - ref[r]) < 1e-3f,
			      "row %d: %g vs %g", r, (double)got[r], (double)ref[r]);
	mat_free(&w);
	free(x);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("mxfp4");
	TCase *tc = tcase_create("mxfp4");

	tcase_set_timeout(tc, 300);
	/* A half the CPU cannot run is not registered (so not counted as a pass). */
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
		paths[n_paths] = dps_linear_mxfp4_avx2;
		path_names[n_paths++] = "dps_linear_mxfp4_avx2";
	} else {
		printf("skipped: the tests of dps_linear_mxfp4_avx2 need AVX2 and FMA, which this "
		       "CPU lacks\n");
	}
	if (__builtin_cpu_supports("avx512f")) {
		paths[n_paths] = dps_linear_mxfp4_avx512;
		path_names[n_paths++] = "dps_linear_mxfp4_avx512";
	} else {
		printf("skipped: the tests of dps_linear_mxfp4_avx512 need AVX-512F, which this CPU "
		       "lacks\n");
	}
	tcase_add_test(tc, test_values);
	tcase_add_test(tc, test_dequant_row);
	tcase_add_test(tc, test_ref_vs_dequant);
	tcase_add_loop_test(tc, test_fast_vs_ref, 0, n_paths * NK);
	tcase_add_loop_test(tc, test_batch_invariant, 0, n_paths);
	tcase_add_loop_test(tc, test_decode_exact, 0, n_paths);
	tcase_add_loop_test(tc, test_flipped_nibble_is_caught, 0, n_paths);
	tcase_add_loop_test(tc, test_empty_and_nan_scale, 0, n_paths);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
