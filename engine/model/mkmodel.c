/* SPDX-License-Identifier: MIT */
/*
 * engine/model/mkmodel.c - seeded random models (see mkmodel.h). Values are a pure function of
 * (seed, tensor index, element index), so any chunking of the writer gives the same bytes.
 */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "common/dps.h"
#include "engine/model/ckpt.h"
#include "engine/model/mkmodel.h"

#define P(name, what, h, im, l, nh, kv, v, tie)                                          \
	{ name, what, { .hidden_size = h, .intermediate_size = im, .num_hidden_layers = l,  \
			.num_attention_heads = nh, .num_key_value_heads = kv,                 \
			.head_dim = (h) / (nh), .vocab_size = v, .rms_norm_eps = 1e-5,         \
			.rope_theta = 10000.0, .max_position_embeddings = 2048,               \
			.tie_word_embeddings = tie, .bos_token_id = 1, .eos_token_id = 2 } }

const struct dps_mkmodel_preset dps_mkmodel_presets[] = {
	P("tiny", "2 layers, hidden 64, for unit tests", 64, 172, 2, 4, 2, 256, 1),
	P("tiny-gqa", "3 layers, 6 heads over 2 KV heads, untied head", 48, 100, 3, 6, 2, 300, 0),
	P("small", "4 layers, hidden 256", 256, 688, 4, 8, 4, 1024, 1),
	P("bench-110m", "the 110M shape llama.cpp and llama2.c were measured on", 768, 2048, 12, 12,
	  12, 32000, 1),
	P("bench-1b", "about 1B parameters: hidden 2048, 16 layers, 32 heads over 8 KV heads",
	  2048, 8192, 16, 32, 8, 32000, 1),
	/* Mixtures of experts: layer 0 dense, the others 8 (or 32) experts, top 2 (or 4). */
	{ "tiny-moe", "3 layers, 8 experts of 96, top 2, layer 0 dense, clamped SwiGLU",
	  { .hidden_size = 64, .intermediate_size = 96, .num_hidden_layers = 3,
	    .num_attention_heads = 4, .num_key_value_heads = 2, .head_dim = 16, .vocab_size = 256,
	    .rms_norm_eps = 1e-5, .rope_theta = 10000.0, .max_position_embeddings = 2048,
	    .tie_word_embeddings = 1, .bos_token_id = 1, .eos_token_id = 2,
	    .num_local_experts = 8, .num_experts_per_tok = 2, .swiglu_limit = 7.0,
	    .dense_layers = { 1 } } },
	{ "bench-moe", "MoE benchmark: hidden 768, 12 layers, 32 experts of 512, top 4",
	  { .hidden_size = 768, .intermediate_size = 512, .num_hidden_layers = 12,
	    .num_attention_heads = 12, .num_key_value_heads = 4, .head_dim = 64,
	    .vocab_size = 32000, .rms_norm_eps = 1e-5, .rope_theta = 10000.0,
	    .max_position_embeddings = 2048, .tie_word_embeddings = 1, .bos_token_id = 1,
	    .eos_token_id = 2, .num_local_experts = 32, .num_experts_per_tok = 4,
	    .swiglu_limit = 7.0 } },
	{ NULL, NULL, { 0 } },
};

const struct dps_mkmodel_preset *dps_mkmodel_preset(const char *name)
{
	for (const struct dps_mkmodel_preset *p = dps_mkmodel_presets; p->name; p++)
		if (!strcmp(p->name, name))
			return p;
	return NULL;
}

