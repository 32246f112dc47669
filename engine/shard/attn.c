/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/attn.c - attention on the shards (see shard.h): RoPE, the KV cache write and the
 * paged attention of this TP position's heads over the rank's threads; the prefill (plain TP)
 * and the decode (component group, with the all-to-alls over the attention column) forms.
 * Called by step.c and draft.c once per layer of every step.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/shard/kv.h"
#include "engine/shard/shard_int.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/pool.h"


struct attn_job {
	struct dps_shard *s;
	int n, layer;
	const int *pos;
	const int *const *table;
	const float *q;  /* (n, q_stride): this TP position's hq_t heads, roped */
	size_t q_stride;
	float *out;      /* (n, hq_t * hd) */
	int chunks;
	int group; /* heads a slice is a multiple of (a divisor of hq_t, <= DPS_ATTN_HEADS) */
};

static void attn_chunk(void *arg, int chunk, int tid)
{
	const struct attn_job *j = arg;
	struct dps_shard *s = j->s;
	const int hd = s->hd, hq = s->hq_t;
	const size_t kv = (size_t)s->nkv_t * (size_t)hd, bstride = (size_t)s->block_size * kv;
	float *scratch = s->scores + (size_t)tid * DPS_ATTN_HEADS * (size_t)s->max_pos;
	int lo, hi;

	dps_pool_split(j->n * hq, j->group, chunk, j->chunks, &lo, &hi);
	/* up to DPS_ATTN_HEADS heads of one row at a time, which read the cache together */
	for (int item = lo; item < hi;) {
		const int i = item / hq, h0 = item % hq;
		const int left = hq - h0 < hi - item ? hq - h0 : hi - item;
		const int nh = left < DPS_ATTN_HEADS ? left : DPS_ATTN_HEADS;
		float *out = j->out + (size_t)i * (size_t)hq * (size_t)hd + (size_t)h0 * (size_t)hd;
		size_t off[DPS_ATTN_HEADS];

		item += nh;
		if (!j->table[i]) { /* a padding row reads nothing */
			memset(out, 0, sizeof(float) * (size_t)nh * (size_t)hd);
			continue;
		}
		for (int x = 0; x < nh; x++)
			off[x] = (size_t)s->q2kv[h0 + x] * (size_t)hd;
		{
			const struct dps_shard_layer *w = &s->layers[j->layer];
			const size_t base = dps_kv_offset(j->layer, s->num_blocks, s->block_size, 0, kv);
			const int n_pos = j->pos[i] + 1;
			/* a window layer reads its last `window` positions only */
			const int first = w->window && n_pos > w->window ? n_pos - w->window : 0;

			dps_attention_paged_heads(
				out, (size_t)hd, j->q + (size_t)i * j->q_stride + (size_t)h0 * (size_t)hd,
				(size_t)hd, nh, off, s->key_cache + base, s->value_cache + base,
				j->table[i], s->block_size, bstride, first, n_pos, hd, kv,
				w->sinks ? w->sinks + h0 : NULL, scratch, (size_t)s->max_pos);
		}
	}
}

/*
 * The attention of this replica's n rows with this TP position's heads: q (n, q_stride) holds
 * hq_t heads, k and v (n, k_stride) nkv_t heads each, all before RoPE. Ropes, writes the cache
 * (not for padding rows), and leaves (n, hq_t * hd) in out.
 */
