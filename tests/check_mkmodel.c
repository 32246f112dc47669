/* SPDX-License-Identifier: MIT */
/*
 * tests/check_mkmodel.c - seeded random models: the same seed gives the same bytes, another
 * seed other bytes, in every family; every preset's tensors by Hugging Face's name, shape
 * and dtype against a list written here from the families' layouts (nothing more on disk,
 * and their elements the parameter count); MXFP4 experts that decode to the magnitude of
 * the F32 ones, and MXFP4 shapes that are not blocks of 32 refused; and one model written as
 * F32, BF16 and F16 gives the same greedy tokens through the reference decoder (each
 * family's config.json: tests/check_config_save.c). Eagle3 drafts of a target (random and
 * self-distilled, of Llama, Qwen3 and GPT-OSS targets, MXFP4 included): a config that loads
 * as a draft of the asked vocabulary, every tensor of the right shape and dtype (d2t I64), a
 * random draft's ids a strictly increasing subset of the target's, a self-distilled draft's
 * LM head the target's (or its embedding when tied), the same seed the same bytes, and a
 * missing target refused.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dps.h"
#include "tests/testutil.h"
#include "engine/model/ckpt.h"
#include "engine/model/mkmodel.h"
#include "engine/model/model.h"
#include "kernels/kernels.h"

static char dir[64];

static void setup(void)
{
	test_tmpdir_make(dir, sizeof(dir), "mk");
}

static void teardown(void)
{
	test_tmpdir_remove(dir);
}

static int same_file(const char *a, const char *b)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "cmp -s '%s' '%s'", a, b);
	return system(cmd) == 0;
}

static void make(const char *sub, uint64_t seed, enum dps_st_dtype dt)
{
	char out[128], err[256];

	snprintf(out, sizeof(out), "%s/%s", dir, sub);
	ck_assert_msg(!dps_mkmodel(&dps_mkmodel_preset("tiny-gqa")->cfg, seed, dt, out, err,
				   sizeof(err)), "%s", err);
}

START_TEST(test_deterministic)
{
	char a[128], b[128], c[128];

	make("a", 7, DPS_ST_F32);
	make("b", 7, DPS_ST_F32);
	make("c", 8, DPS_ST_F32);
	snprintf(a, sizeof(a), "%s/a/model.safetensors", dir);
	snprintf(b, sizeof(b), "%s/b/model.safetensors", dir);
	snprintf(c, sizeof(c), "%s/c/model.safetensors", dir);
	ck_assert(same_file(a, b));
	ck_assert(!same_file(a, c));
}
END_TEST

static void greedy(const char *sub, int *out, int n)
{
	struct dps_model m;
	char path[128], err[256];
	int token = 1;

	snprintf(path, sizeof(path), "%s/%s", dir, sub);
	ck_assert_msg(!dps_model_load(&m, path, &(struct dps_model_opts){ .max_pos = 64 }, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(m.cfg.num_attention_heads, 6);
	ck_assert_int_eq(m.cfg.num_key_value_heads, 2);
	ck_assert_int_eq(m.cfg.tie_word_embeddings, 0);
	for (int p = 0; p < n; p++) {
		const float *lg = dps_model_forward_ref(&m, token, p);

		token = out[p] = p < 3 ? 5 + p : dps_argmax_ref(lg, m.cfg.vocab_size);
	}
	dps_model_free(&m);
}

START_TEST(test_dtypes_same_tokens)
{
	int f32[32], bf16[32], f16[32];

	make("f32", 3, DPS_ST_F32);
	make("bf16", 3, DPS_ST_BF16);
	make("f16", 3, DPS_ST_F16);
	greedy("f32", f32, 32);
	greedy("bf16", bf16, 32);
	greedy("f16", f16, 32);
	for (int i = 0; i < 32; i++) {
		ck_assert_int_eq(bf16[i], f32[i]);
		ck_assert_int_eq(f16[i], f32[i]);
	}
}
END_TEST

START_TEST(test_config_lies)
{
	/* A config.json far larger than its file is refused by shape, before any allocation. */
	struct dps_model_config c = dps_mkmodel_preset("tiny-gqa")->cfg;
	struct dps_model m;
	char path[128], err[512];

	make("lie", 1, DPS_ST_F32);
	c.vocab_size = 1 << 24;
	c.hidden_size = 1 << 16;
	c.head_dim = c.hidden_size / c.num_attention_heads;
	snprintf(path, sizeof(path), "%s/lie/config.json", dir);
	ck_assert_int_eq(dps_model_config_save(&c, path), 0);
	snprintf(path, sizeof(path), "%s/lie", dir);
	ck_assert_int_lt(dps_model_load(&m, path, &(struct dps_model_opts){ .max_pos = 16 }, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "model.embed_tokens.weight' has shape 300x48, expected 16777216x65536"),
		      "%s", err);
}
END_TEST

