/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/shard.c - one rank's shards of the model and the sharded forward pass (see shard.h).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/dps.h"
#include "engine/model/ckpt.h"
#include "engine/shard/shard.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/pool.h"

struct dps_shard_layer {
	float *attn_norm, *ffn_norm;
	float *wqkv_p;   /* prefill (plain TP): q (hq_t heads), k and v (nkv_t heads) x hidden */
	float *wo_p;     /* (hidden, hq_t * hd) */
	float *wq_d;     /* decode, c_attn > 1: q of the effective rank's hq_e heads [+ k, v] */
	float *wo_d;     /* (hidden, hq_e * hd) */
	float *w_gate_up; /* (2 * im_sh, hidden): gate rows then up rows */
	float *w_down;   /* (hidden, im_sh) */
	/* MoE layers: router (E, hidden) and bias (E); expert e_lo + i: exp_gu[i] (2 * im_e,
	 * hidden) gate rows then up rows, exp_dn[i] (hidden, im_e). */
	float *router, *router_bias;
	float **exp_gu, **exp_dn;
};

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

/* ---- loading ---------------------------------------------------------------------------- */

/*
 * The KV cache: anonymous memory, zero and untouched until a block is written, so a large
 * budget costs nothing until it is used; huge pages, since attention streams it.
 */
static float *kv_alloc(size_t bytes)
{
	void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	(void)madvise(p, bytes, MADV_HUGEPAGE);
	return p;
}

static void kv_free(float *p, size_t bytes)
{
	if (p)
		munmap(p, bytes ? bytes : 1);
}

struct loader {
	struct dps_ckpt ck;
	struct dps_shard *s;
	char *err;
	size_t errlen;
	int rc;
};

static float *alloc_part(struct loader *L, enum dps_shard_part part, size_t floats)
{
	float *p;

	if (L->rc)
		return NULL;
	p = dps_alloc_huge(floats * sizeof(float));
	if (!p) {
		snprintf(L->err, L->errlen, "rank %d: cannot allocate %zu bytes of weights",
			 L->s->w ? L->s->w->rank : 0, floats * sizeof(float));
		L->rc = -ENOMEM;
		return NULL;
	}
	L->s->bytes[part] += floats * sizeof(float);
	return p;
}

/* Indices [first, first + n) of dimension dim of a 2-D tensor (d0 x d1) into dst. */
static void range(struct loader *L, const char *name, uint64_t d0, uint64_t d1, int dim,
		  int64_t first, uint64_t n, float *dst)
{
	const uint64_t shape[2] = { d0, d1 };

	if (!L->rc)
		L->rc = dps_ckpt_load_range(&L->ck, name, 2, shape, dim, first, n, dst, L->err,
					    L->errlen);
}

static void whole1(struct loader *L, const char *name, uint64_t n, float *dst)
{
	const uint64_t shape[1] = { n };

	if (!L->rc)
		L->rc = dps_ckpt_load_range(&L->ck, name, 1, shape, 0, 0, n, dst, L->err, L->errlen);
}

/* Columns [c0, c0 + n) of a (rows x cols) tensor into dst (rows x ld) at column off. */
static void columns(struct loader *L, const char *name, uint64_t rows, uint64_t cols, int64_t c0,
		    int n, float *dst, int ld, int off)
{
	float *tmp;

	if (L->rc)
		return;
	tmp = malloc(sizeof(float) * rows * (size_t)n);
	if (!tmp) {
		L->rc = -ENOMEM;
		snprintf(L->err, L->errlen, "out of memory loading '%s'", name);
		return;
	}
	range(L, name, rows, cols, 1, c0, (uint64_t)n, tmp);
	for (uint64_t r = 0; r < rows && !L->rc; r++)
		memcpy(dst + r * (size_t)ld + off, tmp + r * (size_t)n, sizeof(float) * (size_t)n);
	free(tmp);
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
	/* The KV heads this TP position's query heads read, in order (padding heads read kv_t[0]). */
	for (int i = 0; i < s->hq_t; i++) {
		const int h = s->t * s->hq_t + i;
		int g, k;

		if (h >= heads)
			continue;
		g = h / group;
		for (k = 0; k < s->nkv_t && s->kv_t[k] != g; k++)
			;
		if (k == s->nkv_t)
			s->kv_t[s->nkv_t++] = g;
		s->q2kv[i] = k;
	}
	if (!s->nkv_t)
		s->kv_t[s->nkv_t++] = 0;
}

/*
 * A MoE layer's router and bias (whole) and experts [e_lo, e_lo + e_n): with expert
 * parallelism whole, else rows [gm * im_e, (gm + 1) * im_e) of gate and up and those columns
 * of down, like the MLP (gm = j*TP + t, zero past the end).
 */
