/* SPDX-License-Identifier: MIT */
/*
 * common/f16.h - IEEE half precision (F16: sign, 5-bit exponent, 10 bits of mantissa), as
 * F16 checkpoint tensors are stored and as the scales of INT8 weight blocks are kept
 * (kernels/q8.h). Used by the safetensors reader and writer, the checkpoint loader and the
 * INT8 kernels' plain-C twins (the SIMD ones convert with F16C, which rounds the same way).
 */
#ifndef DPS_COMMON_F16_H
#define DPS_COMMON_F16_H

#include <stdint.h>

/* The f32 of the same value (exact: every F16 is an f32), subnormals, infinities and NaN. */
float dps_f16_to_f32(uint16_t h);

/* f rounded to the nearest F16, ties to even; too large: infinity; a NaN stays a NaN. */
uint16_t dps_f32_to_f16(float f);

#endif
