/* SPDX-License-Identifier: MIT */
/*
 * engine/model/model_config_save.c - writing a dps_model_config as config.json, the way the
 * Hugging Face config class of its family (c->arch) writes one: the class's architecture and
 * model_type and only the fields that class has, so that transformers and dpshard's own
 * parser (model_arch.c) read back the model that was described. Called by mkmodel (synthetic
 * models and drafts), convert, and the tests; a few hundred bytes per call.
 *
 * What a family's class cannot say is refused rather than written as something else
 * (dps_model_config_check_save): a Llama with a q/k/v bias but none on o_proj, a Mistral
 * whose window covers only some layers, a GPT-OSS layer without experts, ...
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/model_config.h"

/* GPT-OSS's sigmoid gain when swiglu_alpha is absent (GptOssConfig). */
#define GPT_OSS_ALPHA 1.702

static int is_eagle3(const struct dps_model_config *c)
{
	return c->arch == DPS_ARCH_EAGLE3 || c->eagle3;
}

/* The windowed layers: none (0), every one (1), a suffix from *from (2), or another set (3). */
static int window_shape(const struct dps_model_config *c, int *from)
{
	const int L = c->num_hidden_layers;
	int first = L, n = 0;

	for (int l = L - 1; l >= 0; l--)
		if (dps_cfg_layer_window(c, l)) {
			first = l;
			n++;
		}
	*from = first;
	if (!n)
		return 0;
	if (n == L)
		return 1;
	return first + n == L ? 2 : 3;
}

static int refuse(char *err, size_t errlen, const char *fmt, const char *family)
{
	snprintf(err, errlen, fmt, family);
	return -EINVAL;
}

static int check_rope(const struct dps_model_config *c, char *err, size_t errlen)
{
	const struct dps_rope_cfg *r = &c->rope;

	switch (r->kind) {
	case DPS_ROPE_DEFAULT:
	case DPS_ROPE_YARN: /* a missing factor is the ratio of the contexts (transformers 5) */
		return 0;
	case DPS_ROPE_LINEAR:
	case DPS_ROPE_DYNAMIC:
		if (r->factor > 0)
			return 0;
		break;
	case DPS_ROPE_LLAMA3:
		if (r->factor > 0 && r->original_max_pos > 0 && r->low_freq_factor > 0 &&
		    r->high_freq_factor > r->low_freq_factor)
			return 0;
		snprintf(err, errlen, "rope_scaling llama3 needs factor, original_max_position_"
			 "embeddings and 0 < low_freq_factor < high_freq_factor");
		return -EINVAL;
	default:
		snprintf(err, errlen, "rope kind %d is not one config.json can name", (int)r->kind);
		return -EINVAL;
	}
	snprintf(err, errlen, "rope_scaling needs a positive factor");
	return -EINVAL;
}

