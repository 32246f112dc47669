/* SPDX-License-Identifier: MIT */
/*
 * engine/model.c - the whole-model reference decoder (see model.h).
 */
#include <string.h>

#include "common/dps.h"
#include "engine/ckpt.h"
#include "engine/model.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"

static int load(struct dps_ckpt *ck, struct dps_model *m, float **dst, const char *name, int ndim,
		uint64_t d0, uint64_t d1, char *err, size_t errlen)
{
	const uint64_t shape[2] = { d0, d1 };
	const size_t n = (size_t)d0 * (ndim == 2 ? (size_t)d1 : 1);
	const struct dps_st_tensor *t = dps_ckpt_find(ck, name, NULL);

	/* Check the file before allocating: a config.json can claim any size, the file cannot. */
	if (!t || t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1))
		return dps_ckpt_load_shard(ck, name, ndim, shape, 0, 0, 1, NULL, err, errlen);
	*dst = malloc(n * sizeof(float));
	if (!*dst) {
		snprintf(err, errlen, "%s: cannot allocate %zu bytes for '%s'", ck->dir,
			 n * sizeof(float), name);
		return -ENOMEM;
	}
	m->weight_bytes += n * sizeof(float);
	return dps_ckpt_load_shard(ck, name, ndim, shape, 0, 0, 1, *dst, err, errlen);
}

int dps_model_load(struct dps_model *m, const char *dir, int max_pos, char *err, size_t errlen)
{
	struct dps_ckpt ck;
	struct dps_model_config *c = &m->cfg;
	size_t kv, cache;
	char nm[128];
	int rc, qd;

	memset(m, 0, sizeof(*m));
	rc = dps_ckpt_open(&ck, dir, err, errlen);
	if (rc)
		return rc;
	*c = ck.cfg;
	qd = c->num_attention_heads * c->head_dim;
	kv = (size_t)c->num_key_value_heads * (size_t)c->head_dim;
	/* The cache holds at most the model's context, however many positions are asked for. */
	m->max_pos = max_pos > 0 && max_pos < c->max_position_embeddings ? max_pos
									  : c->max_position_embeddings;
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
#define L(field, suffix, nd, d0, d1)                                                     \
	if (!rc) {                                                                       \
		snprintf(nm, sizeof(nm), "model.layers.%d.%s", l, suffix);               \
		rc = load(&ck, m, &w->field, nm, nd, d0, d1, err, errlen);               \
	}
		L(attn_norm, "input_layernorm.weight", 1, h, 0);
		L(wq, "self_attn.q_proj.weight", 2, (uint64_t)qd, h);
		L(wk, "self_attn.k_proj.weight", 2, kv, h);
		L(wv, "self_attn.v_proj.weight", 2, kv, h);
		L(wo, "self_attn.o_proj.weight", 2, h, (uint64_t)qd);
		L(ffn_norm, "post_attention_layernorm.weight", 1, h, 0);
		L(w_gate, "mlp.gate_proj.weight", 2, im, h);
		L(w_up, "mlp.up_proj.weight", 2, im, h);
		L(w_down, "mlp.down_proj.weight", 2, h, im);
#undef L
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
	cache = (size_t)c->num_hidden_layers * (size_t)m->max_pos * kv;
	m->key_cache = calloc(cache, sizeof(float));
	m->value_cache = calloc(cache, sizeof(float));
	m->x = calloc((size_t)c->hidden_size, sizeof(float));
	m->xb = calloc((size_t)(c->hidden_size > qd ? c->hidden_size : qd), sizeof(float));
	m->xb2 = calloc((size_t)c->hidden_size, sizeof(float));
	m->q = calloc((size_t)qd, sizeof(float));
	m->att_out = calloc((size_t)qd, sizeof(float));
	m->hb = calloc((size_t)c->intermediate_size, sizeof(float));
	m->hb2 = calloc((size_t)c->intermediate_size, sizeof(float));
	m->scores = calloc((size_t)m->max_pos, sizeof(float));
	m->logits = calloc((size_t)c->vocab_size, sizeof(float));
	if (!m->key_cache || !m->value_cache || !m->x || !m->xb || !m->xb2 || !m->q ||
	    !m->att_out || !m->hb || !m->hb2 || !m->scores || !m->logits) {
		snprintf(err, errlen, "%s: cannot allocate the KV cache for %d positions (%zu bytes)",
			 dir, m->max_pos, 2 * cache * sizeof(float));
		rc = -ENOMEM;
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
			free(w->wq);
			free(w->wk);
			free(w->wv);
			free(w->wo);
			free(w->ffn_norm);
			free(w->w_gate);
			free(w->w_up);
			free(w->w_down);
		}
	free(m->layers);
	if (m->lm_head != m->embed)
		free(m->lm_head);
	free(m->embed);
	free(m->final_norm);
	free(m->key_cache);
	free(m->value_cache);
	free(m->x);
	free(m->xb);
	free(m->xb2);
	free(m->q);
	free(m->att_out);
	free(m->hb);
	free(m->hb2);
	free(m->scores);
	free(m->logits);
	memset(m, 0, sizeof(*m));
}

