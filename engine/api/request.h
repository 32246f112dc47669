/* SPDX-License-Identifier: MIT */
/*
 * engine/api/request.h - the one request parser, with one set of rules, for the two ways a
 * request arrives: the body of POST /v1/completions (DPS_REQ_COMPLETIONS), as the OpenAI API
 * and vLLM define it, and a line of `dpshard generate --requests FILE.jsonl` (DPS_REQ_LINE):
 *
 *   {"model": "m", "prompt": "Once upon a time" | [1, 403, 407], "max_tokens": 16,
 *    "temperature": 1.0, "top_p": 1.0, "top_k": -1, "seed": 7, "stop": "\n" | ["a", "b"],
 *    "stop_token_ids": [13], "n": 1, "stream": false,
 *    "stream_options": {"include_usage": true}, "timeout_ms": 5000, "ignore_eos": false}
 *   {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0.8, "seed": 7,
 *    "stop_ids": [13], "replica": 1, "timeout_ms": 5000}
 *
 * The rules, for both: "prompt" is text (the model needs a tokenizer) or a list of token ids
 * (also "prompt_ids" in a line; BOS is put first when missing); "max_tokens" 1 to 2^24;
 * "temperature" 0 to 2 (0: greedy); "top_p" in (0, 1]; "top_k" -1 or 0 (both: every token) or
 * a count; "seed" any integer; "stop_token_ids" (a line's "stop_ids") at most 6 ids;
 * "timeout_ms" from 1; "ignore_eos" a boolean (without it BOS and EOS end the request); the
 * prompt and max_tokens within max_model_len when the limits give one. Only in a completions
 * body: "model", "stream", "stream_options", "stop" strings, and fields the engine cannot
 * honour at other than their neutral value (n, best_of, echo, logprobs, penalties, suffix,
 * logit_bias), which are refused by name; other unknown fields are ignored, as vLLM does.
 * Only in a line: "replica"; unknown fields are refused.
 *
 * Outside input: every field is type- and range-checked and sizes are bounded before anything
 * is allocated from them; tests/fuzz/fuzz_request.c and fuzz_http.c fuzz it.
 */
#ifndef DPS_ENGINE_API_REQUEST_H
#define DPS_ENGINE_API_REQUEST_H

#include <stddef.h>

#include "engine/model/tok_llama2.h"
#include "engine/serve/sched.h"

#define DPS_REQ_MAX_STOP 16     /* stop strings per request */
#define DPS_REQ_STOP_BYTES 256  /* bytes per stop string */

enum dps_req_format {
	DPS_REQ_COMPLETIONS, /* the body of POST /v1/completions */
	DPS_REQ_LINE,        /* a line of generate --requests */
};

/* What the caller fixes. */
struct dps_req_limits {
	const struct dps_tok_llama2 *tok; /* NULL: prompts are token ids */
	int vocab, bos, eos;            /* eos < 0: none */
	int max_model_len;              /* prompt + max_tokens at most this (0: unchecked) */
	int default_max_tokens;         /* when "max_tokens" is absent (OpenAI: 16) */
	float default_temperature;      /* when "temperature" is absent (OpenAI: 1) */
	unsigned default_timeout_ms;    /* 0: none */
};

struct dps_request {
	int *prompt, n_prompt;          /* malloc'd, BOS first */
	struct dps_req_params p;        /* deadline_ns: the timeout in ns, relative (0: none) */
	int has_seed;
	int replica;                    /* a line's "replica", else -1 */
	char *stop[DPS_REQ_MAX_STOP];   /* completions' stop strings, malloc'd */
	int n_stop;
	int stream, include_usage;
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
