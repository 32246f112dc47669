/* SPDX-License-Identifier: MIT */
/*
 * engine/api/request.h - one request as JSON, the line format of `dpshard generate --requests
 * FILE.jsonl` (and the body format the HTTP frontend will share):
 *
 *   {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0.8, "top_p": 0.9,
 *    "top_k": 40, "seed": 7, "stop_ids": [13], "replica": 1, "timeout_ms": 5000}
 *
 * "prompt" is text (the model needs a tokenizer) or "prompt_ids" a list of token ids (BOS is
 * put first when missing); every other field is optional. Unknown fields, wrong types and
 * out-of-range values are refused with a message naming the field.
 */
#ifndef DPS_ENGINE_REQUEST_H
#define DPS_ENGINE_REQUEST_H

#include <stddef.h>

#include "engine/serve/sched.h"
#include "engine/model/tokenizer.h"

struct dps_parsed_req {
	int *prompt, n_prompt;       /* malloc'd, BOS first */
	struct dps_req_params p;     /* deadline_ns holds the timeout in ns (relative) */
	int replica;                 /* -1: any */
};

/*
 * Parses one JSON object (len bytes). tok may be NULL (then "prompt" text is refused); vocab
 * bounds the ids; bos is put first; max_tokens defaults to def_max_tokens. Returns 0 or
 * -EINVAL / -ENOMEM with a message in err. Free with dps_parsed_req_free.
 */
int dps_request_parse(const char *json, size_t len, const struct dps_tokenizer *tok, int vocab,
		      int bos, int def_max_tokens, struct dps_parsed_req *out, char *err,
		      size_t errlen);
void dps_parsed_req_free(struct dps_parsed_req *r);

/*
 * A JSON field v named name: an integer in [lo, hi] into *out, or a number in [lo, hi]; else
 * -EINVAL with a message naming the field (also used by the HTTP body parser, openai.c).
 */
struct json_t;
int dps_json_int(struct json_t *v, const char *name, long lo, long hi, long *out, char *err,
		 size_t errlen);
int dps_json_num(struct json_t *v, const char *name, double lo, double hi, double *out,
		 char *err, size_t errlen);

#endif
