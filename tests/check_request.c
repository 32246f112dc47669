/* SPDX-License-Identifier: MIT */
/*
 * tests/check_request.c - Check suite for engine/api/request.c, the one request parser: the
 * same rules in both formats (a completions body and a --requests line) for the ranges of
 * temperature, top_p, top_k (-1 and 0 both mean every token), max_tokens and the stop ids;
 * the defaults each format's caller gives; id prompts used exactly as given (no BOS added);
 * text prompts through the stories260K tokenizer (the golden prompt's ids, BOS only with
 * add_special_tokens), refused without a tokenizer, and refused early when they cannot fit the
 * context; the model's end ids among the stop ids unless ignore_eos; the context limit; chat
 * bodies without a template refused by name;
 * what only one format takes (stream, stop strings, model; replica) and what each does with
 * an unknown field (ignored, as vLLM does; refused). Every refusal names its field. The oracle
 * is the OpenAI/vLLM API as written into each case; a case shows a field out of range is not
 * accepted by accident.
 *
 * vLLM's sampling fields: repetition_penalty, presence_penalty, frequency_penalty, min_p,
 * min_tokens and logit_bias read into the request in both formats with vLLM's ranges (one case
 * each, its bounds refused by name). Every field vLLM or OpenAI honours that this server does
 * not compute (best_of other than n, prompt_logprobs, response_format other than text, guided_*, structured
 * outputs, ...; one loop case per field) is refused by name over HTTP, in completions and
 * chat, and accepted at its neutral value. What is computed: batched prompts (each with the
 * rules of one), "n" (with "best_of" only equal to it), "logprobs" in both shapes, "echo"
 * (the prompt's text kept, or its ids decoded; with logprobs it asks for the prompt's too,
 * not streamed), "max_tokens" 0 only with echo.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/api/request.h"
#include "engine/model/convert.h"
#include "engine/model/model_config.h"
#include "engine/model/tok.h"
#include "tests/testutil.h"

static const struct dps_req_limits lim = { .tok = NULL, .vocab = 512, .end = { 1, 2 },
					   .n_end = 2, .max_model_len = 100,
					   .default_max_tokens = 16, .default_temperature = 1.0f };

/* Parses s in format fmt; returns the code, with the message in err. */
static int parse(const char *s, enum dps_req_format fmt, struct dps_request *r, char *err)
{
	return dps_request_parse(s, strlen(s), fmt, &lim, r, err, 256);
}

/* s is refused in both formats with a message that names `field`. */
static void refused_both(const char *s, const char *field)
{
	for (int f = 0; f < 2; f++) {
		struct dps_request r;
		char err[256] = "";

		ck_assert_msg(parse(s, (enum dps_req_format)f, &r, err) == -EINVAL, "%s accepted", s);
		ck_assert_msg(strstr(err, field), "%s: \"%s\" does not name %s", s, err, field);
		dps_request_free(&r);
	}
}

START_TEST(test_one_set_of_rules)
{
	static const char *const ok[] = {
		"{\"prompt\": [1, 5], \"temperature\": 0}",
		"{\"prompt\": [1, 5], \"temperature\": 2}",
		"{\"prompt\": [1, 5], \"top_k\": -1}",
		"{\"prompt\": [1, 5], \"top_k\": 0}",
		"{\"prompt\": [1, 5], \"top_k\": 40, \"top_p\": 1, \"max_tokens\": 98}",
		"{\"prompt\": [1, 5], \"seed\": -3, \"timeout_ms\": 5}",
		"{\"prompt\": [1, 5], \"stop_token_ids\": [7, 8, 9, 10, 11, 12]}",
	};

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		for (int f = 0; f < 2; f++) {
			struct dps_request r;
			char err[256] = "";

			ck_assert_msg(parse(ok[i], (enum dps_req_format)f, &r, err) == 0, "%s: %s",
				      ok[i], err);
			ck_assert_int_ge(r.p.sampling.top_k, 0);
			dps_request_free(&r);
		}
	refused_both("{\"prompt\": [1, 5], \"temperature\": 2.01}", "temperature");
	refused_both("{\"prompt\": [1, 5], \"temperature\": -0.1}", "temperature");
	refused_both("{\"prompt\": [1, 5], \"top_k\": -2}", "top_k");
	refused_both("{\"prompt\": [1, 5], \"top_p\": 0}", "top_p");
	refused_both("{\"prompt\": [1, 5], \"max_tokens\": 0}", "max_tokens");
	refused_both("{\"prompt\": [1, 5], \"max_tokens\": \"3\"}", "max_tokens");
	refused_both("{\"prompt\": [1, 5], \"stop_token_ids\": [1, 2, 3, 4, 5, 6, 7]}",
		     "stop_token_ids");
	refused_both("{\"prompt\": [1, 512]}", "prompt");
	{
		/* Both names of the stop ids in a line: at most 6 in all, not 6 each. */
		struct dps_request r;
		char err[256] = "";

		ck_assert_int_eq(parse("{\"prompt\": [1], \"stop_ids\": [1, 2, 3], \"stop_token_ids\": "
				       "[4, 5, 6]}", DPS_REQ_LINE, &r, err), 0);
		ck_assert_int_eq(r.p.n_stop, 6); /* the end ids 1 and 2 are among them */
		dps_request_free(&r);
		ck_assert_int_eq(parse("{\"prompt\": [1], \"stop_ids\": [1, 2, 3, 4, 5, 6], "
				       "\"stop_token_ids\": [1, 2, 3, 4, 5, 6]}", DPS_REQ_LINE, &r,
				       err), -EINVAL);
		ck_assert_ptr_nonnull(strstr(err, "stop_token_ids"));
		dps_request_free(&r);
	}
	refused_both("{\"prompt\": []}", "prompt");
	refused_both("{\"prompt\": \"text\"}", "tokenizer");
	refused_both("{\"max_tokens\": 3}", "prompt");
	refused_both("{\"prompt\": [1, 5], \"max_tokens\": 99}", "max_tokens");
	refused_both("[1, 2]", "object");
	refused_both("{\"prompt\": [1, 5]", "JSON");
}
END_TEST

