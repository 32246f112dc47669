/* SPDX-License-Identifier: MIT */
/*
 * engine/model/model_arch.c - the families of config.json (see model_config.h): which
 * architecture a file names, the defaults of its Hugging Face config class, the fields each
 * family reads (anything else that is not known metadata is refused by name), and the
 * family-specific fields: biases, windows, rope_scaling, experts, quantization. Called by
 * dps_model_config_parse; the RoPE frequencies of every variant are computed here too
 * (dps_cfg_rope_freqs), once per load.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/model_config.h"

struct arch_desc {
	const char *name, *model_type;
	const char *const *fields; /* what it reads beyond the common fields, NULL-terminated */
	int kv_heads;              /* num_key_value_heads when absent (0: num_attention_heads) */
	int head_dim;              /* head_dim when absent (0: hidden_size / heads) */
	double eps, theta;
	int max_pos;
};

/* What every family reads. */
static const char *const common_fields[] = {
	"architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
	"num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps",
	"rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
	"tie_word_embeddings", "hidden_act", "bos_token_id", "eos_token_id", NULL
};

/*
 * Known metadata: fields of Hugging Face's PretrainedConfig and of these classes that do not
 * change a forward pass at inference (ids, dtypes, training-only settings, dropout). The
 * generation defaults older transformers wrote into config.json are among them: dpshard
 * reads generation defaults from generation_config.json only (README).
 */
static const char *const metadata_fields[] = {
	"_name_or_path", "torch_dtype", "dtype", "transformers_version", "use_cache",
	"initializer_range", "attention_dropout", "pad_token_id", "sep_token_id",
	"decoder_start_token_id", "output_attentions", "output_hidden_states", "return_dict",
	"use_return_dict", "torchscript", "id2label", "label2id", "problem_type", "prefix",
	"tokenizer_class", "task_specific_params", "finetuning_task", "is_decoder",
	"is_encoder_decoder", "add_cross_attention", "tie_encoder_decoder",
	"cross_attention_hidden_size", "chunk_size_feed_forward", "pruned_heads",
	"tf_legacy_loss", "use_bfloat16", "auto_map", "_attn_implementation",
	"_attn_implementation_autoset", "max_length", "min_length", "do_sample",
	"early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature",
	"top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
	"no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
	"num_return_sequences", "output_scores", "return_dict_in_generate",
	"forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
	"exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", NULL
};

static const char *const llama_fields[] = { "attention_bias", "mlp_bias", "pretraining_tp",
					    NULL };
static const char *const mistral_fields[] = { "sliding_window", NULL };
static const char *const qwen2_fields[] = { "use_sliding_window", "sliding_window",
					    "max_window_layers", "layer_types", NULL };
static const char *const qwen3_fields[] = { "attention_bias", "use_sliding_window",
					    "sliding_window", "max_window_layers", "layer_types",
					    NULL };
static const char *const gpt_oss_fields[] = {
	"num_local_experts", "num_experts", "num_experts_per_tok", "experts_per_token",
	"swiglu_limit", "swiglu_alpha", "attention_bias", "sliding_window", "layer_types",
	/* training and bookkeeping only: */
	"router_aux_loss_coef", "output_router_logits", "initial_context_length", NULL
};
static const char *const eagle3_fields[] = { "attention_bias", "mlp_bias", "pretraining_tp",
					     "draft_vocab_size", "eagle_config",
					     "eagle_aux_hidden_state_layer_ids", "target_hidden_size",
					     NULL };

static const struct arch_desc archs[DPS_ARCH_COUNT] = {
	[DPS_ARCH_LLAMA] = { "LlamaForCausalLM", "llama", llama_fields, 0, 0, 1e-6, 10000.0,
			     2048 },
	[DPS_ARCH_MISTRAL] = { "MistralForCausalLM", "mistral", mistral_fields, 8, 0, 1e-6,
			       10000.0, 4096 * 32 },
	[DPS_ARCH_QWEN2] = { "Qwen2ForCausalLM", "qwen2", qwen2_fields, 32, 0, 1e-6, 10000.0,
			     32768 },
	[DPS_ARCH_QWEN3] = { "Qwen3ForCausalLM", "qwen3", qwen3_fields, 32, 128, 1e-6, 10000.0,
			     32768 },
	[DPS_ARCH_GPT_OSS] = { "GptOssForCausalLM", "gpt_oss", gpt_oss_fields, 8, 64, 1e-5,
			       150000.0, 131072 },
	[DPS_ARCH_EAGLE3] = { "LlamaForCausalLMEagle3", "llama", eagle3_fields, 0, 0, 1e-6,
			      10000.0, 2048 },
};

