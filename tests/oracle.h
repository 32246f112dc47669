/* SPDX-License-Identifier: MIT */
/*
 * tests/oracle.h - independent reference arithmetic for the collective tests: deterministic
 * inputs, a serial in-order fp32 sum, and a bf16 rounding written differently from
 * shm/reduce.h (by comparing the two neighbouring bf16 values in double precision), so a bug
 * in the engine's rounding cannot hide in the oracle.
 */
#ifndef DPS_TESTS_ORACLE_H
#define DPS_TESTS_ORACLE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "shm/reduce.h"

static inline uint32_t oracle_hash(uint32_t a, uint32_t b, uint32_t c)
{
	uint32_t h = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u) * 0x85EBCA77u ^ c * 0xC2B2AE3Du;

	h ^= h >> 15;
	h *= 0x2C1B3C6Du;
	h ^= h >> 12;
	h *= 0x297A2D39u;
	h ^= h >> 15;
	return h;
}

/* A float in [-1, 1) with a full mantissa, so sums round and their order matters. */
static inline float oracle_f32(uint32_t member, uint32_t i, uint32_t salt)
{
	return (float)((double)oracle_hash(member, i, salt) / 2147483648.0 - 1.0);
}

static inline float oracle_bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* Nearest bf16 to f, ties to even; NaN stays NaN. */
static inline uint16_t oracle_f32_to_bf16(float f)
{
	uint32_t u, lo_bits;
	float lo, hi;
	double dlo, dhi;

	if (isnan(f))
		return 0x7fc0;
	memcpy(&u, &f, 4);
	lo_bits = u & 0xffff0000u;
	memcpy(&lo, &lo_bits, 4);
	if (lo == f)
		return (uint16_t)(lo_bits >> 16);
	hi = oracle_bf16_to_f32((uint16_t)((lo_bits >> 16) + 1));
	dlo = fabs((double)f - (double)lo);
	/* Above the largest bf16 the next value up is 2^128 as far as rounding is concerned. */
	dhi = isinf(hi) ? fabs(fabs((double)f) - ldexp(1.0, 128)) : fabs((double)f - (double)hi);
	if (dlo < dhi)
		return (uint16_t)(lo_bits >> 16);
	if (dhi < dlo)
		return (uint16_t)((lo_bits >> 16) + 1);
	return (lo_bits >> 16) & 1 ? (uint16_t)((lo_bits >> 16) + 1) : (uint16_t)(lo_bits >> 16);
}

/* Fills buf with count elements of type t of member's input: element j is input idx base + j. */
static inline void gen(enum dps_dtype t, void *buf, size_t count, uint32_t member, uint32_t base,
		uint32_t salt)
{
	for (size_t j = 0; j < count; j++) {
		const uint32_t idx = base + (uint32_t)j;

		if (t == DPS_F32)
			((float *)buf)[j] = oracle_f32(member, idx, salt);
		else if (t == DPS_BF16)
			((uint16_t *)buf)[j] = oracle_f32_to_bf16(oracle_f32(member, idx, salt));
		else
			((int32_t *)buf)[j] = (int32_t)oracle_hash(member, idx, salt);
	}
}

/* Serial in-order sum over members 0..n-1 of element idx: the contract of docs/DESIGN.md
 * section 2. */
static inline void oracle_sum(enum dps_dtype t, void *out, uint32_t n, uint32_t idx, uint32_t salt)
{
	if (t == DPS_F32) {
		float a = oracle_f32(0, idx, salt);

		for (uint32_t i = 1; i < n; i++)
			a += oracle_f32(i, idx, salt);
		memcpy(out, &a, 4);
	} else if (t == DPS_BF16) {
		float a = oracle_bf16_to_f32(oracle_f32_to_bf16(oracle_f32(0, idx, salt)));
		uint16_t h;

		for (uint32_t i = 1; i < n; i++)
			a += oracle_bf16_to_f32(oracle_f32_to_bf16(oracle_f32(i, idx, salt)));
		h = oracle_f32_to_bf16(a);
		memcpy(out, &h, 2);
	} else {
		uint32_t a = 0;

		for (uint32_t i = 0; i < n; i++)
			a += oracle_hash(i, idx, salt);
		memcpy(out, &a, 4);
	}
}

#endif
