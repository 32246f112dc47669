/* SPDX-License-Identifier: MIT */
/*
 * engine/api/openai.c - the completions body parser of openai.h. Outside input: every field is
 * type- and range-checked, sizes are bounded before anything is allocated from them.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/api/openai.h"
#include "engine/api/request.h"

#define MAX_PROMPT_IDS (1 << 20)
#define MAX_TEXT (4u << 20)

static int bad(char *err, size_t errlen, const char *fmt, const char *name)
{
	snprintf(err, errlen, fmt, name);
	return 400;
}

/* The request parser's field checks (request.h), answered with 400. */
static int get_int(json_t *v, const char *name, long lo, long hi, long *out, char *err,
		   size_t errlen)
{
	return dps_json_int(v, name, lo, hi, out, err, errlen) ? 400 : 0;
}

static int get_num(json_t *v, const char *name, double lo, double hi, double *out, char *err,
		   size_t errlen)
{
	return dps_json_num(v, name, lo, hi, out, err, errlen) ? 400 : 0;
}

/* The prompt: text, a list of ids, or a list holding one of either. */
static int get_prompt(json_t *v, const struct dps_oai_limits *lim, struct dps_oai_req *out,
		      char *err, size_t errlen)
{
	if (json_is_array(v) && json_array_size(v) == 1 &&
	    (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0))))
		v = json_array_get(v, 0); /* ["text"] or [[ids]]: one prompt */
	if (json_is_string(v)) {
		const size_t n = json_string_length(v);
		size_t got = 0;

		if (!lim->tok)
			return bad(err, errlen, "\"%s\" is text but the model has no tokenizer: give "
				   "a list of token ids", "prompt");
		if (n > MAX_TEXT) {
			snprintf(err, errlen, "\"prompt\" is longer than %u bytes", MAX_TEXT);
			return 400;
		}
		out->prompt = malloc(sizeof(int) * (n * 2 + 8));
		if (!out->prompt)
			return -ENOMEM;
		if (dps_tokenizer_encode(lim->tok, json_string_value(v), n, DPS_TOKENIZER_BOS,
					 out->prompt, n * 2 + 8, &got))
			return bad(err, errlen, "cannot encode \"%s\"", "prompt");
		out->n_prompt = (int)got;
		return 0;
	}
	if (json_is_array(v)) {
		const size_t n = json_array_size(v);
		long id;
		int rc;

		if (!n)
			return bad(err, errlen, "\"%s\" is empty", "prompt");
		if (json_is_array(json_array_get(v, 0)) || json_is_string(json_array_get(v, 0)))
			return bad(err, errlen, "\"%s\": one prompt per request (n = 1)", "prompt");
		if (n > MAX_PROMPT_IDS) {
			snprintf(err, errlen, "\"prompt\" has more than %d token ids", MAX_PROMPT_IDS);
			return 400;
		}
		out->prompt = malloc(sizeof(int) * (n + 1));
		if (!out->prompt)
			return -ENOMEM;
		out->n_prompt = 0;
		for (size_t i = 0; i < n; i++) {
			rc = get_int(json_array_get(v, i), "prompt", 0, lim->vocab - 1, &id, err,
				     errlen);
			if (rc) {
				snprintf(err, errlen, "\"prompt\"[%zu] is not a token id of this model "
					 "(0 to %d)", i, lim->vocab - 1);
				return rc;
			}
			if (i == 0 && id != lim->bos)
				out->prompt[out->n_prompt++] = lim->bos;
			out->prompt[out->n_prompt++] = (int)id;
		}
		return 0;
	}
	return bad(err, errlen, "\"%s\" must be a string or a list of token ids", "prompt");
}

static int add_stop(struct dps_oai_req *out, json_t *s, char *err, size_t errlen)
{
	const size_t n = json_string_length(s);

	if (!json_is_string(s))
		return bad(err, errlen, "\"%s\" must be a string or a list of strings", "stop");
	if (!n || n > DPS_OAI_STOP_BYTES || memchr(json_string_value(s), 0, n)) {
		snprintf(err, errlen, "a \"stop\" string must have 1 to %d bytes and no NUL",
			 DPS_OAI_STOP_BYTES);
		return 400;
	}
	if (out->n_stop == DPS_OAI_MAX_STOP) {
		snprintf(err, errlen, "at most %d \"stop\" strings", DPS_OAI_MAX_STOP);
		return 400;
	}
	out->stop[out->n_stop] = malloc(n + 1);
	if (!out->stop[out->n_stop])
		return -ENOMEM;
	memcpy(out->stop[out->n_stop], json_string_value(s), n + 1);
	out->n_stop++;
	return 0;
}

/* A field the engine cannot honour: fine at its neutral value, refused otherwise. */
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
		return -1; /* not such a field */
	if (!ok) {
		snprintf(err, errlen, "\"%s\" is not supported by this server (leave it out, or give "
			 "its neutral value)", key);
		return 400;
	}
	return 0;
}

int dps_oai_parse(const char *body, size_t len, const struct dps_oai_limits *lim,
		  struct dps_oai_req *out, char *err, size_t errlen)
{
	json_error_t je;
	json_t *root, *v;
	const char *key;
	long l;
	double d;
	int rc = 0, have_prompt = 0, ignore_eos = 0;

