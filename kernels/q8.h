/* SPDX-License-Identifier: MIT */
/*
 * kernels/q8.h - INT8 linear weights (--quantization int8): each row of W cut into blocks of
 * 32 values along k, each block 32 signed 8-bit values and one F16 scale, as llama.cpp's Q8_0
 * (34 bytes per 32 weights). Weights are quantized once, at load or by `dpshard quantize`;
 * activations are quantized per block of 32 as they enter each product, and the product
 * multiplies the 8-bit values exactly in integers (AVX512-VNNI vpdpbusd, or AVX2's
 * vpmaddubsw + vpmaddwd) and sums the blocks in f32 in one fixed order that depends on k
 * alone, like every product of gemm.h (so a request's result does not depend on its batch).
 *
 * Quantization of a block v[0..31] (weights): d = F16(max|v| / 127) (round to nearest even),
 * q[j] = clamp(rne(v[j] / f32(d)), -127, 127), 0 for every q when d is 0. Activations the same
 * with an f32 scale: d = max|v| / 127, q[j] = rne(v[j] * (127 / max|v|)), every q 0 when
 * 127 / max|v| is not a finite f32 (max|v| 0, or under 127 / FLT_MAX). A row whose k is not
 * a multiple of 32 is zero-padded to the next multiple, weights and activations alike.
 *
 * The order of the sum, for out[i][r] with kb = ceil(k / 32) blocks and sixteen f32 lanes
 * a[0..15] starting at +0:
 *
 *   for b = 0 .. kb - 1, in that order: P = sum_{j<32} qx[i][32b + j] * qw[r][32b + j]
 *   (exact, in integers), s = dx[i][b] * dw[r][b] (one f32 product), and
 *   a[b mod 16] = fmaf(s, (float)P, a[b mod 16]); then the tree of kernels/dot_int.h over a.
 *
 * So sixteen consecutive blocks make one vector of block sums. For that the values are kept
 * interleaved: a row's blocks go in groups of 16 (the last group has t = kb mod 16 blocks, or
 * 16), and a group's 32 t bytes are 8 slots of 4 t bytes, slot j holding bytes 4j .. 4j + 3 of
 * each of its blocks in turn. A 64-byte load is then one slot of a whole group, vpdpbusd adds
 * it into each block's own lane, and eight of them give the sixteen block sums.
 *
 * In memory an (n x k) INT8 weight is n rows of kb * 34 bytes, one after the other: the row's
 * kp = 32 kb values in that order, each stored as q + 128 (unsigned, what vpdpbusd multiplies:
 * sum (q + 128) x = sum q x + 128 sum x, and the second sum comes with the activations), then
 * its kb F16 scales in block order. A row, and so any run of rows, is one contiguous range: a
 * slice of rows is a pointer, as for f32 and BF16 weights. The quantized activations are laid
 * out the same way (signed values).
 */
#ifndef DPS_KERNELS_Q8_H
#define DPS_KERNELS_Q8_H

#include <stddef.h>
#include <stdint.h>

#define DPS_Q8_BLOCK 32
#define DPS_Q8_GROUP 16 /* blocks whose sums make one vector */

/* Blocks in a row of k values: ceil(k / 32). */
static inline size_t dps_q8_blocks(int k)
{
	return ((size_t)(k > 0 ? k : 0) + DPS_Q8_BLOCK - 1) / DPS_Q8_BLOCK;
}

/* Where value c (0..31) of block b of a row of kb blocks is kept among the row's values. */
static inline size_t dps_q8_pos(size_t kb, size_t b, int c)
{
	const size_t g = b / DPS_Q8_GROUP, u = b % DPS_Q8_GROUP;
	const size_t t = kb - g * DPS_Q8_GROUP < DPS_Q8_GROUP ? kb - g * DPS_Q8_GROUP : DPS_Q8_GROUP;

	return g * DPS_Q8_GROUP * DPS_Q8_BLOCK + (size_t)(c / 4) * 4 * t + 4 * u + (size_t)(c % 4);
}

