/* SPDX-License-Identifier: MIT */
/*
 * engine/model/model.c - the whole-model decoder (see model.h). Called by `dpshard generate` on
 * one rank, and by the tests as the oracle of the sharded forward pass and the engine.
 */
#include <string.h>

#include "common/dps.h"
#include "engine/model/ckpt.h"
#include "engine/model/gpt_oss.h"
#include "engine/model/model.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/mxfp4.h"
#include "kernels/pool.h"

/* Reads tensor name, of shape (d0[, d1]), into dst (allocated by the caller). */
static int load_into(struct dps_ckpt *ck, float *dst, const char *name, int ndim, uint64_t d0,
		     uint64_t d1, char *err, size_t errlen)
{
	const uint64_t shape[2] = { d0, d1 };

	return dps_ckpt_load_shard(ck, name, ndim, shape, 0, 0, 1, dst, err, errlen);
}

/* Checks that tensor name has shape (d0[, d1]) before anything is allocated for it. */
static int check_shape(struct dps_ckpt *ck, const char *name, int ndim, uint64_t d0, uint64_t d1,
		       char *err, size_t errlen)
{
	const struct dps_st_tensor *t = dps_ckpt_find(ck, name, NULL);

	/* A config.json can claim any size, the file cannot: the loader names the mismatch. */
	if (!t || t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1))
		return load_into(ck, NULL, name, ndim, d0, d1, err, errlen);
	return 0;
}

static int alloc_weight(struct dps_model *m, float **dst, size_t n, const char *dir,
			const char *what, char *err, size_t errlen)
{
	*dst = dps_alloc_huge(n * sizeof(float));
	if (!*dst) {
		snprintf(err, errlen, "%s: cannot allocate %zu bytes for '%s'", dir,
			 n * sizeof(float), what);
		return -ENOMEM;
	}
	m->weight_bytes += n * sizeof(float);
	return 0;
}

static int load(struct dps_ckpt *ck, struct dps_model *m, float **dst, const char *name, int ndim,
		uint64_t d0, uint64_t d1, char *err, size_t errlen)
{
	int rc = check_shape(ck, name, ndim, d0, d1, err, errlen);

	if (!rc)
		rc = alloc_weight(m, dst, (size_t)d0 * (ndim == 2 ? (size_t)d1 : 1), ck->dir, name,
				  err, errlen);
	return rc ? rc : load_into(ck, *dst, name, ndim, d0, d1, err, errlen);
}

/*
 * Loads the n tensors names[i] of shape (rows[i], cols), stacked in that order into one
 * allocation (*dst), and points parts[i] at each.
 */
static int load_stacked(struct dps_ckpt *ck, struct dps_model *m, float **dst, float **parts,
			const char *const *names, const uint64_t *rows, int n, uint64_t cols,
			char *err, size_t errlen)
{
	size_t total = 0, off = 0;
	int rc = 0;

	for (int i = 0; i < n && !rc; i++) {
		rc = check_shape(ck, names[i], 2, rows[i], cols, err, errlen);
		total += (size_t)rows[i] * (size_t)cols;
	}
	if (!rc)
		rc = alloc_weight(m, dst, total, ck->dir, names[0], err, errlen);
	for (int i = 0; i < n && !rc; i++) {
		parts[i] = *dst + off;
		rc = load_into(ck, parts[i], names[i], 2, rows[i], cols, err, errlen);
		off += (size_t)rows[i] * (size_t)cols;
	}
	return rc;
}

/* The 1-D tensors names[i] of n[i] floats, stacked into one allocation (*dst). */
static int load_vecs(struct dps_ckpt *ck, struct dps_model *m, float **dst,
		     const char *const *names, const uint64_t *n, int count, char *err,
		     size_t errlen)
{
	size_t total = 0, off = 0;
	int rc = 0;

	for (int i = 0; i < count && !rc; i++) {
		rc = check_shape(ck, names[i], 1, n[i], 0, err, errlen);
		total += (size_t)n[i];
	}
	if (!rc)
		rc = alloc_weight(m, dst, total, ck->dir, names[0], err, errlen);
	for (int i = 0; i < count && !rc; i++) {
		rc = load_into(ck, *dst + off, names[i], 1, n[i], 0, err, errlen);
		off += (size_t)n[i];
	}
	return rc;
}

