/* SPDX-License-Identifier: MIT */
/*
 * engine/api/request.h - the one request parser, with one set of rules, for the three ways a
 * request arrives: the body of POST /v1/completions (DPS_REQ_COMPLETIONS) and of POST
 * /v1/chat/completions (DPS_REQ_CHAT), as the OpenAI API and vLLM define them, and a line of
 * `dpshard generate --requests FILE.jsonl` (DPS_REQ_LINE):
 *
 *   {"model": "m", "prompt": "Once upon a time" | [1, 403, 407] | ["a", "b"] | [[1], [2, 3]],
 *    "max_tokens": 16, "n": 2, "echo": false, "logprobs": 5,
 *    "temperature": 1.0, "top_p": 1.0, "top_k": -1, "seed": 7, "stop": "\n" | ["a", "b"],
 *    "stop_token_ids": [13], "stream": false, "add_special_tokens": true,
 *    "stream_options": {"include_usage": true}, "timeout_ms": 5000, "ignore_eos": false,
 *    "min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": 0.5,
 *    "frequency_penalty": 0.5, "min_tokens": 4, "logit_bias": {"13": -100}}
 *   {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 64,
 *    "add_generation_prompt": true, "continue_final_message": false, "tools": [...],
 *    "chat_template_kwargs": {...}, "logprobs": true, "top_logprobs": 3, ... the sampling
 *    fields above}
 *   {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0.8, "seed": 7,
 *    "stop_ids": [13], "replica": 1, "timeout_ms": 5000}
 *
 * The rules: "prompt" is text (the model needs a tokenizer; encoded with the tokenizer's
 * special tokens unless "add_special_tokens" is false) or a list of token ids, used exactly
 * as given (also "prompt_ids" in a line); "messages" go through the model's chat template and
 * the text it renders is encoded without further special tokens (the template writes them;
 * "add_special_tokens": true adds them); "max_tokens" (in chat also "max_completion_tokens") 1
 * (0 with "echo") to 2^24, by default 16 for completions and the rest of the context for
 * chat, as vLLM; the sampling defaults are the caller's (the model's generation_config.json); "temperature" 0 to 2
 * (0: greedy); "top_p" in (0, 1]; "top_k" -1 or 0 (both: every token) or a count; "seed" any
 * integer; "stop_token_ids" (a line's "stop_ids") at most 6 ids; "timeout_ms" from 1;
 * "ignore_eos" a boolean (without it the model's end ids end the request); vLLM's ranges for
 * "min_p" [0, 1], "repetition_penalty" > 0, "presence_penalty" and "frequency_penalty"
 * [-2, 2], "min_tokens" 0 to max_tokens, "logit_bias" ids of the vocabulary (at most
 * DPS_MAX_BIAS; biases clamped to [-100, 100], an id given twice keeps the last); the prompt and
 * max_tokens within max_model_len when the limits give one: a text that cannot fit is refused
 * as soon as that is certain, without encoding it all. Only over HTTP: "model", "stream",
 * "stream_options", "stop" strings; completions' list of prompts (texts or id lists, each
 * with the rules of one; a list of one is one prompt), "n" (prompts x n at most
 * DPS_REQ_MAX_CHOICES; "best_of" only equal to it), "echo" (completions; it needs a
 * tokenizer; with logprobs it sets p.prompt_logprobs, and is refused when also streamed;
 * "max_tokens" 0 needs it), "logprobs" (completions: 0 to DPS_MAX_LOGPROBS;
 * chat: a boolean, with "top_logprobs" in that range); and fields of vLLM's and OpenAI's
 * requests that this server does not compute, accepted only at their neutral value and
 * otherwise refused by name (prompt_logprobs, suffix, response_format other than text, guided_*,
 * structured_outputs, allowed_token_ids, tool_choice other than "none"/"auto", ...: the table
 * in request.c); other unknown fields (user, metadata, ...) are ignored, as vLLM does. Only in
 * a line: "replica"; unknown fields are refused.
 *
 * Outside input: every field is type- and range-checked and sizes are bounded before anything
 * is allocated from them; tests/fuzz/fuzz_request.c and fuzz_http.c fuzz it. Parsing may take
 * a while for a long text (encoding, the template): the HTTP frontend runs it on its worker
 * threads (prep.h), never on the event loop.
 */
#ifndef DPS_ENGINE_API_REQUEST_H
#define DPS_ENGINE_API_REQUEST_H

#include <stddef.h>

#include "engine/model/chat.h"
#include "engine/model/tok.h"
#include "engine/serve/sched.h"

#define DPS_REQ_MAX_STOP 16     /* stop strings per request */
#define DPS_REQ_STOP_BYTES 256  /* bytes per stop string */
#define DPS_REQ_MAX_END 8       /* the model's end ids */
#define DPS_REQ_MAX_CHOICES 128 /* prompts x n of one request */

enum dps_req_format {
	DPS_REQ_COMPLETIONS, /* the body of POST /v1/completions */
	DPS_REQ_LINE,        /* a line of generate --requests */
	DPS_REQ_CHAT,        /* the body of POST /v1/chat/completions */
};

/* What the caller fixes. */
struct dps_req_limits {
	const struct dps_tok *tok;      /* NULL: prompts are token ids */
	const struct dps_chat *chat;    /* NULL: no chat template */
	int vocab;
	int end[DPS_REQ_MAX_END], n_end; /* ids that end a request unless "ignore_eos" */
	int max_model_len;              /* prompt + max_tokens at most this (0: unchecked) */
	int default_max_tokens;         /* completions without "max_tokens" (OpenAI: 16) */
	float default_temperature;      /* without "temperature" (OpenAI: 1) */
	float default_top_p;            /* without "top_p" (0 taken as 1) */
	int default_top_k;              /* without "top_k" (0: every token) */
	unsigned default_timeout_ms;    /* 0: none */
};

/* One prompt of a request. */
struct dps_req_prompt {
	int *ids, n;                    /* malloc'd */
	char *text;                     /* with "echo": the prompt's text (as given, or the ids
					 * decoded), malloc'd; else NULL */
	size_t text_len;
};

struct dps_request {
	int *prompt, n_prompt;          /* the first prompt: prompts[0].ids and .n */
	struct dps_req_prompt *prompts; /* (n_prompts) malloc'd: completions may give a list */
	int n_prompts;
	int n;                          /* choices per prompt ("n") */
	int echo;                       /* completions: each choice's text after its prompt's */
	struct dps_req_params p;        /* deadline_ns: the timeout in ns, relative (0: none) */
	int has_seed;
	int replica;                    /* a line's "replica", else -1 */
	char *stop[DPS_REQ_MAX_STOP];   /* completions' stop strings, malloc'd */
	int n_stop;
	int stream, include_usage;
	int chat;                       /* DPS_REQ_CHAT: answered as chat.completion */
	char model[128];                /* "" when not given */
};

/*
 * Parses one request (len bytes of JSON) in format fmt. Returns 0, -EINVAL (a bad request:
 * the message in err names the field and the rule; over HTTP a 400) or -ENOMEM. Free with
 * dps_request_free, also after a failure.
 */
int dps_request_parse(const char *json, size_t len, enum dps_req_format fmt,
		      const struct dps_req_limits *lim, struct dps_request *out, char *err,
		      size_t errlen);
void dps_request_free(struct dps_request *r);

#endif
