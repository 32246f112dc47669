/* SPDX-License-Identifier: MIT */
/*
 * engine/api/request.c - the request parser (see request.h). Called by the HTTP frontend's
 * worker threads for every completions and chat body and by `generate --requests` for every
 * line.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "common/json.h"
#include "engine/api/request.h"

#define MAX_PROMPT_IDS (1 << 20)
#define MAX_TEXT (4u << 20)
#define MAX_STOP_IDS 6 /* of the request; the model's end ids come on top */
#define MAX_MESSAGES 4096

_Static_assert(MAX_STOP_IDS + DPS_REQ_MAX_END <= DPS_MAX_STOP, "stop ids fit a request");

/* What a body says that is used once every field has been read. */
struct pstate {
	const char *text;             /* a text prompt (in the parsed JSON), or NULL */
	size_t text_len;
	int ignore_eos;
	int add_special;              /* -1: the format's default */
	int max_tokens_set;
	json_t *messages, *tools, *kwargs; /* chat (borrowed from the parsed JSON) */
	int add_generation_prompt, continue_final;
	int tool_choice_none;         /* "tool_choice": "none" */
};

static int bad(char *err, size_t errlen, const char *fmt, const char *name)
{
	snprintf(err, errlen, fmt, name);
	return -EINVAL;
}

/*
 * Encodes a text prompt (when every field is known, so that the bound is): with max_model_len,
 * a text that cannot fit is refused as soon as the encoder knows it, without encoding it all.
 */
static int encode_text(const char *text, size_t n, const char *name, int special,
		       const struct dps_req_limits *lim, struct dps_request *out, char *err,
		       size_t errlen)
{
	size_t max_ids = 0, got = 0;
	int rc;

	if (n > MAX_TEXT) {
		snprintf(err, errlen, "\"%s\" is longer than %u bytes", name, MAX_TEXT);
		return -EINVAL;
	}
	if (lim->max_model_len > 0)
		max_ids = (size_t)(lim->max_model_len > out->p.max_tokens ?
				   lim->max_model_len - out->p.max_tokens : 1);
	rc = dps_tok_encode(lim->tok, text, n, special ? DPS_TOK_ADD_SPECIAL : 0, max_ids,
			    &out->prompt, &got);
	if (rc == -E2BIG) {
		snprintf(err, errlen, "this model's maximum context length is %d tokens, but the "
			 "%s has more than %zu tokens and %d are asked for the completion: shorten "
			 "it, or lower \"max_tokens\"", lim->max_model_len,
			 !strcmp(name, "messages") ? "rendered conversation" : "prompt", max_ids,
			 out->p.max_tokens);
		return -EINVAL;
	}
	if (rc)
		return rc;
	if (!got) {
		free(out->prompt);
		out->prompt = NULL;
		return bad(err, errlen, "\"%s\" encodes to no tokens", name);
	}
	if (got > MAX_PROMPT_IDS) {
		snprintf(err, errlen, "\"%s\" has more than %d tokens", name, MAX_PROMPT_IDS);
		return -EINVAL;
	}
	out->n_prompt = (int)got;
	return 0;
}

static int text_prompt(json_t *v, const char *name, const struct dps_req_limits *lim,
		       struct pstate *ps, char *err, size_t errlen)
{
	if (!lim->tok)
		return bad(err, errlen, "\"%s\" is text but the model has no tokenizer: give a list "
			   "of token ids", name);
	if (json_string_length(v) > MAX_TEXT) {
		snprintf(err, errlen, "\"%s\" is longer than %u bytes", name, MAX_TEXT);
		return -EINVAL;
	}
	ps->text = json_string_value(v);
	ps->text_len = json_string_length(v);
	return 0;
}

/* A list of token ids, used exactly as given (no BOS is added: vLLM's rule). */
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
	out->prompt = malloc(sizeof(int) * n);
	if (!out->prompt)
		return -ENOMEM;
	out->n_prompt = 0;
	for (size_t i = 0; i < n; i++) {
		if (dps_json_int(json_array_get(v, i), name, 0, lim->vocab - 1, &id, err, errlen)) {
			snprintf(err, errlen, "\"%s\"[%zu] is not a token id of this model (0 to %d)",
				 name, i, lim->vocab - 1);
			return -EINVAL;
		}
		out->prompt[out->n_prompt++] = (int)id;
	}
	return 0;
}