static void attend(struct dps_shard *s, int layer, const struct dps_rows *r, float *q,
		   size_t q_stride, float *k, float *v, size_t k_stride, float *out)
{
	const int hd = s->hd, n = r->n;
	const int *pos = r->pos;
	const size_t kv = (size_t)s->nkv_t * (size_t)hd;
	struct attn_job j = { s, n, layer, pos, r->table, q, q_stride, out, 1, 1 };
	const int items = n * s->hq_t, most = 8 * dps_pool_size(dps_gemm_pool());

	const struct dps_shard_layer *w = &s->layers[layer];
	const float eps = (float)s->cfg.rms_norm_eps;

	for (int i = 0; i < n; i++) {
		float *cs = s->cs + (size_t)i * (size_t)hd;

		if (w->q_norm) { /* Qwen3: each head normed over head_dim before RoPE */
			for (int h = 0; h < s->hq_t; h++) {
				float *x = q + (size_t)i * q_stride + (size_t)h * (size_t)hd;

				dps_rmsnorm(x, x, w->q_norm, hd, eps);
			}
			for (int h = 0; h < s->nkv_t; h++) {
				float *x = k + (size_t)i * k_stride + (size_t)h * (size_t)hd;

				dps_rmsnorm(x, x, w->k_norm, hd, eps);
			}
		}
		dps_rope_table_freqs(cs, hd, pos[i], s->inv_freq, s->rope_attn);
		dps_rope(q + (size_t)i * q_stride, s->hq_t, hd, cs);
		dps_rope(k + (size_t)i * k_stride, s->nkv_t, hd, cs);
		if (r->slot[i] >= 0) { /* DPS_PAD_SLOT writes nothing */
			const size_t at = dps_kv_offset(layer, s->num_blocks, s->block_size,
							r->slot[i], kv);

			memcpy(s->key_cache + at, k + (size_t)i * k_stride, sizeof(float) * kv);
			memcpy(s->value_cache + at, v + (size_t)i * k_stride, sizeof(float) * kv);
		}
	}
	/*
	 * Slices of whole groups of heads, so that the heads of a group read the cache together
	 * (dps_attention_paged_heads), as large as leaves two slices a thread: 12 heads of a row
	 * are three groups of 4 on one thread, four of 3 on two.
	 */
	for (j.group = DPS_ATTN_HEADS; j.group > 1; j.group--)
		if (s->hq_t % j.group == 0 && items / j.group >= 2 * dps_pool_size(dps_gemm_pool()))
			break;
	j.chunks = items / j.group < most ? items / j.group : most;
	if (dps_pool_size(dps_gemm_pool()) <= s->score_threads) {
		dps_pool_run(dps_gemm_pool(), j.chunks, attn_chunk, &j);
	} else { /* more threads than at load: one scratch row, one thread */
		for (int c = 0; c < j.chunks; c++)
			attn_chunk(&j, c, 0);
	}
}

/* Prefill attention (plain TP) of n own rows h; the partial o (n, hidden) before the all-reduce. */
void dps_shard_attn_prefill(struct dps_shard *s, int l, const struct dps_rows *r, const float *h,
			    float *o)
   {
	const int n = r->n;
	const struct dps_shard_layer *w = &s->layers[l];
	const int dim = s->cfg.hidden_size, hd = s->hd;
	const size_t width = (size_t)(s->hq_t + 2 * s->nkv_t) * (size_t)hd;
	float *q = s->qkv;

	dps_shard_linear(s, q, h, w->wqkv_p, n, (int)width, s->qkv_in);
	if (w->bqkv_p)
		dps_add_bias(q, w->bqkv_p, n, (int)width);
	attend(s, l, r, q, width, q + (size_t)s->hq_t * hd,
	       q + (size_t)(s->hq_t + s->nkv_t) * hd, width, s->att);
	dps_shard_linear(s, o, s->att, w->wo_p, n, dim, s->hq_t * hd);
	if (w->bo_p) /* TP rank 0 only: the all-reduce adds it once */
		dps_add_bias(o, w->bo_p, n, dim);
}

/*
 * Decode attention with c_attn > 1 on R = B * c rows gathered over the attention column (block
 * j' from replica j'). Each rank projects its effective rank's query heads (and, by effective
 * rank, KV heads) for every row; an all-to-all over the column hands each replica's rows to its
 * own rank, which holds their KV cache and computes attention for the heads of its TP position;
 * a second all-to-all returns each head block to the rank whose O shard it meets.
 */
