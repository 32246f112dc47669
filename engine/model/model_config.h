/* SPDX-License-Identifier: MIT */
/*
 * engine/model/model_config.h - the model from a Hugging Face config.json. Parsed once at load
 * time; the parser reads outside input, so every field is type- and range-checked and the
 * parser is fuzzed (tests/fuzz/fuzz_config.c).
 *
 * `architectures` (or `model_type`) selects the family (enum dps_arch); each family reads the
 * fields of its Hugging Face config class, with that class's defaults, and refuses by name
 * any other field that is not known metadata (model_arch.c holds the lists). The result is
 * one description every family maps onto: biases, per-head q/k norms, attention sinks,
 * sliding-window layers, the RoPE variant and the experts.
 */
#ifndef DPS_ENGINE_MODEL_CONFIG_H
#define DPS_ENGINE_MODEL_CONFIG_H

#include <stddef.h>

#define DPS_CFG_MAX_LAYERS_WORDS 64 /* DPS_CFG_MAX_LAYERS / 64 */
#define DPS_CFG_MAX_EXPERTS 1024
#define DPS_CFG_MAX_EOS 8

/* The families dpshard computes (model_arch.c: their names, fields and defaults). */
enum dps_arch {
	DPS_ARCH_LLAMA,    /* LlamaForCausalLM (Llama 2/3.x, TinyLlama, SmolLM2), model_type llama */
	DPS_ARCH_MISTRAL,  /* MistralForCausalLM: a sliding window on every layer */
	DPS_ARCH_QWEN2,    /* Qwen2ForCausalLM: q/k/v biases; windows above max_window_layers */
	DPS_ARCH_QWEN3,    /* Qwen3ForCausalLM: per-head RMSNorm of q and k */
	DPS_ARCH_GPT_OSS,  /* GptOssForCausalLM: experts, sinks, alternating windows, MXFP4 */
	DPS_ARCH_EAGLE3,   /* LlamaForCausalLMEagle3: an Eagle3 draft of a Llama-family target */
	DPS_ARCH_COUNT
};

/* The rotary embedding's variant (rope_scaling / rope_parameters rope_type). */
enum dps_rope_kind {
	DPS_ROPE_DEFAULT,
	DPS_ROPE_LINEAR,   /* inv_freq / factor */
	DPS_ROPE_DYNAMIC,  /* NTK: equal to the default up to max_position_embeddings, the context
			    * dpshard allows for it (beyond, HF's result depends on the call) */
	DPS_ROPE_LLAMA3,   /* Llama 3.1's bands */
	DPS_ROPE_YARN      /* YaRN, with its attention factor on cos and sin */
};

struct dps_rope_cfg {
	enum dps_rope_kind kind;
	double factor;                   /* linear, dynamic, llama3, yarn */
	double low_freq_factor, high_freq_factor; /* llama3 */
	int original_max_pos;            /* llama3, yarn (yarn default: max_position_embeddings) */
	double beta_fast, beta_slow;     /* yarn: 32 and 1 by default */
	double attention_factor;         /* yarn: given, or computed from factor and the mscales */
	double mscale, mscale_all_dim;   /* yarn: 0 when absent */
	int truncate;                    /* yarn: floor/ceil the correction range (default 1) */
};