const char *dps_arch_name(enum dps_arch a)
{
	return (unsigned)a < DPS_ARCH_COUNT ? archs[a].name : "?";
}

const char *dps_arch_model_type(enum dps_arch a)
{
	return (unsigned)a < DPS_ARCH_COUNT ? archs[a].model_type : "?";
}

static int in_list(const char *const *list, const char *s)
{
	for (; *list; list++)
		if (!strcmp(*list, s))
			return 1;
	return 0;
}

/* The list of supported architectures, for messages. */
static void supported(char *buf, size_t len)
{
	size_t at = 0;

	buf[0] = 0;
	for (int a = 0; a < DPS_ARCH_COUNT && at < len; a++)
		at += (size_t)snprintf(buf + at, len - at, "%s%s", a ? ", " : "", archs[a].name);
}

int dps_arch_select(const json_t *root, struct dps_model_config *c, char *err, size_t errlen)
{
	const json_t *v = json_object_get(root, "architectures"), *mt;
	char list[256];
	int arch = -1;

	supported(list, sizeof(list));
	if (v && !json_is_null(v)) {
		size_t i;
		json_t *e;

		if (!json_is_array(v) || !json_array_size(v)) {
			snprintf(err, errlen, "config.json: 'architectures' must be a list of names");
			return -EINVAL;
		}
		json_array_foreach(v, i, e) {
			int a;

			if (!json_is_string(e)) {
				snprintf(err, errlen, "config.json: 'architectures' must be a list of "
					 "names");
				return -EINVAL;
			}
			for (a = 0; a < DPS_ARCH_COUNT; a++)
				if (!strcmp(json_string_value(e), archs[a].name))
					break;
			/* Eagle3 drafts go by several names (EAGLE's, the speculators'). */
			if (a == DPS_ARCH_COUNT && strstr(json_string_value(e), "Eagle3"))
				a = DPS_ARCH_EAGLE3;
			if (a == DPS_ARCH_COUNT) {
				snprintf(err, errlen, "config.json: architecture '%.64s' is not "
					 "supported (dpshard computes %s)", json_string_value(e), list);
				return -EINVAL;
			}
			if (arch >= 0 && arch != a) {
				snprintf(err, errlen, "config.json: 'architectures' names two "
					 "families, %s and %s", archs[arch].name, archs[a].name);
				return -EINVAL;
			}
			arch = a;
		}
	}
	mt = json_object_get(root, "model_type");
	if (mt && !json_is_null(mt)) {
		const char *s = json_is_string(mt) ? json_string_value(mt) : NULL;
		int a;

		if (!s) {
			snprintf(err, errlen, "config.json: 'model_type' must be a string");
			return -EINVAL;
		}
		for (a = 0; a < DPS_ARCH_COUNT; a++)
			if (!strcmp(s, archs[a].model_type) &&
			    (arch < 0 ? a != DPS_ARCH_EAGLE3 : a == arch))
				break;
		if (a == DPS_ARCH_COUNT) {
			if (arch >= 0)
				snprintf(err, errlen, "config.json: model_type '%.64s' does not match "
					 "architecture %s (model_type '%s')", s, archs[arch].name,
					 archs[arch].model_type);
			else
				snprintf(err, errlen, "config.json: model_type '%.64s' is not "
					 "supported (dpshard computes %s)", s, list);
			return -EINVAL;
		}
		if (arch < 0)
			arch = a;
	}
	/* A config.json that names neither (a hand-written one) is read as Llama's. */
	c->arch = arch < 0 ? DPS_ARCH_LLAMA : (enum dps_arch)arch;
	/* A Llama config with the draft's fields is an Eagle3 draft (as EAGLE's own files). */
	if (c->arch == DPS_ARCH_LLAMA) {
		const json_t *ec = json_object_get(root, "eagle_config");
		const json_t *dv = json_object_get(root, "draft_vocab_size");
		const json_t *ax = json_object_get(root, "eagle_aux_hidden_state_layer_ids");

		if ((dv && !json_is_null(dv)) || (ax && !json_is_null(ax)) ||
		    (json_is_object(ec) && json_object_get(ec, "eagle_aux_hidden_state_layer_ids")))
			c->arch = DPS_ARCH_EAGLE3;
	}
	c->rms_norm_eps = archs[c->arch].eps;
	c->rope_theta = archs[c->arch].theta;
	c->max_position_embeddings = archs[c->arch].max_pos;
	c->eagle3 = c->arch == DPS_ARCH_EAGLE3;
	if (c->arch == DPS_ARCH_GPT_OSS) {
		c->swiglu_limit = 7.0;
		c->sliding_window = 128;
	}
	c->swiglu_alpha = 1.702;
	return 0;
}