START_TEST(test_params)
{
	/* bench-110m: the 110M model the peers were measured on (438 MB of F32 weights). */
	const struct dps_mkmodel_preset *p = dps_mkmodel_preset("bench-110m");

	ck_assert_ptr_nonnull(p);
	ck_assert_int_eq(p->cfg.hidden_size, 768);
	ck_assert_int_eq(p->cfg.intermediate_size, 2048);
	ck_assert_int_eq(p->cfg.num_hidden_layers, 12);
	ck_assert_int_eq(p->cfg.vocab_size, 32000);
	ck_assert(dps_model_config_params(&p->cfg) * 4 > 430000000ull &&
		  dps_model_config_params(&p->cfg) * 4 < 445000000ull);
	ck_assert_ptr_null(dps_mkmodel_preset("nope"));
}
END_TEST

/* ---- every family: tensors, MXFP4, config.json -------------------------------------------- */

static void make_cfg(const char *sub, const struct dps_model_config *c, uint64_t seed,
		     enum dps_st_dtype dt)
{
	char out[128], err[256];

	snprintf(out, sizeof(out), "%s/%s", dir, sub);
	ck_assert_msg(!dps_mkmodel(c, seed, dt, out, err, sizeof(err)), "%s: %s", sub, err);
}

static void make_preset(const char *sub, const char *preset, uint64_t seed, enum dps_st_dtype dt)
{
	make_cfg(sub, &dps_mkmodel_preset(preset)->cfg, seed, dt);
}

/* A preset small enough to write in a test: the benchmarks with one layer and 64 ids. */
static struct dps_model_config test_shape(int i)
{
	struct dps_model_config c = dps_mkmodel_presets[i].cfg;

	if (!strncmp(dps_mkmodel_presets[i].name, "bench", 5)) {
		c.num_hidden_layers = 1;
		c.vocab_size = 64;
	}
	return c;
}

struct want {
	char name[128];
	int ndim, u8;
	uint64_t shape[4];
};

/* Appends [model.layers.l.]what (l < 0: no prefix) of shape d[0..nd-1] to w[*n]. */
static void want(struct want *w, int *n, int l, const char *what, int u8, int nd, uint64_t d0,
		 uint64_t d1, uint64_t d2, uint64_t d3)
{
	struct want *x = &w[(*n)++];

	*x = (struct want){ .ndim = nd, .u8 = u8, .shape = { d0, d1, d2, d3 } };
	if (l >= 0)
		snprintf(x->name, sizeof(x->name), "model.layers.%d.%s", l, what);
	else
		snprintf(x->name, sizeof(x->name), "%s", what);
}

/* The tensors a checkpoint of c has, as Hugging Face names and lays them out. */
static int expected(const struct dps_model_config *c, struct want *w)
{
	const uint64_t h = (uint64_t)c->hidden_size, I = (uint64_t)c->intermediate_size;
	const uint64_t hd = (uint64_t)c->head_dim, q = (uint64_t)c->num_attention_heads * hd;
	const uint64_t kv = (uint64_t)c->num_key_value_heads * hd, V = (uint64_t)c->vocab_size;
	const uint64_t E = (uint64_t)c->num_local_experts;
	int n = 0;

	want(w, &n, -1, "model.embed_tokens.weight", 0, 2, V, h, 0, 0);
	want(w, &n, -1, "model.norm.weight", 0, 1, h, 0, 0, 0);
	if (!c->tie_word_embeddings)
		want(w, &n, -1, "lm_head.weight", 0, 2, V, h, 0, 0);
	for (int l = 0; l < c->num_hidden_layers; l++) {
		want(w, &n, l, "input_layernorm.weight", 0, 1, h, 0, 0, 0);
		want(w, &n, l, "post_attention_layernorm.weight", 0, 1, h, 0, 0, 0);
		want(w, &n, l, "self_attn.q_proj.weight", 0, 2, q, h, 0, 0);
		want(w, &n, l, "self_attn.k_proj.weight", 0, 2, kv, h, 0, 0);
		want(w, &n, l, "self_attn.v_proj.weight", 0, 2, kv, h, 0, 0);
		want(w, &n, l, "self_attn.o_proj.weight", 0, 2, h, q, 0, 0);
		if (c->qkv_bias) {
			want(w, &n, l, "self_attn.q_proj.bias", 0, 1, q, 0, 0, 0);
			want(w, &n, l, "self_attn.k_proj.bias", 0, 1, kv, 0, 0, 0);
			want(w, &n, l, "self_attn.v_proj.bias", 0, 1, kv, 0, 0, 0);
		}
		if (c->o_bias)
			want(w, &n, l, "self_attn.o_proj.bias", 0, 1, h, 0, 0, 0);
		if (c->qk_norm) {
			want(w, &n, l, "self_attn.q_norm.weight", 0, 1, hd, 0, 0, 0);
			want(w, &n, l, "self_attn.k_norm.weight", 0, 1, hd, 0, 0, 0);
		}
		if (c->attn_sinks)
			want(w, &n, l, "self_attn.sinks", 0, 1, (uint64_t)c->num_attention_heads, 0, 0,
			     0);
		if (!E) {
			want(w, &n, l, "mlp.gate_proj.weight", 0, 2, I, h, 0, 0);
			want(w, &n, l, "mlp.up_proj.weight", 0, 2, I, h, 0, 0);
			want(w, &n, l, "mlp.down_proj.weight", 0, 2, h, I, 0, 0);
			if (c->mlp_bias) {
				want(w, &n, l, "mlp.gate_proj.bias", 0, 1, I, 0, 0, 0);
				want(w, &n, l, "mlp.up_proj.bias", 0, 1, I, 0, 0, 0);
				want(w, &n, l, "mlp.down_proj.bias", 0, 1, h, 0, 0, 0);
			}
			continue;
		}
		want(w, &n, l, "mlp.router.weight", 0, 2, E, h, 0, 0);
		want(w, &n, l, "mlp.router.bias", 0, 1, E, 0, 0, 0);
		want(w, &n, l, "mlp.experts.gate_up_proj_bias", 0, 2, E, 2 * I, 0, 0);
		want(w, &n, l, "mlp.experts.down_proj_bias", 0, 2, E, h, 0, 0);
		if (c->mxfp4) {
			want(w, &n, l, "mlp.experts.gate_up_proj_blocks", 1, 4, E, 2 * I, h / 32, 16);
			want(w, &n, l, "mlp.experts.gate_up_proj_scales", 1, 3, E, 2 * I, h / 32, 0);
			want(w, &n, l, "mlp.experts.down_proj_blocks", 1, 4, E, h, I / 32, 16);
			want(w, &n, l, "mlp.experts.down_proj_scales", 1, 3, E, h, I / 32, 0);
		} else {
			want(w, &n, l, "mlp.experts.gate_up_proj", 0, 3, E, h, 2 * I, 0);
			want(w, &n, l, "mlp.experts.down_proj", 0, 3, E, I, h, 0);
		}
	}
	return n;
}