START_TEST(test_defaults_and_stops)
{
	struct dps_request r;
	char err[256];

	ck_assert_int_eq(parse("{\"prompt\": [5, 6]}", DPS_REQ_LINE, &r, err), 0);
	/* The ids as given (no BOS); the caller's defaults; the end ids stop it. */
	ck_assert_int_eq(r.n_prompt, 2);
	ck_assert_int_eq(r.prompt[0], 5);
	ck_assert_int_eq(r.prompt[1], 6);
	ck_assert_int_eq(r.p.max_tokens, 16);
	ck_assert(r.p.sampling.temperature == 1.0f && r.p.sampling.top_p == 1.0f);
	ck_assert_int_eq(r.p.n_stop, 2);
	ck_assert_int_eq(r.p.stop[0], 1);
	ck_assert_int_eq(r.p.stop[1], 2);
	ck_assert_int_eq(r.replica, -1);
	dps_request_free(&r);
	/* BOS first stays first, once; ignore_eos: no stops; a line's names. */
	ck_assert_int_eq(parse("{\"prompt_ids\": [1, 6], \"ignore_eos\": true, \"stop_ids\": [9], "
			       "\"replica\": 3, \"top_k\": -1}", DPS_REQ_LINE, &r, err), 0);
	ck_assert_int_eq(r.n_prompt, 2);
	ck_assert_int_eq(r.p.n_stop, 1);
	ck_assert_int_eq(r.p.stop[0], 9);
	ck_assert_int_eq(r.replica, 3);
	ck_assert_int_eq(r.p.sampling.top_k, 0);
	dps_request_free(&r);
	/* A completions body: one prompt in a list, nulls are defaults. */
	ck_assert_int_eq(parse("{\"prompt\": [[1, 7]], \"max_tokens\": null, \"stream\": true, "
			       "\"stream_options\": {\"include_usage\": true}, \"model\": \"m\"}",
			       DPS_REQ_COMPLETIONS, &r, err), 0);
	ck_assert_int_eq(r.n_prompt, 2);
	ck_assert(r.stream && r.include_usage);
	ck_assert_str_eq(r.model, "m");
	ck_assert_int_eq(r.p.max_tokens, 16);
	dps_request_free(&r);
}
END_TEST

START_TEST(test_what_each_format_takes)
{
	struct dps_request r;
	char err[256] = "";

	/* Completions: an unknown field is ignored, as vLLM does; stop strings need a tokenizer. */
	ck_assert_int_eq(parse("{\"prompt\": [1], \"user\": \"x\"}", DPS_REQ_COMPLETIONS, &r, err), 0);
	dps_request_free(&r);
	ck_assert_int_eq(parse("{\"prompt\": [1], \"stop\": \"x\"}", DPS_REQ_COMPLETIONS, &r, err),
			 -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "stop"));
	dps_request_free(&r);
	/* A field the engine cannot honour: refused by name unless neutral. */
	ck_assert_int_eq(parse("{\"prompt\": [1], \"n\": 1, \"echo\": false}", DPS_REQ_COMPLETIONS,
			       &r, err), 0);
	dps_request_free(&r);
	ck_assert_int_eq(parse("{\"prompt\": [1], \"suffix\": \"x\"}", DPS_REQ_COMPLETIONS, &r, err),
			 -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "\"suffix\""));
	dps_request_free(&r);
	/* A line: an unknown field is refused by name; replica is a line's own. */
	ck_assert_int_eq(parse("{\"prompt\": [1], \"user\": \"x\"}", DPS_REQ_LINE, &r, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "unknown field \"user\""));
	dps_request_free(&r);
	ck_assert_int_eq(parse("{\"prompt\": [1], \"stream\": true}", DPS_REQ_LINE, &r, err), -EINVAL);
	dps_request_free(&r);
	ck_assert_int_eq(parse("{\"prompt\": [1], \"replica\": 0}", DPS_REQ_COMPLETIONS, &r, err), 0);
	ck_assert_int_eq(r.replica, -1); /* ignored over HTTP */
	dps_request_free(&r);
}
END_TEST