/* The defaults that depend on fields read before (heads and hidden size). */
void dps_arch_shape_defaults(struct dps_model_config *c)
{
	const struct arch_desc *d = &archs[c->arch];

	if (c->num_key_value_heads < 0)
		c->num_key_value_heads = d->kv_heads ? d->kv_heads : c->num_attention_heads;
	if (c->head_dim < 0 && d->head_dim)
		c->head_dim = d->head_dim;
}

static int get_bool(const json_t *root, const char *name, int *out, char *err, size_t errlen)
{
	const json_t *v = json_object_get(root, name);

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_boolean(v)) {
		snprintf(err, errlen, "config.json: '%s' must be true or false", name);
		return -EINVAL;
	}
	*out = json_is_true(v);
	return 0;
}

/* An integer field in [lo, hi]; absent or null keeps *out; *seen says whether it was there. */
static int get_int(const json_t *root, const char *name, long lo, long hi, int *out, int *seen,
		   char *err, size_t errlen)
{
	const json_t *v = json_object_get(root, name);

	if (seen)
		*seen = 0;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
		snprintf(err, errlen, "config.json: '%s' must be an integer in [%ld, %ld]", name, lo,
			 hi);
		return -EINVAL;
	}
	*out = (int)json_integer_value(v);
	if (seen)
		*seen = 1;
	return 0;
}

static int get_real(const json_t *obj, const char *where, const char *name, double lo,
		    double hi, double *out, int *seen, char *err, size_t errlen)
{
	const json_t *v = json_object_get(obj, name);

	if (seen)
		*seen = 0;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi)) {
		snprintf(err, errlen, "config.json: '%s%s' must be a number in [%g, %g]", where,
			 name, lo, hi);
		return -EINVAL;
	}
	*out = json_number_value(v);
	if (seen)
		*seen = 1;
	return 0;
}

/*
 * rope_scaling (or transformers 5's rope_parameters, which may also carry rope_theta): the
 * variant and its parameters. Every key a variant does not read is refused by name.
 */
