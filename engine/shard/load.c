/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/load.c - one rank's shards of a checkpoint (see shard.h): the component groups
 * a rank belongs to, the geometry of its attention, vocabulary and MLP shards, each tensor read
 * with the component group's rank in place of the TP rank, and the scratch of a step. Called
 * once per rank at start-up.
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

static const char *const part_names[DPS_PART_COUNT] = {
	"embedding (prefill, TP)", "embedding (decode, TP x c)", "attention (prefill, TP)",
	"attention (decode, TP x c)", "MLP (TP x c)", "LM head (prefill, TP)",
	"LM head (decode, TP x c)", "norms", "MoE router and experts",
};

const char *dps_shard_part_name(enum dps_shard_part p)
{
	return p < DPS_PART_COUNT ? part_names[p] : "?";
}

static const char *const sg_names[DPS_SG_COUNT] = {
	"attention group", "attention column", "embedding group", "embedding column", "MLP group",
	"MLP column", "LM-head group", "LM-head column", "TP", "DP", "expert dispatch",
};

const char *dps_shard_group_name(int sg)
{
	return sg >= 0 && sg < DPS_SG_COUNT ? sg_names[sg] : "?";
}

static int round_up(int a, int b)
{
	return (a + b - 1) / b * b;
}

int dps_shard_check(const struct dps_model_config *cfg, const struct dps_par_cfg *par, char *err,
		    size_t errlen)
{
	const long ep = (long)par->tp * par->dp;

	if (par->ep && !cfg->num_local_experts) {
		snprintf(err, errlen, "--enable-expert-parallel: this model has no experts (it is "
			 "not a mixture-of-experts model)");
		return -DPS_ECONFIG;
	}
	if (par->ep && cfg->num_local_experts % ep) {
		snprintf(err, errlen, "--enable-expert-parallel places the model's %d experts in equal "
			 "blocks over the EP group of --tensor-parallel-size %d x "
			 "--data-parallel-size %d = %ld ranks: %d does not divide by %ld",
			 cfg->num_local_experts, par->tp, par->dp, ep, cfg->num_local_experts, ep);
		return -DPS_ECONFIG;
	}
	if ((long)par->tp * par->attn_dp > cfg->num_attention_heads) {
		snprintf(err, errlen, "--tensor-parallel-size %d x --attention-dp-size %d = %d is more "
			 "than the model's %d query heads", par->tp, par->attn_dp,
			 par->tp * par->attn_dp, cfg->num_attention_heads);
		return -DPS_ECONFIG;
	}
	return 0;
}

float *dps_shard_alloc_part(struct dps_shard_loader *L, enum dps_shard_part part, size_t floats)
{
	float *p;

	if (L->rc)
		return NULL;
	p = dps_shard_weights_alloc(L->s, floats * sizeof(float));
	if (!p) {
		snprintf(L->err, L->errlen, "rank %d: cannot allocate %zu bytes of weights",
			 L->s->w ? L->s->w->rank : 0, floats * sizeof(float));
		L->rc = -ENOMEM;
		return NULL;
	}
	L->s->bytes[part] += floats * sizeof(float);
	return p;
}

void dps_shard_load_range(struct dps_shard_loader *L, const char *name, uint64_t d0, uint64_t d1,
			  int dim, int64_t first, uint64_t n, float *dst)
{
	const uint64_t shape[2] = { d0, d1 };

	if (!L->rc)
		L->rc = dps_ckpt_load_range(&L->ck, name, 2, shape, dim, first, n, dst, L->err,
					    L->errlen);
}

void dps_shard_load_whole(struct dps_shard_loader *L, const char *name, uint64_t n, float *dst)
{
	const uint64_t shape[1] = { n };

	if (!L->rc)
		L->rc = dps_ckpt_load_range(&L->ck, name, 1, shape, 0, 0, n, dst, L->err, L->errlen);
}

void dps_shard_load_vec_range(struct dps_shard_loader *L, const char *name, uint64_t n,
			      int64_t first, uint64_t count, float *dst)
{
	const uint64_t shape[1] = { n };

	if (!L->rc)
		L->rc = dps_ckpt_load_range(&L->ck, name, 1, shape, 0, first, count, dst, L->err,
					    L->errlen);
}