uint64_t dps_model_config_params(const struct dps_model_config *c)
{
	const uint64_t h = (uint64_t)c->hidden_size, im = (uint64_t)c->intermediate_size;
	const uint64_t q = (uint64_t)c->num_attention_heads * (uint64_t)c->head_dim;
	const uint64_t kv = (uint64_t)c->num_key_value_heads * (uint64_t)c->head_dim;
	const uint64_t attn = 2 * h + q * h + 2 * kv * h + h * q;
	const uint64_t E = (uint64_t)c->num_local_experts;
	uint64_t n = (uint64_t)c->vocab_size * h * (c->tie_word_embeddings ? 1 : 2) + h;

	for (int l = 0; l < c->num_hidden_layers; l++)
		n += attn + (dps_cfg_layer_moe(c, l) ? E * (h + 1) + E * 3 * im * h : 3 * im * h);
	return n;
}

struct gen {
	uint64_t seed, tensor;
	float std, mean;
};

/* A standard normal from (seed, tensor, index): splitmix64 and Box-Muller. */
static uint64_t mix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

static void gen_fill(float *dst, uint64_t start, uint64_t count, void *arg)
{
	const struct gen *g = arg;

	for (uint64_t i = 0; i < count; i++) {
		const uint64_t r = mix64(g->seed ^ mix64(g->tensor * 0x100000001B3ull + start + i));
		const double u1 = ((double)(r >> 11) + 0.5) / 9007199254740992.0;
		const double u2 = (double)(mix64(r) >> 11) / 9007199254740992.0;
		const double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);

		dst[i] = g->mean + g->std * (float)z;
	}
}

/* Writes tensors t[0..n-1] as outdir/model.safetensors, then c as outdir/config.json. */
static int write_dir(const char *outdir, const struct dps_st_writer_tensor *t, int n,
		     const struct dps_model_config *c, char *err, size_t errlen)
{
	char path[4096];
	int rc;

	snprintf(path, sizeof(path), "%s/model.safetensors", outdir);
	rc = dps_st_write(path, t, n);
	if (!rc) {
		snprintf(path, sizeof(path), "%s/config.json", outdir);
		rc = dps_model_config_save(c, path);
	}
	if (rc)
		snprintf(err, errlen, "%s: %s", path, dps_strerror(rc));
	return rc;
}

int dps_mkmodel(const struct dps_model_config *c, uint64_t seed, enum dps_st_dtype dt,
		const char *outdir, char *err, size_t errlen)
{
	const int L = c->num_hidden_layers;
	const uint64_t h = (uint64_t)c->hidden_size, im = (uint64_t)c->intermediate_size;
	const uint64_t q = (uint64_t)c->num_attention_heads * (uint64_t)c->head_dim;
	const uint64_t kv = (uint64_t)c->num_key_value_heads * (uint64_t)c->head_dim;
	const float std = 0.02f, out_std = 0.02f / sqrtf(2.0f * (float)L);
	struct dps_st_writer_tensor *t;
	struct gen *g;
	int n = 0, rc;

	const size_t per_layer = 9 + 2 + 3 * (size_t)c->num_local_experts;

	t = calloc((size_t)L * per_layer + 3, sizeof(*t));
	g = calloc((size_t)L * per_layer + 3, sizeof(*g));
	if (!t || !g) {
		free(t);
		free(g);
		return -ENOMEM;
	}
	if (mkdir(outdir, 0755) && errno != EEXIST) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", outdir, strerror(errno));
		goto out;
	}