int dps_model_config_check_save(const struct dps_model_config *c, char *err, size_t errlen)
{
	const char *fam = (unsigned)c->arch < DPS_ARCH_COUNT ? dps_arch_name(c->arch) : NULL;
	const int attn_bias = c->qkv_bias || c->o_bias;
	int from, win;

	if (!fam) {
		snprintf(err, errlen, "architecture %d is not a family dpshard knows", (int)c->arch);
		return -EINVAL;
	}
	if (c->num_hidden_layers < 1 || c->num_hidden_layers > DPS_CFG_MAX_LAYERS) {
		snprintf(err, errlen, "num_hidden_layers %d is outside [1, %d]",
			 c->num_hidden_layers, DPS_CFG_MAX_LAYERS);
		return -EINVAL;
	}
	if (check_rope(c, err, errlen))
		return -EINVAL;
	/* No end id is said with null, which Llama's class reads as its default, 2. */
	if (!c->n_eos && c->eos_token_id < 0 &&
	    (is_eagle3(c) || c->arch == DPS_ARCH_LLAMA || c->arch == DPS_ARCH_MISTRAL))
		return refuse(err, errlen, "%s's eos_token_id defaults to 2: a model without one "
			      "cannot be written", is_eagle3(c) ? dps_arch_name(DPS_ARCH_EAGLE3) : fam);
	win = window_shape(c, &from);
	if (is_eagle3(c)) {
		fam = dps_arch_name(DPS_ARCH_EAGLE3);
		if (attn_bias || c->mlp_bias || c->qk_norm || c->attn_sinks || win ||
		    c->num_local_experts || c->mxfp4)
			return refuse(err, errlen, "%s: a draft here is a plain Llama layer (no "
				      "biases, q/k norms, sinks, windows or experts)", fam);
		return 0;
	}
	if (c->arch != DPS_ARCH_GPT_OSS && (c->num_local_experts || c->attn_sinks || c->mxfp4))
		return refuse(err, errlen, "%s has no experts, attention sinks or MXFP4 weights "
			      "(GptOssForCausalLM has)", fam);
	if ((c->arch == DPS_ARCH_QWEN3) != !!c->qk_norm)
		return refuse(err, errlen, c->qk_norm ? "%s has no q/k norms (Qwen3ForCausalLM has)"
						      : "%s always has q/k norms (qk_norm)", fam);
	if (c->mlp_bias && c->arch != DPS_ARCH_LLAMA)
		return refuse(err, errlen, "%s has no MLP biases (mlp_bias is Llama's)", fam);
	switch (c->arch) {
	case DPS_ARCH_LLAMA:
	case DPS_ARCH_QWEN3:
	case DPS_ARCH_GPT_OSS:
		if (c->qkv_bias != c->o_bias)
			return refuse(err, errlen, "%s: attention_bias covers q/k/v_proj and o_proj "
				      "together (qkv_bias and o_bias must agree)", fam);
		break;
	case DPS_ARCH_MISTRAL:
		if (attn_bias)
			return refuse(err, errlen, "%s has no attention biases", fam);
		break;
	case DPS_ARCH_QWEN2:
		if (!c->qkv_bias || c->o_bias)
			return refuse(err, errlen, "%s always has q/k/v biases and none on o_proj",
				      fam);
		if (c->num_attention_heads < 1 ||
		    (long long)c->head_dim * c->num_attention_heads != c->hidden_size)
			return refuse(err, errlen, "%s has no head_dim field: head_dim must be "
				      "hidden_size / num_attention_heads", fam);
		break;
	default:
		break;
	}
	if (c->arch == DPS_ARCH_LLAMA && win)
		return refuse(err, errlen, "%s has no sliding window", fam);
	if (c->arch == DPS_ARCH_MISTRAL && win && win != 1)
		return refuse(err, errlen, "%s's sliding window covers every layer or none", fam);
	if (c->arch == DPS_ARCH_GPT_OSS) {
		if (c->num_local_experts < 1)
			return refuse(err, errlen, "%s has experts in every layer: num_local_experts "
				      "must be at least 1", fam);
		if (c->num_local_experts > DPS_CFG_MAX_EXPERTS ||
		    c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_local_experts)
			return refuse(err, errlen, "%s needs 1 <= num_experts_per_tok <= "
				      "num_local_experts", fam);
		for (int l = 0; l < c->num_hidden_layers; l++)
			if (!dps_cfg_layer_moe(c, l))
				return refuse(err, errlen, "%s has experts in every layer (no dense "
					      "layers)", fam);
		if (!c->attn_sinks)
			return refuse(err, errlen, "%s always has attention sinks", fam);
		if (!(c->swiglu_limit > 0))
			return refuse(err, errlen, "%s's SwiGLU is clamped: swiglu_limit must be "
				      "positive", fam);
	}
	return 0;
}

/* Sets key of o to v (a new reference, NULL on allocation failure); nonzero on failure. */
static int put(json_t *o, const char *key, json_t *v)
{
	return !v || json_object_set_new(o, key, v);
}