static void load_experts(struct loader *L, int l)
{
	struct dps_shard *s = L->s;
	struct dps_shard_layer *w = &s->layers[l];
	const struct dps_model_config *c = &s->cfg;
	const uint64_t dim = (uint64_t)c->hidden_size, im = (uint64_t)c->intermediate_size;
	const uint64_t E = (uint64_t)c->num_local_experts, ime = (uint64_t)s->im_e;
	const int64_t first = s->moe == DPS_MOE_TP
				      ? (int64_t)(s->j[DPS_COMP_MLP] * s->par.tp + s->t) * s->im_e : 0;
	char n0[96], n1[96];

	snprintf(n0, sizeof(n0), "model.layers.%d.mlp.router.weight", l);
	snprintf(n1, sizeof(n1), "model.layers.%d.mlp.router.bias", l);
	w->router = alloc_part(L, DPS_PART_EXPERTS, E * dim);
	w->router_bias = alloc_part(L, DPS_PART_EXPERTS, E);
	if (w->router && w->router_bias) {
		range(L, n0, E, dim, 0, 0, E, w->router);
		whole1(L, n1, E, w->router_bias);
	}
	w->exp_gu = calloc((size_t)s->e_n, sizeof(float *));
	w->exp_dn = calloc((size_t)s->e_n, sizeof(float *));
	if ((!w->exp_gu || !w->exp_dn) && !L->rc) {
		L->rc = -ENOMEM;
		snprintf(L->err, L->errlen, "out of memory");
	}
	for (int i = 0; i < s->e_n && !L->rc; i++) {
		const int e = s->e_lo + i;
		char ng[96], nu[96], nd[96];

		snprintf(ng, sizeof(ng), "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
		snprintf(nu, sizeof(nu), "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
		snprintf(nd, sizeof(nd), "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
		w->exp_gu[i] = alloc_part(L, DPS_PART_EXPERTS, 2 * ime * dim);
		w->exp_dn[i] = alloc_part(L, DPS_PART_EXPERTS, dim * ime);
		if (!w->exp_gu[i] || !w->exp_dn[i])
			break;
		range(L, ng, im, dim, 0, first, ime, w->exp_gu[i]);
		range(L, nu, im, dim, 0, first, ime, w->exp_gu[i] + ime * dim);
		range(L, nd, dim, im, 1, first, ime, w->exp_dn[i]);
	}
}

/* Layer l's tensor name: "model.layers.<l>.<suffix>", or "midlayer.<suffix>" in a draft. */
static void lname(const struct dps_shard *s, char *buf, size_t len, int l, const char *suffix)
{
	if (s->draft)
		snprintf(buf, len, "midlayer.%s", suffix);
	else
		snprintf(buf, len, "model.layers.%d.%s", l, suffix);
}

static void load_layer(struct loader *L, int l)
{
	struct dps_shard *s = L->s;
	struct dps_shard_layer *w = &s->layers[l];
	const struct dps_model_config *c = &s->cfg;
	const uint64_t dim = (uint64_t)c->hidden_size, im = (uint64_t)c->intermediate_size;
	const uint64_t qd = (uint64_t)c->num_attention_heads * (uint64_t)s->hd;
	const uint64_t kvd = (uint64_t)c->num_key_value_heads * (uint64_t)s->hd;
	const uint64_t qin = (uint64_t)s->qkv_in; /* 2 * hidden for an Eagle3 draft */
	const int hd = s->hd, t = s->t, ca = s->c[DPS_COMP_ATTN];
	const int e = s->j[DPS_COMP_ATTN] + t * ca, gm = s->j[DPS_COMP_MLP] * s->par.tp + t;
	const size_t rows_p = (size_t)(s->hq_t + 2 * s->nkv_t) * (size_t)hd;
	char nq[96], nk[96], nv[96], no[96], ng[96], nu[96], nd[96], n1[96], n2[96];

	lname(s, nq, sizeof(nq), l, "self_attn.q_proj.weight");
	lname(s, nk, sizeof(nk), l, "self_attn.k_proj.weight");
	lname(s, nv, sizeof(nv), l, "self_attn.v_proj.weight");
	lname(s, no, sizeof(no), l, "self_attn.o_proj.weight");
	lname(s, ng, sizeof(ng), l, "mlp.gate_proj.weight");
	lname(s, nu, sizeof(nu), l, "mlp.up_proj.weight");
	lname(s, nd, sizeof(nd), l, "mlp.down_proj.weight");
	lname(s, n1, sizeof(n1), l, "input_layernorm.weight");
	lname(s, n2, sizeof(n2), l, "post_attention_layernorm.weight");

	w->attn_norm = alloc_part(L, DPS_PART_NORMS, dim);
	w->ffn_norm = alloc_part(L, DPS_PART_NORMS, dim);
	if (w->attn_norm && w->ffn_norm) {
		whole1(L, n1, dim, w->attn_norm);
		whole1(L, n2, dim, w->ffn_norm);
	}
	/* Prefill (plain TP): this TP position's query heads, then the KV heads they read. */
	w->wqkv_p = alloc_part(L, DPS_PART_ATTN_PREFILL, rows_p * qin);
	w->wo_p = alloc_part(L, DPS_PART_ATTN_PREFILL, dim * (size_t)s->hq_t * (size_t)hd);
	if (w->wqkv_p && w->wo_p) {
		range(L, nq, qd, qin, 0, (int64_t)t * s->hq_t * hd, (uint64_t)s->hq_t * (uint64_t)hd,
		      w->wqkv_p);
		for (int k = 0; k < s->nkv_t; k++) {
			float *kr = w->wqkv_p + ((size_t)s->hq_t + (size_t)k) * (size_t)hd * qin;
			float *vr = kr + (size_t)s->nkv_t * (size_t)hd * qin;

			range(L, nk, kvd, qin, 0, (int64_t)s->kv_t[k] * hd, (uint64_t)hd, kr);
			range(L, nv, kvd, qin, 0, (int64_t)s->kv_t[k] * hd, (uint64_t)hd, vr);
		}
		columns(L, no, dim, qd, (int64_t)t * s->hq_t * hd, s->hq_t * hd, w->wo_p,
			s->hq_t * hd, 0);
	}
	/* Decode with c_attn > 1: the effective rank's query heads [and KV heads]. */
	if (ca > 1) {
		const size_t rows_d = (size_t)(s->hq_e + 2 * s->nkv_e) * (size_t)hd;

		w->wq_d = alloc_part(L, DPS_PART_ATTN_DECODE, rows_d * dim);
		w->wo_d = alloc_part(L, DPS_PART_ATTN_DECODE, dim * (size_t)s->hq_e * (size_t)hd);
		if (w->wq_d && w->wo_d) {
			range(L, nq, qd, dim, 0, (int64_t)e * s->hq_e * hd,
			      (uint64_t)s->hq_e * (uint64_t)hd, w->wq_d);
			if (s->kv_by_eff) {
				float *kr = w->wq_d + (size_t)s->hq_e * (size_t)hd * dim;
				float *vr = kr + (size_t)s->nkv_e * (size_t)hd * dim;

				range(L, nk, kvd, dim, 0, (int64_t)e * s->nkv_e * hd,
				      (uint64_t)s->nkv_e * (uint64_t)hd, kr);
				range(L, nv, kvd, dim, 0, (int64_t)e * s->nkv_e * hd,
				      (uint64_t)s->nkv_e * (uint64_t)hd, vr);
			}
			columns(L, no, dim, qd, (int64_t)e * s->hq_e * hd, s->hq_e * hd, w->wo_d,
				s->hq_e * hd, 0);
		}
	}
	if (dps_cfg_layer_moe(c, l)) {
		load_experts(L, l);
		return;
	}
	/* MLP over TP x c_mlp with the group rank j*TP + t: gate and up rows, down columns. */
	w->w_gate_up = alloc_part(L, DPS_PART_MLP, 2 * (size_t)s->im_sh * dim);
	w->w_down = alloc_part(L, DPS_PART_MLP, dim * (size_t)s->im_sh);
	if (w->w_gate_up && w->w_down) {
		range(L, ng, im, dim, 0, (int64_t)gm * s->im_sh, (uint64_t)s->im_sh, w->w_gate_up);
		range(L, nu, im, dim, 0, (int64_t)gm * s->im_sh, (uint64_t)s->im_sh,
		      w->w_gate_up + (size_t)s->im_sh * dim);
		range(L, nd, dim, im, 1, (int64_t)gm * s->im_sh, (uint64_t)s->im_sh, w->w_down);
	}
}

/* Vocabulary rows [idx * per, (idx + 1) * per) of an embedding-shaped tensor. */
static float *vocab_shard(struct loader *L, enum dps_shard_part part, const char *name, int idx,
			  int per)
{
	const struct dps_model_config *c = &L->s->cfg;
	float *p = alloc_part(L, part, (size_t)per * (size_t)c->hidden_size);

	if (p)
		range(L, name, (uint64_t)c->vocab_size, (uint64_t)c->hidden_size, 0,
		      (int64_t)idx * per, (uint64_t)per, p);
	return p;
}

/*
 * An Eagle3 draft of target T: checks its config against T's and fixes what the draft's
 * shards follow (one layer, the draft vocabulary, the fused layers, the target's context).
 */
static int draft_config(struct dps_shard *s, const struct dps_shard *T, const char *dir,
			char *err, size_t errlen)
{
	struct dps_model_config *c = &s->cfg;
	const struct dps_model_config *tc = &T->cfg;
	const int N = tc->num_hidden_layers;

	if (!c->eagle3) {
		snprintf(err, errlen, "%s: not an Eagle3 draft (its config.json names no "
			 "LlamaForCausalLMEagle3 architecture, draft_vocab_size or "
			 "eagle_aux_hidden_state_layer_ids)", dir);
		return -EINVAL;
	}
	if (c->num_local_experts || c->num_hidden_layers != 1) {
		snprintf(err, errlen, "%s: an Eagle3 draft has one dense decoder layer (this config "
			 "has %d layers%s)", dir, c->num_hidden_layers,
			 c->num_local_experts ? " and experts" : "");
		return -EINVAL;
	}
	if (c->hidden_size != tc->hidden_size) {
		snprintf(err, errlen, "%s: the draft's hidden_size %d differs from the target's %d "
			 "(the draft reads the target's token embedding)", dir, c->hidden_size,
			 tc->hidden_size);
		return -EINVAL;
	}
	if (c->draft_vocab_size)
		c->vocab_size = c->draft_vocab_size;
	if (c->vocab_size > tc->vocab_size) {
		snprintf(err, errlen, "%s: the draft vocabulary (%d) is larger than the target's (%d)",
			 dir, c->vocab_size, tc->vocab_size);
		return -EINVAL;
	}
	if (c->n_aux) {
		for (int k = 0; k < 3; k++)
			if (c->aux_layers[k] >= N) {
				snprintf(err, errlen, "%s: eagle_aux_hidden_state_layer_ids names layer "
					 "%d; the target has %d layers", dir, c->aux_layers[k], N);
				return -EINVAL;
			}
	} else {
		/* vLLM's default, (2, N/2, N-3), kept inside a small target. */
		const int def[3] = { 2, N / 2, N - 3 };

		for (int k = 0; k < 3; k++)
			c->aux_layers[k] = def[k] < 0 ? 0 : def[k] >= N ? N - 1 : def[k];
		c->n_aux = 3;
	}
	/* The fused states go to fc in layer order, as the target appends them. */
	for (int i = 1; i < 3; i++)
		for (int k = i; k > 0 && c->aux_layers[k - 1] > c->aux_layers[k]; k--) {
			const int x = c->aux_layers[k];

			c->aux_layers[k] = c->aux_layers[k - 1];
			c->aux_layers[k - 1] = x;
		}
	if (c->max_position_embeddings < tc->max_position_embeddings)
		c->max_position_embeddings = tc->max_position_embeddings;
	s->draft = 1;
	s->target_vocab = tc->vocab_size;
	memcpy(s->aux_l, c->aux_layers, sizeof(s->aux_l));
	return 0;
}

/* The draft's fusion columns, hidden_norm and d2t (each draft id's offset to its target id). */
static void load_draft_extras(struct loader *L)
{
	struct dps_shard *s = L->s;
	const uint64_t dim = (uint64_t)s->cfg.hidden_size, V = (uint64_t)s->cfg.vocab_size;
	const struct dps_st_tensor *d2t;

	s->fc_w = (int)((3 * dim + (uint64_t)s->par.tp - 1) / (uint64_t)s->par.tp);
	s->fc = alloc_part(L, DPS_PART_MLP, dim * (size_t)s->fc_w);
	s->hidden_norm = alloc_part(L, DPS_PART_NORMS, dim);
	if (s->fc && s->hidden_norm) {
		columns(L, "fc.weight", dim, 3 * dim, (int64_t)s->t * s->fc_w, s->fc_w, s->fc, s->fc_w,
			0);
		whole1(L, "midlayer.hidden_norm.weight", dim, s->hidden_norm);
	}
	s->d2t = calloc(V, sizeof(int));
	if (!s->d2t) {
		if (!L->rc) {
			L->rc = -ENOMEM;
			snprintf(L->err, L->errlen, "out of memory");
		}
		return;
	}
	d2t = dps_ckpt_find(&L->ck, "d2t", NULL);
	if (!d2t && V != (uint64_t)s->target_vocab && !L->rc) {
		snprintf(L->err, L->errlen, "%s: no 'd2t' tensor, and the draft vocabulary (%llu) is "
			 "not the target's (%d)", L->ck.dir, (unsigned long long)V, s->target_vocab);
		L->rc = -EINVAL;
	}
	if (d2t && !L->rc) {
		float *tmp = malloc(sizeof(float) * V);

		if (!tmp) {
			L->rc = -ENOMEM;
			snprintf(L->err, L->errlen, "out of memory");
			return;
		}
		whole1(L, "d2t", V, tmp);
		for (uint64_t i = 0; i < V && !L->rc; i++) {
			const double t = (double)i + (double)tmp[i];

			if (!(t >= 0 && t < s->target_vocab)) {
				snprintf(L->err, L->errlen, "%s: d2t maps draft token %llu to %.0f, outside "
					 "the target's vocabulary of %d", L->ck.dir,
					 (unsigned long long)i, t, s->target_vocab);
				L->rc = -EINVAL;
			}
			s->d2t[i] = (int)tmp[i];
		}
		free(tmp);
	}
}

int dps_shard_load(struct dps_shard *s, struct dps_world *w, const struct dps_par_cfg *par,
		   const char *dir, const struct dps_shard_opts *opts, char *err, size_t errlen)
{
	struct loader L = { .s = s, .err = err, .errlen = errlen };
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
	rc = dps_ckpt_open(&L.ck, dir, err, errlen);
	if (rc)
		return rc;
	*c = L.ck.cfg;
	if (T) {
		/* The draft: its MLP over TP x --draft-mlp-dp-size, the rest over TP. */
		rc = draft_config(s, T, dir, err, errlen);
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
			s->im_e = s->im_sh;
		}
	}

	/* Embedding and LM head: plain TP for prefill, the component group for decode. A draft
	 * reads the target's embedding. */
	if (!s->draft) {
		s->emb_p = vocab_shard(&L, DPS_PART_EMB_PREFILL, "model.embed_tokens.weight", s->t,
				       s->v_tp);
		s->emb_d = s->c[DPS_COMP_EMB] > 1
				   ? vocab_shard(&L, DPS_PART_EMB_DECODE, "model.embed_tokens.weight",
						 s->j[DPS_COMP_EMB] * tp + s->t, s->v_emb)
				   : s->emb_p;
	}
	head = c->tie_word_embeddings && !s->draft ? "model.embed_tokens.weight" : "lm_head.weight";
	s->lm_p = vocab_shard(&L, DPS_PART_LM_PREFILL, head, s->t, s->v_tp);
	s->lm_d = s->c[DPS_COMP_LM_HEAD] > 1
			  ? vocab_shard(&L, DPS_PART_LM_DECODE, head,
					s->j[DPS_COMP_LM_HEAD] * tp + s->t, s->v_lm)
			  : s->lm_p;
	s->final_norm = alloc_part(&L, DPS_PART_NORMS, (size_t)c->hidden_size);
	if (s->final_norm)
		whole1(&L, s->draft ? "norm.weight" : "model.norm.weight", (uint64_t)c->hidden_size,
		       s->final_norm);
	s->layers = calloc((size_t)c->num_hidden_layers, sizeof(*s->layers));
	if (!s->layers && !L.rc) {
		L.rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
	}
	for (int l = 0; l < c->num_hidden_layers && !L.rc; l++)
		load_layer(&L, l);
	if (s->draft)
		load_draft_extras(&L);
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
		const size_t per = 2 * (size_t)c->num_hidden_layers * (size_t)s->block_size * kv *
				   sizeof(float);

		s->num_blocks = opts->kv_bytes / per > (size_t)INT32_MAX / (size_t)s->block_size
					? INT32_MAX / s->block_size : (int)(opts->kv_bytes / per);
		if (opts->max_blocks > 0 && s->num_blocks > opts->max_blocks)
			s->num_blocks = opts->max_blocks;
		if (s->num_blocks < s->bps) {
			snprintf(err, errlen, "a KV cache of %zu bytes holds %d blocks of %d positions "
				 "(%zu bytes each); one sequence of %d positions needs %d: give "
				 "--kv-cache-memory at least %zu bytes or a smaller --max-model-len",
				 opts->kv_bytes, s->num_blocks, s->block_size, per, s->max_pos, s->bps,
				 per * (size_t)s->bps);
			rc = -EINVAL;
			goto out;
		}
	}
	cache = (size_t)c->num_hidden_layers * (size_t)s->num_blocks * (size_t)s->block_size * kv;
	s->cache_bytes = 2 * cache * sizeof(float);
	s->key_cache = kv_alloc(cache * sizeof(float));
	s->value_cache = kv_alloc(cache * sizeof(float));
	g = (size_t)s->max_gather;
	wide = (size_t)(s->hq_t + 2 * s->nkv_t) * (size_t)s->hd;
	if (wide < (size_t)c->hidden_size)
		wide = (size_t)c->hidden_size;
	s->x = calloc(g * (size_t)c->hidden_size, sizeof(float));
	s->h = calloc(g * (size_t)s->qkv_in, sizeof(float));
	if (s->draft)
		s->fcin = calloc((size_t)s->max_rows * (size_t)s->fc_w, sizeof(float));
	s->o = calloc(g * (size_t)c->hidden_size, sizeof(float));
	s->qkv = calloc(2 * g * wide, sizeof(float));
	/* att and att2 also hold a replica's K/V projections and the all-to-all blocks. */
	s->att = calloc(g * (size_t)(s->hq_t + 2 * s->nkv_t + s->hq_e + 2 * s->nkv_e) *
				(size_t)s->hd, sizeof(float));
	s->att2 = calloc(g * (size_t)(s->hq_t + 2 * s->nkv_t + s->hq_e + 2 * s->nkv_e) *
				 (size_t)s->hd, sizeof(float));
	s->gu = calloc(g * 2 * (size_t)s->im_sh, sizeof(float));
	s->score_threads = dps_pool_size(dps_gemm_pool());
	s->scores = calloc((size_t)s->score_threads * (size_t)s->max_pos, sizeof(float));
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
	if ((s->draft && !s->fcin) || moe_fail || !s->key_cache || !s->value_cache || !s->x || !s->h || !s->o || !s->qkv || !s->att ||
	    !s->att2 || !s->gu || !s->scores || !s->cs || !s->lg || !s->lg2 || !s->logits ||
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

			free(w->attn_norm);
			free(w->ffn_norm);
			free(w->wqkv_p);
			free(w->wo_p);
			free(w->wq_d);
			free(w->wo_d);
			free(w->w_gate_up);
			free(w->w_down);
			free(w->router);
			free(w->router_bias);
			for (int i = 0; i < s->e_n; i++) {
				if (w->exp_gu)
					free(w->exp_gu[i]);
				if (w->exp_dn)
					free(w->exp_dn[i]);
			}
			free(w->exp_gu);
			free(w->exp_dn);
		}
	free(s->layers);
	if (s->emb_d != s->emb_p)
		free(s->emb_d);
	free(s->emb_p);
	if (s->lm_d != s->lm_p)
		free(s->lm_d);
	free(s->lm_p);
	free(s->final_norm);
	free(s->kv_t);
	free(s->q2kv);
	kv_free(s->key_cache, s->cache_bytes / 2);
	kv_free(s->value_cache, s->cache_bytes / 2);
	free(s->x);
	free(s->h);
	free(s->o);
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
	free(s->m_send);
	free(s->m_pos);
	free(s->m_recv);
	free(s->m_ret);
	free(s->m_e2);
	free(s->m_pad);
	free(s->aux);
	free(s->fc);
	free(s->hidden_norm);
	free(s->fcin);
	free(s->d2t);
	memset(s, 0, sizeof(*s));
}

/* A product through dps_linear_f32, counted in s->linear_ns and s->linear_flops. */
static void lin(struct dps_shard *s, float *out, const float *x, const float *W, int m, int n, int k)
{
	const uint64_t t0 = dps_now_ns();

	dps_linear_f32(out, x, W, m, n, k);
	s->linear_ns += dps_now_ns() - t0;
	s->linear_flops += 2.0 * m * n * k;
}

/* ---- collectives, counted ----------------------------------------------------------------- */

static void count(struct dps_shard *s, enum dps_coll_kind k, int sg, size_t bytes)
{
	s->stats.calls[k][sg]++;
	s->stats.bytes[k][sg] += bytes;
	if (s->trace) {
		char where[32] = "outside the layers";

		if (s->cur_layer >= 0)
			snprintf(where, sizeof(where), "layer %d", s->cur_layer);
		fprintf(stderr, "rank %d step %llu (%s) %s: %s over the %s, %zu bytes\n",
			s->w ? s->w->rank : 0, (unsigned long long)s->steps,
			s->cur_prefill ? "prefill" : "decode", where, dps_coll_kind_name(k),
			dps_shard_group_name(sg), bytes);
	}
}

static int allreduce(struct dps_shard *s, struct dps_comm *c, int sg, float *buf, size_t n)
{
	if (!c || c->n == 1 || !n)
		return 0;
	count(s, DPS_COLL_ALLREDUCE, sg, n * sizeof(float));
	return dps_coll_allreduce(c, buf, buf, n, DPS_F32);
}

static int allgather(struct dps_shard *s, struct dps_comm *c, int sg, const void *send, void *recv,
		     size_t n, enum dps_dtype t)
{
	if (!c || c->n == 1) {
		if (recv != send)
			memcpy(recv, send, n * dps_dtype_size(t));
		return 0;
	}
	if (!n) /* every member gives the same count */
		return 0;
	count(s, DPS_COLL_ALLGATHER, sg, n * dps_dtype_size(t) * (size_t)c->n);
	return dps_coll_allgather(c, send, recv, n, t);
}

/* ---- _dp_transition ------------------------------------------------------------------------ */

int dps_dp_transition(struct dps_shard *s, const float *x, float *out, int rows_local, int cols,
		      int from, int to, struct dps_comm *to_col, int to_sg)
{
	const size_t row = (size_t)cols, per = (size_t)rows_local * row;

	if (from == to) {
		if (out != x)
			memmove(out, x, per * (size_t)from * sizeof(float));
		return 0;
	}
	if (from > to && from % to == 0) {
		/* Down: keep this rank's target sub-group of batches (the reference's narrow). */
		const size_t start = (size_t)((s->d % from) / to) * (size_t)to * per;

		memmove(out, x + start, per * (size_t)to * sizeof(float));
		return 0;
	}
	/*
	 * Up (and down between sizes that do not nest, where the reference's slice would keep the wrong
	 * replicas): through local, then all-gather over the target column.
	 */
	return allgather(s, to_col, to_sg, x + (size_t)(s->d % from) * per, out, per, DPS_F32);
}

/* ---- attention ----------------------------------------------------------------------------- */

struct attn_job {
	struct dps_shard *s;
	int n, layer;
	const int *pos;
	const int *const *table;
	const float *q;  /* (n, q_stride): this TP position's hq_t heads, roped */
	size_t q_stride;
	float *out;      /* (n, hq_t * hd) */
	int chunks;
};

static void attn_chunk(void *arg, int chunk, int tid)
{
	const struct attn_job *j = arg;
	struct dps_shard *s = j->s;
	const int hd = s->hd, hq = s->hq_t;
	const size_t kv = (size_t)s->nkv_t * (size_t)hd, bstride = (size_t)s->block_size * kv;
	float *scratch = s->scores + (size_t)tid * (size_t)s->max_pos;
	int lo, hi;

	dps_pool_split(j->n * hq, 1, chunk, j->chunks, &lo, &hi);
	for (int item = lo; item < hi; item++) {
		const int i = item / hq, h = item % hq;
		float *out = j->out + (size_t)i * (size_t)hq * (size_t)hd + (size_t)h * (size_t)hd;
		size_t base;

		if (!j->table[i]) { /* a padding row reads nothing */
			memset(out, 0, sizeof(float) * (size_t)hd);
			continue;
		}
		base = (size_t)j->layer * (size_t)s->num_blocks * bstride +
		       (size_t)s->q2kv[h] * (size_t)hd;
		dps_attention_paged(out, j->q + (size_t)i * j->q_stride + (size_t)h * (size_t)hd,
				    s->key_cache + base, s->value_cache + base, j->table[i],
				    s->block_size, bstride, j->pos[i] + 1, hd, kv, scratch);
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
	struct attn_job j = { s, n, layer, pos, r->table, q, q_stride, out, 1 };
	const int items = n * s->hq_t, most = 8 * dps_pool_size(dps_gemm_pool());

	for (int i = 0; i < n; i++) {
		float *cs = s->cs + (size_t)i * (size_t)hd;

		dps_rope_table(cs, hd, pos[i], (float)s->cfg.rope_theta);
		dps_rope(q + (size_t)i * q_stride, s->hq_t, hd, cs);
		dps_rope(k + (size_t)i * k_stride, s->nkv_t, hd, cs);
		if (r->slot[i] >= 0) { /* DPS_PAD_SLOT writes nothing */
			const size_t at = ((size_t)layer * (size_t)s->num_blocks *
						   (size_t)s->block_size + (size_t)r->slot[i]) * kv;

			memcpy(s->key_cache + at, k + (size_t)i * k_stride, sizeof(float) * kv);
			memcpy(s->value_cache + at, v + (size_t)i * k_stride, sizeof(float) * kv);
		}
	}
	j.chunks = items < most ? items : most;
	if (dps_pool_size(dps_gemm_pool()) <= s->score_threads) {
		dps_pool_run(dps_gemm_pool(), j.chunks, attn_chunk, &j);
	} else { /* more threads than at load: one scratch row, one thread */
		for (int c = 0; c < j.chunks; c++)
			attn_chunk(&j, c, 0);
	}
}

/* Prefill attention (plain TP) of n own rows h; the partial o (n, hidden) before the all-reduce. */
static void attn_prefill(struct dps_shard *s, int l, const struct dps_rows *r, const float *h,
			 float *o)
{
	const int n = r->n;
	const struct dps_shard_layer *w = &s->layers[l];
	const int dim = s->cfg.hidden_size, hd = s->hd;
	const size_t width = (size_t)(s->hq_t + 2 * s->nkv_t) * (size_t)hd;
	float *q = s->qkv;

	lin(s, q, h, w->wqkv_p, n, (int)width, s->qkv_in);
	attend(s, l, r, q, width, q + (size_t)s->hq_t * hd,
	       q + (size_t)(s->hq_t + s->nkv_t) * hd, width, s->att);
	lin(s, o, s->att, w->wo_p, n, dim, s->hq_t * hd);
}

/*
 * Decode attention with c_attn > 1 on R = B * c rows gathered over the attention column (block
 * j' from replica j'). Each rank projects its effective rank's query heads (and, by effective
 * rank, KV heads) for every row; an all-to-all over the column hands each replica's rows to its
 * own rank, which holds their KV cache and computes attention for the heads of its TP position;
 * a second all-to-all returns each head block to the rank whose O shard it meets.
 */
static int attn_decode(struct dps_shard *s, int l, const struct dps_rows *r, const float *h,
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
	lin(s, proj, h, w->wq_d, R, (int)we, dim);
	for (int q = 0; q < ca; q++)
		sc[q] = rc_[q] = (size_t)B * we;
	count(s, DPS_COLL_ALLTOALL, DPS_SG_ATTN_COL, (size_t)R * we * sizeof(float));
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

		lin(s, kvo, h + (size_t)j * (size_t)B * (size_t)dim,
			       w->wqkv_p + (size_t)s->hq_t * (size_t)hd * (size_t)dim, B, (int)kvw, dim);
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
	count(s, DPS_COLL_ALLTOALL, DPS_SG_ATTN_COL, (size_t)R * qe * sizeof(float));
	rc = dps_coll_alltoallv(s->col_c[DPS_COMP_ATTN], s->att2, sc, NULL, s->att, rc_, NULL,
				DPS_F32);
	if (rc)
		return rc;
	/* att (R, qe): my heads for every gathered row, in gathered order. */
	lin(s, o, s->att, w->wo_d, R, dim, (int)qe);
	return 0;
}

/* ---- MLP ------------------------------------------------------------------------------------ */

/* The partial MLP of R rows h (this rank's intermediate shard) into o (R, hidden). */
static void mlp(struct dps_shard *s, int l, int R, const float *h, float *o)
{
	const struct dps_shard_layer *w = &s->layers[l];
	const int dim = s->cfg.hidden_size, im = s->im_sh;

	lin(s, s->gu, h, w->w_gate_up, R, 2 * im, dim);
	for (int i = 0; i < R; i++) {
		float *g = s->gu + (size_t)i * 2 * (size_t)im;

		dps_swiglu(g, g + im, im);
		memmove(s->gu + (size_t)i * (size_t)im, g, sizeof(float) * (size_t)im);
	}
	lin(s, o, s->gu, w->w_down, R, dim, im);
}

/* ---- mixture of experts ---------------------------------------------------------------------- */

static int moe_layer(const struct dps_shard *s, int l)
{
	return s->moe != DPS_MOE_NONE && dps_cfg_layer_moe(&s->cfg, l);
}

int dps_shard_coupled(const struct dps_shard *s)
{
	int coupled = s->par.ep;

	/* The draft MLP's size couples only when a draft runs (the engine adds it then). */
	for (int k = 0; k < DPS_COMP_COUNT; k++)
		coupled |= k != DPS_COMP_DRAFT_MLP && s->c[k] > 1;
	return coupled;
}

/*
 * Routes n normed rows h: each row's k experts into s->m_e and their weights into s->m_w. A
 * padding row (pad[i], pad may be NULL) chooses no expert (-1): its output is never used.
 */
static void moe_route(struct dps_shard *s, const struct dps_shard_layer *w, int n, const float *h,
		      const int *pad)
{
	const int E = s->cfg.num_local_experts, k = s->cfg.num_experts_per_tok;

	if (!n)
		return;
	s->moe_bytes += (uint64_t)E * ((uint64_t)s->cfg.hidden_size + 1) * sizeof(float);
	lin(s, s->m_lg, h, w->router, n, E, s->cfg.hidden_size);
	for (int i = 0; i < n; i++) {
		float *lg = s->m_lg + (size_t)i * (size_t)E;

		for (int e = 0; e < E; e++)
			lg[e] += w->router_bias[e];
		dps_moe_route(lg, E, k, s->m_e + (size_t)i * (size_t)k, s->m_w + (size_t)i * (size_t)k);
		if (pad && pad[i])
			for (int j = 0; j < k; j++)
				s->m_e[(size_t)i * (size_t)k + (size_t)j] = -1;
	}
}

/*
 * Runs this rank's experts (its im_e rows of each) on n rows x (row stride ldx), each row with
 * k choices re[i*k + j] (global expert ids; others are skipped): every expert once, on the rows
 * that chose it, in ascending order. With weights rw, out row i += rw[i*k+j] * expert(x_i);
 * without (k == 1), out row i = expert(x_i) for the rows whose expert is here.
 */
static void experts_run(struct dps_shard *s, const struct dps_shard_layer *w, int n,
			const float *x, size_t ldx, const int *re, const float *rw, int k, float *out)
{
	const int dim = s->cfg.hidden_size, im = s->im_e;
	const float limit = (float)s->cfg.swiglu_limit;

	for (int i = 0; i < s->e_n; i++) {
		const int e = s->e_lo + i;
		int cnt = 0;

		for (int q = 0; q < n * k; q++)
			if (re[q] == e) {
				DPS_ASSERT(cnt < s->moe_rows);
				memcpy(s->m_gather + (size_t)cnt * (size_t)dim, x + (size_t)(q / k) * ldx,
				       sizeof(float) * (size_t)dim);
				s->m_ix[cnt++] = q;
			}
		if (!cnt)
			continue;
		s->moe_bytes += 3 * (uint64_t)im * (uint64_t)dim * sizeof(float);
		lin(s, s->m_gu, s->m_gather, w->exp_gu[i], cnt, 2 * im, dim);
		for (int r = 0; r < cnt; r++) {
			float *g = s->m_gu + (size_t)r * 2 * (size_t)im;

			if (limit > 0)
				dps_swiglu_clamped(g, g + im, im, limit);
			else
				dps_swiglu(g, g + im, im);
			memmove(s->m_gu + (size_t)r * (size_t)im, g, sizeof(float) * (size_t)im);
		}
		lin(s, s->m_eout, s->m_gu, w->exp_dn[i], cnt, dim, im);
		for (int r = 0; r < cnt; r++) {
			const float *y = s->m_eout + (size_t)r * (size_t)dim;
			float *o = out + (size_t)(s->m_ix[r] / k) * (size_t)dim;

			if (!rw) {
				memcpy(o, y, sizeof(float) * (size_t)dim);
				continue;
			}
			const float wt = rw[s->m_ix[r]];

			for (int d = 0; d < dim; d++)
				o[d] += wt * y[d];
		}
	}
}

/* Without expert parallelism: the partial MoE output (this rank's slice of every expert). */
static void moe_tp(struct dps_shard *s, int l, int R, const float *h, float *o)
{
	const struct dps_shard_layer *w = &s->layers[l];

	DPS_ASSERT(R <= s->moe_route);
	memset(o, 0, sizeof(float) * (size_t)R * (size_t)s->cfg.hidden_size);
	moe_route(s, w, R, h, NULL);
	experts_run(s, w, R, h, (size_t)s->cfg.hidden_size, s->m_e, s->m_w,
		    s->cfg.num_experts_per_tok, o);
}

/*
 * EP, all-gather + reduce-scatter: this replica's n normed rows h (the same on every rank of
 * the replica); o (n, hidden) gets the whole MoE output of those rows. cnt: every replica's
 * row count (NULL: all n, a decode step); pad: which of the gathered rows are padding.
 */
static int moe_ag(struct dps_shard *s, int l, int n, const float *h, float *o, const int *cnt,
		  const int *pad)
{
	const struct dps_shard_layer *w = &s->layers[l];
	const int dim = s->cfg.hidden_size, dp = s->par.dp;
	struct dps_comm *col = s->dp_c;
	size_t counts[DPS_MAX_WORLD];
	int R = 0, rc;

	for (int q = 0; q < dp; q++) {
		const int m = cnt ? cnt[q] : n;

		counts[q] = (size_t)m * (size_t)dim;
		R += m;
	}
	DPS_ASSERT(R <= s->moe_route);
	if (dp > 1) {
		if (R) {
			count(s, DPS_COLL_ALLGATHER, DPS_SG_EP, (size_t)R * dim * sizeof(float));
			rc = dps_coll_allgatherv(col, h, s->m_h, counts, NULL, DPS_F32);
			if (rc)
				return rc;
		}
	} else {
		memcpy(s->m_h, h, sizeof(float) * (size_t)n * (size_t)dim);
	}
	memset(s->m_y, 0, sizeof(float) * (size_t)R * (size_t)dim);
	moe_route(s, w, R, s->m_h, pad);
	experts_run(s, w, R, s->m_h, (size_t)dim, s->m_e, s->m_w, s->cfg.num_experts_per_tok,
		    s->m_y);
	if (dp > 1) {
		if (R) {
			count(s, DPS_COLL_REDUCESCATTER, DPS_SG_EP, (size_t)R * dim * sizeof(float));
			rc = dps_coll_reducescatterv(col, s->m_y, o, counts, DPS_F32);
			if (rc)
				return rc;
		}
	} else {
		memcpy(o, s->m_y, sizeof(float) * (size_t)n * (size_t)dim);
	}
	return allreduce(s, s->tp_c, DPS_SG_TP, o, (size_t)n * (size_t)dim);
}

/*
 * EP, all-to-all-v: x (R rows, the residual, the same on every member of group G) becomes x +
 * MoE(norm(x)) in out. Member me of G takes rows [R*me/n, R*(me+1)/n), sends each of its
 * (row, choice) items to the EP rank holding the expert, gets the expert outputs back, adds
 * them in the router's order, and the members' rows are all-gathered over G.
 */
static int moe_a2a(struct dps_shard *s, int l, struct dps_comm *G, int sg, int R, const float *x,
		   const int *pad, float *out)
{
	const struct dps_shard_layer *w = &s->layers[l];
	const int dim = s->cfg.hidden_size, k = s->cfg.num_experts_per_tok, ep = s->ep_n;
	const int gn = G ? G->n : 1, me = G ? G->me : 0;
	const int lo = (int)((long)R * me / gn), hi = (int)((long)R * (me + 1) / gn), m = hi - lo;
	const size_t item = (size_t)dim + 1;
	struct dps_comm *world = s->w ? s->w->world_c : NULL;
	size_t sc[DPS_MAX_WORLD], rcn[DPS_MAX_WORLD], at[DPS_MAX_WORLD];
	int cnt[DPS_MAX_WORLD], cin[DPS_MAX_WORLD], items = 0, sent = 0, rc;
	float *z = s->m_y;

	DPS_ASSERT(ep >= 1 && ep <= DPS_MAX_WORLD && (!world || world->n == ep) &&
		   m <= s->moe_route);
	for (int i = 0; i < m; i++)
		dps_rmsnorm(s->m_h + (size_t)i * dim, x + (size_t)(lo + i) * dim, w->ffn_norm, dim,
			    (float)s->cfg.rms_norm_eps);
	moe_route(s, w, m, s->m_h, pad ? pad + lo : NULL);
	/* Items by destination rank, in (row, choice) order within each; padding sends none. */
	memset(cnt, 0, sizeof(int) * (size_t)ep);
	for (int q = 0; q < m * k; q++)
		if (s->m_e[q] >= 0)
			cnt[s->m_e[q] / s->e_per]++;
	for (int p = 0, a = 0; p < ep; a += cnt[p], p++)
		at[p] = (size_t)a;
	for (int q = 0; q < m * k; q++) {
		const int e = s->m_e[q];
		float *it;

		if (e < 0)
			continue;
		it = s->m_send + at[e / s->e_per] * item;
		s->m_pos[q] = (int)at[e / s->e_per]++;
		memcpy(it, s->m_h + (size_t)(q / k) * dim, sizeof(float) * (size_t)dim);
		it[dim] = (float)e;
	}
	/* How many items each rank receives from each. */
	for (int p = 0; p < ep; p++)
		sc[p] = rcn[p] = 1;
	if (world) {
		count(s, DPS_COLL_ALLTOALL, DPS_SG_EP, (size_t)ep * sizeof(int));
		rc = dps_coll_alltoallv(world, cnt, sc, NULL, cin, rcn, NULL, DPS_I32);
		if (rc)
			return rc;
	} else {
		cin[0] = cnt[0];
	}
	for (int p = 0; p < ep; p++) {
		sc[p] = (size_t)cnt[p] * item;
		rcn[p] = (size_t)cin[p] * item;
		items += cin[p];
		sent += cnt[p];
	}
	DPS_ASSERT(items <= s->moe_items);
	if (world) {
		count(s, DPS_COLL_ALLTOALL, DPS_SG_EP, (size_t)sent * item * sizeof(float));
		rc = dps_coll_alltoallv(world, s->m_send, sc, NULL, s->m_recv, rcn, NULL, DPS_F32);
		if (rc)
			return rc;
	} else {
		memcpy(s->m_recv, s->m_send, sizeof(float) * (size_t)items * item);
	}
	/* The received items, one expert each, computed and returned in arrival order. */
	for (int i = 0; i < items; i++)
		s->m_e2[i] = (int)s->m_recv[(size_t)i * item + (size_t)dim];
	experts_run(s, w, items, s->m_recv, item, s->m_e2, NULL, 1, s->m_ret);
	for (int p = 0; p < ep; p++) {
		sc[p] = (size_t)cin[p] * (size_t)dim;
		rcn[p] = (size_t)cnt[p] * (size_t)dim;
	}
	if (world) {
		count(s, DPS_COLL_ALLTOALL, DPS_SG_EP, (size_t)items * dim * sizeof(float));
		rc = dps_coll_alltoallv(world, s->m_ret, sc, NULL, s->m_send, rcn, NULL, DPS_F32);
		if (rc)
			return rc;
	} else {
		memcpy(s->m_send, s->m_ret, sizeof(float) * (size_t)items * (size_t)dim);
	}
	/* Combine: the residual plus the k outputs in the router's order (as on one rank). */
	for (int i = 0; i < m; i++) {
		float *zi = z + (size_t)i * dim;

		memcpy(zi, x + (size_t)(lo + i) * dim, sizeof(float) * (size_t)dim);
		for (int j = 0; j < k && s->m_e[(size_t)i * k] >= 0; j++) {
			const float wt = s->m_w[(size_t)i * k + (size_t)j];
			const float *y = s->m_send + (size_t)s->m_pos[(size_t)i * k + (size_t)j] * dim;

			for (int d = 0; d < dim; d++)
				zi[d] += wt * y[d];
		}
	}
	if (gn == 1) {
		memcpy(out, z, sizeof(float) * (size_t)m * (size_t)dim);
		return 0;
	}
	for (int q = 0; q < gn; q++)
		sc[q] = (size_t)((long)R * (q + 1) / gn - (long)R * q / gn) * (size_t)dim;
	count(s, DPS_COLL_ALLGATHER, sg, (size_t)R * dim * sizeof(float));
	return dps_coll_allgatherv(G, z, out, sc, NULL, DPS_F32);
}

/* ---- embedding and LM head ------------------------------------------------------------------- */

/* x (n, hidden) = rows of ids found in a vocabulary shard starting at lo (per rows), else 0. */
static void lookup(const struct dps_shard *s, const float *table, int lo, int per, const int *ids, int n,
		   float *x)
{
	const int dim = s->cfg.hidden_size;

	for (int i = 0; i < n; i++) {
		const int v = ids[i] - lo;

		if (v >= 0 && v < per)
			dps_embedding(x + (size_t)i * dim, table, dim, v);
		else
			memset(x + (size_t)i * dim, 0, sizeof(float) * (size_t)dim);
	}
}

/*
 * Logits of rows h (m rows, normed) against a vocabulary shard table (per rows, shard index
 * me of size n shards gathered over comm): lg2 gets every shard for every row; rows
 * [first, first + keep) are assembled into out (keep, vocab).
 */
static int project(struct dps_shard *s, const float *h, int m, const float *table, int per,
		   struct dps_comm *comm, int sg, int first, int keep, float *out)
{
	const int V = s->cfg.vocab_size, nsh = comm ? comm->n : 1;
	int rc;

	lin(s, s->lg, h, table, m, per, s->cfg.hidden_size);
	rc = allgather(s, comm, sg, s->lg, s->lg2, (size_t)m * (size_t)per, DPS_F32);
	if (rc)
		return rc;
	for (int i = 0; i < keep; i++)
		for (int q = 0; q < nsh; q++) {
			const int lo = q * per, n = lo + per <= V ? per : V - lo;

			if (n > 0)
				memcpy(out + (size_t)i * (size_t)V + lo,
				       s->lg2 + ((size_t)q * (size_t)m + (size_t)(first + i)) * (size_t)per,
				       sizeof(float) * (size_t)n);
		}
	return 0;
}

/* ---- the step -------------------------------------------------------------------------------- */

/* Keeps this replica's n rows x (the input of layer l) where an Eagle3 draft fuses them. */
static void keep_aux(struct dps_shard *s, int l, const float *x, int n)
{
	const size_t dim = (size_t)s->cfg.hidden_size;

	for (int k = 0; k < s->n_aux; k++)
		if (s->aux_l[k] == l)
			for (int i = 0; i < n; i++)
				memcpy(s->aux + ((size_t)i * 3 + (size_t)k) * dim, x + (size_t)i * dim,
				       sizeof(float) * dim);
}

int dps_shard_set_aux(struct dps_shard *s, const int *aux, char *err, size_t errlen)
{
	for (int k = 0; k < 3; k++)
		if (aux[k] < 0 || aux[k] >= s->cfg.num_hidden_layers) {
			snprintf(err, errlen, "the draft fuses layer %d; the target has %d layers",
				 aux[k], s->cfg.num_hidden_layers);
			return -EINVAL;
		}
	free(s->aux);
	s->aux = calloc((size_t)s->max_rows * 3 * (size_t)s->cfg.hidden_size, sizeof(float));
	if (!s->aux) {
		s->n_aux = 0;
		snprintf(err, errlen, "out of memory for the draft's hidden states");
		return -ENOMEM;
	}
	memcpy(s->aux_l, aux, sizeof(s->aux_l));
	s->n_aux = 3;
	return 0;
}

const float *dps_shard_draft_step(struct dps_shard *d, const struct dps_shard *t,
				  const struct dps_rows *r, const float *hin, int fused,
				  float *hout, int *rcp)
{
	const int n = r->n, dim = d->cfg.hidden_size, cm = d->c[DPS_COMP_MLP];
	const struct dps_shard_layer *w = &d->layers[0];
	const float eps = (float)d->cfg.rms_norm_eps;
	struct dps_comm *col = d->col_c[DPS_COMP_MLP];
	size_t counts[DPS_MAX_WORLD];
	int R = n, first = 0, n_out = 0, rc = 0, dummy;

	if (!rcp)
		rcp = &dummy;
	*rcp = 0;
	DPS_ASSERT(d->draft && n >= 0 && n <= d->max_rows);
	for (int i = 0; i < n; i++)
		DPS_ASSERT(r->tokens[i] >= 0 && r->tokens[i] < t->cfg.vocab_size && r->pos[i] >= 0 &&
			   r->pos[i] < d->max_pos && r->slot[i] < d->num_blocks * d->block_size &&
			   (r->table[i] || r->slot[i] < 0));
	if (!n && cm == 1)
		return d->logits; /* nothing here, and no replica waits for this one */
	d->steps++;
	d->cur_prefill = 0;
	d->cur_layer = 0;
	/* The draft MLP column's row counts: replicas draft different amounts. */
	if (cm > 1) {
		int *cnt = d->ids;

		rc = allgather(d, col, DPS_SG_MLP_COL, &n, cnt, 1, DPS_I32);
		if (rc)
			goto fail;
		R = 0;
		for (int q = 0; q < cm; q++) {
			counts[q] = (size_t)cnt[q] * (size_t)dim;
			if (q < d->j[DPS_COMP_MLP])
				first += cnt[q];
			R += cnt[q];
		}
		DPS_ASSERT(R <= d->max_gather);
	}
	if (n) {
		/* The target's token embedding (plain TP shard) into o. */
		lookup(t, t->emb_p, t->t * t->v_tp, t->v_tp, r->tokens, n, d->o);
		rc = allreduce(d, d->tp_c, DPS_SG_TP, d->o, (size_t)n * dim);
		if (rc)
			goto fail;
		/* The residual x: fc over the three fused states (this rank's columns), or the
		 * draft's own previous state. */
		if (fused) {
			const size_t w3 = 3 * (size_t)dim, c0 = (size_t)d->t * (size_t)d->fc_w;
			const size_t cn = c0 >= w3 ? 0 : w3 - c0 < (size_t)d->fc_w ? w3 - c0
										    : (size_t)d->fc_w;

			for (int i = 0; i < n; i++) {
				float *dst = d->fcin + (size_t)i * (size_t)d->fc_w;

				memcpy(dst, hin + (size_t)i * w3 + c0, sizeof(float) * cn);
				memset(dst + cn, 0, sizeof(float) * ((size_t)d->fc_w - cn));
			}
			lin(d, d->x, d->fcin, d->fc, n, dim, d->fc_w);
			rc = allreduce(d, d->tp_c, DPS_SG_TP, d->x, (size_t)n * dim);
			if (rc)
				goto fail;
		} else {
			memcpy(d->x, hin, sizeof(float) * (size_t)n * dim);
		}
		/* Attention over [input_layernorm(embedding), hidden_norm(x)]. */
		for (int i = 0; i < n; i++) {
			float *h = d->h + (size_t)i * 2 * (size_t)dim;

			dps_rmsnorm(h, d->o + (size_t)i * dim, w->attn_norm, dim, eps);
			dps_rmsnorm(h + dim, d->x + (size_t)i * dim, d->hidden_norm, dim, eps);
		}
		attn_prefill(d, 0, r, d->h, d->o);
		rc = allreduce(d, d->tp_c, DPS_SG_TP, d->o, (size_t)n * dim);
		if (rc)
			goto fail;
		for (size_t i = 0; i < (size_t)n * dim; i++)
			d->x[i] += d->o[i];
		for (int i = 0; i < n; i++)
			dps_rmsnorm(d->o + (size_t)i * dim, d->x + (size_t)i * dim, w->ffn_norm, dim,
				    eps);
	}
	/* The MLP over TP x c_draft_mlp: gather the column's rows, reduce, keep mine. */
	if (cm > 1) {
		count(d, DPS_COLL_ALLGATHER, DPS_SG_MLP_COL, (size_t)R * dim * sizeof(float));
		rc = dps_coll_allgatherv(col, d->o, d->h, counts, NULL, DPS_F32);
		if (rc)
			goto fail;
	} else {
		memcpy(d->h, d->o, sizeof(float) * (size_t)n * dim);
	}
	if (R)
		mlp(d, 0, R, d->h, d->o);
	rc = allreduce(d, d->comp_c[DPS_COMP_MLP], cm > 1 ? DPS_SG_MLP_COMP : DPS_SG_TP, d->o,
		       (size_t)R * dim);
	if (rc)
		goto fail;
	for (size_t i = 0; i < (size_t)n * dim; i++)
		d->x[i] += d->o[(size_t)first * dim + i];
	d->cur_layer = -1;
	if (hout)
		memcpy(hout, d->x, sizeof(float) * (size_t)n * dim);
	for (int i = 0; i < n; i++)
		if (!r->want || r->want[i]) {
			dps_rmsnorm(d->h + (size_t)n_out * dim, d->x + (size_t)i * dim, d->final_norm,
				    dim, eps);
			n_out++;
		}
	rc = project(d, d->h, n_out, d->lm_p, d->v_tp, d->tp_c, DPS_SG_TP, 0, n_out, d->logits);
	if (rc)
		goto fail;
	return d->logits;
fail:
	*rcp = rc;
	return NULL;
}

static const float *step_prefill(struct dps_shard *s, const struct dps_rows *r, int *rcp)
{
	const int n = r->n, *tokens = r->tokens;
	const unsigned char *want = r->want;
	const struct dps_model_config *c = &s->cfg;
	const int dim = c->hidden_size, cm = s->c[DPS_COMP_MLP];
	const float eps = (float)c->rms_norm_eps;
	struct dps_comm *col = s->col_c[DPS_COMP_MLP];
	size_t counts[DPS_MAX_WORLD];
	int R = n, first = 0, n_out = 0, rc;
	int *cnt = s->ids, *moe_cnt = NULL;

	/* The MLP column's row counts (replicas prefill different amounts). */
	if (cm > 1) {
		rc = allgather(s, col, DPS_SG_MLP_COL, &n, cnt, 1, DPS_I32);
		if (rc)
			goto fail;
		R = 0;
		for (int q = 0; q < cm; q++) {
			counts[q] = (size_t)cnt[q] * (size_t)dim;
			if (q < s->j[DPS_COMP_MLP])
				first += cnt[q];
			R += cnt[q];
		}
		/* Every replica must be loaded with the same max_rows (shard.h). */
		DPS_ASSERT(R <= s->max_gather);
	}
	/* The all-gather dispatch meets every replica's rows: their counts, once per step. */
	if (s->moe == DPS_MOE_EP_AG) {
		moe_cnt = s->m_pad;
		rc = allgather(s, s->dp_c, DPS_SG_EP, &n, moe_cnt, 1, DPS_I32);
		if (rc)
			goto fail;
	}
	lookup(s, s->emb_p, s->t * s->v_tp, s->v_tp, tokens, n, s->x);
	rc = allreduce(s, s->tp_c, DPS_SG_TP, s->x, (size_t)n * dim);
	if (rc)
		goto fail;
	for (int l = 0; l < c->num_hidden_layers; l++) {
		const struct dps_shard_layer *w = &s->layers[l];

		s->cur_layer = l;
		if (s->n_aux)
			keep_aux(s, l, s->x, n);
		for (int i = 0; i < n; i++)
			dps_rmsnorm(s->h + (size_t)i * dim, s->x + (size_t)i * dim, w->attn_norm, dim,
				    eps);
		if (n)
			attn_prefill(s, l, r, s->h, s->o);
		rc = allreduce(s, s->tp_c, DPS_SG_TP, s->o, (size_t)n * dim);
		if (rc)
			goto fail;
		for (size_t i = 0; i < (size_t)n * dim; i++)
			s->x[i] += s->o[i];
		if (moe_layer(s, l) && s->moe == DPS_MOE_EP_A2A) {
			/* The rows stay sequence parallel over TP: no MLP column gather. */
			rc = moe_a2a(s, l, s->tp_c, DPS_SG_TP, n, s->x, NULL, s->x);
			if (rc)
				goto fail;
			continue;
		}
		/* The MLP over TP x c_mlp: gather the column's rows, reduce, keep mine. */
		for (int i = 0; i < n; i++)
			dps_rmsnorm(s->o + (size_t)i * dim, s->x + (size_t)i * dim, w->ffn_norm, dim,
				    eps);
		if (moe_layer(s, l) && s->moe == DPS_MOE_EP_AG) {
			rc = moe_ag(s, l, n, s->o, s->h, moe_cnt, NULL);
			if (rc)
				goto fail;
			for (size_t i = 0; i < (size_t)n * dim; i++)
				s->x[i] += s->h[i];
			continue;
		}
		if (cm > 1) {
			count(s, DPS_COLL_ALLGATHER, DPS_SG_MLP_COL, (size_t)R * dim * sizeof(float));
			rc = dps_coll_allgatherv(col, s->o, s->h, counts, NULL, DPS_F32);
			if (rc)
				goto fail;
		} else {
			memcpy(s->h, s->o, sizeof(float) * (size_t)n * dim);
		}
		if (R && moe_layer(s, l))
			moe_tp(s, l, R, s->h, s->o);
		else if (R)
			mlp(s, l, R, s->h, s->o);
		rc = allreduce(s, s->comp_c[DPS_COMP_MLP], DPS_SG_MLP_COMP, s->o, (size_t)R * dim);
		if (rc)
			goto fail;
		for (size_t i = 0; i < (size_t)n * dim; i++)
			s->x[i] += s->o[(size_t)first * dim + i];
	}
	s->cur_layer = -1;
	for (int i = 0; i < n; i++)
		if (!want || want[i]) {
			dps_rmsnorm(s->h + (size_t)n_out * dim, s->x + (size_t)i * dim, s->final_norm,
				    dim, eps);
			n_out++;
		}
	rc = project(s, s->h, n_out, s->lm_p, s->v_tp, s->tp_c, DPS_SG_TP, 0, n_out, s->logits);
	if (rc)
		goto fail;
	return s->logits;
fail:
	*rcp = rc;
	return NULL;
}

static const float *step_decode(struct dps_shard *s, const struct dps_rows *r, int *rcp)
{
	const int B = r->n, *tokens = r->tokens;
	const unsigned char *want = r->want;
	const struct dps_model_config *c = &s->cfg;
	const int dim = c->hidden_size;
	const int ce = s->c[DPS_COMP_EMB], ca = s->c[DPS_COMP_ATTN], cm = s->c[DPS_COMP_MLP];
	const int cl = s->c[DPS_COMP_LM_HEAD];
	const float eps = (float)c->rms_norm_eps;
	const int Ra = B * ca, Rm = B * cm;
	int n_out = 0, rc, cur = cm; /* the column size the residual s->x is gathered over */

	int *pad = NULL;

	DPS_ASSERT(B * ce <= s->max_gather && Ra <= s->max_gather && Rm <= s->max_gather &&
		   B * cl <= s->max_gather);
	if (s->moe == DPS_MOE_EP_AG || s->moe == DPS_MOE_EP_A2A) {
		/*
		 * Which rows are padding (a decode row that writes no KV slot): they choose no
		 * expert. The all-gather dispatch meets the rows of the DP group (their flags are
		 * gathered over it), the all-to-all one those of the attention column.
		 */
		int *mine = s->m_pad + (size_t)s->par.dp * (size_t)s->max_rows;

		for (int i = 0; i < B; i++)
			mine[i] = r->slot[i] < 0;
		pad = s->m_pad;
		if (s->moe == DPS_MOE_EP_AG)
			rc = allgather(s, s->dp_c, DPS_SG_EP, mine, pad, (size_t)B, DPS_I32);
		else
			rc = allgather(s, s->col_c[DPS_COMP_ATTN], DPS_SG_ATTN_COL, mine, pad, (size_t)B,
				       DPS_I32);
		if (rc)
			goto fail;
	}
	/* Embedding bracket: gather the ids over the column, look up the shard, reduce. */
	rc = allgather(s, s->col_c[DPS_COMP_EMB], DPS_SG_EMB_COL, tokens, s->ids, (size_t)B,
		       DPS_I32);
	if (rc)
		goto fail;
	lookup(s, s->emb_d, (s->j[DPS_COMP_EMB] * s->par.tp + s->t) * s->v_emb, s->v_emb, s->ids,
	       B * ce, s->h);
	rc = allreduce(s, s->comp_c[DPS_COMP_EMB], ce > 1 ? DPS_SG_EMB_COMP : DPS_SG_TP, s->h,
		       (size_t)B * ce * dim);
	if (rc)
		goto fail;
	rc = dps_dp_transition(s, s->h, s->x, B, dim, ce, cm, s->col_c[DPS_COMP_MLP],
			       DPS_SG_MLP_COL);
	if (rc)
		goto fail;
	for (int l = 0; l < c->num_hidden_layers; l++) {
		const struct dps_shard_layer *w = &s->layers[l];
		float *xa = s->o; /* x at the attention's size */

		s->cur_layer = l;
		if (s->n_aux)
			keep_aux(s, l, s->x + (size_t)(s->d % cur) * (size_t)B * (size_t)dim, B);
		rc = dps_dp_transition(s, s->x, xa, B, dim, cur, ca, s->col_c[DPS_COMP_ATTN],
				       DPS_SG_ATTN_COL);
		if (rc)
			goto fail;
		for (int i = 0; i < Ra; i++)
			dps_rmsnorm(s->h + (size_t)i * dim, xa + (size_t)i * dim, w->attn_norm, dim,
				    eps);
		if (ca > 1) {
			/* xa is kept in s->o: the attention output goes to s->x as scratch. */
			rc = attn_decode(s, l, r, s->h, s->x);
			if (rc)
				goto fail;
		} else {
			attn_prefill(s, l, r, s->h, s->x);
		}
		rc = allreduce(s, s->comp_c[DPS_COMP_ATTN], ca > 1 ? DPS_SG_ATTN_COMP : DPS_SG_TP,
			       s->x, (size_t)Ra * dim);
		if (rc)
			goto fail;
		for (size_t i = 0; i < (size_t)Ra * dim; i++)
			xa[i] += s->x[i];
		if (moe_layer(s, l) && s->moe == DPS_MOE_EP_A2A) {
			/* Sequence parallel over the ranks holding these rows: no _dp_transition. */
			rc = moe_a2a(s, l, ca > 1 ? s->comp_c[DPS_COMP_ATTN] : s->tp_c,
				     ca > 1 ? DPS_SG_ATTN_COMP : DPS_SG_TP, Ra, xa, pad, s->x);
			if (rc)
				goto fail;
			cur = ca;
			continue;
		}
		rc = dps_dp_transition(s, xa, s->x, B, dim, ca, cm, s->col_c[DPS_COMP_MLP],
				       DPS_SG_MLP_COL);
		if (rc)
			goto fail;
		cur = cm;
		for (int i = 0; i < Rm; i++)
			dps_rmsnorm(s->h + (size_t)i * dim, s->x + (size_t)i * dim, w->ffn_norm, dim,
				    eps);
		if (moe_layer(s, l) && s->moe == DPS_MOE_EP_AG) {
			DPS_ASSERT(cm == 1); /* dps_par_cfg_check */
			rc = moe_ag(s, l, B, s->h, s->o, NULL, pad);
		} else {
			if (moe_layer(s, l))
				moe_tp(s, l, Rm, s->h, s->o);
			else
				mlp(s, l, Rm, s->h, s->o);
			rc = allreduce(s, s->comp_c[DPS_COMP_MLP], cm > 1 ? DPS_SG_MLP_COMP : DPS_SG_TP,
				       s->o, (size_t)Rm * dim);
		}
		if (rc)
			goto fail;
		for (size_t i = 0; i < (size_t)Rm * dim; i++)
			s->x[i] += s->o[i];
	}
	s->cur_layer = -1;
	/* LM head bracket: my rows, norm, gather over the column, project the shard, my rows. */
	for (int i = 0; i < B; i++)
		dps_rmsnorm(s->h + (size_t)i * dim,
			    s->x + ((size_t)(s->d % cur) * (size_t)B + (size_t)i) * dim,
			    s->final_norm, dim, eps);
	rc = allgather(s, s->col_c[DPS_COMP_LM_HEAD], DPS_SG_LM_COL, s->h, s->o, (size_t)B * dim,
		       DPS_F32);
	if (rc)
		goto fail;
	rc = project(s, s->o, B * cl, s->lm_d, s->v_lm, s->comp_c[DPS_COMP_LM_HEAD],
		     cl > 1 ? DPS_SG_LM_COMP : DPS_SG_TP, s->j[DPS_COMP_LM_HEAD] * B, B, s->logits);
	if (rc)
		goto fail;
	/* Pack the wanted rows. */
	for (int i = 0; i < B; i++)
		if (!want || want[i]) {
			if (n_out != i)
				memmove(s->logits + (size_t)n_out * c->vocab_size,
					s->logits + (size_t)i * c->vocab_size,
					sizeof(float) * (size_t)c->vocab_size);
			n_out++;
		}
	return s->logits;
fail:
	*rcp = rc;
	return NULL;
}

const float *dps_shard_step_rows(struct dps_shard *s, int prefill, const struct dps_rows *r,
				 int *rc)
{
	int dummy;

	if (!rc)
		rc = &dummy;
	*rc = 0;
	DPS_ASSERT(r->n >= 0 && r->n <= s->max_rows);
	for (int i = 0; i < r->n; i++)
		DPS_ASSERT(r->tokens[i] >= 0 && r->tokens[i] < s->cfg.vocab_size && r->pos[i] >= 0 &&
			   r->pos[i] < s->max_pos &&
			   r->slot[i] < s->num_blocks * s->block_size &&
			   (r->table[i] || r->slot[i] < 0));
	s->steps++;
	s->cur_prefill = prefill;
	s->cur_layer = -1;
	return prefill ? step_prefill(s, r, rc) : step_decode(s, r, rc);
}

const float *dps_shard_step(struct dps_shard *s, int prefill, int n, const int *tokens,
			    const int *pos, const int *seq, const unsigned char *want, int *rc)
{
	struct dps_rows r = { n, tokens, pos, s->rows_slot, (const int *const *)s->rows_table, want };

	/* Sequence k owns blocks [k * bps, (k + 1) * bps): its table is that run. */
	DPS_ASSERT(n >= 0 && n <= s->max_rows);
	for (int i = 0; i < n; i++) {
		DPS_ASSERT(seq[i] < s->max_seqs && pos[i] >= 0 && pos[i] < s->max_pos);
		s->rows_table[i] = seq[i] >= 0 ? s->seq_tables + (size_t)seq[i] * (size_t)s->bps : NULL;
		s->rows_slot[i] = seq[i] >= 0 ? seq[i] * s->bps * s->block_size + pos[i] : DPS_PAD_SLOT;
	}
	return dps_shard_step_rows(s, prefill, &r, rc);
}