static const float *forward(struct dps_model *m, int token, int pos,
			    void (*mv)(float *, const float *, const float *, int, int))
{
	const struct dps_model_config *c = &m->cfg;
	const int dim = c->hidden_size, hd = c->head_dim, heads = c->num_attention_heads;
	const int kvh = c->num_key_value_heads, kv = kvh * hd, qd = heads * hd;
	const float eps = (float)c->rms_norm_eps, theta = (float)c->rope_theta;

	DPS_ASSERT(pos >= 0 && pos < m->max_pos && token >= 0 && token < c->vocab_size);
	memcpy(m->x, m->embed + (size_t)token * (size_t)dim, sizeof(float) * (size_t)dim);
	for (int l = 0; l < c->num_hidden_layers; l++) {
		const struct dps_layer_weights *w = &m->layers[l];
		const size_t base = (size_t)l * (size_t)m->max_pos * (size_t)kv;
		float *kc = m->key_cache + base, *vc = m->value_cache + base;

		/* Attention: norm, projections, rotary, the cache, scores over 0..pos. */
		dps_rmsnorm_ref(m->xb, m->x, w->attn_norm, dim, eps);
		mv(m->q, m->xb, w->wq, qd, dim);
		mv(kc + (size_t)pos * kv, m->xb, w->wk, kv, dim);
		mv(vc + (size_t)pos * kv, m->xb, w->wv, kv, dim);
		dps_rope_ref(m->q, heads, hd, pos, theta);
		dps_rope_ref(kc + (size_t)pos * kv, kvh, hd, pos, theta);
		for (int h = 0; h < heads; h++) {
			const int g = h / (heads / kvh); /* the KV head this query head reads */

			dps_attention_ref(m->att_out + (size_t)h * hd, m->q + (size_t)h * hd,
					  kc + (size_t)g * hd, vc + (size_t)g * hd, pos + 1, hd,
					  (size_t)kv, m->scores);
		}
		mv(m->xb2, m->att_out, w->wo, dim, qd);
		for (int i = 0; i < dim; i++)
			m->x[i] += m->xb2[i];
		/* MLP: norm, gate and up, SwiGLU, down. */
		dps_rmsnorm_ref(m->xb, m->x, w->ffn_norm, dim, eps);
		mv(m->hb, m->xb, w->w_gate, c->intermediate_size, dim);
		mv(m->hb2, m->xb, w->w_up, c->intermediate_size, dim);
		dps_swiglu_ref(m->hb, m->hb2, c->intermediate_size);
		mv(m->xb2, m->hb, w->w_down, dim, c->intermediate_size);
		for (int i = 0; i < dim; i++)
			m->x[i] += m->xb2[i];
	}
	dps_rmsnorm_ref(m->x, m->x, m->final_norm, dim, eps);
	mv(m->logits, m->x, m->lm_head, c->vocab_size, dim);
	return m->logits;
}

/* The reference kernels' matrix-vector product, shaped like mv_blis. */
static void mv_ref(float *out, const float *x, const float *W, int rows, int cols)
{
	dps_matvec_ref(out, x, W, rows, cols);
}

/* One row through BLIS (kernels chosen for the CPU by dps_gemm_setup). */
static void mv_blis(float *out, const float *x, const float *W, int rows, int cols)
{
	dps_linear_f32(out, x, W, 1, rows, cols);
}

const float *dps_model_forward_ref(struct dps_model *m, int token, int pos)
{
	return forward(m, token, pos, mv_ref);
}

const float *dps_model_forward(struct dps_model *m, int token, int pos)
{
	return forward(m, token, pos, mv_blis);
}
