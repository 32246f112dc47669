/* SPDX-License-Identifier: MIT */
/*
 * tools/text.h - a model directory's text side for the commands: its tokenizer (tokenizer.json
 * or tokenizer.bin), its chat template, the ids that end a sequence (config.json's and
 * generation_config.json's eos_token_id; BOS too for llama2.c-format models, as llama2.c's
 * run.c stops there) and the sampling defaults of generation_config.json.
 */
#ifndef DPS_TOOLS_TEXT_H
#define DPS_TOOLS_TEXT_H

#include <stdio.h>

#include "engine/api/request.h"
#include "engine/model/chat.h"
#include "engine/model/model_config.h"
#include "engine/model/tok.h"

struct dps_tool_text {
	struct dps_tok *tok;         /* NULL: the model has none (prompts are ids) */
	struct dps_chat *chat;       /* NULL: no chat template */
	char chat_err[512];          /* why chat is NULL */
	struct dps_gen_config gen;
	int end[DPS_REQ_MAX_END], n_end;
};

/*
 * Opens dir's text side for the model cfg. Returns 0, or 1 after a message on stderr
 * prefixed with "dpshard <who>: " (a tokenizer or template that cannot be read, a bad
 * generation_config.json). A missing tokenizer or template is not an error.
 */
int dps_tool_text_open(struct dps_tool_text *t, const char *who, const char *dir,
		       const struct dps_model_config *cfg);
void dps_tool_text_close(struct dps_tool_text *t);
/*
 * The commands that need a tokenizer (tokenize, detokenize, bench tokenize): *model (NULL: the
 * default model, its path written into defdir), its config into cfg, and its text side, which
 * must have a tokenizer. 0, or 1 after a message.
 */
int dps_tool_text_open_model(struct dps_tool_text *tt, const char *who, const char **model,
			     char *defdir, size_t len, struct dps_model_config *cfg);

/* The request limits of t (tokenizer, template, end ids, sampling defaults); the caller sets
 * vocab, max_model_len, default_max_tokens and timeouts. */
void dps_tool_text_limits(const struct dps_tool_text *t, struct dps_req_limits *lim);

/* Whether id ends a sequence. */
int dps_tool_text_is_end(const struct dps_tool_text *t, int id);

/* Writes the text of ids (special tokens left out) to out. Returns 0 or -ENOMEM. */
int dps_tool_print_text(FILE *out, const struct dps_tok *tok, const int *ids, size_t n);


#endif
