/* SPDX-License-Identifier: MIT */
/*
 * engine/model/quantize.h - INT8 checkpoints: `dpshard quantize IN OUT` writes a checkpoint
 * directory whose linear weights are INT8, which the engine then loads as INT8 without
 * --quantization (and the one-rank model and `--dtype f32` read as their exact f32 values).
 *
 * The format, in safetensors beside Hugging Face's names: every linear weight X.weight (the
 * q/k/v/o, gate/up/down projections, lm_head and an Eagle3 draft's fc) becomes X.weight, I8,
 * shape (n, K) as before, the signed values in column order, and X.weight_scale, F16, shape
 * (n, ceil(K / 32)), the scale of each block of 32 columns (kernels/q8.h's rule: d = F16(max
 * |v| / 127), q = clamp(rne(v / d), -127, 127), value = q * d). Every other tensor (the
 * embedding, norms, biases, the router, GPT-OSS's experts, MXFP4 or not) is copied as it is.
 * config.json is the input's with quantization_config {"quant_method": "dpshard_int8",
 * "block_size": 32, "scale_dtype": "float16"} (and "mxfp4_experts": true when GPT-OSS's
 * experts are MXFP4); the tokenizer and the other files are copied.
 */
#ifndef DPS_ENGINE_QUANTIZE_H
#define DPS_ENGINE_QUANTIZE_H

#include <stddef.h>

/* Whether a tensor of this name and number of dimensions is a linear weight quantized. */
int dps_quantize_is_linear(const char *name, int ndim);

/*
 * Writes the INT8 checkpoint of directory in into the new directory out (which must not
 * exist: nothing is overwritten). verbose: a progress line per tensor on stderr. Returns 0,
 * or a negative code with a message in err (-DPS_ECONFIG when in is INT8 already, -EEXIST
 * when out exists); an interrupted run leaves no config.json in out.
 */
int dps_quantize_dir(const char *in, const char *out, int verbose, char *err, size_t errlen);

#endif
