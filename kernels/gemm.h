/* SPDX-License-Identifier: MIT */
/*
 * kernels/gemm.h - the linear layers' matrix products: dpshard's batch-invariant kernel
 * (kernels/gemm_dot.c), or BLIS when a kernel set is named explicitly.
 *
 * With "auto" every product, decode or prefill, at any m, goes through one kernel family whose
 * sum for each output depends on k alone - not on m, on the row's place in the batch, on the
 * column's place in a slice, or on the number of threads - so a request's tokens do not depend
 * on what it is batched with, nor on how its prompt is chunked. The order, for output
 * out[i][r] = sum_c x[i][c] * W[r][c]:
 *
 *   sixteen lanes a[0..15], each starting at +0; for c0 = 0, 16, 32, ... < k, in that order,
 *   a[l] = fmaf(W[r][c0 + l], x[i][c0 + l], a[l]) for every l with c0 + l < k;
 *   then h[l] = a[l] + a[l + 8] (l < 8), q[l] = h[l] + h[l + 4] (l < 4),
 *   d[l] = q[l] + q[l + 2] (l < 2), out = d[0] + d[1].
 *
 * dps_gemm_f32_ref writes exactly that with fmaf (a lane with no element left is not touched).
 * Below GEMM_TILE_M_MIN rows of x the AVX-512 kernel keeps each a in one zmm register, the AVX2
 * one in two ymm halves summed one after the other; from there on both run each lane as one
 * sequential chain in a register tile of outputs (gemm_tile.c) and apply the tree across the
 * tile. All give the same bits (tests/check_gemm.c). The MXFP4 products (mxfp4.h) sum in the
 * same order.
 *
 * BLIS (Debian's 0.9.0 links statically; it does not recognise Zen 5) stays available as an
 * explicit choice: "skx" (AVX-512 packed kernels), "zen3", "haswell", "generic", or
 * "BIG:SMALL" (e.g. "skx:zen3": SMALL for m <= 47). Its sums depend on m (the kernel set and
 * the packing change with it), so under BLIS a row's result depends on the rows beside it.
 */
#ifndef DPS_KERNELS_GEMM_H
#define DPS_KERNELS_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/bf16.h"

/* How a linear weight is held in memory. */
enum dps_wtype {
	DPS_WT_F32,  /* float */
	DPS_WT_BF16, /* uint16_t, BF16 (common/bf16.h) */
	DPS_WT_Q8,   /* INT8 blocks of 32 with F16 scales (kernels/q8.h), 34 bytes per 32 */
	DPS_WT_F16,  /* uint16_t, IEEE half (common/f16.h) */
};

/* Bytes per element of t, for the types of one element per value (f32, BF16, F16). */
static inline size_t dps_wtype_size(enum dps_wtype t)
{
	return t == DPS_WT_BF16 || t == DPS_WT_F16 ? sizeof(uint16_t) : sizeof(float);
}

/* Bytes of an n x k weight held as t. */
static inline size_t dps_wtype_bytes(enum dps_wtype t, size_t n, int k)
{
	if (t == DPS_WT_Q8)
		return n * (((size_t)k + 31) / 32) * 34;
	return n * (size_t)k * dps_wtype_size(t);
}

/* "f32", "bf16", "f16" or "int8". */
static inline const char *dps_wtype_name(enum dps_wtype t)
{
	return t == DPS_WT_Q8 ? "int8" : t == DPS_WT_BF16 ? "bf16" : t == DPS_WT_F16 ? "f16" : "f32";
}

/*
 * Chooses the kernels, once per process, before any product. spec: "auto" (dpshard's
 * batch-invariant kernel, AVX-512, AVX2 with FMA, or plain C, whichever this CPU runs), a BLIS
 * set name ("skx", "zen3", "haswell", "generic"), or "BIG:SMALL" (e.g. "skx:zen3"). threads:
 * the rank's threads (--threads-per-rank, >= 1): each product is split by output columns over
 * a pool of that many threads (kernels/pool.h), each running its slice single-threaded, and
 * the engine's own kernels use the same pool (dps_gemm_pool). Returns 0, or -EINVAL with a
 * message in msg when the CPU cannot run the requested BLIS set or it is not built into BLIS.
 * On success msg describes the choice (a BLIS one says it is not batch-invariant).
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
 * The same product on BF16 weights W (n x k, common/bf16.h). Contract: widening BF16 to f32
 * is exact and the sums are those of dps_linear_f32, so the result is, bit for bit,
 * dps_linear_f32 under "auto" on the widened weights - at every m, in both forms, with any
 * threads. Half the bytes of W are read. Under a BLIS kernel set too it runs dpshard's kernel
 * (the best this CPU passed the self-check with), so its bits are then those of "auto", not
 * of BLIS on the widened weights.
 */
