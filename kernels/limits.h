/* SPDX-License-Identifier: MIT */
/*
 * kernels/limits.h - the machine's limits, which `bench decode` puts beside its results: the
 * memory read bandwidth, measured the way decode reads weights (every thread of the rank's
 * pool streams its slice of a buffer far larger than the caches, on huge pages, summing it so
 * nothing is optimised away), which sets the bandwidth-bound step time; and the sgemm rate of
 * the products. The summing kernel has a plain-C twin with the same signature.
 */
#ifndef DPS_KERNELS_LIMITS_H
#define DPS_KERNELS_LIMITS_H

#include <stddef.h>

/*
 * The sum of n floats of p, in 16 interleaved partial sums (lane j adds p[16i + j]), added
 * together at the end; n a multiple of 64 (the rest is left out), any alignment. The fast
 * version streams with
 * the widest loads the CPU has (AVX-512, else AVX2) in the same lanes, so both give the same
 * sum when every partial sum is exact (small integers, as the test uses).
 */
float dps_limits_sum_f32(const float *restrict p, size_t n);
float dps_limits_sum_f32_ref(const float *restrict p, size_t n);

/*
 * Read bandwidth in bytes/s of the threads of dps_gemm_pool() over a buffer of `bytes`
 * (rounded up to 2 MiB): the median of reps passes after a warm-up pass. 0 when the buffer
 * cannot be had.
 */
double dps_limits_read_bandwidth(size_t bytes, int reps);

/* GFLOP/s of an n x n x n product through dps_linear_f32: the median of reps (at most 16). 0
 * when the matrices cannot be had. */
double dps_limits_sgemm_rate(int n, int reps);

#endif