static int read_rope(const json_t *root, struct dps_model_config *c, char *err, size_t errlen)
{
	static const char *const keys_linear[] = { "factor", NULL };
	static const char *const keys_dynamic[] = { "factor", "original_max_position_embeddings",
						    NULL };
	static const char *const keys_llama3[] = { "factor", "low_freq_factor",
						   "high_freq_factor",
						   "original_max_position_embeddings", NULL };
	static const char *const keys_yarn[] = { "factor", "original_max_position_embeddings",
						 "beta_fast", "beta_slow", "attention_factor",
						 "mscale", "mscale_all_dim", "truncate", NULL };
	const char *field = "rope_scaling";
	const json_t *r = json_object_get(root, field), *tv;
	struct dps_rope_cfg *p = &c->rope;
	const char *const *keys = NULL;
	const char *type, *key;
	char where[64];
	json_t *val;
	int seen;

	if (!r || json_is_null(r)) {
		field = "rope_parameters";
		r = json_object_get(root, field);
	} else if (json_object_get(root, "rope_parameters") &&
		   !json_is_null(json_object_get(root, "rope_parameters"))) {
		snprintf(err, errlen, "config.json: both 'rope_scaling' and 'rope_parameters' are "
			 "given");
		return -EINVAL;
	}
	memset(p, 0, sizeof(*p));
	p->truncate = 1;
	p->attention_factor = -1.0;
	if (c->arch == DPS_ARCH_GPT_OSS && (!r || json_is_null(r)) &&
	    (json_object_get(root, "rope_scaling") || json_object_get(root, "rope_parameters"))) {
		/*
		 * Written out as null, transformers 4.x's GptOssRotaryEmbedding computes the
		 * default RoPE, not the class's YaRN: no single answer, so say it.
		 */
		snprintf(err, errlen, "config.json: a null rope_scaling for GptOssForCausalLM "
			 "(Hugging Face versions disagree between its YaRN default and plain "
			 "RoPE): give it, or leave it out for YaRN");
		return -EINVAL;
	}
	if (c->arch == DPS_ARCH_GPT_OSS && (!r || json_is_null(r))) {
		/* GptOssConfig's default rope: YaRN. */
		*p = (struct dps_rope_cfg){ DPS_ROPE_YARN, 32.0, 0, 0, 4096, 32.0, 1.0, -1.0, 0, 0,
					    0 };
		return 0;
	}
	if (!r || json_is_null(r))
		return 0;
	snprintf(where, sizeof(where), "%s.", field);
	if (!json_is_object(r)) {
		snprintf(err, errlen, "config.json: '%s' must be an object", field);
		return -EINVAL;
	}
	tv = json_object_get(r, "rope_type");
	if (!tv)
		tv = json_object_get(r, "type");
	type = json_is_string(tv) ? json_string_value(tv) : NULL;
	if (!type) {
		snprintf(err, errlen, "config.json: '%s' has no rope_type", field);
		return -EINVAL;
	}
	if (!strcmp(type, "default")) {
		p->kind = DPS_ROPE_DEFAULT;
	} else if (!strcmp(type, "linear")) {
		p->kind = DPS_ROPE_LINEAR;
		keys = keys_linear;
	} else if (!strcmp(type, "dynamic")) {
		p->kind = DPS_ROPE_DYNAMIC;
		keys = keys_dynamic;
	} else if (!strcmp(type, "llama3")) {
		p->kind = DPS_ROPE_LLAMA3;
		keys = keys_llama3;
	} else if (!strcmp(type, "yarn")) {
		p->kind = DPS_ROPE_YARN;
		keys = keys_yarn;
	} else {
		snprintf(err, errlen, "config.json: %s rope_type '%.32s' is not supported (dpshard "
			 "computes default, linear, dynamic, llama3 and yarn)", field, type);
		return -EINVAL;
	}
	json_object_foreach((json_t *)r, key, val) {
		if (!strcmp(key, "rope_type") || !strcmp(key, "type") ||
		    (!strcmp(field, "rope_parameters") && !strcmp(key, "rope_theta")) ||
		    (keys && in_list(keys, key)))
			continue;
		if (!strcmp(key, "partial_rotary_factor") && json_is_number(val) &&
		    json_number_value(val) == 1.0)
			continue;
		snprintf(err, errlen, "config.json: '%s%.48s' is not read by dpshard for rope_type "
			 "'%s' (refused rather than ignored)", where, key, type);
		return -EINVAL;
	}
	if (get_real(r, where, "rope_theta", 1.0, 1e12, &c->rope_theta, NULL, err, errlen))
		return -EINVAL;
	if (p->kind == DPS_ROPE_DEFAULT)
		return 0;
	if (get_real(r, where, "factor", 1e-6, 1e6, &p->factor, &seen, err, errlen))
		return -EINVAL;
	if (!seen && p->kind != DPS_ROPE_YARN) {
		snprintf(err, errlen, "config.json: '%sfactor' is missing", where);
		return -EINVAL;
	}
	if (p->kind == DPS_ROPE_LINEAR || p->kind == DPS_ROPE_DYNAMIC)
		return 0;
	{
		const json_t *o = json_object_get(r, "original_max_position_embeddings");

		if (o && !json_is_null(o)) {
			if (!json_is_integer(o) || json_integer_value(o) < 1 ||
			    json_integer_value(o) > DPS_CFG_MAX_POS) {
				snprintf(err, errlen, "config.json: '%soriginal_max_position_embeddings'"
					 " must be a positive integer", where);
				return -EINVAL;
			}
			p->original_max_pos = (int)json_integer_value(o);
		}
	}
	if (p->kind == DPS_ROPE_LLAMA3) {
		int s1, s2;

		if (get_real(r, where, "low_freq_factor", 1e-6, 1e6, &p->low_freq_factor, &s1, err,
			     errlen) ||
		    get_real(r, where, "high_freq_factor", 1e-6, 1e6, &p->high_freq_factor, &s2,
			     err, errlen))
			return -EINVAL;
		if (!s1 || !s2 || !p->original_max_pos) {
			snprintf(err, errlen, "config.json: %s llama3 needs factor, low_freq_factor, "
				 "high_freq_factor and original_max_position_embeddings", field);
			return -EINVAL;
		}
		if (p->high_freq_factor <= p->low_freq_factor) {
			snprintf(err, errlen, "config.json: %s llama3: high_freq_factor must be "
				 "larger than low_freq_factor", field);
			return -EINVAL;
		}
		return 0;
	}
	/* yarn */
	p->beta_fast = 32.0;
	p->beta_slow = 1.0;
	if (get_real(r, where, "beta_fast", 1e-6, 1e6, &p->beta_fast, NULL, err, errlen) ||
	    get_real(r, where, "beta_slow", 1e-6, 1e6, &p->beta_slow, NULL, err, errlen) ||
	    get_real(r, where, "attention_factor", 1e-6, 1e6, &p->attention_factor, NULL, err,
		     errlen) ||
	    get_real(r, where, "mscale", 0, 1e6, &p->mscale, NULL, err, errlen) ||
	    get_real(r, where, "mscale_all_dim", 0, 1e6, &p->mscale_all_dim, NULL, err, errlen) ||
	    get_bool(r, "truncate", &p->truncate, err, errlen))
		return -EINVAL;
	return 0;
}

