/* SPDX-License-Identifier: MIT */
/*
 * engine/model/convert.h - importers of foreign checkpoint formats into the native one
 * (config.json + model.safetensors). Used by `dpshard convert`.
 */
#ifndef DPS_ENGINE_CONVERT_H
#define DPS_ENGINE_CONVERT_H

#include <stddef.h>

#include "engine/model/ckpt.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

/* Bytes of a llama2.c checkpoint's header: dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 * vocab_size (negative: an untied classifier follows) and seq_len, each an int32. */
#define DPS_LLAMA2C_HEADER_BYTES 28

/* A foreign checkpoint as the native writer takes it (from dps_convert_llama2c_mem). */
struct dps_convert_model {
	struct dps_model_config cfg;
	struct dps_st_writer_tensor *tensors; /* (n_tensors) data points into the caller's buffer */
	int n_tensors;
};

/*
 * Imports a llama2.c checkpoint (legacy version-0 format: seven int32 header fields, then
 * float32 weights; a negative vocab_size means an untied classifier follows) and its
 * tokenizer.bin into outdir (created if missing): config.json, model.safetensors with Hugging
 * Face tensor names in dtype dt, and tokenizer.bin copied. wq and wk are permuted from
 * llama2.c's adjacent-pair rotary layout to Hugging Face's half-split layout. The file is
 * mapped, not read into memory: only the permuted pages of wq and wk are copied. Returns 0 or
 * a negative code with a message naming the file and the problem (a header field and the rule
 * it breaks, a size that does not match the header, ...); a bad header is refused before
 * outdir is created.
 */
int dps_convert_llama2c(const char *model_path, const char *tokenizer_path, const char *outdir,
			enum dps_st_dtype dt, char *err, size_t errlen);

/*
 * The import step of dps_convert_llama2c without files: buf holds a whole llama2.c checkpoint
 * (len bytes, 4-byte aligned) and is modified: wq and wk are permuted in place. Fills m with
 * the config (llama2.c's BOS 1 and EOS 2, rms_norm_eps 1e-5) and the tensors in dtype dt,
 * their data pointing into buf (valid while buf is). name is the checkpoint in messages.
 * Returns 0, -EINVAL with a message naming the header field and the rule it breaks (or the
 * size the header implies against len), or -ENOMEM. Free m with dps_convert_model_free.
 */
int dps_convert_llama2c_mem(void *buf, size_t len, enum dps_st_dtype dt, const char *name,
			    struct dps_convert_model *m, char *err, size_t errlen);
void dps_convert_model_free(struct dps_convert_model *m);

#endif
