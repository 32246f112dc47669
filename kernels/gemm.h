/* SPDX-License-Identifier: MIT */
/*
 * kernels/gemm.h - the linear layers' matrix products, through BLIS with kernels chosen for
 * this CPU.
 *
 * Debian's BLIS 0.9.0 does not recognise Zen 5 and would run its generic kernels (about 30
 * GFLOP/s single-core sgemm). dps_gemm_setup picks a kernel set the CPU can run: "skx" (AVX-512,
 * the fastest packed kernels, for large m) paired with "zen3" (AMD) or "haswell" (Intel) for
 * small m, whose skinny-matrix paths suit decode (m = 1..47); or any of those alone, or
 * "generic". It uses the contexts of the statically linked BLIS directly (bli_gks_lookup_*),
 * and also sets BLIS's own choice (BLIS_ARCH_TYPE, by number) before bli_init so any other
 * BLIS call agrees.
 *
 * Results are within rounding of the reference but not bit-identical across kernel sets.
 */
#ifndef DPS_KERNELS_GEMM_H
#define DPS_KERNELS_GEMM_H

#include <stddef.h>

/*
 * Chooses the kernels, once per process, before any product. spec: "auto", a set name
 * ("skx", "zen3", "haswell", "generic"), or "BIG:SMALL" (e.g. "skx:zen3"). threads: the
 * rank's threads (--threads-per-rank, >= 1): each product is split by output columns over a
 * pool of that many threads (kernels/pool.h), each running BLIS single-threaded on its slice,
 * and the engine's own kernels use the same pool (dps_gemm_pool). Returns 0, or -EINVAL with a message in msg when the CPU cannot
 * run the requested set or it is not built into BLIS. On success msg describes the choice.
 */
int dps_gemm_setup(const char *spec, int threads, char *msg, size_t msglen);

/* The rank's thread pool started by dps_gemm_setup (NULL before, or with one thread). */
struct dps_pool *dps_gemm_pool(void);

/* The choice, as the message of dps_gemm_setup ("not set up" before). */
const char *dps_gemm_describe(void);

/*
 * out (m x n) = x (m x k) . W^T, W stored (n x k) row-major as a Hugging Face Linear weight.
 * Sets up with "auto" and one thread if dps_gemm_setup was not called.
 */
void dps_linear_f32(float *out, const float *x, const float *W, int m, int n, int k);

/*
 * out[r] = W[r,:] . x, r < rows: the one-row product of decode at batch 1, streaming W at
 * close to memory bandwidth. Requires AVX-512F (the caller checks). Twin: dps_matvec_ref.
 */
void dps_matvec_f32_avx512(float *restrict out, const float *restrict x,
			   const float *restrict W, int rows, int cols);

/*
 * out (m x n, row stride ldo) = x (m x k) . W^T for small m (decode batches), reading W from
 * memory once: each output is summed in the same order whatever m is, so a row's result does
 * not depend on the other rows of the batch. Requires AVX-512F. Twin: dps_gemm_small_f32_ref.
 */
void dps_gemm_small_f32_avx512(float *restrict out, int ldo, const float *restrict x,
			       const float *restrict W, int m, int n, int k);
void dps_gemm_small_f32_ref(float *restrict out, int ldo, const float *restrict x,
			    const float *restrict W, int m, int n, int k);

/* The plain-C twin of dps_linear_f32. */
void dps_linear_f32_ref(float *out, const float *x, const float *W, int m, int n, int k);

#endif
