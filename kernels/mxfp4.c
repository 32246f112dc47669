/* SPDX-License-Identifier: MIT */
/*
 * kernels/mxfp4.c - MXFP4 products (see mxfp4.h). Plain C for now: the fast twin calls the
 * reference until the vector kernels land.
 */
#include <math.h>

#include "kernels/mxfp4.h"

const float dps_mxfp4_values[16] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
				     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f };

void dps_mxfp4_dequant_row(float *restrict out, const uint8_t *restrict blocks,
			   const uint8_t *restrict scales, int r, int k)
{
	const int G = k / 32;

	for (int b = 0; b < G; b++) {
		const uint8_t *q = blocks + ((size_t)r * (size_t)G + (size_t)b) * 16;
		const float s = ldexpf(1.0f, (int)scales[(size_t)r * (size_t)G + (size_t)b] - 127);

		for (int i = 0; i < 16; i++) {
			out[32 * b + 2 * i] = dps_mxfp4_values[q[i] & 15] * s;
			out[32 * b + 2 * i + 1] = dps_mxfp4_values[q[i] >> 4] * s;
		}
	}
}

void dps_linear_mxfp4_ref(float *out, const float *x, const uint8_t *blocks,
			  const uint8_t *scales, int m, int n, int k)
{
	float row[k > 0 ? k : 1];

	for (int r = 0; r < n; r++) {
		dps_mxfp4_dequant_row(row, blocks, scales, r, k);
		for (int i = 0; i < m; i++) {
			float acc = 0.0f;

			for (int c = 0; c < k; c++)
				acc += row[c] * x[(size_t)i * (size_t)k + (size_t)c];
			out[(size_t)i * (size_t)n + (size_t)r] = acc;
		}
	}
}

void dps_linear_mxfp4(float *out, const float *x, const uint8_t *blocks, const uint8_t *scales,
		      int m, int n, int k)
{
	dps_linear_mxfp4_ref(out, x, blocks, scales, m, n, k);
}
