/* SPDX-License-Identifier: MIT */
/*
 * tests/check_config_save.c - config.json as each family's Hugging Face config class writes
 * it (engine/model/model_config_save.c), on the mkmodel presets of every family: the
 * architecture and model_type, the fields each family has and those it has not (read with
 * jansson, values included: windows, layer_types, rope_scaling, the MXFP4
 * quantization_config); every preset read back by the families' parser as the model it was
 * written from; the shapes no preset shows (windows that are not a suffix, several EOS ids,
 * each RoPE variant, a plain RoPE on GPT-OSS, no end ids; a draft of a target without end
 * ids); and what a family cannot say refused with the rule, writing nothing, while every
 * preset passes.
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dps.h"
#include "tests/testutil.h"
#include "engine/model/mkmodel.h"
#include "engine/model/model_config.h"

static char dir[64];

static void setup(void)
{
	test_tmpdir_make(dir, sizeof(dir), "cfgsave");
}

static void teardown(void)
{
	test_tmpdir_remove(dir);
}

/* A preset's shape with the benchmarks' depth cut to one layer (only the config matters). */
static struct dps_model_config test_shape(int i)
{
	struct dps_model_config c = dps_mkmodel_presets[i].cfg;

	if (!strncmp(dps_mkmodel_presets[i].name, "bench", 5))
		c.num_hidden_layers = 1;
	return c;
}

