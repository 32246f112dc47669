/* SPDX-License-Identifier: MIT */
/*
 * engine/api/openai.h - the body of POST /v1/completions, as the OpenAI API (and vLLM) define it:
 *
 *   {"model": "m", "prompt": "Once upon a time" | [1, 403, 407], "max_tokens": 16,
 *    "temperature": 1.0, "top_p": 1.0, "top_k": -1, "seed": 7, "stop": "\n" | ["a", "b"],
 *    "stop_token_ids": [13], "n": 1, "stream": false,
 *    "stream_options": {"include_usage": true}, "timeout_ms": 5000, "ignore_eos": false}
 *
 * Outside input: every field is type- and range-checked and sizes are bounded before anything
 * is allocated from them. Fields the engine cannot honour (n > 1, echo, logprobs, penalties,
 * best_of > 1, a suffix, a logit bias) are refused with 400 naming them; unknown fields are
 * ignored, as vLLM does; a field of the wrong type is refused.
 */
#ifndef DPS_ENGINE_OPENAI_H
#define DPS_ENGINE_OPENAI_H

#include <stddef.h>

#include "engine/serve/sched.h"
#include "engine/model/tokenizer.h"

#define DPS_OAI_MAX_STOP 16       /* stop strings per request */
#define DPS_OAI_STOP_BYTES 256    /* bytes per stop string */

struct dps_oai_req {
	int *prompt, n_prompt;        /* malloc'd, BOS first */
	struct dps_req_params p;      /* deadline_ns: the timeout in ns, relative (0: none) */
	int has_seed;
	char *stop[DPS_OAI_MAX_STOP]; /* malloc'd */
	int n_stop;
	int stream, include_usage;
	char model[128];              /* "" when not given */
};

/* What the server fixes: the tokenizer (NULL: token ids only), vocabulary, BOS/EOS, limits. */
struct dps_oai_limits {
	const struct dps_tokenizer *tok;
	int vocab, bos, eos;
	int max_model_len;            /* prompt + max_tokens at most this */
	int default_max_tokens;       /* 16, as OpenAI */
	unsigned default_timeout_ms;  /* 0: none */
};

/*
 * Parses a completions body. Returns 0, or the HTTP status to answer (400; 404 for an
 * unknown model is the caller's: it compares out->model) with a message in err; -ENOMEM.
 * Free with dps_oai_req_free (also after a failure).
 */
int dps_oai_parse(const char *body, size_t len, const struct dps_oai_limits *lim,
		  struct dps_oai_req *out, char *err, size_t errlen);
void dps_oai_req_free(struct dps_oai_req *r);

#endif