/* The prompt: text, a list of ids, or (completions) a list holding one of either. */
static int get_prompt(json_t *v, const char *name, enum dps_req_format fmt,
		      const struct dps_req_limits *lim, struct dps_request *out, struct pstate *ps,
		      char *err, size_t errlen)
{
	if (out->prompt || ps->text)
		return bad(err, errlen, "give one prompt (\"%s\" came after another)", name);
	if (fmt == DPS_REQ_COMPLETIONS && json_is_array(v) && json_array_size(v) == 1 &&
	    (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0))))
		v = json_array_get(v, 0); /* ["text"] or [[ids]]: one prompt */
	if (json_is_string(v) && strcmp(name, "prompt_ids"))
		return text_prompt(v, name, lim, ps, err, errlen);
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

/*
 * Fields of vLLM's and OpenAI's requests that change the output and that this server does not
 * compute: accepted absent, null or at their neutral value, and refused by name otherwise, so
 * that none is ignored in silence. Fields without an effect on the tokens or the text (user,
 * metadata, store, request_id, service_tier, cache_salt: there is no prefix cache) are ignored
 * as vLLM ignores unknown fields.
 */
enum neutral_kind {
	N_NONE,     /* only null: any value asks for something not computed */
	N_FALSE,    /* false */
	N_TRUE,     /* true */
	N_ZERO,     /* 0 (or false) */
	N_ONE,      /* 1 */
	N_EMPTY,    /* "", [] or {} */
	N_TEXT,     /* response_format {"type": "text"}; modalities ["text"] */
};

static const struct {
	const char *key;
	enum neutral_kind kind;
	const char *why; /* what the field asks for */
} unsupported[] = {
	{ "n", N_ONE, "several choices per request" },
	{ "best_of", N_ONE, "several candidates per request" },
	{ "use_beam_search", N_FALSE, "beam search" },
	{ "length_penalty", N_ONE, "beam search's length penalty" },
	{ "echo", N_FALSE, "the prompt echoed in the response" },
	{ "top_logprobs", N_ZERO, "log-probabilities" },
	{ "prompt_logprobs", N_NONE, "the prompt's log-probabilities" },
	{ "return_tokens_as_token_ids", N_FALSE, "log-probabilities' tokens as ids" },
	{ "return_token_ids", N_FALSE, "token ids in the response" },
	{ "suffix", N_EMPTY, "a suffix after the completion" },
	{ "response_format", N_TEXT, "structured output" },
	{ "guided_json", N_NONE, "structured output" },
	{ "guided_regex", N_NONE, "structured output" },
	{ "guided_choice", N_NONE, "structured output" },
	{ "guided_grammar", N_NONE, "structured output" },
	{ "guided_decoding_backend", N_NONE, "structured output" },
	{ "guided_whitespace_pattern", N_NONE, "structured output" },
	{ "structural_tag", N_NONE, "structured output" },
	{ "structured_outputs", N_NONE, "structured output" },
	{ "allowed_token_ids", N_NONE, "a restricted vocabulary" },
	{ "bad_words", N_EMPTY, "banned words" },
	{ "logits_processors", N_NONE, "custom logits processors" },
	{ "include_stop_str_in_output", N_FALSE, "the stop string kept in the text" },
	{ "skip_special_tokens", N_TRUE, "special tokens in the text" },
	{ "spaces_between_special_tokens", N_TRUE, "special tokens joined without spaces" },
	{ "truncate_prompt_tokens", N_NONE, "prompt truncation" },
	{ "prompt_embeds", N_NONE, "prompt embeddings" },
	{ "priority", N_ZERO, "priority scheduling" },
	{ "kv_transfer_params", N_NONE, "disaggregated serving" },
	{ "vllm_xargs", N_NONE, "extension arguments" },
	{ "mm_processor_kwargs", N_EMPTY, "multimodal processing" },
	{ "documents", N_NONE, "documents for the chat template" },
	{ "reasoning_effort", N_NONE, "a reasoning effort" },
	{ "thinking_token_budget", N_NONE, "a thinking budget" },
	{ "include_reasoning", N_TRUE, "reasoning left out of the reply" },
	{ "functions", N_NONE, "function calling" },
	{ "function_call", N_NONE, "function calling" },
	{ "prediction", N_NONE, "predicted outputs" },
	{ "audio", N_NONE, "audio output" },
	{ "modalities", N_TEXT, "output other than text" },
	{ "web_search_options", N_NONE, "web search" },
};

