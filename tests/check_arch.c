/* SPDX-License-Identifier: MIT */
/*
 * tests/check_arch.c - the families of config.json (engine/model/model_arch.c): each
 * architecture selected by name with its config class's defaults; an unsupported architecture
 * and every unread field refused by name; biases, q/k norms, sinks and window layers set as
 * Hugging Face's config classes set them (Mistral, Qwen2's use_sliding_window and
 * max_window_layers, layer_types, GPT-OSS's alternating default); rope_scaling parsed and
 * refused; and the RoPE frequencies of llama3, yarn and linear against values computed with
 * Hugging Face's formulas in numpy (written into the test, so the C code is not its own
 * oracle), with one case that shows a wrong parameter is caught.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/model_config.h"

/* A config of family arch ("" for none) with 4 layers and the extra fields in more. */
static int parse_arch(const char *arch, const char *more, struct dps_model_config *c, char *err,
		      size_t errlen)
{
	char json[2048];

	snprintf(json, sizeof(json), "{%s%s%s\"hidden_size\":64,\"intermediate_size\":128,"
		 "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
		 "\"vocab_size\":256%s}", *arch ? "\"architectures\":[\"" : "", arch,
		 *arch ? "\"]," : "", more);
	return dps_model_config_parse(json, strlen(json), c, err, errlen);
}

static void expect_ok(const char *arch, const char *more, struct dps_model_config *c)
{
	char err[512] = "";

	ck_assert_msg(!parse_arch(arch, more, c, err, sizeof(err)), "%s %s: %s", arch, more, err);
}

static void expect_refused(const char *arch, const char *more, const char *want)
{
	struct dps_model_config c;
	char err[512] = "";

	ck_assert_msg(parse_arch(arch, more, &c, err, sizeof(err)) == -EINVAL,
		      "%s %s: accepted", arch, more);
	ck_assert_msg(strstr(err, want), "%s %s: '%s' does not say '%s'", arch, more, err, want);
}

static int window(const struct dps_model_config *c, int l)
{
	return dps_cfg_layer_window(c, l);
}