/* The rope_scaling object of c, or NULL with *none set when there is none to write. */
static json_t *rope_json(const struct dps_model_config *c, int *none)
{
	static const char *const names[] = { "default", "linear", "dynamic", "llama3", "yarn" };
	const struct dps_rope_cfg *r = &c->rope;
	json_t *o;
	int bad = 0;

	*none = 0;
	/* GptOssConfig's default rope is YaRN: a plain one must be said. */
	if (r->kind == DPS_ROPE_DEFAULT && c->arch != DPS_ARCH_GPT_OSS) {
		*none = 1;
		return NULL;
	}
	o = json_pack("{s:s}", "rope_type", names[r->kind]);
	if (!o)
		return NULL;
	if (r->kind != DPS_ROPE_DEFAULT && r->factor > 0)
		bad |= put(o, "factor", json_real(r->factor));
	if (r->kind == DPS_ROPE_LLAMA3)
		bad |= put(o, "low_freq_factor", json_real(r->low_freq_factor)) ||
		       put(o, "high_freq_factor", json_real(r->high_freq_factor));
	if ((r->kind == DPS_ROPE_LLAMA3 || r->kind == DPS_ROPE_YARN) && r->original_max_pos > 0)
		bad |= put(o, "original_max_position_embeddings",
			   json_integer(r->original_max_pos));
	if (r->kind == DPS_ROPE_YARN) {
		/* What a reader computes when absent is left out (attention_factor from factor and
		 * the mscales; <= 0 here means "not given"). */
		const double f = r->factor;
		double a = f <= 1 ? 1.0 : 0.1 * log(f) + 1.0;

		if (r->mscale > 0 && r->mscale_all_dim > 0 && f > 1)
			a = (0.1 * r->mscale * log(f) + 1.0) / (0.1 * r->mscale_all_dim * log(f) + 1.0);
		if (r->beta_fast > 0)
			bad |= put(o, "beta_fast", json_real(r->beta_fast));
		if (r->beta_slow > 0)
			bad |= put(o, "beta_slow", json_real(r->beta_slow));
		if (r->mscale > 0)
			bad |= put(o, "mscale", json_real(r->mscale));
		if (r->mscale_all_dim > 0)
			bad |= put(o, "mscale_all_dim", json_real(r->mscale_all_dim));
		if (r->attention_factor > 0 && !(f > 0 && r->attention_factor == a))
			bad |= put(o, "attention_factor", json_real(r->attention_factor));
		bad |= put(o, "truncate", json_boolean(r->truncate));
	}
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* One "sliding_attention" / "full_attention" per layer. */
static json_t *layer_types(const struct dps_model_config *c)
{
	json_t *a = json_array();

	for (int l = 0; l < c->num_hidden_layers && a; l++)
		if (json_array_append_new(a, json_string(dps_cfg_layer_window(c, l)
							 ? "sliding_attention"
							 : "full_attention"))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

static json_t *window_json(const struct dps_model_config *c)
{
	return c->sliding_window > 0 ? json_integer(c->sliding_window) : json_null();
}

/* What the family's class adds to the fields every family writes. */
static int put_family(json_t *root, const struct dps_model_config *c)
{
	int from, win = window_shape(c, &from), bad = 0;

	switch (c->arch) {
	case DPS_ARCH_LLAMA:
		bad |= put(root, "attention_bias", json_boolean(c->qkv_bias)) ||
		       put(root, "mlp_bias", json_boolean(c->mlp_bias));
		break;
	case DPS_ARCH_MISTRAL:
		bad |= put(root, "sliding_window", window_json(c));
		break;
	case DPS_ARCH_QWEN3:
		bad |= put(root, "attention_bias", json_boolean(c->qkv_bias));
		/* and Qwen2's window fields: */
		/* fall through */
	case DPS_ARCH_QWEN2:
		/* Qwen2Config: sliding_window is None unless use_sliding_window; the windowed
		 * layers are those from max_window_layers on, or the given layer_types. */
		bad |= put(root, "use_sliding_window", json_boolean(c->sliding_window > 0)) ||
		       put(root, "sliding_window", window_json(c));
		if (win == 3)
			bad |= put(root, "layer_types", layer_types(c));
		else
			bad |= put(root, "max_window_layers",
				   json_integer(c->sliding_window > 0 ? from
							      : c->num_hidden_layers));
		break;
	case DPS_ARCH_GPT_OSS:
		bad |= put(root, "num_local_experts", json_integer(c->num_local_experts)) ||
		       put(root, "num_experts_per_tok", json_integer(c->num_experts_per_tok)) ||
		       put(root, "swiglu_limit", json_real(c->swiglu_limit)) ||
		       put(root, "attention_bias", json_boolean(c->qkv_bias)) ||
		       put(root, "sliding_window", window_json(c)) ||
		       put(root, "layer_types", layer_types(c));
		if (c->swiglu_alpha > 0 && c->swiglu_alpha != GPT_OSS_ALPHA)
			bad |= put(root, "swiglu_alpha", json_real(c->swiglu_alpha));
		if (c->mxfp4 && !c->int8)
			bad |= put(root, "quantization_config",
				   json_pack("{s:s, s:[s,s,s,s]}", "quant_method", "mxfp4",
					     "modules_to_not_convert", "model.layers.*.self_attn",
					     "model.layers.*.mlp.router", "model.embed_tokens",
					     "lm_head"));
		break;
	default:
		break;
	}
	if (c->int8)
		bad |= c->arch == DPS_ARCH_GPT_OSS
			       ? put(root, "quantization_config",
				     json_pack("{s:s, s:i, s:s, s:b}", "quant_method", "dpshard_int8",
					       "block_size", 32, "scale_dtype", "float16",
					       "mxfp4_experts", c->mxfp4))
			       : put(root, "quantization_config",
				     json_pack("{s:s, s:i, s:s}", "quant_method", "dpshard_int8",
					       "block_size", 32, "scale_dtype", "float16"));
	return bad ? -ENOMEM : 0;
}

int dps_model_config_save(const struct dps_model_config *c, const char *path)
{
	const enum dps_arch arch = is_eagle3(c) ? DPS_ARCH_EAGLE3 : c->arch;
	char err[256];
	json_t *root, *rope;
	int rc = -ENOMEM, none;

	if (dps_model_config_check_save(c, err, sizeof(err)))
		return -EINVAL;
	root = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:i, s:b, s:i, s:s,"
			 " s:s}",
			 "architectures", dps_arch_name(arch), "model_type",
			 dps_arch_model_type(arch), "hidden_size", c->hidden_size,
			 "intermediate_size", c->intermediate_size,
			 "num_hidden_layers", c->num_hidden_layers,
			 "num_attention_heads", c->num_attention_heads,
			 "num_key_value_heads", c->num_key_value_heads, "vocab_size", c->vocab_size,
			 "rms_norm_eps", c->rms_norm_eps, "rope_theta", c->rope_theta,
			 "max_position_embeddings", c->max_position_embeddings,
			 "tie_word_embeddings", c->tie_word_embeddings,
			 "bos_token_id", c->bos_token_id, "hidden_act", "silu",
			 "torch_dtype", "float32");
	if (!root)
		return -ENOMEM;
	/* Qwen2Config has no head_dim (always hidden_size / heads; checked above). */
	if (arch != DPS_ARCH_QWEN2 && put(root, "head_dim", json_integer(c->head_dim)))
		goto out;
	if (c->n_eos > 1) {
		json_t *eos = json_array();

		for (int i = 0; i < c->n_eos && eos; i++)
			if (json_array_append_new(eos, json_integer(c->eos_ids[i]))) {
				json_decref(eos);
				eos = NULL;
			}
		if (put(root, "eos_token_id", eos))
			goto out;
	} else if (put(root, "eos_token_id", !c->n_eos && c->eos_token_id < 0
						      ? json_null() /* none (Qwen, GPT-OSS) */
						      : json_integer(c->eos_token_id))) {
		goto out;
	}
	rope = rope_json(c, &none);
	if (!none && put(root, "rope_scaling", rope))
		goto out;
	if (arch == DPS_ARCH_EAGLE3) {
		json_t *aux = c->n_aux ? json_pack("[i,i,i]", c->aux_layers[0], c->aux_layers[1],
						  c->aux_layers[2]) : json_null();

		if (put(root, "draft_vocab_size",
			json_integer(c->draft_vocab_size ? c->draft_vocab_size : c->vocab_size)) ||
		    put(root, "eagle_aux_hidden_state_layer_ids", aux))
			goto out;
	} else if (put_family(root, c)) {
		goto out;
	}
	rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS) ? -EIO : 0;
out:
	json_decref(root);
	return rc;
}
