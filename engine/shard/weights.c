/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/weights.c - how a rank holds its linear weights (see shard.h, --dtype and
 * --quantization): the type chosen at load (f32, BF16 at half the bytes, or INT8 blocks at
 * 34 bytes per 32, quantized one matrix at a time as soon as it is read), their allocation,
 * and the rank-override loaders that read a component's rows or columns of a tensor. Called by load.c,
 * load_moe.c and draft.c, once per rank at start-up.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/shard/shard_int.h"
#include "kernels/q8.h"

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

int dps_shard_choose_wt(struct dps_shard_loader *L, enum dps_shard_dtype d,
			enum dps_shard_quant q)
{
	struct dps_shard *s = L->s;
	const int int8_ckpt = L->ck.cfg.int8;
	enum dps_wtype t;

	switch (d) {
	case DPS_SHARD_DTYPE_AUTO:
		t = dps_ckpt_weights_bf16(&L->ck) ? DPS_WT_BF16 : DPS_WT_F32;
		break;
	case DPS_SHARD_DTYPE_F32:
		t = DPS_WT_F32;
		break;
	case DPS_SHARD_DTYPE_BF16:
		t = DPS_WT_BF16;
		break;
	default:
		snprintf(L->err, L->errlen, "--dtype: unknown choice %d", (int)d);
		return -EINVAL;
	}
	s->wt = s->wt_emb = t;
	if (q == DPS_SHARD_QUANT_INT8 || (int8_ckpt && d != DPS_SHARD_DTYPE_F32)) {
		/*
		 * The linear weights INT8; --dtype says how the embedding and the router are held.
		 * An INT8 checkpoint's weights with --dtype bf16 would be rounded: refused.
		 */
		if (int8_ckpt && q != DPS_SHARD_QUANT_INT8 && d == DPS_SHARD_DTYPE_BF16) {
			snprintf(L->err, L->errlen, "%s: its linear weights are INT8 (dpshard_int8); "
				 "they are held as INT8, or as f32 with --dtype f32, not as BF16",
				 L->ck.dir);
			return -EINVAL;
		}
		s->wt = DPS_WT_Q8;
	}
	return 0;
}

void *dps_shard_alloc_t(struct dps_shard_loader *L, enum dps_shard_part part, size_t elems,
			enum dps_wtype t)
{
	const size_t esz = dps_wtype_size(t);
	void *p;

	if (L->rc)
		return NULL;
	if (elems > SIZE_MAX / esz) {
		snprintf(L->err, L->errlen, "rank %d: %zu weights of %s overflow a size",
			 L->s->w ? L->s->w->rank : 0, elems, dps_wtype_name(t));
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

void *dps_shard_alloc_w(struct dps_shard_loader *L, enum dps_shard_part part, size_t elems)
{
	return dps_shard_alloc_t(L, part, elems, dps_shard_wt_load(L->s));
}

void dps_shard_quantize_w(struct dps_shard_loader *L, enum dps_shard_part part, void **W,
			  size_t n, int k)
{
	void *q;

	if (L->rc || L->s->wt != DPS_WT_Q8 || !*W)
		return;
	q = dps_alloc_huge(dps_q8_bytes(n, k));
	if (!q) {
		snprintf(L->err, L->errlen, "rank %d: cannot allocate %zu bytes of INT8 weights",
			 L->s->w ? L->s->w->rank : 0, dps_q8_bytes(n, k));
		L->rc = -ENOMEM;
		return;
	}
	dps_q8_quantize_rows(q, k, *W, n);
	free(*W);
	*W = q;
	L->s->bytes[part] += dps_q8_bytes(n, k);
	L->s->bytes[part] -= n * (size_t)k * sizeof(float);
}

void dps_shard_load_range_t(struct dps_shard_loader *L, const char *name, uint64_t d0,
			    uint64_t d1, int dim, int64_t first, uint64_t n, void *dst,
			    enum dps_wtype t)
{
	const uint64_t shape[2] = { d0, d1 };

	if (L->rc)
		return;
	if (t == DPS_WT_BF16)
		L->rc = dps_ckpt_load_range_bf16(&L->ck, name, 2, shape, dim, first, n, dst, L->err,
						 L->errlen);
	else
		L->rc = dps_ckpt_load_range(&L->ck, name, 2, shape, dim, first, n, dst, L->err,
					    L->errlen);
}

void dps_shard_load_range_w(struct dps_shard_loader *L, const char *name, uint64_t d0,
			    uint64_t d1, int dim, int64_t first, uint64_t n, void *dst)
{
	dps_shard_load_range_t(L, name, d0, d1, dim, first, n, dst, dps_shard_wt_load(L->s));
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