START_TEST(test_families)
{
	struct dps_model_config c;

	expect_ok("LlamaForCausalLM", "", &c);
	ck_assert_int_eq(c.arch, DPS_ARCH_LLAMA);
	ck_assert(!c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm && !c.attn_sinks);
	ck_assert_int_eq(c.sliding_window, 0);
	ck_assert_int_eq(c.max_position_embeddings, 2048);
	ck_assert(c.rms_norm_eps == 1e-6);
	expect_ok("LlamaForCausalLM", ",\"attention_bias\":true,\"mlp_bias\":true", &c);
	ck_assert(c.qkv_bias && c.o_bias && c.mlp_bias);
	/* Neither name: read as Llama; model_type alone selects too. */
	expect_ok("", "", &c);
	ck_assert_int_eq(c.arch, DPS_ARCH_LLAMA);
	expect_ok("", ",\"model_type\":\"qwen3\"", &c);
	ck_assert_int_eq(c.arch, DPS_ARCH_QWEN3);

	/* Mistral: sliding_window (its class's default 4096) on every layer; null: none. */
	expect_ok("MistralForCausalLM", ",\"sliding_window\":8", &c);
	ck_assert_int_eq(c.arch, DPS_ARCH_MISTRAL);
	ck_assert_int_eq(c.sliding_window, 8);
	for (int l = 0; l < 4; l++)
		ck_assert(window(&c, l));
	expect_ok("MistralForCausalLM", ",\"sliding_window\":null", &c);
	ck_assert(!window(&c, 0));
	expect_ok("MistralForCausalLM", "", &c);
	ck_assert_int_eq(c.sliding_window, 4096);

	/* Qwen2: q/k/v biases always, no o bias; windows only with use_sliding_window, on the
	 * layers from max_window_layers. */
	expect_ok("Qwen2ForCausalLM", ",\"sliding_window\":16,\"max_window_layers\":2", &c);
	ck_assert(c.qkv_bias && !c.o_bias);
	ck_assert(!window(&c, 3));
	expect_ok("Qwen2ForCausalLM", ",\"use_sliding_window\":true,\"sliding_window\":16,"
		  "\"max_window_layers\":2", &c);
	ck_assert(!window(&c, 0) && !window(&c, 1) && window(&c, 2) && window(&c, 3));
	ck_assert_int_eq(c.sliding_window, 16);
	expect_ok("Qwen2ForCausalLM", ",\"use_sliding_window\":true,\"sliding_window\":16,"
		  "\"layer_types\":[\"sliding_attention\",\"full_attention\","
		  "\"sliding_attention\",\"full_attention\"]", &c);
	ck_assert(window(&c, 0) && !window(&c, 1) && window(&c, 2) && !window(&c, 3));
	/* The Qwen2 class defaults: 32 KV heads when absent. */
	{
		const char *j = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,"
				"\"intermediate_size\":128,\"num_hidden_layers\":2,"
				"\"num_attention_heads\":32,\"vocab_size\":256}";
		char err[256];

		ck_assert_msg(!dps_model_config_parse(j, strlen(j), &c, err, sizeof(err)), "%s", err);
		ck_assert_int_eq(c.num_key_value_heads, 32);
		ck_assert_int_eq(c.max_position_embeddings, 32768);
	}

	/* Qwen3: q/k norms; head_dim 128 by default; attention_bias adds all four biases. */
	expect_ok("Qwen3ForCausalLM", "", &c);
	ck_assert(c.qk_norm && !c.qkv_bias);
	ck_assert_int_eq(c.head_dim, 128);
	expect_ok("Qwen3ForCausalLM", ",\"head_dim\":16,\"attention_bias\":true", &c);
	ck_assert(c.qkv_bias && c.o_bias);
	ck_assert_int_eq(c.head_dim, 16);

	/* GPT-OSS: sinks, biases, even layers sliding (128), yarn, clamped SwiGLU 7. */
	expect_ok("GptOssForCausalLM", ",\"num_local_experts\":8,\"num_experts_per_tok\":2", &c);
	ck_assert(c.attn_sinks && c.qkv_bias && c.o_bias && !c.mxfp4);
	ck_assert_int_eq(c.sliding_window, 128);
	ck_assert(window(&c, 0) && !window(&c, 1) && window(&c, 2) && !window(&c, 3));
	ck_assert_int_eq(c.rope.kind, DPS_ROPE_YARN);
	ck_assert_int_eq(c.rope.original_max_pos, 4096);
	ck_assert(c.swiglu_limit == 7.0 && c.rms_norm_eps == 1e-5 && c.rope_theta == 150000.0);
	ck_assert_int_eq(c.head_dim, 64);
	expect_ok("GptOssForCausalLM", ",\"num_local_experts\":8,\"num_experts_per_tok\":2,"
		  "\"experts_per_token\":2,\"initial_context_length\":4096,"
		  "\"quantization_config\":{\"quant_method\":\"mxfp4\",\"modules_to_not_convert\":"
		  "[\"lm_head\"]}", &c);
	ck_assert(c.mxfp4 && !c.int8);

	/* dpshard_int8 (dpshard quantize), in any family; GPT-OSS's experts may stay MXFP4. */
	expect_ok("Qwen2ForCausalLM", ",\"quantization_config\":{\"quant_method\":"
		  "\"dpshard_int8\",\"block_size\":32,\"scale_dtype\":\"float16\"}", &c);
	ck_assert(c.int8 && !c.mxfp4);
	expect_ok("GptOssForCausalLM", ",\"num_local_experts\":8,\"quantization_config\":"
		  "{\"quant_method\":\"dpshard_int8\",\"mxfp4_experts\":true}", &c);
	ck_assert(c.int8 && c.mxfp4);
}
END_TEST

