/* SPDX-License-Identifier: MIT */
/*
 * tests/check_gemm.c - the linear product: dpshard's batch-invariant kernel (each fast path
 * against its plain-C twin bit for bit, the twin against a double-precision sum, a row in any
 * batch against the row alone, and a different order caught), and every BLIS set this CPU can
 * run against the twin within rounding (each test runs in its own process, as the choice is
 * made once per process); and the refusal of a bad --blis-arch value.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/gemm.h"
#include "kernels/gemm_int.h"
#include "kernels/kernels.h"

static const char *const specs[] = { "auto", "skx", "zen3", "haswell", "generic", "skx:zen3" };

static float frand(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* The kernel sets this CPU and this BLIS can run (main probes each in a child process). */
static int runnable[sizeof(specs) / sizeof(specs[0])], n_runnable;

START_TEST(test_refused_sets_say_why)
{
	/* A set this CPU or this BLIS lacks is refused, with a reason. */
	char msg[256];

	for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
		int ok = 0;

		for (int j = 0; j < n_runnable; j++)
			ok |= runnable[j] == (int)i;
		if (ok)
			continue;
		msg[0] = '\0';
		ck_assert_int_ne(dps_gemm_setup(specs[i], 1, msg, sizeof(msg)), 0);
		ck_assert_msg(strstr(msg, "cannot run") || strstr(msg, "not built"), "%s", msg);
	}
}
END_TEST

START_TEST(test_linear)
{
	static const int shapes[][3] = { { 1, 2048, 768 }, { 8, 100, 64 }, { 47, 96, 33 },
					 { 48, 96, 33 }, { 64, 300, 50 }, { 200, 64, 96 },
					 { 128, 131, 2049 }, { 129, 67, 40 }, { 6, 5, 17 },
					 { 3, 1, 5 } };
	char msg[256];
	int rc = dps_gemm_setup(specs[runnable[_i]], 1 + _i % 2, msg, sizeof(msg));

	ck_assert_msg(rc == 0, "%s: %s", specs[runnable[_i]], msg);
	ck_assert_ptr_nonnull(strstr(dps_gemm_describe(), "kernels"));
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
		float *x = malloc(sizeof(float) * (size_t)m * k), *w = malloc(sizeof(float) * (size_t)n * k);
		float *got = malloc(sizeof(float) * (size_t)m * n), *ref = malloc(sizeof(float) * (size_t)m * n);
		unsigned seed = 42;

		for (int i = 0; i < m * k; i++)
			x[i] = frand(&seed);
		for (int i = 0; i < n * k; i++)
			w[i] = frand(&seed);
		dps_linear_f32(got, x, w, m, n, k);
		dps_linear_f32_ref(ref, x, w, m, n, k);
		if (!strcmp(specs[runnable[_i]], "auto"))
			ck_assert_msg(!memcmp(got, ref, sizeof(float) * (size_t)m * n),
				      "auto m=%d n=%d k=%d: not the twin's bits", m, n, k);
		for (int i = 0; i < m * n; i++)
			ck_assert_msg(fabsf(got[i] - ref[i]) <= 1e-5f * (float)k,
				      "%s m=%d n=%d k=%d [%d]: %g vs %g", specs[runnable[_i]], m, n,
				      k, i,
				      (double)got[i], (double)ref[i]);
		free(x);
		free(w);
		free(got);
		free(ref);
	}
}
END_TEST

/* The fast paths of dpshard's kernel this CPU runs (main fills them in). */
typedef void gemm_fn(float *restrict out, int ldo, const float *restrict x,
		     const float *restrict W, int m, int n, int k);
static gemm_fn *own_paths[2];
static const char *own_names[2];
static int n_own;

static float *rand_floats(size_t n, unsigned seed)
{
	float *v = malloc(sizeof(float) * (n ? n : 1));

	for (size_t i = 0; i < n; i++)
		v[i] = frand(&seed);
	return v;
}

