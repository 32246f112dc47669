/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/load_attn.c - what the families add to a layer's attention, loaded with the
 * layer (load.c): the q/k/v and o biases, Qwen3's q/k norms, GPT-OSS's sinks, the window.
 */
#include <stdint.h>
#include <stdio.h>

#include "engine/model/model_config.h"
#include "engine/shard/shard.h"
#include "engine/shard/shard_int.h"

/*
 * The biases of q/k/v (sharded with their rows, in both layouts) and of o (on the rank of
 * group rank 0), Qwen3's q/k norms, GPT-OSS's sinks of this TP position's heads, the window.
 */
void dps_shard_load_attn_extras(struct dps_shard_loader *L, int l)
{
	struct dps_shard *s = L->s;
	struct dps_shard_layer *w = &s->layers[l];
	const struct dps_model_config *c = &s->cfg;
	const uint64_t dim = (uint64_t)c->hidden_size, hd = (uint64_t)s->hd;
	const uint64_t qd = (uint64_t)c->num_attention_heads * hd;
	const uint64_t kvd = (uint64_t)c->num_key_value_heads * hd;
	const int e = dps_shard_attn_rank(s), ca = s->c[DPS_COMP_ATTN];
	char nq[96], nk[96], nv[96], no[96];

	w->window = dps_cfg_layer_window(c, l) ? c->sliding_window : 0;
	if (c->qkv_bias) {
		const uint64_t hq = (uint64_t)s->hq_t * hd;

		dps_shard_lname(s, nq, sizeof(nq), l, "self_attn.q_proj.bias");
		dps_shard_lname(s, nk, sizeof(nk), l, "self_attn.k_proj.bias");
		dps_shard_lname(s, nv, sizeof(nv), l, "self_attn.v_proj.bias");
		if (s->decode_only && ca > 1) {
			/* only the K/V biases of wkv_d's rows (with K/V by TP rank) */
			w->bkv_d = s->kv_by_eff ? NULL
						: dps_shard_alloc_part(L, DPS_PART_ATTN_DECODE,
								       2 * (size_t)s->nkv_t * hd);
			for (int k = 0; w->bkv_d && k < s->nkv_t; k++) {
				dps_shard_load_vec_range(L, nk, kvd, (int64_t)s->kv_t[k] * (int64_t)hd,
							 hd, w->bkv_d + (uint64_t)k * hd);
				dps_shard_load_vec_range(L, nv, kvd, (int64_t)s->kv_t[k] * (int64_t)hd,
							 hd, w->bkv_d + (uint64_t)(s->nkv_t + k) * hd);
			}
		} else {
			w->bqkv_p = dps_shard_alloc_part(L, DPS_PART_ATTN_PREFILL,
							 (size_t)(s->hq_t + 2 * s->nkv_t) * hd);
		}
		if (w->bqkv_p) {
			dps_shard_load_vec_range(L, nq, qd, (int64_t)s->t * (int64_t)hq, hq, w->bqkv_p);
			for (int k = 0; k < s->nkv_t; k++) {
				float *kb = w->bqkv_p + hq + (uint64_t)k * hd;

				dps_shard_load_vec_range(L, nk, kvd, (int64_t)s->kv_t[k] * (int64_t)hd,
							 hd, kb);
				dps_shard_load_vec_range(L, nv, kvd, (int64_t)s->kv_t[k] * (int64_t)hd,
							 hd, kb + (uint64_t)s->nkv_t * hd);
			}
		}
		if (ca > 1) {
			const uint64_t qe = (uint64_t)s->hq_e * hd, ke = (uint64_t)s->nkv_e * hd;

			w->bq_d = dps_shard_alloc_part(L, DPS_PART_ATTN_DECODE, qe + 2 * ke);
			if (w->bq_d)
				dps_shard_load_vec_range(L, nq, qd, (int64_t)e * (int64_t)qe, qe, w->bq_d);
			if (w->bq_d && s->kv_by_eff) {
				dps_shard_load_vec_range(L, nk, kvd, (int64_t)e * (int64_t)ke, ke,
							 w->bq_d + qe);
				dps_shard_load_vec_range(L, nv, kvd, (int64_t)e * (int64_t)ke, ke,
							 w->bq_d + qe + ke);
			}
		}
	}
	if (c->o_bias) {
		dps_shard_lname(s, no, sizeof(no), l, "self_attn.o_proj.bias");
		if (s->t == 0 && !(s->decode_only && ca > 1)) {
			w->bo_p = dps_shard_alloc_part(L, DPS_PART_ATTN_PREFILL, dim);
			if (w->bo_p)
				dps_shard_load_whole(L, no, dim, w->bo_p);
		}
		if (ca > 1 && dps_shard_comp_rank(s, DPS_COMP_ATTN) == 0) {
			w->bo_d = dps_shard_alloc_part(L, DPS_PART_ATTN_DECODE, dim);
			if (w->bo_d)
				dps_shard_load_whole(L, no, dim, w->bo_d);
		}
	}
	if (c->qk_norm) {
		dps_shard_lname(s, nq, sizeof(nq), l, "self_attn.q_norm.weight");
		dps_shard_lname(s, nk, sizeof(nk), l, "self_attn.k_norm.weight");
		w->q_norm = dps_shard_alloc_part(L, DPS_PART_NORMS, hd);
		w->k_norm = dps_shard_alloc_part(L, DPS_PART_NORMS, hd);
		if (w->q_norm && w->k_norm) {
			dps_shard_load_whole(L, nq, hd, w->q_norm);
			dps_shard_load_whole(L, nk, hd, w->k_norm);
		}
	}
	if (c->attn_sinks) {
		dps_shard_lname(s, nq, sizeof(nq), l, "self_attn.sinks");
		/* both graphs read them (this TP position's heads): counted with the norms */
		w->sinks = dps_shard_alloc_part(L, DPS_PART_NORMS, (size_t)s->hq_t);
		if (w->sinks)
			dps_shard_load_vec_range(L, nq, (uint64_t)c->num_attention_heads,
						 (int64_t)s->t * s->hq_t, (uint64_t)s->hq_t, w->sinks);
	}
}
