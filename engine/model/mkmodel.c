/* SPDX-License-Identifier: MIT */
/*
 * engine/model/mkmodel.c - seeded random models (see mkmodel.h): the presets, parameter
 * counts, the generators, and the tensors of every family under Hugging Face's names. Values
 * are a pure function of (seed, tensor index, element index), so any chunking of the writer
 * gives the same bytes; and Eagle3 drafts of a checkpoint, random or built from the target's
 * own weights.
 */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "common/dps.h"
#include "engine/model/ckpt.h"
#include "engine/model/mkmodel.h"

/* The shape of a preset: hidden, intermediate, layers, heads, KV heads, head size, vocab. */
#define SHAPE(h, im, l, nh, kv, hd, v)                                                   \
	.hidden_size = h, .intermediate_size = im, .num_hidden_layers = l,               \
	.num_attention_heads = nh, .num_key_value_heads = kv, .head_dim = hd, .vocab_size = v, \
	.bos_token_id = 1, .eos_token_id = 2, .rms_norm_eps = 1e-5
/* A Llama-family layer with plain RoPE of theta 10000 and a context of 2048. */
#define PLAIN(tie) .rope_theta = 10000.0, .max_position_embeddings = 2048, .tie_word_embeddings = tie
/*
 * GPT-OSS as published: experts in every layer, q/k/v/o biases, sinks, the clamped SwiGLU,
 * even layers windowed (GptOssConfig's layer_types; the mask covers any layer count up to
 * 64), YaRN of factor 32 over the original context orig, and max_position_embeddings the
 * extended context, 32 x orig: transformers 4.x takes YaRN's factor as the ratio of the two
 * whenever the original is given, and 5.x when no factor is.
 */
#define GPT_OSS(e, k, window, orig, tie)                                                 \
	.arch = DPS_ARCH_GPT_OSS, .num_local_experts = e, .num_experts_per_tok = k,      \
	.swiglu_limit = 7.0, .swiglu_alpha = 1.702, .qkv_bias = 1, .o_bias = 1,          \
	.attn_sinks = 1, .sliding_window = window,                                        \
	.window_layers = { 0x5555555555555555ull }, .rope_theta = 150000.0,               \
	.max_position_embeddings = 32 * (orig), .tie_word_embeddings = tie,               \
	.rope = { .kind = DPS_ROPE_YARN, .factor = 32.0, .original_max_pos = orig,        \
		  .beta_fast = 32.0, .beta_slow = 1.0, .truncate = 0 }

