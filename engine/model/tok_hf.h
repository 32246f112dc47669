/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_hf.h - Hugging Face's tokenizer.json, encoded and decoded exactly as the
 * `tokenizers` library (Rust; the npm package `tokenizers` is its official binding) does:
 * added tokens matched in the raw text first, then the normalizer, the pre-tokenizer, the BPE
 * model, the post-processor; decoding through the decoder. tokenizer_config.json, when given,
 * adds what transformers applies on top (add_bos_token / add_eos_token). Every type, and every
 * field that changes the result, that this implementation does not have is refused at load by
 * name. Used through engine/model/tok.h; only tok.c and the tests call this directly.
 */
#ifndef DPS_ENGINE_TOK_HF_H
#define DPS_ENGINE_TOK_HF_H

#include <stddef.h>

struct dps_tok_hf;

/*
 * Loads tokenizer.json at json_path and, when config_path is not NULL, tokenizer_config.json.
 * Returns 0, -ENOENT (json_path missing), -EINVAL (message names the file, the field and the
 * rule, or the unsupported type) or -ENOMEM. Free with dps_tok_hf_free.
 */
int dps_tok_hf_load(struct dps_tok_hf **out, const char *json_path, const char *config_path,
		    char *err, size_t errlen);
/* The same from memory (config may be NULL); for tests and fuzzing. */
int dps_tok_hf_load_mem(struct dps_tok_hf **out, const char *json, size_t len,
			const char *config, size_t config_len, char *err, size_t errlen);
void dps_tok_hf_free(struct dps_tok_hf *t);

int dps_tok_hf_vocab_size(const struct dps_tok_hf *t);
size_t dps_tok_hf_max_piece(const struct dps_tok_hf *t);
int dps_tok_hf_token_id(const struct dps_tok_hf *t, const char *piece, size_t len);
int dps_tok_hf_is_special(const struct dps_tok_hf *t, int id);

/* As dps_tok_encode (tok.h), on valid UTF-8 (tok.c converts invalid bytes first). */
int dps_tok_hf_encode(const struct dps_tok_hf *t, const char *text, size_t len, unsigned flags,
		      size_t max_ids, int **ids, size_t *n);
/* As dps_tok_decode (tok.h). */
int dps_tok_hf_decode(const struct dps_tok_hf *t, const int *ids, size_t n, unsigned flags,
		      char **text, size_t *len);

#endif
