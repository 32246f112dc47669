/* SPDX-License-Identifier: MIT */
/*
 * engine/model/gpt_oss.h - GPT-OSS's experts as Hugging Face stores them, read into dpshard's
 * layout: one home for the one-rank model (model.c, the whole intermediate) and the shards
 * (engine/shard/load_moe.c, an intermediate range).
 *
 * Stored: gate_up_proj (E, hidden, 2I), gate and up interleaved along the last dimension
 * (column 2i is gate row i, 2i + 1 up row i), down_proj (E, I, hidden), gate_up_proj_bias
 * (E, 2I) interleaved likewise; or, with MXFP4, gate_up_proj_blocks (E, 2I, hidden/32, 16)
 * and _scales (E, 2I, hidden/32), down_proj_blocks (E, hidden, I/32, 16) and _scales, whose
 * rows are output features already (kernels/mxfp4.h).
 */
#ifndef DPS_ENGINE_MODEL_GPT_OSS_H
#define DPS_ENGINE_MODEL_GPT_OSS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/ckpt.h"

/*
 * Where expert e's intermediate rows [i0, i0 + n) go, allocated by the caller: f32, gu
 * (2n, hidden), gate rows then up rows, and dn (hidden, n); or MXFP4 (i0 and n multiples of
 * 32), gu_q/gu_s (2n rows of hidden) and dn_q/dn_s (hidden rows of n); gu_b (2n) their
 * biases, gate then up. Rows past the intermediate size are zero.
 */
struct dps_gptoss_expert {
	float *gu, *dn;
	uint8_t *gu_q, *gu_s, *dn_q, *dn_s;
	float *gu_b;
};

/*
 * Whether layer l's experts are stored as MXFP4 (its *_blocks present): 1 or 0, or -EINVAL
 * with a message when they are but config.json has no quantization_config.
 */
int dps_gptoss_experts_mxfp4(struct dps_ckpt *ck, int l, char *err, size_t errlen);

/* Reads expert e of layer l (rows [i0, i0 + n), mxfp4 from dps_gptoss_experts_mxfp4) into
 * dst. 0 or a negative code with a message. */
int dps_gptoss_expert_read(struct dps_ckpt *ck, int l, int e, int64_t i0, int n, int mxfp4,
			   const struct dps_gptoss_expert *dst, char *err, size_t errlen);

#endif