static int alloc_bytes(struct dps_model *m, uint8_t **dst, size_t n, const char *dir,
		       const char *what, char *err, size_t errlen)
{
	*dst = dps_alloc_huge(n);
	if (!*dst) {
		snprintf(err, errlen, "%s: cannot allocate %zu bytes for '%s'", dir, n, what);
		return -ENOMEM;
	}
	m->weight_bytes += n;
	return 0;
}

/*
 * GPT-OSS's experts of layer l: router and bias, every expert read whole by gpt_oss.c from
 * its Hugging Face layout into dpshard's (out, in) rows (f32, or MXFP4 kept as it is), and
 * their biases.
 */
static int load_gpt_oss_experts(struct dps_ckpt *ck, struct dps_model *m,
				struct dps_layer_weights *w, int l, char *err, size_t errlen)
{
	const struct dps_model_config *c = &m->cfg;
	const uint64_t E = (uint64_t)c->num_local_experts, h = (uint64_t)c->hidden_size;
	const uint64_t im = (uint64_t)c->intermediate_size;
	char n0[192];
	int rc, q;

	snprintf(n0, sizeof(n0), "model.layers.%d.mlp.router.weight", l);
	rc = load(ck, m, &w->router, n0, 2, E, h, err, errlen);
	snprintf(n0, sizeof(n0), "model.layers.%d.mlp.router.bias", l);
	if (!rc)
		rc = load(ck, m, &w->router_bias, n0, 1, E, 0, err, errlen);
	q = rc ? 0 : dps_gptoss_experts_mxfp4(ck, l, err, errlen);
	if (q < 0)
		rc = q;
	if (!rc) {
		w->exp_gate_up = calloc(E, sizeof(float *));
		w->exp_down = calloc(E, sizeof(float *));
		w->exp_gu_q = calloc(E, sizeof(uint8_t *));
		w->exp_gu_s = calloc(E, sizeof(uint8_t *));
		w->exp_dn_q = calloc(E, sizeof(uint8_t *));
		w->exp_dn_s = calloc(E, sizeof(uint8_t *));
		if (!w->exp_gate_up || !w->exp_down || !w->exp_gu_q || !w->exp_gu_s ||
		    !w->exp_dn_q || !w->exp_dn_s) {
			snprintf(err, errlen, "%s: out of memory", ck->dir);
			rc = -ENOMEM;
		}
	}
	snprintf(n0, sizeof(n0), "model.layers.%d.mlp.experts", l);
	if (!rc)
		rc = alloc_weight(m, &w->exp_gu_bias, (size_t)(E * 2 * im), ck->dir, n0, err, errlen);
	for (uint64_t e = 0; e < E && !rc; e++) {
		struct dps_gptoss_expert d = { .gu_b = w->exp_gu_bias + e * 2 * im };

		if (q) {
			rc = alloc_bytes(m, &w->exp_gu_q[e], 2 * im * h / 2, ck->dir, n0, err, errlen);
			if (!rc)
				rc = alloc_bytes(m, &w->exp_gu_s[e], 2 * im * h / 32, ck->dir, n0, err,
						 errlen);
			if (!rc)
				rc = alloc_bytes(m, &w->exp_dn_q[e], h * im / 2, ck->dir, n0, err, errlen);
			if (!rc)
				rc = alloc_bytes(m, &w->exp_dn_s[e], h * im / 32, ck->dir, n0, err,
						 errlen);
			d.gu_q = w->exp_gu_q[e];
			d.gu_s = w->exp_gu_s[e];
			d.dn_q = w->exp_dn_q[e];
			d.dn_s = w->exp_dn_s[e];
		} else {
			rc = alloc_weight(m, &w->exp_gate_up[e], (size_t)(2 * im * h), ck->dir, n0, err,
					  errlen);
			if (!rc)
				rc = alloc_weight(m, &w->exp_down[e], (size_t)(im * h), ck->dir, n0, err,
						  errlen);
			d.gu = w->exp_gate_up[e];
			d.dn = w->exp_down[e];
		}
		if (!rc)
			rc = dps_gptoss_expert_read(ck, l, (int)e, 0, (int)im, q, &d, err, errlen);
	}
	snprintf(n0, sizeof(n0), "model.layers.%d.mlp.experts.down_proj_bias", l);
	if (!rc)
		rc = load(ck, m, &w->exp_dn_bias, n0, 2, E, h, err, errlen);
	return rc;
}

