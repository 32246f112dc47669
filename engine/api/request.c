/* SPDX-License-Identifier: MIT */
/*
 * engine/api/request.c - the request parser (see request.h): the prompts (one, or a list of
 * them in completions), chat rendering and what holds after every field; request_fields.c
 * reads the other fields. Called by the HTTP frontend's worker threads for every completions
 * and chat body and by `generate --requests` for every line.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "common/json.h"
#include "engine/api/request_int.h"

#define MAX_PROMPT_IDS (1 << 20)
#define MAX_TEXT (4u << 20)

_Static_assert(DPS_REQ_MAX_STOP_IDS + DPS_REQ_MAX_END <= DPS_MAX_STOP, "stop ids fit a request");

/* Room for n prompts (zeroed: dps_request_free frees what was filled). */
static int add_prompts(struct dps_request *out, size_t n)
{
	out->prompts = calloc(n, sizeof(*out->prompts));
	return out->prompts ? 0 : -ENOMEM;
}

/*
 * Encodes a text prompt into pr (when every field is known, so that the bound is): with
 * max_model_len, a text that cannot fit is refused as soon as the encoder knows it, without
 * encoding it all. name: the prompt's name in messages.
 */
static int encode_text(const char *text, size_t n, const char *name, int special,
		       const struct dps_req_limits *lim, const struct dps_request *out,
		       struct dps_req_prompt *pr, char *err, size_t errlen)
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
			    &pr->ids, &got);
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
	if (!got)
		return dps_req_bad(err, errlen, "\"%s\" encodes to no tokens", name);
	if (got > MAX_PROMPT_IDS) {
		snprintf(err, errlen, "\"%s\" has more than %d tokens", name, MAX_PROMPT_IDS);
		return -EINVAL;
	}
	pr->n = (int)got;
	return 0;
}

/* A list of token ids, used exactly as given (no BOS is added: vLLM's rule). */
static int id_prompt(json_t *v, const char *name, const struct dps_req_limits *lim,
		     struct dps_req_prompt *pr, char *err, size_t errlen)
{
	const size_t n = json_array_size(v);
	long id;

	if (!n)
		return dps_req_bad(err, errlen, "\"%s\" is empty", name);
	if (n > MAX_PROMPT_IDS) {
		snprintf(err, errlen, "\"%s\" has more than %d token ids", name, MAX_PROMPT_IDS);
		return -EINVAL;
	}
	pr->ids = malloc(sizeof(int) * n);
	if (!pr->ids)
		return -ENOMEM;
	pr->n = 0;
	for (size_t i = 0; i < n; i++) {
		if (dps_json_int(json_array_get(v, i), name, 0, lim->vocab - 1, &id, err, errlen)) {
			snprintf(err, errlen, "\"%s\"[%zu] is not a token id of this model (0 to %d)",
				 name, i, lim->vocab - 1);
			return -EINVAL;
		}
		pr->ids[pr->n++] = (int)id;
	}
	return 0;
}

/* The text echo puts before a choice's: the prompt as given, or its ids decoded. */
static int echo_text(const char *text, size_t len, const struct dps_req_limits *lim,
		     struct dps_req_prompt *pr)
{
	if (!text)
		return dps_tok_decode(lim->tok, pr->ids, (size_t)pr->n, DPS_TOK_SKIP_SPECIAL,
				      &pr->text, &pr->text_len);
	pr->text = malloc(len + 1);
	if (!pr->text)
		return -ENOMEM;
	memcpy(pr->text, text, len);
	pr->text[len] = '\0';
	pr->text_len = len;
	return 0;
}

/* One prompt: text (not for "prompt_ids") or a list of token ids. */
static int one_prompt(json_t *v, const char *name, const struct dps_req_limits *lim,
		      struct dps_request *out, struct dps_req_pstate *ps,
		      struct dps_req_prompt *pr, char *err, size_t errlen)
{
	int rc;

	if (json_is_string(v) && strcmp(ps->prompt_key, "prompt_ids")) {
		if (!lim->tok)
			return dps_req_bad(err, errlen, "\"%s\" is text but the model has no "
					   "tokenizer: give a list of token ids", name);
		rc = encode_text(json_string_value(v), json_string_length(v), name,
				 ps->add_special != 0, lim, out, pr, err, errlen);
	} else if (json_is_array(v)) {
		rc = id_prompt(v, name, lim, pr, err, errlen);
	} else {
		return dps_req_bad(err, errlen, strcmp(ps->prompt_key, "prompt_ids") ?
				   "\"%s\" must be a string or a list of token ids" :
				   "\"%s\" must be a list of token ids", name);
	}
	if (!rc && out->echo)
		rc = echo_text(json_is_string(v) ? json_string_value(v) : NULL,
			       json_string_length(v), lim, pr);
	return rc;
}

/*
 * The prompts: one (text or a list of ids), or in completions a list of them, all texts or all
 * id lists (a list holding one is one prompt, as before lists were taken), each its own
 * engine request.
 */