static void attention_geometry(struct dps_shard *s)
{
	const struct dps_model_config *c = &s->cfg;
	const int ca = s->c[DPS_COMP_ATTN], tp = s->par.tp;
	const int heads = c->num_attention_heads, kvh = c->num_key_value_heads;
	const int group = heads / kvh;

	s->hd = c->head_dim;
	s->heads_p = round_up(heads, tp * ca);
	s->hq_t = s->heads_p / tp;
	s->hq_e = s->hq_t / ca;
	s->kv_by_eff = ca > 1 && kvh % (tp * ca) == 0;
	s->nkv_e = s->kv_by_eff ? kvh / (tp * ca) : 0;
	s->kv_t = calloc((size_t)(s->hq_t + 1), sizeof(int));
	s->q2kv = calloc((size_t)(s->hq_t + 1), sizeof(int));
	s->nkv_t = 0;
	if (!s->kv_t || !s->q2kv)
		return;
	/* The KV heads this TP position's query heads read, in order (padding heads read kv_t[0]):
	 * kv.c's rule, which the disaggregated hand-off's relay plan follows too. */
	s->nkv_t = dps_kv_heads_of(heads, kvh, tp, ca, s->t, s->kv_t);
	DPS_ASSERT(s->nkv_t > 0);
	for (int i = 0; i < s->hq_t; i++) {
		const int h = s->t * s->hq_t + i;
		int k = 0;

		if (h >= heads)
			continue;
		while (s->kv_t[k] != h / group)
			k++;
		s->q2kv[i] = k;
	}
}

/* Layer l's tensor name: "model.layers.<l>.<suffix>", or "midlayer.<suffix>" in a draft. */
void dps_shard_lname(const struct dps_shard *s, char *buf, size_t len, int l, const char *suffix)
{
	if (s->draft)
		snprintf(buf, len, "midlayer.%s", suffix);
	else
		snprintf(buf, len, "model.layers.%d.%s", l, suffix);
}