static void open_st(struct dps_st_file *f, const char *sub)
{
	char path[160], err[512];

	snprintf(path, sizeof(path), "%s/%s/model.safetensors", dir, sub);
	ck_assert_msg(!dps_st_open(path, f, err, sizeof(err)), "%s", err);
}

START_TEST(test_preset_tensors)
{
	const struct dps_mkmodel_preset *p = &dps_mkmodel_presets[_i];
	const struct dps_model_config c = test_shape(_i);
	const enum dps_st_dtype dt = c.hidden_size > 256 ? DPS_ST_BF16 : DPS_ST_F32;
	struct want *w = calloc(64 * (size_t)c.num_hidden_layers + 4, sizeof(*w));
	struct dps_st_file f;
	uint64_t elements = 0;
	int n;

	ck_assert_ptr_nonnull(p->what);
	make_cfg("m", &c, 1, dt);
	open_st(&f, "m");
	n = expected(&c, w);
	for (int i = 0; i < n; i++) {
		const struct dps_st_tensor *t = dps_st_find(&f, w[i].name);

		ck_assert_msg(t, "%s: no tensor %s", p->name, w[i].name);
		ck_assert_msg(t->ndim == w[i].ndim, "%s: %s has %d dimensions, want %d", p->name,
			      w[i].name, t->ndim, w[i].ndim);
		for (int k = 0; k < t->ndim; k++)
			ck_assert_msg(t->shape[k] == w[i].shape[k], "%s: %s dimension %d is %llu, "
				      "want %llu", p->name, w[i].name, k,
				      (unsigned long long)t->shape[k],
				      (unsigned long long)w[i].shape[k]);
		ck_assert_msg(t->dtype == (w[i].u8 ? DPS_ST_U8 : dt), "%s: %s is %s", p->name,
			      w[i].name, dps_st_dtype_name(t->dtype));
		/* Parameters: MXFP4 blocks hold two a byte, scales none. */
		if (!strstr(w[i].name, "_scales"))
			elements += t->numel * (w[i].u8 ? 2 : 1);
	}
	ck_assert_msg(f.n == n, "%s: %d tensors on disk, %d expected", p->name, f.n, n);
	ck_assert_uint_eq(elements, dps_model_config_params(&c));
	/* The old per-expert layout is gone. */
	ck_assert_ptr_null(dps_st_find(&f, "model.layers.0.mlp.experts.0.gate_proj.weight"));
	dps_st_free(&f);
	free(w);
}
END_TEST

START_TEST(test_families_deterministic)
{
	static const char *const presets[] = { "tiny-moe", "tiny-gpt-oss", "tiny-qwen2",
					       "tiny-qwen3" };
	char a[128], b[128], c[128];

	for (int i = 0; i < 4; i++) {
		make_preset("a", presets[i], 7, DPS_ST_F32);
		make_preset("b", presets[i], 7, DPS_ST_F32);
		make_preset("c", presets[i], 8, DPS_ST_F32);
		snprintf(a, sizeof(a), "%s/a/model.safetensors", dir);
		snprintf(b, sizeof(b), "%s/b/model.safetensors", dir);
		snprintf(c, sizeof(c), "%s/c/model.safetensors", dir);
		ck_assert_msg(same_file(a, b), "%s: the same seed gave other bytes", presets[i]);
		ck_assert_msg(!same_file(a, c), "%s: another seed gave the same bytes", presets[i]);
	}
}
END_TEST

