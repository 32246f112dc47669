/* SPDX-License-Identifier: MIT */
/*
 * kernels/gemm_int.h - the register-tile form of dpshard's batch-invariant product
 * (gemm_tile.c), which gemm_dot.c's entry points take from GEMM_TILE_M_MIN rows of x on. It
 * sums every output in the order of gemm.h, as the dot-product form does, so which form a
 * product takes never shows in its bits. Private to kernels/.
 */
#ifndef DPS_KERNELS_GEMM_INT_H
#define DPS_KERNELS_GEMM_INT_H

#include <stdint.h>

/*
 * From this many rows of x (and k >= 16) the tile form is faster. It packs the slice of W once
 * per call, which the dot-product form does not need to, and pays that back over the rows (one
 * Zen 3 core, AVX2, 2048 x 768 weights: the dot form 35-42 GFLOP/s at m = 16..32 against 27-35,
 * the tile form 42 against 35 at m = 64 and 53-58 against 37 at m = 512).
 */
#define GEMM_TILE_M_MIN 48

/*
 * out (m x n, row stride ldo) = x (m x k) . W^T in the order of gemm.h, single-threaded, as
 * dps_gemm_f32_avx2 / _avx512 / _ref. Returns 0, or -ENOMEM when the thread's packing buffers
 * cannot grow (out is then untouched and the caller takes the dot-product form). The first
 * requires AVX2 and FMA, the second AVX-512F. The buffers are the calling thread's, kept
 * between calls (they grow to the largest m x k and k x n-block seen).
 */
int dps_gemm_tile_f32_avx2(float *restrict out, int ldo, const float *restrict x,
			   const float *restrict W, int m, int n, int k);
int dps_gemm_tile_f32_avx512(float *restrict out, int ldo, const float *restrict x,
			     const float *restrict W, int m, int n, int k);

/* The same on BF16 and F16 weights, widened to f32 while they are packed: the f32 results, bit
 * for bit. */
int dps_gemm_tile_bf16_avx2(float *restrict out, int ldo, const float *restrict x,
			    const uint16_t *restrict W, int m, int n, int k);
int dps_gemm_tile_bf16_avx512(float *restrict out, int ldo, const float *restrict x,
			      const uint16_t *restrict W, int m, int n, int k);
int dps_gemm_tile_f16_avx2(float *restrict out, int ldo, const float *restrict x,
			   const uint16_t *restrict W, int m, int n, int k);
int dps_gemm_tile_f16_avx512(float *restrict out, int ldo, const float *restrict x,
			     const uint16_t *restrict W, int m, int n, int k);

#endif