static void load_layer(struct dps_shard_loader *L, int l)
{
	struct dps_shard *s = L->s;
	struct dps_shard_layer *w = &s->layers[l];
	const struct dps_model_config *c = &s->cfg;
	const uint64_t dim = (uint64_t)c->hidden_size, im = (uint64_t)c->intermediate_size;
	const uint64_t qd = (uint64_t)c->num_attention_heads * (uint64_t)s->hd;
	const uint64_t kvd = (uint64_t)c->num_key_value_heads * (uint64_t)s->hd;
	const uint64_t qin = (uint64_t)s->qkv_in; /* 2 * hidden for an Eagle3 draft */
	const int hd = s->hd, t = s->t, ca = s->c[DPS_COMP_ATTN];
	const int e = dps_shard_attn_rank(s), gm = dps_shard_comp_rank(s, DPS_COMP_MLP);
	const size_t rows_p = (size_t)(s->hq_t + 2 * s->nkv_t) * (size_t)hd;
	const enum dps_wtype lt = s->wt;
	char nq[96], nk[96], nv[96], no[96], ng[96], nu[96], nd[96], n1[96], n2[96];

	dps_shard_lname(s, nq, sizeof(nq), l, "self_attn.q_proj.weight");
	dps_shard_lname(s, nk, sizeof(nk), l, "self_attn.k_proj.weight");
	dps_shard_lname(s, nv, sizeof(nv), l, "self_attn.v_proj.weight");
	dps_shard_lname(s, no, sizeof(no), l, "self_attn.o_proj.weight");
	dps_shard_lname(s, ng, sizeof(ng), l, "mlp.gate_proj.weight");
	dps_shard_lname(s, nu, sizeof(nu), l, "mlp.up_proj.weight");
	dps_shard_lname(s, nd, sizeof(nd), l, "mlp.down_proj.weight");
	dps_shard_lname(s, n1, sizeof(n1), l, "input_layernorm.weight");
	dps_shard_lname(s, n2, sizeof(n2), l, "post_attention_layernorm.weight");

	w->attn_norm = dps_shard_alloc_part(L, DPS_PART_NORMS, dim);
	w->ffn_norm = dps_shard_alloc_part(L, DPS_PART_NORMS, dim);
	if (w->attn_norm && w->ffn_norm) {
		dps_shard_load_whole(L, n1, dim, w->attn_norm);
		dps_shard_load_whole(L, n2, dim, w->ffn_norm);
	}
	/* Prefill (plain TP): this TP position's query heads, then the KV heads they read. A
	 * decode-only rank with c_attn > 1 holds only what its decode reads: with K/V by TP
	 * rank, those K/V rows. */
	if (s->decode_only && ca > 1) {
		if (!s->kv_by_eff) {
			w->wkv_d = dps_shard_alloc_w(L, DPS_PART_ATTN_DECODE,
						     2 * (size_t)s->nkv_t * (size_t)hd, (int)dim);
			for (int k = 0; w->wkv_d && k < s->nkv_t; k++) {
				void *kr = dps_shard_wrow(w->wkv_d, lt, (size_t)k * (size_t)hd,
							  (int)dim);
				void *vr = dps_shard_wrow(kr, lt, (size_t)s->nkv_t * (size_t)hd,
							  (int)dim);

				dps_shard_load_rows_of_rank(L, nk, kvd, dim, s->kv_t[k], (uint64_t)hd,
							    kr);
				dps_shard_load_rows_of_rank(L, nv, kvd, dim, s->kv_t[k], (uint64_t)hd,
							    vr);
			}
		}
	} else {
		w->wqkv_p = dps_shard_alloc_w(L, DPS_PART_ATTN_PREFILL, rows_p, (int)qin);
		w->wo_p = dps_shard_alloc_w(L, DPS_PART_ATTN_PREFILL, dim, s->hq_t * hd);
	}
	if (w->wqkv_p && w->wo_p) {
		dps_shard_load_rows_of_rank(L, nq, qd, qin, t, (uint64_t)s->hq_t * (uint64_t)hd,
					    w->wqkv_p);
		for (int k = 0; k < s->nkv_t; k++) {
			void *kr = dps_shard_wrow(w->wqkv_p, lt, ((size_t)s->hq_t + (size_t)k) * (size_t)hd,
						  (int)qin);
			void *vr = dps_shard_wrow(kr, lt, (size_t)s->nkv_t * (size_t)hd, (int)qin);

			/* The KV heads by their ids, not by a rank. */
			dps_shard_load_rows_of_rank(L, nk, kvd, qin, s->kv_t[k], (uint64_t)hd, kr);
			dps_shard_load_rows_of_rank(L, nv, kvd, qin, s->kv_t[k], (uint64_t)hd, vr);
		}
		dps_shard_load_cols_of_rank(L, no, dim, qd, t, s->hq_t * hd, w->wo_p);
	}
	/* Decode with c_attn > 1: the effective rank's query heads [and KV heads]. */
	if (ca > 1) {
		const size_t rows_d = (size_t)(s->hq_e + 2 * s->nkv_e) * (size_t)hd;

		w->wq_d = dps_shard_alloc_w(L, DPS_PART_ATTN_DECODE, rows_d, (int)dim);
		w->wo_d = dps_shard_alloc_w(L, DPS_PART_ATTN_DECODE, dim, s->hq_e * hd);
		if (w->wq_d && w->wo_d) {
			dps_shard_load_rows_of_rank(L, nq, qd, dim, e, (uint64_t)s->hq_e * (uint64_t)hd,
						    w->wq_d);
			if (s->kv_by_eff) {
				void *kr = dps_shard_wrow(w->wq_d, lt, (size_t)s->hq_e * (size_t)hd,
							  (int)dim);
				void *vr = dps_shard_wrow(kr, lt, (size_t)s->nkv_e * (size_t)hd, (int)dim);

				dps_shard_load_rows_of_rank(L, nk, kvd, dim, e,
							    (uint64_t)s->nkv_e * (uint64_t)hd, kr);
				dps_shard_load_rows_of_rank(L, nv, kvd, dim, e,
							    (uint64_t)s->nkv_e * (uint64_t)hd, vr);
			}
			dps_shard_load_cols_of_rank(L, no, dim, qd, e, s->hq_e * hd, w->wo_d);
		}
	}
	dps_shard_load_attn_extras(L, l);
	if (dps_cfg_layer_moe(c, l)) {
		dps_shard_load_experts(L, l);
		return;
	}
	/* MLP over TP x c_mlp with the group rank j*TP + t: gate and up rows, down columns. */
	w->w_gate_up = dps_shard_alloc_w(L, DPS_PART_MLP, 2 * (size_t)s->im_sh, (int)dim);
	w->w_down = dps_shard_alloc_w(L, DPS_PART_MLP, dim, s->im_sh);
	if (w->w_gate_up && w->w_down) {
		dps_shard_load_rows_of_rank(L, ng, im, dim, gm, (uint64_t)s->im_sh, w->w_gate_up);
		dps_shard_load_rows_of_rank(L, nu, im, dim, gm, (uint64_t)s->im_sh,
					    dps_shard_wrow(w->w_gate_up, lt, (size_t)s->im_sh, (int)dim));
		dps_shard_load_cols_of_rank(L, nd, dim, im, gm, s->im_sh, w->w_down);
	}
	if (c->mlp_bias) {
		dps_shard_lname(s, ng, sizeof(ng), l, "mlp.gate_proj.bias");
		dps_shard_lname(s, nu, sizeof(nu), l, "mlp.up_proj.bias");
		dps_shard_lname(s, nd, sizeof(nd), l, "mlp.down_proj.bias");
		w->b_gate_up = dps_shard_alloc_part(L, DPS_PART_MLP, 2 * (size_t)s->im_sh);
		if (w->b_gate_up) {
			dps_shard_load_vec_range(L, ng, im, (int64_t)gm * s->im_sh,
						 (uint64_t)s->im_sh, w->b_gate_up);
			dps_shard_load_vec_range(L, nu, im, (int64_t)gm * s->im_sh,
						 (uint64_t)s->im_sh, w->b_gate_up + s->im_sh);
		}
		if (gm == 0) {
			w->b_down = dps_shard_alloc_part(L, DPS_PART_MLP, dim);
			if (w->b_down)
				dps_shard_load_whole(L, nd, dim, w->b_down);
		}
	}
}