START_TEST(test_text_prompt)
{
	/* The golden prompt through the real stories260K tokenizer. */
	char dir[64], err[512];
	struct dps_model_config cfg;
	struct dps_tok *tok;
	struct dps_req_limits l = lim;
	struct dps_request r;
	static const int want[] = { 1, 403, 407, 261, 378 };
	const char *body = "{\"prompt\": \"Once upon a time\", \"stop\": [\"\\n\", \"Lily\"]}";
	const char *plain = "{\"prompt\": \"Once upon a time\", \"add_special_tokens\": false}";
	const char *chat = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}";
	char *big;
	const size_t big_len = 4u << 20;

	test_tmpdir_make(dir, sizeof(dir), "request");
	ck_assert_msg(!dps_convert_llama2c(DPS_TEST_SRCDIR "/models/stories260K/stories260K.bin",
					   DPS_TEST_SRCDIR "/models/stories260K/tok512.bin", dir,
					   DPS_ST_F32, err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_model_config_load(dir, &cfg, err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_tok_open(&tok, dir, &cfg, err, sizeof(err)), "%s", err);
	l.tok = tok;
	ck_assert_msg(!dps_request_parse(body, strlen(body), DPS_REQ_COMPLETIONS, &l, &r, err,
					 sizeof(err)), "%s", err);
	ck_assert_int_eq(r.n_prompt, 5);
	for (int i = 0; i < 5; i++)
		ck_assert_int_eq(r.prompt[i], want[i]);
	ck_assert_int_eq(r.n_stop, 2);
	ck_assert_str_eq(r.stop[1], "Lily");
	dps_request_free(&r);
	/* add_special_tokens false: the text's own ids, without BOS. */
	ck_assert_msg(!dps_request_parse(plain, strlen(plain), DPS_REQ_COMPLETIONS, &l, &r, err,
					 sizeof(err)), "%s", err);
	ck_assert_int_eq(r.n_prompt, 4);
	ck_assert_int_eq(r.prompt[0], want[1]);
	dps_request_free(&r);
	/* A 4 MiB text cannot fit 100 tokens: refused, naming the context length. */
	big = malloc(big_len + 64);
	ck_assert_ptr_nonnull(big);
	memcpy(big, "{\"prompt\": \"", 12);
	for (size_t i = 0; i < big_len - 64; i++)
		big[12 + i] = "Once upon a time "[i % 17];
	memcpy(big + 12 + big_len - 64, "\"}", 3);
	ck_assert_int_eq(dps_request_parse(big, strlen(big), DPS_REQ_COMPLETIONS, &l, &r, err,
					   sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "maximum context length is 100 tokens"), "%s", err);
	dps_request_free(&r);
	free(big);
	/* Chat needs a template: refused by name. */
	ck_assert_int_eq(dps_request_parse(chat, strlen(chat), DPS_REQ_CHAT, &l, &r, err,
					   sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "chat_template"), "%s", err);
	dps_request_free(&r);
	dps_tok_free(tok);
	test_tmpdir_remove(dir);
}
END_TEST

/* r's prompt is exactly tok's ids of text without special tokens. */
static void prompt_is(const struct dps_request *r, const struct dps_tok *tok, const char *text)
{
	int *ids;
	size_t n;

	ck_assert_int_eq(dps_tok_encode(tok, text, strlen(text), 0, 0, &ids, &n), 0);
	ck_assert_msg(r->n_prompt == (int)n && !memcmp(r->prompt, ids, n * sizeof(int)),
		      "the prompt is not the ids of '%s'", text);
	free(ids);
}

/* A chat body through a template of ours (the oracle: the text written into each case). */
START_TEST(test_chat)
{
	static const char conf[] = "{\"chat_template\": \"{% for m in messages %}<{{ m.role }}>"
				   "{{ m.content }}</{{ m.role }}>{% endfor %}{% if "
				   "add_generation_prompt %}<assistant>{% endif %}\"}";
	char dir[64], err[512];
	struct dps_model_config cfg;
	struct dps_chat *chat;
	struct dps_tok *tok;
	struct dps_req_limits l = lim;
	struct dps_request r, w;
	const char *body;

	ck_assert_msg(!dps_chat_load_mem(&chat, conf, sizeof(conf) - 1, err, sizeof(err)), "%s", err);
	test_tmpdir_make(dir, sizeof(dir), "chat");
	ck_assert_msg(!dps_convert_llama2c(DPS_TEST_SRCDIR "/models/stories260K/stories260K.bin",
					   DPS_TEST_SRCDIR "/models/stories260K/tok512.bin", dir,
					   DPS_ST_F32, err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_model_config_load(dir, &cfg, err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_tok_open(&tok, dir, &cfg, err, sizeof(err)), "%s", err);
	l.tok = tok;
	l.chat = chat;
	/* The rendered text, encoded without BOS; max_tokens: the rest of the context. */
	body = "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
	       "\"Lily\"}, {\"type\": \"text\", \"text\": \"Ben\"}]}]}";
	ck_assert_msg(!dps_request_parse(body, strlen(body), DPS_REQ_CHAT, &l, &r, err, sizeof(err)),
		      "%s", err);
	prompt_is(&r, tok, "<user>Lily\nBen</user><assistant>");
	ck_assert_int_eq(r.p.max_tokens, 100 - r.n_prompt);
	ck_assert(r.chat);
	/* continue_final_message: the text ends after the final message, its trailing space
	 * kept only when it has no leading one (transformers' rule). */
	body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
	       "\"content\": \"Once \"}], \"add_generation_prompt\": false, "
	       "\"continue_final_message\": true, \"max_tokens\": 4}";
	ck_assert_msg(!dps_request_parse(body, strlen(body), DPS_REQ_CHAT, &l, &w, err, sizeof(err)),
		      "%s", err);
	prompt_is(&w, tok, "<user>Hi</user><assistant>Once ");
	dps_request_free(&w);
	body = "{\"messages\": [{\"role\": \"assistant\", \"content\": \" Once \"}], "
	       "\"add_generation_prompt\": false, \"continue_final_message\": true}";
	ck_assert_msg(!dps_request_parse(body, strlen(body), DPS_REQ_CHAT, &l, &w, err, sizeof(err)),
		      "%s", err);
	prompt_is(&w, tok, "<assistant> Once"); /* stripped: the space goes */
	{
		/* the check can fail: the unstripped text encodes otherwise */
		int *ids;
		size_t n;

		ck_assert_int_eq(dps_tok_encode(tok, "<assistant> Once ", 17, 0, 0, &ids, &n), 0);
		ck_assert(w.n_prompt != (int)n || memcmp(w.prompt, ids, n * sizeof(int)));
		free(ids);
	}
	dps_request_free(&w);
	/* Tools need tool_choice none (no tool-call parser); both flags true; a bad message. */
	body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"tools\": [{\"type\": "
	       "\"function\", \"function\": {\"name\": \"f\"}}]}";
	ck_assert_int_eq(dps_request_parse(body, strlen(body), DPS_REQ_CHAT, &l, &w, err,
					   sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "tool_choice"), "%s", err);
	dps_request_free(&w);
	body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"tool_choice\": \"none\", "
	       "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}";
	ck_assert_msg(!dps_request_parse(body, strlen(body), DPS_REQ_CHAT, &l, &w, err,
					 sizeof(err)), "%s", err);
	dps_request_free(&w);
	body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"continue_final_message\": "
	       "true}";
	ck_assert_int_eq(dps_request_parse(body, strlen(body), DPS_REQ_CHAT, &l, &w, err,
					   sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "continue_final_message"), "%s", err);
	dps_request_free(&w);
	body = "{\"messages\": [{\"content\": \"Hi\"}]}";
	ck_assert_int_eq(dps_request_parse(body, strlen(body), DPS_REQ_CHAT, &l, &w, err,
					   sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "role"), "%s", err);
	dps_request_free(&w);
	dps_request_free(&r);
	dps_chat_free(chat);
	dps_tok_free(tok);
	test_tmpdir_remove(dir);
}
END_TEST

/* ---- vLLM's sampling fields ---------------------------------------------------------------- */

/* body (a completions or line body) parses; r kept for the caller to read and free. */
static void parsed(const char *body, enum dps_req_format fmt, struct dps_request *r)
{
	char err[256] = "";

	ck_assert_msg(parse(body, fmt, r, err) == 0, "%s: %s", body, err);
}

START_TEST(test_penalties)
{
	struct dps_request r;

	for (int f = 0; f < 2; f++) {
		parsed("{\"prompt\": [1], \"repetition_penalty\": 1.25, \"presence_penalty\": -2, "
		       "\"frequency_penalty\": 0.5}", (enum dps_req_format)f, &r);
		ck_assert(r.p.pen.repetition == 1.25f && r.p.pen.presence == -2.0f &&
			  r.p.pen.frequency == 0.5f);
		dps_request_free(&r);
	}
	parsed("{\"prompt\": [1]}", DPS_REQ_COMPLETIONS, &r);
	ck_assert(!dps_penalties_on(&r.p.pen)); /* off unless asked for */
	dps_request_free(&r);
	refused_both("{\"prompt\": [1], \"repetition_penalty\": 0}", "repetition_penalty");
	refused_both("{\"prompt\": [1], \"repetition_penalty\": -1}", "repetition_penalty");
	refused_both("{\"prompt\": [1], \"repetition_penalty\": \"2\"}", "repetition_penalty");
	refused_both("{\"prompt\": [1], \"presence_penalty\": 2.01}", "presence_penalty");
	refused_both("{\"prompt\": [1], \"frequency_penalty\": -2.5}", "frequency_penalty");
}
END_TEST

START_TEST(test_min_p_min_tokens)
{
	struct dps_request r;
	char err[256] = "";

	for (int f = 0; f < 2; f++) {
		parsed("{\"prompt\": [1], \"min_p\": 0.05, \"min_tokens\": 4, \"max_tokens\": 4}",
		       (enum dps_req_format)f, &r);
		ck_assert(r.p.sampling.min_p == 0.05f);
		ck_assert_int_eq(r.p.min_tokens, 4);
		dps_request_free(&r);
	}
	refused_both("{\"prompt\": [1], \"min_p\": 1.5}", "min_p");
	refused_both("{\"prompt\": [1], \"min_p\": -0.1}", "min_p");
	refused_both("{\"prompt\": [1], \"min_tokens\": -1}", "min_tokens");
	/* vLLM: at most max_tokens (16 by default here) */
	refused_both("{\"prompt\": [1], \"min_tokens\": 17}", "min_tokens");
	ck_assert_int_eq(parse("{\"prompt\": [1], \"min_tokens\": 16}", DPS_REQ_COMPLETIONS, &r,
			       err), 0);
	dps_request_free(&r);
}
END_TEST

START_TEST(test_logit_bias)
{
	struct dps_request r;
	char body[8192];
	int at;

	for (int f = 0; f < 2; f++) {
		parsed("{\"prompt\": [1], \"logit_bias\": {\"5\": 2.5, \"511\": -500, \"7\": 1, "
		       "\"05\": 3}}", (enum dps_req_format)f, &r);
		/* 5 given twice ("05") keeps its last bias; -500 clamped to vLLM's -100 */
		ck_assert_int_eq(r.p.n_bias, 3);
		for (int i = 0; i < r.p.n_bias; i++)
			ck_assert(r.p.bias[i].id == 5 ? r.p.bias[i].bias == 3.0f :
				  r.p.bias[i].id == 511 ? r.p.bias[i].bias == -100.0f :
				  r.p.bias[i].id == 7 && r.p.bias[i].bias == 1.0f);
		dps_request_free(&r);
	}
	parsed("{\"prompt\": [1], \"logit_bias\": {}}", DPS_REQ_COMPLETIONS, &r);
	ck_assert_int_eq(r.p.n_bias, 0);
	dps_request_free(&r);
	refused_both("{\"prompt\": [1], \"logit_bias\": {\"512\": 1}}", "logit_bias");
	refused_both("{\"prompt\": [1], \"logit_bias\": {\"-1\": 1}}", "logit_bias");
	refused_both("{\"prompt\": [1], \"logit_bias\": {\"x\": 1}}", "logit_bias");
	refused_both("{\"prompt\": [1], \"logit_bias\": {\"3\": \"1\"}}", "logit_bias");
	refused_both("{\"prompt\": [1], \"logit_bias\": [1]}", "logit_bias");
	/* At most DPS_MAX_BIAS ids: one more is refused, that many are taken. */
	at = snprintf(body, sizeof(body), "{\"prompt\": [1], \"logit_bias\": {");
	for (int i = 0; i <= DPS_MAX_BIAS; i++)
		at += snprintf(body + at, sizeof(body) - (size_t)at, "%s\"%d\": 1", i ? ", " : "", i);
	snprintf(body + at, sizeof(body) - (size_t)at, "}}");
	refused_both(body, "logit_bias");
	*strrchr(body, ',') = '\0';
	strcat(body, "}}");
	parsed(body, DPS_REQ_LINE, &r);
	ck_assert_int_eq(r.p.n_bias, DPS_MAX_BIAS);
	dps_request_free(&r);
}
END_TEST

/* Each field not computed here: a value that asks for it, and its neutral value (NULL: none
 * but null). */
static const struct {
	const char *field, *asks, *neutral;
} not_computed[] = {
	{ "best_of", "3", "1" },
	{ "use_beam_search", "true", "false" },
	{ "length_penalty", "0.5", "1" },
	{ "prompt_logprobs", "0", NULL },
	{ "return_tokens_as_token_ids", "true", "false" },
	{ "return_token_ids", "true", "false" },
	{ "suffix", "\"x\"", "\"\"" },
	{ "response_format", "{\"type\": \"json_object\"}", "{\"type\": \"text\"}" },
	{ "guided_json", "{\"type\": \"object\"}", NULL },
	{ "guided_regex", "\"[a-z]+\"", NULL },
	{ "guided_choice", "[\"yes\", \"no\"]", NULL },
	{ "guided_grammar", "\"root ::= \\\"a\\\"\"", NULL },
	{ "guided_decoding_backend", "\"xgrammar\"", NULL },
	{ "guided_whitespace_pattern", "\" \"", NULL },
	{ "structural_tag", "\"{}\"", NULL },
	{ "structured_outputs", "{\"regex\": \"a\"}", NULL },
	{ "allowed_token_ids", "[1, 2]", NULL },
	{ "bad_words", "[\"x\"]", "[]" },
	{ "logits_processors", "[\"m.P\"]", NULL },
	{ "include_stop_str_in_output", "true", "false" },
	{ "skip_special_tokens", "false", "true" },
	{ "spaces_between_special_tokens", "false", "true" },
	{ "truncate_prompt_tokens", "4", NULL },
	{ "prompt_embeds", "\"AAAA\"", NULL },
	{ "priority", "1", "0" },
	{ "kv_transfer_params", "{}", NULL },
	{ "vllm_xargs", "{\"a\": 1}", NULL },
	{ "mm_processor_kwargs", "{\"a\": 1}", "{}" },
	{ "documents", "[{\"text\": \"x\"}]", NULL },
	{ "reasoning_effort", "\"low\"", NULL },
	{ "thinking_token_budget", "10", NULL },
	{ "include_reasoning", "false", "true" },
	{ "functions", "[]", NULL },
	{ "function_call", "\"auto\"", NULL },
	{ "prediction", "{\"type\": \"content\", \"content\": \"x\"}", NULL },
	{ "audio", "{\"voice\": \"x\"}", NULL },
	{ "modalities", "[\"text\", \"audio\"]", "[\"text\"]" },
	{ "web_search_options", "{}", NULL },
};

START_TEST(test_not_computed)
{
	const char *field = not_computed[_i].field;
	char body[512], err[256] = "", name[64];
	struct dps_request r;

	snprintf(name, sizeof(name), "\"%s\"", field);
	for (int f = 0; f < 3; f += 2) { /* completions, chat */
		snprintf(body, sizeof(body), "{\"%s\": [1], \"%s\": %s}", f ? "messages" : "prompt",
			 field, not_computed[_i].asks);
		ck_assert_msg(parse(body, (enum dps_req_format)f, &r, err) == -EINVAL, "%s accepted",
			      body);
		ck_assert_msg(strstr(err, name) && strstr(err, "not supported"), "%s: \"%s\"", body,
			      err);
		dps_request_free(&r);
	}
	snprintf(body, sizeof(body), "{\"prompt\": [1], \"%s\": null}", field);
	ck_assert_msg(parse(body, DPS_REQ_COMPLETIONS, &r, err) == 0, "%s: %s", body, err);
	dps_request_free(&r);
	if (not_computed[_i].neutral) {
		snprintf(body, sizeof(body), "{\"prompt\": [1], \"%s\": %s}", field,
			 not_computed[_i].neutral);
		ck_assert_msg(parse(body, DPS_REQ_COMPLETIONS, &r, err) == 0, "%s: %s", body, err);
		dps_request_free(&r);
	}
}
END_TEST

/* Opens the stories260K tokenizer (and a small chat template) into l. */
static void with_tok(struct dps_req_limits *l, struct dps_tok **tok, struct dps_chat **chat)
{
	static const char conf[] = "{\"chat_template\": \"{% for m in messages %}<{{ m.role }}>"
				   "{{ m.content }}</{{ m.role }}>{% endfor %}<assistant>\"}";
	char dir[64], err[512];
	struct dps_model_config cfg;

	ck_assert_msg(!dps_chat_load_mem(chat, conf, sizeof(conf) - 1, err, sizeof(err)), "%s", err);
	test_tmpdir_make(dir, sizeof(dir), "request");
	ck_assert_msg(!dps_convert_llama2c(DPS_TEST_SRCDIR "/models/stories260K/stories260K.bin",
					   DPS_TEST_SRCDIR "/models/stories260K/tok512.bin", dir,
					   DPS_ST_F32, err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_model_config_load(dir, &cfg, err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_tok_open(tok, dir, &cfg, err, sizeof(err)), "%s", err);
	test_tmpdir_remove(dir); /* the tokenizer is in memory now */
	*l = lim;
	l->tok = *tok;
	l->chat = *chat;
}

/* A body refused in format fmt under limits l, with a message naming `field`. */
static void refused_in(const struct dps_req_limits *l, const char *s, enum dps_req_format fmt,
		       const char *field)
{
	struct dps_request r;
	char err[256] = "";

	ck_assert_msg(dps_request_parse(s, strlen(s), fmt, l, &r, err, sizeof(err)) == -EINVAL,
		      "%s accepted", s);
	ck_assert_msg(strstr(err, field), "%s: \"%s\" does not name %s", s, err, field);
	dps_request_free(&r);
}

/* Batched prompts: each its own, in order, with the rules of one prompt each. */
START_TEST(test_batched_prompts)
{
	struct dps_request r;
	char err[256] = "", *big;
	size_t o = 0;

	ck_assert_msg(!parse("{\"prompt\": [[1, 2], [3, 4, 5]]}", DPS_REQ_COMPLETIONS, &r, err),
		      "%s", err);
	ck_assert_int_eq(r.n_prompts, 2);
	ck_assert_int_eq(r.n, 1);
	ck_assert_int_eq(r.prompts[0].n, 2);
	ck_assert_int_eq(r.prompts[1].n, 3);
	ck_assert_int_eq(r.prompts[1].ids[2], 5);
	ck_assert_ptr_eq(r.prompt, r.prompts[0].ids);
	ck_assert_int_eq(r.n_prompt, 2);
	dps_request_free(&r);
	/* one id list in a list: one prompt, as before */
	ck_assert_msg(!parse("{\"prompt\": [[1, 7]]}", DPS_REQ_COMPLETIONS, &r, err), "%s", err);
	ck_assert_int_eq(r.n_prompts, 1);
	dps_request_free(&r);
	refused_in(&lim, "{\"prompt\": [[1], [2]]}", DPS_REQ_LINE, "one prompt per line");
	refused_in(&lim, "{\"prompt\": [[1], \"x\"]}", DPS_REQ_COMPLETIONS, "\"prompt\"[1]");
	refused_in(&lim, "{\"prompt\": [[1], []]}", DPS_REQ_COMPLETIONS, "\"prompt[1]\" is empty");
	refused_in(&lim, "{\"prompt\": [[1], [600]]}", DPS_REQ_COMPLETIONS, "\"prompt[1]\"[0]");
	refused_in(&lim, "{\"prompt\": [\"a\", \"b\"]}", DPS_REQ_COMPLETIONS, "tokenizer");
	/* every prompt within the context (100 here, 16 to generate) */
	big = malloc(4096);
	ck_assert_ptr_nonnull(big);
	o += (size_t)sprintf(big, "{\"prompt\": [[1], [");
	for (int i = 0; i < 90; i++)
		o += (size_t)sprintf(big + o, "%s3", i ? ", " : "");
	sprintf(big + o, "]]}");
	refused_in(&lim, big, DPS_REQ_COMPLETIONS, "maximum context length");
	/* at most DPS_REQ_MAX_CHOICES prompts, and choices */
	o = (size_t)sprintf(big, "{\"prompt\": [");
	for (int i = 0; i <= DPS_REQ_MAX_CHOICES; i++)
		o += (size_t)sprintf(big + o, "%s[1]", i ? ", " : "");
	sprintf(big + o, "]}");
	refused_in(&lim, big, DPS_REQ_COMPLETIONS, "more than 128 prompts");
	o = (size_t)sprintf(big, "{\"n\": 2, \"prompt\": [");
	for (int i = 0; i < DPS_REQ_MAX_CHOICES / 2; i++)
		o += (size_t)sprintf(big + o, "%s[1]", i ? ", " : "");
	sprintf(big + o, "]}");
	ck_assert_msg(!parse(big, DPS_REQ_COMPLETIONS, &r, err), "%s", err);
	ck_assert_int_eq(r.n_prompts * r.n, DPS_REQ_MAX_CHOICES);
	dps_request_free(&r);
	big[6] = '3'; /* "n": 3 */
	refused_in(&lim, big, DPS_REQ_COMPLETIONS, "\"n\" 3");
	free(big);
}
END_TEST

/* "n" and "best_of" (equal to n only), in both HTTP formats. */
START_TEST(test_n)
{
	struct dps_request r;
	char err[256] = "";

	ck_assert_msg(!parse("{\"prompt\": [1], \"n\": 3, \"best_of\": 3}", DPS_REQ_COMPLETIONS,
			     &r, err), "%s", err);
	ck_assert_int_eq(r.n, 3);
	dps_request_free(&r);
	ck_assert_msg(!parse("{\"prompt\": [1], \"n\": 1, \"best_of\": 1}", DPS_REQ_COMPLETIONS,
			     &r, err), "%s", err);
	ck_assert_int_eq(r.n, 1);
	dps_request_free(&r);
	refused_in(&lim, "{\"prompt\": [1], \"n\": 3, \"best_of\": 4}", DPS_REQ_COMPLETIONS,
		   "\"best_of\" (4)");
	refused_in(&lim, "{\"prompt\": [1], \"best_of\": 2}", DPS_REQ_COMPLETIONS, "best_of");
	refused_in(&lim, "{\"prompt\": [1], \"n\": 0}", DPS_REQ_COMPLETIONS, "\"n\"");
	refused_in(&lim, "{\"prompt\": [1], \"n\": 129}", DPS_REQ_COMPLETIONS, "\"n\"");
	refused_in(&lim, "{\"prompt\": [1], \"n\": 2}", DPS_REQ_LINE, "unknown field \"n\"");
}
END_TEST

/* "logprobs" (completions: a count; chat: a boolean with "top_logprobs"), and "echo". */
START_TEST(test_logprobs_echo)
{
	struct dps_req_limits l;
	struct dps_tok *tok;
	struct dps_chat *chat;
	struct dps_request r;
	char err[256] = "";
	const char *b;

	ck_assert_msg(!parse("{\"prompt\": [1], \"logprobs\": 5}", DPS_REQ_COMPLETIONS, &r, err),
		      "%s", err);
	ck_assert(r.p.want_logprobs && r.p.top_logprobs == 5);
	dps_request_free(&r);
	ck_assert_msg(!parse("{\"prompt\": [1], \"logprobs\": 0}", DPS_REQ_COMPLETIONS, &r, err),
		      "%s", err);
	ck_assert(r.p.want_logprobs && r.p.top_logprobs == 0);
	dps_request_free(&r);
	ck_assert_msg(!parse("{\"prompt\": [1], \"logprobs\": null}", DPS_REQ_COMPLETIONS, &r,
			     err), "%s", err);
	ck_assert(!r.p.want_logprobs);
	dps_request_free(&r);
	refused_in(&lim, "{\"prompt\": [1], \"logprobs\": 21}", DPS_REQ_COMPLETIONS, "logprobs");
	refused_in(&lim, "{\"prompt\": [1], \"logprobs\": true}", DPS_REQ_COMPLETIONS, "logprobs");
	refused_in(&lim, "{\"prompt\": [1], \"top_logprobs\": 2}", DPS_REQ_COMPLETIONS,
		   "\"top_logprobs\" is a field of chat");
	refused_in(&lim, "{\"prompt\": [1], \"prompt_logprobs\": 1}", DPS_REQ_COMPLETIONS,
		   "\"prompt_logprobs\" is not supported");
	refused_in(&lim, "{\"prompt\": [1], \"echo\": true}", DPS_REQ_COMPLETIONS, "\"echo\" needs");
	with_tok(&l, &tok, &chat);
	/* chat: a boolean, and the count in top_logprobs (which needs it) */
	b = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"logprobs\": true, "
	    "\"top_logprobs\": 4}";
	ck_assert_msg(!dps_request_parse(b, strlen(b), DPS_REQ_CHAT, &l, &r, err, sizeof(err)), "%s",
		      err);
	ck_assert(r.p.want_logprobs && r.p.top_logprobs == 4);
	dps_request_free(&r);
	b = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"logprobs\": false}";
	ck_assert_msg(!dps_request_parse(b, strlen(b), DPS_REQ_CHAT, &l, &r, err, sizeof(err)), "%s",
		      err);
	ck_assert(!r.p.want_logprobs);
	dps_request_free(&r);
	refused_in(&l, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
		   "\"top_logprobs\": 2}", DPS_REQ_CHAT, "\"top_logprobs\" needs \"logprobs\"");
	refused_in(&l, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
		   "\"logprobs\": 3}", DPS_REQ_CHAT, "\"logprobs\"");
	refused_in(&l, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
		   "\"echo\": true}", DPS_REQ_CHAT, "\"echo\" is not supported");
	/* echo: the text as given, and id prompts decoded; not with logprobs */
	b = "{\"prompt\": [\"Once upon a time\", \"Lily\"], \"echo\": true}";
	ck_assert_msg(!dps_request_parse(b, strlen(b), DPS_REQ_COMPLETIONS, &l, &r, err,
					 sizeof(err)), "%s", err);
	ck_assert_int_eq(r.n_prompts, 2);
	ck_assert_str_eq(r.prompts[0].text, "Once upon a time");
	ck_assert_str_eq(r.prompts[1].text, "Lily");
	dps_request_free(&r);
	b = "{\"prompt\": [1, 403, 407, 261, 378], \"echo\": true}";
	ck_assert_msg(!dps_request_parse(b, strlen(b), DPS_REQ_COMPLETIONS, &l, &r, err,
					 sizeof(err)), "%s", err);
	ck_assert_str_eq(r.prompts[0].text, "Once upon a time");
	dps_request_free(&r);
	b = "{\"prompt\": \"Once upon a time\"}";
	ck_assert_msg(!dps_request_parse(b, strlen(b), DPS_REQ_COMPLETIONS, &l, &r, err,
					 sizeof(err)), "%s", err);
	ck_assert_ptr_null(r.prompts[0].text);
	dps_request_free(&r);
	ck_assert_int_eq(r.p.prompt_logprobs, 0);
	/* echo with logprobs: the prompt's too; not streamed */
	b = "{\"prompt\": \"Once upon a time\", \"echo\": true, \"logprobs\": 1}";
	ck_assert_msg(!dps_request_parse(b, strlen(b), DPS_REQ_COMPLETIONS, &l, &r, err,
					 sizeof(err)), "%s", err);
	ck_assert(r.p.want_logprobs && r.p.prompt_logprobs && r.p.top_logprobs == 1);
	dps_request_free(&r);
	b = "{\"prompt\": \"Once upon a time\", \"echo\": true}";
	ck_assert_msg(!dps_request_parse(b, strlen(b), DPS_REQ_COMPLETIONS, &l, &r, err,
					 sizeof(err)), "%s", err);
	ck_assert(!r.p.want_logprobs && !r.p.prompt_logprobs);
	dps_request_free(&r);
	refused_in(&l, "{\"prompt\": \"Once\", \"echo\": true, \"logprobs\": 1, \"stream\": true}",
		   DPS_REQ_COMPLETIONS, "\"stream\" with \"echo\" and \"logprobs\"");
	/* max_tokens 0: the prompt alone, only with echo (vLLM) */
	b = "{\"prompt\": \"Once upon a time\", \"echo\": true, \"logprobs\": 0, "
	    "\"max_tokens\": 0}";
	ck_assert_msg(!dps_request_parse(b, strlen(b), DPS_REQ_COMPLETIONS, &l, &r, err,
					 sizeof(err)), "%s", err);
	ck_assert_int_eq(r.p.max_tokens, 0);
	ck_assert(r.p.prompt_logprobs && r.p.top_logprobs == 0);
	dps_request_free(&r);
	refused_in(&l, "{\"prompt\": \"Once\", \"max_tokens\": 0}", DPS_REQ_COMPLETIONS,
		   "\"max_tokens\" 0 needs \"echo\"");
	refused_in(&l, "{\"prompt\": \"Once\", \"max_tokens\": -1, \"echo\": true}",
		   DPS_REQ_COMPLETIONS, "max_tokens");
	refused_in(&l, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
		   "\"max_completion_tokens\": 0}", DPS_REQ_CHAT,
		   "\"max_completion_tokens\" 0 needs \"echo\"");
	dps_tok_free(tok);
	dps_chat_free(chat);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("request");
	TCase *tc = tcase_create("parser");

	tcase_add_test(tc, test_one_set_of_rules);
	tcase_add_test(tc, test_defaults_and_stops);
	tcase_add_test(tc, test_what_each_format_takes);
	tcase_add_test(tc, test_text_prompt);
	tcase_add_test(tc, test_chat);
	tcase_add_test(tc, test_penalties);
	tcase_add_test(tc, test_min_p_min_tokens);
	tcase_add_test(tc, test_logit_bias);
	tcase_add_loop_test(tc, test_not_computed, 0,
			    (int)(sizeof(not_computed) / sizeof(not_computed[0])));
	tcase_add_test(tc, test_batched_prompts);
	tcase_add_test(tc, test_n);
	tcase_add_test(tc, test_logprobs_echo);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