#define T(nm, nd, d0, d1, mu, sd)                                                       \
	do {                                                                            \
		snprintf(t[n].name, sizeof(t[n].name), "%s", nm);                       \
		t[n].dtype = dt;                                                        \
		t[n].ndim = nd;                                                         \
		t[n].shape[0] = d0;                                                     \
		t[n].shape[1] = d1;                                                     \
		g[n] = (struct gen){ seed, (uint64_t)n, sd, mu };                       \
		t[n].gen = gen_fill;                                                    \
		t[n].gen_arg = &g[n];                                                   \
		n++;                                                                    \
	} while (0)
	T("model.embed_tokens.weight", 2, (uint64_t)c->vocab_size, h, 0.0f, std);
	for (int l = 0; l < L; l++) {
		char nm[128];
#define LT(sfx, nd, d0, d1, mu, sd)                                                      \
	do {                                                                            \
		snprintf(nm, sizeof(nm), "model.layers.%d.%s", l, sfx);                 \
		T(nm, nd, d0, d1, mu, sd);                                              \
	} while (0)
		LT("input_layernorm.weight", 1, h, 0, 1.0f, 0.1f);
		LT("self_attn.q_proj.weight", 2, q, h, 0.0f, std);
		LT("self_attn.k_proj.weight", 2, kv, h, 0.0f, std);
		LT("self_attn.v_proj.weight", 2, kv, h, 0.0f, std);
		LT("self_attn.o_proj.weight", 2, h, q, 0.0f, out_std);
		LT("post_attention_layernorm.weight", 1, h, 0, 1.0f, 0.1f);
		if (!dps_cfg_layer_moe(c, l)) {
			LT("mlp.gate_proj.weight", 2, im, h, 0.0f, std);
			LT("mlp.up_proj.weight", 2, im, h, 0.0f, std);
			LT("mlp.down_proj.weight", 2, h, im, 0.0f, out_std);
			continue;
		}
		/* The router spreads tokens when its logits differ by O(1): a larger spread. */
		LT("mlp.router.weight", 2, (uint64_t)c->num_local_experts, h, 0.0f, 1.0f);
		LT("mlp.router.bias", 1, (uint64_t)c->num_local_experts, 0, 0.0f, 0.5f);
		for (int e = 0; e < c->num_local_experts; e++) {
			char sfx[96];

			snprintf(sfx, sizeof(sfx), "mlp.experts.%d.gate_proj.weight", e);
			LT(sfx, 2, im, h, 0.0f, std);
			snprintf(sfx, sizeof(sfx), "mlp.experts.%d.up_proj.weight", e);
			LT(sfx, 2, im, h, 0.0f, std);
			snprintf(sfx, sizeof(sfx), "mlp.experts.%d.down_proj.weight", e);
			LT(sfx, 2, h, im, 0.0f, out_std);
		}
#undef LT
	}
	T("model.norm.weight", 1, h, 0, 1.0f, 0.1f);
	if (!c->tie_word_embeddings)
		T("lm_head.weight", 2, (uint64_t)c->vocab_size, h, 0.0f, std);
#undef T
	rc = write_dir(outdir, t, n, c, err, errlen);
out:
	free(t);
	free(g);
	return rc;
}

/* ---- Eagle3 drafts ------------------------------------------------------------------------- */

/* Reads tensor name (d0 x d1, or d0 when d1 is 0) of ck whole into a new F32 array. */
static float *read_whole(struct dps_ckpt *ck, const char *name, uint64_t d0, uint64_t d1,
			 char *err, size_t errlen)
{
	const uint64_t shape[2] = { d0, d1 };
	float *p = malloc(sizeof(float) * (size_t)d0 * (size_t)(d1 ? d1 : 1));

	if (!p) {
		snprintf(err, errlen, "out of memory reading '%s'", name);
		return NULL;
	}
	if (dps_ckpt_load_shard(ck, name, d1 ? 2 : 1, shape, 0, 0, 1, p, err, errlen)) {
		free(p);
		return NULL;
	}
	return p;
}

/* A constant-filled or zero tensor of its own, freed with the others. */
static float *filled(size_t n, float v)
{
	float *p = malloc(sizeof(float) * (n ? n : 1));

	for (size_t i = 0; p && i < n; i++)
		p[i] = v;
	return p;
}