/* Writes preset's config.json into dir/preset. */
static void save_preset(const char *preset)
{
	char path[160];

	snprintf(path, sizeof(path), "%s/%s", dir, preset);
	ck_assert_int_eq(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/%s/config.json", dir, preset);
	ck_assert_int_eq(dps_model_config_save(&dps_mkmodel_preset(preset)->cfg, path), 0);
}

/* config.json of sub, parsed by jansson. */
static json_t *config_json(const char *sub)
{
	char path[160];
	json_error_t je;
	json_t *j;

	snprintf(path, sizeof(path), "%s/%s/config.json", dir, sub);
	j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	ck_assert_msg(j, "%s: %s", path, je.text);
	return j;
}

/* Each of the space-separated keys is in (present 1) or absent from (0) j. */
static void keys(const json_t *j, const char *what, const char *list, int present)
{
	char buf[512], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", list);
	for (char *k = strtok_r(buf, " ", &save); k; k = strtok_r(NULL, " ", &save))
		ck_assert_msg(!json_object_get(j, k) == !present, "%s: '%s' is %s", what, k,
			      present ? "missing" : "there");
}

static void want_str(const json_t *j, const char *key, const char *v)
{
	const json_t *x = json_object_get(j, key);

	if (json_is_array(x))
		x = json_array_get(x, 0);
	ck_assert_msg(json_is_string(x) && !strcmp(json_string_value(x), v), "'%s' is not %s", key,
		      v);
}

static void want_num(const json_t *j, const char *key, double v)
{
	ck_assert_msg(json_is_number(json_object_get(j, key)) &&
		      json_number_value(json_object_get(j, key)) == v, "'%s' is not %g", key, v);
}

/* Fields no family writes, and what every one does. */
#define NEVER "mlp_only_layers dense_layers qkv_bias o_bias qk_norm attn_sinks mxfp4 swiglu_alpha"
#define ALWAYS "architectures model_type hidden_size intermediate_size num_hidden_layers " \
	"num_attention_heads num_key_value_heads vocab_size rms_norm_eps rope_theta " \
	"max_position_embeddings tie_word_embeddings hidden_act bos_token_id eos_token_id torch_dtype"
#define WINDOW "sliding_window use_sliding_window max_window_layers layer_types"
#define EXPERTS "num_local_experts num_experts_per_tok swiglu_limit quantization_config"

START_TEST(test_config_fields)
{
	static const struct {
		const char *preset, *arch, *type, *present, *absent;
	} fam[] = {
		{ "tiny", "LlamaForCausalLM", "llama", "attention_bias mlp_bias head_dim",
		  WINDOW " " EXPERTS " rope_scaling" },
		{ "tiny-llama3", "LlamaForCausalLM", "llama", "attention_bias mlp_bias rope_scaling",
		  WINDOW " " EXPERTS },
		{ "tiny-mistral", "MistralForCausalLM", "mistral", "sliding_window head_dim",
		  "use_sliding_window max_window_layers layer_types attention_bias mlp_bias "
		  "rope_scaling " EXPERTS },
		{ "tiny-qwen2", "Qwen2ForCausalLM", "qwen2",
		  "use_sliding_window sliding_window max_window_layers",
		  "head_dim attention_bias mlp_bias layer_types rope_scaling " EXPERTS },
		{ "tiny-qwen3", "Qwen3ForCausalLM", "qwen3", "head_dim attention_bias "
		  "use_sliding_window sliding_window max_window_layers",
		  "mlp_bias layer_types rope_scaling " EXPERTS },
		{ "tiny-moe", "GptOssForCausalLM", "gpt_oss", "num_local_experts "
		  "num_experts_per_tok swiglu_limit attention_bias sliding_window layer_types "
		  "rope_scaling head_dim", "quantization_config use_sliding_window "
		  "max_window_layers mlp_bias" },
		{ "tiny-gpt-oss", "GptOssForCausalLM", "gpt_oss", "quantization_config layer_types",
		  "use_sliding_window max_window_layers mlp_bias" },
	};
	json_t *j, *r;

	for (size_t i = 0; i < sizeof(fam) / sizeof(fam[0]); i++) {
		save_preset(fam[i].preset);
		j = config_json(fam[i].preset);
		want_str(j, "architectures", fam[i].arch);
		want_str(j, "model_type", fam[i].type);
		want_str(j, "hidden_act", "silu");
		keys(j, fam[i].preset, ALWAYS, 1);
		keys(j, fam[i].preset, NEVER, 0);
		keys(j, fam[i].preset, fam[i].present, 1);
		keys(j, fam[i].preset, fam[i].absent, 0);
		json_decref(j);
	}
	/* The values of each family's own fields. */
	j = config_json("tiny");
	ck_assert(json_is_false(json_object_get(j, "attention_bias")));
	json_decref(j);
	j = config_json("tiny-llama3");
	r = json_object_get(j, "rope_scaling");
	want_str(r, "rope_type", "llama3");
	want_num(r, "factor", 8);
	want_num(r, "low_freq_factor", 1);
	want_num(r, "high_freq_factor", 4);
	want_num(r, "original_max_position_embeddings", 16);
	ck_assert_int_eq(json_object_size(r), 5);
	ck_assert(json_is_real(json_object_get(r, "factor"))); /* transformers wants a float */
	json_decref(j);
	j = config_json("tiny-mistral");
	want_num(j, "sliding_window", 8);
	json_decref(j);
	j = config_json("tiny-qwen2");
	ck_assert(json_is_true(json_object_get(j, "use_sliding_window")));
	want_num(j, "sliding_window", 8);
	want_num(j, "max_window_layers", 1);
	json_decref(j);
	j = config_json("tiny-qwen3");
	want_num(j, "head_dim", 16);
	want_num(j, "num_attention_heads", 8);
	ck_assert(json_is_false(json_object_get(j, "use_sliding_window")));
	ck_assert(json_is_null(json_object_get(j, "sliding_window")));
	ck_assert(json_is_false(json_object_get(j, "attention_bias")));
	json_decref(j);
	j = config_json("tiny-moe");
	want_num(j, "num_local_experts", 8);
	want_num(j, "num_experts_per_tok", 2);
	want_num(j, "swiglu_limit", 7);
	want_num(j, "sliding_window", 8);
	ck_assert(json_is_true(json_object_get(j, "attention_bias")));
	r = json_object_get(j, "layer_types");
	ck_assert_int_eq(json_array_size(r), 3);
	ck_assert_str_eq(json_string_value(json_array_get(r, 0)), "sliding_attention");
	ck_assert_str_eq(json_string_value(json_array_get(r, 1)), "full_attention");
	ck_assert_str_eq(json_string_value(json_array_get(r, 2)), "sliding_attention");
	r = json_object_get(j, "rope_scaling");
	want_str(r, "rope_type", "yarn");
	want_num(r, "factor", 32);
	want_num(r, "beta_fast", 32);
	want_num(r, "beta_slow", 1);
	want_num(r, "original_max_position_embeddings", 16);
	ck_assert(json_is_false(json_object_get(r, "truncate")));
	ck_assert_int_eq(json_object_size(r), 6);
	json_decref(j);
	j = config_json("tiny-gpt-oss");
	r = json_object_get(j, "quantization_config");
	want_str(r, "quant_method", "mxfp4");
	r = json_object_get(r, "modules_to_not_convert");
	ck_assert_int_eq(json_array_size(r), 4);
	ck_assert_str_eq(json_string_value(json_array_get(r, 0)), "model.layers.*.self_attn");
	ck_assert_str_eq(json_string_value(json_array_get(r, 1)), "model.layers.*.mlp.router");
	ck_assert_str_eq(json_string_value(json_array_get(r, 2)), "model.embed_tokens");
	ck_assert_str_eq(json_string_value(json_array_get(r, 3)), "lm_head");
	json_decref(j);
}
END_TEST

/* The model config.json describes, compared with the one it was written from. */
static void same_model(const char *what, const struct dps_model_config *a,
		       const struct dps_model_config *b)
{
	const struct dps_rope_cfg *x = &a->rope, *y = &b->rope;

	ck_assert_msg(a->arch == b->arch && a->hidden_size == b->hidden_size &&
		      a->intermediate_size == b->intermediate_size &&
		      a->num_hidden_layers == b->num_hidden_layers &&
		      a->num_attention_heads == b->num_attention_heads &&
		      a->num_key_value_heads == b->num_key_value_heads &&
		      a->head_dim == b->head_dim && a->vocab_size == b->vocab_size &&
		      a->rms_norm_eps == b->rms_norm_eps && a->rope_theta == b->rope_theta &&
		      a->max_position_embeddings == b->max_position_embeddings &&
		      a->tie_word_embeddings == b->tie_word_embeddings &&
		      a->bos_token_id == b->bos_token_id && a->eos_token_id == b->eos_token_id,
		      "%s: the shape changed", what);
	ck_assert_msg(a->qkv_bias == b->qkv_bias && a->o_bias == b->o_bias &&
		      a->mlp_bias == b->mlp_bias && a->qk_norm == b->qk_norm &&
		      a->attn_sinks == b->attn_sinks && a->mxfp4 == b->mxfp4,
		      "%s: biases, norms, sinks or MXFP4 changed", what);
	ck_assert_msg(a->num_local_experts == b->num_local_experts &&
		      a->num_experts_per_tok == b->num_experts_per_tok &&
		      a->swiglu_limit == b->swiglu_limit &&
		      (!a->num_local_experts || a->swiglu_alpha == b->swiglu_alpha),
		      "%s: the experts changed", what);
	for (int l = 0; l < a->num_hidden_layers; l++) {
		ck_assert_msg(dps_cfg_layer_window(a, l) == dps_cfg_layer_window(b, l),
			      "%s: layer %d's window changed", what, l);
		ck_assert_msg(dps_cfg_layer_moe(a, l) == dps_cfg_layer_moe(b, l),
			      "%s: layer %d's MLP changed", what, l);
		if (dps_cfg_layer_window(a, l))
			ck_assert_int_eq(a->sliding_window, b->sliding_window);
	}
	ck_assert_msg(x->kind == y->kind && x->factor == y->factor, "%s: the RoPE changed", what);
	if (x->kind == DPS_ROPE_LLAMA3)
		ck_assert(x->low_freq_factor == y->low_freq_factor &&
			  x->high_freq_factor == y->high_freq_factor &&
			  x->original_max_pos == y->original_max_pos);
	if (x->kind == DPS_ROPE_YARN)
		ck_assert(x->original_max_pos == y->original_max_pos &&
			  x->beta_fast == y->beta_fast && x->beta_slow == y->beta_slow &&
			  x->truncate == y->truncate && fabs(y->attention_factor - 1.3465736) < 1e-6);
}

START_TEST(test_config_roundtrip)
{
	/* Every preset as written reads back, through the family's parser, as itself. */
	const struct dps_model_config c = test_shape(_i);
	struct dps_model_config d;
	char path[128], err[512];

	snprintf(path, sizeof(path), "%s/cfg", dir);
	ck_assert_int_eq(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/cfg/config.json", dir);
	ck_assert_int_eq(dps_model_config_save(&c, path), 0);
	snprintf(path, sizeof(path), "%s/cfg", dir);
	ck_assert_msg(!dps_model_config_load(path, &d, err, sizeof(err)), "%s: %s",
		      dps_mkmodel_presets[_i].name, err);
	same_model(dps_mkmodel_presets[_i].name, &c, &d);
}
END_TEST

/* c saved and read back (saving must succeed). */
static struct dps_model_config roundtrip(const struct dps_model_config *c, json_t **j)
{
	struct dps_model_config d;
	char path[128], err[512];

	snprintf(path, sizeof(path), "%s/rt", dir);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/rt/config.json", dir);
	ck_assert_int_eq(dps_model_config_save(c, path), 0);
	snprintf(path, sizeof(path), "%s/rt", dir);
	ck_assert_msg(!dps_model_config_load(path, &d, err, sizeof(err)), "%s", err);
	*j = config_json("rt");
	return d;
}

START_TEST(test_config_shapes)
{
	/* What the presets do not show: windows that are not a suffix, several EOS ids, the
	 * RoPE variants, a plain RoPE on GPT-OSS; a non-default alpha is written, and refused
	 * by the parser (the engine computes 1.702 only) rather than read as another. */
	struct dps_model_config c = dps_mkmodel_preset("tiny-qwen2")->cfg, d;
	json_t *j;

	c.num_hidden_layers = 4;
	c.window_layers[0] = 0x5; /* layers 0 and 2 */
	d = roundtrip(&c, &j);
	keys(j, "qwen2 alternating", "layer_types", 1);
	keys(j, "qwen2 alternating", "max_window_layers", 0);
	json_decref(j);
	same_model("qwen2 alternating", &c, &d);
	c = dps_mkmodel_preset("tiny-qwen3")->cfg;
	c.sliding_window = 4;
	c.window_layers[0] = 0; /* a window but no layer in it */
	d = roundtrip(&c, &j);
	want_num(j, "max_window_layers", 2);
	json_decref(j);
	same_model("qwen3 window on no layer", &c, &d);
	c = dps_mkmodel_preset("tiny")->cfg;
	c.n_eos = 3;
	c.eos_ids[0] = c.eos_token_id = 2;
	c.eos_ids[1] = 7;
	c.eos_ids[2] = 9;
	c.rope = (struct dps_rope_cfg){ .kind = DPS_ROPE_LINEAR, .factor = 2 };
	d = roundtrip(&c, &j);
	ck_assert_int_eq(json_array_size(json_object_get(j, "eos_token_id")), 3);
	json_decref(j);
	ck_assert(d.n_eos == 3 && d.eos_ids[1] == 7 && d.eos_ids[2] == 9);
	same_model("linear", &c, &d);
	c.rope = (struct dps_rope_cfg){ .kind = DPS_ROPE_DYNAMIC, .factor = 3 };
	d = roundtrip(&c, &j);
	json_decref(j);
	same_model("dynamic", &c, &d);
	/* No end id: null for a family whose class has none, refused for Llama's (default 2). */
	c = dps_mkmodel_preset("tiny-qwen2")->cfg;
	c.eos_token_id = -1;
	d = roundtrip(&c, &j);
	ck_assert(json_is_null(json_object_get(j, "eos_token_id")));
	json_decref(j);
	same_model("qwen2 without eos", &c, &d);
	ck_assert_int_eq(d.n_eos, 0);
	c = dps_mkmodel_preset("tiny")->cfg;
	c.eos_token_id = -1;
	{
		char err[256] = "";

		ck_assert_int_eq(dps_model_config_check_save(&c, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, "defaults to 2"), "%s", err);
	}
	c = dps_mkmodel_preset("tiny-moe")->cfg;
	memset(&c.rope, 0, sizeof(c.rope));
	d = roundtrip(&c, &j);
	want_str(json_object_get(j, "rope_scaling"), "rope_type", "default");
	keys(j, "gpt-oss", "swiglu_alpha", 0);
	json_decref(j);
	same_model("gpt-oss default rope", &c, &d);
	ck_assert(d.swiglu_alpha == 1.702);
	{
		char path[128], err[512] = "";

		c.swiglu_alpha = 1.5;
		snprintf(path, sizeof(path), "%s/rt/config.json", dir);
		ck_assert_int_eq(dps_model_config_save(&c, path), 0);
		j = config_json("rt");
		want_num(j, "swiglu_alpha", 1.5);
		json_decref(j);
		snprintf(path, sizeof(path), "%s/rt", dir);
		ck_assert_int_eq(dps_model_config_load(path, &d, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, "swiglu_alpha"), "%s", err);
	}
}
END_TEST

START_TEST(test_config_refused)
{
	/* What a family's config class cannot say: refused with the rule, never another model. */
	static const struct {
		const char *preset;
		int what;
		const char *msg;
	} bad[] = {
		{ "tiny", 0, "attention_bias covers" },   /* q/k/v bias, no o_proj bias */
		{ "tiny", 1, "no sliding window" },
		{ "tiny-mistral", 2, "every layer or none" },
		{ "tiny-qwen2", 3, "no head_dim field" },
		{ "tiny-qwen2", 4, "always has q/k/v biases" },
		{ "tiny-qwen3", 5, "always has q/k norms" },
		{ "tiny-moe", 6, "no dense layers" },
		{ "tiny-moe", 7, "always has attention sinks" },
		{ "tiny", 8, "no experts" },
		{ "tiny-moe", 9, "swiglu_limit must be positive" },
		{ "tiny-llama3", 10, "llama3 needs" },
	};
	char path[128], err[256];

	snprintf(path, sizeof(path), "%s/config.json", dir);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct dps_model_config c = dps_mkmodel_preset(bad[i].preset)->cfg;

		switch (bad[i].what) {
		case 0: c.qkv_bias = 1; break;
		case 1: c.sliding_window = 8; c.window_layers[0] = 1; break;
		case 2: c.window_layers[0] = 1; break;
		case 3: c.head_dim = 8; break;
		case 4: c.qkv_bias = 0; break;
		case 5: c.qk_norm = 0; break;
		case 6: c.dense_layers[0] = 2; break;
		case 7: c.attn_sinks = 0; break;
		case 8: c.num_local_experts = 4; c.num_experts_per_tok = 1; break;
		case 9: c.swiglu_limit = 0; break;
		case 10: c.rope.high_freq_factor = 0.5; break;
		}
		err[0] = 0;
		ck_assert_int_eq(dps_model_config_check_save(&c, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, bad[i].msg), "case %zu: '%s' lacks '%s'", i, err,
			      bad[i].msg);
		ck_assert_int_eq(dps_model_config_save(&c, path), -EINVAL);
		ck_assert_int_ne(access(path, F_OK), 0);
	}
	/* The check can fail: the presets themselves pass it. */
	for (const struct dps_mkmodel_preset *p = dps_mkmodel_presets; p->name; p++)
		ck_assert_msg(!dps_model_config_check_save(&p->cfg, err, sizeof(err)), "%s: %s",
			      p->name, err);
}
END_TEST

START_TEST(test_draft_eos)
{
	/* A target without end ids (GPT-OSS, eos_token_id null): its draft's config says its
	 * class's default (2), which the writer can say, where the target's -1 it cannot. */
	struct dps_model_config c = dps_mkmodel_preset("tiny-moe")->cfg, d;
	char t[128], out[128], err[512];
	json_t *j;

	c.eos_token_id = -1;
	snprintf(t, sizeof(t), "%s/t", dir);
	snprintf(out, sizeof(out), "%s/rt", dir);
	ck_assert_msg(!dps_mkmodel(&c, 1, DPS_ST_F32, t, err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_mkmodel_draft(t, DPS_DRAFT_SELF, 0, 1, DPS_ST_F32, out, err,
					 sizeof(err)), "%s", err);
	ck_assert_msg(!dps_model_config_load(out, &d, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(d.arch, DPS_ARCH_EAGLE3);
	ck_assert_int_eq(d.eos_token_id, 2);
	j = config_json("t");
	ck_assert(json_is_null(json_object_get(j, "eos_token_id")));
	json_decref(j);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("config_save");
	TCase *tc = tcase_create("config_save");
	int n = 0;

	while (dps_mkmodel_presets[n].name)
		n++;
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_config_fields);
	tcase_add_loop_test(tc, test_config_roundtrip, 0, n);
	tcase_add_test(tc, test_config_shapes);
	tcase_add_test(tc, test_config_refused);
	tcase_add_test(tc, test_draft_eos);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
