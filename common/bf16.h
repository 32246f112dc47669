/* SPDX-License-Identifier: MIT */
/*
 * common/bf16.h - BF16, the upper sixteen bits of an IEEE f32 (sign, the 8-bit exponent, 7
 * bits of mantissa), as the linear weights of a BF16 checkpoint are kept in memory. Widening
 * is exact (a shift); narrowing rounds to nearest, ties to even, as torch's .to(bfloat16)
 * does, and keeps a NaN a (quiet) NaN. Used by the collectives' BF16 sums (shm/reduce.h), the
 * kernels (kernels/gemm.h), the checkpoint loader and the embedding lookup.
 */
#ifndef DPS_COMMON_BF16_H
#define DPS_COMMON_BF16_H

#include <stdint.h>
#include <string.h>

/* The f32 of the same value. */
static inline float dps_bf16_to_f32(uint16_t h)
{
	const uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* f rounded to the nearest BF16, ties to even; infinities stay, a NaN stays a NaN. */
static inline uint16_t dps_f32_to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep the sign, set the quiet bit */
		return (uint16_t)((u >> 16) | 0x40u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#endif
