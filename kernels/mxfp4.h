/* SPDX-License-Identifier: MIT */
/*
 * kernels/mxfp4.h - products with MXFP4 weights (the OCP microscaling format GPT-OSS publishes
 * its experts in), read as stored: 4-bit E2M1 values in blocks of 32 with one E8M0 scale each.
 *
 * Layout, as Hugging Face's *_blocks / *_scales tensors: a weight W of shape (n, k), k a
 * multiple of 32, row r holds k / 32 blocks. Block b of row r is 16 bytes at
 * blocks + (r * (k / 32) + b) * 16: byte i holds element 32 b + 2 i in its low nibble and
 * element 32 b + 2 i + 1 in its high nibble, each a code of dps_mxfp4_values; the block's
 * scale byte e = scales[r * (k / 32) + b] multiplies it by 2^(e - 127) (e = 255, the format's
 * NaN, makes the block NaN). Every value is exact in f32 (up to e = 252; above, the largest
 * codes round to infinity), so W is a set of f32 numbers and the products are ordinary f32
 * products of them.
 */
#ifndef DPS_KERNELS_MXFP4_H
#define DPS_KERNELS_MXFP4_H

#include <stddef.h>
#include <stdint.h>

/* The sixteen E2M1 codes: +0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, ..., -6. */
extern const float dps_mxfp4_values[16];

/* Bytes of the blocks and of the scales of an (n, k) MXFP4 matrix. */
static inline size_t dps_mxfp4_block_bytes(int n, int k)
{
	return (size_t)n * (size_t)(k / 32) * 16;
}

static inline size_t dps_mxfp4_scale_bytes(int n, int k)
{
	return (size_t)n * (size_t)(k / 32);
}

/* Row r of W as k f32 values. */
void dps_mxfp4_dequant_row(float *restrict out, const uint8_t *restrict blocks,
			   const uint8_t *restrict scales, int r, int k);

/*
 * out (m x n) = x (m x k) . W^T for the MXFP4 W above (k a multiple of 32): the plain-C
 * reference, one element at a time in index order.
 */
void dps_linear_mxfp4_ref(float *out, const float *x, const uint8_t *blocks,
			  const uint8_t *scales, int m, int n, int k);

/*
 * The fast twin: the same product within rounding, split over the rank's pool
 * (dps_gemm_pool) by output rows; reads each weight byte once per call whatever m.
 */
void dps_linear_mxfp4(float *out, const float *x, const uint8_t *blocks, const uint8_t *scales,
		      int m, int n, int k);

/*
 * Its two halves, which it chooses between at run time (kernels/mxfp4.c says how each
 * works), for the tests to reach both: the first requires AVX2 and FMA, the second
 * AVX-512F; the caller checks.
 */
void dps_linear_mxfp4_avx2(float *out, const float *x, const uint8_t *blocks,
			   const uint8_t *scales, int m, int n, int k);
void dps_linear_mxfp4_avx512(float *out, const float *x, const uint8_t *blocks,
			     const uint8_t *scales, int m, int n, int k);

/*
 * The integer form (kernels/mxfp4_q8.c), under --quantization int8: the activations quantized
 * per block of 32 (kernels/q8.h), each block's products summed exactly in integers, the blocks
 * in f32 in q8.h's order with the block's scale halved for the doubled values (2v). It reads the
 * weights re-laid by dps_mxfp4_interleave (the same bytes, codes moved within their group of
 * sixteen blocks); the scales stay as stored.
 */
struct dps_q8_act;

/* Re-lays `rows` rows of k (a multiple of 32) of MXFP4 blocks for the integer form, in place.
 * 0 or -ENOMEM. */
int dps_mxfp4_interleave(uint8_t *blocks, size_t rows, int k);

/* Row r of such re-laid weights as f32 (2v times 2^(e - 128): the stored values, exactly). */
void dps_mxfp4_deinterleave_row(float *restrict out, const uint8_t *restrict blocks,
				const uint8_t *restrict scales, size_t r, int k);

/*
 * out (m x n, row stride ldo) = the quantized activations a . the n re-laid rows of W, in the
 * order above, single-threaded: AVX-512 with BW, VL, VNNI and VBMI; AVX2 with FMA and F16C
 * (the caller checks); the plain-C twin. Bit for bit the same (NaN where NaN).
 */
void dps_gemm_mxfp4q8_avx512(float *restrict out, int ldo, const struct dps_q8_act *a,
			     const uint8_t *blocks, const uint8_t *scales, int n);
void dps_gemm_mxfp4q8_avx2(float *restrict out, int ldo, const struct dps_q8_act *a,
			   const uint8_t *blocks, const uint8_t *scales, int n);
void dps_gemm_mxfp4q8_ref(float *restrict out, int ldo, const struct dps_q8_act *a,
			  const uint8_t *blocks, const uint8_t *scales, int n);

/* The product on the rank's pool (kernels/gemm.c): x (m x k) quantized once, then the slices. */
void dps_linear_mxfp4_q8(float *out, const float *x, const uint8_t *blocks,
			 const uint8_t *scales, int m, int n, int k);

/* The same product on the calling thread alone (a task of the rank's pool, after
 * dps_gemm_setup), x quantized into that thread's own buffer (freed when the thread ends);
 * the same bits. */
void dps_linear_mxfp4_q8_here(float *out, const float *x, const uint8_t *blocks,
			      const uint8_t *scales, int m, int n, int k);

#endif
