/* SPDX-License-Identifier: MIT */
/*
 * engine/model_config.h - the model shape from a Hugging Face config.json (LlamaForCausalLM
 * field names). Parsed once at load time; the parser reads outside input, so every field is
 * type- and range-checked and the parser is fuzzed (tests/fuzz/fuzz_config.c).
 */
#ifndef DPS_ENGINE_MODEL_CONFIG_H
#define DPS_ENGINE_MODEL_CONFIG_H

#include <stddef.h>

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
	int bos_token_id, eos_token_id; /* default 1 and 2 */
};

/* Upper bounds that keep every size computation far from overflow. */
#define DPS_CFG_MAX_DIM (1 << 20)
#define DPS_CFG_MAX_LAYERS 4096
#define DPS_CFG_MAX_VOCAB (1 << 24)
#define DPS_CFG_MAX_POS (1 << 24)

/*
 * Parses a config.json held in buf (len bytes). Returns 0, or -EINVAL with a message naming
 * the field and the rule in err (missing field, wrong type, out of range, heads not a
 * multiple of KV heads, odd head_dim, ...).
 */
int dps_model_config_parse(const char *buf, size_t len, struct dps_model_config *c, char *err,
			   size_t errlen);

/* Reads and parses DIR/config.json; messages name the file. */
int dps_model_config_load(const char *dir, struct dps_model_config *c, char *err, size_t errlen);

/* Writes c as a config.json (LlamaForCausalLM) to path. Returns 0 or -errno. */
int dps_model_config_save(const struct dps_model_config *c, const char *path);

#endif
