/* SPDX-License-Identifier: MIT */
/*
 * engine/api/request_int.h - what the request parser's two files share: the state of one parse
 * (what a body says that is used once every field has been read) and the readers of its
 * fields. request.c reads the prompts, renders chat and checks what holds after every field;
 * request_fields.c reads every other field and holds the table of fields refused by name.
 */
#ifndef DPS_ENGINE_API_REQUEST_INT_H
#define DPS_ENGINE_API_REQUEST_INT_H

#include <stddef.h>

#include <jansson.h>

#include "engine/api/request.h"

#define DPS_REQ_MAX_STOP_IDS 6 /* of the request; the model's end ids come on top */
#define DPS_REQ_MAX_MESSAGES 4096

struct dps_req_pstate {
	json_t *prompt;               /* "prompt"/"prompt_ids" (borrowed from the parsed JSON) */
	const char *prompt_key;
	int ignore_eos;
	int add_special;              /* -1: the format's default */
	int max_tokens_set;
	json_t *messages, *tools, *kwargs; /* chat (borrowed from the parsed JSON) */
	int add_generation_prompt, continue_final;
	int tool_choice_none;         /* "tool_choice": "none" */
	long best_of;                 /* 0: not given */
	int chat_logprobs;            /* chat: "logprobs": true */
	long top_logprobs;            /* chat: -1 when not given */
	long logprobs;                /* completions: -1 when not given */
};

/* err = fmt with name; returns -EINVAL. */
int dps_req_bad(char *err, size_t errlen, const char *fmt, const char *name);
int dps_req_get_bool(json_t *v, const char *key, int *out, char *err, size_t errlen);

/*
 * The readers of one field each returns 0, -EINVAL (err) or -ENOMEM, or 1 when key is none of
 * its fields: the sampling fields every format takes; a chat body's own; an HTTP body's own
 * (completions and chat), with the fields refused by name unless neutral.
 */
int dps_req_field_common(const char *key, json_t *v, enum dps_req_format fmt,
			 const struct dps_req_limits *lim, struct dps_request *out,
			 struct dps_req_pstate *ps, char *err, size_t errlen);
int dps_req_field_chat(const char *key, json_t *v, struct dps_req_pstate *ps, char *err,
		       size_t errlen);
int dps_req_field_http(const char *key, json_t *v, enum dps_req_format fmt,
		       struct dps_request *out, struct dps_req_pstate *ps, char *err,
		       size_t errlen);

#endif