/* The yarn factor and original context once max_position_embeddings is known. */
static int finish_rope(struct dps_model_config *c, char *err, size_t errlen)
{
	struct dps_rope_cfg *p = &c->rope;

	if (p->kind != DPS_ROPE_YARN)
		return 0;
	if (!p->original_max_pos)
		p->original_max_pos = c->max_position_embeddings;
	if (p->factor <= 0) /* transformers 5: the ratio of the two contexts */
		p->factor = (double)c->max_position_embeddings / p->original_max_pos;
	if (p->attention_factor < 0) {
		const double f = p->factor;
		double a = f <= 1 ? 1.0 : 0.1 * log(f) + 1.0;

		if (p->mscale > 0 && p->mscale_all_dim > 0 && f > 1)
			a = (0.1 * p->mscale * log(f) + 1.0) / (0.1 * p->mscale_all_dim * log(f) + 1.0);
		p->attention_factor = a;
	}
	(void)err;
	(void)errlen;
	return 0;
}

/* layer_types: one "sliding_attention" or "full_attention" per layer. */
static int read_layer_types(const json_t *root, struct dps_model_config *c, int *given,
			    char *err, size_t errlen)
{
	const json_t *v = json_object_get(root, "layer_types");
	size_t i;
	json_t *e;

	*given = 0;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_array(v) || json_array_size(v) != (size_t)c->num_hidden_layers) {
		snprintf(err, errlen, "config.json: 'layer_types' must list one type for each of "
			 "the %d layers", c->num_hidden_layers);
		return -EINVAL;
	}
	memset(c->window_layers, 0, sizeof(c->window_layers));
	json_array_foreach(v, i, e) {
		const char *s = json_is_string(e) ? json_string_value(e) : "";

		if (!strcmp(s, "sliding_attention"))
			c->window_layers[i / 64] |= 1ull << (i % 64);
		else if (strcmp(s, "full_attention")) {
			snprintf(err, errlen, "config.json: 'layer_types'[%zu] '%.32s' is not "
				 "supported (sliding_attention or full_attention)", i, s);
			return -EINVAL;
		}
	}
	*given = 1;
	return 0;
}

static void window_all(struct dps_model_config *c, int from)
{
	for (int l = from; l < c->num_hidden_layers; l++)
		c->window_layers[l / 64] |= 1ull << (l % 64);
}

