/* SPDX-License-Identifier: MIT */
/*
 * tools/text.c - a model directory's tokenizer, chat template, end ids and sampling defaults
 * for generate, serve, tokenize and detokenize (see text.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cmd.h"
#include "tools/text.h"

/* Adds id to the end ids; -1 when there is no room (the caller says so: a dropped end id
 * would let a sequence run past its end). */
static int add_end(struct dps_tool_text *t, int id)
{
	for (int i = 0; i < t->n_end; i++)
		if (t->end[i] == id)
			return 0;
	if (t->n_end == DPS_REQ_MAX_END)
		return -1;
	t->end[t->n_end++] = id;
	return 0;
}

int dps_tool_text_open(struct dps_tool_text *t, const char *who, const char *dir,
		       const struct dps_model_config *cfg)
{
	char err[1024];
	int rc;

	memset(t, 0, sizeof(*t));
	rc = dps_tok_open(&t->tok, dir, cfg, err, sizeof(err));
	if (rc && rc != -ENOENT) {
		fprintf(stderr, "dpshard %s: %s\n", who, err);
		return 1;
	}
	rc = dps_gen_config_load(dir, &t->gen, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dpshard %s: %s\n", who, err);
		dps_tool_text_close(t);
		return 1;
	}
	rc = dps_chat_load(&t->chat, dir, t->chat_err, sizeof(t->chat_err));
	if (rc && rc != -ENOENT) {
		fprintf(stderr, "dpshard %s: %s\n", who, t->chat_err);
		dps_tool_text_close(t);
		return 1;
	}
	rc = 0;
	for (int i = 0; i < cfg->n_eos; i++)
		rc |= add_end(t, cfg->eos_ids[i]);
	for (int i = 0; i < t->gen.n_eos; i++) {
		if (t->gen.eos_ids[i] >= cfg->vocab_size) {
			fprintf(stderr, "dpshard %s: %s/generation_config.json: eos_token_id %d is not "
					"below vocab_size %d\n", who, dir, t->gen.eos_ids[i],
				cfg->vocab_size);
			dps_tool_text_close(t);
			return 1;
		}
		rc |= add_end(t, t->gen.eos_ids[i]);
	}
	/* llama2.c's run.c ends a story at BOS; its models and those without a tokenizer keep
	 * that rule (the goldens rely on it). */
	if (!t->tok || dps_tok_kind(t->tok) == DPS_TOK_LLAMA2)
		rc |= add_end(t, cfg->bos_token_id);
	if (rc) {
		fprintf(stderr, "dpshard %s: %s: config.json and generation_config.json name more than "
				"%d different end ids (eos_token_id)\n", who, dir, DPS_REQ_MAX_END);
		dps_tool_text_close(t);
		return 1;
	}
	return 0;
}

void dps_tool_text_close(struct dps_tool_text *t)
{
	dps_tok_free(t->tok);
	dps_chat_free(t->chat);
	memset(t, 0, sizeof(*t));
}

void dps_tool_text_limits(const struct dps_tool_text *t, struct dps_req_limits *lim)
{
	lim->tok = t->tok;
	lim->chat = t->chat;
	memcpy(lim->end, t->end, sizeof(t->end));
	lim->n_end = t->n_end;
	if (t->gen.has_temperature)
		lim->default_temperature = (float)t->gen.temperature;
	if (t->gen.has_top_p)
		lim->default_top_p = (float)t->gen.top_p;
	if (t->gen.has_top_k)
		lim->default_top_k = t->gen.top_k;
}

int dps_tool_text_is_end(const struct dps_tool_text *t, int id)
{
	for (int i = 0; i < t->n_end; i++)
		if (t->end[i] == id)
			return 1;
	return 0;
}

int dps_tool_print_text(FILE *out, const struct dps_tok *tok, const int *ids, size_t n)
{
	char *s;
	size_t l;
	int rc = dps_tok_decode(tok, ids, n, DPS_TOK_SKIP_SPECIAL, &s, &l);

	if (rc)
		return rc;
	fwrite(s, 1, l, out);
	free(s);
	return 0;
}

int dps_tool_text_open_model(struct dps_tool_text *tt, const char *who, const char **model,
			     char *defdir, size_t len, struct dps_model_config *cfg)
{
	char err[512];

	if (!*model) {
		if (dps_default_model(who, defdir, len))
			return 1;
		*model = defdir;
	}
	if (dps_model_config_load(*model, cfg, err, sizeof(err))) {
		fprintf(stderr, "dpshard %s: %s\n", who, err);
		return 1;
	}
	if (dps_tool_text_open(tt, who, *model, cfg))
		return 1;
	if (!tt->tok) {
		fprintf(stderr, "dpshard %s: %s has no tokenizer (tokenizer.json or tokenizer.bin)\n",
			who, *model);
		dps_tool_text_close(tt);
		return 1;
	}
	return 0;
}
