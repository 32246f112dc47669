/* SPDX-License-Identifier: MIT */
/*
 * engine/model/mkmodel.h - seeded random Llama-family models of any shape, written in the native
 * checkpoint format, for tests and benchmarks (`dpshard mkmodel`). The same (shape, seed)
 * always gives the same bytes; weights are drawn from a normal distribution of standard
 * deviation 0.02 (0.02/sqrt(2 layers) for the output projections), norms near 1.
 */
#ifndef DPS_ENGINE_MKMODEL_H
#define DPS_ENGINE_MKMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

struct dps_mkmodel_preset {
	const char *name;
	const char *what;
	struct dps_model_config cfg;
};

/* The presets, NULL-name terminated: tiny test shapes up to the benchmark models. */
extern const struct dps_mkmodel_preset dps_mkmodel_presets[];

const struct dps_mkmodel_preset *dps_mkmodel_preset(const char *name);

/* Total parameters of a shape (embedding, layers, final norm, untied head). */
uint64_t dps_model_config_params(const struct dps_model_config *c);

/*
 * Writes config.json and model.safetensors for c into outdir (created if missing), tensors
 * in dtype dt. Returns 0 or a negative code with a message in err.
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