const struct dps_mkmodel_preset dps_mkmodel_presets[] = {
	{ "tiny", "Llama: 2 layers, hidden 64, 4 heads over 2 KV heads, for unit tests",
	  { SHAPE(64, 172, 2, 4, 2, 16, 256), PLAIN(1) } },
	{ "tiny-gqa", "Llama: 3 layers, 6 heads over 2 KV heads, untied head",
	  { SHAPE(48, 100, 3, 6, 2, 8, 300), PLAIN(0) } },
	{ "small", "Llama: 4 layers, hidden 256", { SHAPE(256, 688, 4, 8, 4, 32, 1024), PLAIN(1) } },
	{ "bench-110m", "Llama: the 110M shape llama.cpp and llama2.c were measured on",
	  { SHAPE(768, 2048, 12, 12, 12, 64, 32000), PLAIN(1) } },
	{ "bench-1b", "Llama: about 1B parameters: hidden 2048, 16 layers, 32 heads over 8 KV heads",
	  { SHAPE(2048, 8192, 16, 32, 8, 64, 32000), PLAIN(1) } },
	{ "tiny-llama3", "Llama 3.1: tiny with llama3 RoPE (factor 8, bands 1 and 4 of 16 positions)",
	  { SHAPE(64, 172, 2, 4, 2, 16, 256), .rope_theta = 500000.0,
	    .max_position_embeddings = 2048, .tie_word_embeddings = 1,
	    .rope = { .kind = DPS_ROPE_LLAMA3, .factor = 8.0, .low_freq_factor = 1.0,
		      .high_freq_factor = 4.0, .original_max_pos = 16 } } },
	{ "tiny-mistral", "Mistral: tiny with a sliding window of 8 on every layer",
	  { SHAPE(64, 172, 2, 4, 2, 16, 256), PLAIN(1), .arch = DPS_ARCH_MISTRAL,
	    .sliding_window = 8, .window_layers = { ~0ull } } },
	{ "tiny-qwen2", "Qwen2: tiny with q/k/v biases, a window of 8 from layer 1 (max_window_layers)",
	  { SHAPE(64, 172, 2, 4, 2, 16, 256), PLAIN(1), .arch = DPS_ARCH_QWEN2, .qkv_bias = 1,
	    .sliding_window = 8, .window_layers = { ~0ull << 1 } } },
	{ "tiny-qwen3", "Qwen3: q/k norms, 8 heads of 16 (head_dim 16, heads x head_dim 128 != hidden 64)",
	  { SHAPE(64, 172, 2, 8, 2, 16, 256), .rope_theta = 1000000.0,
	    .max_position_embeddings = 2048, .tie_word_embeddings = 1, .arch = DPS_ARCH_QWEN3,
	    .qk_norm = 1 } },
	{ "tiny-moe", "GPT-OSS: 3 layers of 8 experts of 96, top 2, sinks, window 8 on even layers, YaRN",
	  { SHAPE(64, 96, 3, 4, 2, 16, 256), GPT_OSS(8, 2, 8, 16, 1) } },
	{ "bench-moe", "GPT-OSS benchmark: hidden 768, 12 layers of 32 experts of 512, top 4, window 128",
	  { SHAPE(768, 512, 12, 12, 4, 64, 32000), GPT_OSS(32, 4, 128, 4096, 1) } },
	{ "tiny-gpt-oss", "GPT-OSS with MXFP4 experts: 3 layers of 8 experts of 64, top 2, hidden 64",
	  { SHAPE(64, 64, 3, 4, 2, 16, 256), GPT_OSS(8, 2, 8, 16, 1), .mxfp4 = 1 } },
	{ "bench-gpt-oss", "GPT-OSS benchmark, MXFP4: hidden 1024, 8 layers of 32 experts of 1024, top 4, "
	  "16 heads over 4 KV heads, window 128",
	  { SHAPE(1024, 1024, 8, 16, 4, 64, 32000), GPT_OSS(32, 4, 128, 4096, 0), .mxfp4 = 1 } },
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
	const uint64_t E = (uint64_t)c->num_local_experts;
	uint64_t attn = 2 * h + q * h + 2 * kv * h + h * q;
	uint64_t n = (uint64_t)c->vocab_size * h * (c->tie_word_embeddings ? 1 : 2) + h;

	attn += (c->qkv_bias ? q + 2 * kv : 0) + (c->o_bias ? h : 0);
	attn += (c->qk_norm ? 2 * (uint64_t)c->head_dim : 0) +
		(c->attn_sinks ? (uint64_t)c->num_attention_heads : 0);
	for (int l = 0; l < c->num_hidden_layers; l++) {
		n += attn;
		if (dps_cfg_layer_moe(c, l)) /* router, gate_up and down with their biases */
			n += E * (h + 1) + E * (2 * im * h + 2 * im + im * h + h);
		else
			n += 3 * im * h + (c->mlp_bias ? 2 * im + h : 0);
	}
	return n;
}

/* ---- generators --------------------------------------------------------------------------- */

/* splitmix64's finaliser: the hash every generator draws from. */
static uint64_t mix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

/* The random bits of element i of tensor `tensor` under seed. */
static uint64_t bits(uint64_t seed, uint64_t tensor, uint64_t i)
{
	return mix64(seed ^ mix64(tensor * 0x100000001B3ull + i));
}

/*
 * One tensor's generator (gen_arg of its writer entry): normal values of mean and std for
 * tensors written from floats (gen_normal); for MXFP4's U8 tensors, uniformly random E2M1
 * codes two a byte (gen_fp4_blocks) or scales drawn from {scale - 1, scale}
 * (gen_fp4_scales).
 */
struct gen {
	uint64_t seed, tensor;
	float std, mean;
	uint8_t scale;
};

/* A standard normal per element: Box-Muller on two draws. */
static void gen_normal(float *dst, uint64_t start, uint64_t count, void *arg)
{
	const struct gen *g = arg;

	for (uint64_t i = 0; i < count; i++) {
		const uint64_t r = bits(g->seed, g->tensor, start + i);
		const double u1 = ((double)(r >> 11) + 0.5) / 9007199254740992.0;
		const double u2 = (double)(mix64(r) >> 11) / 9007199254740992.0;
		const double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);

		dst[i] = g->mean + g->std * (float)z;
	}
}

