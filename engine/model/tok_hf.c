/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_hf.c - tokenizer.json (see tok_hf.h). This build does not read the format
 * yet: loading refuses it by name, so a model that has only tokenizer.json takes token ids.
 */
#include <errno.h>
#include <stdio.h>

#include "engine/model/tok.h"
#include "engine/model/tok_hf.h"

int dps_tok_hf_load(struct dps_tok_hf **out, const char *json_path, const char *config_path,
		    char *err, size_t errlen)
{
	*out = NULL;
	snprintf(err, errlen, "%s: tokenizer.json is not supported by this build", json_path);
	return -EINVAL;
}

int dps_tok_hf_load_mem(struct dps_tok_hf **out, const char *json, size_t len,
			const char *config, size_t config_len, char *err, size_t errlen)
{
	*out = NULL;
	snprintf(err, errlen, "tokenizer.json is not supported by this build");
	return -EINVAL;
}

void dps_tok_hf_free(struct dps_tok_hf *t)
{
}

int dps_tok_hf_vocab_size(const struct dps_tok_hf *t)
{
	return 0;
}

size_t dps_tok_hf_max_piece(const struct dps_tok_hf *t)
{
	return 0;
}

int dps_tok_hf_token_id(const struct dps_tok_hf *t, const char *piece, size_t len)
{
	return -1;
}

int dps_tok_hf_is_special(const struct dps_tok_hf *t, int id)
{
	return 0;
}

int dps_tok_hf_encode(const struct dps_tok_hf *t, const char *text, size_t len, unsigned flags,
		      size_t max_ids, int **ids, size_t *n)
{
	return -EINVAL;
}

int dps_tok_hf_decode(const struct dps_tok_hf *t, const int *ids, size_t n, unsigned flags,
		      char **text, size_t *len)
{
	return -EINVAL;
}
