/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/weights.c - how a rank holds its linear weights (see shard.h, --dtype): the
 * type chosen at load (f32, or BF16 at half the bytes), their allocation, and the rank-override
 * loaders that read a component's rows or columns of a tensor in that type. Called by load.c,
 * load_moe.c and draft.c, once per rank at start-up.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/shard/shard_int.h"

int dps_shard_dtype_parse(const char *s, enum dps_shard_dtype *out, char *err, size_t errlen)
{
	if (s && !strcmp(s, "auto"))
		*out = DPS_SHARD_DTYPE_AUTO;
	else if (s && !strcmp(s, "f32"))
		*out = DPS_SHARD_DTYPE_F32;
	else if (s && !strcmp(s, "bf16"))
		*out = DPS_SHARD_DTYPE_BF16;
	else {
		snprintf(err, errlen, "--dtype %s: expected auto, f32 or bf16", s ? s : "(none)");
		return -EINVAL;
	}
	return 0;
}

int dps_shard_choose_wt(struct dps_shard_loader *L, enum dps_shard_dtype d)
{
	switch (d) {
	case DPS_SHARD_DTYPE_AUTO:
		L->s->wt = dps_ckpt_weights_bf16(&L->ck) ? DPS_WT_BF16 : DPS_WT_F32;
		return 0;
	case DPS_SHARD_DTYPE_F32:
		L->s->wt = DPS_WT_F32;
		return 0;
	case DPS_SHARD_DTYPE_BF16:
		L->s->wt = DPS_WT_BF16;
		return 0;
	}
	snprintf(L->err, L->errlen, "--dtype: unknown choice %d", (int)d);
	return -EINVAL;
}

void *dps_shard_alloc_w(struct dps_shard_loader *L, enum dps_shard_part part, size_t elems)
{
	const size_t esz = dps_wtype_size(L->s->wt);
	void *p;

	if (L->rc)
		return NULL;
	if (elems > SIZE_MAX / esz) {
		snprintf(L->err, L->errlen, "rank %d: %zu weights of %s overflow a size",
			 L->s->w ? L->s->w->rank : 0, elems, dps_wtype_name(L->s->wt));
		L->rc = -ENOMEM;
		return NULL;
	}
	p = dps_alloc_huge(elems * esz);
	if (!p) {
		snprintf(L->err, L->errlen, "rank %d: cannot allocate %zu bytes of weights",
			 L->s->w ? L->s->w->rank : 0, elems * esz);
		L->rc = -ENOMEM;
		return NULL;
	}
	L->s->bytes[part] += elems * esz;
	return p;
}

void dps_shard_load_range_w(struct dps_shard_loader *L, const char *name, uint64_t d0,
			    uint64_t d1, int dim, int64_t first, uint64_t n, void *dst)
{
	const uint64_t shape[2] = { d0, d1 };

	if (L->rc)
		return;
	if (L->s->wt == DPS_WT_BF16)
		L->rc = dps_ckpt_load_range_bf16(&L->ck, name, 2, shape, dim, first, n, dst, L->err,
						 L->errlen);
	else
		L->rc = dps_ckpt_load_range(&L->ck, name, 2, shape, dim, first, n, dst, L->err,
					    L->errlen);
}

/* ---- the rank-override loaders -------------------------------------------------------------- */

void dps_shard_load_rows_of_rank(struct dps_shard_loader *L, const char *name, uint64_t d0,
				 uint64_t d1, int rank, uint64_t per, void *dst)
{
	dps_shard_load_range_w(L, name, d0, d1, 0, (int64_t)rank * (int64_t)per, per, dst);
}

void dps_shard_load_cols_of_rank(struct dps_shard_loader *L, const char *name, uint64_t rows,
				 uint64_t cols, int rank, int per, void *dst)
{
	dps_shard_load_range_w(L, name, rows, cols, 1, (int64_t)rank * per, (uint64_t)per, dst);
}
