/* SPDX-License-Identifier: MIT */
/*
 * engine/api/request_fields.c - the request parser's fields (request.h, request_int.h): the
 * sampling fields every format takes, a chat body's own, an HTTP body's own, and the table of
 * fields vLLM and OpenAI honour that this server does not compute, refused by name unless
 * neutral. Called by request.c for every field of a body.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "engine/api/request_int.h"

int dps_req_bad(char *err, size_t errlen, const char *fmt, const char *name)
{
	snprintf(err, errlen, fmt, name);
	return -EINVAL;
}

static int add_stop(struct dps_request *out, json_t *s, char *err, size_t errlen)
{
	const size_t n = json_string_length(s);

	if (!json_is_string(s))
		return dps_req_bad(err, errlen, "\"%s\" must be a string or a list of strings", "stop");
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
	{ "use_beam_search", N_FALSE, "beam search" },
	{ "length_penalty", N_ONE, "beam search's length penalty" },
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
	/* chat's "echo" (the last message before the reply when it has the reply's role) is not
	 * completions' */
	if (fmt == DPS_REQ_CHAT && !strcmp(key, "echo") && !json_is_false(v))
		return dps_req_bad(err, errlen, "\"%s\" is not supported by this server in chat (the "
				   "last message echoed): leave it out", key);
	/* completions' "top_logprobs" is not a field (its "logprobs" is the count) */
	if (fmt != DPS_REQ_CHAT && !strcmp(key, "top_logprobs") && !is_neutral(N_ZERO, key, v))
		return dps_req_bad(err, errlen, "\"%s\" is a field of chat completions: in "
				   "completions give \"logprobs\": k", key);
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
		return dps_req_bad(err, errlen, "\"%s\" must be an object of token ids and biases",
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
			return dps_req_bad(err, errlen, "\"%s\": each bias must be a number", "logit_bias");
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

int dps_req_get_bool(json_t *v, const char *key, int *out, char *err, size_t errlen)
{
	if (!json_is_boolean(v))
		return dps_req_bad(err, errlen, "\"%s\" must be true or false", key);
	*out = json_is_true(v);
	return 0;
}

/* The fields both formats take, with their one set of rules; 1 when key is none of them. */
int dps_req_field_common(const char *key, json_t *v, enum dps_req_format fmt,
			 const struct dps_req_limits *lim, struct dps_request *out,
			 struct dps_req_pstate *ps, char *err, size_t errlen)
{
	long l;
	double d;
	int rc;

	if (!strcmp(key, "max_tokens") ||
	    (fmt == DPS_REQ_CHAT && !strcmp(key, "max_completion_tokens"))) {
		/* 0 only with "echo" (vLLM: the prompt alone), checked once every field is read */
		rc = dps_json_int(v, key, 0, 1 << 24, &l, err, errlen);
		out->p.max_tokens = (int)l;
		ps->max_tokens_set = strcmp(key, "max_tokens") ? 2 : 1; /* 2: by its chat name */
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
			return dps_req_bad(err, errlen, "\"%s\" must be greater than 0", key);
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
		rc = dps_req_get_bool(v, key, &ps->ignore_eos, err, errlen);
	} else if (!strcmp(key, "stop_token_ids") ||
		   (fmt == DPS_REQ_LINE && !strcmp(key, "stop_ids"))) {
		const size_t n = json_array_size(v);

		/* At most DPS_REQ_MAX_STOP_IDS in all: a line may give both names. */
		if (!json_is_array(v) || n > (size_t)(DPS_REQ_MAX_STOP_IDS - out->p.n_stop)) {
			snprintf(err, errlen, "\"%s\" must be a list of at most %d token ids%s", key,
				 DPS_REQ_MAX_STOP_IDS, out->p.n_stop ? " (with the other list of them)" : "");
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
int dps_req_field_chat(const char *key, json_t *v, struct dps_req_pstate *ps, char *err,
		       size_t errlen)
{
	if (!strcmp(key, "messages")) {
		if (!json_is_array(v) || !json_array_size(v) || json_array_size(v) > DPS_REQ_MAX_MESSAGES) {
			snprintf(err, errlen, "\"%s\" must be a list of 1 to %d messages", key,
				 DPS_REQ_MAX_MESSAGES);
			return -EINVAL;
		}
		ps->messages = v;
		return 0;
	}
	if (!strcmp(key, "tools")) {
		if (!json_is_array(v))
			return dps_req_bad(err, errlen, "\"%s\" must be a list of tool definitions", key);
		ps->tools = json_array_size(v) ? v : NULL;
		return 0;
	}
	if (!strcmp(key, "chat_template_kwargs")) {
		if (!json_is_object(v))
			return dps_req_bad(err, errlen, "\"%s\" must be an object", key);
		ps->kwargs = v;
		return 0;
	}
	if (!strcmp(key, "tool_choice")) {
		if (!json_is_string(v) || (strcmp(json_string_value(v), "none") &&
					   strcmp(json_string_value(v), "auto")))
			return dps_req_bad(err, errlen, "\"%s\" must be \"none\" (this server does not parse "
				   "tool calls)", key);
		ps->tool_choice_none = !strcmp(json_string_value(v), "none");
		return 0;
	}
	if (!strcmp(key, "add_generation_prompt"))
		return dps_req_get_bool(v, key, &ps->add_generation_prompt, err, errlen);
	if (!strcmp(key, "continue_final_message"))
		return dps_req_get_bool(v, key, &ps->continue_final, err, errlen);
	if (!strcmp(key, "chat_template"))
		return dps_req_bad(err, errlen, "\"%s\" in a request is not supported: the model's own "
			   "template is used", key);
	return 1;
}

/* The fields of an HTTP body alone (completions and chat); 1 when key is none of them. */
int dps_req_field_http(const char *key, json_t *v, enum dps_req_format fmt,
		       struct dps_request *out, struct dps_req_pstate *ps, char *err,
		       size_t errlen)
{
	int rc = neutral(key, v, fmt, err, errlen);
	long l;

	if (rc <= 0)
		return rc;
	if (!strcmp(key, "add_special_tokens"))
		return dps_req_get_bool(v, key, &ps->add_special, err, errlen);
	if (!strcmp(key, "model")) {
		if (!json_is_string(v) || json_string_length(v) >= sizeof(out->model))
			return dps_req_bad(err, errlen, "\"%s\" must be a model name", key);
		snprintf(out->model, sizeof(out->model), "%s", json_string_value(v));
		return 0;
	}
	if (!strcmp(key, "stream"))
		return dps_req_get_bool(v, key, &out->stream, err, errlen);
	if (!strcmp(key, "n")) {
		rc = dps_json_int(v, key, 1, DPS_REQ_MAX_CHOICES, &l, err, errlen);
		out->n = (int)l;
		return rc;
	}
	if (!strcmp(key, "best_of"))
		return dps_json_int(v, key, 1, DPS_REQ_MAX_CHOICES, &ps->best_of, err, errlen);
	if (!strcmp(key, "echo"))
		return dps_req_get_bool(v, key, &out->echo, err, errlen);
	/* "logprobs": a count in completions (0: the chosen token's alone), a boolean in chat,
	 * with the count in "top_logprobs". */
	if (!strcmp(key, "logprobs")) {
		if (fmt == DPS_REQ_CHAT)
			return dps_req_get_bool(v, key, &ps->chat_logprobs, err, errlen);
		return dps_json_int(v, key, 0, DPS_MAX_LOGPROBS, &ps->logprobs, err, errlen);
	}
	if (fmt == DPS_REQ_CHAT && !strcmp(key, "top_logprobs"))
		return dps_json_int(v, key, 0, DPS_MAX_LOGPROBS, &ps->top_logprobs, err, errlen);
	if (!strcmp(key, "stream_options")) {
		json_t *u = json_object_get(v, "include_usage");

		if (!json_is_object(v) || (u && !json_is_boolean(u)))
			return dps_req_bad(err, errlen, "\"%s\" must be {\"include_usage\": true|false}", key);
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