START_TEST(test_refusals)
{
	/* An architecture dpshard does not compute, with the list of those it does. */
	expect_refused("GemmaForCausalLM", "", "architecture 'GemmaForCausalLM' is not supported");
	expect_refused("Qwen3MoeForCausalLM", "", "dpshard computes LlamaForCausalLM");
	expect_refused("", ",\"model_type\":\"phi3\"", "model_type 'phi3' is not supported");
	expect_refused("LlamaForCausalLM", ",\"model_type\":\"qwen2\"", "does not match");
	/* A field the family does not read: named, never ignored. */
	expect_refused("LlamaForCausalLM", ",\"sliding_window\":8",
		       "field 'sliding_window' is not read by dpshard for LlamaForCausalLM");
	expect_refused("MistralForCausalLM", ",\"attention_bias\":true", "'attention_bias'");
	expect_refused("Qwen2ForCausalLM", ",\"use_mrope\":false", "'use_mrope'");
	expect_refused("LlamaForCausalLM", ",\"num_local_experts\":4", "'num_local_experts'");
	expect_refused("LlamaForCausalLM", ",\"partial_rotary_factor\":0.5",
		       "'partial_rotary_factor'");
	expect_refused("GptOssForCausalLM", ",\"num_local_experts\":8,\"mlp_only_layers\":[0]",
		       "'mlp_only_layers'");
	expect_refused("LlamaForCausalLM", ",\"hidden_act\":\"gelu\"", "hidden_act 'gelu'");
	/* rope_scaling: unknown types and keys, missing parameters. */
	expect_refused("LlamaForCausalLM", ",\"rope_scaling\":{\"rope_type\":\"longrope\"}",
		       "rope_type 'longrope' is not supported");
	expect_refused("LlamaForCausalLM", ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2,"
		       "\"finetuned\":true}", "'rope_scaling.finetuned' is not read");
	expect_refused("LlamaForCausalLM", ",\"rope_scaling\":{\"rope_type\":\"llama3\","
		       "\"factor\":8}", "llama3 needs");
	expect_refused("LlamaForCausalLM", ",\"rope_scaling\":{\"rope_type\":\"linear\"}",
		       "'rope_scaling.factor' is missing");
	expect_refused("LlamaForCausalLM", ",\"rope_scaling\":{\"factor\":2}", "no rope_type");
	/* windows and experts */
	expect_refused("Qwen2ForCausalLM", ",\"layer_types\":[\"sliding_attention\","
		       "\"full_attention\",\"full_attention\",\"full_attention\"]",
		       "sliding_attention but use_sliding_window is false");
	expect_refused("Qwen2ForCausalLM", ",\"layer_types\":[\"full_attention\"]",
		       "'layer_types' must list one type for each of the 4 layers");
	expect_refused("GptOssForCausalLM", ",\"num_local_experts\":8,\"layer_types\":"
		       "[\"chunked_attention\",\"full_attention\",\"full_attention\","
		       "\"full_attention\"]", "'chunked_attention' is not supported");
	expect_refused("GptOssForCausalLM", ",\"num_local_experts\":8,\"quantization_config\":"
		       "{\"quant_method\":\"fp8\"}", "quant_method 'fp8' is not supported");
	expect_refused("LlamaForCausalLM", ",\"quantization_config\":{\"quant_method\":\"mxfp4\"}",
		       "quant_method 'mxfp4' is not supported");
	expect_refused("LlamaForCausalLM", ",\"quantization_config\":{\"quant_method\":\"awq\","
		       "\"bits\":4}", "quant_method 'awq' is not supported");
	expect_refused("LlamaForCausalLM", ",\"quantization_config\":{\"quant_method\":"
		       "\"dpshard_int8\",\"group_size\":64}", "'quantization_config.group_size'");
	expect_refused("LlamaForCausalLM", ",\"quantization_config\":{\"quant_method\":"
		       "\"dpshard_int8\",\"block_size\":64}", "block_size must be 32");
	expect_refused("LlamaForCausalLM", ",\"quantization_config\":{\"quant_method\":"
		       "\"dpshard_int8\",\"mxfp4_experts\":true}", "'quantization_config.mxfp4_experts'");
	expect_refused("GptOssForCausalLM", ",\"num_local_experts\":8,\"num_experts_per_tok\":2,"
		       "\"experts_per_token\":4", "disagree");
	expect_refused("GptOssForCausalLM", "", "missing field 'num_local_experts'");
	expect_refused("GptOssForCausalLM", ",\"num_local_experts\":8,\"swiglu_alpha\":1.5",
		       "swiglu_alpha");
	/* HF's eager experts clamp at 7 whatever the file says; its MXFP4 kernel reads it. */
	expect_refused("GptOssForCausalLM", ",\"num_local_experts\":8,\"swiglu_limit\":2.0",
		       "swiglu_limit 2 is not supported");
	/* A null rope_scaling: transformers 4.x computes plain RoPE, the class default is YaRN. */
	expect_refused("GptOssForCausalLM", ",\"num_local_experts\":8,\"rope_scaling\":null",
		       "null rope_scaling");
	expect_refused("GptOssForCausalLM", ",\"num_local_experts\":8,\"rope_parameters\":null",
		       "null rope_scaling");
}
END_TEST

