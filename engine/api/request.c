/* SPDX-License-Identifier: MIT */
/*
 * engine/api/request.c - the request parser (see request.h). Called by the HTTP frontend for
 * every completions body and by `generate --requests` for every line.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/json.h"
#include "engine/api/request.h"

#define MAX_PROMPT_IDS (1 << 20)
#define MAX_TEXT (4u << 20)
#define MAX_STOP_IDS (DPS_MAX_STOP - 2) /* room for BOS and EOS */

static int bad(char *err, size_t errlen, const char *fmt, const char *name)
{
	snprintf(err, errlen, fmt, name);
	return -EINVAL;
}

static int text_prompt(json_t *v, const char *name, const struct dps_req_limits *lim,
		       struct dps_request *out, char *err, size_t errlen)
{
	const size_t n = json_string_length(v);
	size_t got = 0;

	if (!lim->tok)
		return bad(err, errlen, "\"%s\" is text but the model has no tokenizer: give a list "
			   "of token ids", name);
	if (n > MAX_TEXT) {
		snprintf(err, errlen, "\"%s\" is longer than %u bytes", name, MAX_TEXT);
		return -EINVAL;
	}
	out->prompt = malloc(sizeof(int) * (n * 2 + 8));
	if (!out->prompt)
		return -ENOMEM;
	if (dps_tok_llama2_encode(lim->tok, json_string_value(v), n, DPS_TOK_LLAMA2_BOS, out->prompt,
				 n * 2 + 8, &got))
		return bad(err, errlen, "cannot encode \"%s\"", name);
	out->n_prompt = (int)got;
	return 0;
}

/* A list of token ids, BOS put first when it is not. */
static int id_prompt(json_t *v, const char *name, const struct dps_req_limits *lim,
		     struct dps_request *out, char *err, size_t errlen)
{
	const size_t n = json_array_size(v);
	long id;

	if (!n)
		return bad(err, errlen, "\"%s\" is empty", name);
	if (n > MAX_PROMPT_IDS) {
		snprintf(err, errlen, "\"%s\" has more than %d token ids", name, MAX_PROMPT_IDS);
		return -EINVAL;
	}
	out->prompt = malloc(sizeof(int) * (n + 1));
	if (!out->prompt)
		return -ENOMEM;
	out->n_prompt = 0;
	for (size_t i = 0; i < n; i++) {
		if (dps_json_int(json_array_get(v, i), name, 0, lim->vocab - 1, &id, err, errlen)) {
			snprintf(err, errlen, "\"%s\"[%zu] is not a token id of this model (0 to %d)",
				 name, i, lim->vocab - 1);
			return -EINVAL;
		}
		if (i == 0 && id != lim->bos)
			out->prompt[out->n_prompt++] = lim->bos;
		out->prompt[out->n_prompt++] = (int)id;
	}
	return 0;
}

/* The prompt: text, a list of ids, or (completions) a list holding one of either. */
static int get_prompt(json_t *v, const char *name, enum dps_req_format fmt,
		      const struct dps_req_limits *lim, struct dps_request *out, char *err,
		      size_t errlen)
{
	if (out->prompt)
		return bad(err, errlen, "give one prompt (\"%s\" came after another)", name);
	if (fmt == DPS_REQ_COMPLETIONS && json_is_array(v) && json_array_size(v) == 1 &&
	    (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0))))
		v = json_array_get(v, 0); /* ["text"] or [[ids]]: one prompt */
	if (json_is_string(v) && strcmp(name, "prompt_ids"))
		return text_prompt(v, name, lim, out, err, errlen);
	if (json_is_array(v)) {
		if (json_is_array(json_array_get(v, 0)) || json_is_string(json_array_get(v, 0)))
			return bad(err, errlen, "\"%s\": one prompt per request (n = 1)", name);
		return id_prompt(v, name, lim, out, err, errlen);
	}
	return bad(err, errlen, strcmp(name, "prompt_ids") ? "\"%s\" must be a string or a list of "
			       "token ids" : "\"%s\" must be a list of token ids", name);
}

static int add_stop(struct dps_request *out, json_t *s, char *err, size_t errlen)
{
	const size_t n = json_string_length(s);

	if (!json_is_string(s))
		return bad(err, errlen, "\"%s\" must be a string or a list of strings", "stop");
	if (!n || n > DPS_REQ_STOP_BYTES || memchr(json_string_value(s), 0, n)) {
		snprintf(err, errlen, "a \"stop\" string must have 1 to %d bytes and no NUL",
			 DPS_REQ_STOP_BYTES);
		return -EINVAL;
	}
	if (out->n_stop == DPS_REQ_MAX_STOP) {
		snprintf(err, errlen, "at most %d \"stop\" strings", DPS_REQ_MAX_STOP);
		return -EINVAL;
	}
	out->stop[out->n_stop] = malloc(n + 1);
	if (!out->stop[out->n_stop])
		return -ENOMEM;
	memcpy(out->stop[out->n_stop], json_string_value(s), n + 1);
	out->n_stop++;
	return 0;
}