	memset(out, 0, sizeof(*out));
	out->p.max_tokens = lim->default_max_tokens > 0 ? lim->default_max_tokens : 16;
	out->p.sampling.temperature = 1.0f;
	out->p.sampling.top_p = 1.0f;
	out->p.deadline_ns = (uint64_t)lim->default_timeout_ms * 1000000ull;
	root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		snprintf(err, errlen, "the body is not JSON: %s (line %d, column %d)", je.text,
			 je.line, je.column);
		return 400;
	}
	if (!json_is_object(root)) {
		json_decref(root);
		return bad(err, errlen, "the body must be a JSON %s", "object");
	}
	json_object_foreach(root, key, v) {
		int nr = neutral(key, v, err, errlen);

		if (nr >= 0) {
			rc = nr;
		} else if (json_is_null(v) && strcmp(key, "prompt")) {
			continue; /* null: the default, as in the OpenAI API */
		} else if (!strcmp(key, "model")) {
			if (!json_is_string(v) || json_string_length(v) >= sizeof(out->model))
				rc = bad(err, errlen, "\"%s\" must be a model name", key);
			else
				snprintf(out->model, sizeof(out->model), "%s", json_string_value(v));
		} else if (!strcmp(key, "prompt")) {
			rc = get_prompt(v, lim, out, err, errlen);
			have_prompt = 1;
		} else if (!strcmp(key, "max_tokens")) {
			rc = get_int(v, key, 1, 1 << 24, &l, err, errlen);
			out->p.max_tokens = (int)l;
		} else if (!strcmp(key, "temperature")) {
			rc = get_num(v, key, 0, 2, &d, err, errlen);
			out->p.sampling.temperature = (float)d;
		} else if (!strcmp(key, "top_p")) {
			rc = get_num(v, key, 1e-9, 1, &d, err, errlen);
			out->p.sampling.top_p = (float)d;
		} else if (!strcmp(key, "top_k")) {
			rc = get_int(v, key, -1, 1 << 24, &l, err, errlen);
			out->p.sampling.top_k = l < 0 ? 0 : (int)l;
		} else if (!strcmp(key, "seed")) {
			rc = get_int(v, key, INT64_MIN / 2, INT64_MAX / 2, &l, err, errlen);
			out->p.sampling.seed = (uint64_t)l;
			out->has_seed = 1;
		} else if (!strcmp(key, "stream")) {
			if (!json_is_boolean(v))
				rc = bad(err, errlen, "\"%s\" must be true or false", key);
			out->stream = json_is_true(v);
		} else if (!strcmp(key, "stream_options")) {
			json_t *u = json_object_get(v, "include_usage");

			if (!json_is_object(v) || (u && !json_is_boolean(u)))
				rc = bad(err, errlen, "\"%s\" must be {\"include_usage\": true|false}",
					 key);
			out->include_usage = u && json_is_true(u);
		} else if (!strcmp(key, "stop")) {
			if (json_is_array(v)) {
				for (size_t i = 0; i < json_array_size(v) && !rc; i++)
					rc = add_stop(out, json_array_get(v, i), err, errlen);
			} else {
				rc = add_stop(out, v, err, errlen);
			}
		} else if (!strcmp(key, "stop_token_ids")) {
			const size_t n = json_array_size(v);

			if (!json_is_array(v) || n > DPS_MAX_STOP - 2) {
				snprintf(err, errlen, "\"stop_token_ids\" must be a list of at most %d "
					 "token ids", DPS_MAX_STOP - 2);
				rc = 400;
			}
			for (size_t i = 0; i < n && !rc; i++) {
				rc = get_int(json_array_get(v, i), key, 0, lim->vocab - 1, &l, err,
					     errlen);
				out->p.stop[out->p.n_stop++] = (int)l;
			}
		} else if (!strcmp(key, "ignore_eos")) {
			if (!json_is_boolean(v))
				rc = bad(err, errlen, "\"%s\" must be true or false", key);
			ignore_eos = json_is_true(v);
		} else if (!strcmp(key, "timeout_ms")) {
			rc = get_int(v, key, 1, 1L << 40, &l, err, errlen);
			out->p.deadline_ns = (uint64_t)l * 1000000ull;
		}
		/* anything else: ignored, as vLLM does */
		if (rc)
			break;
	}
	json_decref(root);
	if (!rc && out->n_stop && !lim->tok)
		rc = bad(err, errlen, "\"%s\" strings need a tokenizer to read the text: this model "
			 "has none (use \"stop_token_ids\")", "stop");
	if (!rc && !have_prompt)
		rc = bad(err, errlen, "the request has no \"%s\"", "prompt");
	if (!rc && out->n_prompt >= lim->max_model_len) {
		snprintf(err, errlen, "the prompt has %d tokens; this model's maximum context length "
			 "is %d tokens", out->n_prompt, lim->max_model_len);
		rc = 400;
	}
	if (!rc && (long)out->n_prompt + out->p.max_tokens > lim->max_model_len) {
		snprintf(err, errlen, "this model's maximum context length is %d tokens, but %d were "
			 "asked for (%d in the prompt, %d in the completion): lower \"max_tokens\"",
			 lim->max_model_len, out->n_prompt + out->p.max_tokens, out->n_prompt,
			 out->p.max_tokens);
		rc = 400;
	}
	/* The model's end: BOS (llama2.c's convention) and EOS stop a completion (unless
	 * "ignore_eos", vLLM's, for benchmarks that want every completion max_tokens long). */
	if (!rc && !ignore_eos) {
		out->p.stop[out->p.n_stop++] = lim->bos;
		if (lim->eos >= 0 && lim->eos != lim->bos)
			out->p.stop[out->p.n_stop++] = lim->eos;
	}
	return rc;
}

void dps_oai_req_free(struct dps_oai_req *r)
{
	free(r->prompt);
	r->prompt = NULL;
	for (int i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	r->n_stop = 0;
}