/* The E2M1 values of kernels/mxfp4.h, written out here as the test's own decoder. */
static const float e2m1[16] = { 0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3,
				-4, -6 };

/* RMS of an MXFP4 weight (rows x k a matrix, E of them), decoded; codes seen in *codes. */
static double fp4_rms(const struct dps_st_file *f, const char *stem, unsigned *codes)
{
	char nm[160];
	const struct dps_st_tensor *bt, *st;
	uint8_t *blk, *sc;
	double ss = 0;

	snprintf(nm, sizeof(nm), "%s_blocks", stem);
	bt = dps_st_find(f, nm);
	snprintf(nm, sizeof(nm), "%s_scales", stem);
	st = dps_st_find(f, nm);
	ck_assert(bt && st && bt->numel == st->numel * 16);
	blk = malloc(bt->numel);
	sc = malloc(st->numel);
	ck_assert_int_eq(pread(f->fd, blk, bt->numel, (off_t)bt->begin), (ssize_t)bt->numel);
	ck_assert_int_eq(pread(f->fd, sc, st->numel, (off_t)st->begin), (ssize_t)st->numel);
	for (uint64_t i = 0; i < bt->numel; i++) {
		/* Byte i of block i / 16: two elements, low nibble first, times 2^(scale - 127). */
		const double s = ldexp(1.0, (int)sc[i / 16] - 127);
		const double lo = e2m1[blk[i] & 15] * s, hi = e2m1[blk[i] >> 4] * s;

		*codes |= 1u << (blk[i] & 15) | 1u << (blk[i] >> 4);
		ss += lo * lo + hi * hi;
	}
	free(blk);
	free(sc);
	return sqrt(ss / (double)(2 * bt->numel));
}

/* RMS of F32 tensor name of f. */
static double f32_rms(const struct dps_st_file *f, const char *name)
{
	const struct dps_st_tensor *t = dps_st_find(f, name);
	float *v;
	double ss = 0;

	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(t->dtype, DPS_ST_F32);
	v = malloc(t->numel * 4);
	ck_assert_int_eq(pread(f->fd, v, t->numel * 4, (off_t)t->begin), (ssize_t)(t->numel * 4));
	for (uint64_t i = 0; i < t->numel; i++)
		ss += (double)v[i] * v[i];
	free(v);
	return sqrt(ss / (double)t->numel);
}

START_TEST(test_mxfp4_magnitudes)
{
	/* tiny-gpt-oss as MXFP4 and the same shape in F32: the experts of each, layer by layer. */
	struct dps_model_config c = dps_mkmodel_preset("tiny-gpt-oss")->cfg;
	struct dps_st_file q, d;
	char stem[128], name[160];
	unsigned codes = 0;

	make_cfg("q", &c, 3, DPS_ST_F32);
	c.mxfp4 = 0;
	make_cfg("d", &c, 3, DPS_ST_F32);
	open_st(&q, "q");
	open_st(&d, "d");
	for (int l = 0; l < c.num_hidden_layers; l++)
		for (int k = 0; k < 2; k++) {
			const char *what = k ? "down_proj" : "gate_up_proj";
			double rq, rd;

			snprintf(stem, sizeof(stem), "model.layers.%d.mlp.experts.%s", l, what);
			rq = fp4_rms(&q, stem, &codes);
			rd = f32_rms(&d, stem);
			ck_assert_msg(rq > 0.6 * rd && rq < 1.6 * rd, "%s: MXFP4 RMS %g, F32 %g", stem,
				      rq, rd);
			/* The biases stay float, as in the F32 model. */
			snprintf(name, sizeof(name), "%s_bias", stem);
			ck_assert_int_eq(dps_st_find(&q, name)->dtype, DPS_ST_F32);
		}
	ck_assert_uint_eq(codes, 0xffffu); /* every code drawn */
	/* The check can fail: the F32 model has no blocks, and its scale of RMS is not 10x. */
	ck_assert_ptr_null(dps_st_find(&d, "model.layers.0.mlp.experts.down_proj_blocks"));
	ck_assert(fp4_rms(&q, "model.layers.0.mlp.experts.gate_up_proj", &codes) <
		  10 * f32_rms(&d, "model.layers.0.mlp.experts.down_proj"));
	dps_st_free(&q);
	dps_st_free(&d);
	/* Blocks of 32 along each row: other sizes are refused, naming the rule. */
	{
		char out[128], err[256] = "";

		c = dps_mkmodel_preset("tiny-gpt-oss")->cfg;
		c.intermediate_size = 48;
		snprintf(out, sizeof(out), "%s/bad", dir);
		ck_assert_int_eq(dps_mkmodel(&c, 1, DPS_ST_F32, out, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, "multiples of 32"), "%s", err);
	}
}
END_TEST