/* sliding_window, use_sliding_window, max_window_layers, layer_types for each family. */
static int read_windows(const json_t *root, struct dps_model_config *c, char *err,
			size_t errlen)
{
	const int L = c->num_hidden_layers;
	int use = 0, max_window_layers = 28, typed, seen;

	if (c->arch == DPS_ARCH_QWEN2 || c->arch == DPS_ARCH_QWEN3 || c->arch == DPS_ARCH_MISTRAL)
		c->sliding_window = 4096; /* their config classes' default */
	{
		const json_t *v = json_object_get(root, "sliding_window");

		if (v && json_is_null(v))
			c->sliding_window = 0;
	}
	if (get_int(root, "sliding_window", 1, DPS_CFG_MAX_POS, &c->sliding_window, &seen, err,
		    errlen) ||
	    read_layer_types(root, c, &typed, err, errlen))
		return -EINVAL;
	switch (c->arch) {
	case DPS_ARCH_MISTRAL:
		window_all(c, 0);
		break;
	case DPS_ARCH_QWEN2:
	case DPS_ARCH_QWEN3:
		if (get_bool(root, "use_sliding_window", &use, err, errlen) ||
		    get_int(root, "max_window_layers", 0, DPS_CFG_MAX_LAYERS, &max_window_layers,
			    NULL, err, errlen))
			return -EINVAL;
		if (!use) /* Qwen2Config: sliding_window = None unless use_sliding_window */
			c->sliding_window = 0;
		if (!use && typed)
			for (int l = 0; l < L; l++)
				if (c->window_layers[l / 64] >> (l % 64) & 1) {
					/* Hugging Face's sliding mask then has no window: it raises */
					snprintf(err, errlen, "config.json: 'layer_types'[%d] is "
						 "sliding_attention but use_sliding_window is false", l);
					return -EINVAL;
				}
		if (!typed)
			window_all(c, max_window_layers);
		break;
	case DPS_ARCH_GPT_OSS:
		if (!typed) /* GptOssConfig's default: even layers slide */
			for (int l = 0; l < L; l += 2)
				c->window_layers[l / 64] |= 1ull << (l % 64);
		break;
	default:
		break;
	}
	return 0;
}

/* GPT-OSS's experts. */
static int read_experts(const json_t *root, struct dps_model_config *c, char *err,
			size_t errlen)
{
	int e2 = -1, k2 = -1, s;

	if (get_int(root, "num_local_experts", 1, DPS_CFG_MAX_EXPERTS, &c->num_local_experts,
		    NULL, err, errlen) ||
	    get_int(root, "num_experts", 1, DPS_CFG_MAX_EXPERTS, &e2, &s, err, errlen) ||
	    get_int(root, "num_experts_per_tok", 1, DPS_CFG_MAX_EXPERTS, &c->num_experts_per_tok,
		    NULL, err, errlen) ||
	    get_int(root, "experts_per_token", 1, DPS_CFG_MAX_EXPERTS, &k2, NULL, err, errlen) ||
	    get_real(root, "", "swiglu_limit", 1e-6, 1e6, &c->swiglu_limit, NULL, err, errlen) ||
	    get_real(root, "", "swiglu_alpha", 1e-6, 1e6, &c->swiglu_alpha, NULL, err, errlen))
		return -EINVAL;
	if (c->swiglu_alpha != 1.702) {
		/* the kernels' clamped SwiGLU has GPT-OSS's published gain built in */
		snprintf(err, errlen, "config.json: swiglu_alpha %g is not supported (1.702 is)",
			 c->swiglu_alpha);
		return -EINVAL;
	}
	if (c->swiglu_limit != 7.0) {
		/*
		 * transformers' eager GptOssExperts (the CPU path, MXFP4 dequantized included)
		 * clamps at 7.0 whatever the config says; only its MXFP4 GPU kernel reads
		 * swiglu_limit. Another value has no single Hugging Face result.
		 */
		snprintf(err, errlen, "config.json: swiglu_limit %g is not supported (7.0 is: "
			 "Hugging Face's eager experts clamp at 7.0 whatever the file says)",
			 c->swiglu_limit);
		return -EINVAL;
	}
	if (e2 > 0 && c->num_local_experts && e2 != c->num_local_experts) {
		snprintf(err, errlen, "config.json: 'num_experts' %d and 'num_local_experts' %d "
			 "disagree", e2, c->num_local_experts);
		return -EINVAL;
	}
	if (e2 > 0)
		c->num_local_experts = e2;
	if (!c->num_local_experts) {
		snprintf(err, errlen, "config.json: missing field 'num_local_experts'");
		return -EINVAL;
	}
	if (!c->num_experts_per_tok)
		c->num_experts_per_tok = k2 > 0 ? k2 : 4;
	if (k2 > 0 && k2 != c->num_experts_per_tok) {
		/* transformers reads num_experts_per_tok; two different values is a broken file */
		snprintf(err, errlen, "config.json: 'experts_per_token' %d and "
			 "'num_experts_per_tok' %d disagree", k2, c->num_experts_per_tok);
		return -EINVAL;
	}
	if (c->num_experts_per_tok > c->num_local_experts) {
		snprintf(err, errlen, "config.json: num_experts_per_tok %d must be between 1 and "
			 "num_local_experts %d", c->num_experts_per_tok, c->num_local_experts);
		return -EINVAL;
	}
	return 0;
}

