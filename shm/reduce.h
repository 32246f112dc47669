/* SPDX-License-Identifier: MIT */
/*
 * shm/reduce.h - element types of the collectives and the ordered sums they compute.
 *
 * Determinism contract (docs/DESIGN.md section 2): out[j] = ((src[0][j] + src[1][j]) + ...) +
 * src[n-1][j], accumulated in fp32 (int32 wraps modulo 2^32) and rounded once to the element
 * type. The order depends only on group-rank order, never on chunking or algorithm, so every
 * rank and every run get the same bits. No FMA or reassociation is involved (sums only).
 */
#ifndef DPS_SHM_REDUCE_H
#define DPS_SHM_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "common/bf16.h"

enum dps_dtype { DPS_F32, DPS_BF16, DPS_I32, DPS_DTYPE_COUNT };

static inline size_t dps_dtype_size(enum dps_dtype t)
{
	return t == DPS_BF16 ? 2 : 4;
}

/* "f32", "bf16", "i32" */
const char *dps_dtype_name(enum dps_dtype t);
/* Parses a name above; returns 0 or -EINVAL. */
int dps_dtype_parse(const char *s, enum dps_dtype *out);

/* bf16 <-> f32 (dps_bf16_to_f32, dps_f32_to_bf16): common/bf16.h. */

/*
 * out[j] = ordered sum over i = 0..n-1 of src[i][j], j < count, per the contract above.
 * out may alias src[i] for any i (each block is read completely before it is written).
 * Requires n >= 1.
 */
void dps_reduce_sum(enum dps_dtype t, void *out, const void *const *src, int n, size_t count);

/* Plain-C references of the same (one element at a time), for tests. */
void dps_reduce_sum_ref(enum dps_dtype t, void *out, const void *const *src, int n, size_t count);

#endif