int dps_mkmodel_draft(const char *target, enum dps_draft_kind kind, int draft_vocab,
		      uint64_t seed, enum dps_st_dtype dt, const char *outdir, char *err,
		      size_t errlen)
{
	struct dps_ckpt ck;
	struct dps_model_config c, tc;
	struct dps_st_writer_tensor t[16];
	struct gen g[16];
	float *own[16] = { 0 };
	int n = 0, n_own = 0, rc, *ids = NULL;
	uint64_t h, im, q, V;

	memset(t, 0, sizeof(t));
	rc = dps_ckpt_open(&ck, target, err, errlen);
	if (rc)
		return rc;
	tc = ck.cfg;
	h = (uint64_t)tc.hidden_size;
	if (draft_vocab <= 0 || draft_vocab > tc.vocab_size)
		draft_vocab = tc.vocab_size;
	V = (uint64_t)draft_vocab;
	/* The draft: one dense layer of the target's width, its head size, no grouped KV. */
	memset(&c, 0, sizeof(c));
	c.hidden_size = tc.hidden_size;
	c.intermediate_size = tc.intermediate_size;
	c.num_hidden_layers = 1;
	c.head_dim = tc.head_dim;
	if (tc.hidden_size % tc.head_dim) {
		snprintf(err, errlen, "%s: hidden_size %d is not a multiple of head_dim %d; a draft "
			 "needs hidden_size / head_dim heads", target, tc.hidden_size, tc.head_dim);
		rc = -EINVAL;
		goto out;
	}
	c.num_attention_heads = c.num_key_value_heads = tc.hidden_size / tc.head_dim;
	c.vocab_size = tc.vocab_size;
	c.draft_vocab_size = draft_vocab;
	c.rms_norm_eps = tc.rms_norm_eps;
	c.rope_theta = tc.rope_theta;
	c.max_position_embeddings = tc.max_position_embeddings;
	c.bos_token_id = tc.bos_token_id;
	c.eos_token_id = tc.eos_token_id;
	c.eagle3 = 1;
	im = (uint64_t)c.intermediate_size;
	q = (uint64_t)c.num_attention_heads * (uint64_t)c.head_dim; /* == h */
	if (mkdir(outdir, 0755) && errno != EEXIST) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", outdir, strerror(errno));
		goto out;
	}
	/* Which target ids the draft vocabulary holds (ascending): all, the first ones (self), or a
	 * seeded random subset (random). */
	ids = malloc(sizeof(int) * (size_t)tc.vocab_size);
	if (!ids) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	for (int i = 0; i < tc.vocab_size; i++)
		ids[i] = i;
	if (kind == DPS_DRAFT_RANDOM && draft_vocab < tc.vocab_size) {
		/* Fisher-Yates over the ids (seeded), keep draft_vocab of them, then sort. */
		for (int i = tc.vocab_size - 1; i > 0; i--) {
			const int j = (int)(mix64(seed ^ 0xd2d2d2d2ull ^ (uint64_t)i) % (uint64_t)(i + 1));
			const int x = ids[i];

			ids[i] = ids[j];
			ids[j] = x;
		}
		for (int i = 1; i < draft_vocab; i++) /* insertion sort of the kept ids */
			for (int j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
				const int x = ids[j];

				ids[j] = ids[j - 1];
				ids[j - 1] = x;
			}
	}
#define OWN(p) (own[n_own++] = (p))
#define PUT(nm, nd, d0, d1, ptr)                                                        \
	do {                                                                            \
		snprintf(t[n].name, sizeof(t[n].name), "%s", nm);                       \
		t[n].dtype = dt;                                                        \
		t[n].ndim = nd;                                                         \
		t[n].shape[0] = d0;                                                     \
		t[n].shape[1] = d1;                                                     \
		t[n].data = ptr;                                                        \
		n++;                                                                    \
	} while (0)