/*
 * The vocabulary rows of shard `rank` (per rows each) of an embedding-shaped tensor: an
 * embedding table (held as wt_emb) or an LM head (a linear weight, quantized when INT8).
 */
static void *vocab_shard(struct dps_shard_loader *L, enum dps_shard_part part, const char *name,
			 int rank, int per)
{
	const struct dps_model_config *c = &L->s->cfg;
	const int head = part == DPS_PART_LM_PREFILL || part == DPS_PART_LM_DECODE;
	const enum dps_wtype t = head ? L->s->wt : L->s->wt_emb;
	void *p = dps_shard_alloc_t(L, part, (size_t)per, c->hidden_size, t);

	if (p)
		dps_shard_load_range_t(L, name, (uint64_t)c->vocab_size, (uint64_t)c->hidden_size,
				       0, (int64_t)rank * per, (uint64_t)per, p, t);
	return p;
}

int dps_shard_load(struct dps_shard *s, struct dps_world *w, const struct dps_par_cfg *par,
		   const char *dir, const struct dps_shard_opts *opts, char *err, size_t errlen)
{
	struct dps_shard_loader L = { .s = s, .err = err, .errlen = errlen };
	struct dps_model_config *c = &s->cfg;
	const struct dps_shard *T = opts ? opts->target : NULL;
	struct dps_par_cfg dpar;
	const char *head;
	int maxc = 1, tp = par->tp, rc, moe_fail = 0;
	size_t kv, cache, g, wide;

	memset(s, 0, sizeof(*s));
	s->w = w;
	s->par = *par;
	s->t = w ? w->tp_rank : 0;
	s->d = w ? w->dp_rank : 0;
	s->decode_only = opts && opts->decode_only;
	rc = dps_ckpt_open(&L.ck, dir, err, errlen);
	if (rc)
		return rc;
	*c = L.ck.cfg;
	rc = dps_shard_choose_wt(&L, opts ? opts->dtype : DPS_SHARD_DTYPE_AUTO,
				 opts ? opts->quant : DPS_SHARD_QUANT_AUTO);
	if (rc)
		goto out;
	s->inv_freq = calloc((size_t)c->head_dim / 2 + 1, sizeof(float));
	if (!s->inv_freq) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	dps_cfg_rope_freqs(c, s->inv_freq, &s->rope_attn);
	if (T) {
		/* The draft: its MLP over TP x --draft-mlp-dp-size, the rest over TP. */
		rc = dps_shard_draft_config(s, T, dir, err, errlen);
		if (rc)
			goto out;
		dpar = *par;
		dpar.attn_dp = dpar.emb_dp = dpar.lm_head_dp = 1;
		dpar.mlp_dp = par->draft_mlp_dp;
		dpar.ep = 0;
		dpar.a2a = 0;
		par = &dpar;
		s->par = dpar;
	}
	s->qkv_in = (s->draft ? 2 : 1) * c->hidden_size;
	rc = dps_shard_check(c, par, err, errlen);
	if (rc)
		goto out;
	for (int k = 0; k < DPS_COMP_COUNT; k++) {
		s->c[k] = dps_par_cfg_comp_size(par, (enum dps_comp)k);
		s->j[k] = s->d % s->c[k];
		if (s->c[k] > maxc)
			maxc = s->c[k];
		if (w) {
			s->comp_c[k] = w->comp_tp_c[k];
			s->col_c[k] = w->dp_col_c[k];
		}
	}
	if (w) {
		s->tp_c = w->tp_c;
		s->dp_c = w->dp_c;
		if (s->draft) {
			s->comp_c[DPS_COMP_MLP] = w->comp_tp_c[DPS_COMP_DRAFT_MLP];
			s->col_c[DPS_COMP_MLP] = w->dp_col_c[DPS_COMP_DRAFT_MLP];
		}
	}
	attention_geometry(s);
	if (!s->kv_t || !s->q2kv) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	s->v_tp = (c->vocab_size + tp - 1) / tp;
	s->v_emb = (c->vocab_size + tp * s->c[DPS_COMP_EMB] - 1) / (tp * s->c[DPS_COMP_EMB]);
	s->v_lm = (c->vocab_size + tp * s->c[DPS_COMP_LM_HEAD] - 1) / (tp * s->c[DPS_COMP_LM_HEAD]);
	s->im_sh = (c->intermediate_size + tp * s->c[DPS_COMP_MLP] - 1) / (tp * s->c[DPS_COMP_MLP]);
	/* INT8: down's column shards start on a block of 32 (zero-padded past the end), so a
	 * rank's blocks are the one-rank model's, and an INT8 checkpoint's load whole. */
	if (s->wt == DPS_WT_Q8)
		s->im_sh = round_up(s->im_sh, 32);
	if (c->num_local_experts) {
		s->ep_n = tp * par->dp;
		s->ep_rank = s->d * tp + s->t;
		if (par->ep) {
			s->moe = par->a2a == DPS_A2A_V ? DPS_MOE_EP_A2A : DPS_MOE_EP_AG;
			s->e_per = c->num_local_experts / s->ep_n;
			s->e_lo = s->ep_rank * s->e_per;
			s->e_n = s->e_per;
			s->im_e = c->intermediate_size;
		} else {
			s->moe = DPS_MOE_TP;
			s->e_n = c->num_local_experts;
			/* MXFP4 columns of down come in blocks of 32 */
			s->im_e = c->mxfp4 ? round_up(s->im_sh, 32) : s->im_sh;
		}
	}

	/* Embedding and LM head: plain TP for prefill, the component group for decode. A draft
	 * reads the target's embedding. */
	if (!s->draft) {
		/* (a decode-only rank holds one of the two: the decode layout) */
		s->emb_p = s->decode_only && s->c[DPS_COMP_EMB] > 1 && !opts->with_draft
				   ? NULL
				   : vocab_shard(&L, DPS_PART_EMB_PREFILL,
						 "model.embed_tokens.weight", s->t, s->v_tp);
		s->emb_d = s->c[DPS_COMP_EMB] > 1
				   ? vocab_shard(&L, DPS_PART_EMB_DECODE, "model.embed_tokens.weight",
						 dps_shard_comp_rank(s, DPS_COMP_EMB), s->v_emb)
				   : s->emb_p;
	}
	head = c->tie_word_embeddings && !s->draft ? "model.embed_tokens.weight" : "lm_head.weight";
	s->lm_p = s->decode_only && s->c[DPS_COMP_LM_HEAD] > 1
			  ? NULL : vocab_shard(&L, DPS_PART_LM_PREFILL, head, s->t, s->v_tp);
	s->lm_d = s->c[DPS_COMP_LM_HEAD] > 1
			  ? vocab_shard(&L, DPS_PART_LM_DECODE, head,
					dps_shard_comp_rank(s, DPS_COMP_LM_HEAD), s->v_lm)
			  : s->lm_p;
	s->final_norm = dps_shard_alloc_part(&L, DPS_PART_NORMS, (size_t)c->hidden_size);
	if (s->final_norm)
		dps_shard_load_whole(&L, s->draft ? "norm.weight" : "model.norm.weight", (uint64_t)c->hidden_size,
				     s->final_norm);
	s->layers = calloc((size_t)c->num_hidden_layers, sizeof(*s->layers));
	if (!s->layers && !L.rc) {
		L.rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
	}
	for (int l = 0; l < c->num_hidden_layers && !L.rc; l++)
		load_layer(&L, l);
	if (s->draft)
		dps_shard_load_draft_extras(&L);
	rc = L.rc;
	if (rc)
		goto out;

	/* The KV cache of this replica's sequences, for this TP position's KV heads. */
	s->max_pos = opts && opts->max_pos > 0 && opts->max_pos < c->max_position_embeddings
			     ? opts->max_pos : c->max_position_embeddings;
	s->max_seqs = opts && opts->max_seqs > 0 ? opts->max_seqs : 1;
	s->max_rows = opts && opts->max_rows > 0 ? opts->max_rows : 1;
	s->max_gather = s->max_rows * maxc;
	/* A rank gathers other replicas' rows: every replica must size for the same max_rows. */
	if (w && w->dp > 1) {
		int *all = calloc((size_t)w->dp, sizeof(int));

		if (!all) {
			rc = -ENOMEM;
			snprintf(err, errlen, "out of memory");
			goto out;
		}
		all[s->d] = s->max_rows;
		rc = dps_coll_allreduce(w->dp_c, all, all, (size_t)w->dp, DPS_I32);
		for (int r = 0; r < w->dp && !rc; r++)
			if (all[r] != s->max_rows) {
				snprintf(err, errlen, "replica %d was loaded for %d rows per step and "
					 "replica %d for %d: every replica must use the same max_rows",
					 s->d, s->max_rows, r, all[r]);
				rc = -EINVAL;
			}
		free(all);
		if (rc)
			goto out;
	}
	kv = (size_t)s->nkv_t * (size_t)s->hd;
	s->block_size = opts && opts->block_size > 0 ? opts->block_size : DPS_BLOCK_SIZE_DEFAULT;
	s->bps = (s->max_pos + s->block_size - 1) / s->block_size;
	s->num_blocks = opts && opts->num_blocks > 0 ? opts->num_blocks : s->max_seqs * s->bps;
	if (opts && !opts->num_blocks && opts->kv_bytes) {
		rc = dps_kv_blocks_for(opts->kv_bytes,
				       dps_kv_block_bytes(c->num_hidden_layers, s->block_size, kv),
				       s->block_size, opts->max_blocks, s->bps, s->max_pos,
				       &s->num_blocks, err, errlen);
		if (rc)
			goto out;
	}
	cache = (size_t)c->num_hidden_layers * (size_t)s->num_blocks * (size_t)s->block_size * kv;
	s->cache_bytes = 2 * cache * sizeof(float);
	if (opts && opts->cache_mem) {
		/* a prefill rank's slice of the KV share: the header, then keys and values */
		struct dps_kv_share_hdr *hdr = opts->cache_mem;
		const size_t koff = dps_align_up(sizeof(*hdr), 4096);

		if (opts->cache_cap < koff || opts->cache_cap - koff < s->cache_bytes) {
			snprintf(err, errlen, "rank %d: the KV cache (%zu bytes) does not fit the %zu "
				 "bytes kept for it", w ? w->rank : 0, s->cache_bytes, opts->cache_cap);
			rc = -ENOMEM;
			goto out;
		}
		*hdr = (struct dps_kv_share_hdr){ .magic = DPS_KV_SHARE_MAGIC,
						  .layers = (uint32_t)c->num_hidden_layers,
						  .num_blocks = (uint32_t)s->num_blocks,
						  .block_size = (uint32_t)s->block_size,
						  .width = (uint32_t)kv, .key_off = koff,
						  .value_off = koff + cache * sizeof(float) };
		s->key_cache = (float *)(void *)((char *)opts->cache_mem + koff);
		s->value_cache = s->key_cache + cache;
		s->cache_shared = 1;
	} else {
		s->key_cache = dps_kv_alloc(cache * sizeof(float));
		s->value_cache = dps_kv_alloc(cache * sizeof(float));
	}
	g = (size_t)s->max_gather;
	wide = (size_t)(s->hq_t + 2 * s->nkv_t) * (size_t)s->hd;
	if (wide < (size_t)c->hidden_size)
		wide = (size_t)c->hidden_size;
	s->x = calloc(g * (size_t)c->hidden_size, sizeof(float));
	s->h = calloc(g * (size_t)s->qkv_in, sizeof(float));
	if (s->draft)
		s->fcin = calloc((size_t)s->max_rows * (size_t)s->fc_w, sizeof(float));
	/*
	 * The sublayer outputs that TP all-reduces: in this rank's window of its TP group when
	 * the layout gave one large enough (dps_shard_window_bytes), so that a prefill's large
	 * all-reduces read them in place (shm/coll.h). Every member decides alike: same window,
	 * same size, the same shards loaded in the same order. One shard at a time holds it: not
	 * a draft, which shares the TP group with its target, nor a second model loaded beside
	 * the first.
	 */
	if (!s->draft && s->tp_c && s->tp_c->n > 1 && !s->tp_c->window_used) {
		size_t wb;
		float *win = dps_comm_window(s->tp_c, &wb);

		if (win && wb / sizeof(float) / (size_t)c->hidden_size >= g) {
			memset(win, 0, g * (size_t)c->hidden_size * sizeof(float));
			s->o = win;
			s->o_window = 1;
			s->tp_c->window_used = 1;
		}
	}
	if (!s->o_window)
		s->o = calloc(g * (size_t)c->hidden_size, sizeof(float));
	s->qkv = calloc(2 * g * wide, sizeof(float));
	/* att and att2 also hold a replica's K/V projections and the all-to-all blocks. */
	s->att = calloc(g * (size_t)(s->hq_t + 2 * s->nkv_t + s->hq_e + 2 * s->nkv_e) *
				(size_t)s->hd, sizeof(float));
	s->att2 = calloc(g * (size_t)(s->hq_t + 2 * s->nkv_t + s->hq_e + 2 * s->nkv_e) *
				 (size_t)s->hd, sizeof(float));
	s->gu = calloc(g * 2 * (size_t)s->im_sh, sizeof(float));
	s->score_threads = dps_pool_size(dps_gemm_pool());
	s->scores = calloc((size_t)s->score_threads * DPS_ATTN_HEADS * (size_t)s->max_pos,
			   sizeof(float)); /* DPS_ATTN_HEADS heads a thread at once (attn.c) */
	s->cs = calloc((size_t)s->max_rows * (size_t)s->hd, sizeof(float));
	s->lg = calloc(g * (size_t)(s->v_tp > s->v_lm ? s->v_tp : s->v_lm), sizeof(float));
	s->lg2 = calloc(g * (size_t)tp * (size_t)maxc *
				(size_t)(s->v_tp > s->v_lm ? s->v_tp : s->v_lm),
			sizeof(float));
	s->logits = calloc((size_t)s->max_rows * (size_t)c->vocab_size, sizeof(float));
	s->ids = calloc(g + 1, sizeof(int) * 2);
	s->rows_slot = calloc((size_t)s->max_rows, sizeof(int));
	s->rows_table = calloc((size_t)s->max_rows, sizeof(int *));
	s->seq_tables = calloc((size_t)s->max_seqs * (size_t)s->bps, sizeof(int));
	if (s->seq_tables)
		for (int b = 0; b < s->max_seqs * s->bps; b++)
			s->seq_tables[b] = b < s->num_blocks ? b : 0;
	if (s->moe) {
		/*
		 * Rows routed here: the MLP's (TP), the DP group's (all-gather), this rank's slice
		 * of its replica's (all-to-all, at most max_rows). One expert meets at most every
		 * row of the step: the MLP's, or every replica's (EP).
		 */
		const size_t dim = (size_t)c->hidden_size, E = (size_t)c->num_local_experts;
		const size_t k = (size_t)c->num_experts_per_tok, mr = (size_t)s->max_rows;
		const size_t all = (size_t)par->dp * mr;
		const size_t route = s->moe == DPS_MOE_TP ? g : s->moe == DPS_MOE_EP_AG ? all : mr;
		const size_t rows = s->moe == DPS_MOE_TP ? g : all;
		const size_t kk = k < (size_t)s->e_n ? k : (size_t)s->e_n;

		if (all * kk > INT32_MAX || g > INT32_MAX) {
			snprintf(err, errlen, "%zu rows per step over %d replicas is too many",
				 mr, par->dp);
			rc = -EINVAL;
			goto out;
		}
		s->moe_route = (int)route;
		s->moe_rows = (int)rows;
		s->moe_items = (int)(all * kk);
		s->m_lg = calloc(route * E, sizeof(float));
		s->m_w = calloc(route * k, sizeof(float));
		s->m_e = calloc(route * k, sizeof(int));
		s->m_h = calloc(route * dim, sizeof(float));
		s->m_y = calloc(route * dim, sizeof(float));
		s->m_gather = calloc(rows * dim, sizeof(float));
		s->m_gu = calloc(rows * 2 * (size_t)s->im_e, sizeof(float));
		s->m_eout = calloc(rows * dim, sizeof(float));
		s->m_ix = calloc(rows, sizeof(int));
		s->m_pad = calloc(((size_t)par->dp + 1) * mr, sizeof(int));
		if (s->moe == DPS_MOE_EP_A2A) {
			s->m_send = calloc(mr * k * (dim + 1), sizeof(float));
			s->m_pos = calloc(mr * k, sizeof(int));
			s->m_recv = calloc((size_t)s->moe_items * (dim + 1), sizeof(float));
			s->m_ret = calloc((size_t)s->moe_items * dim, sizeof(float));
			s->m_e2 = calloc((size_t)s->moe_items, sizeof(int));
		}
		if (!s->m_lg || !s->m_w || !s->m_e || !s->m_h || !s->m_y || !s->m_gather ||
		    !s->m_gu || !s->m_eout || !s->m_ix || !s->m_pad ||
		    (s->moe == DPS_MOE_EP_A2A &&
		     (!s->m_send || !s->m_pos || !s->m_recv || !s->m_ret || !s->m_e2)))
			moe_fail = 1;
	}
	if (s->wt == DPS_WT_Q8 && !rc) {
		/* The quantized activations of the largest product, before any step needs them. */
		const int rows = s->moe_rows > s->max_gather ? s->moe_rows : s->max_gather;
		int k = s->qkv_in > c->hidden_size ? s->qkv_in : c->hidden_size;

		k = s->hq_t * s->hd > k ? s->hq_t * s->hd : k;
		k = s->hq_e * s->hd > k ? s->hq_e * s->hd : k;
		k = s->im_sh > k ? s->im_sh : k;
		k = s->im_e > k ? s->im_e : k;
		k = s->fc_w > k ? s->fc_w : k;
		if (dps_linear_q8_reserve(rows, k))
			moe_fail = 1; /* reported below as the scratch it is */
	}
	if ((s->draft && !s->fcin) || moe_fail || !s->key_cache || !s->value_cache || !s->x ||
	    !s->h || !s->o || !s->qkv || !s->att || !s->att2 || !s->gu || !s->scores || !s->cs ||
	    !s->lg || !s->lg2 || !s->logits ||
	    !s->ids || !s->rows_slot || !s->rows_table || !s->seq_tables) {
		snprintf(err, errlen, "rank %d: cannot allocate the KV cache (%zu bytes) and scratch",
			 w ? w->rank : 0, s->cache_bytes);
		rc = -ENOMEM;
	}
out:
	dps_ckpt_close(&L.ck);
	if (rc)
		dps_shard_free(s);
	return rc;
}

