/* SPDX-License-Identifier: MIT */
/*
 * engine/convert.h - importers of foreign checkpoint formats into the native one
 * (config.json + model.safetensors). Used by `dpshard convert`.
 */
#ifndef DPS_ENGINE_CONVERT_H
#define DPS_ENGINE_CONVERT_H

#include <stddef.h>

#include "engine/safetensors.h"

/*
 * Imports a llama2.c checkpoint (legacy version-0 format: seven int32 header fields, then
 * float32 weights; a negative vocab_size means an untied classifier follows) and its
 * tokenizer.bin into outdir (created if missing): config.json, model.safetensors with Hugging
 * Face tensor names in dtype dt, and tokenizer.bin copied. wq and wk are permuted from
 * llama2.c's adjacent-pair rotary layout to Hugging Face's half-split layout. Returns 0 or a
 * negative code with a message naming the file and the problem.
 */
int dps_convert_llama2c(const char *model_path, const char *tokenizer_path, const char *outdir,
			enum dps_st_dtype dt, char *err, size_t errlen);

#endif