/* A completions field the engine cannot honour: fine at its neutral value, refused otherwise;
 * 1 when key is not such a field. */
static int neutral(const char *key, json_t *v, char *err, size_t errlen)
{
	int ok;

	if (json_is_null(v))
		return 0;
	if (!strcmp(key, "echo"))
		ok = json_is_false(v);
	else if (!strcmp(key, "logprobs"))
		ok = json_is_integer(v) && json_integer_value(v) == 0;
	else if (!strcmp(key, "best_of") || !strcmp(key, "n"))
		ok = json_is_integer(v) && json_integer_value(v) == 1;
	else if (!strcmp(key, "presence_penalty") || !strcmp(key, "frequency_penalty"))
		ok = json_is_number(v) && json_number_value(v) == 0;
	else if (!strcmp(key, "suffix"))
		ok = json_is_string(v) && !json_string_length(v);
	else if (!strcmp(key, "logit_bias"))
		ok = json_is_object(v) && !json_object_size(v);
	else
		return 1;
	if (!ok) {
		snprintf(err, errlen, "\"%s\" is not supported by this server (leave it out, or give "
			 "its neutral value)", key);
		return -EINVAL;
	}
	return 0;
}

static int get_bool(json_t *v, const char *key, int *out, char *err, size_t errlen)
{
	if (!json_is_boolean(v))
		return bad(err, errlen, "\"%s\" must be true or false", key);
	*out = json_is_true(v);
	return 0;
}

/* The fields both formats take, with their one set of rules; 1 when key is none of them. */
static int common_field(const char *key, json_t *v, enum dps_req_format fmt,
			const struct dps_req_limits *lim, struct dps_request *out, int *ignore_eos,
			char *err, size_t errlen)
{
	long l;
	double d;
	int rc;

	if (!strcmp(key, "prompt") || (fmt == DPS_REQ_LINE && !strcmp(key, "prompt_ids")))
		return get_prompt(v, key, fmt, lim, out, err, errlen);
	if (!strcmp(key, "max_tokens")) {
		rc = dps_json_int(v, key, 1, 1 << 24, &l, err, errlen);
		out->p.max_tokens = (int)l;
	} else if (!strcmp(key, "temperature")) {
		rc = dps_json_num(v, key, 0, 2, &d, err, errlen);
		out->p.sampling.temperature = (float)d;
	} else if (!strcmp(key, "top_p")) {
		rc = dps_json_num(v, key, 1e-9, 1, &d, err, errlen);
		out->p.sampling.top_p = (float)d;
	} else if (!strcmp(key, "top_k")) {
		/* -1 (vLLM) and 0 (the sampler's own) both mean every token. */
		rc = dps_json_int(v, key, -1, 1 << 24, &l, err, errlen);
		out->p.sampling.top_k = l < 0 ? 0 : (int)l;
	} else if (!strcmp(key, "seed")) {
		rc = dps_json_int(v, key, INT64_MIN / 2, INT64_MAX / 2, &l, err, errlen);
		out->p.sampling.seed = (uint64_t)l;
		out->has_seed = 1;
	} else if (!strcmp(key, "timeout_ms")) {
		rc = dps_json_int(v, key, 1, 1L << 40, &l, err, errlen);
		out->p.deadline_ns = (uint64_t)l * 1000000ull;
	} else if (!strcmp(key, "ignore_eos")) {
		rc = get_bool(v, key, ignore_eos, err, errlen);
	} else if (!strcmp(key, "stop_token_ids") ||
		   (fmt == DPS_REQ_LINE && !strcmp(key, "stop_ids"))) {
		const size_t n = json_array_size(v);

		/* At most MAX_STOP_IDS in all: a line may give both names. */
		if (!json_is_array(v) || n > (size_t)(MAX_STOP_IDS - out->p.n_stop)) {
			snprintf(err, errlen, "\"%s\" must be a list of at most %d token ids%s", key,
				 MAX_STOP_IDS, out->p.n_stop ? " (with the other list of them)" : "");
			return -EINVAL;
		}
		rc = 0;
		for (size_t i = 0; i < n && !rc; i++) {
			rc = dps_json_int(json_array_get(v, i), key, 0, lim->vocab - 1, &l, err, errlen);
			out->p.stop[out->p.n_stop++] = (int)l;
		}
	} else {
		return 1;
	}
	return rc;
}