/* Two uniformly random E2M1 codes a byte (kernels/mxfp4.h: low nibble the even element). */
static void gen_fp4_blocks(uint8_t *dst, uint64_t start, uint64_t count, void *arg)
{
	const struct gen *g = arg;

	for (uint64_t i = 0; i < count; i++)
		dst[i] = (uint8_t)bits(g->seed, g->tensor, start + i);
}

/* E8M0 scales: scale or scale - 1, evenly. */
static void gen_fp4_scales(uint8_t *dst, uint64_t start, uint64_t count, void *arg)
{
	const struct gen *g = arg;

	for (uint64_t i = 0; i < count; i++)
		dst[i] = (uint8_t)(g->scale - (bits(g->seed, g->tensor, start + i) & 1));
}

/*
 * The scale byte whose MXFP4 weights have about standard deviation std: uniform codes have
 * a mean square of 8.5625, and scales 2^(s-128) or 2^(s-127) evenly multiply it by
 * 0.625 * 4^(s-127), so the weights' RMS is 2.3133 * 2^(s-127).
 */
static uint8_t fp4_scale_for(float std)
{
	long s = 127 + lround(log2((double)std / 2.3133));

	return (uint8_t)(s < 2 ? 2 : s > 254 ? 254 : s);
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

/* ---- the tensors of a model --------------------------------------------------------------- */

/* The tensors being listed: entries t and their generators g (cap of each). */
struct mk {
	struct dps_st_writer_tensor *t;
	struct gen *g;
	int n, cap;
	uint64_t seed;
	enum dps_st_dtype dt;
};

/* Appends tensor [model.layers.L.]what (layer < 0: no prefix) of the given shape. */
static struct dps_st_writer_tensor *add(struct mk *m, int layer, const char *what, int ndim,
					const uint64_t *shape)
{
	struct dps_st_writer_tensor *t = &m->t[m->n];

	DPS_ASSERT(m->n < m->cap && ndim <= DPS_ST_MAX_DIMS);
	if (layer >= 0)
		snprintf(t->name, sizeof(t->name), "model.layers.%d.%s", layer, what);
	else
		snprintf(t->name, sizeof(t->name), "%s", what);
	t->ndim = ndim;
	memcpy(t->shape, shape, sizeof(uint64_t) * (size_t)ndim);
	m->g[m->n] = (struct gen){ m->seed, (uint64_t)m->n, 0, 0, 0 };
	t->gen_arg = &m->g[m->n];
	m->n++;
	return t;
}

/* A float tensor of normal values (mean, std), written in the model's dtype. */
static void add_f(struct mk *m, int layer, const char *what, int ndim, const uint64_t *shape,
		  float mean, float std)
{
	struct dps_st_writer_tensor *t = add(m, layer, what, ndim, shape);
	struct gen *g = t->gen_arg;

	t->dtype = m->dt;
	t->gen = gen_normal;
	g->mean = mean;
	g->std = std;
}

/*
 * The MXFP4 form of an (rows, k) weight of every expert: what_blocks (E, rows, k / 32, 16)
 * and what_scales (E, rows, k / 32), U8, of about standard deviation std.
 */
static void add_fp4(struct mk *m, int layer, const char *what, uint64_t E, uint64_t rows,
		    uint64_t k, float std)
{
	char nm[96];
	struct dps_st_writer_tensor *t;

	snprintf(nm, sizeof(nm), "%s_blocks", what);
	t = add(m, layer, nm, 4, (const uint64_t[]){ E, rows, k / 32, 16 });
	t->dtype = DPS_ST_U8;
	t->gen_u8 = gen_fp4_blocks;
	snprintf(nm, sizeof(nm), "%s_scales", what);
	t = add(m, layer, nm, 3, (const uint64_t[]){ E, rows, k / 32 });
	t->dtype = DPS_ST_U8;
	t->gen_u8 = gen_fp4_scales;
	((struct gen *)t->gen_arg)->scale = fp4_scale_for(std);
}

/* The tensors of layer l: attention with what the family adds, then its MLP or experts. */
static void add_layer(struct mk *m, const struct dps_model_config *c, int l, float std,
		      float out_std)
{
	const uint64_t h = (uint64_t)c->hidden_size, im = (uint64_t)c->intermediate_size;
	const uint64_t q = (uint64_t)c->num_attention_heads * (uint64_t)c->head_dim;
	const uint64_t kv = (uint64_t)c->num_key_value_heads * (uint64_t)c->head_dim;
	const uint64_t E = (uint64_t)c->num_local_experts;
	const float bias_std = 0.02f;

	add_f(m, l, "input_layernorm.weight", 1, (const uint64_t[]){ h }, 1.0f, 0.1f);
	add_f(m, l, "self_attn.q_proj.weight", 2, (const uint64_t[]){ q, h }, 0.0f, std);
	if (c->qkv_bias)
		add_f(m, l, "self_attn.q_proj.bias", 1, (const uint64_t[]){ q }, 0.0f, bias_std);
	add_f(m, l, "self_attn.k_proj.weight", 2, (const uint64_t[]){ kv, h }, 0.0f, std);
	if (c->qkv_bias)
		add_f(m, l, "self_attn.k_proj.bias", 1, (const uint64_t[]){ kv }, 0.0f, bias_std);
	add_f(m, l, "self_attn.v_proj.weight", 2, (const uint64_t[]){ kv, h }, 0.0f, std);
	if (c->qkv_bias)
		add_f(m, l, "self_attn.v_proj.bias", 1, (const uint64_t[]){ kv }, 0.0f, bias_std);
	add_f(m, l, "self_attn.o_proj.weight", 2, (const uint64_t[]){ h, q }, 0.0f, out_std);
	if (c->o_bias)
		add_f(m, l, "self_attn.o_proj.bias", 1, (const uint64_t[]){ h }, 0.0f, bias_std);
	if (c->qk_norm) {
		const uint64_t hd = (uint64_t)c->head_dim;

		add_f(m, l, "self_attn.q_norm.weight", 1, &hd, 1.0f, 0.1f);
		add_f(m, l, "self_attn.k_norm.weight", 1, &hd, 1.0f, 0.1f);
	}
	if (c->attn_sinks) /* logits of the order of the attention scores */
		add_f(m, l, "self_attn.sinks", 1,
		      (const uint64_t[]){ (uint64_t)c->num_attention_heads }, 0.0f, 0.5f);
	add_f(m, l, "post_attention_layernorm.weight", 1, (const uint64_t[]){ h }, 1.0f, 0.1f);
	if (!dps_cfg_layer_moe(c, l)) {
		add_f(m, l, "mlp.gate_proj.weight", 2, (const uint64_t[]){ im, h }, 0.0f, std);
		if (c->mlp_bias)
			add_f(m, l, "mlp.gate_proj.bias", 1, &im, 0.0f, bias_std);
		add_f(m, l, "mlp.up_proj.weight", 2, (const uint64_t[]){ im, h }, 0.0f, std);
		if (c->mlp_bias)
			add_f(m, l, "mlp.up_proj.bias", 1, &im, 0.0f, bias_std);
		add_f(m, l, "mlp.down_proj.weight", 2, (const uint64_t[]){ h, im }, 0.0f, out_std);
		if (c->mlp_bias)
			add_f(m, l, "mlp.down_proj.bias", 1, &h, 0.0f, bias_std);
		return;
	}
	/*
	 * GPT-OSS's experts. The router spreads tokens when its logits differ by O(1): a larger
	 * spread. gate_up_proj (E, hidden, 2I) is applied as x . W, its column 2i is the gate's
	 * row i and column 2i+1 the up projection's; down_proj (E, I, hidden) likewise. As MXFP4
	 * each is stored transposed, a row per output feature (2I rows of hidden, hidden rows of
	 * I), the biases staying float.
	 */
	add_f(m, l, "mlp.router.weight", 2, (const uint64_t[]){ E, h }, 0.0f, 1.0f);
	add_f(m, l, "mlp.router.bias", 1, &E, 0.0f, 0.5f);
	if (c->mxfp4)
		add_fp4(m, l, "mlp.experts.gate_up_proj", E, 2 * im, h, std);
	else
		add_f(m, l, "mlp.experts.gate_up_proj", 3, (const uint64_t[]){ E, h, 2 * im }, 0.0f,
		      std);
	add_f(m, l, "mlp.experts.gate_up_proj_bias", 2, (const uint64_t[]){ E, 2 * im }, 0.0f,
	      bias_std);
	if (c->mxfp4)
		add_fp4(m, l, "mlp.experts.down_proj", E, h, im, out_std);
	else
		add_f(m, l, "mlp.experts.down_proj", 3, (const uint64_t[]){ E, im, h }, 0.0f,
		      out_std);
	add_f(m, l, "mlp.experts.down_proj_bias", 2, (const uint64_t[]){ E, h }, 0.0f, bias_std);
}

int dps_mkmodel(const struct dps_model_config *c, uint64_t seed, enum dps_st_dtype dt,
		const char *outdir, char *err, size_t errlen)
{
	const int L = c->num_hidden_layers;
	const uint64_t h = (uint64_t)c->hidden_size, V = (uint64_t)c->vocab_size;
	const float std = 0.02f, out_std = 0.02f / sqrtf(2.0f * (float)L);
	struct mk m = { .seed = seed, .dt = dt };
	int rc;

	rc = dps_model_config_check_save(c, err, errlen);
	if (rc)
		return rc;
	if (dt == DPS_ST_I64 || dt == DPS_ST_U8) {
		snprintf(err, errlen, "weights are written as F32, BF16 or F16, not %s",
			 dps_st_dtype_name(dt));
		return -EINVAL;
	}
	if (c->mxfp4 && (c->hidden_size % 32 || c->intermediate_size % 32)) {
		snprintf(err, errlen, "MXFP4 experts need hidden_size (%d) and intermediate_size "
			 "(%d) to be multiples of 32 (blocks of 32 along each row)", c->hidden_size,
			 c->intermediate_size);
		return -EINVAL;
	}
	/* At most 19 tensors a layer (a dense one with every bias and norm), and 3 more. */
	m.cap = 24 * L + 3;
	m.t = calloc((size_t)m.cap, sizeof(*m.t));
	m.g = calloc((size_t)m.cap, sizeof(*m.g));
	if (!m.t || !m.g) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	if (mkdir(outdir, 0755) && errno != EEXIST) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", outdir, strerror(errno));
		goto out;
	}
	add_f(&m, -1, "model.embed_tokens.weight", 2, (const uint64_t[]){ V, h }, 0.0f, std);
	for (int l = 0; l < L; l++)
		add_layer(&m, c, l, std, out_std);
	add_f(&m, -1, "model.norm.weight", 1, &h, 1.0f, 0.1f);
	if (!c->tie_word_embeddings)
		add_f(&m, -1, "lm_head.weight", 2, (const uint64_t[]){ V, h }, 0.0f, std);
	rc = write_dir(outdir, m.t, m.n, c, err, errlen);
out:
	free(m.t);
	free(m.g);
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
	/*
	 * The draft: one dense Llama layer of the target's width, its head size, no grouped KV,
	 * plain RoPE of its theta, whatever the target's family (the draft reads the target's
	 * hidden states, not its attention).
	 */
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
	/* The target's end ids; a target without any (Qwen, GPT-OSS) leaves the draft's class
	 * default, 2 (the engine ends sequences by the target's ids). */
	c.eos_token_id = tc.n_eos ? tc.eos_token_id : 2;
	c.n_eos = tc.n_eos;
	memcpy(c.eos_ids, tc.eos_ids, sizeof(c.eos_ids));
	c.arch = DPS_ARCH_EAGLE3;
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
		g[n] = (struct gen){ seed, (uint64_t)n + 1000, sd, mu, 0 };             \
		t[n].gen = gen_normal;                                                  \
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
		 * token after i+1 as the target would without its last attention. The tensors read
		 * are the target's embedding, LM head (or the embedding when tied), final norm, and
		 * its last layer's post_attention_layernorm and dense MLP (without its biases, which
		 * a draft has not). A GPT-OSS target has experts in every layer: no dense MLP to
		 * copy (one expert is not the layer's mixture), so the draft's MLP is zero and the
		 * draft predicts as the target without its last layer; the fused expert tensors
		 * (dense or MXFP4) are not read.
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
		} else { /* a MoE last layer: no dense MLP to copy (see above) */
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