START_TEST(test_twin_bits)
{
	/*
	 * Every m mod 4 and mod 3, n mod 4, k mod 16, both forms (dot product and tile), both
	 * sides of the x and W blocks, with a row
	 * stride wider than n: the fast path gives the plain-C twin's bits, and the twin is within
	 * rounding of a double-precision sum (an oracle that shares none of its order).
	 */
	static const int shapes[][3] = { { 1, 1, 1 },	  { 2, 5, 17 },	  { 3, 6, 31 },
					 { 4, 7, 64 },	  { 5, 9, 100 },  { 8, 13, 768 },
					 { 9, 64, 33 },	  { 13, 3, 8 },	  { 40, 70, 2880 },
					 { 130, 11, 200 }, { 7, 5, 0 },
					 /* one row of x: W in one pass, k past a chunk with a tail */
					 { 1, 9, 2063 },   { 1, 70, 771 },
					 /* the tile form (GEMM_TILE_M_MIN on): partial tiles, k with
					  * and without a tail, several blocks of W (k = 2880) */
					 { 48, 16, 16 },   { 61, 33, 47 }, { 97, 37, 64 },
					 { 50, 70, 2880 }, { 203, 100, 771 } };
	gemm_fn *const fn = own_paths[_i];

	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], ldo = n + 3;
		float *x = rand_floats((size_t)m * k, 9), *w = rand_floats((size_t)n * k, 10);
		float *got = calloc((size_t)m * ldo, sizeof(float));
		float *ref = calloc((size_t)m * ldo, sizeof(float));

		fn(got, ldo, x, w, m, n, k);
		dps_gemm_f32_ref(ref, ldo, x, w, m, n, k);
		ck_assert_msg(!memcmp(got, ref, sizeof(float) * (size_t)m * ldo), "%s m=%d n=%d k=%d",
			      own_names[_i], m, n, k);
		for (int i = 0; i < m; i++)
			for (int r = 0; r < n; r++) {
				double want = 0.0, mag = 0.0;

				for (int c = 0; c < k; c++) {
					want += (double)x[(size_t)i * k + c] * w[(size_t)r * k + c];
					mag += fabs((double)x[(size_t)i * k + c] * w[(size_t)r * k + c]);
				}
				ck_assert_msg(fabs(ref[(size_t)i * ldo + r] - want) <= 1e-6 * mag + 1e-30,
					      "ref m=%d n=%d k=%d [%d,%d]: %g vs %g", m, n, k, i, r,
					      (double)ref[(size_t)i * ldo + r], want);
			}
		free(x);
		free(w);
		free(got);
		free(ref);
	}
}
END_TEST

START_TEST(test_other_order_is_caught)
{
	/*
	 * The check can fail: the plain sequential sum (dps_matvec_ref), a different order of the
	 * same products, differs from the twin's bits somewhere on a 64 x 771 product.
	 */
	enum { N = 64, K = 771 };
	float *x = rand_floats(K, 11), *w = rand_floats((size_t)N * K, 12), seq[N], ref[N];
	int differ = 0;

	dps_matvec_ref(seq, x, w, N, K);
	dps_gemm_f32_ref(ref, N, x, w, 1, N, K);
	for (int r = 0; r < N; r++) {
		ck_assert(fabsf(seq[r] - ref[r]) <= 1e-4f * K); /* same value within rounding */
		differ += memcmp(&seq[r], &ref[r], sizeof(float)) != 0;
	}
	ck_assert_msg(differ > 0, "the sequential sum gave the twin's bits on all %d outputs", N);
	free(x);
	free(w);
}
END_TEST

START_TEST(test_signed_zero_tail)
{
	/*
	 * Lanes past k keep their sums (gemm.h): with every product an underflowing -0, every lane
	 * sum is -0 and so is the output, on every path and both forms; an FMA of zeros in the
	 * tail lanes (as the masked loads once did) would make it +0. k = 17: one lane of two
	 * terms, fifteen of one.
	 */
	enum { M = 64, N = 40, K = 17 };
	float *x = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K);
	float *got = malloc(sizeof(float) * M * N);

	for (int i = 0; i < M * K; i++)
		x[i] = -0x1p-80f;
	for (int i = 0; i < N * K; i++)
		w[i] = 0x1p-80f;
	dps_gemm_f32_ref(got, N, x, w, M, N, K);
	for (int e = 0; e < M * N; e++)
		ck_assert_msg(got[e] == 0.0f && signbit(got[e]), "ref [%d]: %a", e, (double)got[e]);
	for (int p = 0; p < n_own; p++)
		for (int m = 1; m <= M; m += M - 1) {
			memset(got, 0, sizeof(float) * M * N);
			own_paths[p](got, N, x, w, m, N, K);
			for (int e = 0; e < m * N; e++)
				ck_assert_msg(got[e] == 0.0f && signbit(got[e]), "%s m=%d [%d]: %a",
					      own_names[p], m, e, (double)got[e]);
		}
	free(x);
	free(w);
	free(got);
}
END_TEST

