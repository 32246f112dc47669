/* SPDX-License-Identifier: MIT */
/*
 * tests/check_gemm.c - the BLIS-backed linear product against its plain-C twin, for every
 * kernel set this CPU can run (each test runs in its own process, as the choice is made once
 * per process), on decode shapes (m = 1..64, both sides of the small-m switch) and prefill
 * shapes; and the refusal of a bad --blis-arch value.
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

START_TEST(test_gemm_small_avx512)
{
	/* Every m mod 4, n mod 4 and k mod 16, with a row stride wider than n: the twin's sums. */
	static const int shapes[][3] = { { 1, 1, 1 }, { 2, 5, 17 }, { 3, 6, 31 }, { 4, 7, 64 },
					 { 5, 9, 100 }, { 8, 13, 768 }, { 9, 64, 33 } };

	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], ldo = n + 3;
		float *x = malloc(sizeof(float) * (size_t)m * k), *w = malloc(sizeof(float) * (size_t)n * k);
		float *got = calloc((size_t)m * ldo, sizeof(float));
		float *ref = calloc((size_t)m * ldo, sizeof(float));
		unsigned seed = 9;

		for (int i = 0; i < m * k; i++)
			x[i] = frand(&seed);
		for (int i = 0; i < n * k; i++)
			w[i] = frand(&seed);
		dps_gemm_small_f32_avx512(got, ldo, x, w, m, n, k);
		dps_gemm_small_f32_ref(ref, ldo, x, w, m, n, k);
		for (int i = 0; i < m * ldo; i++)
			ck_assert_msg(fabsf(got[i] - ref[i]) <= 1e-5f * (float)k,
				      "m=%d n=%d k=%d [%d]: %g vs %g", m, n, k, i, (double)got[i],
				      (double)ref[i]);
		free(x);
		free(w);
		free(got);
		free(ref);
	}
}
END_TEST

START_TEST(test_matvec_avx512)
{
	/* Every row count mod 4 and column count mod 16, against the plain-C twin. */
	static const int shapes[][2] = { { 1, 1 }, { 3, 15 }, { 4, 16 }, { 5, 17 }, { 7, 33 },
					 { 64, 768 }, { 130, 100 }, { 2048, 768 } };

	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		const int n = shapes[s][0], k = shapes[s][1];
		float *x = malloc(sizeof(float) * (size_t)k), *w = malloc(sizeof(float) * (size_t)n * k);
		float *got = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)n);
		unsigned seed = 7;

		for (int i = 0; i < k; i++)
			x[i] = frand(&seed);
		for (int i = 0; i < n * k; i++)
			w[i] = frand(&seed);
		dps_matvec_f32_avx512(got, x, w, n, k);
		dps_matvec_ref(ref, x, w, n, k);
		for (int i = 0; i < n; i++)
			ck_assert_msg(fabsf(got[i] - ref[i]) <= 1e-5f * (float)k, "n=%d k=%d [%d]: %g vs %g",
				      n, k, i, (double)got[i], (double)ref[i]);
		/* The check can fail: one changed weight is seen. */
		w[0] += 1.0f;
		dps_matvec_f32_avx512(got, x, w, n, k);
		ck_assert(fabsf(got[0] - ref[0]) > 1e-3f || fabsf(x[0]) < 1e-3f);
		free(x);
		free(w);
		free(got);
		free(ref);
	}
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
	/* Not registered (so not counted as a pass) on a CPU without AVX-512F. */
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f")) {
		tcase_add_test(tc, test_matvec_avx512);
		tcase_add_test(tc, test_gemm_small_avx512);
	} else {
		printf("skipped: test_matvec_avx512 and test_gemm_small_avx512 need AVX-512F, which "
		       "this CPU lacks\n");
	}
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_FORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
