/* SPDX-License-Identifier: MIT */
/*
 * engine/model/model_config.h - the model shape from a Hugging Face config.json (LlamaForCausalLM
 * field names). Parsed once at load time; the parser reads outside input, so every field is
 * type- and range-checked and the parser is fuzzed (tests/fuzz/fuzz_config.c).
 */
#ifndef DPS_ENGINE_MODEL_CONFIG_H
#define DPS_ENGINE_MODEL_CONFIG_H

#include <stddef.h>

#define DPS_CFG_MAX_LAYERS_WORDS 64 /* DPS_CFG_MAX_LAYERS / 64 */
#define DPS_CFG_MAX_EXPERTS 1024
#define DPS_CFG_MAX_EOS 8

struct dps_model_config {
	int hidden_size;
	int intermediate_size;
	int num_hidden_layers;
	int num_attention_heads;
	int num_key_value_heads;   /* default: num_attention_heads */
	int head_dim;              /* default: hidden_size / num_attention_heads */
	int vocab_size;
	double rms_norm_eps;       /* default 1e-6 */
	double rope_theta;         /* default 10000 */
	int max_position_embeddings; /* default 2048 */
	int tie_word_embeddings;   /* default 0 */
	int bos_token_id, eos_token_id; /* default 1 and 2; eos_token_id is eos_ids[0] */
	int eos_ids[DPS_CFG_MAX_EOS], n_eos; /* eos_token_id as one id or a list (n_eos >= 1 once parsed) */
	/*
	 * Mixture of experts (GPT-OSS style): num_local_experts experts of intermediate_size
	 * each in every layer not listed in mlp_only_layers, num_experts_per_tok of them per token
	 * chosen by a router with bias. swiglu_limit > 0 selects GPT-OSS's clamped SwiGLU.
	 * num_local_experts 0 (the default) is a dense model.
	 */
	int num_local_experts, num_experts_per_tok;
	double swiglu_limit;
	unsigned long long dense_layers[DPS_CFG_MAX_LAYERS_WORDS]; /* bit l: layer l is dense */
	/*
	 * An Eagle3 draft (architectures "LlamaForCausalLMEagle3", or a draft_vocab_size): one
	 * decoder layer over the target's hidden states. draft_vocab_size: its LM head's rows (0:
	 * vocab_size); aux_layers: the target layers whose input hidden states it fuses
	 * (eagle_aux_hidden_state_layer_ids, top level or in eagle_config; n_aux 0: the default
	 * 2, N/2, N-3 of the target's N layers).
	 */
	int eagle3, draft_vocab_size;
	int aux_layers[3], n_aux;
};

/* Upper bounds that keep every size computation far from overflow. */
#define DPS_CFG_MAX_DIM (1 << 20)
#define DPS_CFG_MAX_LAYERS 4096
#define DPS_CFG_MAX_VOCAB (1 << 24)
#define DPS_CFG_MAX_POS (1 << 24)

/* Whether layer l's MLP is a mixture of experts. */
static inline int dps_cfg_layer_moe(const struct dps_model_config *c, int l)
{
	return c->num_local_experts > 0 && !((c->dense_layers[l / 64] >> (l % 64)) & 1ull);
}

/*
 * Parses a config.json held in buf (len bytes). Returns 0, or -EINVAL with a message naming
 * the field and the rule in err (missing field, wrong type, out of range, heads not a
 * multiple of KV heads, odd head_dim, ...).
 */
int dps_model_config_parse(const char *buf, size_t len, struct dps_model_config *c, char *err,
			   size_t errlen);

/* Reads and parses DIR/config.json; messages name the file. */
int dps_model_config_load(const char *dir, struct dps_model_config *c, char *err, size_t errlen);

/*
 * generation_config.json: the ids that end a sequence and the sampling defaults a request
 * that does not set them gets (vLLM's rule). Fields absent from the file are unset (has_*).
 */
struct dps_gen_config {
	int eos_ids[DPS_CFG_MAX_EOS], n_eos;
	int has_temperature, has_top_p, has_top_k;
	double temperature, top_p;
	int top_k;
};

/* Reads DIR/generation_config.json into g; a directory without one gives an empty g and 0.
 * Returns 0 or -EINVAL (a field of the wrong type or range, named with the file). */
int dps_gen_config_load(const char *dir, struct dps_gen_config *g, char *err, size_t errlen);

/* The eos_token_id field of a config object (one id or a list); file names it in messages. */
struct json_t;
int dps_cfg_get_eos(const struct json_t *root, const char *file, int *ids, int *n, char *err,
		    size_t errlen);

/* Writes c as a config.json (LlamaForCausalLM) to path. Returns 0 or -errno. */
int dps_model_config_save(const struct dps_model_config *c, const char *path);

#endif