START_TEST(test_batch_invariant)
{
	/*
	 * Under auto, each row of an m-row product has the bits of the same row computed alone and
	 * of the plain-C twin, for m on both sides of every size the kernels ever switched at (47,
	 * 128, GEMM_TILE_M_MIN), any number of threads, and a row moved to another place in the
	 * batch.
	 */
	static const int ms[] = { 1, 2, GEMM_TILE_M_MIN - 1, GEMM_TILE_M_MIN, 127, 128, 129, 256, 300 };
	enum { N = 203, K = 771, M = 300 };
	float *x = rand_floats((size_t)M * K, 13), *w = rand_floats((size_t)N * K, 14);
	float *ref = malloc(sizeof(float) * M * N), *all = malloc(sizeof(float) * M * N);
	float *moved = malloc(sizeof(float) * M * K), one[N];
	char msg[256];

	dps_gemm_f32_ref(ref, N, x, w, M, N, K);
	ck_assert_int_eq(dps_gemm_setup("auto", 1, msg, sizeof(msg)), 0);
	ck_assert_ptr_nonnull(strstr(msg, "batch-invariant"));
	for (int i = 0; i < M; i += 7) {
		dps_linear_f32(one, x + (size_t)i * K, w, 1, N, K);
		ck_assert_msg(!memcmp(one, ref + (size_t)i * N, sizeof(one)), "row %d alone", i);
	}
	for (int t = 1; t <= 4; t++) {
		ck_assert_int_eq(dps_gemm_setup("auto", t, msg, sizeof(msg)), 0);
		for (size_t im = 0; im < sizeof(ms) / sizeof(ms[0]); im++) {
			const int m = ms[im];

			dps_linear_f32(all, x, w, m, N, K);
			for (int i = 0; i < m; i++)
				ck_assert_msg(!memcmp(all + (size_t)i * N, ref + (size_t)i * N,
						      sizeof(float) * N),
					      "m=%d, %d threads: row %d", m, t, i);
		}
	}
	/* Row 5 at the last place of a 129-row batch of other rows. */
	memcpy(moved, x + (size_t)6 * K, sizeof(float) * 128 * K);
	memcpy(moved + (size_t)128 * K, x + (size_t)5 * K, sizeof(float) * K);
	dps_linear_f32(all, moved, w, 129, N, K);
	ck_assert(!memcmp(all + (size_t)128 * N, ref + (size_t)5 * N, sizeof(float) * N));
	free(x);
	free(w);
	free(ref);
	free(all);
	free(moved);
}
END_TEST

START_TEST(test_bad_spec)
{
	char msg[256];

	ck_assert_int_eq(dps_gemm_setup("sandwich", 1, msg, sizeof(msg)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(msg, "--blis-arch sandwich"));
	ck_assert_int_eq(dps_gemm_setup("skx:nope", 1, msg, sizeof(msg)), -EINVAL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("gemm");
	TCase *tc = tcase_create("gemm");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 60);
	/* Probe each set in a child (the choice is made once per process); a set that cannot run
	 * here is not registered (so not counted as a pass) but checked for its reason. */
	for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
		char msg[256];
		int st = 0;
		pid_t pid = fork();

		if (pid == 0)
			_exit(dps_gemm_setup(specs[i], 1, msg, sizeof(msg)) ? 1 : 0);
		if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && !WEXITSTATUS(st))
			runnable[n_runnable++] = (int)i;
		else
			printf("skipped: test_linear with --blis-arch %s, which this machine cannot run\n",
			       specs[i]);
	}
	tcase_add_loop_test(tc, test_linear, 0, n_runnable);
	tcase_add_test(tc, test_refused_sets_say_why);
	tcase_add_test(tc, test_bad_spec);
	tcase_add_test(tc, test_other_order_is_caught);
	tcase_add_test(tc, test_batch_invariant);
	/* A path this CPU cannot run is not registered (so not counted as a pass). */
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f")) {
		own_paths[n_own] = dps_gemm_f32_avx512;
		own_names[n_own++] = "dps_gemm_f32_avx512";
	} else {
		printf("skipped: test_twin_bits of dps_gemm_f32_avx512 needs AVX-512F, which this "
		       "CPU lacks\n");
	}
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
		own_paths[n_own] = dps_gemm_f32_avx2;
		own_names[n_own++] = "dps_gemm_f32_avx2";
	} else {
		printf("skipped: test_twin_bits of dps_gemm_f32_avx2 needs AVX2 and FMA, which this "
		       "CPU lacks\n");
	}
	tcase_add_loop_test(tc, test_twin_bits, 0, n_own);
	tcase_add_test(tc, test_signed_zero_tail);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_FORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