void dps_linear_bf16(float *out, const float *x, const uint16_t *W, int m, int n, int k);

/* The same on F16 weights (common/f16.h), widened exactly: dps_linear_f32's bits on the
 * widened weights, at half the bytes of W. */
void dps_linear_f16(float *out, const float *x, const uint16_t *W, int m, int n, int k);

/*
 * The same product on an INT8 weight W (n x k, kernels/q8.h): x is quantized per block of 32
 * as it enters (once per call, before the columns are split over the threads), and every
 * output summed in q8.h's order, which depends on k alone. Under a BLIS kernel set too it
 * runs dpshard's kernel.
 */
void dps_linear_q8(float *out, const float *x, const void *W, int m, int n, int k);
/* The same on the calling thread alone (a task of the rank's pool, after dps_gemm_setup), x
 * quantized into that thread's own buffer; the same bits. */
void dps_linear_q8_here(float *out, const float *x, const void *W, int m, int n, int k);

/*
 * Grows the calling thread's quantized activations for products of up to m rows of k, so
 * that dps_linear_q8 never allocates for them (it aborts when it cannot: a rank that loads an
 * INT8 model reserves for its largest product first). 0 or -ENOMEM.
 */
int dps_linear_q8_reserve(int m, int k);

/* The plain-C twin of dps_linear_q8. */
void dps_linear_q8_ref(float *out, const float *x, const void *W, int m, int n, int k);

/* dps_linear_f32, _bf16, _f16 or _q8, as t says W is held: the one entry of the engine. */
void dps_linear_w(float *out, const float *x, const void *W, enum dps_wtype t, int m, int n,
		  int k);

/*
 * out (m x n, row stride ldo) = x (m x k) . W^T in the order above, single-threaded (the caller
 * slices the columns). W is read from memory once per call: rows of W are taken in blocks that
 * stay in L2, x in blocks under each (from GEMM_TILE_M_MIN rows on, both packed into the
 * calling thread's buffers, which stay allocated until it exits). Any alignment. The first requires AVX-512F, the second
 * AVX2 and FMA (the caller checks); the third is their plain-C twin, bit for bit the same.
 */
void dps_gemm_f32_avx512(float *restrict out, int ldo, const float *restrict x,
			 const float *restrict W, int m, int n, int k);
void dps_gemm_f32_avx2(float *restrict out, int ldo, const float *restrict x,
		       const float *restrict W, int m, int n, int k);
void dps_gemm_f32_ref(float *restrict out, int ldo, const float *restrict x,
		      const float *restrict W, int m, int n, int k);

/*
 * The same three on BF16 weights, each widened to f32 as it is loaded (a 16-bit shift; the
 * tile form widens while it packs W): the f32 kernels' FMAs on the widened weights, so bit for
 * bit dps_gemm_f32_ref on them. AVX512-BF16's vdpbf16ps is not used: it adds two products
 * before each accumulation and rounds them its own way, which is another sum order.
 */
void dps_gemm_bf16_avx512(float *restrict out, int ldo, const float *restrict x,
			  const uint16_t *restrict W, int m, int n, int k);
void dps_gemm_bf16_avx2(float *restrict out, int ldo, const float *restrict x,
			const uint16_t *restrict W, int m, int n, int k);
void dps_gemm_bf16_ref(float *restrict out, int ldo, const float *restrict x,
		       const uint16_t *restrict W, int m, int n, int k);

/* The same three on F16 weights, each widened to f32 by vcvtph2ps (exact) as it is loaded or
 * packed: bit for bit dps_gemm_f32_ref on the widened weights. */
void dps_gemm_f16_avx512(float *restrict out, int ldo, const float *restrict x,
			 const uint16_t *restrict W, int m, int n, int k);
void dps_gemm_f16_avx2(float *restrict out, int ldo, const float *restrict x,
		       const uint16_t *restrict W, int m, int n, int k);
void dps_gemm_f16_ref(float *restrict out, int ldo, const float *restrict x,
		      const uint16_t *restrict W, int m, int n, int k);

/* The plain-C twin of dps_linear_f32 under "auto": dps_gemm_f32_ref, bit for bit the same. */
void dps_linear_f32_ref(float *out, const float *x, const float *W, int m, int n, int k);

/* The plain-C twin of dps_linear_bf16 under "auto": dps_gemm_bf16_ref. */
void dps_linear_bf16_ref(float *out, const float *x, const uint16_t *W, int m, int n, int k);

/* The plain-C twin of dps_linear_f16: dps_gemm_f16_ref. */
void dps_linear_f16_ref(float *out, const float *x, const uint16_t *W, int m, int n, int k);

#endif