/*
 * quantization_config, of any family: "mxfp4" (GPT-OSS's experts as published) or
 * "dpshard_int8" (what `dpshard quantize` writes: the linear weights as INT8 tensors with F16
 * scales, kernels/q8.h, and GPT-OSS's experts MXFP4 when mxfp4_experts says so). Any other
 * method, and any key not listed, is refused by name.
 */
static int read_quant(const json_t *root, struct dps_model_config *c, char *err, size_t errlen)
{
	const json_t *q = json_object_get(root, "quantization_config");
	const json_t *m = json_is_object(q) ? json_object_get(q, "quant_method") : NULL;
	const char *method = json_is_string(m) ? json_string_value(m) : "?";
	const int int8 = !strcmp(method, "dpshard_int8");
	const char *key;
	json_t *val;

	if (!q || json_is_null(q))
		return 0;
	if (!(int8 || (!strcmp(method, "mxfp4") && c->arch == DPS_ARCH_GPT_OSS))) {
		snprintf(err, errlen, "config.json: quantization_config quant_method '%.32s' is not "
			 "supported (dpshard_int8 is, and mxfp4 for GPT-OSS)", method);
		return -EINVAL;
	}
	json_object_foreach((json_t *)q, key, val) {
		const int known = !strcmp(key, "quant_method") ||
				  (!int8 && !strcmp(key, "modules_to_not_convert")) ||
				  (int8 && (!strcmp(key, "block_size") || !strcmp(key, "scale_dtype") ||
					    (!strcmp(key, "mxfp4_experts") &&
					     c->arch == DPS_ARCH_GPT_OSS)));

		if (!known) {
			snprintf(err, errlen, "config.json: 'quantization_config.%.48s' is not read "
				 "by dpshard for %s (refused rather than ignored)", key, method);
			return -EINVAL;
		}
	}
	if (!int8) {
		/* Which tensors are MXFP4 the checkpoint says (blocks and scales, or not). */
		c->mxfp4 = 1;
		return 0;
	}
	val = json_object_get(q, "block_size");
	if (val && !(json_is_integer(val) && json_integer_value(val) == 32)) {
		snprintf(err, errlen, "config.json: quantization_config.block_size must be 32 for "
			 "dpshard_int8");
		return -EINVAL;
	}
	val = json_object_get(q, "scale_dtype");
	if (val && !(json_is_string(val) && !strcmp(json_string_value(val), "float16"))) {
		snprintf(err, errlen, "config.json: quantization_config.scale_dtype must be "
			 "\"float16\" for dpshard_int8");
		return -EINVAL;
	}
	val = json_object_get(q, "mxfp4_experts");
	if (val && !json_is_boolean(val)) {
		snprintf(err, errlen, "config.json: quantization_config.mxfp4_experts must be true "
			 "or false");
		return -EINVAL;
	}
	c->int8 = 1;
	c->mxfp4 = val && json_is_true(val);
	return 0;
}