/* The frequencies of c against want[] at indices at[] (relative 1e-6). */
static int freqs_match(const struct dps_model_config *c, const int *at, const double *want, int n,
		       float attn, char *why, size_t len)
{
	float f[256], a;

	dps_cfg_rope_freqs(c, f, &a);
	for (int i = 0; i < n; i++)
		if (fabs(f[at[i]] - want[i]) > 1e-6 * fabs(want[i])) {
			snprintf(why, len, "inv_freq[%d] = %.9g, want %.9g", at[i], f[at[i]], want[i]);
			return 0;
		}
	if (fabsf(a - attn) > 1e-6f) {
		snprintf(why, len, "attention factor %g, want %g", a, attn);
		return 0;
	}
	return 1;
}

START_TEST(test_rope_freqs)
{
	/* Expected values: Hugging Face's formulas in numpy (float32 base frequencies). */
	static const int at3[] = { 0, 20, 40, 45, 63 };
	static const double llama3[] = { 1.0, 0.016560440883040428, 3.428102354519069e-05,
					 1.2297638932068367e-05, 3.068925877869333e-07 };
	static const int aty[] = { 0, 5, 10, 20, 31 };
	static const double yarn[] = { 1.0, 0.15532298386096954, 0.019335001707077026,
				       1.818833698052913e-05, 3.023511396804679e-07 };
	static const int atl[] = { 0, 3, 7 };
	static const double linear[] = { 0.25, 0.007905694656074047, 7.905694656074047e-05 };
	struct dps_model_config c;
	char why[128];
	const char *l31 = ",\"head_dim\":128,\"rope_theta\":500000.0,\"rope_scaling\":{"
			  "\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
			  "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}";

	expect_ok("LlamaForCausalLM", l31, &c);
	ck_assert_msg(freqs_match(&c, at3, llama3, 5, 1.0f, why, sizeof(why)), "llama3: %s", why);
	/* GPT-OSS's published rope_scaling (truncate false). */
	expect_ok("GptOssForCausalLM", ",\"num_local_experts\":4,\"rope_scaling\":{"
		  "\"rope_type\":\"yarn\",\"factor\":32.0,\"beta_fast\":32.0,\"beta_slow\":1.0,"
		  "\"original_max_position_embeddings\":4096,\"truncate\":false}", &c);
	ck_assert_msg(freqs_match(&c, aty, yarn, 5, 1.3465735902799727f, why, sizeof(why)),
		      "yarn: %s", why);
	/* Its default when rope_scaling is absent is the same. */
	expect_ok("GptOssForCausalLM", ",\"num_local_experts\":4", &c);
	ck_assert_msg(freqs_match(&c, aty, yarn, 5, 1.3465735902799727f, why, sizeof(why)),
		      "yarn default: %s", why);
	/* transformers 5's rope_parameters carries rope_theta as well. */
	expect_ok("LlamaForCausalLM", ",\"head_dim\":16,\"rope_parameters\":{\"rope_type\":"
		  "\"linear\",\"factor\":4.0,\"rope_theta\":10000.0}", &c);
	ck_assert_msg(freqs_match(&c, atl, linear, 3, 1.0f, why, sizeof(why)), "linear: %s", why);
	/* The check can fail: a different factor gives other frequencies. */
	expect_ok("LlamaForCausalLM", ",\"head_dim\":16,\"rope_scaling\":{\"rope_type\":"
		  "\"linear\",\"factor\":4.5}", &c);
	ck_assert(!freqs_match(&c, atl, linear, 3, 1.0f, why, sizeof(why)));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("arch");
	TCase *tc = tcase_create("arch");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_families);
	tcase_add_test(tc, test_refusals);
	tcase_add_test(tc, test_rope_freqs);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
