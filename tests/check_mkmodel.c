/* SPDX-License-Identifier: MIT */
/*
 * tests/check_mkmodel.c - seeded random models: the same seed gives the same bytes, another
 * seed other bytes; the shape on disk is the preset's; and one model written as F32, BF16
 * and F16 gives the same greedy tokens through the reference decoder.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dps.h"
#include "tests/testutil.h"
#include "engine/mkmodel.h"
#include "engine/model.h"
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
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