/* ---- Eagle3 drafts ---------------------------------------------------------------------- */

static void make_draft(const char *target, enum dps_draft_kind kind, int dv, uint64_t seed,
		       enum dps_st_dtype dt, const char *sub)
{
	char tdir[128], out[128], err[512] = "";

	snprintf(tdir, sizeof(tdir), "%s/%s", dir, target);
	snprintf(out, sizeof(out), "%s/%s", dir, sub);
	ck_assert_msg(!dps_mkmodel_draft(tdir, kind, dv, seed, dt, out, err, sizeof(err)),
		      "draft %s of %s: %s", sub, target, err);
}

static void open_sub(struct dps_ckpt *ck, const char *sub)
{
	char path[128], err[512];

	snprintf(path, sizeof(path), "%s/%s", dir, sub);
	ck_assert_msg(!dps_ckpt_open(ck, path, err, sizeof(err)), "%s", err);
}

/* Tensor name of ck has shape d0 (x d1 when d1) and dtype dt. */
static void want_tensor(const struct dps_ckpt *ck, const char *name, uint64_t d0, uint64_t d1,
			enum dps_st_dtype dt)
{
	const struct dps_st_tensor *t = dps_ckpt_find(ck, name, NULL);

	ck_assert_msg(t, "%s: no tensor '%s'", ck->dir, name);
	ck_assert_msg(t->ndim == (d1 ? 2 : 1) && t->shape[0] == d0 && (!d1 || t->shape[1] == d1),
		      "'%s' has %d dimensions %llu x %llu, want %llu x %llu", name, t->ndim,
		      (unsigned long long)t->shape[0],
		      (unsigned long long)(t->ndim > 1 ? t->shape[1] : 0), (unsigned long long)d0,
		      (unsigned long long)d1);
	ck_assert_msg(t->dtype == dt, "'%s' is %s, want %s", name, dps_st_dtype_name(t->dtype),
		      dps_st_dtype_name(dt));
}

/* Reads tensor name of ck whole (n floats at most) into a new array. */
static float *read_all(struct dps_ckpt *ck, const char *name, size_t n)
{
	const struct dps_st_tensor *t = dps_ckpt_find(ck, name, NULL);
	float *p;
	char err[512];

	ck_assert_ptr_nonnull(t);
	ck_assert_uint_le(t->numel, n);
	p = malloc(sizeof(float) * n);
	ck_assert_ptr_nonnull(p);
	ck_assert_msg(!dps_ckpt_load_shard(ck, name, 0, NULL, 0, 0, 1, p, err, sizeof(err)), "%s",
		      err);
	return p;
}

/*
 * The draft in sub of a tiny-gqa target (hidden 48, 6 heads of 8, intermediate 100, vocab
 * 300, 3 layers): its config and every tensor's shape and dtype. Returns the target ids of
 * the draft vocabulary (i + d2t[i]), checked strictly increasing within the vocabulary.
 */