static int is_neutral(enum neutral_kind kind, const char *key, json_t *v)
{
	switch (kind) {
	case N_FALSE:
		return json_is_false(v);
	case N_TRUE:
		return json_is_true(v);
	case N_ZERO:
		return json_is_false(v) || (json_is_number(v) && json_number_value(v) == 0);
	case N_ONE:
		return json_is_number(v) && json_number_value(v) == 1;
	case N_EMPTY:
		return (json_is_string(v) && !json_string_length(v)) ||
		       (json_is_array(v) && !json_array_size(v)) ||
		       (json_is_object(v) && !json_object_size(v));
	case N_TEXT:
		if (!strcmp(key, "modalities"))
			return json_is_array(v) && json_array_size(v) == 1 &&
			       json_is_string(json_array_get(v, 0)) &&
			       !strcmp(json_string_value(json_array_get(v, 0)), "text");
		return json_is_object(v) && json_is_string(json_object_get(v, "type")) &&
		       !strcmp(json_string_value(json_object_get(v, "type")), "text");
	default:
		return 0;
	}
}

/* An HTTP field the engine does not compute: fine at its neutral value, refused otherwise; 1
 * when key is not such a field. */
static int neutral(const char *key, json_t *v, enum dps_req_format fmt, char *err, size_t errlen)
{
	if (json_is_null(v))
		return 0;
	/* "logprobs": a count in completions (0 still asks for the chosen token's), a boolean in
	 * chat (with "top_logprobs"). */
	if (!strcmp(key, "logprobs")) {
		if (fmt == DPS_REQ_CHAT && json_is_false(v))
			return 0;
		snprintf(err, errlen, "\"%s\" is not supported by this server (it does not compute "
			 "log-probabilities): leave it out", key);
		return -EINVAL;
	}
	for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); i++) {
		if (strcmp(key, unsupported[i].key))
			continue;
		if (is_neutral(unsupported[i].kind, key, v))
			return 0;
		snprintf(err, errlen, "\"%s\" is not supported by this server (%s): leave it out, or "
			 "give its neutral value", key, unsupported[i].why);
		return -EINVAL;
	}
	return 1;
}

/*
 * "logit_bias": {"id": bias, ...}, as vLLM reads it: each key a token id of the model, each
 * bias a number clamped to [-100, 100]; an id given twice keeps its last bias.
 */