int dps_model_load(struct dps_model *m, const char *dir, const struct dps_model_opts *opts,
		   char *err, size_t errlen)
{
	struct dps_ckpt ck;
	struct dps_model_config *c = &m->cfg;
	const struct dps_model_opts none = { 0 };
	size_t kv, cache, rows, hd;
	int rc, qd, max_pos;

	if (!opts)
		opts = &none;
	memset(m, 0, sizeof(*m));
	rc = dps_ckpt_open(&ck, dir, err, errlen);
	if (rc)
		return rc;
	*c = ck.cfg;
	m->inv_freq = calloc((size_t)c->head_dim / 2, sizeof(float));
	if (!m->inv_freq) {
		dps_ckpt_close(&ck);
		snprintf(err, errlen, "%s: out of memory", dir);
		return -ENOMEM;
	}
	dps_cfg_rope_freqs(c, m->inv_freq, &m->rope_attn);
	qd = c->num_attention_heads * c->head_dim;
	kv = (size_t)c->num_key_value_heads * (size_t)c->head_dim;
	hd = (size_t)c->head_dim;
	/* The cache holds at most the model's context, however many positions are asked for. */
	max_pos = opts->max_pos;
	m->max_pos = max_pos > 0 && max_pos < c->max_position_embeddings
			     ? max_pos : c->max_position_embeddings;
	m->max_seqs = opts->max_seqs > 0 ? opts->max_seqs : 1;
	m->max_rows = opts->max_rows > 0 ? opts->max_rows : 1;
	m->max_out = opts->max_out > 0 && opts->max_out < m->max_rows ? opts->max_out : m->max_rows;
	m->layers = calloc((size_t)c->num_hidden_layers, sizeof(*m->layers));
	if (!m->layers) {
		snprintf(err, errlen, "%s: out of memory", dir);
		rc = -ENOMEM;
		goto out;
	}
	rc = load(&ck, m, &m->embed, "model.embed_tokens.weight", 2, (uint64_t)c->vocab_size,
		  (uint64_t)c->hidden_size, err, errlen);
	for (int l = 0; l < c->num_hidden_layers && !rc; l++) {
		struct dps_layer_weights *w = &m->layers[l];
		const uint64_t h = (uint64_t)c->hidden_size, im = (uint64_t)c->intermediate_size;
		char n0[96], n1[96], n2[96];
		const char *names[3] = { n0, n1, n2 };
		float *parts[3];

#define NM(buf, suffix) snprintf(buf, sizeof(buf), "model.layers.%d.%s", l, suffix)
		NM(n0, "input_layernorm.weight");
		rc = load(&ck, m, &w->attn_norm, n0, 1, h, 0, err, errlen);
		if (!rc) {
			const uint64_t r[3] = { (uint64_t)qd, kv, kv };

			NM(n0, "self_attn.q_proj.weight");
			NM(n1, "self_attn.k_proj.weight");
			NM(n2, "self_attn.v_proj.weight");
			rc = load_stacked(&ck, m, &w->wqkv, parts, names, r, 3, h, err, errlen);
			w->wq = parts[0];
			w->wk = parts[1];
			w->wv = parts[2];
		}
		if (!rc && c->qkv_bias) {
			const uint64_t r[3] = { (uint64_t)qd, kv, kv };

			NM(n0, "self_attn.q_proj.bias");
			NM(n1, "self_attn.k_proj.bias");
			NM(n2, "self_attn.v_proj.bias");
			rc = load_vecs(&ck, m, &w->bqkv, names, r, 3, err, errlen);
		}
		if (!rc) {
			NM(n0, "self_attn.o_proj.weight");
			rc = load(&ck, m, &w->wo, n0, 2, h, (uint64_t)qd, err, errlen);
		}
		if (!rc && c->o_bias) {
			NM(n0, "self_attn.o_proj.bias");
			rc = load(&ck, m, &w->bo, n0, 1, h, 0, err, errlen);
		}
		if (!rc && c->qk_norm) {
			NM(n0, "self_attn.q_norm.weight");
			rc = load(&ck, m, &w->q_norm, n0, 1, hd, 0, err, errlen);
			NM(n0, "self_attn.k_norm.weight");
			if (!rc)
				rc = load(&ck, m, &w->k_norm, n0, 1, hd, 0, err, errlen);
		}
		if (!rc && c->attn_sinks) {
			NM(n0, "self_attn.sinks");
			rc = load(&ck, m, &w->sinks, n0, 1, (uint64_t)c->num_attention_heads, 0, err,
				  errlen);
		}
		w->window = dps_cfg_layer_window(c, l) ? c->sliding_window : 0;
		if (!rc) {
			NM(n0, "post_attention_layernorm.weight");
			rc = load(&ck, m, &w->ffn_norm, n0, 1, h, 0, err, errlen);
		}
		if (!rc && dps_cfg_layer_moe(c, l)) {
			rc = load_gpt_oss_experts(&ck, m, w, l, err, errlen);
		} else if (!rc) {
			const uint64_t r[2] = { im, im };

			NM(n0, "mlp.gate_proj.weight");
			NM(n1, "mlp.up_proj.weight");
			rc = load_stacked(&ck, m, &w->w_gate_up, parts, names, r, 2, h, err, errlen);
			w->w_gate = parts[0];
			w->w_up = parts[1];
			if (!rc) {
				NM(n0, "mlp.down_proj.weight");
				rc = load(&ck, m, &w->w_down, n0, 2, h, im, err, errlen);
			}
			if (!rc && c->mlp_bias) {
				NM(n0, "mlp.gate_proj.bias");
				NM(n1, "mlp.up_proj.bias");
				rc = load_vecs(&ck, m, &w->b_gate_up, names, r, 2, err, errlen);
				NM(n0, "mlp.down_proj.bias");
				if (!rc)
					rc = load(&ck, m, &w->b_down, n0, 1, h, 0, err, errlen);
			}
		}
#undef NM
	}
	if (!rc)
		rc = load(&ck, m, &m->final_norm, "model.norm.weight", 1, (uint64_t)c->hidden_size, 0,
			  err, errlen);
	if (!rc && !c->tie_word_embeddings)
		rc = load(&ck, m, &m->lm_head, "lm_head.weight", 2, (uint64_t)c->vocab_size,
			  (uint64_t)c->hidden_size, err, errlen);
	if (rc)
		goto out;
	if (c->tie_word_embeddings)
		m->lm_head = m->embed;
	cache = (size_t)c->num_hidden_layers * (size_t)m->max_seqs * (size_t)m->max_pos * kv;
	m->cache_bytes = 2 * cache * sizeof(float);
	m->key_cache = dps_alloc_huge(cache * sizeof(float));
	m->value_cache = dps_alloc_huge(cache * sizeof(float));
	rows = (size_t)m->max_rows;
	m->score_threads = dps_pool_size(dps_gemm_pool());
	m->x = calloc(rows * (size_t)c->hidden_size, sizeof(float));
	m->xb = calloc(rows * (size_t)(c->hidden_size > qd ? c->hidden_size : qd), sizeof(float));
	m->qkv = calloc(rows * ((size_t)qd + 2 * kv), sizeof(float));
	m->att_out = calloc(rows * (size_t)qd, sizeof(float));
	m->gu = calloc(rows * 2 * (size_t)c->intermediate_size, sizeof(float));
	if (c->num_local_experts) {
		const size_t E = (size_t)c->num_local_experts, k = (size_t)c->num_experts_per_tok;

		m->router_lg = calloc(rows * E, sizeof(float));
		m->route_w = calloc(rows * k, sizeof(float));
		m->route_e = calloc(rows * k, sizeof(int));
		m->gather = calloc(rows * (size_t)c->hidden_size, sizeof(float));
		m->gather_ix = calloc(rows, sizeof(int));
		m->exp_out = calloc(rows * k * (size_t)c->hidden_size, sizeof(float));
		if (!m->router_lg || !m->route_w || !m->route_e || !m->gather || !m->gather_ix ||
		    !m->exp_out) {
			snprintf(err, errlen, "%s: out of memory for the MoE scratch", dir);
			rc = -ENOMEM;
			goto out;
		}
	}
	m->scores = calloc((size_t)m->score_threads * (size_t)m->max_pos, sizeof(float));
	m->cs = calloc(rows * hd, sizeof(float));
	m->logits = calloc((size_t)m->max_out * (size_t)c->vocab_size, sizeof(float));
	if (!m->key_cache || !m->value_cache || !m->x || !m->xb || !m->qkv || !m->att_out ||
	    !m->gu || !m->scores || !m->cs || !m->logits) {
		snprintf(err, errlen, "%s: cannot allocate the KV cache for %d sequence(s) of %d "
			 "positions (%zu bytes) and scratch for %d rows", dir, m->max_seqs,
			 m->max_pos, m->cache_bytes, m->max_rows);
		rc = -ENOMEM;
		goto out;
	}
out:
	dps_ckpt_close(&ck);
	if (rc)
		dps_model_free(m);
	return rc;
}

