/* SPDX-License-Identifier: MIT */
/*
 * kernels/limits.c - the read-bandwidth probe and the sgemm rate (see limits.h). Called once
 * per `bench decode` run.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/dps.h"
#include "kernels/gemm.h"
#include "kernels/limits.h"
#include "kernels/pool.h"

float dps_limits_sum_f32_ref(const float *restrict p, size_t n)
{
	float acc[16] = { 0 };

	for (size_t i = 0; i + 16 <= n; i += 16)
		for (int j = 0; j < 16; j++)
			acc[j] += p[i + j];
	for (int j = 1; j < 16; j++)
		acc[0] += acc[j];
	return acc[0];
}

/* Adds the 16 lanes of a (two 8-lane halves for AVX2) in the reference's order. */
static float lanes_sum(const float *restrict a)
{
	float s = a[0];

	for (int j = 1; j < 16; j++)
		s += a[j];
	return s;
}

/*
 * Assumptions: n a multiple of 64, any alignment (the probe's buffer is 2 MiB-aligned, so no
 * load splits a line there). Four accumulators of 16 lanes: lane j of accumulator q adds
 * p[64i + 16q + j]; they are added lane by lane (so lane j holds the reference's partial sum
 * j) and then across lanes.
 */
__attribute__((target("avx512f"))) static float sum_avx512(const float *restrict p, size_t n)
{
	__m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	float lanes[16];

	for (size_t i = 0; i + 64 <= n; i += 64) {
		a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
		a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
		a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
		a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
	}
	_mm512_storeu_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
	return lanes_sum(lanes);
}

/* Assumptions: as sum_avx512, with 8-lane registers: lo holds lanes 0-7, hi lanes 8-15. */
__attribute__((target("avx2"))) static float sum_avx2(const float *restrict p, size_t n)
{
	__m256 l0 = _mm256_setzero_ps(), h0 = l0, l1 = l0, h1 = l0;
	float lanes[16];

	for (size_t i = 0; i + 32 <= n; i += 32) {
		l0 = _mm256_add_ps(l0, _mm256_loadu_ps(p + i));
		h0 = _mm256_add_ps(h0, _mm256_loadu_ps(p + i + 8));
		l1 = _mm256_add_ps(l1, _mm256_loadu_ps(p + i + 16));
		h1 = _mm256_add_ps(h1, _mm256_loadu_ps(p + i + 24));
	}
	_mm256_storeu_ps(lanes, _mm256_add_ps(l0, l1));
	_mm256_storeu_ps(lanes + 8, _mm256_add_ps(h0, h1));
	return lanes_sum(lanes);
}

float dps_limits_sum_f32(const float *restrict p, size_t n)
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f"))
		return sum_avx512(p, n);
	if (__builtin_cpu_supports("avx2"))
		return sum_avx2(p, n);
	return dps_limits_sum_f32_ref(p, n);
}

struct read_job {
	const float *buf;
	size_t n;
	int chunks;
	float sink[64];
};

static void read_slice(void *arg, int chunk, int tid)
{
	struct read_job *j = arg;
	int lo, hi;

	(void)tid;
	/* In units of 64 floats (one 256-byte block), so every slice stays aligned. */
	dps_pool_split((int)(j->n / 64), 1, chunk, j->chunks, &lo, &hi);
	j->sink[chunk % 64] += dps_limits_sum_f32(j->buf + (size_t)lo * 64, (size_t)(hi - lo) * 64);
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double dps_limits_read_bandwidth(size_t bytes, int reps)
{
	const size_t huge = (size_t)2 << 20;
	struct read_job j = { 0 };
	double t[16];
	void *p;

	if (reps > 16)
		reps = 16;
	if (reps < 1)
		reps = 1;
	bytes = (bytes + huge - 1) / huge * huge;
	p = dps_alloc_huge(bytes); /* zeroed: every page touched before the timing */
	if (!p)
		return 0;
	j.buf = p;
	j.n = bytes / sizeof(float);
	j.chunks = 4 * dps_pool_size(dps_gemm_pool());
	dps_pool_run(dps_gemm_pool(), j.chunks, read_slice, &j); /* warm the TLB and the threads */
	for (int r = 0; r < reps; r++) {
		const uint64_t t0 = dps_now_ns();

		dps_pool_run(dps_gemm_pool(), j.chunks, read_slice, &j);
		t[r] = (double)bytes / ((double)(dps_now_ns() - t0) / 1e9);
	}
	free(p);
	qsort(t, (size_t)reps, sizeof(double), cmp_double);
	return t[reps / 2];
}

double dps_limits_sgemm_rate(int n, int reps)
{
	float *a = malloc(sizeof(float) * (size_t)n * n), *b = malloc(sizeof(float) * (size_t)n * n);
	float *c = malloc(sizeof(float) * (size_t)n * n);
	double t[16];

	if (reps > 16)
		reps = 16;
	if (reps < 1)
		reps = 1;
	if (!a || !b || !c) {
		free(a);
		free(b);
		free(c);
		return 0;
	}
	for (size_t i = 0; i < (size_t)n * n; i++) {
		a[i] = (float)(i % 13) * 0.01f;
		b[i] = (float)(i % 7) * 0.02f;
	}
	dps_linear_f32(c, a, b, n, n, n);
	for (int r = 0; r < reps; r++) {
		const uint64_t t0 = dps_now_ns();

		dps_linear_f32(c, a, b, n, n, n);
		t[r] = 2.0 * n * n * (double)n / ((double)(dps_now_ns() - t0));
	}
	free(a);
	free(b);
	free(c);
	qsort(t, (size_t)reps, sizeof(double), cmp_double);
	return t[reps / 2];
}
