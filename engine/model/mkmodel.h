/* SPDX-License-Identifier: MIT */
/*
 * engine/model/mkmodel.h - seeded random models of any shape and family (Llama, Mistral,
 * Qwen2, Qwen3, GPT-OSS), written as Hugging Face checkpoints of that family (its config.json,
 * its tensor names and layouts), for tests and benchmarks (`dpshard mkmodel`). The same
 * (shape, seed) always gives the same bytes; weights are drawn from a normal distribution of
 * standard deviation 0.02 (0.02/sqrt(2 layers) for the output projections), biases of 0.02,
 * norms near 1, sinks of 0.5; MXFP4 experts from random E2M1 codes and scales of about the
 * same magnitude.
 */
#ifndef DPS_ENGINE_MKMODEL_H
#define DPS_ENGINE_MKMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

/*
 * The version of what mkmodel writes for a (preset, seed): raised whenever the tensors or the
 * config of a preset change (2: the Hugging Face families, GPT-OSS's expert layout), so that
 * caches of preset models (tools/models.c) never serve an older layout.
 */
#define DPS_MKMODEL_FORMAT 2

struct dps_mkmodel_preset {
	const char *name;
	const char *what;
	struct dps_model_config cfg;
};

/* The presets, NULL-name terminated: tiny test shapes up to the benchmark models. */
extern const struct dps_mkmodel_preset dps_mkmodel_presets[];

const struct dps_mkmodel_preset *dps_mkmodel_preset(const char *name);

/*
 * Total parameters of a shape (embedding, layers with their biases, norms, sinks and experts,
 * final norm, untied head). An MXFP4 weight counts its elements, not its bytes; its scales
 * are not counted.
 */
uint64_t dps_model_config_params(const struct dps_model_config *c);

/*
 * Writes config.json and model.safetensors for c into outdir (created if missing), tensors
 * in dtype dt (F32, BF16 or F16; with c->mxfp4 the experts' blocks and scales are U8).
 * Layer l has input_layernorm, self_attn.{q,k,v,o}_proj (with .bias when qkv_bias / o_bias),
 * self_attn.{q,k}_norm (qk_norm), self_attn.sinks (attn_sinks), post_attention_layernorm,
 * and either mlp.{gate,up,down}_proj (with .bias when mlp_bias) or GPT-OSS's experts:
 * mlp.router.{weight,bias}, mlp.experts.gate_up_proj (E, hidden, 2I; column 2i the gate's
 * row i, 2i+1 the up projection's) and down_proj (E, I, hidden), or their _blocks / _scales
 * (kernels/mxfp4.h, a row per output feature), and gate_up_proj_bias, down_proj_bias.
 * Returns 0, -EINVAL with a message in err for a config its family cannot write
 * (dps_model_config_check_save) or MXFP4 dimensions that are not multiples of 32, or another
 * negative code with a message.
 */
int dps_mkmodel(const struct dps_model_config *c, uint64_t seed, enum dps_st_dtype dt,
		const char *outdir, char *err, size_t errlen);

/* What dps_mkmodel_draft makes. */
enum dps_draft_kind {
	DPS_DRAFT_RANDOM, /* seeded random weights, a random subset of the target's ids */
	DPS_DRAFT_SELF    /* derived from the target's own weights (mkmodel.c says how) */
};

/*
 * Writes an Eagle3 draft of the checkpoint in target (config.json naming
 * LlamaForCausalLMEagle3, draft_vocab_size, the fused layers; fc.weight, midlayer.*,
 * norm.weight, lm_head.weight and d2t as I64) into outdir. draft_vocab <= 0: the target's
 * vocabulary. Returns 0 or a negative code with a message in err.
 */
int dps_mkmodel_draft(const char *target, enum dps_draft_kind kind, int draft_vocab,
		      uint64_t seed, enum dps_st_dtype dt, const char *outdir, char *err,
		      size_t errlen);

#endif