int dps_shard_attn_decode(struct dps_shard *s, int l, const struct dps_rows *r, const float *h,
			  float *o)
   {
	const int B = r->n;
	const struct dps_shard_layer *w = &s->layers[l];
	const int dim = s->cfg.hidden_size, hd = s->hd, ca = s->c[DPS_COMP_ATTN];
	const int j = s->j[DPS_COMP_ATTN], R = B * ca;
	const size_t we = (size_t)(s->hq_e + 2 * s->nkv_e) * (size_t)hd; /* per row, per rank */
	const size_t wt = (size_t)(s->hq_t + 2 * s->nkv_t) * (size_t)hd; /* per row, TP position */
	const size_t qe = (size_t)s->hq_e * (size_t)hd;
	float *proj = s->qkv, *mine = s->qkv + (size_t)s->max_gather * wt;
	size_t sc[DPS_MAX_WORLD], rc_[DPS_MAX_WORLD];
	int rc;

	/* proj (R, we): q [k v] of the effective rank's heads for every gathered row. */
	dps_shard_linear(s, proj, h, w->wq_d, R, (int)we, dim);
	if (w->bq_d)
		dps_add_bias(proj, w->bq_d, R, (int)we);
	for (int q = 0; q < ca; q++)
		sc[q] = rc_[q] = (size_t)B * we;
	dps_shard_count(s, DPS_COLL_ALLTOALL, DPS_SG_ATTN_COL, (size_t)R * we * sizeof(float));
	/* recv (c, B, we) into att2 as scratch: block j'' = rank j'''s heads for my rows. */
	rc = dps_coll_alltoallv(s->col_c[DPS_COMP_ATTN], proj, sc, NULL, s->att2, rc_, NULL,
				DPS_F32);
	if (rc)
		return rc;
	/* mine (B, wt): this TP position's q heads in effective-rank order, then k, then v. */
	for (int i = 0; i < B; i++) {
		float *row = mine + (size_t)i * wt;

		for (int q = 0; q < ca; q++) {
			const float *src = s->att2 + ((size_t)q * (size_t)B + (size_t)i) * we;

			memcpy(row + (size_t)q * qe, src, sizeof(float) * qe);
			if (s->kv_by_eff) {
				const size_t ke = (size_t)s->nkv_e * (size_t)hd;

				memcpy(row + (size_t)s->hq_t * hd + (size_t)q * ke, src + qe,
				       sizeof(float) * ke);
				memcpy(row + (size_t)(s->hq_t + s->nkv_t) * hd + (size_t)q * ke,
				       src + qe + ke, sizeof(float) * ke);
			}
		}
	}
	if (!s->kv_by_eff) {
		/* K and V by TP rank: project this replica's own rows only. */
		const size_t kvw = 2 * (size_t)s->nkv_t * (size_t)hd;
		float *kvo = s->att; /* scratch (B, kvw) */

		dps_shard_linear(s, kvo, h + (size_t)j * (size_t)B * (size_t)dim,
				 w->wkv_d ? w->wkv_d
					  : dps_shard_wrow(w->wqkv_p, s->wt,
							   (size_t)s->hq_t * (size_t)hd, dim),
				 B, (int)kvw, dim);
		if (w->bkv_d)
			dps_add_bias(kvo, w->bkv_d, B, (int)kvw);
		else if (w->bqkv_p)
			dps_add_bias(kvo, w->bqkv_p + (size_t)s->hq_t * hd, B, (int)kvw);
		for (int i = 0; i < B; i++)
			memcpy(mine + (size_t)i * wt + (size_t)s->hq_t * hd, kvo + (size_t)i * kvw,
			       sizeof(float) * kvw);
	}
	attend(s, l, r, mine, wt, mine + (size_t)s->hq_t * hd,
	       mine + (size_t)(s->hq_t + s->nkv_t) * hd, wt, s->att);
	/* Back: block j'' of my rows' outputs (its heads) goes to rank j''. */
	for (int q = 0; q < ca; q++)
		for (int i = 0; i < B; i++)
			memcpy(s->att2 + ((size_t)q * (size_t)B + (size_t)i) * qe,
			       s->att + (size_t)i * (size_t)s->hq_t * hd + (size_t)q * qe,
			       sizeof(float) * qe);
	for (int q = 0; q < ca; q++)
		sc[q] = rc_[q] = (size_t)B * qe;
	dps_shard_count(s, DPS_COLL_ALLTOALL, DPS_SG_ATTN_COL, (size_t)R * qe * sizeof(float));
	rc = dps_coll_alltoallv(s->col_c[DPS_COMP_ATTN], s->att2, sc, NULL, s->att, rc_, NULL,
				DPS_F32);
	if (rc)
		return rc;
	/* att (R, qe): my heads for every gathered row, in gathered order. */
	dps_shard_linear(s, o, s->att, w->wo_d, R, dim, (int)qe);
	if (w->bo_d) /* attention group rank 0 only */
		dps_add_bias(o, w->bo_d, R, dim);
	return 0;
}

