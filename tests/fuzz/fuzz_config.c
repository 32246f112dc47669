/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_config.c - fuzz target for the config.json parser: any input is either
 * refused with a message or gives a shape that satisfies every rule the parser promises.
 */
#include <stdint.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dps_model_config c;
	char err[512] = "";

	if (dps_model_config_parse((const char *)data, size, &c, err, sizeof(err))) {
		DPS_ASSERT(err[0]);
		return 0;
	}
	DPS_ASSERT(c.hidden_size >= 1 && c.hidden_size <= DPS_CFG_MAX_DIM);
	DPS_ASSERT(c.intermediate_size >= 1 && c.num_hidden_layers >= 1);
	DPS_ASSERT(c.num_key_value_heads >= 1 && c.num_attention_heads % c.num_key_value_heads == 0);
	DPS_ASSERT(c.head_dim >= 2 && c.head_dim % 2 == 0);
	DPS_ASSERT(c.vocab_size >= 1 && c.bos_token_id < c.vocab_size && c.eos_token_id < c.vocab_size);
	DPS_ASSERT(c.rms_norm_eps > 0 && c.rope_theta >= 1);
	DPS_ASSERT(c.num_local_experts >= 0 && c.num_local_experts <= DPS_CFG_MAX_EXPERTS);
	DPS_ASSERT(!c.num_local_experts ||
		   (c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.num_local_experts));
	DPS_ASSERT(c.swiglu_limit >= 0);
	return 0;
}