struct dps_model_config {
	enum dps_arch arch;
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
	int bos_token_id, eos_token_id; /* default 1 and 2 (eos -1: none, Qwen and GPT-OSS);
					 * eos_token_id is eos_ids[0] */
	int eos_ids[DPS_CFG_MAX_EOS], n_eos; /* eos_token_id as one id or a list (n_eos 0: none) */
	/*
	 * Mixture of experts (GPT-OSS): num_local_experts experts of intermediate_size each in
	 * every layer, num_experts_per_tok of them per token chosen by a router with bias (top k,
	 * softmax over the chosen logits), the clamped SwiGLU of swiglu_limit and swiglu_alpha.
	 * num_local_experts 0 is a dense model. dense_layers (bit l: layer l is a dense MLP) is
	 * what the engine supports; no family of config.json sets it today.
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
	/*
	 * What the families add to a plain Llama layer. qkv_bias: q_proj, k_proj and v_proj have
	 * a bias (Qwen2 always; attention_bias of Llama, Qwen3, GPT-OSS); o_bias: o_proj has one
	 * (attention_bias, not Qwen2); mlp_bias: gate/up/down_proj have one (Llama's mlp_bias).
	 * qk_norm: self_attn.q_norm and k_norm, an RMSNorm over head_dim of every head before
	 * RoPE (Qwen3). attn_sinks: self_attn.sinks, one logit per query head that joins every
	 * softmax's denominator (GPT-OSS).
	 */
	int qkv_bias, o_bias, mlp_bias, qk_norm, attn_sinks;
	/*
	 * Sliding-window attention: a layer with bit l of window_layers set attends, from position
	 * p, to positions p - sliding_window + 1 .. p only (Hugging Face's sliding mask:
	 * kv > q - window). sliding_window 0: every layer attends to everything.
	 */
	int sliding_window;
	unsigned long long window_layers[DPS_CFG_MAX_LAYERS_WORDS];
	struct dps_rope_cfg rope;
	/*
	 * GPT-OSS experts: the Hugging Face layout (mlp.experts.gate_up_proj (E, hidden, 2 I) with
	 * gate and up interleaved, its bias, down_proj (E, I, hidden), its bias; or, with mxfp4,
	 * *_blocks U8 and *_scales E8M0), swiglu_alpha the clamped SwiGLU's sigmoid gain.
	 */
	int mxfp4;
	double swiglu_alpha;
	/*
	 * quantization_config "dpshard_int8" (`dpshard quantize`): the linear weights are stored
	 * as INT8 tensors with F16 scales (kernels/q8.h), and are held so unless --dtype f32.
	 */
	int int8;
};

/* Whether layer l attends through the sliding window. */
static inline int dps_cfg_layer_window(const struct dps_model_config *c, int l)
{
	return c->sliding_window > 0 && ((c->window_layers[l / 64] >> (l % 64)) & 1ull);
}

/* "LlamaForCausalLM", ...; and the model_type, "llama", ... */
const char *dps_arch_name(enum dps_arch a);
const char *dps_arch_model_type(enum dps_arch a);

/*
 * The rotary embedding of c: inv_freq[j] for j < head_dim / 2 (as Hugging Face computes it
 * for the variant, in double, rounded once to f32) and the factor cos and sin are multiplied
 * by (1 but for yarn) in *attn_factor.
 */
void dps_cfg_rope_freqs(const struct dps_model_config *c, float *inv_freq, float *attn_factor);

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

/*
 * The parts of dps_model_config_parse in model_arch.c, on the parsed JSON root: the family
 * and its defaults (before the fields are read), the defaults that need the heads, and the
 * allow-list with the family's own fields (after). 0 or -EINVAL with a message.
 */
int dps_arch_select(const struct json_t *root, struct dps_model_config *c, char *err,
		    size_t errlen);
void dps_arch_shape_defaults(struct dps_model_config *c);
int dps_arch_read(const struct json_t *root, struct dps_model_config *c, char *err,
		  size_t errlen);

/*
 * Writes c as a config.json to path as the Hugging Face config class of its family writes
 * one (model_config_save.c): that class's architectures and model_type, and only the fields
 * it has (an Eagle3 draft: LlamaForCausalLMEagle3 with its draft fields). Returns 0, -EINVAL
 * when dps_model_config_check_save refuses c, or -ENOMEM / -EIO.
 */
int dps_model_config_save(const struct dps_model_config *c, const char *path);

/*
 * Whether c can be written as its family's config.json: what the family's class cannot
 * express (a Llama with q/k/v biases but none on o_proj, a Mistral window on some layers
 * only, a GPT-OSS layer without experts, a Qwen3 without q/k norms, an unnamed RoPE
 * variant, ...) is refused. Returns 0 or -EINVAL with a message naming the rule in err.
 */
int dps_model_config_check_save(const struct dps_model_config *c, char *err, size_t errlen);

#endif