static int get_logit_bias(json_t *v, const struct dps_req_limits *lim, struct dps_request *out,
			  char *err, size_t errlen)
{
	const char *key;
	json_t *b;

	if (!json_is_object(v))
		return bad(err, errlen, "\"%s\" must be an object of token ids and biases",
			   "logit_bias");
	out->p.n_bias = 0;
	json_object_foreach(v, key, b) {
		char *end;
		long id;
		double d;
		int k;

		errno = 0;
		id = strtol(key, &end, 10);
		if (!*key || *end || errno || id < 0 || id >= lim->vocab) {
			snprintf(err, errlen, "\"logit_bias\": \"%.32s\" is not a token id of this model "
				 "(0 to %d)", key, lim->vocab - 1);
			return -EINVAL;
		}
		if (!json_is_number(b))
			return bad(err, errlen, "\"%s\": each bias must be a number", "logit_bias");
		d = json_number_value(b);
		d = d < -100 ? -100 : d > 100 ? 100 : d;
		for (k = 0; k < out->p.n_bias && out->p.bias[k].id != (int32_t)id; k++)
			;
		if (k == DPS_MAX_BIAS) {
			snprintf(err, errlen, "\"logit_bias\" has more than %d token ids", DPS_MAX_BIAS);
			return -EINVAL;
		}
		out->p.bias[k] = (struct dps_logit_bias){ (int32_t)id, (float)d };
		if (k == out->p.n_bias)
			out->p.n_bias++;
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
			const struct dps_req_limits *lim, struct dps_request *out, struct pstate *ps,
			char *err, size_t errlen)
{
	long l;
	double d;
	int rc;

	if ((fmt != DPS_REQ_CHAT && !strcmp(key, "prompt")) ||
	    (fmt == DPS_REQ_LINE && !strcmp(key, "prompt_ids")))
		return get_prompt(v, key, fmt, lim, out, ps, err, errlen);
	if (!strcmp(key, "max_tokens") ||
	    (fmt == DPS_REQ_CHAT && !strcmp(key, "max_completion_tokens"))) {
		rc = dps_json_int(v, key, 1, 1 << 24, &l, err, errlen);
		out->p.max_tokens = (int)l;
		ps->max_tokens_set = 1;
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
	} else if (!strcmp(key, "min_p")) {
		rc = dps_json_num(v, key, 0, 1, &d, err, errlen);
		out->p.sampling.min_p = (float)d;
	} else if (!strcmp(key, "repetition_penalty")) {
		rc = dps_json_num(v, key, 0, 1e30, &d, err, errlen);
		if (!rc && !(d > 0))
			return bad(err, errlen, "\"%s\" must be greater than 0", key);
		out->p.pen.repetition = (float)d;
	} else if (!strcmp(key, "presence_penalty")) {
		rc = dps_json_num(v, key, -2, 2, &d, err, errlen);
		out->p.pen.presence = (float)d;
	} else if (!strcmp(key, "frequency_penalty")) {
		rc = dps_json_num(v, key, -2, 2, &d, err, errlen);
		out->p.pen.frequency = (float)d;
	} else if (!strcmp(key, "min_tokens")) {
		rc = dps_json_int(v, key, 0, 1 << 24, &l, err, errlen);
		out->p.min_tokens = (int)l;
	} else if (!strcmp(key, "logit_bias")) {
		rc = get_logit_bias(v, lim, out, err, errlen);
	} else if (!strcmp(key, "ignore_eos")) {
		rc = get_bool(v, key, &ps->ignore_eos, err, errlen);
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

/* The fields of a chat body alone; 1 when key is none of them. */
static int chat_field(const char *key, json_t *v, struct pstate *ps, char *err, size_t errlen)
{
	if (!strcmp(key, "messages")) {
		if (!json_is_array(v) || !json_array_size(v) || json_array_size(v) > MAX_MESSAGES) {
			snprintf(err, errlen, "\"%s\" must be a list of 1 to %d messages", key,
				 MAX_MESSAGES);
			return -EINVAL;
		}
		ps->messages = v;
		return 0;
	}
	if (!strcmp(key, "tools")) {
		if (!json_is_array(v))
			return bad(err, errlen, "\"%s\" must be a list of tool definitions", key);
		ps->tools = json_array_size(v) ? v : NULL;
		return 0;
	}
	if (!strcmp(key, "chat_template_kwargs")) {
		if (!json_is_object(v))
			return bad(err, errlen, "\"%s\" must be an object", key);
		ps->kwargs = v;
		return 0;
	}
	if (!strcmp(key, "tool_choice")) {
		if (!json_is_string(v) || (strcmp(json_string_value(v), "none") &&
					   strcmp(json_string_value(v), "auto")))
			return bad(err, errlen, "\"%s\" must be \"none\" (this server does not parse "
				   "tool calls)", key);
		ps->tool_choice_none = !strcmp(json_string_value(v), "none");
		return 0;
	}
	if (!strcmp(key, "add_generation_prompt"))
		return get_bool(v, key, &ps->add_generation_prompt, err, errlen);
	if (!strcmp(key, "continue_final_message"))
		return get_bool(v, key, &ps->continue_final, err, errlen);
	if (!strcmp(key, "chat_template"))
		return bad(err, errlen, "\"%s\" in a request is not supported: the model's own "
			   "template is used", key);
	return 1;
}

/* The fields of an HTTP body alone (completions and chat); 1 when key is none of them. */
static int completions_field(const char *key, json_t *v, enum dps_req_format fmt,
			     struct dps_request *out, struct pstate *ps, char *err, size_t errlen)
{
	int rc = neutral(key, v, fmt, err, errlen);

	if (rc <= 0)
		return rc;
	if (!strcmp(key, "add_special_tokens"))
		return get_bool(v, key, &ps->add_special, err, errlen);
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

/*
 * The messages as vLLM hands them to the template: each an object with a string "role"; a
 * content given as a list of parts becomes the text of its "text" parts joined by newlines
 * (other kinds of part, images and audio, are refused by name); the "arguments" of a tool call
 * given as a JSON string become the object they encode. Returns a new array or NULL (err).
 */
static json_t *chat_messages(json_t *msgs, char *err, size_t errlen)
{
	json_t *out = json_array(), *m;
	size_t i;

	if (!out)
		return NULL;
	json_array_foreach(msgs, i, m) {
		json_t *c, *role = json_object_get(m, "role"), *copy, *calls;

		if (!json_is_object(m) || !json_is_string(role)) {
			snprintf(err, errlen, "\"messages\"[%zu] must be an object with a string "
				 "\"role\"", i);
			goto err;
		}
		copy = json_deep_copy(m);
		if (!copy || json_array_append_new(out, copy))
			goto nomem;
		c = json_object_get(copy, "content");
		if (c && json_is_array(c)) {
			char *text = NULL;
			size_t len = 0, k;
			FILE *o = open_memstream(&text, &len);
			json_t *part;
			int first = 1;

			if (!o)
				goto nomem;
			json_array_foreach(c, k, part) {
				json_t *type = json_object_get(part, "type");
				json_t *t = json_object_get(part, "text");

				if (!json_is_string(type) || strcmp(json_string_value(type), "text") ||
				    !json_is_string(t)) {
					fclose(o);
					free(text);
					snprintf(err, errlen, "\"messages\"[%zu].content[%zu]: only "
						 "{\"type\": \"text\", \"text\": ...} parts are "
						 "supported (this model reads text)", i, k);
					goto err;
				}
				fprintf(o, "%s", first ? "" : "\n");
				fwrite(json_string_value(t), 1, json_string_length(t), o);
				first = 0;
			}
			fclose(o);
			if (json_object_set_new(copy, "content", json_stringn(text, len))) {
				free(text);
				goto nomem;
			}
			free(text);
		} else if (c && !json_is_string(c) && !json_is_null(c)) {
			snprintf(err, errlen, "\"messages\"[%zu].content must be a string or a list of "
				 "text parts", i);
			goto err;
		}
		calls = json_object_get(copy, "tool_calls");
		if (calls && json_is_array(calls)) {
			size_t k;
			json_t *call;

			json_array_foreach(calls, k, call) {
				json_t *fn = json_object_get(call, "function");
				json_t *a = fn ? json_object_get(fn, "arguments") : NULL;
				json_t *parsed;

				if (!a || !json_is_string(a))
					continue;
				parsed = json_loadb(json_string_value(a), json_string_length(a),
						    JSON_DECODE_ANY, NULL);
				if (parsed && json_object_set_new(fn, "arguments", parsed))
					goto nomem;
			}
		}
	}
	return out;
nomem:
	snprintf(err, errlen, "out of memory");
err:
	json_decref(out);
	return NULL;
}

/*
 * continue_final_message, as transformers does it: the rendered text ends right after the
 * final message's content (its trailing whitespace kept when the template kept it).
 */
static int cut_after_final(json_t *msgs, char *text, size_t *len, char *err, size_t errlen)
{
	json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
	const char *c = json_string_value(json_object_get(last, "content"));
	size_t cl, a = 0, b, at;
	const char *hit = NULL, *p;

	if (!c)
		return bad(err, errlen, "\"%s\": the final message has no text to continue",
			   "continue_final_message");
	cl = strlen(c);
	while (a < cl && strchr(" \t\n\r\f\v", c[a]))
		a++;
	b = cl;
	while (b > a && strchr(" \t\n\r\f\v", c[b - 1]))
		b--;
	/* the last occurrence of the stripped content */
	for (p = text; b > a && (p = memmem(p, (size_t)(text + *len - p), c + a, b - a)); p++)
		hit = p;
	if (!hit && b > a)
		return bad(err, errlen, "\"%s\": the final message's content is not in the rendered "
			   "conversation", "continue_final_message");
	at = hit ? (size_t)(hit - text) : *len;
	/* transformers compares rendered[at : at + len(content.lstrip())] with the content as
	 * given: the trailing whitespace is kept only for content without leading whitespace */
	if (a == 0 && at + cl <= *len && !memcmp(text + at, c, cl))
		*len = at + cl;
	else
		*len = at + (b - a);
	text[*len] = '\0';
	return 0;
}

static int render_chat(const struct dps_req_limits *lim, struct dps_request *out,
		       struct pstate *ps, char *err, size_t errlen)
{
	json_t *msgs;
	char *text = NULL;
	size_t len = 0;
	int rc;

	if (!ps->messages)
		return bad(err, errlen, "the request has no \"%s\"", "messages");
	if (!lim->chat)
		return bad(err, errlen, "this model has no chat template (%s), so its messages cannot "
			   "be formatted: use /v1/completions with a prompt",
			   "tokenizer_config.json's chat_template");
	if (!lim->tok)
		return bad(err, errlen, "this model has no tokenizer, so its %s cannot be encoded",
			   "messages");
	if (ps->tools && !ps->tool_choice_none)
		return bad(err, errlen, "\"tools\" with \"tool_choice\" \"auto\" (the default): this "
			   "server does not parse tool calls out of a reply; give \"%s\": \"none\" "
			   "to show the tools to the model all the same", "tool_choice");
	if (ps->add_generation_prompt && ps->continue_final)
		return bad(err, errlen, "\"%s\" and \"add_generation_prompt\" cannot both be true",
			   "continue_final_message");
	msgs = chat_messages(ps->messages, err, errlen);
	if (!msgs)
		return -EINVAL;
	rc = dps_chat_render(lim->chat, msgs, ps->tools, ps->add_generation_prompt, ps->kwargs,
			     (long long)time(NULL), &text, &len, err, errlen);
	if (!rc && ps->continue_final)
		rc = cut_after_final(msgs, text, &len, err, errlen);
	json_decref(msgs);
	if (!rc)
		rc = encode_text(text, len, "messages", ps->add_special > 0, lim, out, err, errlen);
	free(text);
	return rc;
}

/* What holds after every field: a prompt, stop strings with a tokenizer, the context. */
static int finish(enum dps_req_format fmt, const struct dps_req_limits *lim,
		  struct dps_request *out, struct pstate *ps, char *err, size_t errlen)
{
	int rc;

	if (fmt == DPS_REQ_CHAT) {
		if (!ps->max_tokens_set && lim->max_model_len > 0)
			out->p.max_tokens = 1; /* for the bound; the rest of the context below */
		rc = render_chat(lim, out, ps, err, errlen);
		if (rc)
			return rc;
		if (!ps->max_tokens_set && lim->max_model_len > out->n_prompt)
			out->p.max_tokens = lim->max_model_len - out->n_prompt;
	} else if (ps->text) {
		rc = encode_text(ps->text, ps->text_len, "prompt", ps->add_special != 0, lim, out,
				 err, errlen);
		if (rc)
			return rc;
	}
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
	if (out->p.min_tokens > out->p.max_tokens) {
		snprintf(err, errlen, "\"min_tokens\" (%d) must be at most \"max_tokens\" (%d)",
			 out->p.min_tokens, out->p.max_tokens);
		return -EINVAL;
	}
	/* The model's end ids stop a request, unless "ignore_eos" (vLLM's, for benchmarks that
	 * want every completion max_tokens long). */
	if (!ps->ignore_eos)
		for (int i = 0; i < lim->n_end && i < DPS_REQ_MAX_END; i++) {
			int dup = 0;

			for (int k = 0; k < out->p.n_stop; k++)
				dup |= out->p.stop[k] == lim->end[i];
			if (!dup)
				out->p.stop[out->p.n_stop++] = lim->end[i];
		}
	return 0;
}

int dps_request_parse(const char *json, size_t len, enum dps_req_format fmt,
		      const struct dps_req_limits *lim, struct dps_request *out, char *err,
		      size_t errlen)
{
	struct pstate ps = { .add_special = -1, .add_generation_prompt = 1 };
	json_t *root, *v;
	const char *key;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	out->replica = -1;
	out->chat = fmt == DPS_REQ_CHAT;
	out->p.max_tokens = lim->default_max_tokens > 0 ? lim->default_max_tokens : 16;
	out->p.sampling.temperature = lim->default_temperature;
	out->p.sampling.top_p = lim->default_top_p > 0 ? lim->default_top_p : 1.0f;
	out->p.sampling.top_k = lim->default_top_k > 0 ? lim->default_top_k : 0;
	out->p.deadline_ns = (uint64_t)lim->default_timeout_ms * 1000000ull;
	rc = dps_json_load_object(json, len, &root, err, errlen);
	if (rc)
		return rc;
	json_object_foreach(root, key, v) {
		if (json_is_null(v) && fmt != DPS_REQ_LINE && strcmp(key, "prompt") &&
		    strcmp(key, "messages"))
			continue; /* null: the default, as in the OpenAI API */
		rc = common_field(key, v, fmt, lim, out, &ps, err, errlen);
		if (rc == 1 && fmt == DPS_REQ_CHAT)
			rc = chat_field(key, v, &ps, err, errlen);
		if (rc == 1 && fmt != DPS_REQ_LINE) {
			rc = completions_field(key, v, fmt, out, &ps, err, errlen);
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
	if (!rc)
		rc = finish(fmt, lim, out, &ps, err, errlen);
	json_decref(root);
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
