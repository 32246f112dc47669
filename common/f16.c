/* SPDX-License-Identifier: MIT */
/*
 * common/f16.c - IEEE half precision to and from f32 (see f16.h), in plain C, bit by bit.
 */
#include <string.h>

#include "common/f16.h"

float dps_f16_to_f32(uint16_t h)
{
	const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
	float f;

	if (exp == 0x1f) {
		u = sign | 0x7f800000u | (man << 13); /* inf, NaN */
	} else if (exp == 0) {
		f = (float)man * (1.0f / 16777216.0f); /* subnormal: man * 2^-24 */
		return sign ? -f : f;
	} else {
		u = sign | ((exp + 112) << 23) | (man << 13);
	}
	memcpy(&f, &u, 4);
	return f;
}

uint16_t dps_f32_to_f16(float f)
{
	uint32_t u, sign, exp, man;
	int e;

	memcpy(&u, &f, 4);
	sign = (u >> 16) & 0x8000;
	exp = (u >> 23) & 0xff;
	man = u & 0x7fffff;
	if (exp == 0xff)
		return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
	e = (int)exp - 127 + 15;
	if (e >= 0x1f)
		return (uint16_t)(sign | 0x7c00);
	if (e <= 0) {
		/* Subnormal half (or zero): shift the implicit bit in, round to nearest even. */
		uint32_t m = man | 0x800000, shift = (uint32_t)(14 - e), r;

		if (shift > 24)
			return (uint16_t)sign;
		r = m >> shift;
		if ((m & ((1u << shift) - 1)) > (1u << (shift - 1)) ||
		    ((m & ((1u << shift) - 1)) == (1u << (shift - 1)) && (r & 1)))
			r++;
		return (uint16_t)(sign | r);
	}
	{
		uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13);
		const uint32_t rest = man & 0x1fff;

		if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
			h++; /* may carry into the exponent, and to inf: correct rounding */
		return (uint16_t)h;
	}
}