#define GEN(nm, nd, d0, d1, mu, sd)                                                     \
	do {                                                                            \
		snprintf(t[n].name, sizeof(t[n].name), "%s", nm);                       \
		t[n].dtype = dt;                                                        \
		t[n].ndim = nd;                                                         \
		t[n].shape[0] = d0;                                                     \
		t[n].shape[1] = d1;                                                     \
		g[n] = (struct gen){ seed, (uint64_t)n + 1000, sd, mu };                \
		t[n].gen = gen_fill;                                                    \
		t[n].gen_arg = &g[n];                                                   \
		n++;                                                                    \
	} while (0)
	{
		float *d2t = OWN(malloc(sizeof(float) * (size_t)V));

		if (!d2t) {
			rc = -ENOMEM;
			snprintf(err, errlen, "out of memory");
			goto out;
		}
		for (uint64_t i = 0; i < V; i++)
			d2t[i] = (float)(ids[i] - (int)i);
		PUT("d2t", 1, V, 0, d2t);
		t[n - 1].dtype = DPS_ST_I64;
	}
	if (kind == DPS_DRAFT_RANDOM) {
		const float std = 0.02f;

		GEN("fc.weight", 2, h, 3 * h, 0.0f, std);
		GEN("midlayer.hidden_norm.weight", 1, h, 0, 1.0f, 0.1f);
		GEN("midlayer.input_layernorm.weight", 1, h, 0, 1.0f, 0.1f);
		GEN("midlayer.self_attn.q_proj.weight", 2, q, 2 * h, 0.0f, std);
		GEN("midlayer.self_attn.k_proj.weight", 2, q, 2 * h, 0.0f, std);
		GEN("midlayer.self_attn.v_proj.weight", 2, q, 2 * h, 0.0f, std);
		GEN("midlayer.self_attn.o_proj.weight", 2, h, q, 0.0f, std / 1.4142f);
		GEN("midlayer.post_attention_layernorm.weight", 1, h, 0, 1.0f, 0.1f);
		GEN("midlayer.mlp.gate_proj.weight", 2, im, h, 0.0f, std);
		GEN("midlayer.mlp.up_proj.weight", 2, im, h, 0.0f, std);
		GEN("midlayer.mlp.down_proj.weight", 2, h, im, 0.0f, std / 1.4142f);
		GEN("norm.weight", 1, h, 0, 1.0f, 0.1f);
		GEN("lm_head.weight", 2, V, h, 0.0f, std);
	} else {
		/*
		 * Self-distilled. The draft at position i sees the embedding e of token i+1 and the
		 * target's inputs of layers 0 (e(token i)), N/2 and N-1 at position i. fc forms
		 * x(N-1, i) - x(0, i): what layers 0..N-2 added at position i, taken as what they add
		 * at i+1. Attention copies e back in: q = k = a * norm(e) per head (each position
		 * attends to itself), v = norm(e), o = the embedding rows' mean RMS. So the residual
		 * approximates the target's input of its last layer at i+1. The MLP is the last
		 * layer's (when dense); norm and LM head are the target's: the draft predicts the
		 * token after i+1 as the target would without its last attention.
		 */
		const int N = tc.num_hidden_layers, last = N - 1;
		const char *head = tc.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
		float *fc = OWN(calloc((size_t)h * 3 * (size_t)h, sizeof(float)));
		float *qk = OWN(calloc((size_t)q * 2 * (size_t)h, sizeof(float)));
		float *v = OWN(calloc((size_t)q * 2 * (size_t)h, sizeof(float)));
		float *o = OWN(calloc((size_t)h * (size_t)q, sizeof(float)));
		float *emb, *lm = NULL, *gate = NULL, *up = NULL, *down = NULL, *post = NULL, *norm;
		const float a = sqrtf(400.0f / sqrtf((float)c.head_dim));
		double rms = 0;
		char nm[128];

		c.n_aux = 3;
		c.aux_layers[0] = 0;
		c.aux_layers[1] = N / 2;
		c.aux_layers[2] = last;
		if (!fc || !qk || !v || !o) {
			rc = -ENOMEM;
			snprintf(err, errlen, "out of memory");
			goto out;
		}
		emb = OWN(read_whole(&ck, "model.embed_tokens.weight", (uint64_t)tc.vocab_size, h,
				     err, errlen));
		if (emb)
			lm = tc.tie_word_embeddings ? emb
						    : OWN(read_whole(&ck, head, (uint64_t)tc.vocab_size, h,
								     err, errlen));
		norm = lm ? OWN(read_whole(&ck, "model.norm.weight", h, 0, err, errlen)) : NULL;
		if (!norm) {
			rc = -EINVAL;
			goto out;
		}
		if (!dps_cfg_layer_moe(&tc, last)) {
			snprintf(nm, sizeof(nm), "model.layers.%d.mlp.gate_proj.weight", last);
			gate = OWN(read_whole(&ck, nm, im, h, err, errlen));
			snprintf(nm, sizeof(nm), "model.layers.%d.mlp.up_proj.weight", last);
			up = gate ? OWN(read_whole(&ck, nm, im, h, err, errlen)) : NULL;
			snprintf(nm, sizeof(nm), "model.layers.%d.mlp.down_proj.weight", last);
			down = up ? OWN(read_whole(&ck, nm, h, im, err, errlen)) : NULL;
			snprintf(nm, sizeof(nm), "model.layers.%d.post_attention_layernorm.weight",
				 last);
			post = down ? OWN(read_whole(&ck, nm, h, 0, err, errlen)) : NULL;
			if (!post) {
				rc = -EINVAL;
				goto out;
			}
		} else { /* a MoE last layer: no dense MLP to copy */
			gate = OWN(filled((size_t)im * (size_t)h, 0));
			up = OWN(filled((size_t)im * (size_t)h, 0));
			down = OWN(filled((size_t)im * (size_t)h, 0));
			post = OWN(filled((size_t)h, 1));
		}
		for (int i = 0; i < tc.vocab_size; i++) {
			double ss = 0;

			for (uint64_t k = 0; k < h; k++)
				ss += (double)emb[(size_t)i * h + k] * emb[(size_t)i * h + k];
			rms += sqrt(ss / (double)h);
		}
		rms /= tc.vocab_size;
		for (uint64_t r = 0; r < h; r++) {
			fc[r * 3 * h + r] = -1.0f;        /* - x(0, i) */
			fc[r * 3 * h + 2 * h + r] = 1.0f; /* + x(N-1, i) */
			qk[r * 2 * h + r] = a;
			v[r * 2 * h + r] = 1.0f;
			o[r * q + r] = (float)rms;
		}
		PUT("fc.weight", 2, h, 3 * h, fc);
		PUT("midlayer.hidden_norm.weight", 1, h, 0, OWN(filled((size_t)h, 1)));
		PUT("midlayer.input_layernorm.weight", 1, h, 0, OWN(filled((size_t)h, 1)));
		PUT("midlayer.self_attn.q_proj.weight", 2, q, 2 * h, qk);
		PUT("midlayer.self_attn.k_proj.weight", 2, q, 2 * h, qk);
		PUT("midlayer.self_attn.v_proj.weight", 2, q, 2 * h, v);
		PUT("midlayer.self_attn.o_proj.weight", 2, h, q, o);
		PUT("midlayer.post_attention_layernorm.weight", 1, h, 0, post);
		PUT("midlayer.mlp.gate_proj.weight", 2, im, h, gate);
		PUT("midlayer.mlp.up_proj.weight", 2, im, h, up);
		PUT("midlayer.mlp.down_proj.weight", 2, h, im, down);
		PUT("norm.weight", 1, h, 0, norm);
		PUT("lm_head.weight", 2, V, h, lm); /* the first draft_vocab rows (ids ascend from 0) */
		for (int i = 0; i < n_own; i++)
			if (!own[i]) {
				rc = -ENOMEM;
				snprintf(err, errlen, "out of memory");
				goto out;
			}
	}
#undef GEN
#undef PUT
#undef OWN
	rc = write_dir(outdir, t, n, &c, err, errlen);
out:
	for (int i = 0; i < n_own; i++)
		free(own[i]);
	free(ids);
	dps_ckpt_close(&ck);
	return rc;
}