void dps_model_free(struct dps_model *m)
{
	if (m->layers)
		for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
			struct dps_layer_weights *w = &m->layers[l];

			free(w->attn_norm);
			free(w->wqkv);
			free(w->wo);
			free(w->ffn_norm);
			free(w->w_gate_up);
			free(w->w_down);
			free(w->bqkv);
			free(w->bo);
			free(w->q_norm);
			free(w->k_norm);
			free(w->sinks);
			free(w->b_gate_up);
			free(w->b_down);
			free(w->router);
			free(w->router_bias);
			for (int e = 0; e < m->cfg.num_local_experts; e++) {
				if (w->exp_gate_up)
					free(w->exp_gate_up[e]);
				if (w->exp_down)
					free(w->exp_down[e]);
				/* any of the four may be missing after a failed load */
				if (w->exp_gu_q)
					free(w->exp_gu_q[e]);
				if (w->exp_gu_s)
					free(w->exp_gu_s[e]);
				if (w->exp_dn_q)
					free(w->exp_dn_q[e]);
				if (w->exp_dn_s)
					free(w->exp_dn_s[e]);
			}
			free(w->exp_gate_up);
			free(w->exp_down);
			free(w->exp_gu_q);
			free(w->exp_gu_s);
			free(w->exp_dn_q);
			free(w->exp_dn_s);
			free(w->exp_gu_bias);
			free(w->exp_dn_bias);
		}
	free(m->layers);
	free(m->inv_freq);
	if (m->lm_head != m->embed)
		free(m->lm_head);
	free(m->embed);
	free(m->final_norm);
	free(m->key_cache);
	free(m->value_cache);
	free(m->x);
	free(m->xb);
	free(m->qkv);
	free(m->att_out);
	free(m->gu);
	free(m->router_lg);
	free(m->route_w);
	free(m->route_e);
	free(m->gather);
	free(m->gather_ix);
	free(m->exp_out);
	free(m->scores);
	free(m->cs);
	free(m->logits);
	memset(m, 0, sizeof(*m));
}