void dps_shard_free(struct dps_shard *s)
{
	if (s->layers)
		for (int l = 0; l < s->cfg.num_hidden_layers; l++) {
			struct dps_shard_layer *w = &s->layers[l];

			dps_shard_weights_free(s, w->attn_norm);
			dps_shard_weights_free(s, w->ffn_norm);
			dps_shard_weights_free(s, w->wqkv_p);
			dps_shard_weights_free(s, w->wo_p);
			dps_shard_weights_free(s, w->wq_d);
			dps_shard_weights_free(s, w->wo_d);
			dps_shard_weights_free(s, w->wkv_d);
			dps_shard_weights_free(s, w->bkv_d);
			dps_shard_weights_free(s, w->w_gate_up);
			dps_shard_weights_free(s, w->w_down);
			dps_shard_weights_free(s, w->router);
			dps_shard_weights_free(s, w->router_bias);
			for (int i = 0; i < s->e_n; i++) {
				if (w->exp_gu)
					dps_shard_weights_free(s, w->exp_gu[i]);
				if (w->exp_dn)
					dps_shard_weights_free(s, w->exp_dn[i]);
				/* any of the four may be missing after a failed load */
				if (w->exp_gu_q)
					dps_shard_weights_free(s, w->exp_gu_q[i]);
				if (w->exp_gu_s)
					dps_shard_weights_free(s, w->exp_gu_s[i]);
				if (w->exp_dn_q)
					dps_shard_weights_free(s, w->exp_dn_q[i]);
				if (w->exp_dn_s)
					dps_shard_weights_free(s, w->exp_dn_s[i]);
			}
			dps_shard_weights_free(s, w->exp_gu);
			dps_shard_weights_free(s, w->exp_dn);
			dps_shard_weights_free(s, w->exp_gu_q);
			dps_shard_weights_free(s, w->exp_gu_s);
			dps_shard_weights_free(s, w->exp_dn_q);
			dps_shard_weights_free(s, w->exp_dn_s);
			dps_shard_weights_free(s, w->exp_gu_b);
			dps_shard_weights_free(s, w->exp_dn_b);
			dps_shard_weights_free(s, w->bqkv_p);
			dps_shard_weights_free(s, w->bq_d);
			dps_shard_weights_free(s, w->bo_p);
			dps_shard_weights_free(s, w->bo_d);
			dps_shard_weights_free(s, w->q_norm);
			dps_shard_weights_free(s, w->k_norm);
			dps_shard_weights_free(s, w->sinks);
			dps_shard_weights_free(s, w->b_gate_up);
			dps_shard_weights_free(s, w->b_down);
		}
	free(s->layers);
	if (s->emb_d != s->emb_p)
		dps_shard_weights_free(s, s->emb_d);
	dps_shard_weights_free(s, s->emb_p);
	if (s->lm_d != s->lm_p)
		dps_shard_weights_free(s, s->lm_d);
	dps_shard_weights_free(s, s->lm_p);
	dps_shard_weights_free(s, s->final_norm);
	free(s->kv_t);
	free(s->q2kv);
	free(s->inv_freq);
	if (!s->cache_shared) {
		dps_kv_free(s->key_cache, s->cache_bytes / 2);
		dps_kv_free(s->value_cache, s->cache_bytes / 2);
	}
	free(s->x);
	free(s->h);
	if (!s->o_window)
		free(s->o);
	else
		s->tp_c->window_used = 0;
	free(s->qkv);
	free(s->att);
	free(s->att2);
	free(s->gu);
	free(s->scores);
	free(s->cs);
	free(s->lg);
	free(s->lg2);
	free(s->logits);
	free(s->ids);
	free(s->rows_slot);
	free(s->rows_table);
	free(s->seq_tables);
	free(s->m_lg);
	free(s->m_w);
	free(s->m_e);
	free(s->m_h);
	free(s->m_y);
	free(s->m_gather);
	free(s->m_gu);
	free(s->m_eout);
	free(s->m_ix);
	free(s->m_par);
	free(s->m_send);
	free(s->m_pos);
	free(s->m_recv);
	free(s->m_ret);
	free(s->m_e2);
	free(s->m_pad);
	free(s->aux);
	dps_shard_weights_free(s, s->fc);
	dps_shard_weights_free(s, s->hidden_norm);
	free(s->fcin);
	free(s->d2t);
	dps_shard_weights_release(s);
	memset(s, 0, sizeof(*s));
}

size_t dps_shard_window_bytes(const struct dps_model_config *c, const struct dps_par_cfg *par,
			      int max_rows)
{
	size_t maxc = 1, rows = max_rows > 0 ? (size_t)max_rows : 1;

	if (par->tp == 1 && (!par->prefill_dp || dps_par_cfg_prefill_tp(par) == 1))
		return 0;
	for (int k = 0; k < DPS_COMP_COUNT; k++)
		if ((size_t)dps_par_cfg_comp_size(par, (enum dps_comp)k) > maxc)
			maxc = (size_t)dps_par_cfg_comp_size(par, (enum dps_comp)k);
	/* as load: max_gather = max_rows * the largest component size, rows of hidden floats */
	return dps_align_up(rows * maxc * (size_t)c->hidden_size * sizeof(float), 4096);
}