static int read_prompts(enum dps_req_format fmt, const struct dps_req_limits *lim,
			struct dps_request *out, struct dps_req_pstate *ps, char *err,
			size_t errlen)
{
	json_t *v = ps->prompt, *first = json_array_get(v, 0);
	const int batch = json_is_array(v) && (json_is_string(first) || json_is_array(first));
	const size_t n = batch ? json_array_size(v) : 1;
	char name[48];
	int rc;

	if (batch && fmt != DPS_REQ_COMPLETIONS)
		return dps_req_bad(err, errlen, "\"%s\": one prompt per line", ps->prompt_key);
	if (n > DPS_REQ_MAX_CHOICES) {
		snprintf(err, errlen, "\"%s\" has more than %d prompts", ps->prompt_key,
			 DPS_REQ_MAX_CHOICES);
		return -EINVAL;
	}
	rc = add_prompts(out, n);
	for (size_t i = 0; i < n && !rc; i++) {
		json_t *e = batch ? json_array_get(v, i) : v;

		if (batch && json_typeof(e) != json_typeof(first)) {
			snprintf(err, errlen, "\"%s\"[%zu]: a list of prompts must be all strings or "
				 "all lists of token ids", ps->prompt_key, i);
			return -EINVAL;
		}
		if (batch && n > 1)
			snprintf(name, sizeof(name), "%s[%zu]", ps->prompt_key, i);
		else
			snprintf(name, sizeof(name), "%s", ps->prompt_key);
		out->n_prompts++;
		rc = one_prompt(e, name, lim, out, ps, &out->prompts[i], err, errlen);
	}
	return rc;
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
		return dps_req_bad(err, errlen, "\"%s\": the final message has no text to continue",
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
		return dps_req_bad(err, errlen, "\"%s\": the final message's content is not in the rendered "
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
		       struct dps_req_pstate *ps, char *err, size_t errlen)
{
	json_t *msgs;
	char *text = NULL;
	size_t len = 0;
	int rc;

	if (!ps->messages)
		return dps_req_bad(err, errlen, "the request has no \"%s\"", "messages");
	if (!lim->chat)
		return dps_req_bad(err, errlen, "this model has no chat template (%s), so its messages cannot "
			   "be formatted: use /v1/completions with a prompt",
			   "tokenizer_config.json's chat_template");
	if (!lim->tok)
		return dps_req_bad(err, errlen, "this model has no tokenizer, so its %s cannot be encoded",
			   "messages");
	if (ps->tools && !ps->tool_choice_none)
		return dps_req_bad(err, errlen, "\"tools\" with \"tool_choice\" \"auto\" (the default): this "
			   "server does not parse tool calls out of a reply; give \"%s\": \"none\" "
			   "to show the tools to the model all the same", "tool_choice");
	if (ps->add_generation_prompt && ps->continue_final)
		return dps_req_bad(err, errlen, "\"%s\" and \"add_generation_prompt\" cannot both be true",
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
		rc = add_prompts(out, 1);
	if (!rc) {
		out->n_prompts = 1;
		rc = encode_text(text, len, "messages", ps->add_special > 0, lim, out, &out->prompts[0],
				 err, errlen);
	}
	free(text);
	return rc;
}

/* One prompt within the context, and what asks for more than that prompt's room. */
static int fits(const struct dps_req_limits *lim, const struct dps_request *out,
		const struct dps_req_prompt *pr, char *err, size_t errlen)
{
	if (lim->max_model_len > 0 && pr->n >= lim->max_model_len) {
		snprintf(err, errlen, "the prompt has %d tokens; this model's maximum context length "
			 "is %d tokens", pr->n, lim->max_model_len);
		return -EINVAL;
	}
	if (lim->max_model_len > 0 && (long)pr->n + out->p.max_tokens > lim->max_model_len) {
		snprintf(err, errlen, "this model's maximum context length is %d tokens, but %d were "
			 "asked for (%d in the prompt, %d in the completion): lower \"max_tokens\"",
			 lim->max_model_len, pr->n + out->p.max_tokens, pr->n, out->p.max_tokens);
		return -EINVAL;
	}
	return 0;
}

/* "n", "best_of", "echo" and the log-probabilities, once all are known. */
static int choices(enum dps_req_format fmt, const struct dps_req_limits *lim,
		   struct dps_request *out, struct dps_req_pstate *ps, char *err, size_t errlen)
{
	if (ps->best_of && ps->best_of != out->n) {
		snprintf(err, errlen, "\"best_of\" (%ld) other than \"n\" (%d) is not supported by "
			 "this server (several candidates per request, the best kept): leave it out",
			 ps->best_of, out->n);
		return -EINVAL;
	}
	if (fmt == DPS_REQ_CHAT) {
		if (ps->top_logprobs > 0 && !ps->chat_logprobs)
			return dps_req_bad(err, errlen, "\"%s\" needs \"logprobs\": true",
					   "top_logprobs");
		out->p.want_logprobs = ps->chat_logprobs;
		out->p.top_logprobs = ps->chat_logprobs && ps->top_logprobs > 0 ?
				      (int)ps->top_logprobs : 0;
	} else if (ps->logprobs >= 0) {
		out->p.want_logprobs = 1;
		out->p.top_logprobs = (int)ps->logprobs;
	}
	if (out->echo && !lim->tok)
		return dps_req_bad(err, errlen, "\"%s\" needs a tokenizer to give the prompt's text: "
				   "this model has none", "echo");
	if (out->p.max_tokens == 0 && !out->echo)
		return dps_req_bad(err, errlen, "\"%s\" 0 needs \"echo\": true (the prompt alone): "
				   "give at least 1", fmt == DPS_REQ_CHAT && ps->max_tokens_set == 2 ?
				   "max_completion_tokens" : "max_tokens");
	/* echo with logprobs: the prompt's tokens' log-probabilities too (vLLM's answer). */
	if (out->echo && out->p.want_logprobs) {
		if (out->stream)
			return dps_req_bad(err, errlen, "\"%s\" with \"echo\" and \"logprobs\" is not "
					   "supported by this server (the prompt's log-probabilities "
					   "are given in a whole body): leave one of them out",
					   "stream");
		out->p.prompt_logprobs = 1;
	}
	return 0;
}

/* What holds after every field: a prompt, stop strings with a tokenizer, the context. */
static int finish(enum dps_req_format fmt, const struct dps_req_limits *lim,
		  struct dps_request *out, struct dps_req_pstate *ps, char *err, size_t errlen)
{
	int rc = choices(fmt, lim, out, ps, err, errlen);

	if (rc)
		return rc;
	if (fmt == DPS_REQ_CHAT) {
		if (!ps->max_tokens_set && lim->max_model_len > 0)
			out->p.max_tokens = 1; /* for the bound; the rest of the context below */
		rc = render_chat(lim, out, ps, err, errlen);
		if (rc)
			return rc;
		if (!ps->max_tokens_set && lim->max_model_len > out->prompts[0].n)
			out->p.max_tokens = lim->max_model_len - out->prompts[0].n;
	} else if (ps->prompt) {
		rc = read_prompts(fmt, lim, out, ps, err, errlen);
		if (rc)
			return rc;
	}
	if (!out->n_prompts)
		return dps_req_bad(err, errlen, fmt == DPS_REQ_LINE ? "the request has no \"%s\" (or "
				   "\"prompt_ids\")" : "the request has no \"%s\"", "prompt");
	out->prompt = out->prompts[0].ids;
	out->n_prompt = out->prompts[0].n;
	if ((long)out->n_prompts * out->n > DPS_REQ_MAX_CHOICES) {
		snprintf(err, errlen, "%d prompts with \"n\" %d ask for more than %d choices",
			 out->n_prompts, out->n, DPS_REQ_MAX_CHOICES);
		return -EINVAL;
	}
	if (out->n_stop && !lim->tok)
		return dps_req_bad(err, errlen, "\"%s\" strings need a tokenizer to read the text: "
				   "this model has none (use \"stop_token_ids\")", "stop");
	for (int i = 0; i < out->n_prompts; i++) {
		rc = fits(lim, out, &out->prompts[i], err, errlen);
		if (rc)
			return rc;
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
	struct dps_req_pstate ps = { .add_special = -1, .add_generation_prompt = 1,
				     .top_logprobs = -1, .logprobs = -1 };
	json_t *root, *v;
	const char *key;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	out->replica = -1;
	out->n = 1;
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
		if ((fmt != DPS_REQ_CHAT && !strcmp(key, "prompt")) ||
		    (fmt == DPS_REQ_LINE && !strcmp(key, "prompt_ids"))) {
			/* read in finish(), when the fields it depends on are known */
			rc = ps.prompt ? dps_req_bad(err, errlen, "give one prompt (\"%s\" came "
						     "after another)", key) : 0;
			ps.prompt = v;
			ps.prompt_key = key;
		} else {
			rc = dps_req_field_common(key, v, fmt, lim, out, &ps, err, errlen);
		}
		if (rc == 1 && fmt == DPS_REQ_CHAT)
			rc = dps_req_field_chat(key, v, &ps, err, errlen);
		if (rc == 1 && fmt != DPS_REQ_LINE) {
			rc = dps_req_field_http(key, v, fmt, out, &ps, err, errlen);
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
	for (int i = 0; i < r->n_prompts; i++) {
		free(r->prompts[i].ids);
		free(r->prompts[i].text);
	}
	free(r->prompts);
	r->prompts = NULL;
	r->n_prompts = 0;
	r->prompt = NULL;
	r->n_prompt = 0;
	for (int i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	r->n_stop = 0;
}
