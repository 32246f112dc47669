/* SPDX-License-Identifier: MIT */
/*
 * tests/check_mkmodel.c - seeded random models: the same seed gives the same bytes, another
 * seed other bytes; the shape on disk is the preset's; and one model written as F32, BF16
 * and F16 gives the same greedy tokens through the reference decoder. Eagle3 drafts of a
 * target (random and self-distilled): a config that loads as a draft of the asked vocabulary,
 * every tensor of the right shape and dtype (d2t I64), a random draft's ids a strictly
 * increasing subset of the target's, a self-distilled draft's LM head the target's (or its
 * embedding when tied), the same seed the same bytes, and a missing target refused.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
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

/* ---- Eagle3 drafts ---------------------------------------------------------------------- */

static void make_preset(const char *sub, const char *preset, uint64_t seed, enum dps_st_dtype dt)
{
	char out[128], err[256];

	snprintf(out, sizeof(out), "%s/%s", dir, sub);
	ck_assert_msg(!dps_mkmodel(&dps_mkmodel_preset(preset)->cfg, seed, dt, out, err,
				   sizeof(err)), "%s", err);
}

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

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_deterministic);
	tcase_add_test(tc, test_dtypes_same_tokens);
	tcase_add_test(tc, test_params);
	tcase_add_test(tc, test_config_lies);
	tcase_add_test(tc, test_draft_shapes);
	tcase_add_test(tc, test_draft_deterministic);
	tcase_add_test(tc, test_draft_self_head);
	tcase_add_test(tc, test_draft_errors);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
