/* SPDX-License-Identifier: MIT */
/*
 * tests/check_config.c - config.json parsing: the stories260K shape, defaults, a save/load
 * round trip, and every rule refused with a message naming the field. Eagle3 drafts: the
 * architecture, draft_vocab_size and the three fused target layers (top level or in
 * eagle_config) parsed, their rules refused, and an Eagle3 config saved and loaded back.
 * eos_token_id as one id or a list (Llama 3.x), saved and loaded back; generation_config.json's
 * end ids and sampling defaults, and its bad fields named.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/model/model_config.h"
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
	/* A plain model is no draft. */
	ck_assert_int_eq(c.eagle3, 0);
	ck_assert_int_eq(c.draft_vocab_size, 0);
	ck_assert_int_eq(c.n_aux, 0);
}
END_TEST

/* A minimal config with vocab_size 300 and the extra fields in more (",..." or ""). */
static int parse_with(const char *more, struct dps_model_config *c, char *err, size_t errlen)
{
	char json[1024];

	snprintf(json, sizeof(json), "{\"hidden_size\":48,\"intermediate_size\":100,"
		 "\"num_hidden_layers\":1,\"num_attention_heads\":6,\"vocab_size\":300%s}", more);
	return dps_model_config_parse(json, strlen(json), c, err, errlen);
}