/* Bytes of a row of k values. */
static inline size_t dps_q8_row_bytes(int k)
{
	return dps_q8_blocks(k) * (DPS_Q8_BLOCK + sizeof(uint16_t));
}

/* Bytes of an n x k INT8 weight (the caller checks n * k for overflow first). */
static inline size_t dps_q8_bytes(size_t n, int k)
{
	return n * dps_q8_row_bytes(k);
}

/* Row r's stored values (q + 128, interleaved) of an INT8 weight W of rows of k. */
static inline const uint8_t *dps_q8_row(const void *W, size_t r, int k)
{
	return (const uint8_t *)W + r * dps_q8_row_bytes(k);
}

/* Row r's kb F16 scales (after its values). */
static inline const uint16_t *dps_q8_scales(const void *W, size_t r, int k)
{
	return (const uint16_t *)(const void *)(dps_q8_row(W, r, k) +
						dps_q8_blocks(k) * DPS_Q8_BLOCK);
}

/* Quantizes `rows` rows of the f32 matrix src (rows of k, row stride k) into the INT8
 * weight dst (its first `rows` rows), as the header says. */
void dps_q8_quantize_rows(void *dst, int k, const float *src, size_t rows);

/* Row r of the INT8 weight W (rows of k) as f32 (q * d, exact in f32), k values. */
void dps_q8_dequantize_row(float *dst, const void *W, int k, size_t r);

/*
 * `rows` rows of a checkpoint's INT8 weight (q: rows x k signed values in column order; d:
 * rows x kb F16 scales) into the first rows of the INT8 weight dst.
 */
void dps_q8_import_rows(void *dst, int k, const int8_t *q, const uint16_t *d, size_t rows);

/*
 * Row r of the INT8 weight W as a checkpoint stores it (`dpshard quantize`): q, k signed
 * values in column order, and d, the kb F16 scales. Either may be NULL.
 */
void dps_q8_export_row(int8_t *q, uint16_t *d, const void *W, int k, size_t r);

/*
 * Activations quantized for the products: m rows of k. q (m x kp) the values, interleaved as
 * the weights' are; d (m x kb) the scales; nc (m x kb) -128 times each block's sum of values
 * (what the AVX-512 kernel starts each block sum from). Buffers owned by the structure.
 */
struct dps_q8_act {
	int8_t *q;
	float *d;
	int32_t *nc;
	int m, k;
	size_t cap_q, cap_d, cap_nc; /* elements allocated */
};

/* Quantizes x (m x k, row stride k) into a, growing its buffers. 0 or -ENOMEM. */
int dps_q8_act_quantize(struct dps_q8_act *a, const float *x, int m, int k);

/* Tests: quantize activations with the plain-C twin from now on (on: 1), or as the CPU
 * allows (0, the default). */
void dps_q8_act_plain(int on);

/* Tests: the same with a choice: 0 plain C, 1 AVX2 (and FMA), 2 AVX-512F for whole groups of
 * sixteen blocks and AVX2 for the rest, -1 as the CPU allows (the caller checks the CPU). Every
 * choice gives the same bytes, scales and sums for finite inputs; the two SIMD ones for any. */
void dps_q8_act_isa(int isa);

/* Frees a's buffers. */
void dps_q8_act_free(struct dps_q8_act *a);

/*
 * out (m x n, row stride ldo) = the quantized activations a (all its m rows) . the n rows of
 * the INT8 weight W (rows of a->k), in the order above, single-threaded. The first requires
 * AVX-512F, BW, VL and VNNI, the second AVX2, FMA and F16C (the caller checks); the third is their
 * plain-C twin, bit for bit the same.
 */
void dps_gemm_q8_avx512(float *restrict out, int ldo, const struct dps_q8_act *a,
			const void *W, int n);
void dps_gemm_q8_avx2(float *restrict out, int ldo, const struct dps_q8_act *a,
		      const void *W, int n);
void dps_gemm_q8_ref(float *restrict out, int ldo, const struct dps_q8_act *a,
		     const void *W, int n);

#endif
