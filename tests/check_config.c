/* SPDX-License-Identifier: MIT */
/*
 * tests/check_config.c - config.json parsing: the stories260K shape, defaults, a save/load
 * round trip, and every rule refused with a message naming the field.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/model_config.h"
#include "tests/testutil.h"

static const char *stories =
	"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":172,"
	"\"num_hidden_layers\":5,\"num_attention_heads\":8,\"num_key_value_heads\":4,"
	"\"vocab_size\":512,\"rms_norm_eps\":1e-05,\"rope_theta\":10000.0,"
	"\"max_position_embeddings\":512,\"tie_word_embeddings\":true}";

START_TEST(test_stories)
{
	struct dps_model_config c;
	char err[256];

	ck_assert_msg(!dps_model_config_parse(stories, strlen(stories), &c, err, sizeof(err)), "%s",
		      err);
	ck_assert_int_eq(c.hidden_size, 64);
	ck_assert_int_eq(c.intermediate_size, 172);
	ck_assert_int_eq(c.num_hidden_layers, 5);
	ck_assert_int_eq(c.num_attention_heads, 8);
	ck_assert_int_eq(c.num_key_value_heads, 4);
	ck_assert_int_eq(c.head_dim, 8);
	ck_assert_int_eq(c.vocab_size, 512);
	ck_assert(c.rms_norm_eps == 1e-5);
	ck_assert(c.rope_theta == 10000.0);
	ck_assert_int_eq(c.max_position_embeddings, 512);
	ck_assert_int_eq(c.tie_word_embeddings, 1);
}
END_TEST

START_TEST(test_defaults_and_roundtrip)
{
	const char *min = "{\"hidden_size\":8,\"intermediate_size\":16,\"num_hidden_layers\":1,"
			  "\"num_attention_heads\":2,\"vocab_size\":4}";
	struct dps_model_config c, d;
	char err[256], path[64];

	ck_assert(!dps_model_config_parse(min, strlen(min), &c, err, sizeof(err)));
	ck_assert_int_eq(c.num_key_value_heads, 2);
	ck_assert_int_eq(c.head_dim, 4);
	ck_assert(c.rms_norm_eps == 1e-6);
	ck_assert(c.rope_theta == 10000.0);
	ck_assert_int_eq(c.max_position_embeddings, 2048);
	ck_assert_int_eq(c.tie_word_embeddings, 0);
	test_tmpdir_make(path, sizeof(path), "cfg");
	{
		char file[64];

		snprintf(file, sizeof(file), "%s/config.json", path);
		ck_assert_int_eq(dps_model_config_save(&c, file), 0);
		ck_assert_msg(!dps_model_config_load(path, &d, err, sizeof(err)), "%s", err);
		ck_assert(!memcmp(&c, &d, sizeof(c)));
	}
	test_tmpdir_remove(path);
	ck_assert_int_lt(dps_model_config_load("/nonexistent-dir", &d, err, sizeof(err)), 0);
	ck_assert_ptr_nonnull(strstr(err, "/nonexistent-dir/config.json"));
}
END_TEST

static const struct { const char *json, *want; } bad[] = {
	{ "", "not valid JSON" },
	{ "[]", "not a JSON object" },
	{ "{\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
	  "\"vocab_size\":4}", "missing field 'hidden_size'" },
	{ "{\"hidden_size\":\"8\",\"intermediate_size\":8,\"num_hidden_layers\":1,"
	  "\"num_attention_heads\":2,\"vocab_size\":4}", "'hidden_size' must be an integer" },
	{ "{\"hidden_size\":0,\"intermediate_size\":8,\"num_hidden_layers\":1,"
	  "\"num_attention_heads\":2,\"vocab_size\":4}", "'hidden_size' = 0 is outside" },
	{ "{\"hidden_size\":8,\"intermediate_size\":8,\"num_hidden_layers\":1,"
	  "\"num_attention_heads\":3,\"vocab_size\":4}", "not a multiple of num_attention_heads" },
	{ "{\"hidden_size\":8,\"intermediate_size\":8,\"num_hidden_layers\":1,"
	  "\"num_attention_heads\":4,\"num_key_value_heads\":3,\"vocab_size\":4}",
	  "not a multiple of num_key_value_heads" },
	{ "{\"hidden_size\":6,\"intermediate_size\":8,\"num_hidden_layers\":1,"
	  "\"num_attention_heads\":2,\"vocab_size\":4}", "must be even" },
	{ "{\"hidden_size\":8,\"intermediate_size\":8,\"num_hidden_layers\":1,"
	  "\"num_attention_heads\":2,\"vocab_size\":4,\"rms_norm_eps\":-1}", "'rms_norm_eps'" },
	{ "{\"hidden_size\":8,\"intermediate_size\":8,\"num_hidden_layers\":1,"
	  "\"num_attention_heads\":2,\"vocab_size\":4,\"tie_word_embeddings\":1}",
	  "'tie_word_embeddings' must be true or false" },
	{ "{\"hidden_size\":8,\"intermediate_size\":8,\"num_hidden_layers\":1,"
	  "\"num_attention_heads\":2,\"vocab_size\":4,\"eos_token_id\":9}", "below vocab_size" },
	{ "{\"hidden_size\":8,\"hidden_size\":8}", "not valid JSON" },
	{ "{\"hidden_size\":99999999999,\"intermediate_size\":8,\"num_hidden_layers\":1,"
	  "\"num_attention_heads\":2,\"vocab_size\":4}", "outside" },
};

START_TEST(test_bad)
{
	struct dps_model_config c;
	char err[256] = "";

	ck_assert_int_eq(dps_model_config_parse(bad[_i].json, strlen(bad[_i].json), &c, err,
						sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, bad[_i].want), "case %d: '%s' lacks '%s'", _i, err, bad[_i].want);
	ck_assert_msg(!strstr(err, "no such words"), "the checker can fail");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("config");

	tcase_add_test(tc, test_stories);
	tcase_add_test(tc, test_defaults_and_roundtrip);
	tcase_add_loop_test(tc, test_bad, 0, (int)(sizeof(bad) / sizeof(bad[0])));
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
