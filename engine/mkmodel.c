/* SPDX-License-Identifier: MIT */
/*
 * engine/mkmodel.c - seeded random models (see mkmodel.h). Values are a pure function of
 * (seed, tensor index, element index), so any chunking of the writer gives the same bytes.
 */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "common/dps.h"
#include "engine/ckpt.h"
#include "engine/mkmodel.h"

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
	char path[4096];
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
	snprintf(path, sizeof(path), "%s/model.safetensors", outdir);
	rc = dps_st_write(path, t, n);
	if (rc) {
		snprintf(err, errlen, "%s: %s", path, dps_strerror(rc));
		goto out;
	}
	snprintf(path, sizeof(path), "%s/config.json", outdir);
	rc = dps_model_config_save(c, path);
	if (rc)
		snprintf(err, errlen, "%s: %s", path, dps_strerror(rc));
out:
	free(t);
	free(g);
	return rc;
}