int dps_arch_read(const json_t *root, struct dps_model_config *c, char *err, size_t errlen)
{
	const struct arch_desc *d = &archs[c->arch];
	const char *key;
	json_t *val;
	int bias = c->arch == DPS_ARCH_GPT_OSS, mlp_bias = 0;

	json_object_foreach((json_t *)root, key, val) {
		/* A null value sets nothing: it is the field's absence, written out. */
		if (json_is_null(val) || in_list(common_fields, key) ||
		    !strcmp(key, "quantization_config") ||
		    in_list(metadata_fields, key) || in_list(d->fields, key))
			continue;
		snprintf(err, errlen, "config.json: field '%.64s' is not read by dpshard for %s "
			 "(refused rather than ignored; README: supported families and fields)",
			 key, d->name);
		return -EINVAL;
	}
	{
		const json_t *act = json_object_get(root, "hidden_act");

		if (act && !json_is_null(act) &&
		    (!json_is_string(act) || strcmp(json_string_value(act), "silu"))) {
			snprintf(err, errlen, "config.json: hidden_act '%.32s' is not supported "
				 "(silu is)", json_is_string(act) ? json_string_value(act) : "?");
			return -EINVAL;
		}
	}
	if (get_bool(root, "attention_bias", &bias, err, errlen) ||
	    get_bool(root, "mlp_bias", &mlp_bias, err, errlen) || read_rope(root, c, err, errlen) ||
	    read_windows(root, c, err, errlen))
		return -EINVAL;
	c->qkv_bias = bias || c->arch == DPS_ARCH_QWEN2;
	c->o_bias = bias;
	c->mlp_bias = mlp_bias;
	c->qk_norm = c->arch == DPS_ARCH_QWEN3;
	c->attn_sinks = c->arch == DPS_ARCH_GPT_OSS;
	if ((c->arch == DPS_ARCH_GPT_OSS && read_experts(root, c, err, errlen)) ||
	    read_quant(root, c, err, errlen))
		return -EINVAL;
	return finish_rope(c, err, errlen);
}

/* Hugging Face's inverse frequencies of each variant (modeling_rope_utils), in double. */
void dps_cfg_rope_freqs(const struct dps_model_config *c, float *inv_freq, float *attn_factor)
{
	const struct dps_rope_cfg *p = &c->rope;
	const int dim = c->head_dim, half = dim / 2;
	const double base = c->rope_theta;
	double low = 0, high = 0;

	*attn_factor = 1.0f;
	if (p->kind == DPS_ROPE_YARN) {
		/* The dimensions where beta_fast and beta_slow rotations fit the old context. */
		const double lf = (dim * log(p->original_max_pos / (p->beta_fast * 2 * M_PI))) /
				  (2 * log(base));
		const double hf = (dim * log(p->original_max_pos / (p->beta_slow * 2 * M_PI))) /
				  (2 * log(base));

		low = p->truncate ? floor(lf) : lf;
		high = p->truncate ? ceil(hf) : hf;
		if (low < 0)
			low = 0;
		if (high > dim - 1)
			high = dim - 1;
		if (low == high)
			high += 0.001;
		*attn_factor = (float)p->attention_factor;
	}
	for (int j = 0; j < half; j++) {
		const double f = 1.0 / pow(base, (double)(2 * j) / dim);
		double r = f;

		switch (p->kind) {
		case DPS_ROPE_LINEAR:
			r = f / p->factor;
			break;
		case DPS_ROPE_LLAMA3: {
			const double old = p->original_max_pos, wl = 2 * M_PI / f;
			const double low_wl = old / p->low_freq_factor;
			const double high_wl = old / p->high_freq_factor;

			if (wl > low_wl) {
				r = f / p->factor;
			} else if (wl >= high_wl) {
				const double s = (old / wl - p->low_freq_factor) /
						 (p->high_freq_factor - p->low_freq_factor);

				r = (1 - s) * f / p->factor + s * f;
			}
			break;
		}
		case DPS_ROPE_YARN: {
			double ramp = (j - low) / (high - low);
			double extrap;

			ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
			extrap = 1 - ramp;
			r = (f / p->factor) * (1 - extrap) + f * extrap;
			break;
		}
		default: /* default; dynamic equals it within max_position_embeddings */
			break;
		}
		inv_freq[j] = (float)r;
	}
}
