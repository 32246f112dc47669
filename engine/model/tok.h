/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok.h - a model's tokenizer, whatever its format: text to ids, ids to text, and
 * text streamed one token at a time. Two formats stand behind it:
 *   - Hugging Face's tokenizer.json (with tokenizer_config.json beside it), encoded and decoded
 *     exactly as the `tokenizers` library does (tok_hf.h);
 *   - llama2.c's tokenizer.bin, as llama2.c's run.c encodes (tok_llama2.h).
 * A model directory with tokenizer.json uses it; else tokenizer.bin; else it has no tokenizer.
 *
 * Text handed in is UTF-8. Invalid bytes are read as Rust's String::from_utf8_lossy reads them,
 * which is what the `tokenizers` library sees from a caller that converts bytes lossily: each
 * maximal invalid subsequence becomes one U+FFFD (dps_utf8_lossy, common/utf8.h). Decoded text is always valid UTF-8: a token
 * sequence that ends inside a character (byte-level or byte-fallback pieces) gives U+FFFD there.
 *
 * Called by the request parser (encode, on the frontend's worker thread), the HTTP frontend
 * (streaming decode), `generate`, `tokenize`/`detokenize` and `bench tokenize`. A loaded
 * tokenizer is read-only: threads may share it. A stream belongs to one thread.
 */
#ifndef DPS_ENGINE_TOK_H
#define DPS_ENGINE_TOK_H

#include <stddef.h>

#include "engine/model/model_config.h"

struct dps_tok;        /* opaque */
struct dps_tok_stream; /* opaque */

enum dps_tok_kind {
	DPS_TOK_LLAMA2, /* tokenizer.bin */
	DPS_TOK_HF,     /* tokenizer.json */
};

/* Flags of dps_tok_encode and dps_tok_decode. */
enum dps_tok_flag {
	/* encode: the special tokens of the format, as Hugging Face's add_special_tokens=True:
	 * tokenizer.json's post-processor (and tokenizer_config.json's add_bos_token /
	 * add_eos_token where given), llama2.c's BOS. Without it: the text's own tokens only. */
	DPS_TOK_ADD_SPECIAL = 1,
	/* decode: leave out the special tokens (skip_special_tokens=True) */
	DPS_TOK_SKIP_SPECIAL = 2,
};

/*
 * Opens the tokenizer of model directory dir: tokenizer.json (and tokenizer_config.json when
 * present), else tokenizer.bin (which needs cfg's vocab_size, bos_token_id, eos_token_id).
 * Returns 0; -ENOENT when the directory has neither file (err says so); -EINVAL for a file that
 * cannot be read as its format, or that names a type, field or feature this implementation does
 * not have (the message names it and the file); -ENOMEM. Free with dps_tok_free.
 */
int dps_tok_open(struct dps_tok **out, const char *dir, const struct dps_model_config *cfg,
		 char *err, size_t errlen);
/* A tokenizer.json file (and a tokenizer_config.json, or NULL) by their paths, for tools and
 * tests that do not have a model directory. Returns as dps_tok_open. */
int dps_tok_open_hf(struct dps_tok **out, const char *json_path, const char *config_path,
		    char *err, size_t errlen);
void dps_tok_free(struct dps_tok *t);

enum dps_tok_kind dps_tok_kind(const struct dps_tok *t);
/* One more than the largest id the tokenizer can emit (added tokens included). */
int dps_tok_vocab_size(const struct dps_tok *t);
/* The longest piece in bytes (a token covers at most this many bytes of normalized text). */
size_t dps_tok_max_piece(const struct dps_tok *t);
/* The id of a token written exactly as piece (len bytes; an added token's content, or a vocab
 * entry), or -1. */
int dps_tok_token_id(const struct dps_tok *t, const char *piece, size_t len);
/* 1 when id is a special token (skipped by DPS_TOK_SKIP_SPECIAL), else 0. */
int dps_tok_is_special(const struct dps_tok *t, int id);

/*
 * Encodes len bytes of text with flags (DPS_TOK_ADD_SPECIAL or 0) into *ids (malloc'd, the
 * caller frees) and *n. max_ids > 0 bounds the result: when the encoding would hold more than
 * max_ids ids, returns -E2BIG as soon as that is certain, without encoding the rest (*ids NULL).
 * Returns 0, -E2BIG or -ENOMEM. O(len log len).
 */
int dps_tok_encode(const struct dps_tok *t, const char *text, size_t len, unsigned flags,
		   size_t max_ids, int **ids, size_t *n);

/*
 * Decodes n ids with flags (DPS_TOK_SKIP_SPECIAL or 0) into *text (malloc'd, NUL-terminated,
 * the caller frees) and *len, as the format's decoder does. An id outside the vocabulary
 * decodes to nothing. Returns 0 or -ENOMEM.
 */
int dps_tok_decode(const struct dps_tok *t, const int *ids, size_t n, unsigned flags,
		   char **text, size_t *len);

/*
 * Streaming decode, as the `tokenizers` library's DecodeStream and vLLM's incremental
 * detokenizer do: each step returns the text a new id adds, or nothing while the ids so far end
 * inside a character or a sequence the decoder joins (held back until it completes). The
 * stream is primed with the prompt's ids (n_prompt may be 0), so the first generated token
 * decodes in its context (a leading space that the decoder strips at the start of a text is
 * kept after a prompt). The pieces of every step concatenate to the text of the generated ids.
 * flags: DPS_TOK_SKIP_SPECIAL or 0.
 */
int dps_tok_stream_new(struct dps_tok_stream **out, const struct dps_tok *t, const int *prompt,
		       size_t n_prompt, unsigned flags);
/* Adds id; *text (valid until the next call on s) and *len get the new text (*len may be 0).
 * Returns 0, -ENOMEM, or -EILSEQ when the decoder's text of the window does not start with the
 * text already emitted (the library's InvalidPrefix error; no decoder here does that). Two
 * bounds keep each step cheap whatever the ids: the stream is primed with at most 24 prompt
 * ids, and a window that has not emitted for 64 ids emits its text, U+FFFD included. */
int dps_tok_stream_step(struct dps_tok_stream *s, int id, const char **text, size_t *len);
/* The text still held back (a partial character at the end, decoded with U+FFFD as
 * dps_tok_decode would), for the end of a sequence: the completion's text is then its whole
 * decode (vLLM drops such a tail instead). Returns 0 or -ENOMEM. */
int dps_tok_stream_flush(struct dps_tok_stream *s, const char **text, size_t *len);
void dps_tok_stream_free(struct dps_tok_stream *s);

/*
 * The text ids[0..n) add after prompt[0..n_prompt) as a stream gives it (every step, then the
 * flush), with flags, into *text (malloc'd, NUL-terminated) and *len: what the server sends
 * for a completion. Returns 0 or a negative code.
 */
int dps_tok_stream_text(const struct dps_tok *t, const int *prompt, size_t n_prompt,
			const int *ids, size_t n, unsigned flags, char **text, size_t *len);

#endif