static int *check_draft(const char *sub, enum dps_draft_kind kind, int dv, enum dps_st_dtype dt)
{
	const uint64_t H = 48, I = 100, V = (uint64_t)dv;
	struct dps_model_config c;
	struct dps_ckpt ck;
	char path[128], err[512];
	float *d2t;
	int *ids;

	snprintf(path, sizeof(path), "%s/%s", dir, sub);
	ck_assert_msg(!dps_model_config_load(path, &c, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(c.eagle3, 1);
	ck_assert_int_eq(c.draft_vocab_size, dv);
	ck_assert_int_eq(c.vocab_size, 300);
	ck_assert_int_eq(c.hidden_size, 48);
	ck_assert_int_eq(c.intermediate_size, 100);
	ck_assert_int_eq(c.num_hidden_layers, 1);
	ck_assert_int_eq(c.head_dim, 8);
	ck_assert_int_eq(c.num_attention_heads, 6);
	ck_assert_int_eq(c.num_key_value_heads, 6);
	if (kind == DPS_DRAFT_SELF) {
		/* Fuses the target's layers 0, N/2 and N-1. */
		ck_assert_int_eq(c.n_aux, 3);
		ck_assert_int_eq(c.aux_layers[0], 0);
		ck_assert_int_eq(c.aux_layers[1], 1);
		ck_assert_int_eq(c.aux_layers[2], 2);
	}
	open_sub(&ck, sub);
	ck_assert_int_eq(ck.cfg.eagle3, 1);
	want_tensor(&ck, "fc.weight", H, 3 * H, dt);
	want_tensor(&ck, "midlayer.hidden_norm.weight", H, 0, dt);
	want_tensor(&ck, "midlayer.input_layernorm.weight", H, 0, dt);
	want_tensor(&ck, "midlayer.self_attn.q_proj.weight", 6 * 8, 2 * H, dt);
	want_tensor(&ck, "midlayer.self_attn.k_proj.weight", 6 * 8, 2 * H, dt);
	want_tensor(&ck, "midlayer.self_attn.v_proj.weight", 6 * 8, 2 * H, dt);
	want_tensor(&ck, "midlayer.self_attn.o_proj.weight", H, 6 * 8, dt);
	want_tensor(&ck, "midlayer.post_attention_layernorm.weight", H, 0, dt);
	want_tensor(&ck, "midlayer.mlp.gate_proj.weight", I, H, dt);
	want_tensor(&ck, "midlayer.mlp.up_proj.weight", I, H, dt);
	want_tensor(&ck, "midlayer.mlp.down_proj.weight", H, I, dt);
	want_tensor(&ck, "norm.weight", H, 0, dt);
	want_tensor(&ck, "lm_head.weight", V, H, dt);
	want_tensor(&ck, "d2t", V, 0, DPS_ST_I64);
	/* No target tensor comes along. */
	ck_assert_ptr_null(dps_ckpt_find(&ck, "model.embed_tokens.weight", NULL));
	d2t = read_all(&ck, "d2t", V);
	ids = malloc(sizeof(int) * V);
	ck_assert_ptr_nonnull(ids);
	for (uint64_t i = 0; i < V; i++) {
		ck_assert(d2t[i] == floorf(d2t[i]));
		ids[i] = (int)i + (int)d2t[i];
		ck_assert_msg(ids[i] >= 0 && ids[i] < 300, "d2t[%llu] = %g maps outside the vocabulary",
			      (unsigned long long)i, (double)d2t[i]);
		ck_assert_msg(!i || ids[i] > ids[i - 1], "target ids not increasing at %llu",
			      (unsigned long long)i);
	}
	free(d2t);
	dps_ckpt_close(&ck);
	return ids;
}

START_TEST(test_draft_shapes)
{
	int *ids;

	make_preset("t", "tiny-gqa", 3, DPS_ST_F32);
	/* Random, a third of the vocabulary: a subset of the ids, not simply the first ones. */
	make_draft("t", DPS_DRAFT_RANDOM, 100, 11, DPS_ST_F32, "rnd");
	ids = check_draft("rnd", DPS_DRAFT_RANDOM, 100, DPS_ST_F32);
	ck_assert_int_gt(ids[99], 99);
	free(ids);
	/* Random in BF16 over the whole vocabulary (0 asks for it): every id, in order. */
	make_draft("t", DPS_DRAFT_RANDOM, 0, 11, DPS_ST_BF16, "rnd-all");
	ids = check_draft("rnd-all", DPS_DRAFT_RANDOM, 300, DPS_ST_BF16);
	for (int i = 0; i < 300; i++)
		ck_assert_int_eq(ids[i], i);
	free(ids);
	/* Self-distilled: the first ids (d2t all zero). */
	make_draft("t", DPS_DRAFT_SELF, 100, 0, DPS_ST_F32, "self");
	ids = check_draft("self", DPS_DRAFT_SELF, 100, DPS_ST_F32);
	for (int i = 0; i < 100; i++)
		ck_assert_int_eq(ids[i], i);
	free(ids);
}
END_TEST

START_TEST(test_draft_deterministic)
{
	char a[128], b[128], c[128];
	int *x, *y;

	make_preset("t", "tiny-gqa", 3, DPS_ST_F32);
	make_draft("t", DPS_DRAFT_RANDOM, 64, 5, DPS_ST_F32, "a");
	make_draft("t", DPS_DRAFT_RANDOM, 64, 5, DPS_ST_F32, "b");
	make_draft("t", DPS_DRAFT_RANDOM, 64, 6, DPS_ST_F32, "c");
	snprintf(a, sizeof(a), "%s/a/model.safetensors", dir);
	snprintf(b, sizeof(b), "%s/b/model.safetensors", dir);
	snprintf(c, sizeof(c), "%s/c/model.safetensors", dir);
	ck_assert(same_file(a, b));
	ck_assert(!same_file(a, c));
	snprintf(a, sizeof(a), "%s/a/config.json", dir);
	snprintf(b, sizeof(b), "%s/b/config.json", dir);
	ck_assert(same_file(a, b));
	/* Another seed draws another subset of ids. */
	x = check_draft("a", DPS_DRAFT_RANDOM, 64, DPS_ST_F32);
	y = check_draft("c", DPS_DRAFT_RANDOM, 64, DPS_ST_F32);
	ck_assert(memcmp(x, y, sizeof(int) * 64));
	free(x);
	free(y);
	/* A self-distilled draft depends on the target only. */
	make_draft("t", DPS_DRAFT_SELF, 0, 1, DPS_ST_F32, "s1");
	make_draft("t", DPS_DRAFT_SELF, 0, 2, DPS_ST_F32, "s2");
	snprintf(a, sizeof(a), "%s/s1/model.safetensors", dir);
	snprintf(b, sizeof(b), "%s/s2/model.safetensors", dir);
	ck_assert(same_file(a, b));
}
END_TEST

/* Rows [0, rows) of the draft's lm_head equal those of the target's tensor head, and the
 * final norms are equal. */
static void check_self_head(const char *target, const char *draft, const char *head, int rows,
			    int vocab, int h)
{
	struct dps_ckpt t, d;
	float *th, *dh, *tn, *dn;

	open_sub(&t, target);
	open_sub(&d, draft);
	th = read_all(&t, head, (size_t)vocab * (size_t)h);
	dh = read_all(&d, "lm_head.weight", (size_t)rows * (size_t)h);
	for (size_t i = 0; i < (size_t)rows * (size_t)h; i++)
		ck_assert_msg(dh[i] == th[i], "%s: lm_head element %zu is %g, the target's %s %g",
			      draft, i, (double)dh[i], head, (double)th[i]);
	tn = read_all(&t, "model.norm.weight", (size_t)h);
	dn = read_all(&d, "norm.weight", (size_t)h);
	ck_assert(!memcmp(tn, dn, sizeof(float) * (size_t)h));
	free(th);
	free(dh);
	free(tn);
	free(dn);
	dps_ckpt_close(&t);
	dps_ckpt_close(&d);
}

START_TEST(test_draft_self_head)
{
	struct dps_ckpt ck;

	/* Untied target: the draft's head is the first rows of lm_head. */
	make_preset("gqa", "tiny-gqa", 4, DPS_ST_F32);
	make_draft("gqa", DPS_DRAFT_SELF, 120, 0, DPS_ST_F32, "gqa-draft");
	check_self_head("gqa", "gqa-draft", "lm_head.weight", 120, 300, 48);
	/* Tied target (tiny, in BF16, which the draft keeps exactly): the embedding's rows. */
	make_preset("tied", "tiny", 4, DPS_ST_BF16);
	open_sub(&ck, "tied");
	ck_assert_int_eq(ck.cfg.tie_word_embeddings, 1);
	ck_assert_ptr_null(dps_ckpt_find(&ck, "lm_head.weight", NULL));
	dps_ckpt_close(&ck);
	make_draft("tied", DPS_DRAFT_SELF, 0, 0, DPS_ST_BF16, "tied-draft");
	open_sub(&ck, "tied-draft");
	ck_assert_int_eq(ck.cfg.draft_vocab_size, 256);
	want_tensor(&ck, "lm_head.weight", 256, 64, DPS_ST_BF16);
	want_tensor(&ck, "d2t", 256, 0, DPS_ST_I64);
	dps_ckpt_close(&ck);
	check_self_head("tied", "tied-draft", "model.embed_tokens.weight", 256, 256, 64);
	/* The comparison can fail: a random draft's head is not the target's. */
	make_draft("gqa", DPS_DRAFT_RANDOM, 120, 0, DPS_ST_F32, "gqa-rnd");
	{
		struct dps_ckpt t, d;
		float *th, *dh;

		open_sub(&t, "gqa");
		open_sub(&d, "gqa-rnd");
		th = read_all(&t, "lm_head.weight", 300 * 48);
		dh = read_all(&d, "lm_head.weight", 120 * 48);
		ck_assert(memcmp(th, dh, sizeof(float) * 120 * 48));
		free(th);
		free(dh);
		dps_ckpt_close(&t);
		dps_ckpt_close(&d);
	}
}
END_TEST

/*
 * Drafts of the other families' targets: GPT-OSS (experts in every layer; F32, and MXFP4
 * whose U8 tensors the draft maker must leave alone), Qwen3 (heads x head_dim is not
 * hidden) and Llama 3.1. Each draft is a plain layer of hidden / head_dim heads with every
 * tensor in place; a self-distilled one has the target's head, and for GPT-OSS, with no
 * dense MLP to copy, a zero MLP.
 */
START_TEST(test_draft_families)
{
	static const char *const targets[] = { "tiny-moe", "tiny-gpt-oss", "tiny-qwen3",
					       "tiny-llama3" };

	for (int i = 0; i < 4; i++) {
		const struct dps_model_config *tc = &dps_mkmodel_preset(targets[i])->cfg;
		const uint64_t H = (uint64_t)tc->hidden_size, I = (uint64_t)tc->intermediate_size;
		const uint64_t V = (uint64_t)tc->vocab_size, hd = (uint64_t)tc->head_dim;
		const uint64_t Q = H / hd * hd;

		make_preset("t", targets[i], 2, DPS_ST_F32);
		make_draft("t", DPS_DRAFT_SELF, 0, 0, DPS_ST_F32, "s");
		make_draft("t", DPS_DRAFT_RANDOM, 100, 1, DPS_ST_BF16, "r");
		for (int k = 0; k < 2; k++) {
			const char *sub = k ? "r" : "s";
			const enum dps_st_dtype dt = k ? DPS_ST_BF16 : DPS_ST_F32;
			const uint64_t dv = k ? 100 : V;
			struct dps_model_config c;
			struct dps_ckpt ck;
			char path[128], err[512];

			snprintf(path, sizeof(path), "%s/%s", dir, sub);
			ck_assert_msg(!dps_model_config_load(path, &c, err, sizeof(err)), "%s: %s",
				      targets[i], err);
			ck_assert_msg(c.arch == DPS_ARCH_EAGLE3 && c.eagle3 &&
				      c.num_hidden_layers == 1 && c.hidden_size == (int)H &&
				      c.intermediate_size == (int)I && c.head_dim == (int)hd &&
				      c.num_attention_heads == (int)(H / hd) &&
				      c.num_key_value_heads == (int)(H / hd) &&
				      c.draft_vocab_size == (int)dv, "%s: draft config", targets[i]);
			open_sub(&ck, sub);
			want_tensor(&ck, "fc.weight", H, 3 * H, dt);
			want_tensor(&ck, "midlayer.hidden_norm.weight", H, 0, dt);
			want_tensor(&ck, "midlayer.input_layernorm.weight", H, 0, dt);
			want_tensor(&ck, "midlayer.self_attn.q_proj.weight", Q, 2 * H, dt);
			want_tensor(&ck, "midlayer.self_attn.k_proj.weight", Q, 2 * H, dt);
			want_tensor(&ck, "midlayer.self_attn.v_proj.weight", Q, 2 * H, dt);
			want_tensor(&ck, "midlayer.self_attn.o_proj.weight", H, Q, dt);
			want_tensor(&ck, "midlayer.post_attention_layernorm.weight", H, 0, dt);
			want_tensor(&ck, "midlayer.mlp.gate_proj.weight", I, H, dt);
			want_tensor(&ck, "midlayer.mlp.up_proj.weight", I, H, dt);
			want_tensor(&ck, "midlayer.mlp.down_proj.weight", H, I, dt);
			want_tensor(&ck, "norm.weight", H, 0, dt);
			want_tensor(&ck, "lm_head.weight", dv, H, dt);
			want_tensor(&ck, "d2t", dv, 0, DPS_ST_I64);
			ck_assert_int_eq(ck.n_files, 1);
			ck_assert_int_eq(ck.files[0].n, 14);
			dps_ckpt_close(&ck);
		}
		check_self_head("t", "s", tc->tie_word_embeddings ? "model.embed_tokens.weight"
								  : "lm_head.weight",
				(int)V, (int)V, (int)H);
		{
			struct dps_ckpt ck;
			float *down;
			int zero = 1;

			open_sub(&ck, "s");
			down = read_all(&ck, "midlayer.mlp.down_proj.weight", (size_t)(H * I));
			for (uint64_t e = 0; e < H * I; e++)
				zero &= down[e] == 0;
			ck_assert_msg(zero == !!tc->num_local_experts, "%s: the draft's MLP is %szero",
				      targets[i], zero ? "" : "not ");
			free(down);
			dps_ckpt_close(&ck);
		}
	}
}
END_TEST

START_TEST(test_draft_errors)
{
	char tdir[128], out[128], err[512] = "";

	/* No target directory. */
	snprintf(tdir, sizeof(tdir), "%s/no-such-target", dir);
	snprintf(out, sizeof(out), "%s/out", dir);
	ck_assert_int_lt(dps_mkmodel_draft(tdir, DPS_DRAFT_SELF, 0, 1, DPS_ST_F32, out, err,
					   sizeof(err)), 0);
	ck_assert_msg(strstr(err, "no-such-target"), "%s", err);
	err[0] = 0;
	ck_assert_int_lt(dps_mkmodel_draft(tdir, DPS_DRAFT_RANDOM, 10, 1, DPS_ST_F32, out, err,
					   sizeof(err)), 0);
	ck_assert_msg(strstr(err, "no-such-target/config.json"), "%s", err);
	ck_assert_int_ne(access(out, F_OK), 0); /* nothing written */
	/* A directory with a config but no weights. */
	make_preset("t", "tiny-gqa", 3, DPS_ST_F32);
	snprintf(tdir, sizeof(tdir), "%s/t/model.safetensors", dir);
	ck_assert_int_eq(unlink(tdir), 0);
	snprintf(tdir, sizeof(tdir), "%s/t", dir);
	err[0] = 0;
	ck_assert_int_lt(dps_mkmodel_draft(tdir, DPS_DRAFT_SELF, 0, 1, DPS_ST_F32, out, err,
					   sizeof(err)), 0);
	ck_assert_msg(strstr(err, "safetensors"), "%s", err);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("mkmodel");
	TCase *tc = tcase_create("mkmodel");
	int n_presets = 0;

	while (dps_mkmodel_presets[n_presets].name)
		n_presets++;

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_deterministic);
	tcase_add_test(tc, test_dtypes_same_tokens);
	tcase_add_test(tc, test_params);
	tcase_add_test(tc, test_config_lies);
	tcase_add_loop_test(tc, test_preset_tensors, 0, n_presets);
	tcase_add_test(tc, test_families_deterministic);
	tcase_add_test(tc, test_mxfp4_magnitudes);
	tcase_add_test(tc, test_draft_shapes);
	tcase_add_test(tc, test_draft_deterministic);
	tcase_add_test(tc, test_draft_self_head);
	tcase_add_test(tc, test_draft_families);
	tcase_add_test(tc, test_draft_errors);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
