/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_llama2.h - the llama2.c tokenizer (tokenizer.bin: u32 max_token_length, then per
 * token an f32 merge score, an i32 byte length and the bytes). Encoding as llama2.c's run.c:
 * BOS, a dummy-prefix " " for a non-empty prompt, one token per UTF-8 code point found in the
 * vocabulary (else its bytes as <0xNN> byte tokens, id NN + 3), then repeated merges of the
 * adjacent pair whose concatenation is a token with the highest score (leftmost on ties),
 * then EOS if asked. Decoding drops one leading space after BOS and turns <0xNN> into the raw
 * byte. BOS and EOS are the model's bos_token_id and eos_token_id (1 and 2 in llama2.c's
 * files), given at load time. A loaded tokenizer is read-only: threads may share it.
 */
#ifndef DPS_ENGINE_TOK_LLAMA2_H
#define DPS_ENGINE_TOK_LLAMA2_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/model_config.h"

struct dps_tok_llama2 {
	int vocab_size;
	int bos_id, eos_id;  /* the model's bos_token_id and eos_token_id */
	unsigned max_token_length;
	char **vocab;        /* (vocab_size) NUL-terminated pieces */
	uint32_t *vocab_len; /* (vocab_size) piece lengths */
	float *scores;       /* (vocab_size) */
	int *sorted;         /* (vocab_size) ids sorted by piece (then id), for lookup */
	int byte_fallback;   /* 1 when ids 3..258 are <0x00>..<0xFF> */
};

/*
 * Loads path for the model described by cfg: its vocab_size tokens, and bos_token_id and
 * eos_token_id as the ids encode emits and decode recognises (only these three fields are
 * read). Returns 0 or a negative code with a message naming the file (missing, truncated, a
 * length out of range, BOS or EOS outside the vocabulary). Free with dps_tok_llama2_free.
 */
int dps_tok_llama2_load(struct dps_tok_llama2 *t, const char *path,
		       const struct dps_model_config *cfg, char *err, size_t errlen);
/* The same from memory (len bytes); messages say "tokenizer". For tests and fuzzing. */
int dps_tok_llama2_load_mem(struct dps_tok_llama2 *t, const void *buf, size_t len,
			   const struct dps_model_config *cfg, char *err, size_t errlen);
void dps_tok_llama2_free(struct dps_tok_llama2 *t);

/* Id of a piece, or -1. */
int dps_tok_llama2_lookup(const struct dps_tok_llama2 *t, const char *piece, size_t len);

/* Flags of dps_tok_llama2_encode. DPS_TOK_LLAMA2_BOS is 1, so a caller passing 1 asks for BOS. */
enum dps_tok_llama2_flag {
	DPS_TOK_LLAMA2_BOS = 1, /* t->bos_id first */
	DPS_TOK_LLAMA2_EOS = 2, /* t->eos_id last (never merged) */
};

/*
 * Encodes text (UTF-8, len bytes) into ids (capacity cap), with BOS and EOS as flags (a set
 * of DPS_TOK_LLAMA2_*) asks. Stores the count in *n. Returns 0, -ENOSPC when cap is too small,
 * or -ENOMEM.
 */
int dps_tok_llama2_encode(const struct dps_tok_llama2 *t, const char *text, size_t len,
			 unsigned flags, int *ids, size_t cap, size_t *n);

/*
 * The bytes that token `id` adds to the output after token `prev` (one leading space dropped
 * after BOS, t->bos_id; <0xNN> gives the byte). Stores the length in *len; returns a pointer into
 * the tokenizer or into buf (at least 2 bytes). An id outside the vocabulary gives "".
 */
const char *dps_tok_llama2_decode(const struct dps_tok_llama2 *t, int prev, int id, char *buf,
				 size_t *len);

#endif