/* The attention of every (row, query head) pair of a step, split over the rank's threads. */
struct attn_job {
	struct dps_model *m;
	int n, layer, fast, chunks;
	const int *pos, *seq;
};

static void attn_slice(void *arg, int chunk, int tid)
{
	const struct attn_job *j = arg;
	struct dps_model *m = j->m;
	const struct dps_model_config *c = &m->cfg;
	const int hd = c->head_dim, heads = c->num_attention_heads, kvh = c->num_key_value_heads;
	const size_t kv = (size_t)kvh * (size_t)hd, qd = (size_t)heads * (size_t)hd;
	const size_t row_stride = qd + 2 * kv;
	float *scratch = m->scores + (size_t)(tid < m->score_threads ? tid : 0) * (size_t)m->max_pos;
	int lo, hi;

	DPS_ASSERT(tid < m->score_threads);
	dps_pool_split(j->n * heads, 1, chunk, j->chunks, &lo, &hi);
	for (int item = lo; item < hi; item++) {
		const int i = item / heads, h = item % heads, g = h / (heads / kvh);
		const size_t base = (((size_t)j->layer * (size_t)m->max_seqs + (size_t)j->seq[i]) *
				     (size_t)m->max_pos) * kv + (size_t)g * (size_t)hd;
		const float *q = m->qkv + (size_t)i * row_stride + (size_t)h * (size_t)hd;
		float *out = m->att_out + (size_t)i * qd + (size_t)h * (size_t)hd;
		const struct dps_layer_weights *w = &m->layers[j->layer];
		const int n_pos = j->pos[i] + 1;
		const int first = w->window && n_pos > w->window ? n_pos - w->window : 0;
		const float *sink = w->sinks ? &w->sinks[h] : NULL;

		if (j->fast)
			dps_attention(out, q, m->key_cache + base, m->value_cache + base, first, n_pos,
				      hd, kv, sink, scratch);
		else
			dps_attention_ref(out, q, m->key_cache + base, m->value_cache + base, first,
					  n_pos, hd, kv, sink, scratch);
	}
}

