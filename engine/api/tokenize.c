/* SPDX-License-Identifier: MIT */
/*
 * engine/api/tokenize.c - POST /tokenize and POST /detokenize (see prep.h), run on the
 * frontend's worker threads. Tokenizing goes through the one request parser, so a prompt is
 * encoded, and a conversation rendered, exactly as a completion or chat request would be.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/json.h"
#include "engine/api/prep.h"

static int bad(char *err, size_t errlen, const char *msg, const char *name)
{
	snprintf(err, errlen, msg, name);
	return -EINVAL;
}

static int model_ok(json_t *root, const char *model_name, char *err, size_t errlen)
{
	json_t *m = json_object_get(root, "model");

	if (m && !json_is_null(m) && (!json_is_string(m) || strcmp(json_string_value(m), model_name))) {
		snprintf(err, errlen, "the model '%.100s' does not exist here (this server has "
			 "'%.100s')", json_is_string(m) ? json_string_value(m) : "?", model_name);
		return -ENOENT;
	}
	return 0;
}

static int detokenize(json_t *root, const struct dps_req_limits *lim, char **resp,
		      size_t *resp_len, char *err, size_t errlen)
{
	json_t *toks = json_object_get(root, "tokens"), *v;
	int *ids;
	size_t n = json_array_size(toks), i, len;
	char *text;
	FILE *o;
	int rc;

	if (!lim->tok)
		return bad(err, errlen, "the model has no tokenizer: %s needs one", "/detokenize");
	if (!json_is_array(toks))
		return bad(err, errlen, "\"%s\" must be a list of token ids", "tokens");
	ids = malloc((n ? n : 1) * sizeof(int));
	if (!ids)
		return -ENOMEM;
	json_array_foreach(toks, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= lim->vocab) {
			snprintf(err, errlen, "\"tokens\"[%zu] is not a token id of this model (0 to "
				 "%d)", i, lim->vocab - 1);
			free(ids);
			return -EINVAL;
		}
		ids[i] = (int)json_integer_value(v);
	}
	rc = dps_tok_decode(lim->tok, ids, n, 0, &text, &len);
	free(ids);
	if (rc)
		return rc;
	o = open_memstream(resp, resp_len);
	if (!o) {
		free(text);
		return -ENOMEM;
	}
	fprintf(o, "{\"prompt\": ");
	dps_json_string(o, text, len);
	fprintf(o, "}\n");
	fclose(o);
	free(text);
	return 0;
}

int dps_tokenize_answer(const char *body, size_t len, const struct dps_req_limits *lim,
			const char *model_name, int detok, char **resp, size_t *resp_len,
			char *err, size_t errlen)
{
	struct dps_req_limits l = *lim;
	struct dps_request r;
	json_t *root, *v;
	FILE *o;
	int rc;

	*resp = NULL;
	*resp_len = 0;
	rc = dps_json_load_object(body, len, &root, err, errlen);
	if (rc)
		return rc;
	rc = model_ok(root, model_name, err, errlen);
	if (!rc && detok) {
		rc = detokenize(root, lim, resp, resp_len, err, errlen);
		json_decref(root);
		return rc;
	}
	v = json_object_get(root, "return_token_strs");
	if (!rc && v && !json_is_false(v) && !json_is_null(v))
		rc = bad(err, errlen, "\"%s\" is not supported by this server", "return_token_strs");
	if (rc) {
		json_decref(root);
		return rc;
	}
	/* The prompt may take the whole context (vLLM's rule for /tokenize). */
	if (l.max_model_len > 0)
		l.max_model_len++;
	l.default_max_tokens = 1;
	rc = dps_request_parse(body, len, json_object_get(root, "messages") ? DPS_REQ_CHAT
									    : DPS_REQ_COMPLETIONS,
			       &l, &r, err, errlen);
	json_decref(root);
	if (rc) {
		dps_request_free(&r);
		return rc;
	}
	o = open_memstream(resp, resp_len);
	if (!o) {
		dps_request_free(&r);
		return -ENOMEM;
	}
	fprintf(o, "{\"count\": %d, \"max_model_len\": %d, \"tokens\": [", r.n_prompt,
		lim->max_model_len);
	for (int i = 0; i < r.n_prompt; i++)
		fprintf(o, "%s%d", i ? ", " : "", r.prompt[i]);
	fprintf(o, "], \"token_strs\": null}\n");
	fclose(o);
	dps_request_free(&r);
	return 0;
}