START_TEST(test_eagle3)
{
	struct dps_model_config c;
	char err[256] = "";

	/* The full form: architecture, draft vocabulary and the fused layers at the top level. */
	ck_assert_msg(!parse_with(",\"architectures\":[\"LlamaForCausalLMEagle3\"],"
				  "\"draft_vocab_size\":100,"
				  "\"eagle_aux_hidden_state_layer_ids\":[1,5,9]", &c, err,
				  sizeof(err)), "%s", err);
	ck_assert_int_eq(c.eagle3, 1);
	ck_assert_int_eq(c.draft_vocab_size, 100);
	ck_assert_int_eq(c.n_aux, 3);
	ck_assert_int_eq(c.aux_layers[0], 1);
	ck_assert_int_eq(c.aux_layers[1], 5);
	ck_assert_int_eq(c.aux_layers[2], 9); /* target layers: past the draft's one layer */
	ck_assert_int_eq(c.num_hidden_layers, 1);
	ck_assert_int_eq(c.vocab_size, 300);
	/* The layers inside eagle_config (as EAGLE's own checkpoints have them) alone make a
	 * draft; their order is kept, repeats and 0 allowed. */
	ck_assert_msg(!parse_with(",\"eagle_config\":{\"eagle_aux_hidden_state_layer_ids\":"
				  "[30,0,30]}", &c, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(c.eagle3, 1);
	ck_assert_int_eq(c.draft_vocab_size, 0);
	ck_assert_int_eq(c.n_aux, 3);
	ck_assert_int_eq(c.aux_layers[0], 30);
	ck_assert_int_eq(c.aux_layers[1], 0);
	ck_assert_int_eq(c.aux_layers[2], 30);
	/* The top level wins over eagle_config. */
	ck_assert_msg(!parse_with(",\"eagle_aux_hidden_state_layer_ids\":[2,3,4],"
				  "\"eagle_config\":{\"eagle_aux_hidden_state_layer_ids\":[7,8,9]}",
				  &c, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(c.aux_layers[0], 2);
	ck_assert_int_eq(c.aux_layers[2], 4);
	/* A draft_vocab_size alone makes a draft (the default layers: n_aux 0). */
	ck_assert_msg(!parse_with(",\"draft_vocab_size\":300", &c, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(c.eagle3, 1);
	ck_assert_int_eq(c.draft_vocab_size, 300);
	ck_assert_int_eq(c.n_aux, 0);
	/* So does an architecture naming Eagle3, wherever in the list. */
	ck_assert_msg(!parse_with(",\"architectures\":[\"Eagle3LlamaForCausalLM\"]",
				  &c, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(c.eagle3, 1);
	ck_assert_int_eq(c.draft_vocab_size, 0);
	ck_assert_int_eq(c.n_aux, 0);
	/* Not a draft: another architecture, null fields. (An eagle_config without the layers
	 * on a Llama is a field Llama does not read: refused.) */
	ck_assert_msg(!parse_with(",\"architectures\":[\"LlamaForCausalLM\"],"
				  "\"draft_vocab_size\":null,"
				  "\"eagle_aux_hidden_state_layer_ids\":null",
				  &c, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(c.eagle3, 0);
	ck_assert_int_eq(c.draft_vocab_size, 0);
	ck_assert_int_eq(c.n_aux, 0);
}
END_TEST

static const struct { const char *more, *want; } bad_eagle[] = {
	{ ",\"draft_vocab_size\":0", "'draft_vocab_size' = 0 is outside" },
	{ ",\"draft_vocab_size\":-5", "'draft_vocab_size' = -5 is outside" },
	{ ",\"draft_vocab_size\":\"100\"", "'draft_vocab_size' must be an integer" },
	{ ",\"draft_vocab_size\":1.5", "'draft_vocab_size' must be an integer" },
	{ ",\"draft_vocab_size\":301", "draft_vocab_size 301 is larger than vocab_size 300" },
	{ ",\"draft_vocab_size\":99999999999", "'draft_vocab_size' = 99999999999 is outside" },
	{ ",\"eagle_aux_hidden_state_layer_ids\":5",
	  "'eagle_aux_hidden_state_layer_ids' must be a list of three target layer indices" },
	{ ",\"eagle_aux_hidden_state_layer_ids\":{}",
	  "'eagle_aux_hidden_state_layer_ids' must be a list of three" },
	{ ",\"eagle_aux_hidden_state_layer_ids\":[]",
	  "'eagle_aux_hidden_state_layer_ids' must be a list of three" },
	{ ",\"eagle_aux_hidden_state_layer_ids\":[1,2]",
	  "'eagle_aux_hidden_state_layer_ids' must be a list of three" },
	{ ",\"eagle_aux_hidden_state_layer_ids\":[1,2,3,4]",
	  "'eagle_aux_hidden_state_layer_ids' must be a list of three" },
	{ ",\"eagle_aux_hidden_state_layer_ids\":[1,-1,3]",
	  "'eagle_aux_hidden_state_layer_ids' entry 1 is not a layer index" },
	{ ",\"eagle_aux_hidden_state_layer_ids\":[\"1\",2,3]",
	  "'eagle_aux_hidden_state_layer_ids' entry 0 is not a layer index" },
	{ ",\"eagle_aux_hidden_state_layer_ids\":[1,2,3.0]",
	  "'eagle_aux_hidden_state_layer_ids' entry 2 is not a layer index" },
	{ ",\"eagle_aux_hidden_state_layer_ids\":[1,2,null]",
	  "'eagle_aux_hidden_state_layer_ids' entry 2 is not a layer index" },
	{ ",\"eagle_aux_hidden_state_layer_ids\":[1,4096,3]",
	  "'eagle_aux_hidden_state_layer_ids' entry 1 is not a layer index" },
	{ ",\"eagle_config\":{\"eagle_aux_hidden_state_layer_ids\":[1,2]}",
	  "'eagle_aux_hidden_state_layer_ids' must be a list of three" },
	{ ",\"eagle_config\":{\"eagle_aux_hidden_state_layer_ids\":[0,1,-2]}",
	  "'eagle_aux_hidden_state_layer_ids' entry 2 is not a layer index" },
};

START_TEST(test_eagle3_bad)
{
	struct dps_model_config c;
	char err[256] = "";

	ck_assert_int_eq(parse_with(bad_eagle[_i].more, &c, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, bad_eagle[_i].want), "case %d: '%s' lacks '%s'", _i, err,
		      bad_eagle[_i].want);
	ck_assert_msg(!strncmp(err, "config.json: ", 13), "case %d: '%s'", _i, err);
}
END_TEST

/* Saves c into a fresh directory and loads it back into d; returns the file's text in txt. */
static void save_load(const struct dps_model_config *c, struct dps_model_config *d, char *txt,
		      size_t len)
{
	char dir[64], file[96], err[256];
	size_t n;
	FILE *f;

	test_tmpdir_make(dir, sizeof(dir), "cfg");
	snprintf(file, sizeof(file), "%s/config.json", dir);
	ck_assert_int_eq(dps_model_config_save(c, file), 0);
	ck_assert_msg(!dps_model_config_load(dir, d, err, sizeof(err)), "%s", err);
	f = fopen(file, "r");
	ck_assert_ptr_nonnull(f);
	n = fread(txt, 1, len - 1, f);
	txt[n] = 0;
	fclose(f);
	test_tmpdir_remove(dir);
}

START_TEST(test_eagle3_roundtrip)
{
	struct dps_model_config c, d;
	char err[256] = "", txt[4096];

	/* With fused layers: everything comes back as it was. */
	ck_assert_msg(!parse_with(",\"architectures\":[\"LlamaForCausalLMEagle3\"],"
				  "\"draft_vocab_size\":100,\"num_key_value_heads\":3,"
				  "\"eagle_config\":{\"eagle_aux_hidden_state_layer_ids\":[2,17,29]}",
				  &c, err, sizeof(err)), "%s", err);
	save_load(&c, &d, txt, sizeof(txt));
	ck_assert(!memcmp(&c, &d, sizeof(c)));
	ck_assert_int_eq(d.eagle3, 1);
	ck_assert_int_eq(d.draft_vocab_size, 100);
	ck_assert_int_eq(d.n_aux, 3);
	ck_assert_int_eq(d.aux_layers[1], 17);
	ck_assert_msg(strstr(txt, "LlamaForCausalLMEagle3"), "%s", txt);
	ck_assert_msg(strstr(txt, "eagle_aux_hidden_state_layer_ids"), "%s", txt);
	/* Without them (the default layers) and without a draft vocabulary: still a draft, of
	 * the whole vocabulary. */
	ck_assert_msg(!parse_with(",\"architectures\":[\"LlamaForCausalLMEagle3\"]", &c, err,
				  sizeof(err)), "%s", err);
	save_load(&c, &d, txt, sizeof(txt));
	ck_assert_int_eq(d.eagle3, 1);
	ck_assert_int_eq(d.n_aux, 0);
	ck_assert_int_eq(d.draft_vocab_size, 300);
	d.draft_vocab_size = 0;
	ck_assert(!memcmp(&c, &d, sizeof(c)));
	/* A plain model's file names no draft field: the comparison above can fail. */
	ck_assert_msg(!parse_with("", &c, err, sizeof(err)), "%s", err);
	save_load(&c, &d, txt, sizeof(txt));
	ck_assert_int_eq(d.eagle3, 0);
	ck_assert_ptr_null(strstr(txt, "draft_vocab_size"));
	ck_assert_ptr_null(strstr(txt, "eagle"));
	ck_assert_ptr_null(strstr(txt, "Eagle3"));
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
		char file[96];

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

START_TEST(test_eos_lists)
{
	char dir[64], path[128], err[256], *buf;
	struct dps_model_config c, back;
	struct dps_gen_config g;
	const char *tail = ",\"eos_token_id\":[128001,128008,128009],\"bos_token_id\":128000}";
	size_t n = strlen(stories);
	FILE *f;

	buf = malloc(n + strlen(tail) + 1);
	ck_assert_ptr_nonnull(buf);
	memcpy(buf, stories, n - 1);
	strcpy(buf + n - 1, tail);
	/* 512 tokens cannot hold these ids: refused */
	ck_assert_int_eq(dps_model_config_parse(buf, strlen(buf), &c, err, sizeof(err)), -EINVAL);
	free(buf);
	buf = strdup("{\"hidden_size\":64,\"intermediate_size\":172,\"num_hidden_layers\":1,"
		     "\"num_attention_heads\":8,\"vocab_size\":128256,"
		     "\"eos_token_id\":[128001,128008,128009],\"bos_token_id\":128000}");
	ck_assert_msg(!dps_model_config_parse(buf, strlen(buf), &c, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(c.n_eos, 3);
	ck_assert_int_eq(c.eos_token_id, 128001);
	ck_assert_int_eq(c.eos_ids[2], 128009);
	free(buf);
	test_tmpdir_make(dir, sizeof(dir), "eos");
	snprintf(path, sizeof(path), "%s/config.json", dir);
	ck_assert_int_eq(dps_model_config_save(&c, path), 0);
	ck_assert_msg(!dps_model_config_load(dir, &back, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(back.n_eos, 3);
	ck_assert_int_eq(back.eos_ids[1], 128008);
	/* No generation_config.json: nothing set. */
	ck_assert_int_eq(dps_gen_config_load(dir, &g, err, sizeof(err)), 0);
	ck_assert(!g.n_eos && !g.has_temperature && !g.has_top_p && !g.has_top_k);
	snprintf(path, sizeof(path), "%s/generation_config.json", dir);
	f = fopen(path, "w");
	fputs("{\"eos_token_id\": [1, 106], \"temperature\": 0.6, \"top_p\": 0.9, \"top_k\": 20, "
	      "\"do_sample\": true}", f);
	fclose(f);
	ck_assert_msg(!dps_gen_config_load(dir, &g, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(g.n_eos, 2);
	ck_assert_int_eq(g.eos_ids[1], 106);
	ck_assert(g.has_temperature && g.temperature == 0.6 && g.top_p == 0.9 && g.top_k == 20);
	f = fopen(path, "w");
	fputs("{\"top_p\": 2}", f);
	fclose(f);
	ck_assert_int_eq(dps_gen_config_load(dir, &g, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "top_p"), "%s", err);
	f = fopen(path, "w");
	fputs("{\"eos_token_id\": \"x\"}", f);
	fclose(f);
	ck_assert_int_eq(dps_gen_config_load(dir, &g, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "eos_token_id"), "%s", err);
	test_tmpdir_remove(dir);
}
END_TEST

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
	tcase_add_test(tc, test_eos_lists);
	tcase_add_test(tc, test_defaults_and_roundtrip);
	tcase_add_loop_test(tc, test_bad, 0, (int)(sizeof(bad) / sizeof(bad[0])));
	tcase_add_test(tc, test_eagle3);
	tcase_add_loop_test(tc, test_eagle3_bad, 0, (int)(sizeof(bad_eagle) / sizeof(bad_eagle[0])));
	tcase_add_test(tc, test_eagle3_roundtrip);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