/* A fast product, counted in m->linear_ns and m->linear_flops. */
static void linear_fast(struct dps_model *m, float *out, const float *x, const float *W, int rows,
			int n, int k)
{
	const uint64_t t0 = dps_now_ns();

	dps_linear_f32(out, x, W, rows, n, k);
	m->linear_ns += dps_now_ns() - t0;
	m->linear_flops += 2.0 * rows * n * k;
}

static void linear_ref(struct dps_model *m, float *out, const float *x, const float *W, int rows,
		       int n, int k)
{
	(void)m;
	dps_linear_f32_ref(out, x, W, rows, n, k);
}

typedef void (*linear_fn)(struct dps_model *, float *, const float *, const float *, int, int,
			  int);

/*
 * A mixture-of-experts MLP on the n normed rows in m->xb, added into m->x: the router (with
 * bias) picks each row's k experts and their weights; every expert runs once on the rows that
 * chose it; each row then adds its k outputs in the router's order, so a row's result does
 * not depend on the other rows.
 */
static void moe(struct dps_model *m, const struct dps_layer_weights *w, int n, int fast,
		linear_fn linear)
{
	const struct dps_model_config *c = &m->cfg;
	const int dim = c->hidden_size, im = c->intermediate_size;
	const int E = c->num_local_experts, k = c->num_experts_per_tok;
	const float limit = (float)c->swiglu_limit;

	linear(m, m->router_lg, m->xb, w->router, n, E, dim);
	for (int i = 0; i < n; i++) {
		float *lg = m->router_lg + (size_t)i * E;

		for (int e = 0; e < E; e++)
			lg[e] += w->router_bias[e];
		dps_moe_route(lg, E, k, m->route_e + (size_t)i * k, m->route_w + (size_t)i * k);
	}
	for (int e = 0; e < E; e++) {
		int cnt = 0;

		for (int s = 0; s < n * k; s++)
			if (m->route_e[s] == e) {
				memcpy(m->gather + (size_t)cnt * dim, m->xb + (size_t)(s / k) * dim,
				       sizeof(float) * (size_t)dim);
				m->gather_ix[cnt++] = s;
			}
		if (!cnt)
			continue;
		if (w->exp_gu_q && w->exp_gu_q[e])
			(fast ? dps_linear_mxfp4 : dps_linear_mxfp4_ref)(m->gu, m->gather,
									 w->exp_gu_q[e], w->exp_gu_s[e],
									 cnt, 2 * im, dim);
		else
			linear(m, m->gu, m->gather, w->exp_gate_up[e], cnt, 2 * im, dim);
		if (w->exp_gu_bias)
			dps_add_bias(m->gu, w->exp_gu_bias + (size_t)e * 2 * im, cnt, 2 * im);
		for (int r = 0; r < cnt; r++) {
			float *g = m->gu + (size_t)r * 2 * im;

			/* GPT-OSS's clamped SwiGLU (config.json's limit is 7.0, checked at parse) */
			(fast ? dps_swiglu_clamped : dps_swiglu_clamped_ref)(g, g + im, im, limit);
			memmove(m->gu + (size_t)r * im, g, sizeof(float) * (size_t)im);
		}
		if (w->exp_dn_q && w->exp_dn_q[e])
			(fast ? dps_linear_mxfp4 : dps_linear_mxfp4_ref)(m->gather, m->gu,
									 w->exp_dn_q[e], w->exp_dn_s[e],
									 cnt, dim, im);
		else
			linear(m, m->gather, m->gu, w->exp_down[e], cnt, dim, im);
		if (w->exp_dn_bias)
			dps_add_bias(m->gather, w->exp_dn_bias + (size_t)e * dim, cnt, dim);
		for (int r = 0; r < cnt; r++)
			memcpy(m->exp_out + (size_t)m->gather_ix[r] * dim, m->gather + (size_t)r * dim,
			       sizeof(float) * (size_t)dim);
	}
	for (int i = 0; i < n; i++)
		for (int j = 0; j < k; j++) {
			const float wt = m->route_w[(size_t)i * k + (size_t)j];
			const float *o = m->exp_out + ((size_t)i * k + (size_t)j) * dim;
			float *x = m->x + (size_t)i * dim;

			for (int d = 0; d < dim; d++)
				x[d] += wt * o[d];
		}
}