/* The fields of a completions body alone; 1 when key is none of them. */
static int completions_field(const char *key, json_t *v, struct dps_request *out, char *err,
			     size_t errlen)
{
	int rc = neutral(key, v, err, errlen);

	if (rc <= 0)
		return rc;
	if (!strcmp(key, "model")) {
		if (!json_is_string(v) || json_string_length(v) >= sizeof(out->model))
			return bad(err, errlen, "\"%s\" must be a model name", key);
		snprintf(out->model, sizeof(out->model), "%s", json_string_value(v));
		return 0;
	}
	if (!strcmp(key, "stream"))
		return get_bool(v, key, &out->stream, err, errlen);
	if (!strcmp(key, "stream_options")) {
		json_t *u = json_object_get(v, "include_usage");

		if (!json_is_object(v) || (u && !json_is_boolean(u)))
			return bad(err, errlen, "\"%s\" must be {\"include_usage\": true|false}", key);
		out->include_usage = u && json_is_true(u);
		return 0;
	}
	if (!strcmp(key, "stop")) {
		if (!json_is_array(v))
			return add_stop(out, v, err, errlen);
		rc = 0;
		for (size_t i = 0; i < json_array_size(v) && !rc; i++)
			rc = add_stop(out, json_array_get(v, i), err, errlen);
		return rc;
	}
	return 1;
}

/* What holds after every field: a prompt, stop strings with a tokenizer, the context. */
static int finish(enum dps_req_format fmt, const struct dps_req_limits *lim,
		  struct dps_request *out, int ignore_eos, char *err, size_t errlen)
{
	if (!out->prompt)
		return bad(err, errlen, fmt == DPS_REQ_LINE ? "the request has no \"%s\" (or "
			   "\"prompt_ids\")" : "the request has no \"%s\"", "prompt");
	if (out->n_stop && !lim->tok)
		return bad(err, errlen, "\"%s\" strings need a tokenizer to read the text: this model "
			   "has none (use \"stop_token_ids\")", "stop");
	if (lim->max_model_len > 0 && out->n_prompt >= lim->max_model_len) {
		snprintf(err, errlen, "the prompt has %d tokens; this model's maximum context length "
			 "is %d tokens", out->n_prompt, lim->max_model_len);
		return -EINVAL;
	}
	if (lim->max_model_len > 0 && (long)out->n_prompt + out->p.max_tokens > lim->max_model_len) {
		snprintf(err, errlen, "this model's maximum context length is %d tokens, but %d were "
			 "asked for (%d in the prompt, %d in the completion): lower \"max_tokens\"",
			 lim->max_model_len, out->n_prompt + out->p.max_tokens, out->n_prompt,
			 out->p.max_tokens);
		return -EINVAL;
	}
	/* The model's end: BOS (llama2.c's convention) and EOS stop a request, unless
	 * "ignore_eos" (vLLM's, for benchmarks that want every completion max_tokens long). */
	if (!ignore_eos) {
		out->p.stop[out->p.n_stop++] = lim->bos;
		if (lim->eos >= 0 && lim->eos != lim->bos)
			out->p.stop[out->p.n_stop++] = lim->eos;
	}
	return 0;
}

int dps_request_parse(const char *json, size_t len, enum dps_req_format fmt,
		      const struct dps_req_limits *lim, struct dps_request *out, char *err,
		      size_t errlen)
{
	json_error_t je;
	json_t *root, *v;
	const char *key;
	int rc = 0, ignore_eos = 0;

	memset(out, 0, sizeof(*out));
	out->replica = -1;
	out->p.max_tokens = lim->default_max_tokens > 0 ? lim->default_max_tokens : 16;
	out->p.sampling.temperature = lim->default_temperature;
	out->p.sampling.top_p = 1.0f;
	out->p.deadline_ns = (uint64_t)lim->default_timeout_ms * 1000000ull;
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		snprintf(err, errlen, "not JSON: %s (line %d, column %d)", je.text, je.line,
			 je.column);
		return -EINVAL;
	}
	if (!json_is_object(root)) {
		json_decref(root);
		return bad(err, errlen, "the request must be a JSON %s", "object");
	}
	json_object_foreach(root, key, v) {
		if (json_is_null(v) && fmt == DPS_REQ_COMPLETIONS && strcmp(key, "prompt"))
			continue; /* null: the default, as in the OpenAI API */
		rc = common_field(key, v, fmt, lim, out, &ignore_eos, err, errlen);
		if (rc == 1 && fmt == DPS_REQ_COMPLETIONS) {
			rc = completions_field(key, v, out, err, errlen);
			if (rc == 1)
				rc = 0; /* anything else: ignored, as vLLM does */
		} else if (rc == 1 && !strcmp(key, "replica")) {
			long l;

			rc = dps_json_int(v, key, 0, 1 << 20, &l, err, errlen);
			out->replica = (int)l;
		} else if (rc == 1) {
			snprintf(err, errlen, "unknown field \"%.64s\"", key);
			rc = -EINVAL;
		}
		if (rc)
			break;
	}
	json_decref(root);
	if (!rc)
		rc = finish(fmt, lim, out, ignore_eos, err, errlen);
	return rc;
}

void dps_request_free(struct dps_request *r)
{
	free(r->prompt);
	r->prompt = NULL;
	r->n_prompt = 0;
	for (int i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	r->n_stop = 0;
}