static const float *step(struct dps_model *m, int n, const int *tokens, const int *pos,
			 const int *seq, const unsigned char *want, int fast)
{
	const struct dps_model_config *c = &m->cfg;
	const int dim = c->hidden_size, hd = c->head_dim, heads = c->num_attention_heads;
	const int kvh = c->num_key_value_heads, kv = kvh * hd, qd = heads * hd;
	const int im = c->intermediate_size, qkvd = qd + 2 * kv;
	const float eps = (float)c->rms_norm_eps;
	void (*linear)(struct dps_model *, float *, const float *, const float *, int, int, int) =
		fast ? linear_fast : linear_ref;
	void (*rmsnorm)(float *, const float *, const float *, int, float) =
		fast ? dps_rmsnorm : dps_rmsnorm_ref;
	int n_out = 0;

	DPS_ASSERT(n >= 1 && n <= m->max_rows);
	for (int i = 0; i < n; i++) {
		DPS_ASSERT(pos[i] >= 0 && pos[i] < m->max_pos && tokens[i] >= 0 &&
			   tokens[i] < c->vocab_size && seq[i] >= 0 && seq[i] < m->max_seqs);
		(fast ? dps_embedding : dps_embedding_ref)(m->x + (size_t)i * dim, m->embed, dim,
							   tokens[i]);
		dps_rope_table_freqs(m->cs + (size_t)i * hd, hd, pos[i], m->inv_freq, m->rope_attn);
	}
	for (int l = 0; l < c->num_hidden_layers; l++) {
		const struct dps_layer_weights *w = &m->layers[l];
		struct attn_job aj = { m, n, l, fast, 1, pos, seq };

		/* Attention: norm, the stacked q/k/v product, rotary, the cache, attention, o. */
		for (int i = 0; i < n; i++)
			rmsnorm(m->xb + (size_t)i * dim, m->x + (size_t)i * dim, w->attn_norm, dim, eps);
		linear(m, m->qkv, m->xb, w->wqkv, n, qkvd, dim);
		if (w->bqkv)
			dps_add_bias(m->qkv, w->bqkv, n, qkvd);
		for (int i = 0; i < n; i++) {
			float *q = m->qkv + (size_t)i * qkvd, *k = q + qd, *v = k + kv;
			const size_t at = (((size_t)l * (size_t)m->max_seqs + (size_t)seq[i]) *
					   (size_t)m->max_pos + (size_t)pos[i]) * (size_t)kv;

			if (w->q_norm) { /* Qwen3: every head normed over head_dim before RoPE */
				for (int h = 0; h < heads; h++)
					rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, w->q_norm, hd, eps);
				for (int h = 0; h < kvh; h++)
					rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, w->k_norm, hd, eps);
			}

			(fast ? dps_rope : dps_rope_ref)(q, heads, hd, m->cs + (size_t)i * hd);
			(fast ? dps_rope : dps_rope_ref)(k, kvh, hd, m->cs + (size_t)i * hd);
			memcpy(m->key_cache + at, k, sizeof(float) * (size_t)kv);
			memcpy(m->value_cache + at, v, sizeof(float) * (size_t)kv);
		}
		if (fast && dps_pool_size(dps_gemm_pool()) <= m->score_threads) {
			const int items = n * heads, most = 8 * dps_pool_size(dps_gemm_pool());

			aj.chunks = items < most ? items : most;
			dps_pool_run(dps_gemm_pool(), aj.chunks, attn_slice, &aj);
		} else {
			attn_slice(&aj, 0, 0);
		}
		linear(m, m->xb, m->att_out, w->wo, n, dim, qd);
		if (w->bo)
			dps_add_bias(m->xb, w->bo, n, dim);
		for (size_t i = 0; i < (size_t)n * dim; i++)
			m->x[i] += m->xb[i];
		/* MLP: norm, the stacked gate/up product, SwiGLU, down. */
		for (int i = 0; i < n; i++)
			rmsnorm(m->xb + (size_t)i * dim, m->x + (size_t)i * dim, w->ffn_norm, dim, eps);
		if (w->router) {
			moe(m, w, n, fast, linear);
			continue;
		}
		linear(m, m->gu, m->xb, w->w_gate_up, n, 2 * im, dim);
		if (w->b_gate_up)
			dps_add_bias(m->gu, w->b_gate_up, n, 2 * im);
		for (int i = 0; i < n; i++) {
			float *g = m->gu + (size_t)i * 2 * im;

			(fast ? dps_swiglu : dps_swiglu_ref)(g, g + im, im);
			/* Pack the activations (im per row) for the down product. */
			memmove(m->gu + (size_t)i * im, g, sizeof(float) * (size_t)im);
		}
		linear(m, m->xb, m->gu, w->w_down, n, dim, im);
		if (w->b_down)
			dps_add_bias(m->xb, w->b_down, n, dim);
		for (size_t i = 0; i < (size_t)n * dim; i++)
			m->x[i] += m->xb[i];
	}
	/* The final norm and the LM head, for the rows whose logits are wanted only. */
	for (int i = 0; i < n; i++)
		if (!want || want[i]) {
			DPS_ASSERT(n_out < m->max_out);
			rmsnorm(m->xb + (size_t)n_out * dim, m->x + (size_t)i * dim, m->final_norm, dim,
				eps);
			n_out++;
		}
	if (n_out)
		linear(m, m->logits, m->xb, m->lm_head, n_out, c->vocab_size, dim);
	return m->logits;
}

const float *dps_model_step(struct dps_model *m, int n, const int *tokens, const int *pos,
			    const int *seq, const unsigned char *want)
{
	return step(m, n, tokens, pos, seq, want, 1);
}

const float *dps_model_step_ref(struct dps_model *m, int n, const int *tokens, const int *pos,
				const int *seq, const unsigned char *want)
{
	return step(m, n, tokens, pos, seq, want, 0);
}

const float *dps_model_forward(struct dps_model *m, int token, int pos)
{
	const int seq = 0;

	return dps_model_step(m, 1, &token, &pos, &seq, NULL);
}

const float *dps_model_forward_ref(struct dps_model *m, int token, int pos)
{
	const int seq = 0;

	return dps_model_step_ref(m, 1, &token, &pos, &seq, NULL);
}
